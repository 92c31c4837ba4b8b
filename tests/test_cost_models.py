"""cost_models: estimator contract (one conformance suite for every model), features and schema,
JSON/UBJ persistence, schema refusal, metrics on hand-computed cases, pruning report."""

from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest
from tuner.cost_models import (
    FEATURE_SCHEMA_VERSION,
    FeatureSchema,
    NoModel,
    RandomForestModel,
    SchemaMismatchError,
    XGBEnsemble,
    XGBRankerModel,
    XGBRegressorModel,
    load_model,
    ndcg_at_k,
    normalise_targets,
    pruning_report,
    regret,
    save_model,
    schema_for_space,
    spearman,
    task_features,
    top_k_recall,
)
from tuner.cost_models.persist import sidecar_path
from tuner.search_spaces import SearchSpace
from tuner.search_spaces.devices import SM90

from tests.conftest import DATA
from tuner.replay import load_table

MODEL_FACTORIES = {
    "xgb": lambda: XGBRegressorModel(n_estimators=20, seed=1),
    "xgb_rank": lambda: XGBRankerModel(n_estimators=20, seed=1),
    "xgb_ensemble": lambda: XGBEnsemble(n_models=2, n_estimators=15, seed=1),
    "random_forest": lambda: RandomForestModel(n_estimators=20, seed=1),
    "none": lambda: NoModel(seed=1),
}


def _data(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 4, size=(n, 3))
    groups = np.repeat([0, 1], n // 2)
    # time grows with x0, a second task is 10x slower but ranks alike
    y = np.exp(X[:, 0] + 0.1 * X[:, 1]) * np.where(groups == 1, 10.0, 1.0)
    y[::17] = np.nan  # failures
    return X, y, groups


@pytest.mark.parametrize("name", sorted(MODEL_FACTORIES))
def test_estimator_contract(name: str) -> None:
    model = MODEL_FACTORIES[name]()
    # __init__ only stores hyperparameters: get_params gives back exactly the constructor arguments
    params = model.get_params()
    assert set(params) == {p for p in inspect.signature(type(model).__init__).parameters if p != "self"}
    assert not [k for k in vars(model) if k.endswith("_")], "no fitted state before fit"
    with pytest.raises(RuntimeError, match="not fitted"):
        model.predict(np.zeros((2, 3)))
    X, y, g = _data()
    assert model.fit(X, y, groups=g) is model
    assert model.n_features_in_ == 3
    p = model.predict(X)
    assert p.shape == (len(X),) and np.isfinite(p).all()
    with pytest.raises(ValueError, match="features"):
        model.predict(np.zeros((2, 4)))
    with pytest.raises(ValueError):
        type(model)(**params).fit(X, y[:-1])
    with pytest.raises(ValueError, match="1-D"):  # a 2-D y is refused as such, not as a row count
        type(model)(**params).fit(X, np.stack([y, y], axis=1))
    with pytest.raises(ValueError, match="y is None"):  # a ValueError, not an assert that python -O strips
        type(model)(**params).fit(X, None)
    assert model.predict(np.zeros((0, 3))).shape == (0,)  # no rows: no predictions, in every model
    # deterministic for the same hyperparameters
    assert np.allclose(type(model)(**params).fit(X, y, groups=g).predict(X), p)
    if name != "none":  # a real model ranks the easy case well (scores compare within a task)
        ok = np.isfinite(y) & (g == 0)
        assert spearman(y[ok], p[ok]) > 0.8
    model.set_params(**params)
    with pytest.raises(ValueError, match="invalid parameter"):
        model.set_params(bogus=1)


def test_normalise_targets_per_task() -> None:
    t = normalise_targets([1.0, 2.0, 4.0, 10.0, 20.0, 40.0, float("nan")], groups=[0, 0, 0, 1, 1, 1, 1])
    assert t[:3] == pytest.approx([-math.log(2), 0.0, math.log(2)])
    assert t[3:6] == pytest.approx(t[:3])
    assert t[6] == pytest.approx(math.log(2) + 0.5)  # worst of its task plus the margin


def test_ensemble_uncertainty_shrinks_near_data() -> None:
    X, y, g = _data(200)
    m = XGBEnsemble(n_models=4, n_estimators=20, seed=0).fit(X, y, groups=g)
    assert m.predict_std(X).shape == (len(X),)
    assert (m.predict_std(X) >= 0).all()


def test_ensemble_members_sample_different_columns() -> None:
    """Each member of an ensemble has its own seed, so its own column sample (`colsample_bytree`): without
    bootstrap or row subsampling that is all that sets them apart. XGBoost before 2.1.3 seeded its column
    sampler without the `seed` parameter, so every member drew the same columns and the ensemble's spread
    (its uncertainty) was zero; pyproject's `xgboost>=2.1.3` is for this."""
    rng = np.random.default_rng(0)
    X = rng.random((120, 8))
    y = X @ rng.random(8)
    m = XGBEnsemble(n_models=3, n_estimators=10, subsample=1.0, colsample_bytree=0.5, bootstrap=False)
    m.fit(X, y)
    assert float(m.predict_std(X).max()) > 0.0


# ---- features ------------------------------------------------------------------------------------
def test_schema_features_and_derived() -> None:
    table = load_table(DATA / "convolution_A100_sample.json")
    schema = schema_for_space(table.space)
    names = schema.names
    assert "log2_block_size_x" in names and "log2_threads_per_block" in names
    assert "log2_elements_per_thread" in names and "log2_block_extent_area" in names
    F = schema.transform(table.space.enumerate()[:5])
    cfg = table.space.enumerate()[0]
    row = dict(zip(names, F[0], strict=True))
    assert row["log2_threads_per_block"] == pytest.approx(
        math.log2(cfg["block_size_x"] * cfg["block_size_y"])
    )
    assert row["log2_block_extent_x"] == pytest.approx(math.log2(cfg["block_size_x"] * cfg["tile_size_x"]))
    # keys and dicts encode alike
    keys = list(table.space.iter_keys())[:5]
    assert np.allclose(schema.transform_keys(table.space.names, keys), F, equal_nan=True)


def test_alignment_features() -> None:
    """A domain that mixes powers of two with other sizes gets the log2 of each value's odd part, also for
    the threads per block and the block's extent; a power-of-two domain does not, and its schema is the
    version-1 document it was before alignment features existed."""
    space = SearchSpace.from_configs(
        [
            {"block_size_x": bx, "block_size_y": by, "tile_size_x": tx, "tile_size_y": 1}
            for bx in (16, 32, 48, 64, 96)
            for by in (1, 2)
            for tx in (1, 2, 3)
        ]
    )
    schema = schema_for_space(space)
    assert schema.version == 2
    odd = [n for n in schema.names if n.startswith("log2odd_")]
    assert odd == [
        "log2odd_block_size_x",
        "log2odd_tile_size_x",
        "log2odd_threads_per_block",
        "log2odd_block_extent_x",
    ]
    F = schema.transform(
        [
            {"block_size_x": 96, "block_size_y": 2, "tile_size_x": 3, "tile_size_y": 1},
            {"block_size_x": 64, "block_size_y": 1, "tile_size_x": 2, "tile_size_y": 1},
            {"block_size_x": 40, "block_size_y": 1, "tile_size_x": 1, "tile_size_y": 1},  # outside the domain
            {"block_size_y": 1, "tile_size_x": 1, "tile_size_y": 1},  # block_size_x missing
        ]
    )
    rows = [dict(zip(schema.names, r, strict=True)) for r in F]
    assert rows[0]["log2odd_block_size_x"] == pytest.approx(math.log2(3))
    assert rows[0]["log2odd_block_extent_x"] == pytest.approx(math.log2(9))  # 96 * 3 = 288 = 32 * 9
    assert rows[0]["log2odd_threads_per_block"] == pytest.approx(math.log2(3))  # 192 = 64 * 3
    assert rows[1]["log2odd_block_size_x"] == 0 and rows[1]["log2odd_block_extent_x"] == 0
    assert rows[2]["log2odd_block_size_x"] == pytest.approx(math.log2(5))
    assert math.isnan(rows[3]["log2odd_block_size_x"]) and math.isnan(rows[3]["log2odd_block_extent_x"])
    back = FeatureSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert back.fingerprint() == schema.fingerprint() and back.names == schema.names
    # powers of two only (or a constant odd part): no alignment column, version 1 as before
    plain = schema_for_space(
        SearchSpace.from_configs(
            [{"block_size_x": b, "tile_size_x": t} for b in (16, 32) for t in (3, 6, 12)]
        )
    )
    assert plain.version == 1 and not [n for n in plain.names if "odd" in n]
    assert "odd" not in json.dumps(plain.to_dict())


def test_schema_handles_foreign_configs_and_task_features() -> None:
    space = SearchSpace.from_configs([{"block_size_x": b, "kind": k} for b in (32, 64) for k in ("a", "b")])
    schema = schema_for_space(space, task_names=("log2_dim0", "dev_num_sms"))
    tf = task_features([4096], device=SM90)
    F = schema.transform([{"block_size_x": 48, "kind": "z"}, {"kind": "a"}], task=tf)
    row = dict(zip(schema.names, F[0], strict=True))
    assert row["block_size_x"] == 48 and row["kind=a"] == 0 and row["kind=b"] == 0
    assert row["task_log2_dim0"] == 12 and row["task_dev_num_sms"] == 132
    assert math.isnan(dict(zip(schema.names, F[1], strict=True))["block_size_x"])  # missing -> NaN
    assert (
        FeatureSchema.from_dict(json.loads(json.dumps(schema.to_dict()))).fingerprint()
        == schema.fingerprint()
    )


def test_features_tell_bools_and_numbers_apart_as_the_space_does() -> None:
    """The space compares True apart from 1 (`Param.has`), and so do the features: a Boolean's column
    read 1, 0, 1.0 and np.int64(1) as True/False (a related task or a prior recorded with 0/1 stood for
    configs it never measured), while a numeric column reads a bool as missing. Now a Boolean's column is
    1/0 for the bools alone and missing for anything else; a categorical holding both keeps them in
    columns of their own."""
    from tuner.search_spaces import Boolean, Categorical, IntRange

    probes = [True, False, np.True_, np.False_, 1, 0, 1.0, 0.0, np.int64(1), "True", 2]
    boolean = SearchSpace([Boolean("f"), IntRange("x", 1, 2)])
    numbers = SearchSpace([Categorical("f", [0, 1], ordered=True), IntRange("x", 1, 2)])
    mixed = SearchSpace([Categorical("f", [0, 1, True, False]), IntRange("x", 1, 2)])
    for space in (boolean, numbers):
        schema = schema_for_space(space)
        col = schema.transform([{"f": v, "x": 1} for v in probes])[:, schema.names.index("f")]
        for v, x in zip(probes, col, strict=True):
            has = space.params[0].has(v)
            # a value the space holds is its own number; one of the other kind (a bool for numbers, a
            # number for a Boolean) is missing, never the other kind's 1 or 0
            if has:
                assert x == float(v), (space.params[0].values, v)
            elif isinstance(v, (bool, np.bool_)) or space is boolean:
                assert math.isnan(x), (space.params[0].values, v, x)
    schema = schema_for_space(mixed)
    F = schema.transform([{"f": v, "x": 1} for v in (True, 1, 1.0, False, 0)])
    hot = [schema.names[int(j)] for j in F[:, :4].argmax(axis=1)]
    assert hot == ["f=True", "f=1", "f=1", "f=False", "f=0"] and (F[:, :4].sum(axis=1) == 1).all()
    # the pool's features of a Boolean space (keys) and of its configs agree
    sb = schema_for_space(boolean)
    keys = list(boolean.iter_keys())
    assert np.array_equal(
        sb.transform_keys(boolean.names, keys), sb.transform([boolean.config(k) for k in keys])
    )


def test_a_model_for_numbers_is_refused_for_a_boolean_naming_the_parameter(tmp_path) -> None:
    """A space whose flag is a Boolean and one whose flag is 0/1 have the same feature names (one column
    "f"), but the features differ (a number is missing for the Boolean): a model saved for one is refused
    for the other, and the message names the parameter instead of blaming a derived feature."""
    from tuner.search_spaces import Boolean, Categorical, IntRange

    boolean = schema_for_space(SearchSpace([Boolean("f"), IntRange("x", 1, 4)]))
    numbers = schema_for_space(SearchSpace([Categorical("f", [0, 1], ordered=True), IntRange("x", 1, 4)]))
    assert boolean.names == numbers.names and boolean.fingerprint() != numbers.fingerprint()
    X = numbers.transform([{"f": f, "x": x} for f in (0, 1) for x in range(1, 5)])
    path = save_model(
        XGBRegressorModel(n_estimators=3).fit(X, np.arange(1.0, 9.0)), tmp_path / "m.json", numbers
    )
    with pytest.raises(SchemaMismatchError, match="parameter 'f' is read as numbers in it, as a Boolean"):
        load_model(path, schema=boolean)


# ---- persistence ----------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".ubj"])
@pytest.mark.parametrize("name", ["xgb", "xgb_rank", "xgb_ensemble"])
def test_save_load_round_trip(tmp_path, name: str, suffix: str) -> None:
    table = load_table(DATA / "convolution_A100_sample.json")
    schema = schema_for_space(table.space)
    configs = table.space.enumerate()
    X = schema.transform(configs)
    y = np.array([table.lookup(c) or np.nan for c in configs])
    model = MODEL_FACTORIES[name]().fit(X, y)
    path = save_model(model, tmp_path / f"model{suffix}", schema, extra={"note": "test"})
    meta = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
    assert meta["feature_schema_fingerprint"] == schema.fingerprint() and meta["kind"] == type(model).__name__
    if suffix == ".json":
        json.loads(path.read_text(encoding="utf-8"))  # XGBoost's JSON model format
    loaded, loaded_schema, _ = load_model(path, schema=schema)
    assert loaded_schema.fingerprint() == schema.fingerprint()
    assert np.allclose(loaded.predict(X), model.predict(X))
    assert not list(tmp_path.glob("*.pkl")) and not list(tmp_path.glob(".*tmp*"))


def test_mismatched_schema_is_refused(tmp_path) -> None:
    table = load_table(DATA / "convolution_A100_sample.json")
    schema = schema_for_space(table.space)
    configs = table.space.enumerate()
    model = XGBRegressorModel(n_estimators=5).fit(
        schema.transform(configs), [table.lookup(c) or np.nan for c in configs]
    )
    path = save_model(model, tmp_path / "m.json", schema)
    other = schema_for_space(SearchSpace.from_configs([{"MWG": 16, "NWG": 32}, {"MWG": 32, "NWG": 32}]))
    with pytest.raises(SchemaMismatchError, match="another feature schema"):
        load_model(path, schema=other)
    assert schema.version == 2  # the sample's block widths mix 32 and 48: alignment features
    older = FeatureSchema(schema.params, schema.derived, schema.task, version=1)
    with pytest.raises(SchemaMismatchError, match="version 2, this space's is 1"):
        load_model(path, schema=older)
    newer = FeatureSchema(schema.params, schema.derived, schema.task, version=FEATURE_SCHEMA_VERSION + 1)
    with pytest.raises(SchemaMismatchError, match="newer than this code reads"):
        schema.check_compatible(newer)
    # a file from a newer tuner is refused also when no schema is given to check it against
    side = sidecar_path(path)
    meta = json.loads(side.read_text(encoding="utf-8"))
    meta["feature_schema"]["version"] = FEATURE_SCHEMA_VERSION + 1
    side.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(SchemaMismatchError, match="newer than this tuner reads"):
        load_model(path)


def test_random_forest_is_not_persisted(tmp_path) -> None:
    X, y, g = _data()
    rf = RandomForestModel(n_estimators=5).fit(X, y)
    schema = FeatureSchema(())
    with pytest.raises(TypeError, match="pickled"):
        save_model(rf, tmp_path / "rf.json", schema)


# ---- metrics -----------------------------------------------------------------------------------
def test_top_k_recall_hand_computed() -> None:
    y = np.arange(1, 201, dtype=float)  # best 1% = configs 0 and 1
    score = y.copy()
    score[1] = 1000.0  # the model ranks config 1 last
    assert top_k_recall(y, score, keep=0.1, best=0.01) == 0.5
    assert top_k_recall(y, y, keep=0.01, best=0.01) == 1.0
    assert top_k_recall(y, score, keep=1.0, best=0.01) == 1.0


def test_ndcg_hand_computed() -> None:
    y = np.array([1.0, 2.0, 4.0])  # relevance 1, 0.5, 0.25
    assert ndcg_at_k(y, y, k=3) == pytest.approx(1.0)
    # order 2, 1, 0: dcg = 0.25 + 0.5/log2(3) + 1/2
    dcg = 0.25 + 0.5 / math.log2(3) + 0.5
    idcg = 1.0 + 0.5 / math.log2(3) + 0.25 / 2
    assert ndcg_at_k(y, -y, k=3) == pytest.approx(dcg / idcg)
    assert ndcg_at_k([1.0, float("nan")], [1.0, 0.0], k=1) == 0.0  # the failed one first


def test_spearman_and_regret_hand_computed() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = (0, 0, 1, -1): 1 - 6*2/(4*15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    assert regret([2.0, 1.0, 4.0], [0.0, 1.0, 2.0], k=1) == pytest.approx(1.0)
    assert regret([2.0, 1.0, 4.0], [0.0, 1.0, 2.0], k=2) == 0.0


def test_pruning_report() -> None:
    y = np.arange(1, 101, dtype=float)
    perfect = [(y, y), (y, y)]
    rep = pruning_report(1000, perfect, target_recall=0.9)
    assert rep.keep_share == 0.01 and rep.kept == 10 and rep.estimated_recall == 1.0
    rep = pruning_report(1000)
    assert rep.keep_share == 1.0 and rep.estimated_recall is None
    assert "unknown" in str(rep)
    rng = np.random.default_rng(0)
    noisy = [(y, rng.permutation(y)) for _ in range(3)]
    assert pruning_report(1000, noisy, keep=0.5).estimated_recall is not None


def _saved_ensemble(tmp_path, seed: int = 1):
    table = load_table(DATA / "convolution_A100_sample.json")
    schema = schema_for_space(table.space)
    configs = table.space.enumerate()
    X = schema.transform(configs)
    y = np.array([table.lookup(c) or np.nan for c in configs])
    model = XGBEnsemble(n_models=3, n_estimators=5, seed=seed).fit(X, y if seed == 1 else y[::-1])
    return model, schema, X


def test_a_save_that_failed_part_way_leaves_no_model_that_loads(tmp_path) -> None:
    """Each file is replaced atomically, but an ensemble is several files: a save that failed at its third
    member (a full disk, a read-only file) left the new members 0 and 1 beside the old member 2 and the old
    sidecar, and load_model returned that mix of two models (neither one's predictions) without a word.
    The sidecar now holds each booster file's digest and load_model refuses a file that differs."""
    old, schema, X = _saved_ensemble(tmp_path, seed=1)
    path = save_model(old, tmp_path / "m.json", schema)
    new, _, _ = _saved_ensemble(tmp_path, seed=2)
    blocker = tmp_path / "m.2.json"
    old_member_2 = blocker.read_bytes()
    blocker.unlink()
    (blocker / "x").mkdir(parents=True)  # writing member 2 fails
    with pytest.raises(OSError):
        save_model(new, path, schema)
    (blocker / "x").rmdir()
    blocker.rmdir()
    blocker.write_bytes(old_member_2)
    with pytest.raises(ValueError, match=r"m\.json: not the booster file its sidecar"):
        load_model(path, schema=schema)
    save_model(new, path, schema)  # a save that finishes loads again
    assert np.allclose(load_model(path, schema=schema)[0].predict(X), new.predict(X))


@pytest.mark.parametrize(
    "damage",
    ["truncated", "empty", "pickle", "binary"],
)
def test_a_damaged_booster_file_is_a_value_error_naming_it(tmp_path, damage: str) -> None:
    """A truncated or foreign booster file raised XGBoost's own error with its C++ stack trace (or a
    UnicodeDecodeError); also where the sidecar predates the digests it is a ValueError naming the file."""
    import pickle

    model, schema, _ = _saved_ensemble(tmp_path)
    path = save_model(model, tmp_path / "m.json", schema)
    raw = path.read_bytes()
    path.write_bytes(
        {
            "truncated": raw[: len(raw) // 2],
            "empty": b"",
            "pickle": pickle.dumps({"a": 1}),
            "binary": b"\x00\x01garbage",
        }[damage]
    )
    with pytest.raises(ValueError, match=r"m\.json: not the booster file"):
        load_model(path)
    side = sidecar_path(path)
    meta = json.loads(side.read_text(encoding="utf-8"))
    del meta["sha256"]  # a sidecar saved before the digests
    side.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match=r"m\.json: not an XGBoost model file"):
        load_model(path)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: [m], "not a model sidecar"),
        (lambda m: None, "not a model sidecar"),
        (lambda m: {**m, "params": {"evil": 1}}, "hyperparameters"),
        (lambda m: {**m, "params": [1]}, "'params' must be"),
        (lambda m: {**m, "files": []}, "'files' must be"),
        (lambda m: {k: v for k, v in m.items() if k != "files"}, "'files' must be"),
        (lambda m: {**m, "files": ["../m.json", "/etc/passwd", "m.1.json"]}, "'files' must be"),
        (lambda m: {k: v for k, v in m.items() if k != "feature_schema"}, "no feature_schema"),
        (lambda m: {**m, "n_features_in": "x"}, "'n_features_in' must be"),
        (lambda m: {**m, "n_features_in": 3}, "the feature schema lists .* features, the model reads 3"),
    ],
)
def test_a_malformed_sidecar_is_a_value_error_naming_it(tmp_path, edit, match: str) -> None:
    """A sidecar that is JSON but not what save_model writes raised AttributeError, KeyError, TypeError or
    numpy's "need at least one array to concatenate"; a booster file name with a folder in it was read
    from outside the model's folder (or refused by pathlib's "Invalid name")."""
    model, schema, _ = _saved_ensemble(tmp_path)
    path = save_model(model, tmp_path / "m.json", schema)
    side = sidecar_path(path)
    side.write_text(json.dumps(edit(json.loads(side.read_text(encoding="utf-8")))), encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_model(path)


def test_features_of_values_no_float_holds_are_missing_and_fitting_on_inf_is_named() -> None:
    """A config outside the domain with an int beyond a float's range raised OverflowError from the
    schema's transform, and inf went into the matrix, where XGBoost refused the whole fit with its C++
    stack trace; both are missing values now (NaN), and a matrix with inf is refused by name."""
    space = SearchSpace.from_configs([{"BLOCK_M": 16, "w": 1.5}, {"BLOCK_M": 32, "w": 2.5}])
    schema = schema_for_space(space)
    X = schema.transform([{"BLOCK_M": 2**1100, "w": math.inf}, {"BLOCK_M": 32, "w": -math.inf}])
    assert np.isnan(X[0]).all() and np.isnan(X[1, 2]) and X[1, 0] == 32
    Xi = np.ones((4, 2))
    Xi[2, 1] = np.inf
    for name in sorted(MODEL_FACTORIES):
        with pytest.raises(ValueError, match=r"X holds inf \(column 1\)"):
            MODEL_FACTORIES[name]().fit(Xi, [1.0, 2.0, 3.0, 4.0])
