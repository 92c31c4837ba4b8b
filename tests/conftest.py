"""Test-wide setup: the Triton interpreter must be on before any @triton.jit is defined, and every test
gets its own TUNER_HOME so nothing touches the user's store."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# jax on the CPU: tests/_env.py's quick_cpu_xla_flags (the LLVM back end at optimisation level 1, not 2,
# and with jaxlib 0.10 XLA's older code emitters). The tests' programs are tiny and run a few times each, so
# compiling them (one XLA compile per eager primitive, per jit, per Pallas interpret-mode kernel) was most of
# the jax tests' CPU time: level 1 cut it by about a quarter (tests/test_kernel_grad.py), the emitters by
# about a third again (that file: 39 s of CPU instead of 63 on 2 workers). Not where jax runs on another
# platform, nor where XLA_FLAGS sets a level.
if os.environ["JAX_PLATFORMS"] == "cpu" and "xla_backend_optimization_level" not in os.environ.get(
    "XLA_FLAGS", ""
):
    from tests._env import quick_cpu_xla_flags

    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {quick_cpu_xla_flags()}".strip()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _tuner_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "tuner_home"
    home.mkdir()
    monkeypatch.setenv("TUNER_HOME", str(home))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    monkeypatch.delenv("TUNER_MODE", raising=False)
    return home


@pytest.fixture(autouse=True)
def _logging_disable_kept() -> Iterator[None]:
    """A test that leaves `logging.disable` changed fails here, and the level is put back: a benchmark
    script's `main` run in-process once left WARNING disabled for every later test in that worker, and a test
    waiting for an INFO record from tuner failed far from the cause."""
    before = logging.root.manager.disable
    yield
    after = logging.root.manager.disable
    if after != before:
        logging.disable(before)
        pytest.fail(f"the test left logging.disable at {after} (was {before})", pytrace=False)


# Optuna's verbosity as a fresh `import optuna` leaves it (INFO): what a test that imports optuna first
# starts from, and what it gets back.
_OPTUNA_DEFAULT_VERBOSITY = 20


@pytest.fixture(autouse=True)
def _optuna_verbosity_restored() -> Iterator[None]:
    """A test that changes Optuna's verbosity (optuna.logging.set_verbosity) does not change it for the
    tests after it: it is put back to what it was before the test (Optuna's default where the test
    imported optuna). Optuna is not imported here for tests that do not use it."""
    mod = sys.modules.get("optuna")
    before = mod.logging.get_verbosity() if mod is not None else _OPTUNA_DEFAULT_VERBOSITY
    yield
    mod = sys.modules.get("optuna")
    if mod is not None and mod.logging.get_verbosity() != before:
        mod.logging.set_verbosity(before)


def pytest_configure(config: pytest.Config) -> None:
    """Python's own SIGINT handler (KeyboardInterrupt) in every test process, as in a terminal's foreground:
    a shell starts a background job (`pytest ... &`, `nohup`) with SIGINT ignored, and the tests that send
    SIGINT to this process, or to a child they start (which inherits an ignored SIGINT, and gets the
    default where this process has a handler), failed there. Tests of an ignored SIGINT set it themselves."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header() -> list[str]:
    """Says when the kernels extra is missing: the tests that run kernels then fail on the missing
    framework (ModuleNotFoundError), and this line says why and what to install."""
    import importlib.util

    missing = [m for m in ("torch", "triton", "jax") if importlib.util.find_spec(m) is None]
    if not missing:
        return []
    return [
        f"tuner: the kernels extra is not installed (missing: {', '.join(missing)}); the tests that run "
        "kernels fail without it: pip install -c constraints.txt -e '.[kernels,dev]'"
    ]
