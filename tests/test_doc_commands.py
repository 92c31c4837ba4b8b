"""The `tuner ...` commands that README.md and docs/ show, in prose or in code blocks that do not run, are
commands the CLI takes: each names an existing subcommand, passes only options that subcommand has, and
no more positional arguments than it takes (`tuner regress BASELINE` is not `tuner regress --baseline
FILE`). Usage syntax is understood: `[...]` optional parts, `a|b` alternatives, `...` repetition and
placeholders in capitals. What the blocks that do run do is tests/test_doc_snippets.py's job.

The scripts of benchmarks/ that the docs tell users to run answer `--help` with their usage (without running
anything) and refuse an option they do not have, or an argument they cannot use, with exit 2 and one line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._env import repo_pythonpath
from tests.test_doc_snippets import doc_files
from tuner.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
# An inline span, or a line of a code block, that starts a tuner command (after VAR=value assignments).
_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/)?tuner(?:\s|$)")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Command:
    where: str
    text: str


def doc_commands() -> list[Command]:
    out: list[Command] = []
    for f in doc_files():
        rel = f.relative_to(REPO).as_posix()
        in_block = False
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if _FENCE.match(line):
                in_block = not in_block
                continue
            if in_block:
                cmd = line.split(" #", 1)[0].strip()  # a shell comment after the command
                if _START.match(cmd):
                    out.append(Command(f"{rel}:{n}", cmd))
                continue
            for span in re.findall(r"`([^`]+)`", line):
                if _START.match(span.strip()):
                    out.append(Command(f"{rel}:{n}", span.strip()))
    return out


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _takes(a: argparse.Action) -> int | str:
    """How many values an option takes: a number, or '+' / '*' for a list."""
    if a.nargs in ("+", "*"):
        return str(a.nargs)
    if a.nargs in (None, "?"):
        return 1
    return int(a.nargs)  # 0 for flags (store_true, count)


def _placeholder(word: str) -> bool:
    return word in ("...", "…") or (word.replace("_", "").replace("-", "").isupper() and word.isascii())


def problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in one documented command the CLI would refuse (empty: nothing)."""
    words = re.sub(r"[\[\]()]", " ", text).split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    words = words[1:]  # `tuner`
    found: list[str] = []
    p = parser
    path = ["tuner"]
    i = 0
    # the subcommand path (global options such as -v may come first)
    while i < len(words):
        w = words[i]
        subs = _subcommands(p)
        if not subs:
            break  # the leaf: its options and arguments are checked below
        if w.startswith("-"):  # a global option (`tuner -v cache show`)
            if not any(w.split("=")[0] in a.option_strings for a in p._actions):
                found.append(f"{' '.join(path)} has no option {w}")
            i += 1
            continue
        if _placeholder(w):
            return found  # `tuner COMMAND --help`, `tuner ...`
        names = w.split("|")  # `cache export|import|show`
        missing = [n for n in names if n not in subs]
        if missing:
            found.append(f"{' '.join(path)} has no subcommand {', '.join(missing)} (has {', '.join(subs)})")
            return found
        if len(names) > 1:  # alternatives: each must exist; the rest of the line is not checked
            return found
        path.append(w)
        p = subs[w]
        i += 1
    options = {s: a for a in p._actions for s in a.option_strings}
    positionals = [
        a for a in p._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    most: float = sum(
        float("inf")
        if a.nargs in ("+", "*", argparse.REMAINDER)
        else (1 if a.nargs in (None, "?") else int(a.nargs))
        for a in positionals
    )
    given = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w == "|":
            if i < len(words) and not words[i].startswith("-"):
                break  # a shell pipe: `tuner cache show | head -1`
            continue  # `--higher-is-better | --lower-is-better`
        if w.startswith("-") and w != "-":
            name = w.split("=")[0]
            if name not in options:
                found.append(f"{' '.join(path)} has no option {name}")
                continue
            n = _takes(options[name])
            if "=" in w:
                continue
            if n in ("+", "*"):
                while i < len(words) and not words[i].startswith("-") and words[i] != "|":
                    i += 1
            else:
                i += int(n)
            continue
        if w in ("...", "…"):
            continue
        given += 1
    if given > most:
        found.append(
            f"{' '.join(path)} takes {int(most)} positional argument(s), the doc gives {given}"
            + (
                f" (its options: {', '.join(sorted(o for o in options if o.startswith('--')))})"
                if not most
                else ""
            )
        )
    return found


def test_the_checker_catches_what_the_cli_refuses() -> None:
    parser = build_parser()
    good = [
        "tuner replay FILE [--strategy NAME] [--budget N] [--higher-is-better | --lower-is-better] [--json]",
        "tuner cache export|import|show",
        "tuner -v cache show",
        "tuner cache show | head -1",
        "tuner check KERNEL [--shape K=V ...] [--configs N | --all]",
        "TUNER_MODE=record tuner misses --json --min-calls 100",
        "tuner COMMAND --help",
        "tuner regress --baseline FILE [--factory MODULE:FUNCTION]",
    ]
    for cmd in good:
        assert problems(cmd, parser) == [], cmd
    assert problems("tuner regress BASELINE", parser)  # regress takes --baseline, no positional
    assert problems("tuner study rerun x.toml", parser)
    assert problems("tuner cache export|import|list", parser)
    assert problems("tuner replay FILE --retries 3", parser)
    assert problems("tuner study run a.toml b.toml", parser)


def test_the_docs_show_commands() -> None:
    assert len(doc_commands()) > 50  # the extraction still finds them


@pytest.mark.parametrize("cmd", doc_commands(), ids=lambda c: c.where)
def test_documented_command_is_one_the_cli_takes(cmd: Command) -> None:
    assert problems(cmd.text, build_parser()) == [], f"{cmd.where}: `{cmd.text}`"


SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("[!_]*.py"))


def _script(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(), TUNER_HOME=str(cwd / "home"))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_answers_help_and_refuses_an_unknown_option(name: str, tmp_path: Path) -> None:
    script = str(REPO / "benchmarks" / name)  # run from another folder, as a clone's user may
    r = _script([script, "--help"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage:"), (r.stdout + r.stderr)[-800:]
    r = _script([script, "--no-such-option"], tmp_path)
    last = r.stderr.strip().splitlines()[-1:] or [""]
    # `unrecognized arguments: --no-such-option`, or first `required: table` where a positional is missing
    assert r.returncode == 2 and f"{name}: error: " in last[0], (r.stdout + r.stderr)[-800:]
    assert r.stdout == "" and "Traceback" not in r.stderr


def test_cache_hit_overhead_refuses_a_before_that_is_not_a_checkout(tmp_path: Path) -> None:
    """It measured the interpreter's installed tuner as "before" instead, and printed a comparison."""
    r = _script(
        [str(REPO / "benchmarks" / "cache_hit_overhead.py"), "--before", str(tmp_path / "nowhere")], tmp_path
    )
    assert r.returncode == 2 and "not a checkout of tuner" in r.stderr.strip().splitlines()[-1], r.stderr[
        -800:
    ]
    assert r.stdout == ""


SAMPLE = REPO / "tests" / "data" / "convolution_A100_sample.json"
# Arguments each script cannot use: refused before any work, not a traceback, a run that fails at its end
# (a ZeroDivisionError in the report, a file where the output folder goes) or a run that reports nothing.
BAD_ARGS = [
    ("trace_search.py", ["convolution/NOPE"]),
    ("trace_search.py", [str(SAMPLE), "--seeds", "3-1"]),
    ("trace_search.py", [str(SAMPLE), "--region", "nosuch=1"]),
    ("trace_search.py", [str(SAMPLE), "--strategy", "random"]),
    ("trace_search.py", [str(SAMPLE), "--budget", "0"]),
    ("cross_kernel_screen.py", ["--data", "{missing}"]),
    ("cross_kernel_screen.py", ["--k", "x"]),
    ("explicit_configs_topk.py", ["--k", "x"]),
    ("explicit_configs_topk.py", ["--only", "nomatch"]),
    ("explicit_configs_topk.py", ["--k", "50", "--n", "30"]),
    ("cost_model_report.py", ["--data", "{missing}"]),
    ("cost_model_report.py", ["--max-rows", "0"]),
    ("miss_scaling.py", ["--strategies", "nosuch"]),
    ("miss_scaling.py", ["--sizes", "x"]),
    ("record_overhead.py", ["--calls", "0"]),
    ("measure_overhead.py", ["--candidates", "0"]),
    ("precompile.py", ["--configs", "0"]),
    ("gpu_validate.py", ["--allow-cpu", "--out", "{file}"]),
    ("gpu_validate.py", ["--allow-cpu", "--max-minutes", "0"]),
    ("sub_tables.py", ["{file}"]),
    ("startup.py", ["--repeats", "0"]),
    ("startup.py", ["--old", "{missing}"]),
    ("startup.py", ["--old", "{empty}"]),
    ("startup.py", ["--study", "{missing}"]),
]


@pytest.mark.parametrize(("name", "args"), BAD_ARGS, ids=[f"{n}:{' '.join(a)[-30:]}" for n, a in BAD_ARGS])
def test_benchmark_script_refuses_an_argument_it_cannot_use(
    name: str, args: list[str], tmp_path: Path
) -> None:
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    (tmp_path / "a_folder").mkdir()
    args = [
        a.format(missing=tmp_path / "missing", file=tmp_path / "a_file", empty=tmp_path / "a_folder")
        for a in args
    ]
    before = sorted(tmp_path.iterdir())
    r = _script([str(REPO / "benchmarks" / name), *args], tmp_path)
    errors = [line for line in r.stderr.splitlines() if line.startswith(f"{name}: error: ")]
    assert r.returncode == 2 and len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), (
        r.stdout + r.stderr
    )[-800:]
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert sorted(tmp_path.iterdir()) == before  # nothing written: no report, no TUNER_HOME
