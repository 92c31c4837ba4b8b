"""Studies on one machine (SQLite): study files and their validation, run order, leases, kill-and-resume,
reports, cache export and `tuner regress`. The executor is the synthetic one of tests/_study_fake.py (real
`tuner.optimize`, real storage) unless the measurement layer and the kernels are importable."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._env import repo_pythonpath  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FAKE = "tests._study_fake:executor"
PY = sys.executable


def write_study(
    tmp: Path,
    *,
    name: str = "s",
    n_m: int = 2,
    n_k: int = 1,
    budget: int = 4,
    lease_seconds: float = 60,
    extra: str = "",
) -> Path:
    ms = [64 * 2**i for i in range(n_m)]
    ks = [32 * 2**i for i in range(n_k)]
    p = tmp / f"{name}.toml"
    p.write_text(
        f"""
[study]
name = "{name}"
device = "cpu"
budget = {{ trials = {budget} }}
strategy = "random"
seed = 3
output = "out-{name}"
lease_seconds = {lease_seconds}
{extra}

[[tasks]]
kernel = "fakemm"
grid = {{ M = {ms}, N = [64], K = {ks} }}
""",
        encoding="utf-8",
    )
    return p


def finished_configs(url: str, task: Any) -> list[dict[str, Any]]:
    from tuner.studies import task_trials
    from tuner.studies._runner import _optuna_storage

    return [dict(t.params) for t in task_trials(_optuna_storage(url), task.study_name)]


def cli(*args: str) -> int:
    from tuner.cli import main

    return main(list(args))


# ---- study files ---------------------------------------------------------------------------------------
def test_study_file_expands_and_orders_tasks(tmp_path: Path) -> None:
    from tuner.studies import load_study

    spec = load_study(write_study(tmp_path, n_m=3, n_k=2), check_kernels=False)
    assert spec.name == "s" and len(spec.tasks) == 6
    assert spec.storage == f"sqlite:///{(tmp_path / 'out-s' / 'study.db').resolve()}"
    assert [t.seq for t in spec.tasks] == list(range(6))
    # smallest first, then always the nearest neighbour: a chain, never a jump of two steps in M
    shapes = [(t.problem["M"], t.problem["K"]) for t in spec.tasks]
    assert shapes[0] == (64, 32)
    for (m1, k1), (m2, k2) in zip(shapes, shapes[1:], strict=False):
        assert abs(m1 - m2) + abs(k1 - k2) > 0
        assert max(m1, m2) / min(m1, m2) <= 2 and max(k1, k2) / min(k1, k2) <= 2
    assert all(t.problem["dtype"] == "float32" and t.budget == 4 for t in spec.tasks)


def test_order_groups_by_kernel_then_nearest_shape() -> None:
    from tuner.studies import StudyTask, order_tasks

    def t(kernel: str, m: int) -> StudyTask:
        return StudyTask(
            "s", f"{kernel}/{m}", kernel, {"M": m, "dtype": "float16"}, "triton", "cpu", 1, None, "random", 0
        )

    out = order_tasks([t("a", 4096), t("b", 64), t("a", 64), t("a", 1024), t("a", 128)])
    assert [x.key for x in out] == ["a/64", "a/128", "a/1024", "a/4096", "b/64"]


@pytest.mark.parametrize(
    "body, needle",
    [
        ("[study]\nname='x'\n", "missing budget"),
        ("[study]\nname='x'\nbudget={trials=2}\n", "missing [[tasks]]"),
        ("[study]\nname='x'\nbudget={trials=0}\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]", "budget.trials"),
        ("[study]\nname='x'\nbudget={}\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]", "trials and/or seconds"),
        (
            "[study]\nname='x'\nbudget=3\ndevise='cpu'\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]",
            "unknown key 'devise'",
        ),
        (
            "[study]\nname='x'\nbudget=3\ndevice='sm99'\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]",
            "unknown device",
        ),
        ("[study]\nname='x y'\nbudget=3\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]", "name must be"),
        (
            "[study]\nname='x'\nbudget=3\nstrategy='nope'\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]",
            "unknown strategy",
        ),
        ("[study]\nname='x'\nbudget=3\n[[tasks]]\nkernel='k'\nproblems=[{M=1},{M=1}]", "listed twice"),
        ("[study]\nname='x'\nbudget=3\n[[tasks]]\nkernel='k'\nproblems=[{M=-4}]", "must be >= 1"),
        ("[study]\nname='x'\nbudget=3\n[[tasks]]\nkernel='k'\n", "needs problems"),
        ("[study\nname='x'", "invalid TOML"),
        # numpy's and Optuna's samplers refuse a seed of 2**32 or more: it passed, and every task failed
        (
            "[study]\nname='x'\nbudget=3\nseed=4294967296\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]",
            "seed must be",
        ),
        (
            "[study]\nname='x'\nbudget=3\n[[tasks]]\nkernel='k'\nseed=99999999999\nproblems=[{M=1}]",
            "seed must be",
        ),
        # a typo in a [[tasks]] entry said only "tasks[0]: unknown key 'problem' (allowed: ...)"
        (
            "[study]\nname='x'\nbudget=3\n[[tasks]]\nkernel='k'\nproblem=[{M=1}]",
            "tasks[0]: unknown key 'problem' of the [[tasks]] table; did you mean 'problems'? (allowed: ",
        ),
        (
            "[study]\nname='x'\nbudget={trails=3}\n[[tasks]]\nkernel='k'\nproblems=[{M=1}]",
            "[study] budget: unknown key 'trails'; did you mean 'trials'?",
        ),
    ],
)
def test_bad_study_files_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, needle: str
) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(body, encoding="utf-8")
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err and str(p.name) in err, err
    assert not (tmp_path / "out-x").exists()


def test_a_relative_sqlite_storage_is_beside_the_study_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`storage = "sqlite:///runs/s.db"` names a file relative to the study file, as `output` is: it was
    relative to the folder each command ran in, so a worker or `export` started elsewhere made or missed
    another database (the report said the study never ran). `--storage` stays relative to the command's
    folder, as any path on a command line."""
    from tuner.studies import load_study

    (tmp_path / "studies").mkdir()
    p = write_study(tmp_path / "studies")
    p.write_text(
        p.read_text(encoding="utf-8").replace(
            "lease_seconds", 'storage = "sqlite:///runs/s.db?timeout=5"\nlease_seconds'
        ),
        encoding="utf-8",
    )
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir(), there.mkdir()
    db = tmp_path / "studies" / "runs" / "s.db"
    monkeypatch.chdir(here)
    assert load_study(p, check_kernels=False).storage == f"sqlite:///{db}?timeout=5"
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 0
    assert db.exists() and not (here / "runs").exists()
    monkeypatch.chdir(there)
    capsys.readouterr()
    assert cli("study", "export", str(p), "--out", "c.json", "--json") == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2
    assert not (there / "runs").exists()
    # the command line's own URL: relative to where the command runs
    spec = load_study(p, storage="sqlite:///mine.db", check_kernels=False)
    assert spec.storage == "sqlite:///mine.db"


@pytest.mark.parametrize("command", ["study export", "cache export", "study from-misses"])
def test_out_that_is_no_file_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """`--out` naming a device, a pipe or nothing: exit 2, one line, nothing replaced. The export renamed its
    new file over the path: a pipe (or, run as root, /dev/stdout or /dev/null) became a plain file, and an
    empty --out failed with 'Device or resource busy: .' (exit 1)."""
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = {
        "study export": ["study", "export", str(write_study(tmp_path))],
        "cache export": ["cache", "export", "--storage", f"sqlite:///{tmp_path / 'none.db'}"],
        "study from-misses": ["study", "from-misses", "--dir", str(tmp_path / "misses")],
    }[command]
    for out in (str(fifo), ""):
        capsys.readouterr()
        assert cli(*args, "--out", out) == 2, out
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and ("not a regular file" in err or "--out is empty" in err), err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "tuner_home") == ["pipe", "s.toml"]


def test_unknown_kernel_is_bad_input_with_the_real_registry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path)  # kernel "fakemm" is not registered
    assert cli("study", "run", str(p), "--quiet") == 2
    assert "unknown kernel 'fakemm'" in capsys.readouterr().err


# ---- the board -----------------------------------------------------------------------------------------
def test_leases_are_exclusive_expire_and_fence_the_old_holder(tmp_path: Path) -> None:
    from tuner.studies import DONE, PENDING, TaskBoard, load_study, prepare_study

    spec = prepare_study(load_study(write_study(tmp_path, n_m=2, budget=2), check_kernels=False))
    board = TaskBoard(spec.storage)
    a = board.claim(spec.name, "A", 1.0)
    b = board.claim(spec.name, "B", 1.0)
    assert a and b and a.task.key != b.task.key
    assert board.claim(spec.name, "C", 1.0) is None  # both held
    assert board.renew(a, 1.0)
    time.sleep(1.3)  # A and B stop renewing: their leases expire
    c = board.claim(spec.name, "C", 30)
    assert c is not None and c.task.key == a.task.key and c.attempts == 2  # first in run order
    assert not board.renew(a, 30)  # A was taken over: its writes are refused
    assert not board.finish(a, DONE)
    assert board.finish(c, PENDING)  # handed back (Ctrl-C)
    assert {r.key: r.status for r in board.rows(spec.name)}[a.task.key] == PENDING
    board.close()


def test_the_lease_is_renewed_while_the_task_is_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before its first trial a worker opens the store, marks a dead worker's trials abandoned and gathers
    the prior: seconds in a fresh process on a loaded machine, more on a big store. The heartbeat runs from
    the claim on, so a lease shorter than that is not lost. Was: the heartbeat started with the first
    trial, the lease had run out by then, and the task was taken over (here by the same worker, as a second
    attempt; under CI load, live workers of a 4-worker study lost their first tasks to each other)."""
    import tuner.studies._runner as runner
    from tuner.studies import DONE, TaskBoard, load_study, prepare_study, run_study

    lease_s = 3.0
    spec = prepare_study(load_study(write_study(tmp_path, n_m=1, budget=2), check_kernels=False))
    board = TaskBoard(spec.storage)
    real = runner.gather_prior
    waited: list[float] = []

    def slow_prior(storage: Any, rows: Any, task: Any) -> Any:
        if not waited:  # the first preparation outlasts the lease it was claimed with
            [row] = [r for r in board.rows(spec.name) if r.key == task.key]
            assert row.started_at is not None
            deadline = time.monotonic() + 60
            while board.now() <= row.started_at + lease_s + 0.2:
                assert time.monotonic() < deadline, "the database clock did not move"
                time.sleep(0.05)
            waited.append(board.now() - row.started_at)
        return real(storage, rows, task)

    monkeypatch.setattr(runner, "gather_prior", slow_prior)
    caplog.set_level(logging.INFO, logger="tuner.studies")
    summary = run_study(spec, executor=FAKE, lease_s=lease_s)
    assert waited and waited[0] > lease_s
    assert summary.complete and summary.counts[DONE] == 1, summary
    [row] = board.rows(spec.name)
    assert row.status == DONE and row.attempts == 1 and row.trials_done == 2, row
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_lease_is_renewed_until_the_finished_task_is_marked_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After its last trial a worker reads the task's trials back and notes the device and versions
    (which may import torch or triton) before it marks the task done. The heartbeat runs until then, so
    another worker that looks for work meanwhile finds none. Was: the heartbeat stopped with the last
    trial, the lease ran out, another worker took the finished task over (and finished it again with no
    new trial) and this one's finish found its lease gone."""
    import tuner.studies._runner as runner
    from tuner.studies import DONE, TaskBoard, load_study, prepare_study, run_study

    lease_s = 3.0
    spec = prepare_study(load_study(write_study(tmp_path, n_m=1, budget=2), check_kernels=False))
    board = TaskBoard(spec.storage)
    real = runner._environment
    other: list[Any] = []

    def slow_environment(task: Any) -> Any:
        if not other:  # the first time only (on the old code the task came round again)
            start = board.now()
            deadline = time.monotonic() + 60
            while board.now() <= start + lease_s + 0.5:  # past the lease of the last renewal before this
                assert time.monotonic() < deadline, "the database clock did not move"
                time.sleep(0.05)
            other.append(board.claim(spec.name, "another-worker:1", lease_s))  # a worker looking for work
        return real(task)

    monkeypatch.setattr(runner, "_environment", slow_environment)
    caplog.set_level(logging.INFO, logger="tuner.studies")
    summary = run_study(spec, executor=FAKE, lease_s=lease_s)
    assert other == [None], other
    assert summary.complete and summary.counts[DONE] == 1, summary
    [row] = board.rows(spec.name)
    assert row.status == DONE and row.attempts == 1 and row.trials_done == 2, row
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_renewal_that_waited_for_the_write_lock_runs_its_full_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal whose UPDATE waits for SQLite's write lock (a long write transaction of this process or
    another one; seconds on a loaded machine) writes a lease that runs from when it is written. Was: from
    the clock read before the wait, so that after a wait nearly as long as the lease the renewal wrote a
    lease that had run out already, the next renewal found it lost, and a live worker gave its task up
    (seen in CI with a 3 s lease: the same worker then claimed it again, attempt 2)."""
    import sqlite3
    import threading

    from tuner.storage import sqlite_path
    from tuner.studies import TaskBoard, load_study, prepare_study

    lease_s = 60.0
    spec = prepare_study(load_study(write_study(tmp_path, n_m=1, budget=2), check_kernels=False))
    board = TaskBoard(spec.storage)
    claim = board.claim(spec.name, "w:1", lease_s)
    assert claim is not None
    path = sqlite_path(spec.storage)
    assert path is not None
    writer = sqlite3.connect(path, isolation_level=None, timeout=60)
    writer.execute("BEGIN IMMEDIATE")  # holds the write lock until COMMIT below
    real_now = board._now
    began: list[float] = []

    def now(conn: Any) -> float:
        t = real_now(conn)
        began.append(t)
        return t

    monkeypatch.setattr(board, "_now", now)
    renewed: list[bool] = []
    renewal = threading.Thread(target=lambda: renewed.append(board.renew(claim, lease_s)))
    renewal.start()
    deadline = time.monotonic() + 60
    while not began or board.now() <= began[0] + 0.5:  # it read the clock, then waits for the lock
        assert time.monotonic() < deadline and renewal.is_alive(), (began, renewed)
        time.sleep(0.02)
    released = board.now()
    writer.execute("COMMIT")
    writer.close()
    renewal.join(60)
    assert renewed == [True]
    [row] = board.rows(spec.name)
    assert row.lease_expires_at is not None and row.lease_expires_at >= released + lease_s, (row, released)
    board.close()


def test_budget_increase_reopens_a_finished_task(tmp_path: Path) -> None:
    from tuner.studies import load_study, run_study

    p = write_study(tmp_path, n_m=1, budget=3)
    s1 = run_study(load_study(p, check_kernels=False), executor=FAKE)
    assert s1.counts["done"] == 1
    p.write_text(p.read_text(encoding="utf-8").replace("trials = 3", "trials = 5"), encoding="utf-8")
    spec = load_study(p, check_kernels=False)
    s2 = run_study(spec, executor=FAKE)
    assert s2.counts["done"] == 1
    assert len(finished_configs(spec.storage, spec.tasks[0])) == 5


# ---- kill and resume -----------------------------------------------------------------------------------
def _worker_cmd(path: Path, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "tuner.cli",
        "study",
        "run",
        str(path),
        "--executor",
        FAKE,
        "--quiet",
        "--no-report",
        *extra,
    ]


def test_interrupt_and_kill_then_resume_repeats_no_finished_trial(tmp_path: Path) -> None:
    from tuner.studies import DONE, PENDING, RUNNING, TaskBoard, load_study, run_study

    budget = 6
    path = write_study(tmp_path, n_m=3, budget=budget, lease_seconds=2)
    spec = load_study(path, check_kernels=False)
    log_file = tmp_path / "evals.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_TRIAL_SLEEP": "0.1",
        "FAKE_EVAL_LOG": str(log_file),
    }

    def run_until(trials: int, sig: int) -> tuple[int, list[Any]]:
        proc = subprocess.Popen(
            _worker_cmd(path), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, encoding="utf-8"
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log_file.exists() and len(log_file.read_text(encoding="utf-8").splitlines()) >= trials:
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        board = TaskBoard(spec.storage)
        rows = board.rows(spec.name)
        board.close()
        return proc.returncode, rows

    # Ctrl-C: exit 130 and the task goes back to the queue at once.
    code, rows = run_until(4, signal.SIGINT)
    assert code == 130
    assert all(r.status in (PENDING, DONE) for r in rows), [(r.key, r.status) for r in rows]
    # kill -9 in the middle of the second task: its lease stays until it expires.
    code, rows = run_until(budget + 3, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert any(r.status == RUNNING for r in rows)
    before = {t.key: finished_configs(spec.storage, t) for t in spec.tasks}
    assert sum(map(len, before.values())) >= budget + 1

    # The same command resumes (here in-process, after the dead worker's lease expired).
    os.environ["FAKE_EVAL_LOG"] = str(log_file)
    try:
        summary = run_study(spec, executor=FAKE)
    finally:
        del os.environ["FAKE_EVAL_LOG"]
    assert summary.counts == {"pending": 0, "running": 0, "done": 3, "failed": 0}
    evals = Counter()
    for line in log_file.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        evals[(d["task"], json.dumps(d["config"], sort_keys=True))] += 1
    for t in spec.tasks:
        after = [json.dumps(c, sort_keys=True) for c in finished_configs(spec.storage, t)]
        assert len(after) == budget == len(set(after)), t.key
        for c in before[t.key]:
            k = json.dumps(c, sort_keys=True)
            assert k in after  # nothing finished was lost
            assert evals[(t.key, k)] == 1  # ... nor measured again
    # At most the two trials in flight at the interrupt and the kill were evaluated twice.
    assert sum(n - 1 for n in evals.values() if n > 1) <= 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the lost interrupt itself
def test_an_interrupt_lost_in_a_finaliser_still_stops_the_worker(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised while Python runs a finaliser (here a __del__) is printed as "Exception
    ignored" and lost; once, a worker under Ctrl-C finished its study and exited 0. The worker must
    still stop at the next trial and hand its task back."""
    from tests import _study_fake
    from tuner.studies import DONE, PENDING, TaskBoard, load_study, run_study

    spec = load_study(write_study(tmp_path, n_m=2, budget=6), check_kernels=False)
    calls = {"n": 0}

    class SwallowsTheInterrupt:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # the handler runs here, inside __del__, and its exception is lost
                pass

    def executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
        def cb(*a: Any, **k: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                SwallowsTheInterrupt()
            if callback is not None:
                callback(*a, **k)

        return _study_fake.executor(task, prior=prior, callback=cb)

    with pytest.raises(KeyboardInterrupt):
        run_study(spec, executor=executor)
    assert calls["n"] == 2
    board = TaskBoard(spec.storage)
    rows = board.rows(spec.name)
    board.close()
    assert all(r.status in (PENDING, DONE) for r in rows) and any(r.status == PENDING for r in rows)


# ---- reduced quickstart --------------------------------------------------------------------------------
def _real_executor_available() -> bool:
    """Whether the quickstart's kernels can run here: the kernels extra (torch, triton) is installed."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("torch", "triton")):
        return False  # the kernel modules import them only when a kernel is set up
    try:
        from tuner.kernels import get_kernel

        import tuner.tune  # noqa: F401

        get_kernel("matmul")
        return True
    except Exception:  # noqa: BLE001
        return False


def test_reduced_quickstart_runs_reports_and_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tomllib

    from tuner.studies import load_study, parse_study

    doc = tomllib.loads((REPO / "studies" / "quickstart.toml").read_text(encoding="utf-8"))
    load_study(REPO / "studies" / "quickstart.toml", check_kernels=False)  # the shipped file is valid
    real = _real_executor_available()
    doc["study"]["budget"] = {"trials": 2, "seconds": 15}
    doc["study"]["finalists"] = 1
    doc["study"]["output"] = str(tmp_path / "qs")
    kept = {}
    for e in doc["tasks"]:  # the first problem of matmul and of the norm only
        if e["kernel"] in ("matmul", "rmsnorm") and e["kernel"] not in kept:
            e.pop("grid", None)
            e.pop("budget", None)
            e["problems"] = e["problems"][:1]
            kept[e["kernel"]] = e
    assert set(kept) == {"matmul", "rmsnorm"}
    doc["tasks"] = list(kept.values())
    reduced = tmp_path / "quickstart-reduced.toml"
    reduced.write_text(_toml(doc), encoding="utf-8")
    spec = parse_study(doc, path=reduced, check_kernels=real)
    args = ["study", "run", str(reduced), "--quiet"] + ([] if real else ["--executor", FAKE])
    assert cli(*args) == 0
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'qs' / 'report' / 'report.md'}" in out
    cache = json.loads((tmp_path / "qs" / "cache.json").read_text(encoding="utf-8"))
    assert cache["format"] == "tuner-cache" and cache["schema_version"] == 1
    assert sorted(e["kernel"] for e in cache["entries"]) == sorted(t.kernel for t in spec.tasks)
    md = (tmp_path / "qs" / "report" / "report.md").read_text(encoding="utf-8")
    for t in spec.tasks:
        assert t.key in md
    pngs = list((tmp_path / "qs" / "report" / "img").glob("*.png"))
    assert len(pngs) == len(spec.tasks)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def _toml(doc: dict[str, Any]) -> str:
    """Just enough TOML writing for the test's reduced study (tables, arrays of inline tables)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        raise TypeError(v)

    lines = ["[study]"] + [f"{k} = {val(v)}" for k, v in doc["study"].items()]
    for e in doc["tasks"]:
        lines += ["", "[[tasks]]"] + [f"{k} = {val(v)}" for k, v in e.items()]
    return "\n".join(lines) + "\n"


def test_workers_option_runs_local_worker_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.studies import TaskBoard, load_study

    monkeypatch.setenv("PYTHONPATH", repo_pythonpath())
    monkeypatch.chdir(REPO)
    p = write_study(tmp_path, n_m=4, budget=3)
    assert cli("study", "run", str(p), "--workers", "2", "--executor", FAKE, "--quiet") == 0
    spec = load_study(p, check_kernels=False)
    board = TaskBoard(spec.storage)
    rows = board.rows(spec.name)
    board.close()
    assert all(r.status == "done" for r in rows) and len(rows) == 4
    pids = {r.worker.split(":")[1] for r in rows if r.worker}
    assert str(os.getpid()) not in pids  # the tasks ran in the worker processes
    assert "cache: " in capsys.readouterr().out


# ---- report, export ------------------------------------------------------------------------------------
def test_report_and_export(tmp_path: Path) -> None:
    from tuner.studies import export_study, load_study, run_study, write_report

    p = write_study(tmp_path, n_m=2, budget=10, extra="")
    spec = load_study(p, check_kernels=False)
    run_study(spec, executor=FAKE)
    rep = write_report(spec, tmp_path / "rep")
    md = rep.markdown.read_text(encoding="utf-8")
    assert "| task | status | trials | best time | % of roofline | best config |" in md
    assert md.count("![convergence of") == 2 and len(rep.images) == 2
    assert "importance (fANOVA)" in md
    html = rep.html.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>") and "<img src='img/" in html
    # the synthetic objective fails (BLOCK_M=16, num_warps=8): counted by status where it was drawn
    fails = sum(
        1
        for t in spec.tasks
        for c in finished_configs(spec.storage, t)
        if c["BLOCK_M"] == 16 and c["num_warps"] == 8
    )
    assert ("| failed |" in md) == (fails > 0)
    a = export_study(spec, tmp_path / "a.json")
    export_study(spec, tmp_path / "b.json")
    assert a.entries == 2
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()  # deterministic
    doc = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))
    e = doc["entries"][0]
    assert set(e) >= {
        "kernel",
        "source_hash",
        "key",
        "dtypes",
        "device",
        "versions",
        "config",
        "time_s",
        "spread_s",
        "date",
    }
    assert e["device"] == "cpu" and e["dtypes"] == ["float32"] and e["time_s"] > 0


def test_report_importance_needs_enough_trials(tmp_path: Path) -> None:
    from tuner.studies import load_study, run_study, write_report

    spec = load_study(write_study(tmp_path, n_m=1, budget=5), check_kernels=False)
    run_study(spec, executor=FAKE)
    md = write_report(spec, tmp_path / "rep").markdown.read_text(encoding="utf-8")
    assert "Parameter importance: needs at least 8 successful trials" in md


# ---- regress -------------------------------------------------------------------------------------------
def _baseline(tmp_path: Path, *, spread: float = 0.0) -> Path:
    from tuner.studies._export import _write_builtin

    entries = [
        {
            "kernel": k,
            "source_hash": "ab" * 16,
            "key": {"M": 64},
            "dtypes": ["float16"],
            "device": "cpu",
            "versions": {"triton": "3.7.1"},
            "config": {"BLOCK": 32},
            "time_s": 1e-3,
            "spread_s": spread,
            "date": "2026-01-01T00:00:00Z",
            "space": "",
        }
        for k in ("mm", "norm")
    ]
    path = tmp_path / "base.json"
    _write_builtin(path, entries)
    return path


def test_regress_flags_a_slowdown_beyond_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _baseline(tmp_path)
    args = ["regress", "--baseline", str(base), "--measure", "tests._study_fake:measure", "--json"]
    monkeypatch.setenv("FAKE_SLOWDOWN", json.dumps({"norm": 1.02}))  # within the 5 % threshold
    assert cli(*args) == 0
    monkeypatch.setenv("FAKE_SLOWDOWN", json.dumps({"norm": 1.3}))
    capsys.readouterr()
    assert cli(*args) == 1
    out = json.loads(capsys.readouterr().out)
    verdicts = {c["kernel"]: c["verdict"] for c in out["checks"]}
    assert verdicts == {"mm": "unchanged", "norm": "regressed"}
    norm = next(c for c in out["checks"] if c["kernel"] == "norm")
    assert 1.05 < norm["ci_low"] <= norm["ratio"] <= norm["ci_high"]
    monkeypatch.setenv("FAKE_SLOWDOWN", json.dumps({"mm": 0.5}))
    assert cli(*args) == 0  # faster is not a regression


def test_regress_threshold_grows_with_recorded_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SLOWDOWN", json.dumps({"norm": 1.3}))
    base = _baseline(tmp_path, spread=0.5e-3)  # recorded spread 50 %: a 30 % change is noise
    assert cli("regress", "--baseline", str(base), "--measure", "tests._study_fake:measure") == 0


def test_regress_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"format": "tuner-cache", "schema_version": 1, "entries": [{"kernel": 1}]', encoding="utf-8"
    )
    assert cli("regress", "--baseline", str(bad)) == 2
    assert cli("regress", "--baseline", str(tmp_path / "missing.json")) == 2
    other = _baseline(tmp_path)
    doc = json.loads(other.read_text(encoding="utf-8"))
    for e in doc["entries"]:
        e["device"] = "NVIDIA H200 (sm90)"
    other.write_text(json.dumps(doc), encoding="utf-8")
    assert cli("regress", "--baseline", str(other), "--measure", "tests._study_fake:measure") == 2
    err = capsys.readouterr().err
    assert "recorded on this device" in err
    assert (
        cli("regress", "--baseline", str(other), "--measure", "tests._study_fake:measure", "--any-device")
        == 0
    )


def test_regress_failed_config_is_a_regression(tmp_path: Path) -> None:
    from tuner.studies._regress import check_entries, read_cache_entries

    def boom(entry: Any, repeats: int) -> list[float]:
        raise RuntimeError("compile error")

    checks = check_entries(read_cache_entries(_baseline(tmp_path)), measure=boom, device="cpu")
    assert [c.verdict for c in checks] == ["failed", "failed"]


def test_report_and_export_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_study(tmp_path, n_m=1, budget=3)
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 0
    assert not (tmp_path / "out-s" / "report").exists()
    assert cli("study", "report", str(p), "--out", str(tmp_path / "r")) == 0
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json")) == 0
    out = capsys.readouterr().out
    assert (
        f"report: {tmp_path / 'r' / 'report.md'}" in out and f"cache: {tmp_path / 'c.json'} (1 entries" in out
    )
    assert json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))["entries"][0]["kernel"] == "fakemm"


def test_driverless_postgres_urls_use_the_installed_driver() -> None:
    import importlib.util

    from tuner.studies._spec import normalize_url

    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"
    assert normalize_url("postgresql+psycopg2://u@h/d") == "postgresql+psycopg2://u@h/d"
    pg3 = importlib.util.find_spec("psycopg") is not None
    assert normalize_url("postgres://u@h/d") == (
        "postgresql://u@h/d" if pg3 else "postgresql+psycopg2://u@h/d"
    )


def failing_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    raise ModuleNotFoundError("No module named 'torch' (synthetic: a backend not installed)")


def test_a_failed_run_says_how_to_retry_and_that_command_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task that failed for a cause outside it (a backend not installed) stays failed when the study is
    run again (resuming does not retry it); the run says which command does, and that command works."""
    p = write_study(tmp_path, n_m=1, budget=3)
    broken = "tests.test_studies:failing_executor"
    assert cli("study", "run", str(p), "--executor", broken, "--quiet", "--no-report") == 1
    err = capsys.readouterr().err
    hint = [ln for ln in err.splitlines() if "--retry-failed" in ln]
    assert hint and f"tuner study run {p} --retry-failed" in hint[0], err
    # the cause fixed, a plain rerun still reports the failure; the hinted one tunes the task
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 1
    capsys.readouterr()
    assert cli("study", "run", str(p), "--retry-failed", "--executor", FAKE, "--quiet", "--no-report") == 0
    assert "--retry-failed" not in capsys.readouterr().err


def test_the_retry_hint_hides_the_storage_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_study(tmp_path, n_m=1, budget=3)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    shown = "postgresql://u:secret@127.0.0.1:1/none"
    from tuner.commands.study import _shown_url

    assert "secret" not in _shown_url(shown) and "u:***@127.0.0.1" in _shown_url(shown)
    args = ("study", "run", str(p), "--storage", url, "--executor", "tests.test_studies:failing_executor")
    assert cli(*args, "--json", "--no-report") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["retry"] == f"tuner study run {p} --retry-failed --storage {url}"


def test_a_password_given_as_a_query_parameter_is_hidden_too() -> None:
    """libpq and psycopg take a password as `?password=` as well; the retry hint, the report's "from"
    line and the runtime's messages hid only the URL's own password field (the report kept everything
    after the last '@'), so such a password was printed."""
    from tuner.commands.study import _shown_url
    from tuner.runtime._sources import _redact
    from tuner.storage import redact

    url = "postgresql://u:pw@127.0.0.1:5432/db?sslmode=require&password=SECRET&sslpassword=KEY"
    for shown in (_shown_url(url), redact(url), _redact(url)):
        assert "SECRET" not in shown and "KEY" not in shown and "pw" not in shown, shown
        assert "sslmode=require" in shown and "password=***" in shown and "127.0.0.1:5432/db" in shown
    assert redact("postgresql://h/db?password=a@b") == "postgresql://h/db?password=***"
    assert redact("sqlite:///runs/s.db") == "sqlite:///runs/s.db"


@pytest.mark.parametrize(
    "url",
    ["postgresql:/u:SECRET@h/db", "postgresql//u:SECRET@h/db", "u:SECRET@h/db", "postgresql:u:SECRET@h"],
)
def test_a_malformed_storage_url_is_echoed_with_its_password_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """A storage URL SQLAlchemy cannot parse was printed as typed, password and all, by `study run`
    ("storage must be a database URL ..., got '...'") and by `cache show` ("cannot open store ...")."""
    p = write_study(tmp_path, n_m=1, budget=3)
    assert cli("study", "run", str(p), "--storage", url, "--quiet", "--no-report") == 2
    err = capsys.readouterr().err
    assert "storage must be a database URL" in err and "SECRET" not in err and "***@h" in err, err
    assert cli("cache", "show", "--storage", url) == 2
    err = capsys.readouterr().err
    assert "cannot open store" in err and "SECRET" not in err and "***@h" in err, err
    from tuner.commands.study import _shown_url
    from tuner.storage import mask_password, redact

    for shown in (_shown_url(url), redact(url), mask_password(url)):
        assert "SECRET" not in shown and "***@h" in shown, shown
    # a SQLite path's '@' is no password: such a URL is shown whole
    assert redact("sqlite:////tmp/a@b/s.db") == "sqlite:////tmp/a@b/s.db"
    assert redact("postgresql://u:p/w@h/db") == "postgresql://h/db"


def _norm_study(tmp_path: Path) -> Path:
    """A study of registered kernels whose TOML leaves out a problem field the kernel has a default for
    (rmsnorm's eps); softmax has no such field."""
    p = tmp_path / "norms.toml"
    p.write_text(
        """
[study]
name = "norms"
device = "cpu"
budget = { trials = 3 }
strategy = "random"
output = "out-norms"

[[tasks]]
kernel = "rmsnorm"
problems = [{ M = 64, N = 128 }]

[[tasks]]
kernel = "softmax"
problems = [{ M = 64, N = 128 }]
""",
        encoding="utf-8",
    )
    return p


def test_export_and_report_find_tasks_whose_kernel_fills_default_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner fills rmsnorm's eps into the task (and its key); `study export` and `study report` load
    the file without kernel checks and used to look the task up without it: the task was left out of both,
    without a word."""
    from tuner.studies import load_study, run_study

    p = _norm_study(tmp_path)
    spec = load_study(p)  # as `tuner study run` loads it for the default executor
    assert {t.kernel: "eps" in t.problem for t in spec.tasks} == {"rmsnorm": True, "softmax": False}
    run_study(spec, executor=FAKE)
    assert [t.key for t in load_study(p, check_kernels=False).tasks] == [t.key for t in spec.tasks]
    assert cli("study", "export", str(p), "--out", str(tmp_path / "c.json")) == 0
    assert cli("study", "report", str(p), "--out", str(tmp_path / "r")) == 0
    entries = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))["entries"]
    assert sorted(e["kernel"] for e in entries) == ["rmsnorm", "softmax"]
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    for t in spec.tasks:
        assert f"`{t.key}` | done |" in md


def test_a_task_with_no_results_is_reported_not_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task the study file lists but the database holds nothing of (added after the run): the report
    lists it as having no results, and the export says it is not exported, instead of dropping it."""
    from tuner.studies import export_study, load_study, run_study, write_report

    p = write_study(tmp_path, n_m=1, budget=3)
    run_study(load_study(p, check_kernels=False), executor=FAKE)
    p.write_text(p.read_text(encoding="utf-8").replace("M = [64]", "M = [64, 256]"), encoding="utf-8")
    spec = load_study(p, check_kernels=False)
    new = next(t.key for t in spec.tasks if t.problem["M"] == 256)
    md = write_report(spec, tmp_path / "rep").markdown.read_text(encoding="utf-8")
    assert f"| `{new}` | no results | 0/3 |" in md
    assert "1 with no results in the database" in md and f"## {new}\n" in md
    with caplog.at_level(logging.WARNING, logger="tuner.studies._export"):
        assert export_study(spec, tmp_path / "c.json").entries == 1
    assert f"task {new} has no results in the study's database" in caplog.text


def test_a_kernel_module_that_cannot_be_imported_is_named_not_taken_for_an_unknown_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study loaded without kernel checks (`study export`, `study report`) fills a registered kernel's
    default problem fields. A kernel module whose import failed (a missing dependency) was taken for an
    unregistered kernel: rmsnorm's eps was left out of its task key, and the stored results were not
    found, without a word."""
    import tuner.kernels
    from tuner.kernels import _registry

    from tuner.studies import load_study

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "broken_dep.py").write_text("import tuner_no_such_dependency\n", encoding="utf-8")
    monkeypatch.setattr(tuner.kernels, "__path__", [*tuner.kernels.__path__, str(mods)])
    monkeypatch.setattr(_registry, "_loaded", False)
    with pytest.raises(
        ImportError, match=r"kernel module tuner\.kernels\.broken_dep cannot be imported"
    ) as e:
        load_study(_norm_study(tmp_path), check_kernels=False)
    assert "tuner_no_such_dependency" in str(e.value)


def test_a_kernel_module_that_cannot_be_imported_is_named_by_the_key_builders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kernel_cache_key` (what `study export` and `tuner.kernel` key an entry by), `kernel_source_hash`
    and from-misses' registered check took a registry that cannot be imported for an unregistered kernel,
    as `_filled` did: rmsnorm's key was built without its eps and with the hash of an unregistered name,
    a key no stored or exported entry has, without a word."""
    import tuner.kernels
    from tuner.kernels import _registry

    from tuner.runtime._kernel import kernel_cache_key, kernel_source_hash
    from tuner.studies._from_misses import _is_registered

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "broken_dep.py").write_text("import tuner_no_such_dependency\n", encoding="utf-8")
    monkeypatch.setattr(tuner.kernels, "__path__", [*tuner.kernels.__path__, str(mods)])
    monkeypatch.setattr(_registry, "_loaded", False)
    kernel_source_hash.cache_clear()  # an earlier test's hash of rmsnorm would not ask the registry
    named = r"kernel module tuner\.kernels\.broken_dep cannot be imported"
    try:
        with pytest.raises(ImportError, match=named):
            kernel_cache_key("rmsnorm", {"M": 64, "N": 128}, backend="triton", device="cpu", versions={})
        with pytest.raises(ImportError, match=named):
            kernel_source_hash("rmsnorm")
        with pytest.raises(ImportError, match=named):
            _is_registered("rmsnorm")
    finally:
        kernel_source_hash.cache_clear()
    monkeypatch.setattr(tuner.kernels, "__path__", [p for p in tuner.kernels.__path__ if p != str(mods)])
    assert _is_registered("rmsnorm") and not _is_registered("no_such_kernel_anywhere")


def test_a_kernel_module_that_fails_halfway_names_its_cause_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel module that registered a kernel before its import failed: the next look-up imported it
    again and failed on "kernel ... is registered twice", which hid the missing dependency from then on
    (a notebook's second try, a later command of the same process)."""
    import tuner.kernels
    from tuner.kernels import _registry, get_kernel

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "half_registered.py").write_text(
        "import dataclasses\n"
        "from tuner.kernels._registry import REGISTRY, register\n"
        "register(dataclasses.replace(REGISTRY['softmax'], name='half_registered_kernel'))\n"
        "import tuner_no_such_dependency\n",
        encoding="utf-8",
    )
    get_kernel("softmax")  # the shipped modules are imported
    monkeypatch.setattr(tuner.kernels, "__path__", [*tuner.kernels.__path__, str(mods)])
    monkeypatch.setattr(_registry, "_loaded", False)
    monkeypatch.setattr(_registry, "REGISTRY", dict(_registry.REGISTRY))
    for _ in range(2):
        with pytest.raises(ImportError, match="half_registered cannot be imported") as e:
            get_kernel("softmax")
        assert "tuner_no_such_dependency" in str(e.value)
    assert "half_registered_kernel" not in _registry.REGISTRY


def test_a_task_measured_on_one_device_is_not_resumed_on_another(tmp_path: Path, capsys) -> None:
    """A fleet of two kinds of GPU on one study (device "auto"), or a study file whose device was edited:
    a task's trials from one device must not mix with another's, so the run is refused (exit 2, one
    line, the board unchanged) instead of continuing the task on the other device."""
    from tuner.studies import load_study
    from tuner.studies._board import TaskBoard

    p = write_study(tmp_path, n_m=2, budget=3)
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 0
    spec = load_study(p, check_kernels=False)

    def board_rows() -> list[tuple[Any, ...]]:
        board = TaskBoard(spec.storage)
        try:
            return [(r.key, r.status, r.trials_done, r.task.device, r.task.budget) for r in board.rows("s")]
        finally:
            board.close()

    before = board_rows()
    assert {r[3] for r in before} == {"cpu"} and all(r[2] == 3 for r in before)
    p.write_text(
        p.read_text(encoding="utf-8")
        .replace('device = "cpu"', 'device = "sm80"')
        .replace("trials = 3", "trials = 5"),
        encoding="utf-8",
    )
    capsys.readouterr()
    assert cli("study", "run", str(p), "--executor", FAKE, "--quiet", "--no-report") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "measured on device cpu" in err and "sm80" in err, err
    assert board_rows() == before


def test_a_worker_does_not_run_a_task_another_kind_of_device_registered(tmp_path: Path) -> None:
    """Two machines of different kinds register the same new study at once: the tasks carry the device of
    whichever registered last. A worker of the other kind that claims one hands it back untouched and
    stops with the reason, rather than measuring it on its own device under the other's description."""
    from dataclasses import replace

    from tuner.studies import load_study
    from tuner.studies._board import PENDING, TaskBoard
    from tuner.studies._runner import _run_prepared, prepare_study
    from tuner.studies._spec import StudyError

    spec = prepare_study(load_study(write_study(tmp_path, n_m=2, budget=3), check_kernels=False))
    board = TaskBoard(spec.storage)
    try:
        board.ensure([replace(t, device="sm80") for t in spec.tasks])  # the other machine, nothing run yet
    finally:
        board.close()
    with pytest.raises(StudyError, match="measured on device sm80, and this run is for cpu"):
        _run_prepared(spec, 1, FAKE, False, None)
    board = TaskBoard(spec.storage)
    try:
        rows = board.rows("s")
    finally:
        board.close()
    assert [(r.status, r.trials_done, r.task.device) for r in rows] == [(PENDING, 0, "sm80")] * 2
