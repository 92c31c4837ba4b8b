"""A SQLite file deleted or replaced while this process has it open.

A SQLite connection keeps the file it opened: after `rm study.db` (or its folder removed, or the file
moved aside and another put in its place) it goes on reading and writing the unlinked file, every write
succeeds, and all of it is gone when the process exits; and a new connection to the path makes a new, empty
file there. So, for the SQLite engines of tuner (`watch_file`):

- each connection remembers the (device, inode) of the file it opened, and a transaction that wrote
  compares it with the path's before it commits: when the file is not there any more, or another file is,
  it raises `StoreError` naming the file, and the transaction is rolled back (nothing of it is written
  anywhere). One stat per written transaction; reads are not checked.
- the process pins the file its first connection opened: a new connection (another engine's included,
  Optuna's RDBStorage's: `check_file` before it is made) to a path whose file is not the pinned one is
  refused with the same error, so no new file is made there. The pin goes when the process's shared
  engine of the URL is disposed (`tuner.storage.engine_for`), which is how the path is opened again:
  the runtime's store does it when it finds its file replaced, `tuner study run` and `tuner.optimize`
  when they start, unless a run of this process still uses the file (`holding`): a file deleted between
  two runs (a notebook's `rm`) starts the next one anew, one deleted during a run stops that run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ._engine import StoreError, _operation, engine_of, normalize_url, sqlite_path

__all__ = [
    "check_file",
    "file_identity",
    "holding",
    "pinned",
    "reopen_if_replaced",
    "replaced_error",
    "watch_file",
]

_OPENED = "tuner_file_identity"  # connection record info: (device, inode) of the file it opened
_WROTE = "tuner_wrote"  # connection record info: its open transaction wrote
_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"})

_pinned: dict[str, tuple[int, int]] = {}  # absolute path -> the file this process opened there
_held: dict[str, int] = {}  # absolute path -> how many runs of this process use the file now
_pin_lock = threading.Lock()


def _file_of(url: str) -> str | None:
    path = sqlite_path(normalize_url(url))
    return None if path is None or path.startswith("file:") else os.path.abspath(path)


@contextmanager
def holding(url: str) -> Iterator[None]:
    """A run of this process uses the SQLite file of `url` (nothing for other stores): while it lasts,
    `reopen_if_replaced` leaves the file pinned, so that another run starting meanwhile (a study's next
    task, a nested `optimize`) cannot make a new file where the run's file was deleted."""
    key = _file_of(url)
    if key is None:
        yield
        return
    with _pin_lock:
        _held[key] = _held.get(key, 0) + 1
    try:
        yield
    finally:
        with _pin_lock:
            _held[key] -= 1
            if not _held[key]:
                del _held[key]


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def replaced_error(path: str, outcome: str, *, during: str = "this process had it open") -> StoreError:
    """The error of a SQLite file at `path` deleted or replaced while `during`; `outcome` says what was
    not written."""
    now = "no file is there now" if file_identity(path) is None else "another file is there now"
    return StoreError(
        f"store {path} was deleted or replaced while {during} ({now}): {outcome} (SQLite would go on "
        "writing into the deleted file, which is lost when the process exits); what the old file held is "
        "gone with it, unless it was moved aside: then move it back and run again to resume"
    )


def check_file(path: str, what: str) -> None:
    """Raise `replaced_error` when the file at `path` is not the one this process opened there (nothing
    when it opened none, or has let go of it)."""
    was = _pinned.get(os.path.abspath(path))
    if was is not None and file_identity(path) != was:
        raise replaced_error(path, f"{what} was not done, and nothing more is written")


def pinned(path: str) -> bool:
    """This process has a file at `path` open (pinned): its connections to the path refuse to make a new
    file there until the process lets go of it (`reopen_if_replaced`)."""
    return os.path.abspath(path) in _pinned


def _unpin(path: str) -> None:
    with _pin_lock:
        _pinned.pop(os.path.abspath(path), None)


def reopen_if_replaced(url: str) -> bool:
    """Let go of the SQLite file of `url` when it was deleted or replaced since this process opened it:
    dispose of the process's shared engine of `url` (its next connection opens the path as it is now)
    and unpin it. Whether it was replaced. Nothing while a run of this process holds the file
    (`holding`): that run's next write raises instead."""
    path = _file_of(url)
    if path is None:
        return False
    was = _pinned.get(path)
    if was is None or file_identity(path) == was or _held.get(path):
        return False
    eng = engine_of(url)
    if eng is not None:
        eng.dispose()  # unpins (`watch_file(owner=True)`)
    _unpin(path)
    return True


def _info(conn: Connection) -> dict[Any, Any] | None:
    """The info of a connection's DBAPI connection; None once it was invalidated (a KeyboardInterrupt in
    a statement, a lost connection): it is thrown away, and asking for its info would raise
    PendingRollbackError in place of the error that invalidated it."""
    return None if conn.invalidated or conn.closed else conn.info


def watch_file(engine: Engine, path: str, *, owner: bool = False) -> None:
    """Refuse a commit of `engine` that wrote into a file that is no longer at `path`, and a new connection
    to a path whose file is not the one this process opened. `owner`: the process's shared engine of the
    path; disposing of it lets go of the file."""
    key = os.path.abspath(path)
    # A connection made before this was installed (Optuna's RDBStorage connects while it is created)
    # opened the file that is there now.
    installed = file_identity(path)

    def _do_connect(*_: Any) -> None:
        check_file(path, _operation.get() or "opening it")

    def _connect(_dbapi_conn: Any, record: Any) -> None:
        opened = file_identity(path)  # sqlite3.connect has made the file by now
        record.info[_OPENED] = opened
        if opened is not None:
            with _pin_lock:
                _pinned.setdefault(key, opened)

    def _before_execute(conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        info = _info(conn)
        if info is not None and not info.get(_WROTE):
            head = statement.lstrip()[:8].split(None, 1)
            if head and head[0].upper() in _WRITES:
                info[_WROTE] = True

    def _commit(conn: Connection) -> None:
        info = _info(conn)
        if info is None or not info.pop(_WROTE, False):
            return
        opened = info.get(_OPENED, installed)
        if opened is None:  # the file was not there when this connection was made: it is this one
            info[_OPENED] = opened = file_identity(path)
        if file_identity(path) != opened:
            info[_WROTE] = True  # and every later commit of this connection is refused as well
            what = _operation.get() or "a write"
            raise replaced_error(path, f"{what} was not written, and nothing more is")

    def _rollback(conn: Connection) -> None:
        info = _info(conn)
        if info is not None:
            info.pop(_WROTE, None)

    event.listen(engine, "do_connect", _do_connect)
    event.listen(engine, "connect", _connect)
    event.listen(engine, "before_cursor_execute", _before_execute)
    event.listen(engine, "commit", _commit)
    event.listen(engine, "rollback", _rollback)
    if owner:
        event.listen(engine, "engine_disposed", lambda _engine: _unpin(path))


def _after_fork_in_child() -> None:  # a parent thread may have held the lock at the fork
    global _pin_lock
    _pin_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
