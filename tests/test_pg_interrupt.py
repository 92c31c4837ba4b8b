"""Ctrl-C under a PostgreSQL statement is an interrupt, not a lost connection. SQLAlchemy throws the
connection of an interrupted statement away as a disconnect, and tuner's error hook read that as the
server ending the connection: `StoreConnectionLost` ("the server ended the connection"), so a Ctrl-C while
`tuner study run` opened its store (creating the schemas takes seconds) exited 1 with that line instead
of 130 with `tuner: interrupted`. Real server, real SIGINT, both drivers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests._env import repo_pythonpath

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

_CHILD = """
import sys
from sqlalchemy import text
from tuner.storage import engine_for
eng = engine_for(sys.argv[1])
with eng.connect() as c:
    c.execute(text("SELECT 1"))
    print("go", flush=True)
    try:
        c.execute(text("SELECT pg_sleep(2), 'tuner-interrupted-statement'::text"))
        print("returned")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


@pytest.fixture(params=["psycopg2", "psycopg"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    from .pg import fresh_database

    yield from fresh_database(request.param)


def test_ctrl_c_under_a_statement_is_an_interrupt(url: str) -> None:
    from sqlalchemy import create_engine, text

    db = url.rsplit("/", 1)[1]
    watcher = create_engine(url)
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": repo_pythonpath()},
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "go\n"
        running = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND state = 'active' "
            "AND query LIKE '%tuner-interrupted-%' AND pid <> pg_backend_pid()"
        )
        while True:  # the child waits for the server's answer now
            with watcher.connect() as c:
                if c.execute(running, {"d": db}).scalar():
                    break
            assert p.poll() is None, p.communicate()
            time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        watcher.dispose()
    assert out.strip() == "KeyboardInterrupt", (out, err[-2000:])
