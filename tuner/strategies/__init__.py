"""Search strategies. `get_strategy(name)` returns the class; `STRATEGIES` lists the names.

A strategy is constructed as `Cls(space, *, seed=0, prior=None)`; one with settings also takes
`config=` (a frozen dataclass: `ModelStrategyConfig`, `TPEConfig`, `XGBGreedyConfig`), and an instance
can be passed to `tuner.optimize(..., strategy=instance)`.
"""

from __future__ import annotations

from collections.abc import Callable

from ._base import CandidatePool, PriorTask, Strategy
from ._baselines import TransferBestStrategy, XGBGreedyStrategy
from ._config import ModelStrategyConfig, TPEConfig, XGBGreedyConfig
from ._model import ModelStrategy
from ._random import RandomStrategy
from ._tpe import TPEStrategy

__all__ = [
    "CandidatePool",
    "PriorTask",
    "Strategy",
    "ModelStrategy",
    "ModelStrategyConfig",
    "RandomStrategy",
    "TPEStrategy",
    "TPEConfig",
    "TransferBestStrategy",
    "XGBGreedyStrategy",
    "XGBGreedyConfig",
    "STRATEGIES",
    "get_strategy",
]


_REGISTRY: dict[str, Callable[[], type[Strategy]]] = {
    "auto": lambda: ModelStrategy,  # the best strategy the project has
    "random": lambda: RandomStrategy,
    "tpe": lambda: TPEStrategy,
    "model": lambda: ModelStrategy,
    "transfer_best": lambda: TransferBestStrategy,
    "xgb_greedy": lambda: XGBGreedyStrategy,
}

STRATEGIES: tuple[str, ...] = tuple(_REGISTRY)


def get_strategy(name: str) -> type[Strategy]:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of {list(_REGISTRY)}") from None


def register_strategy(name: str, factory: Callable[[], type[Strategy]]) -> None:
    """Add a strategy under `name` (a factory so that heavy imports stay lazy)."""
    _REGISTRY[name] = factory
    global STRATEGIES
    STRATEGIES = tuple(_REGISTRY)
