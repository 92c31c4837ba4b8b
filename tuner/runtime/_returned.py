"""Notes of timings that returned but whose marks a store outage kept this process from deleting.

Before each timing the claim's owner marks its config in the store (`ConfigCache.mark_measuring`) and
deletes the mark once the timing returns; a mark left by a process that has died since reads, to the next
owner of the key's claim, as a timing that killed its process (timed once more, then `crashed`) or, once
older than the lease, as a hang (never timed again). Where the store is down when the timing returns, the
mark cannot be deleted: the process retries while it lives (`_tuning._clean_later`), and notes here, in a
file of its own under `$TUNER_HOME/returned-marks/<store>/`, that the mark's timing returned, so that a
process that exits (or is killed) before the store is back does not leave its config taken for a crash or a
hang: `ConfigCache.hung_configs` deletes a noted mark without counting it. The note is an empty file
named by the mark's row id (created whole, removed by unlink); a note that cannot be written (a read-only
home) is logged and the mark then reads as before. Seen by the processes that share this TUNER_HOME
(those of this host, as a rule); a mark of another host's process still reads as its hang once older than
the lease."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["note", "returned", "forget"]


def _folder(url: str) -> Path:
    from ..store import tuner_home

    return tuner_home() / "returned-marks" / hashlib.sha256(url.encode()).hexdigest()[:16]


def note(url: str, row_id: int) -> None:
    """Note that the timing of mark `row_id` in the store `url` returned."""
    try:
        folder = _folder(url)
        folder.mkdir(parents=True, exist_ok=True)
        os.close(os.open(folder / str(int(row_id)), os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError as exc:
        log.info("could not note that the timing of mark %d returned: %s", row_id, exc)


def returned(url: str, row_id: int) -> bool:
    """Whether a process noted that the timing of mark `row_id` in the store `url` returned."""
    try:
        return (_folder(url) / str(int(row_id))).exists()
    except OSError:
        return False


def forget(url: str, *row_ids: int) -> None:
    """Remove the notes of marks deleted from the store `url`."""
    for row_id in row_ids:
        with contextlib.suppress(OSError):
            (_folder(url) / str(int(row_id))).unlink(missing_ok=True)
