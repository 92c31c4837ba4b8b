"""Write slim copies of Kernel Tuner cache files: the fields replay needs, gzip-compressed.

Each entry keeps its tuning parameters and the objective (`time`: milliseconds, or Kernel Tuner's failure
string); the per-repeat `times`, compile, verification and framework times, GFLOP/s and timestamps are
dropped. The header (device, kernel, problem size, tune_params, objective) and the entries' order are kept,
so the copy is still a Kernel Tuner cache file and replays exactly as the original does. This is how
`benchmarks/data/` was made from the FAIR Benchmark Hub's tables:

    python benchmarks/slim_tables.py SOURCE_FOLDER benchmarks/data

SOURCE_FOLDER holds `KERNEL/GPU.json.gz` (or `.json`) files; the same layout is written under the target.
Files in the hub's folders that are not cache files (the T4 copies `GPU_T4.json.gz`, `GPU-results` and
`GPU-metadata` files) are skipped with a line that says so: the cache file holds the same table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
from _tables import table_files  # noqa: E402  (benchmarks/ is not a package)

from tuner._atomic import atomic_write  # noqa: E402
from tuner.replay import FAILURE_STRINGS, recorded_objective  # noqa: E402


def _objective_value(e: dict[str, Any], objective: str) -> Any:
    if objective in e:
        return e[objective]
    # a failed entry may record its failure under another field only: keep it as the objective's
    return next((v for v in e.values() if isinstance(v, str) and v in FAILURE_STRINGS), e.get(objective))


def slim(doc: dict[str, Any]) -> dict[str, Any]:
    """The cache document with only the parameters and the objective in each entry."""
    keys = doc.get("tune_params_keys") or list(doc["tune_params"])
    objective = recorded_objective(doc)
    out = {k: v for k, v in doc.items() if k != "cache"}
    out["cache"] = {
        ck: {**{k: e[k] for k in keys}, objective: _objective_value(e, objective)}
        for ck, e in doc["cache"].items()
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="folder with KERNEL/GPU.json.gz tables")
    ap.add_argument("target", help="folder to write the slim KERNEL/GPU.json.gz copies to")
    args = ap.parse_args(argv)
    src, dst = Path(args.source), Path(args.target)
    files = [Path(f) for f in table_files(src, script="slim_tables")]
    if not files:
        print(f"no tables under {src}", file=sys.stderr)
        return 2
    for f in files:
        raw = f.read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        if (
            not isinstance(doc, dict)
            or "cache" not in doc
            or not (doc.get("tune_params_keys") or doc.get("tune_params"))
        ):
            print(f"{f}: skipped (not a Kernel Tuner cache file with tune_params_keys)")
            continue
        body = json.dumps(slim(doc), separators=(",", ":")).encode()
        out = dst / f.parent.name / (f.name.split(".")[0] + ".json.gz")
        # mtime=0: the same input gives the same bytes
        atomic_write(out, gzip.compress(body, compresslevel=9, mtime=0), mkdir=True)
        print(f"{out}: {len(doc['cache'])} entries, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
