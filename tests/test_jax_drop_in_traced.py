"""The drop-in for `triton.autotune` on a jax launcher (`tuner.autotune(configs=...)` with tuple values or
triton.autotune's keywords, `_triton_compat`) inside a jax trace behaves as `tuner.autotune`'s traced miss,
by the same code (`Autotuned.miss_if_traced`): a launcher of static arguments only, called inside
`jax.jit` (no tracer among its arguments), is resolved in the helper thread once, its hooks run as in an
eager tuning; a key value that jit traces is refused with a TypeError saying to make it static. Both
tests fail on the old code: the first ran each pre-hook twice per timed config (the traced miss nested in
the drop-in's own), the second keyed the entry on the stand-in's zero without a word."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import numpy as np  # noqa: E402

import tuner  # noqa: E402

TUPLES = [{"tile": (2, 2)}, {"tile": (4, 4)}]


def _bench(times):
    def bench(call):
        out = call()
        assert not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out))
        jax.block_until_ready(out)
        times.append(1)
        return 1e-3 * len(times)  # the first config timed wins

    return bench


def test_a_launcher_of_static_arguments_under_jit_is_tuned_once_with_its_hooks_once():
    timed: list = []
    hooks: list = []

    @tuner.autotune(
        configs=TUPLES,
        key=["n"],
        bench=_bench(timed),
        storage=False,
        pre_hook=lambda nargs, reset_only=False: hooks.append(("pre", reset_only)),
        post_hook=lambda nargs, exception=None: hooks.append(("post", exception)),
    )
    def make(n, tile):
        return jnp.ones((n,)) * tile[0]  # makes its array itself: no tracer among its arguments

    out = jax.jit(lambda: make(8))()
    np.testing.assert_allclose(np.asarray(out), np.full(8, 2.0))
    # as Triton's tuning of two configs: a pre- and a post-hook per timed run, then the reset
    assert timed == [1, 1]
    assert hooks == [("pre", False), ("post", None), ("pre", False), ("post", None), ("pre", True)]
    assert make.tuner.stats["tuned"] == 1
    assert list(make.cache) == [(8,)] and make.cache[(8,)] == {"tile": (2, 2)}
    hooks.clear()
    jax.jit(lambda: make(8) + 1)()  # another trace of the key: a hit, nothing timed or hooked
    assert timed == [1, 1] and hooks == []


@pytest.mark.parametrize(
    "drop_in",
    [
        {"configs": TUPLES},
        {"configs": [{"b": 1}, {"b": 2}], "pre_hook": lambda nargs, reset_only=False: None},
    ],
    ids=["tuple_values", "triton_keywords"],
)
@pytest.mark.parametrize("n", [3, np.int32(3)], ids=["python_int", "int32"])
def test_a_traced_key_value_is_refused_as_tuner_autotune_refuses_it(drop_in, n):
    timed: list = []

    @tuner.autotune(key=["n"], bench=_bench(timed), storage=False, **drop_in)
    def scale(x, n, **config):
        return x * n

    with pytest.raises(TypeError, match=r"key field\(s\) n are traced by jax.*static_argnums"):
        jax.jit(scale)(jnp.ones(4), n)
    assert timed == [] and scale.tuner.stats["tuned"] == 0  # nothing tuned for a made-up n
    out = jax.jit(scale, static_argnums=1)(jnp.ones(4), 3)  # static: keyed on its value
    np.testing.assert_allclose(np.asarray(out), np.full(4, 3.0))
    assert list(scale.cache) == [(3, "float32")]  # Triton's key: n, then the dtype of x
