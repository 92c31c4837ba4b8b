"""A decorated function called with tracers (inside jax.jit) is tuned in a helper thread, on concrete
stand-ins (tuner/runtime/_jax.py). The caller's thread-local settings go with it: jax's config context
managers (`jax.enable_x64`, `jax.default_matmul_precision`, `jax.default_device`,
`jax.numpy_rank_promotion`, ...) and the caller's contextvars, so the launcher, the stand-ins, the key
and the timer see what an eager call in the caller's thread would see. State that jax sets while it
traces (shard_map's mesh, `ensure_compile_time_eval`) is not carried: the helper runs eagerly."""

from __future__ import annotations

import contextvars
import logging
import threading
import warnings

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import numpy as np  # noqa: E402

import tuner  # noqa: E402
from tuner.runtime import ConfigCache  # noqa: E402
from tuner.runtime import _jax as rjax  # noqa: E402


def _in_helper() -> bool:
    return threading.current_thread().name.startswith("tuner-concrete-")


def _once(call):
    """A bench that runs a config once."""
    jax.block_until_ready(call())
    return 1e-3


def _tuned(in_helper, bench=_once, body=lambda x, b: x * b):
    """A decorated launcher `body(x, b)` over two configs that calls `in_helper(x)` whenever it runs in
    the helper thread."""

    @tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=lambda x: {"n": x.shape[0]}, bench=bench)
    def scale(x, *, b):
        if _in_helper():
            in_helper(x)
        return body(x, b)

    return scale


def _cpu0():
    return jax.devices("cpu")[0]


SETTINGS = {
    "enable_x64": (lambda: jax.enable_x64(True), lambda: jax.config.jax_enable_x64, lambda: True),
    "default_matmul_precision": (
        lambda: jax.default_matmul_precision("highest"),
        lambda: jax.config.jax_default_matmul_precision,
        lambda: "highest",
    ),
    "numpy_rank_promotion": (
        lambda: jax.numpy_rank_promotion("raise"),
        lambda: jax.config.jax_numpy_rank_promotion,
        lambda: "raise",
    ),
    "numpy_dtype_promotion": (
        lambda: jax.numpy_dtype_promotion("strict"),
        lambda: jax.config.jax_numpy_dtype_promotion,
        lambda: "strict",
    ),
    "default_device": (lambda: jax.default_device(_cpu0()), lambda: jax.config.jax_default_device, _cpu0),
    "debug_infs": (lambda: jax.debug_infs(True), lambda: jax.config.jax_debug_infs, lambda: True),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_jax_context_setting_reaches_the_helper_thread(name):
    enter, read, expected = SETTINGS[name]
    seen: list = []
    scale = _tuned(lambda x: seen.append(read()))
    before = read()
    with enter():
        out = jax.jit(lambda x: scale(x) + 1.0)(jnp.ones(8))
    assert seen and all(v == expected() for v in seen), (name, seen)
    np.testing.assert_allclose(np.asarray(out), 2.0)
    assert scale.tuner.stats["tuned"] == 1
    assert read() == before  # nothing leaked into the caller's thread or made global


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_public_fallback_carries_the_setting(name, monkeypatch):
    """Where jax's private thread-local state cannot be read, the public context managers are
    re-entered with the caller's values."""

    def unavailable():
        raise AttributeError("no config_states in this jax")

    monkeypatch.setattr(rjax, "_private_jax_settings", unavailable)
    enter, read, expected = SETTINGS[name]
    seen: list = []
    scale = _tuned(lambda x: seen.append(read()))
    with enter():
        jax.jit(lambda x: scale(x) * 2.0)(jnp.ones(8))
    assert seen and all(v == expected() for v in seen), (name, seen)


def test_x64_stand_ins_and_key_keep_the_traced_dtype():
    """Under `jax.enable_x64`, a float64 tracer gets a float64 stand-in, and the entry is stored under
    float64 (without x64 in the helper, jax makes a float32 stand-in: another key, another kernel)."""
    dtypes: list = []
    scale = _tuned(lambda x: dtypes.append(x.dtype))
    with jax.enable_x64(True):
        x = jnp.ones(8, dtype=jnp.float64)
        out = jax.jit(lambda x: scale(x) + 1.0)(x)
        assert out.dtype == jnp.float64
    [entry] = ConfigCache().entries()
    assert "float64" in entry.key.dtypes, entry.key.dtypes
    assert dtypes == [np.dtype("float64")] * 2, dtypes


def test_rank_promotion_raise_applies_to_the_launcher_in_the_helper():
    """`numpy_rank_promotion("raise")` makes an implicit rank promotion in the launcher fail while it is
    tuned, as it would in the caller's thread; every config failing is reported with its first error."""
    add_row = _tuned(lambda x: None, body=lambda x, b: x + jnp.ones((1,)) * b)  # (8, 4) + (1,): promoted
    x = jnp.ones((8, 4))
    with (
        jax.numpy_rank_promotion("raise"),
        warnings.catch_warnings(),
        pytest.raises(Exception, match="rank_promotion"),
    ):
        warnings.simplefilter("error", tuner.AllTrialsFailedWarning)  # the error says it, not a warning too
        jax.jit(add_row)(x)
    # the tuning failed (in the helper), rather than storing a winner the caller's call cannot run
    assert ConfigCache().entries() == []


_user_setting: contextvars.ContextVar[str] = contextvars.ContextVar("user_setting", default="unset")


def test_contextvars_reach_the_launcher_and_the_bench():
    seen: list = []
    benched: list = []

    def bench(call):
        benched.append(_user_setting.get())
        return _once(call)

    scale = _tuned(lambda x: seen.append(_user_setting.get()), bench=bench)
    token = _user_setting.set("caller")
    try:
        jax.jit(lambda x: scale(x) + 1.0)(jnp.ones(8))
    finally:
        _user_setting.reset(token)
    assert seen == ["caller", "caller"] and benched == ["caller", "caller"]
    # a variable the helper sets stays in the helper
    assert _user_setting.get() == "unset"


def test_helper_sets_nothing_back_into_the_caller():
    """A launcher that sets a contextvar or enters a jax setting while it is tuned leaves the caller's
    thread as it was."""

    def meddle(x):
        _user_setting.set("helper")
        jax.default_matmul_precision("bfloat16").__enter__()  # never exited: the helper's own

    scale = _tuned(meddle)
    prec = jax.config.jax_default_matmul_precision
    jax.jit(lambda x: scale(x) + 1.0)(jnp.ones(8))
    assert _user_setting.get() == "unset"
    assert jax.config.jax_default_matmul_precision == prec


def test_trace_state_is_not_carried():
    """What jax sets while it traces is left behind: under `ensure_compile_time_eval` and inside
    `shard_map` the helper still runs an eager call outside any mesh."""
    from jax.sharding import PartitionSpec as P

    meshes: list = []
    scale = _tuned(lambda x: meshes.append(jax.sharding.get_abstract_mesh()))
    mesh = jax.make_mesh((1,), ("x",))
    sharded = jax.shard_map(lambda x: scale(x) + 1.0, mesh=mesh, in_specs=P(), out_specs=P())
    with jax.ensure_compile_time_eval():
        out = jax.jit(sharded)(jnp.ones(8))
    np.testing.assert_allclose(np.asarray(out), 2.0)
    assert meshes and all(m.empty for m in meshes), meshes
    assert rjax._private_jax_settings() == []  # nothing set in this thread now
    with jax.ensure_compile_time_eval():
        names = {opt.name for opt, _, _ in rjax._private_jax_settings()}
    assert "eager_constant_folding" not in names


def test_pallas_tpu_interpret_mode_reaches_the_helper_thread():
    """`pltpu.force_tpu_interpret_mode()` (a thread-local context, not a jax_* option) is carried: the
    kernels tuned in the helper run interpreted, as the caller asked."""
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    from jax._src import config as jc  # the context's value has no public reader

    mode = jc.pallas_tpu_interpret_mode_context_manager
    seen: list = []
    scale = _tuned(lambda x: seen.append(mode.value))
    with pltpu.force_tpu_interpret_mode():
        jax.jit(lambda x: scale(x) + 1.0)(jnp.ones(8))
    assert len(seen) == 2 and all(v is not None for v in seen), seen
    assert mode.value is None


def test_user_context_reaches_the_helper_thread():
    """A context made by `jax.make_user_context` (part of jax's jit key) that the caller entered is
    entered in the helper too: the launcher and the key see the caller's value, so the stored entry is
    the one an eager call in the caller's thread would store."""
    flavour = jax.make_user_context("plain")
    seen: list = []

    @tuner.autotune(
        configs=[{"b": 1}, {"b": 2}],
        key=lambda x: {"n": x.shape[0], "flavour": flavour.value},
        bench=_once,
    )
    def scale(x, *, b):
        if _in_helper():
            seen.append(flavour.value)
        return x * b * (10.0 if flavour.value == "spicy" else 1.0)

    with flavour("spicy"):
        out = jax.jit(lambda x: scale(x))(jnp.ones(8))
    assert seen == ["spicy", "spicy"], seen
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict["flavour"] == "spicy", entry.key.fields_dict
    assert float(out[0]) in (10.0, 20.0)
    assert flavour.value == "plain"  # nothing leaked into the caller's thread or made global

    # a context made after the first traced miss is found too
    later = jax.make_user_context(0)
    seen_later: list = []
    scale2 = _tuned(lambda x: seen_later.append(later.value))
    with later(7):
        jax.jit(lambda x: scale2(x) + 1.0)(jnp.ones(4))
    assert seen_later == [7, 7], seen_later


def test_user_contexts_not_listable_are_not_carried(monkeypatch):
    """Where jax's internals cannot list the user contexts, the helper runs without them (and still
    carries the jax options)."""

    def unavailable():
        raise AttributeError("no trace_context_names in this jax")

    monkeypatch.setattr(rjax, "_live_user_contexts", unavailable)
    flavour = jax.make_user_context("plain")
    seen: list = []
    scale = _tuned(lambda x: seen.append((flavour.value, jax.config.jax_enable_x64)))
    with flavour("spicy"), jax.enable_x64(True):
        jax.jit(lambda x: scale(x) + 1.0)(jnp.ones(8))
    assert seen == [("plain", True), ("plain", True)], seen


@pytest.mark.parametrize("scope", ["context", "global"])
def test_a_transfer_guard_does_not_stop_the_tuning_of_a_traced_call(scope):
    """`jax.transfer_guard("disallow")` around a jitted step that itself moves no data: the tuning of a
    traced miss makes its stand-ins and runs the launcher eagerly in the helper thread (transfers of
    tuner's, not of the traced program), so it runs with transfers allowed; the caller's guard stays
    as it was, in its thread and globally."""
    scale = _tuned(lambda x: None, body=lambda x, b: x * 0.5 * b)  # a Python scalar, as jit makes of 0.5
    x = jnp.ones(8)
    step = jax.jit(lambda x: scale(x) + 1.0)
    if scope == "context":
        with jax.transfer_guard("disallow"):
            out = step(x)
            assert jax.config.jax_transfer_guard == "disallow"
    else:
        before = jax.config.jax_transfer_guard
        jax.config.update("jax_transfer_guard", "disallow")
        try:
            out = step(x)
            assert jax.config.jax_transfer_guard == "disallow"
        finally:
            jax.config.update("jax_transfer_guard", before)
    assert scale.tuner.stats["tuned"] == 1
    np.testing.assert_allclose(np.asarray(out), 1.5 if scale.tuner.last_choice["config"]["b"] == 1 else 2.0)


def _three_configs(bench, storage):
    @tuner.autotune(
        configs=[{"b": 1}, {"b": 2}, {"b": 3}], key=lambda x: {"n": x.shape[0]}, bench=bench, storage=storage
    )
    def scale(x, *, b):
        return x * b

    return scale


def _interrupt_once(started):
    """Ctrl-C (SIGINT to this process, raised in the main thread) once `started` is set."""
    import os
    import signal

    def interrupt():
        if started.wait(30):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()


def test_ctrl_c_while_a_traced_call_tunes_stops_the_tuning():
    """Ctrl-C while a call inside jax.jit tunes stops that tuning, as it stops an eager call's: the
    helper thread used to go on tuning in the background after the caller got its KeyboardInterrupt
    (holding the key's claim, so the next call waited for it, and storing a winner after the
    interrupt). Now the helper ends with the caller, nothing is stored, and the next call tunes again."""
    import time

    started = threading.Event()
    benched: list[int] = []
    slow = [True]

    def slow_bench(call):
        jax.block_until_ready(call())
        benched.append(1)
        started.set()
        for _ in range(300 if slow[0] else 0):  # up to 3 s: the KeyboardInterrupt lands between sleeps
            time.sleep(0.01)
        return 1e-3

    scale = _three_configs(slow_bench, storage=False)
    _interrupt_once(started)
    with pytest.raises(KeyboardInterrupt):
        jax.jit(scale)(jnp.ones(8))
    helpers = [t for t in threading.enumerate() if t.name.startswith("tuner-concrete-")]
    assert helpers == [] and benched == [1], (helpers, benched)
    assert scale.tuner.stats["tuned"] == 0
    # the next call tunes the key from the start (no claim or half tuning left behind)
    slow[0] = False
    benched.clear()
    out = jax.jit(scale)(jnp.ones(8))
    assert benched == [1, 1, 1] and scale.tuner.stats["tuned"] == 1
    np.testing.assert_allclose(np.asarray(out), scale.tuner.last_choice["config"]["b"])


def test_ctrl_c_lost_in_a_del_of_the_helper_still_stops_the_tuning(tmp_path, caplog):
    """The KeyboardInterrupt that Ctrl-C of a traced call raises in the helper thread is lost where it
    lands in Python code called from C (here a `__del__`; in real programs, jax's garbage-collection
    callback): Python reports it as unraisable and the code goes on. The helper used to go on tuning
    every config and store the winner after its caller was interrupted, the caller waiting for all of
    it. Now the tuning stops before its next config: nothing is timed after, stored or left claimed.
    And the loss, handled, is no longer reported to the program's unraisable hook (which printed
    "Exception ignored in: <function _xla_gc_callback ...> KeyboardInterrupt" after a Ctrl-C): a debug
    line says it instead."""
    import sqlite3
    import sys
    import time

    db = tmp_path / "store.db"
    started = threading.Event()
    benched: list[int] = []
    lost: list[type] = []

    class Slow:
        def __del__(self):  # run from C when the object is freed: what it raises is unraisable
            started.set()
            for _ in range(1000):  # up to 10 s: the KeyboardInterrupt lands between sleeps
                time.sleep(0.01)

    def bench(call):
        jax.block_until_ready(call())
        benched.append(1)
        if not started.is_set():
            Slow()  # freed at once: its __del__ runs here, in the helper thread
        return 1e-3

    scale = _three_configs(bench, storage=f"sqlite:///{db}")
    _interrupt_once(started)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: lost.append(u.exc_type)
    try:
        with caplog.at_level(logging.DEBUG, logger="tuner.runtime._jax"), pytest.raises(KeyboardInterrupt):
            jax.jit(scale)(jnp.ones(8))
    finally:
        sys.unraisablehook = hook
    assert lost == []  # before: [KeyboardInterrupt], reported to the program's hook (printed by default)
    assert any("was lost in" in r.getMessage() and "Slow" in r.getMessage() for r in caplog.records)
    helpers = [t for t in threading.enumerate() if t.name.startswith("tuner-concrete-")]
    assert helpers == [] and benched == [1], (helpers, benched)
    assert scale.tuner.stats["tuned"] == 0
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*) FROM tuner_cache_entries").fetchone()[0] == 0
        assert c.execute("SELECT COUNT(*) FROM tuner_cache_claims").fetchone()[0] == 0
    benched.clear()
    out = jax.jit(scale)(jnp.ones(8))  # the next call tunes the key from the start
    assert benched == [1, 1, 1] and scale.tuner.stats["tuned"] == 1
    np.testing.assert_allclose(np.asarray(out), scale.tuner.last_choice["config"]["b"])


# ---- a helper that waits for another thread's tuning of its key stops with its caller ----------------
def _held_key():
    """A launcher whose first (eager) call, in a thread of its own, tunes the key and holds its miss-path
    lock until `release` is set (bounded, so that a failing test ends): another call of the key waits."""
    started, release = threading.Event(), threading.Event()

    def bench(call):
        jax.block_until_ready(call())
        started.set()
        release.wait(60)
        return 1e-3

    scale = _three_configs(bench, storage=False)
    scale.tuner.lease_s = 600.0  # the wait below never reaches it
    holder = threading.Thread(target=lambda: scale(jnp.ones(8)), daemon=True)
    holder.start()
    assert started.wait(30)
    return scale, release, holder


def test_a_helper_waiting_for_another_threads_tuning_of_its_key_checks_the_stop_flag():
    """The stop flag of a traced miss's helper (`_jax.raise_if_stopped`, set when its caller is
    interrupted) was not checked while the helper waited for another thread's tuning of the same key
    (`Autotuned._wait_for`, blocked in the lock's acquire until that tuning ended or `lease_s` ran out).
    Here the flag is set from the test, as `_jax._stop_helper` sets it: the wait ends at once with a
    KeyboardInterrupt, the other thread still tuning."""
    scale, release, holder = _held_key()
    stop = threading.Event()
    stop.set()
    box: dict = {}

    def waiter():
        rjax._STOP.set(stop)  # what `resolve_on_concrete` sets in its helper thread (this thread's context)
        try:
            scale(jnp.ones(8))
        except BaseException as exc:  # noqa: BLE001 - what the wait raised
            box["exc"] = exc

    w = threading.Thread(target=waiter, daemon=True)
    w.start()
    w.join(20)  # a generous bound: the old code waited for the other thread's tuning (held below)
    ended_while_held = not w.is_alive()
    release.set()
    holder.join(30)
    w.join(30)
    assert ended_while_held and isinstance(box.get("exc"), KeyboardInterrupt), box
    assert scale.tuner.stats["tuned"] == 1  # the holder's tuning went on and ended as usual
