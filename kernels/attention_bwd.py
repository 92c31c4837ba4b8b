"""Flash attention backward in Triton (FlashAttention-2's design): dQ, dK, dV of

    O = softmax(Q K^T * sm_scale [+ causal mask]) V        Q, K, V, O, dO: (B, H, S, D)

without the S x S score matrix. The forward (kernels/attention.py, `flash_attention_triton(...,
lse=...)`) saves one number per query row, L_i = log2(sum_j exp2(s_ij)) with s = Q K^T * sm_scale *
log2(e), so that any block of probabilities can be recomputed exactly as P_ij = exp2(s_ij - L_i). Three
launches:

1. preprocess, grid (cdiv(S, BLOCK_M), H, B): delta_i = sum_d dO_id * O_id (fp32, (B, H, S));
2. dK/dV, grid (cdiv(S, BLOCK_N), H, B): a program keeps a BLOCK_N x D tile of K and V and fp32 dK, dV
   accumulators and walks the query blocks BLOCK_M rows at a time (causal: only the blocks at or below its
   first key): P^T = exp2(K Q^T * scale' - L), dV += P^T dO, dP^T = V dO^T, dS^T = P^T * (dP^T - delta),
   dK += dS^T Q; at the end dK *= sm_scale;
3. dQ, grid (cdiv(S, BLOCK_M), H, B): a program keeps a BLOCK_M x D tile of Q, dO, L and delta and walks the
   key blocks (causal: up to its last row): P = exp2(Q K^T * scale' - L), dP = dO V^T, dS = P * (dP -
   delta), dQ += dS K; dQ *= sm_scale.

dQ has a program of its own (no atomics): deterministic, and each of the three gradients is written once.
Keys and queries past S, and j > i when causal, are masked to P = 0 (their loads to zeros); rows past S are
never stored. Extra memory: delta (4 bytes per query row) beside the forward's L (4 bytes per row): O(S)
per (batch, head), never O(S^2). fp16/bf16: tensor-core dots with fp32 accumulation, P^T and dS in the
input dtype for their dots (as the forward casts P); fp32: input_precision="ieee". Interpreter-forced
change: under TRITON_INTERPRET=1 the tiles are upcast to fp32 (as the forward does).

Tunables (one config for the three launches): BLOCK_M (query rows), BLOCK_N (keys), num_warps,
num_stages (search_spaces/attention.py, `attention_bwd_space`).

The registered kernel "flash_attention_bwd" computes the three gradients of a problem of "flash_attention"
(the same fields) into one preallocated (3, B, H, S, D) buffer `grads` (dQ, dK, dV), from the inputs q, k,
v, o, do (B, H, S, D) and lse (B, H, S) float32, so it is tuned, cached and checked like every kernel;
its reference is the float64 gradient of `attention_reference`. `tuner.kernel("flash_attention",
backend="triton")` uses it for torch autograd (tuner/runtime/_kernel_grad_torch.py, `torch_autograd`
below).

Pallas (`flash_attention_bwd_pallas`, TPU / Mosaic semantics, interpret mode on CPU), the same design
from the Pallas forward's natural-log rows L_i = log(sum_j exp(s_ij * sm_scale))
(`flash_attention_pallas(..., lse=True)`), P = exp(Q K^T * sm_scale - L). Three pallas_calls:
1. delta, grid (B, H, cdiv(S, block_q)): delta_i = rowsum(dO * O) in fp32;
2. dK/dV, grid (B, H, cdiv(S, block_k), cdiv(S, block_q)), the query axis sequential ("arbitrary"): the
   K and V blocks stay, fp32 dK and dV accumulators live in VMEM scratch across the query steps, written
   at the last one; causal steps wholly above the key block are skipped (pl.when) and their Q/dO/L/delta
   block index clamped to the first useful block (no DMA);
3. dQ, grid (B, H, cdiv(S, block_q), cdiv(S, block_k)), the key axis sequential: fp32 dQ accumulator in
   scratch; causal steps past the diagonal skipped, their K/V index clamped as the forward does.
Padding (S not divisible by the blocks): the interpreter pads a partial block with NaN, so the rows that
reach other rows' results are zeroed (Q, dO, L, delta past S in dK/dV; K, V past S in dQ) and P is masked
with where (keys or queries past S, j > i when causal); rows past S reach only their own dropped rows.
fp32 dots at Precision.HIGHEST; fp16/bf16 with P and dS cast to the input dtype. Tunables: block_q,
block_k (`attention_bwd_space`, backend "pallas"). It returns a fresh (3, B, H, S, D) array (no `grads`
buffer on Pallas). `tuner.kernel("flash_attention", backend="pallas")` uses it for jax's reverse mode
(tuner/runtime/_kernel_grad.py, `jax_autodiff` below).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import attention as _spaces
from tuner.search_spaces._resources import dtype_bytes

from ._common import (
    hostile_rows,
    jnp_dtype,
    pallas_interpret,
    to_numpy,
    torch_device,
    torch_dtype,
    triton_interpreted,
)
from ._registry import KernelSpec, register
from .attention import (
    _GRID_YZ_MAX,
    _LOG2E,
    _cdiv,
    _score_pairs,
    _sm_scale,
    flash_attention_pallas,
    flash_attention_triton,
    scaled_scores,
)
from .attention import SPEC as _FORWARD

__all__ = ["flash_attention_bwd_triton", "attention_grad_reference", "torch_autograd", "SPEC"]


# ---- reference ----------------------------------------------------------------------------------------
def _probabilities(
    q: np.ndarray, k: np.ndarray, causal: bool, sm_scale: float | None
) -> tuple[np.ndarray, float]:
    s, scale = scaled_scores(q, k, causal, sm_scale)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    tot = p.sum(axis=-1, keepdims=True)
    return p / tot, scale


def attention_grad_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    causal: bool,
    sm_scale: float | None = None,
) -> np.ndarray:
    """float64 (dQ, dK, dV) of `attention_reference(q, k, v)` for the output gradient `do`, stacked
    (3, B, H, S, D): dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q."""
    q, k, v, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do))
    p, scale = _probabilities(q, k, causal, sm_scale)
    o = np.einsum("bhij,bhjd->bhid", p, v)
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, v)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", ds, k) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    return np.stack([dq, dk, dv])


def _checked_shape(q: Any, k: Any, v: Any, o: Any, do: Any) -> tuple[int, int, int, int]:
    """(B, H, S, D) of the backward's inputs (torch tensors or jax arrays), which must share one shape and
    dtype with a supported head dim (a ValueError naming them otherwise)."""
    if q.ndim != 4 or any(t.shape != q.shape for t in (k, v, o, do)):
        raise ValueError(
            "q, k, v, o, do must share one (B, H, S, D) shape, got "
            + ", ".join(str(tuple(t.shape)) for t in (q, k, v, o, do))
        )
    bsz, heads, seq, d = (int(x) for x in q.shape)
    if d not in _spaces.HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not supported: use one of {_spaces.HEAD_DIMS}")
    if any(t.dtype != q.dtype for t in (k, v, o, do)):
        raise ValueError(
            f"q, k, v, o, do must share one dtype, got {[str(t.dtype) for t in (q, k, v, o, do)]}"
        )
    return bsz, heads, seq, d


# ---- Triton -------------------------------------------------------------------------------------------
@functools.cache
def _triton_kernels() -> tuple[Any, Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def attn_bwd_delta(o_ptr, do_ptr, delta_ptr, S, D: tl.constexpr, BLOCK_M: tl.constexpr):
        bh = tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        mask = rows < S
        offs = bh * S * D + rows.to(tl.int64)[:, None] * D + offs_d[None, :]
        o = tl.load(o_ptr + offs, mask=mask[:, None], other=0.0).to(tl.float32)
        do = tl.load(do_ptr + offs, mask=mask[:, None], other=0.0).to(tl.float32)
        tl.store(delta_ptr + bh * S + rows, tl.sum(o * do, 1), mask=mask)

    @triton.jit
    def attn_bwd_dkdv(
        q_ptr,
        k_ptr,
        v_ptr,
        do_ptr,
        lse_ptr,
        delta_ptr,
        dk_ptr,
        dv_ptr,
        qk_scale,
        sm_scale,
        S,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        UPCAST: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        base = bh * S * D
        cols = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        kmask = cols < S
        kv_offs = base + cols.to(tl.int64)[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=kmask[:, None], other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=kmask[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, D], tl.float32)
        dv = tl.zeros([BLOCK_N, D], tl.float32)
        # causal: query rows i < start_n see none of these keys
        lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
        for start_m in range(lo, S, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            qmask = rows < S
            q_offs = base + rows.to(tl.int64)[:, None] * D + offs_d[None, :]
            q = tl.load(q_ptr + q_offs, mask=qmask[:, None], other=0.0)
            do = tl.load(do_ptr + q_offs, mask=qmask[:, None], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            lse = tl.load(lse_ptr + bh * S + rows, mask=qmask, other=0.0)
            delta = tl.load(delta_ptr + bh * S + rows, mask=qmask, other=0.0)
            st = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
            valid = kmask[:, None] & qmask[None, :]
            if CAUSAL:
                valid = valid & (rows[None, :] >= cols[:, None])
            pt = tl.where(valid, tl.exp2(st - lse[None, :]), 0.0)
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
        dk = dk * sm_scale
        tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=kmask[:, None])
        tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=kmask[:, None])

    @triton.jit
    def attn_bwd_dq(
        q_ptr,
        k_ptr,
        v_ptr,
        do_ptr,
        lse_ptr,
        delta_ptr,
        dq_ptr,
        qk_scale,
        sm_scale,
        S,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        UPCAST: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        # heaviest query blocks first when causal (as the forward)
        if CAUSAL:  # noqa: SIM108
            start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
        else:
            start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        base = bh * S * D
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        qmask = rows < S
        q_offs = base + rows.to(tl.int64)[:, None] * D + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=qmask[:, None], other=0.0)
        do = tl.load(do_ptr + q_offs, mask=qmask[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse = tl.load(lse_ptr + bh * S + rows, mask=qmask, other=0.0)
        delta = tl.load(delta_ptr + bh * S + rows, mask=qmask, other=0.0)
        dq = tl.zeros([BLOCK_M, D], tl.float32)
        hi = tl.minimum(S, start_m + BLOCK_M) if CAUSAL else S
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            kmask = cols < S
            kv_offs = base + cols.to(tl.int64)[:, None] * D + offs_d[None, :]
            k = tl.load(k_ptr + kv_offs, mask=kmask[:, None], other=0.0)
            v = tl.load(v_ptr + kv_offs, mask=kmask[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
            valid = qmask[:, None] & kmask[None, :]
            if CAUSAL:
                valid = valid & (rows[:, None] >= cols[None, :])
            p = tl.where(valid, tl.exp2(s - lse[:, None]), 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        dq = dq * sm_scale
        tl.store(dq_ptr + q_offs, dq.to(dq_ptr.dtype.element_ty), mask=qmask[:, None])

    return attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq


def flash_attention_bwd_triton(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    do: Any,
    lse: Any,
    grads: Any | None = None,
    *,
    causal: bool,
    sm_scale: float | None = None,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Any:
    """(dQ, dK, dV) of attention into `grads` ((3, B, H, S, D), empty when None), from contiguous torch
    tensors q, k, v, o, do (B, H, S, D) of one dtype and the forward's float32 lse (B, H, S)."""
    import torch

    bsz, heads, seq, d = _checked_shape(q, k, v, o, do)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if tuple(lse.shape) != (bsz, heads, seq) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(
            f"lse must be a contiguous float32 tensor of shape {(bsz, heads, seq)}, got {lse.dtype} "
            f"{tuple(lse.shape)}"
        )
    grads = torch.empty((3, *q.shape), dtype=q.dtype, device=q.device) if grads is None else grads
    if tuple(grads.shape) != (3, *q.shape) or grads.dtype != q.dtype or not grads.is_contiguous():
        raise ValueError(
            f"grads must be a contiguous {q.dtype} tensor of shape {(3, *q.shape)}, got {grads.dtype} "
            f"{tuple(grads.shape)}"
        )
    for name, n in (("batch B", bsz), ("heads H", heads)):
        if n > _GRID_YZ_MAX:
            raise ValueError(f"{name}={n} exceeds the {_GRID_YZ_MAX} programs a GPU grid axis allows")
    if bsz * heads == 0 or seq == 0:
        return grads
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    upcast = triton_interpreted()
    delta_k, dkdv_k, dq_k = _triton_kernels()
    delta = torch.empty((bsz, heads, seq), dtype=torch.float32, device=q.device)
    delta_k[(_cdiv(seq, BLOCK_M), heads, bsz)](o, do, delta, seq, D=d, BLOCK_M=BLOCK_M, num_warps=num_warps)
    common = {
        "D": d,
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "CAUSAL": bool(causal),
        "UPCAST": upcast,
        "PRECISION": precision,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    dq, dk, dv = grads[0], grads[1], grads[2]
    dkdv_k[(_cdiv(seq, BLOCK_N), heads, bsz)](
        q, k, v, do, lse, delta, dk, dv, scale * _LOG2E, scale, seq, **common
    )
    dq_k[(_cdiv(seq, BLOCK_M), heads, bsz)](q, k, v, do, lse, delta, dq, scale * _LOG2E, scale, seq, **common)
    return grads


# ---- Pallas -------------------------------------------------------------------------------------------
def flash_attention_bwd_pallas(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    do: Any,
    lse: Any,
    *,
    causal: bool,
    sm_scale: float | None = None,
    block_q: int,
    block_k: int,
    interpret: bool | None = None,
) -> Any:
    """(dQ, dK, dV) of attention stacked (3, B, H, S, D) in q's dtype, from jax arrays q, k, v, o, do
    (B, H, S, D) of one dtype and the forward's float32 natural-log lse rows (B, H, S)
    (`flash_attention_pallas(..., lse=True)`). Three pallas_calls: delta, dK/dV, dQ (module docstring)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    bsz, heads, seq, d = _checked_shape(q, k, v, o, do)
    if tuple(lse.shape) != (bsz, heads, seq) or lse.dtype != jnp.float32:
        raise ValueError(
            f"lse must be a float32 array of shape {(bsz, heads, seq)}, got {lse.dtype} {tuple(lse.shape)}"
        )
    interpret = pallas_interpret() if interpret is None else interpret
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    f32 = jnp.float32
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else lax.Precision.DEFAULT
    nq, nk = _cdiv(seq, block_q), _cdiv(seq, block_k)
    sq = pl.squeezed
    nt = (((1,), (1,)), ((), ()))  # a (m, d) x (n, d)^T
    tn = (((0,), (0,)), ((), ()))  # a (m, n)^T x (m, d)
    nn = (((1,), (0,)), ((), ()))  # a (m, n) x (n, d)

    def dot(a: Any, b: Any, dims: Any) -> Any:
        return lax.dot_general(a, b, dims, preferred_element_type=f32, precision=precision)

    def params(n: int) -> Any:
        if jax.default_backend() not in ("tpu", "cpu"):
            return None
        semantics: Any = ("parallel",) * (n - 1) + ("arbitrary",)
        return pltpu.CompilerParams(dimension_semantics=semantics)

    def rows_of(start: Any, n: int) -> Any:  # positions of a block's rows, (n, 1): no lane->sublane reshape
        return start + lax.broadcasted_iota(jnp.int32, (n, 1), 0)

    def zero_past(x: Any, rows: Any) -> Any:  # the interpreter pads a partial block with NaN
        return jnp.where(rows < seq, x, jnp.zeros_like(x))

    # 1. delta_i = rowsum(dO * O) in fp32, (B, H, S, 1)
    def delta_kernel(o_ref: Any, do_ref: Any, delta_ref: Any) -> None:
        delta_ref[...] = jnp.sum(o_ref[...].astype(f32) * do_ref[...].astype(f32), axis=1, keepdims=True)

    row_block = pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i: (b, h, i, 0))
    stat_block = pl.BlockSpec((sq, sq, block_q, 1), lambda b, h, i: (b, h, i, 0))
    delta = pl.pallas_call(
        delta_kernel,
        out_shape=jax.ShapeDtypeStruct((bsz, heads, seq, 1), f32),
        grid=(bsz, heads, nq),
        in_specs=[row_block, row_block],
        out_specs=stat_block,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",) * 3)
        if jax.default_backend() in ("tpu", "cpu")
        else None,
        interpret=interpret,
        name="flash_attention_bwd_delta_pallas",
    )(o, do)
    lse4 = lse.reshape(bsz, heads, seq, 1)

    def probabilities(qb: Any, kb: Any, lse_b: Any, qrows: Any, kcols: Any) -> Any:
        """P = exp(Q K^T * scale - L) of one (block_q, block_k) tile, 0 where masked."""
        valid = (kcols < seq) & (qrows < seq)
        if causal:
            valid = valid & (kcols <= qrows)
        s = dot(qb, kb, nt) * scale
        return jnp.where(valid, jnp.exp(s - lse_b), 0.0)

    # 2. dK, dV: a program per key block; the query blocks are its sequential axis
    def dkdv_kernel(*refs: Any) -> None:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_acc, dv_acc = refs
        j, i = pl.program_id(2), pl.program_id(3)
        k_start, q_start = j * block_k, i * block_q

        @pl.when(i == 0)
        def _init() -> None:
            dk_acc[...] = jnp.zeros(dk_acc.shape, f32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, f32)

        def compute() -> None:
            qrows = rows_of(q_start, block_q)
            kcols = k_start + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
            qb = zero_past(q_ref[...], qrows)
            dob = zero_past(do_ref[...], qrows)
            lse_b = zero_past(lse_ref[...], qrows)
            delta_b = zero_past(delta_ref[...], qrows)
            kb, vb = k_ref[...], v_ref[...]  # key rows past S only reach their own dK, dV rows (dropped)
            p = probabilities(qb, kb, lse_b, qrows, kcols)  # (block_q, block_k)
            dv_acc[...] += dot(p.astype(dob.dtype), dob, tn)
            dp = dot(dob, vb, nt)
            ds = p * (dp - delta_b)
            dk_acc[...] += dot(ds.astype(qb.dtype), qb, tn)

        if causal:  # query blocks wholly above this key block see none of its keys
            pl.when(q_start + block_q - 1 >= k_start)(compute)
        else:
            compute()

        @pl.when(i == nq - 1)
        def _finish() -> None:
            dk_ref[...] = (dk_acc[...] * scale).astype(dk_ref.dtype)
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    def q_index(b: Any, h: Any, j: Any, i: Any) -> tuple[Any, ...]:
        if causal:  # skipped steps keep the first useful block: no new DMA (lax.div: see the forward)
            i = jnp.maximum(i, lax.div(j * block_k, block_q))
        return (b, h, i, 0)

    kv_fixed = pl.BlockSpec((sq, sq, block_k, d), lambda b, h, j, i: (b, h, j, 0))
    q_walk = pl.BlockSpec((sq, sq, block_q, d), q_index)
    stat_walk = pl.BlockSpec((sq, sq, block_q, 1), q_index)
    dk, dv = pl.pallas_call(
        dkdv_kernel,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)] * 2,
        grid=(bsz, heads, nk, nq),
        in_specs=[q_walk, kv_fixed, kv_fixed, q_walk, stat_walk, stat_walk],
        out_specs=[kv_fixed, kv_fixed],
        scratch_shapes=[pltpu.VMEM((block_k, d), f32), pltpu.VMEM((block_k, d), f32)],
        compiler_params=params(4),
        interpret=interpret,
        name="flash_attention_bwd_dkdv_pallas",
    )(q, k, v, do, lse4, delta)

    # 3. dQ: a program per query block; the key blocks are its sequential axis (causal: up to its last row)
    def dq_kernel(*refs: Any) -> None:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_acc = refs
        i, j = pl.program_id(2), pl.program_id(3)
        q_start, k_start = i * block_q, j * block_k

        @pl.when(j == 0)
        def _init() -> None:
            dq_acc[...] = jnp.zeros(dq_acc.shape, f32)

        def compute() -> None:
            qrows = rows_of(q_start, block_q)
            kcols = k_start + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
            krows = rows_of(k_start, block_k)
            kb = zero_past(k_ref[...], krows)
            vb = zero_past(v_ref[...], krows)
            qb, dob = q_ref[...], do_ref[...]  # query rows past S only reach their own dQ rows (dropped)
            p = probabilities(qb, kb, lse_ref[...], qrows, kcols)
            dp = dot(dob, vb, nt)
            ds = p * (dp - delta_ref[...])
            dq_acc[...] += dot(ds.astype(kb.dtype), kb, nn)

        if causal:
            pl.when(k_start <= q_start + block_q - 1)(compute)
        else:
            compute()

        @pl.when(j == nk - 1)
        def _finish() -> None:
            dq_ref[...] = (dq_acc[...] * scale).astype(dq_ref.dtype)

    def kv_index(b: Any, h: Any, i: Any, j: Any) -> tuple[Any, ...]:
        if causal:
            j = jnp.minimum(j, lax.div(i * block_q + block_q - 1, block_k))
        return (b, h, j, 0)

    q_fixed = pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i, j: (b, h, i, 0))
    stat_fixed = pl.BlockSpec((sq, sq, block_q, 1), lambda b, h, i, j: (b, h, i, 0))
    kv_walk = pl.BlockSpec((sq, sq, block_k, d), kv_index)
    dq = pl.pallas_call(
        dq_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(bsz, heads, nq, nk),
        in_specs=[q_fixed, kv_walk, kv_walk, q_fixed, stat_fixed, stat_fixed],
        out_specs=q_fixed,
        scratch_shapes=[pltpu.VMEM((block_q, d), f32)],
        compiler_params=params(4),
        interpret=interpret,
        name="flash_attention_bwd_dq_pallas",
    )(q, k, v, do, lse4, delta)
    return jnp.stack([dq, dk, dv])


# ---- torch autograd -----------------------------------------------------------------------------------
def _forward_saving(
    problem: Mapping[str, Any], inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> tuple[Any, tuple[Any, ...]]:
    """The forward with the tuned config of "flash_attention", its lse rows kept: (output, saved tensors).
    The output is a tensor of its own, which autograd saves for the backward; the `out` buffer gets a copy
    (a buffer that the caller, or a tuning on a miss, writes again cannot change the saved output)."""
    import torch

    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    q, k, v = (inputs[n].detach() for n in ("q", "k", "v"))
    b, h, s, _ = q.shape
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    out = flash_attention_triton(
        q,
        k,
        v,
        torch.empty_like(q),
        causal=causal,
        sm_scale=_sm_scale(problem),
        BLOCK_M=int(config["BLOCK_M"]),
        BLOCK_N=int(config["BLOCK_N"]),
        num_warps=int(config["num_warps"]),
        num_stages=int(config["num_stages"]),
        lse=lse,
    )
    buf = inputs.get("out")
    if buf is not None:
        buf.detach().copy_(out)
    return out, (q, k, v, out, lse)


def _backward_inputs(saved: tuple[Any, ...], grad_out: Any) -> dict[str, Any]:
    """The inputs of "flash_attention_bwd" for the saved forward and the output's gradient (made
    contiguous: `loss = out.sum()` hands back an expanded, stride-0 gradient)."""
    import torch

    q, k, v, o, lse = saved
    c = [t.contiguous() for t in (q, k, v, o)]
    do = grad_out.to(q.dtype).contiguous()
    grads = torch.empty((3, *q.shape), dtype=q.dtype, device=q.device)
    return {"q": c[0], "k": c[1], "v": c[2], "o": c[3], "do": do, "lse": lse, "grads": grads}


def _input_grads(result: Any) -> dict[str, Any]:
    return {"q": result[0], "k": result[1], "v": result[2]}


# Used by tuner/runtime/_kernel_grad_torch.py for `tuner.kernel("flash_attention", backend="triton")`.
torch_autograd = {
    "forward": _forward_saving,
    "backward_inputs": _backward_inputs,
    "input_grads": _input_grads,
}


# ---- jax reverse mode ---------------------------------------------------------------------------------
def _jax_forward_saving(
    problem: Mapping[str, Any], inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> tuple[Any, tuple[Any, ...]]:
    """The Pallas forward with the tuned config of "flash_attention", its lse rows kept: (output, what the
    backward needs: q, k, v, o, lse)."""
    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    q, k, v = (inputs[n] for n in ("q", "k", "v"))
    out, lse = flash_attention_pallas(
        q,
        k,
        v,
        causal=causal,
        sm_scale=_sm_scale(problem),
        block_q=int(config["block_q"]),
        block_k_major=int(config["block_k_major"]),
        block_k=int(config["block_k"]),
        lse=True,
    )
    return out, (q, k, v, out, lse)


def _jax_backward_inputs(saved: tuple[Any, ...], grad_out: Any) -> dict[str, Any]:
    q, k, v, o, lse = saved
    return {"q": q, "k": k, "v": v, "o": o, "do": grad_out.astype(q.dtype), "lse": lse}


# Used by tuner/runtime/_kernel_grad.py for reverse mode through `tuner.kernel("flash_attention",
# backend="pallas")`: the same hooks as `torch_autograd`, on jax arrays.
jax_autodiff = {
    "forward": _jax_forward_saving,
    "backward_inputs": _jax_backward_inputs,
    "input_grads": _input_grads,
}


# ---- spec plumbing ------------------------------------------------------------------------------------
def _lse_rows(q: np.ndarray, k: np.ndarray, causal: bool, sm_scale: float | None) -> np.ndarray:
    """The forward's base-2 log-sum-exp rows of float64 q, k (what `flash_attention_triton(lse=...)` saves)."""
    s = scaled_scores(q, k, causal, sm_scale)[0] * _LOG2E
    m = s.max(axis=-1, keepdims=True)
    return (m + np.log2(np.exp2(s - m).sum(axis=-1, keepdims=True)))[..., 0]


def _make_inputs(problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    b, h, s, d, causal, dtype = _spaces.check_problem(problem)
    if backend not in ("triton", "pallas"):
        raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")
    from .attention import attention_reference

    rng = np.random.default_rng(seed)
    shape = (b, h, s, d)
    arrays = {name: rng.standard_normal(shape) for name in ("q", "k", "v", "do")}
    hostile_rows(arrays["q"].reshape(-1, d), rng, dtype, 8.0)
    sm = _sm_scale(problem)
    if backend == "pallas":
        import jax.numpy as jnp

        jd = jnp_dtype(dtype)
        jres: dict[str, Any] = {n: jnp.asarray(a, dtype=jnp.float32).astype(jd) for n, a in arrays.items()}
        q, k, v = (np.asarray(jres[n], dtype=np.float64) for n in ("q", "k", "v"))
        jres["o"] = jnp.asarray(attention_reference(q, k, v, causal=causal, sm_scale=sm), jnp.float32).astype(
            jd
        )
        # the Pallas forward's rows are natural logs: L * ln(2) of the base-2 rows
        jres["lse"] = jnp.asarray(_lse_rows(q, k, causal, sm) * math.log(2.0), dtype=jnp.float32)
        return jres  # no `grads` buffer: the Pallas launcher returns a fresh result
    import torch

    dev, td = torch_device(), torch_dtype(dtype)
    res: dict[str, Any] = {n: torch.tensor(a, dtype=torch.float32).to(td) for n, a in arrays.items()}
    # o and lse as the forward gives them, from the rounded q, k, v
    q, k, v = (res[n].to(torch.float64).numpy() for n in ("q", "k", "v"))
    res["o"] = torch.tensor(attention_reference(q, k, v, causal=causal, sm_scale=sm)).to(td)
    res["lse"] = torch.tensor(_lse_rows(q, k, causal, sm), dtype=torch.float32)
    res = {n: t.to(dev) for n, t in res.items()}
    res["grads"] = torch.full((3, *shape), float("nan"), dtype=td, device=dev)
    return res


def _reference(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    q, k, v, do = (to_numpy(inputs[n]) for n in ("q", "k", "v", "do"))
    return attention_grad_reference(q, k, v, do, causal=causal, sm_scale=_sm_scale(problem))


def _run(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    args = [inputs[n] for n in ("q", "k", "v", "o", "do", "lse")]
    if backend == "pallas":  # a fresh (3, B, H, S, D) result (no `grads` buffer)
        return flash_attention_bwd_pallas(
            *args,
            causal=causal,
            sm_scale=_sm_scale(problem),
            block_q=int(config["block_q"]),
            block_k=int(config["block_k"]),
        )
    if backend != "triton":
        raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")
    q, k, v, o, do, lse = args
    return flash_attention_bwd_triton(
        q,
        k,
        v,
        o,
        do,
        lse,
        inputs.get("grads"),
        causal=causal,
        sm_scale=_sm_scale(problem),
        BLOCK_M=int(config["BLOCK_M"]),
        BLOCK_N=int(config["BLOCK_N"]),
        num_warps=int(config["num_warps"]),
        num_stages=int(config["num_stages"]),
    )


def _flops(problem: Mapping[str, Any]) -> float:
    """Five matmuls over the (query, key) pairs that count (S = Q K^T, dV, dP, dQ, dK): 10 B H pairs D,
    2.5 times the forward's (the kernels recompute Q K^T and dO V^T once more for dQ, not counted)."""
    b, h, s, d, causal, _ = _spaces.check_problem(problem)
    return float(10 * b * h * _score_pairs(s, causal) * d)


def _bytes(problem: Mapping[str, Any]) -> float:
    """Compulsory traffic: read Q, K, V, O, dO and lse once, write dQ, dK, dV (and delta, written and
    read once)."""
    b, h, s, d, _, dtype = _spaces.check_problem(problem)
    return float(8 * b * h * s * d * dtype_bytes(dtype) + 3 * 4 * b * h * s)


def _tolerance(dtype: str) -> tuple[float, float]:
    return {"float32": (2e-4, 2e-4), "float16": (2e-2, 2e-2), "bfloat16": (1e-1, 1e-1)}.get(
        dtype, (1e-1, 1e-1)
    )


SPEC = register(
    KernelSpec(
        name="flash_attention_bwd",
        description="Flash attention backward (dQ, dK, dV from the forward's log-sum-exp rows)",
        backends=("triton", "pallas"),
        dtypes=_FORWARD.dtypes,  # the forward's problems
        default_problem=_FORWARD.default_problem,
        shape_fields=_FORWARD.shape_fields,
        space=_spaces.attention_bwd_space,
        make_inputs=_make_inputs,
        reference=_reference,
        run=_run,
        flops=_flops,
        bytes_moved=_bytes,
        tolerance=_tolerance,
        check_problem=_spaces.check_problem,
        output_buffer="grads",
        extra={
            "inputs": ("q", "k", "v", "o", "do", "lse", "grads"),
            "flags": _FORWARD.extra["flags"],
            "gradient_of": "flash_attention",
            "torch_autograd": torch_autograd,
            "jax_autodiff": jax_autodiff,
        },
    )
)
