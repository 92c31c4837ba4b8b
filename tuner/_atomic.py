"""The one way tuner writes a file: atomically, with the permissions the user's umask gives.

`atomic_write(path, data)` writes `data` to a new file beside `path`, flushes it to disk and renames it over
`path`, so a reader sees the old file or the new one, never half of one, and a crash or a full disk leaves the
old file as it was; a path that is a device, pipe or socket is refused (`OSError` EINVAL), never replaced by a
file. An `OSError` it raises (the same kind, errno kept) names `path`. The new file is created with mode `0o666` filtered by the umask (0644 under the usual
umask 022), as `open(path, "w")` would: a shipped cache or report is readable by other users, unlike the
0600 of `tempfile.mkstemp`. Pass `mode=0o600` for a private file.

This module uses only the standard library and imports nothing from tuner, so every layer (the kernels and
the cost models included) may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write", "is_special", "make_folders", "remove_made_folders"]

# How often a write into a folder that another writer's failure removed (see `make_folders`) makes it again
_TRIES = 3


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    mode: int = 0o666,
    mkdir: bool = False,
    encoding: str = "utf-8",
) -> Path:
    """Replace `path` with `data` (bytes, or text encoded with `encoding`) atomically; returns the path.

    `mode` is filtered by the process umask, like `open()`. `mkdir=True` creates missing parent folders.
    On any error the temporary file is removed, `path` is left as it was and the folders this call made
    are removed again (while empty)."""
    p = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    _refuse_special(p)
    folder = p.parent
    made = make_folders(folder) if mkdir else []
    try:
        for tries_left in range(_TRIES - 1, -1, -1):
            try:
                _write(p, payload, mode)
                break
            except FileNotFoundError:
                # The folder was there and is gone: another writer whose write failed removed the empty
                # folder it had made (as this call does), between this call's making and its writing.
                if not mkdir or not tries_left or folder.is_dir():
                    raise
                made += make_folders(folder)
    except BaseException:
        remove_made_folders(made)  # a failed write leaves no new, empty folder behind
        raise
    return p


def is_special(path: str | os.PathLike[str]) -> bool:
    """Whether `path` holds something other than a file or a folder: a device such as /dev/null or
    /dev/stdout (directly or through a link), a pipe, a socket. False where nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _refuse_special(p: Path) -> None:
    """Such a path (`is_special`) is not replaced: the rename would put a plain file in its place (which
    only root may do in /dev, so a container running as root lost /dev/null). A folder: the rename fails
    and says so."""
    if is_special(p):
        raise OSError(
            errno.EINVAL,
            "not a regular file (a device, pipe or socket); not replaced, nothing written",
            str(p),
        )


def _write(p: Path, payload: bytes, mode: int) -> None:
    folder = p.parent
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:  # O_EXCL: never write into a file someone else made; a name clash just draws another name
        tmp = folder / f".{p.name[:200]}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, mode)  # the kernel applies the umask to `mode`
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise _naming(exc, p) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _naming(exc, p) from exc
        raise
    _fsync_folder(folder)


def make_folders(folder: str | os.PathLike[str]) -> list[Path]:
    """Create `folder` and its missing parents (as `mkdir -p`); returns the folders this call made, the
    outermost first, for `remove_made_folders` when what was to go into them could not be written.

    The folders are named from the current directory of this call (a relative `folder`), so a `chdir`
    before their removal cannot remove another folder of the same relative name. A folder above that
    another call removes meanwhile (its `remove_made_folders`) is made again."""
    top = Path(folder)
    if not top.is_absolute():
        top = Path(os.getcwd(), top)  # not os.path.abspath: `link/..` is the kernel's to resolve
    made: list[Path] = []
    try:
        for tries_left in range(_TRIES - 1, -1, -1):
            f = top
            missing = []
            while not f.is_dir() and f.parent != f:
                missing.append(f)
                f = f.parent
            try:
                for f in reversed(missing):
                    try:
                        f.mkdir()
                    except FileExistsError:  # another process made it meanwhile: not this call's to remove
                        if not f.is_dir():
                            raise
                        continue
                    made.append(f)
                return made
            except FileNotFoundError:  # a folder above, there a moment ago, was removed meanwhile
                if not tries_left:
                    raise
    except BaseException:
        remove_made_folders(made)
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def remove_made_folders(made: list[Path]) -> None:
    """Remove the folders `make_folders` made, the innermost first, while they are empty: one that another
    process has put a file into meanwhile stays, with those above it. Never raises."""
    for f in reversed(made):
        try:
            f.rmdir()
        except OSError:
            return


def _naming(exc: OSError, path: Path) -> OSError:
    """`exc` as the same kind of OSError naming `path`, the file that was not written (a write or fsync
    that failed for a full disk names no file at all, and a failed create the temporary one)."""
    return OSError(
        exc.errno, f"{exc.strerror or exc} (not written; a file already there is left as it was)", str(path)
    )


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
