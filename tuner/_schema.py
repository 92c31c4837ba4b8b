"""The published JSON Schema of cache files, and validation against it with the `jsonschema` library.

The schema ships inside the package (tuner/data/cache-schema.json; docs/cache-schema.json is the same file,
for readers of the repository). Every cache file tuner reads (`tuner cache import`, `tuner cache show
--file`, `tuner.load_cache`) is checked against it before any entry is built, so the schema others validate
their files with is the one tuner enforces: the file's top level (`cache_file_schema_error`) decides whether
the file can be read at all, and each entry is checked on its own (`cache_entry_schema_error`), so a reader
may drop one bad entry and keep the rest. An entry is first checked by the entry schema compiled with
`fastjsonschema` (below); `jsonschema` and it are imported on first use, not with `import tuner`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
from collections.abc import Callable
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
log = logging.getLogger(__name__)


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
    entry_ok: Callable[[Any], bool] | None  # the fast "valid" answer for one entry (None: jsonschema only)


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
        _compiled_check(item),
    )


# ---- the fast path: the entry schema compiled by fastjsonschema ------------------------------------------
# jsonschema checks an entry in about 1 ms (it walks the schema afresh for every instance), which made a
# file of 100k entries take minutes to import or load. fastjsonschema compiles the (ref-inlined) entry
# schema into Python code once. It knows drafts 4, 6 and 7, not 2020-12, so it is given only a schema whose
# keywords mean the same in draft 7 (_SAME_IN_DRAFT7); any other keyword, or any failure to compile, and
# every entry goes through jsonschema. The compiled check only decides whether jsonschema is asked at all:
# an entry it passes is valid, one it fails (or that makes it raise anything) is checked again by
# jsonschema, whose first error is the message. fastjsonschema is stricter in one place, never looser:
# it reads a pattern's `$` as the end of the string (\Z), where jsonschema's re.search also matches before
# a final newline, so such a string goes to jsonschema, which decides (tests/test_cache_schema.py compares
# the two on many entries). It judges values as json.loads gives them (it takes a tuple for an array).

_DRAFT7 = "http://json-schema.org/draft-07/schema#"
_ONE_SCHEMA = frozenset({"not", "additionalProperties", "propertyNames", "items"})  # `items`: one schema
_SCHEMA_LIST = frozenset({"allOf", "anyOf"})
_SAME_IN_DRAFT7 = frozenset(
    {"type", "pattern", "maxLength", "minLength", "minimum", "maximum", "exclusiveMinimum",
     "exclusiveMaximum", "maxItems", "minItems", "maxProperties", "minProperties", "required"}
)  # fmt: skip


def _same_in_draft7(node: Any) -> bool:
    """Whether `node` (a schema without references) uses only keywords whose draft-7 meaning is its
    2020-12 one (`items` as a list, `prefixItems`, `$dynamicRef`, `unevaluated*`... are not)."""
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict):
        return False
    for k, v in node.items():
        if k in _ANNOTATIONS or k in _SAME_IN_DRAFT7:
            continue
        if k in _ONE_SCHEMA:
            ok = _same_in_draft7(v)
        elif k in _SCHEMA_LIST:
            ok = isinstance(v, list) and all(_same_in_draft7(s) for s in v)
        elif k == "properties":
            ok = isinstance(v, dict) and all(_same_in_draft7(s) for s in v.values())
        else:
            ok = False
        if not ok:
            return False
    return True


def _compiled_check(item: Any) -> Callable[[Any], bool] | None:
    """A predicate that says an entry is valid under `item` (the ref-inlined entry schema), compiled by
    fastjsonschema; None (jsonschema for every entry) where it cannot be made."""
    if not _same_in_draft7(item):
        log.debug("cache entry schema: a keyword not known alike in draft 7; entries checked by jsonschema")
        return None
    try:
        import fastjsonschema

        # detailed_exceptions=False: an invalid entry's exception does not carry the definition (jsonschema
        # gives the message), and every anyOf branch that fails raises one: a third of the time per entry
        draft7 = {**item, "$schema": _DRAFT7}
        validate = fastjsonschema.compile(draft7, use_default=False, detailed_exceptions=False)
    except Exception:  # noqa: BLE001 - not installed, or a schema it cannot compile: jsonschema does it all
        log.debug(
            "cache entry schema not compiled by fastjsonschema; entries checked by jsonschema", exc_info=True
        )
        return None

    def entry_ok(entry: Any) -> bool:
        try:
            validate(entry)
        except Exception:  # noqa: BLE001 - invalid (JsonSchemaException), or a value it cannot judge
            return False
        return True

    return entry_ok


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
    if v.entry_ok is not None and v.entry_ok(entry):
        return None  # valid: jsonschema is asked only for an entry that fails (its message, or valid)
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
