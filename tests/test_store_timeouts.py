"""A PostgreSQL store that stops answering fails a worker within a bounded time, with an error that names
the store (without its password), the operation and the limit, and leaves the store consistent.

Real server (127.0.0.1:5432, trust auth; tests/pg.py): another connection holds `LOCK TABLE ... IN ACCESS
EXCLUSIVE MODE` inside an open transaction (what another worker's open transaction, or a stuck server,
looks like from the waiting side), or a statement sleeps on the server. Every blocking call runs in a
thread joined with a hard limit, or in a subprocess with a timeout, so a regression fails instead of
hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests._env import repo_pythonpath  # noqa: E402
from tests.pg import DRIVERS, fresh_database
from tests.test_studies import FAKE, REPO, finished_configs, write_study

pytestmark = pytest.mark.postgres

HARD_LIMIT_S = 30.0  # far past the 1 s store timeout of these tests; a hang fails here


@pytest.fixture(params=DRIVERS)
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database, reached through a URL with a password (trust auth ignores it) that no message
    may show, through each driver (psycopg2, psycopg 3): both get the same timeouts and deadline."""
    for url in fresh_database(request.param):
        yield url.replace("postgres@", "postgres:s3cret-pw@", 1)


def scheme(url: str) -> str:
    """`postgresql+psycopg2`: what a message names the store by, before its host."""
    return url.split("://", 1)[0]


@pytest.fixture
def lock_table(pg_url: str) -> Iterator[Callable[[str], None]]:
    """lock_table(name): another connection takes an ACCESS EXCLUSIVE lock on the table and keeps its
    transaction open until the test ends (or calls `lock_table.release()`)."""
    eng = create_engine(pg_url)
    conns: list[Any] = []

    def lock(table: str) -> None:
        conn = eng.connect()
        conn.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        conns.append(conn)

    def release() -> None:
        while conns:
            c = conns.pop()
            c.rollback()
            c.close()

    lock.release = release  # type: ignore[attr-defined]
    yield lock
    release()
    eng.dispose()


def bounded(fn: Callable[[], Any]) -> tuple[BaseException | None, float]:
    """Run fn in a thread; return (its exception, seconds taken); fail if it is still blocked after
    HARD_LIMIT_S (the thread ends when the test releases its locks)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    t0 = time.monotonic()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(HARD_LIMIT_S)
    assert not th.is_alive(), f"the store call still blocks after {HARD_LIMIT_S} s"
    return box.get("exc"), time.monotonic() - t0


def test_a_locked_table_fails_a_write_with_a_clear_error(
    pg_url: str, lock_table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore, TaskContext

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    store = ResultStore(pg_url)
    task = TaskContext(kernel="k")
    store.record(task, "fp", {"a": 1}, 1.0, "ok")
    lock_table("tuner_measurements")
    exc, took = bounded(lambda: store.record(task, "fp", {"a": 2}, 2.0, "ok", study_name="s1"))
    assert isinstance(exc, StoreTimeout), exc
    assert took < 15, took
    msg = str(exc)
    host_db = pg_url.split("@", 1)[1]
    assert f"store {scheme(pg_url)}://{host_db}:" in msg, msg
    assert "s3cret-pw" not in msg and "postgres@" not in msg, msg
    assert "recording a measurement of k (study s1)" in msg, msg
    assert "gave up after 1 s (TUNER_PG_TIMEOUT" in msg and "rolled back" in msg, msg
    lock_table.release()
    # the failed write was rolled back, the earlier one kept, and the store works again
    assert [(m.config, m.value) for m in store.measurements()] == [({"a": 1}, 1.0)]
    store.record(task, "fp", {"a": 3}, 3.0, "ok")
    assert store.count() == 2


def test_a_statement_the_server_does_not_answer_is_cut_off(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query in flight that the server does not answer (pg_sleep stands in for a stuck backend)."""
    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    store = ResultStore(pg_url)

    def slow() -> None:
        with store.session() as s:
            s.execute(text("SELECT pg_sleep(20)"))

    exc, took = bounded(slow)
    assert isinstance(exc, StoreTimeout) and took < 15, (exc, took)
    assert "a SELECT gave up after 1 s" in str(exc), exc
    assert store.count() == 0  # the pooled connection is usable again


def test_timeout_setting_and_url_options(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.errors import BadInput
    from tuner.storage import engine_kwargs, make_engine

    def shown(url: str) -> tuple[str, str, float | None]:
        """The two timeouts the server shows, and the client's own limit (None: no client deadline)."""
        eng = make_engine(url)
        try:
            with eng.connect() as c:
                return (
                    c.execute(text("SHOW statement_timeout")).scalar_one(),
                    c.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one(),
                    getattr(c.connection.dbapi_connection, "tuner_limit_s", None),
                )
        finally:
            eng.dispose()

    monkeypatch.delenv("TUNER_PG_TIMEOUT", raising=False)
    assert shown(pg_url) == ("1min", "1min", 60.0)  # the default, PG_TIMEOUT_S
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "2.5")
    assert shown(pg_url) == ("2500ms", "2500ms", 2.5)
    # the URL's own options win for what they set, and keep the rest
    assert shown(pg_url + "?options=-c%20statement_timeout%3D7s") == ("7s", "2500ms", 7.0)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "0")
    assert shown(pg_url) == ("0", "0", None)
    assert "options" not in engine_kwargs(pg_url)["connect_args"]  # nothing sent (e.g. behind PgBouncer)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "soon")
    with pytest.raises(BadInput, match="TUNER_PG_TIMEOUT must be a number of seconds >= 0"):
        engine_kwargs(pg_url)


# The Optuna-storage tests' limit. Not 1 s: Optuna does Python work (alembic's script walk, trial
# bookkeeping) inside its transactions, and on 2 loaded cores those gaps outlasted a 1 s
# idle_in_transaction_session_timeout (the test failed so in two full runs, at different statements).
OPTUNA_LIMIT_S = 3


def _optuna_study(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(Optuna's storage of a store whose timeout is OPTUNA_LIMIT_S, a new study "o" in it)."""
    import optuna

    from tuner.storage._migrate import ensure_schema
    from tuner.store import ResultStore

    # The schemas first, without the 1 s timeout: what is tested here is the Optuna storage's use. (Their
    # creation under a short timeout, which failed two fresh-clone CI runs, has its own test below.)
    plain = create_engine(pg_url)
    try:
        ensure_schema(plain)
    finally:
        plain.dispose()
    optuna.storages.RDBStorage(
        pg_url
    ).engine.dispose()  # Optuna's tables too (its first creation idles as well)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", str(OPTUNA_LIMIT_S))
    storage = ResultStore(pg_url).optuna_storage()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # for this test (conftest puts it back after)
    return storage, optuna.create_study(storage=storage, study_name="o")


def test_optuna_storage_gets_the_same_timeout(
    pg_url: str, lock_table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    from tuner.storage import StoreTimeout

    storage, study = _optuna_study(pg_url, monkeypatch)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    lock_table("trials")
    exc, took = bounded(lambda: study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1))
    assert isinstance(exc, StoreTimeout) and took < 60, (exc, took)
    assert "s3cret-pw" not in str(exc) and f"gave up after {OPTUNA_LIMIT_S} s" in str(exc), exc
    lock_table.release()
    assert len(optuna.load_study(study_name="o", storage=storage).get_trials()) >= 2


def _complete_trials(url: str) -> int:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return int(
                c.execute(text("SELECT count(*) FROM trials WHERE state = 'COMPLETE'")).scalar_one() or 0
            )
    except Exception:  # noqa: BLE001 - Optuna's tables do not exist yet
        return 0
    finally:
        eng.dispose()


@pytest.mark.parametrize("pg_url", ["psycopg2"], indirect=True)  # the CLI's part; the drivers' is above
def test_a_study_worker_fails_within_bounded_time_and_its_task_is_claimable(
    pg_url: str, lock_table: Any, tmp_path: Path
) -> None:
    """A `tuner study run` worker whose store stops answering mid-task (another transaction holds a lock
    on the measurements) exits 1 within a bounded time with the clear error; the trials it finished are
    kept, its task is back in the queue, and a rerun finishes the study without repeating a trial."""
    from tuner.studies import PENDING, TaskBoard, load_study, run_study

    path = write_study(tmp_path, n_m=1, budget=12)
    env = {
        **os.environ,
        "TUNER_PG_TIMEOUT": "1",
        "FAKE_TRIAL_SLEEP": "0.2",
        "PYTHONPATH": repo_pythonpath(),
    }
    cmd = [sys.executable, "-m", "tuner.cli", "study", "run", str(path), "--storage", pg_url]
    cmd += ["--executor", FAKE, "--quiet", "--no-report"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8"
    )
    try:
        deadline = time.monotonic() + 60
        while _complete_trials(pg_url) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker finished no trial in 60 s"
            time.sleep(0.05)
        lock_table("tuner_measurements")
        kept = _complete_trials(pg_url)
        out, err = proc.communicate(timeout=HARD_LIMIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (out, err)
    assert "StoreTimeout" in err and "gave up after 1 s (TUNER_PG_TIMEOUT" in err, err
    assert "recording a measurement of fakemm (study " in err, err
    assert pg_url.split("@", 1)[1] in err and "s3cret-pw" not in err, err
    lock_table.release()

    spec = load_study(path, storage=pg_url, check_kernels=False)
    board = TaskBoard(pg_url)
    [row] = board.rows(spec.name)
    assert row.status == PENDING and row.worker is None, row  # handed back: claimable at once
    [task] = spec.tasks
    before = finished_configs(pg_url, task)
    assert len(before) >= kept  # the finished trials are kept
    summary = run_study(spec, executor=FAKE)
    assert summary.complete and not summary.failed
    after = finished_configs(pg_url, task)
    assert after[: len(before)] == before and len(after) == 12
    assert len({tuple(sorted(c.items())) for c in after}) == 12  # no trial repeated


# ---- a server that does not run: its statement_timeout cannot fire ------------------------------------
@pytest.fixture
def freeze() -> Iterator[Callable[[int], None]]:
    """freeze(pid): SIGSTOP that backend process of the local server (the one serving a connection of the
    test, never the postmaster: other sessions share the server); every one is SIGCONTed at teardown."""
    import signal

    stopped: list[int] = []

    def stop(pid: int) -> None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            os.kill(pid, 0)
        except (OSError, PermissionError) as exc:
            pytest.skip(f"cannot signal the backend process {pid} (a remote server, or not allowed): {exc}")
        assert b"postgres" in cmdline, cmdline
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    yield stop
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)


def _backend_pid(dbapi_conn: Any) -> int:
    return int(dbapi_conn.info.backend_pid)  # libpq's, no round trip


@pytest.mark.parametrize("at", ["INSERT", "COMMIT"])
def test_a_stopped_backend_fails_a_write_instead_of_hanging(
    pg_url: str, freeze: Any, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """The backend serving the write is stopped (SIGSTOP) just before the INSERT, or before the COMMIT:
    the host still acknowledges TCP, so only the client's own deadline ends the wait."""
    from sqlalchemy import event

    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore, TaskContext

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    store = ResultStore(pg_url)
    task = TaskContext(kernel="k")
    store.record(task, "fp", {"a": 1}, 1.0, "ok")

    def before_insert(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO tuner_measurements"):
            freeze(_backend_pid(conn.connection.dbapi_connection))

    def before_commit(conn: Any) -> None:
        freeze(_backend_pid(conn.connection.dbapi_connection))

    if at == "INSERT":
        event.listen(store.engine, "before_cursor_execute", before_insert)
    else:
        event.listen(store.engine, "commit", before_commit)
    try:
        exc, _ = bounded(lambda: store.record(task, "fp", {"a": 2}, 2.0, "ok", study_name="s1"))
    finally:
        event.remove(
            store.engine,
            "before_cursor_execute" if at == "INSERT" else "commit",
            before_insert if at == "INSERT" else before_commit,
        )
    assert isinstance(exc, StoreTimeout), exc
    msg = str(exc)
    assert f"store {scheme(pg_url)}://{pg_url.split('@', 1)[1]}:" in msg and "s3cret-pw" not in msg, msg
    assert "recording a measurement of k (study s1) gave up after 2 s (1 s (TUNER_PG_TIMEOUT" in msg, msg
    assert "the server did not answer at all" in msg, msg
    if at == "COMMIT":
        assert "whether its commit took effect is unknown" in msg, msg
    else:
        assert "nothing of it was written" in msg, msg
    # the dead connection left the pool: the store works at once on a new one
    store.record(task, "fp", {"a": 3}, 3.0, "ok")
    assert {m.config["a"] for m in store.measurements()} >= {1, 3}


def test_a_pooled_connection_whose_backend_stopped_is_replaced(
    pg_url: str, freeze: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend of the idle pooled connection is stopped: the check at checkout gets no answer, the
    connection is closed and replaced, and the call succeeds."""
    from tuner.store import ResultStore, TaskContext

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    store = ResultStore(pg_url)
    store.record(TaskContext(kernel="k"), "fp", {"a": 1}, 1.0, "ok")
    assert store.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    with store.engine.connect() as c:
        pid = _backend_pid(c.connection.dbapi_connection)
    freeze(pid)
    exc, _ = bounded(store.count)
    assert exc is None, exc
    with store.engine.connect() as c:
        assert _backend_pid(c.connection.dbapi_connection) != pid


def test_a_connection_given_back_its_own_limit_is_watched_on_it_at_once(
    pg_url: str, freeze: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema lock's connection runs under the migration's limit (600 s), then gets its own back
    (1 s), as when a store is created. The watchdog, which looked at it under the long limit and then
    looks again only an eighth of that deadline later (112 s), must look again at once."""
    from tuner.storage import StoreTimeout, make_engine
    from tuner.storage._engine import set_statement_limit

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    eng = make_engine(pg_url)
    c = eng.connect()
    set_statement_limit(c, 600)
    time.sleep(0.5)  # past the watchdog's next look (an eighth of the 2 s deadline)
    set_statement_limit(c, None)
    freeze(_backend_pid(c.connection.dbapi_connection))
    exc, took = bounded(lambda: c.execute(text("SELECT 1")))
    c.close()  # not before: closing waits on the stopped backend where the call hangs
    eng.dispose()
    assert isinstance(exc, StoreTimeout) and "did not answer at all" in str(exc), exc
    assert took < 10, took  # the 2 s deadline, not the long limit's schedule


def test_optuna_storage_on_a_stopped_backend_fails_instead_of_hanging(
    pg_url: str, freeze: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import event

    from tuner.storage import StoreTimeout

    storage, study = _optuna_study(pg_url, monkeypatch)
    trial = study.ask()
    trial.suggest_float("x", 0, 1)

    @event.listens_for(storage.engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE trials"):
            freeze(_backend_pid(conn.connection.dbapi_connection))

    exc, _ = bounded(lambda: study.tell(trial, 0.5))
    event.remove(storage.engine, "before_cursor_execute", before)
    assert isinstance(exc, StoreTimeout) and "the server did not answer at all" in str(exc), exc
    assert "s3cret-pw" not in str(exc), exc


def _idling(fn: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """fn, after `seconds` of idling on its first call: what a slow first import of the migration scripts
    looks like (on a fresh clone, without bytecode, alembic imports them inside the migration's open
    transaction; later loads in the process are quick)."""
    calls: list[int] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            time.sleep(seconds)
        calls.append(1)
        return fn(*args, **kwargs)

    return slow


def test_a_store_is_created_under_a_short_timeout_even_when_its_migration_idles(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating the schemas (tuner's and Optuna's) may idle inside their transactions longer than a short
    TUNER_PG_TIMEOUT: the server's idle_in_transaction_session_timeout must not end them (two fresh-clone
    CI runs failed so before the tests created the schemas first). Both get the migration limit."""
    import optuna
    from optuna.storages._rdb.storage import _VersionManager

    from tuner.storage import _migrate
    from tuner.store import ResultStore

    orig_upgrade = _migrate._upgrade

    def upgrade_after_a_pause(conn: Any) -> None:
        conn.execute(text("SELECT 1"))  # the migration's transaction is open from here
        time.sleep(1.6)
        orig_upgrade(conn)

    monkeypatch.setattr(_migrate, "_upgrade", upgrade_after_a_pause)
    monkeypatch.setattr(_VersionManager, "get_head_version", _idling(_VersionManager.get_head_version, 1.6))
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    exc, _ = bounded(lambda: ResultStore(pg_url).optuna_storage())
    assert exc is None, repr(exc)
    storage = ResultStore(pg_url).optuna_storage()
    # the store's own connections keep the short limit afterwards
    with storage.engine.connect() as c:
        assert c.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "1s"
    # and the schemas made work: a study runs in them (under OPTUNA_LIMIT_S, as the other Optuna tests: at
    # 1 s Optuna's own transactions idle past the limit on a loaded machine; a fresh-clone CI run failed so)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", str(OPTUNA_LIMIT_S))
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # for this test (conftest puts it back after)
    study = optuna.create_study(storage=ResultStore(pg_url).optuna_storage(), study_name="after")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(study.get_trials()) == 1


def _other_sessions(url: str, *but: int) -> list[str]:
    """The sessions on `url`'s database other than the one asking and `but`: their state and query."""
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            rows = c.execute(
                text(
                    "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            ).all()
    finally:
        eng.dispose()
    return [f"{r.state}: {r.query}" for r in rows if r.pid not in but]


def _optuna_storage_timeout(store: Any, statement: str) -> str:
    """`store.optuna_storage()` while another connection has run `statement` in a transaction it holds
    open: its error must be a StoreTimeout (its message is returned) that leaves no session of tuner's on
    the server while the error is still held (the store's own pool aside)."""
    from tuner.storage import StoreTimeout, engine_for

    other = create_engine(store.url)
    holder = other.connect()
    holder.execute(text(statement))
    try:
        exc, took = bounded(store.optuna_storage)
        assert isinstance(exc, StoreTimeout), repr(exc)
        assert took < 15, took
        msg = str(exc)
        assert "s3cret-pw" not in msg and "rolled back" in msg, msg
        engine_for(store.url).dispose()  # tuner's own pool; what is left is the failed opening's
        left = _other_sessions(store.url, _backend_pid(holder.connection.dbapi_connection))
        assert left == [], left  # `exc` (and its traceback) is still held here
    finally:
        holder.rollback()
        holder.close()
        other.dispose()
    return msg


def test_creating_optunas_tables_that_times_out_is_a_store_timeout_and_leaves_no_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's tables are made on an engine of tuner's own with the migration limit. A statement of
    Optuna's constructor that ran past it (here: another program creating the same table in a transaction
    it holds open) raised the driver's error (psycopg2's QueryCanceled, not tuner's StoreTimeout naming
    the operation and the limit), and that engine was never disposed: its connection stayed open on the
    server for as long as the error (a traceback, a notebook's last error) was kept."""
    from tuner.storage import _engine
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    monkeypatch.setattr(_engine, "PG_MIGRATION_TIMEOUT_S", 1.0)  # the migration limit: 1 s here
    store = ResultStore(pg_url)  # tuner's tables
    # another program creates the same table in a transaction it holds open: ours waits on it
    msg = _optuna_storage_timeout(store, "CREATE TABLE studies (study_id integer)")
    assert "creating Optuna's tables gave up after 1 s (the migration limit" in msg, msg
    # the lock gone, the tables are made and the storage works (under OPTUNA_LIMIT_S: see there)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", str(OPTUNA_LIMIT_S))
    storage = ResultStore(pg_url).optuna_storage()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # for this test (conftest puts it back after)
    study = optuna.create_study(storage=storage, study_name="after")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(study.get_trials()) == 1


def test_a_migration_that_times_out_names_the_migration_limit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tuner's own migration runs on the schema lock's connection under the migration limit; its timeout
    named the store's usual limit (TUNER_PG_TIMEOUT), not the one that ran out."""
    from tuner.storage import StoreTimeout, _engine
    from tuner.storage._schema import VERSION_TABLE
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    monkeypatch.setattr(_engine, "PG_MIGRATION_TIMEOUT_S", 2.0)
    other = create_engine(pg_url)
    holder = other.connect()
    holder.execute(text(f"CREATE TABLE {VERSION_TABLE} (version_num varchar(32))"))  # uncommitted
    try:
        exc, took = bounded(lambda: ResultStore(pg_url))
    finally:
        holder.rollback()
        holder.close()
        other.dispose()
    assert isinstance(exc, StoreTimeout) and took < 15, (repr(exc), took)
    msg = str(exc)
    assert "upgrading the schema from empty to" in msg, msg
    assert "gave up after 2 s (the migration limit: the larger of TUNER_PG_TIMEOUT and 2 s)" in msg, msg
    assert ResultStore(pg_url).count() == 0  # the lock gone, the store is made


def test_opening_optunas_storage_that_times_out_is_a_store_timeout_and_leaves_no_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's tables already made, its storage's own constructor still runs statements (it reads and
    stamps `version_info`) on the engine it has just made, before tuner could give that engine its error
    handler. One that ran past the limit (another program holding a lock on the table) raised Optuna's
    StorageInternalError over the driver's error, not tuner's StoreTimeout, and its engine's pooled
    connection stayed open on the server for as long as the error was kept."""
    from tuner.storage import _engine, _migrate
    from tuner.store import ResultStore

    # Optuna's tables made and stamped at the default limit: at 1 s, a CI machine under load once stalled
    # longer than that between two statements of Optuna's constructor, and the server ended the session
    ResultStore(pg_url).optuna_storage().engine.dispose()
    _migrate._optuna_storages.clear()  # opened anew, not the one this process shares (`optuna_storage`)
    _engine._engines.pop(_engine.normalize_url(pg_url)).dispose()  # the store's engine anew, at 1 s
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "1")
    store = ResultStore(pg_url)
    msg = _optuna_storage_timeout(store, "LOCK TABLE version_info IN ACCESS EXCLUSIVE MODE")
    assert "opening Optuna's tables gave up after 1 s (TUNER_PG_TIMEOUT" in msg, msg
    # the lock gone, it opens (at the default limit: Optuna's constructor idles inside its transaction while
    # alembic loads its scripts, which took over 1 s on a loaded CI machine, and the server ended the session)
    monkeypatch.setenv("TUNER_PG_TIMEOUT", "60")
    assert store.optuna_storage() is not None
