"""An interrupt (SIGTERM, SIGHUP, Ctrl-C) at any point of a study worker hands its task back: also when it
comes while the main thread runs the store's database code, while the task is prepared, right after the
claim, or after the executor returned."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_interrupt_writes import write_locked
from tests.test_studies import REPO, _worker_cmd, write_study


def _sqlite_file(url: str) -> str:
    assert url.startswith("sqlite:///")
    return url[len("sqlite:///") :]


@pytest.mark.slow
def test_sigterm_inside_a_store_commit_hands_the_task_back_at_once(tmp_path: Path) -> None:
    """Raised inside SQLAlchemy's commit, the KeyboardInterrupt left the SQLite transaction open and the
    file write-locked by the worker itself: its hand-back waited out the busy timeout (60 s), retried
    and failed, and the task stayed running for its whole lease (seen in CI as a worker that did not
    exit within 60 s of SIGTERM)."""
    from tuner.studies import DONE, PENDING, TaskBoard, load_study

    path = write_study(tmp_path, n_m=1, budget=30, lease_seconds=600)
    spec = load_study(path, check_kernels=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_SIGTERM_AFTER": "3",
    }
    cmd = _worker_cmd(path)
    cmd[cmd.index("tests._study_fake:executor")] = "tests._study_fake:sigterm_in_commit_executor"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=45, encoding="utf-8"
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the worker did not exit within 45 s of SIGTERM; stderr: {exc.stderr!r}")
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "received SIGTERM: handing the task back" in proc.stderr
    assert "could not hand" not in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 40
    rows = TaskBoard(spec.storage).rows(spec.name)
    assert [(r.status, r.attempts, r.worker) for r in rows] == [(PENDING, 1, None)], rows
    assert not write_locked(Path(_sqlite_file(spec.storage)))
    # and the next run finishes the task, keeping the trials of the interrupted one
    env.pop("FAKE_SIGTERM_AFTER")
    again = subprocess.run(
        _worker_cmd(path), cwd=REPO, env=env, capture_output=True, text=True, timeout=120, encoding="utf-8"
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r.status for r in TaskBoard(spec.storage).rows(spec.name)] == [DONE]


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Make the worker's main thread get a KeyboardInterrupt at `where` (as a signal would)."""
    import tuner.studies._runner as runner
    from tuner.studies._board import TaskBoard

    def boom(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    if where == "after the claim":
        claim = TaskBoard.claim

        def claimed_then_interrupted(self: Any, *a: Any, **k: Any) -> Any:
            got = claim(self, *a, **k)
            if got is not None:
                raise KeyboardInterrupt
            return got

        monkeypatch.setattr(TaskBoard, "claim", claimed_then_interrupted)
    elif where == "while the task is prepared":
        monkeypatch.setattr(runner, "gather_prior", boom)
    elif where == "after the executor returned":
        monkeypatch.setattr(runner, "_environment", boom)
    else:  # pragma: no cover
        raise AssertionError(where)


@pytest.mark.parametrize(
    "where", ["after the claim", "while the task is prepared", "after the executor returned"]
)
def test_an_interrupt_anywhere_in_a_task_hands_it_back(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, only an interrupt inside the executor handed the task back: elsewhere it stayed running
    under this worker's name until its lease ran out (600 s here)."""
    from tests._study_fake import executor
    from tuner.studies import PENDING, TaskBoard, load_study
    from tuner.studies._runner import StudyWorker, prepare_study

    spec = prepare_study(
        load_study(write_study(tmp_path, n_m=1, budget=3, lease_seconds=600), check_kernels=False)
    )
    _interrupt_at(monkeypatch, where)
    worker = StudyWorker(spec, executor=executor)
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    rows = TaskBoard(spec.storage).rows(spec.name)
    assert [(r.status, r.worker) for r in rows] == [(PENDING, None)], [(r.status, r.worker) for r in rows]
    assert not write_locked(Path(_sqlite_file(spec.storage)))
