"""Alembic migrations of tuner's tables (run by `tuner.storage.ensure_schema`, never by hand)."""
