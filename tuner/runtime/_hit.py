"""The hit path (in two variants: `hit_paths`, and `launcher_paths` for Triton kernels, which also stores
the config and looks the launcher's `run` up at each call): shared by `@tuner.autotune` on a plain function,
the Triton launcher (`kernel[grid](...)`) and `tuner.kernel`.

A positional call costs one fast key (`keys[len(args)](args)`, see `_argkeys.py`), one dict lookup (and for
the Triton drop-in one store of the config, its `best_config`, and one lookup of `run`) and the call: no logging, no locks, no
allocation beyond the key tuple, as in Triton's Autotuner, whose hit is a dict lookup too. A call with
keyword arguments does the same with the table's keyword key (`keys[-1](args, kwargs)`, the general key).
Keyword arguments bound to a launcher (Triton's grid) are passed along. Anything else (an unhashable key
value, a key not in the dict, a table without a keyword key) goes to `miss(args, kwargs, fast_key,
call)`, which resolves the config (`_resolve.py`), remembers it under the fast key (None for a call
with keywords: it remembers it under the general key) and returns it. The config reaches the target as
keyword arguments.

Extension point: a new front end (a drop-in for another autotuner, a recording wrapper) builds its
`target` (what to call with the config: the function, Triton's `run` with `grid` and `warmup` bound, a
kernel launcher) and calls `make_hit_path` (or `hit_paths` once, then `make(bound)` per launch; or
`launcher_paths` with an object whose `run` is the target); it does not write its own lookup.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

__all__ = [
    "make_hit_path",
    "retargetable_hit_path",
    "hit_paths",
    "launcher_paths",
    "run_of",
    "launch_args",
    "Miss",
    "Retarget",
]

# miss(args, kwargs, fast key or None, call) -> config; `call` is what the hit path calls (the target
# with its bound keywords), so the tuner benches exactly what the caller will run (for Triton: `run`
# with this grid).
Miss = Callable[[tuple, dict, Any, Callable[..., Any]], dict[str, Any]]


# a fast-key table (`_argkeys.py`): `FastKey | None` per positional count, then the keyword key (or None)
KeyTable = Sequence[Any]

_NO_KWARGS: dict[str, Any] = {}  # never written to (a plain dict: `**` of a dict is the fast case)


def _with(target: Callable[..., Any], bound: Mapping[str, Any]) -> Callable[..., Any]:
    return functools.partial(target, **bound) if bound else target


def hit_paths(
    target: Callable[..., Any],
    keys: KeyTable,
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
) -> Callable[[Mapping[str, Any]], Callable[..., Any]]:
    """`make(bound)` -> `hit(*args, **kwargs)`, which calls `target(*args, **bound, **kwargs, **config)`
    with the config of the call's key. Nothing is stored (the plain decorators need no record, so their
    hit does not pay for it: docs/benchmarks.md); `launcher_paths` is the variant of a launcher object.

    `keys` is the fast-key table of a key builder (indexed by the number of positional arguments; None
    where there are too few; the last entry keys a call with keyword arguments), `mem` the dict of fast
    key -> config that `miss` fills, `bound` keyword arguments of one launcher that are not part of the
    key (Triton: the grid). `make` allocates what a lambda does (the parts above live in this factory's
    cells), so Triton's `kernel[grid]` can make a hit path per launch, as Triton's own `kernel[grid]`
    makes a lambda."""
    return _hit_paths(target, keys, mem, miss)[0]


def _hit_paths(
    target: Callable[..., Any],
    keys: KeyTable,
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
) -> tuple[Callable[[Mapping[str, Any]], Callable[..., Any]], Retarget]:
    """`hit_paths`'s `make`, and its `retarget(target, keys)` (as `launcher_paths`'s, with the target in
    place of the owner): target and keys are cells of this call, which each hit reads anyway."""

    def make(b: Mapping[str, Any]) -> Callable[..., Any]:
        # No annotations on `hit`: they would be built into a dict each time a hit path is made.
        def hit(*args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs:
                try:
                    cfg = mem[keys[-1](args, kwargs)]
                except (KeyError, TypeError, IndexError):  # not resolved in this form yet, unhashable, no key
                    # the target is read after the miss, so a change that it follows reaches this call
                    cfg = miss(args, kwargs, None, _with(target, b))
                return target(*args, **b, **kwargs, **cfg)
            try:
                cfg = mem[keys[len(args)](args)]
            except KeyError:
                cfg = miss(args, kwargs, keys[len(args)](args), _with(target, b))
            except (TypeError, IndexError, AttributeError):  # unhashable key value, too few or many args
                cfg = miss(args, kwargs, None, _with(target, b))
            return target(*args, **b, **cfg)

        return hit

    def retarget(new_target: Any, new_keys: KeyTable) -> None:
        nonlocal target, keys
        target, keys = new_target, new_keys

    return make, retarget


def run_of(owner: Any, *args: Any, **kwargs: Any) -> Any:
    """`owner.run(*args, **kwargs)`, `run` looked up now: what `launcher_paths` hands its miss path (bound
    as `partial(run_of, owner, **bound)`), so every timed run looks `run` up again, as Triton's does."""
    return owner.run(*args, **kwargs)


# retarget(owner, keys): what every hit path of one `launcher_paths` calls and keys by from its next read
Retarget = Callable[[Any, KeyTable], None]


def launcher_paths(
    owner: Any,
    keys: KeyTable,
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
    last: list[Any],
) -> tuple[Callable[[Mapping[str, Any]], Callable[..., Any]], Retarget]:
    """The hit path of a Triton kernel (the drop-in's, and `tuner.autotune`'s own on a JIT function): as
    `hit_paths`, with three differences.

    - The target is `owner.run`, looked up at every call (one attribute lookup), as Triton's Autotuner
      calls `self.fn.run` at every launch and every timed run: a wrapper that code puts on the JIT
      function's `run` after decoration (on the instance or on its class: a lock, a launch recorder, a
      profiler) is called. The miss path gets `partial(run_of, owner, **bound)`, which looks it up at
      each call too.
    - Each call first puts its config in `last[0]` (one store: Triton's `best_config` is the config of
      the last launch; `launch_args(last)` finds the arguments of such a call while it runs, without a
      store).
    - It returns `(make, retarget)`: `retarget(owner, keys)` changes the owner and the fast-key table of
      every hit path `make` made and will make, from their next read of either (one a launch, the other
      each time it computes a fast key), at no cost to the hit: they are cells of this call, which each
      hit reads anyway. A launcher that code kept (`launch = kernel[grid]`) follows a change of the
      configs or key names, and so does the launch whose miss found the change: it launches through
      the owner the change called for (a config's pre_hook), not the one it started with.

    The body is `hit_paths`'s with these changes written in: a shared helper or a flag would cost the
    hit a call or a branch."""
    noted = last

    def make_noting(b: Mapping[str, Any]) -> Callable[..., Any]:
        def hit(*args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs:
                try:
                    cfg = mem[keys[-1](args, kwargs)]
                except (KeyError, TypeError, IndexError):
                    cfg = miss(args, kwargs, None, functools.partial(run_of, owner, **b))
                noted[0] = cfg
                return owner.run(*args, **b, **kwargs, **cfg)
            try:
                cfg = mem[keys[len(args)](args)]
            except KeyError:
                cfg = miss(args, kwargs, keys[len(args)](args), functools.partial(run_of, owner, **b))
            except (TypeError, IndexError, AttributeError):
                cfg = miss(args, kwargs, None, functools.partial(run_of, owner, **b))
            noted[0] = cfg
            return owner.run(*args, **b, **cfg)

        return hit

    def retarget(new_owner: Any, new_keys: KeyTable) -> None:
        nonlocal owner, keys
        owner, keys = new_owner, new_keys

    return make_noting, retarget


def make_hit_path(
    target: Callable[..., Any],
    keys: KeyTable,
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
    bound: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The hit path of `hit_paths(target, keys, mem, miss)` with `bound` (default: none)."""
    return hit_paths(target, keys, mem, miss)(_NO_KWARGS if bound is None else bound)


def retargetable_hit_path(
    target: Callable[..., Any],
    keys: KeyTable,
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
) -> tuple[Callable[..., Any], Retarget]:
    """`make_hit_path` (no bound keywords) and its `retarget(target, keys)`: what the hit path calls and
    keys by from its next read of either (the one whose miss called `retarget` included), at no cost to
    the hit."""
    make, retarget = _hit_paths(target, keys, mem, miss)
    return make(_NO_KWARGS), retarget


def _noting_code() -> Any:
    def never(*args: Any, **kwargs: Any) -> dict[str, Any]:  # pragma: no cover - never called
        raise AssertionError

    return launcher_paths(None, (), {}, never, [None])[0](_NO_KWARGS).__code__


_NOTING_HIT = _noting_code()  # the code of every hit `launcher_paths` makes (one code object, many closures)


def launch_args(last: list[Any]) -> tuple | None:
    """The positional arguments of the innermost call, in this thread, of a hit path that
    `launcher_paths` made with `last` that is running (its miss path, a prune function, a hook or the launch's grid function may ask), or
    None outside one. Found by walking this thread's frames up to that hit's frame (its `noted` is
    `last`), so the hit path itself stores nothing for it: Triton's `Autotuner.nargs` costs each of
    its launches a dict; this costs only the code that reads it."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if f.f_code is _NOTING_HIT:
            names = f.f_locals
            if names.get("noted") is last:
                args = names.get("args")
                return args if isinstance(args, tuple) else None
        f = f.f_back
    return None
