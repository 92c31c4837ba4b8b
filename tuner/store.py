"""The results store: every measurement with its full task context, in SQLAlchemy.

SQLite file by default (`$TUNER_HOME/tuner.db`, or `$TUNER_STORAGE` as a URL), PostgreSQL by URL for a
fleet of workers. Optuna's own studies live in the same database (`optuna_storage()`), so Optuna's tools
(optuna-dashboard) read it as it is. Tables of tuner are prefixed `tuner_`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner._settings import text

from .storage import (
    SCHEMA_VERSION,
    NewFile,
    StoreConnectionLimit,
    StoreConnectionLost,
    StoreCorrupt,
    StoreError,
    StoreTimeout,
    StoreUnreachable,
    Vacuumed,
    check_schema,
    disk_full_in,
    engine_for,
    engine_of,
    ensure_schema,
    guard_for,
    locked_read_only_url,
    normalize_url,
    operation,
    read_only_url,
    redact,
    sqlite_path,
    sqlite_url,
    vacuum,
)
from .storage import optuna_storage as _optuna_storage
from .storage._engine import require_text
from .storage._schema import MeasurementRow

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from tuner.search_spaces import SearchSpace

    from ._optimize import Trial

log = logging.getLogger(__name__)

# The prior a miss loads: the newest measurements of the kernel, bounded so that a miss costs the same
# with 10 or 10,000 stored keys (benchmarks/miss_scaling.py).
DEFAULT_PRIOR_ROWS = 2000
DEFAULT_PRIOR_TASKS = 8

__all__ = [
    "ResultStore",
    "StoreConnectionLimit",
    "StoreConnectionLost",
    "StoreCorrupt",
    "StoreError",
    "StoreTimeout",
    "StoreUnreachable",
    "TaskContext",
    "TrialCheck",
    "Measurement",
    "Vacuumed",
    "MeasurementRow",
    "SCHEMA_VERSION",
    "default_storage_url",
    "normalize_url",
    "tuner_home",
]


def tuner_home() -> Path:
    """`$TUNER_HOME`, default `~/.cache/tuner`. Holds the default SQLite store.

    OSError, naming TUNER_HOME, where it is not set and the user has no home folder: HOME unset and no
    entry for this user id in the password database (a container run as an arbitrary uid, a CI sandbox),
    or a relative HOME. The runtime then runs without a store (warned once), the CLI exits 1 with the line,
    as for a home that cannot be written. The same for a home that is not text in this locale (`hömé`
    under `LC_ALL=C PYTHONUTF8=0`): its store's URL cannot be written."""
    home = text("TUNER_HOME")
    if home:
        return Path(require_text(home, "TUNER_HOME"))
    try:
        user = Path.home()
    except RuntimeError:  # pathlib's "Could not determine home directory."
        why = f"HOME is not set and user id {os.getuid()} has no entry in the password database"
    else:
        if user.is_absolute():
            return Path(require_text(str(user / ".cache" / "tuner"), "tuner's home (TUNER_HOME unset)"))
        why = f"HOME is not an absolute path ({str(user)!r})"
    raise OSError(f"no folder for tuner's store: {why}; set TUNER_HOME to a folder this user can write")


def default_storage_url(*, create: bool = True) -> str:
    """`$TUNER_STORAGE` if set, else `sqlite:///$TUNER_HOME/tuner.db`, making `$TUNER_HOME` unless
    `create` is False (a reader, which must leave no folder behind)."""
    url = text("TUNER_STORAGE")
    if url:
        return url
    home = tuner_home()
    if create:
        home.mkdir(parents=True, exist_ok=True)
    return sqlite_url(home / "tuner.db")


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class TaskContext:
    """What a measurement belongs to: the kernel, the problem, the device and the software versions."""

    kernel: str = "objective"
    problem: Mapping[str, Any] = field(default_factory=dict)
    device: str = "unknown"
    versions: Mapping[str, str] = field(default_factory=dict)
    dtype: str = ""

    @property
    def task_id(self) -> str:
        blob = _canon(
            {
                "k": self.kernel,
                "p": dict(self.problem),
                "d": self.device,
                "v": dict(self.versions),
                "t": self.dtype,
            }
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Measurement:
    task_id: str
    kernel: str
    space_fingerprint: str
    problem: dict[str, Any]
    dtype: str
    device: str
    versions: dict[str, Any]
    config: dict[str, Any]
    value: float | None
    status: str
    stats: dict[str, Any]
    error: str | None
    study_name: str | None
    created_at: dt.datetime


@dataclass(frozen=True)
class TrialCheck:
    """How the counted trials of a study and its stored measurements disagree (`ResultStore.check_trials`):
    the numbers of counted trials without a measurement, and the number of measurements without a counted
    trial. Both empty: consistent."""

    unmeasured: tuple[int, ...] = ()
    unmatched_measurements: int = 0

    @property
    def consistent(self) -> bool:
        return not self.unmeasured and not self.unmatched_measurements


class ResultStore:
    """SQLAlchemy-backed store of measurements. `url=None` uses `default_storage_url()`."""

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        self.url = normalize_url(url or default_storage_url())
        # A new SQLite file that this call makes and cannot make a store of (a full disk) is removed again
        new = NewFile.before_opening(self.url) if create else None
        try:
            self._open(create, new)
        except BaseException:
            if new is not None:
                new.remove_if_empty(engine_of(self.url))
            raise
        self._optuna_storage: optuna.storages.BaseStorage | None = None

    def _open(self, create: bool, new: NewFile | None) -> None:
        # A SQLite store in a folder that cannot be written is opened read-only: its entries still hit,
        # and a write fails with a StoreError (the runtime then keeps the result in memory).
        ro_url = read_only_url(self.url)
        self.read_only = ro_url is not None
        try:
            self.engine = engine_for(ro_url or self.url)
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot open store {self._redacted()}: {exc.__class__.__name__}: {exc}"
            ) from exc
        # Set when the store was opened read-only because its disk is full: why, in one line.
        self.full_disk: str | None = None
        try:
            with operation("opening the store"):
                if self.read_only:
                    check_schema(self.engine, self.url)
                    log.info("store %s: its folder cannot be written; opened read-only", self._redacted())
                elif create:
                    ensure_schema(self.engine)
        except StoreError as exc:
            # A full disk: SQLite cannot even open a WAL store to read it (its `-shm` file cannot grow),
            # so every stored winner was unseen and tuned again. Read the file as it is instead; not a
            # file this call made (it holds nothing to read).
            path = sqlite_path(self.url)
            if new is not None or path is None or path.startswith("file:") or not os.path.isfile(path):
                raise
            if os.path.getsize(path) == 0 or not disk_full_in(path, exc):
                raise
            # read through SQLite's locks (another process may still write it), or as it is while
            # SQLite cannot map its -shm (`locked_read_only_url`)
            self.engine = engine_for(locked_read_only_url(path))
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            with operation("opening the store"):
                check_schema(self.engine, self.url, disk_full=True)
            self.read_only, self.full_disk = True, str(exc)
            log.info("store %s: its disk is full; opened read-only", self._redacted())

    def _redacted(self) -> str:
        return redact(self.url)

    def __repr__(self) -> str:
        return f"ResultStore({self._redacted()!r})"

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success, rolls back on any error, and turns driver errors into
        StoreError."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as exc:
            s.rollback()
            raise StoreError(f"store {self._redacted()}: {exc.__class__.__name__}: {exc}") from exc
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def optuna_storage(self) -> optuna.storages.BaseStorage:
        """Optuna's RDBStorage on the same database (its tables created on first use, under the schema
        lock)."""
        if self._optuna_storage is None:
            try:
                self._optuna_storage = _optuna_storage(self.url)
            except SQLAlchemyError as exc:
                raise StoreError(
                    f"store {self._redacted()}: cannot open Optuna's tables: {exc.__class__.__name__}: {exc}"
                ) from exc
        return self._optuna_storage

    # ---- writing -----------------------------------------------------------------------------------
    def record(
        self,
        task: TaskContext | None,
        space_fingerprint: str,
        config: Mapping[str, Any],
        value: float | None,
        status: str,
        *,
        stats: Mapping[str, Any] | None = None,
        error: str | None = None,
        study_name: str | None = None,
        trial_number: int | None = None,
        strategy: str | None = None,
        worker: str | None = None,
    ) -> int:
        """Store one measurement; returns its row id. Inside a study worker's task (`storage.guarding`),
        a measurement of the task's study raises `LeaseLost`, nothing written, once another worker has
        taken the task over (the check and the insert are one transaction)."""
        task = task or TaskContext()
        row = MeasurementRow(
            task_id=task.task_id,
            kernel=task.kernel,
            space_fingerprint=space_fingerprint,
            problem=dict(task.problem),
            dtype=task.dtype,
            device=task.device,
            versions=dict(task.versions),
            config=dict(config),
            config_key=_canon(dict(config)),
            value=value,
            status=status,
            stats=dict(stats or {}),
            error=error,
            study_name=study_name,
            trial_number=trial_number,
            strategy=strategy,
            worker=worker,
            created_at=dt.datetime.now(dt.timezone.utc),
        )
        what = f"recording a measurement of {task.kernel}" + (f" (study {study_name})" if study_name else "")
        guard = guard_for(self.url, study_name)  # a study worker's lease on the task (`storage._fence`)
        with operation(what), self.session() as s:
            if guard is not None:
                guard.check(s.connection())  # LeaseLost, and nothing written, once the task is taken over
            s.add(row)
            s.flush()
            return int(row.id)

    def record_trial(
        self,
        task: TaskContext | None,
        space: SearchSpace,
        trial: Trial,
        *,
        study_name: str | None = None,
        strategy: str | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> int:
        """Store one trial of `optimize`; `stats` are kept beside its duration."""
        return self.record(
            task,
            space.fingerprint(),
            trial.config,
            trial.value,
            trial.status,
            stats={"duration_s": trial.duration_s, **(stats or {})},
            error=trial.error,
            study_name=study_name,
            trial_number=trial.number,
            strategy=strategy,
        )

    # ---- keeping Optuna's trials and the measurements in step --------------------------------------
    def tell_measured_trials(
        self, study_name: str, running: Sequence[optuna.trial.FrozenTrial], *, storage: Any = None
    ) -> list[int]:
        """Finish the trials of Optuna study `study_name` that are still RUNNING but whose measurement is
        stored here; return their numbers.

        A trial's measurement is written before Optuna is told (`tuner.optimize`), so a worker that stopped
        between the two writes (a crash, a `StoreTimeout`) leaves a RUNNING trial whose measurement is
        kept: it is told now from that measurement (COMPLETE with its value, or FAIL with its status and
        error), so the resumed study counts it instead of measuring it again. A RUNNING trial without a
        measurement was never finished and is left as it is, also when its config was measured later in
        another trial (that measurement is the finished trial's). `running` are the study's RUNNING trials the
        caller has read (nothing is read when none of them can be told); `storage` is Optuna's storage of
        the study (default `optuna_storage()`). The caller holds the study (its lease, or it is the only
        `optimize` call on it)."""
        todo = [t for t in running if not t.user_attrs.get("tuner_skip")]
        if not todo:
            return []
        import optuna

        storage = storage if storage is not None else self.optuna_storage()
        stored: dict[str, list[Measurement]] = {}
        for m in self.measurements(study_name=study_name):
            if m.stats.get("phase") != "final":  # tune_kernel's re-measured finalists are not trials
                stored.setdefault(_match_key(m.config), []).append(m)
        # A measurement that a finished trial of the study counts is that trial's: a RUNNING trial of the
        # same config was interrupted before its own measurement (Ctrl-C in the objective), and the config
        # was measured again in a new trial. Only a measurement left over belongs to a RUNNING trial.
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        try:
            counted = storage.get_all_trials(
                storage.get_study_id_from_name(study_name), deepcopy=False, states=finished
            )
        except KeyError:
            counted = []
        for t in counted:
            if not t.user_attrs.get("tuner_skip") and stored.get(_match_key(t.params)):
                stored[_match_key(t.params)].pop(0)
        told = []
        with operation(f"telling study {study_name!r} the trials whose measurement is stored"):
            for t in todo:
                left = stored.get(_match_key(t.params))
                if not left:
                    continue
                m = left.pop()
                try:
                    storage.set_trial_user_attr(t._trial_id, "tuner_recovered", "told from its measurement")
                    if m.value is None:
                        storage.set_trial_user_attr(t._trial_id, "tuner_status", m.status)
                        if m.error:
                            storage.set_trial_user_attr(t._trial_id, "tuner_error", m.error[:2000])
                        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
                    else:
                        storage.set_trial_state_values(
                            t._trial_id, optuna.trial.TrialState.COMPLETE, [m.value]
                        )
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # its worker told it meanwhile
                told.append(t.number)
        if told:
            log.warning(
                "study %s: trial(s) %s were measured and stored but not told to Optuna (the worker stopped "
                "between the two writes); told now from their measurements",
                study_name,
                told,
            )
        return told

    def check_trials(self, study_name: str, trials: Sequence[optuna.trial.FrozenTrial]) -> TrialCheck:
        """Compare the counted `trials` of Optuna study `study_name` (COMPLETE, or FAIL not skipped: the
        caller's selection, e.g. `tuner.studies.task_trials`) with the measurements stored of that study
        (the finalists' re-measurements are not trials), config by config: each counted trial should have
        exactly one measurement, and each measurement a counted trial.

        A store written by a tuner that told Optuna before storing the measurement (or whose worker
        stopped between the two writes then) can hold counted trials without a measurement; they are
        reported, not re-recorded: the trial keeps only the config and its value (or status and error),
        not the measurement's statistics, task context or time, so a rebuilt row would be made up."""
        left: dict[str, int] = {}
        for m in self.measurements(study_name=study_name):
            if m.stats.get("phase") != "final":
                k = _match_key(m.config)
                left[k] = left.get(k, 0) + 1
        unmeasured = []
        for t in sorted(trials, key=lambda t: t.number):
            k = _match_key(t.params)
            if left.get(k, 0) > 0:
                left[k] -= 1
            else:
                unmeasured.append(t.number)
        return TrialCheck(tuple(unmeasured), sum(left.values()))

    # ---- reading -----------------------------------------------------------------------------------
    def measurements(
        self,
        *,
        kernel: str | None = None,
        task_id: str | None = None,
        space_fingerprint: str | None = None,
        device: str | None = None,
        study_name: str | None = None,
        newest: int | None = None,
    ) -> list[Measurement]:
        """Measurements matching the filters, oldest first; `newest=N` reads only the N newest (bounded)."""
        q = select(MeasurementRow).order_by(MeasurementRow.id)
        if newest is not None:
            q = select(MeasurementRow).order_by(MeasurementRow.id.desc()).limit(newest)
        if kernel is not None:
            q = q.where(MeasurementRow.kernel == kernel)
        if task_id is not None:
            q = q.where(MeasurementRow.task_id == task_id)
        if space_fingerprint is not None:
            q = q.where(MeasurementRow.space_fingerprint == space_fingerprint)
        if device is not None:
            q = q.where(MeasurementRow.device == device)
        if study_name is not None:
            q = q.where(MeasurementRow.study_name == study_name)
        with operation("reading measurements"), self.session() as s:
            rows = list(s.scalars(q).all())
            if newest is not None:
                rows.reverse()
            return [
                Measurement(
                    r.task_id,
                    r.kernel,
                    r.space_fingerprint,
                    r.problem,
                    r.dtype,
                    r.device,
                    r.versions,
                    r.config,
                    r.value,
                    r.status,
                    r.stats,
                    r.error,
                    r.study_name,
                    r.created_at,
                )
                for r in rows
            ]

    def prior_for(
        self,
        kernel: str,
        *,
        exclude_task: str | None = None,
        max_rows: int | None = DEFAULT_PRIOR_ROWS,
        max_tasks: int | None = DEFAULT_PRIOR_TASKS,
    ) -> list[list[tuple[dict, float | None]]]:
        """Past measurements of `kernel` grouped by task, in the `prior` format of `optimize`.

        Bounded: the measurements of the newest `max_tasks` tasks of the kernel, at most `max_rows` in
        all, read newest first in pages along the (kernel, id) index and no further than needed, so the
        cost does not grow with the size of the store. None: no bound."""
        groups: dict[str, list[tuple[dict, float | None]]] = {}
        n_rows = 0
        before: int | None = None
        page = 256
        with operation(f"reading the prior of {kernel}"), self.session() as s:
            while max_rows is None or n_rows < max_rows:
                q = (
                    select(
                        MeasurementRow.id, MeasurementRow.task_id, MeasurementRow.config, MeasurementRow.value
                    )
                    .where(MeasurementRow.kernel == kernel)
                    .order_by(MeasurementRow.id.desc())
                    .limit(page if max_rows is None else min(page, max_rows - n_rows))
                )
                if exclude_task is not None:
                    q = q.where(MeasurementRow.task_id != exclude_task)
                if before is not None:
                    q = q.where(MeasurementRow.id < before)
                rows = s.execute(q).all()
                for row_id, task_id, config, value in rows:
                    before = row_id
                    g = groups.get(task_id)
                    if g is None:
                        if max_tasks is not None and len(groups) >= max_tasks:
                            return _prior_order(groups)  # the newest tasks are complete
                        g = groups[task_id] = []
                    g.append((config, value))
                    n_rows += 1
                if len(rows) < page:
                    break
        return _prior_order(groups)

    def count(self) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(MeasurementRow)) or 0)

    def vacuum(self) -> Vacuumed:
        """Give back the space of removed rows (after `ConfigCache.prune`): SQLite rewrites the file, which
        shrinks (`Vacuumed.bytes_before` / `bytes_after`; it needs free disk space about the file's size);
        PostgreSQL runs `VACUUM (ANALYZE)` on tuner's tables, which autovacuum also does on its own, and
        keeps the space for new rows. Outside any transaction; StoreError when it fails."""
        try:
            return vacuum(self.engine, self.url)
        except SQLAlchemyError as exc:
            raise StoreError(f"store {self._redacted()}: {exc.__class__.__name__}: {exc}") from exc


# The user attributes of a trial carried into a retried study task's attempt (`tuner.studies._retry`): the
# Optuna study it was measured in, whose name its measurement is stored under, and its number there.
CARRIED_FROM = "tuner_carried_from"
CARRIED_TRIAL = "tuner_carried_trial"


def _match_key(config: Mapping[str, Any]) -> str:
    """A config as compared between an Optuna trial's params and a stored measurement (2.0 and 2 agree)."""
    return _canon({k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in config.items()})


def _prior_order(groups: dict[str, list[tuple[dict, float | None]]]) -> list[list[tuple[dict, float | None]]]:
    """Oldest task first, each task's measurements in the order they were made (as read unbounded)."""
    return [list(reversed(g)) for g in reversed(groups.values())]
