"""The kernel registry: each kernel is a `KernelSpec` that the engine can tune and a user can call.

A spec ties together, for one kernel: its launchers per backend ("triton", "pallas"), its search space
(built for a problem and a device), a reference implementation at float32 or higher, a problem
generator, analytic FLOP and byte counts, tolerances per dtype, and the inputs it mutates.

A *problem* is a plain dict: shape fields (e.g. {"M": 128, "N": 96, "K": 80}), "dtype" (a string such
as "float16") and kernel flags (e.g. "causal": True). Inputs are a dict name -> array (torch tensors
for Triton, jax arrays for Pallas). Heavy frameworks are imported inside the functions, never here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.search_spaces import Device, SearchSpace

__all__ = ["KernelSpec", "register", "get_kernel", "all_kernels", "REGISTRY"]

Problem = Mapping[str, Any]
Inputs = dict[str, Any]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    description: str
    backends: tuple[str, ...]
    dtypes: tuple[str, ...]
    # The problem used when none is given (small: it runs under the CPU interpreters).
    default_problem: Mapping[str, Any]
    # Which problem fields are shape dimensions (used by cache keys and bucketing).
    shape_fields: tuple[str, ...]
    # space(problem, device, backend) -> SearchSpace with hard constraints for that problem and device.
    space: Callable[[Problem, Device, str], SearchSpace]
    # make_inputs(problem, backend, seed) -> inputs (random, never all zeros).
    make_inputs: Callable[[Problem, str, int], Inputs]
    # reference(problem, inputs) -> output as a float32 (or wider) numpy array.
    reference: Callable[[Problem, Inputs], Any]
    # run(problem, backend, inputs, config) -> output (framework array); `interpret` is decided by the
    # backend module from the device (CPU: Triton interpreter / Pallas interpret=True).
    run: Callable[[Problem, str, Inputs, Mapping[str, Any]], Any]
    flops: Callable[[Problem], float]
    bytes_moved: Callable[[Problem], float]
    # tolerance(dtype) -> (rtol, atol) for comparing with the reference.
    tolerance: Callable[[str], tuple[float, float]]
    # Names of inputs the kernel writes to (restored before every timed run).
    mutated_inputs: tuple[str, ...] = ()
    # Name of the output buffer among the inputs, if the launcher writes into a preallocated buffer
    # (the measurer poisons it with NaN before each run).
    output_buffer: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"kernel {spec.name!r} is registered twice")
    REGISTRY[spec.name] = spec
    return spec


_loaded = False


def _load_all() -> None:
    """Import every public module of the `kernels` package; each registers its kernels on import
    (and imports torch/jax/triton lazily, inside functions)."""
    global _loaded
    if _loaded:
        return
    import importlib
    import pkgutil

    import tuner.kernels as kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"tuner.kernels.{info.name}")
    _loaded = True


def get_kernel(name: str) -> KernelSpec:
    _load_all()
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(REGISTRY)}") from None


def all_kernels() -> list[KernelSpec]:
    _load_all()
    return [REGISTRY[k] for k in sorted(REGISTRY)]
