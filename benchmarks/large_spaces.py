"""Large search spaces through the public API: per-operation cost on a Helion-like space (16 parameters,
2e10 configs before constraints, shared-memory / register / thread limits), and `optimize` just below and
just above the enumeration limit (2,000,000 configs before constraints) on a synthetic objective with a
known optimum, several seeds per strategy: the best found over the optimum (mean and a 95% t interval)
and the strategy's own time per evaluation (the objective is free). Last, a search of the Helion-like
space itself with a synthetic GEMM time (waves of tiles, compute against memory per tile, stages hiding
latency, and factors for the loop order, indexing, pid type and grouping, with a 5% deterministic
per-config jitter): the best found over the best any run found.

Run: PYTHONPATH=. python benchmarks/large_spaces.py [--seeds 5] [--budget 50] [--strategies random,auto,tpe]
[--parts ops,threshold,helion] [--helion-budget 100]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int  # noqa: E402  (benchmarks/ is not a package)

SMEM = 227 * 1024


def helion_space():  # noqa: ANN201
    from tuner import Boolean, Categorical, Constraint, IntRange, PowerOfTwo, SearchSpace

    params = [
        PowerOfTwo("BM", 16, 256),
        PowerOfTwo("BN", 16, 256),
        PowerOfTwo("BK", 16, 256),
        PowerOfTwo("num_warps", 1, 32),
        IntRange("num_stages", 1, 8),
        Categorical("loop_order", ["mnk", "mkn", "nmk", "nkm", "kmn", "knm"]),
        PowerOfTwo("l2_grouping", 1, 64),
        Categorical("indexing", ["pointer", "block_ptr", "tensor_descriptor"]),
        Categorical("pid_type", ["flat", "xyz", "persistent_blocked", "persistent_interleaved"]),
        IntRange("range_unroll", 0, 4),
        IntRange("range_stages", 0, 4),
        Boolean("multi_buffer"),
        Boolean("flatten"),
        Boolean("static_ranges"),
        Categorical("maxnreg", [0, 32, 64, 128, 256], ordered=True),
        PowerOfTwo("reduction_loop", 16, 1024),
    ]

    def acc(c):  # noqa: ANN001, ANN202
        return c["BM"] * c["BN"] // (32 * c["num_warps"]) + 40

    cons = [
        Constraint(
            "smem <= 227 KiB",
            lambda c: max(c["num_stages"] * (c["BM"] + c["BN"]) * c["BK"] * 2, c["BM"] * c["BN"] * 4) <= SMEM,
            ("BM", "BN", "BK", "num_stages"),
        ),
        Constraint("regs <= 255", lambda c: acc(c) <= 255, ("BM", "BN", "num_warps")),
        Constraint("range_stages <= num_stages", lambda c: c["range_stages"] <= c["num_stages"]),
        Constraint("maxnreg fits", lambda c: c["maxnreg"] == 0 or c["maxnreg"] >= acc(c)),
    ]
    return SearchSpace(params, cons, name="helion_like")


def timed(label: str, fn, reps: int = 1):  # noqa: ANN001, ANN201
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        for _ in range(reps):
            out = fn()
        err = ""
    except Exception as exc:  # noqa: BLE001  (a refusal is a figure too)
        out, err = None, f"{type(exc).__name__}: {str(exc)[:70]}"
    dt = (time.perf_counter() - t0) / reps
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"| {label} | {dt * 1e3:.2f} | {peak / 2**20:.2f} | {err} |", flush=True)
    return out


def ops() -> None:
    space = timed("construct (first: imports tuner)", helion_space)
    print(f"\n{space.cartesian_size:,} configs before constraints, enumerable: {space.is_enumerable}\n")
    print("| operation | ms (tracemalloc on) | peak MiB | refusal |\n|---|---|---|---|")
    space = helion_space()
    timed("len(space)", lambda: len(space))
    timed("enumerate()", space.enumerate)
    cfg = timed("sample(seed)", lambda: space.sample(1))
    timed("sample(seed, n=500)", lambda: space.sample(0, n=500))
    timed("sample() (no seed)", space.sample)
    timed("default()", space.default)
    timed("contains", lambda: space.contains(cfg), reps=100)
    timed("violations", lambda: space.violations(cfg), reps=100)
    timed("neighbors adjacent", lambda: space.neighbors(cfg))
    timed("neighbors hamming", lambda: space.neighbors(cfg, "hamming"))
    timed("fingerprint", space.fingerprint)
    timed("encode", lambda: space.encode(cfg), reps=100)
    timed("to_optuna (first: imports optuna)", space.to_optuna)


def threshold_space(b_high: int):  # noqa: ANN201
    from tuner import IntRange, SearchSpace

    return SearchSpace([IntRange("a", 0, 999), IntRange("b", 0, b_high)], name=f"a1000_b{b_high + 1}")


def objective(c: dict) -> float:  # optimum 1.0 at a=737, b=1234
    return 1.0 + ((c["a"] - 737) / 1000) ** 2 + ((c["b"] - 1234) / 2000) ** 2


def ci(xs: list[float]) -> str:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.5f}"
    from scipy import stats

    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return f"{m:.5f} [{m - h:.5f}, {m + h:.5f}]"


def threshold(seeds: int, budget: int, strategies: list[str]) -> None:
    import tuner

    print("\n| space | configs | enumerable | strategy | best / optimum, mean [95% CI] | ms per evaluation |")
    print("|---|---|---|---|---|---|")
    for hi in (1999, 2000):
        space = threshold_space(hi)
        for strat in strategies:
            best, per = [], []
            for seed in range(seeds):
                t0 = time.perf_counter()
                res = tuner.optimize(space, objective, budget=budget, strategy=strat, seed=seed)
                per.append((time.perf_counter() - t0) / res.evaluations)
                best.append(res.best_value)
            print(
                f"| {space.name} | {space.cartesian_size:,} | {space.is_enumerable} | {strat} | {ci(best)} | "
                f"{statistics.median(per) * 1e3:.1f} |",
                flush=True,
            )
    print(f"\nmax RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


_LOOP = {"mnk": 1.0, "mkn": 1.3, "nmk": 1.02, "nkm": 1.35, "kmn": 1.6, "knm": 1.6}
_INDEXING = {"pointer": 1.1, "block_ptr": 1.05, "tensor_descriptor": 1.0}
_PID = {"flat": 1.08, "xyz": 1.1, "persistent_blocked": 1.0, "persistent_interleaved": 1.03}


def gemm_time(c: dict) -> float:
    """A synthetic time of a 4096^3 GEMM on a 132-SM GPU for a config of `helion_space` (arbitrary units):
    not a model of any real GPU, a landscape with interactions, plateaus and categorical factors."""
    import zlib

    m = n = k = 4096
    waves = math.ceil(math.ceil(m / c["BM"]) * math.ceil(n / c["BN"]) / 132)
    per_warp = c["BM"] * c["BN"] / (32 * c["num_warps"])
    compute = c["BM"] * c["BN"] * k / (min(c["num_warps"], 8) * 2e3) * (1 + 0.3 * (per_warp > 128))
    memory = (c["BM"] + c["BN"]) * k / (1.0 + 0.5 * min(c["num_stages"], 4)) / (c["BK"] / 64) ** 0.3
    t = waves * max(compute, memory) * _LOOP[c["loop_order"]] * _INDEXING[c["indexing"]] * _PID[c["pid_type"]]
    t *= 1 + 0.02 * abs(c["l2_grouping"] - 8) ** 0.5 + 0.01 * c["range_unroll"]
    t *= 0.97 if c["multi_buffer"] and c["num_stages"] >= 3 else 1.0
    jitter = zlib.crc32(repr(sorted(c.items())).encode()) / 2**32
    return t * (1 + 0.05 * jitter)


def helion_search(seeds: int, budget: int, strategies: list[str]) -> None:
    import tuner

    space = helion_space()
    found: dict[str, list[float]] = {}
    per: dict[str, list[float]] = {}
    for strat in strategies:
        for seed in range(seeds):
            t0 = time.perf_counter()
            res = tuner.optimize(space, gemm_time, budget=budget, strategy=strat, seed=seed)
            per.setdefault(strat, []).append((time.perf_counter() - t0) / res.evaluations)
            found.setdefault(strat, []).append(res.best_value)
    ref = min(min(v) for v in found.values())
    print(
        f"\nHelion-like space, synthetic GEMM time, budget {budget}, seeds 0-{seeds - 1}: best found over the "
        f"best of all runs ({ref:.6g})\n"
    )
    print("| strategy | best / best of all runs, mean [95% CI] | median | ms per evaluation |")
    print("|---|---|---|---|")
    for strat in strategies:
        r = [v / ref for v in found[strat]]
        print(
            f"| {strat} | {ci(r)} | {statistics.median(r):.4f} | {statistics.median(per[strat]) * 1e3:.1f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=positive_int, default=5)
    ap.add_argument("--budget", type=positive_int, default=50)
    ap.add_argument("--strategies", default="random,auto,tpe")
    ap.add_argument("--parts", default="ops,threshold,helion", help="which parts to run, comma-separated")
    ap.add_argument("--helion-budget", type=positive_int, default=100)
    args = ap.parse_args()
    parts = {p for p in args.parts.split(",") if p}
    if parts - {"ops", "threshold", "helion"}:
        ap.error(
            f"--parts: unknown {sorted(parts - {'ops', 'threshold', 'helion'})}; choose ops, threshold, helion"
        )
    os.environ.setdefault("TUNER_HOME", tempfile.mkdtemp(prefix="tuner-large-"))
    strategies = [s for s in args.strategies.split(",") if s]
    if "ops" in parts:
        ops()
    if "threshold" in parts:
        threshold(args.seeds, args.budget, strategies)
    if "helion" in parts:
        helion_search(args.seeds, args.helion_budget, strategies)


if __name__ == "__main__":
    main()
