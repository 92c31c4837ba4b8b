"""A process for tests/test_hung_configs.py: a `triton.autotune` drop-in kernel (tuner's) whose config
BLOCK=32 kills its own process (os._exit) while it is timed, when `crash` is "1". It launches the kernel
for one key, then, when `clear` is "1", takes the key out of `.cache` (`kernel.cache.clear()`) and
launches it again, which tunes it again. Touches `<dir>/<name>-crashes` just before it dies, and prints
the BLOCK of each launch as a JSON line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    url, folder, name, crash, clear = sys.argv[1:6]
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


if __name__ == "__main__":
    sys.exit(main())
