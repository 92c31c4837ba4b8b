"""tuner: ML-guided autotuning for Triton and JAX Pallas kernels.

`import tuner` stays light: torch, jax, triton and xgboost are imported only by the paths that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._interrupt import install_if_command

install_if_command()  # the `tuner` command: a Ctrl-C while it imports exits 130 in one line

from ._layout import install_source_finder  # noqa: E402

install_source_finder()

from tuner.search_spaces import (  # noqa: E402
    Boolean,
    Categorical,
    Config,
    ConfigError,
    Constraint,
    IntRange,
    Param,
    PowerOfTwo,
    SearchSpace,
)

from ._optimize import AllTrialsFailedWarning, Trial, TuneResult, optimize  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AllTrialsFailedWarning",
    "Boolean",
    "Categorical",
    "Config",
    "ConfigError",
    "Constraint",
    "IntRange",
    "Param",
    "PowerOfTwo",
    "SearchSpace",
    "Trial",
    "TuneResult",
    "optimize",
    "ResultStore",
    "TaskContext",
    "autotune",
    "kernel",
    "load_cache",
    "ConfigCache",
    "tune_kernel",
    "__version__",
]

# Lazily imported public names (module, attribute): keeps SQLAlchemy and friends off the import path.
_LAZY = {
    "ResultStore": ("tuner.store", "ResultStore"),
    "TaskContext": ("tuner.store", "TaskContext"),
    "autotune": ("tuner.runtime", "autotune"),
    "kernel": ("tuner.runtime", "kernel"),
    "load_cache": ("tuner.runtime", "load_cache"),
    "ConfigCache": ("tuner.runtime", "ConfigCache"),
    "tune_kernel": ("tuner.tune", "tune_kernel"),
}

if TYPE_CHECKING:  # pragma: no cover
    from .runtime import ConfigCache, autotune, kernel, load_cache
    from .store import ResultStore, TaskContext
    from .tune import tune_kernel


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
