"""Cost models: features, the XGBoost models, baselines, metrics, JSON/UBJ persistence and pruning.

Importing this package does not import xgboost or scikit-learn; they load when a model is fitted.
"""

from __future__ import annotations

from .features import (
    FEATURE_SCHEMA_VERSION,
    FeatureSchema,
    SchemaMismatchError,
    schema_for_space,
    task_features,
)
from .metrics import ndcg_at_k, regret, spearman, top_k_recall
from .models import (
    MODELS,
    CostModel,
    NoModel,
    RandomForestModel,
    XGBEnsemble,
    XGBRankerModel,
    XGBRegressorModel,
    normalise_targets,
)
from .persist import load_model, save_model
from .pruning import PruningReport, pruning_report

__all__ = [
    "FEATURE_SCHEMA_VERSION",
    "FeatureSchema",
    "SchemaMismatchError",
    "schema_for_space",
    "task_features",
    "ndcg_at_k",
    "regret",
    "spearman",
    "top_k_recall",
    "MODELS",
    "CostModel",
    "NoModel",
    "RandomForestModel",
    "XGBEnsemble",
    "XGBRankerModel",
    "XGBRegressorModel",
    "normalise_targets",
    "load_model",
    "save_model",
    "PruningReport",
    "pruning_report",
]
