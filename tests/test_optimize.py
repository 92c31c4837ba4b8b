"""Contract tests of `tuner.optimize` (docs/api.md), run for every registered strategy."""

from __future__ import annotations

import math
from typing import Any

import pytest
from tuner.search_spaces import Categorical, Constraint, IntRange, PowerOfTwo, SearchSpace

import tuner
from tuner.strategies import STRATEGIES


def grid_space() -> SearchSpace:
    return SearchSpace.from_configs(
        [{"a": a, "b": b, "c": c} for a in range(8) for b in (1, 2, 4, 8) for c in "xy"]
    )


def constrained_space() -> SearchSpace:
    return SearchSpace(
        [PowerOfTwo("m", 1, 64), PowerOfTwo("n", 1, 64), IntRange("s", 1, 4)],
        [Constraint("m*n <= 256", lambda c: c["m"] * c["n"] <= 256, uses=("m", "n"))],
    )


def bowl(cfg: dict) -> float:
    return (cfg["a"] - 5) ** 2 + abs(math.log2(cfg["b"]) - 2) + (0.5 if cfg["c"] == "x" else 0.0) + 1.0


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return request.param


def test_budget_respected_no_duplicates(strategy: str) -> None:
    calls: list[tuple] = []

    def obj(cfg: dict) -> float:
        calls.append(tuple(sorted(cfg.items())))
        return bowl(cfg)

    res = tuner.optimize(grid_space(), obj, budget=25, seed=1, strategy=strategy)
    assert len(calls) == 25 == res.evaluations
    assert len(set(calls)) == 25
    assert res.best_value == min(bowl(dict(c)) for c in calls)
    assert res.best_config is not None and bowl(res.best_config) == res.best_value
    assert [t.number for t in res.trials] == list(range(25))


def test_only_valid_configs_on_constrained_space(strategy: str) -> None:
    space = constrained_space()
    seen = []

    def obj(cfg: dict) -> float:
        assert space.contains(cfg), space.violations(cfg)
        seen.append(tuple(cfg.values()))
        return cfg["m"] / cfg["n"] + cfg["s"]

    tuner.optimize(space, obj, budget=40, seed=0, strategy=strategy)
    assert len(seen) == len(set(seen)) == 40


def test_space_smaller_than_budget_stops(strategy: str) -> None:
    sp = SearchSpace.from_configs([{"a": i} for i in range(6)])
    res = tuner.optimize(sp, lambda c: c["a"], budget=50, strategy=strategy)
    assert res.evaluations == 6 and res.stopped_because == "space_exhausted"
    assert res.best_config == {"a": 0}


@pytest.mark.parametrize("bad", ["raise", "nan", "inf", "none"])
def test_failures_tolerated(strategy: str, bad: str) -> None:
    def obj(cfg: dict) -> float:
        if cfg["a"] % 2 == 0:
            if bad == "raise":
                raise RuntimeError("boom")
            return {"nan": math.nan, "inf": math.inf, "none": None}[bad]  # type: ignore[return-value]
        return bowl(cfg)

    res = tuner.optimize(grid_space(), obj, budget=30, seed=3, strategy=strategy)
    assert res.evaluations == 30
    failed = [t for t in res.trials if t.value is None]
    assert failed and all(t.status == "failed" and t.error for t in failed)
    assert all(t.config["a"] % 2 == 0 for t in failed)
    assert res.best_config is not None and res.best_config["a"] % 2 == 1


def test_all_failed(strategy: str) -> None:
    res = tuner.optimize(grid_space(), lambda c: math.nan, budget=5, strategy=strategy)
    assert res.best_config is None and res.best_value == math.inf and res.evaluations == 5


def test_deterministic_per_seed(strategy: str) -> None:
    def run(seed: int) -> list[tuple]:
        res = tuner.optimize(grid_space(), bowl, budget=20, seed=seed, strategy=strategy)
        return [tuple(t.config.values()) for t in res.trials]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_prior_accepted(strategy: str) -> None:
    prior = [
        [
            ({"a": a, "b": b, "c": "y"}, float(bowl({"a": a, "b": b, "c": "y"})))
            for a in range(8)
            for b in (1, 2)
        ],
        [({"a": 100, "b": 3, "c": "z", "extra": True}, 1.0), ({"a": 1, "b": 1, "c": "x"}, None)],
    ]
    res = tuner.optimize(grid_space(), bowl, budget=15, seed=0, strategy=strategy, prior=prior)
    assert res.evaluations == 15


@pytest.mark.parametrize(
    "prior, match",
    [("x", "list of tasks"), ([[1]], "pair"), ([[("a", 1.0)]], "dict"), ([[({"a": 1}, "fast")]], "number")],
)
def test_prior_validated(prior: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tuner.optimize(grid_space(), bowl, budget=3, prior=prior)  # type: ignore[arg-type]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="budget"):
        tuner.optimize(grid_space(), bowl, budget=0)
    with pytest.raises(ValueError, match="unknown strategy"):
        tuner.optimize(grid_space(), bowl, budget=3, strategy="nope")
    with pytest.raises(TypeError):
        tuner.optimize({"a": [1]}, bowl, budget=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", [None, 3, ["auto"], b"auto"], ids=["None", "int", "list", "bytes"])
def test_a_strategy_of_the_wrong_type_is_refused_up_front(strategy: Any) -> None:
    """`tune_kernel(strategy=None)` raised AttributeError ("'NoneType' object has no attribute 'name'")
    after building the kernel's space, and `autotune(strategy=None)` / `tuner.kernel(..., strategy=None)`
    decorated without a word and failed inside the first call's tuning. Each now raises TypeError naming
    the strategies, before anything is built or run (None is no default: the default is "auto")."""
    from tuner.tune import tune_kernel

    space = grid_space()
    calls: list[dict] = []
    with pytest.raises(TypeError, match=r"strategy must be a strategy's name, one of \['auto'"):
        tune_kernel("no such kernel", None, backend="triton", budget=2, strategy=strategy)
    with pytest.raises(TypeError, match=r"strategy must be a strategy's name, one of \['auto'"):
        tuner.optimize(space, lambda c: calls.append(c) or 1.0, budget=3, strategy=strategy)
    with pytest.raises(TypeError, match=r"strategy must be a strategy's name, one of \['auto'"):
        tuner.autotune(space, key=["n"], budget=2, strategy=strategy)(lambda n, a, b, c: calls.append(n))
    with pytest.raises(TypeError, match=r"strategy must be a strategy's name, one of \['auto'"):
        tuner.kernel("softmax", strategy=strategy)
    assert calls == []


def test_autotune_refuses_a_strategy_instance_and_an_unknown_name_when_decorating() -> None:
    """An instance serves one optimize call: autotune tuned the first key with it and failed on the
    second ("already heard 2 results"); an unknown name failed inside the first call's tuning."""
    from tuner.strategies import RandomStrategy

    space = grid_space()
    with pytest.raises(
        TypeError, match="got a RandomStrategy instance: an instance serves one optimize call"
    ):
        tuner.autotune(space, key=["n"], budget=2, strategy=RandomStrategy(space))(lambda n, a, b, c: n)
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        tuner.autotune(space, key=["n"], budget=2, strategy="nope")(lambda n, a, b, c: n)


def test_time_budget() -> None:
    import time

    def slow(cfg: dict) -> float:
        time.sleep(0.05)
        return bowl(cfg)

    res = tuner.optimize(grid_space(), slow, budget=60, time_budget_s=0.3, strategy="random")
    assert 1 <= res.evaluations < 60 and res.stopped_because == "time_budget"


def test_time_budget_counts_the_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time budget runs from the call, not from the end of the strategy's and the study's setup (an
    `auto` pool and model on a large space take a good part of a second): a setup longer than the budget
    leaves time for the call's first trial only. The margins are wide (setup 1.5 s, budget 0.75 s, fast
    trials): the old clock started after the setup and ran every trial of the budget."""
    import time

    import tuner._optimize as opt

    make = opt._make_strategy

    def slow_setup(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.5)
        return make(*args, **kwargs)

    monkeypatch.setattr(opt, "_make_strategy", slow_setup)
    res = tuner.optimize(grid_space(), bowl, budget=20, time_budget_s=0.75, strategy="random")
    assert (res.evaluations, res.stopped_because) == (1, "time_budget")


def test_time_budget_counts_the_setup_of_a_resumed_study_too(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that resumes a study (its trials finished in an earlier call) still runs its own first trial
    when its setup took longer than the time budget: the trials it resumed are not the call's. Was: the
    resumed trials counted as the call's first, and the call measured nothing. The margins are wide
    (setup 1.5 s, budget 0.75 s, fast trials)."""
    import time

    import tuner._optimize as opt

    url = f"sqlite:///{tmp_path / 's.db'}"
    calls: list[dict] = []

    def obj(cfg: dict) -> float:
        calls.append(cfg)
        return bowl(cfg)

    first = tuner.optimize(grid_space(), obj, budget=3, strategy="random", storage=url, study_name="s")
    assert first.evaluations == len(calls) == 3
    make = opt._make_strategy

    def slow_setup(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.5)
        return make(*args, **kwargs)

    monkeypatch.setattr(opt, "_make_strategy", slow_setup)
    calls.clear()
    res = tuner.optimize(
        grid_space(), obj, budget=10, strategy="random", storage=url, study_name="s", time_budget_s=0.75
    )
    assert (len(calls), res.evaluations, res.stopped_because) == (1, 4, "time_budget")


def test_time_budget_spent_by_a_slow_proposal() -> None:
    """A proposal that takes the search past its time budget (a model refit, a first import of xgboost)
    is not measured: no trial starts after the time budget (the call's first trial always runs)."""
    import time

    from tuner.strategies import RandomStrategy

    class SlowAfterFirst(RandomStrategy):
        def propose(self):  # type: ignore[no-untyped-def]
            if self.history:
                time.sleep(0.5)
            return super().propose()

    started: list[float] = []

    def obj(cfg: dict) -> float:
        started.append(time.perf_counter())
        return bowl(cfg)

    t0 = time.perf_counter()
    res = tuner.optimize(
        grid_space(), obj, budget=10, time_budget_s=0.2, strategy=SlowAfterFirst(grid_space())
    )
    assert res.stopped_because == "time_budget"
    assert len(started) == res.evaluations == 1, [round(t - t0, 2) for t in started]


def test_storage_records_and_resumes(tmp_path) -> None:
    from tuner.store import ResultStore, TaskContext

    url = f"sqlite:///{tmp_path / 'r.db'}"
    task = TaskContext(kernel="bowl", problem={"n": 8}, device="cpu")
    calls: list[tuple] = []

    def obj(cfg: dict) -> float:
        calls.append(tuple(cfg.values()))
        return bowl(cfg)

    r1 = tuner.optimize(
        grid_space(), obj, budget=10, seed=0, strategy="tpe", storage=url, study_name="s1", task=task
    )
    store = ResultStore(url)
    rows = store.measurements(kernel="bowl")
    assert len(rows) == 10 and {r.task_id for r in rows} == {task.task_id}
    assert rows[0].problem == {"n": 8} and rows[0].space_fingerprint == grid_space().fingerprint()
    # The same study again with a larger budget: the 10 finished trials are kept, not re-measured.
    r2 = tuner.optimize(
        grid_space(), obj, budget=15, seed=0, strategy="tpe", storage=url, study_name="s1", task=task
    )
    assert r2.evaluations == 15 and len(calls) == 15 and len(set(calls)) == 15
    assert [t.config for t in r2.trials[:10]] == [t.config for t in r1.trials]
    import optuna

    study = optuna.load_study(study_name="s1", storage=url)
    measured = [t for t in study.trials if not t.user_attrs.get("tuner_skip")]
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in measured) == 15
    # projected TPE proposals are kept as tuner_skip trials that name the config measured instead
    for t in study.trials:
        if t.user_attrs.get("tuner_skip"):
            assert "tuner_projected_to" in t.user_attrs or t.state == optuna.trial.TrialState.FAIL


def test_sampler_proposals_projected_and_recorded(tmp_path) -> None:
    """A strategy that lets its Optuna sampler propose (here TPE over the raw values, which proposes invalid
    and repeated configs on this constrained space): only new, valid configs are measured, and every
    replaced proposal is kept as a tuner_skip trial that names the config measured instead."""
    import optuna

    from tuner.strategies import Strategy

    class RawTPE(Strategy):
        name = "raw_tpe"

        def optuna_sampler(self) -> optuna.samplers.BaseSampler:
            return optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=5)

        def propose(self) -> None:
            return None

    space = constrained_space()
    seen: list[tuple] = []

    def obj(cfg: dict) -> float:
        assert space.contains(cfg), space.violations(cfg)
        seen.append(tuple(cfg.values()))
        return cfg["m"] / cfg["n"] + cfg["s"]

    url = f"sqlite:///{tmp_path / 'p.db'}"
    res = tuner.optimize(
        space, obj, budget=40, seed=0, strategy=RawTPE(space, seed=0), storage=url, study_name="p"
    )
    assert len(seen) == len(set(seen)) == 40 == res.evaluations
    study = optuna.load_study(study_name="p", storage=url)
    skipped = [t for t in study.trials if t.user_attrs.get("tuner_skip")]
    assert skipped, (
        "TPE over raw values on a constrained space should have proposed invalid or repeated configs"
    )
    for t in skipped:
        assert t.state == optuna.trial.TrialState.COMPLETE and "tuner_projected_to" in t.user_attrs


def test_tpe_sees_ordered_values_as_ordinals() -> None:
    """The TPE strategy gives Optuna the index of an ordered numeric value, and maps it back."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from tuner.strategies import TPEStrategy

    space = SearchSpace.from_configs(
        [{"bs": b, "w": w, "k": k} for b in (16, 32, 64, 128) for w in (1, 2, 4) for k in ("a", "b")]
    )
    s = TPEStrategy(space, seed=0)
    assert s._dists["bs"] == IntDistribution(0, 3) and s._dists["w"] == IntDistribution(0, 2)
    assert isinstance(s._dists["k"], CategoricalDistribution)
    assert s._config({"bs": 2, "w": 0, "k": "b"}) == {"bs": 64, "w": 1, "k": "b"}
    assert s._params({"bs": 128, "w": 4, "k": "a"}) == {"bs": 3, "w": 2, "k": "a"}


def test_one_recorder_per_trial(tmp_path) -> None:
    """With storage, each trial is recorded once: by the store by default, or only by the caller's recorder
    (as tune_kernel does with the full measurement); the Optuna study lives in the store either way."""
    from tuner.store import ResultStore, TaskContext

    url = f"sqlite:///{tmp_path / 'rec.db'}"
    task = TaskContext(kernel="bowl", problem={"n": 1}, device="cpu")
    got: list[tuner.Trial] = []
    res = tuner.optimize(
        grid_space(), bowl, budget=6, storage=url, study_name="own", task=task, recorder=got.append
    )
    assert [t.number for t in got] == [0, 1, 2, 3, 4, 5] and got == list(res.trials)
    assert ResultStore(url).measurements(kernel="bowl") == []
    tuner.optimize(grid_space(), bowl, budget=4, storage=url, study_name="default", task=task)
    assert len(ResultStore(url).measurements(kernel="bowl")) == 4
    import optuna

    assert len(optuna.load_study(study_name="own", storage=url).trials) >= 6


def test_default_study_name_is_per_task_strategy_and_seed(tmp_path) -> None:
    """With storage and no study_name, another problem (task), strategy or seed gets its own study: it
    used to resume the first run's study and return that problem's winner without one call."""
    from tuner.store import TaskContext

    url = f"sqlite:///{tmp_path / 'd.db'}"
    space = SearchSpace([PowerOfTwo("B", 16, 256), PowerOfTwo("w", 1, 8)])

    def run(n: int, strategy: str = "random", seed: int = 0) -> tuple[int, tuner.TuneResult]:
        calls: list[dict] = []

        def obj(cfg: dict) -> float:
            calls.append(cfg)
            return abs(cfg["B"] - n / 16) + cfg["w"]

        task = TaskContext(kernel="mm", problem={"n": n}, device="cpu")
        res = tuner.optimize(space, obj, budget=10, seed=seed, strategy=strategy, storage=url, task=task)
        return len(calls), res

    assert run(1024)[0] == 10
    calls, res = run(4096)  # another problem size: its own search, not n=1024's trials
    assert calls == 10 and res.best_config == {"B": 256, "w": 1}
    assert run(1024, strategy="tpe")[0] == 10 and run(1024, seed=1)[0] == 10
    calls, res = run(1024)  # the same task, strategy and seed: resumes, nothing measured again
    assert calls == 0 and res.evaluations == 10
    assert res.info["study_name"] == tuner._optimize.default_study_name(
        space, "random", 0, TaskContext(kernel="mm", problem={"n": 1024}, device="cpu")
    )


def test_a_strategy_of_ones_own_is_called_by_its_class_name(tmp_path) -> None:
    """docs/api.md: a Strategy subclass that sets no `name` is named by its class in errors, in
    `TuneResult.strategy` and in the default study name. Each used to be "base": errors named no strategy,
    and a second strategy of one's own resumed the first one's stored study instead of searching."""
    from tuner.strategies import RandomStrategy, Strategy

    space = grid_space()

    class Ascending(Strategy):
        def propose(self) -> dict:
            return next(c for c in self.space.enumerate() if not self.pool.is_seen(c))

    class Descending(Strategy):
        def propose(self) -> dict:
            return next(c for c in reversed(self.space.enumerate()) if not self.pool.is_seen(c))

    calls: list[dict] = []

    def obj(cfg: dict) -> float:
        calls.append(cfg)
        return bowl(cfg)

    url = f"sqlite:///{tmp_path / 'd.db'}"
    first = tuner.optimize(space, obj, budget=3, strategy=Ascending(space), storage=url)
    second = tuner.optimize(space, obj, budget=3, strategy=Descending(space), storage=url)
    assert (first.strategy, second.strategy) == ("Ascending", "Descending")
    assert len(calls) == 6 and calls[3:] == space.enumerate()[:-4:-1]

    class Rogue(Strategy):
        def propose(self) -> dict:
            return {"a": 99, "b": 1, "c": "x"}

    with pytest.raises(tuner.ConfigError, match="strategy 'Rogue' proposed a config the space rejects"):
        tuner.optimize(space, bowl, budget=3, strategy=Rogue(space))

    class Tweaked(RandomStrategy):  # another strategy than the one it extends
        pass

    assert (Tweaked.name, RandomStrategy.name) == ("Tweaked", "random")


def test_prior_with_numpy_values_is_the_prior_with_python_values() -> None:
    """A prior read with numpy (np.int64 block sizes) warm-starts the model like the same prior in Python
    ints; the model's features of numpy ints used to be NaN."""
    import numpy as np

    space = grid_space()
    task = [(c, bowl(c) * 1.5) for c in space.enumerate()[::2]]
    as_numpy = [
        ({k: np.int64(v) if isinstance(v, int) else np.str_(v) for k, v in c.items()}, v) for c, v in task
    ]

    def run(prior: list) -> list[dict]:
        return [t.config for t in tuner.optimize(space, bowl, budget=12, prior=prior).trials]

    assert run([as_numpy]) == run([task])


def test_objective_values_that_are_not_plain_floats() -> None:
    """numpy scalars count as numbers; a value float() cannot take (an int past float's range, a
    3-element array) fails that trial with its repr, instead of ending the run with OverflowError."""
    import numpy as np

    def obj(cfg: dict) -> object:
        if cfg["a"] == 0:
            return 10**400
        if cfg["a"] == 1:
            return np.arange(3.0)
        return np.float32(bowl(cfg)) if cfg["a"] % 2 else np.int64(round(bowl(cfg) * 100))

    res = tuner.optimize(grid_space(), obj, budget=64, strategy="random")  # type: ignore[arg-type]
    assert res.evaluations == 64
    failed = [t for t in res.trials if t.value is None]
    assert {t.config["a"] for t in failed} == {0, 1} and len(failed) == 16
    assert all(
        "not a real number" in (t.error or "") or "range of a float" in (t.error or "") for t in failed
    )
    assert all(type(t.value) is float for t in res.trials if t.value is not None)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"budget": 2.0}, ValueError, "budget must be a positive int"),
        ({"seed": -1}, ValueError, "seed must be a non-negative int"),
        ({"seed": 1.5}, ValueError, "seed must be a non-negative int"),
        ({"seed": 2**32}, ValueError, r"seed must be a non-negative int below 2\*\*32, got 4294967296"),
        ({"time_budget_s": float("nan")}, ValueError, "time_budget_s"),  # NaN would mean no limit
        ({"time_budget_s": "5"}, ValueError, "time_budget_s"),
        ({"strategy": None}, TypeError, "or a Strategy instance; got None"),
    ],
)
def test_arguments_refused_up_front(kwargs: dict, err: type, match: str) -> None:
    args = {"budget": 3, **kwargs}
    with pytest.raises(err, match=match):
        tuner.optimize(grid_space(), bowl, **args)


def test_numpy_budget_and_seed_are_ints() -> None:
    import numpy as np

    res = tuner.optimize(grid_space(), bowl, budget=np.int64(4), seed=np.int64(2))  # type: ignore[arg-type]
    assert res.evaluations == 4 and type(res.seed) is int and res.seed == 2


def test_strategy_instances_that_cannot_serve_the_call_are_refused() -> None:
    from tuner.strategies import ModelStrategy, RandomStrategy, Strategy

    space = grid_space()
    with pytest.raises(TypeError, match=r"pass RandomStrategy\(space, seed=...\)"):
        tuner.optimize(space, bowl, budget=3, strategy=RandomStrategy)  # type: ignore[arg-type]

    class NoInit(Strategy):
        name = "no_init"

        def __init__(self, space: SearchSpace) -> None:  # forgot super().__init__
            self.space = space

        def propose(self) -> None:
            return None

    with pytest.raises(TypeError, match=r"super\(\).__init__"):
        tuner.optimize(space, bowl, budget=3, strategy=NoInit(space))
    with pytest.raises(ValueError, match="another space"):
        tuner.optimize(space, bowl, budget=3, strategy=RandomStrategy(constrained_space()))
    used = ModelStrategy(space, seed=0)
    tuner.optimize(space, bowl, budget=3, strategy=used)
    with pytest.raises(ValueError, match="new instance for each optimize call"):
        tuner.optimize(space, bowl, budget=3, strategy=used)  # it would skip run 1's configs silently
    prior = [[({"a": 5, "b": 4, "c": "x"}, 1.0)]]
    with pytest.raises(ValueError, match="prior= is not used with a strategy instance"):
        tuner.optimize(space, bowl, budget=3, prior=prior, strategy=ModelStrategy(space))
    # a strategy that declares it reads no prior ignores one, as by name (the runtime passes the store's)
    assert tuner.optimize(space, bowl, budget=3, prior=prior, strategy=RandomStrategy(space)).evaluations == 3
    # the same prior given to both is fine (benchmarks/trace_search.py does it)
    res = tuner.optimize(space, bowl, budget=3, prior=prior, strategy=ModelStrategy(space, prior=prior))
    assert res.evaluations == 3
    with pytest.raises(ValueError, match="seed=3 differs"):
        tuner.optimize(space, bowl, budget=3, seed=3, strategy=ModelStrategy(space, seed=1))
    res = tuner.optimize(space, bowl, budget=3, strategy=ModelStrategy(space, seed=4))
    assert res.seed == 4  # the seed that drove the search

    class Rogue(Strategy):
        name = "rogue"

        def propose(self) -> dict:
            return {"a": 99, "b": 1, "c": "x"}

    with pytest.raises(tuner.ConfigError, match="strategy 'rogue' proposed a config the space rejects"):
        tuner.optimize(space, bowl, budget=3, strategy=Rogue(space))


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        ("ModelStrategyConfig", {"patience": 2.5}, "patience=2.5 is not an int"),
        ("ModelStrategyConfig", {"kappa": float("nan")}, "kappa=nan is not finite"),
        ("ModelStrategyConfig", {"epsilon": float("nan")}, "epsilon=nan is not finite"),
        ("ModelStrategyConfig", {"portfolio_cap": float("inf")}, "portfolio_cap=inf is not finite"),
        ("ModelStrategyConfig", {"crossover": "no"}, "crossover='no' is not a bool"),  # "no" was True
        ("TPEConfig", {"multivariate": "yes"}, "multivariate='yes' is not a bool"),
        ("TPEConfig", {"n_startup_trials": 2.5}, "n_startup_trials=2.5 is not an int"),
        ("XGBGreedyConfig", {"refit_every": 1.5}, "refit_every=1.5 is not an int"),
    ],
)
def test_strategy_settings_of_the_wrong_type_are_refused(cls: str, kwargs: dict, match: str) -> None:
    import tuner.strategies as strategies

    with pytest.raises(ValueError, match=match):
        getattr(strategies, cls)(**kwargs)


def test_strategy_settings_take_numpy_and_int_numbers() -> None:
    import numpy as np

    from tuner.strategies import ModelStrategyConfig

    cfg = ModelStrategyConfig(patience=np.int64(5), kappa=1, epsilon=np.float64(0.1))
    assert cfg.patience == 5 and cfg.kappa == 1


def test_every_argument_of_optimize_is_documented() -> None:
    """help(tuner.optimize) and docs/api.md describe every parameter of the signature."""
    import inspect
    from pathlib import Path

    api = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    entry = api[api.index("`tuner.optimize(") : api.index("`tuner.autotune(")]
    doc = tuner.optimize.__doc__ or ""
    for name in inspect.signature(tuner.optimize).parameters:
        assert f"`{name}" in entry or f"{name}," in entry.splitlines()[0], f"docs/api.md: {name}"
        assert f"`{name}" in doc, f"docstring: {name}"


@pytest.mark.parametrize("strategy", ["auto", "tpe"])
def test_trials_enqueued_in_a_stored_study_are_measured_first_and_stored_against_their_params(
    tmp_path, strategy: str
) -> None:
    """Optuna's `enqueue_trial` idiom (or a proposal an interrupted run left waiting): those configs are
    measured first, and every value is stored with the config it was measured for. A waiting trial used
    to be handed out in place of the next proposal, shifting every stored value onto the previous
    proposal's parameters, which a resumed run then read back as its results."""
    import optuna

    url = f"sqlite:///{tmp_path / 'q.db'}"
    space = SearchSpace([PowerOfTwo("B", 16, 256), PowerOfTwo("w", 1, 8)])

    def f(cfg: dict) -> float:
        return cfg["B"] + cfg["w"]

    study = optuna.create_study(study_name="mm", storage=url, direction="minimize")
    study.enqueue_trial({"B": 32, "w": 2})
    study.enqueue_trial({"B": 48, "w": 2})  # not in the space: skipped, not measured
    study.enqueue_trial({"B": 32, "w": 2})  # a duplicate: skipped
    calls: list[dict] = []
    res = tuner.optimize(
        space,
        lambda c: calls.append(dict(c)) or f(c),
        budget=6,
        storage=url,
        study_name="mm",
        strategy=strategy,
    )
    assert calls[0] == {"B": 32, "w": 2} and len(calls) == 6 and len({tuple(c.values()) for c in calls}) == 6
    assert [t.config for t in res.trials] == calls
    measured = [
        t
        for t in optuna.load_study(study_name="mm", storage=url).trials
        if not t.user_attrs.get("tuner_skip")
    ]
    assert len(measured) == 6 and all(t.value == f(t.params) for t in measured)
    resumed = tuner.optimize(space, f, budget=6, storage=url, study_name="mm", strategy=strategy)
    assert [(t.config, t.value) for t in resumed.trials] == [(c, f(c)) for c in calls]


@pytest.mark.parametrize("strategy", ["auto", "tpe"])
def test_optuna_verbosity_of_the_caller_is_left_as_it_was(strategy: str) -> None:
    """optimize keeps Optuna quiet while it runs, but an Optuna user's own studies log as before after it
    (it used to set Optuna's verbosity to WARNING for the rest of the process)."""
    import optuna

    before = optuna.logging.get_verbosity()
    try:
        optuna.logging.set_verbosity(optuna.logging.INFO)
        tuner.optimize(grid_space(), bowl, budget=3, strategy=strategy)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO

        def interrupted(cfg: dict) -> float:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            tuner.optimize(grid_space(), interrupted, budget=3, strategy=strategy)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna.logging.set_verbosity(before)


def test_building_a_tpe_strategy_leaves_optunas_verbosity_as_it_was() -> None:
    import optuna

    from tuner.strategies import TPEStrategy

    before = optuna.logging.get_verbosity()
    try:
        optuna.logging.set_verbosity(optuna.logging.INFO)
        TPEStrategy(grid_space(), seed=0)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna.logging.set_verbosity(before)


def test_a_tpe_strategy_built_while_another_optimize_starts_does_not_leak_its_quiet(monkeypatch) -> None:
    """The TPE strategy and `optimize` quiet Optuna through one shared override: the strategy used to
    save and put back the verbosity on its own, so an `optimize` that started (in another thread) while
    the strategy built its study saved the strategy's WARNING, and put it back for good when it ended."""
    import optuna

    from tuner._scoped import optuna_quiet
    from tuner.strategies import TPEStrategy

    real = optuna.create_study
    other = optuna_quiet()  # another thread's optimize, starting while the strategy builds its study

    def create_study(*a, **kw):
        other.__enter__()
        return real(*a, **kw)

    monkeypatch.setattr(optuna, "create_study", create_study)
    optuna.logging.set_verbosity(optuna.logging.INFO)
    TPEStrategy(grid_space(), seed=0)
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING  # the other optimize is still running
    other.__exit__(None, None, None)
    assert optuna.logging.get_verbosity() == optuna.logging.INFO


# Two tests in this order: the first changes Optuna's verbosity and does not put it back (as
# tests/test_store_timeouts.py does), the second sees it put back (conftest's `_optuna_verbosity_restored`).
_VERBOSITY_BEFORE: dict[str, int] = {}


def test_a_test_may_change_optunas_verbosity() -> None:
    import optuna

    _VERBOSITY_BEFORE["v"] = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def test_optunas_verbosity_changed_by_a_test_is_put_back_for_the_next() -> None:
    import optuna

    if "v" not in _VERBOSITY_BEFORE:
        pytest.skip("runs after test_a_test_may_change_optunas_verbosity, in the same process")
    assert optuna.logging.get_verbosity() == _VERBOSITY_BEFORE["v"]


def test_a_study_enqueued_into_by_someone_else_meanwhile_fails_loudly(tmp_path) -> None:
    """Two optimize calls on one study (or another worker enqueueing into it while it runs) would hand one
    call's trial to the other, storing values against the wrong parameters: the call stops with an error
    that says so, and what is stored stays right."""
    import optuna

    url = f"sqlite:///{tmp_path / 'c.db'}"
    space = SearchSpace([PowerOfTwo("B", 16, 256), PowerOfTwo("w", 1, 8)])

    def f(cfg: dict) -> float:
        if len(calls) == 2:  # another worker enqueues into the study meanwhile
            optuna.load_study(study_name="shared", storage=url).enqueue_trial({"B": 256, "w": 8})
        calls.append(cfg)
        return cfg["B"] + cfg["w"]

    calls: list[dict] = []
    with pytest.raises(RuntimeError, match="two optimize calls at once"):
        tuner.optimize(space, f, budget=10, storage=url, study_name="shared", strategy="random")
    done = optuna.load_study(study_name="shared", storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,)
    )
    assert done and all(t.value == t.params["B"] + t.params["w"] for t in done)


def test_optuna_does_not_compare_the_same_categorical_distribution_choice_by_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each trial's categorical distributions are the study's own objects: Optuna's equality checks at
    every `ask` and stored parameter answer at once instead of comparing every choice (a parameter with
    3000 float values cost some 20 ms per trial). The proposals are unchanged (same seed, same trials)."""
    import optuna.distributions as od

    space = SearchSpace([Categorical("x", [i / 7 for i in range(500)]), Categorical("s", ["a", "b", "c"])])
    calls = [0]
    choice_equal = od._categorical_choice_equal

    def counted(a: Any, b: Any) -> bool:
        calls[0] += 1
        return choice_equal(a, b)

    monkeypatch.setattr(od, "_categorical_choice_equal", counted)
    res = tuner.optimize(space, lambda c: abs(c["x"] - 3.0), budget=8, seed=3, strategy="random")
    assert res.evaluations == 8 and calls[0] < 500, calls[0]
