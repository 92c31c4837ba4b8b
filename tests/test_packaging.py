"""Packaging: what pyproject.toml promises (Python version, ranges, one XGBoost, license, URLs), the
constraints file CI installs with, and the wheel: it installs into a fresh virtual environment beside the
PyPI distribution named `kernels`, and both import."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import tuner

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def _requirements(*extras: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for e in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][e]]
    return reqs


def _constraints() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(ver)
    return pins


def test_requires_python_is_what_ci_runs():
    spec = SpecifierSet(PROJECT["requires-python"])
    assert spec == SpecifierSet(">=3.11")
    assert Version(f"{sys.version_info.major}.{sys.version_info.minor}") in spec


def test_library_dependencies_are_ranges_not_pins():
    for r in _requirements():
        assert r.specifier, f"{r} has no lower bound"
        ops = {s.operator for s in r.specifier}
        assert ops & {">=", "~="}, f"{r}: give the lowest version known to work"
        assert "==" not in ops and "===" not in ops, f"{r}: an exact pin belongs in constraints.txt"


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> a file of the installed code (tuner/, kernels/, search_spaces/, cost_models/)
    that imports it, for every module outside the standard library and tuner."""
    import ast

    found: dict[str, str] = {}
    for root in ("tuner", "kernels", "search_spaces", "cost_models"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("tuner", "__future__"):
                        found.setdefault(top, str(path.relative_to(REPO)))
    return found


# Drivers tuner does not install for its users but works with where they are installed: psycopg 3, which
# SQLAlchemy picks for a driverless postgresql:// URL (tuner/storage/_watchdog_pg3.py is imported only for a
# psycopg 3 engine). The dev extra declares them, so the tests run through them.
OPTIONAL_DRIVERS = {"psycopg"}


def test_the_documented_lower_bound_check_installs_each_lower_bound():
    """docs/packaging.md's check of the lower bounds installs every library dependency at the lower bound
    pyproject.toml declares: a bound raised (or added) without that check's command changing fails here."""
    text = (REPO / "docs" / "packaging.md").read_text(encoding="utf-8")
    m = re.search(r"floor/bin/pip install (numpy==.*?)\nfloor/bin/pip install --no-deps", text, flags=re.S)
    assert m, "docs/packaging.md lost its lower-bound command"
    words = m.group(1).replace("\\\n", " ").replace("'", "").split()
    pins = {}
    for w in words:
        r = Requirement(w)
        (spec,) = r.specifier
        pins[canonicalize_name(r.name)] = Version(spec.version)
    for r in _requirements():
        lows = [Version(s.version) for s in r.specifier if s.operator in (">=", "~=")]
        name = canonicalize_name(r.name)
        assert name in pins, f"docs/packaging.md's lower-bound check does not install {name}"
        assert pins[name] == lows[0], f"docs/packaging.md checks {name}=={pins[name]}, pyproject has {r}"


def test_every_imported_distribution_is_declared():
    """A module tuner imports must come from a distribution it declares (the library's, or the kernels
    extra's; an optional driver's, the dev extra's), not from one that another dependency happens to pull
    in (alembic came with optuna)."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    declared = {canonicalize_name(r.name) for r in _requirements("kernels")}
    dev = {canonicalize_name(r.name) for r in _requirements("dev")} - {
        canonicalize_name(r.name) for r in _requirements()
    }
    for module, where in _third_party_imports().items():
        dists = owners.get(module)
        if not dists:  # not installed here (a platform's module); nothing to map it to
            continue
        allowed = declared | (dev if module in OPTIONAL_DRIVERS else set())
        assert {canonicalize_name(d) for d in dists} & allowed, (
            f"{where} imports {module} (distribution {dists[0]}), which pyproject.toml does not declare"
        )


def test_a_new_store_and_optuna_on_it_use_no_deprecated_sqlalchemy_api(tmp_path):
    """Opening a new store (tuner's Alembic migrations) and running an Optuna study on it ask nothing of
    SQLAlchemy that it deprecates: with SQLAlchemy 2.1, alembic before 1.13.2 passes `execute()` an empty
    parameter sequence (a SADeprecationWarning, "will raise an exception in a future SQLAlchemy release"),
    which is why pyproject asks for alembic>=1.13.2."""
    import warnings

    import optuna
    from sqlalchemy.exc import SADeprecationWarning

    from tuner.store import ResultStore

    with warnings.catch_warnings():
        warnings.simplefilter("error", SADeprecationWarning)
        store = ResultStore(f"sqlite:///{tmp_path / 'tuner.db'}")
        study = optuna.create_study(storage=store.optuna_storage(), study_name="s")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        assert len(study.trials) == 2 and store.count() == 0


def test_a_missing_kernel_backend_names_the_extra():
    """A trial (or `tuner check`) on a tuner installed without `[kernels]` fails saying how to fix it."""
    from tuner.measure._gate import _BACKEND_MODULES, describe_exception

    extra = {canonicalize_name(r.name) for r in _requirements("kernels")} - {
        canonicalize_name(r.name) for r in _requirements()
    }
    assert {"torch", "triton", "jax", "jaxlib"} == extra == _BACKEND_MODULES
    try:
        import torch_is_not_here  # noqa: F401
    except ModuleNotFoundError as exc:
        assert "tuner[kernels]" not in describe_exception(exc)
    exc = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert "pip install 'tuner[kernels]'" in describe_exception(exc)


_WITHOUT_BACKENDS = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import torch` raises ModuleNotFoundError, as where [kernels] is not installed
from tuner.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _tuner_without(modules: str, args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`tuner ARGS` in a fresh interpreter where the comma-separated `modules` cannot be imported."""
    env = {**os.environ, "TUNER_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_BACKENDS, modules, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=300,
        encoding="utf-8",
    )


@pytest.mark.parametrize("backend", [[], ["--backend", "triton"], ["--backend", "pallas"]])
def test_tuner_check_without_the_kernel_backends_names_the_extra(backend: list[str], tmp_path: Path):
    """`tuner check` on a tuner installed without `[kernels]` fails with one line that says how to fix it
    (it used to print only `tuner: failed: ModuleNotFoundError: No module named 'jax'`)."""
    r = _tuner_without("torch,triton,jax,jaxlib", ["check", "softmax", "--configs", "1", *backend], tmp_path)
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("tuner: failed: ModuleNotFoundError") and "pip install 'tuner[kernels]'" in line, (
        line
    )


@pytest.mark.parametrize(("missing", "backend"), [("torch", "triton"), ("jax", "pallas")])
def test_study_run_without_the_kernel_backends_runs_nothing_and_names_the_extra(
    missing: str, backend: str, tmp_path: Path
):
    """`tuner study run` on a tuner installed without `[kernels]` stops before any trial with one line naming
    the extra, and its tasks stay pending. It used to crash every trial of every task (in worker processes),
    mark each task failed, and a run after installing the backend ran nothing without --retry-failed."""
    study = tmp_path / "s.toml"
    study.write_text(
        f'[study]\nname = "nobackend"\ndevice = "cpu"\nbackends = ["{backend}"]\ndtypes = ["float32"]\n'
        "budget = { trials = 1 }\nfinalists = 1\n\n"
        '[[tasks]]\nkernel = "softmax"\nproblems = [{ M = 4, N = 16 }, { M = 8, N = 16 }]\n',
        encoding="utf-8",
    )
    r = _tuner_without(missing, ["study", "run", str(study)], tmp_path)
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"tuner: failed: ModuleNotFoundError: No module named '{missing}'"), line
    assert f"2 task(s) left on backend {backend}" in line and "pip install 'tuner[kernels]'" in line, line
    assert r.stdout == ""
    from tuner.studies import load_study
    from tuner.studies._runner import study_rows

    spec = load_study(study, storage=f"sqlite:///{tmp_path / 'studies' / 'nobackend' / 'study.db'}")
    assert [row.status for row in study_rows(spec)] == ["pending", "pending"]


_TUNE_WITHOUT = """
import json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import torch` raises ModuleNotFoundError, as where [kernels] is not installed
import tuner

if __name__ == "__main__":
    problem = {"M": 4, "N": 16, "dtype": "float32"}
    try:
        r = tuner.tune_kernel("softmax", problem, backend=sys.argv[2], device="cpu", budget=2,
                              finalists=1, storage=sys.argv[3])
        print(json.dumps({"returned": str(r.best_config)}))
    except Exception as exc:
        print(json.dumps({"raised": type(exc).__name__, "name": getattr(exc, "name", None), "text": str(exc)}))
"""


@pytest.mark.parametrize(("missing", "backend"), [("torch,triton", "triton"), ("jax,jaxlib", "pallas")])
def test_tune_kernel_without_the_kernel_backend_refuses_before_any_trial(
    missing: str, backend: str, tmp_path: Path
):
    """`tuner.tune_kernel(..., backend="triton")` on a tuner installed without `[kernels]` (no measurer given)
    ran every trial to a crash in its workers, warned AllTrialsFailedWarning and stored the failed trials. It
    raises ModuleNotFoundError naming the module and the extra before any trial, and writes no store."""
    script = tmp_path / "tune.py"  # a file, for the worker processes the old code started to re-import
    script.write_text(_TUNE_WITHOUT, encoding="utf-8")
    db = tmp_path / "tuner.db"
    r = subprocess.run(
        [sys.executable, str(script), missing, backend, f"sqlite:///{db}"],
        capture_output=True,
        text=True,
        env={**os.environ, "TUNER_HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got.get("raised") == "ModuleNotFoundError", (got, r.stderr[-2000:])
    assert got["name"] == missing.split(",")[0]
    assert got["text"].startswith(
        f"No module named '{got['name']}': tune_kernel('softmax') on backend {backend}"
    )
    assert "no trial was run" in got["text"] and "pip install 'tuner[kernels]'" in got["text"]
    assert "AllTrialsFailedWarning" not in r.stderr
    assert not db.exists()


def test_a_kernel_module_that_needs_a_missing_backend_names_the_extra(tmp_path, monkeypatch):
    """The kernel registry wraps a kernel module's import failure in an ImportError naming the module; the
    hint of the extra stays, read from the error it wraps."""
    import tuner.kernels as kernels
    from tuner.kernels import _registry

    from tuner.measure._gate import describe_exception

    (tmp_path / "needs_torch.py").write_text("import torch\n", encoding="utf-8")
    monkeypatch.setattr(kernels, "__path__", [*kernels.__path__, str(tmp_path)])
    monkeypatch.setattr(_registry, "_loaded", False)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` is a ModuleNotFoundError naming torch
    with pytest.raises(ImportError, match="tuner.kernels.needs_torch") as info:
        _registry.get_kernel("softmax")
    text = describe_exception(info.value)
    assert "tuner.kernels.needs_torch" in text and "pip install 'tuner[kernels]'" in text
    # a module that fails for another reason gets no such hint
    (tmp_path / "needs_torch.py").write_text("import torch_is_not_here\n", encoding="utf-8")
    with pytest.raises(ImportError, match="torch_is_not_here") as info:
        _registry.get_kernel("softmax")
    assert "tuner[kernels]" not in describe_exception(info.value)


def _help_texts() -> list[tuple[str, str]]:
    """(command, text) for the description, epilog and every option's help of each `tuner` command."""
    import argparse

    from tuner.cli import build_parser

    found: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        name = parser.prog
        found.extend((name, t) for t in (parser.description, parser.epilog) if t)
        for action in parser._actions:
            if action.help and action.help != argparse.SUPPRESS:
                found.append((name, action.help))
            if isinstance(action, argparse._SubParsersAction):
                found.extend((name, c.help) for c in action._choices_actions if c.help)
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    return found


def test_cli_help_names_no_repository_file_as_if_installed():
    """`tuner ... --help` is read by users of the installed wheel, which holds neither docs/ nor the
    example studies/: `tuner --help` said "(studies/*.toml)" and `tuner study --help` "see
    docs/studies.md", files such a user does not have. A help text may name a repository file only while
    saying that it is the repository's."""
    path = re.compile(r"\b(docs|studies|benchmarks|tests)/[\w.*/-]*")
    bad = [(cmd, text) for cmd, text in _help_texts() if path.search(text) and "repository" not in text]
    assert not bad, bad


def test_one_xgboost_distribution():
    names = {canonicalize_name(r.name) for r in _requirements("kernels", "dev")}
    assert "xgboost" in names and "xgboost-cpu" not in names


def test_constraints_pin_every_dependency_inside_its_range():
    pins = _constraints()
    for r in _requirements("kernels", "dev"):
        name = canonicalize_name(r.name)
        assert name in pins, f"constraints.txt lacks {name}"
        assert r.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {r}"


def test_ci_and_readme_install_with_the_constraints_file():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -c constraints.txt -e '.[kernels,dev]'" in ci
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first_two = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)[:2]
    assert len(first_two) == 2
    for cmd in first_two:
        assert cmd.startswith("python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e ")


def test_license_and_urls():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert {"Homepage", "Source", "Issues"} <= set(PROJECT["urls"])


# ---- the wheel, in a fresh virtual environment ---------------------------------------------------------
_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".hypothesis", ".*_cache", "*.db"
)


def _setuptools_at_least(version: str) -> bool:
    try:
        from importlib.metadata import version as dist_version

        return Version(dist_version("setuptools")) >= Version(version)
    except Exception:
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the checkout (the build writes build/ and *.egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE, symlinks=True)
    out = tmp / "dist"
    # Build with this environment's setuptools when it is new enough (no index needed), else isolated.
    isolation = ["--no-build-isolation"] if _setuptools_at_least("77") else []
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("tuner-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_contents(wheel: Path):
    assert wheel.name.startswith(f"tuner-{tuner.__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"tuner", f"tuner-{tuner.__version__}.dist-info"}, tops  # no top-level kernels/ & co.
    for need in (
        "tuner/kernels/__init__.py",
        "tuner/search_spaces/__init__.py",
        "tuner/cost_models/__init__.py",
        "tuner/data/cache-schema.json",
        "tuner/__main__.py",
        "tuner/storage/migrations/env.py",
        "tuner/py.typed",  # PEP 561: without it a user's mypy treats all of tuner as Any
    ):
        assert need in names, need
    # every migration script of the checkout, so an installed tuner can upgrade an older store
    for script in (REPO / "tuner" / "storage" / "migrations" / "versions").glob("*.py"):
        assert f"tuner/storage/migrations/versions/{script.name}" in names, script.name
    # no tests or benchmark data: only the package and its own data files
    assert not [n for n in names if re.search(r"(^|/)(tests|benchmarks)/", n)], names
    data = {n for n in names if not n.endswith(".py") and not n.startswith(f"tuner-{tuner.__version__}.dist")}
    assert data == {"tuner/data/cache-schema.json", "tuner/py.typed"}, data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Requires-Python: >=3.11" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert "Project-URL: Source, " in meta
    assert "Requires-Dist: xgboost>=" in meta and "xgboost-cpu" not in meta


@pytest.mark.slow
@pytest.mark.skipif(not _setuptools_at_least("77"), reason="builds with this environment's setuptools")
def test_sdist_holds_the_package_and_no_partial_test_suite(tmp_path: Path):
    """The sdist builds the wheel: the package's files, pyproject.toml, README.md and LICENSE. It used to
    carry tests/test_*.py alone (setuptools' default), without conftest.py, the helpers and tests/data/, so
    a packager's `pytest tests` on it failed at collection (`No module named 'tests._scripts'`)."""
    import tarfile

    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE, symlinks=True)
    out = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
        capture_output=True,
        text=True,
        cwd=src,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (sdist,) = out.glob("tuner-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert not [n for n in names if n.startswith("tests/")], sorted(names)
    assert {"pyproject.toml", "README.md", "LICENSE"} <= names
    listed = subprocess.run(
        ["git", "ls-files", "tuner", "kernels", "search_spaces", "cost_models"],
        capture_output=True,
        text=True,
        cwd=REPO,
        encoding="utf-8",
    )
    if listed.returncode == 0 and listed.stdout.strip():
        missing = sorted(set(listed.stdout.split()) - names)
        assert not missing, missing


_CHECK = """
import importlib.metadata as md, json, sys
import kernels
import tuner.kernels
import tuner._schema
assert kernels is not tuner.kernels
assert hasattr(kernels, "get_kernel") and hasattr(tuner.kernels, "get_kernel")
assert kernels.get_kernel is not tuner.kernels.get_kernel
schema = tuner._schema.cache_schema()
print(json.dumps({
    "kernels": kernels.__file__, "tuner.kernels": tuner.kernels.__file__,
    "kernels_dist": md.version("kernels"), "tuner_dist": md.version("tuner"), "schema": schema["title"],
}))
"""


@pytest.mark.slow
def test_wheel_installs_beside_the_kernels_distribution(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    # without pip of its own (ensurepip is most of a venv's creation): this environment's pip installs
    # into it (`pip --python`)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    pins = _constraints()
    # tuner without its dependencies but numpy (all that importing tuner.kernels needs: the import stays
    # light), and the other `kernels` with its own dependencies, from the package index.
    others = ["kernels", f"numpy=={pins['numpy']}"]
    # pip and the check without PYTHONPATH: a checkout on it with a tuner.egg-info is an installed tuner
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run(
        [*pip, "install", "-q", "--disable-pip-version-check", *others],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        encoding="utf-8",
    )
    if r.returncode != 0:
        if re.search(r"(?i)connection|network|resolve|No matching distribution|Could not find", r.stderr):
            pytest.skip(f"the package index is not reachable here: {r.stderr.strip().splitlines()[-1]}")
        pytest.fail(r.stderr[-3000:])
    r = subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(
        [str(py), "-c", _CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    site = str(venv)
    assert got["kernels"].startswith(site) and got["tuner.kernels"].startswith(site), got
    assert "/tuner/kernels/" in got["tuner.kernels"].replace(os.sep, "/")
    assert got["tuner_dist"] == tuner.__version__


_TYPED_USER_SCRIPT = """
import tuner
from tuner import Constraint, IntRange, PowerOfTwo, SearchSpace, TuneResult
from tuner.strategies import ModelStrategy, ModelStrategyConfig

space = SearchSpace(
    [PowerOfTwo("BLOCK", 16, 128), IntRange("stages", 1, 4)],
    [Constraint("smem", lambda c: c["BLOCK"] * c["stages"] <= 256, uses=("BLOCK", "stages"))],
)
ok: TuneResult = tuner.optimize(
    space, lambda c: 1.0, budget=5, seed=0, prior=[[({"BLOCK": 16}, 1.0), ({"BLOCK": 32}, None)]]
)
best: float = ok.best_value
tuner.optimize(space, lambda c: 1.0, budget=5, strategy=ModelStrategy(space, config=ModelStrategyConfig()))
tuner.optimize(space, lambda c: 1.0, budget="5")  # E1
tuner.optimize({"BLOCK": [16]}, lambda c: 1.0, budget=5)  # E2
tuner.optimize(space, lambda c: 1.0, budget=5, prior=[[{"BLOCK": 16}]])  # E3
ok.best_config["BLOCK"]  # E4: None when every trial failed
"""


@pytest.mark.slow
def test_installed_wheel_is_typed_for_a_users_mypy(wheel: Path, tmp_path: Path):
    """A user's mypy sees tuner's annotations (py.typed): documented calls pass, wrong types are caught."""
    pytest.importorskip("mypy")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        encoding="utf-8",
    ).stdout.strip()
    with zipfile.ZipFile(wheel) as z:  # what pip would install, without pip or the dependencies
        z.extractall(site)
    script = tmp_path / "user.py"
    script.write_text(_TYPED_USER_SCRIPT, encoding="utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", str(py), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        encoding="utf-8",
    )
    errors = [ln for ln in r.stdout.splitlines() if ": error:" in ln]
    lines = _TYPED_USER_SCRIPT.splitlines()
    flagged = sorted(lines[int(ln.split(":")[1]) - 1].rsplit("# ", 1)[-1][:2] for ln in errors)
    assert flagged == ["E1", "E2", "E3", "E4"], r.stdout


_USE = """
import json, sys
import tuner
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "jax", "jaxlib", "triton", "xgboost"))
print(json.dumps({"version": tuner.__version__, "file": tuner.__file__, "heavy": heavy}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TUNER_TEST_WHEEL_DEPS") != "1",
    reason="installs the wheel with its dependencies from the package index (minutes, ~1 GB): "
    "set TUNER_TEST_WHEEL_DEPS=1",
)
def test_wheel_with_its_dependencies_works_without_the_kernel_backends(wheel: Path, tmp_path: Path):
    """What a user gets from `pip install tuner` (no `[kernels]`): the import, the CLI, a replay of a
    recorded table and the store work, torch / jax / triton are not installed, `pip check` is clean; and
    beside a stack that pins older allowed releases (numpy 1.26, SQLAlchemy 2.1.0) pip keeps those pins."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    pins = ["numpy==1.26.4", "sqlalchemy==2.1.0"]  # a neighbour's pins, inside pyproject's ranges
    # without PYTHONPATH: a checkout on it that has a tuner.egg-info (an editable install made one) is an
    # installed tuner 0.1.0 to pip, which then skips the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel), *pins],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    env["TUNER_HOME"] = str(tmp_path / "home")

    def run(*args: str) -> str:
        out = subprocess.run(
            [*args], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, encoding="utf-8"
        )
        assert out.returncode == 0, (args, out.stderr[-3000:])
        return out.stdout

    import json

    got = json.loads(run(py, "-c", _USE).strip().splitlines()[-1])
    assert got["file"].startswith(str(venv)) and got["heavy"] == [], got
    tuner_exe = str(Path(py).parent / "tuner")
    assert run(tuner_exe, "--version").strip() == f"tuner {tuner.__version__}"
    assert run(py, "-m", "tuner", "--version").strip() == f"tuner {tuner.__version__}"
    table = REPO / "tests" / "data" / "convolution_A100_sample.json"
    doc = json.loads(run(tuner_exe, "replay", str(table), "--budget", "20", "--json"))
    assert doc["evaluations"] == 20 and doc["best_value"] >= doc["optimum"] > 0
    assert "no cached entries" in run(tuner_exe, "cache", "show")  # creates and migrates a fresh store
    listing = run(py, "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    installed = {canonicalize_name(d["name"]): d["version"] for d in json.loads(listing)}
    assert not {"torch", "jax", "jaxlib", "triton"} & set(installed), sorted(installed)
    assert installed["numpy"] == "1.26.4" and installed["sqlalchemy"] == "2.1.0"
    run(py, "-m", "pip", "check", "--disable-pip-version-check")
