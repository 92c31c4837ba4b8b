"""Giving back the space of removed rows (`ResultStore.vacuum`, `tuner cache prune --vacuum`)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ._engine import StoreError, migration_timeout_s, operation, set_statement_limit, sqlite_path

__all__ = ["Vacuumed", "vacuum"]

# The tables whose rows a prune removes.
_TABLES = ("tuner_cache_entries", "tuner_measurements")


@dataclass(frozen=True)
class Vacuumed:
    """What a VACUUM did: on SQLite the bytes of the database file (and its `-wal`) before and after; on
    PostgreSQL None for both (a plain VACUUM makes the space reusable inside the tables; it is not given
    back to the operating system)."""

    dialect: str
    bytes_before: int | None
    bytes_after: int | None


def _size(path: str | None) -> int | None:
    if path is None or path.startswith("file:"):
        return None
    total = 0
    for p in (path, path + "-wal"):
        with contextlib.suppress(OSError):
            total += os.path.getsize(p)
    return total


def vacuum(engine: Engine, url: str) -> Vacuumed:
    """VACUUM the database of `engine`, outside any transaction. SQLite: the whole file is rewritten
    (it needs free disk space about its size, and waits for other writers as any write does), then the
    WAL is checkpointed so that the file shrinks. PostgreSQL: `VACUUM (ANALYZE)` of the tables a prune
    removes rows from (autovacuum does the same on its own), with the migrations' statement limit."""
    dialect = engine.dialect.name
    with operation("vacuuming the store"):
        if dialect == "sqlite":
            path = sqlite_path(url)
            before = _size(path)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM"))
                conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
            return Vacuumed(dialect, before, _size(path))
        if dialect != "postgresql":
            raise StoreError(f"cannot VACUUM a {dialect} database: tuner knows SQLite's and PostgreSQL's")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            set_statement_limit(conn, migration_timeout_s())
            try:
                conn.execute(text(f"VACUUM (ANALYZE) {', '.join(_TABLES)}"))
            finally:
                set_statement_limit(conn, None)
    return Vacuumed(dialect, None, None)
