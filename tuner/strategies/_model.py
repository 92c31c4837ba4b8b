"""The model-guided strategy (the default, `auto`): an XGBoost ensemble ranks the unseen configs.

Its settings are the fields of `ModelStrategyConfig` (`_config.py`, given as `config=` at construction);
the names in backticks below are those fields.

Each round:
1. Candidates: for an enumerable space every unseen valid config (the pool), scored at once (cheap for
   finite spaces); otherwise random draws plus the neighbours of the incumbents. Failures only: while
   every result so far failed, a model of them predicts one value everywhere (its ranking, ties in pool
   order, swept the space in file order), so the space-filling draws (maximin distance to the measured,
   failed configs) go on until one succeeds; with a prior, its ranking goes on while it is used, and the
   picks that would rank by the task's own model (the exploration slot, the stagnant phase) draw so.
2. Model: a bootstrap ensemble of small XGBoost regressors on the task's per-task normalised log time
   (failures count as the worst plus a margin), clipped at the median of the measured: the model's job is
   to rank the good configs, and the slow half's spread (on some GPUs 2x to 100x) would otherwise take most
   of the fit (measured: reached 1.05x 0.86 -> 0.90 cold, with item 3's recombination). Once the search
   is stagnant (item 5) the targets are not clipped (`stagnant_clip`): the basin it ranked is exhausted,
   and the slow configs' differences are the map to another one. With a `prior`
   the model is warm-started: each prior task
   gives a prediction for every candidate (its measured value where the config was measured there, else
   a model fitted on that task), normalised the same way; their weighted mean is the prior mean. The
   ensemble then learns the new task's residual over a linear calibration of the prior mean
   (`base_margin`), so before the first measurement the prior ranks the space, and as results arrive the
   task's own data takes over.
3. Acquisition: lower confidence bound (mean - kappa * ensemble spread) over the candidates; the best are
   measured, plus local steps around the incumbent (the optimum region is often local) and a small
   share of random draws. Cold, the exploration slot recombines good configs (Kernel Tuner's GA idea):
   children of two of the best measured configs (uniform crossover, a little mutation), the one the model
   ranks best; it finds optima that need two parameters changed at once.
4. Robust transfer: prior tasks are weighted by the rank correlation of their predictions with the
   task's measurements (the RGPE idea); when no prior task agrees (a GPU unlike the others), the prior is
   dropped and the strategy explores with its own model.
   Portfolio start (Feurer et al. 2015): with a prior, the first few proposals (at most `n_portfolio`)
   greedily cover the prior tasks' own best configs (each pick lowers most the weighted sum of every prior
   task's best clipped regret among the picks); how many is chosen per prior set by leave-one-prior-task-
   out validation (whether the tasks' own bests transfer between them better than their consensus does).
   Anchor sweep: from `anchor_start` results on, every `anchor_every`-th proposal changes one parameter
   of one of the two best portfolio picks (the anchors), a parameter not yet varied around that anchor,
   to the value the last model ranks best: a new GPU often wants a prior task's best with one switch
   flipped that the prior ranks low because it hurts on the other GPUs (gemm/RTX_3090 wants RTX_2080_Ti's
   best with SA = 1; a median of 70 evaluations to 1.05x without the sweep, 18.5 with it).
5. Stagnation: once `patience` results pass without a better incumbent, the current basin counts as
   exhausted (with a prior, a new best counts only if `stagnation_tol`, 2%, better than the incumbent at
   the last improvement that counted: creeping 0.5% gains in a wrong basin, as on convolution/A100, do
   not put the restart off). With a prior, the search then restarts cold (TuRBO's restarts): a fresh model-guided
   search without the prior, learning from the results measured after the restart only, makes two of
   every three later proposals; the third still comes from the prior-guided search (where the prior is
   right and the optimum is a few steps away, as on gemm, it keeps finding it). A prior can be right
   overall and wrong about the best region (the other GPUs rank convolution/A100's optimum about
   1000th, while their mean ranks its whole space at Spearman 0.5); then the measurements sit where
   the prior pointed, and any model fitted on them, with or without the prior, keeps ranking
   that region best. Without a prior (so also inside the restarted search), the exploration slot
   measures the best-ranked config among the unseen ones farthest (Hamming distance) from every
   measured config (a boosted ensemble has no spread where it has no data, so its confidence bound
   alone never leaves the measured region), and the local steps rotate over several distinct good
   configs (basins) instead of the best one. An improvement ends the stagnant phase. The restarted
   search's seed is the run's seed plus the number of results at the restart (plus `restart_seed`, 0,
   which a benchmark varies to check that no figure hinges on one random stream).
   Partition portfolio (for needles): the two-valued parameters split the space into partitions (code
   paths: shared memory or not, a transposed layout or not; at most `max_partitions`). A needle's
   partition can hold the best configs while its configs near the incumbent's other values are slow, so
   neither the model, trained where the measurements are, nor local steps from the incumbent cross over
   (convolution/A100: the one config within 1.05x lies in the partition whose configs climb best, while
   the search settles on a 1.47x plateau in another). Every `partition_every_early`-th proposal (6th), and
   once stagnant every `partition_every`-th (2nd), goes to a sustained search inside one partition other
   than the incumbent's, alternating the last model's best config in it and a local step, inside it, from
   its own best measured configs. The partition measured least goes first; it keeps the focus after
   `partition_streak` proposals only while its own best improves fast enough to reach the incumbent's
   value at that rate within as many streaks as it has had (a rule from the run's own progress), else the
   next partition takes over. A partition whose best becomes the incumbent ends the stagnant phase; once
   the incumbent's one-parameter neighbourhood is measured, its local steps change two parameters.
6. Allocation (`allocation`): with "fixed", the components above take fixed turns (every
   `local_every`-th proposal a local step, every `explore_every`-th the exploration slot, every
   `partition_every_early`-th / `partition_every`-th the partition portfolio, the rest the model's
   ranking). With "progress" (the default), each proposal after the space-filling draws goes to one
   component drawn by Thompson sampling from its record in this run, Beta(c + wins, c + results - wins)
   with c = `allocation_prior` (1: a uniform prior), a win being a result that beats the incumbent by more than 0.1% (adaptive operator selection; GP-Hedge
   allocates acquisition functions the same way): on a table where local steps keep improving they get
   most of the budget, once nothing improves the mix evens out, so the partition portfolio and the
   exploration slot get their share without a schedule tied to `patience`. The portfolio start, the
   anchor sweep and the shares after a restart (the partition portfolio every `partition_every`-th
   proposal, the prior-guided search every `restart_keep_every`-th) keep their turns. Under both,
   `partition_every_early = 0` / `partition_every = 0` keep the partition portfolio out before / once
   the search is stagnant.
7. Overhead: the model is refit after each result early on, and every few results later, with the best
   few configs of one refit queued.

Ideas from AutoTVM's XGBoost tuner (rank the whole space with a boosted model, epsilon-greedy batches),
Helion's LFBO pattern search (local moves around the best), RGPE / TST-R (rank-weighted prior tasks) and
Kernel Tuner's GA (uniform crossover and mutation of good configs) — no code copied.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tuner.search_spaces import Config, SearchSpace

from ._base import PriorTask, Strategy
from ._config import ModelStrategyConfig, settings

# Random draws (before constraints) per proposal on a space too large to enumerate, for its candidates.
LARGE_CANDIDATE_DRAWS = 50_000
# Other values of one parameter that a large-space proposal's neighbours of an incumbent take: all of a
# domain with at most this many others, else this many random ones (and, ordered, a geometric ladder of
# positions around the value).
LARGE_NEIGHBOR_VALUES = 1024

log = logging.getLogger(__name__)

__all__ = ["ModelStrategy", "prior_predictions"]


_TARGET_LIMIT = 1e6  # spreads from the median, where the values of an objective with values <= 0 are cut


def _normalise(vals: np.ndarray) -> np.ndarray:
    """Per-task model targets: normalised log time (`normalise_targets`, NaN = failed). An objective with
    a value <= 0 (a negated throughput, a score, a time minus a baseline) has no log: its values are
    centred on their median and scaled by their median absolute deviation instead, failures the worst
    plus the same margin (`normalise_targets` would count every value <= 0 as a failure)."""
    from tuner.cost_models import normalise_targets

    v = np.asarray(vals, dtype=np.float64)
    ok = np.isfinite(v)
    if not (ok.any() and (v[ok] <= 0).any()):
        return normalise_targets(v)
    from tuner.cost_models.models import FAIL_MARGIN

    # (good - med) / scale does not change when every value is divided by the largest: so divided, values
    # near a float's ends (1e308 and -1e308) neither overflow to inf nor make the std NaN
    good = v[ok] / (float(np.abs(v[ok]).max()) or 1.0)  # (all zero: as they are)
    med = float(np.median(good))
    scale = float(np.median(np.abs(good - med))) or float(np.std(good)) or 1.0
    t = np.empty(len(v))
    # XGBoost takes float32 labels: a value a billion spreads away (a 1e300 among small ones) is as bad
    # as one a million away, and would otherwise be "a value too large" there
    t[ok] = np.clip((good - med) / scale, -_TARGET_LIMIT, _TARGET_LIMIT)
    t[~ok] = float(t[ok].max()) + FAIL_MARGIN
    return t


def _improves(value: float, ref: float, tol: float) -> bool:
    """`value` beats `ref` by more than the fraction `tol` of it (lower is better; any sign)."""
    if ref > 0:
        return value < ref * (1.0 - tol)
    return value < ref - tol * abs(ref)


def _log_gap(a: float, b: float) -> float:
    """How far `a` lies above `b` (lower is better): log(a / b) for positive values, the plain difference
    where one is <= 0 (an objective of any sign has no ratios)."""
    if a > 0 and b > 0:
        return math.log(a / b)
    return a - b


def _usable_prior_tasks(
    names: Sequence[str], prior: Sequence[PriorTask]
) -> Iterator[tuple[int, list[Mapping[str, Any]], np.ndarray, np.ndarray]]:
    """(task index, configs, raw values, normalised log times) of each prior task that shares at least
    half the space's parameters and holds a successful result."""
    for ti, task in enumerate(prior):
        if not task:
            continue
        configs = [c for c, _ in task]
        # the names of all its configs, not its first one's: a task whose first row is sparse (a config
        # that sets fewer parameters) was dropped whole
        if len(set().union(*configs) & set(names)) < max(1, len(names) // 2):
            log.info("prior task %d shares too few parameters with the space; ignored", ti)
            continue
        vals = np.array([np.nan if v is None else v for _, v in task], dtype=np.float64)
        if np.isfinite(vals).any():
            yield ti, configs, vals, _normalise(vals)


def _prior_task_model(
    schema: Any, configs: list[Mapping[str, Any]], t: np.ndarray, max_rows: int, seed: int
) -> Any:
    """A model of one prior task's normalised log times (on at most `max_rows` of its results: the best
    third, and a random share of the rest)."""
    from tuner.cost_models import XGBRegressorModel

    X = schema.transform(configs)
    order = np.argsort(t, kind="stable")
    if len(order) > max_rows:
        top = order[: max_rows // 3]
        rest = np.random.default_rng(seed).choice(order[max_rows // 3 :], max_rows - len(top), replace=False)
        order = np.concatenate([top, rest])
    return XGBRegressorModel(n_estimators=60, max_depth=6, normalise=False, seed=seed).fit(X[order], t[order])


def prior_predictions(
    space: SearchSpace,
    keys_index: Mapping[tuple, int],
    F: np.ndarray,
    prior: Sequence[PriorTask],
    schema: Any,
    *,
    max_rows: int = 3000,
    seed: int = 0,
) -> tuple[np.ndarray, list[int]]:
    """One row per usable prior task: its normalised log time for each pool config (measured value where
    the task holds the config, else a model fitted on the task). Returns (matrix, used task indices)."""
    names = space.names
    plain = not any(isinstance(v, bool) for p in space.params for v in p.values)
    if plain:  # no booleans: a plain tuple identifies a config (much faster than the tagged key)
        plain_index = {tuple(v for v, _ in h): i for h, i in keys_index.items()}
    rows, used = [], []
    for ti, configs, _, t in _usable_prior_tasks(names, prior):
        pred = np.full(F.shape[0], np.nan)
        for c, tv in zip(configs, t, strict=True):
            try:
                k = tuple(c[n] for n in names)
            except KeyError:
                continue
            i = plain_index.get(k) if plain else keys_index.get(space._hkey(k))
            if i is not None:
                pred[i] = tv
        missing = np.isnan(pred)
        if missing.any():
            pred[missing] = _prior_task_model(schema, configs, t, max_rows, seed).predict(F[missing])
        rows.append(pred)
        used.append(ti)
    return (np.vstack(rows) if rows else np.zeros((0, F.shape[0]))), used


# `_unseen_neighbours`: how many (pool config, parameter) cells of the key matrix one scan compares in the
# time of one index lookup of a candidate neighbour. Measured on the 2-core machine
# (benchmarks/neighbour_lookup.py): a cell 6-15 ns, a lookup 0.2-2.2 us (ratios 15-300 over a
# 2,000,000-config bowl, a 3000-config wide table, gemm and convolution). It picks the cheaper of two ways to the same list, so it changes no proposal.
_SCAN_PER_LOOKUP = 50


class ModelStrategy(Strategy):
    """Model-guided search (see the module docstring). `config` holds its settings
    (`ModelStrategyConfig`; the defaults are `"auto"`'s).

    Each proposal's origin is recorded: `last_source` names the component that chose the last proposed
    config and `sources` lists them in order, one per `propose` call: "default" and "suggested" (a cold
    start's first configs: the space's declared default and its author's suggestions), "space_filling",
    "portfolio",
    "anchor", "partition", "random" (the `epsilon` share), "model", "local", "explore", "large_space"
    (spaces too large to enumerate), and after a restart "restart:" plus the restarted search's own
    component. `benchmarks/trace_search.py` prints them beside each new incumbent."""

    name = "model"
    config_class = ModelStrategyConfig

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        prior: Sequence[PriorTask] | None = None,
        config: ModelStrategyConfig | None = None,
    ) -> None:
        super().__init__(space, seed=seed, prior=prior)
        self.config = settings(config, ModelStrategyConfig)
        self._init_state()

    def _init_state(self) -> None:
        self._ready = False
        self._cold: ModelStrategy | None = None  # the fresh cold search after a restart
        self.restarted_at: int | None = None  # number of results when the search restarted cold
        self._n_after_restart = 0
        self._queue: list[int] = []
        self._obs_idx: list[int] = []
        self._obs_val: list[float] = []  # raw value, nan = failed
        self._since_fit = 0
        self._n_proposed = 0
        self._starts: list[tuple[Config, str]] | None = None  # the cold start's default and suggestions
        self._n_portfolio = 0  # portfolio picks made
        self._portfolio_picks: list[int] = []  # their pool indices
        self.prior_state = "none"
        self._large_prior: list[Any] = []  # per prior task, a model (spaces too large to enumerate)
        self._large_portfolio: list[Config] = []  # the prior tasks' best valid configs, not yet proposed
        self._best = math.inf  # the incumbent's value at the last improvement that counted
        self._last_improve = 0  # number of results at the last improvement of the incumbent
        self._last_mu: tuple[np.ndarray, np.ndarray]
        self._part: np.ndarray | None = None  # partition id per pool config (see `_partition_ids`)
        self._in_restart = False  # the restarted search inside another: the outer one runs the portfolio
        self._focus: int | None = None  # the partition the portfolio searches now
        self._focus_n = 0  # proposals it got since its progress was last judged
        self._focus_ref = math.inf  # its best value when its progress was last judged
        self._focus_tried: set[int] = set()  # partitions that had a streak without progress
        self._focus_streaks = 0  # streaks the focus partition has had in a row
        self._inc = math.inf  # the best value measured
        self._arm_of: dict[int, str] = {}  # pool index -> component that proposed it
        self._arm_n: dict[str, int] = {}  # results per component (allocation="progress")
        self._arm_w: dict[str, float] = {}  # their wins
        self._large_arm_of: dict[tuple, str] = {}  # large spaces: config -> component that proposed it
        self._large_seen_n = 0  # results credited so far (large spaces)
        self.sources: list[str] = []  # the component behind each proposal, in order (see `propose`)

    # ---- setup (lazily, inside the first propose, so that its time counts as strategy time) ---------
    def _setup(self) -> None:
        from tuner.cost_models import schema_for_space

        self._ready = True
        self.schema = schema_for_space(self.space)
        if not self.pool.enumerable:
            self.F = np.zeros((0, len(self.schema.names)))
            self.P = np.zeros((0, 0))
            if self.prior:
                self._setup_large_prior()
            return
        self.F = self.schema.transform_keys(self.space.names, self.pool.keys)
        self.P = np.zeros((0, self.F.shape[0]))
        if self.prior:
            self.P, used = prior_predictions(
                self.space, self.pool.index, self.F, self.prior, self.schema, seed=self.seed
            )
            self.prior_used = used
            if len(self.P):
                self.prior_state = "trusted"
                self._w = np.full(len(self.P), 1.0 / len(self.P))
                self.prior_mean = self._w @ self.P
                self._regret = self.P - self.P.min(axis=1, keepdims=True)  # log ratio to each task's best
                self.portfolio_size = self._validate_portfolio()
        for cfg, val in self.history:  # results told before the first proposal (a resumed study)
            self.observe(cfg, val)

    # ---- pruning report --------------------------------------------------------------------------
    def pruning_report(self, keep: float | None = None, target_recall: float = 0.9) -> Any:
        """Before tuning: the share of the space the prior model would keep and its estimated recall of
        the best 1%, estimated leave-one-prior-task-out (see cost_models.pruning)."""
        from tuner.cost_models import pruning_report

        if not self._ready:
            self._setup()
        n = self.pool.size or 0
        validation = []
        if len(self.P) >= 2:
            for i in range(len(self.P)):
                others = np.delete(self.P, i, axis=0).mean(axis=0)
                validation.append((self.P[i], others))
        return pruning_report(max(1, n), validation, keep=keep, target_recall=target_recall)

    # ---- observations --------------------------------------------------------------------------------
    def observe(self, config: Config, value: float | None) -> None:
        if not self._ready or not self.pool.enumerable:
            return
        i = self.pool.index.get(self.pool.hkey(config))
        if i is None:
            return
        inc_before = self._inc
        self._obs_idx.append(i)
        self._obs_val.append(np.nan if value is None else float(value))
        if value is not None and math.isfinite(value):
            self._inc = min(self._inc, float(value))
        if self._arm_of:
            self._credit(i, value, inc_before)
        self._since_fit += 1
        tol = self.config.stagnation_tol if len(self.P) else 1e-3
        if value is not None and math.isfinite(value) and _improves(value, self._best, tol):
            self._best = float(value)  # the best at the last improvement (the stagnation reference)
            self._last_improve = len(self._obs_idx)
        if self._cold is not None:  # every result after the restart is the cold search's own
            self._cold.observe(config, value)
        elif (
            self.config.restart_cold
            and len(self.P)
            and len(self._obs_idx) >= self.config.n_init
            and self.stagnant
        ):
            self._restart()

    def _restart(self) -> None:
        """Hand over to a fresh cold search (TuRBO-style restart). The prior-guided search is stagnant:
        its measurements sit where the prior pointed, and a model fitted on them (with or without the
        prior) keeps ranking that region best, so the region where this task's optimum lies may never be
        tried (measured: convolution/A100, whose optimum the other GPUs rank about 1000th; 3 of 10 runs
        -> 6 of 10, docs/search-notes.md). The new search shares the pool (measured configs are never
        proposed again) and the random state, and learns only from the results measured after the
        restart (two of every three proposals are its own, see `restart_keep_every`); it is itself a
        ModelStrategy without a prior. Built with __new__ + `_init_state`, not __init__, so that the pool
        (enumerating the space, the costly part) and the feature matrix are shared, not rebuilt."""
        cold = type(self).__new__(type(self))
        cold.space, cold.seed, cold.prior, cold.history = (
            self.space,
            self.seed + len(self._obs_idx) + self.config.restart_seed,
            None,
            [],
        )
        cold.config = self.config
        cold.rng, cold.pool = self.rng, self.pool
        cold._init_state()
        cold._starts = []  # the restart searches anew, not the author's starting configs
        cold._ready = True
        cold._in_restart = True
        cold.schema, cold.F, cold.P = self.schema, self.F, np.zeros((0, self.F.shape[0]))
        self._cold = cold
        self.restarted_at = len(self._obs_idx)
        log.info(
            "auto: no better config in the last %d results with the prior; restarting as a cold search "
            "after %d results",
            self.config.patience,
            self.restarted_at,
        )

    @property
    def _succeeded(self) -> bool:
        """Some result so far did not fail (the models have something to rank by)."""
        return math.isfinite(self._inc)

    @property
    def stagnant(self) -> bool:
        """No better incumbent for `patience` results: the current basin is exhausted, so explore."""
        return len(self._obs_idx) - self._last_improve >= self.config.patience

    # ---- proposals ---------------------------------------------------------------------------------
    @property
    def last_source(self) -> str:
        """The component that chose the last proposed config ("" before the first proposal)."""
        return self.sources[-1] if self.sources else ""

    def propose(self) -> Config | None:
        cfg, source = self._propose()
        self.sources.append(source)
        return cfg

    def _propose(self) -> tuple[Config | None, str]:
        """The next config and the component that chose it (see `sources`)."""
        if not self._ready:
            self._setup()
        start = self._next_start()
        if start is not None:
            self._n_proposed += 1
            return start
        if not self.pool.enumerable:
            return self._propose_large(), "large_space"
        self._n_proposed += 1
        n = len(self._obs_idx)
        if self._cold is not None:
            self._n_after_restart += 1
            cfg = self._partition_slot(n)  # one portfolio over all results, not one per search
            if cfg is not None:
                return cfg, "partition"
            if not self.config.restart_keep_every or self._n_after_restart % self.config.restart_keep_every:
                cfg = self._cold.propose()
                return cfg, "restart:" + self._cold.last_source
        has_prior = len(self.P) > 0
        if not has_prior and (n < self.config.n_init or not self._succeeded):
            # every result so far failed: a model fitted on them predicts one value for every config, and
            # its ranking (ties broken by pool order) swept the space in file order; spread out instead
            return self._space_filling(), "space_filling"
        if has_prior and self._n_portfolio < self.portfolio_size:
            cfg = self._portfolio_pick()
            if cfg is not None:
                return cfg, "portfolio"
        if (
            has_prior
            and self.config.anchor_every
            and n >= self.config.anchor_start
            and self._n_proposed % self.config.anchor_every == 2 % self.config.anchor_every
        ):  # off the local steps' phase (0)
            cfg = self._anchor_pick()
            if cfg is not None:
                return cfg, "anchor"
        progress = self.config.allocation == "progress" and n >= self.config.n_init
        if self._cold is None and not progress:
            cfg = self._partition_slot(n)
            if cfg is not None:
                return cfg, "partition"
        if self.rng.random() < self.config.epsilon:
            return self.pool.random_unseen(), "random"
        if progress:
            return self._allocated_pick(has_prior)
        if n > 0 and self._n_proposed % self.config.local_every == 0:
            cfg = self._local_step()
            if cfg is not None:
                return cfg, "local"
        if n >= self.config.n_init and self._n_proposed % self.config.explore_every == 1:
            # exploration slot: with a prior, the task's own-data model alone (a prior that ranks the
            # near-best configs low must not hide them); cold, an optimistic pick of the last ensemble
            # away from the explored basins once the search is stagnant
            cfg = self._explore_pick(has_prior)
            if cfg is not None:
                return cfg, "explore"
        return self._model_pick(), "model"

    def _model_pick(self) -> Config | None:
        """The next config of the model's ranking (refit when due)."""
        n = len(self._obs_idx)
        if n and not self._succeeded and (self.prior_state != "trusted" or self.stagnant):
            return self._space_filling()  # failures only and the prior unused: the model has no ranking
        self._queue = [i for i in self._queue if self.pool.unseen_mask[i]]
        if not self._queue or self._since_fit >= self._refit_every(n):
            self._refit_and_rank()
        while self._queue:
            i = self._queue.pop(0)
            if self.pool.unseen_mask[i]:
                return self.pool.config_at(i)
        return self.pool.random_unseen()

    def _explore_pick(self, has_prior: bool) -> Config | None:
        """The exploration slot: stagnant, a novel config; with a prior, the own-data model's pick; cold,
        a crossover child (None when `crossover` is off)."""
        if self.stagnant:
            return self._novel_pick()
        if has_prior:
            return self._own_model_pick()
        return self._crossover_pick() if self.config.crossover else None

    def _allocated_pick(self, has_prior: bool) -> tuple[Config | None, str]:
        """`allocation="progress"`: the proposal goes to one of the components (the model's ranking,
        a local step, the exploration slot, the partition portfolio) drawn by Thompson sampling from
        each one's record in this run: Beta(c + wins, c + results - wins), c = `allocation_prior`, a win
        being a result that improves the incumbent. Components that have found better configs get more of
        the budget; one that stops finding them loses its share, and the least-tried gain by their
        uncertainty, so no fixed schedule decides the mix. Returns the config and the component's name."""
        arms = ["model", "local", "explore"]
        every = self._partition_every()
        if every and not self._in_restart and self._cold is None and self._partition_ids() is not None:
            arms.append("partition")  # 0 turns the portfolio off here too (before / once stagnant)
        for a in self._thompson_order(arms):
            if a == "model":
                cfg = self._model_pick()
            elif a == "local":
                cfg = self._local_step()
            elif a == "explore":
                cfg = self._explore_pick(has_prior)
            else:
                cfg = self._partition_pick()
            if cfg is not None:
                i = self.pool.index.get(self.pool.hkey(cfg))
                if i is not None:
                    self._arm_of[i] = a
                return cfg, a
        return self.pool.random_unseen(), "random"

    def _thompson_order(self, arms: list[str]) -> list[str]:
        """The components in the order of one Thompson draw each from Beta(c + wins, c + results - wins)
        of their record in this run, c = `allocation_prior` (the first that has a proposal gets it)."""
        c = self.config.allocation_prior
        draw = {
            a: self.rng.beta(c + self._arm_w.get(a, 0.0), c + self._arm_n.get(a, 0) - self._arm_w.get(a, 0.0))
            for a in arms
        }
        return sorted(arms, key=lambda a: -draw[a])

    def _credit(self, i: int, value: float | None, inc_before: float) -> None:
        """Record the result of pool config i for the component that proposed it (see _allocated_pick):
        a win when it beats the incumbent by more than 0.1%."""
        self._record(self._arm_of.pop(i, None), value, inc_before)

    def _record(self, arm: str | None, value: float | None, inc_before: float) -> None:
        """One result for component `arm` (None: none proposed it): a win when it beats the incumbent
        before it by more than 0.1%."""
        if arm is None:
            return
        self._arm_n[arm] = self._arm_n.get(arm, 0) + 1
        win = value is not None and math.isfinite(value) and _improves(value, inc_before, 1e-3)
        self._arm_w[arm] = self._arm_w.get(arm, 0.0) + float(win)

    def _greedy_portfolio(
        self, R: np.ndarray, w: np.ndarray, chosen: Sequence[int] | np.ndarray, k: int
    ) -> list[int]:
        """Up to k configs, each the one that most lowers sum_t w_t * min(cap, best regret of task t so far)."""
        R = np.minimum(R, self.config.portfolio_cap)
        ch = np.asarray(chosen, dtype=np.int64)
        cur = R[:, ch].min(axis=1) if ch.size else np.full(len(R), self.config.portfolio_cap)
        out: list[int] = []
        for _ in range(k):
            gain = w @ (cur[:, None] - np.minimum(R, cur[:, None]))
            gain[ch] = -1.0
            gain[out] = -1.0
            i = int(np.argmax(gain))
            if gain[i] <= 1e-9:
                break
            out.append(i)
            cur = np.minimum(cur, R[:, i])
        return out

    def _validate_portfolio(self) -> int:
        """The portfolio length (0..n_portfolio) that, leave one prior task out, gets the held-out task
        closest to its optimum over the first `portfolio_horizon` picks (the rest from the other tasks'
        mean ranking): whether the prior tasks' own best configs transfer between them better than their
        consensus does. Near-ties (within `portfolio_tol` of the best; and fewer than 3 tasks, where nothing
        can be validated) go to the longer."""
        T = len(self.P)
        K = self.config.n_portfolio
        if T < 3 or K <= 0:
            return K if T >= 2 else 0
        H = self.config.portfolio_horizon
        area = np.zeros(K + 1)
        for h in range(T):
            o = np.delete(np.arange(T), h)
            cons = np.argsort(self.P[o].mean(axis=0), kind="stable")[: H + K].tolist()
            pf = self._greedy_portfolio(self._regret[o], np.full(T - 1, 1.0 / (T - 1)), [], K)
            for k in range(K + 1):
                head = pf[:k]
                seq = head + [i for i in cons if i not in head]
                area[k] += np.minimum.accumulate(self._regret[h, seq[:H]]).sum()
        return int(np.flatnonzero(area <= area.min() * (1 + self.config.portfolio_tol) + 1e-12)[-1])

    def _portfolio_pick(self) -> Config | None:
        """Greedy portfolio (Feurer et al. 2015): the unseen config that most lowers the weighted sum over
        prior tasks of each task's best (clipped) regret among the configs proposed so far; None once no
        config lowers it (every task's best is covered)."""
        n = len(self._obs_idx)
        if n >= 4:
            idx, y = self._targets()
            self._prior_weights(idx, y)
        pick = self._greedy_portfolio(self._regret, self._w, np.flatnonzero(~self.pool.unseen_mask), 1)
        if not pick:
            self._n_portfolio = self.portfolio_size
            return None
        i = pick[0]
        self._n_portfolio += 1
        self._portfolio_picks.append(i)
        return self.pool.config_at(i)

    def _anchor_pick(self) -> Config | None:
        """With a prior: a one-parameter change of an anchor, a parameter not yet varied around it. The
        anchors are the portfolio's picks (the prior tasks' own best configs, see `_anchors`), the
        `n_anchors` best on this task first. The new task often wants
        a prior task's best with one parameter changed, a parameter the prior ranks low because it hurts
        on the other tasks (gemm/RTX_3090's optimum is RTX_2080_Ti's best with SA = 1 and one vector
        width changed; with SA = 1 alone it is 1.013x, while the other GPUs' bests are 1.47x and 1.61x
        there). A model fitted on the prior does not go there (measured: a median of 70 evaluations to
        1.05x); a sweep over one parameter at a time, the last model's favourite value of each, does
        (docs/search-notes.md). None once every parameter has been varied around the anchors."""
        vals = np.asarray(self._obs_val, dtype=np.float64)
        obs = np.asarray(self._obs_idx, dtype=np.int64)
        ok = np.isfinite(vals)
        if not ok.any():
            return None
        anchors = self._anchors(obs[ok], vals[ok])
        score = self._last_scores()
        keys = self.pool.keys

        def changed(i: int, a: int) -> int | None:  # the one parameter in which config i differs from a
            d = [t for t, (u, v) in enumerate(zip(keys[i], keys[a], strict=True)) if u != v]
            return d[0] if len(d) == 1 else None

        for a in anchors[: self.config.n_anchors]:
            varied = {changed(int(j), a) for j in obs} - {None}
            nbs = [i for i in self._unseen_neighbours(a) if changed(i, a) not in varied]
            if nbs:
                return self.pool.config_at(min(nbs, key=lambda k: score.get(k, math.inf)))
        return None

    def _anchors(self, obs: np.ndarray, vals: np.ndarray) -> list[int]:
        """Pool indices of the anchors, the best on this task first: the portfolio's picks, else (no
        portfolio, or a resumed study that measured them before) each prior task's best measured config.
        `obs`, `vals`: the measured configs that did not fail."""
        value = dict(zip(obs.tolist(), vals.tolist(), strict=True))
        anchors = [i for i in self._portfolio_picks if i in value]
        if not anchors:
            anchors = list(dict.fromkeys(int(obs[np.argmin(row[obs])]) for row in self.P))
        return sorted(anchors, key=lambda j: value[j])

    def _partition_every(self) -> int:
        """The partition portfolio's turn setting for the current phase: `partition_every` once stagnant,
        `partition_every_early` before (0: the portfolio is off in this phase)."""
        return self.config.partition_every if self.stagnant else self.config.partition_every_early

    def _partition_slot(self, n: int) -> Config | None:
        """The partition portfolio's pick when this proposal is its turn (`partition_every` once
        stagnant, `partition_every_early` before), else None."""
        every = self._partition_every()
        if self._in_restart or not every or n < self.config.n_init:
            return None
        if self._n_proposed % every != every - 1:
            return None
        return self._partition_pick()

    def _partition_ids(self) -> np.ndarray | None:
        """Partition id of every pool config: which values its two-valued parameters take (at most
        `max_partitions` partitions); None when the space has no such parameter. Two-valued parameters
        are switches between code paths (shared memory or not, a transposed layout or not), and the
        paths' best configs are often far apart in the other parameters."""
        if self._part is not None:
            return self._part
        keys = self.pool.keys
        ids = np.zeros(len(keys), dtype=np.int64)
        radix = 1
        for t, p in enumerate(self.space.params):
            if len(p.values) != 2:
                continue
            if radix * 2 > self.config.max_partitions:
                break
            second = p.values[1]
            ids += radix * np.fromiter((k[t] == second for k in keys), dtype=bool, count=len(keys))
            radix *= 2
        if radix == 1:
            return None
        self._part = ids
        return ids

    def _partition_pick(self) -> Config | None:
        """Stagnant: the partition portfolio, a sustained search inside one other partition than the
        incumbent's (a combination of the two-valued parameters, see `_partition_ids`). A needle's
        partition can be best overall while its configs near the incumbent's other values are slow, so
        neither the model (trained where the measurements are) nor local steps from the incumbent cross
        over; inside the partition, steps climb from the partition's own best. The focus partition keeps
        its proposals while its own best improves (by `stagnation_tol`, at least 0.1%) within
        `partition_streak` proposals, else the next one gets them, in order of the last model's best
        prediction inside each; a partition that becomes the incumbent's ends the stagnant phase."""
        part = self._partition_ids()
        if part is None or not hasattr(self, "_last_mu"):
            return None
        vals = np.asarray(self._obs_val, dtype=np.float64)
        obs = np.asarray(self._obs_idx, dtype=np.int64)
        ok = np.isfinite(vals)
        if not ok.any():
            return None
        inc = int(part[obs[ok][int(np.argmin(vals[ok]))]])

        def part_best(q: int) -> float:
            m = ok & (part[obs] == q)
            return float(vals[m].min()) if m.any() else math.inf

        tol = max(self.config.stagnation_tol, 1e-3)
        if self._focus is not None:
            cur = part_best(self._focus)
            if self._focus == inc or not self.pool.unseen_mask[part == self._focus].any():
                self._focus = None
            elif self._focus_n >= self.config.partition_streak:
                inc_val = float(vals[ok].min())
                self._focus_streaks += 1
                gain = _log_gap(self._focus_ref, cur) if math.isfinite(self._focus_ref) else math.inf
                if _improves(cur, self._focus_ref, tol) and gain * self._focus_streaks >= _log_gap(
                    cur, inc_val
                ):
                    # progress fast enough: at this streak's rate it would reach the incumbent within
                    # as many streaks as it has had; keep the focus and judge again later
                    self._focus_n, self._focus_ref = 0, cur
                else:
                    self._focus_tried.add(self._focus)
                    self._focus = None
        unseen, mu = self._last_mu
        score = np.full(len(self.pool.keys), math.inf)  # the last refit's prediction; inf: not scored
        score[unseen] = mu
        score[~self.pool.unseen_mask] = math.inf
        if self._focus is None:
            best_pred = np.full(int(part.max()) + 1, math.inf)
            np.minimum.at(best_pred, part, score)
            best_pred[inc] = math.inf
            live = [int(q) for q in np.flatnonzero(np.isfinite(best_pred))]
            if not live:
                return None
            fresh = [q for q in live if q not in self._focus_tried]
            if not fresh:  # every partition had its streak: start the rotation again
                self._focus_tried.clear()
                fresh = live
            counts = np.bincount(part[obs], minlength=len(best_pred))
            self._focus = min(fresh, key=lambda q: (counts[q], best_pred[q]))
            self._focus_n, self._focus_ref, self._focus_streaks = 0, part_best(self._focus), 0
        q = self._focus
        self._focus_n += 1
        inside = ok & (part[obs] == q)
        if inside.any() and self._focus_n % 2 == 0:  # a local step from the partition's best configs
            order = obs[inside][np.argsort(vals[inside], kind="stable")]
            for j in order[:3]:
                nbs = [k for k in self._unseen_neighbours(int(j)) if part[k] == q]
                if nbs:
                    return self.pool.config_at(min(nbs, key=lambda k: score[k]))
        in_q = np.where(part == q, score, math.inf)
        i = int(np.argmin(in_q))
        if math.isfinite(in_q[i]):
            return self.pool.config_at(i)
        cand = np.flatnonzero(self.pool.unseen_mask & (part == q))  # none scored (large spaces)
        if cand.size == 0:
            return None
        return self.pool.config_at(int(cand[int(self.rng.integers(cand.size))]))

    def _novel_pick(self) -> Config | None:
        """Stagnant: the best-ranked config among the unseen ones farthest (Hamming distance) from every
        measured config. A boosted ensemble is blind where it has no data (no split on a value never
        measured), so its spread cannot find an unexplored region; distance can."""
        if not self._succeeded:  # failures only: the last model's mu is one value, its argmin the pool order
            return self._space_filling()
        if not hasattr(self, "_last_mu"):
            return None
        unseen, mu = self._last_mu
        keep = self.pool.unseen_mask[unseen]
        unseen, mu = unseen[keep], mu[keep]
        if unseen.size == 0:
            return None
        d = self._observed_distance(unseen)
        far = d >= np.quantile(d, self.config.novelty_quantile)
        cand = np.flatnonzero(far)
        return self.pool.config_at(int(unseen[cand[int(np.argmin(mu[cand]))]]))

    def _observed_distance(self, at: np.ndarray) -> np.ndarray:
        """For the pool configs `at`, the fewest feature columns in which each differs from any measured
        config (the largest int64 before the first measurement). Kept up to date for the whole pool, each
        measured config compared with the pool once, not at every call (a wide space, 3000 configs with 300
        one-hot columns, spent tens of ms per call comparing every measured config again)."""
        X = self.pool.X
        if getattr(self, "_dist_obs", None) is None:
            self._dist_obs = np.full(len(X), np.iinfo(np.int64).max)
            self._dist_n = 0
        for j in self._obs_idx[self._dist_n :]:
            np.minimum(self._dist_obs, (X[j] != X).sum(axis=1), out=self._dist_obs)
        self._dist_n = len(self._obs_idx)
        return self._dist_obs[at]

    def _crossover_pick(self) -> Config | None:
        """Recombination of good measured configs (Kernel Tuner's GA idea): children of two parents drawn
        from the best measured configs (uniform crossover, a little mutation), the valid unseen child the
        last model ranks best."""
        vals = np.asarray(self._obs_val, dtype=np.float64)
        ok = np.flatnonzero(np.isfinite(vals))
        if ok.size < 2:
            return None
        elite = [
            self.pool.keys[self._obs_idx[int(j)]]
            for j in ok[np.argsort(vals[ok], kind="stable")][: self.config.n_elite]
        ]
        params = self.space.params
        score = None
        if hasattr(self, "_last_mu"):
            unseen, mu = self._last_mu
            score = np.zeros(len(self.pool.keys))  # unscored configs (large spaces) count as average
            score[unseen] = mu
        best, best_s = None, math.inf
        for _ in range(self.config.n_children):
            a, b = self.rng.choice(len(elite), size=2, replace=False)
            pick = self.rng.random(len(params)) < 0.5
            child = [elite[a][t] if pick[t] else elite[b][t] for t in range(len(params))]
            for t, p in enumerate(params):
                if len(p.values) > 1 and self.rng.random() < self.config.mutation:
                    child[t] = p.values[int(self.rng.integers(len(p.values)))]
            i = self.pool.index.get(self.space._hkey(tuple(child)))
            if i is None or not self.pool.unseen_mask[i]:
                continue
            sc = float(score[i]) if score is not None else float(self.rng.random())
            if sc < best_s:
                best, best_s = i, sc
        return None if best is None else self.pool.config_at(best)

    def _own_model_pick(self) -> Config | None:
        from tuner.cost_models import XGBRegressorModel

        if not self._succeeded:  # failures only: the own-data model predicts one value everywhere
            return self._space_filling()
        idx, y = self._targets()
        unseen = np.flatnonzero(self.pool.unseen_mask)
        if unseen.size == 0:
            return None
        if unseen.size > self.config.max_scored:
            unseen = np.sort(self.rng.choice(unseen, size=self.config.max_scored, replace=False))
        m = XGBRegressorModel(
            n_estimators=self.config.n_estimators,
            max_depth=self.config.max_depth,
            learning_rate=0.3,
            normalise=False,
            seed=self.seed + len(idx),
        ).fit(self.F[idx], y)
        return self.pool.config_at(int(unseen[int(np.argmin(m.predict(self.F[unseen])))]))

    @staticmethod
    def _refit_every(n: int) -> int:
        return 1 if n < 30 else 2 if n < 80 else 4

    def _next_start(self) -> tuple[Config, str] | None:
        """The cold start's next author-given config: the space's declared default, then its suggested
        configs (`SearchSpace.suggested`), each unless already measured. They stand in for space-filling
        draws. The default is what the runtime runs untuned, so a tuning of any budget ends no slower
        than it (on its own measurements); the suggestions are the kernel author's known good configs.
        Only on a cold start: not with a prior (its portfolio goes first), not on a resumed run (results
        told before the first proposal), and a space from `from_configs` has neither."""
        if self._starts is None:
            self._starts = []
            cold = not self.sources and not self.history and not (len(self.P) > 0 or self._large_prior)
            if cold:
                try:
                    if self.space.declares_default:
                        self._starts.append((self.space.default(), "default"))
                    self._starts += [(c, "suggested") for c in self.space.suggested]
                except ValueError:  # no valid config at all: the usual path says so
                    self._starts = []
        while self._starts:
            cfg, source = self._starts.pop(0)
            if not self.pool.is_seen(cfg):
                return cfg, source
        return None

    def _space_filling(self) -> Config | None:
        idx = np.flatnonzero(self.pool.unseen_mask)
        if idx.size == 0:
            return None
        cand = self.rng.choice(idx, size=min(256, idx.size), replace=False)
        if not self._obs_idx:
            return self.pool.config_at(int(cand[0]))
        seen = self.pool.X[self._obs_idx]
        d = ((self.pool.X[cand][:, None, :] - seen[None, :, :]) ** 2).sum(axis=2).min(axis=1)
        return self.pool.config_at(int(cand[int(np.argmax(d))]))

    def _targets(self, clip: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(pool indices, targets) of the measured configs: normalised log time, clipped for the model fit
        at `target_clip`, once stagnant at `stagnant_clip` (`clip=False` for rank statistics such as the
        prior tasks' agreement)."""
        idx = np.asarray(self._obs_idx, dtype=np.int64)
        y = _normalise(np.asarray(self._obs_val, dtype=np.float64))
        q = self.config.target_clip
        if self.config.stagnant_clip != "same" and self.stagnant:
            q = self.config.stagnant_clip  # type: ignore[assignment]  # a float or None after validation
        if clip and q is not None and len(y) >= 4:
            # the model's job is to rank the good configs: above the quantile, differences are shrunk
            # (slowdowns of 2x and 100x matter equally little, and would otherwise dominate the fit)
            m = np.quantile(y, q)
            y = np.minimum(y, m)
        return idx, y

    def _prior_weights(self, idx: np.ndarray, y: np.ndarray) -> None:
        """Re-weight the prior tasks by how well each ranks the measurements so far."""
        from tuner.cost_models import spearman

        ok = np.isfinite(np.asarray(self._obs_val))
        if ok.sum() < 4:
            return
        corr = np.array([spearman(y, p[idx]) for p in self.P])
        self.prior_corr = corr
        pos = np.clip(corr, 0.0, None) ** 2
        if pos.sum() <= 0:
            self._w = np.full(len(self.P), 1.0 / len(self.P))
        else:
            self._w = pos / pos.sum()
        self.prior_mean = self._w @ self.P
        agree = spearman(y, self.prior_mean[idx])
        self.prior_state = "trusted" if (agree >= self.config.prior_min_corr or ok.sum() < 8) else "dropped"

    def _refit_and_rank(self) -> None:
        from tuner.cost_models import XGBEnsemble

        self._since_fit = 0
        unseen = np.flatnonzero(self.pool.unseen_mask)
        if unseen.size == 0:
            self._queue = []
            return
        if unseen.size > self.config.max_scored:
            # the configs the last model ranked best, and a fresh random share of the rest
            keep = []
            if hasattr(self, "_last_mu"):
                prev, mu_prev = self._last_mu
                top = prev[np.argsort(mu_prev, kind="stable")[: self.config.max_scored // 2]]
                keep = top[self.pool.unseen_mask[top]].tolist()
            rest = np.setdiff1d(unseen, np.asarray(keep, dtype=np.int64), assume_unique=True)
            extra = self.rng.choice(rest, size=self.config.max_scored - len(keep), replace=False)
            unseen = np.sort(np.concatenate([np.asarray(keep, dtype=np.int64), extra]))
        idx, y = self._targets()
        _, y_raw = self._targets(clip=False)
        n = len(idx)
        use_prior = len(self.P) > 0
        if use_prior:
            if n:
                self._prior_weights(idx, y_raw)
            use_prior = self.prior_state == "trusted" and not self.stagnant
        base_all = None
        if use_prior:
            pm = self.prior_mean
            if n >= 3:
                x = pm[idx]
                a, b = np.polyfit(x, y_raw, 1) if np.ptp(x) > 0 else (0.0, float(np.mean(y_raw)))
                a = max(float(a), 0.1)
                b = float(np.mean(y_raw) - a * np.mean(x))
            else:
                a, b = 1.0, 0.0
            base_all = a * pm + b
        if n < 3 or (use_prior and n < 5):
            mu = base_all[unseen] if base_all is not None else self.rng.random(unseen.size)
            sd = np.zeros(unseen.size)
        else:
            X = self.F if base_all is None else np.hstack([self.F, base_all[:, None]])
            model = XGBEnsemble(
                n_models=self.config.n_models,
                n_estimators=self.config.n_estimators,
                max_depth=self.config.max_depth,
                normalise=False,
                seed=self.seed * 7919 + n,
            )
            bm = None if base_all is None else base_all[idx]
            model.fit(X[idx], y, base_margin=bm)
            preds = model.predict_all(X[unseen])
            if base_all is not None:
                preds = preds + base_all[unseen][None, :]
            mu, sd = preds.mean(axis=0), preds.std(axis=0)
        kappa = self.config.kappa * (2.0 if (self.prior_state == "dropped" or self.stagnant) else 1.0)
        if base_all is not None and len(self.P) > 1:
            # where the prior tasks disagree, the prior is uncertain: count their spread as uncertainty
            spread = np.sqrt(np.maximum(self._w @ (self.P[:, unseen] - self.prior_mean[unseen]) ** 2, 0.0))
            sd = sd + self.config.prior_spread_weight * a * spread
        acq = mu - kappa * sd
        q = self._refit_every(n)
        best = np.argsort(acq, kind="stable")[:q]
        self._queue = [int(unseen[i]) for i in best]
        self._last_mu = (unseen, mu)

    def _last_scores(self) -> dict[int, float]:
        """The last refit's predicted mean per scored unseen pool index ({} before the first refit)."""
        if not hasattr(self, "_last_mu"):
            return {}
        unseen, mu = self._last_mu
        return dict(zip(unseen.tolist(), mu.tolist(), strict=True))

    def _unseen_neighbours(self, i: int) -> list[int]:
        """Pool indices of the unseen configs one parameter away (Hamming) from pool config i."""
        # the pool holds every valid config, so these are the configs `space.neighbors(config, "hamming")`
        # lists, in its order (parameter by parameter, each parameter's values in domain order), found in
        # the key matrix instead of building and checking each candidate config (a parameter with 3000
        # values made that some 50 ms a call)
        # Two exact ways, the same list: a scan of the key matrix (ns per pool config and parameter) or a
        # lookup of each one-value change in the pool's index (about a microsecond per candidate); the
        # scan where it is cheaper (a small pool of many-valued parameters), the lookups where the pool is
        # large (a scan of a 2,000,000-config pool took 58 ms, its 2998 lookups 2.5 ms:
        # benchmarks/neighbour_lookup.py)
        params = self.space.params
        candidates = sum(len(p.values) - 1 for p in params)
        if len(self.pool.keys) * len(params) <= _SCAN_PER_LOOKUP * candidates:
            K = self._key_matrix()
            diff = K[i] != K
            one = np.flatnonzero((diff.sum(axis=1) == 1) & self.pool.unseen_mask)
            t = diff[one].argmax(axis=1)
            return one[np.lexsort((K[one, t], t))].tolist()
        hk = self.space._hkey(self.pool.keys[i])
        index, unseen = self.pool.index, self.pool.unseen_mask
        out: list[int] = []
        for t, p in enumerate(params):
            head, tail = hk[:t], hk[t + 1 :]
            for v in p.values:
                h = (v, type(v) is bool)
                if h == hk[t]:
                    continue
                j = index.get((*head, h, *tail))
                if j is not None and unseen[j]:
                    out.append(j)
        return out

    def _key_matrix(self) -> np.ndarray:
        """Value index of every parameter for every pool config (for exact Hamming distances)."""
        if getattr(self, "_K", None) is None:
            cols = []
            columns = list(zip(*self.pool.keys, strict=True))
            for p, column in zip(self.space.params, columns, strict=True):
                # keyed as SearchSpace._hkey keys a value (True apart from 1)
                pos = {(v, type(v) is bool): j for j, v in enumerate(p.values)}
                cols.append([pos[(v, type(v) is bool)] for v in column])
            self._K = np.asarray(cols, dtype=np.int32).T.reshape(len(self.pool.keys), len(self.space.params))
        return self._K

    def _unseen_at_distance(self, i: int, d: int) -> list[int]:
        """Pool indices of the unseen configs that differ from pool config i in exactly d parameters."""
        K = self._key_matrix()
        hit = ((K[i] != K).sum(axis=1) == d) & self.pool.unseen_mask
        return np.flatnonzero(hit).tolist()

    def _local_step(self) -> Config | None:
        """The unseen neighbour of the incumbent (or of the next best) that the last model ranks best."""
        vals = np.asarray(self._obs_val, dtype=np.float64)
        ok = np.flatnonzero(np.isfinite(vals))
        if ok.size == 0:
            return None
        score = self._last_scores()
        order = ok[np.argsort(vals[ok], kind="stable")]
        if self.stagnant:  # rotate over distinct basins: the best configs not next to a better one
            basins: list[int] = []
            for j in order:
                x = self.pool.X[self._obs_idx[int(j)]]
                if all((self.pool.X[self._obs_idx[b]] != x).sum() > 1 for b in basins):
                    basins.append(int(j))
                    if len(basins) >= self.config.n_basins:
                        break
            r = (self._n_proposed // self.config.local_every) % len(basins)
            order = np.asarray(basins[r:] + basins[:r], dtype=np.int64)
        for rank, j in enumerate(order[:3]):
            nbs = self._unseen_neighbours(self._obs_idx[int(j)])
            if not nbs and rank == 0 and self.stagnant and order[0] == ok[np.argmin(vals[ok])]:
                # the incumbent's one-parameter neighbourhood is exhausted: two parameters at once
                # (coupled parameters, a block reshaped: a runner-up can be two changes away)
                nbs = self._unseen_at_distance(self._obs_idx[int(j)], 2)
            if nbs:
                if score:
                    i = min(nbs, key=lambda k: score.get(k, math.inf))
                else:
                    i = nbs[int(self.rng.integers(len(nbs)))]
                return self.pool.config_at(i)
        return None

    def _setup_large_prior(self) -> None:
        """A prior on a space too large to enumerate: one model per usable prior task (fitted on its
        normalised log times, as `prior_predictions` does for a pool) to rank candidates, and each task's
        best configs that are valid here, interleaved, as the portfolio the first proposals take."""
        names = self.space.names
        models: list[Any] = []
        ranked: list[list[Config]] = []
        used: list[int] = []
        for ti, configs, vals, t in _usable_prior_tasks(names, self.prior or []):
            best: list[Config] = []
            for k in np.argsort(t, kind="stable")[: 4 * max(1, self.config.n_portfolio)]:
                c = configs[int(k)]
                if not np.isfinite(vals[int(k)]) or any(n not in c for n in names):
                    continue
                cfg = {n: c[n] for n in names}
                if self.space.contains(cfg):
                    best.append(cfg)
            models.append(_prior_task_model(self.schema, configs, t, 3000, self.seed))
            ranked.append(best)
            used.append(ti)
        self._large_prior = models
        self.prior_used = used
        if not models:
            return
        self.prior_state = "trusted"
        queue: list[Config] = []
        seen: set[tuple] = set()
        for r in range(max((len(b) for b in ranked), default=0)):  # each task's best, then second, ...
            for b in ranked:
                if r < len(b) and (h := self.pool.hkey(b[r])) not in seen:
                    seen.add(h)
                    queue.append(b[r])
        self._large_portfolio = queue[: self.config.n_portfolio]

    def _large_prior_mean(self, configs: Sequence[Config]) -> np.ndarray:
        """The prior tasks' mean normalised log time for each config (large spaces)."""
        X = self.schema.transform(list(configs))
        return np.mean([m.predict(X) for m in self._large_prior], axis=0)

    def _large_neighbors(self, config: Config) -> list[Config]:
        """The valid configs that change one parameter of `config`: to any other value where its domain
        has at most LARGE_NEIGHBOR_VALUES others, else to LARGE_NEIGHBOR_VALUES random others plus, in an
        ordered domain, the values 1, 2, 4, 8, ... positions away on each side. All of a domain of a
        million values made each proposal check and rank three million configs (20 s each)."""
        key = self.space.key(config)
        out: list[Config] = []
        for i, p in enumerate(self.space.params):
            n, at = len(p.values), p.index(key[i])
            if n - 1 <= LARGE_NEIGHBOR_VALUES:
                picks = [j for j in range(n) if j != at]
            else:
                others = self.rng.choice(n - 1, size=LARGE_NEIGHBOR_VALUES, replace=False)
                chosen = {int(j) + int(j >= at) for j in others}
                if p.ordered:
                    steps = [1 << k for k in range(n.bit_length())]
                    chosen |= {at + s * d for d in steps for s in (-1, 1) if 0 <= at + s * d < n}
                picks = sorted(chosen)
            for j in picks:
                k2 = key[:i] + (p.values[j],) + key[i + 1 :]
                if self.space._satisfies(k2):
                    out.append(self.space.config(k2))
        return out

    def _propose_large(self) -> Config | None:
        """Spaces too large to enumerate: model-ranked random draws and neighbours of the incumbents.
        With a prior: the prior tasks' best valid configs first (the portfolio), then candidates ranked
        by the prior mean (as the ensemble's base margin, calibrated on the task's own results) until the
        task's results disagree with the prior (rank correlation <= 0 over 5 or more), then as cold."""
        prior = bool(self._large_prior)
        while prior and self._large_portfolio:
            c = self._large_portfolio.pop(0)
            if not self.pool.is_seen(c):
                self._n_portfolio += 1
                return c
        hist = [(c, v) for c, v in self.history]
        ok = [(c, v) for c, v in hist if v is not None]
        good = np.array([v is not None and math.isfinite(v) for _, v in hist], dtype=bool)
        if prior and good.sum() >= 5:
            from tuner.cost_models import spearman

            rho = spearman(  # on ranks: the normalised values rank as the values do, of any sign
                _normalise(
                    np.array([v for (_, v), g in zip(hist, good, strict=True) if g], dtype=np.float64)
                ),
                self._large_prior_mean([c for (c, _), g in zip(hist, good, strict=True) if g]),
            )
            if not rho > 0:
                prior, self.prior_state = False, "dropped"
            else:
                self.prior_state = "trusted"
        if not prior and (len(hist) < self.config.n_init or len(ok) < 3):
            return self.pool.random_unseen()
        if not prior:
            return self._large_allocated(hist, ok)
        return self._large_model_pick(hist, ok, good, prior)

    def _large_allocated(
        self, hist: list[tuple[Config, float | None]], ok: list[tuple[Config, float]]
    ) -> Config | None:
        """Cold (or once the prior is dropped), a large space's proposal goes to the model's ranking, a
        random step from the incumbent (one parameter to another value) or a random draw, drawn by
        Thompson sampling from each one's record in this run as in `_allocated_pick`. Trees fitted on few
        results are flat around the incumbent: the model's pick alone crept along one parameter (a smooth
        quadratic over 2,001,000 configs, budget 50: 1.022 of the optimum against random search's 1.006)."""
        inc = math.inf
        for j, (c, v) in enumerate(hist):  # credit the results not yet credited
            if j >= self._large_seen_n:
                self._record(self._large_arm_of.pop(self.pool.hkey(c), None), v, inc)
            if v is not None and math.isfinite(v):
                inc = min(inc, v)
        self._large_seen_n = len(hist)
        arms = ["model", "local", "random"]
        good = np.array([v is not None and math.isfinite(v) and v > 0 for _, v in hist], dtype=bool)
        for a in self._thompson_order(arms):
            if a == "model":
                cfg = self._large_model_pick(hist, ok, good, False)
            elif a == "local":
                fin = [(c, v) for c, v in ok if math.isfinite(v)]
                best = min(fin, key=lambda cv: cv[1])[0] if fin else None
                nbs = [nb for nb in self._large_neighbors(best) if not self.pool.is_seen(nb)] if best else []
                cfg = nbs[int(self.rng.integers(len(nbs)))] if nbs else None
            else:
                cfg = self.pool.random_unseen()
            if cfg is not None:
                self._large_arm_of[self.pool.hkey(cfg)] = a
                return cfg
        return None

    def _large_model_pick(
        self,
        hist: list[tuple[Config, float | None]],
        ok: list[tuple[Config, float]],
        good: np.ndarray,
        prior: bool,
    ) -> Config | None:
        """The config that the ensemble (with a prior: plus the prior mean) ranks best by its confidence
        bound among unseen neighbours of the three best results and up to 500 random valid draws."""
        from tuner.cost_models import XGBEnsemble

        cands: list[Config] = []
        for c, _ in sorted(ok, key=lambda cv: cv[1])[:3]:
            cands += [nb for nb in self._large_neighbors(c) if not self.pool.is_seen(nb)]
        # up to 500 random valid candidates in a bounded number of draws: constraints that pass 1 config
        # in 10,000 give a few (asking for 500 exactly drew for seconds per proposal, then raised)
        keys, _, _ = self.space._sample_keys(self.rng, 500, LARGE_CANDIDATE_DRAWS)
        for k in keys:
            c = self.space.config(k)
            if not self.pool.is_seen(c):
                cands.append(c)
        if not cands:
            return self.pool.random_unseen()
        if prior and good.sum() < 3:
            return cands[int(np.argmin(self._large_prior_mean(cands)))]
        X = self.schema.transform([c for c, _ in hist])
        y = _normalise(np.array([np.nan if v is None else v for _, v in hist]))
        Xc = self.schema.transform(cands)
        base = base_c = None
        if prior:
            pm = self._large_prior_mean([c for c, _ in hist])
            x = pm[good]
            a, _ = np.polyfit(x, y[good], 1) if np.ptp(x) > 0 else (0.0, 0.0)
            a = max(float(a), 0.1)
            b = float(np.mean(y[good]) - a * np.mean(x))
            base, base_c = a * pm + b, a * self._large_prior_mean(cands) + b
            X, Xc = np.hstack([X, base[:, None]]), np.hstack([Xc, base_c[:, None]])
        model = XGBEnsemble(
            n_models=self.config.n_models,
            n_estimators=self.config.n_estimators,
            max_depth=self.config.max_depth,
            normalise=False,
            seed=self.seed + len(hist),
        ).fit(X, y, base_margin=base)
        p = model.predict_all(Xc)
        if base_c is not None:
            p = p + base_c[None, :]
        acq = p.mean(axis=0) - self.config.kappa * p.std(axis=0)
        tie = np.flatnonzero(acq <= acq.min() + 1e-9 * max(float(np.ptp(acq)), 1e-12))
        return cands[int(self.rng.choice(tie))]
