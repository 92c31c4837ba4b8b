"""`import tuner` must not import torch, jax, triton or xgboost (they load only on the paths that need them)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "jax", "jaxlib", "triton", "xgboost", "sklearn"]


def test_import_tuner_is_light() -> None:
    code = (
        "import sys, json, tuner, tuner.search_spaces, tuner.cost_models, tuner.kernels; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, encoding="utf-8"
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_cli_help_is_light() -> None:
    code = (
        "import sys, json\nfrom tuner.cli import build_parser\nbuild_parser()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, encoding="utf-8"
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_schema_validators_load_on_first_cache_file_read() -> None:
    """jsonschema and fastjsonschema (tuner/_schema.py) are imported when a cache file is first checked,
    not by `import tuner`."""
    code = (
        "import sys, json, tuner\n"
        "from tuner._schema import cache_entry_schema_error\n"
        "mods = ['jsonschema', 'fastjsonschema']\n"
        "before = [m for m in mods if m in sys.modules]\n"
        "cache_entry_schema_error({})\n"
        "print(json.dumps([before, [m for m in mods if m in sys.modules]]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, encoding="utf-8"
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [[], ["jsonschema", "fastjsonschema"]]
