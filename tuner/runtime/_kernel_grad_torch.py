"""torch autograd through `tuner.kernel(name, backend="triton")` for a kernel with a backward kernel of its
own (`spec.extra["torch_backward"]`, the name of a registered kernel: "flash_attention" ->
"flash_attention_bwd"). `differentiable_torch(spec, backward)` is the launcher that the hit path calls with
the tuned config: a call under grad mode with an input that requires grad runs through a
`torch.autograd.Function` whose forward is the backward kernel's `extra["torch_autograd"]["forward"]` (the
forward launcher with the tuned config, keeping what the backward needs: attention's log-sum-exp rows) and
whose backward calls the backward kernel through the runtime cache (`backward()`, a `tuner.kernel` of the
same options: tuned on its first miss and stored under its own key). Any other call (no_grad, inputs that
need no gradient) runs the plain launcher.

Under autograd the forward hook returns an output tensor of its own, which autograd saves for the
backward and the gradient flows from; the output buffer (`out`) gets a copy of it, so that reading the
buffer gives the same values as without autograd, and a buffer written again (by a later call, or by
the timed runs of a tuning on a miss) cannot change what the backward reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tuner.kernels import KernelSpec

__all__ = ["differentiable_torch"]

Launch = Callable[..., Any]


class _Call:
    """What one differentiated call needs in its backward (kept on the autograd context)."""

    __slots__ = ("problem", "names", "config", "hooks", "backward")

    def __init__(
        self,
        problem: Mapping[str, Any],
        names: list[str],
        config: Mapping[str, Any],
        hooks: Mapping[str, Any],
        backward: Callable[[], Any],
    ) -> None:
        self.problem = dict(problem)
        self.names = names
        self.config = dict(config)
        self.hooks = hooks
        self.backward = backward


_FUNCTION: Any = None


def _function() -> Any:
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    class KernelFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, call: _Call, *tensors: Any) -> Any:
            inputs = dict(zip(call.names, tensors, strict=True))
            out, saved = call.hooks["forward"](call.problem, inputs, call.config)
            ctx.save_for_backward(*saved)
            ctx.call = call
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            call: _Call = ctx.call
            bwd_inputs = call.hooks["backward_inputs"](ctx.saved_tensors, grad_out)
            result = call.backward()(call.problem, bwd_inputs)
            grads = call.hooks["input_grads"](result)
            return (
                None,
                *(grads.get(n) if ctx.needs_input_grad[i + 1] else None for i, n in enumerate(call.names)),
            )

    _FUNCTION = KernelFunction
    return _FUNCTION


def differentiable_torch(spec: KernelSpec, backend: str, backward: Callable[[], Any]) -> Launch:
    """`launch(problem, inputs, **config)`: `spec.run(problem, backend, inputs, config)`, recorded for torch
    autograd with the backward kernel `backward()` (a `TunedKernel`) when grad mode is on and an input
    requires grad (see the module's docstring). Other calls cost one `requires_grad` look per input."""
    run = spec.run
    hooks: Mapping[str, Any] | None = None
    grad_enabled: Any = None

    def launch(problem: Mapping[str, Any], inputs: dict[str, Any], **config: Any) -> Any:
        nonlocal hooks, grad_enabled
        if any(getattr(v, "requires_grad", False) for v in inputs.values()):
            if grad_enabled is None:
                import torch

                grad_enabled = torch.is_grad_enabled
            if grad_enabled():
                if hooks is None:
                    hooks = backward().spec.extra["torch_autograd"]
                names = list(inputs)
                call = _Call(problem, names, config, hooks, backward)
                return _function().apply(call, *(inputs[n] for n in names))
        return run(problem, backend, inputs, config)

    return launch
