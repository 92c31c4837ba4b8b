"""Replay of Kernel Tuner cache files, the committed tables and the `tuner replay` CLI (docs/api.md)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._scripts import benchmark_script
from tuner.cli import main
from tuner.replay import ReplayFormatError, load_table

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "convolution_A100_sample.json"
REPO = Path(__file__).resolve().parent.parent
TABLES = REPO / "benchmarks" / "data"  # the committed replay tables (benchmarks/data/README.md)


def test_load_sample() -> None:
    t = load_table(SAMPLE)
    assert len(t.space) == 300
    assert sum(v is None for v in t.values.values()) == 20
    raw = json.loads(SAMPLE.read_text(encoding="utf-8"))["cache"]
    assert t.optimum == min(v["time"] for v in raw.values() if isinstance(v["time"], float))
    assert t.lookup(t.best_config()) == t.optimum


def test_tune_params_string_is_parsed_safely(tmp_path: Path) -> None:
    doc = json.loads(SAMPLE.read_text(encoding="utf-8"))
    doc["tune_params"] = repr(doc["tune_params"])
    doc.pop("tune_params_keys")
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    t = load_table(p)
    assert len(t.space) == 300
    doc["tune_params"] = "__import__('os').system('echo pwned')"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(ReplayFormatError, match="not a dict literal"):
        load_table(p)


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SAMPLE), "--budget", "30", "--strategy", "tpe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"best_config", "best_value", "optimum", "evaluations", "trials"}
    assert out["evaluations"] == 30 == len(out["trials"])
    assert len({json.dumps(c, sort_keys=True) for c in out["trials"]}) == 30
    assert out["best_value"] >= out["optimum"]


def test_cli_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SAMPLE), "--budget", "10", "--strategy", "random"]) == 0
    text = capsys.readouterr().out
    assert "best found" in text and "optimum" in text and "evaluations 10" in text


def _bad_files(tmp: Path) -> dict[str, Path]:
    doc = json.loads(SAMPLE.read_text(encoding="utf-8"))
    files = {}
    files["missing"] = tmp / "nope.json"
    (tmp / "notjson.json").write_text("this is not json {", encoding="utf-8")
    files["not json"] = tmp / "notjson.json"
    (tmp / "empty.json").write_text(json.dumps(dict(doc, cache={})), encoding="utf-8")
    files["no entries"] = tmp / "empty.json"
    (tmp / "nocache.json").write_text(json.dumps({"device_name": "x"}), encoding="utf-8")
    files["no cache"] = tmp / "nocache.json"
    inconsistent = json.loads(json.dumps(doc))
    first = next(iter(inconsistent["cache"]))
    inconsistent["cache"][first].pop("block_size_x")
    (tmp / "inconsistent.json").write_text(json.dumps(inconsistent), encoding="utf-8")
    files["inconsistent keys"] = tmp / "inconsistent.json"
    (tmp / "list.json").write_text("[1, 2, 3]", encoding="utf-8")
    files["top-level list"] = tmp / "list.json"
    (tmp / "bad.json.gz").write_bytes(b"\x1f\x8b\x08garbage")
    files["broken gzip"] = tmp / "bad.json.gz"
    allfail = json.loads(json.dumps(doc))
    for v in allfail["cache"].values():
        v["time"] = "CompilationFailedConfig"
    (tmp / "allfail.json").write_text(json.dumps(allfail), encoding="utf-8")
    files["all failed"] = tmp / "allfail.json"
    (tmp / "deep.json").write_text('{"cache": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    files["nested too deep for the parser"] = tmp / "deep.json"
    return files


def test_cli_bad_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for what, path in _bad_files(tmp_path).items():
        assert main(["replay", str(path)]) == 2, what
        err = capsys.readouterr().err.strip()
        assert err.startswith("tuner: error:") and "\n" not in err, (what, err)


def test_cli_bad_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(SAMPLE), "--strategy", "nope"]) == 2
    assert main(["replay", str(SAMPLE), "--budget", "0"]) == 2
    for seed in ("-1", str(2**32)):  # were exit 1, from optimize's (or numpy's) ValueError
        capsys.readouterr()
        assert main(["replay", str(SAMPLE), "--seed", seed]) == 2, seed
        err = capsys.readouterr().err.strip()
        assert err == f"tuner: error: --seed must be from 0 to 2**32 - 1, got {seed}", err
    assert main(["replay", str(SAMPLE), "--budget", "2", "--seed", str(2**32 - 1)]) == 0


def test_cli_console_script_exit_code(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "replay", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    assert r.returncode == 2 and "no such file" in r.stderr


def test_cli_storage_only_when_asked(tmp_path: Path, _tuner_home: Path) -> None:
    assert main(["replay", str(SAMPLE), "--budget", "5"]) == 0
    assert not (_tuner_home / "tuner.db").exists()
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    assert main(["replay", str(SAMPLE), "--budget", "5", "--storage", url]) == 0
    from tuner.store import ResultStore

    assert ResultStore(url).count() == 5


def test_the_committed_tables_are_all_there_with_their_licence() -> None:
    tables = sorted(f"{p.parent.name}/{p.name}" for p in TABLES.glob("*/*.json.gz"))
    assert len(tables) == 15 and {t.split("/")[0] for t in tables} == {"convolution", "dedispersion", "gemm"}
    assert "MIT License" in (TABLES / "LICENSE").read_text(encoding="utf-8")
    assert "10.5281/zenodo.15364124" in (TABLES / "CITATION.cff").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "path", sorted(TABLES.glob("*/*.json.gz")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_every_committed_table_replays(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(path), "--budget", "20", "--strategy", "random", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["evaluations"] == 20 and out["best_value"] >= out["optimum"]
    table = load_table(path)
    assert table.kernel_name and len(table.space) > 1000  # (two AMD tables have no device_name)


def test_slim_tables_replay_like_the_original(tmp_path: Path) -> None:
    """benchmarks/slim_tables.py (how benchmarks/data was made) keeps every config, value and failure."""
    slim_tables = benchmark_script("slim_tables")
    src = tmp_path / "src" / "convolution"
    src.mkdir(parents=True)
    doc = json.loads(SAMPLE.read_text(encoding="utf-8"))
    first = next(iter(doc["cache"].values()))
    first["times"], first["compile_time"] = [1.0, 2.0], 3.0  # fields the slim copy drops
    (src / "A100.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert slim_tables.main([str(tmp_path / "src"), str(tmp_path / "dst")]) == 0
    out = tmp_path / "dst" / "convolution" / "A100.json.gz"
    slim = json.loads(gzip.decompress(out.read_bytes()))
    assert all(set(e) == set(slim["tune_params_keys"]) | {"time"} for e in slim["cache"].values())
    a, b = load_table(SAMPLE), load_table(out)
    assert list(a.values.items()) == list(b.values.items())
    assert a.space.fingerprint() == b.space.fingerprint() and a.device_name == b.device_name


def test_replay_search_runs_from_a_clone_on_the_committed_tables(tmp_path: Path) -> None:
    """The benchmark needs nothing outside the repository: no --data, no PYTHONPATH, any working folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "replay_search.py"),
            "--files",
            "convolution/A100*",
            "--strategies",
            "random",
            "--seeds",
            "2",
            "--budget",
            "10",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "convolution/A100" in proc.stdout and "2 runs in" in proc.stdout
