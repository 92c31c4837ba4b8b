"""The client-side deadline of `_watchdog` on psycopg 3 connections.

psycopg 3 takes no connection class as a connect argument (psycopg2's `connection_factory`), so the engines
that ask for the deadline (`engine_kwargs`: a psycopg 3 URL with a statement timeout) load the SQLAlchemy
plugin `Psycopg3Deadline`, which makes each of their connections a `GuardedPsycopg3Connection`. Every call
of such a connection that waits for the server goes through its `wait` (a cursor's statements and fetches,
a commit, a rollback), and is watched there. Imported only where psycopg 3 is used.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import URL, CreateEnginePlugin, Engine

from ._engine import connect_waiting
from ._watchdog import Guarded, UnansweredCall, _call

__all__ = ["GuardedPsycopg3Connection", "Psycopg3Deadline", "UnansweredPsycopg3"]


class UnansweredPsycopg3(UnansweredCall, psycopg.OperationalError):
    """An unanswered call of a psycopg 3 connection (a psycopg `OperationalError`)."""


class GuardedPsycopg3Connection(Guarded, psycopg.Connection[Any]):
    """A psycopg 3 connection whose every call that waits for the server is cut off after `deadline_s`
    of the statement timeout it asked for (`-c statement_timeout=...` in its options); none without one."""

    tuner_errors = psycopg.Error
    tuner_unanswered_error = UnansweredPsycopg3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tuner_guard(self.info.options)

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        return _call(self, "statement", super().wait, gen, *args, **kwargs)

    def commit(self) -> None:  # waits through `wait`, inside this call
        _call(self, "commit", super().commit)

    def rollback(self) -> None:
        _call(self, "rollback", super().rollback)


def _connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> GuardedPsycopg3Connection:
    # tried again while the server refuses it for a connection limit, as every engine of tuner's
    return connect_waiting(lambda: GuardedPsycopg3Connection.connect(*cargs, **cparams))


class Psycopg3Deadline(CreateEnginePlugin):
    """The SQLAlchemy plugin (`plugins=[_engine.PG3_DEADLINE_PLUGIN]` in `create_engine`'s arguments) whose engine connects
    through `GuardedPsycopg3Connection`; on an engine of another driver it does nothing."""

    def update_url(self, url: URL) -> URL:  # the URL names no plugin: nothing to take out of it
        return url

    def engine_created(self, engine: Engine) -> None:
        if engine.dialect.driver == "psycopg" and not engine.dialect.is_async:
            event.listen(engine, "do_connect", _connect)
