"""Offline (and record) mode: time of a miss that takes the nearest cached key, in a store whose one shape
family holds N keys (default 100,000; the store of benchmarks/miss_scaling.py, written in bulk).

Run: PYTHONPATH=. python benchmarks/offline_miss_scaling.py [--keys 100000] [--calls 5] [--before TREE]

`--before TREE` times the same misses on the same store with the tuner of another checkout (a worktree of
an older commit), in a child process of the same run: the baseline beside the figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int, temp_dir, temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--keys", type=positive_int, default=100_000)
    ap.add_argument("--calls", type=positive_int, default=5)
    ap.add_argument("--before", default=None, metavar="TREE", help="also time the misses with this checkout")
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)  # the child's: a store written already
    a = ap.parse_args(argv)
    if a.before is not None and not (Path(a.before) / "tuner").is_dir():
        ap.error(f"--before {a.before}: not a checkout of tuner (no tuner/ folder)")
    temp_tuner_home("tuner-bench-")
    import logging

    import miss_scaling

    logging.disable(logging.WARNING)  # one warning per offline key
    url = a.url
    if url is None:
        url = f"sqlite:///{Path(temp_dir('tuner-offline-')) / 'store.db'}"
        t0 = time.perf_counter()
        miss_scaling.populate(url, a.keys)
        print(
            f"store with {a.keys} keys of one family written in {time.perf_counter() - t0:.1f}s", flush=True
        )
    k = miss_scaling._kernel(url, "random", 2)
    k(0)  # a stored key: opens the store
    os.environ["TUNER_MODE"], os.environ["TUNER_PREDICT"] = "offline", "0"
    times = []
    for i in range(a.calls):
        t0 = time.perf_counter()
        k(a.keys + 5000 + i)  # a key the store does not hold: the nearest stored key's config
        times.append(time.perf_counter() - t0)
    why = k.tuner.last_choice["why"]
    label = "before" if a.url is not None else "this tree"
    print(
        f"{label}: offline miss: median {1e3 * statistics.median(times):.0f} ms of {a.calls} ({why})",
        flush=True,
    )
    if a.before is not None:
        env = {**os.environ, "PYTHONPATH": str(Path(a.before).resolve())}
        env.pop("TUNER_MODE", None)
        args = ["--keys", str(a.keys), "--calls", str(a.calls), "--url", url]
        subprocess.run([sys.executable, __file__, *args], env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
