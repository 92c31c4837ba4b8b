"""A PostgreSQL server that refuses connections because a connection limit is reached ("too many connections
for role ...", "... for database ...", "sorry, too many clients already": SQLSTATE 53300), as it does when
a fleet of workers each hold a pool. Real server (127.0.0.1:5432, trust auth; tests/pg.py): a fresh role
that is not a superuser (superusers are exempt) owns a fresh database, and its `CONNECTION LIMIT` is set
without a restart.

- A refusal raises `StoreConnectionLimit` (a `StoreUnreachable`), one line naming the limit and what to do,
  after `TUNER_PG_CONNECT_WAIT` seconds of trying again; a slot that frees meanwhile is taken.
- One process holds a bounded number of connections however many tasks it runs: Optuna's storage is
  shared per URL (one RDBStorage, and a pool of its own, per `optimize` call kept connections open until
  the garbage collector found it).
- A study worker refused mid-run stops with that line (exit 1), and the next run finishes its task
  without losing or repeating a finished trial."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from tests.pg import ADMIN_URL, DRIVERS, LimitedDatabase, limited_database

pytestmark = pytest.mark.postgres


@pytest.fixture(params=DRIVERS)
def limited(request: pytest.FixtureRequest) -> Iterator[LimitedDatabase]:
    yield from limited_database(request.param)


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    from tuner.runtime._sources import close_stores

    close_stores()
    yield
    close_stores()


def _limit_message(
    exc: BaseException | None, limited: LimitedDatabase, what: str, *, kind: str = "role"
) -> str:
    from tuner.store import StoreConnectionLimit

    assert isinstance(exc, StoreConnectionLimit), repr(exc)
    return _limit_text(str(exc), limited, what, kind=kind)


def _limit_text(msg: str, limited: LimitedDatabase, what: str, *, kind: str = "role") -> str:
    shown = f"{limited.url.split('://', 1)[0]}://{limited.url.split('@', 1)[1]}"
    assert msg.startswith(f"cannot connect to store {shown} ({what}): "), msg
    assert "a connection limit is reached" in msg and f'too many connections for {kind} "' in msg, msg
    # what to do: fewer workers, a smaller pool, a higher limit, a pooler; and not a timeout's wording
    for hint in ("fewer worker processes", "TUNER_PG_POOL_SIZE", "CONNECTION LIMIT", "max_connections"):
        assert hint in msg, (hint, msg)
    assert "connect_timeout" not in msg and "\n" not in msg and "sqlalche.me" not in msg, msg
    return msg


@pytest.mark.parametrize("kind", ["role", "database"])
def test_a_connection_refused_for_a_limit_is_named_so_with_what_to_do(
    limited: LimitedDatabase, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: `StoreUnreachable` with libpq's line and "(connect_timeout=10 s)", as if the server did not
    answer in time, and nothing about the limit or what to do."""
    from tuner.store import ResultStore
    from tuner.studies import TaskBoard

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "0")
    (limited.limit_role if kind == "role" else limited.limit_database)(0)
    with pytest.raises(Exception) as got:
        ResultStore(limited.url)
    _limit_message(got.value, limited, "opening the store", kind=kind)
    with pytest.raises(Exception) as got:
        TaskBoard(limited.url)  # its retries are for a server that restarts, not for a limit
    _limit_message(got.value, limited, "opening the task board", kind=kind)


def test_the_cli_and_a_decorated_function_on_a_full_server(
    limited: LimitedDatabase,
    monkeypatch: pytest.MonkeyPatch,
    fresh_runtime: None,
    caplog: pytest.LogCaptureFixture,
    capsys: Any,
    tmp_path: Path,
) -> None:
    """`tuner study run` prints the one line and exits 1; a decorated function goes on in memory with one
    warning that names the limit."""
    from tests.test_store_terminated import X, _decorated
    from tests.test_studies import FAKE, cli, write_study

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "0")
    limited.limit_role(0)
    path = write_study(tmp_path, n_m=1, budget=2)
    capsys.readouterr()
    assert cli("study", "run", str(path), "--storage", limited.url, "--executor", FAKE, "--quiet") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tuner: failed: StoreConnectionLimit: cannot connect to store "), err
    _limit_text(err.removeprefix("tuner: failed: StoreConnectionLimit: "), limited, "opening the task board")
    caplog.set_level(logging.WARNING)
    f, runs = _decorated(limited.url)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)
    assert runs and f.tuner.stats["tuned"] == 1
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("tuner")]
    assert len(warned) == 1 and "a connection limit is reached" in warned[0], warned


def test_a_decorated_function_waits_for_a_slot_once_not_at_every_step_of_every_miss(
    limited: LimitedDatabase,
    monkeypatch: pytest.MonkeyPatch,
    fresh_runtime: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store is open (the first key is tuned and stored), then its idle connections are gone and the
    server's limit is reached. Was: every read and write of every new key's miss connected anew and waited
    out TUNER_PG_CONNECT_WAIT (four waits per key: 40 s per new key at the default 10 s). Now the first
    refusal stops the process using the store for STORE_RETRY_S, as a read that timed out does: one wait,
    and the calls go on in memory."""
    from tests.test_store_terminated import X, _decorated
    from tuner.runtime._sources import STORE_RETRY_S
    from tuner.storage import engine_for

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "0.3")
    f, runs = _decorated(limited.url)
    np.testing.assert_array_equal(f(X, 1), X * 2.0)  # tuned and stored
    engine_for(limited.url).pool.dispose()  # its idle connections closed (a restart, the server's idle end)
    limited.limit_role(0)
    caplog.set_level(logging.INFO, logger="tuner")
    for n in (2, 3, 4):
        np.testing.assert_array_equal(f(X, n), X * 2.0)
    assert f.tuner.stats["tuned"] == 4, f.tuner.stats
    waits = [r for r in caplog.records if "waiting up to 0.3 s for a free slot" in r.getMessage()]
    assert len(waits) == 1, [r.getMessage() for r in waits]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "a connection limit is reached" in warned[0], warned
    assert f"it is not used for {STORE_RETRY_S:g} s" in warned[0], warned


def _stuck(reader: threading.Thread, logger: logging.Logger) -> str:
    """Why the waiting read was not seen: where the reader is, and the state of the logger that reports the
    wait (a CI run once failed here without a trace)."""
    import traceback

    frame = sys._current_frames().get(reader.ident or -1)
    where = "".join(traceback.format_stack(frame)) if frame is not None else "(the reader has ended)"
    return (
        f"the read neither waited nor ended; logger disabled={logger.disabled} level={logger.level} "
        f"handlers={logger.handlers} logging.disable={logging.root.manager.disable}; the reader is at:\n{where}"
    )


def test_a_slot_that_frees_within_the_wait_is_taken(
    limited: LimitedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role's one slot is held by another client; tuner needs a new connection and waits for it
    (`TUNER_PG_CONNECT_WAIT`), the other client lets go, and tuner's read succeeds. Was: it failed at once."""
    from tuner.storage import engine_for
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "120")  # far longer than the test needs: never reached
    store = ResultStore(limited.url)
    engine_for(limited.url).dispose()  # no idle connection left: the next read connects
    limited.limit_role(1)
    other = create_engine(limited.url)
    holder = other.connect()  # the one slot
    refused = threading.Event()

    got: list[Any] = []

    def read() -> None:
        try:
            got.append(store.count())
        except BaseException as exc:  # noqa: BLE001 - reported below
            got.append(exc)
        finally:
            refused.set()

    with _engine_log(_WaitSeen(refused)) as logger:
        try:
            reader = threading.Thread(target=read)
            reader.start()
            assert refused.wait(60), _stuck(reader, logger)
            holder.close()
            other.dispose()  # the slot is free now
            reader.join(120)
        finally:
            holder.close()
            other.dispose()
    assert got == [0], got


# The server's refusals for a connection limit (`tuner.storage._refusals`), and other errors that end a
# connection's start, which are not
_LIMIT_MSGIDS = (
    "sorry, too many clients already",
    'too many connections for role "%s"',
    'too many connections for database "%s"',
    "remaining connection slots are reserved for non-replication superuser connections",
)
_OTHER_MSGIDS = (
    'password authentication failed for user "%s"',
    'database "%s" does not exist',
    'role "%s" does not exist',
    'role "%s" is not permitted to log in',
    'permission denied for database "%s"',
    "the database system is starting up",
    "the database system is shutting down",
)


def test_a_refusal_in_the_servers_language_is_one_for_a_limit() -> None:
    """A server whose own `lc_messages` is not English refuses a connection for a limit in its language, and
    libpq gives no SQLSTATE for it: each translation in the server's own message catalogs, as the server
    writes it (its translated severity) inside libpq's line, is recognised as a refusal for a limit, and
    the other errors that end a connection's start are not. Was: English only, so a German, Japanese, ...
    server's refusal failed at once as an unreachable server, never waited for. (No server here can send
    a translated refusal: it writes it before the role's, database's or client's `lc_messages` apply, in
    its configuration's, which only an installed locale may set.)"""
    import gettext
    import glob

    import psycopg2

    from tests.pg import _admin_or_skip
    from tuner.storage._engine import connection_limit_refusal

    admin = _admin_or_skip(None)
    try:
        with admin.connect() as c:
            localedir = c.execute(text("SELECT setting FROM pg_config WHERE name = 'LOCALEDIR'")).scalar()
            major = int(c.execute(text("SHOW server_version_num")).scalar_one()) // 10000
    finally:
        admin.dispose()
    files = sorted(
        f
        for name in (f"postgres-{major}.mo", "postgres.mo")
        for f in glob.glob(os.path.join(localedir or "", "*", "LC_MESSAGES", name))
    )
    if not files:
        pytest.skip(f"the server's message catalogs are not readable here ({localedir})")
    seen = 0
    for path in files:
        with open(path, "rb") as fh:
            catalog = gettext.GNUTranslations(fh)
        fatal = catalog.gettext("FATAL")
        for msgid in _LIMIT_MSGIDS + _OTHER_MSGIDS:
            said = catalog.gettext(msgid)
            if said == msgid:
                continue  # not translated, or not a message of this version
            said = said.replace("%s", "tuner_lim_0a1b2c")
            exc = psycopg2.OperationalError(
                f'connection to server at "127.0.0.1", port 5432 failed: {fatal}:  {said}\n'
            )
            assert connection_limit_refusal(exc) is (msgid in _LIMIT_MSGIDS), (path, msgid, str(exc))
            seen += msgid in _LIMIT_MSGIDS
    assert seen, files


# PostgreSQL 16's reserved-slot refusals (src/backend/utils/init/postinit.c), as its own catalogs
# (postgres/postgres src/backend/po/<lang>.po, 16/17) translate them, with what the server puts for `%s`
_PG16_RESERVED_MSGIDS = {
    "remaining connection slots are reserved for roles with the %s attribute": "SUPERUSER",
    'remaining connection slots are reserved for roles with privileges of the "%s" role': (
        "pg_use_reserved_connections"
    ),
}
_PG16_RESERVED = {
    "de": (
        "die verbleibenden Verbindungen sind für Rollen mit dem %s-Attribut reserviert",
        "die verbleibenden Verbindungen sind für Rollen mit den Privilegien der Rolle »%s« reserviert",
    ),
    "es": (
        "las conexiones restantes están reservadas a roles con el atributo %s",
        "las conexiones restantes están reservadas a roles con privilegios del rol «%s»",
    ),
    "ja": (
        "残りの接続枠は%s属性を持つロールのために予約されています",
        '残りの接続枠は"%s"ロールの権限を持つロールのために予約されています',
    ),
    "ka": (
        "დარჩენილი მიერთების სლოტები დაცულია %s ატრიბუტის მქონე როლებისთვის",
        "დარჩენილი მიერთების სლოტები დაცულია %s როლის პრივილეგიების მქონე როლებისთვის",
    ),
    "sv": (
        "resterande anslutningsslottar är reserverade för roller med attributet %s",
        'resterande anslutningsslottar är reserverade för roller med rättigheter från rollen "%s"',
    ),
}


@pytest.mark.parametrize("lang", sorted(_PG16_RESERVED))
def test_a_pg16_reserved_slot_refusal_in_the_servers_language_is_one_for_a_limit(lang: str) -> None:
    """PostgreSQL 16 refuses a connection for the slots left reserved with one of two new messages (roles
    with the SUPERUSER attribute; roles with the privileges of pg_use_reserved_connections), `%s` filled in
    by the server: each translation, as libpq's line carries it, is a refusal for a limit. Was: only
    PostgreSQL 15's wording, so a German, Spanish, ... 16+ server's refusal failed at once as an unreachable
    server, never waited for."""
    import psycopg2

    from tuner.storage._engine import connection_limit_refusal
    from tuner.storage._refusals import localized_limit_refusal

    for said, filled in zip(_PG16_RESERVED[lang], _PG16_RESERVED_MSGIDS.values(), strict=True):
        assert "%s" in said
        message = said.replace("%s", filled)
        exc = psycopg2.OperationalError(
            f'connection to server at "127.0.0.1", port 5432 failed: FATAL:  {message}\n'
        )
        assert localized_limit_refusal(str(exc)), (lang, message)
        assert connection_limit_refusal(exc), (lang, message)


class _WaitSeen(logging.Handler):
    """Sets `event` when tuner logs that a new connection waits for a free slot."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting up to" in record.getMessage():
            self.event.set()


@contextlib.contextmanager
def _engine_log(handler: logging.Handler) -> Iterator[logging.Logger]:
    """`handler` on the logger of tuner's engines, at INFO (where the wait for a slot is logged), while
    inside; the logger as it was after."""
    logger = logging.getLogger("tuner.storage._engine")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _into(got: dict[str, Any], name: str, done: threading.Event, call: Callable[[], Any]) -> None:
    """A thread's body: `got[name]` is what `call()` returned, or what it raised; `done` is set after."""
    try:
        got[name] = call()
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        got[name] = exc
    finally:
        done.set()


def test_a_connection_waiting_for_a_slot_holds_up_no_other_store(
    limited: LimitedDatabase, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One thread opens Optuna's storage on a PostgreSQL store whose role is at its limit and waits for a
    free slot (`TUNER_PG_CONNECT_WAIT`). Another thread opens Optuna's storage on a SQLite file and on
    another PostgreSQL store meanwhile, and is done before the first gets its slot. Was: the first waited
    holding the process-wide schema lock (`schema_lock`'s) and the lock of the shared Optuna storages, so
    every other store's Optuna storage in the process waited as long (up to TUNER_PG_CONNECT_WAIT)."""
    from tests.pg import fresh_database
    from tuner.storage import engine_for, optuna_storage, sqlite_url
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "120")  # far longer than the test: the slot is freed below
    ResultStore(limited.url)
    engine_for(limited.url).dispose()  # no idle connection left: Optuna's storage connects anew
    other_pg = fresh_database()
    other_url = next(other_pg)
    limited.limit_role(1)
    holder_engine = create_engine(limited.url)
    holder = holder_engine.connect()  # the one slot
    refused, first_done, others_done = threading.Event(), threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    first = threading.Thread(
        target=_into, args=(got, "first", first_done, lambda: optuna_storage(limited.url))
    )
    others_urls = (sqlite_url(tmp_path / "s.db"), other_url)
    others = threading.Thread(
        target=_into, args=(got, "others", others_done, lambda: [optuna_storage(u) for u in others_urls])
    )
    with _engine_log(_WaitSeen(refused)) as logger:
        try:
            first.start()
            assert refused.wait(60) or first_done.is_set(), _stuck(first, logger)
            assert not first_done.is_set(), got
            others.start()
            # on the old code the others wait for the first thread's slot: not done in 30 s, not done at all
            others_done.wait(30)
            assert others_done.is_set() and not first_done.is_set(), (others_done.is_set(), got)
            assert not isinstance(got["others"], BaseException), got["others"]
        finally:
            limited.limit_role(-1)  # the first thread needs two connections (schema lock, Optuna's engine)
            holder.close()
            holder_engine.dispose()
            first.join(120)
            others.join(120)
            with contextlib.suppress(StopIteration):
                next(other_pg)  # drops the other database
    assert not isinstance(got["first"], BaseException), got["first"]


def test_a_store_that_waits_for_a_slot_to_open_holds_up_no_other_decorated_function(
    limited: LimitedDatabase, monkeypatch: pytest.MonkeyPatch, fresh_runtime: None, tmp_path: Path
) -> None:
    """One thread's decorated function opens its PostgreSQL store while the role is at its limit and waits
    for a free slot (`TUNER_PG_CONNECT_WAIT`). Another thread's decorated function on a SQLite store tunes,
    stores and returns meanwhile. Was: the runtime opened every store under one process-wide lock
    (`open_store`'s), so every decorated function's store look-up in the process waited as long (up to
    TUNER_PG_CONNECT_WAIT), SQLite stores too. A second thread of the waiting store gets the same store
    once it is open (one `ConfigCache` per store)."""
    from tests.test_store_terminated import X, _decorated
    from tuner.runtime._sources import open_store
    from tuner.storage import engine_for, sqlite_url
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "120")  # far longer than the test: the slot is freed below
    ResultStore(limited.url)  # its schema made: opening it again needs one connection
    engine_for(limited.url).dispose()  # no idle connection left: opening the store connects anew
    limited.limit_role(1)
    holder_engine = create_engine(limited.url)
    holder = holder_engine.connect()  # the one slot
    f_pg, _ = _decorated(limited.url)
    f_lite, lite_runs = _decorated(sqlite_url(tmp_path / "s.db"))
    refused, first_done, lite_done = threading.Event(), threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    first = threading.Thread(target=_into, args=(got, "first", first_done, lambda: f_pg(X, 1)))
    same = threading.Thread(
        target=_into,
        args=(got, "same", threading.Event(), lambda: open_store(limited.url, create=True)),
    )
    lite = threading.Thread(target=_into, args=(got, "lite", lite_done, lambda: f_lite(X, 1)))
    with _engine_log(_WaitSeen(refused)) as logger:
        try:
            first.start()
            assert refused.wait(60) or first_done.is_set(), _stuck(first, logger)
            assert not first_done.is_set(), got
            same.start()
            lite.start()
            # on the old code the SQLite function waits for the first thread's slot: not done in 30 s
            lite_done.wait(30)
            assert lite_done.is_set() and not first_done.is_set(), (lite_done.is_set(), got)
            assert not isinstance(got["lite"], BaseException), got["lite"]
            np.testing.assert_array_equal(got["lite"], X * 2.0)
            assert lite_runs and f_lite.tuner.stats["tuned"] == 1, f_lite.tuner.stats
            assert ResultStore(sqlite_url(tmp_path / "s.db")).count() >= 1  # stored, not kept in memory only
        finally:
            limited.limit_role(-1)
            holder.close()
            holder_engine.dispose()
            first.join(120)
            same.join(120)
            lite.join(120)
    assert not isinstance(got["first"], BaseException), got["first"]
    np.testing.assert_array_equal(got["first"], X * 2.0)
    assert f_pg.tuner.stats["tuned"] == 1, f_pg.tuner.stats
    assert got["same"] is not None and got["same"] is open_store(limited.url, create=True), got


def test_a_store_that_fails_to_open_is_kept_by_no_thread_and_opened_again_later(
    limited: LimitedDatabase, monkeypatch: pytest.MonkeyPatch, fresh_runtime: None
) -> None:
    """Two threads open the same store at its limit: the one that waits for a slot fails
    (`TUNER_PG_CONNECT_WAIT`), and the other, waiting for that opening, gets no store without waiting for
    a slot again. Nothing of the failed opening is kept: once the retry pause is over, a call opens it."""
    import tuner.runtime._sources as sources
    from tuner.storage import engine_for
    from tuner.store import ResultStore

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "0.5")
    ResultStore(limited.url)
    engine_for(limited.url).dispose()  # no idle connection left: opening the store connects anew
    limited.limit_role(0)
    waits = threading.Event()
    got: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            got[name] = sources.open_store(limited.url, create=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            got[name] = exc

    counted: list[str] = []

    class Count(_WaitSeen):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting up to" in record.getMessage():
                counted.append(record.getMessage())
            super().emit(record)

    first, second = (
        threading.Thread(target=run, args=("first",)),
        threading.Thread(target=run, args=("second",)),
    )
    with _engine_log(Count(waits)) as logger:
        first.start()
        assert waits.wait(60) or not first.is_alive(), _stuck(first, logger)
        second.start()
        first.join(60)
        second.join(60)
    assert got == {"first": None, "second": None}, got
    assert len(counted) == 1, counted  # the second thread did not wait for a slot of its own
    assert limited.url not in sources._dbs
    limited.limit_role(-1)
    monkeypatch.setattr(sources, "STORE_RETRY_S", 0.0)  # the retry pause is over
    again = sources.open_store(limited.url, create=True)
    assert again is not None and again is sources.open_store(limited.url, create=True)


@pytest.mark.parametrize("pool_size, limit", [(None, 6), ("1", 4)])
def test_a_study_worker_holds_few_connections_however_many_tasks_it_runs(
    limited: LimitedDatabase,
    pool_size: str | None,
    limit: int,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Each task's `optimize(storage=url)` opened a new Optuna RDBStorage with a pool of its own, whose
    connections stayed open until the garbage collector found it: one worker held 22 connections after 18
    tasks, so a fleet ran into the server's limit. Optuna's storage is now one per URL and process. Under
    a limit of 6 sessions for the role, a study of 8 tasks (preparation and worker in this process)
    finishes; with TUNER_PG_POOL_SIZE=1 (two engines, each at most 2 connections) under a limit of 4. The
    garbage collector is off, so nothing depends on when it runs."""
    from tests.test_studies import FAKE, write_study
    from tuner.studies import DONE, load_study, run_study

    monkeypatch.setenv("TUNER_PG_CONNECT_WAIT", "0")  # a refusal fails at once
    if pool_size is not None:
        monkeypatch.setenv("TUNER_PG_POOL_SIZE", pool_size)
    limited.limit_role(limit)
    spec = load_study(write_study(tmp_path, n_m=4, n_k=2, budget=2), storage=limited.url, check_kernels=False)
    enabled = gc.isenabled()
    gc.disable()
    try:
        summary = run_study(spec, executor=FAKE)
    finally:
        if enabled:
            gc.enable()
    assert summary.counts[DONE] == 8, summary.counts
    assert limited.sessions() <= limit


@pytest.mark.parametrize("name", ["TUNER_PG_POOL_SIZE", "TUNER_PG_CONNECT_WAIT"])
@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_pool_size_or_wait_is_bad_input(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.errors import BadInput
    from tuner.storage import engine_kwargs, pg_connect_wait_s

    monkeypatch.setenv(name, value)
    with pytest.raises(BadInput, match=name):
        engine_kwargs("postgresql+psycopg2://u@127.0.0.1:5432/db")
        pg_connect_wait_s()


def test_a_worker_refused_mid_run_stops_with_the_line_and_loses_no_trial(
    limited: LimitedDatabase, tmp_path: Path
) -> None:
    """A worker process whose pool needs a new connection after its second trial, on a server whose limit
    is reached, stops with the one `StoreConnectionLimit` line (exit 1). With the limit lifted, the next
    run finishes the study: every task has exactly its budget of distinct trials, and no trial finished
    before the stop is measured again."""
    from tests.test_studies import REPO, finished_configs, write_study
    from tuner.studies import DONE, TaskBoard, load_study, prepare_study

    budget = 4
    path = write_study(tmp_path, n_m=2, budget=budget)
    spec = prepare_study(load_study(path, storage=limited.url, check_kernels=False))
    log_file = tmp_path / "evals.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_EVAL_LOG": str(log_file),
        "FAKE_LIMIT_AFTER": "2",
        "FAKE_LIMIT_ROLE": limited.role,
        "FAKE_LIMIT_ADMIN": ADMIN_URL,
        "TUNER_PG_CONNECT_WAIT": "0",
        "TUNER_STUDY_STORAGE": limited.url,
    }
    cmd = [sys.executable, "-m", "tuner.cli", "study", "run", str(path), "--workers", "1", "--quiet"]

    def run(executor: str) -> subprocess.CompletedProcess[str]:
        argv = [*cmd, "--no-report", "--executor", f"tests._study_fake:{executor}"]
        return subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, encoding="utf-8"
        )

    first = run("limit_executor")
    assert first.returncode == 1, first.stderr
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("tuner: failed: StoreConnectionLimit: cannot connect to store "), first.stderr
    assert "a connection limit is reached" in last and "Traceback" not in first.stderr, first.stderr
    limited.limit_role(-1)
    again = run("executor")
    assert again.returncode == 0, again.stderr
    board = TaskBoard(limited.url)
    assert all(r.status == DONE for r in board.rows(spec.name))
    evals: Counter[tuple[str, str]] = Counter()
    for line in log_file.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        evals[(d["task"], json.dumps(d["config"], sort_keys=True))] += 1
    for t in spec.tasks:
        keys = [json.dumps(c, sort_keys=True) for c in finished_configs(limited.url, t)]
        assert len(keys) == len(set(keys)) == budget, (t.key, keys)
    # only the trial whose write was refused may have been measured twice
    assert sum(n - 1 for n in evals.values()) <= 1, evals


def test_local_workers_parent_holds_no_idle_connection_while_they_run(
    limited: LimitedDatabase, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`run_study(..., workers=2)` (`tuner study run --workers 2`) prepares the study and then only waits
    for its worker processes: the connections its preparation left in its pools (tuner's engine and
    Optuna's storage) stayed open on the server for the whole run, counted against its limit."""
    from tests.test_studies import REPO, write_study
    from tuner.storage import _migrate, engine_of
    from tuner.studies import DONE, load_study, run_study

    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FAKE_TRIAL_SLEEP", "0.2")
    spec = load_study(write_study(tmp_path, n_m=2, budget=3), storage=limited.url, check_kernels=False)
    watcher = create_engine(limited.url)  # reads the board without using this process's pools
    idle: list[int] = []
    stop = threading.Event()

    def parents_idle() -> int:
        pools = [e.pool for e in [engine_of(limited.url)] if e is not None]
        pools += [s.engine.pool for (u, _), s in list(_migrate._optuna_storages.items()) if u == limited.url]
        return sum(p.checkedin() for p in pools)

    def watch() -> None:
        with watcher.connect() as c:
            while not stop.is_set():
                q = "SELECT count(*) FROM tuner_study_tasks WHERE status IN ('running', 'done')"
                try:
                    claimed = c.execute(text(q)).scalar_one()  # a worker process has claimed a task
                except ProgrammingError:  # the preparation has not made the table yet
                    claimed = 0
                if claimed:
                    idle.append(parents_idle())
                    return
                c.rollback()
                stop.wait(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        summary = run_study(spec, workers=2, executor="tests._study_fake:executor")
    finally:
        stop.set()
        thread.join()
        watcher.dispose()
    assert summary.counts[DONE] == 2, summary.counts
    assert idle == [0], idle
