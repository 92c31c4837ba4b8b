"""Baselines for transfer, used by benchmarks/replay_search.py to show what the model strategy adds.

- `transfer_best`: measure the configs in the order of their mean normalised log time over the prior
  tasks (the best on the other devices first); configs no prior task measured come after, at random.
- `xgb_greedy`: one plain XGBoost regressor, trained on the prior tasks pooled (per-task normalised log
  time) plus the task's own results, refit after every few results, measuring its predicted best.
  Without a prior it starts with 10 random draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.search_spaces import Config, SearchSpace

from ._base import PriorTask, Strategy
from ._config import XGBGreedyConfig, settings

__all__ = ["TransferBestStrategy", "XGBGreedyStrategy"]


def _prior_matrix(strategy: Strategy) -> np.ndarray:
    """Normalised prior values per task for each pool config (NaN where the task did not measure it)."""
    from tuner.cost_models import normalise_targets

    rows = []
    names = strategy.space.names
    for task in strategy.prior or []:
        row = np.full(strategy.pool.size or 0, np.nan)
        vals = np.array([np.nan if v is None else v for _, v in task], dtype=np.float64)
        if not len(vals) or not np.isfinite(vals).any():
            continue
        t = normalise_targets(vals)
        for (c, _), tv in zip(task, t, strict=True):
            try:
                i = strategy.pool.index.get(strategy.space._hkey(tuple(c[n] for n in names)))
            except KeyError:
                continue
            if i is not None:
                row[i] = tv
        rows.append(row)
    return np.vstack(rows) if rows else np.zeros((0, strategy.pool.size or 0))


class TransferBestStrategy(Strategy):
    name = "transfer_best"

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, prior: Sequence[PriorTask] | None = None
    ) -> None:
        super().__init__(space, seed=seed, prior=prior)
        self._order: list[int] | None = None

    def propose(self) -> Config | None:
        if not self.pool.enumerable:
            return self.pool.random_unseen()
        if self._order is None:
            P = _prior_matrix(self)
            if len(P):
                cnt = np.isfinite(P).sum(axis=0)
                m = np.where(cnt > 0, np.nansum(P, axis=0) / np.maximum(cnt, 1), np.nan)
                known = np.flatnonzero(np.isfinite(m))
                self._order = known[np.argsort(m[known], kind="stable")].tolist()
            else:
                self._order = []
        while self._order:
            i = self._order.pop(0)
            if self.pool.unseen_mask[i]:
                return self.pool.config_at(i)
        return self.pool.random_unseen()


class XGBGreedyStrategy(Strategy):
    name = "xgb_greedy"
    config_class = XGBGreedyConfig

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        prior: Sequence[PriorTask] | None = None,
        config: XGBGreedyConfig | None = None,
    ) -> None:
        super().__init__(space, seed=seed, prior=prior)
        self.config = settings(config, XGBGreedyConfig)
        self._ready = False
        self._queue: list[int] = []

    def _setup(self) -> None:
        from tuner.cost_models import schema_for_space

        self._ready = True
        self.schema = schema_for_space(self.space)
        self.F = self.schema.transform_keys(self.space.names, self.pool.keys)
        self.PX = np.zeros((0, self.F.shape[1]))
        self.Py = np.zeros(0)
        rng = np.random.default_rng(self.seed)
        xs, ys = [], []
        from tuner.cost_models import normalise_targets

        tasks = [t for t in (self.prior or []) if t]
        per = self.config.max_prior_rows // max(1, len(tasks))
        for task in tasks:
            vals = np.array([np.nan if v is None else v for _, v in task], dtype=np.float64)
            t = normalise_targets(vals)
            sel = rng.choice(len(task), size=min(per, len(task)), replace=False)
            xs.append(self.schema.transform([task[int(i)][0] for i in sel]))
            ys.append(t[sel])
        if xs:
            self.PX, self.Py = np.vstack(xs), np.concatenate(ys)

    def propose(self) -> Config | None:
        from tuner.cost_models import XGBRegressorModel, normalise_targets

        if not self.pool.enumerable:
            return self.pool.random_unseen()
        if not self._ready:
            self._setup()
        own = [(self.pool.index[self.pool.hkey(c)], v) for c, v in self.history]
        if not len(self.Py) and len(own) < self.config.n_init:
            return self.pool.random_unseen()
        self._queue = [i for i in self._queue if self.pool.unseen_mask[i]]
        if not self._queue:
            X, y, w = self.PX, self.Py, np.ones(len(self.Py))
            if own:
                idx = np.array([i for i, _ in own])
                yo = normalise_targets(
                    np.array([np.nan if v is None else v for _, v in own], dtype=np.float64)
                )
                X = np.vstack([X, self.F[idx]])
                y = np.concatenate([y, yo])
                w = np.concatenate([w, np.full(len(own), max(1.0, len(self.Py) / 200.0))])
            model = XGBRegressorModel(n_estimators=60, max_depth=6, normalise=False, seed=self.seed).fit(
                X, y, sample_weight=w
            )
            unseen = np.flatnonzero(self.pool.unseen_mask)
            pred = model.predict(self.F[unseen])
            self._queue = [int(unseen[i]) for i in np.argsort(pred, kind="stable")[: self.config.refit_every]]
        return self.pool.config_at(self._queue.pop(0)) if self._queue else self.pool.random_unseen()
