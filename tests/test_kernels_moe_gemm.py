"""MoE grouped GEMM (Triton + Pallas) against its float64 reference, ragged and empty groups."""

from __future__ import annotations

import numpy as np
import pytest

from tests._gemm_sweep import sweep


@pytest.mark.parametrize("backend", ["triton", "pallas"])
@pytest.mark.parametrize(
    ("dtype", "group_sizes", "seed"),
    [
        ("float16", None, 0),  # seeded Dirichlet split (uneven)
        ("bfloat16", [0, 29, 1, 30], 1),  # an empty expert and a one-row expert
        ("float32", [0, 0, 60, 0], 2),  # all tokens on one expert
    ],
)
def test_moe_gemm_space_sweep(backend: str, dtype: str, group_sizes: list[int] | None, seed: int) -> None:
    problem = {"T": 60, "K": 24, "N": 20, "E": 4, "dtype": dtype}
    if group_sizes is not None:
        problem["group_sizes"] = group_sizes
    sweep("moe_gemm", backend, problem, 3, seed)


@pytest.mark.parametrize(("dtype", "group_sizes"), [("float16", [0, 29, 1, 30]), ("bfloat16", None)])
def test_moe_gemm_pallas_triton_lowering_sweep(dtype: str, group_sizes: list[int] | None) -> None:
    """The NVIDIA structure of the Pallas kernel (num_warps/num_stages in the space), interpreted."""
    problem = {"T": 60, "K": 24, "N": 20, "E": 4, "dtype": dtype}
    if group_sizes is not None:
        problem["group_sizes"] = group_sizes
    sweep("moe_gemm", "pallas", problem, 3, 6, "sm90")


def test_group_sizes_are_seeded_and_sum_to_T() -> None:
    from tuner.kernels.moe_gemm import group_sizes_for

    p = {"T": 90, "K": 40, "N": 36, "E": 6, "dtype": "float16"}
    a, b, c = group_sizes_for(p, 0), group_sizes_for(p, 0), group_sizes_for(p, 1)
    assert a.sum() == 90 and len(a) == 6 and (a == b).all() and not (a == c).all()


def test_pallas_group_metadata_visits_each_tile_of_each_group() -> None:
    import jax.numpy as jnp
    from tuner.kernels._moe_pallas import group_metadata

    g, tile, valid, starts, ends = group_metadata(jnp.asarray([5, 0, 20, 7], jnp.int32), 32, 8)
    g, tile, valid = np.asarray(g), np.asarray(tile), np.asarray(valid)
    real = [(int(a), int(b)) for a, b, v in zip(g, tile, valid, strict=True) if v]
    # rows 0-4 -> expert 0 (tile 0); rows 5-24 -> expert 2 (tiles 0..3); rows 25-31 -> expert 3 (tile 3)
    assert real == [(0, 0), (2, 0), (2, 1), (2, 2), (2, 3), (3, 3)]
    assert len(g) == 4 + 4 - 1


def test_bad_group_sizes_rejected() -> None:
    from tuner.kernels import get_kernel
    from tuner.search_spaces import get_device

    spec = get_kernel("moe_gemm")
    with pytest.raises(ValueError, match="summing to T=90"):
        spec.space({"group_sizes": [1, 2, 3, 4]}, get_device("cpu"), "triton")


@pytest.mark.parametrize("sizes", [[6, 8], [-3, 13], [10, 0]])
def test_triton_group_sizes_off_the_contract_stay_inside_the_buffers(sizes: list[int]) -> None:
    """group_sizes must sum to T (unchecked: a host sync). Sizes that sum past T or go negative made the
    kernel write rows before and after `out` (heap corruption under the interpreter, 'munmap_chunk():
    invalid pointer'; an illegal address on a GPU). Now the rows are clamped to [0, T): guard rows around
    `out` stay NaN. A strided group_sizes view is read right."""
    import torch
    from tuner.kernels.moe_gemm import moe_gemm_triton

    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 7, generator=gen)
    w = torch.randn(2, 7, 5, generator=gen)
    big = torch.full((40, 5), float("nan"))
    out = big[16:26]
    gs = torch.tensor([v for s in sizes for v in (s, 99)], dtype=torch.int32)[::2]
    moe_gemm_triton(x, w, gs, out, **cfg)
    assert torch.isnan(big[:16]).all() and torch.isnan(big[26:]).all()
    if sizes == [10, 0]:  # on the contract: the strided sizes are read as (10, 0)
        np.testing.assert_allclose(out.numpy(), (x.double() @ w[0].double()).numpy(), rtol=1e-4, atol=1e-4)
