"""A `tuner.kernel` miss inside `jax.jit` is tuned on concrete stand-ins of the tracers. Where a kernel's work
depends on the values of an integer input, the generic stand-in (zeros) times a degenerate case: moe_gemm
with all group sizes 0 writes no row at all, and its "winner" was stored under the key of real traffic.
The registry's kernels supply stand-ins of such inputs (`tuner.kernels._inputs.stand_in_values`), a spec
of one's own supplies them as `extra["stand_ins"]`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from tuner.kernels import _moe_pallas, get_kernel  # noqa: E402

import tuner  # noqa: E402

MOE = {"T": 12, "K": 8, "N": 8, "E": 3, "dtype": "float32"}


def _bench(call):
    call()
    return 1e-3


@pytest.fixture
def seen_group_sizes(monkeypatch):
    """The concrete group sizes the Pallas moe_gemm launcher ran on (the traced call's are tracers)."""
    seen = []
    launch = _moe_pallas.moe_gemm

    def spy(x, w, group_sizes, **config):
        if not isinstance(group_sizes, jax.core.Tracer):
            seen.append([int(v) for v in np.asarray(group_sizes)])
        return launch(x, w, group_sizes, **config)

    monkeypatch.setattr(_moe_pallas, "moe_gemm", spy)
    return seen


def _jitted(f, problem, inputs):
    return jax.jit(lambda x, w, gs: f(problem, {"x": x, "w": w, "group_sizes": gs}))(
        inputs["x"], inputs["w"], inputs["group_sizes"]
    )


def test_a_traced_moe_miss_is_tuned_on_group_sizes_that_do_work(seen_group_sizes, tmp_path):
    # Before: the stand-in group sizes were zeros, every timed config wrote no row (NaN in interpret mode)
    spec = get_kernel("moe_gemm")
    inputs = spec.make_inputs({**MOE, "group_sizes": [5, 3, 4]}, "pallas", 0)
    url = f"sqlite:///{tmp_path}/s.db"
    f = tuner.kernel("moe_gemm", backend="pallas", budget=2, storage=url, bench=_bench)
    got = _jitted(f, MOE, inputs)
    assert seen_group_sizes, "the miss timed nothing on concrete stand-ins"
    for sizes in seen_group_sizes:
        assert sizes == [4, 4, 4]  # balanced, summing to T
    assert tuner.ConfigCache(url).count() == 1  # tuned and stored under the key
    rtol, atol = spec.tolerance(MOE["dtype"])
    np.testing.assert_allclose(np.asarray(got), spec.reference(MOE, inputs), rtol=rtol, atol=atol)


def test_a_traced_moe_miss_of_a_problem_with_group_sizes_is_tuned_on_those(seen_group_sizes):
    problem = {**MOE, "group_sizes": [0, 9, 3]}  # part of the key: what is timed under it
    inputs = get_kernel("moe_gemm").make_inputs(problem, "pallas", 0)
    f = tuner.kernel("moe_gemm", backend="pallas", budget=2, storage=False, bench=_bench)
    _jitted(f, problem, inputs)
    assert seen_group_sizes and all(s == [0, 9, 3] for s in seen_group_sizes)


@pytest.mark.parametrize(
    ("T", "E", "want"), [(12, 3, [4, 4, 4]), (10, 4, [3, 3, 2, 2]), (2, 4, [1, 1, 0, 0])]
)
def test_balanced_group_sizes_sum_to_T(T, E, want):
    from tuner.kernels._inputs import balanced_group_sizes

    assert balanced_group_sizes(T, E) == want


def test_int8_matmul_stand_in_weights_are_not_zeros(monkeypatch):
    # zeros are the generic stand-in of an integer array; an all-zero int8 weight is no quantized weight
    from tuner.kernels import _inputs

    spec = get_kernel("int8_matmul")
    problem = {"M": 8, "N": 8, "K": 8, "dtype": "float32"}
    like = spec.make_inputs(problem, "pallas", 0)
    stand = {n: jnp.zeros_like(v) for n, v in like.items()}
    got = _inputs.stand_in_values(spec, problem, "pallas", stand)
    w = np.asarray(got["w"])
    assert w.dtype == np.int8 and w.shape == like["w"].shape
    assert np.all(w != 0) and np.all(np.abs(w.astype(int)) <= 127)


def test_a_spec_of_ones_own_supplies_its_stand_ins(seen_group_sizes):
    # a spec that is not the registry's moe_gemm (another name) says which values matter in extra
    base = get_kernel("moe_gemm")
    asked = []

    def stand_ins(problem, backend, inputs):
        asked.append(sorted(inputs))
        return {"group_sizes": jnp.asarray([1, 10, 1], dtype=inputs["group_sizes"].dtype)}

    from tuner.kernels._registry import REGISTRY

    own = dataclasses.replace(base, name="moe_gemm_own", extra={**base.extra, "stand_ins": stand_ins})
    REGISTRY["moe_gemm_own"] = own
    try:
        inputs = base.make_inputs(MOE, "pallas", 0)
        f = tuner.kernel("moe_gemm_own", backend="pallas", budget=2, storage=False, bench=_bench)
        _jitted(f, MOE, inputs)
    finally:
        del REGISTRY["moe_gemm_own"]
    assert asked and asked[0] == ["group_sizes", "w", "x"]
    assert seen_group_sizes and all(s == [1, 10, 1] for s in seen_group_sizes)


def test_a_stand_in_of_another_shape_is_refused():
    base = get_kernel("moe_gemm")
    from tuner.kernels._registry import REGISTRY

    def stand_ins(problem, backend, inputs):
        return {"group_sizes": jnp.asarray([12], dtype=jnp.int32)}

    REGISTRY["moe_gemm_bad"] = dataclasses.replace(
        base, name="moe_gemm_bad", extra={**base.extra, "stand_ins": stand_ins}
    )
    try:
        inputs = base.make_inputs(MOE, "pallas", 0)
        f = tuner.kernel("moe_gemm_bad", backend="pallas", budget=2, storage=False, bench=_bench)
        with pytest.raises(ValueError, match=r"stand_ins.*'group_sizes'.*\(1,\).*\(3,\)"):
            _jitted(f, MOE, inputs)
    finally:
        del REGISTRY["moe_gemm_bad"]


@pytest.mark.parametrize(
    ("given", "error", "match"),
    [
        ({"group_sizes": {"a": np.array([4, 4, 4], np.int32)}}, ValueError, r"stand_ins give input 'group_sizes' the structure PyTreeDef\(\{'a': \*\}\), the traced input has PyTreeDef\(\*\)"),
        ({"group_sizes": "4,4,4"}, ValueError, r"stand_ins give input 'group_sizes' a str \('4,4,4'\), not an array"),
        ([("group_sizes", [4, 4, 4])], TypeError, r"kernel 'moe_gemm_checked': its extra\['stand_ins'\] returned list, not a dict"),
    ],
    ids=["pytree", "str", "pairs"],
)  # fmt: skip
def test_a_specs_stand_ins_are_checked_as_autotunes_are(seen_group_sizes, given, error, match):
    # `tuner.kernel` checked a spec's stand-ins by shape and dtype only: a pytree for an array input
    # raised jax's "entry not a 2- or 3- tuple", a str jax's TypeError, naming no input; a list of pairs
    # was taken as the dict it is not. Now the one check of `tuner.autotune(stand_ins=...)`.
    from tuner.kernels._registry import REGISTRY

    _own_moe("moe_gemm_checked", stand_ins=lambda p, b, i: given)
    try:
        inputs = get_kernel("moe_gemm").make_inputs(MOE, "pallas", 0)
        f = tuner.kernel("moe_gemm_checked", backend="pallas", budget=2, storage=False, bench=_bench)
        with pytest.raises(error, match=match):
            _jitted(f, MOE, inputs)
    finally:
        del REGISTRY["moe_gemm_checked"]
    assert seen_group_sizes == [] and f.tuner.stats["tuned"] == 0  # nothing timed


def _own_moe(name, **extra):
    """A spec of one's own made from moe_gemm (the same launchers), registered under `name`."""
    from tuner.kernels._registry import REGISTRY

    base = get_kernel("moe_gemm")
    REGISTRY[name] = dataclasses.replace(base, name=name, extra={**base.extra, **extra})
    return REGISTRY[name]


@pytest.mark.parametrize(
    ("sizes", "says"),
    [([-1, 12, 1], r"holds \[-1, 12, 1\], negative for expert 0"), ([1, 1, 1], r"holds \[1, 1, 1\], which sum to 3")],
)  # fmt: skip
def test_invalid_stand_in_group_sizes_of_a_spec_are_refused_at_the_traced_miss(seen_group_sizes, sizes, says):
    # Before, a spec's own stand-ins were never checked (the check skipped stand-ins, and specs other than
    # the registry's): every config was timed on rows never written or written twice, and stored
    from tuner.kernels._registry import REGISTRY

    _own_moe("moe_gemm_bad_sizes", stand_ins=lambda p, b, i: {"group_sizes": jnp.asarray(sizes, jnp.int32)})
    try:
        inputs = get_kernel("moe_gemm").make_inputs(MOE, "pallas", 0)
        f = tuner.kernel("moe_gemm_bad_sizes", backend="pallas", budget=2, storage=False, bench=_bench)
        with pytest.raises(ValueError, match=rf"input 'group_sizes' {says}: .*inside a jax trace.*stand_ins"):
            _jitted(f, MOE, inputs)
    finally:
        del REGISTRY["moe_gemm_bad_sizes"]
    assert seen_group_sizes == [] and f.tuner.stats["tuned"] == 0  # nothing timed


def test_a_spec_made_from_moe_gemm_gets_its_stand_ins_and_its_check(seen_group_sizes):
    # the same launchers need the same values: balanced stand-ins (before: zeros, no row written), and
    # the check of the group sizes on an eager miss (before: none)
    from tuner.kernels._registry import REGISTRY

    _own_moe("moe_gemm_same_run")
    try:
        inputs = get_kernel("moe_gemm").make_inputs(MOE, "pallas", 0)
        f = tuner.kernel("moe_gemm_same_run", backend="pallas", budget=1, storage=False, bench=_bench)
        _jitted(f, MOE, inputs)
        assert seen_group_sizes and all(s == [4, 4, 4] for s in seen_group_sizes)
        g = tuner.kernel("moe_gemm_same_run", backend="pallas", budget=2, storage=False, bench=_bench)
        with pytest.raises(ValueError, match=r"input 'group_sizes' holds \[5, 3, 5\], which sum to 13"):
            g(MOE, {**inputs, "group_sizes": jnp.asarray([5, 3, 5], jnp.int32)})
    finally:
        del REGISTRY["moe_gemm_same_run"]


def test_concrete_group_sizes_of_a_traced_call_are_checked(seen_group_sizes):
    # x and w traced, the group sizes a concrete constant of the jitted function: its miss is tuned on
    # them as they are, and they used to go unchecked there (timed, stored, and the call's rows wrong)
    inputs = get_kernel("moe_gemm").make_inputs(MOE, "pallas", 0)
    bad = jnp.asarray([5, 3, 5], jnp.int32)
    f = tuner.kernel("moe_gemm", backend="pallas", budget=2, storage=False, bench=_bench)
    with pytest.raises(ValueError, match=r"holds \[5, 3, 5\], which sum to 13.*the call's own"):
        jax.jit(lambda x, w: f(MOE, {"x": x, "w": w, "group_sizes": bad}))(inputs["x"], inputs["w"])
    assert seen_group_sizes == []


# ---- a spec of one's own, not made from a registered kernel: its own value check ---------------------
def _lengths_spec(**extra):
    """Row sums of x (B, L) over each row's first `lengths[b]` columns: lengths outside [0, L] read past
    the row (a Pallas kernel would read another row's values, or padding, without an error)."""
    from tuner.kernels._registry import KernelSpec
    from tuner.search_spaces import Categorical, SearchSpace

    def run(problem, backend, inputs, config):
        x, lengths = inputs["x"], inputs["lengths"]
        mask = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
        return jnp.where(mask, x, 0.0).sum(1)

    def make_inputs(problem, backend, seed):
        B, L = problem["B"], problem["L"]
        return {"x": jnp.ones((B, L), jnp.float32), "lengths": jnp.full((B,), L // 2, jnp.int32)}

    return KernelSpec(
        name="own_lengths",
        description="masked row sums",
        backends=("pallas",),
        dtypes=("float32",),
        default_problem={"B": 4, "L": 8, "dtype": "float32"},
        shape_fields=("B", "L"),
        space=lambda problem, device, backend: SearchSpace([Categorical("unroll", [1, 2])]),
        make_inputs=make_inputs,
        reference=lambda problem, inputs: np.asarray(run(problem, "pallas", inputs, {})),
        run=run,
        flops=lambda p: float(p["B"] * p["L"]),
        bytes_moved=lambda p: float(p["B"] * p["L"] * 4),
        tolerance=lambda dtype: (1e-5, 1e-5),
        extra=extra,
    )


def _lengths_in_range(problem, backend, inputs):
    lengths = [int(v) for v in np.asarray(inputs["lengths"])]
    if any(not 0 <= n <= problem["L"] for n in lengths):
        return f"input 'lengths' holds {lengths}: each must be in [0, L={problem['L']}]"
    return None


LENGTHS = {"B": 4, "L": 8, "dtype": "float32"}


@pytest.fixture
def own_lengths():
    from tuner.kernels._registry import REGISTRY

    def register(**extra):
        REGISTRY["own_lengths"] = _lengths_spec(**extra)
        return tuner.kernel("own_lengths", backend="pallas", budget=2, storage=False, bench=_bench)

    yield register
    REGISTRY.pop("own_lengths", None)


def test_a_spec_of_ones_own_checks_values_with_its_check_values(own_lengths):
    # Before: a spec not made from a registered kernel had no value check at all (only moe_gemm's and
    # those made from it did): lengths past L were timed, stored under the key, and the call's sums wrong
    f = own_lengths(check_values=_lengths_in_range)
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(
        ValueError, match=r"own_lengths.*input 'lengths' holds \[9, 1, 1, 1\]: each must be in"
    ):
        f(LENGTHS, {"x": x, "lengths": jnp.asarray([9, 1, 1, 1], jnp.int32)})
    assert f.tuner.stats["tuned"] == 0
    got = f(LENGTHS, {"x": x, "lengths": jnp.asarray([8, 1, 0, 2], jnp.int32)})
    np.testing.assert_allclose(np.asarray(got), [8.0, 1.0, 0.0, 2.0])


def test_a_spec_of_ones_own_checks_its_stand_ins_values_at_a_traced_miss(own_lengths):
    # the values a traced miss is tuned on (the spec's stand-ins) get the same check, as moe_gemm's do
    f = own_lengths(
        check_values=_lengths_in_range,
        stand_ins=lambda p, b, i: {"lengths": jnp.full((p["B"],), p["L"] + 1, jnp.int32)},
    )
    x = jnp.ones((4, 8), jnp.float32)
    step = jax.jit(lambda x, n: f(LENGTHS, {"x": x, "lengths": n}))
    with pytest.raises(ValueError, match=r"holds \[9, 9, 9, 9\]: each must be in .*inside a jax trace"):
        step(x, jnp.asarray([8, 1, 0, 2], jnp.int32))
    assert f.tuner.stats["tuned"] == 0


@pytest.mark.parametrize(
    ("check", "match"),
    [
        (lambda p, b, i: 1, r"extra\['check_values'\] returned int; it returns None, or a str"),
        ("lengths <= L", r"extra\['check_values'\] must be a function of \(problem, backend, inputs\)"),
    ],
)
def test_a_bad_check_values_is_a_type_error(own_lengths, check, match):
    f = own_lengths(check_values=check)
    with pytest.raises(TypeError, match=match):
        f(LENGTHS, {"x": jnp.ones((4, 8), jnp.float32), "lengths": jnp.asarray([1, 1, 1, 1], jnp.int32)})
