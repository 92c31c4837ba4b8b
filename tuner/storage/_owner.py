"""Owners of claims and leases: this host's name, and whether a process of this host still runs."""

from __future__ import annotations

import os
import socket

__all__ = ["HOST", "pid_alive", "local_dead_pid"]

# The id of the kernel's initial PID namespace (PROC_PID_INIT_INO, fixed since Linux 3.8): a process
# there names its host by the hostname alone.
_INIT_PID_NS = 0xEFFFFFFC


def _host_id() -> str:
    """This host, as claims and study workers name it: its hostname, plus the PID namespace where that is
    not the kernel's initial one. Containers that share a hostname (Docker's `--network host`, the
    containers of one Kubernetes pod) each have their own process ids: a pid written by another one
    cannot be checked from here, and read as one of ours it made a live owner look gone (its claim was
    taken over, the key tuned twice) or a dead one look alive."""
    host = socket.gethostname()
    try:
        ns = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:  # not Linux, or no /proc
        return host
    ino = ns[ns.find("[") + 1 : ns.rfind("]")]
    if not ino.isdigit() or int(ino) == _INIT_PID_NS:
        return host
    return f"{host}~pidns{ino}"


HOST = _host_id()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a process we may not signal counts as alive).

    A zombie (a process that has exited, or was killed, and that its parent has not reaped yet) does not
    run: its id still answers `kill(pid, 0)`, and would stay "alive" for as long as its parent does not
    wait for it (a `multiprocessing` parent that joins its ranks in order, a launcher blocked on another
    child), so a claim of a killed rank would wait out its whole lease."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, under another user
        return not _zombie(pid)
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether `pid` is a zombie (Linux's /proc; False where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, so the state follows the last ')'
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


def local_dead_pid(worker: str | None) -> int | None:
    """The pid of a `host:pid:...` worker id when that host is this one and the process is gone, else
    None (another host, a live process, or an id of another form: only its lease can free it)."""
    if not worker:
        return None
    parts = worker.split(":")
    if len(parts) < 2 or parts[0] != HOST or not parts[1].isdigit():
        return None
    pid = int(parts[1])
    return None if pid_alive(pid) else pid
