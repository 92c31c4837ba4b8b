"""The CUDA-event timer's graph decision on CPU, with a simulated device clock: a short kernel gets
graph replay although the L2 flush before each run is long (the flush is outside the estimate)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tuner.measure import TimingOptions
from tuner.measure._cuda import CudaTimer, estimate_ms


class _Clock:
    t = 0.0


class _Event:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _Clock.t

    def elapsed_time(self, other: _Event) -> float:
        return other.t - self.t


def _timer(opts: TimingOptions, flush_ms: float) -> CudaTimer:
    timer = object.__new__(CudaTimer)
    timer.torch = SimpleNamespace(cuda=SimpleNamespace(Event=_Event, synchronize=lambda: None))
    timer.opts = opts
    timer.flush_bytes = 256 * 2**20
    timer._flush_buf = None
    timer._graphs = {}

    def flush() -> None:
        _Clock.t += flush_ms

    timer._flush = flush  # type: ignore[method-assign]
    timer._capture = lambda call, before: (SimpleNamespace(replay=call), None)  # type: ignore[method-assign]
    return timer


def _kernel(ms: float) -> Any:
    def call() -> None:
        _Clock.t += ms

    return call


def test_a_short_kernel_gets_a_graph_despite_a_long_flush() -> None:
    opts = TimingOptions(cuda_graph="auto", graph_below_ms=0.05, budget_ms=1.0, max_reps=50)
    times, _, timer = _timer(opts, flush_ms=2.0).time(_kernel(0.01), lambda: None)
    assert timer == "cuda-graph"
    assert all(abs(t - 0.01) < 1e-9 for t in times) and len(times) == 50  # the flush is never timed


def test_a_long_kernel_is_timed_eagerly() -> None:
    opts = TimingOptions(cuda_graph="auto", graph_below_ms=0.05, budget_ms=10.0, min_reps=5)
    times, _, timer = _timer(opts, flush_ms=2.0).time(_kernel(0.5), lambda: None)
    assert timer == "cuda-events" and len(times) == 20


def test_estimate() -> None:
    assert estimate_ms([1.0, 2.0, 3.0]) == 2.0 and estimate_ms([]) == 0.0
