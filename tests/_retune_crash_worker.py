"""A process for tests/test_hung_configs.py: a `triton.autotune` drop-in kernel (tuner's) whose config
BLOCK=32 kills its own process (os._exit) while it is timed, when `crash` is "1". It launches the kernel
for one key, then, when `clear` is "1", takes the key out of `.cache` (`kernel.cache.clear()`) and
launches it again, which tunes it again. Touches `<dir>/<name>-crashes` just before it dies, and prints
the BLOCK of each launch as a JSON line.

Run as `_retune_crash_worker.py URL DIR NAME CRASH CLEAR`, or as `_retune_crash_worker.py serve`: a fork
server that imports torch and triton once (no tuner: it checks) and, per JSON line on stdin (`argv`, `env`,
`stdout`, `stderr`), forks a child that runs those arguments as the script run with them does, from the
state of a fresh interpreter that imported torch and triton (tuner imported fresh, a normal interpreter
exit with its atexit handlers), with its own streams and environment; it answers `{"rc": ...}` per line.
The cold import of torch and triton, most of a run's cost, is paid once instead of per run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    url, folder, name, crash, clear = argv
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["TUNER_STORAGE"] = url
    flag = Path(folder) / f"{name}-crashes"
    import torch
    import triton
    import triton.language as tl

    import tuner

    def bench(kernel_call, quantiles):  # noqa: ANN001, ANN202
        kernel_call()  # its pre_hook says which config this is
        if crash == "1" and current[0] == 32:
            flag.touch()
            os._exit(70)
        t = {16: 2.0, 32: 1.0, 64: 3.0}[current[0]]
        return [t, t, t]

    current = [0]

    def pre_hook(nargs):  # noqa: ANN001, ANN202
        current[0] = nargs["BLOCK"]

    configs = [triton.Config({"BLOCK": b}, pre_hook=pre_hook) for b in (16, 32, 64)]

    @tuner.autotune(configs=configs, key=["N"], do_bench=bench)
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)

    def launch() -> int:
        dst = torch.zeros(100)
        fill[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](dst, 100)
        return int(dst[0])

    print(json.dumps({"block": launch()}), flush=True)
    if clear == "1":
        fill.cache.clear()
        print(json.dumps({"block": launch()}), flush=True)
    return 0


def serve() -> list[str]:
    """The fork server's loop; returns (in the forked child only) the arguments the child runs."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    from _fork_server import fork_per_request  # this script's folder is first on sys.path

    return list(fork_per_request()["argv"])


if __name__ == "__main__":
    sys.exit(main(serve() if sys.argv[1:] == ["serve"] else sys.argv[1:6]))
