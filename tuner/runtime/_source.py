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
  followed: its version is part of the key already.
- A registered kernel (`tuner.kernels`): the bytes of the module that defines its launcher and of every
  module of the same package that module imports, transitively (`module_files_hash`), so editing a
  kernel body, its launcher or a helper module it imports makes the old entries stale.

The hash is computed on the first miss, not at decoration time, so functions defined below the
decorated one (a kernel body after its launcher) are found.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import logging
import re
import sys
import textwrap
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["code_hash", "module_files", "module_files_hash", "triton_cache_key"]

_DEF_RE = re.compile(r"^(async\s+)?def\s+\w+\s*\(", re.MULTILINE)
_MAX_FUNCTIONS = 200  # a guard against walking a whole code base through globals


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


def _python_function(obj: Any) -> types.FunctionType | None:
    """The plain function behind a Triton JIT/interpreted function, a jax.jit wrapper, a
    functools.partial or a functools.wraps chain; None for anything else (classes, builtins, ...)."""
    for _ in range(10):
        if isinstance(obj, types.FunctionType):
            return obj
        if isinstance(obj, functools.partial):
            obj = obj.func
            continue
        nxt = getattr(obj, "__wrapped__", None)
        if nxt is None:
            nxt = getattr(obj, "fn", None)
        if nxt is None or nxt is obj:
            return None
        obj = nxt
    return None


def _source_text(fn: types.FunctionType) -> str | None:
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    m = _DEF_RE.search(text)
    return text[m.start() :] if m else text


def _top_package(module: str | None) -> str:
    return (module or "").split(".")[0]


def _names_in(fn: types.FunctionType, text: str) -> list[tuple[str, ...]]:
    """Dotted names (`a`, `a.b`, `a.b.c`) loaded in the function's source, in order of appearance."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
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
    root_file = getattr(base.__code__, "co_filename", None)
    texts: list[str] = []
    seen: set[int] = set()
    todo: list[tuple[str, Any]] = [("", base)]
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
        for dotted in _names_in(f, text):
            ref = _resolve(f, dotted)
            if ref is None or ref is f:
                continue
            if _is_user_code(ref, root_pkg, root_file):
                todo.append((".".join(dotted), ref))
    return _h("\n\0".join(texts))


# ---- registered kernels: module files ----------------------------------------------------------------
def _imported_modules(path: Path, module: str, package: str) -> list[str]:
    """Modules of `package` that the file imports (absolute or relative), as dotted names."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
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
