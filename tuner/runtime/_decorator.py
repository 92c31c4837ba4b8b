"""`@tuner.autotune`: tune a kernel on the first call with a new key, then serve the winner from memory.

The parts, each written once and shared by the decorator, the Triton launcher (`_launcher.py`) and
`tuner.kernel` (`_kernel.py`):
- the hit path (`_hit.py`): fast key, dict lookup, call;
- the resolution chain (`_resolve.py`): memory -> shipped files -> store -> the mode's tail (online:
  tune, `_tuning.py`; offline: nearest key, cost-model hook, space default);
- injected parts, given to `Autotuned` by each front end: key building (`keys`, `_argkeys.py`), benching
  (`timer`, `_bench.py`) and restoring (`restorer`, `_restore.py`).
`Autotuned` holds the state of one decorated function (the in-memory dicts, counters, the last choice)
and runs the miss path under a per-key lock. Store and file faults never reach the caller
(`_sources.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from tuner._settings import text
from tuner.search_spaces import SearchSpace

from . import _jax, _torch
from ._argkeys import KW, ArgKeys, KeyBuilder
from ._bench import BenchFn, default_bench
from ._env import (
    array_framework,
    call_users_function,
    check_users_function,
    default_name,
    dependency_packages,
    flat_args,
    keywords_refused,
    kind_of,
    positional_count,
    signature_names,
    underlying_function,
)
from ._file import CacheFileError, ReadOnlyCache, load_cache
from ._hit import make_hit_path
from ._key import Bucket, CacheKey
from ._launcher import TRITON_KEYWORDS, AutotunedKernel, triton_configs_to_dicts
from ._resolve import (
    CostModelHook,
    Request,
    Resolution,
    lookup,
    lookups,
    miss_reason,
    mode_names,
    resolve,
    set_cost_model_hook,
)
from ._restore import Restorer
from ._sources import set_global_cache, warn_once
from ._stand_ins import StandInsArg, check_stand_ins
from ._stand_ins import user_stand_ins as user_stand_ins_hook
from ._tuning import AllConfigsFailedError, candidate_being_timed

log = logging.getLogger(__name__)

__all__ = [
    "autotune",
    "Autotuned",
    "AutotunedKernel",
    "set_global_cache",
    "set_cost_model_hook",
    "CostModelHook",
    "MODES",
    "Timer",
]

MODES = ("online", "offline")  # the built-in modes; `_resolve.register_mode` adds more

# Timer: (args, kwargs, device) -> the bench function for this call's tuning.
Timer = Callable[[tuple, dict, str], BenchFn]


def _default_timer(bench: BenchFn | None, kind: str) -> Timer:
    def timer(args: tuple, kwargs: dict, device: str) -> BenchFn:
        if bench is not None:
            return bench
        return default_bench(kind, array_framework(flat_args(list(args) + list(kwargs.values()))), device)

    return timer


class Autotuned:
    """State of one decorated function: the injected parts (keys, timer, restorer), the in-memory
    dicts, the counters and the miss path. The callable that `autotune` returns (a function, or an
    AutotunedKernel for a Triton JIT function) carries it as `.tuner`.

    Front ends other than `autotune` (`tuner.kernel`, a drop-in) pass their own `keys`, `timer`,
    `restorer` and `source_hash`; `key`, `bucket`, `dtypes`, `restore` and `depends` then go unused."""

    def __init__(
        self,
        fn: Any,
        space: SearchSpace | Callable[..., SearchSpace] | None,
        *,
        key: Sequence[str] | Callable[..., Any] = (),
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
        keys: KeyBuilder | None = None,
        timer: Timer | None = None,
        restorer: Restorer | None = None,
        source_hash: str | None = None,
        stand_ins: _jax.StandIns | None = None,
        user_stand_ins: StandInsArg | None = None,
    ) -> None:
        if budget is None:  # explicit configs: time every one of them (as triton.autotune does)
            budget = max(1, len(configs)) if configs is not None else 20
        if configs is not None:
            if space is not None:
                raise ValueError("give either a space or configs, not both")
            space = SearchSpace.from_configs(triton_configs_to_dicts(list(configs)))
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
        from ..strategies import check_strategy

        check_strategy(strategy, instance_ok=False)  # at decoration, not inside the first call's tuning
        if mode is not None and mode not in mode_names():
            raise ValueError(f"mode must be one of {mode_names()} or None (read $TUNER_MODE), got {mode!r}")
        self.fn = fn
        self.kind = kind_of(fn)
        self.space = space
        self.budget = budget
        self.time_budget_s = time_budget_s
        self.mode = mode
        self.storage = storage
        self.bench = bench
        self.cache = _load_own_cache(cache)
        self.name = name or default_name(fn)
        self.seed = seed
        self.strategy = strategy
        self.cost_model = cost_model
        self.lease_s = lease_s
        self.stand_ins = stand_ins  # values a traced miss is timed on, where zeros would time no work
        self.arg_names, self.defaults = signature_names(fn)
        # how many of arg_names a call can give positionally (None: all of them); see `positional_count`
        self.positional: int | None = positional_count(fn)
        if keys is None and self.kind != "triton" and isinstance(space, SearchSpace):
            # the config arrives as keyword arguments: a launcher that cannot take one of them would fail
            # every trial of every key; say so now (a Triton kernel takes num_warps etc. as launch options)
            refused = keywords_refused(fn, space.names)
            if refused:
                raise ValueError(
                    f"search space parameters {refused} are not parameters of {self.name} "
                    f"({self.arg_names}): the config is passed as keyword arguments"
                )
        if keys is None and callable(key) and isinstance(space, SearchSpace):
            check_users_function(key, f"the key function of {self.name}", fn, space.names)
        if user_stand_ins is not None:  # `autotune(stand_ins=...)`: checked now, used by traced misses
            config_names = space.names if isinstance(space, SearchSpace) else ()
            check_stand_ins(user_stand_ins, self.name, fn, self.arg_names, config_names)
            self.stand_ins = user_stand_ins_hook(user_stand_ins, self.name, self.arg_names, self.positional)
        self._depends = tuple(depends)
        self._source_hash = source_hash  # None: computed on the first miss (see the property)
        self._hash_given = source_hash is not None
        self.keys: KeyBuilder = (
            keys
            if keys is not None
            else ArgKeys(
                name=self.name,
                kind=self.kind,
                source_hash=lambda: self.source_hash,
                arg_names=self.arg_names,
                defaults=self.defaults,
                key=key,
                bucket=bucket,
                dtypes=dtypes,
                packages=dependency_packages((fn, *self._depends)),
                positional=self.positional,
            )
        )
        self.timer: Timer = timer or _default_timer(bench, self.kind)
        if restorer is None:
            names = (restore,) if isinstance(restore, str) else tuple(restore)
            bad = [r for r in names if r not in self.arg_names]
            if bad:
                raise ValueError(f"restore names {bad} are not parameters of {self.name} ({self.arg_names})")
            restorer = Restorer(lambda a, k: [self.arg_value(n, a, k) for n in names])
        self.restorer = restorer
        # Hit-path state.
        self.mem: dict[Any, dict[str, Any]] = {}
        self.by_hash: dict[str, dict[str, Any]] = {}
        # Configs chosen untimed for traced calls whose launcher reads tracers it is not passed (see
        # `_traced_miss`); by fast or general key, consulted by traced misses only.
        self.untimed: dict[Any, dict[str, Any]] = {}
        # Miss-path state.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        # key hash -> when its tuning in this process started or last finished a trial (`_tuning`), and
        # the keys whose tuning went `lease_s` without one (`_wait_for`)
        self.progress: dict[str, float] = {}
        self._overdue: set[str] = set()
        self._logged: set[str] = set()
        self.last_miss_reason: str | None = None
        self.last_choice: dict[str, Any] = {}
        self.stats = {"tuned": 0, "from_store": 0, "from_file": 0, "offline_fallback": 0, "waited": 0}
        # Set by a study executor (`tuner.studies._from_misses.run_decorated`) while it tunes one key:
        # `storage` and `study_name` keep the trials in the task's Optuna study (so a killed worker's
        # task resumes without measuring them again), `callback(trial, None)` renews the task's lease.
        self.study_run: dict[str, Any] | None = None
        _instances.add(self)

    def _after_fork(self) -> None:
        """In a forked child: new miss-path locks. A parent thread that was tuning a key when the process
        forked holds that key's lock for ever in the child (the thread did not come along), and the
        child's first call of the key would wait on it without end."""
        self._locks = {}
        self._guard = threading.Lock()
        self.progress = {}
        self._overdue = set()

    @property
    def source_hash(self) -> str:
        """The code identity in the key (`_source.code_hash`), computed on first use so that functions
        defined below the decorated one (a kernel body, a helper) are covered."""
        h = self._source_hash
        if h is None:
            from ._source import code_hash

            h = self._source_hash = code_hash(self.fn, self._depends)
        return h

    @source_hash.setter
    def source_hash(self, value: str) -> None:
        self._source_hash = value

    def replace_fn(self, fn: Any) -> None:
        """Code assigned the kernel's `.fn` (`AutotunedKernel.fn`): the misses from now on time it and
        store their winners under its code; the configs already chosen in memory are kept (as Triton's
        `.cache` is, which its Autotuner keeps when code assigns its `fn`)."""
        self.fn = fn
        if not self._hash_given:
            self._source_hash = None

    # ---- the call's parts ----------------------------------------------------------------------------
    def positional_args(self, args: tuple) -> dict[str, Any]:
        """The positional arguments of a call by parameter name (those past the named ones belong to
        `*args`, which has no name here), as Triton's `Autotuner.nargs` holds them."""
        names = self.arg_names if self.positional is None else self.arg_names[: self.positional]
        return dict(zip(names, args, strict=False))

    def arg_value(self, name: str, args: tuple, kwargs: dict) -> Any:
        i = self.arg_names.index(name)
        if i < len(args) and (self.positional is None or i < self.positional):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self.defaults.get(name)

    def full_key(self, args: tuple, kwargs: dict) -> CacheKey:
        """The stored key of a call (kernel + source hash, key fields, dtypes, device, versions)."""
        return self.keys.full(args, kwargs)

    def space_for(self, args: tuple, kwargs: dict) -> SearchSpace:
        if isinstance(self.space, SearchSpace):
            return self.space
        sp = call_users_function(self.space, f"the space function of {self.name}", args, kwargs)
        if not isinstance(sp, SearchSpace):
            raise TypeError(
                f"the space function of {self.name} returned {type(sp).__name__}, not a SearchSpace"
            )
        return sp

    def current_mode(self) -> str:
        m = self.mode or text("TUNER_MODE") or "online"
        if m not in mode_names():
            raise ValueError(f"TUNER_MODE={m!r}: use one of {mode_names()}")
        return m

    # ---- the miss path -------------------------------------------------------------------------------
    def miss(self, args: tuple, kwargs: dict, fast_key: Any, target: Callable[..., Any]) -> dict[str, Any]:
        """The config for a call whose fast key is not in memory: the general key's memo, else the
        resolution chain under a per-key lock (`_resolve_miss`). Remembered under the fast key for the
        hit path."""
        # A call the fast keys do not cover (keywords, too few positional arguments): the general key's
        # memo. It is built from key values and dtypes, which tracers have, so a traced call hits here
        # too, without stand-ins (a tracer among the key values is unhashable: refused below).
        general = None
        if fast_key is None:
            try:
                general = self.keys.general(args, kwargs)
            except TypeError:
                pass
            else:
                cfg = self.mem.get(general)
                if cfg is not None:
                    return cfg
        # Inside `torch.compile` the graph breaks here, and the resolution runs with TorchDynamo off.
        return _torch.outside_compile(self._resolve_miss)(args, kwargs, fast_key, general, target)

    def _resolve_miss(
        self, args: tuple, kwargs: dict, fast_key: Any, general: Any, target: Callable[..., Any]
    ) -> dict[str, Any]:
        traced = self.miss_if_traced(args, kwargs, fast_key if fast_key is not None else general, target)
        if traced is not None:  # inside jit/grad/vmap: resolved on concrete arrays
            return traced
        fake = _torch.placeholder(args, kwargs)
        if fake is not None:  # no data to time: chosen untimed, never stored; real tensors tune the key
            return self._placeholder_miss(args, kwargs, fast_key if fast_key is not None else general, fake)
        # The table's entry of this call (the keyword one for the general key): its function, to see
        # whether building the stored key switched the table (`ArgKeys`, on the first pytree of arrays).
        slot = len(args) if fast_key is not None else KW
        table_fn = self.keys.fast[slot] if slot < len(self.keys.fast) else None
        ck = self.keys.full(args, kwargs)
        if table_fn is not None and self.keys.fast[slot] is not table_fn:
            if fast_key is not None:
                fast_key = self.keys.fast[slot](args)  # type: ignore[misc]
            else:
                with contextlib.suppress(TypeError):
                    general = self.keys.general(args, kwargs)
        if fast_key is None:
            fast_key = general
        inner = candidate_being_timed(self, ck.hash)
        if inner is not None:  # called from a timed run of this key's tuning (recursion): its candidate
            return inner
        mode = self.current_mode()
        with self._guard:
            lock = self._locks.setdefault(ck.hash, threading.Lock())
        retune = self.retune_requested(args, kwargs)
        if not self._wait_for(lock, ck):  # another thread's tuning of the key hangs: not waited for
            return self._offline_choice(args, kwargs, target, self._overdue_why(ck))[1]
        try:
            res = resolve(
                Request(self, ck, args, kwargs, target, mode, create=mode == "online", retune=retune)
            )
            self._note(ck, res)
            self.by_hash[ck.hash] = res.config
        finally:
            lock.release()
            self._overdue.discard(ck.hash)
        if fast_key is not None:
            self.mem[fast_key] = res.config
        return res.config

    def miss_if_traced(
        self, args: tuple, kwargs: dict, memo: Any, target: Callable[..., Any]
    ) -> dict[str, Any] | None:
        """The config of a miss inside a jax trace (`_traced_miss`: tracers among the arguments, or a
        launcher of static arguments only called inside one, `_jax.under_trace`), None for a call outside
        any. A key value that is traced (or a symbolic dimension) is refused first (TypeError,
        `_jax.refuse_traced_key`): it has no value when the config is chosen. `memo`: the call's fast
        key, or None (then its general key, where it has one). Shared by every front end whose key
        builder reads the arguments (`ArgKeys`), the drop-in for `triton.autotune` included."""
        if not (_jax.has_tracer(args, kwargs) or _jax.under_trace()):
            return None
        if isinstance(self.keys, ArgKeys):  # a key value only known at run time cannot select
            _jax.refuse_traced_key(self.name, self.keys.raw_values(args, kwargs))
        if memo is None:
            with contextlib.suppress(TypeError):
                memo = self.keys.general(args, kwargs)
        return self._traced_miss(args, kwargs, memo, target)

    def _wait_for(self, lock: threading.Lock, ck: CacheKey) -> bool:
        """Take the key's miss-path lock; False when the thread holding it (tuning the key) went
        `lease_s` seconds without finishing a trial, the bound another process waits for a claim: a
        hung config (a deadlocked kernel) never returns, and the caller would wait for ever. Once
        a key's tuning is overdue, later calls do not wait again while it still holds the lock."""
        key_hash = ck.hash
        if key_hash in self._overdue:
            return lock.acquire(blocking=False)
        stop = _jax.stop_flag()  # the helper thread of a traced miss: its caller's Ctrl-C stops the wait
        while True:
            last = self.progress.get(key_hash)
            left = self.lease_s - (time.monotonic() - last) if last is not None else self.lease_s
            if _acquire(lock, max(left, 0.0), stop):
                return True
            if self.progress.get(key_hash) == last:  # no trial finished meanwhile
                self._overdue.add(key_hash)
                log.warning(
                    "%s %s: this process's tuning of the key (in another thread) finished no trial for "
                    "%g s (lease_s): a config hangs, or runs far too long; this call does not wait for it "
                    "and takes the offline fallback (the call after the tuning ends uses its winner)",
                    self.name,
                    ck.fields_dict,
                    self.lease_s,
                )
                return False

    def _overdue_why(self, ck: CacheKey) -> str:
        return (
            "online: not waited for this process's tuning of the key (another thread), which finished no "
            f"trial for {self.lease_s:g} s (lease_s)"
        )

    def _traced_miss(
        self, args: tuple, kwargs: dict, memo: Any, target: Callable[..., Any]
    ) -> dict[str, Any]:
        """A miss with tracers among the arguments: tuned on concrete stand-ins (`_jax`). A launcher
        that reads values of the caller's trace that it is not passed (an attribute of a `self` that is
        not a pytree, a closure over a traced value), or that uses a collective over a named axis of the
        caller's shard_map, pmap or vmap, fails there whatever the config (jax's UnexpectedTracerError,
        or NameError "unbound axis name"), although the traced call itself works: the tuning stops at
        its first config (no other is tried, no AllTrialsFailedWarning: `_tuning._stop_if_untimeable`)
        and the config is chosen untimed, as offline mode chooses (store, files, nearest key, cost
        model, space default), for this trace and later traces of the key; an eager call of the key
        still tunes. A first config that fails otherwise is that config's failure: the tuning goes on,
        and raises AllConfigsFailedError when no config runs. A call with
        symbolic dimensions (`jax.export` shape polymorphism) has no size to time: chosen untimed too,
        for this call only (a later trace with concrete shapes of the key tunes it), on stand-ins
        holding 1 for each symbolic dimension; the log line says when no entry has the key computed
        from them."""
        if memo is not None and memo in self.untimed:
            return self.untimed[memo]
        if _jax.symbolic_shapes(args, kwargs):
            why = "shapes with symbolic dimensions (jax.export shape polymorphism) have no size to time"
            unknown = (
                "the key, computed with 1 for every symbolic dimension, is not known{reason}; {chosen}; "
                "to tune it, call it once with concrete shapes of this key (eagerly or under jax.jit)"
            )
            miss = self._untimed(why, unknown=unknown)
            return _jax.resolve_on_concrete(miss, self.name, args, kwargs, memo, target)
        try:
            return _jax.resolve_on_concrete(self.miss, self.name, args, kwargs, memo, target, self.stand_ins)
        except AllConfigsFailedError as exc:
            reason = _jax.untimeable_reason(exc.errors)
            if reason is None:
                raise
        cfg = _jax.resolve_on_concrete(self._untimed(reason), self.name, args, kwargs, memo, target)
        if memo is not None:
            self.untimed[memo] = cfg
        return cfg

    def _untimed(
        self, reason: str, *, unknown: str = ""
    ) -> Callable[[tuple, dict, Any, Callable[..., Any]], dict[str, Any]]:
        """A miss function (as `miss`) giving the config of offline mode's chain for a call that cannot
        be timed (`_traced_miss`), noted as not timed for `reason` (and `unknown` as `_offline_choice`
        says)."""

        def untimed_miss(
            args: tuple, kwargs: dict, fast_key: Any, target: Callable[..., Any]
        ) -> dict[str, Any]:
            return self._offline_choice(args, kwargs, target, f"not timed: {reason}", unknown=unknown)[1]

        return untimed_miss

    def _placeholder_miss(self, args: tuple, kwargs: dict, memo: Any, what: str) -> dict[str, Any]:
        """A miss of a call with torch placeholder tensors (`_torch.placeholder`: a FakeTensor, a meta
        tensor): nothing to time, so the config is the one offline mode would choose (store, files,
        nearest key, cost model, space default), remembered for later placeholder calls of the key only
        (`untimed`); nothing is stored, and the key's first call with real tensors tunes it."""
        if memo is not None and memo in self.untimed:
            return self.untimed[memo]
        why = f"not timed: called with {what}, which holds no data"
        ck, cfg = self._offline_choice(args, kwargs, self.fn, why, quiet=True)
        self._logged.discard(ck.hash)  # the real call's choice is still logged
        if memo is not None:
            self.untimed[memo] = cfg
        return cfg

    def _offline_choice(
        self,
        args: tuple,
        kwargs: dict,
        target: Callable[..., Any],
        why: str,
        *,
        quiet: bool = False,
        unknown: str = "",
    ) -> tuple[Any, dict[str, Any]]:
        """(stored key, config) of offline mode's chain for a call that is not timed, noted with `why`
        before the chain's own reason (`quiet`: at debug level). `unknown`, when no memory, file or store
        entry has the key (the chain's tail chose), takes the chain's reason's place, formatted with
        `reason` (" (why the key missed)", or "" where the note says it: an entry of the key that cannot
        be used) and `chosen` (the tail's reason: nearest key, cost model, zero-shot prediction or space
        default)."""
        ck = self.keys.full(args, kwargs)
        res = resolve(Request(self, ck, args, kwargs, target, "offline", create=False, retune=False))
        chain = res.why
        if unknown and res.hit is None:
            reason = "" if res.unused or not res.miss else f" ({res.miss})"  # this call's, not the last's
            chain = unknown.format(reason=reason, chosen=res.why)
        self._note(ck, dataclasses.replace(res, why=f"{why}; {chain}", quiet=quiet or res.quiet))
        return ck, res.config

    def retune_requested(self, args: tuple, kwargs: dict) -> bool:
        """Whether code asked this call's key to be tuned again (the `triton.autotune` drop-in: its key
        was taken out of `.cache`): the lookups of files and store are then skipped in a mode that
        tunes."""
        return False

    def _note(self, ck: CacheKey, res: Resolution) -> None:
        if res.stat is not None:
            self.stats[res.stat] += 1
        if res.hit == "in memory":
            return
        self.last_choice = {"key": ck.to_json(), "config": res.config, "why": res.why}
        if ck.hash not in self._logged:
            self._logged.add(ck.hash)
            (log.debug if res.quiet else log.warning)(
                "%s %s%s: using %s (%s)%s",
                self.name,
                ck.fields_dict,
                f" {list(ck.dtypes)}" if ck.dtypes else "",  # two dtypes of one shape: two lines that differ
                res.config,
                res.why,
                f"; not used: {res.unused}" if res.unused else "",
            )

    # ---- introspection -------------------------------------------------------------------------------
    def explain(self, *args: Any, **kwargs: Any) -> str:
        """Say, without tuning or writing anything, what a call with these arguments would use and why."""
        ck = self.keys.full(args, kwargs)
        retune = self.retune_requested(args, kwargs)
        req = Request(self, ck, args, kwargs, self.fn, self.current_mode(), create=False, retune=retune)
        res = lookup(req, lookups(req))
        if res is None:
            return f"miss: {miss_reason(req)}; key {ck.to_json()}"
        if res.hit == "in memory":
            return f"hit (in memory): {res.config} for key {ck.to_json()}"
        return f"hit ({res.hit}): {res.config}"

    def cache_clear(self) -> None:
        """Forget the in-memory configs (the store and files are untouched)."""
        self.mem.clear()
        self.by_hash.clear()
        self.untimed.clear()
        self._logged.clear()


# How often a helper thread of a traced miss that waits for another thread's tuning of its key checks
# whether its caller was interrupted (`_acquire`).
_STOP_POLL_S = 0.05


def _acquire(lock: threading.Lock, timeout: float, stop: threading.Event | None) -> bool:
    """`lock.acquire(timeout=timeout)`; where `stop` is the stop flag of a traced miss's helper thread
    (`_jax.stop_flag`), in slices of `_STOP_POLL_S`, raising KeyboardInterrupt once it is set
    (`_jax.raise_if_stopped`): a thread blocked in `acquire` runs no Python code, so neither the
    KeyboardInterrupt that `_jax._stop_helper` raises in it nor the flag would reach it before the
    other thread's tuning ends or the lease runs out, and the interrupted caller waits for that."""
    if stop is None:
        return lock.acquire(timeout=timeout)
    end = time.monotonic() + timeout
    while True:
        _jax.raise_if_stopped()
        if lock.acquire(timeout=min(_STOP_POLL_S, max(end - time.monotonic(), 0.0))):
            return True
        if time.monotonic() >= end:
            return False


# Every Autotuned of the process, for `_after_fork_in_child`.
_instances: weakref.WeakSet[Autotuned] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for t in list(_instances):
        t._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _load_own_cache(cache: ReadOnlyCache | str | os.PathLike[str] | None) -> ReadOnlyCache | None:
    """A function's own `cache=`: a path is loaded now; one that cannot be used is skipped with one
    warning (a shipped file never takes the program down)."""
    if not isinstance(cache, (str, os.PathLike)):
        return cache
    try:
        return load_cache(cache)
    except CacheFileError as exc:
        warn_once(("file", str(cache)), "cache file skipped: %s", exc)
        return None


def _attach(wrapper: Any, t: Autotuned) -> Any:
    wrapper.tuner = t
    wrapper.explain = t.explain
    wrapper.cache_clear = t.cache_clear
    wrapper.__wrapped__ = t.fn
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(wrapper, attr, getattr(underlying_function(t.fn), attr))
    # A `jax.custom_vjp`/`custom_jvp` decorated before its rule is defined: `f.defvjp(fwd, bwd)` (or
    # `@f.defjvp`) on the decorated name defines it on the function that the wrapper calls.
    for attr in ("defvjp", "defjvp", "defjvps"):
        method = getattr(t.fn, attr, None)
        if callable(method) and (type(t.fn).__module__ or "").startswith("jax"):
            setattr(wrapper, attr, method)
    return wrapper


def _triton_positional(
    space: Any, triton_args: tuple[Any, ...], configs: Any, key: Any, triton_kw: dict[str, Any]
) -> tuple[Sequence[Any], Any]:
    """triton.autotune's positional form (code written for Triton may use it: `triton.autotune(configs,
    key)`, as Triton's fused-attention tutorial did): a list (or tuple) of configs first, then `key` and
    `TRITON_KEYWORDS` in Triton's order. Returns the configs (the object given, which the kernel's
    `.configs` is, as with `configs=`) and the key, and puts the positional keywords in `triton_kw`; a
    parameter given both ways is a TypeError, as Python raises for Triton's function."""
    if not isinstance(space, (list, tuple)):
        raise TypeError(
            f"autotune() takes one positional argument (a SearchSpace or a function returning one) unless "
            f"the first is triton.autotune's list of configs; got {type(space).__name__} and "
            f"{len(triton_args)} more"
        )
    if configs is not None:
        raise TypeError("autotune() got multiple values for argument 'configs'")
    names = ("key", *TRITON_KEYWORDS)
    if len(triton_args) > len(names):
        raise TypeError(
            f"autotune() takes at most {len(names) + 1} positional arguments in triton.autotune's order "
            f"(configs, {', '.join(names)}); {len(triton_args) + 1} were given"
        )
    given = {"key": key, **triton_kw}
    for name, value in zip(names, triton_args, strict=False):
        if given[name] is not (False if name == "use_cuda_graph" else None):
            raise TypeError(f"autotune() got multiple values for argument {name!r}")
        given[name] = value
    triton_kw.update((n, given[n]) for n in TRITON_KEYWORDS)
    return space, given["key"]


def _holds_objects(configs: Any) -> bool:
    """Whether a dict config holds a value that a space cannot hold but a launch can take: a tuple (a
    Pallas launcher's static `block_size=(bm, bn, bk)`), None, a dtype, an infinite float. Such configs are
    run by the drop-in for `triton.autotune` (`_triton_compat`), which stores each as its string and
    launches the object it stands for, as it does for a `triton.Config`'s values."""
    from tuner.search_spaces._params import native

    def plain(v: Any) -> bool:
        v = native(v)
        if isinstance(v, (str, bool)):
            return True
        try:
            return isinstance(v, (int, float)) and math.isfinite(v)
        except OverflowError:  # an int beyond a float's range
            return False

    return isinstance(configs, (list, tuple)) and any(
        isinstance(c, Mapping) and not all(plain(v) for v in c.values()) for c in configs
    )


def _lazy_kind(fn: Any) -> str | None:
    """What kind of function `fn` is when calling it runs none of its body (an `async def`, an async or
    plain generator function), else None."""
    if inspect.iscoroutinefunction(fn):
        return "a coroutine function (async def)"
    if inspect.isasyncgenfunction(fn):
        return "an async generator function"
    if inspect.isgeneratorfunction(fn):
        return "a generator function"
    return None


def _check_key(key: Any) -> None:
    """TypeError for a `key` that is none of the accepted forms (before the decorated function is seen)."""
    if callable(key) or isinstance(key, str):
        return
    if isinstance(key, Collection) and all(isinstance(k, str) for k in key):
        return
    raise TypeError(
        f"autotune(): key must be a list of argument names, one argument name, or a function of the "
        f"arguments returning the key fields; got {type(key).__name__} {key!r}"
    )


def autotune(
    space: SearchSpace | Callable[..., SearchSpace] | None = None,
    *triton_args: Any,
    key: Sequence[str] | Callable[..., Any] | None = None,
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
    stand_ins: StandInsArg | None = None,
) -> Callable[[Any], Any]:
    """Decorate a kernel launcher so that it tunes itself once per key and then runs from a cache.

    - `space`: a SearchSpace, or a function of the call's arguments returning one; or give `configs`,
      a list of dicts or `triton.Config`s (kwargs plus num_warps/num_stages) as with triton.autotune
      (an iterator of them is read once into a list).
      triton.autotune's positional form works too: `autotune(configs, key, prune_configs_by, ...)`, the
      list first and the others in Triton's order.
    - `key`: argument names (their values form the key, as in triton.autotune; a numpy scalar counts as
      the Python number it holds), or a function of the arguments (called as the decorated function
      is) returning a dict of key fields (a tuple: fields k0, k1, ...; another value: one field k). The dtypes of array arguments, and of the arrays inside
      pytree arguments (a params dict, a tuple of arrays), are added (`dtypes=False` turns that off),
      and the stored key also holds the source hash, the device and the versions. Inside jax.jit a key
      field must be static: one that jit traces is refused with a TypeError.
    - `bucket`: "exact" (default), "pow2" (round positive ints up to a power of two), a callable
      `(name, value) -> value`, or a dict name -> policy.
    - `budget` evaluations and/or `time_budget_s` seconds per key, with `strategy` (default "auto") warm-
      started from what the store already knows about this kernel. Default: every config of an
      explicit `configs` list (as triton.autotune), 20 for a space; a smaller `budget` with `configs`
      times only that many, chosen by the strategy's cost model (opt-in).
    - the keywords of `triton.autotune` (`prune_configs_by`, `reset_to_zero`, `restore_value`,
      `pre_hook`, `post_hook`, `warmup`, `rep`, `use_cuda_graph`, `do_bench`, `cache_results`) with
      `configs`, with Triton's semantics (see `_triton_compat`); a Triton kernel with `configs` gets
      `.cache`, `.best_config` and `.configs` as with triton.autotune.
    - `mode`: "online" (tune misses), "offline" (never tune: nearest cached key, else the cost-model
      hook, else the zero-shot predictor, else the space default), "record" (offline, and each miss is
      recorded for `tuner misses`; docs/production.md), or a mode added with
      `tuner.runtime._resolve.register_mode`; None reads $TUNER_MODE (default online).
    - `storage`: None (the default store, $TUNER_HOME/tuner.db), a URL, a ResultStore or ConfigCache,
      or False (memory only). `cache`: a shipped file (path or `load_cache(path)`) consulted first; a
      path that cannot be used is skipped with a warning. A store or file fault never fails the call:
      the call goes on with the other layers (online: tuning in memory), one warning per cause.
    - `bench(call) -> seconds | (median, spread)`; default: the CPU timer for plain callables and the
      interpreters, triton.testing.do_bench for Triton on a GPU, block_until_ready timing for jax (and
      for any call without arrays of another framework once jax is imported). A launcher that donates
      its jax inputs (`jax.jit(..., donate_argnums=...)`) is timed on copies of them.
    - `restore`: names of array arguments the kernel writes in place; they are copied before tuning and
      restored before each config is timed and after tuning, so the tuning call's result is right
      (jax arrays, immutable, are skipped).
    - `depends`: other functions whose source is part of the kernel's identity (e.g. the @triton.jit
      kernel that a plain-Python launcher calls): editing them makes old entries stale, and so does
      upgrading the compiler of a `@triton.jit` or `jax.jit` function among them (its versions join the
      key's, as for a decorated Triton kernel).
    - `stand_ins`: for a miss inside a jax trace, the values of the traced arguments whose values set the
      work (group sizes, lengths), in place of the generic stand-ins (zeros for integer dtypes): a dict
      {argument name: array, or function of its abstract value (`jax.ShapeDtypeStruct` leaves)}, or a
      function of the call's abstract arguments returning one (`_stand_ins`). Checked against the traced
      argument's structure, shapes and dtypes (ValueError naming what differs).
    - `lease_s`: how long a claim to tune a key stays valid without renewal (another process takes over
      a key whose tuner died after this long; a config whose timing outlived it is not timed again, and
      the other threads of the process stop waiting for a tuning that finished no trial for this long
      and take offline mode's fallback; docs/production.md).
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
    if isinstance(configs, Iterator):  # a generator of configs: read once, as a list
        configs = list(configs)
    if isinstance(space, Iterator):  # the same, in the positional form
        space = list(space)  # type: ignore[assignment]
    if triton_args or isinstance(space, (list, tuple)):
        configs, key = _triton_positional(space, triton_args, configs, key, triton_kw)
        space = None
    if key is None:
        raise TypeError("autotune() missing required argument: 'key'")
    _check_key(key)
    opts = {
        "time_budget_s": time_budget_s,
        "mode": mode,
        "bucket": bucket,
        "storage": storage,
        "bench": bench,
        "cache": cache,
        "name": name,
        "dtypes": dtypes,
        "seed": seed,
        "strategy": strategy,
        "cost_model": cost_model,
        "lease_s": lease_s,
        "restore": restore,
        "depends": depends,
        "user_stand_ins": stand_ins,
    }

    def deco(fn: Any) -> Any:
        lazy = _lazy_kind(fn)
        if lazy is not None:
            raise TypeError(
                f"autotune cannot time {default_name(fn)}: it is {lazy}, whose call returns before the "
                "work runs, so every config would time the same nothing; decorate the function that "
                "does the work instead (for a coroutine: the launcher it awaits)"
            )
        if configs is not None and (
            kind_of(fn) == "triton" or any(triton_kw.values()) or _holds_objects(configs)
        ):
            from ._triton_compat import build  # triton.autotune's keywords, with Triton's semantics

            return build(fn, triton_kw, configs=configs, key=key, budget=budget, **opts)
        if any(triton_kw.values()):
            raise ValueError(
                "the triton.autotune keywords need configs=[...] (triton.Config objects or dicts)"
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
            user_stand_ins=stand_ins,
        )
        if t.kind == "triton":
            return AutotunedKernel(t)
        return _attach(make_hit_path(t.fn, t.keys.fast, t.mem, t.miss), t)

    return deco
