"""The runtime: the @autotune decorator, the config cache (in the store, in memory, in shipped files)
and offline fallbacks. See the Runtime section of README.md."""

from __future__ import annotations

from tuner._versions import backend_versions

from ._bench import cpu_bench, jax_bench, triton_bench
from ._db import ConfigCache, ImportCounts
from ._decorator import MODES, Autotuned, AutotunedKernel, autotune, set_cost_model_hook, set_global_cache
from ._entry import LIMITS, CacheEntry, EntryError
from ._file import (
    MAX_FILE_BYTES,
    SCHEMA_VERSION,
    CacheFileContents,
    CacheFileError,
    DroppedEntry,
    ReadOnlyCache,
    dumps_entries,
    load_cache,
    read_cache_contents,
    read_cache_file,
    write_cache_file,
)
from ._kernel import TunedKernel, kernel, kernel_cache_key, kernel_source_hash
from ._key import CacheKey, pow2_bucket, shape_distance
from ._misses import MissRow, read_misses
from ._predict import set_zero_shot
from ._prune import PruneCounts
from ._record import OFFLINE_TAIL, RECORD_TAIL  # registers record mode and the offline tail

__all__ = [
    "Autotuned",
    "AutotunedKernel",
    "CacheEntry",
    "CacheFileContents",
    "CacheFileError",
    "CacheKey",
    "ConfigCache",
    "DroppedEntry",
    "EntryError",
    "ImportCounts",
    "LIMITS",
    "MAX_FILE_BYTES",
    "MODES",
    "MissRow",
    "OFFLINE_TAIL",
    "RECORD_TAIL",
    "PruneCounts",
    "ReadOnlyCache",
    "SCHEMA_VERSION",
    "TunedKernel",
    "autotune",
    "backend_versions",
    "cpu_bench",
    "dumps_entries",
    "jax_bench",
    "kernel",
    "kernel_cache_key",
    "kernel_source_hash",
    "load_cache",
    "pow2_bucket",
    "read_cache_contents",
    "read_cache_file",
    "read_misses",
    "set_cost_model_hook",
    "set_global_cache",
    "set_zero_shot",
    "shape_distance",
    "triton_bench",
    "write_cache_file",
]
