"""The zero-shot predictor's memos (its pick per key, its fitted model per data state) are keyed on the
shipped files it learned from: `$TUNER_CACHE_FILE` pointed at another file, the file rewritten, or another
`set_global_cache` makes the next miss learn from the new entries; the same files keep the memo."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tuner.cost_models.zero_shot as zs

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, ReadOnlyCache, write_cache_file

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])
X = np.ones(2, np.float32)


def _make(name: str):
    @tuner.autotune(SPACE, key=["n"], mode="offline", storage=False, name=name)
    def scale(x, n, *, block):
        return x * 2.0

    return scale


def _winners(f, block: int) -> list[CacheEntry]:
    """Winners of other shapes, measured in float64 on this device: not the key's family (no nearest key),
    the same architecture, so the predictor takes their winner."""
    ck = f.tuner.full_key((X, 100), {})
    out = []
    for n in (64, 512, 4096):
        key = CacheKey.make(ck.kernel, ck.source_hash, {"n": n}, ["float64"], ck.device, ck.versions_dict)
        out.append(CacheEntry(key, {"block": block}, 1e-5, 0.0))
    return out


def _pick(f) -> dict:
    f.cache_clear()  # forget the in-memory config: the call goes down the miss path again
    f(X, 100)
    assert "zero-shot prediction" in f.tuner.last_choice["why"], f.tuner.last_choice
    return f.tuner.last_choice["config"]


@pytest.fixture
def fits(monkeypatch):
    monkeypatch.setenv("TUNER_PREDICT", "1")
    calls = []
    real = zs.fit_zero_shot

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(zs, "fit_zero_shot", counting)
    return calls


def test_a_new_tuner_cache_file_is_learned_from(tmp_path, monkeypatch, fits):
    f = _make("memo_new_file")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_cache_file(a, _winners(f, 32))
    write_cache_file(b, _winners(f, 128))  # as many entries as a: the same counts, other data
    monkeypatch.setenv("TUNER_CACHE_FILE", str(a))
    assert _pick(f) == {"block": 32}
    assert _pick(f) == {"block": 32} and len(fits) == 1  # the same file: the memo, no refit
    monkeypatch.setenv("TUNER_CACHE_FILE", str(b))
    assert _pick(_make("memo_new_file")) == {"block": 128}  # a function made for the new file
    assert _pick(f) == {"block": 128}
    assert len(fits) == 2
    monkeypatch.setenv("TUNER_CACHE_FILE", str(a))  # back to a: its memo is still good
    assert _pick(f) == {"block": 32} and len(fits) == 2


def test_the_tuner_cache_file_rewritten_in_place_is_learned_from(tmp_path, monkeypatch, fits):
    f = _make("memo_rewritten")
    path = tmp_path / "tuned.json"
    write_cache_file(path, _winners(f, 64))
    monkeypatch.setenv("TUNER_CACHE_FILE", str(path))
    assert _pick(f) == {"block": 64}
    before = path.stat()
    write_cache_file(path, _winners(f, 16))  # a new export renamed over the old file
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # later, whatever the clock's grain
    assert _pick(f) == {"block": 16}
    assert len(fits) == 2


def test_another_global_cache_is_learned_from(monkeypatch, fits):
    f = _make("memo_global")
    monkeypatch.setattr("tuner.runtime._sources._global_cache", None)  # put back after the test
    tuner.runtime.set_global_cache(ReadOnlyCache(_winners(f, 256)))
    assert _pick(f) == {"block": 256}
    tuner.runtime.set_global_cache(ReadOnlyCache(_winners(f, 32)))
    assert _pick(f) == {"block": 32}
