"""Triton kernels that other projects wrote, with their own autotune decorations and launchers, run with
`triton.autotune` and with the one-line swap to `tuner.autotune` under the Triton interpreter.

tests/test_triton_conformance.py checks each keyword of triton.autotune alone, tests/test_foreign_kernels.py
and tests/test_triton_real_kernels.py check this project's kernels written in the style of public ones.
Here the kernels are transcribed (kernel, decoration and launcher; trimmed, never extended) from
permissively licensed repositories named in each section, and the code around them does what those
projects' code does with the kernel object: a torch.autograd.Function around it, `@triton.heuristics`
above it keying on what the heuristics set, a grid sized by a tuned meta-parameter, a model deep-copied
with the kernel it holds, a vendor test that assigns the autotuner's `do_bench`, a wrapper assigned to
`kernel.run` that records each launch.

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), so the
winner is known in advance and the two can be compared.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from tests._env import repo_pythonpath  # noqa: E402
from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of  # noqa: E402


# ---- attorch (github.com/BobMcDear/attorch, MIT): softmax_kernels.py / softmax_layers.py ---------------
# Configs that differ only in num_warps (empty kwargs), a @triton.heuristics beneath the autotuner that
# supplies both block sizes, a grid that reads the heuristic's BLOCK_SIZE_BATCH, `log` passed by keyword,
# and the autograd.Function that launches it (its backward kernel, decorated the same way, left out).
def _attorch_softmax(autotune, bench):
    def BLOCK_SIZE_BATCH_heuristic(args):
        return (
            min(max(1, triton.next_power_of_2(args["batch_dim"] // 2**10)), 128)
            if args["feat_dim"] < 64
            else 1
        )

    heuristics = triton.heuristics(
        {
            "BLOCK_SIZE_BATCH": BLOCK_SIZE_BATCH_heuristic,
            "BLOCK_SIZE_FEAT": lambda args: triton.next_power_of_2(args["feat_dim"]),
        }
    )

    @autotune(
        configs=[triton.Config({}, num_warps=2**i) for i in range(6)],
        key=["batch_dim", "feat_dim"],
        do_bench=bench,
    )
    @heuristics
    @triton.jit
    def softmax_forward_kernel(
        input_pointer, output_pointer, batch_dim, feat_dim, input_batch_stride, input_feat_stride,
        log: tl.constexpr, BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_FEAT: tl.constexpr,
    ):  # fmt: skip
        batch_pid = tl.program_id(axis=0)
        batch_offset = batch_pid * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
        feat_offset = tl.arange(0, BLOCK_SIZE_FEAT)
        batch_mask = batch_offset < batch_dim
        feat_mask = feat_offset < feat_dim
        input_pointer += input_batch_stride * batch_offset[:, None] + input_feat_stride * feat_offset[None, :]
        output_pointer += feat_dim * batch_offset[:, None] + feat_offset[None, :]
        input = tl.load(input_pointer, mask=batch_mask[:, None] & feat_mask[None, :], other=-float("inf"))
        input -= tl.max(input, axis=1)[:, None]
        numerator = tl.exp(input)
        denominator = tl.sum(numerator, axis=1)[:, None]
        if log:  # noqa: SIM108 - as written upstream
            output = input - tl.log(denominator)
        else:
            output = numerator / denominator
        tl.store(output_pointer, output, mask=batch_mask[:, None] & feat_mask[None, :])

    class SoftmaxAutoGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, log):
            flattened_input = input.unsqueeze(0) if input.ndim == 1 else input
            flattened_input = flattened_input.flatten(0, -2)
            batch_dim, feat_dim = flattened_input.shape
            output = torch.empty_like(flattened_input)
            grid = lambda META: (triton.cdiv(batch_dim, META["BLOCK_SIZE_BATCH"]),)  # noqa: E731
            softmax_forward_kernel[grid](
                flattened_input, output, batch_dim, feat_dim, *flattened_input.stride(), log=log
            )
            return output.view_as(input)

    return SoftmaxAutoGrad, softmax_forward_kernel


@pytest.mark.parametrize("impl", IMPLS)
def test_attorch_softmax_in_its_autograd_function(impl):
    bench = Bench(times=[6.0, 5.0, 1.0, 4.0, 3.0, 2.0] * 2)  # num_warps=4 wins
    SoftmaxAutoGrad, fwd = _attorch_softmax(autotune_of(impl), bench)
    torch.manual_seed(0)
    for shape, log in (((3, 5, 40), False), ((24, 16), True), ((3, 5, 40), True)):
        x = torch.randn(*shape)
        ref = (torch.log_softmax if log else torch.softmax)(x, dim=-1)
        torch.testing.assert_close(SoftmaxAutoGrad.apply(x, log), ref)
    # the key is (batch_dim, feat_dim) and the dtypes; `log` is not in it: the third call is a hit
    assert bench.calls == 12
    assert sorted(fwd.cache) == [
        (15, 40, "torch.float32", "torch.float32"),
        (24, 16, "torch.float32", "torch.float32"),
    ]
    assert fwd.best_config.num_warps == 4 and fwd.best_config.kwargs == {}
    assert fwd.configs_timings[fwd.best_config] == [1.0, 1.0, 1.0]


# ---- flash-linear-attention (github.com/fla-org/flash-linear-attention, MIT): fla/ops/utils/cumsum.py ---
# chunk_global_cumsum_scalar_kernel: @triton.heuristics *above* the autotuner setting HAS_SCALE/IS_VARLEN
# from whether optional arguments are None, a key that names IS_VARLEN (set by those heuristics) and
# REVERSE (a call keyword), @triton.jit(do_not_specialize=['T']), every argument passed by keyword.
# (Configs trimmed from 4 x 3 x 4 to 2 x 2 x 1.)
def _fla_global_cumsum(autotune, bench):
    @triton.heuristics(
        {
            "HAS_SCALE": lambda args: args["scale"] is not None,
            "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        }
    )
    @autotune(
        configs=[
            triton.Config({"BT": BT}, num_warps=num_warps, num_stages=num_stages)
            for BT in [16, 32]
            for num_warps in [2, 4]
            for num_stages in [1]
        ],
        key=["B", "H", "IS_VARLEN", "REVERSE"],
        do_bench=bench,
    )
    @triton.jit(do_not_specialize=["T"])
    def chunk_global_cumsum_scalar_kernel(
        s, o, scale, cu_seqlens, T, B: tl.constexpr, H: tl.constexpr, BT: tl.constexpr,
        REVERSE: tl.constexpr, HAS_SCALE: tl.constexpr, IS_VARLEN: tl.constexpr, HEAD_FIRST: tl.constexpr,
    ):  # fmt: skip
        i_nh = tl.program_id(0).to(tl.int64)
        i_n, i_h = i_nh // H, i_nh % H
        if IS_VARLEN:
            bos, eos = tl.load(cu_seqlens + i_n).to(tl.int64), tl.load(cu_seqlens + i_n + 1).to(tl.int64)
            boh = i_h * T + bos
        else:
            bos, eos = i_n * T, i_n * T + T
            boh = bos * H + i_h * T
        T = eos - bos
        b_z = tl.zeros([], dtype=tl.float32)
        NT = tl.cdiv(T, BT)
        for i_c in range(NT):
            i_t = NT - 1 - i_c if REVERSE else i_c
            o_t = i_t * BT + tl.arange(0, BT)
            m_t = o_t < T
            if HEAD_FIRST:
                p_s = s + boh + o_t
                p_o = o + boh + o_t
            else:
                p_s = s + bos * H + i_h + o_t * H
                p_o = o + bos * H + i_h + o_t * H
            b_s = tl.load(p_s, mask=m_t, other=0.0).to(tl.float32)
            b_o = tl.cumsum(b_s, axis=0)
            b_ss = tl.sum(b_s, 0)
            if REVERSE:
                b_o = -b_o + b_ss + b_s
            b_o += b_z
            if i_c >= 0:
                b_z += b_ss
            if HAS_SCALE:
                b_o *= scale
            tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_t)

    def chunk_global_cumsum_scalar(s, reverse=False, cu_seqlens=None, scale=None, head_first=False):
        if head_first:
            B, H, T = s.shape
        else:
            B, T, H = s.shape
        N = len(cu_seqlens) - 1 if cu_seqlens is not None else B
        z = torch.empty_like(s, dtype=torch.float)
        grid = (N * H,)
        chunk_global_cumsum_scalar_kernel[grid](
            s=s,
            o=z,
            scale=scale,
            cu_seqlens=cu_seqlens,
            T=T,
            B=B,
            H=H,
            HEAD_FIRST=head_first,
            REVERSE=reverse,
        )
        return z

    return chunk_global_cumsum_scalar_kernel, chunk_global_cumsum_scalar


@pytest.mark.parametrize("impl", IMPLS)
def test_fla_global_cumsum_keys_on_what_the_heuristics_above_set(impl):
    bench = Bench(times=[4.0, 3.0, 1.0, 2.0] * 4)  # BT=32, num_warps=2 wins every key
    kernel, cumsum = _fla_global_cumsum(autotune_of(impl), bench)
    torch.manual_seed(0)
    s = torch.randn(2, 40, 3)
    torch.testing.assert_close(cumsum(s), s.cumsum(1))
    torch.testing.assert_close(cumsum(s, reverse=True), s.flip(1).cumsum(1).flip(1))
    torch.testing.assert_close(cumsum(s, scale=0.5), 0.5 * s.cumsum(1))  # HAS_SCALE is not keyed: a hit
    cu = torch.tensor([0, 30, 80], dtype=torch.int32)
    v = torch.randn(1, 80, 3)
    ref = torch.cat([v[:, :30].cumsum(1), v[:, 30:].cumsum(1)], dim=1)
    torch.testing.assert_close(cumsum(v, cu_seqlens=cu), ref)  # IS_VARLEN is keyed: tuned again
    torch.testing.assert_close(
        cumsum(s.transpose(1, 2).contiguous(), head_first=True), s.cumsum(1).transpose(1, 2)
    )
    assert bench.calls == 12
    autotuner = kernel.fn  # the Heuristics' inner function
    assert isinstance(autotuner, triton.runtime.Autotuner)
    assert sorted(autotuner.cache, key=str) == sorted(
        [
            (2, 3, False, False, "torch.float32", "torch.float32"),
            (2, 3, False, True, "torch.float32", "torch.float32"),
            (1, 3, True, False, "torch.float32", "torch.float32", "torch.int32"),
        ],
        key=str,
    )
    assert autotuner.best_config.kwargs == {"BT": 32} and autotuner.best_config.num_warps == 2


# ---- Triton tutorial 08, grouped GEMM (github.com/triton-lang/triton, MIT) ------------------------------
# Tables of device pointers and of per-problem sizes, a persistent grid sized by the tuned NUM_SM, and a
# key (group_size) that does not see the problem sizes. (Block sizes and NUM_SM scaled down for the
# interpreter.)
def _grouped_gemm(autotune, bench):
    @autotune(
        configs=[
            triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "NUM_SM": 2}),
            triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "NUM_SM": 4}),
            triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "NUM_SM": 2}),
            triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "NUM_SM": 4}),
        ],
        key=["group_size"],
        do_bench=bench,
    )
    @triton.jit
    def grouped_matmul_kernel(
        group_a_ptrs, group_b_ptrs, group_c_ptrs, group_gemm_sizes, g_lds, group_size,
        NUM_SM: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    ):  # fmt: skip
        tile_idx = tl.program_id(0)
        last_problem_end = 0
        for g in range(group_size):
            gm = tl.load(group_gemm_sizes + g * 3)
            gn = tl.load(group_gemm_sizes + g * 3 + 1)
            gk = tl.load(group_gemm_sizes + g * 3 + 2)
            num_m_tiles = tl.cdiv(gm, BLOCK_SIZE_M)
            num_n_tiles = tl.cdiv(gn, BLOCK_SIZE_N)
            num_tiles = num_m_tiles * num_n_tiles
            while tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles:
                k = gk
                lda = tl.load(g_lds + g * 3)
                ldb = tl.load(g_lds + g * 3 + 1)
                ldc = tl.load(g_lds + g * 3 + 2)
                a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
                b_ptr = tl.load(group_b_ptrs + g).to(tl.pointer_type(tl.float16))
                c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
                tile_idx_in_gemm = tile_idx - last_problem_end
                tile_m_idx = tile_idx_in_gemm // num_n_tiles
                tile_n_idx = tile_idx_in_gemm % num_n_tiles
                offs_am = tile_m_idx * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
                offs_bn = tile_n_idx * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
                offs_k = tl.arange(0, BLOCK_SIZE_K)
                a_ptrs = a_ptr + offs_am[:, None] * lda + offs_k[None, :]
                b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_bn[None, :]
                accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for _kk in range(0, tl.cdiv(k, BLOCK_SIZE_K)):
                    a = tl.load(a_ptrs)
                    b = tl.load(b_ptrs)
                    accumulator += tl.dot(a, b)
                    a_ptrs += BLOCK_SIZE_K
                    b_ptrs += BLOCK_SIZE_K * ldb
                c = accumulator.to(tl.float16)
                offs_cm = tile_m_idx * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
                offs_cn = tile_n_idx * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
                c_ptrs = c_ptr + ldc * offs_cm[:, None] + offs_cn[None, :]
                tl.store(c_ptrs, c)
                tile_idx += NUM_SM
            last_problem_end = last_problem_end + num_tiles

    def group_gemm_fn(group_A, group_B):
        group_size = len(group_A)
        A_addrs, B_addrs, C_addrs, g_sizes, g_lds, group_C = [], [], [], [], [], []
        for A, B in zip(group_A, group_B, strict=True):
            (M, K), (_, N) = A.shape, B.shape
            C = torch.empty((M, N), dtype=A.dtype)
            group_C.append(C)
            A_addrs.append(A.data_ptr())
            B_addrs.append(B.data_ptr())
            C_addrs.append(C.data_ptr())
            g_sizes += [M, N, K]
            g_lds += [A.stride(0), B.stride(0), C.stride(0)]
        d_a_ptrs, d_b_ptrs, d_c_ptrs = torch.tensor(A_addrs), torch.tensor(B_addrs), torch.tensor(C_addrs)
        d_g_sizes = torch.tensor(g_sizes, dtype=torch.int32)
        d_g_lds = torch.tensor(g_lds, dtype=torch.int32)
        grid = lambda META: (META["NUM_SM"],)  # noqa: E731
        grouped_matmul_kernel[grid](d_a_ptrs, d_b_ptrs, d_c_ptrs, d_g_sizes, d_g_lds, group_size)
        return group_C

    return grouped_matmul_kernel, group_gemm_fn


@pytest.mark.parametrize("impl", IMPLS)
def test_tutorial_grouped_gemm_with_pointer_tables(impl):
    bench = Bench(times=[3.0, 4.0, 2.0, 1.0])  # 16x16 tiles on 4 programs win
    kernel, group_gemm_fn = _grouped_gemm(autotune_of(impl), bench)
    torch.manual_seed(0)
    sizes = [(64, 32, 32), (32, 64, 16)]
    group_A = [torch.rand((m, k), dtype=torch.float16) for m, _, k in sizes]
    group_B = [torch.rand((k, n), dtype=torch.float16) for _, n, k in sizes]
    for _ in range(2):  # the second call is a hit
        out = group_gemm_fn(group_A, group_B)
        for a, b, c in zip(group_A, group_B, out, strict=True):
            torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=1e-2, rtol=1e-2)
    assert bench.calls == 4
    assert kernel.best_config.kwargs["NUM_SM"] == 4 and kernel.best_config.kwargs["BLOCK_SIZE_M"] == 16
    assert list(kernel.cache) == [(2,) + ("torch.int64",) * 3 + ("torch.int32",) * 2]


# ---- Triton's python/test/unit/runtime/test_autotuner.py (MIT): test_exceed_threads's launch ------------
# configs that set only num_warps, keyed on a constexpr that the call passes by keyword.
@pytest.mark.parametrize("impl", IMPLS)
def test_key_on_a_constexpr_the_call_passes(impl):
    bench = Bench(times=[2.0, 1.0, 1.0, 2.0])

    @autotune_of(impl)(
        configs=[triton.Config({}, num_warps=8), triton.Config({}, num_warps=4)],
        key=["BLOCK_SIZE"],
        do_bench=bench,
    )
    @triton.jit
    def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        tl.store(
            output_ptr + offsets,
            tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
            mask=mask,
        )

    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    warps = []
    for bs in (32, 64, 32):
        add_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_SIZE"]),)](
            x, y, out, x.numel(), BLOCK_SIZE=bs
        )
        torch.testing.assert_close(out, x + y)
        warps.append(add_kernel.best_config.num_warps)
    assert bench.calls == 4 and warps == [4, 8, 4]
    assert sorted(add_kernel.cache) == [(32,) + ("torch.float32",) * 3, (64,) + ("torch.float32",) * 3]


# ---- what code around the kernels does with the kernel object -------------------------------------------
def _fill_kernel(impl, bench, **kw):
    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["N"], do_bench=bench, **kw
    )
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)

    return fill


def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("cache_results", [None, False])
def test_a_model_deep_copied_with_the_kernel_it_holds(impl, cache_results):
    """copy.deepcopy of an nn.Module whose attribute is the autotuned kernel (EMA / teacher copies): the
    copy launches with the config already chosen, without timing again, and has a `.cache` of its own."""
    bench = Bench(times=[2.0, 1.0])
    opts = {} if cache_results is None else {"cache_results": cache_results}

    class Filler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kernel = _fill_kernel(impl, bench, **opts)

        def forward(self, n):
            out = torch.zeros(n)
            self.kernel[_grid(n)](out, n)
            return out

    model = Filler()
    assert torch.equal(model(40), torch.full((40,), 32.0))
    twin = copy.deepcopy(model)
    assert twin.kernel is not model.kernel and isinstance(twin.kernel, triton.runtime.Autotuner)
    assert torch.equal(twin(40), torch.full((40,), 32.0))
    assert bench.calls == 2  # the copy did not tune again
    assert twin.kernel.best_config.kwargs == {"BLOCK": 32} and list(twin.kernel.cache) == list(
        model.kernel.cache
    )
    twin.kernel.cache.clear()  # its own: the original keeps its entry
    assert len(model.kernel.cache) == 1
    assert torch.equal(model(40), torch.full((40,), 32.0)) and bench.calls == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_do_bench_assigned_on_the_autotuner_times_the_next_tuning(impl):
    """Vendor test suites swap the timer of an autotuner already built (`tuner.do_bench = ...`; Triton's
    `do_bench` is a cached property, so the assignment sticks)."""
    decorated = Bench(times=[2.0, 1.0])
    k = _fill_kernel(impl, decorated)
    assigned = Bench(times=[1.0, 2.0])
    k.do_bench = assigned
    assert k.do_bench is assigned
    out = torch.zeros(40)
    k[_grid(40)](out, 40)
    assert (decorated.calls, assigned.calls) == (0, 2)
    assert torch.equal(out, torch.full((40,), 16.0)) and k.best_config.kwargs == {"BLOCK": 16}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_run_assigned_on_the_instance_is_what_a_launch_calls(impl):
    """`kernel.run = capture(kernel.run)`: profiling and debugging code records (or replaces) every launch
    this way, and `kernel[grid](...)` goes through it, as Triton's `kernel[grid]` calls `self.run`."""
    bench = Bench(times=[2.0, 1.0])
    k = _fill_kernel(impl, bench)
    seen = []
    original = k.run

    def capture(*args, **kwargs):
        seen.append((len(args), sorted(kwargs)))
        original(*args, **kwargs)
        return "captured"

    k.run = capture
    out = torch.zeros(40)
    assert k[_grid(40)](out, 40) == "captured"
    assert k[_grid(40)](out, N=40) == "captured"
    assert seen == [(2, ["grid", "warmup"]), (1, ["N", "grid", "warmup"])]
    assert torch.equal(out, torch.full((40,), 32.0)) and bench.calls == 2
    del k.run  # back to the class's run
    assert k[_grid(40)](out, 40) != "captured" and len(seen) == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_an_explicit_launch_option_that_the_configs_set_is_refused(impl):
    """vLLM-style launches pass a config dict's num_warps explicitly; on an autotuned kernel both
    decorators refuse it rather than run with one of the two silently (Triton with a TypeError at the
    launch after tuning, tuner with Triton's 'Conflicting meta-parameters' ValueError before it)."""
    k = _fill_kernel(impl, Bench())
    with pytest.raises((TypeError, ValueError), match="num_warps"):
        k[_grid(40)](torch.zeros(40), 40, num_warps=2)


class _ScaledConfig(triton.Config):
    """A Config whose `all_kwargs()` adds a launch meta-parameter (what FlagGems does to `Config.all_kwargs`
    for its extra launch options on older Triton; Triton launches with `**config.all_kwargs()`)."""

    def __init__(self, kwargs, scale=1, **opts):
        super().__init__(kwargs, **opts)
        self.scale = scale

    def all_kwargs(self):
        return {**super().all_kwargs(), "SCALE": self.scale}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_config_subclass_launches_with_its_all_kwargs(impl):
    cfgs = [_ScaledConfig({"BLOCK": 16}, scale=2), _ScaledConfig({"BLOCK": 32}, scale=3, num_warps=2)]
    bench = Bench(times=[2.0, 1.0])

    @autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr, SCALE: tl.constexpr = 1):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK * SCALE, tl.float32), mask=offs < N)

    for _ in range(2):  # tuned, then a hit
        out = torch.zeros(40)
        fill[_grid(40)](out, 40)
        assert torch.equal(out, torch.full((40,), 96.0))
    assert bench.calls == 2 and fill.best_config is cfgs[1]


def test_the_gpu_check_script_runs_on_the_interpreter(tmp_path):
    """benchmarks/thirdparty_gpu_check.py repeats the checks above where only a GPU shows them (the
    compiled kernel a launch returns); its CPU self-test keeps it in step with the code. Without TUNER_HOME
    it makes a temporary one, and removes it at exit (it left one in the temporary folder on every run)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TUNER_HOME"}
    (tmp := tmp_path / "tmp").mkdir()
    env |= {"TMPDIR": str(tmp), "PYTHONPATH": repo_pythonpath(), "TRITON_INTERPRET": "1"}
    p = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "thirdparty_gpu_check.py"), "--allow-cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        encoding="utf-8",
    )
    assert p.returncode == 0 and p.stdout.rstrip().endswith("same"), p.stdout + p.stderr
    assert list(tmp.iterdir()) == []
