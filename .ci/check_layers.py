"""Check the import layers: search_spaces <- cost_models, kernels <- the rest of tuner.

Imports only point down (tuner/ may import all three; kernels/ and cost_models/ may import search_spaces/;
search_spaces/ imports none of them). The leaf modules `tuner._atomic`, `tuner._parse` and `tuner._settings` import nothing of
tuner, so every layer may import them. Run: python .ci/check_layers.py  (exit 1 and one line per violation).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# folder -> the tuner subpackages its modules may import (besides their own)
ALLOWED: dict[str, set[str]] = {
    "search_spaces": set(),
    "cost_models": {"search_spaces"},
    "kernels": {"search_spaces"},
}
LAYERS = set(ALLOWED)
# Leaf modules of tuner (standard library only, nothing of tuner) that every layer may import: the atomic
# file write, the locked parse of Python source and the table of environment settings.
LEAVES = {"_atomic", "_parse", "_settings"}


def _imported(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the module's package
            base = module.split(".")[: -node.level]
            mod = ".".join(base + ([node.module] if node.module else []))
            return [mod]
        return [node.module or ""]
    return []


def violations(root: Path = ROOT) -> list[str]:
    out = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            module = "tuner." + ".".join(rel.parts)
            if path.name == "__init__.py":
                module = module.rsplit(".", 1)[0] + ".__init__"
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                for name in _imported(node, module):
                    parts = name.split(".")
                    if parts[0] in LAYERS:  # an old top-level import name
                        out.append(
                            f"{path.relative_to(root)}:{node.lineno}: imports {name!r}: use tuner.{name}"
                        )
                        continue
                    if parts[0] != "tuner":
                        continue
                    sub = parts[1] if len(parts) > 1 else ""
                    if sub == folder or sub in allowed or (sub in LEAVES and len(parts) == 2):
                        continue
                    target = f"tuner.{sub}" if sub else "tuner"
                    out.append(
                        f"{path.relative_to(root)}:{node.lineno}: {folder}/ imports {target} "
                        f"(allowed: {', '.join(sorted({folder} | allowed))})"
                    )
    for leaf in sorted(LEAVES):
        path = root / "tuner" / f"{leaf}.py"
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for name in _imported(node, f"tuner.{leaf}"):
                if name.split(".")[0] in LAYERS | {"tuner"}:
                    out.append(f"tuner/{leaf}.py:{node.lineno}: a leaf module imports {name!r}")
    return out


def main() -> int:
    bad = violations()
    for line in bad:
        print(line)
    print(f"import layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
