"""What a call into tuner is given is not kept alive after it returns by the first import of Optuna.

Optuna keeps the ImportError of each optional package it lacks (a traceback, with its frames), and a kept
frame keeps its caller: imported on the caller's stack, the first tuning of a process kept the caller's
arguments (a user's tensors, a jax trace's tracers) for as long as the process lived. `tuner._scoped.
import_apart` imports it in a thread of its own. Each case runs in a fresh process: Optuna not imported yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._env import repo_pythonpath

_PROGRAM = """
import gc, json, sys, weakref

import numpy as np

import tuner


def autotune():
    @tuner.autotune(tuner.SearchSpace.from_configs([{"s": 1}, {"s": 2}]), key=lambda x: {"n": x.size})
    def f(x, *, s):
        return x * s

    x = np.ones(1000, np.float32)  # the caller's array
    f(x)  # the first tuning of the process
    return weakref.ref(x)


def optimize():
    payload = np.ones(1000, np.float32)  # held by the caller's frame while it tunes
    space = tuner.SearchSpace.from_configs([{"a": a} for a in (1, 2, 3)])
    tuner.optimize(space, lambda c: float(c["a"]), budget=2)
    return weakref.ref(payload)


assert "optuna" not in sys.modules
ref = {"autotune": autotune, "optimize": optimize}[sys.argv[1]]()
gc.collect()
print(json.dumps({"optuna": "optuna" in sys.modules, "alive": ref() is not None}))
"""


# autotune: kept on every Python before the fix; optimize: on Python 3.12 and newer only (its first import
# of Optuna was in a generator's frame, whose kept frame did not keep its caller before 3.12)
@pytest.mark.parametrize("case", ["autotune", "optimize"])
def test_first_tuning_keeps_nothing_of_its_caller(case: str, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(_PROGRAM), encoding="utf-8")
    env = {"PYTHONPATH": repo_pythonpath(), "TUNER_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, str(script), case],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip().splitlines()[-1]
    assert out == '{"optuna": true, "alive": false}', proc.stderr[-3000:]
