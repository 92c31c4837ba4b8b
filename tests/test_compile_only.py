"""Compile-only checks for real GPU targets (no GPU needed): Triton's compiler with a GPUTarget, in
compile processes of their own (this test process runs the Triton interpreter).

For every Triton kernel, configs the sm90 space accepts (its largest config and a random one, on a
problem big enough for large tiles) must compile for sm90 within the device's limits; a config the
compiler rejects for shared memory must be one the space rejects first, with a reason."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from tuner.kernels import all_kernels, get_kernel
from tuner.kernels._check import draw_configs
from tuner.search_spaces import get_device

from tuner.measure._compile import (
    CompilePool,
    CompileResult,
    KernelResources,
    _parse_ptxas,
    compile_configs,
    default_jobs,
    resource_features,
)

pytestmark = pytest.mark.slow

# Problems large enough that the spaces offer their big tiles (the default problems are tiny).
BIG = {
    "matmul": {"M": 1024, "N": 1024, "K": 1024, "dtype": "bfloat16", "bias": True, "activation": "gelu"},
    "int8_matmul": {"M": 1024, "N": 1024, "K": 1024, "dtype": "float16", "bias": True, "activation": "relu"},
    "moe_gemm": {"T": 1024, "K": 512, "N": 512, "E": 4, "dtype": "bfloat16"},
    "flash_attention": {"B": 1, "H": 2, "S": 1024, "D": 128, "causal": True, "dtype": "bfloat16"},
    "flash_attention_bwd": {"B": 1, "H": 2, "S": 1024, "D": 128, "causal": True, "dtype": "bfloat16"},
    "softmax": {"M": 64, "N": 8192, "dtype": "float16"},
    "rmsnorm": {"M": 64, "N": 8192, "dtype": "float16", "eps": 1e-6},
    "layernorm": {"M": 64, "N": 8192, "dtype": "float16", "eps": 1e-5},
}


def _size(config: dict) -> float:
    """How much a config asks of the chip: its tile sizes times its pipeline stages."""
    tiles = math.prod(v for k, v in config.items() if k.startswith("BLOCK") and isinstance(v, int))
    return tiles * config.get("num_stages", 1) * config.get("ROWS_PER_PROGRAM", 1)


@pytest.fixture(scope="module")
def pool():
    """One pool for the module: its processes import torch and Triton once."""
    with CompilePool(jobs=2) as p:
        yield p


def _triton_kernels() -> list[str]:
    return [s.name for s in all_kernels() if "triton" in s.backends]


def test_every_triton_kernel_has_a_big_problem_here() -> None:
    assert set(_triton_kernels()) <= set(BIG), "add the new kernel to BIG"


@pytest.mark.parametrize("kernel", sorted(BIG))
def test_configs_the_sm90_space_accepts_compile_for_sm90(kernel: str, pool: CompilePool) -> None:
    spec = get_kernel(kernel)
    problem = {**spec.default_problem, **BIG[kernel]}
    space = spec.space(problem, get_device("sm90"), "triton")
    every = space.enumerate()
    largest = max(every, key=lambda c: (_size(c), json.dumps(c, sort_keys=True)))
    configs = [largest, *[c for c in draw_configs(space, 2, seed=0) if c != largest][:1]]
    results = pool.compile(kernel, problem, configs, "sm90")
    limit = get_device("sm90").smem_per_block_bytes
    for r in results:
        assert r.ok, f"{kernel} {r.config} was accepted by the sm90 space but: {r.status}: {r.error}"
        f = r.features()
        assert 0 < f["registers"] <= 255 and f["spill_bytes"] >= 0
        assert 0 <= f["shared_bytes"] <= limit
        assert r.kernels and all(k.num_warps == r.config.get("num_warps", k.num_warps) for k in r.kernels[:1])


def test_a_config_over_the_shared_memory_limit_is_rejected_by_the_space_first(pool: CompilePool) -> None:
    spec = get_kernel("matmul")
    problem = {**spec.default_problem, **BIG["matmul"]}
    space = spec.space(problem, get_device("sm90"), "triton")
    huge = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1}
    huge |= {"num_warps": 8, "num_stages": 5}
    reasons = space.violations(huge)
    assert reasons and any("shared" in r.lower() or "smem" in r.lower() for r in reasons), reasons
    (r,) = pool.compile("matmul", problem, [huge], "sm90")
    assert r.status == "out_of_resources" and "shared memory" in (r.error or ""), r


def test_cli_compile_only_prints_resources_and_rejects_bad_devices(tmp_path) -> None:
    cmd = [sys.executable, "-m", "tuner.cli", "check", "softmax", "--compile-only", "--device", "sm80"]
    # one compile process (--jobs 1): a second would import torch and Triton again for one config
    p = subprocess.run(
        [*cmd, "--configs", "2", "--jobs", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["device"] == "sm80" and doc["ok"] and len(doc["rows"]) == 2
    assert all(row["status"] == "ok" and row["registers"] > 0 for row in doc["rows"])
    bad = subprocess.run(
        [*cmd[:-1], "tpu_v5e"], capture_output=True, text=True, timeout=120, encoding="utf-8"
    )
    assert bad.returncode == 2 and "one of sm80, sm86, sm89, sm90, sm100, sm120" in bad.stderr


def test_ptxas_log_and_feature_summary() -> None:
    log = (
        "ptxas info    : Compiling entry function '_k' for 'sm_90a'\n"
        "ptxas info    : Function properties for _k\n"
        "    8 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers\n"
    )
    assert _parse_ptxas(log) == (255, 12) and _parse_ptxas("") == (None, None)
    ks = [KernelResources("a", 200, 12, 1024, 4), KernelResources("b", 40, 0, 0, 4)]
    assert resource_features(ks) == {"registers": 200, "spill_bytes": 12, "shared_bytes": 1024}
    assert resource_features([]) == {}
    r = CompileResult({"x": 1}, "ok", None, tuple(ks), 1.5, "sm90")
    assert CompileResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert default_jobs() >= 1


def test_compile_configs_reports_a_bad_config_as_a_compile_error() -> None:
    """A launcher that raises (here: a block size that is not a power of two) is a failed result."""
    cfg = {"BLOCK_N": 96, "ROWS_PER_PROGRAM": 1, "num_warps": 4}
    (r,) = compile_configs("softmax", {"M": 4, "N": 96, "dtype": "float32"}, [cfg], arch="sm80", jobs=1)
    assert not r.ok and r.status in ("compile_error", "crashed") and r.error


def test_kernel_measurer_precompiles_for_a_gpu_target_without_one() -> None:
    """The GPU precompile path (compile-only pool) runs here too: a measurer for sm90 compiles its
    batch ahead, keeps the compiler's rejections as known failures and the others' resources."""
    from tuner.measure import KernelMeasurer

    problem = {**get_kernel("matmul").default_problem, **BIG["matmul"]}
    good = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1}
    good |= {"num_warps": 4, "num_stages": 3}
    huge = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1}
    huge |= {"num_warps": 8, "num_stages": 5}
    with KernelMeasurer("matmul", problem, "triton", device="sm90") as m:
        assert m.target.timer == "cuda"
        fails = m.precompile([good, huge], jobs=2)
        assert [r.status for r in fails.values()] == ["out_of_resources"]
        assert "compile-only" in next(iter(fails.values())).error
        assert m.measure(huge).status == "out_of_resources"  # known: not measured again
        assert [r.ok for r in m.compile_only] == [True, False]
        assert set(m.compile_only[0].features()) == {"registers", "spill_bytes", "shared_bytes"}


def test_sm86_and_sm120_targets_compile_and_hold_their_own_shared_memory_limit(pool: CompilePool) -> None:
    """The consumer archs (99 KiB of shared memory per block, against sm90's 227 KiB) compile with Triton's
    own compiler here, and a config that fits sm90 but not 99 KiB is out of resources for them."""
    spec = get_kernel("matmul")
    problem = {**spec.default_problem, **BIG["matmul"]}
    small = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4}
    small |= {"num_stages": 3}
    big = {**small, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_stages": 5}  # 4 x 32 KiB buffered
    assert get_kernel("matmul").space(problem, get_device("sm90"), "triton").contains(big)
    for arch in ("sm86", "sm120"):
        limit = get_device(arch).smem_per_block_bytes
        assert limit == 99 * 1024
        assert not spec.space(problem, get_device(arch), "triton").contains(big)
        ok, over = pool.compile("matmul", problem, [small, big], arch)
        assert ok.ok and ok.arch == arch and 0 < ok.features()["shared_bytes"] <= limit, ok
        assert over.status == "out_of_resources" and "shared memory" in (over.error or ""), over


def test_the_compile_child_gets_a_checkout_first_and_never_site_packages(monkeypatch, tmp_path) -> None:
    """The compile child runs `-m tuner.measure._compile` with the same interpreter. From a source checkout
    the checkout goes first on its PYTHONPATH; a wheel's site-packages does not go there at all, where it
    would come ahead of the standard library (a distribution that shadows a standard module would break
    the child)."""
    import os
    import sysconfig
    from pathlib import Path

    import tuner
    from tuner.measure import _compile

    other = str(tmp_path)
    monkeypatch.setenv("PYTHONPATH", other)
    purelib = sysconfig.get_paths()["purelib"]
    monkeypatch.setattr(tuner, "__file__", os.path.join(purelib, "tuner", "__init__.py"))
    assert _compile._child_env(None)["PYTHONPATH"].split(os.pathsep) == [other]
    checkout = Path(__file__).resolve().parent.parent
    monkeypatch.setattr(tuner, "__file__", str(checkout / "tuner" / "__init__.py"))
    assert _compile._child_env(None)["PYTHONPATH"].split(os.pathsep) == [str(checkout), other]


def test_a_compile_process_that_cannot_start_is_a_failed_result_saying_why(monkeypatch, tmp_path) -> None:
    """Starting the compile process raised in the pool's thread (its stderr file in a temp folder removed
    meanwhile, a process limit reached): a traceback on stderr and every config "not compiled", no reason."""
    import tempfile

    problem = get_kernel("rmsnorm").default_problem
    configs = draw_configs(get_kernel("rmsnorm").space(problem, get_device("sm80"), "triton"), 2, seed=0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "removed"))
    errors: list[BaseException] = []
    monkeypatch.setattr("threading.excepthook", lambda args: errors.append(args.exc_value))
    with CompilePool(jobs=1) as p:
        results = p.compile("rmsnorm", problem, configs, "sm80")
    assert not errors
    for r in results:
        assert r.status == "crashed" and "could not start the compile process" in r.error, r
        assert "FileNotFoundError" in r.error and "removed" in r.error, r
