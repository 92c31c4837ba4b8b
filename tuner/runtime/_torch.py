"""torch's tracing, as the miss path meets it (torch is only looked at when it is already imported).

- Placeholder tensors: a `FakeTensor` (torch.compile's and torch.export's shape propagation, a custom op's
  fake implementation, `FakeTensorMode`) or a tensor on the `meta` device (a model built with
  `torch.device("meta")`, shape inference) has a shape and a dtype but no data: a call with one cannot be
  timed (it times a no-op) and its "winner" must never be stored for the key, where the real call of that
  shape would hit it. `placeholder(args, kwargs)` names the first such argument; the decorator then takes
  the config untimed, as offline mode chooses, and tunes the key at its first call with real tensors
  (as jax tracers are handled, `_jax.py`).
- `outside_compile(fn)`: the miss path run with TorchDynamo off for it and everything it calls. A first
  call of a key inside a `torch.compile`d function breaks the graph there and tunes in eager mode: without
  this, Dynamo would compile each frame of the tuning it enters (the timed call with each config, a
  recompilation per config until its recompile limit, with warnings), and time compilations.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ._env import flat_args

__all__ = ["placeholder", "outside_compile"]

F = TypeVar("F", bound=Callable[..., Any])


def placeholder(args: tuple, kwargs: dict) -> str | None:
    """'a FakeTensor' or 'a meta tensor' when one is among the call's arguments (pytrees included), else
    None (also when torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    fake_mod = sys.modules.get("torch._subclasses.fake_tensor")
    fake_cls = getattr(fake_mod, "FakeTensor", None) if fake_mod is not None else None
    for v in flat_args(list(args) + list(kwargs.values())):
        if not isinstance(v, torch.Tensor):
            continue
        if fake_cls is not None and isinstance(v, fake_cls):
            return "a FakeTensor"
        if getattr(v, "is_meta", False):
            return "a meta tensor"
    return None


def outside_compile(fn: F) -> F:
    """`fn` with TorchDynamo disabled for it and what it calls, once Dynamo is imported; else `fn`."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return fn
    return dynamo.disable(fn, recursive=True)  # type: ignore[no-any-return]
