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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from tuner.search_spaces import SearchSpace

    from ._optimize import Trial

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

__all__ = [
    "ResultStore",
    "StoreError",
    "TaskContext",
    "Measurement",
    "default_storage_url",
    "normalize_url",
    "tuner_home",
]


class StoreError(RuntimeError):
    """A storage failure (driver error, schema mismatch), with the database URL's scheme named."""


def tuner_home() -> Path:
    """`$TUNER_HOME`, default `~/.cache/tuner`. Holds the default SQLite store."""
    return Path(os.environ.get("TUNER_HOME") or Path.home() / ".cache" / "tuner")


def default_storage_url() -> str:
    """`$TUNER_STORAGE` if set, else `sqlite:///$TUNER_HOME/tuner.db`."""
    url = os.environ.get("TUNER_STORAGE")
    if url:
        return url
    home = tuner_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'tuner.db'}"


def normalize_url(url: str) -> str:
    """`postgresql://...` names no driver, and SQLAlchemy 2.1 then picks psycopg 3; tuner depends on
    psycopg2 (pyproject), so a driverless PostgreSQL URL is pointed at psycopg2 unless psycopg 3 is there."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            import importlib.util

            if (
                importlib.util.find_spec("psycopg") is None
                and importlib.util.find_spec("psycopg2") is not None
            ):
                return "postgresql+psycopg2://" + url[len(prefix) :]
            return "postgresql://" + url[len(prefix) :]
    return url


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


class _Base(DeclarativeBase):
    pass


class _Meta(_Base):
    __tablename__ = "tuner_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class MeasurementRow(_Base):
    __tablename__ = "tuner_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(40), index=True)
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    space_fingerprint: Mapped[str] = mapped_column(String(40), index=True)
    problem: Mapped[dict] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(40), default="")
    device: Mapped[str] = mapped_column(String(200), index=True)
    versions: Mapped[dict] = mapped_column(JSON)
    config: Mapped[dict] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(Text)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(40))
    stats: Mapped[dict] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    study_name: Mapped[str | None] = mapped_column(String(300), nullable=True, index=True)
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    strategy: Mapped[str | None] = mapped_column(String(60), nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


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


class ResultStore:
    """SQLAlchemy-backed store of measurements. `url=None` uses `default_storage_url()`."""

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        self.url = normalize_url(url or default_storage_url())
        try:
            kwargs: dict[str, Any] = {"future": True}
            if self.url.startswith("sqlite"):
                kwargs["connect_args"] = {"timeout": 60}
            else:
                kwargs["pool_pre_ping"] = True
            self.engine = create_engine(self.url, **kwargs)
            if self.url.startswith("sqlite"):
                event.listen(self.engine, "connect", _sqlite_pragmas)
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            if create:
                _Base.metadata.create_all(self.engine)
                self._check_schema()
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot open store {self._redacted()}: {exc.__class__.__name__}: {exc}"
            ) from exc
        self._optuna_storage: optuna.storages.BaseStorage | None = None

    def _redacted(self) -> str:
        return self.url.split("@")[-1] if "@" in self.url else self.url

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

    def _check_schema(self) -> None:
        with self.session() as s:
            row = s.get(_Meta, "schema_version")
            if row is None:
                s.add(_Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(row.value) > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self._redacted()} has schema version {row.value}, newer than this tuner "
                    f"({SCHEMA_VERSION}); upgrade tuner"
                )

    def optuna_storage(self) -> optuna.storages.BaseStorage:
        """Optuna's RDBStorage on the same database (created on first use)."""
        if self._optuna_storage is None:
            import optuna

            engine_kwargs: dict[str, Any] = {}
            if self.url.startswith("sqlite"):
                engine_kwargs["connect_args"] = {"timeout": 60}
            else:
                engine_kwargs["pool_pre_ping"] = True
            self._optuna_storage = optuna.storages.RDBStorage(self.url, engine_kwargs=engine_kwargs)
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
        with self.session() as s:
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
    ) -> int:
        return self.record(
            task,
            space.fingerprint(),
            trial.config,
            trial.value,
            trial.status,
            stats={"duration_s": trial.duration_s},
            error=trial.error,
            study_name=study_name,
            trial_number=trial.number,
            strategy=strategy,
        )

    # ---- reading -----------------------------------------------------------------------------------
    def measurements(
        self,
        *,
        kernel: str | None = None,
        task_id: str | None = None,
        space_fingerprint: str | None = None,
        device: str | None = None,
        study_name: str | None = None,
    ) -> list[Measurement]:
        q = select(MeasurementRow).order_by(MeasurementRow.id)
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
        with self.session() as s:
            rows = s.scalars(q).all()
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
        self, kernel: str, *, exclude_task: str | None = None
    ) -> list[list[tuple[dict, float | None]]]:
        """Past measurements of `kernel` grouped by task, in the `prior` format of `optimize`."""
        groups: dict[str, list[tuple[dict, float | None]]] = {}
        for m in self.measurements(kernel=kernel):
            if m.task_id == exclude_task:
                continue
            groups.setdefault(m.task_id, []).append((m.config, m.value))
        return list(groups.values())

    def count(self) -> int:
        from sqlalchemy import func

        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(MeasurementRow)) or 0)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()
