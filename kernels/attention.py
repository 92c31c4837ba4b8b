"""Flash attention forward, causal and non-causal, head dim 64 and 128, in Triton and in Pallas.

    O = softmax(Q K^T * sm_scale [+ causal mask]) V        Q, K, V, O: (B, H, S, D); sm_scale = 1/sqrt(D)

The causal mask lets query i see keys j <= i (queries and keys share the length S). Both backends use
the online softmax: a running row maximum m, a running denominator l and an fp32 accumulator, rescaled
by exp(m_old - m_new) whenever a new block of keys raises the maximum, so the S x S score matrix never
exists in memory.

Triton (`flash_attention_triton`): grid (cdiv(S, BLOCK_M), H, B) (a GPU grid's second and third axes
hold at most 65535 programs each, so B * H may exceed that, B and H may not; batch and head offsets are
int64, so tensors past 2**31 elements index right); one program keeps a BLOCK_M x D query tile and walks the keys BLOCK_N at a time (for causal problems only up to its last query row).
Tunables: BLOCK_M, BLOCK_N, num_warps, num_stages. Scores use exp2 with the scale folded into log2(e).
Key positions >= S and, when causal, j > i are set to -inf before the maximum; query rows >= S are
loaded as zeros and never stored. fp16/bf16 inputs are multiplied on the tensor cores with fp32
accumulation (P is cast to V's dtype for the second product, as in the Triton tutorial); fp32 inputs
use input_precision="ieee" (no tf32), so the fp32 tolerance stays tight.
Interpreter-forced change: the Triton interpreter cannot do bf16 (or fp16) dot products, so under
TRITON_INTERPRET=1 the kernel upcasts Q, K and V to fp32 right after loading (constexpr UPCAST); on a
GPU it does not. The interpreter also truncates the fp32 -> bf16 store (a GPU rounds to nearest), so a
bf16 output on CPU can be one bf16 ulp off instead of half of one, inside the bf16 tolerance.

Pallas (`flash_attention_pallas`, TPU / Mosaic semantics): grid (B, H, cdiv(S, block_q),
cdiv(S, block_k_major)), the last axis sequential ("arbitrary"). Each step brings a block_k_major x D
block of K and V into VMEM and walks it block_k keys at a time in a fori_loop; m, l and the fp32
accumulator live in VMEM scratch across the key steps and the output block is written at the last one.
Causal steps above the diagonal are skipped (pl.when) and their K/V block index is clamped to the last
useful block, so no DMA is issued for them. Key positions >= S get -inf scores and their V rows are
zeroed (the interpreter pads a partial block with NaN, and 0 * NaN would poison the accumulator);
query rows >= S are computed from padding and dropped by the output block's bounds. With `lse=True` it
also writes each row's natural log-sum-exp m + log(l) (a second output, (B, H, S) float32) for the
Pallas backward (kernels/attention_bwd.py); the output and the configs are the same.

Outputs: `out` (B, H, S, D), preallocated by make_inputs and filled with NaN; the spec names it as
`output_buffer`. Triton writes into it; Pallas aliases it as the output under the interpreter and
allocates a fresh output on a device.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import attention as _spaces
from tuner.search_spaces._resources import dtype_bytes

from ._common import (
    DTYPES,
    hostile_rows,
    jnp_dtype,
    pallas_interpret,
    to_numpy,
    torch_device,
    torch_dtype,
    triton_interpreted,
    wide_offsets,
)
from ._registry import KernelSpec, register

__all__ = ["flash_attention_triton", "flash_attention_pallas", "attention_reference", "SPEC"]

logger = logging.getLogger(__name__)

_LOG2E = 1.4426950408889634
_GRID_YZ_MAX = 65535


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- reference ----------------------------------------------------------------------------------------
def scaled_scores(
    q: np.ndarray, k: np.ndarray, causal: bool, sm_scale: float | None
) -> tuple[np.ndarray, float]:
    """The references' scores q k^T * sm_scale (1/sqrt(D) when None), -inf above the diagonal where
    `causal`, and that scale."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        n = q.shape[-2]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    return s, scale


def attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool, sm_scale: float | None = None
) -> np.ndarray:
    """Plain float64 attention: softmax(q k^T * sm_scale, causal mask j <= i) v."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s, _ = scaled_scores(q, k, causal, sm_scale)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v)


# ---- Triton -------------------------------------------------------------------------------------------
@functools.cache
def _triton_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def attn_fwd(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        lse_ptr,
        qk_scale,
        S,
        sqb,
        sqh,
        sqs,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        sob,
        soh,
        sos,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        EVEN_M: tl.constexpr,
        UPCAST: tl.constexpr,
        PRECISION: tl.constexpr,
        WIDE: tl.constexpr,
        STORE_LSE: tl.constexpr,
    ):
        # heaviest query blocks first when causal, so the launch does not end on a tail of long programs
        if CAUSAL:  # noqa: SIM108 (a constexpr branch reads clearer to Triton's frontend)
            start_m = tl.num_programs(0) - 1 - tl.program_id(0)
        else:
            start_m = tl.program_id(0)
        h = tl.program_id(1).to(tl.int64)
        b = tl.program_id(2).to(tl.int64)
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        if WIDE:  # one head's rows past 2**31 elements (a long (B, S, H, D) view): int64 row offsets
            offs_m = offs_m.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
        offs_d = tl.arange(0, D)
        q_ptrs = q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :]
        if EVEN_M:  # noqa: SIM108
            q = tl.load(q_ptrs)
        else:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        k_base = k_ptr + b * skb + h * skh
        v_base = v_ptr + b * svb + h * svh
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # Keys [0, n_full) need no mask: below the block's first query row when causal, inside S when not.
        # Keys [n_full, hi) (the diagonal blocks, the partial last block) are masked.
        if CAUSAL:
            n_full = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
            hi = tl.minimum(S, (start_m + 1) * BLOCK_M)
        else:
            n_full = (S // BLOCK_N) * BLOCK_N
            hi = S
        for start_n in range(0, n_full, BLOCK_N):
            cols = start_n + offs_n
            k = tl.load(k_base + cols[:, None] * sks + offs_d[None, :])
            v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :])
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            # scale before the row max: max(qk) * qk_scale is the row's minimum when sm_scale < 0, and
            # exp2 of the scores above it overflows to inf (inf / inf = NaN)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp2(qk - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        for start_n in range(n_full, hi, BLOCK_N):
            cols = start_n + offs_n
            kmask = cols < S
            k = tl.load(k_base + cols[:, None] * sks + offs_d[None, :], mask=kmask[:, None], other=0.0)
            v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :], mask=kmask[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            valid = kmask[None, :]
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(valid, qk * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp2(qk - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        acc = acc / l_i[:, None]
        if STORE_LSE:  # the backward's row statistics: log2 of sum(exp2(scores)) in the scaled log2 domain
            lse_ptrs = lse_ptr + (b * tl.num_programs(1) + h) * S + offs_m
            if EVEN_M:
                tl.store(lse_ptrs, m_i + tl.log2(l_i))
            else:
                tl.store(lse_ptrs, m_i + tl.log2(l_i), mask=offs_m < S)
        o_ptrs = o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :]
        if EVEN_M:
            tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty))
        else:
            tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)

    return attn_fwd


def flash_attention_triton(
    q: Any,
    k: Any,
    v: Any,
    out: Any | None = None,
    *,
    causal: bool,
    sm_scale: float | None = None,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int = 4,
    num_stages: int = 2,
    lse: Any | None = None,
) -> Any:
    """Attention of torch tensors (B, H, S, D) (unit stride on D) into `out` (empty_like(q) when None).

    `lse`, when given, a contiguous float32 (B, H, S) tensor, receives each query row's log-sum-exp of
    its scaled scores in base 2, `log2(sum_j exp2(s_ij * sm_scale * log2(e)))`, for the backward
    (kernels/attention_bwd.py); the output is the same with or without it."""
    import torch

    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"q, k, v must share one (B, H, S, D) shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    bsz, heads, seq, d = (int(x) for x in q.shape)
    if d not in _spaces.HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not supported: use one of {_spaces.HEAD_DIMS}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape:  # a smaller out would be written past its end
        raise ValueError(f"out has shape {tuple(out.shape)}, expected q's {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(3) != 1:
            raise ValueError(f"{name} must have unit stride on the head dim, got strides {t.stride()}")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    for name, n in (("batch B", bsz), ("heads H", heads)):
        if n > _GRID_YZ_MAX:  # a CUDA/HIP grid's y and z axes
            raise ValueError(f"{name}={n} exceeds the {_GRID_YZ_MAX} programs a GPU grid axis allows")
    if lse is not None and (
        tuple(lse.shape) != (bsz, heads, seq) or lse.dtype != torch.float32 or not lse.is_contiguous()
    ):
        raise ValueError(
            f"lse must be a contiguous float32 tensor of shape {(bsz, heads, seq)}, "
            f"got {lse.dtype} {tuple(lse.shape)}"
        )
    grid = (_cdiv(seq, BLOCK_M), heads, bsz)
    _triton_kernel()[grid](
        q,
        k,
        v,
        out,
        out if lse is None else lse,
        scale * _LOG2E,
        seq,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        D=d,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        CAUSAL=bool(causal),
        EVEN_M=seq % BLOCK_M == 0,
        UPCAST=triton_interpreted(),
        PRECISION=precision,
        WIDE=bsz * heads > 0 and any(wide_offsets(t[0, 0]) for t in (q, k, v, out)),
        STORE_LSE=lse is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


# ---- Pallas -------------------------------------------------------------------------------------------
def flash_attention_pallas(
    q: Any,
    k: Any,
    v: Any,
    out: Any | None = None,
    *,
    causal: bool,
    sm_scale: float | None = None,
    block_q: int,
    block_k_major: int,
    block_k: int,
    interpret: bool | None = None,
    lse: bool = False,
) -> Any:
    """Attention of jax arrays (B, H, S, D). `out`, when given under the interpreter, is aliased as the
    output so unwritten elements keep its (NaN) contents.

    `lse=True` returns `(out, lse)`: lse (B, H, S) float32 holds each query row's natural log-sum-exp of
    its scaled scores, `log(sum_j exp(s_ij * sm_scale))`, for the backward (kernels/attention_bwd.py,
    `flash_attention_bwd_pallas`); the output is the same with or without it."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one (B, H, S, D) shape, got {q.shape}, {k.shape}, {v.shape}")
    if block_k_major % block_k:
        raise ValueError(f"block_k_major={block_k_major} must be a multiple of block_k={block_k}")
    bsz, heads, seq, d = (int(x) for x in q.shape)
    if d not in _spaces.HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not supported: use one of {_spaces.HEAD_DIMS}")
    interpret = pallas_interpret() if interpret is None else interpret
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    f32 = jnp.float32
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else lax.Precision.DEFAULT
    nq, nk, chunks = _cdiv(seq, block_q), _cdiv(seq, block_k_major), block_k_major // block_k

    def kernel(q_ref: Any, k_ref: Any, v_ref: Any, *rest: Any) -> None:
        if lse:  # the row statistics as a second output, (block_q, 1) blocks of (B, H, S, 1)
            o_ref, lse_ref, m_ref, l_ref, acc_ref = rest[-5:]
        else:
            o_ref, m_ref, l_ref, acc_ref = rest[-4:]
        i, j = pl.program_id(2), pl.program_id(3)
        q_start, k_start = i * block_q, j * block_k_major

        @pl.when(j == 0)
        def _init() -> None:
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, f32)
            l_ref[...] = jnp.zeros(l_ref.shape, f32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, f32)

        def compute() -> None:
            qb = q_ref[...]
            rows = q_start + lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)

            def step(c: Any, carry: int) -> int:
                ks = pl.multiple_of(c * block_k, block_k)
                kb = k_ref[pl.ds(ks, block_k), :]
                vb = v_ref[pl.ds(ks, block_k), :]
                kpos = k_start + ks + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
                valid = kpos < seq
                krow = (
                    k_start + ks + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
                )  # no lane->sublane reshape
                vb = jnp.where(krow < seq, vb, jnp.zeros_like(vb))
                if causal:
                    valid = valid & (kpos <= rows)
                s = (
                    lax.dot_general(
                        qb, kb, (((1,), (1,)), ((), ())), preferred_element_type=f32, precision=precision
                    )
                    * scale
                )
                s = jnp.where(valid, s, -jnp.inf)
                m_prev = m_ref[...]
                m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
                p = jnp.exp(s - m_new)
                alpha = jnp.exp(m_prev - m_new)
                l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
                pv = lax.dot_general(
                    p.astype(vb.dtype),
                    vb,
                    (((1,), (0,)), ((), ())),
                    preferred_element_type=f32,
                    precision=precision,
                )
                acc_ref[...] = alpha * acc_ref[...] + pv
                m_ref[...] = m_new
                return carry

            lax.fori_loop(0, chunks, step, 0)

        if causal:
            pl.when(k_start <= q_start + block_q - 1)(compute)
        else:
            compute()

        @pl.when(j == nk - 1)
        def _finish() -> None:
            o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)
            if lse:
                lse_ref[...] = m_ref[...] + jnp.log(l_ref[...])

    def kv_index(b: Any, h: Any, i: Any, j: Any) -> tuple[Any, ...]:
        if causal:  # steps above the diagonal keep the previous block: no new DMA
            # lax.div (truncating) rather than //: the operands are >= 0, and floor division lowers
            # through `sign`, which Mosaic cannot lower without knowing the TPU generation
            j = jnp.minimum(j, lax.div(i * block_q + block_q - 1, block_k_major))
        return (b, h, j, 0)

    sq = pl.squeezed
    in_specs = [
        pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i, j: (b, h, i, 0)),
        pl.BlockSpec((sq, sq, block_k_major, d), kv_index),
        pl.BlockSpec((sq, sq, block_k_major, d), kv_index),
    ]
    args: list[Any] = [q, k, v]
    aliases: dict[int, int] = {}
    if interpret and out is not None:
        # Blocked like the output (jax 0.11's interpreter fails on an unblocked alias of a padded output).
        in_specs.append(pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i, j: (b, h, i, 0)))
        aliases = {3: 0}
        args.append(out)
    compiler_params = (
        pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))
        if jax.default_backend() in ("tpu", "cpu")
        else None
    )
    out_shape: Any = jax.ShapeDtypeStruct(q.shape, q.dtype)
    out_specs: Any = pl.BlockSpec((sq, sq, block_q, d), lambda b, h, i, j: (b, h, i, 0))
    if lse:  # (B, H, S, 1): a (block_q, 1) block has the full last dim, as Mosaic's tiling allows
        out_shape = [out_shape, jax.ShapeDtypeStruct((bsz, heads, seq, 1), f32)]
        out_specs = [out_specs, pl.BlockSpec((sq, sq, block_q, 1), lambda b, h, i, j: (b, h, i, 0))]
    call = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(bsz, heads, nq, nk),
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), f32),
            pltpu.VMEM((block_q, 1), f32),
            pltpu.VMEM((block_q, d), f32),
        ],
        input_output_aliases=aliases,
        compiler_params=compiler_params,
        interpret=interpret,
        name="flash_attention_pallas",
    )
    if lse:
        o, rows = call(*args)
        return o, rows[..., 0]
    return call(*args)


# ---- spec plumbing ------------------------------------------------------------------------------------
def _sm_scale(problem: Mapping[str, Any]) -> float | None:
    s = problem.get("sm_scale")
    return None if s is None else float(s)


def _make_inputs(problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    b, h, s, d, _, dtype = _spaces.check_problem(problem)
    rng = np.random.default_rng(seed)
    shape = (b, h, s, d)
    arrays = {name: rng.standard_normal(shape) for name in ("q", "k", "v")}
    # hostile query rows: zeros (uniform attention), x8 (a sharp softmax), subnormals
    hostile_rows(arrays["q"].reshape(-1, d), rng, dtype, 8.0)
    if backend == "triton":
        import torch

        dev, td = torch_device(), torch_dtype(dtype)
        res: dict[str, Any] = {
            n: torch.tensor(a, dtype=torch.float32).to(td).to(dev) for n, a in arrays.items()
        }
        res["out"] = torch.full(shape, float("nan"), dtype=td, device=dev)
        return res
    if backend == "pallas":
        import jax.numpy as jnp

        jd = jnp_dtype(dtype)
        jres: dict[str, Any] = {n: jnp.asarray(a, dtype=jnp.float32).astype(jd) for n, a in arrays.items()}
        jres["out"] = jnp.full(shape, jnp.nan, dtype=jd)
        return jres
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def _reference(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    q, k, v = (to_numpy(inputs[n]) for n in ("q", "k", "v"))
    return attention_reference(q, k, v, causal=causal, sm_scale=_sm_scale(problem))


def _run(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    _, _, _, _, causal, _ = _spaces.check_problem(problem)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if backend == "triton":
        return flash_attention_triton(
            q,
            k,
            v,
            inputs["out"],
            causal=causal,
            sm_scale=_sm_scale(problem),
            BLOCK_M=int(config["BLOCK_M"]),
            BLOCK_N=int(config["BLOCK_N"]),
            num_warps=int(config["num_warps"]),
            num_stages=int(config["num_stages"]),
        )
    if backend == "pallas":
        return flash_attention_pallas(
            q,
            k,
            v,
            inputs.get("out"),
            causal=causal,
            sm_scale=_sm_scale(problem),
            block_q=int(config["block_q"]),
            block_k_major=int(config["block_k_major"]),
            block_k=int(config["block_k"]),
        )
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def _score_pairs(s: int, causal: bool) -> int:
    return s * (s + 1) // 2 if causal else s * s


def _flops(problem: Mapping[str, Any]) -> float:
    """Two matmuls over the (query, key) pairs that count: 4 * B * H * pairs * D (causal: S(S+1)/2 pairs)."""
    b, h, s, d, causal, _ = _spaces.check_problem(problem)
    return float(4 * b * h * _score_pairs(s, causal) * d)


def _bytes(problem: Mapping[str, Any]) -> float:
    """Compulsory traffic: read Q, K, V once and write O once."""
    b, h, s, d, _, dtype = _spaces.check_problem(problem)
    return float(4 * b * h * s * d * dtype_bytes(dtype))


def _tolerance(dtype: str) -> tuple[float, float]:
    return {"float32": (2e-4, 2e-4), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2)}.get(
        dtype, (3e-2, 3e-2)
    )


SPEC = register(
    KernelSpec(
        name="flash_attention",
        description="Flash attention forward (online softmax), causal or not, (B, H, S, D) with D in {64, 128}",
        backends=("triton", "pallas"),
        dtypes=DTYPES,
        default_problem={"B": 1, "H": 2, "S": 40, "D": 64, "causal": True, "dtype": "float16"},
        shape_fields=("B", "H", "S", "D"),
        space=_spaces.attention_space,
        make_inputs=_make_inputs,
        reference=_reference,
        run=_run,
        flops=_flops,
        bytes_moved=_bytes,
        tolerance=_tolerance,
        check_problem=_spaces.check_problem,
        output_buffer="out",
        extra={
            "inputs": ("q", "k", "v", "out"),
            "flags": {"causal": True, "sm_scale": None},
            # torch autograd on Triton: the kernel of kernels/attention_bwd.py, tuned under its own key
            "torch_backward": "flash_attention_bwd",
            # jax's reverse mode on Pallas (tuner/runtime/_kernel_grad.py): the same kernel's Pallas backend
            "jax_backward": "flash_attention_bwd",
        },
    )
)
