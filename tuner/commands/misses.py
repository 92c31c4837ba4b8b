"""`tuner misses`: what record mode saw production miss; and `tuner study from-misses` (registered under
`tuner study`, see `add_from_misses_parser`): a study file that tunes those keys (docs/production.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import check_out_file, kernel_hint


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "misses",
        help="list the keys record mode saw production miss",
        description="List the misses recorded by record mode (TUNER_MODE=record): kernel, key, dtypes, "
        "device, calls and the fallback production used, most-called first. Read from "
        "$TUNER_MISSES_DIR, default $TUNER_HOME/misses.",
    )
    p.add_argument("--dir", type=Path, default=None, help="the miss-log folder (default: $TUNER_HOME/misses)")
    p.add_argument(
        "--kernel", action="append", default=None, help="only this kernel's misses (repeat for more)"
    )
    p.add_argument("--min-calls", type=int, default=1, metavar="N", help="only keys called at least N times")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--clear", action="store_true", help="delete the miss logs (after listing nothing)")
    p.set_defaults(func=run_misses)


def _selected(args: argparse.Namespace) -> str:
    """What `--kernel` and `--min-calls` selected, said after a count ("of rmsnorm, called at least 5
    times"); empty when they select everything."""
    parts = [f"of {', '.join(dict.fromkeys(args.kernel))}"] if args.kernel else []
    if args.min_calls > 1:
        parts.append(f"called at least {args.min_calls} times")
    return ", ".join(parts)


def _rows(args: argparse.Namespace) -> tuple[list[Any], int]:
    """The misses `--kernel` and `--min-calls` select, and how many keys were recorded in all."""
    from tuner.errors import BadInput
    from tuner.runtime import read_misses

    if args.min_calls < 1:
        raise BadInput(f"--min-calls must be >= 1, got {args.min_calls}")
    if args.dir is not None and not args.dir.is_dir():
        raise BadInput(f"--dir {args.dir} is not a folder")
    rows = read_misses(args.dir)
    names = sorted({r.kernel for r in rows})
    for kernel in dict.fromkeys(args.kernel or ()):  # on stderr, so that --json's stdout stays JSON lines
        hint = kernel_hint(kernel, names, holds="they hold")
        if hint:
            print(f"tuner: warning: the recorded misses hold no kernel {kernel!r}; {hint}", file=sys.stderr)
    kept = [r for r in rows if r.calls >= args.min_calls and (not args.kernel or r.kernel in args.kernel)]
    return kept, len(rows)


def run_misses(args: argparse.Namespace) -> int:
    if args.clear:
        from tuner.runtime._misses import clear_misses

        print(f"removed {clear_misses(args.dir)} miss log files")
        return 0
    rows, recorded = _rows(args)
    if args.json:
        for r in rows:
            print(json.dumps(r.to_json(), sort_keys=True))
        return 0
    selected = _selected(args)
    if not rows:
        if recorded and selected:  # misses were recorded, and the options selected none of them
            print(f"no recorded misses {selected} ({recorded} keys recorded in all)")
        else:
            print("no recorded misses (run production with TUNER_MODE=record)")
        return 0
    print(f"{'calls':>8}  {'kernel':24s} {'key':40s} {'dtypes':14s} {'device':18s} fallback")
    for r in rows:
        key = ",".join(f"{k}={v}" for k, v in r.key.fields)
        fb = r.fallback.removeprefix("offline: ").split(" (")[0]
        print(
            f"{r.calls:8d}  {r.kernel[:24]:24s} {key[:40]:40s} {','.join(r.key.dtypes)[:14]:14s} "
            f"{r.key.device[:18]:18s} {fb}"
        )
    print(f"{len(rows)} keys, {sum(r.calls for r in rows)} calls" + (f" {selected}" if selected else ""))
    return 0


def add_from_misses_parser(ssub: Any) -> None:
    """`tuner study from-misses`, added to the `tuner study` subcommands."""
    f = ssub.add_parser(
        "from-misses",
        help="write a study file for the misses record mode recorded",
        description="Turn the misses recorded by record mode into a study file: registered kernels x "
        "the shapes production called, most-called first, trial budgets weighted by calls.",
    )
    f.add_argument("--out", required=True, metavar="STUDY.toml", help="the study file to write")
    f.add_argument("--min-calls", type=int, default=1, metavar="N", help="only keys called at least N times")
    f.add_argument("--dir", type=Path, default=None, help="the miss-log folder (default: $TUNER_HOME/misses)")
    f.add_argument(
        "--kernel",
        action="append",
        default=None,
        help="only this kernel's misses (repeat for more; e.g. the functions of one service when several "
        "record into one folder)",
    )
    f.add_argument("--name", default="from_misses", help="the study's name (default: from_misses)")
    f.add_argument("--trials", type=int, default=20, help="trials per task before weighting (default: 20)")
    f.add_argument("--seconds", type=float, default=None, help="time budget per task, seconds")
    f.add_argument("--strategy", default="auto", help="search strategy (default: auto)")
    f.add_argument(
        "--finalists", type=int, default=None, help="finalists re-measured per task (study default)"
    )
    f.add_argument("--device", default=None, help="the study's device arch (default: the recorded one)")
    f.add_argument(
        "--factory",
        default=None,
        metavar="MODULE:FUNCTION",
        help="write a study of the decorated functions' misses instead, with this input factory: "
        "factory(kernel, key fields, dtypes) -> (decorated function, args, kwargs) (docs/production.md in "
        "tuner's source repository)",
    )
    f.add_argument("--output", default=None, help="the study's output folder (default: the study default)")
    f.set_defaults(func=run_from_misses)


def run_from_misses(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.studies._from_misses import (
        DECORATED_EXECUTOR,
        decorated_study,
        render_study,
        study_from_misses,
    )

    check_out_file(args.out, "study file")
    min_calls = args.min_calls
    args.min_calls = 1
    rows, _ = _rows(args)
    kernels = list(dict.fromkeys(args.kernel or ()))
    if min_calls < 1:
        raise BadInput(f"--min-calls must be >= 1, got {min_calls}")
    if args.factory:
        ignored = [
            o for o, v in (("--device", args.device), ("--finalists", args.finalists)) if v is not None
        ]
        if ignored:
            raise BadInput(
                f"{' and '.join(ignored)} {'do' if len(ignored) > 1 else 'does'} not apply with --factory: "
                "a decorated function tunes on the "
                "machine that runs the study, with its own measurement"
            )
        dec = decorated_study(
            rows,
            args.factory,
            name=args.name,
            min_calls=min_calls,
            trials=args.trials,
            seconds=args.seconds,
            strategy=args.strategy,
            output=args.output,
            kernels=kernels,
        )
        path = render_study(dec, args.out, check_kernels=False)
        left = [f"{dec.skipped_calls} calls under --min-calls {min_calls} left out"]
        if dec.registered:
            left.append(
                f"{dec.registered} misses of registered kernels listed as comments (without --factory, "
                "from-misses writes their study)"
            )
        print(
            f"study: {path} ({dec.tasks} tasks of {', '.join(dec.kernels)}; {'; '.join(left)}); tune with: "
            f"tuner study run {path} --executor {DECORATED_EXECUTOR}"
        )
        return 0
    res = study_from_misses(
        rows,
        name=args.name,
        min_calls=min_calls,
        trials=args.trials,
        seconds=args.seconds,
        strategy=args.strategy,
        device=args.device,
        output=args.output,
        finalists=args.finalists,
        kernels=kernels,
    )
    path = render_study(res, args.out)
    print(
        f"study: {path} ({res.tasks} tasks of {', '.join(res.kernels)}; "
        f"{res.skipped_calls} calls under --min-calls {min_calls} left out"
        + (
            f"; {res.unregistered} misses of decorated functions listed as comments"
            if res.unregistered
            else ""
        )
        + ")"
    )
    return 0
