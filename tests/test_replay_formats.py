"""The Kernel Tuner files that exist in the wild, replayed or refused in one line (docs/api.md).

Each document here is modelled on a real one: Kernel Tuner's cache files in their successive versions
(`kernel_tuner/util.py` process_cache/store_cache, the cache schemas 1.0.0 and 1.1.0, the 1e20 failure
time of Kernel Tuner before 0.4), the FAIR Benchmark Hub's tables tuned for GFLOP/s (hotspot) or a
score (hyperparameter tuning), the T4 results files written beside them, and the files that are not
tables (KTT output, T4 metadata, Kernel Tuner's store_results)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._scripts import benchmark_script
from tuner.cli import main
from tuner.replay import ReplayFormatError, load_table

REPO = Path(__file__).resolve().parent.parent
SAMPLE = Path(__file__).parent / "data" / "convolution_A100_sample.json"

TUNE_PARAMS = {"block_size_x": [32, 64, 128], "block_size_y": [1, 2, 4], "tile_size": [1, 2]}
KEYS = list(TUNE_PARAMS)


def _time(c: dict[str, Any]) -> float:
    bx, by, tile = c["block_size_x"], c["block_size_y"], c["tile_size"]
    return 1.0 + abs(bx - 64) / 64 + abs(by - 2) / 4 + (0.3 if tile == 1 else 0.0)


def _doc(
    objective: str | None,
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    header: bool = True,
    tune_params: dict[str, list[Any]] = TUNE_PARAMS,
) -> dict[str, Any]:
    """A Kernel Tuner cache document: parameters first, then the measurements and the timing fields."""
    keys = list(tune_params)
    cache = {}
    for vals in itertools.product(*tune_params.values()):
        c = dict(zip(keys, vals, strict=True))
        entry = {**c, **measure(c)}
        entry.update(compile_time=1.0, verification_time=0, benchmark_time=2.0, strategy_time=0)
        entry.update(framework_time=0.1, timestamp="2024-01-01 00:00:00+00:00")
        cache[",".join(str(v) for v in vals)] = entry
    doc: dict[str, Any] = {"device_name": "NVIDIA A100-PCIE-40GB", "kernel_name": "pnpoly_kernel"}
    doc["problem_size"] = [20000000]
    if header:
        doc["tune_params_keys"] = keys
        doc["tune_params"] = tune_params
    if objective is not None:
        doc["objective"] = objective
    doc["cache"] = cache
    return doc


def _write(path: Path, doc: Any) -> Path:
    body = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(body) if path.name.endswith(".gz") else body)
    return path


def _replay_json(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    budget = "18"  # the whole table: the search must end on the optimum
    assert main(["replay", str(path), "--budget", budget, "--strategy", "random", "--json", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _refused(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["replay", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tuner: error:") and "\n" not in err and "Traceback" not in err, err
    return err


def _failed_gflops(c: dict[str, Any]) -> bool:
    return c["block_size_x"] == 128 and c["block_size_y"] == 4


def _gflops(c: dict[str, Any]) -> dict[str, Any]:
    # Kernel Tuner records a failure under the run's objective; such an entry has no time at all
    if _failed_gflops(c):
        return {"GFLOP/s": "CompilationFailedConfig"}
    return {"time": _time(c), "times": [_time(c)] * 3, "GFLOP/s": 1000.0 / _time(c)}


BEST = {"block_size_x": 64, "block_size_y": 2, "tile_size": 2}  # time 1.0, 1000 GFLOP/s
WORST_OK = {"block_size_x": 128, "block_size_y": 4, "tile_size": 1}


# ---- the direction of the objective -------------------------------------------------------------------
def test_a_gflops_table_is_maximised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hub's hotspot tables were tuned with objective="GFLOP/s": the optimum is the fastest config."""
    path = _write(tmp_path / "A100.json.gz", _doc("GFLOP/s", _gflops))
    table = load_table(path)
    assert table.higher_is_better and table.objective == "GFLOP/s"
    assert table.best_config() == BEST and table.recorded(table.optimum) == pytest.approx(1000.0)
    assert table.lookup(BEST) < table.lookup({**BEST, "tile_size": 1})  # costs: lower is better
    assert sum(v is None for v in table.values.values()) == 2 and len(table.space) == 18
    out = _replay_json(path, capsys)
    assert out["objective"] == "GFLOP/s" and out["higher_is_better"] is True
    assert out["best_config"] == BEST and out["best_value"] == pytest.approx(1000.0) == out["optimum"]
    assert max(v for v in out["values"] if v is not None) == pytest.approx(1000.0)
    assert main(["replay", str(path), "--budget", "3", "--strategy", "random"]) == 0
    text = capsys.readouterr().out
    assert "GFLOP/s, higher is better" in text and "optimum    1000" in text


def _kt15(c: dict[str, Any]) -> dict[str, Any]:
    """An entry as Kernel Tuner 1.x writes it: a failed config has `__error__` and no measurements."""
    if _failed_gflops(c):
        return {"__error__": "RuntimeFailedConfig"}
    return {"time": _time(c), "times": [_time(c)] * 3, "GFLOP/s": 1000.0 / _time(c)}


@pytest.mark.parametrize("closed", [True, False])
def test_the_objective_list_of_kernel_tuner_1x_names_the_objective(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], closed: bool
) -> None:
    """Kernel Tuner 1.x (1.5.0's process_cache) writes the run's objectives as a list, `"objective":
    ["GFLOP/s"]`; replay refused every such file ("objective must be a string, got ['GFLOP/s']")."""
    doc = _doc("GFLOP/s", _kt15)
    doc["objective"] = ["GFLOP/s"]  # before the cache, where Kernel Tuner writes it
    if closed:
        path = _write(tmp_path / "kt15.json", doc)
    else:  # the header without its closing braces, then the entries as store_cache appends them
        head = json.dumps(dict(doc, cache={}), indent="")[:-3]
        body = "".join("\n" + json.dumps({k: v})[1:-1] + "," for k, v in doc["cache"].items())
        path = tmp_path / "kt15.json"
        path.write_text(head + body, encoding="utf-8")
    table = load_table(path)
    assert table.objective == "GFLOP/s" and table.higher_is_better
    assert table.best_config() == BEST and sum(v is None for v in table.values.values()) == 2
    out = _replay_json(path, capsys)
    assert out["objective"] == "GFLOP/s" and out["best_value"] == pytest.approx(1000.0) == out["optimum"]
    # a multi-objective run records several: the first is its primary objective, --objective picks another
    doc["objective"] = ["time", "GFLOP/s"]
    path = _write(tmp_path / "multi.json", doc)
    assert load_table(path).objective == "time" and not load_table(path).higher_is_better
    assert load_table(path, objective="GFLOP/s").higher_is_better
    # benchmarks/slim_tables.py keeps the primary objective's column (it raised TypeError: unhashable list)
    slim = benchmark_script("slim_tables").slim(doc)
    assert all(set(e) == set(KEYS) | {"time"} for e in slim["cache"].values())
    doc["objective"] = [3]
    assert "objective must be a name or a list of names" in _refused(
        _write(tmp_path / "bad.json", doc), capsys
    )


def test_another_recorded_column_can_be_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--objective time on a GFLOP/s table: the failed entries, which have no time, are failures."""
    path = _write(tmp_path / "A100.json", _doc("GFLOP/s", _gflops))
    table = load_table(path, objective="time")
    assert not table.higher_is_better and table.optimum == 1.0 and table.best_config() == BEST
    assert sum(v is None for v in table.values.values()) == 2
    out = _replay_json(path, capsys, "--objective", "time")
    assert out["objective"] == "time" and out["optimum"] == 1.0 and out["higher_is_better"] is False


def test_an_objective_of_unknown_direction_is_refused_unless_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kernel Tuner refuses an objective it does not know without objective_higher_is_better; so do we."""
    pos = _write(tmp_path / "pos.json", _doc("score", lambda c: {"score": 1.0 / _time(c)}))
    err = _refused(pos, capsys)
    assert "'score' has no known direction" in err and "--higher-is-better" in err
    with pytest.raises(ReplayFormatError, match="no known direction"):
        load_table(pos)
    assert load_table(pos, higher_is_better=True).best_config() == BEST
    assert load_table(pos, higher_is_better=False).best_config() == WORST_OK
    assert _replay_json(pos, capsys, "--higher-is-better")["best_config"] == BEST
    # recorded in the file (the store_results convention) when the caller does not say
    doc = _doc("score", lambda c: {"score": 1.0 / _time(c)})
    doc["objective_higher_is_better"] = True
    assert load_table(_write(tmp_path / "told.json", doc)).best_config() == BEST
    # the hub's hyperparameter-tuning tables record negative scores: not something replay can rank
    neg = _write(tmp_path / "neg.json", _doc("score", lambda c: {"score": 0.5 - _time(c) / 2}))
    assert "replay needs positive values" in _refused(neg, capsys, "--higher-is-better")
    # argparse: the two are exclusive
    assert main(["replay", str(pos), "--higher-is-better", "--lower-is-better"]) == 2
    assert "not allowed with" in capsys.readouterr().err


def test_known_directions_follow_kernel_tuner(tmp_path: Path) -> None:
    energy = load_table(_write(tmp_path / "e.json", _doc("energy", lambda c: {"energy": 3 * _time(c)})))
    assert not energy.higher_is_better and energy.best_config() == BEST and energy.optimum == 3.0
    gbs = load_table(_write(tmp_path / "g.json", _doc("GB/s", lambda c: {"GB/s": 50 / _time(c)})))
    assert gbs.higher_is_better and gbs.best_config() == BEST


# ---- failures as Kernel Tuner recorded them ------------------------------------------------------------
def test_the_old_1e20_failure_time_is_a_failure(tmp_path: Path) -> None:
    """Kernel Tuner before 0.4 wrote time=1e20 for a config that failed to compile or run."""

    def old(c: dict[str, Any]) -> dict[str, Any]:
        return {"time": 1e20 if c["block_size_x"] == 32 and c["tile_size"] == 2 else _time(c)}

    table = load_table(_write(tmp_path / "old.json", _doc(None, old)))
    assert sum(v is None for v in table.values.values()) == 3
    assert max(v for v in table.values.values() if v is not None) < 10


def test_every_failure_string_and_nan_is_a_failure(tmp_path: Path) -> None:
    fails = ["InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", float("nan"), float("inf")]
    configs = list(itertools.product(*TUNE_PARAMS.values()))

    def measure(c: dict[str, Any]) -> dict[str, Any]:
        i = configs.index(tuple(c.values()))
        return {"time": fails[i] if i < len(fails) else _time(c)}

    doc = _doc("time", measure)
    doc["schema_version"] = "1.1.0"
    table = load_table(_write(tmp_path / "v110.json", doc))
    assert sum(v is None for v in table.values.values()) == len(fails) and table.best_config() == BEST
    # newer Kernel Tuner marks a failure with "__error__"; whatever else the entry holds, it failed
    doc["cache"]["64,2,2"]["__error__"] = "RuntimeFailedConfig"
    table = load_table(_write(tmp_path / "error.json", doc))
    assert table.lookup(BEST) is None and table.best_config() != BEST


@pytest.mark.parametrize("objective", ["time", "GFLOP/s"])
def test_an_int_beyond_a_floats_range_is_a_failure_as_infinity_is(
    objective: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON reads the literal 1e400 as inf (a failure); the int 10**400 is the same number, and used to end
    the replay with OverflowError (exit 1) instead."""
    doc = _doc(objective, lambda c: {objective: 10**400 if c == WORST_OK else 1000.0 / _time(c)})
    path = _write(tmp_path / "huge.json", doc)
    table = load_table(path)
    assert table.lookup(WORST_OK) is None and sum(v is None for v in table.values.values()) == 1
    assert _replay_json(path, capsys)["evaluations"] == 18


@pytest.mark.parametrize("bad", [0.0, -1.5])
def test_a_time_that_is_not_positive_is_refused(
    bad: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc("time", lambda c: {"time": bad if c == BEST else _time(c)})
    err = _refused(_write(tmp_path / "t.json", doc), capsys)
    assert "'64,2,2': time=" in err and "positive" in err


# ---- parameters -----------------------------------------------------------------------------------------
def test_float_string_and_bool_parameters_in_any_field_order(tmp_path: Path) -> None:
    tp: dict[str, list[Any]] = {"vec": [1.0, 2.5], "layout": ["row", "col"], "use_shmem": [True, False]}
    doc = _doc(
        "time",
        lambda c: {"time": 1 + c["vec"] + (c["layout"] == "row") + (not c["use_shmem"])},
        tune_params=tp,
    )
    for ck, e in list(doc["cache"].items()):  # measurements first, parameters reversed
        doc["cache"][ck] = {"time": e["time"], **dict(reversed([(k, e[k]) for k in tp]))}
    table = load_table(_write(tmp_path / "m.json.gz", doc))
    assert table.space.names == list(tp) and len(table.space) == 8
    assert table.best_config() == {"vec": 1.0, "layout": "col", "use_shmem": True} and table.optimum == 2.0
    assert table.lookup({"vec": 2.5, "layout": "row", "use_shmem": False}) == 5.5


def test_without_tune_params_keys_the_parameters_come_from_the_cache_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Extra measured fields (a user metric, an observer's output) must not become parameters."""
    doc = _doc("time", lambda c: {"time": _time(c), "GB/s": 50 / _time(c), "nvml_power": 200}, header=False)
    table = load_table(_write(tmp_path / "k.json", doc))
    assert table.space.names == KEYS and table.best_config() == BEST
    mangled = {f"cfg{i}": e for i, e in enumerate(doc["cache"].values())}
    err = _refused(_write(tmp_path / "bad.json", dict(doc, cache=mangled)), capsys)
    assert "cannot tell the parameters from the measurements" in err


# ---- files as they come ---------------------------------------------------------------------------------
def test_an_interrupted_kernel_tuner_run_replays_what_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kernel Tuner writes the header without its closing braces, then appends '\\n"key": {...},'."""
    doc = _doc("time", lambda c: {"time": _time(c)})
    entries = list(doc["cache"].items())
    head = json.dumps(dict(doc, cache={}), indent="")[:-3]
    body = "".join("\n" + json.dumps({k: v})[1:-1] + "," for k, v in entries[:7])
    (tmp_path / "open.json").write_text(head + body, encoding="utf-8")
    table = load_table(tmp_path / "open.json")
    assert len(table.space) == 7
    (tmp_path / "empty.json").write_text(head, encoding="utf-8")
    assert "has no entries" in _refused(tmp_path / "empty.json", capsys)


def test_an_interrupted_run_whose_last_entry_ends_in_two_braces_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An open file whose last entry ends with a dict-valued field ends in "}}" (Kernel Tuner's test file
    open_cache_looks_like_closed.json, which its read_cache closes): load_table took it for a closed
    file and refused it as "not valid JSON"."""
    doc = _doc("time", lambda c: {"time": _time(c)})
    entries = [(k, {**v, "observed": {"power": [1.5, 2.0]}}) for k, v in doc["cache"].items()]
    head = json.dumps(dict(doc, cache={}), indent="")[:-3]
    body = ",".join("\n" + json.dumps({k: v})[1:-1] for k, v in entries[:5])
    (tmp_path / "open.json").write_text(head + body + "\n", encoding="utf-8")
    assert (tmp_path / "open.json").read_text(encoding="utf-8").rstrip().endswith("}}")
    table = load_table(tmp_path / "open.json")
    assert len(table.space) == 5 and table.optimum == min(e["time"] for _, e in entries[:5])
    (tmp_path / "cut.json").write_text(
        head + body[:-10], encoding="utf-8"
    )  # cut inside an entry: not a table
    assert "not valid JSON" in _refused(tmp_path / "cut.json", capsys)


def _t4(doc: dict[str, Any]) -> dict[str, Any]:
    """Kernel Tuner's convert_cache_to_t4, as the hub's *_T4.json.gz files were made."""
    objective = doc.get("objective", "time")
    invalidity = {
        "CompilationFailedConfig": "compile",
        "RuntimeFailedConfig": "runtime",
        "InvalidConfig": "constraints",
    }
    results = []
    for e in doc["cache"].values():
        v = e[objective]
        inv = invalidity.get(v, "correct") if isinstance(v, str) else "correct"
        results.append(
            {
                "timestamp": "2024-01-01 00:00:00+00:00",
                "configuration": {k: e[k] for k in doc["tune_params_keys"]},
                "times": {"compilation": 1.0, "framework": 0.1, "search_algorithm": 0, "validation": 0},
                "invalidity": inv,
                "correctness": 1 if inv == "correct" else 0,
                "measurements": [{"name": objective, "value": v, "unit": ""}],
                "objectives": [objective],
            }
        )
    return {"metadata": {"timeunit": "miliseconds"}, "results": results, "schema_version": "1.0.0"}


def test_a_t4_results_file_replays_as_its_cache_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(SAMPLE.read_text(encoding="utf-8"))
    t4 = _write(tmp_path / "A100_T4.json.gz", _t4(doc))
    a, b = load_table(SAMPLE), load_table(t4)
    assert list(a.values.items()) == list(b.values.items())
    # the same configs and domains; the space's name differs (a T4 file names no kernel)
    same = [{k: v for k, v in t.space.describe().items() if k != "name"} for t in (a, b)]
    assert same[0] == same[1]
    assert main(["replay", str(t4), "--budget", "5", "--strategy", "random", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimum"] == a.optimum
    g = load_table(_write(tmp_path / "g_T4.json", _t4(_doc("GFLOP/s", _gflops))))
    assert g.higher_is_better and g.best_config() == BEST and sum(v is None for v in g.values.values()) == 2


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"Metadata": {"Device": "NVIDIA GeForce RTX 3090"}, "Results": [{"KernelName": "pnpoly"}]}, "KTT"),
        ({"metadata": {"hardware": {}}, "schema_version": "1.0.0"}, "T4 metadata"),
        ({"version_number": "1.0", "tunable_parameters": KEYS, "data": []}, "store_results"),
    ],
    ids=["ktt", "t4-metadata", "store-results"],
)
def test_files_that_are_not_tables_are_named(
    doc: dict[str, Any], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in _refused(_write(tmp_path / "f.json.gz", doc), capsys)


# ---- the search benchmark on a folder laid out like the hub's ----------------------------------------
def test_replay_search_on_a_hub_folder_of_an_unseen_kernel(tmp_path: Path) -> None:
    """KERNEL/GPU.json.gz of a kernel the project has never seen, one GPU tuned for GFLOP/s, with the
    leave-one-out prior: every run of a whole-table budget ends on the true optimum."""
    data = tmp_path / "hub"
    (data / "pnpoly").mkdir(parents=True)
    for gpu, scale in (("RTX_3090", 1.0), ("A4000", 1.7), ("RTX_2080_Ti", 1.3)):
        objective = "GFLOP/s" if gpu == "RTX_3090" else "time"

        def measure(c: dict[str, Any], scale: float = scale, objective: str = objective) -> dict[str, Any]:
            if _failed_gflops(c):
                return {objective: "RuntimeFailedConfig"}
            return {"time": scale * _time(c), "GFLOP/s": 1000.0 / (scale * _time(c))}

        _write(data / "pnpoly" / f"{gpu}.json.gz", _doc(objective, measure))
    # what the hub keeps beside its cache files: not tables of their own (a T4 copy would also leak the
    # held-out table into its own leave-one-out prior, and a metadata file does not load)
    _write(
        data / "pnpoly" / "RTX_3090_T4.json.gz",
        _t4(json.loads(gzip.decompress((data / "pnpoly" / "RTX_3090.json.gz").read_bytes()))),
    )
    _write(
        data / "pnpoly" / "RTX_3090-metadata.json.gz",
        {"metadata": {"hardware": {}}, "schema_version": "1.0.0"},
    )
    rs = benchmark_script("replay_search")
    prior = rs._loo_prior(str(data / "pnpoly" / "RTX_3090.json.gz"))
    assert len(prior) == 2  # the two other GPUs, not the T4 copy of the held-out one
    out = tmp_path / "runs.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "replay_search.py"),
            *("--data", str(data), "--strategies", "random,auto", "--seeds", "1", "--budget", "18"),
            *("--prior", "loo", "--json", str(out)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "pnpoly/RTX_3090" in proc.stdout and "RTX_3090_T4" not in proc.stdout
    assert "skipped 2 files that are not tables" in proc.stderr
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert len(runs) == 6
    for r in runs:
        table = load_table(r["file"])
        assert min(v for v in r["trace"] if v is not None) == table.optimum, r["file"]
        assert table.best_config() == BEST


def test_slim_tables_on_a_hub_folder_skips_what_is_not_a_cache_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hub keeps T4 copies and metadata beside its cache files; slimming a GFLOP/s table keeps the
    failures that Kernel Tuner recorded under the objective."""
    from tests._scripts import benchmark_script

    slim_tables = benchmark_script("slim_tables")
    src = tmp_path / "hub" / "hotspot"
    src.mkdir(parents=True)
    doc = _doc("GFLOP/s", _gflops)
    _write(src / "W7800.json.gz", doc)
    _write(src / "W7800_T4.json.gz", _t4(doc))
    _write(src / "W7800-metadata.json.gz", {"metadata": {"hardware": {}}, "schema_version": "1.0.0"})
    assert slim_tables.main([str(tmp_path / "hub"), str(tmp_path / "slim")]) == 0
    assert "slim_tables: skipped 2 files that are not tables" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "slim" / "hotspot").iterdir()) == ["W7800.json.gz"]
    a, b = load_table(src / "W7800.json.gz"), load_table(tmp_path / "slim" / "hotspot" / "W7800.json.gz")
    assert list(a.values.items()) == list(b.values.items()) and b.best_config() == BEST


def test_a_none_parameter_value_in_a_prior_file_is_refused_as_in_a_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kernel Tuner takes None as a parameter value and records `null`; `--prior` with such a file said only
    "tile_size=None is not a scalar". It says what a None among a space's values says: use a sentinel."""
    table = _write(tmp_path / "t.json", _doc("time", lambda c: {"time": _time(c)}))
    prior_doc = _doc(
        "time", lambda c: {"time": _time(c)}, tune_params={**TUNE_PARAMS, "tile_size": [None, 2]}
    )
    prior = _write(tmp_path / "p.json", prior_doc)
    err = _refused(table, capsys, "--prior", str(prior))
    said = "cache entry '32,1,None': parameter 'tile_size': value None is not an int, float, str or bool;"
    assert said in err and 'give a sentinel string instead ("none")' in err, err
