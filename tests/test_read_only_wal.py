"""A read-only SQLite store whose last writer was killed before a checkpoint (or that was copied while
open): committed rows that are only in its `-wal` file are read all the same.

The store's folder cannot be written by the reader, as in a container image or a shared mount: the store
is made by a writer that is killed with rows in its log, its files are given to another user (65534,
`nobody`), and the reader runs in a subprocess as root without capabilities (`setpriv`), for which that
folder is another user's, readable and not writable (a non-root test user: the folder and its files are
made read-only with chmod); one twin reads it on a read-only bind mount (root and mount(8)). The reader was given the database as it is (`immutable=1`) before and missed those rows: an
older winner, missing entries. Now it reads the log in place where the `-shm` file can be read, from a
private copy where it cannot (none there, or not readable), and warns where neither works."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests._env import repo_pythonpath
from tests.test_runtime_faults import mount  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parent.parent

OTHER = 65534  # the owner of the store's files: `nobody` on Linux

_WRITER = """
import os
from tuner.runtime import CacheEntry, CacheKey, ConfigCache

def entry(i, t, block=64):
    key = CacheKey.make("matmul", "0" * 32, {"M": 64 * (i + 1)}, ["float16"], "NVIDIA H100 (sm90)",
                        {"triton": "3.7.1"})
    return CacheEntry(key, {"BLOCK_M": block}, t, t / 20, "2026-11-29T12:00:00Z", "fp1")

cache = ConfigCache()
for i in range(3):
    cache.put(entry(i, 1e-3))
cache.store.engine.dispose()  # its last connection closed: checkpointed into the database file
# then killed before a checkpoint: a better winner for key 0 and three new keys only in the -wal
cache.put(entry(0, 5e-4, block=128), replace=True)
for i in range(3, 6):
    cache.put(entry(i, 2e-3))
os._exit(0)
"""


def _env(**env: str) -> dict[str, str]:
    """The environment of a child that reads or writes the store in `TUNER_HOME`."""
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), **env}
    env.pop("TUNER_STORAGE", None)
    return env


def _run(cmd: list[str], env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, *cmd],
        cwd=REPO,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def killed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with `tuner.db` (3 entries), `tuner.db-wal` (a new winner and 3 entries more, committed)
    and `tuner.db-shm`, as a writer killed before a checkpoint leaves them."""
    home = tmp_path_factory.mktemp("killed") / "home"
    home.mkdir()
    r = _run([sys.executable, "-c", _WRITER], {"TUNER_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    db = home / "tuner.db"
    assert (home / "tuner.db-wal").stat().st_size > 32 and (home / "tuner.db-shm").is_file()
    # the fault's premise: the database file alone holds the first three entries only
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        assert con.execute("SELECT count(*) FROM tuner_cache_entries").fetchone() == (3,)
    finally:
        con.close()
    return home


def _reader_prefix() -> tuple[str, ...]:
    """The command prefix that runs the reader without the right to write the store's folder (see the
    module's docstring), or skip."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip(
            "runs as root and needs setpriv (util-linux) to read the store as a user who cannot write it"
        )
    prefix = (setpriv, "--bounding-set=-all", "--inh-caps=-all")
    r = subprocess.run([*prefix, "true"], capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        pytest.skip(f"runs as root and cannot drop its capabilities here: {r.stderr.strip()[:200]}")
    return prefix


def _root_reader(why: str) -> tuple[str, ...]:
    """`_reader_prefix()` for a test that needs root (`why`: what for), or skip."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root {why}")
    return _reader_prefix()


def _read_only_copy(killed_store: Path, tmp_path: Path, change: Callable[[Path], None]) -> Path:
    """A copy of the killed store in a folder the reader cannot write; `change` edits its files first."""
    home = tmp_path / "ro"
    shutil.copytree(killed_store, home)
    change(home)
    if os.geteuid() == 0:
        for p in (home, *home.iterdir()):
            os.chown(p, OTHER, OTHER)
    else:  # the owner reads them: files and folder read-only, as shipped in an image
        for p in home.iterdir():
            p.chmod(0o444)
        home.chmod(0o555)
    return home


def _listing(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mode, p.read_bytes()) for p in sorted(folder.iterdir())}


def _export(home: Path, tmp_path: Path, prefix: tuple[str, ...]) -> tuple[dict, str, list[str]]:
    """`tuner cache export` of the store in `home` by the reader: (the file, stderr, what the reader's
    temporary folder holds after it exited)."""
    out = tmp_path / "out"
    tmp = out / "tmp"
    tmp.mkdir(parents=True)
    if os.geteuid() == 0:
        for p in (out, tmp):
            p.chmod(0o777)
    cmd = [sys.executable, "-m", "tuner.cli", "cache", "export", "--out", str(out / "c.json")]
    r = _run(cmd, {"TUNER_HOME": str(home), "TMPDIR": str(tmp)}, prefix)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "c.json").read_text(encoding="utf-8")), r.stderr, sorted(os.listdir(tmp))


def _winners(doc: dict) -> dict[int, tuple[int, float]]:
    return {e["key"]["M"]: (e["config"]["BLOCK_M"], e["time_s"]) for e in doc["entries"]}


EVERY_ROW = {
    64: (128, 5e-4),  # the winner that replaced (64, 1e-3) in the log
    128: (64, 1e-3),
    192: (64, 1e-3),
    256: (64, 2e-3),  # only in the log
    320: (64, 2e-3),
    384: (64, 2e-3),
}


def _no_shm(home: Path) -> None:
    (home / "tuner.db-shm").unlink()  # copied while open: a database and its log, no index


def _unreadable_shm(home: Path) -> None:
    (home / "tuner.db-shm").chmod(0o600)


@pytest.mark.parametrize(
    "change",
    [lambda home: None, _no_shm, _unreadable_shm],
    ids=["with its shm", "without its shm", "shm unreadable"],
)
def test_a_read_only_store_killed_before_a_checkpoint_is_read_with_its_log(
    killed_store: Path, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    if os.geteuid() != 0 and change is _unreadable_shm:
        pytest.skip("needs root to give the -shm file to another user (its owner can read it)")
    prefix = _reader_prefix()
    home = _read_only_copy(killed_store, tmp_path, change)
    before = _listing(home)
    doc, err, left = _export(home, tmp_path, prefix)
    assert _winners(doc) == EVERY_ROW, err
    assert "NOT read" not in err and "not read" not in err, err
    assert _listing(home) == before  # nothing made or written there (no -shm, no lock, no checkpoint)
    assert left == []  # a private copy (no -shm, or unreadable) is removed when the reader exits


def test_a_read_only_store_killed_before_a_checkpoint_on_a_read_only_mount(
    killed_store: Path,
    tmp_path: Path,
    mount: Callable[..., None],  # noqa: F811
) -> None:
    home = tmp_path / "ro"
    shutil.copytree(killed_store, home)
    mount("--bind", str(home), target=home)
    mount("-o", "remount,ro,bind", target=home)
    before = _listing(home)
    doc, err, left = _export(home, tmp_path, ())
    assert _winners(doc) == EVERY_ROW, err
    assert _listing(home) == before and left == []


def test_a_log_that_cannot_be_read_is_warned_naming_what_is_not_read(
    killed_store: Path, tmp_path: Path
) -> None:
    prefix = _root_reader("to give the -wal file to another user (its owner can read it)")

    def change(home: Path) -> None:
        _no_shm(home)
        (home / "tuner.db-wal").chmod(0o600)

    home = _read_only_copy(killed_store, tmp_path, change)
    doc, err, left = _export(home, tmp_path, prefix)
    # the database file's entries, and one warning that says what is missing and what to do
    assert _winners(doc) == {64: (64, 1e-3), 128: (64, 1e-3), 192: (64, 1e-3)}
    lines = [ln for ln in err.splitlines() if "NOT read" in ln]
    assert len(lines) == 1, err
    wal = home / "tuner.db-wal"
    assert f"its write-ahead log {wal} holds changes" in lines[0], err
    assert f"({wal.stat().st_size} bytes, " in lines[0] and "Permission denied" in lines[0], err
    assert "PRAGMA wal_checkpoint(TRUNCATE)" in lines[0], err
    assert left == []


_READER = """
import sys
from tuner.runtime import ConfigCache

cache = ConfigCache()
print(len(cache.entries()), flush=True)
sys.stdin.readline()  # the writer added an entry and closed the store (its -wal and -shm removed)
print(len(cache.entries()), flush=True)
"""


def test_a_read_only_reader_sees_a_writer_commit_and_close_the_store(
    killed_store: Path, tmp_path: Path
) -> None:
    # Another user's writer still has the store (its -shm readable): the reader reads through SQLite's
    # locks, sees what the writer commits, and goes on reading the file as it is once the writer closed
    # the store (SQLite removed the -wal and -shm, which the reader cannot make again).
    prefix = _root_reader("to write the store as another user than its reader")
    home = _read_only_copy(killed_store, tmp_path, lambda home: None)
    with subprocess.Popen(
        [*prefix, sys.executable, "-c", _READER],
        cwd=REPO,
        env=_env(TUNER_HOME=str(home)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    ) as reader:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline().strip() == "6"  # the log's three entries included
        from tuner.runtime import CacheEntry, CacheKey, ConfigCache
        from tuner.storage import sqlite_url

        writer = ConfigCache(sqlite_url(home / "tuner.db"))  # root may write the folder
        key = CacheKey.make("matmul", "0" * 32, {"M": 999}, ["float16"], "NVIDIA H100 (sm90)", {})
        writer.put(CacheEntry(key, {"BLOCK_M": 16}, 1e-3, 5e-5, "2026-11-29T12:00:00Z", "fp1"))
        writer.store.engine.dispose()  # the last connection: checkpointed, -wal and -shm removed
        assert not (home / "tuner.db-wal").exists() and not (home / "tuner.db-shm").exists()
        out, err = reader.communicate("go\n", timeout=120)
    assert reader.returncode == 0, err
    assert out.strip() == "7", err
