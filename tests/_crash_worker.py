"""A process for tests/test_hung_configs.py: calls a decorated function whose config b=2 kills its own
process while it is timed (`kill`: SIGKILL, as an OOM kill or a crash would; `abort`: SIGABRT, as an
illegal memory access that aborts; `exit`: os._exit; `none`: it does not), in the store given, with a lease of 60 s. Touches
`<dir>/<name>-crashes` just before it dies, and prints the config its call used as a JSON line."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main() -> int:
    url, folder, name, how = sys.argv[1:5]
    os.environ["CRASH_FLAG"] = str(Path(folder) / f"{name}-crashes")  # the same code in each
    os.environ["CRASH_HOW"] = how
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

    @tuner.autotune(space, key=["n"], budget=3, storage=url, bench=bench, lease_s=60.0, name="crashes")
    def f(n: int, *, b: int) -> int:
        if b == 2 and timing[0] and os.environ["CRASH_HOW"] != "none":
            Path(os.environ["CRASH_FLAG"]).touch()
            how = os.environ["CRASH_HOW"]
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "abort":
                os.abort()
            os._exit(70)
        return b

    print(json.dumps({"b": f(64), "why": f.tuner.last_choice.get("why", "")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
