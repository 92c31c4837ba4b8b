"""`auto`'s unseen one-parameter neighbours of a config, found the two exact ways `_unseen_neighbours` has,
side by side: a scan of the pool's key matrix and a lookup of each one-value change in the pool's index.
Prints ms per call of each on a 2,000,000-config bowl, a wide synthetic table (`wide_table.py`) and two dev
tables, and checks that both give the same list; the strategy takes the scan where the pool's cells are at
most `_SCAN_PER_LOOKUP` times the candidates.

    PYTHONPATH=. python benchmarks/neighbour_lookup.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.wide_table import write  # noqa: E402
from tuner import IntRange, SearchSpace  # noqa: E402
from tuner.replay import load_table  # noqa: E402
from tuner.strategies import ModelStrategy, _model  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


def _per_call(space: SearchSpace, label: str) -> None:
    s = ModelStrategy(space, seed=0)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(s.pool.keys), 20, replace=False):
        s.tell(s.pool.config_at(int(i)), float(rng.random()))
    idx = [int(i) for i in rng.choice(len(s.pool.keys), 20, replace=False)]
    got = {}
    for ratio, way in ((10**12, "scan"), (0, "lookups")):
        _model._SCAN_PER_LOOKUP = ratio
        t = time.perf_counter()
        got[way] = [s._unseen_neighbours(i) for i in idx]
        got[way + " ms"] = (time.perf_counter() - t) / len(idx) * 1e3
    assert got["scan"] == got["lookups"], label
    cells = len(s.pool.keys) * len(space.params)
    cand = sum(len(p.values) - 1 for p in space.params)
    print(f"| {label} | {cells:,} | {cand:,} | {got['scan ms']:.3f} | {got['lookups ms']:.3f} | same |")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(
        "| pool | cells (configs x parameters) | candidates | scan, ms per call | lookups, ms per call | lists |"
    )
    print("|---|---:|---:|---:|---:|---|")
    _per_call(SearchSpace([IntRange("a", 0, 999), IntRange("b", 0, 1999)]), "bowl, 2,000,000 configs")
    with tempfile.TemporaryDirectory() as d:
        wide = Path(d) / "wide.json.gz"
        write(wide, 3000, 300, 0)
        _per_call(load_table(str(wide)).space, "wide synthetic table")
    for f in ("gemm/RTX_3090.json.gz", "convolution/A100.json.gz"):
        _per_call(load_table(str(DATA / f)).space, f.removesuffix(".json.gz"))


if __name__ == "__main__":
    main()
