"""`jax.grad` / `jax.vjp` through `tuner.kernel(name, backend="pallas")`: the forward is the tuned Pallas
launcher, the backward the VJP of the kernel's JAX reference (tuner/runtime/_kernel_grad.py,
kernels/_jax_reference.py). Before, grad failed inside jax (softmax: "JVP with aliasing not supported",
matmul: an AssertionError of Pallas' JVP rule)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from tuner.kernels import all_kernels, get_kernel  # noqa: E402
from tuner.kernels._jax_reference import jax_reference  # noqa: E402

import tuner  # noqa: E402

# tiny problems (Pallas interpret mode on CPU), float32 so that the checks can be tight
PROBLEMS = {
    "softmax": {"M": 9, "N": 20, "dtype": "float32"},
    "rmsnorm": {"M": 9, "N": 20, "dtype": "float32"},
    "layernorm": {"M": 9, "N": 20, "dtype": "float32"},
    "matmul": {"M": 9, "N": 12, "K": 10, "dtype": "float32", "bias": True, "activation": "gelu"},
    "int8_matmul": {"M": 9, "N": 12, "K": 10, "dtype": "float32", "bias": True, "activation": "gelu"},
    "moe_gemm": {"T": 12, "K": 8, "N": 10, "E": 3, "dtype": "float32"},
    "flash_attention": {"B": 1, "H": 1, "S": 9, "D": 64, "dtype": "float32", "causal": True},
}


def test_every_registered_pallas_kernel_has_a_problem_here():
    assert sorted(PROBLEMS) == sorted(s.name for s in all_kernels() if "pallas" in s.backends)


def _floats(spec, inputs):
    return {
        n: v for n, v in inputs.items() if n != spec.output_buffer and jnp.issubdtype(v.dtype, jnp.floating)
    }


def _setup(name):
    spec = get_kernel(name)
    prob = PROBLEMS[name]
    inputs = spec.make_inputs(prob, "pallas", 0)
    k = tuner.kernel(name, backend="pallas", mode="offline", storage=False)
    return spec, prob, inputs, k


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_grad_through_the_tuned_kernel_is_the_references(name):
    spec, prob, inputs, k = _setup(name)
    floats = _floats(spec, inputs)
    assert floats
    ref = jax_reference(spec)
    # the JAX reference computes what the kernel's own (numpy, float64) reference does
    np.testing.assert_allclose(
        np.asarray(ref(prob, inputs), np.float64), spec.reference(prob, inputs), rtol=1e-5, atol=1e-5
    )
    y = k(prob, inputs)
    cot = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape), dtype=y.dtype)

    def loss(fn):
        return lambda fl: jnp.sum(fn(prob, {**inputs, **fl}) * cot)

    want = jax.grad(loss(ref))(floats)
    jitted = jax.jit(jax.grad(loss(k)))(floats)
    # eager, over every input: the integer ones get float0, the output buffer zeros
    eager = jax.grad(lambda inp: jnp.sum(k(prob, inp) * cot), allow_int=True)(inputs)
    assert set(eager) == set(inputs)
    for n, v in inputs.items():
        if n in floats:
            continue
        if jnp.issubdtype(v.dtype, jnp.integer):
            assert eager[n].dtype == jax.dtypes.float0, n
        else:
            assert n == spec.output_buffer and not np.asarray(eager[n]).any(), n
    for got in (eager, jitted):
        for n in floats:
            assert got[n].shape == floats[n].shape and got[n].dtype == floats[n].dtype, n
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-6, err_msg=n)
            assert np.isfinite(np.asarray(got[n])).all(), n

    # and the reference's gradient is the derivative of the kernel's float64 reference: a central
    # difference along a random direction
    rng = np.random.default_rng(2)
    host = {n: np.asarray(v, np.float64) for n, v in inputs.items()}
    c = np.asarray(cot, np.float64)
    dirs = {  # relative steps; none on masked (-inf) entries
        n: np.where(
            np.isfinite(host[n]), rng.standard_normal(v.shape) * np.maximum(np.abs(host[n]), 1e-3), 0.0
        )
        for n, v in floats.items()
    }
    h = 1e-6

    def f64(sign):
        moved = {**host, **{n: host[n] + sign * h * d for n, d in dirs.items()}}
        out = spec.reference(prob, moved)
        return float(np.nansum(np.where(np.isfinite(out), out, 0.0) * c))

    fd = (f64(1) - f64(-1)) / (2 * h)
    dot = sum(float(np.sum(np.asarray(eager[n], np.float64) * d)) for n, d in dirs.items())
    scale = sum(float(np.sum(np.abs(np.asarray(eager[n], np.float64) * d))) for n, d in dirs.items())
    assert abs(fd - dot) <= 1e-3 * scale + 1e-6, (fd, dot, scale)


def test_the_forward_under_grad_is_the_tuned_forward_and_unchanged(monkeypatch):
    from tuner.kernels import norms

    spec, prob, inputs, k = _setup("softmax")
    plain = k(prob, inputs)
    seen = []
    launch = norms._launch_pallas

    def spy(kind, x, params, out, eps, block_rows, block_cols, interpret):
        seen.append({"block_rows": block_rows, "block_cols": block_cols})
        return launch(kind, x, params, out, eps, block_rows, block_cols, interpret)

    monkeypatch.setattr(norms, "_launch_pallas", spy)
    stats = dict(k.tuner.stats)
    y, pull = jax.vjp(lambda x: k(prob, {**inputs, "x": x}), inputs["x"])
    jitted = jax.jit(lambda x: k(prob, {**inputs, "x": x}))(inputs["x"])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(plain))
    assert seen and all(c == k.tuner.last_choice["config"] for c in seen)
    assert k.tuner.stats == stats  # hits: nothing resolved again


def test_a_kernel_without_a_differentiable_reference_says_which(monkeypatch):
    from tuner.kernels import _jax_reference

    spec, prob, inputs, k = _setup("rmsnorm")

    def loss(x):
        return k(prob, {**inputs, "x": x}).sum()

    monkeypatch.setitem(_jax_reference._REFERENCES, "rmsnorm", spec.reference)  # numpy: not traceable
    with pytest.raises(TypeError, match=r"kernel 'rmsnorm'.*reference cannot be differentiated"):
        jax.grad(loss)(inputs["x"])
    monkeypatch.delitem(_jax_reference._REFERENCES, "rmsnorm")
    with pytest.raises(TypeError, match=r"kernel 'rmsnorm'.*has no JAX reference"):
        jax.grad(loss)(inputs["x"])
    # the forward under jit does not need one
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda x: k(prob, {**inputs, "x": x}))(inputs["x"])), np.asarray(k(prob, inputs))
    )
