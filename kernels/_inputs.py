"""What inputs a registered kernel takes for a problem, without making them, and the check of a call's
inputs against it (`check_inputs`, which `tuner.kernel` runs on a miss: inputs made for another problem
would be timed, and their winner stored, under this problem's key).

`input_spec(spec, problem, backend)` is {input name: (shape, dtype name)}: the arrays
`spec.make_inputs(problem, backend, seed)` makes, allocating nothing. The registry's kernels have theirs
here, by name (this module is imported by none of the kernels' modules, so it is no part of their
source hash: a change here leaves every cached config an exact hit); another spec gives its own as
`extra["input_spec"]` (a function of (problem, backend)), or is not checked.

`check_input_values(spec, problem, backend, inputs)` checks what the kernel needs of the values of an
input, where its launchers do not check them on the device (that would wait for the device at every
launch): moe_gemm's group sizes, for the registry's spec and a spec of one's own made from it (the same
`run`); another spec gives its own as `extra["check_values"]` (a function of (problem, backend, inputs)
returning None or what is wrong). It reads them (a device sync), so it runs where `check_inputs` runs, on a miss, and only with
concrete arrays (not jax tracers, not torch placeholders): a miss inside a jax trace checks the values it
is tuned on, the call's own where they are concrete, else the stand-ins (a spec's own included).

`stand_in_values(spec, problem, backend, inputs)` gives realistic values for the inputs whose values set
how much work the kernel does, for a miss inside `jax.jit` that is tuned on stand-ins of the tracers
(`tuner.runtime._jax`: random normal floats, zeros otherwise): moe_gemm's group sizes (zeros would leave
every row unwritten, so nothing would be timed) and int8_matmul's weights (an all-zero weight is no
quantized weight); a spec made from one of them (the same `run`) gets the same. Another spec gives its
own as `extra["stand_ins"]`, or keeps the generic stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ._registry import KernelSpec

__all__ = [
    "InputSpec",
    "balanced_group_sizes",
    "check_input_values",
    "check_inputs",
    "input_spec",
    "stand_in_values",
]

# input name -> (shape, dtype name such as "float16", "int8")
InputSpec = dict[str, tuple[tuple[int, ...], str]]


def _rowwise(kind: str, problem: Mapping[str, Any], backend: str) -> InputSpec:
    """norms.py's `_make_inputs`: x and out (M, N), the parameter vectors (N,), in the problem's dtype."""
    from tuner.search_spaces.norms import check_problem

    from .norms import _PARAMS

    m, n, dtype = check_problem(problem)
    return {"x": ((m, n), dtype), **{k: ((n,), dtype) for k in _PARAMS[kind]}, "out": ((m, n), dtype)}


def _attention(problem: Mapping[str, Any], backend: str) -> InputSpec:
    """attention.py's `_make_inputs`: q, k, v and out, all (B, H, S, D) in the problem's dtype."""
    from tuner.search_spaces.attention import check_problem

    b, h, s, d, _, dtype = check_problem(problem)
    return {n: ((b, h, s, d), dtype) for n in ("q", "k", "v", "out")}


def _attention_bwd(problem: Mapping[str, Any], backend: str) -> InputSpec:
    """attention_bwd.py's `_make_inputs`: q, k, v, o, do (B, H, S, D) in the problem's dtype, the forward's
    float32 lse rows (B, H, S) and, for Triton, the gradients' buffer (3, B, H, S, D)."""
    from tuner.search_spaces.attention import check_problem

    b, h, s, d, _, dtype = check_problem(problem)
    spec: InputSpec = {n: ((b, h, s, d), dtype) for n in ("q", "k", "v", "o", "do")}
    spec["lse"] = ((b, h, s), "float32")
    if backend == "triton":
        spec["grads"] = ((3, b, h, s, d), dtype)
    return spec


def _matmul(problem: Mapping[str, Any], backend: str) -> InputSpec:
    """matmul.py's `_make_inputs`: a (M, K), b (K, N), bias (N,) when the problem has one, and for Triton
    the output (M, N), in the problem's dtype."""
    from .matmul import check_problem

    p = check_problem(problem)
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    spec: InputSpec = {"a": ((M, K), dt), "b": ((K, N), dt)}
    if p["bias"]:
        spec["bias"] = ((N,), dt)
    if backend == "triton":
        spec["out"] = ((M, N), dt)
    return spec


def _int8_matmul(problem: Mapping[str, Any], backend: str) -> InputSpec:
    """int8_matmul.py's `_make_inputs`: x (M, K) in the problem's dtype, the int8 weight (K, N) and its
    fp32 scale (N,), bias (N,) when the problem has one, and for Triton the output (M, N)."""
    from .int8_matmul import _check

    p = _check(problem)
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    spec: InputSpec = {"x": ((M, K), dt), "w": ((K, N), "int8"), "scale": ((N,), "float32")}
    if p["bias"]:
        spec["bias"] = ((N,), dt)
    if backend == "triton":
        spec["out"] = ((M, N), dt)
    return spec


def _moe_gemm(problem: Mapping[str, Any], backend: str) -> InputSpec:
    """moe_gemm.py's `_make_inputs`: x (T, K), the expert weights (E, K, N), the int32 group sizes (E,),
    and for Triton the output (T, N)."""
    from .moe_gemm import check_problem

    p = check_problem(problem)
    T, K, N, E, dt = p["T"], p["K"], p["N"], p["E"], p["dtype"]
    spec: InputSpec = {"x": ((T, K), dt), "w": ((E, K, N), dt), "group_sizes": ((E,), "int32")}
    if backend == "triton":
        spec["out"] = ((T, N), dt)
    return spec


_SPECS: dict[str, Callable[[Mapping[str, Any], str], InputSpec]] = {
    "softmax": lambda p, b: _rowwise("softmax", p, b),
    "rmsnorm": lambda p, b: _rowwise("rmsnorm", p, b),
    "layernorm": lambda p, b: _rowwise("layernorm", p, b),
    "flash_attention": _attention,
    "flash_attention_bwd": _attention_bwd,
    "matmul": _matmul,
    "int8_matmul": _int8_matmul,
    "moe_gemm": _moe_gemm,
}


def input_spec(spec: KernelSpec, problem: Mapping[str, Any], backend: str) -> InputSpec | None:
    """The inputs `spec.make_inputs(problem, backend, seed)` makes, as {name: (shape, dtype name)}, for a
    problem the kernel takes (`validate_problem`'s); None for a spec that does not say (neither a kernel
    of the registry's, as registered, nor one with `extra["input_spec"]`)."""
    from ._registry import REGISTRY

    own = spec.extra.get("input_spec")
    if callable(own):
        return {str(k): (tuple(s), str(d)) for k, (s, d) in own(problem, backend).items()}
    fn = _SPECS.get(spec.name)
    if fn is None or REGISTRY.get(spec.name) is not spec:  # a spec of another kernel under that name
        return None
    return fn(problem, backend)


def _dtype_name(dtype: Any) -> str:
    """ "float16" for torch.float16, a jax array's dtype and numpy's alike."""
    return str(getattr(dtype, "name", None) or dtype).removeprefix("torch.")


def check_inputs(
    spec: KernelSpec, problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any]
) -> None:
    """A call's inputs against what `spec.make_inputs(problem, backend, seed)` makes for the (validated)
    problem (`input_spec`): the same names, each array of the shape and dtype the problem implies. Raises
    ValueError naming the input, the expected and the given shape or dtype (or the missing or unknown
    name); nothing to check for a spec with no `input_spec`."""
    want = input_spec(spec, problem, backend)
    if want is None:
        return
    where = f"kernel {spec.name!r} ({backend}), problem {dict(problem)}"
    missing = [n for n in want if n not in inputs]
    unknown = [str(n) for n in inputs if n not in want]
    if missing or unknown:
        says = f"misses input {missing[0]!r}" if missing else f"has no input {unknown[0]!r}"
        raise ValueError(
            f"{where} {says}: it takes {list(want)} (spec.make_inputs(problem, {backend!r}, seed) makes them)"
        )
    for name, (shape, dtype) in want.items():
        x = inputs[name]
        got_shape, got_dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if got_shape is None or got_dtype is None:
            raise ValueError(f"{where}: input {name!r} is a {type(x).__name__}, not an array")
        if tuple(got_shape) != tuple(shape):
            raise ValueError(
                f"{where}: input {name!r} has shape {tuple(got_shape)}, the problem implies {tuple(shape)}"
            )
        if _dtype_name(got_dtype) != dtype:
            raise ValueError(
                f"{where}: input {name!r} has dtype {_dtype_name(got_dtype)}, the problem implies {dtype}"
            )


def _moe_gemm_values(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> str | None:
    """moe_gemm's `group_sizes`: E non-negative ints summing to T (x's rows, sorted by expert), and the
    problem's own `group_sizes` when it gives them (the key's). The launchers read them on the device
    unchecked: sizes that break this give rows of another expert's product or never-written rows, with no
    error. The complaint, or None."""
    import numpy as np

    from ._common import to_numpy

    sizes = [int(v) for v in np.asarray(to_numpy(inputs["group_sizes"])).reshape(-1)]
    T, E = problem["T"], problem["E"]
    need = f"it must hold E={E} non-negative ints summing to T={T} (the rows of x, sorted by expert)"
    negative = [e for e, n in enumerate(sizes) if n < 0]
    if negative:
        return f"holds {sizes}, negative for expert {negative[0]}: {need}"
    if sum(sizes) != T:
        return f"holds {sizes}, which sum to {sum(sizes)}: {need}"
    own = problem.get("group_sizes")
    if own is not None and list(own) != sizes:
        return f"holds {sizes}, the problem's group_sizes are {list(own)} (the key's)"
    return None


_VALUES: dict[str, tuple[str, Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]]] = {
    "moe_gemm": ("group_sizes", _moe_gemm_values),
}


def check_input_values(
    spec: KernelSpec, problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any]
) -> None:
    """The values of a call's inputs that the kernel needs to be right (after `check_inputs`, on readable
    arrays: it reads them): ValueError naming the input, what it holds and what it must hold. The
    registry's kernels' checks (and a spec's made from one, the same `run`), then a spec's own
    `extra["check_values"]`, a function of (problem, backend, inputs) returning None, or what is wrong
    (a str; or it raises ValueError). Nothing to check for a kernel with neither."""
    where = f"kernel {spec.name!r} ({backend}), problem {dict(problem)}"
    check = _VALUES.get(_registry_kernel(spec, _VALUES) or "")
    if check is not None:
        name, values = check
        bad = values(problem, inputs)
        if bad is not None:
            raise ValueError(f"{where}: input {name!r} {bad}")
    own = spec.extra.get("check_values")
    if own is None:
        return
    if not callable(own):
        raise TypeError(
            f"kernel {spec.name!r}: extra['check_values'] must be a function of (problem, backend, inputs), "
            f"got {type(own).__name__}"
        )
    try:
        said = own(problem, backend, inputs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if said is not None and not isinstance(said, str):
        raise TypeError(
            f"kernel {spec.name!r}: extra['check_values'] returned {type(said).__name__}; it returns None, "
            f"or a str saying what is wrong with the inputs"
        )
    if said:
        raise ValueError(f"{where}: {said}")


def balanced_group_sizes(T: int, E: int) -> list[int]:
    """T rows split among E experts as evenly as they go (the first T % E get one more): what a router
    balanced by its auxiliary loss sends, the stand-in of moe_gemm's group sizes where the problem gives
    none."""
    q, r = divmod(T, E)
    return [q + 1] * r + [q] * (E - r)


def _moe_gemm_stand_ins(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any]
) -> dict[str, Any]:
    """The problem's own group sizes (the key's), else balanced ones: they sum to T, so every row is
    computed and written, as in real traffic (the generic stand-in, zeros, computes none)."""
    import jax.numpy as jnp

    own = problem.get("group_sizes")
    sizes = list(own) if own is not None else balanced_group_sizes(problem["T"], problem["E"])
    return {"group_sizes": jnp.asarray(sizes, dtype=inputs["group_sizes"].dtype)}


def _int8_matmul_stand_ins(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any]
) -> dict[str, Any]:
    """Symmetric int8 weights in [-127, 127], never 0 (as `make_inputs` quantizes them), drawn on the
    device: the generic stand-in (zeros) does the same dense work, but on a GPU an all-zero operand draws
    less power and runs at higher clocks than a real weight does."""
    import jax
    import jax.numpy as jnp

    w = inputs["w"]
    v = jax.random.randint(jax.random.PRNGKey(0), w.shape, -127, 128, dtype=jnp.int32)
    return {"w": jnp.where(v == 0, 1, v).astype(w.dtype)}


_STAND_INS: dict[str, Callable[[Mapping[str, Any], str, Mapping[str, Any]], dict[str, Any]]] = {
    "moe_gemm": _moe_gemm_stand_ins,
    "int8_matmul": _int8_matmul_stand_ins,
}


def stand_in_values(
    spec: KernelSpec, problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any]
) -> dict[str, Any]:
    """{input name: array} for the inputs whose values set the kernel's work, given the generic stand-ins
    of a traced call's inputs (jax arrays of the traced shapes and dtypes) and the validated problem: the
    registry's kernels' by name, a spec's own `extra["stand_ins"]` (a function of (problem, backend,
    inputs)); {} for a kernel whose work does not depend on its inputs' values (or a spec of another
    kernel under a registry name)."""
    own = spec.extra.get("stand_ins")
    if callable(own):
        given = own(problem, backend, inputs)
        if not isinstance(given, Mapping):
            raise TypeError(
                f"kernel {spec.name!r}: its extra['stand_ins'] returned {type(given).__name__}, not a dict "
                f"{{input name: array}}"
            )
        return dict(given)
    fn = _STAND_INS.get(_registry_kernel(spec, _STAND_INS) or "")
    if fn is None:
        return {}
    return fn(problem, backend, inputs)


def _registry_kernel(spec: KernelSpec, among: Mapping[str, Any]) -> str | None:
    """The name, among `among`'s, of the registry's kernel whose launchers `spec` runs: the registry's
    spec itself, or a spec of one's own made from it (`dataclasses.replace(get_kernel("moe_gemm"),
    name=..., extra=...)`, the same `run`), which needs the same values; None for another kernel, a
    spec of another kernel under a registry name included."""
    from ._registry import REGISTRY

    return next((n for n in among if (r := REGISTRY.get(n)) is not None and r.run is spec.run), None)
