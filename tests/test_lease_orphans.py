"""A worker that is still alive but lost its lease (its heartbeat was late, another worker took the task
over) leaves no measurement behind that no counted trial refers to, and stops working on the task.

The takeover is forced deterministically, in the old worker's own thread, at the point that matters: just
before the old worker writes a trial's measurement, or between that write and telling Optuna. The new
worker then runs the whole task. Afterwards, and after the task is resumed with a larger budget, every
counted trial (COMPLETE, or FAIL not skipped) has exactly one measurement row and every measurement row a
counted trial. On SQLite and on the real PostgreSQL server (127.0.0.1:5432, tests/pg.py).

Also: a store written by an older tuner (Optuna told first) may hold counted trials without a
measurement; `tuner study report` names them instead of inventing measurements for them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pg import sqlite_or_postgres
from tests.test_studies import FAKE, write_study

BUDGET = 6
TAKEOVER_AT = 3  # the old worker's trial during which its lease is lost


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres(request.param, tmp_path / "study.db")


def _key(c: dict[str, Any]) -> str:
    return json.dumps(c, sort_keys=True)


def _assert_consistent(url: str, study_name: str, n: int) -> None:
    """`n` counted trials of distinct configs, each with exactly one measurement row, and no measurement
    row (of a trial: finalists' re-measurements are not trials) without a counted trial."""
    from tuner.store import ResultStore
    from tuner.studies import task_trials
    from tuner.studies._runner import _optuna_storage

    counted = [_key(dict(t.params)) for t in task_trials(_optuna_storage(url), study_name)]
    measured = [
        _key(m.config)
        for m in ResultStore(url).measurements(study_name=study_name)
        if m.stats.get("phase") != "final"
    ]
    assert len(counted) == n and len(set(counted)) == n, counted
    assert sorted(measured) == sorted(counted), (measured, counted)


def _expire(url: str, row_id: int) -> None:
    """The old worker's heartbeat is late: its lease has run out (as the database's clock sees it)."""
    from sqlalchemy import update

    from tuner.storage import engine_for
    from tuner.storage._schema import tasks_table

    with engine_for(url).begin() as conn:
        conn.execute(update(tasks_table).where(tasks_table.c.id == row_id).values(lease_expires_at=0.0))


@pytest.mark.parametrize("when", ["before_measurement", "before_tell"])
def test_a_worker_that_lost_its_lease_leaves_no_orphan_measurement(
    url: str, when: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import tuner._optimize
    from tuner.store import ResultStore
    from tuner.studies import StudyWorker, load_study, prepare_study, run_study

    monkeypatch.setenv("FAKE_EVAL_LOG", str(tmp_path / "evals.jsonl"))
    spec = prepare_study(
        load_study(write_study(tmp_path, n_m=1, budget=BUDGET), storage=url, check_kernels=False)
    )
    [task] = spec.tasks
    old = StudyWorker(spec, executor=FAKE, worker_id="old")
    new = StudyWorker(spec, executor=FAKE, worker_id="new")
    claim = old.board.claim(spec.name, "old", 60)
    assert claim is not None
    calls, new_outcome = [0], []

    def takeover() -> None:
        _expire(url, claim.row_id)
        c2 = new.board.claim(spec.name, "new", 60)
        assert c2 is not None and c2.task.key == task.key
        new_outcome.append(new.run_task(c2))

    def hooked(orig: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == TAKEOVER_AT:  # once: the new worker's own calls pass straight through
                takeover()
            return orig(*args, **kwargs)

        return call

    if when == "before_measurement":
        monkeypatch.setattr(ResultStore, "record", hooked(ResultStore.record))
    else:
        monkeypatch.setattr(tuner._optimize, "_tell", hooked(tuner._optimize._tell))
    outcome = old.run_task(claim)
    monkeypatch.undo()
    assert new_outcome == ["done"]
    _assert_consistent(url, task.study_name, BUDGET)
    assert outcome == "lost"  # it stopped, and did not report the task failed

    # Resumed: a larger budget reopens the task; the next run counts what is there and adds the rest.
    monkeypatch.setenv("FAKE_EVAL_LOG", str(tmp_path / "evals.jsonl"))
    spec2 = load_study(write_study(tmp_path, n_m=1, budget=BUDGET + 2), storage=url, check_kernels=False)
    summary = run_study(spec2, executor=FAKE)
    assert summary.complete and not summary.failed, summary
    _assert_consistent(url, task.study_name, BUDGET + 2)


def test_the_guard_refuses_a_measurement_once_the_task_is_taken_over(url: str, tmp_path: Path) -> None:
    """A late heartbeat alone (the lease ran out, nobody took the task over) does not refuse the worker's
    measurement: whoever takes over next reads it. Once another worker has claimed the task, a
    measurement of the task's study is refused (nothing written); one of another study, or written
    outside the worker's guard, is not fenced."""
    import functools

    from tuner.storage import LeaseLost, guarding
    from tuner.store import ResultStore
    from tuner.studies import LeaseLost as StudiesLeaseLost
    from tuner.studies import TaskBoard, load_study, prepare_study

    assert StudiesLeaseLost is LeaseLost  # executors catch the one they know
    spec = prepare_study(load_study(write_study(tmp_path, n_m=1), storage=url, check_kernels=False))
    [task] = spec.tasks
    board = TaskBoard(url)
    claim = board.claim(spec.name, "w", 60)
    assert claim is not None
    store = ResultStore(task.storage)

    def rec(study: str) -> int:
        return store.record(None, "fp", {"x": 1}, 1.0, "ok", study_name=study)

    with guarding(task.storage, task.study_name, functools.partial(board.hold, claim=claim)):
        rec(task.study_name)
        _expire(url, claim.row_id)
        rec(task.study_name)  # ran out, not taken over
        assert board.claim(spec.name, "other", 60) is not None
        with pytest.raises(LeaseLost, match="lease of task .* lost"):
            rec(task.study_name)
        rec("another study")
    rec(task.study_name)
    assert len(store.measurements(study_name=task.study_name)) == 3
    assert len(store.measurements(study_name="another study")) == 1


def test_report_names_counted_trials_without_a_measurement(url: str, tmp_path: Path) -> None:
    """A store damaged by an older tuner: one counted trial lost its measurement row (Optuna was told
    first), and one measurement belongs to no counted trial (a worker that had lost its lease). The
    report says so in the task's section; nothing is re-recorded, and a resumed run neither measures the
    trial again nor makes a measurement up for it."""
    from sqlalchemy import delete, select

    from tuner.storage import engine_for
    from tuner.storage._schema import MeasurementRow
    from tuner.store import ResultStore
    from tuner.studies import load_study, run_study, task_trials, write_report
    from tuner.studies._runner import _optuna_storage

    spec = load_study(write_study(tmp_path, n_m=1, budget=4), storage=url, check_kernels=False)
    [task] = spec.tasks
    assert run_study(spec, executor=FAKE).complete
    clean = write_report(spec, tmp_path / "clean").markdown.read_text(encoding="utf-8")
    assert "Store check" not in clean

    trials = sorted(task_trials(_optuna_storage(url), task.study_name), key=lambda t: t.number)
    victim = trials[1]
    store = ResultStore(url)
    with engine_for(url).begin() as conn:
        ids = conn.execute(
            select(MeasurementRow.id, MeasurementRow.config).where(
                MeasurementRow.study_name == task.study_name
            )
        ).all()
        [gone] = [i for i, c in ids if _key(c) == _key(dict(victim.params))]
        conn.execute(delete(MeasurementRow).where(MeasurementRow.id == gone))
    store.record(None, "fp", {"BLOCK_M": 999}, 1.0, "ok", study_name=task.study_name)
    check = store.check_trials(task.study_name, trials)
    assert check.unmeasured == (victim.number,) and check.unmatched_measurements == 1

    md = write_report(spec, tmp_path / "damaged").markdown.read_text(encoding="utf-8")
    assert "Store check: the trials and the stored measurements of 1 task(s) disagree" in md
    assert (
        f"1 counted trial(s) have no measurement in the results store (Optuna trial numbers {victim.number})"
        in md
    )
    assert "1 stored measurement(s) belong to no counted trial" in md

    spec2 = load_study(write_study(tmp_path, n_m=1, budget=6), storage=url, check_kernels=False)
    assert run_study(spec2, executor=FAKE).complete
    after = task_trials(_optuna_storage(url), task.study_name)
    assert len(after) == 6 and len({_key(dict(t.params)) for t in after}) == 6  # not measured again
    assert store.check_trials(task.study_name, after).unmeasured == (victim.number,)  # nor made up
