"""The shared hit path and the resolution chain's extension points: Triton launches through kernel[grid]
with grid tuples and grid functions, calls of every arity and form
reaching one entry, and a mode registered from outside the runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import ConfigCache, _resolve

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])


def _add_one():
    """A Triton kernel adding 1 to x[:n] under the drop-in (BLOCK 16 or 32, tuned by n)."""
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

    return add_one


def test_triton_launch_with_many_grids_tunes_once_and_launches_each_grid():
    import torch
    import triton

    add_one = _add_one()
    x = torch.zeros(64)
    add_one[(4,)](x, 64)  # tunes; the config's BLOCK decides how much of x four programs cover
    block = add_one.tuner.last_choice["config"]["BLOCK"]
    covered = min(64, 4 * block)
    expect = torch.zeros(64)
    expect[:covered] += 1
    assert torch.equal(x, expect)
    # a grid function made afresh on every launch, grid tuples, and run(grid=)
    for i in range(6):
        add_one[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, 64)
        expect += 1
        add_one[(64 // block, 1 + i % 3)](x, 64)  # 2-D: program_id(0) covers x once per row
        expect += 1 + i % 3
        if i < 3:
            add_one.run(x, 64, grid=(64 // block,))
            expect += 1
    assert torch.equal(x, expect)
    assert add_one.tuner.stats["tuned"] == 1
    assert "hit (in memory)" in add_one.explain(x, 64)


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


def _count_general(t, monkeypatch) -> list[int]:
    """Counts the builds of the general key (the miss path's, which a keyword call took every time)."""
    seen: list[int] = []
    real = t.keys.general
    monkeypatch.setattr(t.keys, "general", lambda a, k: (seen.append(1), real(a, k))[1])
    return seen


def test_keyword_calls_of_a_resolved_key_hit_without_the_miss_path(monkeypatch):
    """A call with keyword arguments took the miss path at every call (the general key built from a dict
    of the key values, the dtypes of every argument, the sorted keywords): 8.2 us per Triton keyword
    launch against 0.9 us positional. It now hits by the table's keyword key (`fast[-1]`) once its form
    (positional count, keyword names) was resolved; other forms and other key values still resolve."""
    bench_calls = []

    @tuner.autotune(SPACE, key=["n", "m"], budget=2, bench=lambda c: bench_calls.append(1) or 1e-3)
    def f(x, n, m=8, *, block):
        return x + n + m + 0 * block

    assert f(1, n=2) == 11 and len(bench_calls) == 2
    seen = _count_general(f.tuner, monkeypatch)
    for _ in range(3):
        assert f(1, n=2) == 11 and f(x=1, n=2, m=8) == 11
    assert f(1, m=8, n=2) == 11  # another order of the keywords: a form of its own, the same entry
    assert len(seen) == 2 and len(bench_calls) == 2 and f.tuner.stats["tuned"] == 1
    assert f(1, n=3) == 12 and len(bench_calls) == 4  # another key value: tuned
    assert f(1, n=3) == 12 and len(seen) == 3
    with pytest.raises(TypeError, match="missing key argument 'n'"):
        f(x=1)


def test_triton_keyword_launches_hit_and_note_their_config(monkeypatch):
    import torch
    import triton

    add_one = _add_one()
    x = torch.zeros(64)
    add_one[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, n=64)  # tunes
    seen = _count_general(add_one.tuner, monkeypatch)
    launch = add_one[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)]
    launch(x_ptr=x, n=64)  # a form not seen yet: resolved from memory (`.cache`)
    assert seen
    built = len(seen)
    for _ in range(3):
        launch(x_ptr=x, n=64)
        launch(x, n=64)
    assert torch.equal(x, torch.full((64,), 8.0))
    assert len(seen) == built and add_one.tuner.stats["tuned"] == 1
    assert add_one.best_config.kwargs["BLOCK"] == add_one.tuner.last_choice["config"]["BLOCK"]
    assert add_one.cache == {(64, "torch.float32"): add_one.best_config}


def test_keyword_containers_of_other_dtypes_do_not_share_an_entry():
    """The keyword key reads the dtypes of arguments as given, until a container of arrays is seen (as a
    keyword too): from then on the dtypes inside containers, so a float32 and a float16 pytree passed by
    keyword never share an in-memory entry."""
    bench_calls = []

    @tuner.autotune(SPACE, key=["n"], budget=2, bench=lambda c: bench_calls.append(1) or 1e-3)
    def f(n, *, xs, block):
        return n

    f(4, xs=[np.zeros(2, np.float32)])
    f(4, xs=[np.zeros(2, np.float32)])
    assert len(bench_calls) == 2
    f(4, xs=[np.zeros(2, np.float16)])
    assert len(bench_calls) == 4
    f(4, xs=[np.zeros(2, np.float16)])
    f(4, xs=[np.zeros(2, np.float32)])
    assert len(bench_calls) == 4 and f.tuner.stats["tuned"] == 2


def test_an_unhashable_keyword_key_value_resolves_by_its_stored_form():
    """A Triton key value that is not hashable as given (a list) is keyed by its str(), as stored: the
    general key of such a call is still hashable and the same for equal values."""
    import triton
    import triton.language as tl

    @tuner.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"], storage=False)
    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        pass

    g1 = k.tuner.keys.general((None,), {"n": [1, 2]})
    assert g1 == k.tuner.keys.general((None,), {"n": [1, 2]}) and hash(g1) is not None
    assert g1 != k.tuner.keys.general((None,), {"n": [1, 3]})
