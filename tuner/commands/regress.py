"""`tuner regress --baseline FILE`: re-measure a cache file's configs and flag slowdowns (exit 1)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tuner._units import from_seconds


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "regress",
        help="re-measure the configs of a cache file and flag regressions",
        description="Re-measure every config of a cache file recorded on this device, the way a study "
        "measured its winner, and flag those slower than recorded beyond a noise-aware threshold "
        "(bootstrap interval of the ratio new/recorded over repeats). Entries are checked against "
        "the kernel's problem schema and search space first (exit 2). Exit code 1 when any config "
        "regressed or failed.",
    )
    p.add_argument("--baseline", required=True, metavar="FILE", help="cache file (tuner cache/study export)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs per config (default: as many as a study's re-measurement of its winner, 25)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="minimum relative slowdown that counts (default: 0.05; the entry's recorded spread raises it)",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="bootstrap interval level (default: 0.95)")
    p.add_argument(
        "--kernel", action="append", default=None, metavar="NAME", help="only this kernel; repeatable"
    )
    p.add_argument(
        "--any-device", action="store_true", help="also measure entries recorded on another device"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--measure",
        default=None,
        metavar="MODULE:FUNCTION",
        help="measuring function measure(entry, repeats) -> seconds (plugins, tests)",
    )
    p.add_argument(
        "--factory",
        default=None,
        metavar="MODULE:FUNCTION",
        help="the input factory of your decorated functions (as for `tuner study from-misses --factory`): "
        "their entries are timed with it, the registered kernels' as usual",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _load_measure(ref: str | None) -> Any:
    if ref is None:
        return None
    import importlib

    from tuner.errors import BadInput

    mod, _, attr = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(mod), attr) if mod and attr else None
    except (ImportError, AttributeError) as exc:
        raise BadInput(f"cannot load measure function {ref!r}: {exc}") from None
    if not callable(fn):
        raise BadInput(f"measure must be given as module:function, got {ref!r}")
    return fn


def _registered(kernel: str) -> bool:
    from tuner.kernels import get_kernel

    try:
        get_kernel(kernel)
    except ValueError:
        return False
    return True


def _either(own: Any) -> Any:
    """measure(entry, repeats): the registered kernels' default measurement, `own` for the others."""
    from tuner.studies._regress import default_measure

    def measure(entry: Any, repeats: int) -> Any:
        return default_measure(entry, repeats) if _registered(entry["kernel"]) else own(entry, repeats)

    return measure


def run(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.studies._regress import (
        FAILED,
        REGRESSED,
        SKIPPED,
        BaselineError,
        check_entries,
        protocol_repeats,
        read_cache_entries,
        this_device,
        validate_entries,
    )

    if args.repeats is not None and not (2 <= args.repeats <= 100_000):
        raise BadInput(f"--repeats must be in [2, 100000], got {args.repeats}")
    if not (0 <= args.threshold < 10):
        raise BadInput(f"--threshold must be in [0, 10), got {args.threshold}")
    if not (0.5 <= args.confidence < 1):
        raise BadInput(f"--confidence must be in [0.5, 1), got {args.confidence}")
    measure = _load_measure(args.measure)
    try:
        entries = read_cache_entries(args.baseline)
    except BaselineError as exc:
        raise BadInput(str(exc)) from None
    if not entries:
        raise BadInput(f"{args.baseline} has no entries: nothing to check")
    if args.kernel and not any(e["kernel"] in args.kernel for e in entries):
        raise BadInput(f"no entry of {args.baseline} is of kernel {', '.join(args.kernel)}: nothing to check")
    here = this_device()
    selected = [
        e
        for e in entries
        if (not args.kernel or e["kernel"] in args.kernel) and (args.any_device or e.get("device") == here)
    ]
    if args.factory and measure is not None:
        raise BadInput("give --factory or --measure, not both")
    if measure is None:  # the real kernels: every entry must be a valid problem and a config of the space
        registered = [e for e in selected if _registered(e["kernel"])]
        own = [e for e in selected if not _registered(e["kernel"])]
        try:
            if own and args.factory:
                from tuner.studies._from_misses import factory_measure, validate_factory_entries

                validate_factory_entries(args.factory, own)
                measure = _either(factory_measure(args.factory))
            validate_entries(registered if args.factory else selected)
        except ValueError as exc:
            hint = (
                " (an entry of a decorated function: give --factory MODULE:FUNCTION, docs/production.md of tuner's repository)"
                if own and not args.factory and "unknown kernel" in str(exc)
                else ""
            )
            raise BadInput(f"{args.baseline}: {str(exc).splitlines()[0]}{hint}") from None
    checks = check_entries(
        entries,
        measure=measure,
        repeats=args.repeats if args.repeats is not None else protocol_repeats(),
        threshold=args.threshold,
        confidence=args.confidence,
        seed=args.seed,
        any_device=args.any_device,
        kernels=args.kernel,
    )
    measured = [c for c in checks if c.verdict != SKIPPED]
    if entries and not measured:
        raise BadInput(
            f"no entry of {args.baseline} was recorded on this device "
            f"({checks[0].note if checks else 'none selected'}); use --any-device to measure anyway"
        )
    bad = [c for c in checks if c.verdict in (REGRESSED, FAILED)]
    if args.json:
        print(
            json.dumps(
                {
                    "baseline": str(args.baseline),
                    "checks": [c.to_json() for c in checks],
                    "regressions": len(bad),
                },
                indent=1,
                sort_keys=True,
            )
        )
    else:
        for c in checks:
            key = ",".join(f"{k}={v}" for k, v in sorted(c.key.items()))
            if c.ratio is None or c.median_s is None:
                print(f"{c.verdict:>9}  {c.kernel} [{key}] {'/'.join(c.dtypes)}: {c.note}")
            else:
                now_ms, then_ms = from_seconds(c.median_s, "ms"), from_seconds(c.recorded_s, "ms")
                print(
                    f"{c.verdict:>9}  {c.kernel} [{key}] {'/'.join(c.dtypes)}: {now_ms:.4g} ms vs "
                    f"{then_ms:.4g} ms recorded, ratio {c.ratio:.3f} "
                    f"[{c.ci_low:.3f}, {c.ci_high:.3f}], threshold +{c.threshold:.1%}"
                )
        print(
            f"{len(measured)} measured, {len(bad)} regressed or failed, {len(checks) - len(measured)} skipped"
        )
    return 1 if bad else 0
