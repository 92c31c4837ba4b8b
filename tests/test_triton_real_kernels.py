"""Kernels written the way their authors write them for `triton.autotune`, run with `triton.autotune` and
with the one-line swap to `tuner.autotune` under the Triton interpreter: the results against torch, the
config chosen, when tuning happens, hook order and counts, in-place buffers between timed runs, and the
errors a user sees. tests/test_triton_conformance.py checks each keyword alone; this file checks them
together, on real kernel shapes, and pins the drop-in differences found that way (config lists Triton
accepts, key names Triton skips, the error raised when every config fails, `.configs_timings`, two
threads tuning two keys).

Each kernel is this project's own, in the style of a public one named in its comment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
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


def autotune_of(impl: str):
    return triton.autotune if impl == "triton" else tuner.autotune


class Bench:
    """A fake do_bench(kernel_call, quantiles): launches the call `reps` times (a real do_bench launches
    it many times), then returns the next of `times` (ms), so the winner is known in advance."""

    def __init__(self, times=(), reps=1):
        self.times = list(times)
        self.reps = reps
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        for _ in range(self.reps):
            kernel_call()
        t = self.times[self.calls] if self.calls < len(self.times) else 10.0 + self.calls
        self.calls += 1
        return [t, t, t]


# ---- matmul: Triton tutorial 03 (grouped ordering, key=['M', 'N', 'K'], activation as a call kwarg) ----
def _matmul_kernel(autotune, bench):
    cfgs = [
        triton.Config({"BM": 32, "BN": 32, "BK": 16, "GROUP_M": 2}, num_stages=3, num_warps=4),
        triton.Config({"BM": 16, "BN": 32, "BK": 32, "GROUP_M": 4}, num_stages=4, num_warps=4),
        triton.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 8}, num_stages=2, num_warps=2),
    ]

    @autotune(configs=cfgs, key=["M", "N", "K"], do_bench=bench)
    @triton.jit
    def mm(a, b, c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
           ACTIVATION: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        in_group = GROUP_M * n_n
        first_m = (pid // in_group) * GROUP_M
        size_m = min(n_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % size_m
        pid_n = (pid % in_group) // size_m
        rm = (pid_m * BM + tl.arange(0, BM)) % M
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * s_am + rk[None, :] * s_ak
        pb = b + rk[:, None] * s_bk + rn[None, :] * s_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            x = tl.load(pa, mask=rk[None, :] < K - k * BK, other=0.0)
            y = tl.load(pb, mask=rk[:, None] < K - k * BK, other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * s_ak
            pb += BK * s_bk
        if ACTIVATION == "leaky_relu":
            acc = tl.where(acc >= 0, acc, 0.01 * acc)
        cm = pid_m * BM + tl.arange(0, BM)
        cn = pid_n * BN + tl.arange(0, BN)
        mask = (cm[:, None] < M) & (cn[None, :] < N)
        tl.store(c + cm[:, None] * s_cm + cn[None, :] * s_cn, acc.to(tl.float16), mask=mask)

    def matmul(a, b, activation=""):
        (M, K), (_, N) = a.shape, b.shape
        c = torch.empty((M, N), dtype=torch.float16)
        grid = lambda META: (triton.cdiv(M, META["BM"]) * triton.cdiv(N, META["BN"]),)  # noqa: E731
        mm[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), ACTIVATION=activation)
        return c

    return mm, matmul


@pytest.mark.parametrize("impl", IMPLS)
def test_tutorial_matmul_tunes_once_per_shape(impl):
    bench = Bench(times=[3.0, 1.0, 2.0, 5.0, 4.0, 0.5])
    mm, matmul = _matmul_kernel(autotune_of(impl), bench)
    torch.manual_seed(0)
    seen = []
    for M, N, K in [(40, 48, 33), (40, 48, 33), (64, 32, 16)]:
        for act in ("", "leaky_relu"):
            a, b = torch.randn(M, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)
            ref = a.float() @ b.float()
            if act:
                ref = torch.nn.functional.leaky_relu(ref, 0.01)
            torch.testing.assert_close(matmul(a, b, act).float(), ref, atol=2e-2, rtol=1e-2)
            seen.append((bench.calls, mm.best_config.kwargs["BM"], mm.best_config.kwargs["BK"]))
    # three configs timed on the first call of each shape, never again; the fastest kept
    assert seen == [(3, 16, 32)] * 4 + [(6, 16, 16)] * 2
    assert sorted(mm.cache) == [
        (40, 48, 33, "torch.float16", "torch.float16", "torch.float16"),
        (64, 32, 16, "torch.float16", "torch.float16", "torch.float16"),
    ]


# ---- layer norm backward: Triton tutorial 05 (partial dW/dB summed under a spin lock and a count) ------
def _ln_bwd_kernel(autotune, bench):
    @autotune(
        configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4)],
        key=["N"],
        reset_to_zero=["Lock", "DW", "DB"],
        do_bench=bench,
    )
    @triton.jit
    def ln_bwd_dx(DX, DY, DW, DB, X, W, Mean, Rstd, Lock, stride, N,
                  GROUP_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        lock_id = row % GROUP_M
        Lock += lock_id
        Count = Lock + GROUP_M
        DW = DW + lock_id * N + cols
        DB = DB + lock_id * N + cols
        x = tl.load(X + row * stride + cols, mask=mask, other=0).to(tl.float32)
        dy = tl.load(DY + row * stride + cols, mask=mask, other=0).to(tl.float32)
        w = tl.load(W + cols, mask=mask).to(tl.float32)
        xhat = tl.where(mask, (x - tl.load(Mean + row)) * tl.load(Rstd + row), 0.0)
        wdy = tl.where(mask, w * dy, 0.0)
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        tl.store(DX + row * stride + cols, (wdy - (xhat * c1 + c2)) * tl.load(Rstd + row), mask=mask)
        pdw = dy * xhat
        pdb = dy
        while tl.atomic_cas(Lock, 0, 1) == 1:
            pass
        if tl.load(Count) == 0:
            tl.atomic_xchg(Count, 1)
        else:
            pdw += tl.load(DW, mask=mask)
            pdb += tl.load(DB, mask=mask)
        tl.store(DW, pdw, mask=mask)
        tl.store(DB, pdb, mask=mask)
        tl.atomic_xchg(Lock, 0)

    return ln_bwd_dx


@pytest.mark.parametrize("impl", IMPLS)
def test_tutorial_layer_norm_backward_with_locks_and_reset_to_zero(impl):
    bench = Bench(times=[2.0, 1.0, 3.0], reps=2)
    k = _ln_bwd_kernel(autotune_of(impl), bench)
    torch.manual_seed(0)
    GROUP_M = 4
    for M, N in [(12, 40), (12, 40), (9, 24)]:
        x = torch.randn(M, N, requires_grad=True)
        w = torch.rand(N, requires_grad=True)
        b = torch.rand(N, requires_grad=True)
        dy = torch.randn(M, N)
        torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5).backward(dy)
        mean = x.detach().mean(1)
        rstd = 1 / torch.sqrt(x.detach().var(1, unbiased=False) + 1e-5)
        locks = torch.zeros(2 * GROUP_M, dtype=torch.int32)
        dw_part = torch.full((GROUP_M, N), 7.0)  # stale partial sums: reset_to_zero clears them
        db_part = torch.full((GROUP_M, N), 7.0)
        dx = torch.empty(M, N)
        k[(M,)](dx, dy, dw_part, db_part, x.detach(), w.detach(), mean, rstd, locks, x.stride(0), N,
                GROUP_M=GROUP_M, BLOCK_N=triton.next_power_of_2(N))  # fmt: skip
        torch.testing.assert_close(dx, x.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(dw_part.sum(0), w.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(db_part.sum(0), b.grad, atol=1e-4, rtol=1e-4)
        assert int(locks[:GROUP_M].sum()) == 0  # every lock released
    assert bench.calls == 6 and k.best_config.num_warps == 1
    assert sorted(key[0] for key in k.cache) == [24, 40]


# ---- split-K matmul: the old triton.ops.matmul (config pre_hook zeroing C, heuristics, pruning) --------
def _splitk_kernel(autotune, bench, hooks):
    def init_to_zero(name):
        def hook(nargs):
            hooks.append((name, nargs["SPLIT_K"]))
            nargs[name].zero_()

        return hook

    cfgs = [
        triton.Config(
            {"BM": bm, "BN": bn, "BK": 16, "SPLIT_K": sk},
            num_warps=2,
            num_stages=2,
            pre_hook=None if sk == 1 else init_to_zero("C"),
        )
        for bm, bn in [(16, 16), (32, 16), (16, 32)]
        for sk in (1, 2, 4)
    ]

    def early_config_prune(configs, named_args, **kwargs):
        return [c for c in configs if c.kwargs["BK"] * c.kwargs["SPLIT_K"] <= named_args["K"]]

    def perf_model(A, B, C, M, N, K, **kw):
        return (M // kw["BM"]) * (N // kw["BN"]) / kw["SPLIT_K"]

    @autotune(
        configs=cfgs,
        key=["M", "N", "K"],
        prune_configs_by={"early_config_prune": early_config_prune, "perf_model": perf_model, "top_k": 4},
        do_bench=bench,
    )
    @triton.heuristics({"EVEN_K": lambda args: args["K"] % (args["BK"] * args["SPLIT_K"]) == 0})
    @triton.jit
    def splitk(A, B, C, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
               EVEN_K: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        pid_z = tl.program_id(1)
        grid_n = tl.cdiv(N, BN)
        rm = (pid // grid_n) * BM + tl.arange(0, BM)
        rn = (pid % grid_n) * BN + tl.arange(0, BN)
        rk = pid_z * BK + tl.arange(0, BK)
        A = A + rm[:, None] * s_am + rk[None, :] * s_ak
        B = B + rk[:, None] * s_bk + rn[None, :] * s_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK * SPLIT_K)):
            if EVEN_K:
                a = tl.load(A, mask=rm[:, None] < M, other=0.0)
                b = tl.load(B, mask=rn[None, :] < N, other=0.0)
            else:
                rem = K - k * (BK * SPLIT_K)
                a = tl.load(A, mask=(rm[:, None] < M) & (rk[None, :] < rem), other=0.0)
                b = tl.load(B, mask=(rk[:, None] < rem) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
            A += BK * SPLIT_K * s_ak
            B += BK * SPLIT_K * s_bk
        C = C + rm[:, None] * s_cm + rn[None, :] * s_cn
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        if SPLIT_K == 1:
            tl.store(C, acc, mask=mask)
        else:
            tl.atomic_add(C, acc, mask=mask)

    return splitk


@pytest.mark.parametrize("impl", IMPLS)
def test_split_k_matmul_with_config_pre_hooks_heuristics_and_pruning(impl):
    bench, hooks = Bench(reps=3), []
    k = _splitk_kernel(autotune_of(impl), bench, hooks)
    torch.manual_seed(0)
    chosen, timed = [], []
    for M, N, K in [(32, 32, 64), (32, 32, 64), (32, 32, 24), (32, 32, 64)]:
        a, b = torch.randn(M, K), torch.randn(K, N)
        c = torch.full((M, N), 100.0)  # garbage: a split-K config's own pre_hook zeroes it
        grid = lambda META, M=M, N=N: (  # noqa: E731
            triton.cdiv(M, META["BM"]) * triton.cdiv(N, META["BN"]),
            META["SPLIT_K"],
        )
        k[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
        torch.testing.assert_close(c, a @ b, atol=1e-3, rtol=1e-3)
        chosen.append((bench.calls, k.best_config.kwargs["BM"], k.best_config.kwargs["SPLIT_K"]))
        timed.append(sorted((c.kwargs["BM"], c.kwargs["BN"], c.kwargs["SPLIT_K"]) for c in k.configs_timings))
    assert chosen == [(4, 32, 4), (4, 32, 4), (7, 16, 1), (7, 32, 4)]
    # K=64: the perf model's top 4 (three split-K=4 configs, then one split-K=2) timed 3 runs each, then
    # the real launches of the split-K=4 winner;
    # K=24: no split-K left after the early prune, so no hook runs
    assert hooks == [("C", 4)] * 9 + [("C", 2)] * 3 + [("C", 4)] * 3
    # .configs_timings holds the last tuning's timings, not every tuning's
    assert timed[2] == timed[3] == [(16, 16, 1), (16, 32, 1), (32, 16, 1)]


# ---- an in-place optimizer step (fused Adam, as in apex / bitsandbytes style ports) --------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_in_place_adam_step_is_restored_between_every_timed_run(impl):
    n = 200
    torch.manual_seed(0)
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    seen = []

    def bench(kernel_call, quantiles):
        for _ in range(3):
            kernel_call()
            seen.append(float(p.sum()))
        return [1.0 + len(seen)] * 3

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (64, 2), (128, 4))],
        key=["n_elements"],
        restore_value=["p_ptr", "m_ptr", "v_ptr"],
        do_bench=bench,
    )
    @triton.jit
    def adam(p_ptr, g_ptr, m_ptr, v_ptr, n_elements, lr, beta1, beta2, eps, step, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        gr = tl.load(g_ptr + offs, mask=mask)
        mo = beta1 * tl.load(m_ptr + offs, mask=mask) + (1 - beta1) * gr
        ve = beta2 * tl.load(v_ptr + offs, mask=mask) + (1 - beta2) * gr * gr
        mhat = mo / (1 - tl.exp(step * tl.log(beta1)))
        vhat = ve / (1 - tl.exp(step * tl.log(beta2)))
        tl.store(
            p_ptr + offs, tl.load(p_ptr + offs, mask=mask) - lr * mhat / (tl.sqrt(vhat) + eps), mask=mask
        )
        tl.store(m_ptr + offs, mo, mask=mask)
        tl.store(v_ptr + offs, ve, mask=mask)

    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.Adam([ref], lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    start = float(p.sum())
    for step in range(1, 4):
        ref.grad = g.clone()
        opt.step()
        adam[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](p, g, m, v, n, 1e-2, 0.9, 0.99, 1e-8, float(step))
        torch.testing.assert_close(p, ref.detach(), atol=1e-5, rtol=1e-5)
    assert len(seen) == 9  # 3 configs x 3 launches, on the first step only
    assert set(seen) == {start}  # every timed launch is undone before the next one


# ---- flash-attn / fla layer norms: heuristics ON TOP, constexpr flags and a stride in the key ----------
@pytest.mark.parametrize("impl", IMPLS)
def test_heuristics_on_top_constexpr_flags_and_stride_in_the_key(impl):
    bench = Bench(times=[3.0, 1.0, 2.0, 3.0, 2.0, 1.0, 1.0, 2.0, 3.0])

    @triton.heuristics({"HAS_BIAS": lambda args: args["b"] is not None})
    @autotune_of(impl)(
        configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4)],
        key=["D", "IS_RMS_NORM", "stride_x", "HAS_BIAS"],
        do_bench=bench,
    )
    @triton.jit(do_not_specialize=["stride_x"])
    def norm(x, y, w, b, stride_x, eps, D: tl.constexpr, BD: tl.constexpr,
             IS_RMS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BD)
        mask = cols < D
        xv = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if not IS_RMS_NORM:
            xv = tl.where(mask, xv - tl.sum(xv, axis=0) / D, 0.0)
        yv = xv / tl.sqrt(tl.sum(xv * xv, axis=0) / D + eps) * tl.load(w + cols, mask=mask)
        if HAS_BIAS:
            yv += tl.load(b + cols, mask=mask)
        tl.store(y + row * D + cols, yv, mask=mask)

    torch.manual_seed(0)
    warps = []
    D = 24
    for rms, bias, pad in [(False, True, 0), (True, False, 0), (False, True, 8), (False, True, 0)]:
        x = torch.randn(6, D + pad)[:, :D]
        w, b = torch.rand(D), (torch.rand(D) if bias else None)
        y = torch.empty(6, D)
        norm[(6,)](x, y, w, b, x.stride(0), 1e-6, D=D, BD=32, IS_RMS_NORM=rms)
        if rms:
            ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        else:
            ref = torch.nn.functional.layer_norm(x, (D,), w, b, 1e-6)
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
        warps.append((bench.calls, norm.fn.best_config.num_warps))
    assert warps == [(3, 2), (6, 4), (9, 1), (9, 2)]
    assert sorted(norm.fn.cache, key=str)[0][:4] == (24, False, 24, True)


# ---- config lists Triton accepts ----------------------------------------------------------------------
def _scale_copy(autotune, cfgs, bench):
    @autotune(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def scale_copy(dst, src, N, BLOCK: tl.constexpr, SCALE: tl.constexpr = 1):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N) * SCALE, mask=offs < N)

    return scale_copy


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kind",
    [
        "a kwarg only some configs set",  # AMD lists: waves_per_eu / kpack on some configs only
        "a config listed twice",
        "maxnreg on one config",
    ],
)
def test_config_lists_triton_accepts(impl, kind, tmp_path):
    if kind == "a kwarg only some configs set":
        cfgs = [
            triton.Config({"BLOCK": 32}),
            triton.Config({"BLOCK": 32, "SCALE": 3}),
            triton.Config({"BLOCK": 64}),
        ]
        winner, scale = 1, 3
    elif kind == "a config listed twice":
        cfgs = [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 32})]
        winner, scale = 1, 1
    else:
        cfgs = [
            triton.Config({"BLOCK": 32}, maxnreg=128),
            triton.Config({"BLOCK": 64}),
            triton.Config({"BLOCK": 16}),
        ]
        winner, scale = 1, 1
    k = _scale_copy(autotune_of(impl), cfgs, Bench(times=[3.0, 1.0, 2.0]))
    src = torch.randn(100)
    dst = torch.empty(100)
    k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](dst, src, 100)
    assert k.best_config is cfgs[winner]
    torch.testing.assert_close(dst, src * scale)
    if impl == "tuner":  # the entry read back from the store launches the same way
        k.cache_clear()
        dst.zero_()
        k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](dst, src, 100)
        assert k.tuner.stats["from_store"] == 1 and k.best_config is cfgs[winner]
        torch.testing.assert_close(dst, src * scale)


def test_a_config_that_leaves_out_a_kwarg_launches_without_it():
    """The config that does not set SCALE runs with the kernel's default (1), not with a placeholder."""
    cfgs = [triton.Config({"BLOCK": 32, "SCALE": 3}), triton.Config({"BLOCK": 64})]
    k = _scale_copy(tuner.autotune, cfgs, Bench(times=[2.0, 1.0]))
    src = torch.randn(100)
    dst = torch.empty(100)
    k[lambda m: (triton.cdiv(100, m["BLOCK"]),)](dst, src, 100)
    assert k.best_config is cfgs[1]
    torch.testing.assert_close(dst, src)


# ---- key names Triton skips ---------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("extra", ["EVEN", "BLOCK", "n_elements"])
def test_key_names_triton_skips(impl, extra):
    """A key may name a constexpr that a heuristic beneath supplies (EVEN), one the configs supply
    (BLOCK), or nothing at all (a stale name): Triton keys on the names the call passes and ignores the
    rest; tuner does the same, and warns about the name that is no parameter. From triton 3.9.0 on,
    Triton refuses the stale name when it decorates; tuner still only warns (triton 3.7's semantics)."""
    bench = Bench(times=[2.0, 1.0])

    def make():
        @autotune_of(impl)(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})],
                           key=["N", extra], do_bench=bench)  # fmt: skip
        @triton.heuristics({"EVEN": lambda a: a["N"] % a["BLOCK"] == 0})
        @triton.jit
        def copy(dst, src, N, EVEN: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            if EVEN:
                tl.store(dst + offs, tl.load(src + offs))
            else:
                tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

        return copy

    if impl == "triton" and extra == "n_elements" and not triton_before("3.9.0"):
        with pytest.raises(ValueError, match="key contains names that are not kernel arguments: n_elements"):
            make()
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = make()
    warned = [str(w.message) for w in caught if "not parameters" in str(w.message)]
    assert len(warned) == (1 if impl == "tuner" and extra == "n_elements" else 0)
    for n in (100, 128, 100):
        src, dst = torch.randn(n), torch.empty(n)
        k[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](dst, src, n)
        assert torch.equal(dst, src)
    assert bench.calls == 4
    assert sorted(k.cache) == [
        (100, "torch.float32", "torch.float32"),
        (128, "torch.float32", "torch.float32"),
    ]


# ---- every config fails: the error Triton raises --------------------------------------------------------
@pytest.mark.filterwarnings("ignore::tuner.AllTrialsFailedWarning")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["missing argument", "kernel bug", "pre_hook raises"])
def test_when_every_config_fails_the_first_configs_error_is_raised(impl, case):
    def pre_hook(nargs, reset_only=False):
        raise KeyError("hook")

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})],
        key=["N"],
        do_bench=Bench(),
        pre_hook=pre_hook if case == "pre_hook raises" else None,
    )
    @triton.jit
    def fill(x, y, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if y is None:
            tl.store(x + offs, undefined_name, mask=offs < N)  # noqa: F821
        else:
            tl.store(x + offs, 1.0, mask=offs < N)

    x = torch.zeros(64)
    if case == "missing argument":
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):
            fill[(1,)](x, N=64)
    elif case == "kernel bug":
        with pytest.raises(triton.TritonError, match="undefined_name"):
            fill[(1,)](x, None, 64)
    else:
        with pytest.raises(KeyError, match="hook"):
            fill[(1,)](x, x, 64)


def test_the_error_says_every_config_failed():
    @tuner.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["N"])
    @triton.jit
    def fill(x, N, BLOCK: tl.constexpr):
        tl.static_assert(BLOCK < 32)
        tl.store(x + tl.arange(0, BLOCK), 1.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(triton.TritonError) as ei:
            fill[(1,)](torch.zeros(64), 64)
    assert any("every one of 2 configs failed" in n for n in getattr(ei.value, "__notes__", []))


# ---- two threads, two keys ----------------------------------------------------------------------------
def test_two_threads_tuning_two_keys_restore_their_own_buffers():
    """restore_value's copies belong to the thread that took them. (A plain-Python launcher, so that
    the two tunings really overlap: the Triton interpreter itself cannot run two kernels at once.)"""
    np = pytest.importorskip("numpy")

    @tuner.autotune(
        configs=[{"b": 1}, {"b": 2}, {"b": 3}],
        key=["n"],
        restore_value=["x"],
        do_bench=lambda kernel_call, quantiles: kernel_call() or [1.0, 1.0, 1.0],
    )
    def inc(x, n, *, b):
        y = x + 1
        time.sleep(0.01)  # another thread's pre-hook runs here
        x[:] = y

    results = {}

    def work(n):
        x = np.arange(n, dtype=np.float64)
        inc(x, n)
        results[n] = bool((x == np.arange(n) + 1).all())

    threads = [threading.Thread(target=work, args=(n,)) for n in (10, 20, 30, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {10: True, 20: True, 30: True, 40: True}
    assert len(inc.cache) == 4


def test_python_launcher_with_dict_configs_and_triton_keywords():
    np = pytest.importorskip("numpy")
    timed = []

    @tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=["n"], restore_value=["x"], do_bench=None)
    def inc(x, n, *, b):
        timed.append(b)
        x += 1

    x = np.zeros(4)
    inc(x, 4)
    assert x.tolist() == [1.0] * 4
    assert sorted(set(timed)) == [1, 2]
    assert list(inc.cache.values())[0] in ({"b": 1}, {"b": 2})


# ---- import order ---------------------------------------------------------------------------------------
def test_import_tuner_before_triton():
    script = textwrap.dedent(
        """
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        import tuner
        import torch, triton, triton.language as tl
        @tuner.autotune(configs=[triton.Config({"B": 32}), triton.Config({"B": 64})], key=["N"])
        @triton.jit
        def k(x, N, B: tl.constexpr):
            o = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(x + o, 1.0, mask=o < N)
        x = torch.zeros(100)
        k[lambda m: (triton.cdiv(100, m["B"]),)](x, 100)
        print(float(x.sum()), k.best_config.kwargs["B"] in (32, 64))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, encoding="utf-8"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["100.0", "True"]


# ---- tools that read the autotuner's attributes (tuning-stats printers, AOT exporters) -----------------
@pytest.mark.parametrize("impl", IMPLS)
def test_the_attributes_of_triton_autotuner_read_back(impl):
    def perf_model(**kw):
        return kw["BLOCK"]

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})],
        key=["N"],
        reset_to_zero=["x"],
        restore_value=["y"],
        prune_configs_by={"perf_model": perf_model, "top_k": 2},
        do_bench=Bench(times=[2.0, 1.0]),
    )
    @triton.jit
    def k(x, y, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(y + offs, mask=offs < N), mask=offs < N)

    x, y = torch.zeros(64), torch.randn(64)
    k[lambda m: (triton.cdiv(64, m["BLOCK"]),)](x, y, 64)
    assert torch.equal(x, y)
    assert (k.reset_to_zero, k.restore_value) == (["x"], ["y"])
    assert k.perf_model is perf_model and k.configs_top_k == 2 and k.early_config_prune is None
    assert not k.user_defined_pre_hook and not k.user_defined_post_hook
    assert (k.num_warmups, k.num_reps, k.use_cuda_graph, k.nargs) == (None, None, False, None)
    assert k.arg_names == ["x", "y", "N", "BLOCK"] and k.keys == ["N"]
    assert k.base_fn.__name__ == "k" and k.best_config.kwargs == {"BLOCK": 64}
    assert [c.kwargs["BLOCK"] for c in k.configs_timings] == [32, 64]
    # what Triton reads (off under the interpreter; else the argument or TRITON_CACHE_AUTOTUNING), though
    # tuner's store keeps the winners by default
    assert k.cache_results is False
    with pytest.raises(AttributeError):
        k.no_such_attribute  # noqa: B018


# ---- Triton tutorial 06 (fused attention): a Config pre_hook that shapes host TensorDescriptors -------
@pytest.mark.parametrize("impl", IMPLS)
def test_config_pre_hook_sets_descriptor_block_shapes(impl):
    tensor_descriptor = pytest.importorskip("triton.tools.tensor_descriptor")
    TensorDescriptor = tensor_descriptor.TensorDescriptor

    def set_block_shapes(nargs):
        for name in ("desc_x", "desc_y"):
            nargs[name].block_shape = [nargs["BM"], nargs["BN"]]

    cfgs = [
        triton.Config({"BM": bm, "BN": bn}, pre_hook=set_block_shapes) for bm in (16, 32) for bn in (16, 32)
    ]

    def keep(configs, named_args, **kwargs):  # a flag passed by keyword rules out the tall blocks
        return [c for c in configs if not (kwargs["SMALL"] and c.kwargs["BM"] == 32)]

    bench = Bench(times=[4.0, 3.0, 1.0, 2.0, 1.0, 2.0])

    @autotune_of(impl)(
        configs=cfgs, key=["M", "N", "SMALL"], prune_configs_by={"early_config_prune": keep}, do_bench=bench
    )
    @triton.jit
    def double(desc_x, desc_y, M, N, BM: tl.constexpr, BN: tl.constexpr, SMALL: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        desc_y.store([pm * BM, pn * BN], desc_x.load([pm * BM, pn * BN]) * 2)

    got = []
    for small in (False, True, False):
        x, y = torch.randn(64, 64), torch.zeros(64, 64)
        dx, dy = TensorDescriptor.from_tensor(x, [1, 1]), TensorDescriptor.from_tensor(y, [1, 1])
        double[lambda META: (triton.cdiv(64, META["BM"]), triton.cdiv(64, META["BN"]))](
            dx, dy, 64, 64, SMALL=small
        )
        torch.testing.assert_close(y, 2 * x)
        got.append((bench.calls, double.best_config.kwargs["BM"], list(dx.block_shape)))
    assert got == [(4, 32, [32, 16]), (6, 16, [16, 16]), (6, 32, [32, 16])]
