"""Python expression trees for generated source, printed with Python's own precedence.

The compiler builds every expression it emits as an `ast` tree and prints it with
`ast.unparse`, which parenthesises a child exactly when its precedence is lower than its
context requires (CPython's own levels). No emitted text depends on what stands next to it.
Two traps of `ast.unparse` are avoided here: a negative number is built as unary minus of a
non-negative constant (`ast.Constant(-2) ** 2` would print as `-2 ** 2`), and infinities are
`torch.inf` rather than `1e309`.

Deep trees are flattened by `Hoister`: a sub-expression nested deeper than `MAX_DEPTH` becomes
a temporary (`_1 = ...`) emitted before the statement, so a 10,000-term sum or 1,000 nested
calls produce code that Python's parser and compiler accept.

>>> unparse(binop("**", call(path("torch.tanh"), name("x")), const(2)))
'torch.tanh(x) ** 2'
>>> unparse(binop("**", const(-2), const(2)))
'(-2) ** 2'
"""

from __future__ import annotations

import ast
import math
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

BINOPS = {
    "+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "//": ast.FloorDiv, "**": ast.Pow,
    "@": ast.MatMult, "%": ast.Mod,
}
CMPOPS = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE, "==": ast.Eq, "!=": ast.NotEq}

MAX_DEPTH = 48  # well inside CPython's limits (200 nested brackets, its compiler's recursion)


def _ident(text: str) -> str:
    if not _IDENT.match(text):  # generated source is built from validated identifiers only
        raise ValueError(f"not an identifier: {text!r}")
    return text


def name(id: str) -> ast.expr:
    return ast.Name(_ident(id), ast.Load())


def path(dotted: str) -> ast.expr:
    """A dotted name (`torch.nn.functional.linear`) as nested attributes."""
    parts = dotted.split(".")
    node = name(parts[0])
    for p in parts[1:]:
        node = ast.Attribute(node, _ident(p), ast.Load())
    return node


def attr(obj: ast.expr, field: str) -> ast.expr:
    return ast.Attribute(obj, _ident(field), ast.Load())


def const(value) -> ast.expr:
    """A number (negative ones as unary minus, infinities as torch.inf), a string, None or a bool."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return ast.Constant(value)
    if isinstance(value, float) and math.isnan(value):
        return path("torch.nan")
    if isinstance(value, (int, float)):
        if value < 0 or (isinstance(value, float) and math.copysign(1.0, value) < 0 and value == 0):
            return ast.UnaryOp(ast.USub(), const(-value))
        if value == math.inf:
            return path("torch.inf")
        return ast.Constant(value)
    if isinstance(value, tuple):
        return ast.Tuple([const(v) for v in value], ast.Load())
    if isinstance(value, list):
        return ast.List([const(v) for v in value], ast.Load())
    raise TypeError(f"no constant for {value!r}")  # pragma: no cover - internal


def call(func: ast.expr, *args, **kwargs) -> ast.expr:
    return ast.Call(func, [_node(a) for a in args], [ast.keyword(_ident(k), _node(v)) for k, v in kwargs.items()])


def method(obj: ast.expr, meth: str, *args, **kwargs) -> ast.expr:
    return call(attr(obj, meth), *args, **kwargs)


def binop(op: str, a: ast.expr, b: ast.expr) -> ast.expr:
    return ast.BinOp(_node(a), BINOPS[op](), _node(b))


def compare(op: str, a: ast.expr, b: ast.expr) -> ast.expr:
    return ast.Compare(_node(a), [CMPOPS[op]()], [_node(b)])


def neg(a: ast.expr) -> ast.expr:
    return ast.UnaryOp(ast.USub(), _node(a))


def subscript(obj: ast.expr, index) -> ast.expr:
    return ast.Subscript(obj, _node(index), ast.Load())


def slice_(lo=None, hi=None) -> ast.expr:
    return ast.Slice(None if lo is None else const(lo), None if hi is None else const(hi))


def index_tuple(items) -> ast.expr:
    """x[..., None, :] style indices: items are ast nodes, Ellipsis, None or ':'."""
    out: list[ast.expr] = []
    for it in items:
        if it is Ellipsis:
            out.append(ast.Constant(...))
        elif it is None:
            out.append(ast.Constant(None))
        elif it == ":":
            out.append(ast.Slice())
        else:
            out.append(_node(it))
    return ast.Tuple(out, ast.Load())


def tuple_(items) -> ast.expr:
    return ast.Tuple([_node(i) for i in items], ast.Load())


def list_(items) -> ast.expr:
    return ast.List([_node(i) for i in items], ast.Load())


def _node(x):
    if isinstance(x, ast.AST):
        return x
    return const(x)


def unparse(node: ast.AST) -> str:
    return ast.unparse(ast.fix_missing_locations(node))


def is_simple(node: ast.AST) -> bool:
    """A name, a constant or an attribute path: cheap and safe to repeat."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, (ast.Name, ast.Constant))


class Hoister:
    """Turns sub-expressions deeper than MAX_DEPTH into temporaries `_1, _2, ...`."""

    def __init__(self, prefix: str = "_"):
        self.prefix = prefix
        self.count = 0

    def flatten(self, node: ast.expr) -> tuple[list[tuple[str, ast.expr]], ast.expr]:
        """(temporaries to assign first, in order; the expression that uses them)."""
        temps: list[tuple[str, ast.expr]] = []
        self._depth(node, temps)
        return temps, node

    def _depth(self, node: ast.AST, temps) -> int:
        # iterative post-order: a node's depth from its children's; a child too deep is hoisted
        stack = [(node, False)]
        depth: dict[int, int] = {}
        while stack:
            n, done = stack.pop()
            kids = list(ast.iter_child_nodes(n))
            if not done:
                stack.append((n, True))
                stack.extend((c, False) for c in kids)
                continue
            d = 0
            for c in kids:
                cd = depth.get(id(c), 0)
                if cd >= MAX_DEPTH and isinstance(c, ast.expr) and not isinstance(c, ast.Slice):
                    self.count += 1
                    tmp = f"{self.prefix}{self.count}"
                    temps.append((tmp, c))
                    self._replace(n, c, ast.Name(tmp, ast.Load()))
                    cd = 1
                d = max(d, cd)
            depth[id(n)] = d + 1
        return depth[id(node)]

    @staticmethod
    def _replace(parent: ast.AST, old: ast.AST, new: ast.expr):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, c in enumerate(value):
                    if c is old:
                        value[i] = new
                        return
                    if isinstance(c, ast.keyword) and c.value is old:
                        c.value = new
                        return
        raise AssertionError("child not found")  # pragma: no cover - internal invariant
