"""Optuna's TPE sampler (multivariate, grouped), with repeats and invalid proposals projected onto the
nearest unseen valid config by the shared loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from search_spaces import Config

from ._base import Strategy

if TYPE_CHECKING:  # pragma: no cover
    import optuna


class TPEStrategy(Strategy):
    name = "tpe"
    n_startup_trials = 10

    def optuna_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.TPESampler(
            seed=self.seed, multivariate=True, n_startup_trials=self.n_startup_trials
        )

    def propose(self) -> Config | None:
        return None  # Optuna's TPE proposes
