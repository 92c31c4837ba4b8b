"""Timing loops. The wall-clock loop (CPU, interpreters, JAX with `block_until_ready`) lives here;
the CUDA-event loop is in `_cuda.py` and imported only on a CUDA device.

Every loop calls `before()` (restore mutated inputs, poison outputs, flush caches) outside the timed
region before each run, chooses the number of repeats from a time budget, and returns the times in
milliseconds with the output of the last run (which the correctness gate checks again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TimingOptions", "reps_for", "time_wall"]


@dataclass(frozen=True)
class TimingOptions:
    """How to time one config.

    - `warmup`: untimed runs after the first (compiling, checked) run.
    - `budget_ms`: the repeats fill about this much kernel time, within [`min_reps`, `max_reps`].
    - `flush_l2` (CUDA): write a buffer larger than L2 before each run, so every run starts cold.
    - `cuda_graph` (CUDA): True, False, or "auto" (graph replay for kernels faster than
      `graph_below_ms`, where the launch overhead would otherwise dominate).
    - `interleave_rounds`, `interleave_reps`: the finalists' re-measurement (A B C A B C ...).
    """

    warmup: int = 1
    budget_ms: float = 100.0
    min_reps: int = 5
    max_reps: int = 500
    flush_l2: bool = True
    cuda_graph: bool | str = "auto"
    graph_below_ms: float = 0.05
    interleave_rounds: int = 5
    interleave_reps: int = 5

    def __post_init__(self) -> None:
        if self.min_reps < 1 or self.max_reps < self.min_reps:
            raise ValueError(f"need 1 <= min_reps <= max_reps, got {self.min_reps=}, {self.max_reps=}")
        if self.warmup < 0 or self.budget_ms < 0:
            raise ValueError(f"warmup and budget_ms must be >= 0, got {self.warmup=}, {self.budget_ms=}")
        if self.cuda_graph not in (True, False, "auto"):
            raise ValueError(f"cuda_graph must be True, False or 'auto', got {self.cuda_graph!r}")
        if self.interleave_rounds < 1 or self.interleave_reps < 1:
            raise ValueError("interleave_rounds and interleave_reps must be >= 1")


CPU_TIMING = TimingOptions(warmup=1, budget_ms=50.0, min_reps=3, max_reps=100)


def reps_for(estimate_ms: float, opts: TimingOptions) -> int:
    """Repeats that fill `opts.budget_ms` given one run's estimated time."""
    if estimate_ms <= 0:
        return opts.max_reps
    return max(opts.min_reps, min(opts.max_reps, int(opts.budget_ms / estimate_ms)))


def time_wall(
    call: Callable[[], Any],
    before: Callable[[], None],
    sync: Callable[[Any], Any],
    opts: TimingOptions,
    *,
    n: int | None = None,
    warmup: int | None = None,
) -> tuple[list[float], Any]:
    """Wall-clock timing with `time.perf_counter_ns`; `sync(out)` waits for asynchronous work."""
    out = None
    for _ in range(opts.warmup if warmup is None else warmup):
        before()
        out = call()
        sync(out)
    times: list[float] = []
    if n is None:
        before()
        t0 = time.perf_counter_ns()
        out = call()
        sync(out)
        est = (time.perf_counter_ns() - t0) / 1e6
        times.append(est)
        n = reps_for(est, opts) - 1
    clock = time.perf_counter_ns
    for _ in range(n):
        before()
        t0 = clock()
        out = call()
        sync(out)
        times.append((clock() - t0) / 1e6)
    return times, out


def jax_sync(out: Any) -> Any:
    import jax

    return jax.block_until_ready(out)


def no_sync(out: Any) -> Any:
    return out
