"""CUDA-event timing for Triton (and any torch-launched) kernels. Imported only on a CUDA device.

Like `triton.testing.do_bench`: device events around each run, L2 flushed by zeroing a buffer larger
than L2 before each run (outside the events), repeats chosen by a time budget. For short kernels it can
replay a CUDA graph of one launch, which removes the Python launch overhead from the figure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ._timing import TimingOptions, reps_for

log = logging.getLogger(__name__)

__all__ = ["CudaTimer", "estimate_ms"]


def estimate_ms(times_ms: list[float]) -> float:
    """One run's time from a few cold runs, each timed on its own (the flush outside the events)."""
    return sum(times_ms) / len(times_ms) if times_ms else 0.0


class CudaTimer:
    def __init__(self, opts: TimingOptions) -> None:
        import torch

        self.torch = torch
        self.opts = opts
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        # Zeroing 2x L2 (at least 256 MiB, as do_bench does) evicts everything the last run left.
        self.flush_bytes = max(256 * 2**20, 2 * l2)
        self._flush_buf = (
            torch.empty(self.flush_bytes // 4, dtype=torch.int32, device="cuda") if opts.flush_l2 else None
        )
        self._graphs: dict[Any, tuple[Any, Any]] = {}

    def _flush(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.zero_()

    def _events(self, n: int) -> tuple[list[Any], list[Any]]:
        ev = self.torch.cuda.Event
        return [ev(enable_timing=True) for _ in range(n)], [ev(enable_timing=True) for _ in range(n)]

    def _capture(self, call: Callable[[], Any], before: Callable[[], None]) -> tuple[Any, Any] | None:
        torch = self.torch
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                before()
                call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = call()
            torch.cuda.synchronize()
            return graph, out
        except Exception as exc:  # not capturable (host sync inside the launcher, ...): time eagerly
            log.info("CUDA graph capture failed (%s); timing eager launches", exc)
            torch.cuda.synchronize()
            return None

    def time(
        self,
        call: Callable[[], Any],
        before: Callable[[], None],
        *,
        n: int | None = None,
        warmup: int | None = None,
        graph_key: Any = None,
    ) -> tuple[list[float], Any, str]:
        """Times (ms) of `n` runs (None: from the budget), the last output, and the timer used."""
        torch = self.torch
        opts = self.opts
        out = None
        for _ in range(opts.warmup if warmup is None else warmup):
            before()
            out = call()
        torch.cuda.synchronize()
        if n is None:
            # Estimate from 3 runs (cold caches, as do_bench), each between its own events so that the
            # L2 flush before it is not counted: the graph decision and the repeat count are about the
            # kernel alone (a 256 MiB flush takes longer than the short kernels a graph is for).
            s, e = self._events(3)
            for i in range(3):
                before()
                self._flush()
                s[i].record()
                out = call()
                e[i].record()
            torch.cuda.synchronize()
            est = estimate_ms([a.elapsed_time(b) for a, b in zip(s, e, strict=True)])
            n = reps_for(est, opts)
        else:
            est = None
        use_graph = opts.cuda_graph is True or (
            opts.cuda_graph == "auto" and est is not None and est < opts.graph_below_ms
        )
        if graph_key is not None and graph_key in self._graphs:
            use_graph = True
        runner: Callable[[], Any] = call
        timer = "cuda-events"
        if use_graph:
            g = self._graphs.get(graph_key) if graph_key is not None else None
            if g is None:
                g = self._capture(call, before)
                if g is not None and graph_key is not None:
                    self._graphs[graph_key] = g
            if g is not None:
                graph, gout = g
                out = gout

                def runner() -> Any:
                    graph.replay()
                    return gout

                timer = "cuda-graph"
        starts, ends = self._events(n)
        for i in range(n):
            before()
            self._flush()
            starts[i].record()
            out = runner()
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], out, timer
