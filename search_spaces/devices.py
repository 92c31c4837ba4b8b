"""Device descriptors: the hardware limits that hard constraints and cost-model features use, and the one
place that detects the hardware of this process.

Figures are from the vendors' public documentation (CUDA C Programming Guide, "Compute Capabilities"
table; Google Cloud TPU system architecture pages). Peaks are dense, without sparsity.

Detection (torch and jax imported lazily, only when asked):
- `detect_device(backend)`: the `Device` a backend runs on here (CUDA compute capability -> sm80 / sm90,
  JAX's TPU kind -> the TPU generation, the CPU under the interpreters); constraints and features use it.
- `device_label(backend)`: the same device as the runtime's cache keys name it ("cpu",
  "<GPU name> (sm<cc>)", "<platform>:<device kind>"), from `cuda_device_label` / `jax_device_label`.
- `on_gpu()`, `triton_interpreted()`, `pallas_interpret()`: whether the kernels run compiled or in an
  interpreter (`TRITON_INTERPRET`, `TUNER_PALLAS_INTERPRET`, read through `tuner._settings`).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import asdict, dataclass
from typing import Any

from tuner._settings import flag, is_set

log = logging.getLogger(__name__)

__all__ = [
    "Device",
    "DEVICES",
    "get_device",
    "SM80",
    "SM90",
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
]


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cuda", "tpu" or "cpu"
    arch: str  # "sm80", "sm90", "tpu_v5e", "cpu"
    # NVIDIA
    smem_per_block_bytes: int = 0  # opt-in maximum per block
    regs_per_sm: int = 0
    max_regs_per_thread: int = 0
    max_threads_per_block: int = 0
    num_sms: int = 0
    l2_bytes: int = 0
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


SM80 = Device(
    "A100",
    "cuda",
    "sm80",
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
SM90 = Device(
    "H100/H200",
    "cuda",
    "sm90",
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
TPU_V4 = Device(
    "TPU v4",
    "tpu",
    "tpu_v4",
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
    smem_per_block_bytes=2**31,
    max_threads_per_block=2**20,
    vmem_bytes=2**40,
    peak_tflops_fp16=0.1,
    peak_tflops_fp32=0.1,
    peak_tflops_int8=0.1,
    peak_bandwidth_gbs=20.0,
)

DEVICES: dict[str, Device] = {d.arch: d for d in (SM80, SM90, TPU_V4, TPU_V5E, TPU_V5P, TPU_V6E, CPU)}


def get_device(arch: str) -> Device:
    """A descriptor by arch name ("sm80", "sm90", "tpu_v5e", "cpu", ...)."""
    try:
        return DEVICES[arch]
    except KeyError:
        raise ValueError(f"unknown device arch {arch!r}; known: {sorted(DEVICES)}") from None


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


def _sm_version(arch: str) -> float:
    digits = arch[2:]
    return int(digits[:-1]) + int(digits[-1]) / 10


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


# ---- detection -----------------------------------------------------------------------------------------
def triton_interpreted() -> bool:
    """Whether `TRITON_INTERPRET` turns Triton's CPU interpreter on."""
    return flag("TRITON_INTERPRET")


# numpy 2.4 turned int() of an array with ndim > 0 (deprecated since numpy 1.25) into this TypeError. The
# Triton interpreter of triton 3.6 and earlier calls it for a scalar kernel argument used as a Python int (a
# `range(0, N, BLOCK)` bound, say), so there every such kernel fails; triton 3.7.1's interpreter does not.
_NUMPY_SCALAR_REFUSAL = "only 0-dimensional arrays can be converted to python scalars"
_FAULT_MARK = "a known fault of the Triton interpreter"


def interpreter_fault_note(error: BaseException | str) -> str:
    """A note that explains `error` (an exception, or the text a failed trial recorded) when the installed
    Triton interpreter's known fault with numpy >= 2.4 raised it, else "". Told by its message, not by
    version numbers: the interpreter of triton <= 3.6 refuses every kernel that uses a scalar argument as
    a Python int once numpy is 2.4 or later, which looks like a fault of the kernel."""
    texts = [str(error)]
    cur: BaseException | str | None = error
    while isinstance(cur, BaseException) and len(texts) < 6:  # the exception and what it was raised from
        texts.append(type(cur).__name__)
        cur = cur.__cause__ or cur.__context__
        if cur is not None:
            texts.append(str(cur))
    low = " ".join(texts).lower()
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
    head, sep, rest = text.partition(f" ({_FAULT_MARK}")
    return head, (sep + rest).strip()


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


def _cuda_arch(major: int) -> str:
    return "sm90" if major >= 9 else "sm80"


def detect_device(backend: str) -> Device:
    """The device descriptor of the hardware `backend` ("triton" or "pallas") runs on here (CPU when it
    is an interpreter)."""
    if backend == "triton":
        if on_gpu():
            import torch

            major, _ = torch.cuda.get_device_capability()
            return get_device(_cuda_arch(major))
        return CPU
    if backend == "pallas":
        if pallas_interpret():
            return CPU
        import jax

        if jax.default_backend() == "tpu":
            kind = jax.devices()[0].device_kind.lower()
            for tag, arch in _TPU_KINDS:
                if tag in kind:
                    return get_device(arch)
            log.warning("unknown TPU kind %r; using tpu_v5e limits", kind)
            return TPU_V5E
        if jax.default_backend() == "gpu":
            cc = str(getattr(jax.devices()[0], "compute_capability", "8.0"))
            return get_device(_cuda_arch(int(cc.split(".")[0])))
        return CPU
    raise ValueError(f"unknown backend {backend!r}; use 'triton' or 'pallas'")


@functools.lru_cache(maxsize=16)
def cuda_device_label(index: int = 0) -> str:
    """ "<GPU name> (sm<cc>)" of CUDA device `index`, as the runtime's keys name it."""
    import torch

    name = torch.cuda.get_device_name(index)
    major, minor = torch.cuda.get_device_capability(index)
    return f"{name} (sm{major}{minor})"


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
