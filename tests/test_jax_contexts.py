"""`tuner.autotune` in the jax contexts real model code puts a kernel in (test_jax_real_programs.py and
test_runtime_jax_tracing.py cover jit, grad, vmap, custom_vjp, shard_map and donation): a layer stack
scanned over layers (MaxText, Flax's nn.scan) with remat policies, the bodies of cond, switch,
while_loop and fori_loop, jit with static_argnames and of a bound method, vmap with other axes and
nested, linearize, jvp and hessian, enable_x64 and strict dtype promotion, Equinox- and Flax-style
modules (pytrees holding arrays, params dicts), collectives over a named axis, jax.export with
symbolic dimensions, and placements on four CPU devices with a second process that hits the store.

Each context checks the output against jax.numpy, the number of tunings (one per key, each config
timed once on concrete arrays, never on tracers), that no tracer leaks (`jax.checking_leaks`) and the
key seen. Timing is irrelevant here: a fake bench runs each config once."""

from __future__ import annotations

import dataclasses
import logging
import warnings

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pl = pytest.importorskip("jax.experimental.pallas")

import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import tuner  # noqa: E402
from tests._env import cpu_jax_program, quick_cpu_xla_flags  # noqa: E402
from tests.test_thirdparty_pallas import OnceBench  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402
from tuner.runtime._tuning import AllConfigsFailedError  # noqa: E402


def Bench() -> OnceBench:  # noqa: N802 - used as the class it returns
    """A bench that runs a config's call once and waits for it, counting the calls (`.calls`) and those
    that returned tracers (`.traced`: a timed trace, never wanted); each later config is reported
    faster, so the last one timed wins."""
    bench = OnceBench([None], lambda _: 1.0 / bench.calls)
    return bench


def _sine(key=lambda x: {"n": x.shape[-1]}):
    bench = Bench()

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=key, bench=bench)
    def sine(x, *, s):
        return jnp.sin(x) * s / s

    return sine, bench


# ---- a layer stack scanned over layers, with remat ------------------------------------------------------
def _tanh_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...] * w_ref[...])


def test_pallas_layer_in_a_scanned_remat_stack_is_tuned_once():
    seen: list = []
    bench = Bench()

    @tuner.autotune(configs=[{"block": 4}, {"block": 8}], key=lambda x, p: {"n": x.shape[-1]}, bench=bench)
    def layer(x, p, *, block):
        seen.append(block)
        spec = pl.BlockSpec((x.shape[0], block), lambda i: (0, i))
        wspec = pl.BlockSpec((1, block), lambda i: (0, i))
        return pl.pallas_call(
            _tanh_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[1] // block,),
            in_specs=[spec, wspec],
            out_specs=spec,
            interpret=True,
        )(x, p["w"][None, :])

    n_layers, n = 3, 16
    params = {"w": jnp.linspace(0.5, 1.5, n_layers * n).reshape(n_layers, n)}  # stacked per layer
    body = jax.checkpoint(lambda h, p: (layer(h, p), None), policy=jax.checkpoint_policies.dots_saveable)
    stack = jax.jit(lambda h, ps: lax.scan(body, h, ps)[0])
    h0 = jnp.ones((2, n))
    with jax.checking_leaks():
        out = stack(h0, params)
        out2 = stack(h0 * 0.5, params)
    ref = h0
    for i in range(n_layers):
        ref = jnp.tanh(ref * params["w"][i])
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5)
    assert out2.shape == out.shape
    # one tuning (each config once, on concrete arrays), then the body's one trace; the scan traces it once
    assert seen == [4, 8, 8] and bench.traced == 0 and layer.tuner.stats["tuned"] == 1
    assert layer.tuner.last_choice["key"]["key"] == {"n": 16}
    assert layer.tuner.last_choice["key"]["dtypes"] == ["float32", "float32"]


@pytest.mark.parametrize(
    "policy",
    [None, "nothing_saveable", "dots_saveable", "everything_saveable"],
)
def test_remat_policies_under_grad_and_scan(policy):
    sine, bench = _sine()
    pol = None if policy is None else getattr(jax.checkpoint_policies, policy)
    x = jnp.linspace(0.0, 1.0, 8)
    with jax.checking_leaks():
        g = jax.jit(jax.grad(jax.checkpoint(lambda x: sine(x).sum(), policy=pol)))(x)
        ws = jnp.stack([jnp.eye(8) * 0.5] * 3)
        layer = jax.checkpoint(lambda h, w: (sine(h @ w), None), policy=pol, prevent_cse=False)
        gw = jax.jit(jax.grad(lambda ws: lax.scan(layer, x, ws)[0].sum()))(ws)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jnp.cos(x)), rtol=1e-5)
    assert gw.shape == ws.shape and bool(jnp.all(jnp.isfinite(gw)))
    assert bench.calls == 2 and bench.traced == 0 and sine.tuner.stats["tuned"] == 1


# ---- control flow bodies ---------------------------------------------------------------------------------
def test_cond_switch_while_and_fori_bodies():
    sine, bench = _sine()
    x = jnp.linspace(0.0, 1.0, 8)
    with jax.checking_leaks():
        r1 = jax.jit(lambda p, x: lax.cond(p, sine, lambda x: -sine(x), x))(True, x)
        r2 = jax.jit(lambda i, x: lax.switch(i, [sine, lambda x: 2 * sine(x), jnp.cos], x))(1, x)
        r3 = jax.jit(lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, sine(c[1])), (0, x)))(
            x
        )
        r4 = jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, h: sine(h), x))(x)
        r5 = lax.fori_loop(0, 3, lambda i, h: sine(h), x)  # no jit: the body is traced all the same
    three = jnp.sin(jnp.sin(jnp.sin(x)))
    np.testing.assert_allclose(np.asarray(r1), np.asarray(jnp.sin(x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r2), np.asarray(2 * jnp.sin(x)), rtol=1e-6)
    for r in (r3[1], r4, r5):
        np.testing.assert_allclose(np.asarray(r), np.asarray(three), rtol=1e-6)
    assert bench.calls == 2 and bench.traced == 0 and sine.tuner.stats["tuned"] == 1
    # a body with another shape is another key (a 16-wide carry): tuned once more
    jax.jit(lambda x: lax.fori_loop(0, 2, lambda i, h: sine(h), x))(jnp.ones(16))
    assert bench.calls == 4 and sine.tuner.stats["tuned"] == 2
    assert sine.tuner.last_choice["key"]["key"] == {"n": 16}

    def scoped(x):  # a miss inside a named scope: the traced call keeps the scope's name
        with jax.named_scope("layer0"):
            return jax.named_call(sine, name="attn")(x)

    text = jax.jit(scoped).lower(jnp.ones(4)).as_text(debug_info=True)
    assert "layer0" in text and "attn" in text and sine.tuner.stats["tuned"] == 3


# ---- vmap axes, nesting, forward-mode differentiation -------------------------------------------------
def test_vmap_axes_nested_vmap_linearize_jvp_and_hessian():
    sine, bench = _sine(key=lambda x: {"n": x.shape[0]})
    x = jnp.arange(24.0).reshape(4, 6) / 24
    with jax.checking_leaks():
        r1 = jax.vmap(sine, in_axes=1, out_axes=1)(x)  # per column: shape (4,)
        r2 = jax.vmap(jax.vmap(sine))(x.reshape(2, 2, 6))  # per row of a row: shape (6,)
        r3 = jax.jit(jax.vmap(jax.vmap(sine, in_axes=1), in_axes=2))(x.reshape(2, 2, 6))  # shape (2,)
    np.testing.assert_allclose(np.asarray(r1), np.asarray(jnp.sin(x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r2), np.asarray(jnp.sin(x).reshape(2, 2, 6)), rtol=1e-6)
    assert r3.shape == (6, 2, 2)
    assert sorted(e.key.fields_dict["n"] for e in ConfigCache().entries()) == [2, 4, 6]
    assert bench.calls == 6 and bench.traced == 0 and sine.tuner.stats["tuned"] == 3
    v = jnp.linspace(0.0, 1.0, 6)
    with jax.checking_leaks():
        y, lin = jax.linearize(sine, v)
        t = lin(jnp.ones(6))
        _, tj = jax.jvp(sine, (v,), (jnp.ones(6),))
        h = jax.hessian(lambda v: sine(v).sum())(v)
    np.testing.assert_allclose(np.asarray(t), np.asarray(jnp.cos(v)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(tj), np.asarray(jnp.cos(v)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jnp.diag(h)), np.asarray(-jnp.sin(v)), rtol=1e-5, atol=1e-6)
    assert bench.calls == 6 and sine.tuner.stats["tuned"] == 3  # shape (6,): hits, under every transform


# ---- static arguments, bound methods, module pytrees --------------------------------------------------
def test_static_argnames_and_a_bound_method_under_jit():
    bench = Bench()

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=["n"], bench=bench)
    def head(x, n, *, s):
        return jnp.sin(x[:n]) * s / s

    with jax.checking_leaks():
        a = jax.jit(head, static_argnames=("n",))(jnp.ones(8), n=4)
        b = jax.jit(head, static_argnums=(1,))(jnp.ones(8), 4)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b))
    assert (
        bench.calls == 2
        and head.tuner.stats["tuned"] == 1
        and head.tuner.last_choice["key"]["key"] == {"n": 4}
    )

    class Model:
        def __init__(self, scale: float) -> None:
            self.scale = scale

        @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda self, x: {"n": x.shape[0]}, bench=bench)
        def apply(self, x, *, s):
            return jnp.sin(x) * self.scale * s / s

    m = Model(3.0)
    with jax.checking_leaks():
        r = jax.jit(m.apply)(jnp.ones(8))
        r_eager = m.apply(jnp.ones(8))
    np.testing.assert_allclose(np.asarray(r), np.asarray(3 * jnp.sin(jnp.ones(8))), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r_eager), np.asarray(r), rtol=1e-6)
    assert bench.calls == 4 and Model.apply.tuner.stats["tuned"] == 1 and bench.traced == 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Linear:
    """An Equinox-style module: a frozen dataclass registered as a pytree, arrays as its leaves, a static
    field, and a tuned `__call__`."""

    w: jax.Array
    b: jax.Array
    act: str = dataclasses.field(default="tanh", metadata={"static": True})

    @tuner.autotune(
        configs=[{"u": 1}, {"u": 2}], key=lambda self, x: {"d": x.shape[-1], "act": self.act}, bench=Bench()
    )
    def __call__(self, x, *, u):
        return getattr(jnp, self.act)(x @ self.w + self.b) * u / u


def test_equinox_style_module_pytree():
    tuned = Linear.__call__.tuner
    tuned.cache_clear()
    bench = tuned.bench
    m = Linear(jnp.eye(4) * 0.5, jnp.zeros(4))
    x = jnp.ones((3, 4))
    with jax.checking_leaks():
        r = jax.jit(lambda m, x: m(x))(m, x)  # the module's arrays are tracers: stand-ins replace them
        g = jax.grad(lambda m, x: m(x).sum())(m, x)
        r_vmap = jax.vmap(lambda m, x: m(x), in_axes=(None, 0))(m, x)
        r_eager = m(x)
    for out in (r, r_vmap, r_eager):
        np.testing.assert_allclose(np.asarray(out), np.asarray(jnp.tanh(x * 0.5)), rtol=1e-6)
    assert g.w.shape == (4, 4) and bench.traced == 0
    assert tuned.stats["tuned"] == 1 and tuned.last_choice["key"]["key"] == {"d": 4, "act": "tanh"}
    assert tuned.last_choice["key"]["dtypes"] == ["float32", "float32", "float32"]  # w, b and x
    mb = Linear(m.w.astype(jnp.bfloat16), m.b.astype(jnp.bfloat16))
    jax.jit(lambda m, x: m(x))(mb, x.astype(jnp.bfloat16))  # a bfloat16 module: its own key
    assert tuned.stats["tuned"] == 2 and tuned.last_choice["key"]["dtypes"] == ["bfloat16"] * 3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Block:
    """An Equinox-style module holding the tuned function as a (static) field."""

    w: jax.Array
    op: object = dataclasses.field(metadata={"static": True})

    def __call__(self, x):
        return self.op(x @ self.w, self.w)


def test_equinox_style_module_with_the_tuned_function_as_a_field():
    bench = Bench()

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x, w: {"n": x.shape[-1]}, bench=bench)
    def op(x, w, *, s):
        return jnp.tanh(x) * s / s + 0 * w.sum()

    x = jnp.ones((2, 4))
    with jax.checking_leaks():
        r = jax.jit(lambda m, x: m(x))(Block(jnp.eye(4), op), x)
        g = jax.grad(lambda m: m(x).sum())(Block(jnp.eye(4), op))
        v = jax.vmap(lambda m, x: m(x))(Block(jnp.stack([jnp.eye(4)] * 3), op), jnp.stack([x] * 3))
    np.testing.assert_allclose(np.asarray(r), np.asarray(jnp.tanh(x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(v[1]), np.asarray(r), rtol=1e-6)
    assert g.w.shape == (4, 4) and bench.calls == 2 and bench.traced == 0 and op.tuner.stats["tuned"] == 1


def test_flax_style_module_with_a_params_pytree_and_a_function_field():
    bench = Bench()

    @tuner.autotune(configs=[{"u": 1}, {"u": 2}], key=lambda x, params: {"d": x.shape[-1]}, bench=bench)
    def dense(x, params, *, u):
        return jnp.tanh(x @ params["kernel"] + params["bias"]) * u / u

    @dataclasses.dataclass
    class Dense:  # linen's pattern: a dataclass module, params passed in by `apply`
        features: int
        op: object = dense  # the tuned function as a field

        def init(self, key):
            return {"kernel": jax.random.normal(key, (self.features, self.features)) * 0.1,
                    "bias": jnp.zeros(self.features)}  # fmt: skip

        def __call__(self, params, x):
            return self.op(x, params)

    mod = Dense(8)
    params = mod.init(jax.random.PRNGKey(0))
    x = jnp.ones((2, 8))
    stacked = jax.vmap(mod.init)(jax.random.split(jax.random.PRNGKey(1), 3))  # nn.scan's stacked params
    with jax.checking_leaks():
        r = jax.jit(mod.__call__)(params, x)
        r2 = jax.jit(lambda p, x: mod(p, x))(params, x)
        out = jax.jit(lambda ps, x: lax.scan(lambda h, p: (mod(p, h), None), x, ps)[0])(stacked, x)
    np.testing.assert_allclose(np.asarray(r), np.asarray(jnp.tanh(x @ params["kernel"])), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(r2), np.asarray(r))
    ref = x
    for i in range(3):
        ref = jnp.tanh(ref @ stacked["kernel"][i] + stacked["bias"][i])
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5)
    assert bench.calls == 2 and bench.traced == 0 and dense.tuner.stats["tuned"] == 1


# ---- dtype modes -------------------------------------------------------------------------------------------
def test_enable_x64_and_strict_promotion_are_keyed_as_traced():
    sine, bench = _sine()
    with jax.enable_x64(True):
        r64 = jax.jit(sine)(jnp.ones(8, jnp.float64))
        assert sine.tuner.last_choice["key"]["dtypes"] == ["float64"]
        r_weak = jax.jit(lambda x: sine(x * 2.0))(jnp.ones(8))  # float64 by default there: a hit
    r32 = jax.jit(sine)(jnp.ones(8))
    with jax.numpy_dtype_promotion("strict"):
        rb = jax.jit(sine)(jnp.ones(8, jnp.bfloat16))
        assert sine.tuner.last_choice["key"]["dtypes"] == ["bfloat16"]
    assert (r64.dtype, r_weak.dtype, r32.dtype, rb.dtype) == (
        jnp.float64,
        jnp.float64,
        jnp.float32,
        jnp.bfloat16,
    )
    assert sine.tuner.stats["tuned"] == 3 and bench.calls == 6 and bench.traced == 0


# ---- collectives over a named axis --------------------------------------------------------------------------
def test_collective_over_a_vmap_axis_name_is_chosen_untimed(caplog):
    calls: list = []
    bench = Bench()

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=bench)
    def normalise(x, *, s):
        calls.append(s)
        return x * s / s / lax.psum(x.sum(), "batch")

    x = jnp.ones((4, 8))
    with (
        caplog.at_level(logging.WARNING, logger="tuner"),
        jax.checking_leaks(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error", tuner.AllTrialsFailedWarning)  # an untimed choice is no failure
        r = jax.vmap(normalise, axis_name="batch")(x)  # the old code raised AllConfigsFailedError here
    np.testing.assert_allclose(np.asarray(r), np.full((4, 8), 1 / 32), rtol=1e-6)
    assert bench.calls == 0 and normalise.tuner.stats["offline_fallback"] == 1
    # the first config on the stand-ins, then the traced call with the choice; the other config was not
    # tried (the old code tried every config, each failing alike, and warned that all trials failed)
    assert len(calls) == 2 and ConfigCache().entries() == []
    why = normalise.tuner.last_choice["why"]
    assert "not timed" in why and "unbound axis name: batch" in why and "shard_map" in why
    assert any("unbound axis name" in rec.getMessage() for rec in caplog.records)
    n = len(calls)
    jax.jit(jax.vmap(normalise, axis_name="batch"))(x + 1)  # the key again: the untimed choice, no tries
    assert len(calls) == n + 1 and normalise.tuner.stats["offline_fallback"] == 1


def test_other_failures_with_a_named_axis_still_raise():
    tried: list = []

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=Bench())
    def broken(x, *, s):
        tried.append(s)
        if s == 1.0:
            raise ValueError("bad block")
        return lax.psum(x, "batch")

    # the first config fails for a reason of its own: the tuning goes on, the other config fails on
    # the stand-ins' unbound axis, and no config ran: raised, as before (without optimize's warning, which
    # said the same just before)
    with (
        warnings.catch_warnings(),
        pytest.raises(AllConfigsFailedError, match="every one of 2 configs failed; first error: ValueError"),
    ):
        warnings.simplefilter("error", tuner.AllTrialsFailedWarning)
        jax.vmap(broken, axis_name="batch")(jnp.ones((2, 4)))
    assert tried == [1.0, 2.0]


def test_a_failing_config_chosen_untimed_raises_its_own_error():
    tried: list = []

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=Bench())
    def broken(x, *, s):
        tried.append(s)
        out = lax.psum(x, "batch")  # the stand-ins fail here, whatever the config
        if s == 2.0:
            raise ValueError("bad block")
        return out

    # the first config meets the unbound axis on the stand-ins: chosen untimed, without trying the other
    # config; the choice (the space default, s=2.0) fails in the traced call with its own error, which
    # reaches the caller as it is (the old code tried s=2.0 on the stand-ins too, where the axis failed
    # first, and chose untimed all the same, with an AllTrialsFailedWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tuner.AllTrialsFailedWarning)
        with pytest.raises(ValueError, match="bad block"):
            jax.vmap(broken, axis_name="batch")(jnp.ones((2, 4)))
    assert tried == [1.0, 2.0] and broken.tuner.last_choice["config"] == {"s": 2.0}


def test_an_unbound_axis_outside_any_trace_is_a_real_failure():
    tried: list = []

    @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=Bench())
    def summed(x, *, s):
        tried.append(s)
        return lax.psum(x, "batch")

    # called eagerly there are no stand-ins: the axis is unbound for the caller too, every config is
    # tried and the tuning fails as any tuning whose configs all fail
    with (
        warnings.catch_warnings(),
        pytest.raises(AllConfigsFailedError, match="every one of 2 configs failed.*unbound axis name"),
    ):
        warnings.simplefilter("error", tuner.AllTrialsFailedWarning)
        summed(jnp.ones((2, 4)))
    assert tried == [1.0, 2.0] and summed.tuner.stats["offline_fallback"] == 0


# ---- jax.export with symbolic dimensions -------------------------------------------------------------------
def test_export_with_symbolic_dimensions():
    from jax import export

    sine, bench = _sine()  # key: the last dimension
    (b,) = export.symbolic_shape("b")
    # the key (n=4) is concrete, the batch symbolic: nothing to time, chosen untimed (the old code raised
    # jax's UnexpectedDimVar making the stand-ins)
    with jax.checking_leaks():
        exp = export.export(jax.jit(sine))(jax.ShapeDtypeStruct((b, 4), jnp.float32))
    x = jnp.linspace(0.0, 1.0, 20).reshape(5, 4)
    np.testing.assert_allclose(np.asarray(exp.call(x)), np.asarray(jnp.sin(x)), rtol=1e-6)
    assert bench.calls == 0 and sine.tuner.stats["tuned"] == 0
    assert "symbolic dimensions" in sine.tuner.last_choice["why"]
    assert sine.tuner.last_choice["key"]["key"] == {"n": 4}
    # a concrete trace of the key still tunes it; the export after that uses the winner
    jax.jit(sine)(x)
    assert bench.calls == 2 and sine.tuner.stats["tuned"] == 1
    export.export(jax.jit(sine))(jax.ShapeDtypeStruct((b, 4), jnp.float32))
    assert bench.calls == 2 and sine.tuner.stats["tuned"] == 1
    # the key on the symbolic dimension itself: refused, naming it
    (c,) = export.symbolic_shape("c")
    with pytest.raises(TypeError, match=r"key field\(s\) n are symbolic dimensions"):
        export.export(jax.jit(sine))(jax.ShapeDtypeStruct((2, c), jnp.float32))


def test_export_with_symbolic_dimensions_says_whether_the_key_is_known(caplog):
    from jax import export

    sine, bench = _sine()
    (b,) = export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((b, 4), jnp.float32)
    with caplog.at_level(logging.WARNING, logger="tuner"):
        export.export(jax.jit(sine))(spec)
    # no entry of the key: the line says so, and what is used instead (the old line said neither)
    [line] = [r.getMessage() for r in caplog.records if "symbolic dimensions" in r.getMessage()]
    assert "{'n': 4} ['float32']: using {'s': 2.0}" in line
    assert "the key, computed with 1 for every symbolic dimension, is not known (no cached entry" in line
    assert "offline: space default" in line and "to tune it, call it once with concrete shapes" in line
    assert line.endswith(f"({sine.tuner.last_choice['why']})")
    jax.jit(sine)(jnp.ones((3, 4)))  # the key tuned on concrete shapes
    assert bench.calls == 2 and sine.tuner.stats["tuned"] == 1
    sine.cache_clear()  # a new process, as it were: the export's miss finds the stored entry
    jax.clear_caches()  # (jax would reuse its trace of the first export)
    export.export(jax.jit(sine))(spec)
    why = sine.tuner.last_choice["why"]
    # known: nothing says to tune it (the old why asked to tune a key that was tuned already)
    assert why == (
        "not timed: shapes with symbolic dimensions (jax.export shape polymorphism) have no size to "
        "time; exact entry in the store"
    )
    assert bench.calls == 2 and sine.tuner.stats["from_store"] == 1


def test_export_key_computed_on_the_stand_ins_that_no_tuning_made_is_not_known():
    from jax import export

    # a key field that jax decides for a symbolic dimension (b == 1 is False) but the stand-ins (1 for
    # it) make True: the stored key of the export's miss is not the concrete calls' key, and the line
    # says it is not known
    sine, bench = _sine(key=lambda x: {"n": x.shape[-1], "single": x.shape[0] == 1})
    jax.jit(sine)(jnp.ones((3, 4)))
    assert sine.tuner.last_choice["key"]["key"] == {"n": 4, "single": False}
    sine.cache_clear()  # a new process, as it were (in this one the export hits the in-memory key)
    (b,) = export.symbolic_shape("b")
    export.export(jax.jit(sine))(jax.ShapeDtypeStruct((b, 4), jnp.float32))
    choice = sine.tuner.last_choice
    assert choice["key"]["key"] == {"n": 4, "single": True} and bench.calls == 2
    assert (
        "the key, computed with 1 for every symbolic dimension, is not known (no entry for key "
        "{'n': 4, 'single': True}; 1 entries of kernel"
    ) in choice["why"]


def test_export_with_concrete_shapes_and_compile_time_eval():
    from jax import export

    sine, bench = _sine()
    with jax.checking_leaks():
        exp = export.export(jax.jit(sine))(jax.ShapeDtypeStruct((3, 4), jnp.float32))

        def prog(x):
            with jax.ensure_compile_time_eval():
                c = sine(jnp.ones(4))  # concrete inside the trace: its miss tuned eagerly, a hit here
            return x + c

        r = jax.jit(prog)(jnp.zeros(4))
    np.testing.assert_allclose(np.asarray(exp.call(jnp.ones((3, 4)))), np.asarray(jnp.sin(jnp.ones((3, 4)))))
    np.testing.assert_allclose(np.asarray(r), np.asarray(jnp.sin(jnp.ones(4))), rtol=1e-6)
    assert bench.calls == 2 and bench.traced == 0 and sine.tuner.stats["tuned"] == 1


# ---- four CPU devices, and a second process ---------------------------------------------------------------
_PROGRAM = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + QUICK_CPU_XLA_FLAGS
import jax, jax.numpy as jnp, numpy as np
from jax import export, lax
from jax.sharding import NamedSharding, PartitionSpec as P
import tuner

calls = {"bench": 0}
def bench(call):
    jax.block_until_ready(call())
    calls["bench"] += 1
    return 1.0 / calls["bench"]

@tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[-1]}, bench=bench)
def sine(x, *, s):
    return jnp.sin(x) * s / s

@tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=bench)
def allreduce(x, *, s):
    return lax.psum(x * s, "d") / s

devs = jax.devices()
mesh = jax.make_mesh((4,), ("d",))
with jax.checking_leaks():
    (b,) = export.symbolic_shape("b")  # first: the stored winner of n=16, if any, untimed
    exported = export.export(jax.jit(sine))(jax.ShapeDtypeStruct((b, 16), jnp.float32))
    export_choice = dict(sine.tuner.last_choice)
    ws = jnp.stack([jnp.eye(8) * 0.5] * 3)
    stack = jax.jit(lambda h, ws: lax.scan(jax.checkpoint(lambda h, w: (sine(h @ w), None)), h, ws)[0])
    out = stack(jnp.ones((2, 8)), ws)
    with jax.default_device(devs[2]):
        placed = jax.jit(sine)(jnp.ones(16))
    xs = jax.device_put(jnp.arange(32.0), NamedSharding(mesh, P("d")))
    sharded = jax.jit(sine)(xs.reshape(4, 8))
    summed = jax.jit(jax.shard_map(allreduce, mesh=mesh, in_specs=P("d"), out_specs=P()))(xs)
    summed_pmap = jax.pmap(allreduce, axis_name="d")(jnp.arange(32.0).reshape(4, 8))
ref = jnp.ones((2, 8))
for _ in range(3):
    ref = jnp.sin(ref @ ws[0])
np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5)
np.testing.assert_allclose(np.asarray(sharded), np.asarray(jnp.sin(jnp.arange(32.0)).reshape(4, 8)), rtol=1e-6)
assert placed.devices() == {devs[2]}
want = jnp.arange(32.0).reshape(4, 8).sum(0)
np.testing.assert_allclose(np.asarray(summed), np.asarray(want))
np.testing.assert_allclose(np.asarray(summed_pmap[0]), np.asarray(want))
np.testing.assert_allclose(np.asarray(exported.call(jnp.ones((3, 16)))), np.asarray(jnp.sin(jnp.ones((3, 16)))), rtol=1e-6)
print(json.dumps({"bench": calls["bench"], "sine": sine.tuner.stats, "allreduce": allreduce.tuner.stats,
                  "export": export_choice, "placed": sine.tuner.last_choice}))
""".replace("QUICK_CPU_XLA_FLAGS", repr(quick_cpu_xla_flags()))  # what conftest sets in the tests' process


def test_four_cpu_devices_and_a_second_process_hits(tmp_path):
    run = cpu_jax_program(tmp_path, _PROGRAM)

    first = run()
    # sine: the symbolic export of n=16 is not timed; then n=8 (the scanned layer; the sharded (4, 8)
    # call hits it) and n=16 (under default_device) are tuned; the collective is chosen untimed
    assert "symbolic dimensions" in first["export"]["why"]
    assert first["bench"] == 4 and first["sine"]["tuned"] == 2
    assert first["allreduce"]["tuned"] == 0 and first["allreduce"]["offline_fallback"] == 1
    assert first["placed"]["key"]["key"] == {"n": 16} and first["placed"]["key"]["device"] == "cpu"
    second = run()
    # nothing timed: the export finds n=16's stored winner (untimed still), the traces n=8 and n=16
    assert second["bench"] == 0 and second["sine"]["tuned"] == 0 and second["sine"]["from_store"] == 3
    assert second["export"]["config"] == first["placed"]["config"]
    assert "exact entry in the store" in second["export"]["why"]
    assert "symbolic dimensions" in second["export"]["why"]


# ---- a launcher built inside the traced function ------------------------------------------------------------
def test_launcher_built_inside_the_trace_finds_the_eager_tuning():
    bench = Bench()

    def build(w):  # a launcher closing over a weight, made where it is used (a layer's __call__)
        @tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x: {"n": x.shape[0]}, bench=bench)
        def scaled(x, *, s):
            return x * w * s / s

        return scaled

    w = jnp.full(8, 2.0)
    eager = build(w)
    eager(jnp.ones(8))
    assert bench.calls == 2
    seen: list = []

    def step(x, w):
        launcher = build(w)  # its closure holds a tracer here, an array above: one kernel all the same
        out = launcher(x)
        seen.append(
            (launcher.tuner.source_hash, dict(launcher.tuner.last_choice), dict(launcher.tuner.stats))
        )
        return out

    with jax.checking_leaks():
        out = jax.jit(step)(jnp.ones(8), w)
    np.testing.assert_allclose(np.asarray(out), np.full(8, 2.0))
    [(source_hash, choice, stats)] = seen
    # the old code hashed the closure's tracer by its type, another kernel: chosen untimed, by prediction
    assert source_hash == eager.tuner.source_hash
    assert choice["config"] == eager.tuner.last_choice["config"] and stats["from_store"] == 1
    assert bench.calls == 2 and len(ConfigCache().entries()) == 1
