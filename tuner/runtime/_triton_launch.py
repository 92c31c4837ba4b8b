"""The Triton kernel object of the `triton.autotune` drop-in: `kernel[grid](...)` through the runtime's
shared hit path, with Triton's `.cache`, `.best_config`, `.configs`, `.warmup()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._env import underlying_function
from ._hit import hit_paths
from ._launcher import AutotunedKernel
from ._triton_support import _BOUND, _all_kwargs, launch_kwargs

if TYPE_CHECKING:  # pragma: no cover
    from ._triton_compat import TritonAutotuned


# Attributes of triton.runtime.autotuner.Autotuner that TritonAutotuned keeps under the same name.
_AUTOTUNER_ATTRS = frozenset(
    {
        "reset_to_zero",
        "restore_value",
        "pre_hook",
        "post_hook",
        "user_defined_pre_hook",
        "user_defined_post_hook",
        "perf_model",
        "configs_top_k",
        "early_config_prune",
        "num_warmups",
        "num_reps",
        "use_cuda_graph",
        "cache_results",
        "nargs",
    }
)


class TritonAutotuner(AutotunedKernel):
    """A @triton.jit kernel under `tuner.autotune` with `configs`: launch as `kernel[grid](*args)`;
    `.cache`, `.best_config`, `.configs`, `.configs_timings`, `.tuner`, `.explain(*args)`. The launch is
    the shared hit path around `run` bound to the grid (and the configs' own pre_hooks, if any)."""

    def __init__(self, t: TritonAutotuned) -> None:
        super().__init__(t)
        self.tuner: TritonAutotuned = t
        if t.has_config_hooks or t.irregular:  # else the runtime's hit path as is: no extra frame
            self._make = hit_paths(self._launch_target(), t.keys.fast, t.mem, t.miss)
        self.base_fn = underlying_function(t.fn)
        self.keys = t.key_names
        self.configs = t.configs
        self.cache = t.triton_cache

    def _launch_target(self) -> Callable[..., Any]:
        """With configs that have their own pre_hook, or that set different keys: what the hit path
        calls with `grid=`, `warmup=` and the config: the config's pre_hook, then `run` without the keys
        the config leaves UNSET. `.bare` is `run` alone (what tuning times, with Triton's hooks around
        it, and the UNSET keys dropped)."""
        t = self.tuner
        jit_run = self.fn.run
        run = (lambda *a, **kw: jit_run(*a, **launch_kwargs(kw))) if t.irregular else jit_run

        def target(*args: Any, **kw: Any) -> Any:
            cfg = t.last_cfg = t.split_config(kw)
            cobj = t.config_obj(cfg)
            if getattr(cobj, "pre_hook", None) is not None:
                user_kw = {k: v for k, v in kw.items() if k not in t._cfg_names and k not in _BOUND}
                cobj.pre_hook(t.full_nargs(args, user_kw, kw.get("grid"), cobj))
            return run(*args, **kw)

        target.bare = run  # type: ignore[attr-defined]
        return target

    def __getattr__(self, name: str) -> Any:
        """The other attributes of Triton's Autotuner that code reads (`reset_to_zero`, `pre_hook`,
        `perf_model`, `cache_results`, `nargs`, ...), from the tuner's state."""
        if name in _AUTOTUNER_ATTRS:
            return getattr(self.__dict__["tuner"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def best_config(self) -> Any:
        """The triton.Config chosen for the most recently resolved key (Triton sets it on every launch;
        the two differ only when launches alternate between keys already resolved: the hit path records
        nothing, to stay one dict lookup)."""
        cfg = self.tuner.last_cfg
        if cfg is None:
            raise AttributeError("best_config is set by the first launch")
        return self.tuner.config_obj(cfg)

    @property
    def configs_timings(self) -> dict[Any, Any]:
        return self.tuner.configs_timings

    @property
    def bench_time(self) -> float:
        return self.tuner.bench_time

    def warmup(self, *args: Any, grid: Any = None, **kwargs: Any) -> list[Any]:
        """Compile every config left after pruning (Triton's Autotuner.warmup)."""
        return [
            self.fn.run(*args, grid=grid, warmup=True, **kwargs, **_all_kwargs(c))
            for c in self.tuner.prune(args, kwargs, grid)
        ]

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if warmup:
            return self.warmup(*args, grid=grid, **kwargs)
        return self[grid](*args, **kwargs)

    def __repr__(self) -> str:
        return f"TritonAutotuner({self.tuner.name})"
