"""IR → checked diagram: every invariant, with positions.

`check(diagram, sizes)` walks the statements once and returns a `Checked` diagram whose values
carry their legs, size classes, dtype and batching. It raises `PenroseCheckError` (a
`PenroseError`) at the first broken rule:

- names: every identifier is valid Python, not a keyword, not reserved by the generated module,
  declared once (dims, tensors, blocks, instances); every name used is defined (with a
  near-miss suggestion); no input, param, buffer or block argument is named like a dim, and a
  computed tensor named like one is read only where a tensor is expected (never as `x * d`);
  outputs exist, in one `output` statement; a tensor has at most one label; a block returns
  something; no block calls itself, directly or through others; includes resolve and do not
  cycle.
- legs: every leg of a declared tensor is a declared dim; an einsum term has as many legs as its
  operand; an output leg appears in some input; a leg argument (softmax over `p`) exists on its
  tensor; element-wise operands align by name or by position (docs/language.md).
- sizes: legs bound together (an einsum letter, aligned legs, a block argument) have one size;
  a conflict names both sizes and both places. Sizes come from dim defaults, from `sizes`
  overrides, and, for legs only inputs carry, from the inputs at run time. Every param and
  buffer fits in `LIMITS.tensor_bytes` (as float32), all of them together (blocks and repeats
  counted) in `LIMITS.total_bytes`; a `repeat` count is 1 to `LIMITS.repeat`.
- dtypes: integer ids only where ids are expected (gather), bool masks only in where().
- values: init arguments are finite, std and gain at least 0, uniform's a at most b; keyword
  values follow the table of operations (eps > 0, 0 <= p < 1, ...), each given once; every
  plain-number expression is evaluated at the declared sizes and must be a real number torch
  accepts: no sqrt or log of a number <= 0 (sqrt of 0 is fine), no negative number to a
  fractional power, no division by zero, nothing beyond float32's range or 64 bits.
- usage: inputs and params never used give warnings, not errors.

The checker's parts, one job a module: `penrose.tables` (reserved names, inits, dtypes, number
ranges, LIMITS), `penrose.sizes` (the size classes it unifies), `penrose.checked` (the records
it returns, with their invariants), `penrose.blocks` (the block call graph: no recursion, callees
first), `penrose.einsum_spec` (einsum specs), `penrose.reading` (where includes may reach). This
module re-exports the names others import from it.

Imports neither torch nor any renderer.
"""

from __future__ import annotations

import keyword
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from penrose import ir, ops
from penrose.blocks import order as block_order
from penrose.checked import SCALAR, Checked, CStmt, Decl, Instance, TType, V
from penrose.einsum_spec import is_ellipsis_label, label_text, spec_span
from penrose.einsum_spec import parse as parse_einsum
from penrose.einops_pattern import REDUCTIONS
from penrose.einops_pattern import parse as parse_pattern
from penrose.errors import PenroseCheckError, Span, suggest
from penrose.fmt import format_expr
from penrose.ops import OPS
from penrose.sizes import Sizes
from penrose.stack import deep, too_deep
from penrose.views import legend_warnings
from penrose.tables import (
    DTYPES,
    FLOAT32_MAX,
    FUNCTIONS,
    GENERATED,
    IDENT,
    INITS,
    INT64_MAX,
    LIMITS,
    MODULE_ATTRS,
    PEN_KEYWORDS,
    Limits,
    quoted,
    unquote,
)

if TYPE_CHECKING:
    from penrose.reading import Includes

# the names other modules and tests import from here: the checked IR, the tables, the checker
__all__ = [
    "CStmt", "Checked", "DTYPES", "Decl", "FLOAT32_MAX", "FUNCTIONS", "GENERATED", "IDENT", "INITS", "INT64_MAX",
    "Instance", "LIMITS", "Limits", "MODULE_ATTRS", "PEN_KEYWORDS", "SCALAR", "Sizes", "TType", "V", "check",
]


# ---- the checker -----------------------------------------------------------------------------


@deep
def check(diagram: ir.Diagram, /, sizes: Mapping[str, Any] | None = None, *, includes: Includes | None = None,
          **more_sizes: Any) -> Checked:
    """Check a parsed diagram; `sizes` (a mapping, or keywords) override dim defaults.

    Checking reads no file: `includes` (`penrose.reading.Includes`) holds the files the diagram
    includes, read by the loader (`penrose.loader.load`); without it they are read from disk here,
    before checking, with no extra include folders.

    Deep programs (a 10,000-term sum, 1,000 nested calls) check; past even that room the
    error is a positioned `PenroseCheckError`, never a RecursionError.

    >>> from penrose.parser import parse
    >>> c = check(parse("dim e = 3\\ninput x[e]\\ny = x * 2\\noutput y"))
    >>> c.outputs[0][1].legs
    ('e',)
    """
    return check_together([diagram], sizes, includes=None if includes is None else [includes], **more_sizes)[0]


def check_together(diagrams, /, sizes=None, *, includes=None, **more_sizes) -> list[Checked]:
    """Check diagrams that share one set of sizes (the entries of one module): each takes the
    sizes it declares; a size that none of them declares is refused, as `check` refuses it.

    >>> from penrose.parser import parse
    >>> a, b = check_together([parse("dim e = 3\\ninput x[e]\\noutput x"),
    ...                        parse("dim e = 3, k = 2\\ninput x[e, k]\\noutput x")], e=4, k=5)
    >>> a.sizes.size(a.dims["e"]), b.sizes.size(b.dims["k"])
    (4, 5)
    """
    from penrose.reading import merge_sizes, walk_includes

    sizes = merge_sizes(sizes, more_sizes)
    if includes is None:
        includes = [walk_includes(d) for d in diagrams]
    checkers = [_Checker(d, sizes, inc) for d, inc in zip(diagrams, includes, strict=True)]
    for c in checkers:  # one diagram alone refuses an unknown size first, as check does
        c.lenient = len(checkers) > 1
    results = [_run(c) for c in checkers]
    missing = [k for k in sizes if not any(k in c.dims or k in c.constants for c in checkers)]
    if missing:  # refused as the first diagram refuses it, with its dims and a suggestion
        checkers[0].overrides = {missing[0]: sizes[missing[0]]}
        checkers[0].refuse_unknown()
    return results


def _run(checker) -> Checked:
    try:
        return checker.run()
    except RecursionError:
        raise too_deep(checker.at, "statement", PenroseCheckError) from None


class _WithLimits(Protocol):
    """`check` carries the module constant LIMITS (penrose.tables) as an attribute: `penrose.check`
    is this function, so penrose.checker.LIMITS.repeat = 20_000 works."""

    LIMITS: Limits


cast(_WithLimits, check).LIMITS = LIMITS


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


class _Checker:
    def __init__(self, diagram: ir.Diagram, sizes: dict, includes):
        self.diagram = diagram
        self.includes = includes  # penrose.loader.Includes: the included files, read before checking
        self.file = diagram.file
        self.overrides = dict(sizes)
        self.S = Sizes()
        self.dims: dict[str, int] = {}
        self.dim_decl: dict[str, ir.Dim] = {}
        self.block_defs: dict[str, tuple[ir.Block, ir.Diagram]] = {}
        self.blocks: dict[str, Checked] = {}
        self.warnings: list = []
        self.including: list[str] = []
        self.at = Span(self.file)  # the statement being checked, for an error without a better place
        self.consts: dict[int, tuple] = {}  # id(V) -> (V, value, ((dim, size), ...)) of plain-number values
        self.dim_named_refs: dict[int, V] = {}  # id(V) -> V: reads of a computed tensor named like a dim
        self.constants: dict[str, tuple] = {}  # const name -> (value, declaration span)
        self._static_scope = _Scope(self, "<const>", False)  # no tensors: where a const's value is read

    lenient = False  # sizes the diagram does not declare are left to the others checked with it

    def refuse_unknown(self):
        unknown = [k for k in self.overrides if k not in self.dims and k not in self.constants]
        if unknown:
            known = {**self.dims, **self.constants}
            consts = f" and consts {', '.join(sorted(self.constants))}" if self.constants else ""
            raise PenroseCheckError(
                f"unknown dim {unknown[0]!r} in sizes{suggest(unknown[0], known)}; the diagram declares "
                + (", ".join(sorted(self.dims)) or "no dims") + consts,
                Span(self.file),
            )

    # -- entry
    def run(self) -> Checked:
        top = self._collect(self.diagram)
        if not self.lenient:
            self.refuse_unknown()
        for name in block_order({n: blk for n, (blk, _) in self.block_defs.items()}):  # callees first
            blk, _ = self.block_defs[name]
            self.blocks[name] = self._check_body(blk.name, blk.body, blk.formals, is_block=True, span=blk.span)
        result = self._check_body(self.diagram.name, top, (), is_block=False, span=Span(self.file))
        found = self.warnings + list(legend_warnings(self.diagram)) + result.warnings
        result.warnings = sorted(found, key=lambda w: (w[1].file != self.file, w[1].line, w[1].col))  # in file order
        self._allocations_ok([self.blocks[n] for n in self.block_defs] + [result])
        self._total_ok(result)
        return result

    def _entries(self, d: Decl) -> int:
        sizes = [self.S.size(c) for c in d.type.cls]
        return 0 if any(n is None for n in sizes) else _prod(sizes)  # no size: the compiler asks for it

    def _allocations_ok(self, bodies):
        """Every param and buffer fits in LIMITS.tensor_bytes (float32, 4 bytes an entry)."""
        limit = LIMITS.value("tensor_bytes")
        for body in bodies:
            for d in body.params + body.buffers:
                sizes = [self.S.size(c) for c in d.type.cls]
                count = self._entries(d)
                if 4 * count > limit:
                    t = d.tensor
                    legs = ", ".join(f"{leg}={_amount(n)}" for leg, n in zip(t.legs, sizes))
                    raise PenroseCheckError(
                        f"{t.kind} {t.name!r} [{legs}] would hold {_amount(count)} entries, {_bytes(4 * count)} as float32, "
                        f"beyond the limit of {_bytes(limit)} per tensor; {Limits.how_to_raise('tensor_bytes')}",
                        t.span,
                    )

    def _total_ok(self, top: Checked):
        """All params and buffers, block instances and repeats counted, fit in LIMITS.total_bytes."""
        limit = LIMITS.value("total_bytes")
        per_block: dict[str, int] = {}

        def entries(body: Checked) -> int:  # blocks are checked callees first, so no cycle here
            own = sum(self._entries(d) for d in body.params + body.buffers)
            return own + sum(block_entries(i.block) * (i.repeat or 1) for i in body.instances.values())

        def block_entries(name: str) -> int:
            if name not in per_block:
                per_block[name] = entries(self.blocks[name])
            return per_block[name]

        total = 0
        items = [(self._entries(d), f"{d.tensor.kind} {d.tensor.name!r}", d.tensor.span) for d in top.params + top.buffers]
        items += [
            (block_entries(i.block) * (i.repeat or 1), f"{i.name!r} (block {i.block!r}" + (f" × {i.repeat:,})" if i.repeat else ")"), i.span)
            for i in top.instances.values()
        ]
        for count, what, span in sorted(items, key=lambda it: (it[2].line, it[2].col)):
            total += count
            if 4 * total > limit:
                raise PenroseCheckError(
                    f"the params and buffers would take {_bytes(4 * total)} as float32 in all once {what} is built "
                    f"({_amount(total)} entries), beyond the limit of {_bytes(limit)}; {Limits.how_to_raise('total_bytes')}",
                    span,
                )

    # -- pass 1: dims and blocks (of this file and its includes)
    def _collect(self, diagram: ir.Diagram) -> list:
        # real paths: a cycle through a symlinked file or folder is still a cycle
        path = os.path.realpath(diagram.file) if not diagram.file.startswith("<") else diagram.file
        self.including.append(path)
        body = []
        for s in diagram.body:
            if isinstance(s, ir.Dim):
                self._declare_dim(s)
            elif isinstance(s, ir.Const):
                self._declare_const(s)
            elif isinstance(s, ir.Block):
                self._name_ok(s.name, s.span, "block")
                if s.name in self.block_defs:
                    prev = self.block_defs[s.name][0].span
                    raise PenroseCheckError(f"block {s.name!r} is defined twice", s.span, notes=(("first defined here", prev),))
                if s.name in FUNCTIONS:
                    raise PenroseCheckError(f"block name {s.name!r} is a built-in function", s.span)
                self.block_defs[s.name] = (s, diagram)
                for inner in s.body:
                    if isinstance(inner, ir.Dim):
                        self._declare_dim(inner)
                    elif isinstance(inner, ir.Const):
                        self._declare_const(inner)
                    elif isinstance(inner, ir.Block):
                        raise PenroseCheckError("blocks are defined at the top level, not inside other blocks", inner.span)
            elif isinstance(s, ir.Include):
                self._include(s, diagram)
            else:
                body.append(s)
        self.including.pop()
        return body

    def _include(self, inc: ir.Include, diagram: ir.Diagram):
        """Collect an included file, read by the loader (penrose/reading.py: where includes may reach)."""
        target = self.includes.target(inc, diagram.file)
        if os.path.realpath(target) in self.including:
            raise PenroseCheckError(f"include cycle: {inc.path!r} includes itself", inc.span)
        sub = self.includes.diagram(inc, target)
        rest = self._collect(sub)
        for s in rest:
            if not isinstance(s, ir.Comment):
                raise PenroseCheckError(
                    f"{inc.path!r} has top-level statements; an included file may only hold dims and blocks", s.span,
                    notes=(("included from here", inc.span),),
                )

    def _declare_dim(self, d: ir.Dim):
        self.at = d.span
        self._name_ok(d.name, d.span, "dim", module_attr=False)
        if d.name in self.constants:
            raise PenroseCheckError(f"{d.name!r} is already a const", d.span, notes=(("the const is declared here", self.constants[d.name][1]),))
        if d.name in self.dims:
            prev = self.dim_decl[d.name].span
            raise PenroseCheckError(f"dim {d.name!r} is declared twice", d.span, notes=(("first declared here", prev),))
        if d.name in self.overrides:
            value = self.overrides[d.name]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
                what = "at most 2**63 - 1" if isinstance(value, int) and value > INT64_MAX else "a non-negative integer"
                raise PenroseCheckError(f"size for dim {d.name!r} must be {what}, got {value!r} ({type(value).__name__})", d.span)
            origin = (f"dim {d.name!r} (given as {d.name}={value})", d.span)
        elif d.size is not None:
            value = self._dim_expr(d.size, d)
            origin = (f"dim {d.name!r}", d.span)
        else:
            value, origin = None, (f"dim {d.name!r}", d.span)
        self.dims[d.name] = self.S.new(d.name, value, origin)
        self.dim_decl[d.name] = d

    def _dim_expr(self, e, d: ir.Dim) -> int:
        if isinstance(e, ir.Number):
            if not isinstance(e.value, int):
                raise PenroseCheckError(f"dim {d.name!r} needs a whole-number size, got {e.value}", e.span)
            if e.value < 0:
                raise PenroseCheckError(f"dim {d.name!r} would have a negative size ({e.value})", e.span)
            self._literal_ok(e)
            return e.value
        if isinstance(e, ir.Name) and e.id in self.constants:
            value = self.constants[e.id][0]
            if not isinstance(value, int):
                raise PenroseCheckError(f"const {e.id!r} is {value!r}, not a whole number; dim sizes are integers", e.span)
            return value
        if isinstance(e, ir.Name):
            if e.id not in self.dims:
                raise PenroseCheckError(f"unknown dim {e.id!r} in the size of {d.name!r}{suggest(e.id, self.dims)}", e.span)
            v = self.S.size(self.dims[e.id])
            if v is None:
                raise PenroseCheckError(f"dim {e.id!r} has no size, so {d.name!r} cannot be computed", e.span)
            return v
        if isinstance(e, ir.BinOp) and e.op in ("+", "-", "*", "//"):
            a, b = self._dim_expr(e.left, d), self._dim_expr(e.right, d)
            if e.op == "//" and b == 0:
                raise PenroseCheckError("division by zero in a dim size", e.span)
            v = {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0}[e.op]
            if v < 0:
                raise PenroseCheckError(f"dim {d.name!r} would have a negative size ({v})", e.span)
            if v > INT64_MAX:
                raise PenroseCheckError(f"dim {d.name!r} would have a size beyond 64 bits ({v:.4g})", e.span)
            return v
        if isinstance(e, ir.BinOp) and e.op == "/":
            a, b = self._dim_expr(e.left, d), self._dim_expr(e.right, d)
            if b == 0 or a % b:
                raise PenroseCheckError(f"{a} / {b} is not a whole number; dim sizes are integers", e.span)
            return a // b
        raise PenroseCheckError("a dim size is a whole number or an integer expression of other dims (+ - * // /)", getattr(e, "span", d.span))

    def _declare_const(self, d):
        """`const alpha = 8`, `const scale = alpha / r`: a named number, evaluated at the declared
        sizes (or given as compile(..., alpha=16)); usable wherever a number is."""
        self.at = d.span
        self._name_ok(d.name, d.span, "const", module_attr=False)
        if d.name in self.dims or d.name in self.constants:
            prev = self.dim_decl[d.name].span if d.name in self.dims else self.constants[d.name][1]
            what = "dim" if d.name in self.dims else "const"
            raise PenroseCheckError(f"{d.name!r} is already declared as a {what}", d.span, notes=(("first declared here", prev),))
        if d.name in FUNCTIONS:
            raise PenroseCheckError(f"const name {d.name!r} is a built-in function", d.span)
        if d.name in self.overrides:
            value = self.overrides[d.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PenroseCheckError(f"value for const {d.name!r} must be a finite number, got {value!r}", d.span)
            if isinstance(value, int) and abs(value) > INT64_MAX:
                raise PenroseCheckError(f"value for const {d.name!r} does not fit in 64 bits", d.span)
            if isinstance(value, float) and abs(value) > FLOAT32_MAX:
                raise PenroseCheckError(f"value for const {d.name!r} is beyond float32's range", d.span)
        else:
            value = self._static(d.value, f"const {d.name!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise PenroseCheckError(f"const {d.name!r} must be finite, got {value}", d.value.span)
        self.constants[d.name] = (value, d.span)

    def _static(self, node, what: str, integer: bool = False):
        """The value of a number expression of numbers, dims and consts, known when compiling."""
        bad = next((n for n in _names(node) if n not in self.dims and n not in self.constants and n != "inf"), None)
        if bad is not None:
            at = next(n.span for n in _name_nodes(node) if n.id == bad)
            raise PenroseCheckError(f"{what} is a number (of dims and consts), but {bad!r} is neither a dim nor a const"
                                    f"{suggest(bad, {**self.dims, **self.constants})}", at)
        v = self._expr(self._static_scope, node)
        if v.type.dtype != "scalar":  # pragma: no cover - only names of dims and consts are read
            raise PenroseCheckError(f"{what} must be a number", getattr(node, "span", self.at))
        known = self._const(v)
        if known is None:
            raise PenroseCheckError(f"{what} reads a size known only at run time; give the dim a size", getattr(node, "span", self.at))
        value = known[0]
        if integer:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int):
                raise PenroseCheckError(f"{what} must be a whole number, got {value:g}", getattr(node, "span", self.at))
        return value

    def _name_ok(self, name: str, span: Span, what: str, module_attr=True):
        if quoted(name):  # `self`, `_bias`: a state-dict name kept as it is
            if what not in ("param", "buffer", "instance"):
                raise PenroseCheckError(f"{what} name {name}: a quoted name is only for a param, buffer or instance "
                                        "(a state-dict name the language's rules would refuse)", span)
            if unquote(name) in MODULE_ATTRS:
                raise PenroseCheckError(f"{what} name {name} clashes with torch.nn.Module.{unquote(name)}", span)
            return
        if not IDENT.match(name):
            raise PenroseCheckError(f"invalid {what} name {name!r}: names start with a letter (not '_')", span)
        if keyword.iskeyword(name) or keyword.issoftkeyword(name):
            raise PenroseCheckError(f"{what} name {name!r} is a Python keyword", span)
        if name in PEN_KEYWORDS:
            raise PenroseCheckError(f"{what} name {name!r} is a .pen keyword", span)
        if name == "inf":
            raise PenroseCheckError(f"{what} name 'inf' is reserved: it is infinity", span)
        if what != "dim" and name in GENERATED:
            raise PenroseCheckError(f"{what} name {name!r} is reserved by the generated module", span)
        if module_attr and name in MODULE_ATTRS:
            raise PenroseCheckError(f"{what} name {name!r} clashes with torch.nn.Module.{name}", span)

    # -- pass 2: a body (the top level or a block)
    def _check_body(self, name, body, formals, is_block, span) -> Checked:
        sc = _Scope(self, name, is_block)
        for f in formals:
            self._declare_tensor(sc, f)
        returned = False
        step = None
        for s in body:
            self.at = getattr(s, "span", span)
            if isinstance(s, ir.Comment):
                if s.step is not None:
                    step = s.step
                    sc.captions[s.step] = s.text
                sc.stmts.append(CStmt(s, step=s.step))
            elif isinstance(s, ir.Tensor):
                if is_block and s.kind == "input":
                    raise PenroseCheckError("a block takes its inputs as arguments: block f(x[t, e]) { ... }", s.span)
                self._declare_tensor(sc, s)
                sc.stmts.append(CStmt(s, step=step))
            elif isinstance(s, ir.Assign):
                sc.stmts.append(self._assign(sc, s, step))
            elif isinstance(s, ir.Output):
                if is_block:
                    raise PenroseCheckError("a block ends with 'return', not 'output'", s.span)
                if sc.output_at is not None:
                    raise PenroseCheckError(
                        "a second 'output' statement; name every result in one, as 'output y, z'",
                        s.span,
                        notes=(("the first 'output' statement is here", sc.output_at),),
                    )
                sc.output_at = s.span
                for n in s.names:
                    if any(n == o[0] for o in sc.outputs):
                        raise PenroseCheckError(f"{n!r} is output twice", s.span)
                    t = self._lookup(sc, n, s.span)
                    sc.outputs.append((n, t))
                sc.stmts.append(CStmt(s, step=step))
            elif isinstance(s, ir.Return):
                if not is_block:
                    raise PenroseCheckError("'return' is only for blocks; the diagram says 'output NAME'", s.span)
                if returned:
                    raise PenroseCheckError("a block returns once", s.span)
                returned = True
                vals = tuple(self._expr(sc, e) for e in s.values)
                for i, v in enumerate(vals):
                    if v.type.dtype == "scalar":
                        raise PenroseCheckError("a block returns tensors, not plain numbers", s.values[i].span)
                sc.outputs = [(f"out{i}", v.type) for i, v in enumerate(vals)]
                sc.stmts.append(CStmt(s, value=V("return", vals, span=s.span), types=tuple(v.type for v in vals), step=step))
            elif isinstance(s, ir.Label):
                self._lookup(sc, s.name, s.span)
                if s.name in sc.label_at:
                    raise PenroseCheckError(
                        f"{s.name!r} is labelled twice", s.span, notes=(("first labelled here", sc.label_at[s.name]),)
                    )
                sc.labels[s.name] = s.text
                sc.label_at[s.name] = s.span
                sc.stmts.append(CStmt(s, step=step))
            elif isinstance(s, (ir.Dim, ir.Const)):  # declared in the first pass
                sc.stmts.append(CStmt(s, step=step))
            else:  # pragma: no cover - the parser produces nothing else
                raise PenroseCheckError(f"unexpected statement {type(s).__name__}", getattr(s, "span", span))
        if is_block and not returned:
            raise PenroseCheckError(f"block {name!r} never returns a value", span)
        if not is_block and not sc.outputs:
            last = next((s for s in reversed(body) if not isinstance(s, ir.Comment)), None)
            raise PenroseCheckError(
                "the diagram has no output; add 'output NAME' naming what forward returns",
                last.span if last is not None else Span(self.file, 1, 1, 1, 2, ""),
            )
        for n, d in sc.decls.items():
            if n not in sc.used and d.tensor.kind in ("input", "param", "buffer", "formal"):
                self.warnings.append((f"{d.tensor.kind} {n!r} is never used", d.tensor.span))
        return Checked(
            self.diagram,
            name,
            self.S,
            self.dims,
            sc.decls,
            sc.stmts,
            sc.outputs,
            self.blocks,
            sc.instances,
            sc.labels,
            [],
            is_block,
            sc.captions,
        )

    def _declare_tensor(self, sc: _Scope, t: ir.Tensor):
        self._name_ok(t.name, t.span, t.kind if t.kind != "formal" else "argument", module_attr=t.kind in ("param", "buffer"))
        self._fresh(sc, t.name, t.span)
        self._not_a_dim(t.name, t.span)
        if t.name in FUNCTIONS or t.name in self.block_defs:
            raise PenroseCheckError(f"tensor name {t.name!r} is already a {'function' if t.name in FUNCTIONS else 'block'}", t.span)
        if t.dtype not in DTYPES:
            hint = suggest(t.dtype, DTYPES)
            raise PenroseCheckError(f"unknown dtype {t.dtype!r}" + (hint if hint else "; use float, int or bool"), t.span)
        if t.kind in ("param", "buffer") and t.dtype != "float":
            raise PenroseCheckError(f"{t.kind}s are float tensors", t.span)
        if t.kind in ("param", "buffer") and t.batched:
            raise PenroseCheckError(f"a {t.kind} has no batch legs ('...')", t.span)
        cls = []
        for i, leg in enumerate(t.legs):
            if leg not in self.dims:
                raise PenroseCheckError(
                    f"undeclared dim {leg!r} in {t.kind if t.kind != 'formal' else 'argument'} {t.name!r}{suggest(leg, self.dims)}; declare it with 'dim {leg} = SIZE'",
                    t.leg_span(i),
                )
            c = self.dims[leg]
            self.S.mark(c, fixed=t.kind in ("param", "buffer"), fed=t.kind == "input")
            cls.append(c)
        if t.init is not None:
            init = self._init_ok(t, t.init)
            if init != t.init:  # a const argument: the compiler reads numbers
                t = replace(t, init=init)
        batched = t.kind in ("input", "formal")
        ty = TType(tuple(t.legs), tuple(cls), t.dtype, batched)
        sc.decls[t.name] = Decl(t, ty)
        sc.vars[t.name] = ty

    def _init_ok(self, t: ir.Tensor, init: ir.Init) -> ir.Init:
        if init.name not in INITS:
            raise PenroseCheckError(f"unknown init {init.name!r}{suggest(init.name, INITS)}; one of {', '.join(INITS)}", init.span)
        spec = INITS[init.name]
        given = {}
        resolved = []  # the arguments as numbers: consts read at their values
        for k, v in init.kwargs:
            if k not in spec:
                allowed = ", ".join(sorted(spec)) or "no arguments"
                raise PenroseCheckError(f"{init.name}() takes {allowed}, not {k!r}", v.span)
            if _is_inf(v):
                value = -math.inf if isinstance(v, ir.Neg) else math.inf
            elif isinstance(v, ir.Number):
                self._literal_ok(v)
                value = v.value
            elif _names(v) and all(n in self.constants or n in self.dims for n in _names(v)):
                value = self._static(v, f"init argument {k!r}")
            else:
                raise PenroseCheckError(f"init argument {k!r} must be a number (or a const)", v.span)
            text, ok = ops.RULES[spec[k][1]]
            if not ok(value):
                raise PenroseCheckError(f"{init.name}: {k} must be {text}, got {value:g}", v.span)
            given[k] = (value, v.span)
            resolved.append((k, v if isinstance(v, ir.Number) else ir.Number(value, span=v.span)))
        if init.name == "uniform":
            (a, a_at), (b, b_at) = (given.get(k, (spec[k][0], None)) for k in ("a", "b"))
            at = b_at or a_at or init.span
            if a > b:
                default = f" (a defaults to {a:g})" if a_at is None else f" (b defaults to {b:g})" if b_at is None else ""
                raise PenroseCheckError(f"uniform: a={a:g} is above b={b:g}{default}", at)
            if b - a > FLOAT32_MAX:
                raise PenroseCheckError(f"uniform: the range from a={a:g} to b={b:g} is wider than float32 holds", at)
        if init.name == "eye" and len(t.legs) != 2:
            raise PenroseCheckError("eye initialises a tensor with two legs", init.span)
        if init.name in ("causal", "rotary_cos", "rotary_sin") and len(t.legs) < 2:
            raise PenroseCheckError(f"{init.name} initialises a tensor with two legs or more", init.span)
        return replace(init, kwargs=tuple(resolved))

    def _not_a_dim(self, name: str, span: Span):
        # a declared tensor's legs name dims beside it: `param d[d]`, then `x * d` would be misread
        if name in self.constants:
            raise PenroseCheckError(
                f"tensor name {name!r} is already a const", span, notes=(("the const is declared here", self.constants[name][1]),)
            )
        if name in self.dims:
            raise PenroseCheckError(
                f"tensor name {name!r} is already a dim; a tensor and a dim cannot share a name",
                span,
                notes=(("the dim is declared here", self.dim_decl[name].span),),
            )

    def _unambiguous(self, sc: _Scope, v: V) -> V:
        """A computed tensor named like a dim (the paper's key `k` beside the concept dim `k`) is read
        only where a tensor is expected; where a number could stand (x * k) it is refused."""
        hit = self.dim_named_refs.get(id(v))
        if hit is v:
            name = v.attrs["name"]
            raise PenroseCheckError(
                f"{name!r} here could be the tensor {name!r} or the size of dim {name!r}; rename the tensor, "
                f"or write the size as T.shape[i]",
                v.span,
                notes=(("the tensor is defined here", sc.defined_at.get(name, v.span)), ("the dim is declared here", self.dim_decl[name].span)),
            )
        return v

    def _fresh(self, sc: _Scope, name: str, span: Span):
        if name in sc.decls:
            raise PenroseCheckError(
                f"{name!r} is declared twice", span, notes=(("first declared here", sc.decls[name].tensor.span),)
            )
        if name in sc.vars:
            raise PenroseCheckError(f"{name!r} is already a computed tensor; declarations come first", span)
        if name in sc.instances:
            raise PenroseCheckError(f"{name!r} is already a block instance", span)

    def _lookup(self, sc: _Scope, name: str, span: Span) -> TType:
        if name not in sc.vars:
            pool = list(sc.vars)
            hint = suggest(name, pool)
            if name in self.dims:
                hint = f"; {name!r} is a dim (a leg), not a tensor"
            raise PenroseCheckError(f"unknown tensor {name!r}{hint}", span)
        sc.used.add(name)
        return sc.vars[name]

    # -- assignments
    def _assign(self, sc: _Scope, s: ir.Assign, step) -> CStmt:
        for t in s.targets:
            self._name_ok(t, s.span, "tensor", module_attr=False)
            if t in sc.decls and sc.decls[t].tensor.kind in ("param", "buffer"):
                raise PenroseCheckError(f"cannot assign to {sc.decls[t].tensor.kind} {t!r}", s.span)
            if t in FUNCTIONS or t in self.block_defs:
                raise PenroseCheckError(f"{t!r} is a {'function' if t in FUNCTIONS else 'block'} name", s.span)
            if t in sc.instances:
                raise PenroseCheckError(f"{t!r} is a block instance name", s.span)
            if t in self.constants:
                raise PenroseCheckError(f"{t!r} is a const; give the tensor another name", s.span,
                                        notes=(("the const is declared here", self.constants[t][1]),))
            if any(t == o[0] for o in sc.outputs):  # forward returns one value per output name
                raise PenroseCheckError(
                    f"{t!r} is assigned again after 'output {t}'; output its final value (move 'output' last) "
                    "or give the new value another name",
                    s.span,
                    notes=(("output here", sc.output_at),) if sc.output_at is not None else (),
                )
        if len(set(s.targets)) != len(s.targets):
            raise PenroseCheckError("a name appears twice among the targets", s.span)
        sc.block_calls = []
        stmt_ctx = {"instance": s.instance, "repeat": s.repeat, "assign": s}
        self._stmt_ctx: dict[str, Any] | None = stmt_ctx
        try:
            value = self._unambiguous(sc, self._expr(sc, s.value))  # `y = k`: the tensor or the size?
        finally:
            self._stmt_ctx = None
        if s.instance is not None and len(sc.block_calls) != 1:
            raise PenroseCheckError("'as NAME' names the one block call of a statement", s.span)
        if s.repeat is not None and not (isinstance(s.value, ir.Call) and s.value.func in self.block_defs):
            raise PenroseCheckError("'repeat N' applies to a statement that is one block call: Z = layer(Z) repeat N", s.span)
        if value.outs:
            types = value.outs
        else:
            types = (value.type,)
        if len(types) != len(s.targets):
            raise PenroseCheckError(
                f"{len(s.targets)} target(s) but the value yields {len(types)} tensor(s)", s.span
            )
        versions = []
        for t, ty in zip(s.targets, types):
            known = t in sc.vars
            sc.vars[t] = ty
            sc.defined_at[t] = s.span
            sc.versions[t] = sc.versions.get(t, 0) + 1 if known else 0
            versions.append(sc.versions[t])
        return CStmt(s, s.targets, value, types, step, tuple(versions))

    # -- expressions
    def _expr(self, sc: _Scope, e) -> V:
        if isinstance(e, ir.Number):
            self._literal_ok(e)
            return V("num", attrs={"value": e.value}, span=e.span)
        if isinstance(e, ir.Name):
            if e.id == "inf":
                return V("num", attrs={"value": math.inf}, span=e.span)
            if e.id in self.constants:
                return V("const", attrs={"name": e.id, "value": self.constants[e.id][0]}, span=e.span)
            if e.id in self.dims and e.id not in sc.vars:
                return V("dimsize", attrs={"cls": self.dims[e.id], "name": e.id}, span=e.span)
            ty = self._lookup(sc, e.id, e.span)
            decl = sc.decls.get(e.id)
            kind = decl.tensor.kind if decl is not None and sc.vars[e.id] is decl.type else "local"
            v = V("ref", attrs={"name": e.id, "kind": kind, "version": sc.versions.get(e.id, 0)}, type=ty, span=e.span)
            if e.id in self.dims:
                self.dim_named_refs[id(v)] = v
            return v
        if isinstance(e, ir.Shape):
            ty = self._lookup(sc, e.tensor, e.span)
            n = len(ty.legs)
            if not -n <= e.index < n:
                raise PenroseCheckError(f"{e.tensor!r} has {n} leg(s); shape index {e.index} is out of range", e.span)
            c = ty.cls[e.index]
            return V("dimsize", attrs={"cls": c, "name": ty.legs[e.index]}, span=e.span)
        if isinstance(e, ir.String):
            raise PenroseCheckError("a string is only allowed as an einsum spec, an einops pattern or a reduction", e.span)
        if isinstance(e, ir.ListExpr):
            raise PenroseCheckError("a list is only allowed as an argument of split or concat", e.span)
        if isinstance(e, ir.Neg):
            a = self._expr(sc, e.operand)
            if a.op == "num":  # -inf, -2: fold into the number
                return V("num", attrs={"value": -a.attrs["value"]}, span=e.span)
            self._numeric(self._unambiguous(sc, a), cast("ir.Expr", e.operand).span, "negate")
            return self._evaluated(V("neg", (a,), type=a.type, span=e.span))
        if isinstance(e, ir.BinOp):
            return self._evaluated(self._binop(sc, e))
        if isinstance(e, ir.Call):
            v = self._call(sc, e)
            if v.op == "unary":
                self._unambiguous(sc, v.args[0])
            return self._evaluated(v)
        raise PenroseCheckError(f"unsupported expression {type(e).__name__}", getattr(e, "span", Span(self.file)))

    def _literal_ok(self, e: ir.Number, finite: bool = False):
        """A number torch accepts as a scalar: an int64, a float within float32's range, or inf."""
        v = e.value
        if isinstance(v, int) and abs(v) > INT64_MAX:
            raise PenroseCheckError(f"the integer {v} does not fit in 64 bits; write it as a float ({v:.4g})", e.span)
        if isinstance(v, float) and math.isfinite(v) and abs(v) > FLOAT32_MAX:
            raise PenroseCheckError(f"the number {v:g} is beyond float32's range ({FLOAT32_MAX:.4g}); write inf for infinity", e.span)
        if finite and not math.isfinite(v):
            raise PenroseCheckError(f"the number {v} must be finite here", e.span)

    def _const(self, v: V):
        """(value, ((dim, size), ...)) of a plain-number value known at the declared sizes, else None."""
        if v.op == "num":
            return v.attrs["value"], ()
        if v.op == "const":
            return v.attrs["value"], ((v.attrs["name"], v.attrs["value"]),)
        if v.op == "dimsize":
            n = self.S.size(v.attrs["cls"])
            return None if n is None else (n, ((v.attrs["name"], n),))
        hit = self.consts.get(id(v))
        return hit[1:] if hit is not None and hit[0] is v else None

    def _evaluated(self, v: V) -> V:
        """Evaluate a plain-number value (as the generated Python will) and refuse what torch cannot take."""
        if v.type.dtype != "scalar" or v.op not in ("neg", "sbin", "sfunc"):
            return v
        args = [self._const(a) for a in v.args]
        if any(a is None for a in args):
            return v  # a size known only at run time
        vals = [a[0] for a in args]
        dims = tuple(dict.fromkeys(d for a in args for d in a[1]))[:3]
        at = f" at {', '.join(f'{n} = {size}' for n, size in dims)}" if dims else ""
        value = _evaluate(v, vals, at)
        if isinstance(value, int) and abs(value) > INT64_MAX:
            raise PenroseCheckError(f"this number is {value:.4g}{at}, which does not fit in 64 bits", v.span)
        if isinstance(value, float):
            if math.isnan(value):
                raise PenroseCheckError(f"this expression is nan (not a number){at}", v.span)
            if math.isfinite(value) and abs(value) > FLOAT32_MAX:
                raise PenroseCheckError(f"this number is {value:.4g}{at}, beyond float32's range ({FLOAT32_MAX:.4g})", v.span)
        self.consts[id(v)] = (v, value, dims)
        return v

    def _numeric(self, v: V, span: Span, what: str):
        if v.type.dtype in ("int", "bool"):
            raise PenroseCheckError(f"cannot {what} {_a(v.type.dtype)} tensor", span)

    def _binop(self, sc, e: ir.BinOp) -> V:
        a, b = self._unambiguous(sc, self._expr(sc, e.left)), self._unambiguous(sc, self._expr(sc, e.right))
        compare = e.op in ("<", "<=", ">", ">=", "==", "!=")
        for v, sub in ((a, e.left), (b, e.right)):
            if v.type.dtype == "bool" and not compare:
                raise PenroseCheckError(f"arithmetic on the bool mask {_describe(sub)}; use where(mask, a, b)", cast("ir.Expr", sub).span)
        if a.type.dtype == "scalar" and b.type.dtype == "scalar":
            if compare:
                raise PenroseCheckError("comparing two plain numbers; compare a tensor", e.span)
            return V("sbin", (a, b), {"op": e.op}, SCALAR, span=e.span)
        legs, cls, align = self._align([a, b], [e.left, e.right], e.span, f"'{e.op}'")
        dtype = "bool" if compare else "float"
        batched = a.type.batched or b.type.batched
        return V("binop", (a, b), {"op": e.op, "align": align}, TType(legs, cls, dtype, batched), span=e.span)

    def _align(self, vals, exprs, span, what):
        """Result legs of an element-wise op and, per operand, how its legs map onto them."""
        tensors = [(i, v) for i, v in enumerate(vals) if v.type.dtype != "scalar"]
        if not tensors:
            return (), (), [None] * len(vals)
        # the operand with the most legs (leftmost on ties) sets the result's order
        li, lead = max(tensors, key=lambda iv: (len(iv[1].legs), -iv[0]))
        legs, cls = lead.type.legs, lead.type.cls
        unique = len(set(legs)) == len(legs)
        align = []
        for v, ex in zip(vals, exprs):
            if v.type.dtype == "scalar":
                align.append(None)
                continue
            vl = v.type.legs
            if unique and len(set(vl)) == len(vl) and set(vl) <= set(legs):
                for leg, c in zip(vl, v.type.cls):
                    j = legs.index(leg)
                    self.S.unify(c, cls[j], (f"{what}: leg {leg!r}", span))
                align.append(tuple(vl.index(l) if l in vl else None for l in legs))
            elif len(vl) == len(legs):
                for j, c in enumerate(v.type.cls):
                    if vl[j] != legs[j]:
                        self._by_position(ex, vl[j], c, exprs[li], legs[j], cls[j], span, what)
                    self.S.unify(c, cls[j], (f"{what}: leg {vl[j]!r} of {_describe(ex)} against leg {legs[j]!r}", span))
                align.append(tuple(range(len(legs))))
            else:
                raise PenroseCheckError(
                    f"cannot broadcast {_describe(ex)} with legs [{', '.join(vl)}] against [{', '.join(legs)}] in {what}; "
                    "legs align by name when one set contains the other, else by position when the counts match"
                    " (write an outer product as an einsum)",
                    getattr(ex, "span", span),
                )
        return legs, cls, align

    def _by_position(self, ex, leg: str, c: int, lead_ex, other: str, oc: int, span, what):
        """Two legs of different names aligned by position (docs/language.md, element-wise
        arithmetic): allowed, with a warning, only when the sizes are already known and equal
        (then nothing is guessed); a leg of unknown size is never bound this way."""
        S = self.S
        a, b = S.size(c), S.size(oc)
        shown = f"leg {leg!r} of {_describe(ex)} with leg {other!r} of {_describe(lead_ex)}"
        outer = "product" if what == "'*'" else "sum" if what in ("'+'", "'-'") else "combination"
        fix = (f"rename one leg if they are one leg; for every pair (the outer {outer}) give the other operand leg "
               f"{leg!r} too, by name: repeat(..., '... {other} -> ... {other} {leg}'), or write an einsum")
        if S.find(c) != S.find(oc) and (a is None or b is None):
            unknown = leg if a is None else other
            raise PenroseCheckError(
                f"{what} would align {shown} by position and so fix the size of {unknown!r}, which is not known; {fix}",
                getattr(ex, "span", span))
        self.warnings.append((f"{what} aligns {shown} by position (sizes {a} and {b}); {fix}", getattr(ex, "span", span)))

    def _leg_arg(self, v: V, arg, call: ir.Call, what="leg") -> int:
        """Position (among the non-batch legs) of a leg given by name or dim=±i."""
        n = len(v.legs)
        if isinstance(arg, ir.Name):
            if arg.id not in v.legs:
                raise PenroseCheckError(
                    f"{call.func}: the tensor has no leg {arg.id!r}{suggest(arg.id, v.legs)}; its legs are [{', '.join(v.legs)}]",
                    arg.span,
                )
            if v.legs.count(arg.id) > 1:
                raise PenroseCheckError(f"{call.func}: leg {arg.id!r} appears twice; use dim=i", arg.span)
            return v.legs.index(arg.id)
        if isinstance(arg, ir.Number) and isinstance(arg.value, int):
            i = arg.value
            if not -n <= i < n:
                raise PenroseCheckError(f"{call.func}: dim={i} is out of range for a tensor with {n} leg(s)", arg.span)
            return i % n
        raise PenroseCheckError(f"{call.func}: the {what} is a leg name or dim=i", getattr(arg, "span", call.span))

    def _call(self, sc, e: ir.Call) -> V:
        f = e.func
        if f in self.block_defs:
            return self._block_call(sc, e)
        if f not in FUNCTIONS:
            pool = list(FUNCTIONS) + list(self.block_defs)
            hint = suggest(f, pool)
            if f in sc.vars:
                hint = f"; {f!r} is a tensor, not a function"
            raise PenroseCheckError(f"unknown function {f!r}{hint}", e.span)
        self._arity(e)  # arity and keywords as the table of operations says
        v = self._builtin(sc, e)
        written = list(e.kwargs)
        if OPS[f].rule == "elementwise":  # keywords given by position (clamp_min(x, alpha))
            written += [(k.name, node) for k, node in zip(OPS[f].keywords, e.args[1:])]
        shown = {k: self._expr(self._static_scope, node) for k, node in written
                 if (kw := OPS[f].keyword(k)) is not None and kw.kind in ops.NUMERIC and _names(node)}
        if shown:  # keyword values written with consts or dims: figures and equations show the names
            v.attrs["shown"] = shown
            v.attrs["shown_text"] = {k: format_expr(node) for k, node in written if k in shown}
        return v

    def _builtin(self, sc, e: ir.Call) -> V:
        rule = OPS[e.func].rule  # the row names its type rule (an operator has none, and is no call)
        assert rule is not None
        return TYPE_RULES[rule](self, sc, e)

    def _elementwise(self, sc, e: ir.Call) -> V:
        """An element-wise function of the table: its keywords by name, or by position after x."""
        f, row = e.func, OPS[e.func]
        a = self._expr(sc, e.args[0])
        if a.type.dtype == "scalar":
            if row.scalar:
                return V("sfunc", (a,), {"name": f}, SCALAR, span=e.span)
            raise PenroseCheckError(f"{f} of a plain number; apply it to a tensor", e.span)
        self._numeric(a, e.args[0].span, f"apply {f} to")
        attrs: dict[str, object] = {"name": f}
        for kw, node in zip(row.keywords, [*e.args[1:], *[None] * len(row.keywords)]):
            if node is not None and e.kwarg(kw.name) is not None:
                raise PenroseCheckError(f"{f}: {kw.name} is given twice, by position and as {kw.name}=", e.kwarg(kw.name).span)
            value = self._number_kw(e, kw.name, node=node)
            if value is None:
                raise PenroseCheckError(f"{f} needs {kw.name}, as {f}(x, {kw.name}=0)", e.span)
            attrs[kw.name] = float(value)
        return V("unary", (a,), attrs, a.type, span=e.span)

    def _arity(self, e: ir.Call):
        """Positional count and keyword names against the table of operations (ops.OPS)."""
        op = OPS[e.func]
        lo, hi, kws = op.min_args, op.max_args, op.keyword_names
        n = len(e.args)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise PenroseCheckError(f"{e.func} takes {want} positional argument(s), got {n}", e.span)
        seen = set()
        for k, v in e.kwargs:
            if op.axis_lengths and k not in seen:  # einops' NAME=size (and reduce's reduction=): _einop reads them
                seen.add(k)
                continue
            if k not in kws:
                allowed = ", ".join(kws) or "no keyword arguments"
                raise PenroseCheckError(f"{e.func} takes {allowed}, not {k!r}", v.span)
            if k in seen:
                raise PenroseCheckError(f"{e.func}: keyword argument {k!r} is given twice", v.span)
            seen.add(k)

    def _tensor_arg(self, sc, e: ir.Call, i: int, allow=("float",), v: V | None = None) -> V:
        v = self._expr(sc, e.args[i]) if v is None else v
        if v.type.dtype == "scalar":
            raise PenroseCheckError(f"{e.func}: argument {i + 1} must be a tensor", e.args[i].span)
        if v.type.dtype not in allow:
            raise PenroseCheckError(f"{e.func}: argument {i + 1} is {_a(v.type.dtype)} tensor; expected {' or '.join(allow)}", e.args[i].span)
        return v

    def _number_kw(self, e: ir.Call, key, default=None, node=None):
        """A number keyword as its row says: its default when not given (or `default`, a value
        given by position), whole or not, a dim allowed or not, within its rule."""
        spec = OPS[e.func].keyword(key)
        assert spec is not None, f"{e.func} has no keyword {key!r} in the table"
        node = node if node is not None else e.kwarg(key)
        if node is None:
            return default if default is not None else spec.default
        value = self._number_kw_value(e, key, node, spec.integer, spec.allows_dim, spec.infinite_ok)
        if value is not None and not spec.ok(value):
            raise PenroseCheckError(f"{e.func}: {key} must be {spec.rule_text}, got {value:g}", node.span)
        return value

    def _number_kw_value(self, e: ir.Call, key, v, integer, allow_dim, bound):
        if not bound and any(isinstance(n, ir.Name) and n.id == "inf" for n in (v, getattr(v, "operand", None))):
            raise PenroseCheckError(f"{e.func}: {key} must be finite", v.span)
        if isinstance(v, ir.Neg) and isinstance(v.operand, ir.Name) and v.operand.id == "inf":
            return -math.inf
        if isinstance(v, ir.Name) and v.id == "inf":
            return math.inf
        sign, node = (-1, v.operand) if isinstance(v, ir.Neg) else (1, v)
        if allow_dim and isinstance(node, ir.Name) and node.id in self.dims:
            size = self.S.size(self.dims[node.id])
            if size is None:
                raise PenroseCheckError(f"{e.func}: dim {node.id!r} has no size", node.span)
            return sign * size
        names = _names(v)
        if names and all(n in self.constants or (allow_dim and n in self.dims) for n in names):
            return self._static(v, f"{e.func}: {key}", integer=integer)  # consts (and dims where allowed)
        if not isinstance(v, ir.Number) or (integer and not isinstance(v.value, int)):
            kind = "a whole number" if integer else "a number"
            raise PenroseCheckError(f"{e.func}: {key} must be {kind}{' or a dim' if allow_dim else ''}", v.span)
        self._literal_ok(v, finite=not bound)
        return v.value

    # einsum ------------------------------------------------------------------------------------
    def _fn_einsum(self, sc, e: ir.Call) -> V:
        """torch.einsum's rules (penrose/einsum_spec.py); a label bound to sizes 1 and n broadcasts to n."""
        if not e.args or not isinstance(e.args[0], ir.String):
            raise PenroseCheckError("einsum's first argument is its spec string, as einsum('te,ed->td', Z, W)", e.span)
        spec_node = e.args[0]
        operands = [self._expr(sc, a) for a in e.args[1:]]
        for i, (v, a) in enumerate(zip(operands, e.args[1:])):
            if v.type.dtype == "scalar":
                raise PenroseCheckError(f"einsum operand {i + 1} is a plain number; einsum contracts tensors", a.span)
            if v.type.dtype != "float":
                raise PenroseCheckError(
                    f"einsum operand {i + 1} {_describe(a)} is {_a(v.type.dtype)} tensor; use gather(E, ids) for ids", a.span
                )
        key = (spec_node.value, tuple(v.legs for v in operands), tuple(v.type.batched for v in operands))
        ein = _EINSUM_SPECS.get(key)
        if ein is None:  # a spec read once per operand shapes; an error is raised (and positioned) afresh each time
            ein = parse_einsum(
                spec_node.value, spec_node.span, [len(v.legs) for v in operands],
                batched=[v.type.batched for v in operands], names=[_describe(a) for a in e.args[1:]],
                legs=[v.legs for v in operands],
            )
            if len(_EINSUM_SPECS) > 4096:
                _EINSUM_SPECS.clear()
            _EINSUM_SPECS[key] = ein
        size = self.S.size
        label_cls: dict[str, int] = {}  # the class each label takes in the result: a size-1 one only if all are
        label_leg: dict[str, str] = {}  # the leg name a synthetic '...k' label gives the result
        label_origin: dict[str, _Where] = {}
        for i, (term, v, a) in enumerate(zip(ein.terms, operands, e.args[1:])):
            in_term: dict[str, tuple[int, _Where]] = {}
            for j, (label, c, leg) in enumerate(zip(term, v.type.cls, v.legs)):
                where = _Where(i, a, leg)  # message text and position, built only for an error
                here = _Here(spec_node.span, ein.where[i][j])
                if label in in_term:  # a diagonal: torch needs equal sizes, 1 does not broadcast here
                    c0, where0 = in_term[label]
                    va, vb = size(c0), size(c)
                    if va is not None and vb is not None and va != vb:
                        raise PenroseCheckError(
                            f"einsum label {label_text(label)} is repeated in operand {i + 1} {_describe(a)} "
                            f"but its legs differ in size: {where0} ({va}), leg {leg!r} ({vb})",
                            here.span,
                        )
                    self.S.unify(c0, c, (f"einsum label {label_text(label)}", here.span))
                    continue
                in_term[label] = (c, where)
                if label not in label_cls:
                    label_cls[label], label_leg[label], label_origin[label] = c, leg, where
                    continue
                va, vb = size(label_cls[label]), size(c)
                if vb == 1 and va != 1:  # broadcasts against the label's other legs: it must stay 1
                    self._baked(c)
                    continue
                if va == 1 and vb != 1:
                    self._baked(label_cls[label])
                    label_cls[label], label_leg[label], label_origin[label] = c, leg, where
                    continue
                if va is not None and vb is not None and va != vb:
                    raise PenroseCheckError(
                        f"size of label {label_text(label)} for {where} ({vb}) does not match {label_origin[label]} ({va})",
                        here.span,
                    )
                if self.S.find(label_cls[label]) != self.S.find(c):
                    self.S.unify(label_cls[label], c, (f"einsum label {label_text(label)}", here.span))
        legs = tuple(label_leg[l] if is_ellipsis_label(l) else l for l in ein.out)
        batched = any(v.type.batched for v in operands) and not ein.sum_batch
        ty = TType(legs, tuple(label_cls[l] for l in ein.out), "float", batched)
        attrs = {"terms": ein.terms, "out": ein.out, "sum_batch": ein.sum_batch, "spec": spec_node.value}
        return V("einsum", tuple(operands), attrs, ty, span=e.span)

    # one-tensor functions over a leg ---------------------------------------------------------------
    def _over_leg(self, sc, e: ir.Call, default_last=True, v: V | None = None):
        v = self._tensor_arg(sc, e, 0, v=v)
        if not v.legs:
            raise PenroseCheckError(f"{e.func} needs a tensor with legs", e.args[0].span)
        leg_arg = e.args[1] if len(e.args) > 1 else e.kwarg("dim")
        if len(e.args) > 1 and e.kwarg("dim") is not None:
            raise PenroseCheckError(f"{e.func}: give the leg once (a name or dim=i)", e.span)
        if leg_arg is None:
            if not default_last:
                raise PenroseCheckError(f"{e.func} needs the leg to act on, as {e.func}(x, p) or dim=-1", e.span)
            axis = len(v.legs) - 1
        else:
            axis = self._leg_arg(v, leg_arg, e)
        return v, axis

    def _fn_softmax(self, sc, e):
        v, axis = self._over_leg(sc, e, default_last=False)
        return V(e.func, (v,), {"axis": axis}, v.type, span=e.span)

    def _norm_param(self, sc, e, key, v, axis):
        node = e.kwarg(key)
        if node is None:
            return None
        if not isinstance(node, ir.Name):
            raise PenroseCheckError(f"{e.func}: {key} names a param of the diagram", node.span)
        ty = self._lookup(sc, node.id, node.span)
        decl = sc.decls.get(node.id)
        if decl is None or decl.tensor.kind not in ("param", "buffer"):
            raise PenroseCheckError(f"{e.func}: {key} {node.id!r} must be a declared param", node.span)
        if len(ty.legs) != 1:
            raise PenroseCheckError(f"{e.func}: {key} {node.id!r} must have one leg, it has {len(ty.legs)}", node.span)
        self.S.unify(ty.cls[0], v.type.cls[axis], (f"{e.func} {key} {node.id!r} against leg {v.legs[axis]!r}", node.span))
        return node.id

    def _fn_layernorm(self, sc, e):
        v, axis = self._over_leg(sc, e)
        w = self._norm_param(sc, e, "weight", v, axis)
        b = self._norm_param(sc, e, "bias", v, axis)
        eps = self._number_kw(e, "eps")
        return V("layernorm", (v,), {"axis": axis, "weight": w, "bias": b, "eps": eps}, v.type, span=e.span)

    def _fn_rmsnorm(self, sc, e):
        v, axis = self._over_leg(sc, e)
        w = self._norm_param(sc, e, "weight", v, axis)
        eps = self._number_kw(e, "eps")
        return V("rmsnorm", (v,), {"axis": axis, "weight": w, "eps": eps}, v.type, span=e.span)

    def _fn_topk(self, sc, e):
        v, axis = self._over_leg(sc, e)
        k = self._number_kw(e, "k")
        if k is None:
            raise PenroseCheckError("topk needs k, as topk(x, u, k=32)", e.span)
        n = self.S.size(v.type.cls[axis])
        if k <= 0 or (n is not None and k > n):
            raise PenroseCheckError(f"topk: k={k} must be between 1 and the size of leg {v.legs[axis]!r} ({n})", e.span)
        self._baked(v.type.cls[axis])
        return V("topk", (v,), {"axis": axis, "k": k}, v.type, span=e.span)

    def _fn_topk_mask(self, sc, e):
        t = self._fn_topk(sc, e)
        return V("topk_mask", t.args, t.attrs, TType(t.type.legs, t.type.cls, "bool", t.type.batched), span=e.span)

    def _reduce(self, sc, e, x: V | None = None):
        v, axis = self._over_leg(sc, e, default_last=False, v=x)
        if e.func in ("max", "min", "mean") and self.S.size(v.type.cls[axis]) == 0:
            # torch's max (min) of no entries raises, its mean is nan
            raise PenroseCheckError(f"{e.func} over leg {v.legs[axis]!r}, which has size 0: there are no entries to reduce", e.span)
        legs = v.legs[:axis] + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + v.type.cls[axis + 1 :]
        return V("reduce", (v,), {"name": e.func, "axis": axis}, TType(legs, cls, "float", v.type.batched), span=e.span)

    def _fn_minmax(self, sc, e):
        """max(x, k) and min(x, k) over a leg of x (or dim=i); max(a, b) and min(a, b) of two
        operands entry by entry, a tensor and a tensor or a number, aligned as `+` aligns them."""
        x = self._expr(sc, e.args[0])
        second = e.args[1] if len(e.args) > 1 else None
        if second is None or e.kwarg("dim") is not None or (
                isinstance(second, ir.Name) and x.type.dtype != "scalar" and second.id in x.legs):
            return self._reduce(sc, e, x)
        literal = second.operand if isinstance(second, ir.Neg) else second
        if isinstance(literal, ir.Number) and isinstance(literal.value, int):
            n = format_expr(second)
            raise PenroseCheckError(f"{e.func}(x, {n}) is ambiguous: write {e.func}(x, dim={n}) for the {e.func}imum over leg {n}, "
                                    f"or {e.func}(x, {n}.0) for the {e.func}imum with the number, entry by entry", second.span)
        a, b = self._unambiguous(sc, x), self._unambiguous(sc, self._expr(sc, second))
        for v, node in ((a, e.args[0]), (b, second)):
            if v.type.dtype in ("bool", "int"):
                raise PenroseCheckError(f"{e.func}: {_describe(node)} must be a float tensor or a number", node.span)
        if a.type.dtype == b.type.dtype == "scalar":
            raise PenroseCheckError(f"{e.func} of two plain numbers; apply it to a tensor", e.span)
        legs, cls, align = self._align([a, b], [e.args[0], second], e.span, e.func)
        ty = TType(legs, cls, "float", a.type.batched or b.type.batched)
        return V("pair", (a, b), {"name": e.func, "align": align}, ty, span=e.span)

    def _fn_dropout(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        if len(e.args) == 2:
            if e.kwarg("p") is not None:
                raise PenroseCheckError("dropout: p is given twice, by position and as p=", e.kwarg("p").span)
            if not isinstance(e.args[1], ir.Number):
                raise PenroseCheckError("dropout: p must be a number", e.args[1].span)
            p = e.args[1].value
        else:
            p = self._number_kw(e, "p")
        if not 0 <= p < 1:
            raise PenroseCheckError(f"dropout: p={p} must be in [0, 1)", e.span)
        return V("dropout", (v,), {"p": p}, v.type, span=e.span)

    def _fn_detach(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        return V("detach", (v,), {}, v.type, span=e.span)

    def _fn_clamp(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        pos = [a for a in e.args[1:]]
        lo = hi = None
        if pos:
            for a in pos:
                if not isinstance(a, ir.Number):
                    raise PenroseCheckError("clamp bounds are numbers", a.span)
                self._literal_ok(a)
            lo = pos[0].value
            hi = pos[1].value if len(pos) > 1 else None
            for key, _node in zip(("min", "max"), pos):
                if e.kwarg(key) is not None:
                    raise PenroseCheckError(f"clamp: {key} is given twice, by position and as {key}=", e.kwarg(key).span)
        lo = self._number_kw(e, "min", lo)
        hi = self._number_kw(e, "max", hi)
        if lo is None and hi is None:
            raise PenroseCheckError("clamp needs min= or max=", e.span)
        if lo is not None and hi is not None and lo > hi:
            raise PenroseCheckError(f"clamp: min={lo} is above max={hi}", e.span)
        return V("clamp", (v,), {"min": lo, "max": hi}, v.type, span=e.span)

    def _fn_where(self, sc, e):
        m = self._expr(sc, e.args[0])
        if m.type.dtype != "bool":
            raise PenroseCheckError("where: the first argument must be a bool mask (a comparison, causal(t, p), or a bool input)", e.args[0].span)
        a, b = self._unambiguous(sc, self._expr(sc, e.args[1])), self._unambiguous(sc, self._expr(sc, e.args[2]))
        for v, x in ((a, e.args[1]), (b, e.args[2])):
            if v.type.dtype in ("bool", "int"):
                raise PenroseCheckError(f"where: {_describe(x)} must be a float tensor or a number", x.span)
        legs, cls, align = self._align([m, a, b], list(e.args), e.span, "where")
        batched = any(v.type.batched for v in (m, a, b))
        return V("where", (m, a, b), {"align": align}, TType(legs, cls, "float", batched), span=e.span)

    def _mask(self, sc, e, block):
        legs = []
        for a in e.args:
            if isinstance(a, ir.Name) and a.id not in self.dims:
                usage = f"{e.func} takes two dims, as {e.func}(t, p)"
                if a.id in sc.vars:
                    raise PenroseCheckError(f"{e.func}: {a.id!r} is a tensor, not a dim ({usage})", a.span)
                hint = suggest(a.id, self.dims) or f"; declare it with 'dim {a.id} = SIZE'"
                raise PenroseCheckError(f"{e.func}: undeclared dim {a.id!r}{hint} ({usage})", a.span)
            if not isinstance(a, ir.Name):
                raise PenroseCheckError(f"{e.func} takes two dims, as {e.func}(t, p)", a.span)
            legs.append(a.id)
        size = None
        if block:
            size = self._number_kw(e, "block")
            if size is None or size <= 0:
                raise PenroseCheckError("block_causal needs block=N with N > 0", e.span)
        cls = tuple(self.dims[l] for l in legs)
        return V("mask", (), {"kind": e.func, "block": size}, TType(tuple(legs), cls, "bool", False), span=e.span)

    def _fn_causal(self, sc, e):
        return self._mask(sc, e, False)

    def _fn_block_causal(self, sc, e):
        return self._mask(sc, e, True)

    def _fn_gather(self, sc, e):
        table = self._tensor_arg(sc, e, 0)
        ids = self._tensor_arg(sc, e, 1, allow=("int",))
        if table.type.batched:
            raise PenroseCheckError("gather: the table (first argument) must be a param or buffer without batch legs", e.args[0].span)
        if not table.legs:
            raise PenroseCheckError("gather: the table needs a leg to pick from", e.args[0].span)
        legs = ids.legs + table.legs[1:]
        cls = ids.type.cls + table.type.cls[1:]
        return V("gather", (table, ids), {}, TType(legs, cls, "float", ids.type.batched), span=e.span)

    def _leg_list(self, node, e, what):
        if not isinstance(node, ir.ListExpr) or not node.items or not all(isinstance(i, ir.Name) for i in node.items):
            raise PenroseCheckError(f"{e.func}: {what} is a list of dims, as [f, f]", getattr(node, "span", e.span))
        for i in node.items:
            if i.id not in self.dims:
                raise PenroseCheckError(f"{e.func}: undeclared dim {i.id!r}{suggest(i.id, self.dims)}", i.span)
        return [i.id for i in node.items]

    def _baked(self, *classes):
        """Legs whose sizes the statement relies on (split pieces, flatten groups, top-k's k): fixed
        at their declared sizes, so an input that carries one is checked against it at run time
        instead of being read as a new size."""
        for c in classes:
            if self.S.size(c) is not None:
                self.S.mark(c, fixed=True)

    def _fn_split(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        axis = self._leg_arg(v, e.args[1], e)
        parts = self._leg_list(e.args[2], e, "the parts")
        sizes = [self.S.size(self.dims[p]) for p in parts]
        total = self.S.size(v.type.cls[axis])
        if any(s is None for s in sizes):
            raise PenroseCheckError("split: every part's dim needs a size", e.args[2].span)
        if total is not None and sum(sizes) != total:
            raise PenroseCheckError(
                f"split: parts [{', '.join(parts)}] add up to {sum(sizes)} but leg {v.legs[axis]!r} has size {total}", e.span
            )
        outs = []
        for p in parts:
            legs = v.legs[:axis] + (p,) + v.legs[axis + 1 :]
            cls = v.type.cls[:axis] + (self.dims[p],) + v.type.cls[axis + 1 :]
            outs.append(TType(legs, cls, v.type.dtype, v.type.batched))
        self._baked(v.type.cls[axis], *(self.dims[p] for p in parts))
        return V("split", (v,), {"axis": axis, "sizes": tuple(sizes)}, outs[0], outs=tuple(outs), span=e.span)

    def _fn_concat(self, sc, e):
        if not isinstance(e.args[0], ir.ListExpr) or len(e.args[0].items) < 2:
            raise PenroseCheckError("concat takes a list of two or more tensors, as concat([a, b], f, f2)", e.args[0].span)
        parts = [self._expr(sc, x) for x in e.args[0].items]
        first = parts[0]
        for p, x in zip(parts, e.args[0].items):
            if p.type.dtype == "scalar":
                raise PenroseCheckError("concat: every part must be a tensor", x.span)
        axis = self._leg_arg(first, e.args[1], e)
        into = e.args[2]
        if not isinstance(into, ir.Name) or into.id not in self.dims:
            raise PenroseCheckError("concat: the third argument is the dim of the joined leg", into.span)
        total = 0
        for p, x in zip(parts, e.args[0].items):
            if len(p.legs) != len(first.legs):
                raise PenroseCheckError(f"concat: {_describe(x)} has {len(p.legs)} legs, the first part {len(first.legs)}", x.span)
            for j, (c1, c2) in enumerate(zip(first.type.cls, p.type.cls)):
                if j != axis:
                    self.S.unify(c1, c2, (f"concat: leg {first.legs[j]!r}", x.span))
            s = self.S.size(p.type.cls[axis])
            total = None if (s is None or total is None) else total + s
        c_into = self.dims[into.id]
        want = self.S.size(c_into)
        if total is not None and want is not None and total != want:
            raise PenroseCheckError(f"concat: the parts add up to {total} but dim {into.id!r} has size {want}", into.span)
        legs = first.legs[:axis] + (into.id,) + first.legs[axis + 1 :]
        cls = first.type.cls[:axis] + (c_into,) + first.type.cls[axis + 1 :]
        batched = any(p.type.batched for p in parts)
        self._baked(c_into, *(p.type.cls[axis] for p in parts))
        return V("concat", tuple(parts), {"axis": axis}, TType(legs, cls, first.type.dtype, batched), span=e.span)

    def _fn_unflatten(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        parts = self._leg_list(e.args[2], e, "the new legs")
        sizes = [self.S.size(self.dims[p]) for p in parts]
        total = self.S.size(v.type.cls[axis])
        if all(s is not None for s in sizes) and total is not None and math.prod(sizes) != total:
            raise PenroseCheckError(
                f"unflatten: [{', '.join(parts)}] hold {math.prod(sizes)} entries but leg {v.legs[axis]!r} has size {total}", e.span
            )
        if any(s is None for s in sizes):
            raise PenroseCheckError("unflatten: every new leg's dim needs a size", e.args[2].span)
        legs = v.legs[:axis] + tuple(parts) + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + tuple(self.dims[p] for p in parts) + v.type.cls[axis + 1 :]
        self._baked(v.type.cls[axis], *(self.dims[p] for p in parts))
        return V("unflatten", (v,), {"axis": axis, "sizes": tuple(sizes)}, TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_flatten(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        parts = []
        for node in e.args[1].items if isinstance(e.args[1], ir.ListExpr) else ():
            parts.append(self._leg_arg(v, node, e))
        if len(parts) < 2 or parts != list(range(parts[0], parts[0] + len(parts))):
            raise PenroseCheckError("flatten: give two or more adjacent legs in order, as flatten(x, [h, d], e)", e.args[1].span)
        into = e.args[2]
        if not isinstance(into, ir.Name) or into.id not in self.dims:
            raise PenroseCheckError("flatten: the third argument is the dim of the joined leg", into.span)
        sizes = [self.S.size(v.type.cls[i]) for i in parts]
        c_into = self.dims[into.id]
        want = self.S.size(c_into)
        if all(s is not None for s in sizes) and want is not None and math.prod(sizes) != want:
            raise PenroseCheckError(f"flatten: the legs hold {math.prod(sizes)} entries but dim {into.id!r} has size {want}", into.span)
        a, b = parts[0], parts[-1] + 1
        legs = v.legs[:a] + (into.id,) + v.legs[b:]
        cls = v.type.cls[:a] + (c_into,) + v.type.cls[b:]
        self._baked(c_into, *(v.type.cls[i] for i in parts))
        return V("flatten", (v,), {"start": a, "end": b - 1}, TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_rope(self, sc, e):
        v = self._tensor_arg(sc, e, 0)
        pos = self._leg_arg(v, e.args[1], e)
        axis = self._leg_arg(v, e.args[2], e)
        if pos == axis:
            raise PenroseCheckError("rope: the position leg and the rotated leg differ, as rope(q, t, d)", e.span)
        n = self.S.size(v.type.cls[axis])
        if n is not None and n % 2:
            raise PenroseCheckError(f"rope: leg {v.legs[axis]!r} has odd size {n}; rotate-half needs an even size", e.span)
        base = self._number_kw(e, "base")
        self._baked(v.type.cls[axis])
        return V("rope", (v,), {"pos": pos, "axis": axis, "base": float(base)}, v.type, span=e.span)

    # einops: rearrange, reduce, repeat -------------------------------------------------------------
    def _einop(self, sc, e: ir.Call) -> V:
        """einops' pattern language (penrose/einops_pattern.py) over the diagram's dims.

        The left side names the operand's legs in order (`...` the ones it skips); a group
        `(h d)` splits a leg into declared dims whose sizes multiply to the leg's; the right side
        gives the result's legs, a group merging legs into a declared dim (the one declared as
        that product, `dim hd = h * d`). Batch legs stay outermost, as in einsum; in `reduce` an
        ellipsis on the left only also reduces them."""
        kind = e.func
        x = self._tensor_arg(sc, e, 0, allow=("float",) if kind == "reduce" else ("float", "int", "bool"))
        node = e.args[1]
        if not isinstance(node, ir.String):
            raise PenroseCheckError(f"{kind}'s second argument is its pattern, as {kind}(x, 't (h d) -> h t d')", node.span)
        reduction = None
        if kind == "reduce":
            r = e.args[2] if len(e.args) > 2 else e.kwarg("reduction")
            if len(e.args) > 2 and e.kwarg("reduction") is not None:
                raise PenroseCheckError("reduce: the reduction is given twice, by position and as reduction=", e.kwarg("reduction").span)
            if r is None:
                raise PenroseCheckError("reduce needs its reduction: reduce(x, 't e -> e', 'mean') or reduction='mean'", e.span)
            if not isinstance(r, ir.String) or r.value not in REDUCTIONS:
                got = f" {r.value!r}" if isinstance(r, ir.String) else ""
                hint = suggest(r.value, REDUCTIONS) if isinstance(r, ir.String) else ""
                raise PenroseCheckError(
                    f"reduce: the reduction{got} is one of {', '.join(repr(n) for n in REDUCTIONS)}{hint}", r.span
                )
            reduction = r.value
        pat = parse_pattern(node.value, node.span, kind)

        def at(a, b=None):
            return spec_span(node.span, a, b)

        # einops' axis lengths, h=2: each a dim of the pattern; its size, checked (or given, to a dim without one)
        in_pattern = {a.name for side in (pat.left, pat.right) for a in side.axes() if a.name is not None}
        for k, v in e.kwargs:
            if k == "reduction" and kind == "reduce":
                continue
            if k not in in_pattern:
                raise PenroseCheckError(f"{kind}: {k}= names no leg of the pattern {node.value!r} (keywords give the "
                                        "sizes of its dims, as einops' axis lengths)", v.span)
            if k not in self.dims:
                hint = suggest(k, self.dims) or f"; declare it with 'dim {k} = SIZE'"
                raise PenroseCheckError(f"{kind}: unknown dim {k!r}{hint}", v.span)
            n = self._static(v, f"{kind}: {k}=", integer=True)
            have = self.S.size(self.dims[k])
            if have is not None and have != n:
                raise PenroseCheckError(f"{kind}: {k}={n}, but dim {k!r} has size {have}", v.span)
            if have is None:
                if n < 1:
                    raise PenroseCheckError(f"{kind}: {k}={n}: a size is at least 1", v.span)
                self.S.unify(self.dims[k], self.S.new(k, n, (f"{k}={n}", v.span)), (f"{kind}: {k}=", v.span))

        legs, lcls = x.legs, x.type.cls
        left, right = pat.left, pat.right
        named = len(left.groups) - (left.ellipsis is not None)
        if named > len(legs) or (left.ellipsis is None and named != len(legs)):
            raise PenroseCheckError(
                f"{kind}: the left side of the pattern has {named} leg(s){' and ...' if left.ellipsis is not None else ''} "
                f"but {_describe(e.args[0])} has {len(legs)}: [{', '.join(legs)}]",
                at(left.start, left.end),
            )
        axes: dict[str, tuple] = {}  # axis id -> (size class, leg name); '...0' ... for the ellipsis' legs
        left_groups: list[tuple] = []
        li = 0
        for gi, g in enumerate(left.groups):
            if gi == left.ellipsis:
                if g.paren:
                    raise PenroseCheckError(f"{kind}: '...' inside parentheses on the left", at(g.start, g.end))
                for j in range(len(legs) - named):
                    axes[f"...{j}"] = (lcls[li], legs[li])
                    left_groups.append((f"...{j}",))
                    li += 1
                continue
            leg, c = legs[li], lcls[li]
            li += 1
            if g.unit:
                n = self.S.size(c)
                if n is not None and n != 1:
                    raise PenroseCheckError(f"{kind}: {node.value[g.start:g.end]!r} is a leg of size 1, but leg {leg!r} has size {n}", at(g.start, g.end))
                self.S.unify(c, self.S.new("1", 1, ("a leg of size 1", at(g.start, g.end))), (f"{kind}: leg {leg!r}", at(g.start, g.end)))
                self._baked(c)  # squeezed: an input carrying it is checked to have size 1
                left_groups.append(())
                continue
            for a in g.axes:
                if a.name is not None:
                    self._pattern_dim(a, kind, at)
            names = g.names
            if len(names) == 1:
                self.S.unify(c, self.dims[names[0]], (f"{kind}: {names[0]!r} for leg {leg!r} of {_describe(e.args[0])}", at(g.start, g.end)))
                axes[names[0]] = (c, names[0])
            else:
                sizes = [self.S.size(self.dims[n]) for n in names]
                n = self.S.size(c)
                group_span = at(g.start, g.end)
                if sizes.count(None) == 1 and n is not None:  # one factor unknown: the leg's size over the others'
                    missing = names[sizes.index(None)]
                    known = math.prod(s for s in sizes if s is not None)
                    if known == 0 or n % known:
                        raise PenroseCheckError(
                            f"{kind}: leg {leg!r} of size {n} does not split into {node.value[g.start:g.end]} "
                            f"with the other sizes multiplying to {known}", group_span)
                    self.S.unify(self.dims[missing], self.S.new(missing, n // known, (f"dim {missing!r} (from the group)", group_span)),
                                 (f"{kind}: dim {missing!r}", group_span))
                    sizes = [self.S.size(self.dims[nm]) for nm in names]
                elif None not in sizes and n is None:  # a leg only inputs carry: the group fixes its size
                    self.S.unify(c, self.S.new(leg, _prod(sizes), (f"leg {leg!r} (split by the group)", group_span)),
                                 (f"{kind}: leg {leg!r}", group_span))
                    n = _prod(sizes)
                if None not in sizes and n is not None and _prod(sizes) != n:
                    raise PenroseCheckError(
                        f"{kind}: the group {node.value[g.start:g.end]} holds {' * '.join(map(str, sizes))} = {_prod(sizes)} "
                        f"entries but leg {leg!r} of {_describe(e.args[0])} has size {n}",
                        at(g.start, g.end),
                    )
                if sum(s is None for s in sizes) > 1 or (None in sizes and n is None):
                    missing = next(nm for nm, sz in zip(names, sizes) if sz is None)
                    raise PenroseCheckError(f"{kind}: dim {missing!r} in a group needs a size", at(g.start, g.end))
                for nm in names:
                    axes[nm] = (self.dims[nm], nm)
                self._baked(c, *(self.dims[nm] for nm in names))
            left_groups.append(names)

        if right.ellipsis is not None and left.ellipsis is None:
            g = right.groups[right.ellipsis]
            raise PenroseCheckError(f"{kind}: '...' on the right but not on the left", at(g.start, g.end))
        if left.ellipsis is not None and right.ellipsis is None and kind != "reduce":
            g = left.groups[left.ellipsis]
            raise PenroseCheckError(f"{kind}: '...' on the left but not on the right (only reduce drops legs)", at(g.start, g.end))
        right_groups: list[tuple[str, ...]] = []
        out_legs, out_cls, new = [], [], []
        for gi, g in enumerate(right.groups):
            if gi == right.ellipsis and not g.paren:  # `...`: the ellipsis' legs, each its own
                for aid in (a for a in axes if a.startswith("...")):
                    right_groups.append((aid,))
                    out_legs.append(axes[aid][1])
                    out_cls.append(axes[aid][0])
                continue
            ids: list[str] = []  # the group's axes: its names and, in `(...)` or `(a ...)`, the ellipsis' legs
            for a in g.axes:
                if a.ellipsis:
                    ids.extend(aid for aid in axes if aid.startswith("..."))
                    continue
                if a.name is None:
                    continue
                if a.name not in axes:
                    self._pattern_dim(a, kind, at)
                    if kind != "repeat":
                        hint = " (repeat adds legs)" if kind == "rearrange" else " (reduce only removes legs; repeat adds them)"
                        raise PenroseCheckError(f"{kind}: {a.name!r} is on the right but not on the left{hint}", at(a.start, a.end))
                    if self.S.size(self.dims[a.name]) is None:
                        raise PenroseCheckError(f"repeat: the new leg {a.name!r} needs a size", at(a.start, a.end))
                    axes[a.name] = (self.dims[a.name], a.name)
                    self._baked(self.dims[a.name])
                    new.append(a.name)
                ids.append(a.name)
            if not ids:  # `1`, `()` or an empty `(...)`: a new leg of size 1, named '1', as einops makes it
                right_groups.append(())
                out_legs.append("1")
                out_cls.append(self.S.new("1", 1, ("a leg of size 1", at(g.start, g.end))))
                continue
            if len(ids) == 1:
                out_legs.append(axes[ids[0]][1])
                out_cls.append(axes[ids[0]][0])
            else:
                merged = self._merged_dim([axes[a][1] for a in ids], [axes[a][0] for a in ids], kind, at(g.start, g.end))
                out_legs.append(merged)
                out_cls.append(self.dims[merged])
                self._baked(self.dims[merged], *(axes[a][0] for a in ids))
            right_groups.append(tuple(ids))
        kept = {a for grp in right_groups for a in grp}
        reduced = [a for grp in left_groups for a in grp if a not in kept]
        if reduced and kind != "reduce":
            first = reduced[0]
            where = next((a for a in left.axes() if a.name == first), None)
            label = axes[first][1] if first.startswith("...") else first
            span = at(where.start, where.end) if where is not None else at(left.start, left.end)
            raise PenroseCheckError(f"{kind}: {label!r} is on the left but not on the right (reduce removes legs)", span)
        if reduction in ("max", "min", "mean"):
            for a in reduced:
                if self.S.size(axes[a][0]) == 0:
                    raise PenroseCheckError(f"reduce: {reduction} over leg {axes[a][1]!r}, which has size 0: there are no entries to reduce", e.span)
        sum_batch = kind == "reduce" and left.ellipsis is not None and right.ellipsis is None and x.type.batched
        dtype = "float" if kind == "reduce" else x.type.dtype
        ty = TType(tuple(out_legs), tuple(out_cls), dtype, x.type.batched and not sum_batch)
        attrs = {
            "kind": kind, "pattern": node.value, "reduction": reduction,
            "left": tuple(left_groups), "right": tuple(right_groups),
            "axes": tuple((a, c, leg) for a, (c, leg) in axes.items()), "new": tuple(new), "reduced": tuple(reduced),
            "sum_batch": sum_batch,
        }
        return V("einop", (x,), attrs, ty, span=e.span)

    def _pattern_dim(self, a, kind, at):
        if a.name not in self.dims:
            hint = suggest(a.name, self.dims) or f"; declare it with 'dim {a.name} = SIZE'"
            raise PenroseCheckError(f"{kind}: unknown dim {a.name!r} in the pattern{hint}", at(a.start, a.end))

    def _merged_dim(self, names, classes, kind, span) -> str:
        """The declared dim a group of legs merges into: the one declared as their product in
        order (`dim hd = h * d`), else the one named by their names run together (`hd`), else
        the only dim of that size."""
        sizes = [self.S.size(c) for c in classes]
        group = "(" + " ".join(names) + ")"
        if None in sizes:
            raise PenroseCheckError(f"{kind}: every leg merged by {group} needs a size", span)
        total = _prod(sizes)
        for name, d in self.dim_decl.items():
            if _product_of(d.size) == tuple(names) and self.S.size(self.dims[name]) == total:
                return name
        joined = "".join(names)
        if joined in self.dims and self.S.size(self.dims[joined]) == total:
            return joined
        same = [n for n in self.dims if n not in names and self.S.size(self.dims[n]) == total]
        if len(same) == 1:
            return same[0]
        if same:
            raise PenroseCheckError(
                f"{kind}: {group} merges into a leg of size {total}, and dims {', '.join(same)} all have that size; "
                f"declare which: dim {joined} = {' * '.join(names)}",
                span,
            )
        raise PenroseCheckError(f"{kind}: {group} merges into a leg of size {total}; declare it: dim {joined} = {' * '.join(names)}", span)

    # select and slice ------------------------------------------------------------------------------
    def _fn_select(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        i = self._static(e.args[2], "select: the index", integer=True)
        n = self.S.size(v.type.cls[axis])
        if n is not None and not -n <= i < n:
            raise PenroseCheckError(f"select: index {i} is out of range for leg {v.legs[axis]!r} of size {n}", e.args[2].span)
        legs = v.legs[:axis] + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + v.type.cls[axis + 1 :]
        return V("select", (v,), {"axis": axis, "index": i}, TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    def _fn_slice(self, sc, e):
        v = self._tensor_arg(sc, e, 0, allow=("float", "int", "bool"))
        axis = self._leg_arg(v, e.args[1], e)
        leg = v.legs[axis]
        start = self._static(e.args[2], "slice: the start", integer=True)
        length_node = e.args[3]
        into = e.kwarg("into")
        if len(e.args) > 4:
            if into is not None:
                raise PenroseCheckError("slice: the result's dim is given twice, by position and as into=", into.span)
            into = e.args[4]
        if isinstance(length_node, ir.Name) and length_node.id in self.dims:
            length = self.S.size(self.dims[length_node.id])
            if length is None:
                raise PenroseCheckError(f"slice: dim {length_node.id!r} has no size", length_node.span)
            into = into or length_node
        else:
            length = self._static(length_node, "slice: the length", integer=True)
        if length < 0:
            raise PenroseCheckError(f"slice: the length must be at least 0, got {length}", length_node.span)
        if into is None:
            same = [d for d in self.dims if self.S.size(self.dims[d]) == length and self.S.find(self.dims[d]) != self.S.find(v.type.cls[axis])]
            if len(same) != 1:
                which = f"dims {', '.join(same)} all have size {length}" if same else f"no dim has size {length}"
                raise PenroseCheckError(
                    f"slice: {which}; name the result's leg: slice(x, {leg}, {start}, {length}, into=DIM)", e.span
                )
            into_name = same[0]
        else:
            if not isinstance(into, ir.Name) or into.id not in self.dims:
                raise PenroseCheckError("slice: the result's leg is a declared dim, as into=s", into.span)
            into_name = into.id
            size = self.S.size(self.dims[into_name])
            if size != length:
                raise PenroseCheckError(
                    f"slice: {length} indices do not fit dim {into_name!r} of size {size}", into.span
                )
        n = self.S.size(v.type.cls[axis])
        if n is not None:
            first = start + n if start < 0 else start
            if not 0 <= first <= n or first + length > n:
                raise PenroseCheckError(
                    f"slice: indices {start} to {start + length - 1} are outside leg {leg!r} of size {n}", e.span
                )
        self._baked(self.dims[into_name])
        legs = v.legs[:axis] + (into_name,) + v.legs[axis + 1 :]
        cls = v.type.cls[:axis] + (self.dims[into_name],) + v.type.cls[axis + 1 :]
        return V("slice", (v,), {"axis": axis, "start": start, "length": length}, TType(legs, cls, v.type.dtype, v.type.batched), span=e.span)

    # blocks ---------------------------------------------------------------------------------------
    def _block_call(self, sc, e: ir.Call) -> V:
        blk = self.blocks[e.func]
        blk_def = self.block_defs[e.func][0]
        ctx = getattr(self, "_stmt_ctx", None)
        if e.kwargs:
            raise PenroseCheckError("block arguments are positional", e.kwargs[0][1].span)
        formals = blk_def.formals
        if len(e.args) != len(formals):
            raise PenroseCheckError(f"block {e.func!r} takes {len(formals)} argument(s), got {len(e.args)}", e.span)
        args = [self._expr(sc, a) for a in e.args]
        for f, v, a in zip(formals, args, e.args):
            if v.type.dtype == "scalar":
                raise PenroseCheckError(f"block {e.func!r}: argument {f.name!r} must be a tensor", a.span)
            if v.type.dtype != f.dtype:
                raise PenroseCheckError(f"block {e.func!r}: argument {f.name!r} is {f.dtype}, got {_a(v.type.dtype)} tensor", a.span)
            if len(v.legs) != len(f.legs):
                raise PenroseCheckError(
                    f"block {e.func!r}: argument {f.name!r} has legs [{', '.join(f.legs)}] but {_describe(a)} has [{', '.join(v.legs)}]",
                    a.span,
                )
            for leg, c in zip(f.legs, v.type.cls):
                self.S.unify(self.dims[leg], c, (f"block {e.func!r} argument {f.name!r} leg {leg!r}", a.span))
        instance = e.func
        repeat = None
        if ctx is not None and ctx["assign"] is not None and ctx["assign"].value is e:
            instance = ctx["instance"] or e.func
            if ctx["repeat"] is not None:
                repeat = self._repeat_count(ctx["repeat"])
                if not args or len(blk.outputs) != 1:
                    raise PenroseCheckError(
                        "'repeat' chains a block with one result, fed back into its first argument "
                        "(the others reach every copy unchanged)", e.span)
                fin, fout = blk_def.formals[0], blk.outputs[0][1]
                if tuple(fin.legs) != tuple(fout.legs):
                    raise PenroseCheckError(
                        f"'repeat' feeds block {e.func!r}'s result [{', '.join(fout.legs)}] back into its argument [{', '.join(fin.legs)}]; their legs must match",
                        e.span,
                    )
        elif ctx is not None and ctx["instance"] is not None:
            instance = ctx["instance"]
        parts = instance.split(".")  # a dotted path (net.0, encoder.layer.3): the submodule's state-dict path
        for part in parts:
            if not part.isdigit():
                self._name_ok(part, e.span, "instance")
        head = parts[0]
        if head in sc.decls or (head in sc.vars and head not in sc.instances):
            raise PenroseCheckError(f"instance name {head!r} is already a tensor; name it with 'as NAME'", e.span)
        nested = next((o for o in sc.instances if o != instance and (o.startswith(instance + ".") or instance.startswith(o + "."))), None)
        if nested is not None:
            outer, inner = sorted((nested, instance), key=len)
            raise PenroseCheckError(
                f"instance {instance!r}: {outer!r} is a block instance and cannot also hold {inner!r} (a path's parts "
                "above its last are containers)", e.span, notes=(("the other instance", sc.instances[nested].span),))
        prev = sc.instances.get(instance)
        if prev is not None and (prev.block != e.func or prev.repeat != repeat):
            raise PenroseCheckError(
                f"instance {instance!r} is already a {'repeated ' if prev.repeat else ''}{prev.block!r} block; name this one with 'as NAME'",
                e.span,
                notes=(("first used here", prev.span),),
            )
        if prev is None:
            sc.instances[instance] = Instance(instance, e.func, repeat, e.span)
        sc.block_calls.append(instance)
        # results: a leg whose class is one of the formals' classes maps to the argument's class
        outs = []
        for _, t in blk.outputs:
            # batch legs come only from the arguments (a block body has no inputs of its own)
            outs.append(TType(t.legs, t.cls, t.dtype, t.batched and any(v.type.batched for v in args)))
        ty = outs[0] if len(outs) == 1 else TType((), (), "float", False)
        return V(
            "block",
            tuple(args),
            {"block": e.func, "instance": instance, "repeat": repeat},
            ty,
            outs=tuple(outs) if len(outs) > 1 else (),
            span=e.span,
        )

    def _repeat_count(self, node) -> int:
        """1 to LIMITS.repeat: the compiled module builds that many copies of the block."""
        n: int | None
        if isinstance(node, ir.Number) and isinstance(node.value, int):
            n, what = node.value, f"repeat count {node.value:,}"
        elif isinstance(node, ir.Name) and node.id in self.dims:
            n = self.S.size(self.dims[node.id])
            if n is None:
                raise PenroseCheckError(f"repeat count {node.id!r} needs a size of at least 1", node.span)
            what = f"repeat count {node.id!r} (size {n:,})"
        else:
            raise PenroseCheckError("repeat takes a whole number or a dim, as 'repeat 4' or 'repeat L'", node.span)
        if n < 1:
            raise PenroseCheckError(f"{what} must be at least 1", node.span)
        limit = LIMITS.value("repeat")
        if n > limit:
            raise PenroseCheckError(f"{what} is beyond the limit of {limit:,}; {Limits.how_to_raise('repeat')}", node.span)
        return n


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


def _evaluate(v: V, vals: list, at: str):
    """The value of a plain-number operation, as Python computes it in the generated module.

    `at` (' at d = 4') names the sizes the value was computed at, for the message."""
    span = v.span
    if v.op == "neg":
        return -vals[0]
    if v.op == "sfunc":
        (a,), name = vals, v.attrs["name"]
        if name == "sqrt":
            if a < 0:
                raise PenroseCheckError(f"sqrt of a negative number ({a:g}{at}); the result would not be real", span)
            return a**0.5  # the emitter's spelling of sqrt on a plain number
        if name == "log":
            if a == 0:
                raise PenroseCheckError(f"log of zero{at}; the result would be -inf", span)
            if a < 0:
                raise PenroseCheckError(f"log of a negative number ({a:g}{at}); the result would not be real", span)
        try:
            return OPS[name].call(a, ops.SCALAR)  # the row's form on a plain number
        except OverflowError:
            raise PenroseCheckError(f"{name}({a:g}){at} is beyond float32's range ({FLOAT32_MAX:.4g})", span) from None
    a, b = vals
    op = v.attrs["op"]
    if op in ("/", "//") and b == 0:
        raise PenroseCheckError(f"division by zero{at}", span)
    if op == "**":
        if a == 0 and b < 0:
            raise PenroseCheckError(f"zero to the negative power {b:g}{at} is a division by zero", span)
        if a < 0 and math.isfinite(b) and b != int(b):
            raise PenroseCheckError(f"a negative number ({a:g}) to the fractional power {b:g}{at}; the result would not be real", span)
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and b * math.log2(abs(a)) > 64:
            raise PenroseCheckError(f"{a} ** {b}{at} does not fit in 64 bits", span)  # refused before Python computes it
    try:
        value = _ARITHMETIC[op](a, b)
    except OverflowError:
        raise PenroseCheckError(f"this number{at} is beyond float32's range ({FLOAT32_MAX:.4g})", span) from None
    if isinstance(value, complex):  # pragma: no cover - every complex case is refused above
        raise PenroseCheckError(f"this number{at} would not be real", span)
    return value


_ARITHMETIC = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "**": lambda a, b: a**b,
}


def _amount(n: int) -> str:
    """1,048,576 below a quadrillion, 1e+24 beyond."""
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


def _bytes(n: int) -> str:
    """16 GiB, 1.5 TiB, 4e+24 bytes."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if n < 1024 * 2**60 else f"{n:.3g} bytes"
    return f"{n} bytes"


# the checker's type rules, by the names the table's rows give (ops.Op.rule)
TYPE_RULES = {
    "elementwise": _Checker._elementwise,
    "einsum": _Checker._fn_einsum,
    "softmax": _Checker._fn_softmax,
    "layernorm": _Checker._fn_layernorm,
    "rmsnorm": _Checker._fn_rmsnorm,
    "topk": _Checker._fn_topk,
    "topk_mask": _Checker._fn_topk_mask,
    "reduce": _Checker._reduce,
    "minmax": _Checker._fn_minmax,
    "dropout": _Checker._fn_dropout,
    "detach": _Checker._fn_detach,
    "clamp": _Checker._fn_clamp,
    "where": _Checker._fn_where,
    "causal": _Checker._fn_causal,
    "block_causal": _Checker._fn_block_causal,
    "gather": _Checker._fn_gather,
    "split": _Checker._fn_split,
    "concat": _Checker._fn_concat,
    "flatten": _Checker._fn_flatten,
    "unflatten": _Checker._fn_unflatten,
    "einop": _Checker._einop,
    "select": _Checker._fn_select,
    "slice": _Checker._fn_slice,
    "rope": _Checker._fn_rope,
}

_EINSUM_SPECS: dict = {}  # (spec, operand legs, batched) -> einsum_spec.Einsum, for specs read without error


class _Where:
    """'operand 2 'W' leg 'd'', formatted only when a message needs it."""

    __slots__ = ("i", "a", "leg")

    def __init__(self, i, a, leg):
        self.i, self.a, self.leg = i, a, leg

    def __str__(self):
        return f"operand {self.i + 1} {_describe(self.a)} leg {self.leg!r}"


class _Here:
    """The span of one leg's characters in the spec, built only when needed."""

    __slots__ = ("base", "at")

    def __init__(self, base, at):
        self.base, self.at = base, at

    @property
    def span(self):
        return spec_span(self.base, *self.at)


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
