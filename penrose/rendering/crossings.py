"""Wire crossings of a laid-out figure, counted from Graphviz's own layout.

`layout(dot_text)` runs `dot -Tjson` on a figure's DOT text and returns its nodes and visible
edges with each edge's spline (Bézier control points); `crossings(dot_text)` flattens every
spline to a polyline and lists the proper intersections between edges that share no endpoint;
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
import subprocess
from dataclasses import dataclass, field

from penrose.errors import PenroseRenderError, Span
from penrose.rendering.graphviz import dot_binary


@dataclass
class Edge:
    tail: str
    head: str
    points: list = field(default_factory=list)  # the flattened spline, (x, y) per point


@dataclass
class Layout:
    nodes: dict  # name -> (x, y)
    edges: list  # visible Edge records
    width: float = 0.0  # the drawing's bounding box, in points
    height: float = 0.0


def layout(dot_text: str, timeout: float = 120.0) -> Layout:
    """Nodes, visible edges (flattened splines) and size of the figure as `dot` lays it out."""
    try:
        proc = subprocess.run([dot_binary(), "-Tjson"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PenroseRenderError(f"Graphviz took longer than {timeout:.0f} s to lay out the figure", Span()) from None
    if proc.returncode != 0 or not proc.stdout:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise PenroseRenderError(f"Graphviz failed: {msg[-1] if msg else 'no output'}", Span())
    data = json.loads(proc.stdout.decode("utf-8"))
    names, nodes = {}, {}
    for o in data.get("objects", []):
        if "nodes" in o or "pos" not in o:  # a cluster
            continue
        names[o["_gvid"]] = o["name"]
        x, y = (float(v) for v in o["pos"].split(","))
        nodes[o["name"]] = (x, y)
    edges = []
    for e in data.get("edges", []):
        if "invis" in e.get("style", "") or "pos" not in e:
            continue
        edges.append(Edge(names[e["tail"]], names[e["head"]], flatten(e["pos"])))
    x0, y0, x1, y1 = (float(v) for v in data.get("bb", "0,0,0,0").split(","))
    return Layout(nodes, edges, x1 - x0, y1 - y0)


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


def _orient(a, b, c) -> int:
    v = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    return (v > 1e-6) - (v < -1e-6)


def _proper(p, q, r, s) -> bool:
    return _orient(p, q, r) * _orient(p, q, s) < 0 and _orient(r, s, p) * _orient(r, s, q) < 0


def _point(p, q, r, s):
    d = (q[0] - p[0]) * (s[1] - r[1]) - (q[1] - p[1]) * (s[0] - r[0])
    t = ((r[0] - p[0]) * (s[1] - r[1]) - (r[1] - p[1]) * (s[0] - r[0])) / d
    return (p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]))


def _box(points: list) -> tuple[float, float, float, float]:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return min(xs), min(ys), max(xs), max(ys)


def edge_crossings(a: Edge, b: Edge) -> list:
    """The points where two polylines cross properly (touching ends are not crossings)."""
    found: list = []
    if len(a.points) < 2 or len(b.points) < 2:
        return found
    ax0, ay0, ax1, ay1 = _box(a.points)
    bx0, by0, bx1, by1 = _box(b.points)
    if ax1 < bx0 or bx1 < ax0 or ay1 < by0 or by1 < ay0:
        return found
    for j in range(len(a.points) - 1):
        p, q = a.points[j], a.points[j + 1]
        if max(p[0], q[0]) < bx0 or min(p[0], q[0]) > bx1 or max(p[1], q[1]) < by0 or min(p[1], q[1]) > by1:
            continue
        for k in range(len(b.points) - 1):
            r, s = b.points[k], b.points[k + 1]
            if _proper(p, q, r, s):
                x = _point(p, q, r, s)
                if not any(abs(x[0] - y[0]) < 0.5 and abs(x[1] - y[1]) < 0.5 for y in found):
                    found.append(x)
    return found


def crossings(dot_text_or_layout) -> list:
    """[(edge, edge, point)] for every crossing between wires that share no node; an edge is
    written 'tail->head'."""
    lay = dot_text_or_layout if isinstance(dot_text_or_layout, Layout) else layout(dot_text_or_layout)
    out = []
    es = lay.edges
    boxes = [_box(e.points) if e.points else None for e in es]
    lefts = [box[0] if box is not None else 0.0 for box in boxes]
    order = sorted(range(len(es)), key=lefts.__getitem__)
    for n, i in enumerate(order):  # a sweep over x: only edges whose boxes overlap are compared
        box_i = boxes[i]
        if box_i is None:
            continue
        a = es[i]
        for j in order[n + 1 :]:
            box_j = boxes[j]
            if box_j is None:
                continue
            if box_j[0] > box_i[2]:
                break
            b = es[j]
            if {a.tail, a.head} & {b.tail, b.head}:
                continue
            first, second = (a, b) if i < j else (b, a)
            for x in edge_crossings(first, second):
                out.append((f"{first.tail}->{first.head}", f"{second.tail}->{second.head}", x))
    return out


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
