"""A process for tests/test_hung_configs.py: calls a decorated function whose config b=2 misbehaves while
it is timed, in the store given: `hang` never returns (an endless loop, as a deadlocked kernel; a lease of
1 s; touches `<dir>/<name>-hangs` as it enters the hang), or it kills its own process (`kill`: SIGKILL,
as an OOM kill or a crash would; `abort`: SIGABRT, as an illegal memory access that aborts; `exit`:
os._exit; a lease of 60 s; touches `<dir>/<name>-crashes` just before it dies), or `none`: it does
not. Prints the config its call used as a JSON line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    url, folder, name, how = sys.argv[1:5]
    hang = how == "hang"
    os.environ["CRASH_FLAG"] = str(Path(folder) / f"{name}-{'hangs' if hang else 'crashes'}")  # same code
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

    lease_s, kernel = (1.0, "hangs") if hang else (60.0, "crashes")

    @tuner.autotune(space, key=["n"], budget=3, storage=url, bench=bench, lease_s=lease_s, name=kernel)
    def f(n: int, *, b: int) -> int:
        if b == 2 and timing[0] and os.environ["CRASH_HOW"] != "none":
            Path(os.environ["CRASH_FLAG"]).touch()
            how = os.environ["CRASH_HOW"]
            while how == "hang":  # never returns
                time.sleep(0.05)
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
