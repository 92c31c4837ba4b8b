"""Flash attention forward: sampled configs of each space against the float64 reference on the CPU
interpreters (both backends), causal and not, head dims 64 and 128, a sequence length (40) that no block
divides, the output poisoned with NaN before every run; and properties of the spaces on every device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuner.kernels import get_kernel
from tuner.kernels._common import to_numpy
from tuner.search_spaces import attention as spaces
from tuner.search_spaces import devices

BACKENDS = ("triton", "pallas")
SPEC_NAME = "flash_attention"


def _poison(inputs: dict[str, Any], name: str) -> None:
    buf = inputs[name]
    if hasattr(buf, "fill_"):
        buf.fill_(float("nan"))
    else:
        import jax.numpy as jnp

        inputs[name] = jnp.full(buf.shape, jnp.nan, dtype=buf.dtype)


def _check(backend: str, problem: dict[str, Any], config: dict[str, Any], seed: int = 0) -> None:
    spec = get_kernel(SPEC_NAME)
    inputs = spec.make_inputs(problem, backend, seed)
    assert spec.output_buffer == "out"
    _poison(inputs, "out")
    ref = spec.reference(problem, inputs)
    out = to_numpy(spec.run(problem, backend, inputs, config))
    assert out.shape == ref.shape == (problem["B"], problem["H"], problem["S"], problem["D"])
    assert not np.isnan(out).any(), f"{backend} {config}: {int(np.isnan(out).sum())} elements not written"
    rtol, atol = spec.tolerance(problem["dtype"])
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"{backend} {problem} {config}")


def _problem(**kw: Any) -> dict[str, Any]:
    return {**get_kernel(SPEC_NAME).default_problem, "B": 1, "H": 2, "S": 40, **kw}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_configs_match_reference(backend: str, causal: bool, d: int) -> None:
    problem = _problem(D=d, causal=causal, dtype="float32")
    space = get_kernel(SPEC_NAME).space(problem, devices.CPU, backend)
    seed = 4 * BACKENDS.index(backend) + 2 * causal + (d == 128)
    n = 3 if backend == "triton" else 2
    for cfg in space.sample(seed, n=n):
        _check(backend, problem, cfg, seed=seed)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_low_precision(backend: str, dtype: str) -> None:
    problem = _problem(S=33, causal=True, dtype=dtype)
    space = get_kernel(SPEC_NAME).space(problem, devices.CPU, backend)
    _check(backend, problem, space.sample(5), seed=1)


def test_blocks_smaller_than_the_diagonal_and_custom_scale() -> None:
    """Many key blocks per query block (causal skipping, chunks past S inside a major block)."""
    problem = _problem(S=37, causal=True, dtype="float32", sm_scale=0.3)
    _check("triton", problem, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1})
    _check("pallas", problem, {"block_q": 8, "block_k_major": 32, "block_k": 8})
    _check(
        "pallas",
        _problem(S=37, causal=False, dtype="float32"),
        {"block_q": 64, "block_k_major": 16, "block_k": 8},
    )


@pytest.mark.parametrize("causal", [True, False])
def test_negative_scale_full_key_blocks(causal: bool) -> None:
    """sm_scale < 0 (the schema takes any finite number): the row maximum must be taken of the scaled
    scores. The Triton kernel's unmasked key blocks took max(qk) * scale, the row's minimum, and exp2 of
    the x8 query rows' spread overflowed to inf: NaN outputs."""
    problem = _problem(S=40, causal=causal, dtype="float32", sm_scale=-0.5)
    for cfg in (
        {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
        {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 2, "num_stages": 2},
    ):
        _check("triton", problem, cfg)
    _check("pallas", problem, {"block_q": 16, "block_k_major": 16, "block_k": 16})


def test_triton_launcher_refuses_a_short_out_and_mixed_dtypes() -> None:
    """An `out` with fewer rows than q was written past its end (heap corruption under the interpreter,
    'mremap_chunk(): invalid pointer'); q, k, v of different dtypes ran under the interpreter's upcast.
    Both are ValueErrors naming the shapes / dtypes, and nothing is written."""
    import torch
    from tuner.kernels.attention import flash_attention_triton

    cfg = {"causal": True, "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    q = torch.randn(1, 1, 9, 64)
    guard = torch.full((1, 1, 16, 64), float("nan"))
    with pytest.raises(ValueError, match=r"out has shape \(1, 1, 8, 64\), expected q's \(1, 1, 9, 64\)"):
        flash_attention_triton(q, q, q, guard[:, :, :8], **cfg)
    assert torch.isnan(guard).all()
    with pytest.raises(ValueError, match="q, k, v must share one dtype"):
        flash_attention_triton(q, q.half(), q, None, **cfg)


def test_triton_grid_keeps_each_axis_within_a_gpu_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid was (cdiv(S, BLOCK_M), B * H): with B * H >= 65536 (many short sequences: 2048 x 32
    heads) its second axis passed the 65535 programs a CUDA grid's y axis holds, a launch failure on a
    GPU that the interpreter does not show. Now (cdiv(S, BLOCK_M), H, B), and a B or H beyond an axis is a
    ValueError naming it."""
    import torch
    from tuner.kernels import attention

    grids: list[tuple[int, ...]] = []

    class Recorder:
        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            grids.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(attention, "_triton_kernel", Recorder)
    cfg = {"causal": False, "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    q = torch.empty(2048, 32, 20, 64)
    attention.flash_attention_triton(q, q, q, **cfg)
    assert grids == [(2, 32, 2048)]
    big = torch.empty(65536, 1, 1, 64)
    with pytest.raises(ValueError, match="batch B=65536 exceeds the 65535 programs"):
        attention.flash_attention_triton(big, big, big, **cfg)
    assert len(grids) == 1


def test_reference_agrees_with_torch_sdpa() -> None:
    import torch
    from tuner.kernels.attention import attention_reference

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 64)) for _ in range(3))
    for causal in (True, False):
        want = torch.nn.functional.scaled_dot_product_attention(
            torch.tensor(q), torch.tensor(k), torch.tensor(v), is_causal=causal
        ).numpy()
        np.testing.assert_allclose(attention_reference(q, k, v, causal=causal), want, rtol=1e-10, atol=1e-12)


def test_spec_counts_and_inputs() -> None:
    spec = get_kernel(SPEC_NAME)
    assert spec.backends == ("triton", "pallas") and spec.shape_fields == ("B", "H", "S", "D")
    p = {"B": 2, "H": 3, "S": 10, "D": 64, "causal": False, "dtype": "float16"}
    assert spec.flops(p) == 4 * 2 * 3 * 10 * 10 * 64
    assert spec.flops({**p, "causal": True}) == 4 * 2 * 3 * 55 * 64
    assert spec.bytes_moved(p) == 4 * 2 * 3 * 10 * 64 * 2
    for backend in BACKENDS:
        a, b = spec.make_inputs(p, backend, 7), spec.make_inputs(p, backend, 7)
        for name in ("q", "k", "v"):
            x = to_numpy(a[name])
            np.testing.assert_array_equal(x, to_numpy(b[name]))
        q = to_numpy(a["q"]).reshape(-1, 64)  # hostile query rows: zeros, large, subnormal
        assert (q == 0).all(axis=1).any() and np.abs(q).max() > 16
        assert 0 < np.abs(q[q != 0]).min() < 1e-4
        assert np.isnan(to_numpy(a["out"])).all()


def test_unsupported_head_dim_is_rejected_with_the_value() -> None:
    with pytest.raises(ValueError, match="D=96"):
        spaces.attention_space(_problem(D=96), devices.SM90, "triton")


# ---- space properties -------------------------------------------------------------------------------
GPU = (devices.SM80, devices.SM90)
TPU = (devices.TPU_V4, devices.TPU_V5E, devices.TPU_V5P, devices.TPU_V6E)

problems = st.fixed_dictionaries(
    {
        "B": st.integers(1, 8),
        "H": st.integers(1, 32),
        "S": st.integers(1, 33000),
        "D": st.sampled_from([64, 128]),
        "causal": st.booleans(),
        "dtype": st.sampled_from(["float32", "float16", "bfloat16"]),
    }
)
device_backend = st.sampled_from(
    [(d, "triton") for d in (*GPU, devices.CPU)] + [(d, "pallas") for d in (*TPU, devices.CPU)]
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems, db=device_backend, seed=st.integers(0, 2**16), data=st.data())
def test_space_properties(problem: dict[str, Any], db: tuple[Any, str], seed: int, data: Any) -> None:
    device, backend = db
    space = spaces.attention_space(problem, device, backend)
    for cfg in space.sample(seed, n=5):
        assert space.contains(cfg), space.violations(cfg)
    raw = {p.name: data.draw(st.sampled_from(p.values)) for p in space.params}
    reasons = space.violations(raw)
    broken = [c for c in space.constraints if c.violation(raw)]
    assert len(reasons) == len(broken)
    for c, why in zip(broken, reasons, strict=True):
        assert c.name in why
        for u in c.uses:
            assert f"{u}={raw[u]!r}" in why, (why, u)


def test_sm80_and_sm90_differ_by_shared_memory() -> None:
    """Figures from compiling the kernel with Triton 3.7 (benchmarks/triton_resources_b.py): the smem
    estimate matches the compiler exactly on both archs, and sm90 keeps one more K/V stage."""
    from tuner.search_spaces.attention import triton_smem_bytes

    assert (
        triton_smem_bytes(128, "float16", {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3}, "sm80") == 98304
    )
    assert (
        triton_smem_bytes(128, "float16", {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3}, "sm90") == 131072
    )
    assert (
        triton_smem_bytes(128, "float16", {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 1}, "sm80") == 49152
    )
    problem = _problem(B=4, H=16, S=4096, D=128, dtype="float16")
    cfg = {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8, "num_stages": 5}  # 192 KiB on sm80, 224 KiB on sm90
    s80 = spaces.attention_space(problem, devices.SM80, "triton")
    s90 = spaces.attention_space(problem, devices.SM90, "triton")
    assert s90.contains(cfg)
    (why,) = s80.violations(cfg)
    assert "shared memory" in why and "sm80" in why and "BLOCK_M=256" in why and "num_stages=5" in why
    # the tutorial's config for D=128 stays valid on both
    tutorial = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    assert s80.contains(tutorial) and s90.contains(tutorial)
    # and the other way round: 128 x 128 x 4 stages fits neither (224 KiB on sm80, 288 KiB on sm90) ...
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4}
    assert not s80.contains(big) and not s90.contains(big)
    # ... but does at D=64 on both
    assert spaces.attention_space({**problem, "D": 64}, devices.SM80, "triton").contains(big)
    assert len(s90) != len(s80)
    bad = s90.violations({"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 1, "num_stages": 1})
    assert any("register" in w and "num_warps=1" in w for w in bad)


def test_tpu_generations_differ_by_vmem() -> None:
    problem = _problem(B=1, H=8, S=8192, D=128, dtype="float32")
    cfg = {"block_q": 1024, "block_k_major": 2048, "block_k": 1024}
    v4 = spaces.attention_space(problem, devices.TPU_V4, "pallas")
    v5e = spaces.attention_space(problem, devices.TPU_V5E, "pallas")
    assert v5e.contains(cfg)
    (why,) = v4.violations(cfg)
    assert "VMEM" in why and "tpu_v4" in why and "block_k_major=2048" in why
    assert all(c["block_k"] % 128 == 0 and c["block_k_major"] % c["block_k"] == 0 for c in v4.enumerate())
    reasons = spaces.attention_space(_problem(S=512, dtype="bfloat16"), devices.TPU_V5P, "pallas").violations(
        {"block_q": 8, "block_k_major": 128, "block_k": 256}
    )
    assert any("block_k_major=128" in r and "block_k=256" in r for r in reasons)
    assert any("sublanes" in r and "block_q=8" in r for r in reasons)


def test_cpu_space_is_small_and_backends_refuse_foreign_devices() -> None:
    tri = spaces.attention_space(_problem(), devices.CPU, "triton")
    pal = spaces.attention_space(_problem(), devices.CPU, "pallas")
    assert tri["BLOCK_M"].values == (16, 32, 64) and min(pal["block_q"].values) == 8
    assert len(tri) < 200 and len(pal) < 100
    with pytest.raises(ValueError, match="pallas"):
        spaces.attention_space(_problem(), devices.SM80, "pallas")
    with pytest.raises(ValueError, match="triton"):
        spaces.attention_space(_problem(), devices.TPU_V6E, "triton")


@pytest.mark.parametrize("causal", [True, False])
def test_pallas_kernel_lowers_for_tpu(causal: bool) -> None:
    """CPU twin of a TPU run: export for platform 'tpu' runs the Mosaic lowering of the kernel body
    (interpret mode never does; it caught a floor division that Mosaic cannot lower off-device)."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax import export
    from tuner.kernels.attention import flash_attention_pallas

    problem = _problem(S=1000, D=128, causal=causal, dtype="bfloat16")
    cfg = {"block_q": 128, "block_k_major": 512, "block_k": 128}
    assert spaces.attention_space(problem, devices.TPU_V5E, "pallas").contains(cfg)
    q = jax.ShapeDtypeStruct((1, 2, 1000, 128), jnp.bfloat16)
    f = functools.partial(flash_attention_pallas, causal=causal, interpret=False, **cfg)
    exported = export.export(jax.jit(f), platforms=["tpu"])(q, q, q)
    assert "tpu_custom_call" in exported.mlir_module()


def test_pallas_poisoned_output_alias_is_blocked_like_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for the row kernels (test_kernels_norms.py): the aliased poisoned output is blocked like the
    output, which jax 0.11's interpreter needs when S is no multiple of the query block."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from tuner.kernels.attention import flash_attention_pallas

    calls: list[dict[str, Any]] = []
    real = pl.pallas_call

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(pl, "pallas_call", recording)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 1, 40, 64)), jnp.float32) for _ in range(3))
    out = flash_attention_pallas(
        q,
        k,
        v,
        jnp.full(q.shape, jnp.nan, q.dtype),
        causal=True,
        block_q=16,
        block_k_major=16,
        block_k=16,
        interpret=True,
    )
    (kw,) = calls
    (alias_in,) = kw["input_output_aliases"]
    assert kw["in_specs"][alias_in].block_shape == kw["out_specs"].block_shape
    assert np.isfinite(np.asarray(out)).all()
