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
        encoding="utf-8",
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


def _waited_for_tuner_holder(url: str, notice: _Notice, linger: float = 0) -> tuple[str, int]:
    """`_open_while_held` while a tuner process holds the lock of `url`, `linger` seconds more after the
    warning: (the one warning, the holder's pid)."""
    import time

    from tuner.storage import engine_for

    holder = _tuner_holder(url)

    def release() -> None:
        time.sleep(linger)
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


# --- a DBA's lock_timeout on the database -----------------------------------------------------------------


def _lock_timeout(url: str, value: str) -> None:
    """`ALTER DATABASE ... SET lock_timeout` on `url`'s database (its new sessions get it)."""
    from .pg import _admin_or_skip

    admin = _admin_or_skip(None)
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET lock_timeout = '{value}'")
    finally:
        admin.dispose()


def test_a_databases_lock_timeout_does_not_cut_the_wait_for_the_schema_lock(
    pg_url: str, notice: _Notice
) -> None:
    """Was: with the database's lock_timeout (1 ms here; a DBA's guard for DDL, often a few seconds) the
    wait for the schema lock failed with StoreTimeout as soon as it waited on the server, saying it "gave
    up after 600 s (the migration limit)": processes of a fleet that started together on a fresh store
    failed. The wait for tuner's own advisory lock (no session queues behind it) keeps the migration
    limit; the holder here waits well past the database's lock_timeout before it lets go."""
    _lock_timeout(pg_url, "1ms")
    # 500 times the lock_timeout after the warning (then the process waits on the server): it would be cut
    _waited_for_tuner_holder(pg_url, notice, linger=0.5)


def test_a_write_cut_by_the_databases_lock_timeout_names_it_not_tuners_limit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: "gave up after 60 s (TUNER_PG_TIMEOUT; default 60): no answer within lock_timeout", when the
    database's lock_timeout (200 ms) ended the wait for a table another session had locked."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from tuner.storage import StoreTimeout, engine_for
    from tuner.store import ResultStore, TaskContext

    store = ResultStore(pg_url)
    task = TaskContext(kernel="k")
    store.record(task, "fp", {"a": 1}, 1.0, "ok")
    _lock_timeout(pg_url, "200ms")
    engine_for(pg_url).dispose()  # new sessions: the database's setting
    other = create_engine(pg_url, poolclass=NullPool)
    conn = other.connect()
    try:
        conn.execute(text("LOCK TABLE tuner_measurements IN ACCESS EXCLUSIVE MODE"))
        with pytest.raises(StoreTimeout) as err:
            store.record(task, "fp", {"a": 2}, 2.0, "ok")
    finally:
        conn.close()
        other.dispose()
    msg = str(err.value)
    assert "recording a measurement of k" in msg and "past the server's lock_timeout" in msg, msg
    assert "TUNER_PG_TIMEOUT" not in msg and "gave up after" not in msg, msg
    store.record(task, "fp", {"a": 3}, 3.0, "ok")  # the lock gone, the store works again
    assert sorted(m.value for m in store.measurements()) == [1.0, 3.0]
    engine_for(pg_url).dispose()
