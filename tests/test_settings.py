"""One home for environment settings: tuner._settings lists every variable tuner reads, the README's table
is that list, and the library reads the variables through it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tuner._settings import SETTINGS, flag, is_set, setting, settings_table, text

_SOURCES = ("tuner", "kernels", "search_spaces", "cost_models")
_NAME = re.compile(r"\b((?:TUNER|TRITON)_[A-Z_]+)\b")
# Names in the sources that are not environment variables: Triton's language keywords and size limits.
_NOT_VARIABLES = {"TRITON_KEYWORDS", "TRITON_MAX_NUMEL", "TRITON_MAX_TENSOR_NUMEL"}
# Variables tuner only sets for the child processes it starts, and never reads: the compile-only pool points
# Triton's cache at a folder of its own (tuner/measure/_compile.py).
_SET_FOR_CHILDREN = {"TRITON_CACHE_DIR"}


def test_readme_table_is_the_settings_module() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- settings table[^\n]*-->\n(.*?)\n<!-- end settings table -->", readme, re.S)
    assert m, "README.md has no generated settings table"
    assert m.group(1) == settings_table(), "README.md's settings table is stale: paste settings_table()"


def test_every_variable_named_in_the_sources_is_a_setting() -> None:
    named: set[str] = set()
    for folder in _SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            if path.name != "_settings.py":
                named |= set(_NAME.findall(path.read_text(encoding="utf-8")))
    missing = named - _NOT_VARIABLES - _SET_FOR_CHILDREN - set(SETTINGS)
    assert not missing, f"read in the sources but not in tuner._settings (nor README's table): {missing}"
    assert set(SETTINGS) <= named, f"settings nothing reads: {set(SETTINGS) - named}"


def test_only_the_settings_module_reads_the_environment() -> None:
    """Named variables are read through `setting`; writing variables for a child process (or the
    interpreter switch) and comparing a measurement target's wanted values with this process's are the only
    other uses of os.environ."""
    reads = re.compile(
        r"""os\.environ\.get\(["']|os\.getenv\(|os\.environ\[["'][A-Z_]+["']\](?!\s*=)|["'] in os\.environ"""
    )
    offenders = []
    for folder in _SOURCES:
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "_settings.py":
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if reads.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_values_are_parsed_by_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_MODE", raising=False)
    assert setting("TUNER_MODE") is None and not is_set("TUNER_MODE")
    monkeypatch.setenv("TUNER_MODE", "")
    assert setting("TUNER_MODE") is None and is_set("TUNER_MODE")
    monkeypatch.setenv("TUNER_MODE", "offline")
    assert setting("TUNER_MODE") == "offline"
    monkeypatch.delenv("TUNER_PREDICT", raising=False)
    assert setting("TUNER_PREDICT") is True
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv("TUNER_PREDICT", off)
        assert setting("TUNER_PREDICT") is False, off
    monkeypatch.setenv("TUNER_PREDICT", "1")
    assert setting("TUNER_PREDICT") is True
    with pytest.raises(KeyError, match="TUNER_NOPE"):
        setting("TUNER_NOPE")
    assert text("TUNER_MODE") == "offline" and flag("TUNER_PREDICT") is True
    with pytest.raises(TypeError, match="TUNER_PREDICT"):
        text("TUNER_PREDICT")
    with pytest.raises(TypeError, match="TUNER_MODE"):
        flag("TUNER_MODE")


def test_library_follows_the_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tuner.runtime._misses import misses_dir
    from tuner.runtime._predict import zero_shot_enabled
    from tuner.store import default_storage_url, tuner_home

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    monkeypatch.delenv("TUNER_MISSES_DIR", raising=False)
    assert tuner_home() == tmp_path
    assert default_storage_url() == f"sqlite:///{tmp_path / 'tuner.db'}"
    assert misses_dir() == tmp_path / "misses"
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:///elsewhere.db")
    monkeypatch.setenv("TUNER_MISSES_DIR", str(tmp_path / "m"))
    assert default_storage_url() == "sqlite:///elsewhere.db"
    assert misses_dir() == tmp_path / "m"
    monkeypatch.setenv("TUNER_PREDICT", "off")
    assert zero_shot_enabled() is False
