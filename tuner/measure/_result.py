"""The result of measuring one config: a status, timing statistics and the error text.

A failure is a result, not an exception: `compile_error`, `out_of_resources`, `incorrect`, `timeout`
and `crashed` all come back as a `MeasureResult` whose timing fields are None. Times are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = [
    "OK",
    "COMPILE_ERROR",
    "OUT_OF_RESOURCES",
    "INCORRECT",
    "TIMEOUT",
    "CRASHED",
    "STATUSES",
    "BACKEND_LABELS",
    "MeasureResult",
    "summarize",
]

OK = "ok"
COMPILE_ERROR = "compile_error"
OUT_OF_RESOURCES = "out_of_resources"
INCORRECT = "incorrect"
TIMEOUT = "timeout"
CRASHED = "crashed"
STATUSES = (OK, COMPILE_ERROR, OUT_OF_RESOURCES, INCORRECT, TIMEOUT, CRASHED)

# Where the time was measured. "cpu-interpreter": a Triton/Pallas kernel under its CPU interpreter (a
# real wall-clock time, but of the interpreter, not of any accelerator); "cpu": a plain Python callable;
# "replay": a recorded table.
BACKEND_LABELS = ("cuda", "tpu", "gpu-jax", "cpu-interpreter", "replay", "cpu")

_MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class MeasureResult:
    """One measurement. For `status == "ok"` the timing fields are set (milliseconds); otherwise they
    are None and `error` says what went wrong."""

    status: str
    backend: str
    median: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    std: float | None = None
    q1: float | None = None
    q3: float | None = None
    n: int = 0
    unit: str = "ms"
    error: str | None = None
    max_abs_error: float | None = None
    compile_s: float | None = None
    wall_s: float | None = None
    times: tuple[float, ...] = field(default=(), repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status == OK and (self.median is None or not math.isfinite(self.median)):
            raise ValueError(f"an ok result needs a finite median, got {self.median!r}")
        if self.error is not None and len(self.error) > _MAX_ERROR_CHARS:
            object.__setattr__(self, "error", self.error[:_MAX_ERROR_CHARS] + " [...]")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def value(self) -> float | None:
        """The objective for tuning: the median time, or None for a failed result."""
        return self.median if self.ok else None

    @property
    def iqr(self) -> float | None:
        return None if self.q1 is None or self.q3 is None else self.q3 - self.q1

    @property
    def rel_spread(self) -> float | None:
        """IQR / median: the measured noise of this config."""
        if not self.ok or self.iqr is None or not self.median:
            return None
        return self.iqr / self.median

    def stats(self) -> dict[str, Any]:
        """The timing statistics as a JSON-ready dict (for the results store)."""
        out: dict[str, Any] = {"status": self.status, "backend": self.backend, "unit": self.unit, "n": self.n}
        for k in ("median", "mean", "min", "max", "std", "q1", "q3", "max_abs_error", "compile_s", "wall_s"):
            v = getattr(self, k)
            if v is not None:
                out[k] = float(v)
        if self.iqr is not None:
            out["iqr"] = float(self.iqr)
        for k, v in self.extra.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                out[k] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (raw times included)."""
        d = self.stats()
        d["error"] = self.error
        d["times"] = [float(t) for t in self.times]
        d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasureResult:
        """The result of `to_dict`'s output, or of `stats()`'s as the results store keeps it: there the
        `extra` values are flat beside the statistics (and the raw times are not kept), so every other
        key is taken back into `extra`."""
        keys = ("median", "mean", "min", "max", "std", "q1", "q3", "max_abs_error", "compile_s", "wall_s")
        if "extra" in d:
            extra = dict(d["extra"])
        else:
            known = {*keys, "status", "backend", "unit", "n", "error", "times", "iqr"}
            extra = {k: v for k, v in d.items() if k not in known}
        return cls(
            status=d["status"],
            backend=d["backend"],
            n=int(d.get("n", 0)),
            unit=d.get("unit", "ms"),
            error=d.get("error"),
            times=tuple(d.get("times", ())),
            extra=extra,
            **{k: d.get(k) for k in keys},
        )

    def with_(self, **changes: Any) -> MeasureResult:
        return replace(self, **changes)

    @classmethod
    def failed(cls, status: str, backend: str, error: str, **kw: Any) -> MeasureResult:
        if status == OK:
            raise ValueError("failed() needs a failure status")
        return cls(status=status, backend=backend, error=error, **kw)


def summarize(
    times_ms: Sequence[float], *, backend: str, keep_times: bool = True, **kw: Any
) -> MeasureResult:
    """An ok result from a list of times (milliseconds): median, mean, min, max, std, quartiles."""
    arr = np.asarray(times_ms, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no times to summarize")
    if not np.all(np.isfinite(arr)):
        raise ValueError("times must be finite")
    q1, med, q3 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    return MeasureResult(
        status=OK,
        backend=backend,
        median=med,
        mean=float(arr.mean()),
        min=float(arr.min()),
        max=float(arr.max()),
        std=float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        q1=q1,
        q3=q3,
        n=int(arr.size),
        times=tuple(float(t) for t in arr) if keep_times else (),
        **kw,
    )
