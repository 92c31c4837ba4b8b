"""Measurers: turn a config into a `MeasureResult`.

- `TargetMeasurer(target, isolation=...)`: a `Target` measured in worker processes ("process", the
  default) or in this process ("inprocess": fast, for trusted callables and tests; a crash or hang of a
  config then takes the caller down with it).
- `KernelMeasurer(spec, problem, backend, device=...)`: a registered kernel (Triton on CUDA with
  device events; JAX/Pallas with `block_until_ready`; either under its CPU interpreter, labelled
  "cpu-interpreter").
- `CallableMeasurer(fn, ...)`: a plain Python callable timed on the CPU (the @autotune decorator).
- `ReplayMeasurer(table)`: the recorded times of a Kernel Tuner cache file.
"""

from __future__ import annotations

import logging
import os
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ._mainguard import check_main_guard
from ._result import COMPILE_ERROR, OK, MeasureResult
from ._select import config_order_key
from ._target import CallableTarget, KernelTarget, Session, Target, _Failed
from ._timing import CPU_TIMING, TimingOptions
from ._worker import Worker, WorkerSettings, WorkerSetupError, default_start_method

if TYPE_CHECKING:  # pragma: no cover
    from tuner.search_spaces import Device

    from ..replay import ReplayTable

log = logging.getLogger(__name__)

__all__ = ["Measurer", "TargetMeasurer", "KernelMeasurer", "CallableMeasurer", "ReplayMeasurer", "ISOLATIONS"]

ISOLATIONS = ("process", "inprocess")


class Measurer(ABC):
    """The interface the tuner uses. `measure` never raises for a bad config: it returns a result
    with a failure status."""

    label: str = "cpu"

    @abstractmethod
    def measure(self, config: Mapping[str, Any]) -> MeasureResult: ...

    def remeasure(self, configs: Sequence[Mapping[str, Any]]) -> list[MeasureResult]:
        """Re-measure `configs` interleaved (A B C A B C ...) for the final choice."""
        return [self.measure(c) for c in configs]

    def precompile(
        self, configs: Sequence[Mapping[str, Any]], jobs: int | None = None
    ) -> dict[str, MeasureResult]:
        """Compile (and check) `configs` ahead of measurement, in parallel where the backend gains from
        it. Returns the failures by `config_order_key`; `measure` then returns those without rerunning."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop worker processes."""

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TargetMeasurer(Measurer):
    """Measures configs of one `Target`, isolated in worker processes or in-process."""

    def __init__(
        self,
        target: Target,
        *,
        isolation: str = "process",
        timing: TimingOptions | None = None,
        settings: WorkerSettings | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        self.target = target
        self.isolation = isolation
        self.timing = timing or (CPU_TIMING if target.timer == "wall" else TimingOptions())
        self.settings = settings or WorkerSettings()
        self.label = target.label
        self._session: Session | None = None
        self._worker: Worker | None = None
        self._known_failures: dict[str, MeasureResult] = {}
        if isolation == "inprocess":
            _warn_env_mismatch(target)
        else:  # workers re-import the main script: refuse an unguarded one before any process starts
            check_main_guard(self.settings.start_method or default_start_method())

    # ---- plumbing ----------------------------------------------------------------------------------
    def _local(self) -> Session:
        if self._session is None:
            s = Session(self.target, self.timing)
            s.setup()
            self._session = s
        return self._session

    def _remote(self) -> Worker:
        if self._worker is None:
            self._worker = Worker(self.target, self.timing, self.settings, name="measure")
            # a measurer dropped without close() still stops its worker
            weakref.finalize(self, self._worker.close)
        self._worker.ensure()
        return self._worker

    @property
    def worker_starts(self) -> int:
        """How many worker processes were started (1 + the replacements after crashes/timeouts)."""
        return self._worker.starts if self._worker is not None else 0

    # ---- the interface -----------------------------------------------------------------------------
    def measure(self, config: Mapping[str, Any]) -> MeasureResult:
        known = self._known_failures.get(config_order_key(config))
        if known is not None:
            return known
        if self.isolation == "inprocess":
            return self._local().measure(config)
        return self._remote().measure(config)

    def remeasure(self, configs: Sequence[Mapping[str, Any]]) -> list[MeasureResult]:
        rounds, reps = self.timing.interleave_rounds, self.timing.interleave_reps
        if not configs:
            return []
        if self.isolation == "inprocess":
            return self._local().interleave(configs, rounds, reps)
        out = self._remote().interleave(configs, rounds, reps)
        if out is None:
            log.warning(
                "the worker failed while re-measuring %d finalists together; measuring them one by one",
                len(configs),
            )
            out = [self.measure(c) for c in configs]
        return out

    def precompile(
        self, configs: Sequence[Mapping[str, Any]], jobs: int | None = None
    ) -> dict[str, MeasureResult]:
        """Compile and check `configs` in `jobs` parallel worker processes (default: the CPU count),
        each with its own inputs. For Triton on a GPU this fills Triton's on-disk kernel cache, so the
        measuring worker later loads the binaries instead of compiling. In-process: sequential."""
        configs = [dict(c) for c in configs if config_order_key(c) not in self._known_failures]
        failures: dict[str, MeasureResult] = {}
        if not configs:
            return failures
        if self.isolation == "inprocess":
            s = self._local()
            for c in configs:
                try:
                    s.first_run(c)
                except _Failed as f:
                    failures[config_order_key(c)] = f.result
            self._known_failures.update(failures)
            return failures
        main = self._remote()  # computes the reference once; the pool reuses it
        from ._compile import default_jobs

        jobs = max(1, min(jobs or default_jobs(), len(configs)))
        pool = [Worker(self.target, self.timing, self.settings, name=f"compile{i}") for i in range(jobs)]
        for w in pool:
            w.reference = main.reference
        try:
            chunks = [configs[i::jobs] for i in range(jobs)]

            def run_chunk(w: Worker, chunk: list[dict[str, Any]]) -> list[tuple[str, MeasureResult | None]]:
                out: list[tuple[str, MeasureResult | None]] = []
                for c in chunk:
                    try:
                        out.append((config_order_key(c), w.check(c)))
                    except WorkerSetupError as exc:  # e.g. no device memory for one more process
                        log.warning(
                            "precompile worker %s could not start (%s); %d configs left to the "
                            "measuring worker",
                            w.name,
                            exc,
                            len(chunk) - len(out),
                        )
                        break
                return out

            with ThreadPoolExecutor(max_workers=jobs) as ex:
                for part in ex.map(run_chunk, pool, chunks):
                    for key, res in part:
                        if res is not None:
                            failures[key] = res
        finally:
            for w in pool:
                w.close()
        self._known_failures.update(failures)
        return failures

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self._session = None


def _warn_env_mismatch(target: Target) -> None:
    for k, v in target.env().items():
        if (
            k in ("TRITON_INTERPRET",)
            and os.environ.get(k, "0") not in (v, "")
            and not (v == "0" and os.environ.get(k) is None)
        ):
            log.warning(
                "in-process measurement of %s wants %s=%s but this process has %s=%s (it must be set "
                "before kernels are defined); results may come from the wrong backend",
                target.describe(),
                k,
                v,
                k,
                os.environ.get(k),
            )


def device_kind(device: Device | str | None, backend: str) -> str:
    """ "cuda", "tpu" or "cpu" for a Device, an arch name, or None (detect)."""
    if device is None:
        from tuner.search_spaces.devices import detect_device

        device = detect_device(backend)
    if isinstance(device, str):
        from tuner.search_spaces import get_device

        device = get_device(device)
    return device.kind


class KernelMeasurer(TargetMeasurer):
    """A registered kernel (`KernelSpec` or name) on one problem, backend and device.

    `reference_fn(problem, inputs)` replaces the spec's reference (for a faster one on the device)."""

    def __init__(
        self,
        spec: Any,
        problem: Mapping[str, Any] | None,
        backend: str,
        *,
        device: Device | str | None = None,
        seed: int = 0,
        isolation: str = "process",
        timing: TimingOptions | None = None,
        settings: WorkerSettings | None = None,
        reference_fn: Callable[[Mapping[str, Any], dict[str, Any]], Any] | None = None,
    ) -> None:
        if problem is None:
            if isinstance(spec, str):
                from tuner.kernels import get_kernel

                problem = get_kernel(spec).default_problem
            else:
                problem = spec.default_problem
        kind = device_kind(device, backend)
        self.arch = _arch(device, backend)
        self._resources: dict[str, dict[str, int]] = {}
        self.compile_only: list[Any] = []  # CompileResults of the last compile-only precompile
        target = KernelTarget(
            spec, dict(problem), backend, device_kind=kind, seed=seed, reference_fn=reference_fn
        )
        if settings is None and backend == "triton":
            # The fork server imports torch once; every fresh worker (also after a crash) starts with it.
            settings = WorkerSettings(preload=("torch",))
        super().__init__(target, isolation=isolation, timing=timing, settings=settings)

    def measure(self, config: Mapping[str, Any]) -> MeasureResult:
        res = super().measure(config)
        extra = self._resources.get(config_order_key(config))
        if extra and res.ok and "registers" not in res.extra:
            res = res.with_(extra={**extra, **res.extra})
        return res

    def precompile(
        self, configs: Sequence[Mapping[str, Any]], jobs: int | None = None
    ) -> dict[str, MeasureResult]:
        """Triton on a CUDA device of an arch in `_compile.ARCHS`: compile `configs` ahead of time in a pool of compile
        processes (`jobs`, default: the usable cores) that need no device: Triton's on-disk cache then
        holds every binary, so measuring loads instead of compiling, and the GPU never waits on the
        compiler. Configs the compiler rejects (compile_error, out_of_resources) become known failures;
        the resources of the others (registers, spill_bytes, shared_bytes) join their measurements.
        Other backends and devices: checked in parallel worker processes (`TargetMeasurer.precompile`)."""
        from ._compile import ARCHS, CompilePool

        target = self.target
        assert isinstance(target, KernelTarget)
        if not (
            target.backend == "triton"
            and target.timer == "cuda"
            and self.arch in ARCHS
            and self.isolation == "process"
        ):
            return super().precompile(configs, jobs)
        todo = [dict(c) for c in configs if config_order_key(c) not in self._known_failures]
        if not todo:
            return {}
        with CompilePool(jobs=jobs, timeout_s=self.settings.compile_timeout_s) as pool:
            results = pool.compile(target.name, dict(target.problem), todo, self.arch)
        self.compile_only = results
        failures: dict[str, MeasureResult] = {}
        if results and not any(r.ok for r in results):
            # Nothing compiled: more likely the compile-only path than every config; let measuring tell.
            log.warning(
                "compile-only precompile for %s compiled none of %d configs (first: %s: %s); measuring "
                "them as usual",
                self.arch,
                len(results),
                results[0].status,
                (results[0].error or "")[:300],
            )
            return failures
        for r in results:
            key = config_order_key(r.config)
            if r.ok:
                self._resources[key] = r.features()
            elif r.status in (COMPILE_ERROR, "out_of_resources"):
                failures[key] = MeasureResult.failed(
                    r.status,
                    self.label,
                    f"compiling for {self.arch} (compile-only precompile): {r.error}",
                    extra={"phase": "compile", **r.features()},
                )
            else:  # the compile process itself failed: measuring will compile and tell
                log.warning("precompile of %s: %s: %s", r.config, r.status, (r.error or "")[:300])
        self._known_failures.update(failures)
        return failures


def _arch(device: Device | str | None, backend: str) -> str:
    if device is None:
        from tuner.search_spaces.devices import detect_device

        return detect_device(backend).arch
    return device if isinstance(device, str) else device.arch


class CallableMeasurer(TargetMeasurer):
    """A plain Python callable, called as `fn(*args, **kwargs, **config)`, timed on the CPU.

    See `CallableTarget` for `reference`, `mutated` and `output_arg`. With isolation="process" the
    function and its arguments must be picklable (module-level functions)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        reference: Any = None,
        rtol: float = 1e-5,
        atol: float = 1e-5,
        mutated: Sequence[int | str] = (),
        output_arg: int | str | None = None,
        isolation: str = "process",
        timing: TimingOptions | None = None,
        settings: WorkerSettings | None = None,
    ) -> None:
        target = CallableTarget(
            fn,
            tuple(args),
            dict(kwargs or {}),
            reference=reference,
            rtol=rtol,
            atol=atol,
            mutated=tuple(mutated),
            output_arg=output_arg,
        )
        super().__init__(target, isolation=isolation, timing=timing, settings=settings)


class ReplayMeasurer(Measurer):
    """Recorded costs of a `ReplayTable` (times in milliseconds, as Kernel Tuner records them; for a
    higher-is-better objective such as GFLOP/s, its reciprocal, `ReplayTable.values`). A config that
    the table records as failed gets `compile_error`; one not in the table is a `ValueError` (the
    space and the table disagree)."""

    label = "replay"

    def __init__(self, table: ReplayTable) -> None:
        self.table = table

    def measure(self, config: Mapping[str, Any]) -> MeasureResult:
        try:
            v = self.table.lookup(config)
        except KeyError:
            raise ValueError(
                f"config {dict(config)} is not in the recorded table {self.table.name}"
            ) from None
        if v is None:
            return MeasureResult.failed(
                COMPILE_ERROR, "replay", f"recorded as failed in {self.table.name or 'the table'}"
            )
        return MeasureResult(
            status=OK, backend="replay", median=v, mean=v, min=v, max=v, std=0.0, q1=v, q3=v, n=1, times=(v,)
        )
