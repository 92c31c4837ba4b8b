"""Notes of timings that returned but whose marks a store outage kept this process from deleting.

Before each timing the claim's owner marks its config in the store (`ConfigCache.mark_measuring`) and
deletes the mark once the timing returns; a mark left by a process that has died since reads, to the next
owner of the key's claim, as a timing that killed its process (timed once more, then `crashed`) or, once
older than the lease, as a hang (never timed again). Where the store is down when the timing returns, the
mark cannot be deleted: the process retries while it lives (`_tuning._clean_later`), and notes here, in a
file of its own under `$TUNER_HOME/returned-marks/<store>/`, that the mark's timing returned, so that a
process that exits (or is killed) before the store is back does not leave its config taken for a crash or a
hang: `ConfigCache.hung_configs` deletes a noted mark without counting it. The note is a file named by
the mark's row id that holds the mark's owner (written whole: a temporary file renamed; removed by
unlink); a note excuses only a mark of that owner, as a row id can be another mark's later (SQLite reuses
the id of a deleted last row, a store made anew starts again at 1, and a note can outlive its mark where
its process died and the mark went another way: `cache prune`). A note that cannot be written (a
read-only home) is logged and the mark then reads as before. Seen by the processes that share this TUNER_HOME
(those of this host, as a rule); a mark of another host's process still reads as its hang once older than
the lease."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["note", "returned", "forget"]


def _folder(url: str) -> Path:
    from ..store import tuner_home

    return tuner_home() / "returned-marks" / hashlib.sha256(url.encode()).hexdigest()[:16]


def note(url: str, row_id: int, owner: str) -> None:
    """Note that the timing of mark `row_id` (of the claim's owner `owner`) in the store `url` returned."""
    from .._atomic import atomic_write

    try:
        folder = _folder(url)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / str(int(row_id)), owner)
    except OSError as exc:
        log.info("could not note that the timing of mark %d returned: %s", row_id, exc)


def returned(url: str, row_id: int, owner: str) -> bool:
    """Whether a process noted that the timing of mark `row_id` of `owner` in the store `url` returned (a
    note of another owner's mark that had this row id does not count)."""
    try:
        return (_folder(url) / str(int(row_id))).read_text(encoding="utf-8") == owner
    except (OSError, UnicodeDecodeError):
        return False


def forget(url: str, *row_ids: int) -> None:
    """Remove the notes of marks deleted from the store `url`."""
    for row_id in row_ids:
        with contextlib.suppress(OSError):
            (_folder(url) / str(int(row_id))).unlink(missing_ok=True)
