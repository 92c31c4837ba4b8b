"""Whether a stored winner was timed against every config that a tuning would time now.

The search space is not part of the stored key (README, "What a key holds"), so one entry serves every
config list a key is decorated with. When a tuning times every config of its space (an explicit list with
no smaller `budget=`, or a space of at most `budget` configs, and no `time_budget_s`: `times_every_config`),
the user was promised that every config is timed; a winner stored for a shorter list is then not a plain
hit while the current space holds configs that no recorded tuning of this exact key tried: the lookup
misses, the whole current list is tuned once (the store's claim and the winner's replacement are those of
any miss), and from then on the entry hits. A list narrowed to configs that were all tried stays a hit,
and so does a reordered one (configs are compared as the space's canonical values, not in order).

What was tried is read from the trials a tuning records in the store (`tuner_measurements`, each with the
exact key's hash in its stats): no new column, and no new field in cache files. Failed configs count as
tried (timing them again would fail again). An entry whose config no recorded tuning of its key tried
(one imported from a file or another store, stored by an older tuner, or in a store whose trials cannot
be read), and every entry of a shipped file, is used as before: nothing says what it was timed against.
Offline and record modes never tune: there the entry is used as before too (`_resolve.untimed_configs`
asks only in a mode that tunes).

The check costs one indexed read of the key's task's measurements on the first store lookup of the key
in a process; the in-memory hit path after it is unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.search_spaces import SearchSpace
from tuner.search_spaces._params import brief_list

from ._key import canon
from ._sources import guarded

if TYPE_CHECKING:  # pragma: no cover
    from ..store import TaskContext
    from ._db import ConfigCache
    from ._key import CacheKey

__all__ = ["task_of", "tried_configs", "times_every_config", "untimed", "untimed_reason"]


def task_of(name: str, ck: CacheKey) -> TaskContext:
    """The task context of the measurements of a key (its source hash is not part of it: `stats["key"]`)."""
    from ..store import TaskContext

    return TaskContext(
        kernel=name,
        problem=ck.fields_dict,
        device=ck.device,
        versions=ck.versions_dict,
        dtype=",".join(ck.dtypes),
    )


def tried_configs(db: ConfigCache, name: str, ck: CacheKey) -> list[dict[str, Any]]:
    """The configs that tunings of exactly `ck` recorded in `db`'s store tried (failed ones too); empty
    when none is recorded or the store's measurements cannot be read."""
    task_id = task_of(name, ck).task_id
    none: list[dict[str, Any]] = []
    return guarded(db, "read", "read the measurements", lambda: db.tried_configs(task_id, ck.hash), none)


def times_every_config(space: SearchSpace, budget: int, time_budget_s: float | None) -> bool:
    """Whether a tuning of `space` with this budget times every config of it: no time budget, and at most
    `budget` configs (an explicit list is counted; another space by its size before constraints, which
    costs nothing to compute, so a large searched space is never enumerated here)."""
    if time_budget_s is not None:
        return False
    if space.is_explicit:
        return len(space) <= budget
    return space.cartesian_size <= budget


def _canon_in(space: SearchSpace, config: Any) -> str | None:
    """`config` as the space's canonical values (1 and 1.0 of one numeric domain alike), or None when it
    does not fit the space's parameters."""
    try:
        return canon(list(space.key(config)))
    except (ValueError, KeyError, TypeError):
        return None


def untimed(space: SearchSpace, tried: list[dict[str, Any]], winner: Any) -> list[dict[str, Any]]:
    """The configs of `space` that are not among the `tried` configs, in the space's order. Empty when
    `tried` does not hold the stored `winner` (the entry came from elsewhere, an import or an older tuner,
    or no trial is recorded), since nothing is then known of the tuning that chose it."""
    seen = {_canon_in(space, c) for c in tried}
    if _canon_in(space, winner) not in seen:
        return []
    return [c for c in space.enumerate() if _canon_in(space, c) not in seen]


def untimed_reason(configs: list[dict[str, Any]]) -> str:
    """The miss reason of an entry whose tuning did not time `configs` of the current list."""
    n = len(configs)
    return (
        f"the config list has {n} config{'s' if n != 1 else ''} the stored tuning did not time: "
        f"{brief_list(configs, first=3)}; the whole list is tuned once"
    )
