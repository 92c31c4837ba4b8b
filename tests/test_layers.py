"""The import layers (search_spaces <- cost_models, kernels <- the rest of tuner) hold, and the check can fail."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from tests.conftest import REPO


def _checker():
    spec = importlib.util.spec_from_file_location("check_layers", REPO / ".ci" / "check_layers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_repository_respects_the_import_layers() -> None:
    assert _checker().violations(REPO) == []


def test_an_upward_import_is_reported(tmp_path: Path) -> None:
    for folder in ("search_spaces", "cost_models", "kernels"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    (tmp_path / "search_spaces" / "_bad.py").write_text(
        "from tuner.cost_models import features\n", encoding="utf-8"
    )
    (tmp_path / "kernels" / "_bad.py").write_text(
        "from ..tuner import runtime\nimport tuner.runtime\n", encoding="utf-8"
    )
    (tmp_path / "cost_models" / "_bad.py").write_text("from kernels import get_kernel\n", encoding="utf-8")
    bad = _checker().violations(tmp_path)
    assert any(line.startswith("search_spaces/_bad.py:1:") and "tuner.cost_models" in line for line in bad)
    assert any(line.startswith("kernels/_bad.py:2:") and "tuner.runtime" in line for line in bad)
    assert any(line.startswith("cost_models/_bad.py:1:") and "use tuner.kernels" in line for line in bad)
    assert len(bad) == 4


def test_the_leaf_modules_may_be_imported_by_every_layer_and_import_nothing_of_tuner(tmp_path: Path) -> None:
    for folder in ("search_spaces", "cost_models", "kernels"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    (tmp_path / "tuner").mkdir()
    (tmp_path / "tuner" / "_atomic.py").write_text(
        (REPO / "tuner" / "_atomic.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "tuner" / "_settings.py").write_text(
        "import os\nfrom tuner.store import tuner_home\n", encoding="utf-8"
    )
    (tmp_path / "kernels" / "_ok.py").write_text(
        "from tuner._settings import setting\nimport tuner._atomic\n", encoding="utf-8"
    )
    (tmp_path / "search_spaces" / "_bad.py").write_text("from tuner._settings.x import y\n", encoding="utf-8")
    bad = _checker().violations(tmp_path)
    assert not any(line.startswith("kernels/_ok.py") for line in bad)
    assert any(line.startswith("search_spaces/_bad.py:1:") for line in bad)
    assert any(line.startswith("tuner/_settings.py:2:") and "tuner.store" in line for line in bad)
    assert len(bad) == 2
