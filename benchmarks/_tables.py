"""Which files under a folder of Kernel Tuner tables are tables to replay, for every benchmark script; and the
argparse `type=` functions the scripts share, so that a bad argument is refused as bad usage (exit 2, one
line) before any work; and a TUNER_HOME of their own that does not outlive the run.

The hub's folders (../benchmarks/data/README.md says where they come from) hold, beside each GPU's cache
file, files that are not tables of their own: the T4 copy of a cache file (the same table again: it would
leak a held-out table into its own leave-one-out prior) and Kernel Tuner's results and metadata files.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import glob
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

NOT_TABLES = ("_T4", "-results", "-metadata")


def is_table_file(path: str | Path) -> bool:
    """Whether `path` is a table to replay (`KERNEL/GPU.json[.gz]`), not one of `NOT_TABLES`."""
    return not Path(path).name.split(".json")[0].endswith(NOT_TABLES)


def table_files(data: str | Path, patterns: Sequence[str] = ("*/*.json*",), *, script: str = "") -> list[str]:
    """The table files matching any of `patterns` (globs relative to `data`), sorted; says on stderr how
    many matches were skipped as not tables of their own."""
    found = sorted(
        {str(Path(f)) for p in patterns for f in glob.glob(str(Path(data) / p)) if Path(f).is_file()}
    )
    files = [f for f in found if is_table_file(f)]
    if len(files) < len(found):
        print(
            f"{script or 'tables'}: skipped {len(found) - len(files)} files that are not tables of their own "
            f"(names ending in {', '.join(NOT_TABLES)})",
            file=sys.stderr,
        )
    return files


@contextlib.contextmanager
def quiet_logging() -> Iterator[None]:
    """Log records below ERROR dropped while inside (tuner's notes on each of thousands of replayed runs would
    bury the figures), and the process's previous `logging.disable` level put back after: a caller in the same
    process (a test calling a script's `main`) keeps its logging. Also a decorator: `@quiet_logging()`."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def positive_int(text: str) -> int:
    """argparse `type=`: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n


def positive_ints(text: str) -> list[int]:
    """argparse `type=`: a comma-separated list of integers >= 1 ('5,10,20')."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("no number given")
    return [positive_int(p) for p in parts]


def positive_float(text: str) -> float:
    """argparse `type=`: a finite number > 0."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text}")
    return x


def existing_dir(text: str) -> str:
    """argparse `type=`: a folder that exists."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no folder {text}")
    return text


def out_dir(text: str) -> str:
    """argparse `type=`: a folder to write into, there or to be made (no file in the way of it)."""
    p = Path(text)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise argparse.ArgumentTypeError(f"{q} is a file, not a folder")
            break
    return text


def temp_dir(prefix: str) -> str:
    """A new temporary folder, removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def temp_tuner_home(prefix: str = "tuner-bench-") -> str:
    """TUNER_HOME for this run: the caller's where it is set, else a `temp_dir` (a check's store and cache
    files are of no use after it)."""
    if not os.environ.get("TUNER_HOME"):
        os.environ["TUNER_HOME"] = temp_dir(prefix)
    return os.environ["TUNER_HOME"]
