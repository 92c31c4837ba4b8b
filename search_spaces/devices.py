"""Device descriptors: the hardware limits that hard constraints and cost-model features use, and the one
place that detects the hardware of this process.

Figures are from the vendors' public documentation (CUDA C Programming Guide, "Compute Capabilities"
table; ROCm documentation, "AMD GPU specifications" and the Instinct data sheets; Google Cloud TPU system
architecture pages). Peaks are dense, without sparsity.

AMD Instinct GPUs are `kind="cuda"` devices: torch reaches them through `torch.cuda` (ROCm's HIP build)
and Triton compiles for them with its AMD backend, so every Triton path treats them like an NVIDIA GPU;
what differs is in the descriptor (`vendor="amd"`, 64-wide wavefronts as `warp_size`, 64 KiB of LDS per
workgroup on CDNA2/CDNA3, 160 KiB on CDNA4, 512 VGPRs + AccVGPRs per lane).

Detection (torch and jax imported lazily, only when asked):
- `detect_device(backend)`: the `Device` a backend runs on here (CUDA compute capability -> sm70 / sm75 /
  sm80 / sm86 / sm89 / sm90 / sm100 / sm120 through `nvidia_arch`, with the name and limits torch reports
  for the GPU in place of the table's; an AMD GPU's gfx target -> gfx90a / gfx942 / gfx950; JAX's TPU kind
  -> the TPU generation, an unknown one -> the known TPU with the least VMEM; jax's NVIDIA GPU by its
  `compute_capability`, one without -> the known NVIDIA arch with the least shared memory per block; the
  CPU under the interpreters); constraints and features use it. Its `name` is
  the device's own (torch's or jax's name for it), its peaks those of the arch's table product.
- `device_for_family(family)` / `device_for_label(label)`: the descriptor whose limits hold for a device
  that `device_family` recognises (None where none does).
- `device_label(backend)`: the same device as the runtime's cache keys name it ("cpu",
  "<GPU name> (sm<cc>)", "<platform>:<device kind>"), from `cuda_device_label` / `jax_device_label`; a
  label reads back (`device_family`) as its own vendor and arch, a ROCm GPU's as AMD.
- `on_gpu()`, `triton_interpreted()`, `pallas_interpret()`: whether the kernels run compiled or in an
  interpreter (`TRITON_INTERPRET`, `TUNER_PALLAS_INTERPRET`, read through `tuner._settings`).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from tuner._settings import flag, is_set

log = logging.getLogger(__name__)

__all__ = [
    "Device",
    "DEVICES",
    "get_device",
    "SM70",
    "SM75",
    "SM80",
    "SM86",
    "SM89",
    "SM90",
    "SM100",
    "SM120",
    "GFX90A",
    "GFX942",
    "GFX950",
    "TPU_V4",
    "TPU_V5E",
    "TPU_V5P",
    "TPU_V6E",
    "CPU",
    "detect_device",
    "device_label",
    "cuda_device_label",
    "jax_device_label",
    "on_gpu",
    "triton_interpreted",
    "interpreter_fault_note",
    "split_interpreter_fault_note",
    "pallas_interpret",
    "DeviceFamily",
    "device_family",
    "device_for_family",
    "device_for_label",
    "nvidia_arch",
]


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cuda" (torch.cuda and Triton's GPU backends: NVIDIA, and AMD under ROCm), "tpu" or "cpu"
    arch: str  # "sm80", "sm90", "gfx942", "tpu_v5e", "cpu"
    # GPUs (AMD's names: LDS for shared memory, CU for SM, wavefront for warp, workgroup for block)
    smem_per_block_bytes: int = 0  # opt-in maximum per block
    regs_per_sm: int = 0  # 32-bit registers of one SM / CU
    max_regs_per_thread: int = 0
    max_threads_per_block: int = 0
    num_sms: int = 0
    l2_bytes: int = 0
    warp_size: int = 32  # threads of one warp / wavefront: what Triton's num_warps counts
    vendor: str = ""  # "nvidia", "amd", "google", "cpu"
    # TPU
    vmem_bytes: int = 0
    # peaks for roofline (TFLOP/s and GB/s)
    peak_tflops_fp16: float = 0.0
    peak_tflops_fp32: float = 0.0
    peak_tflops_int8: float = 0.0
    peak_bandwidth_gbs: float = 0.0

    def features(self) -> dict[str, float]:
        """Numeric descriptor for the cost model."""
        return {
            "dev_smem_kib": self.smem_per_block_bytes / 1024,
            "dev_regs_per_sm": float(self.regs_per_sm),
            "dev_num_sms": float(self.num_sms),
            "dev_l2_mib": self.l2_bytes / 2**20,
            "dev_vmem_mib": self.vmem_bytes / 2**20,
            "dev_peak_tflops_fp16": self.peak_tflops_fp16,
            "dev_peak_bw_gbs": self.peak_bandwidth_gbs,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# NVIDIA (CUDA C Programming Guide, "Technical Specifications per Compute Capability": every arch here has
# 64K 32-bit registers per SM, at most 255 registers per thread and 1024 threads per block; the opt-in
# maximum of shared memory per block is what differs: 96 KiB on 7.0/7.2, 64 KiB on 7.5, 163 KiB on 8.0/8.7,
# 99 KiB on 8.6/8.9/12.x, 227 KiB on 9.0/10.x/11.0). SM counts, L2 and peaks are one product's, named first:
# on a real GPU `detect_device` takes the name, SM count, L2, registers and shared memory torch reports
# instead, and keeps the table product's peaks.
SM70 = Device(
    "V100",  # Tesla V100 SXM2; no int8 tensor cores: the int8 peak is DP4A's (4x fp32)
    "cuda",
    "sm70",
    vendor="nvidia",
    smem_per_block_bytes=96 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=80,
    l2_bytes=6 * 2**20,
    peak_tflops_fp16=125.0,
    peak_tflops_fp32=15.7,
    peak_tflops_int8=62.8,
    peak_bandwidth_gbs=900.0,
)
SM75 = Device(
    "T4",
    "cuda",
    "sm75",
    vendor="nvidia",
    smem_per_block_bytes=64 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=40,
    l2_bytes=4 * 2**20,
    peak_tflops_fp16=65.0,
    peak_tflops_fp32=8.1,
    peak_tflops_int8=130.0,
    peak_bandwidth_gbs=320.0,
)
SM80 = Device(
    "A100",
    "cuda",
    "sm80",
    vendor="nvidia",
    smem_per_block_bytes=163 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=108,
    l2_bytes=40 * 2**20,
    peak_tflops_fp16=312.0,
    peak_tflops_fp32=19.5,
    peak_tflops_int8=624.0,
    peak_bandwidth_gbs=2039.0,
)
SM86 = Device(
    "A10",  # GA102 like the RTX 3090 and A40/A6000, which have the same limits and more SMs
    "cuda",
    "sm86",
    vendor="nvidia",
    smem_per_block_bytes=99 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=72,
    l2_bytes=6 * 2**20,
    peak_tflops_fp16=125.0,
    peak_tflops_fp32=31.2,
    peak_tflops_int8=250.0,
    peak_bandwidth_gbs=600.0,
)
SM89 = Device(
    "L40S",  # AD102 like the RTX 4090 and RTX 6000 Ada; the L4 (AD104) has the same limits, 58 SMs
    "cuda",
    "sm89",
    vendor="nvidia",
    smem_per_block_bytes=99 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=142,
    l2_bytes=96 * 2**20,
    peak_tflops_fp16=362.0,
    peak_tflops_fp32=91.6,
    peak_tflops_int8=733.0,
    peak_bandwidth_gbs=864.0,
)
SM90 = Device(
    "H100/H200",
    "cuda",
    "sm90",
    vendor="nvidia",
    smem_per_block_bytes=227 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=132,
    l2_bytes=50 * 2**20,
    peak_tflops_fp16=989.0,
    peak_tflops_fp32=67.0,
    peak_tflops_int8=1979.0,
    peak_bandwidth_gbs=4800.0,
)
SM100 = Device(
    "B200",  # also the limits of B300 (10.3) and Jetson Thor (11.0)
    "cuda",
    "sm100",
    vendor="nvidia",
    smem_per_block_bytes=227 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=148,
    l2_bytes=126 * 2**20,
    peak_tflops_fp16=2250.0,
    peak_tflops_fp32=80.0,
    peak_tflops_int8=4500.0,
    peak_bandwidth_gbs=8000.0,
)
SM120 = Device(
    "RTX 5090",  # GB202 like the RTX PRO 6000 Blackwell; DGX Spark's GB10 (12.1) has the same limits
    "cuda",
    "sm120",
    vendor="nvidia",
    smem_per_block_bytes=99 * 1024,
    regs_per_sm=65536,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    num_sms=170,
    l2_bytes=96 * 2**20,
    peak_tflops_fp16=209.5,  # with fp32 accumulation, what Triton's dots use (GeForce: half the fp16-acc rate)
    peak_tflops_fp32=104.8,
    peak_tflops_int8=838.0,
    peak_bandwidth_gbs=1792.0,
)
# AMD Instinct (ROCm documentation, "AMD GPU specifications": compute units, wavefront size, LDS, L2, VGPR
# file of 512 KiB per CU = 131072 32-bit registers; a workgroup has at most 1024 work-items; CDNA2 and later
# give a lane up to 512 registers, 256 VGPRs + 256 AccVGPRs). An MI250X is two GCDs, each its own device to
# torch: the figures here are one GCD's (110 CUs, 8 MiB of L2, half the OAM's peaks).
GFX90A = Device(
    "MI250X (one GCD)",
    "cuda",
    "gfx90a",
    vendor="amd",
    smem_per_block_bytes=64 * 1024,
    regs_per_sm=131072,
    max_regs_per_thread=512,
    max_threads_per_block=1024,
    num_sms=110,
    l2_bytes=8 * 2**20,
    warp_size=64,
    peak_tflops_fp16=191.5,
    peak_tflops_fp32=23.95,
    peak_tflops_int8=191.5,
    peak_bandwidth_gbs=1638.4,
)
GFX942 = Device(
    "MI300X/MI325X",
    "cuda",
    "gfx942",
    vendor="amd",
    smem_per_block_bytes=64 * 1024,
    regs_per_sm=131072,
    max_regs_per_thread=512,
    max_threads_per_block=1024,
    num_sms=304,
    l2_bytes=32 * 2**20,  # 4 MiB per XCD (and 256 MiB of Infinity Cache beyond it)
    warp_size=64,
    peak_tflops_fp16=1307.4,
    peak_tflops_fp32=163.4,
    peak_tflops_int8=2614.9,
    peak_bandwidth_gbs=5300.0,
)
GFX950 = Device(
    "MI350X/MI355X",
    "cuda",
    "gfx950",
    vendor="amd",
    smem_per_block_bytes=160 * 1024,
    regs_per_sm=131072,
    max_regs_per_thread=512,
    max_threads_per_block=1024,
    num_sms=256,
    l2_bytes=32 * 2**20,  # 4 MiB per XCD
    warp_size=64,
    peak_tflops_fp16=2516.6,
    peak_tflops_fp32=157.3,
    peak_tflops_int8=5033.2,
    peak_bandwidth_gbs=8000.0,
)
TPU_V4 = Device(
    "TPU v4",
    "tpu",
    "tpu_v4",
    vendor="google",
    vmem_bytes=16 * 2**20,
    peak_tflops_fp16=275.0,
    peak_tflops_fp32=275.0 / 4,
    peak_tflops_int8=275.0,
    peak_bandwidth_gbs=1200.0,
)
TPU_V5E = Device(
    "TPU v5e",
    "tpu",
    "tpu_v5e",
    vendor="google",
    vmem_bytes=128 * 2**20,
    peak_tflops_fp16=197.0,
    peak_tflops_fp32=197.0 / 4,
    peak_tflops_int8=394.0,
    peak_bandwidth_gbs=819.0,
)
TPU_V5P = Device(
    "TPU v5p",
    "tpu",
    "tpu_v5p",
    vendor="google",
    vmem_bytes=95 * 2**20,
    peak_tflops_fp16=459.0,
    peak_tflops_fp32=459.0 / 4,
    peak_tflops_int8=918.0,
    peak_bandwidth_gbs=2765.0,
)
TPU_V6E = Device(
    "TPU v6e",
    "tpu",
    "tpu_v6e",
    vendor="google",
    vmem_bytes=128 * 2**20,
    peak_tflops_fp16=918.0,
    peak_tflops_fp32=918.0 / 4,
    peak_tflops_int8=1836.0,
    peak_bandwidth_gbs=1640.0,
)
CPU = Device(
    "CPU (interpreter)",
    "cpu",
    "cpu",
    vendor="cpu",
    smem_per_block_bytes=2**31,
    max_threads_per_block=2**20,
    vmem_bytes=2**40,
    peak_tflops_fp16=0.1,
    peak_tflops_fp32=0.1,
    peak_tflops_int8=0.1,
    peak_bandwidth_gbs=20.0,
)

DEVICES: dict[str, Device] = {
    d.arch: d
    for d in (
        SM70,
        SM75,
        SM80,
        SM86,
        SM89,
        SM90,
        SM100,
        SM120,
        GFX90A,
        GFX942,
        GFX950,
        TPU_V4,
        TPU_V5E,
        TPU_V5P,
        TPU_V6E,
        CPU,
    )
}


def get_device(arch: str) -> Device:
    """A descriptor by arch name ("sm80", "sm89", "sm120", "gfx942", "tpu_v5e", "cpu", ...)."""
    try:
        return DEVICES[arch]
    except KeyError:
        raise ValueError(f"unknown device arch {arch!r}; known: {sorted(DEVICES)}") from None


# Compute capability -> the descriptor whose limits hold there (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"): Jetson Xavier (7.2) has 7.0's limits, Jetson Orin (8.7) 8.0's
# 163 KiB, B300 (10.3) and Jetson Thor (11.0, 10.1 before CUDA 13) 10.0's, DGX Spark's GB10 (12.1) 12.0's.
_NVIDIA_CCS: dict[tuple[int, int], str] = {
    (7, 0): "sm70",
    (7, 2): "sm70",
    (7, 5): "sm75",
    (8, 0): "sm80",
    (8, 6): "sm86",
    (8, 7): "sm80",
    (8, 9): "sm89",
    (9, 0): "sm90",
    (10, 0): "sm100",
    (10, 1): "sm100",
    (10, 3): "sm100",
    (11, 0): "sm100",
    (12, 0): "sm120",
    (12, 1): "sm120",
}


@functools.lru_cache(maxsize=64)
def nvidia_arch(major: int, minor: int) -> str:
    """The descriptor arch ("sm86", "sm120", ...) for an NVIDIA GPU of compute capability `major.minor`.
    One the table does not know gets the nearest known capability below it (the lowest known, 7.0, for
    an older one), with a warning, once per capability."""
    cc = (int(major), int(minor))
    if cc in _NVIDIA_CCS:
        return _NVIDIA_CCS[cc]
    lower = [k for k in _NVIDIA_CCS if k <= cc]
    near = max(lower) if lower else min(_NVIDIA_CCS)
    arch = _NVIDIA_CCS[near]
    log.warning(
        "NVIDIA compute capability %d.%d has no descriptor of its own; using %s limits (of %d.%d)",
        *cc,
        arch,
        *near,
    )
    return arch


# ---- families: what a device label says about the hardware --------------------------------------------
@dataclass(frozen=True)
class DeviceFamily:
    """What a device's name tells about its hardware, for comparing devices: the vendor and the
    instruction-set version (NVIDIA's compute capability, AMD's gfx target, as `major + minor / 10`:
    sm86 -> 8.6, gfx90a -> 9.0, gfx1030 -> 10.3). Empty vendor / NaN version = not known."""

    vendor: str = ""  # "nvidia", "amd", "intel", "google", "cpu"
    arch: str = ""  # "sm86", "gfx90a", "tpu_v5e", "cpu"
    version: float = float("nan")

    @property
    def known(self) -> bool:
        return bool(self.vendor)

    def distance(self, other: DeviceFamily) -> float:
        """0 for the same arch, the instruction-set versions apart within a vendor (inf where either
        is unknown), inf across vendors or when either device is unknown."""
        if not (self.known and other.known) or self.vendor != other.vendor:
            return float("inf")
        if self.arch and self.arch == other.arch:
            return 0.0
        d = abs(self.version - other.version)
        return d if d == d else float("inf")  # NaN (a version unknown): as far as another vendor


# Public model names -> compute capability (CUDA C Programming Guide, "CUDA-Enabled GPUs") and gfx target
# (ROCm documentation, "GPU hardware specifications"); the first pattern that matches a lower-cased label.
_NVIDIA_NAMES: tuple[tuple[str, str], ...] = (
    (r"rtx 50\d\d|rtx pro \d{4} blackwell", "sm120"),
    (r"\bgb10\b", "sm121"),
    (r"\b(gb|b)(100|200)\b|\bb300\b", "sm100"),
    (r"\b(gh|h)(100|200|800)\b", "sm90"),
    (r"\bl4\b|\bl40|rtx 40\d\d|\bada\b|rtx [2-6]000 ada", "sm89"),
    (r"\ba(100|30|800)\b", "sm80"),
    (r"\ba(2|10|10g|16|40)\b|rtx a\d{4}|rtx 30\d\d|\ba[2-6]\d00\b", "sm86"),
    (r"\bt4\b|rtx 20\d\d|titan rtx|quadro rtx|gtx 16\d\d", "sm75"),
    (r"\bv100\b|titan v\b", "sm70"),
    (r"\bp100\b", "sm60"),
    (r"\bp(4|40)\b|gtx 10\d\d|titan xp?\b", "sm61"),
)
_AMD_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bmi35\d", "gfx950"),
    (r"\bmi3\d\d", "gfx942"),
    (r"\bmi2\d\d", "gfx90a"),
    (r"\bmi100\b", "gfx908"),
    (r"\bmi(50|60)\b|radeon vii", "gfx906"),
    (r"\b(rx|w) ?9\d{3}", "gfx1200"),
    (r"\b(rx|w) ?7\d{3}", "gfx1100"),
    (r"\b(rx|w) ?6\d{3}", "gfx1030"),
    (r"\b(rx|w) ?5\d{3}", "gfx1010"),
)
_NVIDIA_WORDS = re.compile(r"nvidia|geforce|quadro|tesla|titan|\brtx\b|\bgtx\b|\bcuda\b")
_AMD_WORDS = re.compile(r"\bamd\b|radeon|instinct|\brocm\b|\bhip\b|gfx\d")


def _sm_cc(arch: str) -> tuple[int, int]:
    """("sm89" -> (8, 9), "sm120" -> (12, 0)): the compute capability an "sm<major><minor>" arch names."""
    digits = arch[2:]
    return int(digits[:-1]), int(digits[-1])


def _sm_version(arch: str) -> float:
    major, minor = _sm_cc(arch)
    return major + minor / 10


def _gfx_version(arch: str) -> float:
    # gfx<major><minor><stepping>, the stepping one hex digit, the minor one digit (gfx90a, gfx1030)
    digits = arch[3:]
    return int(digits[:-2]) + int(digits[-2], 16) / 10


@functools.lru_cache(maxsize=256)
def device_family(label: str) -> DeviceFamily:
    """The family of a device as a label names it (the runtime's keys: "NVIDIA A100-SXM4-40GB (sm80)",
    "gpu:NVIDIA H100", "tpu:TPU v5 lite", "cpu"; or a bare model name, "MI250X", "RTX_3090"): a compute
    capability or gfx target in the label wins, then the model names above. A label none of this
    recognises gives the unknown family (vendor "")."""
    s = re.sub(r"[_\-]+", " ", str(label).lower()).strip()
    if not s:
        return DeviceFamily()
    if s == "cpu" or s.startswith("cpu:") or "interpreter" in s:
        return DeviceFamily("cpu", "cpu", 0.0)
    if "tpu" in s:
        for tag, arch in _TPU_KINDS:
            if tag in s:
                return DeviceFamily("google", arch, float(arch[5]))
        return DeviceFamily("google", "", float("nan"))
    # torch on ROCm reports an AMD GPU's gfx version as its "compute capability", so the runtime's label
    # of an MI300X is "AMD Instinct MI300X (sm94)": the vendor's words win over an "smNN" tag
    m = None if _AMD_WORDS.search(s) else re.search(r"\bsm ?(\d{2,3})\b", s)
    if m:
        arch = f"sm{m.group(1)}"
        return DeviceFamily("nvidia", arch, _sm_version(arch))
    m = re.search(r"\bgfx(\d{1,2}[0-9a-f]{2})\b", s)
    if m:
        arch = f"gfx{m.group(1)}"
        return DeviceFamily("amd", arch, _gfx_version(arch))
    for pattern, arch in _AMD_NAMES:
        if re.search(pattern, s):
            return DeviceFamily("amd", arch, _gfx_version(arch))
    for pattern, arch in _NVIDIA_NAMES:
        if re.search(pattern, s):
            return DeviceFamily("nvidia", arch, _sm_version(arch))
    if _AMD_WORDS.search(s):
        return DeviceFamily("amd", "", float("nan"))
    if _NVIDIA_WORDS.search(s):
        return DeviceFamily("nvidia", "", float("nan"))
    if re.search(r"\bintel\b|\barc\b|data center gpu", s):
        return DeviceFamily("intel", "", float("nan"))
    return DeviceFamily()


def device_for_family(family: DeviceFamily) -> Device | None:
    """The descriptor whose limits hold for a device of `family`: its own arch's where there is one
    (sm70 ... sm120, gfx90a, gfx942, gfx950, the TPUs, the CPU); another NVIDIA GPU gets the one
    `nvidia_arch` gives its compute capability (sm87 -> sm80, sm121 -> sm120), one whose capability
    the label does not say gets sm80's; another AMD GPU gets gfx90a's (64 KiB of LDS and 64-wide
    wavefronts, the smallest limits of the AMD descriptors). None for a family nothing is known of
    (an unknown label, Intel)."""
    if family.arch in DEVICES:
        return DEVICES[family.arch]
    if family.vendor == "nvidia":
        if re.fullmatch(r"sm\d{2,3}", family.arch):
            return DEVICES[nvidia_arch(*_sm_cc(family.arch))]
        return SM80
    if family.vendor == "amd":
        return GFX90A
    return None


def device_for_label(label: str) -> Device | None:
    """`device_for_family(device_family(label))`: the descriptor for a device as the runtime's keys (or
    torch, jax, a gfx target) name it, e.g. "AMD Instinct MI300X (sm94)" -> gfx942."""
    return device_for_family(device_family(label))


# ---- detection -----------------------------------------------------------------------------------------
def triton_interpreted() -> bool:
    """Whether `TRITON_INTERPRET` turns Triton's CPU interpreter on."""
    return flag("TRITON_INTERPRET")


# numpy 2.4 turned int() of an array with ndim > 0 (deprecated since numpy 1.25) into this TypeError. The
# Triton interpreter of triton 3.6 and earlier calls it for a scalar kernel argument used as a Python int (a
# `range(0, N, BLOCK)` bound, say), so there every such kernel fails; triton 3.7.1's interpreter does not.
_NUMPY_SCALAR_REFUSAL = "only 0-dimensional arrays can be converted to python scalars"
_FAULT_MARK = "a known fault of the Triton interpreter"
# What Triton raises when a compiled (not interpreted) @triton.jit kernel is launched on a machine without a
# GPU driver: a kernel of the user's own, defined without TRITON_INTERPRET=1 (tuner's kernels turn the
# interpreter on themselves, `tuner.kernels._common.prepare_triton`).
_NO_DRIVER = "0 active drivers"
_NO_DRIVER_MARK = "Triton found no GPU driver"


def interpreter_fault_note(error: BaseException | str) -> str:
    """A note that explains `error` (an exception, or the text a failed trial recorded) when the installed
    Triton interpreter's known fault with numpy >= 2.4 raised it, else "". Told by its message, not by
    version numbers: the interpreter of triton <= 3.6 refuses every kernel that uses a scalar argument as
    a Python int once numpy is 2.4 or later, which looks like a fault of the kernel. Also when Triton found
    no GPU driver for a kernel defined with the interpreter off (a CPU machine without TRITON_INTERPRET=1),
    whose error names no variable to set; with the interpreter on, the note names what else needs a GPU
    (a `do_bench` that calls triton.testing.do_bench) instead."""
    texts = [str(error)]
    cur: BaseException | str | None = error
    while isinstance(cur, BaseException) and len(texts) < 6:  # the exception and what it was raised from
        texts.append(type(cur).__name__)
        cur = cur.__cause__ or cur.__context__
        if cur is not None:
            texts.append(str(cur))
    low = " ".join(texts).lower()
    if _NO_DRIVER in low and _NO_DRIVER_MARK.lower() not in low:
        if triton_interpreted():
            # The interpreter is on, so telling to turn it on misleads: what asked for a GPU is not an
            # interpreted kernel (Triton's own autotuner tests pass such a `do_bench`).
            return (
                f" ({_NO_DRIVER_MARK} though TRITON_INTERPRET=1 is set: what asked for a GPU is not an "
                "interpreted kernel; a `do_bench` or hook that calls triton.testing.do_bench needs a GPU "
                "(leave `do_bench` out to time on the CPU), and so does a kernel defined before "
                "TRITON_INTERPRET was set)"
            )
        return (
            f" ({_NO_DRIVER_MARK}: on a machine without a GPU, set TRITON_INTERPRET=1 in the environment "
            "before the @triton.jit kernel is defined, for Triton's CPU interpreter)"
        )
    if _NUMPY_SCALAR_REFUSAL not in low or _FAULT_MARK.lower() in low:
        return ""
    if "interpretererror" not in low:  # the interpreter wraps every error of a kernel in InterpreterError
        return ""
    from importlib import metadata

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "?"

    # short: a failed run's summary keeps the first 300 characters of the first error
    return (
        f" ({_FAULT_MARK} in triton {version('triton')} with numpy {version('numpy')}: "
        "on the CPU use triton>=3.7.1 or numpy<2.4)"
    )


def split_interpreter_fault_note(text: str) -> tuple[str, str]:
    """(`text` without the note of `interpreter_fault_note`, the note or "")."""
    for mark in (_FAULT_MARK, _NO_DRIVER_MARK):
        head, sep, rest = text.partition(f" ({mark}")
        if sep:
            return head, (sep + rest).strip()
    return text, ""


def on_gpu() -> bool:
    """True when torch sees a CUDA device and the Triton interpreter is off."""
    if triton_interpreted():
        return False
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def pallas_interpret() -> bool:
    """Pallas kernels run with interpret=True unless jax has a GPU or TPU backend (or
    `TUNER_PALLAS_INTERPRET` says otherwise)."""
    if is_set("TUNER_PALLAS_INTERPRET"):
        return flag("TUNER_PALLAS_INTERPRET")
    import jax

    return bool(jax.default_backend() == "cpu")


_TPU_KINDS = (
    ("v6", "tpu_v6e"),
    ("v5 lite", "tpu_v5e"),
    ("v5e", "tpu_v5e"),
    ("v5p", "tpu_v5p"),
    ("v5", "tpu_v5p"),
    ("v4", "tpu_v4"),
)


# What torch reports for the GPU in use, and the descriptor field it replaces. AMD: ROCm reports the L2 of one
# XCD (4 MiB of an MI300X's 32 MiB, ROCm issue 4203), so the table's L2 stays.
_REPORTED_LIMITS = (
    ("shared_memory_per_block_optin", "smem_per_block_bytes"),
    ("multi_processor_count", "num_sms"),
    ("L2_cache_size", "l2_bytes"),
    ("regs_per_multiprocessor", "regs_per_sm"),
    ("warp_size", "warp_size"),
)


def _named(dev: Device, name: Any) -> Device:
    """`dev` named `name` (what torch or jax calls the device), or `dev` itself when that is empty: the
    table's name is its representative product's, not this device's."""
    text = str(name or "").strip()
    return replace(dev, name=text) if text and text != dev.name else dev


def _with_reported_limits(dev: Device, props: Any) -> Device:
    """`dev` with the name and the limits torch's device properties report (where they have them, and
    positive) instead of the table's figures of the descriptor's product: an RTX 4090 is an sm89 device
    named "NVIDIA GeForce RTX 4090" with 128 SMs and 72 MiB of L2, not an L40S. torch >= 2.7 has every
    one of these attributes on CUDA. The peaks stay the table product's: torch reports none."""
    dev = _named(dev, getattr(props, "name", None))
    changes: dict[str, Any] = {}
    for attr, field in _REPORTED_LIMITS:
        if field == "l2_bytes" and dev.vendor == "amd":
            continue
        value = getattr(props, attr, None)
        try:
            n = int(value) if value is not None else 0
        except (TypeError, ValueError):
            continue
        if n > 0 and n != getattr(dev, field):
            changes[field] = n
    return replace(dev, **changes) if changes else dev


def _torch_gpu_device(index: int = 0) -> Device:
    """The descriptor of torch's GPU `index`: the arch its compute capability names (`nvidia_arch`), with the
    name, shared memory, SM count, L2, registers and warp size torch reports for the device in place of
    the table's. On ROCm's torch the "compute capability" is the gfx version (9.4 for an MI300X), so the
    gfx target (`gcnArchName`, else the device's name) decides there."""
    import torch

    if getattr(torch.version, "hip", None):
        props = torch.cuda.get_device_properties(index)
        gfx = str(getattr(props, "gcnArchName", "") or "").split(":")[0]  # "gfx942:sramecc+:xnack-"
        fam = device_family(gfx) if gfx else DeviceFamily()
        if not fam.known:
            fam = device_family(f"AMD {torch.cuda.get_device_name(index)}")
        dev = device_for_family(fam) or GFX90A
        if fam.arch != dev.arch:
            log.warning("AMD GPU %r (%s): no descriptor of its own; using %s limits", gfx, fam.arch, dev.arch)
        return _with_reported_limits(dev, props)
    major, minor = torch.cuda.get_device_capability(index)
    dev = get_device(nvidia_arch(major, minor))
    return _with_reported_limits(dev, torch.cuda.get_device_properties(index))


def detect_device(backend: str, index: int = 0) -> Device:
    """The device descriptor of the hardware `backend` ("triton" or "pallas") runs on here (CPU when it
    is an interpreter).

    A GPU or TPU's descriptor is its arch's row of the table (`arch`, `kind`, `vendor`, the per-thread
    and per-block limits, and the peaks `peak_tflops_*` / `peak_bandwidth_gbs` of the row's
    representative product, whose name is `get_device(dev.arch).name`) with what the runtime reports for
    the device itself: its `name` (torch's `get_device_name`, jax's `device_kind`: "NVIDIA GeForce RTX
    4090", not the table's "L40S") and, under torch, its shared memory per block, SM count, L2,
    registers per SM and warp size. Key on `arch`, never on `name`.

    `index`: which of torch's CUDA devices (as CUDA_VISIBLE_DEVICES numbers them) Triton runs on, 0 by
    default; on a machine with GPUs of different kinds, the one the kernel's tensors are on (the runtime
    passes it). Pallas always takes jax's first device."""
    if backend == "triton":
        return _torch_gpu_device(index) if on_gpu() else CPU
    if backend == "pallas":
        if pallas_interpret():
            return CPU
        import jax

        if jax.default_backend() == "tpu":
            kind_name = str(jax.devices()[0].device_kind)
            kind = kind_name.lower()
            for tag, arch in _TPU_KINDS:
                if tag in kind:
                    return _named(get_device(arch), kind_name)
            # a TPU the table does not know (a newer generation): the known TPU with the least VMEM, so
            # no tile the chip cannot hold passes the space (v5e's 128 MiB would be too much for some)
            fallback = min((d for d in DEVICES.values() if d.kind == "tpu"), key=lambda d: d.vmem_bytes)
            log.warning(
                "TPU %r has no descriptor of its own; using %s limits (%d MiB of VMEM, the least of the known TPUs)",
                kind_name,
                fallback.arch,
                fallback.vmem_bytes // 2**20,
            )
            return _named(fallback, kind_name)
        if jax.default_backend() in ("gpu", "rocm"):
            dev0 = jax.devices()[0]
            kind_name = str(getattr(dev0, "device_kind", ""))
            fam = device_family(kind_name)
            if fam.vendor == "amd":  # jax on ROCm: no compute capability, the model name says the gfx target
                return _named(device_for_family(fam) or GFX90A, kind_name)
            return _named(_jax_nvidia_device(dev0, kind_name), kind_name)
        return CPU
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")


def _jax_nvidia_device(dev0: Any, kind_name: str) -> Device:
    """The descriptor of jax's NVIDIA GPU `dev0` from its `compute_capability` ("9.0"). A device that
    lacks one (or has one that is not "<major>.<minor>") gets the known NVIDIA arch with the least shared
    memory per block, with a warning, so no tile the chip cannot hold passes the space (as an unknown
    TPU gets the least VMEM)."""
    cc = str(getattr(dev0, "compute_capability", "") or "").strip()
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?", cc)
    if m:
        return get_device(nvidia_arch(int(m.group(1)), int(m.group(2) or 0)))
    nvidia = (d for d in DEVICES.values() if d.vendor == "nvidia" and d.kind == "cuda")
    fallback = min(nvidia, key=lambda d: (d.smem_per_block_bytes, _sm_version(d.arch)))
    log.warning(
        "jax's GPU %r reports no compute capability (%r); using %s limits (%d KiB of shared memory per "
        "block, the least of the known NVIDIA GPUs)",
        kind_name,
        cc,
        fallback.arch,
        fallback.smem_per_block_bytes // 1024,
    )
    return fallback


@functools.lru_cache(maxsize=16)
def cuda_device_label(index: int = 0) -> str:
    """ "<GPU name> (sm<cc>)" of CUDA device `index`, as the runtime's keys name it; "NVIDIA GPU (sm<cc>)"
    where torch gives no name.

    On ROCm's torch the "compute capability" is the gfx version ("AMD Instinct MI300X (sm94)", read back
    as gfx942 because the vendor's words win over the tag). A label must never read back
    (`device_family`, `device_for_label`) as another vendor's or another arch's device, so where that
    one would not read back as this AMD GPU (an empty name: " (sm94)" would be an NVIDIA sm94; a name
    without AMD's words; a model name of another gfx target than the device's `gcnArchName`) the label
    is "AMD <name> (<gfx target>)" ("AMD GPU" without a name; "(sm<cc>)" without a gfx target), which
    reads back as AMD and as the device's gfx target."""
    import torch

    name = str(torch.cuda.get_device_name(index) or "").strip()
    major, minor = torch.cuda.get_device_capability(index)
    tag = f"sm{major}{minor}"
    if not getattr(torch.version, "hip", None):
        return f"{name or 'NVIDIA GPU'} ({tag})"
    label = f"{name} ({tag})"  # what ROCm devices' keys have always said: kept where it reads back right
    props = torch.cuda.get_device_properties(index)
    gfx = str(getattr(props, "gcnArchName", "") or "").split(":")[0].strip()  # "gfx942:sramecc+:xnack-"
    own = device_family(gfx) if gfx else DeviceFamily()
    if own.vendor != "amd":
        gfx, own = "", DeviceFamily("amd")
    read = device_family(label)
    if read.vendor == "amd" and (not own.arch or not read.arch or read.arch == own.arch):
        return label  # (an AMD name whose arch the label does not say, "AMD Radeon Graphics": kept too)
    vendor = "" if _AMD_WORDS.search(name.lower()) else "AMD"
    return f"{vendor} {name or 'GPU'}".strip() + f" ({gfx or tag})"


def jax_device_label(device: Any) -> str:
    """ "cpu", or "<platform>:<device kind>" of a jax device, as the runtime's keys name it."""
    if device.platform == "cpu":
        return "cpu"
    return f"{device.platform}:{getattr(device, 'device_kind', device.platform)}"


def device_label(backend: str) -> str:
    """This machine's device for `backend` as the runtime's cache keys name it: "cpu" under the
    interpreters, "<GPU name> (sm<cc>)" for Triton on a CUDA device, "<platform>:<device kind>" for jax's
    default device."""
    if backend == "triton":
        return cuda_device_label(0) if on_gpu() else "cpu"
    if backend == "pallas":
        import jax

        return jax_device_label(jax.devices()[0])
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")
