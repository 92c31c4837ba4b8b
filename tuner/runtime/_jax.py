"""JAX tracers on the miss path: a decorated function called inside `jax.jit`, `jax.grad` or `jax.vmap`
sees tracers, not arrays, and timing it would time tracing. On a miss with tracers among the arguments
the runtime resolves the config on concrete arrays of the same shapes and dtypes instead (random normal
values for floating dtypes, zeros otherwise; weakly typed where the tracer is, as jax makes a Python
number passed to `jit`, so that it does not promote a bfloat16 kernel to float32), in a helper thread: jax's trace state is per thread, so
there the launcher runs eagerly, as it would outside any transformation (`ensure_compile_time_eval` is
not enough: it also leaks into the Pallas interpreter's own tracing). The key, the store lookup and, if
needed, the tuning are exactly those of an eager call with such arrays, so the stored entry is the one
the eager path stores. The traced call then runs with the chosen config. Where values of an input set
the launcher's work (moe_gemm's group sizes: zeros leave every row unwritten, nothing to time), the caller
of `resolve_on_concrete` replaces their stand-ins (`stand_ins`; `tuner.kernel` takes them from the
kernel's spec, `tuner.kernels._inputs.stand_in_values`; `tuner.autotune` from its `stand_ins=`,
`_stand_ins`). Hits never get here (the
in-memory keys, the fast key of a positional call and the general key of a call with keywords, are
built from key values and dtypes, which tracers have).

The helper thread runs with the caller's thread-local settings, as an eager call in the caller's thread
would: its contextvars (a copy of the caller's context: what the helper sets stays there) and jax's
thread-local config, i.e. every `jax.config` option the caller set with its context manager
(`jax.enable_x64`, `jax.default_matmul_precision`, `jax.default_device`, `jax.numpy_rank_promotion`,
`jax.debug_nans`, ...; under `enable_x64` a float64 tracer gets a float64 stand-in and key), Pallas'
TPU interpret mode, the values the caller entered of contexts made by `jax.make_user_context` (part of
jax's jit key: a launcher that reads one traces and caches as in the caller's thread), and the mesh the
caller set (`jax.set_mesh`, the deprecated `with mesh:`), so that a launcher passing bare PartitionSpecs
runs in the helper as in the caller's thread; where that mesh's axes are explicit, each stand-in is
placed with its tracer's sharding (`_explicit_sharding`). Not carried: what jax sets while it traces (the
trace itself, shard_map's mesh, with its manual axes, and its vma check, `ensure_compile_time_eval`) and
the other scopes of the traced program (`compute_on`, XLA metadata): elsewhere the stand-ins are
unsharded arrays of the traced shapes, outside any transformation.
A transfer guard (`jax.transfer_guard`, in the caller's thread or global) is lifted in the helper: the
stand-ins and the eager runs of the launcher move data the traced program does not.

The stand-ins replace the tracers among the arguments only. A launcher that reads a tracer of the
caller's trace that it is not passed (an attribute of a `self` that is not a pytree, a closure) raises
jax's UnexpectedTracerError in the helper thread, whatever the config; one that uses a collective over
a named axis of the caller's transformation (`lax.psum(x, "d")` inside `shard_map`, `pmap` or
`vmap(..., axis_name=...)`) raises jax's NameError "unbound axis name" there, the axis existing only
in the caller's trace. When the first config of a tuning on stand-ins (`on_stand_ins`) fails so
(`untimeable_reason`), the tuning stops there, without trying the other configs or warning that every
trial failed (`_tuning._tune`), and the decorator chooses its config untimed
(`_decorator.Autotuned._traced_miss`). A first config that fails otherwise is a failure of that
config: the tuning goes on, and raises AllConfigsFailedError (naming the first error, without a warning too) if no config runs.

`jax.export` with symbolic dimensions (`export.symbolic_shape("b")`) traces with tracers whose shapes
hold dimension expressions: there is no size to time (`symbolic_shapes`). The config is then chosen
untimed too, the stand-ins holding 1 for every symbolic dimension, and so does the stored key looked up
(a key field derived from such a dimension, `x.shape[0] == 1`, takes the stand-ins' value; where no entry
has the key, the decorator's log line says so); a key field whose value is such a dimension is refused
(`refuse_traced_key`), as a traced one is.

A launcher called inside a trace with no tracer among its arguments (static arguments only, making
its arrays itself) returns tracers too: its miss is resolved in the helper thread as well
(`under_trace`), on the arguments as they are.

A key value that is itself traced (`key=["n"]` with `n` a jit argument that is not static) has no
value at trace time: it is refused with a message saying to make it static, rather than keyed on the
stand-in's zero. Typed PRNG key arrays (`jax.random.key`) get stand-in keys of the same implementation.

An interrupt of the caller (Ctrl-C) while it waits for the helper thread stops the helper's tuning
too (`_stop_helper`), as it stops an eager call's tuning: the tuning does not go on in the background,
holding the key's claim and storing a winner after the caller was interrupted. A KeyboardInterrupt
raised in the helper stops the config being timed; as one raised asynchronously is lost where it lands
in Python code that C calls (a garbage-collection callback, such as jax's, a weakref callback, a
`__del__`), the tuning also checks a stop flag before each config it times,
after each trial, before it stores its winner, while it waits for another process's claim and while it
waits for another thread's tuning of the same key (`raise_if_stopped`; that wait, blocked in a lock's
`acquire` where no KeyboardInterrupt lands, wakes every 50 ms to check the flag, `stop_flag`), so the
interrupted caller does not wait for the other thread's tuning or the lease. Python reports such a
lost exception as unraisable ("Exception ignored in: <function _xla_gc_callback ...> KeyboardInterrupt"
on stderr, now and then, after a Ctrl-C of a traced call): tuner's own (`_CallerInterrupted`, raised by
`_stop_helper`) is dropped from that report while the caller waits for the helper, with a debug log
line, as its loss is handled; every other unraisable exception is reported as before.

Donated buffers: a launcher that donates its inputs (`jax.jit(..., donate_argnums=...)`) deletes them
on every call, so tuning it on the caller's arrays would leave every config after the first, and the
caller's own call, with deleted arrays. `donation_guard` gives the first call of each config copies
of the jax arrays among the arguments; if the launcher deleted them, every later call of that config
gets fresh copies (made inside the timed call, as Triton's `restore_value` restores inside its timed
call), else it gets the caller's arrays. The caller's arrays are never donated while tuning. (Where
there is no memory for the first copy, the call gets the caller's arrays, as it would without this.)

Nothing here imports jax unless jax is already imported by the caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "has_tracer",
    "under_trace",
    "untimeable_reason",
    "on_stand_ins",
    "symbolic_shapes",
    "concrete_like",
    "resolve_on_concrete",
    "raise_if_stopped",
    "stop_flag",
    "refuse_traced_key",
    "donation_guard",
    "caller_jax_settings",
]


def has_tracer(args: tuple, kwargs: dict) -> bool:
    """Whether any leaf of the arguments is a jax tracer (False, cheaply, when jax is not imported)."""
    if "jax" not in sys.modules:
        return False
    import jax

    tracer = jax.core.Tracer
    return any(isinstance(leaf, tracer) for leaf in jax.tree_util.tree_leaves((args, kwargs)))


def under_trace() -> bool:
    """Whether this thread is inside a jax trace (jit, grad, vmap, ...) although no argument may be a
    tracer: a launcher of static arguments only (`f(n)` making its arrays itself) called inside
    `jax.jit` returns tracers, and timing it would time tracing. False when jax is not imported, or
    where jax's private trace state cannot be read."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import core

        return not core.trace_state_clean()
    except Exception as exc:  # noqa: BLE001 - private jax API moved: only tracer arguments are seen
        log.debug("jax's trace state is not readable (%s)", exc)
        return False


def _is_symbolic(v: Any) -> bool:
    """Whether `v` is a symbolic dimension of `jax.export` (a dimension expression, not an int)."""
    try:
        from jax._src import core

        return bool(core.is_symbolic_dim(v))
    except Exception:  # noqa: BLE001 - private jax API moved: by the type's name
        return type(v).__name__ == "_DimExpr"


def refuse_traced_key(name: str, fields: dict[str, Any]) -> None:
    """TypeError naming the key fields whose value is a tracer (known only when the program runs) or a
    symbolic dimension of `jax.export` (known only when the exported program is called)."""
    import jax

    tracer = jax.core.Tracer
    traced = sorted(
        str(k) for k, v in fields.items() if any(isinstance(x, tracer) for x in jax.tree_util.tree_leaves(v))
    )
    if traced:
        raise TypeError(
            f"{name}: key field(s) {', '.join(traced)} are traced by jax (called inside jax.jit, vmap or "
            f"grad), so their values are not known when the config is chosen; make them static "
            f"(jax.jit(..., static_argnums=... / static_argnames=...)) or key on array shapes and dtypes"
        )
    symbolic = sorted(
        str(k) for k, v in fields.items() if any(_is_symbolic(x) for x in jax.tree_util.tree_leaves(v))
    )
    if symbolic:
        raise TypeError(
            f"{name}: key field(s) {', '.join(symbolic)} are symbolic dimensions (jax.export with "
            f"export.symbolic_shape), so their values are not known when the config is chosen; key on "
            f"dimensions that are concrete in the export, or export with concrete shapes"
        )


def symbolic_shapes(args: tuple, kwargs: dict) -> bool:
    """Whether a tracer among the arguments has a symbolic dimension (`jax.export` shape polymorphism)."""
    import jax

    tracer = jax.core.Tracer
    return any(
        isinstance(leaf, tracer) and not all(isinstance(d, int) for d in leaf.shape)
        for leaf in jax.tree_util.tree_leaves((args, kwargs))
    )


class _KeySpec:
    """A typed PRNG key array's shape and implementation (its stand-in is made in the helper thread)."""

    def __init__(self, shape: tuple[int, ...], impl: Any) -> None:
        self.shape = shape
        self.impl = impl


def concrete_like(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """The arguments with every tracer replaced by a concrete array of its shape and dtype (call it
    outside any trace: see resolve_on_concrete)."""
    sargs, skwargs = _shapes_of(args, kwargs)
    return _materialise(sargs, skwargs, seed=seed)


def _shapes_of(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every tracer replaced by a jax.ShapeDtypeStruct of its shape and dtype."""
    import jax

    def shape(leaf: Any) -> Any:
        if isinstance(leaf, jax.core.Tracer):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return _KeySpec(tuple(leaf.shape), jax.random.key_impl(leaf))
            weak = bool(getattr(getattr(leaf, "aval", None), "weak_type", False))
            placed = _explicit_sharding(leaf, mesh)
            if placed is not None:
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=weak, sharding=placed)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=weak)
        return leaf

    mesh = _caller_concrete_mesh()
    sargs, skwargs = jax.tree_util.tree_map(shape, (tuple(args), dict(kwargs)))
    return tuple(sargs), dict(skwargs)


def _caller_concrete_mesh() -> Any:
    """The concrete mesh of this thread's `jax.set_mesh` (private jax API), None where there is none or
    it cannot be read."""
    try:
        from jax._src import config as jc

        mesh = jc.device_context.get_local()
    except Exception:  # noqa: BLE001 - private jax API moved: stand-ins unsharded, as before
        return None
    return mesh if getattr(mesh, "abstract_mesh", None) is not None and not mesh.empty else None


def _explicit_sharding(leaf: Any, mesh: Any) -> Any:
    """Where `leaf`'s type holds a sharding over explicit mesh axes (`jax.set_mesh` of a mesh with
    `AxisType.Explicit`: the sharding is part of the type, and the launcher's code may depend on it), that
    sharding on the caller's concrete mesh, for its stand-in; else None (an unsharded stand-in)."""
    if mesh is None:
        return None
    import jax

    sharding = getattr(getattr(leaf, "aval", None), "sharding", None)
    spec = getattr(sharding, "spec", None)
    on = getattr(sharding, "mesh", None)
    if spec is None or all(p is None for p in spec) or on != mesh.abstract_mesh:
        return None
    if not getattr(on, "_any_axis_explicit", False):
        return None
    return jax.sharding.NamedSharding(mesh, spec)


def _materialise(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """Every jax.ShapeDtypeStruct leaf replaced by an array: random normal for floating dtypes, zeros
    otherwise; every typed PRNG key spec by keys of its implementation."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    base = jax.random.PRNGKey(seed)
    count = [0]

    def concrete(leaf: Any) -> Any:
        if isinstance(leaf, _KeySpec):
            count[0] += 1
            data = jax.random.key_data(jax.random.key(seed + count[0], impl=leaf.impl))
            return jax.random.wrap_key_data(jnp.broadcast_to(data, leaf.shape + data.shape), impl=leaf.impl)
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        # A symbolic dimension (jax.export) has no size: 1 (such a call is not timed, see the module doc).
        shape = tuple(d if isinstance(d, int) else 1 for d in leaf.shape)
        dtype = np.dtype(leaf.dtype)
        count[0] += 1
        floating = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)
        if getattr(leaf, "weak_type", False):
            weak = _weak_like(shape, dtype, floating, jax.random.fold_in(base, count[0]))
            if weak is not None:
                return weak
        if floating:
            out = _normal(jax.random.fold_in(base, count[0]), shape, dtype)
        else:
            out = jnp.zeros(shape, dtype)
        # placed as the tracer is, where its type holds an explicit sharding (`_explicit_sharding`)
        placed = getattr(leaf, "sharding", None)
        return out if placed is None else jax.device_put(out, placed)

    cargs, ckwargs = jax.tree_util.tree_map(concrete, (tuple(args), dict(kwargs)))
    return tuple(cargs), dict(ckwargs)


def _normal(key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """Random normal values of this dtype; for a float jax.random cannot draw in (the 4-bit floats,
    `float4_e2m1fn`, which MX kernels take), drawn in float32 and cast."""
    import jax
    import jax.numpy as jnp

    try:
        return jax.random.normal(key, shape, dtype)
    except TypeError:  # "uniform only accepts 8-, 16-, 32-, or 64-bit dtypes"
        return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _weak_like(shape: tuple[int, ...], dtype: Any, floating: bool, key: Any) -> Any:
    """A weakly typed array of this shape and dtype (what jax makes of a Python number: it takes the
    dtype of the array it meets, so a bfloat16 kernel stays bfloat16), or None where jax's weak type
    of that kind has another dtype (then a strongly typed stand-in is used)."""
    import jax
    import numpy as np

    kind = np.dtype(dtype).kind
    if floating:
        value: Any = float(jax.random.normal(key, (), jax.numpy.float32))
        if kind == "c":
            value = complex(value, 0.0)
    elif kind == "b":
        value = False
    else:
        value = 0
    out = jax.lax.full(shape, value)  # no dtype: weakly typed, the default dtype of the value's kind
    return out if out.dtype == dtype and getattr(out, "weak_type", False) else None


_ESCAPED = (
    "inside this jax trace the function reads traced values it is not passed (an attribute of self, a "
    "closure); call it once outside jax.jit, or pass them as arguments, to tune it"
)
_UNBOUND_AXIS = (
    "the function uses a collective over a named axis of the caller's shard_map, pmap or vmap "
    "(jax: {what}), which exists only inside that trace; decorate the function that calls shard_map "
    "(or pmap) instead, to time the whole sharded call"
)


def untimeable_reason(errors: tuple[str, ...]) -> str | None:
    """Why the stand-ins cannot time the launcher, when every config tried failed for a reason of the
    caller's trace only (trial error texts, "TypeName: message"): it reads tracers it is not passed
    (UnexpectedTracerError), or it uses a named axis that exists only in the caller's transformation
    (NameError "unbound axis name"). None when some config failed otherwise."""
    if not errors:
        return None
    escaped = [e for e in errors if e.startswith("UnexpectedTracerError:")]
    axis = [e for e in errors if e.startswith("NameError: unbound axis name")]
    if len(escaped) + len(axis) != len(errors):
        return None
    reasons = ([_ESCAPED] if escaped else []) + (
        [_UNBOUND_AXIS.format(what=axis[0].removeprefix("NameError: ").strip())] if axis else []
    )
    return "; ".join(reasons)


# True in the helper thread of `resolve_on_concrete` (set in the copy of the caller's context it runs in).
_ON_STAND_INS: contextvars.ContextVar[bool] = contextvars.ContextVar("tuner_on_stand_ins", default=False)


def on_stand_ins() -> bool:
    """Whether this is the miss path of a traced call, running on concrete stand-ins of its tracers
    (`resolve_on_concrete`), where a failure of the caller's trace alone (`untimeable_reason`) is no
    failure of the config."""
    return _ON_STAND_INS.get()


# The stop flag of the helper thread of `resolve_on_concrete` (in the copy of the caller's context it runs
# in), set when its caller is interrupted (`_stop_helper`).
_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "tuner_stop_helper", default=None
)


def raise_if_stopped() -> None:
    """KeyboardInterrupt where this is the helper thread of a traced miss whose caller was interrupted
    (`_stop_helper`); nothing elsewhere. The tuning checks it between its steps: the KeyboardInterrupt
    `_stop_helper` raises in the helper is lost where it lands in Python code called from C (a
    garbage-collection callback, a weakref callback, a `__del__`), and the tuning must stop all the same."""
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt("the traced call that this tuning runs for was interrupted")


def stop_flag() -> threading.Event | None:
    """The stop flag of this helper thread of a traced miss (`raise_if_stopped`), None elsewhere: a
    wait that blocks in C (a lock's `acquire`) checks it between slices of its wait."""
    return _STOP.get()


# (the arguments with a jax.ShapeDtypeStruct for each tracer, their generic stand-ins) -> the stand-ins to
# use, with values the work depends on in place of the generic ones (`resolve_on_concrete`)
StandIns = Callable[[tuple[tuple, dict], tuple[tuple, dict]], tuple[tuple, dict]]


def resolve_on_concrete(
    miss: Callable[..., dict[str, Any]],
    name: str,
    args: tuple,
    kwargs: dict,
    fast_key: Any,
    target: Any,
    stand_ins: StandIns | None = None,
) -> dict[str, Any]:
    """Run the miss path `miss(args, kwargs, fast_key, target)` on concrete stand-ins of the tracers, in a
    thread of its own (outside the caller's trace); its result or its exception is the caller's.
    `stand_ins`, where the caller knows values that set the launcher's work (`tuner.kernel`: moe_gemm's
    group sizes, which zeros would leave with no work to time), replaces the generic stand-ins by them."""
    # The tracers' shapes and dtypes are read here; the arrays are made in the helper thread.
    sargs, skwargs = _shapes_of(args, kwargs)
    log.debug("%s: called with tracers; resolving the config on concrete arrays of the same shapes", name)
    box: dict[str, Any] = {}
    settings = caller_jax_settings()  # read here: they are this thread's
    context = contextvars.copy_context()
    stop = threading.Event()

    def work() -> None:
        _ON_STAND_INS.set(True)  # in the copy of the caller's context: never seen by the caller
        _STOP.set(stop)
        try:
            # Transfers allowed: making the stand-ins and running the launcher eagerly move data that the
            # traced program does not (its Python numbers are constants there), so a caller's
            # `jax.transfer_guard("disallow")`, in its thread or global, guards its program, not this.
            with settings(), _transfers_allowed():
                cargs, ckwargs = _materialise(sargs, skwargs)
                if stand_ins is not None:
                    cargs, ckwargs = stand_ins((sargs, skwargs), (cargs, ckwargs))
                box["cfg"] = miss(cargs, ckwargs, fast_key, target)
        except BaseException as exc:  # re-raised in the caller's thread
            box["exc"] = exc
        finally:
            done.set()

    done = threading.Event()
    t = threading.Thread(target=context.run, args=(work,), name=f"tuner-concrete-{name}"[:60], daemon=True)
    t.start()
    # Waited for on an Event, not `t.join()`: a join that Ctrl-C interrupts marks a thread that is still
    # running as stopped on some Pythons (3.11's bpo-45274 handling), and the helper must be stopped then.
    try:
        done.wait()
    except BaseException:  # Ctrl-C (or another exception) in the caller while the helper tunes
        _stop_helper(t, done, stop)
        raise
    t.join()
    if "exc" in box:
        raise box["exc"]
    return box["cfg"]


class _CallerInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt `_stop_helper` raises in the helper thread of an interrupted traced call (a
    class of its own, so that the report of it being lost, `_lost_stop_unreported`, is told apart)."""


@contextlib.contextmanager
def _lost_stop_unreported(ident: int | None) -> Iterator[None]:
    """While the caller stops the helper thread `ident`: a `_CallerInterrupted` that Python reports as
    unraisable in that thread (it landed in a garbage-collection callback, jax's `_xla_gc_callback`, or a
    `__del__`, and was lost there) is logged at debug level instead of printed (the tuning stops at its
    next `raise_if_stopped`); any other unraisable exception goes to the hook there was."""
    before = sys.unraisablehook

    def hook(u: Any) -> None:
        if (
            ident is not None
            and threading.get_ident() == ident
            and isinstance(u.exc_type, type)
            and issubclass(u.exc_type, _CallerInterrupted)
        ):
            log.debug(
                "the stop of the helper thread was lost in %r; its tuning stops at its next check", u.object
            )
            return
        before(u)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:  # else someone set their own meanwhile: theirs stays
            sys.unraisablehook = before


def _stop_helper(t: threading.Thread, done: threading.Event, stop: threading.Event) -> None:
    """Stop the helper thread `t` of a traced miss whose caller was interrupted while it waited (Ctrl-C
    in the caller's thread, where the eager call's tuning would have stopped): a KeyboardInterrupt is
    raised in the helper at its next Python instruction, so its tuning ends as an interrupted eager
    tuning does (its claim released, no winner stored after the interrupt), and the caller waits for
    that. Then `stop` is set: where that KeyboardInterrupt is lost (it landed in a garbage-collection
    callback or a `__del__`, which report it as unraisable), the tuning raises its own at its next check
    (`raise_if_stopped`), between trials. The asynchronous one is raised once only, and before `stop`,
    so that it does not land in the helper's cleanup (the release of its claim) after the tuning
    stopped at a check. A second interrupt while the caller waits (the helper inside a long compile,
    say) stops the waiting; the helper still stops at its next check."""
    import ctypes

    ident = t.ident
    with _lost_stop_unreported(ident):
        if ident is not None and not done.is_set():
            exc = ctypes.py_object(_CallerInterrupted)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)
            log.debug("%s: the caller was interrupted; stopping its tuning", t.name)
        stop.set()
        t.join()  # not `done`: the interrupt may land in the helper before it sets `done`


def _transfers_allowed() -> contextlib.AbstractContextManager[Any]:
    """`jax.transfer_guard("allow")` in this thread (a no-op in a jax without it)."""
    import jax

    guard = getattr(jax, "transfer_guard", None)
    return guard("allow") if guard is not None else contextlib.nullcontext()


# ---- the caller's jax settings, for the helper thread ---------------------------------------------------
# jax keeps the values its config context managers set in thread-local storage, and has no public API
# that reads that layer apart from the global one. The jax_* options (`jax._src.config.config_states`)
# each hold it as `get_local()` (`config_ext.unset` where the thread set nothing); re-entered in the
# helper through the option's own context manager (which also runs the option's thread-local hook).
# jax sets some options itself while it traces; those are not the caller's settings:
_NOT_CARRIED = frozenset(
    {
        "check_vma",  # shard_map, while it traces its body
        "eager_constant_folding",  # ensure_compile_time_eval: the helper is eager already (module doc)
    }
)
# Thread-local contexts that are not jax_* options but settings of the caller: carried too.
_CARRIED_CONTEXTS = ("pallas_tpu_interpret_mode_context_manager",)  # pltpu.force_tpu_interpret_mode()
# The mesh the caller set (`jax.set_mesh`: the abstract and the concrete mesh; the deprecated `with mesh:`:
# its stack of meshes, also kept in `thread_resources`): carried, so that a launcher that passes bare
# PartitionSpecs (`with_sharding_constraint(x, P("d"))`, `out_sharding=P("d")`, `reshard`) runs in the
# helper as in the caller's thread. Not inside `shard_map`, whose abstract mesh has manual axes: there the
# launcher gets each device's block, and the helper times it outside any mesh (module doc).
_MESH_CONTEXTS = ("abstract_mesh_context_manager", "device_context", "mesh_context_manager")
# Where the private state cannot be read (a jax that moved it), these public context managers are
# re-entered with the values the caller's thread sees (`jax.config.<option>`, local or global).
_PUBLIC_FALLBACK = (
    ("jax_enable_x64", "enable_x64"),
    ("jax_default_matmul_precision", "default_matmul_precision"),
    ("jax_default_device", "default_device"),
    ("jax_numpy_rank_promotion", "numpy_rank_promotion"),
    ("jax_numpy_dtype_promotion", "numpy_dtype_promotion"),
    ("jax_default_prng_impl", "default_prng_impl"),
    ("jax_debug_nans", "debug_nans"),
    ("jax_debug_infs", "debug_infs"),
)


def _private_jax_settings() -> list[tuple[Any, Any, bool]]:
    """(option, value, is a jax_* option with a context manager) of every jax option this thread set
    locally (private jax API: may raise)."""
    from jax._src import config as jc

    unset = jc.config_ext.unset
    options = [s for s in jc.config_states.values() if s.name not in _NOT_CARRIED]
    options += [getattr(jc, n) for n in _CARRIED_CONTEXTS if hasattr(jc, n)]
    out = []
    for opt in options:
        value = opt.get_local()
        if value is not unset:
            out.append((opt, value, isinstance(opt, jc.State)))
    meshes = [
        (opt, opt.get_local()) for opt in (getattr(jc, n, None) for n in _MESH_CONTEXTS) if opt is not None
    ]
    if not any(getattr(v, "_any_axis_manual", False) for _, v in meshes):  # not inside shard_map
        out += [(opt, value, False) for opt, value in meshes if value is not unset]
    return out


def _caller_mesh_stack() -> list[Any] | None:
    """The deprecated `with mesh:` stack of this thread (`thread_resources`, private jax API), None where
    it holds no mesh or the caller is inside `shard_map` (see `_MESH_CONTEXTS`)."""
    from jax._src import config as jc
    from jax._src import mesh as ml

    if getattr(jc.abstract_mesh_context_manager.get_local(), "_any_axis_manual", False):
        return None
    stack = list(getattr(ml.thread_resources, "stack", ()))
    return stack if len(stack) > 1 else None


@contextlib.contextmanager
def _mesh_stack_entered(stack: list[Any] | None) -> Iterator[None]:
    """The caller's `with mesh:` stack (`_caller_mesh_stack`) in this thread, put back after."""
    if stack is None:
        yield
        return
    from jax._src import mesh as ml

    res = ml.thread_resources
    before = (res.stack, res.env)
    res.stack, res.env = list(stack), stack[-1]
    try:
        yield
    finally:
        res.stack, res.env = before


@contextlib.contextmanager
def _private_entered(settings: list[tuple[Any, Any, bool]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for opt, value, is_option in settings:
            if is_option:
                stack.enter_context(opt(value))
            else:  # a bare thread-local context
                prev = opt.swap_local(value)
                stack.callback(opt.set_local, prev)
        yield


def _public_settings() -> list[tuple[Callable[[Any], Any], Any]]:
    import jax

    out = []
    for option, manager in _PUBLIC_FALLBACK:
        enter = getattr(jax, manager, None)
        if enter is None:
            continue
        try:
            out.append((enter, getattr(jax.config, option)))
        except AttributeError:
            continue
    return out


@contextlib.contextmanager
def _public_entered(pairs: list[tuple[Callable[[Any], Any], Any]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for enter, value in pairs:
            stack.enter_context(enter(value))
        yield


# ---- contexts made by `jax.make_user_context` ----------------------------------------------------------
# Each is a `UserConfig` whose public API is `uc(value)` (a context manager), `uc.value` (this thread's
# value) and `uc.get_global()`. jax keeps no list of them that Python can read: the ones alive are found
# among the objects the garbage collector tracks, again only when jax has made more since the last look
# (`trace_context_names()` names each "user_context"). Where jax's config internals moved, none is carried.
_user_contexts: weakref.WeakSet[Any] = weakref.WeakSet()
_user_contexts_seen = [0]  # how many "user_context" entries jax's trace context had at the last look
_user_contexts_lock = threading.Lock()


def _after_fork_in_child() -> None:  # a parent thread may have held it at the fork
    global _user_contexts_lock
    _user_contexts_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _live_user_contexts() -> list[Any]:
    """The `jax.make_user_context` contexts alive (private jax API: may raise)."""
    from jax._src import config as jc

    made = list(jc.trace_context_names()).count("user_context")
    with _user_contexts_lock:
        if made > _user_contexts_seen[0]:
            _user_contexts.update(o for o in gc.get_objects() if type(o) is jc.UserConfig)
            _user_contexts_seen[0] = made
        return list(_user_contexts)


def user_context_settings() -> list[tuple[Any, Any]]:
    """(context, value) of every `jax.make_user_context` context whose value in this thread is not its
    global one (what the caller entered), read now; [] where jax's internals cannot be read."""
    try:
        contexts = _live_user_contexts()
    except Exception as exc:  # noqa: BLE001 - private jax API moved: carry none (logged)
        log.debug("jax's user contexts cannot be listed (%s); not carried to the helper thread", exc)
        return []
    out = []
    for uc in contexts:
        value = uc.value
        if value is not uc.get_global():
            out.append((uc, value))
    return out


def caller_jax_settings() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The jax settings local to this thread, read now; the result enters them in another thread
    (a no-op when jax is not imported). See the module docstring for what is carried."""
    if "jax" not in sys.modules:
        return contextlib.nullcontext
    users = user_context_settings()
    try:
        local = _private_jax_settings()
    except Exception as exc:  # noqa: BLE001 - private jax API moved: the public context managers
        log.debug("jax's thread-local config is not readable (%s); carrying the public options", exc)
        public = [*_public_settings(), *users]
        return lambda: _public_entered(public)
    try:
        stack = _caller_mesh_stack()
    except Exception as exc:  # noqa: BLE001 - private jax API moved: no `with mesh:` stack carried
        log.debug("jax's `with mesh:` stack is not readable (%s); not carried to the helper thread", exc)
        stack = None
    return lambda: _both_entered(local, users, stack)


@contextlib.contextmanager
def _both_entered(
    local: list[tuple[Any, Any, bool]], users: list[tuple[Any, Any]], stack: list[Any] | None = None
) -> Iterator[None]:
    with _mesh_stack_entered(stack), _private_entered(local), _public_entered(users):
        yield


def donation_guard(
    args: tuple, kwargs: dict
) -> Callable[[Callable[[tuple, dict], Any]], Callable[[], Any]] | None:
    """For a call whose arguments hold jax arrays: `guard(run)` -> a no-argument call of
    `run(args, kwargs)` that never donates the caller's arrays (see the module docstring). None when
    jax is not imported or no argument holds a jax array."""
    if "jax" not in sys.modules:
        return None
    import jax

    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    if not where:
        return None

    def copies() -> tuple[tuple, dict, list[Any]]:
        new = list(leaves)
        for i in where:
            new[i] = leaves[i].copy()
        a, k = jax.tree_util.tree_unflatten(treedef, new)
        return a, k, [new[i] for i in where]

    def guard(run: Callable[[tuple, dict], Any]) -> Callable[[], Any]:
        state = {"first": True, "donates": False}

        def call() -> Any:
            if state["first"] or state["donates"]:
                try:
                    a, k, fresh = copies()
                except Exception as exc:  # noqa: BLE001 - no memory for a copy on the first call:
                    if not state["first"]:  # the caller's arrays, as without the guard
                        raise
                    state["first"] = False
                    log.warning("cannot copy the inputs to check for donation (%s); timing on them", exc)
                    return run(args, kwargs)
                out = run(a, k)
                if state["first"]:
                    state["first"] = False
                    state["donates"] = any(x.is_deleted() for x in fresh)
                    if state["donates"]:
                        log.debug("the launcher donates its inputs: each timed call gets copies")
                return out
            return run(args, kwargs)

        return call

    return guard
