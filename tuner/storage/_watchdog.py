"""A client-side deadline on every call of a PostgreSQL connection that waits for the server.

`statement_timeout` is enforced by the server: a server that does not run at all never sends its error,
and libpq waits for ever. That is the case of a stopped backend (SIGSTOP, a debugger, a frozen VM or
container) whose host still answers TCP: the kernel acknowledges what the client sends and answers the
keepalive probes, so neither TCP keepalives nor `tcp_user_timeout` fire, and `conn.cancel()` does not help
either (the postmaster signals the stopped backend, which does not run to act on it).

What ends the wait is this process shutting the connection's socket down: libpq's wait then ends at once
with "server closed the connection unexpectedly". One watchdog thread per process does it for a call that
has waited `limit + margin` seconds (it looks every eighth of that), the limit being the connection's
statement timeout; the call then raises `Unanswered` (the driver's `OperationalError`), which the engine
turns into a `StoreTimeout`.

The mechanism (`Guarded`, `_call`, the watchdog) is the drivers'; each driver's connection class adds it:
`GuardedConnection` here for psycopg2, `_watchdog_pg3.GuardedPsycopg3Connection` for psycopg 3.

On the happy path a call costs a clock read, an attribute write and, when it returns, a lock taken to
clear that attribute: no round trip and no thread switch.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg2
import psycopg2.extensions

from ._engine import statement_timeout_option

__all__ = [
    "Guarded",
    "GuardedConnection",
    "Unanswered",
    "UnansweredCall",
    "deadline_s",
    "parse_duration_s",
    "set_limit",
]

log = logging.getLogger(__name__)

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(value: str) -> float | None:
    """A PostgreSQL time setting (`7s`, `1500`, `2min`; no unit: milliseconds) in seconds; None when it
    cannot be read."""
    m = re.fullmatch(r"\s*'?(\d+(?:\.\d+)?)\s*([a-z]*)'?\s*", value)
    if m is None or (m.group(2) or "ms") not in _UNITS:
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "ms"]


def deadline_s(limit_s: float) -> float:
    """How long a call may wait before its connection is cut: the statement timeout plus a margin for a
    server that is slow to send its own timeout error (half the limit, at least a second)."""
    return limit_s + max(1.0, limit_s / 2)


class UnansweredCall:
    """What an `Unanswered` error of any driver says: the server did not answer a call within
    `deadline_s(limit)`; its connection was closed. `during`: "commit" (whether it took effect is unknown),
    "rollback" or "statement"; `waited_s`, `limit_s`."""

    tuner_unanswered = True
    during = "statement"
    waited_s = 0.0
    limit_s = 0.0


class Unanswered(UnansweredCall, psycopg2.OperationalError):
    """An unanswered call of a psycopg2 connection (a psycopg2 `OperationalError`)."""


class Guarded:
    """The client-side deadline of one connection, mixed into a driver's connection class, which says
    what its driver raises (`tuner_errors`) and how an unanswered call is raised (`tuner_unanswered_error`),
    and calls `_tuner_guard` with its libpq `options` once connected."""

    tuner_errors: ClassVar[type[Exception]]  # the driver's base class of errors
    tuner_unanswered_error: ClassVar[type[Exception]]  # an `UnansweredCall` and the driver's OperationalError
    tuner_limit_s: float  # the deadline's statement timeout; 0: none
    tuner_own_limit_s: float  # the one it connected with
    tuner_since: float | None  # when the call in progress began
    tuner_cut: bool  # the watchdog closed the connection
    tuner_lock: threading.Lock
    closed: Any  # the driver's

    if TYPE_CHECKING:

        def fileno(self) -> int: ...  # the driver's: the connection's socket

    def _tuner_guard(self, options: str | None) -> None:
        found = statement_timeout_option(options)
        self.tuner_limit_s = self.tuner_own_limit_s = (
            (parse_duration_s(found) or 0.0) if found is not None else 0.0
        )
        self.tuner_since = None
        self.tuner_cut = False
        self.tuner_lock = threading.Lock()
        _watchdog.register(self)


class _Watchdog:
    """One thread per process that looks at the connections in a call every few seconds (an eighth of the
    shortest deadline) and cuts those whose call has waited past its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: weakref.WeakSet[Guarded] = weakref.WeakSet()
        self._wake = threading.Event()
        self._started = False

    def register(self, conn: Guarded) -> None:
        with self._lock:
            self._conns.add(conn)
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="tuner-pg-watchdog", daemon=True).start()
        self._wake.set()

    def look_again(self) -> None:
        """Look at the connections now: one's limit changed, and its deadline may come before the next
        look, which was set by the shortest limit then (a migration's 600 s: 112 s later)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                conns = list(self._conns)
            limits = [c.tuner_limit_s for c in conns if c.tuner_limit_s and not c.closed]
            if not limits:
                self._wake.wait()  # until the next connection
                self._wake.clear()
                continue
            self._wake.wait(max(0.05, deadline_s(min(limits)) / 8))
            self._wake.clear()
            now = time.monotonic()
            for c in conns:
                since = c.tuner_since
                if since is not None and c.tuner_limit_s and now - since >= deadline_s(c.tuner_limit_s):
                    with c.tuner_lock:  # the call is still inside (it leaves under this lock): its descriptor
                        if c.tuner_since == since:  # is still its own
                            c.tuner_cut = True
                            _shut_down(c)
            del conns


def _shut_down(conn: Guarded) -> None:
    log.warning("the PostgreSQL server did not answer a call in time; closing its connection")
    try:
        sock = socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate descriptor
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
    except (OSError, conn.tuner_errors) as exc:  # closed meanwhile
        log.debug("closing an unanswered connection: %s", exc)


_watchdog = _Watchdog()


def _after_fork() -> None:  # the thread did not come along, and its lock may have been held at the fork
    global _watchdog
    _watchdog = _Watchdog()


os.register_at_fork(after_in_child=_after_fork)


def _call(conn: Guarded, during: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), watched: an attribute set before and cleared after (under the connection's
    lock). A call inside another watched call of the connection (psycopg 3's commit waits through the
    connection's `wait`) is the outer call's."""
    if not conn.tuner_limit_s or conn.tuner_since is not None:
        return fn(*args, **kwargs)
    conn.tuner_since = time.monotonic()
    try:
        return fn(*args, **kwargs)
    except conn.tuner_errors as exc:
        if not conn.tuner_cut:
            raise
        seconds = deadline_s(conn.tuner_limit_s)
        err: Any = conn.tuner_unanswered_error(
            f"no answer from the server within {seconds:g} s (its statement timeout, "
            f"{conn.tuner_limit_s:g} s, plus a margin): the server does not run (a stopped or frozen server "
            "or host); the connection was closed"
        )
        err.during, err.waited_s, err.limit_s = during, seconds, conn.tuner_limit_s
        raise err from exc
    finally:
        with conn.tuner_lock:
            conn.tuner_since = None


class _GuardedCursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, vars: Any = None) -> Any:
        return _call(self.connection, "statement", super().execute, query, vars)

    def executemany(self, query: Any, vars_list: Any) -> Any:
        return _call(self.connection, "statement", super().executemany, query, vars_list)


class GuardedConnection(Guarded, psycopg2.extensions.connection):
    """psycopg2's `connection_factory` of tuner's PostgreSQL engines: every call that waits for the
    server (a statement, a commit, a rollback) is cut off after `deadline_s` of the statement timeout the
    connection asked for (`-c statement_timeout=...` in its options); none without one."""

    tuner_errors = psycopg2.Error
    tuner_unanswered_error = Unanswered

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = _GuardedCursor
        self._tuner_guard(self.get_dsn_parameters().get("options"))

    def commit(self) -> None:
        _call(self, "commit", super().commit)

    def rollback(self) -> None:
        _call(self, "rollback", super().rollback)


def set_limit(dbapi_conn: Any, limit_s: float | None) -> None:
    """Give one connection another statement timeout (after `SET statement_timeout` on it); None: the
    one it connected with."""
    if isinstance(dbapi_conn, Guarded):
        dbapi_conn.tuner_limit_s = dbapi_conn.tuner_own_limit_s if limit_s is None else limit_s
        _watchdog.look_again()
