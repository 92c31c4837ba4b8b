"""A `TUNER_CACHE_FILE` replaced while a service runs (docs/production.md, "A cache file from another
machine"): a miss being resolved sees one version of the file from its lookup to its fallback, the next
miss sees the new one, and each version that cannot be read is warned about."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.test_runtime_decorator import make
from tuner.runtime import ConfigCache, _resolve, write_cache_file


def test_a_file_replaced_during_a_miss_is_used_from_the_next_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _tuner_home: Path
) -> None:
    tuned, _ = make()
    tuned(None, 128)
    tuned(None, 8192)
    entries = ConfigCache().entries()
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_cache_file(old, [e for e in entries if e.key.fields_dict == {"n": 8192}])
    write_cache_file(new, entries)  # the next export: it also holds n=128
    shipped = tmp_path / "tuned.json"
    os.replace(old, shipped)
    monkeypatch.setenv("TUNER_CACHE_FILE", str(shipped))

    def export_lands(req: _resolve.Request) -> str:  # between the file lookup and the miss's reason
        if new.exists():
            os.replace(new, shipped)
        return "the new export was renamed over the shipped file"

    lookups = _resolve.LOOKUPS
    monkeypatch.setattr(_resolve, "LOOKUPS", (*lookups[:2], export_lands, *lookups[2:]))
    prod, bench = make(mode="offline", storage=False)
    prod(None, 128)
    why, reason = prod.tuner.last_choice["why"], prod.tuner.last_miss_reason
    # this miss read the old file throughout: no entry for n=128, the nearest is n=8192
    assert "not in the current search space" not in reason, reason
    assert reason.startswith("no entry for key {'n': 128}"), reason
    assert why.startswith("offline: nearest cached key {'n': 8192}"), why
    assert not new.exists()
    monkeypatch.setattr(_resolve, "LOOKUPS", lookups)
    prod.cache_clear()
    prod(None, 128)  # the next miss reads the new file: an exact hit
    assert prod.tuner.last_choice["why"] == f"exact entry in {shipped}", prod.tuner.last_choice
    assert bench.calls == 0


def test_each_broken_version_of_the_file_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, _tuner_home: Path
) -> None:
    tuned, _ = make()
    tuned(None, 128)
    good = tmp_path / "good.json"
    write_cache_file(good, ConfigCache().entries())
    shipped = tmp_path / "tuned.json"
    monkeypatch.setenv("TUNER_CACHE_FILE", str(shipped))
    prod, _ = make(mode="offline", storage=False)
    caplog.set_level(logging.WARNING, logger="tuner.runtime._sources")
    n = iter(range(1000, 2000))

    def ship(data: bytes | None) -> list[str]:
        """Rename `data` over the shipped file (None: delete it), make a miss twice, and return the file
        warnings it logged."""
        caplog.clear()
        if data is None:
            shipped.unlink(missing_ok=True)
        else:
            tmp = tmp_path / "next.json"
            tmp.write_bytes(data)
            os.replace(tmp, shipped)
        prod(None, next(n))
        prod(None, next(n))
        return [r.getMessage() for r in caplog.records if "TUNER_CACHE_FILE is not usable" in r.getMessage()]

    # the service starts before the first export is there
    assert [m.endswith("No such file or directory") for m in ship(None)] == [True]
    assert ship(good.read_bytes()) == []
    assert prod.tuner.last_choice["why"].startswith("offline: nearest cached key {'n': 128}")
    # a broken deploy later: the file is skipped, and the log says so (it said nothing before)
    assert ["not valid JSON" in m for m in ship(good.read_bytes()[:100])] == [True]
    assert prod.tuner.last_choice["why"].startswith("offline: space default"), prod.tuner.last_choice
    assert ship(good.read_bytes()) == []
    assert ["not valid JSON" in m for m in ship(good.read_bytes()[:60])] == [True]
