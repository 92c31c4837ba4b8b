"""Search efficiency of tuner's strategies, measured by replaying real brute-forced GPU tables.

For every table (Kernel Tuner cache file) and strategy, `optimize` runs `--seeds` times with `--budget`
evaluations; the script prints per file and overall:

- median (over seeds) evaluations to reach 1.05x and 1.01x of the table's optimum (not reached =
  budget + 1), their geometric mean over files, and the share of runs that reached them;
- the score of Willemsen et al. (FGCS 2024): mean over k = 1..budget of
  (f(k) - f_random(k)) / (f_opt - f_random(k)), f(k) the median best-so-far over seeds and f_random(k)
  the closed-form expectation of the best-so-far of uniform random search without replacement (failed
  configs count as the worst valid value): 1 = the optimum at once, 0 = no better than random;
- the strategy's own time per evaluation (median over runs; everything but the objective);
- side by side, the closed-form expectation of uniform random search for the same figures ("E[random]").

Every group figure comes with its 95% confidence interval (percentile bootstrap over the seeds of each
file), so a change, or a constant of the strategy varied (`--strategies auto,auto@restart_seed=1`: the
`restart_seed` field of `ModelStrategyConfig` changed, side by side), can be read against it.

`--prior loo` gives every run the other GPUs' tables of the same kernel folder as `prior`
(leave one GPU out) and adds per-folder aggregates. The tables are the ones committed under
`benchmarks/data/` unless `--data` names another folder (laid out as KERNEL/GPU.json[.gz], as the
hub's; its T4 copies, `-results` and `-metadata` files are skipped with a line on stderr: they are not
tables of their own). A table whose objective is higher-is-better (GFLOP/s) is maximised.

Kernel Tuner's strategies as peers (needs the `bench` extra, `kernel_tuner`): `--strategies kt` adds
kt:genetic_algorithm, kt:pso, kt:bayes_opt, kt:simulated_annealing and kt:random_sample; `kt:NAME` adds one
(any name in Kernel Tuner's strategy map). Each run is `kernel_tuner.tune_kernel` in simulation mode on an
uncompressed copy of the table (a temporary folder per process) with `max_fevals` = the budget. How the
runs are made comparable (see `run_kt`):

- search space: the table's configs, failed ones included, as for our strategies (a restriction "is in
  the table"; Kernel Tuner's own `tune_cache` would leave the failed ones out, telling it what fails);
- evaluations: every distinct table config Kernel Tuner's simulation runner serves, in order, failed
  ones included, is one evaluation (its own budget counts the same); repeats and configs it rejects as
  invalid without a lookup do not count. A strategy may stop before the budget (simulated_annealing
  counts rejected proposals in its schedule): its best-so-far then stays where it stopped;
- seeds: Kernel Tuner 1.5.0 draws from the global `random` and `numpy.random` generators, seeded with
  the run's seed; bayes_opt's Latin hypercube sampler (scipy, otherwise seeded from the OS) gets a seed
  drawn from numpy's, so every run is reproducible per seed;
- ms/eval: the wall time of Kernel Tuner's search loop (its strategy, its config checks and the
  simulation runner's lookups) per evaluation, without tune_kernel's start-up (reading the cache
  file, building the search space), which the record keeps as `kt_startup_s`; `--prior` is not used.

    python benchmarks/replay_search.py --jobs 2
    python benchmarks/replay_search.py --prior loo --strategies transfer_best,xgb_greedy,auto
    python benchmarks/replay_search.py --files 'convolution/A100*' --prior loo --strategies auto,auto@restart_seed=1
    python benchmarks/replay_search.py --strategies random,kt --jobs 1 --json kt.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import inspect
import io
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from _tables import is_table_file, quiet_logging, table_files  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_DATA = Path(__file__).resolve().parent / "data"  # the committed tables (benchmarks/data/README.md)

THRESHOLDS = (1.05, 1.01)

_TABLES: dict[str, Any] = {}


def _table(path: str) -> Any:
    from tuner.replay import load_table

    if path not in _TABLES:
        _TABLES[path] = load_table(path)
    return _TABLES[path]


def _loo_prior(path: str, order: str = "file", seed: int = 0) -> list[list[tuple[dict, float | None]]]:
    folder = Path(path).parent
    others = sorted(str(p) for p in folder.glob("*.json*") if str(p) != path and is_table_file(p))
    return [reorder_table(_table(p), order, seed).as_prior() for p in others]


# ---- the order a table's configs and parameters are presented in (--permute-order) ------------------
ORDERS = ("file", "shuffle", "reverse")
_ORDER_TAG = 0x0DE5  # keeps the permutation's random stream apart from the run's own (seeded with `seed`)


def reorder_table(table: Any, order: str, seed: int) -> Any:
    """`table` with its configs (rows: the order of the strategy's candidate pool) and its parameters
    (columns: the order of neighbour lists and of the partition portfolio's two-valued parameters) in
    another order: "shuffle", a random permutation of each drawn from `seed` (each run its own order);
    "reverse", both reversed; "file", the table as it is. Each parameter's values keep their order (a
    numeric domain is ascending whatever the rows' order), and every config keeps its value."""
    if order == "file":
        return table
    from tuner.search_spaces import SearchSpace

    rows = table.as_prior()
    names = list(table.space.names)
    if order == "reverse":
        rows, names = rows[::-1], names[::-1]
    elif order == "shuffle":
        rng = np.random.default_rng([_ORDER_TAG, seed])
        rows = [rows[int(i)] for i in rng.permutation(len(rows))]
        names = [names[int(i)] for i in rng.permutation(len(names))]
    else:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    space = SearchSpace.from_configs([{n: c[n] for n in names} for c, _ in rows], name=table.space.name)
    values = {space._hkey(space._key_unchecked(c)): v for c, v in rows}
    return dataclasses.replace(table, space=space, values=values)


# ---- closed-form uniform random search without replacement ---------------------------------------------
def table_values(table: Any) -> np.ndarray:
    """Values with failures replaced by the worst valid value, ascending."""
    ok = [v for v in table.values.values() if v is not None]
    worst = max(ok)
    return np.sort(np.array([worst if v is None else v for v in table.values.values()], dtype=np.float64))


def random_expected_best(values_sorted: np.ndarray, budget: int) -> np.ndarray:
    """E[best-so-far after k draws], k = 1..budget, uniform without replacement.

    P(best rank >= i) = C(N-i+1, k) / C(N, k) (1-based ranks, ascending values)."""
    v = values_sorted
    n = len(v)
    out = np.empty(budget)
    i = np.arange(1, n + 1, dtype=np.float64)
    for k in range(1, budget + 1):
        if k >= n:
            out[k - 1] = v[0]
            continue
        # S_{i+1}/S_i = (N-i-k+1)/(N-i+1)
        ratio = np.clip(n - i - k + 1, 0, None) / (n - i + 1)
        s = np.concatenate(([1.0], np.cumprod(ratio)))  # S_1..S_{N+1}
        p = s[:-1] - s[1:]
        out[k - 1] = float(np.dot(p, v))
    return out


def random_time_to(values_sorted: np.ndarray, threshold: float, budget: int) -> tuple[float, float]:
    """(median evaluations to reach `threshold`, capped at budget+1; P(reached within budget))."""
    n = len(values_sorted)
    m = int(np.searchsorted(values_sorted, threshold, side="right"))
    surv = 1.0  # P(T > k)
    median = budget + 1
    for k in range(1, budget + 1):
        surv *= max(0, n - m - (k - 1)) / (n - (k - 1)) if n - (k - 1) > 0 else 0.0
        if median == budget + 1 and surv <= 0.5:
            median = k
    return float(median), 1.0 - surv


# ---- one run ---------------------------------------------------------------------------------------
@quiet_logging()
def run_one(job: tuple[Any, ...]) -> dict[str, Any]:
    """One run of (file, strategy, seed, budget, prior mode[, order]); the order is "file" if not given."""
    path, strategy, seed, budget, prior_mode, *rest = job
    order = rest[0] if rest else "file"
    if strategy.startswith(KT_PREFIX):
        return run_kt(path, strategy[len(KT_PREFIX) :], seed, budget)
    import tuner

    table = reorder_table(_table(path), order, seed)
    prior = _loo_prior(path, order, seed) if prior_mode == "loo" else None
    t0 = time.perf_counter()
    res = tuner.optimize(
        table.space,
        table.objective_fn(),
        budget=budget,
        seed=seed,
        strategy=make_strategy(strategy, table.space, seed, prior),
        prior=prior,
    )
    wall = time.perf_counter() - t0
    trace = res.best_so_far()
    return {
        "file": path,
        "strategy": strategy,
        "seed": seed,
        "trace": [None if math.isinf(x) else x for x in trace],
        "values": [t.value for t in res.trials],
        "evaluations": res.evaluations,
        "strategy_ms_per_eval": 1000.0 * res.strategy_time_s / max(1, res.evaluations),
        "wall_s": wall,
    }


# ---- strategy variants: NAME@KEY=VALUE@... -----------------------------------------------------------
def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """`auto@restart_seed=1@patience=30` -> ("auto", {"restart_seed": 1, "patience": 30}). A value is read
    as JSON (numbers, true/false, null), else kept as a string; ValueError for a malformed setting."""
    name, *sets = spec.split("@")
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"strategy {spec!r}: setting {item!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return name, out


def make_strategy(spec: str, space: Any, seed: int, prior: Any) -> Any:
    """The strategy name, or for a variant (`NAME@KEY=VALUE...`) an instance built with those settings in
    its config object (`ModelStrategyConfig` for auto/model, `TPEConfig`, `XGBGreedyConfig`)."""
    name, sets = parse_variant(spec)
    if not sets:
        return name
    from tuner.strategies import get_strategy

    cls: Any = get_strategy(name)  # a strategy with a config_class takes config=
    config_cls = getattr(cls, "config_class", None)
    if config_cls is None:
        raise ValueError(f"strategy {name!r} has no settings to vary ({spec!r})")
    return cls(space, seed=seed, prior=prior, config=config_cls(**sets))


def variant_error(strategies: Sequence[str]) -> str | None:
    """Why one of the `NAME@KEY=VALUE` variants cannot be built (one line), or None."""
    from tuner.strategies import get_strategy

    for spec in strategies:
        if spec.startswith(KT_PREFIX):
            continue
        try:
            name, sets = parse_variant(spec)
            if not sets:
                get_strategy(name)  # an unknown name: ValueError naming the known ones
                continue
            config_cls = getattr(get_strategy(name), "config_class", None)
            if config_cls is None:
                return f"strategy {name!r} has no settings to vary ({spec!r})"
            config_cls(**sets)
        except (ValueError, TypeError) as exc:
            return f"{spec}: {exc}"
    return None


# ---- Kernel Tuner's strategies as peers --------------------------------------------------------------
KT_PREFIX = "kt:"
KT_DEFAULT = ("genetic_algorithm", "pso", "bayes_opt", "simulated_annealing", "random_sample")

_KT_DIR: str | None = None  # this process's folder of uncompressed cache copies
_KT_FILES: dict[str, tuple[str, dict[str, Any], frozenset[tuple[Any, ...]]]] = {}


def expand_strategies(names: Sequence[str]) -> list[str]:
    """`kt` becomes Kernel Tuner's default peers (`kt:NAME` each); order kept, duplicates dropped."""
    out: list[str] = []
    for s in names:
        out += [KT_PREFIX + k for k in KT_DEFAULT] if s == "kt" else [s]
    return list(dict.fromkeys(out))


def kt_unavailable(strategies: Sequence[str]) -> str | None:
    """Why the `kt:` strategies among `strategies` cannot run here (one line), or None if they can."""
    wanted = [s[len(KT_PREFIX) :] for s in strategies if s.startswith(KT_PREFIX)]
    if not wanted:
        return None
    try:
        from kernel_tuner.interface import strategy_map
    except ImportError:
        return (
            "kernel_tuner is not installed, so Kernel Tuner's strategies cannot run "
            "(install the bench extra: pip install -e '.[bench]')"
        )
    unknown = [w for w in wanted if w not in strategy_map]
    if unknown:
        return f"unknown Kernel Tuner strategies {unknown}; known: {', '.join(sorted(strategy_map))}"
    return None


def set_kt_dir(folder: str | None) -> None:
    """Where this process puts its cache copies (a worker initializer; None: a temporary folder)."""
    global _KT_DIR
    _KT_DIR = folder
    _KT_FILES.clear()


def _kt_cache_file(path: str) -> tuple[str, dict[str, Any], frozenset[tuple[Any, ...]]]:
    """(uncompressed copy for Kernel Tuner, the table's header, the set of its configs as tuples)."""
    global _KT_DIR
    if path not in _KT_FILES:
        if _KT_DIR is None:
            import atexit

            _KT_DIR = tempfile.mkdtemp(prefix="replay_search_kt_")
            atexit.register(shutil.rmtree, _KT_DIR, True)
        folder = Path(_KT_DIR) / f"p{os.getpid()}"
        folder.mkdir(exist_ok=True)
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
        for entry in doc["cache"].values():
            # Kernel Tuner's simulation runner adds these up as simulated tuning time (for its time
            # limit, which these runs do not use); the slim tables of benchmarks/data do not carry them
            for k in ("compile_time", "verification_time", "benchmark_time"):
                entry.setdefault(k, 0.0)
        keys = doc["tune_params_keys"]
        configs = frozenset(tuple(e[k] for k in keys) for e in doc["cache"].values())
        dst = folder / f"{len(_KT_FILES)}_{Path(path).parent.name}_{Path(path).name.split('.')[0]}.json"
        # well-formed: Kernel Tuner rewrites a cache that ends with ","
        dst.write_text(json.dumps(doc), encoding="utf-8")
        header = {k: doc[k] for k in ("kernel_name", "problem_size", "tune_params_keys", "tune_params")}
        _KT_FILES[path] = (str(dst), header, configs)
    return _KT_FILES[path]


class _TimedStrategy:
    """A Kernel Tuner strategy (anything with `tune`) whose search loop is timed."""

    def __init__(self, strategy: Any) -> None:
        self._tune = strategy.tune  # imports a lazily loaded strategy module now, before the run is seeded
        self.seconds = 0.0
        self.runner: Any = None

    def tune(self, searchspace: Any, runner: Any, tuning_options: Any) -> Any:
        self.runner = runner
        t0 = time.perf_counter()
        try:
            return self._tune(searchspace, runner, tuning_options)
        finally:
            self.seconds = time.perf_counter() - t0


@contextlib.contextmanager
def _seeded_latin_hypercube() -> Iterator[None]:
    """scipy's LatinHypercube seeds itself from the OS unless given a seed: give it one from numpy's global
    generator (which the run seeds), in bayes_opt and in Kernel Tuner's search space sampling."""
    import scipy.stats.qmc as qmc

    orig = qmc.LatinHypercube
    kw = "rng" if "rng" in inspect.signature(orig).parameters else "seed"

    def seeded(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault(kw, int(np.random.randint(2**31 - 1)))
        return orig(*args, **kwargs)

    modules = [qmc]
    with contextlib.suppress(ImportError):  # scikit-learn is optional in Kernel Tuner
        import kernel_tuner.strategies.bayes_opt as bo

        modules.append(bo)
    for m in modules:
        m.LatinHypercube = seeded  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in modules:
            m.LatinHypercube = orig  # type: ignore[attr-defined]


def run_kt(path: str, name: str, seed: int, budget: int) -> dict[str, Any]:
    """One run of Kernel Tuner's strategy `name` in simulation mode on the table at `path`, as the same
    record as `run_one` (module docstring: what counts as an evaluation, seeding, ms/eval)."""
    import kernel_tuner
    from constraint import FunctionConstraint  # python-constraint2, a Kernel Tuner dependency
    from kernel_tuner.interface import strategy_map

    table = _table(path)
    cache_file, header, configs = _kt_cache_file(path)
    keys = header["tune_params_keys"]
    problem_size = header["problem_size"]
    problem_size = tuple(problem_size) if isinstance(problem_size, list) else (problem_size,)

    def in_table(*values: Any) -> bool:
        return values in configs

    timed = _TimedStrategy(strategy_map[name])
    t0 = time.perf_counter()
    with _seeded_latin_hypercube(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        # seeded last: importing some modules (scikit-learn, for bayes_opt) draws from `random`
        random.seed(seed)
        np.random.seed(seed)
        results, _env = kernel_tuner.tune_kernel(
            header["kernel_name"],
            "",
            problem_size,
            [],
            header["tune_params"],
            restrictions=[FunctionConstraint(in_table)],
            strategy=timed,
            strategy_options={"max_fevals": budget},
            cache=cache_file,
            objective=table.objective,  # a GFLOP/s table is maximised by Kernel Tuner too
            objective_higher_is_better=table.higher_is_better,
            simulation_mode=True,
            quiet=True,
            seed=seed,
        )
    wall = time.perf_counter() - t0

    seen: set[tuple[Any, ...]] = set()
    values: list[float | None] = []
    for r in results:
        k = tuple(r[p] for p in keys)
        if k in seen or k not in configs:  # a repeat, or a config rejected without a lookup
            continue
        seen.add(k)
        values.append(table.lookup(dict(zip(keys, k, strict=True))))
    counted = getattr(timed.runner, "visited_results", None)  # what Kernel Tuner's budget counted
    if counted is not None and len(counted) != len(values):
        raise RuntimeError(
            f"{path}: kt:{name} seed {seed}: {len(values)} distinct table configs in the results, "
            f"but Kernel Tuner counted {len(counted)} evaluations"
        )
    values = values[:budget]
    trace: list[float | None] = []
    best = math.inf
    for v in values:
        if v is not None and v < best:
            best = v
        trace.append(None if math.isinf(best) else best)
    return {
        "file": path,
        "strategy": KT_PREFIX + name,
        "seed": seed,
        "trace": trace,
        "values": values,
        "evaluations": len(values),
        "strategy_ms_per_eval": 1000.0 * timed.seconds / max(1, len(values)),
        "wall_s": wall,
        "kt_startup_s": wall - timed.seconds,
    }


# ---- aggregation -----------------------------------------------------------------------------------
def _evals_to(trace: Sequence[float | None], thr: float, budget: int) -> int:
    for k, x in enumerate(trace, start=1):
        if x is not None and x <= thr:
            return k
    return budget + 1


def summarise(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per (file, strategy) and per strategy figures."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by[(r["file"], r["strategy"])].append(r)
    files = sorted({r["file"] for r in runs})
    strategies = list(dict.fromkeys(r["strategy"] for r in runs))
    per_file: dict[str, dict[str, dict[str, float]]] = {}
    for f in files:
        table = _table(f)
        vs = table_values(table)
        opt = table.optimum
        worst = vs[-1]
        frand = random_expected_best(vs, budget)
        row: dict[str, dict[str, float]] = {}
        er: dict[str, float] = {"score": 0.0, "ms": float("nan")}
        for thr in THRESHOLDS:
            med, p = random_time_to(vs, opt * thr, budget)
            er[f"med{thr}"] = med
            er[f"reach{thr}"] = p
        row["E[random]"] = er
        for s in strategies:
            rs = by.get((f, s), [])
            if not rs:
                continue
            traces = _padded_traces(rs, worst, budget)
            fk = np.median(traces, axis=0)
            denom = opt - frand
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(np.abs(denom) > 1e-300, (fk - frand) / denom, 1.0)
            d: dict[str, float] = {
                "score": float(np.mean(terms)),
                "n": len(rs),
                "ms": float(np.median([r["strategy_ms_per_eval"] for r in rs])),
            }
            for thr in THRESHOLDS:
                ev = [_evals_to(r["trace"], opt * thr, budget) for r in rs]
                d[f"med{thr}"] = float(np.median(ev))
                d[f"reach{thr}"] = float(np.mean([e <= budget for e in ev]))
            row[s] = d
        per_file[f] = row
    return {"files": files, "strategies": ["E[random]", *strategies], "per_file": per_file}


def _padded_traces(rs: list[dict[str, Any]], worst: float, budget: int) -> np.ndarray:
    """Best-so-far per run and evaluation (n_runs x budget); failures before the first success count as
    the worst valid value, and a run that stopped before the budget keeps its last best-so-far."""
    return np.array(
        [
            [worst if x is None else x for x in (r["trace"] + (r["trace"] or [None])[-1:] * budget)[:budget]]
            for r in rs
        ],
        dtype=np.float64,
    )


def bootstrap_ci(
    runs: list[dict[str, Any]],
    files: list[str],
    strategy: str,
    budget: int,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """95% percentile-bootstrap intervals of the group figures (geo med, reached, score), resampling each
    file's runs (seeds) with replacement. A seeded generator: the same runs give the same intervals."""
    rng = np.random.default_rng(seed)
    per_file = []
    for f in files:
        rs = [r for r in runs if r["file"] == f and r["strategy"] == strategy]
        if not rs:
            continue
        table = _table(f)
        vs = table_values(table)
        opt = table.optimum
        frand = random_expected_best(vs, budget)
        denom = opt - frand
        ev = {thr: np.array([_evals_to(r["trace"], opt * thr, budget) for r in rs]) for thr in THRESHOLDS}
        per_file.append((ev, _padded_traces(rs, vs[-1], budget), frand, denom))
    if not per_file:
        return {}
    reps: dict[str, list[float]] = defaultdict(list)
    for _ in range(n_boot):
        logs: dict[float, list[float]] = defaultdict(list)
        hits: dict[float, list[np.ndarray]] = defaultdict(list)
        scores = []
        for ev, traces, frand, denom in per_file:
            idx = rng.integers(len(traces), size=len(traces))
            for thr in THRESHOLDS:
                logs[thr].append(math.log(float(np.median(ev[thr][idx]))))
                hits[thr].append(ev[thr][idx] <= budget)
            fk = np.median(traces[idx], axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(np.abs(denom) > 1e-300, (fk - frand) / denom, 1.0)
            scores.append(float(np.mean(terms)))
        for thr in THRESHOLDS:
            reps[f"geo{thr}"].append(math.exp(float(np.mean(logs[thr]))))
            reps[f"reach{thr}"].append(float(np.mean(np.concatenate(hits[thr]))))
        reps["score"].append(float(np.mean(scores)))
    return {k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for k, v in reps.items()}


def _group(
    summary: dict[str, Any], files: list[str], runs: list[dict[str, Any]], budget: int = 0
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, float]] = {}
    for s in summary["strategies"]:
        rows = [summary["per_file"][f][s] for f in files if s in summary["per_file"][f]]
        if not rows:
            continue
        d: dict[str, float] = {}
        for thr in THRESHOLDS:
            d[f"geo{thr}"] = float(math.exp(np.mean([math.log(r[f"med{thr}"]) for r in rows])))
            if s == "E[random]":
                d[f"reach{thr}"] = float(np.mean([r[f"reach{thr}"] for r in rows]))
            else:  # share of all runs (files weigh by their number of runs)
                w = [r["n"] for r in rows]
                d[f"reach{thr}"] = float(np.average([r[f"reach{thr}"] for r in rows], weights=w))
        d["score"] = float(np.mean([r["score"] for r in rows]))
        ms = [r["strategy_ms_per_eval"] for r in runs if r["strategy"] == s and r["file"] in files]
        d["ms"] = float(np.median(ms)) if ms else float("nan")
        if budget and s != "E[random]":
            d["ci"] = bootstrap_ci(runs, files, s, budget)  # type: ignore[assignment]
        out[s] = d
    return out


def _short(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name.split('.')[0]}"


def _ci_cell(d: dict[str, Any], key: str, fmt: str, width: int) -> str:
    """One group figure with its interval, right-aligned in `width` characters."""
    txt = format(d[key], fmt)
    if key in d.get("ci", {}):
        lo, hi = d["ci"][key]
        txt += f" [{format(lo, fmt)}, {format(hi, fmt)}]"
    return f" {txt:>{width - 1}}"


def print_report(
    summary: dict[str, Any], runs: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, dict[str, dict[str, Any]]]:
    """Print the report; returns the group figures (with their intervals) per group name."""
    budget = args.budget
    strategies = summary["strategies"]
    print(
        f"# replay search: budget {budget}, seeds {args.seeds}, prior {args.prior}, order {args.permute_order}; "
        f"not reached = {budget + 1}; E[random] = closed-form uniform random search"
    )
    print()
    print("## per file: median evals to 1.05x / 1.01x, reached 1.05x / 1.01x, score")
    head = f"{'file':<26}" + "".join(f"{s:>34}" for s in strategies)
    print(head)
    for f in summary["files"]:
        line = f"{_short(f):<26}"
        for s in strategies:
            r = summary["per_file"][f].get(s)
            if r is None:
                line += f"{'-':>34}"
                continue
            cell = (
                f"{r['med1.05']:.0f}/{r['med1.01']:.0f} {r['reach1.05']:.2f}/{r['reach1.01']:.2f} "
                f"{r['score']:+.2f}"
            )
            line += f"{cell:>34}"
        print(line)
    print()
    w = max(16, 2 + max(len(s) for s in strategies))
    selections = [("ALL", summary["files"])]
    if args.prior == "loo" or args.by_folder:
        folders = sorted({Path(f).parent.name for f in summary["files"]})
        selections += [(fo, [f for f in summary["files"] if Path(f).parent.name == fo]) for fo in folders]
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for name, files in selections:
        g = _group(summary, files, runs, budget)
        groups[name] = g
        print(f"## {name} ({len(files)} files; [95% CI], bootstrap over seeds)")
        print(
            f"{'strategy':<{w}}{'geo med 1.05x':>22}{'geo med 1.01x':>22}{'reached 1.05x':>19}"
            f"{'reached 1.01x':>19}{'score':>21}{'ms/eval':>9}"
        )
        for s, d in g.items():
            ms = "-" if math.isnan(d["ms"]) else f"{d['ms']:.1f}"
            print(
                f"{s:<{w}}{_ci_cell(d, 'geo1.05', '.1f', 22)}{_ci_cell(d, 'geo1.01', '.1f', 22)}"
                f"{_ci_cell(d, 'reach1.05', '.2f', 19)}{_ci_cell(d, 'reach1.01', '.2f', 19)}"
                f"{_ci_cell(d, 'score', '.2f', 21)}{ms:>9}"
            )
        print()
    short: dict[str, list[int]] = defaultdict(list)  # runs that stopped before the budget
    for r in runs:
        if r["evaluations"] < budget:
            short[r["strategy"]].append(r["evaluations"])
    for s, ev in short.items():
        n = sum(r["strategy"] == s for r in runs)
        print(
            f"{s} stopped before the budget in {len(ev)} of {n} runs (median {np.median(ev):.0f} evaluations); "
            f"its best-so-far stays where it stopped"
        )
    if any(s.startswith(KT_PREFIX) for s in strategies):
        startup = [r["kt_startup_s"] for r in runs if "kt_startup_s" in r]
        print(
            "ms/eval of kt:* = wall time of Kernel Tuner's search loop per evaluation (its strategy, its config "
            "checks, the simulation runner's lookups), without tune_kernel's start-up"
            + (f" (median {np.median(startup):.2f} s a run)" if startup else "")
        )
    # tpe versus random: fewer median evaluations to 1.05x per file
    if "tpe" in strategies and "random" in strategies:
        better = sum(
            summary["per_file"][f]["tpe"]["med1.05"] < summary["per_file"][f]["random"]["med1.05"]
            for f in summary["files"]
        )
        ties = sum(
            summary["per_file"][f]["tpe"]["med1.05"] == summary["per_file"][f]["random"]["med1.05"]
            for f in summary["files"]
        )
        print(
            f"tpe beats random (fewer median evals to 1.05x) on {better} of {len(summary['files'])} files "
            f"({ties} ties)"
        )
    return groups


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        default=str(DEFAULT_DATA),
        help="folder with KERNEL/GPU.json.gz tables (default: the committed benchmarks/data)",
    )
    ap.add_argument("--files", default="", help="comma-separated globs relative to --data (default: all)")
    ap.add_argument(
        "--strategies",
        default="random,tpe,auto",
        help="comma-separated strategy names; 'kt' adds Kernel Tuner's "
        f"{', '.join(KT_DEFAULT)} and 'kt:NAME' one of its strategies (needs kernel_tuner); "
        "NAME@KEY=VALUE[@KEY=VALUE...] runs NAME with those fields of its config object changed "
        "(e.g. auto@restart_seed=1), side by side with NAME",
    )
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--prior", choices=["none", "loo"], default="none")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--by-folder", action="store_true", help="also aggregate per kernel folder")
    ap.add_argument(
        "--permute-order",
        choices=ORDERS,
        default="file",
        help="present each table's configs (the candidate pool's order) and parameters (the order of "
        "neighbour lists and two-valued switches) in the file's order (default), in a random permutation "
        "drawn from each run's seed ('shuffle'), or reversed ('reverse'); with --prior loo the prior tables "
        "too. A strategy whose ties fall to enumeration order scores differently; Kernel Tuner's kt:* "
        "strategies read the file and take only 'file'",
    )
    ap.add_argument("--json", default="", help="write every run and the summary to this file")
    ap.add_argument(
        "--from-json",
        default="",
        help="comma-separated --json files of earlier runs (e.g. other seeds): report their runs "
        "together instead of running anything (--budget and --prior must match)",
    )
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.budget < 1 or args.jobs < 1 or args.seed0 < 0:
        ap.error("--seeds, --budget and --jobs must be >= 1 and --seed0 >= 0")
    from_json = [fn for fn in args.from_json.split(",") if fn]
    missing = [fn for fn in from_json if not Path(fn).is_file()]
    if missing:
        ap.error(f"--from-json: no file {', '.join(missing)}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json: no folder {Path(args.json).resolve().parent} to write {args.json} into")

    data = Path(args.data)
    pats = [p for p in args.files.split(",") if p] or ["*/*.json*"]
    files = table_files(data, pats, script="replay_search")
    if not files:
        print(f"no tables match {pats} under {data}", file=sys.stderr)
        return 2
    strategies = expand_strategies([s for s in args.strategies.split(",") if s])
    reason = variant_error(strategies)
    if reason:
        print(f"replay_search: {reason}", file=sys.stderr)
        return 2
    if args.permute_order != "file" and any(s.startswith(KT_PREFIX) for s in strategies):
        print(
            "replay_search: kt:* strategies read the table file: --permute-order file only", file=sys.stderr
        )
        return 2
    if not args.from_json:
        reason = kt_unavailable(strategies)
        if reason:
            print(f"replay_search: {reason}", file=sys.stderr)
            return 2
    prior_mode = args.prior
    jobs = [
        (f, s, seed, args.budget, prior_mode, args.permute_order)
        for f in files
        for s in strategies
        for seed in range(args.seed0, args.seed0 + args.seeds)
    ]
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    if from_json:
        for fn in from_json:
            with open(fn, encoding="utf-8") as fh:
                doc = json.load(fh)
            if (
                doc["args"]["budget"] != args.budget
                or doc["args"]["prior"] != args.prior
                or doc["args"].get("permute_order", "file") != args.permute_order
            ):
                print(f"{fn}: budget/prior/permute-order differ from this invocation", file=sys.stderr)
                return 2
            runs += [r for r in doc["runs"] if r["file"] in files and r["strategy"] in strategies]
        args.seeds = len({r["seed"] for r in runs})
        jobs = []

    def progress() -> None:
        if len(runs) % max(1, len(jobs) // 20) == 0 or len(runs) == len(jobs):
            print(
                f"... {len(runs)}/{len(jobs)} runs, {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    with tempfile.TemporaryDirectory(prefix="replay_search_kt_") as kt_dir:
        set_kt_dir(kt_dir)  # cache copies for Kernel Tuner, a subfolder per process
        try:
            if args.jobs > 1:
                with ProcessPoolExecutor(
                    max_workers=args.jobs, initializer=set_kt_dir, initargs=(kt_dir,)
                ) as ex:
                    for r in ex.map(run_one, jobs, chunksize=1):
                        runs.append(r)
                        progress()
            else:
                for j in jobs:
                    runs.append(run_one(j))
                    progress()
        finally:
            set_kt_dir(None)
    summary = summarise(runs, args.budget)
    summary["groups"] = print_report(summary, runs, args)
    print(
        f"\n{len(runs)} runs in {time.perf_counter() - t0:.0f} s (--jobs {args.jobs}, {os.cpu_count()} cpus)"
    )
    if args.json:
        from tuner._atomic import atomic_write

        atomic_write(args.json, json.dumps({"args": vars(args), "runs": runs, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
