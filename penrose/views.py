"""Derived views of a diagram and of its checked IR, written once for every back end.

The IR and the checked IR store only what the source says and what the checker resolved;
everything read off them is a function here, shared by the compiler, the figure, the
explanations and the gallery (STYLE.md, "The IR": derived views are functions, not state):

- `legend(diagram)`: the index legend comment, leg -> meaning;
- `statements(c)`: the statements of a body that compute something (or of any kind);
- `values(v)`: every value of a checked value tree; `refs(v)`: the names it reads;
  `labels_agree(sizes, v)`: an einsum binds each label to one size class;
- `uses(c)`: how each (name, SSA version) of a body is read; `read_counts(c)`: how often;
- `producers(c, upto)`: what each name was last assigned before a statement, and what it
  was computed from.

Einsum specs have one parser, `penrose.einsum_spec`; the checker stores each einsum's resolved
labels in its value (`attrs['terms']`, `attrs['out']`), so no back end reads a spec again.

    >>> from penrose.check import check
    >>> from penrose.parse import parse
    >>> c = check(parse("# index legend: e embedding\\ndim e = 3\\ninput x[e]\\ny = x * x\\noutput y"))
    >>> legend(c.diagram), [s.targets for s in statements(c)], read_counts(c)
    ({'e': 'embedding'}, [('y',)], {('x', 0): 2, ('y', 0): 1})

Torch-free; imports the IR and the checked IR only.
"""

from __future__ import annotations

from typing import NamedTuple

from penrose import ir
from penrose.checked import Checked, CStmt, V

COMPUTING = (ir.Assign, ir.Return)  # the statements with a value: the units figures and pages count


# ---- the index legend ------------------------------------------------------------------------

LEGEND_HEAD = "index legend:"


def legend(diagram: ir.Diagram) -> dict[str, str]:
    """The index legend: the top-level comment '# index legend: t token, e embedding', with its
    continuation lines (comments right below it that start with two spaces after the '#').

    Items are separated by commas outside parentheses. An item is a leg name and its meaning;
    names listed alone share the meaning of the next item ('i, j, k input feature factors'
    gives all three that meaning); an item that does not start with a name and a meaning in
    words ('k >> d') is a remark, not an entry. The first meaning given a leg stands.

    >>> legend(ir.Diagram((ir.Comment("index legend: t token, p key token (the paper's t_p),"), ir.Comment("  e embedding"))))
    {'t': 'token', 'p': "key token (the paper's t_p)", 'e': 'embedding'}
    >>> legend(ir.Diagram((ir.Comment("index legend: i, j, k input feature factors, d latent, k >> d"),)))
    {'i': 'input feature factors', 'j': 'input feature factors', 'k': 'input feature factors', 'd': 'latent'}
    """
    body = diagram.body
    for i, s in enumerate(body):
        if isinstance(s, ir.Comment) and s.text.lstrip().lower().startswith(LEGEND_HEAD):
            text = s.text.lstrip()[len(LEGEND_HEAD) :]
            prev = s
            for nxt in body[i + 1 :]:
                if not (isinstance(nxt, ir.Comment) and _continues(prev, nxt)):
                    break
                text += " " + nxt.text.strip()
                prev = nxt
            return _legend_items(text)
    return {}


def _continues(prev: ir.Comment, nxt: ir.Comment) -> bool:
    """`nxt` continues the legend: indented ('#   e embedding'), on the very next line."""
    adjacent = not (prev.span.line and nxt.span.line) or nxt.span.line == prev.span.line + 1
    return adjacent and nxt.text.startswith(" ") and bool(nxt.text.strip())


def _legend_items(text: str) -> dict[str, str]:
    items, item, depth = [], "", 0
    for ch in text:  # split at commas outside parentheses
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth <= 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    out: dict[str, str] = {}
    pending: list[str] = []  # names listed alone, waiting for the meaning they share
    for it in items:
        name, _, meaning = it.strip().partition(" ")
        meaning = meaning.strip()
        if not name.isidentifier():
            pending = []  # a remark
        elif not meaning:
            pending.append(name)
        elif meaning[0].isalnum() or meaning[0] in "('\"":
            for n in pending + [name]:
                out.setdefault(n, meaning)
            pending = []
        else:
            pending = []  # 'k >> d': a remark about legs already named
    return out


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
    return {x.attrs["name"] for x in values(v) if x.op == "ref"}


def labels_agree(sizes, v: V) -> bool:
    """Every label of the einsum `v` binds legs of one size class (`sizes`: the `Sizes`), so
    no leg of size 1 broadcasts inside it."""
    seen: dict = {}
    for term, a in zip(v.attrs["terms"], v.args):
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

    >>> from penrose.check import check
    >>> from penrose.parse import parse
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
                key = (v.attrs["name"], v.attrs.get("version", 0))
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
