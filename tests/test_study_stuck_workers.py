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
    runner kills it once the study is finished, and exits 0 with every task done."""
    from tuner.studies import DONE, TaskBoard, load_study

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
        try:
            _out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail("the runner still waits for its stopped worker process")
        assert proc.returncode == 0, err[-3000:]
        assert not _running(pid), "the stopped worker process was left behind"
        assert f"worker process {pid} had not exited" in err, err[-3000:]
        board = TaskBoard(spec.storage)
        rows = board.rows(spec.name)
        board.close()
        assert {r.status for r in rows} == {DONE}, rows
    finally:
        _end(proc, stopped)


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(x) for x in path.read_text(encoding="utf-8").split()]
    except OSError:
        return []
