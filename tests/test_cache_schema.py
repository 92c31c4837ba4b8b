"""The published cache-file JSON Schema: it is the file shipped in the package, it validates every file
tuner writes (checked here with the `jsonschema` library straight on the published file, not through tuner),
it rejects what the reader rejects, `tuner cache import` goes through it, and .gz files are read with a bound
on their decompressed size."""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.test_cache_file import BAD, entry, snapshot
from tuner.cli import main
from tuner.runtime import MAX_FILE_BYTES, CacheEntry, CacheFileError, CacheKey, ConfigCache, load_cache

REPO = Path(__file__).resolve().parent.parent
DOCS_SCHEMA = REPO / "docs" / "cache-schema.json"
EXAMPLE = REPO / "docs" / "examples" / "quickstart-report" / "cache.json"


def published() -> dict[str, Any]:
    return json.loads(DOCS_SCHEMA.read_text(encoding="utf-8"))


def validate(doc: Any) -> None:
    """jsonschema on the published file as it is ($refs and all): what someone else would run."""
    jsonschema.validate(doc, published(), cls=jsonschema.Draft202012Validator)


def load(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


@pytest.fixture
def seeded() -> ConfigCache:
    c = ConfigCache()
    for i in range(6):
        c.put(entry(i, t=1e-3 * (i + 1)))
    return c


def test_packaged_schema_is_the_published_one():
    packaged = (resources.files("tuner") / "data" / "cache-schema.json").read_bytes()
    assert packaged == DOCS_SCHEMA.read_bytes(), "docs/cache-schema.json must be a copy of tuner/data/"
    jsonschema.Draft202012Validator.check_schema(published())


def test_repository_example_validates():
    validate(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    assert len(load_cache(EXAMPLE)) > 0


def _varied_entries() -> list[CacheEntry]:
    """Every kind of key and config value a cache may hold (ints, floats, bools, null, strings)."""
    out = []
    values: list[Any] = [0, 1, -7, 2**53, 0.5, 1e-9, 1e15, True, False, None, "", "row", "a-b.c"]
    for i, v in enumerate(values):
        key = CacheKey.make("k.mod:fn", f"{i:016x}", {"M": i, "v": v}, ["float32"], "cpu", {"python": "3.11"})
        cfg = {"BLOCK": 64, "ratio": 0.25, "flag": True, "layout": "col"}
        if v is not None:
            cfg["v"] = v
        out.append(CacheEntry(key, cfg, 1e-6 * (i + 1), 0.0 if i % 2 else 1e-8, "2026-01-31T12:00:00Z", "fp"))
    return out


@pytest.mark.parametrize("name", ["c.json", "c.json.gz"])
def test_files_written_by_the_library_and_the_cli_validate(tmp_path: Path, seeded: ConfigCache, name: str):
    from tuner.runtime import write_cache_file

    lib = tmp_path / f"lib-{name}"
    write_cache_file(lib, _varied_entries())
    validate(load(lib))
    assert len(load_cache(lib)) == len(_varied_entries())

    cli = tmp_path / f"cli-{name}"
    assert main(["cache", "export", "--out", str(cli)]) == 0
    validate(load(cli))
    empty = tmp_path / f"empty-{name}"
    write_cache_file(empty, [])  # an empty file is still a valid one
    validate(load(empty))
    # ... but a CLI export with nothing to export is work that did not happen: exit 1, no file
    nothing = tmp_path / f"nothing-{name}"
    assert main(["cache", "export", "--out", str(nothing), "--kernel", "none"]) == 1
    assert not nothing.exists()


def test_gzip_export_is_deterministic_and_round_trips(tmp_path: Path, seeded: ConfigCache, capsys):
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    assert main(["cache", "export", "--out", str(a)]) == 0
    assert main(["cache", "export", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes() and a.read_bytes()[:2] == b"\x1f\x8b"
    capsys.readouterr()
    before = snapshot(seeded)
    assert main(["cache", "import", "--json", str(a)]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts == {"file": str(a), "entries": 6, "added": 0, "replaced": 0, "kept": 6}
    assert snapshot(seeded) == before


def test_study_export_validates(tmp_path: Path):
    from tests.test_studies import FAKE, write_study
    from tuner.studies import export_study, load_study, run_study

    spec = load_study(write_study(tmp_path, n_m=2, budget=4, extra=""), check_kernels=False)
    run_study(spec, executor=FAKE)
    out = tmp_path / "study.json"
    assert export_study(spec, out).entries == 2
    validate(load(out))


# What JSON Schema cannot say; the reader refuses these on its own (the schema's description lists them).
BEYOND_SCHEMA = {
    "binary_garbage",
    "deep_nesting",
    "duplicate_json_field",
    "duplicate_key",
    "empty",
    "impossible_date",
    "inf_time",
    "nan_time",
    "not_json",
    "truncated",
    "truncated_one_byte",
}


@pytest.mark.parametrize("name", sorted(set(BAD) - BEYOND_SCHEMA))
def test_schema_rejects_what_the_reader_rejects(name: str):
    doc = json.loads(BAD[name])
    if name == "wrong_schema_version":
        doc["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
    from tuner._schema import cache_schema_error

    assert cache_schema_error(doc) is not None  # tuner's own (faster, inlined) validator agrees


@pytest.fixture
def fresh_validator():
    """Drop tuner's cached validator before and after the test (it may swap the schema text)."""
    import tuner._schema as schema_mod

    schema_mod._validator.cache_clear()
    yield schema_mod
    schema_mod._validator.cache_clear()


def test_import_validates_through_the_schema(
    tmp_path: Path, seeded: ConfigCache, monkeypatch: pytest.MonkeyPatch, capsys, fresh_validator
):
    """Tighten the packaged schema (at most 2 entries): import must refuse a file the reader alone would
    accept, so the check really goes through the schema file."""
    from tuner.runtime import write_cache_file

    f = tmp_path / "three.json"
    write_cache_file(f, [entry(100), entry(101), entry(102)])
    tight = published()
    tight["properties"]["entries"]["maxItems"] = 2
    with monkeypatch.context() as m:
        m.setattr(fresh_validator, "_schema_text", lambda: json.dumps(tight))
        before = snapshot(seeded)
        assert main(["cache", "import", str(f)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tuner: error: ") and "entries" in err and "too long" in err, err
        assert snapshot(seeded) == before
    fresh_validator._validator.cache_clear()
    assert main(["cache", "import", str(f)]) == 0


def _write_gzip_of_spaces(path: Path, n: int) -> None:
    with gzip.open(path, "wb", compresslevel=9) as g:
        chunk = b" " * 2**20
        for _ in range(n // len(chunk)):
            g.write(chunk)


def test_gzip_bomb_is_refused_with_bounded_memory(tmp_path: Path, seeded: ConfigCache, capsys):
    bomb = tmp_path / "bomb.json.gz"
    _write_gzip_of_spaces(bomb, MAX_FILE_BYTES + 2**20)
    assert bomb.stat().st_size < MAX_FILE_BYTES // 100  # small on disk, over the limit once decompressed
    before = snapshot(seeded)
    assert main(["cache", "import", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert "decompresses to more than" in err and err.count("\n") == 1
    assert snapshot(seeded) == before


@pytest.mark.parametrize("cut", [10, -8])
def test_corrupt_gzip_is_bad_input(tmp_path: Path, seeded: ConfigCache, cut: int, capsys):
    from tuner.runtime import write_cache_file

    good = tmp_path / "good.json.gz"
    write_cache_file(good, [entry(0), entry(1)])
    data = good.read_bytes()
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(data[:cut])
    before = snapshot(seeded)
    assert main(["cache", "import", str(bad)]) == 2
    assert "gzip" in capsys.readouterr().err
    assert snapshot(seeded) == before
    with pytest.raises(CacheFileError):
        load_cache(bad)


def test_export_and_show_json(tmp_path: Path, seeded: ConfigCache, capsys):
    out = tmp_path / "c.json"
    assert main(["cache", "export", "--json", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(out), "entries": 6}
    assert main(["cache", "show", "--json", "--file", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == copy.deepcopy(load(out)["entries"])


def _odd_values() -> list[Any]:
    return [
        None, True, False, 0, -1, 7, 1.5, -0.0, 1e-300, 3600, 3600.5, 1e15, -1e15, 1e16, 2.0**53, 2.0**60,
        2**53, 2**53 + 1, -(2**60), float("nan"), float("inf"), float("-inf"), "", "x", "x" * 200, "x" * 201,
        "abc\n", "a\nb", "a\x00", "\x7f", "ab12cd34", "AB12CD34", "1bad", "ok_name.v:1-2",
        "2026-01-31T12:00:00Z", "2026-13-99T00:00:00Z", "2026-01-31T12:00:00Z\n", "٢٠٢٦-01-31T12:00:00Z",
        [], ["x"], [""], ["x"] * 33, [1], {}, {"a": 1}, {"1bad": 1}, {"a": None}, {"a": [1]}, {"a": "x"},
        {f"k{i}": 1 for i in range(33)}, {f"k{i}": 1 for i in range(65)}, {"": "x"}, {"a": "\x00"},
        json.loads("1e400"), json.loads("-1e400"), 10**400, -(10**400), 2**63, 2**64 + 0.5, 1.0, 2.0**53 + 2,
        5e-324, 3600.0000000000005, 1e15 + 0.5, 9007199254740992, 9007199254740993, -9007199254740993,
        "a$", "Z", "\n", "x\n\n",
    ]  # fmt: skip


def _entry_corpus() -> list[Any]:
    """Valid entries of every kind of value, and each field of one replaced by odd values, dropped, or
    joined by an unknown field; each key and config value too."""
    valid = [e.to_json() for e in _varied_entries()]
    base = valid[0]
    out: list[Any] = [*valid, None, [], "entry", 1, {}]
    for field in base:
        out.append({k: v for k, v in base.items() if k != field})
        for odd in _odd_values():
            out.append({**base, field: odd})
    out.append({**base, "extra": 1})
    for odd in _odd_values():
        out.append({**base, "key": {**base["key"], "M": odd}})
        out.append({**base, "config": {**base["config"], "BLOCK": odd}})
        out.append({**base, "versions": {"python": odd}})
        out.append({**base, "dtypes": ["float32", odd]})
        if isinstance(odd, str):
            out.append({**base, "key": {odd: 1}})
            out.append({**base, "versions": {odd: "3.11"}})
    for doc in BAD.values():
        with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):  # files that are not JSON
            out.extend(json.loads(doc)["entries"])
    return out


def _ends_a_string_in_newline(x: Any) -> bool:
    if isinstance(x, str):
        return x.endswith("\n")
    if isinstance(x, dict):
        return any(_ends_a_string_in_newline(k) or _ends_a_string_in_newline(v) for k, v in x.items())
    return isinstance(x, list) and any(_ends_a_string_in_newline(v) for v in x)


def test_compiled_entry_check_agrees_with_jsonschema(fresh_validator):
    """Entries are first checked by the entry schema compiled with fastjsonschema (jsonschema walked the
    schema for every entry: about 1 ms each). The compiled check must never pass an entry jsonschema fails
    (on the published file, $refs and all), for valid entries and every kind of invalid one: bools, NaN,
    infinities, huge ints and floats near each bound. Where it fails an entry jsonschema passes, jsonschema
    is asked, so tuner's answer is always jsonschema's; that happens only for a string ending in a newline
    (fastjsonschema reads a pattern's `$` as the end of the string, Python's re.search also before a final
    newline)."""
    check = fresh_validator._validator().entry_ok
    assert check is not None, "the shipped entry schema must compile (or every entry costs jsonschema's ms)"
    item = published()["$defs"]["entry"]
    ref = jsonschema.Draft202012Validator({**item, "$defs": published()["$defs"]})
    corpus = _entry_corpus()
    assert len(corpus) > 500
    looser = [x for x in corpus if check(x) and not ref.is_valid(x)]
    assert not looser, looser[:3]
    stricter = [x for x in corpus if not check(x) and ref.is_valid(x)]
    assert all(_ends_a_string_in_newline(x) for x in stricter), stricter[:3]
    assert sum(check(x) for x in corpus) >= len(_varied_entries())
    for x in corpus:  # what tuner answers, through both
        assert (fresh_validator.cache_entry_schema_error(x) is None) == ref.is_valid(x), x


def test_compiled_check_patterns_search_like_jsonschema():
    """jsonschema runs re.search(pattern, value): a pattern matches anywhere unless it is anchored. The
    compiled check must too, or a valid entry under an unanchored pattern would cost jsonschema's time."""
    from tuner._schema import _compiled_check

    for pattern, value in [("b", "abc"), ("^a", "abc"), ("c$", "abc"), ("^[0-9]+$", "٢٠٢٦"), ("b", "xyz")]:
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
        ok = _compiled_check(schema)
        assert ok is not None
        expected = jsonschema.Draft202012Validator(schema).is_valid({"s": value})
        assert ok({"s": value}) is expected, (pattern, value)
    assert _compiled_check({"pattern": "b$"})("ab\n") is False  # stricter: jsonschema is asked (see above)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "date-time"},  # fastjsonschema would assert formats, jsonschema does not
        {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/x"}]},
        {"properties": {"a": {"uniqueItems": True}}},
        {"type": "array", "prefixItems": [{"type": "string"}]},  # 2020-12 only: draft 7 ignores it
        {"type": "array", "items": [{"type": "string"}]},  # a list is another keyword in draft 7
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"type": "object", "unevaluatedProperties": False},
        {"const": 1},
        "not a schema",
    ],
)
def test_compiled_check_is_not_made_for_a_keyword_draft7_reads_otherwise(schema: Any):
    """fastjsonschema compiles draft 7 and ignores keywords it does not know: given a 2020-12 keyword it
    would pass what jsonschema fails. Such a schema is not compiled (every entry goes through jsonschema)."""
    from tuner._schema import _compiled_check

    assert _compiled_check(schema) is None
    ok = _compiled_check({"type": "object", "additionalProperties": False, "properties": {"a": {}}})
    assert ok is not None and ok({"a": [1]}) and not ok({"b": 1}) and not ok([])


def test_a_schema_fastjsonschema_cannot_compile_falls_back_to_jsonschema(
    monkeypatch: pytest.MonkeyPatch, fresh_validator, caplog
):
    """If fastjsonschema cannot compile the entry schema (or is missing), every entry is checked by
    jsonschema, with the same answers, and the reason is logged at debug level."""
    import fastjsonschema

    valid = _varied_entries()[0].to_json()
    bad = {**valid, "time_s": -1.0}

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise fastjsonschema.JsonSchemaDefinitionException("cannot compile")

    monkeypatch.setattr(fastjsonschema, "compile", refuse)
    with caplog.at_level("DEBUG", logger="tuner._schema"):
        assert fresh_validator._validator().entry_ok is None
    assert "not compiled by fastjsonschema" in caplog.text and "cannot compile" in caplog.text
    assert fresh_validator.cache_entry_schema_error(valid) is None
    got = fresh_validator.cache_entry_schema_error(bad, "entries[0]")
    assert got is not None and got.startswith("entries[0].time_s: -1.0 is less than or equal to"), got
    # a 2020-12 keyword in the shipped schema: not compiled, and jsonschema enforces it
    monkeypatch.undo()
    fresh_validator._validator.cache_clear()
    strict = published()
    strict["$defs"]["entry"]["dependentRequired"] = {"time_s": ["no_such_field"]}
    monkeypatch.setattr(fresh_validator, "_schema_text", lambda: json.dumps(strict))
    assert fresh_validator._validator().entry_ok is None
    assert "no_such_field" in (fresh_validator.cache_entry_schema_error(valid) or "")


def test_valid_entries_are_not_checked_by_jsonschema(tmp_path: Path, monkeypatch, fresh_validator):
    """Reading a file (`tuner cache import`, `load_cache`, $TUNER_CACHE_FILE) ran jsonschema's
    `best_match(iter_errors(entry))` on every entry, valid ones too: 1-2 ms an entry. Now jsonschema is
    asked only about an entry that fails, for its message, which is as before."""
    from tuner.runtime import write_cache_file
    from tuner.runtime._file import parse_cache_contents

    f = tmp_path / "c.json"
    write_cache_file(f, [entry(i) for i in range(40)])
    doc = json.loads(f.read_text(encoding="utf-8"))
    doc["entries"][17]["time_s"] = -1.0
    real = fresh_validator._validator()
    asked: list[Any] = []

    class Counting:
        def iter_errors(self, instance: Any) -> Any:
            asked.append(instance)
            return real.entry.iter_errors(instance)

        def is_valid(self, instance: Any) -> bool:
            asked.append(instance)
            return bool(real.entry.is_valid(instance))

    with monkeypatch.context() as m:
        m.setattr(fresh_validator, "_validator", lambda: real._replace(entry=Counting()))
        got = parse_cache_contents(json.dumps(doc).encode())
    assert len(got.entries) == 39 and [d.index for d in got.dropped] == [17]
    assert asked == [doc["entries"][17]]  # only the bad entry, once
    assert got.dropped[0].reason.startswith("entries[17].time_s: -1.0 is less than or equal to"), got.dropped
