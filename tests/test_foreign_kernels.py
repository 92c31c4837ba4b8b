"""Kernels as third-party users write them, in patterns the other Triton/JAX test files do not cover,
run through tuner's drop-ins under the CPU interpreters and compared with plain `triton.autotune` /
plain JAX: the fused-softmax tutorial (grid from the row count, BLOCK_SIZE from next_power_of_2, a
strided view), the vector-add tutorial's grid that reads `meta["n_elements"]`, configs that differ
only in num_stages, `restore_value` / `reset_to_zero` on non-contiguous views, an empty key, a
heuristic that sets num_warps, a Triton kernel launched from two threads; and Pallas launchers with
static block sizes under `jax.jit`, wrapped in `functools.partial`, as methods of a layer class,
masked for shapes the block does not divide, inside `lax.scan`, with keys derived from shapes and
dtypes.
"""

from __future__ import annotations

import functools
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402

IMPLS = ["triton", "tuner"]


def autotune_of(impl: str):
    return triton.autotune if impl == "triton" else tuner.autotune


class Bench:
    """A fake do_bench(kernel_call, quantiles): runs the call once and returns the next of `times` (ms),
    so the winner is known in advance; counts the calls."""

    def __init__(self, times=()):
        self.times = list(times)
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        kernel_call()
        t = self.times[self.calls] if self.calls < len(self.times) else 10.0 + self.calls
        self.calls += 1
        return [t, t, t]


# ---- Triton tutorial 02: fused softmax, one program per row, BLOCK_SIZE = next_power_of_2(n_cols) ------
def _softmax(autotune, bench):
    @autotune(
        configs=[triton.Config({}, num_warps=w, num_stages=s) for w, s in ((1, 1), (2, 1), (2, 2))],
        key=["n_cols"],
        do_bench=bench,
    )
    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                       BLOCK_SIZE: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
        z = x - tl.max(x, axis=0)
        num = tl.exp(z)
        tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)

    def softmax(x):
        n_rows, n_cols = x.shape
        y = torch.empty((n_rows, n_cols), dtype=x.dtype)
        softmax_kernel[(n_rows,)](
            y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols)
        )
        return y

    return softmax_kernel, softmax


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_softmax_tutorial_on_strided_views(impl):
    bench = Bench(times=[3.0, 2.0, 1.0, 1.0, 2.0, 3.0])
    k, softmax = _softmax(autotune_of(impl), bench)
    torch.manual_seed(0)
    got = []
    for x in (
        torch.randn(7, 50),
        torch.randn(7, 80)[:, :50],  # a view: row stride 80
        torch.randn(14, 50)[::2],  # every other row: row stride 100
        torch.randn(5, 19),
    ):
        torch.testing.assert_close(softmax(x), torch.softmax(x, dim=1))
        got.append((bench.calls, k.best_config.num_warps, k.best_config.num_stages))
    # n_cols=50 tuned once for all three layouts (strides are not in the key); n_cols=19 tuned again
    assert got == [(3, 2, 2)] * 3 + [(6, 1, 1)]
    assert sorted(k.cache) == [(19, "torch.float32", "torch.float32"), (50, "torch.float32", "torch.float32")]
    assert k.best_config is k.configs[0]


# ---- Triton tutorial 01: vector add, a grid that reads the call's own arguments from meta ------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_vector_add_grid_reads_n_elements_from_meta(impl):
    bench = Bench(times=[2.0, 1.0, 2.0, 1.0])

    @autotune_of(impl)(configs=[triton.Config({"BLOCK_SIZE": b}) for b in (32, 64)], key=["n_elements"],
                       do_bench=bench)  # fmt: skip
    @triton.jit
    def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n_elements
        tl.store(
            output_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    grid = lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK_SIZE"]),)  # noqa: E731
    for n in (98, 98, 200):
        x, y = torch.rand(n), torch.rand(n)
        out = torch.empty(n)
        add_kernel[grid](x, y, out, n)
        torch.testing.assert_close(out, x + y)
        out2 = torch.empty(n)
        add_kernel[grid](x_ptr=x, y_ptr=y, output_ptr=out2, n_elements=n)  # all by keyword
        torch.testing.assert_close(out2, x + y)
    assert bench.calls == 4 and add_kernel.best_config.kwargs == {"BLOCK_SIZE": 64}


# ---- configs that differ only in num_stages: each is its own candidate, and best_config is that object ---
@pytest.mark.parametrize("impl", IMPLS)
def test_configs_differing_only_in_num_stages(impl):
    cfgs = [triton.Config({"BLOCK": 32}, num_warps=4, num_stages=s) for s in (1, 2, 3, 4)]
    bench = Bench(times=[4.0, 3.0, 1.0, 2.0])

    @autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def neg(x, y, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + offs, -tl.load(x + offs, mask=offs < N), mask=offs < N)

    x, y = torch.randn(70), torch.empty(70)
    neg[lambda m: (triton.cdiv(70, m["BLOCK"]),)](x, y, 70)
    assert torch.equal(y, -x)
    assert bench.calls == 4 and neg.best_config is cfgs[2]
    assert list(neg.cache.values()) == [cfgs[2]]
    assert [c.num_stages for c in neg.configs_timings] == [1, 2, 3, 4]


# ---- configs that differ only in a launch option (maxnreg, num_ctas) --------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_configs_differing_only_in_maxnreg_or_num_ctas(impl):
    cfgs = [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 32}, maxnreg=128),
            triton.Config({"BLOCK": 32}, num_ctas=2)]  # fmt: skip
    bench = Bench(times=[3.0, 1.0, 2.0])

    @autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def fill(x, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.full([BLOCK], 1.0, tl.float32), mask=offs < N)

    x = torch.zeros(40)
    fill[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, 40)
    assert torch.equal(x, torch.ones(40))
    assert bench.calls == 3 and fill.best_config is cfgs[1] and len(fill.configs_timings) == 3


# ---- restore_value / reset_to_zero on views of a larger buffer ---------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_restore_value_and_reset_to_zero_on_views(impl):
    """An in-place kernel on a column slice of a larger tensor (a KV-cache or parameter slab): the timed
    runs must leave the rest of the slab alone and the slice as the one real run makes it."""
    bench = Bench(times=[2.0, 1.0])

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
        key=["n_cols"],
        restore_value=["x"],
        reset_to_zero=["acc"],
        do_bench=bench,
    )
    @triton.jit
    def scale_rows(x, acc, stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        v = tl.load(x + row * stride + cols, mask=m, other=0.0)
        tl.store(x + row * stride + cols, v * 2.0, mask=m)
        tl.atomic_add(acc + row * 2, tl.sum(v, axis=0))  # acc is a strided view too

    torch.manual_seed(0)
    slab = torch.randn(6, 40)
    view = slab[:, 8:28]  # non-contiguous: row stride 40
    before = slab.clone()
    acc_slab = torch.full((12,), 5.0)
    acc = acc_slab[::2]  # a stride-2 view of 6 accumulators
    scale_rows[(6,)](view, acc, view.stride(0), 20)
    torch.testing.assert_close(view, 2 * before[:, 8:28])
    torch.testing.assert_close(slab[:, :8], before[:, :8])
    torch.testing.assert_close(slab[:, 28:], before[:, 28:])
    torch.testing.assert_close(acc, before[:, 8:28].sum(1))
    torch.testing.assert_close(acc_slab[1::2], torch.full((6,), 5.0))  # between the view's elements
    assert bench.calls == 2


# ---- an empty key: tuned once per dtype signature -------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_empty_key_tunes_once_per_dtypes(impl):
    bench = Bench(times=[2.0, 1.0, 1.0, 2.0])

    @autotune_of(impl)(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})], key=[],
                       do_bench=bench)  # fmt: skip
    @triton.jit
    def copy(dst, src, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    for n, dt in ((10, torch.float32), (300, torch.float32), (10, torch.float16), (64, torch.float16)):
        src = torch.randn(n).to(dt)
        dst = torch.empty_like(src)
        copy[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](dst, src, n)
        assert torch.equal(dst, src)
    assert bench.calls == 4
    assert sorted(copy.cache) == [("torch.float16", "torch.float16"), ("torch.float32", "torch.float32")]
    assert copy.best_config.kwargs == {"BLOCK": 16}


# ---- a heuristic that picks num_warps from the block size, beneath the autotuner (old softmax tutorial) ---
@pytest.mark.parametrize("impl", IMPLS)
def test_heuristic_beneath_sets_num_warps(impl):
    bench = Bench(times=[2.0, 1.0])
    seen = []

    def warps(args):
        seen.append(args["BLOCK"])
        return 2 if args["BLOCK"] >= 64 else 1

    @autotune_of(impl)(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["N"],
                       do_bench=bench)  # fmt: skip
    @triton.heuristics({"num_warps": warps})
    @triton.jit
    def square(x, y, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + offs, mask=offs < N)
        tl.store(y + offs, v * v, mask=offs < N)

    x, y = torch.randn(100), torch.empty(100)
    square[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, y, 100)
    torch.testing.assert_close(y, x * x)
    assert seen == [32, 64, 64] and square.best_config.kwargs == {"BLOCK": 64}


# ---- the same Triton kernel launched from two threads ----------------------------------------------------
def test_triton_kernel_from_two_threads_tunes_each_key_once():
    """Four threads, two keys: each key tuned once, each thread's in-place buffer restored. (Triton's
    interpreter cannot run two kernels at once, triton 3.7.1: its launches are serialised here by a lock
    around `JITFunction.run`; tuner's own locking is what is exercised.)"""
    launch_lock = threading.Lock()
    timed = []

    @triton.jit
    def inc(x, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)

    jit_run = inc.run

    def serialised_run(*args, **kw):
        with launch_lock:
            return jit_run(*args, **kw)

    inc.run = serialised_run

    def bench(kernel_call, quantiles):
        kernel_call()
        timed.append(1)
        return [float(len(timed))] * 3

    k = tuner.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["N"],
                       do_bench=bench, restore_value=["x"])(inc)  # fmt: skip
    results, errors = {}, []
    barrier = threading.Barrier(4)
    dev = torch.empty(
        0
    ).device  # torch's default device is per thread (CUDA under tests/_gpu_default_device.py)

    def work(i, n):
        try:
            x = torch.zeros(n, device=dev)
            barrier.wait()
            k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
            results[i] = bool(torch.all(x == 1))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, n)) for i, n in enumerate((40, 40, 70, 70))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {0: True, 1: True, 2: True, 3: True}
    assert len(timed) == 4 and k.tuner.stats["tuned"] == 2  # two keys, each tuned once
    assert sorted(key[0] for key in k.cache) == [40, 70]


# ---- a do_bench of the user's that returns one number (triton.testing.do_bench without quantiles) --------
def _copy_timed_by(impl, results):
    """A copy kernel over two configs whose do_bench returns `results`, one after another."""
    times = iter(results)

    def bench(kernel_call, quantiles):
        kernel_call()
        return next(times)

    cfgs = [triton.Config({"BLOCK": b}) for b in (16, 32)]

    @autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def copy(dst, src, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    return copy, cfgs


@pytest.mark.parametrize("impl", IMPLS)
def test_configs_timings_hold_what_the_users_do_bench_returned(impl):
    """Triton keeps each config's do_bench result as returned: a float from a do_bench that ignores
    `quantiles` (code that formats `f"{t:.3f}"` relies on it), the quantiles otherwise."""
    copy, cfgs = _copy_timed_by(impl, [2.5, 1.5, [3.0, 2.0, 4.0], [1.0, 0.5, 1.5]])
    src, dst = torch.randn(50), torch.empty(50)
    copy[lambda m: (triton.cdiv(50, m["BLOCK"]),)](dst, src, 50)
    assert copy.configs_timings == {cfgs[0]: 2.5, cfgs[1]: 1.5}
    assert all(type(t) is float for t in copy.configs_timings.values())
    src, dst = torch.randn(70), torch.empty(70)
    copy[lambda m: (triton.cdiv(70, m["BLOCK"]),)](dst, src, 70)
    assert torch.equal(dst, src) and copy.best_config is cfgs[1]
    assert copy.configs_timings == {cfgs[0]: [3.0, 2.0, 4.0], cfgs[1]: [1.0, 0.5, 1.5]}


@pytest.mark.parametrize("impl", IMPLS)
def test_configs_timings_keep_skewed_quantiles_as_returned(impl):
    """Quantiles that are not symmetric about the median (a few slow runs: p80 far above it, as GPU timings
    often are) are kept as do_bench returned them. tuner rebuilt them from the median and the p80 - p20
    spread, as [median, median - spread/2, median + spread/2]: [1.0, -0.55, 2.55] for [1.0, 0.9, 4.0]."""
    copy, cfgs = _copy_timed_by(impl, [[1.0, 0.9, 4.0], [2.0, 1.95, 2.1]])
    src, dst = torch.randn(50), torch.empty(50)
    copy[lambda m: (triton.cdiv(50, m["BLOCK"]),)](dst, src, 50)
    assert torch.equal(dst, src) and copy.best_config is cfgs[0]
    assert copy.configs_timings == {cfgs[0]: [1.0, 0.9, 4.0], cfgs[1]: [2.0, 1.95, 2.1]}


# ======================================== JAX / Pallas ========================================
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pl = pytest.importorskip("jax.experimental.pallas")

import numpy as np  # noqa: E402

from tuner.runtime import ConfigCache  # noqa: E402


def _once(seen, time_of):
    """A bench that runs a config once and reports the time `time_of(last config seen)`."""

    def bench(call):
        jax.block_until_ready(call())
        return time_of(seen[-1])

    return bench


def _double_body(x_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.float32) * 2.0).astype(o_ref.dtype)


def _double_launch(x, *, block, interpret):
    spec = pl.BlockSpec((block,), lambda i: (i,))
    return pl.pallas_call(
        _double_body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(x.shape[0], block),),
        in_specs=[spec],
        out_specs=spec,
        interpret=interpret,
    )(x)


# ---- a launcher bound with functools.partial (interpret=..., as model code binds it) ------------------------
def test_a_partial_launcher_is_found_again_by_a_new_process():
    """The stored name of a `functools.partial` is its function's module.qualname with the bound
    arguments, the same in every process: a new partial (a new process, a reload) reads the entry
    instead of tuning again. (It was the partial's repr, with its memory address.)"""
    seen: list = []

    def make():
        record = functools.partial(_record, functools.partial(_double_launch, interpret=True), seen)
        return tuner.autotune(
            configs=[{"block": 8}, {"block": 16}],
            key=lambda x: {"n": x.shape[0]},
            bench=_once(seen, lambda b: {8: 2e-3, 16: 1e-3}[b]),
        )(record)

    f = make()
    x = jnp.arange(48, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), np.asarray(2 * x))
    assert f.tuner.stats["tuned"] == 1 and seen[-1] == 16
    [entry] = ConfigCache().entries()
    assert entry.key.kernel == f"{__name__}._record(partial, list)"
    g = make()  # what a new process builds
    np.testing.assert_allclose(np.asarray(g(x)), np.asarray(2 * x))
    assert g.tuner.stats == {**g.tuner.stats, "tuned": 0, "from_store": 1}
    # partials that bind other values are other kernels
    h = tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"n": x.shape[0]},
                       bench=lambda call: (jax.block_until_ready(call()), 1e-3)[1])(
        functools.partial(_double_launch, interpret=True))  # fmt: skip
    h(x)
    assert h.tuner.name == f"{__name__}._double_launch(interpret=True)" and h.tuner.stats["tuned"] == 1


def _record(launch, seen, x, *, block):
    seen.append(block)
    return launch(x, block=block)


# ---- a layer object: a callable instance decorated, and a decorated method keyed through `self` ----------
class RowScale:
    """y = scale * 2x, per row block (a Flax/Equinox-style module holding its config-free state)."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x, *, block):
        return _double_launch(x, block=block, interpret=True) * self.scale

    @tuner.autotune(
        configs=[{"block": 8}, {"block": 16}],
        key=lambda self, x: {"n": x.shape[0]},
        bench=lambda call: (jax.block_until_ready(call()), 1e-3)[1],
    )
    def apply(self, x, *, block):
        return self(x, block=block)


def test_callable_object_and_method_launchers():
    x = jnp.arange(32, dtype=jnp.float32)
    k = tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"n": x.shape[0]},
                       bench=lambda call: (jax.block_until_ready(call()), 1e-3)[1])(RowScale(3.0))  # fmt: skip
    np.testing.assert_allclose(np.asarray(jax.jit(k)(x)), np.asarray(6 * x))
    assert k.tuner.name == f"{__name__}.RowScale" and k.tuner.stats["tuned"] == 1
    again = tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"n": x.shape[0]},
                           bench=lambda call: 1 / 0)(RowScale(3.0))  # fmt: skip
    np.testing.assert_allclose(np.asarray(again(x)), np.asarray(6 * x))  # read, not timed
    assert again.tuner.stats["from_store"] == 1
    # a method: two instances share the entry (the key says so); inside jit too
    a, b = RowScale(1.0), RowScale(5.0)
    np.testing.assert_allclose(np.asarray(a.apply(x)), np.asarray(2 * x))
    np.testing.assert_allclose(np.asarray(jax.jit(b.apply)(x)), np.asarray(10 * x))
    assert RowScale.apply.tuner.stats["tuned"] == 1
    assert RowScale.apply.tuner.name == f"{__name__}.RowScale.apply"


# ---- shapes the block does not divide: a column-blocked row sum with an explicit mask, under vmap ---------
def _row_sum_body(x_ref, o_ref, *, n, block):
    j = pl.program_id(0)

    @pl.when(j == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    cols = j * block + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    x = jnp.where(cols < n, x_ref[...].astype(jnp.float32), 0.0)  # the last block's padding is garbage
    o_ref[...] += jnp.sum(x, axis=1)


def test_masked_blocks_for_shapes_the_block_does_not_divide_under_vmap():
    seen: list = []

    @tuner.autotune(configs=[{"block": 16}, {"block": 32}], key=lambda x: {"rows": x.shape[0], "n": x.shape[1]},
                    bench=_once(seen, lambda b: {16: 2e-3, 32: 1e-3}[b]))  # fmt: skip
    def row_sum(x, *, block):
        seen.append(block)
        rows, n = x.shape
        return pl.pallas_call(
            functools.partial(_row_sum_body, n=n, block=block),
            out_shape=jax.ShapeDtypeStruct((rows,), jnp.float32),
            grid=(pl.cdiv(n, block),),
            in_specs=[pl.BlockSpec((rows, block), lambda j: (0, j))],
            out_specs=pl.BlockSpec((rows,), lambda j: (0,)),
            interpret=True,
        )(x)

    xs = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 50)).astype(jnp.bfloat16)  # 50 = 32 + 18
    out = jax.jit(jax.vmap(row_sum))(xs)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(xs.astype(jnp.float32).sum(-1)), rtol=1e-5, atol=1e-5
    )
    assert seen[-1] == 32 and row_sum.tuner.stats["tuned"] == 1
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict == {"rows": 4, "n": 50} and entry.key.dtypes == ("bfloat16",)


# ---- a tuned launcher in a lax.scan body and under jax.checkpoint -----------------------------------------
def test_launcher_inside_scan_and_checkpoint():
    seen: list = []
    f = tuner.autotune(
        configs=[{"block": 8}, {"block": 16}],
        key=lambda x: {"n": x.shape[0]},
        bench=_once(seen, lambda b: {8: 1e-3, 16: 2e-3}[b]),
    )(  # fmt: skip
        lambda x, *, block: (seen.append(block), _double_launch(x, block=block, interpret=True))[1]
    )

    def step(c, _):
        return f(c), None

    out, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=3))(jnp.ones(32))
    np.testing.assert_allclose(np.asarray(out), np.full(32, 8.0))
    y = jax.jit(jax.checkpoint(lambda y: jnp.sum(f(y) ** 2)))(jnp.ones(32))
    assert float(y) == 128.0
    assert f.tuner.stats["tuned"] == 1 and seen.count(16) == 1  # 16 timed once, never chosen


# ---- the drop-in's keywords on a jax launcher, with a key of shapes and dtypes as jax gives them ----------
def test_drop_in_key_function_returning_a_dtype_and_a_shape():
    """With triton.autotune's keywords (do_bench=) any key value that is not a number or string is keyed
    as a config's object is, `<object TYPE REPR>` (docs/api.md): a numpy/jax dtype too, which has a
    `.shape` but is no array."""
    timed: list = []

    def do_bench(kernel_call, quantiles):
        jax.block_until_ready(kernel_call())
        timed.append(1)
        return [1.0, 1.0, 1.0]

    f = tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"dtype": x.dtype, "shape": x.shape},
                       do_bench=do_bench)(functools.partial(_double_launch, interpret=True))  # fmt: skip
    for x in (jnp.ones(32), jnp.ones(32, jnp.bfloat16), jnp.ones(32)):
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(x), np.float32), np.full(32, 2.0))
    assert len(timed) == 4
    fields = sorted((e.key.fields_dict["dtype"], e.key.fields_dict["shape"]) for e in ConfigCache().entries())
    assert fields == [
        ("<object numpy.dtype[bfloat16] dtype(bfloat16)>", "<object tuple (32,)>"),
        ("<object numpy.dtypes.Float32DType dtype('float32')>", "<object tuple (32,)>"),
    ]


# ---- Triton tutorial 03 as people adapt it: grouped ordering, a transposed B, prune_configs_by with an
# early prune on the call's dtype and K and a perf model taking num_warps/num_stages by name ------------
@pytest.mark.parametrize("impl", IMPLS)
def test_grouped_matmul_with_dtype_aware_pruning_and_a_named_perf_model(impl):
    seen = {"early": [], "perf": []}

    def early(configs, named_args, **kwargs):
        seen["early"].append((str(named_args["a_ptr"].dtype), named_args["K"], sorted(kwargs)))
        return [c for c in configs if c.kwargs["BLOCK_K"] <= named_args["K"]]

    def perf(num_warps, num_stages, a_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, **kw):
        seen["perf"].append((BLOCK_M, BLOCK_K, num_stages))
        return BLOCK_M * BLOCK_N / num_stages  # big tiles and deep pipelines first

    cfgs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": 16, "BLOCK_K": bk, "GROUP_M": 2}, num_warps=2, num_stages=s)
        for bm in (16, 32)
        for bk in (16, 64)
        for s in (1, 2)
    ]
    bench = Bench(times=[3.0, 1.0, 2.0])

    @autotune_of(impl)(configs=cfgs, key=["M", "N", "K"], do_bench=bench,
                       prune_configs_by={"early_config_prune": early, "perf_model": perf, "top_k": 3})  # fmt: skip
    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        first_pid_m = (pid // num_pid_in_group) * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + (offs_am[:, None] * sam + offs_k[None, :] * sak)
        b_ptrs = b_ptr + (offs_k[:, None] * sbk + offs_bn[None, :] * sbn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        tl.store(c_ptr + scm * offs_cm[:, None] + scn * offs_cn[None, :], acc.to(tl.float16), mask=c_mask)

    torch.manual_seed(0)
    M, N, K = 40, 24, 32
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16).t()  # a transposed weight, as nn.Linear holds it
    c = torch.empty(M, N, dtype=torch.float16)
    grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)  # noqa: E731
    mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=1e-2)
    assert seen["early"] == [("torch.float16", 32, ["grid", "warmup"])]
    # K=32 drops BLOCK_K=64; the perf model ranks the four left; its top 3 are timed in its order
    assert sorted(seen["perf"]) == [(16, 16, 1), (16, 16, 2), (32, 16, 1), (32, 16, 2)]
    assert [(cf.kwargs["BLOCK_M"], cf.num_stages) for cf in mm.configs_timings] == [(16, 2), (16, 1), (32, 2)]
    assert bench.calls == 3 and mm.best_config is cfgs[0] and mm.nargs is None


# ---- one jitted model, four threads: the key is tuned once ---------------------------------------------------
def test_jitted_launcher_from_four_threads_tunes_once():
    seen: list = []
    f = tuner.autotune(
        configs=[{"block": 8}, {"block": 16}],
        key=lambda x: {"n": x.shape[0]},
        bench=_once(seen, lambda b: {8: 2e-3, 16: 1e-3}[b]),
    )(  # fmt: skip
        lambda x, *, block: (seen.append(block), _double_launch(x, block=block, interpret=True))[1]
    )
    barrier = threading.Barrier(4)
    results, errors = [], []

    def work():
        try:
            barrier.wait()
            results.append(np.asarray(jax.jit(lambda x: f(x) + 1.0)(jnp.ones(32))))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4 and all((r == 3.0).all() for r in results)
    assert f.tuner.stats["tuned"] == 1 and seen.count(8) == 1


# ---- a registered kernel's Pallas backend through tuner.kernel, eager and inside jit -----------------------
@pytest.mark.skipif(
    "__import__('jax').default_backend() == 'gpu'",
    reason="the registered Pallas row kernels target TPU and the CPU interpreter; they refuse an NVIDIA GPU",
)
def test_registered_pallas_kernel_through_tuner_kernel_inside_jit():
    from tuner.kernels import get_kernel

    spec = get_kernel("rmsnorm")
    f = tuner.kernel("rmsnorm", backend="pallas", budget=2)
    problem = {"M": 8, "N": 64, "dtype": "float32"}
    inputs = spec.make_inputs(problem, "pallas", 0)
    ref = np.asarray(spec.reference(problem, inputs), np.float32)
    np.testing.assert_allclose(np.asarray(f(problem, inputs), np.float32), ref, rtol=1e-5, atol=1e-5)
    out = jax.jit(lambda inp: f(problem, inp))(inputs)  # the same key, traced: a hit
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=1e-5, atol=1e-5)
    assert f.tuner.stats["tuned"] == 1
    problem16 = {"M": 8, "N": 64, "dtype": "bfloat16"}
    inputs16 = spec.make_inputs(problem16, "pallas", 0)
    out16 = jax.jit(lambda inp: f(problem16, inp))(inputs16)  # a new key, tuned at trace time
    ref16 = np.asarray(spec.reference(problem16, inputs16), np.float32)
    np.testing.assert_allclose(np.asarray(out16, np.float32), ref16, rtol=2e-2, atol=2e-2)
    assert f.tuner.stats["tuned"] == 2


def test_editing_a_callable_objects_call_makes_its_entries_stale(tmp_path, monkeypatch):
    """A callable object is keyed on the source of its class's `__call__` (and what it calls), as a
    function is on its own: an edited `__call__` is a new kernel source, not the old entry."""
    import importlib
    import linecache

    def write(body):
        (tmp_path / "user_layer_mod.py").write_text(
            f"class Op:\n    def __call__(self, x, *, b):\n        return {body}\n", encoding="utf-8"
        )
        linecache.checkcache()
        importlib.invalidate_caches()

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_layer_mod", raising=False)
    write("x * b")
    mod = importlib.import_module("user_layer_mod")
    first = tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=["x"], bench=lambda call: 1e-3)(mod.Op())
    assert first(3) in (3, 6) and first.tuner.stats["tuned"] == 1
    write("x * b + 1  # edited")
    mod = importlib.reload(mod)
    second = tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=["x"], bench=lambda call: 1e-3)(mod.Op())
    assert "kernel source changed" in second.explain(3)
    assert second(3) in (4, 7) and second.tuner.stats["tuned"] == 1
    monkeypatch.delitem(sys.modules, "user_layer_mod")
