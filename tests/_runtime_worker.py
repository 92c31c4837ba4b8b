"""A worker process for tests/test_runtime_procs.py: writes its share of cache entries into one shared
SQLite store, and calls a decorated function on keys that every worker also calls. Prints a JSON line
with how many times this process tuned each shared key."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    url, idx, n_own, n_shared, n_overlap, go = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
        sys.argv[6],
    )
    import tuner
    from tuner import PowerOfTwo, SearchSpace
    from tuner.runtime import CacheEntry, CacheKey, ConfigCache

    cache = ConfigCache(url)
    tuned: dict[int, int] = {}

    def bench(call):
        time.sleep(0.002)
        return call()

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 128)]),
        key=["n"],
        budget=3,
        storage=cache,
        bench=bench,
        name="shared_kernel",
    )
    def kernel(n, *, block):
        return 1e-3 * block

    while not os.path.exists(go):
        time.sleep(0.01)
    for i in range(n_own):
        key = CacheKey.make("own", "ab" * 16, {"worker": idx, "i": i}, ["float32"], "cpu", {"python": "3"})
        cache.put(CacheEntry(key, {"block": 16 << (i % 4)}, 1e-3 + i * 1e-6, 1e-7, "2026-01-01T00:00:00Z"))
        if i < n_shared:
            before = kernel.tuner.stats["tuned"]
            kernel(i)
            tuned[i] = kernel.tuner.stats["tuned"] - before
        if i < n_overlap:  # every worker writes these keys, with its own time: the fastest must win
            key = CacheKey.make("overlap", "cd" * 16, {"i": i}, [], "cpu", {})
            cache.put(CacheEntry(key, {"w": idx}, 1e-3 * (idx + 1), 0.0, "2026-01-01T00:00:00Z"))
    print(json.dumps({"tuned": tuned}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
