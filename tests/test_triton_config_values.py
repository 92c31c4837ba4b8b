"""The values real Triton code puts in `triton.Config` kwargs, against `triton.autotune` under the
interpreter: tuples, nested tuples, `tl.dtype`s, torch dtypes, enum members, infinite floats, ints beyond a
float's range, numpy scalars, and configs that `triton.Config.__eq__` counts as one (True, 1, 1.0). Each
decorator gets the same fake `do_bench` that makes one config the fastest; the kernel records the value it
was launched with. The drop-in launches what Triton launches, and its store and cache file give the same
object back in another process (docs/api.md, `tuner.autotune`)."""

from __future__ import annotations

import enum
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
np = pytest.importorskip("numpy")

import tuner  # noqa: E402
from tests._env import repo_pythonpath  # noqa: E402
from tests.test_triton_autotuner_class import Bench  # noqa: E402

IMPLS = ["triton", "tuner"]
SEEN: list = []


def seen(x):
    SEEN.append(x)
    return x


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def launched(impl, values, times):
    """(the X the kernel ran with, best_config's X, do_bench calls) for configs X=values."""
    deco = triton.autotune if impl == "triton" else tuner.autotune
    bench = Bench(times)

    @deco(configs=[triton.Config({"BLOCK": 16, "X": v}) for v in values], key=["N"], do_bench=bench)
    @triton.jit
    def record(dst, N, BLOCK: tl.constexpr, X: tl.constexpr):
        seen(X)
        offs = tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.full([BLOCK], 1, tl.float32), mask=offs < N)

    SEEN.clear()
    record[(1,)](torch.zeros(16), 16)
    return SEEN[-1], record.best_config.kwargs["X"], bench.calls


OBJECTS = {
    "tuple": [(16, 32), (64, 128)],
    "nested tuple": [((1, 2), 3), ((4, 5), 6)],
    "tl.dtype": [tl.float32, tl.bfloat16],
    "torch.dtype": [torch.float32, torch.bfloat16],
    "enum": [Color.RED, Color.BLUE],
    "inf": [0.0, float("-inf")],
    "beyond a float": [1, 2**1100],
}


@pytest.mark.parametrize("case", list(OBJECTS))
def test_a_value_a_space_cannot_hold_is_launched_as_triton_launches_it(case):
    """Was: a TypeError from json ("Object of type dtype is not JSON serializable") at decoration, or a
    ValueError at the first launch for a tuple, where Triton times both configs and launches the faster."""
    values = OBJECTS[case]
    want = launched("triton", values, [5.0, 1.0])
    got = launched("tuner", values, [5.0, 1.0])
    assert want[0] is values[1] or want[0] == values[1]
    assert got == want
    assert type(got[0]) is type(values[1]) and type(got[1]) is type(values[1])


def test_numpy_scalars_are_launched_as_the_python_values_they_hold():
    """Was: "Object of type int64 is not JSON serializable" at decoration."""
    for values in (
        [np.int64(16), np.int64(32)],
        [np.float32(0.5), np.float32(0.25)],
        [np.bool_(0), np.bool_(1)],
    ):
        want = launched("triton", values, [5.0, 1.0])
        got = launched("tuner", values, [5.0, 1.0])
        assert got[0] == want[0] == values[1] and type(got[0]) is type(values[1].item())
        assert got[1] is values[1]  # best_config: the config given


@pytest.mark.parametrize("values", [[True, 1], [1, True], [1, 1.0]], ids=["True,1", "1,True", "1,1.0"])
def test_configs_triton_counts_as_one_are_one_candidate(values):
    """`triton.Config.__eq__` compares values with `==`: Triton's timings (a dict keyed by config) keep the
    first of such configs, which it launches whichever was faster. Was: the drop-in raised "config 1
    duplicates config 0" at the launch for 1 and 1.0, and launched 1 where Triton launched True."""
    want = launched("triton", values, [5.0, 1.0])
    got = launched("tuner", values, [5.0, 1.0])
    assert got[:2] == want[:2] and type(got[0]) is type(want[0]) is type(values[0])
    assert got[2] == 1  # timed once, as a config listed twice is


@pytest.mark.parametrize(
    "bad, says",
    [([1, 2], "unhashable (list)"), (lambda x: x, "memory address")],
    ids=["list", "function"],
)
def test_a_value_no_store_can_hold_is_refused_at_decoration_naming_the_config(bad, says):
    """Was: a list was refused at the first launch (and a function by json's TypeError at decoration)."""
    configs = [triton.Config({"BLOCK": 16, "X": 0}), triton.Config({"BLOCK": 32, "X": bad})]
    with pytest.raises(ValueError, match=r"config 1 \(\{'BLOCK': 32, 'X': ") as e:

        @tuner.autotune(configs=configs, key=["N"])
        @triton.jit
        def k(dst, N, BLOCK: tl.constexpr, X: tl.constexpr):
            pass

    assert says in str(e.value) and "X=" in str(e.value)


@pytest.mark.parametrize(
    "bad, hint",
    [([1], "a tuple in place of the list"), ({"x": 1}, "in place of the dict"), ({1}, "sorted tuple")],
    ids=["list", "dict", "set"],
)
def test_an_unhashable_value_of_a_plain_functions_dict_config_gets_a_hint_for_its_type(bad, hint):
    """Was: a dict (or set) value was told to "give a tuple in place of a list", and a plain function's
    dict configs (no Triton kernel) were told about triton.autotune alone."""

    def f(n, *, b):
        return 1.0

    with pytest.raises(ValueError, match="unhashable") as e:
        tuner.autotune(configs=[{"b": bad}, {"b": 0}], key=["n"])(f)
    assert hint in str(e.value), e.value


class Mode:
    """A user's constexpr value whose repr does not show what tells two of them apart."""

    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return "Mode"

    def __eq__(self, other):
        return isinstance(other, Mode) and other.v == self.v

    def __hash__(self):
        return hash(self.v)


def test_configs_whose_values_differ_under_one_repr_are_refused_naming_both():
    """Two unequal values of one class and one repr were one string in the space: the drop-in launched the
    first config's value for both (Triton times both), and a stored winner could not say which won."""
    configs = [triton.Config({"BLOCK": 16, "X": Mode(1)}), triton.Config({"BLOCK": 16, "X": Mode(2)})]
    with pytest.raises(ValueError, match=r"config 0 \(.*\) and config 1 \(.*\) hold X values that differ"):

        @tuner.autotune(configs=configs, key=["N"])
        @triton.jit
        def k(dst, N, BLOCK: tl.constexpr, X: tl.constexpr):
            pass

    # equal values under one repr are one config, as Triton's `==` makes them
    got = launched("tuner", [Mode(1), Mode(1)], [5.0, 1.0])
    assert got[0] == Mode(1) and got[2] == 1


def _make_enum():
    class Color(enum.Enum):  # a class of one module and qualname, made anew at each call
        RED = 1

    return Color


@pytest.mark.parametrize(
    "first, second",
    [(Mode(1), Mode(2)), (_make_enum().RED, _make_enum().RED)],
    ids=["equal reprs", "enums of one name"],
)
def test_a_kernel_launches_its_own_object_not_another_kernels_of_the_same_repr(first, second):
    """The table of objects was one for the process, keyed by type and repr, filled by the first kernel
    decorated: a second kernel's config launched the first kernel's object."""
    assert repr(first) == repr(second) and first != second
    got1 = launched("tuner", [first, 3], [1.0, 5.0])
    got2 = launched("tuner", [second, 3], [1.0, 5.0])
    assert got1[0] is first and got1[1] is first
    assert got2[0] is second and got2[1] is second


def test_a_single_config_is_launched_with_what_it_holds():
    """One config is never tuned or stored (as in Triton): a list in it is launched as it is."""
    value = [1, 2]

    @tuner.autotune(configs=[triton.Config({"BLOCK": 16, "X": value})], key=["N"])
    @triton.jit
    def one(dst, N, BLOCK: tl.constexpr, X: tl.constexpr):
        seen(X)

    SEEN.clear()
    one[(1,)](torch.zeros(16), 16)
    assert SEEN[-1] == value


_WORKER = """
import enum, os, sys
import torch, triton, triton.language as tl, tuner

class Color(enum.Enum):
    RED = 1
    BLUE = 2

SEEN = []
def seen(x):
    SEEN.append(x)

VALUES = [(tl.float32, (1, 2), Color.RED, float("-inf")), (tl.bfloat16, ((3, 4), 5), Color.BLUE, 0.5)]
times = iter([5.0, 1.0])

def bench(call, quantiles):
    assert sys.argv[1] == "tune", "timed in a process that should read the winner"
    call()
    t = next(times)
    return [t, t, t]

def check():
    configs = [triton.Config({"BLOCK": 16, "A": a, "B": b, "C": c, "D": d}) for a, b, c, d in VALUES]

    @tuner.autotune(configs=configs, key=["N"], do_bench=bench)
    @triton.jit
    def k(dst, N, BLOCK: tl.constexpr, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
        seen((A, B, C, D))

    k[(1,)](torch.zeros(16), 16)
    got = SEEN[-1]
    assert got == VALUES[1], got
    assert [type(x) for x in got] == [type(x) for x in VALUES[1]], got
    assert k.best_config is configs[1]

for home in sys.argv[2:]:
    os.environ["TUNER_HOME"] = home
    check()
print("ok")
"""


def test_objects_come_back_from_the_store_and_a_cache_file_in_another_process(tmp_path, _tuner_home):
    """The winner's tl.dtype, nested tuple, enum member and float come back as themselves in another
    process, from the SQLite store and from `tuner cache export` JSON imported into another store (the
    strings docs/api.md describes). Was: "Object of type dtype is not JSON serializable" at decoration."""
    from tuner.cli import main

    script = tmp_path / "worker.py"
    script.write_text(_WORKER, encoding="utf-8")

    def run(phase, *homes):
        env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
        p = subprocess.run(
            [sys.executable, str(script), phase, *map(str, homes)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            encoding="utf-8",
        )
        assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]

    run("tune", _tuner_home)
    out = tmp_path / "cache.json"
    assert main(["cache", "export", "--out", str(out)]) == 0
    (entry,) = json.loads(out.read_text(encoding="utf-8"))["entries"]
    assert entry["config"]["A"] == "<object triton.language.core.dtype triton.language.bfloat16>"
    assert entry["config"]["B"] == "<object tuple ((3, 4), 5)>"
    other = tmp_path / "other_home"
    other.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_HOME", str(other))
        assert main(["cache", "import", str(out)]) == 0
    run("read", _tuner_home, other)
