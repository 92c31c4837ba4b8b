"""The one way tuner parses Python source: `parse(source, filename, mode)`, `ast.parse` under a process-wide
lock.

CPython 3.11 keeps the recursion depth of its AST constructor in state that threads share, so two threads
that parse at once can fail with `SystemError: AST constructor recursion depth mismatch` (python/cpython
gh-106905; seen in tuner when four threads missed the cache of one decorated function at once and each
hashed its source). Parses in tuner are rare (a function's source once per process, a restriction once
per space), so one lock costs nothing measurable and makes them one at a time. Another library's parse
in another thread is not covered.

This module uses only the standard library and imports nothing from tuner, so every layer (the search
spaces included) may use it.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

__all__ = ["parse"]

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """`ast.parse(source, filename, mode)`, one thread at a time (module docstring)."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
