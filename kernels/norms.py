"""Row-wise kernels: softmax, RMSNorm and LayerNorm forward, in Triton and in Pallas.

Every kernel maps an (M, N) matrix row by row:

- softmax:   y = exp(x - max(x)) / sum(exp(x - max(x)))
- rmsnorm:   y = x / sqrt(mean(x**2) + eps) * w
- layernorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b   (biased variance, as torch does)

Statistics are computed in float32 whatever the input dtype, and the output has the input's dtype.

Masked softmax rows: a `-inf` element gets probability 0, on every path (single pass, multi pass, both
backends: the running maximum subtracts 0 while a row has seen only `-inf`, so a row whose first column
blocks are all masked is right). A fully masked row (every element `-inf`) comes out as zeros. That
differs from `torch.softmax`, which returns NaN there, and matches the softmax torch's
`scaled_dot_product_attention` uses for fully masked rows; it also keeps the correctness gate honest,
since an unwritten output is poisoned with NaN and a NaN reference could not tell the two apart.

Triton launchers (`softmax_triton`, `rmsnorm_triton`, `layernorm_triton`) take BLOCK_N,
ROWS_PER_PROGRAM, num_warps (and num_stages, passed through to Triton but not tuned: compiled for sm80
and sm90 the kernels are identical for 1, 2 and 4 stages, because Triton only pipelines loads that feed
a dot; see search_spaces/norms.py). One program owns ROWS_PER_PROGRAM rows as a 2-D tile. When
BLOCK_N >= N the row is loaded once and kept in registers; otherwise the kernel loops over column blocks
(softmax: an online max/sum pass, then a write pass; RMSNorm: a sum-of-squares pass then a write pass;
LayerNorm: mean, variance, write passes), so any row length works with any block. Rows past M are clamped
to the last row for loads (no masked-out garbage reaches the arithmetic) and masked on the store.

Pallas launchers (`softmax_pallas`, ...) take block_rows and block_cols. The grid walks blocks of
`block_rows` whole rows (one VMEM block each, "parallel" dimension); inside, the row is processed in
`block_cols` chunks with a `fori_loop` (same passes as above). When N is not a multiple of block_cols the
last chunk is shifted left to end at N and its already-seen columns are masked out of the statistics.
A partial last row block reads padding (NaN in interpret mode); those rows are computed and discarded.

Outputs: the launchers write into a preallocated `out` (make_inputs provides it, filled with NaN; the
spec names it as `output_buffer` so a checker can poison it again before each run). Triton writes into
it in place; Pallas aliases it to the kernel's output under the interpreter (so unwritten elements stay
NaN) and allocates a fresh output on a device.

Interpreter notes: the kernels upcast to float32 right after every load on every backend (that is what
the GPU version does too), so the Triton interpreter's lack of bf16 arithmetic forces no change here.
The interpreter does change one thing we cannot override: it converts float32 to bfloat16 on the store
by truncation (round toward zero, `fp_downcast_rounding="rtne"` is ignored), where a GPU rounds to
nearest, so on CPU a bf16 output is off by up to one bf16 ulp instead of half of one. That stays inside
the bf16 tolerance (rtol = atol = 3e-2) used by the tests.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import norms as _spaces

from ._common import (
    DTYPES,
    hostile_tiny,
    jnp_dtype,
    pallas_interpret,
    torch_device,
    torch_dtype,
    wide_offsets,
)
from ._registry import KernelSpec, register

__all__ = [
    "softmax_triton",
    "rmsnorm_triton",
    "layernorm_triton",
    "softmax_pallas",
    "rmsnorm_pallas",
    "layernorm_pallas",
    "softmax_reference",
    "rmsnorm_reference",
    "layernorm_reference",
]

logger = logging.getLogger(__name__)

_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
_PARAMS = {"softmax": (), "rmsnorm": ("w",), "layernorm": ("w", "b")}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- references (float64 numpy) ----------------------------------------------------------------------
def softmax_reference(x: np.ndarray) -> np.ndarray:
    """Row softmax; `-inf` entries get probability 0 and a row of only `-inf` is all zeros (torch.softmax
    gives NaN there; zeros are what torch's own attention softmax returns for a fully masked row, and
    they cannot be mistaken for the NaN an unwritten output is poisoned with)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.where(m == -np.inf, 0.0, m))
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s == 0.0, 1.0, s)


def rmsnorm_reference(x: np.ndarray, w: np.ndarray, eps: float = _EPS["rmsnorm"]) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * np.asarray(w, dtype=np.float64)


def layernorm_reference(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = _EPS["layernorm"]
) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * np.asarray(w, np.float64) + np.asarray(b, np.float64)


# ---- Triton -------------------------------------------------------------------------------------------
@functools.cache
def _triton_kernels() -> dict[str, Any]:
    """Define the @triton.jit kernels on first use (TRITON_INTERPRET must already be set on CPU)."""
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(
        x_ptr,
        o_ptr,
        M,
        N,
        sxm,
        som,
        ROWS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SINGLE: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        if WIDE:  # x or out past 2**31 elements: int64 row offsets (wide_offsets)
            rows = rows.to(tl.int64)
        row_ok = rows < M
        xrow = x_ptr + tl.minimum(rows, M - 1)[:, None] * sxm
        orow = o_ptr + rows[:, None] * som
        cols = tl.arange(0, BLOCK_N)
        if SINGLE:
            cmask = cols[None, :] < N
            x = tl.load(xrow + cols[None, :], mask=cmask, other=-float("inf")).to(tl.float32)
            m = tl.max(x, axis=1)
            m = tl.where(m == -float("inf"), 0.0, m)  # a fully masked row: exp(-inf - 0) = 0, not NaN
            e = tl.exp(x - m[:, None])
            s = tl.sum(e, axis=1)
            y = e / tl.where(s == 0.0, 1.0, s)[:, None]  # ... and 0 / 1 = 0
            tl.store(orow + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)
        else:
            m = tl.full([ROWS], -float("inf"), tl.float32)
            s = tl.zeros([ROWS], tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                x = tl.load(xrow + c[None, :], mask=c[None, :] < N, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=1))
                # while every column so far is -inf, subtract 0 instead of -inf (-inf - -inf is NaN)
                m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
                s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
                m = m_new
            m = tl.where(m == -float("inf"), 0.0, m)
            s = tl.where(s == 0.0, 1.0, s)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                cmask = c[None, :] < N
                x = tl.load(xrow + c[None, :], mask=cmask, other=-float("inf")).to(tl.float32)
                y = tl.exp(x - m[:, None]) / s[:, None]
                tl.store(orow + c[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)

    @triton.jit
    def rmsnorm_kernel(
        x_ptr,
        w_ptr,
        o_ptr,
        M,
        N,
        sxm,
        som,
        eps,
        ROWS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SINGLE: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        if WIDE:  # x or out past 2**31 elements: int64 row offsets (wide_offsets)
            rows = rows.to(tl.int64)
        row_ok = rows < M
        xrow = x_ptr + tl.minimum(rows, M - 1)[:, None] * sxm
        orow = o_ptr + rows[:, None] * som
        cols = tl.arange(0, BLOCK_N)
        if SINGLE:
            cmask = cols[None, :] < N
            x = tl.load(xrow + cols[None, :], mask=cmask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(orow + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)
        else:
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                x = tl.load(xrow + c[None, :], mask=c[None, :] < N, other=0.0).to(tl.float32)
                acc += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                cmask = c[None, :] < N
                x = tl.load(xrow + c[None, :], mask=cmask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
                y = x * rstd[:, None] * w[None, :]
                tl.store(orow + c[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)

    @triton.jit
    def layernorm_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        o_ptr,
        M,
        N,
        sxm,
        som,
        eps,
        ROWS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SINGLE: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        if WIDE:  # x or out past 2**31 elements: int64 row offsets (wide_offsets)
            rows = rows.to(tl.int64)
        row_ok = rows < M
        xrow = x_ptr + tl.minimum(rows, M - 1)[:, None] * sxm
        orow = o_ptr + rows[:, None] * som
        cols = tl.arange(0, BLOCK_N)
        if SINGLE:
            cmask = cols[None, :] < N
            x = tl.load(xrow + cols[None, :], mask=cmask, other=0.0).to(tl.float32)
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(cmask, x - mean[:, None], 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            y = xc * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(orow + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)
        else:
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                acc += tl.load(xrow + c[None, :], mask=c[None, :] < N, other=0.0).to(tl.float32)
            mean = tl.sum(acc, axis=1) / N
            acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                cmask = c[None, :] < N
                x = tl.load(xrow + c[None, :], mask=cmask, other=0.0).to(tl.float32)
                xc = tl.where(cmask, x - mean[:, None], 0.0)
                acc += xc * xc
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                cmask = c[None, :] < N
                x = tl.load(xrow + c[None, :], mask=cmask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
                b = tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
                y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
                tl.store(orow + c[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)

    return {"softmax": softmax_kernel, "rmsnorm": rmsnorm_kernel, "layernorm": layernorm_kernel}


def _check_2d(x: Any, out: Any) -> tuple[int, int]:
    if x.ndim != 2 or x.stride(1) != 1 or out.shape != x.shape or out.stride(1) != 1:
        raise ValueError(
            f"x and out must be 2-D with unit column stride and equal shapes, got "
            f"x {tuple(x.shape)} strides {x.stride()}, out {tuple(out.shape)} strides {out.stride()}"
        )
    return int(x.shape[0]), int(x.shape[1])


def _check_params(kind: str, params: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    """The weight (and bias) vectors: each of shape (N,); a shorter one would be read past its end."""
    for name, p in zip(_PARAMS[kind], params, strict=True):
        if tuple(p.shape) != (n,):
            raise ValueError(f"{kind}: {name} has shape {tuple(p.shape)}, expected ({n},) for rows of N={n}")
    return params


def _launch_triton(
    kind: str,
    x: Any,
    params: tuple[Any, ...],
    out: Any,
    eps: float | None,
    BLOCK_N: int,
    ROWS_PER_PROGRAM: int,
    num_warps: int,
    num_stages: int,
) -> Any:
    m, n = _check_2d(x, out)
    params = _check_params(kind, params, n)
    # the kernels index w and b with unit stride: a strided view (w[::2]) is copied, not misread
    params = tuple(p.contiguous() for p in params)
    kernel = _triton_kernels()[kind]
    grid = (_cdiv(m, ROWS_PER_PROGRAM),)
    scalars: tuple[Any, ...] = (m, n, x.stride(0), out.stride(0)) + (() if eps is None else (float(eps),))
    kernel[grid](
        x,
        *params,
        out,
        *scalars,
        ROWS=ROWS_PER_PROGRAM,
        BLOCK_N=BLOCK_N,
        SINGLE=n <= BLOCK_N,
        WIDE=wide_offsets(x, out),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def softmax_triton(
    x: Any,
    out: Any | None = None,
    *,
    BLOCK_N: int,
    ROWS_PER_PROGRAM: int = 1,
    num_warps: int = 4,
    num_stages: int = 1,
) -> Any:
    """Row softmax of a 2-D torch tensor into `out` (allocated with torch.empty_like when None)."""
    import torch

    out = torch.empty_like(x) if out is None else out
    return _launch_triton("softmax", x, (), out, None, BLOCK_N, ROWS_PER_PROGRAM, num_warps, num_stages)


def rmsnorm_triton(
    x: Any,
    w: Any,
    out: Any | None = None,
    *,
    eps: float = _EPS["rmsnorm"],
    BLOCK_N: int,
    ROWS_PER_PROGRAM: int = 1,
    num_warps: int = 4,
    num_stages: int = 1,
) -> Any:
    """RMSNorm of each row of a 2-D torch tensor with weight `w` (N,), into `out`."""
    import torch

    out = torch.empty_like(x) if out is None else out
    return _launch_triton("rmsnorm", x, (w,), out, eps, BLOCK_N, ROWS_PER_PROGRAM, num_warps, num_stages)


def layernorm_triton(
    x: Any,
    w: Any,
    b: Any,
    out: Any | None = None,
    *,
    eps: float = _EPS["layernorm"],
    BLOCK_N: int,
    ROWS_PER_PROGRAM: int = 1,
    num_warps: int = 4,
    num_stages: int = 1,
) -> Any:
    """LayerNorm of each row of a 2-D torch tensor with weight `w` and bias `b` (N,), into `out`."""
    import torch

    out = torch.empty_like(x) if out is None else out
    return _launch_triton("layernorm", x, (w, b), out, eps, BLOCK_N, ROWS_PER_PROGRAM, num_warps, num_stages)


# ---- Pallas -------------------------------------------------------------------------------------------
def _pallas_body(kind: str, n: int, bc: int, eps: float, nparams: int) -> Any:
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    f32 = jnp.float32

    def finish(x: Any, stats: tuple[Any, ...], prm: tuple[Any, ...]) -> Any:
        if kind == "softmax":  # a fully masked row (max -inf, sum 0) comes out as zeros
            m, s = stats
            m = jnp.where(m == -jnp.inf, 0.0, m)
            return jnp.exp(x - m) / jnp.where(s == 0.0, 1.0, s)
        if kind == "rmsnorm":
            (rstd,) = stats
            return x * rstd * prm[0]
        mean, rstd = stats
        return (x - mean) * rstd * prm[0] + prm[1]

    def kernel(*refs: Any) -> None:
        x_ref, prm_refs, o_ref = refs[0], refs[1 : 1 + nparams], refs[-1]
        if bc >= n:  # whole row in one piece
            x = x_ref[...].astype(f32)
            prm = tuple(r[...].astype(f32) for r in prm_refs)
            if kind == "softmax":
                m = jnp.max(x, axis=1, keepdims=True)
                e = jnp.exp(x - jnp.where(m == -jnp.inf, 0.0, m))
                stats: tuple[Any, ...] = (m, jnp.sum(e, axis=1, keepdims=True))
            elif kind == "rmsnorm":
                stats = (lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps),)
            else:
                mean = jnp.mean(x, axis=1, keepdims=True)
                stats = (mean, lax.rsqrt(jnp.mean((x - mean) ** 2, axis=1, keepdims=True) + eps))
            o_ref[...] = finish(x, stats, prm).astype(o_ref.dtype)
            return

        rows = x_ref.shape[0]
        nchunks = _cdiv(n, bc)

        def chunk(j: Any) -> tuple[Any, Any, Any]:
            if n % bc == 0:  # aligned chunks (the only kind the TPU space allows): provably aligned starts
                start = pl.multiple_of(j * bc, bc)
                return start, x_ref[:, pl.ds(start, bc)].astype(f32), jnp.ones((1, bc), jnp.bool_)
            start = jnp.minimum(j * bc, n - bc)
            x = x_ref[:, pl.ds(start, bc)].astype(f32)
            fresh = (
                start + lax.broadcasted_iota(jnp.int32, (1, bc), 1) >= j * bc
            )  # not seen by an earlier chunk
            return start, x, fresh

        zeros = jnp.zeros((rows, 1), f32)
        if kind == "softmax":

            def online(j: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
                m, s = carry
                _, x, fresh = chunk(j)
                m_new = jnp.maximum(m, jnp.max(jnp.where(fresh, x, -jnp.inf), axis=1, keepdims=True))
                m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # all -inf so far: -inf - -inf is NaN
                e = jnp.where(fresh, jnp.exp(x - m_safe), 0.0)
                return m_new, s * jnp.exp(m - m_safe) + jnp.sum(e, axis=1, keepdims=True)

            stats = lax.fori_loop(0, nchunks, online, (jnp.full((rows, 1), -jnp.inf, f32), zeros))
        elif kind == "rmsnorm":

            def sumsq(j: Any, acc: Any) -> Any:
                _, x, fresh = chunk(j)
                return acc + jnp.sum(jnp.where(fresh, x * x, 0.0), axis=1, keepdims=True)

            stats = (lax.rsqrt(lax.fori_loop(0, nchunks, sumsq, zeros) / n + eps),)
        else:

            def total(j: Any, acc: Any) -> Any:
                _, x, fresh = chunk(j)
                return acc + jnp.sum(jnp.where(fresh, x, 0.0), axis=1, keepdims=True)

            mean = lax.fori_loop(0, nchunks, total, zeros) / n

            def sqdev(j: Any, acc: Any) -> Any:
                _, x, fresh = chunk(j)
                return acc + jnp.sum(jnp.where(fresh, (x - mean) ** 2, 0.0), axis=1, keepdims=True)

            stats = (mean, lax.rsqrt(lax.fori_loop(0, nchunks, sqdev, zeros) / n + eps))

        def write(j: Any, carry: int) -> int:
            start, x, _ = chunk(j)
            prm = tuple(r[:, pl.ds(start, bc)].astype(f32) for r in prm_refs)
            o_ref[:, pl.ds(start, bc)] = finish(x, stats, prm).astype(o_ref.dtype)
            return carry

        lax.fori_loop(0, nchunks, write, 0)

    return kernel


def _launch_pallas(
    kind: str,
    x: Any,
    params: tuple[Any, ...],
    out: Any | None,
    eps: float,
    block_rows: int,
    block_cols: int,
    interpret: bool | None,
) -> Any:
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if x.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    m, n = (int(d) for d in x.shape)
    _check_params(kind, params, n)
    interpret = pallas_interpret() if interpret is None else interpret
    params2d = tuple(p.reshape(1, n) for p in params)
    in_specs = [pl.BlockSpec((block_rows, n), lambda i: (i, 0))]
    in_specs += [pl.BlockSpec((1, n), lambda i: (0, 0)) for _ in params2d]
    args: list[Any] = [x, *params2d]
    aliases: dict[int, int] = {}
    alias = interpret and out is not None
    if alias:  # write into the caller's (poisoned) buffer so unwritten elements stay NaN
        # Blocked like the output, not memory_space=pl.ANY: jax 0.11's interpreter pads a blocked output
        # to whole blocks but not an unblocked alias of it, and fails when M is no multiple of the block.
        in_specs.append(pl.BlockSpec((block_rows, n), lambda i: (i, 0)))
        aliases = {len(args): 0}
        args.append(out)
    body = _pallas_body(kind, n, block_cols, eps, len(params2d))
    if alias:
        inner = body

        def body(*refs: Any) -> None:  # drop the aliased input ref: the kernel only writes the output
            inner(*refs[:-2], refs[-1])

    compiler_params = (
        pltpu.CompilerParams(dimension_semantics=("parallel",))
        if jax.default_backend() in ("tpu", "cpu")
        else None
    )
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(_cdiv(m, block_rows),),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((block_rows, n), lambda i: (i, 0)),
        input_output_aliases=aliases,
        compiler_params=compiler_params,
        interpret=interpret,
        name=f"{kind}_pallas",
    )
    return call(*args)


def softmax_pallas(
    x: Any, out: Any | None = None, *, block_rows: int, block_cols: int, interpret: bool | None = None
) -> Any:
    """Row softmax of a 2-D jax array. `out`, when given under the interpreter, is aliased as the output."""
    return _launch_pallas("softmax", x, (), out, 0.0, block_rows, block_cols, interpret)


def rmsnorm_pallas(
    x: Any,
    w: Any,
    out: Any | None = None,
    *,
    eps: float = _EPS["rmsnorm"],
    block_rows: int,
    block_cols: int,
    interpret: bool | None = None,
) -> Any:
    """RMSNorm of each row of a 2-D jax array with weight `w` (N,)."""
    return _launch_pallas("rmsnorm", x, (w,), out, eps, block_rows, block_cols, interpret)


def layernorm_pallas(
    x: Any,
    w: Any,
    b: Any,
    out: Any | None = None,
    *,
    eps: float = _EPS["layernorm"],
    block_rows: int,
    block_cols: int,
    interpret: bool | None = None,
) -> Any:
    """LayerNorm of each row of a 2-D jax array with weight `w` and bias `b` (N,)."""
    return _launch_pallas("layernorm", x, (w, b), out, eps, block_rows, block_cols, interpret)


# ---- spec plumbing ------------------------------------------------------------------------------------
def _eps(kind: str, problem: Mapping[str, Any]) -> float:
    return float(problem.get("eps", _EPS.get(kind, 0.0)))


def softmax_input(rng: np.random.Generator, m: int, n: int, dtype: str) -> np.ndarray:
    """Scores with the values a masked attention softmax meets: 5 % of the elements masked (-inf), and
    the rows cycle (row % 8) through hostile kinds: 1 fully masked, 2 every column but the last masked
    (every column block before the last one is all -inf), 3 the first half masked, 4 all zeros,
    5 large magnitudes (x 300), 6 subnormals of the dtype, 7 zeros among normal values."""
    x = rng.standard_normal((m, n)) * 2.0 + 0.5
    x[rng.random((m, n)) < 0.05] = -np.inf
    for r in range(m):
        kind = r % 8
        if kind == 1:
            x[r] = -np.inf
        elif kind == 2:
            x[r, :-1] = -np.inf
        elif kind == 3:
            x[r, : n // 2] = -np.inf
        elif kind == 4:
            x[r] = 0.0
        elif kind == 5:
            x[r] *= 300.0
        elif kind == 6:
            x[r] = hostile_tiny(rng, n, dtype)
        elif kind == 7:
            x[r, ::3] = 0.0
    return x


def norm_input(rng: np.random.Generator, m: int, n: int, dtype: str) -> np.ndarray:
    """RMSNorm / LayerNorm rows: standard normal + 0.5, with rows cycling (row % 8) through hostile kinds:
    1 all zeros, 2 large magnitudes (x 1000), 3 subnormals of the dtype, 4 every third value zero."""
    x = rng.standard_normal((m, n)) + 0.5
    for r in range(m):
        kind = r % 8
        if kind == 1:
            x[r] = 0.0
        elif kind == 2:
            x[r] *= 1000.0
        elif kind == 3:
            x[r] = hostile_tiny(rng, n, dtype)
        elif kind == 4:
            x[r, ::3] = 0.0
    return x


def _make_inputs(kind: str, problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    m, n, dtype = _spaces.check_problem(problem)
    rng = np.random.default_rng(seed)
    arrays = {"x": softmax_input(rng, m, n, dtype) if kind == "softmax" else norm_input(rng, m, n, dtype)}
    if kind != "softmax":
        arrays["w"] = 1.0 + 0.5 * rng.standard_normal(n)
    if kind == "layernorm":
        arrays["b"] = 0.5 * rng.standard_normal(n)
    return _to_backend(arrays, (m, n), dtype, backend)


def _to_backend(
    arrays: dict[str, np.ndarray], out_shape: tuple[int, ...], dtype: str, backend: str
) -> dict[str, Any]:
    if backend == "triton":
        import torch

        dev, td = torch_device(), torch_dtype(dtype)
        res: dict[str, Any] = {
            k: torch.tensor(v, dtype=torch.float32).to(td).to(dev) for k, v in arrays.items()
        }
        res["out"] = torch.full(out_shape, float("nan"), dtype=td, device=dev)
        return res
    if backend == "pallas":
        import jax.numpy as jnp

        jd = jnp_dtype(dtype)
        jres: dict[str, Any] = {k: jnp.asarray(v, dtype=jnp.float32).astype(jd) for k, v in arrays.items()}
        jres["out"] = jnp.full(out_shape, jnp.nan, dtype=jd)
        return jres
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def _as_np(x: Any) -> np.ndarray:
    from ._common import to_numpy

    return np.asarray(to_numpy(x), dtype=np.float64)


def _reference(kind: str, problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    x = _as_np(inputs["x"])
    if kind == "softmax":
        return softmax_reference(x)
    if kind == "rmsnorm":
        return rmsnorm_reference(x, _as_np(inputs["w"]), _eps(kind, problem))
    return layernorm_reference(x, _as_np(inputs["w"]), _as_np(inputs["b"]), _eps(kind, problem))


def _run(
    kind: str, problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    params = tuple(inputs[k] for k in _PARAMS[kind])
    eps = _eps(kind, problem)
    if backend == "triton":
        return _launch_triton(
            kind,
            inputs["x"],
            params,
            inputs["out"],
            eps if kind != "softmax" else None,
            int(config["BLOCK_N"]),
            int(config["ROWS_PER_PROGRAM"]),
            int(config["num_warps"]),
            int(config.get("num_stages", 1)),
        )
    if backend == "pallas":
        return _launch_pallas(
            kind,
            inputs["x"],
            params,
            inputs.get("out"),
            eps,
            int(config["block_rows"]),
            int(config["block_cols"]),
            None,
        )
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


# elementwise operations per element (memory-bound kernels: the roofline that matters is bytes)
_FLOPS_PER_ELEM = {"softmax": 5, "rmsnorm": 4, "layernorm": 7}
_DESCRIPTIONS = {
    "softmax": "Row softmax forward, y = exp(x - max) / sum(exp(x - max)), fp32 statistics",
    "rmsnorm": "RMSNorm forward with weight, y = x * rsqrt(mean(x^2) + eps) * w, fp32 statistics",
    "layernorm": "LayerNorm forward with weight and bias, y = (x - mean) * rsqrt(var + eps) * w + b",
}


def _flops(kind: str, problem: Mapping[str, Any]) -> float:
    m, n, _ = _spaces.check_problem(problem)
    return float(_FLOPS_PER_ELEM[kind] * m * n)


def _bytes(kind: str, problem: Mapping[str, Any]) -> float:
    """Compulsory traffic: read x once, write y once, read the parameter vectors once."""
    from tuner.search_spaces._resources import dtype_bytes

    m, n, dtype = _spaces.check_problem(problem)
    return float((2 * m * n + len(_PARAMS[kind]) * n) * dtype_bytes(dtype))


# Element-wise |out - ref| <= atol + rtol * |ref|. rtol covers the output dtype's rounding (a bf16 store
# under the Triton interpreter truncates: up to one ulp, 2**-7); atol only absorbs what the dtype cannot
# represent near zero, so it stays far below the smallest outputs that matter: softmax probabilities of a
# 1000-wide row are ~1e-3, and zeroing them fails the check in every dtype.
_RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
_ATOL = {"softmax": 1e-6, "rmsnorm": 1e-5, "layernorm": 1e-5}


def _check_problem(problem: Mapping[str, Any]) -> None:
    _spaces.check_problem(problem)
    eps = problem.get("eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1):
        # eps = 0 divides the all-zero (and, for layernorm, constant) rows of the checks' inputs 0 / 0:
        # NaN in the kernel and the reference alike, so every config would fail the check
        raise ValueError(
            f"eps={eps!r} must be a number in (0, 1) (with eps = 0 an all-zero row normalises to 0 / 0 = NaN)"
        )


def _tolerance(kind: str, dtype: str) -> tuple[float, float]:
    return _RTOL.get(dtype, 3e-2), _ATOL[kind]


def _spec(kind: str) -> KernelSpec:
    problem: dict[str, Any] = {"M": 37, "N": 100, "dtype": "float32"}
    if kind in _EPS:
        problem["eps"] = _EPS[kind]
    space_fn = {
        "softmax": _spaces.softmax_space,
        "rmsnorm": _spaces.rmsnorm_space,
        "layernorm": _spaces.layernorm_space,
    }[kind]
    return KernelSpec(
        name=kind,
        description=_DESCRIPTIONS[kind],
        backends=("triton", "pallas"),
        dtypes=DTYPES,
        default_problem=problem,
        shape_fields=("M", "N"),
        space=space_fn,
        make_inputs=functools.partial(_make_inputs, kind),
        reference=functools.partial(_reference, kind),
        run=functools.partial(_run, kind),
        flops=functools.partial(_flops, kind),
        bytes_moved=functools.partial(_bytes, kind),
        tolerance=functools.partial(_tolerance, kind),
        check_problem=_check_problem,
        output_buffer="out",
        extra={
            "inputs": ("x",) + _PARAMS[kind] + ("out",),
            "flags": {"eps": _EPS[kind]} if kind in _EPS else {},
        },
    )


SOFTMAX = register(_spec("softmax"))
RMSNORM = register(_spec("rmsnorm"))
LAYERNORM = register(_spec("layernorm"))
