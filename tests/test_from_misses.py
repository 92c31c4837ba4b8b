"""`tuner misses` and `tuner study from-misses` on hand-made miss logs (no tuning): filtering, call
weights, the study's device, decorated functions listed and not dropped, bad input exits 2; and the loop
of a decorated function of the user's own (--factory): any key fields, the study's export as exact hits,
resuming a task, `tuner regress --factory`, a fleet of workers on PostgreSQL."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests._env import repo_pythonpath  # noqa: E402
from tuner.cli import main as cli
from tuner.runtime import CacheKey
from tuner.runtime._kernel import kernel_cache_key
from tuner.runtime._misses import MissRecorder
from tuner.studies._from_misses import device_arch

REPO = Path(__file__).resolve().parent.parent


def _log(folder: Path, calls: dict[tuple[str, int, int], int], device: str = "cpu") -> None:
    rec = MissRecorder(folder=folder)
    for (kernel, m, n), c in calls.items():
        if kernel == "rmsnorm":
            ck = kernel_cache_key(
                "rmsnorm", {"M": m, "N": n, "dtype": "float32"}, backend="triton", device=device
            )
            cfg = rec.note(ck, {"BLOCK": 64}, "offline: space default", backend="triton", registered=True)
        else:
            ck = CacheKey.make(kernel, "0" * 32, {"n": m}, ["float32"], device, {"python": "3.11"})
            cfg = rec.note(ck, {"block": 16}, "offline: space default")
        for _ in range(c):
            dict(**cfg)
    rec.flush()


@pytest.fixture
def misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    folder = tmp_path / "misses"
    monkeypatch.setenv("TUNER_MISSES_DIR", str(folder))
    _log(
        folder,
        {("rmsnorm", 8, 64): 90, ("rmsnorm", 16, 128): 10, ("rmsnorm", 4, 32): 1, ("mine.launch", 7, 0): 50},
    )
    return folder


def test_misses_lists_merged_rows(misses: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(misses, {("rmsnorm", 8, 64): 10})  # a second process saw the same key
    assert cli(["misses", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kernel"], r["key"].get("M"), r["calls"]) for r in rows][:2] == [
        ("rmsnorm", 8, 100),
        ("mine.launch", None, 50),
    ]
    assert rows[0]["processes"] == 2 and rows[0]["device"] == "cpu" and rows[0]["dtypes"] == ["float32"]
    assert cli(["misses", "--kernel", "rmsnorm", "--min-calls", "10"]) == 0
    out = capsys.readouterr().out
    assert "2 keys, 110 calls" in out and "mine.launch" not in out


def test_from_misses_weights_tasks_by_calls(misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--min-calls", "5", "--trials", "8", "--out", str(out)]) == 0
    msg = capsys.readouterr().out
    assert "2 tasks of rmsnorm" in msg and "1 calls under --min-calls 5 left out" in msg
    doc = tomllib.loads(out.read_text(encoding="utf-8"))
    assert doc["study"]["device"] == "cpu"
    tasks = [(t["problems"][0]["M"], t["budget"]["trials"], t["dtypes"], t["backends"]) for t in doc["tasks"]]
    # 90 and 10 calls against an even split of 50: 8 * 1.8 -> 14, 8 * 0.2 -> 2 (the floor, 8 // 4)
    assert tasks == [(8, 14, ["float32"], ["triton"]), (16, 2, ["float32"], ["triton"])]
    assert "mine.launch key {'n': 7}" in out.read_text(encoding="utf-8")  # listed, not dropped


def test_from_misses_bad_input_exits_2(misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--min-calls", "1000", "--out", str(out)]) == 2
    assert "no recorded miss of a registered kernel with at least 1000 calls" in capsys.readouterr().err
    assert cli(["study", "from-misses", "--min-calls", "0", "--out", str(out)]) == 2
    assert not out.exists()


def test_device_arch():
    assert device_arch("cpu") == "cpu"
    assert device_arch("NVIDIA H100 80GB HBM3 (sm90)") == "sm90"
    assert device_arch("NVIDIA A100-SXM4-40GB (sm80)") == "sm80"
    assert device_arch("tpu:TPU v5 lite") is None


def test_mixed_devices_give_an_auto_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "m"
    monkeypatch.setenv("TUNER_MISSES_DIR", str(folder))
    _log(folder, {("rmsnorm", 8, 64): 3})
    _log(folder, {("rmsnorm", 8, 64): 3}, device="NVIDIA H100 (sm90)")
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--out", str(out)]) == 0
    doc = tomllib.loads(out.read_text(encoding="utf-8"))
    assert doc["study"]["device"] == "auto" and len(doc["tasks"]) == 1  # one problem, tuned once


# ---- decorated functions (--factory): any key fields, the study's own export, resuming, bad input ---------
KEYED_MODULE = """
import numpy as np

import tuner
from tuner import PowerOfTwo, SearchSpace

CALLS = []  # (fields, block) of every timed call
SLOWER = [1.0]  # a factor on every time (a regression, for `tuner regress`)


def _bench(call):  # deterministic: block 64 is the fastest
    block = call()
    return 1e-3 * (1 + abs(block.bit_length() - 7)) * SLOWER[0]


def _key(x, tag, off):  # a key function returning a dict with a `dtype` field, 0, a negative, None, quotes
    return {"n": x.shape[0], "dtype": str(x.dtype), "tag": tag, "off": off}


@tuner.autotune(SearchSpace([PowerOfTwo("block", 8, 128)]), key=_key, name="keyed_op", bench=_bench)
def op(x, tag, off, *, block):
    CALLS.append((x.shape[0], block))
    return block


def make_inputs(kernel, fields, dtypes):
    assert kernel == "keyed_op" and dtypes == [fields["dtype"]]
    return op, (np.ones(fields["n"], dtype=fields["dtype"]), fields["tag"], fields["off"]), {}
"""

KEYED_CALLS = [(100, "float16", 'say "hi"\\', 0), (100, "float32", None, -3), (7, "float64", "x", 1)]


def _keyed_calls(m: Any) -> list[tuple[Any, ...]]:
    import numpy as np

    return [(np.ones(n, dtype=dt), tag, off) for n, dt, tag, off in KEYED_CALLS]


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The user module, called in record mode (one miss per call of KEYED_CALLS)."""
    import importlib

    from tuner.runtime._misses import recorder

    (tmp_path / "keyed_user_mod.py").write_text(KEYED_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    monkeypatch.delenv("TUNER_CACHE_FILE", raising=False)
    monkeypatch.setenv("TUNER_MODE", "record")
    recorder().reset()
    sys.modules.pop("keyed_user_mod", None)
    m = importlib.import_module("keyed_user_mod")
    for args in _keyed_calls(m):
        assert m.op(*args) == 32  # the space default
    recorder().flush()
    yield m
    sys.modules.pop("keyed_user_mod", None)


def test_decorated_study_exports_exact_hits_for_any_key_fields(
    keyed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Key fields named `dtype`, values 0, negative or None, strings with quotes: each recorded key is a
    task, tuned, and `tuner study export` writes the key production looks up (was: a KeyError for the
    `dtype` field, keys with 0/None/negatives left out, and an export under made-up keys that never hit)."""
    study = tmp_path / "s.toml"
    fac = ["--factory", "keyed_user_mod:make_inputs", "--strategy", "random", "--trials", "4"]
    assert cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
    doc = tomllib.loads(study.read_text(encoding="utf-8"))
    assert len(doc["tasks"]) == 3
    assert {t["dtypes"][0] for t in doc["tasks"]} == {"float16", "float32", "float64"}  # the real dtypes
    run = ["study", "run", str(study), "--quiet", "--executor", "tuner.studies._from_misses:run_decorated"]
    assert cli(run) == 0, capsys.readouterr().err
    shipped = tmp_path / "shipped.json"
    assert cli(["study", "export", str(study), "--out", str(shipped)]) == 0
    entries = json.loads(shipped.read_text(encoding="utf-8"))["entries"]
    assert sorted((e["key"]["n"], e["key"]["dtype"], e["key"]["off"]) for e in entries) == [
        (7, "float64", 1),
        (100, "float16", 0),
        (100, "float32", -3),
    ]
    assert all("factory" not in e["key"] and e["config"] == {"block": 64} for e in entries)
    # the report counts the trials the decorator kept in each task's Optuna study
    md = (tmp_path / "out" / "report" / "report.md").read_text(encoding="utf-8")
    assert "| done | 4/4 |" in md, md
    assert "n/a (no FLOP/byte counts: not a registered kernel)" in md  # (was: a cut "unknown kernel" list)
    # run_decorated keeps the measurements in the function's own store, by design: the study database
    # holds the trials only. The report used to flag every such task ("Store check: the trials and the
    # stored measurements of 3 task(s) disagree", blaming "an older tuner"), a false alarm on every run.
    assert "Store check" not in md, md

    # production elsewhere (a fresh home, nothing tuned there) with the shipped file: exact hits
    from tuner.runtime._misses import recorder

    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "prod"))
    monkeypatch.setenv("TUNER_CACHE_FILE", str(shipped))
    recorder().reset()
    keyed.op.tuner.cache_clear()
    for args in _keyed_calls(keyed):
        assert keyed.op.explain(*args).startswith("hit ("), keyed.op.explain(*args)
        assert keyed.op(*args) == 64
        assert keyed.op.tuner.last_choice["why"] == f"exact entry in {shipped}"
    assert recorder().flush() == 0  # nothing missed, nothing recorded


def test_decorated_task_keeps_its_trials_and_resumes(keyed: Any, tmp_path: Path) -> None:
    """A worker that dies mid-task (here: its lease lost after 2 trials) leaves those trials in the
    task's Optuna study; the worker that takes the task over measures only the configs left."""
    from tuner.runtime import read_misses
    from tuner.studies import LeaseLost, load_study, task_trials
    from tuner.studies._from_misses import REMEASURE, decorated_study, render_study, run_decorated
    from tuner.studies._runner import _optuna_storage, prepare_study

    study = tmp_path / "s.toml"
    res = decorated_study(read_misses(), "keyed_user_mod:make_inputs", trials=5, strategy="random")
    render_study(res, study, check_kernels=False)
    spec = prepare_study(load_study(study, check_kernels=False))
    task = next(t for t in spec.tasks if '"n": 7' in t.problem["key"])
    seen: list[Any] = []

    def dies_after_two(trial: Any, *_: Any) -> None:
        seen.append(trial)
        if len(seen) == 2:
            raise LeaseLost("taken over")

    keyed.CALLS.clear()
    with pytest.raises(LeaseLost):
        run_decorated(task, callback=dies_after_two)
    first = {b for n, b in keyed.CALLS if n == 7}
    assert len(first) == 2
    assert len(task_trials(_optuna_storage(spec.storage), task.study_name)) == 2
    keyed.CALLS.clear()
    out = run_decorated(task, callback=lambda *a: None)
    calls = [b for n, b in keyed.CALLS if n == 7]
    again, after = calls[:3], calls[3:]  # the search's timed calls; then the real call, the re-timings
    assert not first & set(again), (first, again)
    assert after == [64] * (1 + REMEASURE), after
    assert len(task_trials(_optuna_storage(spec.storage), task.study_name)) == 5
    assert out.best_config == {"block": 64} and out.unit == "s" and out.cache_key["key"]["n"] == 7


def test_from_misses_bad_input_with_a_factory_exits_2(
    keyed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input is refused before anything is written (was: a study whose every task failed for a
    factory that cannot be loaded, --device silently ignored, a traceback line for --out a folder)."""
    out = tmp_path / "s.toml"
    for factory, why in (
        ("no_such_module_xyz:make", "cannot load the input factory 'no_such_module_xyz:make'"),
        ("keyed_user_mod:nope", "cannot load the input factory 'keyed_user_mod:nope'"),
        ("keyed_user_mod:CALLS", "is not callable"),
    ):
        assert cli(["study", "from-misses", "--factory", factory, "--out", str(out)]) == 2
        assert why in capsys.readouterr().err
    fac = ["--factory", "keyed_user_mod:make_inputs"]
    assert cli(["study", "from-misses", *fac, "--device", "sm90", "--out", str(out)]) == 2
    assert "--device does not apply with --factory" in capsys.readouterr().err
    assert cli(["study", "from-misses", *fac, "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder" in capsys.readouterr().err
    assert not out.exists()
    # without --factory: the decorated functions' misses are named, and so is the option that tunes them
    assert cli(["study", "from-misses", "--out", str(out)]) == 2
    assert "give --factory MODULE:FUNCTION" in capsys.readouterr().err
    # a missing parent folder is created, as `tuner study export` does
    deep = tmp_path / "a" / "b" / "s.toml"
    assert cli(["study", "from-misses", *fac, "--out", str(deep)]) == 0 and deep.is_file()
    capsys.readouterr()
    # running it without the decorated executor names the executor
    assert cli(["study", "run", str(deep), "--quiet"]) == 2
    assert "--executor tuner.studies._from_misses:run_decorated" in capsys.readouterr().err


def _rebuilt_factory_probe(kernel: str, fields: Any, dtypes: Any) -> Any:
    return None


def _rewrite_user_module(m: Any, old: str, new: str) -> None:
    """Edit the user module's source (a rename, a bug) as a later deployment would; the next import
    (a worker's, or the next `tuner study run`) sees the new source."""
    path = Path(m.__file__)
    path.write_text(path.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    sys.modules.pop(m.__name__, None)


def test_a_task_whose_factory_cannot_be_rebuilt_is_refused_and_not_retried(
    keyed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study whose task names an input factory that a worker cannot rebuild (here: renamed since the
    study was written) is refused by `tuner study run` with one line naming the task and why, before
    anything runs (was: every task claimed, run and failed late); `--retry-failed` does not put such a
    task back to fail again, and says so."""
    from tuner.studies import FAILED, load_study
    from tuner.studies._runner import study_rows

    study = tmp_path / "s.toml"
    fac = ["--factory", "keyed_user_mod:make_inputs", "--strategy", "random", "--trials", "2"]
    assert cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    run += ["--executor", "tuner.studies._from_misses:run_decorated"]
    # a factory that loads but whose calls fail: the tasks fail when they run
    _rewrite_user_module(keyed, 'assert kernel == "keyed_op"', 'assert kernel == "renamed_op"')
    assert cli(run) == 1
    capsys.readouterr()
    spec = load_study(study, check_kernels=False)
    assert {r.status for r in study_rows(spec)} == {FAILED}
    before = {r.key: r.error for r in study_rows(spec)}
    # then the factory is renamed: no worker can rebuild it; the run and the retry are refused
    _rewrite_user_module(keyed, "def make_inputs(", "def build_inputs(")
    for extra in ([], ["--retry-failed"]):
        assert cli(run + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "task keyed_op/" in err and "can never run" in err, err
        assert "cannot load the input factory 'keyed_user_mod:make_inputs'" in err, err
        assert "nothing was run or retried" in err, err
        assert {r.key: r.error for r in study_rows(spec)} == before  # not put back, not run again


def test_a_factory_given_as_a_function_must_be_importable_by_name(keyed: Any) -> None:
    """`decorated_study` takes the factory as a function too, recorded as module:qualname; one that a
    worker could not rebuild by that name is refused at once, saying why."""
    from tuner.errors import BadInput
    from tuner.runtime import read_misses
    from tuner.studies._from_misses import decorated_study

    rows = read_misses()
    res = decorated_study(rows, keyed.make_inputs, trials=2)
    assert 'factory = "keyed_user_mod:make_inputs"' in res.text

    def local_factory(kernel, fields, dtypes):
        return keyed.make_inputs(kernel, fields, dtypes)

    renamed = keyed.make_inputs
    keyed.make_inputs = lambda *a: renamed(*a)  # rebound since: the name now holds another function
    main_fn = _rebuilt_factory_probe
    main_fn.__module__, main_fn.__qualname__ = "__main__", "f"  # as if defined in the running script
    cases = [
        (lambda k, f, d: None, "is a lambda"),
        (local_factory, "is a function defined inside another function"),
        (renamed, "was renamed or rebound"),
        (main_fn, "__main__ of the program"),
    ]
    for factory, why in cases:
        with pytest.raises(BadInput, match=why) as exc:
            decorated_study(rows, factory, trials=2)
        assert "\n" not in str(exc.value)


def test_misses_of_a_function_of_the_main_script_are_refused_with_the_fix(
    misses: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A function decorated in the script that runs (`python app.py`) is recorded as `__main__.scale`.
    A study's worker imports it as `app.scale`, so no factory call has the recorded key: the study was
    written (exit 0), then every task failed at `study run` ("the factory's call has key app.scale ...,
    not the recorded __main__.scale"), and `--retry-failed`, which the run suggested, could not help.
    `from-misses --factory` now refuses it at once with the fix (a name=), writing nothing."""
    _log(misses, {("__main__.scale", 8, 0): 3})
    (tmp_path / "app_factory.py").write_text(
        "def make(kernel, fields, dtypes):\n    raise NotImplementedError\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "app.toml"
    args = ["study", "from-misses", "--factory", "app_factory:make", "--out", str(out)]
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'__main__.scale'" in err and "name=" in err, err
    assert not out.exists()
    # the other functions' misses can still be studied, leaving the script's out
    assert cli([*args, "--kernel", "mine.launch"]) == 0
    assert "__main__" not in out.read_text(encoding="utf-8").split("Misses of registered kernels")[0]


def test_two_services_in_one_misses_folder(misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`--kernel` repeats: the study of one service's functions leaves the other service's out."""
    _log(misses, {("other.svc_fn", 3, 0): 5})
    assert cli(["misses", "--kernel", "mine.launch", "--kernel", "other.svc_fn", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["kernel"] for r in rows) == ["mine.launch", "other.svc_fn"]
    out = tmp_path / "s.toml"
    args = ["study", "from-misses", "--kernel", "rmsnorm", "--kernel", "mine.launch", "--out", str(out)]
    assert cli(args) == 0
    text = out.read_text(encoding="utf-8")
    assert "mine.launch key" in text and "other.svc_fn" not in text


def test_a_factory_study_lists_the_registered_kernels_misses(
    misses: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A service with registered kernels and functions of its own: the `--factory` study tunes the
    functions and names the kernels' misses it leaves out (in its file and its line), as the study
    without `--factory` names the functions'. They were dropped without a word, and lost for good once
    `tuner misses --clear` ran after shipping its export."""
    (tmp_path / "svc_factory.py").write_text(
        "def make(kernel, fields, dtypes):\n    raise NotImplementedError\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "mine.toml"
    args = ["study", "from-misses", "--factory", "svc_factory:make", "--min-calls", "5", "--out", str(out)]
    assert cli(args) == 0
    msg = capsys.readouterr().out
    assert "1 tasks of mine.launch" in msg and "1 calls under --min-calls 5 left out" in msg, msg
    assert "2 misses of registered kernels listed as comments" in msg, msg
    text = out.read_text(encoding="utf-8")
    assert [t["kernel"] for t in tomllib.loads(text)["tasks"]] == ["mine.launch"]
    listed = [line for line in text.splitlines() if line.startswith("#   rmsnorm (triton) key")]
    assert len(listed) == 2 and "'M': 8," in listed[0] and listed[0].endswith(": 90 calls"), listed
    assert "'M': 16," in listed[1] and listed[1].endswith(": 10 calls"), listed


def _no_key_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(best_config={"block": 8}, best_value=1.0, unit="ms")  # no cache_key


def test_export_refuses_a_decorated_task_without_its_runtime_key(
    keyed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decorated function's task whose result holds no runtime key (an executor, or a tuner, that did
    not record it) is not exported under a made-up key that would never hit: nothing to export, exit 1."""
    study = tmp_path / "s.toml"
    fac = ["--factory", "keyed_user_mod:make_inputs", "--output", str(tmp_path / "out")]
    assert cli(["study", "from-misses", *fac, "--out", str(study)]) == 0
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    assert cli([*run, "--executor", "tests.test_from_misses:_no_key_executor"]) == 0
    capsys.readouterr()
    assert cli(["study", "export", str(study), "--out", str(tmp_path / "c.json")]) == 1
    assert "nothing to export" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def _shipped(tmp_path: Path) -> Path:
    study = tmp_path / "s.toml"
    fac = ["--factory", "keyed_user_mod:make_inputs", "--strategy", "random", "--trials", "4"]
    assert cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    assert cli([*run, "--executor", "tuner.studies._from_misses:run_decorated"]) == 0
    shipped = tmp_path / "shipped.json"
    assert cli(["study", "export", str(study), "--out", str(shipped)]) == 0
    return shipped


def test_regress_times_decorated_functions_with_the_factory(
    keyed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tuner regress --factory`: the entries of decorated functions are re-timed through the factory
    (was: exit 2, "unknown kernel", for every file a decorated function's study exports)."""
    shipped = _shipped(tmp_path)
    capsys.readouterr()
    assert cli(["regress", "--baseline", str(shipped)]) == 2
    assert "give --factory MODULE:FUNCTION" in capsys.readouterr().err
    args = ["regress", "--baseline", str(shipped), "--factory", "keyed_user_mod:make_inputs", "--json"]
    assert cli([*args, "--repeats", "4"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [c["verdict"] for c in checks] == ["unchanged"] * 3
    keyed.SLOWER[0] = 1.5
    try:
        assert cli([*args, "--repeats", "4"]) == 1
    finally:
        keyed.SLOWER[0] = 1.0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [c["verdict"] for c in checks] == ["regressed"] * 3
    assert all(abs(c["ratio"] - 1.5) < 1e-9 for c in checks)

    # bad entries are refused before anything is timed: a config outside the space, another key
    doc = json.loads(shipped.read_text(encoding="utf-8"))
    doc["entries"][0]["config"] = {"block": 4096}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    keyed.CALLS.clear()
    assert cli(["regress", "--baseline", str(bad), "--factory", "keyed_user_mod:make_inputs"]) == 2
    assert "is not in the function's search space" in capsys.readouterr().err and not keyed.CALLS
    doc["entries"][0]["config"] = {"block": 64}
    doc["entries"][0]["kernel"] = "other_op"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    assert cli(["regress", "--baseline", str(bad), "--factory", "keyed_user_mod:make_inputs"]) == 2
    assert (
        "(other_op): the factory 'keyed_user_mod:make_inputs' raised AssertionError"
        in capsys.readouterr().err
    )
    assert cli(["regress", "--baseline", str(bad), "--factory", "nope_mod:f"]) == 2


LUCKY_MODULE = """
import tuner
from tuner import PowerOfTwo, SearchSpace

SEEN = set()


def _bench(call):  # each config's first timing is a lucky 2x too fast; every later one is the truth
    block = call()
    t = 1e-3 * (1 + abs(block.bit_length() - 7))
    if block not in SEEN:
        SEEN.add(block)
        return t / 2
    return t


@tuner.autotune(SearchSpace([PowerOfTwo("block", 8, 128)]), key=["n"], name="lucky_op", bench=_bench)
def op(n, *, block):
    return block


def make_inputs(kernel, fields, dtypes):
    return op, (fields["n"],), {}
"""


def test_decorated_winner_is_re_timed_before_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exported time of a decorated function's winner is the median of its re-timings, not the
    search's best single timing (the least of several noisy ones: biased low, so that `tuner regress`
    later flagged an unchanged function as slower)."""
    from tuner.runtime._misses import recorder

    (tmp_path / "lucky_user_mod.py").write_text(LUCKY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    monkeypatch.delenv("TUNER_CACHE_FILE", raising=False)
    monkeypatch.setenv("TUNER_MODE", "record")
    recorder().reset()
    import lucky_user_mod as m

    m.op(1000)
    recorder().flush()
    study = tmp_path / "s.toml"
    fac = ["--factory", "lucky_user_mod:make_inputs", "--strategy", "random", "--trials", "5"]
    assert cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    assert cli([*run, "--executor", "tuner.studies._from_misses:run_decorated"]) == 0
    shipped = tmp_path / "c.json"
    assert cli(["study", "export", str(study), "--out", str(shipped)]) == 0
    (e,) = json.loads(shipped.read_text(encoding="utf-8"))["entries"]
    assert e["config"] == {"block": 64} and e["time_s"] == pytest.approx(1e-3)  # not the lucky 0.5e-3
    assert cli(["regress", "--baseline", str(shipped), "--factory", "lucky_user_mod:make_inputs"]) == 0
    sys.modules.pop("lucky_user_mod", None)


def test_a_study_served_by_a_shipped_file_says_so(
    keyed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study run where the shipped file already holds the keys tunes nothing; each task's error says
    which file served the call (was: "its store holds no entry for the key (storage=False?)")."""
    shipped = _shipped(tmp_path)
    monkeypatch.setenv("TUNER_MISSES_DIR", str(tmp_path / "home" / "misses"))
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "other"))  # a store that holds nothing
    monkeypatch.setenv("TUNER_CACHE_FILE", str(shipped))
    study = tmp_path / "again.toml"
    fac = ["--factory", "keyed_user_mod:make_inputs", "--output", str(tmp_path / "out2")]
    assert cli(["study", "from-misses", *fac, "--out", str(study)]) == 0
    capsys.readouterr()
    run = ["study", "run", str(study), "--quiet", "--no-report"]
    assert cli([*run, "--executor", "tuner.studies._from_misses:run_decorated"]) == 1
    assert f"nothing tuned: the call was served by an exact entry in {shipped}" in capsys.readouterr().err


@pytest.mark.postgres
def test_fleet_of_workers_on_postgres_exports_every_winner(
    keyed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two workers as two machines (each its own $TUNER_HOME, so each function store holds only the keys
    that worker tuned) share a study on PostgreSQL; `tuner study export` from the study database ships
    every winner, which `tuner cache export` on any one machine cannot."""
    import os
    import subprocess

    from tests.pg import fresh_database

    gen = fresh_database()
    url = next(gen)
    try:
        study = tmp_path / "s.toml"
        fac = ["--factory", "keyed_user_mod:make_inputs", "--strategy", "random", "--trials", "4"]
        assert (
            cli(["study", "from-misses", *fac, "--output", str(tmp_path / "out"), "--out", str(study)]) == 0
        )
        env = {**os.environ, "PYTHONPATH": repo_pythonpath(tmp_path), "TUNER_MODE": ""}
        cmd = [sys.executable, "-m", "tuner", "study", "run", str(study), "--storage", url, "--quiet"]
        cmd += ["--no-report", "--executor", "tuner.studies._from_misses:run_decorated"]
        procs = [
            subprocess.Popen(cmd, env={**env, "TUNER_HOME": str(tmp_path / f"machine{i}")}, cwd=tmp_path)
            for i in range(2)
        ]
        assert [p.wait(timeout=300) for p in procs] == [0, 0]
        shipped = tmp_path / "shipped.json"
        assert cli(["study", "export", str(study), "--storage", url, "--out", str(shipped)]) == 0
        keys = sorted(
            json.dumps(e["key"], sort_keys=True)
            for e in json.loads(shipped.read_text(encoding="utf-8"))["entries"]
        )
        assert len(keys) == 3
        per_machine = []
        for i in range(2):
            monkeypatch.setenv("TUNER_HOME", str(tmp_path / f"machine{i}"))
            out = tmp_path / f"m{i}.json"
            if cli(["cache", "export", "--out", str(out)]) == 0:
                per_machine += [
                    json.dumps(e["key"], sort_keys=True)
                    for e in json.loads(out.read_text(encoding="utf-8"))["entries"]
                ]
        assert sorted(per_machine) == keys  # each key tuned once, on one machine or the other
    finally:
        next(gen, None)


def test_a_short_kernel_name_names_the_recorded_ones(
    misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decorated function is recorded as module.qualname, so `--kernel launch` selects nothing: `tuner
    misses` said "no recorded misses" and `study from-misses` "no recorded miss", naming neither the
    recorded kernels nor the one meant. They now name them on stderr, as `cache show --kernel` does,
    similar names first; the exit codes and --json's stdout stay."""
    _log(misses, {("other.scale", 3, 0): 2})
    assert cli(["misses", "--kernel", "launch", "--json"]) == 0
    got = capsys.readouterr()
    assert got.out == "" and "hold no kernel 'launch'; did you mean mine.launch?" in got.err, got.err
    assert cli(["misses", "--kernel", "zzz"]) == 0
    err = capsys.readouterr().err
    assert "they hold mine.launch, other.scale, rmsnorm" in err, err
    assert cli(["misses", "--kernel", "mine.launch", "--kernel", "rmsnorm", "--json"]) == 0
    assert capsys.readouterr().err == ""  # names it holds: no warning
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--kernel", "scale", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "hold no kernel 'scale'; did you mean other.scale?" in err and not out.exists(), err


def test_what_kernel_and_min_calls_selected_is_said(
    misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tuner misses --kernel K` printed "N keys, M calls" as for every kernel, and "no recorded misses (run
    production with TUNER_MODE=record)" when the options selected none of the misses recorded; `study
    from-misses --kernel K` wrote a study whose first line left `--kernel` out and refused one with "2 misses
    recorded" (of K only). Each now says what was selected."""
    _log(misses, {("other.svc_fn", 3, 0): 5})
    assert cli(["misses", "--kernel", "rmsnorm", "--min-calls", "10"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1] == "2 keys, 100 calls of rmsnorm, called at least 10 times"
    )
    assert cli(["misses", "--kernel", "nosuch"]) == 0
    assert capsys.readouterr().out == "no recorded misses of nosuch (5 keys recorded in all)\n"
    assert cli(["misses", "--min-calls", "1000"]) == 0
    assert (
        capsys.readouterr().out == "no recorded misses called at least 1000 times (5 keys recorded in all)\n"
    )
    out = tmp_path / "s.toml"
    args = ["study", "from-misses", "--kernel", "rmsnorm", "--kernel", "mine.launch", "--min-calls", "5"]
    assert cli([*args, "--out", str(out)]) == 0
    first = out.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# Written by `tuner study from-misses --kernel rmsnorm --kernel mine.launch "), (
        first
    )
    assert (
        "other.svc_fn" not in out.read_text(encoding="utf-8")
        and "2 tasks of rmsnorm" in capsys.readouterr().out
    )
    assert cli(["study", "from-misses", "--kernel", "other.svc_fn", "--out", str(tmp_path / "o.toml")]) == 2
    assert "(1 misses of other.svc_fn recorded, 1 of them of decorated functions" in capsys.readouterr().err
