"""`jax_bench`, the default timer of a jax launcher: the launcher is compiled (its first call, waited for)
before the warm-up that sizes the timed batches and before the timed repeats, so neither the batch size
nor the reported times include tracing or compiling; every call waits for all the leaves of its output."""

from __future__ import annotations

import time

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from tuner.runtime import jax_bench  # noqa: E402


def test_the_launcher_is_compiled_before_the_clock_is_first_read():
    reads: list[float] = []

    def clock() -> float:
        reads.append(time.perf_counter())
        return reads[-1]

    traced_at: list[int] = []

    @jax.jit
    def f(x):
        traced_at.append(len(reads))  # runs while jax traces f, i.e. only on the compiling call
        return x * 2.0

    x = jnp.ones(8)
    med, spread = jax_bench(lambda: f(x), clock=clock, repeats=3)
    assert traced_at == [0], "f was traced (compiled) inside the clocked region"
    assert len(reads) > 2 and med > 0 and spread >= 0


def test_batch_size_comes_from_the_run_time_not_the_compile_time():
    # a fake clock: tracing (compiling) f costs 2 s once, each call costs 10 us
    now = [0.0]
    calls = [0]

    @jax.jit
    def f(x):
        now[0] += 2.0
        return x + 1.0

    x = jnp.ones(4)

    def call():
        calls[0] += 1
        now[0] += 1e-5
        return f(x)

    med, spread = jax_bench(call, clock=lambda: now[0], warmup=1, repeats=5)
    assert med == pytest.approx(1e-5)
    assert spread == pytest.approx(0.0, abs=1e-12)
    # each of the 5 samples is a batch lasting >= 1 ms (min_sample_s): 100 calls each; sized on 2 s of
    # compiling it would be one call per sample (6 calls in all)
    assert calls[0] >= 5 * 100, calls[0]


class _Leaf:
    """A pytree leaf that is not a jax array but can be waited for (as a future of another library)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def block_until_ready(self) -> _Leaf:
        self.log.append(self.name)
        return self


def test_every_call_waits_for_every_leaf_of_its_output():
    log: list[str] = []
    calls = [0]

    def call():
        calls[0] += 1
        return {"a": _Leaf(log, "a"), "b": [jnp.ones(3), (_Leaf(log, "c"), None)]}

    jax_bench(call, warmup=1, repeats=3, min_sample_s=0.0)
    assert log == ["a", "c"] * calls[0]


@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")  # Triton's, kept
def test_triton_warmup_and_rep_on_a_jax_launcher_compile_first_and_block():
    """The drop-in's `warmup=`/`rep=` (milliseconds of warm-up and of timed runs, as in triton.autotune)
    on a jax launcher: the counts come from a run's time, not from the compiling call's, and each run
    waits for its whole output."""
    import functools

    import tuner

    blocked = [0]
    calls: dict[int, int] = {}

    class Leaf:
        def block_until_ready(self):
            blocked[0] += 1
            return self

    @functools.partial(jax.jit, static_argnames=["b"])
    def body(x, b):
        time.sleep(0.3)  # a slow compile: tracing runs this once per config
        return x * b

    @tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=lambda x: {"n": x.shape[0]}, warmup=5, rep=20)
    def scale(x, *, b):
        calls[b] = calls.get(b, 0) + 1
        return body(x, b), Leaf()

    out, _ = scale(jnp.ones(8))
    assert float(out[0]) in (1.0, 2.0)
    assert scale.tuner.stats["tuned"] == 1
    # sized on the 0.3 s compile it would be 1 warm-up and 1 timed run (3 calls with the estimate)
    assert all(n > 5 for n in calls.values()), calls
    assert blocked[0] >= sum(calls.values()) - 1  # every call but the caller's own was waited for
