"""Write a synthetic Kernel Tuner cache table whose parameters have many distinct values (engine overhead).

    PYTHONPATH=. python benchmarks/wide_table.py OUT.json.gz [--configs 3000] [--strings 300] [--seed 0]

One float parameter `x` with a distinct value per config, one string parameter `s` with `--strings`
values and a small integer parameter `b`: the shape of a table that makes the neighbour search of `auto`
costly (docs/benchmarks.md, "Engine overhead on parameters with many values"). The objective is smooth in
`x` with a per-string offset and a little deterministic noise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

import numpy as np


def build(configs: int, strings: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    xs = np.round(np.sort(rng.uniform(0.0, 10.0, configs)), 6)
    names = [f"s{j:03d}" for j in range(strings)]
    offset = rng.uniform(0.0, 1.0, strings)
    cache: dict[str, dict] = {}
    for i, x in enumerate(xs.tolist()):
        j, b = i % strings, 1 << (i % 4)
        t = 1.0 + (x - 6.3) ** 2 + offset[j] + 0.1 * math.log2(b) + 0.01 * float(rng.random())
        cache[f"{x},{names[j]},{b}"] = {"x": x, "s": names[j], "b": b, "time": t}
    return {
        "device_name": "synthetic",
        "kernel_name": "wide",
        "problem_size": [configs],
        "tune_params_keys": ["x", "s", "b"],
        "tune_params": {"x": xs.tolist(), "s": names, "b": [1, 2, 4, 8]},
        "objective": "time",
        "cache": cache,
    }


def write(out: Path, configs: int, strings: int, seed: int) -> None:
    """The table as gzipped JSON at `out`, written atomically."""
    from tuner._atomic import atomic_write

    atomic_write(out, gzip.compress(json.dumps(build(configs, strings, seed)).encode(), mtime=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--configs", type=int, default=3000)
    ap.add_argument("--strings", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write(a.out, a.configs, a.strings, a.seed)
    print(a.out)


if __name__ == "__main__":
    main()
