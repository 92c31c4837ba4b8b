"""The strategy contract and the candidate pool that every strategy shares.

A strategy is only its idea: it proposes the next config to measure and hears the result. The shared
loop in `tuner._optimize` owns the budget, the objective, failures, Optuna bookkeeping and storage; the
`CandidatePool` guarantees that no config is proposed twice and that only valid configs are proposed.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tuner.search_spaces import Config, SearchSpace
from tuner.search_spaces._params import native
from tuner.search_spaces._space import SAMPLE_DRAWS

if TYPE_CHECKING:  # pragma: no cover
    import optuna

log = logging.getLogger(__name__)

PriorTask = Sequence[tuple[Mapping[str, Any], float | None]]


def _value_kind(v: Any) -> str:
    """What a config value is as the space compares it: True is not 1, "32" is not 32 (`Param.has`)."""
    v = native(v)
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, (int, float)):
        return "a number"
    return "text" if isinstance(v, str) else type(v).__name__


def _param_kinds(p: Any) -> frozenset[str]:
    if p.kind in ("int", "pow2"):  # an IntRange may hold 10,000,000 values: numbers all
        return frozenset({"a number"})
    return frozenset(_value_kind(v) for v in p.values)


def prior_matching_space(
    space: SearchSpace, prior: Sequence[PriorTask] | None, *, warn: bool = True
) -> Sequence[PriorTask] | None:
    """`prior` with each value of a space parameter that is of another kind than the parameter's values
    left out of its config (a missing value, as for a parameter the task did not record), with one warning
    per prior task naming the parameters. Text where the space has numbers ("32", as `csv.DictReader` reads
    it), a bool where it has numbers, a number where it has bools or text: such a value matches none of the
    space's, and read as a number (True as 1, 1 as True) it would warm-start the search on other configs
    than the task measured. Tasks without such values are passed on as they are."""
    if not prior:
        return prior
    kinds = {p.name: _param_kinds(p) for p in space.params}
    out: list[PriorTask] = []
    for ti, task in enumerate(prior):
        odd: dict[str, tuple[str, Any]] = {}  # parameter -> (the kind found, the first such value)
        rows = list(task)
        for ri, row in enumerate(rows):
            cfg = row[0] if isinstance(row, (tuple, list)) and len(row) == 2 else None
            if not isinstance(cfg, Mapping):
                continue
            bad = [k for k, v in cfg.items() if k in kinds and _value_kind(v) not in kinds[k]]
            if bad:
                for k in bad:
                    odd.setdefault(k, (_value_kind(cfg[k]), cfg[k]))
                rows[ri] = ({k: v for k, v in cfg.items() if k not in bad}, row[1])
        if not odd:
            out.append(task)
            continue
        out.append(rows)
        if not warn:
            continue
        groups: dict[tuple[str, frozenset[str]], list[str]] = {}
        for k in sorted(odd):
            groups.setdefault((odd[k][0], kinds[k]), []).append(k)
        for (found, want), names in groups.items():
            log.warning(
                "prior task %d: parameter %s holds %s (%r) where the space's values are %s, so its configs "
                "match none of the space's; the value is left out of the prior (a missing value)%s",
                ti,
                ", ".join(names),
                found,
                odd[names[0]][1],
                " or ".join(sorted(k if k == "text" else k.replace("a ", "", 1) + "s" for k in want)),
                "; convert the values read from text (a CSV) to numbers"
                if found == "text" and "a number" in want
                else "",
            )
    return out


class CandidatePool:
    """The valid configs of a space with a record of which were already evaluated.

    For an enumerable space the valid configs are held as keys plus a standardised feature matrix, so
    "nearest unseen config" and "random unseen config" are cheap. For a huge space it falls back to
    rejection sampling and neighbourhood search.
    """

    def __init__(self, space: SearchSpace, rng: np.random.Generator) -> None:
        self.space = space
        self.rng = rng
        self.seen: set[tuple] = set()
        self.enumerable = space.is_enumerable
        if self.enumerable:
            self.keys = list(space.iter_keys())
            if not self.keys:
                raise ValueError(f"search space {space.name!r} has no valid config")
            self.index = {space._hkey(k): i for i, k in enumerate(self.keys)}
            enc = space.encode_keys(self.keys)
            with np.errstate(over="ignore", invalid="ignore"):
                mu, sd = enc.mean(axis=0), enc.std(axis=0)
            wide = ~(np.isfinite(mu) & np.isfinite(sd))
            self._scale = np.ones(enc.shape[1])
            if wide.any():  # values near a float's range (1e308) overflow the sums: scale those columns first
                self._scale[wide] = np.abs(enc[:, wide]).max(axis=0)
                enc = enc / self._scale
                mu, sd = enc.mean(axis=0), enc.std(axis=0)
            self._mu = mu
            self._sd = np.where(sd > 0, sd, 1.0)
            self.X = (enc - self._mu) / self._sd
            self.unseen_mask = np.ones(len(self.keys), dtype=bool)

    # ---- bookkeeping -------------------------------------------------------------------------------
    def hkey(self, config: Mapping[str, Any]) -> tuple:
        return self.space._hkey(self.space._key_unchecked(config))

    def mark_seen(self, config: Mapping[str, Any]) -> None:
        h = self.hkey(config)
        self.seen.add(h)
        if self.enumerable:
            i = self.index.get(h)
            if i is not None:
                self.unseen_mask[i] = False

    def is_seen(self, config: Mapping[str, Any]) -> bool:
        return self.hkey(config) in self.seen

    @property
    def size(self) -> int | None:
        return len(self.keys) if self.enumerable else None

    @property
    def remaining(self) -> int | None:
        return int(self.unseen_mask.sum()) if self.enumerable else None

    def exhausted(self) -> bool:
        return self.enumerable and not self.unseen_mask.any()

    def config_at(self, i: int) -> Config:
        return self.space.config(self.keys[i])

    def encode(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return (
            (self.space.encode_many(configs) / self._scale - self._mu) / self._sd
            if self.enumerable
            else self.space.encode_many(configs)
        )

    # ---- proposals ---------------------------------------------------------------------------------
    def random_unseen(self) -> Config | None:
        if self.enumerable:
            idx = np.flatnonzero(self.unseen_mask)
            if idx.size == 0:
                return None
            return self.config_at(int(self.rng.choice(idx)))
        # random draws until an unseen valid one, at most SAMPLE_DRAWS of them in all (a space whose few
        # valid configs were all measured ends instead of drawing for ever)
        left = SAMPLE_DRAWS
        while left > 0:
            keys, draws, _ = self.space._sample_keys(self.rng, 1, left)
            left -= draws
            if keys and self.space._hkey(keys[0]) not in self.seen:
                return self.space.config(keys[0])
        return None

    def nearest_unseen(self, config: Mapping[str, Any]) -> Config | None:
        """The unseen valid config closest to `config` (which may itself be invalid or seen).
        Ties are broken at random so that repeated projections of one point spread out."""
        if self.enumerable:
            idx = np.flatnonzero(self.unseen_mask)
            if idx.size == 0:
                return None
            try:
                x = self.encode([config])[0]
            except (KeyError, ValueError):
                return self.random_unseen()
            with np.errstate(over="ignore", invalid="ignore"):
                d = ((self.X[idx] - x) ** 2).sum(axis=1)
            d[np.isnan(d)] = np.inf  # values near a float's range (1e308) overflow: far, not lost
            best = np.flatnonzero(d <= d.min() + 1e-12)
            return self.config_at(int(idx[int(self.rng.choice(best))]))
        frontier = [dict(config)] if self.space.contains(config) else []
        visited = set()
        while frontier:
            cur = frontier.pop(0)
            for nb in self.space.neighbors(cur):
                h = self.hkey(nb)
                if h in visited:
                    continue
                visited.add(h)
                if h not in self.seen:
                    return nb
                frontier.append(nb)
            if len(visited) > 5000:
                break
        return self.random_unseen()


class Strategy(ABC):
    """Ask/tell over a space. Subclasses implement `propose`, and may override `observe` and
    `optuna_sampler`.

    `propose` returns a new valid config (the pool tells which were seen), or None to let the Optuna
    sampler of `optuna_sampler()` propose; the loop then projects an invalid or repeated proposal onto
    the nearest unseen valid config.
    """

    # What errors, `TuneResult.strategy` and the default study name call it; a subclass that sets none
    # is called by its class name (so two strategies of one's own never share a stored study).
    name: str = "base"
    uses_prior: bool = True  # False: the strategy ignores `prior` (callers need not load one)
    config_class: ClassVar[type | None] = None  # the type of its `config=` settings, if it takes any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, prior: Sequence[PriorTask] | None = None
    ) -> None:
        self.space = space
        self.seed = seed
        # a value of another kind than the space's (True for 1, "32" for 32) matches nothing: left out
        self.prior = prior_matching_space(space, prior) if self.uses_prior else prior
        self.rng = np.random.default_rng(seed)
        self.pool = CandidatePool(space, self.rng)
        self.history: list[tuple[Config, float | None]] = []

    def optuna_sampler(self) -> optuna.samplers.BaseSampler | None:
        return None

    @abstractmethod
    def propose(self) -> Config | None: ...

    def observe(self, config: Config, value: float | None) -> None:  # noqa: B027 (optional hook)
        """Hear a result (`None` = the config failed). Called after the pool marked it seen."""

    def tell(self, config: Config, value: float | None) -> None:
        self.pool.mark_seen(config)
        self.history.append((config, value))
        self.observe(config, value)
