"""matmul: C = act(A @ B + bias), fp16/bf16/fp32 inputs, fp32 accumulation, fused epilogue.

Problem: {"M", "N", "K", "dtype", "bias": bool, "activation": "none" | "relu" | "gelu"} (gelu is the
exact erf form). Output dtype = input dtype.

Backends:
- triton (`tuner.kernels._matmul_triton.matmul`): BLOCK_M/BLOCK_N/BLOCK_K tiles, GROUP_M grouped program
  ordering (L2 reuse), SPLIT_K (parallel split-K: fp32 partial sums in a workspace, then a reduce kernel
  that applies the epilogue -- deterministic, and correct for non-linear activations), num_warps,
  num_stages. Accepts a preallocated `out`. fp32 inputs use IEEE fp32 dot (no TF32).
  Interpreter: bf16 tiles are upcast to fp32 before `tl.dot` (numpy has no bf16); on GPU they are not.
- pallas (`tuner.kernels._matmul_pallas.matmul`): bm/bn/bk blocks, grid_order "mn"|"nm". On TPU (Mosaic): K as
  the sequential grid axis with a VMEM fp32 accumulator, dimension semantics and a VMEM limit sized to the
  blocks. On NVIDIA (Triton lowering, selected by the num_warps/num_stages compiler params of the sm80/sm90
  space): a 2-D grid of output tiles with a K loop of masked loads.

Reference: float64 numpy on the (rounded) inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import Device, SearchSpace
from tuner.search_spaces.matmul import matmul_space

from ._common import (
    ACTIVATION_SLOPE,
    ACTIVATIONS,
    DTYPES,
    HOSTILE_LARGE,
    abs_product,
    activation_np,
    default_tolerance,
    fp32_sum_bound,
    hostile_rows,
    jnp_dtype,
    prepare_triton,
    random_array,
    to_numpy,
    torch_device,
    torch_dtype,
)
from ._registry import KernelSpec, register

__all__ = ["SPEC", "matmul_triton", "matmul_pallas", "check_problem"]

DEFAULT_PROBLEM = {"M": 50, "N": 40, "K": 70, "dtype": "float16", "bias": True, "activation": "gelu"}


def check_problem(problem: Mapping[str, Any]) -> dict[str, Any]:
    """The problem with defaults filled in; ValueError naming the bad field otherwise."""
    p = {**DEFAULT_PROBLEM, **problem}
    for f in ("M", "N", "K"):
        if not isinstance(p[f], int) or isinstance(p[f], bool) or p[f] < 1:
            raise ValueError(f"{f}={p[f]!r} must be a positive int")
    if p["dtype"] not in DTYPES:
        raise ValueError(f"dtype={p['dtype']!r} must be one of {list(DTYPES)}")
    if p["activation"] not in ACTIVATIONS:
        raise ValueError(f"activation={p['activation']!r} must be one of {list(ACTIVATIONS)}")
    if not isinstance(p["bias"], bool):
        raise ValueError(f"bias={p['bias']!r} must be a bool")
    return p


def _space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return matmul_space(check_problem(problem), device, backend)


def _make_inputs(problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    p = check_problem(problem)
    M, N, K = p["M"], p["N"], p["K"]
    rng = np.random.default_rng(seed)
    # hostile rows of A (zeros, x64, subnormals): their output rows are zero, large or tiny
    a = hostile_rows(random_array(rng, (M, K)), rng, p["dtype"], HOSTILE_LARGE)
    host = {"a": a, "b": random_array(rng, (K, N), 1.0 / math.sqrt(K))}
    if p["bias"]:
        host["bias"] = random_array(rng, (N,))
    if backend == "triton":
        import torch

        dev, dt = torch_device(), torch_dtype(p["dtype"])
        out: dict[str, Any] = {k: torch.from_numpy(v).to(device=dev, dtype=dt) for k, v in host.items()}
        out["out"] = torch.empty((M, N), dtype=dt, device=dev)
        return out
    if backend == "pallas":
        import jax.numpy as jnp

        return {k: jnp.asarray(v, dtype=jnp_dtype(p["dtype"])) for k, v in host.items()}
    raise ValueError(f"unknown backend {backend!r}")


def _reference(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    p = check_problem(problem)
    acc = to_numpy(inputs["a"]).astype(np.float64) @ to_numpy(inputs["b"]).astype(np.float64)
    if p["bias"]:
        acc = acc + to_numpy(inputs["bias"]).astype(np.float64)[None, :]
    return activation_np(acc, p["activation"])


def _error_bound(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    p = check_problem(problem)
    return fp32_sum_bound(abs_product(inputs["a"], inputs["b"]), p["K"], ACTIVATION_SLOPE[p["activation"]])


def matmul_triton(
    a: Any, b: Any, bias: Any = None, activation: str = "none", out: Any = None, **config: Any
) -> Any:
    """The Triton launcher (see kernels._matmul_triton.matmul); config = the space's parameters."""
    prepare_triton()
    from . import _matmul_triton

    return _matmul_triton.matmul(a, b, bias, activation, out, **config)


def matmul_pallas(a: Any, b: Any, bias: Any = None, activation: str = "none", **config: Any) -> Any:
    """The Pallas launcher (see kernels._matmul_pallas.matmul); config = the space's parameters."""
    from . import _matmul_pallas

    return _matmul_pallas.matmul(a, b, bias, activation, **config)


def _run(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    p = check_problem(problem)
    if backend == "triton":
        return matmul_triton(
            inputs["a"], inputs["b"], inputs.get("bias"), p["activation"], inputs.get("out"), **config
        )
    if backend == "pallas":
        return matmul_pallas(inputs["a"], inputs["b"], inputs.get("bias"), p["activation"], **config)
    raise ValueError(f"unknown backend {backend!r}")


def _flops(problem: Mapping[str, Any]) -> float:
    p = check_problem(problem)
    epi = (1 if p["bias"] else 0) + {"none": 0, "relu": 1, "gelu": 8}[p["activation"]]
    return 2.0 * p["M"] * p["N"] * p["K"] + epi * p["M"] * p["N"]


def _bytes(problem: Mapping[str, Any]) -> float:
    p = check_problem(problem)
    e = {"float32": 4, "float16": 2, "bfloat16": 2}[p["dtype"]]
    return float(e * (p["M"] * p["K"] + p["K"] * p["N"] + p["M"] * p["N"] + (p["N"] if p["bias"] else 0)))


SPEC = register(
    KernelSpec(
        name="matmul",
        description="C = act(A @ B + bias): fp32 accumulation, fused bias + relu/gelu epilogue, "
        "grouped ordering and split-K (Triton)",
        backends=("triton", "pallas"),
        dtypes=DTYPES,
        default_problem=DEFAULT_PROBLEM,
        shape_fields=("M", "N", "K"),
        space=_space,
        make_inputs=_make_inputs,
        reference=_reference,
        run=_run,
        flops=_flops,
        bytes_moved=_bytes,
        tolerance=default_tolerance,
        check_problem=check_problem,
        error_bound=_error_bound,
        output_buffer="out",
        extra={"flags": {"bias": [False, True], "activation": list(ACTIVATIONS)}},
    )
)
