"""Owners of claims and leases: this host's name, and whether a process of this host still runs."""

from __future__ import annotations

import os
import socket

__all__ = ["HOST", "pid_alive", "local_dead_pid"]

HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a process we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, under another user
        return True
    return True


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
