"""Triton GEMM kernels: matmul with fused bias+activation epilogue, grouped program order and split-K,
and the int8 weight-only variant. Imported lazily (after `prepare_triton()`), never at package import.

Interpreter note: with `TRITON_INTERPRET=1`, bf16 arithmetic fails in the interpreter (numpy has no
bfloat16), so the kernels upcast the loaded tiles to fp32 before `tl.dot` when `UPCAST` is set; the
launchers set it only under the interpreter. On a GPU the tiles go to the tensor cores in their own dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ._common import INT32_MAX, activation_code, triton_interpreted, wide_offsets

__all__ = ["matmul", "int8_matmul"]


@triton.jit
def _apply_epilogue(acc, bias_ptr, rn, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 2:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    return acc


@triton.jit
def _grouped_pids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear program id to (pid_m, pid_n) in groups of GROUP_M rows of tiles, so that programs
    that run together share A row-panels and B column-panels in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    scale_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cs,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    UPCAST: tl.constexpr,
    B_INT8: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid_m, pid_n = _grouped_pids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk0 = tl.arange(0, BLOCK_K)
    if WIDE:  # an operand past 2**31 elements: int64 offsets (wide_offsets)
        pid_k = pid_k.to(tl.int64)
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk0 = rk0.to(tl.int64)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_lo = pid_k * per_split
    k_hi = tl.minimum(k_lo + per_split, k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_lo, k_hi):
        rk = kt * BLOCK_K + rk0
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(rk[:, None] < K) & (rn[None, :] < N),
            other=0,
        )
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        elif B_INT8:
            # int8 weights are exact in fp16/bf16/fp32: dequantise to the activation dtype so the dot
            # runs on the tensor cores; the per-channel scale is applied once, in the epilogue.
            b = b.to(a.dtype)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if SPLIT_K == 1:
        if B_INT8:
            scale = tl.load(scale_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            acc = acc * scale[None, :]
        acc = _apply_epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
        c = acc.to(c_ptr.dtype.element_ty)
    else:
        c = acc  # fp32 partial sums into the workspace; the reduce kernel applies the epilogue
    tl.store(
        c_ptr + pid_k * stride_cs + rm[:, None] * stride_cm + rn[None, :] * stride_cn,
        c,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    bias_ptr,
    c_ptr,
    scale_ptr,
    M,
    N,
    stride_ws,
    stride_wm,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    B_INT8: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr,
    WIDE: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if WIDE:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # step a pointer from split to split: s * stride_ws would be int32 arithmetic
    ws_tile = ws_ptr + rm[:, None] * stride_wm + rn[None, :]
    for _s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_tile, mask=mask, other=0.0)
        ws_tile += stride_ws
    if B_INT8:
        scale = tl.load(scale_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc = acc * scale[None, :]
    acc = _apply_epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
    tl.store(
        c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask
    )


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    scale: torch.Tensor | None,
    activation: str,
    out: torch.Tensor | None,
    *,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    GROUP_M: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs a (M, K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    elif tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {(M, N)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected {(N,)}")
    # the kernels index bias and scale with unit stride: a strided view (b[::2]) is copied, not misread
    bias = None if bias is None else bias.contiguous()
    scale = None if scale is None else scale.contiguous()
    act = activation_code(activation)
    upcast = triton_interpreted()
    # fp32 inputs: true fp32 products (no TF32); other dtypes keep the default.
    precision = "ieee" if a.dtype == torch.float32 else None
    grid_mn = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    wide = wide_offsets(a, b, out) or (SPLIT_K > 1 and SPLIT_K * M * N > INT32_MAX)  # and the workspace
    dummy = out  # never read: HAS_BIAS / B_INT8 are False when the pointer is a placeholder
    common: dict[str, Any] = dict(HAS_BIAS=bias is not None, ACT=act, B_INT8=scale is not None)
    if SPLIT_K == 1:
        _matmul_kernel[(grid_mn, 1)](
            a,
            b,
            bias if bias is not None else dummy,
            out,
            scale if scale is not None else dummy,
            M,
            N,
            K,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            0,
            out.stride(0),
            out.stride(1),
            UPCAST=upcast,
            PRECISION=precision,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            GROUP_M=GROUP_M,
            SPLIT_K=1,
            WIDE=wide,
            num_warps=num_warps,
            num_stages=num_stages,
            **common,
        )
        return out
    ws = torch.empty((SPLIT_K, M, N), dtype=torch.float32, device=a.device)
    _matmul_kernel[(grid_mn, SPLIT_K)](
        a,
        b,
        dummy,
        ws,
        dummy,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        ws.stride(0),
        ws.stride(1),
        ws.stride(2),
        HAS_BIAS=False,
        ACT=0,
        B_INT8=scale is not None,
        UPCAST=upcast,
        PRECISION=precision,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        GROUP_M=GROUP_M,
        SPLIT_K=SPLIT_K,
        WIDE=wide,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    _splitk_reduce_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
        ws,
        bias if bias is not None else dummy,
        out,
        scale if scale is not None else dummy,
        M,
        N,
        ws.stride(0),
        ws.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        SPLIT_K=SPLIT_K,
        WIDE=wide,
        num_warps=num_warps,
        **common,
    )
    return out


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
    *,
    BLOCK_M: int = 64,
    BLOCK_N: int = 64,
    BLOCK_K: int = 32,
    GROUP_M: int = 8,
    SPLIT_K: int = 1,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """C = act(A @ B + bias) with fp32 accumulation, written into `out` (allocated when None)."""
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    return _launch(
        a,
        b,
        bias,
        None,
        activation,
        out,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        GROUP_M=GROUP_M,
        SPLIT_K=SPLIT_K,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def int8_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    out: torch.Tensor | None = None,
    *,
    BLOCK_M: int = 64,
    BLOCK_N: int = 64,
    BLOCK_K: int = 64,
    GROUP_M: int = 8,
    SPLIT_K: int = 1,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """C = act((X @ W_int8) * scale[None, :] + bias) with fp32 accumulation; `scale` is per output channel."""
    if w.dtype != torch.int8:
        raise ValueError(f"w must be int8, got {w.dtype}")
    if tuple(scale.shape) != (w.shape[1],):
        raise ValueError(f"scale has shape {tuple(scale.shape)}, expected {(w.shape[1],)}")
    return _launch(
        x,
        w,
        bias,
        scale,
        activation,
        out,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        GROUP_M=GROUP_M,
        SPLIT_K=SPLIT_K,
        num_warps=num_warps,
        num_stages=num_stages,
    )
