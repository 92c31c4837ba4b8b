"""Record mode: offline semantics plus a miss log (one row per key, calls counted, the fallback named),
safe across processes, never raising; and the zero-shot predictor as the default offline fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, ReadOnlyCache, read_misses, set_zero_shot
from tuner.runtime._misses import CountingConfig, MissRecorder, recorder
from tuner.store import ResultStore, TaskContext

REPO = Path(__file__).resolve().parent.parent
SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    monkeypatch.delenv("TUNER_MODE", raising=False)
    monkeypatch.delenv("TUNER_PREDICT", raising=False)
    recorder().reset()
    set_zero_shot(None)
    yield
    recorder().reset()


def _fn(mode: str = "record", **kw):
    calls = []

    @tuner.autotune(SPACE, key=["n"], mode=mode, bench=lambda c: 1.0, name="rec_kernel", **kw)
    def k(n, *, block):
        calls.append(block)
        return block

    return k, calls


def test_record_mode_never_tunes_and_counts_each_call(tmp_path: Path):
    k, calls = _fn(storage=False)
    for _ in range(3):
        k(100)
    k(200)
    assert k.tuner.stats["tuned"] == 0
    assert k.tuner.last_choice["why"].startswith("record: offline: space default")
    recorder().flush()  # (the writer thread may have written some lines already)
    rows = {r.key.fields_dict["n"]: r for r in read_misses()}
    assert rows[100].calls == 3 and rows[200].calls == 1
    r = rows[100]
    assert r.kernel == "rec_kernel" and r.key.device == "cpu" and r.key.versions_dict["python"]
    assert "space default" in r.fallback and r.config == SPACE.default()
    assert r.processes == 1 and not r.registered
    k(100)  # deltas only: one more call, one more line, still one row
    recorder().flush()
    assert {r.key.fields_dict["n"]: r.calls for r in read_misses()} == {100: 4, 200: 1}


def test_hits_are_not_recorded_and_stay_plain_dicts(tmp_path: Path):
    k0, _ = _fn(storage=False)
    ck = k0.tuner.full_key((64,), {})
    shipped = ReadOnlyCache([CacheEntry(ck, {"block": 32}, 1e-3, 0.0, "2026-01-01T00:00:00Z")])
    k, calls = _fn(storage=False, cache=shipped)
    k(64)
    k(64)
    assert calls == [32, 32]
    assert type(next(iter(k.tuner.mem.values()))) is dict  # the hit path is untouched
    assert recorder().flush() == 0 and read_misses() == []


def test_recording_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x", encoding="utf-8")
    monkeypatch.setenv("TUNER_MISSES_DIR", str(blocker / "misses"))
    k, calls = _fn(storage=False)
    assert k(8) == SPACE.default()["block"]
    rec = recorder()
    rec.flush()
    assert rec.write_errors >= 1
    monkeypatch.setenv("TUNER_MISSES_DIR", str(tmp_path / "ok"))
    rec.flush()  # the counts were kept for the next try
    assert read_misses(tmp_path / "ok")[0].calls == 1


def test_torn_lines_are_skipped(tmp_path: Path):
    k, _ = _fn(storage=False)
    k(5)
    recorder().flush()
    f = next((tmp_path / "home" / "misses").glob("*.jsonl"))
    with open(f, "a", encoding="utf-8") as fh:
        fh.write('{"v": 1, "hash": "abc", "key": {"kern')  # a process killed mid-write
    rows = read_misses()
    assert len(rows) == 1 and rows[0].calls == 1


def test_counting_config_counts_unpacking_only():
    import itertools

    c = itertools.count()
    cfg = CountingConfig({"a": 1}, c)

    def f(**kw):
        return kw

    assert f(**cfg) == {"a": 1} and f(**cfg) == {"a": 1}
    assert next(c) == 2
    assert type(dict(cfg)) is dict and json.loads(json.dumps(cfg)) == {"a": 1}


WORKER = """
import sys
import tuner
from tuner import PowerOfTwo, SearchSpace

@tuner.autotune(SearchSpace([PowerOfTwo("block", 16, 256)]), key=["n"], mode="record", storage=False,
                name="procs_kernel")
def k(n, *, block):
    return block

for i in range(int(sys.argv[1])):
    k(1000)
    k(2000 + i % 3)
"""


def test_many_processes_lose_and_duplicate_nothing(tmp_path: Path):
    script = tmp_path / "w.py"
    script.write_text(textwrap.dedent(WORKER), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TUNER_MISSES_DIR": str(tmp_path / "shared"),
        "TUNER_HOME": str(tmp_path / "home"),
    }
    n_proc, n_calls = 4, 300
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(n_calls)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        for _ in range(n_proc)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = {r.key.fields_dict["n"]: r for r in read_misses(tmp_path / "shared")}
    assert sorted(rows) == [1000, 2000, 2001, 2002]
    assert rows[1000].calls == n_proc * n_calls and rows[1000].processes == n_proc
    assert sum(rows[n].calls for n in (2000, 2001, 2002)) == n_proc * n_calls


def test_record_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_MODE", "record")
    k, _ = _fn(mode=None, storage=False)  # type: ignore[arg-type]
    k(7)
    assert k.tuner.stats["tuned"] == 0 and k.tuner.last_choice["why"].startswith("record:")
    recorder().flush()
    assert [r.key.fields_dict for r in read_misses()] == [{"n": 7}]


# ---- the zero-shot predictor ---------------------------------------------------------------------------
def _store_with_history(tmp_path: Path) -> ResultStore:
    """Measurements of rec_kernel at n=64 and n=256 on another device: block 64 is always fastest."""
    store = ResultStore(f"sqlite:///{tmp_path / 'hist.db'}")
    for n in (64, 256):
        task = TaskContext(kernel="rec_kernel", problem={"n": n}, device="gpu0", versions={})
        for cfg in SPACE.enumerate():
            t = 1e-3 * (1 + abs(cfg["block"].bit_length() - 7))  # 64 = 2**6 -> bit_length 7: best
            store.record(task, SPACE.fingerprint(), cfg, t, "ok")
    return store


def test_offline_miss_takes_the_zero_shot_prediction(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    store = _store_with_history(tmp_path)
    k, calls = _fn(mode="offline", storage=store)
    with caplog.at_level("WARNING"):
        assert k(128) == 64
    why = k.tuner.last_choice["why"]
    assert why.startswith("offline: zero-shot prediction from 2 measured tasks"), why
    assert any("zero-shot prediction" in r.getMessage() for r in caplog.records)
    assert k.tuner.stats["tuned"] == 0


def test_one_switch_turns_the_predictor_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = _store_with_history(tmp_path)
    monkeypatch.setenv("TUNER_PREDICT", "0")
    k, _ = _fn(mode="offline", storage=store)
    k(128)
    assert k.tuner.last_choice["why"].startswith("offline: space default")


def test_record_mode_notes_the_prediction_as_the_fallback(tmp_path: Path):
    store = _store_with_history(tmp_path)
    k, _ = _fn(mode="record", storage=store)
    assert k(512) == 64
    recorder().flush()
    (row,) = read_misses()
    assert "zero-shot prediction" in row.fallback and row.config == {"block": 64}


def test_no_data_no_prediction(tmp_path: Path):
    k, _ = _fn(mode="offline", storage=ResultStore(f"sqlite:///{tmp_path / 'empty.db'}"))
    k(3)
    assert k.tuner.last_choice["why"].startswith("offline: space default")


def test_unknown_key_fields_in_cache_entries_are_used_as_winners(tmp_path: Path):
    """Winner-only data (a shipped cache for another device): the predictor learns where winners lie."""
    k0, _ = _fn(storage=False)
    entries = []
    for n in (32, 64, 128, 256):
        ck0 = k0.tuner.full_key((n,), {})
        ck = CacheKey.make(ck0.kernel, ck0.source_hash, {"n": n}, list(ck0.dtypes), "gpu0", ck0.versions_dict)
        entries.append(CacheEntry(ck, {"block": 128}, 1e-3, 0.0, "2026-01-01T00:00:00Z"))
    k, _ = _fn(mode="offline", storage=False, cache=ReadOnlyCache(entries))
    assert k(100) == 128
    assert "4 cache entries" in k.tuner.last_choice["why"]


def test_a_broken_miss_log_folder_does_not_stop_the_recorder_class(tmp_path: Path):
    rec = MissRecorder(folder=tmp_path / "r")
    ck = CacheKey.make("x", "0" * 32, {"n": 1}, [], "cpu", {})
    cfg = rec.note(ck, {"block": 16}, "offline: space default")
    dict(**cfg)
    rec.flush()
    assert read_misses(tmp_path / "r")[0].calls == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child only calls and flushes
def test_a_forked_child_does_not_write_the_parents_counts_again(tmp_path: Path):
    k, _ = _fn(storage=False)
    k(11)
    k(11)
    pid = os.fork()
    if pid == 0:  # the child: one call of its own, then flush and leave at once
        try:
            k(11)
            recorder().flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    recorder().flush()
    (row,) = read_misses()
    # the parent counted 2 calls and the child 1; the child's copy of the parent's 2 is not written again
    assert row.calls == 3 and row.processes == 2


def test_the_predictor_is_told_each_tasks_device_and_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The device labels reach the predictor: each task's (for its family's features and the anchor
    tiers) and the missing key's."""
    from tuner.cost_models.zero_shot import FittedZeroShot

    seen: list[tuple[str | None, list[set[str]]]] = []
    real = FittedZeroShot.predict_best

    def spy(self, space, task=None, **kw):
        seen.append((kw.get("device"), [{d.vendor for d in ds} for ds in self.anchor_devices]))
        return real(self, space, task, **kw)

    monkeypatch.setattr(FittedZeroShot, "predict_best", spy)
    k0, _ = _fn(storage=False)
    entries = []
    for n, label, block in ((64, "NVIDIA RTX A6000 (sm86)", 128), (64, "AMD Radeon PRO W7800", 32)):
        ck0 = k0.tuner.full_key((n,), {})
        ck = CacheKey.make(ck0.kernel, ck0.source_hash, {"n": n}, list(ck0.dtypes), label, ck0.versions_dict)
        entries.append(CacheEntry(ck, {"block": block}, 1e-3, 0.0, "2026-01-01T00:00:00Z"))
    k, _ = _fn(mode="offline", storage=False, cache=ReadOnlyCache(entries))
    assert k(100) in (32, 128)
    ((device, vendors),) = seen
    assert device == k.tuner.full_key((100,), {}).device
    assert {"nvidia"} in vendors and {"amd"} in vendors


def test_a_stale_shipped_entry_is_named_in_the_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A shipped entry whose kernel source changed since it was tuned is not used, and the one warning
    production sees says so and why (was: only the fallback, the cause left to `explain`)."""
    import logging

    online, _ = _fn("online")
    online(100)  # tuned and stored in $TUNER_HOME/tuner.db
    shipped = tmp_path / "shipped.json"
    from tuner.cli import main as cli

    assert cli(["cache", "export", "--out", str(shipped)]) == 0
    k, _ = _fn(storage=False, cache=str(shipped))
    k.tuner.source_hash = "0" * 32  # the kernel was edited after the entry was tuned
    with caplog.at_level(logging.WARNING, logger="tuner.runtime._decorator"):
        k(100)
    # the warning (a run under `-o log_level=INFO` also captures the tuning's INFO line before it)
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if "rec_kernel" in r.getMessage() and r.levelno >= logging.WARNING
    ]
    assert "not used: entry for these key fields is stale or foreign: kernel source changed" in line, line
    assert k.tuner.last_choice["why"].startswith("record: offline:")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tuner.runtime._decorator"):
        k(300)  # no entry for these key fields at all: nothing to say about one
    assert all("not used" not in r.getMessage() for r in caplog.records)


def test_the_choice_warning_names_the_dtypes(caplog: pytest.LogCaptureFixture):
    """One shape in two dtypes is two keys: their two warnings differ (were the same line twice)."""
    import logging

    import numpy as np

    @tuner.autotune(SPACE, key=["n"], mode="record", storage=False, name="dt_kernel")
    def k(x, n, *, block):
        return block

    with caplog.at_level(logging.WARNING, logger="tuner.runtime._decorator"):
        k(np.ones(8, np.float32), 8)
        k(np.ones(8, np.float64), 8)
    lines = [r.getMessage() for r in caplog.records if "dt_kernel" in r.getMessage()]
    assert [line.split(": using")[0] for line in lines] == [
        "dt_kernel {'n': 8} ['float32']",
        "dt_kernel {'n': 8} ['float64']",
    ]


def test_the_triton_drop_in_counts_each_launch_once_in_every_form():
    # The drop-in's first launch of a key counted two calls (its `.cache` entry was built from a copy
    # of the counting config), and launches with every argument by keyword counted none (they were
    # served a plain dict made from `.cache`'s triton.Config).
    triton = pytest.importorskip("triton")
    import torch
    import triton.language as tl

    @tuner.autotune(
        configs=[triton.Config({"B": 16}), triton.Config({"B": 32})],
        key=["n"],
        mode="record",
        name="rec_triton",
    )
    @triton.jit
    def add_one(x_ptr, n, B: tl.constexpr):
        offs = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(40)
    grid = lambda meta: (triton.cdiv(40, meta["B"]),)  # noqa: E731
    add_one[grid](x, 40)
    recorder().flush()
    assert [r.calls for r in read_misses()] == [1]
    add_one[grid](x_ptr=x, n=40)
    assert add_one.best_config.kwargs == {"B": 32} and len(add_one.cache) == 1
    add_one[grid](x, n=40)
    add_one[grid](x, 40)
    add_one[grid](x_ptr=x, n=40)
    recorder().flush()
    assert [r.calls for r in read_misses()] == [5] and float(x.sum()) == 5 * 40
