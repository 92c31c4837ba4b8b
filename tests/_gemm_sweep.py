"""Shared sweep helper for the GEMM-family kernel tests (CPU: Triton interpreter, Pallas interpret)."""

from __future__ import annotations

from typing import Any

from tuner.kernels import get_kernel
from tuner.kernels._check import check_kernel
from tuner.search_spaces import get_device


def sweep(
    name: str, backend: str, problem: dict[str, Any], configs: int, seed: int, arch: str = "cpu"
) -> None:
    """`configs` distinct random valid configs of the `arch` space (run here, under the interpreters) must
    all match the reference. arch="sm90" with backend="pallas" exercises the Triton-lowering structure."""
    spec = get_kernel(name)
    report = check_kernel(
        spec, backend=backend, problem=problem, device=get_device(arch), configs=configs, seed=seed
    )
    assert len(report.rows) == configs
    bad = [r for r in report.rows if not r.ok]
    assert not bad, f"{name}/{backend} {problem}: {[(r.config, r.max_abs_err, r.error) for r in bad]}"
