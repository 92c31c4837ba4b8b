"""A study worker frozen (SIGSTOP) while it holds a task: another worker takes the task over once its
lease runs out and says whose it was (worker, host, process), how long its heartbeat was silent and which
trial it left in flight; the trial runs again there. Resumed (SIGCONT) after the takeover, the frozen
worker writes nothing more: no trial counted twice, no measurement behind the new holder, and it says
that it lost the task. Real worker processes, real signals, SQLite and PostgreSQL; leases of 2 s."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_studies import _worker_cmd, finished_configs, write_study
from tests.test_study_supervisor import _env, _holders

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX")]


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    from .pg import sqlite_or_postgres

    yield from sqlite_or_postgres(request.param, tmp_path / "study.db")


def _evals_of(tmp_path: Path, pid: int) -> int:
    log = tmp_path / "evals.jsonl"
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text(encoding="utf-8").splitlines() if json.loads(line)["pid"] == pid)


def test_a_frozen_worker_is_named_taken_over_and_writes_nothing_when_resumed(
    storage: str, tmp_path: Path
) -> None:
    from sqlalchemy import create_engine, text

    from tuner.storage._owner import HOST
    from tuner.studies import DONE, TaskBoard, load_study

    path = write_study(tmp_path, n_m=1, budget=4, lease_seconds=2)
    path.write_text(
        path.read_text(encoding="utf-8").replace("[study]\n", f'[study]\nstorage = "{storage}"\n', 1),
        encoding="utf-8",
    )
    spec = load_study(path, check_kernels=False)
    [task] = spec.tasks
    env = _env(tmp_path, FAKE_TRIAL_SLEEP="1.5")
    a_err, b_err = tmp_path / "a.err", tmp_path / "b.err"
    with a_err.open("w", encoding="utf-8") as err:
        a = subprocess.Popen(_worker_cmd(path), env=env, stdout=subprocess.DEVNULL, stderr=err)
    b: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while _evals_of(tmp_path, a.pid) < 1:  # A holds the task and finished a trial
            assert a.poll() is None, a_err.read_text(encoding="utf-8")
            assert time.monotonic() < deadline, a_err.read_text(encoding="utf-8")
            time.sleep(0.05)
        time.sleep(0.5)  # A is inside its next trial now
        os.kill(a.pid, signal.SIGSTOP)
        assert _holders(spec) == {a.pid: task.key}
        with b_err.open("w", encoding="utf-8") as err:
            b = subprocess.Popen(_worker_cmd(path), env=env, stdout=subprocess.DEVNULL, stderr=err)
        assert b.wait(timeout=120) == 0, b_err.read_text(encoding="utf-8")
    finally:
        os.kill(a.pid, signal.SIGCONT)
        if b is not None and b.poll() is None:
            b.kill()
    try:
        a.wait(timeout=60)  # it finds the task taken over, and no task left
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()

    said = b_err.read_text(encoding="utf-8")
    took = [x for x in said.splitlines() if "took over task" in x]
    assert len(took) == 1, said
    assert task.key in took[0] and f"(host {HOST}, process {a.pid})" in took[0], took
    assert "no heartbeat for" in took[0] and "lease ran out" in took[0], took
    abandoned = [x for x in said.splitlines() if "were marked abandoned" in x]
    assert len(abandoned) == 1 and f"process {a.pid})" in abandoned[0] and "trial " in abandoned[0], said
    assert "was taken over by another worker" in a_err.read_text(encoding="utf-8"), a_err.read_text(
        encoding="utf-8"
    )

    board = TaskBoard(spec.storage)
    try:
        [row] = board.rows(spec.name)
    finally:
        board.close()
    assert row.status == DONE and row.worker is not None and row.worker.split(":")[1] == str(b.pid)
    configs = finished_configs(spec.storage, task)
    assert len(configs) == 4  # the budget, counted once
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 4
    eng = create_engine(spec.storage)
    try:
        with eng.connect() as c:
            measured = c.execute(text("SELECT count(*) FROM tuner_measurements")).scalar()
    finally:
        eng.dispose()
    assert measured == 4  # one per counted trial: nothing of the frozen worker's behind the new holder


def test_a_task_of_a_worker_on_another_host_whose_heartbeat_stopped_is_taken_over(
    storage: str, tmp_path: Path
) -> None:
    """A worker that crashed on another host: its pid means nothing here, so its task is judged by its
    heartbeat alone (the lease it renews), and the worker that takes it over names it and its silence."""
    import subprocess as sp

    from sqlalchemy import update

    from tuner.storage._schema import tasks_table
    from tuner.studies import DONE, TaskBoard, load_study, prepare_study

    path = write_study(tmp_path, n_m=1, budget=2, lease_seconds=2)
    path.write_text(
        path.read_text(encoding="utf-8").replace("[study]\n", f'[study]\nstorage = "{storage}"\n', 1),
        encoding="utf-8",
    )
    spec = prepare_study(load_study(path, check_kernels=False))
    board = TaskBoard(spec.storage)
    try:
        with board.engine.begin() as conn:
            now = board._now(conn)
            conn.execute(
                update(tasks_table).values(
                    status="running",
                    worker="gpu-node-7:4242:abcdef",
                    lease_token="theirs",
                    lease_expires_at=now - 1,
                    heartbeat_at=now - 30,
                    attempts=1,
                    started_at=now - 60,
                )
            )
        p = sp.run(
            _worker_cmd(path),
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            encoding="utf-8",
        )
        assert p.returncode == 0, p.stderr
        [row] = board.rows(spec.name)
    finally:
        board.close()
    assert row.status == DONE
    took = [x for x in p.stderr.splitlines() if "took over task" in x]
    assert len(took) == 1, p.stderr
    assert "from worker gpu-node-7:4242:abcdef (host gpu-node-7, process 4242)" in took[0], took
    silent = re.search(r"no heartbeat for (\d+) s", took[0])
    assert silent is not None and int(silent.group(1)) >= 30, took
