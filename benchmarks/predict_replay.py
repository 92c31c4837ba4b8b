"""Zero-shot prediction for an untuned key, measured by replay, leave one GPU out, at one evaluation.

For every Kernel Tuner table (a brute-forced search space of one kernel on one GPU) the other GPUs'
tables of the same kernel folder are what the store would hold; the table itself is the new key, never
measured. Each method picks ONE config for it, and the score is the table's recorded time of that pick
over the table's optimum (a pick the table records as failed, or that is not in the table, counts as the
table's slowest valid time). Printed per table and overall: the geometric mean of the ratio and the share
of tables whose pick is within 1.10x of the optimum, for

- `predictor`: `tuner.cost_models.ZeroShotPredictor` (what offline and record mode use by default),
  trained on the other GPUs' tables, ranking the table's space and the winners of the other GPUs most
  like this one (`FittedZeroShot.predict_best(..., device=)`; each table's device is its `device_name`,
  else its file name, read by `tuner.search_spaces.devices.device_family`); run with `--seeds` seeds
  (the ensemble's row subsampling), reported as the mean over seeds with a 95% t-interval;
- `model_only`: the same ensemble's own best-ranked config, without the other GPUs' winners
  (`predict_best(anchors=False)`), same seeds;
- `nearest_key`: the runtime's nearest-key fallback, lifted across GPUs: the cached winner of another
  GPU. The key distance does not tell GPUs apart (every other GPU is equally near), so the figure is the
  expectation over which GPU's winner it takes (the geometric mean over the other GPUs' winners, and
  the share of them within 1.10x);
- `transfer_best`: the first config `tuner.optimize(..., strategy="transfer_best", prior=<other GPUs>)`
  measures (the best mean normalised time over the other GPUs);
- `default`: the space default (`SearchSpace.default()`, the table's first config).

Each table's problem size (log2 of its dimensions) is a task feature, so a folder of one kernel's tables
at several shapes (one GPU, or several) is measured the same way, across shapes.

It also times the predictor: fitting (once per kernel family in the runtime) and ranking a table's
whole space (once per key), each the median over the runs.

    PYTHONPATH=$PWD python benchmarks/predict_replay.py
    PYTHONPATH=$PWD python benchmarks/predict_replay.py --data DIR --seeds 5 --json /tmp/predict.json

`--data` defaults to benchmarks/data (the folder of kernel folders with `*.json` / `*.json.gz` tables).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_DATA = REPO / "benchmarks" / "data"
WITHIN = 1.10


def find_tables(data: Path) -> dict[str, list[Path]]:
    """Kernel folder name -> its tables (folders with at least two tables only: one is left out)."""
    out: dict[str, list[Path]] = {}
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
        if len(files) >= 2:
            out[folder.name] = files
    return out


def ratio_of(table: Any, config: dict[str, Any] | None) -> float:
    """Recorded time of `config` over the optimum; failed or unknown configs count as the slowest."""
    worst = max(v for v in table.values.values() if v is not None)
    if config is None:
        return worst / table.optimum
    try:
        v = table.lookup(config)
    except (KeyError, TypeError):
        v = None
    return (worst if v is None else v) / table.optimum


def task_features_of(table: Any) -> dict[str, float]:
    """log2 of the table's problem dimensions: what tells tables of one kernel at several shapes apart
    (constant within a folder of the GPU dataset, where the tables differ by GPU only)."""
    ps = table.problem_size
    dims = ps if isinstance(ps, (list, tuple)) else [ps]
    return {
        f"log2_dim{i}": math.log2(v)
        for i, v in enumerate(dims)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    }


def device_of(table: Any) -> str:
    """The table's device as the store would label it: the recorded `device_name`, else the table's file
    name (the GPU's name in the hub's layout; two hub tables record an empty `device_name`)."""
    return table.device_name or (Path(table.path).name.split(".")[0] if table.path else "")


def geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def t_interval(xs: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width 0 for fewer than two values."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    t = _T975.get(len(xs) - 1, 1.96)
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


# Student's t 97.5% quantiles by degrees of freedom (1.96, the normal one, beyond the table).
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def evaluate(
    tables: dict[str, list[Path]],
    seeds: list[int],
    params: dict[str, Any],
    max_rows: int | None = None,
    risk: float = 0.0,
) -> dict[str, Any]:
    from tuner.cost_models.zero_shot import ZeroShotPredictor, ZeroShotTask, fit_zero_shot

    import tuner
    from tuner.replay import load_table

    loaded = {str(p): load_table(p) for files in tables.values() for p in files}
    rows: list[dict[str, Any]] = []
    for folder, files in tables.items():
        for path in files:
            target = loaded[str(path)]
            others = [loaded[str(p)] for p in files if p != path]
            name = f"{folder}/{path.name.split('.')[0]}"
            row: dict[str, Any] = {"table": name, "configs": len(target.values)}
            # nearest key: the winner of another GPU, in expectation over which one
            near = [ratio_of(target, o.best_config()) for o in others]
            row["nearest_key"] = geo(near)
            row["nearest_key_within"] = sum(r <= WITHIN for r in near) / len(near)
            res = tuner.optimize(
                target.space,
                target.objective_fn(),
                budget=1,
                strategy="transfer_best",
                prior=[o.as_prior() for o in others],
            )
            row["transfer_best"] = ratio_of(target, res.trials[0].config)
            row["default"] = ratio_of(target, target.space.default())
            preds, only, fits, ranks, agree, fit_cpu, rank_cpu = [], [], [], [], [], [], []
            for s in seeds:
                c0, t0 = time.process_time(), time.perf_counter()
                fitted = fit_zero_shot(
                    target.space,
                    [
                        ZeroShotTask(o.as_prior(), task_features_of(o), name=o.name, device=device_of(o))
                        for o in others
                    ],
                    predictor=ZeroShotPredictor(seed=s, **params),
                    seed=s,
                    **({"max_rows_per_task": max_rows} if max_rows else {}),
                )
                c1, t1 = time.process_time(), time.perf_counter()
                dev = device_of(target)
                pick = fitted.predict_best(target.space, task_features_of(target), risk=risk, device=dev)
                c2, t2 = time.process_time(), time.perf_counter()
                alone = fitted.predict_best(
                    target.space, task_features_of(target), risk=risk, anchors=False, device=dev
                )
                configs, scores = fitted.rank_space(target.space, task_features_of(target), device=dev)
                full = configs[int(scores.argmin())]
                preds.append(ratio_of(target, pick.config))
                only.append(ratio_of(target, alone.config))
                agree.append(ratio_of(target, full) == only[-1])
                fits.append(t1 - t0)
                ranks.append(t2 - t1)
                fit_cpu.append(c1 - c0)
                rank_cpu.append(c2 - c1)
            row["predictor_by_seed"] = preds
            row["model_only_by_seed"] = only
            row["prescreen_agrees"] = agree
            row["fit_s"] = statistics.median(fits)
            row["rank_ms"] = 1000 * statistics.median(ranks)
            row["fit_cpu_s"] = statistics.median(fit_cpu)
            row["rank_cpu_ms"] = 1000 * statistics.median(rank_cpu)
            rows.append(row)
            print(
                f"{name:28s} {row['configs']:6d} configs  predictor {geo(preds):6.3f}  "
                f"model_only {geo(only):6.3f}  "
                f"nearest_key {row['nearest_key']:6.3f}  transfer_best {row['transfer_best']:6.3f}  "
                f"default {row['default']:6.3f}   fit {row['fit_s']:.2f}s (cpu {row['fit_cpu_s']:.2f}s) "
                f"rank {row['rank_ms']:.0f} ms (cpu {row['rank_cpu_ms']:.0f} ms)",
                flush=True,
            )
    return {"rows": rows, "seeds": seeds}


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    rows, seeds = result["rows"], result["seeds"]
    out: dict[str, Any] = {}
    for m in ("predictor", "model_only"):
        per_seed_geo = [geo([r[f"{m}_by_seed"][i] for r in rows]) for i in range(len(seeds))]
        per_seed_within = [
            sum(r[f"{m}_by_seed"][i] <= WITHIN for r in rows) / len(rows) for i in range(len(seeds))
        ]
        out[m] = {
            "geo_mean": t_interval(per_seed_geo),
            "within": t_interval(per_seed_within),
            "per_seed_geo_mean": per_seed_geo,
            "per_seed_within": per_seed_within,
        }
    out["nearest_key"] = {
        "geo_mean": geo([r["nearest_key"] for r in rows]),
        "within": statistics.fmean(r["nearest_key_within"] for r in rows),
    }
    for m in ("transfer_best", "default"):
        out[m] = {
            "geo_mean": geo([r[m] for r in rows]),
            "within": sum(r[m] <= WITHIN for r in rows) / len(rows),
        }
    out["prescreen_agrees"] = statistics.fmean(a for r in rows for a in r["prescreen_agrees"])
    out["fit_s_median"] = statistics.median(r["fit_s"] for r in rows)
    out["rank_ms_per_10k"] = statistics.median(1e4 * r["rank_ms"] / r["configs"] for r in rows)
    out["fit_cpu_s_median"] = statistics.median(r["fit_cpu_s"] for r in rows)
    out["rank_cpu_ms_per_10k"] = statistics.median(1e4 * r["rank_cpu_ms"] / r["configs"] for r in rows)
    by_folder: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_folder[r["table"].split("/")[0]].append(r)
    out["folders"] = {
        f: {
            "predictor": geo([geo(r["predictor_by_seed"]) for r in rs]),
            "model_only": geo([geo(r["model_only_by_seed"]) for r in rs]),
            "nearest_key": geo([r["nearest_key"] for r in rs]),
            "transfer_best": geo([r["transfer_best"] for r in rs]),
            "default": geo([r["default"] for r in rs]),
        }
        for f, rs in by_folder.items()
    }
    return out


def print_summary(s: dict[str, Any], n_tables: int, n_seeds: int) -> None:
    print()
    print(f"ALL ({n_tables} tables, leave one GPU out, one evaluation; ratio = picked time / optimum)")
    for f, d in s["folders"].items():
        print(
            f"  {f:14s} geo-mean: predictor {d['predictor']:.3f}  model_only {d['model_only']:.3f}  "
            f"nearest_key {d['nearest_key']:.3f}  "
            f"transfer_best {d['transfer_best']:.3f}  default {d['default']:.3f}"
        )
    for m in ("predictor", "model_only"):
        pg, pw = s[m]["geo_mean"], s[m]["within"]
        print(
            f"  {m:14s} geo-mean {pg[0]:.3f} +- {pg[1]:.3f}   within {WITHIN:.2f}x {pw[0]:.2f} +- {pw[1]:.2f}"
            f"   (mean over {n_seeds} seeds, 95% t-interval; per seed "
            + " / ".join(f"{g:.3f}" for g in s[m]["per_seed_geo_mean"])
            + ", "
            + " / ".join(f"{w:.2f}" for w in s[m]["per_seed_within"])
            + ")"
        )
    for m in ("nearest_key", "transfer_best", "default"):
        print(
            f"  {m:14s} geo-mean {s[m]['geo_mean']:.3f}           within {WITHIN:.2f}x {s[m]['within']:.2f}"
        )
    print(
        f"  predictor time (wall, and this process's CPU time): fit {s['fit_s_median']:.2f} s "
        f"(cpu {s['fit_cpu_s_median']:.2f} s) per family, rank {s['rank_ms_per_10k']:.1f} ms "
        f"(cpu {s['rank_cpu_ms_per_10k']:.1f} ms) per 10k configs, medians; the prescreened model pick is as good "
        f"as the whole ensemble's on all candidates in {100 * s['prescreen_agrees']:.0f}% of runs"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of kernel folders of tables")
    ap.add_argument("--seeds", type=int, default=3, help="predictor seeds (default 3)")
    ap.add_argument("--models", type=int, default=None, help="ensemble members (default: the predictor's)")
    ap.add_argument("--trees", type=int, default=None, help="trees per member (default: the predictor's)")
    ap.add_argument(
        "--rows", type=int, default=None, help="rows per related table (default: fit_zero_shot's)"
    )
    ap.add_argument("--risk", type=float, default=0.0, help="rank by mean + RISK x ensemble spread")
    ap.add_argument("--only", default=None, help="comma-separated kernel folders to run")
    ap.add_argument("--json", type=Path, default=None, help="write the per-table figures here")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    if not args.data.is_dir():
        print(
            f"predict_replay: no folder {args.data}; pass --data DIR (kernel folders of tables)",
            file=sys.stderr,
        )
        return 2
    tables = find_tables(args.data)
    if args.only:
        tables = {k: v for k, v in tables.items() if k in args.only.split(",")}
    if not tables:
        print(f"predict_replay: no kernel folder with two or more tables under {args.data}", file=sys.stderr)
        return 2
    seeds = list(range(args.seeds))
    params = {k: v for k, v in (("n_models", args.models), ("n_estimators", args.trees)) if v is not None}
    result = evaluate(tables, seeds, params, args.rows, args.risk)
    s = summarise(result)
    print_summary(s, len(result["rows"]), len(seeds))
    if args.json:
        args.json.write_text(json.dumps({**result, "summary": s}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
