"""Does a model of other kernels rank a new kernel's configs? A screen of a cold start across kernels.

A cold search knows nothing of its kernel. The cost model's derived features (cost_models/features.py)
include a few that every GPU kernel of this kind has, whatever its parameters are called: the threads per
block (log2, and the log2 of its odd part), the work per thread and the area of the block's tile. This
script fits the boosted ensemble `auto` uses on those features of every table of the *other* kernels
(each table's targets normalised and clipped at its median, as `auto` does), ranks the held-out table's
configs, and reports the best of the model's k first picks over the table's optimum beside the expected
best of k uniform random picks (closed form): what such a model would give a cold search's first k
evaluations in place of its space-filling draws. Configs that share the four features tie; ties are
broken at random, over `--seeds` seeds (which also seed the ensemble).

Training sets: `all` (every table of the other kernels, all GPUs) and `same_gpu` (only the other
kernels' tables of the held-out table's GPU, where there are any).

    python benchmarks/cross_kernel_screen.py
    python benchmarks/cross_kernel_screen.py --k 5,10,20 --seeds 10
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import existing_dir, positive_int, positive_ints, table_files  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
# a shared name -> the derived feature names that carry it in one kernel or another (first present wins)
COMMON = {
    "threads": ("log2_threads_per_block",),
    "threads_odd": ("log2odd_threads_per_block",),
    "work_per_thread": ("log2_elements_per_thread", "log2_work_per_thread"),
    "tile_area": ("log2_block_extent_area", "log2_workgroup_tile_area"),
}


def common_features(names: Sequence[str], F: np.ndarray) -> np.ndarray:
    """The COMMON columns of a schema's feature matrix `F`; an absent odd part is 0 (powers of two only),
    any other absent feature NaN (XGBoost's missing value)."""
    cols = []
    for shared, candidates in COMMON.items():
        hit = next((names.index(c) for c in candidates if c in names), None)
        if hit is not None:
            cols.append(F[:, hit])
        else:
            cols.append(np.zeros(len(F)) if shared == "threads_odd" else np.full(len(F), np.nan))
    return np.column_stack(cols)


def load(path: str) -> dict:
    from tuner.cost_models import schema_for_space

    from tuner.replay import load_table

    table = load_table(path)
    rows = table.as_prior()
    schema = schema_for_space(table.space)
    F = schema.transform([c for c, _ in rows])
    raw = np.array([np.nan if v is None else v for _, v in rows], dtype=np.float64)
    true = np.where(np.isfinite(raw), raw, np.nanmax(raw))
    return {"X": common_features(list(schema.names), F), "raw": raw, "true": true, "opt": table.optimum}


def targets(raw: np.ndarray) -> np.ndarray:
    from tuner.cost_models import normalise_targets

    y = normalise_targets(raw)
    return np.minimum(y, np.quantile(y, 0.5))


def random_best_log2(true: np.ndarray, opt: float, k: int) -> float:
    """E[log2(best of k uniform draws without replacement / optimum)], closed form over the ranks."""
    v = np.sort(np.log2(true / opt))
    n = len(v)
    i = np.arange(n)  # P(best is the i-th smallest) = C(n-1-i, k-1) / C(n, k)
    logc = np.array(
        [
            math.lgamma(n - j) - math.lgamma(k) - math.lgamma(n - j - k + 1)
            if n - j - 1 >= k - 1
            else -math.inf
            for j in i
        ]
    )
    p = np.exp(logc - (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)))
    return float((p * v).sum())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data", type=existing_dir, default=str(DEFAULT_DATA), help="folder with KERNEL/GPU.json.gz tables"
    )
    ap.add_argument(
        "--k", type=positive_ints, default="5,10,20", help="comma-separated numbers of first picks"
    )
    ap.add_argument("--seeds", type=positive_int, default=10, help="tie-break and ensemble seeds")
    args = ap.parse_args(argv)
    ks: list[int] = args.k
    paths = table_files(args.data, ["*/*.json*"], script="cross_kernel_screen")
    paths = [p for p in paths if Path(p).parent.name != "gpu_validate"]
    if not paths:
        ap.error(f"--data: no tables (KERNEL/GPU.json[.gz]) under {args.data}")
    from scipy.stats import spearmanr
    from tuner.cost_models import XGBEnsemble

    tables = {str(Path(p).relative_to(args.data)).split(".json")[0]: load(p) for p in paths}
    kernel = {name: name.split("/")[0] for name in tables}
    gpu = {name: name.split("/")[1] for name in tables}
    print(f"# cross-kernel screen: {len(tables)} tables, features {', '.join(COMMON)}, seeds {args.seeds}")
    print(
        "# per table: log2 ratio of the best of the first k picks to the optimum, as a ratio "
        "(model / uniform random), and the Spearman rank correlation of the model with the table"
    )
    head = f"{'table':24s} {'train':9s} {'rows':>6s} " + " ".join(f"{'k=' + str(k):>15s}" for k in ks)
    print(head + f" {'spearman':>9s}")
    summary: dict[str, dict[int, list[tuple[float, float]]]] = {
        "all": {k: [] for k in ks},
        "same_gpu": {k: [] for k in ks},
    }
    rhos: dict[str, list[float]] = {"all": [], "same_gpu": []}
    for name, t in tables.items():
        for mode in ("all", "same_gpu"):
            train = [
                o for o in tables if kernel[o] != kernel[name] and (mode == "all" or gpu[o] == gpu[name])
            ]
            if not train:
                continue
            X = np.vstack([tables[o]["X"] for o in train])
            y = np.concatenate([targets(tables[o]["raw"]) for o in train])
            got: dict[int, list[float]] = {k: [] for k in ks}
            for s in range(args.seeds):
                m = XGBEnsemble(n_models=3, normalise=False, seed=s).fit(X, y)
                score = m.predict(t["X"])
                order = np.lexsort((np.random.default_rng(s).random(len(score)), score))
                for k in ks:
                    got[k].append(math.log2(float(t["true"][order[:k]].min()) / t["opt"]))
            cells = []
            for k in ks:
                model_l2 = float(np.mean(got[k]))
                rand_l2 = random_best_log2(t["true"], t["opt"], k)
                summary[mode][k].append((model_l2, rand_l2))
                cells.append(f"{2**model_l2:6.2f} / {2**rand_l2:6.2f}")
            rho = float(spearmanr(score, t["true"]).statistic)
            rhos[mode].append(rho)
            print(
                f"{name:24s} {mode:9s} {len(y):6d} " + " ".join(f"{c:>15s}" for c in cells) + f" {rho:9.2f}"
            )
    print(
        "\n## geometric mean over held-out tables (model / uniform random), tables where the model's "
        "picks beat random's expectation"
    )
    for mode, per_k in summary.items():
        if not rhos[mode]:
            continue
        parts = []
        for k, pairs in per_k.items():
            mod = 2 ** float(np.mean([a for a, _ in pairs]))
            ran = 2 ** float(np.mean([b for _, b in pairs]))
            wins = sum(a < b for a, b in pairs)
            parts.append(f"k={k}: {mod:.3f} / {ran:.3f} ({wins} of {len(pairs)})")
        print(f"{mode:9s} " + "; ".join(parts) + f"; mean Spearman {np.mean(rhos[mode]):+.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
