"""What gets measured (a Target) and the per-process session that measures it.

A Target holds one task's inputs and reference: a registered kernel on one problem and backend
(`KernelTarget`) or a plain Python callable (`CallableTarget`). A `Session` runs configs of one target:
the first call (which compiles) is checked against the reference, then the config is timed, and the last
timed output is checked again. Sessions run inside a worker process (isolated measurement) or in the
caller's process (in-process mode); the code is the same.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._gate import ArrayOps, classify_exception, compare, describe_exception, is_torch, nonfinite_message
from ._result import INCORRECT, MeasureResult, summarize
from ._timing import TimingOptions, jax_sync, no_sync, time_wall

log = logging.getLogger(__name__)

__all__ = ["Target", "KernelTarget", "CallableTarget", "Session"]


class Target(ABC):
    """One tuning task's callable, inputs and reference. Must be picklable for process isolation
    (functions defined at module level)."""

    #: "wall" (perf_counter), "jax" (perf_counter + block_until_ready) or "cuda" (device events)
    timer: str = "wall"
    #: MeasureResult.backend
    label: str = "cpu"

    def env(self) -> dict[str, str]:
        """Environment a worker sets before importing anything of the target's."""
        return {}

    @abstractmethod
    def prepare(self) -> None:
        """Build the inputs (and snapshots of those to restore/verify)."""

    @abstractmethod
    def compute_reference(self) -> Any:
        """The expected output for the pristine inputs (None: only NaN/inf are checked)."""

    @abstractmethod
    def call(self, config: Mapping[str, Any]) -> Any:
        """One run of `config`; returns the output."""

    @abstractmethod
    def before_run(self) -> None:
        """Restore the inputs the kernel mutates, poison the output buffer."""

    @abstractmethod
    def check_inputs(self) -> str | None:
        """After a run: a message if an input that must not change was changed (then restored)."""

    def tolerance(self) -> tuple[float, float]:
        return (1e-5, 1e-5)

    def error_bound(self) -> Any:
        """An elementwise allowance added to atol (the rounding of long fp32 reductions), or None."""
        return None

    def describe(self) -> str:
        return type(self).__name__

    def recording_resources(self) -> contextlib.AbstractContextManager[list[Any] | None]:
        """Around a config's first call: yields a list that fills with the compiled kernels'
        resources (`KernelResources`), or None where the backend reports none."""
        return contextlib.nullcontext(None)


def _device_label(device_kind: str) -> str:
    return {"cpu": "cpu-interpreter", "cuda": "cuda", "gpu": "cuda", "tpu": "tpu"}.get(
        device_kind, device_kind
    )


def _fast_restore(x: Any, pristine: Any) -> Callable[[], Any] | None:
    if isinstance(x, np.ndarray) and isinstance(pristine, np.ndarray):
        return functools.partial(np.copyto, x, pristine)
    if is_torch(x) and pristine is not None:
        return functools.partial(x.copy_, pristine)
    return None


def _fast_poison(x: Any) -> Callable[[], Any] | None:
    if isinstance(x, np.ndarray) and x.dtype.kind in "fc":
        return functools.partial(x.fill, np.nan)
    if is_torch(x) and x.dtype.is_floating_point:
        return functools.partial(x.fill_, float("nan"))
    return None


class _Holder:
    """Inputs with snapshots: restores the mutated ones, poisons the output, verifies the others."""

    def __init__(self, values: dict[Any, Any], mutated: Sequence[Any], output: Any | None) -> None:
        self.values = values
        self.mutated = [m for m in mutated if m in values]
        missing = [m for m in mutated if m not in values]
        if missing:
            raise ValueError(f"declared mutated inputs {missing} are not among the inputs {list(values)}")
        if output is not None and output not in values:
            raise ValueError(f"output buffer {output!r} is not among the inputs {list(values)}")
        self.output = output
        self.pristine = {k: ArrayOps.snapshot(values[k]) for k in self.mutated}
        self.guarded = {
            k: ArrayOps.snapshot(v) for k, v in values.items() if k not in self.pristine and k != output
        }

        # Bound in-place operations for numpy arrays and torch tensors (the hot path: before every run).
        self._fast: list[tuple[Any, Any, Callable[[], Any] | None, str]] = []
        for k in self.mutated:
            self._fast.append((k, values[k], _fast_restore(values[k], self.pristine[k]), "restore"))
        if output is not None:
            self._fast.append((output, values[output], _fast_poison(values[output]), "poison"))

    def before_run(self) -> None:
        values = self.values
        for k, obj, fn, what in self._fast:
            if fn is not None and values[k] is obj:
                fn()
            elif what == "restore":
                ArrayOps.restore(values, k, self.pristine[k])
            else:
                ArrayOps.poison(values, k)

    def check(self) -> str | None:
        changed = [k for k, snap in self.guarded.items() if not ArrayOps.unchanged(self.values[k], snap)]
        for k in changed:
            ArrayOps.restore(self.values, k, self.guarded[k])
        if changed:
            return (
                f"the kernel modified input(s) {changed} that it does not declare as mutated; its results "
                f"cannot be trusted (restored them)"
            )
        return None


@dataclass
class KernelTarget(Target):
    """A registered kernel (`KernelSpec`, or its name) on one problem and backend."""

    spec: Any  # KernelSpec | str
    problem: Mapping[str, Any]
    backend: str
    device_kind: str = "cpu"
    seed: int = 0
    reference_fn: Callable[[Mapping[str, Any], dict[str, Any]], Any] | None = None
    _holder: _Holder | None = field(default=None, init=False, repr=False)
    _spec_obj: Any = field(default=None, init=False, repr=False)
    _bound: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in ("triton", "pallas"):
            raise ValueError(f"backend must be 'triton' or 'pallas', got {self.backend!r}")
        self.label = _device_label(self.device_kind)
        if self.backend == "triton":
            self.timer = "cuda" if self.device_kind in ("cuda", "gpu") else "wall"
        else:
            self.timer = "jax"

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_holder"] = None
        d["_spec_obj"] = None
        d["_bound"] = None
        return d

    @property
    def name(self) -> str:
        return self.spec if isinstance(self.spec, str) else self.spec.name

    def describe(self) -> str:
        return f"{self.name}[{self.backend}] {dict(self.problem)} on {self.device_kind}"

    def env(self) -> dict[str, str]:
        if self.device_kind == "cpu":
            return {"TRITON_INTERPRET": "1", "TUNER_PALLAS_INTERPRET": "1", "JAX_PLATFORMS": "cpu"}
        if self.backend == "triton":
            return {"TRITON_INTERPRET": "0"}
        return {}

    def _spec(self) -> Any:
        if self._spec_obj is None:
            if isinstance(self.spec, str):
                from tuner.kernels import get_kernel

                self._spec_obj = get_kernel(self.spec)
            else:
                self._spec_obj = self.spec
        return self._spec_obj

    def prepare(self) -> None:
        spec = self._spec()
        inputs = spec.make_inputs(self.problem, self.backend, self.seed)
        if not isinstance(inputs, dict):
            inputs = dict(inputs)
        # One spec serves both backends: a Pallas launcher returns a new array where the Triton one
        # writes into the buffer, so the buffer is poisoned only where the inputs hold it.
        out = spec.output_buffer if spec.output_buffer in inputs else None
        self._holder = _Holder(inputs, spec.mutated_inputs, out)
        self._bound = None

    @property
    def inputs(self) -> dict[str, Any]:
        assert self._holder is not None, "prepare() first"
        return self._holder.values

    def compute_reference(self) -> Any:
        fn = self.reference_fn or self._spec().reference
        return fn(self.problem, self.inputs)

    def call(self, config: Mapping[str, Any]) -> Any:
        return self._spec().run(self.problem, self.backend, self.inputs, config)

    def before_run(self) -> None:
        assert self._holder is not None
        self._holder.before_run()

    def check_inputs(self) -> str | None:
        assert self._holder is not None
        return self._holder.check()

    def tolerance(self) -> tuple[float, float]:
        rtol, atol = self._spec().tolerance(str(self.problem.get("dtype", "float32")))
        return float(rtol), float(atol)

    def error_bound(self) -> Any:
        fn = getattr(self._spec(), "error_bound", None)
        if fn is None:
            return None
        if self._bound is None:
            self._bound = fn(self.problem, self.inputs)  # from the pristine inputs, once
        return self._bound

    def recording_resources(self) -> contextlib.AbstractContextManager[list[Any] | None]:
        if self.backend == "triton" and self.timer == "cuda":
            from ._compile import record_triton_kernels

            return record_triton_kernels()
        return contextlib.nullcontext(None)


@dataclass
class CallableTarget(Target):
    """A plain Python callable, called as `fn(*args, **kwargs, **config)` and timed on the CPU.

    `reference`: the expected output, or a callable `reference(*args, **kwargs)`, or None (then only
    NaN/inf in a floating output fails). `mutated`: positions (int) or names (str) of arguments the
    function writes, restored before each run; `output_arg`: an argument the function writes its
    result into, poisoned with NaN before each run."""

    fn: Callable[..., Any]
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    reference: Any = None
    rtol: float = 1e-5
    atol: float = 1e-5
    mutated: Sequence[int | str] = ()
    output_arg: int | str | None = None
    label: str = "cpu"
    _holder: _Holder | None = field(default=None, init=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_holder"] = None
        return d

    def describe(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def prepare(self) -> None:
        values: dict[Any, Any] = dict(enumerate(self.args))
        values.update(self.kwargs)
        self._holder = _Holder(values, self.mutated, self.output_arg)

    def _split(self) -> tuple[list[Any], dict[str, Any]]:
        assert self._holder is not None, "prepare() first"
        v = self._holder.values
        return [v[i] for i in range(len(self.args))], {k: v[k] for k in self.kwargs}

    def compute_reference(self) -> Any:
        if callable(self.reference):
            args, kwargs = self._split()
            return self.reference(*args, **kwargs)
        return self.reference

    def call(self, config: Mapping[str, Any]) -> Any:
        args, kwargs = self._split()
        return self.fn(*args, **kwargs, **config)

    def before_run(self) -> None:
        assert self._holder is not None
        self._holder.before_run()

    def check_inputs(self) -> str | None:
        assert self._holder is not None
        return self._holder.check()

    def tolerance(self) -> tuple[float, float]:
        return (self.rtol, self.atol)


_UNSET: Any = object()


class _Failed(Exception):
    def __init__(self, result: MeasureResult, fatal: bool = False) -> None:
        self.result = result
        self.fatal = fatal


class Session:
    """Runs configs of one target in this process. Not thread-safe."""

    def __init__(self, target: Target, opts: TimingOptions, reference: Any = _UNSET) -> None:
        self.target = target
        self.opts = opts
        self.reference = reference
        self._cmp_cache: dict[str, Any] = {}
        self._cuda: Any = None
        # registers / spill_bytes / shared_bytes of the last first run, where the backend reports them
        self.resources: dict[str, int] = {}
        self.fatal = False  # the device context is unusable: this process must be replaced
        self.ready = False

    def setup(self) -> Any:
        """Build the inputs and (unless given) the reference; returns the reference."""
        self.target.prepare()
        if self.reference is _UNSET:
            self.reference = self.target.compute_reference()
        if self.target.timer == "cuda":
            from ._cuda import CudaTimer

            self._cuda = CudaTimer(self.opts)
        self.ready = True
        return self.reference

    # ---- pieces ------------------------------------------------------------------------------------
    def _fail(self, exc: BaseException, phase: str) -> _Failed:
        status, fatal = classify_exception(exc, phase)
        if fatal:
            self.fatal = True
        what = "compiling (first call)" if phase == "compile" else "running"
        return _Failed(
            MeasureResult.failed(
                status, self.target.label, f"{what}: {describe_exception(exc)}", extra={"phase": phase}
            ),
            fatal,
        )

    def _sync(self, out: Any) -> Any:
        if self.target.timer == "jax":
            return jax_sync(out)
        if self.target.timer == "cuda":
            import torch

            torch.cuda.synchronize()
        return out

    def _verify(self, out: Any, when: str) -> float | None:
        msg = self.target.check_inputs()
        if msg:
            raise _Failed(MeasureResult.failed(INCORRECT, self.target.label, f"{when}: {msg}"))
        if self.reference is None:
            msg = nonfinite_message(out)
            if msg:
                raise _Failed(MeasureResult.failed(INCORRECT, self.target.label, f"{when}: {msg}"))
            return None
        rtol, atol = self.target.tolerance()
        chk = compare(out, self.reference, rtol, atol, self._cmp_cache, self.target.error_bound())
        if not chk.ok:
            raise _Failed(
                MeasureResult.failed(
                    INCORRECT, self.target.label, f"{when}: {chk.message}", max_abs_error=chk.max_abs_error
                )
            )
        return chk.max_abs_error

    def first_run(self, config: Mapping[str, Any]) -> tuple[float, float | None]:
        """Compile (the first call) and check. Returns (compile seconds, max abs error); raises _Failed."""
        t0 = time.perf_counter()
        self.resources = {}
        try:
            self.target.before_run()
            with self.target.recording_resources() as found:
                out = self._sync(self.target.call(config))
        except Exception as exc:
            raise self._fail(exc, "compile") from None
        compile_s = time.perf_counter() - t0
        if found:
            from ._compile import resource_features

            self.resources = resource_features(found)
        return compile_s, self._verify(out, "first run")

    def time_config(
        self, config: Mapping[str, Any], *, n: int | None = None, warmup: int | None = None
    ) -> tuple[list[float], Any, str]:
        tgt = self.target
        try:
            if self._cuda is not None:
                return self._cuda.time(
                    lambda: tgt.call(config),
                    tgt.before_run,
                    n=n,
                    warmup=warmup,
                    graph_key=_config_key(config),
                )
            sync = jax_sync if tgt.timer == "jax" else no_sync
            times, out = time_wall(
                lambda: tgt.call(config), tgt.before_run, sync, self.opts, n=n, warmup=warmup
            )
            return times, out, "wall"
        except _Failed:
            raise
        except Exception as exc:
            raise self._fail(exc, "run") from None

    # ---- the operations a measurer asks for ---------------------------------------------------------
    def measure(
        self, config: Mapping[str, Any], on_compiled: Callable[[float], None] | None = None
    ) -> MeasureResult:
        t0 = time.perf_counter()
        try:
            if not self.ready:
                self.setup()
            compile_s, err1 = self.first_run(config)
            if on_compiled is not None:
                on_compiled(compile_s)
            times, out, timer = self.time_config(config)
            err2 = self._verify(out, "last timed run")
        except _Failed as f:
            return f.result.with_(
                wall_s=time.perf_counter() - t0, extra={**f.result.extra, "fatal": f.fatal or self.fatal}
            )
        errs = [e for e in (err1, err2) if e is not None]
        return summarize(
            times,
            backend=self.target.label,
            compile_s=compile_s,
            max_abs_error=max(errs) if errs else None,
            wall_s=time.perf_counter() - t0,
            extra={"timer": timer, **self.resources},
        )

    def interleave(self, configs: Sequence[Mapping[str, Any]], rounds: int, reps: int) -> list[MeasureResult]:
        """Re-measure `configs` interleaved (A B C A B C ...): each round times `reps` runs of each
        config in turn. Each config is checked against the reference again first."""
        results: list[MeasureResult | None] = [None] * len(configs)
        times: dict[int, list[float]] = {}
        timers: dict[int, str] = {}
        for i, c in enumerate(configs):
            try:
                if not self.ready:
                    self.setup()
                self.first_run(c)
                times[i] = []
            except _Failed as f:
                results[i] = f.result
        for _ in range(rounds):
            for i, c in enumerate(configs):
                if i not in times:
                    continue
                try:
                    t, out, timers[i] = self.time_config(c, n=reps, warmup=1)
                    self._verify(out, "interleaved run")
                    times[i].extend(t)
                except _Failed as f:
                    results[i] = f.result
                    del times[i]
        for i, t in times.items():
            results[i] = summarize(
                t, backend=self.target.label, extra={"timer": timers.get(i, "wall"), "interleaved": True}
            )
        return [
            r if r is not None else MeasureResult.failed("crashed", self.target.label, "not measured")
            for r in results
        ]


def _config_key(config: Mapping[str, Any]) -> str:
    import json

    return json.dumps(dict(config), sort_keys=True, default=str)


def apply_env(env: Mapping[str, str]) -> None:
    for k, v in env.items():
        os.environ[k] = v
