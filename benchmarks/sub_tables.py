"""Small sub-spaces of the replay tables: search on spaces unlike the ones the strategy was tuned on.

The 15 committed tables (`benchmarks/data/`) are large (4,000 to 18,000 configs), and `auto`'s constants
were chosen on them at budget 200. Real kernels often have spaces of tens to hundreds of configs, tuned with a
budget of 16 or 32. This script cuts such spaces out of the tables: for each table, `--per-table` times, it
draws a random measured config and fixes parameters (in random order) at that config's values while more
than `--max` configs remain, as long as at least `--min` do. Each sub-table keeps the measured values of its
configs, so it is a complete brute-forced space of its own (with its own optimum), and `replay_search.py`
replays it like any table:

    python benchmarks/sub_tables.py /tmp/sub
    python benchmarks/replay_search.py --data /tmp/sub --budget 16 --strategies random,tpe,auto

Deterministic for a `--seed`. Each file is a Kernel Tuner cache file (gzip-compressed JSON) with the
source table's header, `tune_params` narrowed to the fixed values, and a `sub_table` entry naming the
source file, the fixed parameters and the seed. The files are derived from the hub's MIT-licensed tables
(`benchmarks/data/README.md`); do not commit them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import out_dir, table_files  # noqa: E402  (benchmarks/ is not a package)

from tuner.replay import recorded_objective  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent / "data"


def _is_ok(entry: dict[str, Any], objective: str) -> bool:
    v = entry.get(objective)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def cut(
    doc: dict[str, Any], rng: np.random.Generator, lo: int, hi: int, tries: int = 200
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One sub-table of a Kernel Tuner cache document: (the new document, the fixed parameters), or None
    when no draw gives between `lo` and `hi` configs with at least `lo` // 2 measured ones."""
    keys = list(doc.get("tune_params_keys") or doc["tune_params"])
    objective = recorded_objective(doc)
    entries = list(doc["cache"].items())
    free = [k for k in keys if len(doc["tune_params"].get(k, [])) > 1]
    for _ in range(tries):
        anchor = entries[int(rng.integers(len(entries)))][1]
        sub, fixed = entries, {}
        for k in (free[i] for i in rng.permutation(len(free))):
            if len(sub) <= hi:
                break
            narrower = [(ck, e) for ck, e in sub if e[k] == anchor[k]]
            if len(narrower) < lo:
                continue  # fixing this one leaves too few: try the next parameter
            sub, fixed[k] = narrower, anchor[k]
        if lo <= len(sub) <= hi and sum(_is_ok(e, objective) for _, e in sub) >= lo // 2:
            out = dict(doc)
            out["tune_params"] = {k: ([fixed[k]] if k in fixed else v) for k, v in doc["tune_params"].items()}
            out["cache"] = dict(sub)
            return out, fixed
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=out_dir, help="folder to write KERNEL/GPU_i.json.gz into")
    ap.add_argument(
        "--data", default=str(DEFAULT_DATA), help="folder of the tables (default benchmarks/data)"
    )
    ap.add_argument("--files", default="*/*.json.gz", help="glob under --data (default */*.json.gz)")
    ap.add_argument("--per-table", type=int, default=2, help="sub-tables per table (default 2)")
    ap.add_argument("--min", type=int, default=50, help="fewest configs in a sub-table (default 50)")
    ap.add_argument("--max", type=int, default=600, help="most configs in a sub-table (default 600)")
    ap.add_argument("--seed", type=int, default=12345)
    args = ap.parse_args(argv)
    if not 1 <= args.min <= args.max:
        print("sub_tables: need 1 <= --min <= --max", file=sys.stderr)
        return 2
    if args.per_table < 1:
        print("sub_tables: --per-table must be >= 1", file=sys.stderr)
        return 2
    data, out = Path(args.data), Path(args.out)
    paths = [Path(f) for f in table_files(data, [args.files], script="sub_tables")]
    if not paths:
        print(f"sub_tables: no table matches {args.files!r} under {data}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    n_written = 0
    for path in paths:
        with (
            gzip.open(path, "rt", encoding="utf-8")
            if path.suffix == ".gz"
            else open(path, encoding="utf-8") as f
        ):
            doc = json.load(f)
        objective = recorded_objective(doc)
        kernel, gpu = path.parent.name, path.name.split(".")[0]
        for i in range(args.per_table):
            got = cut(doc, rng, args.min, args.max)
            if got is None:
                print(f"{kernel}/{gpu}: no sub-table of {args.min}-{args.max} configs")
                continue
            sub, fixed = got
            sub["sub_table"] = {"source": f"{kernel}/{path.name}", "fixed": fixed, "seed": args.seed}
            dest = out / kernel / f"{gpu}_{i}.json.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            with gzip.open(tmp, "wt", encoding="utf-8") as f:
                json.dump(sub, f)
            tmp.replace(dest)  # atomic: a crash leaves no half-written table
            n_written += 1
            vals = [e[objective] for e in sub["cache"].values() if _is_ok(e, objective)]
            best = min(vals)
            near = sum(v <= 1.05 * best for v in vals)
            fixed_txt = ", ".join(f"{k}={v}" for k, v in fixed.items())
            print(
                f"{kernel}/{gpu}_{i}: {len(sub['cache'])} configs, {len(vals)} measured ok, "
                f"{near} within 1.05x; fixed {fixed_txt}"
            )
    print(f"{n_written} sub-tables under {out}")
    return 0 if n_written else 1


if __name__ == "__main__":
    raise SystemExit(main())
