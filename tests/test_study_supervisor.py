"""The study runner that supervises its worker processes (`tuner study run` with `trial_timeout`): a
worker whose heartbeat stops with its trial (the process is stopped, or C code holds the GIL) is killed
and replaced; Ctrl-C (SIGINT, SIGTERM) on the runner stops every worker and keeps what they finished.

Real processes, real stores; the stop is a real SIGSTOP. No assertion is on a clock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._shared import made_once
from tests.test_measure import _running
from tests.test_studies import REPO, _worker_cmd, write_study
from tests.test_study_hung_trial import timed_out_trials

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    from .pg import sqlite_or_postgres

    yield from sqlite_or_postgres(request.param, tmp_path / "study.db")


def _study(tmp_path: Path, storage: str, **kw: Any) -> Path:
    path = write_study(tmp_path, **kw)
    path.write_text(
        path.read_text(encoding="utf-8").replace("[study]\n", f'[study]\nstorage = "{storage}"\n', 1),
        encoding="utf-8",
    )
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_EVAL_LOG": str(tmp_path / "evals.jsonl"),
        **extra,
    }


def _holders(spec: Any) -> dict[int, str]:
    """pid -> task key of the worker processes of this host that hold a task of the study now."""
    from tuner.storage._owner import HOST
    from tuner.studies import RUNNING, TaskBoard

    board = TaskBoard(spec.storage)
    try:
        rows = board.rows(spec.name)
    finally:
        board.close()
    out = {}
    for r in rows:
        if r.status == RUNNING and r.worker and r.worker.startswith(f"{HOST}:"):
            out[int(r.worker.split(":")[-2])] = r.key
    return out


def _ignore_sigint() -> None:
    """A `preexec_fn`: SIGINT ignored, as a shell starts a background job (`tuner study run ... &`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _runner(
    path: Path, tmp_path: Path, sleep: str, *extra: str, ignore_sigint: bool = False
) -> subprocess.Popen[str]:
    """`tuner study run` on the study file `path`, each trial taking `sleep` seconds (started with SIGINT
    ignored where `ignore_sigint`, else with its default)."""
    return subprocess.Popen(
        [*_worker_cmd(path), *extra],
        env=_env(tmp_path, FAKE_TRIAL_SLEEP=sleep),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if ignore_sigint else None,
        encoding="utf-8",
    )


def _runner_grace(path: Path, tmp_path: Path, sleep: str, *extra: str) -> subprocess.Popen[str]:
    """`_runner`: the real CLI, with the runner's wait for its workers (after the study's last task, and
    after Ctrl-C) lowered from `STOP_GRACE_S` (10 s) to 4 s, still above a live worker's exit (within its
    2 s poll; at once on SIGINT)."""
    cmd = _worker_cmd(path, *extra)
    assert cmd[1:3] == ["-m", "tuner.cli"], cmd
    code = "import sys, tuner.studies._runner as r; r.STOP_GRACE_S = 4.0; from tuner.cli import main; sys.exit(main())"
    return subprocess.Popen(
        [cmd[0], "-c", code, *cmd[3:]],
        env=_env(tmp_path, FAKE_TRIAL_SLEEP=sleep),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        encoding="utf-8",
    )


def _end(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """Leave nothing behind: the worker processes `pids`, then the runner's session."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _wait_for(what: str, cond: Any, proc: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + 120
    while True:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"the runner exited before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def calibrated_trial_timeout(tmp_path_factory: pytest.TempPathFactory) -> float:
    """A `trial_timeout` far above what a worker process's first trial takes here and now, its process's
    cold start and imports included: one and a half times a whole cold `tuner study run` of a calm study
    of one task and two trials (a process of its own, which imports what a worker does, prepares the study
    and the task, and runs two trials), at least 1 s. On an idle machine it is a few seconds; on a loaded
    one it grows with the load, where a fixed value was either long (the runner gives a stopped worker up
    only past it) or too short (a replacement's first trial given up as hung). The trial's clock starts
    once the task is prepared (`_Lease.begin`), so the first trial is a fraction of that run: timed cold
    at load 7 on 2 cores, 0.6 s of a 4 s run, so this `trial_timeout` is about ten times it (three times
    the run, as before, made the test wait out a limit of 4.5 runs + 5 s for the stopped worker).

    Timed once per test run (under pytest-xdist, by the first worker that needs it; the others read its
    figure), by every test that waits on a worker process's `trial_timeout`."""

    def calibrate(tmp: Path) -> None:
        path = write_study(tmp, name="cal", n_m=1, budget=2)
        t0 = time.monotonic()
        run = subprocess.run(
            _worker_cmd(path),
            env=_env(tmp, FAKE_TRIAL_SLEEP="0.3"),
            capture_output=True,
            text=True,
            timeout=240,
            encoding="utf-8",
        )
        took = time.monotonic() - t0
        assert run.returncode == 0, run.stderr[-3000:]
        (tmp / "timeout.txt").write_text(repr(max(1.0, 1.5 * took)), encoding="utf-8")

    folder = made_once(tmp_path_factory, "cold-trial-timeout", calibrate)
    return float((folder / "timeout.txt").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def cold_trial_timeout(tmp_path_factory: pytest.TempPathFactory) -> float:
    """`calibrated_trial_timeout`."""
    return calibrated_trial_timeout(tmp_path_factory)


def test_a_stopped_worker_process_is_killed_and_replaced(
    storage: str, tmp_path: Path, cold_trial_timeout: float
) -> None:
    """Was: a worker process whose heartbeat stopped with its trial (SIGSTOP here; C code that holds the
    GIL does the same) was never given up: its own `trial_timeout` runs in that heartbeat, and the runner
    waited for it for ever. Now the runner kills it once its task went `trial_timeout` (and a margin)
    without a renewal, marks its trial in flight failed (timeout), and starts another worker, which
    finishes the study."""
    from tuner.studies import DONE, TaskBoard, load_study

    # trial_timeout far above a normal trial (0.3 s) on a loaded machine too: a replacement worker's first
    # trial pays its process's cold imports, and one given up as hung there failed the count below (the
    # runner kills the stopped worker only past it, a margin and two heartbeats: calibrated, not fixed)
    timeout = f"trial_timeout = {cold_trial_timeout:.2f}"
    # two trials a task: the one worker process (the default) is stopped once it holds its first task,
    # and its replacement runs every trial of the study after the kill, one after another
    path = _study(tmp_path, storage, n_m=2, budget=2, extra=timeout)
    spec = load_study(path, check_kernels=False)
    proc = _runner(path, tmp_path, "0.3")
    stopped: list[int] = []
    try:
        held = _wait_for("a worker holding a task", lambda: _holders(spec), proc)
        pid = next(iter(held))
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail("the runner still waits for its stopped worker process")
        assert proc.returncode == 0, err[-3000:]
        assert not _running(pid), "the stopped worker process was left behind"
        assert f"worker process {pid}" in err and "killed it" in err, err[-3000:]
        board = TaskBoard(spec.storage)
        rows = board.rows(spec.name)
        board.close()
        assert [r.status for r in rows] == [DONE, DONE], rows
        timed_out = [t for _task, t in timed_out_trials(spec)]
        assert len(timed_out) <= 1, timed_out  # the trial in flight when it stopped, if one was
        assert all("stopped answering" in t.user_attrs["tuner_error"] for t in timed_out), timed_out
    finally:
        _end(proc, stopped)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGINT-stopped", "SIGTERM-background"])
def test_interrupting_the_runner_stops_every_worker_process(storage: str, tmp_path: Path, how: str) -> None:
    """Ctrl-C (SIGINT), or SIGTERM, on the supervising runner alone: every worker process stops, the
    tasks in progress go back to the queue with their finished trials, the runner exits 130 and leaves no
    process behind. Was: a worker that did not stop on SIGINT (stopped here; stuck in a hung trial
    likewise) kept the runner waiting for it for ever.

    SIGTERM-background: the runner started with SIGINT ignored (a shell's background job, `... &`), which
    its workers inherit. Was: the runner asked them to stop with SIGINT, which they ignored; it killed them
    after `STOP_GRACE_S`, their trials in flight with them. Now it sends them SIGTERM: they hand back."""
    from tuner.studies import PENDING, RUNNING, TaskBoard, load_study
    from tuner.studies._runner import _optuna_storage, task_trials

    if how == "SIGINT-stopped" and "postgresql" in storage:
        pytest.skip("the store plays no part in it; SQLite covers it")
    path = _study(tmp_path, storage, n_m=3, budget=40, extra="trial_timeout = 60")
    spec = load_study(path, check_kernels=False)
    # the stopped worker is killed once the runner's grace is over: 4 s here, not STOP_GRACE_S's 10
    if how == "SIGINT-stopped":
        proc = _runner_grace(path, tmp_path, "0.2", "--workers", "2")
    else:
        proc = _runner(path, tmp_path, "0.2", "--workers", "2", ignore_sigint=how == "SIGTERM-background")
    children: list[int] = []
    try:
        held = _wait_for(
            "two workers holding a task", lambda: len(_holders(spec)) == 2 and _holders(spec), proc
        )
        children += list(held)
        study = _optuna_storage(spec.storage)

        def finished() -> int:
            return sum(len(task_trials(study, t.study_name)) for t in spec.tasks)

        done = _wait_for("two finished trials", lambda: finished() >= 2 and finished(), proc)
        if how == "SIGINT-stopped":
            os.kill(children[0], signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the runner did not stop: {[p for p in children if _running(p)]} still run")
        assert proc.returncode == 130, err[-3000:]
        assert not [p for p in children if _running(p)], "worker processes left behind"
        if how == "SIGTERM-background":  # each worker handed its task back itself, none was killed
            assert "did not stop on the interrupt" not in err, err[-3000:]
        board = TaskBoard(spec.storage)
        rows = board.rows(spec.name)
        board.close()
        assert not [r for r in rows if r.status == RUNNING], rows
        assert any(r.status == PENDING for r in rows), rows
        assert finished() >= done  # the finished trials are kept
    finally:
        _end(proc, children)


def test_a_killed_worker_process_is_replaced_when_its_hand_back_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the runner killed the quiet worker process, then an error writing its hand-back (a store
    hiccup, which the runner's watch logs and looks past) skipped the start of its replacement: the run
    went on one worker short, and with one worker it ended at once as stopped with an error (exit -9).
    Now the replacement starts whatever the hand-back met, and the task is free for it."""
    import sys

    from tuner.storage import StoreError
    from tuner.storage._owner import HOST
    from tuner.studies import PENDING, TaskBoard, _runner, load_study, prepare_study

    path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=1, extra="trial_timeout = 60")
    spec = prepare_study(load_study(path, check_kernels=False))
    quiet = [sys.executable, "-c", "import time; time.sleep(600)"]  # a worker process that never renews
    sup = _runner._Supervisor(spec, quiet, dict(os.environ), 1, 60.0)
    board = TaskBoard(spec.storage)
    try:
        first = sup.procs[0]
        assert board.claim(spec.name, f"{HOST}:{first.pid}:w", 60.0) is not None
        sup.limit = -1.0  # its task went past the limit without a renewal (the board's clock decides)

        def hiccup(*_a: Any, **_k: Any) -> list[Any]:
            raise StoreError("database is locked")

        monkeypatch.setattr(_runner, "_fail_trials_in_flight", hiccup)
        with contextlib.suppress(Exception):  # as `_Supervisor._watch` does
            sup._check()
        assert first.poll() is not None, "the quiet worker process was not killed"
        [now] = sup.procs
        assert now is not first and now.poll() is None, "no worker process replaces the killed one"
        assert [r.status for r in board.rows(spec.name)] == [PENDING]  # free for the new worker now
    finally:
        _close(board, sup)


def _close(board: Any, sup: Any) -> None:
    """The test's board, the supervisor's worker processes and its board."""
    board.close()
    for p in sup.procs:
        _kill_quietly(p)
    if sup.board is not None:
        sup.board.close()


def _kill_quietly(p: subprocess.Popen[Any]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


def test_a_stopped_worker_whose_task_was_taken_over_is_still_killed(tmp_path: Path) -> None:
    """A worker process that stops (SIGSTOP, code that hangs holding the GIL) loses its task to another
    worker once `lease_seconds` runs out, which with the docs' example (60 s against a trial_timeout of
    900 s) comes first. The runner keeps watching it on that task, kills it past the limit and starts
    another; the task, now another worker's, is left to that worker. (A version that watched only the
    task a worker holds now never killed it, and the run waited for the stopped process at its end.)"""
    import sys

    from tuner.storage._owner import HOST
    from tuner.studies import RUNNING, TaskBoard, _runner, load_study, prepare_study

    path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=1, extra="trial_timeout = 60")
    spec = prepare_study(load_study(path, check_kernels=False))
    quiet = [sys.executable, "-c", "import time; time.sleep(600)"]
    sup = _runner._Supervisor(spec, quiet, dict(os.environ), 1, 60.0)
    board = TaskBoard(spec.storage)
    try:
        [worker] = sup.procs
        assert board.claim(spec.name, f"{HOST}:{worker.pid}:w", 0.5) is not None
        sup._check()  # seen holding its task
        assert worker.poll() is None
        deadline = time.monotonic() + 120
        while board.claim(spec.name, "elsewhere:1:w", 600.0) is None:  # its lease runs out: taken over
            assert time.monotonic() < deadline, "the task was never taken over"
            time.sleep(0.2)
        sup.limit = -1.0  # the lost task's last renewal by that worker is past the limit
        sup._check()
        assert worker.wait(timeout=60) is not None, "the stopped worker was not killed"
        [new] = sup.procs
        assert new is not worker and new.poll() is None
        [row] = board.rows(spec.name)
        assert row.status == RUNNING and row.worker == "elsewhere:1:w", row  # left to its new holder
    finally:
        _close(board, sup)


# ignores SIGINT, then says so by creating the file argv[1] (the test waits for it: a SIGINT that came while
# Python was still starting, under load, ended the process before it ignored it, and its task was not
# handed back)
IGNORES_SIGINT = (
    "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); open(sys.argv[1], 'w').close(); "
    "time.sleep(600)"
)


@pytest.mark.parametrize("where", ["start", "replacement"])
def test_a_worker_process_that_cannot_start_stops_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Was: an error starting a worker process (the OS refusing a new process: OSError) left the worker
    processes already started running, orphans holding their tasks, without a runner. Now they are
    stopped (killed past the grace, their tasks handed back) and one error says why."""
    import subprocess as sp
    import sys

    from tuner.storage._owner import HOST
    from tuner.studies import PENDING, TaskBoard, WorkersStopped, _runner, load_study, prepare_study

    path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=1, extra="trial_timeout = 60")
    spec = prepare_study(load_study(path, check_kernels=False))
    monkeypatch.setattr(_runner, "STOP_GRACE_S", 1.0)
    started: list[sp.Popen[Any]] = []
    # the first worker holds a task and ignores SIGINT (stuck in a trial); where = "replacement": the
    # second exits as after a hung trial, and its replacement is the start the OS refuses
    ready = tmp_path / "ignores-sigint"
    cmds = [[sys.executable, "-c", IGNORES_SIGINT, str(ready)]]
    if where == "replacement":
        cmds.append([sys.executable, "-c", f"import sys; sys.exit({_runner.EXIT_HUNG})"])
    real = sp.Popen

    def popen(cmd: Any, **kw: Any) -> sp.Popen[Any]:
        if len(started) == len(cmds):
            raise OSError(11, "Resource temporarily unavailable")
        p = real(cmds[len(started)], **kw)
        started.append(p)
        if len(started) == 1:  # the stuck worker ignores SIGINT before the runner may send it one
            deadline = time.monotonic() + 60
            while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        return p

    monkeypatch.setattr(_runner.subprocess, "Popen", popen)
    board = TaskBoard(spec.storage)
    try:
        with pytest.raises(WorkersStopped) as err:
            if where == "start":
                _runner._Supervisor(spec, ["unused"], dict(os.environ), 2, 60.0)
            else:
                sup = _runner._Supervisor(spec, ["unused"], dict(os.environ), 2, 60.0)
                assert board.claim(spec.name, f"{HOST}:{started[0].pid}:w", 600.0) is not None
                sup.run()
        assert "could not start a worker process (BlockingIOError: [Errno 11]" in str(err.value), err.value
        assert "\n" not in str(err.value)
        assert started and all(p.poll() is not None for p in started), "worker processes left running"
        if where == "replacement":
            assert [r.status for r in board.rows(spec.name)] == [PENDING]  # its task handed back
    finally:
        board.close()
        for p in started:
            _kill_quietly(p)


@pytest.mark.parametrize("where", ["between starts", "progress display"])
def test_ctrl_c_while_the_runner_starts_its_workers_leaves_none_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Was: the runner started its worker processes before it watched for Ctrl-C (SIGINT, SIGTERM), then
    started the progress display (a store query): a Ctrl-C there, or between two starts, ended the runner
    (exit 130) and left the workers already started running, orphans that went on with the study to its
    end. Now the workers start inside the watch, after the display: an interrupt stops every one."""
    import subprocess as sp
    import sys

    from tuner.studies import _runner, load_study

    path = _study(tmp_path, f"sqlite:///{tmp_path / 'study.db'}", n_m=2)
    spec = load_study(path, check_kernels=False)
    started: list[sp.Popen[Any]] = []
    real = sp.Popen

    def popen(cmd: Any, **kw: Any) -> sp.Popen[Any]:
        if where == "between starts" and len(started) == 1:
            raise KeyboardInterrupt  # Ctrl-C after the first worker process started
        p = real([sys.executable, "-c", "import time; time.sleep(600)"], **kw)
        started.append(p)
        return p

    def display_start(self: Any) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the progress display starts

    monkeypatch.setattr(_runner.subprocess, "Popen", popen)
    if where == "progress display":
        monkeypatch.setattr(_runner._Monitor, "start", display_start)
    try:
        with pytest.raises(KeyboardInterrupt):
            _runner.run_study(spec, workers=2, executor="tests._study_fake:executor", progress=True)
        left = [p.pid for p in started if p.poll() is None]
        assert not left, f"worker processes {left} outlived the interrupted run"
    finally:
        for p in started:
            _kill_quietly(p)
