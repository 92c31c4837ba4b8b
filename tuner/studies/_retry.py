"""`--retry-failed`: a retried task runs in an Optuna study of its own, seeded with the earlier successes.

Optuna cannot change a finished trial, and `tuner.optimize` counts every finished trial of the study it
resumes, failed ones included, and never measures their configs again. Resuming a failed task's study
would therefore spend nothing on the configs that failed (a task whose every trial failed would fail
again at once). So each retry (the board's `StudyTask.retries`, raised by `TaskBoard.retry_failed`) is a
new *attempt* in its own Optuna study, `<study>:<key>#retry<n>` (`StudyTask.study_name`), and the worker
that claims the task seeds it (`seed_retry`) with the successful (COMPLETE) trials of every earlier
attempt, added with `study.add_trial`: they count towards the budget and are not measured again. The
failed trials stay, untouched, in the earlier attempts' studies (history, shown by optuna-dashboard) and
their configs may be measured again. A failure that the retry cannot fix (an `incorrect` config) is
measured again once per retry too: a retry is the user saying the cause is fixed, and telling a
config's own fault from its environment's is not something tuner can do reliably.

A seeded trial keeps its user attributes and gets `tuner_carried_from` (the study it was measured in) and
`tuner_carried_trial` (its number there). Its measurement stays under that study's name in the results
store, so the store check (`check_task`) compares each attempt's own trials with its own measurements.
Seeding is idempotent (trials already carried are not added again), so a worker that takes over an
interrupted retry continues the same attempt.
"""

from __future__ import annotations

import logging
from typing import Any

from tuner._scoped import optuna_quiet
from tuner.store import CARRIED_FROM, CARRIED_TRIAL, _match_key

from ..storage import operation
from ._spec import StudyTask, attempt_study_name

log = logging.getLogger(__name__)


def task_trials(storage: Any, study_name: str) -> list[Any]:
    """The finished trials of a task's Optuna study that count (COMPLETE or FAIL, not tuner_skip)."""
    import optuna

    try:
        sid = storage.get_study_id_from_name(study_name)
    except KeyError:
        return []
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    return [
        t
        for t in storage.get_all_trials(sid, deepcopy=False, states=states)
        if not t.user_attrs.get("tuner_skip")
    ]


def attempt_names(task: StudyTask) -> list[str]:
    """The Optuna studies of every attempt of `task`, the first one first and its current one last."""
    return [attempt_study_name(task.study, task.key, n) for n in range(task.retries + 1)]


# The user attribute of a trial that its worker gave up as hung (the study's `trial_timeout`): the worker
# that marked it, counted as a failed trial, with no measurement (`check_task`).
TIMED_OUT = "tuner_timed_out_by"


def _timed_out(trial: Any) -> bool:
    """Whether `trial` was given up as hung: marked so (`TIMED_OUT`) and failed, not finished meanwhile."""
    import optuna

    return bool(trial.user_attrs.get(TIMED_OUT)) and trial.state == optuna.trial.TrialState.FAIL


def own_trials(trials: list[Any]) -> list[Any]:
    """The trials measured in their own study (not carried over from an earlier attempt)."""
    return [t for t in trials if not t.user_attrs.get(CARRIED_FROM)]


def seed_retry(storage: Any, task: StudyTask) -> int:
    """Create the Optuna study of a retried task's current attempt (when missing) and add to it the
    successful trials of the earlier attempts that it does not hold yet; returns how many were added.
    Nothing for a task never retried. The caller holds the task's lease."""
    if not task.retries:
        return 0
    import optuna

    with optuna_quiet(), operation(f"seeding study {task.study_name!r} with the earlier successes"):
        study = optuna.create_study(
            storage=storage,
            study_name=task.study_name,
            sampler=optuna.samplers.RandomSampler(seed=0),  # the study's sampler is not stored
            direction="minimize",
            load_if_exists=True,
        )
        present = {
            _match_key(t.params)
            for t in task_trials(storage, task.study_name)
            if t.state == optuna.trial.TrialState.COMPLETE
        }
        added = 0
        for name in attempt_names(task)[:-1]:
            for t in own_trials(task_trials(storage, name)):
                if t.state != optuna.trial.TrialState.COMPLETE or _match_key(t.params) in present:
                    continue
                present.add(_match_key(t.params))
                study.add_trial(
                    optuna.trial.create_trial(
                        params=dict(t.params),
                        distributions=dict(t.distributions),
                        value=t.value,
                        user_attrs={**t.user_attrs, CARRIED_FROM: name, CARRIED_TRIAL: t.number},
                    )
                )
                added += 1
    if added:
        log.info(
            "task %s: retry %d starts from %d earlier successful trial(s)", task.key, task.retries, added
        )
    return added


def check_task(store: Any, storage: Any, task: StudyTask) -> list[tuple[str, Any]]:
    """The store check of every attempt of `task`: (study name, `tuner.store.TrialCheck`) of each attempt
    whose own counted trials and stored measurements disagree (carried trials are checked in the study
    they were measured in)."""
    if "factory" in task.problem:
        # a decorated function's task (`run_decorated`): its measurements are in the function's own
        # store, where the runtime reads them; the study database holds only the trials. Nothing to compare.
        return []
    out = []
    for name in attempt_names(task):
        # a trial its worker gave up as hung (`trial_timeout`) has no measurement: none was ever taken. A
        # COMPLETE trial with the mark finished while it was being given up (`_fail_hung_trials`): counted
        counted = [t for t in own_trials(task_trials(storage, name)) if not _timed_out(t)]
        check = store.check_trials(name, counted)
        if not check.consistent:
            out.append((name, check))
    return out
