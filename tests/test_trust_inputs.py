"""Honest exit codes and input bounds (issue 15 item 2, issue 14 item 6): study names, problem schemas,
studies whose every trial failed, reports and exports of studies that never ran, removed tasks, report
image names, exports the importer would refuse, `--json`, regress validation and protocol, bounded
decompression for replay, `optimize` when every trial fails, and scripts without a main guard."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.test_studies import FAKE, REPO, cli, write_study

FAILING = "tests._study_fake:failing_executor"


def _created(tmp: Path) -> list[str]:
    """What is in the test's folder besides the TUNER_HOME the test fixture made (if empty)."""
    home = tmp / "tuner_home"
    return sorted(n for n in os.listdir(tmp) if n != "tuner_home" or (home.is_dir() and os.listdir(home)))


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("tuner:")]
    assert lines, err
    return lines[-1]


# ---- study names and problem schemas -------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "../up", ""])
def test_study_names_are_plain_identifiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    p = tmp_path / "s.toml"
    p.write_text(
        f"[study]\nname = {json.dumps(name)}\nbudget = 2\n[[tasks]]\nkernel = 'k'\nproblems = [{{M = 1}}]\n",
        encoding="utf-8",
    )
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "plain identifier" in err
    assert not home.exists() and _created(tmp_path) == ["s.toml"]


@pytest.mark.parametrize(
    ("kernel", "problem", "needle"),
    [
        ("matmul", '{ M = 64, N = 64, K = 64, bias = "yes" }', "bias='yes' must be a boolean"),
        ("matmul", "{ M = -32.5, N = 64, K = 64 }", "M=-32.5 must be an integer"),
        ("matmul", "{ M = 1e12, N = 64, K = 64 }", "M=1000000000000.0 must be an integer"),
        ("matmul", "{ M = 1000000000000, N = 64, K = 64 }", "must be an integer in [1, 2147483647]"),
        ("matmul", '{ M = 64, N = 64, K = 64, activation = "tanh" }', "activation='tanh'"),
        ("matmul", "{ M = 64, N = 64, K = 64, alpha = 2 }", "no problem field 'alpha'"),
        ("rmsnorm", "{ M = 8, N = 64, eps = -1.0 }", "eps=-1.0"),
        ("rmsnorm", "{ M = 8, N = 64, eps = true }", "eps=True must be a number"),
        ("flash_attention", "{ B = 1, H = 1, S = 16, D = 48 }", "D=48"),
        ("flash_attention", '{ B = 1, H = 1, S = 16, D = 64, causal = "no" }', "causal='no'"),
    ],
)
def test_problem_values_are_checked_against_the_kernel_schema_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kernel: str, problem: str, needle: str
) -> None:
    p = tmp_path / "s.toml"
    p.write_text(
        f"[study]\nname = 'x'\ndevice = 'cpu'\nbudget = 2\noutput = 'out'\n"
        f"[[tasks]]\nkernel = '{kernel}'\nproblems = [{problem}]\n",
        encoding="utf-8",
    )
    assert cli("study", "run", str(p), "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err, err
    # the kernel named once ("kernel 'matmul': kernel 'matmul' has no problem field ..." before)
    assert err.count(f"kernel '{kernel}'") == 1, err
    assert not (tmp_path / "out").exists()


def test_every_kernel_default_problem_passes_its_schema() -> None:
    from tuner.kernels import all_kernels, validate_problem

    for spec in all_kernels():
        assert validate_problem(spec, spec.default_problem)["dtype"] == spec.default_problem["dtype"]
        with pytest.raises(ValueError, match="must be one of"):
            validate_problem(spec, {**spec.default_problem, "dtype": "float64"})


def test_schema_takes_the_optional_fields_a_kernel_declares() -> None:
    """moe_gemm's group_sizes (docs/kernels.md) was 'no problem field' to validate_problem while
    `tuner check` took it; the kernel's own check still judges its value."""
    from tuner.kernels import get_kernel, validate_problem

    spec = get_kernel("moe_gemm")
    problem = {"T": 12, "K": 8, "N": 8, "E": 3, "group_sizes": [0, 12, 0]}
    assert validate_problem(spec, problem)["group_sizes"] == [0, 12, 0]
    with pytest.raises(ValueError, match="summing to T=12"):
        validate_problem(spec, {**problem, "group_sizes": [1, 2, 3]})
    with pytest.raises(ValueError, match="sm_scale='big' must be a number or None"):
        validate_problem(get_kernel("flash_attention"), {"sm_scale": "big"})


# ---- work that did not happen --------------------------------------------------------------------------
def test_a_study_whose_every_trial_failed_exits_1_and_exports_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.studies import TaskBoard, load_study

    p = write_study(tmp_path, n_m=2, budget=3)
    assert cli("study", "run", str(p), "--executor", FAILING, "--quiet") == 1
    captured = capsys.readouterr()
    assert "nothing to export" in _one_line(captured.err)
    spec = load_study(p, check_kernels=False)
    board = TaskBoard(spec.storage)
    rows = board.rows(spec.name)
    board.close()
    assert [r.status for r in rows] == ["failed", "failed"]
    assert all("every one of 3 trials failed" in (r.error or "") for r in rows)
    assert "ModuleNotFoundError" in (rows[0].error or "")
    assert not (spec.output_dir / "cache.json").exists()
    assert (spec.output_dir / "report" / "report.md").exists()  # the failures are reported
    # --json: one object, ok false, the reason; still exit 1
    assert cli("study", "run", str(p), "--executor", FAILING, "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "nothing to export" in out["error"]
    assert out["counts"] == {"done": 0, "failed": 2, "pending": 0, "running": 0}
    # study export of it: exit 1, nothing written
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json")) == 1
    assert "nothing to export" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "c.json").exists()


def test_report_and_export_of_a_study_that_never_ran_exit_1_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path, n_m=1)
    assert cli("study", "report", str(p), "--out", str(tmp_path / "r")) == 1
    assert "never ran" in _one_line(capsys.readouterr().err)
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json"), "--json") == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is False and "never ran" in _one_line(captured.err)
    assert _created(tmp_path) == ["s.toml"]  # no database, report or file created
    # registered but never run (the database exists): still nothing to report
    from tuner.studies import load_study, prepare_study

    prepare_study(load_study(p, check_kernels=False))
    assert cli("study", "report", str(p), "--out", str(tmp_path / "r")) == 1
    assert "no task that ran" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()


def test_report_and_export_out_of_the_wrong_kind_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path, n_m=1)
    assert cli("study", "export", str(p), "--out", str(tmp_path)) == 2
    assert "is a folder" in capsys.readouterr().err
    assert cli("study", "report", str(p), "--out", str(p)) == 2
    assert "is a file" in capsys.readouterr().err


def test_removed_tasks_leave_summaries_reports_and_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path, n_m=2, budget=3)
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet") == 0
    capsys.readouterr()
    write_study(tmp_path, n_m=1, budget=3)  # the M=128 task is removed from the file
    assert cli("study", "run", str(p), "--executor", FAKE, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"]["done"] == 1 and out["cache"]["entries"] == 1
    md = (tmp_path / "out-s" / "report" / "report.md").read_text(encoding="utf-8")
    assert "K=32,M=64,N=64" in md and "K=32,M=128,N=64" not in md
    assert len(list((tmp_path / "out-s" / "report" / "img").glob("*.png"))) == 1
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json")) == 0
    entries = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))["entries"]
    assert [e["key"]["M"] for e in entries] == [64]


def test_report_image_names_are_unique(tmp_path: Path) -> None:
    from tuner.studies import load_study, run_study, write_report
    from tuner.studies._report import image_name

    assert image_name("mm/triton/float32/M=1") != image_name("mm/triton/float32/M_1")
    long = "k/" + "x" * 200
    assert image_name(long + "a") != image_name(long + "b")
    spec = load_study(write_study(tmp_path, n_m=2, n_k=2, budget=2), check_kernels=False)
    run_study(spec, executor=FAKE)
    rep = write_report(spec, tmp_path / "rep")
    assert len(spec.tasks) == 4 and len({p.name for p in rep.images}) == 4


def test_export_refuses_what_import_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner.runtime._file as cache_file

    p = write_study(tmp_path, n_m=2, budget=2)
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 0
    assert cli("study", "export", str(p), "--out", str(tmp_path / "ok.json")) == 0
    size = (tmp_path / "ok.json").stat().st_size
    cache_file.read_cache_file(tmp_path / "ok.json")  # what export writes, import reads
    monkeypatch.setattr(cache_file, "MAX_FILE_BYTES", size - 1)  # the importer's limit, now smaller
    with pytest.raises(cache_file.CacheFileError):
        cache_file.read_cache_file(tmp_path / "ok.json")
    capsys.readouterr()
    assert cli("study", "export", str(p), "--out", str(tmp_path / "big.json")) == 1
    assert "would refuse" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "big.json").exists()


def test_json_output_of_study_run_report_and_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path, n_m=1, budget=2)
    capsys.readouterr()
    assert cli("study", "run", str(p), "--executor", FAKE, "--json") == 0
    run = json.loads(capsys.readouterr().out)
    assert run["ok"] is True and run["counts"]["done"] == 1 and run["cache"]["entries"] == 1
    assert Path(run["report"]["markdown"]).exists() and Path(run["cache"]["path"]).exists()
    assert cli("study", "report", str(p), "--out", str(tmp_path / "r"), "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and Path(rep["html"]).exists() and len(rep["images"]) == 1
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json"), "--json") == 0
    ex = json.loads(capsys.readouterr().out)
    assert ex == {"ok": True, "study": "s", "path": str(tmp_path / "c.json"), "entries": 1}


# ---- regress -------------------------------------------------------------------------------------------
def _softmax_entry(config: dict[str, Any], key: dict[str, Any] | None = None) -> dict[str, Any]:
    pytest.importorskip("triton", reason="an entry of the triton softmax carries triton's version")
    from tuner.runtime import backend_versions, kernel_cache_key

    k = kernel_cache_key(
        "softmax", key or {"M": 8, "N": 40, "dtype": "float32"}, backend="triton", device="cpu"
    )
    assert backend_versions("triton")
    return {
        **k.to_json(),
        "config": config,
        "time_s": 1e-3,
        "spread_s": 0.0,
        "date": "2026-01-01T00:00:00Z",
        "space": "",
    }


def _write_entries(path: Path, entries: list[dict[str, Any]]) -> Path:
    from tuner.studies._export import _write_builtin

    _write_builtin(path, entries)
    return path


GOOD = {"BLOCK_N": 64, "ROWS_PER_PROGRAM": 1, "num_warps": 1, "num_stages": 1}


def test_regress_validates_entries_against_the_schema_and_the_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.kernels import get_kernel
    from tuner.search_spaces import devices

    space = get_kernel("softmax").space({"M": 8, "N": 40, "dtype": "float32"}, devices.CPU, "triton")
    config = space.sample(0, n=1)[0]
    outside = {**config, "BLOCK_N": 3}
    assert not space.contains(outside)
    base = _write_entries(tmp_path / "b.json", [_softmax_entry(outside)])
    assert cli("regress", "--baseline", str(base)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not in the kernel's search space" in err and "BLOCK_N=3" in err
    bad = _write_entries(
        tmp_path / "k.json", [_softmax_entry(config, {"M": -5, "N": 40, "dtype": "float32"})]
    )
    assert cli("regress", "--baseline", str(bad)) == 2
    assert "M=-5" in capsys.readouterr().err


def test_regress_measures_with_the_studys_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default measure is the measurement layer's interleaved re-measurement of a winner (worker
    process, checked output), the same call `tune_kernel` makes for its finalists, with the study's
    number of timed runs."""
    from tuner.kernels import get_kernel
    from tuner.search_spaces import devices

    from tuner.measure import KernelMeasurer, TimingOptions
    from tuner.studies._regress import default_measure, protocol_repeats

    space = get_kernel("softmax").space({"M": 8, "N": 40, "dtype": "float32"}, devices.CPU, "triton")
    config = space.sample(1, n=1)[0]
    calls: list[Any] = []
    real = KernelMeasurer.remeasure

    def spy(self: Any, configs: Any) -> Any:
        calls.append((self.isolation, self.timing, [dict(c) for c in configs]))
        return real(self, configs)

    monkeypatch.setattr(KernelMeasurer, "remeasure", spy)
    n = protocol_repeats()
    t = TimingOptions()
    assert n == t.interleave_rounds * t.interleave_reps
    times = default_measure(_softmax_entry(config), n)
    assert len(times) == n and all(x > 0 for x in times)
    ((isolation, timing, configs),) = calls
    assert isolation == "process" and configs == [config]
    assert timing.interleave_rounds * timing.interleave_reps == n


# ---- replay: bounded decompression ---------------------------------------------------------------------
def test_replay_refuses_a_gzip_that_expands_past_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner._bounded as bounded

    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (4 << 20)))  # 4 MiB of spaces in a few KB
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(bounded.InputTooLarge, match="decompresses to more than"):
        bounded.read_bounded(bomb, limit=1 << 20)
    monkeypatch.setattr(bounded, "MAX_TABLE_BYTES", 1 << 20)
    assert cli("replay", str(bomb)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "decompresses to more than" in err and "slim_tables" in err
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((1 << 20) + 1))
    assert cli("replay", str(big)) == 2
    assert "over the limit" in capsys.readouterr().err
    small = tmp_path / "t.json.gz"
    small.write_bytes(gzip.compress(b'{"x": 1}'))
    assert bounded.read_bounded(small) == b'{"x": 1}'


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def test_replay_and_regress_exit_non_zero_when_nothing_was_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay whose every evaluation failed finds nothing: exit 1 with one line (and JSON without
    Infinity); a regress baseline without entries has nothing to check: exit 2."""
    cache = {}
    for i in range(10):
        cache[str(i)] = {"x": i, "time": 1.0 + i if i == 9 else "RuntimeFailedConfig"}
    table = tmp_path / "t.json"
    table.write_text(
        json.dumps(
            {
                "tune_params_keys": ["x"],
                "tune_params": {"x": list(range(10))},
                "objective": "time",
                "cache": cache,
            }
        ),
        encoding="utf-8",
    )
    codes = {}
    for seed in range(30):
        code = cli(
            "replay", str(table), "--strategy", "random", "--budget", "1", "--seed", str(seed), "--json"
        )
        captured = capsys.readouterr()
        out = json.loads(captured.out, parse_constant=_no_constant)  # strict JSON: no Infinity
        codes[code] = (out, captured.err)
    assert set(codes) == {0, 1}
    out, err = codes[1]
    assert out["best_config"] is None and out["best_value"] is None
    assert _one_line(err) == "tuner: replay: every one of 1 evaluations failed"
    assert codes[0][0]["best_config"] == {"x": 9}
    empty = _write_entries(tmp_path / "empty.json", [])
    assert cli("regress", "--baseline", str(empty)) == 2
    assert "nothing to check" in capsys.readouterr().err


# ---- optimize and the measurement layer ----------------------------------------------------------------
def test_optimize_warns_when_every_trial_failed() -> None:
    from tuner.search_spaces import PowerOfTwo, SearchSpace

    from tuner import optimize
    from tuner._optimize import AllTrialsFailedWarning

    def objective(config: dict[str, Any]) -> float:
        raise RuntimeError("no device")

    with pytest.warns(AllTrialsFailedWarning, match="every one of the 3 trials failed.*no device"):
        res = optimize(SearchSpace([PowerOfTwo("a", 1, 8)]), objective, budget=3)
    assert res.best_config is None and res.best_value == float("inf")


SCRIPT = """
from tuner.measure import CallableMeasurer


def work(n, *, k):
    return sum(range(n * k))

{body}
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_measuring_from_a_script_without_a_main_guard_fails_with_one_clear_line(
    tmp_path: Path, guarded: bool
) -> None:
    call = "res = CallableMeasurer(work, (100,)).measure({'k': 2})\nprint('status', res.status)"
    body = ('if __name__ == "__main__":\n' + textwrap.indent(call, "    ")) if guarded else call
    script = tmp_path / "tune_me.py"
    script.write_text(SCRIPT.format(body=body), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=300,
        encoding="utf-8",
    )
    if guarded:
        assert proc.returncode == 0 and "status ok" in proc.stdout, proc.stderr
        return
    assert proc.returncode == 1 and "status" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert "MainGuardError" in last and "tune_me.py" in last and 'if __name__ == "__main__":' in last
    assert proc.stderr.count("Traceback") == 1  # no worker ever started


def test_a_storage_url_of_no_known_database_is_bad_input_naming_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--storage bogus://x` used to end `study run`, `report` and `export` with SQLAlchemy's bare
    "Can't load plugin: sqlalchemy.dialects:bogus", and `--storage sqlite:/x` blamed the study file's
    [study] table, which names no storage. Each names where the URL came from, without its password."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STUDY_STORAGE", raising=False)
    p = tmp_path / "s.toml"
    body = "budget = 2\n[[tasks]]\nkernel = 'rmsnorm'\nproblems = [{ M = 16, N = 128 }]\n"
    p.write_text("[study]\nname = 'x'\ndevice = 'cpu'\n" + body, encoding="utf-8")
    for cmd in (["run", "--quiet"], ["report"], ["export", "--out", str(tmp_path / "c.json")]):
        for url, needle in (
            ("bogus://x", "storage 'bogus://x' names no database SQLAlchemy knows"),
            ("postgress://me:s3cret@db/t", "storage 'postgress://db/t' names no database"),
            ("sqlite:/x", "storage must be a database URL"),
        ):
            assert cli("study", cmd[0], str(p), *cmd[1:], "--storage", url) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and "s3cret" not in err, err
            assert err.startswith("tuner: error: --storage (or TUNER_STUDY_STORAGE): ") and needle in err, err
    p.write_text("[study]\nname = 'x'\ndevice = 'cpu'\nstorage = 'bogus://y'\n" + body, encoding="utf-8")
    assert cli("study", "run", str(p), "--quiet") == 2
    assert f"{p} [study]: storage 'bogus://y' names no database" in capsys.readouterr().err
    assert not home.exists() and not (tmp_path / "c.json").exists()


def test_an_unknown_strategy_is_blamed_on_the_table_that_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`strategy = "tpee"` in [study] was reported at `tasks[0] (rmsnorm)`, a table that names no
    strategy; an entry's own strategy is still reported at that entry."""
    p = tmp_path / "s.toml"
    task = "[[tasks]]\nkernel = 'rmsnorm'\nproblems = [{ M = 16, N = 128 }]\n"
    p.write_text(
        "[study]\nname = 'x'\ndevice = 'cpu'\nstrategy = 'tpee'\nbudget = 2\noutput = 'out'\n" + task,
        encoding="utf-8",
    )
    assert cli("study", "run", str(p), "--quiet") == 2
    assert f"{p} [study]: unknown strategy 'tpee'" in capsys.readouterr().err
    p.write_text(
        "[study]\nname = 'x'\ndevice = 'cpu'\nbudget = 2\noutput = 'out'\n" + task + "strategy = 'rnd'\n",
        encoding="utf-8",
    )
    assert cli("study", "run", str(p), "--quiet") == 2
    assert f"{p} tasks[0] (rmsnorm): unknown strategy 'rnd'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
