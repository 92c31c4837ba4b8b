"""Which files under a folder of Kernel Tuner tables are tables to replay, for every benchmark script.

The hub's folders (../benchmarks/data/README.md says where they come from) hold, beside each GPU's cache
file, files that are not tables of their own: the T4 copy of a cache file (the same table again: it would
leak a held-out table into its own leave-one-out prior) and Kernel Tuner's results and metadata files.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import sys
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
