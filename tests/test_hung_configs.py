"""A config that hangs (a deadlocked kernel, a spinning loop) while a decorated function tunes a key.

The hang here is real: the tuned function blocks on an event (in the tuning thread) or sleeps in a
child process; nothing is mocked, and no assertion is on a clock beyond generous bounds."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)


def test_threads_waiting_for_a_hung_tuning_take_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    """Was: the other threads of the process waited on the key's lock for ever (no lease among threads)."""
    import tuner
    from tuner import SearchSpace

    release = threading.Event()
    hung = threading.Event()
    tuning_thread: list[threading.Thread] = []
    calls = [0]

    def f(n: int, *, b: int) -> int:
        if threading.current_thread() in tuning_thread:
            calls[0] += 1
            if calls[0] == 2:  # the second config the tuning times hangs
                hung.set()
                release.wait()
        return b

    space = SearchSpace.from_configs([{"b": 1}, {"b": 2}, {"b": 3}])
    g = tuner.autotune(space, key=["n"], budget=3, storage=False, lease_s=1.0)(f)
    out: dict[str, Any] = {}
    t1 = threading.Thread(target=lambda: out.setdefault("tuner", g(7)), daemon=True)
    tuning_thread.append(t1)
    caplog.set_level(logging.WARNING, logger="tuner.runtime._decorator")
    try:
        t1.start()
        assert hung.wait(120)
        waiters = [
            threading.Thread(target=lambda i=i: out.setdefault(i, g(7)), daemon=True) for i in range(2)
        ]
        for w in waiters:
            w.start()
        for w in waiters:
            w.join(timeout=120)
        assert not any(w.is_alive() for w in waiters), "a thread still waits for the hung tuning"
        default = space.default()
        assert out[0] == default["b"] and out[1] == default["b"], out
        assert "finished no trial for 1 s (lease_s)" in caplog.text, caplog.text
        assert g.tuner.last_choice["why"].startswith("online: not waited for this process's tuning")
        assert t1.is_alive()  # the tuning itself is still stuck
    finally:
        release.set()
        t1.join(timeout=120)
    assert not t1.is_alive() and out["tuner"] in (1, 2, 3)
    assert g(7) == out["tuner"]  # once the tuning ended, its winner is used


WORKER = Path(__file__).with_name("_crash_worker.py")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    from .pg import sqlite_or_postgres

    yield from sqlite_or_postgres(request.param, tmp_path / "store.db")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _start(url: str, folder: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, str(folder), name, "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        encoding="utf-8",
    )


def test_a_config_that_hung_past_the_lease_is_not_timed_by_the_next_owner(
    store_url: str, tmp_path: Path
) -> None:
    """Was: the process that took the claim over after the hung owner's lease ran out timed the same
    config, and hung in it too; so did every process after it."""
    from tuner.runtime import ConfigCache

    ConfigCache(store_url)  # the schema, once
    first = _start(store_url, tmp_path, "first")
    others: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "first-hangs").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first process never reached the hanging config"
            time.sleep(0.05)
        others.append(_start(store_url, tmp_path, "second"))
        try:
            out, err = others[0].communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the second process hangs too (in b=2: {(tmp_path / 'second-hangs').exists()})")
        assert others[0].returncode == 0, err[-3000:]
        assert not (tmp_path / "second-hangs").exists()
        assert json.loads(out.strip().splitlines()[-1])["b"] == 1, out
        assert "not timed again" in err, err[-3000:]
        # the hung config is recorded as timed out; the winner is stored, and a third process hits it
        rows = _marks(store_url)
        configs = [c for c, _ in rows]
        assert configs == [{"b": 2}] and "timed out" in rows[0][1], rows
        others.append(_start(store_url, tmp_path, "third"))
        out, err = others[1].communicate(timeout=120)
        assert others[1].returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["b"] == 1, out
    finally:
        for p in [first, *others]:
            if p.poll() is None:
                p.kill()
            p.communicate()


def _crash_run(url: str, folder: Path, name: str, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), url, str(folder), name, how],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        encoding="utf-8",
    )


def _marks(url: str) -> list[tuple[Any, str]]:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        rows = c.execute(
            text("SELECT config, error FROM tuner_measurements WHERE status IN ('timeout', 'crashed')")
        ).all()
    eng.dispose()
    return [(json.loads(r[0]) if isinstance(r[0], str) else r[0], r[1]) for r in rows]


@pytest.mark.parametrize("how", ["kill", "abort"])
def test_a_config_that_kills_its_process_is_timed_again_once_then_skipped(
    store_url: str, tmp_path: Path, how: str
) -> None:
    """Was: the mark of an owner that died in the timing was deleted by every process that took the claim
    over, which timed the config again and died in it too: workers restarted on a crash (systemd, k8s)
    died on the same config for ever and never served. Now a config is timed again once after a death
    (the first could be an unrelated kill), and after the second it is a failure that no one times."""
    if how == "abort" and "postgresql" in store_url:
        pytest.skip("the signal's kind does not matter to the store; SQLite covers it")
    from tuner.runtime import ConfigCache

    ConfigCache(store_url)  # the schema, once
    first = _crash_run(store_url, tmp_path, "first", how)
    assert first.returncode != 0 and (tmp_path / "first-crashes").exists(), first.stderr[-3000:]
    # one death may be unrelated to the config (an OOM kill of the process): it is timed again
    second = _crash_run(store_url, tmp_path, "second", how)
    assert second.returncode != 0 and (tmp_path / "second-crashes").exists(), second.stderr[-3000:]
    third = _crash_run(store_url, tmp_path, "third", how)
    assert third.returncode == 0, third.stderr[-3000:]
    assert not (tmp_path / "third-crashes").exists()
    assert json.loads(third.stdout.strip().splitlines()[-1])["b"] == 1, third.stdout
    assert "crashed the process while timed (2 times)" in third.stderr, third.stderr[-3000:]
    [(config, error)] = _marks(store_url)
    assert config == {"b": 2} and error.startswith("crashed the process while timed (2 times)"), error
    # a later tuning of the key skips it too, without counting a death again: the stored winner is
    # removed first, or the fourth process would hit it and tune nothing (and this could not fail)
    from sqlalchemy import create_engine, text

    eng = create_engine(store_url)
    with eng.begin() as c:
        assert c.execute(text("DELETE FROM tuner_cache_entries")).rowcount == 1
    eng.dispose()
    fourth = _crash_run(store_url, tmp_path, "fourth", how)
    assert fourth.returncode == 0 and not (tmp_path / "fourth-crashes").exists(), fourth.stderr[-3000:]
    assert json.loads(fourth.stdout.strip().splitlines()[-1])["b"] == 1, fourth.stdout
    assert "not timed again" in fourth.stderr, fourth.stderr[-3000:]
    [(config, error)] = _marks(store_url)
    assert error.startswith("crashed the process while timed (2 times)"), error


def test_a_config_whose_timing_was_killed_once_is_not_banned(store_url: str, tmp_path: Path) -> None:
    """A death in a config's timing may have another cause (an OOM kill of the process, a `kill`): the
    next owner times the config again, and once that timing returns nothing of the death is kept."""
    from sqlalchemy import create_engine, text

    from tuner.runtime import ConfigCache

    ConfigCache(store_url)
    first = _crash_run(store_url, tmp_path, "first", "exit")
    assert first.returncode == 70 and (tmp_path / "first-crashes").exists(), first.stderr[-3000:]
    second = _crash_run(store_url, tmp_path, "second", "none")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "killed the process that timed it (1 time(s)): timed again" in second.stderr, second.stderr
    assert _marks(store_url) == []
    eng = create_engine(store_url)
    with eng.connect() as c:
        rows = c.execute(text("SELECT config, status FROM tuner_measurements")).all()
    eng.dispose()
    timed = sorted((json.loads(r[0]) if isinstance(r[0], str) else r[0])["b"] for r in rows if r[1] == "ok")
    assert timed == [1, 2, 3], rows


def test_threads_wait_with_the_thread_that_waits_for_another_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: while another process tuned the key (its claim renewed, within its lease), the thread of
    this process that waited for it held the key's lock with no trial of its own, so the other threads
    gave up after `lease_s` with the offline fallback and a false warning that a config hangs. They wait
    as that thread does, and all get the winner."""
    import tuner
    from tuner import SearchSpace
    from tuner.runtime import ConfigCache

    url = f"sqlite:///{tmp_path / 'store.db'}"
    space = SearchSpace.from_configs([{"b": 1}, {"b": 2}, {"b": 3}])  # b=3 wins; the fallback is b=2

    def f(n: int, *, b: int) -> int:
        return b

    # lease_s: far above one round of the waiting thread's loop (a claim attempt, two reads, <= 0.5 s)
    g = tuner.autotune(
        space, key=["n"], budget=3, storage=url, lease_s=4.0, bench=lambda call: 1e-3 / call()
    )(f)
    db = ConfigCache(url)
    key_hash = g.tuner.keys.full((7,), {}).hash
    assert db.claim(key_hash, "another-process", 600.0)  # its owner runs (this very pid), well in lease
    caplog.set_level(logging.WARNING, logger="tuner.runtime._decorator")
    out: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: out.setdefault(i, g(7)), daemon=True) for i in range(3)]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 10.0  # past two leases
        while time.monotonic() < deadline and len(out) < 2:  # the old code: two gave up after a lease
            time.sleep(0.1)
        assert out == {}, f"threads stopped waiting for the other process's tuning: {out}"
    finally:
        db.release(key_hash, "another-process")  # its tuning ends: this process tunes the key
        for th in threads:
            th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert out == {0: 3, 1: 3, 2: 3}, out
    assert "finished no trial" not in caplog.text, caplog.text


RETUNE_WORKER = Path(__file__).with_name("_retune_crash_worker.py")


class _RetuneServer:
    """RETUNE_WORKER's fork server: each run is a child forked from an interpreter that imported torch and
    triton (tuner imported fresh in it), instead of a cold interpreter that pays their import each time."""

    def __init__(self, folder: Path) -> None:
        self.stderr = folder / "server.stderr"
        with open(self.stderr, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(RETUNE_WORKER), "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=_env(),
                start_new_session=True,
                encoding="utf-8",
            )

    def run(self, argv: list[str], env: dict[str, str], folder: Path) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        out, err = folder / "run.stdout", folder / "run.stderr"
        req = {"argv": argv, "env": env, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 240)
        if not ready:
            self.close()
            pytest.fail(f"the run {argv} did not end within 240 s")
        line = self.proc.stdout.readline()
        assert line, f"the fork server ended: {self.stderr.read_text(encoding='utf-8')[-3000:]}"
        reply = json.loads(line)
        assert "refused" not in reply, f"the fork server holds tuner modules or threads: {reply['refused']}"
        return subprocess.CompletedProcess(
            argv, reply["rc"], out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")
        )

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()


@pytest.fixture(scope="module")
def retune_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_RetuneServer]:
    server = _RetuneServer(tmp_path_factory.mktemp("retune-server"))
    yield server
    server.close()


def _retune_run(
    server: _RetuneServer, url: str, folder: Path, name: str, crash: bool, clear: bool
) -> subprocess.CompletedProcess[str]:
    return server.run(
        [url, str(folder), name, str(int(crash)), str(int(clear))],
        {"TUNER_HOME": str(folder / "home")},
        folder,
    )


def _blocks(out: str) -> list[int]:
    return [json.loads(line)["block"] for line in out.strip().splitlines() if line.startswith("{")]


def test_a_drop_in_kernels_retune_skips_a_config_that_crashed_twice(
    store_url: str, tmp_path: Path, retune_server: _RetuneServer
) -> None:
    """Was: taking a key out of a `triton.autotune` drop-in kernel's `.cache` tuned it again with no
    claim: the config recorded as crashed (status `crashed`) was timed again and killed the process."""
    if "postgresql" in store_url:
        pytest.skip(
            "the store's part (marks, the count of deaths, the skip) is the decorator's, which "
            "test_a_config_that_kills_its_process_is_timed_again_once_then_skipped runs on PostgreSQL; "
            "test_a_drop_in_kernels_retune_marks_its_timings runs the retune's on it"
        )
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from tuner.runtime import ConfigCache

    ConfigCache(store_url)
    for name in ("first", "second"):  # BLOCK=32 kills the process that times it, twice
        run = _retune_run(retune_server, store_url, tmp_path, name, crash=True, clear=False)
        assert run.returncode == 70 and (tmp_path / f"{name}-crashes").exists(), run.stderr[-3000:]
    third = _retune_run(retune_server, store_url, tmp_path, "third", crash=True, clear=True)
    assert not (tmp_path / "third-crashes").exists(), "the retune timed the crashed config again"
    assert third.returncode == 0, third.stderr[-3000:]
    assert _blocks(third.stdout) == [16, 16], third.stdout
    [(config, error)] = _marks(store_url)
    assert config["BLOCK"] == 32 and error.startswith("crashed the process while timed (2 times)"), error


def test_a_drop_in_kernels_retune_marks_its_timings(
    store_url: str, tmp_path: Path, retune_server: _RetuneServer
) -> None:
    """Was: the retune of a key taken out of `.cache` timed its configs unmarked: a config that killed
    the process there was never counted, and every restarted process that retuned died in it again. Now
    the retune holds the key's claim and marks each timing: after two deaths the config is skipped."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from tuner.runtime import ConfigCache

    ConfigCache(store_url)
    first = _retune_run(
        retune_server, store_url, tmp_path, "clean", crash=False, clear=False
    )  # the key is stored
    assert first.returncode == 0 and _blocks(first.stdout) == [32], first.stderr[-3000:]
    for name in ("first", "second"):  # each hits the store, then dies in the retune's timing of BLOCK=32
        run = _retune_run(retune_server, store_url, tmp_path, name, crash=True, clear=True)
        assert run.returncode == 70 and (tmp_path / f"{name}-crashes").exists(), run.stderr[-3000:]
        assert _blocks(run.stdout) == [32], run.stdout
    third = _retune_run(retune_server, store_url, tmp_path, "third", crash=True, clear=True)
    assert not (tmp_path / "third-crashes").exists(), "the retune timed the crashed config a third time"
    assert third.returncode == 0, third.stderr[-3000:]
    assert _blocks(third.stdout) == [32, 16], third.stdout
    assert "crashed the process while timed (2 times)" in third.stderr, third.stderr[-3000:]


def _dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_note_excuses_only_the_mark_it_was_written_for(tmp_path: Path, monkeypatch) -> None:
    """A mark whose timing returned in a store outage is noted (`_returned`) and deleted without counting
    by the next owner. The note is found by the mark's row id, and a row id can be another mark's later:
    SQLite gives the id of a deleted last row to the next one, and a note outlives its mark where the mark
    went another way. Was: the later mark, of a process that died in its timing, was taken for the noted
    one and deleted without counting (its config timed again without end, never `crashed`). Now the note
    names the mark's owner, and only that owner's mark is excused."""
    from sqlalchemy import update

    from tuner.runtime import ConfigCache, _returned
    from tuner.runtime._db import IN_FLIGHT
    from tuner.runtime._key import canon
    from tuner.storage._schema import MeasurementRow
    from tuner.store import TaskContext

    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    db = ConfigCache(f"sqlite:///{tmp_path / 'store.db'}")
    task = TaskContext("k", {"n": 1}, "cpu", {}, "")
    cfg = {"b": 2}
    first = db.mark_measuring(task, "space", cfg, "key", "owner-a", 600.0)
    _returned.note(db.store.url, first, "owner-a")  # its timing returned while the store was down
    db.unmark(first)  # the mark went another way; its process died before it forgot the note
    later = db.mark_measuring(task, "space", cfg, "key", "owner-b", 600.0)
    assert later == first  # SQLite reuses the id of the deleted last row
    with db.store.session() as s:  # owner-b's process died in the timing
        st = {
            "key": "key",
            IN_FLIGHT: "owner-b",
            "host": _own_host(),
            "pid": _dead_pid(),
            "since": time.time(),
        }
        s.execute(update(MeasurementRow).where(MeasurementRow.id == later).values(stats=st))
    hung, crashed = db.hung_configs(task.task_id, "key", "owner-c", 600.0)
    assert (hung, crashed) == ({}, {canon(cfg): 1})  # a timing that killed its process: counted


def _own_host() -> str:
    from tuner.storage._owner import HOST

    return HOST
