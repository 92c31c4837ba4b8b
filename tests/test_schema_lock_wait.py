"""A process that must create or upgrade a store's schema while another one holds the schema lock says so,
once, naming the holder, instead of waiting in silence (up to the migration limit, 600 s, on PostgreSQL;
SQLite's busy timeout, 60 s, on a lock file). Was: nothing at all was logged, and a fleet of workers that
waited on a stuck holder (a session left idle in a transaction, a process stopped in a debugger) looked
hung with no hint of why. Real PostgreSQL server, real SQLite lock file, real holder processes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._env import repo_pythonpath

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock, POSIX processes")

# A tuner process that takes the store's schema lock and keeps it until its stdin is closed.
_HOLDER = """
import sys
from tuner.storage import engine_for, schema_lock
with schema_lock(engine_for(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.read()
"""


class _Notice(logging.Handler):
    """Collects the warnings of the schema lock's module; `seen` is set at the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.set()


@pytest.fixture
def notice(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Notice]:
    from tuner.storage import _migrate

    monkeypatch.setattr(_migrate, "SCHEMA_LOCK_NOTICE_S", 0.2, raising=False)
    handler = _Notice()
    logger = logging.getLogger(_migrate.__name__)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _tuner_holder(url: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": repo_pythonpath()},
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def _open_while_held(url: str, notice: _Notice, release: Callable[[], None]) -> None:
    """Make the schema of `url` in a thread while the lock is held; once the wait is logged, `release()`
    the lock; the schema is then made. A failure (not a hang) where nothing is logged within 30 s."""
    from tuner.storage import engine_for, ensure_schema

    got: dict[str, BaseException] = {}

    def run() -> None:
        try:
            ensure_schema(engine_for(url))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert notice.seen.wait(30), "the wait for the schema lock was not logged"
    finally:
        release()
        thread.join(120)
    assert not thread.is_alive() and "error" not in got, got
    assert len(notice.messages) == 1, notice.messages  # once, not at every poll


def _waited_for_tuner_holder(url: str, notice: _Notice) -> tuple[str, int]:
    """`_open_while_held` while a tuner process holds the lock of `url`: (the one warning, its pid)."""
    from tuner.storage import engine_for

    holder = _tuner_holder(url)

    def release() -> None:
        holder.communicate("", timeout=60)  # its stdin closed: it lets go of the lock and exits

    try:
        _open_while_held(url, notice, release)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
        engine_for(url).dispose()
    (msg,) = notice.messages
    return msg, holder.pid


@pytest.fixture
def pg_url() -> Iterator[str]:
    from .pg import fresh_database

    yield from fresh_database()


def test_a_wait_for_a_tuner_process_holding_the_pg_schema_lock_names_its_pid_and_host(
    pg_url: str, notice: _Notice
) -> None:
    from tuner.storage._owner import HOST

    msg, pid = _waited_for_tuner_holder(pg_url, notice)
    assert f"held by tuner pid {pid} on host {HOST}" in msg, msg
    assert "waiting for its schema lock" in msg and "600 s (the migration limit)" in msg, msg


def test_a_wait_for_another_programs_pg_session_names_its_server_process(
    pg_url: str, notice: _Notice
) -> None:
    """A session of another program (a DBA's psql left in a transaction) holds the lock: the warning names
    its server process, application_name and state, and how to end it."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from tuner.storage import engine_for
    from tuner.storage._migrate import _PG_LOCK_KEY

    other = create_engine(pg_url + "?application_name=dba-psql", poolclass=NullPool)
    conn = other.connect()
    try:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()  # its transaction stays open

        def release() -> None:
            conn.close()

        _open_while_held(pg_url, notice, release)
    finally:
        conn.close()
        other.dispose()
        engine_for(pg_url).dispose()
    (msg,) = notice.messages
    assert f"held by server process {pid} (application_name 'dba-psql'" in msg, msg
    assert "state 'idle in transaction'" in msg and f"pg_terminate_backend({pid})" in msg, msg


def test_a_wait_for_a_tuner_process_holding_the_sqlite_lock_file_names_it(
    tmp_path: Path, notice: _Notice
) -> None:
    from tuner.storage._owner import HOST

    msg, pid = _waited_for_tuner_holder(f"sqlite:///{tmp_path / 'tuner.db'}", notice)
    assert f"held by pid {pid} on host {HOST}" in msg and "tuner.db.lock" in msg, msg
    # released: the holder's name is gone from the file, not read as the next holder's
    assert (tmp_path / "tuner.db.lock").read_bytes() == b""
