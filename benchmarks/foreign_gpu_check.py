"""Other people's kernels on a real GPU: Triton's tutorial kernels and jax's own Pallas GPU ops, each
tuned through tuner's drop-ins exactly as their authors wrote them, beside plain `triton.autotune`.

Each case prints one line, `PASS`/`FAIL name: what was seen`, and the run ends with a summary and exit
status 1 if any case failed. Cases:

- tutorial matmul (Triton tutorial 03: fp16, its own CUDA config list, key M/N/K, grouped ordering):
  the result against torch.matmul; tuner's pick and triton.autotune's pick re-timed side by side,
  interleaved, with Triton's do_bench; the second call a cache hit; `.best_config`, `.configs_timings`;
- split-K with `tl.atomic_add` and `reset_to_zero`: the result is right after tuning (the tuning runs the
  kernel many times into the same output);
- an in-place kernel with `restore_value`: the input is incremented once, not once per timed run;
- `prune_configs_by` (an early prune reading `nargs`, a perf model, top_k) and `Config.pre_hook`;
- the fused-softmax tutorial on strided views (grid from the row count, BLOCK_SIZE from
  next_power_of_2);
- jax's Pallas GPU ops (`jax.experimental.pallas.ops.gpu`: layer_norm, rms_norm, mha) tuned through
  `tuner.autotune` inside `jax.jit` with tuner's default timer, against jax's reference functions;
- what tuner detects for this device (label, arch, limits) for the Triton and the Pallas backend.

Run: PYTHONPATH=. python benchmarks/foreign_gpu_check.py [--json FILE]
Without a CUDA GPU it runs the same cases on tiny problems under the Triton and Pallas interpreters (the
CPU twin; the timing comparison is then not meaningful and is only printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TUNER_HOME", tempfile.mkdtemp(prefix="tuner-foreign-"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

RESULTS: list[dict[str, Any]] = []


def case(name: str) -> Callable[[Callable[[], str]], Callable[[], None]]:
    def wrap(fn: Callable[[], str]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.perf_counter()
            try:
                detail = fn()
                ok = True
            except AssertionError as e:
                ok, detail = False, f"assertion: {e}"
            except Exception as e:  # a crash is a failure of the case, reported with its traceback
                ok, detail = False, f"{type(e).__name__}: {e}"
                traceback.print_exc()
            dt = time.perf_counter() - t0
            RESULTS.append({"case": name, "ok": ok, "detail": detail, "seconds": round(dt, 2)})
            print(f"{'PASS' if ok else 'FAIL'} {name} ({dt:.1f} s): {detail}", flush=True)

        return run

    return wrap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--skip-jax", action="store_true", help="leave out the Pallas cases")
    args = ap.parse_args()

    import torch

    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit below
    import triton
    import triton.language as tl

    import tuner
    from tuner.runtime import ConfigCache

    dev = "cuda" if gpu else "cpu"
    print(
        f"foreign_gpu_check on {torch.cuda.get_device_name(0) if gpu else 'cpu (interpreters)'}; "
        f"torch {torch.__version__}, triton {triton.__version__}",
        flush=True,
    )

    def pick_autotune(impl: str) -> Any:
        return triton.autotune if impl == "triton" else tuner.autotune

    def bench_kw(impl: str) -> dict[str, Any]:
        # On the CPU Triton's do_bench needs a GPU driver: both decorators get the same wall-clock bench.
        if gpu:
            return {}

        def do_bench(fn: Callable[[], Any], quantiles: Any = None, **_: Any) -> Any:
            fn()
            t = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t) * 1e3
            return [ms, ms, ms] if quantiles else ms

        return {"do_bench": do_bench}

    def retime(fns: dict[str, Callable[[], Any]], rounds: int = 5) -> dict[str, float]:
        """Median ms of each, interleaved over rounds."""
        out: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                if gpu:
                    out[k].append(float(triton.testing.do_bench(f, warmup=5, rep=25)))
                else:
                    t = time.perf_counter()
                    f()
                    out[k].append((time.perf_counter() - t) * 1e3)
        return {k: sorted(v)[len(v) // 2] for k, v in out.items()}

    # ---- Triton tutorial 03: matmul ------------------------------------------------------------------
    def tutorial_configs() -> list[Any]:
        if not gpu:
            return [
                triton.Config(
                    {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 8},
                    num_stages=1,
                    num_warps=4,
                )  # fmt: skip
                for m, n, k in ((16, 16, 16), (32, 16, 16), (16, 32, 32))
            ]
        C = triton.Config
        return [
            C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8}, num_stages=3, num_warps=8),
            C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
            C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
            C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
            C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
            C({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=4, num_warps=4),
            C({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=5, num_warps=2),
            C({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, num_stages=5, num_warps=2),
        ]  # fmt: skip

    def matmul_kernel_src(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          stride_cm, stride_cn, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                          BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):  # fmt: skip
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
            accumulator = tl.dot(a, b, accumulator)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        c = accumulator.to(tl.float16)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        tl.store(c_ptrs, c, mask=c_mask)

    @case("tutorial matmul: tuner.autotune against triton.autotune")
    def matmul_case() -> str:
        kernels = {
            impl: pick_autotune(impl)(configs=tutorial_configs(), key=["M", "N", "K"], **bench_kw(impl))(
                triton.jit(matmul_kernel_src)
            )
            for impl in ("triton", "tuner")
        }
        M, N, K = (4096, 4096, 4096) if gpu else (48, 40, 56)
        torch.manual_seed(0)
        a = torch.randn((M, K), device=dev, dtype=torch.float16)
        b = torch.randn((K, N), device=dev, dtype=torch.float16)
        want = torch.matmul(a.float(), b.float()) if not gpu else torch.matmul(a, b).float()

        def launch(kern: Any, c: Any) -> None:
            grid = lambda META: (  # noqa: E731
                triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"]),
            )
            kern[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                       c.stride(0), c.stride(1))  # fmt: skip

        outs = {}
        for impl, kern in kernels.items():
            c = torch.empty((M, N), device=dev, dtype=torch.float16)
            launch(kern, c)
            outs[impl] = c
            err = (c.float() - want).abs().max().item()
            assert err < (0.5 if gpu else 5e-2), f"{impl}: max abs error {err}"
        t = kernels["tuner"]
        assert t.tuner.stats["tuned"] == 1, t.tuner.stats
        launch(t, outs["tuner"])
        assert t.tuner.stats["tuned"] == 1, f"second call tuned again: {t.tuner.stats}"
        picks = {impl: kernels[impl].best_config for impl in kernels}
        timings = t.configs_timings
        assert timings, "tuner's .configs_timings is empty after tuning"
        # re-time both picks as plain launches of the same kernel, interleaved
        plain = triton.jit(matmul_kernel_src)

        def plain_launch(cfg: Any) -> Callable[[], Any]:
            c = torch.empty((M, N), device=dev, dtype=torch.float16)
            kw = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            grid = (triton.cdiv(M, kw["BLOCK_SIZE_M"]) * triton.cdiv(N, kw["BLOCK_SIZE_N"]),)
            return lambda: plain[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                       c.stride(0), c.stride(1), **kw)  # fmt: skip

        ms = retime({impl: plain_launch(picks[impl]) for impl in picks})
        ms["torch.matmul"] = retime({"torch": lambda: torch.matmul(a, b)}, rounds=3)["torch"]
        flops = 2.0 * M * N * K
        tf = {k: flops / (v * 1e-3) / 1e12 for k, v in ms.items()}
        ratio = ms["tuner"] / ms["triton"]
        if gpu:
            assert ratio <= 1.05, f"tuner's pick {ratio:.3f}x triton.autotune's pick's time"
        return (
            f"picks tuner {picks['tuner']} / triton {picks['triton']}; re-timed ms "
            + ", ".join(f"{k} {v:.4f} ({tf[k]:.0f} TFLOP/s)" for k, v in ms.items())
            + f"; tuner/triton time {ratio:.3f}; {len(timings)} configs_timings; second call a hit"
        )

    # ---- split-K with atomic_add and reset_to_zero ---------------------------------------------------
    def splitk_src(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        grid_n = tl.cdiv(N, BLOCK_N)
        pid_m = pid // grid_n
        pid_n = pid % grid_n
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0
            )
            b = tl.load(
                b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0
            )
            acc += tl.dot(a, b)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.atomic_add(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=mask)

    @case("split-K atomic_add with reset_to_zero")
    def splitk_case() -> str:
        bm = 64 if gpu else 16
        configs = [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bm, "BLOCK_K": 32, "SPLIT_K": s}, num_warps=4)
            for s in (1, 2, 4)
        ]
        M, N, K = (512, 512, 2048) if gpu else (32, 32, 128)
        a = torch.randn((M, K), device=dev, dtype=torch.float32)
        b = torch.randn((K, N), device=dev, dtype=torch.float32)
        want = a @ b
        lines = []
        for impl in ("triton", "tuner"):
            kern = pick_autotune(impl)(configs=configs, key=["M", "N", "K"], reset_to_zero=["c_ptr"],
                                       **bench_kw(impl))(triton.jit(splitk_src))  # fmt: skip
            c = torch.zeros((M, N), device=dev, dtype=torch.float32)

            def grid(META: dict[str, Any]) -> tuple[int, int]:
                return (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]), META["SPLIT_K"])

            kern[grid](a, b, c, M, N, K)
            rel = ((c - want).abs().max() / want.abs().max()).item()
            assert rel < 2e-2, f"{impl}: relative error {rel:.3g} after tuning (reset_to_zero not applied?)"
            lines.append(f"{impl} {kern.best_config.kwargs['SPLIT_K']} rel err {rel:.1e}")
        return "; ".join(lines)

    # ---- restore_value on an in-place kernel, prune_configs_by, pre_hook -----------------------------
    def add_one_src(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    @case("in-place kernel with restore_value")
    def restore_case() -> str:
        n = (1 << 22) if gpu else 3000
        configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 2), (1024, 4), (4096, 8))]
        lines = []
        for impl in ("triton", "tuner"):
            kern = pick_autotune(impl)(configs=configs, key=["n"], restore_value=["x_ptr"], **bench_kw(impl))(
                triton.jit(add_one_src)
            )
            x = torch.arange(n, device=dev, dtype=torch.float32)
            kern[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, n)
            bad = int((x != torch.arange(n, device=dev, dtype=torch.float32) + 1).sum().item())
            assert bad == 0, f"{impl}: {bad} elements not incremented exactly once"
            lines.append(f"{impl} ok ({kern.best_config.kwargs})")
        return "; ".join(lines)

    @case("prune_configs_by (early prune on nargs, perf model, top_k) and Config.pre_hook")
    def prune_case() -> str:
        n = (1 << 20) if gpu else 2000
        hooks: dict[str, list[Any]] = {"triton": [], "tuner": []}
        lines = []
        for impl in ("triton", "tuner"):
            seen: list[dict[str, Any]] = []

            def early(
                configs: list[Any], named_args: dict[str, Any], seen: list = seen, **kw: Any
            ) -> list[Any]:
                seen.append(dict(named_args))
                nn = named_args["n"]
                return [c for c in configs if c.kwargs["BLOCK"] <= max(256, nn // 4)]

            def perf_model(**kw: Any) -> float:
                return -float(kw["BLOCK"])  # prefer larger blocks

            log = hooks[impl]
            configs = [
                triton.Config(
                    {"BLOCK": b}, num_warps=4, pre_hook=lambda nargs, log=log: log.append(nargs["n"])
                )
                for b in (128, 256, 512, 1024, 8192 if gpu else 4096)
            ]
            kern = pick_autotune(impl)(
                configs=configs, key=["n"],
                prune_configs_by={"early_config_prune": early, "perf_model": perf_model, "top_k": 2},
                restore_value=["x_ptr"], **bench_kw(impl),
            )(triton.jit(add_one_src))  # fmt: skip
            x = torch.zeros(n, device=dev)
            kern[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, n)
            assert bool((x == 1).all()), f"{impl}: wrong result"
            assert seen and seen[0].get("n") == n and "x_ptr" in seen[0], f"{impl}: prune saw {seen[:1]}"
            assert log and all(v == n for v in log), f"{impl}: pre_hook saw {log[:3]}"
            best = kern.best_config.kwargs["BLOCK"]
            assert best in (1024, 8192 if gpu else 4096) or n // 4 < 1024, f"{impl}: picked {best}"
            lines.append(f"{impl} picked BLOCK {best}, pre_hook ran {len(log)}x")
        return "; ".join(lines)

    # ---- Triton tutorial 02: fused softmax on strided views ------------------------------------------
    def softmax_src(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)

    @case("fused-softmax tutorial on strided views")
    def softmax_case() -> str:
        configs = [triton.Config({}, num_warps=w, num_stages=s) for w, s in ((1, 1), (4, 1), (8, 2))]
        lines = []
        for impl in ("triton", "tuner"):
            kern = pick_autotune(impl)(configs=configs, key=["n_cols"], **bench_kw(impl))(
                triton.jit(softmax_src)
            )
            rows, cols = (4096, 1000) if gpu else (9, 50)
            for x in (torch.randn(rows, cols, device=dev), torch.randn(rows, cols + 30, device=dev)[:, :cols],
                      torch.randn(2 * rows, cols, device=dev)[::2]):  # fmt: skip
                y = torch.empty(x.shape, device=dev)
                kern[(x.shape[0],)](y, x, x.stride(0), y.stride(0), x.shape[0], x.shape[1],
                                    BLOCK_SIZE=triton.next_power_of_2(x.shape[1]))  # fmt: skip
                err = (y - torch.softmax(x, dim=1)).abs().max().item()
                assert err < 1e-5, f"{impl}: error {err} on strides {x.stride()}"
            lines.append(f"{impl} ok, picked {kern.best_config.num_warps} warps")
        return "; ".join(lines)

    # ---- what tuner detects for this device ----------------------------------------------------------
    @case("device detection (triton, pallas)")
    def device_case() -> str:
        from tuner.search_spaces.devices import detect_device, device_label

        parts = []
        for backend in ("triton",) if args.skip_jax else ("triton", "pallas"):
            d = detect_device(backend)
            lab = device_label(backend)
            parts.append(
                f"{backend}: label {lab!r}, arch {d.arch}, name {d.name!r}, "
                f"smem/block {d.smem_per_block_bytes}, SMs {d.num_sms}, regs/SM {d.regs_per_sm}, "
                f"peak fp16 {d.peak_tflops_fp16} TFLOP/s"
            )
            if gpu:
                assert d.arch.startswith("sm"), f"{backend}: arch {d.arch} on a CUDA GPU"
                if backend == "triton":
                    assert torch.cuda.get_device_name(0) in lab, lab
        return "; ".join(parts)

    cases = [matmul_case, splitk_case, restore_case, prune_case, softmax_case, device_case]

    # ---- jax's own Pallas GPU ops through tuner.autotune ---------------------------------------------
    if not args.skip_jax:
        if not gpu:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax
        import jax.numpy as jnp
        import numpy as np

        interp = jax.default_backend() != "gpu"
        if gpu and interp:
            print(f"note: jax's default backend is {jax.default_backend()}, not gpu", flush=True)

        @case("jax Pallas ops (layer_norm, rms_norm) through tuner.autotune inside jit")
        def norm_case() -> str:
            from jax.experimental.pallas.ops.gpu import layer_norm, rms_norm

            configs = [{"num_warps": w} for w in (1, 2, 4, 8)]

            def key(x: Any, w: Any, b: Any) -> dict[str, Any]:
                return {"N": x.shape[-1], "dtype": str(x.dtype)}

            seen: dict[str, list[int]] = {"layer_norm": [], "rms_norm": []}

            @tuner.autotune(configs=configs, key=key)
            def ln(x: Any, w: Any, b: Any, *, num_warps: int) -> Any:
                seen["layer_norm"].append(num_warps)
                return layer_norm.layer_norm(x, w, b, num_warps=num_warps, interpret=interp)

            @tuner.autotune(configs=configs, key=key)
            def rms(x: Any, w: Any, b: Any, *, num_warps: int) -> Any:
                seen["rms_norm"].append(num_warps)
                return rms_norm.rms_norm(x, w, b, num_warps=num_warps, interpret=interp)

            lines = []
            for name, norm, ref in (
                ("layer_norm", ln, layer_norm.layer_norm_reference),
                ("rms_norm", rms, rms_norm.rms_norm_reference),
            ):
                shape = (8, 1024, 4096) if not interp else (2, 4, 256)
                x = jax.random.normal(jax.random.PRNGKey(0), shape, dtype=jnp.float32)
                w = jax.random.normal(jax.random.PRNGKey(1), shape[-1:])
                b = jax.random.normal(jax.random.PRNGKey(2), shape[-1:])
                f = jax.jit(lambda x, w, b, norm=norm: norm(x * 2.0, w, b))
                got = f(x, w, b)
                want = ref(x * 2.0, w, b)
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-3, atol=2e-3)
                assert norm.tuner.stats["tuned"] == 1, norm.tuner.stats
                f(x + 1.0, w, b)
                assert norm.tuner.stats["tuned"] == 1, f"tuned again: {norm.tuner.stats}"
                [entry] = [e for e in ConfigCache().entries() if e.key.kernel == norm.tuner.name]
                lines.append(
                    f"{name}: {entry.config} on {entry.key.device!r} ({entry.time_s * 1e6:.1f} us, "
                    f"{len(set(seen[name]))} configs timed)"
                )
            return "; ".join(lines)

        @case("jax Pallas mha through tuner.autotune inside jit")
        def mha_case() -> str:
            from jax.experimental.pallas.ops.gpu import attention

            blocks = (64, 128) if not interp else (16, 32)

            @tuner.autotune(
                configs=[
                    {"block_q": q, "block_k": k, "num_warps": w}
                    for q in blocks
                    for k in blocks
                    for w in ((4, 8) if not interp else (4,))
                ],  # fmt: skip
                key=lambda q, k, v: {
                    "S": q.shape[1],
                    "H": q.shape[2],
                    "D": q.shape[3],
                    "dtype": str(q.dtype),
                },
            )
            def attn(q: Any, k: Any, v: Any, *, block_q: int, block_k: int, num_warps: int) -> Any:
                sizes = attention.BlockSizes(block_q=block_q, block_k=block_k)
                return attention.mha(q, k, v, None, block_sizes=sizes, num_warps=num_warps, causal=True,
                                     interpret=interp)  # fmt: skip

            shape = (4, 2048, 16, 128) if not interp else (1, 64, 2, 16)
            dt = jnp.float16 if not interp else jnp.float32
            q, k, v = (jax.random.normal(jax.random.PRNGKey(i), shape, dtype=dt) for i in range(3))
            got = jax.jit(attn)(q, k, v)
            want = attention.mha_reference(q, k, v, None, causal=True)
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                       rtol=2e-2, atol=2e-2)  # fmt: skip
            assert attn.tuner.stats["tuned"] == 1, attn.tuner.stats
            [entry] = [e for e in ConfigCache().entries() if e.key.kernel == attn.tuner.name]
            return f"{entry.config} on {entry.key.device!r}, {entry.time_s * 1e3:.3f} ms"

        cases += [norm_case, mha_case]

    t0 = time.perf_counter()
    for c in cases:
        c()
    failed = [r for r in RESULTS if not r["ok"]]
    print(
        f"summary: {len(RESULTS) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - t0:.0f} s"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"gpu": gpu, "results": RESULTS}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
