"""Spaces too large to enumerate whose constraints pass few configs (as kernels' shared-memory and
register limits over many parameters do): rejection sampling finds their valid configs, in a bounded
number of draws, and says how many draws it made when it finds none."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tuner.search_spaces import Boolean, Categorical, Constraint, IntRange, SearchSpace
from tuner.search_spaces._space import SAMPLE_DRAWS

import tuner
from tuner.strategies._base import CandidatePool


def _tie_space(tied: int = 5) -> SearchSpace:
    """10**10 configs, of which 1 in 10**(tied - 1) is valid: x0 .. x{tied-1} all equal."""
    return SearchSpace(
        [IntRange(f"x{i}", 0, 9) for i in range(10)],
        [Constraint("tie", lambda c: all(c[f"x{i}"] == c["x0"] for i in range(1, tied)))],
        name="tie",
    )


def test_a_space_that_passes_one_config_in_10000_is_sampled() -> None:
    """Rejection sampling gave up after 10,000 draws: a space whose constraints pass 1 config in 10,000
    (a million valid configs) was called empty for about 1 seed in e, and optimize refused it."""
    space = _tie_space()
    assert not space.is_enumerable
    for seed in range(6):
        cfg = space.sample(seed)
        assert space.contains(cfg)
    assert all(space.contains(c) for c in space.sample(0, n=3))


@pytest.mark.parametrize("strategy", ["random", "auto", "tpe"])
def test_optimize_runs_on_a_space_that_passes_one_config_in_10000(strategy: str) -> None:
    space = _tie_space()
    calls: list[dict] = []
    res = tuner.optimize(
        space, lambda c: calls.append(c) or float(sum(c.values())), budget=3, seed=1, strategy=strategy
    )
    assert res.evaluations == 3 and all(space.contains(c) for c in calls)


def test_an_unsampled_space_error_counts_the_draws_it_made() -> None:
    """The error said "none of 10000 random draws ... is valid" and then "'tie' rejects 9999 of 10000":
    its counts came from other draws (seed 0) than the ones that failed. Now both come from the draws made."""
    space = _tie_space(tied=10)  # 1 in 10**9: not found
    with pytest.raises(ValueError) as err:
        space.sample(3)
    msg = str(err.value)
    m = re.search(r"none of (\d+) random draws.*'tie' rejects (\d+) of (\d+)", msg)
    assert m is not None, msg
    total, bad, counted = (int(g) for g in m.groups())
    assert total == SAMPLE_DRAWS and bad == counted == 10_000
    assert "from_configs" in msg


def test_random_unseen_stops_once_the_few_valid_configs_are_seen() -> None:
    """A space too large to enumerate whose 1,600 valid configs (1 in 2,500) were all measured: drawing
    an unseen one tried 10,000 samples of about 2,500 draws each (25 million constraint checks) before
    it gave up. Now it stops after SAMPLE_DRAWS draws."""
    checks = [0]

    def grid(c: dict) -> bool:
        checks[0] += 1
        if checks[0] > 3 * SAMPLE_DRAWS:
            raise RuntimeError("unbounded rejection sampling")
        return c["a"] % 50 == 0 and c["b"] % 50 == 0

    space = SearchSpace([IntRange("a", 0, 1999), IntRange("b", 0, 1999)], [Constraint("grid", grid)])
    assert not space.is_enumerable
    pool = CandidatePool(space, np.random.default_rng(0))
    for a in range(0, 2000, 50):
        for b in range(0, 2000, 50):
            pool.mark_seen({"a": a, "b": b})
    checks[0] = 0
    assert pool.random_unseen() is None
    assert checks[0] <= SAMPLE_DRAWS


def test_a_proposal_on_a_large_space_checks_a_bounded_number_of_configs() -> None:
    """The auto strategy ranked every one-parameter change of its three best configs: with a parameter of
    a million values, three million configs checked and ranked per proposal (20 s each). Now a parameter
    with many values contributes a ladder of nearby values, so a proposal checks at most its random draws
    and a few hundred neighbours."""
    from tuner.strategies._model import LARGE_CANDIDATE_DRAWS

    checks = [0]

    def even(c: dict) -> bool:
        checks[0] += 1
        if checks[0] > 4 * LARGE_CANDIDATE_DRAWS:
            raise RuntimeError("unbounded neighbourhood")
        return c["x"] % 2 == 0

    space = SearchSpace(
        [IntRange("x", 0, 999_999), Categorical("layout", ["row", "col", "tiled"]), Boolean("flag")],
        [Constraint("even", even)],
    )
    assert not space.is_enumerable

    def obj(c: dict) -> float:
        return abs(c["x"] - 333_334) / 1e6 + (c["layout"] != "tiled") + c["flag"]

    res = tuner.optimize(space, obj, budget=13, seed=0, strategy="auto")
    assert res.evaluations == 13 and all(space.contains(t.config) for t in res.trials)
    # 3 model-ranked proposals after 10 random ones: each at most its draws and a few hundred neighbours
    assert checks[0] <= 3 * (LARGE_CANDIDATE_DRAWS + 1_000) + 20_000


def test_an_int_range_too_large_to_store_is_refused_before_it_is_built() -> None:
    """IntRange("offset", 0, 2**32) built a tuple and a lookup table of 4 billion values: the process
    filled its memory (MemoryError, or the kernel's OOM killer) instead of saying what was wrong."""
    with pytest.raises(ValueError, match=r"'offset': 0..4294967296 step 1 has 4294967297 values.*step"):
        IntRange("offset", 0, 2**32)
    with pytest.raises(ValueError, match=r"has 10000001 values"):
        IntRange("x", 0, 10_000_000)
    assert len(IntRange("x", 0, 2**32, step=2**20).values) == 4097


def test_auto_on_a_space_too_large_to_enumerate_does_not_creep_along_one_parameter() -> None:
    """Above the enumeration limit `auto` ranked random draws and the incumbents' neighbours by a tree
    ensemble alone. Trees fitted on few results are flat around the incumbent, so its picks crept one
    value at a time along one parameter: on a smooth bowl over 2,001,000 configs it ended 1.02-1.04x
    from the optimum after 50 evaluations where random search ends about 1.006x. The model now shares
    the proposals with random steps from the incumbent and random draws by their record of new
    incumbents (docs/benchmarks.md, large search spaces)."""
    space = SearchSpace([IntRange("a", 0, 999), IntRange("b", 0, 2000)])
    assert not space.is_enumerable

    def bowl(c: dict) -> float:
        return 1.0 + ((c["a"] - 737) / 1000) ** 2 + ((c["b"] - 1234) / 2000) ** 2

    best = [tuner.optimize(space, bowl, budget=50, seed=s, strategy="auto").best_value for s in range(4)]
    assert sum(best) / len(best) < 1.01, best
