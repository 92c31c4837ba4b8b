"""The config cache in the results store: one row per key (table `tuner_cache_entries`), and claim rows
(`tuner_cache_claims`) so that processes sharing one database tune a key once.

Writes are single upsert statements (INSERT ... ON CONFLICT on SQLite and PostgreSQL) so concurrent
writers never lose or corrupt a row; an import is one transaction that takes the write lock first.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Float, String, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from ..store import ResultStore, _Base
from ._entry import CacheEntry, entry_from_json
from ._file import rank_nearest
from ._key import CacheKey

log = logging.getLogger(__name__)

__all__ = ["ConfigCache", "ImportCounts", "CacheEntryRow", "CacheClaimRow"]


class CacheEntryRow(_Base):
    __tablename__ = "tuner_cache_entries"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    key_fields: Mapped[dict] = mapped_column(JSON)
    dtypes: Mapped[list] = mapped_column(JSON)
    device: Mapped[str] = mapped_column(String(200))
    versions: Mapped[dict] = mapped_column(JSON)
    config: Mapped[dict] = mapped_column(JSON)
    time_s: Mapped[float] = mapped_column(Float)
    spread_s: Mapped[float] = mapped_column(Float)
    date: Mapped[str] = mapped_column(String(40))
    space: Mapped[str] = mapped_column(String(200))


class CacheClaimRow(_Base):
    __tablename__ = "tuner_cache_claims"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)


def _row_values(e: CacheEntry) -> dict[str, Any]:
    k = e.key
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


_OWNER_PREFIX = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_id() -> str:
    return f"{_OWNER_PREFIX}:{threading.get_ident()}"


class ConfigCache:
    """Key -> best config, persisted in a ResultStore (its tables are created on the store's engine)."""

    def __init__(self, store: ResultStore | str | None = None) -> None:
        self.store = store if isinstance(store, ResultStore) else ResultStore(store)
        tables: list[Any] = [CacheEntryRow.__table__, CacheClaimRow.__table__]
        _Base.metadata.create_all(self.store.engine, tables=tables)
        self._dialect = self.store.engine.dialect.name

    def __repr__(self) -> str:
        return f"ConfigCache({self.store!r})"

    # ---- reading -----------------------------------------------------------------------------------
    def get(self, key: CacheKey) -> CacheEntry | None:
        with self.store.session() as s:
            r = s.get(CacheEntryRow, key.hash)
            return _entry(r) if r is not None else None

    def entries(self, kernel: str | None = None) -> list[CacheEntry]:
        q = select(CacheEntryRow).order_by(CacheEntryRow.key_hash)
        if kernel is not None:
            q = q.where(CacheEntryRow.kernel == kernel)
        with self.store.session() as s:
            return [_entry(r) for r in s.scalars(q).all()]

    def __len__(self) -> int:
        from sqlalchemy import func

        with self.store.session() as s:
            return int(s.scalar(select(func.count()).select_from(CacheEntryRow)) or 0)

    def nearest(self, key: CacheKey) -> list[tuple[float, CacheEntry]]:
        return rank_nearest(key, self.entries(key.kernel))

    # ---- writing -----------------------------------------------------------------------------------
    def _upsert(self, s: Session, e: CacheEntry, *, replace: bool) -> None:
        vals = _row_values(e)
        if self._dialect in ("sqlite", "postgresql"):
            if self._dialect == "sqlite":
                from sqlalchemy.dialects.sqlite import insert as sqlite_insert

                stmt: Any = sqlite_insert(CacheEntryRow).values(**vals)
            else:
                from sqlalchemy.dialects.postgresql import insert as pg_insert

                stmt = pg_insert(CacheEntryRow).values(**vals)
            upd = {k: stmt.excluded[k] for k in vals if k != "key_hash"}
            where = None if replace else (stmt.excluded.time_s < CacheEntryRow.time_s)
            s.execute(stmt.on_conflict_do_update(index_elements=["key_hash"], set_=upd, where=where))
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
        the faster measured entry wins (the imported one always, with `prefer_import`)."""
        rows = list(entries)
        added = replaced = kept = 0
        with self.store.session() as s:
            # Take the write lock first (SQLite: a write begins the transaction), so that the counts
            # below are those of the database we write to.
            s.execute(delete(CacheClaimRow).where(CacheClaimRow.expires_at < time.time()))
            existing: dict[str, float] = {}
            hashes = [e.key.hash for e in rows]
            for i in range(0, len(hashes), 500):
                chunk = hashes[i : i + 500]
                for h, t in s.execute(
                    select(CacheEntryRow.key_hash, CacheEntryRow.time_s).where(
                        CacheEntryRow.key_hash.in_(chunk)
                    )
                ):
                    existing[h] = t
            for e in rows:
                old = existing.get(e.key.hash)
                if old is None:
                    added += 1
                elif prefer_import or e.time_s < old:
                    replaced += 1
                else:
                    kept += 1
                    continue
                self._upsert(s, e, replace=True)
        return ImportCounts(added, replaced, kept)

    def clear(self) -> int:
        with self.store.session() as s:
            res: Any = s.execute(delete(CacheEntryRow))
            return int(res.rowcount or 0)

    # ---- claims: one tuner per key across processes -------------------------------------------------
    def claim(self, key_hash: str, owner: str, lease_s: float) -> bool:
        """Try to become the process that tunes `key_hash`; True if this owner holds the claim now.
        A claim whose lease has expired (its owner died or hangs) is taken over."""
        now = time.time()
        try:
            with self.store.session() as s:
                s.add(CacheClaimRow(key_hash=key_hash, owner=owner, expires_at=now + lease_s))
            return True
        except Exception as exc:  # StoreError wrapping IntegrityError: someone holds it
            if not isinstance(exc.__cause__, IntegrityError) and not isinstance(exc, IntegrityError):
                raise
        with self.store.session() as s:
            res: Any = s.execute(
                update(CacheClaimRow)
                .where(CacheClaimRow.key_hash == key_hash, CacheClaimRow.expires_at < now)
                .values(owner=owner, expires_at=now + lease_s)
            )
            return bool(res.rowcount)

    def renew(self, key_hash: str, owner: str, lease_s: float) -> None:
        with self.store.session() as s:
            s.execute(
                update(CacheClaimRow)
                .where(CacheClaimRow.key_hash == key_hash, CacheClaimRow.owner == owner)
                .values(expires_at=time.time() + lease_s)
            )

    def release(self, key_hash: str, owner: str) -> None:
        with self.store.session() as s:
            s.execute(
                delete(CacheClaimRow).where(CacheClaimRow.key_hash == key_hash, CacheClaimRow.owner == owner)
            )
