"""The storage layer's schema: migrations from the first release, one schema for every table, the head
revision, and a newer store refused. The fresh-store races are in tests/test_storage_concurrency.py."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.pg import fresh_database

RELEASE1_DUMP = Path(__file__).parent / "data" / "store_release1.sql"


@pytest.fixture
def pg_url():
    yield from fresh_database()


def _release1_store(tmp_path: Path) -> str:
    """A SQLite store written by the first release (schema version 1, before migrations), restored from
    its SQL dump (tests/data/make_store_release1.py says how it was made)."""
    path = tmp_path / "release1.db"
    con = sqlite3.connect(path)
    con.executescript(RELEASE1_DUMP.read_text(encoding="utf-8"))
    con.close()
    return f"sqlite:///{path}"


def _tuner_tables_diff(url: str) -> list:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from tuner.storage import VERSION_TABLE, engine_for
    from tuner.storage._schema import Base

    def include(obj, name, type_, reflected, compare_to):  # noqa: ANN001
        return type_ != "table" or (name.startswith("tuner_") and name != VERSION_TABLE)

    with engine_for(url).connect() as conn:
        mc = MigrationContext.configure(conn, opts={"include_object": include, "compare_type": False})
        return compare_metadata(mc, Base.metadata)


def test_head_revision_constant_matches_the_scripts() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from tuner.storage import SCHEMA_REVISION
    from tuner.storage._migrate import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(cfg).get_current_head() == SCHEMA_REVISION


def test_release1_store_is_migrated_and_every_row_reads_back(tmp_path: Path) -> None:
    import optuna

    from tuner.runtime._db import ConfigCache
    from tuner.runtime._entry import CacheEntry
    from tuner.runtime._key import CacheKey
    from tuner.storage import SCHEMA_REVISION, SCHEMA_VERSION, VERSION_TABLE
    from tuner.store import ResultStore
    from tuner.studies._board import DONE, PENDING, TaskBoard

    url = _release1_store(tmp_path)
    with sqlite3.connect(url[len("sqlite:///") :]) as con:  # really the first release's layout
        assert con.execute("SELECT value FROM tuner_meta WHERE key='schema_version'").fetchone() == ("1",)
        cols = {r[1] for r in con.execute("PRAGMA table_info(tuner_cache_claims)")}
        assert cols == {"key_hash", "owner", "expires_at"}
        assert not con.execute(f"SELECT name FROM sqlite_master WHERE name='{VERSION_TABLE}'").fetchall()

    store = ResultStore(url)
    with store.engine.connect() as conn:
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == SCHEMA_REVISION
        v = conn.execute(text("SELECT value FROM tuner_meta WHERE key='schema_version'")).scalar()
        assert v == str(SCHEMA_VERSION)
    assert _tuner_tables_diff(url) == []

    # measurements: all six, with their context
    ms = store.measurements()
    assert len(ms) == 6
    assert [m.config for m in ms] == [{"BLOCK": 16 * (i + 1)} for i in range(6)]
    assert [m.status for m in ms].count("compile_error") == 1
    assert ms[4].value is None and ms[4].error == "too much shared memory"
    assert {m.study_name for m in ms} == {"s1", None}
    prior = store.prior_for("matmul")
    assert sum(len(t) for t in prior) == 6 and len(prior) == 3

    # cache entries: all three, found by key and by the indexed family lookup filled in by the migration
    cache = ConfigCache(store)
    entries = cache.entries("matmul")
    assert [e.config for e in entries if e.key.fields_dict["M"] == 128] == [{"BLOCK": 32}]
    assert len(entries) == 3
    probe = CacheKey.make("matmul", "0123abcd", {"M": 100, "N": 64}, ["float32"], "cpu", {"triton": "3.7.1"})
    assert len(cache.family(probe)) == 3
    assert cache.nearest(probe)[0][1].key.fields_dict["M"] == 128
    for e in entries:
        assert cache.get(e.key) == e
    assert (
        len(
            cache.same_fields(CacheKey.make("matmul", "ffffffff", {"M": 64, "N": 64}, ["float32"], "cpu", {}))
        )
        == 1
    )
    # the first release's claim row (no host/pid) is still held until its lease ends
    holder = cache.holder("f" * 32)
    assert holder is not None and holder.owner == "oldhost:4242:abcd:1" and holder.host is None
    # and the cache takes new writes
    k = CacheKey.make("matmul", "0123abcd", {"M": 512, "N": 64}, ["float32"], "cpu", {"triton": "3.7.1"})
    cache.put(CacheEntry(k, {"BLOCK": 64}, 0.01, 0.0, "2026-11-30T00:00:00Z", "fp123"))
    assert len(cache.family(probe)) == 4

    # the study board: both tasks, one done with its result
    board = TaskBoard(url)
    rows = board.rows("s1")
    assert [(r.key, r.status) for r in rows] == [("matmul/M64", DONE), ("matmul/M128", PENDING)]
    assert rows[0].result == {"best_value": 0.5} and rows[0].best_config == {"BLOCK": 16}
    assert rows[0].task.problem == {"M": 64, "dtype": "float32"}
    claim = board.claim("s1", "w2", 30.0)
    assert claim is not None and claim.task.key == "matmul/M128"

    # Optuna's tables are Optuna's: its study and trials are intact
    study = optuna.load_study(study_name="s1/matmul", storage=store.optuna_storage())
    assert len(study.trials) == 3
    assert all(16 <= t.params["BLOCK"] <= 64 for t in study.trials)

    # opening again is a no-op
    ResultStore(url)
    assert len(ResultStore(url).measurements()) == 6


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_fresh_store_has_every_table_of_the_schema(db: str, tmp_path: Path, request) -> None:  # noqa: ANN001
    from tuner.storage import SCHEMA_REVISION, engine_for, schema_revision
    from tuner.store import ResultStore

    url = f"sqlite:///{tmp_path / 'fresh.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    ResultStore(url)
    assert _tuner_tables_diff(url) == []
    with engine_for(url).connect() as conn:
        assert schema_revision(conn) == SCHEMA_REVISION


def test_a_store_from_a_newer_tuner_is_refused(tmp_path: Path) -> None:
    from tuner.storage import VERSION_TABLE, StoreError
    from tuner.store import ResultStore

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    ResultStore(url)
    with sqlite3.connect(url[len("sqlite:///") :]) as con:
        con.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(StoreError, match=r"schema revision 9999, newer than this tuner's .*upgrade tuner"):
        ResultStore(url)


def test_a_failed_migration_leaves_the_store_as_it_was(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """SQLite: the whole migration is one transaction; an error half-way rolls every step back."""
    import tuner.storage._schema as schema
    from tuner.storage import VERSION_TABLE, StoreError
    from tuner.store import ResultStore

    url = _release1_store(tmp_path)

    def boom(*a, **k):  # noqa: ANN002, ANN003
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(schema, "key_hashes", boom)  # fails after the columns were added
    with pytest.raises((StoreError, RuntimeError), match="disk on fire"):
        ResultStore(url)
    with sqlite3.connect(url[len("sqlite:///") :]) as con:
        cols = {r[1] for r in con.execute("PRAGMA table_info(tuner_cache_entries)")}
        assert "fields_hash" not in cols
        assert not con.execute(f"SELECT name FROM sqlite_master WHERE name='{VERSION_TABLE}'").fetchall()
        assert con.execute("SELECT count(*) FROM tuner_cache_entries").fetchone() == (3,)
    monkeypatch.undo()
    assert len(ResultStore(url).measurements()) == 6


def test_one_engine_per_url_for_store_cache_and_board(tmp_path: Path) -> None:
    from tuner.runtime import ConfigCache
    from tuner.storage import engine_for
    from tuner.store import ResultStore
    from tuner.studies import TaskBoard

    url = f"sqlite:///{tmp_path / 'one.db'}"
    eng = engine_for(url)
    assert ResultStore(url).engine is eng
    assert ConfigCache(url).store.engine is eng
    assert TaskBoard(url).engine is eng
    assert engine_for(f"sqlite:///{tmp_path / 'other.db'}") is not eng


def test_in_memory_store_gets_the_schema() -> None:
    from tuner.storage import SCHEMA_REVISION, schema_revision
    from tuner.store import ResultStore, TaskContext

    store = ResultStore("sqlite://")
    store.record(TaskContext(kernel="mem"), "fp", {"a": 1}, 1.0, "ok")
    assert [m.config for m in store.measurements(kernel="mem")] == [{"a": 1}]
    with store.engine.connect() as conn:
        assert schema_revision(conn) == SCHEMA_REVISION


def test_read_only_release1_store_is_refused_not_migrated(tmp_path: Path, monkeypatch) -> None:
    """A store in a folder that cannot be written is opened read-only, so an older one cannot be migrated:
    a StoreError that says so (the runtime then leaves the store out), and the file is left as it was."""
    from tuner.storage import StoreError
    from tuner.store import ResultStore

    url = _release1_store(tmp_path)
    before = (tmp_path / "release1.db").read_bytes()
    real_access = os.access
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) == str(tmp_path) else real_access(p, mode, **kw),
    )
    with pytest.raises(StoreError, match="read-only .* cannot be migrated in place"):
        ResultStore(url)
    assert (tmp_path / "release1.db").read_bytes() == before


def test_making_a_store_logs_no_alembic_info_to_a_program_that_logs_info(tmp_path: Path) -> None:
    """A program that logs at INFO (`logging.basicConfig(level=INFO)`) and makes a store: alembic's own
    INFO lines (its plugins, logged when tuner first imports it) are quiet, as its migration steps are."""
    import subprocess
    import sys

    from tests._env import repo_pythonpath

    child = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "import tuner\n"
        "sp = tuner.SearchSpace.from_configs([{'a': i} for i in range(4)])\n"
        f"tuner.optimize(sp, lambda c: c['a'], budget=2, strategy='random', storage={f'sqlite:///{tmp_path}/x.db'!r})\n"
        "logging.getLogger('mine').info('done')\n"
    )
    env = dict(os.environ, TUNER_HOME=str(tmp_path / "home"), PYTHONPATH=repo_pythonpath())
    r = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300, encoding="utf-8"
    )
    assert r.returncode == 0, r.stderr
    assert "INFO:mine:done" in r.stderr  # the program's own INFO lines still show
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("INFO:alembic")], r.stderr


def test_optunas_migration_scripts_are_loaded_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tuner's check of Optuna's table version needs the head revision of Optuna's migration scripts, and
    alembic loads the whole script directory (some 50 modules) for it each time: a study process opens
    Optuna's tables many times (each task, the task board, the report, the cache export), of one store or
    several. The head is read once per process and Optuna installation."""
    from alembic.script import ScriptDirectory

    from tuner.storage import _migrate
    from tuner.store import ResultStore

    urls = [f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"]
    for url in urls:  # made and stamped (Optuna's constructor loads the scripts to stamp a new store)
        ResultStore(url).optuna_storage()
    monkeypatch.setattr(_migrate, "_optuna_heads", {}, raising=False)  # as in a process that has not read it
    loads: list[object] = []
    load_revisions = ScriptDirectory._load_revisions

    def counted(self: ScriptDirectory) -> Any:
        loads.append(self)
        yield from load_revisions(self)

    monkeypatch.setattr(ScriptDirectory, "_load_revisions", counted)
    storages = [ResultStore(url).optuna_storage() for url in urls + urls]
    assert len(loads) == 1
    monkeypatch.setattr(ScriptDirectory, "_load_revisions", load_revisions)
    assert storages[0].get_head_version() == _migrate._optuna_head_version(storages[1])


def test_optunas_tables_at_another_version_are_refused_with_optunas_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tuner reads Optuna's table version itself (no transaction left open while alembic loads scripts):
    tables at another version still raise Optuna's own error, and tuner's where that Optuna has no such
    check (it is private: `_version_manager.check_table_schema_compatibility`)."""
    import contextlib

    import optuna

    from tuner.store import ResultStore

    url = f"sqlite:///{tmp_path}/s.db"
    ResultStore(url).optuna_storage()
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as c:
        c.execute("UPDATE alembic_version SET version_num = 'v3.0.0.a'")
        c.commit()
    with pytest.raises(RuntimeError, match="optuna storage upgrade --storage"):
        ResultStore(url).optuna_storage()
    manager = type(optuna.storages.RDBStorage(url, skip_compatibility_check=True)._version_manager)
    monkeypatch.delattr(manager, "check_table_schema_compatibility")
    with pytest.raises(RuntimeError, match=r"schema version v3\.0\.0\.a \(it needs v"):
        ResultStore(url).optuna_storage()
