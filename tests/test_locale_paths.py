"""tuner under a C locale with Python's UTF-8 mode off (`LC_ALL=C PYTHONUTF8=0`): the file system encoding
is ascii, so a folder named with other letters reaches Python as undecodable bytes (str with surrogate
escapes). Such a path can be opened, but not written as text: not in a SQLite URL (SQLAlchemy encodes it as
UTF-8), not in a UTF-8 file. tuner says so in one line naming the remedy, rather than a UnicodeEncodeError
from deep inside SQLAlchemy. Each case runs in a fresh interpreter, since the locale is the process's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._env import repo_pythonpath
from tests.test_user_envs import TUNED  # a tuned function called twice per key

C_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
UTF8_LOCALE = {"LC_ALL": "C.UTF-8", "PYTHONUTF8": "1", "PYTHONIOENCODING": ""}
NAME = "h\u00f6m\u00e9"  # 'hömé'

STUDY = """
[study]
name = "small"
device = "cpu"
backends = ["triton"]
dtypes = ["float32"]
strategy = "auto"
seed = 0
budget = { trials = 2, seconds = 10 }
finalists = 1

[[tasks]]
kernel = "rmsnorm"
problems = [{ M = 16, N = 128 }]
"""


def _run(
    argv: list[str], cwd: Path, home: Path, locale: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_STORAGE", "LANG", "LC_CTYPE")}
    # bytes throughout: the parent's str of a non-ASCII path is UTF-8, as the child's file system has it
    env_b = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_b.update({k.encode(): v.encode() for k, v in {**locale, "PYTHONPATH": repo_pythonpath()}.items()})
    env_b[b"TUNER_HOME"] = os.fsencode(home)
    return subprocess.run(
        [os.fsencode(sys.executable), *(os.fsencode(a) for a in argv)],
        env=env_b,
        cwd=cwd,
        capture_output=True,
        timeout=300,
    )


def _one_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode("ascii", "backslashreplace")
    assert "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    return line


def _study(tmp_path: Path, folder: str = "studies") -> Path:
    path = tmp_path / folder / "small.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STUDY, encoding="utf-8")
    return path


@pytest.mark.slow
def test_study_in_a_non_ascii_folder_runs_under_the_c_locale(tmp_path: Path) -> None:
    """The study file's path is only opened: it works, and the home (ASCII) holds the outputs."""
    study = _study(tmp_path, NAME)
    proc = _run(["-m", "tuner", "study", "run", str(study), "--quiet"], tmp_path, tmp_path / "home", C_LOCALE)
    assert proc.returncode == 0, proc.stderr.decode("ascii", "backslashreplace")
    assert (tmp_path / "home" / "studies" / "small" / "cache.json").is_file()


@pytest.mark.slow
def test_non_ascii_home_runs_under_a_utf8_locale(tmp_path: Path) -> None:
    study = _study(tmp_path)
    proc = _run(
        ["-m", "tuner", "study", "run", str(study), "--quiet"], tmp_path, tmp_path / NAME, UTF8_LOCALE
    )
    assert proc.returncode == 0, proc.stderr.decode("ascii", "backslashreplace")
    assert (tmp_path / NAME / "studies" / "small" / "cache.json").is_file()


def test_non_ascii_home_under_the_c_locale_fails_with_one_line(tmp_path: Path) -> None:
    """Was `tuner: failed: UnicodeEncodeError: 'utf-8' codec can't encode characters in position 10-11:
    surrogates not allowed`, from SQLAlchemy rendering the store's URL."""
    study = _study(tmp_path)
    proc = _run(["-m", "tuner", "study", "run", str(study), "--quiet"], tmp_path, tmp_path / NAME, C_LOCALE)
    assert proc.returncode == 1
    line = _one_line(proc)
    assert line.startswith("tuner: failed: ") and "TUNER_HOME" in line, line
    assert "h\\xc3\\xb6m\\xc3\\xa9" in line and "file system encoding is ascii" in line, line
    assert "LC_ALL=C.UTF-8" in line and "PYTHONUTF8=1" in line, line


def test_non_ascii_store_path_under_the_c_locale_fails_with_one_line(tmp_path: Path) -> None:
    study = _study(tmp_path)
    url = f"sqlite:///{tmp_path / NAME / 's.db'}"
    argv = ["-m", "tuner", "study", "run", str(study), "--quiet", "--storage", url]
    proc = _run(argv, tmp_path, tmp_path / "home", C_LOCALE)
    assert proc.returncode == 1
    line = _one_line(proc)
    assert "store" in line and "file system encoding is ascii" in line and "PYTHONUTF8=1" in line, line


def test_tuned_calls_with_a_non_ascii_home_under_the_c_locale_say_why_once(tmp_path: Path) -> None:
    """The lookup cache: the tuned function runs without a store, and the one warning says why."""
    proc = _run(["-c", TUNED], tmp_path, tmp_path / NAME, C_LOCALE)
    assert proc.returncode == 0, proc.stderr.decode("ascii", "backslashreplace")
    _, a, a2, b, b2 = proc.stdout.decode().split()
    assert a == a2 and a in ("3", "6") and b == b2 and b in ("4", "8"), proc.stdout
    line = _one_line(proc)
    assert "file system encoding is ascii" in line and "TUNER_HOME" in line, line


def test_non_ascii_output_folder_under_the_c_locale_names_the_remedy(tmp_path: Path) -> None:
    """A study's `output` read from its (UTF-8) file is text the ascii file system encoding cannot write:
    Python itself cannot make that folder. The line said only `'ascii' codec can't encode character`."""
    study = tmp_path / "out.toml"
    study.write_text(
        STUDY.replace('name = "small"', 'name = "small"\noutput = "r\u00e9sultats"'), encoding="utf-8"
    )
    proc = _run(["-m", "tuner", "study", "run", str(study), "--quiet"], tmp_path, tmp_path / "home", C_LOCALE)
    assert proc.returncode == 1
    line = _one_line(proc)
    assert "UnicodeEncodeError" in line and "file system encoding is ascii" in line, line
    assert "LC_ALL=C.UTF-8" in line and "PYTHONUTF8=1" in line, line
