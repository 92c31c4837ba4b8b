"""One home for device detection: tuner.search_spaces.devices (what kernels, measure, runtime and studies use)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from tuner.search_spaces import devices as dv


def test_cpu_under_the_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "1")
    assert dv.triton_interpreted() and not dv.on_gpu() and dv.pallas_interpret()
    assert dv.detect_device("triton") is dv.CPU
    assert dv.detect_device("pallas") is dv.CPU
    assert dv.device_label("triton") == "cpu"
    with pytest.raises(ValueError, match="'cuda'"):
        dv.detect_device("cuda")
    with pytest.raises(ValueError, match="'cuda'"):
        dv.device_label("cuda")


def test_pallas_interpret_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    assert dv.pallas_interpret() is False
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "")
    assert dv.pallas_interpret() is False  # set but empty: compile, as before
    monkeypatch.delenv("TUNER_PALLAS_INTERPRET")
    jax = pytest.importorskip("jax")
    assert dv.pallas_interpret() is (jax.default_backend() == "cpu")


@pytest.mark.parametrize(
    ("kind", "arch"),
    [("TPU v4", "tpu_v4"), ("TPU v5 lite", "tpu_v5e"), ("TPU v5p", "tpu_v5p"), ("TPU v6e", "tpu_v6e")],
)
def test_tpu_generation_from_jax_device_kind(monkeypatch: pytest.MonkeyPatch, kind: str, arch: str) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    fake = SimpleNamespace(platform="tpu", device_kind=kind)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [fake])
    dev = dv.detect_device("pallas")
    assert (dev.arch, dev.name) == (arch, kind)  # jax's name for the chip, the generation's limits
    assert dev.vmem_bytes == dv.get_device(arch).vmem_bytes
    assert dv.device_label("pallas") == f"tpu:{kind}"


def test_jax_gpu_compute_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for cc, arch in (("8.0", "sm80"), ("8.9", "sm89"), ("9.0", "sm90"), ("10.0", "sm100"), ("12.0", "sm120")):
        monkeypatch.setattr(jax, "devices", lambda *a, cc=cc: [SimpleNamespace(compute_capability=cc)])
        assert dv.detect_device("pallas") is dv.get_device(arch)  # no device_kind: the table's name stays


def test_jax_gpu_keeps_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """jax names an RTX 4090 by its device_kind: the descriptor is sm89's, the name is not the L40S's."""
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    fake = SimpleNamespace(platform="gpu", device_kind="NVIDIA GeForce RTX 4090", compute_capability="8.9")
    monkeypatch.setattr(jax, "devices", lambda *a: [fake])
    dev = dv.detect_device("pallas")
    assert (dev.name, dev.arch, dev.smem_per_block_bytes) == ("NVIDIA GeForce RTX 4090", "sm89", 99 * 1024)
    assert dev.features() == dv.SM89.features()  # the name is no feature


def test_labels_are_the_runtime_key_names() -> None:
    assert dv.jax_device_label(SimpleNamespace(platform="cpu", device_kind="cpu")) == "cpu"
    assert (
        dv.jax_device_label(SimpleNamespace(platform="gpu", device_kind="NVIDIA H100")) == "gpu:NVIDIA H100"
    )
    from tuner.runtime._env import device_of

    assert device_of("python", [1, 2.0]) == "cpu"


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_cuda_label_names_the_gpu_and_its_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    major, minor = torch.cuda.get_device_capability(0)
    assert dv.device_label("triton") == f"{torch.cuda.get_device_name(0)} (sm{major}{minor})"
    dev = dv.detect_device("triton")
    assert (dev.kind, dev.name) == ("cuda", torch.cuda.get_device_name(0))


@pytest.mark.parametrize(
    ("label", "vendor", "arch", "version"),
    [
        ("NVIDIA A100-SXM4-40GB (sm80)", "nvidia", "sm80", 8.0),  # the runtime's Triton label
        ("NVIDIA H100 80GB HBM3 (sm90)", "nvidia", "sm90", 9.0),
        ("gpu:NVIDIA H100 80GB HBM3", "nvidia", "sm90", 9.0),  # jax's label: the model name
        ("NVIDIA GeForce RTX 3090", "nvidia", "sm86", 8.6),
        ("RTX_2080_Ti", "nvidia", "sm75", 7.5),
        ("NVIDIA TITAN RTX", "nvidia", "sm75", 7.5),
        ("Tesla V100-SXM2-16GB", "nvidia", "sm70", 7.0),
        ("NVIDIA L4", "nvidia", "sm89", 8.9),
        ("AMD Instinct MI250X", "amd", "gfx90a", 9.0),
        ("MI300X", "amd", "gfx942", 9.4),
        ("AMD Instinct MI355X", "amd", "gfx950", 9.5),
        # torch on ROCm: get_device_capability() is the gfx version, so the runtime's label says "(sm94)"
        ("AMD Instinct MI300X (sm94)", "amd", "gfx942", 9.4),
        ("AMD Instinct MI250X (sm90)", "amd", "gfx90a", 9.0),
        ("AMD Radeon PRO W6600", "amd", "gfx1030", 10.3),
        ("AMD Radeon RX 7900 XTX", "amd", "gfx1100", 11.0),
        ("gfx90a:sramecc+:xnack-", "amd", "gfx90a", 9.0),  # a gfx target in the label wins
        ("tpu:TPU v5 lite", "google", "tpu_v5e", 5.0),
        ("cpu", "cpu", "cpu", 0.0),
    ],
)
def test_device_family_from_labels(label: str, vendor: str, arch: str, version: float) -> None:
    fam = dv.device_family(label)
    assert (fam.vendor, fam.arch, fam.version) == (vendor, arch, version)


def test_device_family_distance_and_unknown_labels() -> None:
    a4000, a6000, a100 = (dv.device_family(x) for x in ("NVIDIA RTX A4000", "NVIDIA RTX A6000", "A100"))
    assert a4000.distance(a6000) == 0.0 and a4000.distance(a100) == pytest.approx(0.6)
    assert a4000.distance(dv.device_family("AMD Radeon PRO W7800")) == float("inf")
    for label in ("", "some accelerator", "xyz-9000"):
        fam = dv.device_family(label)
        assert not fam.known and fam.distance(fam) == float("inf")
    # a vendor without a model the table knows: the vendor, no arch
    amd = dv.device_family("AMD Radeon Graphics")
    assert amd.vendor == "amd" and amd.arch == "" and amd.distance(dv.device_family("MI250X")) == float("inf")


# ---- NVIDIA GPUs: one descriptor per arch, the limits torch reports winning -----------------------------
def _emulate_cuda_gpu(
    monkeypatch: pytest.MonkeyPatch, name: str, cc: tuple[int, int], **reported: int
) -> None:
    """torch on an NVIDIA GPU of compute capability `cc`; `reported`: the device properties torch has
    (shared_memory_per_block_optin, multi_processor_count, ...), none by default, so the table decides."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(dv, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], **reported)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)


_MATMUL = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}
# 5 stages of a 128x64 A tile and a 64x64 B tile in fp16: 120 KiB of shared memory, over the 99 KiB of
# sm86/sm89/sm120, under the 163 KiB of sm80 and the 227 KiB of sm90
_CFG_120_KIB = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4}
_CFG_120_KIB["num_stages"] = 5


@pytest.mark.parametrize(
    ("name", "cc", "arch"),
    [
        ("NVIDIA GeForce RTX 3090", (8, 6), "sm86"),
        ("NVIDIA A10", (8, 6), "sm86"),
        ("NVIDIA GeForce RTX 4090", (8, 9), "sm89"),
        ("NVIDIA L40S", (8, 9), "sm89"),
        ("NVIDIA GeForce RTX 5090", (12, 0), "sm120"),
    ],
)
def test_a_config_over_99_kib_of_shared_memory_is_rejected_on_sm86_sm89_sm120(
    monkeypatch: pytest.MonkeyPatch, name: str, cc: tuple[int, int], arch: str
) -> None:
    from tuner.search_spaces.matmul import matmul_space

    assert matmul_space(_MATMUL, dv.SM90, "triton").contains(_CFG_120_KIB)
    assert matmul_space(_MATMUL, dv.SM80, "triton").contains(_CFG_120_KIB)
    _emulate_cuda_gpu(monkeypatch, name, cc)
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.name, dev.smem_per_block_bytes) == (arch, name, 101376)
    space = matmul_space(_MATMUL, dev, "triton")
    assert not space.contains(_CFG_120_KIB)
    assert any("smem 122880 B > 101376 B" in v and arch in v for v in space.violations(_CFG_120_KIB))
    assert space.contains({**_CFG_120_KIB, "num_stages": 4})  # 96 KiB fits


@pytest.mark.parametrize(
    ("cc", "arch", "smem_kib"),
    [
        ((7, 0), "sm70", 96),  # V100
        ((7, 2), "sm70", 96),  # Jetson Xavier
        ((7, 5), "sm75", 64),  # T4, RTX 20xx
        ((8, 0), "sm80", 163),  # A100
        ((8, 6), "sm86", 99),  # RTX 30xx, A10, A40, RTX A6000
        ((8, 7), "sm80", 163),  # Jetson Orin
        ((8, 9), "sm89", 99),  # L4, L40S, RTX 40xx
        ((9, 0), "sm90", 227),  # H100, H200
        ((10, 0), "sm100", 227),  # B200, GB200
        ((10, 3), "sm100", 227),  # B300
        ((11, 0), "sm100", 227),  # Jetson Thor
        ((12, 0), "sm120", 99),  # RTX 50xx, RTX PRO 6000 Blackwell
        ((12, 1), "sm120", 99),  # DGX Spark (GB10)
    ],
)
def test_compute_capability_to_descriptor(
    monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int], arch: str, smem_kib: int
) -> None:
    assert dv.nvidia_arch(*cc) == arch
    dev = dv.get_device(arch)
    assert (dev.smem_per_block_bytes, dev.vendor, dev.kind) == (smem_kib * 1024, "nvidia", "cuda")
    assert (dev.regs_per_sm, dev.max_regs_per_thread, dev.max_threads_per_block, dev.warp_size) == (
        65536,
        255,
        1024,
        32,
    )
    assert dv.device_for_label(f"NVIDIA GPU (sm{cc[0]}{cc[1]})") is dev
    _emulate_cuda_gpu(monkeypatch, "NVIDIA GPU", cc)
    # no limits reported: the table's descriptor, under the name torch gives the GPU
    assert dv.detect_device("triton") == replace(dev, name="NVIDIA GPU")
    _emulate_cuda_gpu(monkeypatch, "", cc)
    assert dv.detect_device("triton") is dev  # nothing reported at all: the table's descriptor itself


def test_an_unknown_compute_capability_gets_the_nearest_lower_arch_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dv.nvidia_arch.cache_clear()
    with caplog.at_level("WARNING", logger=dv.__name__):
        assert dv.nvidia_arch(13, 0) == "sm120"  # a future arch: the newest known below it
        assert dv.nvidia_arch(13, 0) == "sm120"
        assert dv.nvidia_arch(9, 5) == "sm90"
        assert dv.nvidia_arch(6, 1) == "sm70"  # older than any known: the oldest known
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and "13.0" in warned[0] and "sm120" in warned[0], warned
    assert dv.device_for_label("NVIDIA GPU (sm130)") is dv.SM120


def test_the_limits_torch_reports_win_over_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.search_spaces.matmul import matmul_space

    # an RTX 4090: sm89 like the table's L40S, with its own SM count and L2
    _emulate_cuda_gpu(
        monkeypatch,
        "NVIDIA GeForce RTX 4090",
        (8, 9),
        shared_memory_per_block_optin=101376,
        multi_processor_count=128,
        L2_cache_size=72 * 2**20,
        regs_per_multiprocessor=65536,
        warp_size=32,
    )
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.name, dev.num_sms, dev.l2_bytes, dev.smem_per_block_bytes) == (
        "sm89",
        "NVIDIA GeForce RTX 4090",  # its own name, not the table's "L40S"
        128,
        72 * 2**20,
        101376,
    )
    assert dev.features()["dev_num_sms"] == 128.0 and dev.features()["dev_l2_mib"] == 72.0
    # torch reports no peaks: those stay the table product's, whose name the arch finds
    assert (dev.peak_tflops_fp16, dev.peak_bandwidth_gbs) == (
        dv.SM89.peak_tflops_fp16,
        dv.SM89.peak_bandwidth_gbs,
    )
    assert dv.get_device(dev.arch).name == "L40S"
    # an H100 PCIe: sm90 with 114 SMs and a (made-up) smaller shared memory, which the space obeys
    _emulate_cuda_gpu(
        monkeypatch,
        "NVIDIA H100 PCIe",
        (9, 0),
        shared_memory_per_block_optin=100 * 1024,
        multi_processor_count=114,
        L2_cache_size=50 * 2**20,
    )
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.num_sms, dev.smem_per_block_bytes) == ("sm90", 114, 100 * 1024)
    assert not matmul_space(_MATMUL, dev, "triton").contains(_CFG_120_KIB)
    # an RTX 5090, with torch 2.6's attributes (no shared_memory_per_block_optin): the table's 99 KiB stays
    _emulate_cuda_gpu(
        monkeypatch, "NVIDIA GeForce RTX 5090", (12, 0), multi_processor_count=170, warp_size=32
    )
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.num_sms, dev.smem_per_block_bytes) == ("sm120", 170, 99 * 1024)


def test_the_cu_count_rocm_reports_wins_but_not_its_per_xcd_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROCm's torch reports one XCD's L2 (4 MiB of an MI300X's 32 MiB): the table's stays."""
    _emulate_rocm_gpu(monkeypatch, "AMD Instinct MI300A", "gfx942:sramecc+:xnack-", (9, 4))
    torch = pytest.importorskip("torch")
    props = torch.cuda.get_device_properties(0)
    props.multi_processor_count, props.L2_cache_size, props.warp_size = 228, 4 * 2**20, 64
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.num_sms, dev.l2_bytes, dev.warp_size) == ("gfx942", 228, 32 * 2**20, 64)
    assert dev.name == "AMD Instinct MI300A"  # not the table's "MI300X/MI325X"


def test_attention_shared_memory_counts_by_compute_capability_not_by_string_order() -> None:
    """Triton keeps sm80's num_stages - 1 K/V buffers below capability 9; "sm100" < "sm90" as strings."""
    from tuner.search_spaces.attention import triton_smem_bytes

    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}
    sm80, sm90 = (triton_smem_bytes(64, "float16", cfg, a) for a in ("sm80", "sm90"))
    assert sm80 < sm90
    assert [triton_smem_bytes(64, "float16", cfg, a) for a in ("sm75", "sm86", "sm89")] == [sm80] * 3
    assert [triton_smem_bytes(64, "float16", cfg, a) for a in ("sm100", "sm120", "gfx942")] == [sm90] * 3


# ---- AMD GPUs ------------------------------------------------------------------------------------------
def _emulate_rocm_gpu(monkeypatch: pytest.MonkeyPatch, name: str, gcn_arch: str, cc: tuple[int, int]) -> None:
    """torch on ROCm as it presents an AMD GPU: torch.version.hip set, torch.cuda's "compute capability"
    the gfx version (9.4 for gfx942), the gfx target in the device properties' gcnArchName."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(dv, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    props = SimpleNamespace(name=name, gcnArchName=gcn_arch, major=cc[0], minor=cc[1])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)


@pytest.mark.parametrize(
    ("name", "gcn_arch", "cc", "arch", "lds_kib"),
    [
        ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", (9, 4), "gfx942", 64),
        ("AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", (9, 0), "gfx90a", 64),
        ("AMD Instinct MI355X", "gfx950:sramecc+:xnack-", (9, 5), "gfx950", 160),
        ("AMD Instinct MI300X", "", (9, 4), "gfx942", 64),  # no gcnArchName: the model name decides
    ],
)
def test_an_amd_gpu_gets_its_own_limits_not_sm90s(
    monkeypatch: pytest.MonkeyPatch, name: str, gcn_arch: str, cc: tuple[int, int], arch: str, lds_kib: int
) -> None:
    _emulate_rocm_gpu(monkeypatch, name, gcn_arch, cc)
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.kind, dev.smem_per_block_bytes) == (arch, "cuda", lds_kib * 1024)
    assert dev.name == name
    assert (dev.warp_size, dev.max_threads_per_block, dev.max_regs_per_thread) == (64, 1024, 512)


def test_a_config_over_the_mi300x_lds_but_within_sm90s_is_rejected_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tuner.search_spaces.matmul import matmul_space

    _emulate_rocm_gpu(monkeypatch, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", (9, 4))
    problem = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}
    # 3 stages of a 128x64 A tile and a 64x128 B tile in fp16: 96 KiB, over 64 KiB of LDS, under 227 KiB
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4}
    cfg["num_stages"] = 3
    assert matmul_space(problem, dv.SM90, "triton").contains(cfg)
    mi300x = matmul_space(problem, dv.detect_device("triton"), "triton")
    assert not mi300x.contains(cfg)
    assert any("smem 98304 B > 65536 B" in v and "gfx942" in v for v in mi300x.violations(cfg))
    assert mi300x.contains({**cfg, "num_stages": 1})  # 32 KiB fits


def test_amd_wavefronts_count_64_threads_per_warp() -> None:
    from tuner.search_spaces.norms import softmax_space

    problem = {"M": 4096, "N": 4096, "dtype": "float16"}
    cfg = {"BLOCK_N": 4096, "ROWS_PER_PROGRAM": 1, "num_warps": 32}  # 1024 threads on NVIDIA, 2048 on AMD
    assert not any("threads" in v for v in softmax_space(problem, dv.SM90, "triton").violations(cfg))
    amd = softmax_space(problem, dv.GFX942, "triton").violations(cfg)
    assert any("64 * num_warps <= 1024" in v for v in amd), amd


@pytest.mark.parametrize(
    ("label", "arch"),
    [
        ("AMD Instinct MI300X (sm94)", "gfx942"),
        ("AMD Instinct MI325X (sm94)", "gfx942"),
        ("AMD Instinct MI250X (sm90)", "gfx90a"),
        ("AMD Instinct MI355X (sm95)", "gfx950"),
        ("gfx950", "gfx950"),
        ("AMD Radeon RX 7900 XTX", "gfx90a"),  # an AMD GPU without its own descriptor: gfx90a's limits
        ("NVIDIA H200 (sm90)", "sm90"),
        ("NVIDIA GeForce RTX 4090 (sm89)", "sm89"),
        ("NVIDIA GeForce RTX 3090 (sm86)", "sm86"),
        ("NVIDIA B200 (sm100)", "sm100"),
        ("NVIDIA GeForce RTX 5090 (sm120)", "sm120"),
        ("NVIDIA GeForce RTX 5090", "sm120"),  # the model name alone
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm120"),
        ("NVIDIA Jetson AGX Orin (sm87)", "sm80"),  # 8.7: 8.0's 163 KiB
        ("NVIDIA GB10 (sm121)", "sm120"),
        ("NVIDIA B300 SXM6 (sm103)", "sm100"),
        ("Tesla T4 (sm75)", "sm75"),
        ("Tesla V100-SXM2-16GB (sm70)", "sm70"),
        ("NVIDIA L4", "sm89"),
        ("tpu:TPU v5 lite", "tpu_v5e"),
        ("cpu", "cpu"),
    ],
)
def test_device_family_to_descriptor(label: str, arch: str) -> None:
    dev = dv.device_for_label(label)
    assert dev is not None and dev.arch == arch
    assert dv.get_device(dev.arch) is dev


def test_no_descriptor_for_an_unknown_device() -> None:
    assert dv.device_for_label("some accelerator") is None
    assert dv.device_for_label("Intel Data Center GPU Max 1550") is None


def test_jax_on_rocm_names_the_amd_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    fake = SimpleNamespace(platform="gpu", device_kind="AMD Instinct MI300X")
    monkeypatch.setattr(jax, "devices", lambda *a: [fake])
    dev = dv.detect_device("pallas")
    assert (dev.arch, dev.name) == ("gfx942", "AMD Instinct MI300X")


class InterpreterError(RuntimeError):
    """Stands for triton.runtime.errors.InterpreterError, which carries repr() of the kernel's error."""


_NUMPY_REFUSAL = "only 0-dimensional arrays can be converted to Python scalars"


def test_the_old_triton_interpreters_numpy_fault_gets_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton <= 3.6's interpreter calls int() on 1-element arrays, which numpy >= 2.4 refuses: every
    kernel with a runtime `range` bound fails there. The error is told by its text and explained."""
    err = InterpreterError(repr(TypeError(_NUMPY_REFUSAL)))
    note = dv.interpreter_fault_note(err)
    assert "a known fault of the Triton interpreter" in note and "triton>=3.7.1 or numpy<2.4" in note
    assert dv.split_interpreter_fault_note(f"{err}{note}") == (str(err), note.strip())
    assert dv.interpreter_fault_note(f"InterpreterError: {err}") == note  # a trial's recorded text
    assert dv.interpreter_fault_note(f"InterpreterError: {err}{note}") == ""  # noted once
    # the numpy refusal outside a kernel (a user's own code, even under TRITON_INTERPRET) is left alone
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dv.interpreter_fault_note(TypeError(_NUMPY_REFUSAL)) == ""
    try:  # the interpreter's error as the cause of another (the drop-in re-raises the first config's)
        try:
            raise err
        except InterpreterError as inner:
            raise RuntimeError("every config failed") from inner
    except RuntimeError as outer:
        assert dv.interpreter_fault_note(outer) == note
    assert dv.interpreter_fault_note(InterpreterError(repr(TypeError("unsupported operand")))) == ""


def test_measure_and_optimize_carry_the_interpreter_fault_note() -> None:
    """A failed trial's error (what tuner.optimize, the decorators and the measurer report) says why."""
    import tuner
    from tuner.measure._gate import describe_exception

    err = InterpreterError(repr(TypeError(_NUMPY_REFUSAL)))
    text = describe_exception(err)
    assert text.count("a known fault of the Triton interpreter") == 1 and _NUMPY_REFUSAL in text

    def objective(cfg: dict) -> float:
        raise err

    space = tuner.SearchSpace([tuner.Categorical("b", (1, 2))])
    with pytest.warns(tuner.AllTrialsFailedWarning, match="triton>=3.7.1 or numpy<2.4"):
        res = tuner.optimize(space, objective, budget=2, strategy="random")
    assert all("a known fault of the Triton interpreter" in (t.error or "") for t in res.trials)


_NO_DRIVER = "0 active drivers ([]). There should only be one."


def test_no_gpu_driver_gets_a_note_naming_triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled @triton.jit kernel launched on a machine without a GPU fails in Triton with an error that
    names no variable to set; the note says to set TRITON_INTERPRET=1 before the kernel is defined."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    err = RuntimeError(_NO_DRIVER)
    note = dv.interpreter_fault_note(err)
    assert "TRITON_INTERPRET=1" in note and "before the @triton.jit kernel is defined" in note
    assert dv.split_interpreter_fault_note(f"RuntimeError: {err}{note}") == (
        f"RuntimeError: {err}",
        note.strip(),
    )
    assert dv.interpreter_fault_note(f"RuntimeError: {err}{note}") == ""  # noted once
    assert dv.interpreter_fault_note(RuntimeError("2 active drivers")) == ""


def test_no_gpu_driver_with_the_interpreter_on_does_not_say_to_turn_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With TRITON_INTERPRET=1 already set, the driver error comes from something that is not an interpreted
    kernel (a `do_bench` calling triton.testing.do_bench, as Triton's own autotuner tests pass): the note
    says so instead of telling the user to set what is set."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    note = dv.interpreter_fault_note(RuntimeError(_NO_DRIVER))
    assert "TRITON_INTERPRET=1 is set" in note and "triton.testing.do_bench" in note
    assert "set TRITON_INTERPRET=1 in the environment" not in note
    err = f"RuntimeError: {_NO_DRIVER}"
    assert dv.split_interpreter_fault_note(f"{err}{note}") == (err, note.strip())
    assert dv.interpreter_fault_note(f"{err}{note}") == ""  # noted once


def test_drop_in_whose_do_bench_needs_a_gpu_names_it_under_the_interpreter() -> None:
    """The drop-in under the interpreter with a `do_bench` that calls triton.testing.do_bench (the helper of
    Triton's own test_autotuner.py) fails as Triton's autotuner does, every config raising the driver
    error; the error's note used to say to set TRITON_INTERPRET=1, which was set."""
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")
    import tuner

    if torch.cuda.is_available():
        pytest.skip("a GPU: triton.testing.do_bench works")
    assert dv.triton_interpreted()  # tests/conftest.py turns it on

    def gpu_bench(kernel_call, quantiles):
        return triton.testing.do_bench(kernel_call, quantiles=quantiles, warmup=1, rep=1)

    @tuner.autotune(
        configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["n"], do_bench=gpu_bench
    )
    @triton.jit
    def copy(dst, src, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)

    src, dst = torch.arange(40.0), torch.zeros(40)
    with pytest.raises(RuntimeError, match="0 active drivers") as exc:  # its notes say every config failed
        copy[lambda m: (triton.cdiv(40, m["B"]),)](dst, src, 40)
    text = " ".join([str(exc.value), *getattr(exc.value, "__notes__", [])])
    assert "triton.testing.do_bench" in text, text
    assert "set TRITON_INTERPRET=1 in the environment" not in text, text


_DROP_IN_WITHOUT_INTERPRETER = """
import torch
import triton
import triton.language as tl

import tuner


@tuner.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


add_one[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](torch.zeros(100), 100)
"""


@pytest.mark.slow
def test_the_drop_in_on_a_cpu_without_the_interpreter_says_to_set_it(tmp_path: Path) -> None:
    """README's `triton.autotune` drop-in run as a script on a CPU machine without TRITON_INTERPRET=1 (tuner
    cannot turn the interpreter on for a kernel defined before it sees it) fails with a message that says
    what to set; it used to end in Triton's bare `RuntimeError: 0 active drivers ([])`."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("a GPU: Triton has a driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TUNER_HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    script = tmp_path / "drop_in.py"
    script.write_text(_DROP_IN_WITHOUT_INTERPRETER, encoding="utf-8")
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "0 active drivers" in last and "set TRITON_INTERPRET=1" in last, r.stderr[-2000:]
