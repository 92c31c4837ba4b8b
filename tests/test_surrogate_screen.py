"""benchmarks/surrogate_screen.py: the surrogate candidates ranked on random training sets of a table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests._scripts import benchmark_script

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"

ss = benchmark_script("surrogate_screen")


def test_screen_figures_are_ratios_to_the_optimum_and_share_the_training_set() -> None:
    res = ss.screen_table(str(SAMPLE), ["xgb", "random"], [8], seeds=3, top=4)
    xgb, rnd = res[("xgb", 8)], res[("random", 8)]
    assert len(xgb["log2"]) == len(rnd["log2"]) == 3
    for a in xgb["log2"] + rnd["log2"]:
        assert a >= 0.0 and math.isfinite(a)  # never better than the optimum
    # both candidates see the same training set: the figure is at most its best, which is the same
    from tuner.replay import load_table

    table = load_table(str(SAMPLE))
    n = len(table.values)
    for s in range(3):
        idx = np.random.default_rng([s, 8]).choice(n, size=8, replace=False)
        vals = [v for v in np.array(list(table.values.values()), dtype=object)[idx] if v is not None]
        bound = math.log2(min(vals) / table.optimum)
        assert xgb["log2"][s] <= bound + 1e-12 and rnd["log2"][s] <= bound + 1e-12
    again = ss.screen_table(str(SAMPLE), ["xgb"], [8], seeds=3, top=4)
    assert again[("xgb", 8)]["log2"] == xgb["log2"]  # deterministic per seed


def test_targets_are_the_strategys() -> None:
    y = ss.strategy_targets(np.array([1.0, 2.0, 4.0, 8.0, np.nan]))
    assert y[0] < y[1] and y[2] == y[3] == y[4] == pytest.approx(np.quantile(y, 0.5))


def test_main_prints_each_model_beside_random(capsys: pytest.CaptureFixture[str]) -> None:
    data = str(SAMPLE.parent)
    rc = ss.main(
        ["--data", data, "--files", SAMPLE.name, "--models", "xgb1,random", "--sizes", "6", "--seeds", "2"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "convolution_A100_sample" in out
    assert "\nxgb1     n=6: " in out and "\nrandom   n=6: " in out
    with pytest.raises(SystemExit):
        ss.main(["--data", data, "--files", SAMPLE.name, "--models", "nope"])
    with pytest.raises(SystemExit):
        ss.main(["--data", data, "--files", "missing*.json"])


def test_one_hot_has_one_column_per_value_and_one_hit_per_parameter() -> None:
    H = ss.one_hot([{"a": 1, "b": "x"}, {"a": 2, "b": "x"}, {"a": 1, "b": "y"}], ["a", "b"])
    assert H.shape == (3, 4)
    assert (H.sum(axis=1) == 2).all()  # one value of each of the two parameters
    assert (H[0] == H[2]).sum() == 2 and (H[0] == H[1]).sum() == 2  # they share one value


def test_ridge_candidates_rank_an_additive_table_right() -> None:
    # log time additive in two parameters: the ridge fit must put the best unseen config first
    configs = [{"a": a, "b": b} for a in range(6) for b in range(6)]
    y = np.array([0.3 * abs(c["a"] - 4) + 0.2 * abs(c["b"] - 1) for c in configs])
    H = ss.one_hot(configs, ["a", "b"])
    F = H.copy()
    best = next(i for i, c in enumerate(configs) if (c["a"], c["b"]) == (4, 1))
    others = np.array([i for i in range(len(configs)) if i != best])
    train = np.random.default_rng(0).choice(others, size=20, replace=False)
    assert H[train].sum(axis=0).min() > 0  # every value is measured; the best config itself is not
    rest = np.setdiff1d(np.arange(len(configs)), train)
    for name in ("ridge", "ridge_xgb"):
        score = ss.fit_ranker(name, F, train, y[train], 0, H=H)(rest)
        assert rest[int(np.argmin(score))] == best, name
    with pytest.raises(ValueError, match="one-hot"):
        ss.fit_ranker("ridge", F, train, y[train], 0)


def test_value_codes_index_each_varied_parameter_and_feed_the_overlap_gp() -> None:
    from tuner.replay import load_table

    table = load_table(str(SAMPLE))
    rows = table.as_prior()
    C = ss.value_codes([c for c, _ in rows], table.space.params)
    varied = [p for p in table.space.params if len(p.values) > 1]
    assert C.shape == (len(rows), len(varied))
    for j, p in enumerate(varied):
        assert [p.values[k] for k in C[:, j]] == [c[p.name] for c, _ in rows]
    res = ss.screen_table(str(SAMPLE), ["gp_overlap"], [8], seeds=2, top=4)
    assert all(a >= 0.0 and math.isfinite(a) for a in res[("gp_overlap", 8)]["log2"])
