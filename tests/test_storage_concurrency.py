"""Issue 14 item 1: 8 processes open one fresh store at the same moment (4 runtime callers, 4 study
workers), on SQLite and on PostgreSQL: no process fails, every call and every study task completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pg import fresh_database
from tests.test_studies import write_study

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def pg_url():
    yield from fresh_database()


def _race(url: str, tmp_path: Path, *, n_runtime: int = 4, n_study: int = 4, calls: int = 6) -> list[dict]:
    study = write_study(tmp_path, name="race", n_m=3, n_k=2, budget=3)
    go = tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TUNER_HOME": str(tmp_path / "home"),
    }
    env.pop("TUNER_STORAGE", None)
    roles = [("runtime", str(calls))] * n_runtime + [("study", str(study))] * n_study
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "_storage_race.py"), role, url, str(go), arg],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        for role, arg in roles
    ]
    deadline = time.monotonic() + 120  # start them together, once all have imported and wait
    while len(list(tmp_path.glob("go.ready.*"))) < len(procs) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    go.touch()
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [(rc, (err.strip().splitlines() or [""])[-1][:300]) for rc, _, err in outs if rc != 0]
    assert failed == [], f"{len(failed)} of {len(procs)} processes failed: {failed}"
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outs]


def _check(url: str, results: list[dict], calls: int = 6) -> None:
    from tuner.runtime import ConfigCache
    from tuner.studies import DONE, TaskBoard

    assert sorted(r["role"] for r in results) == ["runtime"] * 4 + ["study"] * 4
    assert all(r["calls"] == calls for r in results if r["role"] == "runtime")
    rows = TaskBoard(url).rows("race")
    assert len(rows) == 6 and all(r.status == DONE for r in rows), [(r.key, r.status) for r in rows]
    assert {tuple(sorted(e.key.fields_dict.items())) for e in ConfigCache(url).entries("race_kernel")} == {
        (("n", i),) for i in range(3)
    }


@pytest.mark.slow
def test_eight_processes_on_a_fresh_sqlite_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    _check(url, _race(url, tmp_path))


@pytest.mark.slow
@pytest.mark.postgres
def test_eight_processes_on_a_fresh_postgres_store(pg_url: str, tmp_path: Path) -> None:
    _check(pg_url, _race(pg_url, tmp_path))
