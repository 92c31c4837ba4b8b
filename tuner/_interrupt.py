"""Ctrl-C while the `tuner` command starts: `import tuner` (numpy and the rest) takes a noticeable time
before `tuner.cli.main` can catch KeyboardInterrupt, and an interrupt there printed a traceback. When this
process is the `tuner` command (its console script, `python -m tuner`, or `python -m tuner.cli`, as a
study's runner starts its workers), `import tuner` first installs a SIGINT handler that says
`tuner: interrupted` and exits 130, as `main` does; `main` puts Python's own handler back as it starts
(`started`). In any other process nothing is changed: a program that imports tuner keeps its own Ctrl-C."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

EXIT_INTERRUPTED = 130
# Whether this process is the `tuner` command (`install_if_command` installed its start-up handler).
_command_process = False
_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")
# `python -m tuner`, and `python -m tuner.cli`: how a study's runner starts its worker processes
_COMMAND_MODULES = ("tuner", "tuner.cli")


def _run_as_module() -> bool:
    """Whether the interpreter's command line is `python [options] -m tuner ...` (or `-m tuner.cli`)."""
    argv = list(getattr(sys, "orig_argv", ()))[1:]
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return i + 1 < len(argv) and argv[i + 1] in _COMMAND_MODULES
        if a.startswith("-m"):
            return a[2:] in _COMMAND_MODULES
        if a in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if a == "-c" or not a.startswith("-") or a == "-":
            return False
        i += 1
    return False


def _console_script() -> bool:
    """Whether the main program is the `tuner` console script that installers write."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not sys.argv or os.path.abspath(sys.argv[0]) != os.path.abspath(path):
        return False
    return os.path.basename(path) in ("tuner", "tuner-script.py")


def _interrupted(signum: int, frame: Any) -> None:
    """Say so and end the process at once. No exception: one raised here, inside an import that C code
    runs (numpy's extension imports `datetime` through `PyCapsule_Import`), was turned by that code into
    an ImportError, and the command printed numpy's 50-line "Importing the numpy C-extensions failed"
    traceback and exited 1. Nothing is open or half written yet (`main` has not started), so nothing
    needs the interpreter's clean-up."""
    try:
        sys.stderr.write("tuner: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def install_if_command() -> None:
    """At the start of `import tuner`: the command's start-up handler, when this process is the command and
    SIGINT has Python's default handler (not ignored, not the program's own)."""
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        if _run_as_module() or _console_script():
            global _command_process
            _command_process = True
            signal.signal(signal.SIGINT, _interrupted)
            atexit.register(_ignore_at_exit)  # registered first: runs last
    except (ValueError, OSError):  # not the main thread, or no SIGINT here
        pass


def started() -> None:
    """`tuner.cli.main` starts: Python's own handler again (KeyboardInterrupt), which `main` catches."""
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):
        pass


# Whether `tuner.cli.main` runs in this process (how many calls of it: a test may nest them), and what to undo
# when the last ends: a process-wide setting that only the command makes (`storage._interruptible`'s psycopg2
# wait callback, which makes a wait for the PostgreSQL server end on Ctrl-C).
_commands = 0
_at_end: list[Callable[[], None]] = []


@contextlib.contextmanager
def command_running() -> Iterator[None]:
    """`tuner.cli.main` runs inside: `in_command()` is true; the `at_command_end` callbacks run after."""
    global _commands
    _commands += 1
    try:
        yield
    finally:
        _commands -= 1
        if _commands == 0:
            while _at_end:
                _at_end.pop()()


def in_command() -> bool:
    """Whether this process runs the `tuner` command now (`command_running`), not a program's call."""
    return _commands > 0


def at_command_end(undo: Callable[[], None]) -> None:
    """Call `undo` when the command ends (`command_running`)."""
    _at_end.append(undo)


def finished(code: int) -> None:
    """`tuner.cli.main` returns `code`. In the command's process, a Ctrl-C from now on, while the interpreter
    exits (joining threads, `atexit`), ends it at once with that status: Python's handler raised a
    KeyboardInterrupt there, printed as an "Exception ignored" traceback, and one that came after Python
    put SIGINT's default back (late in its exit) ended the process as killed by SIGINT (-2) after the
    command had said how it ended. Elsewhere (main called by a program, a test) nothing changes."""
    if not _command_process:
        return

    def _exit_now(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for _ in range(3):  # setting a handler runs the one before for a signal already pending
        try:
            signal.signal(signal.SIGINT, _exit_now)
            return
        except KeyboardInterrupt:
            continue
        except (ValueError, OSError):  # not the main thread
            return


def _ignore_at_exit() -> None:
    """The last `atexit` callback of the command's process: SIGINT ignored for the rest of the exit, in which
    Python puts back the default handler (the process killed, -2) of a signal that had a Python one."""
    with contextlib.suppress(ValueError, OSError, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
