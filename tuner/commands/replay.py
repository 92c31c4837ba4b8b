"""`tuner replay FILE`: tune over a recorded Kernel Tuner cache file (docs/api.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="tune over a recorded measurement table (Kernel Tuner cache file)",
        description="Tune over the configs of a Kernel Tuner cache file (.json or .json.gz, or a T4 "
        "results file), with the file's recorded objective (time, or GFLOP/s and the like, maximised).",
    )
    p.add_argument("file", help="Kernel Tuner cache file")
    p.add_argument("--strategy", default="auto", help="search strategy (default: auto)")
    p.add_argument("--budget", type=int, default=100, help="maximum evaluations (default: 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prior",
        action="append",
        default=[],
        metavar="FILE",
        help="a table of a related task (another GPU or problem) to warm-start the model; repeatable",
    )
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="keep the study and the measurements in this database (default: memory only)",
    )
    p.add_argument(
        "--objective",
        default=None,
        metavar="NAME",
        help="the recorded column to tune (default: the file's objective, else time)",
    )
    direction = p.add_mutually_exclusive_group()
    direction.add_argument(
        "--higher-is-better",
        dest="higher_is_better",
        action="store_const",
        const=True,
        default=None,
        help="maximise the objective (needed for objectives Kernel Tuner does not know, such as score)",
    )
    direction.add_argument(
        "--lower-is-better", dest="higher_is_better", action="store_const", const=False, help="minimise it"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner import optimize
    from tuner._optimize import MAX_SEED, AllTrialsFailedWarning
    from tuner.errors import BadInput
    from tuner.replay import ReplayFormatError, load_table
    from tuner.strategies import STRATEGIES

    if args.strategy not in STRATEGIES:
        raise BadInput(f"unknown strategy {args.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if args.budget < 1:
        raise BadInput(f"--budget must be >= 1, got {args.budget}")
    if not 0 <= args.seed <= MAX_SEED:
        raise BadInput(f"--seed must be from 0 to 2**32 - 1, got {args.seed}")
    try:
        how = {"objective": args.objective, "higher_is_better": args.higher_is_better}
        table = load_table(args.file, **how)
        priors = [load_table(f, **how) for f in args.prior]
    except ReplayFormatError as exc:
        raise BadInput(str(exc)) from None
    store = None
    if args.storage:
        from tuner.store import ResultStore, TaskContext

        store = ResultStore(args.storage)
    task = None
    if store is not None:
        from tuner.store import TaskContext

        task = TaskContext(
            kernel=table.kernel_name or "replay",
            problem={"problem_size": table.problem_size},
            device=table.device_name or table.name,
        )
    with warnings.catch_warnings():  # an all-failed search is reported below, in one line
        warnings.simplefilter("ignore", AllTrialsFailedWarning)
        result = optimize(
            table.space,
            table.objective_fn(),
            budget=args.budget,
            seed=args.seed,
            strategy=args.strategy,
            prior=[p.as_prior() for p in priors] or None,
            storage=store,
            task=task,
        )
    failed = result.best_config is None  # every evaluation failed: nothing was found
    reached = next(
        (t.number + 1 for t in result.trials if t.value is not None and t.value <= 1.05 * table.optimum), None
    )
    # Tuning minimised a cost; what is printed is in the file's unit (GFLOP/s stays GFLOP/s).
    best = table.recorded(result.best_value) if math.isfinite(result.best_value) else None
    optimum = table.recorded(table.optimum)
    if args.json:
        out = {
            "file": args.file,
            "strategy": args.strategy,
            "seed": args.seed,
            "objective": table.objective,
            "higher_is_better": table.higher_is_better,
            "best_config": result.best_config,
            "best_value": best,
            "optimum": optimum,
            "optimum_config": table.best_config(),
            "evaluations": result.evaluations,
            "space_size": result.space_size,
            "evaluations_to_1.05x": reached,
            "trials": [t.config for t in result.trials],
            "values": [None if t.value is None else table.recorded(t.value) for t in result.trials],
        }
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        if failed:
            print(f"tuner: replay: every one of {result.evaluations} evaluations failed", file=sys.stderr)
        return 1 if failed else 0
    if failed:
        print(
            f"tuner: replay: every one of {result.evaluations} evaluations failed "
            f"(the table records them as failures); nothing found",
            file=sys.stderr,
        )
        return 1
    ratio = result.best_value / table.optimum  # >= 1: how much worse than the optimum
    way = "higher" if table.higher_is_better else "lower"
    print(
        f"table      {args.file}  ({table.device_name or '?'}, {table.kernel_name or '?'}, "
        f"{result.space_size} configs; {table.objective}, {way} is better)"
    )
    print(f"strategy   {args.strategy}  seed {args.seed}  budget {args.budget}")
    print(f"best found {best:.6g}  ({ratio:.3f}x worse than the optimum)  config {result.best_config}")
    print(f"optimum    {optimum:.6g}  config {table.best_config()}")
    print(
        f"evaluations {result.evaluations}"
        + (f"  (within 1.05x after {reached})" if reached else "  (1.05x not reached)")
    )
    return 0
