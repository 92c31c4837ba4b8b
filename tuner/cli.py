"""The `tuner` command line. Each subcommand lives in `tuner/commands/<name>.py` with `add_parser` and `run`.

Exit codes: 0 success; 2 bad usage or bad input (one line on stderr, nothing changed); 1 any other failure;
130 interrupted; 141 (128 + SIGPIPE) when stdout was closed early, as in `tuner cache show | head`, which
ends quietly. `-v`/`--verbose` is accepted before or after the subcommand; `tuner --version` and
`python -m tuner` behave as usual.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

# Subcommand modules under tuner.commands, in the order `tuner --help` lists them.
COMMANDS = ["replay", "kernels", "check", "cache", "study", "regress", "misses"]

EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command ended by SIGPIPE


class _Parser(argparse.ArgumentParser):
    """Every parser of the tree takes the global options, so they may follow the subcommand
    (`tuner study run X -v`). Nested subparsers inherit this class from their parent."""

    def __init__(self, *args: Any, _top: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(
            "-v",
            "--verbose",
            action="count",
            # Only the top level sets a default: a subparser's default would reset a -v given before it.
            default=0 if _top else argparse.SUPPRESS,
            help="more log output (-vv for debug); anywhere on the command line",
        )


def build_parser() -> argparse.ArgumentParser:
    from tuner import __version__

    parser = _Parser(
        prog="tuner", description="ML-guided autotuning for Triton and Pallas kernels.", _top=True
    )
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        mod = importlib.import_module(f"tuner.commands.{name}")
        mod.add_parser(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass


def _bad_store_url(exc: BaseException) -> bool:
    """Whether `exc` is (or was raised from) SQLAlchemy's refusal of a store URL as written: a dialect it
    does not know (`bogus://x`) or a URL it cannot parse. An unreachable server or a missing driver
    package is no such refusal (exit 1)."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None:
        return False
    refusals = (sa_exc.NoSuchModuleError, sa_exc.ArgumentError)
    cur: BaseException | None = exc
    for _ in range(6):  # the exception and what it was raised from
        if cur is None:
            return False
        if isinstance(cur, refusals):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _home_hint(exc: BaseException) -> str:
    """For a folder or file under `$TUNER_HOME` that could not be made (a read-only home, a file in the
    way): which setting names it, since the error alone names only a path the user never typed."""
    if not isinstance(exc, OSError) or not isinstance(exc.filename, (str, bytes, os.PathLike)):
        return ""
    from pathlib import Path

    from .store import tuner_home

    home = Path(os.path.abspath(tuner_home()))
    where = Path(os.path.abspath(os.fsdecode(exc.filename)))
    if where != home and home not in where.parents:
        return ""
    return f" (TUNER_HOME is {home}: set it to a folder this user can write)"


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import BadInput

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away is seen here, not at exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except BadInput as exc:
        print(f"tuner: error: {_one_line(exc) or exc.__class__.__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        if _bad_store_url(exc):  # a --storage URL that names no database: bad usage, nothing opened
            print(f"tuner: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        from .measure._gate import backend_hint  # `tuner check` without torch/jax: say how to get them

        print(
            f"tuner: failed: {exc.__class__.__name__}: {_one_line(exc)}{backend_hint(exc)}{_home_hint(exc)}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
