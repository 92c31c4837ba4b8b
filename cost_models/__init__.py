"""Cost models: features, the XGBoost ranker, baselines, metrics and JSON/UBJ persistence."""
