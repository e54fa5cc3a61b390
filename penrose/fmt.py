"""IR → canonical `.pen` text. `format_diagram(parse(x))` is idempotent and keeps the meaning.

>>> from penrose.parser import parse
>>> print(format_diagram(parse("dim   e=3,f = 2\\ninput x[ e ]\\n\\n\\ny=x*2  # twice\\nlabel y 'doubled'\\noutput y")), end="")
dim e = 3, f = 2
input x[e]
<BLANKLINE>
y = x * 2   # twice
label y "doubled"
output y

The canonical form is the one the zoo and the paper's listings are written in:

- one statement per line, single spaces around `=` and binary operators, none inside brackets;
  `**` hugs simple operands (`asqn**0.5`, as the paper writes it; `(x + 1) ** 2` otherwise);
- dims declared together on one line (`dim f = 30, r = 1`) stay together (`Dim.grouped`), and
  so do consts (`const a = 1, b = 2.5`, `Const.grouped`);
- `h.detach()` and `detach(h)` stay as written (`Call.method`);
- numbers keep the spelling the author wrote (`1e-4`, `2.5e3`, `1e5`, `0.10`), made canonical
  only where two spellings read alike: `E` becomes `e`, an exponent loses its `+` and leading
  zeros (`1E+05` → `1e5`), a mantissa gets its missing zero (`.5` → `0.5`, `5.` → `5.0`) and
  loses leading ones (`007` → `7`); a number the formatter makes itself is written shortest
  (`1e-5`, not Python's `1e-05`);
- strings in expressions (einsum specs) take single quotes, `label` and `include` strings
  double quotes, unless the text holds that quote;
- a trailing comment (a note) sits `NOTE_GAP` spaces after its code; notes that the author
  aligned in one column within a paragraph (lines not parted by a blank line) stay aligned,
  `NOTE_GAP` spaces after the longest of their lines;
- blank lines stay where they are written (runs of them become one), never at the start or
  end of the file or of a block body; a block is parted from its neighbours by a blank line
  (before the comment lines that lead into it, if any);
- comment lines stay as written, `# ` and the text, indented with their block; every comment
  survives: one written inside a statement (between the arguments of a call broken over
  lines, inside a leg list) becomes a comment line before it, one after a block's `}` stays
  on that line;
- long sums and products print flat on one line, however many terms they have.

How each operation prints (operator precedence and associativity, `x.detach()`) is the table
`FORMAT`, keyed by the names of `penrose.ops.OPS`.

The layout choices (grouping, blank lines, note columns) are read from fields that IR equality
ignores, so a diagram built by hand formats with the defaults: one dim per line, no blank
lines but those around blocks, every note `NOTE_GAP` spaces after its code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from penrose import ir
from penrose.errors import NOWHERE
from penrose.ops import FUNCTIONS
from penrose.stack import deep, too_deep

DQ = '"'
NOTE_GAP = 3  # spaces before a trailing comment: what most zoo diagrams and paper listings use


# ---- how each operation prints: one entry per name of `penrose.ops.OPS` ------------------------


@dataclass(frozen=True)
class Infix:
    """A binary operator. `prec` is its level (Python's, as `ast.unparse` orders them); `assoc`
    says which operand may hold the same level without parentheses ('none': comparisons do not
    chain); `hug` prints it without spaces between simple operands (`asqn**0.5`)."""

    symbol: str
    prec: int
    assoc: str = "left"  # left | right | none
    hug: bool = False


@dataclass(frozen=True)
class Prefix:
    """A prefix operator (unary minus), at its precedence level."""

    symbol: str
    prec: int


@dataclass(frozen=True)
class CallForm:
    """A function: `f(args, key=value)`, positional arguments first and keywords as written
    (reordering them would change the IR, which compares keywords in order). `method` names the
    spelling `x.method()` that fmt keeps when the author wrote it so (`Call.method`)."""

    method: str | None = None


_COMPARE = 1
_UNARY = 4  # unary minus binds tighter than * and looser than **
_OPERATORS = {
    "+": Infix("+", 2), "-": Infix("-", 2),
    "*": Infix("*", 3), "/": Infix("/", 3), "//": Infix("//", 3),
    "**": Infix("**", 5, "right", hug=True),
    **{op: Infix(op, _COMPARE, "none") for op in ("<", "<=", ">", ">=", "==", "!=")},
}
FORMAT: dict = {
    **_OPERATORS,
    "neg": Prefix("-", _UNARY),
    **{name: CallForm() for name in sorted(FUNCTIONS)},
    "detach": CallForm(method="detach"),
}
_BLOCK_CALL = CallForm()  # a call of a block of the diagram: not an operation of the table


@deep
def format_expr(e, parent: int = 0) -> str:
    """One expression, with only the parentheses its meaning needs; long sums and products
    print flat (no recursion along a chain of the same operator level).

    >>> from penrose.parser import parse
    >>> format_expr(parse("y = a / (b * c) ** 0.5 + n**-2").body[0].value)
    'a / (b * c) ** 0.5 + n**-2'
    """
    try:
        return _expr(e, parent)
    except RecursionError:
        raise too_deep(getattr(e, "span", NOWHERE)) from None


def _expr(e, parent: int) -> str:
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.Number):
        text = _spelled(e)
        return f"({text})" if text.startswith("-") and parent > _UNARY else text
    if isinstance(e, ir.String):
        return _quote(e.value, "'")
    if isinstance(e, ir.ListExpr):
        return "[" + ", ".join(_expr(i, 0) for i in e.items) + "]"
    if isinstance(e, ir.Shape):
        return f"{e.tensor}.shape[{e.index}]"
    if isinstance(e, ir.Neg):
        rule = FORMAT["neg"]
        negative_number = isinstance(e.operand, ir.Number) and _num(e.operand.value).startswith("-")
        text = rule.symbol + _expr(e.operand, rule.prec + 1 if negative_number else rule.prec)
        return f"({text})" if parent > rule.prec else text
    if isinstance(e, ir.BinOp):
        return _binop(e, parent)
    if isinstance(e, ir.Call):
        form = FORMAT.get(e.func, _BLOCK_CALL)
        if form.method and e.method and len(e.args) == 1 and isinstance(e.args[0], ir.Name) and not e.kwargs:
            return f"{e.args[0].id}.{form.method}()"  # h.detach()
        args = [_expr(a, 0) for a in e.args] + [f"{k}={_expr(v, 0)}" for k, v in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    raise TypeError(f"cannot format {e!r}")


def _binop(e: ir.BinOp, parent: int) -> str:
    rule = FORMAT[e.op]
    p = rule.prec
    if rule.assoc == "right":  # `**`: the exponent is a unary expression
        text = _power_chain(e)
    elif rule.assoc == "none":  # `(a < b) == c` keeps its parentheses
        text = f"{_expr(e.left, p + 1)} {rule.symbol} {_expr(e.right, p + 1)}"
    else:  # a left-associative chain a + b - c + ...: walk its left spine, print it flat
        tail = []
        node: object = e
        while isinstance(node, ir.BinOp) and FORMAT[node.op].prec == p and FORMAT[node.op].assoc == "left":
            tail.append(node)
            node = node.left
        parts = [_expr(node, p)]
        for b in reversed(tail):
            parts.append(f" {FORMAT[b.op].symbol} {_expr(b.right, p + 1)}")
        text = "".join(parts)
    return f"({text})" if p < parent else text


def _power_chain(e: ir.BinOp) -> str:
    """`a ** b ** c ...`, walked down its right spine once (a chain of 5,000 powers formats in
    linear time: `_simple_exponent` asked at every level would walk the rest of it each time)."""
    chain = []
    node: object = e
    while isinstance(node, ir.BinOp) and node.op == e.op:
        chain.append(node)
        node = node.right
    rule = FORMAT[e.op]
    text = _expr(node, _UNARY)  # the last exponent
    hugs = _simple_exponent(node)  # whether `**` hugs the exponent below
    for b in reversed(chain):  # an inner `**` binds tighter than its unary context: no parentheses
        hug = rule.hug and _simple(b.left) and hugs
        text = f"{_expr(b.left, rule.prec + 1)}{rule.symbol if hug else f' {rule.symbol} '}{text}"
        hugs = _simple(b.left) and hugs
    return text


def _simple(e) -> bool:
    """An operand that `**` hugs: a name or a non-negative number (`asqn**0.5`)."""
    return isinstance(e, ir.Name) or (isinstance(e, ir.Number) and not _num(e.value).startswith("-"))


def _simple_exponent(e) -> bool:
    """An exponent that `**` hugs: a simple operand, negated or not, or a hugged power (`2**x**3`)."""
    if isinstance(e, ir.BinOp) and e.op == "**":
        return _simple(e.left) and _simple_exponent(e.right)
    return _simple(e) or isinstance(e, ir.Number) or (isinstance(e, ir.Neg) and _simple(e.operand))


_NUMBER = re.compile(r"(\d+)?(?:(\.)(\d*))?(?:[eE]([+-]?)(\d+))?\Z")


def _spelled(e: ir.Number) -> str:
    """A number as its author wrote it (read back from its span), made canonical as the module
    docstring says; `_num` of its value when the text is not at hand."""
    sp = e.span
    if sp.line and sp.end_line == sp.line and sp.source_line and sp.end_col > sp.col:
        m = _NUMBER.match(sp.source_line[sp.col - 1: sp.end_col - 1])
        if m and (m.group(1) or m.group(3)):
            whole, dot, frac, sign, exp = m.groups()
            text = (whole or "0").lstrip("0") or "0"
            if dot:
                text += "." + (frac or "0")
            if exp is not None:
                text += "e" + ("-" if sign == "-" else "") + (exp.lstrip("0") or "0")
            try:
                same = type(e.value) is (float if (dot or exp is not None) else int) and float(text) == e.value
            except OverflowError:
                same = False
            if same:
                return text
    return _num(e.value)


def _num(v) -> str:
    """A number as a person writes it: `1e-5`, not Python's `1e-05`."""
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):  # only an overflowing literal such as 1e999 reads as infinity
        return "1e999" if v > 0 else "-1e999"
    mantissa, e, exponent = repr(float(v)).partition("e")
    return f"{mantissa}e{int(exponent)}" if e else mantissa


def _quote(text: str, prefer: str) -> str:
    """`text` between `prefer` quotes, or the other kind when it holds one (there are no escapes)."""
    q = prefer if prefer not in text else ("'" if prefer == '"' else '"')
    return f"{q}{text}{q}"


def _legs(t: ir.Tensor) -> str:
    legs = (["..."] if t.batched else []) + list(t.legs)
    return "[" + ", ".join(legs) + "]"


def _init(i: ir.Init | None) -> str:
    if i is None:
        return ""
    if not i.kwargs:
        return f" ~ {i.name}"
    return f" ~ {i.name}(" + ", ".join(f"{k}={_expr(v, 0)}" for k, v in i.kwargs) + ")"


def _dim_item(s: ir.Dim | ir.Const) -> str:
    if isinstance(s, ir.Const):
        return f"{s.name} = {_expr(s.value, 0)}"
    return s.name + (f" = {_expr(s.size, 0)}" if s.size is not None else "")


def _code(s) -> str:
    """A one-line statement without its note."""
    if isinstance(s, ir.Comment):
        return f"# {s.text}".rstrip()
    if isinstance(s, ir.Dim):
        return f"dim {_dim_item(s)}"
    if isinstance(s, ir.Const):
        return f"const {_dim_item(s)}"
    if isinstance(s, ir.Tensor):
        dtype = f" : {s.dtype}" if s.dtype != "float" else ""
        return f"{s.kind} {s.name}{_legs(s)}{dtype}{_init(s.init)}{'' if s.saved else ' unsaved'}"
    if isinstance(s, ir.Assign):
        stated = f"[{', '.join(s.legs)}]" if s.legs is not None else ""
        text = f"{', '.join(s.targets)}{stated} = {_expr(s.value, 0)}"
        if s.repeat is not None:
            text += f" repeat {_expr(s.repeat, 0)}" + (" shared" if s.shared else "")
        if s.instance is not None:
            text += f" as {s.instance}"
        return text
    if isinstance(s, ir.Output):
        return f"output {', '.join(s.names)}"
    if isinstance(s, ir.Return):
        return f"return {', '.join(_expr(v, 0) for v in s.values)}"
    if isinstance(s, ir.Include):
        return f"include {_quote(s.path, DQ)}"
    if isinstance(s, ir.Label):
        return f"label {s.name} {_quote(s.text, DQ)}"
    if isinstance(s, ir.Block):
        formals = ", ".join(f"{f.name}{_legs(f)}" + (f" : {f.dtype}" if f.dtype != "float" else "") for f in s.formals)
        return f"block {s.name}({formals}) {{"
    raise TypeError(f"cannot format {s!r}")


def _with_note(code: str, note: str, width: int = 0) -> str:
    """`code`, then the note's '#' at column `width` + NOTE_GAP (or NOTE_GAP after the code)."""
    if not note:
        return code
    return code.ljust(width) + " " * NOTE_GAP + f"# {note}"


@deep
def format_stmt(s, indent: str = "") -> str:
    """One statement (a block spans several lines), with its note NOTE_GAP spaces after it.

    >>> from penrose.parser import parse
    >>> format_stmt(parse("dim e = 3\\nlabel e 'embedding'   # a leg").body[1])
    'label e "embedding"   # a leg'
    """
    return "\n".join(_body((s,), indent))


@deep
def format_diagram(d: ir.Diagram) -> str:
    """The whole diagram in canonical form (the module docstring lists the rules).

    Every comment survives: the parser makes a comment written inside a statement (between the
    arguments of a call broken over lines, inside a leg list) a comment line before it, and
    one after a block's `}` stays on that line.

    >>> from penrose.parser import parse
    >>> print(format_diagram(parse("dim e = 2\\ny = einsum('e->e',  # spec\\n  x)  # y")), end="")
    dim e = 2
    # spec
    y = einsum('e->e', x)   # y
    """
    if not isinstance(d, ir.Diagram):  # text is parsed first: format_diagram(parse(text))
        from penrose.errors import PenroseArgumentError

        hint = "; parse .pen text first: penrose.format_diagram(penrose.parse(text))" if isinstance(d, str) else ""
        raise PenroseArgumentError(f"format_diagram takes a parsed Diagram, got {type(d).__name__}{hint}")
    return "\n".join(_body(d.body, "")) + "\n"


@dataclass
class _Row:
    """One output line: its code, its note, the column the author wrote the note at (0: not
    known), and the width the code is padded to before the note's NOTE_GAP."""

    code: str
    note: str = ""
    written: int = 0
    width: int = 0


def _body(stmts, indent: str) -> list[str]:
    """The lines of a sequence of statements (a diagram or a block body)."""
    stmts = tuple(stmts)
    rows: list = []  # a _Row, None for a blank line, or a block's already indented lines (a list)
    prev, end = None, 0  # the statement before, the last source line seen so far
    for i, s in enumerate(stmts):
        if _closes(stmts, i):
            continue  # printed on the `}` line of the block before it
        if isinstance(s, (ir.Dim, ir.Const)) and s.grouped and not s.note and type(prev) is type(s) and isinstance(rows[-1], _Row):
            rows[-1].code += f", {_dim_item(s)}"  # `dim f = 30, r = 1` (and `const a = 1, b = 2`) stays one line
        else:
            if prev is not None and (_blank_between(prev, end, s, _start(stmts, i)) or _parts_block(prev, stmts, i)):
                rows.append(None)
            try:
                code = _code(s)
            except RecursionError:
                raise too_deep(s.span) from None
            if isinstance(s, ir.Block):
                close = indent + "}"
                if i + 1 < len(stmts) and _closes(stmts, i + 1):
                    close = _with_note(close, stmts[i + 1].text)
                rows.append([indent + _with_note(code, s.note)] + _body(s.body, indent + "  ") + [close])
            else:
                rows.append(_Row(indent + code, getattr(s, "note", ""), getattr(s, "note_span", NOWHERE).col))
        if prev is None or s.span.file != prev.span.file:
            end = 0
        end = max(end, s.span.end_line)
        prev = s
    _align_notes(rows)
    out: list[str] = []
    for r in rows:
        if isinstance(r, list):
            out.extend(r)
        elif r is None:
            out.append("")
        else:
            out.append(_with_note(r.code, r.note, r.width))
    return out


def _closes(stmts, i: int) -> bool:
    """Whether statement `i` is the comment written after the `}` of the block before it."""
    s = stmts[i]
    if not (i and isinstance(s, ir.Comment) and isinstance(stmts[i - 1], ir.Block)):
        return False
    b = stmts[i - 1].span
    return bool(s.span.line and s.span.file == b.file and s.span.line == b.end_line)


def _start(stmts, i: int) -> int:
    """The line statement `i` starts at, for blank lines: a comment written inside the
    statement after it (the parser puts such comments before it) counts from that statement."""
    s = stmts[i]
    if isinstance(s, ir.Comment):
        j = i + 1
        while j < len(stmts) and isinstance(stmts[j], ir.Comment):
            j += 1
        if j < len(stmts):
            t = stmts[j].span
            if t.file == s.span.file and t.line < s.span.line <= t.end_line:
                return t.line
    return s.span.line


def _blank_between(prev, end: int, s, line: int) -> bool:
    """Whether the author left a blank line before `s`, which starts at `line` (known from the
    spans: `end` is the last line of the statements before it)."""
    a, b = prev.span, s.span
    return bool(a.line and line and a.file == b.file and line > end + 1)


def _parts_block(prev, stmts, i: int) -> bool:
    """A blank line goes after a block, and before a block with the comment lines that lead into it."""
    if isinstance(prev, ir.Block):
        return True
    if isinstance(prev, ir.Comment):
        return False  # inside a run of comment lines, or a block right after its comments
    j = i
    while j < len(stmts) and isinstance(stmts[j], ir.Comment):
        j += 1
    return j < len(stmts) and isinstance(stmts[j], ir.Block)


def _align_notes(rows: list) -> None:
    """Set each row's width: notes the author aligned stay aligned, the others follow their code.

    Within a paragraph (rows not parted by a blank line or a block), notes written at the same
    column, two or more of them, are padded to the longest of their lines; any other note sits
    NOTE_GAP spaces after its own code. The new column depends only on the formatted code and
    on which notes shared a column, so formatting twice gives the same text.
    """
    paragraph: list[_Row] = []
    for r in rows + [None]:
        if isinstance(r, _Row):
            paragraph.append(r)
            continue
        groups: dict[int, list[_Row]] = {}
        for row in paragraph:
            row.width = len(row.code)
            if row.note and row.written:
                groups.setdefault(row.written, []).append(row)
        for group in groups.values():
            if len(group) > 1:
                width = max(row.width for row in group)
                for row in group:
                    row.width = width
        paragraph = []
