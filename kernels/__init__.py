"""Triton and Pallas kernels with search spaces, references, problem generators and cost counts."""

from ._registry import KernelSpec, all_kernels, get_kernel, register

__all__ = ["KernelSpec", "all_kernels", "get_kernel", "register"]
