"""`tuner study run|report|export STUDY.toml`: offline tuning studies (docs/studies.md)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from tuner._settings import text

from . import check_out_file


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "study",
        help="run, report and export offline tuning studies (TOML study files)",
        description="Offline tuning studies described by a TOML file (see docs/studies.md in tuner's "
        "source repository; its studies/ folder holds example study files, which an installed tuner lacks).",
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
    r.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar and no counts line; the report and cache lines and failures still print",
    )
    r.add_argument("--json", action="store_true", help="print one JSON object (implies --quiet)")
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
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.set_defaults(func=report_cmd, reads_only="tuner study report")

    ex = ssub.add_parser(
        "export",
        help="write the tuned configs as a runtime cache file",
        description="Write the best config of every finished task as a cache file that "
        "tuner.load_cache / tuner cache import read.",
    )
    ex.add_argument("study", help="study file (TOML)")
    ex.add_argument("--out", required=True, metavar="FILE")
    ex.add_argument("--storage", default=None, metavar="URL")
    ex.add_argument("--json", action="store_true", help="print one JSON object")
    ex.set_defaults(func=export_cmd, reads_only="tuner study export")

    from .misses import add_from_misses_parser  # tuner study from-misses (record mode, docs/production.md)

    add_from_misses_parser(ssub)


def _load(args: argparse.Namespace, *, check_kernels: bool = True) -> Any:
    from tuner.studies import load_study

    storage = args.storage or text("TUNER_STUDY_STORAGE") or None
    return load_study(args.study, storage=storage, check_kernels=check_kernels)


def _emit(obj: dict[str, Any]) -> None:
    json.dump(obj, sys.stdout, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _fail(args: argparse.Namespace, what: str, reason: str, extra: dict[str, Any] | None = None) -> int:
    """Work that did not happen: one line on stderr (and the JSON object with "error"), exit 1."""
    if getattr(args, "json", False):
        _emit({**(extra or {}), "ok": False, "error": reason})
    print(f"tuner: {what}: {reason}", file=sys.stderr)
    return 1


def _say(lines: list[tuple[str, Any]]) -> None:
    """Print (line, stream) pairs in order; stream None is stdout."""
    for line, stream in lines:
        print(line, file=stream)


def _require_database(spec: Any) -> None:
    """A study that never ran has no store yet (no SQLite file, an empty PostgreSQL database): say so
    instead of creating one."""
    from tuner.storage import no_store_at
    from tuner.studies._export import NothingToDo

    path = no_store_at(str(spec.storage))
    if path is not None:
        raise NothingToDo(
            f"study {spec.name} has no database at {path}: it never ran (run `tuner study run` first)"
        )


def _shown_url(url: str) -> str:
    """A storage URL to print: its password, also one given as a query parameter, hidden."""
    from sqlalchemy.engine import make_url

    from tuner.storage import mask_password, mask_query_secrets

    try:
        return mask_query_secrets(make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: print it as given, password masked
        return mask_password(url)


def run_cmd(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.studies import resolve_executor, run_study
    from tuner.studies._export import ExportRefused, NothingToDo

    if args.workers < 1:
        raise BadInput(f"--workers must be >= 1, got {args.workers}")
    if args.lease_seconds is not None and not (1 <= args.lease_seconds <= 86400):
        raise BadInput(f"--lease-seconds must be in [1, 86400], got {args.lease_seconds}")
    if args.executor:
        resolve_executor(args.executor)  # fail early, exit 2
    quiet = args.quiet or args.json
    spec = _load(args, check_kernels=args.executor is None)
    summary = run_study(
        spec,
        workers=args.workers,
        executor=args.executor,
        progress=not quiet,
        lease_s=args.lease_seconds,
        retry_failed=args.retry_failed,
    )
    c = summary.counts
    out: dict[str, Any] = {
        "study": spec.name,
        "counts": {k: c.get(k, 0) for k in ("done", "failed", "pending", "running")},
        "complete": summary.complete,
        "failed": [{"task": k, "error": (e.splitlines()[0] if e else "")} for k, e in summary.failed],
        "report": None,
        "cache": None,
    }
    # stdout's lines are printed after the work: a reader that goes away early (`| head -1`) must not
    # stop the run before it wrote the report and the cache file
    said: list[tuple[str, Any]] = []  # (line, stream) in the order they are printed
    if not quiet:
        said.append(
            (
                f"study {spec.name}: {c['done']} done, {c['failed']} failed, {c['pending']} pending, "
                f"{c['running']} running elsewhere",
                None,
            )
        )
    if summary.failed:
        # a failed task stays failed on the next run (resuming does not retry it): say how to retry
        retry = f"tuner study run {shlex.quote(args.study)} --retry-failed"
        extra = "" if args.storage is None else f" --storage {shlex.quote(_shown_url(args.storage))}"
        out["retry"] = retry + extra
    if not args.json:
        for key, err in summary.failed:
            said.append((f"  failed: {key}: {err.splitlines()[0] if err else ''}", sys.stderr))
        if summary.failed:
            said.append((f"  once their cause is fixed, run them again: {out['retry']}", sys.stderr))
    try:  # the lines said so far are printed also when writing the report fails
        if summary.complete and not args.no_report and (c["done"] or c["failed"]):
            from tuner.studies import export_study, write_report

            rep = write_report(spec, spec.output_dir / "report")  # failures are worth a report too
            out["report"] = {"markdown": str(rep.markdown), "html": str(rep.html)}
            if not args.json:
                said += [(f"report: {rep.markdown}", None), (f"report (HTML): {rep.html}", None)]
            try:
                cache = export_study(spec, spec.output_dir / "cache.json")
            except (NothingToDo, ExportRefused) as exc:
                _say(said)
                said.clear()
                return _fail(args, "study run", str(exc), out)
            out["cache"] = {"path": str(cache.path), "entries": cache.entries}
            if not args.json:
                said.append((f"cache: {cache.path} ({cache.entries} entries; {cache.format})", None))
    finally:
        _say(said)
    if summary.complete and not c["done"]:
        return _fail(
            args,
            "study run",
            f"study {spec.name}: no task succeeded ({c['failed']} failed): nothing to export",
            out,
        )
    elif not summary.complete and not quiet:
        print("tasks are still running on other workers; `tuner study report` when they are done")
    out["ok"] = not summary.failed
    if summary.failed:
        out["error"] = f"study {spec.name}: {c['failed']} of {sum(c.values())} tasks failed"
    if args.json:
        _emit(out)
    if summary.failed:
        print(f"tuner: study run: {out['error']}", file=sys.stderr)
    return 1 if summary.failed else 0


def report_cmd(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.studies import write_report
    from tuner.studies._export import NothingToDo, OutputNotWritable

    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise BadInput(f"--out {args.out} is a file; give the report's folder")
    spec = _load(args, check_kernels=False)
    try:
        _require_database(spec)
        rep = write_report(spec, args.out or spec.output_dir / "report")
    except (NothingToDo, OutputNotWritable) as exc:
        return _fail(args, "study report", str(exc), {"study": spec.name})
    if args.json:
        _emit(
            {
                "ok": True,
                "study": spec.name,
                "markdown": str(rep.markdown),
                "html": str(rep.html),
                "images": [str(p) for p in rep.images],
            }
        )
    else:
        print(f"report: {rep.markdown}")
        print(f"report (HTML): {rep.html}")
    return 0


def export_cmd(args: argparse.Namespace) -> int:
    from tuner.studies import export_study
    from tuner.studies._export import ExportRefused, NothingToDo

    check_out_file(args.out, "cache file")
    spec = _load(args, check_kernels=False)
    try:
        _require_database(spec)
        res = export_study(spec, args.out)
    except (NothingToDo, ExportRefused) as exc:
        return _fail(args, "study export", str(exc), {"study": spec.name})
    if args.json:
        _emit({"ok": True, "study": spec.name, "path": str(res.path), "entries": res.entries})
    else:
        print(f"cache: {res.path} ({res.entries} entries; {res.format})")
    return 0
