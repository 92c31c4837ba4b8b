"""int8 weight-only matmul (Triton + Pallas) against its float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from tests._gemm_sweep import sweep


@pytest.mark.parametrize("backend", ["triton", "pallas"])
@pytest.mark.parametrize(
    ("dtype", "bias", "activation", "seed"),
    [
        ("float16", True, "relu", 0),
        ("bfloat16", True, "gelu", 1),
        ("float32", False, "none", 2),
    ],
)
def test_int8_matmul_space_sweep(backend: str, dtype: str, bias: bool, activation: str, seed: int) -> None:
    sweep(
        "int8_matmul",
        backend,
        {"M": 50, "N": 40, "K": 70, "dtype": dtype, "bias": bias, "activation": activation},
        3,
        seed,
    )


def test_int8_matmul_pallas_triton_lowering_sweep() -> None:
    """The NVIDIA structure of the Pallas kernel (num_warps/num_stages in the space), interpreted."""
    sweep(
        "int8_matmul",
        "pallas",
        {"M": 50, "N": 40, "K": 70, "dtype": "float16", "bias": True, "activation": "relu"},
        3,
        5,
        "sm90",
    )


def test_quantize_per_channel_round_trip() -> None:
    from tuner.kernels.int8_matmul import quantize_per_channel

    rng = np.random.default_rng(0)
    w = rng.standard_normal((33, 7)).astype(np.float32)
    q, s = quantize_per_channel(w)
    assert q.dtype == np.int8 and s.shape == (7,)
    assert np.abs(q).max() == 127
    np.testing.assert_allclose(q * s[None, :], w, atol=float(s.max()) / 2 + 1e-7)


def test_weights_are_int8_and_bytes_count_one_byte_per_weight() -> None:
    from tuner.kernels import get_kernel

    spec = get_kernel("int8_matmul")
    p = {"M": 8, "N": 16, "K": 32, "dtype": "float16", "bias": False, "activation": "none"}
    inputs = spec.make_inputs(p, "pallas", 0)
    assert str(inputs["w"].dtype) == "int8" and (np.asarray(inputs["w"]) != 0).all()
    assert spec.bytes_moved(p) == 2 * (8 * 32 + 8 * 16) + 32 * 16 + 4 * 16
