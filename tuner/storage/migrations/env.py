"""Alembic environment of tuner's schema: runs on the connection `ensure_schema` holds (under its lock,
in one transaction), with tuner's own version table so that Optuna's `alembic_version` is left alone."""

from __future__ import annotations

from alembic import context

from tuner.storage._schema import VERSION_TABLE, Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - `alembic` on the command line is not how tuner migrates
    raise RuntimeError("tuner's migrations run through tuner.storage.ensure_schema(url)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    transactional_ddl=True,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
