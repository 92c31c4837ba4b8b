"""triton.autotune behaviours, each run against `triton.autotune` and against `tuner.autotune` under the
Triton interpreter, so that a divergence shows.

Triton's own autotuner times with CUDA events; on the CPU both decorators get an injected `do_bench`
(as Triton's own tests do). Where the pinned Triton (3.7.1) itself misbehaves on a documented behaviour
(None arguments in reset_to_zero/restore_value, fractional top_k, a single pruned config), its case is
an xfail(strict=True) naming the reason, so that a Triton upgrade that fixes it shows up here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests._versions import triton_before  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
IMPLS = ["triton", "tuner"]
# Under the interpreter (the CPU suite). tests/_gpu_default_device.py runs this file compiled on a GPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def autotune_of(impl: str):
    return triton.autotune if impl == "triton" else tuner.autotune


def xfail_on_triton(request: pytest.FixtureRequest, impl: str, why: str, fixed_in: str) -> None:
    """The case runs for both; on a Triton older than `fixed_in` (the pinned one, and 3.6.0, the GPU
    machine's) it must fail (strict), for the reason given; from `fixed_in` on, Triton passes it too
    (checked on triton 3.8.0 and 3.9.0, the newest releases on 2026-12-04)."""
    if impl == "triton" and triton_before(fixed_in):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"triton {triton.__version__}: {why}"))


class Bench:
    """A fake do_bench(kernel_call, quantiles): runs the call once, records the order, and returns the
    next of `times` (ms) as [median, p20, p80], so the winner is known in advance."""

    def __init__(self, times=None):
        self.times = list(times or [])
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        kernel_call()
        t = self.times[self.calls] if self.calls < len(self.times) else 1.0 + self.calls
        self.calls += 1
        return [t, t, t]


def configs_of(*blocks, name="BLOCK_SIZE"):
    return [triton.Config(kwargs={name: b}) for b in blocks]


def copy_kernel(autotune, **kw):
    @autotune(**kw)
    @triton.jit
    def _copy(dst, src, N, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    return _copy


def grid_for(n, name="BLOCK_SIZE"):
    return lambda meta: (triton.cdiv(n, meta[name]),)


# ---- keys and .cache ---------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_kwargs_in_any_order_and_cache(impl):
    M, N = 256, 16
    src = torch.randn(M * N)
    dst = torch.empty(M * N)

    @autotune_of(impl)(configs=configs_of(32, 128, name="BLOCK_SIZE_M"), key=["M"], do_bench=Bench())
    @triton.jit
    def _kernel(dst, src, stride_m: tl.constexpr, M, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_M: tl.constexpr):
        offsets_m = tl.program_id(0) * stride_m + tl.arange(0, BLOCK_SIZE_M)
        offsets_n = tl.arange(0, BLOCK_SIZE_N)
        x = tl.load(src + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :])
        tl.store(dst + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :], x)

    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_SIZE_M"]),)  # noqa: E731
    _kernel[grid](dst, src, N, M, N)
    _kernel[grid](dst=dst, src=src, M=M // 2, stride_m=N, BLOCK_SIZE_N=N)  # any order, by name
    assert len(_kernel.cache) == 2
    assert set(_kernel.cache) == {
        (M, "torch.float32", "torch.float32"),
        (M // 2, "torch.float32", "torch.float32"),
    }
    assert all(isinstance(c, triton.Config) for c in _kernel.cache.values())


@pytest.mark.parametrize("impl", IMPLS)
def test_dtype_is_part_of_the_key(impl):
    k = copy_kernel(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=Bench())
    for dt in (torch.float32, torch.float16):
        src = torch.randn(128).to(dt)
        dst = torch.empty_like(src)
        k[grid_for(128)](dst, src, 128)
        assert torch.equal(dst, src)
    assert sorted(k.cache) == [
        (128, "torch.float16", "torch.float16"),
        (128, "torch.float32", "torch.float32"),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_constexpr_key_value(impl):
    """Triton keys on any hashable value, e.g. a tl.dtype passed as a constexpr."""

    @autotune_of(impl)(configs=configs_of(32, 64), key=["DTYPE"], do_bench=Bench())
    @triton.jit
    def _cast(dst, src, N, DTYPE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N).to(DTYPE), mask=offs < N)

    src = torch.randn(128)
    dst = torch.empty(128)
    _cast[grid_for(128)](dst, src, 128, tl.float32)
    assert len(_cast.cache) == 1 and torch.equal(dst, src)


# ---- timing: every config, in order, the fastest wins -------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_every_config_timed_and_fastest_chosen(impl):
    bench = Bench(times=[3.0, 1.0, 2.0])
    k = copy_kernel(autotune_of(impl), configs=configs_of(16, 32, 64), key=["N"], do_bench=bench)
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    assert bench.calls == 3
    assert k.best_config.kwargs == {"BLOCK_SIZE": 32}
    assert list(k.cache.values())[0].kwargs == {"BLOCK_SIZE": 32}
    assert torch.equal(dst, src)
    k[grid_for(128)](dst, src, 128)  # cached: nothing timed again
    assert bench.calls == 3


class QuantileBench:
    """A fake do_bench that returns the next of `results` as given ([median, p20, p80] ms)."""

    def __init__(self, results):
        self.results = list(results)
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        if self.calls >= len(self.results):
            raise AssertionError(f"timed {self.calls + 1} times, expected {len(self.results)}")
        kernel_call()
        self.calls += 1
        return list(self.results[self.calls - 1])


# Medians tie at 1.0 but for the third config; among the tied, the lowest p20 (0.8) is the second's and
# the fourth's, and of those the fourth has the lower p80; the fifth times the same as the fourth.
_TIED = [[1.0, 0.9, 1.1], [1.0, 0.8, 1.5], [2.0, 0.1, 2.1], [1.0, 0.8, 1.2], [1.0, 0.8, 1.2]]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_tie_on_the_median_goes_to_the_lower_p20_then_p80(impl):
    """Triton's choice is `min(timings, key=timings.get)` over what do_bench returned: lists compare item by
    item, so a tie on the median goes to the lower p20, then the lower p80, and a full tie to the first."""
    bench = QuantileBench(_TIED)
    k = copy_kernel(autotune_of(impl), configs=configs_of(16, 32, 64, 128, 256), key=["N"], do_bench=bench)
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    assert bench.calls == 5 and torch.equal(dst, src)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 128}
    assert [c.kwargs for c in k.cache.values()] == [{"BLOCK_SIZE": 128}]


def test_tuners_own_timer_keeps_the_first_config_on_a_tie():
    """tuner's own timers (`bench=`, seconds) are not Triton's: a tie on the median goes to the config timed
    first, whatever quantiles they return."""
    timed = []

    def bench(call):
        call()
        timed.append(1)
        return tuple(t / 1e3 for t in _TIED[len(timed) - 1])

    k = copy_kernel(tuner.autotune, configs=configs_of(16, 32, 64, 128, 256), key=["N"], bench=bench)
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    assert len(timed) == 5 and k.best_config.kwargs == {"BLOCK_SIZE": 16}


def test_a_tied_winner_read_back_from_the_store_is_the_same():
    """A later decoration of the kernel (as in another process: nothing in memory) finds the store's entry
    for the key, the config chosen on the tie, and times nothing."""
    first = copy_kernel(
        tuner.autotune, configs=configs_of(16, 32, 64, 128, 256), key=["N"], do_bench=QuantileBench(_TIED)
    )
    src, dst = torch.randn(128), torch.empty(128)
    first[grid_for(128)](dst, src, 128)
    again = copy_kernel(
        tuner.autotune, configs=configs_of(16, 32, 64, 128, 256), key=["N"], do_bench=QuantileBench([])
    )
    again[grid_for(128)](dst, src, 128)
    assert again.tuner.stats["from_store"] == 1 and torch.equal(dst, src)
    assert first.best_config.kwargs == again.best_config.kwargs == {"BLOCK_SIZE": 128}


@pytest.mark.parametrize("impl", IMPLS)
def test_thirty_explicit_configs_are_all_timed(impl):
    bench = Bench()
    cfgs = [
        triton.Config({"BLOCK_SIZE": 32}, num_warps=w, num_stages=s)
        for w in (1, 2, 4, 8, 16)
        for s in range(1, 7)
    ]
    k = copy_kernel(autotune_of(impl), configs=cfgs, key=["N"], do_bench=bench)
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert bench.calls == 30


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key", [["N", "BLOCK_SIZE"], ("N",), "N"], ids=["list", "tuple", "str"])
@pytest.mark.parametrize("kind", [list, tuple])
def test_configs_and_keys_are_the_objects_given(impl, key, kind):
    """Triton's Autotuner keeps `configs` and `key` as given (`self.configs = configs`, `self.keys = key`):
    the same object, of the same type, with every name (one that the configs supply too), and hands
    `early_config_prune` that object; code reads them (`len(k.configs)`, `k.configs[0].kwargs`,
    `k.keys`). Assigning them keeps what was assigned."""
    cfgs = kind(configs_of(32, 64))
    seen = []

    def prune(configs, named_args, **kwargs):
        seen.append(configs)
        return configs

    k = copy_kernel(
        autotune_of(impl),
        configs=cfgs,
        key=key,
        prune_configs_by={"early_config_prune": prune},
        do_bench=Bench([2.0, 1.0]),
    )
    assert k.configs is cfgs and k.keys is key
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    assert torch.equal(dst, src) and k.best_config.kwargs == {"BLOCK_SIZE": 64}
    assert list(k.cache) == [(128, "torch.float32", "torch.float32")]
    assert len(seen) == 1 and seen[0] is cfgs
    new_cfgs, new_key = kind(configs_of(16, 32, 64)), kind(["N"])
    k.configs, k.keys = new_cfgs, new_key
    assert k.configs is new_cfgs and k.keys is new_key
    k[grid_for(64)](dst, src, 64)
    assert len(seen) == 2 and seen[1] is new_cfgs and torch.equal(dst, src)


@pytest.mark.parametrize("impl", IMPLS)
def test_configs_changed_in_place_are_timed_on_the_next_miss(impl):
    """`.configs` is the caller's list, which Triton reads on every miss: a config appended to it (by the
    caller, or through `k.configs`) is timed for the next new key; a key already tuned keeps its config."""
    cfgs = configs_of(32, 64)
    bench = Bench([2.0, 1.0, 3.0, 2.0, 1.0])
    k = copy_kernel(autotune_of(impl), configs=cfgs, key=["N"], do_bench=bench)
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    assert bench.calls == 2 and k.best_config.kwargs == {"BLOCK_SIZE": 64}
    cfgs.append(triton.Config({"BLOCK_SIZE": 16}))
    k[grid_for(64)](dst, src, 64)
    assert bench.calls == 5 and k.best_config.kwargs == {"BLOCK_SIZE": 16}
    k.configs.pop()
    k[grid_for(128)](dst, src, 128)
    assert bench.calls == 5 and k.best_config.kwargs == {"BLOCK_SIZE": 64} and torch.equal(dst, src)
    k[grid_for(32)](dst, src, 32)  # a new key: the two configs left
    assert bench.calls == 7 and len(k.cache) == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_single_config_is_never_timed(impl):
    def no_bench(kernel_call, quantiles):
        raise AssertionError("a single config must not be timed")

    k = copy_kernel(autotune_of(impl), configs=configs_of(64), key=["N"], do_bench=no_bench)
    src, dst = torch.randn(100), torch.empty(100)
    k[grid_for(100)](dst, src, 100)
    assert torch.equal(dst, src)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 64}
    assert len(k.configs) == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_conflicting_meta_parameter_raises(impl):
    k = copy_kernel(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=Bench())
    src, dst = torch.randn(64), torch.empty(64)
    with pytest.raises(ValueError, match="Conflicting meta-parameters: BLOCK_SIZE"):
        k[grid_for(64)](dst, src, 64, BLOCK_SIZE=32)


# ---- restore_value, reset_to_zero ---------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("by_name", [False, True])
def test_restore_value(impl, by_name):
    N = 128
    src = torch.zeros(N)

    @autotune_of(impl)(configs=configs_of(32, 128), key=["N"], restore_value=["src"], do_bench=Bench())
    @triton.jit
    def _inc(src, N, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(src + offs, tl.load(src + offs, mask=offs < N) + 1, mask=offs < N)

    if by_name:
        _inc[grid_for(N)](src=src, N=N)
    else:
        _inc[grid_for(N)](src, N)
    assert torch.equal(src, torch.ones(N))  # timed twice, restored each time, then run once


def _write_one_kernel(autotune, **kw):
    @autotune(**kw)
    @triton.jit
    def _k(src, dst, N, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < N
        if src is not None:
            tl.store(src + offs, tl.full([BLOCK_SIZE], 1, dtype=src.dtype.element_ty), mask=mask)
        else:
            tl.store(dst + offs, tl.full([BLOCK_SIZE], 1, dtype=dst.dtype.element_ty), mask=mask)

    return _k


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("src_is_none", [False, True])
@pytest.mark.parametrize("by_name", [False, True])
def test_reset_to_zero(request, impl, src_is_none, by_name):
    if src_is_none:
        xfail_on_triton(request, impl, "the default pre-hook calls None.zero_()", fixed_in="3.8.0")
    N = 128
    dst = torch.full((N,), 2.0)
    src = None if src_is_none else dst
    k = _write_one_kernel(
        autotune_of(impl), configs=configs_of(32, 128), key=["N"], reset_to_zero=["src"], do_bench=Bench()
    )
    if by_name:
        k[grid_for(N)](src=src, dst=dst, N=N)
    else:
        k[grid_for(N)](src, dst, N)
    assert torch.equal(dst, torch.ones(N))


@pytest.mark.parametrize("impl", IMPLS)
def test_reset_to_zero_before_every_timed_run_and_the_real_one(impl):
    N = 64
    acc = torch.zeros(N)
    seen = []

    def bench(kernel_call, quantiles):
        kernel_call()
        seen.append(float(acc.sum()))  # the run after a reset adds exactly N
        return [1.0 + len(seen)] * 3

    @autotune_of(impl)(configs=configs_of(32, 64), key=["N"], reset_to_zero=["acc"], do_bench=bench)
    @triton.jit
    def _acc(acc, N, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(acc + offs, tl.load(acc + offs, mask=offs < N) + 1, mask=offs < N)

    acc += 5  # stale contents: the tuner must zero them before each timed run
    _acc[grid_for(N)](acc, N)
    assert seen == [float(N), float(N)]
    assert torch.equal(acc, torch.ones(N))  # zeroed again after tuning, then the real run


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("by_name", [False, True])
def test_restore_value_with_none(request, impl, by_name):
    xfail_on_triton(request, impl, "the default pre-hook calls None.clone()", fixed_in="3.8.0")
    N = 128
    dst = torch.full((N,), 2.0)
    k = _write_one_kernel(
        autotune_of(impl), configs=configs_of(32, 128), key=["N"], restore_value=["src"], do_bench=Bench()
    )
    if by_name:
        k[grid_for(N)](src=None, dst=dst, N=N)
    else:
        k[grid_for(N)](None, dst, N)
    assert torch.equal(dst, torch.ones(N))


# ---- hooks --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_pre_and_post_hooks_balance_over_heuristics(impl):
    N = 256
    src = torch.zeros(N)
    values = {"counter": 0, "pre": 0, "post": 0, "exceptions": [], "stages": set(), "reset_only": 0}

    def _pre_hook(nargs, reset_only=False):
        if reset_only:
            values["reset_only"] += 1
            return
        values["counter"] += 1
        values["pre"] += 1
        values["stages"].add(nargs.get("N_STAGES"))

    def _post_hook(nargs, exception):
        values["counter"] -= 1
        values["post"] += 1
        values["exceptions"].append(exception)
        assert values["counter"] == 0

    @autotune_of(impl)(
        configs=configs_of(256, 32), key=["N"], do_bench=Bench(), pre_hook=_pre_hook, post_hook=_post_hook
    )
    @triton.heuristics({"N_STAGES": lambda nargs: 64 if nargs["N"] == 256 else 4})
    @triton.jit
    def _kernel(src, N, N_STAGES: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        offsets = tl.arange(0, BLOCK_SIZE)
        for _ in tl.range(tl.cdiv(N, BLOCK_SIZE), num_stages=N_STAGES):
            x = tl.load(src + offsets, mask=offsets < N)
            tl.store(src + offsets, x + 1, mask=offsets < N)
            offsets += BLOCK_SIZE

    _kernel[(1,)](src, N)
    assert values["pre"] == values["post"] == 2
    assert values["exceptions"] == [None, None]
    assert values["reset_only"] == 1  # once after tuning, before the real run
    # the hooks see the arguments Triton gives them (the heuristic's value is added below them)
    assert values["stages"] == {None}


@pytest.mark.parametrize("impl", IMPLS)
def test_heuristics_underneath_get_the_config(impl):
    N = 200
    x = torch.zeros(N)

    @autotune_of(impl)(configs=configs_of(32, 64), key=["N"], do_bench=Bench(times=[2.0, 1.0]))
    @triton.heuristics({"EVEN": lambda args: args["N"] % args["BLOCK_SIZE"] == 0})
    @triton.jit
    def _fill(x, N, EVEN: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        v = tl.full([BLOCK_SIZE], 2.0 if EVEN else 1.0, tl.float32) * BLOCK_SIZE
        tl.store(x + offs, v, mask=offs < N)

    _fill[grid_for(N)](x, N)
    assert _fill.best_config.kwargs == {"BLOCK_SIZE": 64}
    assert torch.equal(x, torch.full((N,), 64.0))  # 200 % 64 != 0 -> EVEN False -> 1.0 * 64


@pytest.mark.parametrize("impl", IMPLS)
def test_post_hook_sees_a_failing_config(impl):
    """A config that raises: the post-hook gets the exception. Triton re-raises errors other than
    out-of-resources; tuner (by design) treats the config as failed and keeps the others."""
    N = 64
    x = torch.zeros(N)
    got = []

    def post(nargs, exception):
        got.append(exception)

    @autotune_of(impl)(configs=configs_of(128, 32), key=["N"], do_bench=Bench(), post_hook=post)
    @triton.jit
    def _small_only(x, N, BLOCK_SIZE: tl.constexpr):
        tl.static_assert(BLOCK_SIZE <= 64)
        offs = tl.arange(0, BLOCK_SIZE)
        tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)

    if impl == "triton" and INTERPRETED:
        with pytest.raises(triton.TritonError):
            _small_only[(2,)](x, N)
        assert len(got) == 1 and got[0] is not None
    else:  # compiled, Triton too counts a failed static_assert (CompileTimeAssertionFailure) as a failed config
        _small_only[(2,)](x, N)
        assert _small_only.best_config.kwargs == {"BLOCK_SIZE": 32}
        if impl == "tuner":
            assert got[0] is not None and got[1] is None


@pytest.mark.parametrize("impl", IMPLS)
def test_every_config_timing_inf_launches_the_first(impl, caplog):
    """A do_bench that times every config inf (as Triton's own benchmarking does for a config out of
    resources): Triton's min() over the timings is the first config, which it launches and puts in
    `.cache`. tuner raised AllConfigsFailedError (an inf timing counts as a failed config); the drop-in
    now does as Triton (with a warning), and keeps nothing in the store for it."""
    N = 64
    src, dst = torch.randn(N), torch.zeros(N)
    k = copy_kernel(
        autotune_of(impl), configs=configs_of(32, 16), key=["N"], do_bench=Bench([float("inf")] * 2)
    )
    k[grid_for(N)](dst, src, N)
    assert torch.equal(dst, src)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 32}
    assert list(k.cache.values()) == [k.best_config]
    assert len(k.configs_timings) == 2
    if impl == "tuner":
        assert "every config timed inf" in caplog.text
        assert not tuner.ConfigCache().entries()


@pytest.mark.parametrize("impl", IMPLS)
def test_config_pre_hook_runs_before_timed_and_real_runs(impl):
    N = 64
    x = torch.zeros(N)
    calls = []
    cfgs = [
        triton.Config({"BLOCK_SIZE": 32}, pre_hook=lambda nargs: calls.append(("a", nargs["BLOCK_SIZE"]))),
        triton.Config({"BLOCK_SIZE": 64}, pre_hook=lambda nargs: calls.append(("b", nargs["BLOCK_SIZE"]))),
    ]
    k = copy_kernel(autotune_of(impl), configs=cfgs, key=["N"], do_bench=Bench(times=[1.0, 2.0]))
    k[grid_for(N)](x, x, N)
    assert calls == [("a", 32), ("b", 64), ("a", 32)]
    k[grid_for(N)](x, x, N)
    assert calls[-1] == ("a", 32) and len(calls) == 4


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.skipif(
    not INTERPRETED, reason="compiled, the launch reads the ir_override files, which are made up"
)
def test_config_ir_override_is_a_launch_option(impl):
    """`triton.Config(ir_override=path)` is passed to each launch of that config (Triton launches with
    `Config.all_kwargs()`; on a GPU the compiler then uses that IR file), so two configs that differ
    only in it are two candidates. The interpreter ignores the option; the launches are recorded."""
    launched = []

    @triton.jit
    def _copy(dst, src, N, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    jit_run = _copy.run

    def recording_run(*args, **kw):
        launched.append((kw["BLOCK_SIZE"], kw.get("ir_override")))
        return jit_run(*args, **kw)

    _copy.run = recording_run
    cfgs = [
        triton.Config({"BLOCK_SIZE": 32}, ir_override="first.ttgir"),
        triton.Config({"BLOCK_SIZE": 32}),
        triton.Config({"BLOCK_SIZE": 64}, ir_override="second.ttgir"),
    ]
    k = autotune_of(impl)(configs=cfgs, key=["N"], do_bench=Bench(times=[2.0, 3.0, 1.0]))(_copy)
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert launched == [(32, "first.ttgir"), (32, None), (64, "second.ttgir"), (64, "second.ttgir")]
    assert k.best_config is cfgs[2] and len(k.configs_timings) == 3
    assert torch.equal(dst, src)
    if impl == "tuner":  # the winner read back from the store launches with its IR file too
        k.cache_clear()
        k[grid_for(64)](dst, src, 64)
        assert k.tuner.stats["from_store"] == 1 and k.best_config is cfgs[2]
        assert launched[-1] == (64, "second.ttgir")


# ---- pruning ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_perf_model", [False, True])
def test_prune_configs(impl, with_perf_model):
    N = 128
    src, dst = torch.randn(N), torch.empty(N)
    records = {}

    def early_config_prune(configs, named_args, **kwargs):
        records["run_early_config_prune"] = True
        if kwargs.get("N") == N:
            records["capture_kwargs"] = True
        if set(named_args) == {"dst", "src"}:
            records["capture_named_args"] = True
        return [configs[0], configs[1]]

    def perf_model(*args, **kwargs):
        records["run_perf_model"] = True
        return kwargs["BLOCK_SIZE"]

    if with_perf_model:
        prune = {"perf_model": perf_model, "top_k": 2}
    else:
        prune = {"early_config_prune": early_config_prune}
    bench = Bench()
    k = copy_kernel(
        autotune_of(impl), configs=configs_of(128, 32, 64), key=["N"], prune_configs_by=prune, do_bench=bench
    )
    k[grid_for(N)](dst, src, N=N)
    torch.testing.assert_close(src, dst)
    assert bench.calls == 2
    if with_perf_model:
        assert records == {"run_perf_model": True}
        assert {c.kwargs["BLOCK_SIZE"] for c in k.configs_timings} == {32, 64}
    else:
        assert records == {"run_early_config_prune": True, "capture_kwargs": True, "capture_named_args": True}
        assert {c.kwargs["BLOCK_SIZE"] for c in k.configs_timings} == {128, 32}


@pytest.mark.parametrize("impl", IMPLS)
def test_fractional_top_k_keeps_at_least_one(request, impl):
    xfail_on_triton(
        request, impl, "int(2 * 0.3) == 0 configs are kept and min() of nothing raises", fixed_in="3.9.0"
    )
    N = 128
    src, dst = torch.randn(N), torch.empty(N)
    prune = {"perf_model": lambda **kw: kw["BLOCK_SIZE"], "top_k": 0.3}
    k = copy_kernel(
        autotune_of(impl), configs=configs_of(32, 128), key=["N"], prune_configs_by=prune, do_bench=Bench()
    )
    k[grid_for(N)](dst, src, N=N)
    torch.testing.assert_close(src, dst)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 32}


@pytest.mark.parametrize("impl", IMPLS)
def test_fractional_top_k_counts_the_configs_left_by_early_prune(request, impl):
    xfail_on_triton(
        request,
        impl,
        "top_k is a fraction of all configs, not of those left by early_config_prune",
        fixed_in="3.9.0",
    )
    N = 64
    src, dst = torch.randn(N), torch.empty(N)
    estimated, timed = [], []

    def perf_model(**kw):
        estimated.append(kw["BLOCK_SIZE"])
        return kw["BLOCK_SIZE"]

    def bench(kernel_call, quantiles):
        kernel_call()
        timed.append(len(timed))
        return [1.0 + len(timed)] * 3

    prune = {"early_config_prune": lambda cfgs, nargs, **kw: cfgs[:6], "perf_model": perf_model, "top_k": 0.5}
    # ten configs that also compile on a GPU (num_warps a power of two)
    cfgs = [
        triton.Config({"BLOCK_SIZE": 16}, num_warps=w, num_stages=st)
        for w in (1, 2, 4, 8, 16)
        for st in (1, 2)
    ]
    k = copy_kernel(autotune_of(impl), configs=cfgs, key=["N"], prune_configs_by=prune, do_bench=bench)
    k[grid_for(N, "BLOCK_SIZE")](dst, src, N=N)
    assert len(estimated) == 6 and len(timed) == 3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("prune_kind", ["early_config_prune", "perf_model"])
def test_a_single_pruned_config_is_not_timed(request, impl, prune_kind, monkeypatch, capsys):
    xfail_on_triton(request, impl, "the one config left after pruning is still benchmarked", fixed_in="3.8.0")
    monkeypatch.setenv("TRITON_PRINT_AUTOTUNING", "1")
    N = 128
    src, dst = torch.randn(N), torch.empty(N)
    cfgs = configs_of(32, 128)

    def do_not_bench(kernel_call, quantiles):
        raise AssertionError("a single pruned config must not be timed")

    if prune_kind == "early_config_prune":
        prune = {"early_config_prune": lambda configs, named_args, **kw: [configs[1]]}
    else:
        prune = {"perf_model": lambda **kw: 0 if kw["BLOCK_SIZE"] == 128 else 1, "top_k": 1}
    k = copy_kernel(autotune_of(impl), configs=cfgs, key=["N"], prune_configs_by=prune, do_bench=do_not_bench)
    k[grid_for(N)](dst, src, N=N)
    torch.testing.assert_close(src, dst)
    assert k.best_config == cfgs[1]
    assert "Triton autotuning" not in capsys.readouterr().out


@pytest.mark.parametrize("impl", IMPLS)
def test_pruning_to_nothing_names_early_config_prune(impl):
    N = 64
    src, dst = torch.randn(N), torch.empty(N)
    k = copy_kernel(
        autotune_of(impl),
        configs=configs_of(32, 64),
        key=["N"],
        prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: []},
        do_bench=Bench(),
    )
    with pytest.raises(triton.TritonError) as ei:
        k[grid_for(N)](dst, src, N=N)
    assert str(ei.value) == (
        "Autotuner error: No valid autotuner configs after pruning. "
        "`early_config_prune` should return at least one config."
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_top_k_of_a_wrong_type_is_a_type_error(impl):
    N = 64
    src, dst = torch.randn(N), torch.empty(N)
    prune = {"perf_model": lambda **kw: 1.0, "top_k": 1.5}
    k = copy_kernel(
        autotune_of(impl), configs=configs_of(32, 64), key=["N"], prune_configs_by=prune, do_bench=Bench()
    )
    with pytest.raises(TypeError, match="top_k must be either"):
        k[grid_for(N)](dst, src, N=N)


# ---- TRITON_PRINT_AUTOTUNING, deprecated timing options -------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_print_autotuning(impl, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_PRINT_AUTOTUNING", "1")
    k = copy_kernel(
        autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=Bench(times=[2.0, 1.0])
    )
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    out = capsys.readouterr().out.splitlines()
    cfgs = k.configs
    assert out[0] == f"Autotuning kernel _copy with config {cfgs[0]}"
    assert out[1] == f"Autotuning kernel _copy with config {cfgs[1]}"
    assert out[2] == "Triton autotuning for function _copy,"
    assert out[3] == "with key as (64, 'torch.float32', 'torch.float32'),"
    assert out[4].startswith("finished after ") and out[4].endswith("s,")
    assert out[5] == f"best config selected: {cfgs[1]};"
    k[grid_for(64)](dst, src, 64)
    assert capsys.readouterr().out == ""  # a cached choice prints nothing


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "option", [{"warmup": 1}, {"rep": 2}, {"warmup": 1, "rep": 2}, {"use_cuda_graph": True}]
)
def test_deprecated_timing_options_warn_and_time(impl, option):
    with pytest.warns(DeprecationWarning, match="deprecated"):
        k = copy_kernel(autotune_of(impl), configs=configs_of(32, 64), key=["N"], **option)
    if impl == "triton":
        pytest.skip("triton times warmup/rep/use_cuda_graph with CUDA events; no GPU under the interpreter")
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert torch.equal(dst, src) and len(k.configs_timings) == 2
    assert all(t[0] > 0 for t in k.configs_timings.values())


@pytest.mark.parametrize("option", [{"warmup": 1, "rep": 1}, {"use_cuda_graph": True}])
def test_a_do_bench_given_with_deprecated_timing_options_is_what_times(option):
    """Documented divergence: Triton replaces a `do_bench=` given with its own (CUDA events) when
    `warmup`/`rep`/`use_cuda_graph` are given too; the drop-in times with the function given."""
    bench = Bench([2.0, 1.0])
    with pytest.warns(DeprecationWarning, match="deprecated"):
        k = copy_kernel(tuner.autotune, configs=configs_of(32, 64), key=["N"], do_bench=bench, **option)
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert torch.equal(dst, src) and bench.calls == 2
    assert k.best_config.kwargs == {"BLOCK_SIZE": 64}


# ---- the default do_bench -----------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_default_timer(impl):
    if impl == "triton":
        pytest.skip("triton's default do_bench uses CUDA events; no GPU under the interpreter")
    k = copy_kernel(autotune_of(impl), configs=configs_of(32, 64), key=["N"])
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert torch.equal(dst, src) and k.best_config in k.configs


# ---- cache_results: a second process times nothing, and reads the timings from the store ---------------
_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    import tuner
    timed = []
    def bench(kernel_call, quantiles):
        kernel_call()
        timed.append(1)
        med = 3.0 - len(timed)
        return [med, med - 0.25, med + 0.5]
    @tuner.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["N"],
                    do_bench=bench, cache_results=True)
    @triton.jit
    def _copy(dst, src, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)
    src = torch.randn(64); dst = torch.empty(64)
    _copy[lambda m: (triton.cdiv(64, m["BLOCK"]),)](dst, src, 64)
    assert torch.equal(dst, src)
    # each timed config by its place in .configs (the very object), with its timings
    timings = [[[i for i, c in enumerate(_copy.configs) if c is cfg], t]
               for cfg, t in _copy.configs_timings.items()]
    print(json.dumps({"timed": len(timed), "best": _copy.best_config.kwargs,
                      "timings": timings, "tuned": _copy.bench_time > 0}))
    """
)


@pytest.mark.parametrize("impl", IMPLS)
def test_cache_results_across_processes(impl, tmp_path, _tuner_home):
    if impl == "triton":
        pytest.skip("triton turns cache_results off under the interpreter (knobs.runtime.interpret)")
    script = tmp_path / "worker.py"
    script.write_text(_WORKER, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TUNER_HOME": str(_tuner_home),
    }
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            encoding="utf-8",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    timings = runs[0]["timings"]  # (median, p20, p80) ms, as do_bench returned them
    assert timings == [[[0], [2.0, 1.75, 2.5]], [[1], [1.0, 0.75, 1.5]]]
    assert runs[0] == {"timed": 2, "best": {"BLOCK": 64}, "timings": timings, "tuned": True}
    # the second process reads the winner: nothing timed (bench_time 0.0), and as Triton's disk cache the
    # timings the first one measured for the key, keyed by this process's configs (docs/api.md)
    second = runs[1].pop("timings")
    assert runs[1] == {"timed": 0, "best": {"BLOCK": 64}, "tuned": False}
    assert [[i, pytest.approx(t)] for i, t in timings] == second


def test_a_key_found_in_a_shipped_file_has_no_timings(tmp_path, _tuner_home):
    from tuner.runtime import write_cache_file

    k = copy_kernel(tuner.autotune, configs=configs_of(32, 64), key=["N"], do_bench=Bench([2.0, 1.0]))
    src, dst = torch.randn(128), torch.empty(128)
    k[grid_for(128)](dst, src, 128)
    ship = tmp_path / "ship.json"
    write_cache_file(ship, tuner.ConfigCache().entries())  # the winner of N=128, without its timings
    k = copy_kernel(
        tuner.autotune,
        configs=configs_of(32, 64),
        key=["N"],
        do_bench=Bench([2.0, 1.0]),
        storage=False,
        cache=ship,
    )
    k[grid_for(64)](dst, src, 64)  # tuned here
    assert len(k.configs_timings) == 2
    # as a Triton disk-cache hit replaces them: the file holds only the winner, so no timings
    k[grid_for(128)](dst, src, 128)
    assert torch.equal(dst, src) and k.best_config.kwargs == {"BLOCK_SIZE": 64}
    assert k.configs_timings == {} and k.tuner.stats["from_file"] == 1


def test_cache_results_false_keeps_winners_in_memory(_tuner_home):
    k = copy_kernel(
        tuner.autotune, configs=configs_of(32, 64), key=["N"], do_bench=Bench(), cache_results=False
    )
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert not (_tuner_home / "tuner.db").exists()


# ---- tuner's opt-in: a budget smaller than the number of configs ----------------------------------------
def test_budget_opts_in_to_timing_fewer_configs():
    bench = Bench()
    cfgs = [
        triton.Config({"BLOCK_SIZE": 32}, num_warps=w, num_stages=s) for w in (1, 2, 4) for s in (1, 2, 3, 4)
    ]
    k = copy_kernel(tuner.autotune, configs=cfgs, key=["N"], do_bench=bench, budget=5)
    src, dst = torch.randn(64), torch.empty(64)
    k[grid_for(64)](dst, src, 64)
    assert bench.calls == 5 and torch.equal(dst, src)


def test_signature_accepts_every_triton_autotune_keyword():
    import inspect

    ours = set(inspect.signature(tuner.autotune).parameters)
    theirs = set(inspect.signature(triton.autotune).parameters)
    assert theirs <= ours, sorted(theirs - ours)


def test_no_deprecation_warning_without_deprecated_options():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        copy_kernel(tuner.autotune, configs=configs_of(32, 64), key=["N"])


def test_every_explicit_dict_config_of_a_python_launcher_is_timed():
    timed = []

    @tuner.autotune(
        configs=[{"b": b} for b in range(30)], key=["n"], bench=lambda call: timed.append(1) or call()
    )
    def launch(n, *, b):
        return 1.0 + abs(b - 17)

    assert launch(5) == 1.0 and len(timed) == 30


_GPU_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "0"
    import torch, triton, triton.language as tl
    import tuner
    impl = {"triton": triton.autotune, "tuner": tuner.autotune}[sys.argv[1]]
    opts = json.loads(sys.argv[2])
    cfgs = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)]
    @impl(configs=cfgs, key=["N"], restore_value=["x"], **opts)
    @triton.jit
    def _inc(x, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)
    x = torch.zeros(1 << 20, device="cuda")
    _inc[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, x.numel())
    torch.cuda.synchronize()
    print(json.dumps({"ok": bool(torch.all(x == 1).item()), "best": _inc.best_config.kwargs}))
    """
)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (CPU twin: test_deprecated_timing_options_warn_and_time)",
)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("opts", [{}, {"warmup": 5, "rep": 20}, {"use_cuda_graph": True}])
def test_gpu_timing_paths(impl, opts, tmp_path, _tuner_home):
    """On a GPU (compiled, not interpreted): Triton's default do_bench, warmup/rep and CUDA-graph timing."""
    script = tmp_path / "gpu_worker.py"
    script.write_text(_GPU_WORKER, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TUNER_HOME": str(_tuner_home),
        "TRITON_INTERPRET": "0",
    }
    p = subprocess.run(
        [sys.executable, str(script), impl, json.dumps(opts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["ok"] is True
