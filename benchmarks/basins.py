"""Landscape of each replay table under one-parameter moves: local minima, the optimum's basin, climb length.

For every table it builds the one-parameter (Hamming) neighbourhood of every valid config, lets each
config move to its best neighbour while that is faster (steepest descent), and prints: the number of
local minima, how many of them are within 1.05x of the optimum, the share of the space whose descent ends
within 1.05x (the good basins), and, for `--starts` random starts inside those basins, the median number
of moves to get there and the median number of distinct configs a full steepest descent measures on the
way (every neighbour of every config on the path). A search that knew which neighbour improves would need
about as many evaluations as moves; one that measures whole neighbourhoods needs the second figure. It
tells what a search's local steps can gain on a table, not how a strategy performs (`replay_search.py`).
Failed configs count as twice the slowest valid time.

    python benchmarks/basins.py
    python benchmarks/basins.py --files 'convolution/*' --starts 500
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import table_files  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_DATA = Path(__file__).resolve().parent / "data"


def neighbourhoods(table: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """(values, one-parameter neighbours of each config as index arrays) of a replay table."""
    space = table.space
    keys = list(table.values.keys())
    raw = [table.values[k] for k in keys]
    ok = [v for v in raw if v is not None]
    if not ok:
        raise ValueError("the table has no valid measurement")
    worst = 2.0 * max(ok)
    vals = np.array([worst if v is None else float(v) for v in raw])
    params = space.params
    pos = [{space._hkey((v,))[0]: j for j, v in enumerate(p.values)} for p in params]
    K = np.array([[pos[t][k[t]] for t in range(len(params))] for k in keys], dtype=np.int64)
    index = {tuple(r): i for i, r in enumerate(K.tolist())}
    nbrs = []
    for r in K.tolist():
        nb = []
        for t, p in enumerate(params):
            for j in range(len(p.values)):
                if j != r[t]:
                    i = index.get(tuple(r[:t] + [j] + r[t + 1 :]))
                    if i is not None:
                        nb.append(i)
        nbrs.append(np.asarray(nb, dtype=np.int64))
    return vals, nbrs


def landscape(table: Any, *, starts: int = 300, seed: int = 0, within: float = 1.05) -> dict[str, float]:
    """The figures the module docstring describes, for one table."""
    vals, nbrs = neighbourhoods(table)
    n = len(vals)
    step = np.arange(n)
    for i, nb in enumerate(nbrs):
        if nb.size:
            j = int(nb[np.argmin(vals[nb])])
            if vals[j] < vals[i]:
                step[i] = j
    minima = np.flatnonzero(step == np.arange(n))
    end = step.copy()
    while True:  # values fall strictly along a path, so it ends at a local minimum
        nxt = step[end]
        if np.array_equal(nxt, end):
            break
        end = nxt
    good = vals[end] <= within * vals.min()
    moves, cost = [], []
    rng = np.random.default_rng(seed)
    for s in rng.choice(np.flatnonzero(good), size=min(starts, int(good.sum())), replace=False):
        cur, seen, k = int(s), {int(s)}, 0
        while vals[cur] > within * vals.min():
            seen.update(nbrs[cur].tolist())
            cur, k = int(step[cur]), k + 1
        moves.append(k)
        cost.append(len(seen))
    return {
        "configs": float(n),
        "minima": float(minima.size),
        "good_minima": float((vals[minima] <= within * vals.min()).sum()),
        "good_share": float(good.mean()),
        "moves": float(np.median(moves)),
        "descent_evals": float(np.median(cost)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    from tuner.replay import load_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder of tables (default: benchmarks/data)")
    ap.add_argument("--files", default="*/*.json*", help="comma-separated globs under --data")
    ap.add_argument("--starts", type=int, default=300, help="random starts inside the good basins")
    ap.add_argument("--within", type=float, default=1.05, help="a good config: within this of the optimum")
    args = ap.parse_args(argv)
    if args.starts < 1 or args.within < 1:
        ap.error("--starts must be >= 1 and --within >= 1")
    paths = table_files(args.data, args.files.split(","), script="basins")
    if not paths:
        ap.error(f"no table matches {args.files!r} under {args.data}")
    print(f"# one-parameter landscape: within {args.within}x of the optimum, {args.starts} starts per table")
    print(
        f"{'table':28s} {'configs':>7s} {'minima':>6s} {'good':>4s} {'good basin':>10s} {'moves':>5s} {'descent evals':>13s}"
    )
    for p in paths:
        r = landscape(load_table(p), starts=args.starts, within=args.within)
        name = str(Path(p).relative_to(args.data)).split(".json")[0]
        print(
            f"{name:28s} {r['configs']:7.0f} {r['minima']:6.0f} {r['good_minima']:4.0f} "
            f"{r['good_share']:10.2f} {r['moves']:5.0f} {r['descent_evals']:13.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
