"""Refuse, in one line, to start worker processes from a script that has no main guard.

Worker processes start through 'forkserver' (Linux) or 'spawn', and both import the user's `__main__`
file again in the new process. A script that tunes at its top level, outside
`if __name__ == "__main__":`, then tunes again inside every new process, which starts processes of its own:
hundreds of tracebacks, and no result. Before the first worker starts, the measurer looks at the call stack
for the frame running the main script's top level and at that script's syntax tree: a call that is not
inside a main guard is refused with `MainGuardError`, naming the file and the line.
"""

from __future__ import annotations

import ast
import functools
import sys
from typing import Any

from tuner._parse import parse

__all__ = ["MainGuardError", "check_main_guard", "unguarded_call_site"]


class MainGuardError(RuntimeError):
    """Worker processes would re-run the calling script's unguarded top level."""


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


@functools.lru_cache(maxsize=16)
def _guarded_ranges(path: str) -> tuple[tuple[int, int], ...] | None:
    """Line ranges of the bodies of `if __name__ == "__main__":` blocks; None if the file cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = parse(f.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            out.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return tuple(out)


def unguarded_call_site(frame: Any = None) -> tuple[str, int] | None:
    """(file, line) of the main script's top-level statement that led here, when that statement is not
    inside a main guard; None when it is, or when there is no main script file (REPL, `python -c`,
    notebooks: nothing is re-imported then) or its source cannot be read."""
    main = sys.modules.get("__main__")
    if not getattr(main, "__file__", None):
        return None
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "<module>" and f.f_globals.get("__name__") == "__main__":
            path, line = f.f_code.co_filename, f.f_lineno
            ranges = _guarded_ranges(path)
            if ranges is None or any(a <= line <= b for a, b in ranges):
                return None
            return path, line
        f = f.f_back
    return None


def check_main_guard(start_method: str) -> None:
    """Raise `MainGuardError` when workers started with `start_method` would re-run an unguarded script."""
    if start_method == "fork":
        return
    site = unguarded_call_site(sys._getframe(1))
    if site is not None:
        path, line = site
        raise MainGuardError(
            f"tuner measures in worker processes, which re-import {path}: move the tuning call at line "
            f'{line} under `if __name__ == "__main__":` (or measure with isolation="inprocess")'
        )
