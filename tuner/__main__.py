"""`python -m tuner ...` is the `tuner` command."""

from __future__ import annotations

import sys

from tuner.cli import main

if __name__ == "__main__":
    sys.exit(main())
