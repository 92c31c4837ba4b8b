"""GEMM-family kernels on a real CUDA GPU (compiled Triton, sm80/sm90 spaces) at sizes the interpreter
cannot afford. Skipped on CPU; the CPU twins are the interpreter sweeps in test_kernels_matmul.py,
test_kernels_int8_matmul.py and test_kernels_moe_gemm.py (same kernels, same check machinery)."""

from __future__ import annotations

import os

import pytest
from tuner.kernels._common import on_gpu

pytestmark = [pytest.mark.gpu]
needs_cuda = pytest.mark.skipif(
    not on_gpu(),
    reason="needs a CUDA GPU with TRITON_INTERPRET=0 (conftest turns the interpreter on unless "
    "told otherwise); CPU twins: test_kernels_{matmul,int8_matmul,moe_gemm}.py",
)

PROBLEMS = {
    "matmul": {"M": 1000, "N": 1500, "K": 700, "bias": True, "activation": "gelu"},
    "int8_matmul": {"M": 77, "N": 4000, "K": 3000, "bias": False, "activation": "none"},
    "moe_gemm": {"T": 3000, "K": 1000, "N": 700, "E": 8},
}


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_gemm_kernels_compile_and_match_on_gpu(name: str, dtype: str) -> None:
    from tuner.kernels import get_kernel
    from tuner.kernels._check import check_kernel

    report = check_kernel(
        get_kernel(name), backend="triton", problem={**PROBLEMS[name], "dtype": dtype}, configs=6, seed=0
    )
    bad = [(r.config, r.max_abs_err, r.error) for r in report.rows if not r.ok]
    assert not bad, f"{name} {dtype} on {report.device}: {bad}"


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_pallas_gemm_kernels_on_a_jax_gpu(name: str) -> None:
    """Pallas' Triton lowering on a real GPU (the interpreted twin: the *_triton_lowering_sweep tests)."""
    import jax

    if jax.default_backend() != "gpu" or os.environ.get("TUNER_PALLAS_INTERPRET", "0") not in ("", "0"):
        pytest.skip(
            "needs jax with a CUDA backend; the interpreted twins are the *_triton_lowering_sweep tests"
        )
    from tuner.kernels import get_kernel
    from tuner.kernels._check import check_kernel

    report = check_kernel(
        get_kernel(name), backend="pallas", problem={**PROBLEMS[name], "dtype": "float16"}, configs=4, seed=0
    )
    bad = [(r.config, r.max_abs_err, r.error) for r in report.rows if not r.ok]
    assert report.device in ("sm80", "sm90") and not bad, f"{name} on {report.device}: {bad}"
