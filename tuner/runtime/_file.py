"""Cache files: a deterministic, versioned JSON file of cache entries, written atomically (gzip-compressed
when the name ends in .gz), read with strict validation against the published JSON Schema
(tuner/data/cache-schema.json, see tuner._schema) and loadable read-only without any database (`load_cache`).

Format (schema version 1):
    {"format": "tuner-cache", "schema_version": 1, "entries": [ENTRY, ...]}
with entries sorted by key hash; ENTRY holds kernel, source_hash, key (the key fields), dtypes, device,
versions, config, time_s (median, seconds), spread_s (p80 - p20, seconds), date (UTC) and space.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tuner._atomic import atomic_write
from tuner._schema import cache_schema_error

from ._entry import CacheEntry, EntryError, entry_from_json
from ._key import CacheKey, shape_distance

__all__ = [
    "CacheFileError",
    "SCHEMA_VERSION",
    "FORMAT",
    "MAX_FILE_BYTES",
    "MAX_ENTRIES",
    "read_cache_file",
    "parse_cache_bytes",
    "write_cache_file",
    "dumps_entries",
    "ReadOnlyCache",
    "load_cache",
]

FORMAT = "tuner-cache"
SCHEMA_VERSION = 1
MAX_FILE_BYTES = 64 * 2**20  # refuse bigger files before reading a byte of them
MAX_ENTRIES = 200_000
GZIP_MAGIC = b"\x1f\x8b"


class CacheFileError(ValueError):
    """A cache file that cannot be used; the message is one line saying why."""


def _reject_constant(name: str) -> Any:
    raise CacheFileError(f"not strict JSON: {name} is not allowed")


def _no_duplicate_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CacheFileError(f"duplicate JSON object key {k!r}"[:200])
        out[k] = v
    return out


def parse_cache_bytes(data: bytes, source: str = "cache file") -> list[CacheEntry]:
    """Parse and validate a whole cache file; every entry is checked before anything is returned."""
    if len(data) > MAX_FILE_BYTES:
        raise CacheFileError(f"{source} is {len(data)} bytes, over the {MAX_FILE_BYTES} byte limit")
    if not data.strip():
        raise CacheFileError(f"{source} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CacheFileError(f"{source} is not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_names)
    except CacheFileError as exc:  # NaN / Infinity, a duplicate name: say which file
        raise CacheFileError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CacheFileError(
            f"{source} is not valid JSON (truncated or corrupt): {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}"
        ) from None
    except (RecursionError, ValueError) as exc:
        raise CacheFileError(f"{source} is not usable JSON: {type(exc).__name__}") from None
    # The version picks the schema, so a newer file gets "not supported" rather than a schema complaint.
    ver = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and doc.get("format") == FORMAT and type(ver) is int and ver != SCHEMA_VERSION:
        raise CacheFileError(
            f"{source}: schema version {ver} is not supported (this tuner reads {SCHEMA_VERSION})"
        )
    problem = cache_schema_error(doc)  # the published JSON Schema, through the jsonschema library
    if problem is not None:
        raise CacheFileError(f"{source}: {problem}")
    entries = doc["entries"]
    out: list[CacheEntry] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(entries):
        try:
            e = entry_from_json(raw, f"entries[{i}]")
        except EntryError as exc:
            raise CacheFileError(f"{source}: {exc}") from None
        h = e.key.hash
        if h in seen:
            raise CacheFileError(f"{source}: entries[{i}] duplicates the key of entries[{seen[h]}]")
        seen[h] = i
        out.append(e)
    return out


def read_cache_file(path: str | os.PathLike[str]) -> list[CacheEntry]:
    """Read and validate a cache file; CacheFileError (one line) on any problem, size checked first."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise CacheFileError(f"{p} is not a regular file")
        if size > MAX_FILE_BYTES:
            raise CacheFileError(
                f"{p} is {size} bytes, over the {MAX_FILE_BYTES} byte limit for a cache file"
            )
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CacheFileError(f"cannot read {p}: {exc.strerror or exc}") from None
    if data[:2] == GZIP_MAGIC:
        data = _gunzip_bounded(data, str(p))
    return parse_cache_bytes(data, str(p))


def _gunzip_bounded(data: bytes, source: str) -> bytes:
    """Decompress a gzip file, refusing more than MAX_FILE_BYTES of output (a small file can expand to
    gigabytes): the reader stops one byte past the limit, so memory stays bounded."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
            out = g.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise CacheFileError(f"{source} is not a readable gzip file ({type(exc).__name__})") from None
    if len(out) > MAX_FILE_BYTES:
        raise CacheFileError(
            f"{source} decompresses to more than the {MAX_FILE_BYTES} byte limit for a cache file"
        )
    return out


def dumps_entries(entries: Iterable[CacheEntry]) -> str:
    """The file's text: entries sorted by key hash, keys sorted, one entry per line: deterministic."""
    rows = sorted(entries, key=lambda e: e.key.hash)
    body = ",\n".join("  " + json.dumps(e.to_json(), sort_keys=True, allow_nan=False) for e in rows)
    head = f'{{"format": "{FORMAT}", "schema_version": {SCHEMA_VERSION}, "entries": ['
    return head + ("\n" + body + "\n" if rows else "") + "]}\n"


def write_cache_file(path: str | os.PathLike[str], entries: Iterable[CacheEntry]) -> int:
    """Write atomically (tuner._atomic: a new file renamed over the old one), gzip-compressed when the
    name ends in .gz. Returns the entry count."""
    rows = list(entries)
    data = dumps_entries(rows).encode("utf-8")
    if Path(path).name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: the same cache still gives the same bytes
    atomic_write(path, data)
    return len(rows)


class ReadOnlyCache:
    """Cache entries held in memory, read-only (a shipped file loaded by `load_cache`): exact lookup by
    key, and the nearest entry of the same family for offline fallbacks."""

    def __init__(self, entries: Iterable[CacheEntry], *, source: str = "") -> None:
        self.source = source
        self._by_hash: dict[str, CacheEntry] = {}
        self._by_kernel: dict[str, list[CacheEntry]] = {}
        for e in entries:
            self._by_hash[e.key.hash] = e
            self._by_kernel.setdefault(e.key.kernel, []).append(e)

    def __len__(self) -> int:
        return len(self._by_hash)

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(sorted(self._by_hash.values(), key=lambda e: e.key.hash))

    def __repr__(self) -> str:
        return f"ReadOnlyCache({len(self)} entries{', from ' + self.source if self.source else ''})"

    def get(self, key: CacheKey) -> CacheEntry | None:
        return self._by_hash.get(key.hash)

    def for_kernel(self, kernel: str) -> list[CacheEntry]:
        return list(self._by_kernel.get(kernel, ()))

    def nearest(self, key: CacheKey) -> list[tuple[float, CacheEntry]]:
        return rank_nearest(key, self.for_kernel(key.kernel))


def rank_nearest(key: CacheKey, entries: Iterable[CacheEntry]) -> list[tuple[float, CacheEntry]]:
    """Entries of the key's family, nearest first by `shape_distance` (ties: by key hash)."""
    fam = key.family()
    ranked = [(shape_distance(key, e.key), e) for e in entries if e.key.family() == fam]
    ranked.sort(key=lambda t: (t[0], t[1].key.hash))
    return ranked


def load_cache(path: str | os.PathLike[str]) -> ReadOnlyCache:
    """Load a shipped cache file read-only, with no database: validated in full (CacheFileError if it
    is not usable). Pass it to `autotune(..., cache=...)` or `set_global_cache`."""
    return ReadOnlyCache(read_cache_file(path), source=str(path))
