"""The production loop end to end on the CPU (Triton interpreter): production runs a registered kernel in
record mode; `tuner misses` lists what it missed; `tuner study from-misses` writes a study; `tuner study
run` tunes it, `tuner study export` ships it, `tuner cache import` loads it into production's store; the
same calls are then exact hits and record nothing more."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

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
    assert tomllib.loads(study.read_text(encoding="utf-8"))["tasks"][0]["problems"] == [
        {"M": 8, "N": 64, "eps": 1e-6}
    ]
    args = ["--trials", "2", "--strategy", "random", "--finalists", "1", "--output", str(tmp_path / "out")]
    assert cli(["study", "from-misses", "--out", str(study), *args]) == 0
    doc = tomllib.loads(study.read_text(encoding="utf-8"))
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


USER_MODULE = """
import numpy as np

import tuner
from tuner import PowerOfTwo, SearchSpace


def _bench(call):  # a deterministic timer: block 128 is the fastest
    cfg = call()
    return 1e-3 * (1 + abs(cfg.bit_length() - 8))


@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 256)]), key=["n"], name="user_scale", bench=_bench)
def scale(x, n, *, block):
    return block


def make_inputs(kernel, fields, dtypes):
    assert kernel == "user_scale"
    return scale, (np.ones(fields["n"], dtype=dtypes[0]), fields["n"]), {}
"""


def test_decorated_function_loop_with_an_input_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    (tmp_path / "user_ops_mod.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    monkeypatch.setenv("TUNER_MODE", "record")
    recorder().reset()
    import user_ops_mod as m

    for n, c in ((100, 2), (300, 1)):
        for _ in range(c):
            assert m.scale(np.ones(n, dtype=np.float32), n) == 64  # the space default
    recorder().flush()
    assert {r.key.fields_dict["n"]: r.calls for r in read_misses()} == {100: 2, 300: 1}

    study = tmp_path / "user.toml"
    fac = ["--factory", "user_ops_mod:make_inputs", "--strategy", "random", "--trials", "5"]
    assert cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
    assert "--executor tuner.studies._from_misses:run_decorated" in capsys.readouterr().out
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    assert cli([*run, "--executor", "tuner.studies._from_misses:run_decorated"]) == 0
    shipped = tmp_path / "user-cache.json"
    assert cli(["study", "export", str(study), "--out", str(shipped)]) == 0  # as docs/production.md says
    from_store = tmp_path / "user-store.json"
    assert cli(["cache", "export", "--kernel", "user_scale", "--out", str(from_store)]) == 0
    assert (
        json.loads(shipped.read_text(encoding="utf-8"))["entries"]
        == json.loads(from_store.read_text(encoding="utf-8"))["entries"]
    )

    # production elsewhere (a fresh home) with the shipped file: exact hits, nothing recorded
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "prod"))
    monkeypatch.setenv("TUNER_CACHE_FILE", str(shipped))
    recorder().reset()
    m.scale.cache_clear()
    before = dict(m.scale.tuner.stats)
    assert m.scale(np.ones(100, dtype=np.float32), 100) == 128
    assert m.scale.tuner.last_choice["why"].startswith("exact entry in")
    assert m.scale(np.ones(300, dtype=np.float32), 300) == 128
    assert m.scale.tuner.stats["from_file"] - before["from_file"] == 2
    assert m.scale.tuner.stats["tuned"] == before["tuned"]
    assert recorder().flush() == 0
