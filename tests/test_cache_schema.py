"""The published cache-file JSON Schema: it is the file shipped in the package, it validates every file
tuner writes (checked here with the `jsonschema` library straight on the published file, not through tuner),
it rejects what the reader rejects, `tuner cache import` goes through it, and .gz files are read with a bound
on their decompressed size."""

from __future__ import annotations

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
