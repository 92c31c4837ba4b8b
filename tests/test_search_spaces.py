"""SearchSpace: construction, membership with reasons, sampling, enumeration, neighbours, features,
fingerprints and Optuna conversion, with hypothesis property tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tuner.search_spaces import (
    Boolean,
    Categorical,
    ConfigError,
    Constraint,
    IntRange,
    PowerOfTwo,
    SearchSpace,
)


def matmul_like() -> SearchSpace:
    return SearchSpace(
        [
            PowerOfTwo("BLOCK_M", 16, 256),
            PowerOfTwo("BLOCK_N", 16, 256),
            PowerOfTwo("BLOCK_K", 16, 128),
            PowerOfTwo("num_warps", 1, 8),
            IntRange("num_stages", 1, 5),
            Categorical("order", ["row", "col"]),
            Boolean("split"),
        ],
        [
            Constraint(
                "smem <= 96 KiB",
                lambda c: (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 * c["num_stages"] <= 96 * 1024,
                uses=("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"),
            ),
            Constraint(
                "tile >= warps*32",
                lambda c: c["BLOCK_M"] * c["BLOCK_N"] >= c["num_warps"] * 32 * 16,
                uses=("BLOCK_M", "BLOCK_N", "num_warps"),
            ),
        ],
        name="matmul_like",
    )


SPACE = matmul_like()


def test_param_types_domains() -> None:
    assert PowerOfTwo("x", 16, 128).values == (16, 32, 64, 128)
    assert IntRange("s", 2, 10, 4).values == (2, 6, 10)
    assert Boolean("b").values == (False, True)
    with pytest.raises(ValueError, match="power of two"):
        PowerOfTwo("x", 3, 16)
    with pytest.raises(ValueError, match="duplicate"):
        Categorical("c", ["a", "a"])
    with pytest.raises(ValueError, match="duplicate parameter"):
        SearchSpace([IntRange("a", 1, 2), IntRange("a", 1, 3)])


def test_violations_name_the_values() -> None:
    cfg = {
        "BLOCK_M": 256,
        "BLOCK_N": 256,
        "BLOCK_K": 128,
        "num_warps": 4,
        "num_stages": 5,
        "order": "row",
        "split": False,
    }
    why = SPACE.violations(cfg)
    assert len(why) == 1
    assert "smem <= 96 KiB" in why[0] and "BLOCK_M=256" in why[0] and "num_stages=5" in why[0]
    with pytest.raises(ConfigError) as ei:
        SPACE.validate(cfg)
    assert ei.value.reasons == why
    bad = dict(cfg, BLOCK_M=48, extra=1)
    del bad["order"]
    reasons = " | ".join(SPACE.violations(bad))
    assert "missing parameters: ['order']" in reasons
    assert "unknown parameters: ['extra']" in reasons
    assert "BLOCK_M=48 is not one of" in reasons


def test_bool_and_int_are_distinct() -> None:
    sp = SearchSpace([Boolean("b"), IntRange("i", 0, 1)])
    assert sp.contains({"b": True, "i": 1})
    assert not sp.contains({"b": 1, "i": 1})
    assert not sp.contains({"b": True, "i": True})


def test_enumerate_matches_constraints() -> None:
    allc = SPACE.enumerate()
    assert len(allc) == len(SPACE) > 0
    assert all(SPACE.contains(c) for c in allc)
    # brute force count agrees
    import itertools

    n = sum(
        1
        for k in itertools.product(*(p.values for p in SPACE.params))
        if SPACE.contains(dict(zip(SPACE.names, k, strict=True)))
    )
    assert n == len(allc)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_sampled_configs_are_valid(seed: int) -> None:
    for cfg in SPACE.sample(seed, n=5):
        assert SPACE.contains(cfg), SPACE.violations(cfg)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), method=st.sampled_from(["adjacent", "hamming"]))
def test_neighbors_valid_and_one_move_away(seed: int, method: str) -> None:
    cfg = SPACE.sample(seed)
    for nb in SPACE.neighbors(cfg, method=method):
        assert SPACE.contains(nb)
        diff = [k for k in cfg if cfg[k] != nb[k]]
        assert len(diff) == 1
        if method == "adjacent" and SPACE[diff[0]].ordered:
            p = SPACE[diff[0]]
            assert abs(p.index(cfg[diff[0]]) - p.index(nb[diff[0]])) == 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_encode_consistent(seed: int) -> None:
    cfgs = SPACE.sample(seed, n=4)
    a = np.stack([SPACE.encode(c) for c in cfgs])
    b = SPACE.encode_many(cfgs)
    assert a.shape == (4, len(SPACE.feature_names))
    np.testing.assert_allclose(a, b)


def test_fingerprint_stable_and_sensitive() -> None:
    assert matmul_like().fingerprint() == SPACE.fingerprint()
    other = SearchSpace(list(SPACE.params[:-1]), list(SPACE.constraints), name="matmul_like")
    assert other.fingerprint() != SPACE.fingerprint()


def test_to_optuna() -> None:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    d = SPACE.to_optuna()
    assert isinstance(d["num_stages"], IntDistribution) and d["num_stages"].low == 1
    assert isinstance(d["BLOCK_M"], CategoricalDistribution)
    assert set(d) == set(SPACE.names)


def test_default_is_valid() -> None:
    assert SPACE.contains(SPACE.default())


# ---- from_configs (docs/api.md) ----------------------------------------------------------------------
config_values = st.one_of(
    st.integers(-5, 5), st.sampled_from(["a", "b", "c"]), st.booleans(), st.sampled_from([0.5, 1.5])
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({"x": config_values, "y": st.integers(0, 3)}), min_size=1, max_size=30))
def test_from_configs_exactly_those(configs: list[dict]) -> None:
    uniq = []
    for c in configs:
        if not any(all(type(c[k]) is type(u[k]) and c[k] == u[k] for k in c) for u in uniq):
            uniq.append(c)
    sp = SearchSpace.from_configs(uniq)
    got = sp.enumerate()
    assert len(got) == len(uniq)
    for c in uniq:
        assert sp.contains(c)
    for c in got:
        assert any(all(type(c[k]) is type(u[k]) and c[k] == u[k] for k in c) for u in uniq)


def test_from_configs_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        SearchSpace.from_configs([])
    with pytest.raises(ValueError, match="duplicates config 0"):
        SearchSpace.from_configs([{"a": 1}, {"a": 1}])
    with pytest.raises(ValueError, match="inconsistent keys"):
        SearchSpace.from_configs([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="not an int"):
        SearchSpace.from_configs([{"a": [1]}])
    with pytest.raises(ValueError, match="list of dicts"):
        SearchSpace.from_configs({"a": 1})  # type: ignore[arg-type]


def test_from_configs_not_cartesian() -> None:
    sp = SearchSpace.from_configs([{"a": 1, "b": 2}, {"a": 2, "b": 1}])
    assert not sp.contains({"a": 1, "b": 1})
    assert "not one of the space's configs" in sp.violations({"a": 1, "b": 1})[0]
    assert sp.neighbors({"a": 1, "b": 2}) == []


def test_numpy_scalars_count_as_the_values_they_hold() -> None:
    """Configs built from numpy (np.arange, a DataFrame column) are in the space: `contains` used to say
    `B=np.int64(32) is not one of [16, 32, 64]`, and from_configs refused them."""
    sp = SearchSpace([PowerOfTwo("B", 16, 64), Boolean("f"), Categorical("o", ["a", "b"])])
    cfg = {"B": np.int64(32), "f": np.bool_(True), "o": np.str_("a")}
    assert sp.contains(cfg) and sp.violations(cfg) == []
    got = sp.validate(cfg)
    assert got == {"B": 32, "f": True, "o": "a"} and [type(v) for v in got.values()] == [int, bool, str]
    assert not sp.contains({"B": np.int64(48), "f": True, "o": "a"})
    assert not sp.contains({"B": 32, "f": np.int64(1), "o": "a"})  # still no bool from an int
    assert sp.neighbors(cfg) and sp.encode(cfg).tolist() == sp.encode(got).tolist()
    fc = SearchSpace.from_configs([{"x": x, "y": y} for x in np.arange(1, 4) for y in np.array([0.5, 1.0])])
    assert all(type(c["x"]) is int and type(c["y"]) is float for c in fc.enumerate())
    assert Categorical("c", list(np.arange(3))).values == (0, 1, 2)
    assert PowerOfTwo("p", np.int64(16), np.int64(64)).values == (16, 32, 64)
    assert IntRange("i", np.int64(1), np.int64(3)).values == (1, 2, 3)
    with pytest.raises(ValueError, match="not an int"):
        IntRange("i", 1.0, 3)  # type: ignore[arg-type]


def test_a_space_without_a_valid_config_says_which_constraint_rejects_it() -> None:
    import tuner

    calls: list[dict] = []
    sp = SearchSpace(
        [PowerOfTwo("B", 16, 64), IntRange("s", 1, 2)],
        [Constraint("smem", lambda c: c["B"] * c["s"] <= 64), Constraint("fits", lambda c: None)],  # type: ignore[arg-type,return-value]
        name="mine",
    )
    with pytest.raises(ValueError, match=r"'mine' has no valid config: .*all 6 configs") as exc:
        tuner.optimize(sp, lambda c: calls.append(c) or 1.0, budget=3)
    assert "'smem' rejects 1 of 6" in str(
        exc.value
    ) and "'fits' rejects 6 of 6 (its check returns None" in str(exc.value)
    assert calls == []
    huge = SearchSpace(
        [IntRange(f"p{i}", 0, 9) for i in range(8)], [Constraint("rare", lambda c: sum(c.values()) < 3)]
    )
    with pytest.raises(
        ValueError, match=r"none of 200000 random draws .*'rare' rejects 10000 of 10000.*from_configs"
    ):
        tuner.optimize(huge, lambda c: 1.0, budget=3)


def test_a_constraint_that_raises_is_named_in_the_error() -> None:
    sp = SearchSpace([PowerOfTwo("B", 16, 64)], [Constraint("typo", lambda c: c["BLOCK"] > 1)])
    with pytest.raises(KeyError) as exc:
        sp.contains({"B": 16})
    assert exc.value.__notes__ == ["raised by constraint 'typo' checking the config {'B': 16}"]


# ---- messages that list duplicates stay short -----------------------------------------------------------
def test_duplicate_configs_are_named_by_the_first_few_and_a_count() -> None:
    """50 copies of a config of 300 parameters: the message was every config's full dict (over 3,000
    characters for the first alone, and only the first pair); now the first three pairs, each config cut
    short, and how many duplicates there are."""
    configs = [{f"p{j}": j for j in range(300)} for _ in range(50)]
    with pytest.raises(ValueError) as err:
        SearchSpace.from_configs(configs)
    msg = str(err.value)
    assert len(msg) < 1000, len(msg)
    assert msg.startswith("config 1 duplicates config 0: {'p0': 0")
    assert "config 3 duplicates config 0" in msg and "config 4 " not in msg
    assert msg.endswith("(49 duplicates in all)")


def test_duplicate_values_and_names_are_named_by_the_first_few_and_a_count() -> None:
    from tuner.search_spaces import Categorical

    with pytest.raises(ValueError) as err:
        Categorical("x", list(range(5000)) * 2)
    msg = str(err.value)
    assert msg == "parameter 'x' has duplicate values: [0, 1, 2, 3, 4, ...] (5000 in all)"
    with pytest.raises(ValueError, match=r"has duplicate values: \[2\]$"):
        Categorical("y", [1, 2, 3, 2])
    params = [Categorical(f"n{i % 400}", [1]) for i in range(800)]
    with pytest.raises(ValueError) as err:
        SearchSpace(params)
    assert (
        str(err.value) == "duplicate parameter names: ['n0', 'n1', 'n10', 'n100', 'n101', ...] (400 in all)"
    )


def test_duplicate_names_in_a_study_file_are_named_by_the_first_few_and_a_count() -> None:
    from tuner.studies._spec import StudyError, _str_list

    names = [f"kernel_{i}" for i in range(300)] * 2
    with pytest.raises(StudyError) as err:
        _str_list("study.toml [study]", "kernels", names)
    msg = str(err.value)
    assert len(msg) < 200, msg
    assert msg.endswith(
        "kernels has duplicates: ['kernel_0', 'kernel_1', 'kernel_2', 'kernel_3', 'kernel_4', ...] (300 in all)"
    )


def _tiles(limit_m: int = 256, suggested=()) -> SearchSpace:  # type: ignore[no-untyped-def]
    from tuner.search_spaces import Categorical, Constraint, PowerOfTwo

    return SearchSpace(
        [
            PowerOfTwo("BLOCK_M", 16, 256, default=64),
            PowerOfTwo("BLOCK_N", 16, 256, default=64),
            Categorical("GROUP_M", (1, 2, 4, 8), ordered=True, default=8),
            Categorical("num_warps", (2, 4, 8), ordered=True, default=4),
        ],
        [
            Constraint("BLOCK_M fits M", lambda c: c["BLOCK_M"] <= limit_m, ("BLOCK_M",)),
            Constraint("GROUP_M fits M", lambda c: c["GROUP_M"] <= max(1, limit_m // c["BLOCK_M"]), ("GROUP_M", "BLOCK_M")),
        ],
        suggested=suggested,
    )  # fmt: skip


def test_default_made_valid_changes_only_what_it_must() -> None:
    """The nearest valid default: a parameter that every valid config shares (BLOCK_M = 16 for a small M)
    no longer drowns the other columns in rounding error (the default collapsed to the smallest tiles),
    and the fewest parameters change (GROUP_M alone where only the group is too tall)."""
    assert _tiles(16).default() == {"BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4}
    assert _tiles(64).default() == {"BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4}
    declared = {"BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": 8, "num_warps": 4}
    d = _tiles().default()  # GROUP_M 8 > 256 // 64 tiles: one parameter changes (BLOCK_M or GROUP_M)
    assert sum(d[k] != v for k, v in declared.items()) == 1 and _tiles().contains(d)
    assert _tiles().declares_default and not SearchSpace.from_configs([{"a": 1}, {"a": 2}]).declares_default


def test_suggested_configs_are_made_valid_for_the_space() -> None:
    given = [
        {"BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 2, "num_warps": 8},  # valid as given
        {
            "BLOCK_M": 128,
            "BLOCK_N": 256,
            "GROUP_M": 2,
            "num_warps": 8,
            "SPLIT_K": 4,
        },  # an unknown key: ignored
        {
            "BLOCK_M": 32,
            "BLOCK_N": 512,
            "num_warps": 8,
        },  # 512 outside the domain -> 256; GROUP_M -> default 8
        {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "GROUP_M": 1,
            "num_warps": "many",
        },  # not in an unordered domain: dropped
    ]
    space = _tiles(suggested=given)
    assert space.suggested == [
        {"BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 2, "num_warps": 8},
        {"BLOCK_M": 32, "BLOCK_N": 256, "GROUP_M": 8, "num_warps": 8},
    ]
    small = _tiles(16, suggested=given)  # BLOCK_M > 16 and tall groups break constraints: nearest valid
    assert small.suggested == [
        {"BLOCK_M": 16, "BLOCK_N": 256, "GROUP_M": 1, "num_warps": 8},
    ]
    assert all(small.contains(c) for c in small.suggested)
    with pytest.raises(ValueError, match="suggested"):
        _tiles(suggested={"BLOCK_M": 16})  # type: ignore[arg-type]


def test_gpu_gemm_spaces_suggest_the_tutorial_tiles() -> None:
    from tuner.kernels import get_kernel
    from tuner.search_spaces.devices import get_device

    problem = {"M": 4096, "N": 4096, "K": 4096, "bias": False, "activation": "none", "dtype": "bfloat16"}
    mm = get_kernel("matmul").space(problem, get_device("sm90"), "triton")
    assert len(mm.suggested) == 8 and mm.suggested[0] == {
        "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3,
    }  # fmt: skip
    small = get_kernel("matmul").space(dict(problem, M=16), get_device("sm80"), "triton")
    assert small.suggested and all(c["BLOCK_M"] == 16 and small.contains(c) for c in small.suggested)
    assert len({tuple(c.values()) for c in small.suggested}) == len(small.suggested) > 4
    assert get_kernel("matmul").space(problem, get_device("cpu"), "triton").suggested == []
    assert get_kernel("matmul").space(problem, get_device("gfx942"), "triton").suggested == []


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Categorical("f", [float("nan"), 1.0]), "'f': value nan is not a finite number"),
        (lambda: Categorical("f", [1.0, float("inf")], ordered=True), "'f': value inf is not a finite"),
        (lambda: SearchSpace.from_kernel_tuner({"f": [float("-inf"), 1.0]}), "value -inf is not a finite"),
        (lambda: PowerOfTwo("h", 1, 2**1100), "'h': value 1797693134862.* is beyond a float's range"),
        (lambda: IntRange("h", 2**1100, 2**1100 + 3), "'h': value .* is beyond a float's range"),
        (lambda: SearchSpace.from_configs([{"h": 1}, {"h": 2**1100}]), "'h': .* beyond a float's range"),
        (lambda: Categorical("x", [1, [2]]), r"'x': value \[2\] is not an int, float, str or bool"),
    ],
)
def test_a_domain_value_no_feature_or_membership_can_hold_is_refused_naming_it(make, match: str) -> None:
    """NaN was accepted as a domain value (from_configs refused it, Categorical and from_kernel_tuner did
    not) and equals nothing, so contains({"f": nan}) was False for the config enumerate() listed; inf made
    the model-guided search fail inside XGBoost ("Input data contains `inf`"); an int beyond a float's
    range (2**1100) raised "OverflowError: int too large to convert to float" from optimize; a list value
    raised TypeError (unhashable) before the type check that names it."""
    with pytest.raises(ValueError, match=match):
        make()


def test_a_value_at_the_edge_of_a_float_is_still_a_domain_value() -> None:
    space = SearchSpace([Categorical("h", [1, 2**1023, 2.0**1023 * 1.5], ordered=True)])
    assert space.contains({"h": 2**1023}) and len(space.enumerate()) == 3
    assert space.encode({"h": 2**1023}).tolist() == [2.0**1023, 1023.0]


@pytest.mark.parametrize("n", [-1, 1.5, True, "2"])
@pytest.mark.parametrize("size", [4, 100], ids=["enumerable", "too-large-to-enumerate"])
def test_sample_refuses_a_count_that_is_not_a_non_negative_int_alike_in_every_space(n, size: int) -> None:
    """n=-1 raised numpy's "negative dimensions are not allowed" from an enumerable space and returned []
    from a larger one; n=1.5 raised numpy's TypeError."""
    space = SearchSpace([IntRange(f"p{i}", 0, size - 1) for i in range(4 if size == 100 else 1)])
    with pytest.raises(ValueError, match="n must be None or a non-negative int"):
        space.sample(0, n=n)
    assert space.sample(0, n=0) == [] and len(space.sample(0, n=np.int64(2))) == 2


def test_a_constraint_returning_an_array_is_named() -> None:
    space = SearchSpace([PowerOfTwo("a", 1, 4)], [Constraint("arr", lambda c: np.array([True, False]))])
    with pytest.raises(ValueError, match="ambiguous") as info:
        space.enumerate()
    assert "constraint 'arr' returned array([ True, False])" in "".join(info.value.__notes__)


def test_encode_is_exact_about_bool_and_int():
    # 1 and "yes" were read as True by a boolean parameter, True as 1.0 by a numeric one
    flag, block = Boolean("flag"), PowerOfTwo("block", 16, 64)
    for bad in (1, 0, "yes"):
        with pytest.raises(ValueError, match="is not a bool"):
            flag.encode(bad)
        with pytest.raises(ValueError, match="is not a bool"):
            SearchSpace([flag]).encode_keys([(bad,)])
    with pytest.raises(ValueError, match="is not a number"):
        block.encode(True)
    with pytest.raises(ValueError, match="is not a number"):
        SearchSpace([block]).encode_keys([(True,)])
    assert flag.encode(np.bool_(True)) == [1.0] and block.encode(48) == [48.0, math.log2(48)]
    both = Categorical("mode", [True, 1, "x"])
    assert both.encode(True) == [1.0, 0.0, 0.0] and both.encode(1) == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError):
        both.encode(1.5)


def test_a_string_and_a_value_of_the_same_text_get_distinct_feature_names():
    from cost_models.features import FeatureSchema, schema_for_space

    mode = Categorical("mode", [True, "True", 1, "1", "x"])
    names = ["mode=True", "mode='True'", "mode=1", "mode='1'", "mode=x"]
    assert mode.feature_names() == names
    schema = schema_for_space(SearchSpace([mode]))
    assert schema.names == names
    # the names are not stored: a schema read back (a saved model's) gets the same ones, same fingerprint
    back = FeatureSchema.from_dict(schema.to_dict())
    assert back.names == names and back.fingerprint() == schema.fingerprint()
    assert Categorical("act", ["relu", "gelu"]).feature_names() == ["act=relu", "act=gelu"]  # as before
