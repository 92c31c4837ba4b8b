"""Unit tests of the measurement layer on CPU: results, winner choice, replay, plain callables,
precompilation, worker lifetime, and tune_kernel's bookkeeping."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tuner.kernels import KernelSpec
from tuner.search_spaces import IntRange, SearchSpace

from tests._env import repo_pythonpath  # noqa: E402
from tuner.measure import (
    STATUSES,
    CallableMeasurer,
    KernelMeasurer,
    MeasureResult,
    ReplayMeasurer,
    TimingOptions,
    WorkerSettings,
    choose_winner,
    classify_exception,
    compare,
    summarize,
)
from tuner.replay import table_from_dict
from tuner.store import ResultStore
from tuner.tune import software_versions, tune_kernel

FAST = TimingOptions(warmup=1, budget_ms=2.0, min_reps=3, max_reps=10, interleave_rounds=2, interleave_reps=2)


# ---- results ---------------------------------------------------------------------------------------
def test_summarize_statistics_and_round_trip():
    r = summarize([3.0, 1.0, 2.0, 4.0, 100.0], backend="cpu")
    assert r.ok and r.median == 3.0 and r.min == 1.0 and r.max == 100.0 and r.n == 5 and r.unit == "ms"
    assert r.q1 == 2.0 and r.q3 == 4.0 and r.iqr == 2.0
    assert math.isclose(r.mean, 22.0)
    back = MeasureResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    assert json.loads(json.dumps(r.stats()))["median"] == 3.0


def test_the_stores_form_of_a_result_keeps_its_extras():
    """The results store keeps `stats()`, where the extras are flat beside the statistics; a resumed
    study rebuilds each earlier trial from it, and lost its extras (the timer used, for instance)."""
    r = summarize([3.0, 1.0, 2.0], backend="cpu", extra={"timer": "wall", "l2_flushed": True})
    back = MeasureResult.from_dict(json.loads(json.dumps(r.stats())))
    assert back.extra == {"timer": "wall", "l2_flushed": True}
    assert back.with_(times=()) == r.with_(times=())  # the raw times are not kept in the store


def test_result_rejects_bad_status_and_ok_without_time():
    with pytest.raises(ValueError):
        MeasureResult(status="fine", backend="cpu")
    with pytest.raises(ValueError):
        MeasureResult(status="ok", backend="cpu")
    f = MeasureResult.failed("timeout", "cpu", "too slow")
    assert not f.ok and f.value is None and f.stats()["status"] == "timeout"
    assert set(STATUSES) == {"ok", "compile_error", "out_of_resources", "incorrect", "timeout", "crashed"}


def test_classify_exception():
    class OutOfResources(Exception):
        pass

    class CompilationError(Exception):
        pass

    assert classify_exception(OutOfResources("shared memory"), "compile") == ("out_of_resources", False)
    assert classify_exception(CompilationError("x"), "compile") == ("compile_error", False)
    assert classify_exception(
        RuntimeError("CUDA error: an illegal memory access was encountered"), "run"
    ) == ("crashed", True)
    assert (
        classify_exception(RuntimeError("CUDA out of memory. Tried to allocate"), "run")[0]
        == "out_of_resources"
    )
    assert classify_exception(ValueError("x"), "run") == ("crashed", False)
    assert classify_exception(NotImplementedError("x"), "compile") == ("compile_error", False)


def test_compare_flags_nan_shape_and_tolerance():
    ref = np.arange(10, dtype=np.float64)
    assert compare(ref + 1e-7, ref, 1e-5, 1e-5).ok
    bad = ref.copy()
    bad[3] = np.nan
    c = compare(bad, ref, 1e-5, 1e-5)
    assert not c.ok and "1 NaN" in c.message
    assert not compare(ref[:5], ref, 1e-5, 1e-5).ok
    assert not compare(ref + 1.0, ref, 1e-5, 1e-5).ok


# ---- winner choice ---------------------------------------------------------------------------------
def _ok(times):
    return summarize(times, backend="cpu")


def test_choose_winner_never_picks_a_failed_config():
    cfgs = [{"a": 1}, {"a": 2}, {"a": 3}]
    res = [MeasureResult.failed("incorrect", "cpu", "wrong"), _ok([5.0, 5.1, 4.9]), _ok([6.0, 6.0, 6.0])]
    sel = choose_winner(cfgs, res)
    assert sel.winner == 1 and sel.ranking == (1, 2)
    assert choose_winner(cfgs[:1], res[:1]).winner is None


def test_ties_within_noise_band_are_broken_by_config_order():
    cfgs = [{"b": 9}, {"b": 1}]
    # b=9 is measured 0.5% faster, inside the 1% band: a tie that goes to the first config in order (b=1)
    res = [_ok([1.000, 0.995, 0.990]), _ok([1.000, 1.000, 1.000])]
    sel = choose_winner(cfgs, res)
    assert set(sel.tied) == {0, 1} and sel.winner == 1
    # swapping the input order does not change the choice
    assert choose_winner(cfgs[::-1], res[::-1]).winner == 0
    # outside the band, the faster wins
    res2 = [_ok([0.9, 0.9, 0.9]), _ok([1.0, 1.0, 1.0])]
    assert choose_winner(cfgs, res2).winner == 0
    # a noisy best widens the band to its own IQR / median
    noisy = [_ok([0.7, 0.9, 1.1, 0.8, 1.0]), _ok([1.0, 1.0, 1.0])]
    sel = choose_winner(cfgs, noisy)
    assert sel.band > 0.2 and sel.winner == 1


# ---- replay ----------------------------------------------------------------------------------------
def _table():
    cache = {}
    for bx in (16, 32, 64):
        for by in (1, 2, 4):
            t = 1.0 + abs(bx - 32) / 16 + abs(by - 2)
            cache[f"{bx},{by}"] = {
                "block_size_x": bx,
                "block_size_y": by,
                "time": "CompilationFailedConfig" if bx == 64 and by == 4 else t,
            }
    return table_from_dict(
        {
            "device_name": "fake",
            "kernel_name": "fake",
            "tune_params_keys": ["block_size_x", "block_size_y"],
            "cache": cache,
        }
    )


def test_replay_measurer():
    m = ReplayMeasurer(_table())
    r = m.measure({"block_size_x": 32, "block_size_y": 2})
    assert r.ok and r.median == 1.0 and r.backend == "replay"
    f = m.measure({"block_size_x": 64, "block_size_y": 4})
    assert f.status == "compile_error" and "recorded as failed" in f.error
    with pytest.raises(ValueError):
        m.measure({"block_size_x": 8, "block_size_y": 2})


# ---- plain callables -------------------------------------------------------------------------------
def scale(x, *, k):
    return x * k


def scale_wrong(x, *, k):
    return x * k + (k == 3)


def test_callable_measurer_in_process_and_isolated():
    x = np.linspace(0, 1, 1000)
    for iso in ("inprocess", "process"):
        with CallableMeasurer(scale_wrong, (x,), reference=x * 2, isolation=iso, timing=FAST) as m:
            assert m.measure({"k": 2}).ok
            r = m.measure({"k": 3})
            assert r.status == "incorrect", r
            assert m.label == "cpu"


def test_callable_without_reference_checks_non_finite_outputs():
    def f(*, k):
        return np.array([1.0, np.inf]) if k else np.array([1.0, 2.0])

    with CallableMeasurer(f, isolation="inprocess", timing=FAST) as m:
        assert m.measure({"k": 0}).ok
        assert m.measure({"k": 1}).status == "incorrect"


def test_callable_output_arg_is_poisoned_and_mutated_arg_restored():
    def f(x, out, *, half):
        n = len(out) // 2 if half else len(out)
        out[:n] = x[:n] * 2
        return out

    x = np.ones(100)
    with CallableMeasurer(
        f, (x, np.empty(100)), reference=x * 2, output_arg=1, isolation="inprocess", timing=FAST
    ) as m:
        assert m.measure({"half": False}).ok
        assert m.measure({"half": True}).status == "incorrect"  # stale values would have passed

    def g(acc, *, step):
        acc += step
        return acc

    with CallableMeasurer(
        g, (np.zeros(4),), reference=np.ones(4), mutated=(0,), isolation="inprocess", timing=FAST
    ) as m:
        assert m.measure({"step": 1.0}).ok


def test_unpicklable_callable_in_process_mode_says_so():
    from tuner.measure import WorkerSetupError

    with (
        CallableMeasurer(lambda *, k: k, isolation="process", timing=FAST) as m,
        pytest.raises(WorkerSetupError, match="picklable"),
    ):
        m.measure({"k": 1})


# ---- kernels through tune_kernel ---------------------------------------------------------------------
def _space(problem, device, backend):
    return SearchSpace([IntRange("block", 1, 8)], name="toy_blocks")


def _inputs(problem, backend, seed):
    return {"x": np.random.default_rng(seed).standard_normal(problem["n"]) + 2.0}


def _reference(problem, inputs):
    return np.sqrt(np.abs(inputs["x"]))


def _run(problem, backend, inputs, config):
    b = config["block"]
    if b == 5:
        raise NotImplementedError("block 5 cannot be lowered")
    out = None
    for _ in range(b * b):  # much more work for larger blocks: block 1 is fastest, then block 2
        out = np.sqrt(np.abs(inputs["x"]))
    if b == 1:
        out = out + 1.0  # ... but wrong
    return out


def _flops(p):
    return float(p["n"])


def _tol(dtype):
    return (1e-9, 1e-9)


BLOCKS = KernelSpec(
    name="toy_blocks",
    description="toy",
    backends=("triton",),
    dtypes=("float64",),
    default_problem={"n": 20000, "dtype": "float64"},
    shape_fields=("n",),
    space=_space,
    make_inputs=_inputs,
    reference=_reference,
    run=_run,
    flops=_flops,
    bytes_moved=_flops,
    tolerance=_tol,
)


def test_a_kernel_measurer_without_a_device_detects_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """device=None (the default) detects the device, for its kind and its arch alike."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    m = KernelMeasurer(BLOCKS, None, "triton", timing=FAST, isolation="inprocess")
    assert m.arch == "cpu"


def test_tune_kernel_stores_every_trial_and_picks_the_fastest_correct(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    m = KernelMeasurer(BLOCKS, None, "triton", device="cpu", timing=FAST, isolation="inprocess")
    res = tune_kernel(
        BLOCKS,
        None,
        backend="triton",
        device="cpu",
        budget=8,
        strategy="random",
        seed=0,
        storage=url,
        measurer=m,
        finalists=3,
    )
    assert len(res.trials) == 8
    st = {t.config["block"]: t.status for t in res.trials}
    assert st[1] == "incorrect" and st[5] == "compile_error"
    assert sum(s == "ok" for s in st.values()) == 6
    assert res.tflops is not None and res.tflops > 0
    assert res.device == "cpu" and res.best.backend == "cpu-interpreter"
    rows = ResultStore(url).measurements(kernel="toy_blocks")
    trials = [r for r in rows if r.stats.get("phase") != "final"]
    finals = [r for r in rows if r.stats.get("phase") == "final"]
    assert len(trials) == 8 and len(finals) == 3
    # the winner is a re-measured finalist that is correct: block 1, the fastest, is wrong. Which correct
    # block wins is a CPU timing (block 2 does 4 passes, block 3 nine): on a loaded 2-core machine the two
    # can swap, so the test does not name it (choose_winner has its own tests above)
    assert res.best_config in [r.config for r in finals] and res.best_config["block"] not in (1, 5)
    assert all(r.status == "ok" for r in finals)
    assert all(r.versions == software_versions() for r in rows)
    bad = next(r for r in trials if r.config["block"] == 5)
    assert bad.status == "compile_error" and "cannot be lowered" in bad.error
    # a second task of the same kernel gets the first one's measurements as its prior
    res2 = tune_kernel(
        BLOCKS,
        {"n": 10000, "dtype": "float64"},
        backend="triton",
        device="cpu",
        budget=2,
        strategy="random",
        storage=url,
        measurer=m,
        finalists=1,
    )
    assert res2.info["task_id"] != res.info["task_id"]
    m.close()


def test_precompile_finds_failures_in_parallel_and_measure_reuses_them():
    with KernelMeasurer(
        BLOCKS, None, "triton", device="cpu", timing=FAST, settings=WorkerSettings(compile_timeout_s=20)
    ) as m:
        fails = m.precompile([{"block": b} for b in range(1, 9)], jobs=2)
        assert {json.loads(k)["block"]: r.status for k, r in fails.items()} == {
            1: "incorrect",
            5: "compile_error",
        }
        r = m.measure({"block": 5})
        assert r is fails[json.dumps({"block": 5})]
        assert m.measure({"block": 3}).ok


def test_version_lookup_does_not_import_frameworks():
    code = (
        "import sys; from tuner.tune import software_versions; v = software_versions(); "
        "print(sorted(v), [m for m in ('torch', 'jax', 'triton') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": repo_pythonpath()},
        encoding="utf-8",
    ).stdout
    assert out.strip().endswith("[]"), out
    assert "torch" in out


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers where PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_worker_dies_with_its_parent(tmp_path):
    """Kill the tuning process with SIGKILL mid-measurement: its worker must not outlive it."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        from tuner.measure import CallableMeasurer, WorkerSettings
        def hang(*, k):
            time.sleep(60)
        if __name__ == "__main__":
            m = CallableMeasurer(hang, settings=WorkerSettings(compile_timeout_s=120))
            w = m._remote()
            print(w.proc.pid, flush=True)
            m.measure({"k": 1})
    """),
        encoding="utf-8",
    )
    p = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": repo_pythonpath(), "TMPDIR": str(tmp_path)},
        encoding="utf-8",
    )
    wpid = int(p.stdout.readline())
    os.kill(wpid, 0)  # alive
    time.sleep(0.3)
    p.kill()
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        if not _running(wpid):
            break
        time.sleep(0.1)
    else:
        os.kill(wpid, 9)
        pytest.fail("the worker outlived its parent")


def test_tune_kernel_with_precompile_keeps_statuses():
    m = KernelMeasurer(BLOCKS, None, "triton", device="cpu", timing=FAST)
    with m:
        res = tune_kernel(
            BLOCKS,
            None,
            backend="triton",
            device="cpu",
            budget=8,
            strategy="random",
            measurer=m,
            precompile=2,
            finalists=2,
        )
    st = {t.config["block"]: t.status for t in res.trials}
    assert st[1] == "incorrect" and st[5] == "compile_error" and res.best_config == {"block": 2}


class _Counting(KernelMeasurer):
    calls = 0

    def measure(self, config):
        type(self).calls += 1
        return super().measure(config)


def test_tune_kernel_resumes_from_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'resume.db'}"
    m = _Counting(BLOCKS, None, "triton", device="cpu", timing=FAST, isolation="inprocess")
    first = tune_kernel(
        BLOCKS,
        None,
        backend="triton",
        device="cpu",
        budget=4,
        strategy="random",
        seed=3,
        storage=url,
        measurer=m,
        finalists=1,
    )
    assert _Counting.calls == 4
    again = tune_kernel(
        BLOCKS,
        None,
        backend="triton",
        device="cpu",
        budget=7,
        strategy="random",
        seed=3,
        storage=url,
        measurer=m,
        finalists=1,
    )
    assert _Counting.calls == 7  # the first 4 were not measured again
    assert [t.number for t in again.trials] == list(range(7))
    assert [t.config for t in again.trials[:4]] == [t.config for t in first.trials]
    assert [t.status for t in again.trials[:4]] == [t.status for t in first.trials]
    for old, new in zip(first.trials, again.trials[:4], strict=True):
        assert new.result.median == old.result.median and new.result.error == old.result.error
    rows = [r for r in ResultStore(url).measurements(kernel="toy_blocks") if r.stats.get("phase") != "final"]
    assert len(rows) == 7 and len({json.dumps(r.config, sort_keys=True) for r in rows}) == 7
    m.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's default here")
def _run_script(script, *, tmpdir):
    """Run `script` in a fresh interpreter with TMPDIR=`tmpdir`; the JSON of its last line of output."""
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": repo_pythonpath(), "TMPDIR": str(tmpdir)},
        encoding="utf-8",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_worker_preload_keeps_the_users_forkserver_preload(tmp_path):
    """`WorkerSettings.preload` adds to the fork server's preload list for the server tuner starts; the
    list the user set (`multiprocessing.set_forkserver_preload`) is theirs again afterwards, and their
    modules are preloaded too."""
    script = tmp_path / "preload.py"
    script.write_text(
        textwrap.dedent("""
        import json, multiprocessing, sys
        from multiprocessing import forkserver
        from tuner.measure import CallableMeasurer, TimingOptions, WorkerSettings

        def probe(*, k):
            return [m in sys.modules for m in ("colorsys", "netrc")]

        if __name__ == "__main__":
            multiprocessing.set_forkserver_preload(["__main__", "colorsys"])  # the user's
            settings = WorkerSettings(start_method="forkserver", preload=("netrc",))
            timing = TimingOptions(warmup=0, budget_ms=1.0, min_reps=1, max_reps=2, interleave_rounds=1,
                                   interleave_reps=1)
            m = CallableMeasurer(probe, timing=timing, settings=settings)
            w = m._remote()
            w.ensure()
            with multiprocessing.get_context("forkserver").Pool(1) as pool:  # forked from that server
                loaded = pool.apply(probe, (), {"k": 1})
            print(json.dumps({"preload": forkserver._forkserver._preload_modules, "loaded": loaded}))
    """),
        encoding="utf-8",
    )
    got = _run_script(script, tmpdir=tmp_path)
    assert got["preload"] == ["__main__", "colorsys"]  # the user's setting, as they left it
    assert got["loaded"] == [True, True]  # the server tuner started preloaded both


def test_workers_start_under_a_temp_folder_too_long_for_the_fork_servers_socket(tmp_path):
    """A long TMPDIR (a job scheduler's per-job folder, a test runner's) put the fork server's socket past
    Linux's 107-byte AF_UNIX limit: every worker failed to start ("AF_UNIX path too long"), every trial
    failed, and closing the measurer then raised on the process that never started."""
    long_tmp = tmp_path / ("t" * 40) / ("m" * 40)
    long_tmp.mkdir(parents=True)
    assert len(str(long_tmp)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") > 107
    script = tmp_path / "long_tmp.py"
    script.write_text(
        textwrap.dedent("""
        import json, tempfile
        import numpy as np
        from tuner.measure import CallableMeasurer, TimingOptions, WorkerSettings

        def double(x, *, k):
            return x * k

        if __name__ == "__main__":
            timing = TimingOptions(warmup=0, budget_ms=1.0, min_reps=1, max_reps=2, interleave_rounds=1,
                                   interleave_reps=1)
            x = np.ones(8)
            with CallableMeasurer(double, (x,), reference=x * 2, timing=timing,
                                  settings=WorkerSettings(start_method="forkserver")) as m:
                r = m.measure({"k": 2})
            print(json.dumps({"status": r.status, "error": r.error, "tmp": tempfile.gettempdir()}))
    """),
        encoding="utf-8",
    )
    got = _run_script(script, tmpdir=long_tmp)
    assert got["tmp"] == str(long_tmp)  # the user's TMPDIR itself is left as it is
    assert got["status"] == "ok", got
