"""Cache files: a deterministic, versioned JSON file of cache entries, written atomically (gzip-compressed
when the name ends in .gz), read with strict validation against the published JSON Schema
(tuner/data/cache-schema.json, see tuner._schema) and loadable read-only without any database (`load_cache`).

Format (schema version 1):
    {"format": "tuner-cache", "schema_version": 1, "entries": [ENTRY, ...]}
with entries sorted by key hash; ENTRY holds kernel, source_hash, key (the key fields), dtypes, device,
versions, config, time_s (median, seconds), spread_s (p80 - p20, seconds), date (UTC) and space.

Two levels of failure. A file that cannot be read at all (missing, over the size limit, not UTF-8, not JSON,
a duplicate JSON object key, another format or schema version, entries that are not a list) raises
CacheFileError everywhere. An entry that fails validation on its own (the schema's entry definition, a
wrong type, a NaN or absurd time, a bad date, a key already given by an earlier entry) is dropped, and what
was dropped comes back beside the good entries (`read_cache_contents`, `CacheFileContents.dropped`): the
runtime (`load_cache`) uses the rest and says once what it dropped; the strict readers (`read_cache_file`,
`parse_cache_bytes`, what `tuner cache import` uses by default) raise CacheFileError naming them instead.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tuner._atomic import atomic_write
from tuner._schema import cache_entry_schema_error, cache_file_schema_error

from ._entry import CacheEntry, EntryError, entry_from_json
from ._key import CacheKey, fields_distance, fields_gap

T = TypeVar("T")

__all__ = [
    "CacheFileError",
    "CacheFileContents",
    "DroppedEntry",
    "read_cache_contents",
    "parse_cache_contents",
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


def _no_duplicate_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CacheFileError(f"duplicate JSON object key {k!r}"[:200])
        out[k] = v
    return out


@dataclass(frozen=True)
class DroppedEntry:
    """An entry of a cache file that failed validation and was left out: its position, why (one line,
    naming the entry and the field), and its kernel and key fields where they could be read."""

    index: int
    reason: str
    kernel: str = ""
    key: str = ""  # the key fields as written in the file, shortened

    def describe(self) -> str:
        where = f"kernel {self.kernel!r}" if self.kernel else ""
        if self.key:
            where += f"{', ' if where else ''}key {self.key}"
        return f"{self.reason} ({where})" if where else self.reason


SHOWN_DROPPED = 3  # dropped entries a summary names


@dataclass(frozen=True)
class CacheFileContents:
    """A cache file as read: the valid entries and the ones dropped, with a digest of the file's bytes
    (what the zero-shot predictor's memo is keyed on)."""

    entries: list[CacheEntry]
    dropped: list[DroppedEntry]
    source: str = "cache file"
    digest: str = ""

    @property
    def total(self) -> int:
        return len(self.entries) + len(self.dropped)

    def summary(self) -> str:
        """One line: how many entries were dropped of how many, and the first few with why."""
        n = len(self.dropped)
        shown = "; ".join(d.describe()[:200] for d in self.dropped[:SHOWN_DROPPED])
        more = f"; and {n - SHOWN_DROPPED} more" if n > SHOWN_DROPPED else ""
        return f"{self.source}: {n} of {self.total} entries fail validation: {shown}{more}"

    def strict(self) -> list[CacheEntry]:
        """The entries, or CacheFileError (one line) when any was dropped."""
        if len(self.dropped) == 1:
            raise CacheFileError(f"{self.source}: {self.dropped[0].describe()[:300]}")
        if self.dropped:
            raise CacheFileError(self.summary())
        return self.entries


def _raw_identity(raw: Any) -> tuple[str, str]:
    """(kernel, key fields) of a raw entry, as far as they can be shown."""
    if not isinstance(raw, dict):
        return "", ""
    kernel = raw.get("kernel")
    key = raw.get("key")
    k = kernel[:80] if isinstance(kernel, str) and kernel.isprintable() else ""
    shown = json.dumps(key, sort_keys=True, allow_nan=True, default=str) if isinstance(key, dict) else ""
    return k, (shown if len(shown) <= 80 else shown[:77] + "...")


def parse_cache_contents(data: bytes, source: str = "cache file") -> CacheFileContents:
    """Parse a whole cache file: CacheFileError when the file cannot be read at all, else the valid
    entries and the dropped ones (each entry is validated on its own)."""
    if len(data) > MAX_FILE_BYTES:
        raise CacheFileError(f"{source} is {len(data)} bytes, over the {MAX_FILE_BYTES} byte limit")
    if not data.strip():
        raise CacheFileError(f"{source} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CacheFileError(f"{source} is not UTF-8 text (byte {exc.start})") from None
    try:
        # NaN / Infinity are read as floats: where an entry holds one, that entry fails validation
        doc = json.loads(text, object_pairs_hook=_no_duplicate_names)
    except CacheFileError as exc:  # a duplicate name: say which file
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
    problem = cache_file_schema_error(doc)  # the published JSON Schema, through the jsonschema library
    if problem is not None:
        raise CacheFileError(f"{source}: {problem}")
    out: list[CacheEntry] = []
    dropped: list[DroppedEntry] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(doc["entries"]):
        where = f"entries[{i}]"
        try:
            problem = cache_entry_schema_error(raw, where)
            if problem is not None:
                raise EntryError(problem)
            e = entry_from_json(raw, where)
            h = e.key.hash
            if h in seen:
                raise EntryError(f"{where} duplicates the key of entries[{seen[h]}]")
        except EntryError as exc:
            dropped.append(DroppedEntry(i, " ".join(str(exc).split()), *_raw_identity(raw)))
            continue
        seen[h] = i
        out.append(e)
    return CacheFileContents(out, dropped, source, hashlib.sha256(data).hexdigest())


def parse_cache_bytes(data: bytes, source: str = "cache file") -> list[CacheEntry]:
    """Parse and validate a whole cache file strictly: every entry is checked before anything is
    returned, and one that fails makes the file fail (CacheFileError)."""
    return parse_cache_contents(data, source).strict()


def read_cache_contents(path: str | os.PathLike[str]) -> CacheFileContents:
    """Read a cache file: CacheFileError (one line) when it cannot be read at all (size checked first),
    else its valid entries and the dropped ones."""
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
    return parse_cache_contents(data, str(p))


def read_cache_file(path: str | os.PathLike[str]) -> list[CacheEntry]:
    """Read and validate a cache file strictly; CacheFileError (one line) on any problem, one bad entry
    included."""
    return read_cache_contents(path).strict()


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


def write_cache_file(
    path: str | os.PathLike[str], entries: Iterable[CacheEntry], *, mkdir: bool = False
) -> int:
    """Write atomically (tuner._atomic: a new file renamed over the old one), gzip-compressed when the
    name ends in .gz. Returns the entry count. `mkdir=True` creates missing parent folders (removed again
    when the write fails)."""
    rows = list(entries)
    data = dumps_entries(rows).encode("utf-8")
    if Path(path).name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: the same cache still gives the same bytes
    atomic_write(path, data, mkdir=mkdir)
    return len(rows)


class ReadOnlyCache:
    """Cache entries held in memory, read-only (a shipped file loaded by `load_cache`): exact lookup by
    key, and the nearest entry of the same family for offline fallbacks."""

    def __init__(
        self,
        entries: Iterable[CacheEntry],
        *,
        source: str = "",
        dropped: Iterable[DroppedEntry] = (),
        digest: str = "",
    ) -> None:
        self.source = source
        self.dropped: list[DroppedEntry] = list(dropped)  # entries of the file left out as invalid
        self._digest = digest
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

    @property
    def digest(self) -> str:
        """A content hash: of the file's bytes when loaded from one, else of the entries (computed once)."""
        if not self._digest:
            h = hashlib.sha256()
            for e in self:
                h.update(json.dumps(e.to_json(), sort_keys=True, allow_nan=True).encode("utf-8"))
            self._digest = h.hexdigest()
        return self._digest

    def for_kernel(self, kernel: str) -> list[CacheEntry]:
        return list(self._by_kernel.get(kernel, ()))

    def nearest(self, key: CacheKey) -> list[tuple[float, CacheEntry]]:
        return rank_nearest(key, self.for_kernel(key.kernel))


# Distances this close are a tie: `shape_distance` sums differences of log2 in floating point, so an exact
# tie comes out a few ulps apart (as 0.39505239050000010 and 0.39505239049999830)
_TIE = 1e-9


def rank_nearest(key: CacheKey, entries: Iterable[CacheEntry]) -> list[tuple[float, CacheEntry]]:
    """Entries of the key's family, nearest first by `shape_distance`; ties (distances within 1e-9 of the
    nearest of them) go to the entry nearer in value (`value_gap`: 8 takes 4's entry before 16's), then by
    key hash. A tolerance, not rounding: two distances a few ulps apart can round to either side of a
    9th digit, and the exact tie was then decided by those ulps."""
    fam = key.family()
    return rank_fields(key, ((e.key.fields, e.key.hash, e) for e in entries if e.key.family() == fam))


def rank_fields(
    key: CacheKey, candidates: Iterable[tuple[tuple[tuple[str, Any], ...], str, T]]
) -> list[tuple[float, T]]:
    """`rank_nearest` over candidates of the key's family given as (sorted key fields, key hash, payload):
    the store's family is ranked from its rows' key fields, and only the entries tried are read whole."""
    by_distance = sorted(
        ((fields_distance(key.fields, f), h, f, p) for f, h, p in candidates), key=lambda t: (t[0], t[1])
    )
    ranked: list[tuple[float, T]] = []
    i = 0
    while i < len(by_distance):
        j = i + 1
        while j < len(by_distance) and by_distance[j][0] - by_distance[i][0] <= _TIE:
            j += 1
        tied = by_distance[i:j]
        if j - i > 1:
            tied = sorted(tied, key=lambda t: (fields_gap(key.fields, t[2]), t[1]))
        ranked += [(d, p) for d, _, _, p in tied]
        i = j
    return ranked


def load_cache(path: str | os.PathLike[str], *, strict: bool = False) -> ReadOnlyCache:
    """Load a shipped cache file read-only, with no database. CacheFileError when the file cannot be read
    at all; an entry that fails validation is dropped (kept in `.dropped`) and the rest are used, with one
    warning per file and content naming how many were dropped and the first few (`strict=True`: raise
    CacheFileError instead). Pass it to `autotune(..., cache=...)` or `set_global_cache`."""
    got = read_cache_contents(path)
    entries = got.strict() if strict else got.entries
    if got.dropped:
        from ._sources import warn_once  # _sources imports this module

        warn_once(
            ("file", str(path), "dropped", got.digest),
            "cache file %s; left out, the other %d entries are used",
            got.summary(),
            len(got.entries),
        )
    return ReadOnlyCache(entries, source=str(path), dropped=got.dropped, digest=got.digest)
