"""What the runtime learns about the function and the machine: the kind of callable, its source hash,
the device and the versions that change code generation. Computed once and cached; frameworks are
never imported just to ask (versions come from `tuner._versions`, the device names from
`tuner.search_spaces.devices`)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tuner._versions import FRAMEWORK_PACKAGES, VERSIONS_BY_KIND, package_versions, python_version
from tuner.search_spaces.devices import cuda_device_label, jax_device_label, triton_interpreted

__all__ = [
    "kind_of",
    "source_hash",
    "device_of",
    "cuda_index_of",
    "dtype_name",
    "framework_versions",
    "dependency_packages",
    "arg_leaves",
    "flat_args",
    "arg_dtype",
    "default_name",
]


def kind_of(fn: Any) -> str:
    """'triton' for a @triton.jit function (JITFunction, or InterpretedFunction under TRITON_INTERPRET),
    'jax' for a jax.jit-wrapped function (Pallas launchers), else 'python'."""
    mod = type(fn).__module__ or ""
    if mod.startswith("triton") and hasattr(fn, "run") and hasattr(fn, "arg_names"):
        return "triton"
    if (mod.startswith("jax") or mod.startswith("jaxlib")) and hasattr(fn, "lower"):
        return "jax"
    return "python"


def underlying_function(fn: Any) -> Any:
    """The Python function behind a Triton JIT function, a jax.jit wrapper, a functools.partial or a
    functools.wraps chain."""
    seen = 0
    while seen < 10:
        seen += 1
        if inspect.isfunction(fn):
            return fn
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        inner = getattr(fn, "__wrapped__", None) or getattr(fn, "fn", None)
        if inner is None:
            return fn
        fn = inner
    return fn


def _bound_text(v: Any) -> str:
    """A partial's bound argument in a kernel name: a short scalar as written, a function or class by its
    qualified name, anything else (an array, an object) by its type: never a repr holding an address."""
    if v is None or isinstance(v, (bool, int, float, str)):
        text = repr(v)
        if len(text) <= 40 and text.isprintable():
            return text
    if inspect.isfunction(v) or inspect.isclass(v):
        return f"{v.__module__}.{v.__qualname__}"
    return type(v).__qualname__


def call_users_function(fn: Callable[..., Any], role: str, args: tuple, kwargs: dict) -> Any:
    """`fn(*args, **kwargs)` for a function the user gave tuner to call with a call's arguments (a key or
    space function): one that cannot take them raises a TypeError saying how it is called; another
    TypeError gets a note naming `role`."""
    try:
        return fn(*args, **kwargs)
    except TypeError as exc:
        why = _refused_arguments(fn, args, kwargs)
        if why is not None:
            raise TypeError(_cannot_take(role, why)) from exc
        exc.add_note(f"tuner: raised by {role}, called with the call's arguments")
        raise


def check_users_function(fn: Callable[..., Any], role: str, target: Any, skip: Iterable[str]) -> None:
    """TypeError, at decoration, for a key or space function `fn` that can take the arguments of a call
    of `target` in no way a call can pass them (the first k positional, the others by keyword): its required
    parameters, less `skip` (the config's, which the call does not pass). A signature that cannot be read is not checked."""
    names = getattr(target, "arg_names", None)
    try:
        params = inspect.signature(underlying_function(target) if names is not None else target).parameters
    except (TypeError, ValueError):
        return
    left = set(skip)
    needed = [
        p.name
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in left
    ]
    # a call may pass the first k of them positionally and the others by keyword (`f(x, n=2)`)
    positional = _refused_arguments(fn, tuple(needed), {})
    if positional is not None and all(
        _refused_arguments(fn, tuple(needed[:k]), dict.fromkeys(needed[k:])) is not None
        for k in range(len(needed))
    ):
        raise TypeError(_cannot_take(role, f"{positional}; a call passes at least {', '.join(needed)}"))


def _refused_arguments(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
    """Why `fn`'s signature refuses these arguments (None where it takes them or cannot be read)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def _cannot_take(role: str, why: str) -> str:
    return (
        f"{role} cannot take the call's arguments ({why}): it is called with the decorated function's "
        "arguments, as the call passes them (positional or keyword); give it the same parameters, or "
        "add *args, **kwargs to take those it does not use"
    )


def default_name(fn: Any) -> str:
    """The stored kernel name of a decorated callable: module.qualname of the function behind it. A
    functools.partial adds its bound arguments, as a call (`mod.launch(interpret=True)`), and a callable
    object is named by its class: the name is the same in every process (a repr such as
    `<functools.partial object at 0x...>` is not, and its entries would never be found again)."""
    bound: list[str] = []
    obj = fn
    for _ in range(10):  # partials of partials (wrapped by hand, or around a jax.jit)
        if isinstance(obj, functools.partial):
            bound = (
                [_bound_text(a) for a in obj.args]
                + [f"{k}={_bound_text(v)}" for k, v in obj.keywords.items()]
                + bound
            )
            obj = obj.func
        elif not inspect.isfunction(obj) and isinstance(getattr(obj, "__wrapped__", None), functools.partial):
            obj = obj.__wrapped__
        else:
            break
    base = underlying_function(obj)
    qualname = getattr(base, "__qualname__", None)
    module = getattr(base, "__module__", None)
    if not isinstance(qualname, str):  # a callable object: its class
        qualname, module = type(base).__qualname__, type(base).__module__
    if module == "__mp_main__":  # the main script as multiprocessing's spawn/forkserver children import it
        module = "__main__"
    name = f"{module or '?'}.{qualname}"
    if bound:
        args = ", ".join(bound)
        if len(name) + len(args) + 2 > 200:  # the store's limit on a name
            args = hashlib.sha256(args.encode()).hexdigest()[:16]
        name = f"{name}({args})"
    return name


_DEF_RE = re.compile(r"^(async\s+)?def\s+\w+\s*\(", re.MULTILINE)


def source_text(fn: Any) -> str:
    """The function's source from its `def` line on (decorators dropped, as Triton's JITFunction.src
    does), so that changing the decorator's options does not change the kernel's identity."""
    text = getattr(fn, "src", None)
    if isinstance(text, str):
        return text
    base = underlying_function(fn)
    text = textwrap.dedent(inspect.getsource(base))
    m = _DEF_RE.search(text)
    return text[m.start() :] if m else text


def source_hash(fn: Any, depends: tuple[Any, ...] = ()) -> str:
    """sha256 of the kernel's source (and of the functions in `depends`, e.g. the @triton.jit kernel a
    launcher calls); falls back to the code object's bytecode and constants when no source is available."""
    if depends:
        parts = [source_hash(fn)] + [source_hash(d) for d in depends]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    text = getattr(fn, "src", None)
    if not isinstance(text, str):
        base = underlying_function(fn)
        try:
            text = source_text(fn)
        except (OSError, TypeError):
            code = getattr(base, "__code__", None)
            if code is None:
                text = f"{type(fn).__module__}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
            else:
                text = repr((code.co_code, code.co_consts, code.co_names))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def arg_leaves(v: Any) -> list[Any]:
    """What one argument holds: itself when it has a dtype (an array) or is not a container; else the
    leaves of a list, tuple or dict, recursively, or of any jax pytree (a params dict, a dataclass
    registered with jax) when jax is imported, so that the arrays inside a pytree argument count as
    arrays of the call (their dtypes in the key; their device, framework and versions the call's)."""
    if hasattr(v, "dtype"):
        return [v]
    jax = sys.modules.get("jax")
    if jax is not None:
        return list(jax.tree_util.tree_leaves(v))
    if isinstance(v, dict):
        return [x for item in v.values() for x in arg_leaves(item)]
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in arg_leaves(item)]
    return [v]


def flat_args(values: Iterable[Any]) -> list[Any]:
    """The arguments with every container replaced by its leaves (`arg_leaves`)."""
    return [x for v in values for x in arg_leaves(v)]


_NOT_CONTAINERS = frozenset({str, bytes, int, float, complex, bool, type(None)})


def arg_dtype(v: Any) -> Any:
    """The dtype of an array argument; for a container holding arrays, the tuple of its leaves' dtypes
    (None for leaves without one); else None. (On the hit path of a function called with pytrees.)"""
    d = getattr(v, "dtype", None)
    if d is not None or type(v) in _NOT_CONTAINERS:
        return d
    leaves = arg_leaves(v)
    if len(leaves) == 1 and leaves[0] is v:
        return None
    dts = tuple([getattr(x, "dtype", None) for x in leaves])
    for d in dts:
        if d is not None:
            return dts
    return None


def device_of(kind: str, values: Iterable[Any]) -> str:
    """The device a call runs on, from its array arguments: a CUDA tensor gives
    "<GPU name> (sm<cc>)" (unless the Triton interpreter is on), a jax array on a TPU/GPU gives
    "<platform>:<device_kind>", anything else "cpu" (the labels of `tuner.search_spaces.devices`)."""
    for v in values:
        tmod = type(v).__module__ or ""
        if tmod.startswith("torch") and hasattr(v, "device"):
            dev = v.device
            if getattr(dev, "type", "cpu") == "cuda" and not (kind == "triton" and triton_interpreted()):
                return cuda_device_label(dev.index or 0)
            return "cpu"
        if (tmod.startswith("jax") or tmod.startswith("jaxlib")) and hasattr(v, "devices"):
            try:
                d = next(iter(v.devices()))
            except Exception:  # a tracer or a deleted array: keep looking
                continue
            return jax_device_label(d)
    return "cpu"


def cuda_index_of(values: Iterable[Any]) -> int | None:
    """The index of the CUDA device the first torch tensor among `values` is on (None when that tensor is
    not on a CUDA device, or there is none): the GPU whose limits a call's search space must obey."""
    for v in values:
        tmod = type(v).__module__ or ""
        if tmod.startswith("torch") and hasattr(v, "device"):
            dev = v.device
            return int(dev.index or 0) if getattr(dev, "type", "cpu") == "cuda" else None
    return None


def array_framework(values: Iterable[Any]) -> str | None:
    """ "torch" or "jax" for the first array argument of that framework, else None."""
    for v in values:
        top = (type(v).__module__ or "").split(".")[0]
        if top == "torch" and hasattr(v, "device"):
            return "torch"
        if top in ("jax", "jaxlib") and hasattr(v, "devices"):
            return "jax"
    return None


def dtype_name(dt: Any) -> str:
    """'float16' for torch.float16, numpy/jax dtype('float16') and the string 'float16' alike."""
    s = str(getattr(dt, "name", dt))
    return s.removeprefix("torch.")


def dependency_packages(depends: Iterable[Any]) -> tuple[str, ...]:
    """The compilers among the kinds of `depends` (a `@triton.jit` kernel, a `jax.jit` function, ...) whose
    versions change what they compile to: a plain-Python launcher that names the Triton kernel it calls
    in `depends` is keyed on triton's version too, as the kernel itself would be. A function of a
    framework itself (jax's Pallas `mha`, a `functools.partial` of it: `FRAMEWORK_PACKAGES`) adds that
    framework's versions, which stand for its code in the key (`_source.code_hash` does not follow it)."""
    out: list[str] = []
    for dep in depends:
        top = (type(dep).__module__ or "").split(".")[0]
        kind = "jax" if top in ("jax", "jaxlib") else top
        pkgs = VERSIONS_BY_KIND.get(kind, ()) if kind in ("triton", "jax") else ()
        own = (getattr(underlying_function(dep), "__module__", None) or "").split(".")[0]
        for pkg in (*pkgs, *FRAMEWORK_PACKAGES.get(own, ())):
            if pkg not in out:
                out.append(pkg)
    return tuple(out)


def framework_versions(kind: str, values: Iterable[Any], extra: Iterable[str] = ()) -> dict[str, str]:
    """Versions that change what this call compiles to: per kind (triton: triton+torch; jax: jax+jaxlib);
    for plain callables, the frameworks whose arrays are among the arguments, and the Python minor version;
    plus the packages `extra` names (`dependency_packages` of the launcher's `depends`)."""
    pkgs: list[str] = list(VERSIONS_BY_KIND.get(kind, ())) + list(extra)
    out: dict[str, str] = {}
    if kind == "python":
        for v in values:
            top = (type(v).__module__ or "").split(".")[0]
            if top == "torch":
                pkgs.append("torch")
            elif top in ("jax", "jaxlib"):
                pkgs += ["jax", "jaxlib"]
            elif top == "numpy":
                pkgs.append("numpy")
        out["python"] = python_version()
    out.update(package_versions(sorted(set(pkgs))))
    return out


def signature_names(fn: Any) -> tuple[list[str], dict[str, Any]]:
    """Parameter names in positional order and their defaults, for the kinds we wrap."""
    names = getattr(fn, "arg_names", None)
    target: Callable[..., Any] = underlying_function(fn) if names is not None else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return list(names or []), {}
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return [p.name for p in params], defaults


def positional_count(fn: Any) -> int | None:
    """How many of `signature_names(fn)` a call can give positionally (those before `*args` and any
    keyword-only parameter): a positional argument past them belongs to `*args`, never to a name after
    it (`def f(*xs, n)`: `f(a, b, n=3)` gives n by keyword only). None where every name can be."""
    names = getattr(fn, "arg_names", None)
    target: Callable[..., Any] = underlying_function(fn) if names is not None else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    kinds = [p.kind for p in params]
    if inspect.Parameter.VAR_POSITIONAL not in kinds and inspect.Parameter.KEYWORD_ONLY not in kinds:
        return None
    return sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds
    )


def keywords_refused(fn: Any, names: Sequence[str]) -> list[str]:
    """Those of `names` that a call of `fn` cannot take as keyword arguments: none when it takes
    `**kwargs` or its signature cannot be read (a builtin, an object of C code)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = sig.parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return []
    ok = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [n for n in names if n not in ok]


def by_reference(obj: Any, fn: Any) -> tuple[Any, tuple[str, str]]:
    """`obj.__reduce__()` for a decorated kernel object: pickled by reference, as a module-level function
    is (its module and qualified name, those of the function `fn` it decorates), so a process pool's
    worker imports it and finds the tuned configs in the shared store. An object that is not reachable
    by that name (made inside a function, bound under another name) cannot be imported there: a
    `pickle.PicklingError` that says so."""
    import pickle

    inner = underlying_function(fn)
    module, qualname = getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)
    found: Any = None
    if isinstance(module, str) and isinstance(qualname, str) and "<locals>" not in qualname:
        found = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
    if found is not obj:
        raise pickle.PicklingError(
            f"cannot pickle {obj!r}: it is pickled by reference, as a function is, and {module}.{qualname} "
            "is not this object (define the decorated kernel at module level, under its own name); its "
            "tuned configs travel through the store, not through pickle"
        )
    return _import_by_name, (str(module), str(qualname))


def _import_by_name(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
