"""Device descriptors: the hardware limits that hard constraints and cost-model features use.

Figures are from the vendors' public documentation (CUDA C Programming Guide, "Compute Capabilities"
table; Google Cloud TPU system architecture pages). Peaks are dense, without sparsity.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
