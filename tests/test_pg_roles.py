"""A PostgreSQL store opened by a role that may not make its schema, or through a search_path that names no
schema: PostgreSQL 15 gives no role but the owner CREATE on `public`, and a DBA often makes the tables as
one role and runs the fleet as another. Was: a StoreError carrying SQLAlchemy's message, the failed
CREATE TABLE and a link, over a dozen lines, and nothing said what to do. Real server, real roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def role_url() -> Iterator[tuple[str, str]]:
    """(the owner's URL of a fresh database, the URL of a new role with no grant on it)."""
    from .pg import _admin_or_skip, fresh_database

    admin = _admin_or_skip(None)
    role = f"tuner_role_{uuid.uuid4().hex[:10]}"
    for url in fresh_database():
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        try:
            yield url, url.replace("://postgres@", f"://{role}@")
        finally:
            from tuner.storage import engine_of

            for u in (url, url.replace("://postgres@", f"://{role}@")):
                eng = engine_of(u)
                if eng is not None:
                    eng.dispose()
    with admin.connect() as c:  # its database dropped, and its grants with it
        c.exec_driver_sql(f'DROP ROLE "{role}"')
    admin.dispose()


def _refused(url: str) -> str:
    from tuner.storage import StoreError
    from tuner.store import ResultStore

    with pytest.raises(StoreError) as err:
        ResultStore(url)
    msg = str(err.value)
    assert "\n" not in msg and "[SQL:" not in msg and "nothing was written" in msg, msg
    return msg


def test_a_role_that_may_not_make_or_read_the_schema_is_told_what_to_grant(
    role_url: tuple[str, str],
) -> None:
    from sqlalchemy import create_engine

    from tuner.store import ResultStore, TaskContext

    owner, role = role_url
    assert "permission denied for schema public" in _refused(role)
    ResultStore(owner)  # the owner makes the store
    msg = _refused(role)  # its tables: nothing granted yet
    assert "permission denied for table" in msg and "GRANT this role USAGE on the schema" in msg, msg
    name = role.split("://", 1)[1].split("@", 1)[0]
    grant = create_engine(owner, isolation_level="AUTOCOMMIT")
    with grant.connect() as c:
        c.exec_driver_sql(f'GRANT USAGE ON SCHEMA public TO "{name}"')
        c.exec_driver_sql(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{name}"')
        c.exec_driver_sql(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{name}"')
    grant.dispose()
    store = ResultStore(role)  # what the message says to do is enough
    store.record(TaskContext(kernel="k"), "fp", {"a": 1}, 1.0, "ok")
    assert store.count() == 1


def test_a_search_path_naming_no_schema_is_named(role_url: tuple[str, str]) -> None:
    owner, _ = role_url
    msg = _refused(owner + "?options=-csearch_path%3Dno_such_schema")
    assert "no schema has been selected to create in" in msg and "CREATE SCHEMA it" in msg, msg


def test_a_search_path_naming_a_schema_keeps_every_table_there(role_url: tuple[str, str]) -> None:
    """(Worked before: a store of its own per schema of a shared database.)"""
    from sqlalchemy import create_engine, text

    from tuner.storage import engine_of
    from tuner.store import ResultStore

    owner, _ = role_url
    admin = create_engine(owner, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("CREATE SCHEMA team_a"))
    url = owner + "?options=-csearch_path%3Dteam_a"
    ResultStore(url).optuna_storage()  # tuner's tables and Optuna's
    try:
        with admin.connect() as c:
            where = dict(
                c.execute(
                    text(
                        "SELECT table_schema, count(*) FROM information_schema.tables "
                        "WHERE table_schema IN ('public', 'team_a') GROUP BY table_schema"
                    )
                ).all()
            )
    finally:
        admin.dispose()
        eng = engine_of(url)
        if eng is not None:
            eng.dispose()
    assert set(where) == {"team_a"} and where["team_a"] > 10, where
