"""Shared pieces of the GEMM-family spaces (matmul, int8 weight-only matmul, MoE grouped GEMM).

The resource models are deliberately simple, conservative upper bounds on what the Triton / Mosaic
compilers allocate; they exist to reject configs that can never run *before* anything compiles, and
each violation message names the values it used.

Triton on NVIDIA (per program = one thread block):
- shared memory: the software pipeline keeps `num_stages` copies of the A and B tiles
  (`num_stages * (BLOCK_M*BLOCK_K*a_bytes + BLOCK_K*BLOCK_N*b_bytes)`), and the epilogue may reuse it
  for a layout conversion of the fp32 accumulator (`BLOCK_M*BLOCK_N*4`); the larger of the two must fit
  in the device's opt-in maximum per block (163 KiB on sm80, 227 KiB on sm90, 64 KiB on gfx942).
- registers per thread: the fp32 accumulator is spread over the `warp_size*num_warps` threads (32 on
  NVIDIA, 64 on AMD, whose num_warps counts wavefronts); on sm80 (and on AMD, whose MFMA reads registers) the
  mma.sync operands are also staged in registers, while on sm90 wgmma reads both operands from shared
  memory (only A when it comes from registers, which Triton does not do for these kernels), so the
  operand term is dropped there. Plus a fixed allowance for addresses, masks and loop state.
  The total must stay within `max_regs_per_thread` (255).
- threads: `warp_size*num_warps <= max_threads_per_block`.
AMD GPUs (Triton's AMD backend) have the same three limits with their own figures (64 KiB of LDS per
workgroup on gfx90a / gfx942, 160 KiB on gfx950; 512 registers per lane; 1024 work-items).

Pallas on NVIDIA (its Triton lowering) compiles to the same kind of Triton program, so the same shared
memory / register / thread limits apply to bm/bn/bk with the num_warps/num_stages compiler params.

Pallas on TPU (Mosaic): the pipeline double-buffers every block in VMEM; the fp32 accumulator is a
VMEM scratch buffer. The sum must fit in the chip's VMEM (16 MiB on v4, 128 MiB on v5e/v6e, 95 MiB on
v5p). Block shapes follow the TPU tiling rule: the last dimension a multiple of 128 lanes, the
second-to-last a multiple of the dtype's sublane packing (8 rows of 32-bit, 16 of 16-bit, 32 of 8-bit).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._params import Categorical, Param, PowerOfTwo
from ._space import Constraint
from .devices import Device

__all__ = [
    "dtype_bytes",
    "next_pow2",
    "cdiv",
    "REG_OVERHEAD",
    "triton_tile_params",
    "pallas_tile_params",
    "triton_resource_constraints",
    "tile_fits_problem",
    "tpu_tiling_constraint",
    "vmem_constraint",
    "sublane_multiple",
]

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4}

# Registers per thread that are not accumulator or operand fragments (addresses, masks, loop state).
REG_OVERHEAD = 40


def dtype_bytes(dtype: str) -> int:
    try:
        return _BYTES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {sorted(_BYTES)}") from None


def next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def sublane_multiple(dtype: str) -> int:
    """Rows per TPU vreg tile for a dtype: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit."""
    return {4: 8, 2: 16, 1: 32}[dtype_bytes(dtype)]


def triton_tile_params(device: Device, *, split_k: bool = True, group_m: bool = True) -> list[Param]:
    """BLOCK_M/N/K, GROUP_M, SPLIT_K, num_warps, num_stages; small blocks on the CPU interpreter."""
    if device.kind == "cpu":
        params = [
            PowerOfTwo("BLOCK_M", 16, 64, default=32),
            PowerOfTwo("BLOCK_N", 16, 64, default=32),
            PowerOfTwo("BLOCK_K", 16, 64, default=32),
        ]
        if group_m:
            params.append(Categorical("GROUP_M", (1, 2, 4), ordered=True, default=1))
        if split_k:
            params.append(Categorical("SPLIT_K", (1, 2, 4), ordered=True, default=1))
        params += [
            Categorical("num_warps", (1, 2, 4), ordered=True, default=4),
            Categorical("num_stages", (1, 2), ordered=True, default=2),
        ]
        return params
    if device.kind != "cuda":
        raise ValueError(f"the Triton backend needs a cuda or cpu device, got {device.arch!r}")
    params = [
        PowerOfTwo("BLOCK_M", 16, 256, default=64),
        PowerOfTwo("BLOCK_N", 16, 256, default=64),
        PowerOfTwo("BLOCK_K", 16, 128, default=32),
    ]
    if group_m:
        params.append(Categorical("GROUP_M", (1, 2, 4, 8, 16), ordered=True, default=8))
    if split_k:
        params.append(Categorical("SPLIT_K", (1, 2, 4, 8, 16), ordered=True, default=1))
    params += [
        Categorical("num_warps", (2, 4, 8), ordered=True, default=4),
        Categorical("num_stages", (1, 2, 3, 4, 5, 6), ordered=True, default=3),
    ]
    return params


# Known good tiles of an fp16/bf16 Triton GEMM on NVIDIA GPUs: the CUDA config list of Triton's matrix
# multiplication tutorial (triton-lang/triton, python/tutorials/03-matrix-multiplication.py, MIT licence),
# which triton.autotune users start from. The GEMM spaces pass them as `suggested=`: a cold tuning
# measures them right after the space's default (SearchSpace.suggested makes each valid for the problem).
# On an H200, bf16 4096^3: the first of them ran at 0.96x torch.matmul (benchmarks/foreign_gpu_check.py),
# while the first ten cold proposals without them reached 0.29x (docs/benchmarks.md).
NVIDIA_GEMM_TUTORIAL_TILES: tuple[dict[str, int], ...] = (
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8},
    {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 128, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 5, "num_warps": 2},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 5, "num_warps": 2},
)


def triton_gemm_suggested(device: Device) -> tuple[dict[str, int], ...]:
    """The suggested first configs of a Triton GEMM space on `device` (none off NVIDIA GPUs)."""
    return NVIDIA_GEMM_TUTORIAL_TILES if device.kind == "cuda" and device.vendor == "nvidia" else ()


def pallas_tile_params(device: Device, *, grid_order: bool = True) -> list[Param]:
    """bm/bn/bk (+ grid order): TPU-sized blocks on TPU, small ones on the CPU interpreter; on NVIDIA
    (Pallas' Triton lowering) Triton-sized blocks plus the compiler params num_warps and num_stages."""
    if device.kind == "cpu":
        params = [
            PowerOfTwo("bm", 8, 64, default=32),
            PowerOfTwo("bn", 16, 64, default=32),
            PowerOfTwo("bk", 16, 64, default=32),
        ]
    elif device.kind == "tpu":
        params = [
            PowerOfTwo("bm", 8, 1024, default=256),
            PowerOfTwo("bn", 128, 2048, default=256),
            PowerOfTwo("bk", 128, 2048, default=512),
        ]
    elif device.kind == "cuda":
        params = [
            PowerOfTwo("bm", 16, 256, default=64),
            PowerOfTwo("bn", 16, 256, default=64),
            PowerOfTwo("bk", 16, 128, default=32),
        ]
    else:
        raise ValueError(f"no Pallas tile parameters for device kind {device.kind!r}")
    if grid_order:
        params.append(Categorical("grid_order", ("mn", "nm"), default="mn"))
    if device.kind == "cuda":
        params += [
            Categorical("num_warps", (2, 4, 8), ordered=True, default=4),
            Categorical("num_stages", (1, 2, 3, 4, 5), ordered=True, default=3),
        ]
    return params


def tile_fits_problem(pname: str, dim_name: str, dim: int, minimum: int) -> Constraint:
    """A block larger than the next power of two of its dimension only computes padding."""
    limit = max(minimum, next_pow2(dim))

    def check(c: Mapping[str, Any]) -> bool | str:
        v = int(c[pname])
        return True if v <= limit else f"{pname}={v} > {limit} (next power of two of {dim_name}={dim})"

    return Constraint(f"{pname} <= next_pow2({dim_name})", check, (pname,))


def triton_resource_constraints(
    device: Device,
    a_bytes: int,
    b_bytes: int,
    *,
    b_in_registers_extra: float = 0.0,
    names: tuple[str, str, str] = ("BLOCK_M", "BLOCK_N", "BLOCK_K"),
) -> list[Constraint]:
    """Shared-memory, register and thread limits of one Triton GEMM program on a GPU (NVIDIA or AMD).

    `b_in_registers_extra` adds registers per thread for a dequantised copy of the B tile (int8 kernel);
    `names` are the tile parameters (("bm", "bn", "bk") for Pallas' Triton lowering).
    """
    if device.kind != "cuda":
        return []
    nm, nn, nk = names

    def get(c: Mapping[str, Any]) -> tuple[int, int, int]:
        return int(c[nm]), int(c[nn]), int(c[nk])

    smem_limit = device.smem_per_block_bytes
    uses = (nm, nn, nk, "num_stages")

    def smem(c: Mapping[str, Any]) -> bool | str:
        bm, bn, bk = get(c)
        stages = int(c["num_stages"])
        pipe = stages * (bm * bk * a_bytes + bk * bn * b_bytes)
        epi = bm * bn * 4
        need = max(pipe, epi)
        if need <= smem_limit:
            return True
        return (
            f"smem {need} B > {smem_limit} B for {nm}={bm}, {nn}={bn}, {nk}={bk}, "
            f"num_stages={stages} on {device.arch}"
        )

    def regs(c: Mapping[str, Any]) -> bool | str:
        bm, bn, bk = get(c)
        threads = device.warp_size * int(c["num_warps"])
        acc = bm * bn / threads
        # sm90's wgmma and sm100's tcgen05 read the operands from shared memory; mma.sync (sm70 to sm89, and
        # the consumer Blackwell sm120, which has neither) takes them in registers
        smem_operands = device.arch in ("sm90", "sm100")
        operands = 0.0 if smem_operands else (bm * bk * a_bytes + bk * bn * b_bytes) / 4 / threads
        extra = b_in_registers_extra * bk * bn / threads
        need = int(acc + operands + extra + REG_OVERHEAD)
        if need <= device.max_regs_per_thread:
            return True
        return (
            f"registers {need}/thread > {device.max_regs_per_thread} for {nm}={bm}, {nn}={bn}, "
            f"{nk}={bk}, num_warps={c['num_warps']} on {device.arch}"
        )

    def threads(c: Mapping[str, Any]) -> bool | str:
        t = device.warp_size * int(c["num_warps"])
        return (
            True
            if t <= device.max_threads_per_block
            else (f"threads {t} > {device.max_threads_per_block} for num_warps={c['num_warps']}")
        )

    return [
        Constraint(f"smem <= {smem_limit // 1024} KiB", smem, uses),
        Constraint(f"registers/thread <= {device.max_regs_per_thread}", regs, (nm, nn, nk, "num_warps")),
        Constraint(f"threads <= {device.max_threads_per_block}", threads, ("num_warps",)),
    ]


def tpu_tiling_constraint(rows: tuple[str, ...], lanes: tuple[str, ...], row_mult: int) -> Constraint:
    """TPU block tiling: `rows` params multiple of the sublane packing, `lanes` params of 128."""

    def check(c: Mapping[str, Any]) -> bool | str:
        bad = [f"{p}={c[p]} is not a multiple of {row_mult} sublanes" for p in rows if int(c[p]) % row_mult]
        bad += [f"{p}={c[p]} is not a multiple of 128 lanes" for p in lanes if int(c[p]) % 128]
        return True if not bad else "; ".join(bad)

    return Constraint(f"TPU tiling ({row_mult}, 128)", check, rows + lanes)


def vmem_constraint(
    device: Device, need: Callable[[Mapping[str, Any]], int], uses: tuple[str, ...]
) -> Constraint:
    """`need(config)` bytes of VMEM (double-buffered blocks + scratch) within the TPU's VMEM."""
    limit = device.vmem_bytes

    def check(c: Mapping[str, Any]) -> bool | str:
        n = need(c)
        vals = ", ".join(f"{p}={c[p]}" for p in uses)
        return True if n <= limit else f"vmem {n} B > {limit} B for {vals} on {device.arch}"

    return Constraint(f"vmem <= {limit // 2**20} MiB", check, uses)
