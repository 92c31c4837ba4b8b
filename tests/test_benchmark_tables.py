"""benchmarks/_tables.py: every benchmark script replays the hub's tables, not the files beside them (a
GPU's `_T4` copy of a cache file, Kernel Tuner's `-results` and `-metadata` files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests._scripts import benchmark_script

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"
SCRIPTS = ["replay_search", "basins", "surrogate_screen", "cross_kernel_screen", "cost_model_report"]


def _hub_like(tmp_path: Path) -> Path:
    """A folder laid out as the hub's: two tables of one kernel and the files that are not tables."""
    k = tmp_path / "data" / "convolution"
    k.mkdir(parents=True)
    for name in ("A100.json", "A4000.json", "A100_T4.json", "A100-results.json", "A100-metadata.json"):
        shutil.copy(SAMPLE, k / name)
    return tmp_path / "data"


def test_table_files_skips_what_is_not_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = benchmark_script("_tables")
    data = _hub_like(tmp_path)
    files = tables.table_files(data, ["*/*.json*"], script="x")
    assert [Path(f).name for f in files] == ["A100.json", "A4000.json"]
    assert "x: skipped 3 files" in capsys.readouterr().err
    assert tables.table_files(data, ["*/A100*.json"]) == [str(data / "convolution" / "A100.json")]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("basins", ["--starts", "2"]),
        ("replay_search", ["--strategies", "random", "--seeds", "1", "--budget", "5"]),
    ],
)
def test_scripts_replay_only_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, args: list[str]
) -> None:
    data = _hub_like(tmp_path)
    assert benchmark_script(name).main(["--data", str(data), *args]) in (0, None)
    out, err = capsys.readouterr()
    assert f"{name}: skipped 3 files" in err
    assert "convolution/A100 " in out and "convolution/A4000 " in out
    assert "_T4" not in out and "-results" not in out and "-metadata" not in out


@pytest.mark.parametrize("name", SCRIPTS + ["explicit_configs_topk", "slim_tables", "sub_tables"])
def test_no_script_globs_tables_of_its_own(name: str) -> None:
    """Each script that lists tables under a folder does it through `table_files` (a glob of its own
    would replay a T4 copy as a table of its own, and leak it into a leave-one-out prior)."""
    src = (Path(__file__).parent.parent / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
    assert "table_files(" in src
    assert "glob.glob(" not in src and '.glob("*/*.json' not in src
