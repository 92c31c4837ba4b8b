"""Environment of the child processes that tests start."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def repo_pythonpath(*front: str | os.PathLike[str]) -> str:
    """PYTHONPATH for a child: FRONT, the repository, then the caller's own PYTHONPATH.

    Keeping the caller's entries matters where the dependencies are not installed but on PYTHONPATH
    (the GPU image runs the suite with its packages unpacked into a folder).
    """
    parts = [str(p) for p in front] + [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(p for p in parts if p)
