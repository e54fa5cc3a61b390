"""The diagram as a few small immutable records.

The term syntax (docs/language.md has the full language):

    diagram   ::= stmt*
    stmt      ::= Dim(name, size?)                       dim t = 16
                | Const(name, value)                    const alpha = 8, scale = alpha / r
                | Tensor(kind, name, legs, dtype, init?)  input Z[t, e] / param W[e, d] ~ init / buffer
                | Assign(targets, value, instance?, repeat?)   h = expr [as inst | as net.0] [repeat N [shared]]
                                                        s[t, s, a] = expr (stated legs)
                | Output(names) | Return(values)
                | Block(name, formals, body)            block f(x[t, e]) { stmt* }
                | Include(path) | Label(name, text) | Comment(text, step?)
    expr      ::= Name(id) | Number(value) | String(value) | ListExpr(items)
                | BinOp(op, left, right) | Neg(operand)
                | Call(func, args, kwargs)              einsum('te,ed->td', Z, W), sigmoid(x), block calls
                | Shape(tensor, index)                  W.shape[1]

Every record carries its source `span`, excluded from equality, so the same diagram written
with different spacing compares equal; a Tensor also keeps one span per leg (`leg_spans`,
parallel to `legs`, also excluded), so errors about a leg point at the leg itself. The layout
that `penrose fmt` keeps is recorded the same way, outside equality: a statement's `note_span`
(where its trailing comment starts), a Dim's or Const's `grouped` (declared after a comma, as
the `r` of `dim f = 30, r = 1` or the `b` of `const a = 1, b = 2.5`) and a Call's `method`
(`h.detach()`, not `detach(h)`); blank lines are read from the spans' line numbers. Derived
views (bonds, free legs, graphs) are functions elsewhere, never stored state. Rewrites use
`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from penrose.errors import NOWHERE, Span


def _span() -> Any:
    return field(default=NOWHERE, compare=False, repr=False, kw_only=True)


def _note_span() -> Any:
    # where the statement's trailing comment ('# ...') starts; fmt aligns notes by it
    return field(default=NOWHERE, compare=False, repr=False, kw_only=True)


# ---- expressions -----------------------------------------------------------------------------


def _compared(node: Any) -> list[Any]:
    """The fields of a record that take part in equality (spans and layout do not)."""
    return [getattr(node, f.name) for f in fields(node) if f.compare]


class _Expr:
    """Equality and hashing of expression records without recursion: a sum of 10,000 terms
    or a call nested 1,000 deep compares like a small one (dataclass equality would recurse)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        stack: list[tuple[Any, Any]] = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if isinstance(a, _Expr) or isinstance(b, _Expr):
                if type(a) is not type(b):
                    return False
                stack.extend(zip(_compared(a), _compared(b)))
            elif isinstance(a, tuple) and isinstance(b, tuple):
                if len(a) != len(b):
                    return False
                stack.extend(zip(a, b))
            elif a != b:
                return False
        return True

    def __hash__(self) -> int:
        order: list[_Expr] = []
        stack: list[Any] = [self]
        while stack:  # every expression node below self, parents before children
            n = stack.pop()
            if isinstance(n, _Expr):
                order.append(n)
                stack.extend(_compared(n))
            elif isinstance(n, tuple):
                stack.extend(n)
        memo: dict[int, int] = {}

        def h(x: Any) -> int:
            if isinstance(x, _Expr):
                return memo[id(x)]
            if isinstance(x, tuple):
                return hash(tuple(h(y) for y in x))  # tuples inside a node are shallow (kwargs pairs)
            return hash(x)

        for n in reversed(order):
            memo[id(n)] = hash((type(n).__name__, tuple(h(x) for x in _compared(n))))
        return memo[id(self)]



@dataclass(frozen=True, eq=False)
class Name(_Expr):
    id: str
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class Number(_Expr):
    value: int | float
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class String(_Expr):
    value: str
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class ListExpr(_Expr):
    items: tuple[Any, ...]
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class BinOp(_Expr):
    op: str  # + - * / // ** < <= > >= == !=
    left: object
    right: object
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class Neg(_Expr):
    operand: object
    span: Span = _span()


@dataclass(frozen=True, eq=False)
class Call(_Expr):
    func: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()  # ((name, expr), ...)
    span: Span = _span()
    # written as a method, `h.detach()` rather than `detach(h)` (layout only)
    method: bool = field(default=False, compare=False, repr=False, kw_only=True)

    def kwarg(self, key: str) -> Any:
        for k, v in self.kwargs:
            if k == key:
                return v
        return None


@dataclass(frozen=True, eq=False)
class Shape(_Expr):
    tensor: str
    index: int
    span: Span = _span()


Expr = Name | Number | String | ListExpr | BinOp | Neg | Call | Shape


# ---- statements ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dim:
    name: str
    size: Expr | None = None
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()
    # declared after a comma, on the 'dim' line of the Dim before it (layout only)
    grouped: bool = field(default=False, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Const:
    """`const alpha = 8`: a named number, usable wherever a number is (its value any expression
    of numbers, dims and other consts); laid out like a Dim."""

    name: str
    value: Expr
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()
    # declared after a comma, on the 'const' line of the Const before it (layout only)
    grouped: bool = field(default=False, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Init:
    name: str = "normal"
    kwargs: tuple[tuple[str, Any], ...] = ()  # ((name, expr), ...)
    span: Span = _span()


@dataclass(frozen=True)
class Tensor:
    kind: str  # input | param | buffer | formal
    name: str
    legs: tuple[str, ...]
    dtype: str = "float"  # float | int | bool
    init: Init | None = None
    batched: bool = False  # written with a leading '...'
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()
    # where each leg is written, parallel to `legs` (a leading '...' has none); like `span`, not
    # part of equality. Empty for a Tensor built by hand: `leg_span` then falls back to `span`.
    leg_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)
    # False for a buffer written `unsaved`: the module makes it from its init and leaves it out
    # of its state dict (torch's register_buffer(..., persistent=False))
    saved: bool = field(default=True, kw_only=True)

    def leg_span(self, i: int) -> Span:
        """Where leg `i` is written, or the whole declaration when that is not known."""
        return self.leg_spans[i] if i < len(self.leg_spans) else self.span


@dataclass(frozen=True)
class Assign:
    targets: tuple[str, ...]
    value: Expr
    instance: str | None = None  # a name, or a dotted path of names and numbers (net.0)
    repeat: Expr | None = None
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()
    # `y = f(y) repeat N shared`: one instance applied N times (its parameters tied), not N copies
    shared: bool = field(default=False, kw_only=True)
    # `s[t, s, a] = ...`: the legs the statement states for its one target (None: not stated);
    # element-wise operands align by name against them. `leg_spans` says where each is written.
    legs: tuple[str, ...] | None = field(default=None, kw_only=True)
    leg_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Output:
    names: tuple[str, ...]
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()


@dataclass(frozen=True)
class Return:
    values: tuple[Any, ...]
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()


@dataclass(frozen=True)
class Block:
    name: str
    formals: tuple[Tensor, ...]
    body: tuple[Any, ...]
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()


@dataclass(frozen=True)
class Include:
    path: str
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()


@dataclass(frozen=True)
class Label:
    name: str
    text: str
    note: str = ""
    span: Span = _span()
    note_span: Span = _note_span()


@dataclass(frozen=True)
class Comment:
    text: str
    step: int | None = None  # '# 3) Causal mask.' is step 3
    span: Span = _span()


Stmt = Dim | Const | Tensor | Assign | Output | Return | Block | Include | Label | Comment


@dataclass(frozen=True)
class Diagram:
    body: tuple[Any, ...]
    file: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)

    @property
    def name(self) -> str:
        import os

        stem = os.path.splitext(os.path.basename(self.file))[0]
        return stem if stem and not stem.startswith("<") else "diagram"

    def _repr_svg_(self) -> str | None:
        """The figure, for notebooks (None when the diagram does not check)."""
        from penrose import display  # a hook the package binds to the renderer

        return display.svg(self)


# ---- derived views ---------------------------------------------------------------------------
# The structure of an expression tree. Views read off whole diagrams and checked bodies (the
# index legend, statements of a kind, uses and read counts) are in penrose/views.py.


def children(expr: object) -> tuple[Any, ...]:
    """The direct sub-expressions of `expr`, in source order."""
    if isinstance(expr, BinOp):
        return (expr.left, expr.right)
    if isinstance(expr, Neg):
        return (expr.operand,)
    if isinstance(expr, ListExpr):
        return tuple(expr.items)
    if isinstance(expr, Call):
        return tuple(expr.args) + tuple(v for _, v in expr.kwargs)
    return ()


def walk(expr: object) -> Iterator[Any]:
    """Every sub-expression of `expr`, parents first (iterative: any depth)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(children(e)))
