"""Text → IR: `parse(text)` and `parse_file(path)`.

>>> from penrose.parse import parse
>>> d = parse("dim e = 4\\ninput x[e]\\noutput x")
>>> d.body[1].legs
('e',)
"""

from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import replace
from importlib import resources
from pathlib import Path

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from penrose import ir
from penrose.errors import PenroseError, PenroseSyntaxError, Span
from penrose.stack import deep, too_deep

_STEP = re.compile(r"^\s*(\d+)\)\s*")


def grammar_text() -> str:
    """The Lark grammar, shipped inside the package (penrose.grammar)."""
    try:
        return (resources.files("penrose.grammar") / "penrose.lark").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):  # a plain source checkout without install
        return (Path(__file__).resolve().parent.parent / "grammar" / "penrose.lark").read_text(encoding="utf-8")


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
def _parser() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        postlex=_BracketNewlines(),
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _collect_comment},
    )


# The COMMENT tokens of the parse running on this thread. The Lark instance is shared, so the
# lexer callback appends to a per-thread list that `parse` resets: two threads parsing at once
# keep their own comments.
_local = threading.local()


def _collect_comment(tok: Token) -> Token:
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

    def tok(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column, self.line(tok.line))


def _decode_string(tok: str) -> str:
    return tok[1:-1]


@v_args(meta=True)
class _ToIR(Transformer_NonRecursive):  # iterative: a 10,000-term sum or 1,000 nested calls need no stack
    def __init__(self, lines: _Lines):
        super().__init__()
        self.L = lines

    # -- expressions
    def name(self, meta, ch):
        return ir.Name(str(ch[0]), span=self.L.span(meta))

    def number(self, meta, ch):
        text = str(ch[0])
        value = int(text) if re.fullmatch(r"\d+", text) else float(text)
        return ir.Number(value, span=self.L.span(meta))

    def string(self, meta, ch):
        return ir.String(_decode_string(str(ch[0])), span=self.L.span(meta))

    def list(self, meta, ch):
        return ir.ListExpr(tuple(c for c in ch if c is not None), span=self.L.span(meta))

    def _bin(op):
        def f(self, meta, ch):
            return ir.BinOp(op, ch[0], ch[1], span=self.L.span(meta))

        return f

    add, sub, mul = _bin("+"), _bin("-"), _bin("*")
    div, floordiv, pow = _bin("/"), _bin("//"), _bin("**")

    def compare(self, meta, ch):
        return ir.BinOp(str(ch[1]), ch[0], ch[2], span=self.L.span(meta))

    def neg(self, meta, ch):
        if isinstance(ch[0], ir.Number):
            return ir.Number(-ch[0].value, span=self.L.span(meta))
        return ir.Neg(ch[0], span=self.L.span(meta))

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

    def _tensor(self, kind, meta, ch, dtype=None, init=None):
        legs, batched, leg_spans = ch[1]
        return ir.Tensor(kind, str(ch[0]), legs, dtype or "float", init, batched, span=self.L.span(meta), leg_spans=leg_spans)

    def input_decl(self, meta, ch):
        return self._tensor("input", meta, ch, dtype=str(ch[2]) if ch[2] is not None else None)

    def formal(self, meta, ch):
        return self._tensor("formal", meta, ch, dtype=str(ch[2]) if ch[2] is not None else None)

    def param_decl(self, meta, ch):
        return self._tensor("param", meta, ch, init=ch[2])

    def buffer_decl(self, meta, ch):
        return self._tensor("buffer", meta, ch, init=ch[2])

    def targets(self, meta, ch):
        return tuple(str(c) for c in ch)

    def as_mod(self, meta, ch):
        return ("as", str(ch[0]), self.L.span(meta))

    def repeat_mod(self, meta, ch):
        return ("repeat", self._expr(ch[0]), self.L.span(meta))

    def assign(self, meta, ch):
        targets, value, *mods = ch
        instance = repeat = None
        for kind, val, span in mods:
            if kind == "as":
                if instance is not None:
                    raise PenroseSyntaxError("'as' given twice", span)
                instance = val
            else:
                if repeat is not None:
                    raise PenroseSyntaxError("'repeat' given twice", span)
                repeat = val
        return ir.Assign(targets, self._expr(value), instance, repeat, span=self.L.span(meta))

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


def _syntax_error(e: UnexpectedInput, lines: _Lines) -> PenroseSyntaxError:
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
    if tok.type == "EQUAL" and "COLON" not in (e.expected or ()):
        msg += "; statements are 'name = expression', one per line"
    if 0 < len(expected) <= 6:
        msg += f"; expected {', '.join(expected)}"
    return PenroseSyntaxError(msg, Span(lines.file, line, col, line, col + width, lines.line(line)))


@deep
def parse(text: str, file: str = "<string>") -> ir.Diagram:
    """Parse `.pen` text into a Diagram (syntax only; `penrose.check` checks the rest).

    Thread-safe, and deep programs (a 10,000-term sum, 1,000 nested calls) parse; past even
    that room the error is a positioned `PenroseSyntaxError`, never a RecursionError.

    >>> parse("dim t = 3").body[0]
    Dim(name='t', size=Number(value=3), note='')
    """
    lines = _Lines(text, file)
    _local.comments = comments = []
    try:
        tree = _parser().parse(text if text.endswith("\n") else text + "\n")
        body = _ToIR(lines).transform(tree)
        body = _attach_comments(body, comments, lines)
    except UnexpectedInput as e:
        raise _syntax_error(e, lines) from None
    except VisitError as e:
        if isinstance(e.orig_exc, PenroseError):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise _too_deep(lines, getattr(e.obj, "meta", None)) from None
        raise
    except RecursionError:
        raise _too_deep(lines, None) from None
    finally:
        _local.comments = []
    return ir.Diagram(tuple(body), file=file, source=text)


def _too_deep(lines: _Lines, meta):
    span = lines.span(meta) if meta is not None and not getattr(meta, "empty", True) else Span(lines.file, 1, 1, 1, 2, lines.line(1))
    err = too_deep(span)
    return PenroseSyntaxError(err.message, err.span)


@deep
def parse_file(path) -> ir.Diagram:
    """Parse a `.pen` file; errors name the file."""
    path = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PenroseError(f"cannot read {path}: {e.strerror or e}", Span(path)) from None
    except UnicodeDecodeError as e:
        raise PenroseSyntaxError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})", Span(path)) from None
    return parse(text, file=path)


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
