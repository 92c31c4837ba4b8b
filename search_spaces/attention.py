"""Search space of flash attention forward (kernels/attention.py).

A problem is {"B", "H", "S", "D", "causal", "dtype"} (inputs (B, H, S, D); queries and keys share the
length S). D must be 64 or 128.

Triton (sm80 / sm90 / CPU interpreter): BLOCK_M (query rows per program), BLOCK_N (keys per inner step),
num_warps, num_stages. Hard constraints:
  - BLOCK_M, BLOCK_N <= max(16, next_pow2(S)) (a larger block is only masked rows);
  - GPU: warp_size * num_warps <= the threads per block limit (warp_size 32 on NVIDIA, 64 on AMD);
    registers: fp32 accumulator BLOCK_M x D + fp32 scores BLOCK_M x BLOCK_N + P and the Q tile in the
    input dtype, divided over the threads, + overhead <= 2 x min(255, regs_per_sm / threads) (past the
    limit registers spill; past twice the limit a config spills more than it holds);
    shared memory: the query tile + the pipelined K and V tiles, (BLOCK_M + t * BLOCK_N) * D * dtype bytes
    with t = 2 * num_stages on sm90 and max(2 * (num_stages - 1), 1) on sm80 (what Triton 3.7 allocates:
    fitted exactly to the compiler's figures by benchmarks/triton_resources_b.py), <= 163 KiB (sm80) /
    227 KiB (sm90), the limit at which Triton refuses to launch.

Backward (`attention_bwd_space`, kernels/attention_bwd.py), Triton: the same parameters and caps;
its registers and shared memory are those of its larger kernel (dK/dV or dQ), `bwd_regs_per_thread` and
`bwd_smem_bytes` (fitted to Triton 3.7's sm80 and sm90 figures, never below them on the configs compiled).
Pallas: block_q (query rows), block_k (keys), one config for the delta, dK/dV and dQ kernels; caps as the
forward's; TPU: block_q a multiple of the sublanes, block_k of 128, and `pallas_bwd_vmem_bytes` (the
larger kernel's double-buffered blocks, lane-padded rows, fp32 accumulators and four fp32 tiles) <= 75%
of VMEM (unmeasured); CPU: both 8..min(next_pow2(S), 64); CUDA refused.

Pallas (TPU v4 / v5e / v5p / v6e, CPU interpret): block_q, block_k_major (the K/V block one grid step
brings into VMEM), block_k (the chunk of it each inner step multiplies). Hard constraints:
  - block_k_major % block_k == 0;
  - block_q, block_k_major <= max(smallest block, next_pow2(S));
  - TPU: block_q a multiple of the sublane count (8 fp32, 16 for 16-bit types); block_k and
    block_k_major multiples of 128 (they are the lane dimension of the score tile);
    VMEM: double-buffered q, k, v, o blocks + fp32 scratch (m, l lane-padded to 128, acc) + the fp32
    score temporaries of one chunk <= 75% of the device's VMEM.
  A CUDA device is refused with a reason (these Pallas kernels are written for Mosaic semantics).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._params import IntRange, Param, PowerOfTwo
from ._resources import (
    REG_OVERHEAD,
    REG_SPILL_FACTOR,
    dtype_bytes,
    next_pow2,
    reg_check,
    tpu_sublanes,
    vmem_budget,
)
from ._space import Constraint, SearchSpace
from .devices import Device

__all__ = ["attention_space", "attention_bwd_space", "check_problem", "HEAD_DIMS"]

HEAD_DIMS = (64, 128)


def check_problem(problem: Mapping[str, Any]) -> tuple[int, int, int, int, bool, str]:
    try:
        b, h, s, d = (int(problem[k]) for k in ("B", "H", "S", "D"))
    except KeyError as e:
        raise ValueError(f"attention problem needs fields B, H, S, D, got {dict(problem)}") from e
    if min(b, h, s) < 1:
        raise ValueError(f"attention problem needs B, H, S >= 1, got B={b}, H={h}, S={s}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not supported: use one of {HEAD_DIMS}")
    dtype = str(problem.get("dtype", "float16"))
    dtype_bytes(dtype)
    return b, h, s, d, bool(problem.get("causal", False)), dtype


def triton_smem_bytes(d: int, dtype: str, cfg: Mapping[str, Any], arch: str = "sm90") -> int:
    """The Q tile + the K and V tile buffers of the software pipeline, as Triton 3.7 allocates them
    (fitted exactly to the compiler's figures, benchmarks/triton_resources_b.py): sm90 keeps
    num_stages buffers of each of K and V; sm80 keeps num_stages - 1 (one K/V tile in all with a
    single stage), as Triton does on every capability below 9. Other targets (sm100, sm120, AMD's gfx)
    are not fitted: they get the larger, sm90 count."""
    stages = int(cfg["num_stages"])
    older_nvidia = re.fullmatch(r"sm\d{2,3}", arch) is not None and int(arch[2:-1]) < 9
    kv_tiles = max(2 * (stages - 1), 1) if older_nvidia else 2 * stages
    return (int(cfg["BLOCK_M"]) + kv_tiles * int(cfg["BLOCK_N"])) * d * dtype_bytes(dtype)


def triton_regs_per_thread(d: int, dtype: str, cfg: Mapping[str, Any], warp_size: int = 32) -> int:
    bm, bn, threads = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), warp_size * int(cfg["num_warps"])
    b = dtype_bytes(dtype)
    # fp32 accumulator + fp32 scores + P in the input dtype + the Q tile held as a dot operand
    words = bm * d + bm * bn + (bm * bn * b) // 4 + (bm * d * b) // 4
    return -(-words // threads) + REG_OVERHEAD


def bwd_smem_bytes(d: int, dtype: str, cfg: Mapping[str, Any], arch: str = "sm90") -> int:
    """Shared memory of the backward's larger kernel, fitted to what Triton 3.7 allocates for sm80 and
    sm90 (bf16, D=128; exact on most configs compiled, above on the rest): the dK/dV kernel holds a
    BLOCK_N x D tile of each of K and V and pipelines the BLOCK_M x D tiles of Q and dO (num_stages buffers
    of each on sm90, max(num_stages - 1, 1) below sm90), plus the lse and delta rows (8 x BLOCK_M bytes a
    stage) and, below sm90, a BLOCK_M x BLOCK_N tile of P^T in the input dtype; the dQ kernel holds Q and dO
    and pipelines K and V likewise. Other targets get the sm90 count."""
    stages = int(cfg["num_stages"])
    older_nvidia = re.fullmatch(r"sm\d{2,3}", arch) is not None and int(arch[2:-1]) < 9
    bm, bn, b = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), dtype_bytes(dtype)
    piped = max(2 * (stages - 1), 2) if older_nvidia else 2 * stages
    extra = 8 * bm * max(stages - 1, 1) + (bm * bn * b if older_nvidia else 0)
    dkdv = (2 * bn + piped * bm) * d * b
    dq = (2 * bm + piped * bn) * d * b
    return max(dkdv, dq) + extra


def bwd_regs_per_thread(d: int, dtype: str, cfg: Mapping[str, Any], warp_size: int = 32) -> int:
    """The dK/dV kernel's live tiles (the larger of the two kernels): fp32 dK and dV accumulators
    (2 x BLOCK_N x D), the K and V tiles in the input dtype, fp32 P^T and dP^T (2 x BLOCK_N x BLOCK_M)
    and dS^T in the input dtype; the dQ kernel's (fp32 dQ, Q and dO tiles, P and dP) likewise, the
    larger of the two divided over the threads, + overhead."""
    bm, bn, threads = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), warp_size * int(cfg["num_warps"])
    b = dtype_bytes(dtype)
    dkdv = 2 * bn * d + (2 * bn * d * b) // 4 + 2 * bm * bn + (bm * bn * b) // 4
    dq = bm * d + (2 * bm * d * b) // 4 + 2 * bm * bn + (bm * bn * b) // 4
    return -(-max(dkdv, dq) // threads) + REG_OVERHEAD


def pallas_vmem_bytes(d: int, dtype: str, cfg: Mapping[str, Any]) -> int:
    b = dtype_bytes(dtype)
    bq, bkm, bk = int(cfg["block_q"]), int(cfg["block_k_major"]), int(cfg["block_k"])
    blocks = 2 * (2 * bq * d + 2 * bkm * d) * b  # q, o and k, v, double-buffered
    scratch = 2 * bq * 128 * 4 + bq * d * 4
    temps = 3 * bq * bk * 4
    return blocks + scratch + temps


def attention_space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    _, _, s, d, _, dtype = check_problem(problem)
    if backend == "triton":
        return _triton_space(s, d, dtype, device)
    if backend == "pallas":
        return _pallas_space(s, d, dtype, device)
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def attention_bwd_space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    """The backward's space (kernels/attention_bwd.py): on Triton the forward's parameters and caps with
    the backward's register and shared-memory estimates; on Pallas block_q and block_k of its own."""
    _, _, s, d, _, dtype = check_problem(problem)
    if backend == "triton":
        return _triton_space(s, d, dtype, device, bwd=True)
    if backend == "pallas":
        return _pallas_bwd_space(s, d, dtype, device)
    raise ValueError(f"unknown backend {backend!r}: use 'triton' or 'pallas'")


def pallas_bwd_vmem_bytes(d: int, dtype: str, cfg: Mapping[str, Any]) -> int:
    """VMEM of the Pallas backward's larger kernel, double-buffered blocks in the input dtype, the (block, 1)
    float32 rows lane-padded to 128, fp32 accumulators and the fp32 tile temporaries (P, dP, dS and the
    scores): dK/dV holds K, V, dK, dV blocks (block_k) and walks Q, dO, lse, delta (block_q) with two
    block_k x D accumulators; dQ holds Q, dO, dQ, lse, delta (block_q) and walks K, V (block_k) with one
    block_q x D accumulator."""
    b = dtype_bytes(dtype)
    bq, bk = int(cfg["block_q"]), int(cfg["block_k"])
    rows = 2 * 2 * bq * 128 * 4  # lse and delta, double-buffered
    temps = 4 * bq * bk * 4
    dkdv = 2 * (4 * bk * d + 2 * bq * d) * b + rows + 2 * bk * d * 4 + temps
    dq = 2 * (3 * bq * d + 2 * bk * d) * b + rows + bq * d * 4 + temps
    return max(dkdv, dq)


def _pallas_blocks(s: int, dtype: str, device: Device, k_major: bool) -> tuple[int, int, list[Param]]:
    """The Pallas attention kernels' block parameters on `device` (block_q, the forward's block_k_major
    where `k_major`, block_k) and the smallest block_q and block_k it allows: (lo_q, lo_k, params)."""
    if device.kind == "cpu":
        top = max(8, min(max(8, next_pow2(s)), 64))
        q, major, k = (
            PowerOfTwo("block_q", 8, top),
            PowerOfTwo("block_k_major", 8, top),
            PowerOfTwo("block_k", 8, top),
        )
        lo_q, lo_k = 8, 8
    elif device.kind == "tpu":
        q = PowerOfTwo("block_q", 8, 1024, default=128)
        major = PowerOfTwo("block_k_major", 128, 2048, default=512)
        k = PowerOfTwo("block_k", 128, 1024, default=128)
        lo_q, lo_k = tpu_sublanes(dtype), 128
    else:
        raise ValueError(
            f"backend 'pallas' targets TPU (Mosaic) and the CPU interpreter; {device.name} ({device.arch}) "
            "is not supported by these kernels: use backend 'triton' on NVIDIA GPUs"
        )
    return lo_q, lo_k, [q, major, k] if k_major else [q, k]


def _pallas_bwd_space(s: int, d: int, dtype: str, device: Device) -> SearchSpace:
    lo_q, lo_k, params = _pallas_blocks(s, dtype, device, k_major=False)
    cap_q = max(lo_q, next_pow2(s))
    cap_k = max(lo_k, next_pow2(s))
    cons = [
        Constraint(
            f"block_q <= max({lo_q}, next_pow2(S={s}))={cap_q}", lambda c: c["block_q"] <= cap_q, ("block_q",)
        ),
        Constraint(
            f"block_k <= max({lo_k}, next_pow2(S={s}))={cap_k}", lambda c: c["block_k"] <= cap_k, ("block_k",)
        ),
    ]
    if device.kind == "tpu":
        budget = vmem_budget(device)
        cons += [
            Constraint(
                f"block_q % {lo_q} == 0 (sublanes of a {dtype} vreg)",
                lambda c: c["block_q"] % lo_q == 0,
                ("block_q",),
            ),
            Constraint(
                f"VMEM <= {budget // 2**20} MiB on {device.arch}",
                lambda c: (
                    True
                    if pallas_bwd_vmem_bytes(d, dtype, c) <= budget
                    else f"needs {pallas_bwd_vmem_bytes(d, dtype, c)} bytes (D={d}, {dtype}), budget {budget}"
                ),
                ("block_q", "block_k"),
            ),
        ]
    return SearchSpace(params, cons, name=f"flash_attention_bwd/pallas/{device.arch}")


def _triton_space(s: int, d: int, dtype: str, device: Device, bwd: bool = False) -> SearchSpace:
    cap = max(16, next_pow2(s))
    if device.kind == "cpu":
        params: list[Param] = [
            PowerOfTwo("BLOCK_M", 16, max(16, min(cap, 64))),
            PowerOfTwo("BLOCK_N", 16, max(16, min(cap, 64))),
            PowerOfTwo("num_warps", 1, 8, default=4),
            IntRange("num_stages", 1, 3, default=2),
        ]
    elif device.kind == "cuda":
        params = [
            PowerOfTwo("BLOCK_M", 16, 256, default=64),
            PowerOfTwo("BLOCK_N", 16, 256, default=64),
            PowerOfTwo("num_warps", 1, 16, default=4),
            IntRange("num_stages", 1, 5, default=2),
        ]
    else:
        raise ValueError(f"backend 'triton' does not run on {device.name} ({device.arch}); use 'pallas'")
    cons = [
        Constraint(
            f"BLOCK_M <= max(16, next_pow2(S={s}))={cap} (a larger block is only masked rows)",
            lambda c: c["BLOCK_M"] <= cap,
            ("BLOCK_M",),
        ),
        Constraint(
            f"BLOCK_N <= max(16, next_pow2(S={s}))={cap} (a larger block is only masked keys)",
            lambda c: c["BLOCK_N"] <= cap,
            ("BLOCK_N",),
        ),
    ]
    if device.kind == "cuda":
        smem_max = device.smem_per_block_bytes
        regs = bwd_regs_per_thread if bwd else triton_regs_per_thread
        smem = bwd_smem_bytes if bwd else triton_smem_bytes
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
                    regs(d, dtype, c, device.warp_size),
                    device,
                    c["num_warps"],
                    f"D={d}, {dtype}",
                ),
                ("BLOCK_M", "BLOCK_N", "num_warps"),
            ),
            Constraint(
                f"shared memory <= {smem_max // 1024} KiB per block on {device.arch}",
                lambda c: (
                    True
                    if smem(d, dtype, c, device.arch) <= smem_max
                    else f"needs {smem(d, dtype, c, device.arch)} bytes (D={d}, {dtype}), limit {smem_max}"
                ),
                ("BLOCK_M", "BLOCK_N", "num_stages"),
            ),
        ]
    name = "flash_attention_bwd" if bwd else "flash_attention"
    return SearchSpace(params, cons, name=f"{name}/triton/{device.arch}")


def _pallas_space(s: int, d: int, dtype: str, device: Device) -> SearchSpace:
    lo_q, lo_k, params = _pallas_blocks(s, dtype, device, k_major=True)
    cap_q = max(lo_q, next_pow2(s))
    cap_k = max(lo_k, next_pow2(s))
    cons = [
        Constraint(
            "block_k_major % block_k == 0 (the inner loop walks whole chunks)",
            lambda c: c["block_k_major"] % c["block_k"] == 0,
            ("block_k_major", "block_k"),
        ),
        Constraint(
            f"block_q <= max({lo_q}, next_pow2(S={s}))={cap_q}", lambda c: c["block_q"] <= cap_q, ("block_q",)
        ),
        Constraint(
            f"block_k_major <= max({lo_k}, next_pow2(S={s}))={cap_k}",
            lambda c: c["block_k_major"] <= cap_k,
            ("block_k_major",),
        ),
    ]
    if device.kind == "tpu":
        budget = vmem_budget(device)
        cons += [
            Constraint(
                f"block_q % {lo_q} == 0 (sublanes of a {dtype} vreg)",
                lambda c: c["block_q"] % lo_q == 0,
                ("block_q",),
            ),
            Constraint(
                f"VMEM <= {budget // 2**20} MiB on {device.arch}",
                lambda c: (
                    True
                    if pallas_vmem_bytes(d, dtype, c) <= budget
                    else f"needs {pallas_vmem_bytes(d, dtype, c)} bytes (D={d}, {dtype}), budget {budget}"
                ),
                ("block_q", "block_k_major", "block_k"),
            ),
        ]
    return SearchSpace(params, cons, name=f"flash_attention/pallas/{device.arch}")
