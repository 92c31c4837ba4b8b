"""Fenced writes: the measurements of a study's trials commit only while their writer holds the task.

A study worker holds its task through a lease on the task board (`tuner.studies`). A worker that is still
alive but whose lease was taken over (its heartbeat came late) must not add a measurement behind the new
holder: the new holder has already marked the old worker's unfinished trial abandoned, so that measurement
would belong to no counted trial (and the new holder may measure the same config again). While a worker
runs a task it installs a *guard* for the task's study (`guarding`); every write of a measurement of that
study into the same database (`ResultStore.record`) runs the guard first, in the write's own transaction.
The board's guard is an UPDATE of the task's row conditional on the worker's lease token, which holds the
row's lock until the write commits, so the write and a takeover (the claim's conditional UPDATE of that
row, which writes a new token) are serialised: either the measurement commits before the takeover (and
the new holder, which reads the measurements after its claim, tells the trial from it), or the guard
finds another token, raises `LeaseLost`, and nothing is written.

The guard lives in a context variable: the thread that runs the task (and code that copies its context)
sees it, other workers of the same process do not.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from ._engine import normalize_url

__all__ = ["LeaseLost", "WriteGuard", "guarding", "guard_for"]


class LeaseLost(RuntimeError):
    """This worker's lease on the task expired and another worker may hold it: stop working on it."""


@dataclass(frozen=True)
class WriteGuard:
    """Writes of study `study_name`'s measurements into the database `url` call `check(conn)` in their
    transaction first; it raises `LeaseLost` when the writer no longer holds the task."""

    url: str
    study_name: str
    check: Callable[[Connection], None]


_guard: contextvars.ContextVar[WriteGuard | None] = contextvars.ContextVar("tuner_write_guard", default=None)


@contextlib.contextmanager
def guarding(url: str, study_name: str, check: Callable[[Connection], None]) -> Iterator[WriteGuard]:
    """While inside, the measurements of `study_name` written to `url` (from this context) are fenced by
    `check`."""
    guard = WriteGuard(normalize_url(url), study_name, check)
    token = _guard.set(guard)
    try:
        yield guard
    finally:
        _guard.reset(token)


def guard_for(url: str, study_name: str | None) -> WriteGuard | None:
    """The guard that fences a write of `study_name`'s measurements into `url` (normalized, as
    `ResultStore.url` is) here, if any."""
    guard = _guard.get()
    if guard is None or study_name != guard.study_name or url != guard.url:
        return None
    return guard
