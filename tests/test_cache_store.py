"""ConfigCache conformance: the same tests on SQLite and on PostgreSQL (127.0.0.1:5432, a throwaway
database from tests/pg.py; skipped when the server is not reachable, except under CI=true)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from tuner.runtime import CacheEntry, CacheKey, ConfigCache, _db
from tuner.runtime._db import owner_id

from .pg import fresh_database


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def cache(request, tmp_path) -> Iterator[ConfigCache]:
    if request.param == "sqlite":
        c = ConfigCache(f"sqlite:///{tmp_path / 'c.db'}")
        yield c
        c.store.engine.dispose()
    else:
        for url in fresh_database():
            c = ConfigCache(url)
            yield c
            c.store.engine.dispose()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("psycopg2", marks=pytest.mark.postgres),
        pytest.param("psycopg", marks=pytest.mark.postgres),
    ]
)
def any_driver_cache(request, tmp_path) -> Iterator[ConfigCache]:
    """`cache` on SQLite and on PostgreSQL through both drivers (a merge writes its batches differently:
    an executemany, or one multi-row INSERT per batch through psycopg2)."""
    if request.param == "sqlite":
        c = ConfigCache(f"sqlite:///{tmp_path / 'c.db'}")
        yield c
        c.store.engine.dispose()
    else:
        for url in fresh_database(request.param):
            c = ConfigCache(url)
            yield c
            c.store.engine.dispose()


def e(i: int, t: float, tag: str = "a") -> CacheEntry:
    key = CacheKey.make("k", "ab" * 16, {"n": i}, ["float32"], "cpu", {"python": "3.11"})
    return CacheEntry(key, {"block": 16, "tag": tag}, t, t / 10, "2026-11-29T00:00:00Z", "fp")


def test_put_keeps_the_faster_unless_replace(cache: ConfigCache):
    cache.put(e(1, 2e-3, "slow"))
    cache.put(e(1, 1e-3, "fast"))
    cache.put(e(1, 5e-3, "slower"))
    assert cache.get(e(1, 0.1).key).config["tag"] == "fast"
    cache.put(e(1, 5e-3, "forced"), replace=True)
    assert cache.get(e(1, 0.1).key).config["tag"] == "forced"
    assert len(cache) == 1


def test_merge_counts_and_rule(cache: ConfigCache):
    cache.put(e(1, 1e-3, "old"))
    cache.put(e(2, 1e-3, "old"))
    counts = cache.merge([e(1, 2e-3, "new"), e(2, 5e-4, "new"), e(3, 1e-3, "new")])
    assert (counts.added, counts.replaced, counts.kept) == (1, 1, 1)
    assert {x.key.fields_dict["n"]: x.config["tag"] for x in cache.entries()} == {
        1: "old",
        2: "new",
        3: "new",
    }
    counts = cache.merge([e(1, 2e-3, "new")], prefer_import=True)
    assert counts.replaced == 1 and cache.get(e(1, 0).key).config["tag"] == "new"


def test_claims_are_exclusive_and_expire(cache: ConfigCache):
    a, b = owner_id() + "a", owner_id() + "b"
    assert cache.claim("h1", a, lease_s=60)
    assert not cache.claim("h1", b, lease_s=60)
    cache.release("h1", b)  # not b's: no effect
    assert not cache.claim("h1", b, lease_s=60)
    cache.release("h1", a)
    assert cache.claim("h1", b, lease_s=0.05)
    time.sleep(0.1)
    assert cache.claim("h1", a, lease_s=60)  # b's lease expired: taken over
    cache.renew("h1", a, 60)
    assert not cache.claim("h1", b, lease_s=60)


def test_round_trip_of_values(cache: ConfigCache):
    x = e(7, 1.2345678901234567e-5)
    cache.put(x)
    got = cache.get(x.key)
    assert got == x and got.to_json() == x.to_json()


def _statements(cache: ConfigCache) -> tuple[list[str], Any]:
    """The SQL statements the store's engine sends from now on (an executemany counts once)."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(cache.store.engine, "before_cursor_execute", count)
    return sent, lambda: event.remove(cache.store.engine, "before_cursor_execute", count)


def test_merge_writes_in_batches_with_the_merge_rule(any_driver_cache: ConfigCache):
    cache = any_driver_cache
    """An import used to send one INSERT ... ON CONFLICT per entry (3-4 ms each: 100k entries took
    minutes); now a few statements each write up to `MERGE_BATCH` rows, in one transaction, with the
    same rule: a new key is added, a faster import replaces, a slower one is kept."""
    n = 1300
    cache.merge([e(i, 1e-3, "old") for i in range(0, n, 2)])  # every even key stored, at 1 ms
    imported = [e(i, 5e-4 if i % 4 == 0 else 2e-3, "new") for i in range(n)]
    sent, stop = _statements(cache)
    try:
        counts = cache.merge(imported)
    finally:
        stop()
    writes = [s for s in sent if s.lstrip().upper().startswith("INSERT")]
    assert len(sent) <= 20 and 1 <= len(writes) <= 4, (len(sent), len(writes))
    assert (counts.added, counts.replaced, counts.kept) == (n // 2, n // 4, n // 4)
    tags = {x.key.fields_dict["n"]: (x.config["tag"], x.time_s) for x in cache.entries()}
    assert len(tags) == n
    for i in range(n):
        want = ("old", 1e-3) if i % 4 == 2 else ("new", 5e-4 if i % 4 == 0 else 2e-3)
        assert tags[i] == want, i
    # --prefer-import: every imported entry replaces, the slower ones too
    counts = cache.merge([e(i, 3e-3, "forced") for i in range(n)], prefer_import=True)
    assert (counts.added, counts.replaced, counts.kept) == (0, n, 0)
    assert {x.config["tag"] for x in cache.entries()} == {"forced"}


def test_merge_of_entries_sharing_a_key_writes_the_last(any_driver_cache: ConfigCache):
    cache = any_driver_cache
    """Entries of one merge that share a key (the API does not refuse them; a file's are dropped before):
    each counts, and the last one written wins, as when each was written in turn. One batch holding a key
    twice is refused by PostgreSQL ("ON CONFLICT DO UPDATE command cannot affect row a second time")."""
    cache.put(e(1, 1e-3, "old"))
    counts = cache.merge(
        [e(1, 5e-4, "a"), e(2, 1e-3, "b"), e(1, 8e-4, "c"), e(2, 2e-3, "d"), e(1, 2e-3, "e")]
    )
    assert (counts.added, counts.replaced, counts.kept) == (2, 2, 1)
    got = {x.key.fields_dict["n"]: x.config["tag"] for x in cache.entries()}
    assert got == {1: "c", 2: "d"}


def test_a_merge_that_fails_in_a_later_batch_writes_nothing(any_driver_cache: ConfigCache):
    cache = any_driver_cache
    """The batches are one transaction: a failure while the second is written leaves the store as it was."""
    cache.merge([e(i, 1e-3, "old") for i in range(10)])
    before = sorted((x.key.hash, x.config["tag"], x.time_s) for x in cache.entries())
    inserts: list[str] = []

    def fail_second(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement)
            if len(inserts) == 2:
                raise RuntimeError("disk full")

    event.listen(cache.store.engine, "before_cursor_execute", fail_second)
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            cache.merge([e(i, 5e-4, "new") for i in range(3 * _db.MERGE_BATCH)])
    finally:
        event.remove(cache.store.engine, "before_cursor_execute", fail_second)
    assert sorted((x.key.hash, x.config["tag"], x.time_s) for x in cache.entries()) == before
