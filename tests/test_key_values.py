"""`@tuner.autotune`'s key values and key/space functions: numpy scalars and 0-d numpy arrays key as the
Python numbers they hold, 0-d device arrays are refused (the Triton drop-in keys them by value, as
before), a bad `key` and a function that cannot take the call's arguments raise errors that say what is
accepted."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.cli import main
from tuner.runtime import ConfigCache

SPACE = SearchSpace([PowerOfTwo("block", 16, 64)])


def _make(key=("n",), space=SPACE):
    calls = []

    def bench(call):
        calls.append(1)
        return call()

    @tuner.autotune(space, key=list(key) if isinstance(key, tuple) else key, bench=bench, budget=3)
    def kernel(x, n, *, block):
        return 1e-3 * (1 + abs(math.log2(block) - 5))

    return kernel, calls


@pytest.mark.parametrize(
    ("np_value", "py_value"),
    [
        (np.int64(8), 8),
        (np.int32(8), 8),
        (np.float32(0.5), 0.5),
        (np.float64(2.0), 2.0),
        (np.bool_(True), True),
    ],
)
def test_a_numpy_scalar_key_value_is_the_python_entry(_tuner_home: Path, np_value, py_value):
    k, calls = _make()
    k(None, py_value)
    tuned = len(calls)
    k(None, np_value)  # np.prod(shape), x.shape[0] of a numpy array: the same entry, not tuned again
    assert len(calls) == tuned
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict == {"n": py_value} and type(entry.key.fields_dict["n"]) is type(py_value)
    assert entry.key.dtypes == () and "numpy" not in entry.key.versions_dict
    assert k.explain(None, np_value).startswith("hit")
    assert k.tuner.full_key((None, np_value), {}) == k.tuner.full_key((None, py_value), {})


def test_a_numpy_scalar_first_then_python_is_one_entry_too(_tuner_home: Path):
    k, calls = _make(key=lambda x, n: {"n": n})  # a key function's argument: no dtype either
    k(None, np.prod([2, 4]))
    tuned = len(calls)
    k(None, 8)
    assert len(calls) == tuned and len(ConfigCache().entries()) == 1


@pytest.mark.parametrize("bad", [np.float32("nan"), np.float64("inf"), np.float32("-inf"), float("nan")])
def test_a_non_finite_numpy_key_value_is_refused_as_a_python_float_is(_tuner_home: Path, bad):
    k, _ = _make()
    with pytest.raises(ValueError, match="key field n=.* is not finite"):
        k(None, bad)


def _counting_full(monkeypatch, k):
    """The number of stored keys `k` builds from now on (one per call that takes the whole miss path)."""
    built = []
    full = k.tuner.keys.full
    monkeypatch.setattr(k.tuner.keys, "full", lambda a, kw: (built.append(1), full(a, kw))[1])
    return built


@pytest.mark.parametrize(
    ("np_value", "py_value"),
    [(np.array(8), 8), (np.array(8, np.int32), 8), (np.array(0.5, np.float32), 0.5), (np.array(True), True)],
)
def test_a_0d_numpy_array_key_value_is_the_python_entry_and_hits_in_memory(
    _tuner_home: Path, monkeypatch, np_value, py_value
):
    # A 0-d numpy array holds its scalar in host memory, as a numpy scalar does: it counts as the Python
    # value (before, it kept its dtype, a second entry, and, unhashable, took the whole miss path at
    # every call: the stored key built, the lock taken, the resolution chain walked)
    k, calls = _make()
    k(None, py_value)
    tuned = len(calls)
    built = _counting_full(monkeypatch, k)
    for _ in range(3):
        k(None, np_value)
        k(None, n=np_value)
    assert len(calls) == tuned  # not tuned again
    assert len(built) <= 2  # one miss per form of call (positional, keyword), then in-memory hits
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict == {"n": py_value} and type(entry.key.fields_dict["n"]) is type(py_value)
    assert entry.key.dtypes == () and "numpy" not in entry.key.versions_dict
    assert k.tuner.full_key((None, np_value), {}) == k.tuner.full_key((None, py_value), {})
    assert k.explain(None, np_value).startswith("hit")


def test_a_0d_numpy_array_from_a_key_function_hits_in_memory(_tuner_home: Path, monkeypatch):
    k, calls = _make(key=lambda x, n: {"n": n})
    k(None, np.array(8))
    built = _counting_full(monkeypatch, k)
    k(None, np.array(8))
    assert not built  # an in-memory hit
    k(None, 8)
    assert len(calls) == 3 and len(ConfigCache().entries()) == 1  # tuned once, one entry


def test_a_0d_torch_tensor_key_value_is_refused(_tuner_home: Path):
    torch = pytest.importorskip("torch")
    k, calls = _make()
    with pytest.raises(TypeError, match=r"key field 'n' is a 0-d torch array.*int\(n\)"):
        k(None, torch.tensor(8))
    assert not calls and not k.tuner.mem  # nothing tuned, no tensor kept in memory
    # as an argument not named in key it is an array argument: its dtype is in the key, its value not
    ck = k.tuner.full_key((torch.tensor(3), 8), {})
    assert ck.fields_dict == {"n": 8} and ck.dtypes == ("int64",)


def _drop_in_double():
    """The Triton drop-in over a kernel `double(x, y, s, n)` (y = 2 x), keyed on `s`."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @tuner.autotune(configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["s"])
    @triton.jit
    def double(x, y, s, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        m = i < n
        tl.store(y + i, tl.load(x + i, mask=m) * 2, mask=m)

    return double


def test_the_triton_drop_in_keys_a_0d_tensor_by_its_value_as_before(_tuner_home: Path):
    # Triton's autotune accepts any key value; the drop-in keys a 0-d tensor by the value it holds (the
    # refusal above is `tuner.autotune`'s, whose keys are documented as Python scalars)
    torch = pytest.importorskip("torch")
    double = _drop_in_double()
    x = torch.arange(40, dtype=torch.float32)
    y = torch.empty_like(x)
    double[(3,)](x, y, torch.tensor(3.0), 40)
    assert torch.equal(y, x * 2)
    assert len(double.cache) == 1


def test_the_triton_drop_in_keys_a_0d_numpy_array_as_the_python_value(_tuner_home: Path, monkeypatch):
    # as `tuner.autotune` does (before, it kept the array's dtype: a second tuning of what `3` had tuned)
    torch = pytest.importorskip("torch")
    double = _drop_in_double()
    x = torch.arange(40, dtype=torch.float32)
    grid = (3,)
    double[grid](x, torch.empty_like(x), 3, 40)
    built = _counting_full(monkeypatch, double)
    for _ in range(3):
        y = torch.empty_like(x)
        double[grid](x, y, np.array(3), 40)
        assert torch.equal(y, x * 2)
    assert double.tuner.stats["tuned"] == 1
    assert len(built) <= 1  # the first call with the array, then in-memory hits
    [entry] = ConfigCache().entries()
    assert entry.key.fields_dict["s"] == 3 and "int64" not in entry.key.dtypes


def test_a_0d_jax_array_key_value_is_refused(_tuner_home: Path):
    jnp = pytest.importorskip("jax.numpy")
    k, _ = _make()
    with pytest.raises(TypeError, match="key field 'n' is a 0-d jax"):
        k(None, jnp.int32(8))


@pytest.mark.parametrize("key", [5, 2.5, [1, 2], 3j])
def test_a_key_of_another_form_says_what_is_accepted(key):
    with pytest.raises(
        TypeError, match=r"key must be a list of argument names, one argument name, or a function"
    ):
        tuner.autotune(SPACE, key=key)


def test_a_key_function_that_cannot_take_the_arguments_is_refused_when_decorated():
    with pytest.raises(
        TypeError, match=r"the key function of .*kernel cannot take the call's arguments .*x, n"
    ):

        @tuner.autotune(SPACE, key=lambda n: {"n": n})
        def kernel(x, n, *, block):
            return 0.0


def test_a_key_function_taking_the_arguments_by_name_or_rest_is_accepted(_tuner_home: Path):
    for key in (lambda x, n: {"n": n}, lambda *, x, n: {"n": n}, lambda x, *a, **k: {"r": 1}):
        tuner.autotune(SPACE, key=key, storage=False)(lambda x, n, *, block: 0.0)


def test_a_key_function_for_calls_that_pass_some_arguments_by_keyword_is_accepted(_tuner_home: Path):
    """A call may pass the first arguments positionally and the others by keyword (`k(x, n=3)`), and a
    key function may be written for such calls only (`x` positional-only, `n` in `**kw`): it is no key
    function that cannot take the call's arguments. Was: refused when decorated, the check trying every
    argument positional or every argument by keyword only."""
    k, calls = _make(key=lambda x, /, **kw: {"n": kw["n"]})
    k(None, n=3)
    k(None, n=3)
    assert len(calls) == 3  # tuned once (budget 3), then a hit


def test_a_key_function_refused_at_the_first_call_says_how_it_is_called(_tuner_home: Path):
    k, _ = _make(key=lambda x, n: {"n": n})
    with pytest.raises(
        TypeError, match=r"key function of .* cannot take the call's arguments.*positional or keyword"
    ):
        k(x=None, m=3)


def test_a_space_function_that_cannot_take_the_arguments_says_so(_tuner_home: Path):
    k, _ = _make(space=lambda n: SPACE)
    with pytest.raises(TypeError, match=r"the space function of .* cannot take the call's arguments"):
        k(None, 8)


def test_a_type_error_inside_a_key_function_keeps_its_own_message(_tuner_home: Path):
    k, _ = _make(key=lambda x, n: {"n": n + "a"})
    with pytest.raises(TypeError, match="unsupported operand") as info:
        k(None, 8)
    assert "raised by the key function" in "".join(getattr(info.value, "__notes__", []))


def test_cache_export_with_an_empty_store_says_so_in_one_spaced_line(
    _tuner_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["cache", "export", "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert "no cache entry (tune or import first)" in err and "  " not in err


# A launcher that takes its arrays as `*args` and its sizes by keyword only (`def f(*arrays, n, block)`,
# as code that sums or concatenates any number of inputs writes it): the key names a keyword-only
# parameter, which the call can only give by keyword (or leave to its default). It was read from the
# positional arguments by its place in the parameter list, so `f(a, b, n=32)` keyed as n=a.
@pytest.mark.parametrize("lead", [False, True])
def test_a_keyword_only_key_after_var_positional_is_read_from_the_keyword(_tuner_home: Path, lead):
    timed = []

    def bench(call):
        timed.append(1)
        call()
        return 1e-3

    if lead:

        @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=["n", "scale"], bench=bench)
        def f(first, *xs, n, scale=2, block):
            return first + sum(xs) * scale + n

        def call(n, scale=None):
            return f(1, 5, 7, n=n) if scale is None else f(1, 5, 7, n=n, scale=scale)

    else:

        @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=["n", "scale"], bench=bench)
        def f(*xs, n, scale=2, block):
            return xs[0] + sum(xs[1:]) * scale + n

        def call(n, scale=None):
            return f(1, 5, 7, n=n) if scale is None else f(1, 5, 7, n=n, scale=scale)

    assert call(32) == 1 + 12 * 2 + 32
    assert f.tuner.last_choice["key"]["key"] == {"n": 32, "scale": 2}
    assert call(64, 3) == 1 + 12 * 3 + 64
    assert f.tuner.last_choice["key"]["key"] == {"n": 64, "scale": 3}
    assert len(timed) == 4  # two keys, two configs each
    assert call(32) == 1 + 12 * 2 + 32  # a hit, in memory
    assert len(timed) == 4


@pytest.mark.parametrize("form", ["tuner", "triton_keywords"])
def test_a_keyword_only_restore_name_after_var_positional_restores_that_array(_tuner_home: Path, form):
    """`restore=` (or Triton's `restore_value=`) naming a keyword-only parameter after `*arrays` restores
    the array given by that keyword between the timed runs (the positional array at its place in the
    parameter list was taken instead, so each timed run added to `out` again), and a prune function's
    named arguments (Triton's `nargs`: the positional ones by name) name none of the `*arrays`."""
    nargs = []

    def prune(configs, named, **kw):
        nargs.append(sorted(named))
        return configs

    opts = (
        {"restore": "out", "bench": lambda c: c() or 1e-3}
        if form == "tuner"
        else {
            "restore_value": ["out"],
            "do_bench": lambda c, quantiles=None: c() or [1.0] * 3,
            "prune_configs_by": {"early_config_prune": prune},
        }
    )

    @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=["n"], **opts)
    def accumulate(first, *xs, out, n, block):
        for x in (first, *xs):
            out += x[:n]

    a, b, out = np.ones(4), np.full(4, 2.0), np.zeros(4)
    accumulate(a, b, out=out, n=4)
    np.testing.assert_array_equal(out, np.full(4, 3.0))
    np.testing.assert_array_equal(b, np.full(4, 2.0))
    assert accumulate.tuner.last_choice["key"]["key"] == {"n": 4}
    assert nargs == ([] if form == "tuner" else [["first"]])


@dataclasses.dataclass(frozen=True)
class _AttnConfig:  # a static config object, as passed through jax.jit(static_argnames=...)
    heads: int
    causal: bool


class _Window(NamedTuple):
    left: int
    right: int


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ((128, 64), "{'block_shape_0': block_shape[0], 'block_shape_1': block_shape[1]}"),
        ([128], "{'block_shape_0': block_shape[0]}"),
        (_Window(-1, 0), "{'left': block_shape.left, 'right': block_shape.right}"),
        (_AttnConfig(8, True), "{'heads': block_shape.heads, 'causal': block_shape.causal}"),
    ],
)
def test_a_key_value_made_of_parts_says_how_to_key_on_them(value, hint):
    # Before: only "a key value must be an int, float, str, bool or None", with no way forward shown for
    # the static tuples and config objects that jax code passes (block_shape=(128, 64), a frozen config).
    @tuner.autotune(SPACE, key=["block_shape"], bench=lambda call: call(), budget=1, storage=False)
    def kernel(x, block_shape, *, block):
        return 1e-3

    with pytest.raises(TypeError, match="a key value must be an int") as err:
        kernel(1, value)
    assert str(err.value).endswith(
        "to key on its parts, give a key function (called with the decorated function's arguments) that "
        f"returns them as fields: {hint}"
    )


def _kernel_of(how: str):
    """A kernel keyed on `n` in one of the fast-key shapes: positional with dtypes (inline), without dtypes,
    with more arguments than are written out (a map over them), by a key function, by keyword."""
    calls = []

    def bench(call):
        calls.append(1)
        return call()

    kw: dict = {"key": ["n"], "bench": bench, "budget": 3}
    if how == "no_dtypes":
        kw["dtypes"] = False
    if how == "key_fn":
        kw["key"] = lambda x, n, *rest: {"n": n}

    if how == "many_args":

        @tuner.autotune(SPACE, **kw)
        def kernel(x, n, a2, a3, a4, a5, a6, a7, *, block):
            return 1e-3 * (1 + abs(math.log2(block) - 5))

        return (lambda n: kernel(None, n, 2, 3, 4, 5, 6, 7)), calls

    @tuner.autotune(SPACE, **kw)
    def kernel(x, n, *, block):
        return 1e-3 * (1 + abs(math.log2(block) - 5))

    if how == "keyword":
        return (lambda n: kernel(None, n=n)), calls
    return (lambda n: kernel(None, n)), calls


@pytest.mark.parametrize("how", ["positional", "no_dtypes", "many_args", "key_fn", "keyword"])
def test_equal_key_values_of_other_types_are_other_entries_in_memory_too(_tuner_home: Path, how):
    # 1, True and 1.0 are one dict key in Python, yet three stored keys (JSON 1, true, 1.0): the hit
    # path used the config of the first for the others (never tuned, never stored, `explain` said miss)
    call, calls = _kernel_of(how)
    for v in (1, True, 1.0, 0, False):
        before = len(calls)
        call(v)
        assert len(calls) > before, f"{v!r} ({type(v).__name__}) hit another type's entry"
        call(v)  # and hits its own from then on
    entries = ConfigCache().entries()
    assert sorted(repr(e.key.fields_dict["n"]) for e in entries) == ["0", "1", "1.0", "False", "True"]
    before = len(calls)
    call(np.bool_(True))  # stored as True is: True's entry, not tuned again
    assert len(calls) == before and len(ConfigCache().entries()) == 5
