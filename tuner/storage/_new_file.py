"""A SQLite store that could not be created leaves no empty file behind.

`sqlite3.connect` makes the file before anything is written into it, so a store whose creation fails (a
full disk, most often: the file is made, its first page is not) left a 0-byte `tuner.db`, and its schema
lock file `tuner.db.lock`, in the folder. `NewFile.before_opening(url)`, taken before the first
connection, remembers that no file was at the path; when the opening fails, `remove_if_empty()` deletes
what this call made, only:

- the database file, when it was not there before this call and is still empty (0 bytes). A file with a
  page in it is kept: it may be another process's new store, whose tables are only in its write-ahead log.
  The `-wal` and `-shm` files are never touched (deleting them under a process that opens the store can
  corrupt it); closing this process's connections first lets SQLite remove its own. Those are its shared
  engine's, which has no file open at the path: where it has one (deleted since), it refuses to make a
  new one, the opening makes nothing, and neither the file nor that engine, which a run of this process
  may still use, is touched (`before_opening`).
- the lock file, when it was not there before either, and only while this call holds its lock: a process
  that creates the schema holds it for as long as it does (`_migrate._file_lock`), so a file that another
  process is creating at the same moment is left to it. `_file_lock` checks, once it has the lock, that
  its file is still the one at the path, so a lock file deleted here never leaves two holders.

What cannot be seen from here: another process that has just connected to the same new, empty file and
has not taken the schema lock yet. Its writes into the deleted file are then refused (`_replaced`) with
an error naming the store, and its next try makes the file again; it does not lose anything silently.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ._engine import sqlite_path
from ._replaced import pinned

log = logging.getLogger(__name__)

__all__ = ["NewFile", "is_at"]


@dataclass(frozen=True)
class NewFile:
    """The SQLite file of a store that the opening now under way would create (`before_opening`)."""

    path: str
    lock_was_there: bool

    @classmethod
    def before_opening(cls, url: str) -> NewFile | None:
        """The file of SQLite `url` when nothing is at its path yet, else None (an existing file, a server
        or in-memory database, a `file:` URI). None as well when this process has a file open at the path
        that was deleted since (`_replaced.pinned`): its shared engine refuses to make a new file there,
        so the opening makes nothing to remove, and that engine is not this opening's to dispose of: a
        run that still uses it (`holding`) would lose its pin and go on in a new, empty file made at the
        path."""
        path = sqlite_path(url)
        if path is None or path.startswith("file:"):
            return None
        path = os.path.abspath(path)
        if os.path.lexists(path) or pinned(path):
            return None
        return cls(path, os.path.lexists(path + ".lock"))

    def remove_if_empty(self, engine: Engine | None) -> bool:
        """After a failed opening: close `engine`'s connections (this process's engine of the store) and
        delete the file this call made if it is still empty, with its lock file (see the module). Whether
        the file was deleted. Never raises: the opening's own error is the one to report."""
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.dispose()
        try:
            return self._remove()
        except OSError as exc:
            log.debug("store %s: the empty file this call made was not removed (%s)", self.path, exc)
            return False

    def _remove(self) -> bool:
        lock_path = self.path + ".lock"
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no flock; the lock file stays
            fcntl = None  # type: ignore[assignment]
        fd = -1
        if fcntl is not None:
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(lock_path, os.O_RDWR)
        try:
            if fd >= 0:
                assert fcntl is not None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another process creates the schema in this file now
                    return False
            st = os.stat(self.path)
            if st.st_size != 0:
                return False
            os.unlink(self.path)
            log.debug("store %s: removed the empty file its failed opening made", self.path)
            if fd >= 0 and not self.lock_was_there and is_at(fd, lock_path):
                os.unlink(lock_path)
            return True
        except FileNotFoundError:  # removed already (another process's failed opening)
            return False
        finally:
            if fd >= 0:
                os.close(fd)  # releases the lock


def is_at(fd: int, path: str) -> bool:
    """The open file `fd` is the file at `path` now."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
