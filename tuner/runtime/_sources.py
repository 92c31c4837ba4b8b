"""Where stored configs come from besides memory: shipped cache files and the store, and the guard that
keeps them from taking a call down.

Every access the miss path makes to a cache file or to the store goes through this module. A file that
cannot be read (missing, unreadable, corrupt) is skipped; an entry of it that fails validation is dropped
and the rest are used (`load_cache`, one warning naming the dropped entries); `$TUNER_CACHE_FILE` is read
again when the file changes (path, mtime, size, inode). A store that cannot be opened, read or written
(read-only home, corrupt or truncated database, a lock held past the store's timeout, a full disk) is
left out of the resolution chain for that step, and the call goes on with memory, the other layers and,
online, tuning in memory. Each cause is logged once per process as a warning (`warn_once`), never
raised. Errors of the caller's own making (an entry that fails validation) are not store faults and are
not swallowed here.

Extension point: a new layer that reads or writes the store (a recorder of misses, say) wraps its
calls in `guarded(store, "read"|"write", what, fn, default)` and gets the same behaviour.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from tuner._settings import text

from ._entry import EntryError
from ._file import CacheFileError, ReadOnlyCache, load_cache

if TYPE_CHECKING:  # pragma: no cover
    from ._db import ConfigCache

log = logging.getLogger(__name__)

__all__ = [
    "set_global_cache",
    "env_cache",
    "file_caches",
    "open_store",
    "close_stores",
    "guarded",
    "warn_once",
    "STORE_RETRY_S",
]

T = TypeVar("T")

STORE_RETRY_S = 30.0  # a store that failed to open is not tried again for this long

_global_cache: ReadOnlyCache | None = None
# path -> (the file's stat signature when read, what was read): read again when the signature changes
_env_caches: dict[str, tuple[tuple[int, int, int] | None, ReadOnlyCache | None]] = {}
_dbs: dict[str, ConfigCache] = {}
_failed_opens: dict[str, float] = {}  # url -> time of the last failed open
_files: dict[str, tuple[int, int] | None] = {}  # url -> (device, inode) of its SQLite file when opened
_full_since: dict[str, float] = {}  # url -> when it was opened read-only for a full disk (opened again later)
# `_dbs_lock` is held only to read or change the dicts above, never while a store is opened: opening may wait
# long (for a PostgreSQL connection slot, up to TUNER_PG_CONNECT_WAIT; for another process's schema lock),
# and a process-wide lock held meanwhile made every decorated function's store look-up wait as long, those
# of SQLite stores too. The thread that opens a store holds that store's lock in `_opening` instead: the
# other threads of that store wait for it (one ConfigCache per store), those of other stores do not.
_dbs_lock = threading.Lock()
_opening: dict[str, threading.Lock] = {}  # url -> the lock held while that store is opened
# How many times `close_stores` has run. An opening reads it when it starts and keeps nothing of itself when
# it changed meanwhile (a close ran while it opened outside `_dbs_lock`): it disposes of the store it made
# and opens the store again, rather than register, after the close, a store and engine the close was meant
# to drop (a filesystem pulled away, connections that came from before a fork).
_closes = 0
# store -> when one of its writes last waited out the store's timeout (a SQLite lock held by another
# process, a PostgreSQL statement timeout): its writes are skipped until STORE_RETRY_S has passed, so each
# new key does not wait the whole timeout again (60 s by default) while the lock is held
_write_paused: weakref.WeakKeyDictionary[ConfigCache, float] = weakref.WeakKeyDictionary()
# store -> when a read of it waited out the store's timeout, or when a new connection to it could not be made
# (no answer within connect_timeout; refused, for a connection limit after TUNER_PG_CONNECT_WAIT seconds of
# trying again): neither its reads nor its writes are tried until STORE_RETRY_S has passed. Dropping it
# from `_dbs` alone left it to a call that already held it: each of that call's next reads and writes
# waited as long again (a miss makes four).
_unused_since: weakref.WeakKeyDictionary[ConfigCache, float] = weakref.WeakKeyDictionary()
_warned: set[tuple[str, ...]] = set()
_warned_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """New locks in a forked child: a parent thread may have held one at the fork (opening a store, whose
    schema creation can wait on another process's lock), and would never release it here. The stores
    stay: their engines get new connection pools (`tuner.storage._engine`)."""
    global _dbs_lock, _opening, _warned_lock
    _dbs_lock, _opening = threading.Lock(), {}
    _warned_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def warn_once(cause: tuple[str, ...], msg: str, *args: Any) -> None:
    """Log `msg` as a warning the first time `cause` is seen in this process, at debug level after."""
    with _warned_lock:
        first = cause not in _warned
        _warned.add(cause)
    (log.warning if first else log.debug)(msg, *args)


def _store_errors() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    from ..store import StoreError

    # ValueError: a corrupt schema-version row; OSError: the home directory, the file, the disk.
    return (StoreError, SQLAlchemyError, sqlite3.Error, OSError, ValueError)


def _redact(url: str) -> str:
    """`tuner.storage.redact`, imported at the call: tuner.storage brings SQLAlchemy, which a process that
    reads only shipped files never needs."""
    from ..storage import redact

    return redact(url)


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# ---- shipped files ---------------------------------------------------------------------------------------
def set_global_cache(cache: ReadOnlyCache | str | os.PathLike[str] | None) -> ReadOnlyCache | None:
    """Make a shipped cache file (or a loaded ReadOnlyCache) visible to every decorated function.
    `$TUNER_CACHE_FILE` does the same from the environment."""
    global _global_cache
    _global_cache = load_cache(cache) if isinstance(cache, (str, os.PathLike)) else cache
    return _global_cache


def _stat_signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def env_cache() -> ReadOnlyCache | None:
    """The file named by `$TUNER_CACHE_FILE`, loaded once per path and version of the file (read again
    when its mtime, size or inode change: a file replaced by a new export); one that cannot be used is
    skipped with one warning per version of the file (the call goes on with the other layers) until it
    changes."""
    path = text("TUNER_CACHE_FILE")
    if not path:
        return None
    sig = _stat_signature(path)
    got = _env_caches.get(path)
    if got is not None and got[0] == sig:
        return got[1]
    try:
        c: ReadOnlyCache | None = load_cache(path)
    except CacheFileError as exc:
        # once per version of the file, not per path: a service that started before the first export was
        # there (one warning) and is later shipped a broken file must say so again (it logged nothing)
        warn_once(
            ("file", path, repr(sig)),
            "TUNER_CACHE_FILE is not usable, so it is skipped until the file changes: %s",
            exc,
        )
        c = None
    _env_caches[path] = (sig, c)
    return c


def file_caches(own: ReadOnlyCache | None) -> list[ReadOnlyCache]:
    """The shipped files a function reads, first to last: its own `cache=`, `set_global_cache`'s,
    `$TUNER_CACHE_FILE`'s."""
    return [c for c in (own, _global_cache, env_cache()) if c is not None]


# ---- the store ---------------------------------------------------------------------------------------------
def open_store(storage: Any, *, create: bool) -> ConfigCache | None:
    """The ConfigCache of a function's `storage`, or None: storage=False; offline (`create=False`) with no
    database file yet (offline mode never creates one); or a store that cannot be opened (warned once
    per cause, tried again after STORE_RETRY_S)."""
    if storage is False:
        return None
    from ..store import ResultStore, default_storage_url
    from ._db import ConfigCache

    if isinstance(storage, ConfigCache):
        return storage
    try:
        if isinstance(storage, ResultStore):
            url, store = storage.url, storage
        else:
            url, store = (storage or default_storage_url()), None
    except OSError as exc:  # default_storage_url creates $TUNER_HOME
        warn_once(
            ("store", "home", type(exc).__name__),
            "the tuner home cannot be used (%s); running without a store",
            _describe(exc),
        )
        return None
    if not create and not _exists(url):
        return None
    with _dbs_lock:
        c = _dbs.get(url)
        if c is not None and url in _full_since and time.monotonic() - _full_since[url] >= STORE_RETRY_S:
            # opened read-only for a full disk: try for writing again (space may have been freed)
            c.store.engine.dispose()
            del _dbs[url], _full_since[url]
            c = None
            if store is not None and store.full_disk is not None:
                store = None  # a caller's ResultStore stays read-only: a new one of its URL, for writing
        if c is not None:
            if _same_file(url):
                return c
            # Deleted or replaced under this process (`rm -rf $TUNER_HOME`, a store moved aside): SQLite
            # would go on writing into the unlinked file, and every winner stored from now on would vanish
            # with it. Open the path again instead (online: a new store there).
            warn_once(
                ("store", url, "replaced"),
                "store %s was deleted or replaced while this process had it open; opening it again (what "
                "this process stored in the old file is gone with it)",
                _redact(url),
            )
            c.store.engine.dispose()
            del _dbs[url]
            if not create and not _exists(url):
                return None
        if _failed_recently(url):
            return None
        opening = _opening.setdefault(url, threading.Lock())
    with opening:  # one thread opens `url` (maybe waiting long); the others of `url` wait for its store
        with _dbs_lock:
            c = _dbs.get(url)
            if c is not None:
                return c  # opened by the thread this one waited for
            if _failed_recently(url):
                return None  # that thread's opening failed: not tried again before STORE_RETRY_S
            closes = _closes
        c = _open(url, store, closes)
    if c is _RACED:
        return open_store(storage, create=create)  # `close_stores` ran meanwhile: opened again after it
    return c


def unusable_store(storage: Any) -> str | None:
    """The store of `storage` (its URL, password hidden) when `open_store` gave None because it failed:
    its opening (or a read, `_drop`) failed less than STORE_RETRY_S ago, or the tuner home cannot be used.
    None when there is no store to read (storage=False; offline with no database file yet) or it opened."""
    from ..store import ResultStore, default_storage_url
    from ._db import ConfigCache

    if storage is False or isinstance(storage, ConfigCache):
        return None
    try:
        url = storage.url if isinstance(storage, ResultStore) else (storage or default_storage_url())
    except OSError:  # as `open_store` met it
        return "in the tuner home"
    with _dbs_lock:
        failed = _failed_recently(url)
    return _redact(url) if failed else None


def _failed_recently(url: str) -> bool:
    """An opening of `url` failed less than STORE_RETRY_S ago (the caller holds `_dbs_lock`)."""
    failed = _failed_opens.get(url)
    return failed is not None and time.monotonic() - failed < STORE_RETRY_S


_RACED: Any = object()  # what `_open` returns for an opening that `close_stores` overtook


def _open(url: str, store: Any, closes: int) -> ConfigCache | None:
    """Open the store of `url` (`store`: a caller's ResultStore of it, or None) and keep it in `_dbs`; None
    when it cannot be opened (warned once per cause; not tried again for STORE_RETRY_S). The caller holds
    `url`'s lock in `_opening`, not `_dbs_lock`: nothing is kept of an opening that fails or raises.
    `closes`: `_closes` when the opening started; if `close_stores` ran since, nothing is kept of the
    opening either (its store's engine is disposed of) and `_RACED` is returned."""
    from ._db import ConfigCache

    try:
        c = ConfigCache(store or url)
    except _store_errors() as exc:
        with _dbs_lock:
            if _closes == closes:  # a failure from before a close is forgotten with the others
                _failed_opens[url] = time.monotonic()
        if _corrupt(url, exc):
            return None
        warn_once(
            ("store", url, "open", type(exc).__name__),
            "store %s cannot be opened (%s); using memory, shipped files and fallbacks",
            _redact(url),
            _describe(exc),
        )
        return None
    if c.store.full_disk is not None:
        warn_once(
            ("store", url, "full"),
            "%s; opened read-only: its entries are used, new results are kept in memory only (tried "
            "for writing again every %g s)",
            c.store.full_disk.replace("; its transaction was rolled back, nothing of it was written", ""),
            STORE_RETRY_S,
        )
    with _dbs_lock:
        raced = _closes != closes
        if not raced:
            _failed_opens.pop(url, None)
            if c.store.full_disk is not None:
                _full_since[url] = time.monotonic()
            _dbs[url] = c
            _files[url] = _identity(url)
    if raced:
        c.store.engine.dispose()
        return _RACED
    return c


def _exists(url: str) -> bool:
    """False only for a SQLite file that does not exist."""
    from ..storage import sqlite_path

    path = sqlite_path(url)
    return path is None or path.startswith("file:") or os.path.exists(path)


def _identity(url: str) -> tuple[int, int] | None:
    """(device, inode) of a SQLite store's file; None for other stores or a file that is not there."""
    from ..storage import sqlite_path
    from ..storage._replaced import file_identity

    path = sqlite_path(url)
    if path is None or path.startswith("file:"):
        return None
    return file_identity(path)


def _same_file(url: str) -> bool:
    """The file of an open SQLite store is still the one it opened (one stat; a miss only)."""
    was = _files.get(url)
    return was is None or _identity(url) == was


def _corrupt(url: str, exc: BaseException) -> bool:
    """A damaged database file: warned once per store (naming the file and what to do), whichever step
    met it first."""
    from ..store import StoreCorrupt

    if not isinstance(exc, StoreCorrupt):
        return False
    warn_once(("store", url, "corrupt"), "%s; using memory, shipped files and fallbacks", exc)
    return True


def _drop(db: ConfigCache) -> None:
    """Stop using `db` in this process until STORE_RETRY_S has passed (then it is opened again: a file
    moved aside is replaced by a new store)."""
    with _dbs_lock:
        for url, c in list(_dbs.items()):
            if c is db:
                del _dbs[url]
                _failed_opens[url] = time.monotonic()


def close_stores() -> None:
    """Dispose of every store the runtime opened and forget failed opens (after a fork, or when a test
    pulls the filesystem from under them); the next miss opens them again. It does not wait for an opening
    in progress in another thread (which may wait long for a PostgreSQL connection slot): that opening
    keeps nothing, disposes of its store and opens it again after the close."""
    global _closes
    with _dbs_lock:
        _closes += 1
        for c in _dbs.values():
            c.store.engine.dispose()
        _dbs.clear()
        _failed_opens.clear()
        _full_since.clear()
        _write_paused.clear()
        _unused_since.clear()


def _timed_out(exc: BaseException) -> bool:
    """The store did not answer within its timeout: a PostgreSQL statement timeout or a server that did
    not answer (`StoreTimeout`), or a SQLite lock another process held past the busy timeout."""
    from ..store import StoreTimeout

    if isinstance(exc, StoreTimeout):
        return True
    text = str(getattr(exc, "orig", None) or exc).lower()
    return "database is locked" in text or "database table is locked" in text


def _unreachable(exc: BaseException) -> bool:
    """A new connection that could not be made: no answer within libpq's `connect_timeout` (a server or
    host that stopped answering), nothing listening, or a refusal for a connection limit after
    `TUNER_PG_CONNECT_WAIT` (`StoreConnectionLimit`). The next step's connection would wait as long."""
    from ..store import StoreUnreachable

    return isinstance(exc, StoreUnreachable)


def guarded(db: ConfigCache, op: str, what: str, fn: Callable[[], T], default: T) -> T:
    """`fn()`, or `default` (with one warning per cause) when the store fails. `op` is "read" or "write";
    `what` names the step in the warning. An EntryError (a bad entry, not a bad store) propagates. A write
    that waited out the store's timeout pauses the store's writes for STORE_RETRY_S (the results of that
    time are kept in memory only); a read that did, or any step whose new connection could not be made
    (`StoreUnreachable`: no answer within `connect_timeout`, or refused for a connection limit after its
    wait), stops using the store for as long."""
    unused = _unused_since.get(db)
    if unused is not None:
        if time.monotonic() - unused < STORE_RETRY_S:
            return default
        _unused_since.pop(db, None)
    if op == "write":
        if getattr(db.store, "full_disk", None) is not None:
            return default  # opened read-only for a full disk: said once when opened (`open_store`)
        paused = _write_paused.get(db)
        if paused is not None:
            if time.monotonic() - paused < STORE_RETRY_S:
                return default
            _write_paused.pop(db, None)
    try:
        return fn()
    except EntryError:
        raise
    except _store_errors() as exc:
        url = _redact(getattr(db.store, "url", "?"))
        if _corrupt(url, exc):
            _drop(db)  # no more reads or writes of a damaged file (for STORE_RETRY_S, then opened again)
            return default
        then = "skipping the store for this step" if op == "read" else "the result is kept in memory only"
        if _timed_out(exc) or _unreachable(exc):
            if op == "write" and not _unreachable(exc):
                _write_paused[db] = time.monotonic()
            else:
                _unused_since[db] = time.monotonic()
                _drop(db)
            then = (
                f"it is not written to for {STORE_RETRY_S:g} s; results are kept in memory meanwhile"
                if db not in _unused_since
                else f"it is not used for {STORE_RETRY_S:g} s"
            )
        warn_once(
            ("store", url, op, type(exc).__name__),
            "store %s: cannot %s (%s); %s",
            url,
            what,
            _describe(exc),
            then,
        )
        return default
