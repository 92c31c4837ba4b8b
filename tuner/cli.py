"""The `tuner` command line. Each subcommand lives in `tuner/commands/<name>.py` with `add_parser` and `run`.

Exit codes: 0 success; 2 bad usage or bad input (one line on stderr, nothing changed; argparse's own refusals
too); 1 any other failure;
130 interrupted; 141 (128 + SIGPIPE) when stdout was closed early, as in `tuner cache show | head`, which
ends quietly. Under `--json` an error the command did not handle itself also prints one JSON object,
`{"ok": false, "error": ...}`, on stdout, so a script that reads stdout gets a document. `-v`/`--verbose` is accepted before or after the subcommand; `tuner --version` and
`python -m tuner` behave as usual.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._interrupt import EXIT_INTERRUPTED, command_running, finished, started
from .errors import BadInput

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

    def error(self, message: str) -> Any:  # -> NoReturn; argparse's own signature
        """argparse's refusal (an unknown option, a value of the wrong type, a missing argument) as the
        CLI's other bad input: one line on stderr, exit 2, and the JSON error object under `--json`
        (argparse printed its usage over several lines and exited before `--json` was read)."""
        raise _UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extras = super().parse_known_args(args, namespace)
        if not hasattr(ns, _PROG):  # the innermost parser (the subcommand's) returns first
            setattr(ns, _PROG, self.prog)
        return ns, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, with an unrecognized argument refused in the name of the subcommand that was
        parsed (`see tuner cache show --help`): argparse reports it from the top parser (`tuner`)."""
        ns, extras = self.parse_known_args(args, namespace)
        prog = vars(ns).pop(_PROG, self.prog)
        if extras:
            raise _UsageError(f"unrecognized arguments: {' '.join(extras)} (see {prog} --help)")
        return ns


_PROG = "_tuner_prog"  # the namespace attribute that carries the parsed subcommand's prog to `parse_args`


class _UsageError(BadInput):
    """argparse refused the command line; `main` prints it as any `BadInput`."""


def _asks_json(argv: Sequence[str]) -> bool:
    """Whether a command line that argparse refused asked for `--json` (before a `--` that ends options)."""
    argv = list(argv)
    if "--" in argv:
        argv = argv[: argv.index("--")]
    return "--json" in argv


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


def _json_error(args: argparse.Namespace | None, message: str, argv: Sequence[str] = ()) -> None:
    """Under `--json`: the error the command did not handle as one JSON object on stdout (the commands'
    own refusals print `{"ok": false, "error": ...}` too), beside the line on stderr. `args` is None when
    argparse refused the command line (`argv`)."""
    if not (getattr(args, "json", False) if args is not None else _asks_json(argv)):
        return
    try:
        sys.stdout.write(json.dumps({"ok": False, "error": message}, sort_keys=True) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the reader went away, or stdout is closed: stderr says it
        _silence_stdout()


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

    try:
        home = Path(os.path.abspath(tuner_home()))
    except OSError:  # no home at all: its own error says so
        return ""
    where = Path(os.path.abspath(os.fsdecode(exc.filename)))
    if where != home and home not in where.parents:
        return ""
    return f" (TUNER_HOME is {home}: set it to a folder this user can write)"


def _locale_hint(exc: BaseException) -> str:
    """For a path or text this locale cannot encode (a study's `output = "résultats"` under
    `LC_ALL=C PYTHONUTF8=0`, where Python's file system encoding is ascii): the remedy."""
    if not isinstance(exc, UnicodeError) or sys.getfilesystemencoding().lower().replace("-", "") == "utf8":
        return ""
    from .storage._engine import locale_hint

    return f" ({locale_hint()})"


def _reading(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """For a command that only reads a store (its parser's `reads_only`: its name, or a function of the
    arguments giving it or None): a store of an older tuner's schema is refused, not upgraded in place
    (`tuner.storage.only_reading`)."""
    reads = getattr(args, "reads_only", None)
    name = reads(args) if callable(reads) else reads
    if not name:
        return contextlib.nullcontext()
    from tuner.storage import only_reading

    return only_reading(name)


def main(argv: Sequence[str] | None = None) -> int:
    code: Any = 1
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's line was written
        code = EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    finally:
        finished(code)  # a Ctrl-C while the process exits: ends it with this status (the command's process)
    return code


def _main(argv: Sequence[str] | None) -> int:
    args: argparse.Namespace | None = None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # an interrupt from here on is a KeyboardInterrupt caught below; before (while `import tuner`
        # ran), the command's start-up handler said the same (`tuner._interrupt`)
        started()
        args = build_parser().parse_args(argv)  # imports every command's module
        logging.basicConfig(
            level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s"
        )
        with command_running(), _reading(args):
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away is seen here, not at exit
        return code
    except KeyboardInterrupt:
        _json_error(args, "interrupted")
        print("tuner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except BadInput as exc:
        message = _one_line(exc) or exc.__class__.__name__
        _json_error(args, message, argv)
        print(f"tuner: error: {message}", file=sys.stderr)
        return 2
    except Exception as exc:
        if _bad_store_url(exc):  # a --storage URL that names no database: bad usage, nothing opened
            message, prefix, code = _one_line(exc), "error", 2
        else:
            from .measure._gate import backend_hint  # `tuner check` without torch/jax: how to get them

            message = (
                f"{exc.__class__.__name__}: {_one_line(exc)}{backend_hint(exc)}{_home_hint(exc)}"
                f"{_locale_hint(exc)}"
            )
            prefix, code = "failed", 1
        _json_error(args, message)
        if args is None or args.verbose:
            raise
        print(f"tuner: {prefix}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
