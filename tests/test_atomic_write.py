"""tuner._atomic.atomic_write: the one file writer. Files follow the umask (0644 under umask 022, not the
0600 of mkstemp), a failed write leaves the old file and no temporary behind, and every writer of the
package goes through it."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from tuner._atomic import atomic_write

REPO = Path(__file__).resolve().parent.parent

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes and umask are POSIX")


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def umask():
    """Set a umask for one test and restore the old one after it."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


@posix_only
@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_mode_follows_the_umask(tmp_path: Path, umask, mask: int, expected: int):
    umask(mask)
    p = atomic_write(tmp_path / "c.json", "{}\n")
    assert _mode(p) == expected
    assert p.read_text(encoding="utf-8") == "{}\n"


@posix_only
def test_explicit_private_mode(tmp_path: Path, umask):
    umask(0o022)
    p = atomic_write(tmp_path / "secret", b"x", mode=0o600)
    assert _mode(p) == 0o600


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An empty folder of the test's own (tmp_path also holds the suite's TUNER_HOME)."""
    d = tmp_path / "w"
    d.mkdir()
    return d


def test_replaces_bytes_and_text_and_leaves_no_temporary(folder: Path):
    p = folder / "f.bin"
    atomic_write(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    atomic_write(p, "h\u00e9")
    assert p.read_bytes() == "h\u00e9".encode()
    assert sorted(x.name for x in folder.iterdir()) == ["f.bin"]


def test_failure_keeps_the_old_file(folder: Path, monkeypatch: pytest.MonkeyPatch):
    p = folder / "keep.json"
    p.write_text("old", encoding="utf-8")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        atomic_write(p, "new")
    assert p.read_text(encoding="utf-8") == "old"
    assert [x.name for x in folder.iterdir()] == ["keep.json"]


def test_missing_folder_is_an_error_unless_mkdir(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "no" / "f", "x")
    assert atomic_write(tmp_path / "a" / "b" / "f", "x", mkdir=True).read_text(encoding="utf-8") == "x"


def test_a_directory_target_is_refused_and_cleaned_up(folder: Path):
    (folder / "d").mkdir()
    with pytest.raises(OSError):
        atomic_write(folder / "d", "x")
    assert [x.name for x in folder.iterdir()] == ["d"]


@posix_only
def test_exported_cache_file_is_world_readable(tmp_path: Path, umask):
    """The defect of issue 15: a shipped cache was 0600, unreadable by the service's user."""
    from tuner.runtime import CacheEntry, CacheKey, write_cache_file

    umask(0o022)
    key = CacheKey.make("k", "0" * 16, {"M": 1}, ["float32"], "cpu", {"python": "3"})
    out = tmp_path / "cache.json"
    write_cache_file(out, [CacheEntry(key, {"b": 1}, 1e-3, 0.0, "2026-01-01T00:00:00Z")])
    assert _mode(out) == 0o644


# Every place that renames a file over another: only the helper may (benchmarks included).
_ALLOWED = {"tuner/_atomic.py"}


def _callers_of_replace() -> list[str]:
    found = []
    for folder in ("tuner", "kernels", "search_spaces", "cost_models", "benchmarks"):
        for f in sorted((REPO / folder).rglob("*.py")):
            rel = f.relative_to(REPO).as_posix()
            if rel in _ALLOWED:
                continue
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("replace", "rename")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "os"
                ):
                    found.append(f"{rel}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    return found


def test_no_hand_written_atomic_writers():
    assert _callers_of_replace() == []


def test_a_device_pipe_or_socket_is_not_replaced_by_a_file(tmp_path: Path) -> None:
    """The rename put a plain file where /dev/stdout, /dev/null or a named pipe was (allowed to root, as
    in most containers: `tuner study export --out /dev/null` replaced the machine's /dev/null)."""
    import errno
    import stat

    folder = tmp_path / "w"
    folder.mkdir()
    fifo = folder / "pipe"
    os.mkfifo(fifo)
    link = folder / "link"
    link.symlink_to(fifo)
    for target in (fifo, link):
        with pytest.raises(OSError) as info:
            atomic_write(target, "x")
        assert info.value.errno == errno.EINVAL and str(target) in str(info.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in folder.iterdir()) == ["link", "pipe"]  # no temporary file left
