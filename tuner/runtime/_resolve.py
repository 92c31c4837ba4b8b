"""The resolution chain, written once: how a call whose fast key is not in memory gets its config.

    memory (by stored key) -> shipped files -> store -> the mode's tail
    online:  tune (once per key across threads and processes sharing a store)
    offline: nearest cached key of the same family -> cost-model hook -> space default

A resolver is a function `resolver(req) -> Resolution | str`: a config with the reason it was chosen,
or a one-line reason why this layer has none. The chain asks each in turn and stops at the first
Resolution; the last resolver of every mode always resolves (tuning raises only when every config
failed). The lookups (memory, files, store) have no side effects, so `explain` runs them as they are.

Extension points:
- a mode is a name and its tail: `register_mode("record", (record_miss, *OFFLINE))` makes
  `mode="record"` / `TUNER_MODE=record` valid for every decorated function;
- a resolver reads what it needs from the `Request` (key, space, store, shipped files, the decorated
  function's state) and returns a Resolution (`stat` names the counter it bumps in `.tuner.stats`) or a
  reason; `Request.store()` and `_sources.guarded` keep store faults out of the caller's way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.search_spaces import SearchSpace

from ._coverage import times_every_config, tried_configs, untimed, untimed_reason
from ._entry import CacheEntry
from ._file import ReadOnlyCache, rank_fields
from ._key import CacheKey
from ._sources import file_caches, guarded, open_store, unusable_store, warn_once

if TYPE_CHECKING:  # pragma: no cover
    from ._db import ConfigCache
    from ._decorator import Autotuned

log = logging.getLogger(__name__)

__all__ = [
    "Request",
    "Resolution",
    "Resolver",
    "LOOKUPS",
    "ONLINE",
    "OFFLINE",
    "register_mode",
    "run_tail",
    "mode_names",
    "resolve",
    "lookup",
    "miss_reason",
    "set_cost_model_hook",
    "CostModelHook",
    "valid_config",
    "usable_config",
    "untimed_configs",
]

# A cost-model hook for offline mode: (kernel name, key, space) -> a config or None. Set by the cost-model
# package (or a user) with set_cost_model_hook; None by default.
CostModelHook = Callable[[str, CacheKey, SearchSpace], "Mapping[str, Any] | None"]
_cost_model_hook: CostModelHook | None = None


def set_cost_model_hook(hook: CostModelHook | None) -> None:
    """Install the offline-mode fallback that predicts a config for an unseen key (None removes it)."""
    global _cost_model_hook
    _cost_model_hook = hook


def valid_config(space: SearchSpace, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config as the space validates it (with the values its user gave, `SearchSpace.as_given`), or None
    when it is not in the space."""
    try:
        return space.as_given(space.validate(config))
    except ValueError:
        return None


def untimed_configs(req: Request, entry: CacheEntry) -> list[dict[str, Any]]:
    """The configs of the request's space that no tuning of its key recorded in the store tried, when
    the mode tunes, a tuning times every config of the space and the recorded tunings tried the stored
    `entry`'s config (`_coverage`); else empty. Read anew on each call (another process may have tuned
    the key meanwhile)."""
    t = req.t
    if tune not in _MODES[req.mode] or not times_every_config(req.space, t.budget, t.time_budget_s):
        return []
    db = req.store()
    if db is None:
        return []
    return untimed(req.space, tried_configs(db, t.name, req.key), entry.config)


def usable_config(req: Request, entry: CacheEntry) -> dict[str, Any] | None:
    """The config of the stored `entry` as the current space gives it (`valid_config`), or None when the
    entry cannot serve the request: its config is not in the space, or the space holds configs that its
    key's tuning did not time (`untimed_configs`)."""
    cfg = valid_config(req.space, entry.config)
    if cfg is None or untimed_configs(req, entry):
        return None
    return cfg


@dataclass
class Request:
    """One call being resolved: the decorated function's state, the stored key, the call and what the
    hit path will call with the config (`target`, benched by the tuner). The space and the store are
    computed on first use."""

    t: Autotuned
    key: CacheKey
    args: tuple
    kwargs: dict
    target: Callable[..., Any]
    mode: str
    create: bool = True  # may open_store create the database (False offline and for explain)
    retune: bool = False  # code asked to tune this key again (`lookups`: only memory is read online)
    _store: Any = field(default=None, repr=False)
    _store_opened: bool = field(default=False, repr=False)
    # the store this request could not read (its URL, password hidden), or "": `miss_reason` says so
    store_unread: str = field(default="", repr=False)

    @functools.cached_property
    def space(self) -> SearchSpace:
        return self.t.space_for(self.args, self.kwargs)

    @functools.cached_property
    def legacy_key(self) -> CacheKey | None:
        """The call's stored key as an older release wrote it, where the key builder has one (the Triton
        drop-in's `_TritonKeys.legacy_key`: a key object as its str()): an exact entry under it is read
        when none is under `key`, so that caches written before keep hitting."""
        fn = getattr(self.t.keys, "legacy_key", None)
        return None if fn is None else fn(self.args, self.kwargs)

    def exact_keys(self) -> list[CacheKey]:
        """`key`, then `legacy_key` where there is one: the keys an exact lookup reads, in that order."""
        old = self.legacy_key
        return [self.key] if old is None else [self.key, old]

    @functools.cached_property
    def _files(self) -> list[ReadOnlyCache]:
        return file_caches(self.t.cache)

    def files(self) -> list[ReadOnlyCache]:
        """The shipped files, read once per request: a `TUNER_CACHE_FILE` replaced while a miss is resolved
        (a new export renamed over it) applies to the next miss, not to half of this one. Read anew at
        each step, the exact lookup saw the old file and the miss reason and fallbacks the new one: the
        key was logged as `cached config ... is not in the current search space: ` (no reason) and taken
        as its own `nearest cached key (distance 0)`, the zero-shot memo keyed on one file and fitted on
        the other."""
        return self._files

    def store(self) -> ConfigCache | None:
        """The function's store (None: no store, or one that cannot be used); opened once per request,
        created only when `create`."""
        if not self._store_opened:
            self._store = open_store(self.t.storage, create=self.create)
            self._store_opened = True
            if self._store is None:
                self.store_unread = unusable_store(self.t.storage) or ""
        return self._store

    def _unread(self, db: ConfigCache) -> None:
        from ._sources import _redact

        self.store_unread = _redact(getattr(db.store, "url", "?"))

    def _file_entries(self) -> dict[str, CacheEntry]:
        out: dict[str, CacheEntry] = {}
        for fc in self.files():
            for e in fc.for_kernel(self.key.kernel):
                out.setdefault(e.key.hash, e)
        return out

    def nearest_entries(self) -> Iterator[tuple[float, CacheEntry]]:
        """Entries of the key's family (same kernel, source, dtypes, device, versions) in the shipped files
        and the store (files first; one per key), nearest first (`rank_nearest`). The store's family is
        ranked from two indexed columns (key hash and key fields), and an entry is read whole only when
        the caller gets to it: a miss in a family of 100,000 stored keys used to build every one of them
        (7.2 s per miss on the 2-core machine against 0.9 s now, docs/benchmarks.md)."""
        fam = self.key.family()
        files = {h: e for h, e in self._file_entries().items() if e.key.family() == fam}
        cands: list[tuple[tuple[tuple[str, Any], ...], str, CacheEntry | None]] = [
            (e.key.fields, h, e) for h, e in files.items()
        ]
        db = self.store()
        if db is not None:
            none: list[tuple[str, tuple[tuple[str, Any], ...]]] = []
            rows = guarded(db, "read", "list the key's family", lambda: db.family_fields(self.key), none)
            cands += [(f, h, None) for h, f in rows if h not in files]
        for d, e in rank_fields(self.key, ((f, h, (h, e)) for f, h, e in cands)):
            h, got = e
            if got is None and db is not None:
                got = guarded(db, "read", "read an entry", functools.partial(db.get_hash, h), None)
            if got is not None and got.key.family() == fam:
                yield d, got

    def kernel_entries(self, *, limit: int) -> list[CacheEntry]:
        """Entries of the kernel on any device, shape or version (files first; one per key), at most
        `limit` from the store: what the zero-shot predictor learns from."""
        out = self._file_entries()
        db = self.store()
        if db is not None:
            none: list[CacheEntry] = []
            ck = self.key
            got = guarded(db, "read", "list entries", lambda: db.entries(ck.kernel, limit=limit), none)
            for e in got:
                out.setdefault(e.key.hash, e)
        return list(out.values())

    def explain_entries(self) -> tuple[list[CacheEntry], int]:
        """What a miss reason needs: the file entries of the kernel plus the store's entry for the key and
        entries with the same key fields (indexed), and how many entries the kernel has in all."""
        out = self._file_entries()
        n_kernel = len(out)
        db = self.store()
        if db is not None:
            ck = self.key
            got = guarded(db, "read", "explain a miss", lambda: [db.get(ck), *db.same_fields(ck)], None)
            for e in got or ():
                if e is not None:
                    out.setdefault(e.key.hash, e)
            n = guarded(db, "read", "count entries", lambda: db.count(ck.kernel), None)
            if got is None or n is None:  # the store failed (or is left alone for a while after failing)
                self._unread(db)
            n_kernel += n or 0
        return list(out.values()), n_kernel


@dataclass(frozen=True)
class Resolution:
    """A resolved config. `stat`: the counter of `.tuner.stats` to bump (None: none); `hit`: where a
    lookup found it ("in memory": not counted, logged or made the last choice; a file; "store"), None
    for the tail; `quiet`: log the choice at debug level (exact entries, tuning) instead of one warning
    per key."""

    config: dict[str, Any]
    why: str
    stat: str | None
    hit: str | None = None
    quiet: bool = True
    unused: str = ""  # why an entry stored for these key fields was not used (logged with the choice)
    miss: str = ""  # why the lookups missed (the tail's resolutions: `resolve`); this call's own, where
    # `.tuner.last_miss_reason` is the last call's of any thread


Resolver = Callable[[Request], "Resolution | str"]


# ---- lookups ---------------------------------------------------------------------------------------------
def memory(req: Request) -> Resolution | str:
    cfg = req.t.by_hash.get(req.key.hash)
    if cfg is None:
        return "not in memory"
    return Resolution(cfg, "in memory", None, hit="in memory")


def shipped_files(req: Request) -> Resolution | str:
    for fc in req.files():
        e = next((got for got in map(fc.get, req.exact_keys()) if got is not None), None)
        if e is not None:
            cfg = valid_config(req.space, e.config)
            if cfg is not None:
                where = fc.source or "a loaded cache"
                return Resolution(
                    cfg, f"exact entry in {where}", "from_file", hit=fc.source or "loaded cache"
                )
    return "no usable entry in the shipped files"


def store_entry(req: Request) -> Resolution | str:
    db = req.store()
    if db is None:
        return "no store"
    for ck in req.exact_keys():
        e = guarded(db, "read", "read an entry", functools.partial(db.get, ck), None)
        if e is not None:
            cfg = usable_config(req, e)
            if cfg is not None:
                return Resolution(cfg, "exact entry in the store", "from_store", hit="store")
    return "no usable entry in the store"


# ---- offline fallbacks -----------------------------------------------------------------------------------
def nearest_key(req: Request) -> Resolution | str:
    for d, e in req.nearest_entries():
        cfg = valid_config(req.space, e.config)
        if cfg is not None:
            why = f"offline: nearest cached key {e.key.fields_dict} (distance {d:.3g})"
            return Resolution(cfg, why, "offline_fallback", quiet=False)
    return "no cached key of this family"


def cost_model(req: Request) -> Resolution | str:
    hook = req.t.cost_model or _cost_model_hook
    if hook is None:
        return "no cost model"
    try:
        pred = hook(req.t.name, req.key, req.space)
    except Exception as exc:  # noqa: BLE001 - a broken model must not take production down
        log.warning(
            "%s: cost-model hook failed (%s: %s); using the space default",
            req.t.name,
            type(exc).__name__,
            exc,
        )
        return "the cost model failed"
    cfg = valid_config(req.space, pred) if pred is not None else None
    if cfg is None:
        return "the cost model predicted nothing in the space"
    return Resolution(cfg, "offline: cost model's best prediction", "offline_fallback", quiet=False)


def space_default(req: Request) -> Resolution | str:
    """The space's default config. In a mode's chain (`run_tail`), its reason lists why each fallback
    before it passed."""
    why = "offline: space default (no cached key of this family, no cost model)"
    return Resolution(req.space.default(), why, "offline_fallback", quiet=False)


# ---- online --------------------------------------------------------------------------------------------
def tune(req: Request) -> Resolution | str:
    from ._tuning import tune_once

    return tune_once(req)


# ---- modes and the chain ---------------------------------------------------------------------------------
LOOKUPS: tuple[Resolver, ...] = (memory, shipped_files, store_entry)
ONLINE: tuple[Resolver, ...] = (tune,)
OFFLINE: tuple[Resolver, ...] = (nearest_key, cost_model, space_default)
_MODES: dict[str, tuple[Resolver, ...]] = {"online": ONLINE, "offline": OFFLINE}


def register_mode(name: str, tail: Sequence[Resolver]) -> None:
    """Make `name` a mode: after the lookups miss, its `tail` of resolvers runs (the last must always
    resolve). Registering an existing name replaces its tail."""
    if not name.isidentifier():
        raise ValueError(f"a mode name must be an identifier, got {name!r}")
    if not tail:
        raise ValueError(f"mode {name!r} needs at least one resolver")
    _MODES[name] = tuple(tail)


def mode_names() -> tuple[str, ...]:
    return tuple(_MODES)


def retuning(req: Request) -> bool:
    """Whether `req` tunes its key again: asked to (`req.retune`) in a mode whose tail tunes."""
    return req.retune and tune in _MODES[req.mode]


def lookups(req: Request) -> tuple[Resolver, ...]:
    """The lookups of `req`: all of them, or only memory when it tunes its key again (the shipped files
    and the store are not read, and nothing is deleted from them)."""
    return (memory,) if retuning(req) else LOOKUPS


def lookup(req: Request, resolvers: Iterable[Resolver] = LOOKUPS) -> Resolution | None:
    """The first lookup that has the key (no side effects), or None."""
    for r in resolvers:
        res = r(req)
        if isinstance(res, Resolution):
            return res
    return None


def resolve(req: Request) -> Resolution:
    """Run the chain for `req.mode`: the lookups, then (recording why they missed in
    `.tuner.last_miss_reason`) the mode's tail."""
    found = lookup(req, lookups(req))
    if found is not None:
        return found
    reason = req.t.last_miss_reason = (
        "asked to tune again (the key was taken out of .cache)" if retuning(req) else miss_reason(req)
    )
    res, reasons = run_tail(req, _MODES[req.mode])
    if res is None:
        raise RuntimeError(f"{req.t.name}: mode {req.mode!r} resolved nothing: {'; '.join(reasons)}")
    res = replace(res, miss=reason)
    if reason.startswith(_UNUSED_ENTRY):  # say so where production sees it: the choice's log line
        res = replace(res, unused=reason)
    return res


def run_tail(req: Request, tail: Sequence[Resolver]) -> tuple[Resolution | None, list[str]]:
    """The first resolution of `tail` (None if none resolves) and why each resolver before it passed. The
    space default's reason lists those, so its log line says why nothing better was used."""
    reasons: list[str] = []
    for r in tail:
        res = r(req)
        if isinstance(res, Resolution):
            if r is space_default and reasons:
                res = replace(res, why=f"offline: space default ({'; '.join(reasons)})")
            return res, reasons
        reasons.append(res)
    return None, reasons


# miss_reason's openings when an entry exists for the key fields but cannot be used, or when the shipped
# files hold the kernel only for other machines (logged with the fallback's choice)
_UNUSED_ENTRY = (
    "entry for these key fields is stale or foreign",
    "cached config ",
    "the config list has ",
    "the shipped files hold ",
)
TUNE_HINT = (
    "to tune for this machine, run with TUNER_MODE=record, then `tuner study from-misses`, `tuner study run` "
    "here and ship what `tuner study export` writes (docs/production.md of tuner's repository)"
)


def _likeness(ck: CacheKey, stored: CacheKey) -> tuple[int, float, str]:
    """Sort key of the entries that could explain a miss: fewest differences, then the nearest device
    (same architecture, then same vendor: `device_family`), then the key hash."""
    from tuner.search_spaces.devices import device_family

    dist = (
        0.0 if stored.device == ck.device else device_family(ck.device).distance(device_family(stored.device))
    )
    return (len(ck.mismatches(stored)), dist, stored.hash)


def _machine_differs(ck: CacheKey, stored: CacheKey) -> bool:
    return stored.device != ck.device or stored.versions != ck.versions


def _name_shared_note(req: Request, entry: CacheEntry) -> str:
    """Where the stored `entry`, whose config is not in the request's space, is the winner of another
    decorated function of this process with the same stored name and code (one `@triton.jit` kernel
    wrapped by two autotuners with different config lists): a note that says so and how to part them,
    also logged as a warning once per name. Such functions share every stored key, each one's tuning
    replaces the other's winner, and every process tunes both again."""
    from ._decorator import _instances  # the module that imports this one

    t = req.t
    for other in list(_instances):
        if other is t or other.name != t.name:
            continue
        try:
            same = other.source_hash == req.key.source_hash
            theirs = same and valid_config(other.space_for(req.args, req.kwargs), entry.config) is not None
        except Exception:  # noqa: BLE001 - another function's space or hash: only a hint is lost
            continue
        if theirs:
            note = (
                f"; it is the winner of another function of this process stored under the same name "
                f"{t.name!r} with the same code and another config list: the two share every stored key "
                "and each tunes again what the other stored; give each its own `name=`"
            )
            warn_once(("name shared", t.name), "%s%s", t.name, note)
            return note
    return ""


def miss_reason(req: Request) -> str:
    """Why no stored entry serves the key: the nearest entries that differ, and how; and that the store
    could not be read, when it could not (its entries may well hold the key)."""
    reason = _nearest_reason(req)
    if req.store_unread:
        reason += f"; the store {req.store_unread} could not be read, so its entries are not counted"
    return reason


def _nearest_reason(req: Request) -> str:
    ck = req.key
    entries, n_kernel = req.explain_entries()
    cands = {e.key.hash: e for e in entries}
    if not cands and n_kernel == 0:
        return f"no cached entry for kernel {ck.kernel!r}"
    exact = cands.get(ck.hash)
    if exact is not None and valid_config(req.space, exact.config) is not None:
        left = untimed_configs(req, exact)
        if left:
            return untimed_reason(left)
    if exact is not None:
        return (
            f"cached config {dict(exact.config)} is not in the current search space: "
            + "; ".join(req.space.violations(exact.config))
            + _name_shared_note(req, exact)
        )
    same_fields = [e for e in cands.values() if e.key.fields == ck.fields]
    if same_fields:
        best = min(same_fields, key=lambda e: _likeness(ck, e.key))
        hint = f"; {TUNE_HINT}" if _machine_differs(ck, best.key) else ""
        return "entry for these key fields is stale or foreign: " + "; ".join(ck.mismatches(best.key)) + hint
    shipped = [e for e in req._file_entries().values() if e.key.source_hash == ck.source_hash]
    if shipped and all(_machine_differs(ck, e.key) for e in shipped):
        best = min(shipped, key=lambda e: _likeness(ck, e.key))
        what = [m for m in ck.mismatches(best.key) if m.startswith(("device", "versions"))]
        return (
            f"the shipped files hold {len(shipped)} entries of kernel {ck.kernel!r}, none for this device and "
            f"these versions (the nearest: {'; '.join(what)}); {TUNE_HINT}"
        )
    return (
        f"no entry for key {ck.fields_dict}; {n_kernel} entries of kernel {ck.kernel!r} have other key fields"
    )
