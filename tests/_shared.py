"""Expensive test setup made once per test run, not once per pytest-xdist worker: the workers of one run
share the parent of their base temporary folders (`popen-gw0`, `popen-gw1`, ...), and the first worker to
need a result makes it there under a file lock while the others wait and then reuse it. This is the
pattern pytest-xdist documents for session data ("Making session-scoped fixtures execute only once").
Without xdist (or without `fcntl`), the folder is in the process's own base temporary folder and made once
by it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_DONE = ".made"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no file locks here: the folder is this process's own (see `made_once`)
        yield
        return
    with path.open("a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` of this test run, which `make(folder)` filled once: by this process, or by
    another xdist worker of the same run before it. A `make` that raised leaves no result: the next
    process to ask makes it anew (and fails the same way, in its own test)."""
    base = tmp_path_factory.getbasetemp()
    shared = (
        os.environ.get("PYTEST_XDIST_WORKER") is not None and importlib.util.find_spec("fcntl") is not None
    )
    root = base.parent if shared else base
    folder = root / f"made-once-{name}"
    with _locked(root / f"made-once-{name}.lock"):
        if (folder / _DONE).exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # what a `make` that raised left
        folder.mkdir()
        make(folder)
        (folder / _DONE).touch()
    return folder
