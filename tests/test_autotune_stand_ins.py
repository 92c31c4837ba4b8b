"""`tuner.autotune(stand_ins=...)`: a miss inside `jax.jit` is tuned on stand-ins of the traced arguments,
zeros for integer ones; where an integer argument sets the work (a grouped matmul's group sizes), the
user gives the values, by argument name or as a function of the call's abstract arguments. Each form is
checked against the traced argument (names, pytree structure, shapes, dtypes, weak types) with an error
naming what differs. New in this branch: every test here fails on the old code, where `autotune` had no
`stand_ins` parameter (TypeError)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import tuner  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402
from tuner.runtime._tuning import AllConfigsFailedError  # noqa: E402

CONFIGS = [{"rows": 2}, {"rows": 4}]


def _once(call):
    jax.block_until_ready(call())
    return 1e-3


def _key(x, group_sizes):
    return {"T": x.shape[0], "E": group_sizes.shape[0]}


def grouped(stand_ins, seen, **kw):
    """A grouped row sum (megablox's gmm reduced to its grouping) whose concrete group sizes are
    recorded: zeros would sum no row at all."""

    @tuner.autotune(configs=CONFIGS, key=_key, bench=_once, stand_ins=stand_ins, **kw)
    def group_sum(x, group_sizes, *, rows):
        if not isinstance(group_sizes, jax.core.Tracer):
            seen.append([int(v) for v in np.asarray(group_sizes)])
        ids = jnp.repeat(jnp.arange(group_sizes.shape[0]), group_sizes, total_repeat_length=x.shape[0])
        return jax.ops.segment_sum(x, ids, num_segments=group_sizes.shape[0])

    return group_sum


def _balanced(x, group_sizes):  # gets jax.ShapeDtypeStructs for the traced arguments
    assert isinstance(x, jax.ShapeDtypeStruct) and isinstance(group_sizes, jax.ShapeDtypeStruct)
    T, E = x.shape[0], group_sizes.shape[0]
    return {"group_sizes": jnp.full((E,), T // E, group_sizes.dtype)}


X = jnp.arange(24.0).reshape(8, 3)
GS = jnp.array([5, 0, 3], jnp.int32)
WANT = np.stack([np.asarray(X[:5]).sum(0), np.zeros(3), np.asarray(X[5:]).sum(0)])


@pytest.mark.parametrize(
    "form",
    ["function", "by_name_function", "by_name_array", "by_name_list"],
)
def test_a_traced_miss_is_timed_on_the_users_stand_ins_and_stored(form):
    stand_ins = {
        "function": _balanced,
        "by_name_function": {"group_sizes": lambda s: jnp.array([3, 3, 2], s.dtype)},
        "by_name_array": {"group_sizes": jnp.array([3, 3, 2], jnp.int32)},
        "by_name_list": {"group_sizes": [3, 3, 2]},
    }[form]
    want_seen = [2, 2, 2] if form == "function" else [3, 3, 2]
    seen: list = []
    f = grouped(stand_ins, seen)
    out = jax.jit(f)(X, GS)
    np.testing.assert_allclose(np.asarray(out), WANT)
    assert seen and all(s == want_seen for s in seen)  # never the zeros
    assert f.tuner.stats["tuned"] == 1
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict == {"T": 8, "E": 3}
    n = len(seen)
    jax.jit(lambda x, g: f(x, g) * 2)(X, GS)  # a new trace of the key: a hit, nothing timed
    f(X, GS)  # eager, with the real sizes: the same stored key
    assert f.tuner.stats["tuned"] == 1 and len(seen) == n + 1 and seen[-1] == [5, 0, 3]


def test_only_traced_arguments_are_replaced():
    seen: list = []
    f = grouped({"group_sizes": [3, 3, 2]}, seen)
    jax.jit(lambda x: f(x, GS))(X)  # the group sizes are a concrete constant: their own values
    assert seen and all(s == [5, 0, 3] for s in seen)


class Groups(NamedTuple):
    sizes: jax.Array
    scale: jax.Array


def test_a_pytree_argument_keeps_its_structure_and_its_concrete_leaves():
    seen: list = []

    @tuner.autotune(
        configs=CONFIGS,
        key=lambda x, g: {"E": g.sizes.shape[0]},
        bench=_once,
        storage=False,
        stand_ins={"g": lambda s: Groups(jnp.array([4, 4], s.sizes.dtype), jnp.ones((), s.scale.dtype))},
    )
    def f(x, g, *, rows):
        if not isinstance(g.sizes, jax.core.Tracer):
            seen.append((np.asarray(g.sizes).tolist(), float(g.scale)))
        ids = jnp.repeat(jnp.arange(2), g.sizes, total_repeat_length=x.shape[0])
        return jax.ops.segment_sum(x, ids, num_segments=2) * g.scale

    g = Groups(jnp.array([6, 2], jnp.int32), jnp.asarray(2.0))
    jax.jit(lambda x, s: f(x, Groups(s, g.scale)))(X, g.sizes)  # scale concrete, sizes traced
    assert seen and all(s == ([4, 4], 2.0) for s in seen)  # the caller's own scale kept


def test_a_python_number_traced_by_jit_takes_a_number():
    seen: list = []

    @tuner.autotune(configs=CONFIGS, key=[], bench=_once, storage=False, stand_ins={"alpha": 3.0})
    def scaled(x, alpha, *, rows):
        if not isinstance(alpha, jax.core.Tracer):
            seen.append(float(alpha))
        return x * alpha

    xb = X.astype(jnp.bfloat16)
    out = jax.jit(scaled)(xb, 0.5)
    assert out.dtype == jnp.bfloat16 and seen and set(seen) == {3.0}
    scaled(xb, 0.5)  # eager: the number's key (no dtype), the one the traced miss stored
    assert scaled.tuner.stats["tuned"] == 1
    bad = tuner.autotune(
        configs=CONFIGS, key=[], bench=_once, storage=False, stand_ins={"alpha": jnp.ones(())}
    )(scaled.__wrapped__)
    with pytest.raises(ValueError, match=r"argument 'alpha' a float32 array.*Python number"):
        jax.jit(bad)(xb, 0.5)


@pytest.mark.parametrize(
    ("stand_ins", "match"),
    [
        ({"group_sizes": jnp.ones((4,), jnp.int32)}, r"argument 'group_sizes' shape \(4,\) dtype int32, the traced argument has shape \(3,\) dtype int32"),
        ({"group_sizes": jnp.ones((3,), jnp.float32)}, r"argument 'group_sizes' shape \(3,\) dtype float32, the traced argument has shape \(3,\) dtype int32"),
        ({"group_sizes": lambda s: {"a": s}}, r"argument 'group_sizes' the structure"),
        # a leaf that is no array: named (before: jax's TypeError, naming neither argument nor leaf)
        ({"group_sizes": "5,0,3"}, r"argument 'group_sizes' a str \('5,0,3'\), not an array"),
        (lambda x, group_sizes: {"sizes": 1}, r"the stand_ins function gives \['sizes'\], which are not parameters"),
    ],
)  # fmt: skip
def test_a_bad_stand_in_is_a_clear_error_of_the_traced_call(stand_ins, match):
    f = grouped(stand_ins, [], storage=False)
    with pytest.raises(ValueError, match=match):
        jax.jit(f)(X, GS)
    assert f.tuner.stats["tuned"] == 0


def test_a_stand_ins_function_returning_no_dict_is_a_type_error():
    f = grouped(lambda x, group_sizes: [1, 2, 3], [], storage=False)
    with pytest.raises(TypeError, match="the stand_ins function returned list, not a dict"):
        jax.jit(f)(X, GS)


@pytest.mark.parametrize(
    ("stand_ins", "error", "match"),
    [
        ({"sizes": [1]}, ValueError, r"stand_ins names \['sizes'\], which are not parameters of .*group_sum"),
        ({"rows": 2}, ValueError, r"stand_ins names \['rows'\], parameters of the search space"),
        ([("group_sizes", [1])], TypeError, "stand_ins must be a dict"),
        (lambda a, b, c: {}, TypeError, "the stand_ins function of .* cannot take the call's arguments"),
    ],
)
def test_a_bad_stand_ins_is_refused_when_decorating(stand_ins, error, match):
    with pytest.raises(error, match=match):
        grouped(stand_ins, [], storage=False)


def test_the_launchers_own_value_check_runs_on_the_users_stand_ins():
    # megablox-style: a launcher that validates its group sizes where they are concrete. The stand-ins
    # are concrete, so group sizes that do not sum to the rows fail every config, loudly, rather than
    # timing a partial write under the key of real traffic.
    @tuner.autotune(
        configs=CONFIGS, key=_key, bench=_once, storage=False, stand_ins={"group_sizes": [1, 1, 1]}
    )
    def checked(x, group_sizes, *, rows):
        if not isinstance(group_sizes, jax.core.Tracer) and int(group_sizes.sum()) != x.shape[0]:
            raise ValueError(f"group sizes sum to {int(group_sizes.sum())}, not {x.shape[0]} rows")
        return x

    with pytest.raises(AllConfigsFailedError, match="group sizes sum to 3, not 8 rows"):
        jax.jit(checked)(X, GS)


@pytest.mark.parametrize(
    "drop_in",
    [{"configs": [{"tile": (2, 2)}, {"tile": (4, 4)}]}, {"configs": CONFIGS, "warmup": 1, "rep": 1}],
    ids=["tuple_values", "triton_keywords"],
)
@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")
def test_the_triton_drop_in_on_a_jax_launcher_uses_them_too(drop_in):
    # Configs holding tuples, or triton.autotune's keywords, build the drop-in, whose traced miss is its
    # own: it timed on zeros, the stand_ins unused (seen on this branch before the fix).
    seen: list = []

    @tuner.autotune(key=[], bench=_once, storage=False, stand_ins={"group_sizes": [2, 6]}, **drop_in)
    def f(x, group_sizes, **config):
        if not isinstance(group_sizes, jax.core.Tracer):
            seen.append(np.asarray(group_sizes).tolist())
        return x * group_sizes.sum()

    jax.jit(f)(X, jnp.array([1, 1], jnp.int32))
    assert seen and all(s == [2, 6] for s in seen), seen
