"""JAX: a decorated function called with tracers (inside jax.jit, jax.grad, jax.vmap) never times
tracing: it tunes on concrete arrays of the same shapes and dtypes, or uses the cache, and stores what
the eager path stores. jax's own Pallas ops (mha, layer_norm, rms_norm; interpret=True) are called
through tuner.autotune inside jitted model functions and checked against jax's reference functions."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pallas_gpu = pytest.importorskip("jax.experimental.pallas.ops.gpu")

import numpy as np  # noqa: E402
from jax.experimental.pallas.ops.gpu import attention, layer_norm, rms_norm  # noqa: E402

import tuner  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402


def _leaves_are_concrete(out) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out))


class ConfigBench:
    """A fake bench: runs the call once (it must return concrete arrays: tracing is never timed) and
    reports a fixed time per config, read from what the launcher last saw."""

    def __init__(self, seen: list, time_of) -> None:
        self.seen = seen
        self.time_of = time_of
        self.calls = 0
        self.traced = 0

    def __call__(self, call):
        out = call()
        if not _leaves_are_concrete(out):
            self.traced += 1
        jax.block_until_ready(out)
        self.calls += 1
        return self.time_of(self.seen[-1])


def test_mha_inside_jit_tunes_on_concrete_arrays(_tuner_home):
    seen: list = []
    bench = ConfigBench(seen, lambda c: {16: 2e-3, 32: 1e-3}[c[0]])

    @tuner.autotune(
        configs=[{"block_q": 16, "block_k": 16}, {"block_q": 32, "block_k": 32}],
        key=lambda q, k, v: {"S": q.shape[1], "H": q.shape[2], "D": q.shape[3]},
        bench=bench,
    )
    def attn(q, k, v, *, block_q, block_k):
        seen.append((block_q, block_k))
        sizes = attention.BlockSizes(block_q=block_q, block_k=block_k)
        return attention.mha(q, k, v, None, block_sizes=sizes, interpret=True)

    @jax.jit
    def model(x, w):
        q = jnp.tanh(x @ w).reshape(x.shape[0], x.shape[1], 2, 16)
        return attn(q, q, q).reshape(x.shape) + x

    @jax.jit
    def model_ref(x, w):
        q = jnp.tanh(x @ w).reshape(x.shape[0], x.shape[1], 2, 16)
        return attention.mha_reference(q, q, q, None).reshape(x.shape) + x

    x = jax.random.normal(jax.random.PRNGKey(0), (1, 64, 32))
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 32)) / 6
    out = model(x, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(model_ref(x, w)), rtol=2e-4, atol=2e-4)
    assert bench.calls == 2 and bench.traced == 0
    assert attn.tuner.stats["tuned"] == 1
    [entry] = ConfigCache().entries()
    assert entry.config == {"block_q": 32, "block_k": 32}
    assert entry.key.fields_dict == {"S": 64, "H": 2, "D": 16} and entry.key.device == "cpu"
    # a new trace of another model with the same shapes: an in-memory hit, nothing timed
    jax.jit(lambda x, w: model(x, w) * 2)(x, w)
    assert bench.calls == 2 and seen[-1] == (32, 32)


def _ln_case(fn_name: str):
    op = {"layer_norm": layer_norm.layer_norm, "rms_norm": rms_norm.rms_norm}[fn_name]
    ref = {"layer_norm": layer_norm.layer_norm_reference, "rms_norm": rms_norm.rms_norm_reference}[fn_name]
    return op, ref


@pytest.mark.parametrize("op_name", ["layer_norm", "rms_norm"])
def test_norm_ops_inside_jit_and_grad(op_name, _tuner_home):
    op, ref = _ln_case(op_name)
    seen: list = []
    bench = ConfigBench(seen, lambda c: {1: 3e-3, 2: 1e-3, 4: 2e-3}[c])

    @tuner.autotune(
        configs=[{"num_warps": 1}, {"num_warps": 2}, {"num_warps": 4}],
        key=lambda x, w, b: {"N": x.shape[-1]},
        bench=bench,
    )
    def norm(x, w, b, *, num_warps):
        seen.append(num_warps)
        return op(x, w, b, num_warps=num_warps, interpret=True)

    @jax.jit
    def model(x, w, b):
        return norm(x * 2.0, w, b).sum(axis=-1)

    x = jax.random.normal(jax.random.PRNGKey(2), (2, 4, 64))
    w = jax.random.normal(jax.random.PRNGKey(3), (64,))
    b = jax.random.normal(jax.random.PRNGKey(4), (64,))
    got = model(x, w, b)
    want = ref(x * 2.0, w, b).sum(axis=-1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    assert bench.calls == 3 and bench.traced == 0
    assert ConfigCache().entries()[0].config == {"num_warps": 2}
    if op_name == "layer_norm":  # jax.grad: a JVP tracer; the cached config is used, nothing timed
        g = jax.grad(lambda x: norm(x * 2.0, w, b).sum())(x)
        g_ref = jax.grad(lambda x: ref(x * 2.0, w, b).sum())(x)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-3, atol=1e-3)
        assert bench.calls == 3


def test_grad_miss_tunes_on_concrete_arrays(_tuner_home):
    seen: list = []
    bench = ConfigBench(seen, lambda c: {1: 2e-3, 2: 1e-3}[c])

    @tuner.autotune(
        configs=[{"num_warps": 1}, {"num_warps": 2}], key=lambda x, w, b: {"N": x.shape[-1]}, bench=bench
    )
    def norm(x, w, b, *, num_warps):
        seen.append(num_warps)
        return layer_norm.layer_norm(x, w, b, num_warps=num_warps, interpret=True)

    x = jax.random.normal(jax.random.PRNGKey(5), (2, 4, 32))  # jax's norm ops take (batch, rows, N)
    w, b = jnp.ones(32), jnp.zeros(32)
    g = jax.grad(lambda x: (norm(x, w, b) ** 2).sum())(x)  # first call of all: a miss under grad
    g_ref = jax.grad(lambda x: (layer_norm.layer_norm_reference(x, w, b) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-3, atol=1e-3)
    assert bench.calls == 2 and bench.traced == 0 and seen[-1] == 2


def test_vmap_miss_tunes_on_concrete_arrays(_tuner_home):
    from jax.experimental import pallas as pl

    seen: list = []
    bench = ConfigBench(seen, lambda c: {8: 2e-3, 16: 1e-3}[c])

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"n": x.shape[0]}, bench=bench)
    def affine(x, *, block):
        seen.append(block)
        return pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block,),
            in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
            out_specs=pl.BlockSpec((block,), lambda i: (i,)),
            interpret=True,
        )(x)

    xs = jnp.arange(3 * 32, dtype=jnp.float32).reshape(3, 32)
    out = jax.jit(jax.vmap(affine))(xs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(xs * 2.0 + 1.0))
    assert bench.calls == 2 and bench.traced == 0
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict == {"n": 32} and entry.config == {"block": 16}  # per-example shape


def test_traced_entry_equals_the_eager_entry(tmp_path):
    def make(storage, seen):
        bench = ConfigBench(seen, lambda c: {1: 2e-3, 2: 1e-3}[c])

        @tuner.autotune(
            configs=[{"num_warps": 1}, {"num_warps": 2}],
            key=lambda x, w, b: {"M": x.shape[0] * x.shape[1], "N": x.shape[2]},
            bench=bench,
            storage=storage,
            name="rms_norm_tuned",
        )
        def norm(x, w, b, *, num_warps):
            seen.append(num_warps)
            return rms_norm.rms_norm(x, w, b, num_warps=num_warps, interpret=True)

        return norm, bench

    x = jax.random.normal(jax.random.PRNGKey(6), (2, 8, 64))
    w, b = jnp.ones(64), jnp.zeros(64)
    eager_url, traced_url = f"sqlite:///{tmp_path / 'eager.db'}", f"sqlite:///{tmp_path / 'traced.db'}"
    eager, eb = make(eager_url, [])
    eager(x, w, b)
    traced, tb = make(traced_url, [])
    jax.jit(traced)(x, w, b)
    assert eb.calls == tb.calls == 2 and tb.traced == 0
    [e1] = ConfigCache(eager_url).entries()
    [e2] = ConfigCache(traced_url).entries()
    assert e1.key == e2.key and e1.config == e2.config == {"num_warps": 2}
    # and a jitted call in a fresh process (a new decorated function) on the eager store times nothing
    again, ab = make(eager_url, [])
    jax.jit(again)(x, w, b)
    assert ab.calls == 0 and again.tuner.stats["from_store"] == 1


def test_keyword_call_under_jit_hits_without_stand_ins(monkeypatch):
    # A call with keyword arguments takes the general key, which is built from shapes and dtypes as the
    # fast key is: once tuned, its traces are in-memory hits too, with no concrete stand-ins (jax's
    # mha with causal= as users call it; a stand-in is an array as large as the traced one).
    from tuner.runtime import _jax as rjax

    made: list = []
    real = rjax._materialise
    monkeypatch.setattr(rjax, "_materialise", lambda *a, **k: (made.append(1), real(*a, **k))[1])
    seen: list = []
    bench = ConfigBench(seen, lambda c: {16: 2e-3, 32: 1e-3}[c[0]])

    @tuner.autotune(
        configs=[{"block_q": 16, "block_k": 16}, {"block_q": 32, "block_k": 32}],
        key=lambda q, k, v, causal=False: {"S": q.shape[1], "D": q.shape[3], "causal": causal},
        bench=bench,
    )
    def attn(q, k, v, causal=False, *, block_q, block_k):
        seen.append((block_q, block_k))
        sizes = attention.BlockSizes(block_q=block_q, block_k=block_k)
        return attention.mha(q, k, v, None, causal=causal, block_sizes=sizes, interpret=True)

    q = jax.random.normal(jax.random.PRNGKey(7), (1, 32, 2, 16))
    want = attention.mha_reference(q, q, q, None, causal=True)
    out = jax.jit(lambda q: attn(q, q, q, causal=True))(q)  # a miss: tuned on stand-ins
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=2e-4, atol=2e-4)
    assert bench.calls == 2 and bench.traced == 0 and len(made) == 1
    out = jax.jit(lambda q: attn(q, q, q, causal=True) * 2.0)(q)  # a new trace, the same key: a hit
    np.testing.assert_allclose(np.asarray(out), np.asarray(want * 2.0), rtol=2e-4, atol=2e-4)
    abstract = jax.eval_shape(lambda q: attn(q, q, q, causal=True), jax.ShapeDtypeStruct(q.shape, q.dtype))
    assert abstract.shape == q.shape
    assert len(made) == 1 and bench.calls == 2 and seen[-1] == (32, 32)
    assert attn.tuner.stats["tuned"] == 1
