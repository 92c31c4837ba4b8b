"""The Triton drop-in's key values of other kinds that print alike: a `tl.dtype` constexpr and the string of
its `str()` ("fp16"), an infinite float and the string "inf", 1 and True, are other entries, in memory and in
the store; an entry stored before key objects were written as `<object TYPE REPR>` (as `str()`) is still
read for the object (docs/api.md, `tuner.autotune`)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests.test_triton_autotuner_class import Bench  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402


def make(bench):
    """A fresh drop-in on one kernel (same name and source: one store entry per key) keyed on MODE."""

    @tuner.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["MODE"], do_bench=bench)
    @triton.jit
    def fill(dst, N, MODE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], 1, tl.float32), mask=offs < N)

    return fill


# (fresh: a new drop-in reads the store; else the same one, its memory and `.cache`.) 1, True and 1.0 were
# always other stored keys: a fresh drop-in told them apart before, and is not asked here.
@pytest.mark.parametrize(
    ("first", "second", "fresh"),
    [
        (tl.float16, "fp16", False),
        (tl.float16, "fp16", True),
        (float("inf"), "inf", False),
        (float("inf"), "inf", True),
        (1, True, False),
        (True, 1, False),
        (1, 1.0, False),
        (1.0, 1, False),
    ],
)
def test_key_values_that_print_alike_are_other_entries(_tuner_home, first, second, fresh):
    bench = Bench([2.0, 1.0])
    k = make(bench)
    k[(1,)](torch.zeros(16), 16, first)
    assert bench.calls == 2
    # the same drop-in (its memory and `.cache`) or a fresh one (the store): each tunes the other value
    if fresh:
        k = make(bench)
    k[(1,)](torch.zeros(16), 16, second)
    assert bench.calls == 4, f"{second!r} used the entry of {first!r}"
    assert len(ConfigCache().entries()) == 2


def test_an_entry_stored_as_str_before_is_still_read_for_the_object(_tuner_home):
    bench = Bench([2.0, 1.0])
    k = make(bench)
    k[(1,)](torch.zeros(16), 16, tl.float16)
    db = ConfigCache()
    (entry,) = db.entries()
    assert entry.key.fields_dict == {"MODE": "<object triton.language.core.dtype triton.language.float16>"}
    # what the store held before: the key written as str(tl.float16)
    ck = entry.key
    old = dataclasses.replace(
        entry,
        key=type(ck).make(
            ck.kernel, ck.source_hash, {"MODE": "fp16"}, ck.dtypes, ck.device, ck.versions_dict
        ),
    )
    db.clear()
    db.put(old)
    assert [e.key.fields_dict for e in db.entries()] == [{"MODE": "fp16"}]
    make(bench)[(1,)](torch.zeros(16), 16, tl.float16)
    assert bench.calls == 2  # read, not tuned again
    # (so an entry of the string "fp16" is read for tl.float16 too, where tl.float16 has none of its own:
    # nothing in an entry says which of the two wrote it; the other way round, "fp16" never reads
    # tl.float16's entry, the first test)
