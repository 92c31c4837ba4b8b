"""Helpers for tests that use the real PostgreSQL server on 127.0.0.1:5432 (trust auth).

Each caller gets a fresh database that is dropped afterwards. Where no server is reachable the test is
skipped with that reason, except under CI=true, where an unreachable server is a failure."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

ADMIN_URL = os.environ.get("TUNER_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


def _server_or_skip() -> None:
    from sqlalchemy import create_engine, text

    try:
        eng = create_engine(ADMIN_URL, connect_args={"connect_timeout": 3})
        with eng.connect() as c:
            c.execute(text("select 1"))
        eng.dispose()
    except Exception as exc:
        msg = f"PostgreSQL not reachable at {ADMIN_URL.split('@')[-1]}: {exc.__class__.__name__}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: the server must be up)")
        pytest.skip(msg)


DRIVERS = ("psycopg2", "psycopg")  # tuner's own dependency, and psycopg 3 (in the dev extra)


def _driver_or_skip(driver: str) -> None:
    import importlib.util

    if importlib.util.find_spec(driver) is None:
        msg = f"the PostgreSQL driver {driver} is not installed (the dev extra has it)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: it must be)")
        pytest.skip(msg)


def _admin_or_skip(driver: str | None) -> Engine:
    """The admin engine (autocommit), or the test skipped: `driver` not installed, no server."""
    from sqlalchemy import create_engine

    if driver is not None:
        _driver_or_skip(driver)
    _server_or_skip()
    return create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")


def sqlite_or_postgres(kind: str, sqlite_file: Path) -> Iterator[str]:
    """The store URL of a test parametrised over both databases: the SQLite file `sqlite_file` for
    "sqlite", else a fresh PostgreSQL database (`fresh_database`)."""
    if kind == "sqlite":
        yield f"sqlite:///{sqlite_file}"
    else:
        yield from fresh_database()


def fresh_database(driver: str | None = None) -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it afterwards. `driver` (one of DRIVERS): the URL
    names that driver; None: the admin URL's (psycopg2 unless TUNER_TEST_PG_ADMIN says otherwise)."""
    from sqlalchemy import text

    admin = _admin_or_skip(driver)
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        yield url if driver is None else f"postgresql+{driver}://" + url.split("://", 1)[1]
    finally:
        with admin.connect() as c:
            c.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"
                ),
                {"n": name},
            )
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


class LimitedDatabase:
    """A fresh database owned by a fresh role that is not a superuser (a superuser is exempt from every
    connection limit but the server's reserved slots), so that its connection limits hold: `url` connects
    as that role; `limit_role(n)` / `limit_database(n)` set `CONNECTION LIMIT n` (-1: none) without a
    restart; `sessions()` counts the role's sessions on the server."""

    def __init__(self, url: str, role: str, database: str, admin: Engine) -> None:
        self.url, self.role, self.database, self._admin = url, role, database, admin

    def _run(self, sql: str) -> int | None:
        from sqlalchemy import text

        with self._admin.connect() as c:
            result = c.execute(text(sql), {"r": self.role})
            return result.scalar() if result.returns_rows else None

    def limit_role(self, n: int) -> None:
        self._run(f'ALTER ROLE "{self.role}" CONNECTION LIMIT {int(n)}')

    def limit_database(self, n: int) -> None:
        self._run(f'ALTER DATABASE "{self.database}" CONNECTION LIMIT {int(n)}')

    def sessions(self) -> int:
        return int(self._run("SELECT count(*) FROM pg_stat_activity WHERE usename = :r") or 0)


def limited_database(driver: str | None = None) -> Iterator[LimitedDatabase]:
    """Yield a `LimitedDatabase` (unique role and database names, so tests run in parallel); drop both
    afterwards, ending the role's sessions first."""
    from sqlalchemy import text

    admin = _admin_or_skip(driver)
    name = f"tuner_lim_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE ROLE "{name}" LOGIN'))
        c.execute(text(f'CREATE DATABASE "{name}" OWNER "{name}"'))
    try:
        scheme, rest = ADMIN_URL.split("://", 1)
        host = rest.split("@", 1)[1].rsplit("/", 1)[0]
        scheme = scheme if driver is None else f"postgresql+{driver}"
        yield LimitedDatabase(f"{scheme}://{name}@{host}/{name}", name, name, admin)
    finally:
        with admin.connect() as c:
            c.execute(text(f'ALTER ROLE "{name}" CONNECTION LIMIT 0'))  # no new session meanwhile
            c.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": name}
            )
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            c.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
        admin.dispose()
