"""The one engine factory: every part of tuner (results store, config cache, study task board) reaches a
database through `engine_for(url)`, and Optuna's RDBStorage gets the same engine settings from
`engine_kwargs(url)`."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import logging
import math
import os
import random
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

from sqlalchemy import create_engine, event, text
from sqlalchemy.dialects import plugins
from sqlalchemy.engine import URL, Connection, CreateEnginePlugin, Engine, ExceptionContext, make_url

from tuner._settings import text as _setting_text

if TYPE_CHECKING:
    import sqlite3

__all__ = [
    "PG_CONNECT_WAIT_S",
    "PG_POOL_SIZE",
    "PG_TIMEOUT_S",
    "StoreConnectionLimit",
    "StoreConnectionLost",
    "StoreCorrupt",
    "StoreError",
    "StoreTimeout",
    "StoreUnreachable",
    "engine_for",
    "engine_of",
    "engine_kwargs",
    "install_sqlite_errors",
    "sqlite_fault_in",
    "sqlite_file",
    "install_timeout_errors",
    "migration_timeout_s",
    "normalize_url",
    "operation",
    "pg_connect_wait_s",
    "pg_pool_size",
    "pg_timeout_s",
    "read_only_url",
    "immutable_url",
    "immutable_url_unwarned",
    "locked_read_only_url",
    "snapshot_sources",
    "disk_full_in",
    "redact",
    "set_statement_limit",
    "sqlite_path",
    "sqlite_url",
]

log = logging.getLogger(__name__)

SQLITE_TIMEOUT_S = 60
# libpq waits for ever by default for a server that accepted the TCP connection but does not answer (a hung
# server, a proxy whose backend is gone), and that would hang a decorated call's miss; a URL's own
# `?connect_timeout=N` wins. Keepalives notice a connection whose peer vanished while it sat idle in the pool.
PG_CONNECT_TIMEOUT_S = 10
_PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
# Once connected, libpq also waits for ever for the answer to a query: a server that stops answering (an
# overloaded or stuck backend, a lock another worker's open transaction holds) would block a worker without
# end. Every new PostgreSQL connection of tuner (and of Optuna's RDBStorage on the same store) gets
# `statement_timeout` (one statement, its lock waits included) and `idle_in_transaction_session_timeout`
# (the server ends a session of a stuck process that sits inside a transaction, so its row locks do not
# block the fleet) of at most this many seconds: a stricter non-zero value a DBA set (the role's, the
# database's, the server's configuration) stays, anything else becomes this (`PgSessionLimits`: one
# statement per new connection, no startup option). `TUNER_PG_TIMEOUT` changes it, `0` adds none (the
# DBA's stand), and a URL's own `?options=-c statement_timeout=...` wins. tuner's statements take
# milliseconds and no transaction of tuner waits on user code, so a minute is far past any healthy wait
# and short enough for a worker to fail, and its lease to be taken over, well within a study.
PG_TIMEOUT_S = 60.0
# Creating or upgrading the schema may rewrite or index a large table, and the processes that start meanwhile
# wait for its lock: those statements get this longer limit (or none where the timeout is 0).
PG_MIGRATION_TIMEOUT_S = 600.0
_PG_TIMEOUT_PARAMS = ("statement_timeout", "idle_in_transaction_session_timeout")
# Each engine keeps up to this many connections open between calls and opens as many more at peaks (closed
# when returned); a process has two engines per PostgreSQL store (tuner's tables, Optuna's storage), so it
# holds at most 4 times this many connections to a store. `TUNER_PG_POOL_SIZE` changes it.
PG_POOL_SIZE = 4
# A new connection the server refuses because a connection limit is reached (its max_connections, the
# role's or the database's CONNECTION LIMIT, a pooler's) is tried again with a growing, jittered pause for
# up to this many seconds (`TUNER_PG_CONNECT_WAIT`; 0: not at all): a fleet that starts at once, or
# another program's burst, frees its slots within seconds.
PG_CONNECT_WAIT_S = 10.0
# The SQLAlchemy plugin that gives psycopg 3 connections the client-side deadline psycopg2's get from their
# `connection_factory` (`_watchdog_pg3`); SQLAlchemy imports it when an engine names it.
PG3_DEADLINE_PLUGIN = "tuner_pg3_deadline"
plugins.register(PG3_DEADLINE_PLUGIN, "tuner.storage._watchdog_pg3", "Psycopg3Deadline")
# The SQLAlchemy plugin that hands an engine to a callback as soon as `create_engine` has made it, before
# its first connection (`EngineCreated`): for an engine that a library makes and uses inside one call.
ENGINE_CREATED_PLUGIN = "tuner_engine_created"
ENGINE_CREATED_ARG = "tuner_engine_created"
plugins.register(ENGINE_CREATED_PLUGIN, "tuner.storage._engine", "EngineCreated")
# The SQLAlchemy plugin that gives each new connection of a PostgreSQL engine its timeouts (`PgSessionLimits`,
# its argument the engine's `_session_limits`); also on Optuna's engines, which get `engine_kwargs`.
PG_LIMITS_PLUGIN = "tuner_pg_limits"
PG_LIMITS_ARG = "tuner_pg_limits"
plugins.register(PG_LIMITS_PLUGIN, "tuner.storage._engine", "PgSessionLimits")
# What a connection's record (`ConnectionPoolEntry.info`) keeps of the timeouts its `PgSessionLimits` left
# in force: setting -> (ms, who set it: "tuner" or pg_settings.source, e.g. "user" for the role)
_IN_FORCE = "tuner_pg_limits"


class StoreError(RuntimeError):
    """A storage failure (driver error, schema mismatch), with the database URL's scheme named."""


class StoreTimeout(StoreError):
    """A PostgreSQL statement ran past the store's timeout (`TUNER_PG_TIMEOUT`): the server did not answer
    in time, or another transaction held a lock it needed. Its transaction was rolled back. The message
    names the store (without user and password), the operation and the limit. Also: another process held
    a SQLite store's schema lock file (`<file>.lock`) past SQLite's busy timeout (`SQLITE_TIMEOUT_S`),
    while this one had to create or upgrade the schema; the message names the lock file and what to do."""


class StoreConnectionLost(StoreError):
    """The PostgreSQL server ended the connection a statement or commit of tuner was using (a DBA's
    `pg_terminate_backend`, a restart or failover, an idle-connection reaper, a proxy that dropped it). The
    connection left the pool: the next call gets a new one. The message names the store, the operation
    and whether its transaction may have taken effect (only a cut commit leaves that unknown:
    `commit_unknown`)."""

    commit_unknown: bool = False


class StoreUnreachable(StoreError):
    """tuner could not connect to the PostgreSQL server of a store: nothing listens there (the server is
    down, restarting, not yet up, or the host or port is wrong), the database does not exist, the server
    refused the login, or no answer came within libpq's `connect_timeout` (`PG_CONNECT_TIMEOUT_S`; a URL's
    own `?connect_timeout=N` wins). The message names the store (without user and password), what was
    being done and libpq's reason, on one line. Nothing was written."""


class StoreConnectionLimit(StoreUnreachable):
    """The PostgreSQL server refused a new connection of tuner because a connection limit is reached
    ("sorry, too many clients already": its `max_connections`; "too many connections for role ..." or
    "... for database ...": a `CONNECTION LIMIT`; "remaining connection slots are reserved ..."; a
    pooler's "no more connections allowed"; or the same in a language PostgreSQL translates them to), and no
    slot came free within `TUNER_PG_CONNECT_WAIT` seconds.
    The message names the store, what was being done, the server's reason, how long tuner waited, how
    many connections a tuner process holds at most, and what to do. Nothing was written."""


class StoreCorrupt(StoreError):
    """The SQLite file of a store is damaged ("database disk image is malformed") or is not a SQLite
    database at all ("file is not a database"). tuner never changes or deletes such a file: the message
    names it and says how to move it aside or salvage it."""


_operation: contextvars.ContextVar[str | None] = contextvars.ContextVar("tuner_store_operation", default=None)


@contextlib.contextmanager
def operation(what: str) -> Iterator[None]:
    """Name the store operation that runs inside (for the message of a `StoreTimeout`)."""
    token = _operation.set(what)
    try:
        yield
    finally:
        _operation.reset(token)


def migration_timeout_s() -> float:
    """The PostgreSQL timeouts of the statements that create or upgrade a schema (tuner's or Optuna's), in
    seconds: the larger of `pg_timeout_s()` and `PG_MIGRATION_TIMEOUT_S` (0: none, as `TUNER_PG_TIMEOUT=0`)."""
    return pg_timeout_s() and max(pg_timeout_s(), PG_MIGRATION_TIMEOUT_S)


def _seconds_setting(name: str, default: float, doc: str) -> float:
    raw = _setting_text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        from tuner.errors import BadInput

        raise BadInput(f"{name} must be a number of seconds >= 0 ({doc}), got {raw!r}")
    return value


def pg_connect_wait_s() -> float:
    """`TUNER_PG_CONNECT_WAIT` in seconds (default `PG_CONNECT_WAIT_S`): how long a new PostgreSQL
    connection refused for a connection limit is tried again; 0: not at all."""
    return _seconds_setting("TUNER_PG_CONNECT_WAIT", PG_CONNECT_WAIT_S, "0: fail at once")


def pg_pool_size() -> int:
    """`TUNER_PG_POOL_SIZE` (default `PG_POOL_SIZE`): the connections each PostgreSQL engine keeps open
    between calls; as many more are opened at peaks."""
    raw = _setting_text("TUNER_PG_POOL_SIZE")
    if raw is None:
        return PG_POOL_SIZE
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        from tuner.errors import BadInput

        raise BadInput(f"TUNER_PG_POOL_SIZE must be a whole number >= 1, got {raw!r}")
    return value


def pg_timeout_s() -> float:
    """`TUNER_PG_TIMEOUT` in seconds (default `PG_TIMEOUT_S`); 0: no limit."""
    return _seconds_setting("TUNER_PG_TIMEOUT", PG_TIMEOUT_S, "0: no limit")


def _session_limits(
    url_options: str | None, timeout_s: float, *, migration: bool = False
) -> tuple[tuple[str, int, bool], ...]:
    """What each new connection of an engine sets (`PgSessionLimits`): (setting, ms, stricter) for each
    timeout the URL's `options` do not set. Ordinary connections (`stricter`): the session's own value (a
    DBA's `ALTER ROLE|DATABASE ... SET`, the server's configuration) stays where it is non-zero and at most
    `timeout_s`, else `timeout_s` is set; none with `timeout_s` 0 (tuner adds no limit: the DBA's stand).
    `migration` (an engine that only creates a schema): exactly `timeout_s`, 0 setting none (not the
    role's or database's: a DBA's idle_in_transaction_session_timeout ended the migration while alembic
    imported its scripts inside its transaction), and `lock_timeout=0` (the migration limit bounds its lock
    waits, as on the schema lock's own connection)."""
    own = url_options or ""
    out: list[tuple[str, int, bool]] = []
    if timeout_s > 0 or migration:
        ms = max(1, round(timeout_s * 1000)) if timeout_s > 0 else 0
        out += [(n, ms, not migration) for n in _PG_TIMEOUT_PARAMS if n not in own]
    if migration and "lock_timeout" not in own:
        out.append(("lock_timeout", 0, False))
    return tuple(out)


def _apply_session_limits(limits: tuple[tuple[str, int, bool], ...], dbapi_conn: Any, record: Any) -> None:
    """Give a new PostgreSQL connection `limits` (`_session_limits`), in one statement outside a
    transaction: it reads each setting's value at the session's start (the role's, the database's, the
    server's configuration, PGOPTIONS) from pg_settings and `set_config`s it where tuner's applies.
    Not libpq's startup options, which outrank the role's and database's values (a DBA's stricter 5 s
    became tuner's 60 s), and which PgBouncer refuses. Its record keeps what is in force (`_IN_FORCE`:
    `set_statement_limit` restores it, a timeout's message names it), and the client-side deadline follows
    the statement limit in force (`_watchdog`; while this statement runs, the one asked for)."""
    wanted = {n: ms for n, ms, _ in limits}
    guarded = hasattr(dbapi_conn, "tuner_own_limit_s")  # `_watchdog.Guarded`
    if guarded and "statement_timeout" in wanted:
        dbapi_conn.tuner_limit_s = dbapi_conn.tuner_own_limit_s = wanted["statement_timeout"] / 1000
    values = ", ".join(f"('{n}', {int(ms)}, {'true' if stricter else 'false'})" for n, ms, stricter in limits)
    sql = (
        "SELECT s.name, s.setting, s.source, CASE WHEN w.stricter AND s.setting::bigint > 0 AND "
        "s.setting::bigint <= w.ms THEN true ELSE set_config(s.name, w.ms::text, false) IS NULL END "
        f"FROM pg_settings s JOIN (VALUES {values}) AS w(name, ms, stricter) ON s.name = w.name"
    )
    autocommit = dbapi_conn.autocommit
    dbapi_conn.autocommit = True  # client-side only: no BEGIN, and no COMMIT to wait for
    try:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(sql)
            rows = cur.fetchall()
        finally:
            with contextlib.suppress(Exception):  # a connection the error closed: the error is raised
                cur.close()
    except BaseException:
        # a connection the server or a pooler closed under the statement (PgBouncer's
        # query_wait_timeout): restoring autocommit raised "connection already closed" in place of the
        # error that said why
        with contextlib.suppress(Exception):
            dbapi_conn.autocommit = autocommit
        raise
    dbapi_conn.autocommit = autocommit
    in_force = {
        name: (int(setting), source) if kept else (wanted[name], "tuner")
        for name, setting, source, kept in rows
    }
    record.info[_IN_FORCE] = in_force
    if guarded and "statement_timeout" in in_force:
        from ._watchdog import set_limit

        dbapi_conn.tuner_own_limit_s = in_force["statement_timeout"][0] / 1000
        set_limit(dbapi_conn, None)  # the watchdog looks again


class PgSessionLimits(CreateEnginePlugin):
    """The SQLAlchemy plugin (`plugins=[PG_LIMITS_PLUGIN]` and `tuner_pg_limits=_session_limits(...)` in
    `create_engine`'s arguments) that gives each new connection of a PostgreSQL engine its timeouts
    (`_apply_session_limits`), before any other statement on it (SQLAlchemy's own first queries
    included). Nothing per checkout."""

    def __init__(self, url: URL, kwargs: dict[str, Any]) -> None:
        super().__init__(url, kwargs)
        self.limits = tuple(kwargs.pop(PG_LIMITS_ARG, ()))  # taken out: not create_engine's

    def update_url(self, url: URL) -> URL:  # the URL names no plugin: nothing to take out of it
        return url

    def engine_created(self, engine: Engine) -> None:
        if engine.dialect.name != "postgresql" or not self.limits:
            return
        limits = self.limits

        def connect(dbapi_conn: Any, record: Any) -> None:
            _apply_session_limits(limits, dbapi_conn, record)

        event.listen(engine, "connect", connect, insert=True)


# pg_settings.source of a timeout a DBA set -> where (for messages)
_SOURCE_NAMES = {
    "user": "the role",
    "database": "the database",
    "database user": "the role in this database",
    "configuration file": "the server's configuration",
    "client": "PGOPTIONS",
}


def _in_force_text(ctx: ExceptionContext, setting: str) -> str | None:
    """The limit the connection of a failed statement runs under for `setting` where it is not tuner's
    (a DBA's stricter one: `_apply_session_limits`), named with where it was set; else None."""
    try:
        info = ctx.connection.connection.info if ctx.connection is not None else None
    except Exception:  # noqa: BLE001 - an invalidated connection: the engine's limit is named
        return None
    got = (info or {}).get(_IN_FORCE, {}).get(setting)
    if got is None or got[1] == "tuner":
        return None
    ms, source = got
    where = _SOURCE_NAMES.get(source, f"the server ({source})")
    return (
        f"{ms / 1000:g} s (the server's {setting}, set by {where}: stricter than TUNER_PG_TIMEOUT, which "
        "does not relax it)"
    )


_STATEMENT_TIMEOUT = re.compile(r"(?<![\w])statement_timeout\s*=\s*(\S+)")


def statement_timeout_option(options: str | None) -> str | None:
    """The value of the last `-c statement_timeout=...` in libpq `options` (as written), or None."""
    found = _STATEMENT_TIMEOUT.findall(options or "")
    return found[-1] if found else None


def _limit_text(url_options: str | None, timeout_s: float, *, migration: bool = False) -> str:
    named = statement_timeout_option(url_options)
    if named:
        return f"statement_timeout={named} (the URL's options)"
    if timeout_s > 0 and migration:
        return (
            f"{timeout_s:g} s (the migration limit: the larger of TUNER_PG_TIMEOUT and "
            f"{PG_MIGRATION_TIMEOUT_S:g} s)"
        )
    if timeout_s > 0:
        return f"{timeout_s:g} s (TUNER_PG_TIMEOUT; default {PG_TIMEOUT_S:g})"
    return "the server's own timeout (TUNER_PG_TIMEOUT=0 sets none)"


_STATEMENT_TARGET = re.compile(r"\b(?:FROM|INTO|UPDATE|TABLE)\s+\"?([A-Za-z_][\w.]*)", re.IGNORECASE)


def _describe(statement: str | None) -> str:
    if not statement:
        return "a commit"
    if not statement.strip():
        return "a statement"
    verb = statement.split(None, 1)[0].upper()
    what = f"{'an' if verb[0] in 'AEIOU' else 'a'} {verb}"  # an INSERT, an UPDATE, a DELETE
    target = _STATEMENT_TARGET.search(statement)
    return f"{what} on {target.group(1)}" if target else what


def _timeout_kind(exc: BaseException | None) -> str | None:
    """Which timeout ended the statement (None: the error is not a timeout): one of the server's, or
    "unanswered", the client's deadline on a server that did not answer at all (`_watchdog`)."""
    if getattr(exc, "tuner_unanswered", False):
        return "unanswered"
    code = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    msg = str(exc)
    if code == "57014" and "statement timeout" in msg:
        return "statement_timeout"
    if code == "55P03" and "lock timeout" in msg:
        return "lock_timeout"
    if code == "25P03" or "idle-in-transaction timeout" in msg:
        return "idle_in_transaction_session_timeout"
    return None


_with_timeout_errors: weakref.WeakSet[Engine] = weakref.WeakSet()


_PG_READ_ONLY = "25006"  # read_only_sql_transaction: a hot standby, default_transaction_read_only
# What to do about a server that only reads (tuner never overrides a DBA's default_transaction_read_only)
READ_ONLY_FIX = (
    "A standby: point the URL at the primary. Else `SHOW default_transaction_read_only` is on for this "
    "role or database (a DBA's `ALTER ROLE|DATABASE ... SET default_transaction_read_only = on`): use a "
    "role or database that may write, or have it RESET"
)


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL driver's error (psycopg2's `pgcode`, psycopg 3's `sqlstate`)."""
    code = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) else None


def install_timeout_errors(engine: Engine, url: str, *, migration: bool = False) -> None:
    """Turn the timeout errors of a PostgreSQL engine's statements into a `StoreTimeout` that names the
    store, the operation and the limit, a connection the server ended under a statement into a
    `StoreConnectionLost`, and a write the server refused because it only reads (a hot standby) into a
    `StoreError` that says so (the rest of SQLAlchemy's handling, the rollback, is unchanged).
    `migration`: the engine's connections were made with the migration limit (`engine_kwargs(url,
    migration_timeout_s())`), which the message then names."""
    if engine.dialect.name != "postgresql" or engine in _with_timeout_errors:
        return
    _with_timeout_errors.add(engine)
    parsed = make_url(normalize_url(url))
    url_options = parsed.query.get("options")
    limit = _limit_text(
        url_options if isinstance(url_options, str) else None,
        migration_timeout_s() if migration else pg_timeout_s(),
        migration=migration,
    )
    where = redact(parsed.render_as_string(hide_password=True))
    in_url = parsed.query.get("connect_timeout")
    connect_limit = (
        f"connect_timeout={in_url} (the URL's)"
        if isinstance(in_url, str)
        else f"connect_timeout={PG_CONNECT_TIMEOUT_S} s"
    )

    def _on_error(ctx: ExceptionContext) -> None:
        exc = ctx.original_exception
        if not isinstance(exc, Exception):
            # KeyboardInterrupt, SystemExit: an interrupt, not a fault. SQLAlchemy marks it a disconnect
            # (the connection is thrown away), and read as one it became `StoreConnectionLost`: a Ctrl-C
            # while the store was opened exited 1 with "the server ended the connection", not 130.
            return
        if _sqlstate(exc) == _PG_READ_ONLY and not ctx.is_pre_ping:
            said = " ".join(str(exc).split("\n", 1)[0].split())
            raise StoreError(
                f"store {where}: {_operation.get() or _describe(ctx.statement)} failed: the server only "
                f"reads ({said}: a hot standby after a failover, or default_transaction_read_only); its "
                f"transaction was rolled back, nothing of it was written. {READ_ONLY_FIX}"
            ) from exc
        kind = _timeout_kind(exc)
        if kind is None:
            if ctx.connection is None and ctx.statement is None and not ctx.is_pre_ping:
                _cannot_connect(ctx, where, connect_limit)  # a new connection that could not be made
            if ctx.is_disconnect and ctx.connection is not None and not ctx.is_pre_ping:
                # an idle pooled connection the server ended fails its pre-ping and is replaced unseen
                _connection_lost(ctx, where)
            return
        what = _operation.get() or _describe(ctx.statement)
        if kind == "unanswered":
            ctx.is_disconnect = True  # the connection was closed: the pool drops it
            if ctx.is_pre_ping:
                return  # an idle pooled connection whose server stopped: replaced by a new one
            exc = ctx.original_exception
            during = getattr(exc, "during", "statement")
            named = _in_force_text(ctx, "statement_timeout") or limit
            raise StoreTimeout(
                f"store {where}: {what} gave up after {getattr(exc, 'waited_s', 0):g} s ({named}, plus a "
                "margin): the server did not answer at all (a stopped or frozen server or host, which cannot "
                "send its own timeout error), so tuner closed the connection; "
                + (
                    "whether its commit took effect is unknown"
                    if during == "commit"
                    else "its transaction was not committed, nothing of it was written"
                )
            )
        migrating = _migration_limit_of(ctx)  # the schema lock's connection: SET to the migration's
        named = (
            (_in_force_text(ctx, kind) or limit)
            if migrating is None
            else _limit_text(None, migrating, migration=True)
        )
        if kind == "lock_timeout":
            # tuner sets no lock_timeout: the database's, the role's or the URL's own (a DBA's `ALTER
            # DATABASE ... SET lock_timeout`) ended the wait, well before tuner's limit, which was named
            raise StoreTimeout(
                f"store {where}: {what} gave up: another transaction held a lock it needed past the "
                "server's lock_timeout (tuner sets none: the database's, the role's or the URL's options "
                "set it; `SHOW lock_timeout`); its transaction was rolled back, nothing of it was written"
            )
        if kind == "idle_in_transaction_session_timeout":
            why = (
                "the server ended the session: it sat inside a transaction past "
                "idle_in_transaction_session_timeout (the process stalled between two statements)"
            )
        else:
            why = (
                f"no answer within {kind} (the server did not answer in time, or another transaction "
                "held a lock it needed)"
            )
        raise StoreTimeout(
            f"store {where}: {what} gave up after {named}: {why}; its transaction was rolled back, "
            "nothing of it was written"
        )

    event.listen(engine, "handle_error", _on_error)
    event.listen(engine, "do_connect", _connect_waiting)  # after psycopg 3's deadline, which connects first
    if engine.dialect.driver in ("psycopg2", "psycopg"):
        from ._pooler import refuse_shared_sessions

        refuse_shared_sessions(engine, where)  # a transaction pooler (PgBouncer), before any SET


def _migration_limit_of(ctx: ExceptionContext) -> float | None:
    """The limit a connection runs under while `set_statement_limit` gave it the migration's (the schema
    lock's connection), else None (the limit it connected with, which the engine's message names)."""
    try:
        dbapi_conn = ctx.connection.connection.dbapi_connection if ctx.connection is not None else None
    except Exception:  # noqa: BLE001 - an invalidated connection: the engine's limit is named
        return None
    now = getattr(dbapi_conn, "tuner_limit_s", None)
    own = getattr(dbapi_conn, "tuner_own_limit_s", None)
    return now if now and now != own else None


def _connection_lost(ctx: ExceptionContext, where: str) -> None:
    """Raise the `StoreConnectionLost` of a statement or commit whose connection the server ended (the
    pool drops that connection: SQLAlchemy invalidates it after this hook)."""
    what = _operation.get() or _describe(ctx.statement)
    said = " ".join(str(ctx.original_exception).split())
    err = StoreConnectionLost(
        f"store {where}: {what} failed: the server ended the connection ({said}; a server restart or "
        "failover, pg_terminate_backend, an idle-connection reaper or a proxy that dropped it); "
        + (
            "whether its commit took effect is unknown"
            if ctx.statement is None
            else "its transaction was not committed, nothing of it was written"
        )
        + "; the next call connects again"
    )
    err.commit_unknown = ctx.statement is None
    raise err from ctx.original_exception


def _cannot_connect(ctx: ExceptionContext, where: str, limit: str) -> None:
    """Raise the `StoreUnreachable` of a connection the driver could not make (libpq's reason, one line);
    `StoreConnectionLimit` when the server refused it for a connection limit."""
    exc = ctx.original_exception
    if not isinstance(exc, ctx.dialect.loaded_dbapi.Error):
        return  # not the driver's: a bug of ours or of a plugin, left as it is
    what = _operation.get() or "connecting"
    said = " ".join(str(exc).split()).removeprefix("connection failed: ")
    if connection_limit_refusal(exc):
        n, wait_s = pg_pool_size(), pg_connect_wait_s()
        waited = (
            f"no slot came free within {wait_s:g} s (TUNER_PG_CONNECT_WAIT)"
            if wait_s
            else "TUNER_PG_CONNECT_WAIT=0: no wait for a free slot"
        )
        raise StoreConnectionLimit(
            f"cannot connect to store {where} ({what}): the server refused a new connection, a connection "
            f"limit is reached ({said}); {waited}. A tuner process holds "
            f"at most {4 * n} connections to a store (TUNER_PG_POOL_SIZE={n} kept by each of its 2 "
            "engines, as many more at peaks; a study worker uses about 4): run fewer worker processes "
            "against this server, lower TUNER_PG_POOL_SIZE, raise the limit (max_connections, the role's "
            "or database's CONNECTION LIMIT) or put a pooler such as PgBouncer in front; nothing was "
            "written"
        ) from exc
    raise StoreUnreachable(
        f"cannot connect to store {where} ({what}): {said} ({limit}); nothing was written"
    ) from exc


# What PostgreSQL (SQLSTATE 53300, too_many_connections) and PgBouncer say when they refuse a connection for
# a connection limit. Neither driver gives the SQLSTATE of a refusal that ends the connection's start (libpq
# keeps it to itself: psycopg2's `pgcode` and psycopg 3's `sqlstate` are None), so its message is read: in
# English, or in a language PostgreSQL's catalogs translate it to (a server's own `lc_messages`: `_refusals`).
_LIMIT_REFUSALS = (
    "too many clients already",  # max_connections
    "too many connections for role",  # ALTER ROLE ... CONNECTION LIMIT
    "too many connections for database",  # ALTER DATABASE ... CONNECTION LIMIT
    "remaining connection slots are reserved",  # the slots left are superuser_reserved_connections'
    "no more connections allowed",  # PgBouncer's max_client_conn, max_db_connections, max_user_connections
)


def connection_limit_refusal(exc: BaseException) -> bool:
    """`exc` is a driver's error for a connection the server refused because a connection limit is
    reached."""
    code = _sqlstate(exc)
    if code == "53300" or any(m in str(exc) for m in _LIMIT_REFUSALS):
        return True
    if code is not None:  # another error the driver gave the SQLSTATE of
        return False
    from ._refusals import localized_limit_refusal

    return localized_limit_refusal(str(exc))


_T = TypeVar("_T")


def connect_waiting(make: Callable[[], _T]) -> _T:
    """`make()` (a new PostgreSQL connection); while the server refuses it for a connection limit, again
    after a pause that grows from 0.1 s to 2 s (jittered, so a fleet does not come back at once) for up to
    `pg_connect_wait_s()` in all; then the last refusal is raised (the engine's error handler makes it a
    `StoreConnectionLimit`). Any other error is raised at once."""
    wait_s = pg_connect_wait_s()
    start = time.monotonic()
    pause = 0.1
    while True:
        try:
            return make()
        except Exception as exc:
            waited = time.monotonic() - start
            if not connection_limit_refusal(exc) or waited >= wait_s:
                raise
            if pause == 0.1:  # the first refusal
                log.info(
                    "the PostgreSQL server refused a connection (%s): waiting up to %g s for a free slot",
                    " ".join(str(exc).split()),
                    wait_s,
                )
            time.sleep(min(pause * random.uniform(0.5, 1.5), max(0.0, wait_s - waited)))
            pause = min(2.0, pause * 2)


def _connect_waiting(dialect: Any, _rec: Any, cargs: Any, cparams: Any) -> Any:
    """The `do_connect` listener of tuner's PostgreSQL engines: the driver's connect, tried again while
    the server refuses it for a connection limit (`connect_waiting`). psycopg 3 engines with a deadline
    connect in `_watchdog_pg3`, which waits the same way."""
    if dialect.driver == "psycopg2":  # an engine made before the command started (`engine_for`'s)
        from ._interruptible import install_in_command

        install_in_command()
    return connect_waiting(lambda: dialect.connect(*cargs, **cparams))


# SQLite's primary result codes of the faults that are the file's or the disk's, not the statement's (a file
# that cannot be opened at all is left to the callers, which say whether its folder can be written)
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 8, 10, 11, 13, 26
# Every SQLITE_READONLY_* extended code (RECOVERY, CANTLOCK, ROLLBACK, CANTINIT: a WAL database whose `-shm`
# cannot be written; DIRECTORY: its folder) is the read-only fault, but for DBMOVED: a connection in a
# rollback-journal mode writing into a file deleted or renamed since it opened it. SQLite's text is the same
# for all of them ("attempt to write a readonly database"): the extended code (Python 3.11's
# `sqlite_errorcode`) tells them apart.
_SQLITE_READONLY_DBMOVED = _SQLITE_READONLY | (4 << 8)
_SQLITE_FAULTS = {
    _SQLITE_CORRUPT: "database disk image is malformed",
    _SQLITE_NOTADB: "file is not a database",
    _SQLITE_FULL: "database or disk is full",
    _SQLITE_READONLY: "attempt to write a readonly database",
    _SQLITE_IOERR: "disk I/O error",
}


def _sqlite_fault(exc: BaseException | None) -> int | None:
    """The primary result code of a SQLite error that is a fault of the file or the disk, else None."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _SQLITE_FAULTS:
        return code & 0xFF
    msg = str(exc)
    for c, text_ in _SQLITE_FAULTS.items():
        if text_ in msg:
            return c
    return None


def sqlite_fault_message(path: str, what: str, exc: BaseException) -> tuple[type[StoreError], str] | None:
    """The error a SQLite fault of the file or the disk (`exc`) is raised as: its class and a message that
    names the file and what to do; None for any other error (a lock, a constraint, a bad statement)."""
    folder = os.path.dirname(path) or "."
    code = _sqlite_fault(exc)
    if code is None and _disk_full(exc, folder):
        code = _SQLITE_FULL  # a file that cannot be made (the WAL's `-shm`): no byte or inode left there
    if code is None:
        return None
    sqlite_msg = " ".join(str(exc).split())
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreCorrupt, (
            f"store {path} is corrupt ({sqlite_msg}); tuner does not change or delete it: move it aside (a "
            f"new store is then made in its place) or salvage its rows with `sqlite3 {path} .recover | sqlite3 {path}.recovered`"
        )
    if code == _SQLITE_IOERR and _disk_full(exc, folder):
        code = _SQLITE_FULL  # WAL's shared-memory file could not grow (SQLITE_IOERR_SHMSIZE): no space
    limit = _size_limit_reached(path) if code == _SQLITE_IOERR else None
    why = {
        _SQLITE_FULL: f"the disk that holds {folder} is full; free space there and run again",
        _SQLITE_READONLY: f"the file or its folder {folder} cannot be written (a read-only mount?)",
        _SQLITE_IOERR: f"the file or its folder {folder} was removed, moved or unmounted, or the disk failed",
    }[code]
    if getattr(exc, "sqlite_errorcode", None) == _SQLITE_READONLY_DBMOVED:
        why = (
            "the file was deleted or moved away while this process had it open (SQLite refuses to write "
            "into it); open the store again where its file is now"
        )
    elif limit is not None:
        why = (
            f"{limit[0]} reached this process's file size limit ({limit[1]} bytes, `ulimit -f`): the "
            "store cannot grow; raise the limit and run again"
        )
    return StoreError, (
        f"store {path}: {what} failed ({sqlite_msg}): {why}; its transaction was rolled back, nothing of "
        "it was written"
    )


# A write that a file size limit refuses (RLIMIT_FSIZE, `ulimit -f`: EFBIG, SQLite's "disk I/O error")
# fails within a write of the limit: at most a page (64 KiB) plus the WAL frame's header, with room to spare.
_SIZE_LIMIT_SLACK = 256 * 1024


def _size_limit_reached(path: str) -> tuple[str, int] | None:
    """The largest file of the SQLite store at `path` (the database, its `-wal` or `-journal`) where it has
    reached this process's file size limit, and the limit; None where no limit is set or no file is near it."""
    try:
        import resource  # POSIX only
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (OSError, ValueError, AttributeError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    sizes = []
    for name in (path, path + "-wal", path + "-journal"):
        with contextlib.suppress(OSError):
            sizes.append((os.stat(name).st_size, name))
    if not sizes or max(sizes)[0] + _SIZE_LIMIT_SLACK < soft:
        return None
    return max(sizes)[1], int(soft)


_SQLITE_IOERR_SHMSIZE = 10 | (19 << 8)
_SQLITE_CANTOPEN = 14
_LOW_SPACE = 64 * 1024  # below this many free bytes (or with no free inode), an I/O error is the full disk's
# The errors of a file SQLite could not make, map or grow (the `-shm` of a WAL database, a write): what a
# full disk makes. A lock ("database is locked", SQLITE_BUSY) or a bad statement is never the disk's.
_SPACE_ERRORS = {
    _SQLITE_IOERR: "disk I/O error",
    _SQLITE_FULL: "database or disk is full",
    _SQLITE_CANTOPEN: "unable to open database file",
}


def _space_error(exc: BaseException | None) -> bool:
    """`exc` is a SQLite error of the kind a full disk makes (`_SPACE_ERRORS`), by its result code (Python
    3.11's `sqlite_errorcode`), else by its message."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _SPACE_ERRORS
    msg = str(exc)
    return any(text_ in msg for text_ in _SPACE_ERRORS.values())


def _disk_full(exc: BaseException | None, folder: str) -> bool:
    """A SQLite error that a full disk caused: SQLITE_FULL, or an I/O error or a file that could not be
    opened (the `-shm` file of a WAL database that could not be made or grow, SQLITE_IOERR_SHMSIZE; a
    write that failed) with no space left there, or no inode to make a file with (a disk that many small
    files filled, as a compiler's cache does: the `-shm` cannot be made, SQLITE_CANTOPEN, however many
    bytes are free). Any other error (a lock held past the busy timeout) is not the disk's, however
    little space is left."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (_SQLITE_FULL, _SQLITE_IOERR_SHMSIZE):
        return True
    if not _space_error(exc):
        return False
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # gone, or no statvfs (Windows)
        return False
    no_inode = st.f_files > 0 and st.f_favail == 0  # (a file system that counts no inodes says 0 of 0)
    return st.f_bavail * st.f_frsize < _LOW_SPACE or no_inode


def disk_full_in(path: str, exc: BaseException) -> bool:
    """`exc`, or an error in its chain of causes, is SQLite's for a full disk under `path`'s folder."""
    folder = os.path.dirname(os.path.abspath(path))
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__module__ == "sqlite3" and _space_error(cur):  # full, an I/O error, cannot open
            return _disk_full(cur, folder)
        cur = cur.__cause__ or cur.__context__
    return False


def sqlite_fault_in(path: str, what: str, exc: BaseException) -> StoreError | None:
    """The `StoreError` of the first SQLite fault of the file or the disk in `exc`'s chain of causes (an
    error Optuna wrapped in its own), or None."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StoreError):
            return cur
        got = sqlite_fault_message(path, what, cur) if type(cur).__module__ == "sqlite3" else None
        if got is not None:
            err = got[0](got[1])
            err.__cause__ = cur
            return err
        cur = cur.__cause__ or cur.__context__
    return None


_with_sqlite_errors: weakref.WeakSet[Engine] = weakref.WeakSet()


def install_sqlite_errors(engine: Engine) -> None:
    """Turn the faults of a SQLite engine's file or disk (corrupt, not a database, disk full, read-only,
    I/O error) into a `StoreError` (`StoreCorrupt` for a damaged file) that names the file and what to do.
    Other errors (a lock held past the busy timeout, a constraint) are left as SQLAlchemy raises them."""
    if engine.dialect.name != "sqlite" or engine in _with_sqlite_errors:
        return
    path = sqlite_file(engine) or str(engine.url.database)
    if path.startswith("file:"):  # a read-only URI: file:/path?mode=ro&immutable=1
        path = _uri_file(path)
        path = snapshot_sources.get(path, path)  # a private copy of a read-only store: name the store
    _with_sqlite_errors.add(engine)

    def _on_error(ctx: ExceptionContext) -> None:
        exc = ctx.original_exception
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: an interrupt, not a fault
            # (SQLAlchemy 2.1's ExceptionContext leaves its `cursor` unset: the execution context's)
            _close_cursor(getattr(ctx, "cursor", None) or getattr(ctx.execution_context, "cursor", None))
            return
        what = _operation.get() or ("opening it" if ctx.connection is None else _describe(ctx.statement))
        got = sqlite_fault_message(path, what, exc)
        if got is not None:
            cls, msg = got
            raise cls(msg) from exc

    event.listen(engine, "handle_error", _on_error)
    event.listen(engine, "checkin", _end_open_transaction)


def _end_open_transaction(dbapi_conn: Any, _record: Any) -> None:
    """Roll back a transaction still open on a SQLite connection that goes back to the pool. An interrupt
    inside SQLAlchemy's commit (in its commit event's listeners, before the driver's COMMIT) leaves the
    Connection believing its transaction ended, so a session that is then only closed (Optuna's do that
    on a KeyboardInterrupt) hands the connection back with the driver's transaction open and the pool
    skips its reset: the file stayed write-locked for as long as the connection sat in the pool. One
    attribute read per check-in otherwise."""
    if dbapi_conn is not None and getattr(dbapi_conn, "in_transaction", False):
        with contextlib.suppress(Exception):
            dbapi_conn.rollback()


def _close_cursor(cursor: Any) -> None:
    """Close the cursor of a SQLite statement that an interrupt (Ctrl-C, SIGTERM's KeyboardInterrupt,
    SystemExit) stopped. SQLAlchemy then throws the connection away (it treats an interrupt as a
    disconnect) and closes it without closing the cursor, and SQLite keeps a connection closed under a
    statement with rows left to read open, its transaction and write lock included, until that cursor is
    garbage-collected: the interrupt's traceback holds it, in a notebook or REPL for as long as
    `sys.last_traceback` does, and every other writer of the file waits out its busy timeout meanwhile
    (a read after a write in one transaction: `ConfigCache.merge`, a migration, Optuna's trials).
    Closed first, the cursor's statement is done and closing the connection rolls its transaction back."""
    if cursor is not None:
        with contextlib.suppress(Exception):
            cursor.close()


def locale_hint() -> str:
    """The remedy for a path Python holds as undecodable bytes: a UTF-8 locale or Python's UTF-8 mode."""
    return (
        f"file system encoding is {sys.getfilesystemencoding()}: run with a UTF-8 locale (LC_ALL=C.UTF-8) "
        "or PYTHONUTF8=1"
    )


def require_text(value: str, what: str) -> str:
    """`value` (a path or URL) unchanged, or OSError in one line where it is not text: bytes the file
    system encoding could not decode (a folder named `hömé` under `LC_ALL=C PYTHONUTF8=0`, where Python's
    file system encoding is ascii), which Python can open but SQLAlchemy cannot write in a URL (it encodes
    it as UTF-8: "surrogates not allowed")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise OSError(f"{what} {shown} is not text in this locale ({locale_hint()})") from None
    return value


def normalize_url(url: str) -> str:
    """`postgresql://...` names no driver, and SQLAlchemy 2.1 then picks psycopg 3; tuner depends on
    psycopg2 (pyproject), so a driverless PostgreSQL URL is pointed at psycopg2 unless psycopg 3 is there
    (then SQLAlchemy's default stands). Both drivers get the same timeouts and client-side deadline.
    OSError for a URL that is not text (`require_text`)."""
    require_text(url, "store URL")
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            if (
                importlib.util.find_spec("psycopg") is None
                and importlib.util.find_spec("psycopg2") is not None
            ):
                return "postgresql+psycopg2://" + url[len(prefix) :]
            return "postgresql://" + url[len(prefix) :]
    return url


_SECRET_WORDS = ("password", "secret", "token")  # a query parameter whose name holds one is masked


def mask_query_secrets(url: str) -> str:
    """The URL with the values of its secret query parameters (`?password=...`, `sslpassword`, a
    `token`) replaced by `***`: a driver takes the password there too, where hiding the URL's own
    password field leaves it."""
    head, sep, query = url.partition("?")
    if not sep:
        return url
    parts = []
    for part in query.split("&"):
        name, eq, _value = part.partition("=")
        if eq and any(w in name.lower() for w in _SECRET_WORDS):
            part = f"{name}=***"
        parts.append(part)
    return head + sep + "&".join(parts)


_SCHEME = re.compile(r"[A-Za-z][\w+.\-]*:(?=/)/*")  # a scheme and its slashes, however many were typed


def mask_password(url: str) -> str:
    """The URL with what lies between the user's ':' and the host's '@' replaced by `***`, and its secret
    query parameters masked; also for a string SQLAlchemy cannot parse (`postgresql:/u:pw@h/db`,
    `postgresql//u:pw@h/db`), which a message echoes as given. Errs on the side of hiding: a path that
    holds ':' and '@' (`sqlite:///runs/a:b@c.db`) is masked as well."""
    url = mask_query_secrets(url)
    head, sep, query = url.partition("?")
    at = head.rfind("@")
    m = _SCHEME.match(head)
    colon = head.find(":", m.end() if m else 0, max(at, 0))
    if at < 0 or colon < 0:
        return url
    return f"{head[: colon + 1]}***{head[at:]}{sep}{query}"


def redact(url: str) -> str:
    """The URL without user and password, and with its secret query parameters masked (for messages);
    a string that is no `scheme://user:password@host` URL keeps its shape, its password masked
    (`mask_password`)."""
    url = mask_query_secrets(url)
    scheme, sep, rest = url.partition("://")
    head, q, query = rest.partition("?")
    user, at, host = head.rpartition("@")
    if sep and at and "/" not in user.partition(":")[0]:  # not a path's '@' (sqlite:///runs/a@b.db)
        return f"{scheme}://{host}{q}{query}"
    return mask_password(url)


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL, or None (not SQLite, or an in-memory database): its database part
    percent-decoded, as SQLAlchemy opens it (`sqlite:///runs/a%20b%3F/s.db` is the file `runs/a b?/s.db`;
    SQLAlchemy's rendered URL escapes a path's '#', '?', '%' and non-ASCII letters so). A read-only URI
    (`immutable_url`) comes back as the SQLite URI it is, `file:` and its own escapes kept: `_uri_file`."""
    if not url.startswith("sqlite"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = unquote(path.split("?", 1)[0])  # as sqlalchemy.engine.make_url decodes its database
    if not path or path == ":memory:" or path.startswith("file::memory:"):
        return None
    return path


def missing_sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL that does not exist yet (a store never made there), else None: a server's
    store, an in-memory one, a read-only URI (`file:`) or a file that exists."""
    path = sqlite_path(url)
    if path is None or path.startswith("file:") or os.path.exists(path):
        return None
    return path


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The URL of the SQLite file `path`, its '%' and '?' escaped: SQLAlchemy decodes a URL's `%xx` and
    ends its database at the first '?' (a folder named `what?` or `a%20b` named another file)."""
    path = require_text(os.fspath(path), "the store's path")
    return "sqlite:///" + path.replace("%", "%25").replace("?", "%3F")


def _uri_file(path: str) -> str:
    """The file of a SQLite URI filename (`file:/a%20b/s.db?mode=ro`, what `sqlite_path` gives for a
    read-only URI): its path, decoded (SQLite decodes it once more than SQLAlchemy does)."""
    return unquote(path.removeprefix("file:").split("?", 1)[0])


def _file_uri_url(path: str, query: str) -> str:
    """The SQLAlchemy URL of the SQLite URI filename `file:{path}?{query}`: the path escaped twice, once
    for the SQLite URI (whose '#' and '?' would end it, and whose '%' escapes) and once for the URL,
    which SQLAlchemy decodes before it hands SQLite the URI."""
    return f"sqlite:///file:{quote(quote(os.path.abspath(path)))}?{query}"


def sqlite_file(engine: Engine) -> str | None:
    """The file a SQLite engine opens (None: not SQLite, or an in-memory database): its URL's database as
    SQLAlchemy decodes it. Not `sqlite_path(str(engine.url))`: the rendered URL percent-encodes a path's
    '#', '?', '%' and non-ASCII letters (a folder named `josé`), a file that is not there."""
    if engine.dialect.name != "sqlite":
        return None
    db = engine.url.database
    if not db or db == ":memory:" or db.startswith("file::memory:"):
        return None
    return db


_wal_warned: set[str] = set()
# The private copies of read-only stores (`_read_only.snapshot`) -> the store each was copied from: the
# messages of a fault of a copy name the store.
snapshot_sources: dict[str, str] = {}


def read_only_url(url: str) -> str | None:
    """The URL that opens an existing SQLite store read-only when its folder cannot be written (a
    read-only mount, a store shipped in a container image), else None.

    SQLite cannot open a WAL database there the usual way: it would create the `-shm` file beside it. A
    checkpointed store (what tuner leaves when its last connection closes) is read as it is (immutable);
    one whose `-wal` still holds changes is read with them: in place through SQLite's locks where its
    `-shm` can be read, else from a private copy (`_read_only`). Every write fails, as a read-only
    store's should."""
    path = sqlite_path(url)
    if path is None or path.startswith("file:") or not os.path.isfile(path):
        return None
    path = os.path.abspath(path)
    if os.access(os.path.dirname(path), os.W_OK):
        return None
    from ._read_only import read_only_file_url

    return read_only_file_url(path)


def immutable_url(path: str) -> str:
    """The URL that reads the SQLite file `path` as it is, read-only, creating nothing beside it (no
    `-shm`, no lock): what is only in a non-empty `-wal` is not read, and a warning says so."""
    path = os.path.abspath(path)
    _warn_unread_wal(path)
    return immutable_url_unwarned(path)


def immutable_url_unwarned(path: str) -> str:
    """`immutable_url` without the warning (for a caller that has said what it did not read)."""
    return _file_uri_url(os.path.abspath(path), "mode=ro&immutable=1&uri=true")


def _warn_unread_wal(path: str) -> None:
    wal = path + "-wal"
    if os.path.isfile(wal) and os.path.getsize(wal) > 0 and wal not in _wal_warned:
        _wal_warned.add(wal)
        log.warning(
            "store %s is read-only and its write-ahead log %s is not empty (its last writer did not close "
            "it): what is only in the log is not read",
            path,
            wal,
        )


_LOCKED_READ_ONLY = "mode=ro&uri=true"


def locked_read_only_url(path: str) -> str:
    """The URL that reads the SQLite file `path` read-only through SQLite's own locks (`mode=ro`): each
    read sees one committed state, another process's write-ahead log included, and no checkpoint of a
    writer overwrites the pages it reads. For a store opened read-only because its disk is full, and for
    one in a folder that cannot be written whose `-wal` holds changes and whose `-shm` can be read
    (`_read_only`).

    Its engine (`make_engine`) opens a new connection for each use and decides there: SQLite cannot open
    a WAL database so when its `-shm` file cannot be made or grown (a full disk; then no process has the
    wal-index that read needs), or when its writer has closed it since (`_log_gone`), and that connection
    reads the file immutable instead (`immutable_url`), as it is. The next use tries the locked read
    again."""
    return _file_uri_url(path, _LOCKED_READ_ONLY)


def _log_gone(exc: sqlite3.OperationalError, path: str) -> bool:
    """Whether a read-only opening of `path` failed because its writer closed it since (SQLite removed its
    `-wal` and `-shm`, and cannot make the `-shm` in a folder that cannot be written): then there is no log
    to miss, and the file is read as it is. Not a lock another process holds (never read immutable)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code not in (_SQLITE_READONLY, _SQLITE_CANTOPEN):
        return False
    wal = path + "-wal"
    return not os.path.isfile(wal) or os.path.getsize(wal) == 0


_SQLITE_READONLY, _SQLITE_CANTOPEN = 8, 14  # SQLite's primary result codes


def _locked_read_only_engine(url: str) -> Engine:
    """The engine of a `locked_read_only_url` (one connection per use, see there)."""
    import sqlite3

    from sqlalchemy.pool import NullPool

    path = _uri_file(sqlite_path(url) or "")
    folder = os.path.dirname(path)

    def open_(query: str) -> sqlite3.Connection:
        uri = f"file:{quote(path)}?{query}"
        return sqlite3.connect(uri, uri=True, timeout=SQLITE_TIMEOUT_S, check_same_thread=False)

    def connect() -> sqlite3.Connection:
        conn = open_("mode=ro")
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a WAL database: maps its -shm
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if not _disk_full(exc, folder) and not _log_gone(exc, path):
                raise
        _warn_unread_wal(path)
        return open_("mode=ro&immutable=1")

    eng = create_engine(url, creator=connect, poolclass=NullPool)
    install_sqlite_errors(eng)
    return eng


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()


def engine_kwargs(url: str, timeout_s: float | None = None, *, migration: bool = False) -> dict[str, Any]:
    """The keyword arguments of `create_engine` for `url` (also given to Optuna's RDBStorage).
    `timeout_s`: the PostgreSQL timeouts in seconds in place of `pg_timeout_s()` (0: none); `migration`:
    an engine that only creates a schema (`_session_limits`)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    pool = pg_pool_size()
    kw: dict[str, Any] = {"pool_pre_ping": True, "pool_size": pool, "max_overflow": pool}
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", "psycopg"):
        if parsed.get_driver_name() == "psycopg2":  # Ctrl-C ends the command's waits for the server
            from ._interruptible import install_in_command

            install_in_command()
        # libpq's own connection parameters; those the URL names are left to it
        args = {"connect_timeout": PG_CONNECT_TIMEOUT_S, **_PG_KEEPALIVES}
        kw["connect_args"] = {k: v for k, v in args.items() if k not in parsed.query}
        url_options = parsed.query.get("options")
        if "default_transaction_isolation" not in str(url_options or ""):
            # each transaction begins at read committed (the drivers send `BEGIN ISOLATION LEVEL ...`: no
            # startup option, which PgBouncer refuses): tuner's writes (upserts with ON CONFLICT, lease
            # updates under a token) and Optuna's are made for PostgreSQL's default level, and under a
            # DBA's `serializable` default Optuna's commit of a trial's state from one study's workers met
            # serialization failures ("could not serialize access"), which Optuna does not retry
            kw["isolation_level"] = "READ COMMITTED"
        limit = pg_timeout_s() if timeout_s is None else timeout_s
        own = url_options if isinstance(url_options, str) else None
        limits = _session_limits(own, limit, migration=migration)
        if limits:
            kw["plugins"] = [PG_LIMITS_PLUGIN]
            kw[PG_LIMITS_ARG] = limits
        if statement_timeout_option(own) or any(n == "statement_timeout" for n, _, _ in limits):
            # the server enforces statement_timeout only while it runs: a client-side deadline for a
            # server that does not (stopped, frozen), which libpq would wait on for ever (`_watchdog`)
            if parsed.get_driver_name() == "psycopg2":
                from ._watchdog import GuardedConnection

                kw["connect_args"]["connection_factory"] = GuardedConnection
            else:  # psycopg 3 takes no connection class: a plugin connects (`_watchdog_pg3`)
                kw["plugins"] = [*kw.get("plugins", ()), PG3_DEADLINE_PLUGIN]
    return kw


class EngineCreated(CreateEnginePlugin):
    """The SQLAlchemy plugin (`plugins=[ENGINE_CREATED_PLUGIN]` and `tuner_engine_created=fn` in
    `create_engine`'s arguments) that calls `fn(engine)` as soon as the engine is made, before it connects.
    Optuna's RDBStorage makes its engine and runs statements on it inside its constructor: this is how
    tuner gives that engine its error handler before the first statement, and keeps hold of it to dispose
    of it when the constructor raises (`optuna_storage`)."""

    def __init__(self, url: URL, kwargs: dict[str, Any]) -> None:
        super().__init__(url, kwargs)
        self.callback = kwargs.pop(ENGINE_CREATED_ARG, None)  # taken out: not create_engine's

    def update_url(self, url: URL) -> URL:  # the URL names no plugin: nothing to take out of it
        return url

    def engine_created(self, engine: Engine) -> None:
        if self.callback is not None:
            self.callback(engine)


def engine_kwargs_calling(
    url: str, timeout_s: float | None, callback: Any, *, migration: bool = False
) -> dict[str, Any]:
    """`engine_kwargs(url, timeout_s, migration=migration)`, plus the plugin that calls `callback(engine)`
    as soon as the engine is made (`EngineCreated`)."""
    kw = engine_kwargs(url, timeout_s, migration=migration)
    kw["plugins"] = [*kw.get("plugins", ()), ENGINE_CREATED_PLUGIN]
    kw[ENGINE_CREATED_ARG] = callback
    return kw


def set_statement_limit(conn: Connection, seconds: float | None) -> None:
    """`SET statement_timeout` and `idle_in_transaction_session_timeout` on one PostgreSQL connection
    (None: back to those it got when it was made), and the client-side deadline of its calls with it. A migration
    needs both: alembic imports its scripts inside the migration's open transaction."""
    if conn.dialect.name != "postgresql":
        return
    own = conn.connection.info.get(_IN_FORCE, {})  # what the connection got when it was made
    for param in _PG_TIMEOUT_PARAMS:
        if seconds is None and param in own:
            conn.execute(text(f"SET {param} = {int(own[param][0])}"))
        elif seconds is None:  # the URL's options or the server's: the session's own
            conn.execute(text(f"RESET {param}"))
        else:
            conn.execute(text(f"SET {param} = {round(seconds * 1000)}"))
    if conn.dialect.driver in ("psycopg2", "psycopg"):
        from ._watchdog import set_limit

        set_limit(conn.connection.dbapi_connection, seconds)


def make_engine(url: str) -> Engine:
    """A new engine for `url` (normalised), with the SQLite pragmas (WAL, busy timeout) installed.
    Most code wants the shared `engine_for(url)`."""
    url = normalize_url(url)
    if url.startswith("sqlite:///file:") and url.endswith("?" + _LOCKED_READ_ONLY):
        return _locked_read_only_engine(url)
    eng = create_engine(url, **engine_kwargs(url))
    if url.startswith("sqlite"):
        event.listen(eng, "connect", _sqlite_pragmas)
        install_sqlite_errors(eng)
        path = sqlite_path(url)
        if path is not None and not path.startswith("file:"):  # a file, not read-only: no writes to lose
            from ._replaced import watch_file

            watch_file(eng, path, owner=True)  # a file deleted or replaced under this process
    install_timeout_errors(eng, url)
    return eng


_engines: dict[str, Engine] = {}  # by URL; a forked child keeps them with new pools
_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """The engine of this process for `url`: one per URL and process, shared by the results store, the
    config cache and the task board (a forked child gets its own pool: `_after_fork_in_child`)."""
    url = normalize_url(url)
    eng = _engines.get(url)
    if eng is None:
        with _lock:
            eng = _engines.get(url)
            if eng is None:
                eng = _engines[url] = make_engine(url)
    return eng


def engine_of(url: str) -> Engine | None:
    """The engine `engine_for(url)` gave this process, if it made one."""
    return _engines.get(normalize_url(url))


# The pools a forked child inherited: kept referenced, never used or closed (see `_after_fork_in_child`).
_inherited_pools: list[Any] = []


def _after_fork_in_child() -> None:
    """A forked child (gunicorn --preload, multiprocessing's fork, a DataLoader worker) must not use the
    connections its parent opened: a PostgreSQL socket shared by two processes mixes their replies (a
    read hangs for ever or returns the other process's rows), and SQLite forbids carrying a connection
    across fork. Each engine of the parent (the ResultStore and ConfigCache objects the child inherited
    hold them) gets a new, empty pool, as SQLAlchemy's `Engine.dispose(close=False)` does (without its
    `engine_disposed` event, which would unpin the SQLite file the parent opened: it is still the same
    file). The old pools are kept, untouched: closing their connections here would end the parent's
    PostgreSQL sessions. The lock is new (a parent thread may have held it at the fork)."""
    global _lock
    _lock = threading.Lock()
    for eng in _engines.values():
        _inherited_pools.append(eng.pool)
        eng.pool = eng.pool.recreate()


os.register_at_fork(after_in_child=_after_fork_in_child)
