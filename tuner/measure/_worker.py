"""Worker processes: each holds one `Session` and measures configs on request.

The parent talks to a worker over a pipe (pickled messages between our own two processes; nothing a
user could send). A worker dies with its parent (PR_SET_PDEATHSIG on Linux, and EOF on the pipe), so a
killed tuning run leaves no process behind. A worker that hangs past a timeout is killed; one that dies
(segfault, `os._exit`, the OOM killer) or reports a fatal device error is replaced, and the config it
was running gets a failed result.

Workers start through the 'forkserver' method on Linux (a fresh worker is a fork of a clean server
process, tens of milliseconds, and never a fork of a process that holds a CUDA context) and 'spawn'
elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ._result import CRASHED, OUT_OF_RESOURCES, TIMEOUT, MeasureResult
from ._target import Session, Target, _Failed, apply_env
from ._timing import TimingOptions

log = logging.getLogger(__name__)

__all__ = ["Worker", "WorkerSettings", "WorkerSetupError", "default_start_method"]


class WorkerSetupError(RuntimeError):
    """The task itself cannot be set up (inputs or reference failed): no config can be measured."""


def default_start_method() -> str:
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def _start_keeping_default_context(proc: Any) -> None:
    """`proc.start()`, leaving multiprocessing's default start method unset if it was. Starting a forkserver
    or spawn process calls `multiprocessing.get_start_method()`, which fixes the default context for good:
    the user's own `multiprocessing.set_start_method(...)` then raised "context has already been set"."""
    unset = mp.get_start_method(allow_none=True) is None
    proc.start()
    default = getattr(mp.context, "_default_context", None)
    if unset and default is not None and getattr(default, "_actual_context", None) is not None:
        default._actual_context = None  # as before the start (CPython keeps the choice here)


_preload_lock = threading.Lock()

# Linux caps an AF_UNIX socket's path at 107 bytes. The fork server listens on
# `<tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX`, 32 bytes more than the temp folder's path.
_SUN_PATH_MAX = 107
_LISTENER_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def _short_socket_folder() -> None:
    """Point multiprocessing's temp folder (where the fork server's socket goes) at a short folder when the
    one it would use makes the socket's path too long for Linux: a long TMPDIR (a job scheduler's
    per-job folder, a test runner's) otherwise fails every worker's start with "AF_UNIX path too long".
    The folder goes under the first writable of /tmp, /var/tmp and /dev/shm (what CPython 3.14 does),
    and is removed at exit as multiprocessing's own is. Nothing changes where the path fits."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    try:
        config: dict[str, Any] = process.current_process()._config  # type: ignore[attr-defined]
        current = config.get("tempdir")
        base = current if current is not None else tempfile.gettempdir()
        extra = len("/listener-XXXXXXXX") if current is not None else _LISTENER_SUFFIX
        if len(os.fsencode(base)) + extra <= _SUN_PATH_MAX:
            return
        for folder in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
                short = tempfile.mkdtemp(prefix="pymp-", dir=folder)
                util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
                config["tempdir"] = short
                log.debug("temp folder %s is too long for the fork server's socket; using %s", base, short)
                return
    except Exception:  # pragma: no cover - multiprocessing's private state moved: leave it as it is
        log.debug("could not check the fork server's socket folder", exc_info=True)


@contextlib.contextmanager
def _preloading(ctx: Any, modules: tuple[str, ...]) -> Iterator[None]:
    """While inside (a worker's start, which starts the fork server if it is not running yet), the fork
    server's preload list is the process's own (`multiprocessing.set_forkserver_preload`, the user's
    entries first) plus `modules`; then it is put back as it was: tuner adds to the list of a fork server
    it starts and never replaces the user's setting. Where the list cannot be read (multiprocessing's
    private state moved), it is left alone and nothing is preloaded."""
    if not modules:
        yield
        return
    from multiprocessing import forkserver

    with _preload_lock:
        current = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None)
        if not isinstance(current, list) or not all(isinstance(m, str) for m in current):
            log.debug("the fork server's preload list is not readable; preloading nothing")
            yield
            return
        saved = list(current)
        ctx.set_forkserver_preload([*saved, *(m for m in modules if m not in saved)])
        try:
            yield
        finally:
            ctx.set_forkserver_preload(saved)


@dataclass(frozen=True)
class WorkerSettings:
    """Timeouts (seconds) and the start method of worker processes.

    `compile_timeout_s` bounds the first call of a config (compile + one run + check);
    `run_timeout_s` bounds its timing; `setup_timeout_s` bounds building the inputs and reference.
    `preload`: modules the fork server imports once (e.g. "torch"), so that each new worker starts
    with them loaded: added, while a worker starts, to the process's own preload list (which is then put
    back as it was; it takes effect where that start starts the fork server)."""

    compile_timeout_s: float = 60.0
    run_timeout_s: float = 60.0
    setup_timeout_s: float = 600.0
    start_method: str | None = None
    preload: tuple[str, ...] = ()
    # Workers write stderr to a temporary file, quoted in the error text when one dies.
    capture_stderr: bool = True

    def __post_init__(self) -> None:
        for k in ("compile_timeout_s", "run_timeout_s", "setup_timeout_s"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)!r}")


# ---- the worker's side --------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (Helion's habit)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - best effort; EOF on the pipe is the fallback
        pass


def _release_forkserver() -> None:
    """A forkserver child inherits the fd that keeps the fork server alive ("while any client
    lives"). Close it: then the server exits when the tuning process dies, and its death kills us
    (PR_SET_PDEATHSIG). We never start processes of our own."""
    try:
        from multiprocessing import forkserver

        fs: Any = forkserver._forkserver  # type: ignore[attr-defined]
        fd = getattr(fs, "_forkserver_alive_fd", None)
        if fd is not None:
            os.close(fd)
            fs._forkserver_alive_fd = None
    except Exception:  # pragma: no cover - not a forkserver child, or the internals changed
        pass


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Fallback for platforms without PR_SET_PDEATHSIG: exit when the tuning process is gone."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # pragma: no cover - pid reused by another user's process
                os._exit(0)

    threading.Thread(target=watch, name="tuner-parent-watch", daemon=True).start()


def _capture_stderr(path: str | None) -> None:
    """Send this process's stderr (fd 2, so C-level messages too) to `path`, and dump the Python stack
    there on a fatal signal; the parent quotes its tail when the worker dies."""
    if not path:
        return
    import faulthandler

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(file=sys.stderr, all_threads=False)


def _worker_main(
    conn: Connection,
    env: Mapping[str, str],
    parent_pid: int,
    stderr_path: str | None = None,
    compiled_at: Any = None,
) -> None:
    _capture_stderr(stderr_path)
    _die_with_parent()
    _release_forkserver()
    _watch_parent(parent_pid)
    apply_env(env)
    session: Session | None = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        op = msg[0]
        try:
            if op == "setup":
                _, target, opts, reference, want_reference = msg
                session = (
                    Session(target, opts)
                    if reference is None and want_reference
                    else Session(target, opts, reference)
                )
                ref = session.setup()
                conn.send(("ready", ref if want_reference else None))
            elif op == "measure":
                assert session is not None
                _, config = msg

                # The phase change goes through shared memory, not the pipe: the parent wakes once per
                # config (on the result) unless the compile deadline passes first.
                def on_compiled(_s: float) -> None:
                    compiled_at.value = time.monotonic()

                res = session.measure(config, on_compiled=on_compiled)
                conn.send(("result", res.to_dict()))
            elif op == "check":
                assert session is not None
                _, config = msg
                try:
                    compile_s, err = session.first_run(config)
                    conn.send(("checked", {"compile_s": compile_s, "max_abs_error": err}))
                except _Failed as f:
                    conn.send(
                        ("result", f.result.with_(extra={**f.result.extra, "fatal": f.fatal}).to_dict())
                    )
            elif op == "interleave":
                assert session is not None
                _, configs, rounds, reps = msg
                conn.send(("results", [r.to_dict() for r in session.interleave(configs, rounds, reps)]))
            elif op == "stop":
                conn.close()
                os._exit(0)
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except Exception as exc:  # setup failures and bugs: report, keep serving
            from ._gate import describe_exception

            conn.send(("error", describe_exception(exc)))
        if session is not None and session.fatal:
            # A device fault (illegal address, ...) leaves the CUDA context unusable.
            conn.close()
            os._exit(3)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# ---- the parent's side --------------------------------------------------------------------------------
def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


_UNSET_REF: Any = object()


class Worker:
    """A worker process bound to one target. Restarts itself after a crash or a timeout."""

    def __init__(
        self, target: Target, opts: TimingOptions, settings: WorkerSettings, *, name: str = "worker"
    ) -> None:
        self.target = target
        self.opts = opts
        self.settings = settings
        self.name = name
        self.reference: Any = _UNSET_REF
        self.proc: Any = None
        self.conn: Connection | None = None
        self.starts = 0
        self._stderr_path: str | None = None
        self._stderr_mark = 0
        self._compiled_at: Any = None
        method = settings.start_method or default_start_method()
        self.ctx: Any = mp.get_context(method)
        # Modules the fork server imports once, so that every fresh worker starts with them loaded.
        self.preload = ("tuner.measure._worker", *settings.preload) if method == "forkserver" else ()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def _start(self) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        env = {**self.target.env()}
        if self.settings.capture_stderr and self._stderr_path is None:
            import tempfile

            fd, self._stderr_path = tempfile.mkstemp(prefix=f"tuner-{self.name}-", suffix=".stderr")
            os.close(fd)
            weakref.finalize(self, _unlink_quietly, self._stderr_path)
        self._compiled_at = self.ctx.RawValue("d", 0.0)
        self.proc = self.ctx.Process(
            target=_worker_main,
            args=(child, env, os.getpid(), self._stderr_path, self._compiled_at),
            daemon=True,
            name=f"tuner-{self.name}",
        )
        if self.ctx.get_start_method() == "forkserver":
            _short_socket_folder()
        try:
            with _preloading(self.ctx, self.preload):
                _start_keeping_default_context(self.proc)
        except BaseException:
            self.proc = None  # never started: nothing to kill or join
            parent.close()
            child.close()
            raise
        child.close()
        self.conn = parent
        self.starts += 1
        want_ref = self.reference is _UNSET_REF
        self._mark()
        try:
            self.conn.send(("setup", self.target, self.opts, None if want_ref else self.reference, want_ref))
        except Exception as exc:
            self.kill()
            raise WorkerSetupError(
                f"cannot send the task to a worker process ({exc}); pass picklable, "
                f"module-level functions or measure in-process"
            ) from exc
        kind, payload = self._recv(self.settings.setup_timeout_s, "setting up the task")
        if kind != "ready":
            self.kill()
            why = f"the worker died ({_signal_name(payload)})" if kind == "died" else str(payload)
            tail = self.stderr_tail()
            raise WorkerSetupError(
                f"setting up {self.target.describe()} failed: {why}"
                + (f"; its stderr ended with:\n{tail}" if tail else "")
            )
        if want_ref:
            self.reference = payload

    def _recv(self, timeout: float, what: str) -> tuple[str, Any]:
        assert self.conn is not None
        try:
            if not self.conn.poll(timeout):
                self.kill()
                return "timeout", f"{what} exceeded {timeout:g} s"
            return self.conn.recv()
        except (EOFError, OSError, ConnectionError):
            code = None
            if self.proc is not None:
                self.proc.join(5)
                code = self.proc.exitcode
            self.kill()
            return "died", code

    def ensure(self) -> None:
        if not self.alive:
            self.kill()
            self._start()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None

    def close(self) -> None:
        if self.alive and self.conn is not None:
            try:
                self.conn.send(("stop",))
                self.proc.join(2)
            except (OSError, BrokenPipeError):
                pass
        self.kill()
        if self._stderr_path:
            tail = self.stderr_tail(4000, since_mark=False)
            if tail:
                log.debug("worker %s stderr (tail):\n%s", self.name, tail)
            with contextlib.suppress(OSError):
                os.unlink(self._stderr_path)
            self._stderr_path = None

    def _mark(self) -> None:
        """Remember where stderr ends now: a death quotes only what the current request wrote."""
        self._stderr_mark = 0
        if self._stderr_path:
            with contextlib.suppress(OSError):
                self._stderr_mark = os.path.getsize(self._stderr_path)

    def stderr_tail(self, limit: int = 1500, since_mark: bool = True) -> str:
        """What the worker wrote to stderr during the current request (all of it when `since_mark` is
        False), at most `limit` characters: from faulthandler's "Fatal Python error" on when there is one
        (its innermost frames come first), else the end."""
        if not self._stderr_path:
            return ""
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(self._stderr_mark if since_mark else 0, size - 65536))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        i = text.rfind("Fatal Python error")
        if i >= 0:
            lines = [ln for ln in text[i:].splitlines() if not ln.startswith("Extension modules:")]
            return "\n".join(lines).strip()[:limit]
        return text.strip()[-limit:]

    def _died(self, code: int | None, what: str) -> MeasureResult:
        label = self.target.label
        sig = _signal_name(code)
        tail = self.stderr_tail()
        if tail:
            what = f"{what}; its stderr ended with:\n{tail}"
        if code == -signal.SIGKILL:
            return MeasureResult.failed(
                OUT_OF_RESOURCES,
                label,
                f"worker was killed ({sig}) while {what}, most likely by the out-of-memory killer",
                extra={"exitcode": code},
            )
        return MeasureResult.failed(
            CRASHED,
            label,
            f"worker process died ({sig}) while {what}",
            extra={"exitcode": code if code is not None else -1},
        )

    def measure(self, config: Mapping[str, Any]) -> MeasureResult:
        self.ensure()
        assert self.conn is not None
        t0 = time.perf_counter()
        self._mark()
        self._compiled_at.value = 0.0
        sent = time.monotonic()
        self.conn.send(("measure", dict(config)))
        kind, payload = self._recv_measure(sent)
        wall = time.perf_counter() - t0
        if kind == "result":
            res = MeasureResult.from_dict(payload)
            if res.extra.get("fatal"):
                self.kill()  # the worker exits by itself; make sure
            return res
        if kind == "timeout":
            return MeasureResult.failed(TIMEOUT, self.target.label, str(payload), wall_s=wall)
        if kind == "died":
            return self._died(payload, "measuring").with_(wall_s=wall)
        self.kill()
        return MeasureResult.failed(CRASHED, self.target.label, f"worker error: {payload}", wall_s=wall)

    def _recv_measure(self, sent: float) -> tuple[str, Any]:
        """Wait for a measurement: `compile_timeout_s` from the request until the worker marks the
        first call done (in shared memory), then `run_timeout_s` from that mark."""
        assert self.conn is not None
        s = self.settings
        deadline = sent + s.compile_timeout_s
        phase = "compiling (first call)"
        limit = s.compile_timeout_s
        while True:
            compiled = self._compiled_at.value
            if compiled > 0.0:
                deadline, phase, limit = compiled + s.run_timeout_s, "timing", s.run_timeout_s
            left = deadline - time.monotonic()
            try:
                ready = left > 0 and self.conn.poll(left)
            except (EOFError, OSError):
                ready = True
            if ready:
                return self._recv(0.0, phase)
            if self._compiled_at.value > 0.0 and phase != "timing":
                continue  # the first call finished just before the compile deadline: now the run deadline
            self.kill()
            return "timeout", f"{phase} exceeded {limit:g} s"

    def check(self, config: Mapping[str, Any]) -> MeasureResult | None:
        """Compile and check one config (its first call) without timing it: None when it passed,
        else the failed result. Used to precompile upcoming configs in parallel."""
        self.ensure()
        assert self.conn is not None
        self._mark()
        self.conn.send(("check", dict(config)))
        kind, payload = self._recv(self.settings.compile_timeout_s, "compiling (first call)")
        if kind == "checked":
            return None
        if kind == "result":
            res = MeasureResult.from_dict(payload)
            if res.extra.get("fatal"):
                self.kill()
            return res
        if kind == "timeout":
            return MeasureResult.failed(TIMEOUT, self.target.label, str(payload))
        if kind == "died":
            return self._died(payload, "compiling (first call)")
        self.kill()
        return MeasureResult.failed(CRASHED, self.target.label, f"worker error: {payload}")

    def interleave(
        self, configs: Sequence[Mapping[str, Any]], rounds: int, reps: int
    ) -> list[MeasureResult] | None:
        """None when the worker died or hung (the caller falls back to one config at a time)."""
        self.ensure()
        assert self.conn is not None
        self._mark()
        self.conn.send(("interleave", [dict(c) for c in configs], rounds, reps))
        budget = len(configs) * (self.settings.compile_timeout_s + self.settings.run_timeout_s)
        kind, payload = self._recv(budget, "re-measuring the finalists")
        if kind != "results":
            self.kill()
            return None
        return [MeasureResult.from_dict(d) for d in payload]
