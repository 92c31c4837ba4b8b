"""Exceptions that the CLI maps to exit codes (docs/api.md: 2 bad usage or input, 1 anything else)."""

from __future__ import annotations


class BadInput(ValueError):
    """Bad usage or bad input: the CLI prints the one-line message and exits 2, changing nothing."""
