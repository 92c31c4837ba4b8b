"""The CPU-testable parts of benchmarks/gpu_validate.py: the no-GPU exit, the sized space, the JSON
report and the Kernel Tuner cache file of the sweep (round trip through tuner.replay and `tuner replay`).
The GPU phases themselves only run on a CUDA machine."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tuner.search_spaces import Constraint, IntRange, PowerOfTwo, SearchSpace

from tests._scripts import benchmark_script
from tuner.measure import MeasureResult, summarize, write_kernel_tuner_cache
from tuner.replay import load_table

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_validate.py"


@pytest.fixture(scope="module")
def gv():
    return benchmark_script("gpu_validate")


@pytest.mark.parametrize("interpret", ["1", ""])
def test_without_a_gpu_it_prints_versions_then_one_line_and_exits_1(tmp_path, interpret):
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "TRITON_INTERPRET": interpret,
        "CUDA_VISIBLE_DEVICES": "",
    }
    p = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120, encoding="utf-8"
    )
    assert p.returncode == 1, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("versions: python=")
    assert "triton=" in lines[0] and "driver=" in lines[0] and "gpu=" in lines[0]
    assert lines[1].startswith("gpu_validate: no usable CUDA device") and "--allow-cpu" in lines[1]
    assert not (tmp_path / "out").exists()


def test_xla_preallocation_is_off_before_jax_loads(gv):
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    src = SCRIPT.read_text(encoding="utf-8")
    assert src.index("XLA_PYTHON_CLIENT_PREALLOCATE") < src.index("import jax")


def test_phase_budgets_share_the_time_left(gv):
    clock = gv.Clock(100.0, {"a": 0.25, "b": 0.25, "c": 0.5})
    assert clock.phase_budget("a", ["a", "b", "c"]) == pytest.approx(25.0, abs=0.5)
    # a phase that ran late leaves less; the rest is shared among the phases still to run
    clock.t0 -= 40.0
    assert clock.phase_budget("b", ["b", "c"]) == pytest.approx(60.0 / 3, abs=0.5)
    assert clock.phase_budget("c", ["c"]) == pytest.approx(60.0, abs=0.5)
    clock.t0 -= 100.0
    assert clock.phase_budget("c", ["c"]) == 0.0


def test_interleaved_protocol_times_every_contestant_in_rounds(gv):
    from tuner.measure import TimingOptions

    order = []
    opts = TimingOptions(warmup=0, min_reps=1, max_reps=3, interleave_rounds=3, interleave_reps=2)

    def make(name):
        def fn():
            order.append(name)

        return fn

    def boom():
        raise RuntimeError("no kernel")

    res = gv.interleaved([("a", make("a")), ("b", make("b")), ("x", boom)], opts, gpu=False)
    assert res["a"].ok and res["b"].n == 6 and res["x"].status == "crashed"
    # one warm-up call each, then rounds of (warmup 1 + 2 reps) per contestant: a a a b b b a a a ...
    assert order[:2] == ["a", "b"] and order[2:5] == ["a"] * 3 and order[5:8] == ["b"] * 3


def test_output_dir(gv, monkeypatch):
    monkeypatch.setenv("OUT", "/tmp/x")
    assert gv.output_dir(None) == Path("/tmp/x") and gv.output_dir("d") == Path("d")
    monkeypatch.delenv("OUT")
    assert gv.output_dir(None) == Path("gpu_validate_out")


def _toy_space():
    return SearchSpace(
        [PowerOfTwo("BM", 16, 256), PowerOfTwo("BN", 16, 256), IntRange("w", 1, 8)],
        [Constraint("BM*BN <= 16384", lambda c: c["BM"] * c["BN"] <= 16384, ("BM", "BN"))],
    )


def test_sized_configs_grid_limit_and_determinism(gv):
    sp = _toy_space()
    grid = {"BM": [32, 64, 256], "BN": [64, 128], "w": [4, 8]}
    cs = gv.sized_configs(sp, 100, grid)
    # 3 x 2 x 2 grid points, less the two with BM*BN = 256*128 > 16384
    assert len(cs) == 10 and all(sp.contains(c) for c in cs)
    assert not any(c["BM"] == 256 and c["BN"] == 128 for c in cs)
    assert {c["BM"] for c in cs} == {32, 64, 256}
    small = gv.sized_configs(sp, 5, grid)
    assert len(small) == 5 and small == gv.sized_configs(sp, 5, grid)
    # names that do not match the space: the whole (valid) space, sampled down to the limit
    other = gv.sized_configs(sp, 20, {"X": [1]})
    assert len(other) == 20 and all(sp.contains(c) for c in other)


def _fake_sweep(sp, configs):
    rows = []
    for i, c in enumerate(configs):
        if i % 5 == 3:
            rows.append((c, MeasureResult.failed("compile_error", "cuda", "ptxas: too many registers")))
        elif i % 5 == 4:
            rows.append(
                (c, MeasureResult.failed("incorrect", "cuda", "12 of 100 elements outside tolerance"))
            )
        else:
            t = 0.5 + 0.01 * ((i * 7) % 13)
            rows.append((c, summarize([t * 1.02, t, t * 0.99, t * 1.01], backend="cuda", compile_s=1.5)))
    return rows


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_sweep_cache_round_trips_through_replay(gv, tmp_path, suffix):
    sp = _toy_space()
    configs = gv.sized_configs(sp, 30, {"BM": [32, 64, 128], "BN": [32, 64, 128], "w": [2, 4, 8]})
    rows = _fake_sweep(sp, configs)
    problem = {"M": 4096, "N": 4096, "K": 4096}
    doc = gv.sweep_cache(
        rows, device_name="NVIDIA H200", problem=problem, keys=sp.names, extra={"arch": "sm90"}
    )
    path = write_kernel_tuner_cache(tmp_path / f"sweep{suffix}", doc)
    if suffix.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
        json.loads(gzip.decompress(path.read_bytes()))
    table = load_table(path)
    assert table.device_name == "NVIDIA H200" and table.problem_size == [4096, 4096, 4096]
    assert len(table.values) == len(rows)
    for c, r in rows:
        assert table.lookup(c) == (r.median if r.ok else None)
    best_c, best_r = min(((c, r) for c, r in rows if r.ok), key=lambda cr: cr[1].median)
    assert table.optimum == best_r.median
    assert table.lookup(table.best_config()) == best_r.median
    entry = next(iter(doc["cache"].values()))
    assert {"time", "times", "compile_time", "status"} <= set(entry)

    from tuner.cli import main

    assert main(["replay", str(path), "--budget", str(len(rows)), "--strategy", "random", "--json"]) == 0


def test_sweep_cache_rejects_duplicates_and_wrong_keys(gv):
    r = summarize([1.0], backend="cuda")
    with pytest.raises(ValueError, match="twice"):
        gv.sweep_cache(
            [({"a": 1}, r), ({"a": 1}, r)],
            device_name="d",
            problem={"M": 1, "N": 1, "K": 1},
            keys=["a"],
            extra={},
        )
    with pytest.raises(ValueError, match="keys"):
        gv.sweep_cache(
            [({"a": 1, "b": 2}, r)], device_name="d", problem={"M": 1, "N": 1, "K": 1}, keys=["a"], extra={}
        )


def test_report_json_is_written_atomically(gv, tmp_path):
    p = tmp_path / "o" / "gpu_validate.json"
    gv.write_json(p, {"schema": gv.SCHEMA, "x": [1, 2]})
    gv.write_json(p, {"schema": gv.SCHEMA, "x": [3]})
    assert json.loads(p.read_text(encoding="utf-8")) == {"schema": gv.SCHEMA, "x": [3]}
    assert [q.name for q in p.parent.iterdir()] == ["gpu_validate.json"]
    assert gv.tflops(2e12, 1000.0) == pytest.approx(2.0) and gv.tflops(None, 1.0) is None


@pytest.mark.slow
def test_cpu_self_test_runs_the_phases_and_writes_the_report(tmp_path):
    """The CPU twin of the GPU run: the same phases on tiny problems under the interpreters (kernel
    checks skipped here for time; `--allow-cpu` alone runs them too)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--allow-cpu", "--out", str(out), "--skip", "checks"]
    p = subprocess.run(
        [*cmd, "--max-minutes", "6"], capture_output=True, text=True, env=env, timeout=600, encoding="utf-8"
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.startswith("versions: python=")
    doc = json.loads((out / "gpu_validate.json").read_text(encoding="utf-8"))
    assert doc["schema"] == "tuner.gpu_validate/2" and doc["mode"] == "cpu-self-test" and not doc["errors"]
    assert set(doc["phase_s"]) == {"graph_probe", "matmul", "attention"}
    budgets = doc["phase_budget_s"]  # time a phase leaves unused goes to the later ones
    assert budgets["graph_probe"] < budgets["matmul"] <= budgets["attention"] <= 6 * 60
    mm = doc["matmul"]["final"]
    assert mm["torch.matmul"]["status"] == "ok" and mm["torch.matmul"]["speed_vs_baseline"] == 1.0
    assert mm["tuned"]["status"] == "ok" and mm["tuned"]["n"] == 4  # 2 rounds x 2 reps
    assert "sweep_best_1" in mm and doc["matmul"]["configs_timed"] >= 4
    assert (out / "matmul_sweep_cpu.json").exists()
    at = doc["attention"]["final"]
    assert at["torch_sdpa"]["status"] == "ok" and at["tuned"]["status"] == "ok"
    assert "sweep_best_1" in at and doc["attention"]["sweep_measured"] == doc["attention"]["space"]
    assert (out / "flash_attention_sweep_cpu.json").exists()
    assert "result (TFLOP/s" in p.stdout


def test_full_grid_sweeps_the_whole_space_or_a_seeded_sample(gv, tmp_path):
    """--grid full (run 3 on the H200): no sized grid, so the whole space where it fits the limit and a
    seeded, repeatable sample where it does not."""
    import argparse

    from tuner.kernels import get_kernel
    from tuner.search_spaces import get_device

    run = gv.Run(argparse.Namespace(jobs=1, grid="full"), False, tmp_path, {})
    assert run.matmul_grid is None and run.attention_grid is None
    sized = gv.Run(argparse.Namespace(jobs=1, grid="sized"), False, tmp_path, {})
    assert sized.matmul_grid is not None and sized.attention_grid is not None
    prob = {"B": 4, "H": 32, "S": 4096, "D": 128, "causal": True, "dtype": "bfloat16"}
    space = get_kernel("flash_attention").space(prob, get_device("sm90"), "triton")
    whole = gv.sized_configs(space, 10_000, None)
    assert len(whole) == len(space.enumerate())
    part = gv.sized_configs(space, 50, None)
    assert len(part) == 50 and part == gv.sized_configs(space, 50, None)
    assert all(space.contains(c) for c in part)
