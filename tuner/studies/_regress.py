"""`tuner regress --baseline FILE`: re-measure the configs of a cache file and flag slowdowns.

For every entry recorded on this device, the config is measured `repeats` times. The ratio new / recorded
is estimated by the median of the new times over the recorded time, with a bootstrap confidence interval
(the new times resampled with replacement, `n_boot` times, seeded). The threshold is noise-aware: the
larger of `threshold` (default 5 %) and the recorded relative spread (spread_s / time_s) of that entry.
An entry is a regression when the whole interval lies above 1 + threshold (slower beyond noise), an
improvement when it lies below 1 - threshold, and unchanged otherwise. A config that no longer runs is a
regression too. The measuring function is injected (`measure(entry, repeats) -> list of seconds`), so CI
and tests can run this without a GPU.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner._units import ms_to_s

log = logging.getLogger(__name__)

__all__ = [
    "RegressionCheck",
    "check_entries",
    "read_cache_entries",
    "default_measure",
    "this_device",
    "bootstrap_ratio",
    "validate_entries",
    "entry_task",
    "protocol_repeats",
]

Measure = Callable[[Mapping[str, Any], int], Sequence[float]]

REGRESSED, IMPROVED, UNCHANGED, FAILED, SKIPPED = "regressed", "improved", "unchanged", "failed", "skipped"


@dataclass(frozen=True)
class RegressionCheck:
    kernel: str
    key: dict[str, Any]
    dtypes: list[str]
    config: dict[str, Any]
    recorded_s: float
    median_s: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float
    verdict: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class BaselineError(ValueError):
    """The baseline file cannot be used (one line)."""


def read_cache_entries(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a cache file, validated by the runtime's reader where available."""
    try:
        from tuner.runtime import read_cache_file
    except ImportError:  # the runtime is optional here: the same format is checked below
        pass
    else:
        try:
            return [e.to_json() for e in read_cache_file(path)]
        except ValueError as exc:
            raise BaselineError(str(exc).splitlines()[0]) from None
    p = Path(path)
    try:
        if p.stat().st_size > 256 * 2**20:
            raise BaselineError(f"{p}: over 256 MiB, not a cache file")
        doc = json.loads(p.read_bytes(), parse_constant=_reject)
    except OSError as exc:
        raise BaselineError(f"cannot read {p}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: not a JSON cache file: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != "tuner-cache" or doc.get("schema_version") != 1:
        raise BaselineError(f"{p}: not a tuner cache file of schema version 1")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise BaselineError(f"{p}: entries must be a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise BaselineError(f"{p}: entries[{i}] must be an object")
        for k, typ in (("kernel", str), ("key", dict), ("config", dict), ("device", str), ("dtypes", list)):
            if not isinstance(e.get(k), typ):
                raise BaselineError(f"{p}: entries[{i}].{k} is missing or has the wrong type")
        t = e.get("time_s")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise BaselineError(f"{p}: entries[{i}].time_s must be a positive number, got {t!r}")
    return entries


def _reject(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def bootstrap_ratio(
    times: Sequence[float], recorded: float, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(median(times) / recorded, CI low, CI high) by the percentile bootstrap of the median."""
    x = np.asarray(times, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    meds = np.median(x[idx], axis=1) / recorded
    a = (1.0 - confidence) / 2
    return float(np.median(x) / recorded), float(np.quantile(meds, a)), float(np.quantile(meds, 1 - a))


def this_device() -> str:
    """This machine's device as the runtime's cache keys name it: "<GPU name> (sm<cc>)" or "cpu"."""
    from tuner.search_spaces.devices import device_label

    try:
        return device_label("triton")
    except Exception as exc:  # noqa: BLE001 - no usable CUDA: the CPU it is
        log.debug("device detection: %s", exc)
    return "cpu"


def _backend_of(entry: Mapping[str, Any]) -> str:
    versions = entry.get("versions") or {}
    if "triton" in versions:
        return "triton"
    if "jax" in versions or "jaxlib" in versions:
        return "pallas"
    return str(entry.get("backend", "triton"))


def entry_task(entry: Mapping[str, Any]) -> tuple[Any, dict[str, Any], str]:
    """(kernel spec, problem, backend) of a cache entry, the problem checked against the kernel's problem
    schema; ValueError naming the value otherwise."""
    from tuner.kernels import get_kernel, validate_problem

    spec = get_kernel(str(entry["kernel"]))
    backend = _backend_of(entry)
    if backend not in spec.backends:
        raise ValueError(f"kernel {spec.name!r} has no backend {backend!r}")
    key = dict(entry["key"])
    if entry.get("dtypes"):
        key["dtype"] = entry["dtypes"][0]
    return spec, validate_problem(spec, key), backend


def validate_entries(entries: Sequence[Mapping[str, Any]]) -> None:
    """Before anything runs: every entry's kernel is registered, its key is a valid problem, and its config
    is in the kernel's search space for that problem on this device. ValueError (one line, naming the
    entry) for the first that is not: `tuner regress` never launches a config the space excludes."""
    from tuner.kernels._common import prepare_triton
    from tuner.measure import detect_device

    prepare_triton()
    for i, e in enumerate(entries):
        where = f"entries[{i}] ({e.get('kernel')})"
        try:
            spec, problem, backend = entry_task(e)
            space = spec.space(problem, detect_device(backend), backend)
        except ValueError as exc:
            raise ValueError(f"{where}: {str(exc).splitlines()[0]}") from None
        config = dict(e["config"])
        if not space.contains(config):
            why = "; ".join(space.violations(config))
            raise ValueError(f"{where}: config {config} is not in the kernel's search space: {why}"[:500])


def default_measure(entry: Mapping[str, Any], repeats: int) -> list[float]:
    """Measure the entry's config the way a study measured its winner: the measurement layer's
    `KernelMeasurer`, built as `tuner.tune.tune_kernel` builds it (worker process, default timing
    options for the device: warm-up, L2 flush and CUDA graphs on a GPU, poisoned outputs, checked against
    the reference), then the finalists' interleaved re-measurement (`remeasure`: rounds of
    `interleave_reps` timed runs after a warm-up each), with enough rounds for `repeats` timed runs.
    Returns the times in seconds."""
    import dataclasses

    from tuner.kernels._common import prepare_triton

    prepare_triton()
    from tuner.measure import KernelMeasurer, detect_device

    spec, problem, backend = entry_task(entry)
    m = KernelMeasurer(spec, problem, backend, device=detect_device(backend), seed=0)
    reps = m.timing.interleave_reps
    m.timing = dataclasses.replace(m.timing, interleave_rounds=max(1, math.ceil(repeats / reps)))
    try:
        (res,) = m.remeasure([dict(entry["config"])])
    finally:
        m.close()
    if not res.ok:
        raise RuntimeError(f"{res.status}: {(res.error or '').strip().splitlines()[0] if res.error else ''}")
    return [ms_to_s(t) for t in res.times]


def protocol_repeats() -> int:
    """The timed runs of a study winner's re-measurement (`TimingOptions` rounds x reps): the default."""
    from tuner.measure import TimingOptions

    t = TimingOptions()
    return t.interleave_rounds * t.interleave_reps


def check_entries(
    entries: Sequence[Mapping[str, Any]],
    *,
    measure: Measure | None = None,
    repeats: int = 10,
    threshold: float = 0.05,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    device: str | None = None,
    any_device: bool = False,
    kernels: Sequence[str] | None = None,
) -> list[RegressionCheck]:
    """Re-measure each entry (recorded on `device`, default this machine's) and judge it (module doc)."""
    measure = measure or default_measure
    dev = device if device is not None else (None if any_device else this_device())
    out = []
    for e in entries:
        base: dict[str, Any] = dict(
            kernel=str(e["kernel"]),
            key=dict(e["key"]),
            dtypes=list(e.get("dtypes") or []),
            config=dict(e["config"]),
            recorded_s=float(e["time_s"]),
        )
        rel_spread = float(e.get("spread_s") or 0.0) / float(e["time_s"])
        thr = max(threshold, rel_spread if math.isfinite(rel_spread) else 0.0)
        if kernels and e["kernel"] not in kernels:
            continue
        if dev is not None and not any_device and e.get("device") != dev:
            out.append(
                RegressionCheck(
                    **base,
                    median_s=None,
                    ratio=None,
                    ci_low=None,
                    ci_high=None,
                    threshold=thr,
                    verdict=SKIPPED,
                    note=f"recorded on {e.get('device')!r}, this is {dev!r}",
                )
            )
            continue
        try:
            times = [float(t) for t in measure(e, repeats)]
            if not times or not all(math.isfinite(t) and t > 0 for t in times):
                raise RuntimeError(f"measurement returned {times!r}")
        except Exception as exc:  # noqa: BLE001 - a config that stopped working is a regression
            out.append(
                RegressionCheck(
                    **base,
                    median_s=None,
                    ratio=None,
                    ci_low=None,
                    ci_high=None,
                    threshold=thr,
                    verdict=FAILED,
                    note=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                )
            )
            continue
        ratio, lo, hi = bootstrap_ratio(
            times, float(e["time_s"]), n_boot=n_boot, confidence=confidence, seed=seed
        )
        verdict = REGRESSED if lo > 1 + thr else IMPROVED if hi < 1 - thr else UNCHANGED
        out.append(
            RegressionCheck(
                **base,
                median_s=float(np.median(times)),
                ratio=ratio,
                ci_low=lo,
                ci_high=hi,
                threshold=thr,
                verdict=verdict,
            )
        )
    return out
