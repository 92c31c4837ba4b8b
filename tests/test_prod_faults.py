"""Production faults the earlier audits did not cover: a full disk under the store, an export or the miss
log; a read-only store's error naming its file; a PostgreSQL server that turns read-only (a failover to a
hot standby); a fleet of study workers that all stop on a store they cannot use.

The full-disk cases run on a real tmpfs, which needs mount(8) and root (CI runs as root): they skip, saying
so, where mounting is not permitted. Each has an unprivileged twin that makes the same failure from
Python (the same errno, or SQLite's own error code), so the behaviour is checked everywhere. The
PostgreSQL cases use the real server (tests/pg.py)."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import test_runtime_faults as rt
from tests.pg import fresh_database
from tests.test_runtime_faults import _fresh_stores, mount  # noqa: F401 - the fixtures
from tests.test_studies import REPO, cli, write_study
from tuner.runtime._sources import close_stores


def _fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte (another program's log, say); returns the filler."""
    filler = folder / "filler"
    try:
        with open(filler, "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    return filler


def _tmpfs(folder: Path, mounter: Callable[..., None], size: str) -> Path:
    """A new tmpfs of `size` at `folder` (skips the test where mounting is not permitted)."""
    folder.mkdir()
    mounter("-t", "tmpfs", "-o", f"size={size}", "tmpfs", target=folder)
    return folder


def _small_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mounter: Callable[..., None], size: str
) -> Path:
    home = _tmpfs(tmp_path / "small", mounter, size)
    monkeypatch.setenv("TUNER_HOME", str(home))
    return home


# ---- a full disk under the store: its entries still hit ---------------------------------------------------
def _stored_keys_hit_and_new_ones_tune(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    f, bench = rt.make()
    rt.check_calls(f, (100, 200))  # 100, 200: stored before the disk filled; hits, nothing timed
    assert f.tuner.stats["from_store"] == 2 and bench.calls == 0, (f.tuner.stats, rt.store_warnings(caplog))
    rt.check_calls(f, (300,))  # a new key: tuned in memory, the call returns as usual
    assert f.tuner.stats["tuned"] == 1
    off, bench = rt.make(mode="offline")
    rt.check_calls(off, (100, 200))
    assert off.tuner.last_choice["why"] == "exact entry in the store" and bench.calls == 0
    msgs = rt.store_warnings(caplog)
    assert len(msgs) == 1, msgs  # one warning, naming the file and the full disk
    assert f"store {home / 'tuner.db'}:" in msgs[0] and f"the disk that holds {home} is full" in msgs[0], msgs
    assert "opened read-only" in msgs[0], msgs


def test_a_full_disk_keeps_the_stored_entries_in_use(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # SQLite cannot open a WAL store on a full disk even to read it (its -shm file cannot grow:
    # SQLITE_IOERR_SHMSIZE), so every process that started after the disk filled tuned every stored key
    # again (online) or fell back (offline), and the warning blamed a removed or unmounted folder.
    home = _small_home(tmp_path, monkeypatch, mount, "4m")
    rt._populate(home, ns=(100, 200))
    filler = _fill(home)
    db = home / "tuner.db"
    before = db.read_bytes()
    _stored_keys_hit_and_new_ones_tune(home, caplog)
    assert db.read_bytes() == before  # nothing written, nothing truncated
    # space freed: the store is opened for writing again (here at once; a process does it after
    # STORE_RETRY_S), the new winner is stored and nothing stored earlier is lost
    filler.unlink()
    close_stores()
    f, _ = rt.make()
    rt.check_calls(f, (100, 200, 300))
    assert f.tuner.stats["from_store"] == 2 and f.tuner.stats["tuned"] == 1
    close_stores()
    g, bench = rt.make()
    rt.check_calls(g, (100, 200, 300))
    assert g.tuner.stats["from_store"] == 3 and bench.calls == 0


def test_a_store_opened_read_only_for_a_full_disk_is_opened_for_writing_once_space_is_back(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    from tuner.runtime import _sources

    home = _small_home(tmp_path, monkeypatch, mount, "4m")
    rt._populate(home, ns=(100,))
    filler = _fill(home)
    f, _ = rt.make()
    rt.check_calls(f, (200,))  # tuned in memory only
    filler.unlink()
    monkeypatch.setattr(_sources, "STORE_RETRY_S", 0.0)  # the retry interval is over
    rt.check_calls(f, (300,))  # the same process: its next miss writes again
    close_stores()
    g, bench = rt.make()
    rt.check_calls(g, (100, 300))
    assert g.tuner.stats["from_store"] == 2 and bench.calls == 0


def test_a_callers_result_store_opened_read_only_for_a_full_disk_is_opened_for_writing_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # storage=ResultStore(...) made while the disk was full: the retry reused the caller's read-only
    # store object, so its writes stayed skipped for the life of the process (the warning said "tried
    # for writing again every 30 s").
    from tuner.runtime import _sources
    from tuner.store import ResultStore

    home = _small_home(tmp_path, monkeypatch, mount, "4m")
    rt._populate(home, ns=(100,))
    filler = _fill(home)
    store = ResultStore()
    assert store.full_disk is not None
    f, _ = rt.make(storage=store)
    rt.check_calls(f, (100, 200))  # 100 hits, 200 is tuned in memory only
    assert f.tuner.stats["from_store"] == 1
    filler.unlink()
    monkeypatch.setattr(_sources, "STORE_RETRY_S", 0.0)  # the retry interval is over
    rt.check_calls(f, (300,))  # the same process: its next miss writes again
    close_stores()
    g, bench = rt.make()
    rt.check_calls(g, (100, 300))
    assert g.tuner.stats["from_store"] == 2 and bench.calls == 0


def test_sqlites_shm_error_on_a_full_disk_is_named_a_full_disk(
    _tuner_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The unprivileged twin of the tmpfs test above: SQLite's own error, as a full disk makes it.
    from tuner.storage._engine import sqlite_fault_message

    shm = sqlite3.OperationalError("disk I/O error")
    shm.sqlite_errorcode = 10 | (19 << 8)  # type: ignore[attr-defined] # SQLITE_IOERR_SHMSIZE
    shm.sqlite_errorname = "SQLITE_IOERR_SHMSIZE"  # type: ignore[attr-defined]
    db = _tuner_home / "tuner.db"
    got = sqlite_fault_message(str(db), "opening the store", shm)
    assert got is not None and f"the disk that holds {_tuner_home} is full" in got[1], got
    rt._populate(_tuner_home, ns=(100, 200))
    _opening_fails(monkeypatch, got[1], shm)
    _stored_keys_hit_and_new_ones_tune(_tuner_home, caplog)


def _opening_fails(monkeypatch: pytest.MonkeyPatch, message: str, cause: BaseException) -> None:
    """The store's opening for writing fails with `message` (a StoreError from SQLite's `cause`)."""
    from tuner.storage import _migrate
    from tuner.store import StoreError

    real = _migrate.ensure_schema

    def full(engine: Any) -> None:
        if "immutable" not in str(engine.url):
            raise StoreError(message) from cause
        real(engine)

    monkeypatch.setattr("tuner.store.ensure_schema", full)


def _fill_inodes(folder: Path) -> None:
    """Take every free inode of `folder`'s file system (many small files, as a compiler's cache makes)."""
    try:
        for i in range(1_000_000):
            (folder / f"small-{i}").touch()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc


def test_a_disk_without_a_free_inode_keeps_the_stored_entries_in_use(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # SQLite cannot make a WAL store's -shm file where no inode is left (SQLITE_CANTOPEN), most bytes free:
    # the full-disk check counted free bytes only and the store's fallback took I/O and full-disk errors
    # only, so the store could not be opened at all ("unable to open database file") and every stored
    # winner was tuned again
    home = tmp_path / "small"
    home.mkdir()
    mount("-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", target=home)
    monkeypatch.setenv("TUNER_HOME", str(home))
    rt._populate(home, ns=(100, 200))
    _fill_inodes(home)
    st = os.statvfs(home)
    assert st.f_favail == 0 and st.f_bavail * st.f_frsize > 1 << 20
    db = home / "tuner.db"
    before = db.read_bytes()
    _stored_keys_hit_and_new_ones_tune(home, caplog)
    assert db.read_bytes() == before


def test_sqlites_cantopen_with_no_inode_left_is_named_a_full_disk(
    _tuner_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The unprivileged twin of the tmpfs test above: SQLite's error, and a file system without a free inode.
    from types import SimpleNamespace

    from tuner.storage._engine import sqlite_fault_message

    cant = sqlite3.OperationalError("unable to open database file")
    cant.sqlite_errorcode = 14  # type: ignore[attr-defined] # SQLITE_CANTOPEN
    db = _tuner_home / "tuner.db"
    assert sqlite_fault_message(str(db), "opening the store", cant) is None  # inodes to spare: not the disk
    rt._populate(_tuner_home, ns=(100, 200))
    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        st = real_statvfs(path)
        if os.path.realpath(path) != os.path.realpath(_tuner_home):
            return st
        return SimpleNamespace(f_bavail=st.f_bavail, f_frsize=st.f_frsize, f_files=64, f_favail=0)

    monkeypatch.setattr(os, "statvfs", statvfs)
    got = sqlite_fault_message(str(db), "opening the store", cant)
    assert got is not None and f"the disk that holds {_tuner_home} is full" in got[1], got
    _opening_fails(monkeypatch, got[1], cant)
    _stored_keys_hit_and_new_ones_tune(_tuner_home, caplog)


def _open_read_only_for_a_full_disk(home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ResultStore of `home`'s store opened as on a full disk (SQLite's error, the disk not really full)."""
    from tuner.storage._engine import sqlite_fault_message
    from tuner.store import ResultStore, StoreError

    shm = sqlite3.OperationalError("disk I/O error")
    shm.sqlite_errorcode = 10 | (19 << 8)  # type: ignore[attr-defined] # SQLITE_IOERR_SHMSIZE
    got = sqlite_fault_message(str(home / "tuner.db"), "opening the store", shm)
    assert got is not None

    def full(engine: Any) -> None:
        raise StoreError(got[1]) from shm

    monkeypatch.setattr("tuner.store.ensure_schema", full)
    store = ResultStore()
    assert store.full_disk is not None and store.read_only
    return store


def test_a_store_read_only_for_a_full_disk_reads_one_state_while_another_process_writes(
    _tuner_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fallback read the file with `immutable=1`: no locks, so a checkpoint of a process still writing
    # the store (its disk had room again, or the write needed none) rewrote the pages a read of the
    # fallback was going through. A read came back half old and half new (or "database disk image is
    # malformed", a store wrongly called corrupt), and what was only in the other's log was never seen.
    from sqlalchemy import text

    rt._populate(_tuner_home, ns=(100,))
    writer = sqlite3.connect(_tuner_home / "tuner.db", isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")  # checkpointed below only
    writer.execute("CREATE TABLE t (x INTEGER, pad TEXT)")
    writer.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 200) for i in range(1, 2001)])
    writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store = _open_read_only_for_a_full_disk(_tuner_home, monkeypatch)
    try:
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT x FROM t ORDER BY rowid")
            first = [rows.fetchone()[0] for _ in range(10)]  # the read is under way
            writer.execute("UPDATE t SET x = -x")  # another process commits a change of every row
            writer.execute("PRAGMA wal_checkpoint(PASSIVE)")  # and copies into the file what it may
            rest = [r[0] for r in rows.fetchall()]
        seen = first + rest
        assert len(seen) == 2000 and all(x > 0 for x in seen), sorted({x > 0 for x in seen})  # one state
        with store.session() as s:  # the next read sees the whole commit, though it is only in the log
            assert s.execute(text("SELECT count(*) FROM t WHERE x < 0")).scalar_one() == 2000
    finally:
        writer.close()
        store.engine.dispose()


@pytest.mark.parametrize("disk", ["tmpfs", "twin"])
def test_a_full_disks_read_of_a_store_another_process_locks_is_not_read_immutable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, disk: str
) -> None:
    # The read-only store of a full disk fell back to an immutable read on any SQLite error once under
    # 64 KiB were free, "database is locked" included: a read that another process's exclusive lock kept
    # out was read as the file is, lock-free (torn by that process's writes), in place of failing.
    from sqlalchemy.exc import OperationalError

    from tuner.storage import _engine
    from tuner.storage._engine import locked_read_only_url, make_engine

    if disk == "tmpfs":
        folder = _tmpfs(tmp_path / "small", request.getfixturevalue("mount"), "256k")
    else:  # the twin: the folder's disk reports itself full
        folder = tmp_path / "small"
        folder.mkdir()
        real_statvfs = os.statvfs

        def statvfs(path: Any) -> Any:
            if os.path.abspath(path) != str(folder):
                return real_statvfs(path)
            return os.statvfs_result((4096, 4096, 64, 0, 0, 64, 0, 0, 0, 255))

        monkeypatch.setattr(os, "statvfs", statvfs)
    db = folder / "s.db"
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE t (x INTEGER)")
        writer.execute("PRAGMA locking_mode=EXCLUSIVE")  # another process holds the store exclusively
        writer.execute("INSERT INTO t VALUES (1)")
        if disk == "tmpfs":
            _fill(folder)
        assert _engine._disk_full(sqlite3.OperationalError("disk I/O error"), str(folder))  # nearly full
        monkeypatch.setattr(_engine, "SQLITE_TIMEOUT_S", 0.2)  # the busy timeout, short
        eng = make_engine(locked_read_only_url(str(db)))
        try:
            with pytest.raises(OperationalError, match="database is locked"), eng.connect() as conn:
                conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one()
        finally:
            eng.dispose()
    finally:
        writer.close()


# ---- files tuner writes: the error names the file, and the old file stays --------------------------------
def test_an_export_to_a_full_disk_names_the_file_and_keeps_the_old_one(
    tmp_path: Path,
    _tuner_home: Path,
    capsys: pytest.CaptureFixture[str],
    mount: Callable[..., None],  # noqa: F811
) -> None:
    rt._populate(_tuner_home, ns=(100, 200))
    out_dir = _tmpfs(tmp_path / "ship", mount, "64k")
    out = out_dir / "tuned.json"
    out.write_text('{"old": true}', encoding="utf-8")
    _fill(out_dir)
    capsys.readouterr()
    assert cli("cache", "export", "--out", str(out)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "No space left on device" in err and str(out) in err, err  # was: no file named at all
    assert out.read_text(encoding="utf-8") == '{"old": true}'
    assert sorted(p.name for p in out_dir.iterdir()) == ["filler", "tuned.json"]  # no temporary left


def test_atomic_write_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the unprivileged twin: the fsync of a full disk (ENOSPC names no file)
    from tuner import _atomic

    (tmp_path / "ship").mkdir()
    target = tmp_path / "ship" / "tuned.json"
    target.write_text("old", encoding="utf-8")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic.os, "fsync", no_space)
    with pytest.raises(OSError) as exc:
        _atomic.atomic_write(target, "new")
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(target), exc.value
    assert str(target) in str(exc.value)
    assert target.read_text(encoding="utf-8") == "old" and [p.name for p in target.parent.iterdir()] == [
        "tuned.json"
    ]
    monkeypatch.undo()
    with pytest.raises(PermissionError) as perm:  # the kind of error is kept
        monkeypatch.setattr(
            _atomic.os, "replace", lambda a, b: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied"))
        )
        _atomic.atomic_write(target, "new")
    assert perm.value.filename == str(target)


# ---- record mode on a full disk: no call counted twice, none lost -----------------------------------------
_RECORD = """
import os, sys
import numpy as np
import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import _misses

@tuner.autotune(SearchSpace([PowerOfTwo("b", 16, 256)]), key=["n"], name="rec", mode="record", storage=False)
def f(x, n, *, b):
    return x

rec = _misses.recorder()
rec.flush_s = 3600  # flushed below, not by the writer thread
room = int(sys.argv[1])
filler = os.path.join(os.environ["TUNER_MISSES_DIR"], "..", "filler")
os.makedirs(os.environ["TUNER_MISSES_DIR"], exist_ok=True)
st = os.statvfs(os.environ["TUNER_MISSES_DIR"])
with open(filler, "wb") as fh:
    fh.write(b"\\0" * (st.f_bavail * st.f_frsize - room))
for n in range(1, 41):
    f(np.ones(2), n)
rec.flush()
os.remove(filler)
rec.flush()
rows = _misses.read_misses()
print(len(rows), sum(r.calls for r in rows))
"""


def test_record_mode_on_a_full_disk_counts_each_call_once(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # A flush that the full disk cut short left its first lines in the file and wrote them all again at the
    # next flush: 40 calls were counted as 46.
    small = _tmpfs(tmp_path / "small", mount, "64k")
    env = {**os.environ, "TUNER_MISSES_DIR": str(small / "m"), "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _RECORD, "6000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["40", "40"], (r.stdout, r.stderr)
    assert "No space left on device" in r.stderr and str(small / "m") in r.stderr, r.stderr


def test_a_cut_miss_log_write_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the unprivileged twin: a write that stops part way for want of space
    from tuner.runtime import _misses

    monkeypatch.setenv("TUNER_MISSES_DIR", str(tmp_path / "m"))
    rec = _misses.MissRecorder()
    monkeypatch.setattr(rec, "_ensure_thread", lambda: None)  # flushed below only, not by its thread
    monkeypatch.setattr(_misses, "_recorder", rec)
    f, _ = rt.make(mode="record", storage=False, name="rec_twin")
    real_write = os.write
    cut = [True]

    def short(fd: int, data: Any) -> int:
        if cut[0]:
            cut[0] = False
            return real_write(fd, bytes(data)[: len(data) // 2 + 7])  # half the lines, then a torn one
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    rt.check_calls(f, range(1, 11))
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(_misses.os, "write", short)
    assert rec.flush() == 0
    monkeypatch.setattr(_misses.os, "write", real_write)
    assert rec.flush() > 0
    rows = [r for r in _misses.read_misses() if r.key.kernel.endswith("rec_twin")]
    assert len(rows) == 10 and sum(r.calls for r in rows) == 10, [(r.key.fields_dict, r.calls) for r in rows]
    logged = [r.getMessage() for r in caplog.records if r.name == "tuner.runtime._misses"]
    assert logged and str(tmp_path / "m") in logged[0], logged


# ---- a read-only store names its own file ----------------------------------------------------------------
def test_a_read_only_stores_write_error_names_its_file(_tuner_home: Path) -> None:
    # A store in a folder that cannot be written is opened through a `file:` URI; its errors named
    # "store file%3A/.../tuner.db" and the folder "file%3A/...".
    from sqlalchemy import text

    from tuner.storage import StoreError, engine_for, immutable_url

    rt._populate(_tuner_home, ns=(100,))
    db = _tuner_home / "tuner.db"
    eng = engine_for(immutable_url(str(db)))  # what ResultStore opens for a folder it cannot write
    with pytest.raises(StoreError) as exc, eng.begin() as conn:
        conn.execute(text("DELETE FROM tuner_cache_entries"))
    msg = str(exc.value)
    assert msg.startswith(f"store {db}: ") and f"folder {_tuner_home} cannot be written" in msg, msg
    assert "%3A" not in msg and "file:" not in msg, msg


# ---- a fleet of study workers that all stop ----------------------------------------------------------------
def refusing_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """A study executor whose store cannot be used (as a worker finds a full disk, a read-only server or
    the server's connection limit)."""
    from tuner.store import StoreError

    raise StoreError("store x: the test's store cannot be written")


def test_workers_that_all_stop_on_a_store_error_fail_the_run(
    _tuner_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every worker stopped (exit 1) and left its task pending; the command that started them printed
    # "tasks are still running on other workers" and exited 0.
    p = write_study(tmp_path, n_m=3, budget=2)
    capsys.readouterr()
    rc = cli(
        "study", "run", str(p), "--workers", "2", "--executor", "tests.test_prod_faults:refusing_executor"
    )
    out, err = capsys.readouterr()
    assert rc == 1, (out, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("tuner: failed: WorkersStopped: study s: 2 of 2 worker processes stopped"), err
    assert "3 task(s) pending" in last and "run `tuner study run` again" in last, last
    assert "still running on other workers" not in out


# ---- PostgreSQL that only reads (a failover to a hot standby) ------------------------------------------------
@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_database()


def _read_only(url: str, on: bool) -> None:
    from sqlalchemy import create_engine, text

    from tests.pg import ADMIN_URL

    name = url.rsplit("/", 1)[1]
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        verb = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
        c.execute(text(f'ALTER DATABASE "{name}" {verb}'))  # new sessions only
    admin.dispose()


@pytest.mark.postgres
def test_a_read_only_server_is_named_so(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from tuner.runtime import ConfigCache
    from tuner.storage import StoreError

    f, _ = rt.make(storage=pg_url)
    rt.check_calls(f, (100,))
    close_stores()
    _read_only(pg_url, True)
    try:
        caplog.set_level(logging.WARNING)
        g, bench = rt.make(storage=pg_url)
        rt.check_calls(g, (100,))  # a stored entry: read, a hit
        assert g.tuner.stats["from_store"] == 1 and bench.calls == 0
        rt.check_calls(g, (200,))  # a new key: tuned in memory, one warning that says why
        msgs = rt.store_warnings(caplog)
        assert len(msgs) == 1 and "the server only reads" in msgs[0], msgs
        with pytest.raises(StoreError, match="the server only reads .*read-only transaction"):
            ConfigCache(pg_url).merge(ConfigCache(pg_url).entries())
    finally:
        close_stores()
        _read_only(pg_url, False)


@pytest.mark.postgres
def test_study_workers_on_a_server_that_turned_read_only_fail_the_run(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.studies import PENDING, TaskBoard, load_study, prepare_study

    p = write_study(tmp_path, n_m=2, budget=2)
    spec = prepare_study(load_study(p, storage=pg_url, check_kernels=False))
    _read_only(pg_url, True)  # the workers' new sessions land on a server that only reads
    try:
        capsys.readouterr()
        rc = cli(
            "study", "run", str(p), "--storage", pg_url, "--workers", "2", "--executor",
            "tests._study_fake:executor", "--no-report",
        )  # fmt: skip
        out, err = capsys.readouterr()
    finally:
        close_stores()
        _read_only(pg_url, False)
    assert rc == 1, (out, err)
    assert "WorkersStopped: study s: 2 of 2 worker processes stopped" in err, err
    board = TaskBoard(pg_url)
    try:
        assert {r.status for r in board.rows(spec.name)} == {PENDING}  # nothing lost, nothing half-done
    finally:
        board.close()


def test_a_worker_whose_hand_back_fails_does_not_say_the_task_went_back(
    _tuner_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # On a server that only reads (or a full disk), the hand-back fails as the trial did; the log said
    # "task ... goes back to the queue" while the task stayed held until its lease ran out.
    from tuner.store import StoreError
    from tuner.studies import RUNNING, StudyWorker, load_study, prepare_study

    spec = prepare_study(
        load_study(write_study(tmp_path, n_m=1, budget=2, lease_seconds=30), check_kernels=False)
    )
    worker = StudyWorker(spec, executor=refusing_executor)

    def cannot(*args: Any, **kw: Any) -> bool:
        raise StoreError("store x: the hand-back cannot be written either")

    monkeypatch.setattr(worker.board, "finish", cannot)
    caplog.set_level(logging.ERROR)
    try:
        with pytest.raises(StoreError, match="the test's store"):
            worker.run()
        (row,) = worker.board.rows(spec.name)
    finally:
        worker.board.close()
    assert row.status == RUNNING  # held by the lease, as the log line must say
    # its ERROR line (a run under `-o log_level=INFO` also captures the study's INFO lines before it)
    (msg,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tuner.studies._runner" and r.levelno >= logging.ERROR
    ]
    assert "goes back to the queue" not in msg, msg
    assert (
        "could not be handed back (StoreError); another worker takes it over when its lease runs out" in msg
    )
