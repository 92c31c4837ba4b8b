"""Refusing a pooler that shares one PostgreSQL server session between client connections.

PgBouncer in `pool_mode = transaction` (or `statement`) hands a client's connection a server session for one
transaction at a time, and the next transaction of that connection may run in another session, which other
clients use in between. tuner needs a session per connection: its schema lock is a session advisory lock
taken and released in separate transactions (in a shared session it stays held by a session nobody owns,
and every later schema creation or upgrade waits for it up to the migration limit), the timeouts it gives
each new connection (`_apply_session_limits`) are session settings (they land on one server session,
which other clients then get, and tuner's own later transactions run without them), and psycopg 3 prepares
a statement run five times in the session ("prepared statement "_pg3_0" already exists" / "does not exist"
once the connection moves). Session pooling (`pool_mode = session`) gives each client connection its own
server session for as long as it is open, and works as a direct connection does.

How it is told: behind any proxy, the process id the driver got when it connected (PostgreSQL's
BackendKeyData, which a pooler makes up) differs from `pg_backend_pid()`; only then is the pooler tested.
Its first connection of a store's server notes its session, lets it go (a rollback), and a second
connection opened beside it asks for its own: a pooler that shares sessions hands it the session just let
go (PgBouncer reuses the most recently freed one), which session pooling never does while the first
connection is open. A shared session is refused with `StoreError` naming `pool_mode=session`, before the
connection sets anything. Once per server address and database in a process; a direct connection costs
one `SELECT pg_backend_pid()` per engine's first connection.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from ._engine import PG_CONNECT_TIMEOUT_S, StoreError

__all__ = ["POOL_MODE_FIX", "refuse_shared_sessions"]

log = logging.getLogger(__name__)

POOL_MODE_FIX = (
    "tuner needs a server session per connection (its schema lock, its timeouts and psycopg 3's prepared "
    "statements belong to the session): give tuner's database session pooling (PgBouncer: "
    "`pool_mode = session`, for instance in its own [databases] entry: `tunerdb = host=... dbname=... "
    "pool_mode=session`), or connect to PostgreSQL directly"
)
# Rounds of the test (each: the second connection's session, then the first's again): a fleet's other
# clients may take the freed session in between, which only hides a sharing pooler for that round.
_ROUNDS = 3
# (host, port, database) -> True: checked in this process (a direct connection, or a pooler that gives each
# connection its own session); a shared session is refused at each new connection, never cached
_checked: dict[tuple[Any, ...], bool] = {}
_lock = threading.Lock()


def _startup_pid(dbapi_conn: Any) -> int | None:
    """The server process id libpq got when the connection was made (`PQbackendPID`), or None."""
    get = getattr(dbapi_conn, "get_backend_pid", None)  # psycopg2; psycopg 3 has `info.backend_pid`
    pid = get() if callable(get) else getattr(getattr(dbapi_conn, "info", None), "backend_pid", None)
    return pid if isinstance(pid, int) else None


def _session_pid(dbapi_conn: Any) -> int:
    """`pg_backend_pid()` of the session that answers now; the transaction is rolled back (behind a
    transaction pooler, the session goes back to its pool)."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute("SELECT pg_backend_pid()")
        pid = int(cur.fetchone()[0])
    finally:
        cur.close()
    dbapi_conn.rollback()
    return pid


def refuse_shared_sessions(engine: Engine, where: str) -> None:
    """Give `engine` (PostgreSQL, psycopg2 or psycopg 3) the check of its new connections (module
    docstring), as the first of its `connect` listeners. `where`: the store, for the message."""
    key = (engine.url.host, engine.url.port, engine.url.database)
    eng_ref = weakref.ref(engine)

    def connect(dbapi_conn: Any, _record: Any) -> None:
        if _checked.get(key):
            return
        startup = _startup_pid(dbapi_conn)
        if startup is None:
            return
        pid = _session_pid(dbapi_conn)
        if pid == startup:  # no proxy in between
            with _lock:
                _checked[key] = True
            return
        eng = eng_ref()
        if eng is None:
            return
        cargs, cparams = eng.dialect.create_connect_args(eng.url)
        cparams.setdefault("connect_timeout", PG_CONNECT_TIMEOUT_S)
        try:
            other = eng.dialect.connect(*cargs, **cparams)  # a plain driver connection: no pool, no events
        except Exception as exc:  # noqa: BLE001 - the check is skipped, the connection stays usable
            log.debug("store %s: could not open a second connection to check the pooler: %s", where, exc)
            return
        try:
            for _ in range(_ROUNDS):
                try:
                    other_pid = _session_pid(other)
                except Exception as exc:  # noqa: BLE001 - (a full pool's wait) the check is skipped
                    log.debug("store %s: the pooler check's second connection failed: %s", where, exc)
                    return
                if other_pid != pid:
                    pid = _session_pid(dbapi_conn)
                if other_pid == pid:
                    dbapi_conn.close()
                    raise StoreError(
                        f"store {where}: a connection pooler between tuner and PostgreSQL shares server "
                        f"sessions between client connections (server process {pid} answered two of tuner's "
                        "open connections): transaction or statement pooling (PgBouncer's "
                        f"pool_mode=transaction), which tuner does not support. {POOL_MODE_FIX}; nothing "
                        "was written"
                    )
        finally:
            other.close()
        with _lock:
            _checked[key] = True

    event.listen(engine, "connect", connect, insert=True)
