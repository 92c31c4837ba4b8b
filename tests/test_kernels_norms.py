"""Row softmax, RMSNorm and LayerNorm: sampled configs of each space against the float64 reference on the
CPU interpreters (both backends), on shapes that are not multiples of any block, with the output buffer
poisoned with NaN before every run; and properties of the spaces on every device."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuner.kernels import get_kernel
from tuner.kernels._common import to_numpy
from tuner.search_spaces import devices
from tuner.search_spaces import norms as spaces

KINDS = ("softmax", "rmsnorm", "layernorm")
BACKENDS = ("triton", "pallas")
PROBLEM = {"M": 37, "N": 100}  # 37 rows, 100 columns: no block size divides either


def _poison(inputs: dict[str, Any], name: str) -> None:
    """Refill the output buffer with NaN, as a generic checker does before each run."""
    buf = inputs[name]
    if hasattr(buf, "fill_"):
        buf.fill_(float("nan"))
    else:
        import jax.numpy as jnp

        inputs[name] = jnp.full(buf.shape, jnp.nan, dtype=buf.dtype)


def _check(kind: str, backend: str, problem: dict[str, Any], config: dict[str, Any], seed: int = 0) -> float:
    spec = get_kernel(kind)
    inputs = spec.make_inputs(problem, backend, seed)
    assert spec.output_buffer is not None
    _poison(inputs, spec.output_buffer)
    assert np.isnan(to_numpy(inputs[spec.output_buffer])).all()
    ref = spec.reference(problem, inputs)
    out = to_numpy(spec.run(problem, backend, inputs, config))
    assert out.shape == ref.shape
    assert not np.isnan(out).any(), (
        f"{kind}/{backend} {config}: {int(np.isnan(out).sum())} elements not written"
    )
    rtol, atol = spec.tolerance(problem["dtype"])
    err = float(np.max(np.abs(out - ref)))
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"{kind}/{backend} {config}")
    return err


def _configs(kind: str, backend: str, problem: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """n sampled configs plus the smallest and largest column block (multi-pass and single-pass)."""
    space = get_kernel(kind).space(problem, devices.CPU, backend)
    col = "BLOCK_N" if backend == "triton" else "block_cols"
    picked = space.sample(seed, n=n)
    valid = space.enumerate()
    smallest = min(valid, key=lambda c: (c[col], -sum(v for k, v in c.items() if k != col)))
    largest = max(valid, key=lambda c: c[col])
    out: list[dict[str, Any]] = []
    for c in [smallest, largest, *picked]:
        if c not in out:
            out.append(c)
    assert any(c[col] < problem["N"] for c in out) and any(c[col] >= problem["N"] for c in out)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_sampled_configs_match_reference_fp32(kind: str, backend: str) -> None:
    problem = {**get_kernel(kind).default_problem, **PROBLEM, "dtype": "float32"}
    for cfg in _configs(kind, backend, problem, n=3, seed=10 * KINDS.index(kind) + BACKENDS.index(backend)):
        _check(kind, backend, problem, cfg)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_low_precision(kind: str, backend: str, dtype: str) -> None:
    problem = {**get_kernel(kind).default_problem, "M": 19, "N": 70, "dtype": dtype}
    space = get_kernel(kind).space(problem, devices.CPU, backend)
    for cfg in space.sample(7, n=1):
        _check(kind, backend, problem, cfg, seed=3)


def test_long_row_multi_pass_with_many_blocks() -> None:
    """A row 20x longer than the block: the loop, the shifted last chunk and the online max all work."""
    for kind in KINDS:
        problem = {**get_kernel(kind).default_problem, "M": 5, "N": 333, "dtype": "float32"}
        _check(kind, "triton", problem, {"BLOCK_N": 16, "ROWS_PER_PROGRAM": 4, "num_warps": 1})
        _check(kind, "pallas", problem, {"block_rows": 4, "block_cols": 16})
        aligned = {**problem, "N": 96}  # chunks that divide the row: the TPU path, no overlap masking
        _check(kind, "pallas", aligned, {"block_rows": 8, "block_cols": 32})
        _check(kind, "triton", aligned, {"BLOCK_N": 32, "ROWS_PER_PROGRAM": 2, "num_warps": 2})


def test_an_unwritten_output_fails_the_check() -> None:
    """The poison works: a launch that covers only part of the rows leaves NaN and the check fails."""
    from tuner.kernels.norms import softmax_triton

    spec = get_kernel("softmax")
    problem = {**spec.default_problem, **PROBLEM, "dtype": "float32"}
    inputs = spec.make_inputs(problem, "triton", 0)
    out = inputs["out"]
    softmax_triton(inputs["x"][:-3], out[:-3], BLOCK_N=128, ROWS_PER_PROGRAM=4)
    got = to_numpy(out)
    assert np.isnan(got[-3:]).all() and not np.isnan(got[:-3]).any()


def test_references_agree_with_torch() -> None:
    import torch
    from tuner.kernels.norms import layernorm_reference, rmsnorm_reference, softmax_reference

    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((6, 50)), rng.standard_normal(50), rng.standard_normal(50)
    xt = torch.tensor(x)
    np.testing.assert_allclose(softmax_reference(x), torch.softmax(xt, -1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        layernorm_reference(x, w, b, 1e-5),
        torch.nn.functional.layer_norm(xt, (50,), torch.tensor(w), torch.tensor(b), 1e-5).numpy(),
        rtol=1e-10,
    )
    rms = xt / torch.sqrt((xt * xt).mean(-1, keepdim=True) + 1e-6) * torch.tensor(w)
    np.testing.assert_allclose(rmsnorm_reference(x, w, 1e-6), rms.numpy(), rtol=1e-12)


# ---- spec contents ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_spec_fields(kind: str) -> None:
    spec = get_kernel(kind)
    assert spec.backends == ("triton", "pallas")
    assert set(spec.dtypes) >= {"float32", "float16", "bfloat16"}
    assert spec.shape_fields == ("M", "N")
    assert spec.output_buffer == "out"
    p = {**spec.default_problem, "M": 8, "N": 32, "dtype": "float16"}
    nparams = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}[kind]
    assert spec.bytes_moved(p) == (2 * 8 * 32 + nparams * 32) * 2
    assert spec.flops(p) == {"softmax": 5, "rmsnorm": 4, "layernorm": 7}[kind] * 8 * 32


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_eps_schema_refuses_zero(kind: str) -> None:
    """eps = 0 was valid, and the hostile all-zero rows then made the reference and the kernel NaN:
    `tuner check rmsnorm --shape eps=0` failed every config without saying why. It is refused, naming
    eps; the smallest positive eps still checks clean."""
    from tuner.kernels import validate_problem
    from tuner.kernels._check import check_kernel

    spec = get_kernel(kind)
    for eps in (0, 0.0, -1e-6, 1.0):
        with pytest.raises(ValueError, match=r"eps=.* must be a number in \(0, 1\)"):
            validate_problem(spec, {"M": 9, "N": 20, "eps": eps})
    problem = validate_problem(spec, {"M": 9, "N": 20, "eps": 1e-30})
    assert check_kernel(spec, backend="triton", problem=problem, device=devices.CPU, configs=2).ok


def test_triton_weight_views_and_lengths() -> None:
    """w and b were read with unit stride and never checked against N: a strided view (w[::2]) gave
    wrong rows, a short vector was read past its end. Now a view is read right and a wrong shape is a
    ValueError naming the vector, on both backends."""
    import torch
    from tuner.kernels.norms import layernorm_reference, layernorm_triton, rmsnorm_pallas, rmsnorm_triton

    cfg = {"BLOCK_N": 16, "ROWS_PER_PROGRAM": 4, "num_warps": 1}
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 50, generator=gen)
    w = torch.randn(100, generator=gen)[::2]
    b = torch.randn(100, generator=gen)[1::2]
    got = layernorm_triton(x, w, b, torch.empty(10, 50), eps=1e-5, **cfg)
    want = layernorm_reference(x.double().numpy(), w.double().numpy(), b.double().numpy(), 1e-5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"layernorm: b has shape \(3,\), expected \(50,\)"):
        layernorm_triton(x, w, b[:3], torch.empty(10, 50), eps=1e-5, **cfg)
    with pytest.raises(ValueError, match=r"rmsnorm: w has shape \(49,\)"):
        rmsnorm_triton(x, w[:49], torch.empty(10, 50), eps=1e-6, **cfg)
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=r"rmsnorm: w has shape \(1, 50\)"):
        rmsnorm_pallas(jnp.asarray(x.numpy()), jnp.ones((1, 50)), eps=1e-6, block_rows=8, block_cols=16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_inputs_are_seeded_and_hostile(kind: str, backend: str) -> None:
    """Same seed, same inputs; and x holds the hostile values: zeros, large magnitudes, subnormals, and
    for softmax masked (-inf) elements, fully masked rows and rows masked up to their last column."""
    spec = get_kernel(kind)
    p = {**spec.default_problem, "dtype": "float32"}
    a, b, c = (spec.make_inputs(p, backend, s) for s in (1, 1, 2))
    for name in a:
        if name == "out":
            continue
        np.testing.assert_array_equal(to_numpy(a[name]), to_numpy(b[name]))
        assert not np.array_equal(to_numpy(a[name]), to_numpy(c[name]))
    x = to_numpy(a["x"])
    finite = x[np.isfinite(x)]
    assert (x == 0).any() and np.abs(finite).max() > 100
    tiny = np.abs(finite[finite != 0]).min()
    assert tiny < np.finfo(np.float32).tiny  # a subnormal survived the conversion
    if kind == "softmax":
        rows_masked = np.isneginf(x).all(axis=1)
        assert rows_masked.any()
        assert any(np.isneginf(r[:-1]).all() and np.isfinite(r[-1]) for r in x)
    else:
        assert not np.isinf(x).any()


# ---- masked softmax rows on every path --------------------------------------------------------------
def _masked_rows(n: int) -> np.ndarray:
    """Rows a masked attention softmax meets, one per kind."""
    x = np.random.default_rng(5).standard_normal((6, n)) * 2
    x[0] = -np.inf  # fully masked
    x[1, :-1] = -np.inf  # only the last column survives: every earlier block is all -inf
    x[2, : n - 7] = -np.inf  # a masked prefix that ends inside a block
    x[3, 1::2] = -np.inf  # scattered
    x[4, :3] = -np.inf
    return x


def test_softmax_reference_semantics_for_masked_rows() -> None:
    import torch
    from tuner.kernels.norms import softmax_reference

    x = _masked_rows(50)
    ref = softmax_reference(x)
    assert (ref[0] == 0).all()  # fully masked: zeros (torch.softmax gives NaN there)
    assert torch.isnan(torch.softmax(torch.tensor(x[:1]), -1)).all()
    np.testing.assert_allclose(ref[1:], torch.softmax(torch.tensor(x[1:]), -1).numpy(), rtol=1e-12)
    assert ref[1, -1] == 1.0 and (ref[1, :-1] == 0).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_masked_rows_on_every_path(backend: str, dtype: str) -> None:
    """Single pass, multi pass with unaligned and aligned column blocks: masked rows match the reference
    (the multi-pass path used to turn a row whose first block is all -inf into NaN)."""
    import jax.numpy as jnp
    import torch
    from tuner.kernels.norms import softmax_pallas, softmax_reference, softmax_triton

    from tuner.measure import compare

    spec = get_kernel("softmax")
    rtol, atol = spec.tolerance(dtype)
    for n, block in ((100, 128), (100, 16), (96, 32), (333, 16)):
        x = _masked_rows(n)
        if backend == "triton":
            xt = torch.tensor(x, dtype=torch.float32).to(getattr(torch, dtype))
            out = softmax_triton(xt, torch.full_like(xt, float("nan")), BLOCK_N=block, ROWS_PER_PROGRAM=2)
        else:
            xt = jnp.asarray(x, dtype=jnp.float32).astype(dtype)
            out = softmax_pallas(xt, jnp.full(xt.shape, jnp.nan, xt.dtype), block_rows=4, block_cols=block)
        ref = softmax_reference(to_numpy(xt))
        got = to_numpy(out)
        assert not np.isnan(got).any(), (n, block)
        c = compare(out, ref, rtol, atol)
        assert c.ok, (n, block, c.message)


def _old_online_softmax(x: np.ndarray, block: int) -> np.ndarray:
    """The multi-pass algorithm as it was: the running max starts at -inf and is subtracted unguarded."""
    m = np.full(x.shape[0], -np.inf)
    s = np.zeros(x.shape[0])
    with np.errstate(invalid="ignore"):
        for start in range(0, x.shape[1], block):
            xb = x[:, start : start + block]
            m_new = np.maximum(m, xb.max(axis=1))
            s = s * np.exp(m - m_new) + np.exp(xb - m_new[:, None]).sum(axis=1)
            m = m_new
        return np.exp(x - m[:, None]) / s[:, None]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gate_catches_the_old_softmax_defect_and_zeroed_probabilities(dtype: str) -> None:
    """Against the generator's inputs and the spec's tolerance, the gate fails (a) the old multi-pass
    output (NaN rows) and (b) an output with every probability below 0.01 zeroed (N = 1000, where the
    old absolute tolerance of the half-precision dtypes let it pass)."""
    from tuner.measure import compare

    spec = get_kernel("softmax")
    rtol, atol = spec.tolerance(dtype)
    problem = {"M": 16, "N": 1000, "dtype": dtype}
    inputs = spec.make_inputs(problem, "triton", 0)
    ref = spec.reference(problem, inputs)
    x = to_numpy(inputs["x"]).astype(np.float64)
    old = _old_online_softmax(x, 128)
    assert np.isnan(old).any()
    c = compare(old, ref, rtol, atol)
    assert not c.ok and "NaN" in (c.message or "")
    zeroed = np.where(ref < 0.01, 0.0, ref)
    assert (zeroed != ref).sum() > 1000
    assert not compare(zeroed, ref, rtol, atol).ok
    # what the old bf16 tolerance (rtol = atol = 3e-2) accepted:
    if dtype == "bfloat16":
        assert compare(zeroed, ref, 3e-2, 3e-2).ok
    assert compare(ref.astype(np.float32), ref, rtol, atol).ok  # the right answer still passes


# ---- space properties -------------------------------------------------------------------------------
GPU = (devices.SM80, devices.SM90)
TPU = (devices.TPU_V4, devices.TPU_V5E, devices.TPU_V5P, devices.TPU_V6E)

problems = st.fixed_dictionaries(
    {
        "M": st.integers(1, 70000),
        "N": st.integers(1, 70000),
        "dtype": st.sampled_from(["float32", "float16", "bfloat16"]),
    }
)
device_backend = st.sampled_from(
    [(d, "triton") for d in (*GPU, devices.CPU)] + [(d, "pallas") for d in (*TPU, devices.CPU)]
)


def _assert_violations_name_values(space: Any, cfg: dict[str, Any]) -> None:
    reasons = space.violations(cfg)
    broken = [c for c in space.constraints if c.violation(cfg)]
    assert len(reasons) == len(broken)
    for c, why in zip(broken, reasons, strict=True):
        assert c.name in why
        for u in c.uses:
            assert f"{u}={cfg[u]!r}" in why, (why, u)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    problem=problems,
    db=device_backend,
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_space_properties(
    kind: str, problem: dict[str, Any], db: tuple[Any, str], seed: int, data: Any
) -> None:
    device, backend = db
    space = spaces.rowwise_space(kind, problem, device, backend)
    if len(space) == 0:  # e.g. a huge unaligned row on a small-VMEM TPU: nothing fits, and sampling says so
        with pytest.raises(ValueError, match="no valid config"):
            space.sample(seed)
        return
    for cfg in space.sample(seed, n=5):
        assert space.contains(cfg), space.violations(cfg)
        assert all(c.violation(cfg) is None for c in space.constraints)
    # an arbitrary point of the cartesian product: valid, or rejected with the values named
    raw = {p.name: data.draw(st.sampled_from(p.values)) for p in space.params}
    _assert_violations_name_values(space, raw)


def test_sm80_and_sm90_agree_because_the_row_kernels_use_no_shared_memory() -> None:
    """The hardware differs in shared memory, which these kernels do not use (reduction scratch only,
    measured by benchmarks/triton_resources_b.py), and not in registers: the spaces are the same."""
    problem = {"M": 4096, "N": 32768, "dtype": "float32"}
    s80 = spaces.softmax_space(problem, devices.SM80, "triton")
    s90 = spaces.softmax_space(problem, devices.SM90, "triton")
    assert s80.enumerate() == s90.enumerate()
    assert "num_stages" not in s80.names  # identical PTX for every num_stages: not a parameter
    assert (
        spaces.triton_smem_bytes("softmax", 32768, "float32", {"ROWS_PER_PROGRAM": 64, "num_warps": 32})
        < devices.SM80.smem_per_block_bytes
    )


def test_registers_and_threads_limit_gpu_configs() -> None:
    space = spaces.layernorm_space({"M": 64, "N": 65536, "dtype": "float16"}, devices.SM90, "triton")
    why = space.violations({"BLOCK_N": 65536, "ROWS_PER_PROGRAM": 1, "num_warps": 1})
    assert any("register" in w and "num_warps=1" in w for w in why)
    assert space.contains({"BLOCK_N": 1024, "ROWS_PER_PROGRAM": 1, "num_warps": 4})


def test_tpu_generations_differ_by_vmem_and_alignment() -> None:
    problem = {"M": 8192, "N": 32768, "dtype": "float32"}
    cfg = {"block_rows": 32, "block_cols": 1024}  # 2x2 x 32 x 32768 x 4 B = 16 MiB of row blocks
    v4 = spaces.rmsnorm_space(problem, devices.TPU_V4, "pallas")
    v5e = spaces.rmsnorm_space(problem, devices.TPU_V5E, "pallas")
    assert v5e.contains(cfg)
    (why,) = v4.violations(cfg)
    assert "VMEM" in why and "tpu_v4" in why and "block_rows=32" in why
    odd = spaces.rmsnorm_space({"M": 64, "N": 1000, "dtype": "bfloat16"}, devices.TPU_V5E, "pallas")
    reasons = odd.violations({"block_rows": 8, "block_cols": 256})
    assert any("sublanes" in r and "block_rows=8" in r for r in reasons)
    assert any("128-lane" in r and "block_cols=256" in r for r in reasons)
    assert odd.contains({"block_rows": 16, "block_cols": 1024})  # whole row: no alignment needed


def test_cpu_space_allows_small_blocks_and_backends_refuse_foreign_devices() -> None:
    tri = spaces.softmax_space({"M": 37, "N": 100}, devices.CPU, "triton")
    pal = spaces.softmax_space({"M": 37, "N": 100}, devices.CPU, "pallas")
    assert 16 in tri["BLOCK_N"].values and 16 in pal["block_cols"].values
    assert max(tri["BLOCK_N"].values) == 128
    with pytest.raises(ValueError, match="pallas"):
        spaces.softmax_space({"M": 8, "N": 8}, devices.SM90, "pallas")
    with pytest.raises(ValueError, match="triton"):
        spaces.softmax_space({"M": 8, "N": 8}, devices.TPU_V5E, "triton")
    with pytest.raises(ValueError, match="N=0"):
        spaces.softmax_space({"M": 8, "N": 0}, devices.CPU, "triton")


def test_block_caps_follow_the_problem() -> None:
    space = spaces.softmax_space({"M": 3, "N": 20}, devices.SM80, "triton")
    why = space.violations({"BLOCK_N": 64, "ROWS_PER_PROGRAM": 8, "num_warps": 4})
    assert any("BLOCK_N=64" in w and "next_pow2(N=20))=32" in w for w in why)
    assert any("ROWS_PER_PROGRAM=8" in w and "next_pow2(M=3)=4" in w for w in why)
    assert all(c["BLOCK_N"] <= 32 and c["ROWS_PER_PROGRAM"] <= 4 for c in space.enumerate())
    assert math.isfinite(len(space))


@pytest.mark.parametrize("kind", KINDS)
def test_pallas_kernels_lower_for_tpu(kind: str) -> None:
    """CPU twin of a TPU run: export for platform 'tpu' runs the Mosaic lowering of the kernel body (which
    interpret mode never does) for a config the TPU space accepts, whole-row and chunked."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax import export
    from tuner.kernels import norms

    launch = {
        "softmax": norms.softmax_pallas,
        "rmsnorm": norms.rmsnorm_pallas,
        "layernorm": norms.layernorm_pallas,
    }[kind]
    problem = {"M": 100, "N": 1024, "dtype": "bfloat16"}
    space = spaces.rowwise_space(kind, problem, devices.TPU_V5E, "pallas")
    x = jax.ShapeDtypeStruct((100, 1024), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((1024,), jnp.bfloat16)
    params = {"softmax": (), "rmsnorm": (w,), "layernorm": (w, w)}[kind]
    for cfg in ({"block_rows": 16, "block_cols": 1024}, {"block_rows": 32, "block_cols": 256}):
        assert space.contains(cfg), space.violations(cfg)
        f = functools.partial(launch, interpret=False, **cfg)
        exported = export.export(jax.jit(f), platforms=["tpu"])(x, *params)
        assert "tpu_custom_call" in exported.mlir_module()


def test_pallas_poisoned_output_alias_is_blocked_like_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter the poisoned `out` is aliased as the output. jax 0.11's interpreter pads a
    blocked output to whole blocks but not an unblocked (`memory_space=ANY`) alias of it, and every row
    kernel failed when M is no multiple of the block ("carry input and carry output must have equal
    types"): the alias is blocked like the output, and unwritten rows still keep their NaN."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from tuner.kernels.norms import softmax_pallas

    calls: list[dict[str, Any]] = []
    real = pl.pallas_call

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(pl, "pallas_call", recording)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((37, 100)), jnp.float32)
    out = softmax_pallas(
        x, jnp.full((37, 100), jnp.nan, jnp.float32), block_rows=16, block_cols=32, interpret=True
    )
    (kw,) = calls
    (alias_in,) = kw["input_output_aliases"]
    assert kw["in_specs"][alias_in].block_shape == kw["out_specs"].block_shape == (16, 100)
    e = np.exp(np.asarray(x, np.float64) - np.asarray(x, np.float64).max(axis=1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
