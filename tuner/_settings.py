"""Every environment variable tuner reads, in one table, read through `setting` (typed: `text`, `flag`).

    from tuner._settings import flag, text
    text("TUNER_MODE")        # "offline", or None when unset or empty
    flag("TUNER_PREDICT")     # True unless "0", "false", "off" or "no"

Each `Setting` has its name, its type ("str", "path" or "bool"), its default and a one-line doc; README.md,
"Settings", shows the same table (`settings_table()` writes it and a test checks the two agree). Values are
read when asked for, never cached, so a test or a script that sets a variable sees it at the next call.

This module imports only the standard library and nothing of tuner, so every layer may use it
(`tuner.kernels` and `tuner.search_spaces` included; `.ci/check_layers.py` allows it).

The variables of Triton that tuner reads (`TRITON_INTERPRET`, `TRITON_PRINT_AUTOTUNING`) are listed too,
with Triton's meaning of them; tuner sets `TRITON_INTERPRET=1` itself only where there is no CUDA device
and the user did not choose (`tuner.kernels.prepare_triton`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["Setting", "SETTINGS", "setting", "text", "flag", "is_set", "settings_table"]

_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Setting:
    name: str
    type: Literal["str", "path", "bool"]
    default: str | bool | None
    doc: str
    default_doc: str = ""  # how the default reads in the table when it is computed (e.g. from TUNER_HOME)

    def parse(self, raw: str | None) -> str | bool | None:
        if raw is None or not raw.strip():
            return self.default
        if self.type == "bool":
            return raw.strip().lower() not in _FALSE
        return raw


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "TUNER_HOME",
            "path",
            None,
            "the directory of the default SQLite store (`tuner.db`), studies' outputs and recorded misses",
            "`~/.cache/tuner`",
        ),
        Setting(
            "TUNER_STORAGE",
            "str",
            None,
            "a SQLAlchemy URL for the results store, used instead of `$TUNER_HOME/tuner.db`",
            "`sqlite:///$TUNER_HOME/tuner.db`",
        ),
        Setting(
            "TUNER_PG_TIMEOUT",
            "str",
            None,
            "seconds one PostgreSQL statement of the store (its lock waits included) may run before it fails "
            "with a `StoreTimeout` naming the store, the operation and the limit (also the idle-in-transaction "
            "limit); a DBA's stricter `statement_timeout` or `idle_in_transaction_session_timeout` (role, "
            "database, server) stays in force; `0`: tuner adds no limit (the DBA's stand)",
            "`60`",
        ),
        Setting(
            "TUNER_PG_POOL_SIZE",
            "str",
            None,
            "PostgreSQL connections each of a process's two engines per store (tuner's tables, Optuna's) "
            "keeps open between calls; as many more are opened at peaks, so a process holds at most 4 times "
            "this many",
            "`4`",
        ),
        Setting(
            "TUNER_PG_CONNECT_WAIT",
            "str",
            None,
            "seconds a new PostgreSQL connection that the server refuses for a connection limit is tried "
            "again before it fails with a `StoreConnectionLimit`; `0`: fail at once",
            "`10`",
        ),
        Setting(
            "TUNER_MODE",
            "str",
            None,
            "the runtime mode of every `@tuner.autotune` function left at `mode=None`: "
            "`online`, `offline` or `record`",
            "`online`",
        ),
        Setting(
            "TUNER_CACHE_FILE",
            "path",
            None,
            "a cache file (JSON) every decorated function reads, after its own `cache=` and `set_global_cache`",
            "none",
        ),
        Setting(
            "TUNER_PREDICT",
            "bool",
            True,
            "`0` turns off the zero-shot predictor on an offline miss (the default config is used instead)",
        ),
        Setting(
            "TUNER_MISSES_DIR",
            "path",
            None,
            "where record mode writes its misses, read by `tuner misses`",
            "`$TUNER_HOME/misses`",
        ),
        Setting(
            "TUNER_STUDY_STORAGE",
            "str",
            None,
            "the store URL of `tuner study` when `--storage` is not given (the study runner sets it for "
            "its task processes)",
            "the study file's `storage`",
        ),
        Setting(
            "TUNER_STUDY_WORKER_PROCESS",
            "bool",
            False,
            "set by the study runner for the worker processes it starts: with the study's `trial_timeout`, "
            "such a worker whose trial hung exits with code 3 once it has handed the task back, and the "
            "runner starts another in its place",
        ),
        Setting(
            "TUNER_PALLAS_INTERPRET",
            "bool",
            None,
            "`1` runs the Pallas kernels with `interpret=True`, `0` compiles them",
            "interpret when jax has no GPU or TPU backend",
        ),
        Setting(
            "TRITON_INTERPRET",
            "bool",
            False,
            "Triton's: `1` runs `@triton.jit` kernels in its CPU interpreter. tuner sets it for its own "
            "kernels (`tuner.kernels`) when there is no CUDA device and it is unset; a kernel of your own "
            "(the `triton.autotune` drop-in) needs it set before the kernel is defined",
            "set to `1` for tuner's kernels without a CUDA device",
        ),
        Setting(
            "TRITON_PRINT_AUTOTUNING",
            "bool",
            False,
            "Triton's: `1` makes `tuner.autotune(configs=...)`, the `triton.autotune` drop-in, print what Triton prints",
        ),
    )
}


def _get(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"unknown setting {name!r}; known: {sorted(SETTINGS)}") from None


def setting(name: str) -> str | bool | None:
    """The value of the environment variable `name` (one of `SETTINGS`), parsed by its type; its default
    when unset or empty."""
    s = _get(name)
    return s.parse(os.environ.get(name))


def text(name: str) -> str | None:
    """`setting(name)` of a "str" or "path" setting: the string, or None when unset or empty."""
    s = _get(name)
    if s.type == "bool":
        raise TypeError(f"{name} is a bool setting: read it with flag()")
    value = s.parse(os.environ.get(name))
    return value if isinstance(value, str) else None


def flag(name: str) -> bool:
    """`setting(name)` of a "bool" setting (False for one unset without a default)."""
    s = _get(name)
    if s.type != "bool":
        raise TypeError(f"{name} is a {s.type} setting: read it with text()")
    return bool(s.parse(os.environ.get(name)))


def is_set(name: str) -> bool:
    """Whether the user set `name` at all (even to an empty string)."""
    return _get(name).name in os.environ


def settings_table() -> str:
    """The Markdown table of README.md's "Settings" section."""
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for s in SETTINGS.values():
        default = s.default_doc or ("unset" if s.default is None else f"`{int(s.default)}`")
        rows.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(rows)
