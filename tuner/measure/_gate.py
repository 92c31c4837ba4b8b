"""The correctness gate: restore mutated inputs, poison outputs, compare with the reference, and
classify a failure by its exception.

Works on numpy arrays, torch tensors and jax arrays without importing torch or jax unless the value
is one of theirs (detected by its type's module).
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._result import COMPILE_ERROR, CRASHED, OUT_OF_RESOURCES

__all__ = ["ArrayOps", "Check", "compare", "classify_exception", "to_numpy", "is_torch", "is_jax"]


def _module(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def is_torch(x: Any) -> bool:
    return _module(x) == "torch"


def is_jax(x: Any) -> bool:
    return _module(x) in ("jax", "jaxlib")


def to_numpy(x: Any) -> np.ndarray:
    """Any torch tensor / jax array / numpy array -> numpy (half precision upcast to float32)."""
    if is_torch(x):
        import torch

        t = x.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.name in ("bfloat16", "float16"):
        arr = arr.astype(np.float32)
    return arr


class ArrayOps:
    """Copy, restore, poison and compare arrays of any of the three frameworks."""

    @staticmethod
    def snapshot(x: Any) -> Any:
        if is_torch(x):
            return x.detach().clone()
        if is_jax(x):
            import jax.numpy as jnp

            return jnp.array(x, copy=True)
        if isinstance(x, np.ndarray):
            return x.copy()
        return None  # scalars and other objects: nothing to restore

    @staticmethod
    def restore(holder: MutableMapping[Any, Any], name: Any, pristine: Any) -> None:
        x = holder[name]
        if pristine is None:
            return
        if is_torch(x):
            x.copy_(pristine)
        elif is_jax(x):
            import jax.numpy as jnp

            holder[name] = jnp.array(pristine, copy=True)  # immutable (maybe donated): a fresh copy
        elif isinstance(x, np.ndarray):
            np.copyto(x, pristine)

    @staticmethod
    def poison(holder: MutableMapping[Any, Any], name: Any) -> None:
        x = holder[name]
        if is_torch(x):
            if x.dtype.is_floating_point or x.dtype.is_complex:
                x.fill_(float("nan"))
            else:
                import torch

                x.fill_(torch.iinfo(x.dtype).max if x.dtype != torch.bool else True)
        elif is_jax(x):
            import jax.numpy as jnp

            fill = float("nan") if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).max
            holder[name] = jnp.full(x.shape, fill, dtype=x.dtype)
        elif isinstance(x, np.ndarray):
            if np.issubdtype(x.dtype, np.inexact):
                x.fill(np.nan)
            elif np.issubdtype(x.dtype, np.integer):
                x.fill(np.iinfo(x.dtype).max)

    @staticmethod
    def unchanged(x: Any, pristine: Any) -> bool:
        """True when `x` still equals its snapshot (NaN equal to NaN)."""
        if pristine is None:
            return True
        if is_torch(x):
            import torch

            if x.shape != pristine.shape:
                return False
            if x.dtype.is_floating_point:
                return bool(
                    torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(pristine, nan=0.0))
                    and torch.equal(torch.isnan(x), torch.isnan(pristine))
                )
            return bool(torch.equal(x, pristine))
        if is_jax(x):
            # jax arrays are immutable; one donated to the kernel has lost its buffer
            return not getattr(x, "is_deleted", lambda: False)()
        if isinstance(x, np.ndarray):
            return x.shape == pristine.shape and bool(
                np.array_equal(x, pristine, equal_nan=x.dtype.kind in "fc")
            )
        return True


@dataclass(frozen=True)
class Check:
    ok: bool
    max_abs_error: float | None
    message: str | None = None


def _first_output(output: Any, reference: Any) -> list[tuple[Any, Any]]:
    if isinstance(reference, (tuple, list)):
        if not isinstance(output, (tuple, list)) or len(output) != len(reference):
            return [(output, reference)]
        return list(zip(output, reference, strict=True))
    if isinstance(output, (tuple, list)) and output:
        return [(output[0], reference)]
    return [(output, reference)]


def _bound_text(bound: Any) -> str:
    return "" if bound is None else " + the accumulation bound"


def _compare_torch(
    out: Any, ref: Any, rtol: float, atol: float, cache: dict[str, Any], bound: Any = None
) -> Check:
    import torch

    key = f"ref{id(ref)}"
    r = cache.get(key)
    if r is None or r.device != out.device:
        r = torch.as_tensor(np.asarray(ref, dtype=np.float32)).to(out.device)
        cache[key] = r
    o = out.detach().float()
    if tuple(o.shape) != tuple(r.shape):
        return Check(False, None, f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    diff = (o - r).abs()
    allowed = atol + rtol * r.abs()
    if bound is not None:
        bkey = f"bound{id(bound)}"
        b = cache.get(bkey)
        if b is None or b.device != out.device:
            b = bound.detach() if hasattr(bound, "detach") else torch.as_tensor(to_numpy(bound))
            b = b.to(device=out.device, dtype=torch.float32)
            cache[bkey] = b
        allowed = allowed + b
    bad = ~(diff <= allowed)  # NaN anywhere is bad
    nbad = int(bad.sum().item())
    finite = torch.nan_to_num(diff, nan=math.inf)
    max_err = float(finite.max().item()) if finite.numel() else 0.0
    if nbad:
        nnan = int(torch.isnan(o).sum().item())
        return Check(
            False,
            max_err,
            f"{nbad} of {o.numel()} elements outside rtol={rtol}, atol={atol}{_bound_text(bound)} "
            f"({nnan} NaN; max abs error {max_err:.3g})",
        )
    return Check(True, max_err)


def compare(
    output: Any,
    reference: Any,
    rtol: float,
    atol: float,
    cache: dict[str, Any] | None = None,
    bound: Any = None,
) -> Check:
    """Compare a kernel's output with its reference: every element within `atol + rtol * |ref|`, plus
    `bound` (elementwise, the first output only) where the kernel's spec gives one for the rounding of
    long fp32 reductions (`KernelSpec.error_bound`).

    NaN or inf in the output where the reference is finite fails (a poisoned element the kernel did not
    write stays NaN). CUDA tensors are compared on the device, against a cached device copy of the
    reference."""
    cache = {} if cache is None else cache
    worst = 0.0
    for i, (out, ref) in enumerate(_first_output(output, reference)):
        b = bound if i == 0 else None
        if out is None:
            return Check(False, None, "the kernel returned no output")
        if is_torch(out) and out.device.type != "cpu":
            c = _compare_torch(out, ref, rtol, atol, cache, b)
        else:
            o = to_numpy(out).astype(np.float64, copy=False)
            r = np.asarray(ref, dtype=np.float64)
            if o.shape != r.shape:
                return Check(False, None, f"output shape {o.shape} != reference shape {r.shape}")
            extra = 0.0 if b is None else np.asarray(to_numpy(b), dtype=np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(o - r)
                good = diff <= atol + extra + rtol * np.abs(r)
                both_nan = np.isnan(o) & np.isnan(r)
            good |= both_nan
            fin = np.where(np.isfinite(diff), diff, np.inf)
            fin = np.where(both_nan, 0.0, fin)
            max_err = float(fin.max()) if fin.size else 0.0
            if not good.all():
                nbad = int((~good).sum())
                nnan = int(np.isnan(o).sum())
                c = Check(
                    False,
                    max_err,
                    f"{nbad} of {o.size} elements outside rtol={rtol}, atol={atol}{_bound_text(b)} "
                    f"({nnan} NaN; max abs error {max_err:.3g})",
                )
            else:
                c = Check(True, max_err)
        if not c.ok:
            return c
        worst = max(worst, c.max_abs_error or 0.0)
    return Check(True, worst)


# ---- failure classification -----------------------------------------------------------------------
_OOR_TYPES = ("OutOfResources", "OutOfMemoryError", "MemoryError", "OutOfResourcesError")
_OOR_TEXT = (
    "out of memory",
    "out of resource",
    "resource_exhausted",
    "resource exhausted",
    "exceeds the available vmem",
    "scoped vmem",
    "insufficient shared memory",
    "too many resources",
)
_COMPILE_TYPES = (
    "CompilationError",
    "CompileTimeAssertionFailure",
    "PTXASError",
    "MLIRError",
    "LoweringException",
    "LoweringError",
    "UnsupportedLanguageConstruct",
)
_FATAL_TEXT = (
    "illegal memory access",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "illegal instruction",
    "cuda error",
    "cudaerror",
    "hardware exception",
)


def classify_exception(exc: BaseException, phase: str) -> tuple[str, bool]:
    """(status, fatal) for an exception raised while compiling (`phase="compile"`: the first call) or
    running a config. `fatal` means the process's device context is unusable: replace the worker.

    Resource exhaustion -> out_of_resources; a compiler's own error types -> compile_error; a device
    fault (illegal address, device assert) -> crashed and fatal; any other exception -> crashed (the
    config ran and failed), except during the compile phase where a `NotImplementedError` or a compiler
    error is compile_error."""
    names = [c.__name__ for c in type(exc).__mro__]
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(t in text for t in _FATAL_TEXT):
        if any(t in text for t in ("out of memory",)):
            return OUT_OF_RESOURCES, True
        return CRASHED, True
    if any(n in _OOR_TYPES for n in names) or any(t in text for t in _OOR_TEXT):
        return OUT_OF_RESOURCES, False
    if any(n in _COMPILE_TYPES for n in names) or any("compil" in n.lower() for n in names):
        return COMPILE_ERROR, False
    if phase == "compile" and isinstance(exc, NotImplementedError):
        return COMPILE_ERROR, False
    return CRASHED, False


# The modules of pyproject's `kernels` extra: a trial that needs one of them and lacks it says how to get it.
_BACKEND_MODULES = frozenset({"torch", "triton", "jax", "jaxlib"})
# What a trial of each kernel backend imports from that extra (a Triton kernel's inputs are torch tensors).
BACKEND_NEEDS: dict[str, tuple[str, ...]] = {"triton": ("torch", "triton"), "pallas": ("jax", "jaxlib")}
_EXTRA_HINT = " (a kernel backend, not installed by plain `pip install tuner`: pip install 'tuner[kernels]')"


def missing_backend_module(backend: str) -> str | None:
    """The first module of the `kernels` extra that a trial of `backend` needs and this environment lacks."""
    import importlib.util

    for name in BACKEND_NEEDS.get(backend, ()):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a broken or half-removed install: the trial would fail too
            return name
    return None


def refuse_missing_backend(backend: str, what: str) -> None:
    """Raise ModuleNotFoundError, before any trial, when `backend` needs a module of the `kernels` extra
    that is not installed: every trial would crash in its worker (`what` says who refuses)."""
    name = missing_backend_module(backend)
    if name is not None:
        raise ModuleNotFoundError(
            f"No module named {name!r}: {what} on backend {backend} needs it; no trial was run{_EXTRA_HINT}",
            name=name,
        )


def _missing_backend(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from or while handling (the kernel registry's ImportError
    naming the kernel module that failed, `kernels/_registry.py`), is a ModuleNotFoundError naming a
    kernel backend."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ModuleNotFoundError) and (cur.name or "").split(".")[0] in _BACKEND_MODULES:
            return True
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return False


def backend_hint(exc: BaseException) -> str:
    """What to add to the message of `exc` when it is (or wraps) a missing kernel backend and does not say
    it already, else ""."""
    if _missing_backend(exc) and _EXTRA_HINT not in str(exc):
        return _EXTRA_HINT
    return ""


def describe_exception(exc: BaseException, limit: int = 2000) -> str:
    import traceback

    from tuner.search_spaces.devices import interpreter_fault_note

    tb = "".join(traceback.format_exception_only(type(exc), exc)).strip() + backend_hint(exc)
    note = interpreter_fault_note(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return (tb[: max(0, limit - len(note) - len(where))] + note + where)[:limit]


def nonfinite_message(output: Any) -> str | None:
    """For results without a reference: NaN/inf in a floating output means incorrect."""
    for out in output if isinstance(output, (tuple, list)) else [output]:
        if out is None:
            continue
        try:
            arr = to_numpy(out)
        except Exception:  # not an array: nothing to check
            continue
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            return f"output holds {int((~np.isfinite(arr)).sum())} non-finite values of {arr.size}"
    return None
