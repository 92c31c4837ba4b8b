"""int8_matmul: weight-only quantised matmul, C = act((X @ W) * scale[None, :] + bias).

X is fp16/bf16/fp32 (M, K); W is int8 (K, N); scale is fp32 per output channel (N,); accumulation in
fp32; C has X's dtype. Problem: {"M", "N", "K", "dtype" (of X), "bias": bool, "activation"}.

Backends (same kernels as `matmul`, with an int8 B operand):
- triton: the int8 tile is loaded (1 byte/element from memory: the point of weight-only quantisation),
  converted to X's dtype in registers (exact: |w| <= 127) and fed to `tl.dot`; the scale is applied once
  to the fp32 accumulator in the epilogue (or in the split-K reduce kernel). Parameters as matmul.
  Interpreter: bf16 tiles (and the converted weights) are upcast to fp32 before `tl.dot`.
- pallas: int8 W blocks converted to X's dtype per block; scale/bias/activation applied to the fp32
  accumulator once (last K step on TPU; after the K loop in the NVIDIA structure, which takes num_warps and
  num_stages).

Reference: float64 numpy, (X @ W) * scale + bias, then the activation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import Device, SearchSpace
from tuner.search_spaces.int8_matmul import int8_matmul_space

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
from .matmul import check_problem as _check_matmul

__all__ = ["SPEC", "int8_matmul_triton", "int8_matmul_pallas", "quantize_per_channel"]

DEFAULT_PROBLEM = {"M": 50, "N": 40, "K": 70, "dtype": "float16", "bias": True, "activation": "relu"}


def _check(problem: Mapping[str, Any]) -> dict[str, Any]:
    return _check_matmul({**DEFAULT_PROBLEM, **problem})


def quantize_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 quantisation of a float (K, N) weight: (int8 W, fp32 scale)."""
    amax = np.abs(w).max(axis=0).astype(np.float64)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.rint(w / scale[None, :]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def _space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return int8_matmul_space(_check(problem), device, backend)


def _make_inputs(problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    p = _check(problem)
    M, N, K = p["M"], p["N"], p["K"]
    rng = np.random.default_rng(seed)
    x = hostile_rows(random_array(rng, (M, K)), rng, p["dtype"], HOSTILE_LARGE)
    w, scale = quantize_per_channel(random_array(rng, (K, N), 1.0 / math.sqrt(K)))
    w[w == 0] = 1  # never zeros
    host: dict[str, np.ndarray] = {"x": x, "w": w, "scale": scale}
    if p["bias"]:
        host["bias"] = random_array(rng, (N,))
    if backend == "triton":
        import torch

        dev, dt = torch_device(), torch_dtype(p["dtype"])
        out: dict[str, Any] = {
            "x": torch.from_numpy(x).to(device=dev, dtype=dt),
            "w": torch.from_numpy(w).to(dev),
            "scale": torch.from_numpy(scale).to(dev),
        }
        if p["bias"]:
            out["bias"] = torch.from_numpy(host["bias"]).to(device=dev, dtype=dt)
        out["out"] = torch.empty((M, N), dtype=dt, device=dev)
        return out
    if backend == "pallas":
        import jax.numpy as jnp

        res: dict[str, Any] = {
            "x": jnp.asarray(x, dtype=jnp_dtype(p["dtype"])),
            "w": jnp.asarray(w),
            "scale": jnp.asarray(scale),
        }
        if p["bias"]:
            res["bias"] = jnp.asarray(host["bias"], dtype=jnp_dtype(p["dtype"]))
        return res
    raise ValueError(f"unknown backend {backend!r}")


def _reference(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    p = _check(problem)
    acc = to_numpy(inputs["x"]).astype(np.float64) @ to_numpy(inputs["w"]).astype(np.float64)
    acc = acc * to_numpy(inputs["scale"]).astype(np.float64)[None, :]
    if p["bias"]:
        acc = acc + to_numpy(inputs["bias"]).astype(np.float64)[None, :]
    return activation_np(acc, p["activation"])


def _error_bound(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    p = _check(problem)
    scale = inputs["scale"]
    scale = scale.abs() if hasattr(scale, "detach") else abs(scale)
    abs_sum = abs_product(inputs["x"], inputs["w"]) * scale[None, :]
    return fp32_sum_bound(abs_sum, p["K"], ACTIVATION_SLOPE[p["activation"]])


def int8_matmul_triton(
    x: Any, w: Any, scale: Any, bias: Any = None, activation: str = "none", out: Any = None, **config: Any
) -> Any:
    """The Triton launcher (kernels._matmul_triton.int8_matmul); config = the space's parameters."""
    prepare_triton()
    from . import _matmul_triton

    return _matmul_triton.int8_matmul(x, w, scale, bias, activation, out, **config)


def int8_matmul_pallas(
    x: Any, w: Any, scale: Any, bias: Any = None, activation: str = "none", **config: Any
) -> Any:
    """The Pallas launcher (kernels._matmul_pallas.int8_matmul); config = the space's parameters."""
    from . import _matmul_pallas

    return _matmul_pallas.int8_matmul(x, w, scale, bias, activation, **config)


def _run(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    p = _check(problem)
    args = (inputs["x"], inputs["w"], inputs["scale"], inputs.get("bias"), p["activation"])
    if backend == "triton":
        return int8_matmul_triton(*args, inputs.get("out"), **config)
    if backend == "pallas":
        return int8_matmul_pallas(*args, **config)
    raise ValueError(f"unknown backend {backend!r}")


def _flops(problem: Mapping[str, Any]) -> float:
    p = _check(problem)
    epi = 1 + (1 if p["bias"] else 0) + {"none": 0, "relu": 1, "gelu": 8}[p["activation"]]
    return 2.0 * p["M"] * p["N"] * p["K"] + epi * p["M"] * p["N"]


def _bytes(problem: Mapping[str, Any]) -> float:
    p = _check(problem)
    e = {"float32": 4, "float16": 2, "bfloat16": 2}[p["dtype"]]
    M, N, K = p["M"], p["N"], p["K"]
    return float(e * (M * K + M * N + (N if p["bias"] else 0)) + K * N + 4 * N)


SPEC = register(
    KernelSpec(
        name="int8_matmul",
        description="weight-only int8 matmul: act((X @ W_int8) * per-channel scale + bias), fp32 accumulation",
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
        check_problem=_check,
        error_bound=_error_bound,
        output_buffer="out",
        extra={"flags": {"bias": [False, True], "activation": list(ACTIVATIONS)}, "weight_dtype": "int8"},
    )
)
