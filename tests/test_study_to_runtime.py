"""A study's exported cache file is an exact hit for `tuner.kernel`: one real task (rmsnorm through the
Triton interpreter, 2 trials) is tuned, exported, and the kernel called offline with the file picks the
exported config from it (not a fallback), and says so in `explain`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests._shared import made_once
from tuner.cli import main as cli

pytest.importorskip(
    "torch", reason="runs the Triton rmsnorm through the interpreter: needs the kernels extra"
)
pytest.importorskip(
    "triton", reason="runs the Triton rmsnorm through the interpreter: needs the kernels extra"
)

PROBLEM = {"M": 8, "N": 64}


def _study(tmp: Path) -> Path:
    p = tmp / "tiny.toml"
    p.write_text(
        f"""
[study]
name = "tiny"
device = "cpu"
backends = ["triton"]
dtypes = ["float32"]
strategy = "random"
seed = 0
budget = {{ trials = 2 }}
finalists = 1
output = "{tmp / "out"}"

[[tasks]]
kernel = "rmsnorm"
problems = [{{ M = {PROBLEM["M"]}, N = {PROBLEM["N"]} }}]
""",
        encoding="utf-8",
    )
    return p


def _run_study(tmp: Path) -> None:
    import os

    old = os.environ.get("TUNER_HOME")
    os.environ["TUNER_HOME"] = str(tmp / "home")
    try:
        assert cli(["study", "run", str(_study(tmp)), "--quiet"]) == 0
    finally:
        if old is None:
            os.environ.pop("TUNER_HOME", None)
        else:
            os.environ["TUNER_HOME"] = old


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study's exported file. The study runs once per test run: under pytest-xdist, the first worker
    to get here runs it and the others read its file (each test writes only files of its own names beside
    it)."""
    return made_once(tmp_path_factory, "study-to-runtime", _run_study) / "out" / "cache.json"


def test_exported_study_is_an_offline_hit(exported: Path) -> None:
    from tuner.kernels import get_kernel

    import tuner
    from tuner.runtime import kernel_cache_key

    entries = json.loads(exported.read_text(encoding="utf-8"))["entries"]
    assert len(entries) == 1
    e = entries[0]
    assert e["kernel"] == "rmsnorm" and e["device"] == "cpu" and e["dtypes"] == ["float32"]

    spec = get_kernel("rmsnorm")
    problem = {**PROBLEM, "dtype": "float32"}  # eps left out: the key fills it from the kernel's default
    inputs = spec.make_inputs(problem, "triton", 1)
    f = tuner.kernel(
        "rmsnorm", backend="triton", mode="offline", storage=False, cache=tuner.load_cache(exported)
    )

    # Both sides built the key with the one function: the file's key is the call's key.
    ck = f.tuner.full_key((problem, inputs), {})
    assert ck == kernel_cache_key("rmsnorm", problem, backend="triton", device="cpu")
    assert ck.to_json() == {k: e[k] for k in ("kernel", "source_hash", "key", "dtypes", "device", "versions")}

    why = f.explain(problem, inputs)
    assert why.startswith("hit (") and str(exported) in why, why
    out = f(problem, inputs)
    assert f.tuner.stats["from_file"] == 1 and f.tuner.stats["offline_fallback"] == 0
    assert f.tuner.last_choice["config"] == e["config"]
    assert f.tuner.last_choice["why"].startswith("exact entry in")
    rtol, atol = spec.tolerance("float32")
    np.testing.assert_allclose(np.asarray(out), spec.reference(problem, inputs), rtol=rtol, atol=atol)
    # The second call is the in-memory hit path.
    f(problem, inputs)
    assert f.tuner.stats["from_file"] == 1
    assert f.explain(problem, inputs).startswith("hit (in memory)")


def test_other_problem_or_versions_is_not_a_silent_hit(exported: Path) -> None:
    from tuner.kernels import get_kernel

    import tuner

    spec = get_kernel("rmsnorm")
    other = {"M": 16, "N": 64, "dtype": "float32"}
    inputs = spec.make_inputs(other, "triton", 1)
    f = tuner.kernel("rmsnorm", backend="triton", mode="offline", storage=False, cache=str(exported))
    assert f.explain(other, inputs).startswith("miss: no entry for key")
    f(other, inputs)  # offline: the nearest cached key (the exported one), never tuning
    assert f.tuner.stats["offline_fallback"] == 1 and f.tuner.stats["tuned"] == 0
    assert "nearest cached key" in f.tuner.last_choice["why"]

    stale = json.loads(exported.read_text(encoding="utf-8"))
    stale["entries"][0]["versions"]["triton"] = "0.0.1"
    path = exported.parent / "stale.json"
    path.write_text(json.dumps(stale), encoding="utf-8")
    problem = {**PROBLEM, "dtype": "float32"}
    g = tuner.kernel("rmsnorm", backend="triton", mode="offline", storage=False, cache=str(path))
    why = g.explain(problem, spec.make_inputs(problem, "triton", 1))
    assert why.startswith("miss:") and "versions differ" in why, why


def test_online_call_tunes_once_and_stores(tmp_path: Path) -> None:
    from tuner.kernels import get_kernel

    import tuner

    spec = get_kernel("rmsnorm")
    problem = {"M": 4, "N": 32, "dtype": "float32"}
    inputs = spec.make_inputs(problem, "triton", 0)
    url = f"sqlite:///{tmp_path / 'rt.db'}"
    f = tuner.kernel("rmsnorm", budget=2, storage=url, seed=0, bench=lambda call: (call(), 1e-3)[1])
    f(problem, inputs)
    assert f.tuner.stats["tuned"] == 1
    g = tuner.kernel("rmsnorm", storage=url, mode="offline")
    assert g.explain(problem, inputs).startswith("hit (store)")


def _use_script() -> object:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "studies" / "quickstart_use.py"
    spec = importlib.util.spec_from_file_location("quickstart_use", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_use_script_hits_and_checks(exported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    use = _use_script()
    study = str(exported.parent.parent / "tiny.toml")
    assert use.main([study, "--cache", str(exported)]) == 0  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "rmsnorm [triton]" in out and "cache hit (exact entry in" in out and "matches the reference" in out

    stale = json.loads(exported.read_text(encoding="utf-8"))
    stale["entries"][0]["source_hash"] = "0" * 32  # the kernel was edited since: a miss, exit 1
    path = exported.parent / "edited.json"
    path.write_text(json.dumps(stale), encoding="utf-8")
    assert use.main([study, "--cache", str(path)]) == 1  # type: ignore[attr-defined]
    captured = capsys.readouterr()
    assert "NOT a cache hit" in captured.out and "kernel source changed" in captured.err
    assert use.main([study, "--cache", str(exported.parent / "absent.json")]) == 2  # type: ignore[attr-defined]
