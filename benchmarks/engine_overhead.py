"""The search engine's own cost per evaluation (the strategy, the candidate pool, the Optuna bookkeeping) on
replay tables, in CPU and wall time, optionally beside an older checkout in the same run.

    PYTHONPATH=. python benchmarks/engine_overhead.py [--tables PATH,...] [--strategies auto,random]
        [--seeds 3] [--budget 200] [--before DIR]

Default tables: a synthetic wide table (`benchmarks/wide_table.py`: 3000 configs, a float parameter with
3000 values and a string parameter with 300) written to a temporary folder, and gemm/RTX_3090. Each
(table, strategy, seed) runs `optimize` in a child process of its own (`--worker`), after an untimed run of
the same strategy on the same table (budget 30) that does the first imports and model fits. The CPU
figure is the child's CPU time (all its threads) in the timed `optimize` call, strategy and study setup
included, over the evaluations: the objective is a table lookup, so this is the engine's work on a loaded
machine. The wall figure is `TuneResult.strategy_time_s` per evaluation (what `replay_search.py`'s ms/eval
reads). With `--before DIR` (a checkout of an older commit) each run is made there too, right after, and
the trials of the two runs are compared: `same` says whether they proposed the same configs in the same
order. Medians over the seeds. Target for `auto`: <= 20 ms per evaluation at budget 200.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if sys.argv[1:2] != ["--worker"]:  # a worker imports the tuner of the checkout its PYTHONPATH names
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _tables import existing_dir, positive_int, quiet_logging, temp_dir  # noqa: E402  (not a package)


@quiet_logging()
def _worker(table_path: str, strategy: str, seed: int, budget: int) -> dict:
    import tuner
    from tuner.replay import load_table

    table = load_table(table_path)
    tuner.optimize(
        table.space, table.objective_fn(), budget=min(30, budget), seed=seed + 1000, strategy=strategy
    )
    c0, w0 = time.process_time(), time.perf_counter()
    res = tuner.optimize(table.space, table.objective_fn(), budget=budget, seed=seed, strategy=strategy)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    n = max(1, res.evaluations)
    trials = json.dumps([[t.config, t.value] for t in res.trials], sort_keys=True, default=str)
    return {
        "cpu_ms": 1000.0 * cpu / n,
        "strategy_ms": 1000.0 * res.strategy_time_s / n,
        "wall_ms": 1000.0 * wall / n,
        "evaluations": res.evaluations,
        "trials": hashlib.sha256(trials.encode()).hexdigest()[:16],
        "tuner": str(Path(tuner.__file__).resolve().parent.parent),
    }


def _run(checkout: Path, table: str, strategy: str, seed: int, budget: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", table, strategy, str(seed), str(budget)]
    out = subprocess.run(
        cmd, env=env, cwd=checkout, capture_output=True, text=True, check=False, encoding="utf-8"
    )
    if out.returncode != 0:
        raise SystemExit(f"worker failed in {checkout}: {out.stderr.strip().splitlines()[-1:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(rec["tuner"]) != checkout.resolve():
        raise SystemExit(f"the worker for {checkout} imported tuner from {rec['tuner']}")
    return rec


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, table, strategy, seed, budget = sys.argv
        print(json.dumps(_worker(table, strategy, int(seed), int(budget))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tables", default="", help="comma-separated table files (default: the wide table, gemm/RTX_3090)"
    )
    ap.add_argument("--strategies", default="auto,random")
    ap.add_argument("--seeds", type=positive_int, default=3)
    ap.add_argument("--budget", type=positive_int, default=200)
    ap.add_argument(
        "--before", type=existing_dir, default="", help="a checkout of an older commit, run alongside"
    )
    a = ap.parse_args()
    wide = ""
    if a.tables:
        tables = [t.strip() for t in a.tables.split(",") if t.strip()]
    else:
        from wide_table import write

        wide = str(Path(temp_dir("engine-overhead-")) / "wide.json.gz")
        write(Path(wide), 3000, 300, 0)
        tables = [wide, str(HERE / "data" / "gemm" / "RTX_3090.json.gz")]
    after = HERE.parent
    before = Path(a.before).resolve() if a.before else None
    print(f"# engine overhead, budget {a.budget}, seeds {a.seeds}; ms per evaluation, median over seeds")
    print(f"{'table':<28}{'strategy':<10}{'CPU':>8}{'wall':>8}{'before CPU':>12}{'before wall':>13}  same")
    for table in tables:
        for strategy in [s.strip() for s in a.strategies.split(",") if s.strip()]:
            now, old = [], []
            for seed in range(a.seeds):
                now.append(_run(after, table, strategy, seed, a.budget))
                if before is not None:
                    old.append(_run(before, table, strategy, seed, a.budget))
            med = {k: statistics.median(r[k] for r in now) for k in ("cpu_ms", "strategy_ms")}
            cells = f"{med['cpu_ms']:>8.1f}{med['strategy_ms']:>8.1f}"
            if old:
                b = {k: statistics.median(r[k] for r in old) for k in ("cpu_ms", "strategy_ms")}
                same = all(x["trials"] == y["trials"] for x, y in zip(now, old, strict=True))
                cells += f"{b['cpu_ms']:>12.1f}{b['strategy_ms']:>13.1f}  {'yes' if same else 'NO'}"
            name = "wide (synthetic)" if table == wide else "/".join(Path(table).parts[-2:]).split(".json")[0]
            print(f"{name:<28}{strategy:<10}{cells}", flush=True)


if __name__ == "__main__":
    main()
