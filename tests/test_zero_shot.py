"""The zero-shot predictor (tuner.cost_models.zero_shot): its targets, the estimator contract, and that it
follows the problem size through task features (the best block grows with it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tuner.cost_models.zero_shot import (
    REGRET_CLIP,
    ZeroShotPredictor,
    ZeroShotTask,
    fit_zero_shot,
    regret_targets,
    related_winners,
)

from tuner import PowerOfTwo, SearchSpace


def test_regret_targets_are_per_task_clipped_log_regret():
    y = [1.0, 1.5, 100.0, float("nan"), 2.0, 2.0, -1.0]
    g = [0, 0, 0, 0, 1, 1, 2]
    t = regret_targets(y, g)
    assert t[0] == 0.0 and t[1] == pytest.approx(math.log(1.5))
    assert t[2] == REGRET_CLIP and t[3] == REGRET_CLIP  # slow and failed: the clip
    assert t[4] == t[5] == 0.0
    assert t[6] == REGRET_CLIP  # a task with no valid time


def test_estimator_contract():
    m = ZeroShotPredictor(n_models=2, n_estimators=5)
    assert m.get_params()["n_models"] == 2 and not hasattr(m, "ensemble_")
    X = np.random.default_rng(0).random((40, 3))
    y = 1 + X[:, 0]
    assert m.fit(X, y, groups=np.repeat([0, 1], 20)) is m
    assert m.n_features_in_ == 3 and m.predict(X).shape == (40,)
    with pytest.raises(ValueError, match="regret_clip"):
        ZeroShotPredictor(regret_clip=0).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        m.predict(X[:, :2])


SPACE = SearchSpace([PowerOfTwo("block", 8, 1024), PowerOfTwo("warps", 1, 8)])


def _time(n: int, cfg: dict) -> float:
    """The best block is n / 16, warps 4; every factor of two away costs 30%."""
    off = abs(math.log2(cfg["block"]) - math.log2(n / 16)) + abs(math.log2(cfg["warps"]) - 2)
    return 1e-3 * 1.3**off


def test_picks_the_best_config_of_an_unseen_shape():
    tasks = [
        ZeroShotTask([(c, _time(n, c)) for c in SPACE.enumerate()], {"log2_n": math.log2(n)})
        for n in (256, 1024, 4096, 16384)
    ]
    fitted = fit_zero_shot(SPACE, tasks)
    assert fitted.tasks == 4 and fitted.rows == 4 * len(SPACE.enumerate())
    # a shape it saw: its best; a shape between two it saw (n = 2048, best block 128): trees do not
    # interpolate, so one of its neighbours' bests (block 64 or 256), one step (1.3x) from the optimum
    assert fitted.predict_best(SPACE, {"log2_n": math.log2(4096)}).config == {"block": 256, "warps": 4}
    pick = fitted.predict_best(SPACE, {"log2_n": math.log2(2048)})
    assert pick.config in ({"block": 64, "warps": 4}, {"block": 256, "warps": 4})
    assert _time(2048, pick.config) == pytest.approx(1.3e-3)
    assert pick.candidates == len(SPACE.enumerate())
    configs, scores = fitted.rank_space(SPACE, {"log2_n": math.log2(2048)})
    assert configs[int(np.argmin(scores))] == pick.config


def test_no_usable_task_is_a_clear_error():
    with pytest.raises(ValueError, match="no related task"):
        fit_zero_shot(SPACE, [ZeroShotTask([({"block": 8, "warps": 1}, None)])])


def test_related_winners_are_each_tasks_best_then_their_consensus():
    a = {"block": 8, "warps": 1}
    b = {"block": 16, "warps": 1}
    c = {"block": 32, "warps": 1}
    tasks = [
        # task 0: a best, c 1.1x; task 1: b best, c 1.1x, a 3x; c is best on average (a failed-free mean)
        ZeroShotTask([(a, 1.0), (b, 2.0), (c, 1.1), ({"block": 64}, 0.5)]),
        ZeroShotTask([(a, 3.0), (b, 1.0), (c, 1.1), ({"block": 64, "warps": 1}, None)]),
        ZeroShotTask([(a, None)]),  # nothing measured successfully: contributes nothing
    ]
    # the config missing "warps" is skipped though it is the fastest row of task 0
    assert related_winners(SPACE.names, tasks) == [a, b, c]
    assert related_winners(SPACE.names, tasks, per_task=2) == [a, c, b]


def test_predict_best_keeps_a_related_winner_unless_every_member_prefers_its_own_pick():
    tasks = [
        ZeroShotTask([(c, _time(n, c)) for c in SPACE.enumerate()], {"log2_n": math.log2(n)})
        for n in (256, 1024, 4096, 16384)
    ]
    fitted = fit_zero_shot(SPACE, tasks)
    assert fitted.anchors[:4] == [{"block": b, "warps": 4} for b in (16, 64, 256, 1024)]
    task = {"log2_n": math.log2(2048)}
    own = fitted.predict_best(SPACE, task, anchors=False, prescreen=1)
    pick = fitted.predict_best(SPACE, task, prescreen=1)
    X = fitted.schema.transform([own.config, *fitted.anchors], task)
    per_member = fitted.model.ensemble_.predict_all(X)  # members x (own pick, anchors...)
    best_anchor = fitted.anchors[int(np.argmin(per_member[:, 1:].mean(axis=0)))]
    if (per_member[:, 0] < per_member[:, 1 + fitted.anchors.index(best_anchor)]).all():
        assert pick.config == own.config and pick.source == "model"
    else:
        assert pick.config == best_anchor and pick.source == "related task"
    # winners not valid in the new space are never returned: here no related winner is
    small = SearchSpace([PowerOfTwo("block", 8, 1024), PowerOfTwo("warps", 1, 2)])
    alone = fitted.predict_best(small, task)
    assert alone.source == "model" and alone.config["warps"] <= 2
