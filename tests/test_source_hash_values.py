"""The source hash covers what a launcher's behaviour depends on beyond its own text: the values of the
closure cells and globals its source names, its default argument values and a partial's bound
arguments. Two launchers with one qualname and one source that a factory builds around different
values (an op, a Pallas op, an epsilon, a block shape, a dtype) are two store entries: the second
tunes instead of being served the first one's config. Equal values in a new object, or in a new
process with another string hash seed, find the entry again (no address, id or set order in the hash);
a global that the code itself reassigns (`global`) is state, not code, and does not count."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import operator
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tuner
from tests._env import repo_pythonpath  # noqa: E402
from tests.test_runtime_source_hash import load_copy
from tuner.runtime._source import _Values, code_hash

CONFIGS = [{"a": 1}, {"a": 2}]


def _bench(call: Callable[[], Any]) -> float:
    call()
    return 1.0


class Mode(enum.Enum):
    FAST = 1
    EXACT = 2


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    block_q: int
    block_k: int


def _pallas_op(name: str) -> Callable[[], Any]:
    def load() -> Any:
        mod = pytest.importorskip(f"jax.experimental.pallas.ops.gpu.{name}")
        return getattr(mod, name)

    return load


# (first value, a different value, a value equal to the first in a new object), each made when the test
# runs; the factory's launcher is the same text around each.
VALUE_PAIRS: dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]] = {
    "library function": (lambda: operator.add, lambda: operator.mul, lambda: operator.add),
    "pallas op": (_pallas_op("layer_norm"), _pallas_op("rms_norm"), _pallas_op("layer_norm")),
    "partial": (
        lambda: functools.partial(operator.add, 1),
        lambda: functools.partial(operator.add, 2),
        lambda: functools.partial(operator.add, 1),
    ),
    "epsilon": (lambda: 1e-5, lambda: 1e-6, lambda: float("1e-5")),
    "block shape": (lambda: (8, 16), lambda: (16, 8), lambda: tuple([8, 16])),
    "dtype": (lambda: np.dtype("float32"), lambda: np.dtype("float16"), lambda: np.dtype(np.float32)),
    "enum": (lambda: Mode.FAST, lambda: Mode.EXACT, lambda: Mode(1)),
    "frozen dataclass": (lambda: BlockSizes(64, 32), lambda: BlockSizes(32, 64), lambda: BlockSizes(64, 32)),
}


def closure_factory(v: Any) -> Any:
    @tuner.autotune(configs=CONFIGS, key=lambda x: {"n": x}, bench=_bench)
    def f(x, *, a):
        return x * a if v is not None else x

    return f


def default_factory(v: Any) -> Any:
    @tuner.autotune(configs=CONFIGS, key=lambda x: {"n": x}, bench=_bench)
    def f(x, *, a, v=v):
        return x * a if v is not None else x

    return f


@pytest.mark.parametrize("factory", [closure_factory, default_factory], ids=["closure", "default"])
@pytest.mark.parametrize("case", list(VALUE_PAIRS))
def test_launchers_a_factory_builds_around_different_values_are_different_entries(factory, case):
    first, other, equal = (make() for make in VALUE_PAIRS[case])
    f1 = factory(first)
    f1(3)
    assert f1.tuner.stats["tuned"] == 1
    f2 = factory(other)  # same qualname and source, another value: tuned, not served f1's entry
    f2(3)
    assert f2.tuner.stats["tuned"] == 1 and f2.tuner.stats["from_store"] == 0
    assert "kernel source changed" in (f2.tuner.last_miss_reason or "")
    f3 = factory(equal)  # an equal value (a new object where it can be one): f1's entry
    f3(3)
    assert f3.tuner.stats["tuned"] == 0 and f3.tuner.stats["from_store"] == 1
    assert f3.tuner.source_hash == f1.tuner.source_hash != f2.tuner.source_hash


@pytest.mark.parametrize("factory", [closure_factory, default_factory], ids=["closure", "default"])
def test_torch_tracing_tensors_hash_as_the_tensors_they_stand_for(factory):
    """A launcher built where torch traces (torch.compile's and torch.export's fake propagation, a
    FakeTensorMode, functionalization), around a FakeTensor or FunctionalTensor, is the kernel built
    around a real tensor (by type: `torch.Tensor`, `nn.Parameter` for a parameter's), so that its first
    miss there finds that kernel's entries; the old code hashed them by their subclass: another kernel."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    real = factory(torch.ones(3)).tuner.source_hash
    param = factory(torch.nn.Parameter(torch.ones(3))).tuner.source_hash
    assert real != param
    values = _Values(lambda o: False, [])
    with FakeTensorMode() as mode:
        fake, fake_param = (
            mode.from_tensor(torch.ones(3)),
            mode.from_tensor(torch.nn.Parameter(torch.ones(3))),
        )
        assert type(fake).__name__ == "FakeTensor"
        assert factory(fake).tuner.source_hash == real  # taken inside the mode, as a first miss there
        assert factory(fake_param).tuner.source_hash == param
        assert values.text(fake, "w") == values.text(torch.ones(3), "w") == "<torch.Tensor>"
    with FunctionalTensorMode():
        functional = torch.ones(3)
        assert type(functional).__name__ == "FunctionalTensor"
        assert factory(functional).tuner.source_hash == real
    assert factory(functional).tuner.source_hash == real  # and outside the mode


def test_a_launcher_built_under_fake_tensors_finds_the_eager_tuning():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    def build(w):  # a layer's launcher closing over its weight, made where it is used
        @tuner.autotune(configs=CONFIGS, key=lambda x: {"n": x.shape[0]}, bench=_bench)
        def scaled(x, *, a):
            return x * w * a

        return scaled

    eager = build(torch.ones(4))
    eager(torch.ones(4))
    assert eager.tuner.stats["tuned"] == 1
    with FakeTensorMode() as mode:  # torch.compile's fake propagation: a fake weight, a fake input
        fake = build(mode.from_tensor(torch.ones(4)))
        fake(mode.from_tensor(torch.ones(4)))
    # one kernel: its untimed choice is the eager tuning's entry (the old code hashed the closure's
    # FakeTensor by its type, another kernel with no entry: the space default)
    assert fake.tuner.source_hash == eager.tuner.source_hash
    assert fake.tuner.last_choice["config"] == eager.tuner.last_choice["config"]
    assert "exact entry in the store" in fake.tuner.last_choice["why"]


def _scaled(x, *, shape, a):
    return x * a


def test_a_partial_launcher_counts_its_bound_arguments():
    """Its stored name shows a tuple argument by its type only (`_scaled(shape=tuple)`): the hash tells
    the two block shapes apart."""

    def make(shape: tuple[int, int]) -> Any:
        return tuner.autotune(configs=CONFIGS, key=lambda x: {"n": x}, bench=_bench)(
            functools.partial(_scaled, shape=shape)
        )

    p1, p2, p3 = make((8, 16)), make((16, 8)), make((8, 16))
    assert p1.tuner.name == p2.tuner.name == f"{__name__}._scaled(shape=tuple)"
    p1(3)
    p2(3)
    p3(3)
    assert p2.tuner.stats["tuned"] == 1 and p2.tuner.stats["from_store"] == 0
    assert p3.tuner.stats["tuned"] == 0 and p3.tuner.stats["from_store"] == 1


ALIAS_MODULE = textwrap.dedent(
    """
    import operator

    import tuner

    op = OP
    EPS = 1e-5


    def _bench(call):
        call()
        return 1.0


    @tuner.autotune(configs=[{"a": 1}, {"a": 2}], key=lambda x: {"n": x}, bench=_bench)
    def launch(x, *, a):
        return op(x, a) + EPS
    """
)


def test_editing_a_global_alias_makes_the_old_entries_stale(tmp_path):
    """`op = operator.add` edited to `op = operator.mul` (as `op = layer_norm` to `op = rms_norm`): the
    launcher's text is unchanged, its behaviour is not."""
    name = "tuner_srcval_alias"
    try:
        add = load_copy(tmp_path, "add", ALIAS_MODULE.replace("OP", "operator.add"), name)
        assert add.launch(3) == 4 + 1e-5 and add.launch.tuner.stats["tuned"] == 1
        again = load_copy(tmp_path, "again", ALIAS_MODULE.replace("OP", "operator.add"), name)
        again.launch(3)
        assert again.launch.tuner.stats["from_store"] == 1
        mul = load_copy(tmp_path, "mul", ALIAS_MODULE.replace("OP", "operator.mul"), name)
        assert mul.launch(3) == 3 + 1e-5
        assert mul.launch.tuner.stats["tuned"] == 1 and mul.launch.tuner.stats["from_store"] == 0
        assert "kernel source changed" in (mul.launch.tuner.last_miss_reason or "")
        eps = load_copy(
            tmp_path, "eps", ALIAS_MODULE.replace("OP", "operator.add").replace("1e-5", "1e-6"), name
        )
        assert eps.launch.tuner.source_hash != add.launch.tuner.source_hash
    finally:
        sys.modules.pop(name, None)


STATE_MODULE = textwrap.dedent(
    """
    _calls = 0
    _ready = False


    def _count():
        global _calls, _ready
        _calls += 1
        _ready = True


    def launch(x, *, a):
        _count()
        return x * a if _ready or _calls >= 0 else x
    """
)


def test_a_global_the_code_reassigns_is_state_not_code(tmp_path):
    """A counter or flag that the launcher's own code updates (`global`) would make the hash depend on
    when the first miss happens; it is left out, so the hash is the same before and after a call."""
    name = "tuner_srcval_state"
    try:
        mod = load_copy(tmp_path, "state", STATE_MODULE, name)
        before = code_hash(mod.launch)
        mod.launch(3, a=2)
        assert (mod._calls, mod._ready) == (1, True)
        assert code_hash(mod.launch) == before
    finally:
        sys.modules.pop(name, None)


NEW_PROCESS_MODULE = textwrap.dedent(
    """
    import enum
    import functools
    import operator

    import numpy as np

    import tuner

    TABLE = np.arange(1000.0)  # an array: by its type only
    NAMES = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"})


    class Mode(enum.Enum):
        FAST = 1


    class Holder:  # an object whose repr holds its address
        pass


    def _bench(call):
        call()
        return 1.0


    def make(op, sentinel):
        @tuner.autotune(configs=[{"a": 1}, {"a": 2}], key=lambda x: {"n": x}, bench=_bench)
        def launch(x, *, a, dtype=np.dtype("float32"), mode=Mode.FAST, combine=functools.partial(operator.add, 0)):
            assert sentinel is not None and len(NAMES) == 8 and TABLE.shape == (1000,)
            return combine(op(x, a))

        return launch


    launch = make(operator.mul, Holder())
    """
)

SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    sys.path.insert(0, sys.argv[1])
    import tuner_srcval_proc as mod

    mod.launch(3)
    print(json.dumps({"stats": mod.launch.tuner.stats, "hash": mod.launch.tuner.source_hash}))
    """
)


def test_the_hash_is_the_same_in_a_new_process(tmp_path, _tuner_home):
    """Two processes with different string hash seeds (set order) and addresses: the second finds the
    first one's entry, and both hash as this process does."""
    (tmp_path / "tuner_srcval_proc.py").write_text(NEW_PROCESS_MODULE, encoding="utf-8")
    outs = []
    for seed in ("1", "2"):
        env = {
            **os.environ,
            "PYTHONPATH": repo_pythonpath(),
            "PYTHONHASHSEED": seed,
            "TUNER_HOME": str(_tuner_home),
        }
        p = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            encoding="utf-8",
        )
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert outs[0]["stats"]["tuned"] == 1
    assert outs[1]["stats"]["tuned"] == 0 and outs[1]["stats"]["from_store"] == 1
    sys.path.insert(0, str(tmp_path))
    try:
        import tuner_srcval_proc as mod  # type: ignore[import-not-found]

        assert code_hash(mod.launch.tuner.fn) == outs[0]["hash"] == outs[1]["hash"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tuner_srcval_proc", None)


def test_large_values_are_described_in_bounded_text():
    """A big constant in a closure counts by its type and length, and a deep or wide one stops at the
    describer's budget: the first miss never walks or prints it whole."""
    values = _Values(lambda o: False, [])
    assert values.text(tuple(range(10**6)), "t") == "<builtins.tuple of length 1000000>"
    assert values.text("x" * 10**7, "s") == "<str of length 10000000>"
    assert values.text(10**5000, "n").startswith("<int of ")
    wide = tuple(tuple(range(200)) for _ in range(200))  # 40,000 items, past the budget
    assert len(values.text(wide, "w")) < 100_000
    big = np.zeros(10**6)

    def make():
        def launch(x, *, a):
            return big[:1] * a + wide[0][0]

        return launch

    assert code_hash(make()) == code_hash(make())


def test_the_hash_is_taken_on_the_first_miss_only(monkeypatch):
    """Describing values adds work to the hash, never to the hit path: nothing at decoration, one hash
    on the first miss, none on hits or on the misses of other keys."""
    import tuner.runtime._source as source

    calls: list[int] = []
    real = source.code_hash
    monkeypatch.setattr(source, "code_hash", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    f = closure_factory(BlockSizes(64, 32))
    assert calls == []
    f(3)
    assert len(calls) == 1
    for _ in range(10):
        f(3)
    f(4)
    assert len(calls) == 1 and f.tuner.stats["tuned"] == 2
