"""Settings of the strategies: one frozen dataclass per configurable strategy, passed at construction.

    from tuner.strategies import ModelStrategy, ModelStrategyConfig

    strategy = ModelStrategy(space, seed=0, config=ModelStrategyConfig(patience=30))
    tuner.optimize(space, objective, budget=100, strategy=strategy)

The defaults are the settings that `strategy="auto"` uses (measured on the replay tables,
docs/benchmarks.md). Each field says what it controls; `__post_init__` rejects values out of range with a
message that names them. Nothing here imports a heavy dependency.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, TypeVar

__all__ = ["ModelStrategyConfig", "TPEConfig", "XGBGreedyConfig", "settings"]

C = TypeVar("C")


def settings(config: C | None, cls: type[C]) -> C:
    """`config`, or the defaults of `cls` when it is None; TypeError for another type."""
    if config is None:
        return cls()
    if not isinstance(config, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    return config


def _check(cfg: Any, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming every field of `cfg` that is out of range or of the wrong type (an `int`
    field takes no 2.5, a `bool` field no "no", a number is finite)."""
    bad = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.type == "bool" and not isinstance(v, bool):
            bad.append(f"{f.name}={v!r} is not a bool")
        elif f.type == "int" and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            bad.append(f"{f.name}={v!r} is not an int")
        elif f.name in positive + non_negative and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            bad.append(f"{f.name}={v!r} is not a number")
        elif f.name in positive + non_negative and not math.isfinite(v):
            bad.append(f"{f.name}={v!r} is not finite")
        elif f.name in positive and v <= 0:
            bad.append(f"{f.name}={v!r} must be > 0")
        elif f.name in non_negative and v < 0:
            bad.append(f"{f.name}={v!r} must be >= 0")
    if bad:
        raise ValueError(f"{type(cfg).__name__}: " + "; ".join(bad))


@dataclass(frozen=True)
class ModelStrategyConfig:
    """Settings of the model-guided strategy (`"auto"`, `ModelStrategy`); the module docstring of
    `tuner.strategies._model` explains each component. Counts are numbers of results (measurements)
    unless they say proposals."""

    # ---- the model ----------------------------------------------------------------------------------
    n_init: int = 10
    """Without a prior: space-filling draws before the first model-guided proposal (more while every
    result so far failed)."""
    n_models: int = 3
    """Members of the bootstrap XGBoost ensemble (their spread is the model's uncertainty)."""
    n_estimators: int = 40
    """Boosting rounds of each ensemble member."""
    max_depth: int = 4
    """Tree depth of each ensemble member."""
    max_scored: int = 5000
    """At most this many unseen configs are scored per refit (half of them the previous refit's best)."""
    target_clip: float | None = 0.5
    """Own targets above this quantile of the measured values are clipped to it (the model's job is to
    rank the good configs; the slow half's spread would dominate the fit). None: no clipping."""

    stagnant_clip: float | str | None = None
    """Once the search is stagnant: the quantile at which own targets are clipped; None (the default):
    not clipped; "same": `target_clip`'s. While a basin improves, the model ranks the good configs in it;
    once it is exhausted, its job is to find another, and the slow configs' differences (which parameters
    make a config 2x and which 100x slower) are the map it would need. Measured on the replay tables,
    cold, 20 seeds: reached 1.05x 0.94 against 0.92 with "same" (0.5), and 0.91-0.95 with each other
    constant varied around it (docs/benchmarks.md)."""

    # ---- acquisition --------------------------------------------------------------------------------
    kappa: float = 0.5
    """Lower confidence bound: mean - kappa * spread (doubled once the prior is dropped or stagnant)."""
    prior_spread_weight: float = 0.5
    """Weight of the prior tasks' disagreement, added to the spread in the confidence bound."""
    epsilon: float = 0.05
    """Share of proposals drawn uniformly at random from the unseen configs."""
    local_every: int = 3
    """Every n-th proposal is a local step: the best-ranked unseen neighbour of the incumbent."""
    explore_every: int = 4
    """Every n-th proposal is an exploration slot (with a prior: the own-data model's pick; cold: a
    crossover child; stagnant: a novel config)."""

    # ---- cold exploration: recombination (Kernel Tuner's GA idea) -----------------------------------
    crossover: bool = True
    """Cold exploration slot: the model's pick among children of the best measured configs. False leaves
    the slot to the model's ranking."""
    n_elite: int = 8
    """Crossover parents are drawn from this many best measured configs."""
    n_children: int = 48
    """Children generated (uniform crossover + mutation) per crossover pick."""
    mutation: float = 0.1
    """Per-parameter chance that a child's value is drawn at random."""

    allocation: str = "progress"
    """How proposals are shared between the model's ranking, local steps, the exploration slot and the
    partition portfolio: "fixed", the every-n-th turns of `local_every`, `explore_every`,
    `partition_every_early` and `partition_every`; "progress", each proposal drawn by each component's
    record of improvements in this run (Thompson sampling). Under "progress" those fields keep these uses
    only: `local_every` paces the stagnant local steps' rotation over the basins, `partition_every` the
    partition portfolio's turns after a restart (with a prior), and `partition_every_early` /
    `partition_every` set to 0 keep the portfolio out of the draw before / once the search is stagnant."""

    allocation_prior: float = 1.0
    """`allocation="progress"`: the pseudo-count c of each component's Beta(c + wins, c + results - wins);
    1 is the uniform prior (not tuned; 0.5 and 2 measured in docs/benchmarks.md)."""

    # ---- stagnation ---------------------------------------------------------------------------------
    patience: int = 20
    """Results without a better incumbent after which the search counts as stagnant."""
    stagnation_tol: float = 0.02
    """With a prior, a new best counts as an improvement (for `patience`) only if this much better than
    the incumbent at the last improvement that counted (without a prior: 0.1%)."""
    novelty_quantile: float = 0.9
    """Stagnant: exploration picks among the unseen configs at least this quantile of distance away
    (Hamming) from every measured config."""
    n_basins: int = 6
    """Stagnant: local steps rotate over this many distinct good configs (basins)."""
    partition_every: int = 2
    """Stagnant: every n-th proposal goes to the partition portfolio (a sustained search inside another
    combination of the two-valued parameters than the incumbent's); 0 turns it off. With
    `allocation="progress"` its value sets only the turns after a restart, and 0 keeps the portfolio
    out of the draw once stagnant (see `allocation`)."""
    partition_every_early: int = 6
    """Before the search is stagnant: every n-th proposal goes to the partition portfolio; 0: none.
    With `allocation="progress"` only 0 matters: the portfolio stays out of the draw before stagnation."""
    partition_streak: int = 6
    """Partition portfolio: proposals a partition gets before its progress is judged (it keeps the
    focus while its own best improves)."""
    max_partitions: int = 32
    """Partition portfolio: at most this many partitions (two-valued parameters beyond are ignored)."""

    # ---- transfer from a prior ----------------------------------------------------------------------
    prior_min_corr: float = 0.15
    """A prior whose rank correlation with this task's measurements is below this is dropped."""
    n_portfolio: int = 6
    """At most this many first proposals cover the prior tasks' own best configs (greedy portfolio);
    how many is chosen per prior by leave-one-prior-task-out validation."""
    portfolio_horizon: int = 10
    """Portfolio validation scores the held-out task's regret curve over this many picks."""
    portfolio_cap: float = 1.0
    """Log-ratio at which a prior task's regret is clipped in the portfolio objective."""
    portfolio_tol: float = 0.02
    """Portfolio validation takes the longest portfolio within this share of the best area."""
    anchor_every: int = 3
    """Every n-th proposal (from `anchor_start` results on) changes one parameter of an anchor (a
    measured portfolio pick) to the last model's favourite value; 0 turns the sweep off."""
    anchor_start: int = 10
    """Results before the anchor sweep starts."""
    n_anchors: int = 2
    """The sweep goes around this many of the best measured portfolio picks."""
    restart_cold: bool = True
    """With a prior, once stagnant: hand over to a fresh search without the prior (TuRBO's restarts)."""
    restart_seed: int = 0
    """Extra seed offset of the fresh search after a restart. Its seed is the run's seed plus the number
    of results at the restart (a rule from the run's own history) plus this; vary it to check that a
    figure does not hinge on one random stream (docs/benchmarks.md)."""
    restart_keep_every: int = 3
    """After the restart, every n-th proposal still comes from the prior-guided search; 0: none do."""

    def __post_init__(self) -> None:
        _check(
            self,
            positive=(
                "n_init",
                "n_models",
                "n_estimators",
                "max_depth",
                "max_scored",
                "local_every",
                "explore_every",
                "n_elite",
                "n_children",
                "patience",
                "n_basins",
                "partition_streak",
                "max_partitions",
                "portfolio_horizon",
                "portfolio_cap",
                "n_anchors",
                "allocation_prior",
            ),
            non_negative=(
                "kappa",
                "prior_spread_weight",
                "epsilon",
                "mutation",
                "stagnation_tol",
                "novelty_quantile",
                "n_portfolio",
                "portfolio_tol",
                "anchor_every",
                "anchor_start",
                "partition_every",
                "partition_every_early",
                "restart_keep_every",
            ),
        )
        for name in ("epsilon", "mutation", "novelty_quantile"):
            if getattr(self, name) > 1:
                raise ValueError(f"ModelStrategyConfig: {name}={getattr(self, name)!r} must be <= 1")
        for name in ("target_clip", "stagnant_clip"):
            v = getattr(self, name)
            if name == "stagnant_clip" and v == "same":
                continue
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
                also = ', "same"' if name == "stagnant_clip" else ""
                raise ValueError(f"ModelStrategyConfig: {name}={v!r} must be in (0, 1]{also} or None")
        if self.allocation not in ("fixed", "progress"):
            raise ValueError(
                f"ModelStrategyConfig: allocation={self.allocation!r} must be 'fixed' or 'progress'"
            )
        if not -1 <= self.prior_min_corr <= 1:
            raise ValueError(
                f"ModelStrategyConfig: prior_min_corr={self.prior_min_corr!r} must be in [-1, 1]"
            )
        if self.n_elite < 2:
            raise ValueError(f"ModelStrategyConfig: n_elite={self.n_elite!r} must be >= 2 (two parents)")


@dataclass(frozen=True)
class TPEConfig:
    """Settings of the `"tpe"` strategy (Optuna's TPESampler over ordinal indices)."""

    n_startup_trials: int = 10
    """Random proposals before TPE's Parzen estimators take over."""
    multivariate: bool = False
    """Optuna's multivariate TPE (measured worse on the replay tables than univariate)."""

    def __post_init__(self) -> None:
        _check(self, non_negative=("n_startup_trials",))


@dataclass(frozen=True)
class XGBGreedyConfig:
    """Settings of the `"xgb_greedy"` transfer baseline."""

    n_init: int = 10
    """Without a prior: random draws before the first model."""
    refit_every: int = 5
    """The model is refit every this many results; its best predictions are measured in between."""
    max_prior_rows: int = 6000
    """At most this many prior rows (split evenly over the prior tasks) enter the training set."""

    def __post_init__(self) -> None:
        _check(self, positive=("n_init", "refit_every", "max_prior_rows"))
