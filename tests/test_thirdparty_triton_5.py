"""A fifth round of real projects' uses of Triton's autotuner, each run with `triton.autotune` and with the
one-line swap to `tuner.autotune` under the Triton interpreter (the pattern of tests/test_thirdparty_triton.py,
tests/test_thirdparty_triton_more.py and tests/test_thirdparty_triton_4.py, for projects and uses those files
do not cover). The kernels and the code around them are written here after the structure of each project
(cited in each section), not copied:

- vLLM (github.com/vllm-project/vllm, Apache-2.0): the first-valid-config launcher of
  `VLLM_TRITON_FORCE_FIRST_CONFIG` (vllm/backends/compute/dsl/triton_utils/force_first_config.py), a `run`
  that launches the configs in order without timing, skips those that fail to compile, remembers the index
  per key and assigns `self.best_config`; and the compile-key walk of vLLM's Triton JIT warmup, which sets
  `kernel.nargs = {}`, calls `kernel.prune_configs(kwargs)` itself, walks `.fn` through the heuristics with
  each config's `all_kwargs()`, and launches with keyword arguments only (`kernel[grid](**kwargs)`).
- Unsloth (github.com/unslothai/unsloth, AGPL-3.0 for unsloth/kernels/moe): the MoE grouped GEMM's
  configs (a product of block sizes and TMA flags) and its `early_config_prune`
  (kernels/moe/grouped_gemm/kernels/autotuning.py), which rewrites `config.kwargs` in place (TMA loads
  of X turned off when X is permuted) so that configs become equal; and its autotune cache
  (kernels/moe/autotune_cache.py), which reads `best_config.kwargs`, `.num_warps` and `.num_stages` after
  a launch into its own config record, saves `__dict__` as JSON, and launches the plain JIT kernel with it.
- DeepSpeed (github.com/microsoft/DeepSpeed, Apache-2.0): the fp16 matmul of
  deepspeed/ops/transformer/inference/triton/triton_matmul_kernel.py and matmul_ext.py: key on sizes
  bucketed by the launcher (`M // 32`), a `@triton.heuristics` (EVEN_K) beneath, `ACC_TYPE=tl.float32`
  and `ACTIVATION="relu"` passed by keyword with `bias=None`, `prune_configs_by` with `perf_model: None`
  and an integer `top_k`, the autotune table (`kernel.cache`) merged into a file at exit and assigned to
  the kernel of the next process, and `skip_autotune` (`kernel.configs = [kernel.configs[0]]`).
  DeepSpeed pickles the table; here it is JSON (this project unpickles nothing).
- Wrappers of `run` put in place after decoration: a lock or launch counter on the JIT function's `run`
  (its instance, its class, a `@triton.heuristics` between), which both call at every timed run and
  launch; and a function put on Triton's `Autotuner` class (vLLM's first-config launcher), which only
  Triton calls (a documented difference).

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), so the
winner is known in advance and the two can be compared.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import types

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime import Autotuner, Heuristics  # noqa: E402

from tests.test_triton_autotuner_class import (  # noqa: E402
    IMPLS,
    Bench,
    autotune_of,
    fill_kernel,
    grid_of,
    jit_function_types,
)


class BenchByConfig:
    """A fake do_bench that times each config by what its launch got (`launches[-1]`, the keyword
    arguments a wrapper of the JIT function's `run` recorded), so a config listed twice, or two configs
    that a prune made equal, time the same; ms. `timed` lists the configs timed."""

    def __init__(self, launches, time_of):
        self.launches, self.time_of, self.timed = launches, time_of, []

    def __call__(self, kernel_call, quantiles):
        kernel_call()
        self.timed.append(self.launches[-1])
        t = self.time_of(self.launches[-1])
        return [t, t, t]


# ---- vLLM: VLLM_TRITON_FORCE_FIRST_CONFIG's launcher ---------------------------------------------------
# The first config that compiles wins, untimed; its index is remembered per (kernel, key values of the
# keyword arguments), and `self.best_config` is assigned after the launch. vLLM puts the function on
# Triton's Autotuner class; here it is the kernel's own `run`, what `kernel[grid]` calls on both.
def _first_valid_config_run(invalid_config_errors, picked):
    def run(self, *args, **kwargs):
        key_vals = tuple(kwargs[name] for name in self.keys if name in kwargs)
        cache_key = (id(self), key_vals)
        cached_idx = picked.get(cache_key)
        candidates = [cached_idx] if cached_idx is not None else list(range(len(self.configs)))
        last_exc = None
        for idx in candidates:
            config = self.configs[idx]
            if config.pre_hook is not None:
                config.pre_hook(
                    {**dict(zip(self.arg_names, args, strict=False)), **kwargs, **config.all_kwargs()}
                )
            launch = getattr(self.fn, "run", self.fn)
            try:
                result = launch(*args, **kwargs, **config.all_kwargs())
            except invalid_config_errors as e:
                last_exc = e
                continue
            if cached_idx is None:
                picked[cache_key] = idx
                self.best_config = config
            return result
        raise RuntimeError(f"No valid config for {self.base_fn.__name__} key={key_vals}") from last_exc

    return run


@pytest.mark.parametrize("impl", IMPLS)
def test_vllm_first_valid_config_launcher_assigns_best_config(impl):
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import InterpreterError, OutOfResources

    zeroed = []

    def zero_out(nargs):  # a config's pre_hook, run before its launch
        zeroed.append(nargs["BLOCK"])
        nargs["dst"].zero_()

    cfgs = [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=zero_out) for b in (64, 32, 16)]
    bench = Bench()

    @autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr):
        tl.static_assert(BLOCK <= 32, "BLOCK too large for this kernel")
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)

    picked = {}
    # on a GPU a failed static_assert is CompileTimeAssertionFailure; the interpreter raises InterpreterError
    errors = (OutOfResources, CompileTimeAssertionFailure, InterpreterError)
    fill.run = types.MethodType(_first_valid_config_run(errors, picked), fill)
    for n in (50, 50, 20):
        dst = torch.full((n,), -1.0)
        fill[lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)](dst, N=n)
        assert torch.equal(dst, torch.full((n,), 32.0))
        assert fill.best_config is cfgs[1]  # assigned by the launcher, read back as Triton reads it
    assert bench.calls == 0  # nothing timed
    assert picked == {(id(fill), (50,)): 1, (id(fill), (20,)): 1}
    assert zeroed == [64, 32, 32, 64, 32]  # the config's hook before each try, then the remembered one


@pytest.mark.parametrize("impl", IMPLS)
def test_best_config_assigned_reads_back_until_the_next_launch(impl):
    bench = Bench(times=[3.0, 1.0, 2.0])
    fill = fill_kernel(impl, bench)  # BLOCK 16, 32, 64
    dst = torch.zeros(50)
    fill[grid_of(50)](dst, 50)
    assert fill.best_config is fill.configs[1]
    fill.best_config = fill.configs[2]
    assert fill.best_config is fill.configs[2]
    fill.best_config = None
    assert fill.best_config is None
    fill[grid_of(50)](dst, 50)  # a hit: the launch's config again
    assert fill.best_config is fill.configs[1] and bench.calls == 3


# ---- vLLM: the Triton JIT warmup's compile-key walk --------------------------------------------------
# For each warmup case (all inputs by name), the walk asks the autotuner which configs it would try
# (`prune_configs` with `.nargs` set to {} around it, as `run` sets it), then walks `.fn` through the
# heuristics with each config's `all_kwargs()` to the JIT function, whose specialisation it computes
# (on a GPU from `device_caches`; under the interpreter there is none, so the walk ends with the
# constexprs). The warmup then launches with the same keyword arguments, which tunes.
def _compile_keys(kernel, kwargs):
    if isinstance(kernel, Heuristics):
        heuristic_kwargs = dict(kwargs)
        for name, heuristic in kernel.values.items():
            heuristic_kwargs[name] = heuristic(heuristic_kwargs)
        return _compile_keys(kernel.fn, heuristic_kwargs)
    if isinstance(kernel, Autotuner):
        previous_nargs = getattr(kernel, "nargs", None)
        kernel.nargs = {}
        try:
            configs = kernel.prune_configs(dict(kwargs))
        finally:
            kernel.nargs = previous_nargs
        keys = set()
        for config in configs:
            conflicts = kwargs.keys() & config.kwargs.keys()
            if conflicts:
                raise ValueError(f"Conflicting autotune parameters: {', '.join(sorted(conflicts))}")
            keys.update(_compile_keys(kernel.fn, dict(kwargs) | config.all_kwargs()))
        return keys
    if not isinstance(kernel, jit_function_types()):
        raise TypeError(f"Unsupported Triton kernel wrapper: {type(kernel).__name__}")
    return {tuple(sorted((k, v) for k, v in kwargs.items() if not hasattr(v, "data_ptr")))}


@pytest.mark.parametrize("impl", IMPLS)
def test_vllm_jit_warmup_walks_prune_configs_then_launches_by_keyword(impl):
    named_args_seen = []

    def prune(configs, named_args, **kwargs):  # drops blocks wider than the row, as a real prune might
        named_args_seen.append(dict(named_args))
        return [c for c in configs if c.kwargs["BLOCK_N"] <= max(16, triton.next_power_of_2(kwargs["N"]))]

    bench = Bench(times=[2.0, 1.0, 3.0])

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK_N": b}, num_warps=w) for b, w in [(16, 1), (16, 2), (32, 2), (64, 4)]],
        key=["N"],
        prune_configs_by={"early_config_prune": prune},
        do_bench=bench,
    )
    @triton.heuristics({"EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
    @triton.jit
    def row_scale(x_ptr, out_ptr, scale, N, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
        row = tl.program_id(0)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            if EVEN_N:
                x = tl.load(x_ptr + row * N + offs)
            else:
                x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
            tl.store(out_ptr + row * N + offs, x * scale, mask=offs < N)

    x = torch.randn(3, 24)
    out = torch.empty_like(x)
    case = {"x_ptr": x, "out_ptr": out, "scale": 2.0, "N": 24}
    keys = _compile_keys(row_scale, case)
    opts = (("num_ctas", 1), ("num_stages", 3))
    assert keys == {
        (("BLOCK_N", b), ("EVEN_N", False), ("N", 24), *opts, ("num_warps", w), ("scale", 2.0))
        for b, w in [(16, 1), (16, 2), (32, 2)]  # BLOCK_N 64 pruned; none divides 24
    }
    assert row_scale.nargs is None and bench.calls == 0  # the walk compiles and times nothing
    for _ in range(2):
        row_scale[(3,)](**case)
        torch.testing.assert_close(out, 2.0 * x)
    assert bench.calls == 3 and row_scale.best_config.kwargs == {"BLOCK_N": 16}
    assert row_scale.best_config.num_warps == 2
    assert named_args_seen == [{}, {}]  # keyword-only launches: Triton's named_args are the positional ones


# ---- Unsloth: MoE grouped GEMM configs, a prune that rewrites them, and the autotune cache ------------
# Y[i] = X[gather[i] // TOPK] @ W, rows of X gathered by token (PERMUTE_X). A "TMA" load of X reads the
# rows in order (no gather), which is wrong for a permuted X: the prune turns the flag off in place,
# which makes configs that differed only in it equal; a block wider than twice the tokens per expert is
# pruned. After the launch the cache record reads the winner back and the plain kernel runs with it.
@triton.jit
def _grouped_gemm_fwd(x_ptr, w_ptr, y_ptr, gather_ptr, NUM_TOKENS, K: tl.constexpr, N: tl.constexpr,
                      TOPK: tl.constexpr, PERMUTE_X: tl.constexpr, NUM_EXPERTS: tl.constexpr,
                      BLOCK_SIZE_M: tl.constexpr, USE_TMA_LOAD_X: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    mask = rows < NUM_TOKENS * TOPK
    if PERMUTE_X and not USE_TMA_LOAD_X:
        src = tl.load(gather_ptr + rows, mask=mask, other=0) // TOPK
    else:
        src = rows // TOPK
    ks, ns = tl.arange(0, K), tl.arange(0, N)
    x = tl.load(x_ptr + src[:, None] * K + ks[None, :], mask=mask[:, None], other=0.0)
    w = tl.load(w_ptr + ks[:, None] * N + ns[None, :])
    tl.store(y_ptr + rows[:, None] * N + ns[None, :], tl.dot(x, w), mask=mask[:, None])


def _unsloth_forward_configs():
    return [
        triton.Config({"BLOCK_SIZE_M": m, "USE_TMA_LOAD_X": tma}, num_warps=w, num_stages=3)
        for m, w, tma in itertools.product((16, 32, 64), (4, 8), (True, False))
    ]


def _unsloth_prune_fwd(configs, args, **kwargs):
    tokens_per_expert = kwargs["NUM_TOKENS"] * kwargs["TOPK"] // kwargs["NUM_EXPERTS"]
    pruned = []
    for config in configs:
        if config.kwargs["BLOCK_SIZE_M"] > 2 * tokens_per_expert:
            continue
        if config.kwargs["USE_TMA_LOAD_X"] and kwargs["PERMUTE_X"]:
            config.kwargs["USE_TMA_LOAD_X"] = False  # TMA load incompatible with a permuted X
        pruned.append(config)
    return pruned


@dataclasses.dataclass
class KernelConfigForward:  # the record the autotune cache keeps and saves (`__dict__` as JSON)
    BLOCK_SIZE_M: int
    num_warps: int
    num_stages: int
    use_tma_load_x: bool


@pytest.mark.parametrize("impl", IMPLS)
def test_unsloth_prune_rewrites_configs_in_place_and_the_cache_reads_the_winner(impl, tmp_path):
    calls = []

    def record(nargs, reset_only=False):  # the test's: which config each timed run launches
        if not reset_only:
            calls.append({k: nargs[k] for k in ("BLOCK_SIZE_M", "USE_TMA_LOAD_X", "num_warps")})

    # one time per distinct config: 32 rows with 8 warps is the fastest; TMA would be faster still
    bench = BenchByConfig(
        calls, lambda c: 1.0 + (c["BLOCK_SIZE_M"] != 32) + (c["num_warps"] != 8) - c["USE_TMA_LOAD_X"]
    )
    configs = _unsloth_forward_configs()
    tuned = autotune_of(impl)(
        configs=configs,
        key=["NUM_TOKENS", "NUM_EXPERTS", "TOPK", "PERMUTE_X"],
        prune_configs_by={"early_config_prune": _unsloth_prune_fwd},
        pre_hook=record,
        do_bench=bench,
    )(_grouped_gemm_fwd)
    torch.manual_seed(0)
    num_tokens, topk, experts, K, N = 12, 2, 1, 16, 16
    x, w = torch.randn(num_tokens, K), torch.randn(K, N)
    gather = torch.randperm(num_tokens * topk).to(torch.int32)
    y = torch.empty(num_tokens * topk, N)

    def forward(kernel):
        kernel[lambda m: (triton.cdiv(num_tokens * topk, m["BLOCK_SIZE_M"]),)](
            x_ptr=x, w_ptr=w, y_ptr=y, gather_ptr=gather, NUM_TOKENS=num_tokens, K=K, N=N, TOPK=topk,
            PERMUTE_X=True, NUM_EXPERTS=experts,
        )  # fmt: skip
        torch.testing.assert_close(y, x[gather.long() // topk] @ w)

    forward(tuned)
    best = tuned.best_config
    # every config left was rewritten in place; each distinct one was timed with the flag off
    assert all(not c.kwargs["USE_TMA_LOAD_X"] for c in configs if c.kwargs["BLOCK_SIZE_M"] <= 48)
    assert {(c["BLOCK_SIZE_M"], c["num_warps"]) for c in bench.timed} == {(16, 4), (16, 8), (32, 4), (32, 8)}
    assert not any(c["USE_TMA_LOAD_X"] for c in bench.timed)
    assert best in configs and (best.kwargs["BLOCK_SIZE_M"], best.num_warps) == (32, 8)
    entry = KernelConfigForward(
        BLOCK_SIZE_M=best.kwargs["BLOCK_SIZE_M"],
        num_warps=best.num_warps,
        num_stages=best.num_stages,
        use_tma_load_x=best.kwargs.get("USE_TMA_LOAD_X", False),
    )
    saved = tmp_path / "moe_autotune.json"
    saved.write_text(json.dumps({"config_fwd": entry.__dict__, "triton": best.__dict__}), encoding="utf-8")
    loaded = KernelConfigForward(**json.loads(saved.read_text(encoding="utf-8"))["config_fwd"])
    assert loaded == KernelConfigForward(BLOCK_SIZE_M=32, num_warps=8, num_stages=3, use_tma_load_x=False)
    # autotune=False: the plain kernel with the cached config
    _grouped_gemm_fwd[(triton.cdiv(num_tokens * topk, loaded.BLOCK_SIZE_M),)](
        x, w, y, gather, num_tokens, K=K, N=N, TOPK=topk, PERMUTE_X=True, NUM_EXPERTS=experts,
        BLOCK_SIZE_M=loaded.BLOCK_SIZE_M, USE_TMA_LOAD_X=loaded.use_tma_load_x,
        num_warps=loaded.num_warps, num_stages=loaded.num_stages,
    )  # fmt: skip
    torch.testing.assert_close(y, x[gather.long() // topk] @ w)
    timed = len(bench.timed)
    forward(tuned)  # the tuned kernel again: a hit
    assert len(bench.timed) == timed and tuned.best_config is best


# ---- DeepSpeed: the fp16 matmul, its autotune table and skip_autotune --------------------------------
SKIP_AUTOTUNE = [False]
CACHE_STRIDE = 32


def _fp16_matmul_prune_config(configs, named_args, skip_autotune=None, **kwargs):
    # DeepSpeed's takes (configs, named_args) as Triton 2 called it; Triton 3 passes the keywords too
    if SKIP_AUTOTUNE[0] if skip_autotune is None else skip_autotune:
        return [configs[0]]
    return [c for c in configs if c.kwargs["BLOCK_K"] <= named_args["K"]]  # stand-in for the smem check


def _deepspeed_matmul(autotune, bench):
    @autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 1}, num_stages=3, num_warps=8
            ),
            triton.Config(
                {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 1}, num_stages=4, num_warps=4
            ),
            triton.Config(
                {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 1}, num_stages=5, num_warps=2
            ),
        ],
        key=["CACHE_M", "CACHE_N", "CACHE_K"],
        prune_configs_by={"early_config_prune": _fp16_matmul_prune_config, "perf_model": None, "top_k": 10},
        do_bench=bench,
    )
    @triton.heuristics({"EVEN_K": lambda args: args["K"] % (args["BLOCK_K"] * args["SPLIT_K"]) == 0})
    @triton.jit
    def _fp_matmul(A, B, C, M, N, K, bias, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   CACHE_M, CACHE_N, CACHE_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                   ACC_TYPE: tl.constexpr, BIAS_ADD: tl.constexpr, ACTIVATION: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        grid_m = (M + BLOCK_M - 1) // BLOCK_M
        grid_n = (N + BLOCK_N - 1) // BLOCK_N
        width = GROUP_M * grid_n
        group_id = pid // width
        group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
        pid_m = group_id * GROUP_M + (pid % group_size)
        pid_n = (pid % width) // group_size
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        A = A + ((rm % M)[:, None] * stride_am + rk[None, :] * stride_ak)
        B = B + (rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_TYPE)
        for k in range(K, 0, -BLOCK_K * SPLIT_K):
            if EVEN_K:
                a = tl.load(A)
                b = tl.load(B)
            else:
                a = tl.load(A, mask=rk[None, :] < k, other=0.0)
                b = tl.load(B, mask=rk[:, None] < k, other=0.0)
            acc += tl.dot(a, b)
            A += BLOCK_K * SPLIT_K * stride_ak
            B += BLOCK_K * SPLIT_K * stride_bk
        if BIAS_ADD:
            acc = acc + tl.load(bias + rn, mask=rn < N)[None, :]
        if ACTIVATION == "relu":
            acc = tl.where(acc >= 0, acc, 0)
        C = C + (rm[:, None] * stride_cm + rn[None, :] * stride_cn)
        tl.store(C, acc.to(C.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])

    def forward(A, B, bias=None, activation=""):
        M, K = A.shape
        _, N = B.shape
        C = torch.empty((M, N), dtype=A.dtype)
        acc_type = tl.float32 if A.dtype in (torch.float16, torch.bfloat16, torch.float32) else tl.int32

        def grid(META):
            return (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]), META["SPLIT_K"])

        _fp_matmul[grid](A, B, C, M, N, K, bias, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                         C.stride(0), C.stride(1), M // CACHE_STRIDE, N // CACHE_STRIDE, K // CACHE_STRIDE,
                         GROUP_M=8, ACC_TYPE=acc_type, BIAS_ADD=(0 if bias is None else 1),
                         ACTIVATION=activation)  # fmt: skip
        return C

    return _fp_matmul, forward


def _update_autotune_table(path, kernel):
    """matmul_ext's `_update_autotune_table` (at exit): the file's table, updated with `kernel.cache`."""
    table = (
        {tuple(k): cfg for k, cfg in json.loads(path.read_text(encoding="utf-8"))} if path.exists() else {}
    )
    table.update({k: cfg.__dict__ for k, cfg in kernel.cache.items()})
    path.write_text(json.dumps([[list(k), cfg] for k, cfg in table.items()]), encoding="utf-8")


def _read_autotune_table(path, kernel):
    table = {tuple(k): triton.Config(**cfg) for k, cfg in json.loads(path.read_text(encoding="utf-8"))}
    if table:
        kernel.cache = table


@pytest.mark.parametrize("impl", IMPLS)
def test_deepspeed_matmul_autotune_table_moves_to_the_next_process(impl, tmp_path):
    torch.manual_seed(0)
    # per key: three configs (16x32x16 fastest), or two where K=16 prunes BLOCK_K 32 (16x16x16 fastest)
    bench = Bench(times=[3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0])
    kernel, matmul = _deepspeed_matmul(autotune_of(impl), bench)
    shapes = [(48, 40, 32), (20, 24, 16), (40, 48, 32)]  # the third shares the first's bucket (1, 1, 1)
    for M, N, K in shapes:
        a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
        torch.testing.assert_close(matmul(a, b), a @ b)
        torch.testing.assert_close(matmul(a, b, bias, "relu"), torch.relu(a @ b + bias))
    # two buckets, each with and without a bias tensor (whose dtype joins the key): the third shape hits
    assert bench.calls == 10
    f32 = "torch.float32"
    assert {k: (c.kwargs["BLOCK_N"], c.num_warps) for k, c in kernel.cache.items()} == {
        (1, 1, 1, f32, f32, f32): (32, 4),
        (1, 1, 1, f32, f32, f32, f32): (32, 4),
        (0, 0, 0, f32, f32, f32): (16, 2),
        (0, 0, 0, f32, f32, f32, f32): (16, 2),
    }
    table = tmp_path / "Fp16Matmul_2d_kernel.json"
    _update_autotune_table(table, kernel)
    _update_autotune_table(table, kernel)  # merging again changes nothing

    # the next process: a new kernel object reads the table, and times nothing
    bench2 = Bench()
    kernel2, matmul2 = _deepspeed_matmul(autotune_of(impl), bench2)
    _read_autotune_table(table, kernel2)
    for M, N, K in shapes:
        a, b = torch.randn(M, K), torch.randn(K, N)
        torch.testing.assert_close(matmul2(a, b), a @ b)
    assert bench2.calls == 0
    assert kernel2.best_config.kwargs == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 1}

    # skip_autotune: the first config only, for every shape, never timed
    kernel2.configs = [kernel2.configs[0]]
    a, b = torch.randn(64, 16), torch.randn(16, 64)
    torch.testing.assert_close(matmul2(a, b), a @ b)
    assert bench2.calls == 0 and kernel2.best_config.kwargs["BLOCK_M"] == 32


# ---- wrappers put on the JIT function's `run` after decoration ----------------------------------------
# A lock for thread safety, a launch recorder or a profiler shim is often installed on the JIT function
# once the kernel is defined: on the kernel's own JIT instance (`kernel.fn.run = wrap(kernel.fn.run)`) or
# on the class (`JITFunction.run = wrap(JITFunction.run)`). Triton's Autotuner (and a `@triton.heuristics`
# between it and the JIT function) looks up `self.fn.run` at every timed run and launch, so the wrapper
# sees them all.
def _counting(calls, name, run, lock):
    def wrapped(*args, **kwargs):
        with lock:
            calls[name] += 1
            return run(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("layers", ["jit", "heuristics", "config_pre_hook"])
@pytest.mark.parametrize("impl", IMPLS)
def test_run_wrappers_installed_after_decoration_see_every_launch(impl, layers, monkeypatch):
    import threading

    hooked = []
    hook = hooked.append if layers == "config_pre_hook" else None
    cfgs = [triton.Config({"BLOCK": b}, num_warps=4, pre_hook=hook) for b in (16, 32, 64)]
    bench = Bench(times=[3.0, 1.0, 2.0])

    @triton.jit
    def fill(dst, N, SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK * SCALE, tl.float32), mask=offs < N)

    inner = triton.heuristics({"SCALE": lambda args: 2})(fill) if layers == "heuristics" else fill
    kernel = autotune_of(impl)(configs=cfgs, key=["N"], do_bench=bench)(inner)
    assert kernel.fn is inner

    calls = {"class": 0, "jit": 0, "heuristics": 0}
    lock = threading.RLock()
    cls = type(fill)  # JITFunction, or the interpreter's InterpretedFunction
    monkeypatch.setattr(cls, "run", _counting(calls, "class", cls.run, lock))
    fill.run = _counting(calls, "jit", fill.run, lock)  # calls the class's (wrapped) run
    if layers == "heuristics":
        inner.run = _counting(calls, "heuristics", inner.run, lock)
    scale = (2,) if layers == "heuristics" else (1,)
    args = () if layers == "heuristics" else scale  # SCALE from the heuristic, or passed
    for _ in range(3):  # a miss (three timed runs and the launch), then two hits
        dst = torch.zeros(50)
        kernel[grid_of(50)](dst, 50, *args)
        assert torch.equal(dst, torch.full((50,), 32.0 * scale[0]))
    assert bench.calls == 3 and kernel.best_config is cfgs[1]
    assert calls == {"class": 6, "jit": 6, "heuristics": 6 if layers == "heuristics" else 0}
    if layers == "config_pre_hook":
        assert len(hooked) == 6  # before each timed run and each launch


# ---- a function put on Triton's Autotuner class in place of `run` --------------------------------------
# vLLM's VLLM_TRITON_FORCE_FIRST_CONFIG does `Autotuner.run = first_config_run`; other code wraps
# `Autotuner.run` to add a lock. Triton's kernels call it. The drop-in, though an instance of Autotuner,
# has a `run` of its own and does not: a deliberate difference (docs/api.md, "Where the drop-in differs"),
# since a wrapper that calls the `run` it replaced would run Triton's own tuning on the drop-in. The same
# function assigned to the kernel's own `run` is called by both (the vLLM test above).
@pytest.mark.parametrize("impl", IMPLS)
def test_a_run_put_on_tritons_autotuner_class_is_not_called_by_the_drop_in(impl, monkeypatch):
    from triton.runtime.errors import InterpreterError

    picked = {}
    monkeypatch.setattr(Autotuner, "run", _first_valid_config_run((InterpreterError,), picked))
    bench = Bench(times=[3.0, 1.0, 2.0])
    fill = fill_kernel(impl, bench)  # BLOCK 16, 32, 64
    assert isinstance(fill, Autotuner)
    for _ in range(2):
        dst = torch.zeros(50)
        fill[grid_of(50)](dst, N=50)
        if impl == "triton":  # the class's function: the first config, untimed
            assert torch.equal(dst, torch.full((50,), 16.0))
            assert bench.calls == 0 and picked == {(id(fill), (50,)): 0}
        else:  # the drop-in's own launch: tuned (the fastest is BLOCK 32), the function never called
            assert torch.equal(dst, torch.full((50,), 32.0))
            assert bench.calls == 3 and picked == {}
    monkeypatch.undo()
    fill.run = types.MethodType(_first_valid_config_run((InterpreterError,), picked), fill)
    fill[grid_of(20)](dst, N=20)  # on the kernel itself: called by both
    assert picked[(id(fill), (20,))] == 0
