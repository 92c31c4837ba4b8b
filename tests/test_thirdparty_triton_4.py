"""Four more ways that real projects use Triton's autotuner, each run with `triton.autotune` and with the
one-line swap to `tuner.autotune` under the Triton interpreter where both can run it (the pattern of
tests/test_thirdparty_triton.py and tests/test_thirdparty_triton_more.py, for projects those files do not
cover). The kernels and the code around them are written here after the structure of each project (cited
in each section), not copied:

- FlagGems (github.com/FlagOpen/FlagGems, Apache-2.0): `libentry()` above the autotuner (its own cache of
  launches keyed on the arguments' specialisation, which walks `.fn` for the constexprs the autotuner and
  the heuristics chose and then launches without the autotuner), configs read from a per-backend
  `tune_configs.yaml` table, a `@triton.heuristics` beneath that reads a tuned value, and `LibCache`, a
  table of winners saved to sqlite and preloaded into `.cache`.
- torchao (github.com/pytorch/ao, BSD-3-Clause): the int8 matmul of torchao/kernel/intmm_triton.py (configs
  generated as a product of block sizes, num_stages and num_warps; key M, N, K) with the pruning of the
  matmul kernels that copy Triton 2's `ops/matmul.py` (`early_config_prune`, `estimate_matmul_time`,
  `top_k`), heuristics beneath that rewrite a tuned value (torchao/prototype/hqq/kernels.py), two
  autotuners over one heuristics-wrapped kernel, all behind a `torch.library.custom_op` called eagerly.
- vLLM / SGLang (github.com/vllm-project/vllm, Apache-2.0): fused_moe's per-device JSON tables keyed by
  batch size (`get_config_file_name(E, N, dtype)`, `try_get_optimal_moe_config`: the entry of the nearest M)
  written by a tuning script (benchmarks/kernels/benchmark_moe.py), replaced by tuner's tune, export and
  `mode="offline"` with the exported file.
- Liger-Kernel (github.com/linkedin/Liger-Kernel, BSD-2-Clause): `calculate_settings(n)` (BLOCK_SIZE the
  next power of two of the row, num_warps from it) and an RMSNorm whose torch.autograd.Function launches a
  forward and a backward kernel, the backward writing dX into dY in place.

On the CPU both decorators get an injected `do_bench` (Triton's default times with CUDA events), so the
winner is known in advance and the two can be compared.
"""

from __future__ import annotations

import ast
import sqlite3
import threading

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime import Autotuner, Heuristics, KernelInterface  # noqa: E402

from tests.test_triton_autotuner_class import IMPLS, Bench, autotune_of, jit_function_types  # noqa: E402


# ---- FlagGems: utils/libentry.py, runtime/backend/_<vendor>/tune_configs.yaml, ops/softmax.py ----------
# A library entry above the autotuner: the first launch of each specialisation (argument dtypes and
# alignment, the values of integer arguments, the constexprs passed) goes through `fn.run`; it then walks
# the wrappers for the constexprs that ran (`best_config` of the Autotuner, the values of the Heuristics)
# and later launches of that specialisation skip the autotuner. On a GPU the entry keeps the compiled
# kernel `fn.run` returns and launches it; under the interpreter `run` returns no compiled kernel, so it
# launches the JIT function with the constexprs it captured (what the compiled kernel was built with).
class LibEntry(KernelInterface):
    def __init__(self, fn):
        self.fn, self.arg_names = fn, fn.arg_names
        jit = fn
        while not isinstance(jit, jit_function_types()):
            jit = jit.fn
        self.jit_function = jit
        self.kernel_cache: dict[tuple, tuple] = {}
        self.lock = threading.Lock()

    @staticmethod
    def key(args, kwargs):
        def spec(a):
            return (a.dtype, a.data_ptr() % 16 == 0) if hasattr(a, "data_ptr") else (type(a), a)

        return tuple(spec(a) for a in args) + tuple(sorted(kwargs.items()))

    def run(self, *args, grid, warmup=False, **kwargs):
        k = self.key(args, kwargs)
        if k not in self.kernel_cache:
            with self.lock:
                kernel = self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)
                fn, constexprs = self.fn, {}
                while not isinstance(fn, jit_function_types()):
                    if isinstance(fn, Autotuner):
                        cfg = fn.best_config
                        constexprs.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
                        constexprs.update(num_ctas=cfg.num_ctas, **cfg.kwargs)
                    elif isinstance(fn, Heuristics):
                        named = {**dict(zip(fn.arg_names, args, strict=False)), **kwargs, **constexprs}
                        constexprs.update({v: heur(named) for v, heur in fn.values.items()})
                    else:
                        raise RuntimeError("Invalid Runtime Function")
                    fn = fn.fn
                self.kernel_cache[k] = (kernel, constexprs)
            return self.kernel_cache[k]
        kernel, constexprs = self.kernel_cache[k]
        if callable(grid):
            grid = grid({**dict(zip(self.arg_names, args, strict=False)), **kwargs, **constexprs})
        self.jit_function[grid](*args, **kwargs, **constexprs)
        return kernel, constexprs


def libentry():
    return LibEntry


TUNE_CONFIGS_YAML = """
softmax_inner:
  - META: {TILE_N: 16}
    num_warps: 4
  - META: {TILE_N: 32}
    num_warps: 4
  - META: {TILE_N: 64}
    num_warps: 8
    num_stages: 1
"""


def get_tuned_config(table, op_name):
    """FlagGems' loader: one triton.Config per entry of the op, its launch options where given."""
    return [
        triton.Config(dict(e.get("META", {})), **{k: e[k] for k in ("num_warps", "num_stages") if k in e})
        for e in table.get(op_name, [])
    ]


def _flaggems_softmax(autotune, bench, table):
    @libentry()
    @autotune(configs=get_tuned_config(table, "softmax_inner"), key=["M", "N"], do_bench=bench)
    @triton.heuristics({"ONE_TILE_PER_CTA": lambda args: args["TILE_N"] >= args["N"]})
    @triton.jit
    def softmax_kernel_inner(
        output_ptr, input_ptr, M, N, TILE_N: tl.constexpr, ONE_TILE_PER_CTA: tl.constexpr
    ):
        row = tl.program_id(0)
        if ONE_TILE_PER_CTA:
            offs = tl.arange(0, TILE_N)
            inp = tl.load(input_ptr + row * N + offs, mask=offs < N, other=-float("inf"))
            e = tl.exp(inp - tl.max(inp, 0))
            tl.store(output_ptr + row * N + offs, e / tl.sum(e, 0), mask=offs < N)
        else:  # online softmax over tiles, then a second pass
            m = tl.full([TILE_N], -float("inf"), tl.float32)
            z = tl.zeros([TILE_N], tl.float32)
            for start in range(0, N, TILE_N):
                offs = start + tl.arange(0, TILE_N)
                inp = tl.load(input_ptr + row * N + offs, mask=offs < N, other=-float("inf"))
                m_new = tl.maximum(m, inp)
                z = tl.where(m_new == -float("inf"), z, z * tl.exp(m - m_new) + tl.exp(inp - m_new))
                m = m_new
            m_row = tl.max(m, 0)
            z_row = tl.sum(z * tl.exp(m - m_row), 0)
            for start in range(0, N, TILE_N):
                offs = start + tl.arange(0, TILE_N)
                inp = tl.load(input_ptr + row * N + offs, mask=offs < N, other=-float("inf"))
                tl.store(output_ptr + row * N + offs, tl.exp(inp - m_row) / z_row, mask=offs < N)

    def softmax(x):
        M, N = x.shape
        out = torch.empty_like(x)
        softmax_kernel_inner[(M, 1, 1)](out, x, M, N)
        return out

    return softmax_kernel_inner, softmax


def _count_runs(autotuner):
    """Wrap the autotuner's `run` (as code that records launches does): what the library entry calls."""
    calls = []
    inner = autotuner.run

    def run(*args, **kwargs):
        calls.append(args[2:4])
        return inner(*args, **kwargs)

    autotuner.run = run
    return calls


def _save_lib_cache(db, table_name, cache):
    """FlagGems' LibCache.store: one sqlite table per kernel, `str(key)` -> `str(config)`."""
    with sqlite3.connect(db) as c:
        c.execute(f"CREATE TABLE IF NOT EXISTS {table_name} (key TEXT PRIMARY KEY, config TEXT)")
        for k, cfg in cache.items():
            c.execute(f"INSERT OR REPLACE INTO {table_name} VALUES (?, ?)", (str(k), str(cfg)))


def _load_lib_cache(db, table_name):
    """FlagGems' LibCache.preload: parse `str(config)` back ("TILE_N: 32, num_warps: 4, ...")."""
    out = {}
    with sqlite3.connect(db) as c:
        for key_str, cfg_str in c.execute(f"SELECT key, config FROM {table_name}"):
            items = dict(item.split(": ") for item in cfg_str.split(", "))
            opts = {
                k: ast.literal_eval(items.pop(k)) for k in ("num_warps", "num_ctas", "num_stages", "maxnreg")
            }
            out[ast.literal_eval(key_str)] = triton.Config(
                {k: ast.literal_eval(v) for k, v in items.items()}, **opts
            )
    return out


@pytest.mark.parametrize("impl", IMPLS)
def test_flaggems_libentry_over_the_autotuner_with_a_yaml_config_table(impl, tmp_path):
    yaml = pytest.importorskip("yaml")
    table = yaml.safe_load(TUNE_CONFIGS_YAML)
    bench = Bench(times=[3.0, 1.0, 2.0, 2.0, 3.0, 1.0])  # N=40: TILE_N 32 (tiles); N=20: TILE_N 64 (one tile)
    entry, softmax = _flaggems_softmax(autotune_of(impl), bench, table)
    assert isinstance(entry.fn, Autotuner) and entry.arg_names[:4] == ["output_ptr", "input_ptr", "M", "N"]
    assert list(entry.fn.keys) == ["M", "N"] and len(entry.fn.configs) == 3
    runs = _count_runs(entry.fn)
    torch.manual_seed(0)
    for shape in [(4, 40), (4, 40), (3, 20), (4, 40)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    assert bench.calls == 6
    assert runs == [(4, 40), (3, 20)]  # later launches of a specialisation skip the autotuner
    f = sorted((c for _, c in entry.kernel_cache.values()), key=lambda c: c["TILE_N"])
    assert f[0] == {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "TILE_N": 32, "ONE_TILE_PER_CTA": False}
    assert f[1] == {"num_warps": 8, "num_stages": 1, "num_ctas": 1, "TILE_N": 64, "ONE_TILE_PER_CTA": True}
    f32 = "torch.float32"
    assert set(entry.fn.cache) == {(4, 40, f32, f32), (3, 20, f32, f32)}

    # LibCache: the winners saved to sqlite, then (a new process) preloaded into a new autotuner's `.cache`;
    # a row edited by hand is what that key runs, untimed
    db = tmp_path / "TunedConfig.db"
    _save_lib_cache(db, "softmax_kernel_inner_0123abcd", entry.fn.cache)
    with sqlite3.connect(db) as c:
        c.execute(
            "UPDATE softmax_kernel_inner_0123abcd SET config = ? WHERE key = ?",
            ("TILE_N: 16, num_warps: 2, num_ctas: 1, num_stages: 2, maxnreg: None", str((4, 40, f32, f32))),
        )
    bench2 = Bench()
    entry2, softmax2 = _flaggems_softmax(autotune_of(impl), bench2, table)
    entry2.fn.cache = _load_lib_cache(db, "softmax_kernel_inner_0123abcd")
    for shape in [(4, 40), (3, 20)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(softmax2(x), torch.softmax(x, dim=-1))
    assert bench2.calls == 0
    got2 = sorted((c["TILE_N"], c["num_warps"], c["num_stages"]) for _, c in entry2.kernel_cache.values())
    assert got2 == [(16, 2, 2), (64, 8, 1)]


# ---- torchao: kernel/intmm_triton.py (int8 configs, key M, N, K, the torchao:: ops), prototype/hqq ------
# An int8 x int8 -> int32 matmul scaled per row (torchao's `int_scaled_matmul`), with configs generated
# as a product of block sizes and (num_stages, num_warps) pairs, pruned as the matmuls copied from Triton
# 2's ops/matmul.py prune them (`early_config_prune` by the shared memory num_stages buffers take, then
# `estimate_matmul_time` keeps its `top_k`), a @triton.heuristics beneath that rewrites a tuned value (hqq
# caps BLOCK_K by its quantisation group; here by K) and sets EVEN_K from it, and two autotuners over the
# one heuristics-wrapped kernel (hqq's `mixed_mm_kernel_compute_bound` and `..._max_autotune`). The op
# is a `torch.library.custom_op` with a fake implementation, called eagerly. (Configs trimmed from 960
# to 12 + 6; shapes scaled down.)
SMEM_BYTES = 2048  # the early prune's shared memory budget (a GPU's is ~100x larger; the shapes are too)


def int8_mm_configs(blocks, stages_warps):
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
        for (m, n, k) in blocks
        for (s, w) in stages_warps
    ]


COMPUTE_BOUND = int8_mm_configs(
    [(16, 16, 16), (32, 16, 16), (16, 32, 32), (32, 32, 32)], [(1, 2), (2, 4), (4, 8)]
)
IO_BOUND = int8_mm_configs([(16, 16, 64), (16, 64, 16)], [(1, 2), (2, 4), (3, 4)])
PRUNED: list = []


def early_config_prune(configs, named_args, **kwargs):
    """Drops configs whose num_stages buffers of A and B tiles (int8) exceed the shared memory."""
    PRUNED.append(len(configs))
    assert named_args["a_ptr"].dtype == torch.int8 and "grid" in kwargs
    return [
        c
        for c in configs
        if (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * c.num_stages <= SMEM_BYTES
    ]


def estimate_matmul_time(num_warps, num_stages, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, **kwargs):
    """More programs and more K steps rate worse, so the perf model's top 3 are known in advance."""
    return triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N) * triton.cdiv(K, BLOCK_K) + num_stages / 10


def _torchao_int_scaled_matmul(autotune, bench, op_name):
    @triton.jit
    def scaled_matmul_kernel(a_ptr, b_ptr, c_ptr, s1_ptr, M, N, K,
                             stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
        pid = tl.program_id(axis=0)  # grouped ordering of the programs, for L2 reuse
        num_pid_in_group = GROUP_M * tl.cdiv(N, BLOCK_N)
        first_pid_m = (pid // num_pid_in_group) * GROUP_M
        group_rows = min(tl.cdiv(M, BLOCK_M) - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (pid % group_rows)
        pid_n = (pid % num_pid_in_group) // group_rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        A = a_ptr + ((rm % M)[:, None] * stride_am + rk[None, :] * stride_ak)
        B = b_ptr + (rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k in range(K, 0, -BLOCK_K):
            if EVEN_K:
                a = tl.load(A)
                b = tl.load(B)
            else:
                a = tl.load(A, mask=rk[None, :] < k, other=0)
                b = tl.load(B, mask=rk[:, None] < k, other=0)
            acc += tl.dot(a, b)
            A += BLOCK_K * stride_ak
            B += BLOCK_K * stride_bk
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        scale = tl.load(s1_ptr + rm, mask=rm < M, other=0.0)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc * scale[:, None], mask=mask)

    heuristics = {
        "BLOCK_K": lambda args: min(args["BLOCK_K"], triton.next_power_of_2(args["K"])),
        "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    }
    _int8_mm = triton.heuristics(heuristics)(scaled_matmul_kernel)
    prune = {"early_config_prune": early_config_prune, "perf_model": estimate_matmul_time, "top_k": 3}
    kernels = {
        "compute_bound": autotune(
            configs=COMPUTE_BOUND, key=["M", "N", "K"], prune_configs_by=prune, do_bench=bench
        )(_int8_mm),
        "max_autotune": autotune(
            configs=COMPUTE_BOUND + IO_BOUND, key=["M", "N", "K"], prune_configs_by=prune, do_bench=bench
        )(_int8_mm),
    }

    def launch(kernel, a, b, scales1):
        M, K = a.shape
        _, N = b.shape
        c = torch.empty((M, N), dtype=scales1.dtype)
        grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)  # noqa: E731
        kernel[grid](a, b, c, scales1, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1))  # fmt: skip
        return c

    @torch.library.custom_op(op_name, mutates_args=())
    def int_scaled_matmul(a: torch.Tensor, b: torch.Tensor, scales1: torch.Tensor, mode: str) -> torch.Tensor:
        assert a.shape[1] == b.shape[0], "Incompatible dimensions"
        return launch(kernels[mode], a, b, scales1)

    @int_scaled_matmul.register_fake
    def _(a, b, scales1, mode):
        return a.new_empty((a.shape[0], b.shape[1]), dtype=scales1.dtype)

    return kernels, int_scaled_matmul


@pytest.mark.parametrize("impl", IMPLS)
def test_torchao_int8_matmul_pruned_by_smem_and_perf_model_inside_a_custom_op(impl):
    PRUNED.clear()
    bench = Bench(times=[3.0, 1.0, 2.0] * 4)  # of each top 3, the second timed wins
    kernels, op = _torchao_int_scaled_matmul(
        autotune_of(impl), bench, f"tuner_test_torchao::int_scaled_mm_{impl}"
    )
    torch.manual_seed(0)

    def check(M, N, K, mode):
        a = torch.randint(-128, 128, (M, K), dtype=torch.int8)
        b = torch.randint(-128, 128, (K, N), dtype=torch.int8)
        s = torch.rand(M, 1).squeeze(1)
        torch.testing.assert_close(op(a, b, s, mode), (a.int() @ b.int()).float() * s[:, None])

    check(24, 40, 48, "compute_bound")
    check(24, 40, 48, "compute_bound")  # a hit
    check(8, 16, 20, "compute_bound")  # K=20: not EVEN_K, BLOCK_K capped at 32 by the heuristics
    check(24, 40, 48, "max_autotune")  # the second autotuner over the kernel tunes the key for itself
    check(24, 40, 48, "max_autotune")
    assert bench.calls == 9 and PRUNED == [12, 12, 18]
    cb, ma = kernels["compute_bound"], kernels["max_autotune"]
    # compute-bound at (24, 40, 48): the smem prune leaves 7 of 12 (one stage for the 32-wide K tiles);
    # the perf model ranks (32, 32, 32), (16, 32, 32), (32, 16, 16) best, all at one stage; the second wins
    f32, i8 = "torch.float32", "torch.int8"
    tile = {k[:3]: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages, c.num_warps)
            for k, c in cb.cache.items()}  # fmt: skip
    assert tile == {(24, 40, 48): (16, 32, 32, 1, 2), (8, 16, 20): (32, 32, 32, 1, 2)}
    assert list(cb.cache)[0] == (24, 40, 48, i8, i8, f32, f32)
    # max-autotune adds two io-bound tiles that rank (with a tie, kept in list order) right after
    # (32, 32, 32): the first of them, (16, 16, 64), is timed second and wins
    best = ma.cache[(24, 40, 48, i8, i8, f32, f32)]
    assert best.kwargs == {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 8} and best.num_stages == 1
    assert ma.best_config is best and len(ma.cache) == 1 and len(cb.cache) == 2
    torch.library.opcheck(op, (torch.ones(8, 16, dtype=torch.int8), torch.ones(16, 16, dtype=torch.int8),
                               torch.ones(8), "compute_bound"))  # fmt: skip
    assert bench.calls == 12  # opcheck's calls (schema, fake, dispatch checks) tune the new key once


# ---- Triton 1's `prune_num_stages_by`, still passed by matmuls copied from Triton 1/2's ops/matmul.py ----
def prune_num_stages(configs, named_args=None, **kwargs):  # never called by Triton 2 or 3
    raise AssertionError("prune_num_stages_by is not a field of Triton 3's prune_configs_by")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_prune_configs_by_field_that_triton_ignores_is_ignored(impl, recwarn):
    bench = Bench(times=[2.0, 1.0, 3.0])
    prune = {
        "prune_num_stages_by": prune_num_stages,
        "perf_model": lambda BLOCK, **kw: -BLOCK,  # the largest blocks first
        "top_k": 2,
    }

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)],
        key=["N"],
        prune_configs_by=prune,
        do_bench=bench,
    )
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)

    dst = torch.zeros(100)
    fill[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](dst, 100)
    assert bench.calls == 2 and fill.best_config.kwargs == {"BLOCK": 32}  # of 64, 32 timed: 32 wins
    assert torch.equal(dst, torch.full((100,), 32.0))
    said = [str(w.message) for w in recwarn if "prune_configs_by" in str(w.message)]
    if impl == "tuner":  # Triton ignores it silently; the drop-in says it does
        assert said == [
            "prune_configs_by fields ['prune_num_stages_by'] are ignored, as triton.autotune ignores them; "
            "it uses perf_model, top_k and early_config_prune"
        ]


# ---- Liger-Kernel: ops/utils.py (`calculate_settings`), ops/rms_norm.py ----------------------------------
# Liger (and Unsloth, whose kernels Liger's RMSNorm cites) launch each kernel with BLOCK_SIZE, the next
# power of two of the row, and num_warps chosen from it. With the drop-in, num_warps is tuned instead
# (configs that differ only in it, keyed on the row length) and BLOCK_SIZE still comes from the
# settings; the explicit `num_warps=` leaves the launch (both autotuners refuse a launch option that the
# configs set). The backward kernel writes dX into dY in place, so it names dY in `restore_value`: every
# timed run must start from the incoming gradient. The forward keeps the num_warps it ran with on ctx,
# as Liger keeps its settings.
def calculate_settings(n):
    MAX_FUSED_SIZE = 65536
    BLOCK_SIZE = triton.next_power_of_2(n)
    if BLOCK_SIZE > MAX_FUSED_SIZE:
        raise RuntimeError(f"Cannot launch Triton kernel since n = {n} exceeds the maximum {MAX_FUSED_SIZE}.")
    num_warps = 32 if BLOCK_SIZE >= 32768 else 16 if BLOCK_SIZE >= 8192 else 8 if BLOCK_SIZE >= 2048 else 4
    return BLOCK_SIZE, num_warps


def _liger_rms_norm(autotune, fwd_bench, bwd_bench):
    warps = [triton.Config({}, num_warps=w) for w in (2, 4, 8)]

    @autotune(configs=warps, key=["n_cols"], do_bench=fwd_bench)
    @triton.jit
    def _rms_norm_forward(Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, r_ptr, n_cols, eps,
                          offset, BLOCK_SIZE: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0)
        w = tl.load(W_ptr + cols, mask=mask, other=0)
        inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(r_ptr + row, inv_rms)  # kept for the backward
        tl.store(Y_ptr + row * Y_row_stride + cols, x * inv_rms * (offset + w), mask=mask)

    @autotune(configs=warps, key=["n_cols"], restore_value=["dY_ptr"], do_bench=bwd_bench)
    @triton.jit
    def _rms_norm_backward(dY_ptr, dY_row_stride, X_ptr, X_row_stride, W_ptr, r_ptr, dW_ptr, dW_row_stride,
                           n_cols, offset, BLOCK_SIZE: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        dy = tl.load(dY_ptr + row * dY_row_stride + cols, mask=mask, other=0)
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0)
        w = tl.load(W_ptr + cols, mask=mask, other=0) + offset
        inv_rms = tl.load(r_ptr + row)
        dx = inv_rms * (dy * w - (1 / n_cols) * inv_rms * inv_rms * tl.sum(dy * w * x, axis=0) * x)
        tl.store(dY_ptr + row * dY_row_stride + cols, dx, mask=mask)  # dX in place of dY
        tl.store(dW_ptr + row * dW_row_stride + cols, dy * x * inv_rms, mask=mask)

    class LigerRMSNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, W, eps, offset=0.0):
            shape = X.shape
            X = X.reshape(-1, shape[-1]).contiguous()
            n_rows, n_cols = X.shape
            BLOCK_SIZE, _num_warps = calculate_settings(n_cols)  # num_warps: tuned instead
            Y = torch.empty_like(X)
            r = torch.empty(n_rows, dtype=X.dtype)
            _rms_norm_forward[(n_rows,)](Y, Y.stride(0), X, X.stride(0), W, r, n_cols, eps, offset,
                                         BLOCK_SIZE=BLOCK_SIZE)  # fmt: skip
            ctx.offset, ctx.BLOCK_SIZE = offset, BLOCK_SIZE
            ctx.num_warps = _rms_norm_forward.best_config.num_warps
            ctx.save_for_backward(X, W, r)
            return Y.view(*shape)

        @staticmethod
        def backward(ctx, dY):
            shape = dY.shape
            dY = dY.reshape(-1, shape[-1]).contiguous()
            X, W, r = ctx.saved_tensors
            n_rows, n_cols = dY.shape
            dW = torch.zeros_like(X)
            _rms_norm_backward[(n_rows,)](dY, dY.stride(0), X, X.stride(0), W, r, dW, dW.stride(0), n_cols,
                                          ctx.offset, BLOCK_SIZE=ctx.BLOCK_SIZE)  # fmt: skip
            return dY.view(*shape), dW.sum(dim=0), None, None

    return _rms_norm_forward, _rms_norm_backward, LigerRMSNormFunction


@pytest.mark.parametrize("impl", IMPLS)
def test_liger_rms_norm_forward_and_backward_tune_apart(impl):
    fwd_bench = Bench(times=[2.0, 1.0, 3.0, 3.0, 2.0, 1.0])  # forward: 4 warps at 40 columns, 8 at 24
    bwd_bench = Bench(times=[1.0, 3.0, 2.0, 2.0, 1.0, 3.0])  # backward: 2 warps at 40, 4 at 24
    fwd, bwd, RMSNorm = _liger_rms_norm(autotune_of(impl), fwd_bench, bwd_bench)
    torch.manual_seed(0)
    eps, offset = 1e-6, 1.0  # offset 1.0: Gemma's (1 + w) weights
    warps = []
    for shape in [(2, 3, 40), (2, 3, 40), (5, 24)]:
        x = torch.randn(*shape, requires_grad=True)
        w = torch.randn(shape[-1], requires_grad=True)
        dy = torch.randn(*shape)
        y = RMSNorm.apply(x, w, eps, offset)
        y.backward(dy.clone())  # the backward writes dX over the gradient it is given
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * (offset + wr)
        ref.backward(dy)
        torch.testing.assert_close(y, ref)
        torch.testing.assert_close(x.grad, xr.grad)  # dY restored around each timed run of the backward
        torch.testing.assert_close(w.grad, wr.grad)
        warps.append((fwd.best_config.num_warps, bwd.best_config.num_warps))
    assert warps == [(4, 2), (4, 2), (8, 4)]
    assert fwd_bench.calls == 6 and bwd_bench.calls == 6  # each kernel tunes each row length once
    f32 = "torch.float32"
    assert sorted(fwd.cache) == [(24, f32, f32, f32, f32), (40, f32, f32, f32, f32)]
    assert sorted(bwd.cache) == [(24, f32, f32, f32, f32, f32), (40, f32, f32, f32, f32, f32)]


# ---- vLLM / SGLang: model_executor/layers/fused_moe/fused_moe.py, benchmarks/kernels/benchmark_moe.py ----
# fused_moe is launched without an autotuner: `try_get_optimal_moe_config` reads the JSON table of this
# device, expert count E and width N (`get_config_file_name(E, N, dtype)`, keys the batch sizes M that
# the tuning script benchmarked), takes the entry of the nearest M, and the host code sorts and pads the
# routed tokens to multiples of that config's BLOCK_SIZE_M before the launch (`moe_align_block_size`):
# the config is needed before the kernel, so the decorator goes on the launcher, a plain function that
# takes the block sizes as keyword arguments. tuner's workflow replaces the table: tune the batch sizes
# (what benchmark_moe.py does), `tuner cache export` the winners, and serve with `mode="offline"` and the
# exported file, whose nearest-key fallback answers the batch sizes nobody tuned.
MOE_CONFIGS = [
    {
        "BLOCK_SIZE_M": m,
        "BLOCK_SIZE_N": n,
        "BLOCK_SIZE_K": 16,
        "GROUP_SIZE_M": g,
        "num_warps": 4,
        "num_stages": 2,
    }
    for (m, n, g) in [(16, 16, 1), (16, 32, 1), (32, 32, 8)]
]


@triton.jit
def fused_moe_kernel(a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                     num_tokens_post_padded_ptr, N, K, EM, num_valid_tokens, stride_am, stride_ak, stride_be,
                     stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr,
                     BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                     MUL_ROUTED_WEIGHT: tl.constexpr, top_k: tl.constexpr):  # fmt: skip
    pid = tl.program_id(axis=0)
    num_pid_in_group = GROUP_SIZE_M * tl.cdiv(N, BLOCK_SIZE_N)
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_rows = min(tl.cdiv(EM, BLOCK_SIZE_M) - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_rows)
    pid_n = (pid % num_pid_in_group) // group_rows
    if pid_m * BLOCK_SIZE_M < tl.load(num_tokens_post_padded_ptr):
        offs_token = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
        token_mask = offs_token < num_valid_tokens
        expert = tl.load(expert_ids_ptr + pid_m)
        offs_bn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + (offs_bn % N)[None, :] * stride_bn
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            k_left = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc=acc)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        if MUL_ROUTED_WEIGHT:
            acc = acc * tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)[:, None]
        c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_bn[None, :]
        tl.store(c_ptrs, acc, mask=token_mask[:, None] & (offs_bn[None, :] < N))


def moe_align_block_size(topk_ids, block_size, num_experts):
    """The routed (token, k) slots sorted by expert, each expert's run padded to a multiple of
    block_size with the out-of-range id numel (vLLM does this in a CUDA op)."""
    flat = topk_ids.flatten()
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        ids = (flat == e).nonzero().flatten().tolist()
        ids += [flat.numel()] * (-len(ids) % block_size)
        sorted_ids += ids
        expert_ids += [e] * (len(ids) // block_size)
    as_i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return as_i32(sorted_ids), as_i32(expert_ids), as_i32([len(sorted_ids)])


def _moe_launcher(**tuner_options):
    import tuner

    ran = []  # the configs launched, for the fake timer

    @tuner.autotune(
        configs=MOE_CONFIGS,
        key=lambda hidden_states, w, topk_weights, topk_ids: {
            "E": w.shape[0],
            "N": w.shape[2],
            "K": w.shape[1],
            "M": hidden_states.shape[0],
        },  # fmt: skip
        name="fused_moe",
        **tuner_options,
    )
    def fused_moe(hidden_states, w, topk_weights, topk_ids, *, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
                  GROUP_SIZE_M, num_warps, num_stages):  # fmt: skip
        M, K = hidden_states.shape
        E, _, N = w.shape
        top_k = topk_ids.shape[1]
        sorted_ids, expert_ids, num_post_padded = moe_align_block_size(topk_ids, BLOCK_SIZE_M, E)
        out = torch.zeros((M, top_k, N), dtype=hidden_states.dtype)
        EM = sorted_ids.numel()
        grid = (triton.cdiv(EM, BLOCK_SIZE_M) * triton.cdiv(N, BLOCK_SIZE_N),)
        fused_moe_kernel[grid](
            hidden_states, w, out, topk_weights, sorted_ids, expert_ids, num_post_padded, N, K, EM,
            topk_ids.numel(), hidden_states.stride(0), hidden_states.stride(1), w.stride(0), w.stride(1),
            w.stride(2), out.stride(1), out.stride(2), BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N,
            BLOCK_SIZE_K=BLOCK_SIZE_K, GROUP_SIZE_M=GROUP_SIZE_M, MUL_ROUTED_WEIGHT=True, top_k=top_k,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        ran.append((M, BLOCK_SIZE_M, BLOCK_SIZE_N))
        return out.sum(dim=1)

    return fused_moe, ran


def _moe_inputs(M, E=4, K=32, N=32, top_k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, K, N, generator=g)
    weights, ids = torch.softmax(torch.randn(M, E, generator=g), -1).topk(top_k, dim=-1)
    ref = sum(weights[:, j, None] * torch.einsum("mk,mkn->mn", x, w[ids[:, j]]) for j in range(top_k))
    return (x, w, weights.contiguous(), ids.to(torch.int32).contiguous()), ref


def vllm_nearest(table, M):
    """try_get_optimal_moe_config's lookup: the entry of the batch size nearest M (linear distance)."""
    return table[min(table, key=lambda m: abs(m - M))]


def test_vllm_moe_config_table_replaced_by_tune_export_and_offline_lookup(tmp_path):
    import tuner
    from tuner.cli import main

    # the tuning script: each batch size tuned on this machine (a fake timer that makes the winner known:
    # small blocks for small batches, as vLLM's tables have them)
    best_for = {1: (16, 16), 4: (16, 16), 16: (16, 32), 64: (32, 32)}

    def bench(call):
        call()
        M, bm, bn = ran[-1]
        return 1e-3 if (bm, bn) == best_for[M] else 2e-3

    tune, ran = _moe_launcher(bench=bench)
    for M in best_for:
        args, ref = _moe_inputs(M)
        torch.testing.assert_close(tune(*args), ref, rtol=1e-4, atol=1e-4)
    assert len(ran) == 4 * (3 + 1)  # every config timed, then the call itself
    out = tmp_path / "E=4,N=32,device_name=cpu.json"
    assert main(["cache", "export", "--out", str(out)]) == 0

    # production: never tunes, reads only the shipped file; the table of M -> config that vLLM would ship
    serve, ran = _moe_launcher(mode="offline", storage=False, cache=tuner.load_cache(out))
    table = {M: {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn} for M, (bm, bn) in best_for.items()}
    why = {}
    for M in [16, 48, 200, 2, 8, 32]:
        args, ref = _moe_inputs(M, seed=M)
        torch.testing.assert_close(serve(*args), ref, rtol=1e-4, atol=1e-4)
        want = vllm_nearest(table, M)
        assert ran[-1][1:] == (want["BLOCK_SIZE_M"], want["BLOCK_SIZE_N"]), M
        why[M] = serve.tuner.last_choice["why"]
    assert why[16] == f"exact entry in {out}"
    # tuner's distance is |log2 a - log2 b|, vLLM's |a - b|: they agree on 48 -> 64 and 200 -> 64; where
    # log2 ties (2 between 1 and 4, 8 between 4 and 16, 32 between 16 and 64) the value nearer in |a - b|
    # wins, as in vLLM's lookup
    near = "offline: nearest cached key {'E': 4, 'K': 32, 'M': %d, 'N': 32} (distance %s)"
    assert why[48] == near % (64, "0.415") and why[200] == near % (64, "1.64")
    assert (why[2], why[8], why[32]) == (near % (1, "1"), near % (4, "1"), near % (16, "1"))

    # vLLM keeps one file per (E, N): another expert count has no table and takes the default config.
    # tuner's numeric key fields all count in the distance, so E=8 borrows the E=4 entries' configs;
    # to keep them apart, give such fields as strings (the non-numeric fields must match)
    args, ref = _moe_inputs(16, E=8)
    torch.testing.assert_close(serve(*args), ref, rtol=1e-4, atol=1e-4)
    assert ran[-1][1:] == (16, 32)


def test_offline_nearest_key_ties_go_to_the_nearer_value():
    """A value halfway in log2 between two tuned ones (8 between 4 and 16) takes the entry nearer in
    value, on every such tie (before, the key hashes decided each one)."""
    import tuner

    space = tuner.SearchSpace.from_configs([{"b": b} for b in (1, 4, 16, 64, 256, 1024)])

    def make(**opts):
        @tuner.autotune(space, key=["m"], name="tie_breaks", **opts)
        def f(m, *, b):
            return b

        return f

    tuning = [0]
    online = make(bench=lambda call: 1e-3 if call() == tuning[0] else 2e-3)
    for m in (1, 4, 16, 64, 256, 1024):  # tuned: m's winner is b == m
        tuning[0] = m
        assert online(m) == m
    offline = make(mode="offline")
    assert [offline(m) for m in (2, 8, 32, 128, 512)] == [1, 4, 16, 64, 256]


def test_offline_nearest_key_ties_are_ties_however_the_logs_round():
    """An exact tie of two fields: (693, 2635) is 693/527 from (527, 2635) in M and 3465/2635 = 693/527
    from (693, 3465) in N, so the entry nearer in value (527, 166 away) wins. The two distances, each a
    difference of two log2 in floating point, are 0.39505239050000010 and 0.39505239049999830: they
    rounded (to 9 digits) to either side of 0.3950523905, and the farther entry won."""
    import tuner

    space = tuner.SearchSpace.from_configs([{"b": 1}, {"b": 2}])

    def make(**opts):
        @tuner.autotune(space, key=["m", "n"], name="tie_rounding", **opts)
        def f(m, n, *, b):
            return b

        return f

    winner = [0]
    online = make(bench=lambda call: 1e-3 if call() == winner[0] else 2e-3)
    for (m, n), b in (((527, 2635), 1), ((693, 3465), 2)):
        winner[0] = b
        assert online(m, n) == b
    assert make(mode="offline")(693, 2635) == 1
