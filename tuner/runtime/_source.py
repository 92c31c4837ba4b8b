"""The source identity of a tuned kernel: a hash that changes when the code that runs changes.

- A `@triton.jit` kernel compiled for a GPU (a `JITFunction`): Triton's own `JITFunction.cache_key`,
  which covers the kernel's source and every `@triton.jit` function it calls (and their constexpr
  globals). Wrappers (`@triton.heuristics`, `@triton.autotune`) are unwrapped to the JIT function.
- A `@triton.jit` kernel under the interpreter (`InterpretedFunction`, which has no `cache_key`), a
  Pallas launcher, a jitted or plain Python launcher: the function's source from its `def` line plus,
  transitively, the source of every function it references by name (globals, closure cells,
  `module.attr` of a module of the same package) that is defined in user code (the decorated
  function's top-level package or its file), e.g. the Pallas kernel body that a launcher passes to
  `pl.pallas_call` and the helpers that body calls. Library code (jax, triton, numpy, ...) is not
  followed: its version is part of the key already. A decorated function of a framework itself (jax's
  Pallas ops, `functools.partial(jax.experimental.pallas.ops.gpu.attention.mha, ...)`; the packages of
  `tuner._versions.FRAMEWORK_PACKAGES`) counts by its qualified name and bound arguments, and the
  framework's versions join the key (`_env.dependency_packages`): its own code would be followed through
  the whole framework, slowly, and through globals whose order varies between processes (jax builds
  tuples of classes from sets), so no other process would find its entries.
  What such a function's behaviour depends on beyond its text is hashed too (`_Values`): its default
  argument values (`__defaults__`, `__kwdefaults__`), and the values of the globals and closure cells its
  source names. A library callable counts by its qualified name (module + qualname; a
  `functools.partial` by its function and bound arguments), a function of user code by its source (it
  is followed), a simple immutable value (None, bool, int, float, complex, str, bytes, an enum member,
  a dtype, a Triton constexpr, and tuples, frozensets and frozen dataclasses of those) by a canonical
  text, and anything else (arrays, lists, dicts, objects) by its type's name only: never by a repr that
  holds an address, nor in an order that varies between processes. A jax tracer counts as a jax array
  (the type of a closure cell holding one is a tracer's only inside `jax.jit`, `grad` or `vmap`: a
  launcher built inside the traced function and the same launcher built outside are one kernel), and
  a torch `FakeTensor` or `FunctionalTensor` (what a tensor is under `torch.compile`, `torch.export`,
  a `FakeTensorMode` or functionalization) as a `torch.Tensor` (a parameter's as an `nn.Parameter`),
  for the same reason. Modules count by nothing (their
  attributes by the source's text, their code by the versions in the key). A function with none of these
  values hashes as its sources alone. A top-level `functools.partial` adds its bound arguments.
- A registered kernel (`tuner.kernels`): the bytes of the module that defines its launcher and of every
  module of the same package that module imports, transitively (`module_files_hash`), so editing a
  kernel body, its launcher or a helper module it imports makes the old entries stale.

The hash is computed on the first miss, not at decoration time, so functions defined below the
decorated one (a kernel body after its launcher) are found.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import inspect
import logging
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tuner._parse import parse
from tuner._versions import FRAMEWORK_PACKAGES

log = logging.getLogger(__name__)

__all__ = ["code_hash", "module_files", "module_files_hash", "triton_cache_key"]

_DEF_RE = re.compile(r"^(async\s+)?def\s+\w+\s*\(", re.MULTILINE)
_MAX_FUNCTIONS = 200  # a guard against walking a whole code base through globals
# Guards on describing values (`_Values`): a longer str/bytes counts by its length, a bigger tuple or
# frozenset by its length, a deeper one by its type, and past the budget of items per launcher every
# further value by its type, so a large constant in a closure does not make the first miss slow.
_MAX_TEXT = 4096
_MAX_ITEMS = 256
_MAX_DEPTH = 4
_VALUE_BUDGET = 4096


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _unwrap_triton(fn: Any) -> Any:
    """The JITFunction / InterpretedFunction under Triton wrappers (Heuristics, Autotuner), or None."""
    seen = 0
    while fn is not None and seen < 10:
        seen += 1
        mod = type(fn).__module__ or ""
        if not mod.startswith("triton"):
            return None
        if _is_jit_callable(fn) or type(fn).__name__ == "InterpretedFunction":
            return fn
        fn = getattr(fn, "fn", None)
    return None


def _is_jit_callable(fn: Any) -> bool:
    jit = sys.modules.get("triton.runtime.jit")
    cls = getattr(jit, "JITCallable", None) or getattr(jit, "JITFunction", None)
    return cls is not None and isinstance(fn, cls)


def triton_cache_key(fn: Any) -> str | None:
    """Triton's `JITFunction.cache_key` of a @triton.jit kernel (through heuristics/autotune wrappers), or
    None when there is none (the interpreter's InterpretedFunction) or Triton cannot compute it."""
    jf = _unwrap_triton(fn)
    if jf is None or not _is_jit_callable(jf):
        return None
    try:
        key = jf.cache_key
    except Exception as exc:  # noqa: BLE001 - e.g. a referenced global Triton does not support
        log.debug("JITFunction.cache_key of %r failed: %s", jf, exc)
        return None
    return str(key)


def _layers(obj: Any) -> Iterator[Any]:
    """`obj` and what it wraps, outermost first: through Triton JIT/interpreted functions, jax.jit
    wrappers, functools.partial and functools.wraps chains, down to a plain function (at most 10)."""
    for _ in range(10):
        yield obj
        if isinstance(obj, types.FunctionType):
            return
        if isinstance(obj, functools.partial):
            obj = obj.func
            continue
        nxt = getattr(obj, "__wrapped__", None)
        if nxt is None:
            nxt = getattr(obj, "fn", None)
        if nxt is None or nxt is obj:
            return
        obj = nxt


def _python_function(obj: Any) -> types.FunctionType | None:
    """The plain function behind a Triton JIT/interpreted function, a jax.jit wrapper, a
    functools.partial or a functools.wraps chain; None for anything else (classes, builtins, ...)."""
    *_, last = _layers(obj)
    return last if isinstance(last, types.FunctionType) else None


def _source_text(fn: types.FunctionType) -> str | None:
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    m = _DEF_RE.search(text)
    return text[m.start() :] if m else text


def _top_package(module: str | None) -> str:
    return (module or "").split(".")[0]


def _parse(text: str) -> ast.Module | None:
    try:
        return parse(text)
    except SyntaxError:
        return None


def _names_in(fn: types.FunctionType, tree: ast.Module | None) -> list[tuple[str, ...]]:
    """Dotted names (`a`, `a.b`, `a.b.c`) loaded in the function's source, in order of appearance."""
    if tree is None:
        return [(n,) for n in fn.__code__.co_names]
    out: list[tuple[str, ...]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                out.append((cur.id, *reversed(parts)))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.append((node.id,))
    return out


def _resolve(fn: types.FunctionType, dotted: tuple[str, ...]) -> Any:
    scope: dict[str, Any] = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=False):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
    obj = scope.get(dotted[0])
    for part in dotted[1:]:
        if obj is None:
            return None
        if isinstance(obj, types.ModuleType):
            obj = getattr(obj, part, None)
        else:
            return obj  # only follow attributes of modules (mod.fn), not of objects
    return obj


def _is_user_code(obj: Any, root_pkg: str, root_file: str | None) -> bool:
    fn = _python_function(obj)
    if fn is None:
        return False
    mod = getattr(fn, "__module__", None)
    if _top_package(mod) == root_pkg and root_pkg not in ("", "__main__", "builtins"):
        return True
    return root_file is not None and getattr(fn.__code__, "co_filename", None) == root_file


def code_hash(fn: Any, depends: Iterable[Any] = ()) -> str:
    """The source identity of `fn` (32 hex digits): Triton's cache_key for a compiled @triton.jit kernel,
    else the sources of `fn` and of the user functions it references, transitively (see the module
    docstring); `depends` adds more functions (e.g. a kernel that the launcher reaches only through an
    object the scan cannot follow)."""
    parts = [_one_hash(fn)]
    parts += [_one_hash(d) for d in depends]
    return parts[0] if len(parts) == 1 else _h("|".join(parts))


def _one_hash(fn: Any) -> str:
    key = triton_cache_key(fn)
    if key is not None:
        return _h("triton-cache-key:" + key)
    base = _python_function(fn)
    if base is None:  # a callable object: the `__call__` its class defines, else its class's name
        base = next((c.__dict__["__call__"] for c in type(fn).__mro__ if "__call__" in c.__dict__), None)
        if not isinstance(base, types.FunctionType):
            return _h(f"{type(fn).__module__}.{getattr(fn, '__qualname__', type(fn).__qualname__)}")
    root_pkg = _top_package(getattr(base, "__module__", None))
    if root_pkg in FRAMEWORK_PACKAGES:  # jax's own Pallas op, say: its version is in the key (see above)
        bound = _bound_args_text(fn, _Values(lambda o: False, []))
        return _h(f"framework:{_qualified(base)}" + (f"\n\0=partial:{bound}" if bound else ""))
    root_file = getattr(base.__code__, "co_filename", None)
    texts: list[str | tuple[str, dict[str, str]]] = []  # a tuple: (label, the values of that function)
    reassigned: set[str] = set()  # names some function declares `global` or `nonlocal`: state, not code
    seen: set[int] = set()
    todo: list[tuple[str, Any]] = [("", base)]
    values = _Values(lambda o: _is_user_code(o, root_pkg, root_file), todo)
    bound = _bound_args_text(fn, values)
    if bound:
        texts.append(f"=partial:{bound}")
    while todo and len(seen) < _MAX_FUNCTIONS:
        label, obj = todo.pop(0)
        f = _python_function(obj)
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        jit_key = triton_cache_key(obj) if obj is not f else None
        if jit_key is not None:  # a compiled @triton.jit helper: Triton's own identity of it
            texts.append(f"{label}=triton:{jit_key}")
            continue
        text = _source_text(f)
        if text is None:
            code = f.__code__
            text = repr((code.co_code, code.co_consts, code.co_names))
        texts.append(f"{label}={text}")
        tree = _parse(text)
        reassigned |= _declared_names(tree)
        outside = _outside_names(f.__code__)
        described: dict[str, str] = {}
        for dotted in _names_in(f, tree):
            ref = _resolve(f, dotted)
            if ref is None or ref is f:
                continue
            if _is_user_code(ref, root_pkg, root_file):
                todo.append((".".join(dotted), ref))
            elif dotted[0] in outside and dotted[0] not in described:
                ref = _resolve(f, dotted[:1])
                if ref is not None and ref is not f and not isinstance(ref, types.ModuleType):
                    described[dotted[0]] = values.text(ref, dotted[0])
        described.update(_defaults_text(f, tree, values))
        texts.append((label, described))
    out = [t for t in texts if isinstance(t, str)]  # the sources alone: the hash of a function without values
    for t in texts:
        if isinstance(t, tuple) and (kept := {k: v for k, v in t[1].items() if k not in reassigned}):
            out.append(f"{t[0]}:values=" + "; ".join(f"{k}={v}" for k, v in sorted(kept.items())))
    return _h("\n\0".join(out))


# ---- values a function depends on beyond its text ------------------------------------------------------
def _outside_names(code: types.CodeType) -> set[str]:
    """The names the code (and the functions and lambdas defined inside it) reads from outside: globals
    and closure cells, never its own locals (attribute names are in `co_names` too, harmlessly)."""
    out = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _outside_names(const)
    return out


def _declared_names(tree: ast.Module | None) -> set[str]:
    """The names the source declares `global` or `nonlocal` (module state such as a `_loaded` flag, which
    would make the hash depend on when the first miss happens)."""
    if tree is None:
        return set()
    return {n for node in ast.walk(tree) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}


def _defaults_text(f: types.FunctionType, tree: ast.Module | None, values: _Values) -> dict[str, str]:
    """The function's default argument values, by parameter name (`default:NAME`), but those its source
    writes as a literal (`interpret=False`, `eps=1e-6`): the text holds them already."""
    code = f.__code__
    found: dict[str, Any] = {}
    if f.__defaults__:
        positional = code.co_varnames[: code.co_argcount]
        found.update(zip(positional[-len(f.__defaults__) :], f.__defaults__, strict=True))
    found.update(f.__kwdefaults__ or {})
    literal = _literal_defaults(tree)
    return {f"default:{n}": values.text(v, n) for n, v in sorted(found.items()) if n not in literal}


def _literal_defaults(tree: ast.Module | None) -> set[str]:
    """The parameters whose default the `def` the source starts with writes as a literal."""
    node = tree.body[0] if tree is not None and tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    out = set()
    for arg, default in pairs:
        try:
            ast.literal_eval(default)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        out.add(arg.arg)
    return out


def _bound_args_text(fn: Any, values: _Values) -> str:
    """The bound arguments of the functools.partial layers around `fn` (through jax.jit and functools.wraps
    wrappers, as `_python_function` unwraps them), outermost first; "" when there are none."""
    return " | ".join(_partial_args_text(p, values) for p in _layers(fn) if isinstance(p, functools.partial))


def _partial_args_text(p: functools.partial, values: _Values, depth: int = 0) -> str:
    args = [values.text(a, "partial", depth + 1) for a in p.args]
    args += [f"{k}={values.text(v, k, depth + 1)}" for k, v in sorted(p.keywords.items())]
    return ", ".join(args)


def _qualified(obj: Any) -> str | None:
    """module.qualname of a function, class or library callable, or None when it has no such name."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    if not isinstance(name, str):
        return None
    return f"{module}.{name}" if isinstance(module, str) else name


def _is_jax_tracer(v: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(v, jax.core.Tracer)


# torch's tracing stand-ins for a tensor: (module, class name)
_TORCH_STAND_INS = (
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._subclasses.functional_tensor", "FunctionalTensor"),
)


def _torch_stand_in_type(v: Any) -> str | None:
    """When `v` is a torch FakeTensor or FunctionalTensor: the type name of the tensor it stands for
    (`torch.Tensor`, or `torch.nn.parameter.Parameter` for a parameter's), as `_type_name` gives it for
    a real one; else None (also when torch is not imported)."""
    for module, name in _TORCH_STAND_INS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(v, cls):
            torch = sys.modules["torch"]
            real = torch.nn.Parameter if isinstance(v, torch.nn.Parameter) else torch.Tensor
            return f"{real.__module__}.{real.__qualname__}"
    return None


def _jax_array_type() -> str:
    """The type name of a concrete jax array (`_type_name` of one), without making one."""
    try:
        from jax._src.array import ArrayImpl

        return f"{ArrayImpl.__module__}.{ArrayImpl.__qualname__}"
    except Exception:  # noqa: BLE001 - private jax API moved: the public abstract type
        return "jax.Array"


def _type_name(v: Any) -> str:
    """module.qualname of `v`'s type; for a torch tracing stand-in, of the tensor it stands for."""
    stands_for = _torch_stand_in_type(v)
    if stands_for is not None:
        return stands_for
    t = type(v)
    return f"{t.__module__}.{t.__qualname__}"


class _Values:
    """Describes the values a function depends on (`text`) as the module docstring says; a user-code
    function met among them is queued on `todo`, so that its source is hashed as well."""

    def __init__(self, is_user: Callable[[Any], bool], todo: list[tuple[str, Any]]) -> None:
        self.is_user = is_user
        self.todo = todo
        self.budget = _VALUE_BUDGET

    def text(self, v: Any, label: str, depth: int = 0) -> str:
        """`v` as canonical text; `label` names it (a global, a parameter) for a user function queued."""
        self.budget -= 1
        if self.budget < 0 or depth > _MAX_DEPTH:
            return f"<{_type_name(v)}>"
        try:
            return self._text(v, label, depth)
        except Exception as exc:  # noqa: BLE001 - an object whose attributes raise: its type, never a crash
            log.debug("describing a %s for the source hash failed: %s", _type_name(v), exc)
            return f"<{_type_name(v)}>"

    def _text(self, v: Any, label: str, depth: int) -> str:
        t = type(v)
        if v is None or t in (bool, int, float, complex, str, bytes):
            if t in (str, bytes) and len(v) > _MAX_TEXT:
                return f"<{t.__name__} of length {len(v)}>"
            try:
                return repr(v)
            except ValueError:  # an int too long for str() (sys.set_int_max_str_digits)
                return f"<int of {v.bit_length()} bits>"
        if isinstance(v, enum.Enum):
            return f"{_type_name(v)}.{v.name}"
        if isinstance(v, (tuple, frozenset)):
            if len(v) > _MAX_ITEMS:
                return f"<{_type_name(v)} of length {len(v)}>"
            items = [self.text(x, label, depth + 1) for x in v]
            if isinstance(v, frozenset):
                items.sort()  # set order varies with the process's string hash seed
            prefix = "" if t in (tuple, frozenset) else _type_name(v)  # a namedtuple: its type too
            return f"{prefix}{'frozenset' if isinstance(v, frozenset) else ''}({', '.join(items)})"
        dtype = self._dtype_text(v)
        if dtype is not None:
            return dtype
        if isinstance(v, functools.partial):
            return f"partial({self.text(v.func, label, depth + 1)}; {_partial_args_text(v, self, depth)})"
        if isinstance(v, types.MethodType):
            return f"method({self.text(v.__func__, label, depth + 1)} of {self.text(v.__self__, label, depth + 1)})"
        if isinstance(v, type):
            return f"class:{_qualified(v)}"
        if callable(v) and _python_function(v) is not None:
            if self.is_user(v):  # its source is hashed when its turn in the queue comes
                self.todo.append((label, v))
            kind = "" if isinstance(v, types.FunctionType) else f"{t.__qualname__}:"
            return f"fn:{kind}{_qualified(v) or _qualified(_python_function(v))}"
        if dataclasses.is_dataclass(v) and t.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            fields = dataclasses.fields(v)
            if len(fields) <= _MAX_ITEMS:
                inner = ", ".join(
                    f"{f.name}={self.text(getattr(v, f.name), label, depth + 1)}" for f in fields
                )
                return f"{_type_name(v)}({inner})"
        if _is_jax_tracer(v):  # what a jax array is outside the trace (see the module docstring)
            return f"<{_jax_array_type()}>"
        name = _qualified(v) if callable(v) else None
        if name is not None:  # a builtin (operator.add, math.sqrt) or a named callable object (a ufunc)
            return f"fn:{name}" if isinstance(v, types.BuiltinFunctionType) else f"fn:{t.__qualname__}:{name}"
        return f"<{_type_name(v)}>"

    def _dtype_text(self, v: Any) -> str | None:
        """A dtype by its name (numpy, torch, triton), a Triton constexpr by its value."""
        t = type(v)
        module = t.__module__ or ""
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.dtype):
            return f"numpy.dtype({v})"
        if t.__name__ == "dtype" and module.split(".")[0] in ("torch", "triton"):
            return f"{module.split('.')[0]}.dtype({v})"
        if t.__name__ == "constexpr" and module.startswith("triton"):
            return f"constexpr({self.text(getattr(v, 'value', None), '')})"
        return None


# ---- registered kernels: module files ----------------------------------------------------------------
def _imported_modules(path: Path, module: str, package: str) -> list[str]:
    """Modules of `package` that the file imports (absolute or relative), as dotted names."""
    try:
        tree = parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    out = []
    base_pkg = module.rsplit(".", 1)[0] if "." in module else module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base_pkg.split(".")
                parent = parent[: len(parent) - (node.level - 1)] if node.level > 1 else parent
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append(target)
            out += [f"{target}.{a.name}" for a in node.names]  # `from . import _matmul_triton`
    return [m for m in out if m == package or m.startswith(package + ".")]


def module_files(module: str, package: str | None = None) -> list[Path]:
    """The source file of `module` and of every module of `package` (default: the module's top-level
    package) that it imports, transitively, sorted by module name."""
    package = package or _top_package(module)
    seen: dict[str, Path | None] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not origin or not origin.endswith(".py") or not Path(origin).is_file():
            seen[name] = None
            continue
        seen[name] = Path(origin)
        todo += [m for m in _imported_modules(Path(origin), name, package) if m not in seen]
    return [p for _, p in sorted(seen.items()) if p is not None]


def module_files_hash(module: str, package: str | None = None) -> str:
    """sha256 (32 hex digits) of the bytes of `module_files(module, package)`, read from disk now."""
    parts = []
    for path in module_files(module, package):
        try:
            parts.append(f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
        except OSError:
            continue
    return _h("\n".join(parts) or module)
