"""JAX usage patterns that people who did not write tuner bring to its drop-in, on the CPU (Pallas in
interpret mode), each in the style real projects write them (jax's Pallas ops, MaxText, Flax, Levanter):
sharding through a context mesh (`jax.set_mesh` with auto and explicit axes, the deprecated `with mesh:`),
bare `PartitionSpec`s inside the tuned function, `jit` with `in_shardings` and its AOT
`lower(...).compile()` and `jax.export` on four CPU devices (a subprocess: the device count is fixed when
jax starts); a static dtype argument keyed on (`out_dtype=`, bfloat16 inputs upcast in the kernel), and
an enum static argument; a grid of `pl.cdiv` blocks over a size the tuned block does not divide (masked
tail); a flax.struct-style dataclass pytree with a static number and a None leaf, a NamedTuple of arguments; `functools.partial` and keyword calls.

Each checks the result against the untuned function and that the tuned path is used: one tuning per key
(each config run once, never on tracers), a chosen config, and the later calls hitting."""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pl = pytest.importorskip("jax.experimental.pallas")

import numpy as np  # noqa: E402

import tuner  # noqa: E402
from tests._env import cpu_jax_program  # noqa: E402
from tests.test_thirdparty_pallas import OnceBench  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402


def Bench() -> OnceBench:  # noqa: N802 - used as the class it returns
    """Runs each config once; each later config is reported faster, so the last one timed wins."""
    bench = OnceBench([None], lambda _: 1.0 / bench.calls)
    return bench


# ---- a context mesh (jax.set_mesh, `with mesh:`), shardings, AOT and export on four CPU devices --------
_MESH_PROGRAM = """
import json, os, warnings
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax import export
from jax.experimental import pallas as pl
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import tuner

calls = {"bench": 0}
def bench(call):
    out = call()
    assert not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out))
    jax.block_until_ready(out)
    calls["bench"] += 1
    return 1.0 / calls["bench"]

def body(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...] @ w_ref[...])

# MaxText/Levanter style: the layer pins its activations with a bare PartitionSpec, which needs the
# caller's context mesh (jax.set_mesh, or the deprecated `with mesh:`)
@tuner.autotune(configs=[{"rows": 8}, {"rows": 16}], key=lambda x, w: {"M": x.shape[0], "K": x.shape[1]},
                bench=bench)
def layer(x, w, *, rows):
    y = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype), grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)), pl.BlockSpec(w.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, w.shape[1]), lambda i: (i, 0)), interpret=True,
    )(x, w)
    return jax.lax.with_sharding_constraint(y, P("d"))

# explicit sharding (jax.set_mesh of an Explicit mesh): the sharding is part of the type, an einsum
# names its output's; the launcher records the sharding of what it is given
specs = []
@tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x, w: {"M": x.shape[0]}, bench=bench)
def proj(x, w, *, s):
    specs.append((isinstance(x, jax.core.Tracer), str(jax.typeof(x).sharding.spec)))
    return jnp.einsum("md,dn->mn", x * s, w, out_sharding=P("d")) / s

x = jax.random.normal(jax.random.PRNGKey(0), (64, 8))
w = jax.random.normal(jax.random.PRNGKey(1), (8, 8)) / 4
want = np.asarray(jnp.tanh(x @ w))
out = {}
with jax.checking_leaks():
    with jax.set_mesh(jax.make_mesh((4,), ("d",), axis_types=(AxisType.Auto,))):
        r = jax.jit(layer)(x, w)  # the first call of all: a miss inside jit
        np.testing.assert_allclose(np.asarray(r), want, rtol=1e-5, atol=1e-5)
        out["auto"] = [str(r.sharding.spec), dict(layer.tuner.stats), layer.tuner.last_choice["config"]]
        np.testing.assert_allclose(np.asarray(jax.jit(lambda x, w: layer(x, w) * 1)(x, w)), want, rtol=1e-5, atol=1e-5)
        out["auto_again"] = dict(layer.tuner.stats)
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Auto,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:` is deprecated, still used
        with mesh:
            r = jax.jit(layer)(x[:32], w)
    np.testing.assert_allclose(np.asarray(r), want[:32], rtol=1e-5, atol=1e-5)
    out["legacy"] = dict(layer.tuner.stats)
    # jit with in_shardings, its AOT lowering of sharded ShapeDtypeStructs, and jax.export: no context mesh
    s = NamedSharding(mesh, P("d"))
    step = jax.jit(lambda x, w: layer(x, w) + 0, in_shardings=(s, None), out_shardings=s)
    with jax.set_mesh(mesh):
        compiled = step.lower(jax.ShapeDtypeStruct((128, 8), jnp.float32, sharding=s),
                              jax.ShapeDtypeStruct(w.shape, w.dtype)).compile()  # a miss: M=128
        x2 = jax.random.normal(jax.random.PRNGKey(2), (128, 8))
        r = compiled(jax.device_put(x2, s), w)
        exported = export.export(step)(jax.ShapeDtypeStruct((128, 8), jnp.float32, sharding=s),
                                       jax.ShapeDtypeStruct(w.shape, w.dtype))  # a hit
        re = exported.call(jax.device_put(x2, s), w)
    for got in (r, re):
        np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.tanh(x2 @ w)), rtol=1e-5, atol=1e-5)
    out["aot"] = [str(r.sharding.spec), dict(layer.tuner.stats)]
    with jax.set_mesh(jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))):
        xe = jax.device_put(x, P("d"))
        r = jax.jit(proj)(xe, w)
        np.testing.assert_allclose(np.asarray(r), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
        r2 = jax.jit(lambda x, w: proj(x, w) * 1)(xe, w)
        np.testing.assert_allclose(np.asarray(r2), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
    out["explicit"] = [str(r.sharding.spec), dict(proj.tuner.stats), specs]
out["bench"] = calls["bench"]
out["entries"] = sorted(e.key.fields_dict["M"] for e in tuner.ConfigCache().entries())
print(json.dumps(out))
"""


def test_context_mesh_shardings_aot_and_export_on_four_cpu_devices(tmp_path):
    # The old code ran the helper thread that tunes a miss inside jit without the caller's context mesh:
    # `with_sharding_constraint(y, P("d"))` and `einsum(..., out_sharding=P("d"))` raised there for every
    # config ("requires a non-empty mesh in context"), and the call failed with AllConfigsFailedError,
    # although it runs without tuner. Under explicit axes the stand-ins now carry the tracer's sharding.
    out = cpu_jax_program(tmp_path, _MESH_PROGRAM)()
    spec, stats, config = out["auto"]
    assert spec == "P('d',)" and stats["tuned"] == 1 and config == {"rows": 16}
    assert out["auto_again"]["tuned"] == 1  # another trace of the key: a hit
    assert out["legacy"]["tuned"] == 2  # M=32 under `with mesh:`
    spec, stats = out["aot"]
    assert spec == "P('d',)" and stats["tuned"] == 3  # M=128 tuned once, by the AOT lowering
    spec, stats, specs = out["explicit"]
    assert spec == "P('d', None)" and stats["tuned"] == 1
    # both configs timed on stand-ins placed as the tracer is, then the traced call; the second trace hits
    assert specs == [[False, "P('d', None)"]] * 2 + [[True, "P('d', None)"]] * 2
    assert out["bench"] == 8 and out["entries"] == [32, 64, 64, 128]


# ---- a static dtype argument keyed on, bfloat16 inputs upcast in the kernel; an enum static argument ---
def _upcast_kernel(x_ref, y_ref, o_ref):
    acc = x_ref[...].astype(jnp.float32) * y_ref[...].astype(jnp.float32)
    o_ref[...] = acc.astype(o_ref.dtype)


def _mul(x, y, out_dtype, block):
    spec = pl.BlockSpec((block,), lambda i: (i,))
    return pl.pallas_call(
        _upcast_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, out_dtype),
        grid=(x.shape[0] // block,),
        in_specs=[spec, spec],
        out_specs=spec,
        interpret=True,
    )(x, y)


def test_static_dtype_argument_as_a_key_with_bfloat16_inputs_upcast():
    # jax's ops take the output dtype as a static argument (`preferred_element_type=`, `out_dtype=`); the
    # old code refused it as a key value ("a key value must be an int, float, str, bool or None")
    bench = Bench()

    @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=["out_dtype"], bench=bench)
    def mul(x, y, out_dtype=jnp.float32, *, block):
        return _mul(x, y, out_dtype, block)

    x = jnp.linspace(-2, 2, 64, dtype=jnp.bfloat16)
    y = jnp.linspace(1, 3, 64, dtype=jnp.bfloat16)
    want = np.asarray(x, np.float32) * np.asarray(y, np.float32)
    step = jax.jit(mul, static_argnames="out_dtype")
    with jax.checking_leaks():
        r = step(x, y, out_dtype=jnp.float32)
    assert r.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-6)
    assert bench.calls == 2 and bench.traced == 0 and mul.tuner.last_choice["config"] == {"block": 16}
    assert mul.tuner.last_choice["key"]["key"] == {"out_dtype": "float32"}
    r_default = mul(x, y)  # eagerly, the default jnp.float32: the same entry
    np.testing.assert_allclose(np.asarray(r_default), want, rtol=1e-6)
    mul(x, y, out_dtype=np.dtype("float32"))  # another spelling of the dtype: the same entry
    assert bench.calls == 2 and mul.tuner.stats["tuned"] == 1
    rb = step(x, y, out_dtype=jnp.bfloat16)  # another dtype: its own key
    assert rb.dtype == jnp.bfloat16 and bench.calls == 4 and mul.tuner.stats["tuned"] == 2
    np.testing.assert_allclose(np.asarray(rb, np.float32), want, rtol=1e-2)
    # a new process, as it were: the stored entries are found under the dtypes' names
    mul.cache_clear()
    step(x, y, out_dtype=jnp.dtype(jnp.bfloat16))
    assert bench.calls == 4 and mul.tuner.stats["from_store"] == 1
    assert sorted(e.key.fields_dict["out_dtype"] for e in ConfigCache().entries()) == ["bfloat16", "float32"]


def test_an_entry_stored_when_dtype_arguments_counted_as_arrays_still_hits():
    # before dtype arguments were told from arrays, `out_dtype=jnp.bfloat16` (jax's scalar type, which has a
    # `.dtype`) was counted among the arrays' dtypes: the key's dtypes were ("float32", "bfloat16"). An
    # entry stored so (a shipped config file, a store) is read under that older form and hits
    bench = Bench()

    @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=["n"], bench=bench)
    def double(x, n, out_dtype=jnp.float32, *, block):
        return (x * 2).astype(out_dtype)

    x = jnp.ones(16, jnp.float32)
    double(x, 16, out_dtype=jnp.bfloat16)
    assert bench.calls == 2
    [entry] = ConfigCache().entries()
    assert entry.key.dtypes == ("float32",)
    cache = ConfigCache()
    cache.clear()
    old = dataclasses.replace(entry.key, dtypes=("float32", "bfloat16"))
    cache.put(dataclasses.replace(entry, key=old, config={"block": 8}))
    double.cache_clear()
    r = double(x, 16, out_dtype=jnp.bfloat16)
    assert r.dtype == jnp.bfloat16 and bench.calls == 2, "retuned: the older entry was not read"
    assert double.tuner.last_choice["config"] == {"block": 8}


class Mask(enum.Enum):
    CAUSAL = "causal"
    FULL = "full"


def test_enum_static_argument_as_a_key_says_how_to_key_on_it():
    bench = Bench()

    def masked(x, mask=Mask.FULL, *, s):
        return (jnp.tril(x) if mask is Mask.CAUSAL else x) * s / s

    by_name = tuner.autotune(configs=[{"s": 1.0}, {"s": 2.0}], key=["mask"], bench=bench)(masked)
    x = jnp.ones((4, 4))
    with pytest.raises(TypeError, match=r"key function .* that returns its name: \{'mask': mask.name\}"):
        jax.jit(by_name, static_argnames="mask")(x, mask=Mask.CAUSAL)
    # what the error says to do
    by_fn = tuner.autotune(
        configs=[{"s": 1.0}, {"s": 2.0}], key=lambda x, mask=Mask.FULL: {"mask": mask.name}, bench=bench
    )(masked)
    r = jax.jit(by_fn, static_argnames="mask")(x, mask=Mask.CAUSAL)
    np.testing.assert_array_equal(np.asarray(r), np.tril(np.ones((4, 4))))
    jax.jit(by_fn, static_argnames="mask")(x * 2, mask=Mask.CAUSAL)
    assert bench.calls == 2 and by_fn.tuner.last_choice["key"]["key"] == {"mask": "CAUSAL"}


# ---- a grid of pl.cdiv blocks over a size the tuned block does not divide -------------------------------
def _masked_scale_kernel(x_ref, o_ref, *, n, block):
    i = pl.program_id(0)
    idx = i * block + jnp.arange(block)
    o_ref[...] = jnp.where(idx < n, x_ref[...] * 3.0 + 1.0, 0.0)


def test_cdiv_grid_over_a_size_the_tuned_block_does_not_divide():
    seen: list = []
    times = {16: 3e-3, 32: 1e-3, 64: 2e-3}
    bench = OnceBench(seen, lambda b: times[b])

    @tuner.autotune(configs=[{"block": b} for b in times], key=lambda x: {"n": x.shape[0]}, bench=bench)
    def scale(x, *, block):
        seen.append(block)
        n = x.shape[0]
        spec = pl.BlockSpec((block,), lambda i: (i,))
        return pl.pallas_call(
            functools.partial(_masked_scale_kernel, n=n, block=block),
            out_shape=jax.ShapeDtypeStruct((n,), x.dtype),
            grid=(pl.cdiv(n, block),),
            in_specs=[spec],
            out_specs=spec,
            interpret=True,
        )(x)

    def reference(x):  # the untuned function
        return x * 3.0 + 1.0

    x = jnp.arange(50, dtype=jnp.float32)  # 50 = 3*16+2 = 32+18: every block leaves a partial tail
    for b in times:  # every config is right on its own (the masked tail)
        np.testing.assert_allclose(np.asarray(scale.__wrapped__(x, block=b)), np.asarray(reference(x)))
    seen.clear()
    with jax.checking_leaks():
        r = jax.jit(scale)(x)
    np.testing.assert_allclose(np.asarray(r), np.asarray(reference(x)))
    assert (
        sorted(seen[:3]) == [16, 32, 64]
        and seen[3:] == [32]
        and bench.traced == 0
        and scale.tuner.last_choice["config"] == {"block": 32}
    )
    np.testing.assert_allclose(np.asarray(scale(x + 1)), np.asarray(reference(x + 1)))  # eagerly: a hit
    assert bench.calls == 3 and seen[-1] == 32 and scale.tuner.stats["tuned"] == 1
    scale(jnp.arange(7, dtype=jnp.float32))  # smaller than every block: one masked block, its own key
    assert scale.tuner.stats["tuned"] == 2


# ---- dataclass and NamedTuple pytrees with a static number and a None leaf; partial and keyword calls -------------------------------
@functools.partial(jax.tree_util.register_dataclass, data_fields=["scale", "bias"], meta_fields=["eps"])
@dataclasses.dataclass(frozen=True)
class NormCfg:
    """A flax.struct-style config: arrays as leaves (`bias` may be None, an empty subtree), and `eps` a
    static Python number (part of the tree's structure: the kernel closes over it)."""

    scale: jax.Array
    eps: float = 1e-6
    bias: jax.Array | None = None


class Shapes(NamedTuple):
    x: jax.Array
    cfg: NormCfg


def _rms_kernel(x_ref, s_ref, o_ref, *, eps):
    x = x_ref[...]
    o_ref[...] = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * s_ref[...]


def test_dataclass_pytree_with_a_static_number_and_a_none_leaf_partial_and_keywords():
    bench = Bench()

    @tuner.autotune(
        configs=[{"rows": 2}, {"rows": 4}], key=lambda x, cfg: {"R": x.shape[0], "D": x.shape[1]}, bench=bench
    )
    def rms(x, cfg, *, rows):
        out = pl.pallas_call(
            functools.partial(_rms_kernel, eps=cfg.eps),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // rows,),
            in_specs=[
                pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                pl.BlockSpec((1, x.shape[1]), lambda i: (0, 0)),
            ],
            out_specs=pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
            interpret=True,
        )(x, cfg.scale[None, :])
        return {"y": out if cfg.bias is None else out + cfg.bias, "rows": x.shape[0]}

    def reference(x, cfg):
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.eps) * cfg.scale
        return y if cfg.bias is None else y + cfg.bias

    x = jax.random.normal(jax.random.PRNGKey(3), (8, 16))
    cfg = NormCfg(jnp.linspace(0.5, 1.5, 16))
    biased = dataclasses.replace(cfg, bias=jnp.ones(16))
    with jax.checking_leaks():
        r = jax.jit(rms)(x, cfg)  # bias None: an empty subtree
        r5 = jax.jit(lambda b: rms(*b))(Shapes(x, cfg))  # the arguments from a NamedTuple of them: a hit
        assert bench.calls == 2 and bench.traced == 0 and rms.tuner.last_choice["config"] == {"rows": 4}
        # a bias array: one more array in the key's dtypes, its own key (the work differs)
        r2 = jax.jit(lambda x, s: rms(x, NormCfg(s, 1e-6, jnp.ones(16))))(x, cfg.scale)
    for got, c in ((r, cfg), (r2, biased), (r5, cfg)):
        np.testing.assert_allclose(np.asarray(got["y"]), np.asarray(reference(x, c)), rtol=1e-5, atol=1e-6)
    assert r["rows"] == 8 and bench.calls == 4 and rms.tuner.stats["tuned"] == 2
    # partial of the tuned function and keyword calls in another order: the same key, hits
    bound = functools.partial(rms, cfg=cfg)
    r3 = jax.jit(bound)(x)
    r4 = rms(cfg=cfg, x=x)
    for got in (r3["y"], r4["y"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(reference(x, cfg)), rtol=1e-5, atol=1e-6)
    assert bench.calls == 4 and rms.tuner.stats["tuned"] == 2
    # the dataclass's arrays are in the key's dtypes (bfloat16 scale: its own key)
    jax.jit(rms)(x, dataclasses.replace(cfg, scale=cfg.scale.astype(jnp.bfloat16)))
    assert rms.tuner.stats["tuned"] == 3 and "bfloat16" in rms.tuner.last_choice["key"]["dtypes"]
