"""Ctrl-C (or SIGTERM's KeyboardInterrupt) arriving while a decorated call or a cache import writes a
SQLite store: the interrupt goes on to the caller, and nothing of it stays behind in the live process. No
claim of the key is left for this process's next call (or another process) to wait out its lease on, and
the file is not left write-locked while the interrupt's traceback lives (a notebook keeps it in
`sys.last_traceback`). Each interrupt is injected at one chosen point, not by timing."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, ConfigCache
from tuner.runtime._db import owner_id
from tuner.runtime._sources import close_stores
from tuner.storage import engine_for

SPACE = SearchSpace([PowerOfTwo("block", 16, 128)])
X = np.arange(8.0)


@pytest.fixture(autouse=True)
def _fresh_stores() -> Iterator[None]:
    close_stores()
    yield
    close_stores()


def make(url: str) -> Any:
    @tuner.autotune(SPACE, key=["n"], budget=2, strategy="random", storage=url, bench=lambda call: 1e-3)
    def scale(x, n, *, block):
        return x * 2.0

    return scale


def claims(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT key_hash, owner FROM tuner_cache_claims").fetchall()


def write_locked(db: Path) -> bool:
    """Whether another connection cannot take the write lock of `db` now."""
    c = sqlite3.connect(db, timeout=0.2)
    try:
        c.execute("BEGIN IMMEDIATE")
        c.rollback()
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        c.close()


def test_interrupt_just_after_the_claim_releases_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "t.db"
    f = make(f"sqlite:///{db}")
    claim = ConfigCache.claim

    def claim_then_interrupt(self: ConfigCache, *a: Any, **k: Any) -> bool:
        assert claim(self, *a, **k)  # committed: the claim row is in the store
        raise KeyboardInterrupt  # before `claim` returns to the caller

    monkeypatch.setattr(ConfigCache, "claim", claim_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        f(X, 8)
    assert claims(db) == []  # left there, the next call (here or elsewhere) waited out its 120 s lease
    monkeypatch.setattr(ConfigCache, "claim", claim)
    t0 = time.monotonic()
    np.testing.assert_array_equal(f(X, 8), X * 2.0)
    assert time.monotonic() - t0 < 10 and f.tuner.stats["tuned"] == 1


def test_interrupt_inside_the_release_releases_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "t.db"
    f = make(f"sqlite:///{db}")
    release = ConfigCache.release
    seen: list[list[tuple[str, str]]] = []

    def interrupted_once(self: ConfigCache, key_hash: str, owner: str) -> None:
        if not seen:
            seen.append(claims(db))
            raise KeyboardInterrupt  # inside the release, before its DELETE is committed
        release(self, key_hash, owner)

    monkeypatch.setattr(ConfigCache, "release", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        f(X, 8)
    assert len(seen) == 1 and len(seen[0]) == 1  # the tuning held its claim, and was interrupted
    assert claims(db) == []
    np.testing.assert_array_equal(f(X, 8), X * 2.0)
    assert f.tuner.stats["from_store"] == 1  # its winner was stored before the release


def test_a_claim_left_by_this_thread_is_taken_back_at_once(tmp_path: Path) -> None:
    """A claim of this very thread (left by an interrupted call that could not release it) does not
    make the thread's next call of the key wait out the lease: the thread is not tuning that key."""
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    f = make(url)
    key = f.tuner.full_key((X, 8), {}).hash
    done: list[Any] = []

    def call() -> None:
        assert ConfigCache(url).claim(key, owner_id(), 600.0)  # as an interrupted call of this thread left it
        done.append(f(X, 8))

    t = threading.Thread(target=call, daemon=True)  # old code: waits 600 s in there
    t.start()
    t.join(20)
    assert done and f.tuner.stats["tuned"] == 1
    assert claims(db) == []


def _entry(i: int, t: float) -> CacheEntry:
    key = CacheKey.make("kern", "abcdef12", {"n": 2**i}, ("float32",), "cpu", {"python": "3"})
    return CacheEntry(key, {"block": 16}, t, 0.0, "2024-01-01T00:00:00Z", "fp")


def test_interrupt_in_a_read_after_a_write_leaves_no_write_lock(tmp_path: Path) -> None:
    """`tuner cache import` merges in one transaction: a write (expired claims), then a read of the
    existing entries. Ctrl-C while that read's result is set up: SQLAlchemy throws the connection away
    under a statement with rows left, and SQLite kept the transaction, with its write lock, until the
    interrupt's traceback was dropped. Now the lock goes with the interrupt, and the import is all or
    nothing."""
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    cache = ConfigCache(url)
    cache.merge([_entry(i, 1.0) for i in range(3)])
    before = sorted((e.key.hash, e.time_s) for e in cache.entries())
    fired: list[str] = []

    def interrupt(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if (
            not fired
            and statement.lstrip().upper().startswith("SELECT")
            and "tuner_cache_entries" in statement
        ):
            fired.append(statement)
            raise KeyboardInterrupt  # after the statement ran, before its result is read

    eng = engine_for(url)
    event.listen(eng, "after_cursor_execute", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            cache.merge([_entry(i, 0.5) for i in range(6)])
    finally:
        event.remove(eng, "after_cursor_execute", interrupt)
    assert fired and info.value.__traceback__ is not None  # the traceback (and its frames) still live
    assert not write_locked(db)
    assert sorted((e.key.hash, e.time_s) for e in cache.entries()) == before  # nothing of the import
    counts = cache.merge([_entry(i, 0.5) for i in range(6)])
    assert (counts.added, counts.replaced) == (3, 3)


def test_interrupt_in_a_commit_of_optimize_leaves_no_write_lock(tmp_path: Path) -> None:
    """Ctrl-C inside SQLAlchemy's commit (its commit event, before the driver's COMMIT) of one of Optuna's
    writes: Optuna's session is only closed, and the pool took the connection back with the driver's
    transaction open, the file write-locked for as long as it sat there (after the traceback was gone
    too). The same call again then resumes the study to its budget."""
    db = tmp_path / "t.db"
    url = f"sqlite:///{db}"
    store = tuner.ResultStore(url)
    measured: list[dict[str, Any]] = []

    def objective(cfg: dict[str, Any]) -> float:
        measured.append(cfg)
        return float(cfg["block"])

    fired: list[bool] = []

    def interrupt(conn: Any) -> None:
        wrote = conn.connection.dbapi_connection.in_transaction  # the driver's transaction holds a write
        if measured and wrote and not fired:
            fired.append(True)
            raise KeyboardInterrupt  # in the commit's event dispatch: SQLAlchemy's COMMIT never runs

    eng = store.optuna_storage().engine
    event.listen(eng, "commit", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            tuner.optimize(SPACE, objective, budget=3, strategy="random", storage=store)
    finally:
        event.remove(eng, "commit", interrupt)
    assert fired
    assert not write_locked(db)
    res = tuner.optimize(SPACE, objective, budget=3, strategy="random", storage=store)
    assert len(res.trials) == 3


def test_a_trial_interrupted_in_its_objective_stays_unfinished_after_its_config_is_measured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C inside the objective leaves its Optuna trial RUNNING without a measurement; the resumed run
    measures that config again in a new trial. A later resume told the old RUNNING trial from the new
    trial's measurement (matched by config): the study then held two finished trials of one config, one
    never measured, and each such resume warned that trials "were measured and stored but not told to
    Optuna", which they were not."""
    import optuna

    store = tuner.ResultStore(f"sqlite:///{tmp_path / 't.db'}")
    space = SearchSpace.from_configs([{"x": i} for i in range(6)])
    calls: list[int] = []

    def objective(cfg: dict[str, Any]) -> float:
        calls.append(cfg["x"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return float(cfg["x"])

    def run() -> Any:
        return tuner.optimize(space, objective, budget=6, strategy="random", storage=store, study_name="s")

    with pytest.raises(KeyboardInterrupt):
        run()
    assert len(run().trials) == 6  # the interrupted config is measured again: it never finished
    with caplog.at_level("WARNING", logger="tuner.store"):
        res = run()
    assert len(res.trials) == 6 and len(calls) == 7
    assert "not told to Optuna" not in caplog.text
    study = optuna.load_study(study_name="s", storage=store.optuna_storage())
    finished = [t.params["x"] for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    assert sorted(finished) == list(range(6)), finished  # one finished trial per config
