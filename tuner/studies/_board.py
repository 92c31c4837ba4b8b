"""The task board: one row per study task in the study's database, with a lease.

A worker claims a task with one conditional UPDATE (`... WHERE id = :id AND (status = 'pending' OR
(status = 'running' AND lease_expires_at < :now))`). PostgreSQL takes a row lock for the UPDATE and, under
READ COMMITTED, re-evaluates the WHERE clause on the row a concurrent claimer has just committed, so the
second claimer matches nothing; SQLite serialises writers on the whole database. Either way exactly one
claimer sees `rowcount == 1`, so two workers never hold one task. The claim writes a fresh random token;
every later write of that worker (heartbeat, progress, done) is conditional on the token, so a worker
whose lease was taken over cannot touch the task any more and learns that it lost it.

Times are read from the database's clock, not the workers' clocks, so machines whose clocks disagree
still agree on when a lease expires.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, func, literal, literal_column, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from ..storage import (
    LeaseLost,
    NewFile,
    StoreConnectionLimit,
    StoreConnectionLost,
    StoreUnreachable,
    check_schema,
    engine_for,
    engine_of,
    ensure_schema,
    normalize_url,
    operation,
    read_only_url,
)
from ..storage import _engine as _store_engine
from ..storage._owner import HOST, local_dead_pid
from ..storage._schema import tasks_table
from ._spec import StudyError, StudyTask

log = logging.getLogger(__name__)

# The database's clock in seconds since the epoch, as SQL (the clock every lease is measured by).
_CLOCK_SQL = {
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}

__all__ = ["TaskBoard", "Claim", "TaskRow", "PENDING", "RUNNING", "DONE", "FAILED"]

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


@dataclass(frozen=True)
class Claim:
    """A task held by this worker until `lease_expires_at` (database clock) unless renewed."""

    row_id: int
    task: StudyTask
    token: str
    worker: str
    attempts: int
    spent_s: float
    # the worker whose task this was when its lease ran out, and that worker's last heartbeat's age (s)
    taken_from: str | None = None
    silent_s: float | None = None


def describe_worker(worker: str) -> str:
    """`host:pid:token` as `worker W (host H, process P)`; another form as it is."""
    parts = worker.split(":")
    if len(parts) >= 3 and parts[1].isdigit():
        return f"worker {worker} (host {parts[0]}, process {parts[1]})"
    return f"worker {worker}"


@dataclass(frozen=True)
class TaskRow:
    row_id: int
    key: str
    seq: int
    task: StudyTask
    status: str
    worker: str | None
    lease_expires_at: float | None
    attempts: int
    trials_done: int
    best_value: float | None
    best_config: dict[str, Any] | None
    spent_s: float
    started_at: float | None
    finished_at: float | None
    error: str | None
    result: dict[str, Any] | None


def make_engine(url: str) -> Engine:
    """The shared engine of `url` (tuner.storage's one engine factory)."""
    return engine_for(url)


def retry(fn: Any, *, what: str, attempts: int = 6) -> Any:
    """Run `fn()`; on a database error wait and retry (schema creation races between workers that start
    together on an empty database, SQLite 'database is locked', a connection the server ended, a server
    that is restarting). Not a connection limit: the engine has waited `TUNER_PG_CONNECT_WAIT` for a
    slot already (`StoreConnectionLimit`)."""
    for i in range(attempts):
        t0 = time.monotonic()
        try:
            return fn()
        except (SQLAlchemyError, StoreConnectionLost, StoreUnreachable) as exc:
            if i == attempts - 1 or isinstance(exc, StoreConnectionLimit):
                raise
            first = str(exc).splitlines()[0]
            waited = time.monotonic() - t0
            if "locked" in first and waited >= _store_engine.SQLITE_TIMEOUT_S / 2:
                # SQLite's busy timeout ran out: another process held the write lock all along (a lock
                # lost at once to a concurrent writer, SQLITE_BUSY_SNAPSHOT, is routine and stays INFO)
                log.warning(
                    "%s: %s after %.0f s: another process held the store's write lock all that time (a "
                    "stopped or hung process of this store?); retrying",
                    what,
                    first,
                    waited,
                )
            else:
                log.info("%s: %s; retrying", what, first)
            time.sleep(0.2 * 2**i)
    return None  # pragma: no cover


class TaskBoard:
    """The lease table of the studies in one database (SQLite or PostgreSQL URL)."""

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        # A SQLite store in a folder that cannot be written (a read-only mount, an archived study) is opened
        # read-only, as the results store opens it: `rows` and `studies` read it, every write fails.
        ro_url = read_only_url(self.url)
        self.read_only = ro_url is not None
        new = NewFile.before_opening(self.url)  # removed again if no store could be made of it
        try:
            self.engine = engine_for(ro_url or self.url)
            with operation("opening the task board"):
                if ro_url is not None:
                    check_schema(self.engine, self.url)
                else:
                    ensure_schema(
                        self.engine
                    )  # the board is one table of the store's schema, migrated with it
        except BaseException:
            if new is not None:
                new.remove_if_empty(engine_of(self.url))
            raise

    def close(self) -> None:
        """Nothing to free: the engine is this process's shared engine of the URL (`tuner.storage`)."""

    # ---- clock -------------------------------------------------------------------------------------
    def _now(self, conn: Connection) -> float:
        clock = _CLOCK_SQL.get(conn.dialect.name)
        if clock is None:
            return time.time()
        return float(conn.execute(text(f"SELECT {clock}")).scalar_one())

    def _now_sql(self, conn: Connection) -> ColumnElement[float]:
        """The database's clock as read by the statement that uses it, when it runs: after its wait for
        the write lock (SQLite) or the row's lock (PostgreSQL), not before it as `_now` in the same
        transaction. A lease renewed or claimed at that time lasts its full length from then on."""
        clock = _CLOCK_SQL.get(conn.dialect.name)
        if clock is None:
            return literal(time.time(), Float)
        return literal_column(clock, Float)

    def now(self) -> float:
        with self.engine.connect() as conn:
            return self._now(conn)

    # ---- registration ------------------------------------------------------------------------------
    def ensure(self, tasks: Sequence[StudyTask]) -> dict[str, int]:
        """Insert the tasks that are not on the board yet (concurrent callers are fine). A task whose
        description changed is updated; if its trial budget grew past what it has done, it is reopened."""
        with operation(f"registering the tasks of study {tasks[0].study if tasks else ''}"):
            return retry(lambda: self._ensure(tasks), what="registering tasks")

    def _ensure(self, tasks: Sequence[StudyTask]) -> dict[str, int]:
        counts = {"added": 0, "updated": 0, "reopened": 0}
        if not tasks:
            return counts
        study = tasks[0].study
        with self.engine.begin() as conn:
            existing = {
                r.key: r for r in conn.execute(select(tasks_table).where(tasks_table.c.study == study))
            }
        clash = [
            (t, existing[t.key]) for t in tasks if t.key in existing and _device_clash(existing[t.key], t)
        ]
        if clash:  # checked before anything is written: a refused run changes nothing
            first, was = clash[0]
            raise StudyError(
                device_clash_message(study, first.key, was.spec["device"], first.device, len(clash))
            )
        for t in tasks:
            spec = _stored_spec(t)
            row = existing.get(t.key)
            if row is not None and (row.spec or {}).get("retries"):
                spec["retries"] = row.spec["retries"]  # the board's, not the file's
            if row is None:
                ins = self._insert_ignore().values(
                    study=t.study,
                    key=t.key,
                    seq=t.seq,
                    spec=spec,
                    status=PENDING,
                    attempts=0,
                    trials_done=0,
                    spent_s=0.0,
                )
                with self.engine.begin() as conn:
                    counts["added"] += conn.execute(ins).rowcount or 0
                continue
            if row.spec == spec:
                continue
            values: dict[str, Any] = {"spec": spec, "seq": t.seq}
            cond = tasks_table.c.id == row.id
            if row.status == DONE and _budget_grew(row, t):
                values.update(status=PENDING, worker=None, lease_token=None, lease_expires_at=None)
                cond = cond & (tasks_table.c.status == DONE)
                counts["reopened"] += 1
            with self.engine.begin() as conn:
                conn.execute(update(tasks_table).where(cond).values(**values))
            counts["updated"] += 1
        return counts

    def _insert_ignore(self) -> Any:
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(tasks_table).on_conflict_do_nothing(index_elements=["study", "key"])
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(tasks_table).on_conflict_do_nothing(index_elements=["study", "key"])
        return tasks_table.insert()

    def retry_failed(self, study: str) -> int:
        """Put the failed tasks of `study` back in the queue, each as a new attempt: its `retries` (in the
        stored spec) grows by one, so it runs in an Optuna study of its own, seeded with the earlier
        attempts' successes when claimed (`tuner.studies._retry`), and its time budget starts again. Each
        row is put back by one conditional UPDATE (still failed, claimed no more times than when read), so
        runs of `--retry-failed` at the same moment add one attempt, not one each."""
        with operation(f"putting the failed tasks of study {study} back"):
            return int(retry(lambda: self._retry_failed(study), what="putting failed tasks back"))

    def _retry_failed(self, study: str) -> int:
        c = tasks_table.c
        with self.engine.begin() as conn:
            failed = conn.execute(
                select(c.id, c.spec, c.attempts).where((c.study == study) & (c.status == FAILED))
            ).all()
        n = 0
        for r in failed:
            spec = {**(r.spec or {}), "retries": int((r.spec or {}).get("retries") or 0) + 1}
            with self.engine.begin() as conn:
                res = conn.execute(
                    update(tasks_table)
                    .where((c.id == r.id) & (c.status == FAILED) & (c.attempts == r.attempts))
                    .values(
                        status=PENDING,
                        spec=spec,
                        error=None,
                        worker=None,
                        lease_token=None,
                        trials_done=0,
                        spent_s=0.0,
                    )
                )
                n += int(res.rowcount or 0)
        return n

    # ---- leases ------------------------------------------------------------------------------------
    def claim(self, study: str, worker: str, lease_s: float) -> Claim | None:
        """Take the first task (in run order) that is pending or whose lease has expired; None if none."""
        with operation(f"claiming a task of study {study}"):
            return retry(lambda: self._claim(study, worker, lease_s), what="claiming a task")

    def _claim(self, study: str, worker: str, lease_s: float) -> Claim | None:
        c = tasks_table.c
        with self.engine.begin() as conn:
            now = self._now(conn)
            candidates = (
                conn.execute(
                    select(c.id)
                    .where(
                        (c.study == study)
                        & ((c.status == PENDING) | ((c.status == RUNNING) & (c.lease_expires_at < now)))
                    )
                    .order_by(c.seq)
                    .limit(16)
                )
                .scalars()
                .all()
            )
            # A task held by a worker of this host whose process is gone is taken over at once.
            dead = {
                r.id: r.lease_token
                for r in conn.execute(
                    select(c.id, c.worker, c.lease_token).where(
                        (c.study == study) & (c.status == RUNNING) & c.worker.like(f"{HOST}:%")
                    )
                )
                if local_dead_pid(r.worker) is not None
            }
        for row_id in list(dead) + [i for i in candidates if i not in dead]:
            token = uuid.uuid4().hex
            with self.engine.begin() as conn:
                now = self._now(conn)
                free = (c.status == PENDING) | ((c.status == RUNNING) & (c.lease_expires_at < now))
                if row_id in dead:
                    free = free | ((c.status == RUNNING) & (c.lease_token == dead[row_id]))
                # for the log line only: who held it, and when that holder's heartbeat last came
                was, held_by, beat = conn.execute(
                    select(c.status, c.worker, c.heartbeat_at).where(c.id == row_id)
                ).one()
                res = conn.execute(
                    update(tasks_table)
                    .where((c.id == row_id) & free)
                    .values(
                        status=RUNNING,
                        worker=worker,
                        lease_token=token,
                        lease_expires_at=self._now_sql(conn) + lease_s,
                        heartbeat_at=self._now_sql(conn),
                        attempts=c.attempts + 1,
                        started_at=func.coalesce(c.started_at, now),
                        error=None,
                    )
                )
                if res.rowcount != 1:
                    continue  # another worker was faster
                row = conn.execute(select(tasks_table).where(c.id == row_id)).one()
            task = StudyTask.from_dict({**row.spec, "storage": self.url})
            taken_from = held_by if was == RUNNING and held_by else None
            silent = now - beat if taken_from and beat is not None else None
            if row_id in dead:
                log.warning(
                    "worker %s took over task %s: its worker's process is gone (%s)",
                    worker,
                    task.key,
                    describe_worker(str(held_by)),
                )
            elif row.attempts > 1 and was == RUNNING:  # its lease ran out
                # The holder's heartbeat stopped: its process is stopped (SIGSTOP, a debugger), hangs in
                # code that holds the GIL, or its host is down or cut off; from here this one can only
                # tell that it stopped renewing, whichever host it runs on.
                log.warning(
                    "worker %s took over task %s (attempt %d) from %s: %s and its lease ran out (the "
                    "process is stopped or hung, or its host is down or cut off); its trial in flight is "
                    "marked abandoned and run again here, and that worker, should it go on, finds the task "
                    "taken over and writes nothing more to it",
                    worker,
                    task.key,
                    row.attempts,
                    describe_worker(str(held_by)) if held_by else "its earlier worker",
                    f"no heartbeat for {silent:.0f} s" if silent is not None else "its heartbeat stopped",
                )
            elif row.attempts > 1:  # handed back, or put back by --retry-failed: nobody else holds it
                log.info("worker %s resumes task %s (attempt %d)", worker, task.key, row.attempts)
            return Claim(
                row.id,
                task,
                token,
                worker,
                int(row.attempts),
                float(row.spent_s or 0.0),
                taken_from=taken_from,
                silent_s=silent,
            )
        return None

    def hold(self, conn: Connection, claim: Claim) -> None:
        """Inside the caller's transaction on this database: check that `claim` still holds its task, and
        keep the task's row locked until that transaction ends (an UPDATE of its heartbeat), so that a
        takeover (the claim's UPDATE of the row, which writes a new token) either waits for the caller's
        transaction or has already happened; `LeaseLost` in the latter case. The guard of a study
        worker's measurement writes (`tuner.storage.guarding`).

        A lease that ran out but that nobody took over still holds: a write under it is read by whoever
        takes the task over next (after its claim), so nothing is lost or orphaned; the lease itself is
        not extended here (the heartbeat and the per-trial renewal decide whether the worker goes on)."""
        now = self._now(conn)
        res = conn.execute(update(tasks_table).where(self._held(claim)).values(heartbeat_at=now))
        if res.rowcount != 1:
            raise LeaseLost(
                f"lease of task {claim.task.key} lost (taken over by another worker): its measurement is not "
                "stored"
            )

    def _held(self, claim: Claim) -> Any:
        c = tasks_table.c
        return (c.id == claim.row_id) & (c.lease_token == claim.token) & (c.status == RUNNING)

    def renew(
        self,
        claim: Claim,
        lease_s: float,
        *,
        spent_add: float = 0.0,
        trials_done: int | None = None,
        best_value: float | None = None,
        best_config: dict[str, Any] | None = None,
    ) -> bool:
        """Extend the lease (and record progress). False: the lease is no longer ours. Run once more on a
        new connection when the server ended the connection under its statement (nothing was written);
        after a cut COMMIT it is not (its `spent_add` may have been added), and the caller's next renewal
        goes on."""
        args = (claim, lease_s, spent_add, trials_done, best_value, best_config)
        try:
            return self._renew(*args)
        except StoreConnectionLost as exc:
            if exc.commit_unknown:
                raise
            log.info("renewing the lease of task %s: %s; retrying", claim.task.key, str(exc).splitlines()[0])
            return self._renew(*args)

    def _renew(
        self,
        claim: Claim,
        lease_s: float,
        spent_add: float,
        trials_done: int | None,
        best_value: float | None,
        best_config: dict[str, Any] | None,
    ) -> bool:
        c = tasks_table.c
        with operation(f"renewing the lease of task {claim.task.key}"), self.engine.begin() as conn:
            # `now` (read before the UPDATE waits for its lock) decides whether the lease still held when
            # the renewal began; the new lease runs from when it is written (`_now_sql`). Was: from `now`,
            # so that a renewal that waited for the write lock (a long write transaction of this process
            # or another) wrote a lease that had run out already, and the next one found it lost.
            now = self._now(conn)
            values: dict[str, Any] = {
                "lease_expires_at": self._now_sql(conn) + lease_s,
                "heartbeat_at": self._now_sql(conn),
                "spent_s": c.spent_s + spent_add,
            }
            if trials_done is not None:
                values["trials_done"] = trials_done
            if best_value is not None and math.isfinite(best_value):
                values["best_value"] = best_value
                values["best_config"] = best_config
            res = conn.execute(
                update(tasks_table).where(self._held(claim) & (c.lease_expires_at >= now)).values(**values)
            )
            return res.rowcount == 1

    def finish(
        self,
        claim: Claim,
        status: str,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        trials_done: int | None = None,
        best_value: float | None = None,
        best_config: dict[str, Any] | None = None,
        spent_add: float = 0.0,
    ) -> bool:
        """Mark the held task done / failed (or `pending` to hand it back). False: it was not ours any more.

        Retried on a new connection when the server ends the connection under it (or SQLite is locked):
        the UPDATE applies only under the claim's lease token, so it takes effect once. A retry that finds
        the task already marked so by this claim (a cut COMMIT that took effect: the token is cleared, the
        attempt number is still the claim's) returns True."""
        tries: list[int] = []

        def once() -> bool:
            tries.append(1)
            return self._finish(
                claim,
                status,
                again=len(tries) > 1,
                result=result,
                error=error,
                trials_done=trials_done,
                best_value=best_value,
                best_config=best_config,
                spent_add=spent_add,
            )

        return bool(retry(once, what=f"marking task {claim.task.key} {status}"))

    def _finish(
        self,
        claim: Claim,
        status: str,
        *,
        again: bool,
        result: dict[str, Any] | None,
        error: str | None,
        trials_done: int | None,
        best_value: float | None,
        best_config: dict[str, Any] | None,
        spent_add: float,
    ) -> bool:
        c = tasks_table.c
        with operation(f"marking task {claim.task.key} {status}"), self.engine.begin() as conn:
            now = self._now(conn)
            values: dict[str, Any] = {
                "status": status,
                "lease_token": None,
                "lease_expires_at": None,
                "spent_s": c.spent_s + spent_add,
            }
            if status != PENDING:
                values["finished_at"] = now
            else:
                values["worker"] = None
            if result is not None:
                values["result"] = result
            if error is not None:
                values["error"] = error[:4000]
            if trials_done is not None:
                values["trials_done"] = trials_done
            if best_value is not None and math.isfinite(best_value):
                values["best_value"] = best_value
                values["best_config"] = best_config
            res = conn.execute(update(tasks_table).where(self._held(claim)).values(**values))
            if res.rowcount == 1:
                return True
            if not again:
                return False
            row = conn.execute(
                select(c.status, c.lease_token, c.attempts, c.worker).where(c.id == claim.row_id)
            ).first()
            return (
                row is not None
                and row.status == status
                and row.lease_token is None
                and int(row.attempts) == claim.attempts
                and (status == PENDING or row.worker == claim.worker)
            )

    def release(self, study: str, worker: str) -> int:
        """Hand back every task of `study` that `worker` holds (as `finish(claim, PENDING)` does), without
        its claim: for a worker interrupted where it may hold a claim it has not got hold of (right after
        the claim's commit). Returns how many were handed back."""
        c = tasks_table.c
        with operation(f"handing back the tasks of worker {worker}"), self.engine.begin() as conn:
            res = conn.execute(
                update(tasks_table)
                .where((c.study == study) & (c.worker == worker) & (c.status == RUNNING))
                .values(status=PENDING, worker=None, lease_token=None, lease_expires_at=None)
            )
            return int(res.rowcount or 0)

    def take_from(self, row_id: int, worker_from: str, worker: str, lease_s: float) -> Claim | None:
        """Take the running task `row_id` over from `worker_from`, whose process the caller killed (the
        study runner, of its own stuck worker process): a claim of it for `worker`, or None when
        `worker_from` no longer holds it (it finished it, or another worker took it over)."""
        c = tasks_table.c
        token = uuid.uuid4().hex
        with operation("taking a task over"), self.engine.begin() as conn:
            now = self._now_sql(conn)
            res = conn.execute(
                update(tasks_table)
                .where((c.id == row_id) & (c.worker == worker_from) & (c.status == RUNNING))
                .values(worker=worker, lease_token=token, lease_expires_at=now + lease_s, heartbeat_at=now)
            )
            if res.rowcount != 1:
                return None
            row = conn.execute(select(tasks_table).where(c.id == row_id)).one()
        task = StudyTask.from_dict({**row.spec, "storage": self.url})
        return Claim(row.id, task, token, worker, int(row.attempts), float(row.spent_s or 0.0))

    def beats(self, study: str) -> tuple[float, list[tuple[int, str, str | None, float | None]]]:
        """The database's clock now, and (row id, status, worker, last renewal) of each task of `study`:
        what the study runner watches its worker processes' heartbeats by."""
        c = tasks_table.c
        with operation(f"reading the task board of study {study}"), self.engine.connect() as conn:
            now = self._now(conn)
            rs = conn.execute(
                select(c.id, c.status, c.worker, c.heartbeat_at).where(c.study == study).order_by(c.seq)
            ).all()
        return now, [(int(r.id), str(r.status), r.worker, r.heartbeat_at) for r in rs]

    # ---- reading -----------------------------------------------------------------------------------
    def rows(self, study: str) -> list[TaskRow]:
        c = tasks_table.c
        with operation(f"reading the task board of study {study}"), self.engine.connect() as conn:
            rs = conn.execute(select(tasks_table).where(c.study == study).order_by(c.seq)).all()
        return [_row(r) for r in rs]

    def studies(self) -> list[str]:
        with self.engine.connect() as conn:
            return sorted(conn.execute(select(tasks_table.c.study).distinct()).scalars().all())


def _device_clash(row: Any, t: StudyTask) -> bool:
    """Whether the board's task `row` was measured (or is being measured) on another device than `t` is
    for: trials of two devices must not mix in one task (its winner would be either device's). A task
    that nothing has run yet takes the new description, as any other change."""
    device = (row.spec or {}).get("device")
    if device is None or device == t.device:
        return False
    return row.status != PENDING or (row.trials_done or 0) > 0


def device_clash_message(study: str, key: str, registered: str, here: str, n: int = 1) -> str:
    more = f" (and {n - 1} more task(s))" if n > 1 else ""
    return (
        f"study {study}: task {key}{more} is measured on device {registered}, and this run is for {here}; "
        "trials of different devices do not mix in one task: give each kind of device a study of its own "
        "(another `name` in the study file, or another storage)"
    )


def _stored_spec(t: StudyTask) -> dict[str, Any]:
    """The task as kept on the board: without the storage URL (it may hold a password, and every worker
    reaches the board through its own URL)."""
    d = t.to_dict()
    d.pop("storage", None)
    return d


def _row(r: Any) -> TaskRow:
    return TaskRow(
        r.id,
        r.key,
        r.seq,
        StudyTask.from_dict(r.spec),
        r.status,
        r.worker,
        r.lease_expires_at,
        int(r.attempts or 0),
        int(r.trials_done or 0),
        r.best_value,
        r.best_config,
        float(r.spent_s or 0.0),
        r.started_at,
        r.finished_at,
        r.error,
        r.result,
    )


def _budget_grew(row: Any, t: StudyTask) -> bool:
    old = row.spec or {}
    if t.budget is not None and (old.get("budget") is None or t.budget > int(old.get("budget") or 0)):
        return t.budget > int(row.trials_done or 0)
    if t.time_budget_s is not None and old.get("time_budget_s") is not None:
        return t.time_budget_s > float(old["time_budget_s"]) and t.budget is None
    return False


def summarize(rows: Iterable[TaskRow]) -> dict[str, int]:
    out = {PENDING: 0, RUNNING: 0, DONE: 0, FAILED: 0}
    for r in rows:
        out[r.status] = out.get(r.status, 0) + 1
    return out
