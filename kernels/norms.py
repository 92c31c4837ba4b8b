"""Row-wise kernels: softmax, RMSNorm and LayerNorm forward, in Triton and in Pallas.

Every kernel maps an (M, N) matrix row by row:

- softmax:   y = exp(x - max(x)) / sum(exp(x - max(x)))
- rmsnorm:   y = x / sqrt(mean(x**2) + eps) * w
- layernorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b   (biased variance, as torch does)

Statistics are computed in float32 whatever the input dtype, and the output has the input's dtype.

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

from ._common import DTYPES, default_tolerance, jnp_dtype, pallas_interpret, torch_device, torch_dtype
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
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


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
        x_ptr, o_ptr, M, N, sxm, som, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        xrow = x_ptr + tl.minimum(rows, M - 1)[:, None] * sxm
        orow = o_ptr + rows[:, None] * som
        cols = tl.arange(0, BLOCK_N)
        if SINGLE:
            cmask = cols[None, :] < N
            x = tl.load(xrow + cols[None, :], mask=cmask, other=-float("inf")).to(tl.float32)
            e = tl.exp(x - tl.max(x, axis=1)[:, None])
            y = e / tl.sum(e, axis=1)[:, None]
            tl.store(orow + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & cmask)
        else:
            m = tl.full([ROWS], -float("inf"), tl.float32)
            s = tl.zeros([ROWS], tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                x = tl.load(xrow + c[None, :], mask=c[None, :] < N, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=1))
                s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
                m = m_new
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
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
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
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
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
        if kind == "softmax":
            m, s = stats
            return jnp.exp(x - m) / s
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
                stats: tuple[Any, ...] = (m, jnp.sum(jnp.exp(x - m), axis=1, keepdims=True))
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
                e = jnp.where(fresh, jnp.exp(x - m_new), 0.0)
                return m_new, s * jnp.exp(m - m_new) + jnp.sum(e, axis=1, keepdims=True)

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
    interpret = pallas_interpret() if interpret is None else interpret
    params2d = tuple(p.reshape(1, n) for p in params)
    in_specs = [pl.BlockSpec((block_rows, n), lambda i: (i, 0))]
    in_specs += [pl.BlockSpec((1, n), lambda i: (0, 0)) for _ in params2d]
    args: list[Any] = [x, *params2d]
    aliases: dict[int, int] = {}
    alias = interpret and out is not None
    if alias:  # write into the caller's (poisoned) buffer so unwritten elements stay NaN
        in_specs.append(pl.BlockSpec(memory_space=pl.ANY))
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


def _make_inputs(kind: str, problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    m, n, dtype = _spaces.check_problem(problem)
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal((m, n)) * (2.0 if kind == "softmax" else 1.0) + 0.5}
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


def _tolerance(dtype: str) -> tuple[float, float]:
    return default_tolerance(dtype)


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
        tolerance=_tolerance,
        output_buffer="out",
        extra={
            "inputs": ("x",) + _PARAMS[kind] + ("out",),
            "flags": {"eps": _EPS[kind]} if kind in _EPS else {},
        },
    )


SOFTMAX = register(_spec("softmax"))
RMSNORM = register(_spec("rmsnorm"))
LAYERNORM = register(_spec("layernorm"))
