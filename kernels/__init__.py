"""Triton and Pallas kernels with search spaces, references, problem generators and cost counts."""

from ._common import prepare_triton
from ._registry import KernelSpec, all_kernels, get_kernel, register, validate_problem

__all__ = ["KernelSpec", "all_kernels", "get_kernel", "prepare_triton", "register", "validate_problem"]
