"""tuner run in the environments users and their test suites run it in: every warning about a text file or
pipe opened without an encoding made an error (`PYTHONWARNDEFAULTENCODING=1`, `-W error::EncodingWarning`,
passed on to child processes through `PYTHONWARNINGS`). Each runs in a fresh interpreter, since the flags
are the process's."""

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


def _without_encoding(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Text I/O that ruff's PLW1514 (pyproject.toml) does not see: a subprocess's text pipes, os.fdopen,
    and read_text/write_text on a path ruff cannot tell is one (`Path(tmp) / "k.ptx"`)."""
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
        if (
            (name in SUBPROCESS_CALLS and text_pipes)
            or (name == "fdopen" and text_fd and len(args) < 4)
            or (name == "read_text" and not args)
            or (name == "write_text" and len(args) < 2)
        ):
            yield node.lineno, name


def test_shipped_code_names_the_encoding_of_pipes_and_files() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {name}(...) without encoding="
        for top in ("tuner", "kernels", "search_spaces", "cost_models", "benchmarks")
        for path in sorted((REPO / top).rglob("*.py"))
        for line, name in _without_encoding(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "\n".join(found)
