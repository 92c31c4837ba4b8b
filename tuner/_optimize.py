"""`tuner.optimize`: black-box tuning over a SearchSpace, driven through Optuna's ask/tell.

The loop here is the one evaluation wrapper that every strategy shares (Kernel Tuner's habit): it owns
the budget, the time budget, duplicate and invalid proposals, failures (an exception, NaN or inf) and the
Optuna study (in memory, or in the results database). Each new trial goes to one recorder: the results
store's by default, or the caller's (`tune_kernel` records the full measurement itself).
"""

from __future__ import annotations

import contextlib
import contextvars
import decimal
import json
import logging
import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.search_spaces import Config, ConfigError, SearchSpace
from tuner.search_spaces._params import NONE_VALUE, _check_value, native

from ._scoped import optuna_quiet
from .strategies import PriorTask, Strategy, check_strategy, get_strategy
from .strategies._base import prior_matching_space

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from .store import ResultStore, TaskContext

log = logging.getLogger(__name__)

__all__ = ["AllTrialsFailedWarning", "Trial", "TuneResult", "optimize", "validate_prior"]

OK = "ok"
FAILED = "failed"
# The largest seed `optimize` takes: Optuna's samplers seed numpy's RandomState, which takes 32 bits.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class Trial:
    """One evaluation: the config, its value (None when it failed), a status and timing."""

    number: int
    config: Config
    value: float | None
    status: str
    duration_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """What `optimize` found. `best_config` is None (and `best_value` inf) when every trial failed."""

    best_config: Config | None
    best_value: float
    trials: tuple[Trial, ...]
    strategy: str
    seed: int
    space_size: int | None = None
    stopped_because: str = "budget"
    strategy_time_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluations(self) -> int:
        return len(self.trials)

    def best_so_far(self) -> list[float]:
        """Best value after each trial (inf until the first success)."""
        out, best = [], math.inf
        for t in self.trials:
            if t.value is not None and t.value < best:
                best = t.value
            out.append(best)
        return out


def validate_prior(prior: Any) -> list[list[tuple[dict[str, Any], float | None]]] | None:
    """Check the shape of `prior` (a list of tasks, each a list of (config dict, value or None)) and
    normalise it (non-finite values become None, numpy scalars in configs Python values); ValueError
    names what is wrong, and a config value no space holds (None, NaN, inf, an int beyond a float's range,
    a list)."""
    if prior is None:
        return None
    if not isinstance(prior, (list, tuple)):
        raise ValueError(f"prior must be a list of tasks, got {type(prior).__name__}")
    out = []
    for ti, task in enumerate(prior):
        if not isinstance(task, (list, tuple)):
            raise ValueError(
                f"prior[{ti}] must be a list of (config, value) pairs, got {type(task).__name__}"
            )
        rows = []
        for ri, row in enumerate(task):
            if not isinstance(row, (list, tuple)) or len(row) != 2:
                raise ValueError(f"prior[{ti}][{ri}] must be a (config, value) pair, got {row!r}")
            cfg, val = row
            if not isinstance(cfg, Mapping):
                raise ValueError(f"prior[{ti}][{ri}]: config must be a dict, got {type(cfg).__name__}")
            cfg = {k: native(v) for k, v in cfg.items()}
            for k, v in cfg.items():  # a list or dict is no parameter value (the strategies hash them)
                if v is None:  # no space holds None: as refused in a space's values
                    raise ValueError(f"prior[{ti}][{ri}]: parameter {k!r}: {NONE_VALUE}")
                try:
                    hash(v)
                except TypeError:
                    raise ValueError(
                        f"prior[{ti}][{ri}]: config value {k}={_short_repr(v)} is not an int, float, str or bool"
                    ) from None
                if isinstance(v, (int, float)):  # NaN, inf, 2**1100: refused as in a space's values
                    _check_prior_number(ti, ri, k, v)
            if val is not None:
                try:
                    val = float(val)
                except OverflowError:  # an int beyond a float's range: infinite, a failure, as 1e400 is
                    val = math.inf
                except (TypeError, ValueError):
                    raise ValueError(
                        f"prior[{ti}][{ri}]: value must be a number or None, got {val!r}"
                    ) from None
                if not math.isfinite(val):
                    val = None
            rows.append((cfg, val))
        out.append(rows)
    return out


def _check_prior_number(ti: int, ri: int, name: str, v: float) -> None:
    """Refuse a number no space holds (NaN equals nothing, inf and an int beyond a float's range have no
    feature), as a space's values and a `--prior` file's entries refuse it: it would match no config
    and be a missing value to the cost model, without a word."""
    try:
        _check_value(name, v)
    except ValueError as exc:
        raise ValueError(
            f"prior[{ti}][{ri}]: {exc} (a parameter the task did not record is left out of its config)"
        ) from None


def _run_objective(
    objective: Callable[[Config], float], config: Config
) -> tuple[float | None, str, str | None]:
    try:
        raw = objective(dict(config))
    except Exception as exc:  # a failing config is a result, not a crash of the run
        from tuner.search_spaces.devices import interpreter_fault_note

        return None, FAILED, f"{type(exc).__name__}: {exc}{interpreter_fault_note(exc)}"
    try:
        value = real_number(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        return None, FAILED, f"objective returned {_short_repr(raw)}: {exc}"
    if not math.isfinite(value):
        return None, FAILED, f"objective returned {value}"
    return value, OK, None


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def real_number(raw: Any) -> float:
    """`raw` as a float when it is a real number: an int or float (not a bool), a numpy integer or
    floating scalar, a `fractions.Fraction` or `decimal.Decimal`, a 0-d array of an integer or floating
    dtype (numpy, torch, jax), or an object of another type that converts itself (`__float__`).
    TypeError naming the type otherwise: a str ("1.5" is text, not a result), bytes, None, a bool, a
    complex, an array that is not 0-d or whose dtype is bool, complex or not numeric. OverflowError for an
    int beyond float's range."""
    if raw is None or isinstance(raw, (str, bytes, bytearray, bool)):
        raise TypeError(f"type {_type_name(raw)}, not a real number")
    if isinstance(raw, (numbers.Real, decimal.Decimal)):  # numpy's bool is neither: a 0-d array below
        try:
            return float(raw)
        except OverflowError:
            raise OverflowError(f"type {_type_name(raw)}, beyond the range of a float") from None
    if isinstance(raw, numbers.Complex):
        raise TypeError(f"type {_type_name(raw)}, not a real number")
    dtype = getattr(raw, "dtype", None)
    if dtype is not None and hasattr(raw, "ndim"):
        if raw.ndim != 0:
            shape = tuple(getattr(raw, "shape", ()))
            raise TypeError(
                f"type {_type_name(raw)} of shape {shape}, not a real number (a 0-d array is one)"
            )
        if not _real_dtype(dtype):
            raise TypeError(f"type {_type_name(raw)} of dtype {dtype}, not a real number")
        return float(raw)
    if not hasattr(type(raw), "__float__"):
        raise TypeError(f"type {_type_name(raw)}, not a real number")
    return float(raw)


def _real_dtype(dtype: Any) -> bool:
    """Whether an array's dtype holds real numbers: numpy's (and jax's) integer and floating kinds and
    ml_dtypes' (bfloat16, the float8s, int4: numpy kind "V"); torch's dtypes that are neither complex
    nor bool."""
    if hasattr(dtype, "is_complex") and hasattr(dtype, "is_floating_point"):  # a torch.dtype
        return not dtype.is_complex and str(dtype) != "torch.bool"
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt.kind in "iuf" or (dt.kind == "V" and dt.type.__module__.split(".")[0] == "ml_dtypes")


def _short_repr(x: Any, limit: int = 200) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def optimize(
    space: SearchSpace,
    objective: Callable[[Config], float],
    *,
    budget: int,
    seed: int = 0,
    strategy: str | Strategy = "auto",
    prior: Sequence[PriorTask] | None = None,
    time_budget_s: float | None = None,
    storage: str | ResultStore | None = None,
    study_name: str | None = None,
    task: TaskContext | None = None,
    callback: Callable[[Trial, TuneResult | None], None] | None = None,
    recorder: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """Minimise `objective` over `space` with at most `budget` calls, never repeating a config.

    - `objective(config) -> float`, lower is better; it is called only with configs `space` contains,
      never twice with the same one. An exception, or a value that is NaN, inf, None or not a real
      number (`real_number` decides: numpy scalars and 0-d numeric arrays and tensors count; a str such
      as "1.5", bytes, a bool, a complex do not), marks that config failed with an error naming the
      value's type, and the search goes on. The same seed gives the same sequence of calls.
    - `strategy`: a registered name (`"auto"`, the default; `"random"`, `"tpe"`, `"model"`,
      `"transfer_best"`, `"xgb_greedy"`) or a `tuner.strategies.Strategy` instance, e.g.
      `ModelStrategy(space, seed=0, config=ModelStrategyConfig(...))`. An instance brings its own seed
      and prior (`seed` left out or equal, `prior` left out or the same) and serves one call.
    - `prior`: measurements of related tasks, a list of tasks, each a list of (config, value | None);
      its configs need not be in `space`.
    - `time_budget_s`: no new trial starts after this many seconds from the call (setup included; the
      call's first trial always runs, a running one is not interrupted).
    - `storage`: None keeps everything in memory; a database URL or a `ResultStore` keeps the Optuna
      study (named `study_name`; by default after the space, strategy, seed and `task`) and every
      measurement (with the `task` context) there. Re-running with the same storage and study name
      resumes: finished trials count towards the budget and are not measured again.
    - `recorder(trial)`: where each new trial is recorded, instead of the store's `record_trial` (the
      default with `storage`). `tune_kernel` passes its own, which records the full measurement. It is
      called before the trial is told to the Optuna study (see `_search`).
    - `callback(trial, None)` is called after each evaluation (progress bars). An exception it raises
      ends the search and reaches the caller (no result, and no `AllTrialsFailedWarning`): the runtime
      stops a tuning so when its first trial shows that no config can be timed.

    Returns a `TuneResult`: `best_config` (None when every trial failed, with an
    `AllTrialsFailedWarning`), `best_value` (inf then), `trials` in evaluation order, `stopped_because`
    ("budget", "time_budget" or "space_exhausted"). Raises `ValueError` / `TypeError` before any call
    of `objective` for bad arguments or a space whose constraints admit no config.
    """
    t_start = time.perf_counter()  # the time budget counts from here: strategy and study setup included
    budget, seed = _check_arguments(space, objective, budget, seed, time_budget_s)
    check_strategy(strategy)
    space.check_not_empty()  # every config violates a constraint: say which, before anything runs
    prior_n = validate_prior(prior)
    # Optuna logs each study and trial at INFO: while `optimize` runs, only its warnings; the caller's
    # verbosity comes back after the last running call (`tuner._scoped.optuna_quiet`)
    with optuna_quiet(), _store_in_use(storage):
        strat, strategy_name = _make_strategy(strategy, space, seed, prior_n)
        seed = strat.seed  # an instance's own seed (equal to `seed` for a strategy given by name)
        store = _open_store(storage)
        if store is not None and study_name is None:
            study_name = default_study_name(space, strategy_name, seed, task)
        study = _open_study(space, strat, seed, store, study_name)
        if recorder is None and store is not None:
            recorder = _store_recorder(store, task, space, study.study_name, strategy_name)
        trials = _resume(study, space, strat, store)
        stopped, strategy_time = _search(
            space, objective, strat, study, trials, budget, time_budget_s, t_start, recorder, callback
        )
    ok_trials = [t for t in trials if t.value is not None]
    best = min(ok_trials, key=lambda t: (t.value, t.number)) if ok_trials else None
    if trials and best is None and not _failure_raised_by_caller.get():
        _warn_all_failed(trials)
    return TuneResult(
        best_config=dict(best.config) if best else None,
        best_value=best.value if best and best.value is not None else math.inf,
        trials=tuple(trials),
        strategy=strategy_name,
        seed=seed,
        space_size=strat.pool.size,
        stopped_because=stopped,
        strategy_time_s=strategy_time,
        info={"study_name": study.study_name},
    )


class AllTrialsFailedWarning(RuntimeWarning):
    """Every trial of an `optimize` run failed: the result has no best config (None) and an inf value."""


# Set while a caller that raises its own error when every trial failed runs `optimize` (the runtime's
# AllConfigsFailedError names the first error too): the warning would print the same text just before it.
_failure_raised_by_caller: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tuner_all_failed_raised_by_caller", default=False
)


@contextlib.contextmanager
def all_failed_raised_by_caller() -> Iterator[None]:
    """Within it (this thread or task), `optimize` does not warn that every trial failed: the caller says
    so itself, in the error it raises. Thread-safe, unlike a warnings filter."""
    token = _failure_raised_by_caller.set(True)
    try:
        yield
    finally:
        _failure_raised_by_caller.reset(token)


def _warn_all_failed(trials: Sequence[Trial]) -> None:
    first = next((t.error for t in trials if t.error), None)
    msg = f"every one of the {len(trials)} trials failed; best_config is None and best_value inf" + (
        f" (first error: {first.strip().splitlines()[0][:300]})" if first and first.strip() else ""
    )
    warnings.warn(msg, AllTrialsFailedWarning, stacklevel=3)


# ---- the parts of `optimize` -----------------------------------------------------------------------
def _check_arguments(
    space: Any, objective: Any, budget: Any, seed: Any, time_budget_s: Any
) -> tuple[int, int]:
    """Refuse arguments of the wrong type or range up front, naming them; (budget, seed) as Python ints
    (a numpy integer is accepted)."""
    if not isinstance(space, SearchSpace):
        raise TypeError(f"space must be a SearchSpace, got {type(space).__name__}")
    if not callable(objective):
        raise TypeError("objective must be callable")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
        raise ValueError(f"budget must be a positive int, got {budget!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        # the upper bound is Optuna's: its samplers seed numpy's RandomState, which takes 32 bits
        raise ValueError(f"seed must be a non-negative int below 2**32, got {seed!r}")
    if time_budget_s is not None and (
        isinstance(time_budget_s, bool)
        or not isinstance(time_budget_s, numbers.Real)
        or not float(time_budget_s) > 0  # also refuses NaN, which would mean no limit
    ):
        raise ValueError(f"time_budget_s must be a positive number of seconds or None, got {time_budget_s!r}")
    return int(budget), int(seed)


def _make_strategy(
    strategy: str | Strategy, space: SearchSpace, seed: int, prior: Sequence[PriorTask] | None
) -> tuple[Strategy, str]:
    """The strategy instance and the name its results are recorded under."""
    if isinstance(strategy, Strategy):
        _check_instance(strategy, space, seed, prior)
        return strategy, strategy.name
    check_strategy(strategy)
    return get_strategy(strategy)(space, seed=seed, prior=prior), strategy


def _check_instance(
    strat: Strategy, space: SearchSpace, seed: int, prior: Sequence[PriorTask] | None
) -> None:
    """A strategy instance brings its own space, seed and prior: refuse one that cannot serve this call
    rather than let an argument be ignored or a search run on another space's candidates."""
    name = type(strat).__name__
    if not hasattr(strat, "pool") or not hasattr(strat, "history"):
        raise TypeError(
            f"{name} was not initialised as a Strategy: its __init__ must call "
            "super().__init__(space, seed=seed, prior=prior)"
        )
    if strat.space is not space and strat.space.fingerprint() != space.fingerprint():
        raise ValueError(f"the {name} instance was built for another space ({strat.space!r}), not {space!r}")
    if strat.history:
        raise ValueError(
            f"the {name} instance already heard {len(strat.history)} results (it ran before): "
            "build a new instance for each optimize call"
        )
    if (
        prior is not None
        and strat.uses_prior
        and prior_matching_space(space, prior, warn=False) != validate_prior(strat.prior)
    ):
        raise ValueError(
            f"prior= is not used with a strategy instance, and the {name} instance holds another one: "
            f"pass it to the instance, {name}(space, seed=..., prior=...)"
        )
    if seed not in (0, strat.seed):
        raise ValueError(
            f"seed={seed} differs from the {name} instance's seed={strat.seed}: the instance's seed "
            "drives the search; pass the seed to it (optimize's seed may be left out)"
        )


@contextlib.contextmanager
def _store_in_use(storage: str | ResultStore | None) -> Iterator[None]:
    """A SQLite store's file is this run's while it lasts: one deleted since an earlier run of this
    process (a notebook's `rm`) is opened anew first; one deleted during the run stops its next write
    (`tuner.storage._replaced`)."""
    if storage is None:
        yield
        return
    from .storage._replaced import holding, reopen_if_replaced

    url = storage if isinstance(storage, str) else storage.url
    reopen_if_replaced(url)
    with holding(url):
        yield


def _open_store(storage: str | ResultStore | None) -> ResultStore | None:
    if storage is None:
        return None
    from .store import ResultStore

    return storage if isinstance(storage, ResultStore) else ResultStore(storage)


def _open_study(
    space: SearchSpace, strat: Strategy, seed: int, store: ResultStore | None, study_name: str | None
) -> optuna.Study:
    """The Optuna study: in memory, or created (or loaded, to resume) in the store's database."""
    import optuna

    sampler = strat.optuna_sampler() or optuna.samplers.RandomSampler(seed=seed)
    return optuna.create_study(
        storage=store.optuna_storage() if store is not None else None,
        study_name=study_name,
        sampler=sampler,
        direction="minimize",
        load_if_exists=True,
    )


def default_study_name(space: SearchSpace, strategy: str, seed: int, task: TaskContext | None) -> str:
    """The study that `optimize(..., storage=...)` without a `study_name` keeps its trials in (and resumes):
    one per space, strategy, seed and task, so that another strategy, seed or problem (a `task` with
    other shapes) starts its own search instead of taking over that one's trials as its own."""
    name = f"tuner-{space.fingerprint()}-{strategy}-{seed}"
    return f"{name}-{task.task_id}" if task is not None else name


def _store_recorder(
    store: ResultStore, task: TaskContext | None, space: SearchSpace, study_name: str, strategy: str
) -> Callable[[Trial], None]:
    def record(trial: Trial) -> None:
        store.record_trial(task, space, trial, study_name=study_name, strategy=strategy)

    return record


def _resume(
    study: optuna.Study, space: SearchSpace, strat: Strategy, store: ResultStore | None
) -> list[Trial]:
    """The study's finished trials (a resumed run), told to the strategy: they count towards the budget
    and are never measured again. Proposals that were replaced (`tuner_skip`) are not measurements. A
    trial left RUNNING whose measurement the store holds (its run stopped between the two writes) is
    told from that measurement first, and counts."""
    import optuna

    found = study.get_trials(deepcopy=False)
    if store is not None:
        running = [t for t in found if t.state == optuna.trial.TrialState.RUNNING]
        if store.tell_measured_trials(study.study_name, running):
            found = study.get_trials(deepcopy=False)
    trials: list[Trial] = []
    for ft in found:
        if ft.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL):
            continue
        if ft.user_attrs.get("tuner_skip"):
            continue
        held = ft.user_attrs.get("tuner_config")  # the config where Optuna's params cannot tell it (_tell)
        try:
            cfg = space.validate(json.loads(held) if isinstance(held, str) else ft.params)
        except ValueError:
            continue
        if strat.pool.is_seen(cfg):
            continue
        val = ft.value if ft.state == optuna.trial.TrialState.COMPLETE else None
        status = OK if val is not None else ft.user_attrs.get("tuner_status", FAILED)
        trials.append(
            Trial(len(trials), space.as_given(cfg), val, status, error=ft.user_attrs.get("tuner_error"))
        )
        strat.tell(cfg, val)
    if trials:
        log.info("resumed study %s with %d finished trials", study.study_name, len(trials))
    return trials


@dataclass
class _Asked:
    """The Optuna trial of the config to measure, and the sampler's replaced proposal (if any)."""

    trial: optuna.trial.Trial
    config: Config
    proxy: optuna.trial.Trial | None = None


def _ask(study: optuna.Study, strat: Strategy, space: SearchSpace, dists: dict[str, Any]) -> _Asked | None:
    """The next config, as an Optuna trial: the strategy's proposal, or (when it returns None) the study
    sampler's, projected onto the nearest unseen valid config when it is invalid or repeated. None when
    no unseen valid config is left."""
    import optuna

    proposed = strat.propose()
    if proposed is not None:
        try:
            cfg = space.validate(proposed)
        except ConfigError as exc:
            raise ConfigError(
                [f"strategy {strat.name!r} proposed a config the space rejects: {proposed!r}", *exc.reasons]
            ) from None
        if strat.pool.is_seen(cfg):
            raise RuntimeError(f"strategy {strat.name!r} proposed a config twice: {cfg}")
        study.enqueue_trial(cfg, skip_if_exists=False)
        trial = study.ask(dists)
        if trial.params != cfg:  # `ask` handed out a trial someone else enqueued meanwhile
            raise RuntimeError(
                f"study {study.study_name!r}: asked for {cfg}, Optuna handed out trial {trial.number} with "
                f"{trial.params}; the study is being run by two optimize calls at once (one call per study; "
                "a fleet of workers: tuner study run)"
            )
        return _Asked(trial, cfg)
    otrial = study.ask(dists)
    proposal = dict(otrial.params)
    if not space.violations(proposal) and not strat.pool.is_seen(space.validate(proposal)):
        return _Asked(otrial, space.validate(otrial.params))
    # Optuna proposed an invalid or repeated config: measure the nearest unseen valid config instead, and
    # tell the proposal trial (marked tuner_skip, so it never counts as a measurement) that config's
    # value, so that the sampler learns about the region it proposed rather than proposing it again.
    otrial.set_user_attr("tuner_skip", "invalid_or_duplicate_proposal")
    repl = strat.pool.nearest_unseen(proposal)
    if repl is None:
        study.tell(otrial, state=optuna.trial.TrialState.FAIL)
        return None
    otrial.set_user_attr("tuner_projected_to", json.dumps(repl, sort_keys=True, default=str))
    study.enqueue_trial(repl, skip_if_exists=False)
    measured = study.ask(dists)
    return _Asked(measured, space.validate(measured.params), proxy=otrial)


def _take_enqueued(
    study: optuna.Study, strat: Strategy, space: SearchSpace, dists: dict[str, Any]
) -> _Asked | None:
    """The oldest trial waiting in the study (a user's `study.enqueue_trial`, or an interrupted run's
    proposal), as Optuna's `ask` hands it out; None, after marking it skipped, when it is invalid or
    already measured. Taken before any new proposal: `ask` pops the oldest waiting trial, so one left
    waiting would be handed out in place of each proposal after it, and every result would be stored
    against the previous proposal's parameters."""
    import optuna

    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    fixed = (waiting[0].system_attrs.get("fixed_params") or {}) if waiting else {}
    # Optuna refuses (and leaves running) an enqueued value outside a distribution: ask without them then
    in_domains = all(n in space.names and space[n].has(v) for n, v in fixed.items())
    trial = study.ask(dists if in_domains else None)
    params = dict(trial.params)
    if in_domains and not space.violations(params):
        cfg = space.validate(params)
        if not strat.pool.is_seen(cfg):
            return _Asked(trial, cfg)
    trial.set_user_attr("tuner_skip", "enqueued_invalid_or_duplicate")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return None


def _ambiguous_in_optuna(config: Config, dists: dict[str, Any]) -> bool:
    """True when Optuna reads `config` back from its storage as another config (True as 1)."""
    for k, v in config.items():
        back = dists[k].to_external_repr(dists[k].to_internal_repr(v))
        if type(back) is not type(v) or back != v:
            return True
    return False


def _tell(
    study: optuna.Study,
    asked: _Asked,
    value: float | None,
    status: str,
    error: str | None,
    dists: dict[str, Any] | None = None,
) -> None:
    """Finish the measured trial (and the replaced proposal, with the same value) in the study."""
    import optuna

    if dists is not None and _ambiguous_in_optuna(asked.config, dists):
        # Optuna stores a categorical choice as the index of the first choice equal to it, so a domain
        # holding both 1 and True stores True as 1: keep the config itself for a resumed run (`_resume`)
        asked.trial.set_user_attr("tuner_config", json.dumps(asked.config))
    if value is None:
        asked.trial.set_user_attr("tuner_status", status)
        if error:
            asked.trial.set_user_attr("tuner_error", error[:2000])
        study.tell(asked.trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(asked.trial, value)
    if asked.proxy is not None:
        if value is None:
            study.tell(asked.proxy, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(asked.proxy, value)


def _abandon(study: optuna.Study, asked: _Asked, why: str) -> None:
    """Finish the asked trial (and its replaced proposal) as FAIL + `tuner_skip`: its measurement was not
    stored and never will be (this worker lost its lease on the study's task). Best effort: the new
    holder may have abandoned it already, and nothing else tells it."""
    import optuna

    for t in (asked.trial, asked.proxy):
        if t is None:
            continue
        try:
            t.set_user_attr("tuner_skip", why)
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        except Exception as exc:  # noqa: BLE001 - finished meanwhile, or the store is down: LeaseLost follows
            log.info("trial %d of study %s left as it is: %s", t.number, study.study_name, exc)


def _categorical_equality_by_identity() -> None:
    """Make Optuna's `CategoricalDistribution ==` answer True at once for the same object.

    Optuna compares a trial's categorical distributions with the study's at every `ask` with fixed
    distributions and every parameter it stores, choice by choice through an ABC `isinstance` check, even
    when both sides are the same object (the `dists` passed to each `ask`): with a parameter of 3000
    float values that was some 20 ms per trial, more than the strategy's own work. Optuna's own
    comparison is reflexive for every choice type it accepts (None, bool, int, float with NaN equal to
    NaN, str), so this changes no result, only skips the loop; other objects compare as before. Installed
    once per process (idempotent, harmless if two threads race to install it)."""
    from optuna.distributions import CategoricalDistribution

    eq = CategoricalDistribution.__eq__
    if getattr(eq, "_tuner_identity_first", False):
        return

    def __eq__(self: Any, other: Any) -> bool:  # noqa: N807  (the dunder it replaces)
        return True if self is other else eq(self, other)

    __eq__._tuner_identity_first = True  # type: ignore[attr-defined]
    CategoricalDistribution.__eq__ = __eq__  # type: ignore[method-assign,assignment]


def _search(
    space: SearchSpace,
    objective: Callable[[Config], float],
    strat: Strategy,
    study: optuna.Study,
    trials: list[Trial],
    budget: int,
    time_budget_s: float | None,
    t_start: float,
    recorder: Callable[[Trial], None] | None,
    callback: Callable[[Trial, TuneResult | None], None] | None,
) -> tuple[str, float]:
    """Ask, measure, tell until the budget, the time budget (counted from `t_start`, when `optimize` was
    entered) or the space runs out; appends to `trials`. Returns (why it stopped, strategy time in seconds: everything but the objective and the recorder)."""
    import optuna

    from .storage import LeaseLost, operation

    _categorical_equality_by_identity()
    dists = space.to_optuna()
    strategy_time = 0.0
    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    resumed = len(trials)  # finished in an earlier call (`_resume`): the call's first trial is still to run
    while len(trials) < budget:
        # the setup (the strategy's pool and model, the study) counts, but the call's first trial runs
        if (
            len(trials) > resumed
            and time_budget_s is not None
            and time.perf_counter() - t_start >= time_budget_s
        ):
            return "time_budget", strategy_time
        if strat.pool.exhausted():
            return "space_exhausted", strategy_time
        t0 = time.perf_counter()
        asked = None
        proposed = False  # a new proposal of the strategy, not a trial that was waiting in the study
        with operation(f"asking study {study.study_name!r} for trial {len(trials)}"):
            while waiting > 0 and asked is None:
                waiting -= 1
                asked = _take_enqueued(study, strat, space, dists)
            if asked is None:
                asked, proposed = _ask(study, strat, space, dists), True
        strategy_time += time.perf_counter() - t0
        if asked is None:
            return "space_exhausted", strategy_time
        if (
            proposed
            and len(trials) > resumed
            and time_budget_s is not None
            and time.perf_counter() - t_start >= time_budget_s
        ):
            # the proposal itself took the search past its time (a model refit, a first import): it is
            # not measured, as no trial starts after the time budget; the call's first trial always runs
            _abandon(study, asked, "not measured: the time budget ran out while it was proposed")
            return "time_budget", strategy_time

        t1 = time.perf_counter()
        given = space.as_given(asked.config)  # from_configs: each config with its user's own values
        value, status, error = _run_objective(objective, given)
        dur = time.perf_counter() - t1

        trial = Trial(len(trials), given, value, status, dur, error)
        # The measurement first, then Optuna: a worker that stops between the two (a crash, a
        # StoreTimeout) leaves a RUNNING trial whose measurement is stored, which the next run tells from
        # it (`_resume`; the study runner before it starts a task). The other order would leave a counted
        # trial without its measurement, which nothing can rebuild.
        if recorder is not None:
            try:
                recorder(trial)
            except LeaseLost:
                _abandon(study, asked, "abandoned (its worker lost the lease)")
                raise
        t0 = time.perf_counter()
        try:
            with operation(f"storing trial {asked.trial.number} of study {study.study_name!r}"):
                _tell(study, asked, value, status, error, dists)
        except optuna.exceptions.UpdateFinishedTrialError as exc:
            raise RuntimeError(
                f"trial {asked.trial.number} of study {study.study_name!r} was finished by another process "
                "or thread: the study is being run by two optimize calls at once (one call per study; a "
                f"fleet of workers: tuner study run). {len(trials)} trials of this call are stored."
            ) from exc
        trials.append(trial)
        strat.tell(asked.config, value)
        strategy_time += time.perf_counter() - t0
        if callback is not None:
            callback(trial, None)
    return "budget", strategy_time
