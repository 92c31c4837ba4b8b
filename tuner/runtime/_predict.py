"""The default zero-shot predictor of offline and record mode: a config for a key nobody tuned, ranked by
a cost model trained on what the store and the shipped caches hold for the same kernel.

Data, for the kernel's name (any shape, device, dtype, versions):
- the store's measurements (every config a tuning run measured, grouped by task): the full picture;
- the cache entries (shipped files, the store's cache table): each is only a winner, so each becomes a
  small task of the winner and `NEGATIVES` configs drawn from the new key's space counted as bad (a
  winners-versus-the-rest signal: where in the space, for which shapes, the winners lie).
Task features: log2 of the numeric key fields, whether the task ran on the same device and dtypes as
the new key (so the model can lean on same-device data when it has some), and the family of the device
it ran on (vendor, compute capability or gfx target, read from the device label by
`tuner.search_spaces.devices.device_family`; nothing where the label is not recognised). The related
tasks' winners the model weighs beside its own pick are those measured on the new key's architecture
where there are any (then never overridden by the model), else on its vendor's devices, else all
(`FittedZeroShot.similar_anchors`).

The model (`tuner.cost_models.zero_shot.ZeroShotPredictor`) is fitted once per kernel, device, dtypes
and data state (cached in this process) and ranks the space once per key (cached). Both memos are keyed on
the shipped files learned from (each file's path and a hash of its content, `_files_state`): pointing
`$TUNER_CACHE_FILE` at another file, rewriting it, or `set_global_cache` with other entries makes the next
miss learn again instead of serving the old pick. The reason logged with the choice
names how many tasks and measurements it learned from. One switch turns it off: `TUNER_PREDICT=0` in
the environment (or `tuner.runtime.set_zero_shot(False)` in code); the chain then goes on to the space
default.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner._settings import flag

from ._key import CacheKey
from ._sources import guarded

if TYPE_CHECKING:  # pragma: no cover
    from tuner.search_spaces import SearchSpace

    from ._resolve import Request, Resolution

log = logging.getLogger(__name__)

__all__ = ["zero_shot", "set_zero_shot", "zero_shot_enabled", "predict_for_key", "NEGATIVES"]

NEGATIVES = 32  # configs drawn from the space per winner-only cache entry, counted as bad
_MAX_ROWS = 20_000  # measurements read from the store per kernel at most (the newest)
_MAX_ENTRIES = 2_000  # cache entries of the kernel read from the store at most
DATA_TTL_S = 60.0  # the store's measurements of a kernel are re-read at most this often per process

_enabled: bool | None = None  # None: read $TUNER_PREDICT
_models: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # (kernel, names, data state) -> FittedZeroShot
# (key hash, space fingerprint, files state) -> (config, why)
_picks: OrderedDict[tuple[Any, ...], tuple[dict[str, Any], str] | None] = OrderedDict()
_data: dict[tuple[str, str], tuple[float, list[Any]]] = {}  # (store url, kernel) -> (read at, rows)
_lock = threading.Lock()
_kernel_locks: dict[str, threading.Lock] = {}


def _after_fork_in_child() -> None:  # a parent thread may have held one (fitting a model) at the fork
    global _lock
    _lock = threading.Lock()
    _kernel_locks.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def set_zero_shot(enabled: bool | None) -> None:
    """Turn the default zero-shot predictor on or off for this process (None: follow `$TUNER_PREDICT`)."""
    global _enabled
    _enabled = enabled
    with _lock:
        _picks.clear()
        _data.clear()


def zero_shot_enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return flag("TUNER_PREDICT")


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _task_features(fields: Mapping[str, Any], device: str, dtypes: Any, ck: CacheKey) -> dict[str, float]:
    out = {f"log2_{k}": math.log2(v) for k, v in fields.items() if _numeric(v) and v > 0}
    out["same_device"] = 1.0 if device == ck.device else 0.0
    out["same_dtypes"] = 1.0 if tuple(dtypes) == tuple(ck.dtypes) else 0.0
    return out


def _same_names(config: Mapping[str, Any], names: frozenset[str]) -> bool:
    """Whether a stored config has exactly the space's parameters: one tuned before a parameter was renamed,
    added or removed says nothing about the current space (its missing features would be read as unknown
    values), so the predictor leaves it out; nearest-key and exact lookups refuse it the same way."""
    return len(config) == len(names) and all(k in names for k in config)


def _files_state(req: Request) -> tuple[tuple[str, str], ...]:
    """Which shipped files the predictor learns from for `req`, in order, each as (source, content hash):
    what its memos are keyed on besides the key and the space."""
    return tuple((fc.source, fc.digest) for fc in req.files())


def _measurements(db: Any, kernel: str) -> list[Any]:
    """The store's measurements of `kernel` (the newest `_MAX_ROWS`), re-read at most every `DATA_TTL_S`."""
    store = db.store
    ck = (store.url, kernel)
    now = time.monotonic()
    with _lock:
        got = _data.get(ck)
    if got is not None and now - got[0] < DATA_TTL_S:
        return got[1]
    none: list[Any] = []
    ms: list[Any] = guarded(
        db, "read", "read measurements", lambda: store.measurements(kernel=kernel, newest=_MAX_ROWS), none
    )
    with _lock:
        _data[ck] = (now, ms)
    return ms


def _store_tasks(req: Request, ck: CacheKey) -> list[Any]:
    from tuner.cost_models.zero_shot import ZeroShotTask

    db = req.store()
    if db is None:
        return []
    ms = _measurements(db, ck.kernel)
    names = frozenset(req.space.names)
    groups: dict[str, list[Any]] = {}
    for m in ms:
        if isinstance(m.config, Mapping) and _same_names(m.config, names):
            groups.setdefault(m.task_id, []).append(m)
    tasks = []
    for tid, rows in groups.items():
        m0 = rows[0]
        dts = [d for d in str(m0.dtype).split(",") if d]
        feats = _task_features(dict(m0.problem), m0.device, dts, ck)
        tasks.append(
            ZeroShotTask(
                [(m.config, m.value) for m in rows], feats, name=f"store task {tid}", device=m0.device
            )
        )
    return tasks


def _entry_tasks(req: Request, ck: CacheKey, space: SearchSpace) -> list[Any]:
    import numpy as np

    from tuner.cost_models.zero_shot import ZeroShotTask

    tasks = []
    rng = np.random.default_rng(0)
    names = frozenset(space.names)
    for e in req.kernel_entries(limit=_MAX_ENTRIES):
        if e.key.hash == ck.hash or not _same_names(e.config, names):
            continue
        neg = space.sample(rng, n=NEGATIVES) if NEGATIVES else []
        rows = [(dict(e.config), float(e.time_s))] + [(c, None) for c in neg if c != dict(e.config)]
        feats = _task_features(e.key.fields_dict, e.key.device, e.key.dtypes, ck)
        tasks.append(ZeroShotTask(rows, feats, name=f"cache entry {e.key.hash[:12]}", device=e.key.device))
    return tasks


def predict_for_key(
    req: Request, files: tuple[tuple[str, str], ...] | None = None
) -> tuple[dict[str, Any], str] | str:
    """(config, why) for `req.key`, or a one-line reason why there is no prediction. `files`: the
    `_files_state` of the request (computed when not given)."""
    from tuner.cost_models.zero_shot import ZeroShotPredictor, fit_zero_shot

    ck = req.key
    if files is None:
        files = _files_state(req)
    space = req.space
    store_tasks = _store_tasks(req, ck)
    entry_tasks = _entry_tasks(req, ck, space)
    tasks = store_tasks + entry_tasks
    if not tasks:
        return f"no measurement or cache entry of kernel {ck.kernel!r} to predict from"
    rows = sum(len(t.rows) for t in tasks)
    # the task features `same_device` / `same_dtypes` are relative to the key: its device and dtypes are
    # part of the state a fitted model serves
    state = (
        ck.kernel,
        tuple(space.names),
        ck.device,
        tuple(ck.dtypes),
        len(store_tasks),
        len(entry_tasks),
        rows,
        files,  # the same counts from other files are other data
    )
    with _lock:
        klock = _kernel_locks.setdefault(ck.kernel, threading.Lock())
    with klock:  # one fit per kernel and data state, even with many keys missing at once
        fitted = _models.get(state)
        if fitted is None:
            try:
                fitted = fit_zero_shot(space, tasks, predictor=ZeroShotPredictor(n_threads=1))
            except ValueError as exc:
                return f"zero-shot predictor: {exc}"
            with _lock:
                _models[state] = fitted
                while len(_models) > 16:
                    _models.popitem(last=False)
    feats = _task_features(ck.fields_dict, ck.device, ck.dtypes, ck)
    pick = fitted.predict_best(space, feats, device=ck.device)
    winner = ", a related task's winner" if pick.source == "related task" else ""
    why = (
        f"offline: zero-shot prediction from {len(store_tasks)} measured tasks and {len(entry_tasks)} "
        f"cache entries of kernel {ck.kernel!r} ({rows} rows; predicted within "
        f"{math.exp(pick.score):.2f}x of their best, {pick.candidates} configs ranked{winner})"
    )
    return pick.config, why


def zero_shot(req: Request) -> Resolution | str:
    """Resolver: the predictor's best config for the key (cached per key, space and shipped files)."""
    from ._resolve import Resolution, valid_config

    if not zero_shot_enabled():
        return "zero-shot predictor off ($TUNER_PREDICT)"
    files = _files_state(req)
    cache_key = (req.key.hash, req.space.fingerprint(), files)
    with _lock:
        hit = _picks.get(cache_key)
    if hit is None:
        try:
            got = predict_for_key(req, files)
        except Exception as exc:  # noqa: BLE001 - a broken model must not take production down
            log.warning(
                "%s: zero-shot predictor failed (%s: %s); going on to the space default",
                req.t.name,
                type(exc).__name__,
                exc,
            )
            return "the zero-shot predictor failed"
        if isinstance(got, str):
            return got
        hit = got
        with _lock:
            _picks[cache_key] = hit
            while len(_picks) > 4096:
                _picks.popitem(last=False)
    config, why = hit
    cfg = valid_config(req.space, config)
    if cfg is None:
        return "the zero-shot predictor's pick is not in the space"
    return Resolution(cfg, why, "offline_fallback", quiet=False)
