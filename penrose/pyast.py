"""Python trees for generated source: expressions printed with Python's own precedence, whole
modules printed with line numbers.

The compiler builds every expression it emits as an `ast` tree and prints it with
`ast.unparse`, which parenthesises a child exactly when its precedence is lower than its
context requires (CPython's own levels). No emitted text depends on what stands next to it.

Statements, methods, classes and the module are `ast` nodes too (`assign`, `function`,
`class_`, `module`, ...), printed by `print_module`: one statement a line, four spaces a level,
each expression by `ast.unparse`. The printer writes each statement's `lineno` and
`end_lineno` into the tree as it goes, so what a statement became is read from its node (the
compiler's source map). `ast` keeps no comments, so comments are nodes of their own (`Comment`,
a line) or ride on a statement (`commented`, after it on its line); `Verbatim` is penrose's own
source inlined as written, `spaced` asks for blank lines before a statement and `tagged` marks
where a statement comes from.
Two traps of `ast.unparse` are avoided here: a negative number is built as unary minus of a
non-negative constant (`ast.Constant(-2) ** 2` would print as `-2 ** 2`), and infinities are
`torch.inf` rather than `1e309`.

A statement longer than `LINE_LENGTH` (the project's) is printed wrapped inside its brackets,
as black would: a call's arguments on a line of their own, else one a line; a sum one operand a
line; a long comment between words. Deep trees are flattened by `Hoister`: a sub-expression nested deeper than `MAX_DEPTH` becomes
a temporary (`_1 = ...`) emitted before the statement, so a 10,000-term sum or 1,000 nested
calls produce code that Python's parser and compiler accept.

>>> unparse(binop("**", call(path("torch.tanh"), name("x")), const(2)))
'torch.tanh(x) ** 2'
>>> unparse(binop("**", const(-2), const(2)))
'(-2) ** 2'
>>> print(print_module(module([function("f", arguments(["x"]), [commented(return_(binop("+", name("x"), const(1))), "one more")])])), end="")
def f(x):
    return x + 1  # one more
"""

from __future__ import annotations

import ast
import math
import re
import textwrap
from typing import Any, cast

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

BINOPS = {
    "+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "//": ast.FloorDiv, "**": ast.Pow,
    "@": ast.MatMult, "%": ast.Mod,
}
CMPOPS = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE, "==": ast.Eq, "!=": ast.NotEq}

MAX_DEPTH = 48  # well inside CPython's limits (200 nested brackets, its compiler's recursion)
LINE_LENGTH = 130  # the project's (pyproject.toml, ruff): a longer statement is wrapped, a longer comment too


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


def literal(value: tuple) -> ast.expr:
    """A tuple of strings, integers and such tuples as one constant (ast.unparse writes it
    item by item with repr, as Python's constant folder would hold it): quick to print."""

    def plain(v) -> bool:
        if isinstance(v, tuple):
            return all(plain(x) for x in v)
        return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))

    if not isinstance(value, tuple) or not plain(value):
        raise TypeError(f"not a literal of strings and integers: {value!r}")  # pragma: no cover - internal
    return ast.Constant(cast(Any, value))  # a tuple constant: CPython's own (typeshed lists scalars only)


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


def not_(a: ast.expr) -> ast.expr:
    return ast.UnaryOp(ast.Not(), _node(a))


def if_exp(test: ast.expr, body, orelse) -> ast.expr:
    """`body if test else orelse`."""
    return ast.IfExp(_node(test), _node(body), _node(orelse))


def subscript(obj: ast.expr, index) -> ast.expr:
    return ast.Subscript(obj, _node(index), ast.Load())


def slice_(lo=None, hi=None) -> ast.expr:
    return ast.Slice(None if lo is None else _node(lo), None if hi is None else _node(hi))


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


# ---- statements, methods, classes, modules ---------------------------------------------------------

_UNSAFE = re.compile(r"[\x00\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\ud800-\udfff]")
_COMMENT, _BLANK, _TRIPLE, _ORIGIN = "penrose_comment", "penrose_blank", "penrose_docstring", "penrose_origin"


def comment_text(text: str) -> str:
    """Any text made safe for a comment: no line break can end it early, no NUL or lone
    surrogate breaks compile() (each becomes U+FFFD or a space)."""
    text = re.sub(r"[\x00\ud800-\udfff]", "\ufffd", text)
    return re.sub(r"[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+", " ", text).strip()


class Comment(ast.stmt):
    """A comment line among the statements (`# text`); the text must be `comment_text`'s."""

    _fields = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Verbatim(ast.stmt):
    """Lines of penrose's own source, inlined as they are written (the runtime helpers)."""

    _fields = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


def commented(node: ast.stmt, text: str) -> ast.stmt:
    """`node` with a comment after it on its (first) line; no comment for empty text."""
    setattr(node, _COMMENT, text)
    return node


def spaced(node: ast.stmt, blank: int) -> ast.stmt:
    """`node` after `blank` blank lines (by default none, one before a method, two before a
    class or function of the module)."""
    setattr(node, _BLANK, blank)
    return node


def tagged(node: ast.stmt, origin) -> ast.stmt:
    """`node` marked as made from `origin` (the compiler: a diagram statement's span)."""
    setattr(node, _ORIGIN, origin)
    return node


def origin(node: ast.AST):
    """What `tagged` marked `node` with, or None."""
    return getattr(node, _ORIGIN, None)


def _store(target) -> ast.expr:
    """An assignment target: a name, several names (a tuple, even of one), or a built
    attribute or subscript, in store context."""
    if isinstance(target, str):
        return ast.Name(_ident(target), ast.Store())
    if isinstance(target, (list, tuple)):
        return ast.Tuple([_store(t) for t in target], ast.Store())
    if isinstance(target, (ast.Attribute, ast.Subscript, ast.Name)):
        target.ctx = ast.Store()
        return target
    raise TypeError(f"not an assignment target: {target!r}")  # pragma: no cover - internal


def assign(target, value) -> ast.stmt:
    """`target = value`: target a name, a list of names (`a, b = ...`; one name in a list is
    `a, = ...`), or an attribute or subscript tree."""
    return ast.Assign([_store(target)], _node(value))


def expr_stmt(value: ast.expr) -> ast.stmt:
    return ast.Expr(value)


def docstring(text: str) -> ast.stmt:
    """A docstring in triple double quotes: text with no backslash, no line break and no double
    quote at its end or three in a row (an `Expr` of a plain string prints with `repr`)."""
    if "\\" in text or '"""' in text or text.endswith('"') or _UNSAFE.search(text):
        raise ValueError(f"not a docstring the printer writes as it is: {text!r}")
    node = ast.Expr(ast.Constant(text))
    setattr(node, _TRIPLE, True)
    return node


def return_(value: ast.expr | None = None) -> ast.stmt:
    return ast.Return(None if value is None else _node(value))


def pass_() -> ast.stmt:
    return ast.Pass()


def if_(test: ast.expr, body: list) -> ast.stmt:
    return ast.If(_node(test), body, [])


def with_(context: ast.expr, body: list) -> ast.stmt:
    """`with context: body`."""
    return ast.With([ast.withitem(_node(context))], body)


def for_(target, iterable: ast.expr, body: list) -> ast.stmt:
    return ast.For(_store(target), iterable, body, [])


def list_comp(element: ast.expr, target: str, iterable: ast.expr) -> ast.expr:
    """`[element for target in iterable]`."""
    return ast.ListComp(element, [ast.comprehension(_store(target), iterable, [], 0)])


def arguments(positional=(), defaults=(), vararg: str | None = None, keyword_only=(), kwarg: str | None = None) -> ast.arguments:
    """A signature: positional names (the last ones take `defaults`), `*vararg`, keyword-only
    (name, default) pairs, `**kwarg`."""
    return ast.arguments(
        [], [ast.arg(_ident(a)) for a in positional], None if vararg is None else ast.arg(_ident(vararg)),
        [ast.arg(_ident(k)) for k, _ in keyword_only], [_node(d) for _, d in keyword_only],
        None if kwarg is None else ast.arg(_ident(kwarg)), [_node(d) for d in defaults],
    )


def function(fname: str, args: ast.arguments, body: list) -> ast.stmt:
    return ast.FunctionDef(_ident(fname), args, body, [], None)


def class_(cname: str, bases: list, body: list) -> ast.stmt:
    return ast.ClassDef(_ident(cname), bases, [], body, [])


def import_(module_name: str, asname: str | None = None) -> ast.stmt:
    """`import module_name` (`as asname`)."""
    return ast.Import([ast.alias(".".join(_ident(p) for p in module_name.split(".")), asname and _ident(asname))])


def import_from(module_name: str, names) -> ast.stmt:
    return ast.ImportFrom(".".join(_ident(p) for p in module_name.split(".")), [ast.alias(_ident(n)) for n in names], 0)


def module(body: list) -> ast.Module:
    return ast.Module(body, [])


def print_module(tree: ast.Module) -> str:
    """The source of a module tree; every statement's lineno, end_lineno, col_offset and
    end_col_offset are set to where it was printed."""
    out: list[str] = []
    _print_body(tree.body, 0, out)
    return "\n".join(out) + "\n"


def statement_text(node: ast.stmt) -> str:
    """One statement as the printer writes it, unindented (its lines joined)."""
    out: list[str] = []
    _print_stmt(node, 0, out)
    return "\n".join(out)


def _print_body(body: list, depth: int, out: list[str]) -> None:
    for i, node in enumerate(body):
        blank = getattr(node, _BLANK, None)
        if blank is None:
            blank = (1 if depth else 2) if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else 0
        if i:
            out.extend([""] * blank)
        _print_stmt(node, depth, out)


def _print_stmt(node: ast.stmt, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    node.lineno, node.col_offset = len(out) + 1, len(pad)
    if isinstance(node, Verbatim):
        out.extend(pad + line if line else line for line in node.text.split("\n"))
    elif isinstance(node, Comment):
        if _UNSAFE.search(node.text):
            raise ValueError(f"a comment must be comment_text's: {node.text!r}")
        out.extend(_comment_lines(node.text, pad))
    elif isinstance(node, ast.ClassDef):
        bases = ", ".join(_expr(b) for b in node.bases)
        out.append(f"{pad}class {node.name}({bases}):" if bases else f"{pad}class {node.name}:")
        _print_body(node.body, depth + 1, out)
    elif isinstance(node, ast.FunctionDef):
        out.extend(_bracketed(pad, f"def {node.name}(", _parameters(node.args), "):"))
        _print_body(node.body, depth + 1, out)
    elif isinstance(node, ast.If):
        if node.orelse:  # pragma: no cover - the compiler writes none
            raise ValueError("the printer writes no else branch")
        out.append(f"{pad}if {_expr(node.test)}:")
        _print_body(node.body, depth + 1, out)
    elif isinstance(node, ast.With):
        out.append(f"{pad}with {', '.join(_expr(item.context_expr) for item in node.items)}:")
        _print_body(node.body, depth + 1, out)
    elif isinstance(node, ast.For):
        # a conditional iterable reads better in brackets (they never change its meaning)
        iterable = _expr(node.iter)
        out.append(f"{pad}for {_expr(node.target)} in {f'({iterable})' if isinstance(node.iter, ast.IfExp) else iterable}:")
        _print_body(node.body, depth + 1, out)
    else:
        lines = _simple(node, pad)
        text = getattr(node, _COMMENT, "")
        if text:
            if _UNSAFE.search(text):
                raise ValueError(f"a comment must be comment_text's: {text!r}")
            # after the statement's last line, or its first; else on lines of its own above it
            at = next((i for i in (len(lines) - 1, 0) if len(lines[i]) + 4 + len(text) <= LINE_LENGTH), None)
            if at is None:
                out.extend(_comment_lines(text, pad))
                node.lineno = len(out) + 1
            else:
                lines[at] += f"  # {text}"
        out.extend(lines)
    node.end_lineno, node.end_col_offset = len(out), len(out[-1])


def _expr(node: ast.AST) -> str:
    """An expression (or a signature) as ast.unparse prints it; unlike a statement it needs no
    line numbers (ast.unparse reads them only for statements' type comments)."""
    if isinstance(node, ast.Name):  # the commonest piece: a target, an argument
        return node.id
    return ast.unparse(node)


def _target(node: ast.expr) -> str:
    if isinstance(node, ast.Tuple):  # `a, b = ...` and `a, = ...`, without brackets
        return ", ".join(_target(e) for e in node.elts) + ("," if len(node.elts) == 1 else "")
    return _expr(node)


def _simple(node: ast.stmt, pad: str) -> list[str]:
    """A simple statement's lines: one, or its expression wrapped to fit LINE_LENGTH (`_wrapped`)."""
    if isinstance(node, ast.Assign):
        return _wrapped(node.value, pad, " = ".join(_target(t) for t in node.targets) + " = ", "")
    if isinstance(node, ast.Expr):
        if getattr(node, _TRIPLE, False):
            text = node.value.value if isinstance(node.value, ast.Constant) else None
            assert isinstance(text, str), "a docstring node holds a string"
            return [f'{pad}"""{text}"""']
        return _wrapped(node.value, pad, "", "")
    if isinstance(node, ast.Return):
        return [pad + "return"] if node.value is None else _wrapped(node.value, pad, "return ", "")
    if isinstance(node, ast.Pass):
        return [pad + "pass"]
    if isinstance(node, ast.Import):
        return [pad + "import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)]
    if isinstance(node, ast.ImportFrom):
        return _bracketed(pad, f"from {node.module} import (", [a.name for a in node.names], ")",
                          f"from {node.module} import " + ", ".join(a.name for a in node.names))
    raise TypeError(f"the printer writes no {type(node).__name__}")  # pragma: no cover - internal


# ---- wrapping: a statement longer than LINE_LENGTH is broken inside its brackets ----------------
_OPS = {cls: op for op, cls in BINOPS.items()}


def _comment_lines(text: str, pad: str) -> list[str]:
    """A comment's lines at `pad`: broken between words where it is longer than LINE_LENGTH, the
    lines after the first indented two more (`#   ...`: a reader, and the gallery, see where it goes on)."""
    width = max(LINE_LENGTH - len(pad) - 2, 20)
    lines = textwrap.wrap(text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return [f"{pad}# {line}" for line in lines] or [f"{pad}#"]


def _bracketed(pad: str, opening: str, items: list[str], closing: str, one: str | None = None) -> list[str]:
    """`opening items closing` on one line where it fits (`one`, if given, is that line's text),
    else the items on one line of their own between the brackets, else one item a line."""
    line = pad + (one if one is not None else opening + ", ".join(items) + closing)
    if len(line) <= LINE_LENGTH or not items:
        return [line]
    inner = pad + "    "
    hugged = inner + ", ".join(items)
    if len(hugged) <= LINE_LENGTH:
        return [pad + opening, hugged, pad + closing]
    return [pad + opening, *(inner + item + "," for item in items), pad + closing]


def _parameters(args: ast.arguments) -> list[str]:
    """A signature's parameters, each as ast.unparse writes it."""
    out = []
    plain = args.posonlyargs + args.args
    defaults = [None] * (len(plain) - len(args.defaults)) + list(args.defaults)
    out += [a.arg if d is None else f"{a.arg}={_expr(d)}" for a, d in zip(plain, defaults)]
    if args.vararg is not None:
        out.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        out.append("*")
    out += [a.arg if d is None else f"{a.arg}={_expr(d)}" for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg is not None:
        out.append("**" + args.kwarg.arg)
    return out


def _items(node: ast.expr) -> tuple[str, list[tuple[str, ast.expr]], str] | None:
    """An expression in brackets as (its opening, its items with their prefixes, its closing):
    a call, a tuple (a constant tuple too) or a list; None for anything else."""
    if isinstance(node, ast.Call):
        kws = [(f"{k.arg}=" if k.arg else "**", k.value) for k in node.keywords]
        return _expr(node.func) + "(", [("", a) for a in node.args] + kws, ")"
    if isinstance(node, ast.Constant) and isinstance(node.value, tuple) and node.value:
        return "(", [("", ast.Constant(v)) for v in node.value], ")"
    if isinstance(node, ast.Tuple) and node.elts:
        return "(", [("", e) for e in node.elts], ")"
    if isinstance(node, ast.List) and node.elts:
        return "[", [("", e) for e in node.elts], "]"
    return None


def _wrapped(node: ast.expr, pad: str, head: str, tail: str, inside: bool = False) -> list[str]:
    """The lines of `head node tail` at `pad`: one where it fits LINE_LENGTH, else broken inside
    the expression's brackets (black's way: the items on a line of their own, else one a line,
    each wrapped again), a method's receiver first, a sum or product one operand a line, a long
    string cut between words into adjacent literals. `inside`: already within brackets."""
    line = pad + head + _expr(node) + tail
    if len(line) <= LINE_LENGTH:
        return [line]
    inner = pad + "    "
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and len(pad + head + _expr(node.func)) > LINE_LENGTH \
            and isinstance(node.func.value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
        rest = "." + node.func.attr + "(" + ", ".join(p + _expr(v) for p, v in _items(node)[1]) + ")" + tail  # type: ignore[index]
        return _wrapped(node.func.value, pad, head, rest, inside)
    parts = _items(node)
    if parts is not None:
        opening, items, closing = parts
        texts = [prefix + _expr(v) for prefix, v in items]
        single = len(items) == 1 and isinstance(node, (ast.Tuple, ast.Constant))  # (x,)
        hugged = inner + ", ".join(texts) + ("," if single else "")
        if len(hugged) <= LINE_LENGTH:
            return [pad + head + opening, hugged, pad + closing + tail]
        lines = [pad + head + opening]
        for prefix, v in items:
            lines += _wrapped(v, inner, prefix, ",", inside=True)
        return lines + [pad + closing + tail]
    if isinstance(node, ast.BinOp):  # a sum or product: one operand a line, each after its operator
        operands = [node.right]
        left = node.left
        while isinstance(left, ast.BinOp) and type(left.op) is type(node.op):
            operands.append(left.right)
            left = left.left
        operands.append(left)
        operands.reverse()
        at = pad if inside else inner
        lines = [] if inside else [pad + head + "("]
        for i, x in enumerate(operands):
            bracket = _needs_brackets(node.op, x, left=i == 0)
            lead = ("" if i == 0 else _OPS[type(node.op)] + " ") + ("(" if bracket else "")
            lines += _wrapped(x, at, (head if inside and i == 0 else "") + lead, ")" if bracket else "", True)
        if inside:
            lines[-1] += tail
            return lines
        return lines + [pad + ")" + tail]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and inside:
        width = max(LINE_LENGTH - len(pad) - len(head) - len(tail) - 3, 20)
        pieces = re.findall(r"\S*\s*", node.value)[:-1] or [node.value]
        chunks: list[str] = [""]
        for piece in pieces:
            if chunks[-1] and len(repr(chunks[-1] + piece)) > width:
                chunks.append("")
            chunks[-1] += piece
        lines = [pad + (head if i == 0 else "") + repr(c) for i, c in enumerate(chunks)]
        lines[-1] += tail
        return lines
    return [line]


def _needs_brackets(op: ast.operator, operand: ast.expr, left: bool) -> bool:
    """Whether `operand` needs brackets as the left (or a right) operand of `op` (ast.unparse's rule)."""
    mark, text, symbol = ast.Name("_", ast.Load()), _expr(operand), _OPS[type(op)]
    if left:
        return ast.unparse(ast.BinOp(operand, op, mark)) == f"({text}) {symbol} _"
    return ast.unparse(ast.BinOp(mark, op, operand)) == f"_ {symbol} ({text})"
