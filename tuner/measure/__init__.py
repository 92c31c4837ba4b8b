"""Measurement you can trust: isolated, verified, noise-aware.

`Measurer.measure(config) -> MeasureResult` with a status (ok, compile_error, out_of_resources,
incorrect, timeout, crashed), timing statistics in milliseconds and the error text. Candidates run in
worker processes by default, so a hang, a segfault or an out-of-memory becomes a failed result; each
config's output is checked against the reference (mutated inputs restored, outputs poisoned) before
its time counts; the finalists are re-measured interleaved and ties within the noise band are broken
deterministically (`choose_winner`).
"""

from __future__ import annotations

from tuner.search_spaces.devices import detect_device

from ._gate import classify_exception, compare
from ._ktcache import kernel_tuner_cache, write_kernel_tuner_cache
from ._measurer import (
    ISOLATIONS,
    CallableMeasurer,
    KernelMeasurer,
    Measurer,
    ReplayMeasurer,
    TargetMeasurer,
)
from ._result import (
    BACKEND_LABELS,
    COMPILE_ERROR,
    CRASHED,
    INCORRECT,
    OK,
    OUT_OF_RESOURCES,
    STATUSES,
    TIMEOUT,
    MeasureResult,
    summarize,
)
from ._select import Selection, choose_winner, config_order_key
from ._target import CallableTarget, KernelTarget, Session, Target
from ._timing import CPU_TIMING, TimingOptions
from ._worker import WorkerSettings, WorkerSetupError

__all__ = [
    "BACKEND_LABELS",
    "COMPILE_ERROR",
    "CPU_TIMING",
    "CRASHED",
    "CallableMeasurer",
    "CallableTarget",
    "INCORRECT",
    "ISOLATIONS",
    "KernelMeasurer",
    "KernelTarget",
    "MeasureResult",
    "Measurer",
    "OK",
    "OUT_OF_RESOURCES",
    "ReplayMeasurer",
    "STATUSES",
    "Selection",
    "Session",
    "TIMEOUT",
    "Target",
    "TargetMeasurer",
    "TimingOptions",
    "WorkerSettings",
    "WorkerSetupError",
    "choose_winner",
    "classify_exception",
    "compare",
    "config_order_key",
    "detect_device",
    "kernel_tuner_cache",
    "write_kernel_tuner_cache",
    "summarize",
]
