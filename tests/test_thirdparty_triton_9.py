"""A ninth round of real projects' uses of Triton's autotuner, each run with `triton.autotune` and with the
one-line swap to `tuner.autotune` under the Triton interpreter (the pattern of tests/test_thirdparty_triton.py
and the files after it, for projects and uses those files do not cover). The kernels are small
re-implementations that keep each project's decoration, launcher and calling code as written there (cited in
each section); the kernel bodies are trimmed to what the decoration needs:

- flash-attention (github.com/Dao-AILab/flash-attention, BSD-3-Clause), flash_attn/flash_attn_triton.py:
  `_bwd_kernel`, whose two configs differ in a tuned bool (`SEQUENCE_PARALLEL`) that the grid reads and
  each carry `pre_hook=init_to_zero('DQ')`, the launch's only zeroing of an `empty_like` accumulator (the
  one-block loop reads and adds to it, the parallel one `atomic_add`s); `@triton.heuristics` beneath
  (EVEN_M/EVEN_N/EVEN_HEADDIM); a key of positional arguments that exist only to be keyed
  (`seqlen_q // 32`, a bias-type string, `causal`); launched from a `torch.autograd.Function.backward`
  under `torch.inference_mode()` into one slice of a packed gradient.
- attorch (github.com/BobMcDear/attorch, MIT), attorch/batch_norm_kernels.py: `restore_value` on the
  running mean and variance that a training launch moves by `momentum` in place, configs that differ only
  in `num_warps` (`warps_kernel_configs()`), and block sizes that a `@triton.heuristics` beneath derives
  from the arguments; called from an autograd.Function in training, then in eval (which reads the stats).
- flash-linear-attention, as SGLang carries it (github.com/sgl-project/sglang, Apache-2.0, from
  fla-org/flash-linear-attention, MIT): python/sglang/srt/layers/attention/fla/cumsum.py,
  `chunk_local_cumsum_vector_kernel`: `@triton.jit(do_not_specialize=["T"])`, a launch by keyword only
  with `None` for `scale`, `cu_seqlens` and `chunk_indices`, a key of constexpr flags, a grid that reads an
  argument (`meta["S"]`) besides the tuned `BS`, and the variable-length path (`IS_VARLEN`).
- Megatron-LM (github.com/NVIDIA/Megatron-LM, BSD-3-Clause),
  megatron/core/fusions/fused_mla_yarn_rope_apply.py: `_mla_rope_fwd_inplace_kernel` and its backward,
  RoPE applied in place to a view of Q (`restore_value=["Q"]`, and `["DO"]` on the incoming gradient),
  with `None` passed for plain (non-constexpr) arguments, a launch that mixes positional arguments and
  keywords, inside `_FusedMLARoPEInplace` (an autograd.Function whose forward returns its input, changed).

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), so the
winner is known in advance and the two can be compared.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of  # noqa: E402

# fla's kernels address their tiles with tl.make_block_ptr, which triton 3.7 deprecates
pytestmark = pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated:UserWarning")


# ---- flash-attention: _bwd_kernel's SEQUENCE_PARALLEL configs with init_to_zero('DQ') ---------------------
def _flash_bwd(autotune, bench, zeroed):
    def init_to_zero(name):  # flash_attn_triton.py's, counting its calls
        def hook(nargs):
            zeroed.append(name)
            nargs[name].zero_()

        return hook

    @autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": 16, "BLOCK_N": 16, "SEQUENCE_PARALLEL": False},
                num_warps=8,
                num_stages=1,
                pre_hook=init_to_zero("DQ"),
            ),
            triton.Config(
                {"BLOCK_M": 16, "BLOCK_N": 16, "SEQUENCE_PARALLEL": True},
                num_warps=8,
                num_stages=1,
                pre_hook=init_to_zero("DQ"),
            ),
        ],
        key=["CACHE_KEY_SEQLEN_Q", "CACHE_KEY_SEQLEN_K", "BIAS_TYPE", "IS_CAUSAL", "BLOCK_HEADDIM"],
        do_bench=bench,
    )
    @triton.heuristics(
        {
            "EVEN_M": lambda args: args["seqlen_q"] % args["BLOCK_M"] == 0,
            "EVEN_N": lambda args: args["seqlen_k"] % args["BLOCK_N"] == 0,
            "EVEN_HEADDIM": lambda args: args["headdim"] == args["BLOCK_HEADDIM"],
        }
    )
    @triton.jit
    def _bwd_kernel(Q, K, DQ, softmax_scale, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                    stride_dqb, stride_dqh, stride_dqm, nheads, seqlen_q, seqlen_k, headdim,
                    CACHE_KEY_SEQLEN_Q, CACHE_KEY_SEQLEN_K, BIAS_TYPE: tl.constexpr, IS_CAUSAL: tl.constexpr,
                    BLOCK_HEADDIM: tl.constexpr, SEQUENCE_PARALLEL: tl.constexpr, EVEN_M: tl.constexpr,
                    EVEN_N: tl.constexpr, EVEN_HEADDIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):  # fmt: skip
        # dq = (q k^T * scale) k, per (batch, head): the dS @ K product of the original, dS left at q k^T
        off_hb = tl.program_id(1)
        off_b = off_hb // nheads
        off_h = off_hb % nheads
        Q += off_b * stride_qb + off_h * stride_qh
        K += off_b * stride_kb + off_h * stride_kh
        DQ += off_b * stride_dqb + off_h * stride_dqh
        offs_d = tl.arange(0, BLOCK_HEADDIM)
        num_block_n = tl.cdiv(seqlen_k, BLOCK_N)
        n_lo = tl.program_id(0) if SEQUENCE_PARALLEL else 0
        n_hi = tl.program_id(0) + 1 if SEQUENCE_PARALLEL else num_block_n
        for start_n in range(n_lo, n_hi):
            offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
            k_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < headdim)
            k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=k_mask, other=0.0)
            for start_m in range(0, seqlen_q, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                m_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < headdim)
                q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=m_mask, other=0.0)
                ds = tl.dot(q, tl.trans(k)) * softmax_scale
                if IS_CAUSAL:
                    ds = tl.where(offs_m[:, None] >= offs_n[None, :], ds, 0.0)
                dq_ptrs = DQ + offs_m[:, None] * stride_dqm + offs_d[None, :]
                if not SEQUENCE_PARALLEL:  # reads what the accumulator holds: init_to_zero('DQ') zeroed it
                    dq = tl.load(dq_ptrs, mask=m_mask, other=0.0)
                    tl.store(dq_ptrs, dq + tl.dot(ds, k), mask=m_mask)
                else:
                    tl.atomic_add(dq_ptrs, tl.dot(ds, k), mask=m_mask)

    return _bwd_kernel


def _flash_backward(kernel, q, k, dq, causal, softmax_scale):
    """_flash_attn_backward, for the dq part: an fp32 `empty_like` accumulator, copied into `dq` after."""
    batch, seqlen_q, nheads, d = q.shape
    _, seqlen_k, _, _ = k.shape
    dq_accum = torch.empty_like(q, dtype=torch.float32)
    BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)
    bias_type = "none"
    grid = lambda META: (triton.cdiv(seqlen_k, META["BLOCK_N"]) if META["SEQUENCE_PARALLEL"] else 1,  # noqa: E731
                         batch * nheads)  # fmt: skip
    kernel[grid](
        q, k, dq_accum, softmax_scale,
        q.stride(0), q.stride(2), q.stride(1),
        k.stride(0), k.stride(2), k.stride(1),
        dq_accum.stride(0), dq_accum.stride(2), dq_accum.stride(1),
        nheads, seqlen_q, seqlen_k, d,
        seqlen_q // 32, seqlen_k // 32,  # key for triton cache (limit number of compilations)
        bias_type, causal, BLOCK_HEADDIM,
    )  # fmt: skip
    dq.copy_(dq_accum)


def _flash_function(kernel):
    class FlashAttnKVPackedDQ(torch.autograd.Function):
        """FlashAttnKVPackedFunc's shape: q and a packed kv, the backward under inference_mode."""

        @staticmethod
        def forward(ctx, q, kv, causal=False):
            ctx.save_for_backward(q, kv)
            ctx.causal = causal
            return q.clone()

        @staticmethod
        def backward(ctx, do):
            q, kv = ctx.saved_tensors
            # "Triton's autotune causes the Tensor._version to change, and so Pytorch autograd
            # does a memcpy. To avoid this we run in inference_mode" (the original's comment)
            with torch.inference_mode():
                dq = torch.empty_like(q)
                dkv = torch.empty_like(kv)
                _flash_backward(kernel, q, kv[:, :, 0], dq, ctx.causal, 1.0 / math.sqrt(q.shape[-1]))
                dkv.zero_()
            return dq, dkv, None

    return FlashAttnKVPackedDQ


def _flash_dq_ref(q, k, causal):
    s = torch.einsum("bmhd,bnhd->bhmn", q.double(), k.double()) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), 0.0)
    return torch.einsum("bhmn,bnhd->bmhd", s, k.double())


@pytest.mark.parametrize("impl", IMPLS)
def test_flash_attn_bwd_sequence_parallel_config_zeroes_dq_before_every_run(impl):
    bench = Bench(times=[2.0, 1.0])  # SEQUENCE_PARALLEL=True (atomic adds) wins
    zeroed = []
    kernel = _flash_bwd(autotune_of(impl), bench, zeroed)
    fn = _flash_function(kernel)
    torch.manual_seed(0)
    q = torch.randn(1, 20, 1, 16, requires_grad=True)  # 20 % 16 != 0: EVEN_M is False
    kv = torch.randn(1, 18, 2, 1, 16, requires_grad=True)
    fn.apply(q, kv, True).sum().backward()
    want = _flash_dq_ref(q.detach(), kv.detach()[:, :, 0], True)
    torch.testing.assert_close(q.grad.double(), want, rtol=1e-4, atol=1e-4)
    # each timed run and the real launch ran the config's pre_hook (2 + 1): without it the winner's
    # atomic adds land on the timed runs' sums (and on empty_like's garbage)
    assert bench.calls == 2 and zeroed == ["DQ"] * 3
    assert kernel.best_config.kwargs["SEQUENCE_PARALLEL"] is True
    assert list(kernel.cache) == [(0, 0, "none", True, 16, "torch.float32", "torch.float32", "torch.float32")]

    # seqlen 30 // 32 == 20 // 32: the same key, so the next backward launches the winner without timing
    q2 = torch.randn(1, 30, 1, 16, requires_grad=True)
    fn.apply(q2, kv, True).sum().backward()
    torch.testing.assert_close(q2.grad.double(), _flash_dq_ref(q2.detach(), kv.detach()[:, :, 0], True),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    assert bench.calls == 2 and zeroed == ["DQ"] * 4
    if impl == "tuner":  # a new process (a new decorator over the same source) reads the stored winner:
        bench2, zeroed2 = Bench(), []  # nothing is timed, and the launch still zeroes DQ first
        fn2 = _flash_function(_flash_bwd(autotune_of(impl), bench2, zeroed2))
        q3 = torch.randn(1, 20, 1, 16, requires_grad=True)
        fn2.apply(q3, kv, True).sum().backward()
        torch.testing.assert_close(q3.grad.double(), _flash_dq_ref(q3.detach(), kv.detach()[:, :, 0], True),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        assert bench2.calls == 0 and zeroed2 == ["DQ"]


# ---- attorch: batch norm, restore_value on the running statistics -----------------------------------------
def warps_kernel_configs():
    """attorch/utils.py: one config per number of warps, no meta-parameters."""
    return [triton.Config({}, num_warps=2**i) for i in range(6)]


def BLOCK_SIZE_SPATIAL_heuristic(args):
    BLOCK_SIZE_BATCH = triton.next_power_of_2(args["batch_dim"])
    BLOCK_SIZE_SPATIAL = triton.next_power_of_2(args["spatial_dim"])
    return min(BLOCK_SIZE_SPATIAL, max(1, 2**14 // BLOCK_SIZE_BATCH))


def _batch_norm_forward(autotune, bench):
    @autotune(
        configs=warps_kernel_configs(),
        key=["batch_dim", "spatial_dim"],
        restore_value=["running_mean_pointer", "running_var_pointer"],
        do_bench=bench,
    )
    @triton.heuristics({"BLOCK_SIZE_BATCH": lambda args: triton.next_power_of_2(args["batch_dim"]),
                        "BLOCK_SIZE_SPATIAL": BLOCK_SIZE_SPATIAL_heuristic})  # fmt: skip
    @triton.jit
    def batch_norm_forward_kernel(input_pointer, weight_pointer, bias_pointer, mean_pointer, inv_std_pointer,
                                  output_pointer, running_mean_pointer, running_var_pointer, batch_dim,
                                  spatial_dim, input_batch_stride, input_feat_stride, input_spatial_stride,
                                  output_batch_stride, output_feat_stride, output_spatial_stride, momentum, eps,
                                  affine: tl.constexpr, save_stats: tl.constexpr,
                                  track_running_stats: tl.constexpr, is_train: tl.constexpr,
                                  BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_SPATIAL: tl.constexpr):  # fmt: skip
        # one program per feature; the whole [batch, spatial] plane in one block (the sizes here are small)
        feat_pid = tl.program_id(axis=0)
        batch_offset = tl.arange(0, BLOCK_SIZE_BATCH)
        spatial_offset = tl.arange(0, BLOCK_SIZE_SPATIAL)
        mask = (batch_offset[:, None] < batch_dim) & (spatial_offset[None, :] < spatial_dim)
        x = tl.load(input_pointer + input_feat_stride * feat_pid + input_batch_stride * batch_offset[:, None]
                    + input_spatial_stride * spatial_offset[None, :], mask=mask).to(tl.float32)  # fmt: skip
        if is_train or not track_running_stats:
            count = batch_dim * spatial_dim
            mean = tl.sum(x) / count
            var = tl.sum(tl.where(mask, (x - mean) * (x - mean), 0.0)) / count
            inv_std = 1 / tl.sqrt(var + eps)
            if save_stats:
                tl.store(feat_pid + mean_pointer, mean)
                tl.store(feat_pid + inv_std_pointer, inv_std)
            if track_running_stats:  # moved in place: a timed run left unrestored moves it once more
                running_mean_pointer += feat_pid
                running_var_pointer += feat_pid
                running_mean = tl.load(running_mean_pointer)
                running_var = tl.load(running_var_pointer)
                n = batch_dim * spatial_dim
                tl.store(running_mean_pointer, (1 - momentum) * running_mean + momentum * mean)
                tl.store(running_var_pointer, (1 - momentum) * running_var + momentum * var * n / (n - 1))
        else:
            mean = tl.load(feat_pid + running_mean_pointer)
            inv_std = 1 / tl.sqrt(tl.load(feat_pid + running_var_pointer) + eps)
        if affine:
            weight = tl.load(feat_pid + weight_pointer)
            bias = tl.load(feat_pid + bias_pointer)
        else:
            weight = 1.0
            bias = 0.0
        output = weight * (x - mean) * inv_std + bias
        tl.store(output_pointer + output_feat_stride * feat_pid + output_batch_stride * batch_offset[:, None]
                 + output_spatial_stride * spatial_offset[None, :], output, mask=mask)  # fmt: skip

    return batch_norm_forward_kernel


def _batch_norm_function(kernel):
    class BatchNormAutoGrad(torch.autograd.Function):
        """attorch/batch_norm_layer.py's forward (the backward kernel left out)."""

        @staticmethod
        def forward(ctx, input, training, weight=None, bias=None, running_mean=None, running_var=None,
                    momentum=0.1, eps=1e-5):  # fmt: skip
            flattened_input = input.flatten(2) if input.ndim > 2 else input.unsqueeze(-1)
            batch_dim, feat_dim, spatial_dim = flattened_input.shape
            output = torch.empty_like(flattened_input)
            affine = weight is not None and bias is not None
            track = running_mean is not None and running_var is not None
            mean = torch.empty(feat_dim) if training else None
            inv_std = torch.empty(feat_dim) if training else None
            kernel[(feat_dim,)](
                flattened_input, weight, bias, mean, inv_std, output, running_mean, running_var,
                batch_dim, spatial_dim, *flattened_input.stride(), *output.stride(), momentum, eps,
                affine=affine, save_stats=training, track_running_stats=track, is_train=training,
            )  # fmt: skip
            return output.view_as(input)

    return BatchNormAutoGrad


@pytest.mark.parametrize("impl", IMPLS)
def test_attorch_batch_norm_running_stats_move_once_while_warps_are_tuned(impl):
    bench = Bench(times=[6.0, 5.0, 1.0, 4.0, 3.0, 2.0])  # num_warps=4 wins
    kernel = _batch_norm_forward(autotune_of(impl), bench)
    bn = _batch_norm_function(kernel)
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)  # batch 3, 4 features, spatial 5
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    running_mean, running_var = torch.zeros(4), torch.ones(4)
    ref = torch.nn.BatchNorm1d(4, momentum=0.1, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(w), ref.bias.copy_(b)

    y = bn.apply(x, True, w, b, running_mean, running_var)
    torch.testing.assert_close(y, ref.train()(x))
    # six timed runs and the real one: restore_value kept the statistics to one step of momentum
    torch.testing.assert_close(running_mean, ref.running_mean)
    torch.testing.assert_close(running_var, ref.running_var)
    assert bench.calls == 6 and kernel.best_config.num_warps == 4 and kernel.best_config.kwargs == {}

    # a second training step: the same key, launched without timing
    x2 = torch.randn(3, 4, 5)
    torch.testing.assert_close(bn.apply(x2, True, w, b, running_mean, running_var), ref.train()(x2))
    torch.testing.assert_close(running_mean, ref.running_mean)
    assert bench.calls == 6
    # the eval launch passes None for mean and inv_std: two dtypes fewer in Triton's key, so it is a key of
    # its own and is tuned (restore_value then guards statistics that it only reads)
    torch.testing.assert_close(bn.apply(x2, False, w, b, running_mean, running_var), ref.eval()(x2))
    torch.testing.assert_close(running_var, ref.running_var)
    f32 = "torch.float32"
    assert bench.calls == 12 and list(kernel.cache) == [(3, 5) + (f32,) * 8, (3, 5) + (f32,) * 6]


# ---- flash-linear-attention (SGLang's copy): chunk_local_cumsum_vector_kernel ----------------------------
BS_LIST = [16, 32]  # `[32, 64] if check_shared_mem() else [16, 32]`: no large shared memory on a CPU


def _cumsum_vector(autotune, bench):
    @autotune(
        configs=[triton.Config({"BS": BS}, num_warps=num_warps) for BS in BS_LIST for num_warps in [2, 4, 8]],
        key=["B", "H", "S", "BT", "IS_VARLEN", "REVERSE", "HAS_SCALE"],
        do_bench=bench,
    )
    @triton.jit(do_not_specialize=["T"])
    def chunk_local_cumsum_vector_kernel(s, o, scale, cu_seqlens, chunk_indices, T, B: tl.constexpr,
                                         H: tl.constexpr, S: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                                         REVERSE: tl.constexpr, HAS_SCALE: tl.constexpr,
                                         IS_VARLEN: tl.constexpr, HEAD_FIRST: tl.constexpr):  # fmt: skip
        i_s, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i_b, i_h = i_bh // H, i_bh % H
        if IS_VARLEN:
            i_n, i_t = (
                tl.load(chunk_indices + i_t * 2).to(tl.int32),
                tl.load(chunk_indices + i_t * 2 + 1).to(tl.int32),
            )
            bos, eos = tl.load(cu_seqlens + i_n).to(tl.int32), tl.load(cu_seqlens + i_n + 1).to(tl.int32)
            T = eos - bos
        else:
            bos, eos = i_b * T, i_b * T + T
        o_i = tl.arange(0, BT)
        if REVERSE:
            m_s = tl.where(o_i[:, None] <= o_i[None, :], 1.0, 0.0)
        else:
            m_s = tl.where(o_i[:, None] >= o_i[None, :], 1.0, 0.0)
        # HEAD_FIRST=False only ([B, T, H, S]), as the callers pass it
        p_s = tl.make_block_ptr(
            s + (bos * H + i_h) * S, (T, S), (H * S, 1), (i_t * BT, i_s * BS), (BT, BS), (1, 0)
        )
        p_o = tl.make_block_ptr(
            o + (bos * H + i_h) * S, (T, S), (H * S, 1), (i_t * BT, i_s * BS), (BT, BS), (1, 0)
        )
        b_s = tl.load(p_s, boundary_check=(0, 1)).to(tl.float32)
        b_o = tl.dot(m_s, b_s, allow_tf32=False)
        if HAS_SCALE:
            b_o *= scale
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), boundary_check=(0, 1))

    return chunk_local_cumsum_vector_kernel


def prepare_chunk_indices(cu_seqlens, chunk_size):
    """fla's: (sequence, chunk) pairs of every chunk of every sequence."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    pairs = [(n, i) for n, length in enumerate(lens) for i in range(triton.cdiv(length, chunk_size))]
    return torch.tensor(pairs, dtype=cu_seqlens.dtype)


def chunk_local_cumsum_vector(kernel, g, chunk_size, reverse=False, scale=None, cu_seqlens=None,
                              output_dtype=torch.float):  # fmt: skip
    B, T, H, S = g.shape
    BT = chunk_size
    chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size) if cu_seqlens is not None else None
    NT = triton.cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
    g_org, g = g, torch.empty_like(g, dtype=output_dtype or g.dtype)

    def grid(meta):
        return (triton.cdiv(meta["S"], meta["BS"]), NT, B * H)

    kernel[grid](
        s=g_org, o=g, scale=scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, T=T, B=B, H=H, S=S, BT=BT,
        HEAD_FIRST=False, REVERSE=reverse, HAS_SCALE=scale is not None, IS_VARLEN=cu_seqlens is not None,
    )  # fmt: skip
    return g


def _chunk_cumsum_ref(g, chunk_size, reverse=False, scale=None, cu_seqlens=None):
    out = torch.empty_like(g, dtype=torch.float)
    bounds = [(b, 0, g.shape[1]) for b in range(g.shape[0])] if cu_seqlens is None else [
        (0, int(a), int(e)) for a, e in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)]  # fmt: skip
    for b, bos, eos in bounds:
        for c in range(bos, eos, chunk_size):
            chunk = g[b, c : min(c + chunk_size, eos)].float()
            cs = chunk.flip(0).cumsum(0).flip(0) if reverse else chunk.cumsum(0)
            out[b, c : min(c + chunk_size, eos)] = cs * (scale if scale is not None else 1.0)
    return out


@pytest.mark.parametrize("impl", IMPLS)
def test_fla_cumsum_by_keyword_with_none_arguments_and_an_unspecialised_length(impl):
    bench = Bench(times=[6.0, 5.0, 4.0, 1.0, 3.0, 2.0] * 3)  # BS=32 with num_warps=2 wins
    kernel = _cumsum_vector(autotune_of(impl), bench)
    torch.manual_seed(0)
    # bf16 inputs as the model passes them, upcast: the interpreter computes in numpy, which has no bf16
    g = torch.randn(2, 24, 2, 40, dtype=torch.bfloat16).float()
    out = chunk_local_cumsum_vector(kernel, g, 16)
    torch.testing.assert_close(out, _chunk_cumsum_ref(g, 16))
    assert bench.calls == 6 and kernel.best_config.kwargs == {"BS": 32} and kernel.best_config.num_warps == 2

    # another T (do_not_specialize, and not in the key): launched without timing
    g2 = torch.randn(2, 40, 2, 40)
    torch.testing.assert_close(chunk_local_cumsum_vector(kernel, g2, 16), _chunk_cumsum_ref(g2, 16))
    assert bench.calls == 6

    # reversed with a scale, and the variable-length path: a key each
    torch.testing.assert_close(chunk_local_cumsum_vector(kernel, g2, 16, reverse=True, scale=0.5),
                               _chunk_cumsum_ref(g2, 16, reverse=True, scale=0.5))  # fmt: skip
    cu = torch.tensor([0, 10, 40], dtype=torch.int32)
    gv = g2[:1]
    torch.testing.assert_close(chunk_local_cumsum_vector(kernel, gv, 16, cu_seqlens=cu),
                               _chunk_cumsum_ref(gv, 16, cu_seqlens=cu))  # fmt: skip
    assert bench.calls == 18
    f32, i32 = "torch.float32", "torch.int32"
    assert list(kernel.cache) == [
        (2, 2, 40, 16, False, False, False, f32, f32),
        (2, 2, 40, 16, False, True, True, f32, f32),
        (1, 2, 40, 16, True, False, False, f32, f32, i32, i32),
    ]


# ---- Megatron-LM: MLA RoPE in place, restore_value on the tensor it rotates --------------------------------
@triton.jit
def _mla_rope_prologue(X, COS, SIN, nope_dim, emb_dim: tl.constexpr, head_num: tl.constexpr, batch_size,
                       position_ids, stride_x_seq, stride_x_nheads, stride_cos_seq, stride_sin_seq,
                       INVERSE: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """The first lines of both Megatron kernels (written out in each there): the token's cos/sin halves,
    the block of heads, and its mask."""
    pid_m = tl.program_id(axis=0)
    pid_head = tl.program_id(axis=1)
    if position_ids is not None:  # noqa: SIM108 (as Megatron writes it)
        token_idx = tl.load(position_ids + pid_m)
    else:  # sbhd only here (cu_seqlens_q is None)
        token_idx = pid_m // batch_size
    cos_left = tl.load(COS + token_idx * stride_cos_seq + tl.arange(0, emb_dim // 2))
    sin_left = tl.load(SIN + token_idx * stride_sin_seq + tl.arange(0, emb_dim // 2))
    cos_right = tl.load(COS + token_idx * stride_cos_seq + emb_dim // 2 + tl.arange(0, emb_dim // 2))
    sin_right = tl.load(SIN + token_idx * stride_sin_seq + emb_dim // 2 + tl.arange(0, emb_dim // 2))
    if INVERSE:
        sin_left = -sin_left
        sin_right = -sin_right
    X = X + pid_m * stride_x_seq + pid_head * BLOCK_H * stride_x_nheads
    x_off = tl.arange(0, BLOCK_H)[:, None] * stride_x_nheads + nope_dim
    mask = x_off < head_num * stride_x_nheads
    return cos_left, sin_left, cos_right, sin_right, X, x_off, mask


def _mla_rope_kernels(autotune, fwd_bench, bwd_bench):
    configs = [triton.Config({"BLOCK_H": 1}), triton.Config({"BLOCK_H": 2}), triton.Config({"BLOCK_H": 4})]

    @autotune(configs=configs, key=["emb_dim", "head_num"], restore_value=["Q"], do_bench=fwd_bench)
    @triton.jit
    def _mla_rope_fwd_inplace_kernel(Q, COS, SIN, nope_dim, emb_dim: tl.constexpr, head_num: tl.constexpr,
                                     batch_size, seq_num, cu_seqlens_q, position_ids, stride_x_seq,
                                     stride_x_nheads, stride_cos_seq, stride_sin_seq, cp_rank, cp_size,
                                     INVERSE: tl.constexpr, REMOVE_INTERLEAVING: tl.constexpr,
                                     BLOCK_H: tl.constexpr):  # fmt: skip
        cos_left, sin_left, cos_right, sin_right, Q, x_off, mask = _mla_rope_prologue(
            Q, COS, SIN, nope_dim, emb_dim, head_num, batch_size, position_ids, stride_x_seq, stride_x_nheads,
            stride_cos_seq, stride_sin_seq, INVERSE, BLOCK_H,
        )  # fmt: skip
        x_1_off = x_off + tl.arange(0, emb_dim // 2)[None, :] * 2
        x_2_off = x_1_off + 1
        x_1 = tl.load(Q + x_1_off, mask=mask)
        x_2 = tl.load(Q + x_2_off, mask=mask)
        x_left = x_1 * cos_left[None, :] - x_2 * sin_left[None, :]
        x_right = x_2 * cos_right[None, :] + x_1 * sin_right[None, :]
        if REMOVE_INTERLEAVING:
            tl.store(Q + x_1_off, x_left, mask=mask)
            tl.store(Q + x_2_off, x_right, mask=mask)
        else:
            x_left_off = x_off + tl.arange(0, emb_dim // 2)[None, :]
            tl.store(Q + x_left_off, x_left, mask=mask)
            tl.store(Q + x_left_off + emb_dim // 2, x_right, mask=mask)

    @autotune(configs=configs, key=["emb_dim", "head_num"], restore_value=["DO"], do_bench=bwd_bench)
    @triton.jit
    def _mla_rope_bwd_inplace_kernel(DO, COS, SIN, nope_dim, emb_dim: tl.constexpr, head_num: tl.constexpr,
                                     batch_size, seq_num, cu_seqlens_q, position_ids, stride_x_seq,
                                     stride_x_nheads, stride_cos_seq, stride_sin_seq, cp_rank, cp_size,
                                     INVERSE: tl.constexpr, REMOVE_INTERLEAVING: tl.constexpr,
                                     BLOCK_H: tl.constexpr):  # fmt: skip
        cos_left, sin_left, cos_right, sin_right, DO, x_off, mask = _mla_rope_prologue(
            DO, COS, SIN, nope_dim, emb_dim, head_num, batch_size, position_ids, stride_x_seq, stride_x_nheads,
            stride_cos_seq, stride_sin_seq, INVERSE, BLOCK_H,
        )  # fmt: skip
        x_1_off = x_off + tl.arange(0, emb_dim // 2)[None, :] * 2
        x_2_off = x_1_off + 1
        if REMOVE_INTERLEAVING:
            x_left = tl.load(DO + x_1_off, mask=mask)
            x_right = tl.load(DO + x_2_off, mask=mask)
        else:
            x_left_off = x_off + tl.arange(0, emb_dim // 2)[None, :]
            x_left = tl.load(DO + x_left_off, mask=mask)
            x_right = tl.load(DO + x_left_off + emb_dim // 2, mask=mask)
        x_1 = x_left * cos_left[None, :] + x_right * sin_right[None, :]
        x_2 = -x_left * sin_left[None, :] + x_right * cos_right[None, :]
        tl.store(DO + x_1_off, x_1, mask=mask)
        tl.store(DO + x_2_off, x_2, mask=mask)

    return _mla_rope_fwd_inplace_kernel, _mla_rope_bwd_inplace_kernel


def _mla_rope_function(fwd_kernel, bwd_kernel):
    class _FusedMLARoPEInplace(torch.autograd.Function):
        """The sbhd path of Megatron's autograd.Function: the forward rotates q in place and returns it."""

        @staticmethod
        def forward(ctx, q, cos, sin, nope_dim, emb_dim, cu_seqlens_q, cp_rank, cp_size):
            max_seqlen, batch_size, nheads, headdim = q.shape
            q = q.view(-1, nheads, headdim)
            total_seqlen = q.shape[0]
            seq_num = None
            position_ids = None
            grid = lambda META: (total_seqlen, triton.cdiv(nheads, META["BLOCK_H"]))  # noqa: E731
            fwd_kernel[grid](
                q, cos, sin, nope_dim, emb_dim, nheads, batch_size, seq_num, cu_seqlens_q, position_ids,
                q.stride(0), q.stride(1), cos.stride(0), sin.stride(0), cp_rank, cp_size,
                INVERSE=False, REMOVE_INTERLEAVING=False,
            )  # fmt: skip
            ctx.save_for_backward(cos, sin)
            ctx.nope_dim, ctx.emb_dim, ctx.cu_seqlens_q = nope_dim, emb_dim, cu_seqlens_q
            ctx.cp_rank, ctx.cp_size = cp_rank, cp_size
            return q.view(max_seqlen, batch_size, nheads, headdim)

        @staticmethod
        def backward(ctx, grad):
            cos, sin = ctx.saved_tensors
            max_seqlen, batch_size, nheads, headdim = grad.shape
            grad = grad.contiguous().view(-1, nheads, headdim)
            total_seqlen = grad.shape[0]
            grid = lambda META: (total_seqlen, triton.cdiv(nheads, META["BLOCK_H"]))  # noqa: E731
            bwd_kernel[grid](
                grad, cos, sin, ctx.nope_dim, ctx.emb_dim, nheads, batch_size, None, ctx.cu_seqlens_q, None,
                grad.stride(0), grad.stride(1), cos.stride(0), sin.stride(0), ctx.cp_rank, ctx.cp_size,
                INVERSE=False, REMOVE_INTERLEAVING=False,
            )  # fmt: skip
            grad = grad.view(max_seqlen, batch_size, nheads, headdim)
            return grad, None, None, None, None, None, None, None

    return _FusedMLARoPEInplace


def _mla_rope_ref(t, cos, sin, nope_dim):
    """Megatron's unfused path: de-interleave the rope part, then rotate-half."""
    nope, rope = t[..., :nope_dim], t[..., nope_dim:]
    x1, x2 = rope[..., 0::2], rope[..., 1::2]
    rope = torch.cat((x1, x2), dim=-1)
    half = rope.shape[-1] // 2
    rotated = torch.cat((-rope[..., half:], rope[..., :half]), dim=-1)
    return torch.cat((nope, rope * cos + rotated * sin), dim=-1)


@pytest.mark.parametrize("impl", IMPLS)
def test_megatron_mla_rope_rotates_q_in_place_once_while_it_tunes(impl):
    fwd_bench, bwd_bench = Bench(times=[3.0, 1.0, 2.0]), Bench(times=[1.0, 3.0, 2.0])
    fwd, bwd = _mla_rope_kernels(autotune_of(impl), fwd_bench, bwd_bench)
    rope = _mla_rope_function(fwd, bwd)
    torch.manual_seed(0)
    seq, batch, heads, nope_dim, emb_dim = 5, 2, 4, 4, 8  # heads % BLOCK_H == 0: the mask is per block
    theta = torch.arange(seq)[:, None] * torch.rand(emb_dim // 2)[None, :]
    freqs = torch.cat((theta, theta), dim=-1)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()  # [max_seq_len, emb_dim]
    q0 = torch.randn(seq, batch, heads, nope_dim + emb_dim)
    want = _mla_rope_ref(q0, cos[:, None, None, :], sin[:, None, None, :], nope_dim)

    x = q0.clone().requires_grad_()
    q = x * 1.0  # a non-leaf, as the projection's output is
    out = rope.apply(q, cos, sin, nope_dim, emb_dim, None, 0, 1)
    # three timed runs rotated Q and restore_value put it back each time: one rotation in all
    torch.testing.assert_close(out, want)
    assert out.data_ptr() == q.data_ptr() and torch.equal(q, out)
    assert fwd_bench.calls == 3 and fwd.best_config.kwargs == {"BLOCK_H": 2}

    g = torch.randn_like(out)
    out.backward(g.clone())  # the backward rotates the gradient it is given in place
    # the gradient of a rotation is the inverse rotation, computed in place on the incoming gradient
    xr = q0.clone().requires_grad_()
    _mla_rope_ref(xr, cos[:, None, None, :], sin[:, None, None, :], nope_dim).backward(g)
    torch.testing.assert_close(x.grad, xr.grad)
    assert bwd_bench.calls == 3 and bwd.best_config.kwargs == {"BLOCK_H": 1}

    q2 = torch.randn(seq, batch, heads, nope_dim + emb_dim)  # the same key: no timing
    want2 = _mla_rope_ref(q2, cos[:, None, None, :], sin[:, None, None, :], nope_dim)
    torch.testing.assert_close(rope.apply(q2, cos, sin, nope_dim, emb_dim, None, 0, 1), want2)
    assert fwd_bench.calls == 3 and list(fwd.cache) == [
        (8, 4, "torch.float32", "torch.float32", "torch.float32")
    ]
