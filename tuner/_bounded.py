"""Reading files someone else wrote, with a bound on what they can cost: the file's size and, for gzip,
the size it expands to (a 1 MB gzip can expand to gigabytes). Decompression streams and stops one byte
past the limit, so memory stays within the limit whatever the file claims."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

__all__ = ["InputTooLarge", "read_bounded", "MAX_TABLE_BYTES", "GZIP_MAGIC"]

GZIP_MAGIC = b"\x1f\x8b"
# Recorded measurement tables (Kernel Tuner cache files): the largest of the public brute-forced spaces
# expands to about 17 MB; 256 MiB leaves room for far bigger spaces and bounds a hostile file.
MAX_TABLE_BYTES = 256 * 2**20
_CHUNK = 1 << 20


class InputTooLarge(OSError):
    """The file, or what it decompresses to, is over the limit (an OSError: a file that cannot be read)."""


def read_bounded(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of `path`, gunzipped when it starts with the gzip magic number; `InputTooLarge` when the
    file or its decompressed content is over `limit` bytes (default `MAX_TABLE_BYTES`). Other read errors
    are OSError, EOFError or zlib.error, as from `gzip` itself."""
    limit = MAX_TABLE_BYTES if limit is None else limit
    p = Path(path)
    size = p.stat().st_size
    if size > limit:
        raise InputTooLarge(f"{p} is {size} bytes, over the limit of {limit} bytes")
    with open(p, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != GZIP_MAGIC:
            return f.read(limit + 1)  # the size was checked; a file growing meanwhile is cut here
        parts: list[bytes] = []
        total = 0
        with gzip.GzipFile(fileobj=f) as g:
            while True:
                chunk = g.read(min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                parts.append(chunk)
                total += len(chunk)
                if total > limit:
                    raise InputTooLarge(f"{p} decompresses to more than the limit of {limit} bytes")
    return b"".join(parts)
