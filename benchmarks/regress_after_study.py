"""Does `tuner regress`, run right after a study on the same machine, see no change? (issue 15 item 3)

Runs a study (default: studies/quickstart.toml, in a temporary TUNER_HOME), exports its cache, then
re-measures every entry twice in the same run:

- `protocol`: `tuner regress`'s default measure (the study's own protocol: `KernelMeasurer` in a worker
  process, the finalists' interleaved re-measurement, 25 timed runs), judged as `tuner regress` judges it;
- `naive`: the measure `tuner regress` used before (in-process, one checked call, then 10 wall-clock calls
  of `spec.run`), the baseline of this comparison.

Prints, per entry, the recorded time, each measure's median ratio new / recorded with its bootstrap
interval and verdict, and the noise band (the larger of 5 % and the entry's recorded relative spread).
CPU timings under the interpreters are noisy on a loaded machine; the figure that matters is how far each
measure's ratio sits from 1.

    PYTHONPATH=$PWD python benchmarks/regress_after_study.py [--study studies/quickstart.toml]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def naive_measure(entry: dict[str, Any], repeats: int) -> list[float]:
    """The former default measure of `tuner regress`: in-process wall clock around `spec.run`."""
    from tuner.studies._regress import entry_task

    spec, problem, backend = entry_task(entry)
    inputs = spec.make_inputs(problem, backend, 0)

    def sync(out: Any) -> None:
        if hasattr(out, "block_until_ready"):
            out.block_until_ready()
        elif "cuda" in str(getattr(out, "device", "")):
            import torch

            torch.cuda.synchronize()

    sync(spec.run(problem, backend, inputs, dict(entry["config"])))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sync(spec.run(problem, backend, inputs, dict(entry["config"])))
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default=str(REPO / "studies" / "quickstart.toml"))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tuner-regress-"))
    env = {**os.environ, "TUNER_HOME": str(home)}
    t0 = time.time()
    cmd = [sys.executable, "-m", "tuner.cli", "study", "run", args.study, "--quiet", "--json"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, encoding="utf-8")
    if run.returncode != 0:
        print(run.stdout, run.stderr, file=sys.stderr)
        return 1
    import json

    cache = json.loads(run.stdout)["cache"]["path"]
    print(f"study: {args.study} in {time.time() - t0:.0f} s; cache {cache}")
    os.environ["TUNER_HOME"] = str(home)
    from tuner.studies._regress import check_entries, protocol_repeats, read_cache_entries

    entries = read_cache_entries(cache)
    protocol = check_entries(entries, repeats=protocol_repeats())
    naive = check_entries(entries, measure=naive_measure, repeats=10)
    print(
        f"{'entry':58} {'recorded':>10}  {'protocol ratio [CI] verdict':36}  {'naive ratio [CI] verdict':36}"
    )
    for p, n in zip(protocol, naive, strict=True):
        key = ",".join(f"{k}={v}" for k, v in sorted(p.key.items()))
        name = f"{p.kernel} [{key}]"[:58]

        def fmt(c: Any) -> str:
            if c.ratio is None:
                return f"{c.verdict}: {c.note}"[:36]
            return f"{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}] {c.verdict}"

        print(f"{name:58} {p.recorded_s * 1e3:8.3f}ms  {fmt(p):36}  {fmt(n):36}  band +-{p.threshold:.1%}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
