"""What code reads and changes on a decorated Triton kernel after decoration, against `triton.autotune`
too (under the interpreter), so a divergence shows: `.cache_results` as Triton reads it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from tests.test_triton_conformance import IMPLS, autotune_of, configs_of  # noqa: E402

F32 = "torch.float32"


def copy_nk(autotune, **kw):
    @autotune(**kw)
    @triton.jit
    def _copy_nk(dst, src, N, K, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < N), mask=offs < N)

    return _copy_nk


def grid(meta):
    return (triton.cdiv(128, meta["BLOCK_SIZE"]),)


def tensors():
    return torch.empty(128), torch.randn(128)


# ---- .cache_results --------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [None, False, True])
@pytest.mark.parametrize("interpret", [True, False])
@pytest.mark.parametrize("env_cache", [False, True])
def test_cache_results_reads_what_tritons_autotuner_reads(given, interpret, env_cache, monkeypatch):
    """Triton sets `(cache_results or TRITON_CACHE_AUTOTUNING) and not TRITON_INTERPRET` at decoration; the
    drop-in reads the same whatever its store does with the winners."""
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "interpret", interpret)
    monkeypatch.setattr(knobs.autotuning, "cache", env_cache)
    kw = {} if given is None else {"cache_results": given}
    read = {
        impl: copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], **kw).cache_results
        for impl in IMPLS
    }
    assert read["tuner"] is bool(read["triton"])
    assert read["tuner"] is ((bool(given) or env_cache) and not interpret)
