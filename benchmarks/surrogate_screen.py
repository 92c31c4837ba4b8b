"""Screen cost-model candidates for the search in minutes: how well each ranks a table from few results.

A search replay (`replay_search.py`: about 5 minutes for one variant, 20 seeds, `--jobs 2` on 2 cores)
mixes the surrogate with everything else the strategy does. This script isolates the surrogate. For every table, training-set size
n (`--sizes`) and seed, it draws n configs of the table uniformly at random, fits each candidate on their
targets (as `auto` fits them: per-task normalised log time, clipped at the median) and ranks the unseen
configs. The figure is the best time among the n training configs and the candidate's `--top` best-ranked
unseen ones, divided by the table's optimum: what n random results plus k model picks reach. Per table it
prints the mean of that ratio's log over seeds (as a ratio), and over all tables its geometric mean with a
95% interval (percentile bootstrap over each table's seeds), beside `random` (k more random configs: the
in-run baseline) and the median time of one fit and ranking.

Candidates: `xgb` (the bootstrap XGBoost ensemble `auto` uses: 3 members, 40 rounds, depth 4), `xgb1`
(one member, no bootstrap), `gp` (scikit-learn's Gaussian process, an ARD Matern 5/2 kernel plus a
white-noise term on the standardised features), `rf` (scikit-learn's random forest), `ridge` (an additive
model: ridge regression, alpha 1, on one 0/1 column per parameter value), `ridge_xgb` (the ensemble boosted
from the ridge fit's predictions as its base margin: additive effects plus the trees' interactions),
`gp_overlap` (a Gaussian process on the parameters' value codes with an overlap kernel, one weight per
parameter: `benchmarks/_overlap_gp.py`), `random`.

Random training sets are not the search's own (a search's results cluster near its incumbents), so a
candidate that wins here is a candidate to replay, not a result; one that loses here by a wide margin is
unlikely to win there.

    python benchmarks/surrogate_screen.py
    python benchmarks/surrogate_screen.py --files 'gemm/*' --sizes 20,40 --seeds 10 --models xgb,gp,random
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import table_files  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
MODELS = ("xgb", "xgb1", "gp", "rf", "random", "ridge", "ridge_xgb", "gp_overlap")

Ranker = Callable[[np.ndarray], np.ndarray]  # pool indices -> scores, lower is better


def strategy_targets(values: np.ndarray) -> np.ndarray:
    """`auto`'s targets: normalised log time (failures worst plus a margin), clipped at the median."""
    from tuner.cost_models import normalise_targets

    y = normalise_targets(values)
    return np.minimum(y, np.quantile(y, 0.5)) if len(y) >= 4 else y


def standardised(F: np.ndarray) -> np.ndarray:
    """The non-constant feature columns, NaN as -1, each scaled to mean 0 and unit variance (for the GP and
    the random forest, which take no NaN)."""
    keep = np.flatnonzero(np.nanstd(F, axis=0) > 0)
    Z = np.nan_to_num(F[:, keep], nan=-1.0)
    return (Z - Z.mean(axis=0)) / (Z.std(axis=0) + 1e-12)


def one_hot(configs: Sequence[dict[str, Any]], names: Sequence[str]) -> np.ndarray:
    """One 0/1 column per value of each parameter (for the additive `ridge` candidates)."""
    from sklearn.preprocessing import OneHotEncoder

    values = np.array([[repr(c[name]) for name in names] for c in configs], dtype=object)
    return OneHotEncoder(sparse_output=False).fit_transform(values)


def overlap_gp_module() -> Any:
    """benchmarks/_overlap_gp.py as a module (this folder is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_overlap_gp", Path(__file__).with_name("_overlap_gp.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def value_codes(configs: Sequence[dict[str, Any]], params: Sequence[Any]) -> np.ndarray:
    """One column per parameter that takes more than one value: the index of each config's value (for
    `gp_overlap`)."""
    cols = []
    for p in params:
        if len(p.values) > 1:
            pos = {repr(v): j for j, v in enumerate(p.values)}
            cols.append([pos[repr(c[p.name])] for c in configs])
    return np.asarray(cols, dtype=np.int64).T


def fit_ranker(
    name: str,
    F: np.ndarray,
    idx: np.ndarray,
    y: np.ndarray,
    seed: int,
    Z: np.ndarray | None = None,
    H: np.ndarray | None = None,
    C: np.ndarray | None = None,
) -> Ranker:
    """Fit candidate `name` on the rows `idx` of the feature matrix `F` with targets `y`; `Z`, the
    table's `standardised(F)`, computed once per table by the caller (else here); `H`, its `one_hot`
    matrix (needed by the ridge candidates); `C`, its `value_codes` (needed by `gp_overlap`)."""
    if name == "gp_overlap":
        if C is None:
            raise ValueError("gp_overlap needs C, the table's value codes (value_codes)")
        g = overlap_gp_module().OverlapGP().fit(C[idx], y)
        return lambda rows: g.predict(C[rows])[0]
    if name in ("xgb", "xgb1"):
        from tuner.cost_models import XGBEnsemble

        m = XGBEnsemble(
            n_models=3 if name == "xgb" else 1, bootstrap=name == "xgb", normalise=False, seed=seed
        ).fit(F[idx], y)
        return lambda rows: m.predict(F[rows])
    if name in ("ridge", "ridge_xgb"):
        from sklearn.linear_model import Ridge

        if H is None:
            raise ValueError("ridge candidates need H, the table's one-hot matrix (one_hot)")
        r = Ridge(alpha=1.0).fit(H[idx], y)
        if name == "ridge":
            return lambda rows: r.predict(H[rows])
        from tuner.cost_models import XGBEnsemble

        base = r.predict(H)
        m = XGBEnsemble(n_models=3, bootstrap=True, normalise=False, seed=seed)
        m.fit(F[idx], y, base_margin=base[idx])  # the trees fit what the additive model leaves
        return lambda rows: m.predict(F[rows]) + base[rows]
    if name == "random":
        rng = np.random.default_rng(seed)
        return lambda rows: rng.random(len(rows))
    if Z is None:
        Z = standardised(F)
    if name == "gp":
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        kernel = ConstantKernel(1.0) * Matern(
            length_scale=np.full(Z.shape[1], 2.0), length_scale_bounds=(0.05, 100.0), nu=2.5
        ) + WhiteKernel(1e-2, (1e-5, 1.0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings of the kernel's optimiser
            gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed).fit(Z[idx], y)
        return lambda rows: gp.predict(Z[rows])
    if name == "rf":
        from sklearn.ensemble import RandomForestRegressor

        rf = RandomForestRegressor(n_estimators=30, max_features=0.8, random_state=seed, n_jobs=1)
        rf.fit(Z[idx], y)
        return lambda rows: rf.predict(Z[rows])
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def screen_table(
    path: str, models: Sequence[str], sizes: Sequence[int], seeds: int, top: int
) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (model, n): the log2 ratios to the optimum over seeds and the fit-and-rank times."""
    from tuner.cost_models import schema_for_space

    from tuner.replay import load_table

    table = load_table(path)
    rows = table.as_prior()  # (config, value) for every config of the table
    size = len(rows)
    F = schema_for_space(table.space).transform([c for c, _ in rows])
    H = None
    if {"ridge", "ridge_xgb"} & set(models):
        H = one_hot([c for c, _ in rows], [p.name for p in table.space.params])
    Z = standardised(F) if {"gp", "rf"} & set(models) else None
    C = value_codes([c for c, _ in rows], table.space.params) if "gp_overlap" in models else None
    raw = np.array([np.nan if v is None else v for _, v in rows], dtype=np.float64)
    worst = np.nanmax(raw)
    true = np.where(np.isfinite(raw), raw, worst)  # a failed config counts as the worst valid one
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for n in sizes:
        if n + top > size:
            raise SystemExit(f"{path}: --sizes {n} plus --top {top} exceeds its {size} configs")
        for name in models:
            out[(name, n)] = {"log2": [], "ms": []}
        for s in range(seeds):
            rng = np.random.default_rng([s, n])  # the same training set for every model
            idx = rng.choice(size, size=n, replace=False)
            unseen = np.setdiff1d(np.arange(size), idx)
            y = strategy_targets(raw[idx])
            for name in models:
                t0 = time.perf_counter()
                score = fit_ranker(name, F, idx, y, s, Z, H, C)(unseen)
                picks = unseen[np.argsort(score, kind="stable")[:top]]
                ms = 1000.0 * (time.perf_counter() - t0)
                best = min(float(true[idx].min()), float(true[picks].min()))
                out[(name, n)]["log2"].append(math.log2(best / table.optimum))
                out[(name, n)]["ms"].append(ms)
    return out


def bootstrap_ci(
    per_table: Sequence[Sequence[float]], reps: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of 2**(mean over tables of each table's mean log2), resampling each table's seeds."""
    rng = np.random.default_rng(seed)
    arrs = [np.asarray(a) for a in per_table]
    stats = [float(np.mean([a[rng.integers(0, len(a), len(a))].mean() for a in arrs])) for _ in range(reps)]
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(2.0**lo), float(2.0**hi)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder of tables (default: benchmarks/data)")
    ap.add_argument("--files", default="*/*.json*", help="comma-separated globs under --data")
    ap.add_argument("--models", default="xgb,xgb1,gp,rf,random", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--sizes", default="20,40,80", help="training-set sizes (random results)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--top", type=int, default=5, help="model picks measured after the random results")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; known: {', '.join(MODELS)}")
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: comma-separated integers")
    if not sizes or min(sizes) < 4 or args.seeds < 1 or args.top < 1:
        ap.error("--sizes must be integers >= 4, --seeds and --top >= 1")
    files = table_files(args.data, args.files.split(","), script="surrogate_screen")
    if not files:
        ap.error(f"no table matches {args.files!r} under {args.data}")
    print(
        f"# surrogate screen: {len(files)} tables, {args.seeds} seeds, training sizes {sizes}, top {args.top}; "
        "figure: best of (random results + top picks) / optimum, geometric mean over seeds"
    )
    cols = [(m, n) for n in sizes for m in models]
    print(f"{'table':28s} " + " ".join(f"{m + '@' + str(n):>11s}" for m, n in cols), flush=True)
    per: dict[tuple[str, int], list[list[float]]] = {c: [] for c in cols}
    ms: dict[str, list[float]] = {m: [] for m in models}
    for path in files:
        res = screen_table(path, models, sizes, args.seeds, args.top)
        label = str(Path(path).relative_to(args.data)).split(".json")[0]
        print(f"{label:28s} " + " ".join(f"{2.0 ** np.mean(res[c]['log2']):11.3f}" for c in cols), flush=True)
        for c in cols:
            per[c].append(res[c]["log2"])
            ms[c[0]] += res[c]["ms"]
    print("\n## all tables: geometric mean of the ratio [95% CI]; median ms per fit and ranking")
    for m in models:
        figs = []
        for n in sizes:
            g = 2.0 ** float(np.mean([np.mean(a) for a in per[(m, n)]]))
            lo, hi = bootstrap_ci(per[(m, n)])
            figs.append(f"n={n}: {g:.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"{m:8s} " + "  ".join(figs) + f"  {np.median(ms[m]):.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
