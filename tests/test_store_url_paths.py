"""A SQLite store in a folder whose name a URL escapes (a space, '#', '?', '%', non-ASCII letters).

SQLAlchemy decodes a URL's database part (`sqlite:///runs/a%20b/s.db` opens `runs/a b/s.db`) and renders
such a path escaped; tuner took the file from the URL text as it is, so the file it watched, fell back to,
cleaned up after or checked was one that is not there. The read-only URIs (`file:...?mode=ro`) are decoded
twice, by SQLAlchemy and then by SQLite, and were escaped once: a '#' or '?' cut the path short."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL, make_url

from tests._study_fake import executor as fake_executor
from tests.test_full_disk_leftovers import _full, _left
from tests.test_runtime_faults import _fresh_stores, mount  # noqa: F401 - the fixtures
from tests.test_studies import write_study

NAME = "a b#c?d%20e josé"


def _url(db: Path) -> str:
    """The URL of `db` as SQLAlchemy renders it (its '#', '?', '%' and 'é' escaped)."""
    return URL.create("sqlite", database=str(db)).render_as_string(hide_password=False)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "stores" / NAME
    folder.mkdir(parents=True)
    return folder


def test_sqlite_path_is_the_file_sqlalchemy_opens(tmp_path: Path) -> None:
    from tuner.storage import immutable_url, locked_read_only_url, sqlite_path

    db = _folder(tmp_path) / "s.db"
    url = _url(db)
    assert "%3F" in url and "%25" in url
    assert sqlite_path(url) == make_url(url).database == str(db)
    from tuner.storage._engine import _uri_file

    db.touch()
    for ro in (immutable_url(str(db)), locked_read_only_url(str(db))):
        got = sqlite_path(ro)
        assert got == make_url(ro).database and got is not None and _uri_file(got) == str(db), ro


def _replace(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def test_a_store_deleted_under_this_process_is_noticed(tmp_path: Path) -> None:
    # make_engine watched the undecoded path, where no file is: a store deleted under the process took
    # every later write into the unlinked file (lost at exit), and `reopen_if_replaced` never let go of it
    from tuner.storage._replaced import reopen_if_replaced
    from tuner.store import ResultStore, StoreError

    db = _folder(tmp_path) / "s.db"
    url = _url(db)
    store = ResultStore(url)
    store.record(None, "fp", {"b": 1}, 1.0, "ok")
    assert db.is_file()
    _replace(db)
    with pytest.raises(StoreError, match="deleted or replaced") as exc:
        store.record(None, "fp", {"b": 2}, 2.0, "ok")
    assert str(db) in str(exc.value)
    assert reopen_if_replaced(url)  # lets go of the deleted file: the path is opened again, anew
    again = ResultStore(url)
    again.record(None, "fp", {"b": 3}, 3.0, "ok")
    assert again.count() == 1 and db.is_file()


def test_a_migration_watches_the_file_it_migrates(tmp_path: Path) -> None:
    # ensure_schema hands the migration the engine's rendered URL, whose path is escaped
    from sqlalchemy import create_engine

    from tuner.storage._migrate import _sqlite_migration_engine
    from tuner.store import StoreError

    db = _folder(tmp_path) / "s.db"
    rendered = create_engine(_url(db)).url.render_as_string(hide_password=False)
    eng = _sqlite_migration_engine(rendered)
    try:
        with eng.connect() as conn, conn.begin():
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        _replace(db)
        with pytest.raises(StoreError, match="deleted or replaced"), eng.connect() as conn, conn.begin():
            conn.exec_driver_sql("CREATE TABLE u (x INTEGER)")
        assert not db.exists()  # no new file made at the path
    finally:
        eng.dispose()


def _shm_full(monkeypatch: pytest.MonkeyPatch, db: Path) -> None:
    """The store's opening fails as on a full disk (SQLite's error; the disk not really full)."""
    from tuner.storage._engine import sqlite_fault_message
    from tuner.store import StoreError

    shm = sqlite3.OperationalError("disk I/O error")
    shm.sqlite_errorcode = 10 | (19 << 8)  # type: ignore[attr-defined] # SQLITE_IOERR_SHMSIZE
    got = sqlite_fault_message(str(db), "opening the store", shm)
    assert got is not None

    def full(engine: Any) -> None:
        raise StoreError(got[1]) from shm

    monkeypatch.setattr("tuner.store.ensure_schema", full)


def test_a_full_disks_store_is_opened_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the full-disk fallback looked for the undecoded path, found no file there and raised: every stored
    # entry was unseen and tuned again
    from tuner.store import ResultStore

    db = _folder(tmp_path) / "s.db"
    url = _url(db)
    ResultStore(url).record(None, "fp", {"b": 1}, 1.0, "ok")
    _shm_full(monkeypatch, db)
    store = ResultStore(url)
    assert store.read_only and store.full_disk is not None
    assert store.count() == 1


def test_a_new_store_that_cannot_be_made_leaves_no_empty_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the unprivileged twin of the tmpfs test below: SQLite made the file, its first page did not fit
    from tuner.store import ResultStore, StoreError

    folder = _folder(tmp_path)
    db = folder / "s.db"

    def full(engine: Any) -> None:
        db.touch()
        raise StoreError("store x: the test's disk is full")

    monkeypatch.setattr("tuner.store.ensure_schema", full)
    with pytest.raises(StoreError, match="the test's disk"):
        ResultStore(_url(db))
    assert list(folder.iterdir()) == []


def test_a_new_store_on_a_full_disk_leaves_no_empty_file(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    from tuner.store import ResultStore, StoreError

    small = _full(tmp_path, mount, 4096)
    (small / NAME).mkdir()
    url = _url(small / NAME / "tuner.db")
    with pytest.raises(StoreError, match="full"):
        ResultStore(url)
    assert _left(small) == [(NAME, -1)]  # no empty tuner.db, no tuner.db.lock


def test_a_store_in_a_folder_that_cannot_be_written_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its read-only URI escaped the path once, and SQLite decodes it after SQLAlchemy did: the path was
    # cut at its '#', and SQLite opened (made) another file, with none of the store's entries
    from tuner.storage import engine_of
    from tuner.store import ResultStore

    folder = _folder(tmp_path)
    db = folder / "s.db"
    url = _url(db)
    ResultStore(url).record(None, "fp", {"b": 1}, 1.0, "ok")
    eng = engine_of(url)
    assert eng is not None
    eng.dispose()  # its last connection closed: the log checkpointed into the file
    real_access = os.access
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) == str(folder) else real_access(p, mode, **kw),
    )
    before = sorted(p.name for p in tmp_path.rglob("*"))
    store = ResultStore(url)
    assert store.read_only and store.count() == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing made anywhere


def test_a_study_in_such_a_folder_runs_and_stops_when_its_file_is_deleted(tmp_path: Path) -> None:
    # `tuner study run` made the undecoded folder (`a%20b...`) for the store, which SQLite then could not
    # open in the decoded one; and it watched the undecoded path for the file's deletion
    from tuner.store import StoreError
    from tuner.studies import DONE, load_study, run_study

    db = tmp_path / "stores" / NAME / "study.db"
    spec = load_study(
        write_study(tmp_path, n_m=2, budget=3, extra=f'storage = "{_url(db)}"'), check_kernels=False
    )
    summary = run_study(spec, executor=fake_executor)
    assert summary.counts[DONE] == 2 and summary.complete and db.is_file()
    assert [p.name for p in (tmp_path / "stores").iterdir()] == [NAME]

    spec = load_study(
        write_study(tmp_path, name="t", n_m=2, budget=3, extra=f'storage = "{_url(db)}"'), check_kernels=False
    )
    started: list[str] = []

    def delete_then_tune(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
        started.append(task.key)
        if len(started) == 2:
            _replace(db)
        return fake_executor(task, prior=prior, callback=callback)

    with pytest.raises(StoreError, match="deleted or replaced"):
        run_study(spec, executor=delete_then_tune)
    assert not db.exists()


def test_a_study_report_finds_its_database(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tuner.commands.study import _require_database
    from tuner.runtime._sources import _exists
    from tuner.store import ResultStore

    db = _folder(tmp_path) / "study.db"
    ResultStore(_url(db))  # a store there (an empty file is none: "it never ran")
    _require_database(SimpleNamespace(storage=_url(db), name="s"))  # no "it never ran"
    assert _exists(_url(db))


def test_the_default_store_and_a_studys_store_are_in_their_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # their URLs were the path as it is: SQLAlchemy ended the file at a folder's '?' and decoded its '%20'
    from tuner.storage import sqlite_path
    from tuner.store import ResultStore, default_storage_url
    from tuner.studies import load_study

    home = _folder(tmp_path)
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    ResultStore().record(None, "fp", {"b": 1}, 1.0, "ok")
    assert (home / "tuner.db").is_file() and make_url(default_storage_url()).database == str(
        home / "tuner.db"
    )
    spec = load_study(write_study(home, n_m=1), check_kernels=False)
    db = home / "out-s" / "study.db"
    assert sqlite_path(spec.storage) == make_url(spec.storage).database == str(db)
