"""Check a kernel against its reference over random valid configs of its search space.

`check_kernel(spec, backend=..., problem=..., device=..., configs=N, seed=S)` checks the problem against the
kernel's schema (`validate_problem`: a ValueError naming the value), builds the space for the problem and
device, draws N distinct valid configs (seeded), and for each one: poisons the output with
NaN, runs the launcher, and compares with the float32-or-wider reference under the dtype's tolerance
(`|out - ref| <= atol + rtol * |ref|` everywhere, and every element finite). A launcher that raises
gives a failed row with the error, not a crash.

Poisoning: where the launcher writes into a preallocated buffer (`KernelSpec.output_buffer`) that buffer
is filled with NaN before every run (an immutable jax buffer is replaced by a NaN-filled one), so an element
the kernel fails to write fails the check. Pallas outputs that are new arrays: under `interpret=True` their uninitialised memory is NaN (jax's interpreter
semantics; tests/test_check_cli.py holds a kernel that skips a block to keep that true). A Triton
launcher that allocates its own output should use NaN-filled memory for the same guarantee.

Everything runs on the current machine: Triton on a CUDA GPU or under the interpreter, Pallas on
TPU/GPU or with `interpret=True`. Call `tuner.kernels.prepare_triton()` before any kernel module is
imported. `detect_device` is `tuner.search_spaces.devices.detect_device`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tuner.search_spaces import Device, SearchSpace
from tuner.search_spaces.devices import detect_device, interpreter_fault_note

from ._common import to_numpy
from ._registry import KernelSpec, validate_problem

__all__ = [
    "CheckRow",
    "CheckReport",
    "check_kernel",
    "detect_device",
    "poison",
    "compare",
    "draw_configs",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckRow:
    config: dict[str, Any]
    max_abs_err: float
    max_rel_err: float
    ok: bool
    bad_elements: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "max_abs_err": _json_float(self.max_abs_err),
            "max_rel_err": _json_float(self.max_rel_err),
            "ok": self.ok,
            "bad_elements": self.bad_elements,
            "error": self.error,
        }


@dataclass(frozen=True)
class CheckReport:
    kernel: str
    backend: str
    problem: dict[str, Any]
    device: str
    space_size: int
    rtol: float
    atol: float
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "backend": self.backend,
            "problem": self.problem,
            "device": self.device,
            "space_size": self.space_size,
            "rtol": self.rtol,
            "atol": self.atol,
            "ok": self.ok,
            "rows": [r.to_dict() for r in self.rows],
        }


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def poison(x: Any) -> Any:
    """A NaN-filled output buffer (-1 for integer dtypes): torch tensors and numpy arrays are filled in
    place and returned; immutable arrays (jax) are replaced by a poisoned array of the same shape and dtype."""
    if hasattr(x, "fill_"):
        x.fill_(float("nan") if x.is_floating_point() else -1)
        return x
    if isinstance(x, np.ndarray):
        x.fill(np.nan if np.issubdtype(x.dtype, np.floating) else -1)
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        import jax.numpy as jnp

        return jnp.full_like(x, jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else -1)
    raise TypeError(f"cannot poison an output buffer of type {type(x).__name__}")


def compare(
    out: Any, ref: np.ndarray, rtol: float, atol: float | np.ndarray
) -> tuple[float, float, bool, int]:
    """(max abs error, max relative error, ok, elements out of tolerance or not finite). `atol` may be
    elementwise (the spec's atol plus its `error_bound`)."""
    o = np.asarray(to_numpy(out), dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.shape != r.shape:
        raise ValueError(f"output shape {o.shape} != reference shape {r.shape}")
    err = np.abs(o - r)
    finite = np.isfinite(o)
    bad = (~finite) | ~(err <= atol + rtol * np.abs(r))
    n_bad = int(bad.sum())
    if o.size == 0:
        return 0.0, 0.0, True, 0
    if not finite.all():
        return math.nan, math.nan, False, n_bad
    rel = err / np.maximum(np.abs(r), atol)
    return float(err.max()), float(rel.max()), n_bad == 0, n_bad


def draw_configs(space: SearchSpace, n: int, seed: int) -> list[dict[str, Any]]:
    """Up to n distinct valid configs, uniformly without replacement (seeded)."""
    rng = np.random.default_rng(seed)
    if space.is_enumerable:
        allc = space.enumerate()
        if not allc:
            space.check_not_empty()  # raises, saying which constraints reject how many configs
            raise ValueError(f"space {space.name!r} has no valid config for this problem")
        idx = rng.choice(len(allc), size=min(n, len(allc)), replace=False)
        return [allc[int(i)] for i in idx]
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for _ in range(50 * n):
        c = space.sample(rng)
        k = tuple(c[p] for p in space.names)
        if k not in seen:
            seen.add(k)
            out.append(c)
        if len(out) == n:
            break
    return out


def check_kernel(
    spec: KernelSpec,
    *,
    backend: str,
    problem: Mapping[str, Any] | None = None,
    device: Device | None = None,
    configs: int | Sequence[Mapping[str, Any]] = 8,
    seed: int = 0,
    progress: Any = None,
) -> CheckReport:
    """Run `configs` random valid configs (or the given list) of the kernel's space against its reference.

    `progress(i, row)` is called after each config (for a progress bar)."""
    if backend not in spec.backends:
        raise ValueError(f"kernel {spec.name!r} has no backend {backend!r}; it has {list(spec.backends)}")
    # the problem schema first (eps = 0, a head dim without code, ...): a ValueError naming the value, not
    # a run whose every config fails
    prob = validate_problem(spec, {**spec.default_problem, **(problem or {})})
    dev = device or detect_device(backend)
    space = spec.space(prob, dev, backend)
    if isinstance(configs, int):
        if configs < 1:
            raise ValueError(f"configs={configs} must be >= 1")
        chosen = draw_configs(space, configs, seed)
    else:
        chosen = [space.validate(c) for c in configs]
    rtol, atol = spec.tolerance(str(prob.get("dtype", "float32")))
    inputs = spec.make_inputs(prob, backend, seed)
    ref = np.asarray(spec.reference(prob, inputs), dtype=np.float64)
    bound = spec.error_bound(prob, inputs) if spec.error_bound is not None else None
    atol_eff = atol if bound is None else atol + np.asarray(to_numpy(bound), dtype=np.float64)
    size = len(space) if space.is_enumerable else -1
    rows: list[CheckRow] = []
    for i, cfg in enumerate(chosen):
        if spec.mutated_inputs and i > 0:
            inputs = spec.make_inputs(prob, backend, seed)  # fresh copies of what the kernel writes
        if spec.output_buffer is not None and spec.output_buffer in inputs:
            inputs[spec.output_buffer] = poison(inputs[spec.output_buffer])
        try:
            out = spec.run(prob, backend, inputs, cfg)
            if hasattr(out, "block_until_ready"):
                out.block_until_ready()
            mae, mre, ok, n_bad = compare(out, ref, rtol, atol_eff)
            row = CheckRow(dict(cfg), mae, mre, ok, n_bad)
        except Exception as exc:  # a failing config is a result, not a crash
            logger.debug("config %s failed", cfg, exc_info=True)
            msg = str(exc).strip().splitlines()
            row = CheckRow(
                dict(cfg),
                math.nan,
                math.nan,
                False,
                -1,
                f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300] + interpreter_fault_note(exc),
            )
        rows.append(row)
        if progress is not None:
            progress(i, row)
    return CheckReport(spec.name, backend, dict(prob), dev.arch, size, rtol, atol, rows)
