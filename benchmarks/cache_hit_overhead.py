"""Cache-hit overhead of @tuner.autotune, beside its baselines, in one run.

Prints the per-call time (median of many timeit repeats) of:
  1. a no-op function called directly (the undecorated call, with the config passed as a keyword);
  2. a bare dictionary-lookup wrapper (key tuple from one argument, dict lookup, call with **config);
  3. the same no-op under @tuner.autotune, cache pre-populated (the hit path);
and, where it can be measured on CPU, triton.autotune's Autotuner on a pre-populated cache:
  4. Autotuner dispatch around a JIT-function stand-in whose `.run` is a no-op (Autotuner.run's own
     per-call work: key building, cache lookup, config kwargs merging), vs that stand-in launched
     directly, and tuner.autotune(configs=[triton.Config...]) around the same stand-in;
  5. a real trivial @triton.jit kernel under the interpreter, direct vs Autotuner vs tuner.autotune
     (the interpreter's own run time, ~ms, buries the overhead; printed for completeness).

Run: TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/cache_hit_overhead.py [--repeats R] [--number N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TUNER_HOME", tempfile.mkdtemp(prefix="tuner-bench-"))


def per_call_ns(fn, number: int, repeats: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=51)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--skip-triton", action="store_true")
    a = ap.parse_args()

    import tuner
    from tuner import PowerOfTwo, SearchSpace

    space = SearchSpace([PowerOfTwo("block", 16, 256)])

    def noop(x, n, *, block):
        return None

    cfg_by_key = {(1024,): {"block": 64}}

    def bare(*args, **kwargs):  # the baseline wrapper: key from one argument, one dict lookup
        return noop(*args, **kwargs, **cfg_by_key[(args[1],)])

    deco = tuner.autotune(space, key=["n"], budget=3, storage=False, bench=lambda call: 1.0)(noop)
    deco_nodt = tuner.autotune(
        space, key=["n"], budget=3, storage=False, bench=lambda call: 1.0, dtypes=False
    )(noop)
    deco_nodt(None, 1024)
    deco(None, 1024)  # first call tunes (3 evaluations); every timed call below is a hit
    assert deco.tuner.stats["tuned"] == 1

    x = None
    n = a.number
    r = a.repeats
    # interleave the three measurements over repeats so drift hits them alike
    rows = {
        "undecorated": [],
        "bare dict wrapper": [],
        "tuner.autotune (hit)": [],
        "tuner.autotune dtypes=False (hit)": [],
    }
    for _ in range(r):
        rows["undecorated"].append(per_call_ns(lambda: noop(x, 1024, block=64), n, 1))
        rows["bare dict wrapper"].append(per_call_ns(lambda: bare(x, 1024), n, 1))
        rows["tuner.autotune (hit)"].append(per_call_ns(lambda: deco(x, 1024), n, 1))
        rows["tuner.autotune dtypes=False (hit)"].append(per_call_ns(lambda: deco_nodt(x, 1024), n, 1))
    med = {k: statistics.median(v) for k, v in rows.items()}
    assert deco.tuner.stats["tuned"] == 1, "the hit path re-tuned"
    print(f"python {sys.version.split()[0]}, {r} repeats x {n} calls, median per call:")
    for k, v in med.items():
        print(f"  {k:34s} {v:8.1f} ns")
    bare_over = med["bare dict wrapper"] - med["undecorated"]
    print(f"  bare dict wrapper overhead:         {bare_over:8.1f} ns over undecorated")
    for k in ("tuner.autotune (hit)", "tuner.autotune dtypes=False (hit)"):
        over = med[k] - med["undecorated"]
        print(
            f"  {k} overhead: {over:.1f} ns over undecorated (target <= 1000 ns); "
            f"{over / bare_over:.2f}x the bare wrapper's overhead, "
            f"{med[k] / med['bare dict wrapper']:.2f}x its per-call time"
        )

    if a.skip_triton:
        return 0
    try:
        import torch
        import triton
        import triton.language as tl
        from triton.runtime.autotuner import Autotuner
    except ImportError as exc:
        print(f"triton.autotune: not measured ({exc})")
        return 0

    # 4. Autotuner dispatch around a no-op JIT stand-in: the per-call work of Autotuner.run itself.
    def _kernel_py(x_ptr, n, BLOCK: tl.constexpr):
        pass

    class NoopJit:
        """Stands in for a JITFunction: Autotuner only needs .fn (to find the Python function), .arg_names
        and .run; .run does nothing, so what is timed is the dispatch around the launch."""

        __module__ = "triton.bench_stub"  # so tuner treats it as a Triton kernel (it has .run/.arg_names)

        def __init__(self, fn):
            self.fn = fn
            self.arg_names = ["x_ptr", "n", "BLOCK"]
            self.src = "noop"

        def run(self, *args, grid, warmup, **kwargs):
            return None

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    stub = NoopJit(_kernel_py)
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64, 128)]
    at = Autotuner(stub, stub.arg_names, configs, ["n"], None, None)
    at.cache[(1024,)] = configs[2]  # pre-populated: every call is a cache hit
    grid = (1,)
    ours = tuner.autotune(configs=configs, key=["n"], budget=4, storage=False, bench=lambda call: 1.0)(stub)
    ours[grid](None, 1024)
    launch_direct = stub[grid]
    launch_at = at[grid]
    launch_ours = ours[grid]
    rows = {"stub[grid](...) direct": [], "triton Autotuner (hit)": [], "tuner.autotune (hit)": []}
    for _ in range(r):
        rows["stub[grid](...) direct"].append(
            per_call_ns(lambda: launch_direct(None, 1024, BLOCK=64, num_warps=4, num_stages=3), n, 1)
        )
        rows["triton Autotuner (hit)"].append(per_call_ns(lambda: launch_at(None, 1024), n, 1))
        rows["tuner.autotune (hit)"].append(per_call_ns(lambda: launch_ours(None, 1024), n, 1))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"Triton launch path (triton {triton.__version__}; no-op JIT stand-in, grid indexed once):")
    for k, v in med.items():
        print(f"  {k:34s} {v:8.1f} ns")
    base = med["stub[grid](...) direct"]
    print(
        f"  overhead: triton Autotuner {med['triton Autotuner (hit)'] - base:.1f} ns, "
        f"tuner.autotune {med['tuner.autotune (hit)'] - base:.1f} ns"
    )

    # 5. A real trivial kernel under the interpreter.
    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    t = torch.zeros(64)
    real_at = Autotuner(add_one, add_one.arg_names, configs, ["n"], None, None)
    real_at.cache[(64, "torch.float32")] = configs[2]
    real_ours = tuner.autotune(configs=configs, key=["n"], budget=4, storage=False, bench=lambda call: 1.0)(
        add_one
    )
    real_ours[grid](t, 64)
    rn, rr = 200, 15
    rows = {"interpreted kernel direct": [], "triton Autotuner (hit)": [], "tuner.autotune (hit)": []}
    for _ in range(rr):
        rows["interpreted kernel direct"].append(per_call_ns(lambda: add_one[grid](t, 64, BLOCK=64), rn, 1))
        rows["triton Autotuner (hit)"].append(per_call_ns(lambda: real_at[grid](t, 64), rn, 1))
        rows["tuner.autotune (hit)"].append(per_call_ns(lambda: real_ours[grid](t, 64), rn, 1))
    print(
        f"Real trivial kernel under TRITON_INTERPRET=1 ({rr} repeats x {rn} calls; the interpreter dominates):"
    )
    for k, v in rows.items():
        print(f"  {k:34s} {statistics.median(v) / 1e3:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
