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
  counted) in `LIMITS.total_bytes`; a `repeat` count is 1 to `LIMITS.repeat`; block calls nest
  at most `LIMITS.block_depth` deep; one call of the diagram runs at most `LIMITS.expanded`
  statements, each block body counted once per run (repeats and nesting multiplied).
- dtypes: integer ids only where ids are expected (gather), bool masks only in where().
- values: init arguments are finite, std and gain at least 0, uniform's a at most b; keyword
  values follow the table of operations (eps > 0, 0 <= p < 1, ...), each given once; every
  plain-number expression is evaluated at the declared sizes and must be a real number torch
  accepts: no sqrt or log of a number <= 0 (sqrt of 0 is fine), no negative number to a
  fractional power, no division by zero, nothing beyond float32's range or 64 bits.
- usage: inputs and params never used give warnings, not errors.

The checker's parts, one job a module: this module (`check`, and `_Checker`: declarations and
scope, that is dims, consts, tensors, includes, bodies, and the size budgets),
`penrose.check_exprs` (expressions: assignments, arithmetic and alignment, calls, plain-number
folding, block calls), `penrose.check_ops` (the per-op type rules, `TYPE_RULES`),
`penrose.check_einops` (einops patterns, beside their reader `penrose.einops_pattern`),
`penrose.check_base` (the state and scope they share, small helpers); `_Checker` is the first
with the other three mixed in. Its tables and records: `penrose.tables` (reserved names, inits,
dtypes, number ranges, LIMITS), `penrose.sizes` (the size classes it unifies), `penrose.checked`
(the records it returns, with their invariants), `penrose.blocks` (the block call graph: no
recursion, callees first), `penrose.einsum_spec` (einsum specs), `penrose.reading` (where
includes may reach). This module re-exports the names others import from it.

Imports neither torch nor any renderer.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from penrose import ir, ops
from penrose.blocks import order as block_order
from penrose.check_base import _is_inf, _name_nodes, _names, _prod, _Scope
from penrose.check_einops import _Einops
from penrose.check_exprs import _Exprs
from penrose.check_ops import TYPE_RULES, _Ops
from penrose.checked import SCALAR, Checked, CStmt, Decl, Instance, TType, V
from penrose.reading import file_key
from penrose.attrs import BlockCall, Ref
from penrose.errors import PenroseCheckError, Span, suggest
from penrose.sizes import Sizes
from penrose.stack import deep, too_deep
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
from penrose.views import legend_warnings, values
from penrose.check_hints import later_assignment

if TYPE_CHECKING:
    from penrose.reading import Includes

# the names other modules and tests import from here: the checked IR, the tables, the checker
__all__ = [
    "CStmt", "Checked", "DTYPES", "Decl", "FLOAT32_MAX", "FUNCTIONS", "GENERATED", "IDENT", "INITS", "INT64_MAX",
    "Instance", "LIMITS", "Limits", "MODULE_ATTRS", "PEN_KEYWORDS", "SCALAR", "Sizes", "TType", "TYPE_RULES", "V",
    "check",
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



class _Checker(_Exprs, _Ops, _Einops):
    """One diagram's check: declarations and scope (dims, consts, tensors, includes, bodies) and the size
    budgets here; expressions (`_Exprs`), per-op type rules (`_Ops`) and einops patterns (`_Einops`) beside."""

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
        self.dim_named_refs: dict[int, V] = {}  # id(V) -> V: reads of a computed tensor named like a dim
        self.constants: dict[str, tuple] = {}  # const name -> (value, declaration span)
        self.relabels: list = []  # einsum output letters that rename the leg they take (penrose.check_ops)
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
        try:
            for name in block_order({n: blk for n, (blk, _) in self.block_defs.items()}):  # callees first
                blk, _ = self.block_defs[name]
                self.blocks[name] = self._check_body(blk.name, blk.body, blk.formals, is_block=True, span=blk.span)
            result = self._check_body(self.diagram.name, top, (), is_block=False, span=Span(self.file))
        except PenroseCheckError as err:  # placed at an einsum output letter that caused it (check_ops)
            raise self._blame_letter(err) from None
        found = self.warnings + list(legend_warnings(self.diagram)) + result.warnings
        result.warnings = sorted(found, key=lambda w: (w[1].file != self.file, w[1].line, w[1].col))  # in file order
        self._allocations_ok([self.blocks[n] for n in self.block_defs] + [result])
        self._total_ok(result)
        self._expanded_ok(result)
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
            return own + sum(block_entries(i.block) * i.copies for i in body.instances.values())

        def block_entries(name: str) -> int:
            if name not in per_block:
                per_block[name] = entries(self.blocks[name])
            return per_block[name]

        total = 0
        items = [(self._entries(d), f"{d.tensor.kind} {d.tensor.name!r}", d.tensor.span) for d in top.params + top.buffers]
        items += [
            (block_entries(i.block) * i.copies, f"{i.name!r} (block {i.block!r}" + (f" × {i.repeat:,})" if i.copies > 1 else ")"), i.span)
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

    def _expanded_ok(self, top: Checked):
        """One call of the diagram runs at most LIMITS.expanded statements, a block's body counted
        once per run: refused at the `repeat` (or the call) that takes the count past it."""
        limit = LIMITS.value("expanded")
        runs: dict[str, int] = {}  # block -> statements one run of it takes, its own calls expanded
        for name, body in self.blocks.items():  # callees first
            runs[name] = self._expanded(body, runs, limit, name)
        self._expanded(top, runs, limit, None)

    @staticmethod
    def _expanded(body: Checked, runs: dict[str, int], limit: int, name: str | None) -> int:
        total = 0
        for s in body.stmts:
            if s.value is None:
                continue
            total += 1
            for v in values(s.value):
                if v.op != "block":
                    continue
                call = v.of(BlockCall)
                times = call.repeat or 1
                total += times * runs[call.block]
                if total > limit:
                    each = runs[call.block]
                    count = f"{times:,} runs of block {call.block!r}" if call.repeat else f"block {call.block!r}"
                    where = f"block {name!r}" if name else "the diagram"
                    repeat = s.stmt.repeat if isinstance(s.stmt, ir.Assign) and call.repeat else None
                    raise PenroseCheckError(
                        f"{count} ({each:,} statement{'s' if each != 1 else ''} a run, its block calls expanded) make one "
                        f"run of {where} {total:,} statements, beyond the limit of {limit:,} (a repeated block is built "
                        f"once per repeat, and every statement runs on each call); {Limits.how_to_raise('expanded')}",
                        repeat.span if repeat is not None else v.span,
                    )
        return total

    # -- pass 1: dims and blocks (of this file and its includes)
    def _collect(self, diagram: ir.Diagram) -> list:
        # real paths: a cycle through a symlinked file or folder is still a cycle
        path = file_key(diagram.file)
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
        if file_key(target) in self.including:
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
        known = v.const
        if known is None:
            raise PenroseCheckError(f"{what} reads a size known only at run time; give the dim a size", getattr(node, "span", self.at))
        value = known.value
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
            {n: value for n, (value, _) in self.constants.items()},
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
            name = v.of(Ref).name
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
            elif not hint:
                later = later_assignment(name, span, [self.diagram.body, *(b.body for b, _ in self.block_defs.values())])
                hint = (f"; it is assigned on line {later}, below this use: move that statement above it" if later else
                        f"; declare it ('input {name}[...]', 'param {name}[...]') or assign it ('{name} = ...') above this line")
            raise PenroseCheckError(f"unknown tensor {name!r}{hint}", span)
        sc.used.add(name)
        return sc.vars[name]



def _amount(n: int) -> str:
    """1,048,576 below a quadrillion, 1e+24 beyond."""
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


def _bytes(n: int) -> str:
    """16 GiB, 1.5 TiB, 4e+24 bytes."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if n < 1024 * 2**60 else f"{n:.3g} bytes"
    return f"{n} bytes"
