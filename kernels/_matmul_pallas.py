"""Pallas GEMM kernels: matmul with a fused bias+activation epilogue and the int8 weight-only variant.
Imported lazily. Two structures, picked by the target:

Mosaic (TPU, and the CPU interpreter when no GPU compiler params are given): a 3-D grid (M tiles, N tiles, K tiles) -- or (N, M, K) with grid_order="nm" -- whose last
axis is the sequential reduction; the fp32 accumulator lives in a VMEM scratch buffer, is zeroed at the
first K step and written out (epilogue applied, cast to the output dtype) at the last.

Shapes that are not multiples of the blocks: the edge blocks of A and B read padding (NaN under the
interpreter, garbage on TPU), so the K edge is masked to zero in both operands, on the last K step only
(full blocks skip the selects); the M/N edges only produce rows/columns that lie outside the output and
are dropped when the block is written back.

Triton lowering (NVIDIA; also under the interpreter when `num_warps`/`num_stages` are given, which is how
the CPU tests run it): Pallas' Triton lowering runs grid steps in parallel, so the reduction cannot be a
grid axis. A 2-D grid of (M, N) tiles (order per grid_order) with whole-array refs; each program loops over
K with `lax.fori_loop`, loading (bm, bk) / (bk, bn) tiles by masked `plgpu.load` (masks cover every edge)
and storing its (bm, bn) tile by masked `plgpu.store`. num_warps/num_stages go to the Triton compiler.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import ACTIVATIONS, pallas_interpret

__all__ = ["matmul", "int8_matmul", "epilogue", "gelu", "mask_k", "accumulate_k_steps", "use_triton_lowering"]


def epilogue(acc: jax.Array, bias: jax.Array | None, scale: jax.Array | None, activation: str) -> jax.Array:
    if scale is not None:
        acc = acc * scale.astype(jnp.float32)
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)
    if activation == "relu":
        acc = jnp.maximum(acc, 0.0)
    elif activation == "gelu":
        acc = gelu(acc)
    return acc


# Abramowitz & Stegun 7.1.26: erfc(z) ~ t (a1 + t (a2 + ... + t a5)) exp(-z^2), t = 1 / (1 + p z), z >= 0,
# absolute error <= 1.5e-7 (fp32 rounding level).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu(x: jax.Array) -> jax.Array:
    """Exact-form GELU, 0.5 x (1 + erf(x / sqrt 2)), from exp and a rational term instead of `lax.erf`.

    Pallas' Triton lowering (NVIDIA GPUs) has no rule for `erf` (jax 0.10-0.11: "Unimplemented primitive
    in Pallas Triton lowering: erf"), so every Pallas backend uses this form, and the CPU tests run the
    code that runs on a GPU. 1 + erf(x/sqrt 2) is computed as erfc(|x|/sqrt 2) for x < 0 and
    2 - erfc(x/sqrt 2) otherwise, so large negative x keeps its relative accuracy (no 1 - 1 cancellation).
    """
    z = jnp.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + _AS_P * z)
    poly = t * _AS_A[4]  # Horner: t (a1 + t (a2 + t (a3 + t (a4 + t a5))))
    for a in _AS_A[3::-1]:
        poly = t * (a + poly)
    erfc = poly * jnp.exp(-z * z)
    return 0.5 * x * jnp.where(x < 0, erfc, 2.0 - erfc)


def mask_k(a: jax.Array, b: jax.Array, k: jax.Array, K: int, bk: int) -> tuple[jax.Array, jax.Array]:
    """Zero the columns of `a` and rows of `b` past K in the last (partial) K block."""
    if K % bk == 0:
        return a, b
    ka = k * bk + jax.lax.broadcasted_iota(jnp.int32, a.shape, a.ndim - 1)
    kb = k * bk + jax.lax.broadcasted_iota(jnp.int32, b.shape, b.ndim - 2)
    return jnp.where(ka < K, a, jnp.zeros_like(a)), jnp.where(kb < K, b, jnp.zeros_like(b))


def accumulate_k_steps(accumulate: Any, k: Any, n_k: Any, K: int, bk: int) -> None:
    """Run `accumulate(masked)` for this K step: unmasked on full blocks, masked only on the partial last
    one (the masking selects cost VPU work on every element, so full blocks skip them)."""
    if K % bk == 0:
        accumulate(False)
        return

    @pl.when(k < n_k - 1)
    def _full() -> None:
        accumulate(False)

    @pl.when(k == n_k - 1)
    def _edge() -> None:
        accumulate(True)


def _kernel(
    *refs: Any, K: int, bk: int, has_bias: bool, has_scale: bool, activation: str, k_axis: int
) -> None:
    it = iter(refs)
    a_ref, b_ref = next(it), next(it)
    bias_ref = next(it) if has_bias else None
    scale_ref = next(it) if has_scale else None
    o_ref, acc_ref = next(it), next(it)
    k = pl.program_id(k_axis)

    @pl.when(k == 0)
    def _init() -> None:
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def accumulate(masked: bool) -> None:
        a, b = a_ref[...], b_ref[...]
        if masked:
            a, b = mask_k(a, b, k, K, bk)
        if b.dtype != a.dtype:  # int8 weights: exact in the activation dtype
            b = b.astype(a.dtype)
        precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
        acc_ref[...] += jnp.dot(a, b, preferred_element_type=jnp.float32, precision=precision)

    accumulate_k_steps(accumulate, k, pl.num_programs(k_axis), K, bk)

    @pl.when(k == pl.num_programs(k_axis) - 1)
    def _done() -> None:
        bias = bias_ref[...] if bias_ref is not None else None
        scale = scale_ref[...] if scale_ref is not None else None
        o_ref[...] = epilogue(acc_ref[...], bias, scale, activation).astype(o_ref.dtype)


def _gpu_kernel(
    *refs: Any,
    M: int,
    N: int,
    K: int,
    bm: int,
    bn: int,
    bk: int,
    has_bias: bool,
    has_scale: bool,
    activation: str,
    grid_order: str,
) -> None:
    from jax.experimental.pallas import triton as plgpu

    it = iter(refs)
    a_ref, b_ref = next(it), next(it)
    bias_ref = next(it) if has_bias else None
    scale_ref = next(it) if has_scale else None
    o_ref = next(it)
    g0, g1 = pl.program_id(0), pl.program_id(1)
    i, j = (g0, g1) if grid_order == "mn" else (g1, g0)
    rm = i * bm + jnp.arange(bm)
    rn = j * bn + jnp.arange(bn)
    m_ok, n_ok = rm < M, rn < N
    precision = jax.lax.Precision.HIGHEST if a_ref.dtype == jnp.float32 else None

    def body(kk: Any, acc: jax.Array) -> jax.Array:
        rk = kk * bk + jnp.arange(bk)
        k_ok = rk < K
        a = plgpu.load(
            a_ref.at[pl.ds(i * bm, bm), pl.ds(kk * bk, bk)], mask=m_ok[:, None] & k_ok[None, :], other=0
        )
        b = plgpu.load(
            b_ref.at[pl.ds(kk * bk, bk), pl.ds(j * bn, bn)], mask=k_ok[:, None] & n_ok[None, :], other=0
        )
        if b.dtype != a.dtype:  # int8 weights: exact in the activation dtype
            b = b.astype(a.dtype)
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32, precision=precision)

    acc = jax.lax.fori_loop(0, pl.cdiv(K, bk), body, jnp.zeros((bm, bn), jnp.float32))
    bias = plgpu.load(bias_ref.at[pl.ds(j * bn, bn)], mask=n_ok, other=0) if bias_ref is not None else None
    scale = plgpu.load(scale_ref.at[pl.ds(j * bn, bn)], mask=n_ok, other=0) if scale_ref is not None else None
    acc = epilogue(acc, bias, scale, activation)
    plgpu.store(
        o_ref.at[pl.ds(i * bm, bm), pl.ds(j * bn, bn)],
        acc.astype(o_ref.dtype),
        mask=m_ok[:, None] & n_ok[None, :],
    )


def _call_gpu(
    a: jax.Array,
    b: jax.Array,
    bias: jax.Array | None,
    scale: jax.Array | None,
    activation: str,
    bm: int,
    bn: int,
    bk: int,
    grid_order: str,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> jax.Array:
    from jax.experimental.pallas import triton as plgpu

    M, K = a.shape
    N = b.shape[1]
    gm, gn = pl.cdiv(M, bm), pl.cdiv(N, bn)
    if grid_order not in ("mn", "nm"):
        raise ValueError(f"grid_order={grid_order!r} must be 'mn' or 'nm'")
    operands = [a, b] + [v for v in (bias, scale) if v is not None]
    for vec in (bias, scale):
        if vec is not None and vec.shape != (N,):
            raise ValueError(f"bias/scale must have shape {(N,)}, got {vec.shape}")
    kernel = functools.partial(
        _gpu_kernel,
        M=M,
        N=N,
        K=K,
        bm=bm,
        bn=bn,
        bk=bk,
        has_bias=bias is not None,
        has_scale=scale is not None,
        activation=activation,
        grid_order=grid_order,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((M, N), a.dtype),
        grid=(gm, gn) if grid_order == "mn" else (gn, gm),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
    )(*operands)


def use_triton_lowering(num_warps: int | None, interpret: bool) -> bool:
    """The Triton-lowering structure on a GPU backend, or under the interpreter when GPU compiler params
    are given (the sm80/sm90 spaces have them); the Mosaic structure otherwise."""
    return num_warps is not None or (not interpret and jax.default_backend() == "gpu")


def _call(
    a: jax.Array,
    b: jax.Array,
    bias: jax.Array | None,
    scale: jax.Array | None,
    activation: str,
    bm: int,
    bn: int,
    bk: int,
    grid_order: str,
    interpret: bool,
) -> jax.Array:
    from jax.experimental.pallas import tpu as pltpu

    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs a (M, K) and b (K, N), got {a.shape} and {b.shape}")
    M, K = a.shape
    N = b.shape[1]
    gm, gn, gk = pl.cdiv(M, bm), pl.cdiv(N, bn), pl.cdiv(K, bk)
    if grid_order == "mn":
        grid = (gm, gn, gk)

        def ij(g0: Any, g1: Any) -> tuple[Any, Any]:
            return g0, g1
    elif grid_order == "nm":
        grid = (gn, gm, gk)

        def ij(g0: Any, g1: Any) -> tuple[Any, Any]:
            return g1, g0
    else:
        raise ValueError(f"grid_order={grid_order!r} must be 'mn' or 'nm'")

    in_specs = [
        pl.BlockSpec((bm, bk), lambda g0, g1, k: (ij(g0, g1)[0], k)),
        pl.BlockSpec((bk, bn), lambda g0, g1, k: (k, ij(g0, g1)[1])),
    ]
    operands = [a, b]
    for vec in (bias, scale):
        if vec is not None:
            if vec.shape != (N,):
                raise ValueError(f"bias/scale must have shape {(N,)}, got {vec.shape}")
            in_specs.append(pl.BlockSpec((1, bn), lambda g0, g1, k: (0, ij(g0, g1)[1])))
            operands.append(vec.reshape(1, N))
    kernel = functools.partial(
        _kernel,
        K=K,
        bk=bk,
        has_bias=bias is not None,
        has_scale=scale is not None,
        activation=activation,
        k_axis=2,
    )
    compiler_params = None
    if not interpret and jax.default_backend() == "tpu":
        nbytes = a.dtype.itemsize
        need = (
            2 * (bm * bk * nbytes + bk * bn * b.dtype.itemsize + bm * bn * nbytes + 2 * bn * 4) + bm * bn * 4
        )
        compiler_params = pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=max(32 * 2**20, int(need * 1.25)),
        )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((M, N), a.dtype),
        grid=grid,
        in_specs=in_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda g0, g1, k: ij(g0, g1)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=compiler_params,
        interpret=interpret,
    )(*operands)


@functools.partial(
    jax.jit,
    static_argnames=("activation", "bm", "bn", "bk", "grid_order", "num_warps", "num_stages", "interpret"),
)
def _matmul_jit(
    a: jax.Array,
    b: jax.Array,
    bias: jax.Array | None,
    scale: jax.Array | None,
    *,
    activation: str,
    bm: int,
    bn: int,
    bk: int,
    grid_order: str,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> jax.Array:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
    if use_triton_lowering(num_warps, interpret):
        return _call_gpu(
            a, b, bias, scale, activation, bm, bn, bk, grid_order, num_warps or 4, num_stages or 3, interpret
        )
    return _call(a, b, bias, scale, activation, bm, bn, bk, grid_order, interpret)


def matmul(
    a: jax.Array,
    b: jax.Array,
    bias: jax.Array | None = None,
    activation: str = "none",
    *,
    bm: int = 128,
    bn: int = 128,
    bk: int = 128,
    grid_order: str = "mn",
    num_warps: int | None = None,
    num_stages: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """C = act(A @ B + bias), fp32 accumulation, output in A's dtype. num_warps/num_stages select the
    Triton-lowering structure (GPU compiler params); without them, the Mosaic one (unless on a GPU)."""
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    interp = pallas_interpret() if interpret is None else interpret
    return _matmul_jit(
        a,
        b,
        bias,
        None,
        activation=activation,
        bm=bm,
        bn=bn,
        bk=bk,
        grid_order=grid_order,
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interp,
    )


def int8_matmul(
    x: jax.Array,
    w: jax.Array,
    scale: jax.Array,
    bias: jax.Array | None = None,
    activation: str = "none",
    *,
    bm: int = 128,
    bn: int = 128,
    bk: int = 128,
    grid_order: str = "mn",
    num_warps: int | None = None,
    num_stages: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """C = act((X @ W_int8) * scale + bias): int8 weights converted to X's dtype per block (exact),
    per-output-channel scale applied once to the fp32 accumulator."""
    if w.dtype != jnp.int8:
        raise ValueError(f"w must be int8, got {w.dtype}")
    interp = pallas_interpret() if interpret is None else interpret
    return _matmul_jit(
        x,
        w,
        bias,
        scale,
        activation=activation,
        bm=bm,
        bn=bn,
        bk=bk,
        grid_order=grid_order,
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interp,
    )
