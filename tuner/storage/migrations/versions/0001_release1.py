"""The schema of the first release (schema version 1), as it was before migrations existed.

A store written by that release already has (some of) these tables and no version table: they are
created only where missing, so an old store, a store that holds only a study board, and an empty
database all arrive at the same revision.

Revision ID: 0001
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _release1() -> tuple[MetaData, Table]:
    md = MetaData()
    meta = Table(
        "tuner_meta", md, Column("key", String(64), primary_key=True), Column("value", Text, nullable=False)
    )
    Table(
        "tuner_measurements",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("task_id", String(40), index=True, nullable=False),
        Column("kernel", String(200), index=True, nullable=False),
        Column("space_fingerprint", String(40), index=True, nullable=False),
        Column("problem", JSON, nullable=False),
        Column("dtype", String(40), nullable=False),
        Column("device", String(200), index=True, nullable=False),
        Column("versions", JSON, nullable=False),
        Column("config", JSON, nullable=False),
        Column("config_key", Text, nullable=False),
        Column("value", Float, nullable=True),
        Column("status", String(40), nullable=False),
        Column("stats", JSON, nullable=False),
        Column("error", Text, nullable=True),
        Column("study_name", String(300), nullable=True, index=True),
        Column("trial_number", Integer, nullable=True),
        Column("strategy", String(60), nullable=True),
        Column("worker", String(200), nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
    )
    Table(
        "tuner_cache_entries",
        md,
        Column("key_hash", String(64), primary_key=True),
        Column("kernel", String(200), index=True, nullable=False),
        Column("source_hash", String(64), nullable=False),
        Column("key_fields", JSON, nullable=False),
        Column("dtypes", JSON, nullable=False),
        Column("device", String(200), nullable=False),
        Column("versions", JSON, nullable=False),
        Column("config", JSON, nullable=False),
        Column("time_s", Float, nullable=False),
        Column("spread_s", Float, nullable=False),
        Column("date", String(40), nullable=False),
        Column("space", String(200), nullable=False),
    )
    Table(
        "tuner_cache_claims",
        md,
        Column("key_hash", String(64), primary_key=True),
        Column("owner", String(200), nullable=False),
        Column("expires_at", Float, nullable=False),
    )
    Table(
        "tuner_study_tasks",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("study", String(100), nullable=False, index=True),
        Column("key", String(500), nullable=False),
        Column("seq", Integer, nullable=False),
        Column("spec", JSON, nullable=False),
        Column("status", String(16), nullable=False),
        Column("worker", String(200), nullable=True),
        Column("lease_token", String(40), nullable=True),
        Column("lease_expires_at", Float, nullable=True),
        Column("heartbeat_at", Float, nullable=True),
        Column("attempts", Integer, nullable=False),
        Column("trials_done", Integer, nullable=False),
        Column("best_value", Float, nullable=True),
        Column("best_config", JSON, nullable=True),
        Column("spent_s", Float, nullable=False),
        Column("started_at", Float, nullable=True),
        Column("finished_at", Float, nullable=True),
        Column("error", Text, nullable=True),
        Column("result", JSON, nullable=True),
        UniqueConstraint("study", "key", name="uq_tuner_study_task"),
    )
    return md, meta


def upgrade() -> None:
    bind = op.get_bind()
    md, meta = _release1()
    md.create_all(bind, checkfirst=True)
    if bind.execute(select(meta.c.value).where(meta.c.key == "schema_version")).first() is None:
        bind.execute(meta.insert().values(key="schema_version", value="1"))


def downgrade() -> None:
    raise NotImplementedError("the first schema has nothing to go back to")
