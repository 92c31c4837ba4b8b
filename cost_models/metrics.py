"""Ranking metrics of a cost model on one task: lower true value (time) is better, lower score is
predicted better. Failed configs (NaN or inf true value) count as the worst.

Ties are order-free: the metrics do not depend on the order of the rows. Configs with equal true values
are equally good (when every time is equal, any config is among the best); configs with equal scores are
ones the model cannot tell apart, so a metric is its mean over the orders the tie allows (as
scikit-learn's `ndcg_score` and Spearman's averaged ranks count them): a model that scores every config
alike gets what a random order gets on average, however the rows happen to be sorted."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["top_k_recall", "ndcg_at_k", "spearman", "regret", "kept_count"]


def _arr(y: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(y, dtype=np.float64).ravel()
    return np.where(np.isfinite(a), a, np.inf)


def _pair(
    y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    t, s = _arr(y_true), np.asarray(y_score, dtype=np.float64).ravel()
    if len(t) != len(s) or len(t) == 0:
        raise ValueError("y_true and y_score must have the same non-zero length")
    # a NaN score ranks last, as argsort puts it (NaN == NaN is false: tied NaNs would not be seen as tied)
    return t, np.where(np.isnan(s), np.inf, s)


def _top(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The top k by score: (those surely in it, the tie group at its boundary, how many of that group
    it takes)."""
    kth = np.sort(s)[k - 1]
    sure = np.flatnonzero(s < kth)
    group = np.flatnonzero(s == kth)
    return sure, group, k - len(sure)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


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
    ranks first. 1.0 = pruning to `keep` loses none of the best configs.

    The best are the `best` share's smallest true values (a config whose time equals the last of them is
    as good: what counts is how many of those values the kept configs hold); configs the model scores
    alike at the edge of the kept share are each kept with equal chance, and the recall is its mean."""
    t, s = _pair(y_true, y_score)
    n = len(t)
    nb, nk = kept_count(n, best), kept_count(n, keep)
    edge = np.sort(t)[nb - 1]  # the last value among the best
    slots = nb - int((t < edge).sum())  # how many configs of that value the best hold
    sure, group, draws = _top(s, nk)
    below = int((t[sure] < edge).sum()) + int((t[group] < edge).sum()) * draws / len(group)
    at = int((t[sure] == edge).sum())  # kept surely, of the edge value
    hits = int((t[group] == edge).sum())  # of the edge value in the tie group: a share of them is kept
    # the edge-value configs kept from the tie group: hypergeometric (draws from the group, hits in it)
    lo, hi = max(0, draws - (len(group) - hits)), min(draws, hits)
    den = _log_comb(len(group), draws)
    edge_kept = sum(
        math.exp(_log_comb(hits, x) + _log_comb(len(group) - hits, draws - x) - den) * min(at + x, slots)
        for x in range(lo, hi + 1)
    )
    return float(min(1.0, (below + edge_kept) / nb))


def ndcg_at_k(
    y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray, k: int = 10
) -> float:
    """NDCG@k with relevance = optimum / time (1 for the best config, 0 for a failed one); configs scored
    alike share their mean relevance (scikit-learn's `ndcg_score` with `ignore_ties=False`)."""
    t, s = _pair(y_true, y_score)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    opt = t.min()
    rel = np.where(np.isfinite(t), opt / t, 0.0) if math.isfinite(opt) else np.zeros(len(t))
    k = min(int(k), len(t))
    disc = 1.0 / np.log2(np.arange(2, len(t) + 2))
    disc[k:] = 0.0
    cum = np.concatenate([[0.0], np.cumsum(disc)])
    # groups of equal score in rank order; each position in a group gets the group's mean relevance
    scores, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mean_rel = np.bincount(inverse, weights=rel) / counts
    ends = np.cumsum(counts)
    starts = ends - counts
    dcg = float((mean_rel * (cum[ends] - cum[starts])).sum())
    idcg = float((np.sort(rel)[::-1] * disc).sum())
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
    """Best true value among the model's top k, relative to the optimum, minus 1 (0 = found the best);
    where configs scored alike straddle the top k's edge, its mean over which of them are taken."""
    t, s = _pair(y_true, y_score)
    sure, group, draws = _top(s, min(max(1, int(k)), len(t)))
    best_sure = float(t[sure].min()) if len(sure) else math.inf
    g = np.sort(t[group])
    m = len(g)
    den = _log_comb(m, draws)
    # the i-th smallest of the group is the smallest taken with chance C(m - 1 - i, draws - 1) / C(m, draws)
    got = sum(
        math.exp(_log_comb(m - 1 - i, draws - 1) - den) * min(best_sure, float(g[i]))
        for i in range(m - draws + 1)
    )
    return float(got / t.min() - 1.0)
