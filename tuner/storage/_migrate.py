"""Creating and migrating the schema, safely when many processes open a fresh store at once.

`ensure_schema(engine)` reads the migration revision (one query); only when it is not the head does it
take the schema lock, read it again and run the Alembic migrations (as Optuna's RDBStorage does). The lock
is `pg_advisory_lock` on PostgreSQL and an exclusive lock on a file next to the database on SQLite (the
database file itself is never locked by tuner: closing a descriptor of it would drop SQLite's own locks).
On SQLite the migrations run in one `BEGIN IMMEDIATE` transaction, so a crash leaves the store as it was,
and the lock file is waited for at most SQLite's busy timeout (`SQLITE_TIMEOUT_S`; then `StoreTimeout`
naming it): a process stopped or hung while it holds the lock holds up no other for ever. Optuna's tables
are created under the same lock (`optuna_storage`); once made, they are opened with no lock.

A process that waits for the lock longer than `SCHEMA_LOCK_NOTICE_S` logs one warning that names the
holder: the holder advertises itself (PostgreSQL: its lock's session gets the `application_name`
"tuner pid N on HOST", found through `pg_locks` and `pg_stat_activity`, which also name a session of
another program; SQLite: "pid N on HOST" written into the lock file while it is held).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from tuner._scoped import SharedOverride

from . import _engine
from ._dba import migration_lock_waits, refuse_read_only
from ._engine import (
    SQLITE_TIMEOUT_S,
    StoreConnectionLost,
    StoreError,
    StoreTimeout,
    _inherited_pools,
    _sqlite_pragmas,
    _sqlstate,
    engine_for,
    engine_kwargs,
    engine_kwargs_calling,
    install_sqlite_errors,
    install_timeout_errors,
    migration_timeout_s,
    missing_sqlite_file,
    normalize_url,
    operation,
    pg_timeout_s,
    read_only_url,
    redact,
    set_statement_limit,
    sqlite_fault_in,
    sqlite_file,
    sqlite_path,
)
from ._new_file import is_at
from ._owner import HOST
from ._replaced import check_file, watch_file
from ._schema import SCHEMA_REVISION, SCHEMA_VERSION, VERSION_TABLE

if TYPE_CHECKING:  # pragma: no cover
    import optuna

log = logging.getLogger(__name__)

__all__ = [
    "StoreOutdated",
    "close_idle_connections",
    "check_schema",
    "ensure_schema",
    "schema_lock",
    "schema_revision",
    "no_store_at",
    "only_reading",
    "optuna_storage",
    "MIGRATIONS_DIR",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# pg_advisory_lock key: the first 8 bytes of sha256("tuner schema"), as a signed 64-bit integer.
_PG_LOCK_KEY = 0x2B8F3E1C5A7D9064
# A wait for the schema lock longer than this many seconds is logged (a warning naming the holder): a
# migration takes about a second, so a longer wait is another process that is slow, stopped or stuck
# while it holds the lock (a session left in a transaction, a debugger), which the waiter used to wait for
# in silence, up to the migration limit (PostgreSQL) or SQLite's busy timeout.
SCHEMA_LOCK_NOTICE_S = 3.0
# The `application_name` of the session that holds the schema lock, while it does (`_pg_lock_holder`).
_HOLDER_NAME = "tuner pid {pid} on {host}"
_HOLDER_PATTERN = re.compile(r"^tuner pid (\d+) on (.+)$")
# The threads of this process take the schema lock of a database one at a time: one lock per database
# (`_thread_lock`), never one for all. A thread that holds it may wait long (for a connection slot, up to
# TUNER_PG_CONNECT_WAIT; for another process's migration): a process-wide lock made every other store's
# migration and Optuna storage, a SQLite file's too, wait as long.
_thread_locks: dict[str, threading.RLock] = {}
_locks_lock = threading.Lock()  # held only to look up or add an entry of `_thread_locks` or `_opening`
# One Optuna storage per PostgreSQL URL, statement timeout and process (`optuna_storage`). Each RDBStorage
# has an engine and a pool of its own: one made for every `ResultStore(url).optuna_storage()` (each
# `optimize(storage=url)` call, so each task of a study worker) kept its pooled connections open on the
# server until the garbage collector found it, and a worker's connections grew with the tasks it ran until
# the server's connection limit refused them. Optuna's RDBStorage is safe to share between threads (a
# session per thread). SQLite stores keep one per call: a file deleted or replaced under the process is
# opened anew (`_replaced`), and a file has no connection limit.
_optuna_storages: dict[tuple[str, float], optuna.storages.RDBStorage] = {}
_storages_lock = threading.Lock()  # held only to read or change `_optuna_storages`, never while connecting
# key of `_optuna_storages` -> the lock the thread that opens its storage holds (it connects, and may wait
# for a slot): other threads of that key wait for its storage, those of other stores do not
_opening: dict[tuple[str, float], threading.Lock] = {}
# The folder of Optuna's storage module -> the head revision of the migration scripts beside it
# (`_optuna_head_version`); `_heads_lock` is held while they load.
_optuna_heads: dict[str, str] = {}
_heads_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A parent thread may have held the locks (migrating, opening Optuna's storage) at the fork; the
    Optuna storages the child inherited get new, empty pools (as `engine_for`'s engines do: the parent's
    PostgreSQL sockets must not be shared), their old pools kept, untouched."""
    global _thread_locks, _locks_lock, _storages_lock, _opening, _heads_lock
    _thread_locks, _locks_lock = {}, threading.Lock()
    _storages_lock, _opening, _heads_lock = threading.Lock(), {}, threading.Lock()
    for storage in _optuna_storages.values():
        _inherited_pools.append(storage.engine.pool)
        storage.engine.pool = storage.engine.pool.recreate()


os.register_at_fork(after_in_child=_after_fork_in_child)


def schema_revision(conn: Connection) -> str | None:
    """The migration revision of the database (None: no version table yet, e.g. a first-release store)."""
    try:
        with conn.begin_nested() if conn.in_transaction() else conn.begin():
            return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    except SQLAlchemyError:
        return None


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    lock_path = path + ".lock"
    deadline = time.monotonic() + float(_engine.SQLITE_TIMEOUT_S)
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only directory: nobody can create the schema there anyway
            log.debug("no schema lock file %s (%s); creating without it", lock_path, exc)
            yield
            return
        try:
            _lock_by(fd, deadline, path, lock_path)
        except BaseException:
            os.close(fd)
            raise
        # A failed first opening removes the lock file it made while it holds the lock (`_new_file`):
        # a lock taken on the removed file is no lock; take the one at the path now.
        if is_at(fd, lock_path):
            break
        os.close(fd)
    _say_holder(fd, lock_path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no longer held: a stale name would be read as the next holder's
        os.close(fd)  # closing the descriptor releases the lock


def _say_holder(fd: int, lock_path: str) -> None:
    """Write this process (pid and host, JSON) into the schema lock file `fd` it holds, for the processes
    that wait for it (`_file_holder`). Best effort: a full disk or a file that cannot be written says
    nothing, and the lock holds the same."""
    said = json.dumps({"pid": os.getpid(), "host": HOST}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, said, 0)
    except OSError as exc:
        log.debug("schema lock file %s: cannot name its holder (%s)", lock_path, exc)


def _file_holder(lock_path: str) -> str:
    """Who holds the schema lock file `lock_path`, as its holder wrote it (`_say_holder`)."""
    try:
        with open(lock_path, "rb") as f:
            said = json.loads(f.read(4096) or b"null")
        pid, host = int(said["pid"]), str(said["host"])
    except (OSError, ValueError, TypeError, KeyError):  # not written (an older tuner), or being written
        return "another process"
    return f"pid {pid} on host {host}"


def _lock_by(fd: int, deadline: float, path: str, lock_path: str) -> None:
    """Take the exclusive lock of `fd`, the schema lock file `lock_path` of the SQLite store `path`, by
    `deadline` (`time.monotonic()`), or raise `StoreTimeout`. The wait is bounded by SQLite's busy timeout
    (`SQLITE_TIMEOUT_S`), as a write to the store is: a process stopped (SIGSTOP, a debugger) or hung while
    it held the lock made every process that opened the store wait for ever."""
    pause = 0.005
    notice: float | None = time.monotonic() + SCHEMA_LOCK_NOTICE_S  # None: logged
    while True:
        try:
            if sys.platform == "win32":  # pragma: no cover - Windows
                import msvcrt

                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            else:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError:  # pragma: no cover - Windows: a region locked by another process
            if sys.platform != "win32":
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            waited = float(_engine.SQLITE_TIMEOUT_S)
            raise StoreTimeout(
                f"store {path}: its schema lock {lock_path} was held by another process for {waited:g} s "
                f"(SQLite's busy timeout): that process creates or upgrades the store's schema, or it is "
                f"stopped or hung while it holds the lock. Find it (`fuser {lock_path}` or "
                f"`lsof {lock_path}`) and let it finish, resume it (`kill -CONT PID`) or end it, then try "
                "again; nothing was written"
            )
        if notice is not None and time.monotonic() >= notice:
            notice = None
            log.warning(
                "store %s: waiting for its schema lock %s, held by %s for over %g s (it creates or "
                "upgrades the store's schema, or it is stopped or hung); this process waits up to %g s "
                "(SQLite's busy timeout). To find it: `fuser %s`",
                path,
                lock_path,
                _file_holder(lock_path),
                SCHEMA_LOCK_NOTICE_S,
                float(_engine.SQLITE_TIMEOUT_S),
                lock_path,
            )
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _thread_lock(engine: Engine) -> threading.RLock:
    """The lock of this process's threads on the schema of `engine`'s database (`_thread_locks`)."""
    key = engine.url.render_as_string(hide_password=False)
    with _locks_lock:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.RLock()
        return lock


@contextlib.contextmanager
def schema_lock(engine: Engine) -> Iterator[Connection | None]:
    """Hold the schema lock of `engine`'s database: PostgreSQL yields the connection that holds the
    advisory lock (migrate on it); SQLite yields None."""
    with _thread_lock(engine):
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                # waiting for another process's migration, and a migration itself, may take longer than
                # one of tuner's statements: this connection gets the migration limit until it is returned
                set_statement_limit(conn, migration_timeout_s())
                with operation(
                    "waiting for the schema lock (another process creates or upgrades the schema)"
                ):
                    _take_pg_lock(conn)
                name = conn.execute(
                    text(
                        "SELECT current_setting('application_name'), set_config('application_name', :n, false)"
                    ),
                    {"n": _HOLDER_NAME.format(pid=os.getpid(), host=HOST)[:63]},
                ).scalar()
                conn.commit()
                try:
                    yield conn
                finally:
                    with contextlib.suppress(SQLAlchemyError, StoreConnectionLost):
                        conn.rollback()
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                        conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": name})
                        set_statement_limit(conn, None)
                        conn.commit()
            return
        path = sqlite_file(engine)
        if path is None or path.startswith("file:"):  # a read-only URI (`read_only_url`): no migration
            yield None
            return
        with _file_lock(path):
            yield None


def _take_pg_lock(conn: Connection) -> None:
    """Take the schema's advisory lock on `conn` (PostgreSQL). While another session holds it, wait; past
    `SCHEMA_LOCK_NOTICE_S`, log once who holds it (`_pg_lock_holder`), then wait on the server (its
    queue, the connection's statement limit and Ctrl-C as for any statement)."""
    key = {"k": _PG_LOCK_KEY}
    notice = time.monotonic() + SCHEMA_LOCK_NOTICE_S
    pause = 0.01
    while True:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar()
        conn.commit()  # no transaction left open while this process sleeps
        if got:
            return
        left = notice - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.25)
    holder = _pg_lock_holder(conn)
    if holder is not None:
        log.warning(
            "store %s: waiting for its schema lock, held by %s for over %g s (it creates or upgrades the "
            "store's schema, or it is stopped, hung or left idle in a transaction); this process waits up "
            "to %s. To see it: SELECT * FROM pg_stat_activity WHERE pid = %d; to end it: "
            "SELECT pg_terminate_backend(%d)",
            redact(conn.engine.url.render_as_string(hide_password=True)),
            holder[1],
            SCHEMA_LOCK_NOTICE_S,
            f"{migration_timeout_s():g} s (the migration limit)" if migration_timeout_s() else "no limit",
            holder[0],
            holder[0],
        )
    # The wait is bounded by the migration limit alone: a `lock_timeout` of the database or role (a DBA's
    # guard against DDL that queues other sessions behind it) ended it at once, although no session
    # waits behind this one, and a fleet's processes that started together failed on a fresh store.
    conn.execute(text("SET LOCAL lock_timeout = 0"))
    conn.execute(text("SELECT pg_advisory_lock(:k)"), key)


_HOLDER_QUERY = text(
    "SELECT a.pid, a.application_name, a.usename, host(a.client_addr), a.state "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.classid::bigint = :hi AND l.objid::bigint = :lo "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _pg_lock_holder(conn: Connection) -> tuple[int, str] | None:
    """(server pid, description) of the session that holds the schema lock of `conn`'s database, or None
    (no one now, or the server's views cannot be read). A tuner process names its pid and host (its
    `application_name` while it holds the lock); another program's session, what the server knows."""
    key = _PG_LOCK_KEY & 0xFFFFFFFFFFFFFFFF
    try:
        row = conn.execute(_HOLDER_QUERY, {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).first()
        conn.commit()
    except (SQLAlchemyError, StoreError) as exc:
        with contextlib.suppress(SQLAlchemyError, StoreError):
            conn.rollback()
        log.debug("cannot read who holds the schema lock: %s", exc)
        return None
    if row is None:
        return None
    pid, app, user, client, state = row
    tuner = _HOLDER_PATTERN.match(app or "")
    if tuner:
        return pid, f"tuner pid {tuner.group(1)} on host {tuner.group(2)} (server process {pid})"
    said = [f"application_name {app!r}" if app else "", f"user {user}" if user else ""]
    said += [f"client {client}" if client else "", f"state {state!r}" if state else ""]
    details = ", ".join(p for p in said if p)
    return pid, f"server process {pid}" + (f" ({details})" if details else "")


def _pg_refusal(exc: SQLAlchemyError, url: str) -> str | None:
    """The one-line message of a PostgreSQL store whose schema its role may not make or read (a role
    without CREATE on the schema, the PostgreSQL 15 default for `public`; tables another role made and
    granted nothing on), or whose search_path names no schema that exists; None for any other error.
    It was SQLAlchemy's message, with the failed statement and a link, over a dozen lines."""
    code = _sqlstate(getattr(exc, "orig", None) or exc)
    said = " ".join(str(getattr(exc, "orig", exc)).split("\n", 1)[0].split())
    where = f"cannot open store {redact(url)}: {said}"
    if code == "42501":  # insufficient_privilege
        return (
            f"{where}: the URL's role may not create or use tuner's tables in the schema. Make the store "
            "once as a role that may (its owner, e.g. `tuner cache import` as that role), then GRANT this "
            "role USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on its tables (and USAGE on its "
            "sequences), or GRANT it CREATE on the schema; nothing was written"
        )
    if code == "3F000":  # invalid_schema_name: the search_path names no schema that exists
        return (
            f"{where}: the search_path (the URL's `options=-csearch_path=...`, the role's or the "
            "database's) names no schema that exists; CREATE SCHEMA it or correct the search_path; "
            "nothing was written"
        )
    return None


def _sqlite_migration_engine(url: str) -> Engine:
    """A one-connection engine whose transactions begin with BEGIN IMMEDIATE (the write lock), so that
    the whole migration is one transaction."""
    eng = create_engine(url, poolclass=NullPool, connect_args={"timeout": SQLITE_TIMEOUT_S})
    install_sqlite_errors(eng)
    path = sqlite_path(url)
    if path is not None:
        watch_file(eng, path)

    @event.listens_for(eng, "connect")
    def _connect(dbapi_conn: Any, rec: Any) -> None:
        _sqlite_pragmas(dbapi_conn, rec)
        dbapi_conn.isolation_level = None  # the driver begins nothing itself; we do, below

    @event.listens_for(eng, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


def _quiet_level(level: int) -> int:
    return logging.WARNING if level == logging.NOTSET else level  # a level the user set holds


def _set_alembic_level(level: int) -> None:
    logging.getLogger("alembic").setLevel(level)


# Alembic logs each migration step at INFO: while tuner migrates or opens Optuna's storage, only its warnings
# (unless the user set the "alembic" logger's level). The level the logger had comes back after the last of
# them ends. It used to stay at WARNING for the rest of the process, hiding the user's own migrations (and
# Optuna's RDBStorage sets WARNING itself each time it is opened: the level is put back after that too).
_alembic_quiet = SharedOverride(lambda: logging.getLogger("alembic").level, _set_alembic_level, _quiet_level)


def _upgrade(conn: Connection) -> None:
    with _alembic_quiet():  # alembic's first import logs its plugins at INFO too
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _check_known(conn: Connection, rev: str | None, url: str) -> None:
    """Refuse a store written by a newer tuner (a revision this tuner has no migration for)."""
    if rev is None or rev == SCHEMA_REVISION:
        return
    with _alembic_quiet():  # alembic's first import logs its plugins at INFO
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    if rev not in known:
        raise StoreError(
            f"store {redact(url)} has schema revision {rev}, newer than this tuner's "
            f"({SCHEMA_REVISION}, schema version {SCHEMA_VERSION}); upgrade tuner"
        )


def check_schema(engine: Engine, url: str, *, disk_full: bool = False) -> None:
    """Refuse a store that cannot be migrated (opened read-only: its folder cannot be written, or
    `disk_full`) unless it is at this tuner's schema."""
    try:
        with engine.connect() as conn:
            rev = schema_revision(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot open store {redact(url)}: {exc.__class__.__name__}: {exc}") from exc
    if rev != SCHEMA_REVISION:
        why, then = (
            ("its disk is full", "free space on its disk and run again")
            if disk_full
            else ("its folder cannot be written", "open it once where it can be written")
        )
        raise StoreError(
            f"store {redact(url)} is read-only ({why}) and not at this tuner's "
            f"schema revision ({rev or 'no tuner schema'}, this tuner needs {SCHEMA_REVISION}), so it "
            f"cannot be migrated in place: {then}"
        )


class StoreOutdated(StoreError):
    """A store of an older tuner's schema, opened by a command that only reads (`only_reading`): it is
    left as it is, not upgraded."""


# The command that only reads (`tuner cache show`, ...) while this context runs it, else None: a store of an
# older schema is then refused (`StoreOutdated`), not upgraded in place.
_reading: contextvars.ContextVar[str | None] = contextvars.ContextVar("tuner_store_reading", default=None)

UPGRADE_COMMAND = "tuner cache upgrade"


@contextlib.contextmanager
def only_reading(command: str) -> Iterator[None]:
    """Within it (in this thread or task), `ensure_schema` upgrades no store: one of an older schema is a
    `StoreOutdated` naming `command` and how to upgrade it, and nothing is written to it."""
    token = _reading.set(command)
    try:
        yield
    finally:
        _reading.reset(token)


def _sqlite_revision_read_only(path: str) -> tuple[bool, str | None]:
    """(whether the SQLite file holds tuner's tables, its revision), read through a read-only connection
    (`mode=ro`: no journal mode set, no table made, nothing written)."""
    import sqlite3
    from urllib.parse import quote

    con = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=SQLITE_TIMEOUT_S)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if VERSION_TABLE not in names:
            return "tuner_meta" in names, None
        row = con.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        return True, row[0] if row else None
    finally:
        con.close()


def no_store_at(url: str) -> str | None:
    """Where a command that only reads finds no store, so reads nothing and makes none (its tables are
    made by the first command that writes): the file of a SQLite URL that does not exist yet or holds no
    tuner schema (an empty file, looked at through a read-only connection), or the URL (redacted) of a
    server's database that holds no tuner schema yet (an empty PostgreSQL database, looked at without
    writing); None where a store is, for a file SQLite cannot read (opening it says why), or for an
    in-memory or read-only SQLite URL."""
    if url.startswith("sqlite"):
        missing = missing_sqlite_file(url)
        path = sqlite_path(url)
        if missing is not None or path is None or path.startswith("file:") or not os.path.isfile(path):
            return missing
        import sqlite3

        try:
            made, _ = _sqlite_revision_read_only(path)
        except sqlite3.Error:
            return None
        return None if made else path
    from sqlalchemy import inspect

    try:
        engine = engine_for(url)
    except Exception:  # noqa: BLE001 - a URL no engine takes (malformed, unknown dialect): opening says why
        return None
    with engine.connect() as conn:
        made = schema_revision(conn) is not None or inspect(conn).has_table("tuner_meta")
    return None if made else redact(url)


def _refuse_outdated(engine: Engine, url: str, command: str) -> bool:
    """For a command that only reads: True when `engine`'s store is at this tuner's schema (nothing to
    do); a `StoreOutdated` when it holds an older tuner's; False when it holds no tuner schema yet (made as
    before: there is nothing in it to upgrade). A newer tuner's is refused by `_check_known`."""
    path = sqlite_path(url)
    if engine.dialect.name == "sqlite" and path is not None and not path.startswith("file:"):
        import sqlite3

        try:
            made, rev = _sqlite_revision_read_only(path)
        except sqlite3.Error:
            return False  # not a store it can read (a damaged file): opened as before, which says why
    else:
        from sqlalchemy import inspect

        with engine.connect() as conn:
            rev = schema_revision(conn)
            made = rev is not None or inspect(conn).has_table("tuner_meta")
    if rev == SCHEMA_REVISION:
        return True
    if not made:
        return False
    if rev is not None:
        with engine.connect() as conn:
            _check_known(conn, rev, url)
    which = f"revision {rev}" if rev else "the first release's"
    raise StoreOutdated(
        f"store {redact(url)} has an older tuner's schema ({which}; this tuner's is revision "
        f"{SCHEMA_REVISION}), and `{command}` only reads a store, so it does not upgrade it: "
        f"run `{UPGRADE_COMMAND}` (with the same --storage) to upgrade it in place, once every process "
        "that shares it runs this tuner version; nothing was written"
    )


def ensure_schema(engine: Engine) -> None:
    """Bring `engine`'s database to the current schema (creating it if empty, migrating an older one).
    Safe when many processes call it at once on a fresh database; cheap when the schema is current."""
    url = str(engine.url.render_as_string(hide_password=False))
    try:
        command = _reading.get()
        if command is not None and _refuse_outdated(engine, url, command):
            return
        with engine.connect() as conn:
            rev = schema_revision(conn)
            if rev == SCHEMA_REVISION:
                return
            _check_known(conn, rev, url)
        with schema_lock(engine) as locked:
            if locked is not None:  # PostgreSQL: migrate on the connection that holds the lock
                rev = schema_revision(locked)
                locked.commit()
                if rev == SCHEMA_REVISION:
                    return
                _check_known(locked, rev, url)
                what = f"upgrading the schema from {rev or 'empty'} to {SCHEMA_REVISION}"
                with operation(what), locked.begin():
                    refuse_read_only(locked, url, what)
                    migration_lock_waits(locked)
                    _upgrade(locked)
                log.info("store %s: schema migrated from %s to %s", redact(url), rev, SCHEMA_REVISION)
                return
            if engine.dialect.name != "sqlite" or sqlite_path(url) is None:
                # other databases (no lock), and in-memory SQLite (one process; the database lives in
                # this engine's connection, so migrate on it)
                with engine.connect() as conn, conn.begin():
                    _upgrade(conn)
                return
            meng = _sqlite_migration_engine(url)
            try:
                with meng.connect() as conn, conn.begin():
                    rev = schema_revision(conn)
                    if rev == SCHEMA_REVISION:
                        return
                    _check_known(conn, rev, url)
                    _upgrade(conn)
                log.info("store %s: schema migrated from %s to %s", redact(url), rev, SCHEMA_REVISION)
            finally:
                meng.dispose()
    except StoreError:
        raise
    except SQLAlchemyError as exc:
        refused = _pg_refusal(exc, url)
        if refused is not None:
            raise StoreError(refused) from exc
        path = sqlite_path(url)
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        why = f" (folder {folder} cannot be written)" if folder and not os.access(folder, os.W_OK) else ""
        raise StoreError(f"cannot open store {redact(url)}{why}: {exc.__class__.__name__}: {exc}") from exc


@contextlib.contextmanager
def _sqlite_faults(url: str) -> Iterator[None]:
    """Raise a fault of a SQLite file or disk inside as tuner's `StoreError` naming the file (Optuna's
    RDBStorage reads its tables before its engine can be given tuner's error handler, and wraps driver
    errors in a `StorageInternalError` that blames "invalid data in the commit")."""
    path = sqlite_path(url)
    try:
        yield
    except Exception as exc:
        err = sqlite_fault_in(path, "opening Optuna's tables", exc) if path else None
        if err is None or err is exc:
            raise
        raise err from exc


def _optuna_tables_made(engine: Engine) -> bool:
    """Whether Optuna's tables exist and carry their version stamp (Optuna's `alembic_version`)."""
    from sqlalchemy import inspect

    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return False
        return conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() > 0


def _make_optuna_tables(full_url: str, url: str) -> None:
    """Create Optuna's tables on PostgreSQL (the caller holds the schema lock). Optuna creates them and
    stamps their version in transactions that may idle while alembic imports its scripts: on an engine of
    its own with the migration limit, as tuner's (`_rdb_storage`), disposed of once they are made."""
    with operation("creating Optuna's tables"):
        maker = _rdb_storage(full_url, url, migration=True)
    maker.engine.dispose()


def _rdb_storage(
    full_url: str, url: str, *, migration: bool = False, skip_table_creation: bool = False
) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage on `full_url` with tuner's engine settings (`engine_kwargs`; the migration
    limit when `migration`; Optuna's `skip_table_creation` for a store opened read-only). Its constructor runs statements on the engine it has just made (it creates
    and reads its tables, reads and stamps `version_info`), so the engine gets tuner's error handlers as it
    is made (a timeout there is a `StoreTimeout` naming the operation and the limit, not Optuna's error
    over the driver's) and is disposed of when the constructor raises (its pool would otherwise keep a
    connection open on the server for as long as the error is kept)."""
    import optuna

    made: list[Engine] = []

    def _made(engine: Engine) -> None:
        made.append(engine)
        install_timeout_errors(engine, url, migration=migration)
        install_sqlite_errors(engine)

    limit = migration_timeout_s() if migration else None
    try:
        storage = optuna.storages.RDBStorage(
            full_url,
            engine_kwargs=engine_kwargs_calling(url, limit, _made, migration=migration),
            skip_table_creation=skip_table_creation,
            skip_compatibility_check=True,  # checked below, with no transaction open
        )
        _check_optuna_version(storage)
    except BaseException:
        for engine in made:
            engine.dispose()
        raise
    # what Optuna keeps to make its engine again after unpickling: without the callback (a closure)
    storage.engine_kwargs = engine_kwargs(url, limit, migration=migration)
    return storage


def _check_optuna_version(storage: optuna.storages.RDBStorage) -> None:
    """Optuna's check that its tables are at this Optuna's schema version, raising Optuna's own error
    where they are not. Optuna's constructor makes it inside a transaction it keeps open while alembic
    loads Optuna's migration scripts (a fraction of a second, more on a loaded machine): a role's or
    database's idle_in_transaction_session_timeout (with TUNER_PG_TIMEOUT=0, or a small TUNER_PG_TIMEOUT)
    ended that session and the opening failed. Here the version is read in one short statement and the
    scripts are loaded with no transaction open, once per process (`_optuna_head_version`); Optuna's check
    runs only where they differ."""
    import optuna

    current, head = storage.get_current_version(), _optuna_head_version(storage)
    if current == head:
        return
    manager = getattr(storage, "_version_manager", None)  # Optuna's own message, where it has one
    check = getattr(manager, "check_table_schema_compatibility", None)
    if check is not None:
        check()
    raise RuntimeError(
        f"Optuna {optuna.__version__} cannot use the study tables at their schema version {current} (it "
        f"needs {head}): run `optuna storage upgrade --storage URL`, or use the Optuna release that made them"
    )


def _optuna_head_version(storage: optuna.storages.RDBStorage) -> str:
    """The head revision of Optuna's migration scripts (`storage.get_head_version()`), loaded once per
    process and Optuna installation. Optuna makes alembic load its script directory (some 50 modules,
    executed afresh each time: tens of milliseconds, more on a loaded machine) for every call, and a
    process opens Optuna's tables many times (each task of a study, the task board, the report, the cache
    export): the scripts are the installed Optuna's, the same for every store this process opens."""
    key = os.path.dirname(os.path.abspath(sys.modules[type(storage).__module__].__file__ or ""))
    with _heads_lock:  # one thread loads them; the others wait for its answer
        head = _optuna_heads.get(key)
        if head is None:
            head = _optuna_heads[key] = storage.get_head_version()
    return head


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage on `url`, its tables created under the schema lock (Optuna creates its tables
    and stamps its version check-then-create; concurrent first opens would race); tables made and
    stamped already are opened with no lock (`_open_optuna_storage`). A SQLite store whose folder cannot
    be written (`read_only_url`) is opened read-only, creating nothing. On PostgreSQL one storage per URL
    and process is made and shared (`_optuna_storages`)."""
    from ._engine import engine_for

    ro_url = read_only_url(url)
    if ro_url is not None:  # a SQLite store in a folder that cannot be written: read as it is, no lock file
        with _alembic_quiet(), _sqlite_faults(url):
            return _rdb_storage(ro_url, ro_url, skip_table_creation=True)
    eng = engine_for(url)
    if eng.dialect.name != "postgresql":
        return _open_optuna_storage(eng, url)
    key = (normalize_url(url), pg_timeout_s())
    with _storages_lock:
        storage = _optuna_storages.get(key)
    if storage is not None:
        return storage
    with _locks_lock:
        opening = _opening.setdefault(key, threading.Lock())
    with opening:  # one thread opens it (connecting, maybe waiting for a slot); the others of `key` wait
        with _storages_lock:
            storage = _optuna_storages.get(key)
        if storage is None:
            storage = _open_optuna_storage(eng, url)
            with _storages_lock:
                _optuna_storages[key] = storage
    return storage


def close_idle_connections(url: str) -> None:
    """Close the connections this process's engines of the PostgreSQL store `url` hold idle in their pools
    (`engine_for(url)`'s and the shared Optuna storage's); they open new ones when next used. For a
    process that only waits while others work (`run_study` with local worker processes), so its idle
    connections do not count against the server's limit meanwhile. Nothing for other stores."""
    from ._engine import engine_of

    url = normalize_url(url)
    eng = engine_of(url)
    if eng is None or eng.dialect.name != "postgresql":
        return
    eng.pool.dispose()  # a QueuePool closes the connections checked in and stays usable
    with _storages_lock:
        shared = [s for (u, _), s in _optuna_storages.items() if u == url]
    for storage in shared:
        storage.engine.pool.dispose()


def _open_optuna_storage(eng: Engine, url: str) -> optuna.storages.RDBStorage:
    """A new RDBStorage on `eng`'s database (`optuna_storage`). Its tables are made under the schema lock;
    once they are made and stamped (by an earlier opening), opening them only reads them, and takes no
    lock (a process stopped while it held the lock holds up no opening of a store whose schema is made)."""
    path = sqlite_file(eng)
    if path is not None:  # RDBStorage connects (which makes the file) before its engine can be watched
        check_file(path, "opening Optuna's tables")
    full_url = str(eng.url.render_as_string(hide_password=False))
    with _alembic_quiet(), _sqlite_faults(url):
        # (a SQLite file that is not there yet is not connected to before the lock: that would make it)
        made = (path is None or os.path.exists(path)) and _optuna_tables_made(eng)
        if made:  # Optuna's constructor then only reads: its version row and stamp are there
            with operation("opening Optuna's tables"):
                storage = _rdb_storage(full_url, url, skip_table_creation=True)
        else:
            with schema_lock(eng):
                if eng.dialect.name == "postgresql" and not _optuna_tables_made(eng):
                    _make_optuna_tables(full_url, url)
                with operation("opening Optuna's tables"):  # a timeout, a corrupt file, a full disk: named
                    storage = _rdb_storage(full_url, url)
    if path is not None:
        watch_file(storage.engine, path)  # a file deleted or replaced under this process
    return storage
