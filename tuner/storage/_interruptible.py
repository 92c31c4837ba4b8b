"""Ctrl-C while the `tuner` command waits for the PostgreSQL server, with psycopg2.

psycopg2 waits for the server inside libpq, which retries its wait when a signal interrupts it: Python's
SIGINT handler never runs, and a command that waited for a lock (another process's schema migration, a
row another transaction holds) ignored Ctrl-C for as long as the wait lasted (up to the migration limit,
600 s). psycopg 3 waits in Python and cancels the statement on Ctrl-C itself.

While the command runs (`tuner._interrupt.command_running`), the first psycopg2 engine it makes sets
psycopg2's wait callback (`psycopg2.extensions.set_wait_callback`) to `wait`, which waits in Python: on
Ctrl-C it asks the server to cancel the statement, waits for the end of it (at most `CANCEL_WAIT_S`; a
second Ctrl-C ends the wait at once) and raises the KeyboardInterrupt, which the command turns into
`tuner: interrupted` and exit 130. The callback is global to the process, so it is only set in the command's
process, only when the program set none of its own, and the previous (none) is back when the command
ends: a program that imports tuner and calls its functions keeps psycopg2 as it had it.

libpq enforces `connect_timeout` only when it waits itself: `wait` enforces it while a connection is made.
"""

from __future__ import annotations

import contextlib
import re
import select
import threading
import time
from typing import Any

from tuner import _interrupt

__all__ = ["CANCEL_WAIT_S", "install_in_command", "wait"]

# After Ctrl-C, how long the statement's end (the server's answer to the cancel) is waited for before the
# connection is given up (closed): a server that does not answer does not hold the interrupt up.
CANCEL_WAIT_S = 5.0
_CONNECTED = (1, 2, 5)  # psycopg2's STATUS_READY, STATUS_BEGIN, STATUS_PREPARED: not making the connection
_CONNECT_TIMEOUT = re.compile(r"(?:^|\s)connect_timeout\s*=\s*'?(\d+)")
_lock = threading.Lock()


def _connect_timeout_s(conn: Any) -> float | None:
    """libpq's `connect_timeout` of the connection's DSN (as libpq reads it: under 2 s is 2 s), None: none."""
    m = _CONNECT_TIMEOUT.search(getattr(conn, "dsn", "") or "")
    if m is None or int(m.group(1)) <= 0:
        return None
    return float(max(2, int(m.group(1))))


def _wait_for(fd: int, write: bool, timeout_s: float | None) -> None:
    """Until `fd` can be read (written), at most `timeout_s` (None: no limit). poll(), not select(): a
    descriptor past FD_SETSIZE (a process with many files open) is fine."""
    if hasattr(select, "poll"):
        p = select.poll()
        p.register(fd, select.POLLOUT if write else select.POLLIN)
        p.poll(None if timeout_s is None else max(0, int(timeout_s * 1000) + 1))
    else:  # pragma: no cover - Windows
        select.select([], [fd], [], timeout_s) if write else select.select([fd], [], [], timeout_s)


def wait(conn: Any) -> None:
    """psycopg2's wait callback: wait for the call of `conn` in progress (a connection being made, a
    statement, a commit) to end, interruptibly (see the module)."""
    import psycopg2
    import psycopg2.extensions as ext

    interrupted: KeyboardInterrupt | None = None
    deadline: float | None = None
    if conn.status not in _CONNECTED:
        limit = _connect_timeout_s(conn)
        deadline = None if limit is None else time.monotonic() + limit
    while True:
        try:
            state = conn.poll()
            if state == ext.POLL_OK:
                break
            if state not in (ext.POLL_READ, ext.POLL_WRITE):
                raise psycopg2.OperationalError(f"bad state from poll: {state}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if interrupted is not None:
                    raise interrupted
                raise psycopg2.OperationalError("timeout expired")  # what libpq says itself
            _wait_for(conn.fileno(), state == ext.POLL_WRITE, left)
        except KeyboardInterrupt as exc:
            if interrupted is not None or conn.status not in _CONNECTED:
                raise  # a second Ctrl-C, or no statement to cancel: at once
            interrupted = exc
            with contextlib.suppress(psycopg2.Error):
                conn.cancel()
            deadline = time.monotonic() + CANCEL_WAIT_S
        except psycopg2.Error:
            if interrupted is not None:  # the cancelled statement's error: the interrupt is what happened
                raise interrupted from None
            raise
    if interrupted is not None:  # the statement ended before the cancel reached it
        raise interrupted


_installed = False


def install_in_command() -> None:
    """Set psycopg2's wait callback to `wait` while the `tuner` command runs in this process (not in a
    program that calls tuner's functions), unless the program set one itself; the command's end puts
    none back."""
    global _installed
    if not _interrupt.in_command():
        return
    import psycopg2.extensions as ext

    with _lock:
        if _installed or ext.get_wait_callback() is not None:
            return
        ext.set_wait_callback(wait)
        _installed = True
    _interrupt.at_command_end(_uninstall)


def _uninstall() -> None:
    global _installed
    import psycopg2.extensions as ext

    with _lock:
        if _installed and ext.get_wait_callback() is wait:
            ext.set_wait_callback(None)
        _installed = False
