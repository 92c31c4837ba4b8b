"""The registered kernels' references written in jax.numpy, for their gradients: `tuner.kernel(name,
backend="pallas")` differentiates a call with the VJP of the kernel's JAX reference (`jax.grad`,
`jax.vjp`; the Pallas launchers are forward kernels with no derivative of their own).

`jax_reference(spec)` is a function `(problem, inputs) -> jax array` computing what `spec.reference`
computes (in float32, matmuls at HIGHEST precision, from the problem as the kernel's `run` reads it), made
of differentiable jax operations; None for a spec that has none. The registry's kernels have theirs here,
by name (this module is imported by none of the kernels' modules, so it is no part of their source hash:
a change here leaves every cached config an exact hit); another spec gives its own as
`extra["jax_reference"]`.

Where a kernel's function has no derivative at a point, the reference's convention holds: relu'(0) = 0
(`jax.nn.relu`), softmax entries of -inf (masked) get a zero gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ._registry import KernelSpec

__all__ = ["JaxReference", "jax_reference"]

JaxReference = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]


def _f32(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(x).astype(jnp.float32)


def _softmax_rows(s: Any) -> Any:
    """norms.softmax_reference in jnp: -inf entries get 0, a row of only -inf is all zeros. The row max
    is a constant of the gradient (softmax does not change with a shift of its row)."""
    import jax
    import jax.numpy as jnp

    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    e = jnp.exp(s - jnp.where(m == -jnp.inf, 0.0, m))
    tot = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(tot == 0.0, 1.0, tot)


def _rowwise(kind: str, problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """norms.py's `_reference`, eps read as its `_run` reads it."""
    import jax.numpy as jnp

    from .norms import _EPS

    x = _f32(inputs["x"])
    if kind == "softmax":
        return _softmax_rows(x)
    eps = float(problem.get("eps", _EPS[kind]))
    w = _f32(inputs["w"])
    if kind == "rmsnorm":
        return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + _f32(inputs["b"])


def _activation(x: Any, name: str) -> Any:
    """_common.activation_np in jax: gelu is the exact (erf) form."""
    import jax

    if name == "relu":
        return jax.nn.relu(x)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return x


def _dot(a: Any, b: Any) -> Any:
    import jax.numpy as jnp
    from jax import lax

    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _matmul(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """matmul.py's `_reference`: act(a @ b + bias)."""
    from .matmul import check_problem

    p = check_problem(problem)
    acc = _dot(_f32(inputs["a"]), _f32(inputs["b"]))
    if p["bias"]:
        acc = acc + _f32(inputs["bias"])[None, :]
    return _activation(acc, p["activation"])


def _int8_matmul(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """int8_matmul.py's `_reference`: act((x @ w) * scale + bias), w int8 (no gradient)."""
    from .int8_matmul import _check

    p = _check(problem)
    acc = _dot(_f32(inputs["x"]), _f32(inputs["w"])) * _f32(inputs["scale"])[None, :]
    if p["bias"]:
        acc = acc + _f32(inputs["bias"])[None, :]
    return _activation(acc, p["activation"])


def _moe_gemm(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """moe_gemm.py's `_reference`: the rows of expert e times w[e], the group sizes (int, no gradient)
    as the kernel takes them (they may be traced)."""
    import jax.numpy as jnp
    from jax import lax

    sizes = jnp.asarray(inputs["group_sizes"]).astype(jnp.int32)
    return lax.ragged_dot(
        _f32(inputs["x"]),
        _f32(inputs["w"]),
        sizes,
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _attention(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """attention.py's `_reference`: softmax(q k^T * sm_scale, causal mask j <= i) v, the problem read as
    its `_run` reads it."""
    import math

    import jax.numpy as jnp
    from jax import lax
    from tuner.search_spaces.attention import check_problem

    _, _, _, _, causal, _ = check_problem(problem)
    q, k, v = (_f32(inputs[n]) for n in ("q", "k", "v"))
    sm = problem.get("sm_scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm is None else float(sm)
    s = jnp.einsum("bhid,bhjd->bhij", q, k, precision=lax.Precision.HIGHEST) * scale
    if causal:
        n = q.shape[-2]
        s = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), s, -jnp.inf)
    return jnp.einsum("bhij,bhjd->bhid", _softmax_rows(s), v, precision=lax.Precision.HIGHEST)


_REFERENCES: dict[str, JaxReference] = {
    **{kind: functools.partial(_rowwise, kind) for kind in ("softmax", "rmsnorm", "layernorm")},
    "flash_attention": _attention,
    "matmul": _matmul,
    "int8_matmul": _int8_matmul,
    "moe_gemm": _moe_gemm,
}


def jax_reference(spec: KernelSpec) -> JaxReference | None:
    """The kernel's reference in jax.numpy (`(problem, inputs) -> array`): `extra["jax_reference"]`, else
    the registry's own for a kernel of the registry, as registered; None for a spec that has none."""
    from ._registry import REGISTRY

    own = spec.extra.get("jax_reference")
    if callable(own):
        return own  # type: ignore[no-any-return]
    if REGISTRY.get(spec.name) is not spec:  # a spec of another kernel under that name
        return None
    return _REFERENCES.get(spec.name)
