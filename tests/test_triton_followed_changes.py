"""What code changes on a decorated Triton kernel after decoration, and when the launches follow it:
the key names changed in place, a config's pre_hook set in place or brought in by a config appended, the
kernel's `fn` assigned, a launcher kept from before the change; `.cache_results` as Triton reads it; two
threads launching while the configs change; and tuner's own `tuner.autotune(space)` on a JIT function
looking up `run` at every launch, as the drop-in does. Each drop-in case runs against `triton.autotune`
too (under the interpreter), so a divergence shows."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402
from tests.test_triton_conformance import IMPLS, Bench, autotune_of, configs_of  # noqa: E402
from tuner import PowerOfTwo, SearchSpace  # noqa: E402

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


# ---- key names changed in place ----------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_a_key_name_appended_through_keys_is_followed_by_the_next_launch(impl):
    """`kernel.keys.append("K")` (as libraries do after decoration): Triton keys the next launch by N and
    K, so a K it has not seen is tuned although N's winner is cached, under a key of the new shape."""
    bench = Bench()
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=bench)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    assert bench.calls == 2
    k.keys.append("K")
    assert k.keys == ["N", "K"]
    k[grid](dst, src, 128, 2)  # N tuned, but K is part of the key now
    assert bench.calls == 4 and torch.equal(dst, src)
    assert list(k.cache) == [(128, F32, F32), (128, 2, F32, F32)]
    k[grid](dst, src, 128, 2)
    k[grid](dst, src, 128, 3)
    assert bench.calls == 6 and len(k.cache) == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_the_callers_key_list_changed_in_place_is_followed_at_the_next_miss(impl):
    """The caller's own key list, changed without going through the kernel: the next miss keys by the
    new names, and no launch after it gets a winner cached under a key of the old shape."""
    key = ["N"]
    bench = Bench()
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=key, do_bench=bench)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    key.append("K")
    k[grid](dst, src, 64, 2)  # a new N: a miss, keyed by N and K
    assert bench.calls == 4 and list(k.cache) == [(128, F32, F32), (64, 2, F32, F32)]
    k[grid](dst, src, 128, 1)  # N=128 was tuned under the old key only
    assert bench.calls == 6 and (128, 1, F32, F32) in k.cache and torch.equal(dst[:128], src[:128])


@pytest.mark.parametrize("impl", IMPLS)
def test_a_launcher_kept_from_before_follows_assigned_keys(impl):
    """`launch = kernel[grid]` made before `.keys` is assigned: its launches are keyed by the new names."""
    bench = Bench()
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=bench)
    dst, src = tensors()
    launch = k[grid]
    launch(dst, src, 128, 1)
    k.keys = ["N", "K"]
    launch(dst, src, 128, 2)
    launch(dst, src, 128, 3)
    assert bench.calls == 6 and set(k.cache) == {(128, F32, F32), (128, 2, F32, F32), (128, 3, F32, F32)}


# ---- config pre_hooks changed in place -----------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_a_config_appended_with_a_pre_hook_runs_it_at_the_launch_that_chose_it(impl):
    """The launch whose miss finds the appended config (a pre_hook of its own, the first in the list)
    times it, chooses it and launches it: its hook runs before the timed run and before that launch."""
    seen = []
    cfgs = configs_of(32, 64)
    k = copy_nk(autotune_of(impl), configs=cfgs, key=["N"], do_bench=Bench([2.0, 1.0, 3.0, 2.0, 1.0]))
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    cfgs.append(triton.Config({"BLOCK_SIZE": 16}, pre_hook=lambda nargs: seen.append(nargs["BLOCK_SIZE"])))
    k[grid](dst, src, 64, 1)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 16}
    assert seen == [16, 16]  # the timed run, then the launch


@pytest.mark.parametrize("impl", IMPLS)
def test_a_pre_hook_set_in_place_through_configs_runs_at_the_next_launch(impl):
    """`kernel.configs[i].pre_hook = f` on a kernel whose configs had none: Triton runs it at the next
    launch of that config, a cache hit too."""
    seen = []
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=Bench([2.0, 1.0]))
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    assert k.best_config.kwargs == {"BLOCK_SIZE": 64}
    k.configs[1].pre_hook = lambda nargs: seen.append(nargs["N"])
    k[grid](dst, src, 128, 1)
    k[grid](dst, src, 128, 1)
    assert seen == [128, 128] and torch.equal(dst, src)


# ---- a config's values changed in place ------------------------------------------------------------------
def recording(k):
    """What each timed run and launch of `k` passes the JIT function: its meta-parameters and options."""
    seen, run = [], k.fn.run

    def recorded(*args, **kwargs):
        seen.append({n: v for n, v in kwargs.items() if n in ("BLOCK_SIZE", "num_warps", "maxnreg")})
        return run(*args, **kwargs)

    k.fn.run = recorded
    return seen


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", ["item", "replaced", "through kernel", "an option set"])
def test_a_configs_values_changed_in_place_are_what_the_next_tuning_times(impl, how):
    """The same Config object with other values (`cfg.kwargs["BLOCK_SIZE"] = 16`, `cfg.kwargs = {...}`,
    through `kernel.configs`, a launch option that no other config sets): Triton reads them at every
    timed run, so the next tuning times and launches the new values, and the other configs run without
    the option (before, the drop-in passed them a placeholder for it)."""
    cfgs = configs_of(32, 64)
    k = copy_nk(autotune_of(impl), configs=cfgs, key=["N"], do_bench=Bench([2.0, 1.0, 1.0, 2.0]))
    seen = recording(k)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    assert [s["BLOCK_SIZE"] for s in seen] == [32, 64, 64]
    del seen[:]
    new = {"BLOCK_SIZE": 16, "num_warps": 4}
    if how == "item":
        cfgs[0].kwargs["BLOCK_SIZE"] = 16
    elif how == "replaced":
        cfgs[0].kwargs = {"BLOCK_SIZE": 16}
    elif how == "through kernel":
        k.configs[0].kwargs["BLOCK_SIZE"] = 16
    else:
        cfgs[0].kwargs["BLOCK_SIZE"], cfgs[0].maxnreg, new["maxnreg"] = 16, 128, 128
    k[grid](dst, src, 64, 1)  # a new key: times the new values, which win
    assert seen == [new, {"BLOCK_SIZE": 64, "num_warps": 4}, new] and torch.equal(dst, src)
    assert k.best_config is cfgs[0] and k.cache[(64, F32, F32)] is cfgs[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_winners_values_changed_through_configs_are_launched_by_its_keys_next_launch(impl):
    """`kernel.configs[i].kwargs[...] = v` on the config that won a key: Triton's next launch of that key,
    a cache hit, launches the config as it is now; so does the drop-in's (the read of `.configs` armed a
    check; its keys read their configs from `.cache` again), without timing anything."""
    bench = Bench([2.0, 1.0])
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=bench)
    seen = recording(k)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    del seen[:]
    k.configs[1].kwargs["BLOCK_SIZE"] = 16
    k[grid](dst, src, 128, 1)
    k[grid](dst, src, 128, 1)
    assert [s["BLOCK_SIZE"] for s in seen] == [16, 16] and bench.calls == 2 and torch.equal(dst, src)
    assert k.best_config is k.configs[1]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_single_configs_values_changed_in_place_are_what_the_next_miss_launches(impl):
    """A kernel with one config (never timed): its values changed in place are launched from the next
    launch of a new key (before, the drop-in launched the values of the decoration and named the config,
    with its new values, as `best_config`)."""
    cfgs = configs_of(32)
    k = copy_nk(autotune_of(impl), configs=cfgs, key=["N"], do_bench=Bench())
    seen = recording(k)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    cfgs[0].kwargs["BLOCK_SIZE"] = 16
    k[grid](dst, src, 64, 1)
    assert [s["BLOCK_SIZE"] for s in seen] == [32, 16] and torch.equal(dst, src)


# ---- the kernel's fn assigned ----------------------------------------------------------------------------
class Recorder:
    """What code may put in place of an autotuner's `fn`: a layer whose `run` records and forwards."""

    def __init__(self, inner):
        self.fn, self.arg_names, self.calls = inner, inner.arg_names, []

    def run(self, *args, **kwargs):
        self.calls.append(args[self.arg_names.index("N")])
        return self.fn.run(*args, **kwargs)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_assigned_fn_is_what_launches_and_timed_runs_call(impl):
    """As Triton's Autotuner calls `self.fn.run`, a function assigned to `.fn` is launched from the next
    launch on, a launcher kept from before included, and the configs chosen so far are kept."""
    bench = Bench()
    k = copy_nk(autotune_of(impl), configs=configs_of(32, 64), key=["N"], do_bench=bench)
    dst, src = tensors()
    launch = k[grid]
    launch(dst, src, 128, 1)
    rec = Recorder(k.fn)
    k.fn = rec
    assert k.fn is rec
    launch(dst, src, 128, 1)  # a hit: the chosen config, through the new fn
    k[grid](dst, src, 64, 1)  # a miss: two timed runs and the launch
    assert rec.calls == [128, 64, 64, 64] and bench.calls == 4 and torch.equal(dst, src)


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


# ---- two threads launching while the configs change ------------------------------------------------------
class GateConfig(triton.Config):
    """A config whose `all_kwargs` holds the one thread named `held` until `release` is set: a thread that
    reads the configs (as the tuner does when it follows a change) stops half way through."""

    held: str | None = None
    entered = threading.Event()
    release = threading.Event()

    def all_kwargs(self):
        if threading.current_thread().name == GateConfig.held and not GateConfig.release.is_set():
            GateConfig.entered.set()
            GateConfig.release.wait(5)
        return super().all_kwargs()


def test_two_threads_that_find_the_configs_changed_in_place_both_launch():
    """Thread A finds a config appended and stops while it reads the configs; the list changes again and
    thread B launches a new key. Both launches complete, B's after A's change is set, and the tuner ends
    with the configs of the list (before, B set them while A was half way, A then set the strict zip of
    two lists of different lengths and raised)."""
    cfgs = configs_of(32, 64)
    k = copy_nk(tuner.autotune, configs=cfgs, key=["N"], do_bench=Bench([9.0] * 20), storage=False)
    dst, src = tensors()
    k[grid](dst, src, 128, 1)
    # Triton's interpreter is not thread safe (it patches triton.language while a kernel runs): one launch
    # at a time, by a lock on the JIT function's run (which the drop-in looks up at each launch)
    run, interpreter = k.fn.run, threading.Lock()

    def locked(*args, **kwargs):
        with interpreter:
            return run(*args, **kwargs)

    k.fn.run = locked
    errors = []

    def launch(n):
        try:
            d = torch.empty(128)
            k[grid](d, src, n, 1)
            assert torch.equal(d[:n], src[:n])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    GateConfig.held, GateConfig.entered, GateConfig.release = "A", threading.Event(), threading.Event()
    try:
        cfgs.append(GateConfig({"BLOCK_SIZE": 16}))
        a = threading.Thread(target=launch, args=(64,), name="A")
        a.start()
        assert GateConfig.entered.wait(5)
        cfgs.append(triton.Config({"BLOCK_SIZE": 8}))
        b = threading.Thread(target=launch, args=(32,), name="B")
        b.start()
        b.join(0.3)  # B waits for A's change (or, before, completed its own)
        GateConfig.release.set()
        a.join(10)
        b.join(10)
    finally:
        GateConfig.release.set()
        GateConfig.held = None
    assert not errors, errors
    t = k.tuner
    assert t.configs == cfgs and len(t._dicts) == 4 and t.configs_given is cfgs


# ---- tuner.autotune(space) on a JIT function --------------------------------------------------------------
@triton.jit
def _scale(dst, N, block: tl.constexpr):
    offs = tl.program_id(0) * block + tl.arange(0, block)
    tl.store(dst + offs, tl.full([block], 2.0, tl.float32), mask=offs < N)


def test_native_kernel_calls_a_run_wrapper_put_on_the_jit_function_after_decoration():
    """`tuner.autotune(space)` on a JIT function looks up its `run` at every launch, as the drop-in and
    Triton's Autotuner do: a wrapper put there after decoration sees the hits too."""
    k = tuner.autotune(
        SearchSpace([PowerOfTwo("block", 16, 64)]), key=["N"], budget=3, storage=False, bench=lambda call: 1.0
    )(_scale)
    dst = torch.zeros(64)
    k[(4,)](dst, 64)
    calls = []
    inner = _scale.run

    def wrapped(*args, **kwargs):
        calls.append(kwargs["block"])
        return inner(*args, **kwargs)

    _scale.run = wrapped
    try:
        k[(4,)](dst, 64)
        k.run(dst, 64, grid=(4,))
    finally:
        del _scale.run
    assert len(calls) == 2 and torch.equal(dst, torch.full((64,), 2.0))
    rec = Recorder(_scale)
    k.fn = rec
    k[(4,)](dst, 64)
    assert k.fn is rec and rec.calls == [64]


# ---- a plain callable with triton.autotune's keywords ----------------------------------------------------
def test_a_plain_callable_follows_its_key_list_changed_in_place():
    """The drop-in on a Python function: the caller's key list changed in place is followed from the next
    miss, and its hit path keys by the new names from then on (it kept the old names' keys before)."""
    key = ["n"]
    bench = Bench()

    @tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=key, do_bench=bench, storage=False)
    def f(x, n, k, *, b):
        return b

    f(None, 1, 1)
    key.append("k")
    f(None, 2, 1)  # a miss: keyed by n and k
    f(None, 1, 5)
    f(None, 1, 6)  # n=1 and k=5 were tuned, not k=6
    f(None, 1, 6)
    assert bench.calls == 8


def test_a_plain_callable_leaves_out_the_keys_that_configs_changed_in_place_leave_unset():
    """Configs made irregular after decoration (one appended sets `c`, the others do not): the configs
    without `c` run without it, in the timed runs and the launch, as Triton's `all_kwargs` passes only
    what a config sets (before, the drop-in decided at decoration and passed a placeholder)."""
    cfgs = [{"b": 1}, {"b": 2}]
    calls = []

    @tuner.autotune(configs=cfgs, key=["n"], do_bench=Bench([2.0, 1.0, 1.0, 3.0, 2.0]), storage=False)
    def f(x, n, *, b, c=0):
        calls.append((b, c))
        return b, c

    assert f(None, 1) == (2, 0)
    cfgs.append({"b": 3, "c": 5})
    del calls[:]
    assert f(None, 2) == (1, 0)  # timed 1, 2, then (3, 5); 1 wins
    assert calls == [(1, 0), (2, 0), (3, 5), (1, 0)]
    assert f(None, 2) == (1, 0) and f(x=None, n=2) == (1, 0)
    cfgs[:] = [{"b": 4, "c": 6}, {"b": 5, "c": 7}]  # regular again: every key passed
    assert f(None, 3) == (4, 6) and f(None, 3) == (4, 6)


# ---- a review of the following (6 Dec) -----------------------------------------------------------------
def test_cache_gets_the_config_of_its_own_key_when_another_thread_launches_meanwhile():
    """A miss put `best_config()` in `.cache` under its key: the config of the last launch of any thread,
    so another thread's launch between the miss's choice and that line gave the key the other key's
    winner (read back once `.cache` is consulted again). Each key's winner here is B == n."""
    calls: list[tuple[int, int]] = []

    def bench(fn, *a, **k):
        calls.clear()
        fn()
        n, b = calls[-1]
        return 0.1 if b == n else 1.0

    @tuner.autotune(configs=[{"B": 5}, {"B": 7}], key=["n"], do_bench=bench, storage=False)
    def f(x, n, B=0):
        calls.append((n, B))
        return B

    assert f(1, 7) == 7
    t = f.tuner
    orig, once = t.triton_key, [True]

    def triton_key(args, kwargs):  # called by the miss after its choice: another thread launches key 7
        if once[0] and args[1:2] == (5,) and t.last[0] == {"B": 5}:  # after the miss chose B=5
            once[0] = False
            th = threading.Thread(target=lambda: f(1, n=7))
            th.start()
            th.join()
        return orig(args, kwargs)

    t.triton_key = triton_key
    assert f(1, 5) == 5
    assert {k[0]: v["B"] for k, v in f.cache.items()} == {7: 7, 5: 5}


def test_a_forked_child_follows_a_change_while_a_parent_thread_held_the_follow_lock():
    """A thread of the parent held the lock that guards following in-place changes when another forked:
    the child's next miss waited on it for ever (the lock was not made anew in the child)."""
    import os
    import signal

    cfgs = [{"B": 1}, {"B": 2}]

    @tuner.autotune(configs=cfgs, key=["n"], do_bench=lambda fn, *a, **k: (fn(), 1.0)[1], storage=False)
    def f(x, n, B=0):
        return B

    f(1, 5)
    held, release = threading.Event(), threading.Event()

    def holder():
        with f.tuner.follow_lock:
            held.set()
            release.wait()

    th = threading.Thread(target=holder, daemon=True)
    th.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: a miss after a change in place; exit 3 if it hangs
        signal.signal(signal.SIGALRM, lambda *a: os._exit(3))
        signal.alarm(10)
        try:
            cfgs[0]["B"] = 3
            os._exit(0 if f(1, 6) in (2, 3) else 4)
        except BaseException:  # noqa: BLE001 - any failure is the child's exit code
            os._exit(5)
    release.set()
    th.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's miss hung (3) or failed"


def test_a_keyword_launch_of_a_tuned_key_compares_no_config_values_until_code_reads_configs(monkeypatch):
    """A keyword launch took the miss path at every call and compared every config's values with what
    was set (a cost growing with the configs: 1.6-3.5x slower launches at 8-64 configs). Only a real
    miss, or the first launch after code read `.configs`/`.keys`, compares them; a change made then is
    still what that launch uses (the keyword key of the armed table checks first)."""
    from tuner.runtime import _triton_compat

    compared = []
    real = _triton_compat._config_values
    monkeypatch.setattr(
        _triton_compat, "_config_values", lambda c, **kw: (compared.append(1), real(c, **kw))[1]
    )
    k = copy_nk(tuner.autotune, configs=configs_of(32, 64), key=["N"], do_bench=Bench())
    dst, src = tensors()
    k[grid](dst, src, N=128, K=1)
    compared.clear()
    for _ in range(3):
        k[grid](dst, src, N=128, K=1)  # a key already tuned: keyword launches
    assert compared == []
    k.configs[0].kwargs["BLOCK_SIZE"] = 16  # read `.configs`, then a value changed in place
    k[grid](dst, src, N=128, K=1)
    assert compared and torch.equal(dst, src)
