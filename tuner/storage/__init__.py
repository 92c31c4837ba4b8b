"""tuner's storage layer: one engine factory, one schema (every table, one version), migrations.

- `engine_for(url)`: the engine of this process for a database URL (SQLite file or PostgreSQL).
- `ensure_schema(engine)`: create or migrate tuner's tables (Alembic, scripts in `migrations/`), safe when
  many processes start at once on a fresh database; `check_schema(engine)` for a store opened read-only
  (`read_only_url(url)`: a SQLite file in a folder that cannot be written), which is read, never migrated;
  the rows only in its `-wal` (a writer killed before a checkpoint) are read too (`_read_only`).
- `guarding(url, study_name, check)`: while a study worker runs a task, the measurements of its study are
  written only while `check` finds the worker's lease held (`LeaseLost` otherwise; `_fence`).
- `optuna_storage(url)`: Optuna's RDBStorage on the same database, created under the same lock; on
  PostgreSQL one per URL and process, shared (`close_idle_connections(url)` closes what its pool and
  `engine_for(url)`'s hold idle).
- On PostgreSQL every connection has a statement timeout (`TUNER_PG_TIMEOUT`, `pg_timeout_s()`); a statement
  that runs past it raises `StoreTimeout`, naming the store, the `operation(...)` and the limit; one whose
  connection the server ends (a restart, `pg_terminate_backend`) raises `StoreConnectionLost`; a connection
  that cannot be made (a server down, a wrong host, port or database) raises `StoreUnreachable`, one the
  server refuses for a connection limit `StoreConnectionLimit` after `TUNER_PG_CONNECT_WAIT` seconds of
  trying again (`pg_connect_wait_s()`). Each engine keeps `TUNER_PG_POOL_SIZE` connections (`pg_pool_size()`)
  and opens as many more at peaks; a process has two per PostgreSQL store (`engine_for(url)` and the one
  Optuna storage `optuna_storage(url)` shares).
- On SQLite a fault of the file or the disk (corrupt, not a database, disk full, read-only, I/O error)
  raises `StoreError` naming the file and what to do (`StoreCorrupt` for a damaged file); a lock held past
  the busy timeout stays SQLAlchemy's `OperationalError` ("database is locked"), which callers retry; the
  schema lock file held past it by another process raises `StoreTimeout` naming it. A
  write into a SQLite file deleted or replaced while the process has it open (SQLite would write into the
  deleted file) raises `StoreError` naming it before it commits, and no new file is made at the path
  (`_replaced`); disposing of `engine_for(url)`'s engine opens the path again. A new SQLite file whose
  store could not be created (a full disk) is removed again while still empty (`NewFile`), its `-wal` and
  `-shm` never.
- `vacuum(engine, url)`: VACUUM outside a transaction, to give back the space of removed rows (SQLite:
  the file shrinks; PostgreSQL: the space is reused, as autovacuum would make it).
"""

from __future__ import annotations

from ._engine import (
    PG_CONNECT_WAIT_S,
    PG_POOL_SIZE,
    PG_TIMEOUT_S,
    StoreConnectionLimit,
    StoreConnectionLost,
    StoreCorrupt,
    StoreError,
    StoreTimeout,
    StoreUnreachable,
    disk_full_in,
    engine_for,
    engine_kwargs,
    engine_of,
    immutable_url,
    locked_read_only_url,
    make_engine,
    mask_password,
    mask_query_secrets,
    missing_sqlite_file,
    normalize_url,
    operation,
    pg_connect_wait_s,
    pg_pool_size,
    pg_timeout_s,
    read_only_url,
    redact,
    sqlite_path,
    sqlite_url,
)
from ._fence import LeaseLost, WriteGuard, guard_for, guarding
from ._migrate import (
    StoreOutdated,
    check_schema,
    close_idle_connections,
    ensure_schema,
    no_store_at,
    only_reading,
    optuna_storage,
    schema_lock,
    schema_revision,
)
from ._new_file import NewFile
from ._schema import SCHEMA_REVISION, SCHEMA_VERSION, VERSION_TABLE
from ._vacuum import Vacuumed, vacuum

__all__ = [
    "PG_CONNECT_WAIT_S",
    "PG_POOL_SIZE",
    "PG_TIMEOUT_S",
    "SCHEMA_REVISION",
    "SCHEMA_VERSION",
    "VERSION_TABLE",
    "StoreConnectionLimit",
    "StoreConnectionLost",
    "StoreCorrupt",
    "StoreOutdated",
    "Vacuumed",
    "WriteGuard",
    "LeaseLost",
    "NewFile",
    "StoreError",
    "StoreTimeout",
    "StoreUnreachable",
    "check_schema",
    "close_idle_connections",
    "disk_full_in",
    "engine_for",
    "engine_kwargs",
    "engine_of",
    "immutable_url",
    "locked_read_only_url",
    "ensure_schema",
    "guard_for",
    "guarding",
    "make_engine",
    "normalize_url",
    "operation",
    "no_store_at",
    "only_reading",
    "optuna_storage",
    "pg_connect_wait_s",
    "pg_pool_size",
    "pg_timeout_s",
    "read_only_url",
    "mask_password",
    "mask_query_secrets",
    "redact",
    "schema_lock",
    "schema_revision",
    "missing_sqlite_file",
    "sqlite_path",
    "sqlite_url",
    "vacuum",
]
