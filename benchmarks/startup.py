"""What a cold `tuner study run` costs before its first trial, with `--old CHECKOUT` the same on another
checkout of tuner (the code before a change) in the same run, the two alternated run by run.

Two parts:

* opens: a fresh process (`python -c`, PYTHONPATH = the checkout) opens Optuna's tables of an existing
  SQLite store `--opens` times, as a study process does (each task, the task board, the report, the cache
  export). Printed: the first opening (imports included), the others together, and how many times the
  process loaded Optuna's migration scripts (alembic's script directory).
* study: `tuner study run STUDY --quiet [--workers N]`, cold (a new TUNER_HOME each run). Printed: the
  time from the launch to the first trial's start (Optuna's `datetime_start`), to the N-th task's first
  trial (with N workers, the last worker's first trial), to the end, and the migration-script loads per
  process (counted by an audit hook that a `sitecustomize` in a temporary folder installs).

The load average is printed at the start and the end: on a shared machine, compare a figure only with its
baseline from the same run. Bytecode is written (PYTHONDONTWRITEBYTECODE is unset for the children), and
each checkout is run once before the timed runs, so no child compiles tuner's modules.

Run: PYTHONPATH=. python benchmarks/startup.py [--old CHECKOUT] [--repeats 3] [--workers 1,2]
     [--study studies/quickstart.toml] [--opens 8] [--no-study]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import existing_dir, positive_int, positive_ints, temp_dir  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parent.parent

# Installed in every child (and its children) through PYTHONPATH: counts the runs of the first of Optuna's
# migration scripts (alembic executes each script's code afresh at every load of the script directory).
_SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, json, os, sys
    _log = os.environ.get("TUNER_STARTUP_LOG")
    if _log:
        _loads = [0]

        def _hook(event, args):
            if event == "exec" and args:
                path = getattr(args[0], "co_filename", "")
                if os.path.basename(path) == "v0.9.0.a.py" and "alembic" in path:
                    _loads[0] += 1

        sys.addaudithook(_hook)

        def _write():
            rec = {"pid": os.getpid(), "argv": sys.argv, "loads": _loads[0]}
            with open(os.path.join(_log, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
                json.dump(rec, f)

        atexit.register(_write)
    """
)

_OPENS = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from tuner.store import ResultStore
    url, n = sys.argv[1], int(sys.argv[2])
    ResultStore(url).optuna_storage()
    t1 = time.perf_counter()
    for _ in range(n - 1):
        ResultStore(url).optuna_storage()
    print(json.dumps({"first": t1 - t0, "rest": time.perf_counter() - t1}))
    """
)


def _loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def _env(tree: Path, hook_dir: str, log_dir: str | None, home: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), hook_dir])
    env.pop("TUNER_STUDY_STORAGE", None)
    if log_dir:
        env["TUNER_STARTUP_LOG"] = log_dir
    else:
        env.pop("TUNER_STARTUP_LOG", None)
    if home:
        env["TUNER_HOME"] = home
    return env


def _loads(log_dir: str) -> dict[str, list[int]]:
    """Migration-script loads per process, by role: the runner (`study run` without `--no-report`), its
    workers (`--no-report`), others (measurement processes: they open no store)."""
    out: dict[str, list[int]] = {"runner": [], "worker": []}
    for f in Path(log_dir).glob("*.json"):
        rec = json.loads(f.read_text(encoding="utf-8"))
        argv = rec["argv"]
        if "study" not in argv or "run" not in argv:
            continue
        out["worker" if "--no-report" in argv else "runner"].append(rec["loads"])
    return out


def _python(cmd: list[str], env: dict[str, str], hook_dir: str) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (a Python process) with `env`, its output captured as text, in the folder above
    `hook_dir`: not a checkout, since `python -c` and `python -m` import from their working folder first."""
    return subprocess.run(
        cmd,
        env=env,
        cwd=os.path.dirname(hook_dir),
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )


def _opens(tree: Path, url: str, n: int, hook_dir: str) -> dict[str, Any]:
    log_dir = tempfile.mkdtemp(prefix="startup-log-", dir=os.path.dirname(hook_dir))
    r = _python([sys.executable, "-c", _OPENS, url, str(n)], _env(tree, hook_dir, log_dir, None), hook_dir)
    if r.returncode != 0:
        raise SystemExit(f"startup.py: opening the store with {tree} failed:\n{r.stderr[-2000:]}")
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    recs = [json.loads(f.read_text(encoding="utf-8")) for f in Path(log_dir).glob("*.json")]
    rec["loads"] = sum(x["loads"] for x in recs)
    return rec


def _study(tree: Path, study: Path, workers: int, hook_dir: str) -> dict[str, Any]:
    home = tempfile.mkdtemp(prefix="startup-home-", dir=os.path.dirname(hook_dir))
    log_dir = tempfile.mkdtemp(prefix="startup-log-", dir=os.path.dirname(hook_dir))
    cmd = [sys.executable, "-m", "tuner", "study", "run", str(study), "--quiet"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    launch = dt.datetime.now()
    t0 = time.perf_counter()
    r = _python(cmd, _env(tree, hook_dir, log_dir, home), hook_dir)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(
            f"startup.py: the study run with {tree} failed ({r.returncode}):\n{r.stderr[-2000:]}"
        )
    dbs = list(Path(home).rglob("study.db"))
    if len(dbs) != 1:
        raise SystemExit(f"startup.py: expected one study.db under {home}, found {len(dbs)}")
    with sqlite3.connect(dbs[0]) as c:
        firsts = sorted(
            dt.datetime.fromisoformat(row[0])
            for row in c.execute("SELECT min(datetime_start) FROM trials GROUP BY study_id")
            if row[0]
        )
    if not firsts:
        raise SystemExit("startup.py: the study run made no trial")
    nth = firsts[min(workers, len(firsts)) - 1]
    return {
        "first": (firsts[0] - launch).total_seconds(),
        "nth": (nth - launch).total_seconds(),
        "wall": wall,
        "loads": _loads(log_dir),
    }


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}" if xs else "-"


def _all(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=existing_dir, help="another checkout of tuner, run beside this one")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--workers", type=positive_ints, default=[1, 2], help="comma-separated, e.g. 1,2")
    ap.add_argument("--study", default=str(REPO / "studies" / "quickstart.toml"))
    ap.add_argument("--opens", type=positive_int, default=8, help="openings of Optuna's tables per process")
    ap.add_argument("--no-study", action="store_true", help="only the openings, no study run")
    args = ap.parse_args()
    study = Path(args.study).resolve()
    if not args.no_study and not study.is_file():
        ap.error(f"--study: no such file: {args.study}")
    if args.old and not Path(args.old, "tuner", "__init__.py").is_file():
        ap.error(f"--old: not a checkout of tuner (no tuner/__init__.py): {args.old}")

    trees = {"new": REPO}
    if args.old:
        trees = {"old": Path(args.old).resolve(), **trees}
    work = temp_dir("tuner-startup-")
    hook_dir = os.path.join(work, "hook")
    os.makedirs(hook_dir)
    Path(hook_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    url = f"sqlite:///{work}/opens.db"

    print(f"load average at start: {_loadavg()}  ({os.cpu_count()} CPUs)")
    for tree in trees.values():  # bytecode written, the store made: nothing compiled or created when timed
        _opens(tree, url, 2, hook_dir)

    opens: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            opens[name].append(_opens(tree, url, args.opens, hook_dir))
    print(f"\nopening Optuna's tables {args.opens} times in a fresh process (seconds; median, then each run)")
    print("| code | first opening (imports included) | the other openings | migration-script loads |")
    print("|---|---:|---:|---:|")
    for name, runs in opens.items():
        print(
            f"| {name} | {_med([r['first'] for r in runs])} ({_all([r['first'] for r in runs])}) "
            f"| {_med([r['rest'] for r in runs])} ({_all([r['rest'] for r in runs])}) "
            f"| {_all([r['loads'] for r in runs]).replace('.00', '')} |"
        )

    if not args.no_study:
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for _ in range(args.repeats):
            for w in args.workers:
                for name, tree in trees.items():
                    runs.setdefault((name, w), []).append(_study(tree, study, w, hook_dir))
        print(
            f"\n`tuner study run {study.name} --quiet [--workers N]`, cold (seconds; median, then each run)"
        )
        head = "| code | workers | to the first trial | to the N-th task's first trial | whole run |"
        print(head + " script loads, last run: runner / each worker |")
        print("|---|---:|---:|---:|---:|---|")
        for (name, w), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "old")):
            loads = rs[-1]["loads"]
            print(
                f"| {name} | {w} | {_med([r['first'] for r in rs])} ({_all([r['first'] for r in rs])}) "
                f"| {_med([r['nth'] for r in rs])} ({_all([r['nth'] for r in rs])}) "
                f"| {_med([r['wall'] for r in rs])} ({_all([r['wall'] for r in rs])}) "
                f"| {loads['runner']} / {loads['worker'] or '-'} |"
            )
    print(f"\nload average at end: {_loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
