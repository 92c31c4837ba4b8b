"""Search strategies. `get_strategy(name)` returns the class; `STRATEGIES` lists the names."""

from __future__ import annotations

from collections.abc import Callable

from ._base import CandidatePool, PriorTask, Strategy
from ._random import RandomStrategy
from ._tpe import TPEStrategy

__all__ = ["CandidatePool", "PriorTask", "Strategy", "RandomStrategy", "TPEStrategy", "STRATEGIES", "get_strategy"]


def _auto() -> type[Strategy]:
    # "auto" is the best strategy the project has; the model-guided strategy replaces TPE here.
    return TPEStrategy


_REGISTRY: dict[str, Callable[[], type[Strategy]]] = {
    "auto": _auto,
    "random": lambda: RandomStrategy,
    "tpe": lambda: TPEStrategy,
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
