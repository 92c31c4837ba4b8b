"""The Triton kernel object of the `triton.autotune` drop-in: an instance of Triton's own
`triton.runtime.Autotuner` (code written for Triton checks `isinstance(fn, Autotuner)` to unwrap it, read
`best_config` or refuse anything else), launched by `kernel[grid](...)` through the runtime's shared hit
path, with Triton's attributes. Triton's `Autotuner.__init__` is never called (it would set up Triton's own
tuning state); every method of it that a launch or a tool uses is defined here. This module imports
triton: `_triton_compat.build` imports it only for a Triton kernel, when triton is already loaded."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from triton.runtime.autotuner import Autotuner

from ._argkeys import MAX_FAST_ARGS
from ._env import underlying_function
from ._launcher import AutotunedKernel
from ._triton_support import ConfigLaunch, TritonCache, _all_kwargs

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


class TritonAutotuner(AutotunedKernel, Autotuner):
    """A @triton.jit kernel under `tuner.autotune` with `configs`, and an instance of Triton's
    `Autotuner`: launch as `kernel[grid](*args)` (or `.run(*args, grid=..., warmup=False)`); `.cache`,
    `.best_config`, `.configs`, `.keys`, `.configs_timings`, `.warmup()`, `.prune_configs()`, `.tuner`,
    `.explain(*args)`. The launch is the shared hit path around `run` bound to the grid (and the
    configs' own pre_hooks, if any). Assigning `.configs`, `.keys` or `.cache`, or the hooks, acts as it
    does on Triton's."""

    def __init__(self, t: TritonAutotuned) -> None:  # Autotuner.__init__ is not called (see the module)
        self.tuner: TritonAutotuned = t
        self._armed = False  # a check of the in-place changes is due at the next launch (`_arm`)
        super().__init__(t)
        self.base_fn = underlying_function(t.fn)
        # the fast-key table of an armed check (`_arm`): each entry checks the configs and key names first
        self._checking = (
            *(functools.partial(self._checked_key, n) for n in range(MAX_FAST_ARGS)),
            self._checked_kw_key,
        )
        t.rebuilt = self._rebuild
        self._route()

    def _owner(self) -> Any:
        # configs with pre_hooks or UNSET keys launch through a ConfigLaunch; else the JIT function's
        # `run`, no extra frame. Either way `run` is looked up at each launch, as Triton's Autotuner does
        # (`self.fn.run`): a wrapper put on it after decoration is called.
        t = self.tuner
        return ConfigLaunch(t, t.fn) if t.has_config_hooks or t.irregular else t.fn

    def _last(self) -> list[Any]:
        return self.tuner.last

    def _rebuild(self) -> None:
        """The hit paths for the tuner's current key and configs (again after `.keys`/`.configs`/`.fn`
        change), keeping a check that is due (`_arm`): one armed while another thread followed a change."""
        t = self.tuner
        with t.follow_lock:
            self._retarget(self._owner(), self._checking if self._armed else t.keys.fast)

    def _arm(self) -> None:
        """Code read `.configs` or `.keys`, the objects given, which it may now change in place
        (`kernel.keys.append("K")`, `kernel.configs[0].pre_hook = f`): the next launch, hit or miss, of
        any launcher of this kernel first follows such a change (`_checked_key`), as Triton reads both at
        its next launch. The hit path itself never checks: only the fast-key table is swapped, until then."""
        with self.tuner.follow_lock:
            self._armed = True
            self.tuner.deep_check_due = True  # a launch that takes the miss path checks as well
            self._retarget(self._owner(), self._checking)

    def _checked_key(self, n: int, args: tuple) -> Any:
        """The fast key of a launch with `n` positional arguments, after an armed check: disarmed first (a
        read of `.configs`/`.keys` while this runs arms again), then the tuner follows what changed in
        place (rebuilding the hit paths) and the key is the current table's (None: the miss path)."""
        fast = self._disarmed()[n]
        if fast is None:
            raise TypeError("too few positional arguments for a fast key")  # the hit's miss path
        return fast(args)

    def _checked_kw_key(self, args: tuple, kwargs: dict) -> Any:
        """`_checked_key` of a launch with keyword arguments (the table's keyword entry)."""
        kw = self._disarmed()[-1]
        if kw is None:
            raise TypeError("no keyword key")  # the hit's miss path
        return kw(args, kwargs)

    def _disarmed(self) -> Any:
        """The armed check of `_checked_key`: the current fast-key table once the changes are followed."""
        t = self.tuner
        with t.follow_lock:
            self._armed = False
            self._retarget(self._owner(), t.keys.fast)
        t.follow_in_place_changes()
        return t.keys.fast

    def _route(self) -> None:
        """What `kernel[grid]` makes: the hit path, or, once code has assigned the instance a `run` of its
        own (a wrapper that records or replaces launches, `kernel.run = wrap(kernel.run)`), a call of
        that `run`, as Triton's `kernel[grid]` calls `self.run(grid=grid, warmup=False, ...)`."""
        if "run" not in self.__dict__:
            object.__setattr__(self, "_launch", self._make)
            return

        def via_run(bound: Mapping[str, Any]) -> Callable[..., Any]:
            grid = bound["grid"]
            return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

        object.__setattr__(self, "_launch", via_run)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._launch({"grid": grid, "warmup": False})

    def __getattr__(self, name: str) -> Any:
        """The other attributes of Triton's Autotuner that code reads (`reset_to_zero`, `pre_hook`,
        `perf_model`, `cache_results`, `nargs`, ...), from the tuner's state."""
        if name in _AUTOTUNER_ATTRS:
            return getattr(self.__dict__["tuner"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Writes to those attributes go to the tuner, which reads them on the next tuning (as Triton's
        Autotuner reads its own `pre_hook`, `perf_model`, ...)."""
        if name in _AUTOTUNER_ATTRS:
            setattr(self.tuner, name, value)
        else:
            object.__setattr__(self, name, value)
            if name == "run":
                self._route()

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if name == "run":
            self._route()

    # ---- what code reads and writes -----------------------------------------------------------------
    @property
    def configs(self) -> Sequence[Any]:
        """The configs given (or assigned), the very object, as Triton's `.configs`: a change made in
        place through it is followed from the next launch (`_arm`)."""
        self._arm()
        return self.tuner.configs_given

    @configs.setter
    def configs(self, value: Sequence[Any]) -> None:
        self.tuner.reconfigure(value)
        self._rebuild()

    @property
    def keys(self) -> Any:
        """The key given (or assigned), the very object, as Triton's `.keys`: every name, also one that no
        call passes (a constexpr the configs supply), which the key leaves out; with a function as the
        key (tuner's), an empty list. A change made in place through it is followed from the next launch
        (`_arm`)."""
        t = self.tuner
        self._arm()
        return t.key_given if t.named_key else t.key_names

    @keys.setter
    def keys(self, value: Sequence[str]) -> None:
        self.tuner.rekey(value)
        self._rebuild()

    @property
    def cache(self) -> TritonCache:
        return self.tuner.triton_cache

    @cache.setter
    def cache(self, value: dict[tuple, Any]) -> None:
        """As Triton's: the dict consulted from now on (a copy: mutate `.cache` itself afterwards); the
        keys the old one held and this one does not are tuned again at their next launch."""
        t = self.tuner
        old, t.triton_cache = t.triton_cache, TritonCache(t.cache_changed, value)
        t.cache_changed([k for k in old if k not in t.triton_cache])

    @property
    def best_config(self) -> Any:
        """The triton.Config of the last launch (as Triton's; set by the first), or what code assigned
        since."""
        if self.tuner.last[0] is None:
            raise AttributeError("best_config is set by the first launch")
        return self.tuner.best_config()

    @best_config.setter
    def best_config(self, value: Any) -> None:
        """As on Triton's, where it is a plain attribute: reads give `value` until the next launch."""
        self.tuner.set_best_config(value)

    @property
    def configs_timings(self) -> dict[Any, Any]:
        return self.tuner.configs_timings

    @property
    def bench_time(self) -> float:
        return self.tuner.bench_time

    @property
    def do_bench(self) -> Callable[..., Any]:
        """The timer of a `do_bench=` given, else Triton's default benchmarker (as Triton's)."""
        if self.tuner.user_do_bench is not None:
            return self.tuner.user_do_bench
        from triton.runtime.driver import driver

        return driver.active.get_benchmarker()

    @do_bench.setter
    def do_bench(self, value: Callable[..., Any] | None) -> None:
        """As on Triton's (a cached property there): the next tunings time with `value`
        (`do_bench(kernel_call, quantiles)`, milliseconds); None goes back to the default timer."""
        self.tuner.user_do_bench = value

    @do_bench.deleter
    def do_bench(self) -> None:
        self.tuner.user_do_bench = None

    @property
    def _do_bench(self) -> Callable[..., Any] | None:
        """Triton's private attribute behind `do_bench`: the `do_bench=` given, or None. Tools that put a
        benchmarker of their own there (triton-viz's `Trace` assigns one that calls the kernel once and
        returns `(1.0, 1.0, 1.0)`) time the next tunings with it, as on Triton's before its first tuning."""
        return self.tuner.user_do_bench

    @_do_bench.setter
    def _do_bench(self, value: Callable[..., Any] | None) -> None:
        self.tuner.user_do_bench = value

    def __deepcopy__(self, memo: dict[int, Any]) -> TritonAutotuner:
        """`copy.deepcopy`: an autotuner of its own (`TritonAutotuned.deep_copy`), as Triton's deep
        copy is; attributes that code set on this one are deep-copied too."""
        new = type(self)(self.tuner.deep_copy(memo))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name not in new.__dict__:
                setattr(new, name, copy.deepcopy(value, memo))
        return new

    def __copy__(self) -> TritonAutotuner:
        """`copy.copy`: an autotuner of its own, as Triton's shallow copy is an object of its own, so that
        what code assigns on the copy (`.fn`, `.cache`, hooks: a tool that launches a private copy through
        its own function) leaves the original as it was. The copy shares the configs and the key list
        (the very objects) and the functions given, and starts from a copy of `.cache`; the attributes
        that code set on the original are shared. (Without this, `copy.copy` went by `__reduce__`: the
        kernel itself for one defined at module level, a PicklingError for one made in a function.)"""
        t = self.tuner
        shared = [t.configs_given, t.key_given, *t.configs_given, *dict.values(t.triton_cache)]
        memo: dict[int, Any] = {id(o): o for o in shared}
        memo[id(memo)] = shared  # kept alive while the memo is used, as deepcopy keeps its objects
        new = type(self)(t.deep_copy(memo))
        for name, value in self.__dict__.items():
            if name not in new.__dict__:
                setattr(new, name, value)
        return new

    # ---- launches ---------------------------------------------------------------------------------------
    def prune_configs(self, kwargs: dict[str, Any]) -> list[Any]:
        """Triton's: the configs left by `early_config_prune` and `perf_model`/`top_k`, for the positional
        arguments in `.nargs` and these keyword arguments."""
        return self.tuner.prune_named(dict(self.tuner.nargs or {}), dict(kwargs))

    def warmup(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Compile every config left after pruning, without launching or timing (Triton's
        `Autotuner.warmup`: `fn.warmup` per config, so a torch dtype stands for a tensor)."""
        t = self.tuner
        outer, t._tl.warmup_args = getattr(t._tl, "warmup_args", None), args  # `.nargs`, as Triton's warmup
        try:
            pruned = t.prune_named(dict(zip(self.arg_names, args, strict=False)), dict(kwargs))
            return [self.fn.warmup(*args, **kwargs, **_all_kwargs(c)) for c in pruned]
        finally:
            t._tl.warmup_args = outer

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        """Triton's `run` (what a `@triton.heuristics` above, or a library's wrapper, calls)."""
        if warmup:
            return self.warmup(*args, grid=grid, **kwargs)
        return self._make({"grid": grid, "warmup": False})(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TritonAutotuner({self.tuner.name})"


def _is_compiling() -> bool:  # replaced by torch.compiler.is_compiling once torch is imported
    return False


class InterpretedTritonAutotuner(TritonAutotuner):
    """The drop-in of a kernel that Triton's interpreter runs (`TRITON_INTERPRET=1`). Outside
    `torch.compile` it is `TritonAutotuner`. While Dynamo traces a launch (`kernel[grid](...)`,
    `kernel.run(..., grid=...)`), it hands Dynamo `_dynamo_bridge.traced_launch`, one custom op in the
    graph, instead of its hit path and the interpreter, which Dynamo cannot trace (see that module)."""

    def __init__(self, t: TritonAutotuned) -> None:
        super().__init__(t)
        _watch_torch()

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        if _COMPILING[0]():
            from ._dynamo_bridge import traced_launch

            return traced_launch(self, grid)
        return self._launch({"grid": grid, "warmup": False})

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if not warmup and _COMPILING[0]():
            from ._dynamo_bridge import traced_launch

            return traced_launch(self, grid)(*args, **kwargs)
        return super().run(*args, grid=grid, warmup=warmup, **kwargs)


# [is_compiling]: torch.compiler.is_compiling once torch is imported (read by each interpreted launch)
_COMPILING: list[Callable[[], bool]] = [_is_compiling]


def _watch_torch() -> None:
    """Take torch's `is_compiling` where torch is imported (a kernel defined before torch is imported
    keeps answering False: Dynamo then traces its hit path, a graph break, as before)."""
    torch = sys.modules.get("torch")
    if _COMPILING[0] is _is_compiling and torch is not None:
        compiler = getattr(torch, "compiler", None)
        fn = getattr(compiler, "is_compiling", None)
        if callable(fn):
            _COMPILING[0] = fn


def interpreted(fn: Any) -> bool:
    """Whether `fn` (a JIT function, or a `@triton.heuristics` or autotuner around one) runs in Triton's
    interpreter: what `triton.jit` makes under `TRITON_INTERPRET=1`."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every supported triton has it
        return False
    for _ in range(10):
        if isinstance(fn, InterpretedFunction):
            return True
        fn = getattr(fn, "fn", None)
        if fn is None:
            return False
    return False
