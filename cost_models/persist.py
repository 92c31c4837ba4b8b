"""Saving and loading cost models: XGBoost's own JSON/UBJ model format plus a JSON sidecar.

`save_model(model, path, schema)` writes `path` (the booster; `.json` or `.ubj`; an ensemble writes
`path` for member 0 and `<stem>.<i><suffix>` for the others) and `<path>.meta.json` holding the model
class, its hyperparameters, the feature schema, the format version and the training summary. Every file
is written to a temporary name and renamed, so a crash never leaves half a file; the sidecar, written
last, holds each booster file's SHA-256, so a save that failed after replacing some files of a model (a full
disk while writing an ensemble's third member) leaves files that `load_model` refuses, never a model mixed
from two saves. `load_model(path, schema=...)` refuses a model trained on another feature schema, and a
file that is not what `save_model` writes (truncated, corrupt, edited, from a newer format) with a
`ValueError` naming it. Nothing is pickled; a model that XGBoost's format cannot hold (the random forest
baseline) is refused with a clear error.
"""

from __future__ import annotations

import hashlib
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
    digests = []
    fmt = "json" if p.suffix == ".json" else "ubj"
    for i, b in enumerate(boosters):
        mp = _member_path(p, i)
        raw = bytes(b.save_raw(raw_format=fmt))
        atomic_write(mp, raw)
        files.append(mp.name)
        digests.append(hashlib.sha256(raw).hexdigest())
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "params": model.get_params(),
        "n_features_in": model.n_features_in_,  # type: ignore[attr-defined]
        "feature_schema": schema.to_dict(),
        "feature_schema_fingerprint": schema.fingerprint(),
        "training_summary": getattr(model, "training_summary_", {}),
        "files": files,
        "sha256": digests,
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
        meta = json.loads(side.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{side}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{side}: not a model sidecar (a JSON {type(meta).__name__}, not an object)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{side}: model format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    kind = meta.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"{side}: unknown model kind {kind!r}")
    files, digests, params, n_features = _checked_meta(meta, side, p)
    if "feature_schema" not in meta:
        raise ValueError(f"{side}: not a model sidecar (no feature_schema)")
    try:
        saved = FeatureSchema.from_dict(meta["feature_schema"])
    except ValueError as exc:
        raise ValueError(f"{side}: {exc}") from None
    if saved.version > FEATURE_SCHEMA_VERSION:  # its columns may be ones this code cannot compute
        raise SchemaMismatchError(
            f"{p}: feature schema version {saved.version}, newer than this tuner reads (up to "
            f"{FEATURE_SCHEMA_VERSION}); upgrade tuner or retrain the model"
        )
    # an edited schema (a parameter renamed, one added) loaded, and the model then read other columns
    # than it was trained on (NaN for the renamed one) or failed only at predict, on the feature count
    fp = meta.get("feature_schema_fingerprint")
    if fp is not None and fp != saved.fingerprint():
        raise ValueError(
            f"{side}: its feature_schema is not the one the model was saved with (fingerprint "
            f"{saved.fingerprint()}, saved as {fp!r}): the sidecar was edited; save the model again"
        )
    if len(saved.names) != n_features:
        raise ValueError(
            f"{side}: the feature schema lists {len(saved.names)} features, the model reads {n_features}"
        )
    if schema is not None:
        schema.check_compatible(saved, what=f"model {p.name}")
    try:
        model = _KINDS[kind](**params)
    except TypeError as exc:
        raise ValueError(f"{side}: hyperparameters {sorted(params)} do not fit {kind} ({exc})") from None

    def booster(i: int, name: str) -> Any:
        # member 0 is the file asked for (save_model writes it at `path`): a model moved to another name
        # with its sidecar read the old name's file, missing, or another model's where one was saved there
        mp = p if i == 0 else p.with_name(name)
        try:
            raw = mp.read_bytes()
        except OSError as exc:
            raise ValueError(
                f"{mp}: booster file {i} of the model cannot be read ({exc.strerror or exc})"
            ) from None
        if digests is not None and hashlib.sha256(raw).hexdigest() != digests[i]:
            raise ValueError(
                f"{mp}: not the booster file its sidecar {side.name} was saved with (a save that did not "
                "finish, or a file changed since); save the model again"
            )
        if len(raw) < 2:  # XGBoost aborts the process on an empty buffer
            raise ValueError(f"{mp}: not an XGBoost model file ({len(raw)} bytes)")
        b = xgb.Booster()
        try:
            b.load_model(bytearray(raw))
        except (xgb.core.XGBoostError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{mp}: not an XGBoost model file ({first})") from None
        if b.num_features() != n_features:
            raise ValueError(
                f"{mp}: the booster reads {b.num_features()} features, its sidecar says {n_features}"
            )
        return b

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
            m.booster_ = booster(i, name)
            m.n_features_in_ = n_features
            members.append(m)
        model.members_ = members
    else:
        if len(files) != 1:
            raise ValueError(f"{side}: a {kind} has one booster file, the sidecar lists {len(files)}")
        model.booster_ = booster(0, files[0])  # type: ignore[attr-defined]
    model.n_features_in_ = n_features  # type: ignore[attr-defined]
    model.training_summary_ = meta.get("training_summary", {})  # type: ignore[attr-defined]
    return model, saved, meta


def _checked_meta(
    meta: dict[str, Any], side: Path, p: Path
) -> tuple[list[str], list[str] | None, dict[str, Any], int]:
    """The sidecar's booster file names, their SHA-256 (None in a sidecar saved before they were
    written), hyperparameters and feature count, or a ValueError naming the sidecar."""
    files = meta.get("files")
    if (
        not isinstance(files, list)
        or not files
        or not all(isinstance(f, str) and f and Path(f).name == f and f not in (".", "..") for f in files)
    ):
        raise ValueError(
            f"{side}: 'files' must be a non-empty list of file names beside {p.name}, got {files!r}"
        )
    digests = meta.get("sha256")
    if digests is not None and (
        not isinstance(digests, list)
        or len(digests) != len(files)
        or not all(isinstance(d, str) for d in digests)
    ):
        raise ValueError(f"{side}: 'sha256' must list one digest per booster file")
    params = meta.get("params")
    if not isinstance(params, dict):
        raise ValueError(f"{side}: 'params' must be an object of hyperparameters, got {params!r}")
    n = meta.get("n_features_in")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{side}: 'n_features_in' must be a non-negative int, got {n!r}")
    return files, digests, params, n
