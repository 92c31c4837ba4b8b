"""Key building, an injected part of the runtime: how a call's arguments become the in-memory key of the
hit path and the stored `CacheKey` of the miss path.

A key builder (the `KeyBuilder` protocol) gives three things:
- `fast`: a table of `MAX_FAST_ARGS + 1` entries. Entry `n < MAX_FAST_ARGS` is the key of a call with
  `n` positional arguments and no keywords, a one-argument function `key(args) -> hashable` (C-level
  `operator.itemgetter` where it can be, one Python frame at most) or None (too few positional
  arguments: such calls take the general key). The last entry (`fast[KW]`, `fast[-1]`) is the key of a
  call with keyword arguments, `key(args, kwargs) -> key`, the general key without the hash check (or
  None: such calls take the miss path). The hit path (`_hit.py`) computes `fast[len(args)](args)`, or
  `fast[-1](args, kwargs)` for a call with keywords, and looks it up in a dict; nothing else.
- `general(args, kwargs)`: a key for any call (keyword arguments, defaults), never equal to a fast key.
  Raises TypeError for an unhashable key value. Used on the miss path before the stored key is built,
  and remembered there, so that the next call of that form hits by `fast[-1]`.
- `full(args, kwargs) -> CacheKey`: the stored key (kernel, source hash, key fields, dtypes, device,
  versions). Built on a miss only.

`ArgKeys` is the builder of `@tuner.autotune` (key by argument names or a key function, bucketing, the
dtypes of array arguments); `tuner.kernel` injects its own (`_kernel.ProblemKeys`). A new kind of callable
(a drop-in for another autotuner, say) gives its own builder and reuses the hit path and the resolution
chain as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ._env import arg_dtype, call_users_function, device_of, dtype_name, flat_args, framework_versions
from ._key import Bucket, CacheKey, make_bucketer

__all__ = ["KeyBuilder", "ArgKeys", "FastKey", "KwKey", "MAX_FAST_ARGS", "KW", "scalar_key_value"]

FastKey = Callable[[tuple], Any]
KwKey = Callable[[tuple, dict], Any]
MAX_FAST_ARGS = 64  # calls with more positional arguments take the general key
KW = MAX_FAST_ARGS  # the fast-key table's last entry: the key of a call with keyword arguments

_g = getattr
_DTYPE = itertools.repeat("dtype")
_NONE = itertools.repeat(None)
_GENERAL = object()  # first element of general keys: never equal to a fast key
_KEYFN = object()  # first element of fast keys built from a key function


class KeyBuilder(Protocol):
    """What the hit path and the miss path need from a key builder (see the module docstring)."""

    @property
    def fast(self) -> Sequence[Any]: ...  # FastKey | None at n < KW, KwKey | None at KW

    def general(self, args: tuple, kwargs: dict) -> Any: ...

    def full(self, args: tuple, kwargs: dict) -> CacheKey: ...


def _nothing(a: Any) -> tuple:
    return ()


def dtypes_of(a: Any) -> tuple:
    """The dtypes of the positional arguments (None for arguments without one)."""
    return tuple(map(getattr, a, _DTYPE, _NONE))


def arg_dtypes(a: Any) -> tuple:
    """dtypes_of, reading the dtypes of the arrays inside container arguments (`_env.arg_dtype`): the
    fast keys of a function once it has been called with a pytree of arrays."""
    return tuple(map(arg_dtype, a))


# The fast keys hold the type of each key value beside the value: 1, True and 1.0 (and np.bool_(True))
# are one dict key in Python, yet distinct stored keys (JSON `1`, `true`, `1.0`), so a call with one must
# never hit the config of another. A fast key is written out per key positions (and per arity where it
# reads every argument's dtype inline): `type(a[p])` stands in the dtype slot of a key argument, which is
# a scalar (an array is refused as a key value), so the hit costs no more than before. The functions are
# compiled once per shape (`_factory`), and a table's inline entries on first use (`_lazy`).
_FACTORIES: dict[tuple[Any, ...], Callable[[Callable[[tuple], Any]], FastKey]] = {}
MAX_INLINE = 6  # arities whose fast key reads each argument's dtype written out; more: a C-level map


def _factory(mode: str, pos: tuple[int, ...], n: int = 0) -> Callable[[Callable[[tuple], Any]], FastKey]:
    """`make(ig) -> fast key` of one shape: `mode` "inline" (arity `n`, dtypes written out), "map" (dtypes
    by a C-level map), "deep" (`arg_dtypes`) or "plain" (no dtypes); `pos` the key arguments' positions."""
    k = (mode, pos, n)
    f = _FACTORIES.get(k)
    if f is None:
        types = "".join(f"type(a[{p}]), " for p in pos)
        if mode == "inline":
            slots = "".join(
                f"type(a[{i}]), " if i in pos else f'_g(a[{i}], "dtype", None), ' for i in range(n)
            )
            body = f"(ig(a), ({slots}))"
        elif mode == "map":
            body = f"(ig(a), ({types}), tuple(map(_g, a, _DTYPE, _NONE)))"
        elif mode == "deep":
            body = f"(ig(a), ({types}), arg_dtypes(a))"
        else:
            body = f"(ig(a), ({types}))"
        scope = {"_g": getattr, "_DTYPE": _DTYPE, "_NONE": _NONE, "arg_dtypes": arg_dtypes}
        f = _FACTORIES[k] = eval(f"lambda ig: lambda a: {body}", scope)  # noqa: S307 (text built above)
    return f


def _inline(pos: tuple[int, ...], n: int, ig: Callable[[tuple], Any]) -> FastKey:
    return _factory("inline", pos, n)(ig)


def _lazy(table: list[Any], n: int, build: Callable[[], FastKey]) -> FastKey:
    """A table entry that builds its fast key on first use and puts it in its place (`table[n]`)."""

    def first(a: tuple) -> Any:
        f = build()
        if table[n] is first:
            table[n] = f
        return f(a)

    return first


def positional_fast_keys(
    ig: Callable[[tuple], Any],
    need: int,
    dtypes: bool,
    *,
    deep: bool = False,
    kw: KwKey | None = None,
    pos: Sequence[int] = (),
) -> list[Any]:
    """The fast-key table for keys taken from positional arguments `pos` by `ig` (which needs `need` of
    them): with `dtypes`, the key is (values, dtypes of the arguments), else the values alone, each time
    with the types of the key values; `deep` reads the dtypes inside container arguments too
    (`arg_dtypes`). `kw` is the keyword entry (`fast[KW]`)."""
    p = tuple(pos)
    if not dtypes or deep:
        fk = _factory("deep" if dtypes else "plain", p)(ig)
        return [None] * need + [fk] * (MAX_FAST_ARGS - need) + [kw]
    table: list[Any] = [None] * need
    for n in range(need, MAX_FAST_ARGS):
        if n <= MAX_INLINE:
            table.append(_lazy(table, n, functools.partial(_inline, p, n, ig)))
        else:
            table.append(_factory("map", p)(ig))
    table.append(kw)
    return table


def _typed(r: Any) -> Any:
    """A key function's result as the fast keys hold it: hashable (a dict as its items) and with the type
    of each value (1, True and 1.0 are other keys)."""
    t = type(r)
    if t is dict:
        return (tuple(r.items()), tuple(map(type, r.values())))
    if t is tuple:
        return (r, tuple(map(type, r)))
    return (r, t)


def key_fn_fast_keys(
    kf: Callable[..., Any], dtypes: bool, *, deep: bool = False, kw: KwKey | None = None
) -> tuple[Any, ...]:
    """The fast-key table for a key function of the positional arguments (its result `_typed`); `deep`
    reads the dtypes inside container arguments too (`arg_dtypes`). `kw` is the keyword entry."""
    if dtypes:
        dts = arg_dtypes if deep else dtypes_of

        def key(a: tuple) -> Any:
            return (_KEYFN, _typed(kf(*a)), dts(a))
    else:

        def key(a: tuple) -> Any:
            return (_KEYFN, _typed(kf(*a)))

    return (key,) * MAX_FAST_ARGS + (kw,)


def scalar_key_value(name: str, v: Any) -> Any:
    """A key field's value as a JSON scalar; arrays and non-finite numbers are refused with a hint. A
    numpy scalar (`np.int64(8)`, what `np.prod` returns) is the Python value it holds; a 0-d torch
    tensor or jax array is refused: its value lives on the device, and reading it would wait for it."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, (np.generic, np.ndarray)) and v.ndim == 0:
        v = v.item()  # np.bool_ -> bool (not 1.0), np.float32 -> float, np.int64 -> int
    dtype = _dtype_of(np, v)
    if dtype is not None:  # a static `out_dtype=jnp.bfloat16`: its name, whichever way it is spelt
        return dtype.name
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"key field {name}={v!r} is not finite")
        return v
    if hasattr(v, "shape"):
        if getattr(v, "ndim", 1) != 0:
            raise TypeError(
                f"key argument {name!r} is an array; key on its shape with a key function, e.g. "
                f"key=lambda {name}, *a, **k: {{'{name}_rows': {name}.shape[0]}}"
            )
        raise TypeError(
            f"key field {name!r} is a 0-d {type(v).__module__.split('.')[0]} array: its value is on the "
            f"device, and reading it would wait for the device at every call; pass a Python number "
            f"(int({name}) or float({name}), read where the caller chooses)"
        )
    try:
        return operator.index(v)  # integer-like objects
    except TypeError:
        pass
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(
            f"key field {name}={v!r}: a key value must be an int, float, str, bool or None{_parts_hint(name, v)}"
        ) from None
    if not math.isfinite(f):
        raise ValueError(f"key field {name}={v!r} is not finite")
    return f


def _dtype_of(np: Any, v: Any) -> Any:
    """The numpy dtype a key value names (`np.dtype("bfloat16")`, or a scalar type: `jnp.bfloat16`,
    `np.float32`, which jax and numpy take as a dtype), None for another value or where numpy is not
    imported. A dtype instance has a `.shape` (()), so this comes before the array checks."""
    if np is None:
        return None
    if isinstance(v, np.dtype):
        return v
    if isinstance(v, type):
        if issubclass(v, np.generic):
            return np.dtype(v)
        dtype = getattr(v, "dtype", None)  # jax.numpy's scalar types (jnp.bfloat16) hold their dtype
        if isinstance(dtype, np.dtype):
            return dtype
    return None


def _parts_hint(name: str, v: Any) -> str:
    """For a key value made of parts (a tuple or list, a NamedTuple, a dataclass: a static argument such
    as `block_shape=(128, 128)` or a config object under `jax.jit(static_argnames=...)`): how to key on
    its parts with a key function. "" for another value."""
    if isinstance(v, tuple) and hasattr(v, "_fields") and v._fields:
        parts = [(f, f"{name}.{f}") for f in v._fields[:2]]
    elif isinstance(v, (tuple, list)) and v:
        parts = [(f"{name}_{i}", f"{name}[{i}]") for i in range(min(len(v), 2))]
    elif dataclasses.is_dataclass(v) and not isinstance(v, type) and dataclasses.fields(v):
        parts = [(f.name, f"{name}.{f.name}") for f in dataclasses.fields(v)[:2]]
    elif isinstance(v, enum.Enum):
        return (
            f"; to key on an enum member, give a key function (called with the decorated function's "
            f"arguments) that returns its name: {{{name!r}: {name}.name}}"
        )
    else:
        return ""
    fields = ", ".join(f"{field!r}: {expr}" for field, expr in parts)
    return (
        f"; to key on its parts, give a key function (called with the decorated function's arguments) "
        f"that returns them as fields: {{{fields}}}"
    )


def numpy_scalar(v: Any) -> bool:
    """A numpy scalar (`np.int64(8)`) or a 0-d numpy array (`np.array(8)`, the scalar it holds, in host
    memory): keyed as the Python number it holds, with no dtype and no numpy version, so that
    `f(np.prod(shape))`, `f(np.array(8))` and `f(8)` share a stored entry."""
    np = sys.modules.get("numpy")
    return np is not None and (isinstance(v, np.generic) or (isinstance(v, np.ndarray) and v.ndim == 0))


def _host_values(vals: dict[str, Any]) -> dict[str, Any]:
    """`vals` with each 0-d numpy array as the Python value it holds (`numpy_scalar`): an array is
    unhashable, and the miss path's in-memory key is built from these values (`_stored_values_key`)."""
    np = sys.modules.get("numpy")
    if np is None:
        return vals
    return {k: v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v for k, v in vals.items()}


def _weak_scalar(v: Any) -> bool:
    """A weakly typed 0-d jax array: what `jax.jit` makes of a Python number (`f(x, 0.5)` traces `0.5`
    as one). Keyed as the Python number is, without a dtype, so that a call inside `jit` and the same
    call outside it (where the number has no dtype) share a stored entry."""
    return getattr(v, "weak_type", False) is True and getattr(v, "ndim", None) == 0


class ArgKeys:
    """Keys of `@tuner.autotune`: the values of the `key` arguments (or what a key function returns),
    bucketed, plus the dtypes of array arguments (unless `dtypes=False`), the device and the versions.

    The arrays inside a container argument (a tuple of arrays, a params dict, any jax pytree) count as
    array arguments. The fast keys read only the top-level arguments' dtypes (the cheap case) until a
    stored key is first built for a call with such a container; from then on the fast-key table (a
    list, shared with the hit path, changed in place) reads the dtypes inside containers too, so that
    a float32 and a bfloat16 pytree never share an in-memory entry."""

    def __init__(
        self,
        *,
        name: str,
        kind: str,
        source_hash: str | Callable[[], str],
        arg_names: Sequence[str],
        defaults: Mapping[str, Any],
        key: Sequence[str] | str | Callable[..., Any],
        bucket: Bucket,
        dtypes: bool,
        packages: Sequence[str] = (),
        positional: int | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.packages = tuple(packages)  # more packages whose versions the stored key holds (`depends`)
        self._source_hash = source_hash  # a callable is asked on the first stored key, then kept
        self.arg_names = list(arg_names)
        # the first `positional` names are the ones a call can give positionally (`_env.positional_count`)
        self.positional = len(self.arg_names) if positional is None else positional
        self.defaults = dict(defaults)
        self.use_dtypes = dtypes
        self.bucketer = make_bucketer(bucket)
        self.fast: list[Any]  # FastKey | None per positional count, then the KwKey (`KW`)
        self.key_fn: Callable[..., Any] | None = None
        self.key_names: tuple[str, ...] = ()
        self._deep = False  # whether the fast keys read dtypes inside containers (see the class doc)
        self._ig: Callable[[tuple], Any] = lambda args: ()
        self._need = 0
        self._pos: tuple[int, ...] = ()  # the key arguments' positions
        if callable(key):
            self.key_fn = key
            self.fast = list(key_fn_fast_keys(key, dtypes, kw=self._kw_key(False)))
        else:
            self.key_names = (key,) if isinstance(key, str) else tuple(key)
            unknown = [k for k in self.key_names if k not in self.arg_names]
            if unknown:
                raise ValueError(f"key names {unknown} are not parameters of {name} ({self.arg_names})")
            pos = [self.arg_names.index(n) for n in self.key_names]
            ig: Callable[[tuple], Any] = operator.itemgetter(*pos) if pos else (lambda args: ())
            self._ig, self._need, self._pos = ig, max(pos) + 1 if pos else 0, tuple(pos)
            if self._need > self.positional:  # a key name that only a keyword gives: no positional fast key
                self._need = MAX_FAST_ARGS
            self.fast = positional_fast_keys(ig, self._need, dtypes, kw=self._kw_key(False), pos=self._pos)
        self._env: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}

    @property
    def source_hash(self) -> str:
        h = self._source_hash
        if callable(h):
            h = self._source_hash = h()
        return h

    def arg_value(self, name: str, args: tuple, kwargs: dict) -> Any:
        i = self.arg_names.index(name)
        if i < len(args) and i < self.positional:
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self.defaults.get(name)

    def raw_values(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if self.key_fn is not None:
            r = call_users_function(self.key_fn, f"the key function of {self.name}", args, kwargs)
            if isinstance(r, Mapping):
                return _host_values(dict(r))
            if isinstance(r, (tuple, list)):
                return _host_values({f"k{i}": v for i, v in enumerate(r)})
            return _host_values({"k": r})
        out = {}
        for n in self.key_names:
            i = self.arg_names.index(n)
            if i < len(args) and i < self.positional:
                out[n] = args[i]
            elif n in kwargs:
                out[n] = kwargs[n]
            elif n in self.defaults:
                out[n] = self.defaults[n]
            else:
                raise TypeError(f"{self.name}() missing key argument {n!r}")
        return _host_values(out)

    def _kw_key(self, deep: bool) -> KwKey:
        """The keyword entry of the fast-key table (`fast[KW]`): the general key of a call with keyword
        arguments, without the hash check. The key values are read by C-level getters planned once per
        form of call (the number of positional arguments and the keyword names, in order), with the
        dtypes of every argument (`deep`: also inside containers, `arg_dtypes`), so a keyword launch
        of a resolved key hits instead of taking the miss path (about twice a positional hit's cost:
        docs/benchmarks.md). Raises TypeError for a call that lacks a key
        argument (the miss path then says which)."""
        dts: Callable[[Any], tuple] = (arg_dtypes if deep else dtypes_of) if self.use_dtypes else _nothing
        kf = self.key_fn
        if kf is not None:

            def by_fn(a: tuple, k: dict) -> Any:
                return (_GENERAL, _typed(kf(*a, **k)), dts(a), tuple(k), dts(k.values()))

            return by_fn
        plans: dict[tuple, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}
        plan = self._plan

        def by_names(a: tuple, k: dict) -> Any:
            form = (len(a), *k)
            p = plans.get(form)
            if p is None:
                p = plans[form] = plan(form)
            types = (tuple(map(type, a)), tuple(map(type, k.values())))  # 1, True and 1.0: other keys
            return (_GENERAL, form, p[0](a), p[1](k), types, dts(a), dts(k.values()))

        if dts is not dtypes_of:
            return by_names

        def by_names_dtypes(a: tuple, k: dict) -> Any:  # by_names with dtypes_of written in: no frames
            form = (len(a), *k)
            p = plans.get(form)
            if p is None:
                p = plans[form] = plan(form)
            return (
                _GENERAL,
                form,
                p[0](a),
                p[1](k),
                tuple(map(type, a)),  # the types of the key values (1, True and 1.0 are other keys)
                tuple(map(type, k.values())),
                tuple(map(_g, a, _DTYPE, _NONE)),
                tuple(map(_g, k.values(), _DTYPE, _NONE)),
            )

        return by_names_dtypes

    def _plan(self, form: tuple) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """Getters of the key values of a call of this form (`_kw_key`): from the positional arguments,
        from the keywords (a default is the same in every call of the form, so it is left out)."""
        n, names = min(form[0], self.positional), form[1:]
        pos: list[int] = []
        kws: list[str] = []
        for name in self.key_names:
            i = self.arg_names.index(name)
            if i < n:
                pos.append(i)
            elif name in names:
                kws.append(name)
            elif name not in self.defaults:
                raise TypeError(f"{self.name}() missing key argument {name!r}")
        return (
            operator.itemgetter(*pos) if pos else _nothing,
            operator.itemgetter(*kws) if kws else _nothing,
        )

    def general(self, args: tuple, kwargs: dict) -> Any:
        kw: KwKey = self.fast[KW]
        key = kw(args, kwargs)
        try:
            hash(key)
        except TypeError:  # a key value that is not hashable as given: the key of the values as stored
            return self._stored_values_key(args, kwargs)
        return key

    def _stored_values_key(self, args: tuple, kwargs: dict) -> Any:
        """The general key of a call whose key values are unhashable as given (`raw_values` may make them
        hashable, as `_TritonKeys` does); TypeError where they stay unhashable."""
        vals = self.raw_values(args, kwargs)
        items = tuple(sorted(kwargs.items()))
        dts = tuple(arg_dtype(a) for a in args) if self.use_dtypes else ()
        kdts = tuple((k, arg_dtype(v)) for k, v in items) if self.use_dtypes else ()
        # with the types of the arguments as given: 1, True and 1.0 are other keys, and so are "fp16" and
        # the tl.float16 that `_TritonKeys.raw_values` makes text of
        types = (tuple(map(type, args)), tuple((k, type(v)) for k, v in items))
        key = (_GENERAL, tuple(vals.items()), types, dts, kdts)
        hash(key)  # TypeError for an unhashable key value
        return key

    def full(self, args: tuple, kwargs: dict) -> CacheKey:
        return self.full_of(self.raw_values(args, kwargs), args, kwargs)

    def legacy_key(self, args: tuple, kwargs: dict) -> CacheKey | None:
        """The call's stored key as releases before dtype arguments were told from arrays wrote it, or
        None where it is the stored key: a dtype given as jax's scalar type (`out_dtype=jnp.bfloat16`,
        which has a `.dtype`) was counted among the arrays' dtypes then. An exact entry stored under it
        (a shipped config file, a store) is still read (`_resolve.exact_keys`)."""
        np = sys.modules.get("numpy")
        values = flat_args(list(args) + [kwargs[k] for k in sorted(kwargs)])
        if not any(_dtype_of(np, v) is not None for v in values):
            return None
        raw = self.raw_values(args, kwargs)
        old = self.full_of(raw, args, kwargs, dtype_args_as_arrays=True)
        return None if old == self.full_of(raw, args, kwargs) else old

    def full_of(
        self, raw: dict[str, Any], args: tuple, kwargs: dict, *, dtype_args_as_arrays: bool = False
    ) -> CacheKey:
        """`full` with the key values `raw` (`raw_values`, or a builder's older form of them);
        `dtype_args_as_arrays`: the dtypes and environment as `legacy_key` had them."""
        fields = {}
        for n, v in raw.items():
            v = scalar_key_value(n, v)
            if self.bucketer is not None:
                v = scalar_key_value(n, self.bucketer(n, v))
            fields[str(n)] = v
        values = flat_args(list(args) + [kwargs[k] for k in sorted(kwargs)])
        np = sys.modules.get("numpy")
        # A dtype argument (`out_dtype=jnp.bfloat16`, `np.dtype("float32")`) is no array: not in the dtypes
        # (jax's scalar types have a `.dtype`, numpy's dtypes none; given or left at its default), no device,
        # no numpy version. Keyed on, its key field is its name, whichever way it is spelt.
        arrays = [
            v for v in values if not numpy_scalar(v) and (dtype_args_as_arrays or _dtype_of(np, v) is None)
        ]
        dts = []
        if self.use_dtypes:
            for v in arrays:
                d = getattr(v, "dtype", None)
                if d is not None and not _weak_scalar(v):
                    dts.append(dtype_name(d))
            if not self._deep:
                self._read_containers(args, kwargs)
        device, versions = self._device_versions(arrays)
        return CacheKey.make(self.name, self.source_hash, fields, dts, device, versions)

    def _read_containers(self, args: tuple, kwargs: dict) -> None:
        """Switch the fast keys to `arg_dtypes` once an argument is a container of arrays."""
        if not any(isinstance(arg_dtype(a), tuple) for a in (*args, *kwargs.values())):
            return
        kw = self._kw_key(True)
        if self.key_fn is not None:
            self.fast[:] = key_fn_fast_keys(self.key_fn, True, deep=True, kw=kw)
        else:
            self.fast[:] = positional_fast_keys(self._ig, self._need, True, deep=True, kw=kw, pos=self._pos)
        self._deep = True

    def _device_versions(self, values: list[Any]) -> tuple[str, dict[str, str]]:
        device = device_of(self.kind, values)
        tops = ",".join(sorted({(type(v).__module__ or "").split(".")[0] for v in values}))
        ck = (device, tops)
        got = self._env.get(ck)
        if got is None:
            got = self._env[ck] = (device, framework_versions(self.kind, values, self.packages))
        return got
