"""JAX tracers on the miss path: a decorated function called inside `jax.jit`, `jax.grad` or `jax.vmap`
sees tracers, not arrays, and timing it would time tracing. On a miss with tracers among the arguments
the runtime resolves the config on concrete arrays of the same shapes and dtypes instead (random normal
values for floating dtypes, zeros otherwise), in a helper thread: jax's trace state is per thread, so
there the launcher runs eagerly, as it would outside any transformation (`ensure_compile_time_eval` is
not enough: it also leaks into the Pallas interpreter's own tracing). The key, the store lookup and, if needed, the tuning are exactly those of an eager call with such
arrays, so the stored entry is the one the eager path stores. The traced call then runs with the chosen
config. Hits never get here (the in-memory key is built from shapes and dtypes, which tracers have).

Nothing here imports jax unless jax is already imported by the caller.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["has_tracer", "concrete_like", "resolve_on_concrete"]


def has_tracer(args: tuple, kwargs: dict) -> bool:
    """Whether any leaf of the arguments is a jax tracer (False, cheaply, when jax is not imported)."""
    if "jax" not in sys.modules:
        return False
    import jax

    tracer = jax.core.Tracer
    return any(isinstance(leaf, tracer) for leaf in jax.tree_util.tree_leaves((args, kwargs)))


def concrete_like(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """The arguments with every tracer replaced by a concrete array of its shape and dtype (call it
    outside any trace: see resolve_on_concrete)."""
    sargs, skwargs = _shapes_of(args, kwargs)
    return _materialise(sargs, skwargs, seed=seed)


def _shapes_of(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every tracer replaced by a jax.ShapeDtypeStruct of its shape and dtype."""
    import jax

    def shape(leaf: Any) -> Any:
        if isinstance(leaf, jax.core.Tracer):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        return leaf

    sargs, skwargs = jax.tree_util.tree_map(shape, (tuple(args), dict(kwargs)))
    return tuple(sargs), dict(skwargs)


def _materialise(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """Every jax.ShapeDtypeStruct leaf replaced by an array: random normal for floating dtypes, zeros
    otherwise."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    base = jax.random.PRNGKey(seed)
    count = [0]

    def concrete(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
        count[0] += 1
        if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
            return jax.random.normal(jax.random.fold_in(base, count[0]), shape, dtype)
        return jnp.zeros(shape, dtype)

    cargs, ckwargs = jax.tree_util.tree_map(concrete, (tuple(args), dict(kwargs)))
    return tuple(cargs), dict(ckwargs)


def resolve_on_concrete(
    miss: Callable[..., dict[str, Any]], name: str, args: tuple, kwargs: dict, fast_key: Any, target: Any
) -> dict[str, Any]:
    """Run the miss path `miss(args, kwargs, fast_key, target)` on concrete stand-ins of the tracers, in a
    thread of its own (outside the caller's trace); its result or its exception is the caller's."""
    # The tracers' shapes and dtypes are read here; the arrays are made in the helper thread.
    sargs, skwargs = _shapes_of(args, kwargs)
    log.debug("%s: called with tracers; resolving the config on concrete arrays of the same shapes", name)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            cargs, ckwargs = _materialise(sargs, skwargs)
            box["cfg"] = miss(cargs, ckwargs, fast_key, target)
        except BaseException as exc:  # re-raised in the caller's thread
            box["exc"] = exc

    t = threading.Thread(target=work, name=f"tuner-concrete-{name}"[:60], daemon=True)
    t.start()
    t.join()
    if "exc" in box:
        raise box["exc"]
    return box["cfg"]
