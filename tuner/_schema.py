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
    return _Validators(Draft202012Validator(whole), Draft202012Validator(top), Draft202012Validator(item))


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
    return _first_error(_validator().entry, entry, where)


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
