"""Every code block of README.md and docs/**/*.md that claims to run does run.

The convention (CONTRIBUTING readers: see the "Code blocks in the docs" note in README.md):
- A ```python block runs, as a script of its own, unless the line before its fence is
  `<!-- doc-test: skip (why) -->`; the reason is required.
- A ```bash / ```sh / ```shell block runs only when the line before its fence is `<!-- doc-test: run -->`.
- Blocks in any other language (toml, text, none) never run.
Each block runs in a subprocess with a fresh TUNER_HOME and a fresh working folder that holds links to the
repository's top-level folders (so `studies/quickstart.toml` and `docs/examples/...` resolve and nothing is
written into the checkout's root), on the CPU (TRITON_INTERPRET=1, JAX_PLATFORMS=cpu), with `tuner`,
`python` and `python3` on PATH meaning this interpreter. A failure names the file and line of the block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600

PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    action: str  # "run" or "skip"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


class MarkerError(ValueError):
    pass


def _parse_marker(body: str, where: str) -> tuple[str, str]:
    if body == "run":
        return "run", ""
    m = re.fullmatch(r"skip\s*\((?P<reason>.+)\)", body)
    if m and m["reason"].strip():
        return "skip", m["reason"].strip()
    raise MarkerError(f"{where}: bad doc-test marker {body!r}: use 'run' or 'skip (reason)'")


def extract_blocks(text: str, file: str) -> list[Block]:
    """The fenced code blocks of a Markdown text with what the convention says to do with each."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[str, str, int] | None = None  # a marker waiting for its fence
    prev = ""  # the last non-blank line outside blocks
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            if pending is not None:
                raise MarkerError(f"{file}:{pending[2]}: doc-test marker not followed by a code block")
            pending = (*_parse_marker(m["body"], f"{file}:{i + 1}"), i + 1)
            prev = line
            i += 1
            continue
        f = FENCE.match(line)
        if not f:
            if line.strip():
                if pending is not None:
                    raise MarkerError(f"{file}:{pending[2]}: doc-test marker not followed by a code block")
                prev = line
            i += 1
            continue
        fence, indent, lang = f["fence"], f["indent"], f["info"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence[0] * len(fence)) and not lines[i].strip().strip(fence[0])
        ):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        marker = pending if pending is not None and MARKER.match(prev) else None
        pending = None
        prev = ""
        code = textwrap.dedent("\n".join(body)) + "\n"
        if lang in PYTHON:
            action, reason = (marker[0], marker[1]) if marker else ("run", "")
        elif lang in SHELL:
            action, reason = (
                (marker[0], marker[1]) if marker else ("skip", "shell blocks run only when marked")
            )
        else:
            if marker and marker[0] == "run":
                raise MarkerError(f"{file}:{start + 1}: a ```{lang or 'plain'} block cannot run")
            action, reason = "skip", f"```{lang or 'plain'} blocks never run"
        blocks.append(Block(file, start + 1, lang, code, action, reason))
    if pending is not None:
        raise MarkerError(f"{file}:{pending[2]}: doc-test marker not followed by a code block")
    return blocks


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for f in doc_files():
        out += extract_blocks(f.read_text(encoding="utf-8"), f.relative_to(REPO).as_posix())
    return out


def _runnable() -> list[Block]:
    try:
        return [b for b in all_blocks() if b.action == "run"]
    except MarkerError:
        return []  # test_markers_are_well_formed reports it


# ---- the convention itself ---------------------------------------------------------------------------
SAMPLE = """\
# t

```python
print("runs")
```

<!-- doc-test: skip (a fragment) -->
```python
def f(...): ...
```

```bash
rm -rf /
```

<!-- doc-test: run -->
```bash
echo marked
```

- a list item

  ```python
  x = 1
      # kept relative indent
  ```

```toml
a = 1
```
"""


def test_extractor_follows_the_convention():
    got = [(b.line, b.lang, b.action) for b in extract_blocks(SAMPLE, "S.md")]
    assert got == [
        (3, "python", "run"),
        (8, "python", "skip"),
        (12, "bash", "skip"),
        (17, "bash", "run"),
        (23, "python", "run"),
        (28, "toml", "skip"),
    ]
    blocks = extract_blocks(SAMPLE, "S.md")
    assert blocks[1].reason == "a fragment"
    assert blocks[4].code == "x = 1\n    # kept relative indent\n"


@pytest.mark.parametrize(
    "text",
    [
        "<!-- doc-test: skip -->\n```python\nx\n```\n",  # no reason
        "<!-- doc-test: skp (typo) -->\n```python\nx\n```\n",
        "<!-- doc-test: run -->\nsome prose\n```python\nx\n```\n",  # not right before a block
        "<!-- doc-test: run -->\n```toml\na = 1\n```\n",
        "text\n<!-- doc-test: run -->\n",
    ],
)
def test_bad_markers_are_errors_naming_the_line(text: str):
    with pytest.raises(MarkerError, match=r"^X\.md:\d+: "):
        extract_blocks(text, "X.md")


def test_markers_are_well_formed():
    for f in doc_files():
        extract_blocks(f.read_text(encoding="utf-8"), f.relative_to(REPO).as_posix())


# ---- the docs ------------------------------------------------------------------------------------------
def _shims(folder: Path) -> Path:
    """`tuner`, `python` and `python3` meaning this interpreter (a venv's bin may not be on PATH)."""
    folder.mkdir()
    for name, cmd in (("tuner", f'"{sys.executable}" -m tuner'), ("python", f'"{sys.executable}"')):
        for n in (name, "python3") if name == "python" else (name,):
            p = folder / n
            p.write_text(f'#!/bin/sh\nexec {cmd} "$@"\n')
            p.chmod(0o755)
    return folder


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.is_dir():
            (work / entry.name).symlink_to(entry, target_is_directory=True)
    return work


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="the runner uses POSIX shell shims and symlinks")
@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.where)
def test_doc_block_runs(block: Block, tmp_path: Path):
    work = _workdir(tmp_path)
    home = tmp_path / "doc_home"
    home.mkdir()
    env = dict(os.environ)
    env.update(
        TUNER_HOME=str(home),
        TRITON_INTERPRET="1",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        PATH=os.pathsep.join([str(_shims(tmp_path / "bin")), env.get("PATH", "")]),
        MPLBACKEND="Agg",
    )
    for k in ("TUNER_STORAGE", "TUNER_MODE", "TUNER_CACHE_FILE"):
        env.pop(k, None)
    if block.lang in PYTHON:
        script = work / "doc_block.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    try:
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: the ```{block.lang} block ran over {TIMEOUT_S} s", pytrace=False)
    if r.returncode != 0:
        pytest.fail(
            f"{block.where}: the ```{block.lang} block exited {r.returncode}\n"
            f"--- block ---\n{block.code}--- stderr (end) ---\n{r.stderr[-3000:]}\n"
            f"--- stdout (end) ---\n{r.stdout[-1500:]}",
            pytrace=False,
        )
