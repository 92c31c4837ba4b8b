"""Study files: a TOML description of many tuning tasks (kernels x problems x dtypes x backends).

```toml
[study]
name = "quickstart"
device = "cpu"                      # an arch of search_spaces.devices, or "auto"
backends = ["triton"]               # default for every [[tasks]] entry
dtypes = ["float32"]
strategy = "auto"
seed = 0
budget = { trials = 8, seconds = 30 }   # per task; at least one of the two
# storage = "postgresql://user@host/db"  # default: sqlite:///<output>/study.db; a relative file: this file's folder
# output = "runs/quickstart"             # default: $TUNER_HOME/studies/<name>; relative to this file
lease_seconds = 60

[[tasks]]
kernel = "matmul"
problems = [{ M = 64, N = 64, K = 64 }]
grid = { M = [128, 256], N = [128], K = [64] }   # cross product, added to `problems`
# backends, dtypes, budget, strategy, seed: per-entry overrides
```

`load_study` validates everything and raises `StudyError` (a `BadInput`: exit code 2, one line) naming the
file and the offending key. Tasks come out in the order the runner hands them to workers: grouped by
kernel (file order), backend and dtype, and within a group a nearest-neighbour chain over the log-scaled
shape starting from the smallest problem, so each task follows the finished task most like it and the
cost model learns from its closest neighbours first.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import BadInput
from tuner.search_spaces._params import brief_list
from tuner.storage import redact, sqlite_path, sqlite_url
from tuner.store import normalize_url  # noqa: F401  (re-exported)

__all__ = [
    "StudyError",
    "StudySpec",
    "StudyTask",
    "load_study",
    "parse_study",
    "order_tasks",
    "normalize_url",
    "task_distance",
]

_STUDY_KEYS = {
    "name",
    "device",
    "backends",
    "dtypes",
    "strategy",
    "seed",
    "budget",
    "storage",
    "output",
    "lease_seconds",
    "trial_timeout",
    "finalists",
}
_TASK_KEYS = {"kernel", "problems", "grid", "backends", "dtypes", "budget", "strategy", "seed", "finalists"}
_BUDGET_KEYS = {"trials", "seconds"}
# A study name names a folder: no path separators, and no leading '.' ('.', '..', hidden folders).
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


class StudyError(BadInput):
    """A study file that cannot be used; the message is one line naming the file and the key."""


def attempt_study_name(study: str, key: str, retries: int = 0) -> str:
    """The Optuna study of a task's attempt: the first one's `<study>:<key>`, the n-th retry's
    `<study>:<key>#retry<n>`."""
    base = f"{study}:{key}"
    return f"{base}#retry{retries}" if retries else base


@dataclass(frozen=True)
class StudyTask:
    """One tuning task of a study: what an executor receives (see `tuner.studies.Executor`)."""

    study: str
    key: str  # unique within the study, human readable
    kernel: str
    problem: Mapping[str, Any]  # shape fields, flags and "dtype"
    backend: str
    device: str  # arch name ("sm90", "cpu", ...) or "auto" until the runner resolves it
    budget: int | None  # trials; None: only the time budget limits the task
    time_budget_s: float | None
    strategy: str
    seed: int
    finalists: int | None = None
    storage: str = ""  # filled in by the runner
    seq: int = 0  # position in the run order
    # How many times `--retry-failed` put this task back (kept on the board, not in the study file); each
    # retry runs in an Optuna study of its own (`study_name`), see `tuner.studies._retry`.
    retries: int = 0

    @property
    def dtype(self) -> str:
        return str(self.problem.get("dtype", ""))

    @property
    def study_name(self) -> str:
        """The Optuna study that holds this task's trials (in the study's storage): `<study>:<key>`, and
        `<study>:<key>#retry<n>` after the n-th `--retry-failed`."""
        return attempt_study_name(self.study, self.key, self.retries)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problem"] = dict(self.problem)
        if not self.retries:
            d.pop("retries")  # a task never retried is stored and hashed as before retries existed
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StudyTask:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class StudySpec:
    name: str
    path: Path | None
    device: str
    strategy: str
    seed: int
    storage: str
    output_dir: Path
    lease_seconds: float
    tasks: tuple[StudyTask, ...] = field(default_factory=tuple)
    # seconds a worker may go without finishing a trial of its task before it gives the trial up as
    # hung (None: no limit; StudyWorker, `_Lease`)
    trial_timeout: float | None = None

    def fingerprint(self) -> str:
        blob = json.dumps([t.to_dict() for t in self.tasks], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _err(where: str, msg: str) -> StudyError:
    return StudyError(f"{where}: {msg}")


def _check_dialect(url: str, where: str) -> None:
    """A URL whose database SQLAlchemy does not know (`bogus://x`, `postgress://...`) is bad input here,
    named with where it came from (it used to surface at the first opening as SQLAlchemy's bare "Can't
    load plugin: sqlalchemy.dialects:bogus"). Only the dialect is looked up: no driver is imported."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        from tuner.storage import redact

        why = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise _err(where, f"storage {redact(url)!r} names no database SQLAlchemy knows ({why})") from None


def _check_keys(where: str, table: Mapping[str, Any], allowed: set[str], *, name: str = "") -> None:
    """Refuse a key not in `allowed`, naming the table (`name`, where `where` does not: "the [[tasks]]
    table") and the nearest allowed key, as a typo usually is one."""
    unknown = sorted(set(table) - allowed)
    if unknown:
        import difflib

        near = difflib.get_close_matches(str(unknown[0]), sorted(allowed), n=1)
        raise _err(
            where,
            f"unknown key {unknown[0]!r}{f' of {name}' if name else ''}"
            f"{f'; did you mean {near[0]!r}?' if near else ''} (allowed: {', '.join(sorted(allowed))})",
        )


def _str_list(where: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _err(where, f"{key} must be a non-empty list of strings, got {value!r}")
    if len(set(value)) != len(value):
        seen: set[str] = set()
        dups: dict[str, None] = {}
        for v in value:
            if v in seen:
                dups[v] = None
            seen.add(v)
        raise _err(where, f"{key} has duplicates: {brief_list(list(dups))}")
    return tuple(value)


def _int(where: str, key: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(where, f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _seed(where: str, value: Any) -> int:
    """A seed the samplers take (numpy's and Optuna's: below 2**32): a larger one passed the file's check
    and then failed every task of the run."""
    from tuner._optimize import MAX_SEED

    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise _err(where, f"seed must be an integer in [0, 2**32 - 1], got {value!r}")
    return value


def _budget(where: str, value: Any) -> tuple[int | None, float | None]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"trials": value}
    if not isinstance(value, dict):
        raise _err(where, f"budget must be a table like {{ trials = 20, seconds = 60 }}, got {value!r}")
    _check_keys(f"{where} budget", value, _BUDGET_KEYS)
    trials = value.get("trials")
    seconds = value.get("seconds")
    if trials is None and seconds is None:
        raise _err(where, "budget needs trials and/or seconds")
    if trials is not None:
        trials = _int(where, "budget.trials", trials, minimum=1)
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not (math.isfinite(seconds) and seconds > 0)
        ):
            raise _err(where, f"budget.seconds must be a positive number, got {seconds!r}")
        seconds = float(seconds)
    return trials, seconds


def _problem(where: str, p: Any) -> dict[str, Any]:
    if not isinstance(p, dict) or not p:
        raise _err(where, f"a problem must be a non-empty table like {{ M = 64, N = 64 }}, got {p!r}")
    out: dict[str, Any] = {}
    for k, v in p.items():
        if isinstance(v, (bool, str)):
            out[k] = v
        elif isinstance(v, int):
            if v < 1:
                raise _err(where, f"problem field {k} = {v!r} must be >= 1")
            out[k] = v
        elif isinstance(v, float) and math.isfinite(v):
            out[k] = v
        else:
            raise _err(where, f"problem field {k} = {v!r} must be an integer, number, boolean or string")
    return out


def _grid(where: str, g: Any) -> list[dict[str, Any]]:
    if not isinstance(g, dict) or not g:
        raise _err(where, f"grid must be a table of lists like {{ M = [64, 128] }}, got {g!r}")
    keys = list(g)
    values = []
    for k in keys:
        v = g[k]
        if not isinstance(v, list):
            v = [v]
        if not v:
            raise _err(where, f"grid.{k} is empty")
        values.append(v)
    return [_problem(where, dict(zip(keys, combo, strict=True))) for combo in itertools.product(*values)]


def _sqlite_beside(url: str, base: Path) -> str:
    """A SQLite URL of a relative file (`sqlite:///runs/study.db`) made absolute against `base`, the study
    file's folder; any other URL (an absolute file, a SQLite `file:` URI, memory, a server) as it is. The
    study's database is then the same file whatever folder a worker, `report` or `export` runs in; a
    `--storage` URL keeps the command's own folder, as any path on a command line."""
    path = sqlite_path(url)
    if path is None or path.startswith("file:") or os.path.isabs(path):
        return url
    scheme, _, rest = url.partition(":///")
    query = rest.partition("?")[2]
    return scheme + sqlite_url(base / path)[len("sqlite") :] + (f"?{query}" if query else "")


def _shape_key(problem: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={_fmt(v)}" for k, v in sorted(problem.items()) if k != "dtype")


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _check_kernel(
    where: str, kernel: str, backend: str, dtype: str, problem: dict[str, Any]
) -> dict[str, Any]:
    """Validate against the kernel registry and the kernel's problem schema (`validate_problem`: field
    names, types and ranges, the kernel's own checks); fill unspecified fields from the kernel's default."""
    from tuner.kernels import get_kernel, validate_problem

    try:
        spec = get_kernel(kernel)
    except ValueError as exc:
        hint = (
            " (a study of decorated functions, written by `tuner study from-misses --factory`, runs with "
            "--executor tuner.studies._from_misses:run_decorated)"
            if "factory" in problem
            else ""
        )
        raise _err(where, str(exc).splitlines()[0] + hint) from None
    if backend not in spec.backends:
        raise _err(
            where, f"kernel {kernel!r} has no backend {backend!r} (it has: {', '.join(spec.backends)})"
        )
    if dtype not in spec.dtypes:
        raise _err(
            where, f"kernel {kernel!r} does not support dtype {dtype!r} (it does: {', '.join(spec.dtypes)})"
        )
    try:
        return validate_problem(spec, {**problem, "dtype": dtype})
    except ValueError as exc:
        msg = str(exc).splitlines()[0]  # named once: the registry's own messages may name the kernel already
        raise _err(
            where, msg if msg.startswith(f"kernel {kernel!r}") else f"kernel {kernel!r}: {msg}"
        ) from None


def _filled(kernel: str, problem: Mapping[str, Any]) -> dict[str, Any]:
    """The problem as the runner runs it, without checking it: a registered kernel's default problem
    fields filled in where the study leaves them out (rmsnorm's eps), as `validate_problem` fills them for
    `_check_kernel`. So a study loaded without kernel checks (`tuner study report` / `export`, a custom
    executor) has the same task keys as the run that stored the results. An unregistered kernel's problem,
    and a decorated function's (from-misses --factory), stay as given. A kernel module that cannot be
    imported raises (ImportError naming it): its kernels' defaults would be missing from the task keys."""
    if "factory" in problem:
        return dict(problem)
    from tuner.kernels import get_kernel

    try:
        spec = get_kernel(kernel)
    except ValueError:  # not a registered kernel (a custom executor's): nothing to fill
        return dict(problem)
    return {**dict(spec.default_problem), **dict(problem)}


def parse_study(
    data: Mapping[str, Any],
    *,
    path: Path | None = None,
    storage: str | None = None,
    check_kernels: bool = True,
) -> StudySpec:
    """Validate a parsed study document (see the module docstring) and expand its tasks. Without
    `check_kernels` the kernel registry checks nothing, but a registered kernel's default problem fields
    are still filled in (`_filled`), so the task keys are the same either way."""
    src = str(path) if path is not None else "<study>"
    if not isinstance(data, Mapping):
        raise _err(src, "not a table")
    _check_keys(src, data, {"study", "tasks"})
    st = data.get("study")
    if not isinstance(st, dict):
        raise _err(src, "missing [study] table")
    where = f"{src} [study]"
    _check_keys(where, st, _STUDY_KEYS)
    name = st.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise _err(
            where,
            f"name must be a plain identifier: 1-100 letters, digits, '_', '-' or '.', starting with a "
            f"letter, digit or '_' (it names a folder under $TUNER_HOME/studies), got {name!r}",
        )
    device = st.get("device", "auto")
    if not isinstance(device, str):
        raise _err(where, f"device must be a string, got {device!r}")
    if device != "auto":
        from tuner.search_spaces.devices import DEVICES

        if device not in DEVICES:
            raise _err(where, f"unknown device {device!r}; known: auto, {', '.join(sorted(DEVICES))}")
    backends = _str_list(where, "backends", st.get("backends", ["triton"]))
    dtypes = _str_list(where, "dtypes", st.get("dtypes", ["float32"]))
    strategy = st.get("strategy", "auto")
    if not isinstance(strategy, str):
        raise _err(where, f"strategy must be a string, got {strategy!r}")
    seed = _seed(where, st.get("seed", 0))
    if "budget" not in st:
        raise _err(where, "missing budget (e.g. budget = { trials = 20 })")
    trials, seconds = _budget(where, st["budget"])
    finalists = st.get("finalists")
    if finalists is not None:
        finalists = _int(where, "finalists", finalists, minimum=1)
    lease = st.get("lease_seconds", 60)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not (1 <= lease <= 86400):
        raise _err(where, f"lease_seconds must be a number in [1, 86400], got {lease!r}")
    trial_timeout = st.get("trial_timeout")
    if trial_timeout is not None and (
        isinstance(trial_timeout, bool)
        or not isinstance(trial_timeout, (int, float))
        or not (1 <= trial_timeout <= 7 * 86400)
    ):
        raise _err(where, f"trial_timeout must be a number of seconds in [1, 604800], got {trial_timeout!r}")
    base = path.parent if path is not None else Path.cwd()
    out = st.get("output")
    if out is None:
        from tuner.store import tuner_home

        output_dir = tuner_home() / "studies" / name
    elif isinstance(out, str) and out:
        output_dir = Path(os.path.expanduser(out))
        if not output_dir.is_absolute():
            output_dir = base / output_dir
    else:
        raise _err(where, f"output must be a path string, got {out!r}")
    url = storage or st.get("storage")
    if url is None:
        url = sqlite_url((output_dir / "study.db").resolve())
    # a URL given on the command line is not the file's: blame the one that holds it
    url_from = "--storage (or TUNER_STUDY_STORAGE)" if storage else where
    if not isinstance(url, str) or "://" not in url:
        shown = redact(url) if isinstance(url, str) else url  # a malformed URL may still hold a password
        raise _err(url_from, f"storage must be a database URL such as sqlite:///study.db, got {shown!r}")
    if not storage:  # the file's own SQLite path is relative to the file, as `output` is
        url = _sqlite_beside(url, base)
    url = normalize_url(url)
    _check_dialect(url, url_from)

    from tuner.strategies import get_strategy

    entries = data.get("tasks")
    if not isinstance(entries, list) or not entries:
        raise _err(src, "missing [[tasks]] entries (each with kernel and problems or grid)")
    tasks: list[StudyTask] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        w = f"{src} tasks[{i}]"
        if not isinstance(e, dict):
            raise _err(w, "must be a table")
        _check_keys(w, e, _TASK_KEYS, name="the [[tasks]] table")
        kernel = e.get("kernel")
        if not isinstance(kernel, str) or not kernel:
            raise _err(w, f"kernel must be a kernel name, got {kernel!r}")
        w = f"{src} tasks[{i}] ({kernel})"
        probs: list[dict[str, Any]] = []
        if "problems" in e:
            if not isinstance(e["problems"], list) or not e["problems"]:
                raise _err(w, "problems must be a non-empty list of tables")
            probs += [_problem(w, p) for p in e["problems"]]
        if "grid" in e:
            probs += _grid(w, e["grid"])
        if not probs:
            raise _err(w, "needs problems = [...] or grid = {...}")
        t_backends = _str_list(w, "backends", e["backends"]) if "backends" in e else backends
        t_dtypes = _str_list(w, "dtypes", e["dtypes"]) if "dtypes" in e else dtypes
        t_trials, t_seconds = _budget(w, e["budget"]) if "budget" in e else (trials, seconds)
        t_strategy = e.get("strategy", strategy)
        if not isinstance(t_strategy, str):
            raise _err(w, f"strategy must be a string, got {t_strategy!r}")
        try:
            get_strategy(t_strategy)
        except ValueError as exc:  # blamed on the table that names it: the entry's own, or [study]'s
            raise _err(w if "strategy" in e else where, str(exc)) from None
        t_seed = _seed(w, e["seed"]) if "seed" in e else seed
        t_final = _int(w, "finalists", e["finalists"], minimum=1) if "finalists" in e else finalists
        for p in probs:
            for backend in t_backends:
                for dt in [p["dtype"]] if "dtype" in p else t_dtypes:
                    if not isinstance(dt, str):
                        raise _err(w, f"dtype must be a string, got {dt!r}")
                    prob = (
                        _check_kernel(w, kernel, backend, dt, p)
                        if check_kernels
                        else _filled(kernel, {**p, "dtype": dt})
                    )
                    key = f"{kernel}/{backend}/{dt}/{_shape_key(prob)}"
                    if key in seen:
                        raise _err(w, f"task {key} is listed twice")
                    seen.add(key)
                    tasks.append(
                        StudyTask(
                            study=name,
                            key=key,
                            kernel=kernel,
                            problem=prob,
                            backend=backend,
                            device=device,
                            budget=t_trials,
                            time_budget_s=t_seconds,
                            strategy=t_strategy,
                            seed=t_seed,
                            finalists=t_final,
                            storage=url,
                        )
                    )
    ordered = order_tasks(tasks)
    return StudySpec(
        name=name,
        path=path,
        device=device,
        strategy=strategy,
        seed=seed,
        storage=url,
        output_dir=output_dir,
        lease_seconds=float(lease),
        tasks=tuple(ordered),
        trial_timeout=float(trial_timeout) if trial_timeout is not None else None,
    )


def load_study(
    path: str | os.PathLike[str], *, storage: str | None = None, check_kernels: bool = True
) -> StudySpec:
    """Read and validate a study file; `storage` overrides the file's storage URL."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise StudyError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise StudyError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{p}: invalid TOML: {str(exc).splitlines()[0]}") from None
    return parse_study(data, path=p.resolve(), storage=storage, check_kernels=check_kernels)


def _size(task: StudyTask) -> float:
    return sum(
        math.log2(v)
        for v in task.problem.values()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    )


def task_distance(a: StudyTask, b: StudyTask) -> float:
    """Squared distance of the log2 numeric problem fields, plus 1 per differing flag or missing field."""
    d = 0.0
    for k in set(a.problem) | set(b.problem):
        x, y = a.problem.get(k), b.problem.get(k)
        if (
            isinstance(x, (int, float))
            and isinstance(y, (int, float))
            and not isinstance(x, bool)
            and not isinstance(y, bool)
            and x > 0
            and y > 0
        ):
            d += (math.log2(x) - math.log2(y)) ** 2
        elif x != y:
            d += 1.0
    return d


def order_tasks(tasks: Sequence[StudyTask]) -> list[StudyTask]:
    """Run order: group by kernel (first appearance), backend, dtype; within a group start at the smallest
    problem and always go to the nearest unvisited one (`task_distance`)."""
    groups: dict[tuple[str, str, str], list[StudyTask]] = {}
    for t in tasks:
        groups.setdefault((t.kernel, t.backend, t.dtype), []).append(t)
    ordered: list[StudyTask] = []
    for group in groups.values():
        remaining = sorted(group, key=lambda t: (_size(t), t.key))
        cur = remaining.pop(0)
        ordered.append(cur)
        while remaining:
            c = cur
            nxt = min(remaining, key=lambda t: (task_distance(c, t), _size(t), t.key))  # noqa: B023
            remaining.remove(nxt)
            ordered.append(nxt)
            cur = nxt
    return [StudyTask(**{**t.to_dict(), "seq": i}) for i, t in enumerate(ordered)]
