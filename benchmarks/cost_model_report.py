"""Cost-model report: train on all GPUs but one of a kernel, rank the held-out GPU's whole space.

For every table (Kernel Tuner cache file) of every kernel folder, each model is trained on the other
tables of the same folder (per-task normalised log time; at most --max-rows rows, the same sample for
every model) and scores every config of the held-out table. Printed per table and as the mean per model:

- recall@10%: share of the true best 1% among the 10% the model ranks first (pruning to 10% keeps them);
- recall@5%, NDCG@10 (relevance = optimum / time), Spearman, regret@1 and regret@10 (best true time among
  the model's top k over the optimum, minus 1).

Models: XGBoost regressor, XGBoost ranker (rank:pairwise, grouped by GPU), the mean of the other GPUs'
measured values ("transfer mean", what transfer_best replays), scikit-learn random forest, and no model.

    PYTHONPATH=$PWD python benchmarks/cost_model_report.py
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import existing_dir, positive_int, table_files  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_DATA = Path(__file__).resolve().parent / "data"  # the committed tables (benchmarks/data/README.md)

METRICS = ("recall@10%", "recall@5%", "ndcg@10", "spearman", "regret@1", "regret@10")


def _models(seed: int) -> dict[str, Any]:
    from tuner.cost_models import NoModel, RandomForestModel, XGBRankerModel, XGBRegressorModel

    return {
        "xgb": XGBRegressorModel(n_estimators=150, max_depth=6, learning_rate=0.1, seed=seed),
        "xgb_rank": XGBRankerModel(n_estimators=150, max_depth=6, learning_rate=0.1, seed=seed),
        "random_forest": RandomForestModel(n_estimators=50, min_samples_leaf=2, seed=seed),
        "none": NoModel(seed=seed),
    }


def evaluate(y_true: np.ndarray, score: np.ndarray) -> dict[str, float]:
    from tuner.cost_models import ndcg_at_k, regret, spearman, top_k_recall

    return {
        "recall@10%": top_k_recall(y_true, score, keep=0.10, best=0.01),
        "recall@5%": top_k_recall(y_true, score, keep=0.05, best=0.01),
        "ndcg@10": ndcg_at_k(y_true, score, k=10),
        "spearman": spearman(y_true, score),
        "regret@1": regret(y_true, score, k=1),
        "regret@10": regret(y_true, score, k=10),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data", type=existing_dir, default=str(DEFAULT_DATA), help="folder of KERNEL/GPU tables"
    )
    ap.add_argument(
        "--max-rows", type=positive_int, default=15000, help="training rows per fold (a random sample)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    folders = sorted(p for p in Path(args.data).iterdir() if p.is_dir())
    groups = {f: table_files(f, ["*.json*"], script="cost_model_report") for f in folders}
    groups = {
        f: files for f, files in groups.items() if len(files) >= 2
    }  # one GPU held out, the others train
    if not groups:
        ap.error(
            f"--data: no KERNEL folder under {args.data} holds two tables (KERNEL/GPU.json[.gz]) or more"
        )

    from tuner.cost_models import normalise_targets, schema_for_space

    from tuner.replay import load_table

    rows: list[tuple[str, str, dict[str, float]]] = []
    t0 = time.perf_counter()
    for folder, files in groups.items():
        tables = [load_table(f) for f in files]
        for hi, held in enumerate(tables):
            schema = schema_for_space(held.space)
            configs = held.space.enumerate()
            X_test = schema.transform(configs)
            y_test = np.array([np.nan if (v := held.lookup(c)) is None else v for c in configs])
            xs, ys, gs = [], [], []
            for ti, t in enumerate(tables):
                if ti == hi:
                    continue
                pri = t.as_prior()
                xs.append(schema.transform([c for c, _ in pri]))
                ys.append(np.array([np.nan if v is None else v for _, v in pri]))
                gs.append(np.full(len(pri), ti))
            X, y, g = np.vstack(xs), np.concatenate(ys), np.concatenate(gs)
            # the "transfer mean": the other GPUs' normalised values, averaged per config
            norm = normalise_targets(y, g)
            by_cfg: dict[tuple, list[float]] = defaultdict(list)
            keys = [held.key(c) for t in tables if t is not held for c, _ in t.as_prior()]
            for k, v in zip(keys, norm, strict=True):
                by_cfg[k].append(v)
            tm = np.array([np.mean(by_cfg.get(held.key(c), [np.inf])) for c in configs])
            rng = np.random.default_rng(args.seed)
            sel = rng.choice(len(y), size=min(args.max_rows, len(y)), replace=False)
            sel.sort()  # keep the groups contiguous in order
            name = f"{folder.name}/{Path(held.path).name.split('.')[0]}"
            rows.append((name, "transfer_mean", evaluate(y_test, tm)))
            for mname, model in _models(args.seed).items():
                model.fit(X[sel], y[sel], groups=g[sel])
                rows.append((name, mname, evaluate(y_test, model.predict(X_test))))
            print(f"... {name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    models = list(dict.fromkeys(m for _, m, _ in rows))
    print(f"# cost-model report: leave one GPU out per kernel folder, trained on <= {args.max_rows} rows")
    print(f"{'held-out table':<26}{'model':<15}" + "".join(f"{m:>12}" for m in METRICS))
    for name, m, d in rows:
        print(f"{name:<26}{m:<15}" + "".join(f"{d[k]:>12.3f}" for k in METRICS))
    print()
    print("## mean over the held-out tables")
    print(f"{'model':<15}" + "".join(f"{m:>12}" for m in METRICS))
    for m in models:
        ds = [d for _, mm, d in rows if mm == m]
        print(f"{m:<15}" + "".join(f"{np.mean([d[k] for d in ds]):>12.3f}" for k in METRICS))
    print(f"\n{len(rows)} evaluations in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
