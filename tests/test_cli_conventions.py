"""CLI conventions: `tuner --version`, `python -m tuner`, `-v` before or after the subcommand, a closed pipe
ends quietly (exit 141, nothing on stderr)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tuner.cli import EXIT_BROKEN_PIPE, build_parser, main

REPO = Path(__file__).resolve().parent.parent


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, TUNER_HOME=str(home))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"tuner {tuner.__version__}"


def test_python_dash_m_tuner(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "--version"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"tuner {tuner.__version__}"
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "cache", "nope"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )
    assert r.returncode == 2 and "invalid choice" in r.stderr


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["cache", "show"], 0),
        (["-v", "cache", "show"], 1),
        (["cache", "-v", "show"], 1),
        (["cache", "show", "-v"], 1),
        (["cache", "show", "-vv"], 2),
        (["-vv", "cache", "show", "--json"], 2),
        (["cache", "show", "--verbose", "--json"], 1),
        (["study", "report", "x.toml", "-v"], 1),
    ],
)
def test_verbose_anywhere(argv: list[str], level: int):
    assert build_parser().parse_args(argv).verbose == level


def test_verbose_after_the_subcommand_runs(capsys):
    assert main(["cache", "show", "-v"]) == 0
    assert "no cached entries" in capsys.readouterr().out


@pytest.mark.skipif(os.name != "posix", reason="SIGPIPE and exit 141 are POSIX conventions")
def _into_closed_pipe(argv: list[str], home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m tuner ARGV` in `home` with its stdout a pipe whose reader has gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tuner", *argv],
            cwd=home,
            env=_env(home),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            encoding="utf-8",
        )
    finally:
        os.close(write_end)


def test_closed_pipe_ends_quietly(tmp_path: Path):
    """The reader goes away before tuner writes (as `| head` does on long output): no traceback."""
    r = _into_closed_pipe(["cache", "show"], tmp_path)
    assert r.stderr == "", r.stderr
    assert r.returncode == EXIT_BROKEN_PIPE == 141


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", str(REPO / "tests" / "data" / "convolution_A100_sample.json"), "--budget", "3"],
        ["cache", "show"],
        ["study", "run", str(REPO / "studies" / "quickstart.toml"), "--quiet"],
    ],
    ids=["replay", "cache-show", "study-run"],
)
@pytest.mark.parametrize("url", ["bogus://x", "::not a url"], ids=["unknown-dialect", "unparsable"])
def test_a_storage_url_that_names_no_database_is_bad_usage(tmp_path: Path, argv: list[str], url: str):
    """A --storage URL that SQLAlchemy refuses as written is bad usage: exit 2, one line, nothing made."""
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "tuner", *argv, "--storage", url],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), r.stderr
    assert not any(home.iterdir())


def test_an_unreachable_store_is_a_failure_not_bad_usage(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "cache", "show", "--storage", "postgresql://127.0.0.1:1/test"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode == 1 and r.stderr.startswith("tuner: failed: "), r.stderr


def test_a_closed_pipe_does_not_stop_a_study_run_before_its_files_are_written(tmp_path: Path):
    """`tuner study run S.toml | head -1`: the reader went away after the first line, and the next line
    printed ("report: ...") ended the run with 141 before it wrote the cache file. The files are the
    work; the lines only name them."""
    from tests.test_studies import FAKE, write_study

    study = write_study(tmp_path, n_m=2, budget=3)
    r = _into_closed_pipe(["study", "run", str(study), "--executor", FAKE], tmp_path, timeout=300)
    assert r.returncode == EXIT_BROKEN_PIPE, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "out-s" / "report" / "report.md").is_file()
    assert (tmp_path / "out-s" / "cache.json").is_file()


def _json_error(out: str, err: str, code: int) -> str:
    """The one JSON object a --json command printed for an error it did not handle, checked against the one
    line on stderr: its message."""
    (doc,) = [json.loads(line) for line in out.splitlines()]
    assert doc == {"ok": False, "error": doc["error"]}, doc
    (line,) = err.strip().splitlines()
    assert line == f"tuner: {'error' if code == 2 else 'failed'}: {doc['error']}", (line, doc)
    return doc["error"]


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["study", "run", "{home}/none.toml"], 2, "cannot read"),
        (["study", "run", "{study}", "--workers", "0"], 2, "--workers must be >= 1"),
        (["study", "run", "{quickstart}", "--storage", "bogus://x"], 2, "bogus"),
        (["study", "report", "{home}/none.toml"], 2, "cannot read"),
        (["study", "export", "{home}/none.toml", "--out", "{home}/c.json"], 2, "cannot read"),
        (["cache", "show", "--file", "{home}/none.json"], 2, "cannot read"),
        (
            ["cache", "show", "--storage", "postgresql://127.0.0.1:1/test"],
            1,
            "StoreUnreachable: cannot connect",
        ),
        (["replay", "{home}/none.json"], 2, "none.json"),
        (["kernels", "--device", "nosuch"], 2, "nosuch"),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None,
)
def test_json_commands_print_an_error_object_on_stdout(tmp_path: Path, capsys, argv, code, says):
    """A --json command that failed in a way it did not handle itself printed nothing on stdout (only the
    line on stderr): a script reading the JSON got an empty document. It prints `{"ok": false, "error": ...}`,
    the message of the line on stderr, with the same exit code."""
    from tests.test_studies import write_study

    study = write_study(tmp_path, n_m=1, budget=1)
    quickstart = REPO / "studies" / "quickstart.toml"
    args = [a.format(home=tmp_path, study=study, quickstart=quickstart) for a in argv]
    assert main(args) == code
    plain = capsys.readouterr()
    assert plain.out == ""
    assert main([*args, "--json"]) == code
    got = capsys.readouterr()
    message = _json_error(got.out, got.err, code)
    assert says in message and got.err == plain.err


SAMPLE = REPO / "tests" / "data" / "convolution_A100_sample.json"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["replay", str(SAMPLE), "--budget", "abc"], "argument --budget: invalid int value: 'abc'"),
        (["replay"], "the following arguments are required: file"),
        (["replay", str(SAMPLE), "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["replay", str(SAMPLE), "--higher-is-better", "--lower-is-better"], "not allowed with"),
        (["cache", "prune", "--older-than", "x"], "argument --older-than"),
        (["cache", "export"], "the following arguments are required: --out"),
    ],
    ids=["bad-int", "missing-file", "unknown-option", "exclusive", "bad-float", "missing-out"],
)
def test_argparse_refusals_are_one_line_and_a_json_object_under_json(
    tmp_path, monkeypatch, capsys, argv, says
):
    """A command line that argparse itself refused printed its usage over several lines and, under --json,
    nothing on stdout: the CLI's contract is one line on stderr (exit 2) and, with --json, the error object."""
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    assert main(argv) == 2
    plain = capsys.readouterr()
    (line,) = plain.err.strip().splitlines()
    assert line.startswith("tuner: error: ") and says in line and plain.out == "", plain
    assert main([*argv, "--json"]) == 2
    got = capsys.readouterr()
    assert says in _json_error(got.out, got.err, 2)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["cache", "show", "--no-such-option"], "tuner cache show"),
        (["replay", str(SAMPLE), "--no-such-option"], "tuner replay"),
        (["replay", str(SAMPLE), "--budget", "abc"], "tuner replay"),
    ],
    ids=["nested-unknown", "unknown", "bad-int"],
)
def test_argparse_refusals_point_to_the_subcommands_help(tmp_path, monkeypatch, capsys, argv, prog):
    """docs/api.md: a refused command line's line ends with `(see tuner COMMAND --help)`. An unrecognized
    argument is reported by argparse from the top parser, and said `(see tuner --help)`."""
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"(see {prog} --help)"), line


def test_study_run_json_without_the_kernel_backend_prints_the_refusal(tmp_path: Path):
    """`tuner study run S.toml --json` where torch is not installed: run_study refuses before any trial; stdout
    was empty. It holds the refusal, which names the extra to install."""
    from tests.test_packaging import _tuner_without

    study = tmp_path / "s.toml"
    study.write_text(
        '[study]\nname = "nobackend"\ndevice = "cpu"\nbackends = ["triton"]\ndtypes = ["float32"]\n'
        "budget = { trials = 1 }\nfinalists = 1\n\n"
        '[[tasks]]\nkernel = "softmax"\nproblems = [{ M = 4, N = 16 }]\n',
        encoding="utf-8",
    )
    r = _tuner_without("torch", ["study", "run", str(study), "--json"], tmp_path)
    assert r.returncode == 1, r.stderr
    message = _json_error(r.stdout, r.stderr, 1)
    assert message.startswith("ModuleNotFoundError: No module named 'torch'"), message
    assert "pip install 'tuner[kernels]'" in message


def test_a_tuner_home_that_cannot_be_made_is_named(tmp_path: Path, monkeypatch, capsys):
    """A TUNER_HOME that cannot be made or written (here a file is in the way; a read-only mount
    gives EROFS the same way) used to fail with only the OS error ("File exists: '/x'"), naming a path
    the user never typed on the command line. The line now says it is TUNER_HOME and what to do."""
    case = tmp_path / "case"
    case.mkdir()
    home = case / "home"
    home.write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    monkeypatch.delenv("TUNER_STUDY_STORAGE", raising=False)
    study = case / "s.toml"
    study.write_text(
        "[study]\nname = 's'\ndevice = 'cpu'\nbudget = { trials = 2 }\n"
        "[[tasks]]\nkernel = 'rmsnorm'\nproblems = [{ M = 16, N = 128 }]\n",
        encoding="utf-8",
    )
    shipped = REPO / "docs" / "examples" / "quickstart-report" / "cache.json"
    for argv in (["study", "run", str(study), "--quiet"], ["cache", "import", str(shipped)]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert f"(TUNER_HOME is {home}: set it to a folder this user can write)" in err, err
    assert home.read_text(encoding="utf-8") == "not a folder" and sorted(p.name for p in case.iterdir()) == [
        "home",
        "s.toml",
    ]
