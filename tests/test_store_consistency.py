"""A worker that stops between the two writes of a trial (the measurement into `tuner_measurements`, the
trial into Optuna's tables) leaves the store consistent: the resumed study counts every trial whose
measurement was stored (without measuring it again), and every counted trial has exactly one measurement.

Real server (127.0.0.1:5432, tests/pg.py). The fault is a `StoreTimeout` raised by the one write (what a
statement timeout there raises), injected on the 4th trial; then the study is resumed without it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pg import fresh_database
from tests.test_studies import FAKE, write_study

pytestmark = pytest.mark.postgres

BUDGET = 6
FAULT_AT = 4  # the trial whose second write fails


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_database()


def _inject(monkeypatch: pytest.MonkeyPatch, write: str, url: str) -> list[int]:
    """Make the FAULT_AT-th call of one write raise StoreTimeout: "measurement" (the insert into
    tuner_measurements) or "optuna" (Optuna's write that finishes the trial). Returns the call counter."""
    import optuna

    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore

    n = [0]
    if write == "measurement":
        cls: Any = ResultStore
        name = "record"
    else:
        cls, name = optuna.storages.RDBStorage, "set_trial_state_values"
    orig = getattr(cls, name)

    def faulty(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = args[1] if len(args) > 1 else kwargs.get("state")
        if write == "measurement" or state.is_finished():  # Optuna's `ask` sets RUNNING through it too
            n[0] += 1
            if n[0] == FAULT_AT:
                raise StoreTimeout(f"store {url}: injected fault on the {write} write")
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, faulty)
    return n


def _counted(url: str, study_name: str) -> list[dict[str, Any]]:
    from tuner.studies import task_trials
    from tuner.studies._runner import _optuna_storage

    return [dict(t.params) for t in task_trials(_optuna_storage(url), study_name)]


def _measured(url: str, study_name: str) -> list[dict[str, Any]]:
    from tuner.store import ResultStore

    return [m.config for m in ResultStore(url).measurements(study_name=study_name)]


def _key(c: dict[str, Any]) -> str:
    return json.dumps(c, sort_keys=True)


def _assert_consistent(url: str, study_name: str, evaluated: list[dict[str, Any]], write: str) -> None:
    counted, measured = _counted(url, study_name), _measured(url, study_name)
    assert len(counted) == BUDGET and len({_key(c) for c in counted}) == BUDGET, counted
    # every counted trial has exactly one measurement, and there is none without a counted trial
    assert sorted(map(_key, measured)) == sorted(map(_key, counted)), (measured, counted)
    if write == "optuna":
        # the trial measured and stored before the fault counts after the resume: it is not measured again
        assert sorted(map(_key, evaluated)) == sorted(map(_key, counted)), evaluated
    else:
        # its measurement never reached the store, so that trial does not count (the search goes on and
        # may measure its config again); every other config was measured once
        lost = evaluated[FAULT_AT - 1]
        others = evaluated[: FAULT_AT - 1] + evaluated[FAULT_AT:]
        assert len(evaluated) == BUDGET + 1 and len({_key(c) for c in others}) == BUDGET, evaluated
        assert {_key(c) for c in counted} == {_key(c) for c in others}, (lost, counted)


@pytest.mark.parametrize("write", ["measurement", "optuna"])
def test_optimize_resumed_after_a_fault_between_the_two_writes(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    import tuner
    from tuner.storage import StoreTimeout
    from tuner.store import ResultStore

    space = tuner.SearchSpace.from_configs([{"x": i, "y": i % 3} for i in range(20)])
    evaluated: list[dict[str, Any]] = []

    def objective(c: dict[str, Any]) -> float:
        evaluated.append(dict(c))
        if c["x"] % 4 == 0:
            raise RuntimeError("a failing config")  # failed trials are kept and reconciled as well
        return float(c["x"] * 7 % 11)

    def run() -> Any:
        return tuner.optimize(
            space,
            objective,
            budget=BUDGET,
            seed=1,
            strategy="random",
            storage=ResultStore(pg_url),
            study_name="s",
        )

    with monkeypatch.context() as m:
        calls = _inject(m, write, pg_url)
        with pytest.raises(StoreTimeout, match="injected fault"):
            run()
        assert calls[0] == FAULT_AT
    res = run()  # resumes: the same storage and study name
    assert len(res.trials) == BUDGET
    _assert_consistent(pg_url, "s", evaluated, write)


@pytest.mark.parametrize("write", ["measurement", "optuna"])
def test_a_study_worker_stopped_between_the_two_writes_resumes_consistently(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, write: str
) -> None:
    """The study runner: the worker stops with the StoreTimeout (its task back in the queue); the next
    run takes the task up, finishes the trial whose measurement is stored instead of abandoning it, and
    completes the study."""
    from tuner.storage import StoreTimeout
    from tuner.studies import load_study, run_study

    log = tmp_path / "evals.jsonl"
    monkeypatch.setenv("FAKE_EVAL_LOG", str(log))
    spec = load_study(write_study(tmp_path, n_m=1, budget=BUDGET), storage=pg_url, check_kernels=False)
    [task] = spec.tasks
    with monkeypatch.context() as m:
        _inject(m, write, pg_url)
        with pytest.raises(StoreTimeout, match="injected fault"):
            run_study(spec, executor=FAKE)
    summary = run_study(spec, executor=FAKE)
    assert summary.complete and not summary.failed, summary
    evaluated = [json.loads(line)["config"] for line in log.read_text(encoding="utf-8").splitlines()]
    _assert_consistent(pg_url, task.study_name, evaluated, write)
