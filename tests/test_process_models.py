"""Tuned code inside the process models services and training jobs use (docs/production.md, "Processes,
threads and tracing"): fork after the store is open (gunicorn --preload), a fork while another thread
tunes, process pools that pickle the decorated objects, and torch's placeholder tensors and
torch.compile. Subprocess tests run with a timeout, so a hang fails instead of blocking."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import ConfigCache

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        encoding="utf-8",
    )


@pytest.fixture(params=["psycopg2", "psycopg"])  # tuner's driver, and psycopg 3
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.pg import fresh_database

    yield from fresh_database(request.param)


FORK_WRITERS = """
import os, sys
import tuner
from tuner import PowerOfTwo, SearchSpace

@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 64)]), key=["n"], budget=2, storage=sys.argv[1],
                bench=lambda call: (call(), 1e-3)[1], name="forked")
def f(n, *, block):
    return n * block

n = int(sys.argv[2])  # keys each process tunes
f(0)  # the parent tunes: its store is open, a connection sits in the pool
pid = os.fork()
for i in range(1, n):  # parent and child write at once, each its own keys
    f(2 * i + (pid == 0))
if pid == 0:
    os._exit(0 if f.tuner.stats["tuned"] == n else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "parent", f.tuner.stats["tuned"])
"""


def test_a_forked_child_does_not_share_the_parents_postgresql_connections(pg_url: str) -> None:
    # Old code: the child took the parent's pooled connection, the two processes read each other's
    # replies on one socket, and one of them hung for ever or failed on another query's rows. 16 keys a
    # process: with the child's new pool taken out (storage/_engine.py `_after_fork_in_child`), 12 and 16
    # keys failed every run (psycopg2: hung; psycopg: errors on stderr), as 40 did.
    out = _run(FORK_WRITERS, pg_url, "16")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["child", "0", "parent", "16"], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "cannot" not in out.stderr, out.stderr[-3000:]
    assert ConfigCache(pg_url).count("forked") == 31


def test_a_forked_child_of_a_sqlite_store_opens_its_own_connections(tmp_path: Path) -> None:
    out = _run(FORK_WRITERS, f"sqlite:///{tmp_path / 'fork.db'}", "40")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["child", "0", "parent", "40"], out.stderr[-3000:]
    assert ConfigCache(f"sqlite:///{tmp_path / 'fork.db'}").count("forked") == 79


FORK_WHILE_TUNING = """
import os, sys, threading, time
import tuner
from tuner import PowerOfTwo, SearchSpace

entered, go = threading.Event(), threading.Event()

def bench(call):
    entered.set()
    go.wait(60)  # the parent's tuning is inside its per-key lock when the process forks
    call()
    return 1e-3

@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 64)]), key=["n"], budget=2, storage=False, bench=bench)
def f(n, *, block):
    return n * block

th = threading.Thread(target=f, args=(7,))
th.start()
assert entered.wait(30)
pid = os.fork()
if pid == 0:
    go.set()  # the child's own bench must not wait
    os._exit(0 if f(7) in (7 * 16, 7 * 32, 7 * 64) else 3)
go.set()
th.join()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("child hung")
"""


def test_a_fork_while_another_thread_tunes_the_key_does_not_deadlock_the_child() -> None:
    # Old code: the child inherited the key's lock held by the parent's tuning thread, which does not
    # exist in the child: its first call of the key waited for ever.
    out = _run(FORK_WHILE_TUNING)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["child", "0"], out.stderr[-3000:]


SPAWN_POOL = """
import multiprocessing as mp
import sys

import tuner
from tuner import PowerOfTwo, SearchSpace


def helper(n):
    return n + 1


@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 64)]), key=["n"], budget=2, storage=sys.argv[1],
                bench=lambda call: (call(), 1e-3)[1])
def f(n, *, block):
    return helper(n) * block


def work(n):
    f(n)
    return f.tuner.name, f.tuner.stats["tuned"], f.tuner.stats["from_store"]


if __name__ == "__main__":
    f(5)
    with mp.get_context(sys.argv[2]).Pool(1) as pool:
        print(*pool.map(work, [5])[0])
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_spawned_child_finds_what_the_main_script_tuned(tmp_path: Path, method: str) -> None:
    # The child imports the main script as `__mp_main__`; old code named its functions after that, so
    # every pool of a script tuned its keys again, under another kernel name.
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent(SPAWN_POOL), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, str(script), f"sqlite:///{tmp_path / 'pool.db'}", method],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        encoding="utf-8",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["__main__.f", "0", "1"], out.stderr[-3000:]


# ---- pickling: process pools are given the decorated objects --------------------------------------------
@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 32)]), key=["n"], storage=False)
def scaled(n: int, *, block: int) -> int:
    return n * block


def test_decorated_objects_pickle_by_reference() -> None:
    import triton
    import triton.language as tl

    from tuner.runtime import _kernel

    assert pickle.loads(pickle.dumps(scaled)) is scaled

    # a kernel not reachable by its name cannot be pickled by reference: the error says why
    @tuner.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"], storage=False)
    @triton.jit
    def local_kernel(x_ptr, n, BLOCK: tl.constexpr):  # noqa: ANN001
        pass

    with pytest.raises(pickle.PicklingError, match="define the decorated kernel at module level"):
        pickle.dumps(local_kernel)
    # the same object bound at module level pickles by reference (old code: "Can't pickle <function
    # local_kernel>: it's not the same object as ...")
    mod = sys.modules[__name__]
    local_kernel.fn.fn.__qualname__ = "module_kernel"
    mod.module_kernel = local_kernel  # type: ignore[attr-defined]
    try:
        assert pickle.loads(pickle.dumps(local_kernel)) is local_kernel
    finally:
        del mod.module_kernel  # type: ignore[attr-defined]

    # a registered kernel's callable pickles as the call that made it (old code: "Can't pickle local
    # object '_kernel_autotuned.<locals>.launch'")
    k = tuner.kernel("rmsnorm", backend="triton", budget=3, mode="offline", storage=False)
    again = pickle.loads(pickle.dumps(k))
    assert isinstance(again, _kernel.TunedKernel) and again is not k
    assert (again.spec.name, again.backend, again.made_with) == ("rmsnorm", "triton", k.made_with)
    assert again.tuner.budget == 3 and again.tuner.mode == "offline"


# ---- torch: placeholder tensors and torch.compile -------------------------------------------------------
def test_fake_and_meta_tensors_are_never_timed_or_stored(_tuner_home: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[str] = []

    @tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 64)]), key=["n"], budget=3, name="fake_op")
    def op(x, n, *, block):  # noqa: ANN001, ANN202
        seen.append(type(x).__name__ if not x.is_meta else "meta")
        return x * 2

    with FakeTensorMode():
        assert op(torch.ones(16), 16).shape == (16,)
    assert op(torch.ones(32, device="meta"), 32).is_meta
    # Old code: both were timed (a no-op) and stored as the winners of n=16 and n=32 on "cpu".
    assert op.tuner.stats["tuned"] == 0
    assert "not timed: called with a meta tensor" in op.tuner.last_choice["why"]
    assert seen == ["FakeTensor", "meta"]  # each called once, untimed
    db = ConfigCache(f"sqlite:///{_tuner_home / 'tuner.db'}")
    assert db.count("fake_op") == 0
    # the first call with real tensors tunes the key, and that is what is stored
    op(torch.ones(16), 16)
    assert op.tuner.stats["tuned"] == 1 and db.count("fake_op") == 1


def test_a_first_call_inside_torch_compile_tunes_in_eager_mode(_tuner_home: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch._dynamo.utils import counters

    @tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 64)]), key=["n"], budget=3, name="compiled_op")
    def op(x, n, *, block):  # noqa: ANN001, ANN202
        return x * 2 + block * 0

    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda x: op(x, x.shape[0]) + 1, backend="eager")
    x = torch.arange(8.0)
    assert torch.equal(f(x), x * 2 + 1)
    assert op.tuner.stats["tuned"] == 1
    # Old code: Dynamo compiled the frames of the tuning, one graph per config timed.
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    assert torch.equal(f(x), x * 2 + 1)


# ---- interpreter exit while a daemon thread tunes -------------------------------------------------------
EXIT_WHILE_TUNING = """
import sys, threading, time
import tuner
from tuner import PowerOfTwo, SearchSpace

entered = threading.Event()

def bench(call):
    entered.set()
    time.sleep(0.05)
    call()
    return 1e-3

@tuner.autotune(SearchSpace([PowerOfTwo("block", 1, 1024)]), key=["n"], budget=200, storage=sys.argv[1],
                bench=bench, name="at_exit")
def f(n, *, block):
    return n * block

threading.Thread(target=f, args=(5,), daemon=True).start()
assert entered.wait(30)
print("exiting", flush=True)
"""


def test_an_exit_while_a_daemon_thread_tunes_releases_its_claim(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'exit.db'}"
    out = _run(EXIT_WHILE_TUNING, url)
    assert out.returncode == 0 and out.stdout.split() == ["exiting"], out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    with sqlite3.connect(tmp_path / "exit.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # Old code: the claim stayed, and a process on another host waited out its lease (120 s).
        assert con.execute("SELECT COUNT(*) FROM tuner_cache_claims").fetchone()[0] == 0


def test_a_tuning_on_an_event_loops_thread_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """A first call inside a coroutine tunes on the loop's thread and blocks the loop: logged once per
    kernel; a first call through asyncio.to_thread (another thread) is not."""
    import asyncio
    import logging

    import tuner

    def make(name: str):  # type: ignore[no-untyped-def]
        @tuner.autotune(
            configs=[{"a": 1}, {"a": 2}],
            key=lambda n: {"n": n},
            name=name,
            bench=lambda call: (call(), 1.0)[1],
        )
        def f(n: int, *, a: int) -> int:
            return n + a

        return f

    on_loop, off_loop = make("evloop_on"), make("evloop_off")

    async def main() -> None:
        on_loop(1)
        on_loop(2)  # a second key of the same kernel: no second warning
        await asyncio.to_thread(off_loop, 1)

    caplog.set_level(logging.WARNING, logger="tuner")
    asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert len(said) == 1 and "evloop_on" in said[0], said
    assert on_loop.tuner.stats["tuned"] == 2 and off_loop.tuner.stats["tuned"] == 1


FORK_OPTUNA = """
import contextlib, os, sys
from sqlalchemy import text
from tuner.store import ResultStore

store = ResultStore(sys.argv[1])
storage = store.optuna_storage()  # the process's one Optuna storage of the URL
def backends(n):  # the server processes of n connections taken from the pool at once
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(storage.engine.connect()) for _ in range(n)]
        return {c.execute(text("SELECT pg_backend_pid()")).scalar_one() for c in conns}
pooled = backends(max(1, storage.engine.pool.checkedin()))  # every connection the pool holds
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, str(backends(1).pop()).encode())
    storage.create_new_study([], "from the child")  # an Optuna write of the child's
    os._exit(0)
_, status = os.waitpid(pid, 0)
child = int(os.read(r, 64).decode())
print(len(pooled), child in pooled, backends(1) <= pooled, os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_does_not_share_the_parents_optuna_storage_connections(pg_url: str) -> None:
    """A ResultStore's Optuna storage (and the one a process shares per URL) made before a fork: the child
    took a pooled connection of the parent's (the engines of `engine_for` got new pools at the fork;
    Optuna's did not), so the two processes shared one socket."""
    out = _run(FORK_OPTUNA, pg_url)
    assert out.returncode == 0, out.stderr[-3000:]
    n, shared, parent_kept, code = out.stdout.split()
    assert int(n) >= 1 and code == "0", out.stdout
    assert shared == "False" and parent_kept == "True", out.stdout
