"""The Triton drop-in (`tuner.autotune(configs=...)` on a `@triton.jit` kernel) inside `torch.compile`.

On a machine where torch supports Triton (`torch.utils._triton.has_triton()`: a CUDA GPU of compute
capability 7.0 or newer, XPU, ...), Dynamo turns `kernel[grid](...)` on any `triton.runtime.Autotuner` into
its `triton_kernel_wrapper_mutation` higher-order op, and the drop-in is one (docs/production.md,
"torch.compile"). With the `eager` and `aot_eager` backends, the op launches `kernel[grid](...)` when the
graph runs: tuner's hit path, with its winner. This machine has no such device, so the CPU tests below take
that path as a GPU has it: `has_triton` answers True, and the kernel is a real `JITFunction` (what Dynamo
and torch's wrap checks look at) whose launches run in the Triton interpreter. The Inductor test of that path
needs a GPU: Inductor compiles and launches the kernel itself.

Where torch has no Triton support (this machine, as it is), Dynamo traces the kernel object's Python, which
it cannot do through Triton's interpreter; the drop-in of an interpreted kernel then hands it one custom op
(`tuner/runtime/_dynamo_bridge.py`), tested in the second half.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import tuner  # noqa: E402

GPU = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 7


def _double(x, y, n, B: tl.constexpr):  # noqa: ANN001, ANN202, N803
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


def _jit(fn: Any, *, interpret: bool) -> Any:
    """`triton.jit(fn)` with Triton's interpreter knob set to `interpret` while it decorates (set on the
    knob, not only TRITON_INTERPRET: a knob set explicitly elsewhere in the worker wins over the variable);
    the knob's scope restores its state afterwards."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        return triton.jit(fn)


def _jit_launching_in_interpreter(fn: Any) -> Any:
    """A real JITFunction (what a GPU machine's `@triton.jit` makes) whose launches (`run`) are the
    interpreter's, on CPU tensors."""
    from triton.runtime.jit import JITFunction

    jit, interpreted = _jit(fn, interpret=False), _jit(fn, interpret=True)
    assert isinstance(jit, JITFunction) and not isinstance(interpreted, JITFunction)
    jit.run = interpreted.run
    return jit


@pytest.fixture
def as_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dynamo's view of a machine where torch supports Triton (see the module docstring)."""
    import torch._dynamo
    import torch.utils._triton

    if not GPU:
        monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Bench:
    """Triton's do_bench: the configs are timed in their order (16, then 32), and 32 is the faster."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any, quantiles: Any = None) -> list[float]:
        fn()
        self.calls += 1
        t = 2.0 if self.calls % 2 else 1.0
        return [t, t, t]


def _kernel(storage: Any, bench: Bench, jit: Any = None) -> Any:
    jit = _jit_launching_in_interpreter(_double) if jit is None else jit
    configs = [triton.Config({"B": 16}), triton.Config({"B": 32})]
    return tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=storage)(jit)


def _launcher(k: Any) -> Any:
    def f(x: Any) -> Any:
        y = torch.empty_like(x)
        k[lambda m: (triton.cdiv(x.numel(), m["B"]),)](x, y, x.numel())
        return y + 1

    return f


def _counting_run(k: Any) -> list[int]:
    """Count the launches that go through the drop-in (`kernel[grid](...)` calls an assigned `run`, as
    Triton's does), not past it to its JIT function."""
    launches: list[int] = []
    run = k.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        launches.append(1)
        return run(*args, **kwargs)

    k.run = counted
    return launches


def _hop_kernels(gm: Any) -> list[Any]:
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    return [
        kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
        for n in gm.graph.nodes
        if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target)
    ]


def _recording(backend: str, graphs: list[Any]) -> Any:
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def rec(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return inner(gm, example_inputs)

    return rec


def _tuned_eagerly(tmp_path: Path, *, interpreted: bool = False) -> tuple[Any, Bench, Any, Any, list[int]]:
    """A drop-in (of an interpreted kernel, or of a JIT function launched in the interpreter), its
    launcher called once outside torch.compile (tuned: 32 won), and the launches counted from then on."""
    bench = Bench()
    url = f"sqlite:///{tmp_path / 'w.db'}"
    k = _interpreted_kernel(url, bench) if interpreted else _kernel(url, bench)
    f = _launcher(k)
    x = torch.arange(64, dtype=torch.float32)
    assert torch.equal(f(x), x * 2 + 1) and bench.calls == 2 and k.best_config.kwargs == {"B": 32}
    return k, bench, f, x, _counting_run(k)


def _compiled_twice(f: Any, x: Any, backend: str) -> tuple[Any, Any]:
    """`torch.compile(f, fullgraph=True)` run twice on `x`: the compiled function and its one graph."""
    graphs: list[Any] = []
    g = torch.compile(f, fullgraph=True, backend=_recording(backend, graphs))
    for _ in range(2):
        assert torch.equal(g(x), x * 2 + 1)
    assert len(graphs) == 1
    return g, graphs[0]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fullgraph_compiles_the_drop_in_and_the_graph_launches_its_winner(
    as_on_a_gpu: None, tmp_path: Path, backend: str
) -> None:
    k, bench, f, x, launches = _tuned_eagerly(tmp_path)
    _, graph = _compiled_twice(f, x, backend)
    # one graph, whose kernel op is the drop-in itself: each run of it launches through tuner's hit path,
    # with the winner, and times nothing
    assert _hop_kernels(graph) == [k]
    assert len(launches) == 2 and bench.calls == 2
    assert k.best_config.kwargs == {"B": 32}


def test_a_compiled_graph_in_a_new_process_launches_the_stored_winner(
    as_on_a_gpu: None, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    first = Bench()
    x = torch.arange(64, dtype=torch.float32)
    assert torch.equal(_launcher(_kernel(url, first))(x), x * 2 + 1) and first.calls == 2
    # another process: the same kernel and store, nothing in memory; its first launch is inside the graph
    later = Bench()
    k = _kernel(url, later)
    g = torch.compile(_launcher(k), fullgraph=True, backend="aot_eager")
    assert torch.equal(g(x), x * 2 + 1)
    assert later.calls == 0 and k.best_config.kwargs == {"B": 32}
    assert k.tuner.last_choice["config"]["B"] == 32, k.tuner.last_choice


def test_a_key_first_met_inside_the_graph_is_tuned_when_the_graph_runs(
    as_on_a_gpu: None, tmp_path: Path
) -> None:
    bench = Bench()
    k = _kernel(f"sqlite:///{tmp_path / 'w.db'}", bench)
    g = torch.compile(_launcher(k), fullgraph=True, backend="aot_eager")
    x = torch.arange(64, dtype=torch.float32)
    assert torch.equal(g(x), x * 2 + 1)
    assert bench.calls == 2 and k.best_config.kwargs == {"B": 32}
    assert torch.equal(g(x), x * 2 + 1) and bench.calls == 2
    # a new key (another n) in the same graph, as dynamic shapes give it: tuned once, on real tensors
    x2 = torch.arange(40, dtype=torch.float32)
    assert torch.equal(g(x2), x2 * 2 + 1) and bench.calls == 4


def test_wrap_triton_and_triton_op_take_the_drop_in(as_on_a_gpu: None, tmp_path: Path) -> None:
    from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper

    bench = Bench()
    k = _kernel(f"sqlite:///{tmp_path / 'w.db'}", bench)
    wrapped = torch.library.wrap_triton(k)
    assert isinstance(wrapped, TraceableTritonKernelWrapper) and wrapped.kernel is k

    @torch.library.triton_op("tuner_test::double_plus", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        torch.library.wrap_triton(k)[lambda m: (triton.cdiv(x.numel(), m["B"]),)](x, y, x.numel())
        return y

    x = torch.arange(64, dtype=torch.float32)
    assert torch.equal(double(x), x * 2) and bench.calls == 2  # eager: the drop-in, tuned
    launches = _counting_run(k)
    g = torch.compile(lambda t: double(t) + 1, fullgraph=True, backend="aot_eager")
    assert torch.equal(g(x), x * 2 + 1)
    assert len(launches) == 1 and bench.calls == 2 and k.best_config.kwargs == {"B": 32}


@pytest.mark.skipif(
    not GPU,
    reason="needs a CUDA GPU (compute capability >= 7.0): Inductor compiles and launches user Triton kernels only there",
)
def test_inductor_times_the_configs_itself_and_a_custom_op_keeps_the_winner(tmp_path: Path) -> None:
    """With Inductor, the graph launches the drop-in's JIT function with the config Inductor times
    itself, as it does for triton.autotune (docs/production.md, "torch.compile"); tuner is not called.
    Called from a custom op, the drop-in launches with tuner's winner."""
    torch._dynamo.reset()
    bench = Bench()
    k = _kernel(f"sqlite:///{tmp_path / 'w.db'}", bench, _jit(_double, interpret=False))
    f = _launcher(k)
    x = torch.arange(4096, dtype=torch.float32, device="cuda")
    assert torch.equal(f(x), x * 2 + 1) and bench.calls == 2
    launches = _counting_run(k)
    g = torch.compile(f, fullgraph=True, backend="inductor")
    assert torch.equal(g(x), x * 2 + 1)
    assert len(launches) == 0 and bench.calls == 2

    @torch.library.custom_op("tuner_test::double_inductor", mutates_args=())
    def double(t: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(t)
        k[lambda m: (triton.cdiv(t.numel(), m["B"]),)](t, y, t.numel())
        return y

    @double.register_fake
    def _(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)

    h = torch.compile(lambda t: double(t) + 1, fullgraph=True, backend="inductor")
    assert torch.equal(h(x), x * 2 + 1)
    assert len(launches) == 1 and bench.calls == 2 and k.best_config.kwargs == {"B": 32}
    torch._dynamo.reset()


# ---- where torch has no Triton support: the interpreter's drop-in as one custom op ------------------------
def _interpreted_kernel(storage: Any, bench: Bench) -> Any:
    from triton.runtime.autotuner import Autotuner

    k = _kernel(storage, bench, _jit(_double, interpret=True))
    assert isinstance(k, Autotuner)
    return k


def _ops(gm: Any) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _torch_supports_triton() -> bool:
    from torch.utils._triton import has_triton

    return bool(has_triton())


# Where torch supports Triton, Dynamo takes every Autotuner (an interpreted one too) as a Triton kernel of its
# own, and fails inside on an interpreted one, for triton.autotune as for the drop-in (docs/production.md).
no_triton_support = pytest.mark.skipif(
    _torch_supports_triton(),
    reason="torch supports Triton here: Dynamo never traces the drop-in's own launch",
)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@no_triton_support
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_interpreted_drop_in_compiles_fullgraph_into_one_op_that_launches_the_winner(
    fresh_dynamo: None, tmp_path: Path, backend: str
) -> None:
    k, bench, f, x, launches = _tuned_eagerly(tmp_path, interpreted=True)
    # Old code: torch._dynamo.exc.Unsupported (Dynamo traced the hit path: `itemgetter.__call__`)
    g, graph = _compiled_twice(f, x, backend)
    assert _ops(graph).count("tuner.interpreted_launch") == 1, _ops(graph)
    assert len(launches) == 2 and bench.calls == 2 and k.best_config.kwargs == {"B": 32}
    # another size: the graph is made dynamic (or compiled again), and its new key is tuned when it runs
    x2 = torch.arange(40, dtype=torch.float32)
    assert torch.equal(g(x2), x2 * 2 + 1) and bench.calls == 4
    x3 = torch.arange(48, dtype=torch.float32)
    assert torch.equal(g(x3), x3 * 2 + 1) and bench.calls == 6
    assert torch.equal(g(x), x * 2 + 1) and bench.calls == 6


@no_triton_support
def test_an_interpreted_drop_in_without_fullgraph_is_not_broken_either(
    fresh_dynamo: None, tmp_path: Path
) -> None:
    bench = Bench()
    k = _interpreted_kernel(f"sqlite:///{tmp_path / 'w.db'}", bench)
    x = torch.arange(64, dtype=torch.float32)
    # Old code: a graph break in the hit path, then Dynamo traced the interpreter and raised there
    g = torch.compile(_launcher(k), backend="aot_eager")
    assert torch.equal(g(x), x * 2 + 1) and bench.calls == 2


def _scale(x, y, n, s, bias, B: tl.constexpr, ACT: tl.constexpr):  # noqa: ANN001, ANN202, N803
    o = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x + o, mask=o < n) * s
    if bias is not None:
        v += tl.load(bias + o, mask=o < n)
    if ACT == "relu":
        v = tl.maximum(v, 0.0)
    tl.store(y + o, v, mask=o < n)


@no_triton_support
def test_an_interpreted_drop_in_takes_run_keywords_floats_none_and_a_fixed_grid(
    fresh_dynamo: None, tmp_path: Path
) -> None:
    bench = Bench()
    configs = [triton.Config({"B": 16}), triton.Config({"B": 32})]
    k = tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=f"sqlite:///{tmp_path / 'w.db'}")(
        _jit(_scale, interpret=True)
    )

    def f(x: Any, b: Any) -> Any:
        y = torch.empty_like(x)
        k.run(x, y, x.numel(), -3.0, None, grid=(8,), ACT="relu")  # a grid for every config: 8 x 16 >= n
        z = torch.empty_like(x)
        k[lambda m: (triton.cdiv(x.numel(), m["B"]),)](x, z, x.numel(), 0.5, b, ACT="none")
        return y, z

    x = torch.arange(-32, 32, dtype=torch.float32)
    b = torch.ones(64)
    want = (torch.relu(x * -3.0), x * 0.5 + b)
    got = f(x, b)
    # two keys: the bias is None in one launch, a float32 tensor in the other (the dtypes are in the key)
    assert all(torch.equal(w, v) for w, v in zip(want, got, strict=True)) and bench.calls == 4
    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = g(x, b)
    assert all(torch.equal(w, v) for w, v in zip(want, got, strict=True)) and bench.calls == 4


@no_triton_support
def test_an_interpreted_drop_in_takes_a_float_input_that_changes_between_calls(
    fresh_dynamo: None, tmp_path: Path
) -> None:
    # Old code: the second float made Dynamo recompile with a symbolic float, which went to the op's
    # handle as a constant: torch._dynamo.exc.Unsupported ("assume_constant_result argument conversion
    # failed") under fullgraph=True.
    bench = Bench()
    configs = [triton.Config({"B": 16}), triton.Config({"B": 32})]
    k = tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=f"sqlite:///{tmp_path / 'w.db'}")(
        _jit(_scale, interpret=True)
    )

    def f(x: Any, s: float) -> Any:
        y = torch.empty_like(x)
        k[lambda m: (triton.cdiv(x.numel(), m["B"]),)](x, y, x.numel(), s, None, ACT="none")
        return y

    x = torch.arange(64, dtype=torch.float32)
    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    for s in (2.0, 3.0, 5.0):
        assert torch.equal(g(x, s), x * s), s
    assert bench.calls == 2  # one key, tuned once


@no_triton_support
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="Inductor on a CPU needs a C++ compiler",
)
def test_inductor_on_a_cpu_keeps_the_interpreted_drop_in_as_one_op_with_the_winner(
    fresh_dynamo: None, tmp_path: Path
) -> None:
    import torch._inductor.config

    k, bench, f, x, launches = _tuned_eagerly(tmp_path, interpreted=True)
    graphs: list[Any] = []
    g = torch.compile(f, fullgraph=True, backend=_recording("inductor", graphs))
    # Inductor compiles the graph's own code (`y + 1`) to C++ around the op, without first probing which
    # vector instruction sets this CPU has (a C++ build and a load in a new process per set, most of this
    # test's time), which a scalar kernel does not need.
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        assert torch.equal(g(x), x * 2 + 1)
    assert len(graphs) == 1 and _ops(graphs[0]).count("tuner.interpreted_launch") == 1, _ops(graphs[0])
    assert len(launches) == 1 and bench.calls == 2 and k.best_config.kwargs == {"B": 32}


@no_triton_support
def test_an_interpreted_drop_in_in_a_triton_op_compiles_fullgraph(fresh_dynamo: None, tmp_path: Path) -> None:
    k, bench, _, x, launches = _tuned_eagerly(tmp_path, interpreted=True)
    assert torch.library.wrap_triton(k) is k  # torch's own rule for interpreted kernels: used as it is

    @torch.library.triton_op("tuner_test::double_interpreted", mutates_args=())
    def double(t: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(t)
        torch.library.wrap_triton(k)[lambda m: (triton.cdiv(t.numel(), m["B"]),)](t, y, t.numel())
        return y

    # Old code: torch's fake-tensor run of the op launched the interpreter on FakeTensors and raised
    g = torch.compile(lambda t: double(t) + 1, fullgraph=True, backend="aot_eager")
    assert torch.equal(g(x), x * 2 + 1)
    assert len(launches) == 1 and bench.calls == 2 and k.best_config.kwargs == {"B": 32}


def _half_blocks(x, y, n, B: tl.constexpr, SUB: tl.constexpr, REP: tl.constexpr = 2):  # noqa: ANN001, ANN202, N803
    # each program writes SUB elements REP times over; the grid is sized by SUB, which is not a config value
    o = tl.program_id(0) * SUB + tl.arange(0, SUB)
    for _ in tl.static_range(REP):
        tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


@no_triton_support
@pytest.mark.parametrize(
    "case", ["heuristics_beneath", "default_constexpr", "dict_configs", "untraceable_heuristics_unread"]
)
def test_an_interpreted_drop_in_compiles_with_the_grid_meta_its_eager_launch_gets(
    fresh_dynamo: None, tmp_path: Path, case: str
) -> None:
    # The grid function gets, per config, what the launch gives it outside torch.compile (and what
    # Triton's JIT gives it on a GPU): the config's values, the values of a `@triton.heuristics` beneath
    # the autotuner and the defaults of the kernel's parameters. Old code gave it the arguments and
    # `config.kwargs` only: a KeyError while Dynamo traced ('SUB' from the heuristics, 'REP' the
    # default), and dict configs (which tuner takes for a Triton kernel) raised AttributeError ('kwargs').
    # A heuristic that Dynamo cannot trace (`data_ptr()`) is run only for a grid that reads its value.
    bench = Bench()
    url = f"sqlite:///{tmp_path / 'w.db'}"
    configs: list[Any] = [triton.Config({"B": 16}), triton.Config({"B": 32})]
    if case == "heuristics_beneath":
        inner = triton.heuristics({"SUB": lambda a: a["B"] // 2})(_jit(_half_blocks, interpret=True))
        k = tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=url)(inner)

        def grid(m: dict[str, Any]) -> tuple[int, ...]:
            return (triton.cdiv(m["n"], m["SUB"]),)
    elif case == "untraceable_heuristics_unread":
        configs = [triton.Config({"B": b, "SUB": b}) for b in (16, 32)]
        inner = triton.heuristics({"REP": lambda a: 1 + a["x"].data_ptr() % 16 // 16})(
            _jit(_half_blocks, interpret=True)
        )
        k = tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=url)(inner)

        def grid(m: dict[str, Any]) -> tuple[int, ...]:
            return (triton.cdiv(m["n"], m["SUB"]),)
    else:
        if case == "dict_configs":
            configs = [{"B": 16, "SUB": 16}, {"B": 32, "SUB": 32, "num_warps": 2}]
        else:
            configs = [triton.Config({"B": b, "SUB": b}) for b in (16, 32)]
        k = tuner.autotune(configs=configs, key=["n"], do_bench=bench, storage=url)(
            _jit(_half_blocks, interpret=True)
        )

        def grid(m: dict[str, Any]) -> tuple[int, ...]:
            return (triton.cdiv(m["n"], m["SUB"] * m["REP"] // 2),)

    def f(x: Any) -> Any:
        y = torch.zeros_like(x)
        k[grid](x, y, x.numel())
        return y + 1

    x = torch.arange(64, dtype=torch.float32)
    assert torch.equal(f(x), x * 2 + 1) and bench.calls == 2
    launches = _counting_run(k)
    g, graph = _compiled_twice(f, x, "aot_eager")
    assert _ops(graph).count("tuner.interpreted_launch") == 1, _ops(graph)
    assert len(launches) == 2 and bench.calls == 2
    x2 = torch.arange(40, dtype=torch.float32)  # a new key, tuned when the graph runs
    assert torch.equal(g(x2), x2 * 2 + 1) and bench.calls == 4
