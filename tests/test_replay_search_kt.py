"""benchmarks/replay_search.py with Kernel Tuner's strategies as peers (`--strategies kt`).

Kernel Tuner is the `bench` extra, which CI does not install: the runs are skipped without it; the
usage checks are not."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests._scripts import benchmark_script
from tuner.replay import load_table

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"


rs = benchmark_script("replay_search")
kt_missing = importlib.util.find_spec("kernel_tuner") is None
needs_kt = pytest.mark.skipif(
    kt_missing, reason="kernel_tuner is not installed (the bench extra; CI skips it)"
)


def test_kt_expands_to_its_strategies() -> None:
    names = rs.expand_strategies(["random", "kt", "kt:pso", "tpe"])
    assert names[0] == "random" and names[-1] == "tpe"
    assert names[1:-1] == [f"kt:{s}" for s in rs.KT_DEFAULT]  # kt:pso once
    assert {"genetic_algorithm", "pso", "bayes_opt"} <= set(rs.KT_DEFAULT)
    assert rs.expand_strategies(["random", "tpe", "auto"]) == ["random", "tpe", "auto"]


def test_kt_without_kernel_tuner_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "kernel_tuner", None)  # import kernel_tuner raises ImportError
    monkeypatch.setitem(sys.modules, "kernel_tuner.interface", None)
    code = rs.main(
        [
            "--data",
            str(SAMPLE.parent),
            "--files",
            SAMPLE.name,
            "--strategies",
            "random,kt",
            "--seeds",
            "1",
            "--budget",
            "5",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "kernel_tuner is not installed" in err[0]


@needs_kt
def test_unknown_kt_strategy_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = rs.main(
        [
            "--data",
            str(SAMPLE.parent),
            "--files",
            SAMPLE.name,
            "--strategies",
            "kt:no_such",
            "--seeds",
            "1",
            "--budget",
            "5",
        ]
    )
    assert code == 2 and "unknown Kernel Tuner strategies ['no_such']" in capsys.readouterr().err


@needs_kt
@pytest.mark.parametrize("name", ["genetic_algorithm", "simulated_annealing"])
def test_kt_run_is_a_sane_record(name: str) -> None:
    table = load_table(SAMPLE)
    budget = 25
    r = rs.run_kt(str(SAMPLE), name, 3, budget)
    assert r["strategy"] == f"kt:{name}" and r["seed"] == 3
    assert 0 < r["evaluations"] == len(r["values"]) == len(r["trace"]) <= budget
    recorded = set(table.values.values())
    assert all(v in recorded for v in r["values"])  # each a table value (None: a failed config)
    best = [x for x in r["trace"] if x is not None]
    assert best == sorted(best, reverse=True)  # best-so-far never gets worse
    ok = [v for v in r["values"] if v is not None]
    assert best[-1] == min(ok) >= table.optimum
    assert r["strategy_ms_per_eval"] >= 0 and r["kt_startup_s"] >= 0
    assert rs.run_kt(str(SAMPLE), name, 3, budget)["values"] == r["values"]  # reproducible per seed


@needs_kt
def test_kt_columns_in_report_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kt.json"
    args = [
        "--data",
        str(SAMPLE.parent),
        "--files",
        SAMPLE.name,
        "--strategies",
        "random,kt:random_sample",
        "--seeds",
        "2",
        "--budget",
        "15",
    ]
    assert rs.main([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kt:random_sample" in text and "ms/eval of kt:*" in text
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert {r["strategy"] for r in doc["runs"]} == {"random", "kt:random_sample"}
    assert "kt:random_sample" in doc["summary"]["strategies"]
    assert rs.main([*args, "--from-json", str(out)]) == 0
    assert "kt:random_sample" in capsys.readouterr().out
