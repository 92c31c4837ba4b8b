"""jax's own GPU Pallas ops (`jax.experimental.pallas.ops.gpu`: decode attention, softmax) tuned through
`tuner.autotune` in interpret mode on the CPU, decorated as a user who did not write them would: the op
itself, or a `functools.partial` of it, with its block sizes as the config. Each result is checked
against the op's reference; the entries must be keyed so that another process finds them."""

from __future__ import annotations

import functools

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("jax.experimental.pallas.ops.gpu.decode_attention")

import numpy as np  # noqa: E402

import tuner  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402


def test_source_hash_of_a_jax_op_does_not_depend_on_its_modules_state(monkeypatch):
    # jax registers its array types into a tuple global of jax._src.dtypes in an order that varies
    # between processes; a hash that described it made a second process miss every entry of a jax op
    # decorated directly (`tuner.autotune(...)(da.mqa)`), at random. Reordering it here is what the
    # next process may see.
    from jax._src import dtypes as jdtypes
    from jax.experimental.pallas.ops.gpu import decode_attention as da
    from jax.experimental.pallas.ops.gpu import softmax

    from tuner.runtime._source import code_hash

    name = "_types_whose_dtype_should_not_be_canonicalized"
    if not isinstance(getattr(jdtypes, name, None), tuple):
        pytest.skip("jax moved the global whose order varies")
    ops = [da.mqa, da.decode_attn_unbatched, functools.partial(softmax.softmax, interpret=True)]
    before = [code_hash(op) for op in ops]
    monkeypatch.setattr(jdtypes, name, tuple(reversed(getattr(jdtypes, name))))
    assert [code_hash(op) for op in ops] == before
    # still one entry per op and per bound argument
    assert len(set(before)) == 3
    assert before[2] != code_hash(functools.partial(softmax.softmax, interpret=False))


def test_a_jax_op_decorated_directly_is_keyed_by_jax_versions_and_matches_its_reference():
    from jax.experimental.pallas.ops.gpu import decode_attention as da
    from jax.experimental.pallas.ops.gpu import softmax

    sm = tuner.autotune(configs=[{"num_warps": 4}, {"num_warps": 8}], key=lambda x, **k: {"N": x.shape[-1]})(
        functools.partial(softmax.softmax, interpret=True)
    )
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (4, 48)))  # numpy in: no jax array in the key
    np.testing.assert_allclose(
        np.asarray(sm(x)), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=1e-6, atol=1e-6
    )
    assert {"jax", "jaxlib"} <= set(sm.tuner.last_choice["key"]["versions"])
    mqa = tuner.autotune(
        configs=[{"block_k": 16, "k_splits": 2}, {"block_k": 32, "k_splits": 1}],
        key=lambda q, k, v, **kw: {"S": k.shape[1], "D": q.shape[-1]},
    )(da.mqa)
    shapes = ((2, 16, 16), (2, 64, 16), (2, 64, 16))
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), s) for i, s in enumerate(shapes))
    out = jax.jit(functools.partial(mqa, interpret=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(da.mqa_reference(q, k, v)), rtol=1e-5, atol=1e-5)
    assert mqa.tuner.stats["tuned"] == 1
    [entry] = [e for e in ConfigCache().entries() if e.key.kernel.endswith("decode_attention.mqa")]
    assert entry.key.fields_dict == {"S": 64, "D": 16}
