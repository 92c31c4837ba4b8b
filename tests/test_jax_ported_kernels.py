"""Pallas kernels written the way code ported from `triton.autotune` or copied from real projects writes
them, tuned with `tuner.autotune` on the CPU (interpret mode, tiny shapes, a bench that runs each config
once): Triton's keywords kept on a jax launcher, and the patterns the other jax test files do not cover.
Each output is checked against jax.numpy."""

from __future__ import annotations

import functools

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pl = pytest.importorskip("jax.experimental.pallas")

import numpy as np  # noqa: E402

import tuner  # noqa: E402


def once(call):
    """Runs a config's call once and waits for it; every config takes the same time."""
    jax.block_until_ready(call())
    return 1e-3


# ---- an accumulating kernel ported from Triton: reset_to_zero / restore_value on its output ---------
def _acc_kernel(x_ref, acc_ref, o_ref):
    o_ref[...] = acc_ref[...] + 2 * x_ref[...]


def _accumulate(x, acc, blk):
    n = x.shape[0]
    spec = pl.BlockSpec((blk,), lambda i: (i,))
    return pl.pallas_call(
        _acc_kernel,
        out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
        grid=(pl.cdiv(n, blk),),
        in_specs=[spec, spec],
        out_specs=spec,
        input_output_aliases={1: 0},
        interpret=True,
    )(x, acc)


@pytest.mark.parametrize("keyword", ["reset_to_zero", "restore_value"])
def test_triton_reset_and_restore_keywords_skip_jax_arrays(keyword):
    # The Triton original zeroed (or saved) `acc` around every timed run; a jax array cannot be written
    # in place, so there is nothing to zero or put back: the tuning goes on, eager and under jit.
    @tuner.autotune(
        configs=[{"blk": 4}, {"blk": 8}],
        key=lambda x, acc: {"n": x.shape[0]},
        bench=once,
        **{keyword: ["acc"]},
    )
    def accumulate(x, acc, *, blk):
        return _accumulate(x, acc, blk)

    x, acc = jnp.arange(16.0), jnp.ones(16)
    np.testing.assert_allclose(np.asarray(accumulate(x, acc)), np.asarray(acc + 2 * x))
    np.testing.assert_allclose(np.asarray(acc), np.ones(16))  # the caller's array, untouched
    y = jnp.arange(32.0)
    out = jax.jit(accumulate)(y, jnp.ones(32))  # a new key, tuned on stand-ins
    np.testing.assert_allclose(np.asarray(out), np.asarray(1 + 2 * y))
    assert accumulate.tuner.stats["tuned"] == 2


def test_a_do_bench_given_to_a_jax_launcher_times_finished_work():
    # Triton's do_bench (and one written like it) calls `kernel_call()` and relies on a device sync of
    # torch's, which does not wait for jax's asynchronous dispatch: the call it gets returns only when
    # the launcher's result is ready, so what it times is the computation, not its dispatch.
    ready: list = []

    def do_bench(kernel_call, quantiles=None):
        ready.append(kernel_call().is_ready())
        return 1.0

    @tuner.autotune(configs=[{"s": 1}, {"s": 2}], key=lambda x: {"n": x.shape[0]}, do_bench=do_bench)
    @functools.partial(jax.jit, static_argnames=["s"])
    def power(x, *, s):
        for _ in range(20):  # long enough that a dispatch returns before the work is done
            x = jnp.tanh(x @ x) * s
        return x

    x = jnp.full((128, 128), 0.01)
    out = power(x)
    assert ready == [True, True]
    out2 = jax.jit(power)(jnp.full((64, 64), 0.01))  # a new key, on stand-ins
    assert ready == [True] * 4 and out.shape == (128, 128) and out2.shape == (64, 64)


# ---- a blocked matmul whose block sizes are one static tuple, as jax's Pallas docs write it --------
def _matmul_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def test_a_tuple_valued_config_of_a_jax_launcher():
    # `@partial(jax.jit, static_argnames=["block_size"])` with `block_size=(bm, bn, bk)`: the configs
    # hold tuples (no keyword of triton.autotune given), eager and under jit.
    timed: list = []

    def bench(call):
        jax.block_until_ready(call())
        timed.append(1)
        return 1e-3

    @tuner.autotune(
        configs=[{"block_size": (8, 8, 8)}, {"block_size": (16, 8, 8)}],
        key=lambda x, y: {"M": x.shape[0], "N": y.shape[1], "K": x.shape[1]},
        bench=bench,
    )
    @functools.partial(jax.jit, static_argnames=["block_size"])
    def matmul(x, y, block_size=(8, 8, 8)):
        bm, bn, bk = block_size
        (m, k), n = x.shape, y.shape[1]
        return pl.pallas_call(
            _matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            grid=(m // bm, n // bn, k // bk),
            in_specs=[
                pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            ],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            interpret=True,
        )(x, y)

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 16))
    np.testing.assert_allclose(np.asarray(matmul(x, x)), np.asarray(x @ x), rtol=1e-5, atol=1e-5)
    assert len(timed) == 2 and "(8, 8, 8)" in str(matmul.tuner.last_choice["config"]["block_size"])
    y = jnp.concatenate([x, x])  # M=32, under jit: tuned on stand-ins
    out = jax.jit(lambda a, b: matmul(a, b) + 1)(y, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(y @ x + 1), rtol=1e-5, atol=1e-5)
    assert len(timed) == 4 and matmul.tuner.stats["tuned"] == 2


# ---- the drop-in's traced misses: as `tuner.autotune`'s, untimed where the stand-ins cannot time ------
def _drop_in(body):
    """A launcher whose configs hold tuples (a Pallas block shape), so `autotune` builds the drop-in; it
    records the scale of each call, concrete or traced."""
    calls: list = []

    @tuner.autotune(configs=[{"tile": (1,)}, {"tile": (2,)}], key=lambda x: {"n": x.shape[-1]}, bench=once)
    def f(x, *, tile):
        calls.append(tile[0])
        return body(x) * tile[0]

    return f, calls


def test_the_drop_ins_export_with_symbolic_dimensions_is_chosen_untimed():
    # Before: the drop-in timed both configs on stand-ins holding 1 for the symbolic batch and stored the
    # winner of those size-1 arrays under the key of every batch.
    from jax import export

    f, calls = _drop_in(jnp.sin)
    (b,) = export.symbolic_shape("b")
    exp = export.export(jax.jit(f))(jax.ShapeDtypeStruct((b, 4), jnp.float32))
    assert f.tuner.stats["tuned"] == 0 and tuner.ConfigCache().entries() == []
    assert "symbolic dimensions" in f.tuner.last_choice["why"]
    x = jnp.linspace(0.0, 1.0, 8).reshape(2, 4)
    np.testing.assert_allclose(np.asarray(exp.call(x)), np.asarray(jnp.sin(x)) * calls[-1], rtol=1e-6)


def test_the_drop_ins_collective_over_a_vmap_axis_is_chosen_untimed():
    # Before: the first config's NameError (unbound axis name, which exists only in the caller's vmap)
    # was raised, as Triton raises a config's error, and the traced call failed.
    f, calls = _drop_in(lambda x: x / jax.lax.psum(x.sum(), "batch"))
    x = jnp.ones((4, 8))
    r = jax.vmap(f, axis_name="batch")(x)
    np.testing.assert_allclose(np.asarray(r), np.full((4, 8), calls[-1] / 32), rtol=1e-6)
    assert f.tuner.stats["tuned"] == 0 and "unbound axis name: batch" in f.tuner.last_choice["why"]
    n = len(calls)
    jax.jit(jax.vmap(f, axis_name="batch"))(x + 1)  # the key again: the untimed choice, nothing tried
    assert len(calls) == n + 1 and tuner.ConfigCache().entries() == []
