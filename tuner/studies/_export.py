"""`tuner study export`: the best config of every finished task as a runtime cache file.

The file is the runtime's versioned cache format (`{"format": "tuner-cache", "schema_version": 1,
"entries": [...]}`, docs/cache-schema.json): one entry per task with the kernel name and source hash,
the key fields (the problem's shape fields and flags), the dtypes, the device it was measured on, the
versions that change code generation, the config, the median time and its spread in seconds, the date
and the search-space fingerprint, written and validated by the runtime's own writer (deterministic,
atomic). The key is `tuner.runtime._kernel.kernel_cache_key`, the function `tuner.kernel` builds its keys
with, so `tuner.kernel(name, cache=tuner.load_cache(file))` gets an exact hit for an exported task on the
same device with the same versions. (`_write_builtin` writes the same format without validation, for
tests that need a hand-made file.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The stored key of an entry comes from the runtime's `kernel_cache_key`, the one function that
# `tuner.kernel` computes its keys with, so an exported file is an exact hit there.
from tuner._atomic import atomic_write
from tuner._units import PER_SECOND, to_seconds
from tuner._versions import backend_versions
from tuner.runtime._kernel import kernel_cache_key, kernel_source_hash
from tuner.search_spaces._params import brief

from ._board import DONE, TaskRow
from ._spec import StudySpec, StudyTask

log = logging.getLogger(__name__)

__all__ = [
    "ExportResult",
    "ExportRefused",
    "NothingToDo",
    "export_study",
    "cache_entries",
    "kernel_source_hash",
    "FORMAT",
    "SCHEMA_VERSION",
]

FORMAT = "tuner-cache"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ExportResult:
    path: Path
    entries: int
    format: str  # "tuner.runtime writer" or "built-in writer (same format)"


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _versions(row: TaskRow) -> dict[str, str]:
    """The versions recorded when the task finished; this machine's for the backend if none were."""
    recorded = (row.result or {}).get("versions")
    if isinstance(recorded, Mapping) and recorded:
        return {str(k): str(v) for k, v in recorded.items()}
    return backend_versions(row.task.backend)


def _source_hash(row: TaskRow, current: str) -> str:
    """The hash of the kernel source the task was tuned on, recorded when it finished; the current one
    (`current`) for a result an older tuner recorded without it, with a warning: its config was measured
    on the kernel's code of then, which the hash can no longer tell from today's."""
    recorded = (row.result or {}).get("source_hash")
    if isinstance(recorded, str) and recorded:
        if recorded != current:
            log.warning(
                "task %s was tuned on another version of kernel %r's source (hash %s, now %s): its entry "
                "keeps the hash it was tuned on, so the current kernel misses it ('kernel source changed'); "
                "tune it again under a new study name to ship a config for the current code",
                row.key,
                row.task.kernel,
                recorded[:12],
                current[:12],
            )
        return recorded
    log.warning(
        "task %s: its result records no kernel source hash (it finished under an older tuner); exported "
        "under the current source of kernel %r, which may not be the code it was tuned on: if the kernel "
        "changed since, tune it again under a new study name",
        row.key,
        row.task.kernel,
    )
    return current


def entry_for(row: TaskRow) -> dict[str, Any] | None:
    """The cache entry (JSON form) of one finished task, or None if it has no successful config."""
    res = row.result or {}
    config = res.get("best_config", row.best_config)
    value = res.get("best_value", row.best_value)
    if (
        not isinstance(config, Mapping)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        return None
    unit = str(res.get("unit", "ms"))
    if unit not in PER_SECOND:  # an executor's own unit: its time cannot be written in seconds
        return None
    stats = res.get("best_stats") or {}
    spread = 0.0
    if isinstance(stats.get("q1"), (int, float)) and isinstance(stats.get("q3"), (int, float)):
        spread = to_seconds(float(stats["q3"]) - float(stats["q1"]), unit)
    elif isinstance(stats.get("std"), (int, float)):
        spread = to_seconds(float(stats["std"]), unit)
    t: StudyTask = row.task
    finished = dt.datetime.fromtimestamp(row.finished_at or 0, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    recorded = res.get("cache_key")
    if isinstance(recorded, Mapping):  # the executor built the key itself (a decorated function's)
        key_json: dict[str, Any] = dict(recorded)
        if isinstance(res.get("spread_s"), (int, float)):
            spread = float(res["spread_s"])
        finished = str(res.get("date") or finished)  # when the winner was measured
    elif "factory" in t.problem:  # a decorated function's task (from-misses --factory) without its key
        log.warning(
            "task %s: the result holds no runtime key for %r (tuned by an older tuner?); not exported: "
            "an entry under a made-up key would never hit (`tuner cache export` ships it from the store "
            "it was tuned into)",
            row.key,
            t.kernel,
        )
        return None
    else:
        device = str(res.get("device_name") or ("cpu" if t.device == "cpu" else t.device))
        key = kernel_cache_key(t.kernel, t.problem, backend=t.backend, device=device, versions=_versions(row))
        key_json = key.to_json()
        key_json["source_hash"] = _source_hash(row, str(key_json["source_hash"]))
    return {
        **key_json,
        "config": dict(config),
        "time_s": to_seconds(float(value), unit),
        "spread_s": max(0.0, spread if math.isfinite(spread) else 0.0),
        "date": finished,
        "space": str(res.get("space", "")),
    }


class NothingToDo(RuntimeError):
    """The study has nothing of what was asked (no finished task to report or export): exit 1, one line."""


class OutputNotWritable(RuntimeError):
    """The folder a report goes to cannot be written (a read-only study folder): exit 1, one line that
    names it and says to give another (`--out`). Nothing is written."""


class ExportRefused(RuntimeError):
    """The file the study would export is one `tuner cache import` would refuse: nothing is written."""


def cache_entries(spec: StudySpec) -> list[dict[str, Any]]:
    """The cache entries of the study's finished tasks (tasks removed from the study file left out)."""
    from ._runner import study_rows

    rows = study_rows(spec)
    stored = {r.key for r in rows}
    for t in spec.tasks:
        if t.key not in stored:
            log.warning(
                "task %s has no results in the study's database (it never ran under this key: `tuner study "
                "run` runs it); not exported",
                t.key,
            )
    out = []
    for r in rows:
        if r.status != DONE:
            log.warning("task %s is %s; not exported", r.key, r.status)
            continue
        unit = str((r.result or {}).get("unit", "ms"))
        if unit not in PER_SECOND:
            log.warning(
                "task %s: its times are in %r, none of the units the cache file's seconds are converted from "
                "(%s); not exported",
                r.key,
                unit,
                ", ".join(PER_SECOND),
            )
            continue
        e = entry_for(r)
        if e is None:
            best = (r.result or {}).get("best_value", r.best_value)
            if isinstance(best, (int, float)) and not isinstance(best, bool) and best <= 0:
                # an executor's own measure that is not a time (a score, a negated rate): a cache
                # entry holds a positive time
                log.warning("task %s: its best value %r is not a positive time; not exported", r.key, best)
            else:
                log.warning("task %s has no successful config; not exported", r.key)
            continue
        out.append(e)
    return out


def _entry_hash(e: Mapping[str, Any]) -> str:
    key = {k: e[k] for k in ("kernel", "source_hash", "key", "dtypes", "device", "versions")}
    return hashlib.sha256(_canon(key).encode()).hexdigest()[:32]


def _write_builtin(path: Path, entries: list[dict[str, Any]]) -> None:
    rows = sorted(entries, key=_entry_hash)
    body = ",\n".join("  " + json.dumps(e, sort_keys=True, allow_nan=False) for e in rows)
    text = (
        f'{{"format": "{FORMAT}", "schema_version": {SCHEMA_VERSION}, "entries": ['
        + ("\n" + body + "\n" if rows else "")
        + "]}\n"
    )
    atomic_write(path, text, mkdir=True)


def export_study(spec: StudySpec, out: str | os.PathLike[str]) -> ExportResult:
    """Write the study's cache file to `out` (atomically); returns where and how many entries.

    Raises `NothingToDo` when no task of the study has a winning config, and `ExportRefused` when the
    file would fail the importer's validation (the same function `tuner cache import` reads files with:
    size, entry count, schema, duplicate keys); nothing is written then."""
    path = Path(out)
    entries = cache_entries(spec)
    if not entries:
        from ._board import summarize
        from ._runner import study_rows

        c = summarize(study_rows(spec))
        raise NothingToDo(
            f"study {spec.name} has no finished task with a winning config: nothing to export "
            f"({c['done']} done, {c['failed']} failed, {c['pending']} pending, {c['running']} running)"
        )
    from tuner.runtime import write_cache_file
    from tuner.runtime._entry import EntryError, entry_from_json
    from tuner.runtime._file import CacheFileError, dumps_entries, parse_cache_bytes

    try:
        objs = [
            entry_from_json(e, where=f"the entry of {e['kernel']} {brief(e.get('key'))}") for e in entries
        ]
        parse_cache_bytes(dumps_entries(objs).encode("utf-8"), f"the export of study {spec.name}")
    except (EntryError, CacheFileError) as exc:
        raise ExportRefused(
            f"not written: tuner cache import would refuse it: {str(exc).splitlines()[0]}"
        ) from None
    write_cache_file(path, objs, mkdir=True)
    return ExportResult(path, len(objs), "tuner.runtime writer")
