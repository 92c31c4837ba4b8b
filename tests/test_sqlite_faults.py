"""SQLite stores failing the way they do in production, beyond tests/test_runtime_faults.py: a file that
turns corrupt while a process has it open, a corrupt study database under the CLI (Optuna's own reads
included), a disk that fills during a study, a store deleted from under a running process, and a schema
lock file held by a process that stopped.

Each case runs on a real SQLite file; only the disk-full study needs mount(8) (root), and skips, saying
so, where it is not permitted."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._env import repo_pythonpath  # noqa: E402
from tests._study_fake import executor as fake_executor
from tests.test_runtime_faults import (  # noqa: F401 - the fixtures
    _fresh_stores,
    _populate,
    check_calls,
    make,
    mount,
    store_warnings,
)
from tests.test_studies import cli, finished_configs, write_study
from tuner.runtime import ConfigCache
from tuner.runtime._sources import close_stores


def _checkpoint(db: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def test_a_store_that_turns_corrupt_while_running_is_warned_once_and_left_alone(
    _tuner_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = _tuner_home / "tuner.db"
    f, _ = make()
    check_calls(f, range(1, 6))  # the process has the store open
    _checkpoint(db)
    with open(db, "r+b") as fh:  # the header overwritten: "file is not a database"
        fh.write(b"\0garbage" * 12)
    damaged = db.read_bytes()
    caplog.set_level(logging.WARNING)
    check_calls(f, range(100, 104))  # new keys: read, claim, record and store all meet the damage
    g, _ = make(mode="offline")
    check_calls(g, (1, 2, 200))
    msgs = store_warnings(caplog)
    assert len(msgs) == 1, msgs  # one warning for the one cause, not one per step
    assert f"store {db} is corrupt (file is not a database)" in msgs[0], msgs
    assert "move it aside" in msgs[0] and ".recover" in msgs[0], msgs
    assert db.read_bytes() == damaged  # never written to, truncated or deleted


def _corrupt_table(db: Path, table: str) -> None:
    """Overwrite the root page of `table` with junk (the rest of the file stays readable)."""
    with sqlite3.connect(db) as con:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    con.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xa5" * page_size)


def test_the_cli_on_a_corrupt_store_fails_in_one_line_naming_the_file(
    _tuner_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the runtime's store, truncated in the middle
    _populate(_tuner_home, ns=range(100, 140), strategy="random")
    db = _tuner_home / "tuner.db"
    os.truncate(db, db.stat().st_size // 2)
    before = db.read_bytes()
    # a study's database whose Optuna table is damaged (Optuna reads it first, and used to blame "invalid
    # data in the commit")
    p = write_study(tmp_path, n_m=1, budget=3)
    assert (
        cli("study", "run", str(p), "--executor", "tests._study_fake:executor", "--quiet", "--no-report") == 0
    )
    sdb = tmp_path / "out-s" / "study.db"
    close_stores()
    _checkpoint(sdb)
    _corrupt_table(sdb, "version_info")
    sbefore = sdb.read_bytes()
    capsys.readouterr()
    for argv, path in [
        (["cache", "show"], db),
        (["cache", "export", "--out", str(tmp_path / "c.json")], db),
        (["study", "report", str(p), "--out", str(tmp_path / "r")], sdb),
        (["study", "run", str(p), "--executor", "tests._study_fake:executor", "--quiet", "--no-report"], sdb),
    ]:
        assert cli(*argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"store {path} is corrupt" in err and "move it aside" in err, (argv, err)
    assert db.read_bytes() == before and sdb.read_bytes() == sbefore
    assert not (tmp_path / "c.json").exists()


def test_a_study_on_a_full_disk_stops_and_resumes_with_its_trials(
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    from tuner.store import StoreError
    from tuner.studies import DONE, FAILED, TaskBoard, load_study, run_study

    small = tmp_path / "small"
    small.mkdir()
    mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", target=small)
    path = write_study(small, n_m=3, budget=6, lease_seconds=2)  # its hand-back cannot be written
    spec = load_study(path, check_kernels=False)
    filler = small / "filler"
    trials = [0]

    def fill_after_three(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
        def each(*args: Any, **kw: Any) -> None:
            trials[0] += 1
            if trials[0] == 3:  # the disk fills (another program's log, say) during the first task
                try:
                    with open(filler, "wb") as fh:
                        while True:
                            fh.write(b"\0" * 65536)
                            fh.flush()
                except OSError:
                    pass
            callback(*args, **kw)

        return fake_executor(task, prior=prior, callback=each)

    with pytest.raises(StoreError, match="full") as exc:
        run_study(spec, executor=fill_after_three)
    assert str(small) in str(exc.value)
    filler.unlink()
    close_stores()
    board = TaskBoard(spec.storage)
    assert all(r.status != FAILED for r in board.rows(spec.name))  # the store's fault, not the tasks'
    first = spec.tasks[0]
    before = finished_configs(spec.storage, first)
    assert len(before) >= 2
    # space freed: the same command resumes, and the trials finished before the fault are kept
    summary = run_study(spec, executor=fake_executor)
    assert summary.counts[DONE] == 3 and summary.complete
    after = finished_configs(spec.storage, first)
    assert all(c in after for c in before)
    assert {r.status for r in board.rows(spec.name)} == {DONE}


def _size_limited(limit: int) -> Callable[[], None]:
    """A `preexec_fn`: files of at most `limit` bytes (RLIMIT_FSIZE, as `ulimit -f`), and SIGXFSZ ignored,
    so a write past the limit fails with EFBIG (SQLite's "disk I/O error") instead of killing the process."""

    def limit_files() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_files


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_study_store_at_the_file_size_limit_fails_naming_the_limit(tmp_path: Path) -> None:
    """Was: a study whose database reached the process's file size limit (`ulimit -f`, a batch system's
    limit: EFBIG) failed with "the file or its folder was removed, moved or unmounted, or the disk failed",
    none of which was true. Now the line names the file, the limit and what to do; the trials committed
    before are kept, the file is intact, and the same command resumes once the limit is raised."""
    from tuner.studies import DONE, TaskBoard, load_study, run_study

    path = write_study(tmp_path, n_m=2, budget=2)
    spec = load_study(path, check_kernels=False)
    run_study(spec, executor=fake_executor)
    close_stores()
    # room for 10 more trials a task: the limit below stops the first task after about two of them
    path.write_text(path.read_text(encoding="utf-8").replace("trials = 2", "trials = 12"), encoding="utf-8")
    spec = load_study(path, check_kernels=False)
    db = Path(spec.storage.removeprefix("sqlite:///"))
    before = {t.key: finished_configs(spec.storage, t) for t in spec.tasks}
    _checkpoint(db)  # the file holds every page: the limit leaves it room for a few trials
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    cmd = [sys.executable, "-m", "tuner.cli", "study", "run", str(path), "--quiet", "--no-report"]
    cmd += ["--executor", "tests._study_fake:executor"]
    done = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_size_limited(db.stat().st_size + 20_000),
        encoding="utf-8",
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tuner: failed: StoreError: store ") and str(db) in last, last
    assert "reached this process's file size limit" in last and "ulimit -f" in last, last
    assert "removed, moved or unmounted" not in last, last
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    con.close()
    now = {t.key: finished_configs(spec.storage, t) for t in spec.tasks}
    for t in spec.tasks:  # every trial committed before is kept
        assert all(c in now[t.key] for c in before[t.key]), t.key
    # it failed in the middle of a task, with trials of this run stored
    assert sum(map(len, now.values())) > sum(map(len, before.values())), last
    summary = run_study(spec, executor=fake_executor)  # the limit raised: the same study resumes
    assert summary.counts[DONE] == 2 and summary.complete
    board = TaskBoard(spec.storage)
    try:
        assert {r.status for r in board.rows(spec.name)} == {DONE}
    finally:
        board.close()


def test_a_store_deleted_while_running_is_opened_again(
    _tuner_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f, _ = make()
    check_calls(f, (1,))
    for suffix in ("", "-wal", "-shm"):
        (_tuner_home / f"tuner.db{suffix}").unlink(missing_ok=True)
    caplog.set_level(logging.WARNING)
    check_calls(f, (2, 3))  # winners that went into the unlinked file would be lost at exit
    msgs = store_warnings(caplog)
    assert len(msgs) == 1 and "deleted or replaced" in msgs[0], msgs
    close_stores()
    assert {e.key.fields_dict["n"] for e in ConfigCache().entries()} == {2, 3}
    # offline, a deleted store is not created again
    close_stores()
    g, _ = make(mode="offline")
    check_calls(g, (2,))
    for suffix in ("", "-wal", "-shm"):
        (_tuner_home / f"tuner.db{suffix}").unlink(missing_ok=True)
    check_calls(g, (4,))
    assert not (_tuner_home / "tuner.db").exists()


DELETING = "tests._study_fake:deleting_executor"


@pytest.fixture
def deleting(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Steer `deleting_executor` (its trial count starts at 0 in each test)."""
    import tests._study_fake

    monkeypatch.setattr(tests._study_fake, "_trials_here", [0])
    monkeypatch.setenv("PYTHONPATH", repo_pythonpath())  # for worker processes

    def set_(after: int, how: str = "delete") -> None:
        monkeypatch.setenv("FAKE_DELETE_AFTER", str(after))
        monkeypatch.setenv("FAKE_DELETE_HOW", how)

    return set_


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_study_whose_database_is_deleted_while_it_runs_stops_naming_it(
    workers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], deleting: Callable[..., None]
) -> None:
    # SQLite goes on writing into the deleted file, and every trial after the deletion used to vanish with
    # it at exit while the run reported success (exit 0). With --workers, the workers stop at their next
    # write and the command that started them must not report success either.
    p = write_study(tmp_path, n_m=3, budget=4)
    db = tmp_path / "out-s" / "study.db"
    deleting(3)
    capsys.readouterr()
    assert cli("study", "run", str(p), "--workers", workers, "--executor", DELETING, "--quiet") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err and f"store {db} was deleted or replaced while " in err[-1], err
    if workers == "1":
        assert "while this process had it open (no file is there now)" in err[-1], err
        # nothing was made in its place: no new, half-written database at the path (a worker process that
        # starts after the deletion makes a new study there, as a new run would)
        names = sorted(f.name for f in db.parent.iterdir() if f.name.startswith("study.db"))
        assert names == ["study.db.lock"], names


def test_a_study_database_moved_aside_stops_the_run_and_resumes_once_back(
    tmp_path: Path, deleting: Callable[..., None]
) -> None:
    from tuner.store import StoreError
    from tuner.studies import DONE, load_study, run_study

    p = write_study(tmp_path, n_m=2, budget=6, lease_seconds=2)
    spec = load_study(p, check_kernels=False)
    db = tmp_path / "out-s" / "study.db"
    deleting(3, "move")
    with pytest.raises(StoreError, match="deleted or replaced") as exc:
        run_study(spec, executor=DELETING)
    assert str(db) in str(exc.value) and "move it back" in str(exc.value)
    assert not db.exists()
    os.rename(f"{db}.moved", db)
    first = spec.tasks[0]
    before = finished_configs(spec.storage, first)
    assert len(before) == 3  # the trials finished before the move are in the file; none after it
    summary = run_study(spec, executor=fake_executor)
    assert summary.counts[DONE] == 2 and summary.complete
    after = finished_configs(spec.storage, first)
    assert len(after) == 6 and all(c in after for c in before)


def test_a_study_database_deleted_before_a_task_opens_it_is_not_made_again(tmp_path: Path) -> None:
    # an executor opens its own connections (Optuna's RDBStorage): after the deletion they used to make a
    # new database at the path, holding the next task's trials without the board or the earlier tasks
    from tuner.store import StoreError
    from tuner.studies import DONE, load_study, run_study

    p = write_study(tmp_path, n_m=2, budget=3)
    spec = load_study(p, check_kernels=False)
    db = tmp_path / "out-s" / "study.db"
    started: list[str] = []

    def delete_then_tune(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
        started.append(task.key)
        if len(started) == 2:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        return fake_executor(task, prior=prior, callback=callback)

    with pytest.raises(StoreError, match="deleted or replaced while this process had it open"):
        run_study(spec, executor=delete_then_tune)
    assert len(started) == 2 and not db.exists()
    # the same process runs it again (a notebook): the path is opened again, and the study starts over
    summary = run_study(spec, executor=fake_executor)
    assert summary.counts[DONE] == 2 and summary.complete
    assert all(len(finished_configs(spec.storage, t)) == 3 for t in spec.tasks)


def test_the_file_check_leaves_an_interrupted_statements_error_alone(tmp_path: Path) -> None:
    # Ctrl-C (or SIGTERM, which a study worker turns into it) inside a statement invalidates the connection;
    # its rollback must not raise PendingRollbackError in place of the interrupt (the worker then marked
    # its task failed instead of handing it back)
    from sqlalchemy import text

    from tuner.storage import engine_for

    eng = engine_for(f"sqlite:///{tmp_path / 'x.db'}")
    with eng.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    with eng.connect() as conn:
        conn.execute(text("INSERT INTO t VALUES (1)"))
        conn.invalidate()
        conn.rollback()
    with eng.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM t")).scalar_one() == 0
    eng.dispose()


def _space():
    from tuner import PowerOfTwo, SearchSpace

    return SearchSpace([PowerOfTwo("b", 16, 256)])


def test_optimize_after_its_store_was_deleted_between_runs_starts_anew(tmp_path: Path) -> None:
    """A notebook: optimize, `rm` the store, optimize again in the same process. The second run is a
    fresh start in a new file (the deleted file is not pinned across runs)."""
    import tuner

    db = tmp_path / "nb.db"
    url = f"sqlite:///{db}"
    first = tuner.optimize(_space(), lambda c: c["b"] * 1e-3, budget=3, storage=url, study_name="s")
    assert len(first.trials) == 3
    for f in tmp_path.glob("nb.db*"):
        f.unlink()
    second = tuner.optimize(_space(), lambda c: c["b"] * 1e-3, budget=2, storage=url, study_name="s")
    assert len(second.trials) == 2 and db.exists()
    third = tuner.optimize(_space(), lambda c: c["b"] * 1e-3, budget=4, storage=url, study_name="s")
    assert len(third.trials) == 4  # resumed from the new file: its 2 trials kept, 2 more run
    assert [t.config for t in third.trials[:2]] == [t.config for t in second.trials]


def test_optimize_whose_store_is_deleted_during_the_run_stops_naming_it(tmp_path: Path) -> None:
    import tuner
    from tuner.store import StoreError

    db = tmp_path / "run.db"
    url = f"sqlite:///{db}"
    calls = []

    def objective(c):
        calls.append(c)
        if len(calls) == 2:
            for f in tmp_path.glob("run.db*"):
                f.unlink()
        return c["b"] * 1e-3

    with pytest.raises(StoreError, match="deleted or replaced"):
        tuner.optimize(_space(), objective, budget=5, storage=url, study_name="s")
    assert len(calls) == 2 and not db.exists()  # stopped at that trial's write; no new file made


def test_an_opening_that_fails_on_a_deleted_store_leaves_the_runs_engine_alone(tmp_path: Path) -> None:
    # A run of this process holds its store (`holding`); the file is deleted; another part of the process
    # opens the same store, and that opening fails (the shared engine refuses to make a new file at the
    # path). Its clean-up (`NewFile.remove_if_empty`) disposed of the shared engine: the run's pool was
    # replaced and the file unpinned, so the run's next connection made a new, empty file at the path and
    # its write failed with "no such table" in it, not with the error naming the deleted store.
    from sqlalchemy import text

    from tuner.storage import StoreError, engine_of
    from tuner.storage._replaced import holding
    from tuner.store import ResultStore

    db = tmp_path / "run.db"
    url = f"sqlite:///{db}"
    store = ResultStore(url)
    eng = engine_of(url)
    assert eng is not None and store.engine is eng
    pool = eng.pool
    with holding(url):
        for f in tmp_path.glob("run.db*"):
            f.unlink()
        # the run's connection in use (another thread's transaction) while the store is opened
        with eng.connect(), pytest.raises(StoreError, match="deleted or replaced"):
            ResultStore(url)
        assert eng.pool is pool
        with pytest.raises(StoreError, match="deleted or replaced"), eng.begin() as conn:
            conn.execute(text("DELETE FROM tuner_measurements"))
        assert not db.exists()
    eng.dispose()


def test_a_write_into_a_file_moved_away_is_not_blamed_on_a_read_only_folder(tmp_path: Path) -> None:
    """SQLite refuses a write of a rollback-journal connection whose file was renamed or deleted since it
    opened it with SQLITE_READONLY_DBMOVED, whose text is every read-only fault's ("attempt to write a
    readonly database"). Was: tuner's message said the file or its folder cannot be written (a read-only
    mount?), sending the user to check a folder that can be written. The other SQLITE_READONLY_* codes stay
    the read-only fault."""
    from tuner.storage import StoreError
    from tuner.storage._engine import sqlite_fault_message

    path = tmp_path / "s.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    path.rename(tmp_path / "moved.db")
    with pytest.raises(sqlite3.OperationalError) as got:
        con.execute("INSERT INTO t VALUES (1)")
    con.close()
    assert got.value.sqlite_errorname == "SQLITE_READONLY_DBMOVED", got.value.sqlite_errorname
    cls, msg = sqlite_fault_message(str(path), "a write", got.value) or (None, "")
    assert cls is StoreError, (cls, msg)
    assert "deleted or moved away while this process had it open" in msg and "read-only mount" not in msg, msg


def _schema_lock_holder(lock: Path) -> subprocess.Popen[str]:
    """Another process that takes the schema lock file `lock` and keeps it until its stdin is closed (as a
    process stopped (SIGSTOP), hung or in a debugger while it holds the lock does)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys\n"
            "fd = open(sys.argv[1], 'a')\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Event, dict[str, Any]]:
    done, got = threading.Event(), {}

    def run() -> None:
        try:
            got["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, got


def test_optunas_tables_once_made_are_opened_without_the_schema_lock(tmp_path: Path) -> None:
    """A process stopped while it holds the schema lock file holds up no process that opens a store whose
    schemas (tuner's and Optuna's) are made. Was: Optuna's storage on SQLite took the lock at every
    opening (each `tuner.optimize`, each study task) and waited for it without end."""
    pytest.importorskip("fcntl")
    from tuner.storage import sqlite_url
    from tuner.store import ResultStore

    db = tmp_path / "s.db"
    ResultStore(sqlite_url(db)).optuna_storage()  # both schemas made
    holder = _schema_lock_holder(tmp_path / "s.db.lock")
    try:
        done, got = _in_thread(lambda: ResultStore(sqlite_url(db)).optuna_storage())
        done.wait(30)  # on the old code: not done until the holder lets go
        assert done.is_set() and "error" not in got, got
    finally:
        _release(holder)


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=60)


def test_a_schema_lock_held_past_the_timeout_fails_the_opening_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A store whose schema must be made while another process holds its schema lock file (stopped, hung):
    the opening waits SQLite's busy timeout (`SQLITE_TIMEOUT_S`), then fails with `StoreTimeout` naming
    the lock file and what to do; a decorated function goes on in memory with one warning saying so.
    Was: every process opening the store waited for ever."""
    pytest.importorskip("fcntl")
    import numpy as np

    import tuner.storage._engine as engine
    from tests.test_store_terminated import X, _decorated
    from tuner.storage import sqlite_url
    from tuner.store import ResultStore, StoreTimeout

    monkeypatch.setattr(engine, "SQLITE_TIMEOUT_S", 0.5)
    fresh, made = tmp_path / "fresh.db", tmp_path / "made.db"
    ResultStore(sqlite_url(made))  # tuner's schema made, Optuna's not yet
    holders = [_schema_lock_holder(Path(f"{db}.lock")) for db in (fresh, made)]
    try:
        done, got = _in_thread(lambda: ResultStore(sqlite_url(fresh)))
        done.wait(30)  # on the old code: not done until the holder lets go
        assert done.is_set() and isinstance(got.get("error"), StoreTimeout), got
        msg = str(got["error"])
        assert f"schema lock {fresh}.lock" in msg and "0.5 s" in msg, msg
        assert "another process" in msg and "stopped or hung" in msg and "fuser" in msg, msg
        assert "\n" not in msg, msg
        done, got = _in_thread(lambda: ResultStore(sqlite_url(made)).optuna_storage())
        done.wait(30)
        assert done.is_set() and isinstance(got.get("error"), StoreTimeout), got
        assert f"schema lock {made}.lock" in str(got["error"]), got
        close_stores()
        caplog.set_level(logging.WARNING)
        f, _ = _decorated(sqlite_url(fresh))
        done, got = _in_thread(lambda: f(X, 1))
        done.wait(30)
        assert done.is_set() and "error" not in got, got
        np.testing.assert_array_equal(got["value"], X * 2.0)
        msgs = store_warnings(caplog)
        assert len(msgs) == 1 and f"schema lock {fresh}.lock" in msgs[0], msgs
    finally:
        for holder in holders:
            _release(holder)
        close_stores()
    ResultStore(sqlite_url(fresh)).optuna_storage()  # the lock let go: both open
    ResultStore(sqlite_url(made)).optuna_storage()
