"""Fault injection on CPU: configs that raise, return NaN, hang, kill their process, segfault, write a
wrong or partial output, or mutate their input. The tuning run must finish, each config must get the
right status, no finished trial may be lost, and the winner must be a correct config.

The toy kernel is module-level so that worker processes can import it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import numpy as np
import pytest
from tuner.kernels import KernelSpec
from tuner.search_spaces import Categorical, SearchSpace

from tuner.measure import KernelMeasurer, TimingOptions, WorkerSettings
from tuner.store import ResultStore
from tuner.tune import tune_kernel

N = 200_000

# variant -> the status it must get
EXPECTED = {
    "good": "ok",
    "good_slow": "ok",
    "wrong": "incorrect",  # fastest of all, and wrong
    "partial": "incorrect",  # writes half of the output buffer
    "nan": "incorrect",
    "mutate": "incorrect",  # right output, but scribbles on an input it does not declare
    "raise": "crashed",
    "compile": "compile_error",
    "memory": "out_of_resources",
    "sleep": "timeout",  # hangs in its first call (the compile deadline)
    "hang_later": "timeout",  # first call fine, hangs while being timed (the run deadline)
    "exit": "crashed",  # os._exit
    "segfault": "crashed",  # ctypes.string_at(0)
    "killed": "out_of_resources",  # SIGKILL from outside (what the OOM killer does)
}


_CALLS: dict[str, int] = {}  # per process


class CompilationError(Exception):
    """Named like Triton's compiler error."""


def _space(problem, device, backend):
    return SearchSpace([Categorical("variant", list(EXPECTED))], name="toy_faults")


def _make_inputs(problem, backend, seed):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal(problem["n"]).astype(np.float32) + 3.0,
        "out": np.empty(problem["n"], dtype=np.float32),
    }


def _reference(problem, inputs):
    return inputs["x"].astype(np.float64) * 2.0 + 1.0


def _run(problem, backend, inputs, config):
    x, out = inputs["x"], inputs["out"]
    v = config["variant"]
    if v == "hang_later":
        _CALLS[v] = _CALLS.get(v, 0) + 1
        if _CALLS[v] > 1:
            time.sleep(30)
        v = "good"
    if v in ("good", "good_slow", "mutate"):
        reps = 8 if v == "good_slow" else 1
        for _ in range(reps):
            np.multiply(x, 2.0, out=out)
            out += 1.0
        if v == "mutate":
            x *= 1.0001
    elif v == "wrong":
        out.fill(1.0)
    elif v == "partial":
        h = len(out) // 2
        np.multiply(x[:h], 2.0, out=out[:h])
        out[:h] += 1.0
    elif v == "nan":
        np.multiply(x, 2.0, out=out)
        out += 1.0
        out[17] = np.nan
    elif v == "raise":
        raise RuntimeError("boom")
    elif v == "compile":
        raise CompilationError("at 1:2: unsupported block shape")
    elif v == "memory":
        raise MemoryError("cannot allocate")
    elif v == "sleep":
        time.sleep(30)
    elif v == "exit":
        os._exit(7)
    elif v == "segfault":
        ctypes.string_at(0)
    elif v == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    return out


def _flops(p):
    return 2.0 * p["n"]


def _bytes(p):
    return 8.0 * p["n"]


def _tol(dtype):
    return (1e-6, 1e-6)


TOY = KernelSpec(
    name="toy_faults",
    description="fault injection",
    backends=("triton",),
    dtypes=("float32",),
    default_problem={"n": N, "dtype": "float32"},
    shape_fields=("n",),
    space=_space,
    make_inputs=_make_inputs,
    reference=_reference,
    run=_run,
    flops=_flops,
    bytes_moved=_bytes,
    tolerance=_tol,
    output_buffer="out",
)

FAST = TimingOptions(warmup=1, budget_ms=5.0, min_reps=3, max_reps=20, interleave_rounds=3, interleave_reps=3)
SHORT = WorkerSettings(compile_timeout_s=1.5, run_timeout_s=3.0, setup_timeout_s=60.0)


def test_tuning_survives_every_fault_and_picks_a_correct_config(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'faults.db'}")
    seen = []
    measurer = KernelMeasurer(TOY, None, "triton", device="cpu", timing=FAST, settings=SHORT)
    with measurer:
        res = tune_kernel(
            TOY,
            None,
            backend="triton",
            device="cpu",
            budget=len(EXPECTED),
            strategy="random",
            seed=1,
            storage=store,
            measurer=measurer,
            callback=seen.append,
            finalists=3,
        )
        starts = measurer.worker_starts

    # the run finished and measured every config exactly once; no finished trial is lost
    assert len(res.trials) == len(EXPECTED) == len(seen)
    got = {t.config["variant"]: t.status for t in res.trials}
    assert got == EXPECTED
    for t in res.trials:
        assert (t.value is not None) == (t.status == "ok")
        if t.status != "ok":
            assert t.result.error, t
    # the winner is a correct config, never the fast-but-wrong ones
    assert res.best_config is not None and res.best_config["variant"] in ("good", "good_slow")
    assert res.best is not None and res.best.ok and res.best.extra.get("interleaved")
    assert res.best_config["variant"] == "good"  # 8x less work than good_slow: far outside the noise band
    # the two hangs, os._exit, segfault and SIGKILL each cost one worker; the others reuse it
    assert starts == 1 + 5
    # every result is in the store with its status, statistics and error text
    rows = [m for m in store.measurements(kernel="toy_faults") if m.stats.get("phase") != "final"]
    assert len(rows) == len(EXPECTED)
    assert {m.config["variant"]: m.status for m in rows} == EXPECTED
    for m in rows:
        if m.status == "ok":
            assert m.value is not None and m.stats["median"] == m.value and m.stats["n"] >= 3
            assert m.error is None
        else:
            assert m.value is None and m.error
    seg = next(m for m in rows if m.config["variant"] == "segfault")
    assert "SIGSEGV" in seg.error
    assert "Segmentation fault" in seg.error and "_run" in seg.error  # the worker's faulthandler stack
    assert "Segmentation fault" not in next(m for m in rows if m.config["variant"] == "exit").error
    assert (
        next(m for m in rows if m.config["variant"] == "sleep").error
        == "compiling (first call) exceeded 1.5 s"
    )
    assert next(m for m in rows if m.config["variant"] == "hang_later").error == "timing exceeded 3 s"
    finals = [m for m in store.measurements(kernel="toy_faults") if m.stats.get("phase") == "final"]
    assert {m.config["variant"] for m in finals} == {"good", "good_slow"}


@pytest.mark.parametrize("variant", ["wrong", "partial", "nan", "mutate", "raise", "compile", "memory"])
def test_in_process_gate_catches_the_survivable_faults(variant):
    m = KernelMeasurer(TOY, None, "triton", device="cpu", timing=FAST, isolation="inprocess")
    r = m.measure({"variant": variant})
    assert r.status == EXPECTED[variant], r
    assert r.value is None and r.error
    # the session is still usable, and inputs were restored after the mutation
    good = m.measure({"variant": "good"})
    assert good.ok, good
    m.close()


# ---- a kernel that declares an in-place update: restored before every run -------------------------
def _acc_inputs(problem, backend, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(1000), "acc": np.ones(1000)}


def _acc_reference(problem, inputs):
    return inputs["acc"] + inputs["x"]


def _acc_run(problem, backend, inputs, config):
    inputs["acc"] += inputs["x"]  # in place, declared in mutated_inputs
    return inputs["acc"]


ACC = KernelSpec(
    name="toy_acc",
    description="in-place accumulate",
    backends=("triton",),
    dtypes=("float64",),
    default_problem={"n": 1000, "dtype": "float64"},
    shape_fields=("n",),
    space=lambda p, d, b: SearchSpace([Categorical("v", [0])]),
    make_inputs=_acc_inputs,
    reference=_acc_reference,
    run=_acc_run,
    flops=_flops,
    bytes_moved=_bytes,
    tolerance=_tol,
    mutated_inputs=("acc",),
)


def test_declared_mutated_inputs_are_restored_before_every_run():
    m = KernelMeasurer(ACC, None, "triton", device="cpu", timing=FAST, isolation="inprocess")
    r = m.measure({"v": 0})
    # without the restore, the last timed run would see acc advanced n times and fail the final check
    assert r.ok, r
    assert r.n >= 3
    m.close()
