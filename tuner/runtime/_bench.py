"""Benchmark functions: `bench(call) -> seconds` or `(median_s, spread_s)`, where `call()` runs the kernel
once with one config. Injectable (like Triton's `do_bench`) so tests run without a GPU.

- `cpu_bench`: warm-up, then a few repeats timed with time.perf_counter (calls batched so each sample
  lasts at least ~1 ms; fewer repeats, at least one, for a call so slow that 7 would take over 0.5 s),
  median and p80 - p20 spread. Honest for plain callables and the interpreters.
- `triton_bench`: triton.testing.do_bench (CUDA events, L2 flush), milliseconds converted to seconds.
- `jax_bench`: one untimed call first (jax traces and compiles the launcher there), then `cpu_bench` over
  `jax.block_until_ready(call())` (every leaf of the output waited for, not just dispatched), so neither
  the warm-up that sizes the batches nor the timed repeats include compiling.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner._units import ms_to_s

__all__ = [
    "cpu_bench",
    "triton_bench",
    "jax_bench",
    "jax_waited",
    "torch_cuda_bench",
    "default_bench",
    "is_jax_call",
    "normalise_bench_result",
    "TritonTiming",
]

BenchFn = Callable[[Callable[[], Any]], Any]


class TritonTiming(tuple):
    """The result of a timer of Triton's kind (a `do_bench`, milliseconds) in seconds, as any timer's
    ((median, p20, p80), or (median, spread)), with what that timer returned (`raw`): what
    `triton.autotune` compares configs by, `min` over those results, so that a tie on the median goes to
    the lower p20, then the lower p80 (lists compare item by item). A tuning picks its winner so when every
    config was timed so (`_tuning`); other timers' ties go to the config timed first."""

    raw: Any

    def __new__(cls, values: Sequence[float], raw: Any) -> TritonTiming:
        self = super().__new__(cls, values)
        self.raw = raw
        return self

    def __getnewargs__(self) -> tuple[tuple[float, ...], Any]:
        # copies and pickles: tuple's gives the values only, and `__new__` needs `raw` too
        return (tuple(self), self.raw)


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def cpu_bench(
    call: Callable[[], Any],
    *,
    warmup: int = 1,
    repeats: int = 7,
    min_sample_s: float = 1e-3,
    max_batch: int = 10_000,
    budget_s: float = 0.5,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """(median seconds per call, p80 - p20 spread) of `call`.

    A call so slow that `repeats` of them would take longer than `budget_s` is repeated only as many
    times as fit in it, at least once (Triton's `do_bench` sizes its repeats by time the same way): a
    kernel under the Triton interpreter can take a second per launch, and 7 timed launches of each config
    made a tutorial matmul's first call take minutes."""
    t0 = clock()
    for _ in range(max(1, warmup)):
        call()
    per = (clock() - t0) / max(1, warmup)
    batch = 1 if per >= min_sample_s else min(max_batch, max(1, math.ceil(min_sample_s / max(per, 1e-9))))
    if per * repeats > budget_s:
        repeats = max(1, int(budget_s / max(per, 1e-9)))
    samples = []
    for _ in range(max(1, repeats)):
        t0 = clock()
        for _ in range(batch):
            call()
        samples.append((clock() - t0) / batch)
    return statistics.median(samples), _quantile(samples, 0.8) - _quantile(samples, 0.2)


def jax_bench(call: Callable[[], Any], **kw: Any) -> tuple[float, float]:
    """cpu_bench, blocking until every leaf of the jax result is ready; the launcher is compiled first,
    by a call outside cpu_bench's clock (compiling in the warm-up would size the batches on it)."""
    import jax

    def synced() -> Any:
        return jax.block_until_ready(call())

    synced()  # traces and compiles (jax caches the executable for the calls that follow)
    return cpu_bench(synced, **kw)


def jax_waited(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call`, returning once every leaf of its jax result is ready (`jax.block_until_ready`): what a
    timer of the caller's own (`do_bench=`) gets for a jax launcher, whose dispatch is asynchronous."""
    import jax

    def waited() -> Any:
        return jax.block_until_ready(call())

    return waited


def triton_bench(call: Callable[[], Any]) -> tuple[float, float]:
    """triton.testing.do_bench on a GPU: median and p80 - p20, in seconds."""
    from triton.testing import do_bench

    med, p20, p80 = do_bench(call, quantiles=[0.5, 0.2, 0.8])
    return ms_to_s(med), ms_to_s(p80 - p20)


def torch_cuda_bench(call: Callable[[], Any], **kw: Any) -> tuple[float, float]:
    """cpu_bench with torch.cuda.synchronize() after each call (CUDA tensors without Triton installed)."""
    import torch

    def synced() -> None:
        call()
        torch.cuda.synchronize()

    return cpu_bench(synced, **kw)


def is_jax_call(kind: str, framework: str | None) -> bool:
    """Whether a call is timed as jax's (blocking on its result): a jitted function, jax arrays among its
    arguments, or no arrays of another framework while jax is imported."""
    return kind == "jax" or framework == "jax" or (framework is None and "jax" in sys.modules)


def default_bench(kind: str, framework: str | None, device: str) -> BenchFn:
    """The default timer for a call, from the kind of callable, the framework of its array arguments
    ("torch", "jax" or None) and its device ("cpu" or an accelerator):
    jax (a jitted function, jax arrays, or no arrays of another framework while jax is imported) ->
    block_until_ready timing of the result, on any device;
    CUDA torch tensors (a Triton kernel or a launcher of one) -> triton.testing.do_bench (CUDA events),
    or a synchronising CPU timer when Triton is not installed;
    everything on the CPU (plain callables, the Triton interpreter) -> the CPU timer (do_bench does
    not work under the interpreter)."""
    if is_jax_call(kind, framework):
        return jax_bench  # (a launcher may turn numpy inputs into jax arrays: block on its result)
    if device != "cpu" and framework == "torch":
        import importlib.util

        return triton_bench if importlib.util.find_spec("triton") is not None else torch_cuda_bench
    return cpu_bench


def normalise_bench_result(res: Any) -> tuple[float, float]:
    """A bench function may return seconds, or (median, spread), or (median, p20, p80)."""
    if isinstance(res, (tuple, list)):
        if len(res) == 2:
            return float(res[0]), float(res[1])
        if len(res) == 3:
            return float(res[0]), float(res[2]) - float(res[1])
        raise ValueError(f"a bench function returned {len(res)} values; expected 1, 2 or 3")
    return float(res), 0.0
