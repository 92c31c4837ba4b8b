"""How a SQLite store in a folder that cannot be written is read (`read_only_url`): a read-only mount, a
store shipped in a container image or beside a model, a shared folder of another user.

SQLite keeps the changes since the last checkpoint in the `-wal` file and the index of that file in the
`-shm` file, which it makes beside the database: it cannot make it in such a folder. tuner's last connection
to a store checkpoints it and removes both, so a store tuner closed is one file, read as it is
(`immutable=1`: no lock, no `-shm`). A store whose last writer did not close it (killed, or copied while
open) has committed rows that are only in its non-empty `-wal`; read as it is, they would be missed (older
winners, missing entries). Such a store is read, in this order:

1. in place through SQLite's locks (`mode=ro`), when its `-shm` is there and can be read: SQLite (3.22 and
   later) then reads the log without writing anything (`locked_read_only_url`), and sees what another
   process still writing the store commits;
2. else from a private copy of the database and its log (`snapshot`), made in the temporary folder and
   checkpointed there: every row committed when the copy was made; the copies are removed when the process
   exits;
3. else as it is, with one warning that names the log, its size and why it could not be read.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sqlite3
import stat
import tempfile
from dataclasses import dataclass
from urllib.parse import quote

from ._engine import immutable_url_unwarned, locked_read_only_url, snapshot_sources

__all__ = ["WAL_HEADER_BYTES", "read_only_file_url", "snapshot", "wal_frames"]

log = logging.getLogger(__name__)

WAL_HEADER_BYTES = 32  # a `-wal` file's header; each frame after it is a 24-byte header and one page
_WAL_FRAME_HEADER = 24
_COPY_TRIES = 3  # a copy that a checkpoint of another process changed under it is made again


@dataclass
class _Snapshot:
    folder: str
    copy: str
    source: tuple[tuple[int, int], tuple[int, int], bytes]  # what the copy was made of (`_state`)
    pid: int  # the process that made it (a forked child leaves its parent's copies alone)


_snapshots: dict[str, _Snapshot] = {}  # the latest copy of each store, by the store's path
_made: list[_Snapshot] = []  # every copy made, removed at exit
_said: set[str] = set()  # the logs named once per process


def wal_frames(path: str) -> tuple[int, int]:
    """(bytes, frames) of the `-wal` file of the SQLite file `path`; (0, 0) where it is missing or holds
    no frame. Frames are pages written since the last checkpoint: they may hold committed rows."""
    try:
        st = os.stat(path + "-wal")
    except OSError:
        return 0, 0
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    if size <= WAL_HEADER_BYTES:
        return 0, 0
    page = _page_size(path)
    return size, (size - WAL_HEADER_BYTES) // (page + _WAL_FRAME_HEADER) if page else 0


def _page_size(path: str) -> int:
    """The page size in the database file's header (bytes 16-17; 1 means 65536), or 0."""
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return 0
    if len(head) < 18:
        return 0
    n = int.from_bytes(head[16:18], "big")
    return 65536 if n == 1 else n


def read_only_file_url(path: str) -> str:
    """The URL that reads the existing SQLite file `path`, in a folder that cannot be written, with every
    committed row: see the module's docstring."""
    size, _frames = wal_frames(path)
    if size == 0:
        return immutable_url_unwarned(path)  # checkpointed: one file, read as it is
    why = _locked_read_fails(path)
    if why is None:
        _say_once(
            path,
            logging.INFO,
            "store %s is read-only and its write-ahead log holds changes (its last writer did not close "
            "it): read through SQLite's locks (mode=ro), the log included",
            path,
        )
        return locked_read_only_url(path)
    try:
        copy = snapshot(path)
    except OSError as exc:
        _warn_unread(path, why, f"copying it failed: {exc.strerror or exc}")
        return immutable_url_unwarned(path)
    if copy is None:
        _warn_unread(path, why, "copying it failed: another process kept checkpointing it")
        return immutable_url_unwarned(path)
    _say_once(
        path,
        logging.INFO,
        "store %s is read-only and its write-ahead log holds changes that SQLite cannot read in place "
        "(%s): read from a copy of both made now in %s (removed when this process exits)",
        path,
        why,
        os.path.dirname(copy),
    )
    return immutable_url_unwarned(copy)


def _locked_read_fails(path: str) -> str | None:
    """None where SQLite reads `path` read-only through its locks (`mode=ro`; it needs the `-shm` file
    there and readable), else why not, in a few words."""
    shm = path + "-shm"
    if not os.path.exists(shm):
        return f"there is no {os.path.basename(shm)} beside it, and none can be made there"
    if not os.access(shm, os.R_OK):
        return f"{os.path.basename(shm)} cannot be read"
    try:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        return f"SQLite: {exc}"
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a read: maps the -shm, reads the log
    except sqlite3.Error as exc:
        return f"SQLite: {exc}"
    finally:
        conn.close()
    return None


def _state(path: str) -> tuple[tuple[int, int], tuple[int, int], bytes]:
    """What a copy of `path` and its log is made of: the database's and the log's (size, mtime), and the
    log's header (its salts change when a writer starts the log anew)."""
    db, wal = os.stat(path), os.stat(path + "-wal")
    with open(path + "-wal", "rb") as f:
        head = f.read(WAL_HEADER_BYTES)
    return (db.st_size, db.st_mtime_ns), (wal.st_size, wal.st_mtime_ns), head


def snapshot(path: str) -> str | None:
    """A private copy of the SQLite file `path` with the rows of its `-wal` checkpointed into it, made in a
    new temporary folder; the same copy while neither file changed. None where a checkpoint of another
    process changed the database under each of a few copies. OSError where the files cannot be read or
    the temporary folder has no room (the partial copy removed)."""
    before = _state(path)
    old = _snapshots.get(path)
    if old is not None and old.source == before and os.path.isfile(old.copy):
        return old.copy
    for _ in range(_COPY_TRIES):
        folder = tempfile.mkdtemp(prefix="tuner-ro-")
        copy = os.path.join(folder, os.path.basename(path))
        try:
            shutil.copyfile(path, copy)
            # the log after the database: frames a writer appends meanwhile are whole or fail their
            # checksum (SQLite then stops at the last whole commit); a checkpoint that writes the database
            # meanwhile changes its mtime (made again)
            shutil.copyfile(path + "-wal", copy + "-wal")
            after = _state(path)
            if after[0] == before[0] and after[2] == before[2]:
                _checkpoint(copy)
                snap = _snapshots[path] = _Snapshot(folder, copy, after, os.getpid())
                _made.append(snap)
                snapshot_sources[copy] = path
                return copy
            before = after
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        shutil.rmtree(folder, ignore_errors=True)
    return None


def _checkpoint(copy: str) -> None:
    """Write the copy's log into it and remove the log: one file, read as it is."""
    conn = sqlite3.connect(copy)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error as exc:
        raise OSError(f"checkpointing the copy {copy}: {exc}") from exc
    finally:
        conn.close()  # the last connection: SQLite removes the copy's -wal and -shm


def _warn_unread(path: str, why: str, also: str) -> None:
    size, frames = wal_frames(path)
    _say_once(
        path,
        logging.WARNING,
        "store %s is read-only and its write-ahead log %s holds changes its last writer did not checkpoint "
        "(%d bytes, %d pages): they are NOT read (%s; %s), so entries stored since the last checkpoint are "
        "missing or older. Open the store once where its folder can be written (any tuner command that "
        "reads it, or `sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)'`), or make its -wal and -shm files readable",
        path,
        path + "-wal",
        size,
        frames,
        why,
        also,
    )


def _say_once(path: str, level: int, msg: str, *args: object) -> None:
    key = f"{level}:{path}"
    if key not in _said:
        _said.add(key)
        log.log(level, msg, *args)


@atexit.register
def _remove_snapshots() -> None:
    for snap in _made:
        if snap.pid == os.getpid():  # not a parent's, in a forked child
            with contextlib.suppress(OSError):
                shutil.rmtree(snap.folder)
