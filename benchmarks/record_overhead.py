"""What record mode costs per call, beside offline mode and a bare call, in one run.

Four callables of one trivial function (`f(n, *, block) -> block`), called with the same positional key:
- `bare`: the function itself with the config passed by hand;
- `offline hit`: `mode="offline"` with the key in a shipped cache (an exact entry);
- `record hit`: `mode="record"` with the key in the shipped cache (must cost what offline costs);
- `record miss`: `mode="record"` with a key nobody cached (the fallback's config, counting its calls).
Each is timed in `--rounds` rounds of `--calls` calls, the rounds interleaved; printed: the median ns per
call and the difference to `offline hit`. The miss log goes to a temporary folder.

    PYTHONPATH=$PWD python benchmarks/record_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from _tables import positive_int, temp_dir  # noqa: E402  (benchmarks/ is not a package)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=positive_int, default=100_000)
    ap.add_argument("--rounds", type=positive_int, default=15)
    args = ap.parse_args(argv)
    tmp = temp_dir("tuner-record-bench-")
    os.environ["TUNER_HOME"] = tmp
    os.environ["TUNER_MISSES_DIR"] = str(Path(tmp) / "misses")
    import logging

    logging.disable(logging.WARNING)
    import tuner
    from tuner import PowerOfTwo, SearchSpace
    from tuner.runtime import CacheEntry, ReadOnlyCache

    space = SearchSpace([PowerOfTwo("block", 16, 256)])

    def f(n: int, *, block: int) -> int:
        return block

    def make(mode: str, cache: ReadOnlyCache | None = None) -> object:
        return tuner.autotune(space, key=["n"], mode=mode, storage=False, cache=cache, name="bench_f")(f)

    probe = make("offline")
    ck = probe.tuner.full_key((1024,), {})  # type: ignore[attr-defined]
    shipped = ReadOnlyCache([CacheEntry(ck, {"block": 64}, 1e-3, 0.0, "2026-01-01T00:00:00Z")])
    fns = {
        "bare": lambda n: f(n, block=64),
        "offline hit": make("offline", shipped),
        "record hit": make("record", shipped),
        "record miss": make("record", shipped),
    }
    keys = {"bare": 1024, "offline hit": 1024, "record hit": 1024, "record miss": 4096}
    for name, fn in fns.items():  # resolve once (the miss path), outside the timing
        fn(keys[name])  # type: ignore[operator]
    per_call: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            n = keys[name]
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                fn(n)  # type: ignore[operator]
            per_call[name].append((time.perf_counter_ns() - t0) / args.calls)
    base = statistics.median(per_call["offline hit"])
    print(f"{args.rounds} rounds x {args.calls} calls, median ns per call (difference to offline hit)")
    for name, xs in per_call.items():
        m = statistics.median(xs)
        print(f"  {name:12s} {m:8.1f} ns  ({m - base:+.1f} ns)")
    from tuner.runtime import read_misses
    from tuner.runtime._misses import recorder

    recorder().flush()
    rows = read_misses()
    print(f"recorded: {[(r.key.fields_dict, r.calls) for r in rows]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
