"""Parameter types of a search space.

Every parameter has a finite, ordered domain (`values`). Kernel tuning parameters are discrete by nature
(block sizes, warps, stages, flags), and a finite domain is what lets a strategy enumerate, move to a
neighbour and never propose a config twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Value = int | float | str | bool

# The most values an IntRange's domain holds: a domain is a tuple with a lookup table, about 250 bytes a
# value (10,000,000: 2.5 GB and some 15 s to build).
DOMAIN_LIMIT = 10_000_000

__all__ = ["Param", "PowerOfTwo", "IntRange", "Categorical", "Boolean", "Value", "param_from_values"]


@dataclass(frozen=True)
class Param:
    """A named parameter with a finite ordered domain.

    `ordered` says whether neighbouring values in `values` are "close" (block sizes, warps) or whether
    every other value is equally far (a categorical choice such as a grid order).
    """

    name: str
    values: tuple[Value, ...]
    ordered: bool = True
    default: Value | None = None
    kind: str = field(default="param", compare=False)

    def __post_init__(self) -> None:
        # numpy scalars (np.arange, a DataFrame column) are stored as the Python values they hold
        object.__setattr__(self, "values", tuple(native(v) for v in self.values))
        object.__setattr__(self, "default", native(self.default))
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"parameter name must be a non-empty string, got {self.name!r}")
        if len(self.values) == 0:
            raise ValueError(f"parameter {self.name!r} has an empty domain")
        for v in self.values:
            _check_value(self.name, v)
        # position of each value, keyed as _same compares (True apart from 1, 1 with 1.0): has() and
        # index() are a lookup, not a scan (a from_configs parameter can have 50,000 values)
        pos = {_hashable(v): i for i, v in reversed(list(enumerate(self.values)))}
        if len(pos) != len(self.values):
            seen: set[tuple[str, Any]] = set()
            dups: dict[tuple[str, Any], Any] = {}
            for v in self.values:
                h = _hashable(v)
                if h in seen:
                    dups.setdefault(h, v)
                seen.add(h)
            raise ValueError(
                f"parameter {self.name!r} has duplicate values: {brief_list(list(dups.values()))}"
            )
        object.__setattr__(self, "_pos", pos)
        if self.default is not None and not self.has(self.default):
            raise ValueError(
                f"parameter {self.name!r}: default {self.default!r} not in {brief_list(self.values)}"
            )

    # ---- domain -----------------------------------------------------------------------------------
    def has(self, value: Any) -> bool:
        """True when `value` is in the domain (with bool and int kept apart: True is not 1; a numpy scalar
        counts as the Python value it holds)."""
        return self._position(value) is not None

    def _position(self, value: Any) -> int | None:
        try:
            return self._pos.get(_hashable(native(value)))  # type: ignore[attr-defined]
        except TypeError:  # unhashable (a list): in no domain
            return None

    def index(self, value: Any) -> int:
        i = self._position(value)
        if i is None:
            raise ValueError(f"{self.name}={native(value)!r} is not one of {list(self.values)}")
        return i

    def canonical(self, value: Any) -> Value:
        """The domain's own object for `value` (so 64.0 becomes 64 when the domain holds ints)."""
        return self.values[self.index(value)]

    @property
    def is_numeric(self) -> bool:
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    @property
    def default_value(self) -> Value:
        if self.default is not None:
            return self.default
        return self.values[len(self.values) // 2] if self.ordered else self.values[0]

    # ---- moves --------------------------------------------------------------------------------------
    def neighbor_values(self, value: Any) -> list[Value]:
        """Values one step away: the adjacent ones for an ordered domain, all others otherwise."""
        i = self.index(value)
        if self.ordered:
            return [self.values[j] for j in (i - 1, i + 1) if 0 <= j < len(self.values)]
        return [v for j, v in enumerate(self.values) if j != i]

    # ---- features -----------------------------------------------------------------------------------
    def feature_names(self) -> list[str]:
        if self.is_numeric:
            if all(float(v) > 0 for v in self.values):  # type: ignore[arg-type]
                return [self.name, f"log2_{self.name}"]
            return [self.name]
        if all(isinstance(v, bool) for v in self.values):
            return [self.name]
        return category_names(self.name, self.values)

    def encode(self, value: Any) -> list[float]:
        """The features of `value`: a number (not a bool) for a numeric parameter, in its domain or not
        (raw, and log2 where the domain's are); True or False for a boolean one; a value of the domain for
        a categorical one (True is not 1). Anything else is a ValueError."""
        value = native(value)
        if self.is_numeric:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(
                    f"{self.name}={value!r} is not a number (the values are {brief_list(self.values)})"
                )
            x = float(value)
            if all(float(v) > 0 for v in self.values):  # type: ignore[arg-type]
                return [x, math.log2(x)]
            return [x]
        if all(isinstance(v, bool) for v in self.values):
            if not isinstance(value, bool):  # 1 or "yes" read as True before
                raise ValueError(f"{self.name}={value!r} is not a bool (the values are {list(self.values)})")
            return [1.0 if value else 0.0]
        i = self.index(value)
        return [1.0 if j == i else 0.0 for j in range(len(self.values))]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "values": list(self.values), "ordered": self.ordered}


# Why a config may not hold None, and what to use instead: said the same way wherever a config is given
# (a space's values, a prior's configs, a recorded cache file's entries).
NONE_VALUE = (
    'value None is not an int, float, str or bool; give a sentinel string instead ("none") and test for it '
    "where the config is used"
)


def _check_value(name: str, v: Any) -> None:
    """Raise ValueError unless `v` can be a domain value: an int, float, str or bool, a float finite (NaN
    equals nothing, so a config holding it was in no domain; inf broke the cost model's features) and a
    number within a float's range (features are floats: 2**1100 raised OverflowError inside optimize)."""
    if v is None:  # configs are stored, encoded and compared as these types: no None among them
        raise ValueError(f"parameter {name!r}: {NONE_VALUE}")
    if not isinstance(v, (int, float, str, bool)):
        raise ValueError(f"parameter {name!r}: value {brief(v)} is not an int, float, str or bool")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"parameter {name!r}: value {v!r} is not a finite number")
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            float(v)
        except OverflowError:
            raise ValueError(
                f"parameter {name!r}: value {brief(v, 40)} is beyond a float's range (about 1.8e308); "
                "the cost model's features are floats"
            ) from None


def native(v: Any) -> Any:
    """A numpy scalar as the Python value it holds (np.int64(32) -> 32, np.bool_ -> bool); else `v`."""
    return v.item() if isinstance(v, np.generic) else v


def brief(x: Any, width: int = 120) -> str:
    """`repr(x)` for a message, cut to about `width` characters (a config of 1,000 parameters)."""
    r = repr(x)
    if len(r) <= width:
        return r
    return r[: width - 5] + " ...}" if r.endswith("}") else r[: width - 4] + " ..."


def brief_list(items: Sequence[Any], *, first: int = 5, width: int = 60) -> str:
    """The first `first` of `items` (each `brief`) and, when there are more, how many in all: a message's
    list of duplicates stays short however many there are ("[1, 2, 3, 4, 5, ...] (12 in all)")."""
    shown = ", ".join(brief(x, width) for x in list(items[:first]))
    return f"[{shown}]" if len(items) <= first else f"[{shown}, ...] ({len(items)} in all)"


def category_names(name: str, values: Sequence[Any]) -> list[str]:
    """The one-hot feature names of a categorical parameter: `name=value`, a string value written as its
    repr (`name='True'`) where its text is another value's (True and "True", 1 and "1"), so that no two
    columns share a name; the names of other parameters are as they always were."""
    plain = [f"{name}={v}" for v in values]
    if len(set(plain)) == len(plain):
        return plain
    taken = {n for n, v in zip(plain, values, strict=True) if not isinstance(v, str)}
    return [
        f"{name}={v!r}" if isinstance(v, str) and n in taken else n
        for n, v in zip(plain, values, strict=True)
    ]


def _hashable(v: Any) -> tuple[str, Any]:
    return (type(v).__name__ if isinstance(v, bool) else "num" if isinstance(v, (int, float)) else "str", v)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def PowerOfTwo(name: str, low: int, high: int, *, default: int | None = None) -> Param:
    """Powers of two from `low` to `high` inclusive (both must be powers of two)."""
    low, high = native(low), native(high)
    for v, what in ((low, "low"), (high, "high")):
        if not isinstance(v, int) or v < 1 or v & (v - 1):
            raise ValueError(f"PowerOfTwo {name!r}: {what}={v!r} is not a positive power of two")
    if low > high:
        raise ValueError(f"PowerOfTwo {name!r}: {low=} > {high=}")
    vals: list[int] = []
    v = low
    while v <= high:
        vals.append(v)
        v *= 2
    return Param(name, tuple(vals), True, default, kind="pow2")


def IntRange(name: str, low: int, high: int, step: int = 1, *, default: int | None = None) -> Param:
    """Integers low, low+step, ..., up to high inclusive."""
    low, high, step = native(low), native(high), native(step)
    for v, what in ((low, "low"), (high, "high"), (step, "step")):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"IntRange {name!r}: {what}={v!r} is not an int")
    if step < 1:
        raise ValueError(f"IntRange {name!r}: {step=} must be >= 1")
    if low > high:
        raise ValueError(f"IntRange {name!r}: {low=} > {high=}")
    count = (high - low) // step + 1
    if count > DOMAIN_LIMIT:  # each value is stored (about 250 bytes): 0 .. 2**32 filled the memory
        raise ValueError(
            f"IntRange {name!r}: {low}..{high} step {step} has {count} values, more than a domain holds "
            f"({DOMAIN_LIMIT:,}: each value is stored); use a larger step, or PowerOfTwo"
        )
    return Param(name, tuple(range(low, high + 1, step)), True, default, kind="int")


def Categorical(
    name: str, values: Sequence[Value], *, ordered: bool = False, default: Value | None = None
) -> Param:
    """A choice among `values`; unordered unless `ordered=True` (e.g. a list of numbers)."""
    return Param(name, tuple(values), ordered, default, kind="categorical")


def Boolean(name: str, *, default: bool | None = None) -> Param:
    return Param(name, (False, True), True, default, kind="bool")


def param_from_values(name: str, values: Sequence[Value]) -> Param:
    """Infer a parameter from observed values: numbers are ordered (sorted), strings categorical."""
    first: dict[tuple[str, Any], Value] = {}
    for v in values:
        first.setdefault(_hashable(v), v)  # the first of the values _same counts as one
    uniq = list(first.values())
    if all(isinstance(v, bool) for v in uniq):
        return Param(name, tuple(sorted(uniq)), True, kind="bool")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in uniq):
        return Param(name, tuple(sorted(uniq)), True, kind="int")  # type: ignore[type-var]
    if any(isinstance(v, (int, float, bool)) for v in uniq) and any(isinstance(v, str) for v in uniq):
        return Param(name, tuple(uniq), False, kind="categorical")
    return Param(name, tuple(sorted(uniq, key=str)), False, kind="categorical")
