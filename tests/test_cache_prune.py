"""Pruning the store (`ConfigCache.prune`, `tuner cache prune`): each selector, the measurements no entry
needs (never a study's), dry runs that change nothing, one transaction (a failure or an interrupt in the
middle leaves the store as it was), VACUUM, and the CLI's exit codes. On SQLite and on PostgreSQL
(tests/pg.py)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, update

from tuner.cli import main
from tuner.runtime import CacheEntry, CacheKey, ConfigCache, PruneCounts
from tuner.store import MeasurementRow, TaskContext

from .pg import fresh_database, sqlite_or_postgres

SRC_OLD, SRC_NEW = "aa" * 16, "bb" * 16


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres(request.param, tmp_path / "store.db")


@pytest.fixture
def cache(url: str) -> Iterator[ConfigCache]:
    c = ConfigCache(url)
    yield c
    c.store.engine.dispose()


def _ago(days: float) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(
    kernel: str = "mod.k",
    n: int = 1,
    *,
    days: float = 0,
    src: str = SRC_OLD,
    triton: str = "3.0",
    device: str = "cpu",
    dtype: str = "float32",
    versions: dict[str, str] | None = None,
) -> CacheEntry:
    key = CacheKey.make(kernel, src, {"n": n}, [dtype], device, versions or {"triton": triton})
    return CacheEntry(key, {"BLOCK": 16}, 1e-3, 1e-5, _ago(days), "fp")


def measure(
    cache: ConfigCache, e: CacheEntry | None, *, kernel: str | None = None, key: str | None = None, **kw: Any
) -> None:
    """One measurement as a runtime tuning records it (`stats["key"]`), or as `kw` says."""
    k = e.key.hash if e is not None else key
    stats = {"key": k} if k is not None else {}
    task = TaskContext(kernel=kernel or (e.key.kernel if e is not None else "mod.k"))
    cache.store.record(task, "fp", {"BLOCK": 16}, 1e-3, "ok", stats=stats, **kw)


def age_measurements(cache: ConfigCache, days: float) -> None:
    """Make every stored measurement `days` old."""
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days)
    with cache.store.session() as s:
        s.execute(update(MeasurementRow).values(created_at=then))


def hashes(cache: ConfigCache) -> set[str]:
    return {e.key.hash for e in cache.entries()}


def snapshot(cache: ConfigCache) -> tuple[Any, ...]:
    rows = [(m.kernel, m.study_name, json.dumps(m.stats, sort_keys=True)) for m in cache.store.measurements()]
    return (sorted(hashes(cache)), sorted(rows))


# ---- selectors ----------------------------------------------------------------------------------------


def test_older_than_removes_the_entries_measured_before_the_cutoff(cache: ConfigCache) -> None:
    old, new, other_old = entry(n=1, days=40), entry(n=2, days=3), entry("mod.j", days=100)
    for e in (old, new, other_old):
        cache.put(e)
    got = cache.prune(older_than_days=30)
    assert got == PruneCounts({"mod.k": 1, "mod.j": 1}, {})
    assert hashes(cache) == {new.key.hash}


def test_kernel_alone_removes_that_kernel_and_narrows_the_other_selectors(cache: ConfigCache) -> None:
    a_old, a_new, b_old = entry("mod.a", 1, days=40), entry("mod.a", 2), entry("mod.b", 1, days=40)
    for e in (a_old, a_new, b_old):
        cache.put(e)
    assert cache.prune(kernel="mod.a", older_than_days=30).entries == {"mod.a": 1}
    assert hashes(cache) == {a_new.key.hash, b_old.key.hash}
    assert cache.prune(kernel="mod.a").entries == {"mod.a": 1}
    assert hashes(cache) == {b_old.key.hash}


def test_stale_removes_entries_superseded_by_newer_source_or_versions(cache: ConfigCache) -> None:
    by_source = entry(n=1, days=50, src=SRC_OLD)
    by_versions = entry(n=1, days=20, src=SRC_NEW, triton="3.0")
    newest = entry(n=1, days=1, src=SRC_NEW, triton="3.1")
    # same fields, but another device or dtype: another problem, not superseded
    other_device = entry(n=1, days=90, device="gpu")
    other_dtype = entry(n=1, days=90, dtype="float16")
    alone = entry(n=2, days=400)  # old, but nothing newer for its key fields
    for e in (by_source, by_versions, newest, other_device, other_dtype, alone):
        cache.put(e)
    assert cache.prune(stale=True, dry_run=True).entries == {"mod.k": 2}
    # with an age: only those superseded and older than it
    assert cache.prune(stale=True, older_than_days=30).entries == {"mod.k": 1}
    assert by_source.key.hash not in hashes(cache)
    assert cache.prune(stale=True).entries == {"mod.k": 1}
    assert hashes(cache) == {e.key.hash for e in (newest, other_device, other_dtype, alone)}
    assert cache.prune(stale=True) == PruneCounts()  # the newest of each problem stays


def test_stale_keeps_another_backends_entry_of_the_same_kernel(cache: ConfigCache) -> None:
    """A registered kernel tuned on two backends (matmul in Triton and in Pallas) has one entry per
    backend, which differ in the frameworks their versions name; the older backend's entry is in use,
    not superseded. `--stale` removed it."""
    triton_old = entry("matmul", 1, days=40, versions={"torch": "2.13", "triton": "3.7"})
    pallas_new = entry("matmul", 1, days=1, versions={"jax": "0.10", "jaxlib": "0.10"})
    triton_new = entry("matmul", 2, days=1, versions={"torch": "2.13", "triton": "3.7"})
    triton_newer = entry("matmul", 2, days=0, versions={"torch": "2.13", "triton": "3.8"})
    for e in (triton_old, pallas_new, triton_new, triton_newer):
        cache.put(e)
    assert cache.prune(stale=True).entries == {"matmul": 1}  # only the Triton entry a newer Triton supersedes
    assert hashes(cache) == {triton_old.key.hash, pallas_new.key.hash, triton_newer.key.hash}


def test_measurements_of_a_key_being_tuned_are_kept(cache: ConfigCache) -> None:
    """A tuning in progress has measurements and a claim but no entry yet (it is written at the end, and
    reads the measurements back); `--measurements` removed them as orphans, dry run and real run alike."""
    tuning = entry(n=7)
    measure(cache, tuning)
    measure(cache, tuning)
    measure(cache, None, key="f" * 32)  # a real orphan
    assert cache.claim(tuning.key.hash, "other-process", lease_s=120)
    assert cache.prune(measurements=True, dry_run=True).measurements == {"mod.k": 1}
    assert cache.prune(measurements=True).measurements == {"mod.k": 1}
    assert sorted(m.stats.get("key") for m in cache.store.measurements()) == [tuning.key.hash] * 2


def test_nothing_selected_is_refused(cache: ConfigCache) -> None:
    cache.put(entry())
    with pytest.raises(ValueError, match="nothing selected"):
        cache.prune()
    for days in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="older_than_days"):
            cache.prune(older_than_days=days)
    assert len(cache) == 1


# ---- measurements -------------------------------------------------------------------------------------


def test_measurements_goes_with_the_entries_and_keeps_what_is_needed(cache: ConfigCache) -> None:
    gone, kept = entry(n=1, days=40), entry(n=2)
    cache.put(gone)
    cache.put(kept)
    measure(cache, gone)
    measure(cache, gone)
    measure(cache, kept)  # its entry stays: its trials say what the tuning tried (`_coverage`)
    measure(cache, None, key="f" * 32, kernel="mod.other")  # a key whose entry was removed long ago
    measure(cache, None, key="e" * 32, study_name="s")  # a study's: never removed
    measure(cache, None, key=None)  # tuner.optimize's (no key): never removed
    before = cache.store.count()
    got = cache.prune(older_than_days=30, measurements=True)
    assert got == PruneCounts({"mod.k": 1}, {}), got  # the measurements are younger than 30 days
    assert cache.store.count() == before
    got = cache.prune(kernel="mod.k", measurements=True, dry_run=True)
    assert got.entries == {"mod.k": 1} and got.measurements == {"mod.k": 3}
    got = cache.prune(measurements=True)
    assert got == PruneCounts({}, {"mod.k": 2, "mod.other": 1}), got
    left = cache.store.measurements()
    assert sorted((m.study_name or "", m.stats.get("key", "")) for m in left) == [
        ("", ""),
        ("", kept.key.hash),
        ("s", "e" * 32),
    ]
    assert hashes(cache) == {kept.key.hash}


def test_a_study_keeps_its_measurements(url: str) -> None:
    """A study's measurements (matched to its Optuna trials by `check_trials`) are never pruned, even
    when they carry the key of an entry that is removed."""
    from tuner.search_spaces import SearchSpace

    from tuner import optimize
    from tuner.studies import task_trials

    cache = ConfigCache(url)
    try:
        space = SearchSpace.from_configs([{"a": i} for i in range(4)])
        task = TaskContext(kernel="mod.k")
        optimize(
            space,
            lambda c: 1.0 + c["a"],
            budget=3,
            strategy="random",
            storage=cache.store,
            study_name="s",
            task=task,
        )
        e = entry(days=40)
        cache.put(e)
        measure(cache, e, study_name="s2")  # a study task's measurement of the key
        before = [m for m in cache.store.measurements() if m.study_name]
        got = cache.prune(older_than_days=0, measurements=True)
        assert got == PruneCounts({"mod.k": 1}, {})
        assert [m for m in cache.store.measurements() if m.study_name] == before
        check = cache.store.check_trials("s", task_trials(cache.store.optuna_storage(), "s"))
        assert check.consistent, check
    finally:
        cache.store.engine.dispose()


# ---- dry run, one transaction ------------------------------------------------------------------------


def _filled(cache: ConfigCache) -> None:
    for i in range(5):
        old = entry("mod.a", i, days=40 + i)
        cache.put(old)
        measure(cache, old)
        cache.put(entry("mod.b", i, days=60))
    measure(cache, None, key="d" * 32)
    age_measurements(cache, 50)


def test_a_dry_run_changes_nothing_and_counts_what_the_run_removes(cache: ConfigCache) -> None:
    _filled(cache)
    before = snapshot(cache)
    dry = cache.prune(older_than_days=30, measurements=True, dry_run=True)
    assert snapshot(cache) == before
    assert dry.dry_run and dry.total_entries == 10 and dry.measurements == {"mod.a": 5, "mod.k": 1}
    real = cache.prune(older_than_days=30, measurements=True)
    assert (real.entries, real.measurements) == (dry.entries, dry.measurements) and not real.dry_run
    assert len(cache) == 0 and cache.store.count() == 0


class Injected(Exception):
    pass


@pytest.mark.parametrize("fault", [Injected, KeyboardInterrupt])
def test_a_failure_in_the_middle_leaves_the_store_as_it_was(
    cache: ConfigCache, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException]
) -> None:
    """The second DELETE fails (the first one has run): nothing is removed, entries nor measurements."""
    import tuner.runtime._prune as prune_mod

    monkeypatch.setattr(prune_mod, "_CHUNK", 2)  # several DELETEs for the entries of one kernel
    _filled(cache)
    before = snapshot(cache)
    deletes = []

    def fail_on_the_second(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append(statement)
            if len(deletes) == 2:
                raise fault("injected")

    event.listen(cache.store.engine, "before_cursor_execute", fail_on_the_second)
    try:
        with pytest.raises(BaseException) as exc:
            cache.prune(older_than_days=30, measurements=True)
    finally:
        event.remove(cache.store.engine, "before_cursor_execute", fail_on_the_second)
    assert isinstance(exc.value, fault) or isinstance(exc.value.__cause__, fault), exc.value
    assert len(deletes) == 2
    assert snapshot(cache) == before
    assert cache.prune(older_than_days=30, measurements=True).total_entries == 10  # and it works after


@pytest.mark.postgres
def test_an_entry_tuned_again_meanwhile_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: another process stores a new winner for a key after the prune read it as old: the new
    winner is not removed (the delete matches the date it read)."""
    import tuner.runtime._prune as prune_mod

    for url in fresh_database():
        cache, other = ConfigCache(url), None
        try:
            old = entry(days=40)
            cache.put(old)
            other = ConfigCache(url)

            def read_then_retune(
                *args: Any, real: Any = prune_mod._selected_entries, other: Any = other
            ) -> Any:
                got = real(*args)
                other.put(entry(days=0), replace=True)  # same key, measured now, committed
                return got

            monkeypatch.setattr(prune_mod, "_selected_entries", read_then_retune)
            assert cache.prune(older_than_days=30) == PruneCounts()
            assert [e.date for e in cache.entries()] != [old.date] and len(cache) == 1
        finally:
            cache.store.engine.dispose()


# ---- VACUUM ------------------------------------------------------------------------------------------


def test_vacuum_gives_the_space_back(cache: ConfigCache) -> None:
    many = [entry(n=i, days=40) for i in range(150)]
    cache.merge(many)
    for e in many:
        measure(cache, e)
    age_measurements(cache, 50)
    cache.prune(older_than_days=30, measurements=True)
    done = cache.store.vacuum()
    if cache.store.engine.dialect.name == "sqlite":
        assert done.bytes_before is not None and done.bytes_after is not None
        assert done.bytes_after < done.bytes_before
    else:
        assert done.dialect == "postgresql" and done.bytes_before is None
    assert len(cache) == 0 and cache.store.count() == 0


# ---- CLI ---------------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", "prune", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prune_dry_run_json_and_vacuum(
    cache: ConfigCache, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _filled(cache)
    before = snapshot(cache)
    code, out, _ = _cli(capsys, "--older-than", "30", "--measurements", "--dry-run", "--storage", url)
    assert code == 0
    assert "mod.a: 5 entries, 5 measurements" in out and "would remove 10 entries and 6 measurements" in out
    assert snapshot(cache) == before
    code, out, _ = _cli(capsys, "--kernel", "mod.b", "--json", "--vacuum", "--storage", url)
    doc = json.loads(out)
    assert (
        code == 0 and doc["entries"] == 5 and doc["kernels"] == {"mod.b": {"entries": 5, "measurements": 0}}
    )
    assert doc["dry_run"] is False and doc["vacuum"]["ran"] is True
    code, out, _ = _cli(capsys, "--stale", "--storage", url)
    assert code == 0 and "nothing to prune" in out
    code, out, _ = _cli(capsys, "--vacuum", "--storage", url)  # VACUUM alone
    assert code == 0 and "vacuumed" in out
    assert len(cache) == 5


@pytest.mark.parametrize(
    "argv",
    [[], ["--dry-run"], ["--json"], ["--older-than", "-1"], ["--older-than", "nan"], ["--older-than", "x"]],
    ids=["nothing", "dry-run-only", "json-only", "negative", "nan", "not-a-number"],
)
def test_cli_bad_usage_exits_2_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    c = ConfigCache(url)
    c.put(entry(days=40))
    try:
        code = main(["cache", "prune", *argv, "--storage", url])
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and "error: " in err, err
    assert len(c) == 1


def test_cli_missing_store_prunes_nothing_and_makes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    code, out, _ = _cli(capsys, "--older-than", "1", "--vacuum")
    assert code == 0 and "nothing to prune" in out and not home.exists()


def test_cli_interrupted_prune_exits_130_and_leaves_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tuner.runtime._prune as prune_mod

    url = f"sqlite:///{tmp_path / 's.db'}"
    c = ConfigCache(url)
    _filled(c)
    before = snapshot(c)

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(prune_mod, "_delete_orphaned", interrupted)  # after the entries' DELETEs
    code, _, err = _cli(capsys, "--older-than", "30", "--measurements", "--storage", url)
    assert code == 130 and "interrupted" in err
    assert snapshot(c) == before


def test_cli_unreachable_store_is_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "--stale", "--storage", "postgresql://127.0.0.1:1/test")
    assert code == 1 and err.startswith("tuner: failed: "), err
