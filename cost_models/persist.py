"""Saving and loading cost models: XGBoost's own JSON/UBJ model format plus a JSON sidecar.

`save_model(model, path, schema)` writes `path` (the booster; `.json` or `.ubj`; an ensemble writes
`path` for member 0 and `<stem>.<i><suffix>` for the others) and `<path>.meta.json` holding the model
class, its hyperparameters, the feature schema, the format version and the training summary. Every file
is written to a temporary name and renamed, so a crash never leaves half a model. `load_model(path,
schema=...)` refuses a model trained on another feature schema. Nothing is pickled; a model that
XGBoost's format cannot hold (the random forest baseline) is refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner._atomic import atomic_write

from .features import FEATURE_SCHEMA_VERSION, FeatureSchema, SchemaMismatchError
from .models import CostModel, XGBEnsemble, XGBRankerModel, XGBRegressorModel

__all__ = ["save_model", "load_model", "FORMAT_VERSION", "sidecar_path"]

FORMAT_VERSION = 1
_KINDS: dict[str, type[CostModel]] = {
    "XGBRegressorModel": XGBRegressorModel,
    "XGBRankerModel": XGBRankerModel,
    "XGBEnsemble": XGBEnsemble,
}


def sidecar_path(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".meta.json")


def _member_path(path: Path, i: int) -> Path:
    return path if i == 0 else path.with_name(f"{path.stem}.{i}{path.suffix}")


def save_model(
    model: CostModel, path: str | Path, schema: FeatureSchema, *, extra: dict[str, Any] | None = None
) -> Path:
    """Save a fitted XGBoost-based model to `path` (.json or .ubj) with its JSON sidecar."""
    p = Path(path)
    if p.suffix not in (".json", ".ubj"):
        raise ValueError(f"{p}: the model file must end in .json or .ubj (XGBoost's formats)")
    kind = type(model).__name__
    if kind not in _KINDS:
        raise TypeError(
            f"{kind} cannot be saved: only XGBoost models persist (JSON/UBJ), and nothing is pickled"
        )
    boosters = model.boosters()  # type: ignore[attr-defined]
    if len(schema.names) != model.n_features_in_:  # type: ignore[attr-defined]
        raise ValueError(
            f"schema has {len(schema.names)} features, the model was fitted on {model.n_features_in_}"
        )  # type: ignore[attr-defined]
    files = []
    fmt = "json" if p.suffix == ".json" else "ubj"
    for i, b in enumerate(boosters):
        mp = _member_path(p, i)
        atomic_write(mp, bytes(b.save_raw(raw_format=fmt)))
        files.append(mp.name)
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "params": model.get_params(),
        "n_features_in": model.n_features_in_,  # type: ignore[attr-defined]
        "feature_schema": schema.to_dict(),
        "feature_schema_fingerprint": schema.fingerprint(),
        "training_summary": getattr(model, "training_summary_", {}),
        "files": files,
        "extra": extra or {},
    }
    atomic_write(sidecar_path(p), json.dumps(meta, indent=1, sort_keys=True, default=str).encode())
    return p


def load_model(
    path: str | Path, schema: FeatureSchema | None = None
) -> tuple[CostModel, FeatureSchema, dict[str, Any]]:
    """Load a model saved by `save_model`. With `schema`, a model trained on another feature schema is
    refused (SchemaMismatchError). Returns (model, its schema, the sidecar dict)."""
    import xgboost as xgb

    p = Path(path)
    side = sidecar_path(p)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such model file")
    if not side.exists():
        raise ValueError(f"{p}: no sidecar {side.name}; cannot tell which features the model expects")
    try:
        meta = json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{side}: not valid JSON ({exc.msg})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{side}: model format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    kind = meta.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"{side}: unknown model kind {kind!r}")
    saved = FeatureSchema.from_dict(meta["feature_schema"])
    if saved.version > FEATURE_SCHEMA_VERSION:  # its columns may be ones this code cannot compute
        raise SchemaMismatchError(
            f"{p}: feature schema version {saved.version}, newer than this tuner reads (up to "
            f"{FEATURE_SCHEMA_VERSION}); upgrade tuner or retrain the model"
        )
    if schema is not None:
        schema.check_compatible(saved, what=f"model {p.name}")
    model = _KINDS[kind](**meta["params"])

    def booster(name: str) -> Any:
        b = xgb.Booster()
        b.load_model(str(p.with_name(name)))
        return b

    files = meta["files"]
    if isinstance(model, XGBEnsemble):
        members = []
        for i, name in enumerate(files):
            m = XGBRegressorModel(
                model.n_estimators,
                model.max_depth,
                model.learning_rate,
                model.subsample,
                model.colsample_bytree,
                model.min_child_weight,
                model.n_threads,
                normalise=False,
                seed=model.seed * 1000 + i,
            )
            m.booster_ = booster(name)
            m.n_features_in_ = int(meta["n_features_in"])
            members.append(m)
        model.members_ = members
    else:
        model.booster_ = booster(files[0])  # type: ignore[attr-defined]
    model.n_features_in_ = int(meta["n_features_in"])  # type: ignore[attr-defined]
    model.training_summary_ = meta.get("training_summary", {})  # type: ignore[attr-defined]
    return model, saved, meta
