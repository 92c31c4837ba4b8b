"""Running a study: workers that claim tasks from the board, tune them, and hand them back.

An *executor* tunes one task: `executor(task, *, prior, callback) -> result`, where `task` is a
`StudyTask` (kernel, problem with dtype, backend, device, budget, strategy, seed, storage URL and the
Optuna `study_name` to keep its trials in), `prior` is measurements of finished similar tasks (the
`prior` format of `tuner.optimize`) and `callback(trial, ...)` must be called after every finished trial
(it renews the lease and raises `LeaseLost` when the task was taken over). `result` has `.best_config`
and `.best_value` (a `TuneResult` or the measurement layer's `KernelTuneResult`). The default executor
calls `tuner.tune.tune_kernel`; tests and plugins pass another one (`--executor module:function`).

Resuming is the executor's storage doing its job: the task's Optuna study is created with
`load_if_exists`, and `tuner.optimize` counts its finished trials and never measures them again. A task
put back by `--retry-failed` runs in a new Optuna study that the worker seeds with the earlier attempts'
successful trials (`tuner.studies._retry`), so its failed configs are measured again. Before
an executor starts on a task, trials that a dead worker left RUNNING or WAITING are marked FAIL with the
user attribute `tuner_skip = "abandoned"` (ignored when resuming and in reports). A RUNNING trial whose
measurement is in the results store (the worker stopped between recording it and telling Optuna:
`tuner.optimize` records first) is not abandoned but told from that measurement.

A worker that is still alive but lost its lease (its heartbeat came late and another worker took the
task over) stops at its next write: the measurements of the task's study commit only while no other
worker has claimed the task (`tuner.storage.guarding`, the board's `hold` in the same transaction), so
its next measurement
raises `LeaseLost` with nothing written (the trial is marked abandoned) and never turns into a
measurement that no counted trial refers to; a measurement that committed just before the takeover is
told by the new holder, and the old worker's own `tell` then fails. Either way the old worker ends the
task as "lost", not failed.

A SQLite study database deleted or replaced while the study runs (SQLite would go on writing into the
deleted file, lost at exit) stops the worker at its next write with a `StoreError` naming the file, nothing
written after it (`tuner.storage._replaced`); `run_study` checks the file once more when its workers are
done, and opens the path again when it starts (a deleted study is then run anew).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner._atomic import make_folders, remove_made_folders
from tuner._settings import flag

from ..storage import LeaseLost, StoreError, close_idle_connections, guarding, normalize_url, sqlite_path
from ..storage import _engine as _store_engine
from ..storage._owner import HOST
from ..storage._replaced import file_identity, holding, reopen_if_replaced, replaced_error
from ._board import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    Claim,
    TaskBoard,
    TaskRow,
    describe_worker,
    device_clash_message,
    retry,
    summarize,
)
from ._retry import TIMED_OUT, seed_retry, task_trials
from ._spec import StudyError, StudySpec, StudyTask, task_distance

log = logging.getLogger(__name__)

__all__ = [
    "WorkersStopped",
    "Executor",
    "LeaseLost",
    "StudyWorker",
    "WorkerSummary",
    "RunSummary",
    "default_executor",
    "resolve_executor",
    "run_study",
    "prepare_study",
    "task_trials",
    "no_winner_reason",
    "study_rows",
]

Executor = Callable[..., Any]
# Trials per task when only a time budget is given (the space or the clock ends the task first).
UNLIMITED_TRIALS = 1_000_000
ENV_STORAGE = "TUNER_STUDY_STORAGE"
# Set by the study runner for the worker processes it starts (`_run_prepared`): such a worker, once it has
# given a hung trial up (`trial_timeout`), ends its process with EXIT_HUNG, and the runner starts another in
# its place. The hung call cannot be stopped inside the process (a deadlocked kernel holds its GPU context).
ENV_WORKER_PROCESS = "TUNER_STUDY_WORKER_PROCESS"
EXIT_HUNG = 3
# Without `trial_timeout` nothing gives a hung trial up, so the worker says it is stuck instead: once its
# task went STALL_FACTOR times its slowest finished trial, and at least STALL_MIN_S seconds, without a
# finished trial, one warning names the task, the worker's process and the config in flight, and says how
# to set `trial_timeout`; again each time the wait doubles (`_Lease._stalled`).
STALL_MIN_S = 600.0
STALL_FACTOR = 10.0


def default_executor(
    task: StudyTask, *, prior: Any = None, callback: Callable[..., None] | None = None
) -> Any:
    """Tune `task` with the measurement layer (`tuner.tune.tune_kernel`, times in milliseconds)."""
    try:
        from tuner.tune import tune_kernel  # type: ignore[import-not-found]
    except ImportError as exc:  # pragma: no cover - until the measurement layer is merged
        raise RuntimeError(
            "the default study executor needs tuner.tune.tune_kernel (the measurement layer), "
            f"which is not importable: {exc}"
        ) from exc
    kwargs: dict[str, Any] = dict(
        backend=task.backend,
        device=task.device,
        budget=task.budget or UNLIMITED_TRIALS,
        strategy=task.strategy,
        seed=task.seed,
        storage=task.storage,
        prior=prior or None,
        time_budget_s=task.time_budget_s,
        callback=callback,
    )
    if task.finalists is not None:
        kwargs["finalists"] = task.finalists
    if "study_name" in inspect.signature(tune_kernel).parameters:
        kwargs["study_name"] = task.study_name
    else:
        _warn_once(
            "tuner.tune.tune_kernel takes no study_name: its trials are not kept in the task's Optuna "
            "study, so an interrupted task starts over and reports lack convergence curves"
        )
    from tuner._optimize import AllTrialsFailedWarning

    with warnings.catch_warnings():  # a task whose every trial failed is reported by the runner itself
        warnings.simplefilter("ignore", AllTrialsFailedWarning)
        return tune_kernel(task.kernel, dict(task.problem), **kwargs)


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning(msg)


def resolve_executor(ref: str | Executor | None) -> Executor:
    """None: the default executor; a callable: itself; "package.module:function": that function."""
    if ref is None:
        return default_executor
    if callable(ref):
        return ref
    from tuner.errors import BadInput

    mod_name, _, attr = str(ref).partition(":")
    if not mod_name or not attr:
        raise BadInput(f"executor must be given as module:function, got {ref!r}")
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadInput(f"cannot load executor {ref!r}: {exc}") from None
    if not callable(fn):
        raise BadInput(f"executor {ref!r} is not callable")
    return fn  # type: ignore[no-any-return]


# ---- Optuna helpers ------------------------------------------------------------------------------------
def _result_store(url: str) -> Any:
    from tuner.store import ResultStore

    from ._spec import normalize_url

    return ResultStore(normalize_url(url))


def _optuna_storage(url: str) -> Any:
    return _result_store(url).optuna_storage()


def abandon_stale_trials(
    storage: Any, study_name: str, worker: str, store: Any = None
) -> list[tuple[int, dict[str, Any]]]:
    """Mark trials left RUNNING or WAITING (by a dead or stopped worker) as FAIL + tuner_skip; we hold
    the lease. With the results `store`, a RUNNING trial whose measurement is stored (its worker stopped
    between recording it and telling Optuna) is told from that measurement instead, and counts. Returns
    the number and config of each trial marked abandoned."""
    import optuna

    try:
        sid = storage.get_study_id_from_name(study_name)
    except KeyError:
        return []
    marked: list[tuple[int, dict[str, Any]]] = []
    states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    stale = storage.get_all_trials(sid, deepcopy=False, states=states)
    if store is not None:
        running = [t for t in stale if t.state == optuna.trial.TrialState.RUNNING]
        told = set(store.tell_measured_trials(study_name, running, storage=storage))
        stale = [t for t in stale if t.number not in told]
    for t in stale:
        try:
            storage.set_trial_user_attr(t._trial_id, "tuner_skip", f"abandoned (taken over by {worker})")
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            marked.append((t.number, dict(t.params)))
        except RuntimeError as exc:  # finished meanwhile by a worker that was still alive
            log.info("trial %d of %s finished meanwhile: %s", t.number, study_name, exc)
    return marked


def _best(trials: Sequence[Any]) -> tuple[float | None, dict[str, Any] | None]:
    ok = [t for t in trials if t.value is not None and math.isfinite(t.value)]
    if not ok:
        return None, None
    b = min(ok, key=lambda t: (t.value, t.number))
    return float(b.value), dict(b.params)


def gather_prior(
    storage: Any, rows: Sequence[TaskRow], task: StudyTask, *, max_tasks: int = 8
) -> list[list[tuple[dict, float | None]]]:
    """Measurements of the finished tasks of the same kernel and backend, nearest shapes first."""
    done = [
        r.task
        for r in rows
        if r.status == DONE
        and r.task.kernel == task.kernel
        and r.task.backend == task.backend
        and r.key != task.key
    ]
    done.sort(key=lambda t: (task_distance(t, task), t.key))
    prior = []
    for t in done[:max_tasks]:
        trials = task_trials(storage, t.study_name)  # the current attempt's (a retry's carries the successes)
        rows_ = [(dict(tr.params), float(tr.value) if tr.value is not None else None) for tr in trials]
        if rows_:
            prior.append(rows_)
    return prior


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str, allow_nan=False)) if obj is not None else None


def _result_summary(res: Any) -> dict[str, Any]:
    """What the board keeps of an executor's result (JSON-safe; non-finite values become None). Reads a
    `TuneResult` (best_value) or the measurement layer's `KernelTuneResult` (best: a MeasureResult in ms,
    status_counts())."""
    out: dict[str, Any] = {}
    for name in ("best_config", "best_value", "stopped_because", "strategy", "evaluations", "unit"):
        v = getattr(res, name, None)
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        if v is not None:
            try:
                out[name] = _jsonable(v)
            except (TypeError, ValueError):
                out[name] = str(v)
    best = getattr(res, "best", None)
    median = getattr(best, "median", None)
    if isinstance(median, (int, float)) and math.isfinite(median):
        out["best_value"] = float(median)
        out["unit"] = str(getattr(best, "unit", "ms"))
        stats_fn = getattr(best, "stats", None)
        stats = stats_fn() if callable(stats_fn) else {}
        if isinstance(stats, Mapping):
            out["best_stats"] = {
                k: v for k, v in stats.items() if isinstance(v, (int, float, str)) and _finite_or_str(v)
            }
    cache_key = getattr(res, "cache_key", None)  # an executor that knows the runtime key of its winner
    if isinstance(cache_key, Mapping):
        try:
            out["cache_key"] = _jsonable(dict(cache_key))
        except (TypeError, ValueError) as exc:
            log.warning("the executor's cache_key is not JSON: %s", exc)
        spread = getattr(res, "spread_s", None)
        if isinstance(spread, (int, float)) and math.isfinite(spread) and spread >= 0:
            out["spread_s"] = float(spread)
        for name in ("space", "date"):  # the fingerprint of the space it was tuned over, when measured
            if isinstance(getattr(res, name, None), str):
                out[name] = getattr(res, name)
    counts = getattr(res, "status_counts", None)
    if callable(counts):
        try:
            out["status_counts"] = {str(k): int(v) for k, v in counts().items()}
        except Exception as exc:  # noqa: BLE001 - informative only
            log.debug("status counts: %s", exc)
    if "best_config" in out and out.get("best_value") is None:
        out.pop("best_config")  # a config without a time (every finalist failed) is no winner
    return out


def no_winner_reason(res: Any, summary: Mapping[str, Any], trials: Sequence[Any]) -> str:
    """One line on why a task that ran has no winner: how many trials failed, by status, and the first
    error (the measurement layer's, or the one the Optuna trial kept)."""
    counts = summary.get("status_counts")
    if not isinstance(counts, Mapping):
        counts = {}
        for t in trials:
            if t.value is None:
                st = str(t.user_attrs.get("tuner_status", "failed"))
                counts[st] = counts.get(st, 0) + 1
    n = int(summary.get("evaluations") or sum(int(v) for v in counts.values()) or len(trials))
    if n == 0:
        return "no trial ran (the budget or the space left nothing to measure)"
    first = ""
    for t in getattr(res, "trials", ()) or ():
        r = getattr(t, "result", None)
        err = getattr(r, "error", None) if r is not None else getattr(t, "error", None)
        if err:
            first = str(err)
            break
    if not first:
        for t in trials:
            err = t.user_attrs.get("tuner_error") if hasattr(t, "user_attrs") else None
            if err:
                first = str(err)
                break
    by = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "ok" and int(v) > 0)
    line = f"every one of {n} trials failed" + (f" ({by})" if by else "")
    if first:
        line += f"; first error: {first.strip().splitlines()[0][:300]}"
    return line


def study_rows(spec: StudySpec) -> list[TaskRow]:
    """The board's rows of the tasks the study file lists now (in run order); rows of tasks removed from
    the file stay in the database but are left out of summaries, reports and exports."""
    keys = {t.key for t in spec.tasks}
    board = TaskBoard(spec.storage)
    try:
        rows = board.rows(spec.name)
    finally:
        board.close()
    return [r for r in rows if r.key in keys]


def _finite_or_str(v: Any) -> bool:
    return not (isinstance(v, float) and not math.isfinite(v))


def _environment(task: StudyTask) -> dict[str, Any]:
    """Where the task was measured: the device name, the versions that change code generation and the
    hash of the kernel's source, as the runtime's cache keys name them (`tuner.runtime._kernel.device_name`
    / `backend_versions` / `kernel_source_hash`), so the exported entry is a hit for `tuner.kernel` on this
    machine with this code, and a miss ("kernel source changed") once the kernel's code changes (a newer
    tuner), not an exact hit for code it was never measured on."""
    from tuner._versions import backend_versions
    from tuner.runtime._kernel import device_name, kernel_source_hash

    try:
        name = device_name(task.backend, task.device)
    except Exception as exc:  # noqa: BLE001 - the name is informative; never fail a finished task on it
        log.debug("device name: %s", exc)
        name = task.device
    env: dict[str, Any] = {"device_name": name, "versions": backend_versions(task.backend)}
    if "factory" not in task.problem:  # a decorated function's task records its whole key (cache_key)
        try:
            env["source_hash"] = kernel_source_hash(task.kernel)
        except Exception as exc:  # noqa: BLE001 - never fail a finished task on it; export then warns
            log.warning("task %s: the kernel's source hash cannot be computed (%s)", task.key, exc)
    return env


# ---- one worker ----------------------------------------------------------------------------------------
@dataclass
class WorkerSummary:
    worker: str
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


class _Lease:
    """Keeps one claim alive: a heartbeat thread plus the per-trial callback, both renewing the lease.

    The heartbeat starts right after the claim (`start`), before the task is prepared: opening the store
    in a fresh process, marking a dead worker's trials abandoned and gathering the prior take seconds
    (more on a loaded machine or a big store), and a lease that ran out meanwhile was lost before the
    first trial, the task taken over by another worker (or by this one, as a new attempt). `begin` then
    gives it the trials the task has, and from there on the time counts as the task's (`spent`)."""

    def __init__(
        self,
        board: TaskBoard,
        claim: Claim,
        lease_s: float,
        on_progress: Callable[[Claim, int, float | None], None] | None,
        interrupt: threading.Event | None = None,
        trial_timeout: float | None = None,
        on_timeout: Callable[[float], list[dict[str, Any]]] | None = None,
        on_hung: Callable[[], None] | None = None,
        in_flight: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.board, self.claim, self.lease_s = board, claim, lease_s
        self.in_flight = in_flight  # the configs of the task's trials in flight (`_stalled` names them)
        self.on_hung = on_hung  # called last by `_time_out` (a worker process of the runner exits there)
        self.interrupt = interrupt
        # A trial that hangs (a deadlocked kernel, a config that spins) must not hold the task for ever:
        # the heartbeat beside it would renew the lease as long as the process lives, and every other
        # worker would wait for the task. Past `trial_timeout` s without a finished trial, `on_timeout`
        # marks the trials in flight failed and the task goes back to the queue (`_time_out`).
        self.trial_timeout, self.on_timeout = trial_timeout, on_timeout
        self.last_progress = time.monotonic()
        self.slowest = 0.0  # the longest wait for a finished trial so far (`_stalled`)
        self.stall_warned = 0.0  # how long the task had waited at the last warning (`_stalled`)
        self.timed_out = False
        self.trials_done = 0
        self.best_value: float | None = None
        self.best_config: dict[str, Any] | None = None
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.lost = threading.Event()
        self.stop = threading.Event()
        self.last_ok = time.monotonic()
        self.mark: float | None = None  # None while the task is prepared: that time is not spent on it
        self.thread = threading.Thread(target=self._beat, name=f"lease-{claim.task.key}", daemon=True)

    def start(self) -> None:
        if self.thread.ident is None:
            self.thread.start()

    def begin(self, trials_done: int, best: tuple[float | None, dict[str, Any] | None]) -> None:
        """The task is prepared: it has `trials_done` trials, the best of them `best`; its time starts."""
        with self.lock:
            self.trials_done = trials_done
            self.best_value, self.best_config = best
            self.mark = self.last_progress = time.monotonic()

    def __enter__(self) -> _Lease:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=self.lease_s)

    def finish(self, status: str, **kw: Any) -> bool:
        """board.finish under the lease's lock, and the heartbeat stopped in the same hold of it: a
        renewal after the finish would find the lease gone and report it taken over."""
        with self.lock:
            try:
                return self.board.finish(self.claim, status, spent_add=self.spent(), **kw)
            finally:
                self.stop.set()

    def spent(self) -> float:
        if self.mark is None:
            return 0.0
        now = time.monotonic()
        d, self.mark = now - self.mark, now
        return d

    def _renew(self, **progress: Any) -> None:
        with self.lock:
            if self.lost.is_set() or self.stop.is_set():  # given up, or finished on the board
                return
            try:
                ok = self.board.renew(self.claim, self.lease_s, spent_add=self.spent(), **progress)
            except Exception as exc:  # noqa: BLE001 - a database hiccup; the lease may survive it
                log.warning("lease renewal of %s failed: %s", self.claim.task.key, str(exc).splitlines()[0])
                ok = time.monotonic() - self.last_ok < 0.8 * self.lease_s
                if not ok:
                    log.error(
                        "could not renew the lease of %s for %.1fs: giving the task up",
                        self.claim.task.key,
                        time.monotonic() - self.last_ok,
                    )
                    self.lost.set()
                return
            if ok:
                self.last_ok = time.monotonic()
            else:
                log.error("lost the lease of task %s (taken over)", self.claim.task.key)
                self.lost.set()

    def holds(self) -> bool:
        """Whether this worker still holds the task, as the board says now (renewing the lease)."""
        self._renew()
        return not self.lost.is_set()

    def _beat(self) -> None:
        interval = max(0.2, self.lease_s / 4)
        if self.trial_timeout is not None:
            interval = max(0.2, min(interval, self.trial_timeout / 4))
        while not self.stop.wait(interval):
            if self._overdue():
                self._time_out()
            else:
                self._renew()
                self._stalled()
            if self.lost.is_set():
                return

    def stall_limit(self) -> float:
        """How long the task may go without a finished trial before `_stalled` warns."""
        return max(STALL_MIN_S, STALL_FACTOR * self.slowest)

    def _stalled(self) -> None:
        """Without `trial_timeout`, warn that the task seems stuck: past `stall_limit` without a finished
        trial (and again each time the wait doubles), naming the task, this worker's process and the
        config in flight, and saying how to give such a trial up (its lease is renewed for as long as the
        process lives, so the task is held, and every other worker waits for it, until then)."""
        if self.trial_timeout is not None or self.mark is None or self.lost.is_set() or self.stop.is_set():
            return
        idle = time.monotonic() - self.last_progress
        if idle <= self.stall_limit() or idle <= 2 * self.stall_warned:
            return
        self.stall_warned = idle
        configs: list[dict[str, Any]] = []
        if self.in_flight is not None:
            try:
                configs = self.in_flight()
            except Exception as exc:  # noqa: BLE001 - the warning goes out without the config
                log.debug("the trials in flight of %s: %s", self.claim.task.key, exc)
        what = f"config {', '.join(map(str, configs))}" if configs else "the trial in flight"
        log.warning(
            "task %s: no trial finished for %.0f s (the slowest so far took %.0f s) in worker %s (process %d): "
            "%s may be hung. The study has no trial_timeout, so this worker holds the task for as long as "
            "its process lives and the run waits for it: set trial_timeout (seconds) in [study] to give "
            "such a trial up, or stop this worker (Ctrl-C, or kill %d; its task goes back to the queue)",
            self.claim.task.key,
            idle,
            self.slowest,
            self.claim.worker,
            os.getpid(),
            what,
            os.getpid(),
        )

    def _overdue(self) -> bool:
        """Whether the task, once prepared, went `trial_timeout` seconds without finishing a trial."""
        return (
            self.trial_timeout is not None
            and self.mark is not None
            and time.monotonic() - self.last_progress > self.trial_timeout
        )

    def _time_out(self) -> None:
        """Give the hung trial up: mark the trials in flight failed (status `timeout`, so that the worker
        that takes the task over does not measure their configs again) and hand the task back, under the
        lease's lock; this worker's executor, stuck in the trial, then finds the lease lost if it ever
        returns. Where either write fails, the renewals stop all the same and the lease runs out."""
        key = self.claim.task.key
        with self.lock:
            # asked again under the lock: a trial that finished after `_beat` asked, before the lock was
            # taken, is progress (its callback waited on the lock), and the task is not given up
            if self.lost.is_set() or self.stop.is_set() or not self._overdue():
                return
            idle = time.monotonic() - self.last_progress
            configs: list[dict[str, Any]] = []
            try:
                if self.on_timeout is not None:
                    configs = self.on_timeout(idle)
                back = self.board.finish(self.claim, PENDING, spent_add=self.spent())
            except Exception as exc:  # noqa: BLE001 - the lease runs out instead
                back = False
                log.error("task %s: could not hand the hung task back (%s)", key, str(exc).splitlines()[0])
            self.timed_out = True
            self.lost.set()
            self.stop.set()
        what = f"config {', '.join(map(str, configs))}" if configs else "no trial in flight"
        log.error(
            "task %s: no trial finished for %.0f s (trial_timeout = %g s; %s): marked failed (timeout) and "
            "the task %s; %s",
            key,
            idle,
            self.trial_timeout,
            what,
            "handed back to the queue" if back else "left to the end of its lease",
            "this worker's process exits, and the study runner starts another in its place"
            if self.on_hung is not None
            else "this worker's executor is still stuck, stop it (Ctrl-C, kill) if it does not return",
        )
        if self.on_hung is not None:
            self.on_hung()

    def callback(self, trial: Any = None, *_: Any, **__: Any) -> None:
        value = getattr(trial, "value", None)
        config = getattr(trial, "config", None)
        with self.lock:
            now = time.monotonic()
            self.slowest = max(self.slowest, now - self.last_progress)
            self.last_progress = now
            self.trials_done += 1
            if (
                isinstance(value, (int, float))
                and math.isfinite(value)
                and (self.best_value is None or value < self.best_value)
            ):
                self.best_value = float(value)
                self.best_config = _jsonable(dict(config)) if isinstance(config, Mapping) else None
        self._renew(trials_done=self.trials_done, best_value=self.best_value, best_config=self.best_config)
        if self.on_progress is not None:
            self.on_progress(self.claim, self.trials_done, self.best_value)
        if self.lost.is_set():
            raise LeaseLost(f"lease of task {self.claim.task.key} lost")
        _raise_if_interrupted(self.interrupt)  # an interrupt that a finaliser swallowed


# SIGTERM (kill, a scheduler's stop) and SIGHUP (the terminal closed) hand the task back as Ctrl-C does.
_HANDBACK_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _Interrupt(threading.Event):
    """Set once a hand-back signal came (`_signals_as_interrupt`); `raised` once a KeyboardInterrupt
    was raised for it (by the signal handler or by `_raise_if_interrupted`)."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = False


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[threading.Event | None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt (main thread only; elsewhere nothing
    changes), so the running task is handed back to the board at once, as after SIGINT. A SIGHUP that the
    process ignores (started by `nohup`) stays ignored; SIGTERM is always handled: it is how the study
    runner stops its workers where they ignore SIGINT (`_Supervisor._stop`).

    Yields an event that every one of these signals, SIGINT included (unless a program installed its own
    SIGINT handler), sets before raising. A KeyboardInterrupt raised while Python runs a finaliser or a
    callback from C is printed as "Exception ignored" and lost; the worker checks the event after each
    trial and between tasks, so such an interrupt still stops it (seen once: a worker finished its
    study and exited 0 after Ctrl-C). None outside the main thread.

    A signal that comes while the main thread runs the database layers' code (`_STORE_MODULES`) is
    raised once it has left it (for at most `_DEFER_MAX_S`): raised inside SQLAlchemy's or the driver's
    code (a commit's event hooks, between a statement and its result) the KeyboardInterrupt can leave
    the connection's transaction open, and with SQLite its write lock held by this process, so that the
    hand-back waited out the busy timeout, failed, and left the task running until its lease ran out.
    The handler looks again by sending the signal to the main thread anew every `_DEFER_STEP_S`."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    seen = _Interrupt()
    deferred: list[float] = []  # when the pending interrupt was first put off (empty: none is pending)
    timers: list[threading.Timer] = []
    resends = [0]  # signals the timers sent that the handler has not run for yet
    closing = [False]

    def send_again(signum: int) -> None:
        resends[0] += 1
        signal.pthread_kill(threading.main_thread().ident or 0, signum)

    def handler(signum: int, frame: Any) -> None:
        resent = resends[0] > 0
        if resent:
            resends[0] -= 1
        if closing[0] or (resent and (seen.raised or not deferred)):
            return  # the interrupt it was sent for is raised already
        if not seen.is_set():
            if signum != signal.SIGINT:
                log.warning("received %s: handing the task back", signal.Signals(signum).name)
            seen.set()
        if (
            _CAN_SEND_AGAIN
            and _in_store_code(frame)
            and (not deferred or time.monotonic() - deferred[0] < _DEFER_MAX_S)
        ):
            if not deferred:
                deferred.append(time.monotonic())
            timer = threading.Timer(_DEFER_STEP_S, send_again, args=(signum,))
            timer.daemon = True
            timers.append(timer)
            timer.start()
            return
        deferred.clear()
        seen.raised = True
        raise KeyboardInterrupt

    # SIGHUP that this process ignores (`nohup`) stays ignored: closing the terminal must not stop it
    sigs = [s for s in _HANDBACK_SIGNALS if s == signal.SIGTERM or signal.getsignal(s) is not signal.SIG_IGN]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        sigs.append(signal.SIGINT)
    old: dict[Any, Any] = {}
    for sig in sigs:
        with contextlib.suppress(ValueError, OSError):  # not settable here: leave it
            old[sig] = signal.signal(sig, handler)
    try:
        yield seen
    finally:
        # no signal of a timer may reach the handler restored below (SIGTERM's default ends the process)
        closing[0] = True
        for timer in timers:
            timer.cancel()
            timer.join()
        for sig, h in old.items():
            signal.signal(sig, h)


# The code an interrupt is not raised in (`_signals_as_interrupt`): the database layers under the store.
_STORE_MODULES = ("sqlalchemy.", "sqlite3.", "psycopg.", "psycopg2.", "optuna.storages.", "tuner.storage.")
_DEFER_MAX_S = 10.0  # a main thread that stays in that code longer (a hung server) is interrupted there
_DEFER_STEP_S = 0.02
_CAN_SEND_AGAIN = hasattr(signal, "pthread_kill")  # POSIX


def _in_store_code(frame: Any) -> bool:
    """Whether `frame` or one of its callers runs code of `_STORE_MODULES`."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and (name + ".").startswith(_STORE_MODULES):
            return True
        frame = frame.f_back
    return False


def _raise_if_interrupted(seen: threading.Event | None) -> None:
    if seen is not None and seen.is_set():
        if isinstance(seen, _Interrupt):
            seen.raised = True
        raise KeyboardInterrupt


def _exit_hung() -> None:
    """End this worker process (from the heartbeat thread) after a hung trial was given up and its task
    handed back: the trial's call holds the main thread (and a deadlocked kernel the process's GPU
    context) for ever. Every finished trial is committed already; the runner replaces the process."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_HUNG)


def _fail_trials_in_flight(storage: Any, task: StudyTask, worker: str, error: str) -> list[dict[str, Any]]:
    """Mark the trials of `task` in flight (RUNNING in its Optuna study; `worker` holds the task's lease,
    so they are of its holder) failed with status `timeout` and `error`: counted, so that no worker
    measures their configs again. Returns their configs."""
    import optuna

    try:
        sid = storage.get_study_id_from_name(task.study_name)
    except KeyError:
        return []
    hung: list[dict[str, Any]] = []
    running = storage.get_all_trials(sid, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in running:
        # The executor may finish the trial at any point of this (it is stuck, or just slow): a write
        # to a finished trial raises UpdateFinishedTrialError (a RuntimeError), and the trial keeps
        # its result. Its marks may be written already (the executor finished it between them and the
        # FAIL): `check_task` reads them only on a FAIL trial.
        try:
            if not t.user_attrs.get("tuner_skip"):  # a replaced proposal keeps its mark
                storage.set_trial_user_attr(t._trial_id, "tuner_status", "timeout")
                storage.set_trial_user_attr(t._trial_id, TIMED_OUT, worker)
                storage.set_trial_user_attr(t._trial_id, "tuner_error", error)
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        except RuntimeError as exc:  # finished meanwhile: it was not hung after all
            log.info("trial %d of %s finished meanwhile: %s", t.number, task.study_name, exc)
            continue
        if not t.user_attrs.get("tuner_skip"):
            hung.append(dict(t.params))
    return hung


def _configs_in_flight(storage: Any, task: StudyTask) -> list[dict[str, Any]]:
    """The configs of `task`'s trials in flight (RUNNING in its Optuna study)."""
    import optuna

    try:
        sid = storage.get_study_id_from_name(task.study_name)
    except KeyError:
        return []
    running = storage.get_all_trials(sid, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return [dict(t.params) for t in running if not t.user_attrs.get("tuner_skip")]


def _hand_back(lease: _Lease) -> None:
    """Put an interrupted task back on the queue (under the lease's lock, which stops its heartbeat). A
    hand-back that cannot be written is logged: the task is then taken over once its lease runs out, or
    at once by a worker on this host (its process is gone by then)."""
    try:
        lease.finish(PENDING)
    except Exception as exc:  # noqa: BLE001 - the interrupt goes on; the lease covers the task
        log.error(
            "could not hand task %s back (%s); it is taken over once its lease runs out",
            lease.claim.task.key,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )


class StudyWorker:
    """Claims tasks of one study, one at a time, until none is left (waiting out other workers' leases so
    that the tasks of a dead worker are taken over)."""

    def __init__(
        self,
        spec: StudySpec,
        *,
        executor: Executor | None = None,
        worker_id: str | None = None,
        lease_s: float | None = None,
        poll_s: float | None = None,
        on_progress: Callable[[Claim, int, float | None], None] | None = None,
        replaceable: bool = False,
    ) -> None:
        self.spec = spec
        # a worker process that the study runner replaces: it exits once a trial hung (`_exit_hung`)
        self.replaceable = replaceable
        self.executor = resolve_executor(executor)
        self.worker_id = worker_id or f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_s = float(lease_s or spec.lease_seconds)
        self.poll_s = poll_s if poll_s is not None else min(2.0, max(0.2, self.lease_s / 4))
        self.board = TaskBoard(spec.storage)
        self.on_progress = on_progress
        self._storage: Any = None
        self._store: Any = None  # the results store of `spec.storage` (opened with `storage`)
        self._keys = {t.key for t in spec.tasks}
        self._devices = {t.key: t.device for t in spec.tasks if t.device != "auto"}  # this machine's
        self._interrupt: threading.Event | None = None  # set by a signal while `run` is inside

    @property
    def storage(self) -> Any:
        if self._storage is None:
            self._store = retry(lambda: _result_store(self.spec.storage), what="opening the store")
            self._storage = retry(self._store.optuna_storage, what="opening the Optuna storage")
        return self._storage

    def run(self, *, max_tasks: int | None = None) -> WorkerSummary:
        with _signals_as_interrupt() as seen:
            self._interrupt = seen
            try:
                return self._run(max_tasks)
            finally:
                self._interrupt = None

    def _run(self, max_tasks: int | None) -> WorkerSummary:
        summary = WorkerSummary(self.worker_id)
        n = 0
        while max_tasks is None or n < max_tasks:
            _raise_if_interrupted(self._interrupt)
            try:
                claim = self.board.claim(self.spec.name, self.worker_id, self.lease_s)
                _raise_if_interrupted(self._interrupt)
            except KeyboardInterrupt:
                # An interrupt deferred out of the claim's transaction (`_signals_as_interrupt`) comes
                # right after it, before the claim is returned: the task this worker now holds goes back.
                self._release()
                raise
            if claim is None:
                counts = summarize(self.board.rows(self.spec.name))
                if counts[PENDING] == 0 and counts[RUNNING] == 0:
                    break
                time.sleep(self.poll_s)  # others hold leases; take their tasks over if they die
                continue
            n += 1
            if claim.task.key not in self._keys:
                with contextlib.suppress(Exception):
                    self.board.finish(claim, FAILED, error="removed from the study file")
                log.info("task %s is no longer in the study file; not run", claim.task.key)
                continue
            own = self._devices.get(claim.task.key)
            if own is not None and claim.task.device != own:
                # registered by a machine of another kind (both registered at once, before either ran
                # it): this one's measurements would mix with that device's, so the task goes back
                with contextlib.suppress(Exception):
                    self.board.finish(claim, PENDING)
                raise StudyError(device_clash_message(self.spec.name, claim.task.key, claim.task.device, own))
            try:
                outcome = self.run_task(claim)
            except StoreError as exc:
                # The store did not answer in time, or cannot be written (a full disk, a read-only or
                # corrupt file): not the task's failure. Its finished trials are stored
                # (each trial is its own transaction); the task goes back to the queue, and this worker
                # stops with the error. Where the hand-back cannot be written either, the lease runs out
                # and another worker takes the task over.
                try:
                    back = self.board.finish(claim, PENDING)
                    then = "goes back to the queue" if back else "was taken over by another worker"
                except Exception as again:  # noqa: BLE001 - the store's error is the one raised
                    # the same fault (a full disk, a server that became read-only after a failover):
                    # say so, rather than that the task went back when it did not
                    then = (
                        f"could not be handed back ({again.__class__.__name__}); another worker takes it "
                        f"over when its lease runs out ({self.lease_s:g} s after its last renewal)"
                    )
                log.error("worker %s: %s; task %s %s", self.worker_id, exc, claim.task.key, then)
                raise
            if outcome == "lost":
                log.warning(
                    "worker %s (process %d): task %s was taken over by another worker while this one did "
                    "not renew its lease (stopped, or too slow); left to it, nothing more of it written here",
                    self.worker_id,
                    os.getpid(),
                    claim.task.key,
                )
            getattr(summary, outcome).append(claim.task.key)
        return summary

    def _release(self) -> None:
        try:
            self.board.release(self.spec.name, self.worker_id)
        except Exception as exc:  # noqa: BLE001 - the interrupt goes on; the lease covers the task
            log.error("could not hand back the task of worker %s: %s", self.worker_id, exc)

    def _fail_hung_trials(self, task: StudyTask, timeout: float | None, idle: float) -> list[dict[str, Any]]:
        """Mark the trials of `task` that are in flight (RUNNING in its Optuna study; this worker holds
        the lease, so they are its own) failed with status `timeout`: counted, so that no worker measures
        their configs again. Returns their configs."""
        error = (
            f"no result after {idle:.0f} s (the study's trial_timeout is {timeout:g} s): the trial hung or "
            "ran too long"
        )
        return _fail_trials_in_flight(self.storage, task, self.worker_id, error)

    def run_task(self, claim: Claim) -> str:
        """Tune one claimed task; returns "done", "failed" or "lost"."""
        task = claim.task
        lease = _Lease(
            self.board,
            claim,
            self.lease_s,
            self.on_progress,
            self._interrupt,
            trial_timeout=self.spec.trial_timeout,
            on_timeout=functools.partial(self._fail_hung_trials, task, self.spec.trial_timeout),
            on_hung=_exit_hung if self.replaceable else None,
            in_flight=lambda: _configs_in_flight(self.storage, task),
        )
        lease.start()  # renewed while the task is prepared, not only from its first trial on
        try:
            storage = self.storage
            seed_retry(storage, task)  # a retried task: its attempt's own study, with the earlier successes
            stale = abandon_stale_trials(storage, task.study_name, self.worker_id, self._store)
            if stale:
                log.warning(
                    "task %s: %d trial(s) left unfinished by %s were marked abandoned (not counted; "
                    "their configs may run again): %s",
                    task.key,
                    len(stale),
                    describe_worker(claim.taken_from) if claim.taken_from else "a dead worker",
                    ", ".join(f"trial {n} {cfg}" for n, cfg in stale),
                )
            before = task_trials(storage, task.study_name)
            prior = gather_prior(storage, self.board.rows(self.spec.name), task)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):  # interrupted while preparing: the task goes back
                _hand_back(lease)
            lease.__exit__(None, None, None)
            raise
        if lease.lost.is_set():  # taken over while it was prepared (the heartbeat came too late)
            lease.__exit__(None, None, None)
            return "lost"
        lease.begin(len(before), _best(before))
        if task.time_budget_s is not None:
            task = replace(task, time_budget_s=max(1e-3, task.time_budget_s - claim.spent_s))
        log.info(
            "worker %s: task %s (%d finished trials, %d prior tasks)",
            self.worker_id,
            task.key,
            len(before),
            len(prior),
        )
        # The heartbeat runs until the task is finished on the board, not only while the executor runs:
        # reading the trials back and the environment (which may import torch or triton) take a while,
        # and a lease that ran out meanwhile let another worker take the finished task over.
        try:
            # The executor's measurements of this study commit only while this worker holds the lease
            # (`tuner.storage.guarding`): after a takeover they raise LeaseLost instead of adding a
            # measurement behind the new holder that no counted trial refers to.
            guard = functools.partial(self.board.hold, claim=claim)
            try:
                with guarding(task.storage, task.study_name, guard):
                    res = self.executor(task, prior=prior, callback=lease.callback)
            except LeaseLost:
                return "lost"
            except StoreError:
                raise  # the store's failure, not the task's (`_run` hands the task back)
            except Exception as exc:  # noqa: BLE001 - a broken task must not stop the study
                # Asked of the board, not only of the heartbeat (which may be late): a worker whose task
                # was taken over fails on the new holder's writes (a trial it measured was told or
                # abandoned by the new holder), and that is not the task's failure.
                if lease.lost.is_set() or not lease.holds():
                    log.warning("task %s: %s after the lease was lost", task.key, exc)
                    return "lost"
                log.error("task %s failed: %s: %s", task.key, type(exc).__name__, exc)
                lease.finish(FAILED, error=f"{type(exc).__name__}: {exc}")
                return "failed"
            if lease.lost.is_set():
                return "lost"
            trials = task_trials(storage, task.study_name)
            summary = _result_summary(res)
            tv, tc = _best(trials)
            best_value = summary.get("best_value", tv)
            best_config = summary.get("best_config", tc)
            summary.setdefault("evaluations", len(trials))
            summary.setdefault("unit", "ms")
            summary["worker"] = self.worker_id
            summary.update(_environment(task))
            no_winner = best_value is None or not isinstance(best_config, Mapping)
            error: str | None = None
            if no_winner:  # every trial failed (or none ran): the work did not happen
                error = no_winner_reason(res, summary, trials)
                log.error("task %s failed: %s", task.key, error)
            ok = lease.finish(
                FAILED if no_winner else DONE,
                error=error,
                result=summary,
                trials_done=len(trials),
                best_value=best_value,
                best_config=best_config,
            )
            if not ok:
                return "lost"
            return "failed" if no_winner else "done"
        except KeyboardInterrupt:
            # in the executor, or after it while the results are read and the task marked finished (a
            # task marked done or failed just before stays so: the hand-back then changes nothing)
            _hand_back(lease)
            raise
        finally:
            lease.__exit__(None, None, None)


# ---- the whole run -------------------------------------------------------------------------------------
@dataclass
class RunSummary:
    study: str
    storage: str
    counts: dict[str, int]
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.counts.get(PENDING, 0) == 0 and self.counts.get(RUNNING, 0) == 0


def prepare_study(spec: StudySpec, *, retry_failed: bool = False) -> StudySpec:
    """Resolve the device, create the schema (once, before workers race for it) and register the tasks.
    A task whose input factory a worker cannot rebuild is refused first (BadInput), nothing changed."""
    from ._from_misses import check_task_factories

    check_task_factories(spec.tasks)
    if reopen_if_replaced(spec.storage):  # this process ran it before, and its file went since
        log.info("study %s: store %s was deleted or replaced since; opened again", spec.name, spec.storage)
    if any(t.device == "auto" for t in spec.tasks):
        from tuner.search_spaces.devices import detect_device

        # each backend's own device: a Pallas task on a TPU is tuned for the TPU, not for what torch sees;
        # other tasks (a decorated Python function's, backend "python") for torch's device, as before
        archs = {
            t.backend: detect_device("pallas" if t.backend == "pallas" else "triton").arch
            for t in spec.tasks
            if t.device == "auto"
        }
        spec = replace(
            spec,
            tasks=tuple(replace(t, device=archs[t.backend]) if t.device == "auto" else t for t in spec.tasks),
        )
    made: list[Path] = []  # the study's output folder, when this run makes it
    path = sqlite_path(spec.storage)
    if path is not None and not path.startswith("file:"):
        made = make_folders(os.path.dirname(os.path.abspath(path)))
    try:
        board = TaskBoard(spec.storage)
    except BaseException:
        remove_made_folders(made)  # a store that could not be made (a full disk) leaves no empty folder
        raise
    if board.read_only:
        from ..storage import StoreError, redact

        raise StoreError(
            f"study {spec.name}: store {redact(board.url)} is read-only (its folder cannot be written): "
            "`tuner study run` writes it; `tuner study report` and `tuner study export` only read it"
        )
    try:
        _optuna_storage(spec.storage)
        counts = board.ensure(spec.tasks)
        if retry_failed:
            counts["retried"] = board.retry_failed(spec.name)
        log.info("study %s: %s", spec.name, counts)
    finally:
        board.close()
    return spec


def _study_file(spec: StudySpec) -> tuple[str, tuple[int, int] | None] | None:
    """The SQLite file of the study's store and its identity now; None for a server's store."""
    path = sqlite_path(normalize_url(spec.storage))
    return None if path is None or path.startswith("file:") else (path, file_identity(path))


def _check_study_file(opened: tuple[str, tuple[int, int] | None] | None, outcome: str) -> None:
    """Raise StoreError when the study's SQLite file was deleted or replaced since `opened`
    (`_study_file`); `outcome` says what was not done or written."""
    if opened is None:
        return
    path, was = opened
    if file_identity(path) != was:
        raise replaced_error(path, outcome, during="the study ran")


def _summary(spec: StudySpec) -> RunSummary:
    rows = study_rows(spec)
    return RunSummary(
        spec.name, spec.storage, summarize(rows), [(r.key, r.error or "") for r in rows if r.status == FAILED]
    )


def run_study(
    spec: StudySpec,
    *,
    workers: int = 1,
    executor: Executor | str | None = None,
    progress: bool = False,
    lease_s: float | None = None,
    retry_failed: bool = False,
) -> RunSummary:
    """Run (or resume) a study until no task is left. `workers > 1` starts that many local worker
    processes (`tuner study run STUDY --workers 1`, which needs `spec.path` and an executor given as
    "module:function" or the default); more machines join by running the same command on the same storage."""
    spec = prepare_study(spec, retry_failed=retry_failed)
    if executor is None:  # the default executor runs the trials on this machine: its backends must be here
        _check_backends_installed(spec)
    with holding(spec.storage):  # its tasks' `optimize` calls must not open a deleted file's path anew
        return _run_prepared(spec, workers, executor, progress, lease_s)


def _check_backends_installed(spec: StudySpec) -> None:
    """Refuse, before any trial, a study whose tasks left to run need a kernel backend (torch, triton, jax)
    that is not installed: every trial of those tasks would crash and each task would be marked failed, to
    be retried with --retry-failed once the backend is installed. The tasks stay pending."""
    from tuner.measure._gate import missing_backend_module

    left = {r.key for r in study_rows(spec) if r.status in (PENDING, RUNNING)}
    for backend in sorted({t.backend for t in spec.tasks if t.key in left}):
        name = missing_backend_module(backend)
        if name is not None:
            n = sum(t.key in left and t.backend == backend for t in spec.tasks)
            raise ModuleNotFoundError(
                f"No module named {name!r}: study {spec.name} has {n} task(s) left on backend {backend}, "
                "which need it; no trial was run",
                name=name,
            )


def _run_prepared(
    spec: StudySpec, workers: int, executor: Executor | str | None, progress: bool, lease_s: float | None
) -> RunSummary:
    opened = _study_file(spec)
    monitor = _Monitor(spec) if progress else None
    child = flag(ENV_WORKER_PROCESS)
    # A study with `trial_timeout` runs its worker in a process of its own, which a hung trial ends and
    # the runner replaces (`_exit_hung`), where the executor can be named to it (a module:function).
    supervised = (
        spec.trial_timeout is not None
        and not child
        and spec.path is not None
        and (executor is None or isinstance(executor, str))
    )
    if workers <= 1 and not supervised:
        worker = StudyWorker(
            spec,
            executor=resolve_executor(executor),
            lease_s=lease_s,
            on_progress=monitor.on_progress if monitor else None,
            replaceable=child and spec.trial_timeout is not None,
        )
        try:
            if monitor:
                monitor.start()
            worker.run()
        finally:
            if monitor:
                monitor.stop()
            worker.board.close()
        _check_study_file(opened, "nothing was written into the deleted file after that")
        return _summary(spec)
    if spec.path is None:
        raise ValueError("several workers need the study file (spec.path)")
    if executor is not None and not isinstance(executor, str):
        raise ValueError("several workers need the executor as 'module:function'")
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "study",
        "run",
        str(spec.path),
        "--workers",
        "1",
        "--quiet",
        "--no-report",
    ]
    if executor:
        cmd += ["--executor", executor]
    if lease_s:
        cmd += ["--lease-seconds", str(lease_s)]
    env = {**os.environ, ENV_STORAGE: spec.storage, ENV_WORKER_PROCESS: "1"}
    # this process only waits (and polls the board for the progress display): the connections its
    # preparation left idle in its pools would count against the server's limit for the whole run
    close_idle_connections(spec.storage)
    # the worker processes start inside `run`, where Ctrl-C stops them: started here, before the progress
    # display (a store query), an interrupt before `run` left them running without a runner
    sup = _Supervisor(spec, cmd, env, max(1, workers), float(lease_s or spec.lease_seconds), start=False)
    try:
        if monitor:
            monitor.start()
        sup.run()
    finally:
        if monitor:
            monitor.stop()
    procs = sup.procs
    bad = [p.returncode for p in procs if p.returncode not in (0, 1)]
    if bad:
        log.warning("worker processes exited with %s", bad)
    _check_study_file(opened, "nothing was written into the deleted file after that")
    summary = _summary(spec)
    codes = [p.returncode for p in procs]
    _check_workers(summary, codes)
    return summary


# How long the runner waits for its worker processes to hand their tasks back after Ctrl-C before it kills
# them (a worker stuck in a hung trial, or stopped, never does).
STOP_GRACE_S = 10.0
# How long a worker process may stay stopped (SIGSTOP; not a debugger's stop) before the runner kills and
# replaces it. None: its lease plus two of the runner's looks (by then its task, if it held one, may be
# taken over by another worker, so it has nothing left to do), and with a SQLite store at most half the
# busy timeout (the other workers' writes wait that long for a write lock it may hold, then fail).
STOPPED_LIMIT_S: float | None = None


class _Supervisor:
    """The study runner's worker processes (`_run_prepared`): started, replaced when one gives a hung
    trial up (it exits with EXIT_HUNG), killed and replaced when one goes quiet, stopped on Ctrl-C.

    A worker process stopped (SIGSTOP) past its lease is killed and replaced, with or without
    `trial_timeout` (`_check_stopped`): its task, if it held one, is another worker's to take over by
    then, and while stopped it keeps what it holds of the store. With SQLite that can be the database's
    write lock, taken between two statements of a write, and every other process of the store waited for
    it for ever (the run with it).

    A worker whose hang stops its heartbeat too (C code that holds the GIL, a process stopped with
    SIGSTOP) cannot give its trial up itself (`_Lease._time_out` runs in that heartbeat). With
    `trial_timeout`, the runner watches the last renewal of each task its workers hold (the board's
    `heartbeat_at`); a worker process whose task went `trial_timeout` plus a margin without one is killed,
    its trials in flight are marked failed (`timeout`, as `_time_out` does), the task goes back to the
    queue, and another worker process starts. A worker whose task another worker took over (past
    `lease_s`) stays watched on it until it holds another (`_check`). A worker process the OS refuses to
    start stops the run (`_start`)."""

    def __init__(
        self,
        spec: StudySpec,
        cmd: list[str],
        env: dict[str, str],
        n: int,
        lease_s: float,
        *,
        start: bool = True,
    ) -> None:
        self.spec, self.cmd, self.env, self.lease_s, self.n = spec, cmd, env, lease_s, n
        self.timeout = spec.trial_timeout
        beat = max(0.2, lease_s / 4)
        self.limit = math.inf
        if self.timeout is not None:
            beat = max(0.2, min(beat, self.timeout / 4))  # the workers' heartbeat interval (`_Lease._beat`)
            self.limit = self.timeout + 5.0 + 2 * beat
        self.every = max(0.5, min(beat, 5.0))
        self.stopped_limit = STOPPED_LIMIT_S if STOPPED_LIMIT_S is not None else lease_s + 2 * self.every
        if STOPPED_LIMIT_S is None and sqlite_path(normalize_url(spec.storage)) is not None:
            # and before the others' writes give up waiting for a write lock it may hold (their busy timeout)
            self.stopped_limit = min(self.stopped_limit, _store_engine.SQLITE_TIMEOUT_S / 2)
        self.stopped_since: dict[int, float] = {}  # pid -> when the runner first saw it stopped
        self.me = f"{HOST}:{os.getpid()}:runner"
        self.board: TaskBoard | None = None
        # pid -> (the row id of the task it holds or held last, that task's last renewal, its worker id)
        self.held: dict[int, tuple[int, float, str]] = {}
        self.finished_at: float | None = None  # when the board was first seen with no task left to run
        self.procs: list[subprocess.Popen[bytes]] = []
        if start:
            self._start_all()

    def _start_all(self) -> None:
        """Start the worker processes not started yet (`n` in all)."""
        while len(self.procs) < self.n:
            self.procs.append(self._start())

    def _start(self) -> subprocess.Popen[bytes]:
        """A new worker process. Where the OS refuses it (OSError: too many processes, no memory), the
        worker processes already started are stopped as on Ctrl-C (`_stop`: their tasks handed back) and
        `WorkersStopped` says why, in one line: left running, they went on without a runner that waits
        for them, and their tasks stayed held until they ended."""
        try:
            return subprocess.Popen(self.cmd, env=self.env)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            live = [p for p in self.procs if p.poll() is None]
            try:
                self._stop()
            finally:
                if self.board is not None:
                    self.board.close()
                    self.board = None
            raise WorkersStopped(
                f"study {self.spec.name}: could not start a worker process ({type(exc).__name__}: {first}); "
                f"stopped the {len(live)} running, their tasks handed back; nothing finished was lost: "
                "run `tuner study run` again once the cause is fixed"
            ) from exc

    def run(self) -> None:
        with _signals_as_interrupt():  # SIGTERM / SIGHUP stop the workers as Ctrl-C does
            try:
                self._start_all()  # (an interrupt between two starts stops the ones started)
                self._watch()
            except KeyboardInterrupt:
                self._stop()
                raise
            finally:
                if self.board is not None:
                    self.board.close()
                    self.board = None

    def _watch(self) -> None:
        next_check = time.monotonic() + self.every
        while any(p.poll() is None or p.returncode == EXIT_HUNG for p in self.procs):
            for i, p in enumerate(self.procs):
                if p.poll() == EXIT_HUNG:  # gave a hung trial up (`_exit_hung`): a new worker goes on
                    log.warning("worker process %d exited after a hung trial; starting another", p.pid)
                    self.procs[i] = self._start()
            if time.monotonic() >= next_check:
                self._check_stopped()  # (no store read: a stopped worker may hold the store's lock)
                try:
                    if self.timeout is not None:
                        self._check()
                    self._check_finished()
                    if self.timeout is None:  # no watch between the checks: no connection held idle
                        close_idle_connections(self.spec.storage)
                except WorkersStopped:  # a replacement could not be started (`_start`): every worker stopped
                    raise
                except Exception as exc:  # noqa: BLE001 - a store hiccup: the workers meet it too; looked again
                    log.info("watching the worker processes: %s", str(exc).splitlines()[0])
                next_check = time.monotonic() + self.every
            time.sleep(0.2)

    def _check_stopped(self) -> None:
        """Kill and replace each worker process seen stopped (SIGSTOP, `kill -STOP`) for longer than
        `stopped_limit` (its lease, by default). A stopped process renews no lease, so its task goes to
        another worker past the lease anyway; but it keeps its hold on the store, and a SQLite write
        transaction it was stopped in holds the database's write lock: every other worker's next write
        waited for it, the run made no progress and said nothing. Killed, its open transaction is rolled
        back (SQLite's journal) and nothing it had committed is lost. A process a debugger stopped
        (tracing stop) is left alone, as is one continued before the limit."""
        now = time.monotonic()
        for i, p in enumerate(self.procs):
            if p.poll() is not None or not _is_stopped(p.pid):
                self.stopped_since.pop(p.pid, None)
                continue
            since = self.stopped_since.setdefault(p.pid, now)
            if now - since <= self.stopped_limit:
                continue
            self.stopped_since.pop(p.pid, None)
            self.held.pop(p.pid, None)
            _kill(p)
            log.warning(
                "worker process %d was stopped (SIGSTOP) for %.0f s, past its lease (%g s): killed it (a "
                "stopped process keeps its locks on the store; with SQLite every other worker waits for "
                "its write lock); its task, if it held one, goes to another worker; starting another",
                p.pid,
                now - since,
                self.lease_s,
            )
            self.procs[i] = self._start()

    def _check_finished(self) -> None:
        """Kill the worker processes still there `STOP_GRACE_S` after the study's last task finished: a
        worker exits within its poll (2 s at most) once no task is pending or running, so one that has not
        is stopped (SIGSTOP while it waited for a task, or after it lost its task to another worker) or
        stuck, and the run would wait for it for ever. It holds no task: nothing is handed back."""
        if self.board is None:
            self.board = TaskBoard(self.spec.storage)
        counts = summarize(self.board.rows(self.spec.name))
        if counts[PENDING] or counts[RUNNING]:
            self.finished_at = None
            return
        now = time.monotonic()
        if self.finished_at is None:
            self.finished_at = now
        if now - self.finished_at < STOP_GRACE_S:
            return
        for p in self.procs:
            if p.poll() is None:
                _kill(p)
                log.warning(
                    "worker process %d had not exited %g s after the study's last task finished (it was "
                    "stopped, or is stuck); killed it (it held no task)",
                    p.pid,
                    STOP_GRACE_S,
                )

    def _check(self) -> None:
        """Kill and replace each worker process that went quiet: the task it holds, or held last, went
        `limit` s without a renewal. A worker whose task another worker took over (its lease ran out: the
        process was stopped, or hangs holding the GIL) is still watched on that task until it holds
        another or ends: with `lease_seconds` below `trial_timeout` (as in the docs' example) a stopped
        worker loses its task first, and left alone it would hold the run at its end for ever. A worker
        that lost its lease and went on is seen holding its next task; one that waits idle with no task
        left may be killed at the run's end (it has nothing to do)."""
        if self.board is None:
            self.board = TaskBoard(self.spec.storage)
        now, rows = self.board.beats(self.spec.name)
        by_id = {r[0]: r for r in rows}
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                self.held.pop(p.pid, None)
                continue
            prefix = f"{HOST}:{p.pid}:"
            mine = [r for r in rows if r[1] == RUNNING and r[2] and r[2].startswith(prefix)]
            if mine:
                row_id, _status, worker, beat = mine[0]
                self.held[p.pid] = (row_id, float(beat if beat is not None else now), str(worker))
            seen = self.held.get(p.pid)
            if seen is None:
                continue
            row_id, beat, worker = seen
            row = by_id.get(row_id)
            if row is None or row[1] != RUNNING:
                self.held.pop(p.pid, None)  # finished or handed back: it holds nothing now
                continue
            if now - beat > self.limit:  # it holds the task, or lost it to another worker without noticing
                self.held.pop(p.pid, None)
                self.procs[i] = self._replace(p, row_id, worker, now - beat)

    def _replace(
        self, p: subprocess.Popen[bytes], row_id: int, worker: str, idle: float
    ) -> subprocess.Popen[bytes]:
        _kill(p)
        # the killed process is replaced whatever the store says below: a write that fails here (a store
        # hiccup, which `_watch` logs and looks past) left the run one worker short, and with one worker
        # ended it as stopped with an error
        try:
            what = self._give_back(row_id, worker, idle)
        except Exception as exc:  # noqa: BLE001 - the task is taken over when its lease runs out instead
            first = str(exc).splitlines()[0] if str(exc) else ""
            what = f"could not hand its task back ({type(exc).__name__}: {first}; its lease frees it)"
            with contextlib.suppress(Exception):  # a claim `_give_back` took: the next worker takes it now
                assert self.board is not None
                self.board.release(self.spec.name, self.me)
        log.warning(
            "worker process %d renewed its task's lease for %.0f s (trial_timeout = %g s): its heartbeat "
            "stopped too (the process was stopped, or code that holds the GIL hangs); killed it, %s; "
            "starting another",
            p.pid,
            idle,
            self.timeout,
            what,
        )
        return self._start()

    def _give_back(self, row_id: int, worker: str, idle: float) -> str:
        """The task `row_id` of the killed worker `worker`: its trials in flight failed (timeout) and the
        task back on the queue, where `worker` still held it; says what was done."""
        assert self.board is not None and self.timeout is not None
        claim = self.board.take_from(row_id, worker, self.me, self.lease_s)
        if claim is None:
            return "its task had been taken over by another worker"
        error = (
            f"no result after {idle:.0f} s (the study's trial_timeout is {self.timeout:g} s), and the "
            "worker's process stopped answering (its heartbeat too: the process was stopped, or code "
            "that holds the GIL hangs): killed"
        )
        configs = _fail_trials_in_flight(_optuna_storage(self.spec.storage), claim.task, self.me, error)
        self.board.finish(claim, PENDING)
        return (
            f"marked config {', '.join(map(str, configs))} failed (timeout)"
            if configs
            else "no trial in flight"
        ) + f" and handed task {claim.task.key} back"

    def _stop(self) -> None:
        """Ctrl-C: ask every worker process to hand its task back (`_stop_signal`), wait `STOP_GRACE_S`
        for them, kill the rest and hand their tasks back; no worker process is left behind, every
        finished trial is kept."""
        live = [p for p in self.procs if p.poll() is None]
        stop = _stop_signal()
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(stop)
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            for p in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:  # Ctrl-C again: stop waiting
            pass
        stuck = [p for p in live if p.poll() is None]
        for p in stuck:
            _kill(p)
        if not stuck:
            return
        log.warning(
            "worker process(es) %s did not stop on the interrupt within %g s (stopped, or stuck in a "
            "trial); killed",
            ", ".join(str(p.pid) for p in stuck),
            STOP_GRACE_S,
        )
        try:
            board = self.board = self.board or TaskBoard(self.spec.storage)
            for worker in {r[2] for r in board.beats(self.spec.name)[1] if r[1] == RUNNING and r[2]}:
                if any(worker.startswith(f"{HOST}:{p.pid}:") for p in stuck):
                    board.release(self.spec.name, worker)
        except Exception as exc:  # noqa: BLE001 - a worker of this host takes a dead one's task over at once
            log.error("could not hand back the tasks of the killed workers: %s", exc)


def _stop_signal() -> int:
    """The signal that asks the runner's worker processes to hand their tasks back: SIGINT, which a
    terminal's Ctrl-C sent them as well (or not, with `kill -INT` on the runner), unless this process
    ignores SIGINT. Its workers then ignore it too (a shell starts a background job, `cmd &`, with SIGINT
    ignored, and the workers inherit that): SIGINT left them running, and the runner killed them after
    `STOP_GRACE_S`, with their trials in flight. SIGTERM, which a worker always hands its task back on."""
    return signal.SIGTERM if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else signal.SIGINT


def _is_stopped(pid: int) -> bool:
    """Whether the child process `pid` is stopped by a signal (SIGSTOP, SIGTSTP), not by a debugger:
    its state in /proc on Linux; elsewhere `os.waitid` (WNOWAIT: the status stays for `Popen` to reap),
    where the platform has it; else False."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] == "T"  # "t": a debugger's tracing stop
    except (OSError, IndexError):
        pass
    waitid = getattr(os, "waitid", None)
    if waitid is None or not hasattr(os, "WSTOPPED") or os.path.isdir("/proc/self"):
        return False
    try:
        got = waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except OSError:
        return False
    return got is not None and got.si_code == os.CLD_STOPPED


def _kill(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL `p` (a stopped process too) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        p.kill()
    p.wait()


class WorkersStopped(RuntimeError):
    """`run_study(..., workers=N)`: local workers stopped with an error (a store they could not reach or
    write, the server's connection limit) and left tasks that no local worker is running."""


def _check_workers(summary: RunSummary, codes: list[int]) -> None:
    """Raise `WorkersStopped` when the local workers are all gone but the study is not finished because
    some of them stopped early: tasks still pending (a worker exits 1 only once the queue is empty,
    unless an error stopped it), or every worker failed. Without this, a fleet that could not even
    open the store ended like one whose tasks other machines were still running: exit 0."""
    failed = [c for c in codes if c != 0]
    pending = summary.counts.get(PENDING, 0)
    if summary.complete or not failed or not (pending or len(failed) == len(codes)):
        return
    running = summary.counts.get(RUNNING, 0)
    raise WorkersStopped(
        f"study {summary.study}: {len(failed)} of {len(codes)} worker processes stopped with an error "
        f"(exit codes {sorted(set(failed))}; their own lines above say why), leaving {pending} task(s) "
        f"pending and {running} held by a lease (a worker elsewhere, or one of these whose hand-back "
        "could not be written, taken over when the lease runs out); nothing finished was lost: run "
        "`tuner study run` again once the cause is fixed"
    )


class _Monitor:
    """The progress display: polls the board (so it sees every worker, local or not) and shows tasks and
    trials done, the best value of each running task and the time left."""

    def __init__(self, spec: StudySpec, interval: float = 1.0) -> None:
        self.spec, self.interval = spec, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._board: TaskBoard | None = None
        self._progress: Any = None
        self._overall: Any = None
        self._lines: dict[str, Any] = {}

    def start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class _OverallOnly(TimeRemainingColumn):
            def render(self, task: Any) -> Any:  # ETA of the whole study only
                return super().render(task) if task.fields.get("overall") else Text("")

        self._board = TaskBoard(self.spec.storage)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            _OverallOnly(),
            console=Console(stderr=True),  # a display, not output: stdout stays the caller's (and --json's)
            transient=False,
        )
        self._overall = self._progress.add_task("trials", total=None, extra="trials", overall=True, eta="ETA")
        self._progress.start()
        self._poll(initial=True)
        self._thread = threading.Thread(target=self._loop, name="study-progress", daemon=True)
        self._thread.start()

    def on_progress(self, claim: Claim, trials_done: int, best: float | None) -> None:
        pass  # the poller picks it up from the board within `interval`

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001 - a display hiccup must not stop the study
                log.debug("progress poll: %s", exc)

    def _poll(self, initial: bool = False) -> None:
        assert self._board is not None and self._progress is not None
        rows = self._board.rows(self.spec.name)
        counts = summarize(rows)
        total_trials = sum(_budget_of(r) for r in rows)
        done_trials = sum(
            min(r.trials_done, _budget_of(r)) if r.status != DONE else _budget_of(r) for r in rows
        )
        desc = f"tasks {counts[DONE]}/{len(rows)} done" + (
            f", {counts[FAILED]} failed" if counts[FAILED] else ""
        )
        if initial:
            self._progress.reset(self._overall, total=total_trials, completed=done_trials, description=desc)
        else:
            self._progress.update(self._overall, total=total_trials, completed=done_trials, description=desc)
        running = {r.key: r for r in rows if r.status == RUNNING}
        for key in list(self._lines):
            if key not in running:
                self._progress.remove_task(self._lines.pop(key))
        for key, r in running.items():
            best = f"best {r.best_value:.4g}" if r.best_value is not None else "best -"
            if key not in self._lines:
                # "…" where the display's stream can write it (not an ascii stderr: LC_ALL=C PYTHONUTF8=0)
                utf = self._progress.console.encoding.lower().startswith("utf")
                label = key if len(key) <= 46 else key[:45] + "…" if utf else key[:43] + "..."
                self._lines[key] = self._progress.add_task(
                    f"  {label}", total=_budget_of(r), extra=best, overall=False, eta=""
                )
            self._progress.update(self._lines[key], completed=r.trials_done, extra=best)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._poll()
            self._progress.stop()
        if self._board is not None:
            self._board.close()


def _budget_of(r: TaskRow) -> int:
    return int(r.task.budget) if r.task.budget else max(r.trials_done, 1)
