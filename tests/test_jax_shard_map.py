"""A tuned JAX/Pallas function called inside `jax.shard_map` (the way sharded model code calls a kernel: the
body gets each device's block), on four CPU devices in a subprocess (the device count is fixed when jax
starts). Inside the body the arguments are tracers of the per-shard shapes: the miss is timed on concrete
stand-ins of those shapes (never of the global arrays), the stored key is the per-shard shape, a later
trace of the same key (another jit, an eager `shard_map`) hits without timing, and a second process hits
the store. Covered: a 2-D mesh with a sharded and a replicated argument under the default `check_vma`, a
Pallas kernel (`check_vma=False`, as `pallas_call` asks for in interpret mode), a partially manual
`shard_map` (`axis_names`), the deprecated `jax.experimental.shard_map`, and `stand_ins=` (its function
gets the per-shard `ShapeDtypeStruct`s)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from tests._env import cpu_jax_program  # noqa: E402

_PROGRAM = """
import json, os, warnings
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import tuner

timed = {"affine": [], "pallas": [], "group": []}  # (config, shapes) of each concrete run
traced = {"affine": 0, "pallas": 0, "group": 0}
abstract = []  # what the stand_ins function was given


def is_tracer(x):
    return isinstance(x, jax.core.Tracer)


def bench(call):
    jax.block_until_ready(call())
    return 1e-3


@tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x, w: {"rows": x.shape[0], "cols": x.shape[1]},
                bench=lambda call: (jax.block_until_ready(call()), {8: 2e-3, 16: 1e-3}[timed["affine"][-1][0]])[1])
def affine(x, w, *, block):
    if is_tracer(x):
        traced["affine"] += 1
    else:
        timed["affine"].append((block, x.shape, w.shape))
    return (x.reshape(-1, block, x.shape[1]) * w + 1.0).reshape(x.shape)


def body(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * w_ref[...] + 1.0


@tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x, w: {"rows": x.shape[0]},
                bench=lambda call: (jax.block_until_ready(call()), {8: 1e-3, 16: 2e-3}[timed["pallas"][-1][0]])[1])
def pallas_affine(x, w, *, block):
    if is_tracer(x):
        traced["pallas"] += 1
    else:
        timed["pallas"].append((block, x.shape, w.shape))
    spec = pl.BlockSpec((block, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block,),
                          in_specs=[spec, pl.BlockSpec(w.shape, lambda i: (0, 0))], out_specs=spec,
                          interpret=True)(x, w)


def balanced(x, group_sizes):
    abstract.append((type(x).__name__, x.shape, group_sizes.shape))
    return {"group_sizes": jnp.full(group_sizes.shape, x.shape[0] // group_sizes.shape[0], group_sizes.dtype)}


@tuner.autotune(configs=[{"s": False}, {"s": True}], key=lambda x, group_sizes: {"T": x.shape[0]},
                stand_ins=balanced, bench=bench)
def group_sum(x, group_sizes, *, s):
    if is_tracer(x):
        traced["group"] += 1
    else:
        timed["group"].append((s, x.shape, group_sizes.tolist()))
    ids = jnp.repeat(jnp.arange(group_sizes.shape[0]), group_sizes, total_repeat_length=x.shape[0])
    return jax.ops.segment_sum(x, ids, num_segments=group_sizes.shape[0], indices_are_sorted=s)


xs = jnp.arange(128 * 8, dtype=jnp.float32).reshape(128, 8)
w = jnp.full((8,), 2.0)
mesh = jax.make_mesh((2, 2), ("a", "b"))
xsh = jax.device_put(xs, NamedSharding(mesh, P("a", "b")))
wsh = jax.device_put(w, NamedSharding(mesh, P("b")))
kw = dict(mesh=mesh, in_specs=(P("a", "b"), P("b")), out_specs=P("a", "b"))  # blocks of (64, 4) and (4,)
with jax.checking_leaks():
    out = jax.jit(jax.shard_map(affine, **kw))(xsh, wsh)
    np.testing.assert_allclose(np.asarray(out), np.asarray(xs * 2 + 1))
    again = jax.jit(lambda x, w: jax.shard_map(affine, **kw)(x, w) - 1.0)(xsh, wsh)  # another trace: a hit
    np.testing.assert_allclose(np.asarray(again), np.asarray(xs * 2))
    eager = jax.shard_map(affine, **kw)(xsh, wsh)  # not under jit: shard_map's own tracers
    np.testing.assert_allclose(np.asarray(eager), np.asarray(xs * 2 + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.shard_map import shard_map as old_shard_map
    old = jax.jit(old_shard_map(affine, **kw))(xsh, wsh)
    np.testing.assert_allclose(np.asarray(old), np.asarray(xs * 2 + 1))

    xrow = jax.device_put(xs, NamedSharding(mesh, P("a")))
    w2 = jax.device_put(jnp.full((1, 8), 2.0), NamedSharding(mesh, P()))
    pk = jax.jit(jax.shard_map(pallas_affine, mesh=mesh, in_specs=(P("a"), P()), out_specs=P("a"), check_vma=False))
    np.testing.assert_allclose(np.asarray(pk(xrow, w2)), np.asarray(xs * 2 + 1))

    auto = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(auto):  # manual over "a" only: blocks of (64, 8), the key the 2-D mesh's pallas call has
        xauto = jax.device_put(xs, NamedSharding(auto, P("a")))
        partial = jax.jit(jax.shard_map(lambda x: pallas_affine(x, jnp.full((1, 8), 2.0)), in_specs=P("a"),
                                        out_specs=P("a"), axis_names={"a"}, check_vma=False))
        np.testing.assert_allclose(np.asarray(partial(xauto)), np.asarray(xs * 2 + 1))

    x1 = jax.device_put(jnp.ones((32, 2)), NamedSharding(mesh, P(("a", "b"))))
    gs = jax.device_put(jnp.array([[5, 3]] * 4, jnp.int32), NamedSharding(mesh, P(("a", "b"))))
    grouped = jax.jit(jax.shard_map(lambda x, g: group_sum(x, g[0])[None], mesh=mesh,
                                    in_specs=(P(("a", "b")), P(("a", "b"))), out_specs=P(("a", "b"))))
    np.testing.assert_allclose(np.asarray(grouped(x1, gs)), np.tile([[5.0, 5.0], [3.0, 3.0]], (4, 1, 1)))

print(json.dumps({
    "timed": timed, "traced": traced, "abstract": abstract,
    "stats": {"affine": affine.tuner.stats, "pallas": pallas_affine.tuner.stats, "group": group_sum.tuner.stats},
    "keys": {"affine": affine.tuner.last_choice["key"]["key"], "pallas": pallas_affine.tuner.last_choice["key"]["key"],
             "group": group_sum.tuner.last_choice["key"]["key"]},
    "configs": {"affine": affine.tuner.last_choice["config"], "pallas": pallas_affine.tuner.last_choice["config"]},
}))
"""


def test_a_tuned_function_inside_shard_map_is_timed_and_keyed_on_its_shards(tmp_path):
    run = cpu_jax_program(tmp_path, _PROGRAM)

    first = run()
    # each config timed once, on concrete arrays of the shard's shapes (not the global (128, 8) and (8,))
    assert first["timed"]["affine"] == [[8, [64, 4], [4]], [16, [64, 4], [4]]]
    assert first["timed"]["pallas"] == [[8, [64, 8], [1, 8]], [16, [64, 8], [1, 8]]]
    assert first["keys"] == {"affine": {"rows": 64, "cols": 4}, "pallas": {"rows": 64}, "group": {"T": 8}}
    assert first["configs"] == {"affine": {"block": 16}, "pallas": {"block": 8}}
    # one tuning per key: the later traces (another jit, eager shard_map, the old shard_map) hit
    assert first["stats"]["affine"]["tuned"] == 1 and first["stats"]["pallas"]["tuned"] == 1
    assert first["traced"]["affine"] == 4 and first["traced"]["pallas"] == 2
    # stand_ins: the function gets the shard's ShapeDtypeStructs, and its values are what is timed
    assert first["abstract"] == [["ShapeDtypeStruct", [8, 2], [2]]]
    assert first["timed"]["group"] == [[False, [8, 2], [4, 4]], [True, [8, 2], [4, 4]]]

    second = run()  # a new process: every key from the store, nothing timed
    assert second["timed"] == {"affine": [], "pallas": [], "group": []}
    assert second["keys"] == first["keys"] and second["configs"] == first["configs"]
    for stats in second["stats"].values():
        assert stats["tuned"] == 0 and stats["from_store"] == 1, second["stats"]
