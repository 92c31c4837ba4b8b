"""Pallas MoE grouped GEMM (Mosaic/TPU layout; interpret=True on CPU), one pallas_call for all experts.

Rows of `x` are sorted by expert. Row tiles are aligned to `bm` over all T rows; a tile that holds rows of
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
from ._matmul_pallas import accumulate_k_steps, mask_k

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


def _kernel(gid_ref: Any, tile_ref: Any, valid_ref: Any, start_ref: Any, end_ref: Any,
            x_ref: Any, w_ref: Any, o_ref: Any, acc_ref: Any, *, K: int, bm: int, bk: int) -> None:
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


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "interpret"))
def _moe_jit(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, bm: int, bn: int, bk: int,
             interpret: bool) -> jax.Array:
    from jax.experimental.pallas import tpu as pltpu

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
        compiler_params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                               vmem_limit_bytes=max(32 * 2**20, int(need * 1.25)))
    return pl.pallas_call(
        functools.partial(_kernel, K=K, bm=bm, bk=bk),
        out_shape=jax.ShapeDtypeStruct((T, N), x.dtype),
        grid_spec=spec,
        compiler_params=compiler_params,
        interpret=interpret,
    )(*meta, x, w)


def moe_gemm(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, bm: int = 128, bn: int = 128,
             bk: int = 128, interpret: bool | None = None) -> jax.Array:
    """out[rows of e] = x[rows of e] @ w[e] for x (T, K) sorted by expert, w (E, K, N), group_sizes (E,)."""
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"moe_gemm needs x (T, K) and w (E, K, N), got {x.shape} and {w.shape}")
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}")
    if group_sizes.shape != (w.shape[0],):
        raise ValueError(f"group_sizes has shape {group_sizes.shape}, expected {(w.shape[0],)}")
    interp = pallas_interpret() if interpret is None else interpret
    return _moe_jit(x, w, group_sizes, bm=bm, bn=bn, bk=bk, interpret=interp)
