"""tuner run in the environments users and their test suites run it in: every warning about a text file or
pipe opened without an encoding made an error (`PYTHONWARNDEFAULTENCODING=1`, `-W error::EncodingWarning`,
passed on to child processes through `PYTHONWARNINGS`); a user with no home folder (HOME unset, no entry in
the password database: a container run as an arbitrary uid). Each runs in a fresh interpreter, since the
flags and the user are the process's."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._env import repo_pythonpath

REPO = Path(__file__).resolve().parent.parent
STRICT_ENCODING = {"PYTHONWARNDEFAULTENCODING": "1", "PYTHONWARNINGS": "error::EncodingWarning"}


def _run(args: list[str], tmp_path: Path, env: dict[str, str], *, flags: tuple[str, ...] = ()) -> str:
    full = {**os.environ, "PYTHONPATH": repo_pythonpath(), "TUNER_HOME": str(tmp_path / "home"), **env}
    proc = subprocess.run(
        [sys.executable, *flags, *args],
        env=full,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_compile_only_check_with_encoding_warnings_as_errors(tmp_path: Path) -> None:
    """The compile processes opened their reply pipe (and read a dead one's stderr, and ptxas's output)
    without an encoding, and Triton's cache writes its files without one: every config was reported
    crashed."""
    pytest.importorskip("triton")
    cache = tmp_path / "triton-cache"  # a cold cache: the compiler really runs in the compile process
    env = {**STRICT_ENCODING, "TRITON_CACHE_DIR": str(cache), "TRITON_INTERPRET": "0"}
    argv = ["-m", "tuner", "check", "rmsnorm", "--backend", "triton", "--compile-only", "--device", "sm80"]
    # twice: the second finds the binaries in Triton's cache and runs ptxas itself for the registers
    for _ in range(2):
        out = _run(
            [*argv, "--configs", "2", "--jobs", "1"], tmp_path, env, flags=("-W", "error::EncodingWarning")
        )
        assert "2/2 configs compiled" in out, out


SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}
# modules whose open() is not a path's: os.open takes flags; these are binary unless their mode says "t"
OPEN_MODULES = {
    "os",
    "io",
    "gzip",
    "bz2",
    "lzma",
    "tarfile",
    "zipfile",
    "codecs",
    "webbrowser",
    "shelve",
    "dbm",
}


def _is_module(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in OPEN_MODULES


def _without_encoding(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Text I/O that ruff's PLW1514 (pyproject.toml) does not see: a subprocess's text pipes, os.fdopen,
    and read_text/write_text/open on a path ruff cannot tell is one (`Path(tmp) / "k.ptx"`, a pytest
    `tmp_path`)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if "encoding" in kw or None in kw:  # named, or maybe in **kwargs
            continue
        name, args = node.func.attr, node.args
        text_pipes = any(
            isinstance(kw.get(k), ast.Constant) and kw[k].value is True
            for k in ("text", "universal_newlines")
        )
        mode = args[1] if len(args) > 1 else kw.get("mode")
        text_fd = not (isinstance(mode, ast.Constant) and "b" in str(mode.value))
        # path.open(mode="r", buffering, encoding): a method of something that is not a module (os.open
        # takes flags, tarfile.open and gzip.open are binary unless told "t"; builtin open is ruff's)
        receiver = node.func.value
        path_mode = args[0] if args else kw.get("mode")
        text_path = not (isinstance(path_mode, ast.Constant) and "b" in str(path_mode.value))
        if (
            (name in SUBPROCESS_CALLS and text_pipes)
            or (name == "fdopen" and text_fd and len(args) < 4)
            or (name == "open" and not _is_module(receiver) and text_path and len(args) < 3)
            or (name == "read_text" and not args)
            or (name == "write_text" and len(args) < 2)
        ):
            yield node.lineno, name


# Every folder with Python in it: the shipped code, and the tests, benchmarks and scripts a user runs, which
# read and write tuner's UTF-8 files too (a locale that is not UTF-8, LANG=C without UTF-8 mode or Windows'
# cp1252, read them wrongly)
PYTHON_FOLDERS = (
    "tuner",
    "kernels",
    "search_spaces",
    "cost_models",
    "benchmarks",
    "tests",
    "studies",
    "docs",
    ".ci",
)


def test_code_names_the_encoding_of_pipes_and_files() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {name}(...) without encoding="
        for top in PYTHON_FOLDERS
        for path in sorted((REPO / top).rglob("*.py"))
        for line, name in _without_encoding(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "\n".join(found)


# The user has no home folder: HOME unset and no password-database entry for the uid (what a container run
# as an arbitrary uid has). pwd is patched before tuner is imported, so Path.home() fails as it does there.
NO_PASSWD = """
import os, pwd, sys
def _no_entry(uid):
    raise KeyError(f"getpwuid(): uid not found: {uid}")
pwd.getpwuid = _no_entry
os.environ.pop("HOME", None)
"""

TUNED = """
import tuner
space = tuner.SearchSpace.from_configs([{"b": b} for b in (1, 2)])

@tuner.autotune(space, key=["n"], budget=2)
def f(n, *, b):
    return n * b

print("results", f(3), f(3), f(4), f(4))
"""


def _no_home_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TUNER_HOME", "TUNER_STORAGE")}
    return {**env, "PYTHONPATH": repo_pythonpath()}


def _python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**_no_home_env(tmp_path), **extra},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )


def test_no_home_runs_tuned_calls_without_a_store_and_says_so_once(tmp_path: Path) -> None:
    """Path.home()'s RuntimeError ("Could not determine home directory.") went up through the first
    tuned call."""
    proc = _python(NO_PASSWD + TUNED, tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, a, a2, b, b2 = proc.stdout.split()  # each key tuned once (either config may win), then kept
    assert a == a2 and a in ("3", "6") and b == b2 and b in ("4", "8"), proc.stdout
    assert proc.stderr.count("TUNER_HOME") == 1, proc.stderr  # one warning for every call and key
    assert "password database" in proc.stderr and "running without a store" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_no_home_in_record_mode_says_where_the_misses_went(tmp_path: Path) -> None:
    """The flush of the miss log at exit raised from atexit, where the log's folder could not be named."""
    proc = _python(NO_PASSWD + TUNED, tmp_path, TUNER_MODE="record")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "were not written to the miss log" in proc.stderr and "set TUNER_HOME" in proc.stderr


@pytest.mark.parametrize("argv", [["cache", "show"], ["misses"]])
def test_no_home_commands_fail_with_a_line_naming_tuner_home(tmp_path: Path, argv: list[str]) -> None:
    code = NO_PASSWD + f"from tuner.cli import main\nsys.exit(main({argv!r}))\n"
    proc = _python(code, tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tuner: failed: ") and "set TUNER_HOME to a folder this user can write" in line
