"""`jax.grad` / `jax.vjp` / `jax.jvp` / `jax.jacfwd` / `jax.hessian` through `tuner.kernel(name,
backend="pallas")`: the primal is the tuned Pallas launcher, the derivative the JVP of the kernel's JAX
reference (tuner/runtime/_kernel_grad.py, kernels/_jax_reference.py). Before, grad failed inside jax
(softmax: "JVP with aliasing not supported", matmul: an AssertionError of Pallas' JVP rule); then forward
mode failed ("can't apply forward-mode autodiff (jvp) to a custom_vjp function")."""

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
    # but the backward kernels (flash_attention_bwd): jax's reverse mode runs them, nothing differentiates them
    forward = [s.name for s in all_kernels() if "pallas" in s.backends and "gradient_of" not in s.extra]
    assert sorted(PROBLEMS) == sorted(forward)


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
    # flash_attention's reverse mode is its Pallas backward kernel (fp32 sums over tiles in another
    # order than the reference's): a few ulps of the gradient's scale more
    atol = 1e-5 if spec.extra.get("jax_backward") else 1e-6
    for got in (eager, jitted):
        for n in floats:
            assert got[n].shape == floats[n].shape and got[n].dtype == floats[n].dtype, n
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=atol, err_msg=n)
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


def _spied(monkeypatch, name):
    """`_setup(name)` of a norms kernel, its eager output, and the list of configs its Pallas launcher runs
    (or is traced) with from now on."""
    from tuner.kernels import norms

    spec, prob, inputs, k = _setup(name)
    plain = k(prob, inputs)
    seen = []
    launch = norms._launch_pallas

    def spy(kind, x, params, out, eps, block_rows, block_cols, interpret):
        seen.append({"block_rows": block_rows, "block_cols": block_cols})
        return launch(kind, x, params, out, eps, block_rows, block_cols, interpret)

    monkeypatch.setattr(norms, "_launch_pallas", spy)
    return spec, prob, inputs, k, plain, seen


def test_the_forward_under_grad_is_the_tuned_forward_and_unchanged(monkeypatch):
    spec, prob, inputs, k, plain, seen = _spied(monkeypatch, "softmax")
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

    def jvp(x):
        return jax.jvp(loss, (x,), (jnp.ones_like(x),))

    monkeypatch.setitem(_jax_reference._REFERENCES, "rmsnorm", spec.reference)  # numpy: not traceable
    for how in (jax.grad(loss), jvp):
        with pytest.raises(TypeError, match=r"kernel 'rmsnorm'.*reference cannot be differentiated"):
            how(inputs["x"])
    monkeypatch.delitem(_jax_reference._REFERENCES, "rmsnorm")
    for how in (jax.grad(loss), jvp):
        with pytest.raises(TypeError, match=r"kernel 'rmsnorm'.*has no JAX reference"):
            how(inputs["x"])
    # the forward under jit does not need one
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda x: k(prob, {**inputs, "x": x}))(inputs["x"])), np.asarray(k(prob, inputs))
    )


# Forward mode (jax.jvp, jax.jacfwd, jax.hessian): the call is a `custom_jvp` whose rule runs the tuned
# launcher for the primal and the JVP of the JAX reference for the tangent. Before, every one of these raised
# "can't apply forward-mode autodiff (jvp) to a custom_vjp function".


def _tangents(spec, inputs, seed=4):
    """A random tangent for each float input (but the output buffer: zeros), float0 for the integer ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, v in inputs.items():
        if jnp.issubdtype(v.dtype, jnp.integer):
            out[n] = np.zeros(v.shape, jax.dtypes.float0)
        elif n == spec.output_buffer:
            out[n] = jnp.zeros_like(v)
        else:
            out[n] = jnp.asarray(rng.standard_normal(v.shape), v.dtype)
    return out


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_jvp_through_the_tuned_kernel_is_the_references(name):
    spec, prob, inputs, k = _setup(name)
    ref = jax_reference(spec)
    plain = k(prob, inputs)
    tan = _tangents(spec, inputs)
    # every input at once, the integer ones with float0 tangents (what jax.jvp demands of them)
    y, dy = jax.jvp(lambda inp: k(prob, inp), (inputs,), (tan,))
    jy, jdy = jax.jit(lambda inp, t: jax.jvp(lambda i: k(prob, i), (inp,), (t,)))(inputs, tan)
    _, want = jax.jvp(lambda inp: ref(prob, inp), (inputs,), (tan,))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(plain))  # the primal is the kernel's output
    np.testing.assert_array_equal(np.asarray(jy), np.asarray(plain))
    for got in (dy, jdy):
        assert got.shape == plain.shape and got.dtype == plain.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.asarray(got).any()
    # the output buffer's tangent moves nothing: it is overwritten
    if spec.output_buffer in inputs:
        moved = {**tan, **{n: jnp.zeros_like(v) for n, v in _floats(spec, inputs).items()}}
        moved[spec.output_buffer] = jnp.ones_like(inputs[spec.output_buffer])
        _, none = jax.jvp(lambda inp: k(prob, inp), (inputs,), (moved,))
        assert not np.asarray(none).any()


# jax's lax.ragged_dot (moe_gemm's reference) has no batching rule for an operand batched alone
# ("ragged_dot vmap over any dim but 0 - NYI"), so its jacfwd / vmap of grad fail in jax's own reference
VMAPPABLE = sorted(set(PROBLEMS) - {"moe_gemm"})


@pytest.mark.parametrize("name", VMAPPABLE)
def test_jacfwd_and_vmap_of_grad_through_the_tuned_kernel(name):
    spec, prob, inputs, k = _setup(name)
    ref = jax_reference(spec)
    floats = _floats(spec, inputs)
    n0 = min(floats, key=lambda n: floats[n].size)  # the smallest float input: a small Jacobian
    x = floats[n0]

    def at(fn):
        return lambda v: fn(prob, {**inputs, n0: v})

    def loss(fn):
        return lambda v: jnp.sum(jnp.tanh(at(fn)(v)))

    xs = jnp.stack([x, x * 0.5 + 0.25])
    for got, want in (
        (jax.jacfwd(at(k))(x), jax.jacfwd(at(ref))(x)),
        (jax.jit(jax.jacfwd(at(k)))(x), jax.jacfwd(at(ref))(x)),
        (jax.vmap(jax.grad(loss(k)))(xs), jax.vmap(jax.grad(loss(ref)))(xs)),
        (jax.jit(jax.vmap(jax.grad(loss(k))))(xs), jax.vmap(jax.grad(loss(ref)))(xs)),
    ):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_hessian_through_the_tuned_kernel_is_the_references():
    spec, prob, inputs, k = _setup("rmsnorm")
    ref = jax_reference(spec)

    def loss(fn):
        return lambda w: jnp.sum(jnp.sin(fn(prob, {**inputs, "w": w})))

    w = inputs["w"]
    want = jax.hessian(loss(ref))(w)
    for got in (jax.hessian(loss(k))(w), jax.jit(jax.hessian(loss(k)))(w)):
        assert got.shape == (w.size, w.size)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert np.asarray(got).any()


def test_every_transform_runs_the_tuned_pallas_kernel_for_the_primal(monkeypatch):
    spec, prob, inputs, k, plain, seen = _spied(monkeypatch, "rmsnorm")
    stats = dict(k.tuner.stats)
    x, w = inputs["x"], inputs["w"]
    tx = jnp.ones_like(x)

    def f(x):
        return k(prob, {**inputs, "x": x})

    def loss(x):
        return jnp.sum(jnp.sin(f(x)))

    runs = {
        "jvp": lambda: jax.jvp(f, (x,), (tx,))[0],
        "jit jvp": lambda: jax.jit(lambda x: jax.jvp(f, (x,), (tx,)))(x)[0],
        "grad": lambda: jax.value_and_grad(lambda x: jnp.sum(f(x)))(x)[0],
        "jit grad": lambda: jax.jit(jax.value_and_grad(lambda x: jnp.sum(f(x))))(x)[0],
        "vmap grad": lambda: jax.vmap(jax.grad(loss))(jnp.stack([x, x])),
        "jacfwd": lambda: jax.jacfwd(lambda w: k(prob, {**inputs, "w": w}))(w),
        "hessian": lambda: jax.hessian(lambda w: jnp.sum(jnp.sin(k(prob, {**inputs, "w": w}))))(w),
    }
    for what, run in runs.items():
        seen.clear()
        out = run()
        assert seen, what  # the Pallas launcher ran (or was traced) for the primal
        assert all(c == k.tuner.last_choice["config"] for c in seen), what
        if what in ("jvp", "jit jvp"):
            np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))
        if what in ("grad", "jit grad"):
            np.testing.assert_allclose(float(out), float(np.sum(np.asarray(plain, np.float64))), rtol=1e-5)
    assert k.tuner.stats == stats  # hits: nothing resolved again


def test_a_miss_under_jvp_tunes_on_concrete_arrays(tmp_path):
    spec = get_kernel("softmax")
    prob = PROBLEMS["softmax"]
    inputs = spec.make_inputs(prob, "pallas", 0)
    timed = []

    def bench(call):
        out = call()
        timed.append(not isinstance(out, jax.core.Tracer))
        return 1e-3 * len(timed)

    k = tuner.kernel("softmax", backend="pallas", budget=2, storage=f"sqlite:///{tmp_path}/s.db", bench=bench)
    t = jnp.ones_like(inputs["x"])
    # the first call of all is a miss under jax.jvp inside jax.jit
    y, dy = jax.jit(lambda x: jax.jvp(lambda v: k(prob, {**inputs, "x": v}), (x,), (t,)))(inputs["x"])
    assert timed and all(timed)  # timed on concrete arrays, never on tracers
    assert k.tuner.stats["tuned"] == 1
    ref = jax_reference(spec)
    _, want = jax.jvp(lambda v: ref(prob, {**inputs, "x": v}), (inputs["x"],), (t,))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(k(prob, inputs)))
    np.testing.assert_allclose(dy, want, rtol=1e-5, atol=1e-6)
    assert len(timed) == 2  # and that was the only tuning
