"""Reverse-mode derivatives of `tuner.kernel(name, backend="pallas")`: the Pallas launchers are forward
kernels (`pallas_call` has no usable JVP: an aliased output buffer, a manual K loop), so `jax.grad`
through one would fail inside jax. `differentiable(spec, backend)` is the launcher that the hit path
calls with the tuned config: a call with a jax tracer among its inputs (under `jax.grad`, `jax.vjp`,
`jax.jit`) runs through a `jax.custom_vjp` whose forward is the launcher with that config (the
same result) and whose backward is the VJP of the kernel's JAX reference
(`tuner.kernels._jax_reference.jax_reference`) at the call's inputs: correct gradients, not tuned kernels.
A call with concrete arrays (eager, and every timed run of a tuning) calls the launcher as before, after
one isinstance check per input.

Gradients flow to the floating-point inputs but the output buffer (`spec.output_buffer`, overwritten);
integer inputs (int8 weights, group sizes) and the buffer get zero cotangents (float0 for integers, as
jax wants). Forward mode (`jax.jvp`) is not supported (a `custom_vjp`). A kernel with no JAX reference,
or one whose reference cannot be differentiated, raises TypeError naming the kernel when the call is
differentiated; its forward under `jit` is unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tuner.kernels import KernelSpec

__all__ = ["differentiable"]

Launch = Callable[..., Any]


def differentiable(spec: KernelSpec, backend: str) -> Launch:
    """`launch(problem, inputs, **config)`: `spec.run(problem, backend, inputs, config)`, differentiable in
    reverse mode through the kernel's JAX reference when its inputs are traced (see the module's docstring).
    An eager call costs one isinstance check per input more than the plain launcher."""
    run = spec.run
    tracer: Any = None

    def launch(problem: Mapping[str, Any], inputs: dict[str, Any], **config: Any) -> Any:
        nonlocal tracer
        if tracer is None:
            from jax.core import Tracer as tracer
        for v in inputs.values():
            if isinstance(v, tracer):
                return _traced(spec, problem, lambda i: run(problem, backend, i, config), inputs)
        return run(problem, backend, inputs, config)

    return launch


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
) -> Any:
    """One traced call, `forward(inputs)` (the launcher with the problem and the tuned config): a
    `custom_vjp` over the float inputs (but the output buffer) and the rest."""
    import jax

    from tuner.kernels._jax_reference import jax_reference

    names = list(inputs)
    floats = {n: v for n, v in inputs.items() if n != spec.output_buffer and _is_float(v)}
    rest = {n: v for n, v in inputs.items() if n not in floats}

    def joined(fl: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
        return {n: fl[n] if n in fl else other[n] for n in names}

    @jax.custom_vjp
    def f(fl: dict[str, Any], other: dict[str, Any]) -> Any:
        return forward(joined(fl, other))

    def fwd(fl: dict[str, Any], other: dict[str, Any]) -> tuple[Any, Any]:
        if jax_reference(spec) is None:  # raised here, before the forward runs, when differentiated only
            raise _no_reference(spec, "it has no JAX reference")
        return forward(joined(fl, other)), (fl, other)

    def bwd(res: Any, g: Any) -> tuple[Any, None]:
        fl, other = res
        ref = jax_reference(spec)
        assert ref is not None  # fwd checked

        def reference(d: dict[str, Any]) -> Any:
            return ref(problem, joined(d, other)).astype(g.dtype)

        try:
            _, pull = jax.vjp(reference, fl)
        except Exception as exc:  # noqa: BLE001 - the reference's own failure, named with the kernel
            raise _no_reference(
                spec, f"its JAX reference cannot be differentiated ({type(exc).__name__}: {exc})"
            ) from exc
        (grads,) = pull(g)
        return grads, None  # None: zero cotangents for the output buffer and the integer inputs

    f.defvjp(fwd, bwd)
    return f(floats, rest)
