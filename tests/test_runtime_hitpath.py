"""The shared hit path and the resolution chain's extension points: Triton launches through kernel[grid]
with many grids (the launcher kept per grid), calls of every arity and form reaching one entry, and a
mode registered from outside the runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import ConfigCache, _launcher, _resolve

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])


def test_triton_launch_with_many_grids_tunes_once_and_launches_each_grid():
    import torch
    import triton
    import triton.language as tl

    @tuner.autotune(
        configs=[triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32)],
        key=["n"],
        budget=2,
        restore=["x_ptr"],
        storage=False,
    )
    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    x = torch.zeros(64)
    add_one[(4,)](x, 64)  # tunes; the config's BLOCK decides how much of x four programs cover
    block = add_one.tuner.last_choice["config"]["BLOCK"]
    covered = min(64, 4 * block)
    expect = torch.zeros(64)
    expect[:covered] += 1
    assert torch.equal(x, expect)
    # a grid made afresh on every launch, a tuple grid, and more grids than the launcher keeps
    for i in range(_launcher._MAX_GRIDS + 5):
        add_one[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, 64)
        expect += 1
        add_one[(64 // block,)](x, 64)
        expect += 1
        if i < 3:
            add_one.run(x, 64, grid=(64 // block,))
            expect += 1
    assert torch.equal(x, expect)
    assert add_one.tuner.stats["tuned"] == 1
    assert len(add_one._by_grid) <= _launcher._MAX_GRIDS


def test_positional_keyword_and_default_forms_share_one_entry():
    calls = []

    def bench(call):
        calls.append(1)
        call()
        return 1e-3

    @tuner.autotune(SPACE, key=["n", "m"], budget=2, bench=bench, storage=False)
    def f(x, n, m=8, *, block):
        return x + n + m

    assert f(1, 2) == 11 and len(calls) == 2  # tunes (two configs)
    assert f(1, 2, 8) == 11 and f(x=1, n=2) == 11 and f(1, n=2, m=8) == 11
    assert len(calls) == 2 and f.tuner.stats["tuned"] == 1
    assert f(1, 2, 9) == 12 and len(calls) == 4  # another key
    with pytest.raises(TypeError, match="missing key argument 'n'"):
        f(1)


def test_unhashable_key_value_takes_the_general_path():
    @tuner.autotune(
        SPACE, key=lambda x, opts: {"k": len(opts)}, budget=1, bench=lambda c: 1e-3, storage=False
    )
    def f(x, opts, *, block):
        return x * len(opts)

    assert f(2, [1, 2]) == 4 and f(2, [3, 4]) == 4 and f(3, opts=[1, 2, 3]) == 9
    assert f.tuner.stats["tuned"] == 2


def test_registered_mode_runs_its_tail(monkeypatch, _tuner_home: Path):
    monkeypatch.setattr(_resolve, "_MODES", dict(_resolve._MODES))
    seen = []

    def note_miss(req):  # a recorder of misses, as a record mode would add
        seen.append((req.key.fields_dict, req.t.last_miss_reason))
        return "noted"

    _resolve.register_mode("noting", (note_miss, *_resolve.OFFLINE))
    bench_calls = []

    @tuner.autotune(SPACE, key=["n"], mode="noting", bench=lambda c: bench_calls.append(1) or 1e-3)
    def f(x, n, *, block):
        return x * block

    assert f(1, 10) == SPACE.default()["block"]
    f(1, 10)
    assert seen == [({"n": 10}, "no cached entry for kernel " + repr(f.tuner.name))]
    assert not bench_calls and f.tuner.stats["offline_fallback"] == 1
    assert not (_tuner_home / "tuner.db").exists() or not ConfigCache().entries()
    monkeypatch.setenv("TUNER_MODE", "noting")

    @tuner.autotune(SPACE, key=["n"], bench=lambda c: 1e-3)
    def g(x, n, *, block):
        return x

    g(1, 5)
    assert seen[-1][0] == {"n": 5}
    with pytest.raises(ValueError, match="mode must be one of"):
        tuner.autotune(SPACE, key=["n"], mode="nope")(lambda x, n, *, block: x)
    with pytest.raises(ValueError, match="identifier"):
        _resolve.register_mode("not a name", _resolve.OFFLINE)


def test_explain_touches_nothing(_tuner_home: Path):
    @tuner.autotune(SPACE, key=["n"], bench=lambda c: 1e-3, budget=2)
    def f(x, n, *, block):
        return np.float64(x) * block

    assert f.explain(1.0, 3).startswith("miss: no cached entry")
    assert not (_tuner_home / "tuner.db").exists()  # explain neither tunes nor creates a store
    f(1.0, 3)
    assert f.explain(1.0, 3).startswith("hit (in memory)")
    f.cache_clear()
    assert f.explain(1.0, 3).startswith("hit (store)")
