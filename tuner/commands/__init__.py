"""Subcommands of the `tuner` CLI, one module each."""
