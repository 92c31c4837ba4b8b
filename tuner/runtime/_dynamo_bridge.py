"""The Triton drop-in on Triton's interpreter inside `torch.compile`: one opaque op in the graph.

Where torch supports Triton (a CUDA GPU), Dynamo turns `kernel[grid](...)` on any `triton.runtime.Autotuner`
(the drop-in is one) into its own higher-order op, which launches `kernel[grid](...)` when the graph runs.
Where it does not (`torch.utils._triton.has_triton()` is False: a CPU machine, `TRITON_INTERPRET=1`), Dynamo
traces the kernel object's Python instead, the hit path and then Triton's interpreter, and cannot: a graph
break, and `fullgraph=True` raises (for `triton.autotune` too). There, the drop-in of an interpreted kernel
(`_triton_launch.InterpretedTritonAutotuner`) hands Dynamo `traced_launch` instead, which Dynamo traces into
one call of the custom op `tuner::interpreted_launch`:

- the tensor arguments go to the op as a list it mutates (the interpreter may write any of them: under
  `aot_eager` they are functionalized as any mutated input of a custom op is);
- the integer arguments as a list of (possibly symbolic) ints, so that dynamic shapes stay symbolic;
- the float arguments as a list of (possibly symbolic) floats: a float input of the compiled function
  (a scale, an epsilon) that changes between calls is a symbolic float once Dynamo recompiles for it;
- the launch grid of each config (Dynamo calls the grid function once per config, as it does for
  `triton.autotune`, with what the eager launch gives it: the arguments, the config's values, those of a
  `@triton.heuristics` beneath the autotuner and the parameters' defaults) as a flat list of (possibly
  symbolic) ints;
- everything else (bools, None, strings, constexprs) and the kernel itself by a handle into a table
  of this process, registered once per distinct launch shape while Dynamo traces
  (`torch._dynamo.assume_constant_result`).

When the graph runs, the op rebuilds the call and launches it through the drop-in's hit path: tuner's
winner, tuned there (on the real tensors) for a key never tuned. The handle is only meaningful in this
process (as Dynamo's own kernel side table): such a graph is not exported. This module imports torch; it
is imported only where torch already is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._triton_support import _all_kwargs

__all__ = ["traced_launch"]

_TABLE: list[tuple[Any, tuple]] = []  # handle -> (kernel, spec)
_HANDLES: dict[tuple[int, tuple], int] = {}  # (id(kernel), spec) -> handle
_LOCK = threading.Lock()

_TENSOR, _INT, _CONST, _FLOAT = 0, 1, 2, 3


@torch._dynamo.assume_constant_result  # type: ignore[misc]
def _handle(kernel: Any, spec: tuple) -> int:
    """The handle of (kernel, spec), registered once: called for real while Dynamo traces."""
    with _LOCK:
        key: tuple[int, tuple] | None = (id(kernel), spec)
        h: int | None
        try:
            h = _HANDLES.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable constant argument: a handle of its own
            key, h = None, None
        if h is None or _TABLE[h][0] is not kernel:
            h = len(_TABLE)
            _TABLE.append((kernel, spec))
            if key is not None:
                _HANDLES[key] = h
        return h


@torch.library.custom_op("tuner::interpreted_launch", mutates_args=("tensors",))  # type: ignore[misc]
def _interpreted_launch(
    handle: int, tensors: list[torch.Tensor], ints: list[int], floats: list[float], grids: list[int]
) -> None:
    kernel, (kinds, names, consts, configs) = _TABLE[handle]
    by_kind = {_TENSOR: iter(tensors), _INT: iter(ints), _FLOAT: iter(floats), _CONST: iter(consts)}
    values = [next(by_kind[k]) for k in kinds]
    npos = len(kinds) - len(names)
    args, kwargs = values[:npos], dict(zip(names, values[npos:], strict=True))
    per_config = [tuple(grids[3 * i : 3 * i + 3]) for i in range(len(configs))]

    def grid(meta: dict[str, Any]) -> tuple:
        for cfg, g in zip(configs, per_config, strict=True):
            if all(k in meta and meta[k] == v for k, v in cfg):
                return g
        return per_config[0]

    kernel[grid](*args, **kwargs)  # not compiling now: the drop-in's own launch


def _kind(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return _TENSOR
    if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
        return _INT
    if isinstance(v, (float, torch.SymFloat)):
        return _FLOAT
    return _CONST


def _grid3(g: Any) -> list[Any]:
    g = list(g) if isinstance(g, (tuple, list)) else [g]
    if not 1 <= len(g) <= 3:
        raise ValueError(f"a launch grid has 1 to 3 dimensions, got {len(g)}")
    return g + [1] * (3 - len(g))


def _config_grid(kernel: Any, grid: Any, named: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """The grid of a launch with config `cfg`, from the grid function given what it gets outside
    `torch.compile`: the arguments, the config's values and the defaults of the parameters left out
    (the interpreter's bound arguments, as Triton's JIT binds them on a GPU), and, where it reads one
    that these lack, the values of the `@triton.heuristics` beneath the autotuner (each one sees what
    those above it set, as Triton's `Heuristics.run` runs them). The heuristics run only then: one that
    Dynamo cannot trace (a `data_ptr()` alignment check) is no obstacle to a grid that does not need it."""
    defaults = kernel.tuner.defaults
    try:
        return grid({**defaults, **named, **cfg})
    except KeyError:
        from triton.runtime.autotuner import Heuristics

        meta = {**named, **cfg}
        fn = kernel.tuner.fn
        while isinstance(fn, Heuristics):
            for name, heur in fn.values.items():
                meta[name] = heur(dict(meta))
            fn = fn.fn
        return grid({**defaults, **meta})


def traced_launch(kernel: Any, grid: Any) -> Callable[..., None]:
    """What `kernel[grid]` is while Dynamo traces: a launch that becomes one `tuner::interpreted_launch`."""

    def launch(*args: Any, **kwargs: Any) -> None:
        values = list(args) + list(kwargs.values())
        kinds = tuple(_kind(v) for v in values)
        names = tuple(kwargs)
        # (no zip(strict=...) here: Dynamo traces this function)
        tensors = [v for v, k in zip(values, kinds) if k == _TENSOR]  # noqa: B905
        ints = [v for v, k in zip(values, kinds) if k == _INT]  # noqa: B905
        floats = [v for v, k in zip(values, kinds) if k == _FLOAT]  # noqa: B905
        consts = tuple(v for v, k in zip(values, kinds) if k == _CONST)  # noqa: B905
        named = {**dict(zip(kernel.arg_names, args)), **kwargs}  # noqa: B905
        configs: Sequence[Any] = kernel.tuner.configs_given  # not `.configs`, which arms a check
        params = kernel.arg_names
        # a config's values that reach the kernel as arguments (a dict config's launch options do not)
        cfg_kw = [{k: v for k, v in _all_kwargs(c).items() if k in params} for c in configs]
        cfg_items = tuple(tuple(sorted(kw.items())) for kw in cfg_kw)
        grids: list[Any] = []
        for kw in cfg_kw:
            grids.extend(_grid3(_config_grid(kernel, grid, named, kw) if callable(grid) else grid))
        h = _handle(kernel, (kinds, names, consts, cfg_items))
        torch.ops.tuner.interpreted_launch(h, tensors, ints, floats, grids)

    return launch
