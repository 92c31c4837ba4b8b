"""Replay of recorded measurement tables (Kernel Tuner cache files, `.json` or `.json.gz`).

A table is a complete brute-forced search space measured on a real GPU: tuning "on" it costs a
dictionary lookup per evaluation, so search strategies can be compared without a GPU.

Read: Kernel Tuner's cache files in every version that writes them (no `schema_version`, 1.0.0, 1.1.0;
closed, or left open by an interrupted run), and the T4 results files that Kernel Tuner and the FAIR
Benchmark Hub write beside them (`{"results": [{"configuration", "measurements", "invalidity"}]}`).
The recorded objective is the file's `objective` (default `time`). Tuning minimises a cost: the value
itself when lower is better, its reciprocal when higher is better (`GFLOP/s`, `GB/s`, ...: the
reciprocal is the time per unit of work, so ratios to the optimum keep their meaning). The direction
comes from the caller, else from the file, else from Kernel Tuner's table of known objectives; an
objective nobody gave a direction for is refused, as Kernel Tuner refuses it.
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

from tuner._bounded import InputTooLarge, read_bounded
from tuner.search_spaces import Config, SearchSpace
from tuner.search_spaces._params import NONE_VALUE

__all__ = [
    "FAILURE_STRINGS",
    "KNOWN_OBJECTIVES",
    "ReplayTable",
    "ReplayFormatError",
    "load_table",
    "recorded_objective",
    "table_from_dict",
]

# The cache file's recorded objective; "time" in Kernel Tuner.
_DEFAULT_OBJECTIVE = "time"
# Kernel Tuner's objectives of known direction (its `objective_default_map`): True = higher is better.
KNOWN_OBJECTIVES: dict[str, bool] = {
    "time": False,
    "energy": False,
    "GFLOP/s": True,
    "TFLOP/s": True,
    "GB/s": True,
    "TB/s": True,
    "GFLOPS/W": True,
    "TFLOPS/W": True,
    "GFLOP/J": True,
    "TFLOP/J": True,
}
# The strings Kernel Tuner writes for a config that did not run (str() of its ErrorConfig classes).
FAILURE_STRINGS = frozenset({"InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig"})
# Kernel Tuner before 0.4 recorded a failed config as this time (ms); no kernel takes 1e20 ms.
_OLD_FAILURE_TIME = 1e20


class ReplayFormatError(ValueError):
    """The file is not a usable Kernel Tuner cache file; the message says why in one line."""


@dataclass
class ReplayTable:
    """A recorded table: the space of its configs and the cost of each (None = failed).

    `values` and `optimum` are costs, lower is better: the recorded value, or its reciprocal when
    `higher_is_better`; `recorded(cost)` converts back to the file's unit."""

    space: SearchSpace
    values: dict[tuple, float | None]
    device_name: str = ""
    kernel_name: str = ""
    problem_size: Any = None
    objective: str = _DEFAULT_OBJECTIVE
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    higher_is_better: bool = False

    def __post_init__(self) -> None:
        ok = [v for v in self.values.values() if v is not None]
        if not ok:
            raise ReplayFormatError(f"{self.path or 'table'}: every config failed; there is no optimum")
        self.optimum = min(ok)

    def recorded(self, cost: float) -> float:
        """A cost (what `values`, `optimum` and `objective_fn` hold: lower is better) in the file's own
        unit: the cost itself, or its reciprocal for a higher-is-better objective such as GFLOP/s."""
        return 1.0 / cost if self.higher_is_better else cost

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


def _not_a_cache_file(data: Mapping[str, Any]) -> str:
    """Why a JSON object without a 'cache' is not a table, naming what it looks like."""
    if "Results" in data and "Metadata" in data:
        return "a KTT (Kernel Tuning Toolkit) output file, not a Kernel Tuner cache file"
    if "metadata" in data and "results" not in data:
        return "a T4 metadata file (no results); replay the results file written beside it"
    if "data" in data and "tunable_parameters" in data:
        return "a Kernel Tuner results file (store_results: the best config per problem), not a cache file"
    return "no 'cache' object with the recorded configs (nor a T4 'results' list)"


def recorded_objective(data: Mapping[str, Any]) -> str:
    """The objective a Kernel Tuner cache document records (`time` when it names none). Kernel Tuner
    1.x writes it as a list (`"objective": ["time"]`; several names for a multi-objective run, the
    first being its primary objective), older versions as a string. A value that is neither names
    raises ReplayFormatError."""
    raw = data.get("objective")
    if isinstance(raw, list) and raw:
        raw = raw[0]
    if raw is None or raw == "" or raw == []:
        return _DEFAULT_OBJECTIVE
    if not isinstance(raw, str):
        raise ReplayFormatError(f"objective must be a name or a list of names, got {data.get('objective')!r}")
    return raw


def _direction(objective: str, data: Mapping[str, Any], higher_is_better: bool | None, where: str) -> bool:
    if higher_is_better is not None:
        return bool(higher_is_better)
    recorded = data.get("objective_higher_is_better")
    names = data.get("objective")
    if isinstance(recorded, list) and isinstance(names, list) and len(recorded) == len(names):
        # a multi-objective run's directions, one per recorded objective
        recorded = recorded[names.index(objective)] if objective in names else None
    if isinstance(recorded, bool):
        return recorded
    if objective in KNOWN_OBJECTIVES:
        return KNOWN_OBJECTIVES[objective]
    raise ReplayFormatError(
        f"{where}: objective {objective!r} has no known direction; say whether higher is better "
        f"(higher_is_better=True/False; CLI: --higher-is-better or --lower-is-better)"
    )


def _failed_entry(entry: Mapping[str, Any]) -> bool:
    """An entry that records a failure in a field other than the objective (Kernel Tuner records the
    failure under the tuning run's objective, so another recorded column is absent there)."""
    return any(isinstance(v, str) and v in FAILURE_STRINGS for v in entry.values())


def _cost(raw: Any, objective: str, higher_is_better: bool, ck: str, where: str) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ReplayFormatError(f"{where}: cache entry {ck!r}: {objective}={raw!r} is not a number")
    if isinstance(raw, str):
        return None  # Kernel Tuner records failures as strings ("CompilationFailedConfig", ...)
    try:
        finite = math.isfinite(raw)
    except OverflowError:  # an int beyond a float's range: infinite, as the literal 1e400 reads
        finite = False
    if not finite:
        return None  # NaN or infinity: nothing was measured
    if raw <= 0:
        raise ReplayFormatError(
            f"{where}: cache entry {ck!r}: {objective}={raw!r}; replay needs positive values "
            f"(a failure is recorded as a string such as 'RuntimeFailedConfig')"
        )
    if higher_is_better:
        return 1.0 / float(raw)
    return None if raw >= _OLD_FAILURE_TIME else float(raw)


def _keys_from_cache_key(ck: str, entry: Mapping[str, Any]) -> list[str] | None:
    """The parameter names of a file without tune_params_keys: Kernel Tuner's key is its parameter
    values joined with commas, and its entries list the parameters first, in that order."""
    parts = ck.split(",")
    names = list(entry)[: len(parts)]
    if len(names) == len(parts) and all(str(entry[n]) == part for n, part in zip(names, parts, strict=True)):
        return names
    return None


def _t4_to_cache(data: Mapping[str, Any], objective: str | None, where: str) -> tuple[dict[str, Any], str]:
    """A T4 results document as cache entries (configuration + the objective's measurement)."""
    results = data["results"]
    if not isinstance(results, list):
        raise ReplayFormatError(f"{where}: 'results' must be a list, got {type(results).__name__}")
    if objective is None:
        first = results[0] if results and isinstance(results[0], Mapping) else {}
        objectives = first.get("objectives")
        objective = objectives[0] if isinstance(objectives, list) and objectives else _DEFAULT_OBJECTIVE
        if not isinstance(objective, str):
            raise ReplayFormatError(f"{where}: objectives must be names, got {objective!r}")
    cache: dict[str, Any] = {}
    for i, r in enumerate(results):
        if not isinstance(r, Mapping) or not isinstance(r.get("configuration"), Mapping):
            raise ReplayFormatError(f"{where}: result {i} has no 'configuration' object")
        cfg = dict(r["configuration"])
        measured = {
            m.get("name"): m.get("value")
            for m in r.get("measurements") or []
            if isinstance(m, Mapping) and isinstance(m.get("name"), str)
        }
        entry: dict[str, Any] = dict(cfg)
        if r.get("invalidity", "correct") != "correct":
            entry[objective] = f"invalidity:{r.get('invalidity')}"  # a string: failed
        elif objective in measured:
            entry[objective] = measured[objective]
        cache[",".join(str(v) for v in cfg.values()) + f"#{i}"] = entry
    return cache, objective


def table_from_dict(
    data: Any,
    *,
    where: str = "table",
    objective: str | None = None,
    higher_is_better: bool | None = None,
) -> ReplayTable:
    """Build a ReplayTable from a parsed Kernel Tuner cache document (or a T4 results document).

    `objective` picks the recorded column (default: the file's `objective`, else `time`);
    `higher_is_better` its direction (default: the file's `objective_higher_is_better`, else Kernel
    Tuner's known objectives; an objective of unknown direction is refused)."""
    if not isinstance(data, Mapping):
        raise ReplayFormatError(f"{where}: top level must be a JSON object, got {type(data).__name__}")
    t4 = "cache" not in data and "results" in data
    cache: Any
    if t4:
        if not data["results"]:
            raise ReplayFormatError(f"{where}: the 'results' list has no entries")
        cache, objective = _t4_to_cache(data, objective, where)
        keys: Any = None
    else:
        cache = data.get("cache")
        if cache is None:
            raise ReplayFormatError(f"{where}: {_not_a_cache_file(data)}")
        if not isinstance(cache, Mapping):
            raise ReplayFormatError(f"{where}: 'cache' must be an object, got {type(cache).__name__}")
        if not cache:
            raise ReplayFormatError(f"{where}: the 'cache' object has no entries")
        if not objective:
            try:
                objective = recorded_objective(data)
            except ReplayFormatError as exc:
                raise ReplayFormatError(f"{where}: {exc}") from None
        keys = data.get("tune_params_keys")
    if not isinstance(objective, str):
        raise ReplayFormatError(f"{where}: objective must be a string, got {objective!r}")
    maximise = _direction(objective, data, higher_is_better, where)
    tune_params = None if t4 else _parse_tune_params(data.get("tune_params"), where)
    if keys is None and tune_params is not None:
        keys = list(tune_params)
    if keys is None:
        ck, first = next(iter(cache.items()))
        if not isinstance(first, Mapping):
            raise ReplayFormatError(f"{where}: cache entries must be objects")
        if t4:
            keys = [k for k in first if k != objective]
        else:
            keys = _keys_from_cache_key(str(ck), first)
            if keys is None:
                raise ReplayFormatError(
                    f"{where}: no tune_params_keys or tune_params, and the first entry's key {ck!r} does not "
                    f"spell its first fields: cannot tell the parameters from the measurements"
                )
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ReplayFormatError(f"{where}: tune_params_keys must be a non-empty list of names")
    if objective in keys:
        raise ReplayFormatError(f"{where}: the objective {objective!r} is also a tuning parameter")

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
            if v is None:  # Kernel Tuner takes None as a value; no space here holds it
                raise ReplayFormatError(f"{where}: cache entry {ck!r}: parameter {k!r}: {NONE_VALUE}")
            if isinstance(v, (list, dict)):
                raise ReplayFormatError(f"{where}: cache entry {ck!r}: {k}={v!r} is not a scalar")
            if isinstance(v, float) and not math.isfinite(v):
                raise ReplayFormatError(f"{where}: cache entry {ck!r}: {k}={v!r} is not finite")
        if entry.get("__error__") in FAILURE_STRINGS:  # newer Kernel Tuner's own failure marker
            val = None
        elif objective in entry:
            val = _cost(entry[objective], objective, maximise, str(ck), where)
        elif _failed_entry(entry):
            val = None
        else:
            raise ReplayFormatError(f"{where}: cache entry {ck!r} has no {objective!r} field")
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
        extra={"tune_params": tune_params, "format": "T4" if t4 else "cache"},
        higher_is_better=maximise,
    )


def load_table(
    path: str | Path, *, objective: str | None = None, higher_is_better: bool | None = None
) -> ReplayTable:
    """Load a Kernel Tuner cache file (`.json`, or gzip-compressed `.json.gz`), or a T4 results file.

    `objective` and `higher_is_better` as for `table_from_dict`. Raises ReplayFormatError (a
    ValueError) with a one-line reason for a missing file, bad JSON, no entries, inconsistent keys,
    a value that is not a positive number or a failure string, or an objective of unknown direction."""
    p = Path(path)
    where = str(p)
    if not p.exists():
        raise ReplayFormatError(f"{where}: no such file")
    if not p.is_file():
        raise ReplayFormatError(f"{where}: not a file")
    try:
        raw = read_bounded(p)  # size-checked, gunzipped with a bound on the expanded size
        text = raw.decode("utf-8")
    except InputTooLarge as exc:
        raise ReplayFormatError(
            f"{where}: cannot read ({exc.__class__.__name__}: {exc}); a table this big replays once slimmed "
            f"to its parameters and objective (benchmarks/slim_tables.py of tuner's repository)"
        ) from None
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ReplayFormatError(f"{where}: cannot read ({exc.__class__.__name__}: {exc})") from None
    except UnicodeDecodeError:
        raise ReplayFormatError(f"{where}: not UTF-8 text (is it a JSON file?)") from None
    text = text.strip()
    # Kernel Tuner writes its cache incrementally; an unfinished file ends without the closing braces,
    # also one whose last entry ends in "}}" (a dict-valued field last, as Kernel Tuner's own test file
    # open_cache_looks_like_closed.json has): a file that does not parse gets them, as Kernel Tuner's
    # correct_open_cache adds them.
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        data = None
        if text.startswith("{"):
            try:
                data = json.loads(text.rstrip(",\n ") + "}}")
            except (json.JSONDecodeError, RecursionError):
                data = None
        if data is None:
            raise ReplayFormatError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # nested deeper than the parser goes: no table is
        raise ReplayFormatError(f"{where}: not a table (JSON nested too deep to read)") from None
    return table_from_dict(data, where=where, objective=objective, higher_is_better=higher_is_better)
