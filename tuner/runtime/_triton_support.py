"""Pieces of the `triton.autotune` drop-in (`_triton_compat.py`) that do not hold its state: the keyword
list, triton.Config conversion, `TRITON_PRINT_AUTOTUNING` output, Triton's error type, the timers Triton's
`warmup`/`rep` and `do_bench` describe, the in-order strategy and the key builder."""

from __future__ import annotations

import functools
import inspect
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from tuner._units import ms_to_s
from tuner.search_spaces import Config, SearchSpace
from tuner.search_spaces._params import brief, native
from tuner.strategies import Strategy

from ._argkeys import ArgKeys
from ._bench import cpu_bench, normalise_bench_result
from ._hit import run_of
from ._key import CacheKey
from ._launcher import triton_configs_to_dicts

_QUANTILES = (0.5, 0.2, 0.8)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a repr that names a memory address


def _all_kwargs(c: Any) -> dict[str, Any]:
    if isinstance(c, Mapping):
        return dict(c)
    return dict(c.all_kwargs())


# The value a config holds for a launch option or meta-parameter that it does not set while another
# config of the same list does (AMD lists that set `waves_per_eu` or `kpack` on some configs only, a
# `maxnreg` on one): SearchSpace needs one set of keys, and the launch leaves such keys out, as Triton's
# `Config.all_kwargs()` does.
UNSET = "<unset>"
# The value of a meta-parameter that a config sets to None (`triton.Config({"BLOCK": 64, "MODE": None})`):
# Triton launches it with MODE=None (`Config.all_kwargs()` keeps a kwarg of None, and drops only the
# launch options that are None), while a space holds no None; unlike UNSET, the launch passes it.
NONE = "<none>"


# A meta-parameter value that a space cannot hold but Triton launches as a constexpr (a tuple, a `tl.dtype`,
# a torch dtype, an enum member, an infinite or NaN float, an int beyond a float's range): the space, the
# store and cache files hold it as the string `OBJECT_PREFIX + "<type> <repr>>"`, and launches pass the
# object it stands for: the kernel's own config's object, from the kernel's table of them (string ->
# object, filled by `_config_dicts` as its configs are read; one table per kernel, so that another
# kernel's object of the same class and repr is never launched for it). A stored winner is matched by that
# string against the configs of the process that reads it, so the repr must not change between processes
# (one holding a memory address is refused), and two configs whose values differ must not share it (such
# a pair is refused: no store could tell which of them won).
OBJECT_PREFIX = "<object "
Objects = dict[str, Any]


def _is_unset(v: Any) -> bool:
    return isinstance(v, str) and v == UNSET


def _launch_value(v: Any, objects: Objects) -> Any:
    if isinstance(v, str) and v.startswith("<"):
        if v == NONE:
            return None
        if v.startswith(OBJECT_PREFIX):
            return objects.get(v, v)
    return v


def launch_kwargs(cfg: Mapping[str, Any], objects: Objects) -> dict[str, Any]:
    """A runtime config dict as the keyword arguments of the launch (UNSET keys left out, NONE as None, an
    object's string as the object it stands for in `objects`, the kernel's table)."""
    return {k: _launch_value(v, objects) for k, v in cfg.items() if not _is_unset(v)}


def _type_name(v: Any) -> str:
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _space_value(i: int, c: Any, k: str, v: Any, single: bool) -> Any:
    """Config `i`'s value `v` of meta-parameter `k` as a space holds it: a numpy scalar as the Python value it
    holds (as `SearchSpace.from_configs` reads it), an int, finite float, str or bool as it is, another
    hashable value with a repr that names no memory address as its string (`OBJECT_PREFIX`); anything else
    is a ValueError naming the config and the value, unless the list has a `single` config (never tuned or
    stored, as in Triton: it is launched with what it holds)."""
    v = native(v)
    if isinstance(v, str) or (isinstance(v, (int, float)) and _finite(v)):
        return v
    where = f"config {i} ({brief(_shown(c))}): {k}={brief(v, 60)}"
    try:
        hash(v)
    except TypeError:
        if single:
            return v
        instead = {
            "list": "a tuple in place of the list",
            "dict": "a tuple of its (key, value) pairs, or one parameter per key, in place of the dict",
            "set": "a sorted tuple in place of the set",
        }.get(type(v).__name__, "a hashable value (a tuple, a str, a number)")
        raise ValueError(
            f"{where} is unhashable ({type(v).__name__}); each config's values are hashed (a config is "
            f"stored and looked up by them, as triton.Config.__hash__ hashes them), so give {instead}"
        ) from None
    r = _stable_text(v, repr(v), jit_only=True)
    if not single and _ADDRESS.search(r):
        raise ValueError(
            f"{where}: its repr names a memory address, so a stored winner holding it could not be "
            "recognised in another process; give a value with a stable repr (an int, str, tuple, tl.dtype)"
        )
    return f"{OBJECT_PREFIX}{_type_name(v)} {r}>"


def _faithful(v: Any) -> bool:
    """Whether `v`'s type and repr tell its value (a builtin scalar, or a tuple of them): then two values
    with one string are one value (two NaNs included), and need no `==`."""
    if type(v) is tuple:
        return all(_faithful(x) for x in v)
    return v is None or type(v) in (int, float, str, bool, complex, bytes)


def _same(a: Any, b: Any) -> bool:
    if a is b or (_faithful(a) and _faithful(b)):
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value whose == raises is no equal of another
        return False


def _shown(c: Any) -> Any:
    """A config as an error message shows it (a triton.Config by its `all_kwargs()`)."""
    return c if isinstance(c, Mapping) else _all_kwargs(c) if callable(getattr(c, "all_kwargs", None)) else c


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(v)  # an int beyond a float's range raises
    except OverflowError:
        return False


def same_launch(d: Mapping[str, Any], objects: Objects) -> tuple:
    """What triton.Config's `==` compares of a runtime config dict: its launch values (so 1, 1.0 and True are
    one value, as Python's `==` and Triton's config hash make them)."""
    return tuple(sorted(launch_kwargs(d, objects).items(), key=lambda kv: kv[0]))


_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "ir_override")


def _launch_view(c: Any) -> SimpleNamespace:
    """A triton.Config as its launch sees it: Triton launches with `Config.all_kwargs()`, so what a
    subclass (or a patched `all_kwargs`) adds there is a meta-parameter of the launch too."""
    every = dict(c.all_kwargs()) if callable(getattr(c, "all_kwargs", None)) else dict(c.kwargs)
    return SimpleNamespace(
        kwargs={k: v for k, v in every.items() if k not in _OPTIONS},
        num_warps=every.get("num_warps", c.num_warps),
        num_stages=every.get("num_stages", c.num_stages),
        num_ctas=every.get("num_ctas", getattr(c, "num_ctas", 1)),
        maxnreg=every.get("maxnreg", getattr(c, "maxnreg", None)),
        ir_override=every.get("ir_override", getattr(c, "ir_override", None)),
        pre_hook=None,
    )


def _config_dicts(configs: Sequence[Any], objects: Objects) -> list[dict[str, Any]]:
    """The runtime's dicts for triton.Configs (kwargs + num_warps + num_stages [+ num_ctas, maxnreg,
    ir_override where they vary]), all with the same keys: a key that only some configs set is UNSET in
    the others (a maxnreg of None too); a meta-parameter a config sets to None is NONE; a value a space
    cannot hold is its `OBJECT_PREFIX` string, the object put in `objects` (the kernel's table) under it.
    Two configs whose values differ (by `==`) but share a string are a ValueError naming both. A config's
    own pre_hook is run by this module, so it is not refused here."""
    proxies = [c if isinstance(c, Mapping) else _launch_view(c) for c in configs]
    dicts = triton_configs_to_dicts(proxies)
    names: dict[str, None] = {}
    for d in dicts:
        names.update(dict.fromkeys(d))
    out = []
    for i, (d, p) in enumerate(zip(dicts, proxies, strict=True)):
        meta = p if isinstance(p, Mapping) else p.kwargs  # what the config sets, None included
        out.append(
            {
                k: (
                    NONE
                    if k in meta and meta[k] is None
                    else UNSET
                    if d.get(k) is None
                    else _space_value(i, configs[i], k, d[k], len(configs) == 1)
                )
                for k in names
            }
        )
    _collect_objects(configs, dicts, out, objects)
    return out


def _collect_objects(
    configs: Sequence[Any],
    raw: Sequence[Mapping[str, Any]],
    dicts: Sequence[Mapping[str, Any]],
    objects: Objects,
) -> None:
    """Puts the objects of configs' dicts (`raw[i][k]` where `dicts[i][k]` is its string) in `objects`
    under their strings, the first config's where several configs hold equal ones; two that differ under
    one string are a ValueError naming both configs."""
    first: dict[str, tuple[int, Any]] = {}
    for i, (c, d) in enumerate(zip(configs, dicts, strict=True)):
        for k, s in d.items():
            if not (isinstance(s, str) and s.startswith(OBJECT_PREFIX)):
                continue
            v = native(raw[i][k])
            j, w = first.setdefault(s, (i, v))
            if j != i and not _same(v, w):
                raise ValueError(
                    f"config {j} ({brief(_shown(configs[j]))}) and config {i} ({brief(_shown(c))}) hold "
                    f"{k} values that differ but are both {brief(s, 80)} (same type, same repr): a stored "
                    "winner could not tell them apart; give the values a repr that tells them apart "
                    "(a __repr__ that shows what differs)"
                )
    for s, (_, v) in first.items():
        objects.setdefault(s, v)


def unique_dicts(dicts: Sequence[Mapping[str, Any]], objects: Objects) -> list[dict[str, Any]]:
    """`dicts` without repeats, in order: Triton accepts a config listed twice, and counts two configs as
    one where `triton.Config.__eq__` does (their launch values equal by Python's `==`: 1, 1.0 and True; its
    timings are a dict keyed by config, so the first of them is the one it launches); a space does not."""
    seen: set[tuple] = set()
    out = []
    for d in dicts:
        k = same_launch(d, objects)
        if k not in seen:
            seen.add(k)
            out.append(dict(d))
    return out


def _to_triton_config(d: Mapping[str, Any], objects: Objects) -> Any:
    import triton

    d = launch_kwargs(d, objects)
    opts = {k: d.pop(k) for k in _OPTIONS if k in d}
    return triton.Config(d, **opts)


def _ms_result_to_s(res: Any) -> tuple[float, ...]:
    """A do_bench result (ms: a number, or [median, p20, p80]) -> (median s, p20 s, p80 s), or (median s,
    spread s) for a number or a pair; each a timer result `normalise_bench_result` reads."""
    if isinstance(res, (list, tuple)):
        if len(res) == 3:
            return tuple(ms_to_s(float(x)) for x in res)
        return normalise_bench_result([ms_to_s(float(x)) for x in res])
    return ms_to_s(float(res)), 0.0


def _zero(v: Any) -> None:
    if hasattr(v, "zero_"):
        v.zero_()
    else:
        v.fill(0)


def _print_enabled() -> bool:
    try:
        from triton import knobs

        return bool(knobs.autotuning.print)
    except Exception:  # noqa: BLE001 - no triton: read the variable ourselves
        from tuner._settings import flag

        return flag("TRITON_PRINT_AUTOTUNING")


def _emit(text: str) -> None:
    """TRITON_PRINT_AUTOTUNING output: to stdout, as Triton prints it (only when the user asks for it)."""
    sys.stdout.write(text + "\n")


def _autotuner_error(msg: str) -> Exception:
    try:
        from triton.runtime.errors import AutotunerError

        return AutotunerError(msg)
    except ImportError:
        return RuntimeError(f"Autotuner error: {msg}")


ESTIMATE_RUNS = 3  # runs timed to size the warm-up and timed counts of `_budgeted_cpu_bench`


def _budgeted_cpu_bench(
    call: Callable[[], Any], warmup_s: float, rep_s: float, *, jax: bool = False
) -> tuple[float, float]:
    """cpu_bench with Triton's warmup/rep meaning: about `warmup_s` of warm-up and `rep_s` of timed runs,
    counted from one run's time: the fastest of `ESTIMATE_RUNS` runs (Triton's do_bench averages five),
    so that one run the OS preempted does not size the counts (seen on a loaded machine: 4 timed runs
    where 190 were due). `jax`: every run waits for its whole result (jax.block_until_ready), and a first
    untimed call compiles the launcher, so the counts are not sized on compiling."""
    run = call
    if jax:
        import jax as jax_mod

        def run() -> Any:
            return jax_mod.block_until_ready(call())

        run()  # traces and compiles
    times = []
    for _ in range(ESTIMATE_RUNS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    est = max(min(times), 1e-6)
    return cpu_bench(
        run,
        warmup=max(1, min(1000, int(warmup_s / est))),
        repeats=max(1, min(1000, int(rep_s / est))),
        min_sample_s=0.0,
        budget_s=math.inf,  # `rep` sized the repeats already
    )


class InOrder(Strategy):
    """Every config, in the order the user listed them (Triton times them in that order)."""

    name = "all_configs"
    uses_prior = False  # the order is the user's: no prior is read for it

    def __init__(self, space: SearchSpace, order: Sequence[Mapping[str, Any]], **kw: Any) -> None:
        super().__init__(space, **kw)
        self.order = [dict(c) for c in order]

    def propose(self) -> Config | None:
        for c in self.order:
            if not self.pool.is_seen(c):
                return dict(c)
        return None


class _TritonKeys(ArgKeys):
    """ArgKeys that, as Triton, accept any key value: one that is not a JSON scalar (a tl.dtype
    constexpr, a torch or numpy dtype, an enum member, say) is keyed by the string a config's object is
    (`OBJECT_PREFIX + "<type> <repr>>"`, `_key_object`), and so is an infinite or NaN float (a
    `float("inf")` meaning "no limit", which Triton keys as any other value; a JSON scalar cannot hold
    it): never the text of a string key value ("fp16" is not tl.float16, "inf" not inf). Such keys were
    stored as the value's str() before (`legacy_key`: an entry stored so is still read)."""

    def raw_values(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        return self._raw(args, kwargs, _key_object)

    def legacy_key(self, args: tuple, kwargs: dict) -> CacheKey | None:
        """The stored key of the call as it was written before key objects were told from strings (their
        str(), `_legacy_text`), or None where it is the stored key (no key value is such an object)."""
        raw = self._raw(args, kwargs, _legacy_text)
        if raw == self._raw(args, kwargs, _key_object):
            return None
        return self.full_of(raw, args, kwargs)

    def _raw(self, args: tuple, kwargs: dict, text: Callable[[Any], str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        np = sys.modules.get("numpy")
        for k, v in super().raw_values(args, kwargs).items():
            if np is not None and isinstance(v, np.generic):  # a numpy scalar: the Python value it holds
                v = v.item()
            if np is not None and isinstance(v, np.dtype):  # has a `.shape` (()), yet is no array
                out[k] = text(v)
                continue
            if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)) and not _traced(v):
                # a 0-d tensor, which Triton keys as any other argument: its value (read from the device),
                # where `tuner.autotune` refuses it (scalar_key_value); a jax tracer has none to read (the
                # traced miss refuses it, `_jax.refuse_traced_key`)
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = text(float(v))  # <object float inf>, as a config holds it
                continue
            if v is None or isinstance(v, (bool, int, float, str)) or hasattr(v, "shape"):
                out[k] = v
                continue
            try:
                import operator

                out[k] = operator.index(v)
            except TypeError:
                out[k] = text(v)
        return out


def _traced(v: Any) -> bool:
    """Whether `v` is a jax tracer (False, cheaply, where jax is not imported)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(v, jax.core.Tracer)


def _stable_text(v: Any, text: str, *, jit_only: bool = False) -> str:
    """`text` (v's str or repr), unless it names a memory address and `v` is a function (a `@triton.jit`
    function under the interpreter, whose repr is `<...InterpretedFunction object at 0x...>`; with
    `jit_only` False, a plain function too), which another process would never find: then the function's
    qualified name and the hash of its code (closures of one factory over other values are other values)."""
    if _ADDRESS.search(text) and (not jit_only or (type(v).__module__ or "").startswith("triton")):
        from ._env import underlying_function
        from ._source import code_hash

        base = underlying_function(v)
        if inspect.isfunction(base):
            return f"<function {base.__module__}.{base.__qualname__} {code_hash(v)}>"
    return text


def _key_object(v: Any) -> str:
    """A key value that is no JSON scalar, as the stored key holds it: the string a config's object is
    (`OBJECT_PREFIX`, its type and repr, `_stable_text`), which no str() of a value is alone."""
    return f"{OBJECT_PREFIX}{_type_name(v)} {_stable_text(v, repr(v))}>"


def _legacy_text(v: Any) -> str:
    """A key value that is no JSON scalar as stored keys held it before `_key_object`: its str()
    (`_stable_text`; a numpy dtype's and a non-finite float's str() as they are)."""
    np = sys.modules.get("numpy")
    if isinstance(v, float) or (np is not None and isinstance(v, np.dtype)):
        return str(v)
    return _stable_text(v, str(v))


class TritonCache(dict):
    """`.cache` of the drop-in: Triton's key tuple -> triton.Config, consulted before anything else on a
    miss. The runtime keeps its own index of the configs in memory for the hit path; every mutation by
    code (item assignment, `del`, `pop`, `popitem`, `clear`, `update`, `|=`, `setdefault` that inserts)
    makes it forget that index, so the next calls read this dict, as Triton reads its `.cache` on each
    launch: an entry put in it is used for its key. The keys that code takes out are handed to
    `changed` as well: as on Triton, each of them is tuned again at its next launch (online), the store's
    entry for it being neither read nor deleted (`TritonAutotuned.retune`)."""

    def __init__(self, changed: Callable[[Iterable[Any]], None], *args: Any) -> None:
        super().__init__(*args)
        self._changed = changed

    def put(self, key: tuple, config: Any) -> None:
        """The runtime's own write (a key it resolved): nothing to forget. A key equal to `key` with values
        of other types ((1,) for (True,)) is replaced, key and all, as the entry of the last launch."""
        if key in self and self._own_key(key) is None:
            dict.__delitem__(self, key)
        dict.__setitem__(self, key, config)

    def get_typed(self, key: tuple) -> Any:
        """The config of `key`, where the dict's own key equal to it holds values of the same types: a
        dict keys (1,), (True,) and (1.0,) alike, yet they are other stored keys, and a config tuned for
        one is not the other's (a miss only: the dict's keys are scanned for the equal one)."""
        got = self.get(key)
        return None if got is None or self._own_key(key) is None else got

    def _own_key(self, key: tuple) -> tuple | None:
        """The dict's key equal to `key` if its values are of the same types as `key`'s, else None."""
        for k in self:
            try:
                equal = k is key or bool(k == key)
            except Exception:  # noqa: BLE001 - a value whose == raises is no equal of another
                continue
            if equal:
                same = len(k) == len(key) and all(type(a) is type(b) for a, b in zip(k, key, strict=True))
                return k if same else None
        return None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._changed(())

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._changed((key,))

    def pop(self, key: Any, *default: Any) -> Any:
        present = key in self
        out = super().pop(key, *default)
        self._changed((key,) if present else ())
        return out

    def popitem(self) -> tuple[Any, Any]:
        out = super().popitem()
        self._changed((out[0],))
        return out

    def clear(self) -> None:
        keys = list(self)
        super().clear()
        self._changed(keys)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed(())

    def __ior__(self, other: Any) -> TritonCache:  # type: ignore[override,misc]
        super().update(other)  # dict's own `|=` would not go through `update`
        self._changed(())
        return self

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default  # dict's own setdefault would not go through __setitem__
        return default


_BOUND = ("grid", "warmup")  # keywords the Triton hit path binds for a launch


class ConfigLaunch:
    """What the drop-in's hit path launches (its `owner`, see `_hit.launcher_paths`) when configs have a
    pre_hook of their own or set different keys: `run` (called with `grid=`, `warmup=` and the config)
    runs the config's pre_hook, then `bare`; `bare` is the JIT function's `run` (looked up at each call,
    as Triton's Autotuner looks up `self.fn.run`) without the keys the config leaves UNSET: what tuning
    times, with Triton's hooks around it."""

    __slots__ = ("fn", "tuner")

    def __init__(self, tuner: Any, fn: Any) -> None:
        self.tuner, self.fn = tuner, fn

    def run(self, *args: Any, **kw: Any) -> Any:
        t = self.tuner
        cfg = t.split_config(kw)
        cobj = t.config_obj(cfg)
        if getattr(cobj, "pre_hook", None) is not None:
            user_kw = {k: v for k, v in kw.items() if k not in t._cfg_names and k not in _BOUND}
            cobj.pre_hook(t.full_nargs(args, user_kw, kw.get("grid"), cobj))
        return self.bare(*args, **kw)

    def bare(self, *args: Any, **kw: Any) -> Any:
        t = self.tuner
        return self.fn.run(*args, **(launch_kwargs(kw, t.objects) if t.irregular else kw))


def _bare(call: Callable[..., Any]) -> Callable[..., Any]:
    """The hit path's call (`partial(run_of, owner, grid=..., warmup=...)`) with the owner's `run`
    replaced by its `bare` launch, when the owner is a `ConfigLaunch`."""
    if isinstance(call, functools.partial) and call.func is run_of and call.args:
        owner = call.args[0]
        if isinstance(owner, ConfigLaunch):
            return functools.partial(owner.bare, *call.args[1:], **call.keywords)
    return call
