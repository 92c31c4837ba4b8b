"""A sixth round of the ways real code uses Triton's autotuner, each run with `triton.autotune` and with the
one-line swap to `tuner.autotune` under the Triton interpreter (the pattern of
tests/test_thirdparty_triton.py and the files after it, for uses those files do not cover):

- A key that names a float argument whose value may be infinite: a clamp or a logit soft-cap with
  `float("inf")` standing for "no bound" (as `torch.clamp(x, min=None)` means), which Triton keys as any
  other value. The kernel is written here in the style of such element-wise kernels, not copied.
- triton-viz (github.com/Deep-Learning-Profiling-Tools/triton-viz, MIT): its `Trace` (triton_viz/core/trace.py)
  takes an `Autotuner`, puts a benchmarker of its own on the private `_do_bench` (one that calls the
  kernel once and returns `(1.0, 1.0, 1.0)`, so tuning costs one interpreted launch per config), puts
  its own function on `.fn`, deep-copies the autotuner, and launches through `runner.run(*args,
  client_manager=..., **kwargs)`, keywords that are no parameter of the kernel and that its `fn.run`
  takes. Written here after that structure (the clients that record loads and stores left out).
- A launcher that runs a kernel's autotuner through a compile path of its own: it makes a private chain of
  shallow copies (`copy.copy(layer)`), puts its shim on the copy's `.fn`, gives the copy an empty
  `.cache`, launches the copy's `run`, and copies `best_config` back; the user's kernel is left as it was.
- An activation passed as a `@triton.jit` function constexpr (`ACT: tl.constexpr`, called in the kernel),
  keyed, or tuned as a meta-parameter of the configs: under the interpreter its repr names an address,
  which must not reach the store (written here in the style of kernels that take their epilogue so).

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), so the
winner is known in advance and the two can be compared.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of  # noqa: E402


# ---- a clamp keyed on its bounds, infinity for no bound --------------------------------------------------
def _clamp_kernel(autotune, bench):
    @autotune(
        configs=[triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b, w in ((16, 2), (32, 4))],
        key=["n_elements", "lo", "hi"],
        do_bench=bench,
    )
    @triton.jit
    def clamp_kernel(x_ptr, out_ptr, lo, hi, n_elements, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n_elements
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.minimum(tl.maximum(x, lo), hi), mask=mask)

    return clamp_kernel


def _clamp(kernel, x, lo=None, hi=None):
    out = torch.empty_like(x)
    n = x.numel()
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, out, lo, hi, n)
    return out


@pytest.mark.parametrize("impl", IMPLS)
def test_a_key_on_a_bound_that_is_infinite_tunes_and_caches_it(impl):
    x = torch.linspace(-3, 3, 40)
    bench = Bench([2.0, 1.0] * 3)
    k = _clamp_kernel(autotune_of(impl), bench)
    for lo, hi in ((None, 1.0), (-1.0, None), (None, None)):
        want = x if lo is None and hi is None else torch.clamp(x, min=lo, max=hi)
        torch.testing.assert_close(_clamp(k, x, lo, hi), want)
    assert bench.calls == 6  # each pair of bounds is a key of its own, tuned once
    assert list(k.cache) == [
        (40, -math.inf, 1.0, "torch.float32", "torch.float32"),
        (40, -1.0, math.inf, "torch.float32", "torch.float32"),
        (40, -math.inf, math.inf, "torch.float32", "torch.float32"),
    ]
    assert {c.kwargs["BLOCK_SIZE"] for c in k.cache.values()} == {32}
    _clamp(k, x, None, 1.0)  # a hit
    assert bench.calls == 6


def test_an_infinite_key_value_is_read_back_from_the_store():
    x = torch.linspace(-3, 3, 40)
    first = _clamp_kernel(autotune_of("tuner"), Bench([2.0, 1.0]))
    _clamp(first, x, None, 0.5)
    # a kernel of the same source decorated again (a new process, in effect) finds the stored winner
    bench = Bench()
    again = _clamp_kernel(autotune_of("tuner"), bench)
    torch.testing.assert_close(_clamp(again, x, None, 0.5), torch.clamp(x, max=0.5))
    assert bench.calls == 0
    assert again.best_config.kwargs == {"BLOCK_SIZE": 32}


# ---- triton-viz: a benchmarker put on `_do_bench`, a function of its own on `.fn` ----------------------
def dummy_benchmarker(fn, quantiles):
    fn()
    return (1.0, 1.0, 1.0)


class ClientFn:
    """What triton-viz puts on `.fn`: a `run` that takes its own keywords and launches the kernel."""

    def __init__(self, inner):
        self.inner, self.clients = inner, []

    def run(self, *args, client_manager=None, **kwargs):
        self.clients.append(client_manager)
        return self.inner.run(*args, **kwargs)


class Trace:
    def __init__(self, runner):
        assert isinstance(runner, triton.runtime.Autotuner)
        runner._do_bench = dummy_benchmarker  # replace the benchmark with one that calls the kernel once
        self.client_fn = runner.fn = ClientFn(runner.fn)
        self.runner = runner
        self.copy = copy.deepcopy(runner)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.runner.run(
            *args, grid=grid, warmup=False, client_manager="recorder", **kwargs
        )


@pytest.mark.parametrize("impl", IMPLS)
def test_triton_viz_trace_times_with_the_benchmarker_it_put_on_do_bench(impl):
    fill = autotune_of(impl)(configs=[triton.Config({"BLOCK": b}) for b in (32, 16, 64)], key=["N"])(FILL)

    traced = Trace(fill)
    assert fill._do_bench is dummy_benchmarker and fill.do_bench is dummy_benchmarker
    assert traced.copy._do_bench is dummy_benchmarker  # the deep copy keeps it (a function is shared)
    dst = torch.zeros(100)
    traced[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](dst, 100)
    # one launch per config timed (each "1.0 ms"), a tie that goes to the first config, then the launch
    assert traced.client_fn.clients == ["recorder"] * 4
    assert fill.best_config.kwargs == {"BLOCK": 32}
    assert fill.configs_timings == dict.fromkeys(fill.configs, (1.0, 1.0, 1.0))
    assert torch.equal(dst, torch.full((100,), 32.0))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_deep_copy_made_after_fn_was_wrapped_keys_as_the_kernel_does(impl, recwarn):
    fill = autotune_of(impl)(configs=[triton.Config({"BLOCK": b}) for b in (32, 16)], key=["N"])(FILL)

    copied = Trace(fill).copy  # `.fn` is a ClientFn, which has no parameters of its own
    assert isinstance(copied.fn, ClientFn) and copied.keys == ["N"]
    assert copied.arg_names == ["dst", "N", "BLOCK"]
    for n in (100, 40):
        dst = torch.zeros(100)
        copied.run(dst, n, grid=lambda meta, n=n: (triton.cdiv(n, meta["BLOCK"]),), warmup=False)
        assert torch.equal(dst[:n], torch.full((n,), 32.0)) and not dst[n:].any()
    assert list(copied.cache) == [(100, "torch.float32"), (40, "torch.float32")]
    assert not [w for w in recwarn if "are not parameters" in str(w.message)]


# ---- a private shallow copy launched through a shim -------------------------------------------------------
class Shim:
    def __init__(self, inner):
        self.fn, self.launches = inner, 0

    def run(self, *args, **kwargs):
        self.launches += 1
        return self.fn.run(*args, **kwargs)


def _launch_private_copy(kernel, dst, n):
    private = copy.copy(kernel)
    shim = private.fn = Shim(kernel.fn)
    private.cache = {}
    private.run(dst, n, grid=lambda meta: (triton.cdiv(n, meta["BLOCK"]),), warmup=False)
    return private, shim


def _check_private_copy(kernel, bench):
    kernel[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](torch.zeros(64), 64)
    fn, tuned = kernel.fn, dict(kernel.cache)
    dst = torch.zeros(64)
    private, shim = _launch_private_copy(kernel, dst, 64)
    assert private is not kernel and private.configs is kernel.configs and private.keys is kernel.keys
    assert shim.launches == 3 and bench.calls == 4  # the copy tuned its empty cache through the shim
    assert torch.equal(dst, torch.full((64,), 16.0)) and private.best_config.kwargs == {"BLOCK": 16}
    # the user's kernel is as it was: its own function, its cache, its winner, launched without tuning
    assert kernel.fn is fn and dict(kernel.cache) == tuned
    kernel[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](dst, 64)
    assert shim.launches == 3 and bench.calls == 4 and kernel.best_config.kwargs == {"BLOCK": 32}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_shallow_copy_launched_through_a_shim_leaves_the_kernel_as_it_was(impl):
    bench = Bench([1.0, 2.0, 2.0, 1.0])

    fill = autotune_of(impl)(
        configs=[triton.Config({"BLOCK": b}) for b in (32, 16)], key=["N"], do_bench=bench
    )(FILL)

    _check_private_copy(fill, bench)


_MODULE_BENCH = Bench()


@triton.jit
def module_fill(dst, N, BLOCK: tl.constexpr):
    """dst[i] = BLOCK for i < N, so the output says which config ran."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)


FILL = module_fill  # the JIT function, which the tests above decorate each their own way
# decorated at module level, in the call form (as Unsloth decorates its grouped GEMM), under its own name
module_fill = autotune_of("tuner")(
    configs=[triton.Config({"BLOCK": b}) for b in (32, 16)],
    key=["N"],
    do_bench=_MODULE_BENCH,
    cache_results=False,
)(module_fill)


def test_a_shallow_copy_of_a_module_level_drop_in_is_another_object():
    """A kernel defined at module level pickles by reference (its name); a shallow copy is still an
    object of its own, as Triton's is, not the kernel itself."""
    _MODULE_BENCH.times, _MODULE_BENCH.calls = [1.0, 2.0, 2.0, 1.0], 0
    _check_private_copy(module_fill, _MODULE_BENCH)


# ---- an activation passed as a @triton.jit function constexpr, keyed ------------------------------------
# As kernels that take their epilogue as a constexpr function do (`ACTIVATION: tl.constexpr`, called inside
# the kernel), with the activation among the key names. Triton keys it by the function object; the stored
# key held its str(), which under the interpreter is `<...InterpretedFunction object at 0x...>`: another
# process (another address) never found the entry, tuned again and stored one more.
def _act_relu(v):
    return tl.maximum(v, 0.0)


def _act_neg(v):
    return -v


def _epilogue_kernel(bench):
    import tuner

    @tuner.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n", "ACT"], do_bench=bench)
    @triton.jit
    def epilogue(x, y, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + offs, ACT(tl.load(x + offs, mask=offs < n)), mask=offs < n)

    return epilogue


def test_a_jit_function_key_value_is_found_again_through_another_object_of_it():
    from tuner.runtime import ConfigCache

    x = torch.randn(40)
    bench = Bench([2.0, 1.0] * 3)
    for act, want in ((_act_relu, x.relu()), (_act_neg, -x), (_act_relu, x.relu())):
        k = _epilogue_kernel(bench)  # a fresh kernel and jit function each time, as in a new process
        y = torch.empty_like(x)
        k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40, ACT=triton.jit(act))
        torch.testing.assert_close(y, want)
    assert bench.calls == 4  # relu and neg tuned once each; the second relu read the store
    fields = sorted(str(e.key.fields_dict["ACT"]) for e in ConfigCache().entries())
    assert len(fields) == 2 and not any(" at 0x" in f for f in fields), fields
    assert "_act_neg" in fields[0] and "_act_relu" in fields[1]


# The activation as a tuned meta-parameter (`triton.Config({"BLOCK": 16, "ACT": relu})`): Triton accepts it,
# and so does the drop-in on a GPU (a JITFunction's repr, `JITFunction(module:name)`, names no address);
# under the interpreter the drop-in refused the list ("its repr names a memory address").
def _epilogue_over_acts(bench, acts):
    import tuner

    @tuner.autotune(
        configs=[triton.Config({"BLOCK": b, "ACT": a}) for b, a in zip((16, 32), acts, strict=True)],
        key=["n"],
        do_bench=bench,
    )
    @triton.jit
    def epilogue(x, y, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + offs, ACT(tl.load(x + offs, mask=offs < n)), mask=offs < n)

    return epilogue


def _act_relu_where(v):
    return tl.where(v > 0, v, 0.0)


def test_jit_functions_among_the_config_values_are_tuned_and_found_again():
    x = torch.randn(40)
    bench = Bench([2.0, 1.0])
    for _ in range(2):  # the second kernel, with new jit objects of the same functions: as in a new process
        acts = (triton.jit(_act_relu), triton.jit(_act_relu_where))
        k = _epilogue_over_acts(bench, acts)
        y = torch.empty_like(x)
        k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40)
        torch.testing.assert_close(y, x.relu())
        assert k.best_config.kwargs["ACT"] is acts[1]  # the kernel's own object, read back from the store
    assert bench.calls == 2
