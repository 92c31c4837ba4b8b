"""The production loop end to end on the CPU (Triton interpreter): production runs a registered kernel in
record mode; `tuner misses` lists what it missed; `tuner study from-misses` writes a study; `tuner study
run` tunes it, `tuner study export` ships it, `tuner cache import` loads it into production's store; the
same calls are then exact hits and record nothing more."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

import tuner
from tuner.cli import main as cli
from tuner.runtime import read_misses
from tuner.runtime._misses import recorder

CALLS = [({"M": 8, "N": 64, "dtype": "float32"}, 3), ({"M": 16, "N": 32, "dtype": "float32"}, 1)]


def _production(mode: str) -> tuner.runtime.TunedKernel:
    return tuner.kernel("rmsnorm", backend="triton", mode=mode)


def _serve(f: tuner.runtime.TunedKernel) -> None:
    from tuner.kernels import get_kernel

    spec = get_kernel("rmsnorm")
    for problem, n in CALLS:
        inputs = spec.make_inputs(problem, "triton", 0)
        for _ in range(n):
            f(problem, inputs)


def test_record_study_export_import_then_exact_hits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    monkeypatch.delenv("TUNER_MODE", raising=False)
    recorder().reset()

    # 1. production, record mode: never tunes, creates no store, records each miss with its calls
    f = _production("record")
    _serve(f)
    assert f.tuner.stats["tuned"] == 0 and f.tuner.stats["offline_fallback"] == 2
    assert not (tmp_path / "home" / "tuner.db").exists()
    recorder().flush()
    rows = {(r.problem["M"], r.problem["N"]): r for r in read_misses()}
    assert {k: r.calls for k, r in rows.items()} == {(8, 64): 3, (16, 32): 1}
    assert all(r.registered and r.backend == "triton" and r.key.device == "cpu" for r in rows.values())

    # 2. tuner misses
    assert cli(["misses"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm" in out and "2 keys, 4 calls" in out

    # 3. tuner study from-misses (the least-called key left out by --min-calls, then all of them)
    study = tmp_path / "prod.toml"
    assert cli(["study", "from-misses", "--min-calls", "2", "--out", str(study)]) == 0
    assert tomllib.loads(study.read_text())["tasks"][0]["problems"] == [{"M": 8, "N": 64, "eps": 1e-6}]
    args = ["--trials", "2", "--strategy", "random", "--finalists", "1", "--output", str(tmp_path / "out")]
    assert cli(["study", "from-misses", "--out", str(study), *args]) == 0
    doc = tomllib.loads(study.read_text())
    assert doc["study"]["device"] == "cpu" and len(doc["tasks"]) == 2
    assert doc["tasks"][0]["budget"]["trials"] > doc["tasks"][1]["budget"]["trials"]  # weighted by calls

    # 4. tuner study run, tuner study export, tuner cache import
    assert cli(["study", "run", str(study), "--quiet", "--no-report"]) == 0
    cache = tmp_path / "prod-cache.json"
    assert cli(["study", "export", str(study), "--out", str(cache)]) == 0
    assert cli(["cache", "import", str(cache)]) == 0
    capsys.readouterr()

    # 5. production again: the same calls are exact hits from the store, and nothing is recorded
    recorder().reset()
    g = _production("record")
    _serve(g)
    assert g.tuner.stats["from_store"] == 2, g.tuner.stats
    assert g.tuner.stats["offline_fallback"] == 0 and g.tuner.stats["tuned"] == 0
    assert g.tuner.last_choice["why"] == "exact entry in the store"
    assert recorder().flush() == 0
    from tuner.kernels import get_kernel

    problem = CALLS[0][0]
    assert g.explain(problem, get_kernel("rmsnorm").make_inputs(problem, "triton", 0)).startswith("hit (")
