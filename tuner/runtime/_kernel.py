"""Registered kernels (`tuner.kernels.get_kernel`) called through the runtime cache: `tuner.kernel(name)`.

    rmsnorm = tuner.kernel("rmsnorm", backend="triton", mode="offline", cache=tuner.load_cache(path))
    y = rmsnorm(problem, inputs)          # spec.run(problem, "triton", inputs, <cached config>)
    rmsnorm.explain(problem, inputs)      # "hit (<file>): {...}" or "miss: <why>"

The stored key of a registered kernel is built by `kernel_cache_key` and by nothing else: `tuner study
export` writes its entries with the same function (from the recorded device and versions), so a study's
exported cache file is an exact hit for the same kernel, problem, dtype, device and versions.

The key: the kernel name; `kernel_source_hash` (the launcher behind `KernelSpec.run`, or
`spec.extra["source_hash"]`); the problem's fields but "dtype" (flags the caller left out are filled from
the kernel's default problem, as a study file's are); the problem's dtype; the device as the runtime names
it (`device_name`: "cpu", "<GPU name> (sm<cc>)", "<platform>:<device kind>"); and the versions of the
packages that change the backend's code generation (`tuner._versions.backend_versions`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tuner._versions import BACKEND_KIND, backend_versions
from tuner.search_spaces.devices import device_label

from ._argkeys import KW
from ._bench import BenchFn, default_bench
from ._decorator import Autotuned, CostModelHook
from ._env import array_framework, cuda_index_of, device_of, source_hash
from ._file import ReadOnlyCache
from ._hit import make_hit_path
from ._jax import StandIns
from ._key import CacheKey
from ._restore import Restorer

if TYPE_CHECKING:  # pragma: no cover
    from tuner.kernels import KernelSpec
    from tuner.search_spaces import Device, SearchSpace

log = logging.getLogger(__name__)

__all__ = [
    "kernel",
    "TunedKernel",
    "kernel_cache_key",
    "kernel_source_hash",
    "device_name",
]


@functools.lru_cache(maxsize=256)
def kernel_source_hash(kernel: str) -> str:
    """sha256 (32 hex digits) of the source files a registered kernel's code comes from: the module of its
    launcher (`KernelSpec.run`, partials unwrapped) and every module of the same package that it imports,
    transitively (the Triton and Pallas kernel modules, the shared helpers); or `spec.extra["source_hash"]`
    when the spec sets one; an unregistered name (a test's synthetic
    kernel) hashes the name. A kernel module that cannot be imported raises (ImportError naming it): the
    hash of an unregistered name would be a key no stored entry of the kernel has."""
    from tuner.kernels import get_kernel

    try:
        spec = get_kernel(kernel)
    except ValueError:  # not a registered kernel
        return hashlib.sha256(f"unregistered kernel {kernel}".encode()).hexdigest()[:32]
    if isinstance(spec.extra.get("source_hash"), str):
        return str(spec.extra["source_hash"])
    fn: Any = spec.run
    while isinstance(fn, functools.partial):
        fn = fn.func
    mod = getattr(fn, "__module__", None)
    if not mod:
        return source_hash(fn)
    from ._source import module_files_hash  # the launcher's module and the kernel modules it imports

    return module_files_hash(mod, mod.rsplit(".", 1)[0] if "." in mod else mod)


def _default_flags(kernel: str) -> dict[str, Any]:
    """A registered kernel's default problem flags; none for an unregistered name. A kernel module that
    cannot be imported raises (ImportError naming it), as `_filled` does: no defaults would be a wrong key."""
    from tuner.kernels import get_kernel

    try:
        spec = get_kernel(kernel)
    except ValueError:  # unregistered: no defaults
        return {}
    return {k: v for k, v in spec.default_problem.items() if k != "dtype" and k not in spec.shape_fields}


def kernel_cache_key(
    kernel: str,
    problem: Mapping[str, Any],
    *,
    backend: str,
    device: str,
    versions: Mapping[str, str] | None = None,
) -> CacheKey:
    """THE stored key of a registered kernel for one problem (used by `tuner.kernel` and by
    `tuner study export`). `versions` default to this machine's `backend_versions(backend)`."""
    merged = {**_default_flags(kernel), **problem}
    fields = {str(k): v for k, v in merged.items() if k != "dtype"}
    dtype = merged.get("dtype")
    dtypes = [str(dtype)] if dtype else []
    vers = backend_versions(backend) if versions is None else {str(k): str(v) for k, v in versions.items()}
    return CacheKey.make(kernel, kernel_source_hash(kernel), fields, dtypes, device, vers)


def device_name(backend: str, arch: str) -> str:
    """The device of this machine as the runtime's keys name it, for a study task on `arch`: "cpu" for the
    CPU (and the interpreters), else `tuner.search_spaces.devices.device_label(backend)` when the backend's
    accelerator is there; the arch name when it is not."""
    if arch == "cpu":
        return "cpu"
    try:
        if backend == "triton":
            import torch

            if torch.cuda.is_available():
                return device_label("triton")
        elif backend == "pallas":
            return device_label("pallas")
    except Exception as exc:  # noqa: BLE001 - informative fallback: the arch name
        log.debug("device name for %s on %s: %s", backend, arch, exc)
    return arch


class ProblemKeys:
    """Key building for `tuner.kernel` (a `KeyBuilder`, see `_argkeys.py`): the call is
    `f(problem, inputs)`; the fast key is the problem's items and the device of the inputs, the stored
    key comes from `kernel_cache_key`."""

    def __init__(self, kernel: str, backend: str, spec: KernelSpec | None = None) -> None:
        self.kernel = kernel
        self.backend = backend
        self.spec = spec  # a registered kernel's spec: its problem and inputs are checked on a miss
        # fast[2]: the only positional form; other arities take the general key (which says how to call),
        # and a call with keywords (`f(problem, inputs=x)`) keys by `fast[KW]`, the general key unchecked.
        self.fast = (None, None, _problem_fast_key, *(None,) * (KW - 3), _problem_kw_key)

    def general(self, args: tuple, kwargs: dict) -> Any:
        problem, inputs = _split(args, kwargs)
        key = _problem_fast_key((problem, inputs))
        hash(key)  # TypeError for an unhashable problem value
        return key

    def full(self, args: tuple, kwargs: dict) -> CacheKey:
        problem, inputs = _split(args, kwargs)
        if self.spec is not None:  # the miss path only (and explain): a hit costs nothing more
            check_call(self.spec, self.backend, problem, inputs)
        device = device_of(BACKEND_KIND.get(self.backend, "python"), list(inputs.values()))
        return kernel_cache_key(self.kernel, problem, backend=self.backend, device=device)


def check_call(spec: KernelSpec, backend: str, problem: Any, inputs: Any) -> None:
    """A `tuner.kernel` call's problem and inputs, checked before a key is stored or a kernel runs: the
    problem against the kernel's schema (`tuner.kernels.validate_problem`: unknown or missing fields, a
    shape field that is not an integer, a flag of the wrong type, a dtype the kernel lacks), and the
    inputs as a table of arrays of the backend's framework (torch for Triton, jax for Pallas), with the
    names, shapes and dtypes the problem implies (`tuner.kernels._inputs.check_inputs`, which allocates
    nothing), then the values the kernel needs of them (`check_input_values`: moe_gemm's group sizes),
    where they can be read (not jax tracers or torch placeholders; a traced call's miss checks the
    concrete values it is tuned on, the stand-ins of the spec included). Raises ValueError
    naming what is wrong, where the kernel would crash deep inside, give wrong rows or run on a wrong key."""
    from tuner.kernels import validate_problem
    from tuner.kernels._inputs import check_input_values, check_inputs

    from . import _jax, _torch

    if isinstance(problem, Mapping) and "dtype" not in problem:
        raise ValueError(
            f"kernel {spec.name!r}: the problem names no 'dtype' (one of {list(spec.dtypes)}); "
            f"a problem is a dict of shape fields, dtype and flags, e.g. {dict(spec.default_problem)}"
        )
    try:
        merged = validate_problem(spec, problem)
    except ValueError as exc:
        raise ValueError(f"kernel {spec.name!r}: bad problem: {exc}") from None
    if not isinstance(inputs, Mapping):
        raise ValueError(
            f"kernel {spec.name!r}: inputs must be a dict name -> array "
            f"(spec.make_inputs(problem, {backend!r}, seed) makes one), got {type(inputs).__name__}"
        )
    want = {"triton": "torch", "pallas": "jax"}.get(backend)
    got = array_framework(list(inputs.values()))
    if want is not None and got is not None and got != want:
        raise ValueError(
            f"kernel {spec.name!r} on the {backend!r} backend takes {want} arrays, got {got} arrays "
            f"(inputs made for the other backend? spec.make_inputs(problem, {backend!r}, seed) makes them)"
        )
    # inputs made for another problem would be timed, and their winner stored, under this problem's key
    check_inputs(spec, merged, backend, inputs)
    if _jax.has_tracer((), dict(inputs)) or _torch.placeholder((), dict(inputs)):
        return  # no values to read: a traced call's are checked on what its miss is tuned on, below
    try:
        check_input_values(spec, merged, backend, inputs)
    except ValueError as exc:
        if not _jax.on_stand_ins():
            raise
        # the miss of a call inside a jax trace, on concrete values: the call's own where it passed them
        # concrete, else the stand-ins (the spec's `extra["stand_ins"]`): timing them would time garbage
        raise ValueError(
            f"{exc}; inside a jax trace, checked on the values its miss is tuned on: the call's own where "
            f"they are concrete, else the stand-ins the spec gives (extra['stand_ins'])"
        ) from None


def _problem_fast_key(a: tuple) -> Any:
    # with the values' types: 1, True and 1.0 are one dict key, yet other stored keys (JSON 1, true, 1.0)
    return (tuple(a[0].items()), tuple(map(type, a[0].values())), _device_tag(a[1]))


def _problem_kw_key(args: tuple, kwargs: dict) -> Any:
    return _problem_fast_key(_split(args, kwargs))


class _SpaceOnDevice:
    """`spec.space(problem, device, backend)` with the device resolved (detected) on first use."""

    def __init__(self, spec: KernelSpec, backend: str, device: Device | str | None) -> None:
        self.spec = spec
        self.backend = backend
        self._device_arg = device
        self._device: Device | None = None
        self._detected: dict[int, Device] = {}  # CUDA device index -> its descriptor, when detected

    def __call__(self, problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> SearchSpace:
        if self._device_arg is None:
            # detected for the GPU the inputs are on: on a machine with an A100 and an RTX 4090, a call on
            # cuda:1 gets the 4090's 99 KiB of shared memory, not cuda:0's 163 KiB
            index = cuda_index_of(list(inputs.values())) if self.backend == "triton" else None
            key = index or 0
            dev = self._detected.get(key)
            if dev is None:
                from tuner.search_spaces.devices import detect_device

                dev = self._detected[key] = detect_device(self.backend, key)
            return self.spec.space(problem, dev, self.backend)
        if self._device is None:
            from tuner.search_spaces import get_device

            self._device = (
                get_device(self._device_arg) if isinstance(self._device_arg, str) else self._device_arg
            )
        return self.spec.space(problem, self._device, self.backend)


def _kernel_autotuned(
    spec: KernelSpec,
    backend: str,
    device: Device | str | None,
    bench: BenchFn | None,
    backward: Any = None,
    **opts: Any,
) -> Autotuned:
    """`Autotuned` over `spec.run` for one backend, with the kernel's injected parts: keys from
    `kernel_cache_key`, the backend's default timer, and `spec.mutated_inputs` restored before every
    timed run. `backward`, for a Triton kernel with a backward kernel of its own, makes that kernel's
    `TunedKernel` (torch autograd, `_kernel_grad_torch`; on Pallas, jax's reverse mode, `_kernel_grad`)."""
    run = spec.run
    kind = BACKEND_KIND.get(backend, "python")

    def launch(problem: Mapping[str, Any], inputs: dict[str, Any], **config: Any) -> Any:
        return run(problem, backend, inputs, config)

    target = launch
    if backend == "pallas":  # jax.grad / jax.vjp: its backward kernel, else the VJP of its JAX reference
        from ._kernel_grad import differentiable

        target = differentiable(spec, backend, backward)
    elif backward is not None:  # torch autograd through the kernel: its own tuned backward kernel
        from ._kernel_grad_torch import differentiable_torch

        target = differentiable_torch(spec, backend, backward)

    def timer(args: tuple, kwargs: dict, dev: str) -> BenchFn:
        _, inputs = _split(args, kwargs)
        return bench or default_bench(kind, array_framework(list(inputs.values())), dev)

    def mutated(args: tuple, kwargs: dict) -> list[Any]:
        _, inputs = _split(args, kwargs)
        return [inputs[n] for n in spec.mutated_inputs if n in inputs]

    return Autotuned(
        target,
        _SpaceOnDevice(spec, backend, device),
        stand_ins=_spec_stand_ins(spec, backend),
        name=spec.name,
        bench=bench,
        keys=ProblemKeys(spec.name, backend, spec),
        timer=timer,
        restorer=Restorer(mutated, every_call=True),
        source_hash=kernel_source_hash(spec.name),
        **opts,
    )


def _spec_stand_ins(spec: KernelSpec, backend: str) -> StandIns:
    """The stand-ins of a traced miss (`_jax.resolve_on_concrete`) with the values the kernel's work depends
    on (`tuner.kernels._inputs.stand_in_values`: moe_gemm's group sizes, int8_matmul's weights, a spec's
    own `extra["stand_ins"]`) in place of the generic ones, for the inputs that were traced (a concrete
    input of the call keeps its values). A call the miss path refuses (a bad problem, inputs of other
    shapes) keeps the generic stand-ins: `check_call` says what is wrong with it. Each value is checked
    as `tuner.autotune(stand_ins=...)` checks its own (`_stand_ins.checked_stand_in`): another pytree
    structure, shape or dtype than the traced input's, or a leaf that is no array, raises ValueError
    naming the input and the leaf."""

    def replace(shapes: tuple[tuple, dict], concrete: tuple[tuple, dict]) -> tuple[tuple, dict]:
        from tuner.kernels import validate_problem
        from tuner.kernels._inputs import check_inputs, stand_in_values

        from ._stand_ins import checked_stand_in, is_traced

        args, kwargs = concrete
        try:
            problem, traced = _split(*shapes)
            _, inputs = _split(args, kwargs)
            if not (isinstance(traced, Mapping) and isinstance(inputs, Mapping)):
                return concrete
            if "inputs" not in kwargs and len(args) < 2:  # f(inputs, problem=...): not a call it takes
                return concrete
            merged = validate_problem(spec, problem)
            check_inputs(spec, merged, backend, traced)
        except (TypeError, ValueError):
            return concrete
        standing = [n for n, v in traced.items() if is_traced(v)]
        values = stand_in_values(spec, merged, backend, inputs) if standing else {}
        new = dict(inputs)
        for name, value in values.items():
            if name not in inputs:
                raise ValueError(
                    f"kernel {spec.name!r}: its stand_ins give input {name!r}, which the call does not "
                    f"have (inputs {list(inputs)})"
                )
            if name not in standing:  # the caller's own array: its real values
                continue
            says = f"kernel {spec.name!r}: its stand_ins give"
            new[name] = checked_stand_in(says, "input", name, traced[name], value, inputs[name])
        if "inputs" in kwargs:
            return args, {**kwargs, "inputs": new}
        return (args[0], new, *args[2:]), kwargs  # `_split` took them from args[1]

    return replace


def _split(args: tuple, kwargs: dict) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    vals = list(args) + [kwargs[k] for k in ("problem", "inputs") if k in kwargs]
    if len(vals) != 2:
        raise TypeError("a tuned kernel is called as f(problem, inputs)")
    return vals[0], vals[1]


class TunedKernel:
    """A registered kernel called through the runtime cache: `f(problem, inputs)` runs
    `spec.run(problem, backend, inputs, config)` with the config cached for the call's key (tuned on a
    miss in online mode; nearest key / cost model / space default in offline mode). `.explain(problem,
    inputs)` says what a call would use and why; `.tuner` holds the state (stats, last_choice).
    `.backward()`, for a kernel with a backward kernel of its own (flash_attention: torch autograd on
    Triton, jax's reverse mode on Pallas), is that kernel's TunedKernel (same options, its own keys); None
    otherwise."""

    def __init__(self, t: Autotuned, spec: KernelSpec, backend: str) -> None:
        self.tuner = t
        self.spec = spec
        self.backend = backend
        self.explain = t.explain
        self.cache_clear = t.cache_clear
        self._hit = make_hit_path(t.fn, t.keys.fast, t.mem, t.miss)
        self.made_with: dict[str, Any] = {}  # the options of the `kernel(...)` call (`__reduce__`)
        # the kernel's backward (torch autograd, jax reverse mode) as a TunedKernel of its own (made on
        # first use), or None
        self.backward: Callable[[], TunedKernel] | None = None

    def __call__(self, problem: Mapping[str, Any], inputs: dict[str, Any]) -> Any:
        return self._hit(problem, inputs)

    def __repr__(self) -> str:
        return f"TunedKernel({self.spec.name!r}, backend={self.backend!r})"

    def __reduce__(self) -> Any:
        """Pickled as the `tuner.kernel(...)` call that made it (a ResultStore or ConfigCache given as
        `storage` as its URL): a process pool's worker makes the same kernel, which finds the tuned
        configs in the shared store. Its in-memory state does not travel. Options that cannot be pickled
        (a `bench` lambda) fail as pickle says."""
        return _remake, (self.spec.name, self.backend, self.made_with)


def _remake(name: str, backend: str, options: dict[str, Any]) -> TunedKernel:
    return kernel(name, backend, **options)


def _device_tag(inputs: Mapping[str, Any]) -> Any:
    for v in inputs.values():
        d = getattr(v, "device", None)
        if d is not None and not callable(d):
            return str(d)
    return None


def kernel(
    name: str,
    backend: str = "triton",
    *,
    device: Device | str | None = None,
    budget: int = 20,
    time_budget_s: float | None = None,
    mode: str | None = None,
    storage: Any = None,
    cache: ReadOnlyCache | str | os.PathLike[str] | None = None,
    bench: BenchFn | None = None,
    seed: int = 0,
    strategy: str = "auto",
    cost_model: CostModelHook | None = None,
    lease_s: float = 120.0,
) -> TunedKernel:
    """A registered kernel (`tuner.kernels.get_kernel(name)`) as a callable `f(problem, inputs)` that takes its
    config from the runtime cache, with `tuner.autotune`'s semantics and options:

    - online (default; `mode=None` reads $TUNER_MODE): a key seen for the first time is tuned within
      `budget` trials / `time_budget_s` seconds over `spec.space(problem, device, backend)` and the winner
      is stored (`storage`: None = the default store, a URL, a ResultStore/ConfigCache, or False).
    - offline: never tunes; an unseen key takes the nearest cached key, else the cost model, else the
      space default (logged once per key).
    - `cache`: a shipped cache file (path or `tuner.load_cache(path)`), consulted first; the file
      `tuner study export` writes is an exact hit (see `kernel_cache_key`).
    - `device`: the device descriptor or arch ("sm90", "cpu", ...) whose space to tune over; default:
      detected for the backend.
    Call `tuner.kernels.prepare_triton()` (or set TRITON_INTERPRET=1) before the first call on
    a machine without a GPU.
    """
    from tuner.kernels import get_kernel

    spec = get_kernel(name)
    if backend not in spec.backends:
        raise ValueError(f"kernel {name!r} has no {backend!r} backend; it has {list(spec.backends)}")
    options: dict[str, Any] = {
        "device": device,
        "budget": budget,
        "time_budget_s": time_budget_s,
        "mode": mode,
        "storage": storage,
        "cache": cache,
        "bench": bench,
        "seed": seed,
        "strategy": strategy,
        "lease_s": lease_s,
    }
    backward: Callable[[], TunedKernel] | None = None
    bwd_name = spec.extra.get({"triton": "torch_backward", "pallas": "jax_backward"}.get(backend, ""))
    if isinstance(bwd_name, str):  # its gradient: a kernel of its own, the same options but the cost model
        backward = functools.cache(functools.partial(kernel, bwd_name, backend, **options))
    t = _kernel_autotuned(
        spec,
        backend,
        device,
        bench,
        backward,
        budget=budget,
        time_budget_s=time_budget_s,
        mode=mode,
        storage=storage,
        cache=cache,
        seed=seed,
        strategy=strategy,
        cost_model=cost_model,
        lease_s=lease_s,
    )
    made = TunedKernel(t, spec, backend)
    made.backward = backward
    store = getattr(storage, "store", storage)  # a ConfigCache's ResultStore
    made.made_with = {
        "device": device,
        "budget": budget,
        "time_budget_s": time_budget_s,
        "mode": mode,
        "storage": getattr(store, "url", storage),
        "cache": cache,
        "bench": bench,
        "seed": seed,
        "strategy": strategy,
        "cost_model": cost_model,
        "lease_s": lease_s,
    }
    return made
