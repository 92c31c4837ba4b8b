"""docs/api.md against the code: each signature it gives is the one Python sees (names, which are keyword-only,
defaults), and every name `tuner` exports is on the page."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import tuner

API = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
# A definition term of the page: a line of calls, such as `tuner.load_cache(path, *, strict=False)`, or
# several separated by commas.
TERM = re.compile(r"^`tuner\..*`$", re.MULTILINE)
SIGNATURE = re.compile(r"`(tuner(?:\.\w+)+)\(([^`]*)\)`")


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _documented(params: str) -> tuple[list[tuple[str, str, Any]], bool]:
    """(name, kind, default) of each parameter the page gives, and whether it ends with `...` (more
    keywords not listed). kind is "positional" or "keyword"; default is `inspect.Parameter.empty` for none."""
    open_ended = params.rstrip().endswith("...")
    if open_ended:
        params = params.rstrip()[:-3].rstrip().rstrip(",")
    args = ast.parse(f"def f({params}): pass").body[0].args  # type: ignore[attr-defined]
    empty = inspect.Parameter.empty
    out: list[tuple[str, str, Any]] = []
    given = [ast.literal_eval(d) for d in args.defaults]
    pos_defaults = [empty] * (len(args.args) - len(given)) + given
    out += [(a.arg, "positional", d) for a, d in zip(args.args, pos_defaults, strict=True)]
    kw_defaults = [empty if d is None else ast.literal_eval(d) for d in args.kw_defaults]
    out += [(a.arg, "keyword", d) for a, d in zip(args.kwonlyargs, kw_defaults, strict=True)]
    return out, open_ended


_SIGNATURES = [sig for term in TERM.findall(API) for sig in SIGNATURE.findall(term)]


def test_the_page_gives_signatures() -> None:
    names = {n for n, _ in _SIGNATURES}
    assert {"tuner.optimize", "tuner.autotune", "tuner.kernel", "tuner.tune_kernel"} <= names, names


@pytest.mark.parametrize("dotted, params", _SIGNATURES, ids=[n for n, _ in _SIGNATURES])
def test_documented_signature_is_the_code_s(dotted: str, params: str) -> None:
    sig = inspect.signature(_resolve(dotted))
    code = {n: p for n, p in sig.parameters.items() if n not in ("self", "cls")}
    documented, open_ended = _documented(params)
    positional = [n for n, p in code.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, (name, kind, default) in enumerate(documented):
        assert name in code, f"{dotted}: docs/api.md names {name!r}; the code's parameters are {list(code)}"
        p = code[name]
        if kind == "positional":
            assert positional[i : i + 1] == [name], f"{dotted}: {name!r} is not positional number {i + 1}"
        else:
            assert p.kind is p.KEYWORD_ONLY, (
                f"{dotted}: {name!r} is documented keyword-only, the code's is {p}"
            )
        assert p.default == default, (
            f"{dotted}: {name!r} defaults to {p.default!r}, docs/api.md says {default!r}"
        )
    if not open_ended:
        assert [n for n, *_ in documented] == list(code), f"{dotted}: the code has {list(code)}"


def test_every_name_tuner_exports_is_on_the_page() -> None:
    missing = [n for n in tuner.__all__ if not re.search(rf"`tuner\.{re.escape(n)}\b", API)]
    assert not missing, f"exported by tuner but not in docs/api.md: {missing}"


def test_tune_kernel_takes_the_kernel_by_the_documented_name() -> None:
    """`tuner.tune_kernel(kernel, problem, *, backend, budget, ...)`: the keyword a user reads works (it was
    `spec_or_name`, and `kernel=` raised TypeError). The backend is refused before any worker starts."""
    with pytest.raises(ValueError, match="kernel 'matmul' has no 'cuda' backend"):
        tuner.tune_kernel(kernel="matmul", problem=None, backend="cuda", budget=1)
