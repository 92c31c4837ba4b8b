"""SearchSpace: parameters, hard constraints, sampling, enumeration, neighbours, features, fingerprint."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ._params import NONE_VALUE, Param, Value, brief, brief_list, native, param_from_values

if TYPE_CHECKING:  # pragma: no cover
    from optuna.distributions import BaseDistribution

__all__ = ["Constraint", "SearchSpace", "ConfigError", "Config"]

Config = dict[str, Value]

# Spaces whose cartesian product is at most this large are enumerated once and cached.
ENUMERATE_LIMIT = 2_000_000

# Random draws (before constraints) in which rejection sampling of a space too large to enumerate must find
# a valid config before it says it finds none: a space whose constraints pass 1 config in 10,000 (shared
# memory and register limits over 16 parameters) misses with odds e**-20; one that passes 1 in 10,000,000
# is refused after about a second or two of draws (10,000 draws refused 1 in 10,000 with odds 1 in e).
SAMPLE_DRAWS = 200_000


class ConfigError(ValueError):
    """A config that the space rejects; `reasons` names the offending values."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


@dataclass(frozen=True)
class Constraint:
    """A hard constraint: `check(config)` returns True when the config can run.

    `uses` lists the parameter names whose values the violation message shows; `name` says what is
    violated ("smem <= 227 KiB"). `check` may also return a string: the reason, meaning "violated".
    Constraints that need the problem or the device close over them when the space is built.
    """

    name: str
    check: Callable[[Mapping[str, Any]], bool | str]
    uses: tuple[str, ...] = ()
    detail: Callable[[Mapping[str, Any]], str] | None = field(default=None, compare=False)

    def violation(self, config: Mapping[str, Any]) -> str | None:
        try:
            ok = self.check(config)
        except Exception as exc:  # a bug in the check (a typo in a name, a division by zero): say where
            exc.add_note(f"raised by constraint {self.name!r} checking the config {dict(config)}")
            raise
        try:
            truth = ok is True or (ok is not False and not isinstance(ok, str) and bool(ok))
        except Exception as exc:  # an array of several values: numpy's "truth value ... is ambiguous"
            exc.add_note(f"constraint {self.name!r} returned {brief(ok)}, not True, False or a reason")
            raise
        if truth:
            return None
        vals = ", ".join(f"{k}={config.get(k)!r}" for k in self.uses) if self.uses else ""
        extra = ok if isinstance(ok, str) else (self.detail(config) if self.detail else "")
        parts = [f"violates {self.name}"]
        if vals:
            parts.append(f"({vals})")
        if extra:
            parts.append(f": {extra}")
        return " ".join(parts)


class SearchSpace:
    """A kernel's tunable parameters with hard constraints.

    A config is a dict name -> value with exactly the space's parameter names. `contains` is true
    when every value is in its parameter's domain and every constraint holds (for a space made by
    `from_configs`, when it is one of those configs).
    """

    def __init__(
        self,
        params: Sequence[Param],
        constraints: Sequence[Constraint] = (),
        *,
        name: str = "",
        configs: Sequence[Mapping[str, Value]] | None = None,
        suggested: Sequence[Mapping[str, Value]] = (),
    ) -> None:
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            counts: dict[str, int] = {}
            for n in names:
                counts[n] = counts.get(n, 0) + 1
            dup = sorted(n for n, k in counts.items() if k > 1)  # (names.count per name was quadratic)
            raise ValueError(f"duplicate parameter names: {brief_list(dup)}")
        if not params:
            raise ValueError("a search space needs at least one parameter")
        self.params: tuple[Param, ...] = tuple(params)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self.name = name
        self._by_name = {p.name: p for p in self.params}
        self._explicit: list[tuple[Value, ...]] | None = None
        self._explicit_set: set[tuple] | None = None
        # from_configs: the user's own values of each config whose values differ in type from the domain's
        # (1 where another config gave 1.0), keyed by _hkey of the canonical key.
        self._given: dict[tuple, Config] = {}
        self._valid_cache: list[tuple[Value, ...]] | None = None
        self._valid_pos: np.ndarray | None = None  # positions of _valid_cache's values (_nearest_valid)
        self._feature_names: list[str] | None = None
        if isinstance(suggested, Mapping) or not all(isinstance(c, Mapping) for c in suggested):
            raise ValueError("suggested must be a list of config dicts")
        self._suggested_given: tuple[dict[str, Value], ...] = tuple(dict(c) for c in suggested)
        self._suggested: list[Config] | None = None
        if configs is not None:
            keys = [self._key_unchecked(c) for c in configs]
            self._explicit = keys
            self._explicit_set = {self._hkey(k) for k in keys}

    # ---- construction ------------------------------------------------------------------------------
    @classmethod
    def from_configs(cls, configs: Sequence[Mapping[str, Value]], *, name: str = "") -> SearchSpace:
        """A finite space whose candidates are exactly `configs` (a list of dicts).

        Raises ValueError on an empty list, inconsistent keys, unsupported value types or duplicates.
        """
        if not isinstance(configs, (list, tuple)):
            raise ValueError(f"configs must be a list of dicts, got {type(configs).__name__}")
        if not configs:
            raise ValueError("configs is empty: a space needs at least one config")
        first = configs[0]
        if not isinstance(first, Mapping) or not first:
            raise ValueError(f"config 0 is not a non-empty dict: {first!r}")
        keys = list(first.keys())
        keyset = set(keys)
        columns: dict[str, list[Value]] = {k: [] for k in keys}
        for i, c in enumerate(configs):
            if not isinstance(c, Mapping):
                raise ValueError(f"config {i} is not a dict: {c!r}")
            if set(c.keys()) != keyset:
                missing = sorted(keyset - set(c.keys()))
                extra = sorted(set(c.keys()) - keyset)
                raise ValueError(
                    f"config {i} has inconsistent keys (missing {missing}, extra {extra}) compared with config 0"
                )
            for k in keys:
                v = native(c[k])
                if v is None:
                    raise ValueError(f"config {i}: parameter {k!r}: {NONE_VALUE}")
                if not isinstance(v, (int, float, str, bool)) or (
                    isinstance(v, float) and not math.isfinite(v)
                ):
                    raise ValueError(f"config {i}: {k}={v!r} is not an int, finite float, str or bool")
                columns[k].append(v)
        params = [param_from_values(k, columns[k]) for k in keys]
        space = cls(params, name=name)
        seen: dict[tuple, int] = {}
        explicit: list[tuple[Value, ...]] = []
        dups: list[tuple[int, int]] = []  # (config, the earlier config it duplicates)
        for i, c in enumerate(configs):
            own = tuple(native(c[k]) for k in keys)
            key = tuple(space._by_name[k].canonical(v) for k, v in zip(keys, own, strict=True))
            h = cls._hkey(key)
            if h in seen:
                dups.append((i, seen[h]))
                continue
            seen[h] = i
            explicit.append(key)
            if any(type(a) is not type(b) for a, b in zip(own, key, strict=True)):
                space._given[h] = dict(zip(keys, own, strict=True))
        if dups:
            shown = "; ".join(
                f"config {i} duplicates config {j}: {brief(dict(configs[i]))}" for i, j in dups[:3]
            )
            more = f"; ... ({len(dups)} duplicates in all)" if len(dups) > 3 else ""
            raise ValueError(shown + more)
        space._explicit = explicit
        space._explicit_set = set(seen)
        return space

    @classmethod
    def from_kernel_tuner(
        cls,
        tune_params: Mapping[str, Sequence[Value]],
        restrictions: Any = None,
        *,
        name: str = "",
        max_threads: int | None = None,
        block_size_names: Sequence[str] | None = None,
    ) -> SearchSpace:
        """The space of a Kernel Tuner `tune_params` dict (name -> list of values, or a 1-D numpy array) and
        its `restrictions`.

        `restrictions` is what `kernel_tuner.tune_kernel` takes: None, or a list of strings (Python
        expressions over the parameter names, such as "block_size_x*block_size_y<=1024"), functions of
        the config dict (one argument) or of all parameter values in order (two or more required, or
        named as the first parameters: `def r(block_size_x, tile=1)`, as Kernel Tuner calls them) or of
        all parameters by name (keyword-only parameters or `**kwargs`: `def r(*, block_size_x, tile)`), and
        `(function, [names])` pairs whose function takes those values in order (or by name).
        Strings are parsed with `ast` and evaluated by a whitelist interpreter (arithmetic, comparisons,
        and/or/not, if-else, literals, min/max/abs/int/float/round/len/pow, sum of a list or tuple written
        out, range after `in`), never by `eval`; a name that is
        not a parameter, or any other construct, is a ValueError naming the restriction. Numeric values
        become ordered parameters, others categorical (`param_from_values`).

        `max_threads` adds the limit Kernel Tuner adds by itself (the device's threads per block, 1024
        on NVIDIA GPUs): the product of the thread block dimensions present in `tune_params`
        (`block_size_names`, completed as Kernel Tuner does with block_size_x, block_size_y and
        block_size_z) is at most `max_threads`. Without it there is no such limit."""
        from ._restrictions import block_size_restriction, restriction_constraints

        if not isinstance(tune_params, Mapping) or not tune_params:
            raise ValueError("tune_params must be a non-empty dict of parameter name -> list of values")
        params = []
        for k, given in tune_params.items():
            if not isinstance(k, str):
                raise ValueError(f"tune_params: parameter name {k!r} is not a string")
            vals: Any = given
            if getattr(vals, "ndim", None) == 1 and callable(getattr(vals, "tolist", None)):
                vals = vals.tolist()  # a 1-D numpy array (np.arange(...)), as Kernel Tuner takes it
            if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence) or len(vals) == 0:
                raise ValueError(f"tune_params[{k!r}] must be a non-empty list of values, got {vals!r}")
            if any(v is None for v in vals):
                # Kernel Tuner takes None as a value; here a config holds ints, floats, strs and bools only
                raise ValueError(
                    f"tune_params[{k!r}] holds None, which Kernel Tuner takes as a value and tuner does not "
                    f"(a config's values are int, float, str or bool): use a sentinel string such as "
                    f'"none" in tune_params, in the restrictions that test it ({k} == "none" for '
                    f"{k} is None) and where your kernel reads it"
                )
            params.append(param_from_values(k, list(vals)))
        constraints = restriction_constraints(restrictions, list(tune_params))
        limit = block_size_restriction(max_threads, block_size_names, list(tune_params))
        return cls(params, constraints + ([limit] if limit is not None else []), name=name)

    # ---- basic properties --------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def __getitem__(self, name: str) -> Param:
        return self._by_name[name]

    def __len__(self) -> int:
        """Number of valid configs (enumerates the space; may be slow for huge spaces)."""
        return len(self._valid_keys())

    @property
    def is_explicit(self) -> bool:
        return self._explicit is not None

    @property
    def cartesian_size(self) -> int:
        return math.prod(len(p.values) for p in self.params)

    @property
    def declares_default(self) -> bool:
        """Whether a parameter names its default (`default=`; a registered kernel's spaces do): then
        `default()` is the space author's choice, which the model-guided strategy measures first on a
        cold start. A space made by `from_configs` declares none."""
        return self._explicit is None and any(p.default is not None for p in self.params)

    @property
    def is_enumerable(self) -> bool:
        return self._explicit is not None or self.cartesian_size <= ENUMERATE_LIMIT

    def __repr__(self) -> str:
        kind = (
            f"{len(self._explicit)} explicit configs"
            if self._explicit is not None
            else (f"{self.cartesian_size} before constraints, {len(self.constraints)} constraints")
        )
        return f"SearchSpace({self.name or 'unnamed'}: {', '.join(self.names)}; {kind})"

    # ---- keys --------------------------------------------------------------------------------------
    @staticmethod
    def _hkey(key: Iterable[Any]) -> tuple:
        # bools and ints hash alike in Python (True == 1); keep them apart.
        return tuple((v, type(v) is bool) for v in key)

    def _key_unchecked(self, config: Mapping[str, Any]) -> tuple[Value, ...]:
        return tuple(config[n] for n in self.names)

    def key(self, config: Mapping[str, Any]) -> tuple[Value, ...]:
        """The config as a tuple in parameter order (canonical values). Raises ConfigError if malformed."""
        reasons = self._domain_violations(config)
        if reasons:
            raise ConfigError(reasons)
        return tuple(p.canonical(config[p.name]) for p in self.params)

    def config(self, key: Sequence[Value]) -> Config:
        return dict(zip(self.names, key, strict=True))

    def as_given(self, config: Mapping[str, Any]) -> Config:
        """A copy of `config` with the values its user gave: a space of `from_configs` whose configs gave
        one parameter both 1 and 1.0 holds one of them in its domain, and hands each config back with its
        own (the objective of {"a": 1, ...} gets the int 1, that of {"a": 1.0, ...} the float)."""
        if self._given:
            try:
                own = self._given.get(self._hkey(self.key(config)))
            except ConfigError:
                own = None
            if own is not None:
                return dict(own)
        return dict(config)

    # ---- membership --------------------------------------------------------------------------------
    def _domain_violations(self, config: Mapping[str, Any]) -> list[str]:
        if not isinstance(config, Mapping):
            return [f"config must be a dict, got {type(config).__name__}"]
        reasons = []
        missing = [n for n in self.names if n not in config]
        extra = [k for k in config if k not in self._by_name]
        if missing:
            reasons.append(f"missing parameters: {missing}")
        if extra:
            reasons.append(f"unknown parameters: {extra}")
        for p in self.params:
            if p.name in config and not p.has(config[p.name]):
                reasons.append(f"{p.name}={config[p.name]!r} is not one of {list(p.values)}")
        return reasons

    def violations(self, config: Mapping[str, Any]) -> list[str]:
        """Every reason the config is rejected (empty when it is valid), naming the offending values."""
        reasons = self._domain_violations(config)
        if reasons:
            return reasons
        if self._explicit_set is not None:
            key = tuple(p.canonical(config[p.name]) for p in self.params)
            if self._hkey(key) not in self._explicit_set:
                reasons.append(f"config {dict(config)} is not one of the space's configs")
        for c in self.constraints:
            why = c.violation(config)
            if why:
                reasons.append(why)
        return reasons

    def contains(self, config: Mapping[str, Any]) -> bool:
        return not self.violations(config)

    __contains__ = contains

    def validate(self, config: Mapping[str, Any]) -> Config:
        """Return the canonical config, or raise ConfigError with every reason."""
        reasons = self.violations(config)
        if reasons:
            raise ConfigError(reasons)
        return {p.name: p.canonical(config[p.name]) for p in self.params}

    def _satisfies(self, key: tuple[Value, ...]) -> bool:
        if not self.constraints:
            return True
        cfg = dict(zip(self.names, key, strict=True))
        return all(c.violation(cfg) is None for c in self.constraints)

    # ---- enumeration and sampling ------------------------------------------------------------------
    def _valid_keys(self) -> list[tuple[Value, ...]]:
        if self._valid_cache is None:
            if self._explicit is not None:
                keys = [k for k in self._explicit if self._satisfies(k)]
            else:
                if self.cartesian_size > ENUMERATE_LIMIT:
                    raise ValueError(
                        f"space {self.name!r} has {self.cartesian_size} configs before constraints "
                        f"(limit {ENUMERATE_LIMIT}); it cannot be enumerated"
                    )
                keys = [k for k in itertools.product(*(p.values for p in self.params)) if self._satisfies(k)]
            self._valid_cache = keys
        return self._valid_cache

    def _no_valid_config(
        self, draws: int = 10_000, *, tried: Sequence[tuple[Value, ...]] | None = None, total: int = 0
    ) -> ValueError:
        """The error for a space whose constraints admit no config, saying which constraints reject how
        much of the space (over at most `draws` configs before constraints: all of them, or random ones).
        `tried`: the random draws that found no valid config (their first `draws` are counted), `total`
        how many there were."""
        label = repr(self.name) if self.name else "(unnamed)"
        if tried is not None:
            keys = list(tried[:draws])
        elif self._explicit is not None:
            keys = self._explicit[:draws]
        elif self.cartesian_size <= draws:
            keys = list(itertools.product(*(p.values for p in self.params)))
        else:
            keys = self._draw_keys(np.random.default_rng(0), draws)
        shares = []
        for c in self.constraints:
            bad = sum(c.violation(dict(zip(self.names, k, strict=True))) is not None for k in keys)
            none = keys and c.check(dict(zip(self.names, keys[0], strict=True))) is None
            shares.append(
                f"{c.name!r} rejects {bad} of {len(keys)}"
                + (" (its check returns None: no return?)" if none else "")
            )
        why = "; ".join(shares) or "no constraint"
        if self.is_enumerable:
            return ValueError(
                f"search space {label} has no valid config: the constraints reject all {len(keys)} "
                f"configs ({why})"
            )
        total = max(total, len(keys))
        counted = f", of the first {len(keys)}: " if total > len(keys) else " ("
        return ValueError(
            f"search space {label}: none of {total} random draws from its {self.cartesian_size} configs "
            f"(before constraints) is valid{counted}{why}{')' if counted == ' (' else ''}. The space is too "
            f"large to enumerate (over {ENUMERATE_LIMIT}), so valid configs are found by random draws: "
            "narrow the domains, or list the valid configs with SearchSpace.from_configs"
        )

    def check_not_empty(self) -> None:
        """Raise ValueError, saying which constraints reject how much, when no config is valid (an
        enumerable space: none at all; a larger one: none in `SAMPLE_DRAWS` random draws)."""
        if self.is_enumerable:
            if not self._valid_keys():
                raise self._no_valid_config()
        else:
            self.sample(0)

    def enumerate(self) -> list[Config]:
        """Every valid config, in a stable order."""
        return [dict(zip(self.names, k, strict=True)) for k in self._valid_keys()]

    def iter_keys(self) -> Iterator[tuple[Value, ...]]:
        return iter(self._valid_keys())

    def _draw_keys(self, gen: np.random.Generator, count: int) -> list[tuple[Value, ...]]:
        """`count` uniform draws from the cartesian product (before constraints), drawn in one call."""
        sizes = [len(p.values) for p in self.params]
        rows = gen.integers(0, sizes, size=(count, len(sizes))).tolist()
        vals = [p.values for p in self.params]
        return [tuple(v[i] for v, i in zip(vals, row, strict=True)) for row in rows]

    def _sample_keys(
        self, gen: np.random.Generator, count: int, max_draws: int
    ) -> tuple[list[tuple[Value, ...]], int, list[tuple[Value, ...]]]:
        """Rejection sampling: up to `count` valid keys within `max_draws` random draws (in batches).
        Returns (the valid keys, the draws made, the first 10,000 draws when none was valid)."""
        out: list[tuple[Value, ...]] = []
        first: list[tuple[Value, ...]] = []
        draws = 0
        while len(out) < count and draws < max_draws:
            # batches that double while nothing stops them: a cheap first draw, few numpy calls for a rare one
            batch = min(max_draws - draws, max(64, min(65_536, max(4 * (count - len(out)), draws))))
            for key in self._draw_keys(gen, batch):
                draws += 1
                if self._satisfies(key):
                    out.append(key)
                    if len(out) == count:
                        break
                elif not out and len(first) < 10_000:
                    first.append(key)
        return out, draws, first if not out else []

    def sample(self, rng: np.random.Generator | int | None = None, n: int | None = None) -> Any:
        """One valid config (n=None) or a list of n (with replacement), uniformly over valid configs.

        `rng` is a seed or a `numpy.random.Generator` (the first argument: `sample(5)` is one config
        drawn with seed 5; `sample(n=5)` or `sample(seed, 5)` are five). An enumerable space draws from
        its valid configs; a larger one by rejection sampling: ValueError when `SAMPLE_DRAWS` random
        draws (or 10,000 per config asked for, where that is more) find too few valid configs."""
        if n is not None:
            n = native(n)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"n must be None or a non-negative int, got {n!r}")
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        count = 1 if n is None else n
        out: list[Config] = []
        if self.is_enumerable:
            keys = self._valid_keys()
            if not keys:
                raise self._no_valid_config()
            for i in gen.integers(0, len(keys), size=count):
                out.append(dict(zip(self.names, keys[int(i)], strict=True)))
        else:
            limit = max(SAMPLE_DRAWS, 10_000 * count)
            found, draws, tried = self._sample_keys(gen, max(count, 1), limit)
            if not found:
                raise self._no_valid_config(tried=tried, total=draws)
            if len(found) < count:
                raise ValueError(
                    f"space {self.name!r}: rejection sampling found {len(found)} of {count} valid configs "
                    f"in {draws} draws"
                )
            out = [dict(zip(self.names, k, strict=True)) for k in found[:count]]
        return out[0] if n is None else out

    def default(self) -> Config:
        """Each parameter's default; if that violates a constraint, the nearest valid config."""
        cfg = {p.name: p.default_value for p in self.params}
        near = self._nearest_valid(cfg)
        return near if near is not None else self.sample(0)

    def _nearest_valid(self, cfg: Config) -> Config | None:
        """`cfg` (every value in its parameter's domain) if valid, else the valid config nearest to it
        (standardised distance over the encoded values) in an enumerable space, else None."""
        if self.contains(cfg):
            return cfg
        if not self.is_enumerable:
            return None
        keys = self._valid_keys()
        if not keys:
            raise self._no_valid_config()
        x = self.encode(cfg)
        enc = self.encode_keys(keys)
        sd = enc.std(axis=0)
        # a column every valid config shares tells them apart by nothing: left out (scaled by a tiny
        # number instead, its constant offset drowned every other column in rounding error)
        live = sd > 1e-12
        d = (((enc[:, live] - x[live]) / sd[live]) ** 2).sum(axis=1)
        # fewest parameters changed first (a GROUP_M too tall for a small M changes GROUP_M alone), then
        # the distance
        if self._valid_pos is None:  # each valid config's value positions, one row per config
            self._valid_pos = np.array(
                [[p.index(v) for p, v in zip(self.params, k, strict=True)] for k in keys], dtype=np.int32
            ).reshape(len(keys), len(self.params))
        own = np.array([p.index(cfg[p.name]) for p in self.params], dtype=np.int32)
        changed = (self._valid_pos != own).sum(axis=1)
        best = np.lexsort((d, changed))[0]
        return dict(zip(self.names, keys[int(best)], strict=True))

    @property
    def suggested(self) -> list[Config]:
        """The configs the space's author suggests measuring first (`suggested=`, e.g. a kernel's known
        good tiles for a GPU generation, as Triton's tutorials list them), made valid here: a parameter
        left out takes its default, a key the space does not have is ignored, a numeric value outside its
        domain takes the nearest value in it, and a config that breaks a constraint becomes the nearest
        valid one (enumerable spaces; dropped otherwise, as is one with an unknown categorical value).
        Duplicates after that are dropped. The model-guided strategy measures these after the default on
        a cold start."""
        if self._suggested is None:
            out: list[Config] = []
            seen: set[tuple] = set()
            for given in self._suggested_given:
                cfg: dict[str, Value] = {}
                for p in self.params:
                    v = given.get(p.name, p.default_value)
                    if not p.has(v):
                        if not (p.ordered and p.is_numeric and isinstance(v, (int, float))):
                            cfg = {}
                            break
                        x = float(v)
                        v = min(p.values, key=lambda d: (abs(float(d) - x), float(d)))  # type: ignore[arg-type]
                    cfg[p.name] = p.canonical(v)
                near = self._nearest_valid(cfg) if cfg else None
                if near is None:
                    continue
                h = self._hkey(tuple(near[n] for n in self.names))
                if h not in seen:
                    seen.add(h)
                    out.append(near)
            self._suggested = out
        return list(self._suggested)

    # ---- neighbourhood ----------------------------------------------------------------------------
    def neighbors(self, config: Mapping[str, Any], method: str = "adjacent") -> list[Config]:
        """Valid configs one move away.

        - "adjacent": change one parameter to an adjacent value (any other value if unordered);
        - "hamming": change one parameter to any other value.
        For an explicit space only configs in the space count.
        """
        key = self.key(config)
        out: list[Config] = []
        for i, p in enumerate(self.params):
            if method == "adjacent":
                cand = p.neighbor_values(key[i])
            elif method == "hamming":  # the domain has no two values alike (Param): all but the own one
                j = p.index(key[i])
                cand = [*p.values[:j], *p.values[j + 1 :]]
            else:
                raise ValueError(f"unknown neighbourhood {method!r}: use 'adjacent' or 'hamming'")
            for v in cand:
                k2 = key[:i] + (v,) + key[i + 1 :]
                if self._explicit_set is not None and self._hkey(k2) not in self._explicit_set:
                    continue
                if self._satisfies(k2):
                    out.append(dict(zip(self.names, k2, strict=True)))
        return out

    # ---- features ----------------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        if self._feature_names is None:
            self._feature_names = [f for p in self.params for f in p.feature_names()]
        return self._feature_names

    def encode(self, config: Mapping[str, Any]) -> np.ndarray:
        """Numeric feature vector: numbers raw and log2, booleans 0/1, categoricals one-hot."""
        return np.array([x for p in self.params for x in p.encode(config[p.name])], dtype=np.float64)

    def encode_keys(self, keys: Sequence[Sequence[Value]]) -> np.ndarray:
        """Encode many configs given as keys; vectorised per parameter."""
        n = len(keys)
        cols: list[np.ndarray] = []
        arr = list(zip(*keys, strict=True)) if n else [() for _ in self.params]
        for p, column in zip(self.params, arr, strict=True):
            if p.is_numeric:
                if any(isinstance(v, (bool, np.bool_)) for v in column):  # as Param.encode: True is not 1
                    p.encode(next(v for v in column if isinstance(v, (bool, np.bool_))))  # raises
                x = np.asarray(column, dtype=np.float64)
                cols.append(x[:, None])
                if all(float(v) > 0 for v in p.values):  # type: ignore[arg-type]
                    cols.append(np.log2(x)[:, None])
            elif all(isinstance(v, bool) for v in p.values):
                for v in column:
                    if not isinstance(v, (bool, np.bool_)):
                        p.encode(v)  # raises: 1 is not True
                cols.append(np.asarray(column, dtype=np.float64)[:, None])
            else:
                idx = np.array([p.index(v) for v in column], dtype=np.int64)
                onehot = np.zeros((n, len(p.values)))
                onehot[np.arange(n), idx] = 1.0
                cols.append(onehot)
        return np.hstack(cols) if cols else np.zeros((n, 0))

    def encode_many(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return self.encode_keys([self._key_unchecked(c) for c in configs])

    # ---- identity ----------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "params": [p.describe() for p in self.params],
            "constraints": [c.name for c in self.constraints],
        }
        if self._explicit is not None:
            d["configs"] = sorted([list(k) for k in self._explicit], key=lambda k: json.dumps(k))
        return d

    def fingerprint(self) -> str:
        """A stable hash of the parameters, their domains, the constraint names and explicit configs.

        Constraint *functions* are not hashed (they are code); rename a constraint when its meaning
        changes."""
        blob = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ---- Optuna ------------------------------------------------------------------------------------
    def to_optuna(self) -> dict[str, BaseDistribution]:
        """Optuna distributions: ordered numeric parameters as IntDistribution where the domain is a
        full integer range, else CategoricalDistribution over the values. The constraints are not in
        them: check `contains(trial.params)` before measuring."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        out: dict[str, BaseDistribution] = {}
        for p in self.params:
            vals = list(p.values)
            ints = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
            step = ints[1] - ints[0] if len(ints) > 1 else 0
            # an evenly spaced ascending range, checked pairwise: `list(range(...))` of a domain such as
            # (1, 2**1000) would not fit in memory (OverflowError)
            if (
                len(ints) == len(vals) > 1
                and step > 0
                and all(b - a == step for a, b in itertools.pairwise(ints))
            ):
                out[p.name] = IntDistribution(ints[0], ints[-1], step=step)
            else:
                out[p.name] = CategoricalDistribution(vals)
        return out
