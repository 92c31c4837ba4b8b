"""What tuner changes in the process of a user who imports and uses it: nothing global that it does not
put back (docs/api.md, "What tuner changes in your process").

Each use runs in a process of its own where tuner is imported fresh, away from pytest's own logging and
warnings setup: a fresh interpreter (`sys.executable`), or for the uses without torch, triton or jax a child
forked from a server that imported only the user's stack (ZYGOTE: paid once per stack, not per use). The
script imports the user's stack first (torch, jax, optuna, xgboost, ... as the use needs), takes a
snapshot of the process-wide state a library could change (logging, warnings filters, os.environ, sys.path,
signal handlers, atexit, threads, faulthandler, numpy's error state and print options, the global random
generators, torch's and jax's global settings, XGBoost's global config, matplotlib's backend, Optuna's
verbosity, the temp folder, ...), runs the use, takes another and writes what differs to a file. stdout
must stay empty: tuner writes nothing there unless asked (the CLI, TRITON_PRINT_AUTOTUNING).

A use that needs torch, triton or jax (tuner's `[kernels]` extra) is skipped, saying which, where that module
is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._env import repo_pythonpath  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# The snapshot helper, as source: it runs inside the probe's interpreter.
SNAPSHOT = r"""
import atexit, decimal, faulthandler, gc, hashlib, json, locale, logging, multiprocessing, os, random
import signal, socket, sys, tempfile, threading, warnings


tempfile.gettempdir()  # sets tempfile.tempdir (once, from TMPDIR): the snapshots' doing, not the use's


def _h(obj):
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def _se_snap():
    s = {}
    s["logging.root"] = [logging.root.level, [repr(h) for h in logging.root.handlers]]
    s["logging.disable"] = logging.root.manager.disable
    s["logging.classes"] = [repr(logging.getLoggerClass()), repr(logging.getLogRecordFactory())]
    for name, lg in sorted(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.PlaceHolder):
            continue
        st = [lg.level, [f"{type(h).__name__}@{id(h)}/{h.level}" for h in lg.handlers], lg.propagate, lg.disabled]
        if st != [logging.NOTSET, [], True, False]:  # a logger nobody configured is no change
            s["logger:" + name] = st
    s["warnings.filters"] = [repr(f) for f in warnings.filters]
    s["warnings.showwarning"] = repr(warnings.showwarning)
    s["environ"] = dict(os.environ)
    s["sys.path"] = list(sys.path)
    s["sys.meta_path"] = [getattr(f, "__name__", None) or repr(type(f)) for f in sys.meta_path]
    s["sys.path_hooks"] = [repr(h) for h in sys.path_hooks]
    s["hooks"] = [repr(h) for h in (sys.excepthook, sys.displayhook, sys.unraisablehook, sys.breakpointhook,
                                    threading.excepthook, sys.getprofile(), sys.gettrace())]
    s["streams"] = [repr(x) for x in (sys.stdin, sys.stdout, sys.stderr)]
    s["limits"] = [sys.getrecursionlimit(), sys.getswitchinterval(), sys.get_int_max_str_digits(),
                   sys.getdlopenflags(), threading.stack_size(), gc.isenabled(), gc.get_threshold(),
                   socket.getdefaulttimeout()]
    s["cwd"] = os.getcwd()
    um = os.umask(0o22); os.umask(um); s["umask"] = um
    s["signals"] = {}
    for sig in sorted(signal.valid_signals()):
        try:
            s["signals"][str(sig)] = repr(signal.getsignal(sig))
        except (ValueError, OSError):
            pass
    s["atexit"] = atexit._ncallbacks()
    s["faulthandler"] = faulthandler.is_enabled()
    s["mp.start_method"] = multiprocessing.get_start_method(allow_none=True)
    s["decimal"] = repr(decimal.getcontext())
    s["locale"] = locale.setlocale(locale.LC_ALL, None)
    s["random"] = _h(random.getstate())
    s["tempfile.tempdir"] = tempfile.tempdir
    s["tmp files"] = sorted(os.listdir(tempfile.gettempdir()))
    if "numpy" in sys.modules:
        import numpy as np
        s["np.err"] = np.geterr()
        s["np.errcall"] = repr(np.geterrcall())
        s["np.print"] = {k: repr(v) for k, v in np.get_printoptions().items()}
        s["np.random"] = _h(np.random.get_state(legacy=False))
    if "torch" in sys.modules:
        import torch
        s["torch"] = {
            "threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "det_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn": [torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,
                      torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32],
            "tf32": torch.backends.cuda.matmul.allow_tf32, "mm_precision": torch.get_float32_matmul_precision(),
            "mkldnn": torch.backends.mkldnn.enabled,
            "dtype": repr(torch.get_default_dtype()), "device": repr(torch.get_default_device()),
            "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
            "anomaly": torch.is_anomaly_enabled(), "rng": _h(torch.random.get_rng_state().tolist()),
            "print": repr(vars(torch._tensor_str.PRINT_OPTS)),
        }
    if "jax" in sys.modules:
        import jax
        s["jax.config"] = {k: repr(v) for k, v in jax.config.values.items()}
    if "xgboost" in sys.modules:
        import xgboost
        s["xgboost.config"] = xgboost.get_config()
    if "matplotlib" in sys.modules:
        import matplotlib
        s["matplotlib.backend"] = repr(dict.__getitem__(matplotlib.rcParams, "backend"))
        s["matplotlib.interactive"] = matplotlib.is_interactive()
    if "optuna" in sys.modules:
        import optuna
        s["optuna.verbosity"] = optuna.logging.get_verbosity()
    return s


def _se_thread_names():
    return sorted(t.name for t in threading.enumerate())


def _se_diff(a, b):
    out = {}
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x == y or k not in a:  # not in `a`: a library the use imported (its state was not seen before)
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            out[k] = {kk: [x.get(kk), y.get(kk)] for kk in sorted(set(x) | set(y)) if x.get(kk) != y.get(kk)}
        else:
            out[k] = [x, y]
    return out
"""

USER_STACK = ("numpy", "optuna", "sqlalchemy", "alembic", "xgboost", "sklearn", "matplotlib", "rich")
KERNEL_STACK = ("torch", "triton", "jax", "jax.numpy")


# A fork server per worker of the suite and user stack: an interpreter that imports the stack (no tuner: it
# checks) and forks a child per use, which runs the use from there as the script of a fresh interpreter would
# (the same snapshot, the same normal interpreter exit with atexit handlers, its own stdout, stderr, cwd,
# TMPDIR and TUNER_HOME). The stack's import, the bulk of a probe's cost, is paid once instead of per use.
# Only for stacks without the kernel modules (torch, triton, jax start threads and pools a fork does not
# carry); and the server forks only while it runs no thread but its main one, so the child starts from the
# state a fresh interpreter that imported the stack is in.
ZYGOTE = r"""
import os, tempfile
from tests._fork_server import fork_per_request as _se_fork
_se_req = _se_fork()
# the child: its own streams and environment (set by the loop), folder and temp folder, then the script
os.chdir(_se_req["cwd"])
tempfile.tempdir = None
tempfile.gettempdir()
_se_code = compile(_se_req["script"], "<string>", "exec")
del _se_req, _se_fork
exec(_se_code)
"""


class _Zygote:
    """The fork server of one stack and environment (ZYGOTE)."""

    def __init__(self, stack: tuple[str, ...], env: dict[str, str], folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "tmp").mkdir()
        (folder / "home").mkdir()
        script = "\n".join(
            [SNAPSHOT, "import importlib", *(f"importlib.import_module({m!r})" for m in stack), ZYGOTE]
        )
        run_env = {**_base_env(), "TMPDIR": str(folder / "tmp"), "TUNER_HOME": str(folder / "home"), **env}
        with open(folder / "stderr", "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=folder,
                env=run_env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
                encoding="utf-8",
            )
        self.folder = folder

    def run(self, script: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        out, err = tmp_path / "probe.stdout", tmp_path / "probe.stderr"
        req = {"script": script, "env": env, "cwd": str(tmp_path), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        if not ready:
            self.close()
            pytest.fail("the use did not end within 300 s")
        line = self.proc.stdout.readline()
        assert line, f"the fork server ended: {(self.folder / 'stderr').read_text(encoding='utf-8')[-3000:]}"
        reply = json.loads(line)
        assert "refused" not in reply, f"the fork server holds tuner modules or threads: {reply['refused']}"
        return subprocess.CompletedProcess(
            [], reply["rc"], out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")
        )

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()


class _Zygotes:
    """The fork servers of this worker of the suite, one per stack and environment, started on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.servers = folder, dict[Any, _Zygote]()

    def get(self, stack: tuple[str, ...], env: dict[str, str]) -> _Zygote:
        key = (stack, tuple(sorted(env.items())))
        if key not in self.servers:
            self.servers[key] = _Zygote(stack, env, self.folder / f"server{len(self.servers)}")
        return self.servers[key]


@pytest.fixture(scope="session")
def _zygotes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Zygotes]:
    servers = _Zygotes(tmp_path_factory.mktemp("zygotes"))
    yield servers
    for z in servers.servers.values():
        z.close()


def _base_env() -> dict[str, str]:
    # Not pytest's environment (conftest.py sets TRITON_INTERPRET and JAX_PLATFORMS): each use says its own.
    drop = ("TUNER_", "PYTEST", "TRITON_", "JAX_", "XLA_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**base, "PYTHONPATH": repo_pythonpath()}


def probe(
    tmp_path: Path,
    body: str,
    *,
    stack: tuple[str, ...] = USER_STACK,
    env: dict[str, str] | None = None,
    setup: str = "",
    zygotes: _Zygotes | None = None,
) -> dict[str, Any]:
    """Run `body` in a process of its own, after importing `stack` and running `setup` (the user's own
    settings); return the global state it changed, the threads it left running, its stdout, and what it left
    in its own temp folder. With `zygotes` (the `_zygotes` fixture) and a stack without the kernel modules,
    the process is forked from a server that imported the stack (ZYGOTE); else it is a fresh interpreter."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "diff.json"
    use = "\n".join(
        [
            "import time",
            textwrap.dedent(setup).strip(),
            "_se_before, _se_threads = _se_snap(), _se_thread_names()",
            textwrap.dedent(body).strip(),  # at module level: Triton's interpreter looks up `tl` in globals
            "_se_deadline = time.monotonic() + 5",  # a helper thread that is ending gets a moment
            "while set(_se_thread_names()) - set(_se_threads) and time.monotonic() < _se_deadline:",
            "    time.sleep(0.05)",
            "_se_after = _se_snap()",
            "_se_left = sorted(set(_se_thread_names()) - set(_se_threads))",
            "_se_out = {'diff': _se_diff(_se_before, _se_after), 'threads': _se_left}",
            f"open({str(out)!r}, 'w').write(json.dumps(_se_out))",
        ]
    )
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    own = {"TMPDIR": str(tmp), "TUNER_HOME": str(home)}
    if zygotes is not None and not _kernel_modules(stack):
        p = zygotes.get(stack, env or {}).run(use, tmp_path, own)
    else:
        script = "\n".join(
            [SNAPSHOT, "import importlib", *(f"importlib.import_module({m!r})" for m in stack), use]
        )
        p = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env={**_base_env(), **own, **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
            encoding="utf-8",
        )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text(encoding="utf-8"))
    res["stdout"] = p.stdout
    res["tmp left"] = sorted(os.listdir(tmp))
    return res


def changes(res: dict[str, Any], allow: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything the use changed that a library must not: the state diff (less the `allow`ed entries:
    snapshot keys, `environ:NAME` or `thread:NAME`), threads still running, stdout output, files left in the temp folder.
    tuner's finder for its subpackages in a source checkout (tuner/_layout.py) is allowed on sys.meta_path."""
    d = {k: v for k, v in res["diff"].items() if k not in allow}
    env = d.pop("environ", None)
    if env:
        env = {k: v for k, v in env.items() if f"environ:{k}" not in allow}
        if env:
            d["environ"] = env
    if "sys.meta_path" in d:
        before, after = d["sys.meta_path"]
        if [f for f in after if "_layout._SourceFinder" not in f] == before:
            del d["sys.meta_path"]
    d.pop("tmp files", None)  # judged after exit, below: a file removed at exit is fine
    threads = [t for t in res["threads"] if f"thread:{t}" not in allow]
    if threads:
        d["threads left running"] = threads
    if res["stdout"]:
        d["stdout"] = res["stdout"][-2000:]
    if res["tmp left"]:
        d["temp files left"] = res["tmp left"]
    return d


# ---- the uses ------------------------------------------------------------------------------------------
SPACE = """
import tuner
from tuner.search_spaces import Categorical, PowerOfTwo, SearchSpace
space = SearchSpace([PowerOfTwo("a", 1, 64), PowerOfTwo("b", 1, 64), Categorical("c", ["x", "y"])])
def objective(cfg):
    return (cfg["a"] - 8) ** 2 + (cfg["b"] - 4) ** 2 + (cfg["c"] == "y") + 1.0
"""

STUDY = """
import os
from pathlib import Path
from tuner.studies import export_study, load_study, run_study, write_report
p = Path(os.environ["TUNER_HOME"]) / "s.toml"
p.write_text('''
[study]
name = "s"
device = "cpu"
budget = { trials = 4 }
strategy = "random"
seed = 3
output = "out"
[[tasks]]
kernel = "fakemm"
grid = { M = [64], N = [64], K = [32] }
''')
spec = load_study(p, check_kernels=False)
"""

TRITON = {"TRITON_INTERPRET": "1"}
JAX = {"JAX_PLATFORMS": "cpu"}
ALL = USER_STACK + KERNEL_STACK

# name: (code, modules the user had imported before, environment, changes allowed)
USES: dict[str, tuple[str, tuple[str, ...], dict[str, str], tuple[str, ...]]] = {
    # numpy first: its own import adds warnings filters
    "import tuner": ("import tuner", ("numpy",), {}, ()),
    "import subpackages": (
        "import tuner, tuner.kernels, tuner.search_spaces, tuner.cost_models",
        ("numpy",),
        {},
        (),
    ),
    "import subpackages, user stack loaded": (
        "import tuner, tuner.kernels, tuner.search_spaces, tuner.cost_models",
        ALL,
        {},
        (),
    ),
    **{
        f"optimize {s}": (
            SPACE + f"tuner.optimize(space, objective, budget=12, strategy={s!r})",
            USER_STACK,
            {},
            (),
        )
        for s in ("auto", "random", "tpe", "model", "transfer_best", "xgb_greedy")
    },
    "optimize with a prior and a sqlite store": (
        SPACE
        + """
import os
prior = [[({"a": 8, "b": 4, "c": "x"}, 1.0), ({"a": 1, "b": 1, "c": "y"}, 60.0)]]
url = "sqlite:///" + os.path.join(os.environ["TUNER_HOME"], "s.db")
tuner.optimize(space, objective, budget=8, prior=prior, storage=url)
tuner.optimize(space, objective, budget=10, prior=prior, storage=url)
""",
        USER_STACK,
        {},
        (),
    ),
    "optimize, every trial failed": (
        SPACE
        + """
import warnings
with warnings.catch_warnings(record=True):
    tuner.optimize(space, lambda c: 1 / 0, budget=3, strategy="random")
""",
        USER_STACK,
        {},
        (),
    ),
    "replay": (
        f"""
import tuner
from tuner.replay import load_table
t = load_table({str(REPO / "tests/data/convolution_A100_sample.json")!r})
tuner.optimize(t.space, t.objective_fn(), budget=20, strategy="auto", seed=1)
""",
        USER_STACK,
        {},
        (),
    ),
    "cost model fit": (
        """
import numpy as np
from tuner.cost_models.models import XGBEnsemble, XGBRankerModel, XGBRegressorModel, RandomForestModel
rng = np.random.default_rng(0)
X, y = rng.random((64, 4)), rng.random(64) + 0.1
for m in (XGBRegressorModel(n_threads=2), XGBRankerModel(), XGBEnsemble(), RandomForestModel()):
    m.fit(X, y).predict(X)
""",
        USER_STACK,
        {},
        # scikit-learn's forest fixes multiprocessing's default context (at n_jobs=1 too): not tuner's doing
        ("mp.start_method",),
    ),
    "autotune a Python function": (
        """
import tuner
from tuner.search_spaces import PowerOfTwo, SearchSpace
@tuner.autotune(SearchSpace([PowerOfTwo("block", 1, 8)]), key=["n"], budget=4)
def f(n, *, block):
    return sum(range(n * block))
f(100); f(100); f(200)
""",
        USER_STACK,
        {},
        # documented (docs/api.md): tuning with a store releases its claims at exit
        ("atexit",),
    ),
    "autotune in record mode": (
        """
import tuner
from tuner.search_spaces import PowerOfTwo, SearchSpace
@tuner.autotune(SearchSpace([PowerOfTwo("block", 1, 8)]), key=["n"], mode="record")
def f(n, *, block):
    return n * block
f(100); f(100); f(200)
""",
        USER_STACK,
        {},
        # documented (docs/api.md): record mode writes the miss counts from a daemon thread, and once more at exit
        ("atexit", "thread:tuner-miss-recorder"),
    ),
    "autotune a Triton kernel": (
        """
import torch, triton, triton.language as tl
import tuner
@tuner.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((16, 1), (32, 2))],
                key=["n"], restore=["x_ptr"])
@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)
x = torch.zeros(100)
add_one[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, 100)
add_one[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, 100)
assert add_one.tuner.stats["tuned"] == 1 and torch.equal(x, torch.full((100,), 2.0))
""",
        ALL,
        TRITON,
        # documented (docs/api.md): tuning with a store releases its claims at exit
        ("atexit",),
    ),
    "autotune a JAX launcher, eager and under jit": (
        """
import functools, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
import tuner
from tuner.search_spaces import PowerOfTwo, SearchSpace
def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0
@tuner.autotune(SearchSpace([PowerOfTwo("block", 8, 32)]), key=lambda x: {"n": x.shape[0]}, budget=3)
@functools.partial(jax.jit, static_argnames=("block",))
def double(x, *, block):
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block,),
        in_specs=[pl.BlockSpec((block,), lambda i: (i,))], out_specs=pl.BlockSpec((block,), lambda i: (i,)),
        interpret=True)(x)
double(jnp.arange(64, dtype=jnp.float32))
jax.jit(double)(jnp.arange(128, dtype=jnp.float32)).block_until_ready()
assert double.tuner.stats["tuned"] == 2
""",
        ALL,
        JAX,
        # documented (docs/api.md): tuning with a store releases its claims at exit
        ("atexit",),
    ),
    "a registered Triton kernel on the CPU, in worker processes": (
        """
import tuner
res = tuner.tune_kernel("rmsnorm", None, backend="triton", device="cpu", budget=2, strategy="random",
                        finalists=1)
assert res.best_config is not None, [t.error for t in res.trials]
""",
        USER_STACK + ("torch", "triton"),
        {},
        # documented (README.md "Settings", docs/api.md): the interpreter is turned on where there is no
        # CUDA device and the user did not choose, before the first kernel is defined
        ("environ:TRITON_INTERPRET",),
    ),
    "a study: run (with its progress display), report, export": (
        STUDY
        + """
run_study(spec, executor="tests._study_fake:executor", progress=True)
write_report(spec, spec.output_dir)
export_study(spec, spec.output_dir / "cache.json")
""",
        # matplotlib's backend modules register an atexit handler when first imported
        USER_STACK + ("matplotlib.figure", "matplotlib.backends.backend_agg"),
        {},
        (),
    ),
}


def _kernel_modules(stack: tuple[str, ...]) -> list[str]:
    """The modules of the `[kernels]` extra that a use imports (its stack; its body imports no others)."""
    return sorted({m.split(".")[0] for m in stack if m in KERNEL_STACK})


def _skip_without_kernel_modules(use: str, stack: tuple[str, ...]) -> None:
    for name in _kernel_modules(stack):
        pytest.importorskip(name, reason=f"{use!r} needs {name} (tuner's [kernels] extra), not installed")


@pytest.mark.parametrize("use", list(USES))
def test_use_leaves_the_process_as_it_found_it(tmp_path: Path, use: str, _zygotes: _Zygotes) -> None:
    body, stack, env, allow = USES[use]
    _skip_without_kernel_modules(use, stack)
    assert changes(probe(tmp_path, body, stack=stack, env=env, zygotes=_zygotes), allow) == {}, use


def test_the_users_own_logger_levels_hold(tmp_path: Path, _zygotes: _Zygotes) -> None:
    """A user who set the alembic and optuna loggers' levels keeps them: tuner quietens alembic only where
    nobody chose (and puts Optuna's own `setLevel(WARN)` of alembic back)."""
    setup = """
import logging, optuna
logging.getLogger("alembic").setLevel(logging.INFO)
optuna.logging.set_verbosity(optuna.logging.DEBUG)
"""
    res = probe(
        tmp_path,
        SPACE + USES["optimize with a prior and a sqlite store"][0].split(SPACE, 1)[1],
        setup=setup,
        zygotes=_zygotes,
    )
    assert changes(res) == {}


def test_overlapping_scopes_put_the_value_back_once_the_last_ends() -> None:
    from tuner._scoped import SharedOverride

    box = {"v": 10}
    quiet = SharedOverride(lambda: box["v"], lambda v: box.__setitem__("v", v), lambda v: max(v, 30))
    a, b = quiet(), quiet()
    a.__enter__()
    assert box["v"] == 30
    b.__enter__()  # another thread's optimize, say
    a.__exit__(None, None, None)
    assert box["v"] == 30  # b still runs: quiet until it ends
    b.__exit__(None, None, None)
    assert box["v"] == 10
    with pytest.raises(RuntimeError), quiet():
        raise RuntimeError("the objective failed")
    assert box["v"] == 10


def test_uses_that_need_the_kernel_backends_skip_where_they_are_not_installed(tmp_path: Path) -> None:
    """Run where torch, triton and jax are not installed (a tuner without `[kernels]`: here, modules of those
    names on PYTHONPATH that raise ModuleNotFoundError, in pytest and in each probe's interpreter), the uses that
    need them failed with the probe's ModuleNotFoundError; they are skipped, naming the module."""
    import xml.etree.ElementTree as ET

    shim = tmp_path / "no_kernels"
    for name in ("torch", "triton", "jax", "jaxlib"):
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {name!r}'!r}, name={name!r})\n", encoding="utf-8"
        )
    needing = [u for u, (_, stack, _, _) in USES.items() if _kernel_modules(stack)]
    assert len(needing) >= 3  # the Triton and JAX autotune uses, and the registered Triton kernel
    report = tmp_path / "report.xml"
    ids = [
        f"{Path(__file__).relative_to(REPO)}::test_use_leaves_the_process_as_it_found_it[{u}]"
        for u in needing
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "TUNER_"))}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            f"--junitxml={report}",
            *ids,
        ],
        cwd=REPO,
        env={**env, "PYTHONPATH": repo_pythonpath(shim)},
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    cases = ET.parse(report).getroot().iter("testcase")
    outcome = {
        c.get("name"): [(e.tag, e.get("message", "")) for e in c if e.tag in ("skipped", "failure", "error")]
        for c in cases
    }
    assert len(outcome) == len(needing), (outcome, r.stdout[-2000:])
    for name, results in outcome.items():
        assert [tag for tag, _ in results] == ["skipped"], (name, results, r.stdout[-3000:])
        assert "(tuner's [kernels] extra), not installed" in results[0][1], (name, results)
