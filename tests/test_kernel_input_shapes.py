"""`tuner.kernel(name, backend)(problem, inputs)` checks, on a miss and before anything is timed or stored,
that the inputs are the arrays the problem implies (`tuner.kernels._inputs.input_spec`, compared by
`check_inputs`): inputs made for another problem (M=16 float32 data under an M=8 bfloat16
problem) used to be tuned on and their winner stored under the problem's key, so a later correct call hit
a config timed on other data."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("jax")

from tuner.kernels import all_kernels, get_kernel, prepare_triton  # noqa: E402
from tuner.kernels._inputs import check_inputs, input_spec  # noqa: E402

import tuner  # noqa: E402

KERNELS = [s.name for s in all_kernels()]
CASES = [(s.name, b) for s in all_kernels() for b in ("triton", "pallas") if b in s.backends]


def _tiny(name: str) -> dict:
    """The kernel's default problem, shrunk (shape fields at most 16, a head dim the kernel has)."""
    spec = get_kernel(name)
    p = dict(spec.default_problem)
    for f in spec.shape_fields:
        if f != "D":
            p[f] = min(p[f], 16)
    return p


def _other_shape(name: str, problem: dict) -> dict:
    spec = get_kernel(name)
    return {**problem, spec.shape_fields[0]: problem[spec.shape_fields[0]] + 1}


def _other_dtype(name: str, problem: dict) -> dict:
    spec = get_kernel(name)
    return {**problem, "dtype": next(d for d in spec.dtypes if d != problem["dtype"])}


@pytest.fixture(scope="module", autouse=True)
def _triton():
    prepare_triton()


def test_every_kernel_says_its_inputs():
    assert KERNELS
    for spec in all_kernels():
        for backend in spec.backends:
            assert input_spec(spec, spec.default_problem, backend), (spec.name, backend)


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_input_spec_is_what_make_inputs_makes(name, backend):
    spec = get_kernel(name)
    for problem in (_tiny(name), _other_shape(name, _tiny(name)), _other_dtype(name, _tiny(name))):
        inputs = spec.make_inputs(problem, backend, 0)
        check_inputs(spec, problem, backend, inputs)  # no error: the spec describes them
        assert set(input_spec(spec, problem, backend) or {}) == set(inputs)


def _counting_bench():
    calls = []

    def bench(call):
        calls.append(1)
        call()
        return 1e-3

    return bench, calls


@pytest.mark.parametrize(("name", "backend"), CASES)
@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_inputs_of_another_problem_are_refused_before_anything_is_timed(name, backend, change, tmp_path):
    spec = get_kernel(name)
    problem = _tiny(name)
    made_for = _other_shape(name, problem) if change == "shape" else _other_dtype(name, problem)
    inputs = spec.make_inputs(made_for, backend, 0)
    url = f"sqlite:///{tmp_path}/s.db"
    bench, calls = _counting_bench()
    f = tuner.kernel(name, backend=backend, budget=2, storage=url, bench=bench)
    with pytest.raises(ValueError, match=f"kernel {name!r}") as err:
        f(problem, inputs)
    msg = str(err.value)
    want = input_spec(spec, problem, backend) or {}
    got = input_spec(spec, made_for, backend) or {}
    bad = next(n for n in want if want[n] != got[n])
    assert f"input {bad!r}" in msg, msg
    i = 0 if change == "shape" else 1
    assert str(want[bad][i]) in msg and str(got[bad][i]) in msg, msg
    assert not calls  # nothing timed
    assert tuner.ConfigCache(url).count() == 0  # nothing stored
    with pytest.raises(ValueError, match=f"input {bad!r}"):
        f.explain(problem, inputs)


def test_the_issue_reproduction_is_refused(tmp_path):
    spec = get_kernel("layernorm")
    bench, calls = _counting_bench()
    f = tuner.kernel(
        "layernorm", backend="pallas", budget=2, storage=f"sqlite:///{tmp_path}/s.db", bench=bench
    )
    inputs = spec.make_inputs({"M": 16, "N": 100, "dtype": "float32", "eps": 1e-5}, "pallas", 0)
    with pytest.raises(ValueError, match=r"input 'x' has shape \(16, 100\), the problem implies \(8, 100\)"):
        f({"M": 8, "N": 100, "dtype": "bfloat16", "eps": 1e-5}, inputs)
    assert not calls


@pytest.mark.parametrize("backend", ["triton", "pallas"])
def test_missing_or_extra_inputs_are_named(backend):
    spec = get_kernel("matmul")
    p = {**_tiny("matmul"), "bias": True}
    inputs = dict(spec.make_inputs(p, backend, 0))
    f = tuner.kernel("matmul", backend=backend, mode="offline", storage=False)
    with pytest.raises(ValueError, match="has no input 'bias'"):
        f.explain({**p, "bias": False}, inputs)  # a bias the problem says the kernel does not add
    del inputs["bias"]
    with pytest.raises(ValueError, match="misses input 'bias'"):
        f.explain(p, inputs)
    with pytest.raises(ValueError, match="input 'a' is a list, not an array"):
        f.explain({**p, "bias": False}, {**inputs, "a": [[1.0]]})


def test_matching_inputs_still_tune_and_hit(tmp_path):
    spec = get_kernel("rmsnorm")
    p = _tiny("rmsnorm")
    bench, calls = _counting_bench()
    f = tuner.kernel("rmsnorm", backend="triton", budget=2, storage=f"sqlite:///{tmp_path}/s.db", bench=bench)
    inputs = spec.make_inputs(p, "triton", 0)
    f(p, inputs)
    assert calls
    assert f.explain(p, inputs).startswith("hit")


def test_the_kernels_source_hash_does_not_cover_the_input_specs():
    """A change to the input specs is no change to a kernel's code: cached configs stay exact hits."""
    from tuner.runtime._source import module_files

    for spec in all_kernels():
        mod = spec.run.func.__module__ if hasattr(spec.run, "func") else spec.run.__module__
        assert "_inputs.py" not in [p.name for p in module_files(mod, "tuner.kernels")], spec.name


def test_a_spec_of_its_own_says_its_inputs_in_extra():
    import dataclasses

    base = get_kernel("softmax")
    renamed = dataclasses.replace(base, name="my_softmax")
    assert input_spec(renamed, {"M": 2, "N": 3, "dtype": "float32"}, "triton") is None  # not the registry's
    own = dataclasses.replace(
        renamed, extra={**base.extra, "input_spec": lambda p, b: {"x": ((p["M"], p["N"]), p["dtype"])}}
    )
    import torch

    check_inputs(own, {"M": 2, "N": 3, "dtype": "float32"}, "triton", {"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"input 'x' has dtype float16, the problem implies float32"):
        check_inputs(
            own, {"M": 2, "N": 3, "dtype": "float32"}, "triton", {"x": torch.zeros(2, 3, dtype=torch.float16)}
        )


MOE = {"T": 12, "K": 8, "N": 10, "E": 3, "dtype": "float32"}
BAD_GROUP_SIZES = {  # what the problem's inputs' group sizes are replaced by -> what the error says
    "short": (
        [2, 3, 4],
        r"holds \[2, 3, 4\], which sum to 9: it must hold E=3 non-negative ints summing to T=12",
    ),
    "long": ([6, 6, 6], r"holds \[6, 6, 6\], which sum to 18"),
    "negative": ([-2, 8, 6], r"holds \[-2, 8, 6\], negative for expert 0"),
}


def _moe_inputs(backend, sizes, problem=MOE):
    inputs = dict(get_kernel("moe_gemm").make_inputs(problem, backend, 0))
    like = inputs["group_sizes"]
    if backend == "triton":
        import torch

        inputs["group_sizes"] = torch.tensor(sizes, dtype=like.dtype, device=like.device)
    else:
        import jax.numpy as jnp

        inputs["group_sizes"] = jnp.asarray(sizes, dtype=like.dtype)
    return inputs


@pytest.mark.parametrize("backend", ["triton", "pallas"])
@pytest.mark.parametrize("case", sorted(BAD_GROUP_SIZES))
def test_moe_group_sizes_off_the_contract_are_refused_before_anything_is_timed(backend, case, tmp_path):
    # Before, the kernels ran: rows past the sizes' sum never written (NaN, or whatever torch.empty held),
    # rows of one expert multiplied by another's weights, tuned on and stored; no error anywhere
    sizes, says = BAD_GROUP_SIZES[case]
    inputs = _moe_inputs(backend, sizes)
    url = f"sqlite:///{tmp_path}/s.db"
    bench, calls = _counting_bench()
    f = tuner.kernel("moe_gemm", backend=backend, budget=2, storage=url, bench=bench)
    with pytest.raises(
        ValueError, match=rf"kernel 'moe_gemm' \({backend}\), problem .*: input 'group_sizes' {says}"
    ):
        f(MOE, inputs)
    assert not calls and tuner.ConfigCache(url).count() == 0  # nothing timed, nothing stored
    with pytest.raises(ValueError, match="input 'group_sizes'"):
        f.explain(MOE, inputs)


@pytest.mark.parametrize("backend", ["triton", "pallas"])
def test_moe_group_sizes_other_than_the_problems_are_refused(backend):
    problem = {**MOE, "group_sizes": [4, 0, 8]}
    f = tuner.kernel("moe_gemm", backend=backend, mode="offline", storage=False)
    with pytest.raises(ValueError, match=r"holds \[0, 4, 8\], the problem's group_sizes are \[4, 0, 8\]"):
        f(problem, _moe_inputs(backend, [0, 4, 8], problem))
    f(problem, _moe_inputs(backend, [4, 0, 8], problem))  # the problem's own: run


def test_moe_group_sizes_are_read_on_a_miss_only(monkeypatch):
    from tuner.kernels import _inputs

    read = []
    check = _inputs._VALUES["moe_gemm"]
    monkeypatch.setitem(
        _inputs._VALUES, "moe_gemm", (check[0], lambda p, i: (read.append(1), check[1](p, i))[1])
    )
    f = tuner.kernel("moe_gemm", backend="triton", mode="offline", storage=False)
    for sizes in ([4, 4, 4], [0, 12, 0], [5, 3, 4]):  # the routing changes from call to call, the key not
        f(MOE, _moe_inputs("triton", sizes))
    assert len(read) == 1  # the hits read no device memory (a host sync per launch)


def test_a_traced_moe_call_passes_the_check_on_its_stand_ins():
    # a miss under jax.jit resolves its config on stand-ins of the tracers (a balanced split of T for the
    # group sizes, `stand_in_values`), which the check passes; a traced call's own sizes are not read
    import jax

    inputs = _moe_inputs("pallas", [5, 3, 4])
    f = tuner.kernel("moe_gemm", backend="pallas", mode="offline", storage=False)
    got = jax.jit(lambda x, gs: f(MOE, {**inputs, "x": x, "group_sizes": gs}))(
        inputs["x"], inputs["group_sizes"]
    )
    want = get_kernel("moe_gemm").reference(MOE, inputs)
    assert abs(float((got - want).max())) < 1e-3
    # nor are tracers read: `explain` inside a trace says what the call would use
    said = []
    g = tuner.kernel("moe_gemm", backend="pallas", mode="offline", storage=False)
    jax.jit(lambda gs: (said.append(g.explain(MOE, {**inputs, "group_sizes": gs})), gs)[1])(
        inputs["group_sizes"]
    )
    assert said[0].startswith("miss")


def test_moe_group_sizes_of_meta_tensors_are_not_read():
    import torch

    inputs = {n: v.to("meta") for n, v in _moe_inputs("triton", [4, 4, 4]).items()}
    f = tuner.kernel("moe_gemm", backend="triton", mode="offline", storage=False)
    assert f.explain(MOE, inputs)  # no "Cannot copy out of meta tensor": the config is chosen
    assert torch.device("meta") == inputs["x"].device
