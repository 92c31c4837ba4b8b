"""What timing only the cost model's top candidates of an explicit `configs=` list saves, and what it
loses, replayed on real brute-forced GPU tables (Kernel Tuner cache files).

`tuner.autotune(configs=[...])` times every config by default, as `triton.autotune` does. `budget=k`
(smaller than the list) is the opt-in: the default strategy ("auto": the XGBoost cost model, warm-started
from what the store already holds for the kernel) picks which k configs to time. This script measures
that trade on replay:

- a user's explicit list: `--n` configs drawn at random from one table (one draw per seed);
- "all": every config of the list timed (n evaluations) -> the list's best, the reference;
- "auto k": `optimize(..., budget=k, strategy="auto")` over the list, with the prior the store would
  hold for this kernel: the same list measured on the other GPUs of the table's folder (`--prior loo`,
  the default) or nothing (`--prior none`, a first-ever tuning);
- "random k" beside it, in the same run: k configs of the list drawn uniformly (the baseline a cost
  model has to beat).

Printed per k and strategy, over all tables and seeds: the evaluations saved (1 - k/n), the share of
runs that found the list's best, and the ratio (best found / list's best): median, mean, 90th
percentile and worst. Failed configs (recorded failures) count as evaluations and are never chosen.

    PYTHONPATH=$PWD python benchmarks/explicit_configs_topk.py                # prior loo, n 30, k 5,10,15
    PYTHONPATH=$PWD python benchmarks/explicit_configs_topk.py --prior none
    PYTHONPATH=$PWD python benchmarks/explicit_configs_topk.py --data DIR --only gemm --seeds 3
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import existing_dir, positive_int, positive_ints, table_files  # noqa: E402  (benchmarks/ is not a package)

# The tables: the repository's compressed copies (benchmarks/data/README.md).
DEFAULT_DATA = REPO / "benchmarks" / "data"


def _tables(data: Path, only: str = "") -> list[Path]:
    """The tables under `data`, those whose path holds one of the comma-separated substrings `only` where
    given; ValueError where none is."""
    files = [Path(f) for f in table_files(data, script="explicit_configs_topk")]
    if not files:
        raise ValueError(
            f"no tables (<kernel>/<gpu>.json[.gz]) under {data}; pass --data DIR, a folder of Kernel Tuner "
            "cache files such as the gpu-tuning-spaces dataset"
        )
    subs = [s for s in only.split(",") if s]
    if subs:
        files = [f for f in files if any(s in str(f) for s in subs)]
        if not files:
            raise ValueError(f"--only {only}: no table under {data} matches")
    return files


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run(args: argparse.Namespace, files: list[Path]) -> int:
    from tuner import SearchSpace
    from tuner._optimize import optimize
    from tuner.replay import load_table

    ks: list[int] = args.k
    tables = {f: load_table(f) for f in files}
    rows: dict[tuple[str, int], list[tuple[float, bool]]] = {}
    t_start = time.perf_counter()
    for f, table in tables.items():
        keys = [k for k in table.values]
        others = [t for g, t in tables.items() if g != f and g.parent == f.parent]
        for seed in range(args.seeds):
            rng = random.Random(f"{f.parent.name}/{f.name}/{seed}")
            pick = rng.sample(keys, min(args.n, len(keys)))
            configs = [table.space.config([x for x, _ in k]) for k in pick]
            vals = [table.values[k] for k in pick]
            ok = [v for v in vals if v is not None]
            if len(ok) < 2:
                continue
            best = min(ok)
            space = SearchSpace.from_configs(configs)
            objective = table.objective_fn()
            prior: Any = None
            if args.prior == "loo" and others:
                prior = [[(c, o.lookup(c)) for c in configs] for o in others]
            for k in ks:
                if k >= len(configs):
                    continue
                for strat in ("auto", "random"):
                    res = optimize(
                        space,
                        objective,
                        budget=k,
                        seed=seed,
                        strategy=strat,
                        prior=prior if strat == "auto" else None,
                    )
                    found = res.best_value if math.isfinite(res.best_value) else max(ok)
                    rows.setdefault((strat, k), []).append((found / best, found == best))
        print(f"# {f.parent.name}/{f.name.split('.')[0]} done", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t_start
    print(
        f"# explicit configs: n={args.n} drawn per table and seed, {len(tables)} tables, seeds {args.seeds}, "
        f"prior {args.prior}; 'all' times n configs and finds the list's best (ratio 1.000) every time"
    )
    print(
        f"{'strategy':>8} {'k':>4} {'saved':>6} {'runs':>5} {'found best':>10} {'median':>7} {'mean':>7} {'p90':>7} {'worst':>7}"
    )
    print(
        f"{'all':>8} {args.n:>4} {0.0:>6.0%} {'':>5} {'100%':>10} {1.0:>7.3f} {1.0:>7.3f} {1.0:>7.3f} {1.0:>7.3f}"
    )
    for k in ks:
        for strat in ("auto", "random"):
            got = rows.get((strat, k))
            if not got:
                continue
            ratios = [r for r, _ in got]
            hit = sum(1 for _, h in got if h) / len(got)
            print(
                f"{strat:>8} {k:>4} {1 - k / args.n:>6.0%} {len(got):>5} {hit:>10.0%} "
                f"{statistics.median(ratios):>7.3f} {statistics.fmean(ratios):>7.3f} {_q(ratios, 0.9):>7.3f} "
                f"{max(ratios):>7.3f}"
            )
    print(f"# {elapsed:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        type=existing_dir,
        default=str(DEFAULT_DATA),
        help="folder of <kernel>/<gpu>.json[.gz] tables (default: benchmarks/data)",
    )
    ap.add_argument("--n", type=int, default=30, help="configs in the explicit list (default 30)")
    ap.add_argument(
        "--k",
        type=positive_ints,
        default="5,10,15",
        help="budgets to compare with timing all n (default 5,10,15)",
    )
    ap.add_argument("--seeds", type=positive_int, default=10, help="lists drawn per table (default 10)")
    ap.add_argument("--prior", choices=["loo", "none"], default="loo")
    ap.add_argument("--only", default="", help="comma-separated substrings of table paths to keep")
    args = ap.parse_args(argv)
    if args.n < 2:
        ap.error("--n must be at least 2")
    if max(args.k) >= args.n:
        ap.error(f"--k: each budget must be below --n {args.n} (timing all n configs is the baseline)")
    try:
        files = _tables(Path(args.data), args.only)
    except ValueError as exc:
        ap.error(str(exc))
    return run(args, files)


if __name__ == "__main__":
    sys.exit(main())
