"""Compile Triton kernels for a GPU target without a GPU, one config at a time or in a pool.

`compile_configs(kernel, problem, configs, arch="sm90", jobs=N)` compiles each config of a registered
kernel for an NVIDIA target (`ARCHS`: sm80, sm86, sm89, sm90, sm100, sm120) with Triton's own compiler (the CUDA backend and ptxas ship in the triton wheel)
and returns, per config, a `CompileResult`: compiled or the compiler's error, and for every @triton.jit
function the launcher compiled, its registers per thread, spill bytes and shared memory.

How: each compile process runs the kernel's launcher on CPU tensors with a stand-in Triton driver that
reports the chosen `GPUTarget` and turns every launch into `warmup` (compile, never run). So the
arguments are specialised exactly as a launch on the GPU would specialise them, and the binaries land
in Triton's on-disk cache under the same keys: on a GPU machine a pool run ahead of timing
(`TargetMeasurer.precompile`) leaves the measuring worker a cache hit instead of a compile.

The compile processes are plain subprocesses (`python -m tuner.measure._compile`) with their own
environment (`TRITON_INTERPRET=0`, set before any kernel module defines a @triton.jit), fed JSON lines
on stdin and answering JSON lines; a config that hangs past the timeout or kills its process gets a
failed result and a fresh process. The pool's size defaults to the CPU cores this process may use.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "ARCHS",
    "CompileResult",
    "KernelResources",
    "CompilePool",
    "compile_configs",
    "default_jobs",
    "record_triton_kernels",
    "resource_features",
]

#: Targets `--device` accepts: arch name -> Triton's compute capability number (each compiled with
#: triton 3.7.1's CUDA backend and ptxas on a machine without a GPU).
ARCHS = {"sm80": 80, "sm86": 86, "sm89": 89, "sm90": 90, "sm100": 100, "sm120": 120}

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame")


def default_jobs() -> int:
    """The CPU cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class KernelResources:
    """What the compiler allocated for one @triton.jit function of a config."""

    name: str
    registers: int | None  # per thread
    spill_bytes: int | None  # ptxas's spill stores (compile-only); local memory bytes on a GPU
    shared_bytes: int
    num_warps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "registers": self.registers,
            "spill_bytes": self.spill_bytes,
            "shared_bytes": self.shared_bytes,
            "num_warps": self.num_warps,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelResources:
        return cls(
            d["name"],
            d.get("registers"),
            d.get("spill_bytes"),
            int(d.get("shared_bytes") or 0),
            d.get("num_warps"),
        )


def resource_features(kernels: Sequence[KernelResources]) -> dict[str, int]:
    """One config's resource features for the store and the cost model: the most registers and shared
    memory of any of its kernels, and the spill bytes of all of them."""
    if not kernels:
        return {}
    out = {"shared_bytes": max(k.shared_bytes for k in kernels)}
    regs = [k.registers for k in kernels if k.registers is not None]
    if regs:
        out["registers"] = max(regs)
    spills = [k.spill_bytes for k in kernels if k.spill_bytes is not None]
    if spills:
        out["spill_bytes"] = sum(spills)
    return out


@dataclass(frozen=True)
class CompileResult:
    config: dict[str, Any]
    status: str  # ok, compile_error, out_of_resources, timeout, crashed
    error: str | None = None
    kernels: tuple[KernelResources, ...] = ()
    compile_s: float = 0.0
    arch: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def features(self) -> dict[str, int]:
        return resource_features(self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "status": self.status,
            "error": self.error,
            "kernels": [k.to_dict() for k in self.kernels],
            "compile_s": self.compile_s,
            "arch": self.arch,
            **self.features(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompileResult:
        return cls(
            dict(d["config"]),
            d["status"],
            d.get("error"),
            tuple(KernelResources.from_dict(k) for k in d.get("kernels", ())),
            float(d.get("compile_s") or 0.0),
            d.get("arch", ""),
        )


# ---- inside a compile process (and on a GPU, inside the measuring worker) -----------------------------
class _TargetDriver:
    """Stands in for Triton's CUDA driver where there is no GPU: it names the target to compile for.
    The device id is the capability, so the JIT's per-device caches keep targets apart."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)
        self.capability = capability

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return self.capability

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


def _parse_ptxas(text: str) -> tuple[int | None, int | None]:
    regs = _PTXAS_REGS.search(text)
    spill = _PTXAS_SPILL.search(text)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None)


def _ptxas_stats(ptx: str, capability: int) -> tuple[int | None, int | None]:
    """Registers and spill bytes by running ptxas -v on the PTX (when the binary came from the cache
    and Triton's own ptxas run, whose log we read otherwise, did not happen)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    try:
        ptxas = get_ptxas(capability).path
    except TypeError:  # pragma: no cover - older signature without the arch
        ptxas = get_ptxas().path  # type: ignore[call-arg]
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx, encoding="utf-8")
        res = subprocess.run(
            [ptxas, "-v", f"--gpu-name={arch}", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=300,
        )
    return _parse_ptxas(res.stdout + res.stderr)


def _kernel_name(fn: Any) -> str:
    return getattr(getattr(fn, "fn", None), "__name__", None) or str(fn)


@contextlib.contextmanager
def record_triton_kernels(*, capability: int | None = None) -> Iterator[list[KernelResources]]:
    """While active, every @triton.jit launch is recorded with the resources of its compiled kernel.

    With `capability` (80, 90): no GPU is needed; launches only compile, for that target (a stand-in
    driver), and registers / spills come from ptxas's log. Without it (on a GPU): launches run as usual
    and the resources come from the loaded kernel (`n_regs`, `n_spills` in 4-byte words)."""
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    found: list[KernelResources] = []
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if capability is None:
            kernel = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            if kernel is not None:
                regs = getattr(kernel, "n_regs", None)
                spills = getattr(kernel, "n_spills", None)
                found.append(
                    KernelResources(
                        _kernel_name(self),
                        int(regs) if regs is not None else None,
                        int(spills) * 4 if spills is not None else None,
                        int(getattr(kernel.metadata, "shared", 0) or 0),
                        getattr(kernel.metadata, "num_warps", None),
                    )
                )
            return kernel
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):  # Triton prints ptxas's log with dump_ptxas_log
            kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        regs, spill = _parse_ptxas(buf.getvalue())
        if regs is None and kernel is not None and "ptx" in kernel.asm:
            regs, spill = _ptxas_stats(kernel.asm["ptx"], capability)
        if kernel is not None:
            found.append(
                KernelResources(
                    _kernel_name(self),
                    regs,
                    spill,
                    int(getattr(kernel.metadata, "shared", 0) or 0),
                    getattr(kernel.metadata, "num_warps", None),
                )
            )
        return kernel

    saved_knob = None
    saved_driver = getattr(driver, "_active", None)
    if capability is not None:
        driver.set_active(_TargetDriver(capability))
        saved_knob = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
    JITFunction.run = run  # type: ignore[method-assign]
    try:
        yield found
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
        if capability is not None:
            knobs.nvidia.dump_ptxas_log = saved_knob
            driver._active = saved_driver  # reset_active() would build the real driver: none without a GPU


class _Compiler:
    """One compile process's state: kernel specs and inputs per problem (built once)."""

    def __init__(self) -> None:
        self._inputs: dict[str, Any] = {}

    def compile(self, req: Mapping[str, Any]) -> dict[str, Any]:
        from tuner.kernels import get_kernel
        from tuner.search_spaces import get_device

        from ._gate import classify_exception, describe_exception

        arch = req["arch"]
        config = dict(req["config"])
        spec = get_kernel(req["kernel"])
        problem = dict(req["problem"])
        key = json.dumps([spec.name, problem], sort_keys=True, default=str)
        t0 = time.perf_counter()
        try:
            if key not in self._inputs:
                self._inputs = {key: spec.make_inputs(problem, "triton", 0)}  # one problem at a time
            with record_triton_kernels(capability=ARCHS[arch]) as found:
                spec.run(problem, "triton", self._inputs[key], config)
        except Exception as exc:
            # compile_error / out_of_resources only for the compiler's own errors; anything else (a
            # launcher's ValueError, a bug here) is "crashed": a GPU run would then measure it anyway
            status, _ = classify_exception(exc, "compile")
            return CompileResult(
                config, status, describe_exception(exc), compile_s=time.perf_counter() - t0, arch=arch
            ).to_dict()
        res = CompileResult(config, "ok", None, tuple(found), time.perf_counter() - t0, arch)
        limit = get_device(arch).smem_per_block_bytes
        worst = max((k.shared_bytes for k in found), default=0)
        if limit and worst > limit:
            res = CompileResult(
                config,
                "out_of_resources",
                f"shared memory {worst} bytes > the {limit} bytes a block may use on {arch}",
                res.kernels,
                res.compile_s,
                arch,
            )
        return res.to_dict()


# The argument that gives a compile process the pid of the process that started it (`_Proc.start`), which
# it must not outlive: an argument, not an environment variable, so that it is not inherited by what the
# compile process itself starts (ptxas, Triton's compiler) nor read as a setting.
PARENT_ARG = "--parent"


def _die_with_parent(argv: list[str]) -> None:
    """End this compile process with the process that started it. An idle one reads EOF on stdin when
    its parent dies, but one that is compiling (a slow or hung compile) read nothing until the compile
    ended, and went on alone, an orphan, for as long as it took. A thread watches for the parent's death
    (this process is then handed to another parent: `getppid` changes, also while the dead parent is a
    zombie not reaped yet), and a parent that died before (between the fork and here, while this process
    imported tuner) is seen at once. Not PR_SET_PDEATHSIG: it fires when the *thread* that started the
    process ends, and the compile pool starts its processes from threads of its own."""
    parent = argv[argv.index(PARENT_ARG) + 1] if PARENT_ARG in argv[:-1] else ""
    if not parent.isdigit():
        return  # started some other way (by hand): stdin's EOF ends it

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.2)
        os._exit(0)

    if os.getppid() != int(parent):
        os._exit(0)
    threading.Thread(target=watch, name="tuner-parent-watch", daemon=True).start()


def _serve() -> None:
    """The compile process: JSON requests on stdin, one JSON answer per line on the original stdout
    (anything else written to stdout goes to stderr).

    Warnings that Triton's own modules raise (its cache writes text files without an encoding: an
    EncodingWarning under PYTHONWARNDEFAULTENCODING=1) are shown on this process's stderr, not raised, where
    the user's PYTHONWARNINGS makes warnings errors: that policy is for the user's code, and raised here
    it failed every config. Warnings raised in tuner's or the kernels' code stay as the user set them."""
    import warnings

    _die_with_parent(sys.argv[1:])
    warnings.filterwarnings("default", module=r"triton(\.|$)")
    reply = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    comp = _Compiler()
    buf = b""
    while True:
        while b"\n" not in buf:  # os.read: a pipe's text iterator would wait to fill its buffer
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            buf += chunk
        raw, _, buf = buf.partition(b"\n")
        line = raw.decode()
        if not line.strip():
            continue
        try:
            out = comp.compile(json.loads(line))
        except Exception as exc:  # a bug or a bad request: answer, keep serving
            out = {"status": "crashed", "error": f"{type(exc).__name__}: {exc}", "config": {}}
        reply.write(json.dumps(out, default=str) + "\n")


# ---- the parent's side --------------------------------------------------------------------------------
def _site_folder(folder: str) -> bool:
    """Whether `folder` is one of this interpreter's site-packages folders (tuner installed as a wheel),
    which the child (the same interpreter) has on its path anyway. Put on PYTHONPATH it would go ahead of
    the standard library, where a distribution that shadows a standard module breaks the child."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    known = {paths.get("purelib"), paths.get("platlib")}
    with contextlib.suppress(AttributeError):  # virtualenv's old site.py lacks them
        known.update(site.getsitepackages())
        known.add(site.getusersitepackages())
    real = os.path.realpath(folder)
    return any(p and os.path.realpath(p) == real for p in known)


def _child_env(cache_dir: str | os.PathLike[str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "0"  # compile for the GPU; set before any @triton.jit is defined
    env.pop("TUNER_PALLAS_INTERPRET", None)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")  # no CUDA context is ever needed
    env["PYTHONUNBUFFERED"] = "1"
    import tuner

    root = str(Path(tuner.__file__).resolve().parent.parent)
    if not _site_folder(root):  # a source checkout: the child imports this tuner from it
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    return env


class _Proc:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.p: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self.stderr_path: str | None = None

    def start(self) -> None:
        import tempfile

        fd, self.stderr_path = tempfile.mkstemp(prefix="tuner-compile-", suffix=".stderr")
        try:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "tuner.measure._compile", PARENT_ARG, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                env=self.env,
            )
        finally:
            os.close(fd)
        self._buf = b""

    def ask(self, req: Mapping[str, Any], timeout_s: float) -> dict[str, Any] | str:
        """The answer, or a string saying why there is none (the process is then gone)."""
        if self.p is None or self.p.poll() is not None:
            try:
                self.start()
            except OSError as exc:  # its stderr file or the process itself (a limit, a missing temp folder)
                self.kill()
                return f"crashed: could not start the compile process ({type(exc).__name__}: {exc})"
        assert self.p is not None and self.p.stdin is not None and self.p.stdout is not None
        try:
            self.p.stdin.write((json.dumps(req, default=str) + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._gone("the compile process died before the request")
        deadline = time.monotonic() + timeout_s
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return f"timeout: compiling took more than {timeout_s:g} s"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return self._gone("the compile process died")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _gone(self, what: str) -> str:
        code = self.p.wait(10) if self.p is not None else None
        tail = ""
        if self.stderr_path:
            with contextlib.suppress(OSError):
                tail = Path(self.stderr_path).read_text(encoding="utf-8", errors="replace")[-1500:].strip()
        self.kill()
        return f"crashed: {what} (exit code {code})" + (f"; its stderr ended with:\n{tail}" if tail else "")

    def kill(self) -> None:
        if self.p is not None:
            if self.p.poll() is None:
                self.p.kill()
            with contextlib.suppress(Exception):
                self.p.wait(5)
            for s in (self.p.stdin, self.p.stdout):
                with contextlib.suppress(Exception):
                    s.close()  # type: ignore[union-attr]
        self.p = None
        if self.stderr_path:
            with contextlib.suppress(OSError):
                os.unlink(self.stderr_path)
            self.stderr_path = None


@dataclass
class CompilePool:
    """`jobs` compile processes (default: `default_jobs()`), started on first use and kept until
    `close()`. `cache_dir`: Triton's cache directory for them (default: Triton's own, shared with the
    measuring workers, which is what a precompile wants)."""

    jobs: int | None = None
    timeout_s: float = 300.0
    cache_dir: str | os.PathLike[str] | None = None
    _procs: list[_Proc] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.jobs = max(1, int(self.jobs or default_jobs()))
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")

    def compile(
        self,
        kernel: str,
        problem: Mapping[str, Any],
        configs: Sequence[Mapping[str, Any]],
        arch: str,
        *,
        progress: Callable[[int, CompileResult], None] | None = None,
    ) -> list[CompileResult]:
        """Compile `configs` of `kernel` on `problem` for `arch`, in order of the answers' arrival;
        returned in the order of `configs`."""
        if arch not in ARCHS:
            raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
        n = len(configs)
        results: list[CompileResult | None] = [None] * n
        if not n:
            return []
        assert self.jobs is not None
        while len(self._procs) < min(self.jobs, n):
            self._procs.append(_Proc(_child_env(self.cache_dir)))
        todo: queue.Queue[int] = queue.Queue()
        for i in range(n):
            todo.put(i)
        lock = threading.Lock()
        done = [0]

        def work(proc: _Proc) -> None:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                cfg = dict(configs[i])
                req = {"kernel": kernel, "problem": dict(problem), "config": cfg, "arch": arch}
                t0 = time.perf_counter()
                ans = proc.ask(req, self.timeout_s)
                if isinstance(ans, str):
                    status, _, why = ans.partition(": ")
                    res = CompileResult(cfg, status, why, compile_s=time.perf_counter() - t0, arch=arch)
                else:
                    res = CompileResult.from_dict({**ans, "config": cfg})
                results[i] = res
                with lock:
                    done[0] += 1
                    if progress is not None:
                        progress(i, res)

        threads = [
            threading.Thread(target=work, args=(p,), daemon=True) for p in self._procs[: min(self.jobs, n)]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [
            r if r is not None else CompileResult(dict(configs[i]), "crashed", "not compiled", arch=arch)
            for i, r in enumerate(results)
        ]

    def close(self) -> None:
        for p in self._procs:
            p.kill()
        self._procs.clear()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def compile_configs(
    kernel: str,
    problem: Mapping[str, Any],
    configs: Sequence[Mapping[str, Any]],
    *,
    arch: str = "sm90",
    jobs: int | None = None,
    timeout_s: float = 300.0,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int, CompileResult], None] | None = None,
) -> list[CompileResult]:
    """Compile `configs` of the registered Triton `kernel` for `arch` without a GPU, in `jobs`
    processes (default: the usable CPU cores). See the module docstring."""
    with CompilePool(jobs=jobs, timeout_s=timeout_s, cache_dir=cache_dir) as pool:
        return pool.compile(kernel, problem, configs, arch, progress=progress)


if __name__ == "__main__":
    _serve()
