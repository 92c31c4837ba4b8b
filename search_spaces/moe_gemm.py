"""Search spaces of the MoE grouped GEMM (out[rows of e] = x[rows of e] @ w[e]), Triton and Pallas.

Problem: {"T" (routed token rows), "K", "N", "E" (experts), "dtype"} (+ optional "group_sizes").
Triton: BLOCK_M/BLOCK_N/BLOCK_K, num_warps, num_stages (a program's M tile never crosses an expert
boundary, so there is no GROUP_M or SPLIT_K). Pallas on TPU: bm/bn/bk; the grid order is fixed to
(N tiles, visits, K tiles), because a row tile shared by two experts must be visited on consecutive
grid steps for its output block to stay resident in VMEM. Pallas on NVIDIA: bm/bn/bk plus the
num_warps/num_stages compiler params (the kernel is the Triton one's structure).
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
    triton_gemm_suggested,
    triton_resource_constraints,
    triton_tile_params,
    vmem_constraint,
)
from ._space import SearchSpace
from .devices import Device

__all__ = ["moe_gemm_space"]


def _triton(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    T, N, K = int(problem["T"]), int(problem["N"]), int(problem["K"])
    nbytes = dtype_bytes(str(problem.get("dtype", "float16")))
    constraints = [
        tile_fits_problem("BLOCK_M", "T", T, 16),
        tile_fits_problem("BLOCK_N", "N", N, 16),
        tile_fits_problem("BLOCK_K", "K", K, 16),
        *triton_resource_constraints(device, nbytes, nbytes),
    ]
    params = triton_tile_params(device, split_k=False, group_m=False)
    return SearchSpace(
        params, constraints, name=f"moe_gemm/triton/{device.arch}", suggested=triton_gemm_suggested(device)
    )


def _pallas(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    T, N, K = int(problem["T"]), int(problem["N"]), int(problem["K"])
    dtype = str(problem.get("dtype", "float16"))
    nbytes = dtype_bytes(dtype)
    tpu = device.kind == "tpu"
    sub = sublane_multiple(dtype) if tpu else 8 if device.kind == "cpu" else 16
    lane = 128 if tpu else 16
    constraints = [
        tile_fits_problem("bm", "T", T, sub),
        tile_fits_problem("bn", "N", N, lane),
        tile_fits_problem("bk", "K", K, lane),
        *triton_resource_constraints(device, nbytes, nbytes, names=("bm", "bn", "bk")),
    ]
    if tpu:
        constraints.append(tpu_tiling_constraint(("bm",), ("bn", "bk"), sub))

        def need(c: Mapping[str, Any]) -> int:
            bm, bn, bk = int(c["bm"]), int(c["bn"]), int(c["bk"])
            return 2 * (bm * bk + bk * bn + bm * bn) * nbytes + bm * bn * 4

        constraints.append(vmem_constraint(device, need, ("bm", "bn", "bk")))
    params = pallas_tile_params(device, grid_order=False)
    return SearchSpace(params, constraints, name=f"moe_gemm/pallas/{device.arch}")


def moe_gemm_space(problem: Mapping[str, Any], device: Device, backend: str = "triton") -> SearchSpace:
    if backend == "triton":
        return _triton(problem, device)
    if backend == "pallas":
        return _pallas(problem, device)
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")
