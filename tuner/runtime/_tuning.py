"""The online tail of the resolution chain: tune a key once, across threads (the per-key lock in
`Autotuned.miss`) and processes sharing a store (a claim row), and store the winner.

Benching and restoring are the injected parts of the decorated function (`Autotuned.timer`,
`Autotuned.restorer`); what is benched is the request's `target`, the very callable the hit path runs.
A store that cannot be written (read-only, full, locked past its timeout) does not stop tuning: the
winner is kept in memory and one warning says why (`_sources.guarded`). A stored entry that the tuning
replaces (its config is no longer in the space, or the space holds configs its key's tuning did not time,
`_coverage`) is overwritten even though its recorded time is lower: the new tuning timed the whole
current space, the old winner included if it is still there.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import _jax, _returned
from ._bench import TritonTiming, normalise_bench_result
from ._coverage import task_of
from ._entry import CacheEntry, EntryError, now_iso
from ._key import canon
from ._resolve import Request, Resolution, usable_config, valid_config
from ._sources import _redact, guarded

if TYPE_CHECKING:  # pragma: no cover
    from .._optimize import TuneResult
    from ..store import Measurement
    from ._db import ConfigCache
    from ._key import CacheKey

log = logging.getLogger(__name__)

__all__ = ["tune_once", "AllConfigsFailedError", "stored_timings", "candidate_being_timed"]


class AllConfigsFailedError(RuntimeError):
    """Tuning a key found no config that runs: every timed config raised (or timed inf/NaN), or, on the
    stand-ins of a jax trace, the first config failed for a reason of that trace, which every config
    meets (`_stop_if_untimeable`). `.errors`: each failed trial's error text ("TypeName: message"; ""
    where it has none)."""

    def __init__(self, message: str, errors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors


def _traced_config_hint(t: Any, space: Any, first: str | None) -> str:
    """What to do when a `jax.jit`-compiled launcher failed on a tracer: the config arrives as keyword
    arguments, which `jax.jit` traces unless they are static, so every config fails the same way."""
    if t.kind != "jax" or not first or "tracer" not in first.lower():
        return ""
    names = list(getattr(space, "names", ()))
    return (
        f" (the config reaches the jax.jit-compiled {t.name} as traced values: make its parameters static, "
        f"jax.jit(..., static_argnames={names!r}))"
    )


class ConfigHung(RuntimeError):
    """The trial of a config whose timing outlived an earlier owner's claim of the key (it hung there):
    failed without being timed again."""


class ConfigCrashed(ConfigHung):
    """The trial of a config whose timings killed their process (`ConfigCache.hung_configs`): failed
    without being timed again."""


CRASHED = "crashed the process while timed"  # how `hung_configs` words a config that killed its timers


def _warn_earlier(name: str, ck: CacheKey, hung: dict[str, str], crashes: dict[str, int]) -> None:
    """One warning for the configs an earlier owner of the key's claim left behind, by what they did."""
    crashed = sorted(c for c, e in hung.items() if e.startswith(CRASHED))
    stuck = sorted(c for c in hung if c not in crashed)
    if stuck:
        log.warning(
            "%s %s: %d config(s) hung in an earlier tuning of this key, past its claim's lease; not timed "
            "again: %s",
            name,
            ck.fields_dict,
            len(stuck),
            ", ".join(stuck),
        )
    for c in crashed:
        log.warning("%s %s: config %s %s; not timed again", name, ck.fields_dict, c, hung[c])
    for c, n in sorted(crashes.items()):
        log.warning(
            "%s %s: config %s killed the process that timed it (%d time(s)): timed again, as the death may "
            "have had another cause; if it kills this process too, no process times it again",
            name,
            ck.fields_dict,
            c,
            n,
        )


# The claims this process holds now: (store, key hash, owner). A tuning in a daemon thread (a server's
# warm-up thread, a background worker) is stopped without its `finally` when the interpreter exits: its
# claim would stay, and processes on other hosts would wait out its lease for a tuning that is not
# running. `_release_at_exit` releases them (atexit runs before daemon threads are stopped).
_held: dict[tuple[int, str, str], ConfigCache] = {}
_exit_hook = [False, False]  # the atexit hooks registered: claims, marks


def _hold(db: ConfigCache, key_hash: str, owner: str) -> None:
    if not _exit_hook[0]:
        _exit_hook[0] = True
        atexit.register(_release_at_exit)
    _held[(id(db), key_hash, owner)] = db
    _claimed_again(db, key_hash, owner)


def _release_at_exit() -> None:
    for (_, key_hash, owner), db in list(_held.items()):
        guarded(db, "write", "release a claim at exit", lambda: db.release(key_hash, owner), None)  # noqa: B023
    _held.clear()


def _after_fork_in_child() -> None:  # the parent's claims are the parent's to release
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# What a store outage kept this process from deleting, by id(store): the marks of timings that returned
# (`ConfigCache.mark_measuring`) and the claims of keys it finished with (key hash, owner).
# Left in the store, a mark reads as its config's hang to the next process that tunes the key (another
# host's, or any once the mark is older than the claim's lease), which then never times that config, the
# best one perhaps, and stores a slower winner for the fleet; a claim keeps every other process's first
# call of the key waiting for a tuning that is not running until its lease runs out (`lease_s`, 120 s).
# A daemon thread deletes them once the store answers again (every CLEANUP_RETRY_S), and the process
# tries once more at exit.
CLEANUP_RETRY_S = 5.0


class _Leftovers:
    __slots__ = ("db", "marks", "claims")

    def __init__(self, db: ConfigCache) -> None:
        self.db = db
        self.marks: set[int] = set()
        self.claims: set[tuple[str, str]] = set()


_leftovers: dict[int, _Leftovers] = {}
_leftovers_lock = threading.Lock()
_cleanup_thread: list[threading.Thread | None] = [None]


def _unmark(db: ConfigCache, *row_ids: int) -> bool:
    db.unmark(*row_ids)
    return True


def _clean_later(db: ConfigCache, *, mark: int | None = None, claim: tuple[str, str] | None = None) -> None:
    with _leftovers_lock:
        left = _leftovers.setdefault(id(db), _Leftovers(db))
        if mark is not None:
            left.marks.add(mark)
        if claim is not None:
            left.claims.add(claim)
        if not _exit_hook[1]:
            _exit_hook[1] = True
            atexit.register(_clean_at_exit)
        th = _cleanup_thread[0]
        if th is None or not th.is_alive():
            th = threading.Thread(target=_cleanup_loop, name="tuner-store-cleanup", daemon=True)
            _cleanup_thread[0] = th
            th.start()


def _claimed_again(db: ConfigCache, key_hash: str, owner: str) -> None:
    """This owner holds the claim of `key_hash` anew: an earlier release of it left to do is void."""
    with _leftovers_lock:
        left = _leftovers.get(id(db))
        if left is not None:
            left.claims.discard((key_hash, owner))


def _clean(left: _Leftovers, marks: set[int], claims: set[tuple[str, str]]) -> bool:
    if marks:
        left.db.unmark(*marks)
        _returned.forget(left.db.store.url, *marks)
    for key_hash, owner in claims:
        with _leftovers_lock:
            if (key_hash, owner) not in left.claims:  # claimed again meanwhile (`_claimed_again`)
                continue
        left.db.release(key_hash, owner)
    return True


def _clean_pending(each: Callable[[_Leftovers, set[int], set[tuple[str, str]]], bool]) -> bool:
    """Delete what is left store by store with `each(leftovers, marks, claims)` (True: done); True when
    nothing is left."""
    with _leftovers_lock:
        work = [(left, set(left.marks), set(left.claims)) for left in _leftovers.values()]
    for left, marks, claims in work:
        if not (marks or claims) or not each(left, marks, claims):
            continue
        log.info(
            "store %s: deleted %d mark(s) of timed configs and %d claim(s) left while it was down",
            _redact(getattr(left.db.store, "url", "?")),
            len(marks),
            len(claims),
        )
        with _leftovers_lock:
            left.marks.difference_update(marks)
            left.claims.difference_update(claims)
            if not (left.marks or left.claims):
                _leftovers.pop(id(left.db), None)
    with _leftovers_lock:
        return not _leftovers


def _quietly(left: _Leftovers, marks: set[int], claims: set[tuple[str, str]]) -> bool:
    from ..store import StoreCorrupt

    try:  # the store may still be down: tried again later, no warning (the failed step gave one)
        _clean(left, marks, claims)
    except StoreCorrupt:  # a damaged file is left alone (`guarded` said so): nothing more is tried on it
        with _leftovers_lock:
            _leftovers.pop(id(left.db), None)
        return False
    except Exception:
        return False
    return True


def _cleanup_loop() -> None:
    while True:
        time.sleep(CLEANUP_RETRY_S)
        if _clean_pending(_quietly):
            with _leftovers_lock:
                if not _leftovers:  # else something was added meanwhile: go on
                    _cleanup_thread[0] = None
                    return


def _clean_at_exit() -> None:
    def each(left: _Leftovers, marks: set[int], claims: set[tuple[str, str]]) -> bool:
        what = "delete the marks of timed configs and the claims left at exit"
        return guarded(left.db, "write", what, lambda: _clean(left, marks, claims), False)

    _clean_pending(each)


def _forget_leftovers_in_child() -> None:  # the parent's leftovers are the parent's to delete
    global _leftovers_lock
    _leftovers_lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _leftovers.clear()
    _cleanup_thread[0] = None


os.register_at_fork(after_in_child=_forget_leftovers_in_child)


# The config each tuning of this thread is timing now, by (Autotuned id, key hash): a timed call that calls
# the decorated function again with the same key (recursion) runs with it (`candidate_being_timed`).
_timing = threading.local()


def candidate_being_timed(t: Any, key_hash: str) -> dict[str, Any] | None:
    """The config this thread's tuning of `t`'s key `key_hash` is timing now, or None. The miss path
    asks before it takes the key's lock: a call made from inside a timed run (a decorated function
    that calls itself with the same key) would otherwise wait on the lock its own tuning holds, for
    ever. It runs with the candidate, so each candidate is timed over the whole recursion."""
    current: dict[tuple[int, str], dict[str, Any]] | None = getattr(_timing, "current", None)
    return None if current is None else current.get((id(t), key_hash))


def _waited(cfg: dict[str, Any]) -> Resolution:
    return Resolution(cfg, "tuned by another process", "waited")


def tune_once(req: Request) -> Resolution:
    """Tune unless another process is tuning this key (claim row), in which case wait for its entry."""
    db = req.store()
    if db is None:
        return _tune(req, None, None, stale=False)
    from ._db import owner_id

    ck, t = req.key, req.t
    owner = owner_id()
    delay = 0.02
    waited: tuple[float, str] | None = None
    try:
        while True:
            # Whether a claim of this owner may be in the store: the claim is committed before `claim`
            # returns, so an interrupt (Ctrl-C, SIGTERM's KeyboardInterrupt) that arrives in between must
            # release it too, or this process's next call of the key and every other process would wait
            # out its lease for a tuning that is not running.
            held: bool | None = True
            try:
                held = claimed = guarded(
                    db, "write", "claim the key for tuning", lambda: db.claim(ck.hash, owner, t.lease_s), None
                )
                if claimed is None:  # the store cannot be written: tune in memory
                    return _tune(req, None, None, stale=False)
                if claimed:
                    _hold(db, ck.hash, owner)
                    # another process may have finished just before our claim
                    e = guarded(db, "read", "read an entry", lambda: db.get(ck), None)
                    if req.retune:  # asked to tune again: the stored entry is not used (it stays, or the
                        # faster of it and the new winner does; an entry whose config left the space is
                        # replaced), but the claim is held as for any tuning, so that its timings are
                        # marked and the configs recorded as hung or crashed are not timed again
                        stale = e is not None and valid_config(req.space, e.config) is None
                        return _tune(req, db, owner, stale=stale)
                    cfg = usable_config(req, e) if e is not None else None
                    if cfg is not None:
                        return _waited(cfg)
                    return _tune(req, db, owner, stale=e is not None)
            finally:
                if held:
                    _release(db, ck.hash, owner)
            # another process holds the claim within its lease (renewed as its trials finish): the
            # threads of this process that wait for this one (`Autotuned._wait_for`) wait for it too
            t.progress[ck.hash] = time.monotonic()
            # a retune waits for the claim to time the configs itself; the entry it finds is not used
            e = None if req.retune else guarded(db, "read", "read an entry", lambda: db.get(ck), None)
            if e is not None:
                cfg = usable_config(req, e)  # not an entry whose tuning the holder is widening
                if cfg is not None:
                    return _waited(cfg)
            waited = _log_wait(t.name, ck, db, waited)
            _jax.raise_if_stopped()
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        t.progress.pop(ck.hash, None)  # no thread of this process waits for a tuning of it now


def _release(db: ConfigCache, key_hash: str, owner: str) -> None:
    """Release this owner's claim of `key_hash` (nothing when it holds none). A release that an interrupt
    stops (its transaction is rolled back, the claim stays) is done once more before the interrupt goes
    on."""

    def release() -> bool:
        db.release(key_hash, owner)
        return True

    released = False
    try:
        released = guarded(db, "write", "release a claim", release, False)
    except BaseException:
        released = guarded(db, "write", "release a claim", release, False)
        raise
    finally:
        _held.pop((id(db), key_hash, owner), None)
        if not released:  # the store is down: the claim would keep the other processes waiting
            _clean_later(db, claim=(key_hash, owner))


def _invoker(req: Request, restore: Callable[[], None] | None) -> Callable[[dict[str, Any]], Any]:
    """config -> a no-argument call of the target with it (putting the inputs back first when the
    restorer asks for every call; giving a launcher that donates its jax inputs copies of them,
    `_jax.donation_guard`)."""
    target, args, kwargs = req.target, req.args, req.kwargs
    guard = _jax.donation_guard(args, kwargs)  # None without jax arrays among the arguments
    before = restore if restore is not None and req.t.restorer.every_call else None

    def each(cfg: dict[str, Any]) -> Callable[[], Any]:
        if guard is not None:
            run = guard(lambda a, k: target(*a, **k, **cfg))
        else:

            def run() -> Any:
                return target(*args, **kwargs, **cfg)

        if before is None:
            return run

        def call() -> Any:
            before()
            return run()

        return call

    return each


_warned_event_loop: set[str] = set()  # kernels already warned about (`_warn_if_on_an_event_loop`)


def _warn_if_on_an_event_loop(name: str) -> None:
    """A tuning that starts on the thread of a running asyncio event loop blocks every coroutine of that
    loop until it ends: say so, once per kernel and process (asyncio is not imported for this)."""
    aio = sys.modules.get("asyncio")
    if aio is None or name in _warned_event_loop:
        return
    try:
        aio.get_running_loop()
    except RuntimeError:  # no loop runs on this thread
        return
    _warned_event_loop.add(name)
    log.warning(
        "tuner: tuning %s on the thread of a running asyncio event loop: the loop is blocked until the "
        "tuning ends; tune before serving, ship a cache file (offline mode), or make the first call "
        "through asyncio.to_thread (docs/production.md of tuner's repository)",
        name,
    )


def _tune(req: Request, db: ConfigCache | None, owner: str | None, *, stale: bool) -> Resolution:
    """Tune `req.key` over `req.space`; record the trials and store the winner when `db` is given
    (`stale`: the stored entry for the key cannot serve the space and is to be replaced)."""
    from .._optimize import all_failed_raised_by_caller, optimize

    t, ck = req.t, req.key
    space = req.space
    clash = [n for n in space.names if n in req.kwargs]
    if clash:  # every candidate would raise Python's own error (or a bare KeyError): say it once, untimed
        raise TypeError(
            f"{t.name}() got multiple values for keyword argument {clash[0]!r}: "
            f"{', '.join(map(repr, clash))} {'is a parameter' if len(clash) == 1 else 'are parameters'} "
            "of the search space, which the chosen config passes; do not pass it in the call"
        )
    _warn_if_on_an_event_loop(t.name)
    bench = t.timer(req.args, req.kwargs, ck.device)
    restore = t.restorer.take(req.args, req.kwargs)
    invoke = _invoker(req, restore)
    spreads: dict[str, float] = {}
    quantiles: dict[str, tuple[float, float]] = {}  # (p20, p80) s, of a timer that gives them
    raw: dict[str, Any] = {}  # what a timer of Triton's kind returned (`TritonTiming`): Triton's order

    current = getattr(_timing, "current", None)
    if current is None:
        current = _timing.current = {}
    slot = (id(t), ck.hash)

    store = db.store if db is not None else None
    task = task_of(t.name, ck) if store is not None else None
    # A config whose timing outlived an earlier owner's claim (it hung in it) is not timed again; each
    # timing under the claim is marked first, so that a hang here is known to the next owner the same way.
    hung: dict[str, str] = {}
    crashes: dict[str, int] = {}  # configs to time again whose timing killed an earlier owner: how often
    if db is not None and owner is not None and task is not None:
        hung, crashes = guarded(
            db,
            "write",
            "read the hung configs",
            lambda: db.hung_configs(task.task_id, ck.hash, owner, t.lease_s),
            (hung, crashes),
        )
        _warn_earlier(t.name, ck, hung, crashes)
    fingerprint = space.fingerprint() if owner is not None else ""

    def objective(cfg: dict[str, Any]) -> float:
        _jax.raise_if_stopped()  # the caller of a traced miss was interrupted: no config is timed after
        earlier = hung.get(canon(cfg))
        if earlier is not None:
            raise (ConfigCrashed if earlier.startswith(CRASHED) else ConfigHung)(earlier)
        if restore is not None:
            restore()
        current[slot] = cfg
        mark = None
        if db is not None and owner is not None and task is not None:
            mark = guarded(
                db,
                "write",
                "mark the config being timed",
                lambda: db.mark_measuring(
                    task, fingerprint, cfg, ck.hash, owner, t.lease_s, crashes.get(canon(cfg), 0)
                ),
                None,
            )
        try:
            timed = bench(invoke(cfg))
        finally:
            current.pop(slot, None)
            if mark is not None and db is not None:
                unmarked = guarded(db, "write", "unmark the config timed", lambda: _unmark(db, mark), False)
                if not unmarked:
                    # a later owner does not take it for a crash
                    _returned.note(db.store.url, mark, owner or "")
                    _clean_later(db, mark=mark)
        med, spread = normalise_bench_result(timed)
        spreads[canon(cfg)] = spread
        if isinstance(timed, (tuple, list)) and len(timed) == 3:
            quantiles[canon(cfg)] = (float(timed[1]), float(timed[2]))
        if isinstance(timed, TritonTiming):
            raw[canon(cfg)] = timed.raw
        return med

    prior = None
    if db is not None and store is not None and task is not None:
        task_id = task.task_id
        if _uses_prior(t.strategy):  # bounded, indexed read (ResultStore.prior_for)
            prior = guarded(
                db, "read", "read the prior", lambda: store.prior_for(t.name, exclude_task=task_id), None
            )

    last_renew = [time.monotonic()]

    def renew(_trial: Any, _res: Any) -> None:
        if db is not None and owner is not None and time.monotonic() - last_renew[0] > t.lease_s / 4:
            guarded(db, "write", "renew a claim", lambda: db.renew(ck.hash, owner, t.lease_s), None)
            last_renew[0] = time.monotonic()

    study = dict(t.study_run or {})  # a study executor's task: keep the trials in its Optuna study
    outer = study.get("callback")
    on_stand_ins = [_jax.on_stand_ins()]  # a tuning on jax stand-ins, before its first trial is seen

    def progress(trial: Any, res: Any) -> None:
        t.progress[ck.hash] = time.monotonic()  # the threads waiting for the key wait on (`_wait_for`)
        _jax.raise_if_stopped()
        if on_stand_ins[0]:
            on_stand_ins[0] = False
            _stop_if_untimeable(t.name, ck, trial)
        renew(trial, res)
        if outer is not None:
            outer(trial, res)

    t0 = time.perf_counter()
    t.progress[ck.hash] = time.monotonic()
    try:
        with all_failed_raised_by_caller():  # AllConfigsFailedError below says it, with the first error
            res = optimize(
                space,
                objective,
                budget=t.budget,
                seed=t.seed,
                strategy=t.strategy,
                prior=study.get("prior") or prior or None,
                time_budget_s=t.time_budget_s,
                callback=progress,
                storage=study.get("storage"),
                study_name=study.get("study_name"),
                recorder=(lambda _trial: None) if study.get("storage") else None,
            )
    finally:
        t.progress.pop(ck.hash, None)
        if restore is not None:
            restore()  # the call that follows sees the inputs as the caller passed them
    _jax.raise_if_stopped()  # nothing recorded or stored after the interrupt, as in an eager tuning
    run = uuid.uuid4().hex[:16]  # this tuning's trials, told apart from an earlier tuning's of the key

    def record() -> None:
        if store is None or db is None:
            return
        st = store

        def each() -> None:
            for tr in res.trials:
                # the exact key and the spread: what `stored_timings` gives a later process that hits,
                # and what `_coverage` reads to see which configs a tuning of the key tried
                extra: dict[str, Any] = {
                    "key": ck.hash,
                    "tuning": run,
                    "spread_s": spreads.get(canon(tr.config), 0.0),
                }
                if canon(tr.config) in quantiles:  # Triton's do_bench quantiles, for `.configs_timings`
                    extra["p20_s"], extra["p80_s"] = quantiles[canon(tr.config)]
                st.record_trial(task, space, tr, strategy=res.strategy, stats=extra)

        guarded(db, "write", "record the trials", each, None)

    if res.best_config is None:
        record()
        first = next((tr.error for tr in res.trials if tr.error), None)
        raise AllConfigsFailedError(
            f"{t.name} {ck.fields_dict}: every one of {len(res.trials)} configs failed; "
            f"first error: {first or 'unknown'}{_traced_config_hint(t, space, first)}",
            tuple(tr.error or "" for tr in res.trials),
        )
    cfg, best_value = _winner(res, raw)
    entry = CacheEntry(ck, cfg, best_value, spreads.get(canon(cfg), 0.0), now_iso(), space.fingerprint())
    if db is not None:
        try:
            guarded(db, "write", "store the winner", lambda: db.put(entry, replace=stale), None)
        except EntryError as exc:
            log.warning(
                "%s: the winner for %s cannot be stored (%s); kept in memory only",
                t.name,
                ck.fields_dict,
                exc,
            )
        if owner is not None and not stale and not req.retune:  # a retune uses its own winner
            cfg = _agree_with_the_store(req, db, cfg)
    # The trials after the winner: a process that finds them all (`_coverage`) finds this winner too,
    # never the entry this tuning replaces.
    record()
    log.info(
        "%s %s: tuned %d configs, best %s (%.3g s)",
        t.name,
        ck.fields_dict,
        len(res.trials),
        cfg,
        best_value,
    )
    why = f"tuned: {len(res.trials)} evaluations in {time.perf_counter() - t0:.2f}s, best {best_value:.3g}s"
    return Resolution(cfg, why, "tuned")


def _agree_with_the_store(req: Request, db: ConfigCache, cfg: dict[str, Any]) -> dict[str, Any]:
    """The config this process uses after storing its winner `cfg` under its claim: the store's entry
    when another tuning of the key stored a faster one meanwhile (it took the claim over when a trial ran
    past `lease_s`, or its holder looked dead), which the store keeps and every later process uses. A
    rank that kept its own winner ran another config than the other ranks for the whole job."""
    e = guarded(db, "read", "read an entry", lambda: db.get(req.key), None)
    if e is None or e.config == cfg:
        return cfg
    stored = usable_config(req, e)
    if stored is None:
        return cfg
    log.warning(
        "%s %s: another process tuned this key at the same time and stored a faster config, %s (this "
        "process's winner: %s); using the stored one, as every other process does",
        req.t.name,
        req.key.fields_dict,
        stored,
        cfg,
    )
    return stored


def _winner(res: TuneResult, raw: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
    """The winner of a tuning and its median: optimize's best (the lowest median, the first timed on a
    tie), or, where every config that ran was timed by a timer of Triton's kind (`raw`: what it returned,
    by config), `triton.autotune`'s choice, `min` over those results: a tie on the median goes to the lower
    p20, then the lower p80 ([median, p20, p80] lists compare item by item), a full tie to the first
    timed. Results that do not compare (a number and a list) leave optimize's best."""
    assert res.best_config is not None
    ok = [(tr, tr.value) for tr in res.trials if tr.value is not None]
    if raw and all(canon(tr.config) in raw for tr, _ in ok):
        with contextlib.suppress(TypeError):
            best, value = min(ok, key=lambda tv: (raw[canon(tv[0].config)], tv[0].number))
            return dict(best.config), float(value)
    return dict(res.best_config), res.best_value


def _stop_if_untimeable(name: str, ck: CacheKey, trial: Any) -> None:
    """After the first trial of a tuning on jax stand-ins (`_jax.on_stand_ins`): AllConfigsFailedError when
    it failed for a reason of the caller's trace alone (`_jax.untimeable_reason`), which every config
    meets there. Raised from optimize's callback, it ends the search (no other config is tried, and
    optimize does not warn that every trial failed) and the decorator chooses the config untimed.
    Nothing is recorded: the error says nothing about the config."""
    if trial.value is not None or _jax.untimeable_reason((trial.error or "",)) is None:
        return
    raise AllConfigsFailedError(
        f"{name} {ck.fields_dict}: the first config failed for a reason of the caller's jax trace, which "
        f"every config meets on stand-ins; no other config tried: {trial.error}",
        (trial.error,),
    )


def stored_timings(
    db: ConfigCache, name: str, ck: CacheKey
) -> list[tuple[dict[str, Any], float, float, tuple[float, float] | None]]:
    """(config, median s, spread s, (p20 s, p80 s) or None) of each config that the newest tuning of
    exactly `ck` (kernel, source hash, key fields, dtypes, device, versions) measured in `db`'s store, in
    the order it measured them; failed configs left out. The quantiles are there where the timer gave them
    (Triton's do_bench) and this release recorded them. Empty when the store has none (trials recorded
    before the key was kept with them, or a store that cannot be read)."""
    none: list[Measurement] = []
    task_id = task_of(name, ck).task_id
    rows = guarded(db, "read", "read the measurements", lambda: db.store.measurements(task_id=task_id), none)
    mine = [m for m in rows if m.stats.get("key") == ck.hash]
    if not mine:
        return []
    run = mine[-1].stats.get("tuning")
    return [
        (dict(m.config), m.value, float(m.stats.get("spread_s", 0.0)), _quantiles(m.stats))
        for m in mine
        if m.stats.get("tuning") == run and m.value is not None
    ]


def _quantiles(stats: Mapping[str, Any]) -> tuple[float, float] | None:
    low, high = stats.get("p20_s"), stats.get("p80_s")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return float(low), float(high)
    return None


def _uses_prior(strategy: Any) -> bool:
    """Whether the strategy reads a prior (a strategy class says so with `uses_prior`)."""
    if not isinstance(strategy, str):
        return bool(getattr(strategy, "uses_prior", True))
    from ..strategies import get_strategy

    try:
        return bool(getattr(get_strategy(strategy), "uses_prior", True))
    except ValueError:
        return True


def _log_wait(
    name: str, ck: CacheKey, db: ConfigCache, last: tuple[float, str] | None
) -> tuple[float, str] | None:
    """Say (at most every 10 s, and whenever the holder changes) which process this caller waits for."""
    holder = guarded(db, "read", "read a claim", lambda: db.holder(ck.hash), None)
    if holder is None:
        return last
    now = time.monotonic()
    if last is not None and last[1] == holder.owner and now - last[0] < 10.0:
        return last
    log.warning(
        "%s %s: waiting for %s, which is tuning this key (a dead owner on this host is taken over at once)",
        name,
        ck.fields_dict,
        holder.describe(),
    )
    return now, holder.owner
