"""ConfigCache conformance: the same tests on SQLite and on PostgreSQL (127.0.0.1:5432, a throwaway
database from tests/pg.py; skipped when the server is not reachable, except under CI=true)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tuner.runtime import CacheEntry, CacheKey, ConfigCache
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
