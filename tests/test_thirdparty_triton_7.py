"""A seventh round of the ways real code uses Triton's autotuner, each run with `triton.autotune` and with the
one-line swap to `tuner.autotune` under the Triton interpreter (the pattern of
tests/test_thirdparty_triton.py and the files after it, for uses those files do not cover):

- The persistent matmul of Triton's tutorial 09, written here after its structure: `@triton.jit(
  launch_metadata=...)`, a grid of `min(NUM_SMS, tiles)` programs each looping over tiles with
  `tl.range(..., flatten=True, warp_specialize=...)`, configs with a `pre_hook`, and a key that names the
  `WARP_SPECIALIZE` flag passed by keyword.
- AMD-style configs as vLLM's and aiter's ROCm kernels write them: the compile options `waves_per_eu`,
  `matrix_instr_nonkdim` and `kpack` among a config's kwargs (no parameters of the kernel; the launch
  takes them as options), and `num_stages=0`.
- Constexpr key values of the kinds real kernels pass: a torch dtype, a string mode, `None`, and a float
  argument that may be NaN.
- A kernel as slow as interpreted kernels are (a launch of a tutorial matmul at 256x256x256 takes about a
  second under the interpreter): with the default timer (no `do_bench`, since Triton's cannot run on the
  CPU), each config is launched once to warm up and then only as often as fits the CPU timer's budget.

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), except in
the last case, which is tuner's alone.
"""

from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of  # noqa: E402


# ---- tutorial 09: the persistent matmul ----------------------------------------------------------------
def _launch_metadata(grid, kernel, args):
    return {"name": f"persistent_matmul [M={args['M']}, N={args['N']}, K={args['K']}]"}


def _persistent_matmul(autotune, bench, zeroed):
    def zero_c(nargs):  # a config pre_hook, as the tutorial's set descriptor block shapes
        zeroed.append((nargs["BM"], nargs["BN"]))
        nargs["c"].zero_()

    @autotune(
        configs=[
            triton.Config({"BM": bm, "BN": 16, "BK": 16}, num_warps=4, num_stages=s, pre_hook=zero_c)
            for bm, s in ((16, 3), (32, 4))
        ],
        key=["M", "N", "K", "WARP_SPECIALIZE"],
        do_bench=bench,
    )
    @triton.jit(launch_metadata=_launch_metadata)
    def matmul_persistent(a, b, c, M, N, K, NUM_SMS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
        tiles_n = tl.cdiv(N, BN)
        tiles = tl.cdiv(M, BM) * tiles_n
        for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
            rm = (tile // tiles_n) * BM + tl.arange(0, BM)
            rn = (tile % tiles_n) * BN + tl.arange(0, BN)
            acc = tl.zeros((BM, BN), tl.float32)
            for k0 in range(0, K, BK):
                rk = k0 + tl.arange(0, BK)
                x = tl.load(
                    a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0
                )
                y = tl.load(
                    b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0
                )
                acc = tl.dot(x, y, acc)
            tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return matmul_persistent


@pytest.mark.parametrize("impl", IMPLS)
def test_tutorial_persistent_matmul_with_launch_metadata_and_a_flag_in_the_key(impl):
    zeroed: list = []
    bench = Bench([2.0, 1.0])
    mm = _persistent_matmul(autotune_of(impl), bench, zeroed)
    M, N, K, num_sms = 40, 24, 32, 3
    a, b = torch.randn(M, K), torch.randn(K, N)
    c = torch.full((M, N), float("nan"))

    def grid(meta):
        return (min(num_sms, triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"])),)

    mm[grid](a, b, c, M, N, K, NUM_SMS=num_sms, WARP_SPECIALIZE=False)
    torch.testing.assert_close(c, a @ b, atol=1e-4, rtol=1e-4)
    assert mm.best_config.kwargs["BM"] == 32 and bench.calls == 2
    assert zeroed == [(16, 16), (32, 16), (32, 16)]  # each timed run, then the launch
    mm[grid](a, b, c, M, N, K, NUM_SMS=num_sms, WARP_SPECIALIZE=True)  # another key
    assert bench.calls == 4 and len(mm.cache) == 2
    torch.testing.assert_close(c, a @ b, atol=1e-4, rtol=1e-4)


# ---- AMD compile options among a config's kwargs -------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_amd_compile_options_in_the_configs_and_at_the_launch(impl):
    configs = [
        triton.Config(
            {"BLOCK": b, "waves_per_eu": w, "matrix_instr_nonkdim": 16, "kpack": 2}, num_warps=4, num_stages=0
        )
        for b, w in ((16, 0), (32, 2))
    ]

    @autotune_of(impl)(configs=configs, key=["n"], do_bench=Bench([2.0, 1.0]))
    @triton.jit
    def scale(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 3.0, mask=offs < n)

    x = torch.randn(40)
    out = torch.empty(40)
    scale[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, out, 40)
    torch.testing.assert_close(out, x * 3)
    assert scale.best_config.kwargs == {
        "BLOCK": 32,
        "waves_per_eu": 2,
        "matrix_instr_nonkdim": 16,
        "kpack": 2,
    }


# ---- constexpr key values: a torch dtype, a string, None, a NaN float -----------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_key_values_of_a_torch_dtype_a_string_none_and_nan(impl):
    bench = Bench()

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
        key=["OUT_DTYPE", "MODE", "BIAS", "factor"],
        do_bench=bench,
    )
    @triton.jit
    def ew(
        x,
        out,
        n,
        factor,
        OUT_DTYPE: tl.constexpr,
        MODE: tl.constexpr,
        BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + offs, mask=offs < n)
        if MODE == "neg":
            v = -v
        if BIAS is not None:
            v = v + BIAS
        tl.store(out + offs, v * factor, mask=offs < n)

    x = torch.arange(40.0)
    cases = [
        (torch.float16, "neg", None, 1.0, -x),
        (torch.bfloat16, "", 1, 2.0, (x + 1) * 2),
        (torch.float16, "neg", None, 1.0, -x),  # a hit
        (None, "neg", None, math.nan, torch.full((40,), math.nan)),
    ]
    for dtype, mode, bias, factor, want in cases:
        out = torch.empty(40)
        ew[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, out, 40, factor, dtype, mode, bias)
        torch.testing.assert_close(out, want, equal_nan=True)
    assert bench.calls == 6
    assert [k[:3] for k in ew.cache] == [
        (torch.float16, "neg", None),
        (torch.bfloat16, "", 1),
        (None, "neg", None),
    ]


# ---- a kernel as slow as an interpreted one, timed by the default timer --------------------------------
def test_a_slow_interpreted_kernel_is_timed_within_the_cpu_timers_budget():
    """Each config ran 1 + 7 times before (17 launches here, about 5 s): a tutorial matmul at 256x256x256
    took 94 s to tune under the interpreter, and at 512x512x512 over 5 minutes."""

    @tuner.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
    @triton.jit
    def copy(x, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)

    launches = []
    run = copy.fn.run

    def slow_run(*args, **kwargs):  # as slow as an interpreted matmul's launch, about 0.3 s or more
        launches.append(kwargs["BLOCK"])
        time.sleep(0.3)
        return run(*args, **kwargs)

    copy.fn.run = slow_run
    x, out = torch.randn(40), torch.empty(40)
    copy[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, out, 40)
    torch.testing.assert_close(out, x)
    # a warm-up and one timed launch of each config, then the launch of the winner
    assert len(launches) == 5, launches
