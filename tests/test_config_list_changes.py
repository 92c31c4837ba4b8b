"""A stored winner and a changed config list (README, "What a key holds").

The config list is not part of the stored key, so a key keeps one winner whatever list it was tuned over.
A list that gained configs (the usual way to iterate on an autotune list) used to find the old winner,
still in the list, and use it: the added configs were never timed, in any later process. Now a list whose
every config is timed (no smaller `budget=`, no `time_budget_s`) is tuned once more when it holds configs
that no recorded tuning of the key tried, and hits from then on; a narrowed or reordered list, offline
mode, shipped files and searched spaces behave as before.

Each "new process" below is a new decoration of the same function over the same store (nothing of the
first one's memory is shared, as in tests/test_foreign_kernels.py), except the first test, which edits a
kernel's source file between real processes as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tuner.search_spaces import IntRange, SearchSpace

import tuner
from tests._env import repo_pythonpath  # noqa: E402
from tuner.runtime import ConfigCache
from tuner.store import ResultStore, TaskContext

REPO = Path(__file__).resolve().parent.parent

TIMES = {1: 3e-3, 2: 2e-3, 4: 1e-3, 8: 5e-3}  # seconds per config b: 4 is the fastest


def _launch(n, *, b):
    return b


def decorate(configs, timed, **kw):
    """`tuner.autotune(configs=...)` over `_launch` (one kernel name and source in every decoration); the
    bench records which configs it times."""

    def bench(call):
        b = call()
        timed.append(b)
        return TIMES[b]

    return tuner.autotune(configs=[{"b": b} for b in configs], key=["n"], bench=bench, **kw)(_launch)


# ---- the triton.autotune drop-in, in new processes, with the list edited in the kernel's file -------------
KERNEL = """
import json
import sys
import threading

import torch
import triton
import triton.language as tl

import tuner

TIMES = {16: 3.0, 32: 2.0, 64: 1.0}  # ms: 64 is the fastest
timed = []


def do_bench(kernel_call, quantiles):
    kernel_call()
    b = int(out[0])  # the kernel writes its BLOCK
    timed.append(b)
    return [TIMES[b]] * 3


@tuner.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], do_bench=do_bench)
@triton.jit
def which(out_ptr, n, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, 1), tl.full((1,), BLOCK, tl.int32))


out = torch.zeros(1, dtype=torch.int32)
which[(1,)](out, 100)
t = which.tuner
print(json.dumps({"timed": timed, "used": int(out[0]), "tuned": t.stats["tuned"], "why": t.last_miss_reason}))
"""


def _run(script: Path, home: Path, *extra: str) -> dict:
    env = {**os.environ, "TUNER_HOME": str(home), "TRITON_INTERPRET": "1", "PYTHONPATH": repo_pythonpath()}
    env.pop("TUNER_MODE", None)
    for kv in extra:
        k, v = kv.split("=", 1)
        env[k] = v
    p = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, encoding="utf-8"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_widened_list_is_tuned_once_in_a_new_process_then_hits(tmp_path: Path, _tuner_home: Path):
    pytest.importorskip("triton")
    script = tmp_path / "kern.py"
    script.write_text(KERNEL, encoding="utf-8")
    first = _run(script, _tuner_home)
    assert first["timed"] == [16, 32] and first["used"] == 32
    # the user adds a config to the list (the kernel's source is unchanged: the decorator is not hashed)
    widened = KERNEL.replace(
        'triton.Config({"BLOCK": 32})]', 'triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})]'
    )
    assert widened != KERNEL
    script.write_text(widened, encoding="utf-8")
    second = _run(script, _tuner_home)
    # before: {"timed": [], "used": 32} -- 64 was never timed, in this or any later process
    assert sorted(second["timed"]) == [16, 32, 64] and second["used"] == 64 and second["tuned"] == 1
    assert second["why"].startswith("the config list has 1 config the stored tuning did not time")
    assert "'BLOCK': 64" in second["why"]
    third = _run(script, _tuner_home)
    assert third == {"timed": [], "used": 64, "tuned": 0, "why": None}
    # offline never tunes: the entry is used as before
    script.write_text(
        widened.replace('triton.Config({"BLOCK": 64})]', 'triton.Config({"BLOCK": 8})]'), encoding="utf-8"
    )
    offline = _run(script, _tuner_home, "TUNER_MODE=offline")
    assert offline["timed"] == [] and offline["tuned"] == 0


# ---- a plain launcher: the same rules, each "process" a new decoration ----------------------------------
def test_a_widened_list_is_tuned_once_then_hits():
    timed: list[int] = []
    f = decorate([1, 2], timed)
    assert f(100) == 2 and sorted(timed) == [1, 2]
    timed.clear()
    g = decorate([1, 2, 4], timed)  # a new process, with 4 added to the list
    assert "the config list has 1 config the stored tuning did not time" in g.explain(100)
    assert g(100) == 4 and sorted(timed) == [1, 2, 4]  # the whole list is timed once (before: nothing)
    assert g.tuner.stats["tuned"] == 1
    assert g.tuner.last_miss_reason.startswith("the config list has 1 config the stored tuning did not time")
    [entry] = ConfigCache().entries()
    assert entry.config == {"b": 4}
    timed.clear()
    h = decorate([1, 2, 4], timed)
    assert h.explain(100) == "hit (store): {'b': 4}"
    assert h(100) == 4 and timed == [] and h.tuner.stats["from_store"] == 1


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 's.db'}"
    else:
        from .pg import fresh_database

        yield from fresh_database()


def test_each_store_keeps_what_its_tunings_tried(store_url: str):
    """The same rules on SQLite and PostgreSQL (the trials' JSON stats are read back on each)."""
    timed: list[int] = []
    decorate([1, 2], timed, storage=store_url)(100)
    timed.clear()
    assert decorate([1, 2, 4], timed, storage=store_url)(100) == 4 and sorted(timed) == [1, 2, 4]
    for configs in ([1, 2, 4], [4, 2], [2, 1, 4]):
        timed.clear()
        assert decorate(configs, timed, storage=store_url)(100) == 4 and timed == []
    ConfigCache(store_url).store.engine.dispose()


def test_a_widened_list_whose_old_winner_still_wins_is_stored_as_tuned_over_the_whole_list():
    """The re-tuning replaces the entry even when the old winner wins again with a slower time than it
    was stored with (the new tuning timed it against every config), and later processes hit."""
    timed: list[int] = []
    decorate([1, 4], timed)(100)
    timed.clear()
    g = decorate([1, 4, 8], timed)
    assert g(100) == 4 and sorted(timed) == [1, 4, 8]
    timed.clear()
    assert decorate([1, 4, 8], timed)(100) == 4 and timed == []


def test_a_narrowed_list_holding_the_winner_hits_without_timing():
    timed: list[int] = []
    decorate([1, 2, 4], timed)(100)
    timed.clear()
    g = decorate([2, 4], timed)
    assert g(100) == 4 and timed == [] and g.tuner.stats["from_store"] == 1


def test_a_narrowed_list_without_the_winner_is_tuned_again():
    timed: list[int] = []
    decorate([1, 2, 4], timed)(100)
    timed.clear()
    g = decorate([1, 2], timed)
    assert g(100) == 2 and sorted(timed) == [1, 2]
    assert g.tuner.last_miss_reason.startswith("cached config {'b': 4} is not in the current search space")
    timed.clear()
    assert decorate([1, 2], timed)(100) == 2 and timed == []


def test_a_reordered_list_is_no_change():
    timed: list[int] = []
    decorate([1, 2, 4], timed)(100)
    timed.clear()
    g = decorate([4, 2, 1], timed)
    assert g(100) == 4 and timed == [] and g.tuner.stats["from_store"] == 1


def test_a_failed_config_counts_as_tried():
    """A config that raised was tried: the list is not tuned again for it in every process."""

    def boom(n, *, b):
        if b == 8:
            raise RuntimeError("out of resources")
        return b

    timed: list[int] = []

    def bench(call):
        b = call()
        timed.append(b)
        return TIMES[b]

    def make(configs):
        return tuner.autotune(configs=[{"b": b} for b in configs], key=["n"], bench=bench, name="boom")(boom)

    make([1, 2])(100)
    timed.clear()
    assert make([1, 2, 8])(100) == 2 and sorted(timed) == [1, 2]  # 8 raised before it was timed
    timed.clear()
    g = make([1, 2, 8])
    assert g(100) == 2 and timed == [] and g.tuner.stats["from_store"] == 1


@pytest.mark.parametrize("mode", ["offline", "record"])
def test_modes_that_never_tune_use_the_entry_as_before(mode: str):
    timed: list[int] = []
    decorate([1, 2], timed)(100)
    timed.clear()
    g = decorate([1, 2, 4], timed, mode=mode)
    assert g.explain(100) == "hit (store): {'b': 2}"
    assert g(100) == 2 and timed == [] and g.tuner.stats["from_store"] == 1


def test_a_shipped_file_is_used_as_before(tmp_path: Path):
    """A cache file records no trials: its entry is used as before, online and offline, and an export
    has exactly the fields of the published schema (what other readers of the format see)."""
    timed: list[int] = []
    decorate([1, 2], timed)(100)
    path = tmp_path / "tuned.json"
    from tuner.runtime._file import write_cache_file

    write_cache_file(path, ConfigCache().entries())
    [row] = json.loads(path.read_text(encoding="utf-8"))["entries"]
    published = json.loads((REPO / "docs" / "cache-schema.json").read_text(encoding="utf-8"))["$defs"][
        "entry"
    ]
    assert set(row) == set(published["required"]) == set(published["properties"])
    for mode in ("online", "offline"):
        timed.clear()
        g = decorate([1, 2, 4], timed, mode=mode, storage=False, cache=tuner.load_cache(path))
        assert g(100) == 2 and timed == [] and g.tuner.stats["from_file"] == 1


def test_an_imported_entry_is_used_as_before(tmp_path: Path):
    """An entry that no recorded tuning of the store tried (imported, or from a tuner that did not record
    the key with its trials): nothing says what it was timed against, so it hits as before, also where
    the store holds an older local tuning of the key."""
    timed: list[int] = []
    there = f"sqlite:///{tmp_path / 'there.db'}"
    decorate([1, 2, 4], timed, storage=there)(100)
    [entry] = ConfigCache(there).entries()
    assert entry.config == {"b": 4}
    for local in ([], [1, 2]):
        ConfigCache().clear()
        if local:
            decorate(local, timed)(100)  # trials of 1 and 2 recorded here, not of 4
        ConfigCache().merge([entry], prefer_import=True)  # `tuner cache import --prefer-import`
        timed.clear()
        g = decorate([1, 2, 4, 8], timed)
        assert g(100) == 4 and timed == [] and g.tuner.stats["from_store"] == 1


def test_a_searched_list_keeps_its_winner():
    """`budget=` smaller than the list (the opt-in to time only some) and `time_budget_s` keep today's
    behaviour: the list is searched, not timed in full, so an untimed config is no reason to tune."""
    timed: list[int] = []
    decorate([1, 2], timed)(100)
    for kw in ({"budget": 2}, {"time_budget_s": 60.0}):
        timed.clear()
        g = decorate([1, 2, 4], timed, **kw)
        assert g(100) == 2 and timed == [] and g.tuner.stats["from_store"] == 1


def test_a_space_of_at_most_budget_configs_counts_as_a_list():
    """A space whose every config the budget covers is timed in full as a list is: widening it tunes
    once; a space larger than the budget is searched and keeps its winner."""
    timed: list[int] = []

    def bench(call):
        b = call()
        timed.append(b)
        return TIMES.get(b, 4e-3)

    def make(hi, budget=20):
        space = SearchSpace([IntRange("b", 1, hi)])
        return tuner.autotune(space, key=["n"], bench=bench, budget=budget, name="ranged")(_launch)

    make(2)(100)
    timed.clear()
    assert make(4)(100) == 4 and sorted(timed) == [1, 2, 3, 4]
    timed.clear()
    assert make(8, budget=4)(100) == 4 and timed == []  # 8 configs, 4 timed: a search


def test_a_caller_waits_for_the_process_that_tunes_the_widened_list(tmp_path: Path):
    """While another process tunes a widened list (it holds the key's claim), a caller with that list
    waits for its winner instead of taking the old entry, which is still in the store meanwhile."""
    timed: list[int] = []
    decorate([1, 2], timed)(100)
    db = ConfigCache()
    [old] = db.entries()
    assert db.claim(old.key.hash, "another-process", 120.0)  # a live owner: the caller waits for it
    g = decorate([1, 2, 4], timed)
    got: list[int] = []
    timed.clear()
    caller = threading.Thread(target=lambda: got.append(g(100)))
    caller.start()
    # the other process tunes [1, 2, 4] (here in a store of its own) and writes what it would write
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    decorate([1, 2, 4], [], storage=other_url)(100)
    [new] = ConfigCache(other_url).entries()
    db.put(new, replace=True)
    for m in ResultStore(other_url).measurements():
        task = TaskContext(m.kernel, m.problem, m.device, m.versions, m.dtype)
        db.store.record(task, m.space_fingerprint, m.config, m.value, m.status, stats=m.stats)
    db.release(old.key.hash, "another-process")
    caller.join(120)
    assert got == [4] and timed == []  # before: [2], the old entry, while the other process tuned


# ---- two decorations of one @triton.jit function with overlapping lists ------------------------------------
def test_two_decorations_of_one_jit_function_with_overlapping_lists():
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def which(out_ptr, n, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, 1), tl.full((1,), BLOCK, tl.int32))

    out = torch.zeros(1, dtype=torch.int32)
    ms = {16: 3.0, 32: 2.0, 64: 1.0}
    timed: list[int] = []

    def do_bench(kernel_call, quantiles):
        kernel_call()
        b = int(out[0])
        timed.append(b)
        return [ms[b]] * 3

    def deco(*blocks, **kw):
        cfgs = [triton.Config({"BLOCK": b}) for b in blocks]
        return tuner.autotune(configs=cfgs, key=["n"], do_bench=do_bench, **kw)(which)

    def launch(k) -> int:
        k[(1,)](out, 100)
        return int(out[0])

    small, wide = deco(16, 32), deco(32, 64)  # one kernel name and source: one stored entry per key
    assert launch(small) == 32 and timed == [16, 32]
    timed.clear()
    assert launch(wide) == 64 and timed == [32, 64]  # before: 32, from `small`'s tuning, and nothing timed
    assert wide.tuner.last_miss_reason.startswith("the config list has 1 config the stored tuning did not")
    # The next process: the store keeps one winner per key. `small` cannot use 64 and tunes again (as
    # before); then every config of either list has been tried for the key, so neither tunes again, and
    # both use the winner stored last. (Give each decoration its own `name=` to keep a winner each.)
    timed.clear()
    small, wide = deco(16, 32), deco(32, 64)
    assert launch(small) == 32 and timed == [16, 32]
    timed.clear()
    assert launch(wide) == 32 and timed == []
    small, wide = deco(16, 32), deco(32, 64)
    assert launch(small) == 32 and launch(wide) == 32 and timed == []
    assert small.tuner.stats["from_store"] == wide.tuner.stats["from_store"] == 1
    # with a name each, each keeps its own winner
    for _ in range(2):
        timed.clear()
        small, wide = deco(16, 32, name="which_small"), deco(32, 64, name="which_wide")
        assert launch(small) == 32 and launch(wide) == 64
    assert timed == []


def test_the_hit_path_after_the_first_hit_reads_nothing(monkeypatch: pytest.MonkeyPatch):
    """The check costs the first store lookup of a key one read; later calls are dict lookups."""
    timed: list[int] = []
    decorate([1, 2], timed)(100)
    g = decorate([1, 2], timed)
    assert g(100) == 2
    from tuner.runtime import _resolve

    def no_read(*a, **k):
        raise AssertionError("read the trials on a hit")

    monkeypatch.setattr(_resolve, "tried_configs", no_read, raising=False)
    for _ in range(3):
        assert g(100) == 2
    assert g.tuner.stats["from_store"] == 1
