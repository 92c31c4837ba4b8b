"""Compile-only wall time of a batch of matmul configs for sm90: one compile process vs the pool.

    PYTHONPATH=$PWD python benchmarks/precompile.py [--configs 32] [--arch sm90] [--jobs N]

Takes `--configs` distinct configs of the sm90 matmul space for bf16 4096^3 (seeded), and compiles them
twice with Triton's compiler and no GPU (`tuner.measure._compile`): serially in one compile process,
then in a pool of `--jobs` processes (default: the cores this process may use). Each run gets a fresh,
empty Triton cache, so both compile everything; the wall time includes starting the processes. This is
what `KernelMeasurer.precompile` does before a batch is timed on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int  # noqa: E402  (benchmarks/ is not a package)

PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bfloat16", "bias": False, "activation": "none"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=positive_int, default=32)
    ap.add_argument("--arch", choices=("sm80", "sm90"), default="sm90")
    ap.add_argument("--jobs", type=positive_int, default=None, help="pool size (default: the usable cores)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from tuner.kernels import get_kernel
    from tuner.kernels._check import draw_configs
    from tuner.search_spaces import get_device

    from tuner.measure._compile import compile_configs, default_jobs

    spec = get_kernel("matmul")
    space = spec.space(PROBLEM, get_device(args.arch), "triton")
    configs = draw_configs(space, args.configs, args.seed)
    jobs = args.jobs or default_jobs()
    print(f"matmul bf16 4096^3, {len(configs)} configs of the {args.arch} space ({len(space)} in all)")
    times = {}
    for label, n in (("serial", 1), ("pooled", jobs)):
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            t0 = time.perf_counter()
            res = compile_configs("matmul", PROBLEM, configs, arch=args.arch, jobs=n, cache_dir=cache)
            times[label] = time.perf_counter() - t0
        bad = [r for r in res if not r.ok]
        print(
            f"  {label:<6} {n:>2} process{'es' if n > 1 else '  '}: {times[label]:6.1f} s wall "
            f"({sum(r.compile_s for r in res):.1f} s of compiles; {len(bad)} failed)",
            flush=True,
        )
        for r in bad[:3]:
            print(f"    {r.status}: {r.config}: {(r.error or '')[:200]}")
    print(
        f"pooled / serial: {times['pooled'] / times['serial']:.2f} (speed-up {times['serial'] / times['pooled']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
