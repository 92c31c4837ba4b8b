"""Schema version 2: indexed lookups for a miss, live claim owners, one version for every table.

- tuner_cache_entries: `fields_hash` and `family_hash` (indexed), filled in for the existing rows, so
  that a miss finds the entries of its key fields / shape family without reading the kernel's entries.
- tuner_measurements: an index on (kernel, id), so the bounded prior reads the newest rows of a kernel.
- tuner_cache_claims: `host`, `pid`, `heartbeat_at` of the claiming process, so a claim whose process is
  gone is taken over at once on the same host.
- tuner_meta.schema_version = 2 (the first release refuses a store newer than itself).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from tuner.storage._schema import key_hashes

    with op.batch_alter_table("tuner_cache_entries") as b:
        b.add_column(sa.Column("fields_hash", sa.String(32), nullable=True))
        b.add_column(sa.Column("family_hash", sa.String(32), nullable=True))
        b.create_index("ix_tuner_cache_entries_fields_hash", ["fields_hash"])
        b.create_index("ix_tuner_cache_entries_family_hash", ["family_hash"])
    with op.batch_alter_table("tuner_cache_claims") as b:
        b.add_column(sa.Column("host", sa.String(200), nullable=True))
        b.add_column(sa.Column("pid", sa.Integer, nullable=True))
        b.add_column(sa.Column("heartbeat_at", sa.Float, nullable=True))
    op.create_index("ix_tuner_measurements_kernel_id", "tuner_measurements", ["kernel", "id"])

    bind = op.get_bind()
    entries = sa.table(
        "tuner_cache_entries",
        sa.column("key_hash", sa.String),
        sa.column("kernel", sa.String),
        sa.column("source_hash", sa.String),
        sa.column("key_fields", sa.JSON),
        sa.column("dtypes", sa.JSON),
        sa.column("device", sa.String),
        sa.column("versions", sa.JSON),
        sa.column("fields_hash", sa.String),
        sa.column("family_hash", sa.String),
    )
    rows = bind.execute(
        sa.select(
            entries.c.key_hash,
            entries.c.kernel,
            entries.c.source_hash,
            entries.c.key_fields,
            entries.c.dtypes,
            entries.c.device,
            entries.c.versions,
        )
    ).all()
    for r in rows:
        fh, gh = key_hashes(
            r.kernel, r.source_hash, r.key_fields or {}, r.dtypes or [], r.device, r.versions or {}
        )
        bind.execute(
            entries.update().where(entries.c.key_hash == r.key_hash).values(fields_hash=fh, family_hash=gh)
        )
    meta = sa.table("tuner_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
    bind.execute(meta.update().where(meta.c.key == "schema_version").values(value="2"))


def downgrade() -> None:
    op.drop_index("ix_tuner_measurements_kernel_id", table_name="tuner_measurements")
    with op.batch_alter_table("tuner_cache_claims") as b:
        b.drop_column("heartbeat_at")
        b.drop_column("pid")
        b.drop_column("host")
    with op.batch_alter_table("tuner_cache_entries") as b:
        b.drop_index("ix_tuner_cache_entries_family_hash")
        b.drop_index("ix_tuner_cache_entries_fields_hash")
        b.drop_column("family_hash")
        b.drop_column("fields_hash")
    meta = sa.table("tuner_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
    op.get_bind().execute(meta.update().where(meta.c.key == "schema_version").values(value="1"))
