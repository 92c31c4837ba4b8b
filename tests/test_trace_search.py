"""benchmarks/trace_search.py and `ModelStrategy.sources`: which component proposed each config."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from tuner.search_spaces import Param, SearchSpace

import tuner
from tests._scripts import benchmark_script
from tuner.strategies import ModelStrategy, ModelStrategyConfig

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"
COMPONENTS = {"space_filling", "portfolio", "anchor", "partition", "random", "model", "local", "explore"}


ts = benchmark_script("trace_search")  # it imports replay_search from beside itself


def test_every_proposal_names_its_component() -> None:
    space = SearchSpace(
        [Param("x", list(range(12))), Param("y", list(range(6))), Param("s", [False, True])], name="toy"
    )
    strat = ModelStrategy(space, seed=1, config=ModelStrategyConfig(n_init=5))
    res = tuner.optimize(
        space,
        lambda c: 1.0 + abs(c["x"] - 7) + abs(c["y"] - 2) + 3 * c["s"],
        budget=30,
        seed=1,
        strategy=strat,
    )
    assert len(strat.sources) == res.evaluations == 30
    assert strat.sources[:5] == ["space_filling"] * 5
    assert set(strat.sources) <= COMPONENTS
    assert set(strat.sources[5:]) - {"random"}, "after the space-filling draws the components take over"
    assert strat.last_source == strat.sources[-1]


def test_trace_matches_the_replay_and_prints_the_incumbent_path(capsys: pytest.CaptureFixture[str]) -> None:
    budget = 40
    run = ts.trace_run(str(SAMPLE), "auto", 2, budget, "none", {"use_shmem": 1})
    assert len(run["rows"]) == budget
    # the same seed in replay_search.py: the same results in the same order, so the same figures
    ref = ts.rs.run_one((str(SAMPLE), "auto", 2, budget, "none"))
    assert [r["value"] for r in run["rows"]] == ref["values"]
    opt = run["opt"]
    hit = next((k + 1 for k, x in enumerate(ref["trace"]) if x is not None and x <= 1.05 * opt), None)
    assert run["reach"][1.05] == hit
    inside = [r for r in run["rows"] if r["config"]["use_shmem"] == 1]
    assert run["region"]["total"] == len(inside)
    assert run["region"]["first"] == (inside[0]["n"] if inside else None)

    ts.print_run(run, ["block_size_x", "block_size_y", "use_shmem"], show_all=False)
    out = capsys.readouterr().out
    assert out.startswith("## seed 2: 1.05x at ")
    counts = re.search(r"components \(proposals / new incumbents\): (.*)", out)
    assert counts is not None
    pairs = [tuple(int(x) for x in part.rsplit(" ", 1)[1].split("/")) for part in counts.group(1).split(", ")]
    assert sum(p for p, _ in pairs) == budget
    ratios = [float(m) for m in re.findall(r" (\d+\.\d{3})x ", out)]
    assert ratios == sorted(ratios, reverse=True) and len(ratios) == sum(w for _, w in pairs)
    best = min(r["value"] for r in run["rows"] if r["value"] is not None)
    assert math.isclose(ratios[-1], round(best / opt, 3))


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(SAMPLE), "--seeds", "0,3", "--budget", "12", "--region", "use_shmem=1,tile_size_y=3"]
    assert ts.main(args) == 0
    out = capsys.readouterr().out
    assert "## seed 0:" in out and "## seed 3:" in out
    assert re.search(r"# region use_shmem=1,tile_size_y=3: \d+ valid configs", out)
    assert ts.parse_seeds("0,3,5-7") == [0, 3, 5, 6, 7]
    for bad in (
        ["--region", "warps=4"],
        ["--seeds", "a-b"],
        ["--strategy", "random"],
        ["--strategy", "auto@n_init=0"],
    ):
        with pytest.raises(SystemExit) as exc:
            ts.main([str(SAMPLE), "--budget", "5", *bad])
        assert exc.value.code == 2, bad
    with pytest.raises(SystemExit) as exc:
        ts.main(["convolution/NOPE"])
    assert exc.value.code == 2 and "no table 'convolution/NOPE'" in capsys.readouterr().err
    assert ts.resolve_table("convolution/A100").endswith("A100.json.gz")


def test_summary_counts_the_results_before_the_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    budget = 40
    runs = [ts.trace_run(str(SAMPLE), "auto", seed, budget, "none", {}) for seed in (0, 1)]
    summary = ts.summarise(runs, early=10)
    before = []
    for run in runs:
        hit = run["reach"][1.05]
        before += [r for r in run["rows"] if hit is None or r["n"] <= hit]
    comp = summary["components"]
    assert sum(c["proposals"] for c in comp.values()) == len(before)
    assert {src for src, _ in comp} == {r["source"] for r in before}
    assert all(phase in ("early", "late") for _, phase in comp)
    assert sum(c["proposals"] for (_, phase), c in comp.items() if phase == "early") == sum(
        1 for r in before if r["n"] <= 10
    )
    # the gains add up to the incumbent's improvement from the first result to the last counted one
    for run in runs:
        hit = run["reach"][1.05]
        rows = [r for r in run["rows"] if hit is None or r["n"] <= hit]
        vals = [r["value"] for r in rows if r["value"] is not None]
        single = ts.summarise([{**run, "rows": rows}], early=10)
        total = sum(c["gain"] for c in single["components"].values())
        assert total == pytest.approx(math.log(vals[0] / min(vals)), abs=2e-3 * len(rows))
    # every counted proposal that is not a space-filling draw and comes after a valid result has a distance
    expected = 0
    for run in runs:
        hit = run["reach"][1.05]
        seen_valid = False
        for r in run["rows"]:
            if hit is not None and r["n"] > hit:
                break
            expected += seen_valid and r["source"] != "space_filling"
            seen_valid = seen_valid or r["value"] is not None
    dist = summary["distance"]
    assert sum(c["proposals"] for c in dist.values()) == expected
    assert sum(c["wins"] for c in dist.values()) <= sum(c["wins"] for c in comp.values())

    ts.print_summary(summary)
    out = capsys.readouterr().out
    assert out.startswith("## summary over 2 runs, results before 1.05x")
    assert "by Hamming distance from the incumbent" in out and "4+ parameters" in out


def test_summary_cli_takes_several_tables_and_refuses_them_without_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ts.main([str(SAMPLE), str(SAMPLE), "--seeds", "0", "--budget", "15", "--summary"]) == 0
    assert "## summary over 2 runs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        ts.main([str(SAMPLE), str(SAMPLE), "--seeds", "0", "--budget", "15"])
    assert exc.value.code == 2 and "several tables only with --summary" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        ts.main([str(SAMPLE), "--summary", "--all"])
    assert exc.value.code == 2 and "--summary takes neither" in capsys.readouterr().err
