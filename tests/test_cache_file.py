"""Cache files: export -> import round trip, merge rules, `tuner cache show`, and bad input (hand-written
cases and hypothesis-generated ones): exit code 2, a one-line reason, the cache unchanged."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import main
from tuner.runtime import (
    MAX_FILE_BYTES,
    CacheEntry,
    CacheFileError,
    CacheKey,
    ConfigCache,
    dumps_entries,
    load_cache,
    read_cache_file,
)
from tuner.runtime._file import parse_cache_bytes


def entry(i: int, t: float = 1e-3, cfg: dict | None = None, kernel: str = "matmul") -> CacheEntry:
    key = CacheKey.make(
        kernel,
        "0123456789abcdef" * 2,
        {"M": 64 << (i % 5), "N": 128 + i, "causal": i % 2 == 0},
        ["float16", "float16"],
        "NVIDIA H100 (sm90)",
        {"triton": "3.7.1", "torch": "2.13.0"},
    )
    return CacheEntry(
        key,
        cfg or {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "swizzle": "row"},
        t,
        t / 20,
        "2026-11-29T12:00:00Z",
        "fp1234",
    )


@pytest.fixture
def seeded() -> ConfigCache:
    c = ConfigCache()
    for i in range(12):
        c.put(entry(i, t=1e-3 * (i + 1)))
    return c


def snapshot(c: ConfigCache) -> str:
    return dumps_entries(c.entries())


def test_export_import_round_trip_is_identical(seeded: ConfigCache, tmp_path: Path, capsys, monkeypatch):
    a = tmp_path / "a.json"
    assert main(["cache", "export", "--out", str(a)]) == 0
    assert "exported 12 entries" in capsys.readouterr().out
    doc = json.loads(a.read_text(encoding="utf-8"))
    assert doc["schema_version"] == 1 and doc["format"] == "tuner-cache" and len(doc["entries"]) == 12
    assert set(doc["entries"][0]) == {
        "kernel",
        "source_hash",
        "key",
        "dtypes",
        "device",
        "versions",
        "config",
        "time_s",
        "spread_s",
        "date",
        "space",
    }
    # into an empty store, and out again: byte-identical
    other = tmp_path / "other_home"
    other.mkdir()
    monkeypatch.setenv("TUNER_HOME", str(other))
    assert main(["cache", "import", str(a)]) == 0
    assert "added 12, replaced 0, kept existing 0" in capsys.readouterr().out
    b = tmp_path / "b.json"
    assert main(["cache", "export", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    # deterministic: exporting again gives the same bytes; no temp files are left behind
    assert main(["cache", "export", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["a.json", "b.json"]
    # load_cache reads the same entries without a database
    assert [e.to_json() for e in load_cache(a)] == [e.to_json() for e in ConfigCache().entries()]


def test_merge_faster_wins_unless_prefer_import(seeded: ConfigCache, tmp_path: Path, capsys):
    f = tmp_path / "in.json"
    slower = entry(0, t=5e-3, cfg={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "swizzle": "col"})
    faster = entry(1, t=1e-4, cfg={"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 2, "swizzle": "col"})
    new = entry(100)
    f.write_text(dumps_entries([slower, faster, new]), encoding="utf-8")
    assert main(["cache", "import", str(f)]) == 0
    assert "3 entries; added 1, replaced 1, kept existing 1" in capsys.readouterr().out
    assert seeded.get(slower.key).time_s == 1e-3  # kept the faster existing one
    assert seeded.get(faster.key).config["BLOCK_M"] == 32
    assert main(["cache", "import", "--prefer-import", str(f)]) == 0
    assert "added 0, replaced 3, kept existing 0" in capsys.readouterr().out
    assert seeded.get(slower.key).config["BLOCK_M"] == 16


def test_show_lists_entries(seeded: ConfigCache, capsys):
    assert main(["cache", "show"]) == 0
    out = capsys.readouterr().out
    assert "12 entries" in out and "matmul [M=64, N=128, causal=True]" in out
    assert main(["cache", "show", "--json", "--kernel", "nope"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_show_prints_times_in_a_unit_that_suits_them(capsys):
    """Every time was printed in microseconds: a 0.08 s entry (a CPU interpreter's) as `8.05e+04 us`."""
    c = ConfigCache()
    for i, t in enumerate((0.0805, 2.5, 3.2e-6)):
        c.put(entry(i, t=t, kernel=f"k{i}"))
    assert main(["cache", "show"]) == 0
    out = capsys.readouterr().out
    assert (
        "80.5 ms (spread 4 ms)" in out and "2.5 s (spread 0.12 s)" in out and "3.2 us (spread 0.16 us)" in out
    ), out
    assert "e+" not in out


def test_a_kernel_name_that_selects_nothing_names_the_kernels_there(tmp_path: Path, capsys):
    """A decorated function is stored as module.qualname: `--kernel scale` selects none of
    `mypkg.ops.scale`'s entries. `show`, `export` and `prune` used to say only "no cached entries" /
    "nothing to prune" (exit 0, as for a kernel never tuned); they now name the kernels held, the
    ones like the name first (on stderr, so `--json` stays one document), and change nothing."""
    c = ConfigCache()
    for i in range(3):
        c.put(entry(i, kernel="mypkg.ops.scale"))
    before = snapshot(c)
    assert main(["cache", "show", "--kernel", "scale"]) == 0
    got = capsys.readouterr()
    assert "no cached entries" in got.out
    assert "no entry of kernel 'scale'; did you mean mypkg.ops.scale?" in got.err
    assert main(["cache", "show", "--kernel", "other", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out) == [] and "it holds mypkg.ops.scale" in got.err
    out = tmp_path / "o.json"
    assert main(["cache", "export", "--kernel", "scale", "--out", str(out)]) == 1
    assert "did you mean mypkg.ops.scale?" in capsys.readouterr().err and not out.exists()
    assert main(["cache", "prune", "--kernel", "scale"]) == 0
    got = capsys.readouterr()
    assert "nothing to prune" in got.out and "did you mean mypkg.ops.scale?" in got.err
    assert snapshot(c) == before
    f = tmp_path / "shipped.json"
    f.write_text(dumps_entries(c.entries()), encoding="utf-8")
    assert main(["cache", "show", "--file", str(f), "--kernel", "scale"]) == 0
    assert f"{f} holds no entry of kernel 'scale'; did you mean mypkg.ops.scale?" in capsys.readouterr().err
    # the full name selects them, with no warning
    assert main(["cache", "show", "--kernel", "mypkg.ops.scale"]) == 0
    got = capsys.readouterr()
    assert "3 entries" in got.out and got.err == ""


def test_show_and_export_of_a_store_not_made_yet_make_none(tmp_path: Path, monkeypatch, capsys):
    """`cache show` and `cache export` only read: on a fresh TUNER_HOME (or a --storage file that does not
    exist) they find no entries and leave no database behind."""
    home = tmp_path / "fresh"
    home.mkdir()
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    assert main(["cache", "show"]) == 0
    assert "no cached entries" in capsys.readouterr().out
    assert main(["cache", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["cache", "export", "--out", str(tmp_path / "out.json")]) == 1
    elsewhere = tmp_path / "nowhere.db"
    assert main(["cache", "show", "--storage", f"sqlite:///{elsewhere}"]) == 0
    assert list(home.iterdir()) == [] and not elsewhere.exists() and not (tmp_path / "out.json").exists()
    # nor the TUNER_HOME folder itself, where it does not exist yet (it was made, empty)
    monkeypatch.setenv("TUNER_HOME", str(home / "not" / "yet"))
    assert main(["cache", "show"]) == 0
    assert main(["cache", "export", "--out", str(tmp_path / "out.json")]) == 1
    assert list(home.iterdir()) == []


def _valid_doc() -> dict:
    return json.loads(dumps_entries([entry(0), entry(1)]))


def _bad_cases() -> dict[str, bytes]:
    good = dumps_entries([entry(0), entry(1), entry(2)]).encode()
    cases: dict[str, bytes] = {
        "truncated": good[: len(good) // 2],
        "truncated_one_byte": good[:-3],
        "not_json": b"this is not json\n",
        "empty": b"",
        "binary_garbage": bytes(range(256)) * 40,
        "top_level_list": b"[]",
        "deep_nesting": b"[" * 100_000 + b"]" * 100_000,
    }

    def mutate(name, fn):
        d = _valid_doc()
        fn(d)
        cases[name] = json.dumps(d).encode()

    mutate("wrong_schema_version", lambda d: d.update(schema_version=2))
    mutate("schema_version_string", lambda d: d.update(schema_version="1"))
    mutate("wrong_format", lambda d: d.update(format="kernel-tuner"))
    mutate("entries_not_list", lambda d: d.update(entries={"a": 1}))
    mutate("unknown_top_field", lambda d: d.update(extra=1))
    mutate("time_negative", lambda d: d["entries"][1].update(time_s=-1e-3))
    mutate("time_zero", lambda d: d["entries"][1].update(time_s=0))
    mutate("time_huge", lambda d: d["entries"][1].update(time_s=1e300))
    mutate("time_string", lambda d: d["entries"][0].update(time_s="fast"))
    mutate("time_bool", lambda d: d["entries"][0].update(time_s=True))
    mutate("spread_negative", lambda d: d["entries"][0].update(spread_s=-1.0))
    mutate("config_empty", lambda d: d["entries"][0].update(config={}))
    mutate("config_nested", lambda d: d["entries"][0]["config"].update(BLOCK_M=[64]))
    mutate("config_huge_int", lambda d: d["entries"][0]["config"].update(BLOCK_M=10**30))
    mutate("config_null", lambda d: d["entries"][0]["config"].update(BLOCK_M=None))
    mutate("key_not_object", lambda d: d["entries"][0].update(key=[64, 128]))
    mutate("dtypes_not_list", lambda d: d["entries"][0].update(dtypes="float16"))
    mutate("device_empty", lambda d: d["entries"][0].update(device=""))
    mutate("device_long", lambda d: d["entries"][0].update(device="x" * 10_000))
    mutate("versions_number", lambda d: d["entries"][0]["versions"].update(triton=3.7))
    mutate("bad_date", lambda d: d["entries"][0].update(date="yesterday"))
    mutate("impossible_date", lambda d: d["entries"][0].update(date="2026-02-31T00:00:00Z"))
    mutate("source_hash_not_hex", lambda d: d["entries"][0].update(source_hash="zz" * 16))
    mutate("missing_field", lambda d: d["entries"][0].pop("config"))
    mutate("extra_field", lambda d: d["entries"][0].update(note="hi"))
    mutate("duplicate_key", lambda d: d["entries"].append(copy.deepcopy(d["entries"][0])))
    mutate("entry_not_object", lambda d: d["entries"].append(42))
    # invalid JSON constants and duplicate object keys cannot be made with json.dumps(dict)
    text = good.decode()
    cases["nan_time"] = text.replace('"time_s": 0.001', '"time_s": NaN', 1).encode()
    cases["inf_time"] = text.replace('"time_s": 0.001', '"time_s": Infinity', 1).encode()
    cases["duplicate_json_field"] = text.replace(
        '"time_s": 0.001', '"time_s": 0.001, "time_s": 0.002', 1
    ).encode()
    for k in ("nan_time", "inf_time", "duplicate_json_field"):
        assert cases[k] != good
    return cases


BAD = _bad_cases()
# the cases where the file can be read and one entry fails validation: the runtime drops that entry only
ONE_BAD_ENTRY = {
    name
    for name in BAD
    if name.startswith(("time_", "spread_", "config_", "key_", "dtypes_", "device_", "versions_"))
    or name
    in {
        "bad_date",
        "impossible_date",
        "source_hash_not_hex",
        "missing_field",
        "extra_field",
        "duplicate_key",
        "entry_not_object",
        "nan_time",
        "inf_time",
    }
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_exits_2_and_changes_nothing(name: str, seeded: ConfigCache, tmp_path: Path, capsys):
    before = snapshot(seeded)
    f = tmp_path / f"{name}.json"
    f.write_bytes(BAD[name])
    assert main(["cache", "import", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: ") and err.count("\n") == 1, err
    assert str(f) in err, err  # which file, when an import names several in a script
    assert len(err) < 400
    assert snapshot(seeded) == before
    with pytest.raises(CacheFileError):
        load_cache(f, strict=True)
    if name not in ONE_BAD_ENTRY:  # the file cannot be read at all: skipped everywhere
        with pytest.raises(CacheFileError):
            load_cache(f)
        assert main(["cache", "import", "--skip-invalid", str(f)]) == 2
        assert snapshot(seeded) == before
        return
    good = {e.key.hash for e in (entry(0), entry(1), entry(2))}
    cache = load_cache(f)  # the rest of the file is used, the bad entry named in .dropped
    assert len(cache.dropped) == 1 and len(cache) >= 1 and {e.key.hash for e in cache} <= good
    assert "--skip-invalid" in err
    assert main(["cache", "import", "--skip-invalid", str(f)]) == 0
    warned = capsys.readouterr().err
    assert warned.startswith("tuner: warning: ") and "1 of " in warned and "entries[" in warned, warned


def test_hundred_megabytes_of_garbage_is_refused_by_size(seeded: ConfigCache, tmp_path: Path, capsys):
    before = snapshot(seeded)
    f = tmp_path / "garbage.json"
    with open(f, "wb") as fh:  # sparse: 100 MB without writing 100 MB
        fh.write(os.urandom(4096))
        fh.truncate(100 * 2**20)
    assert main(["cache", "import", str(f)]) == 2
    assert "byte limit" in capsys.readouterr().err
    assert snapshot(seeded) == before
    assert MAX_FILE_BYTES < 100 * 2**20


def test_missing_file_and_directory_are_bad_input(seeded: ConfigCache, tmp_path: Path, capsys):
    assert main(["cache", "import", str(tmp_path / "nope.json")]) == 2
    assert main(["cache", "import", str(tmp_path)]) == 2
    assert main(["cache", "export", "--out", str(tmp_path / "no" / "such" / "dir.json")]) == 2


def test_a_bad_entry_late_in_the_file_writes_nothing(seeded: ConfigCache, tmp_path: Path):
    before = snapshot(seeded)
    rows = [entry(100 + i) for i in range(50)]
    doc = json.loads(dumps_entries(rows))
    doc["entries"][-1]["time_s"] = -1
    f = tmp_path / "late.json"
    f.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["cache", "import", str(f)]) == 2
    assert snapshot(seeded) == before


# ---- hypothesis ----------------------------------------------------------------------------------------
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
json_any = st.recursive(
    json_leaf,
    lambda ch: st.one_of(st.lists(ch, max_size=4), st.dictionaries(st.text(max_size=8), ch, max_size=4)),
    max_leaves=20,
)
FIELDS = [
    "kernel",
    "source_hash",
    "key",
    "dtypes",
    "device",
    "versions",
    "config",
    "time_s",
    "spread_s",
    "date",
    "space",
]


def _import_bytes(data: bytes, cache: ConfigCache) -> bool:
    """Parse + merge as the CLI does; True if accepted."""
    try:
        rows = parse_cache_bytes(data)
    except CacheFileError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg
        return False
    cache.merge(rows)
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=json_any, idx=st.integers(0, 2))
def test_hypothesis_one_field_replaced(field, value, idx, seeded: ConfigCache):
    doc = json.loads(dumps_entries([entry(0), entry(1), entry(2)]))
    doc["entries"][idx][field] = value
    data = json.dumps(doc, allow_nan=True).encode()
    before = snapshot(seeded)
    try:
        ok_value = _import_bytes(data, seeded)
    except Exception as exc:  # anything but a clean refusal is a bug
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
    if not ok_value:
        assert snapshot(seeded) == before
    else:
        # an accepted file holds only sane values
        got = [e for e in seeded.entries()]
        for e in got:
            assert math.isfinite(e.time_s) and 0 < e.time_s <= 3600 and 0 <= e.spread_s <= 3600


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        st.binary(max_size=2000),
        json_any.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.builds(lambda cut: dumps_entries([entry(0), entry(1)]).encode()[:cut], st.integers(0, 2000)),
    )
)
def test_hypothesis_arbitrary_bytes_never_crash_or_write(data, seeded: ConfigCache):
    before = snapshot(seeded)
    accepted = _import_bytes(data, seeded)
    if not accepted:
        assert snapshot(seeded) == before


def test_read_cache_file_accepts_its_own_output(tmp_path: Path):
    f = tmp_path / "c.json"
    f.write_text(dumps_entries([entry(i) for i in range(5)]), encoding="utf-8")
    assert len(read_cache_file(f)) == 5


def test_json_schema_matches_the_validator():
    from tuner.runtime import LIMITS, SCHEMA_VERSION
    from tuner.runtime._entry import ENTRY_FIELDS
    from tuner.runtime._file import MAX_ENTRIES

    schema = json.loads(
        (Path(__file__).resolve().parent.parent / "docs" / "cache-schema.json").read_text(encoding="utf-8")
    )
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert schema["properties"]["entries"]["maxItems"] == MAX_ENTRIES
    e = schema["$defs"]["entry"]
    assert e["required"] == list(ENTRY_FIELDS) and set(e["properties"]) == set(ENTRY_FIELDS)
    assert schema["$defs"]["seconds"]["maximum"] == LIMITS["max_time_s"]
    assert e["properties"]["key"]["maxProperties"] == LIMITS["max_fields"]
    assert e["properties"]["config"]["maxProperties"] == LIMITS["max_config_params"]
    assert e["properties"]["versions"]["maxProperties"] == LIMITS["max_versions"]
    assert e["properties"]["dtypes"]["maxItems"] == LIMITS["max_dtypes"]
    assert schema["$defs"]["text"]["maxLength"] == LIMITS["max_str"]
    ints = schema["$defs"]["scalar"]["anyOf"][2]
    assert ints["maximum"] == LIMITS["max_abs_int"]


def test_failed_export_leaves_the_old_file_intact(tmp_path: Path):
    from tuner.runtime import write_cache_file

    f = tmp_path / "c.json"
    write_cache_file(f, [entry(0)])
    old = f.read_bytes()
    bad = CacheEntry(entry(1).key, {"x": 1}, float("nan"), 0.0, "2026-11-29T12:00:00Z")
    with pytest.raises(ValueError):
        write_cache_file(f, [entry(0), bad])
    assert f.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["c.json"]
