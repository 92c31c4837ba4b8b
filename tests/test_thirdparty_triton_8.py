"""An eighth round of the ways libraries use Triton's autotuner, each run with `triton.autotune` and with
the one-line swap to `tuner.autotune` under the Triton interpreter (the pattern of
tests/test_thirdparty_triton.py and the files after it), here for how a library's code and its tests use
autotuned kernels rather than one kernel alone: an autograd.Function whose forward and backward each
launch a kernel of their own (the backward accumulating with atomics, under `reset_to_zero`, tuned at the
first backward) checked by `gradcheck` in float64; a vendored copy of a kernel module under another
name; kernels made anew at every call and by an `lru_cache`d factory per dtype; a `tl.constexpr` global
monkeypatched per test; heuristics that derive the block and `num_warps` from a tuned value; one list
of Configs shared by two decorators; strided and empty inputs; `torch.compile` over a
`torch.library.custom_op` with a fake, and over the autograd.Function.

All of these behaved as with `triton.autotune` when written; they guard the behaviour. The last case,
one `@triton.jit` kernel wrapped by two autotuners with different config lists, is tuner's own: both
share the stored key, so each tuned again in every process, which a warning now names (with the fix,
`name=`). On the CPU the decorators get an injected `do_bench`.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of  # noqa: E402


# ---- an autograd.Function: a forward and a backward kernel, each autotuned --------------------------
def _row_scale(autotune, fwd_bench, bwd_bench):
    @autotune(
        configs=[triton.Config({"BLOCK_N": 2}), triton.Config({"BLOCK_N": 4})],
        key=["M", "N"],
        do_bench=fwd_bench,
    )
    @triton.jit
    def fwd(x, w, y, M, N, stride_x, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = cols < N
        v = tl.load(x + row * stride_x + cols, mask=m) * tl.load(w + cols, mask=m)
        tl.store(y + row * N + cols, v, mask=m)

    # dx = dy * w per row; dw = sum over rows of dy * x, accumulated with atomics by each program
    @autotune(
        configs=[triton.Config({"BLOCK_N": 2}), triton.Config({"BLOCK_N": 8})],
        key=["M", "N"],
        reset_to_zero=["dw"],
        do_bench=bwd_bench,
    )
    @triton.jit
    def bwd(dy, x, w, dx, dw, M, N, stride_x, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = cols < N
        g = tl.load(dy + row * N + cols, mask=m)
        tl.store(dx + row * N + cols, g * tl.load(w + cols, mask=m), mask=m)
        tl.atomic_add(dw + cols, g * tl.load(x + row * stride_x + cols, mask=m), mask=m)

    class RowScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            M, N = x.shape
            y = torch.empty((M, N), dtype=x.dtype)
            fwd[lambda meta: (M, triton.cdiv(N, meta["BLOCK_N"]))](x, w, y, M, N, x.stride(0))
            ctx.save_for_backward(x, w)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            M, N = x.shape
            dy = dy.contiguous()
            dx = torch.empty((M, N), dtype=x.dtype)
            dw = torch.zeros(N, dtype=x.dtype)  # reset_to_zero clears what the timed runs added
            bwd[lambda meta: (M, triton.cdiv(N, meta["BLOCK_N"]))](dy, x, w, dx, dw, M, N, x.stride(0))
            return dx, dw

    return RowScale, fwd, bwd


@pytest.mark.parametrize("impl", IMPLS)
def test_autograd_function_with_a_tuned_backward_that_accumulates_passes_gradcheck(impl):
    fwd_bench, bwd_bench = Bench([2.0, 1.0]), Bench([1.0, 2.0])
    RowScale, fwd, bwd = _row_scale(autotune_of(impl), fwd_bench, bwd_bench)
    torch.manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(RowScale.apply, (x, w))
    assert fwd.best_config.kwargs == {"BLOCK_N": 4} and bwd.best_config.kwargs == {"BLOCK_N": 2}
    assert fwd_bench.calls == 2 and bwd_bench.calls == 2  # each tuned once, at its first call
    # a float32 call: the tensors' dtypes are in both kernels' keys, so each tunes again
    x32 = x.detach().float().requires_grad_()
    w32 = w.detach().float().requires_grad_()
    RowScale.apply(x32, w32).square().sum().backward()
    xr, wr = x32.detach().requires_grad_(), w32.detach().requires_grad_()
    (xr * wr).square().sum().backward()
    torch.testing.assert_close(x32.grad, xr.grad)
    torch.testing.assert_close(w32.grad, wr.grad)
    assert fwd_bench.calls == 4 and bwd_bench.calls == 4
    # a non-contiguous x (a column slice): the row stride is passed, the key is unchanged
    big = torch.randn(2, 7, dtype=torch.float64)
    xs = big[:, 2:5].requires_grad_()
    assert not xs.is_contiguous()
    assert torch.autograd.gradcheck(RowScale.apply, (xs, w))
    assert fwd_bench.calls == 4 and bwd_bench.calls == 4


# ---- one kernel source under two module names (a vendored copy) ---------------------------------------
_VENDORED = """
import triton
import triton.language as tl

import {autotune_module}

CONFIGS = [triton.Config({{"BLOCK": 16}}), triton.Config({{"BLOCK": 32}})]


def make(bench):
    @{autotune_module}.autotune(configs=CONFIGS, key=["n"], do_bench=bench)
    @triton.jit
    def add_one(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

    return add_one


@{autotune_module}.autotune(configs=CONFIGS, key=["n"], do_bench=lambda call, quantiles: [1.0, 1.0, 1.0])
@triton.jit
def twice(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2.0, mask=offs < n)
"""


def _import_as(path, name):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("impl", IMPLS)
def test_a_vendored_copy_of_a_kernel_module_under_another_name(impl, tmp_path):
    import sys

    for pkg in ("lib_a", "lib_b"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("", encoding="utf-8")
        (tmp_path / pkg / "kern.py").write_text(_VENDORED.format(autotune_module=impl), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        a = _import_as(tmp_path / "lib_a" / "kern.py", "lib_a.kern")
        b = _import_as(tmp_path / "lib_b" / "kern.py", "lib_b.kern")
        bench_a, bench_b = Bench([2.0, 1.0]), Bench([1.0, 2.0])
        ka, kb = a.make(bench_a), b.make(bench_b)
        x = torch.randn(40)
        for k in (ka, kb, ka, kb):
            out = torch.empty(40)
            k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, out, 40)
            torch.testing.assert_close(out, x + 1)
        assert ka.best_config.kwargs == {"BLOCK": 32}
        for k in (a.twice, b.twice):
            out = torch.empty(40)
            k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, out, 40)
            torch.testing.assert_close(out, x * 2)
        assert bench_a.calls == 2
        # a kernel is stored under its module's name: the copy is a kernel of its own, tuned apart
        assert bench_b.calls == 2 and kb.best_config.kwargs == {"BLOCK": 16}
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("lib_a", "lib_a.kern", "lib_b", "lib_b.kern"):
            sys.modules.pop(name, None)


# ---- kernels re-created at every call of a library function ---------------------------------------------
def _scale_now(impl, bench, x, factor):
    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], do_bench=bench
    )
    @triton.jit
    def scale(x, out, n, f, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * f, mask=offs < n)

    out = torch.empty_like(x)
    scale[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel(), factor)
    return out, scale


@pytest.mark.parametrize("impl", IMPLS)
def test_a_kernel_made_anew_at_every_call(impl):
    bench = Bench([2.0, 1.0] * 3)
    x = torch.randn(40)
    for f in (1.0, 2.0, 3.0):
        out, k = _scale_now(impl, bench, x, f)
        torch.testing.assert_close(out, x * f)
        assert k.best_config.kwargs == {"BLOCK": 32}
    # Triton's tunes each new kernel object; tuner's finds the first one's winner in the store
    assert bench.calls == (6 if impl == "triton" else 2)


# ---- an lru_cache'd kernel factory, one kernel per dtype ----------------------------------------------
@functools.lru_cache
def _cast_kernel(impl, out_dtype_name, bench):
    OUT = getattr(tl, out_dtype_name)

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], do_bench=bench
    )
    @triton.jit
    def cast(x, out, n, OUT_T: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, (tl.load(x + offs, mask=offs < n) * 2.0).to(OUT_T), mask=offs < n)

    return functools.partial(_launch_cast, cast, OUT)


def _launch_cast(kernel, out_t, x, out):
    kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel(), out_t)
    return kernel


@pytest.mark.parametrize("impl", IMPLS)
def test_an_lru_cached_factory_of_kernels_per_dtype(impl):
    bench = Bench([2.0, 1.0, 1.0, 2.0])
    x = torch.randn(40)
    kernels = {}
    for name, dt in (("float16", torch.float16), ("float32", torch.float32), ("float16", torch.float16)):
        out = torch.empty(40, dtype=dt)
        kernels[name] = _cast_kernel(impl, name, bench)(x, out)
        torch.testing.assert_close(out, (x * 2).to(dt))
    assert bench.calls == 4
    assert kernels["float16"].best_config.kwargs == {"BLOCK": 32}
    assert kernels["float32"].best_config.kwargs == {"BLOCK": 16}
    _cast_kernel.cache_clear()


# ---- a tl.constexpr global changed between tests by monkeypatch ----------------------------------------
SHIFT: tl.constexpr = tl.constexpr(1.0)


def _shift_kernel(impl, bench):
    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], do_bench=bench
    )
    @triton.jit
    def shift(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) + SHIFT, mask=offs < n)

    return shift


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shift", [1.0, 5.0])
def test_a_constexpr_global_monkeypatched_per_test(impl, shift, monkeypatch, _tuner_home):
    monkeypatch.setitem(globals(), "SHIFT", tl.constexpr(shift))
    bench = Bench([2.0, 1.0] if shift == 1.0 else [1.0, 2.0])
    k = _shift_kernel(impl, bench)
    x = torch.randn(40)
    out = torch.empty(40)
    k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, out, 40)
    torch.testing.assert_close(out, x + shift)
    assert k.best_config.kwargs == {"BLOCK": 32 if shift == 1.0 else 16}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_kernel_closing_over_a_constexpr_of_its_factory(impl):
    WIDTH = tl.constexpr(32)

    @autotune_of(impl)(configs=[triton.Config({"BLOCK": 16})], key=["n"])
    @triton.jit
    def k(x, n, BLOCK: tl.constexpr):
        tl.static_assert(BLOCK <= WIDTH)

    with pytest.raises(Exception, match="name 'WIDTH' is not defined"):
        k[(1,)](torch.zeros(1), 1)
    pytest.skip(
        "Triton's interpreter resolves a kernel's names in its module globals only, not closure cells"
    )


# ---- a heuristic that derives the block from a tuned value, and one that sets num_warps ----------------
@pytest.mark.parametrize("impl", IMPLS)
def test_heuristics_derive_the_block_and_num_warps_from_the_tuned_value(impl):
    bench = Bench([2.0, 1.0])

    @autotune_of(impl)(
        configs=[triton.Config({"ROWS": 1}), triton.Config({"ROWS": 2})], key=["n"], do_bench=bench
    )
    @triton.heuristics({"BLOCK": lambda a: a["ROWS"] * 8, "num_warps": lambda a: 2 if a["ROWS"] > 1 else 4})
    @triton.jit
    def double(x, out, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

    metas = []

    def grid(meta):
        metas.append((meta["ROWS"], meta["BLOCK"]))
        return (triton.cdiv(40, meta["BLOCK"]),)

    x = torch.randn(40)
    for _ in range(2):
        out = torch.empty(40)
        double[grid](x, out, 40)
        torch.testing.assert_close(out, x * 2)
    assert metas == [(1, 8), (2, 16), (2, 16), (2, 16)] and bench.calls == 2


# ---- one list of Config objects shared by two decorators -----------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_config_objects_shared_by_two_autotuned_kernels(impl):
    configs = [triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 32}, num_warps=4)]
    before = [(dict(c.kwargs), c.num_warps, c.num_stages, c.pre_hook) for c in configs]
    b1, b2 = Bench([2.0, 1.0]), Bench([1.0, 2.0])

    @autotune_of(impl)(configs=configs, key=["n"], do_bench=b1, reset_to_zero=["out"])
    @triton.jit
    def times2(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

    @autotune_of(impl)(configs=configs, key=["n", "m"], do_bench=b2)
    @triton.jit
    def times3(x, out, n, m, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 3, mask=offs < n)

    x = torch.randn(40)
    for k, extra, f in ((times2, (), 2), (times3, (1,), 3), (times2, (), 2), (times3, (1,), 3)):
        out = torch.empty(40)
        k[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, out, 40, *extra)
        torch.testing.assert_close(out, x * f)
    assert times2.best_config.kwargs == {"BLOCK": 32} and times3.best_config.kwargs == {"BLOCK": 16}
    assert [(c.kwargs, c.num_warps, c.num_stages, c.pre_hook) for c in configs] == before
    assert times2.configs is configs and times3.configs is configs and b1.calls == b2.calls == 2


# ---- strided inputs with the stride in the key, and empty inputs ---------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("empty", ["returns_early", "launches_an_empty_grid"])
def test_strided_and_empty_inputs(impl, empty):
    bench = Bench([2.0, 1.0] * 5)

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
        key=["n", "stride"],
        reset_to_zero=["total"],
        do_bench=bench,
    )
    @triton.jit
    def double_and_sum(x, out, total, n, stride, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + offs * stride, mask=offs < n, other=0.0)
        tl.store(out + offs, v * 2, mask=offs < n)
        tl.atomic_add(total, tl.sum(v, 0))

    def wrapper(x):
        out, total = torch.empty(x.numel()), torch.zeros(1)
        if empty == "returns_early" and x.numel() == 0:
            return out, total
        grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
        double_and_sum[grid](x, out, total, x.numel(), x.stride(0))
        return out, total

    inputs = [
        torch.randn(0),
        torch.randn(80)[::2],
        torch.randn(40),
        torch.randn(10, 4)[:, 1],
        torch.empty(0, 3)[:, 0],
    ]
    for x in inputs:
        out, total = wrapper(x)
        torch.testing.assert_close(out, x * 2)
        torch.testing.assert_close(total, x.sum().reshape(1), atol=1e-5, rtol=1e-5)
    keys = [k[:2] for k in double_and_sum.cache]
    if empty == "returns_early":
        assert keys == [(40, 2), (40, 1), (10, 4)] and bench.calls == 6
    else:
        assert keys == [(0, 1), (40, 2), (40, 1), (10, 4), (0, 3)] and bench.calls == 10


# ---- torch.compile over a custom_op (with a fake) that launches the kernel -----------------------------
def test_torch_compile_of_a_custom_op_with_register_fake():
    """tuner's only, to keep the file fast: Triton's autotuner behaves the same (seen when this was written)."""
    impl = "tuner"
    bench = Bench([2.0, 1.0, 1.0, 2.0])

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], do_bench=bench
    )
    @triton.jit
    def affine(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2 + 1, mask=offs < n)

    @torch.library.custom_op(f"tuner_tests_8_{impl}::affine", mutates_args=())
    def affine_op(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        affine[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
        return out

    @affine_op.register_fake
    def _(x):
        return torch.empty_like(x)

    torch._dynamo.reset()
    f = torch.compile(lambda x: affine_op(x.sin()).cos(), fullgraph=True, backend="aot_eager")
    for n in (40, 40, 24):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), (x.sin() * 2 + 1).cos())
    assert bench.calls == 4 and affine.best_config.kwargs == {"BLOCK": 16}
    torch._dynamo.reset()


# ---- torch.compile of the autograd.Function above: the drop-in compiles, forward and backward ----------
def test_torch_compile_of_the_autograd_function_with_tuned_forward_and_backward():
    """tuner's only: Triton's autotuner of an interpreted kernel cannot be compiled by torch on a CPU."""
    fwd_bench, bwd_bench = Bench([2.0, 1.0] * 2), Bench([1.0, 2.0] * 2)
    RowScale, fwd, bwd = _row_scale(tuner.autotune, fwd_bench, bwd_bench)
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: RowScale.apply(x, w).sum(), dynamic=True, backend="aot_eager")
    for M in (3, 4, 4):
        x = torch.randn(M, 5, requires_grad=True)
        w = torch.randn(5, requires_grad=True)
        f(x, w).backward()
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        (xr * wr).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(w.grad, wr.grad)
    assert fwd_bench.calls == bwd_bench.calls == 4 and len(fwd.cache) == len(bwd.cache) == 2
    torch._dynamo.reset()


# ---- one @triton.jit kernel wrapped by two autotuners with different config lists ---------------------
@triton.jit
def _plus_one(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


def test_one_kernel_under_two_config_lists_is_named_in_a_warning_and_name_parts_them(caplog):
    """Both autotuners store under the kernel's module.qualname with the same code: each one's tuning
    replaced the other's winner, so every process tuned both again, and nothing said why."""
    small_cfgs = [triton.Config({"BLOCK": 8}), triton.Config({"BLOCK": 16})]
    big_cfgs = [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})]
    x = torch.randn(40)

    def one_process(names):
        benches = Bench([2.0, 1.0]), Bench([2.0, 1.0])
        kernels = [
            tuner.autotune(configs=cfgs, key=["n"], do_bench=b, **({"name": nm} if nm else {}))(_plus_one)
            for cfgs, b, nm in zip((small_cfgs, big_cfgs), benches, names, strict=True)
        ]
        for k in kernels * 2:
            out = torch.empty(40)
            k[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, out, 40)
            torch.testing.assert_close(out, x + 1)
        return [b.calls for b in benches]

    with caplog.at_level("WARNING", logger="tuner"):
        assert one_process((None, None)) == [2, 2]
        assert one_process((None, None)) == [2, 2]  # another process: both tune again
    warned = [r.getMessage() for r in caplog.records if "same name" in r.getMessage()]
    assert len(warned) == 1 and "_plus_one" in warned[0] and "give each its own `name=`" in warned[0]
    assert one_process(("plus_one_small", "plus_one_big")) == [2, 2]
    assert one_process(("plus_one_small", "plus_one_big")) == [0, 0]  # each finds its own winner
