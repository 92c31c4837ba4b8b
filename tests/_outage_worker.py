"""A process for tests/test_store_outage.py: tunes key n=64 of a decorated function (configs b=1, 2, 3;
b=1 the fastest) in the store given, and prints the config its call chose as a JSON line. With `stop`,
the first timing of b=1 touches `<dir>/timing` and waits for `<dir>/go` (the test stops the store's
server in between; the mode is read at the call, so every run has the same key), so the timing returns while the store is down and the process then exits normally."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    url, folder, how = sys.argv[1:4]
    os.environ["OUTAGE_HOW"], os.environ["OUTAGE_DIR"] = how, folder  # read at the call: the same key
    import tuner
    from tuner.runtime import _sources

    _sources.STORE_RETRY_S = 0.2
    timed: list[int] = []

    def bench(call):  # noqa: ANN001, ANN202
        return 1e-3 * call()

    space = tuner.SearchSpace.from_configs([{"b": 2}, {"b": 1}, {"b": 3}])

    @tuner.autotune(space, key=["n"], budget=3, storage=url, bench=bench, lease_s=60.0, name="outage")
    def f(n: int, *, b: int) -> int:
        timed.append(b)
        where = Path(os.environ["OUTAGE_DIR"])
        if os.environ["OUTAGE_HOW"] == "stop" and b == 1 and timed.count(1) == 1:
            (where / "timing").touch()
            while not (where / "go").exists():
                time.sleep(0.02)
        return b

    print(json.dumps({"b": f(64), "timed": timed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
