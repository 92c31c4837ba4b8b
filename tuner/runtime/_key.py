"""Cache keys: what one cached config belongs to, bucketing of shape fields, and the offline distance.

A `CacheKey` holds the kernel identity (name + source hash), the key fields (the call's key arguments,
bucketed), the dtypes of the tensor arguments, the device and the software versions that change code
generation. Two keys are the same entry only if all of these agree; `mismatches` says which part differs,
so that a foreign or stale entry is a miss with a reason, never used silently.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CacheKey",
    "KeyValue",
    "Bucket",
    "make_bucketer",
    "pow2_bucket",
    "shape_distance",
    "fields_distance",
    "fields_gap",
    "canon",
]

KeyValue = int | float | str | bool | None
Bucket = str | Callable[[str, Any], Any] | Mapping[str, str | Callable[[str, Any], Any]]


def canon(obj: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, NaN refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class CacheKey:
    kernel: str
    source_hash: str
    fields: tuple[tuple[str, KeyValue], ...]
    dtypes: tuple[str, ...]
    device: str
    versions: tuple[tuple[str, str], ...]

    @classmethod
    def make(
        cls,
        kernel: str,
        source_hash: str,
        fields: Mapping[str, KeyValue],
        dtypes: tuple[str, ...] | list[str],
        device: str,
        versions: Mapping[str, str],
    ) -> CacheKey:
        return cls(
            kernel,
            source_hash,
            tuple(sorted(fields.items())),
            tuple(dtypes),
            device,
            tuple(sorted(versions.items())),
        )

    @property
    def fields_dict(self) -> dict[str, KeyValue]:
        return dict(self.fields)

    @property
    def versions_dict(self) -> dict[str, str]:
        return dict(self.versions)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "key": self.fields_dict,
            "dtypes": list(self.dtypes),
            "device": self.device,
            "versions": self.versions_dict,
        }

    @property
    def hash(self) -> str:
        """Stable identity of the entry (sha256 of the canonical JSON, 32 hex digits)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hashlib.sha256(canon(self.to_json()).encode()).hexdigest()[:32]
            object.__setattr__(self, "_hash", h)
        return h

    def family(self) -> tuple[Any, ...]:
        """Everything but the values of numeric key fields: entries of one family may stand in for
        each other in offline mode (nearest by `shape_distance`)."""
        fixed = tuple((k, v) for k, v in self.fields if not _numeric(v))
        names = tuple(k for k, _ in self.fields)
        return (self.kernel, self.source_hash, names, fixed, self.dtypes, self.device, self.versions)

    def mismatches(self, stored: CacheKey) -> list[str]:
        """Why `stored` is not this key (empty when it is), naming stored and current values."""
        out = []
        if stored.kernel != self.kernel:
            out.append(f"kernel differs (stored {stored.kernel!r}, now {self.kernel!r})")
        if stored.source_hash != self.source_hash:
            out.append(
                f"kernel source changed (stored hash {stored.source_hash[:12]}, now {self.source_hash[:12]})"
            )
        if stored.fields != self.fields:
            out.append(f"key fields differ (stored {stored.fields_dict}, now {self.fields_dict})")
        if stored.dtypes != self.dtypes:
            out.append(f"dtypes differ (stored {list(stored.dtypes)}, now {list(self.dtypes)})")
        if stored.device != self.device:
            out.append(f"device differs (stored {stored.device!r}, now {self.device!r})")
        if stored.versions != self.versions:
            sv, nv = stored.versions_dict, self.versions_dict
            if sv and nv and not set(sv) & set(nv):  # not an older version: another backend's entry
                out.append(
                    f"an entry of another backend or framework (stored for {'+'.join(sorted(sv))}, "
                    f"now {'+'.join(sorted(nv))})"
                )
                return out
            diffs = [
                f"{k} stored {sv.get(k)!r} now {nv.get(k)!r}"
                for k in sorted(set(sv) | set(nv))
                if sv.get(k) != nv.get(k)
            ]
            out.append("versions differ (" + ", ".join(diffs) + ")")
        return out


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def shape_distance(a: CacheKey, b: CacheKey) -> float:
    """Distance between two keys of one family over their numeric key fields:
    the sum over fields of |log2(x) - log2(y)| when both values are positive, else |x - y|.
    So 1024 vs 2048 is 1.0 and (M=512, N=512) vs (M=1024, N=256) is 2.0. Infinite across families."""
    if a.family() != b.family():
        return math.inf
    return fields_distance(a.fields, b.fields)


def fields_distance(a: tuple[tuple[str, KeyValue], ...], b: tuple[tuple[str, KeyValue], ...]) -> float:
    """`shape_distance` of two keys known to be of one family, from their (sorted) key fields alone: what
    ranks a store's family without building a `CacheKey` per row."""
    d = 0.0
    for (_, x), (_, y) in zip(a, b, strict=True):
        if not _numeric(x) or x == y:
            continue
        if x > 0 and y > 0:  # type: ignore[operator]
            d += abs(math.log2(x) - math.log2(y))  # type: ignore[arg-type]
        else:
            d += abs(x - y)  # type: ignore[operator]
    return d


def value_gap(a: CacheKey, b: CacheKey) -> float:
    """The sum over the numeric key fields of |x - y|: what breaks a tie of `shape_distance`, whose
    log2 puts a value halfway (geometrically) between two others, as 8 between 4 and 16; of those the
    one nearer in value (4) wins, as it does in a table looked up by |M - m| (vLLM's fused_moe configs)."""
    return fields_gap(a.fields, b.fields)


def fields_gap(a: tuple[tuple[str, KeyValue], ...], b: tuple[tuple[str, KeyValue], ...]) -> float:
    """`value_gap` from the (sorted) key fields alone."""
    return sum(
        abs(x - y)  # type: ignore[operator]
        for (_, x), (_, y) in zip(a, b, strict=True)
        if _numeric(x) and _numeric(y)
    )


def pow2_bucket(_name: str, value: Any) -> Any:
    """Round a positive int up to the next power of two (others unchanged): 1000 -> 1024, 1024 -> 1024."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return 1 << (value - 1).bit_length()
    return value


def _exact(_name: str, value: Any) -> Any:
    return value


_POLICIES: dict[str, Callable[[str, Any], Any]] = {"exact": _exact, "pow2": pow2_bucket}


def _policy(p: str | Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    if callable(p):
        return p
    try:
        return _POLICIES[p]
    except KeyError:
        raise ValueError(
            f"unknown bucket policy {p!r}: use 'exact', 'pow2' or a callable(name, value)"
        ) from None


def make_bucketer(bucket: Bucket) -> Callable[[str, Any], Any] | None:
    """`bucket` is a policy name ("exact", "pow2"), a callable(name, value) -> value, or a dict
    name -> policy (fields not named stay exact). Returns None for "exact" (nothing to do)."""
    if isinstance(bucket, Mapping):
        per = {k: _policy(v) for k, v in bucket.items()}
        return lambda name, value: per[name](name, value) if name in per else value
    f = _policy(bucket)
    return None if f is _exact else f
