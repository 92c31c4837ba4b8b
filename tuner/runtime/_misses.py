"""The miss log of record mode: what production called that no cache entry served.

Each process appends to its own file, `<misses dir>/<host>-<pid>-<random>.jsonl` (the misses dir is
`$TUNER_MISSES_DIR`, default `$TUNER_HOME/misses`), so processes never write to one file and no row is
lost or written twice by a race. A line is one JSON object, a *delta* for one key:

    {"v": 1, "hash": KEY HASH, "key": {kernel, source_hash, key, dtypes, device, versions},
     "backend": "triton" | null, "registered": true | false, "fallback": WHY, "config": {...},
     "calls": N, "first_seen": ISO, "last_seen": ISO}

`read_misses` merges every file into one row per key (calls summed, first/last seen widened, the latest
fallback kept); a torn last line (a process killed mid-write) is skipped. Nothing here raises into the
caller: the writer thread logs a failed write once (a full disk: the write is taken back, and a new file
that got nothing is removed with the folders made for it below TUNER_HOME) and keeps the counts for the
next try; what the last flush at exit cannot write is named in one line on stderr (`flush_at_exit`).

Counting calls without touching the hit path: a recorded key's config is a `CountingConfig`, a dict
that counts each time the hit path unpacks it (`**config` calls its `keys()`); configs of keys that
hit an entry stay plain dicts and cost nothing more. A background thread writes the new keys at once
and the count deltas every `FLUSH_S` seconds, and once more at exit.

Where this should move: a `tuner_misses` table of the store's schema (one row per key hash, calls
incremented by an upsert), once the storage layer has one schema version and migrations for every
table; `read_misses` / `MissRow` are the interface `tuner misses` and `tuner study from-misses` use.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import errno
import itertools
import json
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner._atomic import make_folders, remove_made_folders
from tuner._settings import text

from ._key import CacheKey

log = logging.getLogger(__name__)

__all__ = [
    "CountingConfig",
    "MissRecorder",
    "MissRow",
    "FLUSH_S",
    "misses_dir",
    "read_misses",
    "recorder",
    "clear_misses",
]

FLUSH_S = 5.0  # count deltas are written at most this long after the calls (and at exit)
_TRIES = 3  # openings of the log in one flush (its folder removed meanwhile, see `_flush`)
LINE_VERSION = 1


def misses_dir() -> Path:
    """`$TUNER_MISSES_DIR`, else `$TUNER_HOME/misses`."""
    d = text("TUNER_MISSES_DIR")
    if d:
        return Path(d)
    from ..store import tuner_home

    return tuner_home() / "misses"


def _open_log(path: Path) -> tuple[int, bool]:
    """The miss log `path` opened for appending, and whether this call created it. A name that can be
    neither opened nor created (a dangling symbolic link) raises, not loops: the writer thread, and the
    flush at exit, would spin on it for ever."""
    flags = os.O_WRONLY | os.O_APPEND
    for _ in range(_TRIES):
        try:
            return os.open(path, flags), False
        except FileNotFoundError:
            pass
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:  # made meanwhile (a flush of a forked child's would not use this name)
            continue
    raise FileExistsError(errno.EEXIST, "neither a file to append to nor a name to create", str(path))


def _below_home(made: list[Path]) -> list[Path]:
    """The folders of `made` (outermost first) below TUNER_HOME: TUNER_HOME, and those above it, stay
    once made. The rest of the process uses TUNER_HOME as soon as it is there (`default_storage_url`
    makes it, finding it made, and the store's file is made in it next): removed meanwhile, the store
    could not be opened."""
    from ..store import tuner_home

    try:
        home = tuner_home()
    except OSError:  # no home (HOME unset and no passwd entry): none of `made` is it
        return made
    for i in range(len(made) - 1, -1, -1):
        with contextlib.suppress(OSError):
            if os.path.samefile(made[i], home):
                return made[i + 1 :]
    return made


def _unwritten(lines: list[tuple[_Pending, int, str]]) -> tuple[int, int]:
    """(keys, calls) these lines of a flush hold: the keys with something not written yet (the key itself,
    or calls), and the calls not written."""
    return len(lines), sum(max(0, c - p.written_calls) for p, c, _ in lines)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CountingConfig(dict):  # type: ignore[type-arg]
    """A config dict that counts how often it is unpacked with `**` (each call of a recorded key).

    Overriding `__iter__` sends `**config` through `keys()` (CPython's generic mapping path), which
    ticks a C-level counter (`itertools.count`, safe across threads) and returns the dict's keys."""

    __slots__ = ("_calls",)

    def __init__(self, config: Mapping[str, Any], calls: Any) -> None:
        super().__init__(config)
        self._calls = calls

    def keys(self) -> Any:
        next(self._calls)
        return dict.keys(self)

    def __iter__(self) -> Any:
        return dict.__iter__(self)

    def __reduce__(self) -> Any:  # copies and pickles are plain dicts
        return (dict, (dict(self),))


@dataclass
class _Pending:
    key: CacheKey
    backend: str | None
    registered: bool
    fallback: str
    config: dict[str, Any]
    counter: Any  # itertools.count
    first_seen: str
    written_calls: int = 0
    written: bool = False
    last_seen: str = ""

    def calls(self) -> int:
        # itertools.count has no public read; its repr is "count(N)"
        return int(repr(self.counter)[6:-1])


class MissRecorder:
    """Collects the misses of this process and appends them to its own file in `folder`."""

    def __init__(self, folder: Path | None = None, flush_s: float = FLUSH_S) -> None:
        self._folder = folder
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: Path | None = None
        self._failed_once = False
        self.write_errors = 0
        self.last_error: str | None = None  # the file and the error of the last failed write

    @property
    def folder(self) -> Path:
        return self._folder if self._folder is not None else misses_dir()

    def note(
        self,
        key: CacheKey,
        config: Mapping[str, Any],
        fallback: str,
        *,
        backend: str | None = None,
        registered: bool = False,
    ) -> CountingConfig:
        """Remember a miss resolved to `config` by `fallback`; the returned config counts its calls
        (this first call included: the hit path unpacks it too)."""
        with self._lock:
            p = self._pending.get(key.hash)
            if p is None:
                p = _Pending(key, backend, registered, fallback, dict(config), itertools.count(), _now())
                self._pending[key.hash] = p
            else:  # the same key resolved again (another function object, cache_clear): same counter
                p.fallback, p.config = fallback, dict(config)
                p.written = False
        self._ensure_thread()
        self._wake.set()
        return CountingConfig(config, p.counter)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="tuner-miss-recorder", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            self.flush()

    def _lines(self) -> list[tuple[_Pending, int, str]]:
        out = []
        now = _now()
        with self._lock:
            for h, p in self._pending.items():
                calls = p.calls()
                delta = calls - p.written_calls
                if p.written and delta <= 0:
                    continue
                rec = {
                    "v": LINE_VERSION,
                    "hash": h,
                    "key": p.key.to_json(),
                    "backend": p.backend,
                    "registered": p.registered,
                    "fallback": p.fallback,
                    "config": p.config,
                    "calls": max(0, delta),
                    "first_seen": p.first_seen,
                    "last_seen": now,
                }
                out.append((p, calls, json.dumps(rec, sort_keys=True, default=str)))
        return out

    def flush(self) -> int:
        """Append the new keys and count deltas to this process's file; returns the lines written.
        Never raises: a failed write is logged (once) and retried at the next flush. One flush at a
        time (the writer thread, an explicit call, exit), so a delta is never written twice."""
        with self._flush_lock:
            return self._flush()

    def _flush(self, *, at_exit: bool = False) -> int:
        lines = self._lines()
        if not lines:
            return 0
        where: Any = self._folder or "the misses dir"
        made: list[Path] = []
        created = False
        try:
            where = folder = self.folder
            made = make_folders(folder)
            if self._file is None or self._file.parent != folder:
                name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
                self._file = folder / name
            where = self._file
            data = ("\n".join(text for _, _, text in lines) + "\n").encode()
            for tries_left in range(_TRIES - 1, -1, -1):
                try:
                    fd, created = _open_log(self._file)
                    break
                except FileNotFoundError:
                    # the folder was there and is gone: another process whose first write failed removed
                    # the empty folder it had made (as `_unmake` does), between `make_folders` and here
                    if not tries_left or folder.is_dir():
                        raise
                    made += make_folders(folder)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                view = memoryview(data)
                try:
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                except BaseException:
                    # A write cut short (a full disk) leaves part of these lines in the file, and the next
                    # try writes them all again: the complete ones would count twice and the torn one would
                    # swallow the next line. Cut the file back to where this flush began.
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise
            finally:
                os.close(fd)
        except Exception as exc:  # noqa: BLE001 - recording must never take the caller down
            self._unmake(created, made)
            self.write_errors += 1
            self.last_error = f"{where} ({type(exc).__name__}: {exc})"
            keys, calls = _unwritten(lines)
            (log.debug if self._failed_once or at_exit else log.warning)(
                "record mode: cannot write the miss log %s; %d call(s) of %d key(s) kept in memory for the "
                "next try (every %g s, and at exit)",
                self.last_error,
                calls,
                keys,
                self.flush_s,
            )
            self._failed_once = True
            return 0
        with self._lock:
            for p, calls, _ in lines:
                p.written_calls = max(p.written_calls, calls)
                p.written = True
        if self._failed_once:
            log.warning(
                "record mode: the miss log %s is written again, the counts kept meanwhile included", where
            )
            self._failed_once = False
        self.last_error = None
        return len(lines)

    def _unmake(self, created: bool, made: list[Path]) -> None:
        """After a failed write: remove the log file this flush made if it is still empty (a full disk
        cuts a new file's first write), and the folders it made for it below TUNER_HOME (`_below_home`)."""
        if created and self._file is not None:
            with contextlib.suppress(OSError):
                if os.path.getsize(self._file) == 0:
                    os.unlink(self._file)
        remove_made_folders(_below_home(made))

    def unwritten(self) -> tuple[int, int]:
        """(keys, calls) this process has counted and not written yet: the keys with new keys or calls not
        in the file, and those calls."""
        return _unwritten(self._lines())

    def flush_at_exit(self) -> None:
        """The last flush (atexit). What it cannot write is lost with the process: one line on stderr
        says where, why and how much (the process's logging may already be gone or go elsewhere; this is
        how Python itself reports an error at exit)."""
        with self._flush_lock:
            self._flush(at_exit=True)  # its failure is said below, once
        keys, calls = self.unwritten()
        if keys or calls:
            with contextlib.suppress(Exception):
                sys.stderr.write(
                    f"tuner: record mode: {calls} call(s) of {keys} missed key(s) were not written to the miss "
                    f"log {self.last_error or self.folder} and are lost with this process\n"
                )
                sys.stderr.flush()

    def reset(self) -> None:
        """Forget what this process noted (tests); the files stay."""
        with self._lock:
            self._pending.clear()
            self._file = None

    def _after_fork(self) -> None:
        """In a forked child: the parent writes what it counted; the child keeps the keys (its inherited
        configs still count into their counters) but writes only the calls made after the fork, to its
        own file, from its own writer thread (the locks are new: a parent thread may have held one)."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        for p in self._pending.values():
            p.written_calls = p.calls()
            p.written = True
        self._file = None
        self._thread = None
        self._failed_once, self.last_error = False, None  # the parent's failures were the parent's to say


_recorder: MissRecorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> MissRecorder:
    """This process's recorder (flushed at exit)."""
    global _recorder
    if _recorder is None:
        with _recorder_lock:
            if _recorder is None:
                _recorder = MissRecorder()
                atexit.register(_recorder.flush_at_exit)
                if hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=_recorder._after_fork)
    return _recorder


# ---- reading ---------------------------------------------------------------------------------------------
@dataclass
class MissRow:
    """One missed key, merged over every process that recorded it."""

    key: CacheKey
    calls: int
    fallback: str
    config: dict[str, Any]
    first_seen: str
    last_seen: str
    backend: str | None = None
    registered: bool = False
    processes: int = 0
    files: set[str] = field(default_factory=set, repr=False)

    @property
    def kernel(self) -> str:
        return self.key.kernel

    @property
    def problem(self) -> dict[str, Any]:
        """The key fields with the dtype (the form a registered kernel's problem takes)."""
        p: dict[str, Any] = dict(self.key.fields_dict)
        if len(self.key.dtypes) == 1:
            p["dtype"] = self.key.dtypes[0]
        return p

    def to_json(self) -> dict[str, Any]:
        return {
            **self.key.to_json(),
            "hash": self.key.hash,
            "calls": self.calls,
            "fallback": self.fallback,
            "config": self.config,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "backend": self.backend,
            "registered": self.registered,
            "processes": self.processes,
        }


def _key_of(d: Mapping[str, Any]) -> CacheKey:
    return CacheKey.make(
        str(d["kernel"]),
        str(d["source_hash"]),
        dict(d["key"]),
        [str(x) for x in d["dtypes"]],
        str(d["device"]),
        {str(k): str(v) for k, v in dict(d["versions"]).items()},
    )


def _iter_lines(folder: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    if not folder.is_dir():
        return
    for f in sorted(folder.glob("*.jsonl")):
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            log.warning("cannot read miss log %s: %s", f, exc)
            continue
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict) or d.get("v") != LINE_VERSION:
                    raise ValueError("not a miss line")
            except ValueError:
                log.debug("%s line %d is not a miss record (torn write?); skipped", f, i + 1)
                continue
            yield f.name, d


def read_misses(folder: str | os.PathLike[str] | None = None) -> list[MissRow]:
    """Every recorded miss under `folder` (default `misses_dir()`), one row per key, most calls first."""
    rows: dict[str, MissRow] = {}
    for fname, d in _iter_lines(Path(folder) if folder is not None else misses_dir()):
        try:
            key = _key_of(d["key"])
            calls = int(d.get("calls", 0))
        except (KeyError, TypeError, ValueError):
            continue
        r = rows.get(key.hash)
        if r is None:
            r = rows[key.hash] = MissRow(
                key,
                0,
                str(d.get("fallback", "")),
                dict(d.get("config") or {}),
                str(d.get("first_seen", "")),
                str(d.get("last_seen", "")),
                d.get("backend"),
                bool(d.get("registered", False)),
            )
        r.calls += max(0, calls)
        r.first_seen = min(r.first_seen, str(d.get("first_seen", r.first_seen)))
        if str(d.get("last_seen", "")) >= r.last_seen:
            r.last_seen = str(d.get("last_seen", ""))
            r.fallback = str(d.get("fallback", r.fallback))
            r.config = dict(d.get("config") or r.config)
        r.files.add(fname)
        r.processes = len(r.files)
    return sorted(rows.values(), key=lambda r: (-r.calls, r.kernel, r.key.hash))


def clear_misses(folder: str | os.PathLike[str] | None = None) -> int:
    """Delete the miss logs under `folder`; returns how many files were removed."""
    d = Path(folder) if folder is not None else misses_dir()
    n = 0
    for f in d.glob("*.jsonl") if d.is_dir() else ():
        with contextlib.suppress(OSError):
            f.unlink()
            n += 1
    return n
