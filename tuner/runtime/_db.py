"""The config cache in the results store: one row per key (table `tuner_cache_entries`), and claim rows
(`tuner_cache_claims`) so that processes sharing one database tune a key once.

Writes are upsert statements (INSERT ... ON CONFLICT on SQLite and PostgreSQL) so concurrent writers
never lose or corrupt a row; an import is one transaction that takes the write lock first and writes its
rows in batches (`MERGE_BATCH` rows per statement execution).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..storage import operation
from ..storage._owner import HOST, pid_alive
from ..storage._schema import CacheClaimRow, CacheEntryRow, MeasurementRow, key_hashes
from ..store import ResultStore
from . import _returned
from ._entry import CacheEntry, entry_from_json
from ._file import rank_nearest
from ._key import CacheKey
from ._prune import PruneCounts, cutoff_date, prune_in

log = logging.getLogger(__name__)

MERGE_BATCH = 500  # rows per statement execution of a merge (its reads of existing keys too)
# The stats field of a measurement row that marks a timing in flight (`ConfigCache.mark_measuring`): its owner.
IN_FLIGHT = "in_flight"
# How many times a config whose timing killed its process (its owner died on this host within the lease) is
# timed again: the first death may have another cause (an OOM kill of the process, a `kill`); the next one
# makes it a failure (status `crashed`) that no later owner times, so that workers restarted on a crash
# (systemd, Kubernetes) do not die on the same config for ever.
CRASH_RETRIES = 1

__all__ = [
    "ConfigCache",
    "ImportCounts",
    "PruneCounts",
    "CacheEntryRow",
    "CacheClaimRow",
    "ClaimHolder",
    "owner_id",
    "HOST",
    "pid_alive",
]


def _row_values(e: CacheEntry) -> dict[str, Any]:
    k = e.key
    fields_hash, family_hash = key_hashes(
        k.kernel, k.source_hash, k.fields_dict, k.dtypes, k.device, k.versions_dict
    )
    return {
        "key_hash": k.hash,
        "kernel": k.kernel,
        "source_hash": k.source_hash,
        "key_fields": k.fields_dict,
        "dtypes": list(k.dtypes),
        "device": k.device,
        "versions": k.versions_dict,
        "config": dict(e.config),
        "time_s": float(e.time_s),
        "spread_s": float(e.spread_s),
        "date": e.date,
        "space": e.space,
        "fields_hash": fields_hash,
        "family_hash": family_hash,
    }


def _entry(r: CacheEntryRow) -> CacheEntry:
    key = CacheKey.make(r.kernel, r.source_hash, r.key_fields, r.dtypes, r.device, r.versions)
    return CacheEntry(key, dict(r.config), float(r.time_s), float(r.spread_s), r.date, r.space)


@dataclass(frozen=True)
class ImportCounts:
    added: int
    replaced: int
    kept: int

    @property
    def total(self) -> int:
        return self.added + self.replaced + self.kept


def owner_id() -> str:
    """This thread of this process: `host:pid:random:thread` (the pid read now, so a forked child is
    another owner)."""
    return f"{HOST}:{os.getpid()}:{_process_token()}:{threading.get_ident()}"


_token: tuple[int, str] | None = None


def _process_token() -> str:
    global _token
    if _token is None or _token[0] != os.getpid():
        _token = (os.getpid(), uuid.uuid4().hex[:8])
    return _token[1]


@dataclass(frozen=True)
class ClaimHolder:
    """Who holds the claim of a key: its owner id, host, pid, seconds since its last heartbeat and
    seconds until its lease expires (database rows written by an older tuner have no host/pid)."""

    owner: str
    host: str | None
    pid: int | None
    heartbeat_age_s: float | None
    expires_in_s: float

    @property
    def dead(self) -> bool:
        """The holder ran on this host and its process is gone."""
        return self.host == HOST and self.pid is not None and not pid_alive(self.pid)

    def describe(self) -> str:
        who = f"{self.host}:{self.pid}" if self.host else self.owner
        beat = (
            f", last heartbeat {self.heartbeat_age_s:.0f} s ago" if self.heartbeat_age_s is not None else ""
        )
        return f"process {who}{beat}, lease expires in {max(0.0, self.expires_in_s):.0f} s"


class ConfigCache:
    """Key -> best config, persisted in a ResultStore (its tables are created on the store's engine)."""

    def __init__(self, store: ResultStore | str | None = None) -> None:
        self.store = store if isinstance(store, ResultStore) else ResultStore(store)
        self._dialect = self.store.engine.dialect.name

    def __repr__(self) -> str:
        return f"ConfigCache({self.store!r})"

    # ---- reading -----------------------------------------------------------------------------------
    def get(self, key: CacheKey) -> CacheEntry | None:
        with self.store.session() as s:
            r = s.get(CacheEntryRow, key.hash)
            return _entry(r) if r is not None else None

    def entries(self, kernel: str | None = None, *, limit: int | None = None) -> list[CacheEntry]:
        """Every entry (of `kernel`), by key hash; `limit` bounds the read (the runtime's misses use it)."""
        q = select(CacheEntryRow).order_by(CacheEntryRow.key_hash)
        if kernel is not None:
            q = q.where(CacheEntryRow.kernel == kernel)
        if limit is not None:
            q = q.limit(limit)
        with self.store.session() as s:
            return [_entry(r) for r in s.scalars(q).all()]

    def __len__(self) -> int:
        with self.store.session() as s:
            return int(s.scalar(select(func.count()).select_from(CacheEntryRow)) or 0)

    def kernel_names(self) -> list[str]:
        """The names of the kernels that have entries, sorted (what `--kernel NAME` can select)."""
        q = select(CacheEntryRow.kernel).distinct().order_by(CacheEntryRow.kernel)
        with self.store.session() as s:
            return [str(k) for k in s.scalars(q).all()]

    def family(self, key: CacheKey, *, limit: int | None = None) -> list[CacheEntry]:
        """The stored entries of `key`'s family (same kernel, source, key field names, non-numeric
        field values, dtypes, device and versions): one indexed lookup, not a scan of the kernel."""
        fam = key_hashes(
            key.kernel, key.source_hash, key.fields_dict, key.dtypes, key.device, key.versions_dict
        )[1]
        q = select(CacheEntryRow).where(CacheEntryRow.family_hash == fam).order_by(CacheEntryRow.key_hash)
        if limit is not None:
            q = q.limit(limit)
        with self.store.session() as s:
            return [_entry(r) for r in s.scalars(q).all()]

    def family_fields(self, key: CacheKey) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
        """(key hash, sorted key fields) of every stored entry of `key`'s family: what the offline
        nearest key ranks. Two columns read through the family index, no entry built: the entries
        themselves are read one by one (`get_hash`), nearest first, until one is usable."""
        fam = key_hashes(
            key.kernel, key.source_hash, key.fields_dict, key.dtypes, key.device, key.versions_dict
        )[1]
        q = select(CacheEntryRow.key_hash, CacheEntryRow.key_fields).where(CacheEntryRow.family_hash == fam)
        with self.store.session() as s:
            return [(h, tuple(sorted(f.items()))) for h, f in s.execute(q)]

    def get_hash(self, key_hash: str) -> CacheEntry | None:
        """The stored entry whose key hashes to `key_hash` (None: none)."""
        with self.store.session() as s:
            r = s.get(CacheEntryRow, key_hash)
            return _entry(r) if r is not None else None

    def same_fields(self, key: CacheKey, *, limit: int = 8) -> list[CacheEntry]:
        """Stored entries with `key`'s kernel and key fields but another key (stale or foreign: source,
        dtypes, device or versions differ); indexed, at most `limit`."""
        fh = key_hashes(
            key.kernel, key.source_hash, key.fields_dict, key.dtypes, key.device, key.versions_dict
        )[0]
        q = (
            select(CacheEntryRow)
            .where(CacheEntryRow.fields_hash == fh, CacheEntryRow.key_hash != key.hash)
            .order_by(CacheEntryRow.key_hash)
            .limit(limit)
        )
        with self.store.session() as s:
            return [_entry(r) for r in s.scalars(q).all()]

    def count(self, kernel: str | None = None) -> int:
        """Number of stored entries (of `kernel`: counted on its index)."""
        q = select(func.count()).select_from(CacheEntryRow)
        if kernel is not None:
            q = q.where(CacheEntryRow.kernel == kernel)
        with self.store.session() as s:
            return int(s.scalar(q) or 0)

    def tried_configs(self, task_id: str, key_hash: str) -> list[dict[str, Any]]:
        """The configs (failed ones too) of the trials that tunings of the key `key_hash` recorded under
        `task_id` (`_coverage`): one indexed read of two columns, not whole measurements."""
        q = select(MeasurementRow.config, MeasurementRow.stats).where(MeasurementRow.task_id == task_id)
        with self.store.session() as s:
            return [dict(c) for c, st in s.execute(q) if isinstance(st, dict) and st.get("key") == key_hash]

    def nearest(self, key: CacheKey) -> list[tuple[float, CacheEntry]]:
        """Entries of the key's family, nearest shape first (offline mode)."""
        return rank_nearest(key, self.family(key))  # every entry read whole: the runtime uses family_fields

    # ---- writing -----------------------------------------------------------------------------------
    def _upsert_stmt(self, *, replace: bool) -> Any:
        """INSERT ... ON CONFLICT (key_hash) DO UPDATE of every column, for SQLite and PostgreSQL, executed
        with one row's values or many (an import); without `replace` an existing row is updated only by
        a faster entry."""
        if self._dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            stmt: Any = sqlite_insert(CacheEntryRow)
        else:
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt = pg_insert(CacheEntryRow)
        upd = {c.name: stmt.excluded[c.name] for c in CacheEntryRow.__table__.columns if c.name != "key_hash"}
        where = None if replace else (stmt.excluded.time_s < CacheEntryRow.time_s)
        return stmt.on_conflict_do_update(index_elements=["key_hash"], set_=upd, where=where)

    def _upsert(self, s: Session, e: CacheEntry, *, replace: bool) -> None:
        vals = _row_values(e)
        if self._dialect in ("sqlite", "postgresql"):
            s.execute(self._upsert_stmt(replace=replace).values(**vals))
            return
        r = s.get(CacheEntryRow, vals["key_hash"])  # other databases: read, then write
        if r is None:
            s.add(CacheEntryRow(**vals))
        elif replace or e.time_s < r.time_s:
            for k, v in vals.items():
                setattr(r, k, v)

    def put(self, entry: CacheEntry, *, replace: bool = False) -> None:
        """Store `entry`; an existing entry for the key is kept when it is faster, unless `replace`.
        The entry is validated as a file entry would be (so an export can always be imported)."""
        entry_from_json(entry.to_json(), "cache entry")
        with self.store.session() as s:
            self._upsert(s, entry, replace=replace)

    def merge(self, entries: Iterable[CacheEntry], *, prefer_import: bool = False) -> ImportCounts:
        """Merge validated entries in one transaction: new keys are added; for a key present in both,
        the faster measured entry wins (the imported one always, with `prefer_import`). Of entries that
        share a key, the last one that is written wins, as if each were merged in turn.

        The rows are written in batches (`MERGE_BATCH` rows per execution of one upsert statement), not
        one statement per entry: an import of 100k entries costs seconds, not minutes."""
        rows = list(entries)
        added = replaced = kept = 0
        with self.store.session() as s:
            # Take the write lock first (SQLite: a write begins the transaction), so that the counts
            # below are those of the database we write to.
            s.execute(delete(CacheClaimRow).where(CacheClaimRow.expires_at < time.time()))
            existing: dict[str, float] = {}
            hashes = list(dict.fromkeys(e.key.hash for e in rows))
            for i in range(0, len(hashes), MERGE_BATCH):
                chunk = hashes[i : i + MERGE_BATCH]
                for h, t in s.execute(
                    select(CacheEntryRow.key_hash, CacheEntryRow.time_s).where(
                        CacheEntryRow.key_hash.in_(chunk)
                    )
                ):
                    existing[h] = t
            write: dict[str, CacheEntry] = {}  # key hash -> the entry written last for it
            for e in rows:
                old = existing.get(e.key.hash)
                if old is None:
                    added += 1
                elif prefer_import or e.time_s < old:
                    replaced += 1
                else:
                    kept += 1
                    continue
                write[e.key.hash] = e
            if self._dialect in ("sqlite", "postgresql"):
                # Conditional on the time unless `prefer_import`: what was read above decided the counts,
                # and a faster entry another process wrote since (PostgreSQL) is not overwritten.
                stmt = self._upsert_stmt(replace=prefer_import)
                # SQLite and psycopg 3 (its pipeline) run an executemany fast. Other PostgreSQL drivers
                # (psycopg2) run it as one round trip per row, and SQLAlchemy 2.1 batches rows into one
                # multi-row INSERT ... ON CONFLICT only for a statement with RETURNING: ask for the keys.
                many_rows = self._dialect == "postgresql" and self.store.engine.dialect.driver != "psycopg"
                if many_rows:
                    stmt = stmt.returning(CacheEntryRow.key_hash)
                batch = list(write.values())
                for i in range(0, len(batch), MERGE_BATCH):
                    res = s.execute(stmt, [_row_values(e) for e in batch[i : i + MERGE_BATCH]])
                    if many_rows:
                        res.all()
            else:
                for e in write.values():
                    self._upsert(s, e, replace=True)
        return ImportCounts(added, replaced, kept)

    def clear(self) -> int:
        """Remove every entry; returns how many. `prune` removes some."""
        with self.store.session() as s:
            res: Any = s.execute(delete(CacheEntryRow))
            return int(res.rowcount or 0)

    def prune(
        self,
        *,
        older_than_days: float | None = None,
        kernel: str | None = None,
        stale: bool = False,
        measurements: bool = False,
        dry_run: bool = False,
    ) -> PruneCounts:
        """Remove the entries that every given selector picks, in one transaction (an error or an
        interrupt leaves the store as it was); returns the counts per kernel (`PruneCounts`).

        `older_than_days`: entries whose date (when the winner was measured; a hit does not renew it) is
        older; `kernel`: that kernel's entries (alone: all of them); `stale`: entries superseded by a newer
        entry of the same kernel, key fields, dtypes and device (another source hash or other versions).
        `measurements`: also the measurements that runtime tunings recorded for keys that have no entry
        (after this prune), limited by `kernel` and `older_than_days` too; a study's measurements and those
        of no key (`tuner.optimize`) are never removed. `dry_run`: count, remove nothing. ValueError when
        nothing is selected or the number of days is negative."""
        if older_than_days is None and kernel is None and not stale and not measurements:
            raise ValueError("nothing selected: give older_than_days, kernel, stale or measurements")
        cutoff = cutoff_date(older_than_days) if older_than_days is not None else None
        what = "pruning the store" + (f" (kernel {kernel})" if kernel else "")
        with operation(what), self.store.session() as s:
            return prune_in(
                s,
                cutoff,
                kernel,
                stale,
                measurements=measurements,
                dry_run=dry_run,
                lock_first=self._dialect == "sqlite",
            )

    # ---- claims: one tuner per key across processes -------------------------------------------------
    def claim(self, key_hash: str, owner: str, lease_s: float) -> bool:
        """Try to become the process that tunes `key_hash`; True if this owner holds the claim now.

        A claim is taken over when its lease has expired (its owner hangs, or died on another host), or at
        once when its owner ran on this host and its process is gone, or is this very owner (a call of
        this thread that an interrupt stopped before it released its claim)."""
        now = time.time()
        live = {"host": HOST, "pid": os.getpid(), "heartbeat_at": now}
        try:
            with self.store.session() as s:
                s.add(CacheClaimRow(key_hash=key_hash, owner=owner, expires_at=now + lease_s, **live))
            return True
        except Exception as exc:  # StoreError wrapping IntegrityError: someone holds it
            if not isinstance(exc.__cause__, IntegrityError) and not isinstance(exc, IntegrityError):
                raise
        holder = self.holder(key_hash)
        if holder is None:  # released in between: the caller asks again
            return False
        cond = CacheClaimRow.expires_at < now
        if holder.owner == owner:
            # held by this very thread, which is here and so not tuning the key: a claim that an
            # interrupted call (Ctrl-C in a notebook) could not release; take it back at once
            log.info("claim of %s: left by an interrupted call of this thread; taking it back", key_hash)
            cond = CacheClaimRow.owner == owner
        elif holder.dead:
            log.warning(
                "claim of %s: its owner %s:%s is gone; taking it over", key_hash, holder.host, holder.pid
            )
            cond = CacheClaimRow.owner == holder.owner
        with self.store.session() as s:
            res: Any = s.execute(
                update(CacheClaimRow)
                .where(CacheClaimRow.key_hash == key_hash, cond)
                .values(owner=owner, expires_at=now + lease_s, **live)
            )
            return bool(res.rowcount)

    # ---- the measurement in flight under a claim (a config that hangs) ---------------------------
    def mark_measuring(
        self,
        task: Any,
        space: str,
        config: dict[str, Any],
        key_hash: str,
        owner: str,
        lease_s: float,
        crashes: int = 0,
    ) -> int:
        """Record, before the claim's owner times `config`, that it does: a measurement row with status
        `timeout` (`hung_configs`), which `unmark` deletes once the timing returns. A process that hangs
        in the timing (a deadlocked kernel) leaves it behind as that config's failure; returns its id.
        `crashes`: how many earlier timings of the config killed their process (`hung_configs`)."""
        stats = {"key": key_hash, IN_FLIGHT: owner, "host": HOST, "pid": os.getpid(), "since": time.time()}
        if crashes:
            stats["crashes"] = crashes
        error = (
            f"timed out: its timing did not return within the claim's lease (lease_s = {lease_s:g} s); "
            "the process that timed it hung in it (a deadlocked kernel, an endless loop) or was killed"
        )
        return self.store.record(task, space, config, None, "timeout", stats=stats, error=error)

    def unmark(self, *row_ids: int) -> None:
        """Delete the marks `mark_measuring` wrote (their timings returned), in one transaction."""
        with self.store.session() as s:
            s.execute(delete(MeasurementRow).where(MeasurementRow.id.in_(row_ids)))

    def hung_configs(
        self, task_id: str, key_hash: str, owner: str, lease_s: float
    ) -> tuple[dict[str, str], dict[str, int]]:
        """The configs whose timing outlived a claim of the key `key_hash` (canon(config) -> error), and
        the configs to time again whose earlier timings killed their process (canon(config) -> how many
        times: pass it to `mark_measuring`), from the marks (`mark_measuring`) of the earlier owners of
        the claim, which the caller now holds. A mark whose owner was alive when its claim was taken over
        (the lease ran out: it hangs in the timing), or that is older than `lease_s`, is kept as the
        config's failure. One whose owner died sooner on this host (killed, or crashed, in the timing) is
        deleted and its config timed again, up to `CRASH_RETRIES` times; the death after those makes it a
        failure too, status `crashed` ("crashed the process while timed (N times)"). One of this very
        owner (an interrupted timing) is deleted, and so is one whose timing returned while the store was
        down (`_returned`: its owner could not delete it, and may have exited since), without counting."""
        from ._key import canon
        from ._tuning import CRASHED

        q = select(
            MeasurementRow.id, MeasurementRow.config, MeasurementRow.stats, MeasurementRow.error
        ).where(MeasurementRow.task_id == task_id, MeasurementRow.status.in_(("timeout", "crashed")))
        hung: dict[str, str] = {}
        crashed: dict[str, int] = {}
        gone: list[int] = []
        noted: list[int] = []  # marks whose timings returned in a store outage (`_returned`)
        now = time.time()
        with self.store.session() as s:
            for row_id, config, st, error in s.execute(q):
                if not isinstance(st, dict) or st.get("key") != key_hash:
                    continue
                c = canon(dict(config))
                if st.get("crashed"):  # timed too often, killing its process each time
                    hung[c] = error or "crashed"
                    continue
                if not st.get(IN_FLIGHT):
                    continue
                old = now - float(st.get("since") or 0.0) > lease_s
                died = st.get("host") == HOST and isinstance(st.get("pid"), int) and not pid_alive(st["pid"])
                if st[IN_FLIGHT] == owner:
                    gone.append(row_id)
                elif _returned.returned(
                    self.store.url, row_id, str(st[IN_FLIGHT])
                ):  # its timing returned in a store outage
                    gone.append(row_id)
                    noted.append(row_id)
                elif died and not old:
                    n = int(st.get("crashes") or 0) + 1
                    if n <= CRASH_RETRIES:
                        crashed[c] = max(crashed.get(c, 0), n)
                        gone.append(row_id)
                        continue
                    hung[c] = (
                        f"{CRASHED} ({n} times): the process that timed it died in "
                        "the timing (a segfault, an abort, a kill), and so did the one that timed it again"
                    )
                    done = {k: v for k, v in st.items() if k != IN_FLIGHT}
                    s.execute(
                        update(MeasurementRow)
                        .where(MeasurementRow.id == row_id)
                        .values(status="crashed", error=hung[c], stats={**done, "crashed": n})
                    )
                else:
                    hung[c] = error or "timed out"
            if gone:
                s.execute(delete(MeasurementRow).where(MeasurementRow.id.in_(gone)))
        _returned.forget(self.store.url, *noted)
        for c in hung:
            crashed.pop(c, None)
        return hung, crashed

    def holder(self, key_hash: str) -> ClaimHolder | None:
        """Who holds the claim of `key_hash` now (None: nobody)."""
        with self.store.session() as s:
            r = s.get(CacheClaimRow, key_hash)
            if r is None:
                return None
            now = time.time()
            age = now - r.heartbeat_at if r.heartbeat_at is not None else None
            return ClaimHolder(r.owner, r.host, r.pid, age, r.expires_at - now)

    def renew(self, key_hash: str, owner: str, lease_s: float) -> None:
        """Extend the lease of a claim this owner holds (the heartbeat)."""
        now = time.time()
        with self.store.session() as s:
            s.execute(
                update(CacheClaimRow)
                .where(CacheClaimRow.key_hash == key_hash, CacheClaimRow.owner == owner)
                .values(expires_at=now + lease_s, heartbeat_at=now)
            )

    def release(self, key_hash: str, owner: str) -> None:
        with self.store.session() as s:
            s.execute(
                delete(CacheClaimRow).where(CacheClaimRow.key_hash == key_hash, CacheClaimRow.owner == owner)
            )
