"""Property tests of the GEMM-family search spaces (matmul, int8_matmul, moe_gemm): sampled configs satisfy
every constraint, violations name the offending values, and the limits differ where the hardware does."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuner.search_spaces import get_device
from tuner.search_spaces.int8_matmul import int8_matmul_space
from tuner.search_spaces.matmul import matmul_space
from tuner.search_spaces.moe_gemm import moe_gemm_space

SPACES = {"matmul": matmul_space, "int8_matmul": int8_matmul_space, "moe_gemm": moe_gemm_space}
DEVICES = {
    "triton": ["sm80", "sm90", "cpu"],
    "pallas": ["tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "sm80", "sm90", "cpu"],
}
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _problem(kernel: str, m: int, n: int, k: int, e: int, dtype: str) -> dict:
    if kernel == "moe_gemm":
        return {"T": m, "N": n, "K": k, "E": e, "dtype": dtype}
    return {"M": m, "N": n, "K": k, "dtype": dtype, "bias": True, "activation": "relu"}


problems = st.tuples(
    st.sampled_from(sorted(SPACES)),
    st.sampled_from(["triton", "pallas"]),
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.integers(1, 64),
    st.sampled_from(["float32", "float16", "bfloat16"]),
    st.integers(0, 10),
)


@SETTINGS
@given(problems, st.data())
def test_sampled_configs_satisfy_every_constraint(p: tuple, data: st.DataObject) -> None:
    kernel, backend, m, n, k, e, dtype, seed = p
    arch = data.draw(st.sampled_from(DEVICES[backend]))
    space = SPACES[kernel](_problem(kernel, m, n, k, e, dtype), get_device(arch), backend)
    for cfg in space.sample(seed, 5):
        assert space.violations(cfg) == []
        for c in space.constraints:
            assert c.check(cfg) is True, (c.name, cfg)


@SETTINGS
@given(problems, st.data())
def test_violations_name_the_offending_values(p: tuple, data: st.DataObject) -> None:
    kernel, backend, m, n, k, e, dtype, _ = p
    arch = data.draw(st.sampled_from(DEVICES[backend]))
    space = SPACES[kernel](_problem(kernel, m, n, k, e, dtype), get_device(arch), backend)
    cfg = {prm.name: data.draw(st.sampled_from(prm.values)) for prm in space.params}
    for reason in space.violations(cfg):
        named = [
            name
            for name, v in cfg.items()
            if re.search(rf"\b{re.escape(name)}={re.escape(repr(v))}", reason) or f"{name}={v}" in reason
        ]
        assert named, f"reason {reason!r} names none of {cfg}"


def test_smem_fits_sm90_but_not_sm80() -> None:
    """128x256x64 fp16 tiles, 4 stages: 192 KiB of shared memory -- under 227 KiB, over 163 KiB."""
    prob = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "bias": False, "activation": "none"}
    cfg = {
        "BLOCK_M": 128,
        "BLOCK_N": 256,
        "BLOCK_K": 64,
        "GROUP_M": 8,
        "SPLIT_K": 1,
        "num_warps": 8,
        "num_stages": 4,
    }
    assert matmul_space(prob, get_device("sm90"), "triton").contains(cfg)
    reasons = matmul_space(prob, get_device("sm80"), "triton").violations(cfg)
    assert len(reasons) == 1
    assert (
        "smem 196608 B > 166912 B" in reasons[0]
        and "BLOCK_N=256" in reasons[0]
        and "num_stages=4" in reasons[0]
    )


def test_registers_differ_between_mma_sync_and_wgmma() -> None:
    """sm80 stages the mma operands in registers, sm90's wgmma reads them from shared memory."""
    prob = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "bias": False, "activation": "none"}
    cfg = {
        "BLOCK_M": 128,
        "BLOCK_N": 64,
        "BLOCK_K": 64,
        "GROUP_M": 8,
        "SPLIT_K": 1,
        "num_warps": 2,
        "num_stages": 2,
    }
    assert matmul_space(prob, get_device("sm90"), "triton").contains(cfg)
    reasons = matmul_space(prob, get_device("sm80"), "triton").violations(cfg)
    assert len(reasons) == 1 and reasons[0].startswith("violates registers/thread <= 255")
    assert "num_warps=2" in reasons[0]


def test_vmem_fits_v5e_but_not_v4() -> None:
    prob = {"M": 8192, "N": 8192, "K": 8192, "dtype": "float32", "bias": True, "activation": "none"}
    cfg = {"bm": 1024, "bn": 2048, "bk": 1024, "grid_order": "mn"}
    assert matmul_space(prob, get_device("tpu_v5e"), "pallas").contains(cfg)
    reasons = matmul_space(prob, get_device("tpu_v4"), "pallas").violations(cfg)
    assert len(reasons) == 1 and "vmem" in reasons[0] and "bm=1024" in reasons[0] and "16 MiB" in reasons[0]


def test_tpu_tiling_depends_on_dtype() -> None:
    """8 rows fill a 32-bit vreg tile; bf16 packs 16 rows, so bm=8 is rejected for bf16 only."""
    cfg = {"bm": 8, "bn": 128, "bk": 128, "grid_order": "mn"}
    base = {"M": 1000, "N": 1000, "K": 1000, "bias": False, "activation": "none"}
    dev = get_device("tpu_v5e")
    assert matmul_space({**base, "dtype": "float32"}, dev, "pallas").contains(cfg)
    reasons = matmul_space({**base, "dtype": "bfloat16"}, dev, "pallas").violations(cfg)
    assert any("bm=8 is not a multiple of 16 sublanes" in r for r in reasons)


def test_problem_constraints_name_values() -> None:
    prob = {"M": 50, "N": 40, "K": 70, "dtype": "float16", "bias": False, "activation": "none"}
    space = matmul_space(prob, get_device("cpu"), "triton")
    cfg = {
        "BLOCK_M": 16,
        "BLOCK_N": 16,
        "BLOCK_K": 64,
        "GROUP_M": 1,
        "SPLIT_K": 4,
        "num_warps": 1,
        "num_stages": 1,
    }
    (reason,) = space.violations(cfg)
    assert "SPLIT_K=4 > 2 K tiles (K=70, BLOCK_K=64)" in reason
    small = matmul_space({**prob, "M": 20}, get_device("cpu"), "triton")
    cfg2 = {**cfg, "SPLIT_K": 1, "BLOCK_M": 64}
    assert any("BLOCK_M=64 > 32 (next power of two of M=20)" in r for r in small.violations(cfg2))


def test_cpu_spaces_offer_small_blocks_and_backends_refuse_foreign_devices() -> None:
    prob = {"M": 50, "N": 40, "K": 70, "dtype": "float16", "bias": True, "activation": "gelu"}
    space = matmul_space(prob, get_device("cpu"), "triton")
    assert min(space["BLOCK_M"].values) == 16 and max(space["BLOCK_K"].values) <= 64
    with pytest.raises(ValueError, match="cuda or cpu"):
        matmul_space(prob, get_device("tpu_v5e"), "triton")
    gpu = moe_gemm_space({"T": 9, "N": 9, "K": 9, "E": 2, "dtype": "float16"}, get_device("sm90"), "pallas")
    assert {"num_warps", "num_stages"} <= set(gpu.names)  # Pallas' Triton lowering takes the compiler params


def test_pallas_on_nvidia_has_the_triton_limits() -> None:
    """Pallas' Triton lowering compiles to a Triton program: the same smem rule, named by bm/bn/bk."""
    prob = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "bias": False, "activation": "none"}
    cfg = {"bm": 128, "bn": 256, "bk": 64, "grid_order": "nm", "num_warps": 8, "num_stages": 4}
    assert matmul_space(prob, get_device("sm90"), "pallas").contains(cfg)
    (reason,) = matmul_space(prob, get_device("sm80"), "pallas").violations(cfg)
    assert "smem 196608 B > 166912 B for bm=128, bn=256, bk=64, num_stages=4 on sm80" in reason


def test_int8_space_counts_one_byte_weights() -> None:
    """The same tiles fit sm80 for int8 weights (1-byte B) but not for fp16 B."""
    prob = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "bias": False, "activation": "none"}
    cfg = {
        "BLOCK_M": 64,
        "BLOCK_N": 256,
        "BLOCK_K": 128,
        "GROUP_M": 8,
        "SPLIT_K": 1,
        "num_warps": 8,
        "num_stages": 3,
    }
    # fp16: 3 * (64*128*2 + 128*256*2) = 245760 B > 163 KiB; int8 B: 3 * (16384 + 32768) = 147456 B
    assert not matmul_space(prob, get_device("sm80"), "triton").contains(cfg)
    assert int8_matmul_space(prob, get_device("sm80"), "triton").contains(cfg)
