"""Small helpers shared by the kernel modules: dtypes, devices, interpreter flags, tolerances.

`on_gpu`, `triton_interpreted` and `pallas_interpret` are defined once, in `tuner.search_spaces.devices`
(with the detection of the hardware); they are imported here for the kernel modules."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
from tuner.search_spaces.devices import on_gpu, pallas_interpret, triton_interpreted

from tuner._settings import is_set

__all__ = [
    "DTYPES",
    "torch_dtype",
    "jnp_dtype",
    "to_numpy",
    "on_gpu",
    "triton_interpreted",
    "pallas_interpret",
    "default_tolerance",
    "abs_product",
    "fp32_sum_bound",
    "ACTIVATION_SLOPE",
    "torch_device",
    "prepare_triton",
    "ACTIVATIONS",
    "activation_code",
    "activation_np",
    "random_array",
    "hostile_tiny",
    "hostile_rows",
    "HOSTILE_LARGE",
    "SUBNORMAL",
]

# Fused epilogue activations of the GEMM kernels; "gelu" is the exact (erf) form, as torch's default.
ACTIVATIONS = ("none", "relu", "gelu")

DTYPES = ("float32", "float16", "bfloat16")


def torch_dtype(name: str) -> Any:
    import torch

    try:
        return {
            "float32": torch.float32,
            "float16": torch.float16,
            "bfloat16": torch.bfloat16,
            "int8": torch.int8,
            "int32": torch.int32,
        }[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}") from None


def jnp_dtype(name: str) -> Any:
    import jax.numpy as jnp

    try:
        return {
            "float32": jnp.float32,
            "float16": jnp.float16,
            "bfloat16": jnp.bfloat16,
            "int8": jnp.int8,
            "int32": jnp.int32,
        }[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}") from None


def to_numpy(x: Any) -> np.ndarray:
    """Any torch tensor / jax array / numpy array -> float64-capable numpy array (upcast bf16)."""
    if hasattr(x, "detach"):
        import torch

        t = x.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.numpy()
    arr = np.asarray(x)
    if arr.dtype.name in ("bfloat16", "float16"):
        arr = arr.astype(np.float32)
    return arr


INT32_MAX = 2**31 - 1


def wide_offsets(*tensors: Any) -> bool:
    """Whether an element of one of these torch tensors lies more than INT32_MAX elements from its start.
    Triton computes `index * stride` in int32 when both are int32 (program ids, aranges and strides
    below 2**31), so past that the offset wraps: the Triton kernels then take their WIDE constexpr and
    widen the indices to int64. Below it they compile exactly as without the flag."""
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        if t.is_contiguous():  # its last element is the farthest (two C calls: this runs at every launch)
            if t.numel() - 1 > INT32_MAX:
                return True
            continue
        if sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True)) > INT32_MAX:
            return True
    return False


def abs_product(a: Any, b: Any) -> Any:
    """|a| @ |b| in the arrays' own framework (torch on its device, jax, numpy in float64), fp32 or
    wider: the sum of the magnitudes each output element of a product adds up."""
    if hasattr(a, "detach"):
        import torch

        return torch.abs(a.detach().float()) @ torch.abs(b.detach().float())
    if type(a).__module__.startswith("jax"):
        import jax.numpy as jnp

        f32 = jnp.float32
        return jnp.abs(a.astype(f32)) @ jnp.abs(b.astype(f32))
    return np.abs(np.asarray(a, dtype=np.float64)) @ np.abs(np.asarray(b, dtype=np.float64))


def fp32_sum_bound(abs_sum: Any, k: int, slope: float = 1.0) -> Any:
    """An elementwise allowance for the rounding error of fp32 sums of `k` terms whose magnitudes add up
    to `abs_sum`: sqrt(k) * 2^-24 * abs_sum (Higham & Mary's probabilistic bound, lambda = 1), times
    the epilogue's largest slope. Added to the tolerance's atol by the checks, so a long reduction in
    fp32 (any order: sequential, split-K, tiled) is not mistaken for a wrong result. On the H200 an int8
    GEMM with K = 3000 and rows of 64x magnitude summed in plain order was 10x inside it (max abs error
    5.2e-4, over atol 1e-4); a missing or doubled K tile is orders of magnitude outside it."""
    return abs_sum * (math.sqrt(k) * 2.0**-24 * slope)


# The largest |d act/dx| of each epilogue activation (gelu's is 1.129 at x = 1.4), so an error before the
# activation stays within slope x the same bound after it.
ACTIVATION_SLOPE = {"none": 1.0, "relu": 1.0, "gelu": 1.13}


def torch_device() -> str:
    return "cuda" if on_gpu() else "cpu"


def default_tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for comparing a kernel's output with its float32 reference."""
    return {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2)}.get(
        dtype, (1e-2, 1e-2)
    )


def prepare_triton() -> None:
    """Call before importing a module that defines @triton.jit kernels: with no CUDA device, turn the
    Triton interpreter on (it must be on before the kernels are defined), unless the user chose."""
    if is_set("TRITON_INTERPRET"):
        return
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        cuda = False
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"


def activation_code(name: str) -> int:
    """The constexpr code the Triton kernels use for an activation (0 none, 1 relu, 2 gelu)."""
    try:
        return ACTIVATIONS.index(name)
    except ValueError:
        raise ValueError(f"unknown activation {name!r}; choose one of {list(ACTIVATIONS)}") from None


def activation_np(x: np.ndarray, name: str) -> np.ndarray:
    """Reference activation in numpy at the input's precision (float64 in the references)."""
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        from math import erf, sqrt

        verf = np.vectorize(erf, otypes=[np.float64])
        return 0.5 * x * (1.0 + verf(x / sqrt(2.0)))
    raise ValueError(f"unknown activation {name!r}; choose one of {list(ACTIVATIONS)}")


# The factor of the large-magnitude rows of the GEMM inputs (a power of two: scaling is exact).
HOSTILE_LARGE = 64.0

# A value below the dtype's smallest normal number (bfloat16 shares float32's exponent range).
SUBNORMAL = {"float32": 1e-40, "float16": 1e-6, "bfloat16": 1e-40}


def hostile_tiny(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """`n` subnormal values of `dtype` (random sign, magnitude 1-4x `SUBNORMAL[dtype]`), with zeros."""
    x = SUBNORMAL.get(dtype, 1e-6) * rng.uniform(1.0, 4.0, n) * rng.choice([-1.0, 1.0], n)
    x[::4] = 0.0
    return x


def hostile_rows(x: np.ndarray, rng: np.random.Generator, dtype: str, large: float) -> np.ndarray:
    """Make some rows of a 2-D input hostile, in place: rows cycle (row % 8) through 1 all zeros,
    2 large magnitudes (x `large`), 3 subnormals of `dtype`, 4 every third value zero; others stay."""
    for r in range(x.shape[0]):
        kind = r % 8
        if kind == 1:
            x[r] = 0
        elif kind == 2:
            x[r] *= large
        elif kind == 3:
            x[r] = hostile_tiny(rng, x.shape[1], dtype)
        elif kind == 4:
            x[r, ::3] = 0
    return x


def random_array(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 values times `scale`, with exact zeros replaced (`hostile_rows` adds
    zeros where a generator wants them)."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    x[x == 0] = np.float32(scale * 1e-3)
    return x
