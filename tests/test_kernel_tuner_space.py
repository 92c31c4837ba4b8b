"""SearchSpace.from_kernel_tuner: a Kernel Tuner user's tune_params and restrictions, strings parsed
safely (docs/api.md)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from tuner.search_spaces import SearchSpace

import tuner

# hotspot's space from the FAIR Benchmark Hub (kernels/hotspot_milo.py), cut down to stay small
TUNE_PARAMS: dict[str, list[Any]] = {
    "block_size_x": [1, 2, 4, 8, 16] + [32 * i for i in range(1, 9)],
    "block_size_y": [2**i for i in range(6)],
    "tile_size_x": [1, 2, 3],
    "temporal_tiling_factor": [1, 2, 3, 4],
    "loop_unroll_factor_t": [1, 2, 3, 4],
    "sh_power": [0, 1],
}
RESTRICTIONS = [
    "block_size_x*block_size_y >= 32",
    "temporal_tiling_factor % loop_unroll_factor_t == 0",
    "block_size_x*block_size_y <= 1024",
    "(block_size_x*tile_size_x + temporal_tiling_factor * 2) * (block_size_y + temporal_tiling_factor * 2)"
    " * (2+sh_power) * 4 <= 49152",
]


def _oracle(c: dict[str, Any]) -> bool:
    """The same restrictions written as Python by hand."""
    bx, by, tx = c["block_size_x"], c["block_size_y"], c["tile_size_x"]
    ttf, lu, sh = c["temporal_tiling_factor"], c["loop_unroll_factor_t"], c["sh_power"]
    return (
        bx * by >= 32
        and ttf % lu == 0
        and bx * by <= 1024
        and (bx * tx + ttf * 2) * (by + ttf * 2) * (2 + sh) * 4 <= 49152
    )


def test_the_space_is_exactly_the_configs_kernel_tuner_would_keep() -> None:
    space = tuner.SearchSpace.from_kernel_tuner(TUNE_PARAMS, RESTRICTIONS, name="hotspot")
    everything = [dict(zip(TUNE_PARAMS, v, strict=True)) for v in itertools.product(*TUNE_PARAMS.values())]
    expected = [c for c in everything if _oracle(c)]
    assert 0 < len(expected) < len(everything)
    assert space.enumerate() == expected
    assert space.names == list(TUNE_PARAMS) and [p.values for p in space.params][0] == tuple(
        TUNE_PARAMS["block_size_x"]
    )
    why = space.violations({**expected[0], "loop_unroll_factor_t": 3, "temporal_tiling_factor": 4})
    assert why == [
        "violates temporal_tiling_factor % loop_unroll_factor_t == 0 "
        "(temporal_tiling_factor=4, loop_unroll_factor_t=3)"
    ]
    result = tuner.optimize(space, lambda c: float(c["block_size_x"] + c["block_size_y"]), budget=10, seed=0)
    assert all(_oracle(t.config) for t in result.trials)


def test_callables_and_name_pairs_as_kernel_tuner_takes_them() -> None:
    tp = {"bx": [16, 32, 64], "by": [1, 2, 4], "layout": ["row", "col"], "fast": [True, False]}
    space = SearchSpace.from_kernel_tuner(
        tp,
        [
            lambda p: p["bx"] * p["by"] <= 128,
            (lambda bx, layout: layout == "row" or bx >= 32, ["bx", "layout"]),
            "fast or layout in ('col',)",
            "min(bx, 8*by) != 16 if layout == 'row' else True",
        ],
    )

    def keep(c: dict[str, Any]) -> bool:
        return (
            c["bx"] * c["by"] <= 128
            and (c["layout"] == "row" or c["bx"] >= 32)
            and (c["fast"] or c["layout"] == "col")
            and (c["layout"] != "row" or min(c["bx"], 8 * c["by"]) != 16)
        )

    everything = [dict(zip(tp, v, strict=True)) for v in itertools.product(*tp.values())]
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731  (strings and bools enumerate sorted)
    assert sorted(map(key, space.enumerate())) == sorted(key(c) for c in everything if keep(c))
    assert 0 < len(space) < len(everything)
    single = SearchSpace.from_kernel_tuner({"x": [1, 2, 3]}, lambda p: p["x"] != 2)  # not in a list
    assert [c["x"] for c in single.enumerate()] == [1, 3]
    assert len(SearchSpace.from_kernel_tuner({"x": [1.5, 2.5], "y": [0, 1]}, None)) == 4


def _min_func(gpu1: int, gpu2: int, gpu3: int, gpu4: int) -> bool:
    return min([gpu1, gpu2, gpu3, gpu4]) >= 1


def test_a_function_of_the_parameter_values_is_called_as_kernel_tuner_calls_it() -> None:
    """Kernel Tuner's own test_searchspace.py restricts with `_min_func(gpu1, gpu2, gpu3, gpu4)`, which
    Kernel Tuner 1.x calls with the values of all parameters in tune_params order; from_kernel_tuner
    called it with the config dict ("missing 3 required positional arguments")."""
    layers = 12
    tp = {f"gpu{i}": list(range(layers)) for i in range(1, 5)}
    space = SearchSpace.from_kernel_tuner(tp, [f"gpu1 + gpu2 + gpu3 + gpu4 == {layers}", _min_func])
    everything = [dict(zip(tp, v, strict=True)) for v in itertools.product(*tp.values())]
    expected = [c for c in everything if sum(c.values()) == layers and min(c.values()) >= 1]
    assert space.enumerate() == expected and len(expected) == 165  # compositions of 12 into 4 parts
    why = space.violations({"gpu1": 0, "gpu2": 4, "gpu3": 4, "gpu4": 4})
    assert why == ["violates _min_func(gpu1, gpu2, gpu3, gpu4) (gpu1=0, gpu2=4, gpu3=4, gpu4=4)"]

    # the values go in tune_params order, whatever the function calls them, as Kernel Tuner passes them
    def first_small(x: int, y: int) -> bool:
        return x < 2 and y == 10

    order = {"b": [1, 2, 3], "a": [10, 20]}
    for restrictions in (first_small, [first_small], [first_small, "a > 5"], [lambda *v: v == (1, 10)]):
        assert SearchSpace.from_kernel_tuner(order, restrictions).enumerate() == [{"b": 1, "a": 10}]
    # a function of one argument still gets the config dict (Kernel Tuner's older, monolithic style)
    by_dict = SearchSpace.from_kernel_tuner(order, [lambda p, limit=2: p["b"] < limit, "a > 15"])
    assert by_dict.enumerate() == [{"b": 1, "a": 20}]


def test_a_function_of_the_values_with_a_default_is_called_with_the_values() -> None:
    """Kernel Tuner calls a restriction in its list with the values of all parameters, whatever defaults
    its signature has. `def r(block_size_x, tile=1)` requires one argument, as a function of the config
    dict does, and was called with the dict ("unsupported operand type(s) for *: 'dict' and 'int'");
    its parameters named as tune_params' tell it apart from `def r(p, strict=False)`."""
    tp = {"block_size_x": [16, 32, 64], "tile": [1, 2]}
    want = [{"block_size_x": 16, "tile": 1}, {"block_size_x": 16, "tile": 2}, {"block_size_x": 32, "tile": 1}]

    def with_default(block_size_x: int, tile: int = 1) -> bool:
        return block_size_x * tile <= 32

    def first_and_rest(block_size_x: int, *rest: int) -> bool:
        return block_size_x * rest[0] <= 32

    for fn in (with_default, first_and_rest):
        assert SearchSpace.from_kernel_tuner(tp, [fn]).enumerate() == want
    one = SearchSpace.from_kernel_tuner(
        {"block_size_x": [16, 32, 64]}, [lambda block_size_x: block_size_x < 64]
    )
    assert [c["block_size_x"] for c in one.enumerate()] == [16, 32]

    def by_dict(p: dict, strict: bool = False) -> bool:  # a function of the config dict keeps the dict
        return p["block_size_x"] * p["tile"] <= 32

    assert SearchSpace.from_kernel_tuner(tp, [by_dict]).enumerate() == want


def test_max_threads_limits_the_block_as_kernel_tuner_does_by_itself() -> None:
    """Kernel Tuner drops every config whose thread block is over the device's limit without being told:
    its examples/cuda/convolution.py space (Apache-2.0) has 432 configs, of which Kernel Tuner 1.5.0
    tunes 342 (block_size_x * block_size_y <= 1024). max_threads adds that limit."""
    tp = {
        "block_size_x": [16 * i for i in range(1, 9)],
        "block_size_y": [2**i for i in range(6)],
        "tile_size_x": [1, 2, 4],
        "tile_size_y": [1, 2, 4],
    }
    assert len(SearchSpace.from_kernel_tuner(tp)) == 432
    space = SearchSpace.from_kernel_tuner(tp, ["tile_size_x <= 4"], max_threads=1024)
    assert len(space) == 342 and all(c["block_size_x"] * c["block_size_y"] <= 1024 for c in space.enumerate())
    assert space.violations(
        {"block_size_x": 128, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1}
    ) == ["violates block_size_x * block_size_y <= 1024 (block_size_x=128, block_size_y=16)"]
    # block_size_names renames the dimensions; the missing ones keep Kernel Tuner's default names
    renamed = {"threads": [128, 256, 512], "block_size_y": [1, 2, 4], "vec": [1, 2]}
    limited = SearchSpace.from_kernel_tuner(renamed, max_threads=512, block_size_names=["threads"])
    assert len(limited) == 2 * (3 + 2 + 1)
    assert len(SearchSpace.from_kernel_tuner(renamed, max_threads=512)) == 18  # block_size_y alone: <= 4
    for bad in ({"max_threads": 0}, {"max_threads": True}, {"block_size_names": ["threads"]}):
        with pytest.raises(ValueError, match="max_threads"):
            SearchSpace.from_kernel_tuner(renamed, **bad)  # type: ignore[arg-type]


def test_more_than_three_block_size_names_are_refused_as_kernel_tuner_refuses_them() -> None:
    """A thread block has three dimensions: Kernel Tuner raises "block_size_names should not contain more
    than 3 names!"; from_kernel_tuner limited the product of all four names instead, a space no Kernel
    Tuner builds."""
    tp = {"bx": [32, 64], "by": [1, 2], "bz": [1, 2], "vec": [1, 2]}
    names = ["bx", "by", "bz", "vec"]
    with pytest.raises(ValueError, match=r"at most 3 names, got \['bx', 'by', 'bz', 'vec'\]"):
        SearchSpace.from_kernel_tuner(tp, max_threads=128, block_size_names=names)
    three = SearchSpace.from_kernel_tuner(tp, max_threads=128, block_size_names=names[:3])
    assert len(three) == 2 * (4 + 3)  # bx * by * bz <= 128, whatever vec is


@pytest.mark.parametrize(
    ("restriction", "says"),
    [
        ("__import__('os').system('echo pwned')", "only calls of"),
        ("block_size_x.__class__", "Attribute is not allowed"),
        ("[x for x in (1, 2)]", "ListComp is not allowed"),
        ("(lambda: 1)()", "only calls of"),
        ("block_size_z > 1", "'block_size_z', which is not a tunable parameter"),
        ("block_size_x <", "not a Python expression"),
        ("", "empty"),
        (b"block_size_x > 1", "give a string, a function"),
        ((lambda a: a, ["nope"]), "not tunable parameters"),
    ],
)
def test_what_is_not_a_restriction_is_refused_with_its_reason(restriction: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SearchSpace.from_kernel_tuner({"block_size_x": [16, 32]}, [restriction])


def test_a_restriction_that_cannot_be_computed_rejects_the_config() -> None:
    space = SearchSpace.from_kernel_tuner({"a": [0, 1, 2], "b": [0, 1]}, ["a % b == 0", "2**10**10 > a"])
    assert space.enumerate() == []
    assert "ZeroDivisionError" in space.violations({"a": 1, "b": 0})[0]
    assert "too large" in space.violations({"a": 1, "b": 1})[0]


def test_rounding_to_a_huge_number_of_digits_rejects_the_config_instead_of_hanging() -> None:
    """round(x, -10000000) on an int computes 10**10000000: a 24-character restriction hung
    from_kernel_tuner's enumeration (the limit on ** did not cover it)."""
    space = SearchSpace.from_kernel_tuner({"x": [1, 2], "y": [1.5]}, ["round(x, -10000000) == 0"])
    assert space.enumerate() == []
    assert "round to -10000000 digits is over the limit" in space.violations({"x": 1, "y": 1.5})[0]
    ok = SearchSpace.from_kernel_tuner(
        {"x": [149, 151], "y": [1.25]}, ["round(x, -2) == 100", "round(y, 1) == 1.2", "round(y) == 1"]
    )
    assert [c["x"] for c in ok.enumerate()] == [149]


def test_bad_tune_params_are_refused() -> None:
    for bad in ({}, {"x": []}, {"x": "abc"}, {"x": 3}, {1: [1]}):
        with pytest.raises(ValueError):
            SearchSpace.from_kernel_tuner(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["-" * 999 + "x", "not " * 249 + "x", "+".join(["x"] * 300) + " > 0"])
def test_a_restriction_nested_too_deep_is_refused_by_name_not_a_recursion_error(text: str) -> None:
    """The checker and the evaluator recurse once per level of nesting: "-" * 999 + "x" (1,000 characters,
    within the length limit) raised RecursionError from from_kernel_tuner, and one a little shallower
    passed there and then raised it while a deeply called optimize evaluated it."""
    with pytest.raises(ValueError, match=r"nests \d+ levels deep, over the limit of 200"):
        SearchSpace.from_kernel_tuner({"x": [1, 2]}, [text])
    ok = SearchSpace.from_kernel_tuner({"x": [1, 2]}, ["-" * 150 + "x < 5", "+".join(["x"] * 150) + " > 0"])
    assert len(ok) == 2


def test_a_function_of_keyword_arguments_gets_the_parameters_by_name() -> None:
    """Kernel Tuner's check_restriction calls a restriction function as `restrict(**params)`, so one with
    keyword-only parameters or `**kwargs` works there; from_kernel_tuner called it with the config dict
    or the values in order ("r() takes 0 positional arguments but 1 was given", or `block_size_x` bound
    to the whole dict)."""
    tp = {"block_size_x": [16, 32, 64, 128], "block_size_y": [1, 2, 4, 8], "tile": [1, 2]}
    everything = [dict(zip(tp, v, strict=True)) for v in itertools.product(*tp.values())]
    want = [c for c in everything if c["block_size_x"] * c["block_size_y"] * c["tile"] <= 128]
    assert 0 < len(want) < len(everything)

    def keyword_only(*, block_size_x: int, block_size_y: int, tile: int) -> bool:
        return block_size_x * block_size_y * tile <= 128

    def first_and_keywords(block_size_x: int, **p: int) -> bool:
        return block_size_x * p["block_size_y"] * p["tile"] <= 128

    def keyword_only_and_kwargs(*, tile: int, **p: int) -> bool:
        return p["block_size_x"] * p["block_size_y"] * tile <= 128

    kwargs = lambda **p: p["block_size_x"] * p["block_size_y"] * p["tile"] <= 128  # noqa: E731
    for fn in (keyword_only, first_and_keywords, keyword_only_and_kwargs, kwargs):
        for restrictions in (fn, [fn], ["tile >= 1", fn]):
            assert SearchSpace.from_kernel_tuner(tp, restrictions).enumerate() == want, (fn, restrictions)

    def pair(*, block_size_x: int, block_size_y: int) -> bool:  # a (function, [names]) pair by name
        return block_size_x * block_size_y <= 64

    space = SearchSpace.from_kernel_tuner(tp, [(pair, ["block_size_y", "block_size_x"])])
    assert space.enumerate() == [c for c in everything if c["block_size_x"] * c["block_size_y"] <= 64]
    # one that cannot take every parameter by name fails in Kernel Tuner too: refused up front, by name
    with pytest.raises(ValueError, match=r"restriction 0 \(pair\) takes keyword arguments.*'tile'"):
        SearchSpace.from_kernel_tuner(tp, [pair])


def test_numpy_arrays_of_values_are_taken_as_kernel_tuner_takes_them() -> None:
    """Kernel Tuner builds its space from `tune_params["block_size_x"] = np.arange(32, 1025, 32)` as from a
    list; from_kernel_tuner refused a numpy array ("must be a non-empty list of values")."""
    np = pytest.importorskip("numpy")
    tp = {
        "block_size_x": np.arange(32, 257, 32),
        "vec": np.array([1, 2, 4]),
        "alpha": np.linspace(0.5, 1.0, 2),
    }
    space = SearchSpace.from_kernel_tuner(tp, ["block_size_x * vec <= 256"], max_threads=1024)
    lists = {k: v.tolist() for k, v in tp.items()}
    assert (
        space.enumerate() == SearchSpace.from_kernel_tuner(lists, ["block_size_x * vec <= 256"]).enumerate()
    )
    assert len(space) == 2 * (8 + 4 + 2)
    assert all(type(c["block_size_x"]) is int and type(c["alpha"]) is float for c in space.enumerate())
    for bad in (np.array([]), np.array([[1, 2], [3, 4]]), np.array(3)):
        with pytest.raises(ValueError, match="non-empty list of values"):
            SearchSpace.from_kernel_tuner({"x": bad})


def test_a_tuple_of_a_function_and_a_string_is_two_restrictions() -> None:
    """Kernel Tuner takes `restrictions` as a list or a tuple of restrictions, so `(f, "x > 1")` is two of
    them (Kernel Tuner 1.5.0 keeps 4 of these 8 configs); from_kernel_tuner took every 2-tuple whose first
    item is a function for a `(function, [names])` pair and refused it ("the second item must be a list
    of parameter names")."""
    tp = {"x": [1, 2, 3, 4], "y": [1, 2]}

    def not_three(x: int, y: int) -> bool:
        return x != 3

    want = [{"x": x, "y": y} for x in (2, 4) for y in (1, 2)]
    for restrictions in ((not_three, "x > 1"), ("x > 1", not_three), [not_three, "x > 1"]):
        assert SearchSpace.from_kernel_tuner(tp, restrictions).enumerate() == want
    pair = SearchSpace.from_kernel_tuner(tp, (lambda x: x != 3, ["x"]))  # a pair still is one
    assert len(pair) == 6


# Restrictions Kernel Tuner accepts (it compiles them into Python functions), each with the same test
# written as Python by hand.
PYTHON_BUILTINS: list[tuple[str, Any]] = [
    ("pow(x, 2) <= 4096", lambda x, y: x**2 <= 4096),
    ("pow(x, 2, 7) == 1", lambda x, y: pow(x, 2, 7) == 1),
    ("sum([x, y]) <= 64", lambda x, y: x + y <= 64),
    ("sum((x, y), 3) <= 20", lambda x, y: 3 + x + y <= 20),
    ("x in range(16, 65, 32)", lambda x, y: x in (16, 48)),
    ("x not in range(16, 65, 32)", lambda x, y: x not in (16, 48)),
    ("x in range(100, 0, -48)", lambda x, y: x in (100, 52, 4)),
    ("y in range(64)", lambda x, y: 0 <= y < 64),
    ("1 < x in range(0, 50, 16)", lambda x, y: x in (16, 32, 48)),
    ("x * 1.0 in range(16, 17)", lambda x, y: x == 16),
    ("x in range(10**60)", lambda x, y: True),
]


@pytest.mark.parametrize(("text", "same"), PYTHON_BUILTINS, ids=[t for t, _ in PYTHON_BUILTINS])
def test_pow_sum_and_range_mean_what_they_mean_in_python(text: str, same: Any) -> None:
    """Kernel Tuner takes `pow(x, 2) <= 4096`, `sum([x, y]) <= 64` and `x in range(16, 65, 32)` (it runs
    them as Python); from_kernel_tuner refused them ("only calls of min, max, ...")."""
    tp = {"x": [1, 16, 32, 48, 64, 80, 100], "y": [1, 8, 64]}
    space = SearchSpace.from_kernel_tuner(tp, [text])
    everything = [dict(zip(tp, v, strict=True)) for v in itertools.product(*tp.values())]
    assert space.enumerate() == [c for c in everything if same(**c)]


@pytest.mark.parametrize(
    ("restriction", "says"),
    [
        ("range(3) == x", "range(...) is allowed only after `in` or `not in`"),
        ("len(range(10**9)) > x", "range(...) is allowed only after `in` or `not in`"),
        ("x in range(3) == x", "range(...) is allowed only after `in` or `not in`"),
        ("sum(x) > 1", "sum takes a list or tuple written out"),
        ("sum([x], 1, 2) > 1", "sum takes a list or tuple written out"),
        ("x < max", "names the function max without calling it"),
        ("pow(x, y=2) > 1", "only calls of"),
        # a bound that is never an int: Python's range raises TypeError for every config, so the space was
        # built empty and only optimize said "has no valid config"
        ("x in range(0.5, 8)", "range takes ints, as in Python, not 0.5"),
        ("x not in range(0, 8.0, 2)", "range takes ints, as in Python, not 8.0"),
        ("x in range(-1.5, x / 2)", "range takes ints, as in Python, not -1.5, x / 2"),
        ("x in range(float(x))", "range takes ints, as in Python, not float(x)"),
    ],
)
def test_what_the_builtins_cannot_be_given_is_refused(restriction: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        SearchSpace.from_kernel_tuner({"x": [1, 2]}, [restriction])


def test_a_power_too_large_to_compute_rejects_the_config_instead_of_hanging() -> None:
    space = SearchSpace.from_kernel_tuner(
        {"x": [2, 3]}, ["pow(x, 10**9) > 1 or pow(x, 2**5000, 7) == 1 or x in range(0, 4, 0)"]
    )
    assert space.enumerate() == []
    assert "is too large" in space.violations({"x": 2})[0]
    assert (
        "ValueError: range() arg 3 must not be zero"
        in SearchSpace.from_kernel_tuner({"x": [2]}, ["x in range(0, 4, 0)"]).violations({"x": 2})[0]
    )


def test_none_among_the_values_is_refused_saying_what_to_use_instead() -> None:
    """Kernel Tuner takes `{"b": [None, 1]}`; tuner's configs hold no None. The refusal only said "value
    None is not an int, float, str or bool"; it says to use a sentinel string, in the restrictions too."""
    with pytest.raises(ValueError, match=r"tune_params\['b'\] holds None, which Kernel Tuner takes") as info:
        SearchSpace.from_kernel_tuner({"a": [1, 2], "b": [None, 1]}, ["b is None or a > 1"])
    assert 'sentinel string such as "none"' in str(info.value) and 'b == "none" for b is None' in str(
        info.value
    )
    with pytest.raises(
        ValueError, match=r"value None is not an int, float, str or bool; give a sentinel string"
    ):
        tuner.search_spaces.Categorical("b", [None, "x"])
    # what the message says to do gives Kernel Tuner's space
    space = SearchSpace.from_kernel_tuner({"a": [1, 2], "b": ["none", 1]}, ['b == "none" or a > 1'])
    assert space.enumerate() == [{"a": 1, "b": "none"}, {"a": 2, "b": "none"}, {"a": 2, "b": 1}]
