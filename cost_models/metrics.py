"""Ranking metrics of a cost model on one task: lower true value (time) is better, lower score is
predicted better. Failed configs (NaN or inf true value) count as the worst."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["top_k_recall", "ndcg_at_k", "spearman", "regret", "kept_count"]


def _arr(y: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(y, dtype=np.float64).ravel()
    return np.where(np.isfinite(a), a, np.inf)


def kept_count(n: int, share: float) -> int:
    """How many of n configs a share keeps (at least one)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    return max(1, math.ceil(share * n - 1e-9))


def top_k_recall(
    y_true: Sequence[float] | np.ndarray,
    y_score: Sequence[float] | np.ndarray,
    keep: float = 0.1,
    best: float = 0.01,
) -> float:
    """Share of the true best `best` fraction of configs that are among the `keep` fraction the model
    ranks first. 1.0 = pruning to `keep` loses none of the best configs."""
    t, s = _arr(y_true), np.asarray(y_score, dtype=np.float64).ravel()
    if len(t) != len(s) or len(t) == 0:
        raise ValueError("y_true and y_score must have the same non-zero length")
    n = len(t)
    true_best = set(np.argsort(t, kind="stable")[: kept_count(n, best)].tolist())
    kept = set(np.argsort(s, kind="stable")[: kept_count(n, keep)].tolist())
    return len(true_best & kept) / len(true_best)


def ndcg_at_k(
    y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray, k: int = 10
) -> float:
    """NDCG@k with relevance = optimum / time (1 for the best config, 0 for a failed one)."""
    t, s = _arr(y_true), np.asarray(y_score, dtype=np.float64).ravel()
    if len(t) != len(s) or len(t) == 0:
        raise ValueError("y_true and y_score must have the same non-zero length")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    opt = t.min()
    rel = np.where(np.isfinite(t), opt / t, 0.0) if math.isfinite(opt) else np.zeros(len(t))
    k = min(k, len(t))
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float((rel[np.argsort(s, kind="stable")[:k]] * disc).sum())
    idcg = float((np.sort(rel)[::-1][:k] * disc).sum())
    return dcg / idcg if idcg > 0 else 0.0


def _rank(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(len(a), dtype=np.float64)
    # average ties
    sa = a[order]
    i = 0
    while i < len(sa):
        j = i
        while j + 1 < len(sa) and sa[j + 1] == sa[i]:
            j += 1
        if j > i:
            r[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (ties averaged); 0.0 when either side is constant."""
    t, s = _arr(y_true), np.asarray(y_score, dtype=np.float64).ravel()
    if len(t) != len(s):
        raise ValueError("y_true and y_score must have the same length")
    if len(t) < 2:
        return 0.0
    rt, rs = _rank(t), _rank(s)
    rt, rs = rt - rt.mean(), rs - rs.mean()
    den = math.sqrt(float((rt**2).sum() * (rs**2).sum()))
    return float((rt * rs).sum() / den) if den > 0 else 0.0


def regret(y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray, k: int = 1) -> float:
    """Best true value among the model's top k, relative to the optimum, minus 1 (0 = found the best)."""
    t, s = _arr(y_true), np.asarray(y_score, dtype=np.float64).ravel()
    if len(t) != len(s) or len(t) == 0:
        raise ValueError("y_true and y_score must have the same non-zero length")
    got = t[np.argsort(s, kind="stable")[: max(1, k)]].min()
    return float(got / t.min() - 1.0)
