"""benchmarks/replay_search.py: strategy variants (`NAME@KEY=VALUE`) and the 95% intervals of its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._scripts import benchmark_script
from tuner.strategies import ModelStrategy, ModelStrategyConfig

SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"


rs = benchmark_script("replay_search")


def test_variants_change_fields_of_the_config_object() -> None:
    assert rs.parse_variant("auto") == ("auto", {})
    assert rs.parse_variant("auto@restart_seed=1@target_clip=null@crossover=false") == (
        "auto",
        {"restart_seed": 1, "target_clip": None, "crossover": False},
    )
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        rs.parse_variant("auto@patience")
    table = rs._table(str(SAMPLE))
    strat = rs.make_strategy("auto@patience=7", table.space, 3, None)
    assert isinstance(strat, ModelStrategy) and strat.seed == 3
    assert strat.config == ModelStrategyConfig(patience=7)
    assert rs.make_strategy("tpe", table.space, 0, None) == "tpe"
    assert rs.variant_error(["auto@patience=7", "random", "kt:pso"]) is None
    assert "patience=0 must be > 0" in (rs.variant_error(["auto@patience=0"]) or "")
    assert "no settings" in (rs.variant_error(["random@x=1"]) or "")


def _run(trace: list[float | None], path: str, strategy: str = "s") -> dict:
    return {
        "file": path,
        "strategy": strategy,
        "seed": 0,
        "trace": trace,
        "evaluations": len(trace),
        "strategy_ms_per_eval": 1.0,
    }


def test_bootstrap_interval_brackets_the_figure_and_shrinks_to_a_point_when_seeds_agree() -> None:
    path = str(SAMPLE)
    table = rs._table(path)
    opt, budget = table.optimum, 10
    far = opt * 2.0
    same = [_run([far] * 5 + [opt] * 5, path) for _ in range(6)]
    ci = rs.bootstrap_ci(same, [path], "s", budget, n_boot=200)
    assert ci["geo1.05"] == (6.0, 6.0) and ci["reach1.05"] == (1.0, 1.0)
    mixed = [_run([far] * (k + 1) + [opt] * (budget - k - 1), path) for k in range(8)]
    mixed += [_run([far] * budget, path) for _ in range(4)]  # 4 of 12 never reach it
    summary = rs.summarise(mixed, budget)
    group = rs._group(summary, [path], mixed, budget)["s"]
    lo, hi = group["ci"]["reach1.05"]
    assert group["reach1.05"] == pytest.approx(8 / 12) and lo < 8 / 12 < hi
    lo, hi = group["ci"]["geo1.05"]
    assert lo <= group["geo1.05"] <= hi and lo < hi
    assert rs.bootstrap_ci(mixed, [path], "s", budget, n_boot=200) == rs.bootstrap_ci(
        mixed, [path], "s", budget, n_boot=200
    )  # seeded: the same runs give the same interval


def test_report_prints_intervals_and_keeps_them_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    args = ["--data", str(SAMPLE.parent), "--files", SAMPLE.name, "--budget", "8", "--seeds", "3"]
    assert rs.main([*args, "--strategies", "random,auto@n_init=4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[95% CI]" in text and "auto@n_init=4" in text
    groups = json.loads(out.read_text(encoding="utf-8"))["summary"]["groups"]["ALL"]
    lo, hi = groups["auto@n_init=4"]["ci"]["score"]
    assert lo <= groups["auto@n_init=4"]["score"] <= hi
    assert rs.main([*args, "--strategies", "auto@n_init=0"]) == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--budget", "0"], "--budget"),  # was a ValueError traceback from optimize, exit 1
        (["--seeds", "0"], "--seeds"),  # was "0 runs", exit 0
        (["--jobs", "0"], "--jobs"),
        (["--strategies", "random,no_such"], "unknown strategy 'no_such'"),  # a traceback, exit 1
        (["--from-json", "no_such_run.json"], "--from-json: no file no_such_run.json"),  # a traceback
        (["--json", "no_such_folder/run.json"], "--json: no folder"),  # lost the whole run at its end
    ],
)
def test_bad_arguments_exit_2_with_one_line_before_any_run(
    args: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(rs, "run_one", lambda job: pytest.fail("ran before refusing its arguments"))
    base = ["--data", str(SAMPLE.parent), "--files", SAMPLE.name, "--seeds", "1", "--budget", "5"]
    with pytest.raises(SystemExit) as exc:
        code = rs.main([*base, *args])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "Traceback" not in "\n".join(err)
    assert list(cwd.iterdir()) == []


def test_permute_order_presents_the_same_table_in_another_order() -> None:
    """`--permute-order`: the pool (rows) and the parameters (columns) in a per-seed random order or
    reversed, every config keeping its value; the file's order is the table itself."""
    table = rs._table(str(SAMPLE))
    rows = table.as_prior()
    assert rs.reorder_table(table, "file", 0) is table
    rev = rs.reorder_table(table, "reverse", 0)
    assert rev.space.names == table.space.names[::-1]
    assert rev.space.config(list(rev.space.iter_keys())[0]) == rows[-1][0]
    orders = set()
    for seed in (0, 1):
        shuf = rs.reorder_table(table, "shuffle", seed)
        assert shuf.optimum == table.optimum and len(shuf.values) == len(table.values)
        assert all(shuf.lookup(c) == v for c, v in rows)
        assert {p.name: p.values for p in shuf.space.params} == {p.name: p.values for p in table.space.params}
        first = shuf.space.config(list(shuf.space.iter_keys())[0])
        orders.add((tuple(shuf.space.names), tuple(sorted(first.items()))))
        again = rs.reorder_table(table, "shuffle", seed)  # per seed, the same order
        assert list(again.space.iter_keys()) == list(shuf.space.iter_keys())
    assert len(orders) == 2
    with pytest.raises(ValueError, match="order 'sideways'"):
        rs.reorder_table(table, "sideways", 0)
