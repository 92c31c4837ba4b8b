"""Replay of recorded measurement tables (Kernel Tuner cache files, `.json` or `.json.gz`).

A table is a complete brute-forced search space measured on a real GPU: tuning "on" it costs a
dictionary lookup per evaluation, so search strategies can be compared without a GPU.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner._bounded import read_bounded
from tuner.search_spaces import Config, SearchSpace

__all__ = ["ReplayTable", "ReplayFormatError", "load_table", "table_from_dict"]

# The cache file's recorded objective; "time" in Kernel Tuner.
_DEFAULT_OBJECTIVE = "time"


class ReplayFormatError(ValueError):
    """The file is not a usable Kernel Tuner cache file; the message says why in one line."""


@dataclass
class ReplayTable:
    """A recorded table: the space of its configs and the objective value of each (None = failed)."""

    space: SearchSpace
    values: dict[tuple, float | None]
    device_name: str = ""
    kernel_name: str = ""
    problem_size: Any = None
    objective: str = _DEFAULT_OBJECTIVE
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ok = [v for v in self.values.values() if v is not None]
        if not ok:
            raise ReplayFormatError(f"{self.path or 'table'}: every config failed; there is no optimum")
        self.optimum = min(ok)

    def key(self, config: Mapping[str, Any]) -> tuple:
        return self.space._hkey(self.space._key_unchecked(config))

    def lookup(self, config: Mapping[str, Any]) -> float | None:
        return self.values[self.key(config)]

    def objective_fn(self) -> Any:
        """A tuning objective: the recorded value, or an exception for a config that failed."""

        def objective(config: Config) -> float:
            v = self.lookup(config)
            if v is None:
                raise RuntimeError("recorded as failed")
            return v

        return objective

    def best_config(self) -> Config:
        k = min((k for k, v in self.values.items() if v is not None), key=lambda k: self.values[k])  # type: ignore[arg-type,return-value]
        return self.space.config([x for x, _ in k])

    def as_prior(self) -> list[tuple[Config, float | None]]:
        """The table as one prior task for `optimize(prior=...)`."""
        return [(self.space.config([x for x, _ in k]), v) for k, v in self.values.items()]

    @property
    def name(self) -> str:
        p = Path(self.path)
        return f"{p.parent.name}/{p.name.split('.')[0]}" if self.path else self.kernel_name


def _parse_tune_params(raw: Any, where: str) -> dict[str, list[Any]] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)  # a Python dict literal; literal_eval never runs code
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise ReplayFormatError(
                f"{where}: tune_params is a string that is not a dict literal ({exc})"
            ) from None
    if not isinstance(raw, Mapping):
        raise ReplayFormatError(f"{where}: tune_params must be a dict, got {type(raw).__name__}")
    return {str(k): list(v) if isinstance(v, (list, tuple)) else [v] for k, v in raw.items()}


def table_from_dict(data: Any, *, where: str = "table", objective: str | None = None) -> ReplayTable:
    """Build a ReplayTable from a parsed Kernel Tuner cache document."""
    if not isinstance(data, Mapping):
        raise ReplayFormatError(f"{where}: top level must be a JSON object, got {type(data).__name__}")
    cache = data.get("cache")
    if not isinstance(cache, Mapping):
        raise ReplayFormatError(f"{where}: no 'cache' object with the recorded configs")
    if not cache:
        raise ReplayFormatError(f"{where}: the 'cache' object has no entries")
    objective = objective or data.get("objective") or _DEFAULT_OBJECTIVE
    if not isinstance(objective, str):
        raise ReplayFormatError(f"{where}: objective must be a string, got {objective!r}")
    keys = data.get("tune_params_keys")
    tune_params = _parse_tune_params(data.get("tune_params"), where)
    if keys is None and tune_params is not None:
        keys = list(tune_params)
    if keys is None:
        first = next(iter(cache.values()))
        if not isinstance(first, Mapping):
            raise ReplayFormatError(f"{where}: cache entries must be objects")
        keys = [k for k in first if k not in _RESULT_FIELDS and k != objective]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ReplayFormatError(f"{where}: tune_params_keys must be a non-empty list of names")

    configs: list[dict[str, Any]] = []
    values: list[float | None] = []
    for ck, entry in cache.items():
        if not isinstance(entry, Mapping):
            raise ReplayFormatError(f"{where}: cache entry {ck!r} is not an object")
        missing = [k for k in keys if k not in entry]
        if missing:
            raise ReplayFormatError(
                f"{where}: cache entry {ck!r} lacks parameters {missing} (inconsistent keys)"
            )
        cfg = {k: entry[k] for k in keys}
        for k, v in cfg.items():
            if isinstance(v, (list, dict)) or v is None:
                raise ReplayFormatError(f"{where}: cache entry {ck!r}: {k}={v!r} is not a scalar")
            if isinstance(v, float) and not math.isfinite(v):
                raise ReplayFormatError(f"{where}: cache entry {ck!r}: {k}={v!r} is not finite")
        if objective not in entry:
            raise ReplayFormatError(f"{where}: cache entry {ck!r} has no {objective!r} field")
        raw = entry[objective]
        val: float | None
        if isinstance(raw, bool):
            raise ReplayFormatError(f"{where}: cache entry {ck!r}: {objective}={raw!r} is not a number")
        if isinstance(raw, (int, float)):
            val = float(raw) if math.isfinite(raw) and raw > 0 else None
        elif isinstance(raw, str):
            val = None  # Kernel Tuner records failures as strings ("CompilationFailedConfig", ...)
        else:
            raise ReplayFormatError(f"{where}: cache entry {ck!r}: {objective}={raw!r} is not a number")
        configs.append(cfg)
        values.append(val)
    try:
        space = SearchSpace.from_configs(configs, name=str(data.get("kernel_name") or where))
    except ValueError as exc:
        raise ReplayFormatError(f"{where}: {exc}") from None
    table_values = {space._hkey(k): v for k, v in zip(space._explicit or [], values, strict=True)}
    return ReplayTable(
        space=space,
        values=table_values,
        device_name=str(data.get("device_name") or ""),
        kernel_name=str(data.get("kernel_name") or ""),
        problem_size=data.get("problem_size"),
        objective=objective,
        path=where,
        extra={"tune_params": tune_params},
    )


_RESULT_FIELDS = {
    "time",
    "times",
    "compile_time",
    "verification_time",
    "benchmark_time",
    "strategy_time",
    "framework_time",
    "timestamp",
    "GFLOP/s",
    "gflops",
    "energy",
    "power",
}


def load_table(path: str | Path, *, objective: str | None = None) -> ReplayTable:
    """Load a Kernel Tuner cache file (`.json`, or gzip-compressed `.json.gz`).

    Raises ReplayFormatError (a ValueError) with a one-line reason for a missing file, bad JSON, no
    entries or inconsistent keys."""
    p = Path(path)
    where = str(p)
    if not p.exists():
        raise ReplayFormatError(f"{where}: no such file")
    if not p.is_file():
        raise ReplayFormatError(f"{where}: not a file")
    try:
        raw = read_bounded(p)  # size-checked, gunzipped with a bound on the expanded size
        text = raw.decode("utf-8")
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ReplayFormatError(f"{where}: cannot read ({exc.__class__.__name__}: {exc})") from None
    except UnicodeDecodeError:
        raise ReplayFormatError(f"{where}: not UTF-8 text (is it a JSON file?)") from None
    text = text.strip()
    # Kernel Tuner writes its cache incrementally; an unfinished file ends without the closing braces.
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        data = None
        if text.startswith("{") and not text.endswith("}}"):
            try:
                data = json.loads(text.rstrip(",\n ") + "}}")
            except json.JSONDecodeError:
                data = None
        if data is None:
            raise ReplayFormatError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return table_from_dict(data, where=where, objective=objective)
