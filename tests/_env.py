"""Environment of the child processes that tests start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def quick_cpu_xla_flags() -> str:
    """XLA flags that compile the tests' tiny jax programs on the CPU faster, computing the same: the LLVM
    back end at optimisation level 1, not 2, and, with the jaxlib of constraints.txt (0.10), XLA's older
    CPU code emitters, not its fusion emitters. That flag is not passed to another jaxlib: XLA aborts the
    process on a flag it does not know, and a later one may drop it."""
    from importlib.metadata import PackageNotFoundError, version

    flags = "--xla_backend_optimization_level=1"
    try:
        if version("jaxlib").startswith("0.10."):
            flags += " --xla_cpu_use_fusion_emitters=false"
    except PackageNotFoundError:
        pass
    return flags


def repo_pythonpath(*front: str | os.PathLike[str]) -> str:
    """PYTHONPATH for a child: FRONT, the repository, then the caller's own PYTHONPATH.

    Keeping the caller's entries matters where the dependencies are not installed but on PYTHONPATH
    (the GPU image runs the suite with its packages unpacked into a folder).
    """
    parts = [str(p) for p in front] + [str(REPO)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(p for p in parts if p)


def cpu_jax_program(tmp_path: Path, source: str) -> Callable[[], dict[str, Any]]:
    """A function that runs `source` (dedented, written to `tmp_path/program.py`) in a fresh Python with
    jax on the CPU, `TUNER_HOME` at `tmp_path` and no inherited `XLA_FLAGS` (the program sets its own
    device count), asserts it exits 0 and returns the JSON of its last line of output. Called twice, the
    second process shares the first's store."""
    env = {**os.environ, "TUNER_HOME": str(tmp_path), "JAX_PLATFORMS": "cpu", "PYTHONPATH": repo_pythonpath()}
    env.pop("XLA_FLAGS", None)
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")

    def run() -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            encoding="utf-8",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run
