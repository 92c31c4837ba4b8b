"""Features of a config for the cost model, described by a versioned `FeatureSchema`.

A schema lists, in order:
- per parameter: numeric values raw and log2 (log2 only where every domain value is positive), booleans
  0/1, categoricals one-hot over the domain (a value outside the domain encodes as all zeros, a missing
  parameter, or a number no float holds (inf, 2**1100), as NaN, which the boosted trees treat as
  "missing"). Values are told apart as the space tells them (`Param.has`): a bool in a numeric
  parameter, and a number (1, 0) in a Boolean one, are missing, not 1 and 0; a categorical keeps True
  and 1 in columns of their own;
- derived features, computed generically from the parameter names where they make that possible (all in
  log2, so a product is a sum): threads per block (block_size_x*y*z, MDIMC*NDIMC, num_warps*32),
  the elements a thread computes (tile_size_x*y*z), the block's extent per axis and its area
  (block_size_a*tile_size_a), the work-group tile (MWG*NWG, BLOCK_M*BLOCK_N) and the work per thread;
- alignment: for an integer parameter whose domain mixes powers of two with other values, the log2 of its
  odd part (x / the largest power of two dividing x: 0 for 32, log2(3) for 48 and 96), and the same for
  the threads per block and the block's extent per axis. Whether a block's extent is a power of two
  decides coalescing, bank conflicts and wavefront occupancy, and a size's log2 alone mixes 32, 48, 64 and
  96 into one ordered axis that trees split only with many data (the convolution table of an RDNA2 GPU,
  W6600: around its optimum, block widths 32, 64, 128 and 256 run within 1.01x of it and every other
  width from 48 to 240 78-106x slower; with these features the cost model ranks a held-out GPU's space
  better, docs/benchmarks.md, "Cost-model report");
- task features (problem dims, dtype size, device descriptor), constant within a task, given by the
  caller (`task_features`).

The schema is a JSON document; its `fingerprint` decides whether a saved model fits a space.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tuner.search_spaces._params import category_names, native

__all__ = [
    "FEATURE_SCHEMA_VERSION",
    "FeatureSchema",
    "ParamFeature",
    "Derived",
    "schema_for_space",
    "task_features",
    "SchemaMismatchError",
]

FEATURE_SCHEMA_VERSION = 2
"""The newest schema version this code reads and writes. A schema without alignment features is written
as version 1 (what it was before they existed), so models saved for such spaces stay valid; one with them
is version 2, which older code rejects with a clear message instead of misreading its columns."""


class SchemaMismatchError(ValueError):
    """A model was trained on another feature schema than the one asked for."""


@dataclass(frozen=True)
class ParamFeature:
    name: str
    kind: str  # "num", "bool" or "cat"
    log2: bool = False
    values: tuple[Any, ...] = ()  # the one-hot categories for "cat"
    odd: bool = False  # "num": also the log2 of the value's odd part (alignment)

    def columns(self) -> list[str]:
        if self.kind == "num":
            cols = [self.name, f"log2_{self.name}"] if self.log2 else [self.name]
            return cols + [f"log2odd_{self.name}"] if self.odd else cols
        if self.kind == "bool":
            return [self.name]
        return category_names(self.name, self.values)


@dataclass(frozen=True)
class Derived:
    """log2(prod(plus) / prod(minus)) * 1 + log2(scale); NaN when a term is missing or not positive.
    With `odd`, the log2 of the product's odd part (the terms' odd parts; `minus` and the scale unused)."""

    name: str
    plus: tuple[str, ...]
    minus: tuple[str, ...] = ()
    log2_scale: float = 0.0
    odd: bool = False

    @property
    def column(self) -> str:
        return f"log2odd_{self.name}" if self.odd else f"log2_{self.name}"


def _num_col(values: Sequence[Any], types: set[type] | None = None) -> np.ndarray:
    """Floats; NaN (missing) for anything that is not a finite (non-bool) number, an int beyond a float's
    range included (a config outside the domain; inf in a feature made XGBoost refuse the whole matrix).
    `types`: the set of the values' types, if the caller has it (`set(map(type, values))` runs in C, a
    per-value check in Python)."""
    if types is None:
        types = set(map(type, values))
    if types <= {int, float}:
        try:
            x = np.asarray(values, dtype=np.float64)
        except OverflowError:  # an int beyond a float's range
            pass
        else:
            return np.where(np.abs(x) <= _F32_MAX, x, np.nan)
    return np.array([_finite(v) for v in values], dtype=np.float64)


def _finite(v: Any) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return math.nan
    try:
        x = float(v)
    except OverflowError:
        return math.nan
    return x if abs(x) <= _F32_MAX else math.nan


# XGBoost reads features as float32: a value beyond its range (a config value near a float64's 1e308) is
# inf there, and it refuses the whole matrix. Such values are missing (NaN), as a non-number is.
_F32_MAX = float(np.finfo(np.float32).max)


def _log2_odd_col(num: np.ndarray) -> np.ndarray:
    """log2 of the odd part of each value (x / 2**v, v the largest with 2**v dividing x); NaN where the
    value is not a positive integer."""
    ok = (num > 0) & (num == np.floor(num)) & (num < 2.0**53)
    x = np.where(ok, num, 1.0).astype(np.int64)
    odd = x // (x & -x)  # x & -x is the largest power of two dividing x
    return np.where(ok, np.log2(odd.astype(np.float64)), np.nan)


def _log2_col(values: Sequence[Any], num: np.ndarray | None = None) -> np.ndarray:
    if num is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(num > 0, np.log2(np.where(num > 0, num, 1.0)), np.nan)
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[i] = math.log2(v)
    return out


@dataclass(frozen=True)
class FeatureSchema:
    params: tuple[ParamFeature, ...]
    derived: tuple[Derived, ...] = ()
    task: tuple[str, ...] = ()
    version: int = 0  # 0: by content (2 with alignment features, else 1)
    _names: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.version == 0:
            odd = any(p.odd for p in self.params) or any(d.odd for d in self.derived)
            object.__setattr__(self, "version", 2 if odd else 1)

    @property
    def names(self) -> list[str]:
        cols = [c for p in self.params for c in p.columns()]
        cols += [d.column for d in self.derived]
        cols += [f"task_{t}" for t in self.task]
        return cols

    def to_dict(self) -> dict[str, Any]:
        # "odd" is written only where set, so a schema without alignment features is the version-1
        # document it always was (same fingerprint: models saved before stay valid)
        return {
            "version": self.version,
            "params": [_param_doc(p) for p in self.params],
            "derived": [
                {"name": d.name, "plus": list(d.plus), "minus": list(d.minus), "log2_scale": d.log2_scale}
                | ({"odd": True} if d.odd else {})
                for d in self.derived
            ],
            "task": list(self.task),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureSchema:
        try:
            schema = cls(
                params=tuple(
                    ParamFeature(
                        p["name"],
                        p["kind"],
                        bool(p.get("log2", False)),
                        tuple(p.get("values", ())),
                        bool(p.get("odd", False)),
                    )
                    for p in d["params"]
                ),
                derived=tuple(
                    Derived(
                        x["name"],
                        tuple(x["plus"]),
                        tuple(x.get("minus", ())),
                        float(x.get("log2_scale", 0.0)),
                        bool(x.get("odd", False)),
                    )
                    for x in d.get("derived", ())
                ),
                task=tuple(d.get("task", ())),
                version=int(d["version"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a feature schema: missing or malformed {exc}") from None
        odd = [p.name for p in schema.params if p.kind not in ("num", "bool", "cat")]
        if odd:
            raise ValueError(f"not a feature schema: parameter {odd[0]!r} has no kind num, bool or cat")
        return schema

    def fingerprint(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def check_compatible(self, other: FeatureSchema, what: str = "model") -> None:
        """Raise SchemaMismatchError, naming the difference, unless `other` is this schema."""
        if self.fingerprint() == other.fingerprint():
            return
        if other.version > FEATURE_SCHEMA_VERSION:
            raise SchemaMismatchError(
                f"{what} uses feature schema version {other.version}, newer than this code reads (up to "
                f"{FEATURE_SCHEMA_VERSION}); upgrade tuner or retrain it"
            )
        mine, theirs = self.names, other.names
        if mine == theirs and self.version != other.version:
            raise SchemaMismatchError(
                f"{what} uses feature schema version {other.version}, this space's is {self.version}; retrain it"
            )
        if sorted(mine) == sorted(theirs):  # the lists below are empty: say what differs instead
            if mine == theirs:
                how = "the same feature names, computed otherwise (a derived feature's terms or scale)"
                # compared as the fingerprint compares them (JSON): in Python (0, 1) == (False, True)
                odd = [
                    (a, b)
                    for a, b in zip(self.params, other.params, strict=True)
                    if json.dumps(_param_doc(a), default=str) != json.dumps(_param_doc(b), default=str)
                ]
                if odd:
                    a, b = odd[0]
                    how = (
                        f"the same feature names, computed otherwise: parameter {a.name!r} is read as "
                        f"{_param_reading(b)} in it, as {_param_reading(a)} here"
                    )
            else:
                i = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
                how = (
                    f"the same features in another order (column {i} is {theirs[i]!r} in it, {mine[i]!r} "
                    "here: parameters, or a categorical parameter's values, listed in another order)"
                )
            raise SchemaMismatchError(
                f"{what} was trained on another feature schema ({other.fingerprint()} != "
                f"{self.fingerprint()}): {how}; transform configs with the model's own schema (load it "
                "without schema=) or retrain it for this space"
            )
        missing = [n for n in mine if n not in theirs][:5]
        extra = [n for n in theirs if n not in mine][:5]
        raise SchemaMismatchError(
            f"{what} was trained on another feature schema ({other.fingerprint()} != {self.fingerprint()}): "
            f"features missing from it {missing}, unknown to this space {extra}; retrain it for this space"
        )

    # ---- transform ---------------------------------------------------------------------------------
    def transform(
        self, configs: Sequence[Mapping[str, Any]], task: Mapping[str, float] | None = None
    ) -> np.ndarray:
        """Feature matrix (len(configs) x len(names)); configs may hold values outside the domains, and
        numpy scalars (np.int64(64) counts as 64)."""
        columns = {p.name: [native(c.get(p.name)) for c in configs] for p in self.params}
        return self._from_columns(columns, len(configs), task)

    def transform_keys(
        self, names: Sequence[str], keys: Sequence[Sequence[Any]], task: Mapping[str, float] | None = None
    ) -> np.ndarray:
        """Like `transform` for configs given as tuples in `names` order (a space's keys)."""
        cols = list(zip(*keys, strict=True)) if keys else [() for _ in names]
        columns = {n: list(c) for n, c in zip(names, cols, strict=True)}
        return self._from_columns(columns, len(keys), task)

    def _from_columns(
        self, columns: Mapping[str, list[Any]], n: int, task: Mapping[str, float] | None
    ) -> np.ndarray:
        out: list[np.ndarray] = []
        logs: dict[str, np.ndarray] = {}
        odds: dict[str, np.ndarray] = {}
        odd_derived = any(d.odd for d in self.derived)
        for p in self.params:
            col = columns.get(p.name)
            types = set(map(type, col)) if col is not None else set()
            if col is None or types <= {type(None)}:
                out.append(np.full((n, len(p.columns())), np.nan))
                continue
            if p.kind == "num":
                x = _num_col(col, types)
                out.append(x[:, None])
                lg = _log2_col(col, x)
                logs[p.name] = lg
                if p.log2:
                    out.append(lg[:, None])
                if p.odd or odd_derived:
                    od = _log2_odd_col(x)
                    odds[p.name] = od
                    if p.odd:
                        out.append(od[:, None])
            elif p.kind == "bool":
                # a bool only, as the space compares values (`Param.has`: 1 is not True, 0 not False): a
                # prior's or a related task's 0/1 for a Boolean is a value outside the domain, missing
                # (NaN) as a bool is in a numeric column; read as True/False it stood for configs never
                # measured
                out.append(
                    np.array([1.0 if v is True else 0.0 if v is False else np.nan for v in col])[:, None]
                )
            else:
                index = {_cat_key(v): j for j, v in enumerate(p.values)}
                oh = np.zeros((n, len(p.values)))
                for i, v in enumerate(col):
                    j = index.get(_cat_key(v))
                    if j is not None:
                        oh[i, j] = 1.0
                out.append(oh)
        for d in self.derived:
            if d.odd:
                acc = np.zeros(n)
                for name in d.plus:
                    acc = acc + odds.get(name, np.full(n, np.nan))
                out.append(acc[:, None])
                continue
            acc = np.full(n, d.log2_scale)
            for name in d.plus:
                acc = acc + logs.get(name, np.full(n, np.nan))
            for name in d.minus:
                acc = acc - logs.get(name, np.full(n, np.nan))
            out.append(acc[:, None])
        for t in self.task:
            v = (task or {}).get(t)
            out.append(np.full((n, 1), float(v) if v is not None else np.nan))
        return np.hstack(out) if out else np.zeros((n, 0))


def _param_doc(p: ParamFeature) -> dict[str, Any]:
    """A parameter's entry in the schema document ("odd" only where set: see `to_dict`)."""
    return {"name": p.name, "kind": p.kind, "log2": p.log2, "values": list(p.values)} | (
        {"odd": True} if p.odd else {}
    )


def _param_reading(p: ParamFeature) -> str:
    """How a parameter's values become features, for a message."""
    if p.kind == "bool":
        return "a Boolean (True/False; a number is missing)"
    if p.kind == "num":
        return "numbers" + (" (and their log2)" if p.log2 else "") + (" (and alignment)" if p.odd else "")
    return f"categories {list(p.values)!r}"


def _cat_key(v: Any) -> tuple[str, Any]:
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        # the number itself (1 and 1.0 hash and compare alike): float(v) raised OverflowError on an int
        # beyond a float's range (a prior task's config need not be in the space) and made 2**60 and
        # 2**60 + 1 one category
        return ("num", v)
    return ("str", v)


# ---- building a schema from a space ----------------------------------------------------------------------
_THREADS = re.compile(r"^(block_size_[xyz]|[mn]dimc|threads?_per_block|num_threads)$", re.I)
_WARPS = re.compile(r"^num_warps$", re.I)
_TILE = re.compile(r"^tile_size_([xyz])$", re.I)
_BLOCK_AXIS = re.compile(r"^block_size_([xyz])$", re.I)
_WG_TILE = re.compile(r"^([mn]wg|block_(size_)?[mn])$", re.I)


def _derived_for(
    param_names: Sequence[str], positive_numeric: AbstractSet[str], odd: AbstractSet[str] = frozenset()
) -> list[Derived]:
    names = [n for n in param_names if n in positive_numeric]
    out: list[Derived] = []
    threads = [n for n in names if _THREADS.match(n)]
    warps = [n for n in names if _WARPS.match(n)]
    if len(threads) >= 2:
        out.append(Derived("threads_per_block", tuple(threads)))
        if odd & set(threads):
            out.append(Derived("threads_per_block", tuple(threads), odd=True))
    elif warps:
        out.append(Derived("threads_per_block", tuple(warps), log2_scale=5.0))
    tiles = {(_TILE.match(n).group(1).lower()): n for n in names if _TILE.match(n)}  # type: ignore[union-attr]
    if len(tiles) >= 2:
        out.append(Derived("elements_per_thread", tuple(tiles.values())))
    blocks = {(_BLOCK_AXIS.match(n).group(1).lower()): n for n in names if _BLOCK_AXIS.match(n)}  # type: ignore[union-attr]
    extents = []
    for ax in sorted(set(tiles) & set(blocks)):
        d = Derived(f"block_extent_{ax}", (blocks[ax], tiles[ax]))
        out.append(d)
        extents.append(d)
        if odd & set(d.plus):
            out.append(Derived(f"block_extent_{ax}", d.plus, odd=True))
    if len(extents) >= 2:
        out.append(Derived("block_extent_area", tuple(n for d in extents for n in d.plus)))
    wg = [n for n in names if _WG_TILE.match(n)]
    if len(wg) >= 2:
        out.append(Derived("workgroup_tile_area", tuple(wg)))
        if len(threads) >= 2:
            out.append(Derived("work_per_thread", tuple(wg), tuple(threads)))
        elif warps:
            out.append(Derived("work_per_thread", tuple(wg), tuple(warps), log2_scale=-5.0))
    return out


def schema_for_space(space: Any, task_names: Sequence[str] = ()) -> FeatureSchema:
    """The feature schema of a `SearchSpace` (parameters, derived features, task feature names)."""
    params: list[ParamFeature] = []
    positive: set[str] = set()
    odd: set[str] = set()
    for p in space.params:
        vals = list(p.values)
        if p.is_numeric:
            log2 = all(float(v) > 0 for v in vals)
            if log2:
                positive.add(p.name)
            o = _mixed_alignment(vals)
            if o:
                odd.add(p.name)
            params.append(ParamFeature(p.name, "num", log2, odd=o))
        elif all(isinstance(v, bool) for v in vals):
            params.append(ParamFeature(p.name, "bool"))
        else:
            params.append(ParamFeature(p.name, "cat", values=tuple(vals)))
    return FeatureSchema(tuple(params), tuple(_derived_for(space.names, positive, odd)), tuple(task_names))


def _mixed_alignment(values: Sequence[Any]) -> bool:
    """Whether a numeric domain is positive integers with at least two distinct odd parts (so the
    alignment feature is not constant): {16, 32, 48} yes, {16, 32, 64} and {3, 6, 12} no."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return False
    parts = _log2_odd_col(np.asarray(values, dtype=np.float64))
    return bool(np.isfinite(parts).all()) and len(np.unique(parts)) >= 2


def task_features(
    problem: Mapping[str, float] | Sequence[float] | None = None,
    *,
    dtype_bytes: float | None = None,
    device: Any = None,
) -> dict[str, float]:
    """Task features: log2 of each problem dim, the dtype size, and the device descriptor's numbers."""
    out: dict[str, float] = {}
    if isinstance(problem, Mapping):
        items = list(problem.items())
    elif problem is not None:
        items = [(f"dim{i}", v) for i, v in enumerate(problem)]
    else:
        items = []
    for k, v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[f"log2_{k}"] = math.log2(v)
    if dtype_bytes is not None:
        out["dtype_bytes"] = float(dtype_bytes)
    if device is not None:
        out.update(device.features())
    return out
