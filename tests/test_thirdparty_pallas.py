"""Pallas and JAX code nobody on this project wrote, tuned through `tuner.autotune` as its users would:
jax's TPU Pallas ops (`jax.experimental.pallas.ops.tpu`: the blocked matmul, flash attention with its
backward block sizes, megablox's grouped matmul behind its `custom_vjp`, paged attention) under
`pltpu.force_tpu_interpret_mode()` on the CPU, and user patterns around a launcher: a `custom_vjp` whose
forward and backward kernels are tuned separately, a module that is a pytree with a static field,
`jax.jit(static_argnames=...)`, `jax.named_call`, `jax.disable_jit()`, `donate_argnums` on the jit
around it, AOT `lower().compile()`, `jax.eval_shape`, a Python number traced by `jit` beside a
bfloat16 array, and `shard_map`/`pmap` over four CPU devices (in a subprocess: the device count is
fixed when jax starts). Each result is checked against jax.numpy or the op's reference.

Tiny shapes (the TPU ops' interpret mode is slow), and a bench that runs each config once and reports a
fixed time per config, so the winner is known in advance."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pl = pytest.importorskip("jax.experimental.pallas")
pltpu = pytest.importorskip("jax.experimental.pallas.tpu")

import numpy as np  # noqa: E402

import tuner  # noqa: E402
from tests._env import repo_pythonpath  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


class OnceBench:
    """Runs a config's call once and reports `time_of(what the launcher saw last)`; counts the calls and
    the calls whose result was a tracer (tracing timed: never)."""

    def __init__(self, seen: list, time_of) -> None:
        self.seen, self.time_of, self.calls, self.traced = seen, time_of, 0, 0

    def __call__(self, call):
        out = call()
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
            self.traced += 1
        jax.block_until_ready(out)
        self.calls += 1
        return self.time_of(self.seen[-1])


def tuned_over(param: str, times: dict, key):
    """`(decorator, seen, bench)`: `tuner.autotune` over one parameter's values (the keys of `times`),
    with a OnceBench that reports `times[the value the launcher saw last]`; the launcher appends its
    value to `seen`."""
    seen: list = []
    bench = OnceBench(seen, lambda c: times[c])
    return tuner.autotune(configs=[{param: v} for v in times], key=key, bench=bench), seen, bench


# ---- jax's TPU ops in interpret mode ---------------------------------------------------------------
def test_tpu_matmul_under_jit_aot_eval_shape_and_named_call():
    from jax.experimental.pallas.ops.tpu import matmul as tpu_matmul

    seen: list = []
    bench = OnceBench(seen, lambda c: {16: 2e-3, 32: 1e-3}[c])

    @tuner.autotune(
        configs=[{"bm": 16, "bk": 16}, {"bm": 32, "bk": 32}],
        key=lambda x, y: {"M": x.shape[0], "K": x.shape[1], "N": y.shape[1]},
        bench=bench,
    )
    def mm(x, y, *, bm, bk):
        seen.append(bm)
        return tpu_matmul.matmul(x, y, block_shape=(bm, bm), block_k=bk)

    x = jax.random.normal(jax.random.PRNGKey(0), (64, 32))
    y = jax.random.normal(jax.random.PRNGKey(1), (32, 64))
    sx, sy = jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(y.shape, y.dtype)
    with pltpu.force_tpu_interpret_mode():  # the caller's thread-local setting reaches the tuning
        # jax.eval_shape traces as jax.jit does (jit(f).trace): a miss there tunes (docs/api.md)
        assert jax.eval_shape(mm, sx, sy) == jax.ShapeDtypeStruct((64, 64), jnp.float32)
        assert bench.calls == 2 and bench.traced == 0 and mm.tuner.stats["tuned"] == 1
        compiled = jax.jit(mm).lower(sx, sy).compile()  # AOT: the same key, a hit
        np.testing.assert_allclose(np.asarray(compiled(x, y)), np.asarray(x @ y), rtol=1e-5, atol=1e-4)
        named = jax.named_call(mm, name="tpu_mm")
        with jax.named_scope("block0"):
            out = jax.jit(named)(x, y)
        np.testing.assert_allclose(np.asarray(out), np.asarray(x @ y), rtol=1e-5, atol=1e-4)
        with jax.disable_jit():  # eagerly, op by op: the same key, a hit
            out = mm(x, y)
        np.testing.assert_allclose(np.asarray(out), np.asarray(x @ y), rtol=1e-5, atol=1e-4)
    assert bench.calls == 2 and mm.tuner.stats["tuned"] == 1 and seen[-1] == 32
    [entry] = ConfigCache().entries()
    assert entry.config == {"bm": 32, "bk": 32} and entry.key.fields_dict == {"M": 64, "K": 32, "N": 64}


def test_tpu_flash_attention_forward_and_backward_blocks_under_jit_grad():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    tune, seen, bench = tuned_over(
        "bq", {64: 2e-3, 128: 1e-3}, lambda q, k, v: {"S": q.shape[2], "D": q.shape[3]}
    )

    @tune
    def attn(q, k, v, *, bq):
        seen.append(bq)
        bs = fa.BlockSizes(
            block_q=bq, block_k_major=128, block_k=128, block_b=1,
            block_q_major_dkv=bq, block_k_major_dkv=128, block_k_dkv=128, block_q_dkv=bq,
            block_k_major_dq=128, block_k_dq=128, block_q_dq=bq,
        )  # fmt: skip
        return fa.flash_attention(q, k, v, causal=True, block_sizes=bs)

    q = jax.random.normal(jax.random.PRNGKey(2), (1, 1, 128, 128)) / 4
    with pltpu.force_tpu_interpret_mode():
        g = jax.jit(jax.grad(lambda q: attn(q, q, q).sum()))(q)  # the first call of all: a miss under grad
    g_ref = jax.grad(lambda q: fa.mha_reference(q, q, q, None, causal=True).sum())(q)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-4, atol=1e-4)
    assert bench.calls == 2 and bench.traced == 0 and seen[-1] == 128


def test_megablox_gmm_custom_vjp_eager_then_jit_and_grad():
    # gmm's work depends on its integer group sizes: call it once eagerly with representative sizes,
    # and the traced calls find that tuning under the same key (docs/api.md), timing nothing
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

    tune, seen, bench = tuned_over(
        "tm",
        {8: 2e-3, 16: 1e-3},
        lambda lhs, rhs, sizes: {
            "M": lhs.shape[0],
            "K": lhs.shape[1],
            "N": rhs.shape[2],
            "G": rhs.shape[0],
        },
    )

    @tune
    def gmm(lhs, rhs, sizes, *, tm):
        seen.append(tm)
        # megablox.gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset, existing_out,
        #              transpose_rhs, interpret): its custom_vjp takes these positionally
        return megablox.gmm(lhs, rhs, sizes, jnp.float32, (tm, 128, 128), None, None, False, True)

    lhs = jax.random.normal(jax.random.PRNGKey(3), (32, 128))
    rhs = jax.random.normal(jax.random.PRNGKey(4), (2, 128, 128)) / 8
    sizes = jnp.array([12, 20], jnp.int32)

    def ref(lhs):
        return jnp.concatenate([lhs[:12] @ rhs[0], lhs[12:] @ rhs[1]])

    np.testing.assert_allclose(np.asarray(gmm(lhs, rhs, sizes)), np.asarray(ref(lhs)), rtol=1e-4, atol=1e-4)
    assert bench.calls == 2
    out = jax.jit(gmm)(lhs, rhs, sizes)
    g = jax.jit(jax.grad(lambda a: gmm(a, rhs, sizes).sum()))(lhs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref(lhs)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        np.asarray(g), np.asarray(jax.grad(lambda a: ref(a).sum())(lhs)), rtol=1e-4, atol=1e-4
    )
    assert bench.calls == 2 and gmm.tuner.stats["tuned"] == 1 and seen[-1] == 16


def test_paged_attention_eager_then_jit():
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as paged

    tune, seen, bench = tuned_over(
        "pages_per_block",
        {1: 2e-3, 2: 1e-3},
        lambda q, k_pages, v_pages, lengths, page_indices: {
            "B": q.shape[0],
            "pages": page_indices.shape[1],
        },
    )

    @tune
    def attn(q, k_pages, v_pages, lengths, page_indices, *, pages_per_block):
        seen.append(pages_per_block)
        return paged.paged_attention(
            q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=pages_per_block
        )

    batch, heads, dim, pages, page_size, per_seq = 2, 1, 128, 8, 16, 4
    k = jax.random.normal(jax.random.PRNGKey(5), (heads, pages, page_size, dim))
    v = jax.random.normal(jax.random.PRNGKey(6), (heads, pages, page_size, dim))
    q = jax.random.normal(jax.random.PRNGKey(7), (batch, heads, dim)) / 8
    page_indices = jnp.arange(batch * per_seq, dtype=jnp.int32).reshape(batch, per_seq)
    lengths = jnp.array([40, 64], jnp.int32)
    with pltpu.force_tpu_interpret_mode():
        eager = attn(q, k, v, lengths, page_indices)
        traced = jax.jit(attn)(q, k, v, lengths, page_indices)
    # reference: each sequence attends to the first `length` positions of its pages
    want = []
    for b in range(batch):
        keys = k[0, page_indices[b]].reshape(-1, dim)[: int(lengths[b])]
        vals = v[0, page_indices[b]].reshape(-1, dim)[: int(lengths[b])]
        want.append(jax.nn.softmax(q[b, 0] @ keys.T) @ vals)
    np.testing.assert_allclose(np.asarray(eager[:, 0]), np.asarray(jnp.stack(want)), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(eager), rtol=1e-6, atol=1e-6)
    assert bench.calls == 2 and attn.tuner.stats["tuned"] == 1 and seen[-1] == 2


def test_splash_attention_kernel_built_per_config_under_jit():
    # splash attention is used by building a kernel object (a pytree holding the mask's block tables)
    # for the block sizes, then calling it: here inside the launcher, one kernel per config
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    tune, seen, bench = tuned_over(
        "bq", {128: 1e-3, 256: 2e-3}, lambda q, k, v: {"H": q.shape[0], "S": q.shape[1]}
    )
    heads, seq, dim = 1, 256, 128
    mask = masks.MultiHeadMask([masks.CausalMask((seq, seq)) for _ in range(heads)])

    @tune
    def attn(q, k, v, *, bq):
        seen.append(bq)
        sizes = splash.BlockSizes(block_q=bq, block_kv=128, block_kv_compute=128)
        return splash.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=True)(q, k, v)

    q = jax.random.normal(jax.random.PRNGKey(10), (heads, seq, dim)) / 4
    out = jax.jit(attn)(q, q, q)
    t = q.transpose(1, 0, 2)[None]  # splash does not scale the logits: scale=1
    want = jax.nn.dot_product_attention(t, t, t, is_causal=True, scale=1.0)[0].transpose(1, 0, 2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert bench.calls == 2 and bench.traced == 0 and seen[-1] == 128


# A decode kernel in the pattern of MaxText's ragged attention (AI-Hypercomputer/maxtext,
# MaxText/kernels/ragged_attention.py, Apache-2.0; written anew here, not copied): the per-row lengths are
# prefetched as scalars and the key block's index map stops at each row's last block, so the blocks
# past a row's length are never read.
def _ragged_sum_kernel(lengths_ref, q_ref, k_ref, o_ref, acc_ref, *, block):
    b, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    n = lengths_ref[b]

    @pl.when(i * block < n)
    def _():
        pos = i * block + jax.lax.broadcasted_iota(jnp.int32, (block, 1), 0)
        k = jnp.where(pos < n, k_ref[...], 0.0)
        acc_ref[...] += jnp.sum(k, axis=0, keepdims=True) * q_ref[...]

    o_ref[...] = acc_ref[...]


def _ragged_sum(q, k, lengths, *, block):
    batch, seq, dim = k.shape

    def k_index(b, i, lengths_ref):
        last = jax.lax.div(lengths_ref[b] + block - 1, block) - 1
        return b, jnp.minimum(i, jnp.maximum(last, 0)), 0

    return pl.pallas_call(
        functools.partial(_ragged_sum_kernel, block=block),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, seq // block),
            in_specs=[
                pl.BlockSpec((None, 1, dim), lambda b, i, _: (b, 0, 0)),
                pl.BlockSpec((None, block, dim), k_index),
            ],
            out_specs=pl.BlockSpec((None, 1, dim), lambda b, i, _: (b, 0, 0)),
            scratch_shapes=[pltpu.VMEM((1, dim), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((batch, 1, dim), jnp.float32),
    )(lengths, q, k)


def test_scalar_prefetched_lengths_first_called_under_jit():
    # the first call is traced: the lengths' stand-ins are zeros (every row empty, docs/api.md); the
    # tuning must still succeed and the traced program use the winner on the real lengths
    tune, seen, bench = tuned_over(
        "block", {8: 2e-3, 16: 1e-3}, lambda q, k, lengths: {"B": k.shape[0], "S": k.shape[1]}
    )

    @tune
    def ragged_sum(q, k, lengths, *, block):
        seen.append(block)
        return _ragged_sum(q, k, lengths, block=block)

    q = jax.random.normal(jax.random.PRNGKey(11), (2, 1, 8))
    k = jax.random.normal(jax.random.PRNGKey(12), (2, 32, 8))
    lengths = jnp.array([5, 30], jnp.int32)
    want = jnp.stack([k[0, :5].sum(0), k[1, :30].sum(0)])[:, None] * q
    with pltpu.force_tpu_interpret_mode():
        out = jax.jit(ragged_sum)(q, k, lengths)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert bench.calls == 2 and seen[-1] == 16


# ---- user patterns around a launcher ----------------------------------------------------------------
def _scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def test_python_number_traced_by_jit_beside_a_bfloat16_array():
    # `jax.jit(f)(x, 0.5)` traces 0.5 as a weakly typed float32 scalar, which keeps `x * s` in bfloat16.
    # The stand-ins the miss is tuned on were strongly typed: `x * s` became float32, the bfloat16
    # output ref refused it, and every config failed under jit although the call works without tuner.
    # And the traced call's stored key (a float32 dtype for `s`) was not the key of `f(x, 0.5)` outside
    # jit (a Python number has no dtype): they never shared an entry.
    tune, seen, bench = tuned_over("block", {8: 2e-3, 16: 1e-3}, lambda x, s: {"n": x.shape[0]})

    @tune
    def scaled(x, s, *, block):
        seen.append(block)
        spec = pl.BlockSpec((block,), lambda i: (i,))
        return pl.pallas_call(
            _scale_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block,),
            in_specs=[spec],
            out_specs=spec,
            interpret=True,
        )(x * s)

    x = jnp.arange(32, dtype=jnp.bfloat16)
    out = jax.jit(scaled)(x, 0.5)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(x, np.float32))
    assert bench.calls == 2 and bench.traced == 0 and seen[-1] == 16
    [entry] = ConfigCache().entries()
    assert list(entry.key.dtypes) == ["bfloat16"]
    scaled.cache_clear()  # outside jit: the Python number's key is the traced call's key
    np.testing.assert_array_equal(np.asarray(scaled(x, 0.5), np.float32), np.asarray(x, np.float32))
    assert bench.calls == 2 and scaled.tuner.stats["from_store"] == 1


def _rms_fwd_kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _rms_bwd_kernel(x_ref, g_ref, o_ref):
    x, g = x_ref[...], g_ref[...]
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    o_ref[...] = r * g - x * r**3 * jnp.mean(g * x, axis=-1, keepdims=True)


def _rows_call(kernel, rows, *arrays):
    x = arrays[0]
    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // rows,),
        in_specs=[spec] * len(arrays),
        out_specs=spec,
        interpret=True,
    )(*arrays)


def test_custom_vjp_with_forward_and_backward_kernels_tuned_separately():
    seen: list = []
    bench = OnceBench(seen, lambda c: {("f", 4): 1e-3, ("f", 8): 2e-3, ("b", 4): 2e-3, ("b", 8): 1e-3}[c])
    space = [{"rows": 4}, {"rows": 8}]

    @tuner.autotune(configs=space, key=lambda x: {"R": x.shape[0], "C": x.shape[1]}, bench=bench)
    def rms_fwd(x, *, rows):
        seen.append(("f", rows))
        return _rows_call(_rms_fwd_kernel, rows, x)

    @tuner.autotune(configs=space, key=lambda x, g: {"R": x.shape[0], "C": x.shape[1]}, bench=bench)
    def rms_bwd(x, g, *, rows):
        seen.append(("b", rows))
        return _rows_call(_rms_bwd_kernel, rows, x, g)

    @jax.custom_vjp
    def rms(x):
        return rms_fwd(x)

    rms.defvjp(lambda x: (rms_fwd(x), x), lambda x, g: (rms_bwd(x, g),))

    def ref(x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    x = jax.random.normal(jax.random.PRNGKey(8), (16, 32))
    w = jax.random.normal(jax.random.PRNGKey(9), (16, 32))
    g_ref = jax.grad(lambda x: (ref(x) * w).sum())(x)
    g = jax.jit(jax.grad(lambda x: (rms(x) * w).sum()))(x)  # both miss inside one trace
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-5)
    assert bench.calls == 4 and bench.traced == 0
    assert rms_fwd.tuner.last_choice["config"] == {"rows": 4} and rms_bwd.tuner.last_choice["config"] == {
        "rows": 8
    }
    gv = jax.vmap(jax.grad(lambda x: (rms(x) * w).sum()))(jnp.stack([x, 2 * x]))  # per-example shapes
    np.testing.assert_allclose(np.asarray(gv[0]), np.asarray(g_ref), rtol=1e-5, atol=1e-5)
    assert bench.calls == 4 and seen[-2:] in (
        [("f", 4), ("b", 8)],
        [("b", 8), ("f", 4)],
    )


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=["heads"])
class HeadSum:
    """A flax/equinox-style module: a pytree whose array field is data and whose head count is static;
    the launcher is its `__call__`, keyed on the static field through a key function."""

    def __init__(self, w, heads: int) -> None:
        self.w, self.heads = w, heads

    def __call__(self, x, *, bn):
        SEEN.append((self.heads, bn))
        return (x @ self.w).reshape(x.shape[0], self.heads, -1).sum(-1)


SEEN: list = []


def test_module_pytree_with_a_static_field_keys_on_it_and_on_its_dtypes():
    bench = OnceBench(SEEN, lambda c: {8: 2e-3, 16: 1e-3}[c[1]])
    call = tuner.autotune(
        configs=[{"bn": 8}, {"bn": 16}], key=lambda m, x: {"heads": m.heads, "n": x.shape[-1]}, bench=bench
    )(HeadSum.__call__)
    w, x = jnp.ones((16, 16)), jnp.ones((4, 16))
    step = jax.jit(lambda m, x: call(m, x))
    with jax.checking_leaks():  # nothing keeps a tracer of the trace that tuned
        assert step(HeadSum(w, 2), x).shape == (4, 2)
    assert step(HeadSum(w * 2, 2), x).shape == (4, 2)  # new weights, same static field: a hit
    assert bench.calls == 2
    assert step(HeadSum(w, 4), x).shape == (4, 4)  # another static field: its own key
    assert step(HeadSum(w.astype(jnp.bfloat16), 4), x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
    assert bench.calls == 6 and call.tuner.stats["tuned"] == 3
    keys = sorted((e.key.fields_dict["heads"], tuple(e.key.dtypes)) for e in ConfigCache().entries())
    assert keys == [(2, ("float32", "float32")), (4, ("bfloat16", "bfloat16")), (4, ("float32", "float32"))]


def _row_matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] @ w_ref[...]


class Dense:
    """A linen-style layer: a plain object (not a pytree) built inside the jitted step from traced
    parameters, whose tuned `__call__` reads them from `self`, not from its arguments."""

    def __init__(self, w) -> None:
        self.w = w

    def __call__(self, x, *, rows):
        DENSE_SEEN.append(rows)
        w = self.w
        return pl.pallas_call(
            _row_matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype),
            grid=(x.shape[0] // rows,),
            in_specs=[
                pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                pl.BlockSpec(w.shape, lambda i: (0, 0)),
            ],
            out_specs=pl.BlockSpec((rows, w.shape[1]), lambda i: (i, 0)),
            interpret=True,
        )(x, w)


DENSE_SEEN: list = []


@pytest.mark.filterwarnings("error::tuner.AllTrialsFailedWarning")  # an untimed choice is no failure
def test_launcher_reading_traced_values_it_is_not_passed(caplog):
    # Inside jit, `self.w` is a tracer of the caller's trace that tuner cannot see (self is no pytree;
    # a closure over a traced value is the same case). Timed on stand-ins in the helper thread, every
    # config raised jax's UnexpectedTracerError and the traced call failed, although it works without
    # tuner. Now the first config's error stops the tuning (the others would fail alike: they are not
    # tried, and nothing warns that all trials failed), its config is chosen untimed, as offline mode
    # would, said once in the log, and kept for later traces of the key; an eager call of the key tunes,
    # and the traces after it use the winner.
    times = {4: 2e-3, 8: 1e-3}
    bench = OnceBench(DENSE_SEEN, lambda c: times[c])
    layer_call = tuner.autotune(
        configs=[{"rows": 4}, {"rows": 8}],
        key=lambda layer, x: {"M": x.shape[0], "K": x.shape[1]},
        bench=bench,
    )(Dense.__call__)

    @jax.jit
    def step(w, x):
        return layer_call(Dense(w), x)

    w = jax.random.normal(jax.random.PRNGKey(13), (16, 8))
    x = jax.random.normal(jax.random.PRNGKey(14), (16, 16))
    with caplog.at_level("WARNING", logger="tuner.runtime._decorator"):
        np.testing.assert_allclose(np.asarray(step(w, x)), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
    assert bench.calls == 0 and layer_call.tuner.stats["tuned"] == 0
    assert "reads traced values it is not passed" in caplog.text
    tries = len(DENSE_SEEN)
    assert tries == 2  # the first config on the stand-ins, then the traced call with the choice
    jax.jit(lambda w, x: layer_call(Dense(w), x) * 2)(w, x)  # a new trace of the key: nothing tried again
    assert len(DENSE_SEEN) == tries + 1
    np.testing.assert_allclose(np.asarray(layer_call(Dense(w), x)), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
    assert bench.calls == 2 and layer_call.tuner.stats["tuned"] == 1  # eagerly: tuned
    jax.jit(lambda w, x: layer_call(Dense(w), x) * 3)(w, x)
    assert DENSE_SEEN[-1] == 8 and bench.calls == 2


def _positions_kernel(o_ref):
    o_ref[...] = jnp.arange(o_ref.shape[0], dtype=jnp.float32) + pl.program_id(0) * o_ref.shape[0]


def test_launcher_of_static_arguments_only_is_not_timed_while_tracing():
    # A launcher that makes its arrays itself from a static size (positions, a mask, a table) has no
    # tracer among its arguments, but inside jit it returns tracers: it was tuned in the caller's
    # trace, timing the tracing of each config (the bench got tracers) and storing that as the winner.
    tune, seen, bench = tuned_over("block", {4: 2e-3, 8: 1e-3}, ["n"])

    @tune
    def positions(n, *, block):
        seen.append(block)
        return pl.pallas_call(
            _positions_kernel,
            out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
            grid=(n // block,),
            out_specs=pl.BlockSpec((block,), lambda i: (i,)),
            interpret=True,
        )()

    x = jnp.ones(16)
    out = jax.jit(lambda x: x + positions(16))(x)
    np.testing.assert_array_equal(np.asarray(out), np.arange(16) + 1.0)
    assert bench.calls == 2 and bench.traced == 0 and seen[-1] == 8
    jax.jit(lambda x: x * positions(16))(x)
    assert bench.calls == 2 and positions.tuner.stats["tuned"] == 1


def test_static_argnames_key_and_donation_by_the_caller():
    tune, seen, bench = tuned_over("block", {8: 2e-3, 16: 1e-3}, ["heads"])

    @tune
    def split_sum(x, heads, *, block):
        seen.append(block)
        rows = x.reshape(heads, -1)
        return (rows - rows.mean(-1, keepdims=True)).reshape(x.shape)  # x's shape: its buffer is reusable

    step = jax.jit(split_sum, static_argnames=["heads"], donate_argnums=0)
    x = jnp.arange(32.0)
    out = step(x + 0, heads=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x - jnp.repeat(jnp.array([7.5, 23.5]), 16)))
    step(x + 0, heads=2)
    assert bench.calls == 2
    xd = x + 0
    step(xd, heads=4)
    assert bench.calls == 4 and split_sum.tuner.stats["tuned"] == 2
    assert xd.is_deleted()  # the caller's donation still happens (on a backend that implements it: CPU does)


_SHARDED = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P
import tuner

seen = []
def bench(call):
    jax.block_until_ready(call())
    return {8: 2e-3, 16: 1e-3}[seen[-1]]

def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0

@tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"rows": x.shape[0]}, bench=bench)
def affine(x, *, block):
    seen.append(block)
    spec = pl.BlockSpec((block, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block,),
                          in_specs=[spec], out_specs=spec, interpret=True)(x)

xs = jnp.arange(128 * 8, dtype=jnp.float32).reshape(128, 8)
mesh = jax.make_mesh((4,), ("d",))
xsh = jax.device_put(xs, jax.NamedSharding(mesh, P("d")))
sharded = jax.jit(jax.shard_map(affine, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))
np.testing.assert_allclose(np.asarray(sharded(xsh)), np.asarray(xs * 2 + 1))
assert len(seen) == 3 and seen[-1] == 16, seen  # tuned once on the per-device shape (32 rows)
np.testing.assert_allclose(np.asarray(jax.pmap(affine)(xs.reshape(4, 32, 8))).reshape(128, 8), np.asarray(xs * 2 + 1))
assert len(seen) == 4 and affine.tuner.stats["tuned"] == 1  # pmap: the same per-device key, a hit
assert affine.tuner.last_choice["key"]["key"] == {"rows": 32}
print("ok")
"""


def test_shard_map_and_pmap_over_four_cpu_devices(tmp_path):
    env = {**os.environ, "TUNER_HOME": str(tmp_path), "JAX_PLATFORMS": "cpu", "PYTHONPATH": repo_pythonpath()}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SHARDED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        encoding="utf-8",
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
