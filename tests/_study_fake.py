"""A synthetic study executor for the tests: a deterministic function of the config and the problem,
tuned by the real `tuner.optimize` through the study's real storage (so resuming, leases and takeovers
are exercised for real, without kernels). Not a stand-in for any result: its values mean nothing.

Environment (so worker subprocesses can be steered): FAKE_TRIAL_SLEEP seconds per trial; FAKE_EVAL_LOG a
file that gets one JSON line per objective call (task key, config, pid), appended atomically;
FAKE_BROKEN=all fails every trial and FAKE_BROKEN=warps every config with num_warps 1 (as a backend that
is not installed would), read at each call, so a test can break and fix a study between runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from typing import Any

from tuner.search_spaces import Categorical, Constraint, PowerOfTwo, SearchSpace


def space_for(task: Any) -> SearchSpace:
    return SearchSpace(
        [
            PowerOfTwo("BLOCK_M", 16, 128),
            PowerOfTwo("BLOCK_N", 16, 128),
            Categorical("num_warps", [1, 2, 4, 8], ordered=True),
        ],
        [Constraint("tile", lambda c: c["BLOCK_M"] * c["BLOCK_N"] <= 8192, uses=("BLOCK_M", "BLOCK_N"))],
        name="fake",
    )


def objective_for(task: Any) -> Any:
    size = 1.0
    for _k, v in task.problem.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            size *= float(v)
    h = int(hashlib.sha256(task.key.encode()).hexdigest()[:8], 16)
    tm, tn = 16 * 2 ** (h % 4), 16 * 2 ** ((h // 4) % 3)
    flop_s = 1e9

    def objective(config: dict[str, Any]) -> float:
        once = os.environ.get("FAKE_HANG_ONCE")  # a path: the first trial to create it hangs for ever
        if once:
            try:
                os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                pass
            else:
                while True:
                    time.sleep(0.05)
        if os.environ.get("FAKE_TRIAL_SLEEP"):
            time.sleep(float(os.environ["FAKE_TRIAL_SLEEP"]))
        log = os.environ.get("FAKE_EVAL_LOG")
        if log:
            line = json.dumps({"task": task.key, "config": config, "pid": os.getpid()}, sort_keys=True) + "\n"
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        broken = os.environ.get("FAKE_BROKEN", "")
        if broken == "all" or (broken == "warps" and config["num_warps"] == 1):
            raise ModuleNotFoundError("No module named 'triton' (synthetic: FAKE_BROKEN)")
        if config["num_warps"] == 8 and config["BLOCK_M"] == 16:
            raise RuntimeError("out of resources (synthetic)")
        penalty = (
            math.log2(config["BLOCK_M"] / tm) ** 2
            + math.log2(config["BLOCK_N"] / tn) ** 2
            + 0.3 * abs(math.log2(config["num_warps"]) - 2)
        )
        return size / flop_s * (1.0 + penalty)

    return objective


def executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    from tuner import optimize
    from tuner.store import TaskContext

    return optimize(
        space_for(task),
        objective_for(task),
        budget=task.budget or 10_000,
        seed=task.seed,
        strategy=task.strategy,
        prior=prior or None,
        time_budget_s=task.time_budget_s,
        storage=task.storage,
        study_name=task.study_name,
        task=TaskContext(
            kernel=task.kernel, problem=dict(task.problem), device=task.device, dtype=task.dtype
        ),
        callback=callback,
    )


def crashing_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """`executor` whose run raises after the FAKE_CRASH_AFTER-th trial of the call (the measuring process
    died): the task fails with the trials finished before kept in its study."""
    after = int(os.environ.get("FAKE_CRASH_AFTER") or 0)
    seen = [0]

    def each(*args: Any, **kw: Any) -> None:
        if callback is not None:
            callback(*args, **kw)
        seen[0] += 1
        if after and seen[0] >= after:
            raise RuntimeError("the measuring process died (synthetic: FAKE_CRASH_AFTER)")

    return executor(task, prior=prior, callback=each)


def measure(entry: Any, repeats: int) -> list[float]:
    """A fake re-measurement for `tuner regress`: FAKE_SLOWDOWN maps a kernel name to a factor."""
    slow = json.loads(os.environ.get("FAKE_SLOWDOWN", "{}"))
    base = float(entry["time_s"])
    f = float(slow.get(entry["kernel"], 1.0))
    return [base * f * (1.0 + 0.01 * ((i * 7) % 5 - 2)) for i in range(repeats)]


def failing_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """Every trial raises (as every kernel trial does without the kernels extra): no winner."""
    import warnings

    from tuner import optimize

    def objective(config: dict[str, Any]) -> float:
        raise ModuleNotFoundError("No module named 'triton' (synthetic)")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimize(
            space_for(task),
            objective,
            budget=task.budget or 4,
            seed=task.seed,
            strategy=task.strategy,
            storage=task.storage,
            study_name=task.study_name,
            callback=callback,
        )


_trials_here = [0]


def deleting_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """`executor`, but after the FAKE_DELETE_AFTER-th trial this process finishes, the study's SQLite file
    is deleted with its `-wal` and `-shm` (`rm -rf` of the output folder, a cleanup script), or with
    FAKE_DELETE_HOW=move only the file is moved aside to `<file>.moved`."""
    from tuner.storage import sqlite_path

    after = int(os.environ["FAKE_DELETE_AFTER"])
    db = sqlite_path(task.storage)
    assert db is not None, task.storage

    def each(*args: Any, **kw: Any) -> None:
        _trials_here[0] += 1
        if _trials_here[0] == after:
            if os.environ.get("FAKE_DELETE_HOW") == "move":
                os.rename(db, db + ".moved")
            else:
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(db + suffix):
                        os.unlink(db + suffix)
        if callback is not None:
            callback(*args, **kw)

    return executor(task, prior=prior, callback=each)


def sigterm_in_commit_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """`executor` that sends this process SIGTERM from inside the store's SQLAlchemy commit (a commit
    event listener of the main thread) once FAKE_SIGTERM_AFTER trials have finished: the signal then comes
    while the main thread runs SQLAlchemy's commit of an Optuna session, as a kill may at any time."""
    import signal
    import sys
    import threading

    from sqlalchemy.engine import Engine

    after = int(os.environ.get("FAKE_SIGTERM_AFTER") or 2)
    done = [0]
    sent = [False]

    def in_optuna_storage() -> bool:  # a commit of Optuna's (a trial's), not of the task board
        frame = sys._getframe()
        while frame is not None:
            if str(frame.f_globals.get("__name__", "")).startswith("optuna.storages"):
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def on_commit(_conn: Any) -> None:
        if sent[0] or done[0] < after or threading.current_thread() is not threading.main_thread():
            return
        if not in_optuna_storage():
            return
        sent[0] = True
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # Python lines inside the commit, where the signal's handler runs
            pass

    def each(*args: Any, **kw: Any) -> None:
        done[0] += 1
        if callback is not None:
            callback(*args, **kw)

    return _listening(Engine, "commit", on_commit, lambda: executor(task, prior=prior, callback=each))


def limit_executor(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """`executor` that, once FAKE_LIMIT_AFTER trials of this process have finished, has the server refuse
    every new connection of the role FAKE_LIMIT_ROLE (its CONNECTION LIMIT set to 0 through
    FAKE_LIMIT_ADMIN, a superuser's URL, which no limit binds) and closes the idle connections of the
    pools of this process's engines, so its next statement needs a new connection: a pool that grows or
    renews a connection on a server whose limit other clients have reached."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import Connection, Engine

    after = int(os.environ["FAKE_LIMIT_AFTER"])
    engines: list[Engine] = []

    def seen(conn: Connection) -> None:
        if all(e is not conn.engine for e in engines):
            engines.append(conn.engine)

    def each(*args: Any, **kw: Any) -> None:
        _trials_here[0] += 1
        if _trials_here[0] == after:
            admin = create_engine(os.environ["FAKE_LIMIT_ADMIN"], isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'ALTER ROLE "{os.environ["FAKE_LIMIT_ROLE"]}" CONNECTION LIMIT 0'))
            admin.dispose()
            for engine in engines:
                engine.pool.dispose()  # closes the connections it holds idle; it makes new ones when asked
        if callback is not None:
            callback(*args, **kw)

    return _listening(Engine, "engine_connect", seen, lambda: executor(task, prior=prior, callback=each))


def _listening(target: Any, name: str, fn: Any, run: Any) -> Any:
    """`run()` with the SQLAlchemy event listener `fn` of `name` on `target` installed meanwhile."""
    from sqlalchemy import event

    event.listen(target, name, fn)
    try:
        return run()
    finally:
        event.remove(target, name, fn)
