"""A study task whose trial hangs (a deadlocked kernel, a config that spins, a compile that never ends).

The worker's heartbeat renews the task's lease beside the trial, so without a limit a hung trial holds
its task for as long as the process lives, and every other worker of the fleet waits for it for ever
(`tuner study run` never returns). `trial_timeout` in the study file bounds the time without a finished
trial: past it the trial in flight is marked failed (`timeout`) and the task goes back to the queue,
where another worker resumes it without measuring the hung config again. The hang here is a thread
blocked on an event, released at the end; nothing waits on a clock."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_studies import FAKE, write_study

pytestmark = pytest.mark.timeout(300)

_release = threading.Event()
_hung: list[dict[str, Any]] = []


def _hanging_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """The synthetic executor, whose second trial blocks until the test releases it."""
    import tests._study_fake as fake

    real = fake.objective_for(task)
    calls = [0]

    def objective(config: dict[str, Any]) -> float:
        calls[0] += 1
        if calls[0] == 2:
            _hung.append(dict(config))
            _release.wait()
        return float(real(config))

    orig = fake.objective_for
    fake.objective_for = lambda _task: objective  # type: ignore[assignment]
    try:
        return fake.executor(task, prior=prior, callback=callback)
    finally:
        fake.objective_for = orig  # type: ignore[assignment]


def _run_once(worker: Any, outcome: list[Any]) -> None:
    """`worker` takes one task (a hung trial must not make it take the task again) and runs it."""
    outcome.append(worker.run(max_tasks=1))


def timed_out_trials(spec: Any) -> list[tuple[Any, Any]]:
    """(task, trial) of the trials of `spec`'s tasks given up as hung (`tuner_status = "timeout"`)."""
    from tuner.studies._runner import _optuna_storage

    study = _optuna_storage(spec.storage)
    out = []
    for task in spec.tasks:
        trials = study.get_all_trials(study.get_study_id_from_name(task.study_name), deepcopy=False)
        out += [(task, t) for t in trials if t.user_attrs.get("tuner_status") == "timeout"]
    return out


def test_study_file_refuses_a_bad_trial_timeout(tmp_path: Path) -> None:
    from tuner.studies import StudyError, load_study

    ok = load_study(write_study(tmp_path, name="a", extra="trial_timeout = 30"), check_kernels=False)
    assert ok.trial_timeout == 30.0
    assert load_study(write_study(tmp_path, name="b"), check_kernels=False).trial_timeout is None
    for bad in ("0", "-5", '"10"', "true"):
        with pytest.raises(StudyError, match="trial_timeout"):
            load_study(write_study(tmp_path, name="c", extra=f"trial_timeout = {bad}"), check_kernels=False)


def test_a_hung_trial_gives_its_task_back_and_its_config_is_not_measured_again(tmp_path: Path) -> None:
    """Was: the heartbeat renewed the hung worker's lease for ever; the task stayed `running` and a
    second worker waited for it without end."""
    from tuner.studies import DONE, PENDING, RUNNING, StudyWorker, TaskBoard, load_study, prepare_study
    from tuner.studies._runner import _optuna_storage

    # The stuck worker's clock starts once its task is prepared, so its first trial (which does not hang)
    # must finish within trial_timeout. On a loaded machine (an fsync stalled by another test's I/O) that
    # took longer than six times what a whole task took a moment before: the first trial was given up,
    # the worker took the task again (attempts 3). The stuck worker therefore takes one task only
    # (`max_tasks=1`), and where its first trial outlasted the timeout (the task went back before any
    # trial hung), the scenario starts again in a new study with twice the timeout: the premise is
    # re-established, not the check relaxed. The hung trial waits out the timeout once.
    cal = prepare_study(load_study(write_study(tmp_path, name="cal", n_m=1, budget=2), check_kernels=False))
    t0 = time.monotonic()
    assert StudyWorker(cal, executor=FAKE, worker_id="cal:1", lease_s=30).run().done
    timeout = max(1.0, 3 * (time.monotonic() - t0))
    th: threading.Thread | None = None
    try:
        for round_ in range(5):
            _release.clear()
            _hung.clear()
            spec = prepare_study(
                load_study(
                    write_study(
                        tmp_path, name=f"s{round_}", n_m=1, budget=4, extra=f"trial_timeout = {timeout:.2f}"
                    ),
                    check_kernels=False,
                )
            )
            board = TaskBoard(spec.storage)
            stuck = StudyWorker(spec, executor=_hanging_executor, worker_id=f"stuck:{round_}", lease_s=30)
            outcome: list[Any] = []
            th = threading.Thread(target=_run_once, args=(stuck, outcome), daemon=True)
            th.start()
            # the task goes back to the queue while its trial still hangs (well before the 30 s lease ends)
            deadline = time.monotonic() + 120
            while True:
                [row] = board.rows(spec.name)
                if row.status == PENDING and (_hung or not th.is_alive()):
                    break
                assert row.status in (PENDING, RUNNING), row
                assert time.monotonic() < deadline, f"the hung trial still holds its task: {row}"
                time.sleep(0.1)
            if _hung:
                break
            # given back before any trial hung: the first trial outlasted trial_timeout; that worker is done
            th.join(timeout=120)
            assert outcome and outcome[0].lost, outcome
            assert not _hung
            board.close()
            timeout *= 2
        else:
            raise AssertionError(f"no first trial finished within trial_timeout, up to {timeout / 2:.1f} s")
        assert th.is_alive() and not _release.is_set()  # the trial is still stuck
        # another worker takes the task over and finishes it, without measuring the hung config again
        # (without the 1 s trial_timeout: on a loaded machine its first trial, after the task's
        # preparation, can take longer than that, and the test is about the hung trial only)
        calm = dataclasses.replace(spec, trial_timeout=None)
        other = StudyWorker(calm, executor=FAKE, worker_id="other:1", lease_s=30)
        done = other.run()
        [task] = spec.tasks
        assert done.done == [task.key], done
        [row] = board.rows(spec.name)
        assert row.status == DONE and row.attempts == 2, row
        study = _optuna_storage(spec.storage)
        trials = study.get_all_trials(study.get_study_id_from_name(task.study_name), deepcopy=False)
        timed_out = [t for t in trials if t.user_attrs.get("tuner_status") == "timeout"]
        assert [dict(t.params) for t in timed_out] == _hung, trials
        assert "trial_timeout" in timed_out[0].user_attrs["tuner_error"]
        measured = [dict(t.params) for t in trials if not t.user_attrs.get("tuner_skip")]
        assert measured.count(_hung[0]) == 1, measured
        # the report's store check does not take the hung trial, which has no measurement, for a fault
        from tuner.studies._retry import check_task
        from tuner.studies._runner import _result_store

        assert check_task(_result_store(spec.storage), study, task) == []
    finally:
        _release.set()
        if th is not None:
            th.join(timeout=120)
    assert th is not None
    # the stuck worker, once its trial returns, finds the task taken over and leaves it alone
    assert not th.is_alive()
    assert outcome and outcome[0].lost, outcome
    [row] = board.rows(spec.name)
    assert row.status == DONE, row
    board.close()


def _finishing_study(when: str) -> tuple[Any, Any, Any]:
    """An in-memory Optuna study with one RUNNING trial, whose storage finishes the trial (as the executor's
    `tell` does from its own thread) just before the first write of `when` ("attr": the marks, "state":
    the FAIL)."""
    import optuna

    from tuner.studies._retry import attempt_study_name

    storage = optuna.storages.InMemoryStorage()
    name = attempt_study_name("st", "k", 0)
    study = optuna.create_study(study_name=name, storage=storage)
    trial = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    attr = "set_trial_user_attr" if when == "attr" else "set_trial_state_values"
    orig = getattr(storage, attr)
    done: list[int] = []

    def finishing(*a: Any, **k: Any) -> Any:
        if not done:
            done.append(1)
            study.tell(trial, 1.5)
        return orig(*a, **k)

    setattr(storage, attr, finishing)
    return storage, trial, name


@pytest.mark.parametrize("when", ["attr", "state"])
def test_a_trial_that_finishes_while_given_up_keeps_its_result(when: str) -> None:
    """The trial's executor is slow, not stuck: it finishes the trial while the heartbeat gives it up.
    That trial is no hung config, giving it up goes on (the task is handed back) and it is counted
    against the store's measurements, as every finished trial (it used to raise, so the task was not
    handed back; or to keep the timeout marks on a COMPLETE trial that `check_task` then left out)."""
    import types

    import optuna

    from tuner.studies._retry import check_task
    from tuner.studies._runner import StudyWorker

    storage, trial, name = _finishing_study(when)
    worker = types.SimpleNamespace(storage=storage, worker_id="w1")
    hung = StudyWorker._fail_hung_trials(worker, types.SimpleNamespace(study_name=name), 5.0, 6.0)  # type: ignore[arg-type]
    assert hung == []
    t = storage.get_trial(trial._trial_id)
    assert t.state == optuna.trial.TrialState.COMPLETE and t.value == 1.5

    seen: list[list[int]] = []

    class _Store:
        def check_trials(self, study_name: str, trials: list[Any]) -> Any:
            seen.append([x.number for x in trials])
            return types.SimpleNamespace(consistent=True)

    check_task(_Store(), storage, types.SimpleNamespace(study="st", key="k", retries=0, problem={}))  # type: ignore[arg-type]
    assert seen == [[t.number]]


@pytest.fixture(scope="module")
def cold_trial_timeout(tmp_path_factory: pytest.TempPathFactory) -> float:
    """tests/test_study_supervisor.py's calibrated `trial_timeout` (timed once per test run)."""
    from tests.test_study_supervisor import calibrated_trial_timeout

    return calibrated_trial_timeout(tmp_path_factory)


def test_a_worker_process_stuck_in_a_hung_trial_is_replaced_and_the_study_finishes(
    tmp_path: Path, cold_trial_timeout: float
) -> None:
    """Was: `tuner study run` with `trial_timeout` handed the hung trial's task back, but its process
    stayed stuck in the trial for ever (the run never returned, nothing else was measured there). Now the
    worker runs in a process of its own, which exits after the hand-back; the runner starts another,
    which finishes the study without measuring the hung config again."""
    import json
    import os
    import subprocess

    from tests.test_studies import REPO, _worker_cmd
    from tuner.studies import DONE, TaskBoard, load_study
    from tuner.studies._retry import check_task
    from tuner.studies._runner import _optuna_storage, _result_store

    # trial_timeout: far above a normal trial here, on a loaded machine too. Each worker process the
    # runner starts (the first, the one that replaces it) is bound by it from its first trial on, which
    # pays the process's cold imports; with 1 s, three busy loops beside the run made normal trials time
    # out too (four trials given up instead of one). Only the trial that hangs must reach it, and the run
    # waits it out once: calibrated to the machine's load (1.5 whole cold runs, about ten times a cold
    # first trial), as test_study_supervisor's stopped worker, not a fixed 15 s.
    path = write_study(tmp_path, n_m=2, budget=4, extra=f"trial_timeout = {cold_trial_timeout:.2f}")
    spec = load_study(path, check_kernels=False)
    evals = tmp_path / "evals.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_HANG_ONCE": str(tmp_path / "hung"),
        "FAKE_EVAL_LOG": str(evals),
    }
    proc = subprocess.Popen(
        _worker_cmd(path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"`tuner study run` is still stuck in the hung trial: {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert (tmp_path / "hung").exists()  # a trial did hang
    assert "starting another" in err, err[-3000:]
    board = TaskBoard(spec.storage)
    rows = board.rows(spec.name)
    board.close()
    assert [r.status for r in rows] == [DONE, DONE], rows
    study = _optuna_storage(spec.storage)
    timed_out = [(task.key, dict(t.params)) for task, t in timed_out_trials(spec)]
    for task in spec.tasks:
        assert check_task(_result_store(spec.storage), study, task) == []
    assert len(timed_out) == 1, timed_out
    measured = [json.loads(line) for line in evals.read_text(encoding="utf-8").splitlines()]
    key, config = timed_out[0]
    assert not [m for m in measured if m["task"] == key and m["config"] == config], measured


def test_a_trial_that_finishes_while_the_heartbeat_waits_for_the_lock_is_progress() -> None:
    """The heartbeat found the task overdue, then waited for the lease's lock while the trial's callback
    held it to record a finished trial: it gave the task up all the same (was: the check was not asked
    again under the lock), so a worker that was making progress lost its task."""
    import types

    from tuner.studies._runner import _Lease

    finished: list[str] = []
    board = types.SimpleNamespace(finish=lambda claim, status, **kw: finished.append(status) or True)
    claim = types.SimpleNamespace(task=types.SimpleNamespace(key="k"))
    given_up: list[float] = []
    lease = _Lease(
        board, claim, 30.0, None, trial_timeout=1.0, on_timeout=lambda idle: given_up.append(idle) or []
    )  # type: ignore[arg-type]
    lease.begin(0, (None, None))
    lease.last_progress -= 5.0  # overdue, as `_beat` saw it
    assert lease._overdue()
    with lease.lock:  # the callback of a finished trial holds the lock ...
        th = threading.Thread(target=lease._time_out, daemon=True)
        th.start()
        time.sleep(0.2)  # ... while the heartbeat waits for it (it cannot go on without the lock)
        lease.last_progress = time.monotonic()  # the trial finished
    th.join(timeout=30)
    assert not th.is_alive()
    assert not lease.lost.is_set() and not lease.timed_out and finished == [] and given_up == []
