"""A process of tests/test_storage_concurrency.py: imports everything, waits for the start file, then opens
a fresh store at the same moment as the others, as a runtime caller (decorated calls) or a study worker
(`run_study`, as `tuner study run STUDY --workers 1` does). Prints one JSON line; any error is a traceback
on stderr and exit status 1."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    role, url, go, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    import tuner
    from tuner import PowerOfTwo, SearchSpace
    from tuner.studies import load_study, run_study

    def bench(call):
        return call()

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 64)]),
        key=["n"],
        budget=2,
        storage=url,
        bench=bench,
        name="race_kernel",
    )
    def kernel(n, *, block):
        return 1e-3 * block

    open(f"{go}.ready.{os.getpid()}", "w", encoding="utf-8").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    if role == "runtime":
        calls = int(arg)
        out = [kernel(i % 3) for i in range(calls)]
        print(json.dumps({"role": role, "calls": len(out)}))
        return 0
    spec = load_study(arg, storage=url, check_kernels=False)
    summary = run_study(spec, workers=1, executor="tests._study_fake:executor")
    print(json.dumps({"role": role, "counts": summary.counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
