"""Timing units: tuner keeps times in seconds; milliseconds and microseconds exist only at the edges.

The runtime's timers, the stores' `time_s` and every cache entry are in seconds. Two outside formats are in
milliseconds and are converted here, where they enter or leave: Triton's `do_bench` (and a user's
`do_bench`), and the measurement layer's `MeasureResult` (ms, as Kernel Tuner's cache files and
`do_bench` report; its `unit` says so). Display code may print any unit through `from_seconds`.
"""

from __future__ import annotations

__all__ = ["PER_SECOND", "to_seconds", "from_seconds", "ms_to_s", "s_to_ms"]

# How many of each unit make one second.
PER_SECOND: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _per_second(unit: str) -> float:
    try:
        return PER_SECOND[unit]
    except KeyError:
        raise ValueError(f"unknown time unit {unit!r}; use one of {sorted(PER_SECOND)}") from None


def to_seconds(value: float, unit: str) -> float:
    """`value` given in `unit` ("s", "ms" or "us"), in seconds."""
    return value / _per_second(unit)


def from_seconds(seconds: float, unit: str) -> float:
    """`seconds` in `unit` ("s", "ms" or "us")."""
    return seconds * _per_second(unit)


def ms_to_s(ms: float) -> float:
    """Milliseconds (Triton's do_bench, `MeasureResult`) in seconds."""
    return ms / 1e3


def s_to_ms(seconds: float) -> float:
    """Seconds in milliseconds (Triton's `configs_timings`, Kernel Tuner's format, `MeasureResult`)."""
    return seconds * 1e3
