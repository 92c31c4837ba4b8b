"""Every code block of README.md and docs/**/*.md that claims to run does run.

The convention (CONTRIBUTING readers: see the "Code blocks in the docs" note in README.md):
- A ```python block runs, as a script of its own, unless the line before its fence is
  `<!-- doc-test: skip (why) -->`; the reason is required.
- A ```bash / ```sh / ```shell block runs only when the line before its fence is `<!-- doc-test: run -->`.
- Blocks in any other language (toml, text, none) never run.
- Output a ```python block shows is checked: a `print(...)` statement followed on its own (last) line by
  the comment `# -> TEXT`, or directly by comment lines `# -> TEXT` (one per printed line), must print
  TEXT (trailing blanks aside); `...` in TEXT stands for any text, as in doctest. A print run several
  times must print that each time; one that never runs fails. Other comments are prose, never compared.
Each block runs in a subprocess with a fresh TUNER_HOME and a fresh working folder that holds links to the
repository's top-level folders (so `studies/quickstart.toml` and `docs/examples/...` resolve and nothing is
written into the checkout's root), on the CPU (TRITON_INTERPRET=1, JAX_PLATFORMS=cpu), with `tuner`,
`python` and `python3` on PATH meaning this interpreter. A failure names the file and line of the block.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import tokenize
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


# ---- shown output ----------------------------------------------------------------------------------------
SHOWN = re.compile(r"^#\s*->\s?(?P<text>.*)$")


@dataclass(frozen=True)
class Shown:
    line: int  # 1-based line of the print statement's start in the block
    col: int  # column of its `print`
    text: str  # what the doc says it prints; "..." stands for any text


def shown_output(code: str, where: str = "<block>") -> list[Shown]:
    """The `# -> TEXT` comments of a block's code, each with the print statement it shows the output of.
    A `# -> ` comment that follows no print statement is an error naming its line."""
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            m = SHOWN.match(tok.string)
            if m:
                alone = not tok.line[: tok.start[1]].strip()
                comments[tok.start[0]] = (m["text"].rstrip(), alone)
    prints: dict[int, tuple[int, int]] = {}  # last line of a print statement -> (first line, column)
    for node in ast.walk(ast.parse(code)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "print"
            and node.end_lineno is not None
        ):
            prints[node.end_lineno] = (node.lineno, node.value.func.col_offset)
    out: list[Shown] = []
    taken: set[int] = set()
    for end, (first, col) in sorted(prints.items()):
        lines = []
        if end in comments and not comments[end][1]:
            lines.append(comments[end][0])
            taken.add(end)
        nxt = end + 1
        while nxt in comments and comments[nxt][1]:
            lines.append(comments[nxt][0])
            taken.add(nxt)
            nxt += 1
        if lines:
            out.append(Shown(first, col, "\n".join(lines)))
    stray = sorted(set(comments) - taken)
    if stray:
        raise MarkerError(
            f"{where}: block line {stray[0]}: a `# -> ` comment follows no print(...) statement"
        )
    return out


def shows(expected: str, printed: str) -> bool:
    """Whether `printed` (one print's text, its final newline removed) is what the doc shows."""
    norm = "\n".join(line.rstrip() for line in printed.split("\n"))
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, norm, re.DOTALL) is not None


# Written next to a block that shows output; the block's prints with `# -> ` comments call `at(line)`,
# which prints as print does and appends what it printed to $DOC_PRINT_LOG (worker processes too).
DOCPRINT = """\
import io, json, os


def at(line):
    def show(*args, sep=" ", end="\\n", file=None, flush=False):
        buf = io.StringIO()
        print(*args, sep=sep, end=end, file=buf)
        print(*args, sep=sep, end=end, file=file, flush=flush)
        log = os.environ.get("DOC_PRINT_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"line": line, "text": buf.getvalue()}) + "\\n")

    return show
"""


def instrument(code: str, shown: list[Shown]) -> str:
    """The block with each showing print's `print` replaced by a recording one (same line numbers)."""
    lines = code.split("\n")
    for s in shown:
        line = lines[s.line - 1]
        assert line[s.col : s.col + 5] == "print", (s, line)
        lines[s.line - 1] = line[: s.col] + f'__import__("_docprint").at({s.line})' + line[s.col + 5 :]
    return "\n".join(lines)


def output_mismatches(block: Block, shown: list[Shown], records: list[dict[str, object]]) -> list[str]:
    """What the block printed against what its `# -> ` comments show, one line per difference."""
    by_line: dict[int, list[str]] = {}
    for r in records:
        by_line.setdefault(int(str(r["line"])), []).append(str(r["text"]))
    out = []
    for s in shown:
        where = f"{block.file}:{block.line + s.line}"
        got = by_line.get(s.line)
        if not got:
            out.append(f"{where}: the print never ran; the doc shows {s.text!r}")
            continue
        for text in got:
            printed = text[:-1] if text.endswith("\n") else text
            if not shows(s.text, printed):
                out.append(f"{where}: printed {printed!r}; the doc shows {s.text!r}")
    return out


SHOWN_SAMPLE = """\
x = 2
print(x + 1)  # -> 3
print("a", "b")
# -> a b
print("# -> not a comment")
if x:
    print(
        {"k": x},
    )  # -> {'k': ...}
print("two\\nlines")
# -> two
# -> lines
print(x)  # a remark, not output
"""


def test_shown_output_is_found_and_compared():
    shown = shown_output(SHOWN_SAMPLE)
    assert [(s.line, s.col, s.text) for s in shown] == [
        (2, 0, "3"),
        (3, 0, "a b"),
        (7, 4, "{'k': ...}"),
        (10, 0, "two\nlines"),
    ]
    assert shows("{'k': ...}", "{'k': 2}") and not shows("{'k': ...}", "{'j': 2}")
    assert shows("a b", "a b  ") and not shows("a b", "a b c")
    code = instrument(SHOWN_SAMPLE, shown)
    assert code.count('__import__("_docprint").at(') == 4 and len(code.split("\n")) == len(
        SHOWN_SAMPLE.split("\n")
    )
    block = Block("S.md", 10, "python", SHOWN_SAMPLE, "run")
    records: list[dict[str, object]] = [
        {"line": 2, "text": "3\n"},
        {"line": 3, "text": "a c\n"},
        {"line": 7, "text": "{'k': 2}\n"},
    ]
    assert output_mismatches(block, shown, records) == [
        "S.md:13: printed 'a c'; the doc shows 'a b'",
        "S.md:20: the print never ran; the doc shows 'two\\nlines'",
    ]


def test_a_shown_output_comment_must_follow_a_print():
    with pytest.raises(MarkerError, match=r"^S\.md:3: block line 2: "):
        shown_output("x = 1\n# -> 1\n", "S.md:3")


def test_shown_output_runs_and_is_compared(tmp_path: Path):
    code = 'import sys\nprint(sys.argv[0] and "ok")  # -> ok\nfor i in range(2):\n    print(i)  # -> 0\n'
    shown = shown_output(code)
    (tmp_path / "_docprint.py").write_text(DOCPRINT, encoding="utf-8")
    (tmp_path / "b.py").write_text(instrument(code, shown), encoding="utf-8")
    log = tmp_path / "log.jsonl"
    r = subprocess.run(
        [sys.executable, str(tmp_path / "b.py")],
        env={**os.environ, "DOC_PRINT_LOG": str(log)},
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert r.returncode == 0 and r.stdout == "ok\n0\n1\n"
    records = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()]
    block = Block("S.md", 1, "python", code, "run")
    assert output_mismatches(block, shown, records) == ["S.md:5: printed '1'; the doc shows '0'"]


def _shown_blocks() -> list[Block]:
    try:
        return [b for b in _runnable() if b.lang in PYTHON]
    except MarkerError:
        return []


def test_shown_output_comments_are_well_formed():
    for b in _shown_blocks():
        shown_output(b.code, b.where)


# ---- the docs ------------------------------------------------------------------------------------------
def _shims(folder: Path) -> Path:
    """`tuner`, `python` and `python3` meaning this interpreter (a venv's bin may not be on PATH)."""
    folder.mkdir()
    for name, cmd in (("tuner", f'"{sys.executable}" -m tuner'), ("python", f'"{sys.executable}"')):
        for n in (name, "python3") if name == "python" else (name,):
            p = folder / n
            p.write_text(f'#!/bin/sh\nexec {cmd} "$@"\n', encoding="utf-8")
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
    shown: list[Shown] = []
    if block.lang in PYTHON:
        shown = shown_output(block.code, block.where)
        script = work / "doc_block.py"
        script.write_text(instrument(block.code, shown), encoding="utf-8")
        if shown:
            (work / "_docprint.py").write_text(DOCPRINT, encoding="utf-8")
            env["DOC_PRINT_LOG"] = str(tmp_path / "printed.jsonl")
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    try:
        r = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, encoding="utf-8"
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: the ```{block.lang} block ran over {TIMEOUT_S} s", pytrace=False)
    if r.returncode != 0:
        pytest.fail(
            f"{block.where}: the ```{block.lang} block exited {r.returncode}\n"
            f"--- block ---\n{block.code}--- stderr (end) ---\n{r.stderr[-3000:]}\n"
            f"--- stdout (end) ---\n{r.stdout[-1500:]}",
            pytrace=False,
        )
    if shown:
        log = tmp_path / "printed.jsonl"
        records = (
            [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
        )
        wrong = output_mismatches(block, shown, records)
        if wrong:
            pytest.fail(
                f"{block.where}: the ```python block printed other than the doc shows:\n" + "\n".join(wrong),
                pytrace=False,
            )


# ---- the shipped example cache --------------------------------------------------------------------------
EXAMPLE_CACHE = REPO / "docs" / "examples" / "quickstart-report" / "cache.json"


def test_the_example_cache_is_of_the_shipped_kernels():
    """README.md's `tuner.kernel` example reads docs/examples/quickstart-report/cache.json and shows an
    exact hit: an entry whose kernel source hash is not the shipped kernel's is a miss there (on any device
    and versions, so this holds where that example's hit cannot be checked). After a change to a kernel's
    source, regenerate the example as docs/examples/quickstart-report/README.md says."""
    from tuner.runtime import kernel_source_hash

    entries = json.loads(EXAMPLE_CACHE.read_text(encoding="utf-8"))["entries"]
    assert entries
    stale = sorted(
        {
            f"{e['kernel']} (stored {e['source_hash'][:12]}, now {kernel_source_hash(e['kernel'])[:12]})"
            for e in entries
            if e["source_hash"] != kernel_source_hash(e["kernel"])
        }
    )
    assert not stale, (
        f"{EXAMPLE_CACHE.relative_to(REPO)} is stale, its kernels' source changed since: {', '.join(stale)}; "
        "regenerate the example (docs/examples/quickstart-report/README.md says how)"
    )
