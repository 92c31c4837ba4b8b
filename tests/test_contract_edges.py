"""The public contract of `SearchSpace.from_configs` and `optimize` under inputs nobody here chose, for every
strategy README.md documents: values of mixed types, odd names, big spaces, odd objective results, priors
that do not fit the space, and the same call sequence from the same seed in another process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
import zlib
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tuner
from tests._env import repo_pythonpath  # noqa: E402
from tuner import SearchSpace, optimize

STRATEGIES = ["auto", "random", "tpe", "model", "transfer_best", "xgb_greedy"]
ROOT = Path(__file__).resolve().parents[1]


def _typed(config: dict) -> tuple:
    """A config with each value's type, so 1, 1.0 and True stay apart."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))


def _run(space, objective, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optimize(space, objective, **kw)


# ---- what the objective is handed ----------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_config_reaches_the_objective_with_its_own_value_types(strategy):
    # "a" holds 1.0 in one config and 1 in another (one value of the domain, as 1 == 1.0): each objective
    # call gets the config as its user wrote it, and so do the trials and best_config.
    configs = [{"a": 1.0, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": True, "b": "z"}]
    space = SearchSpace.from_configs(configs)
    calls = []

    def f(c):
        calls.append(_typed(c))
        return {"x": 3.0, "y": 1.0, "z": 2.0}[c["b"]] + (0.5 if c["a"] == 2 else 0.0)

    r = _run(space, f, budget=10, strategy=strategy)
    assert sorted(calls) == sorted(_typed(c) for c in configs)
    assert [_typed(t.config) for t in r.trials] == calls
    assert _typed(r.best_config) == _typed({"a": 1, "b": "y"})


def test_true_and_1_are_distinct_configs_but_1_and_1_0_are_duplicates():
    assert len(SearchSpace.from_configs([{"a": True}, {"a": 1}]).enumerate()) == 2
    with pytest.raises(ValueError, match="duplicates config 0"):
        SearchSpace.from_configs([{"a": 1}, {"a": 1.0}])
    with pytest.raises(ValueError, match="duplicates config 0"):
        SearchSpace.from_configs([{"a": np.int64(3)}, {"a": 3}])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_numpy_scalars_in_configs_are_handed_over_as_python_values(strategy):
    configs = [
        {"a": np.int64(3), "b": np.float32(0.5), "c": np.bool_(True)},
        {"a": np.int64(4), "b": np.float32(1.5), "c": np.bool_(False)},
    ]
    calls = []
    _run(
        SearchSpace.from_configs(configs),
        lambda c: calls.append(_typed(c)) or 1.0,
        budget=5,
        strategy=strategy,
    )
    assert sorted(calls) == sorted(
        [_typed({"a": 3, "b": 0.5, "c": True}), _typed({"a": 4, "b": 1.5, "c": False})]
    )


_values = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, 2.0, -1.5]),
    st.sampled_from(["", "x", "1", "é ü"]),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(_values, _values), min_size=1, max_size=8),
    strategy=st.sampled_from(STRATEGIES),
    budget=st.integers(1, 12),
    seed=st.integers(0, 2**31),
)
def test_optimize_calls_exactly_the_given_configs(rows, strategy, budget, seed):
    configs, seen = [], set()
    for a, b in rows:  # drop the rows from_configs counts as duplicates (1 == 1.0, True != 1)
        key = tuple((v, type(v) is bool) for v in (a, b))
        if key not in seen:
            seen.add(key)
            configs.append({"__class__": a, "a b": b})
    space = SearchSpace.from_configs(configs)
    calls = []

    def f(c):
        calls.append(_typed(c))
        return float(len(calls) % 3) - 1.0

    r = _run(space, f, budget=budget, strategy=strategy, seed=seed)
    given_ = {_typed(c) for c in configs}
    assert len(calls) == min(budget, len(configs))
    assert len(set(calls)) == len(calls)
    assert set(calls) <= given_
    assert r.stopped_because == ("space_exhausted" if budget > len(configs) else "budget")
    assert type(r.best_value) is float and r.best_config is not None


# ---- big spaces -----------------------------------------------------------------------------------------


class _CountingInt(int):
    """An int that counts its == comparisons (a value from_configs accepts, being an int)."""

    compared = 0

    def __eq__(self, other):
        type(self).compared += 1
        return int(self) == other

    __hash__ = int.__hash__


def test_from_configs_compares_each_value_a_bounded_number_of_times():
    # from_configs found a parameter's distinct values, and each config's canonical value, by scanning the
    # values seen so far: quadratic, 50,000 configs of distinct values took about 20 minutes.
    n = 3000
    _CountingInt.compared = 0
    space = SearchSpace.from_configs([{"a": _CountingInt(i), "b": i % 7} for i in range(n)])
    assert _CountingInt.compared < 10 * n
    assert len(space.params[0].values) == n
    _CountingInt.compared = 0
    assert all(space.contains({"a": i, "b": i % 7}) for i in range(0, n, 7))
    assert _CountingInt.compared < 10 * n


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_50k_configs_and_1000_parameters(strategy):
    big = SearchSpace.from_configs([{"a": i, "b": i % 7, "c": str(i % 11)} for i in range(50_000)])
    r = _run(big, lambda c: (c["a"] % 97) + c["b"], budget=4, strategy=strategy)
    assert len(r.trials) == 4 and all(big.contains(t.config) for t in r.trials)
    wide = SearchSpace.from_configs(
        [{f"p{j}": (i * j + i) % 5 if j else i for j in range(1000)} for i in range(6)]
    )
    r = _run(wide, lambda c: c["p1"] + c["p7"], budget=3, strategy=strategy)
    assert len(r.trials) == 3 and all(len(t.config) == 1000 for t in r.trials)


# ---- construction errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "configs",
    [
        [],
        {"a": 1},
        [{1: 1}, {1: 2}],
        [{"": 1}],
        [{"a": [1]}, {"a": [2]}],
        [{"a": {"b": 1}}],
        [{"a": None}],
        [{"a": float("nan")}],
        [{"a": 1}, {"b": 1}],
        [{"a": 1}, {"a": 1, "b": 2}],
        [{}],
        [{"a": 1}, "a"],
    ],
    ids=repr,
)
def test_from_configs_rejects_malformed_input_with_value_error(configs):
    with pytest.raises(ValueError):
        SearchSpace.from_configs(configs)


# ---- the objective's results ----------------------------------------------------------------------------

_SPACE = [{"a": i, "b": str(i % 3)} for i in range(12)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("ret", "expected"),
    [
        (3, 3.0),
        (np.float32(2.0), 2.0),
        (np.int64(-7), -7.0),
        (True, None),  # a bool is no result (it was 1.0)
        ("1.5", None),  # text is no result (it was 1.5)
        (b"1.5", None),
        (1.5 + 0j, None),
        (np.bool_(False), None),
        (np.array(True), None),
        (np.array("1.5"), None),
        (np.array([2.5]), None),  # one element, but not 0-d
        (np.array(2, dtype=np.uint8), 2.0),
        (Fraction(1, 4), 0.25),
        (Decimal("1.25"), 1.25),
        (np.array(3.5), 3.5),
        (-5.0, -5.0),
        (None, None),
        ("fast", None),
        (-math.inf, None),
        (math.inf, None),
        (math.nan, None),
        (10**400, None),
        (np.array([1.0, 2.0]), None),
    ],
    ids=repr,
)
def test_objective_results_are_floats_or_failures(strategy, ret, expected):
    r = _run(SearchSpace.from_configs(_SPACE), lambda c: ret, budget=3, strategy=strategy)
    assert len(r.trials) == 3
    for t in r.trials:
        assert t.value == expected and (t.value is None or type(t.value) is float)
        assert t.status == ("ok" if expected is not None else "failed")
    assert type(r.best_value) is float
    assert r.best_value == (expected if expected is not None else math.inf)
    assert (r.best_config is None) == (expected is None)


@pytest.mark.parametrize(
    ("ret", "named"),
    [
        ("1.5", "type str"),
        (b"1.5", "type bytes"),
        (True, "type bool"),
        (None, "type NoneType"),
        (2 + 1j, "type complex"),
        (np.complex64(1), "type numpy.complex64"),
        (np.array([1.0, 2.0]), "type numpy.ndarray of shape (2,)"),
        (np.array(True), "type numpy.ndarray of dtype bool"),
        (10**400, "type int, beyond the range of a float"),
    ],
    ids=repr,
)
def test_a_result_that_is_not_a_real_number_fails_naming_its_type(ret, named):
    r = _run(SearchSpace.from_configs(_SPACE), lambda c: ret, budget=2, strategy="random")
    assert [t.status for t in r.trials] == ["failed", "failed"]
    for t in r.trials:
        assert t.error is not None and t.error.startswith("objective returned ") and named in t.error, t.error


def test_zero_d_tensors_are_numbers_and_others_fail():
    torch = pytest.importorskip("torch")
    for ret, want in [
        (torch.tensor(1.5), 1.5),
        (torch.tensor(3), 3.0),
        (torch.tensor(2.0, dtype=torch.bfloat16), 2.0),
        (torch.tensor(True), None),
        (torch.tensor(1 + 1j), None),
        (torch.tensor([1.5]), None),
    ]:
        r = _run(SearchSpace.from_configs(_SPACE), lambda c, ret=ret: ret, budget=1, strategy="random")
        assert r.trials[0].value == want, (ret, r.trials[0].error)
        if want is None:
            assert "type torch.Tensor" in (r.trials[0].error or "")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_keyboard_interrupt_and_system_exit_propagate(strategy):
    def interrupt(c):
        raise KeyboardInterrupt

    def leave(c):
        raise SystemExit(3)

    with pytest.raises(KeyboardInterrupt):
        _run(SearchSpace.from_configs(_SPACE), interrupt, budget=3, strategy=strategy)
    with pytest.raises(SystemExit):
        _run(SearchSpace.from_configs(_SPACE), leave, budget=3, strategy=strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_config_failing_is_a_result(strategy):
    with pytest.warns(tuner.AllTrialsFailedWarning):
        r = optimize(SearchSpace.from_configs(_SPACE), lambda c: 1 / 0, budget=50, strategy=strategy)
    assert r.best_config is None and r.best_value == math.inf
    assert len(r.trials) == len(_SPACE) and r.stopped_because == "space_exhausted"
    assert all(t.status == "failed" and t.value is None and "ZeroDivisionError" in t.error for t in r.trials)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_objective_that_mutates_its_config_does_not_corrupt_the_search(strategy):
    space = SearchSpace.from_configs(_SPACE)
    calls = []

    def f(c):
        calls.append(dict(c))
        value = float(c["a"])
        c["a"] = 999
        c["zzz"] = 1
        del c["b"]
        return value

    r = _run(space, f, budget=100, strategy=strategy)
    assert sorted(calls, key=lambda c: c["a"]) == _SPACE
    assert [t.config for t in r.trials] == calls
    assert r.best_config == {"a": 0, "b": "0"} and r.best_value == 0.0


# ---- arguments ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -1, 2.5, "3", True, None, 3.0, math.nan])
def test_a_budget_that_is_not_a_positive_int_raises_before_any_call(budget):
    calls = []
    with pytest.raises(ValueError, match="budget"):
        optimize(SearchSpace.from_configs(_SPACE), lambda c: calls.append(c) or 1.0, budget=budget)
    assert calls == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_tiny_time_budget_stops_cleanly(strategy):
    r = _run(
        SearchSpace.from_configs(_SPACE), lambda c: 1.0, budget=5, strategy=strategy, time_budget_s=1e-12
    )
    assert r.stopped_because == "time_budget" and len(r.trials) <= 1


_PRIORS = {
    "not_in_space": [[({"a": 100, "b": "9"}, 1.0), ({"a": 1, "b": "1"}, 2.0)]],
    "other_keys": [[({"z": 1}, 1.0), ({"q": "x", "a": 1}, 2.0)]],
    "all_none": [[({"a": 1, "b": "1"}, None), ({"a": 2, "b": "2"}, None)]],
    "empty_tasks": [[], []],
    "no_tasks": [],
    "numpy": [[({"a": np.int64(1), "b": np.str_("1")}, np.float32(1.0))]],
    "bool_for_int": [[({"a": True, "b": "1"}, 1.0), ({"a": 2, "b": "2"}, 0.5)]],
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("prior", list(_PRIORS), ids=str)
def test_priors_that_do_not_fit_the_space_are_accepted(strategy, prior):
    space = SearchSpace.from_configs(_SPACE)
    calls = []
    r = _run(
        space, lambda c: calls.append(_typed(c)) or c["a"], budget=5, strategy=strategy, prior=_PRIORS[prior]
    )
    assert len(calls) == 5 == len(set(calls)) and all(space.contains(t.config) for t in r.trials)
    again = []
    _run(
        space, lambda c: again.append(_typed(c)) or c["a"], budget=5, strategy=strategy, prior=_PRIORS[prior]
    )
    assert again == calls


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("value", [2**2000, -(2**1100)], ids=["2**2000", "-2**1100"])
def test_a_prior_config_int_beyond_a_floats_range_is_refused_before_any_call(strategy, value):
    """An int beyond a float's range in a prior config (here in a parameter whose values are text) raised
    OverflowError from the one-hot features of auto, model and xgb_greedy; then it was a foreign config,
    matching nothing. A space refuses such a value (features are floats), and so does a `--prior` file:
    `prior` refuses it too, naming the row and the parameter, for every strategy."""
    rows = [{"x": 2**i, "s": "ab"[i % 2]} for i in range(12)]
    prior = [[({**r, "s": value}, float(i + 1)) for i, r in enumerate(rows[:8])] + [(rows[9], 1.0)]]
    calls = []
    with pytest.raises(ValueError, match=r"prior\[0\]\[0\]: parameter 's': value .* beyond a float's range"):
        _run(
            SearchSpace.from_configs(rows),
            lambda c: calls.append(_typed(c)) or float(c["x"]),
            budget=6,
            strategy=strategy,
            prior=prior,
        )
    assert calls == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("value", [[1], {"x": 1}, np.array([1, 2])], ids=["list", "dict", "array"])
def test_a_prior_config_value_that_is_no_parameter_value_is_refused_before_any_call(strategy, value):
    """A list, dict or array is not an int, float, str or bool: a ValueError naming it, for every strategy,
    where the prior-using ones used to raise `TypeError: unhashable type` from deep inside."""
    calls = []
    prior = [[({"a": 1, "b": "1"}, 1.0)], [({"a": 2, "b": "2"}, 2.0), ({"a": value, "b": "1"}, 1.0)]]
    with pytest.raises(
        ValueError, match=r"prior\[1\]\[1\]: config value a=.* is not an int, float, str or bool"
    ):
        _run(
            SearchSpace.from_configs(_SPACE),
            lambda c: calls.append(c) or 1.0,
            budget=3,
            strategy=strategy,
            prior=prior,
        )
    assert calls == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_none_in_a_prior_config_is_refused_as_in_a_space(strategy):
    """A None in a prior config was taken silently (the row matched no config, as no space holds None); it
    is refused before any call with the message a None among a space's values gets."""
    calls = []
    prior = [[({"a": 1, "b": "1"}, 1.0), ({"a": None, "b": "1"}, 2.0)]]
    with pytest.raises(ValueError) as info:
        _run(
            SearchSpace.from_configs(_SPACE),
            lambda c: calls.append(c) or 1.0,
            budget=3,
            strategy=strategy,
            prior=prior,
        )
    with pytest.raises(ValueError) as in_space:
        SearchSpace.from_configs([{"a": None, "b": "1"}])
    said = str(in_space.value).split(": ", 1)[1]
    assert said.startswith("parameter 'a': value None is not an int, float, str or bool;"), said
    assert str(info.value) == f"prior[0][1]: {said}"
    assert 'give a sentinel string instead ("none")' in said and calls == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_largest_seed_runs_and_one_beyond_is_refused_before_any_call(strategy):
    """Optuna's samplers take 32-bit seeds: 2**32 - 1 runs, 2**32 used to fail inside numpy ("Seed must be
    between 0 and 2**32 - 1") and is now refused by optimize, naming `seed`."""
    space = SearchSpace.from_configs(_SPACE)
    r = _run(space, lambda c: c["a"], budget=3, strategy=strategy, seed=np.uint32(2**32 - 1))
    assert r.evaluations == 3 and r.seed == 2**32 - 1
    calls = []
    with pytest.raises(ValueError, match=r"seed must be a non-negative int below 2\*\*32"):
        _run(space, lambda c: calls.append(c) or 1.0, budget=3, strategy=strategy, seed=2**32)
    assert calls == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "values", [(1e308, 1.0, 2.0), (-1e308, 1.0, 2.0), (2**1000, 1, 2)], ids=["1e308", "-1e308", "2**1000"]
)
def test_numbers_near_the_ends_of_a_float_are_searched_like_others(strategy, values):
    """Legal values at the edge of a float: tpe's projection of a repeated proposal took the distance to
    1e308 as NaN and chose among nothing (`a cannot be empty`); an int domain (1, 2, 2**1000) was
    checked for being a range by building the range (OverflowError), for every strategy."""
    space = SearchSpace.from_configs([{"a": v, "b": b} for v in values for b in (1, 2)])
    calls = []
    r = _run(space, lambda c: calls.append(_typed(c)) or float(len(calls) % 4), budget=8, strategy=strategy)
    assert len(calls) == 6 == len(set(calls)) and r.stopped_because == "space_exhausted"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_space_spanning_a_floats_range_is_searched_without_overflow(strategy):
    """1e308, -1e308 and 5e-324 in one parameter: the standardised candidate matrix overflowed (its mean
    and spread are inf: NaN distances, RuntimeWarnings), and XGBoost, which reads features as float32,
    refused every matrix with 1e308 in it (auto, model, xgb_greedy raised XGBoostError after the
    space-filling draws)."""
    space = SearchSpace.from_configs(
        [{"a": v, "b": b} for v in (1e308, -1e308, 5e-324, 0.0, 1.0) for b in range(6)]
    )
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = _run(
            space,
            lambda c: calls.append(_typed(c)) or abs(c["b"] - 3) + (c["a"] != 0.0),
            budget=24,
            strategy=strategy,
        )
    assert len(calls) == 24 == len(set(calls)) and r.best_value is not None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_objective_values_near_the_ends_of_a_float_of_both_signs_are_results(strategy):
    """Values of 1.7e308 and -1.7e308 (an objective with values <= 0 takes the median/spread scaling, not
    the log): the model's targets overflowed XGBoost's float32 labels, and "auto" raised XGBoostError
    ("Label contains NaN, infinity or a value too large") at its first model fit."""
    space = SearchSpace.from_configs([{"x": i, "y": i % 3} for i in range(40)])
    calls = []

    def f(c):
        calls.append(_typed(c))
        return [1.7e308, -1.7e308, 0.0, 1.0][c["x"] % 4]

    r = _run(space, f, budget=40, strategy=strategy)
    assert len(calls) == 40 == len(set(calls)) and r.best_value == -1.7e308


# ---- determinism across processes -----------------------------------------------------------------------

_CHILD = r"""
import json, sys, warnings
import tuner
warnings.simplefilter("ignore")
cfgs = [{"blk": 2 ** (i % 7), "mode": ["x", "yy", "zzz", "w"][i % 4], "flag": bool(i % 2), "f": (i % 5) / 4,
         "s": f"s{i % 3}"} for i in range(60)]
space = tuner.SearchSpace.from_configs(cfgs)
prior = [[(c, float((i * 37) % 11) if i % 5 else None) for i, c in enumerate(cfgs[:30])],
         [({"blk": 4, "mode": "q"}, 1.0)]]
out = {}
for strategy in sys.argv[1:]:
    for name, p in (("cold", None), ("prior", prior)):
        calls = []
        def f(c):
            calls.append(json.dumps(c, sort_keys=True))
            return (c["blk"] * 3 % 7) + len(c["mode"]) + c["f"] + (0.5 if c["flag"] else 0)
        tuner.optimize(space, f, budget=8, strategy=strategy, prior=p, seed=3)
        out[f"{strategy}/{name}"] = calls
print(json.dumps(out))
"""


def test_same_seed_same_calls_in_processes_with_different_hash_seeds():
    runs = []
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": repo_pythonpath()}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, *STRATEGIES],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            encoding="utf-8",
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    assert all(len(calls) == 8 for calls in runs[0].values())


# ---- the user's own values through the store and the runtime cache -------------------------------------

_MIXED = [{"b": 1, "m": "y"}, {"b": 1.0, "m": "x"}, {"b": True, "m": "z"}, {"b": 2, "m": "z"}]


def test_resumed_trials_keep_the_users_own_values(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = SearchSpace.from_configs(_MIXED)
    first = _run(
        space,
        lambda c: (1.0 if c["m"] == "x" else 2.0) + (0.5 if c["b"] is True else 0.0),
        budget=10,
        strategy="random",
        storage=url,
    )
    calls = []
    again = _run(space, lambda c: calls.append(c) or 3.0, budget=10, strategy="random", storage=url)
    assert calls == []  # everything was measured: resumed, not run again
    # Optuna stores True as 1 in a domain holding both: each value stays with its own config
    assert [(_typed(t.config), t.value) for t in again.trials] == [
        (_typed(t.config), t.value) for t in first.trials
    ]
    assert sorted(_typed(t.config) for t in again.trials) == sorted(_typed(c) for c in _MIXED)
    assert _typed(again.best_config) == _typed({"b": 1.0, "m": "x"})


def test_autotune_calls_with_the_users_own_values_on_tuning_and_on_a_store_hit():
    calls = []

    def make():
        @tuner.autotune(SearchSpace.from_configs(_MIXED), key=["n"], budget=10, bench=lambda call: call())
        def f(n, *, b, m):
            calls.append(_typed({"b": b, "m": m}))
            return 1.0 if m == "x" else 2.0  # the fake bench reports this as the call's time

        return f

    make()(8)
    assert sorted(set(calls)) == sorted(_typed(c) for c in _MIXED)
    assert calls[-1] == _typed({"b": 1.0, "m": "x"})
    calls.clear()
    second = make()  # same source, same name: what a new process sees
    second(8)
    assert second.tuner.stats["from_store"] == 1
    assert calls == [_typed({"b": 1.0, "m": "x"})]


# ---- properties: a deterministic objective with failures, priors that overlap the space or not -----------

_RESULTS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 7, -3.5, np.float32(2.5), np.int32(4), 1e300, -1e300]


def _result(config: dict, salt: int):
    """A deterministic result of `config` (one of `_RESULTS`, or raising), equal configs alike."""
    h = (zlib.crc32(repr(_canonical(config)).encode()) ^ salt) % 1_000_003
    if h % 9 == 0:
        raise RuntimeError("failed config")
    return _RESULTS[h % len(_RESULTS)] if h % 3 == 0 else (h % 997) / 10.0


def _canonical(config: dict):
    """A config's values as from_configs compares them: by ==, a bool apart from numbers."""
    return sorted(
        (k, (type(v) is bool, float(v) if type(v) in (int, float) else v)) for k, v in config.items()
    )


def _expected(config: dict, salt: int) -> float | None:
    try:
        v = float(_result(config, salt))
    except RuntimeError:
        return None
    return v if math.isfinite(v) else None


_cell = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 5e-324, 1e308, ""]),
    st.text(max_size=3),
)


@st.composite
def _config_lists(draw, max_configs: int = 40) -> list[dict]:
    keys = draw(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=5, unique=True))
    pools = {k: draw(st.lists(_cell, min_size=1, max_size=6)) for k in keys}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    configs, seen = [], set()
    for _ in range(draw(st.integers(1, max_configs))):
        c = {k: pools[k][int(rng.integers(len(pools[k])))] for k in keys}
        if repr(_canonical(c)) not in seen:
            seen.add(repr(_canonical(c)))
            configs.append(c)
    return configs


def _check_run(configs, r, calls, budget, salt):
    given_ = {repr(_canonical(c)) for c in configs}
    assert len(calls) == len(r.trials) == min(budget, len(configs))
    assert len({repr(_canonical(c)) for c in calls}) == len(calls)
    for call, t in zip(calls, r.trials, strict=True):
        assert repr(_canonical(t.config)) in given_ and _typed(t.config) == _typed(call)
        assert isinstance(t.status, str) and (t.value is None or type(t.value) is float)
        assert t.value == _expected(t.config, salt)
    ok = [t.value for t in r.trials if t.value is not None]
    assert type(r.best_value) is float and r.best_value == (min(ok) if ok else math.inf)
    assert (r.best_config is None) if not ok else _expected(r.best_config, salt) == r.best_value


def _check_twice(configs: list[dict], budget: int, salt: int, **kw: object) -> None:
    """Two runs of `optimize` over `configs` (with `kw`): each keeps the contract (`_check_run`), and the
    second makes the same calls as the first."""
    space = SearchSpace.from_configs(configs)
    runs = []
    for _ in range(2):
        calls: list[dict] = []
        r = _run(space, lambda c, calls=calls: calls.append(dict(c)) or _result(c, salt), budget=budget, **kw)
        _check_run(configs, r, calls, budget, salt)
        runs.append([_typed(c) for c in calls])
    assert runs[0] == runs[1]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    configs=_config_lists(),
    strategy=st.sampled_from(STRATEGIES),
    budget=st.integers(1, 45),
    seed=st.integers(0, 2**32 - 1),
    salt=st.integers(0, 2**16),
)
def test_optimize_reports_what_a_deterministic_objective_with_failures_returned(
    configs, strategy, budget, seed, salt
):
    _check_twice(configs, budget, salt, seed=seed, strategy=strategy)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    configs=_config_lists(max_configs=25),
    data=st.data(),
    strategy=st.sampled_from(STRATEGIES),
    budget=st.integers(1, 30),
    salt=st.integers(0, 2**16),
)
def test_priors_overlapping_the_space_or_not_keep_the_contract(configs, data, strategy, budget, salt):
    keys = list(configs[0])
    other = st.one_of(
        st.sampled_from(configs).map(dict),
        st.sampled_from(configs).map(lambda c: {**c, keys[0]: "foreign"}),
        st.sampled_from(configs).map(lambda c: {**c, "\x02extra": 1}),
        st.sampled_from(configs).map(lambda c: {k: v for k, v in c.items() if k != keys[-1]}),
        st.just({"unrelated": 1}),
    )
    value = st.one_of(st.none(), st.floats(), st.integers(-5, 5))
    prior = data.draw(st.lists(st.lists(st.tuples(other, value), max_size=12), max_size=3))
    _check_twice(configs, budget, salt, prior=prior, strategy=strategy)
