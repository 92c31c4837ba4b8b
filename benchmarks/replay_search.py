"""Search efficiency of tuner's strategies, measured by replaying real brute-forced GPU tables.

For every table (Kernel Tuner cache file) and strategy, `optimize` runs `--seeds` times with `--budget`
evaluations; the script prints per file and overall:

- median (over seeds) evaluations to reach 1.05x and 1.01x of the table's optimum (not reached =
  budget + 1), their geometric mean over files, and the share of runs that reached them;
- the score of Willemsen et al. (FGCS 2024): mean over k = 1..budget of
  (f(k) - f_random(k)) / (f_opt - f_random(k)), f(k) the median best-so-far over seeds and f_random(k)
  the closed-form expectation of the best-so-far of uniform random search without replacement (failed
  configs count as the worst valid value): 1 = the optimum at once, 0 = no better than random;
- the strategy's own time per evaluation (median over runs; everything but the objective);
- side by side, the closed-form expectation of uniform random search for the same figures ("E[random]").

`--prior loo` gives every run the other GPUs' tables of the same kernel folder as `prior`
(leave one GPU out) and adds per-folder aggregates.

    PYTHONPATH=$PWD python benchmarks/replay_search.py --jobs 2
    PYTHONPATH=$PWD python benchmarks/replay_search.py --prior loo --strategies transfer_best,xgb_greedy,auto
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "gpu-tuning-spaces"
if not DEFAULT_DATA.exists():
    DEFAULT_DATA = Path("/work/shared/datasets/gpu-tuning-spaces")

THRESHOLDS = (1.05, 1.01)

_TABLES: dict[str, Any] = {}


def _table(path: str) -> Any:
    from tuner.replay import load_table

    if path not in _TABLES:
        _TABLES[path] = load_table(path)
    return _TABLES[path]


def _loo_prior(path: str) -> list[list[tuple[dict, float | None]]]:
    folder = Path(path).parent
    others = sorted(str(p) for p in folder.glob("*.json*") if str(p) != path)
    return [_table(p).as_prior() for p in others]


# ---- closed-form uniform random search without replacement ---------------------------------------------
def table_values(table: Any) -> np.ndarray:
    """Values with failures replaced by the worst valid value, ascending."""
    ok = [v for v in table.values.values() if v is not None]
    worst = max(ok)
    return np.sort(np.array([worst if v is None else v for v in table.values.values()], dtype=np.float64))


def random_expected_best(values_sorted: np.ndarray, budget: int) -> np.ndarray:
    """E[best-so-far after k draws], k = 1..budget, uniform without replacement.

    P(best rank >= i) = C(N-i+1, k) / C(N, k) (1-based ranks, ascending values)."""
    v = values_sorted
    n = len(v)
    out = np.empty(budget)
    i = np.arange(1, n + 1, dtype=np.float64)
    for k in range(1, budget + 1):
        if k >= n:
            out[k - 1] = v[0]
            continue
        # S_{i+1}/S_i = (N-i-k+1)/(N-i+1)
        ratio = np.clip(n - i - k + 1, 0, None) / (n - i + 1)
        s = np.concatenate(([1.0], np.cumprod(ratio)))  # S_1..S_{N+1}
        p = s[:-1] - s[1:]
        out[k - 1] = float(np.dot(p, v))
    return out


def random_time_to(values_sorted: np.ndarray, threshold: float, budget: int) -> tuple[float, float]:
    """(median evaluations to reach `threshold`, capped at budget+1; P(reached within budget))."""
    n = len(values_sorted)
    m = int(np.searchsorted(values_sorted, threshold, side="right"))
    surv = 1.0  # P(T > k)
    median = budget + 1
    for k in range(1, budget + 1):
        surv *= max(0, n - m - (k - 1)) / (n - (k - 1)) if n - (k - 1) > 0 else 0.0
        if median == budget + 1 and surv <= 0.5:
            median = k
    return float(median), 1.0 - surv


# ---- one run ---------------------------------------------------------------------------------------
def run_one(job: tuple[str, str, int, int, str]) -> dict[str, Any]:
    path, strategy, seed, budget, prior_mode = job
    import logging

    logging.disable(logging.WARNING)
    import tuner

    table = _table(path)
    prior = _loo_prior(path) if prior_mode == "loo" else None
    t0 = time.perf_counter()
    res = tuner.optimize(table.space, table.objective_fn(), budget=budget, seed=seed, strategy=strategy, prior=prior)
    wall = time.perf_counter() - t0
    trace = res.best_so_far()
    return {
        "file": path,
        "strategy": strategy,
        "seed": seed,
        "trace": [None if math.isinf(x) else x for x in trace],
        "evaluations": res.evaluations,
        "strategy_ms_per_eval": 1000.0 * res.strategy_time_s / max(1, res.evaluations),
        "wall_s": wall,
    }


# ---- aggregation -----------------------------------------------------------------------------------
def _evals_to(trace: Sequence[float | None], thr: float, budget: int) -> int:
    for k, x in enumerate(trace, start=1):
        if x is not None and x <= thr:
            return k
    return budget + 1


def summarise(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per (file, strategy) and per strategy figures."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by[(r["file"], r["strategy"])].append(r)
    files = sorted({r["file"] for r in runs})
    strategies = list(dict.fromkeys(r["strategy"] for r in runs))
    per_file: dict[str, dict[str, dict[str, float]]] = {}
    for f in files:
        table = _table(f)
        vs = table_values(table)
        opt = table.optimum
        worst = vs[-1]
        frand = random_expected_best(vs, budget)
        row: dict[str, dict[str, float]] = {}
        er: dict[str, float] = {"score": 0.0, "ms": float("nan")}
        for thr in THRESHOLDS:
            med, p = random_time_to(vs, opt * thr, budget)
            er[f"med{thr}"] = med
            er[f"reach{thr}"] = p
        row["E[random]"] = er
        for s in strategies:
            rs = by.get((f, s), [])
            if not rs:
                continue
            traces = np.array([[worst if x is None else x for x in (r["trace"] + [r["trace"][-1]] * budget)[:budget]]
                               for r in rs], dtype=np.float64)
            fk = np.median(traces, axis=0)
            denom = opt - frand
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(np.abs(denom) > 1e-300, (fk - frand) / denom, 1.0)
            d: dict[str, float] = {"score": float(np.mean(terms)), "n": len(rs),
                                   "ms": float(np.median([r["strategy_ms_per_eval"] for r in rs]))}
            for thr in THRESHOLDS:
                ev = [_evals_to(r["trace"], opt * thr, budget) for r in rs]
                d[f"med{thr}"] = float(np.median(ev))
                d[f"reach{thr}"] = float(np.mean([e <= budget for e in ev]))
            row[s] = d
        per_file[f] = row
    return {"files": files, "strategies": ["E[random]", *strategies], "per_file": per_file}


def _group(summary: dict[str, Any], files: list[str], runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in summary["strategies"]:
        rows = [summary["per_file"][f][s] for f in files if s in summary["per_file"][f]]
        if not rows:
            continue
        d: dict[str, float] = {}
        for thr in THRESHOLDS:
            d[f"geo{thr}"] = float(math.exp(np.mean([math.log(r[f"med{thr}"]) for r in rows])))
            if s == "E[random]":
                d[f"reach{thr}"] = float(np.mean([r[f"reach{thr}"] for r in rows]))
            else:  # share of all runs (files weigh by their number of runs)
                w = [r["n"] for r in rows]
                d[f"reach{thr}"] = float(np.average([r[f"reach{thr}"] for r in rows], weights=w))
        d["score"] = float(np.mean([r["score"] for r in rows]))
        ms = [r["strategy_ms_per_eval"] for r in runs if r["strategy"] == s and r["file"] in files]
        d["ms"] = float(np.median(ms)) if ms else float("nan")
        out[s] = d
    return out


def _short(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name.split('.')[0]}"


def print_report(summary: dict[str, Any], runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    budget = args.budget
    strategies = summary["strategies"]
    print(f"# replay search: budget {budget}, seeds {args.seeds}, prior {args.prior}; "
          f"not reached = {budget + 1}; E[random] = closed-form uniform random search")
    print()
    print("## per file: median evals to 1.05x / 1.01x, reached 1.05x / 1.01x, score")
    head = f"{'file':<26}" + "".join(f"{s:>34}" for s in strategies)
    print(head)
    for f in summary["files"]:
        line = f"{_short(f):<26}"
        for s in strategies:
            r = summary["per_file"][f].get(s)
            if r is None:
                line += f"{'-':>34}"
                continue
            cell = (f"{r['med1.05']:.0f}/{r['med1.01']:.0f} {r['reach1.05']:.2f}/{r['reach1.01']:.2f} "
                    f"{r['score']:+.2f}")
            line += f"{cell:>34}"
        print(line)
    print()
    groups = [("ALL", summary["files"])]
    if args.prior == "loo" or args.by_folder:
        folders = sorted({Path(f).parent.name for f in summary["files"]})
        groups += [(fo, [f for f in summary["files"] if Path(f).parent.name == fo]) for fo in folders]
    for name, files in groups:
        g = _group(summary, files, runs)
        print(f"## {name} ({len(files)} files)")
        print(f"{'strategy':<16}{'geo med 1.05x':>14}{'geo med 1.01x':>14}{'reached 1.05x':>14}"
              f"{'reached 1.01x':>14}{'score':>8}{'ms/eval':>9}")
        for s, d in g.items():
            ms = "-" if math.isnan(d["ms"]) else f"{d['ms']:.1f}"
            print(f"{s:<16}{d['geo1.05']:>14.1f}{d['geo1.01']:>14.1f}{d['reach1.05']:>14.2f}"
                  f"{d['reach1.01']:>14.2f}{d['score']:>8.2f}{ms:>9}")
        print()
    # tpe versus random: fewer median evaluations to 1.05x per file
    if "tpe" in strategies and "random" in strategies:
        better = sum(summary["per_file"][f]["tpe"]["med1.05"] < summary["per_file"][f]["random"]["med1.05"]
                     for f in summary["files"])
        ties = sum(summary["per_file"][f]["tpe"]["med1.05"] == summary["per_file"][f]["random"]["med1.05"]
                   for f in summary["files"])
        print(f"tpe beats random (fewer median evals to 1.05x) on {better} of {len(summary['files'])} files "
              f"({ties} ties)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder with KERNEL/GPU.json.gz tables")
    ap.add_argument("--files", default="", help="comma-separated globs relative to --data (default: all)")
    ap.add_argument("--strategies", default="random,tpe,auto",
                    help="comma-separated strategy names; 'kt' adds Kernel Tuner's strategies if installed")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--prior", choices=["none", "loo"], default="none")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--by-folder", action="store_true", help="also aggregate per kernel folder")
    ap.add_argument("--json", default="", help="write every run and the summary to this file")
    ap.add_argument("--from-json", default="",
                    help="comma-separated --json files of earlier runs (e.g. other seeds): report their runs "
                         "together instead of running anything (--budget and --prior must match)")
    args = ap.parse_args(argv)

    data = Path(args.data)
    pats = [p for p in args.files.split(",") if p] or ["*/*.json*"]
    files = sorted({str(Path(f)) for p in pats for f in glob.glob(str(data / p))})
    if not files:
        print(f"no tables match {pats} under {data}", file=sys.stderr)
        return 2
    strategies = [s for s in args.strategies.split(",") if s]
    try:
        import kernel_tuner  # noqa: F401

        print("note: kernel_tuner is installed, but running its strategies is not implemented here",
              file=sys.stderr)
    except ImportError:
        print("note: kernel_tuner is not installed; its strategies are not run", file=sys.stderr)
    prior_mode = args.prior
    jobs = [(f, s, seed, args.budget, prior_mode) for f in files for s in strategies
            for seed in range(args.seed0, args.seed0 + args.seeds)]
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    if args.from_json:
        for fn in args.from_json.split(","):
            with open(fn) as fh:
                doc = json.load(fh)
            if doc["args"]["budget"] != args.budget or doc["args"]["prior"] != args.prior:
                print(f"{fn}: budget/prior differ from this invocation", file=sys.stderr)
                return 2
            runs += [r for r in doc["runs"] if r["file"] in files and r["strategy"] in strategies]
        args.seeds = len({r["seed"] for r in runs})
        jobs = []

    def progress() -> None:
        if len(runs) % max(1, len(jobs) // 20) == 0 or len(runs) == len(jobs):
            print(f"... {len(runs)}/{len(jobs)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as ex:
            for r in ex.map(run_one, jobs, chunksize=1):
                runs.append(r)
                progress()
    else:
        for j in jobs:
            runs.append(run_one(j))
            progress()
    summary = summarise(runs, args.budget)
    print_report(summary, runs, args)
    print(f"\n{len(runs)} runs in {time.perf_counter() - t0:.0f} s "
          f"(--jobs {args.jobs}, {os.cpu_count()} cpus)")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, fh)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
