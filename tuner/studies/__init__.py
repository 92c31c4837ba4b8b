"""Offline tuning studies: many kernels x problems x dtypes tuned by one or many workers sharing a
database, with a report, a cache export and a regression check (`tuner study ...`, `tuner regress`).
See docs/studies.md."""

from __future__ import annotations

from ._board import DONE, FAILED, PENDING, RUNNING, Claim, TaskBoard, TaskRow
from ._export import ExportResult, export_study
from ._regress import RegressionCheck, check_entries
from ._report import ReportResult, write_report
from ._runner import (
    Executor,
    LeaseLost,
    RunSummary,
    StudyWorker,
    WorkersStopped,
    WorkerSummary,
    default_executor,
    prepare_study,
    resolve_executor,
    run_study,
    task_trials,
)
from ._spec import StudyError, StudySpec, StudyTask, load_study, order_tasks, parse_study

__all__ = [
    "DONE",
    "FAILED",
    "PENDING",
    "RUNNING",
    "Claim",
    "TaskBoard",
    "TaskRow",
    "Executor",
    "LeaseLost",
    "RunSummary",
    "StudyWorker",
    "WorkerSummary",
    "WorkersStopped",
    "default_executor",
    "prepare_study",
    "resolve_executor",
    "run_study",
    "task_trials",
    "ExportResult",
    "export_study",
    "RegressionCheck",
    "check_entries",
    "ReportResult",
    "write_report",
    "StudyError",
    "StudySpec",
    "StudyTask",
    "load_study",
    "order_tasks",
    "parse_study",
]
