"""JAX tracers on the miss path: a decorated function called inside `jax.jit`, `jax.grad` or `jax.vmap`
sees tracers, not arrays, and timing it would time tracing. On a miss with tracers among the arguments
the runtime resolves the config on concrete arrays of the same shapes and dtypes instead (random normal
values for floating dtypes, zeros otherwise), in a helper thread: jax's trace state is per thread, so
there the launcher runs eagerly, as it would outside any transformation (`ensure_compile_time_eval` is
not enough: it also leaks into the Pallas interpreter's own tracing). The key, the store lookup and, if needed, the tuning are exactly those of an eager call with such
arrays, so the stored entry is the one the eager path stores. The traced call then runs with the chosen
config. Hits never get here (the in-memory key is built from shapes and dtypes, which tracers have).

A key value that is itself traced (`key=["n"]` with `n` a jit argument that is not static) has no
value at trace time: it is refused with a message saying to make it static, rather than keyed on the
stand-in's zero. Typed PRNG key arrays (`jax.random.key`) get stand-in keys of the same implementation.

Donated buffers: a launcher that donates its inputs (`jax.jit(..., donate_argnums=...)`) deletes them
on every call, so tuning it on the caller's arrays would leave every config after the first, and the
caller's own call, with deleted arrays. `donation_guard` gives the first call of each config copies
of the jax arrays among the arguments; if the launcher deleted them, every later call of that config
gets fresh copies (made inside the timed call, as Triton's `restore_value` restores inside its timed
call), else it gets the caller's arrays. The caller's arrays are never donated while tuning. (Where
there is no memory for the first copy, the call gets the caller's arrays, as it would without this.)

Nothing here imports jax unless jax is already imported by the caller.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["has_tracer", "concrete_like", "resolve_on_concrete", "refuse_traced_key", "donation_guard"]


def has_tracer(args: tuple, kwargs: dict) -> bool:
    """Whether any leaf of the arguments is a jax tracer (False, cheaply, when jax is not imported)."""
    if "jax" not in sys.modules:
        return False
    import jax

    tracer = jax.core.Tracer
    return any(isinstance(leaf, tracer) for leaf in jax.tree_util.tree_leaves((args, kwargs)))


def refuse_traced_key(name: str, fields: dict[str, Any]) -> None:
    """TypeError naming the key fields whose value is a tracer (known only when the program runs)."""
    import jax

    tracer = jax.core.Tracer
    traced = sorted(
        str(k) for k, v in fields.items() if any(isinstance(x, tracer) for x in jax.tree_util.tree_leaves(v))
    )
    if traced:
        raise TypeError(
            f"{name}: key field(s) {', '.join(traced)} are traced by jax (called inside jax.jit, vmap or "
            f"grad), so their values are not known when the config is chosen; make them static "
            f"(jax.jit(..., static_argnums=... / static_argnames=...)) or key on array shapes and dtypes"
        )


class _KeySpec:
    """A typed PRNG key array's shape and implementation (its stand-in is made in the helper thread)."""

    def __init__(self, shape: tuple[int, ...], impl: Any) -> None:
        self.shape = shape
        self.impl = impl


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
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return _KeySpec(tuple(leaf.shape), jax.random.key_impl(leaf))
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        return leaf

    sargs, skwargs = jax.tree_util.tree_map(shape, (tuple(args), dict(kwargs)))
    return tuple(sargs), dict(skwargs)


def _materialise(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """Every jax.ShapeDtypeStruct leaf replaced by an array: random normal for floating dtypes, zeros
    otherwise; every typed PRNG key spec by keys of its implementation."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    base = jax.random.PRNGKey(seed)
    count = [0]

    def concrete(leaf: Any) -> Any:
        if isinstance(leaf, _KeySpec):
            count[0] += 1
            data = jax.random.key_data(jax.random.key(seed + count[0], impl=leaf.impl))
            return jax.random.wrap_key_data(jnp.broadcast_to(data, leaf.shape + data.shape), impl=leaf.impl)
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


def donation_guard(
    args: tuple, kwargs: dict
) -> Callable[[Callable[[tuple, dict], Any]], Callable[[], Any]] | None:
    """For a call whose arguments hold jax arrays: `guard(run)` -> a no-argument call of
    `run(args, kwargs)` that never donates the caller's arrays (see the module docstring). None when
    jax is not imported or no argument holds a jax array."""
    if "jax" not in sys.modules:
        return None
    import jax

    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    if not where:
        return None

    def copies() -> tuple[tuple, dict, list[Any]]:
        new = list(leaves)
        for i in where:
            new[i] = leaves[i].copy()
        a, k = jax.tree_util.tree_unflatten(treedef, new)
        return a, k, [new[i] for i in where]

    def guard(run: Callable[[tuple, dict], Any]) -> Callable[[], Any]:
        state = {"first": True, "donates": False}

        def call() -> Any:
            if state["first"] or state["donates"]:
                try:
                    a, k, fresh = copies()
                except Exception as exc:  # noqa: BLE001 - no memory for a copy on the first call:
                    if not state["first"]:  # the caller's arrays, as without the guard
                        raise
                    state["first"] = False
                    log.warning("cannot copy the inputs to check for donation (%s); timing on them", exc)
                    return run(args, kwargs)
                out = run(a, k)
                if state["first"]:
                    state["first"] = False
                    state["donates"] = any(x.is_deleted() for x in fresh)
                    if state["donates"]:
                        log.debug("the launcher donates its inputs: each timed call gets copies")
                return out
            return run(args, kwargs)

        return call

    return guard
