"""What the checker's parts share: a body's scope (`_Scope`) and small helpers over the IR.

Torch-free; see penrose/checker.py for the rules and the parts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from penrose import ir
from penrose.checked import Checked, CStmt, Decl, Instance, TType, V
from penrose.errors import Span
from penrose.sizes import Sizes

if TYPE_CHECKING:
    from penrose.reading import Includes


class _State:
    """The checker's state, which every part reads (set by `penrose.checker._Checker.__init__`)."""

    diagram: ir.Diagram
    includes: Includes  # the included files, read before checking
    file: str
    overrides: dict  # sizes given to check, by name
    S: Sizes  # the size classes of every leg met
    dims: dict[str, int]  # dim name -> its size class
    dim_decl: dict[str, ir.Dim]
    block_defs: dict[str, tuple[ir.Block, ir.Diagram]]
    blocks: dict[str, Checked]  # checked blocks, callees first
    warnings: list
    including: list[str]  # the include chain, real paths
    at: Span  # the statement being checked, for an error without a better place
    dim_named_refs: dict[int, V]  # id(V) -> V: reads of a computed tensor named like a dim
    constants: dict[str, tuple]  # const name -> (value, declaration span)
    relabels: list  # einsum output letters that rename the leg they take (check_ops._Relabel)
    _static_scope: _Scope  # no tensors: where a const's value is read

    if TYPE_CHECKING:  # what one part calls in another (declared for mypy; defined in the part named)
        def _name_ok(self, name: str, span: Span, what: str, module_attr=True): ...  # penrose.checker
        def _static(self, node, what: str, integer: bool = False): ...  # penrose.checker
        def _unambiguous(self, sc: _Scope, v: V) -> V: ...  # penrose.checker
        def _lookup(self, sc: _Scope, name: str, span: Span) -> TType: ...  # penrose.checker
        def _expr(self, sc: _Scope, e) -> V: ...  # penrose.check_exprs
        def _numeric(self, v: V, span: Span, what: str): ...  # penrose.check_exprs
        def _leg_arg(self, v: V, arg, call: ir.Call, what="leg") -> int: ...  # penrose.check_exprs
        def _tensor_arg(self, sc, e: ir.Call, i: int, allow=("float",), v: V | None = None) -> V: ...  # penrose.check_exprs
        def _number_kw(self, e: ir.Call, key, default=None, node=None): ...  # penrose.check_exprs
        def _baked(self, *classes): ...  # penrose.check_ops
        def _letter_cause(self, ex, v: V, legs, cls, span, what: str) -> None: ...  # penrose.check_ops
        def _blame_letter(self, err): ...  # penrose.check_ops


class _Scope:
    def __init__(self, checker, name, is_block) -> None:
        self.c = checker
        self.name = name
        self.is_block = is_block
        self.decls: dict[str, Decl] = {}
        self.vars: dict[str, TType] = {}
        self.defined_at: dict[str, Span] = {}
        self.used: set[str] = set()
        self.stmts: list[CStmt] = []
        self.outputs: list = []
        self.instances: dict[str, Instance] = {}
        self.labels: dict[str, str] = {}
        self.label_at: dict[str, Span] = {}
        self.output_at: Span | None = None
        self.captions: dict[int, str] = {}
        self.block_calls: list = []
        self.versions: dict[str, int] = {}  # SSA: Z = Z + h makes version 1 of Z



def _product_of(expr) -> tuple | None:
    """The names of a dim size written as a product of dims (`h * d` -> ('h', 'd')), else None."""
    if isinstance(expr, ir.Name):
        return (expr.id,)
    if isinstance(expr, ir.BinOp) and expr.op == "*":
        a, b = _product_of(expr.left), _product_of(expr.right)
        return None if a is None or b is None else a + b
    return None


def _name_nodes(node) -> list:
    """The names an expression reads, in source order (`alpha / r`: alpha, then r); calls'
    function names excluded. Iterative: a long sum needs no stack."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ir.Name):
            out.append(n)
        elif isinstance(n, ir.BinOp):
            stack += [n.right, n.left]
        elif isinstance(n, ir.Neg):
            stack.append(n.operand)
        elif isinstance(n, ir.Call):
            stack += [v for _, v in reversed(n.kwargs)] + list(reversed(n.args))
    return out


def _names(node) -> list:
    """The identifiers of `_name_nodes`."""
    return [n.id for n in _name_nodes(node)]


def _is_inf(node) -> bool:
    """inf or -inf, as written."""
    node = node.operand if isinstance(node, ir.Neg) else node
    return isinstance(node, ir.Name) and node.id == "inf"



def _a(word: str) -> str:
    """'an int', 'a float'."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _prod(sizes: list[int | None]) -> int:
    """The product of sizes the caller has seen are all known."""
    known = [n for n in sizes if n is not None]
    assert len(known) == len(sizes), "a size is not known"
    return math.prod(known)


def _describe(expr) -> str:
    if isinstance(expr, ir.Name):
        return repr(expr.id)
    if isinstance(expr, ir.Call):
        return f"{expr.func}(...)"
    return "the expression"
