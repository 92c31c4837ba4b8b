"""`tuner study run|report|export STUDY.toml`: offline tuning studies (docs/studies.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "study",
        help="run, report and export offline tuning studies (studies/*.toml)",
        description="Offline tuning studies described by a TOML file (see docs/studies.md).",
    )
    ssub = p.add_subparsers(dest="study_command", metavar="ACTION")
    ssub.required = True

    r = ssub.add_parser(
        "run",
        help="tune every task of a study (resumes where it stopped)",
        description="Tune every task of the study. Re-running the same command resumes without "
        "repeating finished trials; more workers (here or on other machines) join by running it "
        "with the same --storage.",
    )
    r.add_argument("study", help="study file (TOML)")
    r.add_argument(
        "--workers", type=int, default=1, help="local worker processes (default: 1, in this process)"
    )
    r.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="study database URL (overrides the file; e.g. postgresql://user@host/db)",
    )
    r.add_argument("--retry-failed", action="store_true", help="put failed tasks back in the queue")
    r.add_argument(
        "--lease-seconds",
        type=float,
        default=None,
        help="how long a claimed task stays reserved without a heartbeat (default: the file's, 60)",
    )
    r.add_argument(
        "--executor",
        default=None,
        metavar="MODULE:FUNCTION",
        help="tune tasks with this function instead of tuner.tune.tune_kernel (plugins, tests)",
    )
    r.add_argument("--no-report", action="store_true", help="do not write the report and cache at the end")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=run_cmd)

    rep = ssub.add_parser(
        "report",
        help="write the Markdown/HTML report of a study",
        description="Write a Markdown and an HTML report (best configs, % of roofline, "
        "convergence plots, parameter importance, failures).",
    )
    rep.add_argument("study", help="study file (TOML)")
    rep.add_argument(
        "--out", default=None, metavar="DIR", help="report folder (default: <study output>/report)"
    )
    rep.add_argument("--storage", default=None, metavar="URL")
    rep.set_defaults(func=report_cmd)

    ex = ssub.add_parser(
        "export",
        help="write the tuned configs as a runtime cache file",
        description="Write the best config of every finished task as a cache file that "
        "tuner.load_cache / tuner cache import read.",
    )
    ex.add_argument("study", help="study file (TOML)")
    ex.add_argument("--out", required=True, metavar="FILE")
    ex.add_argument("--storage", default=None, metavar="URL")
    ex.set_defaults(func=export_cmd)

    from .misses import add_from_misses_parser  # tuner study from-misses (record mode, docs/production.md)

    add_from_misses_parser(ssub)


def _load(args: argparse.Namespace, *, check_kernels: bool = True) -> Any:
    from tuner.studies import load_study

    storage = args.storage or os.environ.get("TUNER_STUDY_STORAGE") or None
    return load_study(args.study, storage=storage, check_kernels=check_kernels)


def run_cmd(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.studies import resolve_executor, run_study

    if args.workers < 1:
        raise BadInput(f"--workers must be >= 1, got {args.workers}")
    if args.lease_seconds is not None and not (1 <= args.lease_seconds <= 86400):
        raise BadInput(f"--lease-seconds must be in [1, 86400], got {args.lease_seconds}")
    if args.executor:
        resolve_executor(args.executor)  # fail early, exit 2
    spec = _load(args, check_kernels=args.executor is None)
    summary = run_study(
        spec,
        workers=args.workers,
        executor=args.executor,
        progress=not args.quiet,
        lease_s=args.lease_seconds,
        retry_failed=args.retry_failed,
    )
    c = summary.counts
    if not args.quiet:
        print(
            f"study {spec.name}: {c['done']} done, {c['failed']} failed, {c['pending']} pending, "
            f"{c['running']} running elsewhere"
        )
    for key, err in summary.failed:
        print(f"  failed: {key}: {err.splitlines()[0] if err else ''}", file=sys.stderr)
    if summary.complete and not args.no_report and c["done"]:
        from tuner.studies import export_study, write_report

        rep = write_report(spec, spec.output_dir / "report")
        cache = export_study(spec, spec.output_dir / "cache.json")
        print(f"report: {rep.markdown}")
        print(f"report (HTML): {rep.html}")
        print(f"cache: {cache.path} ({cache.entries} entries; {cache.format})")
    elif not summary.complete and not args.quiet:
        print("tasks are still running on other workers; `tuner study report` when they are done")
    return 1 if summary.failed else 0


def report_cmd(args: argparse.Namespace) -> int:
    from tuner.studies import write_report

    spec = _load(args, check_kernels=False)
    rep = write_report(spec, args.out or spec.output_dir / "report")
    print(f"report: {rep.markdown}")
    print(f"report (HTML): {rep.html}")
    return 0


def export_cmd(args: argparse.Namespace) -> int:
    from tuner.studies import export_study

    spec = _load(args, check_kernels=False)
    res = export_study(spec, args.out)
    print(f"cache: {res.path} ({res.entries} entries; {res.format})")
    return 0
