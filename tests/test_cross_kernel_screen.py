"""benchmarks/cross_kernel_screen.py: kernel-independent features and the random-pick baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests._scripts import benchmark_script

ck = benchmark_script("cross_kernel_screen")


@pytest.mark.parametrize("k", [1, 3, 10])
def test_random_baseline_matches_simulated_uniform_picks(k: int) -> None:
    rng = np.random.default_rng(0)
    true = np.exp(rng.normal(size=40)) + 1.0
    opt = float(true.min())
    closed = ck.random_best_log2(true, opt, k)
    sims = [math.log2(float(true[rng.choice(40, size=k, replace=False)].min()) / opt) for _ in range(20000)]
    assert closed == pytest.approx(float(np.mean(sims)), abs=0.01)
    if k == 1:
        assert closed == pytest.approx(float(np.mean(np.log2(true / opt))))


def test_common_features_take_the_first_present_name_and_mark_the_rest_missing() -> None:
    names = ["block_size_x", "log2_threads_per_block", "log2_work_per_thread"]
    F = np.array([[32.0, 7.0, 2.0], [64.0, 8.0, 1.0]])
    X = ck.common_features(names, F)
    assert X.shape == (2, len(ck.COMMON))
    cols = list(ck.COMMON)
    assert X[:, cols.index("threads")].tolist() == [7.0, 8.0]
    assert X[:, cols.index("work_per_thread")].tolist() == [2.0, 1.0]
    assert X[:, cols.index("threads_odd")].tolist() == [0.0, 0.0]  # absent odd part: powers of two
    assert np.isnan(X[:, cols.index("tile_area")]).all()  # absent: XGBoost's missing value
