"""A Gaussian process over categorical codes with an overlap (Hamming) kernel, one weight per parameter.

    k(a, b) = s2 * exp(-sum_p theta_p * [a_p != b_p])

Two configs are as alike as the parameters they share, weighted by how much each parameter matters (the
transformed overlap kernel of CASMOPOLITAN, Wan et al. 2021; COMBO's diffusion kernel on the graph of
one-parameter moves has the same form). Unlike a kernel on the parameters' numeric values, it does not
assume that block width 48 behaves like 32 and 64; unlike trees fitted on few results, a value measured
only in configs that were slow for other reasons is not thereby predicted slow for a config that shares
everything else with a fast one.

Hyperparameters (log s2, log noise, log theta_p) maximise the marginal likelihood (L-BFGS-B, analytic
gradient) of the standardised targets. numpy and scipy only; fitting costs O(n^3) in the number of
results, so it is meant for the few hundred results of one search. A candidate of
`surrogate_screen.py` (search-notes.md, cold item 32), not part of the installed package.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["OverlapGP", "overlap_nll"]

_BOUNDS_S2 = (-3.0, 3.0)
_BOUNDS_NOISE = (-9.0, 1.0)
_BOUNDS_THETA = (-7.0, 2.5)


def _mismatch(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """(len(A), len(B), P) 0/1 array: whether parameter p differs between row i of A and row j of B."""
    return (A[:, None, :] != B[None, :, :]).astype(np.float64)


def overlap_nll(h: np.ndarray, D: np.ndarray, z: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood (without its constant) of targets `z` under the overlap GP with
    log hyperparameters `h` = (log s2, log noise, log theta_1..P), and its gradient in `h`; `D` is the
    training set's `_mismatch` with itself."""
    n = len(z)
    s2, sn2, th = math.exp(h[0]), math.exp(h[1]), np.exp(h[2:])
    SE = s2 * np.exp(-(D @ th))
    C = SE + (sn2 + 1e-8) * np.eye(n)
    try:
        L = np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(h)
    Li = np.linalg.solve(L, np.eye(n))
    Ci = Li.T @ Li
    a = Ci @ z
    f = 0.5 * float(z @ a) + float(np.log(np.diag(L)).sum())
    W = np.outer(a, a) - Ci  # d f / d C = -W / 2
    g = np.empty_like(h)
    g[0] = -0.5 * float(np.sum(W * SE))
    g[1] = -0.5 * float(np.trace(W)) * sn2
    g[2:] = 0.5 * np.einsum("ij,ijp->p", W * SE, D) * th
    return f, g


class OverlapGP:
    """Fit on integer codes (one column per parameter: the index of its value) and targets; predict the
    mean and standard deviation at other codes. `hyper` (log s2, log noise, log theta) can seed the next
    fit (`fit(..., warm=gp.hyper)`), or be reused without refitting (`fit(..., optimise=False)`)."""

    def __init__(self, maxiter: int = 60) -> None:
        self.maxiter = maxiter
        self.hyper: np.ndarray | None = None

    def fit(
        self, codes: np.ndarray, y: np.ndarray, *, warm: np.ndarray | None = None, optimise: bool = True
    ) -> OverlapGP:
        from scipy.optimize import minimize

        A = np.asarray(codes)
        y = np.asarray(y, dtype=np.float64)
        if A.ndim != 2 or len(A) != len(y) or len(y) < 2:
            raise ValueError("OverlapGP.fit needs a 2-D code matrix and at least two targets, one per row")
        P = A.shape[1]
        self._mu, self._sd = float(y.mean()), float(y.std()) or 1.0
        z = (y - self._mu) / self._sd
        D = _mismatch(A, A)
        h = warm if warm is not None and len(warm) == P + 2 else None
        if h is None:
            h = np.concatenate([[0.0, math.log(0.1)], np.full(P, math.log(0.5))])
        if optimise:
            bounds = [_BOUNDS_S2, _BOUNDS_NOISE] + [_BOUNDS_THETA] * P
            res = minimize(
                overlap_nll,
                h,
                args=(D, z),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": self.maxiter},
            )
            h = res.x
        self.hyper = np.asarray(h, dtype=np.float64)
        s2, sn2, th = math.exp(h[0]), math.exp(h[1]), np.exp(h[2:])
        C = s2 * np.exp(-(D @ th)) + (sn2 + 1e-8) * np.eye(len(z))
        self._L = np.linalg.cholesky(C)
        self._alpha = np.linalg.solve(self._L.T, np.linalg.solve(self._L, z))
        self._A, self._s2, self._th = A, s2, th
        return self

    def predict(self, codes: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) at the rows of `codes`, in the targets' units."""
        B = np.asarray(codes)
        mean = np.empty(len(B))
        var = np.empty(len(B))
        for lo in range(0, len(B), chunk):
            Ks = self._s2 * np.exp(-(_mismatch(B[lo : lo + chunk], self._A) @ self._th))
            mean[lo : lo + chunk] = Ks @ self._alpha
            v = np.linalg.solve(self._L, Ks.T)
            var[lo : lo + chunk] = np.maximum(self._s2 - (v * v).sum(axis=0), 1e-12)
        return self._mu + self._sd * mean, self._sd * np.sqrt(var)
