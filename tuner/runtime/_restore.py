"""Restoring, an injected part of the runtime: the arrays a kernel writes in place are copied before
tuning and put back while it runs, so that the call that triggered the tuning returns what an untuned
call would.

jax arrays are immutable: a kernel cannot write them in place, so `restore=` skips them (a launcher that
donates them is given copies while it is tuned, `_jax.donation_guard`).

A `Restorer` says which arrays a call writes (`pick(args, kwargs)`) and whether they are put back before
every timed call (`every_call=True`: a registered kernel's `mutated_inputs`, as Triton's
`restore_value`) or before each config is timed; either way they are put back after tuning.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Restorer", "snapshot", "copy_into", "immutable"]


def snapshot(v: Any) -> Any:
    """A copy of an array the kernel writes to (torch: clone; numpy: copy)."""
    if hasattr(v, "clone"):
        return v.clone()
    if hasattr(v, "copy"):
        return v.copy()
    raise TypeError(f"cannot snapshot a {type(v).__name__} for restore=; pass torch tensors or numpy arrays")


def copy_into(target: Any, saved: Any) -> None:
    if hasattr(target, "copy_"):
        target.copy_(saved)
    else:
        import numpy as np

        np.copyto(target, saved)


def immutable(v: Any) -> bool:
    """Whether `v` is a jax array (nothing can write it in place)."""
    if "jax" not in sys.modules:
        return False
    import jax

    return isinstance(v, jax.Array)


class Restorer:
    """The arrays a call writes in place (`pick(args, kwargs)`, None entries ignored), and when to put
    them back while tuning."""

    def __init__(self, pick: Callable[[tuple, dict], list[Any]], *, every_call: bool = False) -> None:
        self.pick = pick
        self.every_call = every_call

    def take(self, args: tuple, kwargs: dict) -> Callable[[], None] | None:
        """Snapshot the call's written arrays; returns the function that puts them back (None: nothing
        to restore)."""
        snaps = [(v, snapshot(v)) for v in self.pick(args, kwargs) if v is not None and not immutable(v)]
        if not snaps:
            return None

        def restore() -> None:
            for target, saved in snaps:
                copy_into(target, saved)

        return restore
