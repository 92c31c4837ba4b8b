"""Search strategies. `get_strategy(name)` returns the class; `STRATEGIES` lists the names."""

from __future__ import annotations

from collections.abc import Callable

from ._base import CandidatePool, PriorTask, Strategy
from ._random import RandomStrategy
from ._tpe import TPEStrategy

__all__ = [
    "CandidatePool",
    "PriorTask",
    "Strategy",
    "RandomStrategy",
    "TPEStrategy",
    "STRATEGIES",
    "get_strategy",
]


def _auto() -> type[Strategy]:
    # "auto" is the best strategy the project has: the model-guided strategy (cost model + transfer).
    from ._model import ModelStrategy

    return ModelStrategy


def _model() -> type[Strategy]:
    from ._model import ModelStrategy

    return ModelStrategy


def _transfer_best() -> type[Strategy]:
    from ._baselines import TransferBestStrategy

    return TransferBestStrategy


def _xgb_greedy() -> type[Strategy]:
    from ._baselines import XGBGreedyStrategy

    return XGBGreedyStrategy


_REGISTRY: dict[str, Callable[[], type[Strategy]]] = {
    "auto": _auto,
    "random": lambda: RandomStrategy,
    "tpe": lambda: TPEStrategy,
    "model": _model,
    "transfer_best": _transfer_best,
    "xgb_greedy": _xgb_greedy,
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
