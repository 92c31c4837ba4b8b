"""Zero-shot prediction: the best config of a task that has no measurements of its own.

What production needs when a key was never tuned: related tasks of the same kernel family (other shapes,
other devices) were measured, the new one was not, and there is no time to measure. `ZeroShotPredictor`
is a cost model (the scikit-learn estimator contract of `models.py`) trained on the related tasks pooled,
one row per measured config, features = the config's (`features.schema_for_space`) plus the task's
(`features.task_features`: log2 of the problem dims, dtype size, device descriptor where known). Its
target is the config's regret in its own task, `log(time / the task's best time)`, clipped at
`regret_clip` (failed configs count as the clip): only the near-optimal region decides which config is
predicted best, so the model's capacity goes there rather than into how slow the slow configs are.
A small bagged ensemble (row subsampling, several seeds) averages away the pick-to-pick noise of a
single boosted model.

The device a task ran on counts through its family (`ZeroShotTask.device`, read by
`tuner.search_spaces.devices.device_family`): a vendor indicator and the vendor's instruction-set version
join the task features (`device_features`), and nothing where the label is not recognised.

`rank_space` scores every valid config of a new task's space (or a sample of a space too big to
enumerate). `predict_best` returns one config with its score: by default the ensemble chooses among
the related tasks' own winners (each task's best measured config, and the config with the best mean
regret over the tasks that measured it: what `transfer_best` measures first), restricted to the tasks
most like the new key's device (`FittedZeroShot.similar_anchors`: the same architecture, else the same
vendor, else all). Its own best-ranked config replaces that choice only when every ensemble member
scores it better, and never a winner measured on the same architecture. The related tasks' winners are
measured near-optimal configs; the model alone ranks better on average but misses more often by a
little (docs/benchmarks.md, "Zero-shot prediction"). Measured against the baselines (nearest key,
`transfer_best`'s first pick, the space default) by `benchmarks/predict_replay.py`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tuner.search_spaces.devices import DeviceFamily, device_family

from .features import FeatureSchema, schema_for_space
from .models import CostModel, XGBEnsemble, _check_fit_xy, _check_xy

__all__ = [
    "REGRET_CLIP",
    "PRESCREEN",
    "MAX_ROWS_PER_TASK",
    "ANCHORS_PER_TASK",
    "ZeroShotPredictor",
    "ZeroShotTask",
    "ZeroShotPick",
    "FittedZeroShot",
    "regret_targets",
    "related_winners",
    "fit_zero_shot",
    "device_features",
    "VENDORS",
]

log = logging.getLogger(__name__)

# Regret above 2x the task's best counts as 2x (log 2): the model only has to tell near-optimal configs
# apart. Measured in benchmarks/predict_replay.py against the unclipped median-normalised target of
# `normalise_targets` (docs/benchmarks.md, "Zero-shot prediction").
REGRET_CLIP = math.log(2.0)
# At most this many measurements of one related task train the model (a uniform sample beyond). Fewer
# rows fit faster but pick worse: 4000 per table took the replay geo-mean from 1.154 to 1.179
# (docs/benchmarks.md, "Zero-shot prediction").
MAX_ROWS_PER_TASK = 20_000
# `predict_best` considers each related task's best this many measured configs as anchors (1 to 5 gave
# the same share within 1.10x in the replay, docs/benchmarks.md, "Zero-shot prediction").
ANCHORS_PER_TASK = 1
# Vendors a device's family is told apart by (one indicator each, `device_features`).
VENDORS = ("nvidia", "amd", "intel", "google", "cpu")
# `predict_best` scores every candidate with one ensemble member and the best 5% with all of them.
PRESCREEN = 0.05


def regret_targets(
    y: Sequence[float] | np.ndarray,
    groups: Sequence[Any] | np.ndarray | None = None,
    clip: float = REGRET_CLIP,
) -> np.ndarray:
    """Per task (group): log(time / the task's best time), clipped at `clip`; failures (NaN, inf, <= 0)
    and tasks with no valid time at `clip`."""
    yy = np.asarray(y, dtype=np.float64)
    g = (
        np.zeros(len(yy), dtype=np.int64)
        if groups is None
        else np.unique(np.asarray(groups), return_inverse=True)[1]
    )
    out = np.full(len(yy), float(clip))
    for gi in np.unique(g):
        m = g == gi
        v = yy[m]
        ok = np.isfinite(v) & (v > 0)
        if not ok.any():
            continue
        lv = np.full(len(v), np.inf)
        lv[ok] = np.log(v[ok])
        out[m] = np.minimum(lv - lv[ok].min(), clip)
    return out


class ZeroShotPredictor(CostModel):
    """A bagged XGBoost ensemble on clipped per-task regret. `fit(X, y, groups)`: X = config + task
    features, y = measured time (NaN/inf = failed), groups = task ids; `predict(X)`: predicted regret
    (log scale; lower = faster; comparable across tasks, 0 = as good as the task's best)."""

    def __init__(
        self,
        n_models: int = 5,
        n_estimators: int = 100,
        max_depth: int = 6,
        learning_rate: float = 0.2,
        subsample: float = 0.8,
        colsample_bytree: float = 0.9,
        regret_clip: float = REGRET_CLIP,
        n_threads: int = 1,
        seed: int = 0,
    ) -> None:
        self.n_models = n_models
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.regret_clip = regret_clip
        self.n_threads = n_threads
        self.seed = seed

    def fit(self, X: Any, y: Any, groups: Any = None, sample_weight: Any = None) -> ZeroShotPredictor:
        Xa, ya = _check_fit_xy(X, y)
        if not (self.regret_clip > 0 and math.isfinite(self.regret_clip)):
            raise ValueError(f"regret_clip must be a positive number, got {self.regret_clip!r}")
        t = regret_targets(ya, groups, self.regret_clip)
        self.ensemble_ = XGBEnsemble(
            n_models=self.n_models,
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            subsample=self.subsample,
            colsample_bytree=self.colsample_bytree,
            bootstrap=False,
            n_threads=self.n_threads,
            normalise=False,
            seed=self.seed,
        ).fit(Xa, t, sample_weight=sample_weight)
        self.n_features_in_ = Xa.shape[1]
        self.training_summary_ = {
            "rows": int(len(ya)),
            "tasks": int(len(np.unique(groups))) if groups is not None else 1,
            "near_optimal": int((t < self.regret_clip).sum()),
        }
        return self

    def predict(self, X: Any) -> np.ndarray:
        Xa, _ = _check_xy(X)
        self._check_width(Xa)
        return self.ensemble_.predict(Xa)

    def boosters(self) -> list[Any]:
        self._check_fitted()
        return self.ensemble_.boosters()


@dataclass(frozen=True)
class ZeroShotTask:
    """One related task: its measured configs and times (None = failed), its task features and the
    device it was measured on (a label `tuner.search_spaces.devices.device_family` reads; "" = unknown)."""

    rows: Sequence[tuple[Mapping[str, Any], float | None]]
    features: Mapping[str, float] = field(default_factory=dict)
    name: str = ""
    device: str = ""


def device_features(device: str | DeviceFamily | None) -> dict[str, float]:
    """Task features of a device's family: one indicator per vendor of `VENDORS` and the vendor's own
    instruction-set version (`dev_<vendor>_isa`: the compute capability, the gfx target; one feature per
    vendor, missing for the others, as one vendor's numbers say nothing about another's). Nothing for an
    unknown device (the model then sees them as missing)."""
    fam = device if isinstance(device, DeviceFamily) else device_family(device or "")
    if not fam.known:
        return {}
    out = {f"dev_vendor_{v}": float(fam.vendor == v) for v in VENDORS}
    if fam.version == fam.version:  # not NaN
        out[f"dev_{fam.vendor}_isa"] = float(fam.version)
    return out


@dataclass(frozen=True)
class ZeroShotPick:
    config: dict[str, Any]
    score: float  # predicted regret, log scale (0 = as good as the related tasks' best)
    candidates: int  # how many configs were ranked
    tasks: int  # related tasks the model was trained on
    rows: int  # their measurements
    source: str = "model"  # "model" (the ensemble's own best) or "related task" (an anchor it preferred)


@dataclass
class FittedZeroShot:
    """A fitted predictor with the feature schema it was trained with (for one kernel family)."""

    model: ZeroShotPredictor
    schema: FeatureSchema
    tasks: int
    rows: int
    # the related tasks' winners (each task's best measured configs, then their consensus best)
    anchors: list[dict[str, Any]] = field(default_factory=list)
    # per anchor, the device families of the related tasks it won (none for the consensus alone)
    anchor_devices: list[tuple[DeviceFamily, ...]] = field(default_factory=list)

    def rank_space(
        self,
        space: Any,
        task: Mapping[str, float] | None = None,
        *,
        max_candidates: int = 20_000,
        seed: int = 0,
        device: str | None = None,
    ) -> tuple[list[dict[str, Any]], np.ndarray]:
        """(candidate configs, predicted regret per candidate): every valid config of an enumerable
        space, else `max_candidates` uniform samples (deduplicated). `device` as in `predict_best`."""
        names, keys, X = self._candidates(
            space, _with_device(task, device_family(device or "")), max_candidates, seed
        )
        return [dict(zip(names, k, strict=True)) for k in keys], self.model.predict(X)

    def _candidates(
        self, space: Any, task: Mapping[str, float] | None, max_candidates: int, seed: int = 0
    ) -> tuple[list[str], list[tuple], np.ndarray]:
        """(parameter names, candidate keys in that order, their feature matrix); configs are built
        only for what is returned (a dict per candidate costs more than scoring it)."""
        names = list(space.names)
        if space.is_enumerable:
            keys = list(space.iter_keys())
            if len(keys) > max_candidates:
                rng = np.random.default_rng(seed)
                keys = [keys[int(i)] for i in np.sort(rng.choice(len(keys), max_candidates, replace=False))]
        else:
            seen: dict[tuple, None] = {}
            for c in space.sample(seed, n=max_candidates):
                seen.setdefault(tuple(c[n] for n in names), None)
            keys = list(seen)
        if not keys:
            raise ValueError(f"space {getattr(space, 'name', '')!r} has no valid config")
        X = self.schema.transform_keys(names, keys, task)
        return names, keys, X

    def predict_best(
        self,
        space: Any,
        task: Mapping[str, float] | None = None,
        *,
        max_candidates: int = 20_000,
        prescreen: float = PRESCREEN,
        risk: float = 0.0,
        anchors: bool = True,
        device: str | None = None,
    ) -> ZeroShotPick:
        """The best-ranked config. With `prescreen` < 1, the first ensemble member scores every candidate
        and only its best share `prescreen` (at least 256) is scored by the whole ensemble: the same pick
        whenever the ensemble's best is in the first member's top share, at a fraction of the cost.
        `risk` > 0 ranks by the ensemble's mean plus `risk` times its members' spread (prefer configs
        every member rates well). With `anchors`, the related tasks' winners valid in `space` are scored
        too: the one the ensemble scores best is returned, unless every member scores the model's own
        pick lower (a rule with no threshold: the model overrides measured winners only unanimously).
        `device`: the new key's device label; its family's features (`device_features`) join `task`, and
        the anchors are the winners of the related tasks most like it (`similar_anchors`): on the same
        architecture (then the ensemble only chooses among them, its own pick never overrides a winner
        measured on the same architecture), else of the same vendor, else every winner (an unknown
        device: no device features, every winner an anchor, as without `device`)."""
        fam = device_family(device or "")
        task = _with_device(task, fam)
        names, configs, X = self._candidates(space, task, max_candidates)
        members = self.model.ensemble_.members_
        if prescreen < 1 and len(members) > 1 and len(configs) > 256:
            first = members[0].predict(X)
            keep = max(256, int(prescreen * len(configs)))
            idx = np.argpartition(first, keep - 1)[:keep]
        else:
            idx = np.arange(len(configs))
        near, level = self.similar_anchors(fam)
        valid = [self.anchors[i] for i in near if space.contains(self.anchors[i])] if anchors else []
        Xs = X[idx]
        if valid:  # the anchors ride along in the same ensemble call (one call per member, not two)
            Xs = np.vstack([Xs, self.schema.transform(valid, task)])
        both = self.model.ensemble_.predict_all(Xs)
        allm, am = both[:, : len(idx)], both[:, len(idx) :]
        scores = allm.mean(axis=0)
        rank = scores + risk * allm.std(axis=0) if risk else scores
        j = int(np.argmin(rank))
        i = int(idx[j])
        best = float(scores[j])
        if valid:
            a = int(np.argmin(am.mean(axis=0)))
            if level == "arch" or not bool((allm[:, j] < am[:, a]).all()):
                return ZeroShotPick(
                    dict(valid[a]),
                    float(am[:, a].mean()),
                    len(configs),
                    self.tasks,
                    self.rows,
                    "related task",
                )
        return ZeroShotPick(
            dict(zip(names, configs[i], strict=True)), best, len(configs), self.tasks, self.rows
        )

    def similar_anchors(self, family: DeviceFamily | None = None) -> tuple[list[int], str]:
        """(indices of the anchors `predict_best` weighs for a key on a device of `family`, how alike):
        the winners of the related tasks measured on the same architecture ("arch": sm86 and sm86, gfx90a
        and gfx90a) where there are any, else on the same vendor's devices ("vendor"), else every anchor
        ("any": an unknown device, or no related task of its vendor). Winners transfer best between
        devices of one architecture and worst across vendors (docs/benchmarks.md, "Zero-shot
        prediction")."""
        every = list(range(len(self.anchors)))
        if family is None or not family.known or len(self.anchor_devices) != len(self.anchors):
            return every, "any"
        arch = [
            i
            for i, ds in enumerate(self.anchor_devices)
            if family.arch and any(d.vendor == family.vendor and d.arch == family.arch for d in ds)
        ]
        if arch:
            return arch, "arch"
        same = [i for i, ds in enumerate(self.anchor_devices) if any(d.vendor == family.vendor for d in ds)]
        return (same, "vendor") if same else (every, "any")


def _with_device(task: Mapping[str, float] | None, family: DeviceFamily) -> Mapping[str, float] | None:
    return {**(task or {}), **device_features(family)} if family.known else task


def fit_zero_shot(
    space: Any,
    tasks: Sequence[ZeroShotTask],
    *,
    predictor: ZeroShotPredictor | None = None,
    max_rows_per_task: int = MAX_ROWS_PER_TASK,
    seed: int = 0,
) -> FittedZeroShot:
    """Fit a predictor on related tasks for ranking `space` (the feature schema is the space's, plus
    the task features that vary between the tasks). Tasks with no valid measurement are skipped; ValueError if
    none is left. At most `max_rows_per_task` rows of a task are used (a uniform sample beyond)."""
    usable = [t for t in tasks if any(v is not None and math.isfinite(v) and v > 0 for _, v in t.rows)]
    if not usable:
        raise ValueError("no related task with a successful measurement to learn from")
    families = [device_family(t.device) for t in usable]
    # the device's family (vendor, instruction-set version) joins each task's features
    usable = [
        ZeroShotTask(t.rows, {**t.features, **device_features(f)}, t.name, t.device) if f.known else t
        for t, f in zip(usable, families, strict=True)
    ]
    # A task feature with one value over every related task tells them nothing apart: left out.
    task_names = sorted(
        k for k in {k for t in usable for k in t.features} if len({t.features.get(k) for t in usable}) > 1
    )
    schema = schema_for_space(space, task_names)
    rng = np.random.default_rng(seed)
    xs, ys, gs = [], [], []
    for gi, t in enumerate(usable):
        rows = list(t.rows)
        if len(rows) > max_rows_per_task:
            rows = [rows[int(i)] for i in np.sort(rng.choice(len(rows), max_rows_per_task, replace=False))]
        xs.append(schema.transform([c for c, _ in rows], t.features))
        ys.append(np.array([np.nan if v is None else float(v) for _, v in rows], dtype=np.float64))
        gs.append(np.full(len(rows), gi))
    X, y, g = np.vstack(xs), np.concatenate(ys), np.concatenate(gs)
    model = (predictor or ZeroShotPredictor(seed=seed)).fit(X, y, g)
    winners, sources = _related_winners(space.names, usable, ANCHORS_PER_TASK)
    devices = [tuple(families[i] for i in won) for won in sources]
    return FittedZeroShot(model, schema, len(usable), int(len(y)), winners, devices)


def related_winners(
    names: Sequence[str], tasks: Sequence[ZeroShotTask], per_task: int = ANCHORS_PER_TASK
) -> list[dict[str, Any]]:
    """Each task's `per_task` fastest measured configs, then the config with the lowest mean log time
    over its task's best among the tasks that measured it successfully (`transfer_best`'s first pick);
    deduplicated, in that order. Configs missing one of `names` are skipped."""
    return _related_winners(names, tasks, per_task)[0]


def _related_winners(
    names: Sequence[str], tasks: Sequence[ZeroShotTask], per_task: int
) -> tuple[list[dict[str, Any]], list[tuple[int, ...]]]:
    """`related_winners`, and for each winner the indices of the tasks it won (none: the consensus)."""
    out: dict[tuple, dict[str, Any]] = {}
    source: dict[tuple, tuple[int, ...]] = {}
    total: dict[tuple, float] = {}
    count: dict[tuple, int] = {}
    first: dict[tuple, Mapping[str, Any]] = {}
    for ti, t in enumerate(tasks):
        ok = [
            (c, float(v))
            for c, v in t.rows
            if v is not None and math.isfinite(v) and v > 0 and all(n in c for n in names)
        ]
        if not ok:
            continue
        ok.sort(key=lambda cv: cv[1])
        lbest = math.log(ok[0][1])
        for c, _ in ok[:per_task]:
            k = _hkey(c, names)
            if k not in out:
                out[k] = {n: c[n] for n in names}
            source[k] = (*source.get(k, ()), ti)
        for c, v in ok:
            k = _hkey(c, names)
            total[k] = total.get(k, 0.0) + math.log(v) - lbest
            count[k] = count.get(k, 0) + 1
            first.setdefault(k, c)
    if total:
        k = min(total, key=lambda k: total[k] / count[k])
        if k not in out:
            out[k], source[k] = {n: first[k][n] for n in names}, ()
    return list(out.values()), [source[k] for k in out]


def _hkey(config: Mapping[str, Any], names: Sequence[str]) -> tuple:
    # bools and ints hash alike in Python (True == 1); keep them apart, as the search space does.
    return tuple((config[n], type(config[n]) is bool) for n in names)
