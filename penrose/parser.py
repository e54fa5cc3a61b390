"""Text → IR: `parse(text)` and `parse_file(path)`.

>>> from penrose.parser import parse
>>> d = parse("dim e = 4\\ninput x[e]\\noutput x")
>>> d.body[1].legs
('e',)

Two readers of one language, the Lark grammar (grammar/penrose.lark, `grammar_file()`):

- the *fast path* (`_Fast`): one regular expression splits the text into tokens and a
  recursive-descent reader builds the IR from them directly, spans included. It declines
  (raises `_Slow`) at the first thing that is not plainly valid: a syntax error, a form the IR
  refuses (`x[0]`, a repeated keyword argument), a program too deep for it, a keyword glued to
  a name where no name can stand (Lark's contextual lexer reads `f(x) aslayers` as `f(x) as
  layers`);
- the *Lark path*: Lark's LALR parser with positions propagated, then `_ToIR`. It reads
  whatever the fast path declines, so every syntax error, its wording and its position, comes
  from Lark and the grammar.

The fast path exists for speed only: in CPython, Lark's lexer and LALR loop alone take about
100 µs a statement (with positions and the IR, about 400 µs); the fast path about 50 µs, IR and
comments included. It is held to the Lark path: wherever both read a text the IR is the same,
spans, leg spans and layout flags included (tests/language/test_parse_speed.py compares them on every
diagram in the repository, generated programs and fuzzed mutations), and where the Lark path
refuses a text the fast path has declined it. Lark is imported only when the Lark path runs.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
from dataclasses import replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from penrose import ir
from penrose.errors import PenroseSyntaxError, Span
from penrose.stack import deep, too_deep

_STEP = re.compile(r"^\s*(\d+)\)\s*")
_INT = re.compile(r"\d+")  # a NUMBER that is a whole number (NUMBER's digits are \d, as here)
# an instance's name after `as`: a name or a dotted path of names and numbers (the grammar's
# INSTANCE; the Pygments lexer reads it from here)
INSTANCE_PATTERN = r"(?:[A-Za-z_][A-Za-z0-9_]*|\d+|`[^`.\n]+`)(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|\d+|`[^`.\n]+`))*"
_INSTANCE = re.compile(INSTANCE_PATTERN)


def grammar_file() -> Traversable:
    """The Lark grammar: penrose/grammar/penrose.lark inside an installed wheel (setup.py copies it
    there), else grammar/penrose.lark at the top of the source tree (a checkout on the path, or
    an editable install)."""
    installed = resources.files("penrose") / "grammar" / "penrose.lark"
    if installed.is_file():
        return installed
    source = Path(__file__).resolve().parent.parent / "grammar" / "penrose.lark"
    if not source.is_file():
        raise FileNotFoundError(f"the grammar penrose.lark is neither in the installed package ({installed}) "
                                f"nor at the top of the source tree ({source})")
    return source


def grammar_text() -> str:
    """The text of the Lark grammar (`grammar_file()`)."""
    return grammar_file().read_text(encoding="utf-8")


# The keywords, as the grammar spells them, by their role: the statement a keyword starts
# (`param_decl: "param" ...`), a modifier by its alias (`"as" INSTANCE -> as_mod`), and
# the UNSAVED and SHARED terminals. The fast path reads its keywords from here, so a keyword renamed in the
# grammar is renamed for both readers.
_STATEMENT_ROLES = ("dim", "const", "input", "param", "buffer", "output", "return", "block", "include", "label")
_MODIFIER_ROLES = ("as", "repeat")


def _keywords(grammar: str) -> dict[str, str]:
    """role -> keyword, read from the grammar's text (without Lark: the fast path never imports it)."""
    found = dict(re.findall(r'^(\w+?)_(?:decl|stmt|def):\s*"(\w+)"', grammar, re.M))
    found |= {role: word for word, role in re.findall(r'"(\w+)"[^\n]*->\s*(\w+)_mod\b', grammar)}
    for role in ("unsaved", "shared"):  # the UNSAVED and SHARED terminals
        word = re.search(rf'^{role.upper()}:\s*"(\w+)"', grammar, re.M)
        if word:
            found[role] = word.group(1)
    missing = [r for r in (*_STATEMENT_ROLES, *_MODIFIER_ROLES, "unsaved", "shared") if r not in found]
    if missing:
        raise RuntimeError(f"{grammar_file()}: no keyword found for {', '.join(missing)}")
    return found


_WORD = _keywords(grammar_text())
_KEYWORDS = frozenset(_WORD[r] for r in _STATEMENT_ROLES)  # statement keywords as written
_STATEMENT = {_WORD[r]: r for r in _STATEMENT_ROLES}  # keyword as written -> role
_MODIFIER = {_WORD[r]: r for r in _MODIFIER_ROLES}


class _Lines:
    def __init__(self, text: str, file: str):
        # lines as the lexer counts them: only '\n' ends one (splitlines also splits at \x0c, \x85, \u2028 ...)
        self.lines = [l[:-1] if l.endswith("\r") else l for l in text.split("\n")]
        if len(self.lines) > 1 and not self.lines[-1]:
            self.lines.pop()
        self.file = file

    def line(self, n: int) -> str:
        return self.lines[n - 1] if 0 < n <= len(self.lines) else ""

    def span(self, meta) -> Span:
        line = getattr(meta, "line", None) or 0
        if not line:
            return Span(self.file)
        return Span(self.file, line, meta.column, meta.end_line, meta.end_column, self.line(line))

    def tok(self, tok) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column, self.line(tok.line))


# ---- the fast path ----------------------------------------------------------------------------

# The grammar's terminals, in one expression. Where Lark's contextual lexer would split a valid
# program differently (a keyword read as a name where no keyword can stand), the reader below
# decides by position instead: keywords are NAME tokens here.
_TOKENS = re.compile(
    r"""
    [ \t\f]*                                  # blanks before the token
    (?:
      (?P<CONTINUE>\\[ \t]*\n)                 # a backslash continuing the line
    | (?P<NL>\n)
    | (?P<COMMENT>\#[^\n]*)
    | (?P<NAME>[A-Za-z_][A-Za-z0-9_]*|`[^`.\n]+`)   # a quoted name: `self`, `_bias`
    | (?P<NUMBER>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    | (?P<STRING>'[^'\n]*'|"[^"\n]*")
    | (?P<OP>\.\.\.|\*\*|//|<=|>=|==|!=|[-+*/<>=.,:~()\[\]{}])
    )
    """,
    re.VERBOSE,
)
_OPEN, _CLOSE = frozenset("(["), frozenset(")]")
_COMPARE = frozenset(("<=", ">=", "==", "!=", "<", ">"))
_BINARY = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}  # binding power; all left-associative


class _Slow(Exception):
    """The fast path declines this text; the Lark path reads it (and words any error)."""


class _Comment(str):
    """A comment's text with the positions `_attach_comments` reads (as a Lark Token has them)."""

    line: int
    end_line: int
    column: int
    end_column: int

    def __new__(cls, text: str, line: int, column: int):
        tok = super().__new__(cls, text)
        tok.line = tok.end_line = line
        tok.column, tok.end_column = column, column + len(text)
        return tok


class _Attr:
    """`x.name` not yet applied: only `T.shape[i]` and `x.detach()` complete it."""

    __slots__ = ("obj", "name")

    def __init__(self, obj, name):
        self.obj, self.name = obj, name


def _tokens(text: str):
    """Kinds, values, lines and columns (1-based) of the tokens, and the comments; a newline
    inside (...) or [...] is dropped, as `_BracketNewlines` drops it."""
    kinds, values, lines, cols, comments = [], [], [], [], []
    line, line_start, depth, pos = 1, 0, 0, 0
    for m in _TOKENS.finditer(text):
        if m.start() != pos:
            raise _Slow  # a character no terminal matches
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKENS is a named group
        start, pos = m.span(kind)
        value = m.group(kind)
        if kind == "CONTINUE":
            line, line_start = line + 1, pos
            continue
        if kind == "COMMENT":
            comments.append(_Comment(value, line, start - line_start + 1))
            continue
        if kind == "OP":
            kind = value
            if value in _OPEN:
                depth += 1
            elif value in _CLOSE:
                depth = max(0, depth - 1)
        if kind != "NL" or not depth:
            kinds.append(kind)
            values.append(value)
            lines.append(line)
            cols.append(start - line_start + 1)
        if kind == "NL":
            line, line_start = line + 1, pos
    if pos != len(text):
        raise _Slow
    kinds += ["EOF", "EOF"]  # two, so that looking one past the current token never runs off
    values += ["", ""]
    lines += [line, line]
    cols += [1, 1]
    return kinds, values, lines, cols, comments


def _plain(item):
    """The IR node of an expression item; an attribute left unapplied is not one."""
    node = item[0]
    if isinstance(node, _Attr):
        raise _Slow
    return node


class _Fast:
    """Tokens → IR by recursive descent, for text the grammar accepts (`_Slow` otherwise).

    An expression item is (node, line, col, end_line, end_col): the node and the extent it
    occupies in its parent, which is wider than its own span where parentheses or a unary '+'
    surround it. A parent's span runs from its first child's extent to its last one's, as Lark's
    propagated positions do.
    """

    def __init__(self, text: str, lines: _Lines):
        self.k, self.v, self.ln, self.col, self.comments = _tokens(text)
        self.i = 0
        self.file, self.src = lines.file, lines.lines

    # -- helpers
    def span(self, line, col, end_line, end_col) -> Span:
        return Span(self.file, line, col, end_line, end_col, self.src[line - 1])

    def end(self, i):
        """Where token i ends: (line, column after it)."""
        return self.ln[i], self.col[i] + len(self.v[i])

    def span_from(self, i, end) -> Span:
        """From where token i starts to `end`, a (line, column) pair."""
        return Span(self.file, self.ln[i], self.col[i], end[0], end[1], self.src[self.ln[i] - 1])

    def tok_span(self, i) -> Span:
        line, col = self.ln[i], self.col[i]
        return Span(self.file, line, col, line, col + len(self.v[i]), self.src[line - 1])

    def expect(self, kind) -> int:
        i = self.i
        if self.k[i] != kind:
            raise _Slow
        self.i = i + 1
        return i

    def name(self) -> int:
        return self.expect("NAME")

    def instance_path(self):
        """`as` NAME, or a dotted path of names and numbers written without spaces (`net.0`,
        `h.10.attn`): the tokens it was cut into (`net`, `.0`) joined back. Returns (path, end)."""
        i = self.i
        if self.k[i] not in ("NAME", "NUMBER"):
            raise _Slow
        text, j = self.v[i], i + 1
        while self.k[j] in ("NAME", "NUMBER", ".") and self.ln[j] == self.ln[j - 1] \
                and self.col[j] == self.col[j - 1] + len(self.v[j - 1]):
            text += self.v[j]
            j += 1
        if not _INSTANCE.fullmatch(text):
            raise _Slow
        self.i = j
        return text, self.end(j - 1)

    # -- statements
    def statements(self, closer) -> list:
        """`_sep? (_stmt _sep)* _stmt?` up to `closer`: the end of the file, or a block's '}'."""
        k = self.k
        body: list = []
        while k[self.i] == "NL":
            self.i += 1
        while k[self.i] != closer:
            self.statement(body)
            if k[self.i] != "NL":
                if k[self.i] != closer:
                    raise _Slow
                break
            while k[self.i] == "NL":
                self.i += 1
        return body

    def statement(self, body: list):
        """One statement onto `body` (a `dim` line may hold several)."""
        first = self.i
        if self.k[first] != "NAME":
            raise _Slow
        word = _STATEMENT.get(self.v[first])  # the keyword's role
        if word is None:  # where a statement starts, a keyword is one, and any other name an assignment's
            body.append(self.assign())
            return
        self.i += 1
        if word == "dim":
            self.dims(body)
            return
        if word == "const":
            self.consts(body)
            return
        node: ir.Stmt
        if word in ("input", "param", "buffer"):
            node = self.tensor(word, first)
        elif word == "block":
            node = self.block(first)
        elif word == "output":
            names = [self.name()]
            while self.k[self.i] == ",":
                self.i += 1
                names.append(self.name())
            node = ir.Output(tuple(self.v[j] for j in names), span=self.span_from(first, self.end(names[-1])))
        elif word == "return":
            values = [self.expr()]
            while self.k[self.i] == ",":
                self.i += 1
                values.append(self.expr())
            node = ir.Return(tuple(_plain(v) for v in values), span=self.span_from(first, values[-1][3:]))
        elif word == "include":
            s = self.expect("STRING")
            node = ir.Include(self.v[s][1:-1], span=self.span_from(first, self.end(s)))
        else:  # label
            n = self.name()
            s = self.expect("STRING")
            node = ir.Label(self.v[n], self.v[s][1:-1], span=self.span_from(first, self.end(s)))
        body.append(node)

    def dims(self, body: list):
        grouped = False
        while True:
            n = self.name()
            size, end = None, self.end(n)
            if self.k[self.i] == "=":
                self.i += 1
                item = self.expr()
                size, end = _plain(item), (item[3], item[4])
            body.append(ir.Dim(self.v[n], size, span=self.span_from(n, end), grouped=grouped))
            if self.k[self.i] != ",":
                return
            self.i += 1
            grouped = True  # `dim f = 30, r = 1` stays one line under fmt

    def consts(self, body: list):
        """`const NAME = expr (, NAME = expr)*`: laid out like `dims`, a value required."""
        grouped = False
        while True:
            n = self.name()
            self.expect("=")
            item = self.expr()
            body.append(ir.Const(self.v[n], _plain(item), span=self.span_from(n, (item[3], item[4])), grouped=grouped))
            if self.k[self.i] != ",":
                return
            self.i += 1
            grouped = True

    def tensor(self, kind: str, first: int) -> ir.Tensor:
        """`input NAME legs [: NAME]`, `param|buffer NAME legs [~ init]`, or a block's formal."""
        n = self.name()
        legs, batched, leg_spans, end = self.legs()
        dtype, init = "float", None
        if kind in ("input", "formal") and self.k[self.i] == ":":
            self.i += 1
            d = self.name()
            dtype, end = self.v[d], self.end(d)
        elif kind in ("param", "buffer") and self.k[self.i] == "~":
            self.i += 1
            init, end = self.init()
        saved = True
        if kind == "buffer" and self.k[self.i] == "NAME" and self.v[self.i] == _WORD["unsaved"]:  # persistent=False
            saved, end = False, self.end(self.i)
            self.i += 1
        span = self.span_from(first, end)
        return ir.Tensor(kind, self.v[n], legs, dtype, init, batched, span=span, leg_spans=leg_spans, saved=saved)

    def legs(self):
        """`[leg, ...]` → (legs, batched, leg spans, end); a '...' only first."""
        self.expect("[")
        k, toks = self.k, []
        if k[self.i] != "]":
            while True:
                i = self.i
                if k[i] == "NAME" or (k[i] == "..." and not toks):
                    toks.append(i)
                    self.i += 1
                else:
                    raise _Slow
                if k[self.i] != ",":
                    break
                self.i += 1
        close = self.expect("]")
        batched = bool(toks) and k[toks[0]] == "..."
        if batched:
            toks = toks[1:]
        return tuple(self.v[j] for j in toks), batched, tuple(self.tok_span(j) for j in toks), self.end(close)

    def init(self):
        n = self.name()
        kwargs, end = (), self.end(n)
        if self.k[self.i] == "(":
            pos, kwargs, close = self.arguments()
            if pos:
                raise _Slow  # init arguments are written by keyword
            end = self.end(close)
        return ir.Init(self.v[n], kwargs, span=self.span_from(n, end)), end

    def block(self, first: int) -> ir.Block:
        n = self.name()
        self.expect("(")
        formals = []
        if self.k[self.i] != ")":
            while True:
                formals.append(self.tensor("formal", self.i))
                if self.k[self.i] != ",":
                    break
                self.i += 1
        self.expect(")")
        self.expect("{")
        body = self.statements("}")
        close = self.expect("}")
        span = self.span_from(first, self.end(close))
        return ir.Block(self.v[n], tuple(formals), tuple(body), span=span)

    def assign(self) -> ir.Assign:
        k, first = self.k, self.i
        targets = [self.name()]
        stated = leg_spans = None
        if k[self.i] == "[":  # `s[t, s, a] = ...`: the one target's legs, stated
            stated, batched, leg_spans, _ = self.legs()
            if batched:
                raise _Slow
        while stated is None and k[self.i] == ",":
            self.i += 1
            targets.append(self.name())
        self.expect("=")
        value = self.expr()
        end = value[3], value[4]
        instance = repeat = None
        shared = False
        while k[self.i] == "NAME" and self.v[self.i] in _MODIFIER:  # keywords only here
            word = _MODIFIER[self.v[self.i]]
            self.i += 1
            if word == "as":
                if instance is not None:
                    raise _Slow
                instance, end = self.instance_path()
            else:
                if repeat is not None:
                    raise _Slow
                item = self.atom()
                repeat, end = _plain(item), (item[3], item[4])
                if k[self.i] == "NAME" and self.v[self.i] == _WORD["shared"]:
                    shared, end = True, self.end(self.i)
                    self.i += 1
        span = self.span_from(first, end)
        return ir.Assign(tuple(self.v[j] for j in targets), _plain(value), instance, repeat, span=span, shared=shared,
                         legs=stated, leg_spans=leg_spans or ())

    # -- expressions
    def expr(self):
        """`arith [COMPARE arith]` (a comparison does not chain)."""
        left = self.arith()
        op = self.k[self.i]
        if op not in _COMPARE:
            return left
        self.i += 1
        right = self.arith()
        span = self.span(left[1], left[2], right[3], right[4])
        return ir.BinOp(op, _plain(left), _plain(right), span=span), left[1], left[2], right[3], right[4]

    def arith(self):
        """Unary operands joined by + - * / //, by binding power, left to right (a loop: a sum
        of 10,000 terms needs no stack)."""
        item = self.unary()
        k = self.k
        if k[self.i] not in _BINARY:
            return item
        operands, ops = [item], []
        while k[self.i] in _BINARY:
            op = k[self.i]
            self.i += 1
            while ops and _BINARY[ops[-1]] >= _BINARY[op]:
                self._reduce(operands, ops)
            ops.append(op)
            operands.append(self.unary())
        while ops:
            self._reduce(operands, ops)
        return operands[0]

    def _reduce(self, operands, ops):
        right, left = operands.pop(), operands.pop()
        span = self.span(left[1], left[2], right[3], right[4])
        operands.append((ir.BinOp(ops.pop(), _plain(left), _plain(right), span=span), left[1], left[2], right[3], right[4]))

    def unary(self):
        """`-unary`, `+unary`, or `postfix [** unary]`: '**' binds tighter than a sign before it."""
        i = self.i
        sign = self.k[i]
        if sign == "-" or sign == "+":
            self.i += 1
            item = self.unary()
            if sign == "+":  # no node of its own: it only widens the operand's extent
                return item[0], self.ln[i], self.col[i], item[3], item[4]
            node, span = _plain(item), self.span(self.ln[i], self.col[i], item[3], item[4])
            node = ir.Number(-node.value, span=span) if isinstance(node, ir.Number) else ir.Neg(node, span=span)
            return node, self.ln[i], self.col[i], item[3], item[4]
        base = self.postfix()
        if self.k[self.i] != "**":
            return base
        self.i += 1
        exp = self.unary()
        span = self.span(base[1], base[2], exp[3], exp[4])
        return ir.BinOp("**", _plain(base), _plain(exp), span=span), base[1], base[2], exp[3], exp[4]

    def postfix(self):
        """An atom followed by `.name`, `[index]` and `(arguments)`."""
        item = self.atom()
        k = self.k
        while True:
            t = k[self.i]
            if t == ".":
                if k[self.i + 1] != "NAME":
                    raise _Slow
                n = self.i + 1
                self.i += 2
                item = (_Attr(item[0], self.v[n]), item[1], item[2], *self.end(n))
            elif t == "(":
                item = self.call(item)
            elif t == "[":
                item = self.shape(item)
            else:
                return item

    def shape(self, base):
        """`T.shape[i]` with a whole-number i: the only indexing there is."""
        self.i += 1
        index = self.expr()
        close = self.expect("]")
        attr, i = base[0], index[0]
        if not (isinstance(attr, _Attr) and attr.name == "shape" and isinstance(attr.obj, ir.Name)):
            raise _Slow
        if not (isinstance(i, ir.Number) and isinstance(i.value, int)):
            raise _Slow
        end = self.end(close)
        return ir.Shape(attr.obj.id, i.value, span=self.span(base[1], base[2], *end)), base[1], base[2], *end

    def call(self, func):
        pos, kwargs, close = self.arguments()
        end = self.end(close)
        span = self.span(func[1], func[2], *end)
        f = func[0]
        if isinstance(f, _Attr):
            if f.name != "detach" or pos or kwargs or isinstance(f.obj, _Attr):
                raise _Slow
            return ir.Call("detach", (f.obj,), span=span, method=True), func[1], func[2], *end
        if not isinstance(f, ir.Name):
            raise _Slow  # only named functions can be called
        return ir.Call(f.id, pos, kwargs, span=span), func[1], func[2], *end

    def arguments(self):
        """`( [arg, ...] [,] )` → (positional, keyword pairs, index of the ')')."""
        self.expect("(")
        k, pos, kwargs = self.k, [], []
        while k[self.i] != ")":
            if k[self.i] == "NAME" and k[self.i + 1] == "=":
                key = self.v[self.i]
                self.i += 2
                if any(key == seen for seen, _ in kwargs):
                    raise _Slow  # repeated
                kwargs.append((key, _plain(self.expr())))
            elif kwargs:
                raise _Slow  # a positional argument after a keyword one
            else:
                pos.append(_plain(self.expr()))
            if k[self.i] != ",":
                break
            self.i += 1
        return tuple(pos), tuple(kwargs), self.expect(")")

    def atom(self):
        i = self.i
        t = self.k[i]
        if t == "NAME" or t == "NUMBER" or t == "STRING":
            self.i += 1
            text = self.v[i]
            line, col = self.ln[i], self.col[i]
            end = col + len(text)
            span = Span(self.file, line, col, line, end, self.src[line - 1])
            if t == "NAME":
                node = ir.Name(text, span=span)
            elif t == "STRING":
                node = ir.String(text[1:-1], span=span)
            elif _INT.fullmatch(text):
                try:
                    node = ir.Number(int(text), span=span)
                except ValueError:  # more digits than Python converts
                    raise _Slow from None
            else:
                node = ir.Number(float(text), span=span)
            return node, line, col, line, end
        if t == "(":
            self.i += 1
            item = self.expr()
            close = self.expect(")")
            return item[0], self.ln[i], self.col[i], *self.end(close)  # the parentheses widen its extent
        if t == "[":
            self.i += 1
            items = []
            if self.k[self.i] != "]":
                items.append(_plain(self.expr()))
                while self.k[self.i] == ",":
                    self.i += 1
                    items.append(_plain(self.expr()))
            close = self.expect("]")
            end = self.end(close)
            return ir.ListExpr(tuple(items), span=self.span_from(i, end)), self.ln[i], self.col[i], *end
        raise _Slow


def _parse_fast(text: str, lines: _Lines):
    """(statements, comments), or None where the fast path declines."""
    try:
        reader = _Fast(text if text.endswith("\n") else text + "\n", lines)
        body = reader.statements("EOF")
    except (_Slow, RecursionError):
        return None
    return body, reader.comments


# ---- the Lark path ----------------------------------------------------------------------------


class _BracketNewlines:
    """Post-lexer: newlines inside (...) and [...] do not end a statement."""

    always_accept = ("_NL",)

    def process(self, stream):
        depth = 0
        for tok in stream:
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB"):
                depth = max(0, depth - 1)
            elif tok.type == "_NL" and depth:
                continue
            yield tok


@functools.lru_cache(maxsize=1)
def _parser():
    from lark import Lark

    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        postlex=_BracketNewlines(),
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _collect_comment},
        cache=True,  # the grammar analysis, kept in a temporary file keyed by grammar and options (10 ms, not 120)
    )


# The COMMENT tokens of the parse running on this thread. The Lark instance is shared, so the
# lexer callback appends to a per-thread list that `_parse_lark` resets: two threads parsing at
# once keep their own comments.
_local = threading.local()


def _collect_comment(tok):
    comments = getattr(_local, "comments", None)
    if comments is not None:
        comments.append(tok)
    return tok


_FRIENDLY = {
    "EQUAL": "'='",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COMMA": "','",
    "_NL": "end of line",
    "$END": "end of file",
    "ELLIPSIS": "'...'",
    "TILDE": "'~'",
    "COLON": "':'",
}


def _decode_string(tok: str) -> str:
    return tok[1:-1]


class _ToIR:
    """Lark tree → IR: one method per rule, called with the node's `meta` and its children's
    values (see `_to_ir`)."""

    def __init__(self, lines: _Lines):
        self.L = lines

    # -- expressions
    def name(self, meta, ch):
        return ir.Name(str(ch[0]), span=self.L.span(meta))

    def number(self, meta, ch):
        text = str(ch[0])
        if not _INT.fullmatch(text):
            return ir.Number(float(text), span=self.L.span(meta))
        try:
            return ir.Number(int(text), span=self.L.span(meta))
        except ValueError:  # Python converts at most sys.get_int_max_str_digits() digits
            raise PenroseSyntaxError(f"a whole number of more than {sys.get_int_max_str_digits():,} digits", self.L.span(meta)) from None

    def string(self, meta, ch):
        return ir.String(_decode_string(str(ch[0])), span=self.L.span(meta))

    def list(self, meta, ch):
        return ir.ListExpr(tuple(self._expr(c) for c in ch if c is not None), span=self.L.span(meta))

    @staticmethod
    def _bin(op: str):
        def f(self, meta, ch):
            return ir.BinOp(op, self._expr(ch[0]), self._expr(ch[1]), span=self.L.span(meta))

        return f

    add, sub, mul = _bin("+"), _bin("-"), _bin("*")
    div, floordiv, pow = _bin("/"), _bin("//"), _bin("**")

    def compare(self, meta, ch):
        return ir.BinOp(str(ch[1]), self._expr(ch[0]), self._expr(ch[2]), span=self.L.span(meta))

    def neg(self, meta, ch):
        operand = self._expr(ch[0])
        if isinstance(operand, ir.Number):
            return ir.Number(-operand.value, span=self.L.span(meta))
        return ir.Neg(operand, span=self.L.span(meta))

    def attr(self, meta, ch):
        # x.shape and x.detach are the only attributes; shape needs an index, detach a call
        return ("attr", ch[0], str(ch[1]), self.L.span(meta))

    def index(self, meta, ch):
        base, idx = ch
        span = self.L.span(meta)
        if isinstance(base, tuple) and base[0] == "attr" and base[2] == "shape":
            if not isinstance(base[1], ir.Name):
                raise PenroseSyntaxError("'.shape' is only available on a named tensor", span)
            if not isinstance(idx, ir.Number) or not isinstance(idx.value, int):
                raise PenroseSyntaxError("a shape index must be a whole number, as in W.shape[1]", idx.span if hasattr(idx, "span") else span)
            return ir.Shape(base[1].id, idx.value, span=span)
        raise PenroseSyntaxError("indexing is only supported as T.shape[i]; use gather(E, ids) to pick rows", span)

    def arglist(self, meta, ch):
        return list(ch)

    def kwarg(self, meta, ch):
        return ("kw", str(ch[0]), ch[1], self.L.tok(ch[0]))

    @staticmethod
    def _once(kws, a):
        # like Python's "keyword argument repeated"
        if any(k == a[1] for k, _ in kws):
            raise PenroseSyntaxError(f"keyword argument {a[1]!r} is repeated", a[3])

    def call(self, meta, ch):
        func, args = ch[0], ch[1] or []
        span = self.L.span(meta)
        pos, kws = [], []
        for a in args:
            if isinstance(a, tuple) and a and a[0] == "kw":
                self._once(kws, a)
                kws.append((a[1], a[2]))
            else:
                if kws:
                    raise PenroseSyntaxError("a positional argument follows a keyword argument", getattr(a, "span", span))
                pos.append(self._expr(a))
        if isinstance(func, tuple) and func[0] == "attr":
            _, obj, attr, aspan = func
            if attr == "detach" and not pos and not kws:
                return ir.Call("detach", (self._expr(obj),), span=span, method=True)
            raise PenroseSyntaxError(f"unknown method '.{attr}()'; the only method is .detach()", aspan)
        if not isinstance(func, ir.Name):
            raise PenroseSyntaxError("only named functions can be called", span)
        return ir.Call(func.id, tuple(pos), tuple((k, self._expr(v)) for k, v in kws), span=span)

    def _expr(self, e):
        """An attribute must have been applied (T.shape[i], x.detach()) by now."""
        if isinstance(e, tuple) and e and e[0] == "attr":
            raise PenroseSyntaxError(f"'.{e[2]}' must be used as T.shape[i] or x.detach()", e[3])
        return e

    # -- statements
    def dim_item(self, meta, ch):
        size = self._expr(ch[1]) if ch[1] is not None else None
        return ir.Dim(str(ch[0]), size, span=self.L.span(meta))

    def dim_decl(self, meta, ch):
        # `dim f = 30, r = 1` stays one line under fmt: every Dim after the first is `grouped`
        return [ch[0]] + [replace(d, grouped=True) for d in ch[1:]]

    def const_item(self, meta, ch):
        return ir.Const(str(ch[0]), self._expr(ch[1]), span=self.L.span(meta))

    def const_decl(self, meta, ch):
        return [ch[0]] + [replace(c, grouped=True) for c in ch[1:]]

    def legs(self, meta, ch):
        toks = [c for c in ch if c is not None]
        legs = [str(c) for c in toks]
        spans = [self.L.tok(c) for c in toks]
        batched = False
        if "..." in legs:
            if legs.index("...") != 0 or legs.count("...") > 1:
                raise PenroseSyntaxError("'...' may only stand first among the legs", self.L.span(meta))
            batched = True
            legs, spans = legs[1:], spans[1:]
        return (tuple(legs), batched, tuple(spans))

    def init(self, meta, ch):
        args = ch[1] or []
        kws = []
        for a in args:
            if not (isinstance(a, tuple) and a[0] == "kw"):
                raise PenroseSyntaxError("init arguments are written by keyword, as normal(std=0.02)", getattr(a, "span", self.L.span(meta)))
            self._once(kws, a)
            kws.append((a[1], self._expr(a[2])))
        return ir.Init(str(ch[0]), tuple(kws), span=self.L.span(meta))

    def _tensor(self, kind, meta, ch, dtype=None, init=None, saved=True):
        legs, batched, leg_spans = ch[1]
        return ir.Tensor(kind, str(ch[0]), legs, dtype or "float", init, batched, span=self.L.span(meta), leg_spans=leg_spans,
                         saved=saved)

    def input_decl(self, meta, ch):
        return self._tensor("input", meta, ch, dtype=str(ch[2]) if ch[2] is not None else None)

    def formal(self, meta, ch):
        return self._tensor("formal", meta, ch, dtype=str(ch[2]) if ch[2] is not None else None)

    def param_decl(self, meta, ch):
        return self._tensor("param", meta, ch, init=ch[2])

    def buffer_decl(self, meta, ch):
        return self._tensor("buffer", meta, ch, init=ch[2], saved=ch[3] is None)

    def targets(self, meta, ch):
        return tuple(str(c) for c in ch)

    def stated(self, meta, ch):
        legs, batched, leg_spans = ch[1]
        if batched:
            raise PenroseSyntaxError("stated legs name the result's own legs; its batch legs ('...') come from the operands",
                                     self.L.span(meta))
        return ((str(ch[0]),), legs, leg_spans)

    def as_mod(self, meta, ch):
        return ("as", str(ch[0]), self.L.span(meta))

    def repeat_mod(self, meta, ch):
        return ("repeat", (self._expr(ch[0]), ch[1] is not None), self.L.span(meta))

    def assign(self, meta, ch):
        targets, value, *mods = ch
        legs, leg_spans = None, ()
        if isinstance(targets[0], tuple):  # stated: ((name,), legs, leg spans)
            targets, legs, leg_spans = targets
        instance = repeat = None
        shared = False
        for kind, val, span in mods:
            if kind == "as":
                if instance is not None:
                    raise PenroseSyntaxError("'as' given twice", span)
                instance = val
            else:
                if repeat is not None:
                    raise PenroseSyntaxError("'repeat' given twice", span)
                repeat, shared = val
        return ir.Assign(targets, self._expr(value), instance, repeat, span=self.L.span(meta), shared=shared, legs=legs,
                         leg_spans=leg_spans)

    def output_stmt(self, meta, ch):
        return ir.Output(tuple(str(c) for c in ch), span=self.L.span(meta))

    def return_stmt(self, meta, ch):
        return ir.Return(tuple(self._expr(c) for c in ch), span=self.L.span(meta))

    def block_def(self, meta, ch):
        name, *rest = ch
        formals = tuple(f for f in rest if isinstance(f, ir.Tensor) and f.kind == "formal")
        body = _flatten([s for s in rest if not (isinstance(s, ir.Tensor) and s.kind == "formal")])
        return ir.Block(str(name), formals, tuple(body), span=self.L.span(meta))

    def include_stmt(self, meta, ch):
        return ir.Include(_decode_string(str(ch[0])), span=self.L.span(meta))

    def label_stmt(self, meta, ch):
        return ir.Label(str(ch[0]), _decode_string(str(ch[1])), span=self.L.span(meta))

    def start(self, meta, ch):
        return _flatten(ch)


def _to_ir(tree, lines: _Lines):
    """Apply `_ToIR` bottom-up, left to right, with a loop (a 10,000-term sum or 1,000 nested
    calls need no stack)."""
    from lark import Tree

    build = _ToIR(lines)
    todo, values = [(tree, False)], []
    while todo:
        node, ready = todo.pop()
        if not isinstance(node, Tree):
            values.append(node)  # a token, or None for an absent optional part
        elif not ready:
            todo.append((node, True))
            todo.extend((child, False) for child in reversed(node.children))
        else:
            n = len(node.children)
            children = values[len(values) - n :]
            del values[len(values) - n :]
            values.append(getattr(build, node.data)(node.meta, children))
    return values[0]


def _flatten(items):
    out = []
    for s in items:
        if s is None:
            continue
        if isinstance(s, list):
            out.extend(s)
        else:
            out.append(s)
    return out


def _syntax_error(e, lines: _Lines) -> PenroseSyntaxError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    line = getattr(e, "line", 0) or 0
    col = getattr(e, "column", 0) or 0
    at_end = isinstance(e, UnexpectedToken) and e.token.type == "$END"  # lark places $END on the last token
    if isinstance(e, UnexpectedEOF) or line <= 0 or at_end:
        line = max(1, len(lines.lines))
        col = len(lines.line(line)) + 1
        return PenroseSyntaxError("unexpected end of file", Span(lines.file, line, col, line, col + 1, lines.line(line)))
    if isinstance(e, UnexpectedCharacters):
        ch = lines.line(line)[col - 1 : col] or "?"
        msg = f"unexpected character {ch!r}"
        if ch in "{}" :
            msg += "; braces only open and close a block body"
        return PenroseSyntaxError(msg, Span(lines.file, line, col, line, col + 1, lines.line(line)))
    tok = e.token
    width = max(1, len(str(tok)))
    expected = sorted({_FRIENDLY.get(t, t.lower() if t.isupper() and not t.startswith("__") else t) for t in (e.expected or ()) if not t.startswith("__")})
    shown = str(tok) if tok.type != "_NL" else "end of line"
    if tok.type == "$END":
        shown = "end of file"
    msg = f"unexpected {shown!r}" if tok.type not in ("_NL", "$END") else f"unexpected {shown}"
    before = lines.line(line)[: col - 1].strip()
    if tok.type == "EQUAL" and before in _KEYWORDS:  # `const = 3`: a keyword where a name was meant
        msg += f"; {before!r} is a keyword, not a name"
    elif tok.type == "EQUAL" and "COLON" not in (e.expected or ()):
        msg += "; statements are 'name = expression', one per line"
    if 0 < len(expected) <= 6:
        msg += f"; expected {', '.join(expected)}"
    return PenroseSyntaxError(msg, Span(lines.file, line, col, line, col + width, lines.line(line)))


def _parse_lark(text: str, lines: _Lines):
    """(statements, comments) by Lark; a syntax error is a positioned PenroseSyntaxError."""
    from lark.exceptions import UnexpectedInput

    comments: list = []
    _local.comments = comments
    try:
        tree = _parser().parse(text if text.endswith("\n") else text + "\n")
        return _to_ir(tree, lines), comments
    except UnexpectedInput as e:
        raise _syntax_error(e, lines) from None
    finally:
        _local.comments = []


# ---- both -------------------------------------------------------------------------------------


@deep
def parse(text: str, file: str = "<string>") -> ir.Diagram:
    """Parse `.pen` text into a Diagram (syntax only; `penrose.check` checks the rest).

    Thread-safe, and deep programs (a 10,000-term sum, 1,000 nested calls) parse; past even
    that room the error is a positioned `PenroseSyntaxError`, never a RecursionError. A UTF-8
    byte-order mark is dropped and CRLF line ends read as LF, so positions are those an editor
    shows; the Diagram's `source` is the text so normalised.

    >>> parse("dim t = 3").body[0]
    Dim(name='t', size=Number(value=3), note='')
    """
    text = _normalise(text)
    lines = _Lines(text, file)
    if "\r" in text:
        raise _lone_cr(text, lines)
    try:
        body, comments = _parse_fast(text, lines) or _parse_lark(text, lines)
        body = _attach_comments(body, comments, lines)
    except RecursionError:
        raise _too_deep(lines) from None
    except PenroseSyntaxError as e:
        raise _unclosed(e, lines) from None
    return ir.Diagram(tuple(body), file=file, source=text)


def _unclosed(e: PenroseSyntaxError, lines: _Lines) -> PenroseSyntaxError:
    """A syntax error caused by an unclosed `(` or `[`, reported at the bracket: inside brackets
    line breaks are free, so the parser stumbles only on a later line (or at the end of the
    file, or at a closer of the other kind). The note shows where the statement ended; the
    parser's own complaint follows. Any other error is returned as it is.

    >>> _unclosed(PenroseSyntaxError("unexpected 'z'", Span("<string>", 2, 1, 2, 2, "z = 1")),
    ...           _Lines("y = tanh(x\\nz = 1\\n", "<string>")).render().splitlines()[0]
    "<string>:1:9: error: '(' is never closed"
    """
    at = (e.span.line, e.span.col)
    if not at[0]:
        return e
    stack: list = []  # (bracket, line, col) still open at the error
    last = None  # (line, col) of the last character of code before the error
    closer = None
    never: set = set()  # (line, col) of the brackets the whole text never closes (or closes with the other kind)
    opened: list = []
    seen = False
    for ln, text in enumerate(lines.lines, 1):
        quote = None
        for col, ch in enumerate(text, 1):
            before = (ln, col) < at
            if not seen and (ln, col) >= at:  # what is open where the parser stopped
                seen, stack = True, list(opened)
                closer = ch if (ln, col) == at and ch in ")]" else None
            if quote:
                quote = None if ch == quote else quote
                continue
            if ch == "#":
                break
            if ch in "'\"":
                quote = ch
            elif ch in "([":
                opened.append((ch, ln, col))
            elif ch in ")]" and opened:
                top = opened.pop()
                if top[0] != {")": "(", "]": "["}[ch]:
                    never.add(top[1:])
                    if opened and opened[-1][0] == {")": "(", "]": "["}[ch]:
                        opened.pop()
            if before and not ch.isspace():
                last = (ln, col)
    never |= {o[1:] for o in opened}
    if not seen:  # the parser stopped at the end of the file
        stack = list(opened)
    stack = [o for o in stack if o[1:] in never]
    if not stack or last is None:
        return e
    bracket, bl, bc = stack[-1]
    eof = e.message.startswith("unexpected end of file")
    mismatch = closer is not None and closer != {"(": ")", "[": "]"}[bracket]
    if not (eof or mismatch or at[0] > bl):
        return e  # an error on the bracket's own line, inside it: the parser's message says it
    msg = f"{bracket!r} is never closed" + (f" (a {closer!r} comes first)" if mismatch else "")
    end_line, end_col = last
    notes = [(f"the statement ends here, on line {end_line}, with {bracket!r} still open",
              Span(lines.file, end_line, end_col, end_line, end_col + 1, lines.line(end_line)))]
    if not mismatch:
        notes.append((f"then the parser stopped: {e.message}", e.span))
    else:
        notes = [(f"the {closer!r} that comes first", e.span)]
    return PenroseSyntaxError(msg, Span(lines.file, bl, bc, bl, bc + 1, lines.line(bl)), notes=tuple(notes) + e.notes)


def _too_deep(lines: _Lines):
    return too_deep(Span(lines.file, 1, 1, 1, 2, lines.line(1)), kind=PenroseSyntaxError)


def _lone_cr(text: str, lines: _Lines) -> PenroseSyntaxError:
    """The error at the first CR without an LF after it (CRLFs are LFs by now). An editor shows a
    line break there and penrose would not, so a comment would swallow the line after it."""
    at = text.index("\r")
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    shown = lines.line(line).replace("\r", "\u240d")  # a CR in the caret line would send the terminal's cursor back
    return PenroseSyntaxError("a carriage return (CR) without a line feed after it: a line of a .pen file ends with "
                              "LF or CRLF; save the file with those line ends", Span(lines.file, line, col, line, col + 1, shown))


def _normalise(text: str) -> str:
    """Drop a byte-order mark; CRLF → LF (a lone CR stays, and is reported where it stands)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n") if "\r" in text else text


@deep
def parse_file(path: str | os.PathLike[str]) -> ir.Diagram:
    """Parse a `.pen` file; errors name the file (penrose.io.read_text says which ones)."""
    from penrose.io import read_text

    path = os.fspath(path)
    return parse(read_text(path), file=path)


def _attach_comments(body, comments, lines: _Lines):
    """Every comment joins the IR, in order, none lost (`penrose fmt` prints them all):

    - a comment on a line of its own becomes a Comment statement;
    - one after the code that ends a statement, or after a block's `{`, is that statement's note;
    - any other comment inside a statement (between the arguments of a call broken over lines,
      inside a leg list, on a block header broken over lines) becomes a Comment just before
      the statement, and one after a block's `}` a Comment just after the block.
    """
    by_line = {tok.line: tok for tok in comments}
    used: set[int] = set()

    def code_before(ln) -> bool:
        return bool(lines.line(ln)[: by_line[ln].column - 1].strip())

    def comment(ln) -> ir.Comment:
        used.add(ln)
        text = _clean(str(by_line[ln]))
        m = _STEP.match(text)
        return ir.Comment(text, int(m.group(1)) if m else None, span=lines.tok(by_line[ln]))

    def note(ln) -> dict:
        if ln in by_line and ln not in used and code_before(ln):
            used.add(ln)
            return {"note": _clean(str(by_line[ln])), "note_span": lines.tok(by_line[ln])}
        return {"note": ""}

    def left(a, b) -> list[int]:
        """The lines from a to b that hold a comment not yet placed."""
        return [ln for ln in range(a, b + 1) if ln in by_line and ln not in used]

    def brace_line(block) -> int:
        """The line of the block's `{` (its header may break over lines inside the brackets)."""
        for ln in range(block.span.line, block.span.end_line + 1):
            text = lines.line(ln)
            if ln in by_line:
                text = text[: by_line[ln].column - 1]
            if "{" in text:
                return ln
        return block.span.line

    def weave(stmts, lo, hi):
        merged = []  # (line, rank, comment line, statement): comments before their statement
        for s in stmts:
            first, last = s.span.line, s.span.end_line
            if isinstance(s, ir.Block):
                head = brace_line(s)
                inner = weave(s.body, head + 1, last - 1)
                s = replace(s, body=tuple(inner), **note(head))
                merged += [(first, 0, ln, comment(ln)) for ln in left(first, head)]
                merged += [(last, 2, ln, comment(ln)) for ln in left(last, last)]  # `}  # ...`
            elif hasattr(s, "note"):
                s = replace(s, **note(last))
                merged += [(first, 0, ln, comment(ln)) for ln in left(first, last)]
            merged.append((first, 1, 0, s))
        merged += [(ln, 0, ln, comment(ln)) for ln in left(lo, hi) if not code_before(ln)]
        merged.sort(key=lambda m: m[:3])
        return [m[3] for m in merged]

    body = weave(body, 1, len(lines.lines) + 1)
    # a comment after code that no statement spans (not expected): kept, at its line
    rest = [(tok.line, comment(tok.line)) for tok in comments if tok.line not in used]
    if rest:
        keyed = [(s.span.line, 1, s) for s in body] + [(ln, 0, c) for ln, c in rest]
        body = [s for _, _, s in sorted(keyed, key=lambda k: k[:2])]
    return body


def _clean(comment: str) -> str:
    text = comment[1:].rstrip()  # trailing blanks (and the '\r' of a CRLF line) are not part of it
    return text[1:] if text.startswith(" ") else text
