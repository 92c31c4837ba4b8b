"""Helpers for tests that use the real PostgreSQL server on 127.0.0.1:5432 (trust auth).

Each caller gets a fresh database that is dropped afterwards. Where no server is reachable the test is
skipped with that reason, except under CI=true, where an unreachable server is a failure."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

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


def fresh_database(driver: str | None = None) -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it afterwards. `driver` (one of DRIVERS): the URL
    names that driver; None: the admin URL's (psycopg2 unless TUNER_TEST_PG_ADMIN says otherwise)."""
    from sqlalchemy import create_engine, text

    if driver is not None:
        _driver_or_skip(driver)
    _server_or_skip()
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
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
