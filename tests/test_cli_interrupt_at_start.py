"""Ctrl-C while the `tuner` command starts (importing tuner, numpy and the command modules, before `main`
catches KeyboardInterrupt) exits 130 with the usual one line, as an interrupt later does. It printed a
Python traceback (and the process died of SIGINT). A program that imports tuner keeps its own Ctrl-C.

The child stops inside the import (a finder that `sitecustomize` puts first on `sys.meta_path` waits when
the named module is imported, after saying so on stdout), so the interrupt lands there every time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._env import repo_pythonpath

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

_SITE = """
import sys, time

class _Pause:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.stdout.write("importing\\n")
            sys.stdout.flush()
            time.sleep(120)
        return None

sys.meta_path.insert(0, _Pause())
"""

# what installers write as the `tuner` console script (pip's template)
_SCRIPT = """import sys
from tuner.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""


def _interrupt_while_importing(tmp_path: Path, module: str, argv: list[str]) -> tuple[int, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE.format(module=module))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), repo_pythonpath()]),
        "TUNER_HOME": str(tmp_path / "home"),
    }
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # the child is inside the import now
        assert line == "importing\n", (line, p.stderr.read() if p.stderr else "")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, err


@pytest.mark.parametrize(
    "module",
    ["numpy", "datetime", "tuner.commands.cache"],
    # datetime: imported first by numpy's C extension (PyCapsule_Import), which turned the interrupt's
    # exception into an ImportError: numpy's long traceback and exit 1
    ids=["import tuner", "a C extension's import", "command modules"],
)
@pytest.mark.parametrize("how", ["console script", "python -m tuner", "python -m tuner.cli"])
def test_ctrl_c_while_the_command_starts_exits_130_in_one_line(tmp_path: Path, module: str, how: str) -> None:
    """`python -m tuner.cli` is how a study's runner starts its workers (`tuner study run --workers N`):
    a Ctrl-C while a worker still imported printed that worker's traceback."""
    if how == "console script":
        script = tmp_path / "tuner"
        script.write_text(_SCRIPT)
        argv = [sys.executable, str(script), "cache", "show"]
    else:
        argv = [sys.executable, "-m", how.split()[-1], "cache", "show"]
    code, err = _interrupt_while_importing(tmp_path, module, argv)
    assert (code, err) == (130, "tuner: interrupted\n")


def test_a_program_that_imports_tuner_keeps_its_own_ctrl_c(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import tuner"]
    code, err = _interrupt_while_importing(tmp_path, "numpy", argv)
    assert code == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt"), err
