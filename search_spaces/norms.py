"""Search spaces of the row-wise kernels: softmax, RMSNorm and LayerNorm forward (kernels/norms.py).

A problem is {"M": rows, "N": columns, "dtype": ...}. Both backends tile a block of rows and walk the
columns in blocks: when the column block covers the row (BLOCK_N >= N) the row is read once, otherwise
the kernel makes several passes (softmax 2, RMSNorm 2, LayerNorm 3), which is what lets rows longer
than any tile work.

Triton (sm80 / sm90 / CPU interpreter)
  BLOCK_N, ROWS_PER_PROGRAM, num_warps. Hard constraints:
  - the tile ROWS_PER_PROGRAM x BLOCK_N is at most Triton's 2**20 elements;
  - blocks no larger than the problem needs (BLOCK_N <= next_pow2(N), ROWS_PER_PROGRAM <= next_pow2(M)):
    a larger block only adds masked lanes, so it is the same program as a smaller one, only slower;
  - GPU: warp_size * num_warps threads <= the block limit (32 on NVIDIA, 64 on AMD); fp32 tile registers per thread
    (live tiles x ROWS x BLOCK_N / threads + overhead) <= 2 x min(255, regs_per_sm / threads)
    (registers past the limit spill rather than fail; past twice the limit a config spills more than it
    holds, see search_spaces._resources.REG_SPILL_FACTOR).
  Not parameters, by measurement (benchmarks/triton_resources_b.py compiles the kernels for sm80 and
  sm90 without a GPU): num_stages changes nothing in these kernels (identical PTX for 1, 2 and 4
  stages: Triton's pipeliner only stages loads that feed a dot), and their shared memory is the
  cross-warp reduction scratch alone (ROWS x num_warps x 4 bytes, at most 8 KiB here), so no shared
  memory constraint can bind and sm80 and sm90 get the same space.

Pallas (TPU v4 / v5e / v5p / v6e, CPU interpret)
  block_rows, block_cols. The grid walks blocks of `block_rows` whole rows (the row is one VMEM block);
  inside, the kernel walks the row in `block_cols` chunks. Hard constraints:
  - block_cols <= next_pow2(N), block_rows <= next_pow2(M) (as above);
  - TPU: block_rows a multiple of the dtype's sublane count (8 for fp32, 16 for 16-bit types);
    a chunk narrower than the row must be lane aligned (block_cols % 128 == 0) and divide N
    (dynamic lane-dimension slices must start at multiples of 128);
    VMEM: double-buffered input and output blocks + parameters + fp32 chunk temporaries
    <= 75% of the device's VMEM (16 MiB v4, 128 MiB v5e/v6e, 95 MiB v5p).
  The Pallas kernels are written for Mosaic (TPU) semantics; a CUDA device is refused with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._params import Param, PowerOfTwo
from ._resources import (
    REG_OVERHEAD,
    REG_SPILL_FACTOR,
    TRITON_MAX_NUMEL,
    dtype_bytes,
    next_pow2,
    reg_check,
    tpu_sublanes,
    vmem_budget,
)
from ._space import Constraint, SearchSpace
from .devices import Device

__all__ = ["KINDS", "rowwise_space", "softmax_space", "rmsnorm_space", "layernorm_space", "check_problem"]

# kind -> (live fp32 tiles in registers, number of passes over the row when it does not fit one block,
#          number of per-column parameter vectors (weight, bias))
KINDS: dict[str, tuple[int, int, int]] = {
    "softmax": (2, 2, 0),
    "rmsnorm": (2, 2, 1),
    "layernorm": (3, 3, 2),
}

MIN_BLOCK = 16  # tl.arange needs >= 16 lanes to be efficient; the interpreter is fine with it too


def check_problem(problem: Mapping[str, Any]) -> tuple[int, int, str]:
    try:
        m, n, dtype = int(problem["M"]), int(problem["N"]), str(problem.get("dtype", "float32"))
    except KeyError as e:
        raise ValueError(f"row-wise problem needs fields M and N, got {dict(problem)}") from e
    if m < 1 or n < 1:
        raise ValueError(f"row-wise problem needs M >= 1 and N >= 1, got M={m}, N={n}")
    dtype_bytes(dtype)
    return m, n, dtype


def rowwise_space(kind: str, problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    if kind not in KINDS:
        raise ValueError(f"unknown row-wise kernel {kind!r}; known: {sorted(KINDS)}")
    m, n, dtype = check_problem(problem)
    if backend == "triton":
        return _triton_space(kind, m, n, dtype, device)
    if backend == "pallas":
        return _pallas_space(kind, m, n, dtype, device)
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def softmax_space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return rowwise_space("softmax", problem, device, backend)


def rmsnorm_space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return rowwise_space("rmsnorm", problem, device, backend)


def layernorm_space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return rowwise_space("layernorm", problem, device, backend)


# ---- Triton -------------------------------------------------------------------------------------------
def triton_smem_bytes(kind: str, n: int, dtype: str, cfg: Mapping[str, Any]) -> int:
    """The cross-warp reduction scratch: what the compiler allocates for these kernels (measured)."""
    return int(cfg["ROWS_PER_PROGRAM"]) * int(cfg["num_warps"]) * 4


def triton_regs_per_thread(kind: str, cfg: Mapping[str, Any], warp_size: int = 32) -> int:
    live = KINDS[kind][0]
    threads = warp_size * int(cfg["num_warps"])
    return -(-live * int(cfg["ROWS_PER_PROGRAM"]) * int(cfg["BLOCK_N"]) // threads) + REG_OVERHEAD


def _triton_space(kind: str, m: int, n: int, dtype: str, device: Device) -> SearchSpace:
    cap_n = max(MIN_BLOCK, next_pow2(n))
    cap_m = next_pow2(m)
    if device.kind == "cpu":
        params: list[Param] = [
            PowerOfTwo("BLOCK_N", MIN_BLOCK, max(MIN_BLOCK, min(cap_n, 4096))),
            PowerOfTwo("ROWS_PER_PROGRAM", 1, 16),
            PowerOfTwo("num_warps", 1, 8, default=4),
        ]
    elif device.kind == "cuda":
        params = [
            PowerOfTwo("BLOCK_N", MIN_BLOCK, 65536),
            PowerOfTwo("ROWS_PER_PROGRAM", 1, 64),
            PowerOfTwo("num_warps", 1, 32, default=4),
        ]
    else:
        raise ValueError(f"backend 'triton' does not run on {device.name} ({device.arch}); use 'pallas'")

    cons = [
        Constraint(
            f"BLOCK_N <= max({MIN_BLOCK}, next_pow2(N={n}))={cap_n} (a larger block is only masked lanes)",
            lambda c: c["BLOCK_N"] <= cap_n,
            ("BLOCK_N",),
        ),
        Constraint(
            f"ROWS_PER_PROGRAM <= next_pow2(M={m})={cap_m}",
            lambda c: c["ROWS_PER_PROGRAM"] <= cap_m,
            ("ROWS_PER_PROGRAM",),
        ),
        Constraint(
            f"ROWS_PER_PROGRAM * BLOCK_N <= {TRITON_MAX_NUMEL} (Triton's largest tensor)",
            lambda c: c["ROWS_PER_PROGRAM"] * c["BLOCK_N"] <= TRITON_MAX_NUMEL,
            ("ROWS_PER_PROGRAM", "BLOCK_N"),
        ),
    ]
    if device.kind == "cuda":
        cons += [
            Constraint(
                f"{device.warp_size} * num_warps <= {device.max_threads_per_block} threads per block on "
                f"{device.arch}",
                lambda c: device.warp_size * c["num_warps"] <= device.max_threads_per_block,
                ("num_warps",),
            ),
            Constraint(
                f"register estimate <= {REG_SPILL_FACTOR} x min({device.max_regs_per_thread}, "
                f"{device.regs_per_sm} / threads) on {device.arch}",
                lambda c: reg_check(
                    triton_regs_per_thread(kind, c, device.warp_size), device, c["num_warps"], f"{kind} tiles"
                ),
                ("ROWS_PER_PROGRAM", "BLOCK_N", "num_warps"),
            ),
        ]
    return SearchSpace(params, cons, name=f"{kind}/triton/{device.arch}")


# ---- Pallas -------------------------------------------------------------------------------------------
def pallas_vmem_bytes(kind: str, n: int, dtype: str, cfg: Mapping[str, Any]) -> int:
    """Double-buffered input and output row blocks, double-buffered parameter rows, fp32 chunk temps."""
    b = dtype_bytes(dtype)
    rows, chunk = int(cfg["block_rows"]), min(int(cfg["block_cols"]), n)
    live, _, nparams = KINDS[kind]
    return 2 * 2 * rows * n * b + 2 * nparams * n * b + (live + 1) * rows * chunk * 4


def _pallas_space(kind: str, m: int, n: int, dtype: str, device: Device) -> SearchSpace:
    cap_n = max(MIN_BLOCK, next_pow2(n))
    if device.kind == "cpu":
        min_rows = 1
        params: list[Param] = [
            PowerOfTwo("block_rows", 1, 64, default=8),
            PowerOfTwo("block_cols", MIN_BLOCK, max(MIN_BLOCK, min(cap_n, 4096))),
        ]
    elif device.kind == "tpu":
        min_rows = tpu_sublanes(dtype)
        params = [
            PowerOfTwo("block_rows", 8, 1024, default=min_rows),
            PowerOfTwo("block_cols", 128, max(65536, cap_n)),
        ]
    else:
        raise ValueError(
            f"backend 'pallas' targets TPU (Mosaic) and the CPU interpreter; {device.name} ({device.arch}) "
            "is not supported by these kernels: use backend 'triton' on NVIDIA GPUs"
        )
    cap_m = max(min_rows, next_pow2(m))
    cap_n = max(int(params[1].values[0]), cap_n)
    cons = [
        Constraint(
            f"block_cols <= next_pow2(N={n}) or the smallest block ({cap_n}) (a larger one is only padding)",
            lambda c: c["block_cols"] <= cap_n,
            ("block_cols",),
        ),
        Constraint(
            f"block_rows <= next_pow2(M={m}) or the smallest block ({cap_m})",
            lambda c: c["block_rows"] <= cap_m,
            ("block_rows",),
        ),
    ]
    if device.kind == "tpu":
        budget = vmem_budget(device)
        cons += [
            Constraint(
                f"block_rows % {min_rows} == 0 (sublanes of a {dtype} vreg)",
                lambda c: c["block_rows"] % min_rows == 0,
                ("block_rows",),
            ),
            Constraint(
                f"a chunk narrower than the row (N={n}) must be 128-lane aligned and divide N",
                lambda c: c["block_cols"] >= n or (c["block_cols"] % 128 == 0 and n % c["block_cols"] == 0),
                ("block_cols",),
            ),
            Constraint(
                f"VMEM <= {budget // 2**20} MiB on {device.arch}",
                lambda c: (
                    True
                    if pallas_vmem_bytes(kind, n, dtype, c) <= budget
                    else f"needs {pallas_vmem_bytes(kind, n, dtype, c)} bytes ({dtype}, N={n}), budget {budget}"
                ),
                ("block_rows", "block_cols"),
            ),
        ]
    return SearchSpace(params, cons, name=f"{kind}/pallas/{device.arch}")
