"""First-call (miss) time of @tuner.autotune as the store grows: 10, 100, 1000, 10000 stored keys.

For each size, a fresh SQLite store gets that many cache entries of one kernel (one shape family, the
realistic worst case: every entry is a neighbour) and 4 measurements per key, written in bulk. Then a
decorated pure-Python kernel (no device, a trivial bench) makes first calls on keys the store does not
hold: each call looks the key up, explains the miss, claims the key, loads the prior, tunes `--budget`
configs, records the trials and stores the winner. The figure is the median seconds per first call;
the baseline is the smallest store's figure in the same run (10 keys by default), and the ratio beside
each size is to it. The sizes take turns call by call (each leading a round in turn), so that other load on the
machine hits them alike.

Two strategies: `random` (no prior: the store's own cost) and `auto` (the default, which reads the
bounded prior of the newest related tasks and fits on it).

Run: PYTHONPATH=. python benchmarks/miss_scaling.py [--calls 20] [--budget 2] [--sizes 10,100,1000,10000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int, positive_ints, temp_dir, temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)


def _kernel(url: str, strategy: str, budget: int):  # noqa: ANN202
    import tuner
    from tuner import PowerOfTwo, SearchSpace

    def bench(call):  # noqa: ANN001, ANN202
        return call()

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 256), PowerOfTwo("warps", 1, 8)]),
        key=["n"],
        budget=budget,
        storage=url,
        bench=bench,
        strategy=strategy,
        name="miss_bench",
    )
    def kernel(n, *, block, warps):  # noqa: ANN001, ANN202
        return 1e-6 * (abs(block - 64) + 1) * (abs(warps - 4) + 1) * (1 + n % 7)

    return kernel


def populate(url: str, n_keys: int, per_key: int = 4) -> None:
    """n_keys cache entries of kernel 'miss_bench' (keys n = 0 .. n_keys-1) and per_key measurements each."""
    from sqlalchemy import insert

    from tuner.runtime._db import CacheEntryRow, ConfigCache, _row_values
    from tuner.runtime._entry import CacheEntry
    from tuner.store import MeasurementRow, TaskContext

    k = _kernel(url, "random", 1)
    cache = ConfigCache(url)
    entries, rows = [], []
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(n_keys):
        ck = k.tuner.full_key((i,), {})
        r = n_keys - 1 - i  # the newest keys hold the same measurements in every store: only the size differs
        cfg = {"block": 16 << (r % 5), "warps": 1 << (r % 4)}
        entries.append(CacheEntry(ck, cfg, 1e-4 + i * 1e-9, 1e-7, "2026-11-30T00:00:00Z", "bench"))
        task = TaskContext(
            kernel="miss_bench",
            problem=ck.fields_dict,
            device=ck.device,
            versions=ck.versions_dict,
            dtype=",".join(ck.dtypes),
        )
        for j in range(per_key):
            c = {"block": 16 << ((r + j) % 5), "warps": 1 << ((r + j) % 4)}
            rows.append(
                {
                    "task_id": task.task_id,
                    "kernel": "miss_bench",
                    "space_fingerprint": "bench",
                    "problem": dict(task.problem),
                    "dtype": task.dtype,
                    "device": task.device,
                    "versions": dict(task.versions),
                    "config": c,
                    "config_key": json.dumps(c, sort_keys=True),
                    "value": 1e-4 * (1 + j),
                    "status": "ok",
                    "stats": {},
                    "created_at": now,
                }
            )
    with cache.store.session() as s:
        vals = [_row_values(e) for e in entries]
        for i in range(0, len(vals), 5000):
            s.execute(insert(CacheEntryRow), vals[i : i + 5000])
        for i in range(0, len(rows), 5000):
            s.execute(insert(MeasurementRow), rows[i : i + 5000])


def first_call(kernel, n: int) -> float:  # noqa: ANN001
    before = kernel.tuner.stats["tuned"]
    t0 = time.perf_counter()
    kernel(n)  # a key the store does not hold
    dt_s = time.perf_counter() - t0
    assert kernel.tuner.stats["tuned"] == before + 1, kernel.tuner.stats
    return dt_s


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--calls", type=positive_int, default=20)
    ap.add_argument("--budget", type=positive_int, default=2)
    ap.add_argument("--sizes", type=positive_ints, default="10,100,1000,10000")
    ap.add_argument("--strategies", default="random,auto")
    a = ap.parse_args(argv)
    sizes: list[int] = a.sizes
    strategies = [s for s in a.strategies.split(",") if s]
    temp_tuner_home("tuner-bench-")  # before tuner is imported; removed at exit, unless the caller set it
    from tuner.strategies import STRATEGIES

    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        ap.error(
            f"--strategies: {', '.join(unknown) or 'none given'}; the strategies: {', '.join(STRATEGIES)}"
        )
    tmp = Path(temp_dir("tuner-miss-"))
    urls = {}
    for n in sizes:
        url = f"sqlite:///{tmp / f'store_{n}.db'}"
        t0 = time.perf_counter()
        populate(url, n)
        urls[n] = url
        print(
            f"store with {n} keys ({4 * n} measurements) written in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
    # warm-up (imports, xgboost) on a throwaway store, so the first size does not pay them
    for strat in strategies:
        warm = f"sqlite:///{tmp / f'warm_{strat}.db'}"
        populate(warm, 10)
        k = _kernel(warm, strat, a.budget)
        for i in range(2):
            first_call(k, 10**6 + i)
    # The sizes take turns call by call, so that load from elsewhere on the machine hits them alike.
    times: dict[tuple[str, int], list[float]] = {}
    for si, strat in enumerate(strategies):
        kernels = {n: _kernel(urls[n], strat, a.budget) for n in sizes}
        for i in range(a.calls):
            for n in sizes[i % len(sizes) :] + sizes[: i % len(sizes)]:  # each size leads a round in turn
                times.setdefault((strat, n), []).append(first_call(kernels[n], 10**6 + 10**4 * si + i))
    print(f"\nmedian seconds per first call ({a.calls} calls, budget {a.budget}), ratio to the 10-key store:")
    print(f"{'stored keys':>12} " + " ".join(f"{s:>18}" for s in strategies))
    for n in sizes:
        cells = []
        for strat in strategies:
            t = statistics.median(times[(strat, n)])
            b = statistics.median(times[(strat, sizes[0])])
            cells.append(f"{t * 1e3:9.1f} ms {t / b:5.2f}x")
        print(f"{n:>12} " + " ".join(f"{c:>18}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
