"""IR → canonical `.pen` text. `format_diagram(parse(x))` is idempotent and keeps the meaning.

>>> from penrose.parse import parse
>>> print(format_diagram(parse("dim   e=3\\ninput x[ e ]\\ny=x*2  # twice\\noutput y")), end="")
dim e = 3
input x[e]
y = x * 2  # twice
output y
"""

from __future__ import annotations

from penrose import ir

_PREC = {"<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1, "+": 2, "-": 2, "*": 3, "/": 3, "//": 3, "**": 5}


def format_expr(e, parent: int = 0, right: bool = False) -> str:
    """One expression, with only the parentheses its meaning needs."""
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.Number):
        return _num(e.value)
    if isinstance(e, ir.String):
        q = "'" if "'" not in e.value else '"'
        return f"{q}{e.value}{q}"
    if isinstance(e, ir.ListExpr):
        return "[" + ", ".join(format_expr(i) for i in e.items) + "]"
    if isinstance(e, ir.Shape):
        return f"{e.tensor}.shape[{e.index}]"
    if isinstance(e, ir.Neg):
        text = "-" + format_expr(e.operand, 4)
        return f"({text})" if parent > 4 else text
    if isinstance(e, ir.BinOp):
        p = _PREC[e.op]
        if e.op == "**":  # right-associative
            text = f"{format_expr(e.left, p + 1)} ** {format_expr(e.right, p)}"
        else:
            text = f"{format_expr(e.left, p)} {e.op} {format_expr(e.right, p + 1)}"
        return f"({text})" if p < parent else text
    if isinstance(e, ir.Call):
        if e.func == "detach" and len(e.args) == 1 and isinstance(e.args[0], ir.Name) and not e.kwargs:
            return f"{e.args[0].id}.detach()"
        args = [format_expr(a) for a in e.args] + [f"{k}={format_expr(v)}" for k, v in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    raise TypeError(f"cannot format {e!r}")


def _num(v) -> str:
    if isinstance(v, int):
        return str(v)
    text = repr(float(v))
    return text


def _legs(t: ir.Tensor) -> str:
    legs = (["..."] if t.batched else []) + list(t.legs)
    return "[" + ", ".join(legs) + "]"


def _init(i: ir.Init | None) -> str:
    if i is None:
        return ""
    if not i.kwargs:
        return f" ~ {i.name}"
    return f" ~ {i.name}(" + ", ".join(f"{k}={format_expr(v)}" for k, v in i.kwargs) + ")"


def format_stmt(s, indent: str = "") -> str:
    """One statement (a block spans several lines)."""
    note = f"  # {s.note}" if getattr(s, "note", "") else ""
    if isinstance(s, ir.Comment):
        return f"{indent}# {s.text}".rstrip()
    if isinstance(s, ir.Dim):
        size = f" = {format_expr(s.size)}" if s.size is not None else ""
        return f"{indent}dim {s.name}{size}{note}"
    if isinstance(s, ir.Tensor):
        dtype = f" : {s.dtype}" if s.dtype != "float" else ""
        return f"{indent}{s.kind} {s.name}{_legs(s)}{dtype}{_init(s.init)}{note}"
    if isinstance(s, ir.Assign):
        text = f"{', '.join(s.targets)} = {format_expr(s.value)}"
        if s.repeat is not None:
            text += f" repeat {format_expr(s.repeat)}"
        if s.instance is not None:
            text += f" as {s.instance}"
        return f"{indent}{text}{note}"
    if isinstance(s, ir.Output):
        return f"{indent}output {', '.join(s.names)}{note}"
    if isinstance(s, ir.Return):
        return f"{indent}return {', '.join(format_expr(v) for v in s.values)}{note}"
    if isinstance(s, ir.Include):
        return f"{indent}include {format_expr(ir.String(s.path))}{note}"
    if isinstance(s, ir.Label):
        return f"{indent}label {s.name} {format_expr(ir.String(s.text))}{note}"
    if isinstance(s, ir.Block):
        formals = ", ".join(f"{f.name}{_legs(f)}" + (f" : {f.dtype}" if f.dtype != "float" else "") for f in s.formals)
        lines = [f"{indent}block {s.name}({formals}) {{{note}"]
        lines += [format_stmt(b, indent + "  ") for b in s.body]
        lines.append(f"{indent}}}")
        return "\n".join(lines)
    raise TypeError(f"cannot format {s!r}")


def format_diagram(d: ir.Diagram) -> str:
    """The whole diagram in canonical form (one statement per line, blank line around blocks)."""
    out: list[str] = []
    prev = None
    for s in d.body:
        if isinstance(s, ir.Block) and out and out[-1] != "":
            out.append("")
        elif prev is not None and isinstance(prev, ir.Block):
            out.append("")
        elif isinstance(s, ir.Comment) and s.step is not None and out and out[-1] != "":
            out.append("")
        out.append(format_stmt(s))
        prev = s
    return "\n".join(out) + "\n"
