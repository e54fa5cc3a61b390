"""IR → canonical `.pen` text. `format_diagram(parse(x))` is idempotent and keeps the meaning.

>>> from penrose.parse import parse
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
- dims declared together on one line (`dim f = 30, r = 1`) stay together (`Dim.grouped`);
- `h.detach()` and `detach(h)` stay as written (`Call.method`);
- strings in expressions (einsum specs) take single quotes, `label` and `include` strings
  double quotes, unless the text holds that quote;
- a trailing comment (a note) sits `NOTE_GAP` spaces after its code; notes that the author
  aligned in one column within a paragraph (lines not parted by a blank line) stay aligned,
  `NOTE_GAP` spaces after the longest of their lines;
- blank lines stay where they are written (runs of them become one), never at the start or
  end of the file or of a block body; a block is parted from its neighbours by a blank line
  (before the comment lines that lead into it, if any);
- comment lines stay as written, `# ` and the text, indented with their block.

The layout choices (grouping, blank lines, note columns) are read from fields that IR equality
ignores, so a diagram built by hand formats with the defaults: one dim per line, no blank
lines but those around blocks, every note `NOTE_GAP` spaces after its code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from penrose import ir
from penrose.errors import NOWHERE

DQ = '"'
NOTE_GAP = 3  # spaces before a trailing comment: what most zoo diagrams and paper listings use

_PREC = {"<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1, "+": 2, "-": 2, "*": 3, "/": 3, "//": 3, "**": 5}
_UNARY = 4  # unary minus binds tighter than * and looser than **


def format_expr(e, parent: int = 0, right: bool = False) -> str:
    """One expression, with only the parentheses its meaning needs.

    >>> from penrose.parse import parse
    >>> format_expr(parse("y = a / (b * c) ** 0.5 + n**-2").body[0].value)
    'a / (b * c) ** 0.5 + n**-2'
    """
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.Number):
        text = _num(e.value)
        return f"({text})" if text.startswith("-") and parent > _UNARY else text
    if isinstance(e, ir.String):
        return _quote(e.value, "'")
    if isinstance(e, ir.ListExpr):
        return "[" + ", ".join(format_expr(i) for i in e.items) + "]"
    if isinstance(e, ir.Shape):
        return f"{e.tensor}.shape[{e.index}]"
    if isinstance(e, ir.Neg):
        negative_number = isinstance(e.operand, ir.Number) and _num(e.operand.value).startswith("-")
        text = "-" + format_expr(e.operand, _UNARY + 1 if negative_number else _UNARY)
        return f"({text})" if parent > _UNARY else text
    if isinstance(e, ir.BinOp):
        p = _PREC[e.op]
        if e.op == "**":  # right-associative; the exponent is a unary expression
            left, right_ = format_expr(e.left, p + 1), format_expr(e.right, _UNARY)
            op = "**" if _simple(e.left) and _simple_exponent(e.right) else " ** "
            text = f"{left}{op}{right_}"
        else:
            text = f"{format_expr(e.left, p)} {e.op} {format_expr(e.right, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, ir.Call):
        if e.method and len(e.args) == 1 and isinstance(e.args[0], ir.Name) and not e.kwargs:  # h.detach()
            return f"{e.args[0].id}.detach()"
        args = [format_expr(a) for a in e.args] + [f"{k}={format_expr(v)}" for k, v in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    raise TypeError(f"cannot format {e!r}")


def _simple(e) -> bool:
    """An operand that `**` hugs: a name or a non-negative number (`asqn**0.5`)."""
    return isinstance(e, ir.Name) or (isinstance(e, ir.Number) and not _num(e.value).startswith("-"))


def _simple_exponent(e) -> bool:
    """An exponent that `**` hugs: a simple operand, negated or not, or a hugged power (`2**x**3`)."""
    if isinstance(e, ir.BinOp) and e.op == "**":
        return _simple(e.left) and _simple_exponent(e.right)
    return _simple(e) or isinstance(e, ir.Number) or (isinstance(e, ir.Neg) and _simple(e.operand))


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
    return f" ~ {i.name}(" + ", ".join(f"{k}={format_expr(v)}" for k, v in i.kwargs) + ")"


def _dim_item(s: ir.Dim) -> str:
    return s.name + (f" = {format_expr(s.size)}" if s.size is not None else "")


def _code(s) -> str:
    """A one-line statement without its note."""
    if isinstance(s, ir.Comment):
        return f"# {s.text}".rstrip()
    if isinstance(s, ir.Dim):
        return f"dim {_dim_item(s)}"
    if isinstance(s, ir.Tensor):
        dtype = f" : {s.dtype}" if s.dtype != "float" else ""
        return f"{s.kind} {s.name}{_legs(s)}{dtype}{_init(s.init)}"
    if isinstance(s, ir.Assign):
        text = f"{', '.join(s.targets)} = {format_expr(s.value)}"
        if s.repeat is not None:
            text += f" repeat {format_expr(s.repeat)}"
        if s.instance is not None:
            text += f" as {s.instance}"
        return text
    if isinstance(s, ir.Output):
        return f"output {', '.join(s.names)}"
    if isinstance(s, ir.Return):
        return f"return {', '.join(format_expr(v) for v in s.values)}"
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


def format_stmt(s, indent: str = "") -> str:
    """One statement (a block spans several lines), with its note NOTE_GAP spaces after it.

    >>> from penrose.parse import parse
    >>> format_stmt(parse("dim e = 3\\nlabel e 'embedding'   # a leg").body[1])
    'label e "embedding"   # a leg'
    """
    return "\n".join(_body((s,), indent))


def format_diagram(d: ir.Diagram) -> str:
    """The whole diagram in canonical form (the module docstring lists the rules)."""
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
        if isinstance(s, ir.Dim) and s.grouped and not s.note and isinstance(prev, ir.Dim) and isinstance(rows[-1], _Row):
            rows[-1].code += f", {_dim_item(s)}"  # `dim f = 30, r = 1` stays one line
        else:
            if prev is not None and (_blank_between(prev, end, s) or _parts_block(stmts, i)):
                rows.append(None)
            if isinstance(s, ir.Block):
                rows.append([indent + _with_note(_code(s), s.note)] + _body(s.body, indent + "  ") + [indent + "}"])
            else:
                rows.append(_Row(indent + _code(s), getattr(s, "note", ""), getattr(s, "note_span", NOWHERE).col))
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


def _blank_between(prev, end: int, s) -> bool:
    """Whether the author left a blank line before `s` (known from the spans: `end` is the last
    line of the statements before it, a comment inside a call's brackets included)."""
    a, b = prev.span, s.span
    return bool(a.line and b.line and a.file == b.file and b.line > end + 1)


def _parts_block(stmts, i: int) -> bool:
    """A blank line goes after a block, and before a block with the comment lines that lead into it."""
    if isinstance(stmts[i - 1], ir.Block):
        return True
    if isinstance(stmts[i - 1], ir.Comment):
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
