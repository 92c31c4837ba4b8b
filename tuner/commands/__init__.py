"""Subcommands of the `tuner` CLI, one module each."""

from __future__ import annotations

import os


def check_out_file(out: str, what: str) -> None:
    """Refuse an `--out FILE` that cannot name the file to write (exit 2, nothing written): empty, a folder,
    or something there that is not a regular file (a device such as /dev/stdout or /dev/null, a pipe, a
    socket). The file is written by renaming a new file over the path, so such a path was replaced by a
    plain file (run as root: /dev/null itself) or refused as a failure, with nothing written where meant."""
    from tuner._atomic import is_special
    from tuner.errors import BadInput

    if not out:
        raise BadInput(f"--out is empty; give the {what}'s path")
    if os.path.isdir(out):
        raise BadInput(f"--out {out} is a folder; give the {what}'s path")
    if is_special(out):
        raise BadInput(
            f"--out {out} is not a regular file (a device, pipe or socket); give the {what}'s path"
        )
