"""Cost models behind the scikit-learn estimator contract.

`__init__` only stores hyperparameters, `fit(X, y, groups=None)` validates, learns and returns self, and
the learned state ends in `_`. `y` is the measured time (lower is better; NaN or inf = failed); each
model learns a per-task normalised target (`normalise_targets`: log time minus the task's median log
time, failures at the task's worst plus a margin), so tasks measured on different devices can be pooled.
`predict(X)` returns a score where lower means faster (comparable within a task, not across tasks).

- `XGBRegressorModel`: XGBoost regressor on the normalised log time.
- `XGBRankerModel`: XGBoost ranker (rank:pairwise or rank:ndcg) grouped by task.
- `XGBEnsemble`: a few regressors on bootstrap resamples; `predict_std` gives an uncertainty.
- `RandomForestModel` (scikit-learn) and `NoModel` (random order): baselines.

XGBoost is imported lazily; nothing here pickles.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "CostModel",
    "XGBRegressorModel",
    "XGBRankerModel",
    "XGBEnsemble",
    "RandomForestModel",
    "NoModel",
    "normalise_targets",
    "FAIL_MARGIN",
    "MODELS",
]

log = logging.getLogger(__name__)

# A failed config counts as this much (in log time) worse than the task's slowest valid config.
FAIL_MARGIN = 0.5


def normalise_targets(
    y: Sequence[float] | np.ndarray, groups: Sequence[Any] | np.ndarray | None = None
) -> np.ndarray:
    """Per task (group): log(time) - median log(time); failures (NaN, inf, <= 0) = task max + FAIL_MARGIN."""
    yy = np.asarray(y, dtype=np.float64)
    g = (
        np.zeros(len(yy), dtype=np.int64)
        if groups is None
        else np.unique(np.asarray(groups), return_inverse=True)[1]
    )
    out = np.empty(len(yy))
    for gi in np.unique(g):
        m = g == gi
        v = yy[m]
        ok = np.isfinite(v) & (v > 0)
        t = np.full(len(v), np.nan)
        if ok.any():
            lv = np.log(v[ok])
            med = float(np.median(lv))
            t[ok] = lv - med
            t[~ok] = float(lv.max() - med) + FAIL_MARGIN
        else:
            t[:] = 0.0
        out[m] = t
    return out


def _check_xy(X: Any, y: Any | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    Xa = np.asarray(X, dtype=np.float64)
    if Xa.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {Xa.shape}")
    if y is None:
        return Xa, None
    # fitting on inf: XGBoost refused it with its C++ stack trace (predicting takes it as a large value)
    if np.isinf(Xa).any():
        col = int(np.nonzero(np.isinf(Xa).any(axis=0))[0][0])
        raise ValueError(f"X holds inf (column {col}); features must be finite, or NaN where missing")
    ya = np.asarray(y, dtype=np.float64)
    if ya.ndim > 1 and sum(d > 1 for d in ya.shape) > 1:  # one target per row; ravel() hid a 2-D y
        raise ValueError(f"y must be 1-D (one target per row of X), got shape {ya.shape}")
    ya = ya.ravel()
    if len(ya) != len(Xa):
        raise ValueError(f"X has {len(Xa)} rows but y has {len(ya)}")
    if len(ya) == 0:
        raise ValueError("cannot fit on zero rows")
    return Xa, ya


def _check_fit_xy(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """`_check_xy` for `fit`, where y is required: None is a ValueError (as scikit-learn's), not an assert,
    which `python -O` strips (a TypeError from deep in the fit then)."""
    Xa, ya = _check_xy(X, y)
    if ya is None:
        raise ValueError("y is None: fit needs the targets, one per row of X")
    return Xa, ya


def _check_rows(n: int, **arrays: Any) -> None:
    """Each of `groups`, `sample_weight`, `base_margin` given holds one entry per row of X: a shorter
    `groups` made the ranker fit on as many rows as it had (the rest dropped without a word), and the
    regressors fail with numpy's IndexError or XGBoost's C++ stack trace."""
    for name, a in arrays.items():
        if a is None:
            continue
        arr = np.asarray(a, dtype=object if name == "groups" else np.float64)
        if arr.ndim != 1 or len(arr) != n:
            raise ValueError(f"{name} must hold one entry per row of X ({n}), got shape {arr.shape}")
        if name == "sample_weight" and not (np.isfinite(arr).all() and (arr >= 0).all()):
            i = int(np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))[0])
            raise ValueError(f"sample_weight must be finite and >= 0, row {i} holds {arr[i]}")


class CostModel:
    """Base: `get_params` / `set_params` from the `__init__` signature (the scikit-learn way)."""

    n_features_in_: int  # set by fit

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        import inspect

        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params: Any) -> CostModel:
        valid = self.get_params()
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def fit(
        self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None
    ) -> CostModel:  # pragma: no cover
        raise NotImplementedError

    def predict(self, X: Any) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if not hasattr(self, "n_features_in_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit first")

    def _check_width(self, X: np.ndarray) -> None:
        self._check_fitted()
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was fitted on {self.n_features_in_}")


def _xgb_params(
    n_threads: int,
    max_depth: int,
    learning_rate: float,
    subsample: float,
    colsample: float,
    min_child_weight: float,
    seed: int,
    objective: str,
) -> dict[str, Any]:
    return {
        "objective": objective,
        "max_depth": max_depth,
        "eta": learning_rate,
        "subsample": subsample,
        "colsample_bytree": colsample,
        "min_child_weight": min_child_weight,
        "nthread": n_threads,
        "seed": seed,
        "tree_method": "hist",
        "max_bin": 64,
    }


def _xgb_quiet() -> Any:
    """XGBoost's warnings off for one fit or predict. Not a `verbosity` in the booster's params: XGBoost
    keeps that in its global (per-thread) config, so it stayed 0 for the caller's own XGBoost afterwards."""
    import xgboost as xgb

    return xgb.config_context(verbosity=0)


class XGBRegressorModel(CostModel):
    """XGBoost regressor on the per-task normalised log time (or on `y` as given, `normalise=False`)."""

    def __init__(
        self,
        n_estimators: int = 60,
        max_depth: int = 5,
        learning_rate: float = 0.2,
        subsample: float = 0.9,
        colsample_bytree: float = 0.9,
        min_child_weight: float = 1.0,
        n_threads: int = 1,
        normalise: bool = True,
        seed: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.n_threads = n_threads
        self.normalise = normalise
        self.seed = seed

    def fit(
        self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None, base_margin: Any = None
    ) -> XGBRegressorModel:
        import xgboost as xgb

        Xa, ya = _check_fit_xy(X, y)
        _check_rows(len(ya), groups=groups, sample_weight=sample_weight, base_margin=base_margin)
        t = normalise_targets(ya, groups) if self.normalise else ya
        if self.n_estimators < 1:
            raise ValueError(f"n_estimators must be >= 1, got {self.n_estimators}")
        d = xgb.DMatrix(Xa, t, weight=sample_weight, base_margin=base_margin, nthread=self.n_threads)
        params = _xgb_params(
            self.n_threads,
            self.max_depth,
            self.learning_rate,
            self.subsample,
            self.colsample_bytree,
            self.min_child_weight,
            self.seed,
            "reg:squarederror",
        )
        params["base_score"] = 0.0
        with _xgb_quiet():
            self.booster_ = xgb.train(params, d, self.n_estimators)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {
            "rows": int(len(ya)),
            "tasks": int(len(np.unique(groups))) if groups is not None else 1,
            "failed": int((~np.isfinite(ya) | (ya <= 0)).sum()) if self.normalise else 0,
        }
        return self

    def predict(self, X: Any, base_margin: Any = None) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        with _xgb_quiet():
            out = self.booster_.inplace_predict(Xa, base_margin=base_margin)
        return np.asarray(out, dtype=np.float64)

    def boosters(self) -> list[Any]:
        self._check_fitted()
        return [self.booster_]


class XGBRankerModel(CostModel):
    """XGBoost learning-to-rank grouped by task; relevance = graded by the config's rank in its task
    (the best 1% get the top grade). `predict` returns minus the ranking score (lower = faster)."""

    def __init__(
        self,
        objective: str = "rank:pairwise",
        n_estimators: int = 80,
        max_depth: int = 5,
        learning_rate: float = 0.2,
        subsample: float = 0.9,
        colsample_bytree: float = 0.9,
        n_grades: int = 8,
        n_threads: int = 1,
        seed: int = 0,
    ) -> None:
        self.objective = objective
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.n_grades = n_grades
        self.n_threads = n_threads
        self.seed = seed

    def fit(self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None) -> XGBRankerModel:
        import xgboost as xgb

        if self.objective not in ("rank:pairwise", "rank:ndcg", "rank:map"):
            raise ValueError(
                f"objective must be rank:pairwise, rank:ndcg or rank:map, got {self.objective!r}"
            )
        Xa, ya = _check_fit_xy(X, y)
        _check_rows(len(ya), groups=groups, sample_weight=sample_weight)
        g = (
            np.zeros(len(ya), dtype=np.int64)
            if groups is None
            else np.unique(np.asarray(groups), return_inverse=True)[1]
        )
        order = np.argsort(g, kind="stable")
        Xa, ya, g = Xa[order], ya[order], g[order]
        t = normalise_targets(ya, g)
        rel = np.zeros(len(t))
        for gi in np.unique(g):
            m = g == gi
            # 0 = best; equal times share the best rank among them (a rank by row order made the ranker
            # learn the order of the rows: tasks of equal times, or of failures, became a ranking)
            v = t[m]
            r = np.searchsorted(np.sort(v), v, side="left") / max(1, m.sum() - 1)
            # grades: best 1% -> n_grades-1, then halving shares down to 0
            q = np.maximum(r, 1e-9)
            rel[m] = np.clip(np.floor(np.log2(0.01 / q)) + self.n_grades - 1, 0, self.n_grades - 1)
        d = xgb.DMatrix(Xa, rel, nthread=self.n_threads)
        d.set_group(np.bincount(g).astype(np.uint32)[np.unique(g)])
        params = _xgb_params(
            self.n_threads,
            self.max_depth,
            self.learning_rate,
            self.subsample,
            self.colsample_bytree,
            1.0,
            self.seed,
            self.objective,
        )
        with _xgb_quiet():
            self.booster_ = xgb.train(params, d, self.n_estimators)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {"rows": int(len(ya)), "tasks": int(len(np.unique(g)))}
        return self

    def predict(self, X: Any) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        with _xgb_quiet():
            return -np.asarray(self.booster_.inplace_predict(Xa), dtype=np.float64)

    def boosters(self) -> list[Any]:
        self._check_fitted()
        return [self.booster_]


class XGBEnsemble(CostModel):
    """A few XGBoost regressors on bootstrap resamples: `predict` is their mean, `predict_std` the spread."""

    def __init__(
        self,
        n_models: int = 3,
        n_estimators: int = 40,
        max_depth: int = 4,
        learning_rate: float = 0.3,
        subsample: float = 0.9,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 1.0,
        bootstrap: bool = True,
        n_threads: int = 1,
        normalise: bool = True,
        seed: int = 0,
    ) -> None:
        self.n_models = n_models
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.bootstrap = bootstrap
        self.n_threads = n_threads
        self.normalise = normalise
        self.seed = seed

    def fit(
        self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None, base_margin: Any = None
    ) -> XGBEnsemble:
        Xa, ya = _check_fit_xy(X, y)
        _check_rows(len(ya), groups=groups, sample_weight=sample_weight, base_margin=base_margin)
        if self.n_models < 1:
            raise ValueError(f"n_models must be >= 1, got {self.n_models}")
        t = normalise_targets(ya, groups) if self.normalise else ya
        rng = np.random.default_rng(self.seed)
        n = len(t)
        self.members_: list[XGBRegressorModel] = []
        bm = None if base_margin is None else np.asarray(base_margin, dtype=np.float64)
        for i in range(self.n_models):
            idx = rng.integers(0, n, size=n) if self.bootstrap and n > 2 else np.arange(n)
            w = None if sample_weight is None else np.asarray(sample_weight)[idx]
            m = XGBRegressorModel(
                self.n_estimators,
                self.max_depth,
                self.learning_rate,
                self.subsample,
                self.colsample_bytree,
                self.min_child_weight,
                self.n_threads,
                normalise=False,
                seed=self.seed * 1000 + i,
            )
            m.fit(Xa[idx], t[idx], sample_weight=w, base_margin=None if bm is None else bm[idx])
            self.members_.append(m)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {"rows": int(n), "members": self.n_models}
        return self

    def predict_all(self, X: Any, base_margin: Any = None) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        return np.vstack([m.predict(Xa, base_margin=base_margin) for m in self.members_])

    def predict(self, X: Any, base_margin: Any = None) -> np.ndarray:
        return self.predict_all(X, base_margin).mean(axis=0)

    def predict_std(self, X: Any, base_margin: Any = None) -> np.ndarray:
        return self.predict_all(X, base_margin).std(axis=0)

    def boosters(self) -> list[Any]:
        self._check_fitted()
        return [m.booster_ for m in self.members_]


class RandomForestModel(CostModel):
    """Baseline: scikit-learn's random forest on the per-task normalised log time (NaN features -> 0)."""

    def __init__(
        self,
        n_estimators: int = 100,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        n_jobs: int = 1,
        seed: int = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.n_jobs = n_jobs
        self.seed = seed

    def fit(self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None) -> RandomForestModel:
        from sklearn.ensemble import RandomForestRegressor

        Xa, ya = _check_fit_xy(X, y)
        _check_rows(len(ya), groups=groups, sample_weight=sample_weight)
        t = normalise_targets(ya, groups)
        self.forest_ = RandomForestRegressor(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            n_jobs=self.n_jobs,
            random_state=self.seed,
        )
        self.forest_.fit(np.nan_to_num(Xa, nan=0.0), t, sample_weight=sample_weight)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {"rows": int(len(ya))}
        return self

    def predict(self, X: Any) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        if not len(Xa):  # no rows: no predictions, as the boosted models answer (scikit-learn refuses)
            return np.zeros(0, dtype=np.float64)
        return np.asarray(self.forest_.predict(np.nan_to_num(Xa, nan=0.0)), dtype=np.float64)


class NoModel(CostModel):
    """Baseline "no model": a random order (what uniform random search assumes)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def fit(self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None) -> NoModel:
        Xa, _ = _check_fit_xy(X, y)
        _check_rows(len(Xa), groups=groups, sample_weight=sample_weight)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {"rows": int(len(Xa))}
        return self

    def predict(self, X: Any) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        return np.random.default_rng(self.seed).random(len(Xa))


MODELS: dict[str, type[CostModel]] = {
    "xgb": XGBRegressorModel,
    "xgb_rank": XGBRankerModel,
    "xgb_ensemble": XGBEnsemble,
    "random_forest": RandomForestModel,
    "none": NoModel,
}
