"""Study workers that stop making progress where nothing gives them up: a trial stuck for ever in a study
without `trial_timeout`, and a worker process stopped (SIGSTOP) while it waited for a task or after its
task went to another worker. Real processes and a real SQLite store; no assertion is on a clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_measure import _running
from tests.test_studies import FAKE, write_study
from tests.test_study_supervisor import _end, _env, _holders, _runner_grace, _study, _wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_a_stuck_trial_without_trial_timeout_is_named_with_the_fix(tmp_path: Path) -> None:
    """Was: a worker stuck for ever in one trial of a study without `trial_timeout` held its task, and the
    run, for ever without a word. Now, past `STALL_MIN_S` (10 times its slowest finished trial, at least),
    the worker warns naming the task, its process, the config in flight and `trial_timeout`."""
    from tuner.studies import load_study

    # lease_seconds 8: the heartbeat that looks for a stall runs every lease / 4 s (2 s here, 15 s with the
    # default lease), so the warning comes soon after the 3 s floor below
    path = write_study(tmp_path, n_m=1, budget=4, lease_seconds=8)
    spec = load_study(path, check_kernels=False)
    [task] = spec.tasks
    err_file = tmp_path / "stderr.txt"
    # the real CLI, with the warning's floor lowered from its 600 s to 3 s
    code = (
        "import sys, tuner.studies._runner as r; r.STALL_MIN_S = 3.0; from tuner.cli import main; "
        f"sys.exit(main(['study', 'run', {str(path)!r}, '--executor', {FAKE!r}, '--quiet', '--no-report']))"
    )
    with err_file.open("w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=_env(tmp_path, FAKE_HANG_ONCE=str(tmp_path / "hung")),
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "may be hung" not in err_file.read_text(encoding="utf-8"):
            assert proc.poll() is None, err_file.read_text(encoding="utf-8")[-3000:]
            assert time.monotonic() < deadline, f"no warning: {err_file.read_text(encoding='utf-8')[-3000:]}"
            time.sleep(0.2)
        text = err_file.read_text(encoding="utf-8")
        line = next(x for x in text.splitlines() if "may be hung" in x)
        assert task.key in line and f"(process {proc.pid})" in line, line
        assert "config {'BLOCK_M'" in line and "set trial_timeout" in line, line
        assert (tmp_path / "hung").exists()  # the trial it names is the one that hangs
    finally:
        _end(proc, [])  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["idle", "lost-task"])
def test_a_stopped_worker_process_does_not_hold_the_run_at_its_end(tmp_path: Path, case: str) -> None:
    """`--workers 2`: one worker process is stopped (SIGSTOP) while it waits for a task (`idle`, with
    `trial_timeout`: the runner watched only workers that hold a task), or while it holds one in a study
    without `trial_timeout` (`lost-task`: its lease runs out and the other worker takes the task over).
    Was: the other worker finished the study and the run waited for the stopped process for ever. Now the
    runner kills it once the study is finished, or once it was stopped past its lease (whichever comes
    first: the stop may fall inside one of its writes, whose SQLite write lock holds the other worker
    until the kill, as in the test below), and exits 0 with every task done."""
    from tuner.studies import load_study

    if case == "idle":
        # lease_seconds 8: the runner looks at the board every lease / 4 s (2 s; 5 s with the default lease)
        path = _study(
            tmp_path,
            f"sqlite:///{tmp_path / 'study.db'}",
            n_m=1,
            budget=4,
            lease_seconds=8,
            extra="trial_timeout = 60",
        )
    else:
        path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=2, budget=4, lease_seconds=3)
    spec = load_study(path, check_kernels=False)
    proc = _runner_grace(path, tmp_path, "0.3", "--workers", "2")
    stopped: list[int] = []
    try:
        if case == "idle":
            # both workers started (each writes its progress only once it holds a task: the idle one is
            # the child of the runner that holds none)
            holder = _wait_for("a worker holding the task", lambda: _holders(spec), proc)
            kids = _wait_for(
                "both worker processes", lambda: len(_children(proc.pid)) == 2 and _children(proc.pid), proc
            )
            [pid] = [p for p in kids if p not in holder]
        else:
            held = _wait_for("a worker holding a task", lambda: _holders(spec), proc)
            pid = next(iter(held))
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        err = _run_end(proc, spec, pid, 240)
        assert (
            f"worker process {pid} had not exited" in err
            or f"worker process {pid} was stopped (SIGSTOP)" in err
        ), err[-3000:]
    finally:
        _end(proc, stopped)


@pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="finds SQLite's write lock in Linux's /proc/locks"
)
def test_a_worker_stopped_inside_a_sqlite_write_is_killed_and_the_run_goes_on(tmp_path: Path) -> None:
    """`--workers 2` on SQLite: one worker process is stopped (SIGSTOP) while it holds the database's
    write lock (inside one of its writes: a lease renewal, a claim, a trial's record). Was: the other
    worker's next write waited for that lock for ever (SQLite's busy timeout, then its retries), no task
    could finish, and the runner, which kills a stopped worker only once the study is finished, waited
    with it, without a word (seen as a CI timeout of the test above). Now the runner kills a worker
    stopped past its lease (3 s here; at most half the busy timeout on SQLite), its open transaction is
    rolled back, and the run finishes every task."""
    from tuner.studies import load_study

    db = tmp_path / "study.db"
    # trials of 0.3 s, 3 tasks of 6: the run lasts long enough for a worker to be caught inside a write
    path = _study(tmp_path, f"sqlite:///{db}", n_m=3, budget=6, lease_seconds=3)
    spec = load_study(path, check_kernels=False)
    proc = _runner_grace(path, tmp_path, "0.3", "--workers", "2")
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not stopped:
            assert proc.poll() is None, (
                f"the run ended before a worker was caught inside a write: {proc.communicate()[1][-3000:]}"
            )
            assert time.monotonic() < deadline, "no worker was seen holding the write lock"
            kids = set(_children(proc.pid))
            holders = _wal_writers(db) & kids if len(kids) == 2 else set()
            if holders:
                pid = holders.pop()
                os.kill(pid, signal.SIGSTOP)
                if pid in _wal_writers(db):  # stopped with the lock held: the premise
                    stopped.append(pid)
                else:
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.001)
        err = _run_end(proc, spec, stopped[0], 120)
        assert f"worker process {stopped[0]} was stopped (SIGSTOP)" in err, err[-3000:]
    finally:
        _end(proc, stopped)


def _wal_writers(db: Path) -> set[int]:
    """The processes that hold the write lock of the SQLite database `db` in WAL mode: a POSIX lock on
    byte 120 (WAL_WRITE_LOCK) of its `-shm` file, as /proc/locks lists it."""
    try:
        inode = (db.parent / (db.name + "-shm")).stat().st_ino
    except OSError:
        return set()
    out = set()
    for line in Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines():
        f = line.split()
        # "N: POSIX  ADVISORY  WRITE PID MAJ:MIN:INODE START END"
        # ("N: -> POSIX ..." is a process waiting for that lock: its fields are shifted, not counted)
        ours = len(f) >= 8 and f[1] == "POSIX" and f[3] == "WRITE" and f[5].rsplit(":", 1)[-1] == str(inode)
        if ours and f[6] == "120":
            out.add(int(f[4]))
    return out


def _run_end(proc: subprocess.Popen[str], spec: object, pid: int, timeout: float) -> str:
    """The runner's stderr once it exited 0 within `timeout` s, the stopped worker `pid` gone and every
    task of the study done. Else the
    test fails with what the runner and its live worker said (the workers write to the runner's stderr)
    and the board's rows, read before the run is killed."""
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        rows = _rows_now(spec)
        os.killpg(proc.pid, signal.SIGKILL)
        _out, err = proc.communicate()
        pytest.fail(
            f"the runner still waits for its stopped worker process {pid}; board {rows}; {err[-4000:]}"
        )
    assert proc.returncode == 0, err[-3000:]
    assert not _running(pid), "the stopped worker process was left behind"
    from tuner.studies import DONE, TaskBoard

    board = TaskBoard(spec.storage)  # type: ignore[attr-defined]
    rows = board.rows(spec.name)  # type: ignore[attr-defined]
    board.close()
    assert {r.status for r in rows} == {DONE}, rows
    return err


def _rows_now(spec: object) -> object:
    """The board's rows of the study, or why they could not be read."""
    from tuner.studies import TaskBoard

    try:
        board = TaskBoard(spec.storage)  # type: ignore[attr-defined]
        try:
            return [(r.key, r.status, r.worker, r.attempts) for r in board.rows(spec.name)]  # type: ignore[attr-defined]
        finally:
            board.close()
    except Exception as exc:  # noqa: BLE001 - a diagnosis only
        return f"unreadable ({type(exc).__name__}: {exc})"


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(x) for x in path.read_text(encoding="utf-8").split()]
    except OSError:
        return []


def test_the_runner_kills_a_worker_only_once_it_stayed_stopped_past_the_limit(tmp_path: Path) -> None:
    """`_Supervisor._check_stopped` on a real process: a stop the runner sees starts the clock, a
    `kill -CONT` before the limit resets it (the process is left alone), and one that stays stopped past
    the limit is killed and replaced. The limit on SQLite: the lease and two looks, at most half the busy
    timeout (60 s leases: 30 s, before the other workers' writes give a lock it holds up)."""
    from tuner.storage._engine import SQLITE_TIMEOUT_S
    from tuner.studies import _runner, load_study, prepare_study

    path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=1)
    spec = prepare_study(load_study(path, check_kernels=False))
    quiet = [sys.executable, "-c", "import time; time.sleep(600)"]
    sup = _runner._Supervisor(spec, quiet, dict(os.environ), 1, 60.0)
    [worker] = sup.procs
    try:
        assert sup.stopped_limit == SQLITE_TIMEOUT_S / 2 < 60.0
        sup.stopped_limit = 1.0

        def until(stopped: bool) -> None:
            deadline = time.monotonic() + 30
            while _runner._is_stopped(worker.pid) != stopped:
                assert time.monotonic() < deadline, f"never seen stopped={stopped}"
                time.sleep(0.01)

        os.kill(worker.pid, signal.SIGSTOP)
        until(True)
        sup._check_stopped()  # seen stopped: the clock starts
        time.sleep(0.6)
        os.kill(worker.pid, signal.SIGCONT)
        until(False)
        sup._check_stopped()  # continued: the clock is reset
        assert worker.pid not in sup.stopped_since
        os.kill(worker.pid, signal.SIGSTOP)
        until(True)
        sup._check_stopped()
        time.sleep(0.6)  # 1.2 s stopped in all, but 0.6 s since the second stop
        sup._check_stopped()
        assert worker.poll() is None and sup.procs == [worker]
        time.sleep(0.6)
        sup._check_stopped()  # 1.2 s since the second stop: killed and replaced
        assert worker.wait(timeout=30) == -signal.SIGKILL
        [new] = sup.procs
        assert new is not worker and new.poll() is None
    finally:
        for p in [worker, *sup.procs]:
            if p.poll() is None:
                p.kill()
                p.wait()
