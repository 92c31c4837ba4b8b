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
    (site / "sitecustomize.py").write_text(_SITE.format(module=module), encoding="utf-8")
    return _interrupt_on(argv, site, "importing\n", {"TUNER_HOME": str(tmp_path / "home")})


def _interrupt_on(argv: list[str], site: Path, line: str, env: dict[str, str]) -> tuple[int, str]:
    """Run `argv` with the `sitecustomize` of the folder `site`, send it SIGINT once it wrote `line` on
    stdout (the child is where the test wants it then); its exit status and stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo_pythonpath()]), **env}
    p = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8"
    )
    try:
        assert p.stdout is not None
        seen = [p.stdout.readline()]
        while seen[-1] not in (line, ""):
            seen.append(p.stdout.readline())
        assert seen[-1] == line, (seen, p.stderr.read() if p.stderr else "")
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
        script.write_text(_SCRIPT, encoding="utf-8")
        argv = [sys.executable, str(script), "cache", "show"]
    else:
        argv = [sys.executable, "-m", how.split()[-1], "cache", "show"]
    code, err = _interrupt_while_importing(tmp_path, module, argv)
    assert (code, err) == (130, "tuner: interrupted\n")


def test_a_program_that_imports_tuner_keeps_its_own_ctrl_c(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import tuner"]
    code, err = _interrupt_while_importing(tmp_path, "numpy", argv)
    assert code == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt"), err


# A thread that keeps the child's exit waiting (Python joins the threads that are not daemons when the
# main thread is done), after saying so on stdout.
_LINGER = """
import sys, threading, time

def _linger():
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    sys.stdout.write("exiting\\n")
    sys.stdout.flush()
    time.sleep(120)

threading.Thread(target=_linger, name="linger").start()
"""


@pytest.mark.parametrize(("argv", "status"), [(["--version"], 0), (["study", "run", "none.toml"], 2)])
def test_ctrl_c_while_the_finished_command_exits(tmp_path: Path, argv: list[str], status: int) -> None:
    """Once `main` returned, a Ctrl-C while the interpreter exits ends the process at once with the
    command's status and no traceback. Python's handler printed an "Exception ignored ... KeyboardInterrupt"
    traceback from its thread shutdown, and late in the exit, where Python puts SIGINT's default back, the
    process died of the signal (-2) after the command had said how it ended."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_LINGER, encoding="utf-8")
    code, err = _interrupt_on([sys.executable, "-m", "tuner", *argv], site, "exiting\n", {})
    assert code == status and "KeyboardInterrupt" not in err and "Traceback" not in err, err
