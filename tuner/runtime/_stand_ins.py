"""`tuner.autotune(stand_ins=...)`: the values a miss inside a jax trace is timed on, for the arguments
whose values set the launcher's work.

Such a miss is tuned on concrete stand-ins of the traced arguments (`_jax.resolve_on_concrete`): random
normal for floating dtypes, zeros otherwise. Where an integer argument sets the work (group sizes, sequence
lengths, indices), zeros time a degenerate case (no row of a grouped matmul is written, every sequence is
empty) and its winner is stored under the key of real traffic. `stand_ins` gives the values instead:

- a dict `{argument name: value}`, each value an array (or anything `jnp.asarray` takes) or a function of
  the argument's abstract value (the argument with each tracer as a `jax.ShapeDtypeStruct`: a pytree for
  a pytree argument) returning it;
- a function called as the decorated function is called (the config's parameters left out), with each
  tracer replaced by its `jax.ShapeDtypeStruct`, returning such a dict (for values that depend on other
  arguments: group sizes that sum to the rows of `x`).

Only arguments that the call traced are replaced: a concrete argument (static, or a closure's array
passed in) keeps its own values, as does a concrete leaf inside a traced pytree argument. A value must
have the traced argument's pytree structure and each traced leaf's shape and dtype (a weakly typed leaf,
a Python number traced by `jit`, takes a Python number, so that its key stays that of the number); else
`ValueError` naming the function, the argument, the leaf and both shapes and dtypes (`checked_stand_in`,
which `tuner.kernel` runs on a spec's `extra["stand_ins"]` too). A name that is no
parameter of the decorated function is refused when decorating (the dict form) or at the traced miss
(the function form).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from ._env import call_users_function, check_users_function

# What `tuner.autotune(stand_ins=...)` takes (module docstring).
StandInsArg: TypeAlias = Mapping[str, Any] | Callable[..., Mapping[str, Any]]


def check_stand_ins(
    stand_ins: Any, name: str, fn: Any, arg_names: Sequence[str], config_names: Sequence[str]
) -> None:
    """At decoration: TypeError for a `stand_ins` of another type, or a function that cannot take the
    call's arguments; ValueError for a dict naming no parameter of the function, or a config parameter."""
    if isinstance(stand_ins, Mapping):
        bad = [k for k in stand_ins if not isinstance(k, str) or k not in arg_names]
        if bad:
            raise ValueError(
                f"{name}: stand_ins names {bad}, which are not parameters of {name} ({list(arg_names)})"
            )
        config = [k for k in stand_ins if k in config_names]
        if config:
            raise ValueError(
                f"{name}: stand_ins names {config}, parameters of the search space: the config gives them"
            )
        return
    if not callable(stand_ins):
        raise TypeError(
            f"{name}: stand_ins must be a dict {{argument name: array or function of its "
            f"jax.ShapeDtypeStruct}} or a function of the call's arguments returning one; got "
            f"{type(stand_ins).__name__}"
        )
    check_users_function(stand_ins, f"the stand_ins function of {name}", fn, config_names)


def user_stand_ins(
    stand_ins: StandInsArg, name: str, arg_names: Sequence[str], positional: int | None
) -> Callable[[tuple[tuple, dict], tuple[tuple, dict]], tuple[tuple, dict]]:
    """The `_jax.StandIns` hook of `stand_ins`: (the arguments with a ShapeDtypeStruct for each tracer,
    their generic stand-ins) -> the stand-ins, with the user's values for the traced arguments they name."""
    names = list(arg_names) if positional is None else list(arg_names)[:positional]

    def where(arg: str, args: tuple, kwargs: dict) -> int | str | None:
        """The argument's place in the call: its position, its keyword, or None (not passed)."""
        if arg in names and names.index(arg) < len(args):
            return names.index(arg)
        return arg if arg in kwargs else None

    def replace(shapes: tuple[tuple, dict], concrete: tuple[tuple, dict]) -> tuple[tuple, dict]:
        sargs, skwargs = shapes
        args, kwargs = list(concrete[0]), dict(concrete[1])
        if isinstance(stand_ins, Mapping):
            given: Mapping[str, Any] = stand_ins
        else:
            given = call_users_function(stand_ins, f"the stand_ins function of {name}", sargs, skwargs)
            if not isinstance(given, Mapping):
                raise TypeError(
                    f"{name}: the stand_ins function returned {type(given).__name__}, not a dict "
                    f"{{argument name: array}}"
                )
            bad = [k for k in given if k not in arg_names]
            if bad:
                raise ValueError(
                    f"{name}: the stand_ins function gives {bad}, which are not parameters of {name} "
                    f"({list(arg_names)})"
                )
        for arg, value in given.items():
            at = where(arg, sargs, skwargs)
            if at is None:  # its default: not traced
                continue
            abstract = sargs[at] if isinstance(at, int) else skwargs[at]
            if not is_traced(abstract):  # the caller's own values
                continue
            made = value(abstract) if isinstance(stand_ins, Mapping) and callable(value) else value
            current = args[at] if isinstance(at, int) else kwargs[at]
            new = checked_stand_in(f"{name}: stand_ins gives", "argument", arg, abstract, made, current)
            if isinstance(at, int):
                args[at] = new
            else:
                kwargs[at] = new
        return tuple(args), kwargs

    return replace


def is_traced(abstract: Any) -> bool:
    """Whether an argument with each tracer replaced by its ShapeDtypeStruct (`_jax._shapes_of`) held one."""
    import jax

    from ._jax import _KeySpec

    return any(isinstance(x, (jax.ShapeDtypeStruct, _KeySpec)) for x in jax.tree_util.tree_leaves(abstract))


def checked_stand_in(says: str, noun: str, arg: str, abstract: Any, value: Any, current: Any) -> Any:
    """`value` as the stand-in of the traced argument `arg` (abstract: its ShapeDtypeStructs; current: the
    generic stand-ins), its leaves jax arrays; ValueError where it differs from the traced argument,
    naming it and the leaf: `{says} {noun} 'arg'{leaf} ...` (`tuner.autotune`: "f: stand_ins gives",
    "argument"; `tuner.kernel`: "kernel 'k': its stand_ins give", "input"). The one check of the
    stand-ins of every front end."""
    import jax
    import numpy as np

    from ._jax import _KeySpec

    def is_leaf(x: Any) -> bool:
        return isinstance(x, (jax.ShapeDtypeStruct, _KeySpec))

    what = f"{noun} {arg!r}"

    a_tree: Any
    a_leaves, a_tree = jax.tree_util.tree_flatten(abstract, is_leaf=is_leaf)
    if a_tree == jax.tree_util.tree_structure(0) and isinstance(value, (list, tuple, np.ndarray)):
        value = _as_array(value, says, what)  # one array: a (nested) list or a numpy array will do
    v_leaves, v_tree = jax.tree_util.tree_flatten(value)
    if v_tree != a_tree:
        raise ValueError(f"{says} {what} the structure {v_tree}, the traced {noun} has {a_tree}")
    c_leaves = jax.tree_util.tree_leaves(current, is_leaf=is_leaf)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract, is_leaf)[0]]
    out = []
    for want, got, mine, path in zip(a_leaves, v_leaves, c_leaves, paths, strict=True):
        if not is_leaf(want):  # concrete in the call: its own value
            out.append(mine)
            continue
        where = f"{what}{path}"
        if isinstance(want, _KeySpec):
            got = _as_array(got, says, where)
            if tuple(got.shape) != want.shape or not jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
                raise ValueError(
                    f"{says} {where} shape {tuple(got.shape)} dtype {got.dtype}, the traced {noun} is a "
                    f"typed PRNG key array of shape {want.shape}"
                )
            out.append(got)
            continue
        shape = tuple(want.shape)
        weak = bool(getattr(want, "weak_type", False))
        arr: Any
        if weak and _is_number(got):  # a Python number traced by jit: weakly typed, as jit makes it
            arr = jax.lax.full(shape, got)
            if arr.dtype != want.dtype:
                arr = None
        else:
            arr = _as_array(got, says, where)
        if arr is None or tuple(arr.shape) != shape or np.dtype(arr.dtype) != np.dtype(want.dtype):
            desc = (
                f"the Python number {got!r}" if arr is None else f"shape {tuple(arr.shape)} dtype {arr.dtype}"
            )
            raise ValueError(
                f"{says} {where} {desc}, the traced {noun} has shape {shape} dtype {np.dtype(want.dtype)}"
            )
        if weak and not getattr(arr, "weak_type", False):
            raise ValueError(
                f"{says} {where} a {arr.dtype} array, the traced {noun} is a Python number that jax.jit "
                f"traced (weakly typed): give a Python number, so that the key stays the number's"
            )
        if not weak and getattr(arr, "weak_type", False):  # `jnp.asarray(2.0)`: strongly typed, as traced
            arr = arr.astype(arr.dtype)
        out.append(arr)
    return jax.tree_util.tree_unflatten(a_tree, out)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not hasattr(x, "shape")


def _as_array(x: Any, says: str, where: str) -> Any:
    """`x` as a jax array; ValueError naming the leaf where it is none (a str, None, an object)."""
    import jax
    import jax.numpy as jnp

    if isinstance(x, jax.Array):
        return x
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{says} {where} a {type(x).__name__} ({x!r:.60}), not an array: {exc}") from None
