"""A shipped cache file with a few bad entries among many good ones: the runtime drops only the bad entries,
says so in one warning (how many, of how many, the first few with why and their keys), and uses every
good entry; a file that cannot be read at all is still skipped whole. The CLI readers are strict unless
told `--skip-invalid` (docs/production.md, "A cache file from another machine")."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.cli import main
from tuner.runtime import CacheEntry, CacheFileError, CacheKey, ConfigCache, dumps_entries, load_cache
from tuner.runtime._sources import set_global_cache

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])
FILE_LOGGER = "tuner.runtime._sources"
GOOD = 200


def _make(name: str, cache=None):
    @tuner.autotune(SPACE, key=["n"], mode="offline", storage=False, cache=cache, name=name)
    def scale(x, n, *, block):
        return x * 2.0

    return scale


def _entry(f, n: int, config: dict) -> CacheEntry:
    ck = f.tuner.full_key((np.ones(2, np.float32), n), {})
    key = CacheKey.make(ck.kernel, ck.source_hash, {"n": n}, ck.dtypes, ck.device, ck.versions_dict)
    return CacheEntry(key, config, 1e-5, 0.0)


def _config_for(n: int) -> dict:
    return {"block": 16 << (n % 5)}


def _write_with_bad_entries(path, f) -> None:
    """GOOD valid entries (n = 1..GOOD), then four that fail validation on their own, and two valid ones
    the runtime cannot use for this function (a config outside the space, another kernel's)."""
    doc = json.loads(dumps_entries([_entry(f, n, _config_for(n)) for n in range(1, GOOD + 1)]))
    bad = [json.loads(json.dumps(doc["entries"][0])) for _ in range(4)]
    for i, e in enumerate(bad):
        e["key"] = {"n": 10_000 + i}
    bad[0]["time_s"] = float("nan")  # a NaN time
    bad[1]["config"] = {"block": [64]}  # a wrong type (the schema's entry definition)
    bad[2]["date"] = "yesterday"
    bad[3]["spread_s"] = -1.0
    out_of_space = json.loads(json.dumps(doc["entries"][1]))
    out_of_space.update(key={"n": 20_000}, config={"block": 512})
    other_kernel = json.loads(json.dumps(doc["entries"][2]))
    other_kernel.update(kernel="no_such_kernel")
    doc["entries"] += [*bad, out_of_space, other_kernel]
    path.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")


def _dropped_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == FILE_LOGGER and r.levelno >= logging.WARNING and "fail validation" in r.getMessage()
    ]


@pytest.mark.parametrize("how", ["cache=PATH", "TUNER_CACHE_FILE", "set_global_cache"])
def test_one_bad_entry_drops_only_itself_and_says_so_once(tmp_path, monkeypatch, caplog, how: str):
    monkeypatch.setenv("TUNER_PREDICT", "0")
    name = f"bad_entries_{how.split('=')[0].lower()}"
    path = tmp_path / "tuned.json"
    _write_with_bad_entries(path, _make(name))
    caplog.set_level(logging.WARNING)
    if how == "cache=PATH":
        f = _make(name, cache=str(path))
    elif how == "TUNER_CACHE_FILE":
        monkeypatch.setenv("TUNER_CACHE_FILE", str(path))
        f = _make(name)
    else:
        monkeypatch.setattr("tuner.runtime._sources._global_cache", None)  # put back after the test
        set_global_cache(path)
        f = _make(name)
    x = np.ones(2, np.float32)
    for n in (1, 7, 123, GOOD):  # good entries hit exactly, whatever else the file holds
        assert f(x, n).tolist() == [2.0, 2.0]
        assert f.tuner.last_choice["config"] == _config_for(n), f.tuner.last_choice
    assert f.tuner.stats["from_file"] == 4
    # the valid entry whose config the space no longer has: that key alone falls to the offline tail
    f(x, 20_000)
    assert f.tuner.last_choice["why"].startswith("offline: nearest cached key {'n': 200}")
    assert "cached config {'block': 512} is not in the current search space" in f.tuner.last_miss_reason
    [msg] = _dropped_warnings(caplog)  # one warning for the file, naming the count and the first keys
    assert f"4 of {GOOD + 6} entries fail validation" in msg and f"the other {GOOD + 2} entries" in msg
    assert f"entries[{GOOD}].time_s=nan is not finite" in msg and '{"n": 10000}' in msg
    assert f"entries[{GOOD + 1}].config.block" in msg and '{"n": 10001}' in msg
    assert "and 1 more" in msg


def test_load_cache_keeps_what_it_dropped_and_strict_refuses(tmp_path, caplog):
    path = tmp_path / "tuned.json"
    _write_with_bad_entries(path, _make("bad_entries_load"))
    caplog.set_level(logging.WARNING)
    cache = load_cache(path)
    assert len(cache) == GOOD + 2
    assert [d.index for d in cache.dropped] == [GOOD, GOOD + 1, GOOD + 2, GOOD + 3]
    assert [d.key for d in cache.dropped] == [f'{{"n": {10_000 + i}}}' for i in range(4)]
    assert all(d.kernel == "bad_entries_load" for d in cache.dropped)
    load_cache(path)  # the same file again: no second warning
    assert len(_dropped_warnings(caplog)) == 1
    with pytest.raises(CacheFileError, match=f"4 of {GOOD + 6} entries fail validation"):
        load_cache(path, strict=True)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"format": "tuner-cache", "schema_version": 2, "entries": []}),
        json.dumps({"format": "tuner-cache", "schema_version": 1, "entries": {}}),
    ],
)
def test_a_file_that_cannot_be_read_is_still_skipped_whole(tmp_path, monkeypatch, caplog, text: str):
    monkeypatch.setenv("TUNER_PREDICT", "0")
    path = tmp_path / "tuned.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CacheFileError):
        load_cache(path)
    caplog.set_level(logging.WARNING)
    f = _make("bad_file", cache=str(path))
    assert f.tuner.cache is None
    f(np.ones(2, np.float32), 3)
    assert f.tuner.last_choice["config"] == SPACE.default()
    assert any("cache file skipped" in r.getMessage() for r in caplog.records)


def test_cli_import_is_strict_unless_skip_invalid(tmp_path, capsys):
    path = tmp_path / "tuned.json"
    _write_with_bad_entries(path, _make("bad_entries_cli"))
    store = ConfigCache()
    assert main(["cache", "import", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"4 of {GOOD + 6} entries fail validation" in err
    assert "--skip-invalid" in err and store.entries() == []
    assert main(["cache", "show", "--file", str(path)]) == 2
    capsys.readouterr()

    assert main(["cache", "show", "--json", "--skip-invalid", "--file", str(path)]) == 0
    got = capsys.readouterr()
    assert len(json.loads(got.out)) == GOOD + 2
    assert got.err.startswith("tuner: warning: ") and "4 of " in got.err

    assert main(["cache", "import", "--json", "--skip-invalid", str(path)]) == 0
    got = capsys.readouterr()
    counts = json.loads(got.out)
    assert (counts["entries"], counts["added"], counts["dropped"]) == (GOOD + 2, GOOD + 2, 4)
    assert "4 of " in got.err and len(store.entries()) == GOOD + 2


def test_cli_skip_invalid_with_nothing_valid_is_bad_input(tmp_path, capsys):
    f = _make("bad_entries_none")
    doc = json.loads(dumps_entries([_entry(f, 1, {"block": 16})]))
    doc["entries"][0]["time_s"] = -1
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["cache", "import", "--skip-invalid", str(path)]) == 2
    assert "no valid entry" in capsys.readouterr().err
    assert ConfigCache().entries() == []
