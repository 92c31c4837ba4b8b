"""A PostgreSQL store that goes down and comes back while tuner works on it: a server of the test's own
(tests/pg_private.py) is stopped with an immediate shutdown (as a crash) at a chosen moment and started
again. Skipped where PostgreSQL's server binaries are not installed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.pg_private import PrivateServer, private_server


@pytest.fixture
def pg() -> Iterator[PrivateServer]:
    yield from private_server()


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    from tuner.runtime._sources import close_stores

    close_stores()
    yield
    close_stores()


def _rows(url: str, sql: str) -> list[Any]:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return list(c.execute(text(sql)).all())
    finally:
        eng.dispose()


def _statuses(url: str) -> list[tuple[str, str]]:
    return [
        (str(k), str(s))
        for k, s in _rows(url, "SELECT config_key, status FROM tuner_measurements ORDER BY id")
    ]


def _claims(url: str) -> int:
    return len(_rows(url, "SELECT key_hash FROM tuner_cache_claims"))


def test_a_first_call_tuning_through_an_outage_leaves_no_mark_and_no_claim(
    pg: PrivateServer, fresh_runtime: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server goes down while the first call of a key times config b=1 (the fastest). The call
    returns its result, tuned in memory. Before each timing the claim's owner marks the config in the
    store (a timing that never returns is a hang the next owner must not repeat), and deletes the mark
    when the timing returns; here that deletion failed. Was: the mark stayed for good, so once the claim's
    lease ran out the next tuning of the key (another process, or this one after `cache_clear`) took b=1
    for a hung config, never timed it, and stored b=2 as the winner for the fleet; and the claim of the key,
    which the call could not release either, stayed until its lease ran out. Now the process deletes both
    once the server is back."""
    import tuner
    from tuner.runtime import _sources, _tuning

    monkeypatch.setattr(_sources, "STORE_RETRY_S", 0.5)
    if hasattr(_tuning, "CLEANUP_RETRY_S"):
        monkeypatch.setattr(_tuning, "CLEANUP_RETRY_S", 0.2)
    timed: list[int] = []  # every run of the function
    benched: list[int] = []  # the configs timed
    last: dict[str, int] = {}

    def bench(call: Any) -> float:
        call()
        benched.append(last["b"])
        return 1e-3 * last["b"]

    @tuner.autotune(
        tuner.SearchSpace.from_configs([{"b": b} for b in (1, 2, 3, 4)]),
        key=["n"],
        bench=bench,
        budget=4,
        storage=pg.url,
        lease_s=1.0,
    )
    def f(n: int, *, b: int) -> int:
        timed.append(b)
        last["b"] = b
        if b == 1 and timed.count(1) == 1:
            pg.stop()
        return n * 2

    assert f(11) == 22
    assert sorted(benched) == [1, 2, 3, 4] and f.tuner.last_choice["config"] == {"b": 1}
    pg.start()
    deadline = time.monotonic() + 10  # (not an assertion: how long the old code is given to clean up)
    while (any(s != "ok" for _, s in _statuses(pg.url)) or _claims(pg.url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    # The claim the call could not release is gone too: it kept every other process's first call of the
    # key waiting for a tuning that was not running until its lease ran out (lease_s, 120 s by default).
    assert _claims(pg.url) == 0
    time.sleep(1.5)  # the claim's lease (1 s) and the mark's age are past: another owner may tune the key
    f.cache_clear()
    benched.clear()
    out: list[int] = []
    th = threading.Thread(target=lambda: out.append(f(11)))  # another thread: another owner of the claim
    th.start()
    th.join(30)
    assert out == [22]
    assert sorted(benched) == [1, 2, 3, 4], f"b=1 was not timed again (taken for a hang): {benched}"
    assert f.tuner.last_choice["config"] == {"b": 1}, f.tuner.last_choice
    assert all(s == "ok" for _, s in _statuses(pg.url)), _statuses(pg.url)


OUTAGE_WORKER = Path(__file__).with_name("_outage_worker.py")


def _outage_run(pg: PrivateServer, folder: Path, stop: bool) -> dict[str, Any]:
    """One process tuning the key (tests/_outage_worker.py); with `stop`, the server goes down while it
    times b=1 and stays down until the process has exited."""
    import json
    import os
    import subprocess
    import sys

    for name in ("timing", "go"):
        (folder / name).unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(OUTAGE_WORKER.parent.parent)}
    cmd = [sys.executable, str(OUTAGE_WORKER), pg.url, str(folder), "stop" if stop else "none"]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8"
    )
    try:
        if stop:
            deadline = time.monotonic() + 120
            while not (folder / "timing").exists():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "b=1 was never timed"
                time.sleep(0.05)
            pg.stop()
            (folder / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    if stop:
        pg.start()
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_processes_that_exit_during_outages_do_not_make_a_config_crashed(
    pg: PrivateServer, tmp_path: Path
) -> None:
    """Two processes in turn time config b=1 (the fastest) while the server is down, and exit (normally)
    before it is back: neither could delete its mark of the timing, which returned. Was: the next process
    took each mark left by a dead process for a timing that killed its process, timed b=1 once again
    after the first, and after the second recorded it `crashed` and never timed it again, storing the
    slower b=2 as the key's winner for the fleet. Now a mark whose timing returned is known as such
    (a note in TUNER_HOME) and deleted without counting, so b=1 is timed and wins."""
    first = _outage_run(pg, tmp_path, stop=True)
    assert first["b"] == 1, first  # tuned in memory while the server was down
    second = _outage_run(pg, tmp_path, stop=True)
    assert 1 in second["timed"], second
    third = _outage_run(pg, tmp_path, stop=False)
    assert 1 in third["timed"] and third["b"] == 1, third
    bad = [(k, s) for k, s in _statuses(pg.url) if s != "ok"]
    assert not bad, bad
