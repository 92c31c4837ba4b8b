"""Search strategies. `get_strategy(name)` returns the class; `STRATEGIES` lists the names.

A strategy is constructed as `Cls(space, *, seed=0, prior=None)`; one with settings also takes
`config=` (a frozen dataclass: `ModelStrategyConfig`, `TPEConfig`, `XGBGreedyConfig`), and an instance
can be passed to `tuner.optimize(..., strategy=instance)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    "check_strategy",
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


def check_strategy(strategy: Any, *, instance_ok: bool = True) -> None:
    """Refuse, before anything runs, a `strategy=` argument that is neither a registered name (ValueError
    for an unknown one) nor, where `instance_ok`, a `Strategy` instance (TypeError: None, a class, any
    other type). `instance_ok=False` where each new key is a search of its own (`tuner.autotune`,
    `tuner.kernel`): an instance serves one `optimize` call."""
    names = list(_REGISTRY)
    if isinstance(strategy, Strategy):
        if instance_ok:
            return
        raise TypeError(
            f"strategy must be a strategy's name, one of {names}, got a {type(strategy).__name__} instance: "
            "an instance serves one optimize call, and each new key is a search of its own"
        )
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(
            f"strategy must be a name or an instance, got the class {strategy.__name__}: "
            f"pass {strategy.__name__}(space, seed=...)"
            if instance_ok
            else f"strategy must be a strategy's name, one of {names}, got the class {strategy.__name__}"
        )
    if not isinstance(strategy, str):
        took = f"one of {names}, or a Strategy instance" if instance_ok else f"one of {names}"
        raise TypeError(f"strategy must be a strategy's name, {took}; got {strategy!r:.80}")
    get_strategy(strategy)


def register_strategy(name: str, factory: Callable[[], type[Strategy]]) -> None:
    """Add a strategy under `name` (a factory so that heavy imports stay lazy)."""
    _REGISTRY[name] = factory
    global STRATEGIES
    STRATEGIES = tuple(_REGISTRY)
