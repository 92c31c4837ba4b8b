"""The CPU twins of the device backends: a real Triton kernel under the Triton interpreter and a real
Pallas kernel with interpret=True, measured in worker processes and labelled "cpu-interpreter"."""

from __future__ import annotations

import numpy as np
import pytest
from tuner.kernels import KernelSpec
from tuner.search_spaces import Categorical, PowerOfTwo, SearchSpace

from tuner.measure import KernelMeasurer, TimingOptions, WorkerSettings
from tuner.tune import tune_kernel

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
torch = pytest.importorskip("torch")

FAST = TimingOptions(warmup=0, budget_ms=1.0, min_reps=2, max_reps=3, interleave_rounds=2, interleave_reps=1)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, SKIP_TAIL: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if SKIP_TAIL:  # a buggy variant: drops the last partial block
        mask = mask & (pid * BLOCK + BLOCK <= n)
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + 1.0, mask=mask)


def _space(problem, device, backend):
    return SearchSpace([PowerOfTwo("BLOCK", 32, 128), Categorical("SKIP_TAIL", [False, True])])


def _inputs(problem, backend, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(problem["n"], generator=g)
    return {"x": x, "out": torch.empty_like(x)}


def _reference(problem, inputs):
    return inputs["x"].double().numpy() * 2.0 + 1.0


def _run(problem, backend, inputs, config):
    n = problem["n"]
    grid = (triton.cdiv(n, config["BLOCK"]),)
    _scale_kernel[grid](inputs["x"], inputs["out"], n, BLOCK=config["BLOCK"], SKIP_TAIL=config["SKIP_TAIL"])
    return inputs["out"]


def _flops(p):
    return 2.0 * p["n"]


def _tol(dtype):
    return (1e-5, 1e-5)


SCALE = KernelSpec(
    name="toy_triton_scale",
    description="x*2+1",
    backends=("triton",),
    dtypes=("float32",),
    default_problem={"n": 1000, "dtype": "float32"},
    shape_fields=("n",),
    space=_space,
    make_inputs=_inputs,
    reference=_reference,
    run=_run,
    flops=_flops,
    bytes_moved=_flops,
    tolerance=_tol,
    output_buffer="out",
)


def test_triton_interpreter_in_a_worker():
    res = tune_kernel(
        SCALE,
        None,
        backend="triton",
        device="cpu",
        budget=6,
        strategy="random",
        measurer=KernelMeasurer(
            SCALE, None, "triton", device="cpu", timing=FAST, settings=WorkerSettings(compile_timeout_s=60)
        ),
        finalists=2,
    )
    by = {(t.config["BLOCK"], t.config["SKIP_TAIL"]): t for t in res.trials}
    assert len(by) == 6
    for (block, skip), t in by.items():
        # n=1000 is not a multiple of any block: skipping the tail leaves poisoned (NaN) elements
        assert t.status == ("incorrect" if skip else "ok"), (block, skip, t.result)
        if not skip:
            assert t.result.backend == "cpu-interpreter" and t.result.max_abs_error < 1e-5
    assert res.best_config["SKIP_TAIL"] is False


# ---- Pallas, interpret mode --------------------------------------------------------------------------
def _p_space(problem, device, backend):
    return SearchSpace([PowerOfTwo("block", 8, 32)])


def _p_inputs(problem, backend, seed):
    import jax.numpy as jnp

    return {"x": jnp.asarray(np.random.default_rng(seed).standard_normal((64, 128)), dtype=jnp.float32)}


def _p_reference(problem, inputs):
    return np.asarray(inputs["x"], dtype=np.float64) * 3.0


def _p_run(problem, backend, inputs, config):
    import jax
    from jax.experimental import pallas as pl

    b = config["block"]

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3.0

    x = inputs["x"]
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // b,),
        in_specs=[pl.BlockSpec((b, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((b, 128), lambda i: (i, 0)),
        interpret=True,
    )(x)


TRIPLE = KernelSpec(
    name="toy_pallas_triple",
    description="x*3",
    backends=("pallas",),
    dtypes=("float32",),
    default_problem={"n": 64, "dtype": "float32"},
    shape_fields=("n",),
    space=_p_space,
    make_inputs=_p_inputs,
    reference=_p_reference,
    run=_p_run,
    flops=_flops,
    bytes_moved=_flops,
    tolerance=_tol,
)


def test_pallas_interpret_in_process():
    pytest.importorskip("jax")
    m = KernelMeasurer(TRIPLE, None, "pallas", device="cpu", timing=FAST, isolation="inprocess")
    r = m.measure({"block": 16})
    assert r.ok and r.backend == "cpu-interpreter" and r.extra["timer"] == "wall", r
    m.close()
