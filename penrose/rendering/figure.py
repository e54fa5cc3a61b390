"""Checked diagram → Penrose figure: tensors, wires and boxes, as a small graph, then DOT.

The figure follows the paper's visual language (docs/rendering.md shows it):

    tensor      a circle named after it: inputs grey, params white, buffers white with a thick
                border, block arguments grey; a named intermediate is a small dashed circle,
                drawn only where it branches (used twice) or is a result; a name is drawn as
                written unless in the subscript form (`SUBSCRIPT`: W_q is W with q below); a
                display label (`label x "..."`) is a caption node under it
    leg         one wire per index, labelled with the index (and its size on request)
    contraction the legs two tensors share are wires between them; a leg three or more tensors
                share (a batch leg) meets at a black dot; a leg summed inside one tensor ends in Σ
    result      a double circle that the result's free legs run into
    operation   a labelled box on the wires it acts on (softmax, sigmoid, top-k, norms, masks,
                dropout, detach ...); a where box names its operands at ports (mask, true,
                false) that their wires enter; element-wise arithmetic is a small circle (+ − × ÷); a
                sum of three or more terms is one + that every term runs into (a subtracted
                term through a − box), however long the sum; a number is written in its box,
                a named const by its name (`× scale`)
    reshape     einops' rearrange: legs that merge into one leg run into a small black
                triangle whose one wire carries the merged dim (`h, d` → `hd`), a leg that
                splits leaves one (`hd` → `h, d`); a pure permutation is the legs rewired,
                nothing drawn; reduce is a box `max / over t, d` on the wires, repeat a box
                `repeat / copy along k` that the new legs leave
    indexing    select is a contraction with a basis vector: the picked leg ends in a small
                circle `e₀`; slice with a selection matrix: the leg runs into a small box
                `slice / 1…4` that the smaller leg leaves
    reuse       a tensor used by several contractions is drawn once, its legs branching: one
                wire per contraction (the paper's copy, "branching all its legs": Z feeding q,
                k, v); a contraction that reads it twice (x·x) draws copies, and
                `Options(copies=True)` (`--copies`) draws one copy per contraction, joined to
                the tensor by parallel lines; one read by more than TIE_READS (5) statements (a
                weight tied along a chain) is drawn once per use with a dashed outline, no wire between the copies, and the
                header says `tied: W (100×) ... the copies are one tensor`
    batch dots  legs that three or more tensors share meet at a black dot; batch legs that the
                same tensors share meet at one dot, their wires bundled
    residual    an update `Z = Z + h` (or one whose other operand depends on Z, or `f(Z) + Z`)
                is drawn thick and blue, along a straight spine, so a residual model shows at a
                glance
    block       a call is one box (`layer ×4` for `repeat 4`, dashed `slot / iterate ×3 shared`
                for `repeat 3 shared`: one block applied 3 times), dashed and marked `shared
                weights, call i of n` where an instance is called again; `unfold` draws one copy inline,
                framed; an argument the body reads twice enters the frame at one small node
                named after it, so its wires (a residual's first) stay inside the frame
    rows        a figure of more than FOLD_NODES nodes, or a block view longer than
                BLOCK_RANKS columns, is folded into rows (columns for TB) between top-level
                statements; a row starts with the values the row above ended with, again under
                their names, and the legs are written on the wires
    steps       '# 3) ...' captions become numbered, dashed frames around their statements

`build_figure` returns a `Figure` (plain records); `to_dot` writes Graphviz DOT. Node and edge
ids are sequential in statement order, so the same diagram gives the same DOT text. How each
operation is drawn is the table `FIGURE`, keyed by the names of `penrose.ops.OPS`.

Layout: Graphviz lays the DOT text out; a figure that Graphviz draws with crossing wires is laid
out again in a few other (seeded, fixed) orders, then (planar figures) with each crossing wire
loosened in turn and a where box's ports ordered as their wires arrive, then (the moves: planar
figures still crossing) the wires at the crossing wires' ends moved too, a wire reversed (its
head ranked before its tail, running back) among the moves, and the layout with the
fewest crossings is kept (`to_dot`, counted by `penrose.rendering.crossings` as the figure report
`penrose.rendering.measure` counts them); each row of a folded figure is laid out on its own
(`pack`), so long chains cost time linear in their length.

Limits: a figure of more than `MAX_NODES` (5,000) nodes is refused with a `PenroseRenderError`
at the statement that crosses it (Graphviz takes about 7 s for 5,000 nodes and minutes beyond);
a layout Graphviz does not finish within its timeout (60 s) is refused at the statement that
drew the most nodes. Deep nesting (1,000 calls) draws; deeper than `penrose.stack` gives room
for is a positioned `PenroseError`.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from penrose import ir, ops
from penrose.attrs import Axis, BinOp, BlockCall, Clamp, Const, DimSize, Einop, Einsum, Flatten, Num, Ref, Rope, Select, Slice, Split
from penrose.checked import Checked, V
from penrose.errors import PenroseRenderError, Span
from penrose.stack import deep, too_deep
from penrose.views import NOT_READ, statements, uses
from penrose.views import legend as index_legend  # the name tests and the gallery know

# ---- the figure records ------------------------------------------------------------------------


@dataclass
class FNode:
    id: str
    kind: str  # input param buffer formal value output copy junction sum op arith block mask scalar note merge split basis projector
    text: str  # the label as plain text (lines joined by '\n')
    html: str = ""  # the Graphviz HTML-like label ('' means: text)
    cluster: str | None = None
    tooltip: str = ""
    xlabel: str = ""
    group: str = ""
    step: int | None = None  # the numbered step (caption) that drew it
    badge: str = ""  # the step's number, shown on the first box of the step
    attrs: str = ""  # extra DOT attributes (the orientation of a merge or split triangle)
    tied: str = ""  # 'tied': one of the copies of a tensor drawn once per use; 'continued': a
    #                 value carried over from the row above (a folded figure)
    row: int = 0  # the row of a folded figure
    ports: tuple = ()  # (port, text) of a box whose wires enter at named ports (where), in order


@dataclass
class FEdge:
    tail: str
    head: str
    label: str = ""
    kind: str = "wire"  # wire residual branch scalar note
    tooltip: str = ""
    step: int | None = None
    badge: str = ""
    port: str = ""  # the head's port the wire enters (a where box's mask, true and false)


@dataclass
class Cluster:
    """A frame around an unfolded block."""

    id: str
    label: str
    parent: str | None = None


@dataclass
class Figure:
    title: str
    direction: str = "LR"
    legend: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    edges: list = field(default_factory=list)
    clusters: dict = field(default_factory=dict)  # id -> Cluster, in creation order
    captions: dict = field(default_factory=dict)  # step number -> caption text, in order
    header: str = "full"  # full (title, legend, captions) | title | none
    span: Span = field(default_factory=Span)  # the statement that drew the most nodes (for layout errors)
    notes: list = field(default_factory=list)  # lines of the header under the legend (tied tensors, rows)
    untangle: bool = False  # lay it out in the order with the fewest crossings (see to_dot)
    rows: int = 1  # a long figure is folded into rows, laid out one under the other

    def node(self, node_id: str) -> FNode:
        return next(n for n in self.nodes if n.id == node_id)


@dataclass
class _Val:
    """A value being drawn: where each of its legs dangles (a node id per leg)."""

    ports: list
    legs: tuple
    cls: tuple
    anchor: str | None = None  # the one node that stands for the value (boxes, scalars)
    key: tuple | None = None  # (name, version) of a named value
    deps: frozenset = frozenset()  # keys of the named values it is computed from
    kind: str = "value"  # the kind of a leaf (input, param ...), for copies
    name: str = ""
    spine: bool = False  # the result of a residual update
    hidden: tuple = ()  # nodes of its contractions that carry none of its legs (for ordering)


TENSOR_KINDS = frozenset({"input", "param", "buffer", "formal", "copy", "value", "output"})
LEAF_KINDS = frozenset({"input", "param", "buffer", "formal", "copy"})


# ---- how each operation is drawn: one entry per name of `penrose.ops.OPS` ----------------------


@dataclass(frozen=True)
class Drawing:
    """How one operation is drawn.

    `draw` names the builder step: 'contraction' (the shared legs become wires between the
    tensors), 'arith' (a small circle showing `glyph` between two tensors; a box with the
    number when one side is a plain number), 'box' (a labelled box on the wires it acts on),
    'einop' (einops' patterns: merge and split triangles, and for reduce and repeat a box),
    'select' (the picked leg ends in a basis vector e₀), 'slice' (the leg passes a selection
    matrix onto the smaller dim).
    `kind` is the node kind of a box ('op', or 'mask' for bool masks). `lines(v)` gives the
    label: the operation's name, then what it acts over; `glyph` alone when there is no rule.
    `scalar(parts)` writes the operation applied to plain numbers, as in a rescale box.
    """

    draw: str
    glyph: str
    lines: Callable | None = None
    kind: str = "op"
    scalar: Callable | None = None

    def label(self, v) -> list[str]:
        return self.lines(v) if self.lines is not None else [self.glyph]

    def scalar_text(self, parts: list[str]) -> str:
        if self.scalar is not None:
            return self.scalar(parts)
        if len(parts) == 2:
            return f"{parts[0]}{self.glyph}{parts[1]}"
        return f"{self.glyph}({', '.join(parts)})"


def _leg_of(v: V, axis: int) -> str:
    return v.args[0].type.legs[axis] if v.args and isinstance(v.args[0], V) and v.args[0].type.legs else "?"


def _over(name: str):
    return lambda v: [name, f"over {_leg_of(v, v.of(Axis).axis)}"]


def _written(v: V, key: str) -> str:
    """A keyword's value as the diagram writes it: by its consts and dims (`min=-alpha`), else the number."""
    shown = v.attrs.written(key)
    return _scalar_text(shown.value) if shown is not None else _fmt(v.attrs.keyword(key))


def _clamp_lines(v: V) -> list[str]:
    lo, hi = v.of(Clamp).min, v.of(Clamp).max
    return ["clamp", f"[{'−∞' if lo is None else _written(v, 'min')}, {'∞' if hi is None else _written(v, 'max')}]"]


# where(m, a, b): the wires of m, a and b enter the box at ports named for their part, each
# labelled inside the box; a plain number is written at its port
WHERE_PORTS = ("mask", "true", "false")


def _where_ports(v: V) -> tuple:
    """(port, text) of each operand of a where: 'mask', 'true', 'false', or 'false = 0.0' for a
    plain number."""
    return tuple((port, port if a.type.dtype != "scalar" else f"{port} = {_scalar_text(a)}") for port, a in zip(WHERE_PORTS, v.args))


def _ports_html(name: str, ports: tuple, direction: str) -> str:
    """A box with named ports on the side its wires come from (left, or top for TB), in the order
    given, and its name beside them."""
    cells = [f'<TD PORT="{port}" ALIGN="LEFT"><FONT POINT-SIZE="8" COLOR="#555555">{html.escape(text)}</FONT></TD>'
             for port, text in ports]
    table = '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
    if direction == "TB":
        return f'{table}<TR>{"".join(cells)}</TR><TR><TD COLSPAN="{len(cells)}">{html.escape(name)}</TD></TR></TABLE>'
    rows = [f'<TR>{cells[0]}<TD ROWSPAN="{len(cells)}" CELLPADDING="3">{html.escape(name)}</TD></TR>']
    rows += [f"<TR>{c}</TR>" for c in cells[1:]]
    return table + "".join(rows) + "</TABLE>"


def _block_causal_lines(v: V) -> list[str]:
    t, p = v.type.legs
    b = _written(v, "block")
    return ["block-causal mask", f"⌊{p}/{b}⌋ ≤ ⌊{t}/{b}⌋"]


def _flatten_lines(v: V) -> list[str]:
    x = v.args[0]
    a, b = v.of(Flatten).start, v.of(Flatten).end
    return ["flatten", f"{', '.join(x.type.legs[a:b + 1])} → {v.type.legs[a]}"]


def _unflatten_lines(v: V) -> list[str]:
    axis = v.of(Axis).axis
    n = len(v.type.legs) - len(v.args[0].type.legs) + 1
    return ["unflatten", f"{_leg_of(v, axis)} → {', '.join(v.type.legs[axis:axis + n])}"]


_REDUCTION_NAME = {"sum": "Σ", "prod": "Π", "mean": "mean", "max": "max", "min": "min"}


def _einop_axes(v: V) -> dict:
    """axis id -> (size class, the leg name it is drawn with)."""
    return {aid: (cls, leg) for aid, cls, leg in v.of(Einop).axes}


def _einop_lines(v: V) -> list[str]:
    a = v.of(Einop)
    axes = _einop_axes(v)
    if a.kind == "reduce":
        over = ", ".join(axes[aid][1] for aid in a.reduced) or "no leg"
        if a.sum_batch:
            over += " and the batch legs"
        return [_REDUCTION_NAME[a.reduction or "sum"], f"over {over}"]
    if a.kind == "repeat":
        return ["repeat", f"copy along {', '.join(axes[aid][1] for aid in a.new)}"]
    return ["rearrange", a.pattern]


def subscript(n: int) -> str:
    """An integer in subscript digits: 0 → '₀', -1 → '₋₁'."""
    return str(n).translate(str.maketrans("-0123456789", "₋₀₁₂₃₄₅₆₇₈₉"))


def _select_lines(v: V) -> list[str]:
    return [f"e{subscript(v.of(Select).index)}"]


def slice_range(v: V) -> str:
    """The indices a slice keeps: '1…4' (both ends kept), '2' for one, '∅' for none."""
    start, n = v.of(Slice).start, v.of(Slice).length
    if n <= 0:
        return "∅"
    return str(start) if n == 1 else f"{start}…{start + n - 1}"


def _slice_lines(v: V) -> list[str]:
    return ["slice", slice_range(v)]


def _rope_lines(v: V) -> list[str]:
    return ["RoPE", f"{_leg_of(v, v.of(Axis).axis)} by position {_leg_of(v, v.of(Rope).pos)}"]


def _sqrt_text(parts: list[str]) -> str:
    return f"√{parts[0]}" if len(parts[0]) <= 2 else f"√({parts[0]})"


# how a plain number's square root and absolute value print in a box's scalar text
_SCALAR_TEXT = {"sqrt": _sqrt_text, "abs": lambda parts: f"|{parts[0]}|"}


def _elementwise_box(name: str) -> Drawing:
    """The box of an element-wise function: its row's label, then each keyword's value."""
    row = ops.OPS[name]
    lines = (lambda v: [row.label] + [f"{k.name} {_written(v, k.name)}" for k in row.keywords]) if row.keywords else None
    return _box(row.label, lines, scalar=_SCALAR_TEXT.get(name))


def _minmax_lines(name: str):
    """max over a leg (a reduction), or max of two operands (the box alone)."""
    over = _over(name)
    return lambda v: over(v) if v.op == "reduce" else [name]


def _arith(glyph: str) -> Drawing:
    return Drawing("arith", glyph)


def _box(glyph: str, lines=None, kind="op", scalar=None) -> Drawing:
    return Drawing("box", glyph, lines, kind, scalar)


FIGURE: dict[str, Drawing] = {
    # element-wise functions: a box with the label of their row (and their keywords)
    **{name: _elementwise_box(name) for name in sorted(ops.ELEMENTWISE)},
    # operators: a small circle between the two tensors
    "+": _arith("+"),
    "-": _arith("−"),
    "*": _arith("×"),
    "/": _arith("÷"),
    "//": _arith("÷"),
    "**": _arith("^"),
    "<": _arith("<"),
    "<=": _arith("≤"),
    ">": _arith(">"),
    ">=": _arith("≥"),
    "==": _arith("="),
    "!=": _arith("≠"),
    "neg": _box("−", scalar=lambda parts: f"−{parts[0]}"),
    # the contraction: wires, junctions and Σ (the label is the spec, in tooltips)
    "einsum": Drawing("contraction", "Σ", lambda v: ["einsum", v.of(Einsum).spec]),
    # over one leg
    "softmax": _box("softmax", _over("softmax")),
    "log_softmax": _box("log-softmax", _over("log-softmax")),
    "layernorm": _box("layer norm", _over("layer norm")),
    "rmsnorm": _box("RMS norm", _over("RMS norm")),
    "topk": _box("top-k", lambda v: ["top-k", f"k={_written(v, 'k')} over {_leg_of(v, v.of(Axis).axis)}"]),
    "topk_mask": _box("top-k mask", lambda v: ["top-k mask", f"k={_written(v, 'k')} over {_leg_of(v, v.of(Axis).axis)}"], kind="mask"),
    "sum": _box("Σ", lambda v: [f"Σ {_leg_of(v, v.of(Axis).axis)}"]),
    "mean": _box("mean", _over("mean")),
    "max": _box("max", _minmax_lines("max")),
    "min": _box("min", _minmax_lines("min")),
    # element-wise with options
    "dropout": _box("dropout", lambda v: ["dropout", f"p={_written(v, 'p')}"]),
    "detach": _box("detach"),
    "clamp": _box("clamp", _clamp_lines),
    "where": _box("where"),  # its operands are named at its ports (_where_ports)
    # masks
    "causal": _box("causal mask", lambda v: ["causal mask", f"{v.type.legs[1]} ≤ {v.type.legs[0]}"], kind="mask"),
    "block_causal": _box("block-causal mask", _block_causal_lines, kind="mask"),
    "arange": _box("positions", lambda v: ["positions", f"0 … {v.type.legs[0]}−1"], kind="mask"),
    # indexing and shapes
    "gather": _box("gather", lambda v: ["gather", f"rows of {_short(v.args[0])}"]),
    "split": _box("split", lambda v: ["split", f"{_leg_of(v, v.of(Axis).axis)} → {' + '.join(str(s) for s in v.of(Split).sizes)}"]),
    "concat": _box("concat", lambda v: ["concat", f"→ {v.type.legs[v.of(Axis).axis]}"]),
    "flatten": _box("flatten", _flatten_lines),
    "unflatten": _box("unflatten", _unflatten_lines),
    "rope": _box("RoPE", _rope_lines),
    # einops patterns: merge and split triangles (a permutation is the legs rewired); a box
    # for a reduction or a repeat
    "rearrange": Drawing("einop", "rearrange", _einop_lines),
    "reduce": Drawing("einop", "reduce", _einop_lines),
    "repeat": Drawing("einop", "repeat", _einop_lines),
    # picking indices: a contraction with a basis vector e_i, or with a selection matrix
    "select": Drawing("select", "e", _select_lines, kind="basis"),
    "slice": Drawing("slice", "slice", _slice_lines, kind="projector"),
}

# A figure with more nodes is refused, at the statement that crosses the limit: Graphviz takes
# about 7 s for a flat sum of 2,500 rescaled terms (5,000 nodes), 30 s for twice that.
MAX_NODES = 5000
MAX_PARALLEL = 6  # parallel lines drawn for the legs between two nodes; more are counted in the label
# A tensor read by more than TIE_READS statements (a weight tied across a long chain, the same Z
# feeding many statements) is drawn once per use, each copy with a dashed outline, and the header
# says the copies are one tensor: wires from one node to uses spread along a chain make
# Graphviz's layout cost grow quadratically or worse (a 30-step tied residual chain took 9 s
# with one W branching to 30 copies, 50 steps more than 60 s; one copy per use keeps 1,000
# steps linear). Up to TIE_READS uses branch off one node, as in the paper (Z feeding q, k, v).
TIE_READS = 5
# A figure of more than FOLD_NODES nodes is folded into rows of about ROW_NODES nodes, cut
# between top-level statements where at most MAX_CUT values run on; each row is laid out on
# its own (Graphviz's `pack`), so the cost grows linearly with the length and the figure stays
# readable (a 1,000-step chain is 40 rows, not one line 200,000 points long).
FOLD_NODES = 240
ROW_NODES = 60
MAX_CUT = 3
# A block view whose longest path has more than BLOCK_RANKS nodes (an attention block: 16) is
# folded the same way, into rows of about ROW_RANKS columns: in one row it was 1,500 points
# wide, its text tiny on a page.
BLOCK_RANKS = 10
ROW_RANKS = 7


@dataclass(frozen=True)
class Options:
    direction: str = "LR"
    show_sizes: bool = False
    show_plan: bool = False
    unfold: bool = False
    header: bool = True  # the title block: name, leg legend and step captions
    fold: bool = True  # fold a long figure (more than FOLD_NODES nodes) into rows
    copies: bool = False  # a tensor several contractions read: one copy per contraction (True), or
    #                       drawn once with its legs branching, as the paper draws Z (False)


# ---- entry points ------------------------------------------------------------------------------


@deep
def build_figure(c: Checked, view: str = "diagram", options: Options = Options()) -> Figure:
    """The figure of a checked diagram: `view` is 'diagram', 'statement:N' or 'block:NAME'.

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> f = build_figure(check(parse("dim e = 2, f = 3\\ninput x[e]\\nparam W[e, f]\\ny = einsum('e,ef->f', x, W)\\noutput y")))
    >>> sorted((e.tail, e.head, e.label) for e in f.edges if e.kind == "wire")
    [('W', 'y', 'f'), ('x', 'W', 'e')]
    """
    if options.direction not in ("LR", "TB"):
        raise PenroseRenderError(f"direction must be 'LR' or 'TB', got {options.direction!r}", Span(c.diagram.file))
    kind, _, arg = view.partition(":")
    legend = index_legend(c.diagram)
    header = "full" if options.header else "none"
    if kind == "diagram" and not arg:
        return _whole(c, c, _title(c), options, legend, header)
    if kind == "statement":
        stmts = statements(c)
        try:
            n = int(arg)
        except ValueError:
            n = 0
        if not 1 <= n <= len(stmts):
            raise PenroseRenderError(
                f"view {view!r}: the diagram has {len(stmts)} statement(s); use statement:1 to statement:{len(stmts)}",
                Span(c.diagram.file),
            )
        s = stmts[n - 1]
        fig = Figure(_stmt_title(s, n), options.direction, legend, header="title" if options.header else "none", untangle=True)
        b = _Builder(c, options, fig)
        b.calls = instance_calls(c)
        b.draw_statement(c, s)
        return fig
    if kind == "block":
        if arg not in c.blocks:
            names = ", ".join(sorted(c.blocks)) or "none"
            raise PenroseRenderError(f"view {view!r}: no block {arg!r} (blocks: {names})", Span(c.diagram.file))
        return _whole(c, c.blocks[arg], f"block {arg}", options, legend, header, wide=BLOCK_RANKS)
    raise PenroseRenderError(f"unknown view {view!r}; use 'diagram', 'statement:N' or 'block:NAME'", Span(c.diagram.file))


def _whole(c: Checked, body: Checked, title: str, options: Options, legend: dict, header: str, wide: int = 0) -> Figure:
    """A diagram's or a block's body, folded into rows when it is long: more than FOLD_NODES
    nodes, or (a block view) a path of more than `wide` nodes."""
    b = _Builder(c, options, Figure(title, options.direction, legend, header=header, untangle=True))
    b.draw_body(body, {}, prefix="", top=True)
    n = len(b.fig.nodes)
    if not options.fold:
        return b.fig
    if n > FOLD_NODES:
        rows = -(-n // ROW_NODES)
    elif wide and ranks(b.fig) > wide:
        rows = -(-ranks(b.fig) // ROW_RANKS)
    else:
        return b.fig
    per_row = n / rows  # rows of about equal length: the last one not a stub
    folded = _Builder(c, options, Figure(title, options.direction, legend, header=header), fold=per_row)
    folded.max_rows = rows
    folded.extra_nodes = 2 * MAX_CUT * rows
    try:
        folded.draw_body(body, {}, prefix="", top=True)
    except PenroseRenderError:  # the continued values took it past MAX_NODES: one row, as it was
        return b.fig
    return folded.fig if folded.fig.rows > 1 else b.fig


def ranks(fig: Figure) -> int:
    """The number of nodes on the longest path of wires (forward in drawing order): about the
    number of columns Graphviz gives a left-to-right figure."""
    index = {n.id: i for i, n in enumerate(fig.nodes)}
    nexts: dict = {}
    for e in fig.edges:
        a, b = index.get(e.tail), index.get(e.head)
        if a is not None and b is not None and a < b:
            nexts.setdefault(a, []).append(b)
    depth = [1] * len(fig.nodes)
    for i in range(len(fig.nodes) - 1, -1, -1):
        for j in nexts.get(i, ()):
            depth[i] = max(depth[i], depth[j] + 1)
    return max(depth, default=0)


def _title(c: Checked) -> str:
    return c.name


def _stmt_title(s, n: int) -> str:
    from penrose.fmt import format_stmt

    return f"({n}) {format_stmt(s.stmt)}"


# ---- building ----------------------------------------------------------------------------------


class _Builder:
    def __init__(self, top: Checked, options: Options, fig: Figure, fold: float = 0):
        self.fold = fold  # nodes per row of a folded figure (0: one row)
        self.max_rows = 0
        self.extra_nodes = 0  # room past MAX_NODES for the names a folded figure draws again
        self.row = 0
        self.node_row: dict = {}  # node id -> its row
        self.nodes_by_id: dict = {}
        self.tied: dict = {}  # name -> how many copies of a tensor drawn once per use
        self.twice: set = set()  # names the contraction being drawn reads more than once
        self.calls: dict = {}  # block instance -> how many calls of it the drawn body makes
        self.called: dict = {}  # block instance -> how many of those are drawn so far
        self.top = top
        self.opt = options
        self.fig = fig
        self.cluster: str | None = None
        self.step: int | None = None
        self.n_contraction = 0
        self.ids: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.span = Span(top.diagram.file)  # the statement being drawn, for a figure too large
        self.drawn: dict = {}  # statement span -> nodes it drew

    # -- records
    def new_id(self, base: str) -> str:
        base = "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in base) or "n"
        if base not in self.ids:
            self.ids.add(base)
            return base
        i = self.next_suffix.get(base, 2)  # every suffix below it is taken: linear, not quadratic
        while f"{base}_{i}" in self.ids:
            i += 1
        self.next_suffix[base] = i + 1
        self.ids.add(f"{base}_{i}")
        return f"{base}_{i}"

    def add_node(self, base, kind, text, html_label="", cluster="current", tooltip="", xlabel="", group="", attrs="") -> str:
        if len(self.fig.nodes) >= MAX_NODES + self.extra_nodes:
            raise PenroseRenderError(
                f"the figure would have more than {MAX_NODES:,} nodes, more than Graphviz lays out in reasonable time; "
                "split this statement into several, or draw a smaller view (statement:N, block:NAME)",
                self.span,
            )
        nid = self.new_id(base)
        self.drawn[self.span] = self.drawn.get(self.span, 0) + 1
        if self.drawn[self.span] > self.drawn.get(self.fig.span, 0):
            self.fig.span = self.span
        cl = self.cluster if cluster == "current" else cluster
        self.fig.nodes.append(FNode(nid, kind, text, html_label, cl, tooltip, xlabel, group, self.step, attrs=attrs, row=self.row))
        self.node_row[nid] = self.row
        self.nodes_by_id[nid] = self.fig.nodes[-1]
        return nid

    def add_edge(self, tail, head, label="", kind="wire", tooltip="", port="") -> FEdge:
        e = FEdge(tail, head, label, kind, tooltip, self.step, port=port)
        self.fig.edges.append(e)
        return e

    def leg_label(self, leg: str, cls) -> str:
        if self.opt.show_sizes and cls is not None:
            n = self.top.sizes.size(cls)
            if n is not None:
                return f"{leg}={n}"
        return leg

    def wire(self, tail, head, leg, cls, kind="wire", port="") -> FEdge:
        return self.add_edge(tail, head, self.leg_label(leg, cls), kind, tooltip=self.leg_tooltip(leg, cls), port=port)

    def leg_tooltip(self, leg, cls) -> str:
        words = self.fig.legend.get(leg, "")
        n = self.top.sizes.size(cls) if cls is not None else None
        return f"{leg}" + (f" ({words})" if words else "") + (f", size {n}" if n is not None else "")

    # -- bodies
    def draw_body(self, body: Checked, env: dict, prefix: str, top: bool):
        """Draw every statement of a body; `env` binds formals to values (inlined blocks)."""
        scope = _Scope(body, env, uses(body), prefix)
        if top:
            self.calls = instance_calls(body)
        outputs = {n for n, _ in body.outputs} if not body.is_block else set()
        returned = []
        base_step = self.step
        for s in body.stmts:
            st = s.stmt
            if isinstance(st, ir.Comment):
                if s.step is not None and top:
                    self.step = s.step
                    self.fig.captions[s.step] = _caption(st.text)
                continue
            if st.span.line:
                self.span = st.span
            try:
                if isinstance(st, ir.Assign):
                    self.assign(scope, s, outputs)
                    if (top and self.fold and len(self.fig.nodes) >= (self.row + 1) * self.fold
                            and (not self.max_rows or self.row + 1 < self.max_rows)):
                        live = self.cut(scope)
                        if live is not None:
                            for name, val in live:  # what runs on into the next row ends in one node
                                scope.env[name] = self.value_node(val, name)
                            self.row += 1
                elif isinstance(st, ir.Return):
                    assert s.value is not None, "the checker gives every return its value"
                    returned = [self.expr(scope, v, einsum_use=False) for v in s.value.args]
            except RecursionError:
                raise too_deep(st.span) from None
        self.step = base_step
        if top:
            _badge_steps(self.fig)
            self.fig.rows = 1 + max((n.row for n in self.fig.nodes), default=0)
            self.fig.notes = self.notes()
        if top and body.is_block:  # the block view: what the block returns is its result
            for i, (val, v) in enumerate(zip(returned, _return_values(body))):
                name = v.of(Ref).name if v.op == "ref" else f"out{i}" if len(returned) > 1 else "out"
                self.result_node(val, name)
        return returned

    def cut(self, scope: "_Scope"):
        """Whether a row may end here: None, or the (name, value) pairs that must first be
        drawn as one node each (they are read later, and their legs still dangle from several
        nodes). At most MAX_CUT computed values may run on into the next row, where each
        starts again as its name; inputs and parameters are drawn again where it reads them."""
        live, loose = 0, []
        for name, val in scope.env.items():
            key = val.key
            if key is None or val.kind in LEAF_KINDS:
                continue
            if scope.uses.get(key, NOT_READ).in_statements - scope.seen.get(key, 0) <= 0:
                continue
            if not val.legs:
                return None
            node = self.nodes_by_id.get(val.anchor) if val.anchor is not None else None
            if node is None or any(p != val.anchor for p in val.ports) or node.kind not in TENSOR_KINDS:
                loose.append((name, val))  # the row ends in its name, as the next one starts
            live += 1
        return loose if live <= MAX_CUT else None

    def notes(self) -> list:
        lines = []
        if self.tied:
            names = ", ".join(f"{n} ({k:,}×)" for n, k in self.tied.items())
            lines.append(f"tied: {names}: drawn once per use, dashed; the copies are one tensor")
        shared = {inst: n for inst, n in self.calls.items() if n > 1 and self.called.get(inst)}
        if shared:
            names = ", ".join(f"{inst} ({n}×)" for inst, n in shared.items())
            lines.append(f"shared weights: {names}: each call of a block instance runs on one set of weights")
        rows = 1 + max((n.row for n in self.fig.nodes), default=0)
        if rows > 1:
            lines.append(f"folded into {rows} rows, read top to bottom; a name in a dashed circle at a row's "
                         "start continues the row above")
        return lines

    def continued(self, scope: "_Scope", name: str, val: _Val) -> _Val:
        """A value drawn in an earlier row of a folded figure: the same name again, in this row."""
        kind = val.kind if val.kind in LEAF_KINDS else "value"
        nid = self.add_node(f"{name}_row{self.row}", kind, name, _name_html(name), tooltip=f"{name}, continued from the row above")
        self.fig.nodes[-1].tied = "continued"
        new = _Val([nid] * len(val.legs), val.legs, val.cls, nid, val.key, val.deps, val.kind, name, val.spine)
        scope.env[name] = new
        return new

    def new_cluster(self, base, label, parent) -> str:
        cid = self.new_id("cluster_" + base.replace(".", "_"))  # a DOT subgraph's name is one ID (net.0 is not)
        self.fig.clusters[cid] = Cluster(cid, label, parent)
        return cid

    def assign(self, scope: "_Scope", s, outputs):
        st = s.stmt
        v = s.value
        scope.n_assign += 1
        if v.outs:  # several results (split, a block with several returns)
            vals = self.expr(scope, v, einsum_use=False, multi=True)
        else:
            vals = [self.expr(scope, v, einsum_use=False)]
        for target, val, version in zip(st.targets, vals, s.versions):
            key = (target, version)  # the SSA key `ref`s read it by
            val.key = key
            val.name = target
            if target in outputs and scope.is_last(target):
                val = self.result_node(val, target)
            elif scope.uses.get(key, NOT_READ).in_statements >= 2 or (not val.legs and val.anchor is None):
                val = self.value_node(val, target)
            scope.env[target] = val

    def value_node(self, val: _Val, name: str, kind="value") -> _Val:
        """Materialise a named value: its legs run into one small node, which then branches."""
        spine = val.spine
        nid = self.add_node(f"{name}", kind, name, _name_html(name), tooltip=f"{name}[{', '.join(val.legs)}]",
                            group="spine" if spine else "")
        self.after(nid, val)
        for port, leg, cl in zip(val.ports, val.legs, val.cls):
            self.wire(port, nid, leg, cl, kind="residual" if spine else "wire")
        if not val.legs and val.anchor is not None and val.anchor != nid:
            self.add_edge(val.anchor, nid, kind="scalar")
        return _Val([nid] * len(val.legs), val.legs, val.cls, nid, val.key, val.deps, kind, name, spine)

    def result_node(self, val: _Val, name: str) -> _Val:
        saved = self.cluster
        self.cluster = None
        try:
            return self.value_node(val, name, kind="output")
        finally:
            self.cluster = saved

    def draw_statement(self, c: Checked, s):
        """One statement: every tensor it names is a circle, its result a double circle."""
        try:
            self._draw_statement(c, s)
        except RecursionError:
            raise too_deep(s.stmt.span) from None

    def _draw_statement(self, c: Checked, s):
        scope = _Scope(c, {}, {}, "", leaves=True)
        st = s.stmt
        self.span = st.span
        if isinstance(st, ir.Return):
            vals = [self.expr(scope, v, einsum_use=False) for v in s.value.args]
            names = [v.of(Ref).name if v.op == "ref" else "out" for v in s.value.args]
        else:
            v = s.value
            vals = self.expr(scope, v, einsum_use=False, multi=True) if v.outs else [self.expr(scope, v, einsum_use=False)]
            names = list(st.targets)
        for val, name in zip(vals, names):
            self.result_node(val, name)

    # -- expressions
    def expr(self, scope: "_Scope", v: V, einsum_use: bool, multi: bool = False):
        key = v.key
        if key is None:  # not an operation: a tensor, a block call, or a plain number
            if v.op == "ref":
                return self.ref(scope, v, einsum_use)
            if v.op == "block":
                return self.block(scope, v, multi)
            return None  # a plain number: drawn inside the label of the box that uses it
        if v.type.dtype == "scalar":
            return None  # arithmetic on plain numbers: written in the label that uses it
        rule = FIGURE[key]
        return getattr(self, rule.draw)(scope, v, rule, multi)

    def ref(self, scope: "_Scope", v: V, einsum_use: bool) -> _Val:
        name = v.of(Ref).name
        val = scope.lookup(self, name, v)
        key = val.key
        reads = scope.uses.get(key, NOT_READ) if key else NOT_READ
        n_einsum = reads.einsum
        earlier = scope.seen.get(key, 0)
        scope.seen[key] = earlier + 1
        tied = reads.in_statements > TIE_READS and val.anchor is not None and not scope.leaves
        if tied and earlier > 0:
            return self.tied_copy(name, val)
        if self.row and val.anchor is not None and self.node_row.get(val.anchor, self.row) < self.row:
            val = self.continued(scope, name, val)
        if tied:  # its first use: the tensor itself (a leaf is marked as one of the copies)
            node = self.nodes_by_id[val.anchor]
            if node.kind in LEAF_KINDS and not node.tied:
                node.tied = "tied"
                self.tied[name] = self.tied.get(name, 0) + 1
            return val
        # a tensor several contractions read, or a declared tensor read again by a contraction
        # (tied weights): one copy per contraction, branching off it
        reused = n_einsum >= 2 or (earlier > 0 and (val.kind in LEAF_KINDS or scope.leaves))
        # drawn once, its legs branching (one wire per contraction), unless asked for copies or
        # the same contraction reads it twice (x·x: its copy is the other operand)
        branched = not self.opt.copies and name not in self.twice
        if einsum_use and reused and val.anchor is not None and not branched:
            base = val.anchor
            kind = val.kind if val.kind in ("input", "param", "buffer", "formal") else "copy"
            cid = self.add_node(f"{name}_copy", kind, name, _name_html(name), tooltip=f"copy of {name}")
            self.add_edge(base, cid, kind="branch", tooltip=f"{name} is reused: a copy")
            return _Val([cid] * len(val.legs), val.legs, val.cls, cid, val.key, val.deps, val.kind, name)
        return val

    def tied_copy(self, name: str, val: _Val) -> _Val:
        """A tensor read by many statements: each read after the first draws it again (dashed,
        'tied'), with no wire back to one node."""
        kind = val.kind if val.kind in ("input", "param", "buffer", "formal") else "copy"
        cid = self.add_node(f"{name}_tied", kind, name, _name_html(name), tooltip=f"{name} (tied: one tensor, drawn once per use)")
        self.fig.nodes[-1].tied = "tied"
        self.tied[name] = self.tied.get(name, 0) + 1
        return _Val([cid] * len(val.legs), val.legs, val.cls, cid, val.key, val.deps, val.kind, name, val.spine)

    def contraction(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        terms, out = v.of(Einsum).terms, v.of(Einsum).out
        refs = [a.of(Ref).name for a in v.args if a.op == "ref"]
        saved, self.twice = self.twice, {n for n in refs if refs.count(n) > 1}
        try:
            vals = [self.expr(scope, a, einsum_use=True) for a in v.args]
        finally:
            self.twice = saved
        self.n_contraction += 1
        number = self.n_contraction
        plan_labels = self.plan_labels(v, number) if self.opt.show_plan else {}
        deps = frozenset().union(*(x.deps | ({x.key} if x.key else set()) for x in vals))
        scalars = [x for x, t in zip(vals, terms) if not t]
        tensor_ops = [(x, t) for x, t in zip(vals, terms) if t]
        # where each letter occurs: (port, leg name, class)
        occ: dict[str, list] = {}
        for x, t in tensor_ops:
            for letter, port, leg, cl in zip(t, x.ports, x.legs, x.cls):
                occ.setdefault(letter, []).append((port, leg, cl))
        out_ports, out_cls = [], []
        anchor = None
        contracted = [l for l in occ if l not in out]
        edges_made = []
        batch_dots: dict = {}  # the tensors a batch leg joins -> its dot
        for letter, places in occ.items():
            names = {p[1] for p in places}
            label_leg = places[0][1] if len(names) == 1 else letter
            cl = places[0][2]
            extra = plan_labels.get(letter, "")
            in_out = letter in out
            if len(places) == 1 and in_out:
                continue
            if len(places) == 1:
                node = self.add_node("sum", "sum", "Σ", tooltip=f"sum over {label_leg}")
                e = self.wire(places[0][0], node, label_leg, cl)
                edges_made.append(e)
                if extra:
                    e.label += "\n" + extra
                continue
            if len(places) == 2 and not in_out and not (not out and letter == contracted[0]):
                # even between two tensors already drawn (W_q —e— W_k) the wire orders them:
                # measured over the zoo, that gives the fewest crossings
                e = self.wire(places[0][0], places[1][0], label_leg, cl)
                edges_made.append(e)
                if extra:
                    e.label += "\n" + extra
                continue
            # a leg three or more tensors share (or a closed contraction's result): a junction;
            # batch legs the same tensors share meet at one dot, their wires bundled (two dots
            # joined to the same two tensors cannot be drawn left to right without a crossing)
            sharers = tuple(port for port, _, _ in places)
            j = batch_dots.get(sharers) if in_out else None
            if j is None:
                j = self.add_node("junction", "junction", "", tooltip=f"leg {label_leg} shared")
                if in_out:
                    batch_dots[sharers] = j
            else:
                node = self.nodes_by_id[j]
                node.tooltip = node.tooltip.replace("leg ", "legs ", 1).replace(" shared", f", {label_leg} shared")
            for port, leg, pcl in places:
                e = self.wire(port, j, leg if len(names) == 1 else letter, pcl)
                edges_made.append(e)
            if extra and edges_made:
                edges_made[-1].label += "\n" + extra
            if in_out:
                occ[letter] = [(j, label_leg, cl)]
            else:
                anchor = j
        for letter in out:
            port, _, cl = occ[letter][0]
            out_ports.append(port)
            out_cls.append(cl)
        if self.opt.show_plan and not edges_made and "*" in plan_labels:
            note = self.add_node("plan", "note", plan_labels["*"])
            first = next((x for x, _ in tensor_ops), None)
            if first is not None and first.ports:
                self.add_edge(first.ports[0], note, kind="note")
        elif self.opt.show_plan and "*" in plan_labels and edges_made:
            edges_made[0].label += "\n" + plan_labels["*"]
        hidden: list[str] = []
        for x in vals:
            hidden.extend(h for h in x.hidden if h not in hidden)
        for e in edges_made:
            for n in (e.tail, e.head):
                if n not in hidden and n not in out_ports:
                    hidden.append(n)
        val = _Val(out_ports, tuple(v.type.legs), tuple(out_cls), anchor, deps=deps, hidden=tuple(hidden))
        if scalars:  # a scalar factor: a × box on the result's legs
            node = self.add_node("scale", "arith", "×", tooltip="scalar multiplication")
            for s in scalars:
                if s.anchor:
                    self.add_edge(s.anchor, node, kind="scalar")
            if anchor and not val.legs:
                self.add_edge(anchor, node, kind="scalar")
            for port, leg, cl in zip(val.ports, val.legs, val.cls):
                self.wire(port, node, leg, cl)
            val = _Val([node] * len(val.legs), val.legs, val.cls, node, deps=deps)
        elif not val.legs and anchor is None:
            node = self.add_node("product", "arith", "×", tooltip="product")
            val = _Val([], (), (), node, deps=deps)
        return val

    def plan_labels(self, v: V, number: int) -> dict:
        """letter -> 'contraction #n: FLOPs' for the letters each planned step sums over."""
        from penrose.report import einsum_plan

        plan = einsum_plan(self.top, v)
        labels: dict[str, str] = {}
        many = len(plan.steps) > 1
        for i, step in enumerate(plan.steps, 1):
            gone = list(step.summed)  # the legs this step sums away, by name
            tag = f"#{number}.{i}" if many else f"#{number}"
            text = f"{tag}: {step.flops:,} FLOPs"
            if gone:
                labels.setdefault(gone[0], text)
            else:
                labels["*"] = (labels.get("*", "") + "\n" + text).strip()
        return labels

    def arith(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        terms = _chain(v)
        if len(terms) > 2:  # a + b - c ...: one node every term runs into (a chain of them lays out slowly)
            vals = [self.expr(scope, t, False) for t, _ in terms]
            for i, (t, sign) in enumerate(terms):
                if sign == "-":  # a subtracted term passes a − box first: a - b - c = a + (−b) + (−c)
                    node = self.add_node("neg", "op", "−", _box_html(["−"]), tooltip=_op_tooltip(t))
                    self.inputs_to(node, vals[i])
                    vals[i] = self.box_result(node, t, [vals[i]])
            return self.operator_node(v, FIGURE["+"] if v.key in ("+", "-") else rule, vals)
        a, b = v.args
        op = v.of(BinOp).op
        va, vb = self.expr(scope, a, False), self.expr(scope, b, False)
        sym = rule.glyph
        if va is None or vb is None:  # tensor ∘ number: a box showing the number
            tensor, other, left = (va, b, True) if va is not None else (vb, a, False)
            num = _scalar_text(other)
            text = f"{sym} {num}" if left else f"{num} {sym}"
            if op == "**" and left:
                text = f"^{num}"
            node = self.add_node("scale", "op", text, _html_text(text), tooltip=_op_tooltip(v))
            self.inputs_to(node, tensor)
            return self.box_result(node, v, [tensor])
        return self.operator_node(v, rule, [va, vb])

    def operator_node(self, v: V, rule: Drawing, vals: list) -> _Val:
        """A small circle showing the operator, every operand's legs running into it."""
        stream = self.residual_term(v, vals)
        residual = stream is not None
        node = self.add_node("arith", "arith", rule.glyph, tooltip=_op_tooltip(v), group="spine" if residual else "")
        first = stream or 0
        self.inputs_to(node, vals[first], kind="residual" if residual else "wire")
        for i, val in enumerate(vals):
            if i != first:
                self.inputs_to(node, val)
        out = self.box_result(node, v, vals)
        out.spine = residual
        return out

    def residual_term(self, v: V, vals: list) -> int | None:
        """The operand that is the residual stream, or None: `Z = Z ± h`, or `x + f(x)` — the first
        operand, when another reads it (itself, or an earlier version of the same name); in a sum a
        later term too (`f(x) + x`: the first that another term reads). One pass over the terms'
        dependencies (a sum of 10,000 terms asked each term about every other: 10^8 steps, a minute)."""
        if v.key not in ("+", "-"):
            return None
        legs = tuple(v.type.legs)
        readers = Counter(k for val in vals if val is not None for k in val.deps)  # terms that read each key
        for i in range(len(vals) if v.key == "+" else 1):
            first = vals[i]
            if first is None or not first.legs or first.legs != legs or first.key is None:
                continue
            stream = {first.key} | {k for k in first.deps if k[0] == first.key[0]}
            if any(readers[k] > (k in first.deps) for k in stream):  # read by a term other than this one
                return i
        return None

    def inputs_to(self, node: str, val: _Val, kind="wire", port=""):
        """`val`'s legs run into `node` (at its `port`, where it has named ports)."""
        if val is None:
            return
        self.after(node, val)
        for tail, leg, cl in zip(val.ports, val.legs, val.cls):
            self.wire(tail, node, leg, cl, kind=kind, port=port)
        if not val.legs and val.anchor is not None:
            self.add_edge(val.anchor, node, kind="scalar", port=port)

    def after(self, node: str, val: _Val):
        """Place `node` after the contractions that made `val` (invisible ordering edges)."""
        for h in val.hidden:
            self.add_edge(h, node, kind="order")

    def box_result(self, node: str, v: V, vals) -> _Val:
        deps = frozenset().union(*((x.deps | ({x.key} if x.key else set())) for x in vals if x is not None))
        return _Val([node] * len(v.type.legs), tuple(v.type.legs), tuple(v.type.cls), node, deps=deps)

    def box(self, scope, v: V, rule: Drawing, multi=False):
        vals = [self.expr(scope, a, False) for a in v.args]
        lines = rule.label(v)
        ports: tuple = ()
        if v.key == "where":  # which operand is the mask, which the value where it holds, which elsewhere
            ports = _where_ports(v)
            lines = [lines[0]] + [text for _, text in ports]
        node = self.add_node(v.key, rule.kind, "\n".join(lines), "" if ports else _box_html(lines), tooltip=_op_tooltip(v))
        self.fig.nodes[-1].ports = ports
        for i, val in enumerate(vals):
            self.inputs_to(node, val, port=ports[i][0] if ports else "")
        if multi and v.outs:
            deps = frozenset().union(*((x.deps | ({x.key} if x.key else set())) for x in vals if x is not None))
            return [_Val([node] * len(t.legs), tuple(t.legs), tuple(t.cls), node, deps=deps) for t in v.outs]
        return self.box_result(node, v, vals)

    # -- einops patterns, select and slice
    def triangle(self, kind: str, legs: list, one: str) -> str:
        """A merge (several legs in, `one` out) or split (`one` in, several out) node: a small
        black triangle whose point faces the side of the one wire."""
        lr = self.opt.direction == "LR"
        if kind == "merge":
            attrs = "orientation=-90" if lr else "orientation=180"
            tip = f"merge {', '.join(legs)} into {one}"
        else:
            attrs = "orientation=90" if lr else ""
            tip = f"split {one} into {', '.join(legs)}"
        return self.add_node(kind, kind, "", tooltip=tip, attrs=attrs)

    def einop(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        """rearrange, reduce, repeat: each operand leg a group splits runs into a split
        triangle that its axes leave; a reduction or a repeat is a box every axis runs
        through (the new legs of a repeat leave it); each result leg a group merges leaves a
        merge triangle its axes run into. Plain legs are only rewired."""
        a = v.of(Einop)
        val = self.expr(scope, v.args[0], False)
        axes = _einop_axes(v)
        deps = val.deps | ({val.key} if val.key else set())
        made: list[str] = []
        port: dict = {}  # axis id -> the node its leg dangles from
        for group, p, leg, cl in zip(a.left, val.ports, val.legs, val.cls):
            if len(group) == 1:
                port[group[0]] = p
                continue
            if not group:  # a leg of size 1 that the pattern drops: its one index, e₀
                node = self.add_node("unit", "basis", "e₀", tooltip=f"leg {leg} of size 1 dropped: its only index, 0")
            else:
                node = self.triangle("split", [axes[aid][1] for aid in group], leg)
                for aid in group:
                    port[aid] = node
            self.after(node, val)
            self.wire(p, node, leg, cl)
            made.append(node)
        box = None
        if a.kind in ("reduce", "repeat"):
            lines = rule.label(v)
            box = self.add_node(a.kind, "op", "\n".join(lines), _box_html(lines), tooltip=_op_tooltip(v))
            if not made:
                self.after(box, val)
            for aid in dict.fromkeys(aid for group in a.left for aid in group):
                self.wire(port[aid], box, axes[aid][1], axes[aid][0])
            for aid in list(port) + list(a.new):
                port[aid] = box
            made.append(box)
        out_ports = []
        for j, group in enumerate(a.right):
            if len(group) == 1:
                out_ports.append(port[group[0]])
                continue
            node = self.triangle("merge", [axes[aid][1] for aid in group], v.type.legs[j])
            for aid in group:
                self.wire(port[aid], node, axes[aid][1], axes[aid][0])
            out_ports.append(node)
            made.append(node)
        anchor = box
        if not v.type.legs and anchor is None and made:  # '() ->': what stands for the scalar
            anchor = made[-1]
        hidden = list(val.hidden) + [n for n in made if n not in out_ports and n not in val.hidden]
        return _Val(out_ports, tuple(v.type.legs), tuple(v.type.cls), anchor, deps=deps, hidden=tuple(hidden))

    def select(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        """select(x, t, i): the leg t ends in the basis vector e_i (a contraction picks index i)."""
        val = self.expr(scope, v.args[0], False)
        axis, i = v.of(Axis).axis, v.of(Select).index
        leg = val.legs[axis]
        text = rule.label(v)[0]
        node = self.add_node("basis", "basis", text, tooltip=f"basis vector e{subscript(i)} on leg {leg}: picks index {i}")
        self.after(node, val)
        self.wire(val.ports[axis], node, leg, val.cls[axis])
        ports = list(val.ports[:axis]) + list(val.ports[axis + 1:])
        deps = val.deps | ({val.key} if val.key else set())
        hidden = tuple(val.hidden) + (node,)
        return _Val(ports, tuple(v.type.legs), tuple(v.type.cls), None if v.type.legs else node, deps=deps, hidden=hidden)

    def slice(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        """slice(x, t, start, k): the leg t passes a selection matrix onto the smaller leg k."""
        val = self.expr(scope, v.args[0], False)
        axis = v.of(Axis).axis
        leg, into = val.legs[axis], v.type.legs[axis]
        lines = rule.label(v)
        keeps = slice_range(v)
        node = self.add_node("slice", "projector", "\n".join(lines), _box_html(lines),
                             tooltip=f"selection matrix: indices {keeps} of leg {leg} become leg {into}")
        self.after(node, val)
        self.wire(val.ports[axis], node, leg, val.cls[axis])
        ports = list(val.ports)
        ports[axis] = node
        deps = val.deps | ({val.key} if val.key else set())
        return _Val(ports, tuple(v.type.legs), tuple(v.type.cls), None, deps=deps, hidden=tuple(val.hidden))

    def block(self, scope, v: V, multi=False):
        call = v.of(BlockCall)
        name, inst, rep = call.block, call.instance, call.repeat
        vals = [self.expr(scope, a, False) for a in v.args]
        blk = self.top.blocks[name]
        deps = frozenset().union(*((x.deps | ({x.key} if x.key else set())) for x in vals if x is not None))
        self.called[inst] = self.called.get(inst, 0) + 1
        shared = self.calls.get(inst, 1) > 1  # the same instance called again: its weights are shared
        mark = f"shared weights, call {self.called[inst]} of {self.calls[inst]}" if shared else ""
        if self.opt.unfold:
            copies = f" iterate ×{rep} shared" if call.shared else f" ×{rep} (one copy shown)"
            label = f"{inst}: block {name}" + (copies if rep else "") + (f" ({mark})" if mark else "")
            saved = self.cluster
            self.cluster = self.new_cluster(f"block_{inst}", label, saved)
            env = {}
            body_uses = uses(blk)
            for f, val in zip([d for d in blk.decls.values() if d.tensor.kind == "formal"], vals):
                fname, legs = f.tensor.name, tuple(f.tensor.legs)
                if val is not None and legs and body_uses.get((fname, 0), NOT_READ).in_statements >= 2:
                    # an argument read twice enters the frame at one node, so that its wires (a
                    # residual's first of all) run inside the frame, not around it
                    nid = self.add_node(f"{inst}.{fname}", "value", fname, _name_html(fname),
                                        tooltip=f"{fname}[{', '.join(legs)}]: the argument of {inst}",
                                        group="spine" if val.spine else "")
                    self.inputs_to(nid, val, kind="residual" if val.spine else "wire")
                    deps = val.deps | ({val.key} if val.key else set())
                    env[fname] = _Val([nid] * len(legs), legs, val.cls, nid, (fname, 0), deps, "value", fname, val.spine)
                    continue
                env[fname] = _Val(val.ports, legs, val.cls, val.anchor, None, val.deps, val.kind, fname)
            outs = self.draw_body(blk, env, prefix=f"{inst}.", top=False)
            self.cluster = saved
            res = []
            for o, t in zip(outs, v.outs or (v.type,)):
                res.append(_Val(o.ports, tuple(t.legs), tuple(t.cls), o.anchor, None, deps | o.deps))
            return res if multi and v.outs else res[0]
        lines = [name if inst == name else f"{inst}: {name}"]
        if rep:  # `repeat N shared`: one block (one set of weights) applied N times
            lines.append(f"iterate ×{rep} shared" if call.shared else f"×{rep}")
        label = _block_html(lines)
        if mark:
            lines.append(mark)
            label += f'<BR/><FONT POINT-SIZE="9" COLOR="{BADGE}">{html.escape(mark)}</FONT>'
        node = self.add_node(f"block_{inst}", "block", "\n".join(lines), label, tooltip=f"block {name}" + (f": {mark}" if mark else ""))
        if mark or (rep and call.shared):
            self.fig.nodes[-1].tied = "shared"
        for val in vals:
            self.inputs_to(node, val)
        if multi and v.outs:
            return [_Val([node] * len(t.legs), tuple(t.legs), tuple(t.cls), node, deps=deps) for t in v.outs]
        return _Val([node] * len(v.type.legs), tuple(v.type.legs), tuple(v.type.cls), node, deps=deps)


def instance_calls(body: Checked) -> dict:
    """Block instance -> how many calls of it the body's statements make (a call without `as`,
    made twice, runs the same instance: one set of weights).

    >>> from penrose.checker import check
    >>> from penrose.parser import parse
    >>> src = "dim e = 2\\nblock f(x[e]) {\\n  param W[e, e]\\n  return einsum('i,ij->j', x, W)\\n}\\ninput x[e]\\ny = f(f(x))\\nz = f(x) as g\\noutput y, z"
    >>> instance_calls(check(parse(src)))
    {'f': 2, 'g': 1}
    """
    counts: dict = {}
    seen: set = set()
    todo = [s.value for s in body.stmts if getattr(s, "value", None) is not None][::-1]  # first statement first
    while todo:
        v = todo.pop()
        if not isinstance(v, V) or id(v) in seen:
            continue
        seen.add(id(v))
        if v.op == "block":
            inst = v.of(BlockCall).instance
            counts[inst] = counts.get(inst, 0) + 1
        todo.extend(v.args)
    return counts


class _Scope:
    """Names → values while a body is drawn; a value's key is its (name, SSA version)."""

    def __init__(self, body: Checked, env: dict, uses: dict, prefix: str, leaves=False):
        self.body = body
        self.env = dict(env)
        self.uses = uses
        self.prefix = prefix
        self.leaves = leaves
        self.seen: dict = {}  # key -> how many times it has been read so far
        self.last_assign: dict[str, int] = {}
        n = 0
        for s in body.stmts:
            if isinstance(s.stmt, ir.Assign):
                n += 1
                for t in s.stmt.targets:
                    self.last_assign[t] = n
        self.n_assign = 0

    def is_last(self, name: str) -> bool:
        return self.last_assign.get(name) == self.n_assign

    def lookup(self, b: _Builder, name: str, v: V) -> _Val:
        if name in self.env:
            return self.env[name]
        decl = self.body.decls.get(name)
        legs = tuple(v.type.legs)
        if decl is not None and not (isinstance(v.attrs, Ref) and v.attrs.kind == "local"):
            kind = decl.tensor.kind
        else:
            kind = "value"
        cluster = None if kind in ("input", "formal") else "current"
        label = self.body.labels.get(name) or b.top.labels.get(name, "")
        nid = b.add_node(self.prefix + name, kind, name, _name_html(name), cluster=cluster,
                         tooltip=f"{kind} {name}[{', '.join(legs)}]" + (f": {label}" if label else ""),
                         xlabel=label if label and label != name else "")
        val = _Val([nid] * len(legs), legs, tuple(v.type.cls), nid, (name, 0), frozenset(), kind, name)
        self.env[name] = val
        return val


def badge(step: int) -> str:
    """The step's mark, as the paper numbers its captions: '3)'."""
    return f"{step})"


def _badge_steps(fig: Figure):
    """Mark each numbered step once: on its first box, else on its first wire."""
    for step in fig.captions:
        box = next((n for n in fig.nodes if n.step == step and n.kind in ("op", "mask", "block")), None)
        if box is not None:
            box.badge = badge(step)
            continue
        wire = next((e for e in fig.edges if e.step == step and e.kind in ("wire", "residual")), None)
        if wire is not None:
            wire.badge = badge(step)
            continue
        node = next((n for n in fig.nodes if n.step == step and n.kind not in ("junction",)), None)
        if node is not None:
            node.xlabel = (node.xlabel + " " if node.xlabel else "") + badge(step)


def _return_values(body: Checked):
    for s in body.stmts:
        if isinstance(s.stmt, ir.Return):
            assert s.value is not None, "the checker gives every return its value"
            return list(s.value.args)
    return []




# ---- labels ------------------------------------------------------------------------------------


def _chain(v: V) -> list:
    """The terms of a + b - c ... (or the factors of a * b * c ...) between tensors, walking the
    left spine without recursion, each with its operator ('+' for the first): [(a, '+'),
    (b, '+'), (c, '-')]. A plain binary operation gives its two operands."""
    key = v.key
    group = ("+", "-") if key in ("+", "-") else ("*",) if key == "*" else ()
    rights = []
    node = v
    while node.key in group and node.op == "binop" and all(x.type.dtype != "scalar" for x in node.args):
        rights.append((node.args[1], node.key))
        node = node.args[0]
    if not rights:
        return [(x, "+") for x in v.args]
    return [(node, "+")] + rights[::-1]


def _caption(text: str) -> str:
    return text.strip()


def _scalar_text(v: V) -> str:
    """A plain number as a label writes it: 2, √e, 1/√e."""
    op = v.op
    if op == "num":
        x = v.of(Num).value
        if x == math.inf:
            return "∞"
        if x == -math.inf:
            return "−∞"
        if isinstance(x, float) and x.is_integer() and abs(x) < 1e6:
            return str(x)
        return repr(x).replace("-", "−")
    if op in ("dimsize", "const"):  # a dim's size, a named const: by its name, never its value
        return v.of(DimSize).name if op == "dimsize" else v.of(Const).name
    key = v.key
    if key is None:
        return "·"
    return FIGURE[key].scalar_text([_scalar_text(a) for a in v.args])


def _fmt(x) -> str:
    if x == math.inf:
        return "∞"
    if x == -math.inf:
        return "−∞"
    return repr(x).replace("-", "−")


def _short(v: V) -> str:
    if v.op == "ref":
        return v.of(Ref).name
    return v.op


def _op_tooltip(v: V) -> str:
    return f"{v.key or v.op} → [{', '.join(v.type.legs)}]"


# The subscript form of a name: one letter (Latin or Greek), an underscore, then an index of at
# most three letters or digits — `W_q`, `W_out`, `x_0`, `β_2` — drawn W<sub>q</sub>, as the
# paper writes its weights; any other name is drawn exactly as written (`input_ids`, `c_true`,
# `h_squared_norm`, `tok_emb`): an underscore is not a subscript unless the name says so.
SUBSCRIPT = re.compile(r"([^\W\d_])_([^\W_]{1,3})")


def _name_html(name: str) -> str:
    """'W_q' → W<SUB>q</SUB> (the subscript form, `SUBSCRIPT`); 'input_ids' as written.

    >>> _name_html("W_q"), _name_html("input_ids"), _name_html("c_true")
    ('W<SUB>q</SUB>', 'input_ids', 'c_true')
    """
    m = SUBSCRIPT.fullmatch(name)
    if m is None:
        return html.escape(name)
    return f"{html.escape(m.group(1))}<SUB>{html.escape(m.group(2))}</SUB>"


def _html_text(text: str) -> str:
    return html.escape(text)


def _box_html(lines: list[str]) -> str:
    first = html.escape(lines[0])
    rest = "".join(f'<BR/><FONT POINT-SIZE="8" COLOR="#555555">{html.escape(l)}</FONT>' for l in lines[1:])
    return first + rest


def _block_html(lines: list[str]) -> str:
    first = f"<B>{html.escape(lines[0])}</B>"
    rest = "".join(f'<BR/><FONT POINT-SIZE="11">{html.escape(l)}</FONT>' for l in lines[1:])
    return first + rest


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, break_long_words=True, break_on_hyphens=False) or [""]


# ---- DOT ---------------------------------------------------------------------------------------

CAPTION = "~caption"  # the DOT id of a node's caption (its display label) is its own plus this
FONT = "Helvetica"
SUB_SCALE = 0.75  # a subscript's size, of its name's
LEG_FONT = "Times-Italic"
INK = "#222222"
LEG_INK = "#1d4e89"
RESIDUAL = "#2166ac"
BADGE = "#b35806"

NODE_STYLE = {
    "input": 'shape=circle style=filled fillcolor="#bdbdbd" color="#222222" fontsize=13 margin=0.02',
    "formal": 'shape=circle style=filled fillcolor="#bdbdbd" color="#222222" fontsize=13 margin=0.02',
    "param": 'shape=circle style=filled fillcolor="#ffffff" color="#222222" fontsize=13 margin=0.02',
    "buffer": 'shape=circle style="filled,bold" fillcolor="#ffffff" color="#222222" penwidth=2.2 fontsize=13 margin=0.02',
    "copy": 'shape=circle style="filled,dashed" fillcolor="#ffffff" color="#555555" fontsize=11 margin=0.02',
    "value": 'shape=circle style="filled,dashed" fillcolor="#ffffff" color="#777777" fontcolor="#444444" fontsize=10 margin=0.01 width=0.32',
    "output": 'shape=doublecircle style=filled fillcolor="#ffe9a8" color="#222222" fontsize=13 margin=0.02',
    "junction": 'shape=point width=0.09 height=0.09 color="#111111"',
    "sum": 'shape=circle fixedsize=true width=0.3 fontsize=13 style=filled fillcolor="#ffffff" color="#222222"',
    "op": 'shape=box style="rounded,filled" fillcolor="#ffffff" color="#222222" fontsize=11 margin="0.08,0.04" height=0.3',
    "mask": 'shape=box style="rounded,filled" fillcolor="#eeeeee" color="#222222" fontsize=11 margin="0.08,0.04" height=0.3',
    "arith": 'shape=circle fixedsize=true width=0.3 fontsize=15 style=filled fillcolor="#ffffff" color="#222222"',
    "block": 'shape=box style="rounded,filled,bold" fillcolor="#e7eef8" color="#2c4a70" fontsize=13 margin="0.14,0.08" peripheries=2',
    "merge": 'shape=triangle fixedsize=true width=0.2 height=0.2 style=filled fillcolor="#222222" color="#222222"',
    "split": 'shape=triangle fixedsize=true width=0.2 height=0.2 style=filled fillcolor="#222222" color="#222222"',
    "basis": 'shape=circle fixedsize=true width=0.3 fontsize=11 style=filled fillcolor="#f2f2f2" color="#222222" margin=0',
    "projector": 'shape=box style=filled fillcolor="#f2f2f2" color="#222222" fontsize=10 margin="0.05,0.02" height=0.28 width=0.3',
    "note": 'shape=plaintext fontsize=9 fontcolor="#8a3b12"',
}
EDGE_STYLE = {
    "wire": f'color="{INK}" penwidth=1.1',
    "residual": f'color="{RESIDUAL}" penwidth=2.6 weight=8',
    "branch": 'color="#555555:#ffffff:#555555" penwidth=1.3 weight=4',
    "scalar": 'color="#777777" style=dashed',
    "note": 'color="#8a3b12" style=dotted',
    "order": "style=invis",
}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# Graphviz's ordering heuristic leaves crossings in some figures that can be drawn without: a
# figure (a diagram, block or statement view) of at most UNTANGLE_NODES nodes whose layout
# crosses is laid out again, first with the nodes and wires listed in other (fixed, seeded)
# orders and more ordering passes, then — wire by wire — with a wire that crosses another
# loosened (LOOSEN: it no longer ranks its ends, or pulls them less, or asks for more room), for
# at most UNTANGLE_ROUNDS rounds of UNTANGLE_LAYOUTS layouts in all; the layout with the
# fewest crossings and labels a wire runs through is kept (counted as the figure report counts
# them: `crossings.crossings`, `crossings.label_hits`).
UNTANGLE_NODES = 150
UNTANGLE_TRIES = (("", 0), ("mclimit=4", 0), ("remincross=true mclimit=4", 0)) + tuple(("", seed) for seed in range(1, 6))
REVERSE = "reverse"  # a move: the wire ranks its head before its tail, running back
LOOSEN = ("constraint=false", "weight=0", "minlen=2", REVERSE)
UNTANGLE_ROUNDS = 4
UNTANGLE_LAYOUTS = 40
MOVE_LAYOUTS = 60
LABEL_LAYOUTS = 8
SEARCH_NODES = 40
SHAKE_LAYOUTS = 40
PAIR_LAYOUTS = 60
PAIR_NODES = 80
_untangled: dict = {}  # DOT text -> the DOT text chosen for it (a figure is often drawn twice)


def to_dot(fig: Figure, untangle: bool = True) -> str:
    """Graphviz DOT text for a figure (deterministic: statement order, sequential ids); a
    figure marked `untangle` is emitted in the order whose layout crosses the fewest wires
    (unless `untangle` is False: the gallery first lays every figure out as it is)."""
    text = _dot_text(fig)
    if not (untangle and fig.untangle) or fig.rows > 1 or len(fig.nodes) > UNTANGLE_NODES:
        return text
    # the same figure with and without its title block (the gallery's thumbnail) is laid out alike
    key = re.sub(r" labelloc=t labeljust=l label=<.*", "", text)
    if key not in _untangled:
        if len(_untangled) > 512:
            _untangled.clear()
        _untangled[key] = _untangle_cached(fig, text)
    choice = _untangled[key]
    return _dot_text(fig, *choice) if choice else text


def _untangle_cached(fig: Figure, text: str) -> tuple:
    """`_untangle`'s choice, kept in the cache of Graphviz's output (`penrose.rendering.cache`):
    keyed by the figure (its DOT text and its nodes, wires and frames), `dot -V` and
    `cache.code_version()` (penrose's source, Python's and networkx's versions), the search
    runs once per figure, not once per process. A search cut short (no Graphviz, a layout too
    slow) is not kept."""
    import json

    from penrose.rendering import cache
    from penrose.rendering.graphviz import dot_binary

    try:
        exe = dot_binary()
    except PenroseRenderError:
        return ()
    figure = repr((fig.nodes, fig.edges, fig.clusters, fig.direction, fig.rows)).encode("utf-8")
    name, hit = cache.lookup(exe, ["(untangle)", cache.code_version(), text], figure)
    if hit is not None:
        try:
            stored = json.loads(hit.decode("utf-8"))
            if stored == []:
                return ()
            extra, seed, loose, ports = stored
            return (extra, seed, loose, None if ports is None else {k: tuple(v) for k, v in ports.items()})
        except (ValueError, TypeError, AttributeError):
            pass  # an entry this version cannot read: search again
    choice = _untangle(fig, text)
    if choice is None:
        return ()
    if name:
        cache.write(name, json.dumps(list(choice)).encode("utf-8"))
    return choice


def _untangle(fig: Figure, text: str) -> tuple | None:
    """The (extra, seed, loose, ports) arguments of `_dot_text` whose layout crosses the fewest
    wires; () for the figure as it is. The search stops at the fewest crossings any drawing of the
    figure can have (`crossings.fewest_crossings`: 0 unless its graph is not planar). A figure whose graph
    is not planar gets the reordered tries only, not the wire-by-wire search; one of at most
    SEARCH_NODES nodes still above its fewest (1 or 2) gets SHAKE_LAYOUTS draws of a few wires
    moved at once; a label a wire still runs through gets its two wires moved (LABEL_LAYOUTS)."""
    import random

    import networkx as nx

    from penrose.rendering.crossings import crossings as crossed
    from penrose.rendering.crossings import fewest_crossings, label_hits, layout

    wires = {f"{tail}->{head}" for kind, tail, head, *_ in bundles(fig) if kind != "order"}

    def named(w: str) -> str:  # a wire by its figure's name (a reversed wire is laid out head first)
        tail, _, head = w.partition("->")
        return w if w in wires or not head else f"{head}->{tail}"

    def crossings(lay) -> list:  # what to remove: crossing wires, then labels a wire runs through
        return ([(named(a), named(b), p) for a, b, p in crossed(lay)]
                + [(named(wire), owner, None) for owner, wire in label_hits(lay)])

    ends: dict = {}  # node -> the wires at it
    for w in wires:
        for node in w.split("->"):
            ends.setdefault(node, []).append(w)

    def worse(a, b) -> bool:  # a layout's findings worse than another's: more crossings, then more in all
        return (sum(p is not None for *_, p in a), len(a)) > (sum(p is not None for *_, p in b), len(b))

    def crossing(found) -> dict:  # the wires that cross (or run through a label)
        return dict.fromkeys(w for a, b, _ in found for w in (a, b) if w in wires)

    def labelled(found) -> dict:  # the wires of a label a wire runs through: that wire, the labelled one
        return dict.fromkeys(w for a, b, p in found if p is None for w in (a, b) if w in wires)

    def movable(found) -> dict:  # those, then the other wires at their ends
        near = crossing(found)
        return dict.fromkeys([*near, *(x for w in near for node in w.split("->") for x in sorted(ends[node]))])

    def rounds(extra, seed, loose, found, best, candidates, limit) -> tuple:
        """Move one wire at a time (each of LOOSEN on each candidate wire), keeping the move
        that removes the most, while one removes any and layouts are left."""
        for _ in range(limit):
            step = None
            for wire in (w for w in candidates(found) if w not in loose):
                for how in LOOSEN:
                    if budget[0] <= 0 or (step and settled(step[0])):
                        break
                    n, args, _ = tried(extra, seed, {**loose, wire: how})
                    if worse(step[0] if step else found, n):
                        step = (n, args)
            if step is None:
                break
            found, best = step
            loose = dict(best[2])
            if settled(found):
                break
        return found, best

    budget = [UNTANGLE_LAYOUTS]
    graph = nx.Graph((tail, head) for kind, tail, head, *_ in bundles(fig) if kind != "order" and tail != head)
    flat = nx.check_planarity(graph)[0]  # else it cannot do without crossings
    # the fewest crossings any drawing has (0 for a planar figure; a search stops there — not at
    # the fewest with the inputs and results at the page's edge: Graphviz may find a drawing
    # with fewer that encloses one); a non-planar figure gets the reordered tries, and one of up
    # to SEARCH_NODES nodes that can do with 1 or 2 the shakes below
    fewest = 0 if flat else fewest_crossings(graph, (), 2, 2000) if len(fig.nodes) <= SEARCH_NODES else None
    least = fewest if fewest is not None and fewest <= 2 else 0

    def settled(found) -> bool:  # no label crossed, and no more crossings than the fewest possible
        return sum(p is not None for *_, p in found) <= least and all(p is not None for *_, p in found)

    ported = {n.id for n in fig.nodes if n.ports} if flat else set()

    def pairs(found, best) -> tuple:
        """Pairs of wires into one node both reversed (that node, often a parameter or a junction,
        ranked before the two it reads: the small loop of a tensor's copy, a parameter, a
        junction and a value drawn open), on top of the best layout so far: a pair at a crossing
        wire, else two pairs at once kept when they cross no more (a step sideways), then a
        reversal undone; until settled, within PAIR_LAYOUTS layouts."""
        import itertools

        into: dict = {}
        for w in sorted(wires):
            into.setdefault(w.partition("->")[2], []).append(w)
        budget[0] = PAIR_LAYOUTS
        seen = {frozenset((best[2] or {}).items())}

        def attempt(moved, sideways=False):
            if budget[0] <= 0 or frozenset(moved.items()) in seen:
                return None
            seen.add(frozenset(moved.items()))
            n, args, _ = tried(best[0], best[1], moved)
            keep = worse(found, n) or (sideways and not worse(n, found))
            return (n, args) if keep else None

        while not settled(found) and budget[0] > 0:
            loose = dict(best[2] or {})
            near = [(w, o) for w in crossing(found) if w not in loose
                    for o in into.get(w.partition("->")[2], []) if o != w and o not in loose]
            step = None
            for w, o in near:
                if (step := attempt({**loose, w: REVERSE, o: REVERSE})):
                    break
            for (w, o), (u, v) in itertools.combinations(near, 2) if step is None else ():
                if not {w, o} & {u, v} and (step := attempt({**loose, w: REVERSE, o: REVERSE, u: REVERSE, v: REVERSE}, True)):
                    break
            if step is None:
                break
            found, best = step
            for w in list(best[2] or {}):  # a reversal the step made needless, undone
                undone = attempt({k: h for k, h in (best[2] or {}).items() if k != w})
                if undone:
                    found, best = undone
        return found, best

    def tried(extra, seed, loose) -> tuple:
        """(crossings, arguments) of a layout, with the ports of a where box in the order the
        wires that enter them arrive (`port_order`) when that crosses fewer; and the layout."""
        budget[0] -= 1
        lay = layout(_dot_text(fig, extra, seed, loose))
        found = crossings(lay)
        args: tuple = (extra, seed, loose, None)
        if any(w.partition("->")[2] in ported for a, b, _ in found for w in (a, b) if w in wires):  # at a where's ports
            ports = port_order(fig, lay)
            budget[0] -= 1
            again = crossings(layout(_dot_text(fig, extra, seed, loose, ports)))
            if worse(found, again):
                found, args = again, (extra, seed, loose, ports)
        return found, args, lay

    try:
        found, best, lay = tried("", 0, None)
        search = not settled(found) and (flat or not crossed(lay))
        for extra, seed in UNTANGLE_TRIES:
            if settled(found):
                break
            if (extra, seed) != ("", 0):
                n, args, _ = tried(extra, seed, None)
                if worse(found, n):
                    best, found = args, n
            loose = dict(best[2] or {}) if best[:2] == (extra, seed) else {}
            if search:  # the wires that cross, loosened one at a time
                found, best = rounds(extra, seed, loose, found, best, crossing, UNTANGLE_ROUNDS)
        if not settled(found) and flat:
            # moves: a planar figure still crossing gets the wires at the crossing wires' ends
            # moved too (LOOSEN, a wire reversed: its head ranked before its tail, running back),
            # on top of the best layout so far, within MOVE_LAYOUTS more layouts
            budget[0] = MOVE_LAYOUTS
            found, best = rounds(best[0], best[1], dict(best[2] or {}), found, best, movable, MOVE_LAYOUTS)
        if not settled(found) and flat and len(fig.nodes) <= PAIR_NODES:
            # a planar figure still crossing: its fewest with the inputs and results outside,
            # and the pairs, then each wire near a crossing moved again (LOOSEN, with more
            # ordering passes too) on top of them, within PAIR_LAYOUTS more layouts
            outside = [n.id for n in fig.nodes if n.kind in ("input", "output") and n.id in graph]
            least = fewest_crossings(graph, outside, 2, 2000) or 0
            if not settled(found):
                found, best = pairs(found, best)
            for extra in dict.fromkeys(("mclimit=4", best[0])):
                if not settled(found):
                    budget[0] = PAIR_LAYOUTS
                    found, best = rounds(extra, best[1], dict(best[2] or {}), found, best, movable, 1)
        if not settled(found) and least:
            # a small figure still above its fewest crossings: a few wires moved at once (a
            # seeded draw of 2 to 4 wires, each moved one of the LOOSEN ways), SHAKE_LAYOUTS times
            rng = random.Random(len(fig.nodes))
            names = sorted(wires)
            for _ in range(SHAKE_LAYOUTS):
                if settled(found):
                    break
                moved = {w: rng.choice(LOOSEN) for w in rng.sample(names, min(len(names), rng.randint(2, 4)))}
                n, args, _ = tried(rng.choice(("", "mclimit=4")), rng.randrange(6), moved)
                if worse(found, n):
                    found, best = n, args
        if any(p is None for *_, p in found):
            # a label a wire still runs through (often at a crossing that must stay): that wire and
            # the labelled one moved (LOOSEN), within LABEL_LAYOUTS more layouts
            budget[0] = LABEL_LAYOUTS
            found, best = rounds(best[0], best[1], dict(best[2] or {}), found, best, labelled, 1)
    except PenroseRenderError:  # no Graphviz, or a layout too slow: the figure as it is (None: not kept)
        return None
    return () if best == ("", 0, None, None) else best


def port_order(fig: Figure, lay) -> dict:
    """Node id -> its ports in the order the wires entering them arrive in the layout `lay`
    (top to bottom left to right, left to right top down); a port no wire enters goes last."""
    tails: dict = {}
    for e in fig.edges:
        if e.port and e.tail in lay.nodes:
            tails.setdefault((e.head, e.port), []).append(lay.nodes[e.tail])
    order = {}
    for n in fig.nodes:
        if not n.ports:
            continue

        def where(port, n=n):
            pts = tails.get((n.id, port), [])
            if not pts:
                return math.inf
            x, y = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
            return x if fig.direction == "TB" else -y  # dot's y runs up

        order[n.id] = tuple(sorted((p for p, _ in n.ports), key=where))
    return order


def _dot_text(fig: Figure, extra: str = "", seed: int = 0, loose: dict | None = None, ports: dict | None = None) -> str:
    """The DOT text; `extra` graph attributes, a `seed` that shuffles the order in which nodes
    (within their frame) and wires are listed (0: statement order), `loose`: 'tail->head' ->
    the attribute that loosens that wire (LOOSEN), and `ports`: node id -> the order of its
    ports (`port_order`)."""
    import random

    rng = random.Random(seed) if seed else None
    lines = [f"digraph {_q(fig.title[:60])} {{"]
    label = f" labelloc=t labeljust=l label=<{_title_html(fig)}>" if fig.header != "none" else ""
    # a folded figure: each row is a component of its own, laid out alone and stacked in order
    # (Graphviz 2.43 crashes on pack with newrank, which only clusters need)
    packing = f' pack=20 packmode="{"array_uc1" if fig.direction == "LR" else f"array_u{fig.rows}"}"' if fig.rows > 1 else " newrank=true"
    lines.append(
        f'  graph [rankdir={fig.direction} fontname="{FONT}" fontsize=12 nodesep=0.22 ranksep=0.32 '
        f"pad=0.25{packing} outputorder=edgesfirst{' ' + extra if extra else ''}{label}]"
    )
    lines.append(f'  node [fontname="{FONT}" color="{INK}" penwidth=1.2]')
    lines.append(f'  edge [dir=none fontname="{LEG_FONT}" fontsize=11 fontcolor="{LEG_INK}" arrowhead=none]')
    by_cluster: dict = {}
    for n in fig.nodes:
        by_cluster.setdefault(n.cluster, []).append(n)
    if rng is not None:
        for members in by_cluster.values():
            rng.shuffle(members)
    children: dict = {}
    for cid, cl in fig.clusters.items():
        children.setdefault(cl.parent, []).append(cid)

    def emit_nodes(cluster, indent):
        for n in by_cluster.get(cluster, []):
            lines.append(indent + _node_dot(n, fig, (ports or {}).get(n.id, ())))
            if n.xlabel:  # its caption: a node of its own beside it, which wires go around
                cap = _q(n.id + CAPTION)
                lines.append(f'{indent}{cap} [shape=plaintext class="pen-caption" margin=0 width=0 height=0 label=<{_caption_html(n.xlabel, fig.direction)}>]')
                lines.append(f"{indent}{{rank=same; {_q(n.id)}; {cap}}}")
                lines.append(f"{indent}{_q(n.id)} -> {cap} [style=invis]")
        for cid in children.get(cluster, []):
            cl = fig.clusters[cid]
            if not _has_nodes(cid, by_cluster, children):
                continue
            lines.append(f"{indent}subgraph {cid} {{")
            style = 'style="rounded,filled" color="#2c4a70" fillcolor="#f4f7fc"'
            lines.append(f"{indent}  graph [{style} fontsize=10 fontcolor=\"#2c4a70\" labeljust=l labelloc=t label=<<B>{html.escape(cl.label)}</B>>]")
            emit_nodes(cid, indent + "  ")
            lines.append(f"{indent}}}")

    ties: list = []  # invisible edges that make each row of a folded figure one component
    if fig.rows > 1:  # Graphviz stacks components from the bottom in the order it first meets them
        firsts: dict[int, str] = {}  # row -> its first node's id
        for n in fig.nodes:
            firsts.setdefault(n.row, n.id)
        for row in sorted(firsts, reverse=fig.direction == "LR"):
            lines.append(f"  {_q(firsts[row])}")
        ties = _row_ties(fig)
    emit_nodes(None, "  ")
    wires = list(bundles(fig))
    if rng is not None and seed % 2:
        rng.shuffle(wires)
    inline = fig.rows > 1  # Graphviz 2.43 drops most edge labels of a packed layout: write them on the wire
    side = "w" if fig.direction == "LR" else "n"
    for i, (kind, tail, head, label, tooltip, n, mark, port) in enumerate(wires):
        target = f"{_q(head)}:{port}:{side}" if port else _q(head)
        attrs = [EDGE_STYLE[kind]]
        if n > 1:  # several legs between the same two nodes: parallel lines, one label
            ink = RESIDUAL if kind == "residual" else INK
            attrs.append(f'color="{":transparent:".join([ink] * min(n, MAX_PARALLEL))}"')
        text = _wire_label(label, mark, n, kind) if label or mark else ""
        if tooltip:
            attrs.append(f"tooltip={_q(tooltip)}")
        how = (loose or {}).get(f"{tail}->{head}", "")
        if how == REVERSE:  # ranked the other way: the wire runs back (wires have no arrowheads)
            source, target = (f"{_q(head)}:{port}:{side}" if port else _q(head)), _q(tail)
        else:
            source = _q(tail)
            if how:
                attrs.append(how)
        if inline and text and kind in ("wire", "residual"):
            leg = _q(f"{tail}~{head}~{i}")
            lines.append(f'  {leg} [shape=plaintext class="pen-leg" fontname="{LEG_FONT}" fontsize=11 '
                         f'fontcolor="{LEG_INK}" width=0 height=0 margin=0.02 {text}]')
            lines.append(f"  {source} -> {leg} [{' '.join(attrs)}]")
            lines.append(f"  {leg} -> {target} [{' '.join(attrs)}]")
            continue
        if text:
            attrs.append(text)
        lines.append(f"  {source} -> {target} [{' '.join(attrs)}]")
    for a, b in ties:
        lines.append(f"  {_q(a)} -> {_q(b)} [style=invis constraint=false]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _wire_label(label: str, mark: str, n: int, kind: str) -> str:
    """A wire's label, padded so that its text keeps clear of the wire: Graphviz places a label
    beside the wire's centre line, and the parallel lines of a bundle lie 2 points apart around
    it (the outermost n − 1 of those steps away)."""
    text = '<BR/>'.join(html.escape(l) for l in label.split("\n"))
    if mark:
        text = f'{text} <FONT FACE="{FONT}" COLOR="{BADGE}"><B>{mark}</B></FONT>'
    width = 2.6 if kind == "residual" else 1.1
    pad = math.ceil(2 * (min(n, MAX_PARALLEL) - 1) + width / 2 + 1)
    return f'label=<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="{pad}"><TR><TD>{text}</TD></TR></TABLE>>'


def _row_ties(fig: Figure) -> list:
    """(a, b) pairs joining the pieces of each row of a folded figure into one component (a row
    may hold two chains that meet only in the next row)."""
    parent = {n.id: n.id for n in fig.nodes}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in fig.edges:
        if e.tail in parent and e.head in parent:
            parent[find(e.tail)] = find(e.head)
    ties: list = []
    first_of: dict = {}
    seen: set = set()
    for n in fig.nodes:
        root = find(n.id)
        if root in seen:
            continue
        seen.add(root)
        if n.row in first_of:
            ties.append((first_of[n.row], n.id))
        else:
            first_of[n.row] = n.id
    return ties


def bundles(fig: Figure):
    """Edges grouped into bundles: the legs that run between the same two nodes become one
    drawn wire of parallel lines, labelled with all their legs. Yields
    (kind, tail, head, label, tooltip, number of legs, step badge, head port), in first-edge order."""
    order: list[tuple[object, ...]] = []
    groups: dict[tuple[object, ...], list[FEdge]] = {}
    for e in fig.edges:
        key: tuple[object, ...] = (e.kind, e.tail, e.head, e.port) if e.kind in ("wire", "residual") else (e.kind, e.tail, e.head, len(order))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(e)
    for key in order:
        es = groups[key]
        labels = [e.label for e in es if e.label]
        tooltips = [e.tooltip for e in es if e.tooltip]
        if len(es) > MAX_PARALLEL:  # x + x + ... 1,000 times: one count per leg, not 1,000 names
            labels, tooltips = _counted(labels), _counted(tooltips)
        label = ", ".join(labels)
        tooltip = "; ".join(tooltips)
        mark = next((e.badge for e in es if e.badge), "")
        n = len(es) if es[0].kind in ("wire", "residual") else 1
        yield es[0].kind, es[0].tail, es[0].head, label, tooltip, n, mark, es[0].port


def _counted(items: list) -> list:
    """['e', 'e', 'e'] → ['e ×3'], first-seen order."""
    counts: dict = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    return [x if n == 1 else f"{x} ×{n:,}" for x, n in counts.items()]


def _has_nodes(cid, by_cluster, children) -> bool:
    return bool(by_cluster.get(cid)) or any(_has_nodes(c, by_cluster, children) for c in children.get(cid, []))


def _dashed(style: str) -> str:
    """A node style with a dashed outline (a tied copy, a continued value)."""
    if "dashed" in style:
        return style
    return re.sub(r'style=("([^"]*)"|\w+)', lambda m: f'style="{(m.group(2) if m.group(2) is not None else m.group(1))},dashed"', style, count=1)


def _node_dot(n: FNode, fig: Figure | None = None, order: tuple = ()) -> str:
    """A node's DOT line; `order`: the order of its ports (a where box's), if not as written."""
    style = NODE_STYLE[n.kind]
    if n.kind in TENSOR_KINDS and len(n.text) > 3:  # a long name: an oval, not a huge circle
        style = style.replace("shape=doublecircle", "shape=ellipse peripheries=2").replace("shape=circle", "shape=ellipse")
    if n.tied:
        style = _dashed(style)
    attrs = [style, f"class={_q('pen-' + n.kind)}"] + ([n.attrs] if n.attrs else [])
    mark = f'<FONT COLOR="{BADGE}"><B>{n.badge}</B></FONT> ' if n.badge else ""
    if n.ports:
        ports = sorted(n.ports, key=lambda p: order.index(p[0])) if order else n.ports
        body = _ports_html(n.text.split("\n")[0], tuple(ports), fig.direction if fig else "LR")
    if n.html or mark or n.ports:
        body = body if n.ports else _sized_subscripts(n.html, style) or html.escape(n.text)
        if mark and body.startswith("<TABLE"):  # a label is text or one table: the badge gets a row above,
            body = f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0"><TR><TD>{mark}</TD></TR><TR><TD>{body}</TD></TR></TABLE>'  # clear of the wires
            mark = ""
        attrs.append(f"label=<{mark}{body}>")
    else:
        attrs.append(f"label={_q(n.text)}")
    if n.tooltip:
        attrs.append(f"tooltip={_q(n.tooltip)}")
    if n.group:
        attrs.append(f"group={_q(n.group)}")
    return f"{_q(n.id)} [{' '.join(attrs)}]"


def _caption_html(text: str, direction: str) -> str:
    """A node's caption, the node after it in its rank (below it left to right, to its right top
    down): the text, then as much blank space again on the far side, so that it sits nearer its
    own node than the next one."""
    cell = f'<TD><FONT POINT-SIZE="9" COLOR="#555555">{html.escape(text)}</FONT></TD>'
    table = '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0">'
    if direction == "TB":
        return f'{table}<TR>{cell}<TD WIDTH="14"> </TD></TR></TABLE>'
    return f'{table}<TR>{cell}</TR><TR><TD HEIGHT="12"> </TD></TR></TABLE>'


def _sized_subscripts(label: str, style: str) -> str:
    """A label's subscripts at SUB_SCALE of the node's font size: Graphviz's SVG would write them
    at the full size (a browser then draws them wider than the node Graphviz sized)."""
    if "<SUB>" not in label:
        return label
    m = re.search(r"fontsize=([\d.]+)", style)
    size = round(float(m.group(1)) * SUB_SCALE if m else 10)
    return label.replace("<SUB>", f'<SUB><FONT POINT-SIZE="{size}">').replace("</SUB>", "</FONT></SUB>")


def _title_html(fig: Figure) -> str:
    parts = [f'<B>{html.escape(fig.title if len(fig.title) < 140 else fig.title[:137] + "...")}</B>']
    if fig.header == "title":
        return parts[0] + '<BR ALIGN="LEFT"/>'
    if fig.legend:
        legend = " · ".join(f"{k} {v}" for k, v in fig.legend.items())
        for line in _wrap("legs: " + legend, 110):
            parts.append(f'<FONT POINT-SIZE="9" COLOR="#555555">{html.escape(line)}</FONT>')
    for note in fig.notes:
        for line in _wrap(note, 110):
            parts.append(f'<FONT POINT-SIZE="9" COLOR="#555555">{html.escape(line)}</FONT>')
    for step, caption in fig.captions.items():
        text = caption
        if text.startswith(f"{step})"):
            text = text[len(f"{step})"):].strip()
        for i, line in enumerate(_wrap(text, 120)):
            mark = f'<FONT COLOR="{BADGE}"><B>{badge(step)}</B></FONT> ' if i == 0 else "     "
            parts.append(f'<FONT POINT-SIZE="10" COLOR="#333333">{mark}{html.escape(line)}</FONT>')
    return '<BR ALIGN="LEFT"/>'.join(parts) + '<BR ALIGN="LEFT"/>'
