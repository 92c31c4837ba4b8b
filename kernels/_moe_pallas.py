"""Pallas MoE grouped GEMM, one pallas_call for all experts. Two structures, picked by the target
(see `_matmul_pallas.use_triton_lowering`).

Mosaic (TPU; the CPU interpreter without GPU compiler params). Rows of `x` are sorted by expert. Row tiles are aligned to `bm` over all T rows; a tile that holds rows of
several experts is *visited* once per expert (as in megablox's gmm). Group metadata -- for each visit v:
its expert, its row tile, and whether it is real -- is computed with a few jnp ops and passed by scalar
prefetch, so the BlockSpec index maps pick the expert's weight block and the row tile. There are at most
cdiv(T, bm) + E - 1 visits (each expert boundary inside a tile adds one); the static grid uses that bound
and the spare visits repeat the last real one with every row masked.

Grid (N tiles, visits, K tiles): the visits of one row tile are consecutive, so its output block stays
resident (in VMEM on TPU; under the interpreter it is read back) while each expert writes its own rows
with `where(row in group, acc, previous)`. The K edge is masked to zero in both operands (last K step only).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ._common import pallas_interpret
from ._matmul_pallas import accumulate_k_steps, mask_k, use_triton_lowering

__all__ = ["moe_gemm", "group_metadata"]


def group_metadata(group_sizes: jax.Array, T: int, bm: int) -> tuple[jax.Array, ...]:
    """(expert per visit, row tile per visit, visit is real, group start rows, group end rows)."""
    E = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    first = starts // bm
    last = (jnp.maximum(ends, 1) - 1) // bm
    count = jnp.where(sizes > 0, last - first + 1, 0)
    cum = jnp.cumsum(count)
    excl = cum - count
    n_visits = pl.cdiv(T, bm) + E - 1
    v = jnp.arange(n_visits, dtype=jnp.int32)
    g = jnp.minimum(jnp.searchsorted(cum, v, side="right"), E - 1).astype(jnp.int32)
    tile = (first[g] + (v - excl[g])).astype(jnp.int32)
    total = cum[-1]
    valid = v < total
    last_v = jnp.maximum(total - 1, 0)
    g = jnp.where(valid, g, g[last_v])
    tile = jnp.clip(jnp.where(valid, tile, tile[last_v]), 0, pl.cdiv(T, bm) - 1)
    return g, tile, valid.astype(jnp.int32), starts, ends


def _kernel(
    gid_ref: Any,
    tile_ref: Any,
    valid_ref: Any,
    start_ref: Any,
    end_ref: Any,
    x_ref: Any,
    w_ref: Any,
    o_ref: Any,
    acc_ref: Any,
    *,
    K: int,
    bm: int,
    bk: int,
) -> None:
    v, k = pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _init() -> None:
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def accumulate(masked: bool) -> None:
        a, b = x_ref[...], w_ref[...]
        if masked:
            a, b = mask_k(a, b, k, K, bk)
        precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
        acc_ref[...] += jnp.dot(a, b, preferred_element_type=jnp.float32, precision=precision)

    accumulate_k_steps(accumulate, k, pl.num_programs(2), K, bk)

    @pl.when(k == pl.num_programs(2) - 1)
    def _done() -> None:
        g = gid_ref[v]
        rows = tile_ref[v] * bm + jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        mine = (rows >= start_ref[g]) & (rows < end_ref[g]) & (valid_ref[v] > 0)
        o_ref[...] = jnp.where(mine, acc_ref[...].astype(o_ref.dtype), o_ref[...])


def _gpu_kernel(
    sizes_ref: Any, x_ref: Any, w_ref: Any, o_ref: Any, *, E: int, K: int, N: int, bm: int, bn: int, bk: int
) -> None:
    from jax.experimental.pallas import triton as plgpu

    pid_t, pid_n = pl.program_id(0), pl.program_id(1)

    def find(e: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        tile_lo, row_off, expert, row_start, row_end = carry
        size = plgpu.load(sizes_ref.at[e]).astype(jnp.int32)
        n_tiles = (size + bm - 1) // bm
        hit = (pid_t >= tile_lo) & (pid_t < tile_lo + n_tiles)
        expert = jnp.where(hit, e, expert)
        row_start = jnp.where(hit, row_off + (pid_t - tile_lo) * bm, row_start)
        row_end = jnp.where(hit, row_off + size, row_end)
        return tile_lo + n_tiles, row_off + size, expert, row_start, row_end

    zero = jnp.int32(0)
    _, _, expert, row_start, row_end = jax.lax.fori_loop(0, E, find, (zero, zero, zero - 1, zero, zero))

    @pl.when(expert >= 0)
    def _compute() -> None:
        rm = row_start + jnp.arange(bm)
        rn = pid_n * bn + jnp.arange(bn)
        m_ok, n_ok = rm < row_end, rn < N
        precision = jax.lax.Precision.HIGHEST if x_ref.dtype == jnp.float32 else None

        def body(kk: Any, acc: jax.Array) -> jax.Array:
            rk = kk * bk + jnp.arange(bk)
            k_ok = rk < K
            a = plgpu.load(
                x_ref.at[pl.ds(row_start, bm), pl.ds(kk * bk, bk)],
                mask=m_ok[:, None] & k_ok[None, :],
                other=0,
            )
            b = plgpu.load(
                w_ref.at[expert, pl.ds(kk * bk, bk), pl.ds(pid_n * bn, bn)],
                mask=k_ok[:, None] & n_ok[None, :],
                other=0,
            )
            return acc + jnp.dot(a, b, preferred_element_type=jnp.float32, precision=precision)

        acc = jax.lax.fori_loop(0, pl.cdiv(K, bk), body, jnp.zeros((bm, bn), jnp.float32))
        plgpu.store(
            o_ref.at[pl.ds(row_start, bm), pl.ds(pid_n * bn, bn)],
            acc.astype(o_ref.dtype),
            mask=m_ok[:, None] & n_ok[None, :],
        )


def _moe_gpu(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    bm: int,
    bn: int,
    bk: int,
    num_warps: int,
    num_stages: int,
    interpret: bool,
) -> jax.Array:
    from jax.experimental.pallas import triton as plgpu

    T, K = x.shape
    E, _, N = w.shape
    return pl.pallas_call(
        functools.partial(_gpu_kernel, E=E, K=K, N=N, bm=bm, bn=bn, bk=bk),
        out_shape=jax.ShapeDtypeStruct((T, N), x.dtype),
        grid=(pl.cdiv(T, bm) + E, pl.cdiv(N, bn)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
    )(group_sizes.astype(jnp.int32), x, w)


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "num_warps", "num_stages", "interpret"))
def _moe_jit(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    *,
    bm: int,
    bn: int,
    bk: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> jax.Array:
    from jax.experimental.pallas import tpu as pltpu

    if use_triton_lowering(num_warps, interpret):
        return _moe_gpu(x, w, group_sizes, bm, bn, bk, num_warps or 4, num_stages or 3, interpret)

    T, K = x.shape
    E, _, N = w.shape
    meta = group_metadata(group_sizes, T, bm)
    n_visits = meta[0].shape[0]
    grid = (pl.cdiv(N, bn), n_visits, pl.cdiv(K, bk))
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=grid,
        in_specs=[
            pl.BlockSpec((bm, bk), lambda n, v, k, gid, tile, *_: (tile[v], k)),
            pl.BlockSpec((None, bk, bn), lambda n, v, k, gid, tile, *_: (gid[v], k, n)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda n, v, k, gid, tile, *_: (tile[v], n)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    compiler_params = None
    if not interpret and jax.default_backend() == "tpu":
        nbytes = x.dtype.itemsize
        need = 2 * (bm * bk + bk * bn + bm * bn) * nbytes + bm * bn * 4
        # the visit axis must stay sequential: consecutive visits of a row tile share the output block
        compiler_params = pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=max(32 * 2**20, int(need * 1.25)),
        )
    return pl.pallas_call(
        functools.partial(_kernel, K=K, bm=bm, bk=bk),
        out_shape=jax.ShapeDtypeStruct((T, N), x.dtype),
        grid_spec=spec,
        compiler_params=compiler_params,
        interpret=interpret,
    )(*meta, x, w)


def moe_gemm(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    *,
    bm: int = 128,
    bn: int = 128,
    bk: int = 128,
    num_warps: int | None = None,
    num_stages: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """out[rows of e] = x[rows of e] @ w[e] for x (T, K) sorted by expert, w (E, K, N), group_sizes (E,)."""
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"moe_gemm needs x (T, K) and w (E, K, N), got {x.shape} and {w.shape}")
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}")
    if group_sizes.shape != (w.shape[0],):
        raise ValueError(f"group_sizes has shape {group_sizes.shape}, expected {(w.shape[0],)}")
    interp = pallas_interpret() if interpret is None else interpret
    return _moe_jit(
        x, w, group_sizes, bm=bm, bn=bn, bk=bk, num_warps=num_warps, num_stages=num_stages, interpret=interp
    )
