"""Checked diagram → Penrose figure: tensors, wires and boxes, as a small graph, then DOT.

The figure follows the paper's visual language (docs/rendering.md shows it):

    tensor      a circle named after it: inputs grey, params white, buffers white with a thick
                border, block arguments grey; a named intermediate is a small dashed circle,
                drawn only where it branches (used twice) or is a result
    leg         one wire per index, labelled with the index (and its size on request)
    contraction the legs two tensors share are wires between them; a leg three or more tensors
                share (a batch leg) meets at a black dot; a leg summed inside one tensor ends in Σ
    result      a double circle that the result's free legs run into
    operation   a labelled box on the wires it acts on (softmax, sigmoid, top-k, norms, masks,
                dropout, detach ...); element-wise arithmetic is a small circle (+ − × ÷); a
                sum of three or more terms is one + that every term runs into (a subtracted
                term through a − box), however long the sum
    reuse       a tensor used by several contractions branches into copies (Z feeding q, k, v)
    residual    an update `Z = Z + h` (or one whose other operand depends on Z) is drawn thick
                and blue, along a straight spine, so a residual model shows at a glance
    block       a call is one box (`layer ×4` for `repeat 4`); `unfold` draws one copy inline
    steps       '# 3) ...' captions become numbered, dashed frames around their statements

`build_figure` returns a `Figure` (plain records); `to_dot` writes Graphviz DOT. Node and edge
ids are sequential in statement order, so the same diagram gives the same DOT text. How each
operation is drawn is the table `FIGURE`, keyed by the names of `penrose.ops.OPS`.

Limits: a figure of more than `MAX_NODES` (5,000) nodes is refused with a `PenroseRenderError`
at the statement that crosses it (Graphviz takes about 7 s for 5,000 nodes and minutes beyond);
a layout Graphviz does not finish within its timeout (60 s) is refused at the statement that
drew the most nodes. Deep nesting (1,000 calls) draws; deeper than `penrose.stack` gives room
for is a positioned `PenroseError`.
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

from penrose import ir
from penrose.checked import Checked, V
from penrose.errors import PenroseRenderError, Span
from penrose.ops import key as op_key
from penrose.stack import deep, too_deep
from penrose.views import NOT_READ, statements, uses
from penrose.views import legend as index_legend  # the name tests and the gallery know

# ---- the figure records ------------------------------------------------------------------------


@dataclass
class FNode:
    id: str
    kind: str  # input param buffer formal value output copy junction sum op arith block mask scalar note
    text: str  # the label as plain text (lines joined by '\n')
    html: str = ""  # the Graphviz HTML-like label ('' means: text)
    cluster: str | None = None
    tooltip: str = ""
    xlabel: str = ""
    group: str = ""
    step: int | None = None  # the numbered step (caption) that drew it
    badge: str = ""  # the step's number, shown on the first box of the step


@dataclass
class FEdge:
    tail: str
    head: str
    label: str = ""
    kind: str = "wire"  # wire residual branch scalar note
    tooltip: str = ""
    step: int | None = None
    badge: str = ""


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
    number when one side is a plain number), 'box' (a labelled box on the wires it acts on).
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
    return lambda v: [name, f"over {_leg_of(v, v.attrs['axis'])}"]


def _clamp_lines(v: V) -> list[str]:
    lo, hi = v.attrs["min"], v.attrs["max"]
    return ["clamp", f"[{'−∞' if lo is None else _fmt(lo)}, {'∞' if hi is None else _fmt(hi)}]"]


def _where_lines(v: V) -> list[str]:
    extra = [_scalar_text(a) for a in v.args[1:] if isinstance(a, V) and a.type.dtype == "scalar"]
    return ["where"] + ([", ".join(extra)] if extra else [])


def _block_causal_lines(v: V) -> list[str]:
    t, p = v.type.legs
    b = v.attrs["block"]
    return ["block-causal mask", f"⌊{p}/{b}⌋ ≤ ⌊{t}/{b}⌋"]


def _flatten_lines(v: V) -> list[str]:
    x = v.args[0]
    a, b = v.attrs["start"], v.attrs["end"]
    return ["flatten", f"{', '.join(x.type.legs[a:b + 1])} → {v.type.legs[a]}"]


def _unflatten_lines(v: V) -> list[str]:
    axis = v.attrs["axis"]
    n = len(v.type.legs) - len(v.args[0].type.legs) + 1
    return ["unflatten", f"{_leg_of(v, axis)} → {', '.join(v.type.legs[axis:axis + n])}"]


def _rope_lines(v: V) -> list[str]:
    return ["RoPE", f"{_leg_of(v, v.attrs['axis'])} by position {_leg_of(v, v.attrs['pos'])}"]


def _sqrt_text(parts: list[str]) -> str:
    return f"√{parts[0]}" if len(parts[0]) <= 2 else f"√({parts[0]})"


def _arith(glyph: str) -> Drawing:
    return Drawing("arith", glyph)


def _box(glyph: str, lines=None, kind="op", scalar=None) -> Drawing:
    return Drawing("box", glyph, lines, kind, scalar)


FIGURE: dict[str, Drawing] = {
    # element-wise functions: a box named after the function
    "sigmoid": _box("sigmoid"),
    "sigma": _box("sigmoid"),
    "relu": _box("ReLU"),
    "gelu": _box("GELU"),
    "silu": _box("SiLU"),
    "tanh": _box("tanh"),
    "exp": _box("exp"),
    "log": _box("log"),
    "sqrt": _box("√", scalar=_sqrt_text),
    "abs": _box("|·|", scalar=lambda parts: f"|{parts[0]}|"),
    "softplus": _box("softplus"),
    "leaky_relu": _box("leaky ReLU", lambda v: ["leaky ReLU", f"slope {_fmt(v.attrs['slope'])}"]),
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
    "einsum": Drawing("contraction", "Σ", lambda v: ["einsum", v.attrs["spec"]]),
    # over one leg
    "softmax": _box("softmax", _over("softmax")),
    "log_softmax": _box("log-softmax", _over("log-softmax")),
    "layernorm": _box("layer norm", _over("layer norm")),
    "rmsnorm": _box("RMS norm", _over("RMS norm")),
    "topk": _box("top-k", lambda v: ["top-k", f"k={v.attrs['k']} over {_leg_of(v, v.attrs['axis'])}"]),
    "topk_mask": _box("top-k mask", lambda v: ["top-k mask", f"k={v.attrs['k']} over {_leg_of(v, v.attrs['axis'])}"], kind="mask"),
    "sum": _box("Σ", lambda v: [f"Σ {_leg_of(v, v.attrs['axis'])}"]),
    "mean": _box("mean", _over("mean")),
    "max": _box("max", _over("max")),
    # element-wise with options
    "dropout": _box("dropout", lambda v: ["dropout", f"p={v.attrs['p']}"]),
    "detach": _box("detach"),
    "clamp": _box("clamp", _clamp_lines),
    "where": _box("where", _where_lines),
    # masks
    "causal": _box("causal mask", lambda v: ["causal mask", f"{v.type.legs[1]} ≤ {v.type.legs[0]}"], kind="mask"),
    "block_causal": _box("block-causal mask", _block_causal_lines, kind="mask"),
    # indexing and shapes
    "gather": _box("gather", lambda v: ["gather", f"rows of {_short(v.args[0])}"]),
    "split": _box("split", lambda v: ["split", f"{_leg_of(v, v.attrs['axis'])} → {' + '.join(str(s) for s in v.attrs['sizes'])}"]),
    "concat": _box("concat", lambda v: ["concat", f"→ {v.type.legs[v.attrs['axis']]}"]),
    "flatten": _box("flatten", _flatten_lines),
    "unflatten": _box("unflatten", _unflatten_lines),
    "rope": _box("RoPE", _rope_lines),
}

# A figure with more nodes is refused, at the statement that crosses the limit: Graphviz takes
# about 7 s for a flat sum of 2,500 rescaled terms (5,000 nodes), 30 s for twice that.
MAX_NODES = 5000
MAX_PARALLEL = 6  # parallel lines drawn for the legs between two nodes; more are counted in the label


@dataclass(frozen=True)
class Options:
    direction: str = "LR"
    show_sizes: bool = False
    show_plan: bool = False
    unfold: bool = False
    header: bool = True  # the title block: name, leg legend and step captions


# ---- entry points ------------------------------------------------------------------------------


@deep
def build_figure(c: Checked, view: str = "diagram", options: Options = Options()) -> Figure:
    """The figure of a checked diagram: `view` is 'diagram', 'statement:N' or 'block:NAME'.

    >>> from penrose.check import check
    >>> from penrose.parse import parse
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
        b = _Builder(c, options, Figure(_title(c), options.direction, legend, header=header))
        b.draw_body(c, {}, prefix="", top=True)
        return b.fig
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
        fig = Figure(_stmt_title(s, n), options.direction, legend, header="title" if options.header else "none")
        b = _Builder(c, options, fig)
        b.draw_statement(c, s)
        return fig
    if kind == "block":
        if arg not in c.blocks:
            names = ", ".join(sorted(c.blocks)) or "none"
            raise PenroseRenderError(f"view {view!r}: no block {arg!r} (blocks: {names})", Span(c.diagram.file))
        blk = c.blocks[arg]
        fig = Figure(f"block {arg}", options.direction, legend, header=header)
        b = _Builder(c, options, fig)
        b.draw_body(blk, {}, prefix="", top=True)
        return fig
    raise PenroseRenderError(f"unknown view {view!r}; use 'diagram', 'statement:N' or 'block:NAME'", Span(c.diagram.file))


def _title(c: Checked) -> str:
    return c.name


def _stmt_title(s, n: int) -> str:
    from penrose.fmt import format_stmt

    return f"({n}) {format_stmt(s.stmt)}"


# ---- building ----------------------------------------------------------------------------------


class _Builder:
    def __init__(self, top: Checked, options: Options, fig: Figure):
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

    def add_node(self, base, kind, text, html_label="", cluster="current", tooltip="", xlabel="", group="") -> str:
        if len(self.fig.nodes) >= MAX_NODES:
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
        self.fig.nodes.append(FNode(nid, kind, text, html_label, cl, tooltip, xlabel, group, self.step))
        return nid

    def add_edge(self, tail, head, label="", kind="wire", tooltip="") -> FEdge:
        e = FEdge(tail, head, label, kind, tooltip, self.step)
        self.fig.edges.append(e)
        return e

    def leg_label(self, leg: str, cls) -> str:
        if self.opt.show_sizes and cls is not None:
            n = self.top.sizes.size(cls)
            if n is not None:
                return f"{leg}={n}"
        return leg

    def wire(self, tail, head, leg, cls, kind="wire") -> FEdge:
        return self.add_edge(tail, head, self.leg_label(leg, cls), kind, tooltip=self.leg_tooltip(leg, cls))

    def leg_tooltip(self, leg, cls) -> str:
        words = self.fig.legend.get(leg, "")
        n = self.top.sizes.size(cls) if cls is not None else None
        return f"{leg}" + (f" ({words})" if words else "") + (f", size {n}" if n is not None else "")

    # -- bodies
    def draw_body(self, body: Checked, env: dict, prefix: str, top: bool):
        """Draw every statement of a body; `env` binds formals to values (inlined blocks)."""
        scope = _Scope(body, env, uses(body), prefix)
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
                elif isinstance(st, ir.Return):
                    returned = [self.expr(scope, v, einsum_use=False) for v in s.value.args]
            except RecursionError:
                raise too_deep(st.span) from None
        self.step = base_step
        if top:
            _badge_steps(self.fig)
        if top and body.is_block:  # the block view: what the block returns is its result
            for i, (val, v) in enumerate(zip(returned, _return_values(body))):
                name = v.attrs["name"] if v.op == "ref" else f"out{i}" if len(returned) > 1 else "out"
                self.result_node(val, name)
        return returned

    def new_cluster(self, base, label, parent) -> str:
        cid = self.new_id("cluster_" + base)
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
            names = [v.attrs["name"] if v.op == "ref" else "out" for v in s.value.args]
        else:
            v = s.value
            vals = self.expr(scope, v, einsum_use=False, multi=True) if v.outs else [self.expr(scope, v, einsum_use=False)]
            names = list(st.targets)
        for val, name in zip(vals, names):
            self.result_node(val, name)

    # -- expressions
    def expr(self, scope: "_Scope", v: V, einsum_use: bool, multi: bool = False):
        key = op_key(v)
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
        name = v.attrs["name"]
        val = scope.lookup(self, name, v)
        key = val.key
        n_einsum = scope.uses.get(key, NOT_READ).einsum if key else 0
        earlier = scope.seen.get(key, 0)
        scope.seen[key] = earlier + 1
        # a tensor several contractions read, or a declared tensor read again by a contraction
        # (tied weights): one copy per contraction, branching off it
        reused = n_einsum >= 2 or (earlier > 0 and (val.kind in LEAF_KINDS or scope.leaves))
        if einsum_use and reused and val.anchor is not None:
            base = val.anchor
            kind = val.kind if val.kind in ("input", "param", "buffer", "formal") else "copy"
            cid = self.add_node(f"{name}_copy", kind, name, _name_html(name), tooltip=f"copy of {name}")
            self.add_edge(base, cid, kind="branch", tooltip=f"{name} is reused: a copy")
            return _Val([cid] * len(val.legs), val.legs, val.cls, cid, val.key, val.deps, val.kind, name)
        return val

    def contraction(self, scope, v: V, rule: Drawing, multi=False) -> _Val:
        terms, out = v.attrs["terms"], v.attrs["out"]
        vals = [self.expr(scope, a, einsum_use=True) for a in v.args]
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
            # a leg three or more tensors share (or a closed contraction's result): a junction
            j = self.add_node("junction", "junction", "", tooltip=f"leg {label_leg} shared")
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
        hidden = []
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
            return self.operator_node(v, FIGURE["+"] if op_key(v) in ("+", "-") else rule, vals)
        a, b = v.args
        op = v.attrs["op"]
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
        residual = self.is_residual(v, vals[0], vals[1:])
        node = self.add_node("arith", "arith", rule.glyph, tooltip=_op_tooltip(v), group="spine" if residual else "")
        self.inputs_to(node, vals[0], kind="residual" if residual else "wire")
        for val in vals[1:]:
            self.inputs_to(node, val)
        out = self.box_result(node, v, vals)
        out.spine = residual
        return out

    def is_residual(self, v: V, first: _Val, others: list) -> bool:
        """`Z = Z ± h`, or `x + f(x)`: the first operand is the stream, another reads it."""
        if op_key(v) not in ("+", "-") or not first.legs or first.legs != tuple(v.type.legs):
            return False
        if first.key is None:
            return False
        # another operand reads the stream: the first itself, or an earlier version of the same name
        stream = {first.key} | {k for k in first.deps if k[0] == first.key[0]}
        return any(stream & val.deps for val in others)

    def inputs_to(self, node: str, val: _Val, kind="wire"):
        if val is None:
            return
        self.after(node, val)
        for port, leg, cl in zip(val.ports, val.legs, val.cls):
            self.wire(port, node, leg, cl, kind=kind)
        if not val.legs and val.anchor is not None:
            self.add_edge(val.anchor, node, kind="scalar")

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
        node = self.add_node(op_key(v), rule.kind, "\n".join(lines), _box_html(lines), tooltip=_op_tooltip(v))
        for val in vals:
            self.inputs_to(node, val)
        if multi and v.outs:
            deps = frozenset().union(*((x.deps | ({x.key} if x.key else set())) for x in vals if x is not None))
            return [_Val([node] * len(t.legs), tuple(t.legs), tuple(t.cls), node, deps=deps) for t in v.outs]
        return self.box_result(node, v, vals)

    def block(self, scope, v: V, multi=False):
        name, inst, rep = v.attrs["block"], v.attrs["instance"], v.attrs["repeat"]
        vals = [self.expr(scope, a, False) for a in v.args]
        blk = self.top.blocks[name]
        deps = frozenset().union(*((x.deps | ({x.key} if x.key else set())) for x in vals if x is not None))
        if self.opt.unfold:
            label = f"{inst}: block {name}" + (f" ×{rep} (one copy shown)" if rep else "")
            saved = self.cluster
            self.cluster = self.new_cluster(f"block_{inst}", label, saved)
            env = {}
            for f, val in zip([d for d in blk.decls.values() if d.tensor.kind == "formal"], vals):
                env[f.tensor.name] = _Val(val.ports, tuple(f.tensor.legs), val.cls, val.anchor, None, val.deps, val.kind, f.tensor.name)
            outs = self.draw_body(blk, env, prefix=f"{inst}.", top=False)
            self.cluster = saved
            res = []
            for o, t in zip(outs, v.outs or (v.type,)):
                res.append(_Val(o.ports, tuple(t.legs), tuple(t.cls), o.anchor, None, deps | o.deps))
            return res if multi and v.outs else res[0]
        lines = [name if inst == name else f"{inst}: {name}"]
        if rep:
            lines.append(f"×{rep}")
        node = self.add_node(f"block_{inst}", "block", "\n".join(lines), _block_html(lines), tooltip=f"block {name}")
        for val in vals:
            self.inputs_to(node, val)
        if multi and v.outs:
            return [_Val([node] * len(t.legs), tuple(t.legs), tuple(t.cls), node, deps=deps) for t in v.outs]
        return _Val([node] * len(v.type.legs), tuple(v.type.legs), tuple(v.type.cls), node, deps=deps)


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
        if decl is not None and v.attrs.get("kind") != "local":
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
            return list(s.value.args)
    return []




# ---- labels ------------------------------------------------------------------------------------


def _chain(v: V) -> list:
    """The terms of a + b - c ... (or the factors of a * b * c ...) between tensors, walking the
    left spine without recursion, each with its operator ('+' for the first): [(a, '+'),
    (b, '+'), (c, '-')]. A plain binary operation gives its two operands."""
    key = op_key(v)
    group = ("+", "-") if key in ("+", "-") else ("*",) if key == "*" else ()
    rights = []
    node = v
    while op_key(node) in group and node.op == "binop" and all(x.type.dtype != "scalar" for x in node.args):
        rights.append((node.args[1], op_key(node)))
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
        x = v.attrs["value"]
        if x == math.inf:
            return "∞"
        if x == -math.inf:
            return "−∞"
        if isinstance(x, float) and x.is_integer() and abs(x) < 1e6:
            return str(x)
        return repr(x).replace("-", "−")
    if op == "dimsize":
        return v.attrs["name"]
    key = op_key(v)
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
        return v.attrs["name"]
    return v.op


def _op_tooltip(v: V) -> str:
    return f"{op_key(v) or v.op} → [{', '.join(v.type.legs)}]"


def _name_html(name: str) -> str:
    """'W_q' → W<sub>q</sub>, as the paper writes names."""
    head, _, rest = name.partition("_")
    if not head or not rest:
        return html.escape(name)
    return f"{html.escape(head)}<SUB>{html.escape(rest)}</SUB>"


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

FONT = "Helvetica"
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
    "note": 'shape=plaintext fontsize=9 fontcolor="#8a3b12"',
}
EDGE_STYLE = {
    "wire": f'color="{INK}" penwidth=1.1',
    "residual": f'color="{RESIDUAL}" penwidth=2.6 weight=8',
    "branch": 'color="#555555:#ffffff:#555555" penwidth=1.3 weight=2',
    "scalar": 'color="#777777" style=dashed',
    "note": 'color="#8a3b12" style=dotted',
    "order": "style=invis",
}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(fig: Figure) -> str:
    """Graphviz DOT text for a figure (deterministic: statement order, sequential ids)."""
    lines = [f"digraph {_q(fig.title[:60])} {{"]
    label = f" labelloc=t labeljust=l label=<{_title_html(fig)}>" if fig.header != "none" else ""
    lines.append(
        f'  graph [rankdir={fig.direction} fontname="{FONT}" fontsize=12 nodesep=0.22 ranksep=0.32 '
        f"pad=0.25 newrank=true outputorder=edgesfirst{label}]"
    )
    lines.append(f'  node [fontname="{FONT}" color="{INK}" penwidth=1.2]')
    lines.append(f'  edge [dir=none fontname="{LEG_FONT}" fontsize=11 fontcolor="{LEG_INK}" arrowhead=none]')
    by_cluster: dict = {}
    for n in fig.nodes:
        by_cluster.setdefault(n.cluster, []).append(n)
    children: dict = {}
    for cid, cl in fig.clusters.items():
        children.setdefault(cl.parent, []).append(cid)

    def emit_nodes(cluster, indent):
        for n in by_cluster.get(cluster, []):
            lines.append(indent + _node_dot(n))
        for cid in children.get(cluster, []):
            cl = fig.clusters[cid]
            if not _has_nodes(cid, by_cluster, children):
                continue
            lines.append(f"{indent}subgraph {cid} {{")
            style = 'style="rounded,filled" color="#2c4a70" fillcolor="#f4f7fc"'
            lines.append(f"{indent}  graph [{style} fontsize=10 fontcolor=\"#2c4a70\" labeljust=l labelloc=t label=<<B>{html.escape(cl.label)}</B>>]")
            emit_nodes(cid, indent + "  ")
            lines.append(f"{indent}}}")

    emit_nodes(None, "  ")
    for kind, tail, head, label, tooltip, n, mark in bundles(fig):
        attrs = [EDGE_STYLE[kind]]
        if n > 1:  # several legs between the same two nodes: parallel lines, one label
            ink = RESIDUAL if kind == "residual" else INK
            attrs.append(f'color="{":transparent:".join([ink] * min(n, MAX_PARALLEL))}"')
        if mark:
            text = '<BR/>'.join(html.escape(l) for l in label.split("\n"))
            attrs.append(f'label=<{text} <FONT FACE="{FONT}" COLOR="{BADGE}"><B>{mark}</B></FONT>>')
        elif label:
            attrs.append(f"label={_q(label)}")
        if tooltip:
            attrs.append(f"tooltip={_q(tooltip)}")
        lines.append(f"  {_q(tail)} -> {_q(head)} [{' '.join(attrs)}]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def bundles(fig: Figure):
    """Edges grouped into bundles: the legs that run between the same two nodes become one
    drawn wire of parallel lines, labelled with all their legs. Yields
    (kind, tail, head, label, tooltip, number of legs, step badge), in first-edge order."""
    order, groups = [], {}
    for e in fig.edges:
        key = (e.kind, e.tail, e.head) if e.kind in ("wire", "residual") else (e.kind, e.tail, e.head, len(order))
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
        yield es[0].kind, es[0].tail, es[0].head, label, tooltip, n, mark


def _counted(items: list) -> list:
    """['e', 'e', 'e'] → ['e ×3'], first-seen order."""
    counts: dict = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    return [x if n == 1 else f"{x} ×{n:,}" for x, n in counts.items()]


def _has_nodes(cid, by_cluster, children) -> bool:
    return bool(by_cluster.get(cid)) or any(_has_nodes(c, by_cluster, children) for c in children.get(cid, []))


def _node_dot(n: FNode) -> str:
    style = NODE_STYLE[n.kind]
    if n.kind in TENSOR_KINDS and len(n.text) > 3:  # a long name: an oval, not a huge circle
        style = style.replace("shape=doublecircle", "shape=ellipse peripheries=2").replace("shape=circle", "shape=ellipse")
    attrs = [style, f"class={_q('pen-' + n.kind)}"]
    mark = f'<FONT COLOR="{BADGE}"><B>{n.badge}</B></FONT> ' if n.badge else ""
    if n.html or mark:
        attrs.append(f"label=<{mark}{n.html or html.escape(n.text)}>")
    else:
        attrs.append(f"label={_q(n.text)}")
    if n.tooltip:
        attrs.append(f"tooltip={_q(n.tooltip)}")
    if n.xlabel:
        attrs.append(f'xlabel=<<FONT POINT-SIZE="9" COLOR="#555555">{html.escape(n.xlabel)}</FONT>>')
    if n.group:
        attrs.append(f"group={_q(n.group)}")
    return f"{_q(n.id)} [{' '.join(attrs)}]"


def _title_html(fig: Figure) -> str:
    parts = [f'<B>{html.escape(fig.title if len(fig.title) < 140 else fig.title[:137] + "...")}</B>']
    if fig.header == "title":
        return parts[0] + '<BR ALIGN="LEFT"/>'
    if fig.legend:
        legend = " · ".join(f"{k} {v}" for k, v in fig.legend.items())
        for line in _wrap("legs: " + legend, 110):
            parts.append(f'<FONT POINT-SIZE="9" COLOR="#555555">{html.escape(line)}</FONT>')
    for step, caption in fig.captions.items():
        text = caption
        if text.startswith(f"{step})"):
            text = text[len(f"{step})"):].strip()
        for i, line in enumerate(_wrap(text, 120)):
            mark = f'<FONT COLOR="{BADGE}"><B>{badge(step)}</B></FONT> ' if i == 0 else "     "
            parts.append(f'<FONT POINT-SIZE="10" COLOR="#333333">{mark}{html.escape(line)}</FONT>')
    return '<BR ALIGN="LEFT"/>'.join(parts) + '<BR ALIGN="LEFT"/>'
