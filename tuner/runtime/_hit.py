"""The hit path, written once: shared by `@tuner.autotune` on a plain function, the Triton launcher
(`kernel[grid](...)`) and `tuner.kernel`.

A positional call costs one fast key (`keys[len(args)](args)`, see `_argkeys.py`), one dict lookup and
the call: no logging, no locks, no allocation beyond the key tuple, as in Triton's Autotuner, whose hit
is a dict lookup too. Anything else (keyword arguments, an unhashable key value, a key not in the dict)
goes to `miss(args, kwargs, fast_key, target)`, which resolves the config (`_resolve.py`), remembers it
under the fast key and returns it. The config reaches the target as keyword arguments.

Extension point: a new front end (a drop-in for another autotuner, a recording wrapper) builds its
`target` (what to call with the config: the function, a Triton `run` bound to a grid, a kernel
launcher) and calls `make_hit_path`; it does not write its own lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["make_hit_path", "Miss"]

# miss(args, kwargs, fast key or None, target) -> config. `target` is what the hit path calls, so the
# tuner benches exactly what the caller will run (for Triton: `run` bound to this grid).
Miss = Callable[[tuple, dict, Any, Callable[..., Any]], dict[str, Any]]


def make_hit_path(
    target: Callable[..., Any],
    keys: Sequence[Callable[[tuple], Any] | None],
    mem: dict[Any, dict[str, Any]],
    miss: Miss,
) -> Callable[..., Any]:
    """`hit(*args, **kwargs)`: `target(*args, **kwargs, **config)` with the config of the call's key.

    `keys` is the fast-key table of a key builder (indexed by the number of positional arguments; None
    where there are too few), `mem` the dict of fast key -> config that `miss` fills."""

    def hit(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return target(*args, **kwargs, **miss(args, kwargs, None, target))
        try:
            cfg = mem[keys[len(args)](args)]  # type: ignore[misc]
        except KeyError:
            cfg = miss(args, kwargs, keys[len(args)](args), target)  # type: ignore[misc]
        except (TypeError, IndexError, AttributeError):  # unhashable key value, too few or many args
            cfg = miss(args, kwargs, None, target)
        return target(*args, **cfg)

    return hit
