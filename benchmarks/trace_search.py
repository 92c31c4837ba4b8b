"""Trace single replay runs of the model-guided strategy: where each new incumbent came from.

`replay_search.py` prints how fast a strategy reaches the optimum; this script shows why a run is slow or
misses. For each seed it replays one table (a Kernel Tuner cache file, as in `replay_search.py`) with
`auto` or a variant (`auto@FIELD=VALUE`, the fields of `ModelStrategyConfig`) and prints:

- the evaluations to 1.05x and 1.01x of the table's optimum, and where the search restarted (with a prior);
- per component (space-filling draws, the model's ranking, local steps, the exploration slot, the
  partition portfolio, ...; `ModelStrategy.sources`): its proposals and how many became a new incumbent;
- the incumbent path: result number, component, time / optimum, config;
- with `--region PARAM=VALUE,...`: when the run first measured a config of that region, and how many of
  its configs it measured before reaching 1.05x and by the end (is the optimum's region found but not
  searched, or never found?);
- with `--all`: every result, not only the new incumbents;
- with `--summary`: instead of the paths, one summary over every table and seed given, of the results
  before each run reached 1.05x: per component its proposals, new incumbents and value per proposal (the
  summed log of the incumbent's improvements it made, divided by its proposals), in the first
  `--early` results and after; and the share of proposals that became a new incumbent by their Hamming
  distance from the incumbent (1, 2, 3, 4 or more parameters; the space-filling draws left out).

    python benchmarks/trace_search.py convolution/A4000 --seeds 0,1
    python benchmarks/trace_search.py convolution/A100 --prior loo --seeds 0-9 \\
        --region tile_size_x=1,tile_size_y=3,read_only=1,use_padding=0,use_shmem=1
    python benchmarks/trace_search.py gemm/RTX_2080_Ti --strategy auto@patience=25 --seeds 3 --all
    python benchmarks/trace_search.py convolution/A4000 gemm/RTX_3090 --seeds 0-7 --summary

A table is a path or a name under `benchmarks/data/` (`convolution/A100` for
`benchmarks/data/convolution/A100.json.gz`). The replay is deterministic per seed, so a seed's figures
here are the ones `replay_search.py` counts for it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_search as rs  # noqa: E402  (the sibling script: tables, priors, variants)
from _tables import positive_int, quiet_logging  # noqa: E402


def resolve_table(name: str, data: Path = rs.DEFAULT_DATA) -> str:
    """A table's path: `name` itself if it is a file, else `data/NAME.json.gz` or `data/NAME.json`."""
    p = Path(name)
    if p.is_file():
        return str(p)
    for cand in (data / f"{name}.json.gz", data / f"{name}.json", data / name):
        if cand.is_file():
            return str(cand)
    known = sorted(str(Path(q).relative_to(data)).split(".json")[0] for q in rs.table_files(data))
    raise ValueError(f"no table {name!r}; the tables under {data.name}/: {', '.join(known)}")


def parse_seeds(text: str) -> list[int]:
    """'0,3,5-7' -> [0, 3, 5, 6, 7]; ValueError for what is not seeds (an empty range such as 3-1 too)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            seeds = list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
        except ValueError:
            seeds = []
        if not seeds:
            raise ValueError(f"--seeds: {part!r} is not a seed or a range like 0-9")
        out += seeds
    if not out:
        raise ValueError("--seeds: no seed given")
    return out


def parse_region(text: str | None, names: Sequence[str]) -> dict[str, Any]:
    """'tile_size_x=1,use_shmem=1' -> {'tile_size_x': 1, 'use_shmem': 1} (values read as JSON); ValueError
    for an item that is not PARAM=VALUE with PARAM one of `names`."""
    if not text:
        return {}
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        if not sep or key not in names:
            raise ValueError(f"--region: {item!r} is not PARAM=VALUE with PARAM one of {', '.join(names)}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def strategy_config(spec: str) -> Any:
    """The `ModelStrategyConfig` of `auto` / `model` or a variant of them; ValueError for another strategy
    or settings the config refuses."""
    from tuner.strategies import ModelStrategyConfig

    try:
        name, sets = rs.parse_variant(spec)
    except ValueError as exc:
        raise ValueError(f"--strategy: {exc}") from None
    if name not in ("auto", "model"):
        raise ValueError(f"--strategy: only auto and model (and their variants) are traced, not {name!r}")
    try:
        return ModelStrategyConfig(**sets)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--strategy {spec}: {exc}") from None


def build_strategy(spec: str, space: Any, seed: int, prior: Any) -> Any:
    """A `ModelStrategy` instance for `auto` / `model` or a variant of them (its `sources` are read)."""
    from tuner.strategies import ModelStrategy

    return ModelStrategy(space, seed=seed, prior=prior, config=strategy_config(spec))


def trace_run(
    path: str, spec: str, seed: int, budget: int, prior_mode: str, region: dict[str, Any]
) -> dict[str, Any]:
    """One replay run: per result its config, value, component; plus the figures printed for it."""
    import tuner

    table = rs._table(path)
    prior = rs._loo_prior(path) if prior_mode == "loo" else None
    strat = build_strategy(spec, table.space, seed, prior)
    res = tuner.optimize(
        table.space, table.objective_fn(), budget=budget, seed=seed, strategy=strat, prior=prior
    )
    opt = min(v for v in table.values.values() if v is not None)
    sources = list(strat.sources)
    rows = []
    for k, t in enumerate(res.trials):
        src = sources[k] if k < len(sources) else "?"  # one proposal per result (a projected one too)
        rows.append({"n": k + 1, "source": src, "value": t.value, "config": dict(t.config)})
    trace = res.best_so_far()
    reach = {
        thr: next((k + 1 for k, x in enumerate(trace) if math.isfinite(x) and x <= thr * opt), None)
        for thr in rs.THRESHOLDS
    }
    out: dict[str, Any] = {
        "seed": seed,
        "opt": opt,
        "rows": rows,
        "reach": reach,
        "restart": strat.restarted_at,
    }
    if region:
        inside = [r["n"] for r in rows if all(r["config"].get(k) == v for k, v in region.items())]
        hit = reach[rs.THRESHOLDS[0]]
        out["region"] = {
            "first": inside[0] if inside else None,
            "before": sum(1 for n in inside if hit is None or n < hit),
            "total": len(inside),
        }
    return out


def _cfg(config: dict[str, Any], names: Sequence[str]) -> str:
    return ",".join(str(config[n]) for n in names)


def print_run(run: dict[str, Any], names: Sequence[str], show_all: bool) -> None:
    r05, r01 = (run["reach"][t] for t in rs.THRESHOLDS)
    restart = f", restarted cold after {run['restart']} results" if run["restart"] is not None else ""
    print(f"## seed {run['seed']}: 1.05x at {r05 or 'not reached'}, 1.01x at {r01 or 'not reached'}{restart}")
    if "region" in run:
        g = run["region"]
        print(
            f"   region: first measured at {g['first'] or 'never'}; {g['before']} of its configs measured "
            f"before 1.05x (or by the end), {g['total']} by the end"
        )
    props, wins = Counter(), Counter()
    best = math.inf
    lines = []
    for r in run["rows"]:
        props[r["source"]] += 1
        v = r["value"]
        new = v is not None and math.isfinite(v) and v < best
        if new:
            best = v
            wins[r["source"]] += 1
        if new or show_all:
            shown = "failed" if v is None else f"{v / run['opt']:.3f}x"
            mark = " *" if new and show_all else ""
            lines.append(f"   {r['n']:>4}  {r['source']:<22} {shown:>9}  {_cfg(r['config'], names)}{mark}")
    print(
        "   components (proposals / new incumbents): " + ", ".join(f"{s} {props[s]}/{wins[s]}" for s in props)
    )
    print(f"   {'n':>4}  {'component':<22} {'/ optimum':>9}  {','.join(names)}")
    print("\n".join(lines))


DISTANCES = ("1", "2", "3", "4+")


def summarise(runs: Sequence[dict[str, Any]], early: int = 40) -> dict[str, Any]:
    """Over the results of `runs` (from `trace_run`) before each reached 1.05x (all of a run that did not):
    per component and phase ("early": result n <= `early`, else "late") its proposals, new incumbents and
    summed log improvement of the incumbent; per Hamming distance from the incumbent (a proposal's, at the
    time it was made; the space-filling draws and the first result left out) the proposals and new
    incumbents. A new incumbent is a result better than every earlier one by more than 0.1%."""
    comp: dict[tuple[str, str], Counter] = {}
    dist = {d: Counter() for d in DISTANCES}
    for run in runs:
        hit = run["reach"][rs.THRESHOLDS[0]]
        inc: dict[str, Any] | None = None
        best = math.inf
        for r in run["rows"]:
            if hit is not None and r["n"] > hit:
                break
            v = r["value"]
            win = v is not None and math.isfinite(v) and v < best * (1.0 - 1e-3)
            gain = math.log(best / v) if win and math.isfinite(best) else 0.0
            phase = "early" if r["n"] <= early else "late"
            c = comp.setdefault((r["source"], phase), Counter())
            c["proposals"] += 1
            c["wins"] += int(win)
            c["gain"] += gain
            if inc is not None and r["source"] != "space_filling":
                d = sum(r["config"][k] != inc[k] for k in inc)  # >= 1: no config is measured twice
                key = DISTANCES[min(d, len(DISTANCES)) - 1]
                dist[key]["proposals"] += 1
                dist[key]["wins"] += int(win)
            if v is not None and math.isfinite(v) and v < best:
                best, inc = v, r["config"]
    return {"components": comp, "distance": dist, "runs": len(runs), "early": early}


def print_summary(summary: dict[str, Any]) -> None:
    early = summary["early"]
    print(
        f"## summary over {summary['runs']} runs, results before 1.05x "
        "(a new incumbent: more than 0.1% better than every earlier result)"
    )
    print(f"   {'component':<24} {'phase':<6} {'proposals':>9} {'new inc.':>8} {'value/proposal':>15}")
    for (src, phase), c in sorted(summary["components"].items()):
        per = c["gain"] / max(1, c["proposals"])
        label = f"<= {early}" if phase == "early" else f"> {early}"
        print(f"   {src:<24} {label:<6} {c['proposals']:>9} {c['wins']:>8} {per:>15.4f}")
    print("   by Hamming distance from the incumbent (space-filling draws left out):")
    for d in DISTANCES:
        c = summary["distance"][d]
        share = c["wins"] / c["proposals"] if c["proposals"] else float("nan")
        print(
            f"   {d:>3} parameters: {c['proposals']:>6} proposals, {c['wins']:>5} new incumbents ({share:.3f})"
        )


@quiet_logging()
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "table",
        nargs="+",
        help="a Kernel Tuner cache file, or a name under benchmarks/data/ (convolution/A100); several with "
        "--summary",
    )
    ap.add_argument("--seeds", default="0", help="seeds: 0,3,5-7 (default 0)")
    ap.add_argument("--strategy", default="auto", help="auto or a variant, auto@FIELD=VALUE (default auto)")
    ap.add_argument("--budget", type=positive_int, default=200)
    ap.add_argument("--prior", choices=("none", "loo"), default="none", help="loo: the other GPUs' tables")
    ap.add_argument("--region", help="PARAM=VALUE,...: count the results inside this region")
    ap.add_argument("--all", action="store_true", help="print every result, not only the new incumbents")
    ap.add_argument(
        "--data", default=str(rs.DEFAULT_DATA), help="folder of the tables (default benchmarks/data)"
    )
    ap.add_argument(
        "--summary", action="store_true", help="one summary over every table and seed instead of the paths"
    )
    ap.add_argument(
        "--early", type=positive_int, default=40, help="--summary: results counted as early (default 40)"
    )
    args = ap.parse_args(argv)
    if args.summary and (args.region or args.all):
        ap.error("--summary takes neither --region nor --all")
    if not args.summary and len(args.table) > 1:
        ap.error("several tables only with --summary")
    try:  # every argument checked before the first run: a bad one is bad usage (exit 2, one line)
        seeds = parse_seeds(args.seeds)
        strategy_config(args.strategy)
        paths = [resolve_table(name, Path(args.data)) for name in args.table]
    except ValueError as exc:
        ap.error(str(exc))
    if args.summary:
        runs = [trace_run(p, args.strategy, s, args.budget, args.prior, {}) for p in paths for s in seeds]
        print(
            f"# trace summary: {', '.join(args.table)}, {args.strategy}, budget {args.budget}, prior {args.prior}"
        )
        print_summary(summarise(runs, args.early))
        return 0
    [path] = paths
    table = rs._table(path)
    names = list(table.space.names)
    try:
        region = parse_region(args.region, names)
    except ValueError as exc:
        ap.error(str(exc))
    opt = min(v for v in table.values.values() if v is not None)
    shown = Path(path).resolve()
    shown_path = shown.relative_to(rs.REPO) if shown.is_relative_to(rs.REPO) else shown
    print(
        f"# trace: {shown_path}, {args.strategy}, budget {args.budget}, prior {args.prior}; optimum {opt:.6g}"
    )
    if region:
        n_region = sum(
            1 for c, v in table.as_prior() if v is not None and all(c[p] == x for p, x in region.items())
        )
        print(f"# region {args.region}: {n_region} valid configs measured in the table")
    for seed in seeds:
        print_run(trace_run(path, args.strategy, seed, args.budget, args.prior, region), names, args.all)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error of the trace
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
