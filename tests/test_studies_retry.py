"""`tuner study run --retry-failed`: a retried task runs in an Optuna study of its own, seeded with the
earlier attempts' successes, so it gets its budget again for the configs that failed, keeps (and does not
measure again) what succeeded, and leaves the failed trials in the database. The executor is the synthetic
one of tests/_study_fake.py (real `tuner.optimize`, real storage), broken and fixed through FAKE_BROKEN."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests import _study_fake
from tests.test_studies import FAKE, write_study

CRASHING = "tests._study_fake:crashing_executor"

pytestmark = pytest.mark.filterwarnings("ignore::tuner.AllTrialsFailedWarning")


def _row(spec: Any) -> Any:
    from tuner.studies import TaskBoard

    board = TaskBoard(spec.storage)
    try:
        (row,) = board.rows(spec.name)
    finally:
        board.close()
    return row


def _trials(spec: Any, study_name: str) -> list[Any]:
    from tuner.studies import task_trials
    from tuner.studies._runner import _optuna_storage

    return sorted(task_trials(_optuna_storage(spec.storage), study_name), key=lambda t: t.number)


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _evals(log: Path) -> Counter[str]:
    return Counter(_key(json.loads(line)["config"]) for line in log.read_text(encoding="utf-8").splitlines())


def _broken(t: Any) -> bool:
    return "FAKE_BROKEN" in str(t.user_attrs.get("tuner_error", ""))


def _check_report_and_export(spec: Any, row: Any, tmp_path: Path) -> None:
    from tuner.studies import export_study, write_report

    md = write_report(spec, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert "Store check" not in md, md  # each attempt's own trials have their measurements
    assert "Retried 1 time(s)" in md and row.task.study_name in md
    export_study(spec, tmp_path / "cache.json")
    (entry,) = json.loads((tmp_path / "cache.json").read_text(encoding="utf-8"))["entries"]
    assert entry["config"] == row.best_config


def test_a_task_whose_every_trial_failed_gets_its_budget_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.store import ResultStore
    from tuner.studies import DONE, FAILED, load_study, run_study

    spec = load_study(write_study(tmp_path, n_m=1, budget=4), check_kernels=False)
    (task,) = spec.tasks
    monkeypatch.setenv("FAKE_BROKEN", "all")  # the backend is not installed
    assert run_study(spec, executor=FAKE).counts[FAILED] == 1
    assert "every one of 4 trials failed" in (_row(spec).error or "")
    monkeypatch.delenv("FAKE_BROKEN")  # installed now: a plain run does not retry ...
    assert run_study(spec, executor=FAKE).counts[FAILED] == 1
    # ... --retry-failed does, with the whole budget for the configs that failed
    assert run_study(spec, executor=FAKE, retry_failed=True).counts[DONE] == 1
    row = _row(spec)
    assert row.status == DONE and row.task.retries == 1 and row.task.study_name != task.study_name
    now = _trials(spec, row.task.study_name)
    assert len(now) == 4 and not any(_broken(t) for t in now)
    ok = [t for t in now if t.value is not None]
    best = min(ok, key=lambda t: t.value)
    assert row.best_config == best.params and row.best_value == best.value
    # the first attempt's failed trials and their measurements stay in the database as history
    first = _trials(spec, task.study_name)
    assert len(first) == 4 and all(_broken(t) and t.value is None for t in first)
    stored = ResultStore(spec.storage).measurements(study_name=task.study_name)
    assert len(stored) == 4 and all(m.value is None for m in stored)
    _check_report_and_export(spec, row, tmp_path)


def test_a_retry_keeps_the_successes_and_measures_the_failed_configs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.studies import DONE, FAILED, load_study, run_study

    budget = 8
    spec = load_study(write_study(tmp_path, n_m=1, budget=budget), check_kernels=False)
    (task,) = spec.tasks
    log = tmp_path / "evals.jsonl"
    monkeypatch.setenv("FAKE_EVAL_LOG", str(log))
    monkeypatch.setenv("FAKE_BROKEN", "warps")  # some configs fail for a cause outside them ...
    monkeypatch.setenv("FAKE_CRASH_AFTER", "5")  # ... and the run dies after 5 trials
    assert run_study(spec, executor=CRASHING).counts[FAILED] == 1
    assert "measuring process died" in (_row(spec).error or "")
    first = _trials(spec, task.study_name)
    ok_first = {_key(t.params): t.value for t in first if t.value is not None}
    failed_first = [t for t in first if _broken(t)]
    assert len(first) == 5 and ok_first and failed_first  # both kinds, for the test to mean something

    monkeypatch.delenv("FAKE_BROKEN")
    monkeypatch.delenv("FAKE_CRASH_AFTER")
    assert run_study(spec, executor=CRASHING, retry_failed=True).counts[DONE] == 1
    row = _row(spec)
    now = _trials(spec, row.task.study_name)
    assert len(now) == budget
    assert not any(_broken(t) for t in now)  # the failures of the first attempt do not count
    kept = {_key(t.params): t.value for t in now if t.user_attrs.get("tuner_carried_from")}
    assert kept == ok_first  # every success kept, with its value ...
    evals = _evals(log)
    assert all(evals[k] == 1 for k in ok_first)  # ... and not measured again
    assert sum(evals.values()) == 5 + budget - len(ok_first)
    ok = [t for t in now if t.value is not None]
    assert row.best_value == min(t.value for t in ok)
    assert len(_trials(spec, task.study_name)) == 5  # the first attempt, untouched
    _check_report_and_export(spec, row, tmp_path)


def test_an_interrupted_retry_resumes_the_same_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.studies import DONE, FAILED, PENDING, load_study, run_study

    path = write_study(tmp_path, n_m=1, budget=6)
    spec = load_study(path, check_kernels=False)
    (task,) = spec.tasks
    monkeypatch.setenv("FAKE_BROKEN", "all")
    assert run_study(spec, executor=FAKE).counts[FAILED] == 1
    monkeypatch.delenv("FAKE_BROKEN")
    log = tmp_path / "evals.jsonl"
    monkeypatch.setenv("FAKE_EVAL_LOG", str(log))
    calls = {"n": 0}

    def interrupted(t: Any, *, prior: Any = None, callback: Any = None) -> Any:
        def each(*a: Any, **k: Any) -> None:
            callback(*a, **k)
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt  # Ctrl-C after two trials of the retry

        return _study_fake.executor(t, prior=prior, callback=each)

    with pytest.raises(KeyboardInterrupt):
        run_study(spec, executor=interrupted, retry_failed=True)
    row = _row(spec)
    assert row.status == PENDING and row.task.retries == 1
    before = [_key(t.params) for t in _trials(spec, row.task.study_name)]
    assert len(before) == 2
    # the study file edited meanwhile (a larger budget) and run again without --retry-failed: the same
    # attempt goes on, its finished trials kept and not measured again
    path.write_text(path.read_text(encoding="utf-8").replace("trials = 6", "trials = 7"), encoding="utf-8")
    spec = load_study(path, check_kernels=False)
    assert run_study(spec, executor=FAKE).counts[DONE] == 1
    row = _row(spec)
    assert row.task.retries == 1
    after = [_key(t.params) for t in _trials(spec, row.task.study_name)]
    assert len(after) == 7 == len(set(after)) and set(before) <= set(after)
    evals = _evals(log)
    assert all(evals[k] == 1 for k in before)
    assert len(_trials(spec, task.study_name)) == 6  # the failed first attempt, kept


def test_tune_kernel_reads_a_carried_trials_measurement_from_the_study_it_was_measured_in(
    tmp_path: Path,
) -> None:
    """The default executor (`tune_kernel`) resuming a retry's study gives each carried trial the
    measurement stored under the study it was measured in: its full statistics (the report's tables and
    the finalists' selection read them), not a one-run result made of the value Optuna kept."""
    from dataclasses import replace

    from tests.test_measure import BLOCKS, FAST
    from tuner.measure import KernelMeasurer, config_order_key
    from tuner.store import ResultStore
    from tuner.studies import StudyTask
    from tuner.studies._retry import seed_retry
    from tuner.tune import tune_kernel

    url = f"sqlite:///{tmp_path / 'retry.db'}"
    task = StudyTask("s", "toy", "toy_blocks", {}, "triton", "cpu", 6, None, "random", 0, storage=url)
    measured: list[str] = []

    class Counting(KernelMeasurer):
        def measure(self, config: Any) -> Any:
            measured.append(config_order_key(config))
            return super().measure(config)

    m = Counting(BLOCKS, None, "triton", device="cpu", timing=FAST, isolation="inprocess")

    def run(t: StudyTask) -> Any:
        return tune_kernel(
            BLOCKS,
            None,
            backend="triton",
            device="cpu",
            budget=t.budget,
            strategy=t.strategy,
            seed=t.seed,
            storage=url,
            measurer=m,
            finalists=1,
            study_name=t.study_name,
        )

    try:
        first = run(task)
        # the statistics as stored, extras included (the raw samples are not kept)
        ok = {config_order_key(t.config): t.result.stats() for t in first.trials if t.result.ok}
        assert ok and all(r["n"] > 1 for r in ok.values())  # several runs each: more than a value to carry
        retry = replace(task, retries=1)
        assert seed_retry(ResultStore(url).optuna_storage(), retry) == len(ok)
        measured.clear()
        again = run(retry)
    finally:
        m.close()
    assert not set(measured) & set(ok)  # the carried trials were not measured again ...
    carried = {k: t.result.stats() for t in again.trials if (k := config_order_key(t.config)) in ok}
    assert carried == ok  # ... and come back with the measurement made in the first attempt
