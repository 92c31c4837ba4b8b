"""tuner's PostgreSQL store behind a real PgBouncer (the `pgbouncer` binary, started by each test with an
ini file of its own in a temporary folder, on a free port, and stopped after it; trust auth) in front of
the real server on 127.0.0.1:5432, with both drivers.

- `pool_mode = session`: every flow of a fleet works as on a direct connection: schema creation, a study
  of `tuner study run --workers 2` (task board leases, Optuna's trials, measurements), a decorated
  function's tuning (its claim and its cache entry), and a server connection PgBouncer loses (a backend
  ended under it) is replaced unseen.
- `pool_mode = transaction`: refused when the store is opened, with one `StoreError` that names
  `pool_mode=session`. It used to open and run: psycopg 3's prepared statements failed a study's tasks
  ("prepared statement "_pg3_0" already exists"), and with psycopg2 the schema lock (a session advisory
  lock) and the connections' timeouts (session settings) landed on server sessions that other clients
  then got (tuner/storage/_pooler.py).

Skipped where `pgbouncer` is not installed (`.ci/run` installs it where apt can)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.pg import ADMIN_URL, DRIVERS, fresh_database

# Debian puts it in /usr/sbin, which a user's PATH may lack
PGBOUNCER = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        PGBOUNCER is None, reason="pgbouncer is not installed (`apt-get install pgbouncer`; .ci/run tries)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pgbouncer(folder: Path, mode: str, extra: str = "") -> Iterator[int]:
    """A PgBouncer in `pool_mode = mode` in front of the test server, listening on a free port (yielded);
    its ini (`extra`: more lines of its [pgbouncer] section), user list and log in `folder`. Stopped
    (SIGTERM, then SIGKILL) afterwards. `server_check_delay = 0`, as docs/production.md advises: a server
    connection ended while idle in PgBouncer's pool is not handed to a new client (whose first statement,
    under load, then failed with "terminating connection due to administrator command")."""
    assert PGBOUNCER is not None
    server = ADMIN_URL.split("@", 1)[1].rsplit("/", 1)[0]
    host, _, port = server.partition(":")
    listen = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # run as root, it drops to the postgres user (below), which reads the ini
    (folder / "users.txt").write_text('"postgres" ""\n', encoding="utf-8")
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        f"[databases]\n* = host={host} port={port or 5432}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
        f"listen_port = {listen}\nunix_socket_dir =\nauth_type = trust\nauth_file = {folder}/users.txt\n"
        f"pool_mode = {mode}\nmax_client_conn = 200\nserver_check_delay = 0\n"
        f"{extra or 'default_pool_size = 40'}\n",
        encoding="utf-8",
    )
    log = (folder / "pgbouncer.log").open("w", encoding="utf-8")
    # PgBouncer refuses to run as root: it then runs as the server's user
    cmd = [PGBOUNCER, *(["-u", "postgres"] if os.geteuid() == 0 else []), str(ini)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen), 0.2):
                break
            assert proc.poll() is None, (folder / "pgbouncer.log").read_text(encoding="utf-8")[-2000:]
            assert time.monotonic() < deadline, "pgbouncer did not listen within 10 s"
            time.sleep(0.05)
        yield listen
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def behind(tmp_path: Path, mode: str, driver: str, extra: str = "") -> Iterator[str]:
    """The URL (naming `driver`) of a fresh database of the test server, through a PgBouncer in `mode`
    (`extra`: `pgbouncer`'s)."""
    from tuner.storage import engine_of

    gen = fresh_database(driver)
    direct = next(gen)
    try:
        with pgbouncer(tmp_path / "pgbouncer", mode, extra) as port:
            url = direct.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
            assert url != direct
            try:
                yield url
            finally:
                eng = engine_of(url)
                if eng is not None:
                    eng.dispose()
    finally:
        gen.close()


def _direct(url: str) -> str:
    return (
        url.split("://", 1)[0]
        + "://"
        + ADMIN_URL.split("://", 1)[1].rsplit("/", 1)[0]
        + "/"
        + url.rsplit("/", 1)[1]
    )


def _run_study(
    tmp_path: Path, url: str, budget: int, **env: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`tuner study run --workers 2` of a study of three tasks and `budget` trials each, stored at `url`
    (with the fake executor; `env` added to the environment): its file and the finished run."""
    from tests.test_studies import _worker_cmd
    from tests.test_study_supervisor import _env, _study

    path = _study(tmp_path, url, n_m=3, budget=budget)
    run = subprocess.run(
        [*_worker_cmd(path), "--workers", "2"],
        env=_env(tmp_path, **env),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=100,
    )
    return path, run


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_study_with_two_workers_runs_behind_session_pooling(tmp_path: Path, driver: str) -> None:
    """`tuner study run --workers 2` on a fresh database through PgBouncer in session mode: the schema is
    made, both workers claim and finish tasks, every task ends done with its trials stored."""
    with behind(tmp_path, "session", driver) as url:
        path, run = _run_study(tmp_path, url, 4, FAKE_TRIAL_SLEEP="0.05")
        assert run.returncode == 0, run.stderr[-3000:]
        assert "_pg3_" not in run.stderr
        eng = create_engine(_direct(url))
        try:
            with eng.connect() as c:
                statuses = c.execute(text("SELECT status, count(*) FROM tuner_study_tasks GROUP BY 1")).all()
                trials = c.execute(text("SELECT count(*) FROM trials WHERE state <> 'RUNNING'")).scalar()
        finally:
            eng.dispose()
        assert dict(statuses) == {"done": 3}
        assert trials == 3 * 4


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_decorated_function_tunes_and_stores_behind_session_pooling(tmp_path: Path, driver: str) -> None:
    """A decorated function's miss through PgBouncer in session mode: its claim, its measurements and its
    cache entry are written, a second function of the same key hits; then every server session PgBouncer
    holds is ended (`pg_terminate_backend`, as a restart or failover would) and the next miss connects
    again, unseen."""
    from tests.test_runtime_decorator import make
    from tuner.runtime import ConfigCache

    with behind(tmp_path, "session", driver) as url:
        k, bench = make(storage=url, budget=3)
        k(None, 100)
        assert bench.calls == 3
        k2, bench2 = make(storage=url, budget=3)
        k2(None, 100)
        assert bench2.calls == 0  # a hit from the store
        admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                ended = c.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :d "
                        "AND pid <> pg_backend_pid()"
                    ),
                    {"d": url.rsplit("/", 1)[1]},
                ).scalar()
        finally:
            admin.dispose()
        assert ended
        k(None, 200)
        assert bench.calls == 6
        keys = sorted(e.key.fields_dict["n"] for e in ConfigCache(url).entries())
        assert keys == [100, 200]


@pytest.mark.parametrize("driver", DRIVERS)
def test_transaction_pooling_is_refused_when_the_store_opens(tmp_path: Path, driver: str) -> None:
    """Was: the store opened behind PgBouncer in transaction mode and ran on shared server sessions (its
    schema lock and timeouts in sessions other clients got; psycopg 3's prepared statements failing a
    study's tasks). Now opening it raises one StoreError naming pool_mode=session, and nothing is made."""
    from tuner.storage import StoreError
    from tuner.store import ResultStore

    with behind(tmp_path, "transaction", driver) as url:
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="pool_mode=session") as got:
            ResultStore(url)
        assert time.monotonic() - t0 < 30
        assert "pool_mode=transaction" in str(got.value) and "\n" not in str(got.value)
        eng = create_engine(_direct(url))
        try:
            with eng.connect() as c:
                tables = c.execute(
                    text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
                ).scalar()
        finally:
            eng.dispose()
        assert tables == 0


@pytest.mark.slow
def test_a_study_behind_transaction_pooling_exits_1_with_the_line(tmp_path: Path) -> None:
    """`tuner study run --workers 2` behind PgBouncer in transaction mode with psycopg 3: exit 1 with the
    line naming pool_mode=session, no task run. It used to run, and its tasks failed with psycopg 3's
    "prepared statement "_pg3_0" already exists" wrapped in Optuna's StorageInternalError."""
    with behind(tmp_path, "transaction", "psycopg") as url:
        path, run = _run_study(tmp_path, url, 6)
        assert run.returncode == 1, (run.returncode, run.stderr[-3000:])
        assert "pool_mode=session" in run.stderr, run.stderr[-3000:]
        assert "_pg3_" not in run.stderr  # psycopg 3's prepared statements


def test_a_full_session_pool_is_named_in_the_error(tmp_path: Path) -> None:
    """A session pool too small for a process (PgBouncer's `default_pool_size = 1`; creating Optuna's
    tables holds two connections at once, the schema lock's and Optuna's): the connection that waited past PgBouncer's query_wait_timeout fails with
    StoreUnreachable naming it. Was: "connection already closed", raised by tuner restoring the
    connection's autocommit after the error that said why (`_apply_session_limits`). psycopg 3: psycopg2
    meets the closed connection in another statement, whose error names no cause ("server closed the
    connection unexpectedly")."""
    import tuner
    from tuner.storage import StoreUnreachable

    space = tuner.SearchSpace.from_configs([{"bm": bm} for bm in (16, 32)])
    with behind(tmp_path, "session", "psycopg", "default_pool_size = 1\nquery_wait_timeout = 2") as url:
        with pytest.raises(StoreUnreachable, match="query_wait_timeout") as got:
            tuner.optimize(space, lambda c: 1.0, budget=1, storage=url, study_name="s")
        assert "connection already closed" not in str(got.value)
