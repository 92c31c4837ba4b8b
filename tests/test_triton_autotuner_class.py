"""The drop-in's kernel object as code written for Triton sees it: an instance of Triton's `Autotuner`,
with its attributes and their meaning, under and over `@triton.heuristics`, launched by `[grid]`, `.run`
and `.warmup`. Each case runs against `triton.autotune` and `tuner.autotune` under the interpreter.

The callers are this project's own code in the style of public ones: torch's `wrap_triton` and its TTIR
unwrap (`isinstance(kernel, Autotuner)`, then `.configs[0].kwargs` and `.fn`), a FlagGems-style library
entry that walks `.fn` and reads `best_config` of each `Autotuner` and `values` of each `Heuristics`, an
fla-style patch that drops a name from `.keys`, a vLLM-style test that narrows `.configs` (and empties
`.cache` to tune again), and mamba-style code that sizes its host-side reduction by `best_config`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime import Autotuner, Heuristics, KernelInterface  # noqa: E402

import tuner  # noqa: E402

IMPLS = ["triton", "tuner"]


def autotune_of(impl: str):
    return triton.autotune if impl == "triton" else tuner.autotune


class Bench:
    """A fake do_bench: runs the call once and returns the next of `times` (ms)."""

    def __init__(self, times=()):
        self.times = list(times)
        self.calls = 0

    def __call__(self, kernel_call, quantiles):
        kernel_call()
        t = self.times[self.calls] if self.calls < len(self.times) else 10.0 + self.calls
        self.calls += 1
        return [t, t, t]


def blocks(*bs, **opts):
    return [triton.Config({"BLOCK": b}, **opts) for b in bs]


def grid_of(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def fill_kernel(impl, bench, cfgs=None, **kw):
    """dst[i] = BLOCK for i < N (so the output says which config ran)."""

    @autotune_of(impl)(configs=cfgs or blocks(16, 32, 64), key=["N"], do_bench=bench, **kw)
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < N)

    return fill


def jit_function_types():
    from triton.runtime.interpreter import InterpretedFunction

    return (triton.runtime.JITFunction, InterpretedFunction)


# ---- the class ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_the_kernel_is_an_instance_of_tritons_autotuner(impl):
    k = fill_kernel(impl, Bench())
    assert isinstance(k, Autotuner) and isinstance(k, triton.runtime.autotuner.Autotuner)
    assert isinstance(k, KernelInterface) and not isinstance(k, Heuristics)
    assert issubclass(type(k), Autotuner)
    assert isinstance(k.fn, jit_function_types()) and k.base_fn.__name__ == "fill"


@pytest.mark.parametrize("impl", IMPLS)
def test_heuristics_over_and_under_wrap_an_autotuner(impl):
    bench = Bench(times=[3.0, 1.0, 2.0, 3.0, 1.0, 2.0])

    @triton.heuristics({"SCALE": lambda a: 2.0 if a["N"] > 50 else 1.0})
    @autotune_of(impl)(configs=blocks(16, 32, 64), key=["N"], do_bench=bench)
    @triton.heuristics({"EVEN": lambda a: a["N"] % a["BLOCK"] == 0})
    @triton.jit
    def fill(dst, N, SCALE: tl.constexpr, EVEN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.full([BLOCK], BLOCK, tl.float32) * SCALE + (1000.0 if EVEN else 0.0)
        tl.store(dst + offs, v, mask=offs < N)

    assert isinstance(fill, Heuristics) and isinstance(fill.fn, Autotuner)
    assert isinstance(fill.fn.fn, Heuristics) and isinstance(fill.fn.fn.fn, jit_function_types())
    for n, want in [(100, 64.0), (32, 32.0 + 1000.0)]:
        dst = torch.zeros(n)
        fill[grid_of(n)](dst, n)
        assert torch.equal(dst, torch.full((n,), want))
        assert fill.fn.best_config.kwargs == {"BLOCK": 32}
    assert bench.calls == 6


# ---- launches: [grid], .run, .warmup -------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_run_and_grid_launch_alike(impl):
    bench = Bench(times=[2.0, 1.0, 3.0])
    k = fill_kernel(impl, bench)
    a, b = torch.zeros(100), torch.zeros(100)
    k.run(a, 100, grid=grid_of(100), warmup=False)
    k[grid_of(100)](b, 100)
    assert torch.equal(a, torch.full((100,), 32.0)) and torch.equal(a, b)
    assert bench.calls == 3 and k.best_config.kwargs == {"BLOCK": 32}


@pytest.mark.parametrize("impl", IMPLS)
def test_warmup_compiles_the_pruned_configs_without_tuning_or_writing(impl):
    bench = Bench()
    seen = []

    def keep_small(configs, named_args, **kwargs):
        seen.append(sorted(named_args))
        return [c for c in configs if c.kwargs["BLOCK"] <= 32]

    k = fill_kernel(impl, bench, prune_configs_by={"early_config_prune": keep_small})
    dst = torch.zeros(100)
    out = k.warmup(dst, 100, grid=(1,))
    assert len(out) == 2  # one per config left after pruning
    assert bench.calls == 0 and not dst.any()  # nothing timed, nothing launched
    assert seen == [["N", "dst"]]
    # a torch dtype in place of a tensor, as Triton's warmup takes it
    assert len(k.warmup(torch.float32, 100, grid=(1,))) == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_warmup_through_heuristics_above(request, impl):
    if impl == "triton":
        why = "Heuristics.warmup calls Autotuner.run(warmup=True), which times the no-op warm-up launches"
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"triton {triton.__version__}: {why}"))
    bench = Bench()

    @triton.heuristics({"SCALE": lambda a: 2.0})
    @autotune_of(impl)(configs=blocks(16, 32), key=["N"], do_bench=bench)
    @triton.jit
    def fill(dst, N, SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32) * SCALE, mask=offs < N)

    dst = torch.zeros(64)
    fill.warmup(dst, 64, grid=(1,))
    assert bench.calls == 0 and not dst.any()


# ---- torch: wrap_triton and the TTIR unwrap ------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_torch_wrap_triton_accepts_the_kernel(impl):
    wrap_triton = pytest.importorskip("torch.library").wrap_triton
    k = fill_kernel(impl, Bench(times=[1.0, 2.0, 3.0]))
    w = wrap_triton(k)  # refused ("only works on functions annotated with triton.jit or triton.autotune")
    dst = torch.zeros(40)
    w[grid_of(40)](dst, 40)
    assert torch.equal(dst, torch.full((40,), 16.0))


@pytest.mark.parametrize("impl", IMPLS)
def test_inductor_style_unwrap_launches_the_first_config(impl):
    """What torch's TTIR generation does with an autotuned user kernel: the first config, then `.fn`."""
    k = fill_kernel(impl, Bench())
    kernel, kwargs = k, {}
    if isinstance(kernel, Autotuner):
        if len(kernel.configs) > 0:
            kwargs = {**kwargs, **kernel.configs[0].kwargs}
        name = kernel.base_fn.__name__
        kernel = kernel.fn
    assert isinstance(kernel, jit_function_types()) and name == "fill"
    dst = torch.zeros(40)
    kernel[(3,)](dst, 40, **kwargs)
    assert torch.equal(dst, torch.full((40,), 16.0))
    # the other attributes torch checks before it accepts an autotuned kernel
    assert (k.num_warmups, k.num_reps, k.use_cuda_graph) == (None, None, False)
    assert k.user_defined_pre_hook is False and k.user_defined_post_hook is False
    assert k.perf_model is None and k.early_config_prune is None and k.configs_top_k == 1.0


# ---- a FlagGems-style library entry -------------------------------------------------------------------
class LibEntry(KernelInterface):
    """Launches through `fn.run`, then walks the wrappers down to the JIT function, collecting the
    constexprs each one supplied: `best_config` of an Autotuner, `values` of a Heuristics. Anything else
    in the chain is refused, as the library refuses it."""

    def __init__(self, fn):
        self.fn, self.arg_names = fn, fn.arg_names

    def run(self, *args, **kwargs):
        self.fn.run(*args, **kwargs)
        fn, constexprs = self.fn, {}
        while not isinstance(fn, jit_function_types()):
            if isinstance(fn, Autotuner):
                cfg = fn.best_config
                constexprs.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cfg.kwargs)
            elif isinstance(fn, Heuristics):
                named = dict(zip(fn.arg_names, args, strict=False))
                for name, heur in fn.values.items():
                    constexprs[name] = heur({**named, **kwargs, **constexprs})
            else:
                raise RuntimeError("Invalid Runtime Function")
            fn = fn.fn
        return constexprs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heuristics_above", [False, True])
def test_a_library_entry_reads_the_config_that_ran(impl, heuristics_above):
    bench = Bench(times=[3.0, 1.0, 2.0, 1.0, 2.0, 3.0])

    @autotune_of(impl)(configs=blocks(16, 32, 64, num_warps=2), key=["N"], do_bench=bench)
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr, HALF: tl.constexpr = 0):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK + HALF * 0, tl.float32), mask=offs < N)

    k = triton.heuristics({"HALF": lambda a: a["N"] // 2})(fill) if heuristics_above else fill
    entry = LibEntry(k)
    got = []
    for n in (100, 30, 100):
        dst = torch.zeros(n)
        c = entry.run(dst, n, grid=grid_of(n), warmup=False)
        assert torch.equal(dst, torch.full((n,), float(c["BLOCK"])))  # the config read is the one that ran
        got.append((c["BLOCK"], c["num_warps"], c.get("HALF")))
    half = [50, 15, 50] if heuristics_above else [None] * 3
    assert got == [(32, 2, half[0]), (16, 2, half[1]), (32, 2, half[2])]


# ---- best_config is the config of the last launch (mamba-style host code reads it) ---------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_best_config_follows_every_launch(impl):
    bench = Bench(times=[3.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    k = fill_kernel(impl, bench)
    got = []
    for n in (100, 30, 100, 30, 100):
        dst = torch.zeros(n)
        k[grid_of(n)](dst, n)
        block = k.best_config.kwargs["BLOCK"]
        n_blocks = triton.cdiv(n, block)  # how many partial results the launch left, as mamba sums them
        assert torch.equal(dst, torch.full((n,), float(block)))
        got.append((block, n_blocks))
    assert got == [(32, 4), (16, 2), (32, 4), (16, 2), (32, 4)]
    assert bench.calls == 6


# ---- code that patches the autotuner: .keys (fla), .configs and .cache (vLLM) ----------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_dropping_a_name_from_keys_stops_retuning_on_it(impl):
    bench = Bench()

    @triton.heuristics({"NB": lambda a: triton.cdiv(a["T"], 16)})
    @autotune_of(impl)(configs=blocks(16, 32), key=["D", "NB"], do_bench=bench)
    @triton.jit
    def k(dst, T, D, NB, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], BLOCK, tl.float32), mask=offs < T)

    kernel = k.fn if isinstance(k, Heuristics) else k
    assert isinstance(kernel, Autotuner) and list(kernel.keys) == ["D", "NB"]
    kernel.keys = [name for name in kernel.keys if name != "NB"]
    assert list(kernel.keys) == ["D"]
    for t in (40, 80, 120):
        dst = torch.zeros(t)
        k[grid_of(t)](dst, t, 8)
        assert dst.all()
    assert bench.calls == 2  # one tuning for D=8, whatever NB is


@pytest.mark.parametrize("impl", IMPLS)
def test_narrowed_configs_are_the_ones_timed(impl):
    bench = Bench(times=[2.0, 1.0])
    k = fill_kernel(impl, bench, cfgs=blocks(8, 16, 32, 64))
    k.configs = [c for c in k.configs if c.kwargs["BLOCK"] >= 32]
    dst = torch.zeros(100)
    k[grid_of(100)](dst, 100)
    assert bench.calls == 2 and k.best_config.kwargs == {"BLOCK": 64}
    assert torch.equal(dst, torch.full((100,), 64.0))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_single_config_assigned_is_used_for_every_key(impl):
    bench = Bench(times=[2.0, 1.0, 3.0])
    k = fill_kernel(impl, bench)
    dst = torch.zeros(100)
    k[grid_of(100)](dst, 100)
    assert k.best_config.kwargs == {"BLOCK": 32}
    k.configs = [triton.Config({"BLOCK": 8})]
    for n in (100, 30):
        dst = torch.zeros(n)
        k[grid_of(n)](dst, n)
        assert torch.equal(dst, torch.full((n,), 8.0)) and k.best_config.kwargs == {"BLOCK": 8}
    assert bench.calls == 3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", ["assign", "clear"])
def test_an_emptied_cache_tunes_again_over_the_configs_left(impl, how):
    bench = Bench(times=[2.0, 1.0, 3.0, 1.0, 2.0])
    k = fill_kernel(impl, bench, cache_results=False)  # winners in memory only, as Triton's default
    dst = torch.zeros(100)
    k[grid_of(100)](dst, 100)
    assert k.best_config.kwargs == {"BLOCK": 32} and len(k.cache) == 1
    k.configs = [c for c in k.configs if c.kwargs["BLOCK"] <= 32]
    k[grid_of(100)](dst, 100)
    assert k.best_config.kwargs == {"BLOCK": 32} and bench.calls == 3  # a tuned key keeps its config
    if how == "assign":
        k.cache = {}
    else:
        k.cache.clear()
    dst.zero_()
    k[grid_of(100)](dst, 100)
    assert k.best_config.kwargs == {"BLOCK": 16} and bench.calls == 5
    assert torch.equal(dst, torch.full((100,), 16.0)) and len(k.cache) == 1


K100, K30 = (100, "torch.float32"), (30, "torch.float32")  # Triton's keys of fill(dst, N) for N=100, 30
CFG64 = triton.Config({"BLOCK": 64})

# code's mutation of `.cache` -> (what N=100 runs next, the keys tuned again); before it, N=100 was tuned
# to BLOCK 32 and N=30 to BLOCK 16; a key tuned again picks BLOCK 16 (the fake timer's times grow)
CACHE_MUTATIONS = {
    "setitem": (lambda c: c.__setitem__(K100, CFG64), 64, set()),
    "ior": (lambda c: c.__ior__({K100: CFG64}), 64, set()),
    "update": (lambda c: c.update({K100: CFG64}), 64, set()),
    "update_pairs": (lambda c: c.update([(K100, CFG64)]), 64, set()),
    "setdefault_present": (lambda c: c.setdefault(K100, CFG64), 32, set()),
    "pop_then_setdefault": (lambda c: (c.pop(K100), c.setdefault(K100, CFG64)), 64, set()),
    "pop": (lambda c: c.pop(K100), 16, {100}),
    "pop_missing_with_default": (lambda c: c.pop((7, "torch.float32"), None), 32, set()),
    "del": (lambda c: c.__delitem__(K100), 16, {100}),
    "popitem": (lambda c: c.popitem(), 32, {30}),  # the last key put in
    "clear": (lambda c: c.clear(), 16, {100, 30}),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", sorted(CACHE_MUTATIONS))
def test_every_cache_mutation_acts_on_the_next_launch(impl, op):
    """`.cache` is consulted on each launch, as Triton's: an entry put in it (any way) is used, a key taken
    out of it (any way) is tuned again. The drop-in keeps its default store here: its stored winners do
    not stand in for a key taken out (Triton, without a disk cache, times it again)."""
    mutate, block100, retuned = CACHE_MUTATIONS[op]
    bench = Bench(times=[2.0, 1.0, 3.0, 1.0, 2.0, 3.0])
    k = fill_kernel(impl, bench)
    assert (launch_fill(k, 100), launch_fill(k, 30)) == (32, 16) and bench.calls == 6
    mutate(k.cache)
    assert launch_fill(k, 100) == block100
    assert launch_fill(k, 30) == 16
    assert bench.calls == 6 + 3 * len(retuned), (op, bench.calls)
    assert k.cache[K100].kwargs == {"BLOCK": block100} and k.cache[K30].kwargs == {"BLOCK": 16}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("value", ["empty", "other"])
def test_an_assigned_cache_replaces_the_old_one(impl, value):
    bench = Bench(times=[2.0, 1.0, 3.0, 1.0, 2.0, 3.0])
    k = fill_kernel(impl, bench)
    launch_fill(k, 100), launch_fill(k, 30)
    k.cache = {} if value == "empty" else {K100: CFG64}
    assert launch_fill(k, 100) == (16 if value == "empty" else 64)
    assert launch_fill(k, 30) == 16
    assert bench.calls == (12 if value == "empty" else 9)


def launch_fill(k, n):
    dst = torch.zeros(n)
    k[grid_of(n)](dst, n)
    return int(dst[0])


def test_an_emptied_cache_tunes_again_and_keeps_the_store():
    """Taking a key out of `.cache` tunes it again at its next launch, store or not (Triton's meaning); the
    store's entry is neither used for that nor deleted: the faster of it and the new winner stays, for
    other processes. tuner's own `cache_clear()` forgets this process's choices and reads the store."""
    bench = Bench(times=[2.0, 1.0, 3.0, 5.0, 6.0, 7.0])  # the second tuning is slower (a noisy machine)
    k = fill_kernel("tuner", bench)
    assert launch_fill(k, 100) == 32
    k.cache.clear()
    assert launch_fill(k, 100) == 16 and bench.calls == 6  # tuned again; used in this process
    assert launch_fill(k, 100) == 16 and bench.calls == 6
    other = fill_kernel("tuner", Bench())  # another process: the store kept the faster winner
    assert launch_fill(other, 100) == 32 and other.tuner.stats["from_store"] == 1
    k.cache_clear()  # tuner's: forget, read the store again
    assert launch_fill(k, 100) == 32 and bench.calls == 6 and len(k.cache) == 1


def none_mode_kernel(impl, bench):
    """dst[i] = BLOCK + 1000 when the config's MODE is None, else BLOCK."""

    @autotune_of(impl)(
        configs=[triton.Config({"BLOCK": 16, "MODE": None}), triton.Config({"BLOCK": 32, "MODE": "x"})],
        key=["N"],
        do_bench=bench,
    )
    @triton.jit
    def fill(dst, N, BLOCK: tl.constexpr, MODE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = BLOCK
        if MODE is None:
            v = BLOCK + 1000
        tl.store(dst + offs, tl.full([BLOCK], v, tl.float32), mask=offs < N)

    return fill


@pytest.mark.parametrize("impl", IMPLS)
def test_a_meta_parameter_set_to_none_is_launched_as_none(impl):
    """`triton.Config({"MODE": None})` launches with MODE=None in Triton (`all_kwargs()` keeps a None
    kwarg). The drop-in left the key out of that config's launch, as it does for a key another config
    sets and this one does not, so the launch failed for want of MODE and the faster config was dropped
    without a word: another config won."""
    bench = Bench(times=[1.0, 2.0])
    k = none_mode_kernel(impl, bench)
    assert launch_fill(k, 100) == 1016 and bench.calls == 2
    assert k.best_config.kwargs == {"BLOCK": 16, "MODE": None}
    assert launch_fill(k, 100) == 1016 and bench.calls == 2
    if impl == "tuner":  # another process reads the winner from the store, None and all
        other = none_mode_kernel(impl, Bench())
        assert launch_fill(other, 100) == 1016 and other.tuner.stats["from_store"] == 1


def test_bench_time_counts_the_timing_not_a_wait_for_another_process(monkeypatch):
    """`.bench_time` (and TRITON_PRINT_AUTOTUNING's "finished after") is the time the configs took, as in
    Triton. It counted from the miss, so a rank that first waited out another rank's claim on the key
    (up to its lease, 120 s) showed that wait as its benchmarking time. A fake clock: the wait takes 120,
    each timing 1."""
    import types

    from tuner.runtime import _triton_compat, _tuning

    clock = [0.0]
    monkeypatch.setattr(_triton_compat, "time", types.SimpleNamespace(time=lambda: clock[0]))
    tune_once = _tuning.tune_once  # what a miss calls (_resolve imports it at the call)

    def waits_first(req):
        clock[0] += 120.0  # another process held the key's claim
        return tune_once(req)

    monkeypatch.setattr(_tuning, "tune_once", waits_first)

    class TickingBench(Bench):
        def __call__(self, kernel_call, quantiles):
            out = super().__call__(kernel_call, quantiles)
            clock[0] += 1.0
            return out

    k = fill_kernel("tuner", TickingBench(times=[2.0, 1.0, 3.0]))
    assert launch_fill(k, 100) == 32
    assert k.bench_time == 3.0


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_launched_with_a_single_config_are_tuned_once_configs_are_assigned(impl):
    """A single config is neither timed nor put in `.cache`; once several are assigned, Triton tunes the
    keys it launched before."""
    bench = Bench(times=[2.0, 1.0, 3.0])
    k = fill_kernel(impl, bench, cfgs=blocks(8))
    assert launch_fill(k, 100) == 8 and bench.calls == 0 and len(k.cache) == 0
    k.configs = blocks(16, 32, 64)
    assert launch_fill(k, 100) == 32 and bench.calls == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_hooks_assigned_after_decoration_take_effect(impl):
    bench = Bench(times=[2.0, 1.0])
    k = fill_kernel(impl, bench, cfgs=blocks(16, 32))
    calls = []

    def pre(nargs, reset_only=False):
        calls.append(("pre", reset_only))
        nargs["dst"].zero_()

    k.pre_hook = pre
    k.post_hook = lambda nargs, exception: calls.append(("post", float(nargs["dst"].sum())))
    assert k.pre_hook is pre
    dst = torch.full((32,), 7.0)
    k[grid_of(32)](dst, 32)
    assert calls == [("pre", False), ("post", 16.0 * 32), ("pre", False), ("post", 32.0 * 32), ("pre", True)]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_config_put_in_cache_is_used_for_its_key(impl):
    bench = Bench()
    k = fill_kernel(impl, bench)
    k.cache[(100, "torch.float32")] = triton.Config({"BLOCK": 64})
    dst = torch.zeros(100)
    k[grid_of(100)](dst, 100)
    assert bench.calls == 0 and k.best_config.kwargs == {"BLOCK": 64}
    assert torch.equal(dst, torch.full((100,), 64.0))
    k[grid_of(30)](torch.zeros(30), 30)  # another key is tuned
    assert bench.calls == 3 and len(k.cache) == 2


# ---- `.nargs`: the launch's positional arguments while it runs ----------------------------------------
def _nargs_seen(k):
    """What `k.nargs` holds, as plain values (a tensor by its identity)."""
    n = k.nargs
    return None if n is None else {name: (id(v) if torch.is_tensor(v) else v) for name, v in n.items()}


@pytest.mark.parametrize("impl", IMPLS)
def test_nargs_holds_the_launchs_arguments_while_it_runs(impl):
    seen = []
    box = {}

    def prune(configs, named_args, **kwargs):
        seen.append(("prune", _nargs_seen(box["k"])))
        return configs

    def perf_model(**kwargs):
        seen.append(("perf", _nargs_seen(box["k"])))
        return kwargs["BLOCK"]

    def pre(nargs, reset_only=False):
        seen.append(("pre", _nargs_seen(box["k"])))

    def post(nargs, exception):
        seen.append(("post", _nargs_seen(box["k"])))

    k = box["k"] = fill_kernel(
        impl,
        Bench(times=[2.0, 1.0]),
        prune_configs_by={"early_config_prune": prune, "perf_model": perf_model, "top_k": 2},
        pre_hook=pre,
        post_hook=post,
    )
    assert getattr(k, "nargs", None) is None  # before the first launch (Triton's has none yet)

    def grid(meta):
        seen.append(("grid", _nargs_seen(k)))
        return (triton.cdiv(100, meta["BLOCK"]),)

    dst = torch.zeros(100)
    want = {"dst": id(dst), "N": 100}
    k[grid](dst, 100)  # a miss: prune, perf model, hooks and grid of the timed runs
    kinds = {kind for kind, _ in seen}
    assert kinds == {"prune", "perf", "pre", "post", "grid"}
    assert all(n == want for _, n in seen), seen
    assert k.nargs is None  # reset once the launch returns
    seen.clear()
    k[grid](dst, 100)  # a hit: the grid function of the real launch
    assert seen == [("grid", want)] and k.nargs is None
    seen.clear()
    k.run(dst, 100, grid=grid, warmup=False)  # .run sets it too
    assert seen == [("grid", want)] and k.nargs is None


@pytest.mark.parametrize("impl", IMPLS)
def test_nargs_during_warmup(impl):
    seen = []
    box = {}

    def prune(configs, named_args, **kwargs):
        seen.append(_nargs_seen(box["k"]))
        return configs

    k = box["k"] = fill_kernel(impl, Bench(), prune_configs_by={"early_config_prune": prune})
    dst = torch.zeros(8)
    k.warmup(dst, 8, grid=(1,))
    assert seen == [{"dst": id(dst), "N": 8}] and k.nargs is None
    assert [c.kwargs for c in k.prune_configs({})] == [{"BLOCK": b} for b in (16, 32, 64)]  # `.nargs` None


def test_nargs_is_not_kept_past_a_launch_that_raises():
    """Triton leaves `.nargs` set after a launch that raises (it keeps the arguments alive until the next
    launch); the drop-in clears it."""

    def boom(nargs):
        raise RuntimeError("pre-hook failed")

    k = fill_kernel("tuner", Bench(), cfgs=[triton.Config({"BLOCK": 16}, pre_hook=boom)])
    with pytest.raises(RuntimeError, match="pre-hook failed"):
        k[grid_of(8)](torch.zeros(8), 8)
    assert k.nargs is None


def test_nargs_assigned_reads_back_outside_launches():
    """Code that assigns `.nargs` (Triton's own methods do, around their work) reads it back; inside a
    launch the launch's arguments win."""
    seen = []
    k = fill_kernel("tuner", Bench())
    k.nargs = {"dst": None, "N": 3}
    assert k.nargs == {"dst": None, "N": 3}
    k.cache[(8, "torch.float32")] = triton.Config({"BLOCK": 16})
    dst = torch.zeros(8)

    def grid(meta):
        seen.append(_nargs_seen(k))
        return (1,)

    k[grid](dst, 8)
    assert seen == [{"dst": id(dst), "N": 8}]
    assert k.nargs == {"dst": None, "N": 3}
    k.nargs = None
    assert k.nargs is None


def test_nargs_of_nested_launches_and_other_threads():
    """The innermost launch of the kernel in this thread: a launch inside another's grid function sees
    its own arguments, the outer one its own again afterwards; another thread sees none."""
    import threading

    k = fill_kernel("tuner", Bench())
    for n in (8, 4):
        k.cache[(n, "torch.float32")] = triton.Config({"BLOCK": 16})
    outer, inner = torch.zeros(8), torch.zeros(4)
    seen = []

    def other_thread():
        seen.append(("thread", _nargs_seen(k)))

    def inner_grid(meta):
        seen.append(("inner", _nargs_seen(k)))
        return (1,)

    def outer_grid(meta):
        seen.append(("outer", _nargs_seen(k)))
        k[inner_grid](inner, 4)
        seen.append(("outer", _nargs_seen(k)))
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
        return (1,)

    k[outer_grid](outer, 8)
    o, i = {"dst": id(outer), "N": 8}, {"dst": id(inner), "N": 4}
    assert seen == [("outer", o), ("inner", i), ("outer", o), ("thread", None)]
    assert k.nargs is None
