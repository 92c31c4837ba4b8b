"""`tuner study from-misses`: a study file for what record mode saw production miss.

The recorded misses of registered kernels (`tuner.kernel(name, mode="record")`) become `[[tasks]]`
entries: one per (kernel, backend, dtype, problem), the problem being the recorded key fields, so the
exported cache entry of each task is the exact key production will look up (`kernel_cache_key` builds
both). Tasks are weighted by how often production called them: the most-called come first, and each
task's trial budget is the study's budget scaled by its share of the calls against an even split,
clipped to [budget / 4, budget * 2] (a shape called 100x more than another gets more of the tuning).
Keys recorded for a decorated function of the user's own (`@tuner.autotune`) are not registered kernels:
they are listed as a comment (their key, calls, fallback) so nothing is dropped silently, or, given an
input factory (`--factory module:function`), written as a study of their own (`decorated_study`) that
`tuner study run FILE --executor tuner.studies._from_misses:run_decorated` tunes into the functions'
own store.

The device of the study: the recorded device's arch when every selected miss has the same one ("cpu",
or "sm80"/"sm90" from a "<GPU name> (sm80)" device), else "auto" (tune on the machine the study runs on).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import BadInput

__all__ = [
    "FromMisses",
    "study_from_misses",
    "decorated_study",
    "run_decorated",
    "render_study",
    "device_arch",
    "load_factory",
    "factory_ref",
    "check_task_factories",
    "factory_call",
    "factory_measure",
    "validate_factory_entries",
]

_ARCH = re.compile(r"\((sm\d+)\)\s*$")


def device_arch(device: str) -> str | None:
    """The study arch of a recorded device name, or None when it is not a known arch. An AMD GPU's
    label carries ROCm torch's "(sm94)" for gfx942: its gfx target comes from `device_family`."""
    from tuner.search_spaces.devices import DEVICES, device_family

    if device in DEVICES:
        return device
    fam = device_family(device)
    if fam.vendor == "amd":
        return fam.arch if fam.arch in DEVICES else None
    m = _ARCH.search(device)
    if m and m.group(1) in DEVICES:
        return m.group(1)
    return None


@dataclass(frozen=True)
class FromMisses:
    text: str  # the study file
    tasks: int
    kernels: tuple[str, ...]
    skipped_calls: int  # misses under --min-calls
    unregistered: int  # misses of decorated functions (listed as comments)
    registered: int = 0  # misses of registered kernels in a `--factory` study (listed as comments)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def _inline(d: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in sorted(d.items())) + " }"


def _is_registered(kernel: str) -> bool:
    """`kernel` is a registered kernel's name; a kernel module that cannot be imported raises (ImportError
    naming it) rather than passing its kernels' misses off as a decorated function's."""
    from tuner.kernels import get_kernel

    try:
        get_kernel(kernel)
    except ValueError:  # unknown name
        return False
    return True


def _selection(kernels: Sequence[str]) -> tuple[str, str]:
    """The `--kernel` options that selected the rows, as the written study's first line gives them, and
    as a message says them after a count (" of rmsnorm, mine.launch"); both empty when none was given."""
    return "".join(f" --kernel {k}" for k in kernels), (f" of {', '.join(kernels)}" if kernels else "")


def study_from_misses(
    rows: Sequence[Any],
    *,
    name: str = "from_misses",
    min_calls: int = 1,
    trials: int = 20,
    seconds: float | None = None,
    strategy: str = "auto",
    device: str | None = None,
    output: str | None = None,
    finalists: int | None = None,
    kernels: Sequence[str] = (),
) -> FromMisses:
    """Build the study file text from miss rows (`tuner.runtime.read_misses()`; `kernels`: the `--kernel`
    names that selected them, said in the file and the messages). BadInput if no miss of a registered
    kernel is left after `min_calls`."""
    if min_calls < 1:
        raise BadInput(f"--min-calls must be >= 1, got {min_calls}")
    if trials < 1:
        raise BadInput(f"--trials must be >= 1, got {trials}")
    kept = [r for r in rows if r.calls >= min_calls]
    skipped = sum(r.calls for r in rows if r.calls < min_calls)
    reg = [r for r in kept if r.registered or _is_registered(r.kernel)]
    reg = [r for r in reg if r.backend or not r.registered]
    other = [r for r in kept if r not in reg]
    options, of = _selection(kernels)
    if not reg:
        raise BadInput(
            f"no recorded miss of a registered kernel with at least {min_calls} calls "
            f"({len(rows)} misses{of} recorded, {len(other)} of them of decorated functions with at least "
            f"{min_calls} calls: give --factory MODULE:FUNCTION to tune those, see docs/production.md of tuner's repository)"
            if other
            else f"no recorded miss of a registered kernel with at least {min_calls} calls "
            f"({len(rows)} misses{of} recorded)"
        )
    arch = device
    if arch is None:
        archs = {device_arch(r.key.device) for r in reg}
        arch = archs.pop() if len(archs) == 1 and None not in archs else "auto"
    total = sum(r.calls for r in reg)
    even = total / len(reg)
    lines = [
        f"# Written by `tuner study from-misses{options} --min-calls {min_calls}` from {len(reg)} recorded misses",
        f"# ({total} calls) of {len(sorted({r.kernel for r in reg}))} registered kernels; devices seen: "
        + ", ".join(sorted({r.key.device for r in reg}))
        + ".",
        "# Each task's trials: the study budget x its share of the calls against an even split, in",
        f"# [{max(1, trials // 4)}, {trials * 2}]. Tune with `tuner study run FILE`, ship with",
        "# `tuner study export FILE --out cache.json` and `tuner cache import cache.json` (docs/production.md of tuner's repository).",
        "",
        "[study]",
        f"name = {_toml_value(name)}",
        f"device = {_toml_value(arch)}",
        f"strategy = {_toml_value(strategy)}",
        "seed = 0",
        "budget = " + _inline({"trials": trials, **({"seconds": seconds} if seconds else {})}),
    ]
    if finalists is not None:
        if finalists < 1:
            raise BadInput(f"--finalists must be >= 1, got {finalists}")
        lines.append(f"finalists = {finalists}")
    if output:
        lines.append(f"output = {_toml_value(output)}")
    seen: set[tuple[Any, ...]] = set()
    for r in sorted(reg, key=lambda r: (-r.calls, r.kernel, r.key.hash)):
        problem = {k: v for k, v in r.problem.items() if k != "dtype"}
        dtype = r.problem.get("dtype")
        backend = r.backend or "triton"
        ident = (r.kernel, backend, dtype, tuple(sorted(problem.items())))
        if ident in seen:  # the same problem recorded under other versions or devices: tuned once here
            continue
        seen.add(ident)
        n = max(max(1, trials // 4), min(trials * 2, round(trials * r.calls / even)))
        lines += [
            "",
            f"# {r.calls} calls; production used: {r.fallback}",
            "[[tasks]]",
            f"kernel = {_toml_value(r.kernel)}",
            f"backends = [{_toml_value(backend)}]",
        ]
        if dtype:
            lines.append(f"dtypes = [{_toml_value(dtype)}]")
        lines += [f"problems = [{_inline(problem)}]", f"budget = {_inline({'trials': n})}"]
    lines += _listed(
        other,
        "Misses of decorated functions (not registered kernels; see docs/production.md of tuner's repository):",
    )
    return FromMisses(
        "\n".join(lines) + "\n",
        len(seen),
        tuple(sorted({r.kernel for r in reg})),
        skipped,
        len(other),
    )


def _listed(rows: Sequence[Any], head: str) -> list[str]:
    """Comment lines naming the misses a study file leaves to another kind of study, most calls first."""
    if not rows:
        return []
    out = ["", f"# {head}"]
    for r in sorted(rows, key=lambda r: (-r.calls, r.kernel, r.key.hash)):
        backend = f" ({r.backend})" if r.backend else ""
        out.append(
            f"#   {r.kernel}{backend} key {r.key.fields_dict} dtypes {list(r.key.dtypes)}: {r.calls} calls"
        )
    return out


def render_study(result: FromMisses, out: str | Path, *, check_kernels: bool = True) -> Path:
    """Write the study file atomically (and check it parses as a study)."""
    import tomllib

    from ._export import atomic_write
    from ._spec import parse_study

    path = Path(out)
    parse_study(tomllib.loads(result.text), path=path.resolve(), check_kernels=check_kernels)
    atomic_write(path, result.text, mkdir=True)
    return path


# ---- decorated functions of the user's own: an input factory ----------------------------------------------
FACTORY_FIELD = "factory"  # the problem field of a decorated-function task that names its input factory
KEY_FIELD = "key"  # the problem field that holds the recorded key fields, as one JSON object
DTYPES_FIELD = "dtypes"  # the recorded dtypes, comma-separated
DECORATED_EXECUTOR = "tuner.studies._from_misses:run_decorated"
REMEASURE = 5  # timings of a decorated task's winner after its search (the exported time is their median)


def load_factory(ref: str) -> Any:
    """The input factory named by "module:function" (the function may be an attribute path, as
    `Class.method`), as a worker process rebuilds it; BadInput (one line) when it cannot be loaded.
    `__main__` is refused: a worker's `__main__` is `tuner`'s, not the program that wrote the study."""
    import importlib

    mod, _, attr = str(ref).partition(":")
    if not mod or not attr:
        raise BadInput(f"--factory must be given as module:function, got {ref!r}")
    if mod == "__main__":
        raise BadInput(
            f"cannot load the input factory {ref!r}: a worker cannot import the __main__ of the program that "
            "named it; move the factory into an importable module"
        )
    try:
        fn: Any = importlib.import_module(mod)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"cannot load the input factory {ref!r}: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise BadInput(f"the input factory {ref!r} is not callable")
    return fn


def factory_ref(factory: str | Any) -> str:
    """The "module:function" that a worker rebuilds `factory` from (a string is that already), checked
    by rebuilding it here; BadInput (one line) saying why when it cannot be: a lambda or a function
    defined inside another (no importable name), a function of `__main__`, one renamed or rebound
    since (its module's attribute of its name is another object or none), a module that does not
    import."""
    if isinstance(factory, str):
        load_factory(factory)
        return factory
    if not callable(factory):
        raise BadInput(f"the input factory {factory!r} is neither 'module:function' nor callable")
    mod = getattr(factory, "__module__", None)
    qual = getattr(factory, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str):
        raise BadInput(f"the input factory {factory!r} has no module and name a worker could import it by")
    ref = f"{mod}:{qual}"
    if "<lambda>" in qual or "<locals>" in qual:
        kind = "a lambda" if qual.endswith("<lambda>") else "a function defined inside another function"
        raise BadInput(
            f"the input factory {ref} is {kind}: a worker cannot import it; define it at the top level of "
            "a module"
        )
    try:
        found = load_factory(ref)
    except BadInput as exc:
        raise BadInput(f"{exc} (renamed or removed since it was defined?)") from None
    if found is not factory:
        raise BadInput(
            f"the input factory {ref} was renamed or rebound: {ref} is now another object, so a worker "
            "would rebuild something else; name it by the attribute that holds it"
        )
    return ref


def check_task_factories(tasks: Sequence[Any]) -> None:
    """Every task that names an input factory (a decorated function's task) can have it rebuilt in a
    worker; else BadInput (one line) naming the first task that cannot, and why: such a task could never
    run, so the study is neither run nor its failed tasks retried."""
    checked: dict[str, str | None] = {}
    for task in tasks:
        ref = task.problem.get(FACTORY_FIELD)
        if ref is None:
            continue
        ref = str(ref)
        if ref not in checked:
            try:
                load_factory(ref)
                checked[ref] = None
            except BadInput as exc:
                checked[ref] = str(exc)
        why = checked[ref]
        if why is not None:
            raise BadInput(
                f"task {task.key} can never run: {why}; fix the factory or remove the task "
                "(nothing was run or retried)"
            )


def decorated_study(
    rows: Sequence[Any],
    factory: str | Any,
    *,
    name: str = "from_misses",
    min_calls: int = 1,
    trials: int = 20,
    seconds: float | None = None,
    strategy: str = "auto",
    output: str | None = None,
    kernels: Sequence[str] = (),
) -> FromMisses:
    """A study of the misses of decorated functions (not registered kernels): one task per key, its
    problem being the recorded key fields (`key`, one JSON object, so that any field name and value of
    the key survives: `dtype`, 0, None, quotes), the recorded dtypes (`dtypes`, comma-separated) and
    `factory`, the `module:function` that builds the call: `factory(kernel, fields, dtypes) -> (fn, args,
    kwargs)` (or the function itself, named by its module and name: `factory_ref`). Each task's dtype is
    the key's first dtype. Run it with `--executor tuner.studies._from_misses:run_decorated`."""
    if min_calls < 1:
        raise BadInput(f"--min-calls must be >= 1, got {min_calls}")
    if trials < 1:
        raise BadInput(f"--trials must be >= 1, got {trials}")
    factory = factory_ref(factory)  # one that a worker cannot rebuild would fail every task: refuse it now
    kept = [r for r in rows if r.calls >= min_calls and not (r.registered or _is_registered(r.kernel))]
    # listed as comments, and counted in the command's line: left out without a word, a service's kernel
    # misses were gone once `tuner misses --clear` ran after shipping this study's export
    kernel_rows = [r for r in rows if r.calls >= min_calls and (r.registered or _is_registered(r.kernel))]
    skipped = sum(r.calls for r in rows if r.calls < min_calls)
    options, of = _selection(kernels)
    if not kept:
        raise BadInput(
            f"no recorded miss of a decorated function with at least {min_calls} calls "
            f"({len(rows)} misses{of} recorded)"
        )
    script = sorted({r.kernel for r in kept if r.kernel.startswith("__main__.")})
    if script:
        # the worker imports the factory's function under its module's name (app.scale, not
        # __main__.scale): no call it builds has the recorded key, so every task would fail, and an
        # export under the module's name would never be hit by the script
        raise BadInput(
            f"kernel {script[0]!r} was recorded by a function of a script run as __main__: no study "
            "can tune that key (a worker imports the function under its module's name); give it a name "
            "of its own (@tuner.autotune(..., name=...)) and record again, or leave it out with --kernel"
        )
    total = sum(r.calls for r in kept)
    even = total / len(kept)
    lines = [
        f"# Written by `tuner study from-misses --factory {factory}{options}` from {len(kept)} recorded misses of",
        "# decorated functions. Tune with (the factory builds each call's inputs from its recorded key):",
        f"#   tuner study run FILE --executor {DECORATED_EXECUTOR}",
        "# then ship the winners with `tuner study export FILE --out cache.json` (docs/production.md of tuner's repository).",
        "",
        "[study]",
        f"name = {_toml_value(name)}",
        'device = "auto"',
        f"strategy = {_toml_value(strategy)}",
        "seed = 0",
        "budget = " + _inline({"trials": trials, **({"seconds": seconds} if seconds else {})}),
    ]
    if output:
        lines.append(f"output = {_toml_value(output)}")
    for r in sorted(kept, key=lambda r: (-r.calls, r.kernel, r.key.hash)):
        problem = {
            KEY_FIELD: json.dumps(r.key.fields_dict, sort_keys=True, separators=(", ", ": ")),
            DTYPES_FIELD: ",".join(r.key.dtypes),
            FACTORY_FIELD: factory,
        }
        n = max(max(1, trials // 4), min(trials * 2, round(trials * r.calls / even)))
        lines += [
            "",
            f"# {r.calls} calls; production used: {r.fallback}",
            "[[tasks]]",
            f"kernel = {_toml_value(r.kernel)}",
            'backends = ["python"]',
        ]
        if r.key.dtypes:
            lines.append(f"dtypes = [{_toml_value(r.key.dtypes[0])}]")
        lines += [f"problems = [{_inline(problem)}]", f"budget = {_inline({'trials': n})}"]
    head = "Misses of registered kernels (a study written without --factory tunes them; docs/production.md of tuner's repository):"
    lines += _listed(kernel_rows, head)
    text = "\n".join(lines) + "\n"
    return FromMisses(text, len(kept), tuple(sorted({r.kernel for r in kept})), skipped, 0, len(kernel_rows))


def _recorded_call(problem: dict[str, Any]) -> tuple[str, dict[str, Any], list[str]]:
    """(factory, key fields, dtypes) of a decorated-function task. Files written before the key fields
    were kept as one JSON object held them inline beside `dtypes` and `factory` (and the study's
    `dtype`)."""
    ref = str(problem.pop(FACTORY_FIELD, ""))
    dtypes = [d for d in str(problem.pop(DTYPES_FIELD, "")).split(",") if d]
    raw = problem.get(KEY_FIELD)
    if isinstance(raw, str) and raw.startswith("{"):
        try:
            fields = json.loads(raw)
        except ValueError:
            fields = None
        if isinstance(fields, dict):
            return ref, fields, dtypes
    problem.pop("dtype", None)
    return ref, problem, dtypes


def factory_call(
    factory: Any, kernel: str, fields: Mapping[str, Any], dtypes: Sequence[str]
) -> tuple[Any, tuple[Any, ...], dict[str, Any], Any]:
    """(decorated function, args, kwargs, its CacheKey) of the call the factory builds for a recorded key;
    BadInput when the factory returns no decorated function or a call of another key."""
    fn, args, kwargs = factory(kernel, dict(fields), list(dtypes))
    t = getattr(fn, "tuner", None)
    if t is None:
        raise BadInput(f"the factory returned {fn!r}, not a function decorated by tuner")
    args, kwargs = tuple(args), dict(kwargs)
    ck = t.full_key(args, kwargs)
    if ck.kernel != kernel or ck.fields_dict != dict(fields) or list(ck.dtypes) != list(dtypes):
        raise BadInput(
            f"the factory's call has key {ck.kernel} {ck.fields_dict} {list(ck.dtypes)}, "
            f"not the recorded {kernel} {dict(fields)} {list(dtypes)}"
        )
    return fn, args, kwargs, ck


def time_config(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: str, config: Mapping[str, Any], n: int
) -> list[float]:
    """`n` timings (seconds, the median of each) of the decorated function's call with `config`, with the
    function's own timer (the one that tuned it), its `restore` arguments put back before each."""
    from tuner.runtime._bench import normalise_bench_result

    t = fn.tuner
    bench = t.timer(args, kwargs, device)
    restore = t.restorer.take(args, kwargs)
    cfg = dict(config)

    def call() -> Any:
        return t.fn(*args, **kwargs, **cfg)

    times = []
    try:
        for _ in range(n):
            if restore is not None:
                restore()
            times.append(normalise_bench_result(bench(call))[0])
    finally:
        if restore is not None:
            restore()
    return times


def factory_measure(ref: str) -> Any:
    """`tuner regress --factory`: a `measure(entry, repeats) -> seconds` for the entries of decorated
    functions: the factory builds the entry's call, `time_config` times its config `repeats` times."""
    factory = load_factory(ref)

    def measure(entry: Mapping[str, Any], repeats: int) -> list[float]:
        fn, args, kwargs, ck = factory_call(
            factory, str(entry["kernel"]), dict(entry["key"]), list(entry.get("dtypes") or [])
        )
        return time_config(fn, args, kwargs, ck.device, entry["config"], repeats)

    return measure


def validate_factory_entries(ref: str, entries: Sequence[Mapping[str, Any]]) -> None:
    """Before `tuner regress --factory` times anything: each entry's call is built by the factory with the
    entry's key, and its config is in the function's space. ValueError (one line, naming the entry)."""
    factory = load_factory(ref)
    for i, e in enumerate(entries):
        where = f"entries[{i}] ({e.get('kernel')})"
        try:
            fn, args, kwargs, _ = factory_call(
                factory, str(e["kernel"]), dict(e["key"]), list(e.get("dtypes") or [])
            )
        except BadInput as exc:
            raise ValueError(f"{where}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's factory: name what it raised
            said = f": {str(exc).splitlines()[0]}" if str(exc).strip() else ""
            raise ValueError(f"{where}: the factory {ref!r} raised {type(exc).__name__}{said}") from None
        space = fn.tuner.space_for(args, kwargs)
        config = dict(e["config"])
        if not space.contains(config):
            why = "; ".join(space.violations(config))
            raise ValueError(f"{where}: config {config} is not in the function's search space: {why}"[:500])


def run_decorated(task: Any, *, prior: Any = None, callback: Any = None) -> Any:
    """Study executor for decorated functions: builds the call with the task's input factory, then
    calls the function in online mode with the task's budget, so it tunes the recorded key and stores
    the winner in its own store (as production would have, had it been allowed to tune). The trials are
    kept in the task's Optuna study (`task.study_name` in `task.storage`), so a task whose worker died
    resumes without measuring them again, and `callback` sees each one. The result carries the key
    production looks up (`cache_key`), which `tuner study export` writes."""
    from types import SimpleNamespace

    import numpy as np

    from tuner.runtime._sources import open_store

    ref, fields, dtypes = _recorded_call(dict(task.problem))
    try:
        factory = load_factory(ref)
        fn, args, kwargs, ck = factory_call(factory, task.kernel, fields, dtypes)
    except BadInput as exc:
        raise BadInput(f"task {task.key}: {exc}") from None
    t = fn.tuner
    saved = (t.mode, t.budget, t.time_budget_s, t.study_run)
    t.mode, t.budget, t.time_budget_s = "online", task.budget or t.budget, task.time_budget_s
    t.study_run = {
        "storage": task.storage or None,
        "study_name": task.study_name if task.storage else None,
        "callback": callback,
        "prior": prior,
    }
    try:
        t.cache_clear()  # forget what this process resolved before: tune unless the store has the key
        fn(*args, **kwargs)
    finally:
        t.mode, t.budget, t.time_budget_s, t.study_run = saved
    db = open_store(t.storage, create=True)
    entry = db.get(ck) if db is not None else None
    if entry is None:
        why = str((t.last_choice or {}).get("why", ""))
        if why.startswith("exact entry in") and why != "exact entry in the store":  # a shipped file's
            raise RuntimeError(
                f"task {task.key}: nothing tuned: the call was served by an {why} (TUNER_CACHE_FILE, "
                "cache= or set_global_cache); run the study without that file"
            )
        raise RuntimeError(
            f"task {task.key}: {task.kernel} ran but its store ({t.storage or 'the default store'}) holds no "
            "entry for the key (storage=False?); nothing to ship"
        )
    # The search's time of its winner is the least of several noisy timings, biased low (by 5-10 % for
    # microsecond functions on a CPU): re-time the winner, as a study re-measures its finalists, so that
    # `tuner regress` compares against an unbiased time.
    again = sorted(time_config(fn, args, kwargs, ck.device, entry.config, REMEASURE))
    q1, median, q3 = (float(np.quantile(again, q)) for q in (0.25, 0.5, 0.75))
    return SimpleNamespace(
        best_config=dict(entry.config),
        best_value=median,
        unit="s",  # the unit of the trials the decorator's timer kept in the task's Optuna study
        cache_key=ck.to_json(),
        spread_s=max(entry.spread_s, q3 - q1),
        space=entry.space,
        date=entry.date,
    )
