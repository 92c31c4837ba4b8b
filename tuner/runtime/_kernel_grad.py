"""Derivatives of `tuner.kernel(name, backend="pallas")`: the Pallas launchers are forward kernels
(`pallas_call` has no usable JVP: an aliased output buffer, a manual K loop), so `jax.grad` or `jax.jvp`
through one would fail inside jax. `differentiable(spec, backend)` is the launcher that the hit path calls
with the tuned config: a call with a jax tracer among its inputs (under `jax.grad`, `jax.jvp`, `jax.vmap`,
`jax.jit`) runs through a `jax.custom_jvp` whose rule computes the primal output with the launcher and that
config (the same result) and the tangent output with the JVP of the kernel's JAX reference
(`tuner.kernels._jax_reference.jax_reference`) at the call's inputs: correct derivatives, not tuned kernels.
Reverse mode (`jax.grad`, `jax.vjp`) is jax's transpose of that linear tangent map; forward mode
(`jax.jvp`, `jax.jacfwd`) uses it as it is; a second derivative (`jax.hessian`) differentiates the rule
again, so the primal is the launcher at every order. A call with concrete arrays (eager, and every timed
run of a tuning) calls the launcher as before, after one isinstance check per input.

A kernel with a backward kernel of its own (`spec.extra["jax_backward"]`: flash_attention ->
flash_attention_bwd) gets that kernel in reverse mode: the rule computes the primal with the backward's
`extra["jax_autodiff"]["forward"]` hook (the launcher with the tuned config, keeping attention's lse rows)
and the tangent as a `jax.custom_derivatives.linear_call` whose forward is the reference's JVP (what
`jax.jvp` and `jax.linearize` evaluate) and whose transpose (what `jax.grad` and `jax.vjp` run) is the
backward kernel through the runtime cache (`backward()`, tuned and stored under its own key). linear_call
has no batching rule and no derivative in its residuals, so where the rule runs batched (`jax.vmap`,
`jax.jacfwd`) or under another derivative of the primals (`jax.hessian`) it takes the reference's JVP as
above; a `jax.vmap` applied outside a `jax.jit` of a gradient meets the linear_call already staged and
fails inside jax ("Batching rule for 'linear_call' not implemented"): put the vmap inside the jit.

Derivatives flow from the floating-point inputs but the output buffer (`spec.output_buffer`, overwritten);
integer inputs (int8 weights, group sizes) take float0 tangents and get float0 cotangents, as jax wants,
and the buffer's tangent moves nothing (zero cotangent). A kernel with no JAX reference, or one whose
reference cannot be differentiated, raises TypeError naming the kernel when the call is differentiated;
its forward under `jit` or `vmap` is unaffected. Transforms of the reference that jax cannot do fail as
they would on the reference (moe_gemm's `lax.ragged_dot` has no batching rule for an operand batched
alone: `jax.vmap` of its derivatives, `jax.jacfwd`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tuner.kernels import KernelSpec

__all__ = ["differentiable"]

Launch = Callable[..., Any]


def differentiable(spec: KernelSpec, backend: str, backward: Callable[[], Any] | None = None) -> Launch:
    """`launch(problem, inputs, **config)`: `spec.run(problem, backend, inputs, config)`, differentiable in
    forward and reverse mode through the kernel's JAX reference when its inputs are traced (see the module's
    docstring); with `backward` (a kernel with a backward kernel of its own: flash_attention), reverse mode
    runs that kernel, `backward()` being its `TunedKernel`. An eager call costs one isinstance check per
    input more than the plain launcher."""
    run = spec.run
    tracer: Any = None

    def launch(problem: Mapping[str, Any], inputs: dict[str, Any], **config: Any) -> Any:
        nonlocal tracer
        if tracer is None:
            from jax.core import Tracer as tracer
        for v in inputs.values():
            if isinstance(v, tracer):
                tuned = None if backward is None else (config, backward)
                return _traced(spec, problem, lambda i: run(problem, backend, i, config), inputs, tuned)
        return run(problem, backend, inputs, config)

    return launch


def _batched_or_nested(primals: Any, tangents: Any) -> bool:
    """True where the rule runs under `jax.vmap` (a batched primal or tangent: `jax.jacfwd` too) or under
    another derivative of the primals (`jax.hessian`): there `jax.custom_derivatives.linear_call`, which has
    no batching rule and no derivative in its residuals, cannot carry the backward kernel. True as well
    when jax's tracer classes cannot be found (the reference path is always correct)."""
    import jax

    try:
        from jax._src.interpreters import ad, batching
    except ImportError:  # pragma: no cover - another jax layout
        return True
    nested = tuple(t for t in (getattr(ad, "JVPTracer", None), getattr(ad, "LinearizeTracer", None)) if t)
    batch = batching.BatchTracer
    if any(isinstance(x, (batch, *nested)) for x in jax.tree_util.tree_leaves(primals)):
        return True
    return any(isinstance(x, batch) for x in jax.tree_util.tree_leaves(tangents))


def _is_float(x: Any) -> bool:
    import jax.numpy as jnp

    dtype = getattr(x, "dtype", None)
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))


def _no_reference(spec: KernelSpec, why: str) -> TypeError:
    return TypeError(
        f"kernel {spec.name!r}: cannot differentiate through its Pallas launcher: {why} (tuner differentiates "
        "a kernel with the VJP of its JAX reference: give the spec extra['jax_reference'], a function "
        "(problem, inputs) -> jax array made of differentiable jax operations)"
    )


def _traced(
    spec: KernelSpec,
    problem: Mapping[str, Any],
    forward: Callable[[dict[str, Any]], Any],
    inputs: Mapping[str, Any],
    tuned: tuple[Mapping[str, Any], Callable[[], Any]] | None = None,
) -> Any:
    """One traced call, `forward(inputs)` (the launcher with the problem and the tuned config): a
    `custom_jvp` over the float inputs (but the output buffer) and the rest, whose rule is the launcher for
    the primal output and the JVP of the kernel's JAX reference for the tangent. With `tuned` (the call's
    config and its backward kernel's `TunedKernel` maker), the tangent is a `linear_call` whose forward is
    that JVP and whose transpose (reverse mode) is the backward kernel (module docstring)."""
    import jax

    from tuner.kernels._jax_reference import jax_reference

    names = list(inputs)
    floats = {n: v for n, v in inputs.items() if n != spec.output_buffer and _is_float(v)}
    rest = {n: v for n, v in inputs.items() if n not in floats}

    def joined(fl: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
        return {n: fl[n] if n in fl else other[n] for n in names}

    @jax.custom_jvp
    def f(fl: dict[str, Any], other: dict[str, Any]) -> Any:
        return forward(joined(fl, other))

    @f.defjvp
    def rule(primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> tuple[Any, Any]:
        fl, other = primals
        dfl, _ = tangents  # the rest (integers, the overwritten output buffer): no derivative
        ref = jax_reference(spec)
        if ref is None:  # raised here, before the forward runs, when differentiated only
            raise _no_reference(spec, "it has no JAX reference")
        # `f` itself, not `forward`: under a second derivative (jax.hessian, jacfwd of grad) the primal
        # is differentiated again, by this rule, never by pallas_call's own JVP
        if tuned is not None and not _batched_or_nested(primals, tangents):
            return _with_backward_kernel(spec, problem, tuned, ref, fl, other, dfl, joined)
        out = f(fl, other)

        def reference(d: dict[str, Any]) -> Any:
            return ref(problem, joined(d, other)).astype(out.dtype)

        try:
            _, dout = jax.jvp(reference, (fl,), (dfl,))
        except Exception as exc:  # noqa: BLE001 - the reference's own failure, named with the kernel
            raise _no_reference(
                spec, f"its JAX reference cannot be differentiated ({type(exc).__name__}: {exc})"
            ) from exc
        return out, dout

    return f(floats, rest)


def _with_backward_kernel(
    spec: KernelSpec,
    problem: Mapping[str, Any],
    tuned: tuple[Mapping[str, Any], Callable[[], Any]],
    ref: Any,
    fl: dict[str, Any],
    other: dict[str, Any],
    dfl: dict[str, Any],
    joined: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]],
) -> tuple[Any, Any]:
    """The rule's (output, tangent) for a kernel with a backward kernel: the output from the backward's
    `jax_autodiff["forward"]` hook (the launcher with the call's tuned config, keeping what the backward
    reads: attention's lse rows), the tangent a `jax.custom_derivatives.linear_call` of the reference's JVP
    (what `jax.jvp` and `jax.linearize` evaluate) whose transpose (what `jax.grad` and `jax.vjp` run) is the
    backward kernel called through the runtime cache, tuned under its own key."""
    import jax
    from jax.custom_derivatives import linear_call

    config, backward = tuned
    hooks = backward().spec.extra["jax_autodiff"]
    out, saved = hooks["forward"](problem, joined(fl, other), config)

    def jvp(res: tuple[Any, Any], d: dict[str, Any]) -> Any:
        primal, _ = res

        def reference(x: dict[str, Any]) -> Any:
            return ref(problem, joined(x, other)).astype(out.dtype)

        try:
            return jax.jvp(reference, (primal,), (d,))[1]
        except Exception as exc:  # noqa: BLE001 - the reference's own failure, named with the kernel
            raise _no_reference(
                spec, f"its JAX reference cannot be differentiated ({type(exc).__name__}: {exc})"
            ) from exc

    def vjp(res: tuple[Any, Any], ct: Any) -> dict[str, Any]:
        _, kept = res
        grads = hooks["input_grads"](backward()(problem, hooks["backward_inputs"](kept, ct)))
        return {n: grads[n].astype(t.dtype) for n, t in dfl.items()}

    return out, linear_call(jvp, vjp, (fl, saved), dfl)
