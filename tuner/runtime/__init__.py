"""The runtime: the @autotune decorator, the config cache (in the store, in memory, in shipped files)
and offline fallbacks. See the Runtime section of README.md."""

from __future__ import annotations

from ._bench import cpu_bench, jax_bench, triton_bench
from ._db import ConfigCache, ImportCounts
from ._decorator import MODES, Autotuned, AutotunedKernel, autotune, set_cost_model_hook, set_global_cache
from ._entry import LIMITS, CacheEntry, EntryError
from ._file import (
    MAX_FILE_BYTES,
    SCHEMA_VERSION,
    CacheFileError,
    ReadOnlyCache,
    dumps_entries,
    load_cache,
    read_cache_file,
    write_cache_file,
)
from ._kernel import TunedKernel, backend_versions, kernel, kernel_cache_key, kernel_source_hash
from ._key import CacheKey, pow2_bucket, shape_distance

__all__ = [
    "Autotuned",
    "AutotunedKernel",
    "CacheEntry",
    "CacheFileError",
    "CacheKey",
    "ConfigCache",
    "EntryError",
    "ImportCounts",
    "LIMITS",
    "MAX_FILE_BYTES",
    "MODES",
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
    "read_cache_file",
    "set_cost_model_hook",
    "set_global_cache",
    "shape_distance",
    "triton_bench",
    "write_cache_file",
]
