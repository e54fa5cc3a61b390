"""`penrose lsp`: a Language Server Protocol server for `.pen` files, over stdio.

    penrose lsp                      # an editor starts it; it speaks JSON-RPC on stdin/stdout
    penrose lsp --include-path DIR   # includes may also reach DIR (as `penrose check --include-path`)

What an editor gets (docs/editors.md has the set-up for VS Code, Neovim, Emacs and Helix):

- **diagnostics** on open, on every change and on save: the checker's error (a `PenroseError`,
  at its exact range) and every warning (`Checked.warnings`), the "did you mean" hint as a quick
  fix, the notes ("first declared here", "included from here") as related locations. An error
  inside an included file is shown there, and at the `include` that brings it in;
- **hover**: a tensor's kind, legs, sizes and entries; a dim's size and index-legend meaning; a
  const's value; a block's signature and parameters; a function's signature and documentation
  (the table of operations, `penrose/ops.py`); an einsum's equation and FLOPs (the plan that
  `penrose plan` prints);
- **go to definition** of tensors (the SSA version a use reads), dims, consts, blocks and the
  file an `include` names; **completion** of tensors in scope, dims, consts, blocks, functions,
  initialisers and keywords; **formatting** (`penrose fmt`); **document symbols**.

Includes are followed: a file included by open documents is re-checked with them whenever it
changes, in the editor (its unsaved text is what the includer sees) or on disk. A file of dims
and blocks only (a library, no `output`) is checked as part of a file that includes it: an open
one, else a diagram beside it.

Checks run off the event loop, on one worker thread (`Checks`), once edits pause: a storm of
edits is checked once, at its last version, and a check outdated while it runs is not published.
Requests never wait for a check: they read a parse of the document as it is now, typed by its
last check where its lines are unchanged (`Analyzer.result`). The server keeps its own copy of
each open document, changed with the protocol's line ends (`apply_change`).

The analysis (`Analyzer`) is plain Python, free of pygls; `server` wires it to pygls (the
`editor` extra: `pip install 'penrose-diagrams[editor]'`). Positions inside are 0-based (line,
character in code points); the server converts them to the client's encoding (UTF-16 unless
the client offers another).
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from penrose.attrs import Einsum, Ref
from penrose import ir
from penrose.errors import PenroseError, Span
from penrose.reading import file_key
from penrose.tables import DTYPES, PEN_KEYWORDS

if TYPE_CHECKING:
    from pygls.lsp.server import LanguageServer

    from penrose.checked import Checked

KEYWORDS = tuple(sorted(PEN_KEYWORDS))  # the language's keywords and dtypes, from the checker's tables
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HINT = re.compile(r"did you mean '([^']+)'\?")
TENSOR_KINDS = ("input", "param", "buffer", "formal", "tensor")
MAX_FILE_BYTES = 8 * 1024 * 1024  # the largest file the server reads from disk (an include, a file not open) or editor's text it parses
LATEX_MAX_VALUES = 100  # a hover shows a statement's equation up to this many operations
PLAN_MAX_OPERANDS = 32  # and plans an einsum of up to this many operands (1,000 took 12 s)
SETTLE_S = 0.02  # seconds without an edit before the server checks (edits closer together make one check)

# ---- positions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """0-based, end exclusive, characters counted in code points (what Python indexes)."""

    line: int
    char: int
    end_line: int
    end_char: int

    def contains(self, line: int, char: int) -> bool:
        return (self.line, self.char) <= (line, char) <= (self.end_line, self.end_char)

    def size(self) -> tuple:
        return (self.end_line - self.line, self.end_char - self.char if self.end_line == self.line else 1 << 30)


_EOL = re.compile(r"\r\n|\r|\n")  # the protocol's line ends (str.splitlines also splits at \x0c, \u2028 ...)


def _utf16(ch: str) -> int:
    return 2 if ord(ch) > 0xFFFF else 1


def code_point(line: str, units: int, width=_utf16) -> int:
    """The index into `line` (no line end) of the position `units` client code units in, each
    character `width(ch)` units wide (UTF-16 by default); past the end, the end.

    >>> code_point("a\\U0001F600b", 3), code_point("ab", 99)
    (2, 2)
    """
    n = 0
    for i, ch in enumerate(line):
        if n >= units:
            return i
        n += width(ch)
    return len(line)


def apply_change(text: str, start: tuple[int, int], end: tuple[int, int], new: str, width=_utf16) -> str:
    """`text` with the range from `start` to `end` ((line, character) as the client counts them:
    lines end at LF, CRLF or CR, characters in code units of `width`) replaced by `new`. A
    position past the end of a line or of the text is read at that end, a range that ends before
    it starts as the range between the two (as editors do).

    >>> apply_change("ab\\u2028c\\nxy\\n", (1, 1), (1, 2), "Z").split("\\n")  # U+2028 ends no line
    ['ab\u2028c', 'xZ', '']
    """
    ends = [m.start() for m in _EOL.finditer(text)] + [len(text)]  # where each line's text ends
    starts = [0] + [m.end() for m in _EOL.finditer(text)]

    def offset(line: int, char: int) -> int:
        if line >= len(starts):
            return len(text)
        return starts[line] + code_point(text[starts[line]:ends[line]], char, width)

    a, b = sorted((offset(*start), offset(*end)))
    return text[:a] + new + text[b:]


def span_range(span: Span) -> Range:
    """A Span (1-based, end exclusive) as a Range; a span without an end covers one character,
    one without a position the file's start."""
    if not span.line:
        return Range(0, 0, 0, 0)
    line, char = span.line - 1, max(span.col - 1, 0)
    if span.end_line and (span.end_line, span.end_col) > (span.line, span.col):
        return Range(line, char, span.end_line - 1, max(span.end_col - 1, 0))
    return Range(line, char, line, char + 1)


# a path as a key (penrose.reading.file_key: symlinks resolved, case folded where the file system
# folds it), cached: links are not expected to change under an editor session
_norm = functools.lru_cache(maxsize=4096)(file_key)


# ---- the analysis ------------------------------------------------------------------------------


@dataclass
class Related:
    file: str
    range: Range
    message: str


@dataclass
class Diagnostic:
    file: str
    range: Range
    message: str
    severity: str = "error"  # error | warning
    related: list = field(default_factory=list)  # Related
    suggestion: str | None = None  # the "did you mean" name


@dataclass
class Def:
    """Where a name is defined: its kind, the range of the name and of the whole statement."""

    name: str
    kind: str  # dim | const | input | param | buffer | formal | tensor | block
    file: str
    range: Range
    full: Range
    scope: str | None  # the block whose body holds it (None: the top level; dims, consts, blocks: global)
    node: ir.Stmt | None = None  # the ir statement
    target: int = 0  # which target of an assignment


@dataclass
class Result:
    """One analysed document."""

    path: str
    text: str
    diagram: ir.Diagram | None = None
    checked: Checked | None = None  # the Checked the document's symbols are read in (its own, or its includer's)
    context: str | None = None  # the includer a library was checked in
    diagnostics: list = field(default_factory=list)
    deps: set = field(default_factory=set)  # normalised paths of the files it includes, transitively
    includes: dict = field(default_factory=dict)  # line (0-based) of an include -> its target path
    defs: list = field(default_factory=list)  # Def, this file's and its includes'
    seconds: float = 0.0
    checked_lines: list | None = None  # the lines `checked` was made from (a check that fails keeps the last good one)

    def fresh(self, line: int) -> bool:
        """Whether `checked` still describes line `line` (it was checked as it stands now)."""
        lines, old = self.lines, self.checked_lines
        return old is None or (line < len(lines) and line < len(old) and lines[line] == old[line])

    @functools.cached_property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def own_defs(self) -> list[Def]:
        me = _norm(self.path)
        return [d for d in self.defs if _norm(d.file) == me]


class Analyzer:
    """Open documents and what the checker says about them.

    >>> a = Analyzer()
    >>> a.set_text("/tmp/m.pen", "dim e = 2\\ninput x[e]\\ny = relu(z)\\noutput y")
    ['/tmp/m.pen']
    >>> [(d.range.line, d.range.char, d.message.split(";")[0]) for d in a.analyse("/tmp/m.pen").diagnostics][:1]
    [(2, 9, "unknown tensor 'z'")]
    """

    def __init__(self, include_paths=(), roots=None, checked_elsewhere: bool = False) -> None:
        from penrose.workspace import Workspace

        # True in the server: open documents are checked on its check thread, and queries about
        # one not checked yet read its parse instead of checking it on the thread that answers them
        self.checked_elsewhere = checked_elsewhere
        self.include_paths = tuple(include_paths)
        # where files on disk may be read (besides the include paths): a list of folders, or a
        # callable giving them (the server's workspace folders); None: anywhere (a Python caller)
        self.roots = roots
        # parses (open texts over the disk, read through `read_disk`), include graphs, stamps
        self.workspace = Workspace(self.include_paths, reader=self.read_disk, max_text=MAX_FILE_BYTES)
        self.docs: dict[str, str] = {}  # path -> text of the open documents
        self.results: dict[str, Result] = {}  # path -> its last full analysis (parse and check)
        self._parsed: dict[str, Result] = {}  # path -> a parse of newer text than its last analysis (`result`)
        self._defs: dict[str, tuple] = {}  # normalised path -> (Diagram, its Defs)

    # -- documents
    def set_text(self, path: str, text: str) -> list[str]:
        """Open or change a document; returns the open documents to analyse again (it and those
        that include it)."""
        self.docs[path] = text
        self.workspace.set_text(path, text)
        return self.affected(path)

    def close(self, path: str) -> list[str]:
        self.docs.pop(path, None)
        if not any(_norm(p) == _norm(path) for p in list(self.docs)):
            self.workspace.close(path)
        self.results.pop(path, None)
        self._parsed.pop(path, None)
        return [p for p in self.affected(path) if p != path]

    def file_changed(self, path: str) -> list[str]:
        """A file changed on disk (saved, or changed by another program)."""
        self.workspace.forget(path)
        return self.affected(path)

    def affected(self, path: str) -> list[str]:
        key = _norm(path)
        out = [path] if path in self.docs else []
        for p, r in list(self.results.items()):  # a snapshot: the server's check thread adds to it
            if p == path or p not in self.docs:
                continue
            if key in r.deps or (r.context and (_norm(r.context) == key or key in self._deps_of(r.context))):
                out.append(p)
        return out

    def text_of(self, path: str) -> str | None:
        """A file's text: the open document's, else the disk's (None when unreadable)."""
        if path in self.docs:
            return self.docs[path]
        t = self.workspace.text(path)
        if t is not None:
            return t
        try:
            return self.read_disk(path).lstrip("\ufeff").replace("\r\n", "\n")
        except PenroseError:
            return None

    def refusal(self, path: str) -> str | None:
        """Why the file at `path` may not be read from disk (None: it may): it must resolve to a
        regular file inside the workspace folders or the include paths (docs/security.md)."""
        if path.startswith("<"):
            return f"cannot read {path}: not a file"
        if "\x00" in path:
            return f"cannot read {path!r}: a file name holds no NUL character"
        if self.roots is not None:
            roots = self.roots() if callable(self.roots) else self.roots
            folders = [*roots, *self.include_paths]
            if not folders:  # a client without workspace folders: those of its open documents
                folders = sorted({os.path.dirname(os.path.abspath(p)) for p in list(self.docs) if not p.startswith("<")})
            from penrose.reading import _inside

            if not _inside(path, folders):
                where = " or ".join(folders) or "no folder"
                return (f"cannot read {path}: it lies outside the workspace folders and include paths ({where}); "
                        "open it in the editor or add its folder to the workspace (or --include-path)")
        return None

    def read_disk(self, path) -> str:
        """A file's text from disk, if `refusal` allows it: a regular file of at most
        MAX_FILE_BYTES (a PenroseError naming the file otherwise)."""
        from penrose.io import read_text

        path = os.fspath(path)
        why = self.refusal(path)
        if why:
            raise PenroseError(why, Span(path))
        return read_text(path, max_bytes=MAX_FILE_BYTES)

    def _parse_file(self, path: str):
        """The Diagram of a file (open text or disk; cached by the workspace); a PenroseError if it fails."""
        return self.workspace.parse(path, included=True)

    # -- analysis
    def analyse(self, path: str) -> Result:
        """Parse and check the open document `path` (or a file on disk) and index its names."""
        from penrose.stack import deep

        return deep(self._analyse)(path)  # one worker thread for the parse, the includes and the check

    def _analyse(self, path: str, check: bool = True) -> Result:
        """`analyse`; with check=False only the parse and the names of the document as it is now,
        typed by its last check (`checked`, `checked_lines`), and not kept in `results`."""
        from penrose.parser import parse

        start = time.perf_counter()
        if path not in self.docs and self.workspace.text(path) is None:  # not open: read from disk only where allowed
            try:
                self.read_disk(path)
            except PenroseError as e:
                res = Result(path, "", diagnostics=[Diagnostic(path, Range(0, 0, 0, 0), e.message)])
                res.seconds = time.perf_counter() - start
                self.results[path] = res
                return res
        text = self.text_of(path)
        if text is None:
            text = ""
        res = Result(path, _clean(text))
        prev = self.results.get(path)
        try:
            found = self._parse_file(path) if text.strip() and path in self.docs else parse(text, file=path)
            if isinstance(found, PenroseError):
                raise found
            res.diagram = found
        except PenroseError as e:
            res.diagnostics = self._diagnostics(e, res)
            if prev is not None:  # keep the last good symbols while the text does not parse
                res.defs, res.checked, res.deps, res.includes = prev.defs, prev.checked, prev.deps, prev.includes
                res.checked_lines = prev.checked_lines or prev.lines
            res.seconds = time.perf_counter() - start
            if check:
                self.results[path] = res
            return res
        self._index(res)
        if not check:  # the names as written now; types where the lines are as last checked
            if prev is not None:
                res.checked, res.context = prev.checked, prev.context
                res.checked_lines = prev.checked_lines or prev.lines
            res.seconds = time.perf_counter() - start
            return res
        if any(isinstance(s, ir.Output) for s in res.diagram.body):
            self._check(res, res.diagram)
        else:  # a library of dims and blocks: checked within a diagram that includes it
            includer = self._includer(path)
            if includer is not None:
                res.context = includer
                including = self._parse_file(includer)
                if isinstance(including, ir.Diagram):
                    self._check(res, including)
        res.seconds = time.perf_counter() - start
        self.results[path] = res
        return res

    def _check(self, res: Result, diagram: ir.Diagram):
        try:  # the one loader, its includes read through the workspace (open texts first)
            res.checked = self.workspace.load(diagram)
        except PenroseError as e:
            res.diagnostics += self._diagnostics(e, res)
            prev = self.results.get(res.path)
            if prev is not None and prev.checked is not None:  # hovers keep the last good types where lines are unchanged
                res.checked, res.checked_lines = prev.checked, prev.checked_lines or prev.lines
            return
        me = _norm(res.path)
        for message, span in res.checked.warnings:
            if span.line and _norm(span.file) == me:
                res.diagnostics.append(Diagnostic(res.path, span_range(span), message, "warning"))

    def _diagnostics(self, e: PenroseError, res: Result) -> list[Diagnostic]:
        me = _norm(res.path)
        related = [Related(s.file, span_range(s), text) for text, s in e.notes if s.line]
        hint = _HINT.search(e.message)
        suggestion = hint.group(1) if hint else None
        file = e.span.file
        if not e.span.line or file.startswith("<") or _norm(file) == me:
            message = e.message + "".join(f"\n{text}" for text, s in e.notes if not s.line)
            return [Diagnostic(res.path, span_range(e.span), message, "error", related, suggestion)]
        # elsewhere: an included file (shown at the include that brings it in), or the includer of
        # a library (shown in that file, not here)
        for line, target in res.includes.items():
            t = _norm(target)
            r = self.results.get(target)
            if t == _norm(file) or (r and _norm(file) in r.deps) or _norm(file) in self._deps_of(target):
                where = res.diagram.body if res.diagram else ()
                inc = next((s for s in where if isinstance(s, ir.Include) and s.span.line - 1 == line), None)
                rng = span_range(inc.span) if inc else Range(line, 0, line, 1)
                return [Diagnostic(res.path, rng, f"in {os.path.basename(file)}: {e.message}", "error",
                                   [Related(file, span_range(e.span), e.message), *related], None)]
        if res.context is not None:
            return []  # the includer's own mistake: shown in the includer
        return [Diagnostic(res.path, Range(0, 0, 0, 0), f"{file}:{e.span.line}:{e.span.col}: {e.message}", "error",
                           [Related(file, span_range(e.span), e.message), *related], None)]

    def _deps_of(self, path: str) -> set:
        out: set = set()
        self._walk_includes(path, self._parse_file(path), out, [], None)
        return out

    def _includer(self, path: str) -> str | None:
        """A diagram that includes the library `path`: an open document, else a file beside it."""
        key = _norm(path)
        for p, r in sorted(list(self.results.items())):
            if p != path and key in r.deps and r.diagram is not None and _has_output(r.diagram):
                return p
        folder = os.path.dirname(os.path.abspath(path))
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".pen"))
        except (OSError, ValueError):  # no such folder; a name holding NUL (an editor's document may)
            return None
        for name in names:
            other = os.path.join(folder, name)
            if _norm(other) == key:
                continue
            d = self._parse_file(other)
            if isinstance(d, ir.Diagram) and _has_output(d) and key in self._deps_of(other):
                return other
        return None

    def _index(self, res: Result):
        """The names this document and its includes define, and the files it includes."""
        res.defs = []
        res.includes = {}
        assert res.diagram is not None, "a document is indexed once it parses"
        self._defs_of(res.diagram, res.text.split("\n"), res.defs)
        seen: set = set()
        self._walk_includes(res.path, res.diagram, seen, res.defs, res.includes)
        res.deps = seen

    def _walk_includes(self, path, diagram, seen: set, defs, includes):
        """The files `diagram` includes, transitively (the loader's walk, through the workspace):
        their keys into `seen`, their names into `defs`, the lines of its own includes into
        `includes` ({0-based line: target})."""
        if not isinstance(diagram, ir.Diagram):
            return
        graph = self.workspace.includes(diagram)
        if includes is not None:
            for s in diagram.body:
                target = graph.targets.get((diagram.file, s.path)) if isinstance(s, ir.Include) else None
                if isinstance(target, str):
                    includes[s.span.line - 1] = target
        for target, sub in graph.files.items():
            key = _norm(target)
            if key in seen:
                continue
            seen.add(key)
            if isinstance(sub, ir.Diagram) and defs is not None:
                hit = self._defs.get(key)
                if hit is None or hit[0] is not sub:
                    found: list = []
                    self._defs_of(sub, (self.text_of(target) or "").lstrip("\ufeff").split("\n"), found)
                    hit = self._defs[key] = (sub, found)
                defs.extend(hit[1])

    @staticmethod
    def _defs_of(diagram: ir.Diagram, lines: list[str], out: list):
        file = diagram.file

        def add(name, kind, span, scope, node, target=0, start=None):
            out.append(Def(name, kind, file, _name_range(lines, span, name, start), span_range(span), scope, node, target))

        def body(stmts, scope):
            for s in stmts:
                if isinstance(s, ir.Dim):
                    add(s.name, "dim", s.span, None, s)
                elif isinstance(s, ir.Const):
                    add(s.name, "const", s.span, None, s)
                elif isinstance(s, ir.Tensor):
                    add(s.name, s.kind, s.span, scope, s, start=len(s.kind))
                elif isinstance(s, ir.Assign):
                    for i, t in enumerate(s.targets):
                        add(t, "tensor", s.span, scope, s, i)
                elif isinstance(s, ir.Block):
                    add(s.name, "block", s.span, None, s, start=len("block"))
                    for f in s.formals:
                        add(f.name, "formal", f.span, s.name, f)
                    body(s.body, s.name)

        body(diagram.body, None)

    # -- queries (0-based positions in code points)
    def result(self, path: str) -> Result:
        """What the queries read: the last analysis of `path`, or, when the open document has
        changed since (its check still queued or running), a parse of its text as it is now,
        typed by that last check where its lines are unchanged. A request is answered from the
        latest text without waiting for a check."""
        r = self.results.get(path)
        text = self.docs.get(path)
        if r is None and not (self.checked_elsewhere and text is not None):
            return self.analyse(path)
        if text is None or (r is not None and _clean(text) == r.text):
            assert r is not None, "a file not open is analysed above"
            return r
        quick = self._parsed.get(path)
        if quick is None or quick.text != _clean(text):
            from penrose.stack import deep

            quick = self._parsed[path] = deep(self._analyse)(path, check=False)
        return quick

    def definition(self, path: str, line: int, char: int):
        """(file, Range) of what the name at the position means, or None."""
        res = self.result(path)
        if line in res.includes and _in_string(res.lines, line, char):
            return res.includes[line], Range(0, 0, 0, 0)
        d = self._lookup(res, line, char)
        return (d.file, d.range) if d else None

    def _lookup(self, res: Result, line: int, char: int) -> Def | None:
        word, _ = _word_at(res.lines, line, char)
        if not word or _in_string(res.lines, line, char) or _in_comment(res.lines, line, char):
            return None
        scope = _scope_at(res, line)
        me = _norm(res.path)
        tensors = [d for d in res.defs if d.name == word and d.kind in TENSOR_KINDS and d.scope == scope and _norm(d.file) == me]
        globals_ = [d for d in res.defs if d.name == word and d.kind in ("dim", "const", "block")]
        if _in_brackets(res.lines, line, char) and any(d.kind == "dim" for d in globals_):
            return next(d for d in globals_ if d.kind == "dim")
        if tensors:
            own = [d for d in tensors if d.full.contains(line, char)]
            if own and _before_equals(res.lines, line, char):
                return own[0]  # the target itself
            before = [d for d in tensors if d.full.line < line or (d.full.line == line and not own)]
            before = [d for d in before if not d.full.contains(line, char)] or before
            return (before or tensors)[-1]
        return globals_[0] if globals_ else None

    def hover(self, path: str, line: int, char: int):
        """(markdown, Range of the word or call) or None."""
        res = self.result(path)
        word, rng = _word_at(res.lines, line, char)
        in_string = _in_string(res.lines, line, char)
        if _in_comment(res.lines, line, char):
            return None
        if line in res.includes and in_string:
            target = res.includes[line]
            names = [f"`{x.name}`" for x in res.defs if _norm(x.file) == _norm(target) and x.kind in ("dim", "block")]
            return f"**include** `{target}`\n\ndims and blocks: " + (", ".join(names) or "none"), None
        d = self._lookup(res, line, char) if word else None
        if d is not None and not (word == "einsum" and d.kind not in TENSOR_KINDS):
            return self._describe(res, d), rng
        if word and not in_string:
            from penrose.ops import OPS

            if word in OPS and word != "einsum" and _called(res.lines, line, rng):
                return _describe_op(OPS[word]), rng
        e = self._einsum_at(res, line, char)
        if e is not None:
            return e
        if word and not in_string and re.search(r"~\s*$", res.lines[line][: rng.char]):
            from penrose.tables import INITS

            if word in INITS:
                kws = ", ".join(f"{k}={dflt!r}" for k, (dflt, _) in INITS[word].items())
                return f"**init** `{word}" + (f"({kws})`" if kws else "`") + " — how the tensor starts (docs/language.md)", rng
        if word == "einsum" and not in_string:
            from penrose.ops import OPS

            return _describe_op(OPS["einsum"]), rng
        if word in KEYWORDS and not in_string:
            return f"`{word}` — a keyword of `.pen` (docs/language.md)", rng
        return None

    def _describe(self, res: Result, d: Def) -> str:
        c = res.checked
        if d.kind == "dim":
            size = _dim_size(c, d.name)
            meaning = _legend_of(res, d)
            text = f"**dim** `{d.name}`" + (f" = {size:,}" if size is not None else " (no size: read from the inputs at run time)")
            if isinstance(d.node, ir.Dim) and d.node.size is not None and not isinstance(d.node.size, ir.Number):
                from penrose.fmt import format_expr

                text += f" — `{format_expr(d.node.size)}`"
            if meaning:
                text += f"\n\n{meaning} (index legend)"
            return text + _where(res, d)
        if d.kind == "const":
            from penrose.fmt import format_expr

            assert isinstance(d.node, ir.Const), "a const's Def holds its statement"
            text = f"**const** `{d.name}` = `{format_expr(d.node.value)}`"
            here = _norm(d.file) == _norm(res.path)  # an included const: as its includer was checked
            value = c.constants.get(d.name) if c is not None and (not here or res.fresh(d.range.line)) else None
            if value is not None and not isinstance(d.node.value, ir.Number):
                text += f" = {value:g}" if isinstance(value, float) else f" = {value:,}"
            return text + _where(res, d)
        if d.kind == "block":
            return self._describe_block(res, d)
        return self._describe_tensor(res, d)

    def _describe_block(self, res: Result, d: Def) -> str:
        blk = d.node
        assert isinstance(blk, ir.Block), "a block's Def holds its statement"
        formals = ", ".join(f"{f.name}[{', '.join(f.legs)}]" for f in blk.formals)
        text = f"**block** `{blk.name}({formals})`"
        c = res.checked
        body = c.blocks.get(blk.name) if c is not None else None
        if body is not None:
            outs = ", ".join(f"[{', '.join(t.legs)}]" for _, t in body.outputs)
            text += f" → `{outs}`"
            params = [f"`{p.tensor.name}[{', '.join(p.tensor.legs)}]`" for p in body.params]
            text += f"\n\n{body.param_count():,} parameter(s)" + (": " + ", ".join(params) if params else "")
        return text + _where(res, d)

    def _describe_tensor(self, res: Result, d: Def) -> str:
        c = res.checked
        body = None
        if c is not None:
            body = c if d.scope is None else c.blocks.get(d.scope)
        ttype = None
        kind = {"formal": "block argument", "tensor": "tensor"}.get(d.kind, d.kind)
        if _norm(d.file) == _norm(res.path) and not res.fresh(d.full.line):
            body = None
        if body is not None:
            if d.kind in ("input", "param", "buffer", "formal"):
                decl = body.decls.get(d.name)
                ttype = decl.type if decl is not None else None
            else:
                for s in body.stmts:
                    if s.stmt is d.node or (isinstance(d.node, ir.Assign) and s.stmt.span == d.node.span and s.targets == d.node.targets):
                        if d.target < len(s.types):
                            ttype = s.types[d.target]
                        break
        if ttype is None:
            legs = getattr(d.node, "legs", None)
            shape = f"[{', '.join(legs)}]" if legs is not None else ""
            text = f"**{kind}** `{d.name}{shape}`"
            if d.kind == "tensor":
                from penrose.fmt import format_expr

                assert isinstance(d.node, ir.Assign), "a tensor's Def holds its assignment"
                text += f" = `{_clip(format_expr(d.node.value))}`"
            return text + _where(res, d)
        assert c is not None and body is not None, "a type is read from a checked body"
        if ttype.dtype == "scalar":
            text = f"**{kind}** `{d.name}`: a plain number"
            return text + _where(res, d)
        sizes = [c.size(cl) for cl in ttype.cls]
        legs = ", ".join(ttype.legs)
        dtype = {"float": "float", "int": "int64", "bool": "bool"}.get(ttype.dtype, ttype.dtype)
        text = f"**{kind}** `{d.name}[{('..., ' if ttype.batched else '') + legs}]` : {dtype}"
        rows = []
        free = []
        for leg, cl, n in zip(ttype.legs, ttype.cls, sizes):
            rows.append(f"{leg} = {n:,}" if n is not None else f"{leg} (size read from the inputs)")
            if n is not None and c.sizes.is_free(cl):
                free.append(leg)
        if rows:
            text += "\n\nlegs: " + ", ".join(rows)
            if all(n is not None for n in sizes):
                import math

                text += f" · {math.prod(n for n in sizes if n is not None):,} entries"
        if free:
            text += f"\n\nfree leg(s) {', '.join(free)}: read from the inputs at run time (default sizes shown)"
        if ttype.batched:
            text += "\n\ntakes leading batch dims at run time"
        node = d.node
        if isinstance(node, ir.Tensor) and node.init is not None:
            from penrose.fmt import format_expr

            args = ", ".join(f"{k}={format_expr(v)}" for k, v in node.init.kwargs)
            text += f"\n\ninit: `{node.init.name}" + (f"({args})`" if args else "`")
        if d.kind == "tensor":
            from penrose.fmt import format_expr

            assert isinstance(node, ir.Assign), "a tensor's Def holds its assignment"
            text += f"\n\n`{d.name} = {_clip(format_expr(node.value))}`"
        label = c.labels.get(d.name) if body is c else body.labels.get(d.name)
        if label:
            text += f"\n\nlabel: “{label}”"
        note = getattr(node, "note", "")
        if note:
            text += f"\n\n{note}"
        return text + _where(res, d)

    def _einsum_at(self, res: Result, line: int, char: int):
        """The einsum call around the position: its equation and FLOPs."""
        c = res.checked
        if c is None or res.diagram is None:
            return None
        scope = _scope_at(res, line)
        body = c if scope is None else c.blocks.get(scope)
        if body is None:
            return None
        from penrose.report import einsum_plan, einsums

        me = _norm(res.path)
        best = None
        for s in body.stmts:
            if s.value is None or not s.stmt.span.line or _norm(s.stmt.span.file) != me:
                continue
            r = span_range(s.stmt.span)
            if not r.contains(line, char) or not res.fresh(r.line):
                continue
            for v in einsums(s.value):
                vr = span_range(v.span)
                if v.span.line and vr.contains(line, char) and (best is None or vr.size() < best[1].size()):
                    best = (v, vr, s)
        if best is None:
            return None
        v, vr, s = best
        if not all(res.fresh(i) for i in range(vr.line, vr.end_line + 1)):
            return None
        lines = [f"**einsum** `'{v.of(Einsum).spec}'`", "", "```", _einsum_text(v, s), "```"]
        try:
            if len(v.args) > PLAN_MAX_OPERANDS:  # planning takes seconds there: not on the thread that answers requests
                raise PenroseError(f"{len(v.args):,} operands are planned by `penrose plan`, not in a hover")
            plan = einsum_plan(c, v)
        except PenroseError as e:
            lines.append(f"\nno plan: {e.message}")
        else:
            runs = 1
            if scope is not None:
                from penrose.report import block_runs

                runs = block_runs(c).get(scope, 1)
            flops = f"{plan.opt_flops:,} FLOPs"
            if len(plan.steps) > 1:
                flops += f" in {len(plan.steps)} steps (naive {plan.naive_flops:,}, {plan.speedup:.1f}x); largest intermediate {plan.largest_intermediate:,}"
            if runs != 1:
                flops += f"; × {runs:,} runs of block {scope} = {plan.opt_flops * runs:,}"
            lines += ["", flops + " (one batch element, free legs at their default sizes)"]
            for i, st in enumerate(plan.steps, 1):
                if len(plan.steps) > 1:
                    lines.append(f"- step {i}: `{st.spec}` {st.flops:,} FLOPs")
        latex = _statement_latex(c, s)
        if latex:
            lines += ["", "```latex", latex, "```"]
        return "\n".join(lines), vr

    def completions(self, path: str, line: int, char: int) -> list[tuple[str, str, str, str]]:
        """(label, kind, detail, documentation) for the names that may stand at the position."""
        from penrose.ops import OPS
        from penrose.tables import INITS

        res = self.result(path)
        lines = res.lines
        text = lines[line][:char] if line < len(lines) else ""
        if _in_comment(lines, line, char) or _in_string(lines, line, char):
            return []
        out = []
        if re.search(r"~\s*[A-Za-z_]*$", text):
            return [(n, "init", f"{n}(" + ", ".join(f"{k}={dflt!r}" for k, (dflt, _) in kw.items()) + ")" if kw else n, "initialiser")
                    for n, kw in INITS.items()]
        if re.search(r":\s*[A-Za-z_]*$", text) and re.match(r"\s*(input|param|buffer)\b", text):
            return [(n, "keyword", "dtype", "") for n in DTYPES]
        scope = _scope_at(res, line)
        dims = [d for d in res.defs if d.kind == "dim"]
        seen = set()

        def add(label, kind, detail, doc=""):
            if (label, kind) not in seen:
                seen.add((label, kind))
                out.append((label, kind, detail, doc))

        if _in_brackets(lines, line, char) or re.match(r"\s*dim\b", text):
            for d in dims:
                add(d.name, "dim", _dim_detail(res, d))
            if _in_brackets(lines, line, char):
                return out
        me = _norm(res.path)
        for d in res.defs:
            if d.kind in TENSOR_KINDS and d.scope == scope and _norm(d.file) == me:
                add(d.name, "tensor", d.kind if d.kind != "formal" else "block argument")
        for d in dims:
            add(d.name, "dim", _dim_detail(res, d))
        for d in res.defs:
            if d.kind == "const":
                add(d.name, "const", "const")
            elif d.kind == "block":
                node = d.node
                add(d.name, "block", f"block {d.name}(" + ", ".join(f"{f.name}[{', '.join(f.legs)}]" for f in node.formals) + ")")
        for name, op in OPS.items():
            if op.category != "operator":
                add(name, "function", op.signature, op.doc)
        if not text.strip() or re.fullmatch(r"\s*[A-Za-z_]*", text):
            for k in KEYWORDS:
                add(k, "keyword", "keyword")
        else:
            for k in ("as", "repeat", "shared"):
                add(k, "keyword", "keyword")
        return out

    def symbols(self, path: str) -> list[tuple]:
        """(name, kind, detail, full Range, name Range, children) for the document's own definitions."""
        res = self.result(path)
        out = []
        blocks: dict = {}
        for d in res.own_defs():
            detail = d.kind
            legs = getattr(d.node, "legs", None)
            if d.kind in ("input", "param", "buffer", "formal") and legs is not None:
                detail = f"{d.kind if d.kind != 'formal' else 'argument'} [{', '.join(legs)}]"
            elif d.kind == "dim":
                detail = _dim_detail(res, d)
            entry: tuple[str, str, str, Range, Range, list[object]] = (d.name, d.kind, detail, d.full, d.range, [])
            if d.kind == "block":
                blocks[d.name] = entry
                out.append(entry)
            elif d.scope is not None and d.scope in blocks and d.kind != "dim":
                blocks[d.scope][5].append(entry)
            elif d.scope is not None and d.kind == "dim" and d.scope in blocks:
                blocks[d.scope][5].append(entry)
            else:
                out.append(entry)
        return out

    def format(self, path: str) -> str | None:
        """The document in canonical form (`penrose fmt`), or None when it does not parse or
        cannot be read (never the form of an empty text: that edit would blank the file)."""
        from penrose.fmt import format_diagram
        from penrose.parser import parse

        raw = self.text_of(path)
        if raw is None:
            return None
        try:
            text = format_diagram(parse(raw, file=path))
        except PenroseError:
            return None
        first = raw.find("\n")
        if first > 0 and raw[first - 1] == "\r":
            text = text.replace("\n", "\r\n")
        return text


def _clean(text: str) -> str:
    """A document's text as positions count it: no byte-order mark, LF line ends."""
    return text.lstrip("\ufeff").replace("\r\n", "\n")


def _has_output(d: ir.Diagram) -> bool:
    return any(isinstance(s, ir.Output) for s in d.body)


def _name_range(lines: list[str], span: Span, name: str, start: int | None = None) -> Range:
    """Where `name` is written in the statement at `span` (the first whole word after `start`
    characters), else the statement's start."""
    if not span.line or span.line > len(lines):
        return span_range(span)
    last = span.end_line if span.end_line >= span.line else span.line
    pattern = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])")
    for ln in range(span.line, min(last, len(lines)) + 1):
        text = lines[ln - 1]
        begin = span.col - 1 + (start or 0) if ln == span.line else 0
        m = pattern.search(text, max(begin, 0))
        if m:
            return Range(ln - 1, m.start(), ln - 1, m.end())
    r = span_range(span)
    return Range(r.line, r.char, r.line, r.char + len(name))


def _word_at(lines: list[str], line: int, char: int):
    if line >= len(lines):
        return None, None
    text = lines[line]
    for m in _WORD.finditer(text):
        if m.start() <= char <= m.end():
            if text[m.start() - 1 : m.start()].isdigit() and m.start() > 0:
                continue
            return m.group(), Range(line, m.start(), line, m.end())
    return None, None


def _scan(text: str, char: int) -> tuple[bool, bool]:
    """(in a string, in a comment) at `char` of the line `text`."""
    quote = None
    for ch in text[:char]:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return False, True
    return quote is not None, False


def _in_string(lines, line, char) -> bool:
    return line < len(lines) and _scan(lines[line], char)[0]


def _in_comment(lines, line, char) -> bool:
    return line < len(lines) and _scan(lines[line], char)[1]


def _in_brackets(lines, line, char) -> bool:
    """Inside the [...] of a tensor declaration (or a block's argument list)."""
    if line >= len(lines):
        return False
    text = lines[line][:char]
    return text.rfind("[") > text.rfind("]") and bool(re.match(r"\s*(input|param|buffer|block)\b", lines[line]))


def _before_equals(lines, line, char) -> bool:
    text = lines[line] if line < len(lines) else ""
    m = re.match(r"[^=()\[\]'\"#]*=(?!=)", text)
    return m is not None and char < m.end() - 1


def _called(lines, line, rng) -> bool:
    text = lines[line] if line < len(lines) else ""
    rest = text[rng.end_char :].lstrip()
    before = text[: rng.char].rstrip()
    return rest.startswith("(") or before.endswith(".")


def _scope_at(res: Result, line: int) -> str | None:
    me = _norm(res.path)
    for d in res.defs:
        if d.kind == "block" and _norm(d.file) == me and d.full.line <= line <= d.full.end_line:
            return d.name
    return None


def _dim_size(c, name: str):
    if c is None or name not in c.dims:
        return None
    return c.size(c.dims[name])


def _dim_detail(res: Result, d: Def) -> str:
    size = _dim_size(res.checked, d.name)
    return f"dim {d.name}" + (f" = {size:,}" if size is not None else "")


def _legend_of(res: Result, d: Def) -> str:
    from penrose.views import legend

    try:
        if res.diagram is not None and _norm(d.file) == _norm(res.path):
            return legend(res.diagram).get(d.name, "")
        if res.checked is not None:
            found = legend(res.checked.diagram).get(d.name, "")
            if found:
                return found
    except Exception:  # a legend is a nicety; never fail a hover on it
        return ""
    return ""


def _where(res: Result, d: Def) -> str:
    place = "" if _norm(d.file) == _norm(res.path) else f"{os.path.basename(d.file)}, "
    scope = f" in block `{d.scope}`" if d.scope else ""
    return f"\n\n*{place}line {d.range.line + 1}{scope}*"


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _describe_op(op) -> str:
    text = f"```\n{op.signature}\n```\n{op.doc}"
    if op.legs:
        text += f"\n\nresult legs: {op.legs}"
    kws = [k for k in op.keywords if k.rule != "any"]
    if kws:
        text += "\n\n" + ", ".join(f"`{k.name}` {k.rule_text}" for k in kws)
    return text


def _einsum_text(v, s) -> str:
    """`q[t, e] = Σ_d Z[t, d] · W_q[d, e]`: the einsum as an index equation, in plain text."""
    terms, out = v.of(Einsum).terms, v.of(Einsum).out
    from penrose.fmt import format_expr

    exprs = s.stmt.values if isinstance(s.stmt, ir.Return) else (getattr(s.stmt, "value", None),)
    call = next((e for x in exprs if x is not None for e in ir.walk(x)
                 if isinstance(e, ir.Call) and e.func == "einsum" and e.span == v.span), None)
    names = []
    for i, a in enumerate(v.args):
        if getattr(a, "op", None) == "ref":
            names.append(a.of(Ref).name)
        elif call is not None and i + 1 < len(call.args):
            names.append(f"({_clip(format_expr(call.args[i + 1]), 40)})")
        else:
            names.append(f"(operand {i + 1})")
    used = []
    for t in terms:
        for label in t:
            if label not in used:
                used.append(label)
    summed = [x for x in used if x not in out]
    target = "einsum"
    if isinstance(s.stmt, ir.Assign) and len(s.stmt.targets) == 1 and s.value is v:
        target = s.stmt.targets[0]
    lhs = f"{target}[{', '.join(out)}]" if out else target
    product = " · ".join(f"{n}[{', '.join(t)}]" if t else n for n, t in zip(names, terms))
    sigma = f"Σ_{{{', '.join(summed)}}} " if summed else ""
    return f"{lhs} = {sigma}{product}"


def _statement_latex(c, s) -> str:
    """The statement's equation as LaTeX, for a statement of at most LATEX_MAX_VALUES operations
    (sympy's work grows faster than the statement: 200 nested einsums took 4 s, 800 two minutes,
    all of it on the thread that answers every request)."""
    from itertools import islice

    from penrose.views import values

    if s.value is None or sum(1 for _ in islice(values(s.value), LATEX_MAX_VALUES + 1)) > LATEX_MAX_VALUES:
        return ""
    try:
        from penrose.rendering.explain import statement_latex

        return statement_latex(c, s)
    except Exception:  # the equation is a nicety (sympy may refuse an odd statement)
        return ""


# ---- checks off the event loop ----------------------------------------------------------------


class Checks:
    """Documents to check, checked one at a time on a worker thread, each at its latest version.

    `schedule(paths)` queues paths and returns at once; the worker calls `work(path)` for each,
    once `settle` seconds have passed without a new schedule (a storm of edits is read in full
    before any check begins, and no check competes with the reading for the interpreter). A path
    scheduled again before its turn is checked once, at its last text, and `stale(path)` tells
    `work` that its path was scheduled again while it ran, so that its now outdated result is
    dropped rather than published.

    >>> done = []
    >>> checks = Checks(done.append)
    >>> checks.schedule(["a.pen", "b.pen", "a.pen"])
    >>> checks.wait(5)
    True
    >>> sorted(done)
    ['a.pen', 'b.pen']
    """

    def __init__(self, work, settle: float = SETTLE_S):
        import threading

        self._work, self.settle = work, settle
        self._last = 0.0  # time.monotonic() of the last schedule
        self._cond = threading.Condition()
        self._pending: dict[str, None] = {}  # ordered: the order paths were first scheduled
        self._running: str | None = None
        self._thread: threading.Thread | None = None
        self.lock = threading.RLock()  # held while a result is published, and by whoever clears one

    def schedule(self, paths) -> None:
        import threading

        with self._cond:
            for p in paths:
                self._pending.setdefault(p, None)
            self._last = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="penrose-lsp-checks", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def stale(self, path: str) -> bool:
        """Whether `path` is queued again (its text or an include changed since its check began)."""
        with self._cond:
            return path in self._pending

    def wait(self, timeout: float) -> bool:
        """Wait until nothing is queued or running (tests, benchmarks); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and self._running is None, timeout)

    def _loop(self) -> None:
        import logging

        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                while (left := self._last + self.settle - time.monotonic()) > 0:  # more edits may follow
                    self._cond.wait(left)
                path = next(iter(self._pending))
                del self._pending[path]
                self._running = path
            try:
                self._work(path)
            except Exception:  # noqa: BLE001 - one failed check must not stop the others
                logging.getLogger(__name__).exception("checking %s failed", path)
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()


# ---- the server (pygls) ------------------------------------------------------------------------

SEVERITY = {"error": 1, "warning": 2}
SYMBOL_KIND = {"dim": 26, "const": 14, "input": 13, "param": 8, "buffer": 8, "formal": 13, "tensor": 13, "block": 12}
COMPLETION_KIND = {"tensor": 6, "dim": 25, "const": 21, "block": 3, "function": 3, "keyword": 14, "init": 4}


def server(include_paths=()) -> LanguageServer:
    """The pygls LanguageServer for `.pen` (not started)."""
    try:
        from lsprotocol import types as T
        from pygls.lsp.server import LanguageServer
        from pygls.uris import from_fs_path, to_fs_path
    except ImportError as e:
        raise PenroseError(
            f"penrose lsp needs pygls 2 ({e}); install it with: pip install 'penrose-diagrams[editor]' (or pip install pygls)"
        ) from None

    from penrose import __version__

    ls = LanguageServer("penrose", __version__, text_document_sync_kind=T.TextDocumentSyncKind.Incremental)
    def workspace_roots() -> list[str]:
        """The client's workspace folders (and root), as paths: where files on disk may be read."""
        try:
            ws = ls.workspace
        except Exception:  # noqa: BLE001 - before initialize: no workspace, so no folder
            return []
        uris_ = [f.uri for f in (ws.folders or {}).values()] + ([ws.root_uri] if ws.root_uri else [])
        return [p for p in (to_fs_path(u) for u in uris_ if isinstance(u, str) and u.startswith("file:")) if p]

    an = Analyzer(include_paths, roots=workspace_roots, checked_elsewhere=True)
    uris: dict[str, str] = {}  # path -> the URI the client uses for it

    def path_of(uri: str) -> str:
        path = to_fs_path(uri) if uri.startswith("file:") else None
        path = path or uri
        uris.setdefault(path, uri)
        return path

    def uri_of(path: str) -> str:
        if path in uris:
            return uris[path]
        key = _norm(path)
        for p, u in uris.items():
            if _norm(p) == key:
                return u
        return from_fs_path(path) or path

    def lines_of(path: str) -> list[str]:
        return (an.text_of(path) or "").lstrip("\ufeff").replace("\r\n", "\n").split("\n")

    def to_client(path: str, r: Range, lines=None) -> T.Range:
        lines = lines if lines is not None else lines_of(path)
        codec = ls.workspace.position_codec

        def pos(line, char):
            if line >= len(lines):
                return T.Position(line=line, character=char)
            return codec.position_to_client_units(lines, T.Position(line=line, character=char))

        return T.Range(start=pos(r.line, r.char), end=pos(r.end_line, r.end_char))

    def width(ch: str) -> int:  # a character's code units in the client's position encoding
        return int(ls.workspace.position_codec.impl.code_units_for_char(ch))

    def from_client(path: str, p: T.Position) -> tuple[int, int]:
        lines = lines_of(path)
        return p.line, code_point(lines[p.line], p.character, width) if p.line < len(lines) else p.character

    def check(p: str):
        """The check thread's work: analyse `p` as it is now; publish unless it changed meanwhile."""
        if p not in an.docs:
            return  # closed since it was queued
        res = an.analyse(p)
        with checks.lock:
            if p not in an.docs:  # closed while it was checked: its diagnostics were cleared
                an.results.pop(p, None)
            elif not checks.stale(p):  # else a newer version is queued: this result is outdated
                send(p, res)

    checks = Checks(check)

    def publish(paths):
        """Check `paths` again (open documents), off the event loop, latest versions only."""
        checks.schedule(paths)

    def send(p: str, res: Result):
        """Publish the diagnostics of `res`, the analysis of the open document `p`."""
        lines = res.lines
        diags = []
        for d in res.diagnostics:
            related = [T.DiagnosticRelatedInformation(location=T.Location(uri=uri_of(x.file), range=to_client(x.file, x.range)), message=x.message)
                       for x in d.related if not x.file.startswith("<")]
            diags.append(T.Diagnostic(
                range=to_client(p, d.range, lines), message=d.message, severity=T.DiagnosticSeverity(SEVERITY[d.severity]),
                source="penrose", related_information=related or None,
                data={"suggestion": d.suggestion} if d.suggestion else None,
            ))
        ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri_of(p), diagnostics=diags))

    @ls.feature(T.INITIALIZED)
    def initialized(params: T.InitializedParams):
        """Ask the client to tell us about .pen files changed on disk (includes edited elsewhere)."""
        ws = ls.client_capabilities.workspace
        watch = ws.did_change_watched_files if ws else None
        if watch and watch.dynamic_registration:
            options = T.DidChangeWatchedFilesRegistrationOptions(watchers=[T.FileSystemWatcher(glob_pattern="**/*.pen")])
            ls.client_register_capability(T.RegistrationParams(registrations=[
                T.Registration(id="penrose-pen-files", method=T.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options)]))

    @ls.feature(T.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: T.DidOpenTextDocumentParams):
        publish(an.set_text(path_of(params.text_document.uri), params.text_document.text))

    @ls.feature(T.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: T.DidChangeTextDocumentParams):
        """Apply the changes to our copy of the text, lines counted as the protocol counts them
        (pygls's own copy splits lines where str.splitlines does: at a form feed, U+2028 ...)."""
        path = path_of(params.text_document.uri)
        text = an.docs.get(path)
        if text is None:  # a change to a document never opened: there is no text to change
            return
        for ch in params.content_changes:
            if isinstance(ch, T.TextDocumentContentChangePartial):
                r = ch.range
                text = apply_change(text, (r.start.line, r.start.character), (r.end.line, r.end.character), ch.text, width)
            else:
                text = ch.text
        publish(an.set_text(path, text))

    @ls.feature(T.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: T.DidSaveTextDocumentParams):
        publish(an.file_changed(path_of(params.text_document.uri)))

    @ls.feature(T.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: T.DidCloseTextDocumentParams):
        path = path_of(params.text_document.uri)
        with checks.lock:  # a check of it still running publishes nothing after this
            others = an.close(path)
            ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))
        publish(others)

    @ls.feature(T.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def watched(params: T.DidChangeWatchedFilesParams):
        todo: list = []
        for ch in params.changes:
            for p in an.file_changed(path_of(ch.uri)):
                if p not in todo:
                    todo.append(p)
        publish(todo)

    @ls.feature(T.TEXT_DOCUMENT_HOVER)
    def hover(params: T.HoverParams):
        path = path_of(params.text_document.uri)
        found = an.hover(path, *from_client(path, params.position))
        if found is None:
            return None
        text, rng = found
        return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=text), range=to_client(path, rng) if rng else None)

    @ls.feature(T.TEXT_DOCUMENT_DEFINITION)
    def definition(params: T.DefinitionParams):
        path = path_of(params.text_document.uri)
        found = an.definition(path, *from_client(path, params.position))
        if found is None:
            return None
        file, rng = found
        return T.Location(uri=uri_of(file), range=to_client(file, rng))

    @ls.feature(T.TEXT_DOCUMENT_COMPLETION, T.CompletionOptions(trigger_characters=["[", "~", ":"]))
    def completion(params: T.CompletionParams):
        path = path_of(params.text_document.uri)
        items = [T.CompletionItem(label=label, kind=T.CompletionItemKind(COMPLETION_KIND.get(kind, 1)), detail=detail,
                                  documentation=T.MarkupContent(kind=T.MarkupKind.Markdown, value=doc) if doc else None,
                                  sort_text=f"{'0' if kind in ('tensor', 'dim') else '1'}{label}")
                 for label, kind, detail, doc in an.completions(path, *from_client(path, params.position))]
        return T.CompletionList(is_incomplete=False, items=items)

    @ls.feature(T.TEXT_DOCUMENT_FORMATTING)
    def formatting(params: T.DocumentFormattingParams):
        """The whole open document in canonical form: one edit. A document the editor has not
        opened gets none, and a message saying so (an edit made against a text the editor may not
        hold would garble it: an unreadable file once gave the form of an empty text, which blanked
        the first line)."""
        path = path_of(params.text_document.uri)
        raw = an.docs.get(path)
        if raw is None:
            why = an.refusal(path)
            ls.window_show_message(T.ShowMessageParams(type=T.MessageType.Warning, message=(
                f"penrose: cannot format {path}: it is not open in the editor" + (f"; {why}" if why else ""))))
            return []
        text = an.format(path)
        if text is None or text == raw:
            return []
        lines = raw.split("\n")
        end = to_client(path, Range(len(lines) - 1, len(lines[-1]), len(lines) - 1, len(lines[-1])), lines).end
        return [T.TextEdit(range=T.Range(start=T.Position(line=0, character=0), end=end), new_text=text)]

    @ls.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def document_symbol(params: T.DocumentSymbolParams):
        path = path_of(params.text_document.uri)
        lines = lines_of(path)

        def sym(entry):
            name, kind, detail, full, rng, children = entry
            sel = to_client(path, rng, lines)
            whole = to_client(path, full, lines)
            if (whole.start.line, whole.start.character) > (sel.start.line, sel.start.character) or \
                    (whole.end.line, whole.end.character) < (sel.end.line, sel.end.character):
                whole = sel
            return T.DocumentSymbol(name=name, kind=T.SymbolKind(SYMBOL_KIND.get(kind, 13)), detail=detail, range=whole,
                                    selection_range=sel, children=[sym(c) for c in children] or None)

        return [sym(e) for e in an.symbols(path)]

    @ls.feature(T.TEXT_DOCUMENT_CODE_ACTION, T.CodeActionOptions(code_action_kinds=[T.CodeActionKind.QuickFix]))
    def code_action(params: T.CodeActionParams):
        """"Change to 'W_k'" for each of the document's current diagnostics with a suggestion that
        the client sends back (one it made up, or one outdated by edits since, gets none)."""
        path = path_of(params.text_document.uri)
        lines = lines_of(path)
        def key(message, name, r: T.Range):
            return message, name, r.start.line, r.start.character, r.end.line, r.end.character

        ours = {key(d.message, d.suggestion, to_client(path, d.range, lines))
                for d in an.result(path).diagnostics if d.suggestion} if path in an.docs else set()
        actions = []
        for d in params.context.diagnostics:
            name = (d.data or {}).get("suggestion") if isinstance(d.data, dict) else None
            if key(d.message, name, d.range) not in ours:
                continue
            if isinstance(name, str) and d.range.start.line == d.range.end.line:
                edit = T.WorkspaceEdit(changes={params.text_document.uri: [T.TextEdit(range=d.range, new_text=name)]})
                actions.append(T.CodeAction(title=f"Change to '{name}'", kind=T.CodeActionKind.QuickFix, diagnostics=[d], edit=edit,
                                            is_preferred=True))
        return actions

    ls.penrose_analyzer = an  # type: ignore[attr-defined]  # our analyser, kept on pygls's server for callers
    ls.penrose_checks = checks  # type: ignore[attr-defined]
    return ls


def run_stdio(include_paths=()) -> int:
    """Serve over stdin/stdout until the client says exit (`penrose lsp`)."""
    from penrose.lsp_io import serve_stdio

    ls = server(include_paths)
    serve_stdio(ls)  # pygls's handlers, a transport that survives broken messages (penrose.lsp_io)
    return 0
