"""Where tuner's subpackages live in a source checkout.

`kernels/`, `search_spaces/` and `cost_models/` sit at the top of the repository and install as
`tuner.kernels`, `tuner.search_spaces` and `tuner.cost_models` (pyproject's package-dir). An installed wheel and
an editable install find them on their own; a checkout used without installing (`PYTHONPATH=<checkout>`, as on
a machine where nothing can be installed) needs this small finder, which maps exactly those three names.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SUBPACKAGES = ("kernels", "search_spaces", "cost_models")


class _SourceFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top, _, rest = fullname.partition(".")
        if top != "tuner" or not rest:
            return None
        sub, _, tail = rest.partition(".")
        if sub not in SUBPACKAGES or tail:
            return None  # deeper modules resolve through the package's own __path__
        init = self.root / sub / "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[str(self.root / sub)]
        )


def install_source_finder() -> None:
    """Map tuner.kernels & co. to the checkout's top-level folders when tuner runs from a source tree."""
    here = Path(__file__).resolve().parent
    root = here.parent
    if (here / "kernels").is_dir() or not (root / "pyproject.toml").is_file():
        return  # an installed wheel: the subpackages are inside tuner/
    if not all((root / sub / "__init__.py").is_file() for sub in SUBPACKAGES):
        return
    if any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    # First, so that the checkout tuner was imported from wins over an editable install of another checkout.
    sys.meta_path.insert(0, _SourceFinder(root))
