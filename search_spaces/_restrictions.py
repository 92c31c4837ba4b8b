"""Kernel Tuner's `restrictions` as constraints: strings such as "block_size_x*block_size_y<=1024" are
parsed with `ast` and evaluated by a small interpreter over a whitelist of expression nodes (arithmetic,
comparisons, `and`/`or`/`not`, `x if c else y`, literals, tuples and lists, and the functions `min`, `max`,
`abs`, `int`, `float`, `round`, `len`, `pow`, `sum` over a list or tuple written out, and `range` as the right
side of `in`/`not in`); they are never passed to `eval`. Kernel Tuner compiles them into Python functions,
so each of these means what it means in Python; what could take unbounded time is refused or rejects the
config instead (a power over the limit, a range is never built: its membership is arithmetic); a range bound
that is never an int (`range(0.5, 8)`) is refused up front, as Python's range would fail every config."""

from __future__ import annotations

import ast
import inspect
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuner._parse import parse

from ._space import Constraint

__all__ = ["RestrictionError", "block_size_restriction", "restriction_constraint", "restriction_constraints"]

_MAX_LEN = 1000  # characters in one restriction string
_MAX_EXPONENT = 256  # 2**256 is plenty for a kernel parameter; 10**10**10 would hang the process
_MAX_MODULAR_BITS = 4096  # pow(a, b, m): b and m of at most this many bits (huge ones take seconds)
# levels of nesting in one restriction (as Python's parser allows 200 levels of parentheses): the checker
# and the evaluator recurse once per level, and "-" * 999 + "x" exceeded Python's recursion limit
_MAX_DEPTH = 200

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.eq,  # `x is None` and the like compare values here
    ast.IsNot: operator.ne,
}


def _power(a: Any, b: Any, text: str) -> Any:
    """`a ** b` for numbers, refusing a result too large to compute at once (10**10**10 would hang)."""
    a, b = _number(a, text), _number(b, text)
    if abs(b) > _MAX_EXPONENT or (isinstance(a, int) and a.bit_length() * abs(b) > 1 << 16):
        raise ArithmeticError(f"{a!r} ** {b!r} is too large in {text!r}")
    return operator.pow(a, b)


class _Range:
    """`range(start, stop, step)` on the right of `in`/`not in`: membership computed from the bounds, as
    Python's range does for an int, without building the range (`x in range(10**60)` is immediate). A
    float is a member where it equals one (16.0 in range(16, 17)), anything else is not."""

    def __init__(self, *args: Any) -> None:
        if not 1 <= len(args) <= 3:
            raise TypeError(f"range expected 1 to 3 arguments, got {len(args)}")
        ints = [operator.index(a) for a in args]  # TypeError for a float or a str, as range's own
        start, stop, step = (0, ints[0], 1) if len(ints) == 1 else (ints[0], ints[1], 1)
        if len(ints) == 3:
            step = ints[2]
        if step == 0:
            raise ValueError("range() arg 3 must not be zero")
        self.start, self.stop, self.step = start, stop, step

    def __contains__(self, v: Any) -> bool:
        if isinstance(v, float):
            if not v.is_integer():  # also NaN and inf
                return False
            v = int(v)
        elif not isinstance(v, int):  # bool is an int, as in Python
            return False
        if self.step > 0:
            return self.start <= v < self.stop and (v - self.start) % self.step == 0
        return self.stop < v <= self.start and (self.start - v) % -self.step == 0


def _round(x: Any, ndigits: Any = None) -> Any:
    """`round`, but refusing an int rounded to more than _MAX_EXPONENT digits left of the point:
    round(1, -10**9) computes 10**(10**9) and would hang the process as 10**10**10 would."""
    if isinstance(ndigits, int) and ndigits < -_MAX_EXPONENT:
        raise ArithmeticError(f"round to {ndigits} digits is over the limit of -{_MAX_EXPONENT}")
    return round(x) if ndigits is None else round(x, ndigits)


_FUNCS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "round": _round,
    "len": len,
    "pow": pow,  # evaluated by _Expr._call: bounded
    "sum": sum,  # over a list or tuple written out (_Expr._check)
    "range": _Range,  # only as the right side of `in` / `not in` (_Expr._check)
}


class RestrictionError(ValueError):
    """A restriction that cannot be used; the message names it and says why."""


def _number(v: Any, text: str) -> Any:
    if isinstance(v, (int, float)):  # bool is an int, as in Python
        return v
    raise ArithmeticError(f"arithmetic on {v!r} (not a number) in {text!r}")


class _Expr:
    """One parsed restriction string: the names it reads and an evaluator over a config."""

    def __init__(self, text: str, names: Sequence[str]) -> None:
        if not isinstance(text, str) or not text.strip():
            raise RestrictionError(f"restriction {text!r} is empty")
        if len(text) > _MAX_LEN:
            raise RestrictionError(f"restriction of {len(text)} characters is over the limit of {_MAX_LEN}")
        self.text = text
        try:
            self.tree = parse(text.strip(), mode="eval").body
        except SyntaxError as exc:
            raise RestrictionError(f"restriction {text!r} is not a Python expression ({exc.msg})") from None
        self.uses: list[str] = []
        depth = _depth(self.tree)
        if depth > _MAX_DEPTH:
            raise RestrictionError(
                f"restriction {_brief(text)} nests {depth} levels deep, over the limit of {_MAX_DEPTH}"
            )
        self._check(self.tree, set(names))

    def _check(self, node: ast.AST, names: set[str]) -> None:
        if isinstance(node, ast.Name):
            if node.id in names:
                if node.id not in self.uses:
                    self.uses.append(node.id)
            elif node.id in _FUNCS:  # a function's name not called (`x < min`) has no value here
                raise RestrictionError(
                    f"restriction {self.text!r} names the function {node.id} without calling it"
                )
            elif node.id not in ("True", "False", "None"):
                raise RestrictionError(
                    f"restriction {self.text!r} uses {node.id!r}, which is not a tunable parameter"
                )
            return
        if isinstance(node, ast.Call):
            self._check_call(node, names, in_membership=False)
            return
        if isinstance(node, ast.Compare):
            self._check(node.left, names)
            for i, (op, right) in enumerate(zip(node.ops, node.comparators, strict=True)):
                # range(...) only as what `in` / `not in` looks in, and not compared on (`x in range(3) == y`)
                membership = isinstance(op, (ast.In, ast.NotIn)) and i == len(node.ops) - 1
                if isinstance(right, ast.Call):
                    self._check_call(right, names, in_membership=membership)
                else:
                    self._check(right, names)
            return
        allowed = (
            ast.Constant,
            ast.BoolOp,
            ast.BinOp,
            ast.UnaryOp,
            ast.Compare,
            ast.IfExp,
            ast.Tuple,
            ast.List,
            ast.Set,
            ast.Load,
            ast.And,
            ast.Or,
            *_BINOPS,
            *_UNARY,
            *_COMPARE,
        )
        if not isinstance(node, allowed):
            raise RestrictionError(
                f"restriction {self.text!r}: {type(node).__name__} is not allowed (arithmetic, comparisons, "
                f"and/or/not, if-else and literals are)"
            )
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
            raise RestrictionError(f"restriction {self.text!r}: constant {node.value!r} is not allowed")
        for child in ast.iter_child_nodes(node):
            self._check(child, names)

    def _check_call(self, node: ast.Call, names: set[str], *, in_membership: bool) -> None:
        func = node.func.id if isinstance(node.func, ast.Name) else None
        if func not in _FUNCS or node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise RestrictionError(
                f"restriction {self.text!r}: only calls of {', '.join(_FUNCS)} with plain arguments are allowed"
            )
        if func == "range" and not in_membership:
            raise RestrictionError(
                f"restriction {self.text!r}: range(...) is allowed only after `in` or `not in` "
                f"(`x in range(16, 65, 32)`)"
            )
        if func == "range":
            floats = [ast.unparse(a) for a in node.args if _never_int(a)]
            if floats:
                raise RestrictionError(
                    f"restriction {self.text!r}: range takes ints, as in Python, not {', '.join(floats)} "
                    f"(`x in range(16, 65, 32)`)"
                )
        if func == "sum" and (
            not 1 <= len(node.args) <= 2 or not isinstance(node.args[0], (ast.List, ast.Tuple))
        ):
            raise RestrictionError(
                f"restriction {self.text!r}: sum takes a list or tuple written out (`sum([x, y])`), and a start"
            )
        for a in node.args:
            self._check(a, names)

    def __call__(self, config: Mapping[str, Any]) -> Any:
        return self._eval(self.tree, config)

    def _eval(self, node: ast.AST, c: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in c:
                return c[node.id]
            return {"True": True, "False": False, "None": None}[node.id]
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                out: Any = True
                for v in node.values:
                    out = self._eval(v, c)
                    if not out:
                        return out
                return out
            out = False
            for v in node.values:
                out = self._eval(v, c)
                if out:
                    return out
            return out
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, c)
            return _UNARY[type(node.op)](v if isinstance(node.op, ast.Not) else _number(v, self.text))
        if isinstance(node, ast.BinOp):
            a = _number(self._eval(node.left, c), self.text)
            b = _number(self._eval(node.right, c), self.text)
            if isinstance(node.op, ast.Pow):
                return _power(a, b, self.text)
            if isinstance(node.op, ast.LShift) and b > _MAX_EXPONENT:
                raise ArithmeticError(f"shift {b} over {_MAX_EXPONENT} in {self.text!r}")
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, c)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = self._eval(right_node, c)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, c) else node.orelse, c)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return tuple(self._eval(e, c) for e in node.elts)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            args = [self._eval(a, c) for a in node.args]
            if node.func.id == "pow":
                if len(args) == 3:  # modular: Python's own pow (ints only), quick for bounded sizes
                    a, b, m = (_number(v, self.text) for v in args)
                    if any(isinstance(v, int) and v.bit_length() > _MAX_MODULAR_BITS for v in (b, m)):
                        raise ArithmeticError(f"pow({a!r}, {b!r}, {m!r}) is too large in {self.text!r}")
                    return pow(a, b, m)
                if len(args) != 2:
                    raise TypeError(f"pow expected 2 or 3 arguments, got {len(args)}")
                return _power(args[0], args[1], self.text)
            if node.func.id == "sum":
                return sum(
                    (_number(v, self.text) for v in args[0]),
                    _number(args[1], self.text) if len(args) > 1 else 0,
                )
            return _FUNCS[node.func.id](*args)
        raise RestrictionError(f"restriction {self.text!r}: cannot evaluate {type(node).__name__}")


def _never_int(node: ast.AST) -> bool:
    """Whether an argument is never an int, whatever the config: a float, str or None written out
    (`0.5`, `-1.5`), a true division (`x / 2`) or `float(...)`. range(...) raises TypeError for it, for
    every config; a parameter's value is known only per config."""
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, int)  # bool is an int, as range(True) takes it
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ast.Div)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"


def _depth(tree: ast.AST) -> int:
    """The nesting depth of `tree` (its longest path of expression nodes), found without recursion."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    return deepest


def _brief(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:75]) + " ..."


def _from_string(text: str, names: Sequence[str]) -> Constraint:
    expr = _Expr(text, names)

    def check(config: Mapping[str, Any]) -> bool | str:
        try:
            ok = expr(config)
        except (ArithmeticError, TypeError, ValueError) as exc:  # e.g. x % 0: the config cannot run
            return f"{type(exc).__name__}: {exc}"
        if isinstance(ok, float) and math.isnan(ok):
            return False
        return bool(ok)

    return Constraint(text.strip(), check, uses=tuple(expr.uses))


def _takes_values(fn: Callable[..., Any], names: Sequence[str]) -> bool:
    """Whether `fn` is a restriction Kernel Tuner calls with the values of all parameters `names` in order
    (`def r(block_size_x, block_size_y, tile)`), not with the config dict (`def r(p)`): it takes that many
    positional arguments (or only `*args`) and requires two or more of them, or its positional
    parameters are named as the first parameters (`def r(block_size_x, tile=1)`: one required argument,
    as `def r(p, strict=False)` has, told apart by its name)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the config dict, as before
        return False
    n = len(names)
    kinds = inspect.Parameter
    positional = [
        p for p in sig.parameters.values() if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is kinds.empty]
    star = any(p.kind is kinds.VAR_POSITIONAL for p in sig.parameters.values())
    if not required:
        return star and not positional
    if len(required) > n or (n > len(positional) and not star):
        return False  # it cannot be called with the n values
    if len(required) >= 2:
        return True
    first = [p.name for p in positional[:n]]
    return first == list(names[: len(first)])


def _takes_keywords(fn: Callable[..., Any], params: Sequence[str], index: int) -> bool:
    """Whether `fn` is a restriction Kernel Tuner calls with the parameters as keyword arguments
    (`fn(**config)`, as its `check_restriction` does): it has keyword-only parameters or `**kwargs`, and
    binds every one of `params` by name (`def r(*, block_size_x, block_size_y)`, `lambda **p: ...`). One
    that has required keyword-only parameters or takes only `**kwargs`, and cannot be called so, is
    refused naming why (Kernel Tuner raises TypeError for it, config after config)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    kinds = inspect.Parameter
    ps = list(sig.parameters.values())
    if not any(p.kind in (kinds.KEYWORD_ONLY, kinds.VAR_KEYWORD) for p in ps):
        return False
    try:
        sig.bind(**dict.fromkeys(params))
    except TypeError as exc:
        required_kw = any(p.kind is kinds.KEYWORD_ONLY and p.default is kinds.empty for p in ps)
        only_kwargs = all(p.kind in (kinds.KEYWORD_ONLY, kinds.VAR_KEYWORD) for p in ps)
        if required_kw or only_kwargs:
            label = getattr(fn, "__name__", "") or "restriction"
            raise RestrictionError(
                f"restriction {index} ({label}) takes keyword arguments, but cannot be called with the "
                f"parameters {list(params)} as keywords, as Kernel Tuner calls it: {exc}"
            ) from None
        return False
    return True


def restriction_constraint(restriction: Any, names: Sequence[str], index: int = 0) -> Constraint:
    """One Kernel Tuner restriction as a Constraint: a string expression over the parameter names, a
    callable taking the config dict (one argument) or, as Kernel Tuner calls it, the values of all
    parameters in order (`_takes_values`) or all parameters by name (`_takes_keywords`), or a
    `(callable, [names])` pair whose callable takes those parameters' values in order or by name."""
    if isinstance(restriction, str):
        return _from_string(restriction, names)
    if isinstance(restriction, tuple) and len(restriction) == 2 and callable(restriction[0]):
        fn, params = restriction
        if not isinstance(params, (list, tuple)) or not all(isinstance(p, str) for p in params):
            raise RestrictionError(f"restriction {index}: the second item must be a list of parameter names")
        unknown = [p for p in params if p not in names]
        if unknown:
            raise RestrictionError(f"restriction {index} names {unknown}, which are not tunable parameters")
        label = getattr(fn, "__name__", "") or "restriction"
        label = f"restriction {index}" if label == "<lambda>" else label
        if _takes_keywords(fn, params, index):
            return Constraint(
                f"{label}({', '.join(params)})",
                lambda c: bool(fn(**{p: c[p] for p in params})),
                uses=tuple(params),
            )
        return Constraint(
            f"{label}({', '.join(params)})", lambda c: bool(fn(*(c[p] for p in params))), uses=tuple(params)
        )
    if callable(restriction):
        label = getattr(restriction, "__name__", "") or "restriction"
        if label == "<lambda>":
            label = f"restriction {index}"
        if _takes_values(restriction, names):
            params = list(names)
            return Constraint(
                f"{label}({', '.join(params)})",
                lambda c: bool(restriction(*(c[p] for p in params))),
                uses=tuple(params),
            )
        if _takes_keywords(restriction, names, index):
            params = list(names)
            return Constraint(
                f"{label}({', '.join(params)})",
                lambda c: bool(restriction(**{p: c[p] for p in params})),
                uses=tuple(params),
            )
        return Constraint(label, lambda c: bool(restriction(dict(c))))
    raise RestrictionError(
        f"restriction {index} is a {type(restriction).__name__}; give a string, a function of the config "
        f"dict, or a (function, [parameter names]) pair"
    )


def restriction_constraints(restrictions: Any, names: Sequence[str]) -> list[Constraint]:
    """Kernel Tuner's `restrictions` argument (None, one restriction or a list) as Constraints."""
    if restrictions is None:
        return []
    # a (function, [names]) pair; a tuple (function, "x > 1") is two restrictions, as Kernel Tuner takes it
    pair = (
        isinstance(restrictions, tuple)
        and len(restrictions) == 2
        and callable(restrictions[0])
        and isinstance(restrictions[1], (list, tuple))
    )
    if isinstance(restrictions, str) or pair or callable(restrictions):
        restrictions = [restrictions]
    if isinstance(restrictions, tuple):
        restrictions = list(restrictions)
    if not isinstance(restrictions, list):
        raise RestrictionError(f"restrictions must be a list, got {type(restrictions).__name__}")
    return [restriction_constraint(r, names, i) for i, r in enumerate(restrictions)]


# Kernel Tuner's default names of the thread block dimensions (its util.default_block_size_names)
_BLOCK_SIZE_NAMES = ("block_size_x", "block_size_y", "block_size_z")


def block_size_restriction(
    max_threads: Any, block_size_names: Sequence[str] | None, names: Sequence[str]
) -> Constraint | None:
    """The limit Kernel Tuner adds to every space: the product of the block dimensions present is at
    most `max_threads` (None: no limit). `block_size_names` are completed to three with Kernel Tuner's
    defaults, as its `append_default_block_size_names` does."""
    if block_size_names is not None and (
        isinstance(block_size_names, str) or not all(isinstance(n, str) for n in block_size_names)
    ):
        raise RestrictionError(
            f"block_size_names must be a list of parameter names, got {block_size_names!r}"
        )
    if block_size_names is not None and len(block_size_names) > len(_BLOCK_SIZE_NAMES):
        # a thread block has three dimensions; Kernel Tuner refuses more names the same way
        raise RestrictionError(
            f"block_size_names names the x, y and z dimensions of the thread block: at most 3 names, got "
            f"{list(block_size_names)}"
        )
    if max_threads is None:
        if block_size_names is not None:
            raise RestrictionError("block_size_names limits nothing without max_threads")
        return None
    if isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1:
        raise RestrictionError(f"max_threads must be a positive int, got {max_threads!r}")
    given = list(block_size_names or [])
    dims = given + list(_BLOCK_SIZE_NAMES[len(given) :])
    present = [n for n in dims if n in names]
    if not present:
        return None
    return _from_string(f"{' * '.join(present)} <= {max_threads}", names)
