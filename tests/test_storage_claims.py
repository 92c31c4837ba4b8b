"""Issue 14 item 5: a runtime claim belongs to a live owner (host, pid, heartbeat). A claim whose process
died on this host is taken over at once (not after its lease), a caller that waits says what for, and
SIGTERM / SIGHUP hand a study task back as SIGINT does."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pg import fresh_database
from tests.test_studies import REPO, _worker_cmd, write_study

HOLDER = """
import sys, time
from tuner.runtime._db import ConfigCache, owner_id
cache = ConfigCache(sys.argv[1])
assert cache.claim(sys.argv[2], owner_id(), 600.0)
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def pg_url():
    yield from fresh_database()


def _hold(url: str, key_hash: str) -> subprocess.Popen:
    """A process that claims `key_hash` with a 600 s lease and then hangs (until it is killed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, key_hash],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_claim_of_a_dead_process_is_taken_over_at_once(db: str, tmp_path: Path, request: Any) -> None:
    from tuner.runtime._db import HOST, ConfigCache, owner_id

    url = f"sqlite:///{tmp_path / 'c.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    cache = ConfigCache(url)
    h = "a" * 32
    p = _hold(url, h)
    try:
        holder = cache.holder(h)
        assert holder is not None and (holder.host, holder.pid) == (HOST, p.pid)
        assert holder.expires_in_s > 500 and not holder.dead
        assert f"process {HOST}:{p.pid}" in holder.describe()
        assert not cache.claim(h, owner_id(), 600.0)  # alive: the claim stands
    finally:
        p.kill()
        p.wait()
    assert cache.holder(h).dead
    assert cache.claim(h, owner_id(), 600.0)  # gone: taken over, 600 s before the lease ends
    assert cache.holder(h).pid == os.getpid()


def test_claim_of_another_host_waits_for_its_lease(tmp_path: Path) -> None:
    """A pid on another host cannot be checked from here: only its lease (or its release) frees it."""
    from sqlalchemy import update

    from tuner.runtime._db import CacheClaimRow, ConfigCache, owner_id

    cache = ConfigCache(f"sqlite:///{tmp_path / 'c.db'}")
    h = "b" * 32
    assert cache.claim(h, "elsewhere:1:x:1", 600.0)
    with cache.store.session() as s:
        s.execute(update(CacheClaimRow).values(host="some-other-host", pid=1))
    assert not cache.holder(h).dead
    assert not cache.claim(h, owner_id(), 600.0)
    with cache.store.session() as s:
        s.execute(update(CacheClaimRow).values(expires_at=time.time() - 1))
    assert cache.claim(h, owner_id(), 600.0)


def test_waiting_caller_logs_its_holder_and_takes_over_when_it_dies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import tuner
    from tuner import PowerOfTwo, SearchSpace

    url = f"sqlite:///{tmp_path / 'w.db'}"

    @tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 64)]),
        key=["n"],
        budget=2,
        storage=url,
        bench=lambda call: call(),
        name="claimed_kernel",
        lease_s=600.0,
    )
    def kernel(n, *, block):  # noqa: ANN001, ANN202
        return 1e-3 * block

    ck = kernel.tuner.full_key((7,), {})
    p = _hold(url, ck.hash)
    out: list[Any] = []
    caplog.set_level(logging.WARNING, logger="tuner")
    t = threading.Thread(target=lambda: out.append(kernel(7)), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while "waiting for process" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"{ck.fields_dict}: waiting for process " in caplog.text
        assert f":{p.pid}, last heartbeat" in caplog.text and "lease expires in" in caplog.text
        assert t.is_alive() and kernel.tuner.stats["tuned"] == 0  # it waits (the lease has ~600 s left)
    finally:
        p.kill()
        p.wait()
    t.join(timeout=120)  # far less than the 600 s lease: the dead owner's claim is taken over
    assert not t.is_alive()
    assert out == [1e-3 * 16] and kernel.tuner.stats["tuned"] == 1
    assert "is gone; taking it over" in caplog.text


def _worker_after_trials(
    tmp_path: Path, path: Path, sleep: str, trials: int, **popen: Any
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`tuner study run` on `path` (the fake executor, each trial `sleep` s) once it finished `trials`
    trials, and its environment."""
    log_file = tmp_path / "evals.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_TRIAL_SLEEP": sleep,
        "FAKE_EVAL_LOG": str(log_file),
    }
    proc = subprocess.Popen(_worker_cmd(path), cwd=REPO, env=env, text=True, **popen)
    deadline = time.monotonic() + 60
    while not (log_file.exists() and len(log_file.read_text(encoding="utf-8").splitlines()) >= trials):
        if not (time.monotonic() < deadline and proc.poll() is None):
            proc.kill()
            proc.communicate()
            pytest.fail("the worker never ran a trial")
        time.sleep(0.05)
    return proc, env


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_hand_the_study_task_back(sig: int, tmp_path: Path) -> None:
    from tuner.studies import DONE, PENDING, RUNNING, TaskBoard, load_study

    path = write_study(tmp_path, n_m=2, budget=40, lease_seconds=600)
    spec = load_study(path, check_kernels=False)
    proc, _env = _worker_after_trials(tmp_path, path, "0.1", 3, stderr=subprocess.PIPE)
    try:
        board = TaskBoard(spec.storage)
        assert any(r.status == RUNNING for r in board.rows(spec.name))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    rows = board.rows(spec.name)
    assert all(r.status in (PENDING, DONE) for r in rows), [(r.key, r.status) for r in rows]
    assert any(r.status == PENDING and r.attempts == 1 and r.worker is None for r in rows)
    assert f"received {signal.Signals(sig).name}: handing the task back" in err


def _ignore_sighup() -> None:
    """A `preexec_fn`: SIGHUP ignored, as `nohup` starts a command."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_a_worker_started_by_nohup_goes_on_after_sighup(tmp_path: Path) -> None:
    """`nohup tuner study run ... &`: SIGHUP (the terminal closed, its shell passing it on to its jobs) is
    ignored, as the user asked. Was: the worker put its own handler over the ignored SIGHUP, handed its task
    back and exited 130."""
    from tuner.studies import DONE, TaskBoard, load_study

    path = write_study(tmp_path, n_m=1, budget=6, lease_seconds=600)
    spec = load_study(path, check_kernels=False)
    proc, _env = _worker_after_trials(
        tmp_path, path, "0.2", 2, stderr=subprocess.PIPE, preexec_fn=_ignore_sighup
    )
    try:
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "received SIGHUP" not in err, err[-2000:]
    board = TaskBoard(spec.storage)
    try:
        assert [r.status for r in board.rows(spec.name)] == [DONE]
    finally:
        board.close()


@pytest.mark.slow
def test_study_task_of_a_killed_worker_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    from tuner.studies import DONE, RUNNING, TaskBoard, load_study

    path = write_study(tmp_path, n_m=2, budget=4, lease_seconds=600)
    spec = load_study(path, check_kernels=False)
    proc, env = _worker_after_trials(tmp_path, path, "0.2", 2, stderr=subprocess.DEVNULL)
    proc.kill()
    proc.wait()
    board = TaskBoard(spec.storage)
    held = [r for r in board.rows(spec.name) if r.status == RUNNING]
    assert len(held) == 1 and held[0].lease_expires_at is not None
    # the lease has ~600 s left; a new worker on this host takes the task over at once
    env.pop("FAKE_TRIAL_SLEEP")
    second = subprocess.run(
        _worker_cmd(path), cwd=REPO, env=env, capture_output=True, text=True, timeout=180, encoding="utf-8"
    )
    assert second.returncode == 0, second.stderr[-2000:]
    rows = {r.key: r for r in board.rows(spec.name)}
    assert all(r.status == DONE for r in rows.values())
    assert rows[held[0].key].attempts == 2
    assert "its worker's process is gone" in second.stderr


def test_a_task_handed_back_is_resumed_not_reported_as_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task its worker handed back (Ctrl-C, a full disk) or `--retry-failed` put back is claimed again
    without a "took over" warning: nobody held it. A lease that ran out is still reported as taken over."""
    from tuner.studies import PENDING, TaskBoard, load_study

    spec = load_study(write_study(tmp_path, name="handback", n_m=1, n_k=1, budget=2), check_kernels=False)
    (tmp_path / "out-handback").mkdir(exist_ok=True)
    board = TaskBoard(spec.storage)
    board.ensure(spec.tasks)
    first = board.claim(spec.name, "w1", lease_s=60)
    assert first is not None and board.finish(first, PENDING)
    with caplog.at_level(logging.INFO, logger="tuner.studies._board"):
        again = board.claim(spec.name, "w2", lease_s=0.01)
    assert again is not None and again.attempts == 2
    assert "took over" not in caplog.text and "resumes task" in caplog.text
    time.sleep(0.05)  # w2's lease runs out
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tuner.studies._board"):
        third = board.claim(spec.name, "w3", lease_s=60)
    assert third is not None and "took over task" in caplog.text
    board.close()


def test_claim_of_a_killed_process_not_yet_reaped_is_taken_over_at_once(tmp_path: Path) -> None:
    """A rank killed while it tunes (SIGKILL, the OOM killer) stays a zombie until its parent waits for
    it: a `multiprocessing` parent joining its ranks in order, or torchrun's agent between two polls. Its
    pid still answers `kill(pid, 0)`; the claim used to count as live and the other ranks waited out the
    whole lease (120 s by default) for a tuning that was not running."""
    from tuner.runtime._db import ConfigCache, owner_id
    from tuner.storage._owner import pid_alive

    url = f"sqlite:///{tmp_path / 'c.db'}"
    cache = ConfigCache(url)
    h = "c" * 32
    p = _hold(url, h)
    try:
        assert pid_alive(p.pid) and not cache.holder(h).dead
        p.kill()
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # it has exited; not reaped (a zombie)
        assert not pid_alive(p.pid)
        assert cache.holder(h).dead
        assert cache.claim(h, owner_id(), 600.0)  # taken over, 600 s before the lease ends
    finally:
        p.kill()
        p.wait()
    assert cache.holder(h).pid == os.getpid()


NEIGHBOUR = """
import sys
from tuner.runtime._db import HOST, ConfigCache, owner_id
cache = ConfigCache(sys.argv[1])
holder = cache.holder(sys.argv[2])
print(HOST, holder.dead, cache.claim(sys.argv[2], owner_id(), 600.0))
"""


def test_a_container_that_shares_the_hostname_does_not_take_over_a_live_claim(tmp_path: Path) -> None:
    """Containers on one machine that share its hostname (Docker's `--network host`, the containers of a
    Kubernetes pod) and a `TUNER_HOME` each have their own process ids. A rank there read this process's
    pid in its own namespace, found no such process, took the live claim over ("its owner ... is gone")
    and tuned the key a second time, keeping its own winner: two ranks with two configs. The other
    namespace is another host to it now (the claim waits for its lease or its release)."""
    import shutil

    from tuner.runtime._db import HOST, ConfigCache, owner_id

    unshare = shutil.which("unshare")
    probe = [unshare, "-Urpf", "--mount-proc", "true"] if unshare else None
    if probe is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("needs unshare(1) with user and PID namespaces to start a process in another one")
    url = f"sqlite:///{tmp_path / 'c.db'}"
    cache = ConfigCache(url)
    h = "d" * 32
    assert cache.claim(h, owner_id(), 600.0)  # this process tunes the key
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [unshare, "-Urpf", "--mount-proc", sys.executable, "-c", NEIGHBOUR, url, h],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        encoding="utf-8",
    ).stdout.split()
    assert out[1:] == ["False", "False"]  # the live claim is not taken for dead, nor taken over
    assert out[0] != HOST and out[0].startswith(HOST.split("~")[0])  # same hostname, another namespace
    assert cache.holder(h).pid == os.getpid()
