"""cost_models with a user's own measurements: ties in the metrics and the ranker, per-row arguments of
another length, sidecars edited or moved, a schema in another column order, a prior value no float holds."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tuner.cost_models import SchemaMismatchError, load_model, save_model, schema_for_space
from tuner.cost_models.metrics import ndcg_at_k, regret, top_k_recall
from tuner.cost_models.models import XGBEnsemble, XGBRankerModel, XGBRegressorModel
from tuner.cost_models.persist import sidecar_path
from tuner.search_spaces import SearchSpace

import tuner


def test_metrics_of_tied_values_do_not_depend_on_the_order_of_the_rows() -> None:
    """A model that scores every config alike (one fitted on a single row, or on equal times) got recall
    1.0, NDCG 1.0 and regret 0 on a table sorted by time (ties were broken by row order, and the best row
    came first), and the worst values on the same table reversed; a table of equal times got recall 0.0
    though every kept config is among the best. Ties now count as their mean over the orders they allow."""
    t = np.arange(1.0, 101.0)  # a table sorted by time: the best row first
    flat = np.zeros(100)
    for y in (t, t[::-1]):
        # a random tenth holds the best 1 time in 10
        assert top_k_recall(y, flat, keep=0.1, best=0.01) == pytest.approx(0.1)
        assert regret(y, flat, k=1) == pytest.approx(float(np.mean(t)) - 1.0)  # a random pick's mean
        assert ndcg_at_k(y, flat, k=10) == pytest.approx(ndcg_at_k(t, flat, k=10))
    assert ndcg_at_k(t, flat, k=10) < 0.5
    # equal times: every config is among the best, whatever is kept
    assert top_k_recall(np.ones(100), np.arange(100.0)[::-1]) == 1.0
    # the best are the values, not the rows: two rows of time 1 and one kept holds the best 1 of 2 slots
    assert top_k_recall([1.0, 1.0, 2.0, 2.0], [0.0, 5.0, 1.0, 6.0], keep=0.5, best=0.5) == 0.5
    # scikit-learn's NDCG averages tied scores the same way
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(50):
        y = rng.integers(1, 5, 12).astype(float)
        s = rng.integers(0, 3, 12).astype(float)
        ref = sklearn_metrics.ndcg_score([y.min() / y], [-s], k=4)
        assert ndcg_at_k(y, s, k=4) == pytest.approx(ref)
        perm = rng.permutation(12)
        for f in (top_k_recall, regret, ndcg_at_k):
            assert f(y[perm], s[perm]) == pytest.approx(f(y, s))


def test_the_ranker_grades_equal_times_alike() -> None:
    """Relevance came from each row's place in its task with ties broken by row order, so a task of equal
    times (or of failures, which are all equally bad) taught the ranker the order of the rows."""
    rng = np.random.default_rng(0)
    X = rng.random((50, 3))
    for y in (np.ones(50), np.full(50, np.nan)):
        pred = XGBRankerModel(n_estimators=10).fit(X, y).predict(X)
        assert np.unique(pred).size == 1


@pytest.mark.parametrize("make", [XGBRegressorModel, XGBRankerModel, XGBEnsemble])
def test_groups_or_weights_of_another_length_are_refused_by_name(make) -> None:
    """The ranker fitted on as many rows as `groups` had and dropped the rest without a word; the
    regressors raised numpy's IndexError, and a short sample_weight XGBoost's C++ stack trace."""
    X, y = np.random.default_rng(0).random((6, 2)), np.arange(1.0, 7.0)
    with pytest.raises(ValueError, match=r"groups must hold one entry per row of X \(6\)"):
        make(n_estimators=2).fit(X, y, groups=[0, 0, 1])
    with pytest.raises(ValueError, match=r"sample_weight must hold one entry per row of X \(6\)"):
        make(n_estimators=2).fit(X, y, sample_weight=[1.0, 2.0])
    with pytest.raises(ValueError, match="sample_weight must be finite and >= 0, row 1"):
        make(n_estimators=2).fit(X, y, sample_weight=[1.0, -1.0, 1.0, 1.0, 1.0, 1.0])


def _configs(order: tuple[str, ...] = ("BLOCK", "load", "sw")) -> list[dict]:
    cfgs = [
        {"BLOCK": b, "load": ld, "sw": sw}
        for b in (16, 32, 48, 64)
        for ld in ("tensor_descriptor", "pointer")
        for sw in (True, False)
    ]
    return [{k: c[k] for k in order} for c in cfgs]


def _saved(tmp_path, make=XGBRegressorModel):
    cfgs = _configs()
    schema = schema_for_space(SearchSpace.from_configs(cfgs))
    X = schema.transform(cfgs)
    model = make(n_estimators=5).fit(X, np.random.default_rng(0).uniform(1, 2, len(cfgs)))
    return save_model(model, tmp_path / "m.json", schema), model, cfgs


def test_a_sidecar_whose_schema_was_edited_is_refused(tmp_path) -> None:
    """A parameter renamed (or added) in the sidecar's schema loaded: the model then read NaN for the
    renamed parameter's columns, or failed only at predict time on the feature count."""
    path, _, _ = _saved(tmp_path)
    side = sidecar_path(path)
    meta = json.loads(side.read_text(encoding="utf-8"))
    meta["feature_schema"]["params"][0]["name"] = "OTHER"
    side.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match=r"m\.json\.meta\.json: its feature_schema is not the one"):
        load_model(path)
    del meta["feature_schema_fingerprint"]  # no fingerprint to compare: the feature count still is
    meta["feature_schema"]["params"].append({"name": "x", "kind": "num"})
    side.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match="the feature schema lists 7 features, the model reads 6"):
        load_model(path)
    meta["feature_schema"]["params"][-1]["kind"] = "weird"
    side.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match="parameter 'x' has no kind num, bool or cat"):
        load_model(path)


@pytest.mark.parametrize("make", [XGBRegressorModel, XGBEnsemble])
def test_a_model_moved_to_another_name_with_its_sidecar_loads(tmp_path, make) -> None:
    """load_model read the booster file named in the sidecar instead of the file it was given: a model
    moved (with its sidecar) to another name failed on the old name, missing."""
    path, model, cfgs = _saved(tmp_path, make)
    path.rename(tmp_path / "prod.json")
    sidecar_path(path).rename(tmp_path / "prod.json.meta.json")
    loaded, schema, _ = load_model(tmp_path / "prod.json")
    assert np.array_equal(loaded.predict(schema.transform(cfgs)), model.predict(schema.transform(cfgs)))
    shutil.copy(tmp_path / "prod.json", tmp_path / "other.json")  # another model's booster is refused
    sidecar_path(tmp_path / "other.json").write_text(
        sidecar_path(tmp_path / "prod.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "other.json").write_bytes(b"{}")
    with pytest.raises(ValueError, match=r"other\.json: not the booster file"):
        load_model(tmp_path / "other.json")


def test_a_schema_of_the_same_features_in_another_order_is_named_as_such(tmp_path) -> None:
    """The same space built from a table with its columns in another order was refused with "features
    missing from it [], unknown to this space []", which names nothing."""
    path, _, _ = _saved(tmp_path)
    other = schema_for_space(SearchSpace.from_configs(_configs(("sw", "load", "BLOCK"))))
    with pytest.raises(SchemaMismatchError, match=r"same features in another order \(column 0 is 'BLOCK'"):
        load_model(path, schema=other)


def test_a_prior_value_no_float_holds_is_a_failure() -> None:
    """An int beyond a float's range in a prior raised a bare OverflowError; it fails, as 1e400 does."""
    space = SearchSpace.from_configs([{"a": 1}, {"a": 2}, {"a": 3}])
    prior = [[({"a": 1}, 10**400), ({"a": 2}, 2.0), ({"a": 3}, 3.0)]]
    r = tuner.optimize(space, lambda c: float(c["a"]), budget=3, prior=prior, strategy="transfer_best")
    assert r.best_value == 1.0
    assert tuner._optimize.validate_prior(prior)[0][0][1] is None
