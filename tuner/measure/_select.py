"""Choosing the winner among re-measured finalists: fastest median, with a noise band for ties."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._result import MeasureResult

__all__ = ["Selection", "choose_winner", "config_order_key"]


def config_order_key(config: Mapping[str, Any]) -> str:
    """A deterministic order of configs (canonical JSON), used to break ties."""
    return json.dumps(dict(config), sort_keys=True, default=str)


@dataclass(frozen=True)
class Selection:
    """The winner's index, the indices tied with the fastest (within `band`, relative), the band,
    and every ok index ranked by median."""

    winner: int | None
    tied: tuple[int, ...]
    band: float
    ranking: tuple[int, ...]


def choose_winner(
    configs: Sequence[Mapping[str, Any]],
    results: Sequence[MeasureResult],
    *,
    min_band: float = 0.01,
) -> Selection:
    """Pick the fastest correct config by median. Configs whose median is within the measured noise
    band of the fastest are tied; the tie goes to the first of them in `config_order_key` order, so the
    same measurements always give the same winner and noise alone does not flip it.

    The band is the larger of `min_band` and the fastest config's relative IQR (its own measured
    noise). Only `ok` results take part: an incorrect or failed config can never win."""
    if len(configs) != len(results):
        raise ValueError(f"{len(configs)} configs but {len(results)} results")
    ok = [i for i, r in enumerate(results) if r.ok and r.median is not None]
    if not ok:
        return Selection(None, (), min_band, ())
    ranking = tuple(sorted(ok, key=lambda i: (results[i].median, config_order_key(configs[i]))))
    best = results[ranking[0]]
    assert best.median is not None
    band = max(min_band, best.rel_spread or 0.0)
    limit = best.median * (1.0 + band)
    tied = tuple(i for i in ranking if results[i].median <= limit)  # type: ignore[operator]
    winner = min(tied, key=lambda i: config_order_key(configs[i]))
    return Selection(winner, tied, band, ranking)
