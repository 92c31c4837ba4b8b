"""Every table of tuner, on one `MetaData`, under one schema version.

The tables are created and changed only by the migrations in `tuner/storage/migrations/versions/`
(Alembic; `ensure_schema` runs them). A change here needs a new migration that makes it, and
`SCHEMA_REVISION` / `SCHEMA_VERSION` moved to it.

- `tuner_meta`: key/value; `schema_version` is kept for the releases before migrations, which refuse a
  store whose version is newer than theirs.
- `tuner_measurements`: every measurement with its task context (`tuner.store`).
- `tuner_cache_entries`, `tuner_cache_claims`: the runtime config cache and the claims that let one
  process tune a key while the others wait (`tuner.runtime._db`).
- `tuner_study_tasks`: the study task board (`tuner.studies._board`).
- `tuner_alembic_version`: the migration revision (Optuna's own tables keep theirs in `alembic_version`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMA_REVISION",
    "VERSION_TABLE",
    "Base",
    "Meta",
    "MeasurementRow",
    "CacheEntryRow",
    "CacheClaimRow",
    "tasks_table",
    "key_hashes",
]

SCHEMA_VERSION = 2
SCHEMA_REVISION = "0002"  # the head of migrations/versions (a test checks it)
VERSION_TABLE = "tuner_alembic_version"


class Base(DeclarativeBase):
    metadata = MetaData()


class Meta(Base):
    __tablename__ = "tuner_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class MeasurementRow(Base):
    __tablename__ = "tuner_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(40), index=True)
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    space_fingerprint: Mapped[str] = mapped_column(String(40), index=True)
    problem: Mapped[dict] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(40), default="")
    device: Mapped[str] = mapped_column(String(200), index=True)
    versions: Mapped[dict] = mapped_column(JSON)
    config: Mapped[dict] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(Text)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(40))
    stats: Mapped[dict] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    study_name: Mapped[str | None] = mapped_column(String(300), nullable=True, index=True)
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    strategy: Mapped[str | None] = mapped_column(String(60), nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))

    # The bounded prior of a miss reads the newest measurements of one kernel (schema 2).
    __table_args__ = (Index("ix_tuner_measurements_kernel_id", "kernel", "id"),)


class CacheEntryRow(Base):
    __tablename__ = "tuner_cache_entries"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    key_fields: Mapped[dict] = mapped_column(JSON)
    dtypes: Mapped[list] = mapped_column(JSON)
    device: Mapped[str] = mapped_column(String(200))
    versions: Mapped[dict] = mapped_column(JSON)
    config: Mapped[dict] = mapped_column(JSON)
    time_s: Mapped[float] = mapped_column(Float)
    spread_s: Mapped[float] = mapped_column(Float)
    date: Mapped[str] = mapped_column(String(40))
    space: Mapped[str] = mapped_column(String(200))
    # schema 2: indexed lookups for a miss (see `key_hashes`)
    fields_hash: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    family_hash: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)


class CacheClaimRow(Base):
    __tablename__ = "tuner_cache_claims"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)
    # schema 2: the live owner (a claim whose process is gone is taken over at once on its host)
    host: Mapped[str | None] = mapped_column(String(200), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)


PENDING = "pending"

tasks_table = Table(
    "tuner_study_tasks",
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study", String(100), nullable=False, index=True),
    Column("key", String(500), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("status", String(16), nullable=False, default=PENDING),
    Column("worker", String(200), nullable=True),
    Column("lease_token", String(40), nullable=True),
    Column("lease_expires_at", Float, nullable=True),
    Column("heartbeat_at", Float, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("trials_done", Integer, nullable=False, default=0),
    Column("best_value", Float, nullable=True),
    Column("best_config", JSON, nullable=True),
    Column("spent_s", Float, nullable=False, default=0.0),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("error", Text, nullable=True),
    Column("result", JSON, nullable=True),
    UniqueConstraint("study", "key", name="uq_tuner_study_task"),
)


def _h(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def key_hashes(
    kernel: str,
    source_hash: str,
    key_fields: Mapping[str, Any],
    dtypes: Iterable[str],
    device: str,
    versions: Mapping[str, Any],
) -> tuple[str, str]:
    """(fields_hash, family_hash) of a cache key.

    - fields_hash: the kernel and its key fields; entries that share it differ only in source, dtypes,
      device or versions (what a miss reports as "stale or foreign").
    - family_hash: everything but the values of the numeric key fields; entries that share it may stand
      in for each other in offline mode (nearest shape), as `CacheKey.family()` says.
    """
    fields = sorted(key_fields.items())
    fixed = [[k, v] for k, v in fields if not _numeric(v)]
    names = [k for k, _ in fields]
    fields_hash = _h({"k": kernel, "f": [[k, v] for k, v in fields]})
    family_hash = _h(
        {
            "k": kernel,
            "s": source_hash,
            "n": names,
            "x": fixed,
            "t": list(dtypes),
            "d": device,
            "v": sorted(versions.items()),
        }
    )
    return fields_hash, family_hash
