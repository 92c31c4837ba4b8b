"""A cache entry (key -> config with its measured time) and the strict validation of entries read from
outside (an imported or shipped cache file). Validation never trusts the input: types, sizes, ranges and
formats are all checked, and the message names the entry and the field."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._key import CacheKey, KeyValue

__all__ = ["CacheEntry", "EntryError", "entry_from_json", "now_iso", "LIMITS"]


class EntryError(ValueError):
    """An entry that fails validation; the message is one line naming the entry and the field."""


# Limits on what a cache file may hold. A real entry is far inside every one of them.
LIMITS: dict[str, float] = {
    "max_time_s": 3600.0,  # a kernel call measured at over an hour is not a measurement we trust
    "max_str": 200,
    "max_fields": 32,
    "max_config_params": 64,
    "max_versions": 16,
    "max_dtypes": 32,
    "max_abs_int": 2**53,
    "max_abs_float": 1e15,
}

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_HEX_RE = re.compile(r"^[0-9a-f]{8,64}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CacheEntry:
    """The winner for one key: its config, median time and spread (seconds), and when it was measured."""

    key: CacheKey
    config: Mapping[str, Any]
    time_s: float
    spread_s: float = 0.0
    date: str = field(default_factory=now_iso)
    space: str = ""  # fingerprint of the search space it was tuned over (informative)

    def to_json(self) -> dict[str, Any]:
        d = self.key.to_json()
        d.update(
            {
                "config": dict(self.config),
                "time_s": self.time_s,
                "spread_s": self.spread_s,
                "date": self.date,
                "space": self.space,
            }
        )
        return d


ENTRY_FIELDS = (
    "kernel",
    "source_hash",
    "key",
    "dtypes",
    "device",
    "versions",
    "config",
    "time_s",
    "spread_s",
    "date",
    "space",
)


def _str(where: str, v: Any, *, allow_empty: bool = False) -> str:
    if not isinstance(v, str):
        raise EntryError(f"{where} must be a string, got {type(v).__name__}")
    if not v and not allow_empty:
        raise EntryError(f"{where} must not be empty")
    if len(v) > LIMITS["max_str"]:
        raise EntryError(f"{where} is longer than {LIMITS['max_str']} characters")
    if not v.isprintable():
        raise EntryError(f"{where} contains non-printable characters")
    return v


def _scalar(where: str, v: Any) -> KeyValue:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        if abs(v) > LIMITS["max_abs_int"]:
            raise EntryError(f"{where}={v} is out of range (|value| <= 2**53)")
        return v
    if isinstance(v, float):
        if not math.isfinite(v) or abs(v) > LIMITS["max_abs_float"]:
            raise EntryError(f"{where}={v!r} is not a finite number of sane size")
        return v
    if isinstance(v, str):
        return _str(where, v, allow_empty=True)
    raise EntryError(f"{where} must be a number, string, bool or null, got {type(v).__name__}")


def _name_map(where: str, v: Any, limit: float, *, allow_none: bool) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise EntryError(f"{where} must be an object, got {type(v).__name__}")
    if len(v) > limit:
        raise EntryError(f"{where} has {len(v)} items, more than {limit}")
    out = {}
    for k, x in v.items():
        _str(f"{where} name", k)
        if not _NAME_RE.match(k):
            raise EntryError(f"{where} name {k!r} is not an identifier")
        val = _scalar(f"{where}.{k}", x)
        if val is None and not allow_none:
            raise EntryError(f"{where}.{k} must not be null")
        out[k] = val
    return out


def _time(where: str, v: Any, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EntryError(f"{where} must be a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x):
        raise EntryError(f"{where}={v!r} is not finite")
    if (x <= 0.0) if positive else (x < 0.0):
        raise EntryError(f"{where}={v!r} must be {'positive' if positive else 'non-negative'}")
    if x > LIMITS["max_time_s"]:
        raise EntryError(f"{where}={v!r} is absurd (more than {LIMITS['max_time_s']:.0f} s)")
    return x


def entry_from_json(obj: Any, where: str = "entry") -> CacheEntry:
    """Validate one entry of a cache file and build it; raises EntryError naming what is wrong."""
    if not isinstance(obj, dict):
        raise EntryError(f"{where} must be an object, got {type(obj).__name__}")
    missing = [f for f in ENTRY_FIELDS if f not in obj]
    if missing:
        raise EntryError(f"{where} lacks fields {missing}")
    extra = sorted(set(obj) - set(ENTRY_FIELDS))
    if extra:
        raise EntryError(f"{where} has unknown fields {extra}")
    kernel = _str(f"{where}.kernel", obj["kernel"])
    src = _str(f"{where}.source_hash", obj["source_hash"])
    if not _HEX_RE.match(src):
        raise EntryError(f"{where}.source_hash must be 8-64 lowercase hex digits")
    fields = _name_map(f"{where}.key", obj["key"], LIMITS["max_fields"], allow_none=True)
    dtypes = obj["dtypes"]
    if not isinstance(dtypes, list) or len(dtypes) > LIMITS["max_dtypes"]:
        raise EntryError(f"{where}.dtypes must be a list of at most {LIMITS['max_dtypes']} strings")
    dtypes = [_str(f"{where}.dtypes[{i}]", d) for i, d in enumerate(dtypes)]
    device = _str(f"{where}.device", obj["device"])
    versions = obj["versions"]
    if not isinstance(versions, dict) or len(versions) > LIMITS["max_versions"]:
        raise EntryError(f"{where}.versions must be an object of at most {LIMITS['max_versions']} strings")
    versions = {
        _str(f"{where}.versions name", k): _str(f"{where}.versions.{k}", v) for k, v in versions.items()
    }
    config = _name_map(f"{where}.config", obj["config"], LIMITS["max_config_params"], allow_none=False)
    if not config:
        raise EntryError(f"{where}.config must not be empty")
    time_s = _time(f"{where}.time_s", obj["time_s"], positive=True)
    spread_s = _time(f"{where}.spread_s", obj["spread_s"], positive=False)
    date = obj["date"]
    if not isinstance(date, str) or not _DATE_RE.match(date):
        raise EntryError(f"{where}.date must be a UTC time like 2026-01-31T12:00:00Z, got {date!r}"[:300])
    try:
        dt.datetime.strptime(date, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise EntryError(f"{where}.date {date!r} is not a valid date") from None
    space = _str(f"{where}.space", obj["space"], allow_empty=True)
    key = CacheKey.make(kernel, src, fields, dtypes, device, versions)
    return CacheEntry(key, config, time_s, spread_s, date, space)
