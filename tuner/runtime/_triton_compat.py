"""`tuner.autotune` as a drop-in for `triton.autotune`: every keyword of `triton.autotune` (triton 3.7)
with Triton's semantics, on top of the runtime's cache, store and key.

What Triton does, and so what this does (see triton/runtime/autotuner.py):
- `configs` (an empty list means one default config; a config listed twice, or two that
  `triton.Config.__eq__` counts as one (1, 1.0, True), is timed once; a key that only some configs set
  is passed only by them; a value a space cannot hold, a tuple or a `tl.dtype`, is launched as given), `key` (argument names whose values, plus the dtypes of
  all array arguments, select an entry of `.cache`; names that no call passes are left out).
- `prune_configs_by={"early_config_prune": f(configs, named_args, **kwargs), "perf_model": g(**args,
  **config), "top_k": int | float <= 1.0}`, applied on a miss: the early prune first (an empty result is
  an `AutotunerError` that names `early_config_prune`), then the perf model keeps its `top_k` best
  (a fraction of the configs left, at least one). One config left is used without timing; a single
  config in `configs` is never tuned or keyed.
- `reset_to_zero` / `restore_value`: argument names zeroed before every timed run / saved before and put
  back after every timed run (None arguments skipped); `pre_hook(args, reset_only=False)` and
  `post_hook(args, exception=...)` replace those defaults, called once each per timed run; after tuning
  the pre-hook runs once more with `reset_only=True`. A `triton.Config(pre_hook=...)` runs before every
  timed run and before every real launch.
- `do_bench(kernel_call, quantiles)` (milliseconds, as Triton's; the winner is the lowest of its results,
  compared as Triton's `min` compares them: [median, p20, p80] lists item by item, so a tie on the median
  goes to the lower p20, then p80, and a full tie to the config timed first), `warmup` / `rep` (deprecated, with
  Triton's DeprecationWarning; milliseconds of warm-up and of timed repetitions), `use_cuda_graph`
  (CUDA graphs timing on a GPU).
- `cache_results`: the store already keeps every winner across processes (`$TUNER_HOME`); True keeps
  that, an explicit False keeps winners in memory only (Triton's default behaviour). `.cache_results`
  reads what Triton's would for the same argument (False under the interpreter).
- The kernel object is an instance of `triton.runtime.Autotuner` (`_triton_launch.py`), with
  `.cache` (Triton's key tuple -> `triton.Config`; an entry put there is used for its key, emptying it
  tunes again), `.best_config` (of the last launch), `.configs` and `.keys` (the objects given, as Triton
  keeps them; assigning them acts on the next misses; changing them in place, a config's values included,
  through the kernel, from the next launch, else from the next miss: `follow_in_place_changes`), `.configs_timings`, `.bench_time`,
  `.arg_names`, `.fn` (assigned: launched from the next launch), `.base_fn`, `.warmup()`, `.run()`,
  `.prune_configs()`, `.nargs` (the positional arguments by name while a launch runs, None after it).
- `TRITON_PRINT_AUTOTUNING=1` prints what Triton prints: each config as it is timed and the choice.
- The `run` of the function beneath (`.fn.run`: the JIT function's, or a `@triton.heuristics`'s) is
  looked up at every timed run and launch, as Triton looks up `self.fn.run`: a wrapper that code puts
  there after decoration (on the instance or its class) is called.

Where tuner differs on purpose: a config whose launch raises any exception is a failed candidate (Triton
only skips out-of-resource and compile-time-assertion errors and re-raises the rest), and only when every
config failed is the first one's error raised (with a note); the winner is
stored with its key (source hash, dtypes, device, versions) and reused in later processes; an explicit
`budget=k` smaller than the number of configs times only k of them, chosen by the cost model; a function
put on Triton's `Autotuner` class in place of `run` is not called (the kernel object has a `run` of its
own; one assigned to the kernel itself is called, docs/api.md).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuner._units import ms_to_s, s_to_ms
from tuner.search_spaces import SearchSpace

from . import _jax
from ._bench import (
    BenchFn,
    TritonTiming,
    default_bench,
    is_jax_call,
    jax_waited,
    normalise_bench_result,
    triton_bench,
)
from ._decorator import Autotuned, _attach
from ._env import array_framework, signature_names, underlying_function
from ._hit import launch_args, retargetable_hit_path
from ._key import canon
from ._launcher import TRITON_KEYWORDS
from ._restore import Restorer, copy_into, immutable, snapshot
from ._sources import open_store
from ._triton_support import (
    _OPTIONS,
    _QUANTILES,
    InOrder,
    TritonCache,
    _all_kwargs,
    _autotuner_error,
    _bare,
    _budgeted_cpu_bench,
    _config_dicts,
    _emit,
    _ms_result_to_s,
    _print_enabled,
    _to_triton_config,
    _TritonKeys,
    _zero,
    launch_kwargs,
    unique_dicts,
)
from ._tuning import AllConfigsFailedError, stored_timings

if TYPE_CHECKING:  # pragma: no cover
    from ._key import CacheKey
    from ._resolve import Resolution

log = logging.getLogger(__name__)

__all__ = ["TRITON_KEYWORDS", "TritonAutotuned", "build"]


class TritonAutotuned(Autotuned):
    """`Autotuned` with triton.autotune's configs, pruning, hooks, do_bench and `.cache`, built on the
    shared hit path and resolution chain: the injected parts are the key builder (`_TritonKeys`), the
    timer (do_bench), a restorer that does nothing (the hooks restore), and a miss path that prunes
    first and times what is left in order (`InOrder`) through the chain's online tail."""

    def __init__(
        self,
        fn: Any,
        *,
        configs: Sequence[Any],
        key: Sequence[str] | Callable[..., Any],
        budget: int | None,
        storage: Any,
        restore: Sequence[str] | str = (),
        bucket: Any = "exact",
        dtypes: bool = True,
        prune_configs_by: Mapping[str, Any] | None = None,
        reset_to_zero: Sequence[str] | None = None,
        restore_value: Sequence[str] | None = None,
        pre_hook: Callable[..., Any] | None = None,
        post_hook: Callable[..., Any] | None = None,
        warmup: int | None = None,
        rep: int | None = None,
        use_cuda_graph: bool = False,
        do_bench: Callable[..., Any] | None = None,
        cache_results: bool | None = None,
        **opts: Any,
    ) -> None:
        # what `deep_copy` builds a copy from (with what code changed since)
        self._made_with: dict[str, Any] = dict(
            fn=fn, key=key, budget=budget, storage=storage, restore=(), bucket=bucket, dtypes=dtypes,
            warmup=warmup, rep=rep, use_cuda_graph=use_cuda_graph, cache_results=cache_results, **opts,
        )  # fmt: skip
        self._set_configs(configs)
        if cache_results is False:
            if storage not in (None, False):
                raise ValueError(
                    "cache_results=False keeps winners in memory only; do not also pass storage="
                )
            storage = False
        elif cache_results is True and storage is False:
            raise ValueError("cache_results=True needs a store; storage=False contradicts it")
        if do_bench is not None and opts.get("bench") is not None:
            raise ValueError("give either do_bench= (Triton's) or bench= (tuner's), not both")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"budget must be a positive int or None (time every config), got {budget!r}")
        self.user_budget = budget
        if warmup is not None or rep is not None or use_cuda_graph:
            warnings.warn(
                "warmup, rep, and use_cuda_graph parameters are deprecated. See "
                "https://github.com/triton-lang/triton/pull/4496 for details.",
                DeprecationWarning,
                stacklevel=4,
            )
        self.num_warmups = warmup
        self.num_reps = rep
        self.use_cuda_graph = bool(use_cuda_graph)
        self.user_do_bench = do_bench
        pc = dict(prune_configs_by or {})
        unknown = sorted(set(pc) - {"perf_model", "top_k", "early_config_prune"}, key=str)
        if unknown:  # Triton reads the three fields it knows and ignores the rest (Triton 1's
            # `prune_num_stages_by`, still passed by matmuls copied from it); so does the drop-in, saying so
            warnings.warn(
                f"prune_configs_by fields {unknown} are ignored, as triton.autotune ignores them; "
                "it uses perf_model, top_k and early_config_prune",
                UserWarning,
                stacklevel=4,
            )
        self.perf_model = pc.get("perf_model")
        self.configs_top_k = pc.get("top_k", 1.0)
        self.early_config_prune = pc.get("early_config_prune")
        restore = (restore,) if isinstance(restore, str) else tuple(restore)
        self.reset_to_zero = list(reset_to_zero or [])
        self.restore_value = list(restore_value or []) + [
            r for r in restore if r not in (restore_value or [])
        ]
        self.user_defined_pre_hook = pre_hook is not None
        self.user_defined_post_hook = post_hook is not None
        self.pre_hook: Callable[..., Any] = pre_hook or self._default_pre_hook
        self.post_hook: Callable[..., Any] = post_hook or self._default_post_hook
        # `.cache` of the decorated kernel: Triton's key tuple -> triton.Config, consulted on a miss
        self.triton_cache = TritonCache(self.cache_changed)
        # Triton's keys that code took out of `.cache`: tuned again at their next launch (see `retune`)
        self.retune: set[Any] = set()
        self._timings: dict[Any, Any] = {}  # `.configs_timings`
        # (stored key, {canon(config dict): the config}) of a key found in the store: `.configs_timings`
        # are read from its measurements when code reads them (never on the launch path)
        self._timings_later: tuple[CacheKey, dict[str, Any]] | None = None
        self.bench_time = 0.0
        # what Triton's Autotuner reads for the same arguments (its disk cache: off under the interpreter);
        # the store is kept or not as `cache_results` and `storage` say, above
        self.cache_results = _triton_cache_results(cache_results)
        # [the config of the last launch] (`best_config`): the hit path stores into it on every call
        self.last: list[dict[str, Any] | None] = [None]
        self._nargs_assigned: dict[str, Any] | None = None  # what code assigned to `.nargs`
        self._obj_of: dict[int, tuple[dict[str, Any], Any]] = {}  # id(config dict) -> (it, its Config)
        self._tl = threading.local()
        # held while the configs or key names are compared with what was given and set again: two threads
        # that find one change in place do not both set them, and none reads them half set
        self.follow_lock = threading.RLock()
        # code read `.configs` or `.keys` (the launcher's `_arm`): the next miss also compares the configs'
        # values and hooks, which a launch the hit path cannot key (an unhashable key value) does not
        self.deep_check_due = False
        self.named_key = not callable(key)  # Triton's key (names): `.keys`, and `.cache` is consulted
        self.key_request: tuple[str, ...] = ()
        self.key_given: Any = key  # the kernel's `.keys`: the object given, as Triton keeps it
        # what the launcher that owns this tuner does when the configs change in place: rebuild its hit path
        self.rebuilt: Callable[[], None] = lambda: None
        if not callable(key):
            self.key_request = (key,) if isinstance(key, str) else tuple(key)
            key = _keyed_names(fn, self.key_request, self.configs)
        self._bucket, self._dtypes = bucket, dtypes
        super().__init__(
            fn,
            self._pruned_space,
            key=key,
            configs=None,
            budget=budget or len(self.configs),
            storage=storage,
            bucket=bucket,
            dtypes=dtypes,
            timer=self._timer,
            restorer=Restorer(lambda a, k: []),
            **opts,
        )
        self._set_key(key)
        bad = [n for n in self.reset_to_zero + self.restore_value if n not in self.arg_names]
        if bad:
            raise ValueError(
                f"reset_to_zero/restore_value names {bad} are not parameters of {self.name} ({self.arg_names})"
            )

    # ---- configs and key: set at decoration, and again when code assigns `.configs` / `.keys` ---------
    def _after_fork(self) -> None:
        """In a forked child: a new `follow_lock` too (a parent thread that held it, reading `.configs` or
        following a change, did not come along, and the child's next miss would wait on it without end)."""
        super()._after_fork()
        self.follow_lock = threading.RLock()

    def _set_configs(self, configs: Sequence[Any]) -> None:
        if not configs:
            import triton

            configs = [triton.Config({}, num_warps=4, num_stages=3, num_ctas=1)]
        # The kernel's `.configs`, and what `early_config_prune` gets: the object given (a tuple stays a
        # tuple), as Triton keeps it; what tuning reads is a list of its configs as they were then. All
        # is computed from that list before any is set (another thread may change `configs` meanwhile).
        have = list(configs)
        objects: dict[str, Any] = {}  # this kernel's objects (see _triton_support.OBJECT_PREFIX)
        dicts = _config_dicts(have, objects)
        by_canon: dict[str, Any] = {}
        for c, d in zip(have, dicts, strict=True):
            by_canon.setdefault(canon(d), c)
        self.configs_given: Sequence[Any] = configs
        self.configs: list[Any] = have
        self._dicts, self._obj_by_canon, self.objects = dicts, by_canon, objects
        self._cfg_names = frozenset().union(*(d.keys() for d in dicts))
        # some config leaves out a key another sets: launches drop the UNSET keys (see _triton_support)
        self.irregular = any(d != launch_kwargs(d, objects) for d in dicts)
        self.has_config_hooks = _config_hooks(have)
        # what each config held then (copies), which `follow_in_place_changes` compares with what it holds
        self._values = [_config_values(c, copy=True) for c in have]

    def _set_key(self, key: Sequence[str] | Callable[..., Any]) -> None:
        self.keys = _TritonKeys(
            name=self.name,
            kind=self.kind,
            source_hash=lambda: self.source_hash,
            arg_names=self.arg_names,
            defaults=self.defaults,
            key=key,
            bucket=self._bucket,
            dtypes=self._dtypes,
            positional=self.positional,
        )
        self.key_names = list(self.keys.key_names)

    def reconfigure(self, configs: Sequence[Any]) -> None:
        """`kernel.configs = [...]`: the next misses prune and time these. As Triton, a key already
        resolved keeps its config (in memory and in `.cache`), except that a single config is used for
        every key; a stored winner that is not among these is not used (the store validates it)."""
        with self.follow_lock:
            # a single config was never put in `.cache`: Triton tunes its keys
            single = len(self.configs) == 1
            self._set_configs(configs)
            self._obj_of.clear()
            if self.user_budget is None:
                self._budget = len(self.configs)
            if self.named_key:
                self._set_key(_keyed_names(self.fn, self.key_request, self.configs))
            if single or len(self.configs) == 1:
                self.forget()

    def follow_in_place_changes(self, deep: bool = True) -> bool:
        """Code that changed in place what Triton reads at every launch: the configs given
        (`k.configs.append(c)`, the caller's own list, an `early_config_prune` that sorts the list it
        gets), a config's `pre_hook` (`k.configs[0].pre_hook = f`), a config's values
        (`k.configs[0].kwargs["BLOCK"] = 64`, `cfg.num_warps = 8`: the keys resolved before read theirs
        from `.cache` again) or the key names given (`k.keys.append("K")`). Reconfigure (`reconfigure`)
        or key again (`rekey`) for them, and have the launcher rebuild its hit paths (`rebuilt`), which
        every launcher of the kernel then follows, the running launch included. Checked on a miss, and on the next launch after code read `.configs` or
        `.keys` (the launcher's armed check); never on another hit. Returns whether anything changed.

        Under `follow_lock`: a thread that finds a change while another is setting one waits for it,
        then compares with what it set. `deep=False` (a launch of a key already tuned that the hit path cannot
        key: an unhashable key value) compares the list and the key names only, not each config's values
        and hooks (a cost that grows with the configs, on a path that such a launch takes every time)."""
        with self.follow_lock:
            given, have = self.configs_given, self.configs
            configs = len(given) != len(have) or any(a is not b for a, b in zip(given, have, strict=True))
            deep = deep or self.deep_check_due
            if deep:
                self.deep_check_due = False
            # a config's values set in place (`cfg.kwargs["BLOCK"] = 64`, `cfg.kwargs = {...}`,
            # `cfg.num_warps = 8`, a dict config's item): Triton launches a config with what it holds then
            values = (
                deep
                and not configs
                and any(_config_values(c) != v for c, v in zip(have, self._values, strict=True))
            )
            # a config given a pre_hook in place: launches run it from now on (a ConfigLaunch)
            hooks = deep and not configs and not self.has_config_hooks and _config_hooks(have)
            names = None
            if self.named_key:
                k = self.key_given
                names = (k,) if isinstance(k, str) else tuple(k)
                if names == self.key_request:
                    names = None
            if not (configs or values or hooks or names is not None):
                return False
            if names is not None:
                self.key_request = names
            if configs or values or hooks:
                self.reconfigure(given)  # keys again by `key_request`
            if values:  # the keys resolved before read their configs (in `.cache`) again, as they are now
                self.forget()
            if names is not None:
                self._set_key(_keyed_names(self.fn, self.key_request, self.configs))
                self.forget()
            self.rebuilt()
            return True

    def rekey(self, names: Sequence[str] | str) -> None:
        """`kernel.keys = [...]`: later calls are keyed by these argument names (Triton's `.keys`)."""
        if not self.named_key:
            raise TypeError(f"{self.name} is keyed by a function; its key names cannot be assigned")
        with self.follow_lock:
            self.key_request = (names,) if isinstance(names, str) else tuple(names)
            self.key_given = names
            self._set_key(_keyed_names(self.fn, self.key_request, self.configs))
            self.forget()

    def forget(self) -> None:
        """Forget the configs resolved in memory (the hit path's and the general key's), not `.cache`."""
        Autotuned.cache_clear(self)

    def cache_changed(self, removed: Iterable[Any]) -> None:
        """Code changed `.cache` (`TritonCache`): the keys it took out are tuned again at their next
        launch, as on Triton, whose `.cache` is the only memory of a tuning: their store entries are
        not read for that (nor deleted: a new winner is stored as any tuning's is, and the faster of
        the two is kept). Then everything resolved in memory is forgotten, so the next calls read
        `.cache` again."""
        self.retune.update(removed)
        self.forget()

    def retune_requested(self, args: tuple, kwargs: dict) -> bool:
        if not self.retune or not self.named_key:
            return False
        try:
            return self.triton_key(args, kwargs) in self.retune
        except TypeError:  # an unhashable key value: never in `.cache`
            return False

    # ---- what the chain's tuning reads: budget and strategy of this thread's request -----------------
    @property  # type: ignore[override]
    def budget(self) -> int:
        pruned = getattr(self._tl, "pruned", None)
        if pruned is None:
            return self._budget
        return len(pruned) if self.user_budget is None else min(self.user_budget, len(pruned))

    @budget.setter
    def budget(self, value: int) -> None:
        self._budget = value

    @property  # type: ignore[override]
    def strategy(self) -> Any:
        pruned = getattr(self._tl, "pruned", None)
        if pruned is None or (self.user_budget is not None and self.user_budget < len(pruned)):
            return self._strategy  # opt-in: the strategy (cost model) picks which configs to time
        order = unique_dicts(self.dicts_of(pruned), self.objects)
        return InOrder(SearchSpace.from_configs(order), order, seed=self.seed)

    @strategy.setter
    def strategy(self, value: Any) -> None:
        self._strategy = value

    # ---- `.nargs` -------------------------------------------------------------------------------------
    @property
    def nargs(self) -> dict[str, Any] | None:
        """Triton's `Autotuner.nargs`: the positional arguments, by parameter name, of the launch (or
        `.warmup`) of this kernel that is running in this thread, as Triton sets them at the start of
        `run` (a prune function, perf model, hook or grid function may read them); None between
        launches (or what code assigned, see the setter). Found when read (`launch_args`): a launch
        stores nothing for it, and keeps no argument past its end."""
        args = launch_args(self.last)
        if args is None:
            args = getattr(self._tl, "warmup_args", None)
        if args is not None:
            return self.positional_args(args)
        return self._nargs_assigned

    @nargs.setter
    def nargs(self, value: dict[str, Any] | None) -> None:
        """Code that assigns `.nargs` (as Triton's own methods do) reads it back outside launches until
        it assigns another value or None; inside a launch the launch's arguments win."""
        self._nargs_assigned = value

    # ---- hooks ---------------------------------------------------------------------------------------
    def _default_pre_hook(self, kwargs: dict[str, Any], reset_only: bool = False) -> None:
        # A jax array is skipped: nothing writes it in place, so there is nothing to zero or put back
        # (a Pallas launcher ported from Triton that kept `reset_to_zero=["out"]` still tunes).
        for name in self.reset_to_zero:
            v = kwargs.get(name)
            if v is not None and not immutable(v):
                _zero(v)
        if not reset_only:  # per thread: two threads may tune two keys at once
            self._tl.restore_copies = {
                n: snapshot(v)
                for n in self.restore_value
                if (v := kwargs.get(n)) is not None and not immutable(v)
            }

    def _default_post_hook(self, kwargs: dict[str, Any], exception: BaseException | None = None) -> None:
        for name, saved in getattr(self._tl, "restore_copies", {}).items():
            copy_into(kwargs[name], saved)
        self._tl.restore_copies = {}

    def meta(self, kwargs: dict, grid: Any) -> dict[str, Any]:
        """The keyword arguments Triton's Autotuner sees (it gets grid= and warmup= among them)."""
        if self.kind == "triton":
            return {**kwargs, "grid": grid, "warmup": False}
        return dict(kwargs)

    def full_nargs(self, args: tuple, kwargs: dict, grid: Any, cfg_obj: Any) -> dict[str, Any]:
        return {
            **self.positional_args(args),
            **self.meta(kwargs, grid),
            **_all_kwargs(cfg_obj),
        }

    # ---- configs -------------------------------------------------------------------------------------
    def config_obj(self, cfg: Mapping[str, Any]) -> Any:
        """The triton.Config (or dict) the user gave for a runtime config dict."""
        # through items(): `dict(cfg)` of a record mode's CountingConfig would count a call of its key
        plain = dict(cfg.items())
        k = canon(plain)
        c = self._obj_by_canon.get(k)
        if c is None:
            c = self._obj_by_canon[k] = (
                _to_triton_config(plain, self.objects) if self.kind == "triton" else plain
            )
        return c

    def split_config(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        """The config part of a launch's keyword arguments."""
        return {k: v for k, v in kw.items() if k in self._cfg_names}

    def triton_key(self, args: tuple, kwargs: dict) -> tuple:
        """Triton's key: the values of the key arguments, then str(dtype) of every array argument."""
        all_args = {**self.positional_args(args), **kwargs}
        named = {k: v for k, v in all_args.items() if k in self.arg_names}
        key: list[Any] = [named[k] for k in self.key_names if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(key)

    def prune(self, args: tuple, kwargs: dict, grid: Any) -> list[Any]:
        """Triton's prune_configs: early_config_prune, then the perf model's top_k (a fraction counts the
        configs left by the early prune; at least one is kept)."""
        return self.prune_named(self.positional_args(args), self.meta(kwargs, grid))

    def prune_named(self, nargs: dict[str, Any], kw: dict[str, Any]) -> list[Any]:
        """`prune` with the positional arguments by name and the keywords as the prune functions get them
        (Triton's `Autotuner.prune_configs(kwargs)` with `nargs`)."""
        self.follow_in_place_changes()  # `.warmup()` and `.prune_configs()` too read the configs as they are
        pruned = list(self.configs)
        if self.early_config_prune is not None:
            pruned = list(self.early_config_prune(self.configs_given, nargs, **kw) or [])
            if not pruned:
                raise _autotuner_error(
                    "No valid autotuner configs after pruning. `early_config_prune` should return at least one config."
                )
        if self.perf_model is not None:
            top_k = self.configs_top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = max(1, int(len(pruned) * top_k))
            elif isinstance(top_k, bool) or not isinstance(top_k, int):
                raise TypeError(
                    "Error while pruning configs, top_k must be either 1) a float <= 1.0 or 2) an int"
                )
            if len(pruned) > top_k:
                est = [self.perf_model(**nargs, **kw, **_all_kwargs(c)) for c in pruned]
                order = sorted(range(len(pruned)), key=lambda i: est[i])
                pruned = [pruned[i] for i in order[: max(1, top_k)]]
        for c, d in zip(pruned, self.dicts_of(pruned), strict=True):
            self._obj_by_canon.setdefault(canon(d), c)
        return pruned

    def dicts_of(self, configs: Sequence[Any]) -> list[dict[str, Any]]:
        """The runtime dicts of `configs` (some of `self.configs`, or configs an early prune made), with
        the keys of `self.configs`' dicts."""
        have = self.configs  # read once: another thread may set it meanwhile
        return _config_dicts(list(have) + list(configs), self.objects)[len(have) :]

    def _pruned_space(self, *args: Any, **kwargs: Any) -> SearchSpace:
        pruned = getattr(self._tl, "pruned", None) or self.configs
        return SearchSpace.from_configs(unique_dicts(self.dicts_of(pruned), self.objects))

    # ---- the injected timer, the benched target ------------------------------------------------------
    def _timer(self, args: tuple, kwargs: dict, device: str) -> BenchFn:
        bench = self._raw_timer(args, kwargs, device)
        timings = self._tl.timings  # this tuning's; `.configs_timings` once it ends, as Triton's

        def timed(call: Callable[[], Any]) -> Any:
            try:
                res = bench(call)
            except Exception as exc:
                if getattr(self._tl, "first_error", None) is None:
                    self._tl.first_error = exc
                raise
            cur = getattr(self._tl, "current", None)
            if cur is not None:
                # What Triton's timer (a do_bench) returned, as Triton keeps it: one number, or its
                # [median, p20, p80]; tuner's own timers give (median, spread) only.
                if not isinstance(res, TritonTiming):
                    entry: Any = _timing_ms(*normalise_bench_result(res))
                else:
                    entry = res.raw if isinstance(res.raw, (list, tuple)) else float(res.raw)
                timings[_timing_key(self.config_obj(cur))] = entry
            return res

        return timed

    # ---- `.configs_timings`: this process's last tuning, or the store's timings of a key it found ----
    @property
    def configs_timings(self) -> dict[Any, Any]:
        later = self._timings_later
        if later is not None:
            self._timings_later = None
            self._timings = self._read_timings(*later)
        return self._timings

    @configs_timings.setter
    def configs_timings(self, value: dict[Any, Any]) -> None:
        self._timings, self._timings_later = value, None

    def _read_timings(self, ck: CacheKey, objs: dict[str, Any]) -> dict[Any, Any]:
        """The timings the store keeps of the newest tuning of exactly `ck`, keyed as a tuning here keys
        them: the configs of `objs` (what this call would have timed), in milliseconds."""
        db = open_store(self.storage, create=False)
        if db is None:
            return {}
        out: dict[Any, Any] = {}
        for cfg, med, spread, quantiles in stored_timings(db, self.name, ck):
            obj = objs.get(canon(cfg))
            if obj is not None:
                out[_timing_key(obj)] = _timing_ms(med, spread, quantiles)
        return out

    def _note(self, ck: CacheKey, res: Resolution) -> None:
        super()._note(ck, res)
        self._tl.noted = (ck, res)  # where `_resolve_triton`'s winner came from

    def _found(self, pruned: list[Any]) -> None:
        """A lookup gave the call's winner: as Triton's disk cache, `.configs_timings` become the timings
        the store measured for the key (read when code reads them), or `{}` for a shipped file, which
        holds only winners; a winner this process resolved before leaves them."""
        noted = getattr(self._tl, "noted", None)
        if noted is None:
            return
        ck, res = noted
        if res.hit == "store" or res.stat == "waited":
            objs = {canon(d): self.config_obj(d) for d in self.dicts_of(pruned)}
            self._timings, self._timings_later = {}, (ck, objs)
        elif res.hit not in (None, "in memory"):
            self.configs_timings = {}

    def _ms_timer(self, do_bench: Callable[[Callable[[], Any]], Any]) -> BenchFn:
        """A timer of Triton's kind (milliseconds: a number, or [median, p20, p80]) as tuner's, keeping
        what it returned (`TritonTiming.raw`): for `.configs_timings` (`timed`), as Triton keeps it, and
        for the choice of the winner, which Triton makes on it (`_tuning._winner`)."""

        def timer(call: Callable[[], Any]) -> TritonTiming:
            raw = do_bench(call)
            return TritonTiming(_ms_result_to_s(raw), raw)

        return timer

    def _raw_timer(self, args: tuple, kwargs: dict, device: str) -> BenchFn:
        user = self.user_do_bench
        if user is not None:
            if is_jax_call(self.kind, array_framework(list(args) + list(kwargs.values()))):
                # jax dispatches asynchronously and a do_bench written for Triton syncs torch's
                # device, not jax's: its `kernel_call` returns once the launcher's result is ready
                return self._ms_timer(lambda call: user(jax_waited(call), quantiles=_QUANTILES))
            return self._ms_timer(lambda call: user(call, quantiles=_QUANTILES))
        gpu = device != "cpu"
        if self.use_cuda_graph and gpu:
            from triton.testing import do_bench_cudagraph

            rep = self.num_reps if self.num_reps is not None else 100
            return self._ms_timer(lambda call: do_bench_cudagraph(call, rep=rep, quantiles=list(_QUANTILES)))
        if self.num_warmups is not None or self.num_reps is not None:
            warm = self.num_warmups if self.num_warmups is not None else 25
            rep = self.num_reps if self.num_reps is not None else 100
            if is_jax_call(self.kind, array_framework(list(args) + list(kwargs.values()))):
                # on any device: do_bench's CUDA events time torch's stream, not jax's
                return lambda call: _budgeted_cpu_bench(call, ms_to_s(warm), ms_to_s(rep), jax=True)
            if gpu:
                from triton.testing import do_bench

                return self._ms_timer(
                    lambda call: do_bench(call, warmup=warm, rep=rep, quantiles=list(_QUANTILES))
                )
            return lambda call: _budgeted_cpu_bench(call, ms_to_s(warm), ms_to_s(rep))
        if self.use_cuda_graph:
            log.info("%s: use_cuda_graph needs a CUDA device; timing with the default timer", self.name)
        if self.bench is not None:
            return self.bench
        timer = default_bench(self.kind, array_framework(list(args) + list(kwargs.values())), device)
        if timer is triton_bench:  # Triton's own default, do_bench: its quantiles kept, as Triton keeps them
            from triton.testing import do_bench as triton_do_bench

            return self._ms_timer(lambda call: triton_do_bench(call, quantiles=list(_QUANTILES)))
        return timer

    def _bench_target(
        self, args: tuple, kwargs: dict, grid: Any, target: Callable[..., Any]
    ) -> Callable[..., Any]:
        """What the chain's tuning times: the launch with Triton's hooks around it."""
        verbose = _print_enabled()
        printed: set[str] = set()
        name = self.base_name
        target = _bare(target)  # the launch without the hit path's own config hook and best_config note

        def kernel_call(*a: Any, **kw: Any) -> Any:
            cfg = self.split_config(kw)
            cobj = self.config_obj(cfg)
            self._tl.current = cfg
            if not self._tl.benched:  # Triton's bench_time counts the timing, not a wait for another
                self._tl.benched, self._tl.bench_t0 = True, time.time()  # process's tuning of the key
            if verbose and canon(cfg) not in printed:
                printed.add(canon(cfg))
                _emit(f"Autotuning kernel {name} with config {cobj}")
            full = self.full_nargs(args, kwargs, grid, cobj)
            hook = getattr(cobj, "pre_hook", None)
            if hook is not None:
                hook(full)
            self.pre_hook(full)
            try:
                out = target(*a, **(launch_kwargs(kw, self.objects) if self.irregular else kw))
            except Exception as exc:
                if verbose:
                    _emit(f"Autotuning failed with {exc}")
                try:
                    self.post_hook(full, exception=exc)
                finally:
                    raise  # noqa: B012 - Triton re-raises the kernel's error after the post-hook
            self.post_hook(full, exception=None)
            return out

        return kernel_call

    @property
    def base_name(self) -> str:
        return str(getattr(underlying_function(self.fn), "__name__", self.name))

    # ---- the miss path -------------------------------------------------------------------------------
    def miss(self, args: tuple, kwargs: dict, fast_key: Any, target: Callable[..., Any]) -> dict[str, Any]:
        # inside a jax trace, as `Autotuned`'s: a traced key value refused, the config resolved on stand-ins
        # (untimed where they cannot time it), before any pruning or hook runs here in the caller's trace
        traced = self.miss_if_traced(args, kwargs, fast_key, target)
        if traced is not None:
            return traced
        # a launch that the hit path cannot key (an unhashable key value) comes here at every call: the
        # configs' values and hooks are compared only where the key is not known (a real miss), or once
        # code read `.configs`/`.keys`
        if self.follow_in_place_changes(deep=False) and fast_key is not None:
            fast_key = self._fast_key(args)  # the hit's was of the key before the change
        cfg = self._known(args, kwargs, fast_key)
        if cfg is None and self.follow_in_place_changes(deep=True):
            if fast_key is not None:
                fast_key = self._fast_key(args)
            cfg = self._known(args, kwargs, fast_key)
        if cfg is None:
            cfg = self._resolve_triton(args, kwargs, fast_key, target)
        self.last[0] = cfg
        if len(self.configs) > 1:
            with contextlib.suppress(TypeError):  # an unhashable key value: keep serving
                tk = self.triton_key(args, kwargs)
                # the object `.cache` gave for this call's config, if it did (not `best_config()`, which
                # another thread's launch may have changed since)
                self.triton_cache.put(tk, self._obj_for(cfg))
                self.retune.discard(tk)  # in `.cache` again
        return cfg

    def _fast_key(self, args: tuple) -> Any:
        """The hit path's key of a positional call (None where it has none, or it is unhashable)."""
        try:
            fk = self.keys.fast[len(args)]
            if fk is None:
                return None
            key = fk(args)
            hash(key)
        except (TypeError, IndexError, AttributeError):
            return None
        return key

    def _known(self, args: tuple, kwargs: dict, fast_key: Any) -> dict[str, Any] | None:
        """A config this process already chose for the call's key, or one that code put in `.cache`
        (no pruning, as Triton's cache)."""
        if fast_key is None:
            try:
                gk = self.keys.general(args, kwargs)
            except TypeError:
                gk = None
            if gk is not None and gk in self.mem:
                return self.mem[gk]
        if len(self.configs) == 1:
            return None
        cfg = None
        if self.named_key and self.triton_cache:
            with contextlib.suppress(TypeError):
                obj = self.triton_cache.get_typed(self.triton_key(args, kwargs))
                if obj is not None:
                    cfg = self.dicts_of([obj])[0]
                    chosen = self.by_hash.get(self.keys.full(args, kwargs).hash)
                    if chosen is not None and self._obj_for(chosen) is obj:
                        # this process's own choice for the key, still in `.cache`: that very dict (in
                        # record mode it counts the key's calls, launched by keyword too)
                        cfg = chosen
                    elif self._obj_by_canon.setdefault(canon(cfg), obj) is not obj:
                        # another config of the same values (configs that an early prune or code made
                        # equal in place): its `best_config` is still this object, as Triton's
                        self._obj_of[id(cfg)] = (cfg, obj)
                    self._remember(args, kwargs, fast_key, cfg)
                    return cfg
        cfg = self.by_hash.get(self.keys.full(args, kwargs).hash)
        if cfg is not None:
            self._remember(args, kwargs, fast_key, cfg)  # a call with keywords: under the general key
        return cfg

    def best_config(self) -> Any:
        """The triton.Config of the last launch (None before the first)."""
        cfg = self.last[0]
        return None if cfg is None else self._obj_for(cfg)

    def _obj_for(self, cfg: dict[str, Any]) -> Any:
        """The triton.Config (or dict) of a runtime config dict: the object `.cache` gave for it, if it
        did, else the one given with the same values."""
        seen = self._obj_of.get(id(cfg))
        if seen is not None and seen[0] is cfg:
            return seen[1]
        obj = self.config_obj(cfg)
        self._obj_of[id(cfg)] = (cfg, obj)
        return obj

    def set_best_config(self, value: Any) -> None:
        """Code assigned `.best_config` (Triton's is a plain attribute: a replacement `run`, such as vLLM's
        first-config launcher, sets it after its launch): reads give `value` until the next launch."""
        cfg: dict[str, Any] = {}  # a record of its own (the next launch replaces it in `last`)
        if callable(getattr(value, "all_kwargs", None)) or isinstance(value, Mapping):
            cfg = self.dicts_of([value])[0]
        self._obj_of[id(cfg)] = (cfg, value)
        self.last[0] = cfg

    def _resolve_triton(
        self, args: tuple, kwargs: dict, fast_key: Any, target: Callable[..., Any]
    ) -> dict[str, Any]:
        if len(self.configs) == 1:  # Triton neither prunes nor times a single config
            cfg = dict(self._dicts[0])
            self._remember(args, kwargs, fast_key, cfg)
            return cfg
        clash = sorted(set(kwargs) & self._cfg_names)
        if clash:
            raise ValueError(
                f"Conflicting meta-parameters: {', '.join(clash)}. Make sure that you don't re-define auto-tuned symbols."
            )
        grid = target.keywords.get("grid") if isinstance(target, functools.partial) else None
        pruned = self.prune(args, kwargs, grid)
        if len(pruned) == 1:  # nothing to compare: used without timing, not stored
            cfg = self.dicts_of(pruned)[0]
            self._remember(args, kwargs, fast_key, cfg)
            return cfg
        self._tl.pruned, self._tl.benched, self._tl.current = pruned, False, None
        self._tl.first_error, self._tl.timings, self._tl.noted = None, {}, None
        try:
            cfg = super().miss(args, kwargs, fast_key, self._bench_target(args, kwargs, grid, target))
        except AllConfigsFailedError as exc:
            first = self._tl.first_error
            if _jax.on_stand_ins() and _jax.untimeable_reason(exc.errors) is not None:
                raise  # the stand-ins of a trace cannot time it: chosen untimed (`Autotuned._traced_miss`)
            if first is None and _all_infinite(self._tl.timings):
                # every config ran and timed inf (a do_bench that says so): Triton's min() of its timings
                # is then the first config timed, which it launches and puts in `.cache`; not stored here
                log.warning(
                    "%s: every config timed inf; using the first, as Triton does (%s)", self.name, exc
                )
                cfg = self.dicts_of(pruned)[0]
                self._remember(args, kwargs, fast_key, cfg)
            elif first is None:
                raise
            else:
                # Triton raises the first config's error; so does the drop-in once no config is left
                first.add_note(f"tuner: {exc}")
                raise first from None
        finally:
            self._tl.pruned = self._tl.first_error = None
        if self._tl.benched:  # tuned here: Triton resets once more, and prints the choice
            self.bench_time = time.time() - self._tl.bench_t0
            self.configs_timings = self._tl.timings
            cobj = self.config_obj(cfg)
            self.pre_hook(self.full_nargs(args, kwargs, grid, cobj), reset_only=True)
            if _print_enabled():
                _emit(
                    f"Triton autotuning for function {self.base_name},\nwith key as {self.triton_key(args, kwargs)},\n"
                    f"finished after {self.bench_time:.2f}s,\nbest config selected: {cobj};"
                )
        else:
            self._found(pruned)
        return cfg

    def _remember(self, args: tuple, kwargs: dict, fast_key: Any, cfg: dict[str, Any]) -> None:
        if fast_key is None:
            with contextlib.suppress(TypeError):
                fast_key = self.keys.general(args, kwargs)
        if fast_key is not None:
            self.mem[fast_key] = cfg

    def deep_copy(self, memo: dict[int, Any]) -> TritonAutotuned:
        """A tuner of its own for `copy.deepcopy` of the kernel (a model copied with the kernel it holds),
        as a deep copy of Triton's Autotuner is: the decoration's options with what code changed since
        (configs, keys, hooks, pruning, do_bench), and copies of `.cache`, of the configs resolved in
        memory and of the last tuning's timings. The JIT function, the store and the functions given
        (hooks, perf model, do_bench) are shared, as deepcopy shares functions."""
        # built on the function decorated, whose parameters the key and hooks name; a function that code
        # assigned to `.fn` since (a wrapper whose `run` takes `*args, **kwargs`) is then assigned to the
        # copy, as Triton's copy keeps its `.fn`, `.arg_names` and `.keys`
        made = dict(self._made_with)
        if self.named_key:
            made["key"] = copy.deepcopy(self.key_given, memo)

        def own(hook: Any) -> bool:  # the default hooks are bound to this tuner: the copy makes its own
            return getattr(hook, "__self__", None) is self

        with warnings.catch_warnings():  # warmup/rep/use_cuda_graph were warned about at decoration
            warnings.simplefilter("ignore", DeprecationWarning)
            new = TritonAutotuned(
                configs=copy.deepcopy(self.configs_given, memo),
                prune_configs_by={
                    "perf_model": self.perf_model,
                    "top_k": self.configs_top_k,
                    "early_config_prune": self.early_config_prune,
                },
                reset_to_zero=list(self.reset_to_zero),
                restore_value=list(self.restore_value),
                pre_hook=None if own(self.pre_hook) else self.pre_hook,
                post_hook=None if own(self.post_hook) else self.post_hook,
                do_bench=self.user_do_bench,
                **made,
            )
        new._made_with = self._made_with
        if self.fn is not made["fn"]:
            new.replace_fn(self.fn)
        new.user_budget, new._budget = self.user_budget, self._budget
        new.user_defined_pre_hook = self.user_defined_pre_hook
        new.user_defined_post_hook = self.user_defined_post_hook
        dict.update(new.triton_cache, copy.deepcopy(dict(self.triton_cache), memo))
        new.retune = set(self.retune)
        new.mem.update({k: dict(v) for k, v in self.mem.items()})
        new.by_hash.update({k: dict(v) for k, v in self.by_hash.items()})
        new.last[0] = None if self.last[0] is None else dict(self.last[0])
        new._timings = copy.deepcopy(self._timings, memo)
        new._timings_later = self._timings_later
        new.bench_time = self.bench_time
        new._nargs_assigned = self._nargs_assigned
        return new

    def cache_clear(self) -> None:
        """tuner's `cache_clear`: forget what this process resolved (`.cache` too) and read the store
        again; unlike `.cache.clear()`, which makes the keys tune again, as Triton's does."""
        dict.clear(self.triton_cache)
        self.retune.clear()
        self.forget()


def _config_hooks(configs: Sequence[Any]) -> bool:
    """Whether any of `configs` has a pre_hook of its own."""
    return any(getattr(c, "pre_hook", None) is not None for c in configs)


def _config_values(c: Any, copy: bool = False) -> Any:
    """What a launch reads of config `c` besides its pre_hook: a dict config's items; a `triton.Config`'s
    kwargs and launch options. With `copy`, a copy to keep; else what it holds, which compares equal to
    that copy until code changes it (no copy made: `follow_in_place_changes` runs it on every miss)."""
    if isinstance(c, Mapping):
        return dict(c) if copy or type(c) is not dict else c
    kwargs = getattr(c, "kwargs", None)
    return (
        dict(kwargs) if copy and isinstance(kwargs, Mapping) else kwargs,
        *(getattr(c, name, None) for name in _OPTIONS),
    )


def _triton_cache_results(given: bool | None) -> bool:
    """`.cache_results` as Triton's Autotuner sets it for the same argument: `(cache_results or
    knobs.autotuning.cache) and not knobs.runtime.interpret` (Triton's knobs, which its environment
    variables set, read at decoration); without triton loaded (a plain callable), the argument."""
    if "triton" not in sys.modules:
        return bool(given)
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover - a triton without knobs (older than any supported)
        return bool(given)
    return bool((given or knobs.autotuning.cache) and not knobs.runtime.interpret)


def _all_infinite(timings: Mapping[Any, Any]) -> bool:
    """Whether a tuning's `.configs_timings` are all there and all infinite (or NaN): every config ran."""
    firsts = [t[0] if isinstance(t, (list, tuple)) and t else t for t in timings.values()]
    return bool(firsts) and all(isinstance(t, (int, float)) and not math.isfinite(t) for t in firsts)


def _timing_key(obj: Any) -> Any:
    """A config's key in `.configs_timings`: the triton.Config; a dict config by its items."""
    return tuple(obj.items()) if isinstance(obj, Mapping) else obj


def _timing_ms(med: float, spread: float, quantiles: tuple[float, float] | None = None) -> list[float]:
    """A config's entry in `.configs_timings` from its median and spread (seconds), or its p20 and p80
    where the timer gave them: Triton's quantiles (median, low, high) in milliseconds."""
    low, high = quantiles if quantiles is not None else (med - spread / 2, med + spread / 2)
    return [s_to_ms(med), s_to_ms(low), s_to_ms(high)]


def _keyed_names(fn: Any, key: tuple[str, ...], configs: Sequence[Any]) -> list[str]:
    """The names of `key` that Triton's key can hold: a name that is no parameter of the kernel is
    ignored with a warning (Triton ignores it silently), and so is a parameter that the configs or a
    `@triton.heuristics` beneath the autotuner supply, which no call passes (Triton skips them too)."""
    arg_names, _ = signature_names(fn)
    supplied: set[str] = set()
    for c in configs:
        supplied.update(c.keys() if isinstance(c, Mapping) else getattr(c, "kwargs", {}))
    inner, depth = fn, 0
    while inner is not None and depth < 10:  # Heuristics(values=...) -> ... -> JITFunction -> function
        values = getattr(inner, "values", None)
        if isinstance(values, Mapping):
            supplied.update(values)
        inner, depth = getattr(inner, "fn", None), depth + 1
    unknown = [n for n in key if n not in arg_names]
    if unknown:
        warnings.warn(
            f"autotune key names {unknown} are not parameters of {getattr(fn, '__name__', fn)} "
            f"({arg_names}); they are ignored, as triton.autotune ignores them",
            UserWarning,
            stacklevel=5,
        )
    return [n for n in key if n in arg_names and n not in supplied]


def build(fn: Any, triton_kw: dict[str, Any], **opts: Any) -> Any:
    """The decorated object for `fn`: a TritonAutotuner for a Triton kernel, else the shared hit path as a
    function with `.cache`, `.configs` and `.tuner` attached."""
    t = TritonAutotuned(fn, **triton_kw, **opts)
    if t.kind == "triton":  # triton is imported: the kernel object subclasses its Autotuner
        from ._triton_launch import InterpretedTritonAutotuner, TritonAutotuner, interpreted

        return InterpretedTritonAutotuner(t) if interpreted(t.fn) else TritonAutotuner(t)

    def target() -> Callable[..., Any]:
        # configs of which some leave a key UNSET that others set: the call leaves it out (decided again
        # whenever the configs change in place, `rebuilt`); else the function itself, no extra frame
        if not t.irregular:
            return t.fn

        def stripped(*args: Any, **kw: Any) -> Any:
            return t.fn(*args, **launch_kwargs(kw, t.objects))

        return stripped

    hit, retarget = retargetable_hit_path(target(), t.keys.fast, t.mem, t.miss)
    # the configs or key names changed in place: the hit path calls and keys by the new ones from then on
    t.rebuilt = lambda: retarget(target(), t.keys.fast)
    w = _attach(hit, t)
    w.cache = t.triton_cache
    w.configs = t.configs_given
    return w
