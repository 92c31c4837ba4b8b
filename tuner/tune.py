"""Tuning one kernel task end to end: space -> optimize with a measurer -> store -> finalists -> winner.

    result = tune_kernel("matmul", {"M": 512, "N": 512, "K": 512, "dtype": "float16"},
                         backend="triton", budget=40, storage="sqlite:///tuner.db")
    result.best_config, result.best.median  # milliseconds

Every measurement (each trial and each finalist re-measurement) is stored with its status, timing
statistics and error text when `storage` is given.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.search_spaces import Config, Device, SearchSpace, get_device

from ._optimize import Trial, TuneResult, optimize
from ._units import ms_to_s
from ._versions import software_versions
from .measure import (
    CRASHED,
    KernelMeasurer,
    Measurer,
    MeasureResult,
    Selection,
    choose_winner,
    config_order_key,
)
from .store import CARRIED_FROM, ResultStore, _match_key

if TYPE_CHECKING:  # pragma: no cover
    from tuner.kernels import KernelSpec

    from .strategies import PriorTask, Strategy

log = logging.getLogger(__name__)

__all__ = ["KernelTrial", "KernelTuneResult", "MeasurementFailed", "tune_kernel", "software_versions"]

PRECOMPILE_LIMIT = 512


class MeasurementFailed(RuntimeError):
    """Raised by the tuning objective for a config whose measurement failed (the loop marks it failed)."""

    def __init__(self, result: MeasureResult) -> None:
        self.result = result
        self.status = result.status
        super().__init__(f"{result.status}: {result.error}")


@dataclass(frozen=True)
class KernelTrial:
    """One tuning trial with its full measurement."""

    number: int
    config: Config
    result: MeasureResult

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def value(self) -> float | None:
        return self.result.value


@dataclass(frozen=True)
class KernelTuneResult:
    """The outcome of `tune_kernel`. `best` is the winner's interleaved re-measurement (ms)."""

    kernel: str
    problem: Mapping[str, Any]
    backend: str
    device: str
    best_config: Config | None
    best: MeasureResult | None
    trials: tuple[KernelTrial, ...]
    finalists: tuple[tuple[Config, MeasureResult], ...]
    selection: Selection | None
    tune: TuneResult
    flops: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def best_time_ms(self) -> float:
        return self.best.median if self.best is not None and self.best.median is not None else math.inf

    @property
    def best_value(self) -> float:
        """`best_time_ms`, under the name `TuneResult` uses (inf when nothing succeeded)."""
        return self.best_time_ms

    @property
    def evaluations(self) -> int:
        return len(self.trials)

    @property
    def tflops(self) -> float | None:
        """The winner's throughput (TFLOP/s) from the kernel's analytic FLOP count."""
        if not self.flops or self.best is None or not self.best.median:
            return None
        return self.flops / ms_to_s(self.best.median) / 1e12

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.status] = out.get(t.status, 0) + 1
        return out


def _carried_sources(store: ResultStore, study_name: str) -> dict[str, str]:
    """The trials of Optuna study `study_name` carried over from another study (a retried study task's
    attempt, `tuner.studies._retry`): their config (`_match_key`) -> the study they were measured in,
    whose name their measurements are stored under. One read of the study's finished trials."""
    import optuna

    storage = store.optuna_storage()
    try:
        sid = storage.get_study_id_from_name(study_name)
    except KeyError:
        return {}
    out: dict[str, str] = {}
    for t in storage.get_all_trials(sid, deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        source = t.user_attrs.get(CARRIED_FROM)
        if source:
            out.setdefault(_match_key(t.params), str(source))
    return out


def _resumed_trials(
    tr: TuneResult, new: list[KernelTrial], store: ResultStore | None, study_name: str, label: str
) -> list[KernelTrial]:
    """All trials of a resumed run: the earlier ones rebuilt from their stored measurements (a trial carried
    over from an earlier attempt of a study task, from the study it was measured in)."""
    done = {t.number for t in new}
    carried: dict[str, str] = {}
    rows: dict[tuple[str, str], Any] = {}  # (study name, config) -> its measurement
    if store is not None:
        carried = _carried_sources(store, study_name)
        for name in sorted({study_name, *carried.values()}):  # one read per study
            for r in store.measurements(study_name=name):
                if r.stats.get("phase") != "final":
                    rows[name, config_order_key(r.config)] = r
    out = list(new)
    for t in tr.trials:
        if t.number in done:
            continue
        source = carried.get(_match_key(t.config), study_name)
        row = rows.get((source, config_order_key(t.config)))
        res: MeasureResult
        if row is not None and row.stats.get("status") == row.status:
            res = MeasureResult.from_dict({**row.stats, "error": row.error})
        elif t.value is not None:
            res = MeasureResult(status="ok", backend=label, median=t.value, n=1, extra={"resumed": True})
        else:
            res = MeasureResult.failed(
                CRASHED, label, t.error or "failed (resumed without its stored measurement)"
            )
        out.append(KernelTrial(t.number, dict(t.config), res))
    return sorted(out, key=lambda k: k.number)


def _resolve_device(device: Device | str | None, backend: str) -> Device:
    if device is None:
        from .measure import detect_device

        return detect_device(backend)
    if isinstance(device, str):
        return get_device(device)
    return device


def tune_kernel(
    kernel: KernelSpec | str,
    problem: Mapping[str, Any] | None,
    *,
    backend: str,
    device: Device | str | None = None,
    budget: int,
    strategy: str | Strategy = "auto",
    seed: int = 0,
    storage: str | ResultStore | None = None,
    prior: Sequence[PriorTask] | None = None,
    time_budget_s: float | None = None,
    finalists: int = 3,
    measurer: Measurer | None = None,
    callback: Callable[[KernelTrial], None] | None = None,
    space: SearchSpace | None = None,
    precompile: bool | int = False,
    study_name: str | None = None,
) -> KernelTuneResult:
    """Tune `kernel` (a registered kernel's name, or its `KernelSpec`) on one problem (None: the kernel's
    `default_problem`), backend and device.

    - Builds the kernel's space for the problem and device, and (unless `measurer` is given) a
      `KernelMeasurer` that isolates each config in a worker process and checks it against the
      reference.
    - Runs `tuner.optimize` with the measured median (ms) as the objective; a failed measurement
      (any status but ok) is a failed trial, its status and error kept.
    - `storage`: every trial and every finalist re-measurement is stored (status, timing statistics,
      error text, task context), and the Optuna study lives there under `study_name` (default: from
      the kernel, task, backend and seed). Re-running with the same storage and study name resumes:
      finished trials count towards the budget and are not measured again (their measurements come
      back from the store). When `prior` is None, the store's past measurements of this kernel on other
      tasks are the prior.
    - `space`: tune over this space instead of the kernel's own (e.g. a subset of it, as
      benchmarks/gpu_validate.py does to compare with an exhaustive sweep of the same configs).
    - `precompile`: True (or a number of processes) compiles and checks every config of the space in
      parallel worker processes before tuning starts (spaces of at most `PRECOMPILE_LIMIT` configs), so
      the trials load compiled kernels. Worth it on a GPU with a small space; checking a config runs it
      once, so this is a phase of its own rather than overlapped with timing.
    - The best `finalists` configs are re-measured interleaved and the winner chosen by median, ties
      within the noise band broken by config order (`choose_winner`).
    """
    from tuner.kernels import get_kernel

    from .strategies import check_strategy

    check_strategy(strategy)  # before the space, the measurer and the store are made
    spec: KernelSpec = get_kernel(kernel) if isinstance(kernel, str) else kernel
    if backend not in spec.backends:
        raise ValueError(f"kernel {spec.name!r} has no {backend!r} backend; it has {list(spec.backends)}")
    problem = dict(problem if problem is not None else spec.default_problem)
    dev = _resolve_device(device, backend)
    if space is None:
        space = spec.space(problem, dev, backend)
    if measurer is None:  # the default measurer runs the kernel here: its backend must be installed
        from .measure._gate import refuse_missing_backend

        refuse_missing_backend(backend, f"tune_kernel({spec.name!r})")

    from .store import TaskContext

    store: ResultStore | None = None
    if storage is not None:
        store = storage if isinstance(storage, ResultStore) else ResultStore(storage)
    task = TaskContext(
        kernel=spec.name,
        problem=problem,
        device=dev.arch,
        versions=software_versions(),
        dtype=str(problem.get("dtype", "")),
    )
    if prior is None and store is not None:
        prior = store.prior_for(spec.name, exclude_task=task.task_id) or None
    strategy_name = strategy if isinstance(strategy, str) else strategy.name
    study_name = study_name or f"tune-{spec.name}-{task.task_id}-{backend}-{seed}"

    own = measurer is None
    m: Measurer = (
        measurer if measurer is not None else KernelMeasurer(spec, problem, backend, device=dev, seed=seed)
    )
    results: dict[str, MeasureResult] = {}
    ktrials: list[KernelTrial] = []

    def objective(config: Config) -> float:
        res = m.measure(config)
        results[config_order_key(config)] = res
        if not res.ok:
            raise MeasurementFailed(res)
        assert res.median is not None
        return res.median

    def record(trial: Trial) -> None:
        """The one place a trial is recorded: as a KernelTrial with its full measurement (and in the
        store, when there is one); `optimize` records nothing else."""
        res = results.pop(config_order_key(trial.config), None)
        if res is None:  # the measurer itself raised (a bug, or a config it cannot know)
            res = MeasureResult.failed(CRASHED, m.label, trial.error or "the measurer raised")
        kt = KernelTrial(trial.number, dict(trial.config), res)
        ktrials.append(kt)
        if store is not None:
            store.record(
                task,
                space.fingerprint(),
                kt.config,
                res.value,
                res.status,
                stats=res.stats(),
                error=res.error,
                study_name=study_name,
                trial_number=kt.number,
                strategy=strategy_name,
            )

    def on_trial(trial: Trial, _: TuneResult | None) -> None:
        kt = ktrials[-1]
        res = kt.result
        log.info(
            "trial %d %s: %s %s",
            kt.number,
            kt.config,
            res.status,
            f"{res.median:.4g} ms" if res.ok else (res.error or "")[:200],
        )
        if callback is not None:
            callback(kt)

    try:
        if precompile:
            if space.is_enumerable and len(space) <= PRECOMPILE_LIMIT:
                jobs = None if precompile is True else int(precompile)
                fails = m.precompile(space.enumerate(), jobs=jobs)
                log.info("precompiled %d configs; %d failed", len(space), len(fails))
            else:
                log.warning("precompile skipped: the space has more than %d configs", PRECOMPILE_LIMIT)
        tr = optimize(
            space,
            objective,
            budget=budget,
            seed=seed,
            strategy=strategy,
            prior=prior,
            time_budget_s=time_budget_s,
            callback=on_trial,
            recorder=record,
            storage=store,
            study_name=study_name if store is not None else None,
            task=task,
        )
        if len(ktrials) < len(tr.trials):  # resumed: the earlier trials' measurements are in the store
            ktrials = _resumed_trials(tr, ktrials, store, study_name, m.label)
        ok = sorted(
            (t for t in ktrials if t.result.ok), key=lambda t: (t.result.median, config_order_key(t.config))
        )
        picked = [t.config for t in ok[: max(1, finalists)]]
        final: list[MeasureResult] = m.remeasure(picked) if picked else []
        if store is not None:
            for c, r in zip(picked, final, strict=True):
                store.record(
                    task,
                    space.fingerprint(),
                    c,
                    r.value,
                    r.status,
                    stats={**r.stats(), "phase": "final"},
                    error=r.error,
                    study_name=study_name,
                    strategy="finalists",
                )
        sel = choose_winner(picked, final) if picked else None
    finally:
        if own:
            m.close()
    best_cfg = dict(picked[sel.winner]) if sel is not None and sel.winner is not None else None
    best = final[sel.winner] if sel is not None and sel.winner is not None else None
    if picked and best is None:
        log.warning("every finalist failed its re-measurement; no winner")
    try:
        flops = float(spec.flops(problem))
    except Exception:  # a FLOP count is a nicety for reports
        flops = None
    return KernelTuneResult(
        kernel=spec.name,
        problem=problem,
        backend=backend,
        device=dev.arch,
        best_config=best_cfg,
        best=best,
        trials=tuple(ktrials),
        finalists=tuple(zip(picked, final, strict=True)),
        selection=sel,
        tune=tr,
        flops=flops,
        info={
            "study_name": study_name,
            "task_id": task.task_id,
            "space_size": tr.space_size,
            "strategy": strategy_name,
        },
    )
