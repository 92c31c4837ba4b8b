"""Triton MoE grouped GEMM: one launch for all experts. Imported lazily (after `prepare_triton()`).

Rows of `x` are sorted by expert (`group_sizes[e]` consecutive rows for expert e). The grid is
(cdiv(T, BLOCK_M) + E, cdiv(N, BLOCK_N)): an upper bound on the number of row tiles when every expert's
rows are cut into tiles of their own (a tile never spans two experts). Each program walks the E group
sizes to find its expert and row range (no host sync, no metadata launch); programs past the last tile
exit at once.

Interpreter note: bf16 tiles are upcast to fp32 before `tl.dot` under TRITON_INTERPRET=1 (numpy has no
bfloat16); not on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import triton_interpreted, wide_offsets

__all__ = ["moe_gemm"]


@triton.jit
def _moe_kernel(
    x_ptr,
    w_ptr,
    sizes_ptr,
    out_ptr,
    T,
    N,
    K,
    E,
    stride_xm,
    stride_xk,
    stride_we,
    stride_wk,
    stride_wn,
    stride_om,
    stride_on,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    zero = pid_t * 0
    tile_lo = zero
    row_off = zero
    expert = zero - 1
    row_start = zero
    row_end = zero
    for e in range(0, E):
        size = tl.load(sizes_ptr + e).to(tl.int32)
        n_tiles = (size + BLOCK_M - 1) // BLOCK_M
        hit = (pid_t >= tile_lo) & (pid_t < tile_lo + n_tiles)
        expert = tl.where(hit, e, expert)
        row_start = tl.where(hit, row_off + (pid_t - tile_lo) * BLOCK_M, row_start)
        row_end = tl.where(hit, row_off + size, row_end)
        tile_lo += n_tiles
        row_off += size
    # group sizes that do not sum to T (or a negative one) must not reach rows outside x and out
    row_lo = tl.maximum(row_start, 0)
    row_end = tl.minimum(row_end, T)
    if expert >= 0:
        rm = row_start + tl.arange(0, BLOCK_M)
        rows = (rm >= row_lo) & (rm < row_end)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk0 = tl.arange(0, BLOCK_K)
        if WIDE:  # x, w or out past 2**31 elements: int64 offsets (wide_offsets)
            rm = rm.to(tl.int64)
            rn = rn.to(tl.int64)
            rk0 = rk0.to(tl.int64)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + rk0
            a = tl.load(
                x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                mask=rows[:, None] & (rk[None, :] < K),
                other=0.0,
            )
            b = tl.load(
                w_base + rk[:, None] * stride_wk + rn[None, :] * stride_wn,
                mask=(rk[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        tl.store(
            out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on,
            acc.to(out_ptr.dtype.element_ty),
            mask=rows[:, None] & (rn[None, :] < N),
        )


def moe_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    group_sizes: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    BLOCK_M: int = 64,
    BLOCK_N: int = 64,
    BLOCK_K: int = 32,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """out[rows of e] = x[rows of e] @ w[e] for x (T, K) sorted by expert, w (E, K, N), group_sizes (E,)
    int32 summing to T (not checked on the device: that would need a host sync; sizes that break it give
    undefined rows but no access outside x and out)."""
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"moe_gemm needs x (T, K) and w (E, K, N), got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}")
    T, K = x.shape
    E, _, N = w.shape
    if tuple(group_sizes.shape) != (E,):
        raise ValueError(f"group_sizes has shape {tuple(group_sizes.shape)}, expected {(E,)}")
    if out is None:
        out = torch.empty((T, N), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (T, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {(T, N)}")
    grid = (triton.cdiv(T, BLOCK_M) + E, triton.cdiv(N, BLOCK_N))
    _moe_kernel[grid](
        x,
        w,
        group_sizes.contiguous(),  # read with unit stride
        out,
        T,
        N,
        K,
        E,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        UPCAST=triton_interpreted(),
        PRECISION="ieee" if x.dtype == torch.float32 else None,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        # the expert's offset into w is int64 already; inside one expert's (K, N) block, x and out
        WIDE=E > 0 and wide_offsets(x, w[0], out),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
