"""Cold tuning at small budgets on a real GPU: `auto` starting from the space's declared default and
its suggested configs (the default since 4 Dec 2026) against `auto` without them, on the registered
Triton matmul.

For each shape, both variants run over the same seeds through `tuner.optimize`, with one shared
objective that times a config once with Triton's do_bench (CUDA events, L2 flushed) and remembers it,
so both variants see the same time for the same config (a replay built on the fly). Printed per shape:
the untuned default's time, torch.matmul's, and per variant the mean best time over the seeds, the
share of seeds that ended no slower than the default, and the mean ratio to torch.matmul.

Run: PYTHONPATH=. python benchmarks/cold_start_gpu.py [--budget 10] [--seeds 3] [--shapes 16x4096x4096,...]
On a machine without a CUDA GPU it runs tiny shapes under the Triton interpreter (a smoke test of the
script; its times mean nothing).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TUNER_HOME", tempfile.mkdtemp(prefix="tuner-coldstart-"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--shapes", default="16x4096x4096,512x4096x4096,4096x4096x4096", help="MxNxK,...")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"
        args.shapes, args.dtype, args.budget, args.seeds = "16x32x32", "float32", 3, 2
    import triton
    from tuner.kernels import get_kernel
    from tuner.search_spaces.devices import detect_device

    import tuner
    from tuner.strategies import ModelStrategy

    spec = get_kernel("matmul")
    dev = detect_device("triton")
    print(
        f"cold_start_gpu on {dev.name} ({dev.arch}); budget {args.budget}, seeds 0-{args.seeds - 1}, {args.dtype}"
    )
    t_start = time.perf_counter()

    def run_shape(shape: str) -> None:
        M, N, K = (int(v) for v in shape.split("x"))
        problem = {"M": M, "N": N, "K": K, "bias": False, "activation": "none", "dtype": args.dtype}
        space = spec.space(problem, dev, "triton")
        inputs = spec.make_inputs(problem, "triton", 0)
        memo: dict[tuple, float] = {}

        def timed(cfg: dict[str, Any]) -> float:
            key = tuple(sorted(cfg.items()))
            if key not in memo:
                try:

                    def call() -> Any:
                        return spec.run(problem, "triton", inputs, cfg)

                    call()
                    if gpu:
                        torch.cuda.synchronize()
                        memo[key] = float(triton.testing.do_bench(call, warmup=5, rep=25))
                    else:
                        t = time.perf_counter()
                        call()
                        memo[key] = (time.perf_counter() - t) * 1e3
                except Exception as e:  # a config the GPU rejects (resources): a failed trial
                    memo[key] = math.inf
                    print(f"  {shape} {cfg}: {type(e).__name__}: {str(e)[:120]}")
            if not math.isfinite(memo[key]):
                raise RuntimeError("config failed")
            return memo[key]

        default_ms = timed(space.default())
        if gpu:
            a = torch.randn(M, K, device="cuda", dtype=getattr(torch, args.dtype))
            b = torch.randn(K, N, device="cuda", dtype=getattr(torch, args.dtype))
            ref_ms = float(triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=5, rep=25))
        else:
            ref_ms = float("nan")
        line = [f"{shape}: default {default_ms:.4f} ms ({space.default()}), torch.matmul {ref_ms:.4f} ms"]
        for variant in ("starts", "without"):
            bests = []
            for seed in range(args.seeds):
                strat = ModelStrategy(space, seed=seed)
                if variant == "without":
                    strat._starts = []  # no default, no suggestions: space-filling draws from the first
                res = tuner.optimize(space, timed, budget=args.budget, seed=seed, strategy=strat)
                bests.append(res.best_value)
            no_slower = sum(b <= default_ms * 1.0001 for b in bests) / len(bests)
            line.append(
                f"  {variant:8s}: mean best {statistics.fmean(bests):.4f} ms (seeds {', '.join(f'{b:.4f}' for b in bests)}); "
                f"no slower than the default in {no_slower:.0%}; torch/best {ref_ms / statistics.fmean(bests):.2f}"
            )
        print("\n".join(line), flush=True)

    for shape in args.shapes.split(","):
        run_shape(shape)
    print(f"elapsed {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
