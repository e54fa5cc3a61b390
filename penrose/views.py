"""Derived views of a diagram and of its checked IR, written once for every back end.

The IR and the checked IR store only what the source says and what the checker resolved;
everything read off them is a function here, shared by the compiler, the figure, the
explanations and the gallery (STYLE.md, "The IR": derived views are functions, not state):

- `legend(diagram)`: the index legend comment, leg -> meaning; `legend_warnings(diagram)`:
  the declared dims it leaves out;
- `statements(c)`: the statements of a body that compute something (or of any kind);
- `values(v)`: every value of a checked value tree; `refs(v)`: the names it reads;
  `labels_agree(sizes, v)`: an einsum binds each label to one size class;
- `uses(c)`: how each (name, SSA version) of a body is read; `read_counts(c)`: how often;
- `producers(c, upto)`: what each name was last assigned before a statement, and what it
  was computed from.

Einsum specs have one parser, `penrose.einsum_spec`; the checker stores each einsum's resolved
labels in its value (`attrs.terms`, `attrs.out`), so no back end reads a spec again.

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> c = check(parse("# index legend: e embedding\\ndim e = 3\\ninput x[e]\\ny = x * x\\noutput y"))
    >>> legend(c.diagram), [s.targets for s in statements(c)], read_counts(c)
    ({'e': 'embedding'}, [('y',)], {('x', 0): 2, ('y', 0): 1})

Torch-free; imports the IR and the checked IR only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from penrose.attrs import Einsum, Ref
from penrose import ir
from penrose.checked import Checked, CStmt, V
from penrose.errors import Span

COMPUTING = (ir.Assign, ir.Return)  # the statements with a value: the units figures and pages count


# ---- the index legend ------------------------------------------------------------------------

LEGEND_HEAD = "index legend:"  # the canonical header; `_HEAD` also reads 'Index legend -' and the like
_HEAD = re.compile(r"\s*index[ \t]+legend\s*(?:[:=\-\u2013\u2014]|$)\s*(.*)", re.IGNORECASE | re.DOTALL)
_BULLET = re.compile(r"\A(?:[-*\u2022\u2013\u2014]\s+)+")  # '- t: token', '* t token', '• t token'
# an item: a leg name, an optional separator (':', '=', ' - ', ' — '), then its meaning
_ITEM = re.compile(r"([^\W\d]\w*)(?:\s*[:=]|\s+[-\u2013\u2014](?=\s)|\s*[\u2013\u2014])?\s*(.*)", re.DOTALL)
_FIRST_WORD = re.compile(r"[^\W\d]\w*")
_DASH = re.compile(r"\s*[-\u2013\u2014]\s")


def legend(diagram: ir.Diagram) -> dict[str, str]:
    """The index legend: the top-level comment '# index legend: t token, e embedding' (the
    header in any case, ':' or '-' after it), with its continuation lines.

    Continuation lines are comments on the very next lines: indented ('#   e embedding'), or
    unindented when their first word is a dim the diagram declares ('# e embedding'); any other
    comment, a blank line or a statement ends the legend. Each continuation line starts items of
    its own (the one-leg-per-line form), except where it continues an item cut in the middle:
    inside parentheses, or after a line of the comma form that does not end in a comma, when
    the line does not itself start with a leg (a dim, a bullet, 'e: ...', 'e  ...').

    Items are separated by commas outside parentheses. An item is a leg name and its meaning,
    parted by spaces, ':', '=', ' - ' or ' — ', optionally after a bullet ('- t: token'); names
    listed alone share the meaning of the next item ('i, j, k input feature factors' gives all
    three that meaning); an item that does not start with a name and a meaning in words
    ('k >> d') is a remark, not an entry. The first meaning given a leg stands.

    >>> legend(ir.Diagram((ir.Comment("index legend: t token, p key token (the paper's t_p),"), ir.Comment("  e embedding"))))
    {'t': 'token', 'p': "key token (the paper's t_p)", 'e': 'embedding'}
    >>> legend(ir.Diagram((ir.Comment("index legend: i, j, k input feature factors, d latent, k >> d"),)))
    {'i': 'input feature factors', 'j': 'input feature factors', 'k': 'input feature factors', 'd': 'latent'}
    >>> legend(ir.Diagram((ir.Comment("Index legend -"), ir.Comment("  t: token"), ir.Comment("  - e = embedding (width)"))))
    {'t': 'token', 'e': 'embedding (width)'}
    """
    body = diagram.body
    for i, s in enumerate(body):
        m = _HEAD.match(s.text) if isinstance(s, ir.Comment) else None
        if not m:
            continue
        reader = _LegendReader(diagram, m.group(1).strip())
        prev = s
        for nxt in body[i + 1 :]:
            if not (isinstance(nxt, ir.Comment) and _adjacent(prev, nxt) and reader.read(nxt.text)):
                break
            prev = nxt
        return _legend_items(reader.items)
    return {}


def _adjacent(prev: ir.Comment, nxt: ir.Comment) -> bool:
    """`nxt` is on the line right after `prev` (or the positions are not known)."""
    return not (prev.span.line and nxt.span.line) or nxt.span.line == prev.span.line + 1


class _LegendReader:
    """The items of a legend, read line by line (`legend` says how lines continue items)."""

    def __init__(self, diagram: ir.Diagram, head: str):
        self.diagram = diagram
        self._dims: dict[str, ir.Dim] | None = None
        self.items: list[str] = []
        self.depth = 0  # parentheses left open by the last item
        self.comma = False  # the text so far ends with a comma (the next line starts an item)
        self.comma_form = bool(head)  # items on the header line: a comma list, maybe wrapped
        self._add(head, join=False)

    @property
    def dims(self) -> dict[str, ir.Dim]:
        if self._dims is None:  # read only when a line needs them (most legends never do)
            self._dims = _declared_dims(self.diagram)
        return self._dims

    def read(self, text: str) -> bool:
        """Take one continuation comment; False where it is no part of the legend."""
        line = text.strip()
        if not line:
            return False
        if not text[:1].isspace() and not self._leads_with_dim(_BULLET.sub("", line, count=1)):
            return False  # unindented and not about a dim of the diagram: the legend has ended
        join = bool(self.items) and (
            self.depth > 0 or (self.comma_form and not self.comma and not self._starts_item(line))
        )
        self._add(line, join)
        return True

    def _leads_with_dim(self, line: str) -> bool:
        m = _FIRST_WORD.match(line)
        return m is not None and m.group() in self.dims and line[m.end() : m.end() + 1] in ("", " ", "\t", ":", "=", ",")

    def _starts_item(self, line: str) -> bool:
        """A line that starts a new item rather than going on with a cut meaning: a bullet, a
        name then ':' / '=' / ' - ' / two spaces, or a dim of the diagram."""
        if _BULLET.match(line):
            return True
        m = _FIRST_WORD.match(line)
        if not m:
            return False
        rest = line[m.end() :]
        if rest[:1] in (":", "=") or rest.startswith("  ") or _DASH.match(rest):
            return True
        return self._leads_with_dim(line)

    def _add(self, text: str, join: bool):
        if join:
            text = self.items.pop() + " " + text
        item, depth = "", 0
        for ch in text:  # split at commas outside parentheses
            depth += (ch == "(") - (ch == ")")
            if ch == "," and depth <= 0:
                self.items.append(item)
                item = ""
            else:
                item += ch
        self.comma = not item.strip() and text.rstrip().endswith(",")
        if item.strip():
            self.items.append(item)
        self.depth = max(depth, 0)


def _declared_dims(diagram: ir.Diagram) -> dict[str, ir.Dim]:
    """The dims the diagram's own file declares, at the top level and in block bodies, in order."""
    out: dict[str, ir.Dim] = {}
    stack = list(reversed(diagram.body))
    while stack:
        s = stack.pop()
        if isinstance(s, ir.Dim):
            if not s.span.line or s.span.file == diagram.file:
                out.setdefault(s.name, s)
        elif isinstance(s, ir.Block):
            stack.extend(reversed(s.body))
    return out


def _legend_items(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    pending: list[str] = []  # names listed alone, waiting for the meaning they share
    for it in items:
        it = _BULLET.sub("", it.strip(), count=1).strip()
        m = _ITEM.fullmatch(it)
        if not m:
            pending = []  # a remark
            continue
        name, meaning = m.group(1), " ".join(m.group(2).split())
        if not meaning:
            if it == name:
                pending.append(name)
            else:
                pending = []  # 't:' with nothing after it
        elif meaning[0].isalnum() or meaning[0] in "('\"":
            for n in pending + [name]:
                out.setdefault(n, meaning)
            pending = []
        else:
            pending = []  # 'k >> d': a remark about legs already named
    return out


def legend_warnings(diagram: ir.Diagram) -> list[tuple[str, Span]]:
    """A warning for each dim the diagram's own file declares (top level and blocks, not
    included files) that its index legend does not explain, at the dim's declaration; without
    a legend, one for every dim.

    >>> from penrose.parser import parse
    >>> [m for m, _ in legend_warnings(parse("# index legend: t token\\ndim t, e = 4"))]
    ["dim 'e' is not in the index legend (# index legend: e <meaning>)"]
    """
    dims = _declared_dims(diagram)
    if not dims:
        return []
    known = legend(diagram)
    return [
        (f"dim {name!r} is not in the index legend (# index legend: {name} <meaning>)", d.span)
        for name, d in dims.items()
        if name not in known
    ]


# ---- statements and values -------------------------------------------------------------------


def statements(c: Checked, kind=COMPUTING) -> list[CStmt]:
    """The checked statements of `c` whose IR statement is a `kind` (default: assignments and
    returns, the ones that compute something), in order. `view='statement:N'` and the
    gallery's rows count these, from 1."""
    return [s for s in c.stmts if isinstance(s.stmt, kind)]


def values(v):
    """Every value of the tree `v`, parents first (iterative: a 10,000-term sum needs no stack)."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, V):
            yield x
            stack.extend(reversed(x.args))


def refs(v) -> set[str]:
    """The names a value reads."""
    return {x.of(Ref).name for x in values(v) if x.op == "ref"}


def labels_agree(sizes, v: V) -> bool:
    """Every label of the einsum `v` binds legs of one size class (`sizes`: the `Sizes`), so
    no leg of size 1 broadcasts inside it."""
    seen: dict = {}
    for term, a in zip(v.of(Einsum).terms, v.args):
        for label, cl in zip(term, a.type.cls):
            if seen.setdefault(label, sizes.find(cl)) != sizes.find(cl):
                return False
    return True


# ---- reads -----------------------------------------------------------------------------------


class Reads(NamedTuple):
    """How one (name, SSA version) of a body is read."""

    einsum: int = 0  # as an operand of an einsum
    other: int = 0  # anywhere else in a statement's value
    output: int = 0  # named by the `output` statement (which reads a name's last version)

    @property
    def in_statements(self) -> int:
        return self.einsum + self.other

    @property
    def total(self) -> int:
        return self.einsum + self.other + self.output


NOT_READ = Reads()


def uses(c: Checked) -> dict:
    """(name, SSA version) -> `Reads`, over c's statements and outputs. A name assigned and never
    read is absent.

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> c = check(parse("dim e = 2\\ninput x[e]\\nparam W[e, e]\\ny = einsum('i,ij->j', x, W) + x\\noutput y"))
    >>> sorted(uses(c).items())
    [(('W', 0), Reads(einsum=1, other=0, output=0)), (('x', 0), Reads(einsum=1, other=1, output=0)), (('y', 0), Reads(einsum=0, other=0, output=1))]
    """
    counts: dict = {}
    for s in c.stmts:
        if s.value is None:
            continue
        stack = [(s.value, False)]
        while stack:
            v, in_einsum = stack.pop()
            if not isinstance(v, V):
                continue
            if v.op == "ref":
                key = (v.of(Ref).name, v.of(Ref).version)
                e, o, out = counts.get(key, NOT_READ)
                counts[key] = Reads(e + 1, o, out) if in_einsum else Reads(e, o + 1, out)
                continue
            stack.extend((a, v.op == "einsum") for a in v.args)
    final: dict = {}  # outputs read the final version of a name
    for s in c.stmts:
        for t, ver in zip(s.targets, s.versions):
            final[t] = ver
    for name, _ in c.outputs:
        key = (name, final.get(name, 0))
        e, o, out = counts.get(key, NOT_READ)
        counts[key] = Reads(e, o, out + 1)
    return counts


def read_counts(c: Checked) -> dict:
    """{(name, SSA version): how many reads} over c's statements and outputs (unread: absent)."""
    return {key: r.total for key, r in uses(c).items()}


def producers(c: Checked, upto: CStmt | None = None) -> tuple[dict, dict]:
    """(name -> the value that last assigned it before `upto`, name -> every name it was
    computed from, transitively). Only one-target assignments produce a value."""
    found: dict = {}
    deps: dict = {}
    for s in c.stmts:
        if s is upto:
            break
        if isinstance(s.stmt, ir.Assign):
            reads = refs(s.value)
            closure = set(reads)
            for r in reads:
                closure |= deps.get(r, set())
            for t in s.stmt.targets:
                deps[t] = closure
            if len(s.stmt.targets) == 1:
                found[s.stmt.targets[0]] = s.value
    return found, deps
