"""Search spaces of the int8 weight-only matmul (C = act((X @ W_int8) * scale + bias)), Triton and Pallas.

Problem: {"M", "N", "K", "dtype" (of X and C), "bias": bool, "activation"}; W is int8, scale fp32.
The constraints are the matmul ones with 1-byte B tiles, plus (Triton) the registers of the
dequantised B tile and (TPU) the 32-row sublane packing of int8 for the K rows of W.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._gemm import (
    dtype_bytes,
    pallas_tile_params,
    sublane_multiple,
    tile_fits_problem,
    tpu_tiling_constraint,
    triton_resource_constraints,
    triton_tile_params,
    vmem_constraint,
)
from ._space import SearchSpace
from .devices import Device
from .matmul import group_m_constraint, split_k_constraint

__all__ = ["int8_matmul_space"]


def _triton(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    M, N, K = int(problem["M"]), int(problem["N"]), int(problem["K"])
    xb = dtype_bytes(str(problem.get("dtype", "float16")))
    constraints = [
        tile_fits_problem("BLOCK_M", "M", M, 16),
        tile_fits_problem("BLOCK_N", "N", N, 16),
        tile_fits_problem("BLOCK_K", "K", K, 16),
        split_k_constraint(K),
        group_m_constraint(M),
        # the int8 B tile is converted to X's dtype in registers before the dot
        *triton_resource_constraints(device, xb, 1, b_in_registers_extra=xb / 4),
    ]
    return SearchSpace(triton_tile_params(device), constraints, name=f"int8_matmul/triton/{device.arch}")


def _pallas(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    M, N, K = int(problem["M"]), int(problem["N"]), int(problem["K"])
    dtype = str(problem.get("dtype", "float16"))
    xb = dtype_bytes(dtype)
    tpu = device.kind == "tpu"
    sub = sublane_multiple(dtype) if tpu else 8 if device.kind == "cpu" else 16
    lane = 128 if tpu else 16
    constraints = [
        tile_fits_problem("bm", "M", M, sub),
        tile_fits_problem("bn", "N", N, lane),
        tile_fits_problem("bk", "K", K, lane),
        *triton_resource_constraints(device, xb, 1, b_in_registers_extra=xb / 4, names=("bm", "bn", "bk")),
    ]
    if tpu:
        # bm rows of X (sublanes of X's dtype); bk is both X's lane dim and W's int8 row dim
        constraints.append(tpu_tiling_constraint(("bm",), ("bn", "bk"), sub))
        constraints.append(tpu_tiling_constraint(("bk",), (), sublane_multiple("int8")))

        def need(c: Mapping[str, Any]) -> int:
            bm, bn, bk = int(c["bm"]), int(c["bn"]), int(c["bk"])
            # blocks (double-buffered) + the fp32 accumulator + W's block converted to X's dtype
            blocks = bm * bk * xb + bk * bn + bm * bn * xb + 2 * bn * 4
            return 2 * blocks + bm * bn * 4 + bk * bn * xb

        constraints.append(vmem_constraint(device, need, ("bm", "bn", "bk")))
    return SearchSpace(pallas_tile_params(device), constraints, name=f"int8_matmul/pallas/{device.arch}")


def int8_matmul_space(problem: Mapping[str, Any], device: Device, backend: str = "triton") -> SearchSpace:
    if backend == "triton":
        return _triton(problem, device)
    if backend == "pallas":
        return _pallas(problem, device)
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")
