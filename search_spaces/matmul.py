"""Search spaces of the matmul kernel (C = act(A @ B + bias)), Triton and Pallas.

Problem: {"M", "N", "K", "dtype", "bias": bool, "activation": "none"|"relu"|"gelu"}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._gemm import (
    cdiv,
    dtype_bytes,
    next_pow2,
    pallas_tile_params,
    sublane_multiple,
    tile_fits_problem,
    tpu_tiling_constraint,
    triton_gemm_suggested,
    triton_resource_constraints,
    triton_tile_params,
    vmem_constraint,
)
from ._space import Constraint, SearchSpace
from .devices import Device

__all__ = [
    "matmul_space",
    "triton_matmul_space",
    "pallas_matmul_space",
    "split_k_constraint",
    "group_m_constraint",
]


def split_k_constraint(K: int) -> Constraint:
    """Every K split must own at least one BLOCK_K tile (else it only adds zeros)."""

    def check(c: Mapping[str, Any]) -> bool | str:
        tiles = cdiv(K, int(c["BLOCK_K"]))
        s = int(c["SPLIT_K"])
        return True if s <= tiles else f"SPLIT_K={s} > {tiles} K tiles (K={K}, BLOCK_K={c['BLOCK_K']})"

    return Constraint("SPLIT_K <= cdiv(K, BLOCK_K)", check, ("SPLIT_K", "BLOCK_K"))


def group_m_constraint(M: int) -> Constraint:
    """A group taller than the grid's M tiles (rounded up to a power of two) changes nothing."""

    def check(c: Mapping[str, Any]) -> bool | str:
        g = int(c["GROUP_M"])
        tiles = next_pow2(cdiv(M, int(c["BLOCK_M"])))
        return (
            True
            if g == 1 or g <= tiles
            else (
                f"GROUP_M={g} > {tiles} (M tiles={cdiv(M, int(c['BLOCK_M']))} for M={M}, BLOCK_M={c['BLOCK_M']})"
            )
        )

    return Constraint("GROUP_M <= next_pow2(M tiles)", check, ("GROUP_M", "BLOCK_M"))


def triton_matmul_space(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    M, N, K = int(problem["M"]), int(problem["N"]), int(problem["K"])
    nbytes = dtype_bytes(str(problem.get("dtype", "float16")))
    params = triton_tile_params(device)
    constraints = [
        tile_fits_problem("BLOCK_M", "M", M, 16),
        tile_fits_problem("BLOCK_N", "N", N, 16),
        tile_fits_problem("BLOCK_K", "K", K, 16),
        split_k_constraint(K),
        group_m_constraint(M),
        *triton_resource_constraints(device, nbytes, nbytes),
    ]
    return SearchSpace(
        params, constraints, name=f"matmul/triton/{device.arch}", suggested=triton_gemm_suggested(device)
    )


def pallas_matmul_space(problem: Mapping[str, Any], device: Device) -> SearchSpace:
    M, N, K = int(problem["M"]), int(problem["N"]), int(problem["K"])
    dtype = str(problem.get("dtype", "float16"))
    nbytes = dtype_bytes(dtype)
    params = pallas_tile_params(device)
    tpu = device.kind == "tpu"
    sub = sublane_multiple(dtype) if tpu else 8 if device.kind == "cpu" else 16
    lane = 128 if tpu else 16
    constraints = [
        tile_fits_problem("bm", "M", M, sub),
        tile_fits_problem("bn", "N", N, lane),
        tile_fits_problem("bk", "K", K, lane),
        *triton_resource_constraints(device, nbytes, nbytes, names=("bm", "bn", "bk")),
    ]
    if tpu:
        constraints.append(tpu_tiling_constraint(("bm",), ("bn", "bk"), sub))

        def need(c: Mapping[str, Any]) -> int:
            bm, bn, bk = int(c["bm"]), int(c["bn"]), int(c["bk"])
            blocks = bm * bk * nbytes + bk * bn * nbytes + bm * bn * nbytes + bn * 4
            return 2 * blocks + bm * bn * 4

        constraints.append(vmem_constraint(device, need, ("bm", "bn", "bk")))
    return SearchSpace(params, constraints, name=f"matmul/pallas/{device.arch}")


def matmul_space(problem: Mapping[str, Any], device: Device, backend: str = "triton") -> SearchSpace:
    if backend == "triton":
        return triton_matmul_space(problem, device)
    if backend == "pallas":
        return pallas_matmul_space(problem, device)
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")
