"""The measurer's own overhead per candidate on CPU, beside the bare kernel call, in one run.

    PYTHONPATH=. python benchmarks/measure_overhead.py [--candidates 40]    (OVERHEAD_N=4096: the kernel's n)

For each candidate config, the measurer makes `1 + warmup + n` kernel calls (the checked first call,
the untimed warm-up, the timed repeats). Its overhead is the wall time of `measure(config)` as the
tuner sees it, minus that many bare kernel calls (the bare call's median, timed here in a tight loop).
The CPU column is the CPU time (this process and the worker) per candidate, less the same kernel calls:
on a machine shared with other jobs it shows the work the measurer does when preemption inflates the wall
clock. The overhead covers restoring mutated inputs and poisoning the output before every call, the two
correctness checks against the reference, the statistics and, with process isolation, the round trip
to the worker process. Target: at most 5 ms per candidate (median).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU: kernels (if any are defined) run interpreted
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tables import positive_int  # noqa: E402  (benchmarks/ is not a package)
from tuner.kernels import KernelSpec  # noqa: E402
from tuner.search_spaces import IntRange, SearchSpace  # noqa: E402

from tuner.measure import KernelMeasurer  # noqa: E402

N = int(os.environ.get("OVERHEAD_N", "4096"))


def _space(problem, device, backend):
    return SearchSpace([IntRange("unroll", 1, 1000)])


def _inputs(problem, backend, seed):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal(problem["n"]).astype(np.float32),
        "acc": np.zeros(problem["n"], dtype=np.float32),
        "out": np.empty(problem["n"], dtype=np.float32),
    }


def _reference(problem, inputs):
    return inputs["x"].astype(np.float64) * 2.0 + 1.0


def kernel(problem, backend, inputs, config):
    """The 'kernel': out = x * 2 + 1 via an in-place update of acc (declared mutated)."""
    acc, out = inputs["acc"], inputs["out"]
    acc += inputs["x"]
    np.multiply(acc, 2.0, out=out)
    out += 1.0
    return out


def _count(p):
    return float(p["n"])


def _tol(dtype):
    return (1e-5, 1e-5)


SPEC = KernelSpec(
    name="overhead_toy",
    description="x*2+1",
    backends=("triton",),
    dtypes=("float32",),
    default_problem={"n": N, "dtype": "float32"},
    shape_fields=("n",),
    space=_space,
    make_inputs=_inputs,
    reference=_reference,
    run=kernel,
    flops=_count,
    bytes_moved=_count,
    tolerance=_tol,
    mutated_inputs=("acc",),
    output_buffer="out",
)


def bare_call_ms(problem: dict, reps: int = 2000) -> float:
    inputs = _inputs(problem, "triton", 0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        kernel(problem, "triton", inputs, {"unroll": 1})
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def _proc_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of another process, from /proc (0 where unavailable)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run(isolation: str, candidates: int, bare_ms: float) -> dict:
    m = KernelMeasurer(SPEC, None, "triton", device="cpu", isolation=isolation)
    m.measure({"unroll": 1000})  # start the worker / build inputs: once per task, not per candidate
    pid = m._worker.proc.pid if m._worker is not None else None
    over, walls, calls = [], [], []
    cpu0 = time.process_time() + _proc_cpu_s(pid)
    for i in range(1, candidates + 1):
        t0 = time.perf_counter()
        r = m.measure({"unroll": i})
        wall_ms = (time.perf_counter() - t0) * 1e3
        if not r.ok:
            raise SystemExit(f"candidate {i} failed: {r.status} {r.error}")
        ncalls = 1 + m.timing.warmup + r.n
        walls.append(wall_ms)
        calls.append(ncalls)
        over.append(wall_ms - ncalls * bare_ms)
    cpu_ms = (time.process_time() + _proc_cpu_s(pid) - cpu0) * 1e3 / candidates
    m.close()
    return {
        "isolation": isolation,
        "overhead_ms": statistics.median(over),
        "overhead_p90_ms": float(np.percentile(over, 90)),
        "wall_ms": statistics.median(walls),
        "calls": statistics.median(calls),
        "cpu_overhead_ms": cpu_ms - statistics.median(calls) * bare_ms,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=positive_int, default=40)
    args = ap.parse_args(argv)
    problem = dict(SPEC.default_problem)
    bare = bare_call_ms(problem)
    print(f"bare kernel call (n={problem['n']}): median {bare * 1e3:.1f} us")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other jobs inflate wall times)")
    print(
        f"{'isolation':<10} {'kernel calls':>12} {'wall/cand ms':>13} {'overhead/cand ms (median)':>26} {'p90':>7} "
        f"{'cpu overhead/cand ms (mean)':>28}"
    )
    rows = [run(iso, args.candidates, bare) for iso in ("process", "inprocess")]
    for r in rows:
        print(
            f"{r['isolation']:<10} {r['calls']:>12.0f} {r['wall_ms']:>13.3f} {r['overhead_ms']:>26.3f} "
            f"{r['overhead_p90_ms']:>7.3f} {r['cpu_overhead_ms']:>28.3f}"
        )
    worst = max(r["overhead_ms"] for r in rows)
    print(
        f"target: <= 5 ms per candidate (median): {'met' if worst <= 5.0 else 'NOT met'} "
        f"(worst median {worst:.3f} ms, bare call {bare * 1e3:.1f} us)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
