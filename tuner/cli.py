"""The `tuner` command line. Each subcommand lives in `tuner/commands/<name>.py` with `add_parser`
and `run`; exit codes follow CONTRACTS.md: 0 success, 2 bad usage or input, 1 any other failure."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Subcommand modules under tuner.commands, in the order `tuner --help` lists them.
COMMANDS = ["replay", "kernels", "check", "cache", "study", "regress", "misses"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner", description="ML-guided autotuning for Triton and Pallas kernels."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        mod = importlib.import_module(f"tuner.commands.{name}")
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import BadInput

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except BadInput as exc:
        print(
            f"tuner: error: {str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        print(
            f"tuner: failed: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
