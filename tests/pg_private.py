"""A PostgreSQL server of the test's own, for tests that stop and start their server (an outage, a
restart): the shared server on 127.0.0.1:5432 (tests/pg.py) is used by other tests at the same time and
must never be stopped. `private_server()` runs `initdb` into a new temporary folder and starts `postgres`
on a free port of 127.0.0.1 (trust auth, its socket in that folder); the test is skipped, with the reason,
where PostgreSQL's server binaries are not installed (`pg_ctl` on PATH or under /usr/lib/postgresql) or
the server cannot be made. Run as root, the server runs as the user `postgres` (PostgreSQL refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True)
    for d in dirs:
        if (Path(d) / "pg_ctl").exists() and (Path(d) / "initdb").exists():
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A server this test alone uses: `stop()` (an immediate shutdown, as a crash), `start()`, `url`."""

    def __init__(self, bindir: Path, data: Path, port: int) -> None:
        self.bindir, self.data, self.port = bindir, data, port
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, encoding="utf-8")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data / "db"), "-o", opts, "-l", str(self.data / "log"), "-w", "start"
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data / "db"), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "db" / "postmaster.pid").exists()


def private_server() -> Iterator[PrivateServer]:
    """Yield a started server of this test's own; stop it and remove its folder afterwards."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("run as root without runuser: cannot start PostgreSQL as another user")
    data = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
    server = PrivateServer(bindir, data, _free_port())
    try:
        try:
            server._run("initdb", "-D", str(data / "db"), "-A", "trust", "-U", "postgres", "--no-sync")
            server.start()
        except (RuntimeError, OSError, LookupError) as exc:
            pytest.skip(f"cannot start a private PostgreSQL server: {exc}")
        yield server
    finally:
        if server.running():
            try:
                server.stop()
            except RuntimeError:
                time.sleep(0.5)
        shutil.rmtree(data, ignore_errors=True)
