"""Which device a backend would run on here, as a `search_spaces.Device` (imports torch/jax lazily)."""

from __future__ import annotations

import logging
import os

from search_spaces import DEVICES, Device, get_device

log = logging.getLogger(__name__)

__all__ = ["detect_device", "cuda_arch", "tpu_arch"]


def cuda_arch(major: int, minor: int) -> str:
    """Compute capability -> the nearest arch we describe (sm90 for 9.x and newer, else sm80)."""
    return "sm90" if major >= 9 else "sm80"


def tpu_arch(device_kind: str) -> str:
    k = device_kind.lower().replace(" ", "")
    if "v6" in k:
        return "tpu_v6e"
    if "v5p" in k:
        return "tpu_v5p"
    if "v5" in k:  # "TPU v5 lite", "TPU v5e"
        return "tpu_v5e"
    return "tpu_v4"


def detect_device(backend: str) -> Device:
    """The device `backend` ("triton" or "pallas") would use in this process: a CUDA GPU for Triton
    when torch sees one and TRITON_INTERPRET is off; the JAX default backend for Pallas; else CPU."""
    if backend == "triton":
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            return get_device("cpu")
        try:
            import torch
        except ImportError:
            return get_device("cpu")
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return get_device(cuda_arch(major, minor))
        return get_device("cpu")
    if backend == "pallas":
        try:
            import jax
        except ImportError:
            return get_device("cpu")
        plat = jax.default_backend()
        if plat == "tpu":
            return get_device(tpu_arch(jax.devices()[0].device_kind))
        if plat in ("gpu", "cuda"):
            cc = getattr(jax.devices()[0], "compute_capability", "8.0")
            major = int(str(cc).split(".")[0])
            return get_device(cuda_arch(major, 0))
        return get_device("cpu")
    raise ValueError(f"backend must be 'triton' or 'pallas', got {backend!r}")


assert "cpu" in DEVICES
