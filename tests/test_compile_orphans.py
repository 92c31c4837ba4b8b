"""A compile process (`tuner.measure._compile`, a plain subprocess of the tuning process) must not outlive
its parent. An idle one reads EOF on stdin and exits, but one that is busy compiling when its parent is
killed (SIGKILL, an OOM kill) read nothing until its compile ended, and went on as an orphan for as long
as that took (for ever, for a hung compile). Real processes and a real SIGKILL; the compile is made
busy by a `sitecustomize` that makes the child's request parsing wait (no GPU, no Triton needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests._env import repo_pythonpath
from tests.test_measure import _running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and signals")

_SITE = """
import os, sys, time
if "tuner.measure._compile" in getattr(sys, "orig_argv", ()):
    import json
    _loads = json.loads
    def loads(s, *a, **k):  # the child's request: say so, then stay busy as a long compile does
        if "BUSY" in s:
            open(os.environ["BUSY_FLAG"], "w").close()
            time.sleep(120)
        return _loads(s, *a, **k)
    json.loads = loads
"""

_PARENT = """
import json, os, signal, sys, time
from tuner.measure._compile import _Proc, _child_env
p = _Proc(_child_env(None))
p.start()
p.p.stdin.write((json.dumps({"kernel": "BUSY", "arch": "sm90", "config": {}, "problem": {}}) + "\\n").encode())
p.p.stdin.flush()
while not os.path.exists(os.environ["BUSY_FLAG"]):
    time.sleep(0.02)
print(p.p.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the tuning process dies while its compile process is busy
"""


def test_a_busy_compile_process_dies_with_its_parent(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_SITE), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": repo_pythonpath(site),
        "BUSY_FLAG": str(tmp_path / "busy"),
        "TMPDIR": str(tmp_path),
    }
    p = subprocess.run(
        [sys.executable, "-c", _PARENT],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
        encoding="utf-8",
    )
    assert p.returncode == -signal.SIGKILL, p
    child = int(p.stdout.strip())
    deadline = time.monotonic() + 30
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the compile process outlived the process that started it (an orphan)")
