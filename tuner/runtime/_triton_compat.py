"""`tuner.autotune` as a drop-in for `triton.autotune`: every keyword of `triton.autotune` (triton 3.7)
with Triton's semantics, on top of the runtime's cache, store and key.

What Triton does, and so what this does (see triton/runtime/autotuner.py):
- `configs` (an empty list means one default config), `key` (argument names whose values, plus the
  dtypes of all array arguments, select an entry of `.cache`).
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
- `do_bench(kernel_call, quantiles)` (milliseconds, as Triton's), `warmup` / `rep` (deprecated, with
  Triton's DeprecationWarning; milliseconds of warm-up and of timed repetitions), `use_cuda_graph`
  (CUDA graphs timing on a GPU).
- `cache_results`: the store already keeps every winner across processes (`$TUNER_HOME`); True keeps
  that, an explicit False keeps winners in memory only (Triton's default behaviour).
- `.cache` (Triton's key tuple -> `triton.Config`), `.best_config` (the config of the last launch),
  `.configs`, `.configs_timings`, `.bench_time`, `.keys`, `.arg_names`, `.fn`, `.base_fn`, `.warmup()`.
- `TRITON_PRINT_AUTOTUNING=1` prints what Triton prints: each config as it is timed and the choice.

Where tuner differs on purpose: a config whose launch raises any exception is a failed candidate (Triton
only skips out-of-resource and compile-time-assertion errors and re-raises the rest); the winner is
stored with its key (source hash, dtypes, device, versions) and reused in later processes; an explicit
`budget=k` smaller than the number of configs times only k of them, chosen by the cost model.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from tuner.search_spaces import SearchSpace

from ._bench import BenchFn, cpu_bench, normalise_bench_result
from ._decorator import Autotuned, _copy_into, _make_wrapper, _snapshot, _triton_configs_to_dicts
from ._entry import CacheEntry, EntryError, now_iso
from ._env import underlying_function
from ._key import CacheKey, canon

log = logging.getLogger(__name__)

__all__ = ["TRITON_KEYWORDS", "TritonAutotuned", "TritonAutotuner", "build"]

# The keywords of triton.autotune beyond configs and key.
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
_QUANTILES = (0.5, 0.2, 0.8)


def _all_kwargs(c: Any) -> dict[str, Any]:
    if isinstance(c, Mapping):
        return dict(c)
    return dict(c.all_kwargs())


def _config_dict(c: Any) -> dict[str, Any]:
    """The runtime's dict for one triton.Config (kwargs + num_warps + num_stages [+ num_ctas/maxnreg])."""
    return _config_dicts([c])[0]


def _config_dicts(configs: Sequence[Any]) -> list[dict[str, Any]]:
    proxies = [
        c
        if isinstance(c, Mapping)
        else SimpleNamespace(
            kwargs=c.kwargs,
            num_warps=c.num_warps,
            num_stages=c.num_stages,
            num_ctas=getattr(c, "num_ctas", 1),
            maxnreg=getattr(c, "maxnreg", None),
            pre_hook=None,
        )
        for c in configs
    ]
    return _triton_configs_to_dicts(proxies)


def _to_triton_config(d: Mapping[str, Any]) -> Any:
    import triton

    d = dict(d)
    opts = {k: d.pop(k) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in d}
    return triton.Config(d, **opts)


def _ms_result_to_s(res: Any) -> tuple[float, float]:
    """A do_bench result (ms: a number, or [median, p20, p80]) -> (median s, spread s)."""
    if isinstance(res, (list, tuple)):
        return normalise_bench_result([float(x) / 1e3 for x in res])
    return float(res) / 1e3, 0.0


def _zero(v: Any) -> None:
    if hasattr(v, "zero_"):
        v.zero_()
    else:
        v.fill(0)


def _print_enabled() -> bool:
    try:
        from triton import knobs

        return bool(knobs.autotuning.print)
    except Exception:  # noqa: BLE001 - no triton: read the variable as triton does
        import os

        return os.environ.get("TRITON_PRINT_AUTOTUNING", "0").lower() in ("1", "true", "on", "yes")


def _emit(text: str) -> None:
    """TRITON_PRINT_AUTOTUNING output: to stdout, as Triton prints it (only when the user asks for it)."""
    sys.stdout.write(text + "\n")


def _autotuner_error(msg: str) -> Exception:
    try:
        from triton.runtime.errors import AutotunerError

        return AutotunerError(msg)
    except ImportError:
        return RuntimeError(f"Autotuner error: {msg}")


class TritonAutotuned(Autotuned):
    """`Autotuned` with triton.autotune's configs, pruning, hooks, do_bench and `.cache`."""

    def __init__(
        self,
        fn: Any,
        *,
        configs: Sequence[Any] | None,
        key: Sequence[str] | Callable[..., Any],
        budget: int | None,
        storage: Any,
        restore: Sequence[str],
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
        if configs is None:
            raise ValueError("the triton.autotune keywords need configs=[triton.Config(...), ...]")
        if not configs:
            import triton

            configs = [triton.Config({}, num_warps=4, num_stages=3, num_ctas=1)]
        self.configs: list[Any] = list(configs)
        dicts = _config_dicts(self.configs)
        self._obj_by_canon: dict[str, Any] = {}
        for c, d in zip(self.configs, dicts, strict=True):
            self._obj_by_canon.setdefault(canon(d), c)
        self._dicts = dicts
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
        unknown = set(pc) - {"perf_model", "top_k", "early_config_prune"}
        if unknown:
            raise ValueError(
                f"prune_configs_by has unknown fields {sorted(unknown)}; "
                "use perf_model, top_k, early_config_prune"
            )
        self.perf_model = pc.get("perf_model")
        self.configs_top_k = pc.get("top_k", 1.0)
        self.early_config_prune = pc.get("early_config_prune")
        self.reset_to_zero = list(reset_to_zero or [])
        self.restore_value = list(restore_value or []) + [
            r for r in restore if r not in (restore_value or [])
        ]
        self._restore_copies: dict[str, Any] = {}
        self.user_defined_pre_hook = pre_hook is not None
        self.user_defined_post_hook = post_hook is not None
        self.pre_hook: Callable[..., Any] = pre_hook or self._default_pre_hook
        self.post_hook: Callable[..., Any] = post_hook or self._default_post_hook
        self.triton_cache: dict[tuple, Any] = {}  # `.cache` of the decorated kernel
        self.configs_timings: dict[Any, Any] = {}
        self.bench_time = 0.0
        self.last_cfg: dict[str, Any] | None = None
        self.has_config_hooks = any(getattr(c, "pre_hook", None) is not None for c in self.configs)
        self._tl = threading.local()
        super().__init__(
            fn,
            self._pruned_space,
            key=key,
            configs=None,
            budget=budget or len(self.configs),
            storage=storage,
            **opts,
        )
        names = set(self.arg_names)
        bad = [n for n in self.reset_to_zero + self.restore_value if n not in names]
        if bad:
            raise ValueError(
                f"reset_to_zero/restore_value names {bad} are not parameters of {self.name} ({self.arg_names})"
            )
        self.keys = list(self.key_names)

    # ---- hooks ---------------------------------------------------------------------------------------
    def _default_pre_hook(self, kwargs: dict[str, Any], reset_only: bool = False) -> None:
        for name in self.reset_to_zero:
            v = kwargs.get(name)
            if v is not None:
                _zero(v)
        if not reset_only:
            self._restore_copies = {
                n: _snapshot(kwargs[n]) for n in self.restore_value if kwargs.get(n) is not None
            }

    def _default_post_hook(self, kwargs: dict[str, Any], exception: BaseException | None = None) -> None:
        for name, saved in self._restore_copies.items():
            _copy_into(kwargs[name], saved)
        self._restore_copies = {}

    def meta(self, kwargs: dict, grid: Any) -> dict[str, Any]:
        """The keyword arguments Triton's Autotuner sees (it gets grid= and warmup= among them)."""
        if self.kind == "triton":
            return {**kwargs, "grid": grid, "warmup": False}
        return dict(kwargs)

    def full_nargs(self, args: tuple, kwargs: dict, grid: Any, cfg_obj: Any) -> dict[str, Any]:
        return {
            **dict(zip(self.arg_names, args, strict=False)),
            **self.meta(kwargs, grid),
            **_all_kwargs(cfg_obj),
        }

    # ---- configs -------------------------------------------------------------------------------------
    def config_obj(self, cfg: Mapping[str, Any]) -> Any:
        """The triton.Config (or dict) the user gave for a runtime config dict."""
        c = self._obj_by_canon.get(canon(dict(cfg)))
        if c is None:
            c = _to_triton_config(cfg) if self.kind == "triton" else dict(cfg)
            self._obj_by_canon[canon(dict(cfg))] = c
        return c

    def triton_key(self, args: tuple, kwargs: dict) -> tuple:
        """Triton's key: the values of the key arguments, then str(dtype) of every array argument."""
        all_args = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        named = {k: v for k, v in all_args.items() if k in self.arg_names}
        key: list[Any] = [named[k] for k in self.key_names if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(key)

    def prune(self, args: tuple, kwargs: dict, grid: Any) -> list[Any]:
        """Triton's prune_configs: early_config_prune, then the perf model's top_k."""
        nargs = dict(zip(self.arg_names, args, strict=False))
        kw = self.meta(kwargs, grid)
        pruned = list(self.configs)
        if self.early_config_prune is not None:
            pruned = list(self.early_config_prune(self.configs, nargs, **kw) or [])
            if not pruned:
                raise _autotuner_error(
                    "No valid autotuner configs after pruning. "
                    "`early_config_prune` should return at least one config."
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
        for c in pruned:
            self._obj_by_canon.setdefault(canon(_config_dict(c)), c)
        return pruned

    def _pruned_space(self, *args: Any, **kwargs: Any) -> SearchSpace:
        pruned = getattr(self._tl, "pruned", None) or self.configs
        return SearchSpace.from_configs([_config_dict(c) for c in pruned])

    def _raw_key_value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)) or hasattr(v, "shape"):
            return v
        try:
            import operator

            return operator.index(v)
        except TypeError:
            return str(v)  # e.g. a tl.dtype constexpr as key (Triton keys on any hashable value)

    def raw_key_values(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        vals = super().raw_key_values(args, kwargs)
        return {k: self._raw_key_value(v) for k, v in vals.items()}

    # ---- the miss path -------------------------------------------------------------------------------
    def miss(self, args: tuple, kwargs: dict, fast_key: Any, grid: Any = None) -> dict[str, Any]:
        self._tl.grid = grid
        cfg = super().miss(args, kwargs, fast_key, grid)
        if len(self.configs) > 1:
            with contextlib.suppress(TypeError):  # an unhashable key value: keep serving
                self.triton_cache[self.triton_key(args, kwargs)] = self.config_obj(cfg)
        return cfg

    def _resolve(self, ck: CacheKey, args: tuple, kwargs: dict, grid: Any) -> dict[str, Any]:
        if len(self.configs) == 1:  # Triton neither prunes nor times a single config
            return dict(self._dicts[0])
        names = set().union(*(_all_kwargs(c).keys() for c in self.configs))
        clash = sorted(set(kwargs) & names)
        if clash:
            raise ValueError(
                f"Conflicting meta-parameters: {', '.join(clash)}."
                " Make sure that you don't re-define auto-tuned symbols."
            )
        pruned = self.prune(args, kwargs, grid)
        if len(pruned) == 1:  # nothing to compare: used without timing, not stored
            cfg = _config_dict(pruned[0])
            self._choose(ck, cfg, "the only config left after pruning", quiet=True)
            return cfg
        self._tl.pruned = pruned
        try:
            return super()._resolve(ck, args, kwargs, grid)
        finally:
            self._tl.pruned = None

    def invoker(self, args: tuple, kwargs: dict, grid: Any = None) -> Callable[[dict[str, Any]], Any]:
        """One timed run of a config, with Triton's hooks around it."""
        base = super().invoker(args, kwargs, grid)

        def kernel_call(cfg: dict[str, Any]) -> Any:
            cobj = self.config_obj(cfg)
            full = self.full_nargs(args, kwargs, grid, cobj)
            hook = getattr(cobj, "pre_hook", None)
            if hook is not None:
                hook(full)
            self.pre_hook(full)
            try:
                out = base(cfg)
            except Exception as exc:
                try:
                    self.post_hook(full, exception=exc)
                finally:
                    raise  # noqa: B012 - Triton re-raises the kernel's error after the post-hook
            self.post_hook(full, exception=None)
            return out

        return kernel_call

    def _bench_fn(self, args: tuple, kwargs: dict, device: str) -> BenchFn:
        user = self.user_do_bench
        if user is not None:
            return lambda call: _ms_result_to_s(user(call, quantiles=_QUANTILES))
        gpu = device != "cpu"
        if self.use_cuda_graph and gpu:
            from triton.testing import do_bench_cudagraph

            rep = self.num_reps if self.num_reps is not None else 100
            return lambda call: _ms_result_to_s(do_bench_cudagraph(call, rep=rep, quantiles=list(_QUANTILES)))
        if self.num_warmups is not None or self.num_reps is not None:
            warm = self.num_warmups if self.num_warmups is not None else 25
            rep = self.num_reps if self.num_reps is not None else 100
            if gpu:
                from triton.testing import do_bench

                return lambda call: _ms_result_to_s(
                    do_bench(call, warmup=warm, rep=rep, quantiles=list(_QUANTILES))
                )
            return lambda call: _budgeted_cpu_bench(call, warm / 1e3, rep / 1e3)
        if self.use_cuda_graph:
            log.info("%s: use_cuda_graph needs a CUDA device; timing with the default timer", self.name)
        return super()._bench_fn(args, kwargs, device)

    def _tune(
        self,
        ck: CacheKey,
        space: SearchSpace,
        db: Any,
        args: tuple,
        kwargs: dict,
        owner: str | None,
        grid: Any,
    ) -> dict[str, Any]:
        pruned = getattr(self._tl, "pruned", None) or self.configs
        t0 = time.time()
        if self.user_budget is not None and self.user_budget < len(pruned):
            cfg = super()._tune(ck, space, db, args, kwargs, owner, grid)  # opt-in: the cost model picks
        else:
            cfg = self._time_all(ck, space, db, args, kwargs, owner, grid, pruned)
        self.bench_time = time.time() - t0
        cobj = self.config_obj(cfg)
        self.pre_hook(self.full_nargs(args, kwargs, grid, cobj), reset_only=True)
        if _print_enabled():
            _emit(
                f"Triton autotuning for function {self.base_name},\nwith key as {self.triton_key(args, kwargs)},\n"
                f"finished after {self.bench_time:.2f}s,\nbest config selected: {cobj};"
            )
        return cfg

    @property
    def base_name(self) -> str:
        return str(getattr(underlying_function(self.fn), "__name__", self.name))

    def _time_all(
        self,
        ck: CacheKey,
        space: SearchSpace,
        db: Any,
        args: tuple,
        kwargs: dict,
        owner: str | None,
        grid: Any,
        pruned: list[Any],
    ) -> dict[str, Any]:
        """Time every config in the order given (as Triton does), keep the fastest, store it."""
        from .._optimize import FAILED, OK, Trial

        bench = self._bench_fn(args, kwargs, ck.device)
        invoke = self.invoker(args, kwargs, grid)
        verbose = _print_enabled()
        trials: list[Trial] = []
        timings: dict[Any, Any] = {}
        spreads: dict[str, float] = {}
        for i, cobj in enumerate(pruned):
            cfg = _config_dict(cobj)
            if verbose:
                _emit(f"Autotuning kernel {self.base_name} with config {cobj}")
            t1 = time.perf_counter()
            try:
                med, spread = normalise_bench_result(bench(lambda cfg=cfg: invoke(cfg)))
                if not math.isfinite(med):
                    raise ValueError(f"the timer returned {med}")
            except Exception as exc:  # a failing config is a failed candidate, not a crash
                if verbose:
                    _emit(f"Autotuning failed with {exc}")
                trials.append(
                    Trial(i, cfg, None, FAILED, time.perf_counter() - t1, f"{type(exc).__name__}: {exc}")
                )
                timings[cobj] = [math.inf] * 3
                continue
            trials.append(Trial(i, cfg, med, OK, time.perf_counter() - t1))
            timings[cobj] = [med * 1e3, (med - spread / 2) * 1e3, (med + spread / 2) * 1e3]
            spreads[canon(cfg)] = spread
            if owner is not None and db is not None:
                db.renew(ck.hash, owner, self.lease_s)
        self.configs_timings = timings
        self.stats["tuned"] += 1
        ok = [t for t in trials if t.value is not None]
        store = db.store if db is not None else None
        if store is not None:
            from ..store import TaskContext

            task = TaskContext(
                kernel=self.name,
                problem=ck.fields_dict,
                device=ck.device,
                versions=ck.versions_dict,
                dtype=",".join(ck.dtypes),
            )
            for t in trials:
                store.record_trial(task, space, t, strategy="all_configs")
        if not ok:
            errs = sorted({t.error for t in trials if t.error})
            raise RuntimeError(
                f"{self.name} {ck.fields_dict}: every one of {len(trials)} configs failed; "
                f"first error: {errs[0] if errs else 'unknown'}"
            )
        best = builtins.min(ok, key=lambda t: (t.value, t.number))
        cfg = dict(best.config)
        assert best.value is not None
        if db is not None:
            entry = CacheEntry(
                ck, cfg, best.value, spreads.get(canon(cfg), 0.0), now_iso(), space.fingerprint()
            )
            try:
                db.put(entry)
            except EntryError as exc:
                log.warning(
                    "%s: the winner for %s cannot be stored (%s); kept in memory only",
                    self.name,
                    ck.fields_dict,
                    exc,
                )
        self._choose(ck, cfg, f"timed all {len(trials)} configs, best {best.value:.3g}s", quiet=True)
        return cfg

    def cache_clear(self) -> None:
        super().cache_clear()
        self.triton_cache.clear()


def _budgeted_cpu_bench(call: Callable[[], Any], warmup_s: float, rep_s: float) -> tuple[float, float]:
    """cpu_bench with Triton's warmup/rep meaning: about `warmup_s` of warm-up and `rep_s` of timed runs."""
    t0 = time.perf_counter()
    call()
    est = max(time.perf_counter() - t0, 1e-6)
    return cpu_bench(
        call,
        warmup=max(1, min(1000, int(warmup_s / est))),
        repeats=max(1, min(1000, int(rep_s / est))),
        min_sample_s=0.0,
    )


class TritonAutotuner:
    """A @triton.jit kernel under `tuner.autotune` with triton.autotune keywords: launch as
    `kernel[grid](*args)`; `.cache`, `.best_config`, `.configs`, `.tuner`, `.explain(*args)`."""

    def __init__(self, t: TritonAutotuned) -> None:
        self.tuner = t
        self.fn = t.fn
        self.base_fn = underlying_function(t.fn)
        self.arg_names = t.arg_names
        self.keys = t.keys
        self.configs = t.configs
        self.cache = t.triton_cache
        self.explain = t.explain
        self.cache_clear = t.cache_clear
        jit_run = t.fn.run
        mem = t.mem
        miss = t.miss
        fast_key, need = t.make_fast_key()
        hooked = t.has_config_hooks

        def launch(grid: Any, args: tuple, kwargs: dict) -> Any:
            if kwargs or len(args) < need:
                cfg = miss(args, kwargs, None, grid)
            else:
                k = None
                try:
                    k = fast_key(args, kwargs)
                    cfg = mem[k]
                except KeyError:
                    cfg = miss(args, kwargs, k, grid)
                except TypeError:
                    cfg = miss(args, kwargs, None, grid)
            t.last_cfg = cfg
            if hooked:
                cobj = t.config_obj(cfg)
                if cobj.pre_hook is not None:
                    cobj.pre_hook(t.full_nargs(args, kwargs, grid, cobj))
            return jit_run(*args, grid=grid, warmup=False, **kwargs, **cfg)

        self._launch = launch

    @property
    def best_config(self) -> Any:
        """The triton.Config of the last launch (Triton sets it on every call)."""
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

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._launch
        return lambda *args, **kwargs: launch(grid, args, kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if warmup:
            return self.warmup(*args, grid=grid, **kwargs)
        return self._launch(grid, args, kwargs)

    def warmup(self, *args: Any, grid: Any = None, **kwargs: Any) -> list[Any]:
        """Compile every config left after pruning (Triton's Autotuner.warmup)."""
        out = []
        for c in self.tuner.prune(args, kwargs, grid):
            out.append(self.fn.run(*args, grid=grid, warmup=True, **kwargs, **_all_kwargs(c)))
        return out

    def __repr__(self) -> str:
        return f"TritonAutotuner({self.tuner.name})"


def build(fn: Any, triton_kw: dict[str, Any], **opts: Any) -> Any:
    """The decorated object for `fn`: a TritonAutotuner for a Triton kernel, else the runtime's wrapper
    function with `.cache`, `.configs` and `.tuner` attached."""
    t = TritonAutotuned(fn, **triton_kw, **opts)
    if t.kind == "triton":
        return TritonAutotuner(t)
    w = _make_wrapper(t)
    w.cache = t.triton_cache
    w.configs = t.configs
    return w
