"""moe_gemm: MoE grouped GEMM, out[rows of e] = x[rows of e] @ w[e], one launch for all experts.

Tokens are already routed and sorted by expert: x is (T, K), w is (E, K, N), group_sizes (E,) int32 are
ragged (some may be 0) and sum to T. Accumulation in fp32, output in x's dtype.
Problem: {"T", "K", "N", "E", "dtype"} and optionally "group_sizes" (a list of E ints summing to T);
without it the sizes are drawn from the seed (a Dirichlet split of T, so they are uneven and may be 0).

Backends:
- triton (`tuner.kernels._moe_triton.moe_gemm`): BLOCK_M/BLOCK_N/BLOCK_K, num_warps, num_stages; each program
  finds its expert by walking the group sizes; accepts a preallocated `out`.
  Interpreter: bf16 tiles are upcast to fp32 before `tl.dot`.
- pallas (`tuner.kernels._moe_pallas.moe_gemm`): bm/bn/bk. On TPU, scalar-prefetched group metadata picks the
  expert's weight block per visit of a row tile (megablox-style); on NVIDIA (num_warps/num_stages in the
  sm80/sm90 space) the Triton kernel's structure, each program finding its expert in a loop.

Reference: float64 numpy, a loop over experts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tuner.search_spaces import Device, SearchSpace
from tuner.search_spaces.moe_gemm import moe_gemm_space

from ._common import (
    DTYPES,
    HOSTILE_LARGE,
    abs_product,
    default_tolerance,
    fp32_sum_bound,
    hostile_rows,
    jnp_dtype,
    prepare_triton,
    random_array,
    to_numpy,
    torch_device,
    torch_dtype,
)
from ._registry import KernelSpec, register

__all__ = ["SPEC", "moe_gemm_triton", "moe_gemm_pallas", "check_problem", "group_sizes_for"]

DEFAULT_PROBLEM = {"T": 90, "K": 40, "N": 36, "E": 4, "dtype": "float16"}


def check_problem(problem: Mapping[str, Any]) -> dict[str, Any]:
    p = {**DEFAULT_PROBLEM, **problem}
    for f in ("T", "K", "N", "E"):
        if not isinstance(p[f], int) or isinstance(p[f], bool) or p[f] < 1:
            raise ValueError(f"{f}={p[f]!r} must be a positive int")
    if p["dtype"] not in DTYPES:
        raise ValueError(f"dtype={p['dtype']!r} must be one of {list(DTYPES)}")
    gs = p.get("group_sizes")
    if gs is not None:
        gs = [int(g) for g in gs]
        if len(gs) != p["E"] or any(g < 0 for g in gs) or sum(gs) != p["T"]:
            raise ValueError(f"group_sizes={gs} must be {p['E']} non-negative ints summing to T={p['T']}")
        p["group_sizes"] = gs
    return p


def group_sizes_for(problem: Mapping[str, Any], seed: int) -> np.ndarray:
    """The problem's group sizes, or a seeded uneven split of T into E groups."""
    p = check_problem(problem)
    if p.get("group_sizes") is not None:
        return np.asarray(p["group_sizes"], dtype=np.int32)
    rng = np.random.default_rng([seed, 7])
    return rng.multinomial(p["T"], rng.dirichlet(np.full(p["E"], 0.8))).astype(np.int32)


def _space(problem: Mapping[str, Any], device: Device, backend: str) -> SearchSpace:
    return moe_gemm_space(check_problem(problem), device, backend)


def _make_inputs(problem: Mapping[str, Any], backend: str, seed: int) -> dict[str, Any]:
    p = check_problem(problem)
    T, K, N, E = p["T"], p["K"], p["N"], p["E"]
    rng = np.random.default_rng(seed)
    x = hostile_rows(random_array(rng, (T, K)), rng, p["dtype"], HOSTILE_LARGE)
    w = random_array(rng, (E, K, N), 1.0 / math.sqrt(K))
    sizes = group_sizes_for(p, seed)
    if backend == "triton":
        import torch

        dev, dt = torch_device(), torch_dtype(p["dtype"])
        return {
            "x": torch.from_numpy(x).to(device=dev, dtype=dt),
            "w": torch.from_numpy(w).to(device=dev, dtype=dt),
            "group_sizes": torch.from_numpy(sizes).to(dev),
            "out": torch.empty((T, N), dtype=dt, device=dev),
        }
    if backend == "pallas":
        import jax.numpy as jnp

        dt = jnp_dtype(p["dtype"])
        return {
            "x": jnp.asarray(x, dtype=dt),
            "w": jnp.asarray(w, dtype=dt),
            "group_sizes": jnp.asarray(sizes),
        }
    raise ValueError(f"unknown backend {backend!r}")


def _reference(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    x = to_numpy(inputs["x"]).astype(np.float64)
    w = to_numpy(inputs["w"]).astype(np.float64)
    sizes = to_numpy(inputs["group_sizes"]).astype(np.int64)
    out = np.empty((x.shape[0], w.shape[2]), dtype=np.float64)
    start = 0
    for e, n in enumerate(sizes):
        out[start : start + n] = x[start : start + n] @ w[e]
        start += int(n)
    return out


def _error_bound(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    p = check_problem(problem)
    x, w = inputs["x"], inputs["w"]
    parts: list[Any] = []
    start = 0
    abs_sum: Any
    for e, n in enumerate(int(v) for v in to_numpy(inputs["group_sizes"])):
        parts.append(abs_product(x[start : start + n], w[e]))
        start += n
    if hasattr(x, "detach"):
        import torch

        abs_sum = torch.cat(parts)
    elif type(x).__module__.startswith("jax"):
        import jax.numpy as jnp

        abs_sum = jnp.concatenate(parts)
    else:
        abs_sum = np.concatenate(parts)
    return fp32_sum_bound(abs_sum, p["K"])


def moe_gemm_triton(x: Any, w: Any, group_sizes: Any, out: Any = None, **config: Any) -> Any:
    """The Triton launcher (kernels._moe_triton.moe_gemm); config = the space's parameters."""
    prepare_triton()
    from . import _moe_triton

    return _moe_triton.moe_gemm(x, w, group_sizes, out, **config)


def moe_gemm_pallas(x: Any, w: Any, group_sizes: Any, **config: Any) -> Any:
    """The Pallas launcher (kernels._moe_pallas.moe_gemm); config = the space's parameters."""
    from . import _moe_pallas

    return _moe_pallas.moe_gemm(x, w, group_sizes, **config)


def _run(
    problem: Mapping[str, Any], backend: str, inputs: Mapping[str, Any], config: Mapping[str, Any]
) -> Any:
    if backend == "triton":
        return moe_gemm_triton(inputs["x"], inputs["w"], inputs["group_sizes"], inputs.get("out"), **config)
    if backend == "pallas":
        return moe_gemm_pallas(inputs["x"], inputs["w"], inputs["group_sizes"], **config)
    raise ValueError(f"unknown backend {backend!r}")


def _flops(problem: Mapping[str, Any]) -> float:
    p = check_problem(problem)
    return 2.0 * p["T"] * p["N"] * p["K"]


def _bytes(problem: Mapping[str, Any]) -> float:
    """x and out once, every expert's weights once (an upper bound when some experts get no tokens)."""
    p = check_problem(problem)
    e = {"float32": 4, "float16": 2, "bfloat16": 2}[p["dtype"]]
    return float(e * (p["T"] * p["K"] + p["E"] * p["K"] * p["N"] + p["T"] * p["N"]) + 4 * p["E"])


SPEC = register(
    KernelSpec(
        name="moe_gemm",
        description="MoE grouped GEMM: tokens sorted by expert, ragged group sizes, one launch for all experts",
        backends=("triton", "pallas"),
        dtypes=DTYPES,
        default_problem=DEFAULT_PROBLEM,
        shape_fields=("T", "K", "N", "E"),
        space=_space,
        make_inputs=_make_inputs,
        reference=_reference,
        run=_run,
        flops=_flops,
        bytes_moved=_bytes,
        tolerance=default_tolerance,
        check_problem=check_problem,
        error_bound=_error_bound,
        output_buffer="out",
        extra={"optional_fields": {"group_sizes": "list of E ints summing to T"}},
    )
)
