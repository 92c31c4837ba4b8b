"""A process for tests/test_hung_configs.py: calls a decorated function whose config b=2 hangs while it
is timed (an endless loop, as a deadlocked kernel), in the store given, with a lease of 1 s. Touches
`<dir>/<name>-hangs` when it enters the hang, and prints the config its call used as a JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    url = sys.argv[1]
    os.environ["HANG_FLAG"] = str(Path(sys.argv[2]) / f"{sys.argv[3]}-hangs")  # the same code in each
    import tuner
    from tuner import SearchSpace

    timing = [False]

    def bench(call):  # noqa: ANN001, ANN202
        timing[0] = True
        try:
            return 1e-3 * call()
        finally:
            timing[0] = False

    space = SearchSpace.from_configs([{"b": 2}, {"b": 1}, {"b": 3}])

    @tuner.autotune(space, key=["n"], budget=3, storage=url, bench=bench, lease_s=1.0, name="hangs")
    def f(n: int, *, b: int) -> int:
        if b == 2 and timing[0]:
            Path(os.environ["HANG_FLAG"]).touch()
            while True:  # never returns
                time.sleep(0.05)
        return b

    print(json.dumps({"b": f(64), "why": f.tuner.last_choice.get("why", "")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
