"""The loop of the suite's fork servers (tests/test_side_effects.py's ZYGOTE, tests/_retune_crash_worker.py's
`serve`): an interpreter that imported a stack once forks a child per request, so that each run pays for
the stack's import once, not per run, and still imports tuner fresh.

Requests are JSON lines on stdin ({"stdout": PATH, "stderr": PATH, "env": {...}, ...}); the parent answers
each with {"rc": EXIT CODE} once its child has ended, or {"refused": [...]} without forking while the
server holds a tuner module or a thread besides its main one (a child would not start from the state of a
fresh interpreter that imported the stack). End of stdin ends the server. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any


def fork_per_request() -> dict[str, Any]:
    """Serve until stdin ends (then exit); in each forked child, return its request, with stdin from
    /dev/null, stdout and stderr to the request's files and its `env` added to the environment."""
    while True:
        line = sys.stdin.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)
        held = sorted(m for m in sys.modules if m == "tuner" or m.startswith("tuner."))
        threads = [t.name for t in threading.enumerate()]
        if held or len(threads) != 1:
            sys.stdout.write(json.dumps({"refused": [held, threads]}) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            break
        status = os.waitpid(pid, 0)[1]
        sys.stdout.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        sys.stdout.flush()
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    os.environ.update(req["env"])
    return req
