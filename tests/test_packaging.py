"""Packaging: what pyproject.toml promises (Python version, ranges, one XGBoost, license, URLs), the
constraints file CI installs with, and the wheel: it installs into a fresh virtual environment beside the
PyPI distribution named `kernels`, and both import."""

from __future__ import annotations

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
    ):
        assert need in names, need
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Requires-Python: >=3.11" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert "Project-URL: Source, " in meta
    assert "Requires-Dist: xgboost>=" in meta and "xgboost-cpu" not in meta


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
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    pins = _constraints()
    # tuner without its dependencies but numpy (all that importing tuner.kernels needs: the import stays
    # light), and the other `kernels` with its own dependencies, from the package index.
    others = ["kernels", f"numpy=={pins['numpy']}"]
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *others],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        if re.search(r"(?i)connection|network|resolve|No matching distribution|Could not find", r.stderr):
            pytest.skip(f"the package index is not reachable here: {r.stderr.strip().splitlines()[-1]}")
        pytest.fail(r.stderr[-3000:])
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run(
        [str(py), "-c", _CHECK], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    site = str(venv)
    assert got["kernels"].startswith(site) and got["tuner.kernels"].startswith(site), got
    assert "/tuner/kernels/" in got["tuner.kernels"].replace(os.sep, "/")
    assert got["tuner_dist"] == tuner.__version__
