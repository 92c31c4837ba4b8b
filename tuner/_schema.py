"""The published JSON Schema of cache files, and validation against it with the `jsonschema` library.

The schema ships inside the package (tuner/data/cache-schema.json; docs/cache-schema.json is the same file,
for readers of the repository). Every cache file tuner reads (`tuner cache import`, `tuner cache show
--file`, `tuner.load_cache`) is checked against it before any entry is built, so the schema others validate
their files with is the one tuner enforces: the file's top level (`cache_file_schema_error`) decides whether
the file can be read at all, and each entry is checked on its own (`cache_entry_schema_error`), so a reader
may drop one bad entry and keep the rest. `jsonschema` is imported on first use, not with `import tuner`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import numbers
import re
from collections.abc import Callable, Sized
from importlib import resources
from typing import Any, NamedTuple

__all__ = [
    "CACHE_SCHEMA_RESOURCE",
    "cache_schema",
    "cache_schema_error",
    "cache_file_schema_error",
    "cache_entry_schema_error",
]

CACHE_SCHEMA_RESOURCE = "data/cache-schema.json"  # inside the tuner package
_MAX_MESSAGE = 240
_ANNOTATIONS = {"description", "title", "$comment", "examples"}


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return (resources.files("tuner") / CACHE_SCHEMA_RESOURCE).read_text(encoding="utf-8")


def cache_schema() -> dict[str, Any]:
    """The cache-file JSON Schema (draft 2020-12), a fresh copy each call."""
    doc: dict[str, Any] = json.loads(_schema_text())
    return doc


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """The schema with every local `{"$ref": "#/$defs/NAME"}` replaced by its target (the cache schema has
    no recursion). Same meaning, about twice as fast to check: jsonschema resolves a reference per use."""
    if isinstance(node, list):
        return [_inline_refs(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$defs", "$ref")}
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return out
    target = _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
    if set(out) <= _ANNOTATIONS:
        return target  # annotations beside the reference do not validate anything
    return {**out, "allOf": [*out.get("allOf", []), target]}


class _Validators(NamedTuple):
    whole: Any  # the whole file
    top: Any  # the file without its entries' items: what makes the file unreadable
    entry: Any  # one entry
    entry_ok: Callable[[Any], bool] | None  # the entry schema compiled to a predicate (None: not compilable)


@functools.lru_cache(maxsize=1)
def _validator() -> _Validators:
    from jsonschema import Draft202012Validator

    schema = cache_schema()
    Draft202012Validator.check_schema(schema)
    defs = schema.get("$defs", {})
    whole = _inline_refs(schema, defs)
    top = copy.deepcopy(whole)
    entries = top.get("properties", {}).get("entries", {})
    item = entries.pop("items", {"$ref": "#/$defs/entry"}) if isinstance(entries, dict) else {}
    return _Validators(
        Draft202012Validator(whole),
        Draft202012Validator(top),
        Draft202012Validator(item),
        compile_schema(item),
    )


# ---- the fast path: a schema compiled to a predicate ---------------------------------------------------
# jsonschema checks an entry in about 1 ms (it walks the schema afresh for every instance), which made a
# file of 100k entries take minutes to import or load. `compile_schema` turns the (ref-inlined) entry
# schema into nested closures once; each says valid or not, by jsonschema's own rules for every keyword it
# knows (Draft 2020-12, the type checks of jsonschema's type checker). A schema with any other keyword
# is not compiled (None) and every instance goes through jsonschema. The predicate only decides whether
# jsonschema is asked at all: an entry it passes is valid, one it fails is checked again by jsonschema,
# whose first error is the message (tests/test_cache_schema.py compares the two on many entries).

Check = Callable[[Any], bool]
_NOT_COMPILED = object()


def _is_integer(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


def _is_number(x: Any) -> bool:
    t = type(x)
    if t is int or t is float:  # what JSON gives, without the ABC's slower check
        return True
    return not isinstance(x, bool) and isinstance(x, numbers.Number)


_TYPES: dict[str, Check] = {
    "array": lambda x: isinstance(x, list),
    "boolean": lambda x: isinstance(x, bool),
    "integer": _is_integer,
    "null": lambda x: x is None,
    "number": _is_number,
    "object": lambda x: isinstance(x, dict),
    "string": lambda x: isinstance(x, str),
}


def _all(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]

    def check(x: Any) -> bool:
        for c in checks:  # noqa: SIM110 - a loop, not all() over a generator: this runs for every value
            if not c(x):
                return False
        return True

    return check


def _kw_type(v: Any, node: dict[str, Any]) -> Any:
    names = v if isinstance(v, list) else [v]
    if not all(isinstance(n, str) and n in _TYPES for n in names):
        return _NOT_COMPILED
    fns = [_TYPES[n] for n in names]
    if len(fns) == 1:
        return fns[0]
    return lambda x: any(f(x) for f in fns)


def _kw_sub(v: Any) -> Any:
    sub = compile_schema(v)
    return _NOT_COMPILED if sub is None else sub


def _kw_subs(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        return _NOT_COMPILED
    subs = [compile_schema(s) for s in v]
    return _NOT_COMPILED if any(s is None for s in subs) else subs


def _kw_any_of(v: Any, node: dict[str, Any]) -> Any:
    subs = _kw_subs(v)
    if subs is _NOT_COMPILED:
        return subs

    def check(x: Any) -> bool:
        for s in subs:  # noqa: SIM110 - as in _all
            if s(x):
                return True
        return False

    return check


def _kw_all_of(v: Any, node: dict[str, Any]) -> Any:
    subs = _kw_subs(v)
    return subs if subs is _NOT_COMPILED else _all(subs)


def _kw_not(v: Any, node: dict[str, Any]) -> Any:
    sub = _kw_sub(v)
    return sub if sub is _NOT_COMPILED else (lambda x: not sub(x))


def _kw_bound(op: Callable[[Any, Any], bool]) -> Callable[[Any, dict[str, Any]], Any]:
    def kw(v: Any, node: dict[str, Any]) -> Any:
        if not _is_number(v):
            return _NOT_COMPILED
        return lambda x: not _is_number(x) or not op(x, v)  # op: what is an error

    return kw


def _kw_size(kind: type[Sized], too_long: bool) -> Callable[[Any, dict[str, Any]], Any]:
    def kw(v: Any, node: dict[str, Any]) -> Any:
        if not _is_integer(v):
            return _NOT_COMPILED
        if too_long:
            return lambda x: not isinstance(x, kind) or len(x) <= v
        return lambda x: not isinstance(x, kind) or len(x) >= v

    return kw


def _kw_pattern(v: Any, node: dict[str, Any]) -> Any:
    if not isinstance(v, str):
        return _NOT_COMPILED
    search = re.compile(v).search  # jsonschema: re.search(pattern, instance)
    return lambda x: not isinstance(x, str) or search(x) is not None


def _kw_required(v: Any, node: dict[str, Any]) -> Any:
    if not isinstance(v, list):
        return _NOT_COMPILED
    names = list(v)
    return lambda x: not isinstance(x, dict) or all(n in x for n in names)


def _kw_properties(v: Any, node: dict[str, Any]) -> Any:
    if not isinstance(v, dict):
        return _NOT_COMPILED
    items: list[tuple[str, Check]] = []
    for k, sub in v.items():
        c = compile_schema(sub)
        if c is None:
            return _NOT_COMPILED
        items.append((k, c))

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for k, c in items:  # noqa: SIM110 - as in _all
            if k in x and not c(x[k]):
                return False
        return True

    return check


def _kw_additional_properties(v: Any, node: dict[str, Any]) -> Any:
    if "patternProperties" in node:
        return _NOT_COMPILED
    known = node.get("properties", {})
    if not isinstance(known, dict):
        return _NOT_COMPILED
    if isinstance(v, dict):
        sub = compile_schema(v)
        if sub is None:
            return _NOT_COMPILED
        return lambda x: not isinstance(x, dict) or all(sub(x[k]) for k in x if k not in known)
    if v is False:
        return lambda x: not isinstance(x, dict) or all(k in known for k in x)
    return _NOT_COMPILED if v is not True else (lambda x: True)


def _kw_property_names(v: Any, node: dict[str, Any]) -> Any:
    sub = _kw_sub(v)
    if sub is _NOT_COMPILED:
        return sub
    return lambda x: not isinstance(x, dict) or all(sub(k) for k in x)


def _kw_items(v: Any, node: dict[str, Any]) -> Any:
    if "prefixItems" in node:
        return _NOT_COMPILED
    sub = _kw_sub(v)
    if sub is _NOT_COMPILED:
        return sub
    return lambda x: not isinstance(x, list) or all(sub(i) for i in x)


_KEYWORDS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "type": _kw_type,
    "anyOf": _kw_any_of,
    "allOf": _kw_all_of,
    "not": _kw_not,
    "minimum": _kw_bound(lambda x, v: x < v),
    "maximum": _kw_bound(lambda x, v: x > v),
    "exclusiveMinimum": _kw_bound(lambda x, v: x <= v),
    "exclusiveMaximum": _kw_bound(lambda x, v: x >= v),
    "minLength": _kw_size(str, too_long=False),
    "maxLength": _kw_size(str, too_long=True),
    "maxItems": _kw_size(list, too_long=True),
    "minItems": _kw_size(list, too_long=False),
    "minProperties": _kw_size(dict, too_long=False),
    "maxProperties": _kw_size(dict, too_long=True),
    "pattern": _kw_pattern,
    "required": _kw_required,
    "properties": _kw_properties,
    "additionalProperties": _kw_additional_properties,
    "propertyNames": _kw_property_names,
    "items": _kw_items,
}


def compile_schema(schema: Any) -> Check | None:
    """A predicate that says whether an instance is valid under `schema` (a Draft 2020-12 schema without
    references), exactly as jsonschema does; None when the schema uses a keyword it does not compile."""
    if schema is True or schema == {}:
        return lambda x: True
    if schema is False:
        return lambda x: False
    if not isinstance(schema, dict):
        return None
    checks: list[Check] = []
    for k, v in schema.items():
        if k in _ANNOTATIONS:
            continue
        kw = _KEYWORDS.get(k)
        if kw is None:
            return None
        c = kw(v, schema)
        if c is _NOT_COMPILED:
            return None
        checks.append(c)
    return _all(checks) if checks else (lambda x: True)


def _where(path: Any, prefix: str = "") -> str:
    out = prefix
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def cache_schema_error(doc: Any) -> str | None:
    """None if `doc` (a parsed cache file) is valid under the schema, else one line saying where and why."""
    return _first_error(_validator().whole, doc, "")


def cache_file_schema_error(doc: Any) -> str | None:
    """Like `cache_schema_error`, but what is checked stops at the entries list (its type and length):
    None when the file can be read, whatever its entries hold."""
    return _first_error(_validator().top, doc, "")


def cache_entry_schema_error(entry: Any, where: str = "entry") -> str | None:
    """None if `entry` (one item of a file's entries) is valid under the schema's entry definition, else
    one line saying where (below `where`, e.g. "entries[3].time_s") and why."""
    v = _validator()
    if v.entry_ok is not None:
        try:
            if v.entry_ok(entry):
                return None  # valid: jsonschema is asked only for an entry that fails (its message)
        except Exception:  # noqa: BLE001 - a value the predicate cannot compare: jsonschema decides
            pass
    return _first_error(v.entry, entry, where)


def _first_error(validator: Any, doc: Any, prefix: str) -> str | None:
    from jsonschema.exceptions import best_match

    # The first error only (a bad file can have millions); best_match descends into its anyOf/allOf context.
    err = best_match(itertools.islice(validator.iter_errors(doc), 1))
    if err is None:
        return None
    message = str(err.message)
    shown = repr(err.instance)
    if len(shown) > 60:  # jsonschema quotes the whole value: keep its start, so the reason stays on screen
        message = message.replace(shown, shown[:50] + "...")
    message = " ".join(message.split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return f"{_where(err.absolute_path, prefix)}: {message}"
