"""The one engine factory: every part of tuner (results store, config cache, study task board) reaches a
database through `engine_for(url)`, and Optuna's RDBStorage gets the same engine settings from
`engine_kwargs(url)`."""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

__all__ = [
    "StoreError",
    "engine_for",
    "engine_kwargs",
    "normalize_url",
    "read_only_url",
    "redact",
    "sqlite_path",
]

SQLITE_TIMEOUT_S = 60
# libpq waits for ever by default for a server that accepted the TCP connection but does not answer (a hung
# server, a proxy whose backend is gone), and that would hang a decorated call's miss; a URL's own
# `?connect_timeout=N` wins. Keepalives notice a connection whose peer vanished while it sat idle in the pool.
PG_CONNECT_TIMEOUT_S = 10
_PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


class StoreError(RuntimeError):
    """A storage failure (driver error, schema mismatch), with the database URL's scheme named."""


def normalize_url(url: str) -> str:
    """`postgresql://...` names no driver, and SQLAlchemy 2.1 then picks psycopg 3; tuner depends on
    psycopg2 (pyproject), so a driverless PostgreSQL URL is pointed at psycopg2 unless psycopg 3 is there."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            if (
                importlib.util.find_spec("psycopg") is None
                and importlib.util.find_spec("psycopg2") is not None
            ):
                return "postgresql+psycopg2://" + url[len(prefix) :]
            return "postgresql://" + url[len(prefix) :]
    return url


def redact(url: str) -> str:
    """The URL without user and password (for messages)."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('@')[-1]}"


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL, or None (not SQLite, or an in-memory database)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:" or path.startswith("file::memory:"):
        return None
    return path


def read_only_url(url: str) -> str | None:
    """The URL that opens an existing SQLite store read-only when its folder cannot be written (a
    read-only mount, a store shipped in a container image), else None.

    SQLite cannot open a WAL database there otherwise: it would create the `-shm` file beside it. Opened
    immutable, it reads the file as it is (a checkpointed store: what tuner leaves when its last
    connection closes) and every write fails, as a read-only store's should."""
    path = sqlite_path(url)
    if path is None or path.startswith("file:") or not os.path.isfile(path):
        return None
    path = os.path.abspath(path)
    if os.access(os.path.dirname(path), os.W_OK):
        return None
    return f"sqlite:///file:{quote(path)}?mode=ro&immutable=1&uri=true"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()


def engine_kwargs(url: str) -> dict[str, Any]:
    """The keyword arguments of `create_engine` for `url` (also given to Optuna's RDBStorage)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    kw: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 4, "max_overflow": 4}
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", "psycopg"):
        # libpq's own connection parameters; those the URL names are left to it
        args = {"connect_timeout": PG_CONNECT_TIMEOUT_S, **_PG_KEEPALIVES}
        kw["connect_args"] = {k: v for k, v in args.items() if k not in parsed.query}
    return kw


def make_engine(url: str) -> Engine:
    """A new engine for `url` (normalised), with the SQLite pragmas (WAL, busy timeout) installed.
    Most code wants the shared `engine_for(url)`."""
    url = normalize_url(url)
    eng = create_engine(url, **engine_kwargs(url))
    if url.startswith("sqlite"):
        event.listen(eng, "connect", _sqlite_pragmas)
    return eng


_engines: dict[tuple[int, str], Engine] = {}
_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """The engine of this process for `url`: one per URL and process, shared by the results store, the
    config cache and the task board (a forked child gets its own)."""
    url = normalize_url(url)
    key = (os.getpid(), url)
    eng = _engines.get(key)
    if eng is None:
        with _lock:
            eng = _engines.get(key)
            if eng is None:
                eng = _engines[key] = make_engine(url)
    return eng
