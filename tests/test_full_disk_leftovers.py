"""What a full disk leaves behind: the files and folders tuner makes on first use (a new store, its schema
lock file, the miss log of record mode, a study's output folder, an export's folder) are removed again when
what was to go into them could not be written; what was there before, and what another process may be
making at the same moment, is left alone. And record mode's counts that the last flush at exit cannot
write are named on stderr, not lost in silence.

The full-disk cases run on a real tmpfs (root and mount(8), as tests/test_prod_faults.py: they skip where
mounting is not permitted); each has an unprivileged twin that makes the same failure from Python."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import test_runtime_faults as rt
from tests.test_prod_faults import _fill, _tmpfs
from tests.test_runtime_faults import _fresh_stores, mount  # noqa: F401 - the fixtures
from tests.test_studies import REPO, cli, write_study
from tuner.runtime._sources import close_stores


def _left(folder: Path) -> list[tuple[str, int]]:
    """Everything under `folder` but the filler: (relative path, size; -1 for a folder)."""
    out = []
    for p in sorted(folder.rglob("*")):
        if p.name != "filler":
            out.append((str(p.relative_to(folder)), -1 if p.is_dir() else p.stat().st_size))
    return out


def _full(tmp_path: Path, mounter: Callable[..., None], room: int = 0) -> Path:
    """A small tmpfs filled to `room` bytes of free space."""
    small = _tmpfs(tmp_path / "small", mounter, "256k")
    if room == 0:
        _fill(small)
    else:
        st = os.statvfs(small)
        (small / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - room))
    return small


# ---- a new store ---------------------------------------------------------------------------------------
def _open(kind: str, url: str) -> Any:
    from tuner.runtime import ConfigCache
    from tuner.store import ResultStore
    from tuner.studies import TaskBoard

    return {"ResultStore": ResultStore, "ConfigCache": ConfigCache, "TaskBoard": TaskBoard}[kind](url)


@pytest.mark.parametrize("kind", ["ResultStore", "ConfigCache", "TaskBoard"])
@pytest.mark.parametrize("room", [0, 4096])
def test_a_new_store_on_a_full_disk_leaves_no_empty_file(
    tmp_path: Path,
    kind: str,
    room: int,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # A 0-byte tuner.db (and, with a page of room, a 0-byte tuner.db.lock) stayed in the folder.
    from tuner.store import ResultStore, StoreError

    small = _full(tmp_path, mount, room)
    url = f"sqlite:///{small / 'tuner.db'}"
    with pytest.raises(StoreError, match=f"the disk that holds {small} is full"):
        _open(kind, url)
    assert _left(small) == []
    # space back: the same process makes the store there (the removed file is not taken for a replaced one)
    (small / "filler").unlink()
    _open(kind, url)
    s = ResultStore(url)
    assert not s.read_only and s.full_disk is None
    close_stores()


def test_a_new_store_with_a_page_of_room_is_kept_and_named_a_full_disk(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # With room for the first page the new file is not empty: it is kept (another process's new store may
    # have its tables in its log). Its error said "read-only (its folder cannot be written) and not at
    # this tuner's schema" (the new file was opened read-only as a full disk's store), and so did every
    # later opening of it while the disk stayed full.
    from tuner.store import ResultStore, StoreError

    small = _full(tmp_path, mount, 8192)
    url = f"sqlite:///{small / 'tuner.db'}"
    for _ in range(2):  # the call that made the file, then one that finds it
        with pytest.raises(StoreError) as exc:
            ResultStore(url)
        msg = str(exc.value)
        assert "cannot be written" not in msg and "disk" in msg and "full" in msg, msg
    assert ("tuner.db", 4096) in _left(small)


def test_a_failed_opening_removes_only_the_empty_file_it_made(
    _tuner_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the unprivileged twin: the schema cannot be made after SQLite made the file
    from tuner.store import ResultStore, StoreError

    db = _tuner_home / "new.db"

    def full(engine: Any) -> None:
        db.touch()  # the file SQLite made, empty (its first page did not fit)
        raise StoreError("store x: the test's disk is full")

    monkeypatch.setattr("tuner.store.ensure_schema", full)
    with pytest.raises(StoreError, match="the test's disk"):
        ResultStore(f"sqlite:///{db}")
    assert list(_tuner_home.iterdir()) == []
    db.touch()  # an empty file that was there before the call: not this call's to remove
    with pytest.raises(StoreError, match="the test's disk"):
        ResultStore(f"sqlite:///{db}")
    assert db.exists()


def test_a_new_file_that_another_process_makes_a_store_of_is_kept(
    _tuner_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process holds the schema lock (it creates the tables in the same new file): the empty
    # file is its, and stays, with its lock file.
    import fcntl

    from tuner.store import ResultStore, StoreError

    db = _tuner_home / "new.db"
    holder = os.open(str(db) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: conflicts as another process's would

    def full(engine: Any) -> None:
        db.touch()  # the file SQLite made, empty (its first page did not fit)
        raise StoreError("store x: the test's disk is full")

    monkeypatch.setattr("tuner.store.ensure_schema", full)
    try:
        with pytest.raises(StoreError, match="the test's disk"):
            ResultStore(f"sqlite:///{db}")
        assert db.exists() and db.stat().st_size == 0 and Path(str(db) + ".lock").exists()
    finally:
        os.close(holder)


def test_the_schema_lock_follows_a_lock_file_removed_under_a_waiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed first opening removes the lock file it made while it holds it; a process that waited on
    # that file then held a lock on a removed file, and a third process could take the new one: two
    # holders at once.
    import fcntl

    from tuner.storage._migrate import _file_lock

    db = str(tmp_path / "s.db")
    first = os.open(db + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(first, fcntl.LOCK_EX)
    waiting, held, leave = threading.Event(), threading.Event(), threading.Event()
    real_flock = fcntl.flock

    def flock(fd: int, how: int) -> None:
        if threading.current_thread() is t:
            waiting.set()  # its file is open: the one about to be removed
        real_flock(fd, how)

    def waiter() -> None:
        with _file_lock(db):
            held.set()
            leave.wait(10)

    monkeypatch.setattr(fcntl, "flock", flock)
    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(10)
    os.unlink(db + ".lock")  # as `NewFile.remove_if_empty` does, holding the lock
    os.close(first)
    assert held.wait(10)
    third = os.open(db + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(BlockingIOError):  # the waiter holds the file at the path now
            fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(third)
        leave.set()
        t.join(10)


def test_a_study_run_on_a_full_disk_leaves_no_empty_output_folder(
    tmp_path: Path,
    _tuner_home: Path,
    capsys: pytest.CaptureFixture[str],
    mount: Callable[..., None],  # noqa: F811
) -> None:
    small = _tmpfs(tmp_path / "small", mount, "256k")
    p = write_study(small)  # output = "out-s", beside the study file
    _fill(small)
    capsys.readouterr()
    assert cli("study", "run", str(p), "--executor", "tests._study_fake:executor", "--no-report") == 1
    err = capsys.readouterr().err
    assert f"the disk that holds {small / 'out-s'} is full" in err, err
    assert _left(small) == [("s.toml", p.stat().st_size)]  # was: out-s/ (and out-s/study.db, 0 bytes)


# ---- files written whole: an export into a new folder --------------------------------------------------
def test_an_export_into_a_new_folder_on_a_full_disk_leaves_no_folder(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    from tuner._atomic import atomic_write

    small = _full(tmp_path, mount)
    (small / "ship").mkdir()  # there before: stays
    with pytest.raises(OSError) as exc:
        atomic_write(small / "ship" / "v2" / "gpu" / "tuned.json", "x" * 100_000, mkdir=True)
    assert exc.value.errno == errno.ENOSPC and "tuned.json" in str(exc.value)
    assert _left(small) == [("ship", -1)]  # was: ship/v2/gpu/, empty


def test_a_failed_write_removes_the_folders_it_made_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the unprivileged twin
    from tuner import _atomic

    monkeypatch.setattr(
        _atomic.os,
        "fsync",
        lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")),
    )
    tmp_path = tmp_path / "w"
    (tmp_path / "a").mkdir(parents=True)
    with pytest.raises(OSError):
        _atomic.atomic_write(tmp_path / "a" / "b" / "c" / "f.json", "x", mkdir=True)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a"]
    # a folder another process put a file into meanwhile stays, with those above it
    made = _atomic.make_folders(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    (tmp_path / "a" / "b" / "theirs").write_text("x", encoding="utf-8")
    _atomic.remove_made_folders(made)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["a", "a/b", "a/b/theirs"]


# ---- record mode -----------------------------------------------------------------------------------------
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
rec.flush_s = 3600  # flushed below and at exit, not by the writer thread's clock
small = os.path.dirname(os.environ["TUNER_MISSES_DIR"])
filler = os.path.join(small, "filler")
with open(filler, "wb", buffering=0) as fh:
    try:
        while True:
            fh.write(b"\\0" * 4096)
    except OSError:
        pass
for n in range(1, 6):
    f(np.ones(2), n)
    f(np.ones(2), n)
rec.flush()
print(rec.unwritten(), sorted(os.listdir(small)), flush=True)
if sys.argv[1] == "space back":
    os.remove(filler)
"""


def _record(small: Path, how: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_MISSES_DIR": str(small / "m"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _RECORD, how],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )


def test_record_mode_names_the_counts_a_full_disk_loses_at_exit(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    # The flush at exit failed in silence (its warning was logged once, at the first failure, and at
    # DEBUG after): 10 calls of 5 keys were gone without a word, and a 0-byte miss log (and its folder)
    # stayed on the disk.
    from tuner.runtime._misses import read_misses

    small = _full(tmp_path, mount)
    (small / "filler").unlink()
    r = _record(small, "still full")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "(5, 10) ['filler']", (r.stdout, r.stderr)  # kept, nothing on disk
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "tuner: record mode: 10 call(s) of 5 missed key(s) were not written to the miss log "
    ), last
    assert str(small / "m") in last and "No space left on device" in last and "lost" in last, last
    assert _left(small) == [], _left(small)
    assert read_misses(small / "m") == []


def test_record_mode_keeps_the_counts_until_space_is_back(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    from tuner.runtime._misses import read_misses

    small = _full(tmp_path, mount)
    (small / "filler").unlink()
    r = _record(small, "space back")
    assert r.returncode == 0, r.stderr
    assert "lost" not in r.stderr, r.stderr
    assert "is written again" in r.stderr, r.stderr  # the warning of the failure is followed up
    rows = read_misses(small / "m")
    assert len(rows) == 5 and sum(x.calls for x in rows) == 10, [(x.key.fields_dict, x.calls) for x in rows]


def test_a_new_miss_log_that_a_full_disk_cuts_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the unprivileged twin: the first write of a new miss log fails for want of space
    from tuner.runtime import _misses

    tmp_path = tmp_path / "w"
    tmp_path.mkdir()
    monkeypatch.setenv("TUNER_MISSES_DIR", str(tmp_path / "m" / "logs"))
    rec = _misses.MissRecorder()
    monkeypatch.setattr(rec, "_ensure_thread", lambda: None)  # flushed below only
    monkeypatch.setattr(_misses, "_recorder", rec)
    f, _ = rt.make(mode="record", storage=False, name="rec_leftover")
    rt.check_calls(f, (1, 2, 2))

    def no_space(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_write = os.write
    monkeypatch.setattr(_misses.os, "write", no_space)
    assert rec.flush() == 0
    assert list(tmp_path.iterdir()) == []  # no 0-byte log, no folder
    assert rec.unwritten() == (2, 3)
    rec.flush_at_exit()
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("tuner: record mode: 3 call(s) of 2 missed key(s)")
    assert str(tmp_path / "m" / "logs") in line and os.strerror(errno.ENOSPC) in line, line
    monkeypatch.setattr(_misses.os, "write", real_write)
    rec.flush_at_exit()  # space back: everything written, nothing said
    assert capsys.readouterr().err == ""
    rows = [r for r in _misses.read_misses() if r.key.kernel.endswith("rec_leftover")]
    assert sorted((r.key.fields_dict["n"], r.calls) for r in rows) == [(1, 1), (2, 2)]
    close_stores()


# ---- the removal of a folder made and another writer of the same folder -----------------------------------
def test_a_write_into_a_folder_that_another_writers_failure_removes_makes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two exports into the same new folder: one made it, this one found it there, then the first one's
    # write failed and it removed the folder, still empty, before this one made its file in it: this
    # write failed with FileNotFoundError (folders were never removed before, so it never did).
    from tuner import _atomic

    shared = tmp_path / "w" / "ship"
    shared.mkdir(parents=True)  # made by the other writer
    real_open, removed = os.open, []

    def open_(path: Any, *a: Any, **kw: Any) -> int:
        if not removed and str(path).endswith(".tmp"):
            removed.append(path)
            shared.rmdir()  # the other writer's failure: the empty folder it made goes
        return real_open(path, *a, **kw)

    monkeypatch.setattr(_atomic.os, "open", open_)
    _atomic.atomic_write(shared / "tuned.json", "x", mkdir=True)
    assert removed and (shared / "tuned.json").read_text(encoding="utf-8") == "x"
    # a folder above removed while this call makes the ones below it
    deep, real_mkdir, gone = tmp_path / "w" / "v2", Path.mkdir, []

    def mkdir(self: Path, *a: Any, **kw: Any) -> None:
        if not gone and self == deep / "gpu":
            gone.append(self)
            deep.rmdir()
        real_mkdir(self, *a, **kw)

    deep.mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    _atomic.atomic_write(deep / "gpu" / "tuned.json", "y", mkdir=True)
    assert gone and (deep / "gpu" / "tuned.json").read_text(encoding="utf-8") == "y"


def test_the_folders_made_are_removed_where_they_were_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative folder, then a chdir (another thread's) before the write failed: the folders were
    # removed by their relative names, in the new current folder: another empty folder of that name
    # went, and the one made stayed.
    from tuner import _atomic

    (tmp_path / "one").mkdir()
    (tmp_path / "two" / "out").mkdir(parents=True)  # someone's, empty
    monkeypatch.chdir(tmp_path / "one")
    made = _atomic.make_folders("out")
    monkeypatch.chdir(tmp_path / "two")
    _atomic.remove_made_folders(made)
    assert (tmp_path / "two" / "out").is_dir()
    assert not (tmp_path / "one" / "out").exists()


def _recorder_in(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str) -> tuple[Any, Any]:
    """A record-mode function and the recorder it writes to `folder` (made) with, flushed by the test only;
    two keys and three calls counted."""
    from tuner.runtime import _misses

    folder.mkdir()
    monkeypatch.setenv("TUNER_MISSES_DIR", str(folder))
    rec = _misses.MissRecorder()
    monkeypatch.setattr(rec, "_ensure_thread", lambda: None)
    monkeypatch.setattr(_misses, "_recorder", rec)
    f, _ = rt.make(mode="record", storage=False, name=name)
    rt.check_calls(f, (1, 2, 2))
    return f, rec


def test_a_miss_log_whose_folder_another_process_removes_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process made the misses folder, its first write failed and it removed the folder (empty)
    # while this process was about to make its log in it: this flush failed, and one at exit lost the counts.
    from tuner.runtime import _misses

    _, rec = _recorder_in(monkeypatch, folder := tmp_path / "m", "rec_vanish")
    real_open, removed = os.open, []

    def open_(path: Any, flags: int, *a: Any) -> int:
        if not removed and flags & os.O_CREAT:
            removed.append(path)
            folder.rmdir()
        return real_open(path, flags, *a)

    monkeypatch.setattr(_misses.os, "open", open_)
    assert rec.flush() == 2
    assert removed and rec.unwritten() == (0, 0) and rec.write_errors == 0
    close_stores()


def test_a_miss_log_name_that_cannot_be_opened_or_made_fails_the_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dangling symbolic link at the log's name: appending finds no file, creating finds the name taken,
    # and the flush looped between the two for ever (the writer thread spun, and so did the exit).
    _, rec = _recorder_in(monkeypatch, folder := tmp_path / "m", "rec_dangling")
    rec._file = folder / "x.jsonl"
    os.symlink(tmp_path / "nowhere", rec._file)
    t = threading.Thread(target=rec.flush, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert rec.write_errors == 1 and rec.unwritten() == (2, 3) and "x.jsonl" in str(rec.last_error)
    close_stores()


def test_a_forked_child_warns_of_its_own_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The child inherited the parent's "failed once": its own first failure was logged at DEBUG only, and
    # its first write said "written again, the counts kept meanwhile included" of counts it never kept.
    import logging

    from tuner.runtime import _misses

    f, rec = _recorder_in(monkeypatch, tmp_path / "m", "rec_fork")
    real_write = os.write

    def no_space(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_misses.os, "write", no_space)
    assert rec.flush() == 0  # the parent's failure, warned
    rec._after_fork()  # as in a forked child
    monkeypatch.setattr(rec, "_ensure_thread", lambda: None)
    caplog.clear()
    rt.check_calls(f, (1,))
    with caplog.at_level(logging.DEBUG, logger=_misses.__name__):
        assert rec.flush() == 0
        monkeypatch.setattr(_misses.os, "write", real_write)
        rt.check_calls(f, (2,))
        assert rec.flush() == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2 and "cannot write" in warned[0] and "written again" in warned[1], warned
    close_stores()


def test_a_failed_miss_log_write_leaves_the_tuner_home_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The misses folder is $TUNER_HOME/misses; the flush made both. While it wrote, the store of this
    # process was opened (`default_storage_url` makes TUNER_HOME, found there); the write failed, and the
    # flush removed the empty TUNER_HOME it had made: the store's file could not be made ("unable to open
    # database file", its folder gone). The misses folder it made goes; TUNER_HOME stays.
    from tuner.runtime import _misses
    from tuner.store import ResultStore, default_storage_url

    home = tmp_path / "w" / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    rec = _misses.MissRecorder()
    monkeypatch.setattr(rec, "_ensure_thread", lambda: None)
    monkeypatch.setattr(_misses, "_recorder", rec)
    f, _ = rt.make(mode="record", storage=False, name="rec_home")
    rt.check_calls(f, (1, 2, 2))
    urls = []

    def no_space(fd: int, data: Any) -> int:
        urls.append(default_storage_url())  # another thread opens the default store meanwhile
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_misses.os, "write", no_space)
    assert rec.flush() == 0 and rec.unwritten() == (2, 3)
    assert sorted(str(p.relative_to(tmp_path / "w")) for p in (tmp_path / "w").rglob("*")) == ["home"]
    assert ResultStore(urls[0]).count() == 0
    close_stores()
