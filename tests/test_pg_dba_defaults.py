"""A PostgreSQL store under a DBA's server-side defaults, set on the role or the database (`ALTER ROLE|DATABASE
... SET ...`) as a DBA sets them, so every new session of tuner gets them: what tuner's schema creation and
upgrade set for themselves inside their own transaction (tuner/storage/_dba.py), and what they refuse in
one line. Real server, a fresh role and database per test (tests/pg.py's `limited_database`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tests.pg import DRIVERS, LimitedDatabase, limited_database

LEVELS = ("role", "database")


@pytest.fixture
def db() -> Iterator[LimitedDatabase]:
    yield from limited_database()


@pytest.fixture
def db_driver(driver: str) -> Iterator[LimitedDatabase]:
    """`db`, its URL naming the test's `driver` (one of DRIVERS)."""
    yield from limited_database(driver)


def _set(db: LimitedDatabase, level: str, setting: str, value: str) -> None:
    """The DBA's `ALTER ROLE|DATABASE ... SET setting = value` (the sessions opened after it get it)."""
    target = f'ROLE "{db.role}"' if level == "role" else f'DATABASE "{db.database}"'
    db._run(f"ALTER {target} SET {setting} = '{value}'")


def _dispose(url: str) -> None:
    from tuner.storage import engine_of

    eng = engine_of(url)
    if eng is not None:
        eng.dispose()


def _release1_schema(url: str) -> None:
    """The tables of schema revision 0001 (the first release's), with one cache entry, as the role."""
    from alembic import command
    from alembic.config import Config

    from tuner.storage._migrate import MIGRATIONS_DIR

    eng = create_engine(url)
    try:
        with eng.connect() as conn, conn.begin():
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0001")
            conn.execute(
                text(
                    "INSERT INTO tuner_cache_entries VALUES ('h', 'k', 's', '{}', '[]', 'cpu', '{}', '{}', "
                    "1.0, 0.0, '2026-01-01', 'fp')"
                )
            )
    finally:
        eng.dispose()


@pytest.mark.parametrize("level", LEVELS)
def test_an_upgrade_waits_past_the_dbas_lock_timeout_for_a_reader_of_its_tables(
    db: LimitedDatabase, level: str
) -> None:
    """Was: with a lock_timeout of 100 ms on the role or database, upgrading a store while another session
    read one of its tables (a worker in a transaction) failed at once with StoreTimeout ("upgrading the
    schema from 0001 to 0002 gave up: ... past the server's lock_timeout"). The upgrade now waits for the
    reader (up to the migration limit), which here lets go only once the upgrade is seen waiting on it
    for five times the lock_timeout (PostgreSQL 14's pg_locks.waitstart)."""
    from tuner.storage import SCHEMA_REVISION
    from tuner.store import ResultStore

    _release1_schema(db.url)
    _set(db, level, "lock_timeout", "100ms")
    reader = create_engine(db.url.replace(f"://{db.role}@", "://postgres@"))
    conn, watch = reader.connect(), reader.connect()
    got: dict[str, BaseException] = {}
    try:
        conn.execute(text("SELECT count(*) FROM tuner_cache_entries"))  # ACCESS SHARE until it commits

        def upgrade() -> None:
            try:
                ResultStore(db.url)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                got["error"] = exc

        thread = threading.Thread(target=upgrade, daemon=True)
        thread.start()
        waiting = threading.Event()
        while thread.is_alive() and not waiting.wait(0.01):  # its ALTER TABLE queued on the reader
            n = watch.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT "
                    "l.granted AND a.usename = :r AND l.relation = 'tuner_cache_entries'::regclass "
                    "AND clock_timestamp() - l.waitstart > interval '500 ms'"
                ),
                {"r": db.role},
            ).scalar()
            watch.commit()
            if n:
                waiting.set()
        conn.commit()
        thread.join(120)
    finally:
        conn.close()
        watch.close()
        reader.dispose()
        _dispose(db.url)
    assert "error" not in got, got
    with create_engine(db.url).connect() as c:
        assert c.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar() == SCHEMA_REVISION
        assert c.execute(text("SHOW lock_timeout")).scalar() == "100ms"  # the DBA's, for every other session


@pytest.mark.parametrize("level", LEVELS)
def test_optunas_tables_are_made_under_the_dbas_idle_in_transaction_timeout(
    db: LimitedDatabase, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TUNER_PG_TIMEOUT=0 (tuner sets no timeout: the DBA's apply) and an
    idle_in_transaction_session_timeout of 100 ms on the role or database. Was: StoreConnectionLost,
    "creating Optuna's tables failed: the server ended the connection" (alembic imports its scripts
    inside the creation's transaction), then the same for "opening Optuna's tables"."""
    from tuner.storage._migrate import close_idle_connections
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "0")
    _set(db, level, "idle_in_transaction_session_timeout", "100ms")
    try:
        storage = ResultStore(db.url).optuna_storage()
        assert storage.get_all_studies() == []
    finally:
        close_idle_connections(db.url)
        _dispose(db.url)


@pytest.mark.parametrize("level", LEVELS)
def test_a_read_only_default_is_refused_in_one_line_naming_it_and_its_undo(
    db: LimitedDatabase, level: str
) -> None:
    """Was: "upgrading the schema from empty to 0002 failed: the server only reads (cannot execute CREATE
    TABLE ...: a hot standby after a failover, or default_transaction_read_only)", which named neither
    where the setting was made nor what to do. tuner does not override it."""
    from tuner.storage import StoreError
    from tuner.store import ResultStore

    _set(db, level, "default_transaction_read_only", "on")
    try:
        with pytest.raises(StoreError) as err:
            ResultStore(db.url)
    finally:
        _dispose(db.url)
    msg = str(err.value)
    undo = (
        f'ALTER ROLE "{db.role}" RESET default_transaction_read_only'
        if level == "role"
        else f'ALTER DATABASE "{db.database}" RESET default_transaction_read_only'
    )
    assert "\n" not in msg and "nothing was written" in msg, msg
    assert f"default_transaction_read_only is on for this session, set by the {level}" in msg, msg
    assert f"`{undo}`" in msg, msg
    db._run(undo)  # what it says to do is enough
    try:
        assert ResultStore(db.url).count() == 0
    finally:
        _dispose(db.url)


def test_a_statement_is_named_with_its_article() -> None:
    """Was: "a INSERT on tuner_measurements", "a UPDATE on ..." in the messages of a failed statement."""
    from tuner.storage._engine import _describe

    assert _describe("INSERT INTO tuner_measurements (a) VALUES (1)") == "an INSERT on tuner_measurements"
    assert _describe("UPDATE tuner_cache_claims SET x = 1") == "an UPDATE on tuner_cache_claims"
    assert _describe("ALTER TABLE tuner_meta ADD c int") == "an ALTER on tuner_meta"
    assert _describe("DELETE FROM tuner_cache_claims") == "a DELETE on tuner_cache_claims"
    assert _describe("SELECT 1") == "a SELECT"


@pytest.mark.parametrize("level", LEVELS)
def test_a_serializable_default_is_read_committed_for_tuners_and_optunas_sessions(
    db: LimitedDatabase, level: str
) -> None:
    """A DBA's `default_transaction_isolation = 'serializable'`: tuner's and Optuna's sessions run at read
    committed, which their writes are made for (was: serializable, and Optuna's commit of a trial's state
    from one study's workers at once met "could not serialize access", which Optuna does not retry); a
    URL's own `options` keep theirs, and sessions not tuner's keep the DBA's."""
    from tuner.storage import engine_of
    from tuner.store import ResultStore

    _set(db, level, "default_transaction_isolation", "serializable")
    own = f"{db.url}?options=-cdefault_transaction_isolation%3Drepeatable%5C%20read"
    try:
        store = ResultStore(db.url)
        storage = store.optuna_storage()
        with engine_of(db.url).connect() as c:
            assert c.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
        with storage.engine.connect() as c:
            assert c.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
        ResultStore(own)
        with engine_of(own).connect() as c:
            assert c.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"
    finally:
        _dispose(db.url)
        _dispose(own)
    with create_engine(db.url).connect() as c:
        assert c.execute(text("SHOW transaction_isolation")).scalar() == "serializable"


def _shown(url: str, setting: str) -> tuple[str, str, float | None]:
    """`SHOW setting` on a connection of tuner's store of `url` and on one of its Optuna storage, and the
    client-side deadline's limit of tuner's connection (None: none)."""
    from tuner.storage import engine_of
    from tuner.storage._migrate import close_idle_connections
    from tuner.store import ResultStore

    try:
        storage = ResultStore(url).optuna_storage()
        with engine_of(url).connect() as c:
            tuners = c.execute(text(f"SHOW {setting}")).scalar_one()
            deadline = getattr(c.connection.dbapi_connection, "tuner_limit_s", None)
        with storage.engine.connect() as c:
            optunas = c.execute(text(f"SHOW {setting}")).scalar_one()
    finally:
        close_idle_connections(url)
        _dispose(url)
    return tuners, optunas, deadline


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("setting", ["statement_timeout", "idle_in_transaction_session_timeout"])
def test_the_stricter_of_the_dbas_limit_and_tuners_holds(
    setting: str, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role's `statement_timeout` or `idle_in_transaction_session_timeout` of 2 s stays 2 s on the
    connections of tuner's store and of its Optuna storage (was: tuner's startup option made it 60 s,
    relaxing the DBA's limit), and the client-side deadline follows it; a role's 10 min gets tuner's 60 s;
    with TUNER_PG_TIMEOUT=0 tuner adds no limit of its own and the role's 2 s stands (as it did before).
    No startup option is sent, not even for a migration's engine (PgBouncer refuses them)."""
    from tuner.storage import engine_kwargs

    watched = setting == "statement_timeout"  # the client-side deadline follows the statement limit
    monkeypatch.delenv("TUNER_PG_TIMEOUT", raising=False)
    with contextlib.contextmanager(limited_database)(driver) as db:
        for kw in (engine_kwargs(db.url), engine_kwargs(db.url, 0, migration=True)):
            assert "options" not in kw["connect_args"]  # no startup option, which would outrank the DBA's
        _set(db, "role", setting, "2s")
        assert _shown(db.url, setting) == ("2s", "2s", 2.0 if watched else 60.0)
        _set(db, "role", setting, "10min")
        assert _shown(db.url, setting) == ("1min", "1min", 60.0)
        monkeypatch.setenv("TUNER_PG_TIMEOUT", "0")
        _set(db, "role", setting, "2s")
        assert _shown(db.url, setting)[:2] == ("2s", "2s")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_connection_given_back_its_own_limits_gets_those_it_was_made_with(
    db_driver: LimitedDatabase, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema lock's connection runs under the migration limit, then gets its own limits back
    (`set_statement_limit(conn, None)`): tuner's 60 s under a role's 10 min, the role's 2 s where stricter
    (was `RESET`, the session's start values: with no startup option, the role's 10 min)."""
    from tuner.storage import engine_for
    from tuner.storage._engine import set_statement_limit

    db = db_driver
    monkeypatch.delenv("TUNER_PG_TIMEOUT", raising=False)
    _set(db, "role", "statement_timeout", "10min")
    _set(db, "role", "idle_in_transaction_session_timeout", "2s")
    try:
        with engine_for(db.url).connect() as c:
            set_statement_limit(c, 600)
            assert c.execute(text("SHOW statement_timeout")).scalar_one() == "10min"
            set_statement_limit(c, None)
            shown = [c.execute(text(f"SHOW {s}")).scalar_one() for s in _TIMEOUTS]
            assert shown == ["1min", "2s"]
            assert c.connection.dbapi_connection.tuner_limit_s == 60.0
    finally:
        _dispose(db.url)


_TIMEOUTS = ("statement_timeout", "idle_in_transaction_session_timeout")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_statement_past_the_dbas_stricter_limit_names_it(
    db_driver: LimitedDatabase, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role's statement_timeout of 1 s ends a statement of tuner after 1 s, and the StoreTimeout names
    that limit and where it was set, not TUNER_PG_TIMEOUT's 60 s."""
    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore

    db = db_driver
    monkeypatch.delenv("TUNER_PG_TIMEOUT", raising=False)
    _set(db, "role", "statement_timeout", "1s")
    try:
        store = ResultStore(db.url)
        with pytest.raises(StoreTimeout) as err, store.session() as s:
            s.execute(text("SELECT pg_sleep(10)"))
    finally:
        _dispose(db.url)
    msg = str(err.value)
    assert "a SELECT gave up after 1 s (the server's statement_timeout, set by the role: stricter" in msg, msg
