"""Wire crossings of a laid-out figure, counted from Graphviz's own layout.

`layout(dot_text)` runs `dot -Tjson` on a figure's DOT text and returns its nodes and visible
edges with each edge's spline (Bézier control points); `crossings(dot_text)` flattens every
spline to a polyline and lists where edges cross, as the figure report (`penrose.rendering.measure`)
counts crossings on the drawn SVG;
`planar(dot_text)` says whether the figure's graph (its nodes and visible wires, as an
undirected graph) has a drawing without crossings at all (networkx's planarity test).

    >>> from penrose.rendering import dot_source
    >>> text = dot_source("dim e = 2, f = 3\\ninput x[e]\\nparam W[e, f]\\ny = einsum('e,ef->f', x, W)\\noutput y")
    >>> crossings(text), planar(text)
    ([], True)

Invisible edges (the figure's ordering hints) are left out; the parallel lines of a bundle are
one edge (its centre line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from penrose.rendering.graphviz import dot


@dataclass
class Edge:
    tail: str
    head: str
    points: list = field(default_factory=list)  # the flattened spline, (x, y) per point
    lines: list = field(default_factory=list)  # every line drawn (a bundle's parallel lines), flattened


@dataclass
class Layout:
    nodes: dict  # name -> (x, y)
    edges: list  # visible Edge records
    width: float = 0.0  # the drawing's bounding box, in points
    height: float = 0.0
    labels: list = field(default_factory=list)  # (owner, (x0, y0, x1, y1)) of wire labels and captions, y up


def layout(dot_text: str, timeout: float = 120.0) -> Layout:
    """Nodes, visible edges (flattened splines) and size of the figure as `dot` lays it out."""
    data = json.loads(dot(["-Tjson"], dot_text, timeout).decode("utf-8"))
    names, nodes, labels = {}, {}, []
    for o in data.get("objects", []):
        if "nodes" in o or "pos" not in o:  # a cluster
            continue
        names[o["_gvid"]] = o["name"]
        x, y = (float(v) for v in o["pos"].split(","))
        nodes[o["name"]] = (x, y)
        if "caption" in str(o.get("class", "")) or "pen-op" in str(o.get("class", "")):  # and a box's texts (its step badge)
            labels += [(o["name"], box) for box in text_boxes(o.get("_ldraw_"))]
    edges = []
    for e in data.get("edges", []):
        if "invis" in e.get("style", "") or "pos" not in e:
            continue
        lines = [_bezier(op["points"]) for op in e.get("_draw_", []) if op.get("op") in ("b", "B")]
        edge = Edge(names[e["tail"]], names[e["head"]], flatten(e["pos"]), lines)
        edges.append(edge)
        labels += [(f"{edge.tail}->{edge.head}", box) for box in text_boxes(e.get("_ldraw_"))]
    x0, y0, x1, y1 = (float(v) for v in data.get("bb", "0,0,0,0").split(","))
    return Layout(nodes, edges, x1 - x0, y1 - y0, labels)


def _bezier(points: list, steps: int = 10) -> list:
    """xdot's Bézier control points as a polyline."""
    from penrose.rendering.measure import path_points

    pts = [f"{x},{y}" for x, y in points]
    return path_points("M" + pts[0] + "C" + " ".join(pts[1:]), steps) if pts else []


def text_boxes(ops) -> list:
    """The boxes (x0, y0, x1, y1), y up, of the texts xdot drawing operations write: each from
    its baseline point, width and font size (an em's 0.75 above the baseline, 0.25 below)."""
    size, out = 14.0, []
    for op in ops or []:
        if op.get("op") == "F":
            size = float(op.get("size", size))
        elif op.get("op") == "T" and str(op.get("text", "")).strip():
            x, y = op["pt"]
            w = float(op.get("width", 0.0))
            x0 = {"l": x, "r": x - w}.get(op.get("align", "c"), x - w / 2)
            out.append((x0, y - 0.25 * size, x0 + w, y + 0.75 * size))
    return out


def label_hits(lay: Layout) -> list:
    """[(label owner, wire)]: a wire label or caption that a drawn line of a wire runs through,
    as the figure report counts them on the SVG (its text boxes estimated from the layout's)."""
    from penrose.rendering.measure import TOLERANCE, polyline_hits_box

    out = []
    drawn = [(e, e.lines or [e.points]) for e in lay.edges]
    spans = [_box([p for line in lines for p in line]) for _, lines in drawn]
    for owner, (x0, y0, x1, y1) in lay.labels:
        box = (x0 + TOLERANCE, y0 + TOLERANCE, x1 - TOLERANCE, y1 - TOLERANCE)
        for (e, lines), (a, b, c, d) in zip(drawn, spans):
            if a < box[2] and box[0] < c and b < box[3] and box[1] < d and any(polyline_hits_box(line, box) for line in lines):
                out.append((owner, f"{e.tail}->{e.head}"))
    return out


def _box(points: list) -> tuple:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return (min(xs), min(ys), max(xs), max(ys)) if xs else (0.0, 0.0, 0.0, 0.0)


def flatten(pos: str, steps: int = 10) -> list:
    """A Graphviz spline ('s,x,y e,x,y x,y x,y ...', pieces separated by ';') as a polyline."""
    out: list = []
    for piece in pos.split(";"):
        pts = []
        for tok in piece.split():
            if tok.startswith(("s,", "e,")):  # arrowhead ends: not part of the curve
                continue
            x, y = tok.split(",")[:2]
            pts.append((float(x), float(y)))
        if not pts:
            continue
        line = [pts[0]]
        for i in range(0, len(pts) - 3, 3):
            p0, p1, p2, p3 = pts[i : i + 4]
            for k in range(1, steps + 1):
                t = k / steps
                a, b, c, d = (1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t ** 3
                line.append((a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0], a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1]))
        out.extend(line)
    return out


def edge_crossings(a: Edge, b: Edge) -> list:
    """The points where two polylines cross or touch (`penrose.rendering.measure.line_crossings`)."""
    from penrose.rendering.measure import line_crossings

    if len(a.points) < 2 or len(b.points) < 2:
        return []
    return line_crossings(a.points, b.points)


def crossings(dot_text_or_layout) -> list:
    """[(edge, edge, point)] for every crossing between wires, as the figure report counts them
    (`penrose.rendering.measure.wire_crossings`: wires of one node count where they cross away
    from it); an edge is written 'tail->head'."""
    from penrose.rendering.measure import Line, wire_crossings

    lay = dot_text_or_layout if isinstance(dot_text_or_layout, Layout) else layout(dot_text_or_layout)
    return wire_crossings([Line(e.tail, e.head, [e.points], e.points) for e in lay.edges if len(e.points) > 1])


def graph_of(dot_text_or_layout):
    """The figure's graph as networkx sees it: nodes, and one undirected edge per visible wire."""
    import networkx as nx

    lay = dot_text_or_layout if isinstance(dot_text_or_layout, Layout) else layout(dot_text_or_layout)
    g = nx.Graph()
    g.add_nodes_from(lay.nodes)
    g.add_edges_from((e.tail, e.head) for e in lay.edges if e.tail != e.head)
    return g


def planar(dot_text_or_layout) -> bool:
    """Whether the figure's graph can be drawn without crossings at all."""
    import networkx as nx

    return nx.check_planarity(graph_of(dot_text_or_layout))[0]


def fewest_crossings(graph, outside=(), limit: int = 2, tests: int = 20000) -> int | None:
    """The fewest crossings of any drawing of `graph` (a networkx graph) whose nodes `outside`
    all lie on the outer face (the figure's inputs and results at the page's edge), if at most
    `limit`; else limit + 1 (more than `limit`). Exact: a drawing with k crossings exists iff the
    graph with k of them made vertices (its planarization) is planar, and a crossing can be
    sought among the edges of the Kuratowski subgraph networkx finds (every drawing of that
    subgraph crosses two of its own edges); two wires at one node are never crossed (a
    drawing with fewest crossings has none such), the edges to the outer face never. None when
    the answer takes more than `tests` planarity tests."""
    import itertools

    import networkx as nx

    g = nx.Graph(graph)
    g.add_edges_from(("@outside", n) for n in outside)
    origin = {frozenset(e): frozenset(e) for e in g.edges}  # a piece of an edge -> the edge it is of
    made = [0]

    class Spent(Exception):
        pass

    def planar_with(h, origin, k) -> bool:
        made[0] += 1
        if made[0] > tests:
            raise Spent
        flat, kuratowski = nx.check_planarity(h, counterexample=k > 0)  # one test: the subgraph only where a crossing is sought
        if flat:
            return True
        if k == 0:
            return False
        pieces = [e for e in kuratowski.edges if "@outside" not in e]
        for (a, b), (c, d) in itertools.combinations(pieces, 2):
            e, f = origin[frozenset((a, b))], origin[frozenset((c, d))]
            if e & f:  # the same wire, or two wires at one node
                continue
            x = ("@crossing", made[0], k)
            h2 = h.copy()
            h2.remove_edges_from([(a, b), (c, d)])
            h2.add_edges_from((x, n) for n in (a, b, c, d))
            o2 = {**origin, **{frozenset((x, n)): e for n in (a, b)}, **{frozenset((x, n)): f for n in (c, d)}}
            if planar_with(h2, o2, k - 1):
                return True
        return False

    try:
        for k in range(limit + 1):
            if planar_with(g, origin, k):
                return k
    except Spent:
        return None
    return limit + 1
