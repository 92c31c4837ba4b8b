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
