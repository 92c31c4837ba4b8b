"""A process-wide setting that tuner changes only while it works, and puts back.

`SharedOverride(get, set, choose)` is a context manager factory: the first of any number of concurrent scopes
(in any thread) saves `get()` and sets `choose(saved)`; the last one to end sets `saved` back. Nested or
overlapping scopes therefore never restore each other's value, and the caller's own value comes back once
tuner is done (a value the caller sets meanwhile is overwritten then, as with any such setting).

`optuna_quiet()`: Optuna's verbosity at WARNING at least while tuner works (Optuna logs each study and trial
at INFO); every place in tuner that quiets Optuna uses this one override, so two of them that overlap (an
`optimize` in one thread, a TPE strategy built in another) never put back each other's value.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["SharedOverride", "import_apart", "optuna_quiet"]


class SharedOverride(Generic[T]):
    def __init__(self, get: Callable[[], T], set: Callable[[T], object], choose: Callable[[T], T]) -> None:
        self._get, self._set, self._choose = get, set, choose
        self._lock = threading.Lock()
        self._depth = 0  # scopes running
        self._saved: T | None = None  # the value before the first of them
        _overrides.add(self)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._saved = saved = self._get()
                self._set(self._choose(saved))
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._set(self._saved)  # type: ignore[arg-type]  # set at depth 0 above


_overrides: weakref.WeakSet[SharedOverride[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:  # a parent thread may have held a lock at the fork
    for o in list(_overrides):
        o._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def import_apart(name: str) -> ModuleType:
    """`importlib.import_module(name)`, run the first time in a short-lived thread of its own, so that the
    caller's frames are not among the import's.

    A module that keeps a traceback from its import (Optuna keeps the ImportError of each optional package
    it lacks, for the error it raises later) keeps the frames of that traceback alive, and each frame its
    caller (`f_back`): imported in the caller's thread, every frame on the stack at the time stays alive
    for good, with what it holds: the arrays or tensors a tuned call was given, a jax trace's tracers
    (`jax.checking_leaks` reports them), and on Python 3.12 and newer, where a finished generator's frame
    keeps the frame that last resumed it, the exception a tuning ended with, as well. In a thread of its
    own only that thread's few frames are kept. Where no thread can start (interpreter shutdown), or the
    import failed there, it is imported here, failing as a plain import does."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        t = threading.Thread(
            target=importlib.import_module, args=(name,), name=f"tuner-import-{name}", daemon=True
        )
        t.start()
        t.join()
    except RuntimeError:  # pragma: no cover - "can't create new thread at interpreter shutdown"
        pass
    return importlib.import_module(name)  # imported above: the module from sys.modules


def _optuna_verbosity() -> int:
    optuna = import_apart("optuna")  # first imported here on every tuning path (`optimize`)
    return int(optuna.logging.get_verbosity())


def _set_optuna_verbosity(v: int) -> None:
    import_apart("optuna").logging.set_verbosity(v)


# the caller's verbosity comes back after the last running scope (their own studies log as before)
optuna_quiet = SharedOverride(_optuna_verbosity, _set_optuna_verbosity, lambda v: max(v, logging.WARNING))
