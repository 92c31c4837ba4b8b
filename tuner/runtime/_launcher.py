"""A Triton JIT function under `tuner.autotune`: launched as `kernel[grid](*args)`, as with
triton.autotune. `kernel[grid]` makes the one hit path (`_hit.py`) around the JIT function's `run`
(looked up at each launch) with the grid bound (one closure, as Triton's own `kernel[grid]` makes one; no
grid is kept past the launch), so the tuner benches `run` with the caller's grid."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._hit import launcher_paths

# The parameters of triton.autotune beyond configs and key, in its order (triton 3.7).
TRITON_KEYWORDS = (
    "prune_configs_by",
    "reset_to_zero",
    "restore_value",
    "pre_hook",
    "post_hook",
    "warmup",
    "rep",
    "use_cuda_graph",
    "do_bench",
    "cache_results",
)

if TYPE_CHECKING:  # pragma: no cover
    from ._decorator import Autotuned

__all__ = ["AutotunedKernel", "triton_configs_to_dicts"]


# The triton.Config launch options besides num_warps/num_stages, with their defaults: `ir_override`
# names an IR file (.ttir, .ttgir, .llir, .ptx) that the compiler uses instead of the kernel's own.
_LAUNCH_OPTIONS = (("num_ctas", 1), ("maxnreg", None), ("ir_override", None))


def triton_configs_to_dicts(configs: Sequence[Any]) -> list[dict[str, Any]]:
    """triton.Config (kwargs, num_warps, num_stages, ...) or plain dicts -> dicts for SearchSpace."""
    out = []
    for i, c in enumerate(configs):
        if isinstance(c, Mapping):
            out.append(dict(c))
            continue
        if not hasattr(c, "kwargs") or not hasattr(c, "num_warps"):
            raise TypeError(f"configs[{i}] is neither a dict nor a triton.Config: {c!r}")
        if getattr(c, "pre_hook", None) is not None:
            raise ValueError(f"configs[{i}] has a pre_hook; tuner.autotune does not run config pre-hooks")
        d = dict(c.kwargs)
        d["num_warps"] = int(c.num_warps)
        d["num_stages"] = int(c.num_stages)
        out.append(d)
    # Launch options that only some configs set are kept only if they vary. As in Triton's
    # `Config.all_kwargs()`, an option the config sets (not None) wins over a kwarg of that name.
    extras: dict[str, Any] = {}
    for c in configs:
        if not isinstance(c, Mapping):
            for opt, dflt in _LAUNCH_OPTIONS:
                v = getattr(c, opt, dflt)
                if v != dflt:
                    extras.setdefault(opt, dflt)
    if extras:
        for d, c in zip(out, configs, strict=True):
            for opt, dflt in extras.items():
                v = None if isinstance(c, Mapping) else getattr(c, opt, dflt)
                d[opt] = v if v is not None else d.get(opt, dflt)
    return out


class AutotunedKernel:
    """A Triton JIT function under tuner.autotune: launch it as `kernel[grid](*args)`, as with
    triton.autotune. `.tuner` holds the state; `.explain(*args)` says what a call would use.

    Every launch and timed run looks up the `run` of `.fn` when it happens (`_hit.launcher_paths`), as
    Triton's Autotuner calls `self.fn.run`: a wrapper put there after decoration (on the JIT instance or
    its class) is called. Assigning `.fn` launches the function assigned from the next launch on (also
    through a launcher made before), and keys the store by its code."""

    def __init__(self, t: Autotuned) -> None:
        self.tuner = t
        self.arg_names = t.arg_names
        self.explain = t.explain
        self.cache_clear = t.cache_clear
        self._make, self._retarget = launcher_paths(self._owner(), t.keys.fast, t.mem, t.miss, self._last())

    def _owner(self) -> Any:
        """What the hit path calls `run` of."""
        return self.tuner.fn

    def _last(self) -> list[Any]:
        """Where the hit path notes each launch's config (the drop-in's `best_config`)."""
        return [None]

    def _rebuild(self) -> None:
        """The hit paths launch through the current owner and key by the current fast keys."""
        self._retarget(self._owner(), self.tuner.keys.fast)

    @property
    def fn(self) -> Any:
        """The function launched (the JIT function, or what code assigned since)."""
        return self.tuner.fn

    @fn.setter
    def fn(self, value: Any) -> None:
        self.tuner.replace_fn(value)
        self._rebuild()

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._make({"grid": grid, "warmup": False})

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if warmup:
            return self.fn.run(*args, grid=grid, warmup=True, **kwargs)
        return self[grid](*args, **kwargs)

    def __repr__(self) -> str:
        return f"AutotunedKernel({self.tuner.name})"

    def __reduce__(self) -> Any:
        """Pickled by reference (`_env.by_reference`), as the decorated function is: a process pool can
        be given the kernel."""
        from ._env import by_reference

        return by_reference(self, self.fn)
