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

__all__ = ["KernelSpec", "register", "get_kernel", "all_kernels", "validate_problem", "REGISTRY", "MAX_DIM"]

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
    # check_problem(problem) raises ValueError naming a value the kernel cannot take (e.g. a head dim it
    # has no code for); `validate_problem` calls it after its generic checks.
    check_problem: Callable[[Problem], Any] | None = None
    # error_bound(problem, inputs) -> an elementwise allowance (broadcastable to the output; a numpy
    # array, or a torch / jax array on the inputs' device) added to atol, for the rounding error of long
    # fp32 reductions that a fixed atol cannot cover (kernels._common.fp32_sum_bound); None: atol alone.
    error_bound: Callable[[Problem, Inputs], Any] | None = None


REGISTRY: dict[str, KernelSpec] = {}

# The largest shape dimension a problem may have (32-bit indexing in the kernels' grids and offsets).
MAX_DIM = 2**31 - 1


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return type(v).__name__


def validate_problem(spec: KernelSpec, problem: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel's problem schema, checked before anything runs: returns the problem with the kernel's
    defaults filled in, or raises ValueError naming the field and the value.

    Fields are the shape fields, the flags of `default_problem`, the optional fields the spec names in
    `extra["optional_fields"]` (moe_gemm's `group_sizes`, checked by the kernel's `check_problem`) and
    "dtype". Shape fields are integers in
    [1, MAX_DIM]; a flag has the type of its default (a number flag takes an integer or a finite number; a
    flag whose default is None takes None or a number); dtype is one of the kernel's; then the kernel's
    own `check_problem` runs."""
    import math

    if not isinstance(problem, Mapping):
        raise ValueError(f"a problem must be a table of fields, got {problem!r}")
    flags = {**dict(spec.extra.get("flags") or {}), **dict(spec.default_problem)}
    fields = set(flags) | set(spec.shape_fields) | set(spec.extra.get("optional_fields") or {}) | {"dtype"}
    unknown = sorted(set(problem) - fields)
    if unknown:
        raise ValueError(
            f"kernel {spec.name!r} has no problem field {unknown[0]!r} (fields: {', '.join(sorted(fields))})"
        )
    merged = {**dict(spec.default_problem), **dict(problem)}
    for f in spec.shape_fields:
        if f not in merged:
            raise ValueError(f"kernel {spec.name!r} problem misses shape field {f!r}")
        v = merged[f]
        if isinstance(v, bool) or not isinstance(v, int) or not (1 <= v <= MAX_DIM):
            raise ValueError(f"{f}={v!r} must be an integer in [1, {MAX_DIM}]")
    dtype = merged.get("dtype")
    if dtype not in spec.dtypes:
        raise ValueError(f"dtype={dtype!r} must be one of {list(spec.dtypes)}")
    for f, default in flags.items():
        if f in spec.shape_fields or f == "dtype" or f not in problem:
            continue
        v = merged[f]
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, (int, float)) or default is None:
            ok = (number and math.isfinite(v)) or (default is None and v is None)
            if ok and isinstance(default, int) and not isinstance(v, int):
                ok = False
        elif isinstance(default, str):
            ok = isinstance(v, str)
        else:
            ok = True
        if not ok:
            kind = "a number or None" if default is None else _kind(default)
            raise ValueError(f"{f}={v!r} must be {kind} (like the default {default!r})")
    if spec.check_problem is not None:
        spec.check_problem(merged)
    return merged


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"kernel {spec.name!r} is registered twice")
    REGISTRY[spec.name] = spec
    return spec


_loaded = False


def _load_all() -> None:
    """Import every public module of the `kernels` package; each registers its kernels on import
    (and imports torch/jax/triton lazily, inside functions). One that cannot be imported is an
    ImportError naming it."""
    global _loaded
    if _loaded:
        return
    import importlib
    import pkgutil

    import tuner.kernels as kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        if not info.name.startswith("_"):
            module = f"tuner.kernels.{info.name}"
            before = set(REGISTRY)
            try:
                importlib.import_module(module)
            except Exception as exc:  # a missing dependency, a syntax error: the registry is incomplete
                # what it registered before it failed goes too: the next try imports it again, and would
                # fail on "registered twice" in place of the cause
                for name in set(REGISTRY) - before:
                    del REGISTRY[name]
                raise ImportError(
                    f"kernel module {module} cannot be imported ({type(exc).__name__}: {exc}); the kernels "
                    "it registers are unknown until it can",
                    name=module,
                ) from exc
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
