"""`tuner check KERNEL`: run random valid configs of a kernel's space against its reference.

`tuner check KERNEL --compile-only --device sm80|sm86|sm89|sm90|sm100|sm120 [--configs N | --all]`
compiles configs of the space for that GPU with Triton's compiler instead (no GPU needed) and prints, per
config, compiled or the compiler's error, and registers, spill bytes and shared memory.

Exit 0 when every config matches (compiles), 1 when any does not (or fails to run), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check random valid configs of a kernel against its reference",
        description="Run N random valid configs of KERNEL's search space against its reference "
        "on this machine (the Triton interpreter / Pallas interpret mode on CPU), with outputs "
        "poisoned with NaN before each run. Exit 1 if any config is wrong.",
    )
    p.add_argument("kernel", help="kernel name (see `tuner kernels`)")
    p.add_argument(
        "--backend",
        choices=("triton", "pallas"),
        default=None,
        help="backend to check (default: every backend of the kernel)",
    )
    p.add_argument("--configs", type=int, default=8, help="number of random valid configs (default: 8)")
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="compile the configs for --device (sm80, sm86, sm89, sm90, sm100 or sm120) with Triton's compiler, no GPU needed; "
        "print registers, spills and shared memory per config; exit 1 if one the space accepts fails",
    )
    p.add_argument("--all", action="store_true", help="with --compile-only: every config of the space")
    p.add_argument(
        "--jobs", type=int, default=None, help="with --compile-only: compile processes (default: the cores)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the configs and of the inputs (default: 0)")
    p.add_argument(
        "--shape",
        nargs="+",
        action="append",
        default=[],
        metavar="K=V",
        help="problem fields, e.g. --shape M=50 N=40 K=70 (also flags: activation=relu bias=false; "
        "lists: group_sizes=10,0,80)",
    )
    p.add_argument("--dtype", default=None, help="input dtype (float32, float16, bfloat16)")
    p.add_argument(
        "--device",
        default=None,
        metavar="ARCH",
        help="device whose search space to draw from (sm80, sm90, tpu_v5e, cpu, ...; default: "
        "the hardware here)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per backend")
    p.set_defaults(func=run)


def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if "," in text:
        return [parse_value(t) for t in text.split(",") if t]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_shape(items: list[str], known: set[str]) -> dict[str, Any]:
    from tuner.errors import BadInput

    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key or not val:
            raise BadInput(f"--shape expects K=V, got {item!r}")
        if key not in known:
            raise BadInput(f"unknown problem field {key!r}; known: {', '.join(sorted(known))}")
        out[key] = parse_value(val)
    return out


def run(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.kernels._common import prepare_triton
    from tuner.search_spaces import DEVICES, get_device

    if args.configs < 1:
        raise BadInput(f"--configs must be >= 1, got {args.configs}")
    if args.device is not None and args.device not in DEVICES:
        raise BadInput(f"unknown device {args.device!r}; choose one of {', '.join(sorted(DEVICES))}")
    if args.compile_only:
        return _compile_only(args)
    if args.all or args.jobs is not None:
        raise BadInput("--all and --jobs go with --compile-only")
    prepare_triton()  # before any kernel module defines a @triton.jit
    from tuner.kernels import get_kernel
    from tuner.search_spaces.devices import detect_device

    try:
        spec = get_kernel(args.kernel)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if args.backend is not None and args.backend not in spec.backends:
        raise BadInput(
            f"kernel {spec.name!r} has no backend {args.backend!r}; it has {', '.join(spec.backends)}"
        )
    problem = _problem(spec, args)
    device = get_device(args.device) if args.device else None
    backends = [args.backend] if args.backend else list(spec.backends)
    # Bad problems and devices the backend cannot target are bad input: find out before running anything.
    for backend in backends:
        try:
            # an empty space (rows too long for any block in VMEM) says which constraints reject it
            spec.space(problem, device or detect_device(backend), backend).check_not_empty()
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{spec.name}/{backend}: {exc}") from None

    all_ok = True
    for backend in backends:
        report = _check_one(spec, backend, problem, device, args)
        all_ok &= report.ok
        if args.json:
            json.dump(report.to_dict(), sys.stdout, default=str)
            sys.stdout.write("\n")
        else:
            _print(report)
    return 0 if all_ok else 1


def _problem(spec: Any, args: argparse.Namespace) -> dict[str, Any]:
    from tuner.errors import BadInput

    known = (
        set(spec.default_problem)
        | set(spec.shape_fields)
        | set(spec.extra.get("flags") or {})  # flash_attention's sm_scale
        | set(spec.extra.get("optional_fields") or {})  # moe_gemm's group_sizes
    )
    problem = dict(spec.default_problem)
    problem.update(parse_shape([s for group in args.shape for s in group], known))
    if args.dtype is not None:
        if args.dtype not in spec.dtypes:
            raise BadInput(
                f"kernel {spec.name!r} supports dtypes {', '.join(spec.dtypes)}, not {args.dtype!r}"
            )
        problem["dtype"] = args.dtype
    from tuner.kernels import validate_problem

    try:  # the schema study files and regress obey: ranges (rmsnorm's eps, MAX_DIM), types, head dims
        return validate_problem(spec, problem)
    except ValueError as exc:
        raise BadInput(f"{spec.name}: {str(exc).splitlines()[0]}") from None


def _compile_only(args: argparse.Namespace) -> int:
    """Compile configs for a GPU target in compile processes of their own (this process may have the
    Triton interpreter on; they never do)."""
    from tuner.errors import BadInput
    from tuner.kernels import get_kernel
    from tuner.kernels._check import draw_configs
    from tuner.measure._compile import ARCHS, CompilePool
    from tuner.search_spaces import get_device

    if args.device not in ARCHS:
        raise BadInput(f"--compile-only needs --device one of {', '.join(ARCHS)}, got {args.device!r}")
    if args.backend not in (None, "triton"):
        raise BadInput(
            f"--compile-only compiles Triton kernels; --backend {args.backend!r} cannot be compiled"
        )
    if args.jobs is not None and args.jobs < 1:
        raise BadInput(f"--jobs must be >= 1, got {args.jobs}")
    try:
        spec = get_kernel(args.kernel)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if "triton" not in spec.backends:
        raise BadInput(f"kernel {spec.name!r} has no Triton backend; it has {', '.join(spec.backends)}")
    problem = _problem(spec, args)
    try:
        space = spec.space(problem, get_device(args.device), "triton")
        configs = space.enumerate() if args.all else draw_configs(space, args.configs, args.seed)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{spec.name}/triton on {args.device}: {exc}") from None
    from rich.console import Console
    from rich.progress import Progress

    with (
        Progress(
            console=Console(stderr=True), transient=True, disable=args.json or not sys.stderr.isatty()
        ) as bar,
        CompilePool(jobs=args.jobs) as pool,
    ):
        task = bar.add_task(f"compiling {spec.name} for {args.device}", total=len(configs))
        results = pool.compile(
            spec.name, problem, configs, args.device, progress=lambda i, r: bar.advance(task)
        )
    ok = all(r.ok for r in results)
    if args.json:
        doc = {
            "kernel": spec.name,
            "backend": "triton",
            "device": args.device,
            "problem": problem,
            "space_size": len(space) if space.is_enumerable else -1,
            "ok": ok,
            "rows": [r.to_dict() for r in results],
        }
        json.dump(doc, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        _print_compiled(spec.name, args.device, problem, results)
    return 0 if ok else 1


def _print_compiled(kernel: str, arch: str, problem: dict[str, Any], results: list[Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    shape = " ".join(f"{k}={v}" for k, v in problem.items())
    table = Table(title=f"{kernel}/triton compiled for {arch}: {shape}")
    for col in ("#", "config", "status", "registers", "spill B", "shared B", "s"):
        table.add_column(col)
    for i, r in enumerate(results):
        f = r.features()
        cfg = " ".join(f"{k}={v}" for k, v in r.config.items())
        status = (
            "compiled"
            if r.ok
            else f"{r.status}: {(r.error or '').strip().splitlines()[0][:200] if r.error else ''}"
        )
        table.add_row(
            str(i),
            cfg,
            escape(status),
            str(f.get("registers", "-")),
            str(f.get("spill_bytes", "-")),
            str(f.get("shared_bytes", "-")),
            f"{r.compile_s:.1f}",
        )
    console = Console(width=max(Console().width, 160))
    console.print(table)
    n_ok = sum(r.ok for r in results)
    console.print(f"{kernel}/triton on {arch}: {n_ok}/{len(results)} configs compiled")


def _check_one(
    spec: Any, backend: str, problem: dict[str, Any], device: Any, args: argparse.Namespace
) -> Any:
    from rich.console import Console
    from rich.progress import Progress

    from tuner.kernels._check import check_kernel

    with Progress(
        console=Console(stderr=True), transient=True, disable=args.json or not sys.stderr.isatty()
    ) as bar:
        task = bar.add_task(f"{spec.name}/{backend}", total=args.configs)
        return check_kernel(
            spec,
            backend=backend,
            problem=problem,
            device=device,
            configs=args.configs,
            seed=args.seed,
            progress=lambda i, row: bar.advance(task),
        )


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3g}"


def _print(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from tuner.search_spaces.devices import split_interpreter_fault_note

    shape = " ".join(f"{k}={v}" for k, v in report.problem.items())
    size = report.space_size if report.space_size >= 0 else "?"
    table = Table(
        title=f"{report.kernel}/{report.backend} on {report.device}: {shape} "
        f"(space {size} configs; rtol={report.rtol:g} atol={report.atol:g})"
    )
    for col in ("#", "config", "max abs err", "max rel err", "ok"):
        table.add_column(col)
    notes: dict[str, None] = {}  # a note that explains several rows' errors, printed once below the table
    for i, r in enumerate(report.rows):
        cfg = " ".join(f"{k}={v}" for k, v in r.config.items())
        error, note = split_interpreter_fault_note(r.error or "")
        if note:
            notes[note] = None
        status = "ok" if r.ok else (f"FAIL {error}" if error else f"FAIL ({r.bad_elements} bad)")
        table.add_row(str(i), cfg, _fmt(r.max_abs_err), _fmt(r.max_rel_err), status)
    console = Console(width=max(Console().width, 140))
    console.print(table)
    n_ok = sum(r.ok for r in report.rows)
    console.print(f"{report.kernel}/{report.backend}: {n_ok}/{len(report.rows)} configs match the reference")
    for note in notes:
        console.print(note)
