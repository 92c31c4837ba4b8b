"""Uniform random search without replacement over the valid configs."""

from __future__ import annotations

from tuner.search_spaces import Config

from ._base import Strategy


class RandomStrategy(Strategy):
    name = "random"
    uses_prior = False

    def propose(self) -> Config | None:
        return self.pool.random_unseen()
