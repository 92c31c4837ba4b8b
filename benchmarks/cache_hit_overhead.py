"""Cache-hit overhead of @tuner.autotune, beside its baselines, in one run.

Prints the per-call time (median of many timeit repeats, the rows interleaved so drift hits them alike) of:
  1. a no-op function called directly (the undecorated call, with the config passed as a keyword);
  2. a bare dictionary-lookup wrapper (key tuple from one argument, dict lookup, call with **config);
  3. the same no-op under @tuner.autotune, cache pre-populated (the hit path), with dtypes in the key
     (the default) and with dtypes=False;
  each with a None first argument and with a real torch tensor (whose dtype the key reads);
and, where it can be measured on CPU, triton.autotune's Autotuner on a pre-populated cache:
  4. Autotuner dispatch around a JIT-function stand-in whose `.run` is a no-op (Autotuner.run's own
     per-call work: key building, cache lookup, config kwargs merging), vs that stand-in launched
     directly, and tuner.autotune(configs=[triton.Config...]) around the same stand-in, with the grid
     indexed once, indexed on every launch (`kernel[grid](...)` as user code writes it), and a grid
     function made afresh on every launch (`kernel[lambda meta: ...](...)` inside a launcher);
  5. a real trivial @triton.jit kernel under the interpreter, direct vs Autotuner vs tuner.autotune
     (the interpreter's own run time, ~ms, buries the overhead; printed for completeness).

Before/after in one run: `--before DIR` names another checkout of tuner (e.g. the commit before a change,
`git archive <rev> | tar -x -C DIR`); the script then measures rows 1-4 in child processes, alternating
the two trees for `--rounds` rounds, and prints each row's median for both trees and their ratio.

`--stat min` reports the fastest sample of each row instead of the median: on a loaded machine the median
of a nanosecond-scale row moves with the load, the minimum much less.

Run: TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/cache_hit_overhead.py [--repeats R] [--number N]
     TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/cache_hit_overhead.py --before DIR [--rounds K]
         [--stat min]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TUNER_HOME", tempfile.mkdtemp(prefix="tuner-bench-"))


def per_call_ns(fn, number: int, repeats: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e9


STAT = statistics.median  # --stat min: the fastest sample, which a loaded machine disturbs least


STATS = {"median": statistics.median, "min": min}


def interleaved(rows: dict, number: int, repeats: int) -> dict[str, float]:
    """Per-call ns of each row's callable (STAT over `repeats` samples), the rows measured in turn."""
    got: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(repeats):
        for k, f in rows.items():
            got[k].append(per_call_ns(f, number, 1))
    return {k: STAT(v) for k, v in got.items()}


def python_rows(number: int, repeats: int) -> dict[str, float]:
    import torch

    import tuner
    from tuner import PowerOfTwo, SearchSpace

    space = SearchSpace([PowerOfTwo("block", 16, 256)])

    def noop(x, n, *, block):
        return None

    cfg_by_key = {(1024,): {"block": 64}}

    def bare(*args, **kwargs):  # the baseline wrapper: key from one argument, one dict lookup
        return noop(*args, **kwargs, **cfg_by_key[(args[1],)])

    def fake_bench(call):
        return 1.0

    deco = tuner.autotune(space, key=["n"], budget=3, storage=False, bench=fake_bench)(noop)
    nodt = tuner.autotune(space, key=["n"], budget=3, storage=False, bench=fake_bench, dtypes=False)(noop)
    t = torch.zeros(16)
    for x in (None, t):
        deco(x, 1024)  # the first call per key tunes (3 evaluations); every timed call below is a hit
        nodt(x, 1024)
    tuned = deco.tuner.stats["tuned"]
    rows = {
        "undecorated": lambda: noop(None, 1024, block=64),
        "bare dict wrapper": lambda: bare(None, 1024),
        "tuner.autotune (hit)": lambda: deco(None, 1024),
        "tuner.autotune dtypes=False (hit)": lambda: nodt(None, 1024),
        "tensor: undecorated": lambda: noop(t, 1024, block=64),
        "tensor: bare dict wrapper": lambda: bare(t, 1024),
        "tensor: tuner.autotune (hit)": lambda: deco(t, 1024),
        "tensor: tuner.autotune dtypes=False (hit)": lambda: nodt(t, 1024),
    }
    med = interleaved(rows, number, repeats)
    assert deco.tuner.stats["tuned"] == tuned, "the hit path re-tuned"
    return med


class NoopJit:
    """Stands in for a JITFunction: Autotuner only needs .fn (to find the Python function), .arg_names
    and .run; .run does nothing, so what is timed is the dispatch around the launch."""

    __module__ = "triton.bench_stub"  # so tuner treats it as a Triton kernel (it has .run/.arg_names)

    def __init__(self, fn):
        self.fn = fn
        self.arg_names = ["x_ptr", "n", "BLOCK"]
        self.src = "noop"

    def run(self, *args, grid, warmup, **kwargs):
        return None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


def triton_rows(number: int, repeats: int) -> dict[str, float]:
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    import tuner

    def _kernel_py(x_ptr, n, BLOCK: tl.constexpr):
        pass

    stub = NoopJit(_kernel_py)
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64, 128)]
    at = Autotuner(stub, stub.arg_names, configs, ["n"], None, None)
    t = torch.zeros(16)
    at.cache[(1024, str(t.dtype))] = configs[2]  # pre-populated: every call is a cache hit
    grid = (1,)
    ours = tuner.autotune(configs=configs, key=["n"], budget=4, storage=False, bench=lambda call: 1.0)(stub)
    ours[grid](t, 1024)
    native = tuner.autotune(
        tuner.SearchSpace([tuner.PowerOfTwo("BLOCK", 16, 128)]),
        key=["n"],
        budget=4,
        storage=False,
        bench=lambda call: 1.0,
    )(stub)  # tuner's own form: a SearchSpace in place of Triton's config list (AutotunedKernel)
    native[grid](t, 1024)
    launch_direct, launch_at, launch_ours, launch_native = stub[grid], at[grid], ours[grid], native[grid]
    rows = {
        "stub[grid](...) direct": lambda: launch_direct(t, 1024, BLOCK=64, num_warps=4, num_stages=3),
        "triton Autotuner (hit)": lambda: launch_at(t, 1024),
        "tuner.autotune (hit)": lambda: launch_ours(t, 1024),
        "native tuner.autotune(space) (hit)": lambda: launch_native(t, 1024),
        "triton Autotuner keyword launch (hit)": lambda: launch_at(t, n=1024),
        "tuner.autotune keyword launch (hit)": lambda: launch_ours(t, n=1024),
        "stub[grid] per launch": lambda: stub[grid](t, 1024, BLOCK=64, num_warps=4, num_stages=3),
        "triton Autotuner [grid] per launch": lambda: at[grid](t, 1024),
        "tuner.autotune [grid] per launch": lambda: ours[grid](t, 1024),
        "native tuner.autotune(space) [grid] per launch": lambda: native[grid](t, 1024),
        "stub[lambda grid] made per launch": lambda: stub[lambda meta: (1,)](
            t, 1024, BLOCK=64, num_warps=4, num_stages=3
        ),
        "triton Autotuner [lambda grid] made per launch": lambda: at[lambda meta: (1,)](t, 1024),
        "tuner.autotune [lambda grid] made per launch": lambda: ours[lambda meta: (1,)](t, 1024),
    }
    return interleaved(rows, number, repeats)


def print_python(med: dict[str, float], number: int, repeats: int) -> None:
    print(f"python {sys.version.split()[0]}, {repeats} repeats x {number} calls, {STAT.__name__} per call:")
    for k, v in med.items():
        print(f"  {k:42s} {v:8.1f} ns")
    for arg in ("", "tensor: "):
        bare_over = med[f"{arg}bare dict wrapper"] - med[f"{arg}undecorated"]
        for k in (f"{arg}tuner.autotune (hit)", f"{arg}tuner.autotune dtypes=False (hit)"):
            over = med[k] - med[f"{arg}undecorated"]
            print(
                f"  {k} overhead: {over:.1f} ns over undecorated (target <= 1000 ns); "
                f"{over / bare_over:.2f}x the bare wrapper's overhead"
            )


def print_triton(med: dict[str, float]) -> None:
    import triton

    print(f"Triton launch path (triton {triton.__version__}; no-op JIT stand-in, tensor argument):")
    for k, v in med.items():
        print(f"  {k:42s} {v:8.1f} ns")
    for suffix, base in (
        ("(hit)", "stub[grid](...) direct"),
        ("[grid] per launch", "stub[grid] per launch"),
        ("[lambda grid] made per launch", "stub[lambda grid] made per launch"),
    ):
        print(
            f"  overhead {suffix}: triton Autotuner "
            f"{med[f'triton Autotuner {suffix}'] - med[base]:.1f} ns, "
            f"tuner.autotune {med[f'tuner.autotune {suffix}'] - med[base]:.1f} ns"
        )


def real_kernel() -> None:
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    import tuner

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64, 128)]
    grid = (1,)
    t = torch.zeros(64)
    real_at = Autotuner(add_one, add_one.arg_names, configs, ["n"], None, None)
    real_at.cache[(64, "torch.float32")] = configs[2]
    real_ours = tuner.autotune(configs=configs, key=["n"], budget=4, storage=False, bench=lambda call: 1.0)(
        add_one
    )
    real_ours[grid](t, 64)
    rn, rr = 200, 15
    rows = {
        "interpreted kernel direct": lambda: add_one[grid](t, 64, BLOCK=64),
        "triton Autotuner (hit)": lambda: real_at[grid](t, 64),
        "tuner.autotune (hit)": lambda: real_ours[grid](t, 64),
    }
    med = interleaved(rows, rn, rr)
    print(
        f"Real trivial kernel under TRITON_INTERPRET=1 ({rr} repeats x {rn} calls; the interpreter dominates):"
    )
    for k, v in med.items():
        print(f"  {k:34s} {v / 1e3:8.1f} us")


def compare(before: Path, a: argparse.Namespace) -> int:
    """Rows 1-4 measured in child processes, the before tree and this one alternately, `a.rounds` times."""
    after = Path(__file__).resolve().parent.parent
    trees = {"before": before.resolve(), "after": after}
    got: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for _ in range(a.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            cmd = [sys.executable, __file__, "--json", "--repeats", str(a.repeats), "--number", str(a.number)]
            cmd += ["--stat", a.stat]
            if a.skip_triton:
                cmd.append("--skip-triton")
            out = subprocess.run(
                cmd, env=env, check=True, capture_output=True, text=True, encoding="utf-8"
            ).stdout
            for k, v in json.loads(out.strip().splitlines()[-1]).items():
                got[name].setdefault(k, []).append(v)
    print(
        f"before: {trees['before']}\nafter:  {trees['after']}\n"
        f"{a.rounds} rounds, the trees alternating; each round {a.repeats} repeats x {a.number} calls; "
        f"{a.stat} over rounds of each round's {a.stat} per call:"
    )
    print(f"  {'row':52s} {'before':>9s} {'after':>9s} {'after/before':>12s}")
    stat = STATS[a.stat]
    for k in got["after"]:
        b = stat(got["before"][k])
        f = stat(got["after"][k])
        print(f"  {k:52s} {b:7.1f}ns {f:7.1f}ns {f / b:12.2f}")
    for name in ("before", "after"):
        m = {k: stat(v) for k, v in got[name].items()}
        for arg in ("py: ", "py: tensor: "):
            over = m[f"{arg}tuner.autotune (hit)"] - m[f"{arg}undecorated"]
            print(f"  {name} {arg}tuner.autotune (hit) overhead over undecorated: {over:.1f} ns")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=51)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--before", type=Path, help="another checkout of tuner to compare with, in one run")
    ap.add_argument("--rounds", type=int, default=6, help="with --before: alternating rounds")
    ap.add_argument("--stat", choices=sorted(STATS), default="median", help="per-call figure of the samples")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode of --before
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.number < 1 or a.rounds < 1:
        ap.error("--repeats, --number and --rounds must be >= 1")
    if a.before is not None and not (a.before / "tuner" / "__init__.py").is_file():
        # the child would import whichever tuner the interpreter finds instead, and compare it with itself
        ap.error(f"--before {a.before}: not a checkout of tuner (no tuner/__init__.py)")
    global STAT
    STAT = STATS[a.stat]
    if a.before is not None:
        return compare(a.before, a)

    py = python_rows(a.number, a.repeats)
    tr: dict[str, float] = {}
    if not a.skip_triton:
        try:
            tr = triton_rows(a.number, a.repeats)
        except ImportError as exc:
            print(f"triton.autotune: not measured ({exc})")
    if a.json:
        rows = {f"py: {k}": v for k, v in py.items()} | {f"triton: {k}": v for k, v in tr.items()}
        print(json.dumps(rows))
        return 0
    print_python(py, a.number, a.repeats)
    if tr:
        print_triton(tr)
        real_kernel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
