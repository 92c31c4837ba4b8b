"""What tuner's schema migration on PostgreSQL sets for itself, inside its own transaction, against the
defaults a DBA set for the role or database (`ALTER ROLE|DATABASE ... SET ...`), and what it refuses.

- `lock_timeout`: the migration's DDL (ALTER TABLE on tuner's own tables) waits for the sessions that read
  them to finish, up to the migration limit (its connection's statement_timeout): `SET LOCAL lock_timeout
  = 0` in the migration's transaction. A DBA's lock_timeout (often 100 ms to a few seconds, a guard
  against DDL that queues other sessions behind it) made the upgrade of a store in use fail as soon as a
  worker was reading a table, with nothing to do but try again. Every other statement of tuner keeps it.
- `default_transaction_read_only`: never overridden; the migration is refused before its first DDL, in
  one line that names where the setting comes from and how to undo it (`refuse_read_only`)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ._engine import StoreError, redact

__all__ = ["migration_lock_waits", "refuse_read_only"]


def migration_lock_waits(conn: Connection) -> None:
    """Inside the migration's transaction on `conn`: its lock waits are bounded by its statement limit
    alone, not by the role's or database's `lock_timeout` (until the transaction ends)."""
    conn.execute(text("SET LOCAL lock_timeout = 0"))


# pg_settings.source of default_transaction_read_only -> where it was set, and the statement that undoes it
_SOURCES = {
    "user": ("the role", 'ALTER ROLE "{role}" RESET default_transaction_read_only'),
    "database": ("the database", 'ALTER DATABASE "{db}" RESET default_transaction_read_only'),
    "database user": (
        "the role in this database",
        'ALTER ROLE "{role}" IN DATABASE "{db}" RESET default_transaction_read_only',
    ),
    "client": ("the connection (the URL's options or PGOPTIONS)", "drop it from the URL's options"),
}


def refuse_read_only(conn: Connection, url: str, what: str) -> None:
    """Raise a one-line `StoreError` when the transaction open on `conn` (PostgreSQL) only reads, before
    `what` (the migration) writes anything: a hot standby, or `default_transaction_read_only` on (named
    with where it was set and the statement that undoes it). Was: the migration's first CREATE TABLE
    failed, its message naming neither."""
    row = conn.execute(
        text(
            "SELECT current_setting('transaction_read_only'), pg_is_in_recovery(), s.setting, s.source, "
            "current_user, current_database() "
            "FROM pg_settings s WHERE s.name = 'default_transaction_read_only'"
        )
    ).one()
    read_only, standby, default, source, role, db = row
    if read_only != "on":
        return
    where = f"store {redact(url)}: {what} refused, nothing was written"
    if standby:
        raise StoreError(
            f"{where}: the server is a hot standby (it only reads): point the URL at the primary"
        )
    if default != "on":  # read-only for another reason (none known): the server's own word
        raise StoreError(f"{where}: the server's transactions only read (transaction_read_only is on)")
    said, undo = _SOURCES.get(source, (f"the server's {source}", "set it to off there"))
    undo = undo.format(role=role.replace('"', '""'), db=db.replace('"', '""'))
    raise StoreError(
        f"{where}: default_transaction_read_only is on for this session, set by {said} (a DBA's default, "
        f"which tuner does not override); to write here, `{undo}` as a DBA, or use a role or database that "
        "may write"
    )
