"""The kernel check machinery and the `tuner kernels` / `tuner check` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tuner.kernels import KernelSpec
from tuner.kernels._check import check_kernel, compare, draw_configs
from tuner.kernels._registry import REGISTRY, all_kernels
from tuner.search_spaces import Categorical, SearchSpace, get_device

from tuner.cli import main

MINE = {"matmul", "int8_matmul", "moe_gemm"}


class InterpreterError(RuntimeError):
    """Stands for triton.runtime.errors.InterpreterError (the interpreter raises it with repr(cause))."""


OLD_INTERPRETER_ERROR = InterpreterError(
    repr(TypeError("only 0-dimensional arrays can be converted to Python scalars"))
)


def _fake_spec(name: str, run: Any, backend: str = "triton", output_buffer: str | None = "out") -> KernelSpec:
    """A numpy 'kernel' over a 4x6 problem whose space is one parameter `mode` with 4 values."""

    def make_inputs(problem: Any, backend: str, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        return {"x": rng.standard_normal((4, 6)).astype(np.float32), "out": np.empty((4, 6), np.float32)}

    return KernelSpec(
        name=name,
        description="test double",
        backends=(backend,),
        dtypes=("float32",),
        default_problem={"R": 4, "C": 6, "dtype": "float32"},
        shape_fields=("R", "C"),
        space=lambda p, d, b: SearchSpace([Categorical("mode", ("a", "b", "c", "d"))]),
        make_inputs=make_inputs,
        reference=lambda p, inp: 2.0 * inp["x"].astype(np.float64),
        run=run,
        flops=lambda p: 24.0,
        bytes_moved=lambda p: 192.0,
        tolerance=lambda d: (1e-5, 1e-5),
        output_buffer=output_buffer,
    )


@pytest.fixture
def fake_kernels() -> Iterator[None]:
    all_kernels()  # load the real ones first

    def lazy(problem: Any, backend: str, inputs: Any, cfg: Any) -> Any:
        """Correct for mode a; leaves the buffer as it is otherwise (stale results from the last run)."""
        if cfg["mode"] == "a":
            inputs["out"][...] = 2.0 * inputs["x"]
        return inputs["out"]

    def half(problem: Any, backend: str, inputs: Any, cfg: Any) -> Any:
        inputs["out"][:2] = 2.0 * inputs["x"][:2]  # rows 2-3 never written
        return inputs["out"]

    def boom(problem: Any, backend: str, inputs: Any, cfg: Any) -> Any:
        raise RuntimeError("out of resources: shared memory")

    def old_interpreter(problem: Any, backend: str, inputs: Any, cfg: Any) -> Any:
        """What every kernel with a `range(0, N, BLOCK)` loop raises under triton 3.6's interpreter with
        numpy >= 2.4."""
        raise OLD_INTERPRETER_ERROR

    added = {
        s.name: s
        for s in (
            _fake_spec("fake_lazy", lazy),
            _fake_spec("fake_half", half),
            _fake_spec("fake_boom", boom),
            _fake_spec("fake_old_interpreter", old_interpreter),
        )
    }
    REGISTRY.update(added)
    try:
        yield
    finally:
        for k in added:
            REGISTRY.pop(k, None)


def test_poisoning_catches_a_stale_output_buffer(fake_kernels: None) -> None:
    """Mode a writes the right answer; b-d return the same buffer unwritten. Without the NaN poison
    they would pass on the stale values of the previous run."""
    spec = REGISTRY["fake_lazy"]
    rep = check_kernel(
        spec,
        backend="triton",
        device=get_device("cpu"),
        configs=[{"mode": "a"}, {"mode": "b"}, {"mode": "a"}, {"mode": "c"}],
    )
    assert [r.ok for r in rep.rows] == [True, False, True, False]
    assert rep.rows[1].bad_elements == 24 and np.isnan(rep.rows[1].max_abs_err)
    assert not rep.ok


def test_unwritten_elements_and_exceptions_fail(fake_kernels: None) -> None:
    rep = check_kernel(REGISTRY["fake_half"], backend="triton", device=get_device("cpu"), configs=2)
    assert all(r.bad_elements == 12 and not r.ok for r in rep.rows)
    rep = check_kernel(REGISTRY["fake_boom"], backend="triton", device=get_device("cpu"), configs=1)
    assert not rep.ok and "out of resources" in (rep.rows[0].error or "")


def test_pallas_interpret_output_is_nan_where_unwritten() -> None:
    """check_kernel relies on this for Pallas (outputs are fresh arrays, nothing to poison)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref: Any, o_ref: Any) -> None:
        @pl.when(pl.program_id(0) != 1)
        def _() -> None:
            o_ref[...] = 2.0 * x_ref[...]

    x = jnp.ones((24, 8), jnp.float32)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((24, 8), jnp.float32),
        grid=(3,),
        in_specs=[pl.BlockSpec((8, 8), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 8), lambda i: (i, 0)),
        interpret=True,
    )(x)
    _, _, ok, n_bad = compare(out, 2.0 * np.ones((24, 8)), 1e-6, 1e-6)
    assert not ok and n_bad == 64


def test_compare_tolerance_and_shape() -> None:
    ref = np.array([1.0, 100.0])
    assert compare(np.array([1.01, 101.0]), ref, 1e-2, 1e-2)[2]
    assert not compare(np.array([1.03, 100.0]), ref, 1e-2, 1e-2)[2]
    with pytest.raises(ValueError, match="shape"):
        compare(np.zeros(3), ref, 1e-2, 1e-2)


def test_draw_configs_distinct_and_seeded() -> None:
    space = SearchSpace([Categorical("a", tuple(range(10))), Categorical("b", ("x", "y"))])
    c1, c2 = draw_configs(space, 8, 3), draw_configs(space, 8, 3)
    assert c1 == c2 and len({(c["a"], c["b"]) for c in c1}) == 8
    assert len(draw_configs(space, 50, 0)) == 20


def test_kernels_json_lists_every_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) >= MINE
    for r in rows:
        assert r["backends"] and r["params"] and r["dtypes"]
    assert {"BLOCK_M", "GROUP_M", "SPLIT_K", "num_warps", "num_stages", "bm", "grid_order"} <= set(
        by_name["matmul"]["params"]
    )
    assert by_name["moe_gemm"]["params_by_backend"]["pallas"]["bm"] == [8, 16, 32, 64]
    assert main(["kernels", "--device", "sm90", "--json"]) == 0
    sm90 = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert sm90["matmul"]["params_by_backend"]["pallas"]["num_warps"] == [2, 4, 8]
    assert main(["kernels", "--device", "tpu_v5e", "--json"]) == 0
    tpu = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert "error" in tpu["matmul"]["params_by_backend"]["triton"]
    assert 256 in sm90["matmul"]["params_by_backend"]["triton"]["BLOCK_M"]


def test_kernels_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "moe_gemm" in out and "int8_matmul" in out


def test_check_passes_on_a_real_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "check",
            "matmul",
            "--backend",
            "triton",
            "--configs",
            "2",
            "--shape",
            "M=33",
            "N=17",
            "K=20",
            "--shape",
            "activation=relu",
            "--dtype",
            "float32",
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["ok"] and len(rep["rows"]) == 2
    assert rep["problem"] == {
        "M": 33,
        "N": 17,
        "K": 20,
        "dtype": "float32",
        "bias": True,
        "activation": "relu",
    }
    assert all(r["max_abs_err"] < 1e-4 for r in rep["rows"])


def test_check_exits_1_on_wrong_results(fake_kernels: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "fake_lazy", "--configs", "4", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "configs match the reference" in out
    assert main(["check", "fake_boom", "--configs", "1"]) == 1


def test_the_old_triton_interpreters_numpy_fault_is_explained_once(
    fake_kernels: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """triton <= 3.6's interpreter with numpy >= 2.4 fails every kernel with a runtime loop bound: the
    check says so (once under the table, on every row in --json) instead of blaming the kernel."""
    assert main(["check", "fake_old_interpreter", "--configs", "3"]) == 1
    out = capsys.readouterr().out
    assert out.count("a known fault of the Triton interpreter") == 1
    assert "triton>=3.7.1 or numpy<2.4" in out.replace("\n", " ")
    assert out.count("only 0-dimensional arrays") == 3  # each row keeps its own error
    assert main(["check", "fake_old_interpreter", "--configs", "2", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all("a known fault of the Triton interpreter" in r["error"] for r in rows)
    # any other failure gets no such note
    assert main(["check", "fake_boom", "--configs", "1", "--json"]) == 1
    assert "known fault" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "no_such_kernel"],
        ["check", "matmul", "--configs", "0"],
        ["check", "matmul", "--shape", "Q=1"],
        ["check", "matmul", "--shape", "M"],
        ["check", "matmul", "--shape", "M=-3"],
        ["check", "matmul", "--dtype", "int4"],
        ["check", "matmul", "--device", "sm99"],
        ["check", "matmul", "--backend", "triton", "--device", "tpu_v5e"],
        ["check", "moe_gemm", "--shape", "group_sizes=1,2", "--backend", "pallas"],
        # the problem schema (validate_problem), not a run whose every config fails with NaN
        ["check", "rmsnorm", "--shape", "eps=-1", "--backend", "triton"],
        ["check", "softmax", "--shape", "M=3000000000", "--backend", "triton"],
        ["check", "flash_attention", "--shape", "sm_scale=big", "--backend", "triton"],
        # no config fits: a reason naming the constraints (was 'tuner: failed: ... no valid config', exit 1)
        ["check", "softmax", "--backend", "pallas", "--device", "tpu_v4", "--shape", "M=1", "N=200000"],
        ["kernels", "--device", "nope"],
    ],
)
def test_bad_input_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: ") and len(err.strip().splitlines()) == 1


def test_check_kernel_applies_the_problem_schema() -> None:
    """check_kernel (the API under tuner check) ran a problem validate_problem refuses: every config failed
    with NaN and no reason."""
    from tuner.kernels import get_kernel

    with pytest.raises(ValueError, match=r"eps=-1.0 must be a number in \(0, 1\)"):
        check_kernel(get_kernel("rmsnorm"), backend="triton", problem={"eps": -1.0}, configs=1)


def test_draw_configs_of_an_empty_space_says_which_constraints_reject_it() -> None:
    from tuner.kernels import get_kernel

    space = get_kernel("softmax").space(
        {"M": 1, "N": 200000, "dtype": "float32"}, get_device("tpu_v4"), "pallas"
    )
    with pytest.raises(
        ValueError, match=r"reject all 96 configs .*'VMEM <= 12 MiB on tpu_v4' rejects 96 of 96"
    ):
        draw_configs(space, 2, 0)


def test_check_takes_every_field_of_the_problem_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag the spec declares beside its default problem (flash_attention's sm_scale) and an optional
    field (moe_gemm's group_sizes) are problem fields for --shape, as for validate_problem."""
    argv = ["check", "flash_attention", "--backend", "triton", "--configs", "1", "--json"]
    assert main([*argv, "--shape", "S=20", "causal=false", "sm_scale=-0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["problem"]["sm_scale"] == -0.5
    argv = ["check", "moe_gemm", "--backend", "triton", "--configs", "1", "--json"]
    assert main([*argv, "--shape", "T=12", "E=3", "group_sizes=0,12,0"]) == 0
    assert json.loads(capsys.readouterr().out)["problem"]["group_sizes"] == [0, 12, 0]


def test_check_cli_turns_the_interpreter_on_by_itself(tmp_path: Any) -> None:
    """A fresh process without TRITON_INTERPRET (and no GPU) must still run Triton kernels."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "check",
            "moe_gemm",
            "--backend",
            "triton",
            "--configs",
            "1",
            "--shape",
            "T=20",
            "K=20",
            "N=20",
            "E=3",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.getcwd(),
        encoding="utf-8",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"]


def test_poison_fills_torch_numpy_and_replaces_jax_buffers() -> None:
    import jax.numpy as jnp
    import torch
    from tuner.kernels._check import poison

    t = torch.zeros(3, dtype=torch.bfloat16)
    assert poison(t) is t and torch.isnan(t).all()
    n = np.zeros(3, np.int32)
    assert poison(n) is n and (n == -1).all()
    j = poison(jnp.zeros((2, 2), jnp.float16))
    assert j.dtype == jnp.float16 and bool(jnp.isnan(j).all())
