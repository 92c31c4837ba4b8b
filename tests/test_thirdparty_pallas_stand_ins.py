"""jax's own Pallas ops whose work is set by integer inputs, tuned through `tuner.autotune(stand_ins=...)`
as a serving stack would call them inside `jax.jit`: the GPU paged attention (`ops.gpu.paged_attention`,
per-sequence `lengths` and a block table; interpret mode on the CPU) and the TPU ragged paged attention
(`ops.tpu.ragged_paged_attention`: sequence count, cumulative query lengths, kv lengths and page indices,
checked by the op's own `dynamic_validate_inputs`). With the generic stand-ins (zeros) every length is
0 and every sequence empty: the tuning would time no attention at all. Tiny shapes, two configs each, and
a bench that runs each config once. New in this branch: they fail on the old code, where `autotune` had
no `stand_ins` parameter."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("jax.experimental.pallas")

import numpy as np  # noqa: E402

import tuner  # noqa: E402
from tuner.runtime._tuning import AllConfigsFailedError  # noqa: E402


def _normal(*shapes):
    rng = np.random.default_rng(0)  # numpy's: jax.random compiles for each shape, seconds on a busy CPU
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def _once(call):
    jax.block_until_ready(call())
    return 1e-3


@pytest.mark.slow
def test_gpu_paged_attention_under_jit_is_timed_on_full_lengths():
    from jax.experimental.pallas.ops.gpu import paged_attention as pa

    B, H, D, PS, PPS = 2, 16, 16, 4, 4  # block_h must divide into 16 heads
    q, kp, vp = _normal((B, H, D), (1, B * PPS, PS, D), (1, B * PPS, PS, D))
    tables = jnp.arange(B * PPS, dtype=jnp.int32).reshape(B, PPS)
    lengths = jnp.array([16, 7], jnp.int32)
    seen: list = []

    def full(q, k_pages, v_pages, block_tables, lengths):  # every page of every sequence in use
        assert isinstance(lengths, jax.ShapeDtypeStruct)
        return {"lengths": jnp.full(lengths.shape, block_tables.shape[1] * k_pages.shape[2], lengths.dtype)}

    @tuner.autotune(
        configs=[{"pages": 1, "splits": 1}, {"pages": 2, "splits": 2}],
        key=lambda q, k_pages, *a: {"B": q.shape[0], "H": q.shape[1], "S": k_pages.shape[1]},
        bench=_once,
        stand_ins=full,
    )
    def attn(q, k_pages, v_pages, block_tables, lengths, *, pages, splits):
        if not isinstance(lengths, jax.core.Tracer):
            seen.append(lengths.tolist())
        return pa.paged_attention(
            q, k_pages, v_pages, block_tables, lengths,
            block_h=16, pages_per_compute_block=pages, k_splits=splits, interpret=True,
        )  # fmt: skip

    # the cache and the queries are the step's constants here, the lengths and the block table traced
    step = jax.jit(lambda tables, lengths: attn(q, kp, vp, tables, lengths))
    out = step(tables, lengths)
    assert seen == [[16, 16], [16, 16]]  # each config timed once, on full sequences, never on zeros
    k = kp[:, tables].reshape(1, B, PPS * PS, D).transpose(1, 2, 0, 3)
    v = vp[:, tables].reshape(1, B, PPS * PS, D).transpose(1, 2, 0, 3)
    ref = pa.paged_attention_reference(q, k, v, lengths)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-4)
    assert attn.tuner.stats["tuned"] == 1
    [entry] = tuner.ConfigCache().entries()
    assert entry.key.fields_dict == {"B": 2, "H": 16, "S": 8}


# ---- ragged paged attention (TPU) -------------------------------------------------------------------
T, HQ, D, PS, PPS, SEQS = 8, 2, 128, 8, 2, 2  # 8 query tokens, 2 sequences of up to 2 pages of 8


def _ragged_inputs():
    q, kv = _normal((T, HQ, D), (SEQS * PPS, PS, 2, D))  # one kv head: k and v combined
    return (
        q,
        kv,
        jnp.array([5, 9], jnp.int32),  # kv lengths: a prefill and a decode
        jnp.arange(SEQS * PPS, dtype=jnp.int32).reshape(SEQS, PPS),
        jnp.array([0, 3, 4], jnp.int32),  # cumulative query lengths: 3 and 1 tokens
        jnp.array([SEQS], jnp.int32),
    )


def _ragged(stand_ins, seen):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    @tuner.autotune(
        configs=[{"kv_pages_per_block": 1}, {"kv_pages_per_block": 2}],
        key=lambda q, kv_pages, *a: {"T": q.shape[0], "pages": kv_pages.shape[0]},
        bench=_once,
        storage=False,
        stand_ins=stand_ins,
    )
    def attn(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, kv_pages_per_block):
        if not isinstance(num_seqs, jax.core.Tracer):  # the op's own check of the values it is given
            seen.append([int(num_seqs[0]), kv_lens.tolist(), cu_q_lens.tolist()])
            rpa.dynamic_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
        return rpa.ragged_paged_attention(
            q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
            num_kv_pages_per_block=kv_pages_per_block, num_queries_per_block=8,
        )  # fmt: skip

    return attn


def _decode_batch(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    """Every sequence one decode token over full pages: a valid layout of these shapes."""
    seqs, pages = page_indices.shape
    return {
        "kv_lens": jnp.full(kv_lens.shape, pages * kv_pages.shape[1], jnp.int32),
        "cu_q_lens": jnp.arange(cu_q_lens.shape[0], dtype=jnp.int32),
        "num_seqs": jnp.array([seqs], jnp.int32),
        "page_indices": jnp.arange(seqs * pages, dtype=jnp.int32).reshape(seqs, pages),
    }


def test_ragged_paged_attention_checks_the_users_stand_ins_with_its_own_validation():
    # Query lengths of 4 over kv lengths of 1: the op's dynamic_validate_inputs refuses them on the
    # concrete stand-ins, so every config fails with its message, not a timing of garbage.
    def bad(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        return {
            "kv_lens": jnp.ones(kv_lens.shape, jnp.int32),
            "cu_q_lens": jnp.array([0, 4, 8], jnp.int32),
            "num_seqs": jnp.array([2], jnp.int32),
        }

    seen: list = []
    attn = _ragged(bad, seen)
    q, kv, *ints = _ragged_inputs()
    with pytest.raises(AllConfigsFailedError, match="q_len=.* must be less or equal to kv_len="):
        jax.jit(lambda *ints: attn(q, kv, *ints))(*ints)  # the integer inputs traced
    assert seen and all(s == [2, [1, 1], [0, 4, 8]] for s in seen)


def test_ragged_paged_attention_under_jit_is_timed_on_a_decode_batch():
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    inputs = _ragged_inputs()
    with pltpu.force_tpu_interpret_mode():
        try:
            rpa.ragged_paged_attention(*inputs, num_kv_pages_per_block=1, num_queries_per_block=8)
        except Exception as exc:  # noqa: BLE001 - jax's TPU interpreter, not tuner
            if "'ReshapeTransform' object has no attribute 'indices'" in str(exc):
                pytest.skip(
                    "jax's TPU interpret mode cannot run ragged_paged_attention (jax 0.10.2: its kv page "
                    "reshape, a ReshapeTransform on a ref, has no 'indices' in interpret_pallas_call)"
                )
            raise
        seen: list = []
        attn = _ragged(_decode_batch, seen)
        out = jax.jit(attn)(*inputs)
    assert seen and all(s == [2, [16, 16], [0, 1, 2]] for s in seen)
    ref = rpa.ref_ragged_paged_attention(*inputs)
    np.testing.assert_allclose(np.asarray(out[:4]), np.asarray(ref), rtol=1e-4, atol=1e-4)
    assert attn.tuner.stats["tuned"] == 1
