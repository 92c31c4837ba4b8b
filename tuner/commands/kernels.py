"""`tuner kernels [--json] [--device ARCH]`: every registered kernel with its backends, parameters and dtypes."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "kernels",
        help="list the kernels with their backends, parameters and dtypes",
        description="List every registered kernel: backends, tunable parameters (with their "
        "domains on --device), supported dtypes and the default problem.",
    )
    p.add_argument(
        "--device",
        default="cpu",
        metavar="ARCH",
        help="device whose parameter domains to show (sm80, sm90, tpu_v5e, cpu, ...; default cpu)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    p.set_defaults(func=run)


def describe_kernels(arch: str) -> list[dict[str, Any]]:
    """One object per kernel: name, description, backends, params (union of the parameter names),
    params_by_backend (name -> values on the device, or an error for a backend the device cannot run),
    dtypes, shape_fields, default_problem."""
    from tuner.kernels import all_kernels
    from tuner.search_spaces import get_device

    device = get_device(arch)
    out: list[dict[str, Any]] = []
    for spec in all_kernels():
        names: list[str] = []
        by_backend: dict[str, Any] = {}
        for backend in spec.backends:
            try:
                space = spec.space(spec.default_problem, device, backend)
                by_backend[backend] = {p.name: list(p.values) for p in space.params}
            except Exception as exc:  # a backend this device cannot run: say so, list the names anyway
                by_backend[backend] = {"error": str(exc)}
                try:
                    space = spec.space(spec.default_problem, get_device("cpu"), backend)
                except Exception:
                    logger.warning(
                        "kernel %s/%s: no space for its default problem", spec.name, backend, exc_info=True
                    )
                    continue
            for p in space.params:
                if p.name not in names:
                    names.append(p.name)
        out.append(
            {
                "name": spec.name,
                "description": spec.description,
                "backends": list(spec.backends),
                "params": names,
                "params_by_backend": by_backend,
                "dtypes": list(spec.dtypes),
                "shape_fields": list(spec.shape_fields),
                "default_problem": dict(spec.default_problem),
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.kernels._common import prepare_triton
    from tuner.search_spaces import DEVICES

    if args.device not in DEVICES:
        raise BadInput(f"unknown device {args.device!r}; choose one of {', '.join(sorted(DEVICES))}")
    prepare_triton()
    rows = describe_kernels(args.device)
    if args.json:
        json.dump(rows, sys.stdout, default=str)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernels (parameter domains on {args.device})")
    for col in ("kernel", "backends", "dtypes", "parameters"):
        table.add_column(col)
    for r in rows:
        params = []
        for backend, ps in r["params_by_backend"].items():
            if "error" in ps:
                params.append(f"{backend}: (not on {args.device})")
            else:
                params.append(f"{backend}: " + ", ".join(f"{k}{v}" for k, v in ps.items()))
        table.add_row(r["name"], ", ".join(r["backends"]), ", ".join(r["dtypes"]), "\n".join(params))
    Console().print(table)
    return 0
