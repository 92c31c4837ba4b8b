"""One command that validates tuner on a CUDA GPU, inside a wall-clock limit (default 8 minutes).

    python benchmarks/gpu_validate.py [--out DIR] [--max-minutes 8] [--budget 16] [--attn-budget 10]
    python benchmarks/gpu_validate.py --allow-cpu      # the CPU self-test: tiny problems, interpreters

Prints the versions first (Python, torch, triton, jax, CUDA, driver, GPU). Without a usable CUDA device
it prints one line saying why and exits 1, unless --allow-cpu. Then, each phase within its share of the
time limit (time a phase leaves unused goes to the next ones), writing the JSON report after each:

1. checks: every registered kernel and backend on the device against its reference (the space's
   default config and two random valid ones); a backend the kernel does not support on this device by
   design (its space says so) is reported as skipped, with the reason;
2. graph_probe: a short torch matmul timed eagerly, with CUDA-graph replay, and with the timer's own
   choice ("auto", decided without the L2 flush);
3. matmul: bf16 4096^3 over a sized grid of the kernel's space: compile-only precompile of every config
   in a process pool, tuning with the default strategy and a small budget, the exhaustive sweep of the
   same configs (written as a Kernel Tuner cache file, replayable with `tuner replay`), then the tuned
   config, the sweep's best two and torch.matmul re-measured together, interleaved, in one process
   with one timer;
4. attention: causal flash attention (batch 4, heads 32, seq 4096, head dim 128, bf16) tuned and swept
   the same way, then the tuned config, the sweep's best two and torch SDPA re-measured together,
   interleaved.

Writes `gpu_validate.json` (all figures), `matmul_sweep_<arch>.json` and `flash_attention_sweep_<arch>.json`
into --out, else $OUT, else
./gpu_validate_out. Exit 0 when every phase ran and every check passed or was skipped by design.
"""

from __future__ import annotations

import os

# Before anything imports jax: JAX would otherwise take 75% of the GPU's memory at its first use.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _tables import out_dir, positive_float  # noqa: E402  (benchmarks/ is not a package)

log = logging.getLogger("gpu_validate")

SCHEMA = "tuner.gpu_validate/2"

# The matmul grid that the sweep and the tuner share (values not in the kernel's space are dropped).
MATMUL_GRID: dict[str, list[Any]] = {
    "BLOCK_M": [64, 128, 256],
    "BLOCK_N": [64, 128, 256],
    "BLOCK_K": [32, 64, 128],
    "GROUP_M": [8],
    "SPLIT_K": [1],
    "num_warps": [4, 8],
    "num_stages": [3, 4, 5],
}
ATTENTION_GRID: dict[str, list[Any]] = {
    "BLOCK_M": [64, 128],
    "BLOCK_N": [32, 64, 128],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4],
}
MATMUL_PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bfloat16", "bias": False, "activation": "none"}
ATTENTION_PROBLEM = {"B": 4, "H": 32, "S": 4096, "D": 128, "causal": True, "dtype": "bfloat16"}

# The CPU self-test (--allow-cpu): the same phases on problems the interpreters finish in seconds.
CPU_MATMUL_GRID: dict[str, list[Any]] = {
    "BLOCK_M": [16, 32],
    "BLOCK_N": [16, 32],
    "BLOCK_K": [16],
    "GROUP_M": [1],
    "SPLIT_K": [1],
    "num_warps": [4],
    "num_stages": [2],
}
CPU_ATTENTION_GRID: dict[str, list[Any]] = {
    "BLOCK_M": [16],
    "BLOCK_N": [16, 32],
    "num_warps": [4],
    "num_stages": [2],
}
CPU_MATMUL_PROBLEM = {"M": 64, "N": 64, "K": 64, "dtype": "float32", "bias": False, "activation": "none"}
CPU_ATTENTION_PROBLEM = {"B": 1, "H": 1, "S": 32, "D": 64, "causal": True, "dtype": "float32"}

# Each phase's share of the time limit.
SHARES = {"checks": 0.25, "graph_probe": 0.05, "matmul": 0.42, "attention": 0.28}


# ---- pieces that run anywhere (tested on CPU) -----------------------------------------------------------
def output_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("OUT") or "gpu_validate_out")


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            encoding="utf-8",
        )
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8")
    except OSError:
        return None
    for tok in text.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return None


def versions() -> dict[str, Any]:
    """Python, torch, triton, jax(lib) and its CUDA plugin, CUDA, the driver and the GPU. Never raises;
    a missing piece is None."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "triton", "jax", "jaxlib"):
        out[name] = _dist_version(name)
    plugins = {}
    from importlib import metadata

    for dist in metadata.distributions():
        n = (dist.metadata.get("Name") or "").lower()
        if n.startswith("jax-cuda") or n.startswith("jax_cuda"):
            plugins[n] = dist.version
    out["jax_plugins"] = plugins or None
    out["cuda"] = None
    out["gpu"] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # a broken install still gets its versions printed
        out["torch_error"] = f"{type(exc).__name__}: {exc}"[:200]
    out["driver"] = _driver_version()
    return out


def versions_line(v: Mapping[str, Any]) -> str:
    keys = ("python", "torch", "triton", "jax", "jaxlib", "jax_plugins", "cuda", "driver", "gpu")
    parts = []
    for k in keys:
        val = v.get(k)
        if isinstance(val, dict):
            val = ",".join(f"{a}={b}" for a, b in val.items())
        parts.append(f"{k}={val if val is not None else '-'}")
    return "versions: " + " ".join(parts)


def gpu_status() -> tuple[bool, str]:
    """(usable, reason). Never raises."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False, "TRITON_INTERPRET is set: Triton would run in its CPU interpreter"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return False, f"torch {torch.__version__} sees no CUDA device"
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True, torch.cuda.get_device_name(0)
    except Exception as exc:  # broken driver
        return False, f"CUDA is not usable: {type(exc).__name__}: {exc}".splitlines()[0]


def sized_configs(
    space: Any, limit: int, grid: Mapping[str, Sequence[Any]] | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """At most `limit` valid configs of `space`: the configs of `grid` (a sub-grid of the space's values)
    that the space accepts, else the whole space when it is small enough; a seeded sample of those when
    there are more than `limit`. Deterministic; sorted by the config's canonical key."""
    from tuner.measure import config_order_key

    configs: list[dict[str, Any]] = []
    if grid and set(grid) == set(space.names):
        import itertools

        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            c = dict(zip(names, values, strict=True))
            if space.contains(c):
                configs.append(space.validate(c))
    if not configs:
        if space.is_enumerable and space.cartesian_size <= 200_000:
            configs = space.enumerate()
        else:
            configs = [dict(c) for c in space.sample(seed, n=limit * 4)]
    uniq = {config_order_key(c): c for c in configs}
    keys = sorted(uniq)
    if len(keys) > limit:
        keys = sorted(random.Random(seed).sample(keys, limit))
    return [uniq[k] for k in keys]


def write_json(path: Path, doc: Any) -> None:
    from tuner._atomic import atomic_write

    atomic_write(path, json.dumps(doc, indent=2, default=str), mkdir=True)


def sweep_cache(
    rows: Sequence[tuple[Mapping[str, Any], Any]],
    *,
    device_name: str,
    problem: Mapping[str, Any],
    keys: Sequence[str],
    extra: Mapping[str, Any],
    kernel: str = "matmul",
) -> dict[str, Any]:
    from tuner.kernels import get_kernel

    from tuner.measure import kernel_tuner_cache

    return kernel_tuner_cache(
        rows,
        device_name=device_name,
        kernel_name=f"tuner/{kernel}/triton",
        problem_size=[problem[d] for d in get_kernel(kernel).shape_fields],
        tune_params_keys=keys,
        extra=extra,
    )


def tflops(flops: float | None, ms: float | None) -> float | None:
    if not flops or not ms or not math.isfinite(ms):
        return None
    return flops / (ms * 1e-3) / 1e12


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


class Clock:
    """The total wall-clock limit and each phase's share of what is left."""

    def __init__(self, limit_s: float, shares: Mapping[str, float]) -> None:
        self.t0 = time.perf_counter()
        self.limit_s = limit_s
        self.shares = dict(shares)
        self.deadline = self.t0 + limit_s

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.limit_s - self.elapsed

    def phase_budget(self, name: str, remaining: Sequence[str]) -> float:
        """Seconds for phase `name`: its share of the time left, among the phases still to run."""
        total = sum(self.shares.get(p, 0.0) for p in remaining) or 1.0
        return max(0.0, self.left() * self.shares.get(name, 0.0) / total)


class Phase:
    """A deadline for one phase."""

    def __init__(self, budget_s: float) -> None:
        self.t0 = time.perf_counter()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)


def start_watchdog(clock: Clock, grace_s: float, on_expire: Callable[[], None]) -> threading.Timer:
    """Past the limit plus `grace_s`, whatever hangs: write the report and exit 1."""

    def fire() -> None:
        try:
            on_expire()
        finally:
            os._exit(1)

    t = threading.Timer(max(1.0, clock.limit_s + grace_s), fire)
    t.daemon = True
    t.start()
    return t


def interleaved(
    contestants: Sequence[tuple[str, Callable[[], Any]]], timing: Any, gpu: bool
) -> dict[str, Any]:
    """One protocol for every comparison: all contestants (tuned configs and the library baseline)
    timed in this process with one timer, in rounds (A B C A B C ...), `timing.interleave_reps` runs
    each per round; a MeasureResult (or the error) per name."""
    from tuner.measure import MeasureResult, summarize
    from tuner.measure._timing import no_sync, time_wall

    rounds, reps = timing.interleave_rounds, timing.interleave_reps
    if gpu:
        from tuner.measure._cuda import CudaTimer

        cuda = CudaTimer(timing)

        def timed(fn: Callable[[], Any]) -> list[float]:
            return cuda.time(fn, lambda: None, n=reps, warmup=1)[0]
    else:

        def timed(fn: Callable[[], Any]) -> list[float]:
            return time_wall(fn, lambda: None, no_sync, timing, n=reps, warmup=1)[0]

    times: dict[str, list[float]] = {}
    out: dict[str, Any] = {}
    for name, fn in contestants:
        try:
            fn()  # compile / warm up
            times[name] = []
        except Exception as exc:
            out[name] = MeasureResult.failed(
                "crashed", "cuda" if gpu else "cpu", f"{type(exc).__name__}: {exc}"
            )
    for _ in range(rounds):
        for name, fn in contestants:
            if name in times:
                times[name].extend(timed(fn))
    for name, t in times.items():
        out[name] = summarize(t, backend="cuda" if gpu else "cpu", extra={"interleaved": True})
    return out


# ---- the phases -----------------------------------------------------------------------------------------
class Run:
    """What the phases share: the mode, the device, the timing, the report and where it goes."""

    def __init__(self, args: argparse.Namespace, gpu: bool, out: Path, report: dict[str, Any]) -> None:
        from tuner.measure import TimingOptions, detect_device

        self.args = args
        self.gpu = gpu
        self.out = out
        self.report = report
        self.device = detect_device("triton")
        self.jobs = args.jobs
        if gpu:
            # Device events, an L2 flush before each run; CUDA graphs where a kernel is shorter than
            # 50 us (decided without the flush; the kernels tuned here run far longer).
            self.timing = TimingOptions(
                warmup=1, budget_ms=25.0, min_reps=10, max_reps=100, interleave_rounds=5, interleave_reps=5
            )
        else:
            self.timing = TimingOptions(
                warmup=0, budget_ms=5.0, min_reps=2, max_reps=5, interleave_rounds=2, interleave_reps=2
            )
        self.matmul_problem = dict(MATMUL_PROBLEM if gpu else CPU_MATMUL_PROBLEM)
        self.attention_problem = dict(ATTENTION_PROBLEM if gpu else CPU_ATTENTION_PROBLEM)
        full = getattr(args, "grid", "sized") == "full"  # the whole space (a seeded sample past the limit)
        self.matmul_grid = None if full else MATMUL_GRID if gpu else CPU_MATMUL_GRID
        self.attention_grid = None if full else ATTENTION_GRID if gpu else CPU_ATTENTION_GRID

    def settings(self, compile_s: float, run_s: float) -> Any:
        from tuner.measure import WorkerSettings

        return WorkerSettings(compile_timeout_s=compile_s, run_timeout_s=run_s, preload=("torch",))

    def reference(self, name: str) -> Any:
        if not self.gpu:
            return None  # the kernels' own references: the problems are tiny
        import _gpu_refs

        return getattr(_gpu_refs, name)


def _unsupported(spec: Any, backend: str, device: Any) -> str | None:
    """The reason a kernel's backend does not run on this device by design (its space refuses the
    device), else None."""
    try:
        spec.space(dict(spec.default_problem), device, backend)
    except (ValueError, NotImplementedError) as exc:
        if "not supported" in str(exc) or isinstance(exc, NotImplementedError):
            return str(exc)
        raise
    return None


def check_kernel(spec: Any, backend: str, run: Run, device: Any, n_configs: int) -> dict[str, Any]:
    from tuner.measure import KernelMeasurer, config_order_key

    problem = dict(spec.default_problem)
    space = spec.space(problem, device, backend)
    configs = [space.default()]
    for c in space.sample(1, n=8):
        if len(configs) >= n_configs:
            break
        if config_order_key(c) not in {config_order_key(x) for x in configs}:
            configs.append(dict(c))
    rows = []
    with KernelMeasurer(
        spec, problem, backend, device=device, timing=run.timing, settings=run.settings(120, 60)
    ) as m:
        for c in configs:  # each compiled, checked against the reference and timed, in one worker
            r = m.measure(c)
            rows.append(
                {
                    "config": c,
                    "status": r.status,
                    "error": r.error,
                    "median_ms": r.median,
                    "max_abs_error": r.max_abs_error,
                }
            )
    ok = all(r["status"] == "ok" for r in rows)
    return {
        "kernel": spec.name,
        "backend": backend,
        "problem": problem,
        "status": "passed" if ok else "failed",
        "configs": rows,
    }


def phase_checks(run: Run, phase: Phase) -> None:
    from tuner.kernels import all_kernels

    from tuner.measure import detect_device

    checks = run.report["checks"]
    jax_reason = None
    try:
        import jax

        backend = jax.default_backend()
        if run.gpu and backend not in ("gpu", "cuda"):
            jax_reason = f"jax has no GPU backend here (default backend {backend!r})"
    except Exception as exc:
        jax_reason = f"jax is not usable: {type(exc).__name__}: {exc}"[:300]
    tasks = [(spec, backend) for spec in all_kernels() for backend in spec.backends]

    def one(task: tuple[Any, str]) -> dict[str, Any]:
        spec, backend = task
        row: dict[str, Any] = {"kernel": spec.name, "backend": backend}
        if phase.left() <= 0:
            return {**row, "status": "skipped", "reason": "the phase's time share ran out"}
        if backend == "pallas" and jax_reason:
            return {**row, "status": "skipped", "reason": jax_reason}
        try:
            device = detect_device(backend)
            why = _unsupported(spec, backend, device)
            if why:
                return {**row, "status": "skipped", "reason": f"not supported by design: {why}"}
            return check_kernel(spec, backend, run, device, 3 if run.gpu else 1)
        except Exception as exc:
            return {
                **row,
                "status": "error",
                "reason": f"{type(exc).__name__}: {exc}"[:500],
                "traceback": traceback.format_exc()[-2000:],
            }

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4 if run.gpu else 2) as ex:
        for c in ex.map(one, tasks):
            checks.append(c)
            detail = c.get("reason") or ", ".join(r["status"] for r in c.get("configs", []))
            print(f"  check {c['kernel']:<16} {c['backend']:<7} {c['status']:<8} {detail}"[:300], flush=True)


def phase_graph_probe(run: Run, phase: Phase) -> None:
    """A short torch matmul timed eagerly, with CUDA-graph replay, and with the timer's own choice."""
    import dataclasses

    import torch

    from tuner.measure import summarize
    from tuner.measure._cuda import CudaTimer

    if not run.gpu:
        run.report["cuda_graph_probe"] = {"skipped": "no CUDA device (CPU self-test)"}
        return
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    row = {}
    for mode in (False, True, "auto"):
        timer = CudaTimer(dataclasses.replace(run.timing, cuda_graph=mode))
        times, _, how = timer.time(lambda: torch.matmul(a, b), lambda: None)
        r = summarize(times, backend="cuda")
        row[str(mode).lower()] = {"median_ms": r.median, "timer": how}
    run.report["cuda_graph_probe"] = row
    print(
        "  cuda graph probe (256^3 fp16 matmul): "
        + ", ".join(f"{k} {v['median_ms'] * 1e3:.1f} us [{v['timer']}]" for k, v in row.items()),
        flush=True,
    )


def _tuned_section(res: Any, budget: int, seconds: float) -> dict[str, Any]:
    compile_s = sorted(t.result.compile_s for t in res.trials if t.result.compile_s is not None)
    return {
        "config": res.best_config,
        "median_ms": res.best_time_ms if res.best is not None else None,
        "tflops": res.tflops,
        "trials": len(res.trials),
        "status_counts": res.status_counts(),
        "strategy": "auto",
        "budget": budget,
        "seconds": seconds,
        "first_call_s_median": compile_s[len(compile_s) // 2] if compile_s else None,
        "stats": res.best.stats() if res.best else None,
        "failures": [
            {"config": t.config, "status": t.status, "error": (t.result.error or "")[:300]}
            for t in res.trials
            if not t.result.ok
        ][:10],
    }


def _compare(
    run: Run,
    spec: Any,
    problem: Mapping[str, Any],
    configs: Sequence[tuple[str, Mapping[str, Any]]],
    baseline: tuple[str, Callable[[dict[str, Any]], Any]],
    flops: float,
) -> dict[str, Any]:
    """The finalists and the library baseline, re-measured together (`interleaved`)."""
    inputs = spec.make_inputs(problem, "triton", 0)
    seen: set[str] = set()
    contestants: list[tuple[str, Callable[[], Any]]] = []
    names: dict[str, Any] = {}
    for label, cfg in configs:
        key = json.dumps(dict(cfg), sort_keys=True, default=str)
        if key in seen:
            names[label] = next(
                n for n, c in names.items() if json.dumps(c, sort_keys=True, default=str) == key
            )
            continue
        seen.add(key)
        names[label] = dict(cfg)
        contestants.append((label, lambda cfg=dict(cfg): spec.run(problem, "triton", inputs, cfg)))
    base_name, base_fn = baseline
    contestants.append((base_name, lambda: base_fn(inputs)))
    results = interleaved(contestants, run.timing, run.gpu)
    out: dict[str, Any] = {}
    for label, r in results.items():
        out[label] = {
            "config": names.get(label) if isinstance(names.get(label), dict) else None,
            "status": r.status,
            "median_ms": r.median,
            "iqr_ms": r.iqr,
            "n": r.n,
            "tflops": tflops(flops, r.median),
            "error": r.error,
        }
    for label, same in names.items():
        if isinstance(same, str):
            out[label] = {**out[same], "same_as": same}
    base = out.get(base_name, {}).get("median_ms")
    for row in out.values():
        if base and row.get("median_ms"):
            row["speed_vs_baseline"] = base / row["median_ms"]
    return out


def _sweep(
    run: Run,
    phase: Phase,
    m: Any,
    configs: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    problem: Mapping[str, Any],
    sec: dict[str, Any],
    name: str,
) -> tuple[list[tuple[Mapping[str, Any], Any]], list[tuple[Mapping[str, Any], Any]]]:
    """Measure every config of the sized grid (stopping at a quarter of the phase's share left), write
    the table as `<name>_sweep_<arch>.json` (Kernel Tuner's cache format) and return (rows, ok rows by
    median)."""
    from tuner.measure import write_kernel_tuner_cache

    t0 = time.perf_counter()
    reserve = 0.25 * phase.budget_s
    rows: list[tuple[Mapping[str, Any], Any]] = []
    for c in configs:
        if phase.left() < reserve:
            sec["sweep_stopped_early"] = f"phase time share: {len(rows)} of {len(configs)} measured"
            break
        rows.append((c, m.measure(c)))
    sec["sweep_s"] = time.perf_counter() - t0
    sec["sweep_measured"] = len(rows)
    statuses: dict[str, int] = {}
    for _, r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    sec["sweep_status_counts"] = statuses
    ok = sorted(((c, r) for c, r in rows if r.ok), key=lambda cr: cr[1].median)
    if rows:
        doc = sweep_cache(
            rows,
            device_name=run.report["device"]["name"],
            problem=problem,
            keys=keys,
            extra={"problem": problem, "arch": run.device.arch, "versions": run.report["versions"]},
            kernel=name,
        )
        sec["cache_file"] = str(
            write_kernel_tuner_cache(run.out / f"{name}_sweep_{run.device.arch}.json", doc)
        )
    print(
        f"  {name}: swept {len(rows)} of {len(configs)} configs in {sec['sweep_s']:.0f} s "
        f"({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))})",
        flush=True,
    )
    return rows, ok


def phase_matmul(run: Run, phase: Phase) -> None:
    import torch
    from tuner.kernels import get_kernel
    from tuner.search_spaces import SearchSpace

    from tuner.measure import KernelMeasurer
    from tuner.tune import tune_kernel

    args = run.args
    spec = get_kernel("matmul")
    problem = run.matmul_problem
    full = spec.space(problem, run.device, "triton")
    configs = sized_configs(full, args.sweep_limit, run.matmul_grid)
    space = SearchSpace.from_configs(configs, name="matmul-sweep")
    flops = float(spec.flops(problem))
    sec: dict[str, Any] = {"problem": problem, "space": len(configs), "grid": run.matmul_grid}
    run.report["matmul"] = sec
    with KernelMeasurer(
        spec,
        problem,
        "triton",
        device=run.device,
        timing=run.timing,
        settings=run.settings(180, 60),
        reference_fn=run.reference("matmul_reference_gpu"),
    ) as m:
        t0 = time.perf_counter()
        fails = m.precompile(configs, jobs=run.jobs)
        sec["precompile"] = {
            "seconds": time.perf_counter() - t0,
            "jobs": run.jobs,
            "failures": {k: f.status for k, f in fails.items()},
            "compile_only": bool(getattr(m, "compile_only", None)),
        }
        print(
            f"  matmul: precompiled {len(configs)} configs in {sec['precompile']['seconds']:.1f} s "
            f"on {run.jobs} processes ({len(fails)} rejected by the compiler)",
            flush=True,
        )
        t0 = time.perf_counter()
        res = tune_kernel(
            spec,
            problem,
            backend="triton",
            device=run.device,
            budget=args.budget,
            strategy="auto",
            seed=args.seed,
            measurer=m,
            space=space,
            finalists=3,
            time_budget_s=max(1.0, 0.35 * phase.left()),
        )
        sec["tuned"] = _tuned_section(res, args.budget, time.perf_counter() - t0)
        print(
            f"  matmul: tuned ({len(res.trials)} trials, {sec['tuned']['seconds']:.0f} s) {res.best_config}",
            flush=True,
        )
        write_json(run.out / "gpu_validate.json", run.report)

        rows, ok = _sweep(run, phase, m, configs, space.names, problem, sec, "matmul")
    finals: list[tuple[str, Mapping[str, Any]]] = []
    if res.best_config is not None:
        finals.append(("tuned", res.best_config))
    for i, (c, _) in enumerate(ok[:2]):
        finals.append((f"sweep_best_{i + 1}", c))
    sec["final"] = _compare(
        run, spec, problem, finals, ("torch.matmul", lambda inp: torch.matmul(inp["a"], inp["b"])), flops
    )
    sec["configs_timed"] = len(res.trials) + len(rows)


def phase_attention(run: Run, phase: Phase) -> None:
    import torch
    from tuner.kernels import get_kernel
    from tuner.search_spaces import SearchSpace

    from tuner.measure import KernelMeasurer
    from tuner.tune import tune_kernel

    args = run.args
    spec = get_kernel("flash_attention")
    problem = run.attention_problem
    full = spec.space(problem, run.device, "triton")
    configs = sized_configs(full, args.attn_space_limit, run.attention_grid)
    space = SearchSpace.from_configs(configs, name="flash-attention-sized")
    flops = float(spec.flops(problem))
    sec: dict[str, Any] = {"problem": problem, "space": len(configs), "grid": run.attention_grid}
    run.report["attention"] = sec
    with KernelMeasurer(
        spec,
        problem,
        "triton",
        device=run.device,
        timing=run.timing,
        settings=run.settings(180, 120),
        reference_fn=run.reference("attention_reference_gpu"),
    ) as m:
        t0 = time.perf_counter()
        fails = m.precompile(configs, jobs=run.jobs)
        sec["precompile"] = {
            "seconds": time.perf_counter() - t0,
            "failures": {k: f.status for k, f in fails.items()},
        }
        t0 = time.perf_counter()
        res = tune_kernel(
            spec,
            problem,
            backend="triton",
            device=run.device,
            budget=args.attn_budget,
            strategy="auto",
            seed=args.seed,
            measurer=m,
            space=space,
            finalists=3,
            time_budget_s=max(1.0, 0.35 * phase.left()),
        )
        sec["tuned"] = _tuned_section(res, args.attn_budget, time.perf_counter() - t0)
        print(
            f"  attention: tuned ({len(res.trials)} trials, {sec['tuned']['seconds']:.0f} s) {res.best_config}",
            flush=True,
        )
        write_json(run.out / "gpu_validate.json", run.report)
        rows, ok = _sweep(run, phase, m, configs, space.names, problem, sec, "flash_attention")
    finals: list[tuple[str, Mapping[str, Any]]] = []
    if res.best_config is not None:
        finals.append(("tuned", res.best_config))
    for i, (c, _) in enumerate(ok[:2]):
        finals.append((f"sweep_best_{i + 1}", c))
    causal = bool(problem["causal"])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sec["final"] = _compare(
        run,
        spec,
        problem,
        finals,
        ("torch_sdpa", lambda inp: sdpa(inp["q"], inp["k"], inp["v"], is_causal=causal)),
        flops,
    )
    sec["configs_timed"] = len(res.trials) + len(rows)


def print_summary(report: Mapping[str, Any]) -> None:
    print(
        "\nresult (TFLOP/s from medians; tuned, sweep-best and the library re-measured together, interleaved)"
    )
    mm = (report.get("matmul") or {}).get("final") or {}
    if mm:
        p = report["matmul"]["problem"]
        line = f"  matmul {p['dtype']} {p['M']}x{p['N']}x{p['K']}  "
        line += " | ".join(
            f"{k} {fmt(v.get('tflops'))} ({fmt(v.get('speed_vs_baseline'), '.2f')}x)" for k, v in mm.items()
        )
        print(line)
        t = report["matmul"].get("tuned") or {}
        print(
            f"    configs timed {report['matmul'].get('configs_timed')}, tuning {fmt(t.get('seconds'), '.0f')} s"
        )
    at = (report.get("attention") or {}).get("final") or {}
    if at:
        p = report["attention"]["problem"]
        line = f"  flash attention {p['B']}x{p['H']}x{p['S']}x{p['D']} causal={p['causal']} {p['dtype']}  "
        line += " | ".join(
            f"{k} {fmt(v.get('tflops'))} ({fmt(v.get('speed_vs_baseline'), '.2f')}x)" for k, v in at.items()
        )
        print(line)
        t = report["attention"].get("tuned") or {}
        print(
            f"    configs timed {report['attention'].get('configs_timed')}, tuning {fmt(t.get('seconds'), '.0f')} s"
        )
    checks = report.get("checks", [])
    print(
        f"  kernel checks: {sum(c['status'] == 'passed' for c in checks)} passed, "
        f"{sum(c['status'] in ('failed', 'error') for c in checks)} failed, "
        f"{sum(c['status'] == 'skipped' for c in checks)} skipped"
    )
    for c in checks:
        if c["status"] == "skipped":
            print(f"    skipped {c['kernel']}/{c['backend']}: {c.get('reason', '')[:160]}")


PHASES: dict[str, Callable[[Run, Phase], None]] = {
    "checks": phase_checks,
    "graph_probe": phase_graph_probe,
    "matmul": phase_matmul,
    "attention": phase_attention,
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=None, help="output directory (default: $OUT, else ./gpu_validate_out)")
    ap.add_argument(
        "--max-minutes", type=positive_float, default=8.0, help="total wall-clock limit (default 8)"
    )
    ap.add_argument("--allow-cpu", action="store_true", help="without a CUDA device: the CPU self-test")
    ap.add_argument("--budget", type=int, default=None, help="matmul tuning trials (default 16; CPU 4)")
    ap.add_argument(
        "--attn-budget", type=int, default=None, help="attention tuning trials (default 10; CPU 3)"
    )
    ap.add_argument(
        "--sweep-limit", type=int, default=None, help="most configs in the matmul sweep (160; CPU 4)"
    )
    ap.add_argument("--attn-space-limit", type=int, default=48, help="most attention configs (default 48)")
    ap.add_argument(
        "--grid",
        choices=("sized", "full"),
        default="sized",
        help="sized: the fixed sub-grids of the spaces (default); full: each kernel's whole space for the "
        "device, a seeded sample of --sweep-limit / --attn-space-limit configs where it is larger",
    )
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (default: the usable cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", action="append", default=[], choices=list(PHASES))
    args = ap.parse_args(argv)
    try:  # --out, else $OUT, else the default: a file in its way is found before the run, not at its end
        out_dir(str(output_dir(args.out)))
    except argparse.ArgumentTypeError as exc:
        ap.error(f"--out: {exc}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    vers = versions()
    print(versions_line(vers), flush=True)
    gpu, reason = gpu_status()
    if not gpu and not args.allow_cpu:
        print(f"gpu_validate: no usable CUDA device ({reason}); --allow-cpu runs the CPU self-test")
        return 1
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module defines a @triton.jit
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from tuner.measure._compile import default_jobs

    args.jobs = args.jobs or default_jobs()
    args.budget = args.budget or (16 if gpu else 4)
    args.attn_budget = args.attn_budget or (10 if gpu else 3)
    args.sweep_limit = args.sweep_limit or (160 if gpu else 4)
    if not gpu:
        args.attn_space_limit = min(args.attn_space_limit, 2)
    clock = Clock(args.max_minutes * 60.0, SHARES)
    out = output_dir(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_validate.json"

    from tuner.tune import software_versions

    report: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": "gpu" if gpu else "cpu-self-test",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {**vers, **software_versions()},
        "args": vars(args),
        "checks": [],
        "errors": [],
        "phase_s": {},
        "phase_budget_s": {},
    }
    run = Run(args, gpu, out, report)
    device: dict[str, Any] = {"name": reason if gpu else "cpu", "arch": run.device.arch}
    if gpu:
        import torch

        props = torch.cuda.get_device_properties(0)
        device |= {
            "capability": list(torch.cuda.get_device_capability(0)),
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
    report["device"] = device
    print(
        f"gpu_validate ({report['mode']}) on {device['name']} ({device['arch']}); limit {args.max_minutes:g} min; writing {path}",
        flush=True,
    )

    def on_expire() -> None:
        report["errors"].append({"phase": "watchdog", "error": f"the {args.max_minutes:g} min limit passed"})
        write_json(path, report)
        print(f"gpu_validate: stopped by the wall-clock guard after {clock.elapsed:.0f} s", flush=True)

    start_watchdog(clock, grace_s=60.0, on_expire=on_expire)
    todo = [p for p in PHASES if p not in args.skip]
    for i, name in enumerate(todo):
        budget = clock.phase_budget(name, todo[i:])
        report["phase_budget_s"][name] = round(budget, 1)
        t0 = time.perf_counter()
        try:
            PHASES[name](run, Phase(budget))
        except Exception as exc:
            report["errors"].append(
                {
                    "phase": name,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
            print(f"  {name}: FAILED: {type(exc).__name__}: {exc}"[:500], flush=True)
        report["phase_s"][name] = round(time.perf_counter() - t0, 1)
        report["elapsed_s"] = round(clock.elapsed, 1)
        write_json(path, report)
    print_summary(report)
    print(f"elapsed {clock.elapsed:.0f} s; figures in {path}")
    failed = report["errors"] or any(c["status"] in ("failed", "error") for c in report["checks"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
