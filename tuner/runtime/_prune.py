"""Pruning the store (`ConfigCache.prune`, `tuner cache prune`): cache entries by age, kernel or as
superseded, and the runtime's measurements that no entry needs any more; all in one transaction.

- An entry's age is its `date`: when the winner was measured (a hit writes nothing, so an entry that is hit
  every second still ages).
- Superseded (`stale`): another entry of the same kernel, key fields, dtypes and device has a newer date; it
  differs from this one in the kernel's source hash or the versions (else it would be the same key). The
  old one is hit only by processes still running the old code or versions.
- A measurement no entry needs: one that a runtime tuning recorded for a key (`stats["key"]`) that has no
  entry (after the prune). Measurements of a study (`study_name` set, Optuna's trials are matched to them)
  and those without a key (`tuner.optimize`, `tune_kernel`) are never touched.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Text, and_, cast, delete, exists, func, select, tuple_, update
from sqlalchemy.orm import Session

from ..storage._schema import CacheClaimRow, CacheEntryRow, MeasurementRow, Meta

__all__ = ["PruneCounts", "cutoff_date", "prune_in"]

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")  # an entry's date (`now_iso`)
_CHUNK = 400  # (key_hash, date) pairs per DELETE: 800 parameters, under any SQLite's limit


@dataclass(frozen=True)
class PruneCounts:
    """What a prune removed (or, `dry_run`, would remove): entries and measurements per kernel."""

    entries: dict[str, int] = field(default_factory=dict)
    measurements: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def total_entries(self) -> int:
        return sum(self.entries.values())

    @property
    def total_measurements(self) -> int:
        return sum(self.measurements.values())

    def kernels(self) -> list[str]:
        return sorted(set(self.entries) | set(self.measurements))

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "entries": self.total_entries,
            "measurements": self.total_measurements,
            "kernels": {
                k: {"entries": self.entries.get(k, 0), "measurements": self.measurements.get(k, 0)}
                for k in self.kernels()
            },
        }


def cutoff_date(older_than_days: float, now: dt.datetime | None = None) -> dt.datetime:
    """The moment before which an entry or measurement counts as older than `older_than_days`; ValueError
    for a negative or non-finite number of days."""
    days = float(older_than_days)
    if not math.isfinite(days) or days < 0:
        raise ValueError(f"older_than_days must be a finite number of days >= 0, got {older_than_days!r}")
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        return now - dt.timedelta(days=days)
    except OverflowError:
        return dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)  # before anything stored


def _selected_entries(
    s: Session, kernel: str | None, cutoff: dt.datetime | None, stale: bool
) -> list[tuple[str, str, str]]:
    """(key_hash, date, kernel) of the entries that every given selector picks. An entry whose date is not
    in the form tuner writes is never picked."""
    cols: list[Any] = [CacheEntryRow.key_hash, CacheEntryRow.date, CacheEntryRow.kernel]
    if stale:  # the problem of an entry: its kernel and key fields (`fields_hash`), dtypes and device
        cols += [
            CacheEntryRow.fields_hash,
            cast(CacheEntryRow.dtypes, Text),
            CacheEntryRow.device,
            CacheEntryRow.versions,
        ]
    q = select(*cols)
    if kernel is not None:
        q = q.where(CacheEntryRow.kernel == kernel)
    before = None
    if cutoff is not None:
        before = cutoff.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if not stale:  # (superseded needs every entry of a problem, to know its newest)
            q = q.where(CacheEntryRow.date < before)
    rows = [r for r in s.execute(q) if isinstance(r[1], str) and _DATE_RE.match(r[1])]
    if stale:
        newest: dict[tuple[Any, ...], str] = {}
        problems = []
        for h, date, _, fields, dtypes, device, versions in rows:
            # the frameworks the versions name (triton; jax, jaxlib): one kernel name tuned on two
            # backends keeps an entry per backend, and neither supersedes the other (only another version
            # of the same frameworks, or another source, does)
            frameworks = tuple(sorted(versions)) if isinstance(versions, dict) else ()
            p = (fields or f"key {h}", dtypes, device, frameworks)  # no fields_hash (never after schema 2)
            problems.append(p)
            if date > newest.get(p, ""):
                newest[p] = date
        rows = [r for r, p in zip(rows, problems, strict=True) if r[1] < newest[p]]
    if before is not None:
        rows = [r for r in rows if r[1] < before]  # the format sorts as the time does
    return [(r[0], r[1], r[2]) for r in rows]


def _orphaned(kernel: str | None, cutoff: dt.datetime | None) -> list[Any]:
    """The WHERE clauses of the runtime's measurements whose key has no entry (and never a study's)."""
    key = MeasurementRow.stats["key"].as_string()
    has_entry = exists().where(CacheEntryRow.key_hash == key)
    # a key being tuned now has no entry yet: its claim keeps its measurements (the entry written at the
    # end reads them back: `stored_timings`, `tried_configs`)
    tuning = exists().where(CacheClaimRow.key_hash == key)
    where: list[Any] = [MeasurementRow.study_name.is_(None), key.is_not(None), ~has_entry, ~tuning]
    if kernel is not None:
        where.append(MeasurementRow.kernel == kernel)
    if cutoff is not None:
        where.append(MeasurementRow.created_at < cutoff)
    return where


def _orphaned_would_be(
    s: Session, kernel: str | None, cutoff: dt.datetime | None, going: set[str]
) -> dict[str, int]:
    """Per kernel, the measurements `_orphaned` selects once the entries `going` are removed (a dry run:
    nothing removed). Reads the count per key of the measurements that may qualify, not the rows."""
    key = MeasurementRow.stats["key"].as_string()
    where: list[Any] = [MeasurementRow.study_name.is_(None), key.is_not(None)]
    if kernel is not None:
        where.append(MeasurementRow.kernel == kernel)
    if cutoff is not None:
        where.append(MeasurementRow.created_at < cutoff)
    q = (
        select(MeasurementRow.kernel, key, func.count())
        .where(and_(*where))
        .group_by(MeasurementRow.kernel, key)
    )
    counts = s.execute(q).all()
    keys = {k for _, k, _ in counts}
    kept: set[str] = set()
    listed = sorted(keys)
    for i in range(0, len(listed), 500):
        chunk = listed[i : i + 500]
        kept.update(
            h for (h,) in s.execute(select(CacheEntryRow.key_hash).where(CacheEntryRow.key_hash.in_(chunk)))
        )
    claimed = set(s.scalars(select(CacheClaimRow.key_hash)))  # keys being tuned: kept, as `_orphaned` does
    out: Counter[str] = Counter()
    for kern, k, n in counts:
        if (k not in kept or k in going) and k not in claimed:
            out[kern] += int(n)
    return dict(out)


def _delete_entries(s: Session, picked: Iterable[tuple[str, str, str]]) -> dict[str, int]:
    """Delete the entries picked, each only while its date is the one read (an entry tuned again meanwhile,
    by another process on PostgreSQL, is kept). Returns the removed count per kernel."""
    by_kernel: dict[str, list[tuple[str, str]]] = {}
    for h, date, kern in picked:
        by_kernel.setdefault(kern, []).append((h, date))
    out: dict[str, int] = {}
    for kern, pairs in sorted(by_kernel.items()):
        n = 0
        for i in range(0, len(pairs), _CHUNK):
            chunk = pairs[i : i + _CHUNK]
            res: Any = s.execute(
                delete(CacheEntryRow).where(
                    CacheEntryRow.key_hash.in_(
                        [h for h, _ in chunk]
                    ),  # the key index (SQLite scans for pairs)
                    tuple_(CacheEntryRow.key_hash, CacheEntryRow.date).in_(chunk),
                )
            )
            n += int(res.rowcount or 0)
        if n:
            out[kern] = n
    return out


def _delete_orphaned(s: Session, kernel: str | None, cutoff: dt.datetime | None) -> dict[str, int]:
    """Delete the measurements no entry needs, kernel by kernel (along the kernel index)."""
    kernels = [kernel] if kernel is not None else list(s.scalars(select(MeasurementRow.kernel).distinct()))
    out: dict[str, int] = {}
    for kern in sorted(kernels):
        res: Any = s.execute(delete(MeasurementRow).where(and_(*_orphaned(kern, cutoff))))
        if res.rowcount:
            out[kern] = int(res.rowcount)
    return out


def prune_in(
    s: Session,
    cutoff: dt.datetime | None,
    kernel: str | None,
    stale: bool,
    *,
    measurements: bool,
    dry_run: bool,
    lock_first: bool,
) -> PruneCounts:
    """The body of `ConfigCache.prune` in the transaction of session `s` (which the caller commits; a dry
    run rolls it back). `lock_first`: SQLite's, whose write lock is taken before anything is read."""
    if lock_first and not dry_run:
        # a write begins SQLite's transaction, and no other process writes until it ends: what is read
        # below is what is deleted. Matches no row.
        s.execute(update(Meta).where(Meta.key == "tuner-prune").values(value=Meta.value))
    pick = cutoff is not None or kernel is not None or stale
    picked = _selected_entries(s, kernel, cutoff, stale) if pick else []
    if dry_run:
        entries = dict(Counter(kern for _, _, kern in picked))
        gone = _orphaned_would_be(s, kernel, cutoff, {h for h, _, _ in picked}) if measurements else {}
        s.rollback()
        return PruneCounts(entries, gone, dry_run=True)
    entries = _delete_entries(s, picked)
    gone = _delete_orphaned(s, kernel, cutoff) if measurements else {}
    return PruneCounts(entries, gone)
