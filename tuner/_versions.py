"""Installed package versions, read once from package metadata (nothing is imported to ask).

The one place tuner asks which version of a package is installed: the runtime's cache keys
(`backend_versions`, and `tuner.runtime._env.framework_versions` for plain callables), the measurements a
tuning run records (`software_versions`) and a study's exported entries all use it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Iterable

__all__ = [
    "VERSIONS_BY_KIND",
    "FRAMEWORK_PACKAGES",
    "BACKEND_KIND",
    "package_version",
    "package_versions",
    "python_version",
    "backend_versions",
    "software_versions",
]

# Packages whose version changes the code a kernel of this kind of callable compiles to.
VERSIONS_BY_KIND: dict[str, tuple[str, ...]] = {
    "triton": ("triton", "torch"),
    "jax": ("jax", "jaxlib"),
    "python": (),
}
# The frameworks whose own functions (jax's Pallas ops, a function of torch) a decorated launcher or a
# `depends` entry may be: by top-level package, the packages whose versions key such a function in place
# of its source (the runtime does not follow a framework's code: its version stands for it).
FRAMEWORK_PACKAGES: dict[str, tuple[str, ...]] = {
    "jax": ("jax", "jaxlib"),
    "jaxlib": ("jax", "jaxlib"),
    "triton": ("triton",),
    "torch": ("torch",),
}
# The runtime's kind of callable for each kernel backend (it selects the versions and the default timer).
BACKEND_KIND: dict[str, str] = {"triton": "triton", "pallas": "jax"}
# What a tuning run records beside its measurements: every package that changes generated code.
_SOFTWARE = ("triton", "jax", "jaxlib", "torch")


@functools.cache
def package_version(pkg: str) -> str | None:
    """The installed version of `pkg`, or None when it is not installed."""
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions(pkgs: Iterable[str]) -> dict[str, str]:
    """Installed versions of `pkgs` (missing ones omitted), without importing them."""
    out = {}
    for p in pkgs:
        v = package_version(p)
        if v is not None:
            out[p] = v
    return out


def python_version() -> str:
    """ "major.minor" of this interpreter."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def backend_versions(backend: str) -> dict[str, str]:
    """Installed versions of the packages that change what `backend` compiles to (triton: triton and
    torch; pallas: jax and jaxlib)."""
    return package_versions(VERSIONS_BY_KIND.get(BACKEND_KIND.get(backend, backend), ()))


def software_versions(packages: Iterable[str] = _SOFTWARE) -> dict[str, str]:
    """Installed versions of the packages that change code generation (triton, jax, jaxlib, torch by
    default): what `tuner.tune_kernel` records with its measurements."""
    return package_versions(packages)
