"""Writing measurements as a Kernel Tuner cache file, the format `tuner.replay.load_table` reads.

Each entry holds the config's parameters, `time` (the median in milliseconds; a failure string such as
"CompilationFailedConfig" for a config that failed), the raw `times`, `compile_time` (ms) and tuner's own
`status` and `error`. The file is written atomically (temporary file + rename).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner._atomic import atomic_write
from tuner._units import s_to_ms

from ._result import COMPILE_ERROR, OUT_OF_RESOURCES, MeasureResult

__all__ = ["kernel_tuner_cache", "write_kernel_tuner_cache", "FAILURE_STRINGS"]

# Kernel Tuner's failure markers, by tuner status.
FAILURE_STRINGS = {
    COMPILE_ERROR: "CompilationFailedConfig",
    OUT_OF_RESOURCES: "RuntimeFailedConfig",
}


def _key(config: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ",".join(str(config[k]) for k in keys)


def kernel_tuner_cache(
    rows: Sequence[tuple[Mapping[str, Any], MeasureResult]],
    *,
    device_name: str,
    kernel_name: str,
    problem_size: Any,
    tune_params_keys: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The cache document for (config, result) rows (one per config)."""
    if not rows:
        raise ValueError("no measurements to write")
    keys = list(tune_params_keys or rows[0][0].keys())
    tune_params: dict[str, list[Any]] = {k: [] for k in keys}
    cache: dict[str, Any] = {}
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    for config, res in rows:
        if set(config) != set(keys):
            raise ValueError(f"config {dict(config)} does not have exactly the keys {keys}")
        for k in keys:
            if config[k] not in tune_params[k]:
                tune_params[k].append(config[k])
        ck = _key(config, keys)
        if ck in cache:
            raise ValueError(f"config {dict(config)} appears twice")
        entry: dict[str, Any] = {k: config[k] for k in keys}
        entry["time"] = res.median if res.ok else FAILURE_STRINGS.get(res.status, "RuntimeFailedConfig")
        entry["times"] = [float(t) for t in res.times]
        entry["compile_time"] = s_to_ms(res.compile_s or 0.0)
        entry["status"] = res.status
        if res.ok:
            entry["time_stats"] = {k: v for k, v in res.stats().items() if isinstance(v, (int, float))}
        if res.error:
            entry["error"] = res.error[:500]
        entry["timestamp"] = now
        cache[ck] = entry
    for k in keys:
        with contextlib.suppress(TypeError):  # mixed types: keep first-seen order
            tune_params[k].sort()
    doc: dict[str, Any] = {
        "device_name": device_name,
        "kernel_name": kernel_name,
        "problem_size": problem_size,
        "tune_params_keys": keys,
        "tune_params": tune_params,
        "objective": "time",
        "time_unit": "ms",
        "time_is": "median of times",
        "writer": "tuner",
    }
    if extra:
        doc["tuner"] = dict(extra)
    doc["cache"] = cache
    return doc


def write_kernel_tuner_cache(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write `doc` to `path` atomically (gzip when the name ends in .gz)."""
    p = Path(path)
    data = json.dumps(doc, indent=None, separators=(",", ":")).encode()
    if p.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    atomic_write(p, data, mkdir=True)
    return p
