"""`@tuner.autotune`: tune a kernel on the first call with a new key, then serve the winner from memory.

The hit path is one key extraction (precomputed argument positions, C-level itemgetter and getattr) and
one dict lookup, then the call: no logging, no locks, no allocation beyond the key tuple. Everything else
(bucketing, the full key with source hash, dtypes, device and versions, the store, tuning, offline
fallbacks) runs on a miss only, under a per-key lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner.search_spaces import SearchSpace

from . import _jax
from ._bench import BenchFn, default_bench, normalise_bench_result
from ._entry import CacheEntry, EntryError, now_iso
from ._env import (
    array_framework,
    device_of,
    dtype_name,
    framework_versions,
    kind_of,
    signature_names,
    underlying_function,
)
from ._file import ReadOnlyCache, load_cache, rank_nearest
from ._key import Bucket, CacheKey, canon, make_bucketer

log = logging.getLogger(__name__)

__all__ = ["autotune", "Autotuned", "set_global_cache", "set_cost_model_hook", "CostModelHook", "MODES"]

MODES = ("online", "offline")

# A cost-model hook for offline mode: (kernel name, key, space) -> a config or None. Set by the cost-model
# package (or a user) with set_cost_model_hook; None by default.
CostModelHook = Callable[[str, CacheKey, SearchSpace], "Mapping[str, Any] | None"]
_cost_model_hook: CostModelHook | None = None
_global_cache: ReadOnlyCache | None = None
_env_caches: dict[str, ReadOnlyCache] = {}
_dbs: dict[str, Any] = {}
_dbs_lock = threading.Lock()

_DTYPE = itertools.repeat("dtype")
_NONE = itertools.repeat(None)
_g = getattr


# The dtypes of the positional arguments, as a tuple, by arity: hand-written getters for up to six
# arguments (about 40% cheaper than tuple(map(getattr, ...)) per call), map beyond. Index by len(args).
def _d0(a: tuple) -> tuple:
    return ()


def _d1(a: tuple) -> tuple:
    return (_g(a[0], "dtype", None),)


def _d2(a: tuple) -> tuple:
    return (_g(a[0], "dtype", None), _g(a[1], "dtype", None))


def _d3(a: tuple) -> tuple:
    return (_g(a[0], "dtype", None), _g(a[1], "dtype", None), _g(a[2], "dtype", None))


def _d4(a: tuple) -> tuple:
    return (
        _g(a[0], "dtype", None),
        _g(a[1], "dtype", None),
        _g(a[2], "dtype", None),
        _g(a[3], "dtype", None),
    )


def _d5(a: tuple) -> tuple:
    return (
        _g(a[0], "dtype", None),
        _g(a[1], "dtype", None),
        _g(a[2], "dtype", None),
        _g(a[3], "dtype", None),
        _g(a[4], "dtype", None),
    )


def _d6(a: tuple) -> tuple:
    return (
        _g(a[0], "dtype", None),
        _g(a[1], "dtype", None),
        _g(a[2], "dtype", None),
        _g(a[3], "dtype", None),
        _g(a[4], "dtype", None),
        _g(a[5], "dtype", None),
    )


def _dn(a: tuple) -> tuple:
    return tuple(map(getattr, a, _DTYPE, _NONE))


_DTS = (_d0, _d1, _d2, _d3, _d4, _d5, _d6) + (_dn,) * 250


def _dtypes_of(a: tuple) -> tuple:
    return _DTS[len(a)](a) if len(a) < len(_DTS) else _dn(a)


_GENERAL = object()  # first element of keys built by the general (slow) key function
_KEYFN = object()  # first element of keys built from a key function


def set_cost_model_hook(hook: CostModelHook | None) -> None:
    """Install the offline-mode fallback that predicts a config for an unseen key (None removes it)."""
    global _cost_model_hook
    _cost_model_hook = hook


def set_global_cache(cache: ReadOnlyCache | str | os.PathLike[str] | None) -> ReadOnlyCache | None:
    """Make a shipped cache file (or a loaded ReadOnlyCache) visible to every decorated function.
    `$TUNER_CACHE_FILE` does the same from the environment."""
    global _global_cache
    _global_cache = load_cache(cache) if isinstance(cache, (str, os.PathLike)) else cache
    return _global_cache


def _env_cache() -> ReadOnlyCache | None:
    path = os.environ.get("TUNER_CACHE_FILE")
    if not path:
        return None
    c = _env_caches.get(path)
    if c is None:
        c = _env_caches[path] = load_cache(path)
    return c


def _triton_configs_to_dicts(configs: Sequence[Any]) -> list[dict[str, Any]]:
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
    # Launch options that only some configs set are kept only if they vary.
    extras: dict[str, Any] = {}
    for c in configs:
        if not isinstance(c, Mapping):
            for opt, dflt in (("num_ctas", 1), ("maxnreg", None)):
                v = getattr(c, opt, dflt)
                if v != dflt:
                    extras.setdefault(opt, dflt)
    if extras:
        for d, c in zip(out, configs, strict=True):
            for opt, dflt in extras.items():
                d[opt] = getattr(c, opt, dflt) if not isinstance(c, Mapping) else d.get(opt, dflt)
    return out


def _snapshot(v: Any) -> Any:
    """A copy of an array the kernel writes to (torch: clone; numpy: copy)."""
    if hasattr(v, "clone"):
        return v.clone()
    if hasattr(v, "copy"):
        return v.copy()
    raise TypeError(f"cannot snapshot a {type(v).__name__} for restore=; pass torch tensors or numpy arrays")


def _copy_into(target: Any, saved: Any) -> None:
    if hasattr(target, "copy_"):
        target.copy_(saved)
    else:
        import numpy as np

        np.copyto(target, saved)


def _scalar_key_value(name: str, v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"key field {name}={v!r} is not finite")
        return v
    if hasattr(v, "shape") and getattr(v, "ndim", 1) != 0:
        raise TypeError(
            f"key argument {name!r} is an array; key on its shape with a key function, e.g. "
            f"key=lambda {name}, *a, **k: {{'{name}_rows': {name}.shape[0]}}"
        )
    try:
        return operator.index(v)  # numpy / torch integer scalars
    except TypeError:
        pass
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(
            f"key field {name}={v!r}: a key value must be an int, float, str, bool or None"
        ) from None
    return f


class Autotuned:
    """State of one decorated function: keys, the in-memory dicts, the miss path. The callable that
    `autotune` returns (a function, or an AutotunedKernel for a Triton JIT function) carries it as
    `.tuner`."""

    def __init__(
        self,
        fn: Any,
        space: SearchSpace | Callable[..., SearchSpace] | None,
        *,
        key: Sequence[str] | Callable[..., Any],
        configs: Sequence[Any] | None,
        budget: int | None,
        time_budget_s: float | None,
        mode: str | None,
        bucket: Bucket,
        storage: Any,
        bench: BenchFn | None,
        cache: ReadOnlyCache | str | os.PathLike[str] | None,
        name: str | None,
        dtypes: bool,
        seed: int,
        strategy: str,
        cost_model: CostModelHook | None,
        lease_s: float,
        restore: Sequence[str] = (),
        depends: Sequence[Any] = (),
    ) -> None:
        if budget is None:  # explicit configs: time every one of them (as triton.autotune does)
            budget = max(1, len(configs)) if configs is not None else 20
        if configs is not None:
            if space is not None:
                raise ValueError("give either a space or configs, not both")
            space = SearchSpace.from_configs(_triton_configs_to_dicts(list(configs)))
        if space is None:
            raise ValueError(
                "autotune needs a SearchSpace (or a function returning one) or a list of configs"
            )
        if not isinstance(space, SearchSpace) and not callable(space):
            raise TypeError(
                f"space must be a SearchSpace or a callable returning one, got {type(space).__name__}"
            )
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be a positive int, got {budget!r}")
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {MODES} or None (read $TUNER_MODE), got {mode!r}")
        self.fn = fn
        self.kind = kind_of(fn)
        self.space = space
        self.budget = budget
        self.time_budget_s = time_budget_s
        self.mode = mode
        self.bucketer = make_bucketer(bucket)
        self.storage = storage
        self.bench = bench
        self.cache = load_cache(cache) if isinstance(cache, (str, os.PathLike)) else cache
        base = underlying_function(fn)
        self.name = name or f"{getattr(base, '__module__', '?')}.{getattr(base, '__qualname__', repr(base))}"
        self.use_dtypes = dtypes
        self.seed = seed
        self.strategy = strategy
        self.cost_model = cost_model
        self.lease_s = lease_s
        self.restore = (restore,) if isinstance(restore, str) else tuple(restore)
        self._depends = tuple(depends)
        self._source_hash: str | None = None  # computed on the first miss (see source_hash)
        self.arg_names, self.defaults = signature_names(fn)
        self.key_fn: Callable[..., Any] | None = None
        self.key_names: tuple[str, ...] = ()
        if callable(key):
            self.key_fn = key
        else:
            if isinstance(key, str):
                key = [key]
            self.key_names = tuple(key)
            unknown = [k for k in self.key_names if k not in self.arg_names]
            if unknown:
                raise ValueError(f"key names {unknown} are not parameters of {self.name} ({self.arg_names})")
        bad = [r for r in self.restore if r not in self.arg_names]
        if bad:
            raise ValueError(f"restore names {bad} are not parameters of {self.name} ({self.arg_names})")
        # Hit-path state.
        self.mem: dict[Any, dict[str, Any]] = {}
        self.by_hash: dict[str, dict[str, Any]] = {}
        # Miss-path state.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._logged: set[str] = set()
        self.last_miss_reason: str | None = None
        self.last_choice: dict[str, Any] = {}
        self.stats = {"tuned": 0, "from_store": 0, "from_file": 0, "offline_fallback": 0, "waited": 0}
        self._env: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}

    @property
    def source_hash(self) -> str:
        """The code identity in the key (tuner.runtime._source.code_hash), computed on first use so that
        functions defined below the decorated one (a kernel body, a helper) are covered."""
        h = self._source_hash
        if h is None:
            from ._source import code_hash

            h = self._source_hash = code_hash(self.fn, self._depends)
        return h

    @source_hash.setter
    def source_hash(self, value: str) -> None:
        self._source_hash = value

    # ---- keys ----------------------------------------------------------------------------------------
    def key_getter(self) -> tuple[Callable[[tuple], Any], int]:
        """(getter of the key values from the positional args, number of positional args it needs)."""
        pos = [self.arg_names.index(n) for n in self.key_names]
        if not pos:
            return (lambda args: ()), 0
        return operator.itemgetter(*pos), max(pos) + 1

    def make_fast_key(self) -> tuple[Callable[[tuple, dict], Any], int]:
        """(fast key function of (args, kwargs), number of positional args it needs). The fast key is
        what the in-memory dict is indexed by: the raw key values and the dtypes of the arguments. The
        wrappers below inline the same expression; keep them in step."""
        use_dt = self.use_dtypes
        if self.key_fn is not None:
            kf = self.key_fn

            def fast_fn(args: tuple, kwargs: dict) -> Any:
                r = kf(*args, **kwargs)
                if type(r) is dict:
                    r = tuple(r.items())
                if not use_dt:
                    return (_KEYFN, r)
                if kwargs:
                    return (
                        _KEYFN,
                        r,
                        _dtypes_of(args),
                        tuple((k, _g(v, "dtype", None)) for k, v in kwargs.items()),
                    )
                return (_KEYFN, r, _dtypes_of(args))

            return fast_fn, 0
        ig, need = self.key_getter()
        if use_dt:
            return (lambda args, kwargs: (ig(args), _dtypes_of(args))), need
        return (lambda args, kwargs: ig(args)), need

    def general_key(self, args: tuple, kwargs: dict) -> Any:
        """The fast key for any call (keyword arguments, defaults); never equal to a positional one."""
        vals = self.raw_key_values(args, kwargs)
        items = tuple(sorted(kwargs.items()))
        dts = tuple(getattr(a, "dtype", None) for a in args)
        kdts = tuple((k, getattr(v, "dtype", None)) for k, v in items) if self.use_dtypes else ()
        return (_GENERAL, tuple(vals.items()), dts if self.use_dtypes else (), kdts)

    def arg_value(self, name: str, args: tuple, kwargs: dict) -> Any:
        i = self.arg_names.index(name)
        if i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self.defaults.get(name)

    def raw_key_values(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if self.key_fn is not None:
            r = self.key_fn(*args, **kwargs)
            if isinstance(r, Mapping):
                return dict(r)
            if isinstance(r, (tuple, list)):
                return {f"k{i}": v for i, v in enumerate(r)}
            return {"k": r}
        out = {}
        for n in self.key_names:
            i = self.arg_names.index(n)
            if i < len(args):
                out[n] = args[i]
            elif n in kwargs:
                out[n] = kwargs[n]
            elif n in self.defaults:
                out[n] = self.defaults[n]
            else:
                raise TypeError(f"{self.name}() missing key argument {n!r}")
        return out

    def full_key(self, args: tuple, kwargs: dict) -> CacheKey:
        """The stored key: kernel + source hash, bucketed key fields, dtypes, device, versions."""
        raw = self.raw_key_values(args, kwargs)
        fields = {}
        for n, v in raw.items():
            v = _scalar_key_value(n, v)
            if self.bucketer is not None:
                v = _scalar_key_value(n, self.bucketer(n, v))
            fields[str(n)] = v
        values = list(args) + [kwargs[k] for k in sorted(kwargs)]
        dts = []
        if self.use_dtypes:
            for v in values:
                d = getattr(v, "dtype", None)
                if d is not None:
                    dts.append(dtype_name(d))
        device, versions = self._device_versions(values)
        return CacheKey.make(self.name, self.source_hash, fields, dts, device, versions)

    def _device_versions(self, values: list[Any]) -> tuple[str, dict[str, str]]:
        device = device_of(self.kind, values)
        tops = ",".join(sorted({(type(v).__module__ or "").split(".")[0] for v in values}))
        ck = (device, tops)
        got = self._env.get(ck)
        if got is None:
            got = self._env[ck] = (device, framework_versions(self.kind, values))
        return got

    def space_for(self, args: tuple, kwargs: dict) -> SearchSpace:
        if isinstance(self.space, SearchSpace):
            return self.space
        sp = self.space(*args, **kwargs)
        if not isinstance(sp, SearchSpace):
            raise TypeError(
                f"the space function of {self.name} returned {type(sp).__name__}, not a SearchSpace"
            )
        return sp

    # ---- sources -------------------------------------------------------------------------------------
    def current_mode(self) -> str:
        m = self.mode or os.environ.get("TUNER_MODE") or "online"
        if m not in MODES:
            raise ValueError(f"TUNER_MODE={m!r}: use one of {MODES}")
        return m

    def file_caches(self) -> list[ReadOnlyCache]:
        out = [c for c in (self.cache, _global_cache, _env_cache()) if c is not None]
        return out

    def db(self, *, create: bool) -> Any:
        """The ConfigCache of this function's storage, or None (storage=False, or offline with no
        database file yet: offline mode never creates one)."""
        if self.storage is False:
            return None
        from ..store import ResultStore, default_storage_url
        from ._db import ConfigCache

        if isinstance(self.storage, ConfigCache):
            return self.storage
        if isinstance(self.storage, ResultStore):
            url, store = self.storage.url, self.storage
        else:
            url, store = (self.storage or default_storage_url()), None
        if not create and url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///") :]):
            return None
        with _dbs_lock:
            c = _dbs.get(url)
            if c is None:
                c = _dbs[url] = ConfigCache(store or url)
            return c

    # ---- the miss path -------------------------------------------------------------------------------
    def miss(self, args: tuple, kwargs: dict, fast_key: Any, grid: Any = None) -> dict[str, Any]:
        """Resolve the config for a call whose fast key is not in memory (tuning if needed)."""
        if _jax.has_tracer(args, kwargs):  # inside jax.jit/grad/vmap: resolve on concrete arrays
            return _jax.resolve_on_concrete(self.miss, self.name, args, kwargs, fast_key, grid)
        if fast_key is None:
            try:
                fast_key = self.general_key(args, kwargs)
                hash(fast_key)
            except TypeError:
                fast_key = None
            if fast_key is not None:
                cfg = self.mem.get(fast_key)
                if cfg is not None:
                    return cfg
        ck = self.full_key(args, kwargs)
        h = ck.hash
        cfg = self.by_hash.get(h)
        if cfg is None:
            with self._guard:
                lock = self._locks.setdefault(h, threading.Lock())
            with lock:
                cfg = self.by_hash.get(h)
                if cfg is None:
                    cfg = self._resolve(ck, args, kwargs, grid)
                    self.by_hash[h] = cfg
        if fast_key is not None:
            self.mem[fast_key] = cfg
        return cfg

    def _valid(self, space: SearchSpace, config: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            return space.validate(config)
        except ValueError:
            return None

    def _resolve(self, ck: CacheKey, args: tuple, kwargs: dict, grid: Any) -> dict[str, Any]:
        space = self.space_for(args, kwargs)
        mode = self.current_mode()
        for fc in self.file_caches():
            e = fc.get(ck)
            if e is not None:
                cfg = self._valid(space, e.config)
                if cfg is not None:
                    self.stats["from_file"] += 1
                    self._choose(ck, cfg, f"exact entry in {fc.source or 'a loaded cache'}", quiet=True)
                    return cfg
        db = self.db(create=mode == "online")
        if db is not None:
            e = db.get(ck)
            if e is not None:
                cfg = self._valid(space, e.config)
                if cfg is not None:
                    self.stats["from_store"] += 1
                    self._choose(ck, cfg, "exact entry in the store", quiet=True)
                    return cfg
        self.last_miss_reason = self.miss_reason(ck, space, db)
        if mode == "offline":
            return self._offline(ck, space, db)
        return self._tune_once(ck, space, db, args, kwargs, grid)

    def _choose(self, ck: CacheKey, cfg: dict[str, Any], why: str, *, quiet: bool = False) -> None:
        self.last_choice = {"key": ck.to_json(), "config": cfg, "why": why}
        if ck.hash not in self._logged:
            self._logged.add(ck.hash)
            (log.debug if quiet else log.warning)("%s %s: using %s (%s)", self.name, ck.fields_dict, cfg, why)

    def _offline(self, ck: CacheKey, space: SearchSpace, db: Any) -> dict[str, Any]:
        self.stats["offline_fallback"] += 1
        entries: dict[str, CacheEntry] = {}
        for fc in self.file_caches():
            for e in fc.for_kernel(ck.kernel):
                entries.setdefault(e.key.hash, e)
        if db is not None:
            for e in db.entries(ck.kernel):
                entries.setdefault(e.key.hash, e)
        for d, e in rank_nearest(ck, entries.values()):
            cfg = self._valid(space, e.config)
            if cfg is not None:
                self._choose(ck, cfg, f"offline: nearest cached key {e.key.fields_dict} (distance {d:.3g})")
                return cfg
        hook = self.cost_model or _cost_model_hook
        if hook is not None:
            try:
                pred = hook(self.name, ck, space)
            except Exception as exc:  # a broken model must not take production down
                log.warning(
                    "%s: cost-model hook failed (%s: %s); using the space default",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
                pred = None
            cfg = self._valid(space, pred) if pred is not None else None
            if cfg is not None:
                self._choose(ck, cfg, "offline: cost model's best prediction")
                return cfg
        cfg = space.default()
        self._choose(ck, cfg, "offline: space default (no cached key of this family, no cost model)")
        return cfg

    def _tune_once(
        self, ck: CacheKey, space: SearchSpace, db: Any, args: tuple, kwargs: dict, grid: Any
    ) -> dict[str, Any]:
        """Tune unless another process is tuning this key (claim row), in which case wait for its entry."""
        if db is None:
            return self._tune(ck, space, None, args, kwargs, None, grid)
        from ._db import owner_id

        owner = owner_id()
        delay = 0.02
        while True:
            if db.claim(ck.hash, owner, self.lease_s):
                try:
                    e = db.get(ck)  # another process may have finished just before our claim
                    cfg = self._valid(space, e.config) if e is not None else None
                    if cfg is not None:
                        self.stats["waited"] += 1
                        return cfg
                    return self._tune(ck, space, db, args, kwargs, owner, grid)
                finally:
                    db.release(ck.hash, owner)
            e = db.get(ck)
            if e is not None:
                cfg = self._valid(space, e.config)
                if cfg is not None:
                    self.stats["waited"] += 1
                    self._choose(ck, cfg, "tuned by another process", quiet=True)
                    return cfg
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _bench_fn(self, args: tuple, kwargs: dict, device: str) -> BenchFn:
        if self.bench is not None:
            return self.bench
        return default_bench(self.kind, array_framework(list(args) + list(kwargs.values())), device)

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
        from .._optimize import optimize

        bench = self._bench_fn(args, kwargs, ck.device)
        spreads: dict[str, float] = {}
        invoke = self.invoker(args, kwargs, grid)

        snaps = [
            (v, _snapshot(v))
            for v in (self.arg_value(r, args, kwargs) for r in self.restore)
            if v is not None
        ]

        def restore_inputs() -> None:
            for target, saved in snaps:
                _copy_into(target, saved)

        def objective(cfg: dict[str, Any]) -> float:
            restore_inputs()
            med, spread = normalise_bench_result(bench(lambda: invoke(cfg)))
            spreads[canon(cfg)] = spread
            return med

        store = db.store if db is not None else None
        task = None
        prior = None
        if store is not None:
            from ..store import TaskContext

            task = TaskContext(
                kernel=self.name,
                problem=ck.fields_dict,
                device=ck.device,
                versions=ck.versions_dict,
                dtype=",".join(ck.dtypes),
            )
            prior = store.prior_for(self.name, exclude_task=task.task_id) or None

        last_renew = [time.monotonic()]

        def renew(_trial: Any, _res: Any) -> None:
            if owner is not None and time.monotonic() - last_renew[0] > self.lease_s / 4:
                db.renew(ck.hash, owner, self.lease_s)
                last_renew[0] = time.monotonic()

        t0 = time.perf_counter()
        try:
            res = optimize(
                space,
                objective,
                budget=self.budget,
                seed=self.seed,
                strategy=self.strategy,
                prior=prior,
                time_budget_s=self.time_budget_s,
                callback=renew,
            )
        finally:
            restore_inputs()  # the call that follows sees the inputs as the caller passed them
        self.stats["tuned"] += 1
        if store is not None:
            for t in res.trials:
                store.record_trial(task, space, t, strategy=res.strategy)
        if res.best_config is None:
            errs = {t.error for t in res.trials if t.error}
            raise RuntimeError(
                f"{self.name} {ck.fields_dict}: every one of {len(res.trials)} configs failed; "
                f"first error: {sorted(errs)[0] if errs else 'unknown'}"
            )
        cfg = dict(res.best_config)
        entry = CacheEntry(
            ck, cfg, res.best_value, spreads.get(canon(cfg), 0.0), now_iso(), space.fingerprint()
        )
        if db is not None:
            try:
                db.put(entry)
            except EntryError as exc:
                log.warning(
                    "%s: the winner for %s cannot be stored (%s); kept in memory only",
                    self.name,
                    ck.fields_dict,
                    exc,
                )
        self._choose(
            ck,
            cfg,
            f"tuned: {len(res.trials)} evaluations in {time.perf_counter() - t0:.2f}s, "
            f"best {res.best_value:.3g}s",
            quiet=True,
        )
        log.info(
            "%s %s: tuned %d configs, best %s (%.3g s)",
            self.name,
            ck.fields_dict,
            len(res.trials),
            cfg,
            res.best_value,
        )
        return cfg

    def invoker(self, args: tuple, kwargs: dict, grid: Any = None) -> Callable[[dict[str, Any]], Any]:
        fn = self.fn
        if self.kind == "triton":
            return lambda cfg: fn.run(*args, grid=grid, warmup=False, **kwargs, **cfg)
        return lambda cfg: fn(*args, **kwargs, **cfg)

    # ---- introspection -------------------------------------------------------------------------------
    def miss_reason(self, ck: CacheKey, space: SearchSpace | None = None, db: Any = None) -> str:
        """Why no stored entry serves `ck`: the nearest entries that differ, and how."""
        cands: dict[str, CacheEntry] = {}
        for fc in self.file_caches():
            for e in fc.for_kernel(ck.kernel):
                cands.setdefault(e.key.hash, e)
        if db is not None:
            for e in db.entries(ck.kernel):
                cands.setdefault(e.key.hash, e)
        if not cands:
            return f"no cached entry for kernel {ck.kernel!r}"
        exact = cands.get(ck.hash)
        if exact is not None and space is not None:
            return f"cached config {dict(exact.config)} is not in the current search space: " + "; ".join(
                space.violations(exact.config)
            )
        same_fields = [e for e in cands.values() if e.key.fields == ck.fields]
        if same_fields:
            return "entry for these key fields is stale or foreign: " + "; ".join(
                ck.mismatches(same_fields[0].key)
            )
        return (
            f"no entry for key {ck.fields_dict}; {len(cands)} entries of kernel {ck.kernel!r} "
            f"have other key fields"
        )

    def explain(self, *args: Any, **kwargs: Any) -> str:
        """Say, without tuning, what a call with these arguments would use and why."""
        ck = self.full_key(args, kwargs)
        if ck.hash in self.by_hash:
            return f"hit (in memory): {self.by_hash[ck.hash]} for key {ck.to_json()}"
        space = self.space_for(args, kwargs)
        for fc in self.file_caches():
            e = fc.get(ck)
            if e is not None and self._valid(space, e.config) is not None:
                return f"hit ({fc.source or 'loaded cache'}): {dict(e.config)}"
        db = self.db(create=False)
        if db is not None:
            e = db.get(ck)
            if e is not None and self._valid(space, e.config) is not None:
                return f"hit (store): {dict(e.config)}"
        return f"miss: {self.miss_reason(ck, space, db)}; key {ck.to_json()}"

    def cache_clear(self) -> None:
        """Forget the in-memory configs (the store and files are untouched)."""
        self.mem.clear()
        self.by_hash.clear()
        self._logged.clear()


def _attach(wrapper: Any, t: Autotuned) -> Any:
    wrapper.tuner = t
    wrapper.explain = t.explain
    wrapper.cache_clear = t.cache_clear
    wrapper.__wrapped__ = t.fn
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(wrapper, attr, getattr(underlying_function(t.fn), attr))
    return wrapper


def _make_wrapper(t: Autotuned) -> Callable[..., Any]:
    fn = t.fn
    mem = t.mem
    miss = t.miss
    dts = _DTS
    if t.key_fn is None:
        ig, need = t.key_getter()
        if t.use_dtypes:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if kwargs or len(args) < need:
                    return fn(*args, **kwargs, **miss(args, kwargs, None))
                try:
                    cfg = mem[ig(args), dts[len(args)](args)]
                except KeyError:
                    cfg = miss(args, kwargs, (ig(args), _dtypes_of(args)))
                except (TypeError, IndexError):  # an unhashable key value; very many arguments
                    cfg = miss(args, kwargs, None)
                return fn(*args, **cfg)
        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if kwargs or len(args) < need:
                    return fn(*args, **kwargs, **miss(args, kwargs, None))
                try:
                    cfg = mem[ig(args)]
                except KeyError:
                    cfg = miss(args, kwargs, ig(args))
                except TypeError:
                    cfg = miss(args, kwargs, None)
                return fn(*args, **cfg)
    else:
        fast_key, _ = t.make_fast_key()

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            k = None
            try:
                k = fast_key(args, kwargs)
                cfg = mem[k]
            except KeyError:
                cfg = miss(args, kwargs, k)
            except TypeError:
                cfg = miss(args, kwargs, None)
            return fn(*args, **kwargs, **cfg)

    return _attach(wrapper, t)


class AutotunedKernel:
    """A Triton JIT function under tuner.autotune: launch it as `kernel[grid](*args)`, as with
    triton.autotune. `.tuner` holds the state; `.explain(*args)` says what a call would use."""

    def __init__(self, t: Autotuned) -> None:
        self.tuner = t
        self.fn = t.fn
        self.arg_names = t.arg_names
        self.explain = t.explain
        self.cache_clear = t.cache_clear
        jit_run = t.fn.run
        mem = t.mem
        fast_key, need = t.make_fast_key()

        miss = t.miss

        def launch(grid: Any, args: tuple, kwargs: dict) -> Any:
            if kwargs or len(args) < need:
                cfg = miss(args, kwargs, None, grid)
                return jit_run(*args, grid=grid, warmup=False, **kwargs, **cfg)
            k = None
            try:
                k = fast_key(args, kwargs)
                cfg = mem[k]
            except KeyError:
                cfg = miss(args, kwargs, k, grid)
            except TypeError:
                cfg = miss(args, kwargs, None, grid)
            return jit_run(*args, grid=grid, warmup=False, **cfg)

        self._launch = launch

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self._launch
        return lambda *args, **kwargs: launch(grid, args, kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if warmup:
            return self.fn.run(*args, grid=grid, warmup=True, **kwargs)
        return self._launch(grid, args, kwargs)

    def __repr__(self) -> str:
        return f"AutotunedKernel({self.tuner.name})"


def autotune(
    space: SearchSpace | Callable[..., SearchSpace] | None = None,
    *,
    key: Sequence[str] | Callable[..., Any],
    configs: Sequence[Any] | None = None,
    budget: int | None = None,
    time_budget_s: float | None = None,
    mode: str | None = None,
    bucket: Bucket = "exact",
    storage: Any = None,
    bench: BenchFn | None = None,
    cache: ReadOnlyCache | str | os.PathLike[str] | None = None,
    name: str | None = None,
    dtypes: bool = True,
    seed: int = 0,
    strategy: str = "auto",
    cost_model: CostModelHook | None = None,
    lease_s: float = 120.0,
    restore: Sequence[str] = (),
    depends: Sequence[Any] = (),
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
) -> Callable[[Any], Any]:
    """Decorate a kernel launcher so that it tunes itself once per key and then runs from a cache.

    - `space`: a SearchSpace, or a function of the call's arguments returning one; or give `configs`,
      a list of dicts or `triton.Config`s (kwargs plus num_warps/num_stages) as with triton.autotune.
    - `key`: argument names (their values form the key, as in triton.autotune), or a function of the
      arguments returning a dict of key fields. The dtypes of array arguments are added (`dtypes=False`
      turns that off), and the stored key also holds the source hash, the device and the versions.
    - `bucket`: "exact" (default), "pow2" (round positive ints up to a power of two), a callable
      `(name, value) -> value`, or a dict name -> policy.
    - `budget` evaluations and/or `time_budget_s` seconds per key, with `strategy` (default "auto") warm-
      started from what the store already knows about this kernel.
    - `mode`: "online" (tune misses) or "offline" (never tune: nearest cached key, else the cost-model
      hook, else the space default); None reads $TUNER_MODE (default online).
    - `storage`: None (the default store, $TUNER_HOME/tuner.db), a URL, a ResultStore or ConfigCache,
      or False (memory only). `cache`: a shipped file (path or `load_cache(path)`) consulted first.
    - `bench(call) -> seconds | (median, spread)`; default: the CPU timer for plain callables and the
      interpreters, triton.testing.do_bench for Triton on a GPU, block_until_ready timing for jax.
    - `restore`: names of array arguments the kernel writes in place; they are copied before tuning and
      restored before each config is timed and after tuning, so the tuning call's result is right.
    - `depends`: other functions whose source is part of the kernel's identity (e.g. the @triton.jit
      kernel that a plain-Python launcher calls): editing them makes old entries stale.
    - `lease_s`: how long a claim to tune a key stays valid without renewal (another process takes over
      a key whose tuner died after this long).
    The decorated function gets the config's parameters as keyword arguments.
    """

    triton_kw = {
        "prune_configs_by": prune_configs_by,
        "reset_to_zero": reset_to_zero,
        "restore_value": restore_value,
        "pre_hook": pre_hook,
        "post_hook": post_hook,
        "warmup": warmup,
        "rep": rep,
        "use_cuda_graph": use_cuda_graph,
        "do_bench": do_bench,
        "cache_results": cache_results,
    }

    def deco(fn: Any) -> Any:
        if configs is not None and (kind_of(fn) == "triton" or any(v for v in triton_kw.values())):
            from ._triton_compat import build  # triton.autotune's keywords and semantics

            return build(
                fn,
                triton_kw,
                configs=configs,
                key=key,
                budget=budget,
                storage=storage,
                restore=(restore,) if isinstance(restore, str) else tuple(restore),
                time_budget_s=time_budget_s,
                mode=mode,
                bucket=bucket,
                bench=bench,
                cache=cache,
                name=name,
                dtypes=dtypes,
                seed=seed,
                strategy=strategy,
                cost_model=cost_model,
                lease_s=lease_s,
                depends=depends,
            )
        if any(v for v in triton_kw.values()):
            raise ValueError(
                "the triton.autotune keywords need configs=[...] (a list of triton.Config or dicts)"
            )
        t = Autotuned(
            fn,
            space,
            key=key,
            configs=configs,
            budget=budget,
            time_budget_s=time_budget_s,
            mode=mode,
            bucket=bucket,
            storage=storage,
            bench=bench,
            cache=cache,
            name=name,
            dtypes=dtypes,
            seed=seed,
            strategy=strategy,
            cost_model=cost_model,
            lease_s=lease_s,
            restore=restore,
            depends=depends,
        )
        if t.kind == "triton":
            return AutotunedKernel(t)
        return _make_wrapper(t)

    return deco
