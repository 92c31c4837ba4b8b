"""Record mode, and the offline tail with the zero-shot predictor, registered in the resolution chain.

    offline: nearest cached key -> the user's cost-model hook -> zero-shot predictor -> space default
    record:  the offline tail, and the miss is noted in the miss log (`_misses.py`) with the fallback
             it used; its config counts the calls of that key from then on

Record mode never tunes and never waits on another process; noting a miss is an in-memory insert (the
writer thread does the I/O), and nothing in it raises into the caller.
"""

from __future__ import annotations

import logging

from ._misses import recorder
from ._predict import zero_shot
from ._resolve import (
    Request,
    Resolution,
    Resolver,
    cost_model,
    nearest_key,
    register_mode,
    run_tail,
    space_default,
)

log = logging.getLogger(__name__)

__all__ = ["OFFLINE_TAIL", "RECORD_TAIL", "record"]

OFFLINE_TAIL: tuple[Resolver, ...] = (nearest_key, cost_model, zero_shot, space_default)


def record(req: Request) -> Resolution | str:
    """Resolve as offline mode does, then note the miss (kernel, key, dtypes, device, versions, the
    fallback) in this process's miss log."""
    res, reasons = run_tail(req, OFFLINE_TAIL)
    if res is None:  # pragma: no cover - space_default always resolves
        return "; ".join(reasons)
    try:
        backend = getattr(req.t.keys, "backend", None)  # tuner.kernel's ProblemKeys; None for autotune
        counted = recorder().note(
            req.key,
            res.config,
            res.why,
            backend=backend if isinstance(backend, str) else None,
            registered=isinstance(backend, str),
        )
    except Exception as exc:  # noqa: BLE001 - recording must never take the caller down
        log.warning(
            "record mode: the miss of %s was not recorded (%s: %s)", req.t.name, type(exc).__name__, exc
        )
        return res
    return Resolution(counted, f"record: {res.why}", res.stat, hit=res.hit, quiet=res.quiet)


RECORD_TAIL: tuple[Resolver, ...] = (record,)

register_mode("offline", OFFLINE_TAIL)
register_mode("record", RECORD_TAIL)
