"""Offline (and record) mode: time of a miss that takes the nearest cached key, in a store whose one shape
family holds N keys (default 100,000; the store of benchmarks/miss_scaling.py, written in bulk).

Run: PYTHONPATH=. python benchmarks/offline_miss_scaling.py [--keys 100000] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int, temp_dir, temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--keys", type=positive_int, default=100_000)
    ap.add_argument("--calls", type=positive_int, default=5)
    a = ap.parse_args(argv)
    temp_tuner_home("tuner-bench-")
    import logging

    import miss_scaling

    logging.disable(logging.WARNING)  # one warning per offline key
    url = f"sqlite:///{Path(temp_dir('tuner-offline-')) / 'store.db'}"
    t0 = time.perf_counter()
    miss_scaling.populate(url, a.keys)
    print(f"store with {a.keys} keys of one family written in {time.perf_counter() - t0:.1f}s", flush=True)
    k = miss_scaling._kernel(url, "random", 2)
    k(0)  # a stored key: opens the store
    os.environ["TUNER_MODE"], os.environ["TUNER_PREDICT"] = "offline", "0"
    times = []
    for i in range(a.calls):
        t0 = time.perf_counter()
        k(a.keys + 5000 + i)  # a key the store does not hold: the nearest stored key's config
        times.append(time.perf_counter() - t0)
    why = k.tuner.last_choice["why"]
    print(f"offline miss: median {1e3 * statistics.median(times):.0f} ms of {a.calls} ({why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
