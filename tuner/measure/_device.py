"""Which device a backend would run on here, as a `tuner.search_spaces.Device`.

One definition for the whole project: `tuner.kernels._check.detect_device` (CUDA compute capability -> sm80 /
sm90, JAX's TPU kind -> the TPU generation, CPU under the interpreters). Imports torch/jax lazily.
"""

from __future__ import annotations

from tuner.search_spaces import Device

__all__ = ["detect_device"]


def detect_device(backend: str) -> Device:
    """The device `backend` ("triton" or "pallas") would use in this process."""
    from tuner.kernels._check import detect_device as _detect

    return _detect(backend)
