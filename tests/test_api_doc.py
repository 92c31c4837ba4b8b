"""docs/api.md against the code."""

from __future__ import annotations

import pytest

import tuner


def test_tune_kernel_takes_the_kernel_by_the_documented_name() -> None:
    """`tuner.tune_kernel(kernel, problem, *, backend, budget, ...)`: the keyword a user reads works (it was
    `spec_or_name`, and `kernel=` raised TypeError). The backend is refused before any worker starts."""
    with pytest.raises(ValueError, match="kernel 'matmul' has no 'cuda' backend"):
        tuner.tune_kernel(kernel="matmul", problem=None, backend="cuda", budget=1)
