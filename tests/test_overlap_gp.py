"""benchmarks/_overlap_gp.py: the categorical overlap-kernel GP used as a surrogate-screen candidate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from tests._scripts import benchmark_script

og = benchmark_script("_overlap_gp")
OverlapGP, overlap_nll = og.OverlapGP, og.overlap_nll


def test_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    A = rng.integers(0, 3, size=(25, 5))
    D = (A[:, None, :] != A[None, :, :]).astype(float)
    z = rng.normal(size=25)
    h = rng.normal(size=7) * 0.5
    _, g = overlap_nll(h, D, z)
    num = approx_fprime(h, lambda x: overlap_nll(x, D, z)[0], 1e-6)
    assert np.allclose(g, num, atol=1e-4)


def test_learns_which_parameter_matters_and_predicts_unseen_combinations() -> None:
    rng = np.random.default_rng(1)
    grid = np.array([(a, b, c) for a in range(4) for b in range(4) for c in range(4)])
    effect = np.array([0.0, 1.0, 2.0, 3.0])
    y_all = effect[grid[:, 0]] + 0.01 * grid[:, 2]  # parameter 0 decides, 2 barely, 1 not at all
    train = rng.choice(len(grid), size=30, replace=False)
    gp = OverlapGP().fit(grid[train], y_all[train])
    theta = np.exp(gp.hyper[2:])
    assert theta[0] > theta[1] and theta[0] > theta[2]
    test = np.setdiff1d(np.arange(len(grid)), train)
    mean, sd = gp.predict(grid[test])
    assert np.corrcoef(mean, y_all[test])[0, 1] > 0.95
    assert (sd > 0).all()
    # near a training point the spread is small; the warm start and the fixed hyperparameters agree
    again = OverlapGP().fit(grid[train], y_all[train], warm=gp.hyper, optimise=False)
    assert np.allclose(again.predict(grid[test])[0], mean)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two targets"):
        OverlapGP().fit(np.zeros((1, 2)), np.zeros(1))
    with pytest.raises(ValueError, match="one per row"):
        OverlapGP().fit(np.zeros((3, 2)), np.zeros(2))
