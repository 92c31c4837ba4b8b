"""triton.autotune's positional form, `triton.autotune(configs, key, prune_configs_by, ...)`, run against
`triton.autotune` and against the one-line swap to `tuner.autotune` under the Triton interpreter (the
pattern of tests/test_triton_conformance.py, which gives every argument by keyword).

Triton's parameters are positional-or-keyword, and code written for it passes some positionally: Triton's
own fused-attention tutorial decorated its kernel with `@triton.autotune(list(filter(keep, configs)),
key=["N_CTX", "HEAD_DIM"])`. tuner.autotune took one positional argument (a SearchSpace), so that swap
raised a TypeError, or a ValueError where Triton's keywords came with it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests.test_triton_conformance import IMPLS, Bench, autotune_of  # noqa: E402


def configs_of(*blocks):
    return [triton.Config(kwargs={"BLOCK": b}) for b in blocks]


def grid_for(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_by_name", [False, True])
def test_configs_first_then_key(impl, key_by_name):
    """The tutorial's form: the config list as the first argument, the key by name or second."""
    bench = Bench([2.0, 1.0])
    configs = configs_of(32, 64)
    deco = (
        autotune_of(impl)(configs, key=["N"], do_bench=bench)
        if key_by_name
        else autotune_of(impl)(configs, ["N"], do_bench=bench)
    )

    @deco
    @triton.jit
    def _copy(dst, src, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    src, dst = torch.randn(100), torch.empty(100)
    _copy[grid_for(100)](dst, src, 100)
    assert torch.equal(dst, src)
    assert bench.calls == 2 and _copy.best_config.kwargs == {"BLOCK": 64}
    assert list(_copy.cache) == [(100, "torch.float32", "torch.float32")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", [list, tuple])
def test_positional_configs_are_the_object_given(impl, kind):
    """As with `configs=` (tests/test_triton_conformance.py): `.configs` is the very object given, and a
    config appended to the caller's list is timed at the next new key. Was: the positional form made a
    list copy, so `.configs` was another object (a tuple came back a list) and an append was never timed."""
    bench = Bench([2.0, 1.0, 3.0, 3.0, 1.0])
    configs = kind(configs_of(32, 64))

    @autotune_of(impl)(configs, ["N"], do_bench=bench)
    @triton.jit
    def _copy(dst, src, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    assert _copy.configs is configs
    src, dst = torch.randn(128), torch.empty(128)
    _copy[grid_for(128)](dst, src, 128)
    assert bench.calls == 2 and _copy.best_config.kwargs == {"BLOCK": 64}
    if kind is list:
        configs.append(triton.Config({"BLOCK": 16}))
        _copy[grid_for(64)](dst, src, 64)
        assert bench.calls == 5 and _copy.best_config.kwargs == {"BLOCK": 16} and torch.equal(dst, src)


@pytest.mark.parametrize("impl", IMPLS)
def test_every_parameter_in_tritons_order(impl):
    """configs, key, prune_configs_by, reset_to_zero, restore_value, pre_hook, post_hook, warmup, rep,
    use_cuda_graph, do_bench: each lands where Triton puts it (the prune runs, the buffer is restored
    after the timed runs, the given do_bench times)."""
    pruned = []

    def early_config_prune(configs, named_args, **kwargs):
        pruned.append(len(configs))
        return configs[1:]

    bench = Bench([3.0, 1.0, 2.0])

    @autotune_of(impl)(
        configs_of(16, 32, 64, 128),
        ["N"],
        {"early_config_prune": early_config_prune},
        None,
        ["x"],
        None,
        None,
        None,
        None,
        False,
        bench,
    )
    @triton.jit
    def _inc(x, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)

    x = torch.zeros(200)
    _inc[grid_for(200)](x, 200)
    assert pruned == [4] and bench.calls == 3
    assert _inc.best_config.kwargs == {"BLOCK": 64}
    assert torch.equal(x, torch.ones(200))  # restore_value put x back after each of the 3 timed runs


def test_a_parameter_given_both_ways_or_without_a_config_list_is_a_type_error():
    """What Python says for Triton's function, and no silent reading of a SearchSpace call's extras."""
    configs = configs_of(32, 64)
    with pytest.raises(TypeError, match="multiple values for argument 'key'"):
        tuner.autotune(configs, ["N"], key=["N"])
    with pytest.raises(TypeError, match="multiple values for argument 'configs'"):
        tuner.autotune(configs, ["N"], configs=configs)
    space = tuner.SearchSpace.from_configs([{"BLOCK": 32}])
    with pytest.raises(TypeError, match="list of configs"):
        tuner.autotune(space, ["N"])
    with pytest.raises(TypeError, match="missing required argument: 'key'"):
        tuner.autotune(configs)
    with pytest.raises(TypeError, match="at most 12 positional arguments"):
        tuner.autotune(configs, ["N"], *([None] * 11))
