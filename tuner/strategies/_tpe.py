"""Optuna's TPE sampler over the space's ordered parameters as ordinal indices.

Optuna's TPESampler runs in its own in-memory study whose distributions are:
- an ordered numeric parameter (block sizes, warps, stages, ...) -> `IntDistribution(0, n - 1)` over the
  index of its value, so that TPE's Parzen estimators see 64 as next to 32 and 128 (as a categorical
  they are unrelated, and as a raw integer range most values in between do not exist);
- anything else (strings, booleans) -> `CategoricalDistribution`.

The sampler is univariate (Optuna's default). Measured on the 15 replay tables (docs/search-notes.md), this
setting is well ahead of the multivariate sampler over the raw values: geo-mean of median evaluations to
1.05x 37 vs 46, reached 1.05x in 78% of runs vs 61%.

A proposal that is invalid or already measured is replaced by the nearest unseen valid config; TPE is told
the measured value both for its own proposal and for the config measured in its place, so it learns about
the region it proposed instead of proposing it again. The tuner's Optuna study (the one in the results
database) holds only real measurements; the shared loop enqueues each proposal there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner._scoped import optuna_quiet
from tuner.search_spaces import Config, SearchSpace

from ._base import PriorTask, Strategy
from ._config import TPEConfig, settings


def _ordered(values: Sequence[Any]) -> bool:
    return len(values) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class TPEStrategy(Strategy):
    name = "tpe"
    uses_prior = False
    config_class = TPEConfig

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        prior: Sequence[PriorTask] | None = None,
        config: TPEConfig | None = None,
    ) -> None:
        super().__init__(space, seed=seed, prior=prior)
        self.config = settings(config, TPEConfig)
        import optuna
        from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

        self._dists: dict[str, BaseDistribution] = {}
        self._values: dict[str, list[Any]] = {}
        for p in space.params:
            vals = list(p.values)
            if _ordered(vals):
                self._dists[p.name] = IntDistribution(0, len(vals) - 1)
                self._values[p.name] = sorted(vals)
            else:
                self._dists[p.name] = CategoricalDistribution(vals)
        self._index = {n: {v: i for i, v in enumerate(vs)} for n, vs in self._values.items()}
        sampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=self.config.multivariate, n_startup_trials=self.config.n_startup_trials
        )
        # without Optuna's INFO line for the in-memory study, and without changing the caller's
        # verbosity for the rest of the process: the override `optimize` uses too, so a strategy built
        # while another thread's `optimize` runs does not put back a value that one saved (or vice versa)
        with optuna_quiet():
            self._study = optuna.create_study(sampler=sampler, direction="minimize")
        self._pending: tuple[Any, bool] | None = None  # (TPE's trial, whether its proposal was replaced)

    def _config(self, params: dict[str, Any]) -> dict[str, Any]:
        return {n: self._values[n][int(v)] if n in self._values else v for n, v in params.items()}

    def _params(self, config: Config) -> dict[str, Any]:
        return {n: self._index[n][config[n]] if n in self._index else config[n] for n in self._dists}

    def propose(self) -> Config | None:
        trial = self._study.ask(self._dists)
        cfg = self._config(trial.params)
        replaced = bool(self.space.violations(cfg)) or self.pool.is_seen(cfg)
        if replaced:
            repl = self.pool.nearest_unseen(cfg)
            if repl is None:
                import optuna

                self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return None
            cfg = repl
        self._pending = (trial, replaced)
        return self.space.validate(cfg)

    def observe(self, config: Config, value: float | None) -> None:
        import optuna

        pending, self._pending = self._pending, None
        if pending is None:  # a result TPE did not propose (a resumed study): add it as a finished trial
            if value is not None:
                self._study.add_trial(
                    optuna.trial.create_trial(
                        params=self._params(config), distributions=self._dists, value=value
                    )
                )
            return
        trial, replaced = pending
        if value is None:  # a failed config: TPE ignores failed trials
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        self._study.tell(trial, value)
        if replaced:
            self._study.add_trial(
                optuna.trial.create_trial(params=self._params(config), distributions=self._dists, value=value)
            )
