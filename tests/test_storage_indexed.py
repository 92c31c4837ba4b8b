"""Issue 14 item 4, the parts a test can check (the timing is benchmarks/miss_scaling.py): a miss reads the
store through indexes only (never every entry or measurement of the kernel), and the prior is bounded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text


def _kernel(url: str, strategy: str = "random", mode: str = "online") -> Any:
    import tuner
    from tuner import PowerOfTwo, SearchSpace

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 64)]),
        key=["n", "layout"],
        budget=2,
        storage=url,
        bench=lambda call: call(),
        strategy=strategy,
        name="indexed_kernel",
        mode=mode,
    )
    def kernel(n, layout, *, block):  # noqa: ANN001, ANN202
        return 1e-3 * block * (1 + n % 3)

    return kernel


def _fill(url: str, n_keys: int, layout: str = "row") -> None:
    from tuner.runtime._db import ConfigCache
    from tuner.runtime._entry import CacheEntry

    k = _kernel(url)
    cache = ConfigCache(url)
    for i in range(n_keys):
        ck = k.tuner.full_key((100 + 10 * i, layout), {})
        cache.put(CacheEntry(ck, {"block": 16 << (i % 3)}, 1e-3, 0.0, "2026-11-30T00:00:00Z", "fp"))


def test_a_miss_never_reads_all_entries_of_the_kernel(tmp_path: Path, monkeypatch: Any) -> None:
    from tuner.runtime._db import ConfigCache

    url = f"sqlite:///{tmp_path / 's.db'}"
    _fill(url, 5, "row")
    _fill(url, 3, "col")

    def no_scan(self, kernel=None):  # noqa: ANN001, ANN202
        raise AssertionError("a miss read every entry of the kernel")

    monkeypatch.setattr(ConfigCache, "entries", no_scan)
    k = _kernel(url)
    assert "8 entries of kernel 'indexed_kernel' have other key fields" in k.explain(5, "row")
    k(5, "row")  # online miss: tunes
    assert k.tuner.stats["tuned"] == 1
    # offline: the nearest entry of the same family (layout "col" is another family)
    off = _kernel(url, mode="offline")
    assert off.explain(131, "col").startswith("miss:")
    off(131, "col")
    # (row n=130 is nearer in n, but another family)
    assert "nearest cached key {'layout': 'col', 'n': 120}" in off.tuner.last_choice["why"]


def test_stale_entry_is_named_by_an_indexed_lookup(tmp_path: Path) -> None:
    from tuner.runtime._db import ConfigCache
    from tuner.runtime._entry import CacheEntry
    from tuner.runtime._key import CacheKey

    url = f"sqlite:///{tmp_path / 's.db'}"
    k = _kernel(url)
    ck = k.tuner.full_key((64, "row"), {})
    old = CacheKey.make(ck.kernel, "0" * 16, ck.fields_dict, ck.dtypes, ck.device, ck.versions_dict)
    ConfigCache(url).put(CacheEntry(old, {"block": 16}, 1e-3, 0.0, "2026-11-30T00:00:00Z", "fp"))
    assert "stale or foreign" in k.explain(64, "row") and "source" in k.explain(64, "row")


def test_prior_is_bounded_and_newest_first(tmp_path: Path) -> None:
    from tuner.store import ResultStore, TaskContext

    store = ResultStore(f"sqlite:///{tmp_path / 'p.db'}")
    for t in range(20):
        for j in range(3):
            store.record(TaskContext(kernel="k", problem={"M": t}), "fp", {"b": j}, 1.0 + j, "ok")
    store.record(TaskContext(kernel="other", problem={"M": 0}), "fp", {"b": 0}, 1.0, "ok")
    prior = store.prior_for("k", max_tasks=4, max_rows=1000)
    assert len(prior) == 4 and all(len(g) == 3 for g in prior)
    assert [g[0][0] for g in prior] == [{"b": 0}] * 4
    assert sum(len(g) for g in store.prior_for("k", max_rows=10, max_tasks=None)) == 10
    assert sum(len(g) for g in store.prior_for("k", max_rows=None, max_tasks=None)) == 60
    excl = TaskContext(kernel="k", problem={"M": 19}).task_id
    assert len(store.prior_for("k", exclude_task=excl, max_tasks=None, max_rows=None)) == 19


def test_random_strategy_loads_no_prior(tmp_path: Path, monkeypatch: Any) -> None:
    from tuner.store import ResultStore

    calls: list[str] = []
    orig = ResultStore.prior_for
    monkeypatch.setattr(
        ResultStore, "prior_for", lambda self, *a, **k: calls.append("x") or orig(self, *a, **k)
    )
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _kernel(url, strategy="random")(1, "row")
    assert calls == []
    _kernel(url, strategy="transfer_best")(2, "row")
    assert calls == ["x"]


@pytest.mark.parametrize(
    "sql, index",
    [
        (
            "SELECT * FROM tuner_cache_entries WHERE family_hash = 'x' ORDER BY key_hash",
            "ix_tuner_cache_entries_family_hash",
        ),
        (
            "SELECT * FROM tuner_cache_entries WHERE fields_hash = 'x' AND key_hash != 'y' LIMIT 8",
            "ix_tuner_cache_entries_fields_hash",
        ),
        (
            "SELECT id, task_id, config, value FROM tuner_measurements WHERE kernel = 'k' AND task_id != 't' "
            "AND id < 1000 "
            "ORDER BY id DESC LIMIT 256",
            "ix_tuner_measurements_kernel_id",
        ),
    ],
)
def test_miss_queries_use_their_index(sql: str, index: str, tmp_path: Path) -> None:
    from tuner.store import ResultStore

    store = ResultStore(f"sqlite:///{tmp_path / 'q.db'}")
    with store.engine.connect() as conn:
        plan = " ".join(str(r[-1]) for r in conn.execute(text("EXPLAIN QUERY PLAN " + sql)))
    assert index in plan and "SCAN tuner" not in plan.replace(f"USING INDEX {index}", ""), plan
    logging.getLogger(__name__).debug(plan)


def test_an_offline_miss_reads_whole_only_the_entries_it_tries(tmp_path: Path, monkeypatch: Any) -> None:
    """The nearest key of a family of many stored keys: the family is ranked from its key fields and the
    entries are read whole only as they are tried. An offline miss used to build every entry of the
    family (about 20 s per miss in a family of 100,000 keys, docs/benchmarks.md)."""
    from tuner.runtime import _db

    url = f"sqlite:///{tmp_path / 's.db'}"
    _fill(url, 40, "row")
    built: list[Any] = []
    real = _db._entry

    def counting(r):  # noqa: ANN001, ANN202
        built.append(r.key_fields)
        return real(r)

    monkeypatch.setattr(_db, "_entry", counting)
    off = _kernel(url, mode="offline")
    off(251, "row")  # nearest: n=250 (i=15), whose block 16 << 0 is in the space
    assert "nearest cached key {'layout': 'row', 'n': 250}" in off.tuner.last_choice["why"]
    assert off.tuner.last_choice["config"] == {"block": 16}
    assert len(built) <= 2, built  # the exact lookup finds none; the nearest is read whole: 40 before
