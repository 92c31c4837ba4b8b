"""benchmarks/sub_tables.py: small sub-spaces cut out of a replay table keep its measurements."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests._scripts import benchmark_script
from tuner.replay import load_table

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"


st = benchmark_script("sub_tables")


def _run(out: Path, *extra: str) -> int:
    return st.main(
        [str(out), "--data", str(SAMPLE.parent), "--files", SAMPLE.name, "--min", "20", "--max", "80", *extra]
    )


def test_sub_tables_are_narrowed_copies_of_the_source(tmp_path: Path) -> None:
    assert _run(tmp_path / "a", "--per-table", "3") == 0
    files = sorted((tmp_path / "a" / "data").glob("*.json.gz"))
    assert len(files) == 3
    source = json.loads(SAMPLE.read_text(encoding="utf-8"))
    for f in files:
        doc = json.loads(gzip.decompress(f.read_bytes()))
        fixed = doc["sub_table"]["fixed"]
        assert fixed and doc["sub_table"]["source"] == f"data/{SAMPLE.name}"
        assert 20 <= len(doc["cache"]) <= 80
        for key, entry in doc["cache"].items():
            assert entry == source["cache"][key]  # the measurement itself, unchanged
            assert all(entry[k] == v for k, v in fixed.items())
        for k, values in doc["tune_params"].items():
            assert values == ([fixed[k]] if k in fixed else source["tune_params"][k])
        # every config of the source that matches the fixed values is in the sub-table
        matching = [k for k, e in source["cache"].items() if all(e[p] == v for p, v in fixed.items())]
        assert sorted(matching) == sorted(doc["cache"])
        table = load_table(f)  # replays like any table
        assert len(table.values) == len(doc["cache"])


def test_same_seed_same_tables_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path / "a") == 0 and _run(tmp_path / "b") == 0
    for f in sorted((tmp_path / "a" / "data").glob("*.json.gz")):
        assert gzip.decompress(f.read_bytes()) == gzip.decompress(
            (tmp_path / "b" / "data" / f.name).read_bytes()
        )
    assert "configs" in capsys.readouterr().out
    assert _run(tmp_path / "c", "--seed", "7") == 0
    assert st.main([str(tmp_path / "d"), "--data", str(SAMPLE.parent), "--files", "nothing*"]) == 2
    assert st.main([str(tmp_path / "d"), "--min", "10", "--max", "5"]) == 2
    # a range no draw can meet writes nothing and says so
    assert _run(tmp_path / "e", "--min", "5000", "--max", "6000") == 1
    assert "no sub-table of 5000-6000 configs" in capsys.readouterr().out
