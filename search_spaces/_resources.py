"""Resource estimates shared by the row-wise (softmax / RMSNorm / LayerNorm) and attention spaces.

These are the hard limits a config must respect on a device, written as small pure functions of the
config so a constraint's message can show the estimate beside the limit. The estimates are the same
arithmetic the kernels' docstrings explain; they are deliberately simple (what the tiles need), not a
model of the compiler's allocator.
"""

from __future__ import annotations

from .devices import Device

__all__ = [
    "DTYPE_BYTES",
    "REG_OVERHEAD",
    "REG_SPILL_FACTOR",
    "VMEM_SHARE",
    "TRITON_MAX_NUMEL",
    "dtype_bytes",
    "next_pow2",
    "reg_check",
    "reg_limit_per_thread",
    "tpu_sublanes",
    "vmem_budget",
]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4}

# Triton refuses tensors with more elements than this (triton.language: TRITON_MAX_TENSOR_NUMEL).
TRITON_MAX_NUMEL = 1 << 20

# Registers a kernel needs beyond its tiles (addresses, loop counters, masks); a rough constant.
REG_OVERHEAD = 32

# Registers beyond the per-thread limit spill to local memory rather than fail, so the register
# constraint rejects only tiles that need more than this multiple of the limit: such a config spills
# more than it keeps in registers and can never be competitive (Triton's own tutorial configs, which
# spill a little on sm80, stay well under it).
REG_SPILL_FACTOR = 2

# Share of a TPU's VMEM a kernel may plan to use; the rest is left to Mosaic's internal scratch.
VMEM_SHARE = 0.75


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def reg_limit_per_thread(device: Device, num_warps: int) -> int:
    """32-bit registers one thread may hold when a block of `num_warps` warps (wavefronts on AMD) runs on
    one SM / CU: the per-thread maximum, or less when the block's threads would exhaust its register file."""
    threads = device.warp_size * num_warps
    return min(device.max_regs_per_thread, device.regs_per_sm // threads)


def reg_check(needed: int, device: Device, num_warps: int, what: str) -> bool | str:
    """True when `needed` registers per thread stay within REG_SPILL_FACTOR x the limit, else the reason."""
    limit = reg_limit_per_thread(device, num_warps)
    if needed <= REG_SPILL_FACTOR * limit:
        return True
    return f"needs ~{needed} registers per thread ({what}), more than {REG_SPILL_FACTOR} x the limit {limit}"


def tpu_sublanes(dtype: str) -> int:
    """Rows of one TPU vreg tile for this dtype: 8 for 32-bit, 16 for 16-bit (packed) types."""
    return 8 * max(1, 4 // dtype_bytes(dtype))


def vmem_budget(device: Device) -> int:
    return int(device.vmem_bytes * VMEM_SHARE)
