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


def kernel_hint(kernel: str, names: list[str], *, holds: str = "it holds") -> str:
    """What to say when `--kernel KERNEL` selected nothing from a store or file holding the kernels
    `names`: those that end in KERNEL or contain it, else all (a decorated function is stored as
    module.qualname, so `--kernel scale` does not select `mypkg.ops.scale`). Empty when KERNEL is
    among them or there are none. `holds` leads the list of all (`they hold` for the recorded misses)."""
    if not names or kernel in names:
        return ""
    low = kernel.lower()
    like = [n for n in names if n.rsplit(".", 1)[-1] == kernel or low in n.lower()]
    shown = like or names
    listed = ", ".join(shown[:5]) + (f", ... ({len(shown)} in all)" if len(shown) > 5 else "")
    lead = f"did you mean {listed}?" if like else f"{holds} {listed}"
    return f"{lead} (a decorated function is named module.qualname, or by its name=)"
