"""Version checks of the installed backends, for tests whose expectation changed with a release."""

from __future__ import annotations

from packaging.version import Version


def triton_before(version: str) -> bool:
    """Whether the installed Triton is older than `version` (a local or dev suffix is ignored)."""
    import triton

    return Version(triton.__version__).release < Version(version).release
