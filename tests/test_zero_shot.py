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
    device_features,
    fit_zero_shot,
    regret_targets,
    related_winners,
)
from tuner.search_spaces.devices import device_family

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
    with pytest.raises(ValueError, match="y is None"):  # not an assert, which python -O strips
        ZeroShotPredictor().fit(X, None)


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


def _vendor_time(device: str, cfg: dict) -> float:
    """Block 64 is best everywhere; 4 warps on the NVIDIA GPUs, 1 on the AMD ones."""
    warps = 1 if device_family(device).vendor == "amd" else 4
    return 1e-3 * 1.3 ** (abs(math.log2(cfg["block"]) - 6) + abs(math.log2(cfg["warps"]) - math.log2(warps)))


def test_device_features_name_the_vendor_and_isa_version_or_nothing():
    f = device_features("NVIDIA GeForce RTX 3090")
    assert f["dev_vendor_nvidia"] == 1.0 and f["dev_vendor_amd"] == 0.0 and f["dev_nvidia_isa"] == 8.6
    assert "dev_amd_isa" not in f  # one vendor's version numbers are not another's
    assert device_features("AMD Instinct MI250X")["dev_amd_isa"] == 9.0
    assert device_features("a device nobody knows") == {} and device_features(None) == {}


def test_a_new_device_follows_its_vendors_tasks():
    devices = ["NVIDIA RTX A4000", "NVIDIA A100-PCIE-40GB", "AMD Radeon PRO W6600", "AMD Instinct MI250X"]
    tasks = [
        ZeroShotTask([(c, _vendor_time(d, c)) for c in SPACE.enumerate()], name=d, device=d) for d in devices
    ]
    fitted = fit_zero_shot(SPACE, tasks)
    nv, amd = {"block": 64, "warps": 4}, {"block": 64, "warps": 1}
    assert [c for c in fitted.anchors if c in (nv, amd)] == [nv, amd]
    # each winner knows the devices whose task it won; the consensus (if another config) won none
    won = {tuple(sorted(d.arch for d in ds)) for ds in fitted.anchor_devices}
    assert ("sm80", "sm86") in won and ("gfx1030", "gfx90a") in won

    # the anchors of a key: the winners on its architecture, else on its vendor's devices, else all
    def near(label: str) -> tuple[list[dict], str]:
        idx, level = fitted.similar_anchors(device_family(label))
        return [fitted.anchors[i] for i in idx], level

    assert near("AMD Radeon RX 7900 XTX") == ([amd], "vendor")
    assert near("AMD Instinct MI210") == ([amd], "arch")
    assert near("Tesla T4") == ([nv], "vendor")
    assert near("NVIDIA GeForce RTX 3090") == ([nv], "arch")
    every = (fitted.anchors, "any")
    assert near("?") == every and near("Intel Arc A770") == every
    # the picks: the vendor's best, from the model's own ranking too (device features), not only anchors
    for device, best in (("AMD Radeon RX 7900 XTX", amd), ("NVIDIA GeForce RTX 3090", nv)):
        assert fitted.predict_best(SPACE, device=device).config == best
        assert fitted.predict_best(SPACE, device=device, anchors=False).config == best
        configs, scores = fitted.rank_space(SPACE, device=device)
        assert configs[int(np.argmin(scores))] == best
    # an unknown device still gets a pick (one of the vendors' bests), from every winner
    assert fitted.predict_best(SPACE, device="a device nobody knows").config in (nv, amd)


def test_a_winner_on_the_same_architecture_is_never_overridden():
    # three sm80 tasks agree on block 64, 4 warps; one sm86 task measured two configs only, its winner
    # block 8, 1 warp: for a new sm86 key that winner is returned, whatever the model ranks first
    good = [
        ZeroShotTask([(c, _vendor_time("A100", c)) for c in SPACE.enumerate()], device="NVIDIA A100")
        for _ in range(3)
    ]
    odd = ZeroShotTask(
        [({"block": 8, "warps": 1}, 1e-3), ({"block": 1024, "warps": 8}, 2e-3)], device="NVIDIA RTX A4000"
    )
    fitted = fit_zero_shot(SPACE, [*good, odd])
    pick = fitted.predict_best(SPACE, device="NVIDIA GeForce RTX 3090")
    assert pick.config == {"block": 8, "warps": 1} and pick.source == "related task"
    # on another NVIDIA architecture (vendor level) every NVIDIA winner is an anchor, and the ensemble
    # prefers the A100s' one (it has learnt that from three tasks against one of two configs)
    own = fitted.predict_best(SPACE, device="Tesla V100", anchors=False)
    assert own.config == {"block": 64, "warps": 4}
    assert fitted.predict_best(SPACE, device="Tesla V100").config == own.config
