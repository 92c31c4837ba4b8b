"""benchmarks/basins.py: local minima and basins of a table under one-parameter moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._scripts import benchmark_script

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"

bs = benchmark_script("basins")


def _table(tmp_path: Path, times: dict[tuple[int, int], float]) -> object:
    """A 3x3 Kernel Tuner cache file with these times (x, y) -> ms."""
    from tuner.replay import load_table

    cache = {f"{x},{y}": {"x": x, "y": y, "time": t} for (x, y), t in times.items()}
    doc = {
        "device_name": "test",
        "kernel_name": "k",
        "problem_size": [1],
        "tune_params_keys": ["x", "y"],
        "tune_params": {"x": [1, 2, 3], "y": [1, 2, 3]},
        "objective": "time",
        "cache": cache,
    }
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return load_table(p)


def test_two_basins_are_counted_and_the_climb_is_measured(tmp_path: Path) -> None:
    # optimum at (1, 1); a second local minimum at (3, 3): its row and column neighbours are slower
    times = {(x, y): 10.0 for x in (1, 2, 3) for y in (1, 2, 3)}
    times.update({(1, 1): 1.0, (3, 3): 2.0, (1, 2): 5.0, (2, 1): 5.0, (3, 1): 12.0, (1, 3): 12.0})
    r = bs.landscape(_table(tmp_path, times), starts=50)
    assert r["configs"] == 9 and r["minima"] == 2 and r["good_minima"] == 1
    _, nbrs = bs.neighbourhoods(_table(tmp_path, times))
    assert sorted(len(nb) for nb in nbrs) == [4] * 9  # 2 other values of each of 2 parameters
    assert 0 < r["good_share"] < 1
    assert r["moves"] >= 0 and r["descent_evals"] >= 1


def test_sample_table_has_a_good_basin() -> None:
    from tuner.replay import load_table

    r = bs.landscape(load_table(SAMPLE), starts=20)
    assert r["good_minima"] >= 1 and 0 < r["good_share"] <= 1
    assert r["minima"] >= r["good_minima"]


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bs.main(["--starts", "0"])
    with pytest.raises(SystemExit):
        bs.main(["--files", "nothing/*"])
