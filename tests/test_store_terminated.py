"""A PostgreSQL server that ends tuner's connections (a DBA's `pg_terminate_backend`, a restart or failover,
an idle-connection reaper, a proxy that drops its clients): between two operations the next one gets a new
connection unseen; under a statement or commit the caller gets `StoreConnectionLost`, a `StoreError` that
names the store and the operation (not Optuna's "invalid data in the commit" or SQLAlchemy's dump of the
statement), a decorated call goes on in memory, a study worker hands its task back, and nothing is half
written.

Real server (127.0.0.1:5432, trust auth; tests/pg.py): an admin connection terminates every backend of the
test's database, between calls or from a hook just before a chosen statement runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine

from tests.pg import ADMIN_URL, DRIVERS, fresh_database

pytestmark = pytest.mark.postgres


@pytest.fixture(params=DRIVERS)
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    for url in fresh_database(request.param):
        yield url.replace("postgres@", "postgres:s3cret-pw@", 1)


@pytest.fixture
def terminate(pg_url: str) -> Iterator[Callable[[], int]]:
    """terminate(): end every backend of the test's database from an admin connection, and wait until the
    server has removed them; returns how many there were."""
    db = pg_url.rsplit("/", 1)[1]
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    others = "FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"

    def kill() -> int:
        with admin.connect() as c:
            n = int(
                c.execute(text(f"SELECT count(pg_terminate_backend(pid)) {others}"), {"d": db}).scalar_one()
            )
            deadline = time.monotonic() + 5
            while c.execute(text(f"SELECT count(*) {others}"), {"d": db}).scalar_one():
                assert time.monotonic() < deadline, "the terminated backends did not go away"
                time.sleep(0.02)
        return n

    yield kill
    admin.dispose()


@pytest.fixture
def terminate_before(terminate: Callable[[], int]) -> Iterator[Callable[[str, int], list[str]]]:
    """terminate_before(prefix, nth): end every backend of the database just before the nth statement
    (of any engine of this process) that starts with `prefix` runs; returns the list the statement is put
    in when that happens."""
    hooks: list[Any] = []

    def arm(prefix: str, nth: int) -> list[str]:
        seen: list[str] = []
        fired: list[str] = []

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.startswith(prefix) and not fired:
                seen.append(statement)
                if len(seen) == nth:
                    fired.append(statement)
                    assert terminate() >= 1

        event.listen(Engine, "before_cursor_execute", before)
        hooks.append(before)
        return fired

    yield arm
    for h in hooks:
        event.remove(Engine, "before_cursor_execute", h)


def lost_message(exc: BaseException | None, url: str, what: str) -> str:
    from tuner.storage import StoreConnectionLost

    assert isinstance(exc, StoreConnectionLost), repr(exc)
    msg = str(exc)
    assert f"store {url.split('://', 1)[0]}://{url.split('@', 1)[1]}: " in msg and what in msg, msg
    assert "the server ended the connection" in msg and "s3cret-pw" not in msg, msg
    return msg


# ---- (a) a decorated function -----------------------------------------------------------------------
X = np.arange(8.0)


def _decorated(url: str) -> tuple[Any, list[int]]:
    import tuner
    from tuner import PowerOfTwo, SearchSpace

    last: dict[str, int] = {}
    runs: list[int] = []

    def bench(call: Any) -> float:
        runs.append(1)
        call()
        return 1e-3 * (1 + abs(np.log2(last["block"]) - 6))

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 256)]), key=["n"], bench=bench, budget=3, storage=url
    )
    def scale(x: Any, n: int, *, block: int) -> Any:
        last["block"] = block
        return x * 2.0

    return scale, runs


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    from tuner.runtime._sources import close_stores

    close_stores()
    yield
    close_stores()


def _stored_keys(url: str) -> set[int]:
    from tuner.runtime import ConfigCache
    from tuner.store import ResultStore

    return {e.key.fields_dict["n"] for e in ConfigCache(ResultStore(url)).entries()}


def test_a_decorated_function_reconnects_after_its_idle_connections_were_ended(
    pg_url: str, terminate: Callable[[], int], fresh_runtime: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    f, _ = _decorated(pg_url)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    assert terminate() >= 1  # the pooled connections, idle between calls
    np.testing.assert_array_equal(f(X, 2), X * 2.0)  # a miss: reads and writes on new connections
    g, runs = _decorated(pg_url)
    terminate()
    np.testing.assert_array_equal(g(X, 1), X * 2.0)
    assert g.tuner.stats["from_store"] == 1 and not runs
    assert _stored_keys(pg_url) == {1, 2}
    assert not [r for r in caplog.records if r.name.startswith("tuner")], caplog.text


def test_a_connection_ended_while_the_winner_is_written_keeps_it_in_memory(
    pg_url: str, terminate_before: Any, fresh_runtime: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends the connection under the write of the winner: the call returns as usual, the winner
    is kept in memory, one warning names the store and the lost connection (was: SQLAlchemy's
    OperationalError with the statement and its parameters), and the next winner is stored."""
    caplog.set_level(logging.WARNING)
    f, runs = _decorated(pg_url)
    np.testing.assert_array_equal(f(X, 0), X * 2.0)  # the store opened, its schema made
    fired = terminate_before("INSERT INTO tuner_cache_entries", 1)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    assert fired, "the winner's write did not happen"
    warned = [r.getMessage() for r in caplog.records if r.name == "tuner.runtime._sources"]
    assert len(warned) == 1, warned
    assert "the server ended the connection" in warned[0] and "s3cret-pw" not in warned[0], warned
    assert "[SQL:" not in warned[0], warned
    n = len(runs)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)  # held in memory: not tuned again
    np.testing.assert_array_equal(f(X, 2), X * 2.0)  # a new key: stored on a new connection
    assert len(runs) > n and f.tuner.stats["tuned"] == 3
    assert _stored_keys(pg_url) == {0, 2}


# ---- (b) tuner.optimize -------------------------------------------------------------------------------
def _run(url: str, budget: int, objective: Callable[[dict[str, Any]], float] | None = None) -> Any:
    import tuner
    from tests.test_optimize import grid_space

    def bowl(c: dict[str, Any]) -> float:
        return float(c["a"] + c["b"])

    return tuner.optimize(
        grid_space(), objective or bowl, budget=budget, storage=url, study_name="s", strategy="random"
    )


def _consistent(url: str, n: int) -> None:
    """The study holds n counted trials, each with one stored measurement, and no config twice."""
    import optuna

    from tuner.store import ResultStore
    from tuner.studies import task_trials

    store = ResultStore(url)
    trials = task_trials(store.optuna_storage(), "s")
    assert len(trials) == n, [t.state for t in optuna.load_study(study_name="s", storage=url).trials]
    assert store.check_trials("s", trials).consistent
    assert len({tuple(sorted(t.params.items())) for t in trials}) == n


def test_optimize_between_trials_gets_new_connections(pg_url: str, terminate: Callable[[], int]) -> None:
    calls: list[int] = []

    def objective(c: dict[str, Any]) -> float:
        calls.append(1)
        if len(calls) in (2, 5):
            assert terminate() >= 1
        return float(c["a"] + c["b"])

    assert _run(pg_url, 6, objective).best_value is not None
    _consistent(pg_url, 6)


@pytest.mark.parametrize(
    "statement, what",
    [
        ("INSERT INTO tuner_measurements", "recording a measurement of objective (study s)"),
        ("INSERT INTO trial_values", "storing trial 2 of study 's'"),
        ("UPDATE trials SET state", "of study 's' failed"),
    ],
)
def test_optimize_whose_connection_is_ended_mid_write_says_so_and_resumes(
    pg_url: str, terminate_before: Any, statement: str, what: str
) -> None:
    """Was: Optuna's StorageInternalError ("invalid data in the commit") for its own writes, and a
    StoreError carrying SQLAlchemy's dump of the statement for the measurement."""
    fired = terminate_before(statement, 3)
    with pytest.raises(Exception) as got:
        _run(pg_url, 6)
    assert fired
    msg = lost_message(got.value, pg_url, what)
    assert "[SQL:" not in msg and "nothing of it was written" in msg, msg
    _run(pg_url, 6)  # the same call again resumes the study on new connections
    _consistent(pg_url, 6)


# ---- (c) a study worker -------------------------------------------------------------------------------
@pytest.mark.parametrize("statement", ["INSERT INTO tuner_measurements", "INSERT INTO trial_values"])
def test_a_study_worker_whose_connection_is_ended_hands_its_task_back(
    pg_url: str, terminate_before: Any, tmp_path: Path, statement: str
) -> None:
    """Was, for Optuna's write: the task marked failed with Optuna's "invalid data in the commit"."""
    from tests.test_studies import FAKE, finished_configs, write_study
    from tuner.studies import PENDING, TaskBoard, load_study, run_study, write_report

    spec = load_study(write_study(tmp_path, n_m=1, budget=8), storage=pg_url, check_kernels=False)
    [task] = spec.tasks
    fired = terminate_before(statement, 4)
    with pytest.raises(Exception) as got:
        run_study(spec, executor=FAKE)
    assert fired
    lost_message(got.value, pg_url, "failed: the server ended the connection")
    [row] = TaskBoard(pg_url).rows(spec.name)
    assert row.status == PENDING and row.worker is None and row.error is None, row
    before = finished_configs(pg_url, task)
    summary = run_study(spec, executor=FAKE)
    assert summary.complete and not summary.failed
    after = finished_configs(pg_url, task)
    assert after[: len(before)] == before and len(after) == 8
    assert len({tuple(sorted(c.items())) for c in after}) == 8  # no trial repeated
    assert "Store check" not in write_report(spec, tmp_path / "report").markdown.read_text(encoding="utf-8")


def test_a_claim_whose_connection_is_ended_is_retried(
    pg_url: str, terminate_before: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The task board's writes go through its retry helper: a claim cut by the server is run again on a
    new connection, and the study runs through."""
    from tests.test_studies import FAKE, write_study
    from tuner.studies import load_study, run_study

    spec = load_study(write_study(tmp_path, n_m=1, budget=3), storage=pg_url, check_kernels=False)
    fired = terminate_before("UPDATE tuner_study_tasks", 1)  # the first: the claim
    caplog.set_level(logging.INFO, logger="tuner.studies._board")
    summary = run_study(spec, executor=FAKE)
    assert fired and summary.complete and not summary.failed
    assert any("claiming a task" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)


# ---- (d) a server that cannot be reached -------------------------------------------------------------
def _unreachable(url: str, how: str) -> str:
    """The test's URL pointed at a port where nothing listens, or at a database that does not exist."""
    if how == "nothing listens":
        return url.replace("127.0.0.1:5432", "127.0.0.1:1", 1)
    return url.rsplit("/", 1)[0] + "/tuner_no_such_database"


def unreachable_message(exc: BaseException | None, url: str, what: str) -> str:
    from tuner.store import StoreUnreachable

    assert isinstance(exc, StoreUnreachable), repr(exc)
    msg = str(exc)
    shown = f"{url.split('://', 1)[0]}://{url.split('@', 1)[1]}"
    assert msg.startswith(f"cannot connect to store {shown} ({what}): "), msg
    assert ("Connection refused" in msg or "does not exist" in msg) and "connect_timeout=10 s" in msg, msg
    assert "s3cret-pw" not in msg and "\n" not in msg and "sqlalche.me" not in msg, msg
    return msg


@pytest.mark.parametrize("how", ["nothing listens", "no such database"])
def test_a_store_that_cannot_be_reached_raises_one_line_naming_it(
    pg_url: str, how: str, fresh_runtime: None, caplog: pytest.LogCaptureFixture, capsys: Any, tmp_path: Path
) -> None:
    """Was: a StoreError carrying SQLAlchemy's multi-line OperationalError ("(psycopg2.OperationalError)
    ... Background on this error at ...") for each entry point."""
    import tuner
    from tests.test_optimize import grid_space
    from tests.test_studies import FAKE, cli, write_study
    from tuner.store import ResultStore

    url = _unreachable(pg_url, how)
    with pytest.raises(Exception) as got:
        ResultStore(url)
    unreachable_message(got.value, url, "opening the store")
    with pytest.raises(Exception) as got:
        tuner.optimize(grid_space(), lambda c: 1.0, budget=2, storage=url, strategy="random")
    unreachable_message(got.value, url, "opening the store")
    # the CLI: one line, exit 1
    path = write_study(tmp_path, n_m=1, budget=2)
    capsys.readouterr()
    assert cli("study", "run", str(path), "--storage", url, "--executor", FAKE, "--quiet") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("tuner: failed: StoreUnreachable: cannot connect to store "), (
        err
    )
    assert "s3cret-pw" not in err, err
    # a decorated function goes on in memory, with one warning naming the store
    caplog.set_level(logging.WARNING)
    f, runs = _decorated(url)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    assert runs and f.tuner.stats["tuned"] == 1
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("tuner")]
    assert len(warned) == 1 and "cannot connect to store" in warned[0] and "s3cret-pw" not in warned[0], (
        warned
    )


@pytest.fixture
def refuse_connections(pg_url: str, terminate: Callable[[], int]) -> Iterator[Callable[[bool], None]]:
    """refuse_connections(True): the test's database takes no new connections (as a server that is down
    or restarting) and its open ones are ended; False: it takes them again."""
    db = pg_url.rsplit("/", 1)[1]
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")

    def refuse(on: bool) -> None:
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS {"false" if on else "true"}'))
        if on:
            terminate()

    yield refuse
    refuse(False)
    admin.dispose()


def test_optimize_whose_server_goes_away_says_it_cannot_connect_and_resumes(
    pg_url: str, refuse_connections: Callable[[bool], None]
) -> None:
    """The server goes away between two trials (a restart that takes a while): the next write cannot
    connect. Was: Optuna's StorageInternalError or SQLAlchemy's OperationalError from deep inside."""
    calls: list[int] = []

    def objective(c: dict[str, Any]) -> float:
        calls.append(1)
        if len(calls) == 3:
            refuse_connections(True)
        return float(c["a"] + c["b"])

    with pytest.raises(Exception) as got:
        _run(pg_url, 6, objective)
    from tuner.store import StoreUnreachable

    assert isinstance(got.value, StoreUnreachable), repr(got.value)
    msg = str(got.value)
    assert "not currently accepting connections" in msg and "s3cret-pw" not in msg and "\n" not in msg, msg
    refuse_connections(False)
    _run(pg_url, 6)  # the same call again resumes the study
    _consistent(pg_url, 6)


# ---- (e) a lease's finish or renewal cut ----------------------------------------------------------------
def _backend_pid(cursor: Any) -> int:
    """The server process of a DB-API cursor's connection (psycopg2 or psycopg 3)."""
    dbapi = cursor.connection
    info = getattr(dbapi, "info", None)
    pid = getattr(info, "backend_pid", None)
    return int(pid if pid is not None else dbapi.get_backend_pid())


def _terminate_when(match: Callable[[str], bool]) -> tuple[list[str], Callable[[], None]]:
    """Just before the first statement that matches runs, end that statement's connection only (and wait
    until the server has removed it). Only that one: the lease's renewal runs in its own thread, and
    ending every backend there also cut whatever the worker's thread was writing at that moment, a
    different case (a trial's write cut), so the test failed now and then."""
    fired: list[str] = []
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and match(statement):
            fired.append(statement)
            pid = _backend_pid(cursor)
            with admin.connect() as c:
                assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
                deadline = time.monotonic() + 5
                while c.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
                ).scalar_one():
                    assert time.monotonic() < deadline, "the terminated backend did not go away"
                    time.sleep(0.02)

    def remove() -> None:
        event.remove(Engine, "before_cursor_execute", before)
        admin.dispose()

    event.listen(Engine, "before_cursor_execute", before)
    return fired, remove


@pytest.mark.parametrize("which", ["finish", "renew"])
def test_a_finish_or_renewal_whose_connection_is_ended_is_retried(
    pg_url: str, tmp_path: Path, which: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the connection under the worker's "mark done" (or a lease renewal): the board runs
    it again on a new connection, under the same lease token, so the study completes in one run with each
    trial counted once. Was: the worker stopped with StoreConnectionLost and the task waited for another
    run (a finish), or a warning per cut renewal."""
    from tests.test_studies import FAKE, finished_configs, write_study
    from tuner.studies import DONE, TaskBoard, load_study, run_study, write_report

    spec = load_study(write_study(tmp_path, n_m=1, budget=4), storage=pg_url, check_kernels=False)
    [task] = spec.tasks
    if which == "finish":  # the only UPDATE of the board that writes finished_at and a result

        def match(s: str) -> bool:
            return s.startswith("UPDATE tuner_study_tasks") and "result=" in s.replace(" ", "")
    else:  # a renewal writes the heartbeat and the lease's expiry, not the status

        def match(s: str) -> bool:
            return s.startswith("UPDATE tuner_study_tasks SET lease_expires_at")

    caplog.set_level(logging.INFO)
    # A lease long enough that the cut and its retry (a new connection, under a loaded CI machine) end
    # well inside it (at 2 s, a suite run beside other work saw the lease lapse and the task claimed a
    # second time), and, for a renewal to be cut, trials slow enough that the run outlasts the first
    # renewal (every lease / 4); the finish comes once, whatever the trials take.
    if which == "renew":
        monkeypatch.setenv("FAKE_TRIAL_SLEEP", "0.6")
    fired, remove = _terminate_when(match)
    try:
        summary = run_study(spec, executor=FAKE, lease_s=6.0)
    finally:
        remove()
    assert fired, "the statement did not run"
    assert summary.complete and not summary.failed, summary
    [row] = TaskBoard(pg_url).rows(spec.name)
    assert row.status == DONE and row.trials_done == 4 and row.attempts == 1, row
    configs = finished_configs(pg_url, task)
    assert len(configs) == 4 and len({tuple(sorted(c.items())) for c in configs}) == 4
    assert "Store check" not in write_report(spec, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert not [r for r in caplog.records if r.name.startswith("tuner") and r.levelno >= logging.WARNING]
    assert [
        r for r in caplog.records if "retrying" in r.getMessage() and "the server ended" in r.getMessage()
    ]
