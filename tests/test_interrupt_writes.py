"""Ctrl-C (or SIGTERM's KeyboardInterrupt) arriving while a decorated call or a cache import writes a
SQLite store: the interrupt goes on to the caller, and nothing of it stays behind in the live process. No
claim of the key is left for this process's next call (or another process) to wait out its lease on, and
the file is not left write-locked while the interrupt's traceback lives (a notebook keeps it in
`sys.last_traceback`). Each interrupt is injected at one chosen point, not by timing."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, ConfigCache
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
