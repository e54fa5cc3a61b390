"""Reading a rendered figure back: its tensors, boxes and wires, parsed from the SVG.

Golden tests compare this structure, not pixels:

    >>> from penrose.rendering import render
    >>> s = figure_structure(render("dim e = 2, f = 3\\ninput x[e]\\nparam W[e, f]\\ny = einsum('e,ef->f', x, W)\\noutput y"))
    >>> s.kinds()
    {'x': 'input', 'W': 'param', 'y': 'output'}
    >>> s.wires()
    [('W', 'y', ('f',)), ('x', 'W', ('e',))]
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from penrose.rendering.measure import path_points

SVG = "{http://www.w3.org/2000/svg}"


@dataclass
class Node:
    id: str  # the DOT node name (the SVG <title>)
    kind: str  # input param buffer formal value output copy junction sum op arith block mask note
    text: str  # every text of the node, joined by spaces (labels and xlabels)
    box: tuple  # (x0, y0, x1, y1) of its shape
    text_boxes: list = field(default_factory=list)  # its texts (an xlabel may sit outside the shape)


@dataclass
class Wire:
    tail: str
    head: str
    legs: tuple  # the label, split at ', ' (one entry per leg of a bundle)
    label: str
    style: str  # wire | residual | branch | scalar | note
    boxes: list = field(default_factory=list)  # bounding boxes of its label texts
    badge: str = ""  # a step's number on its first wire: '3)'
    curve: list = field(default_factory=list)  # the drawn spline, sampled as (x, y) points


@dataclass
class Structure:
    title: str
    header: list  # the texts of the title block (title, legend, captions)
    nodes: dict  # id -> Node
    edges: list  # Wire

    def kinds(self) -> dict:
        """{node id: kind} for the tensors (inputs, params, buffers, values, outputs, copies)."""
        tensor = {"input", "param", "buffer", "formal", "value", "output", "copy"}
        return {n.id: n.kind for n in self.nodes.values() if n.kind in tensor}

    def wires(self) -> list:
        """(tail, head, legs) of every visible wire, sorted."""
        return sorted((w.tail, w.head, w.legs) for w in self.edges if w.style != "invisible")

    def of_kind(self, kind: str) -> list:
        return [n for n in self.nodes.values() if n.kind == kind]

    def texts(self) -> list:
        return [n.text for n in self.nodes.values()]


def _texts(g) -> list:
    return [("".join(t.itertext())).strip() for t in g.iter(f"{SVG}text")]


def _num(s: str) -> float:
    return float(s)


def _text_box(t) -> tuple:
    """An estimate of a text's box: anchor, size and length (graphviz writes no widths)."""
    x, y = _num(t.get("x")), _num(t.get("y"))
    size = _num(t.get("font-size", "10"))
    width = 0.55 * size * len("".join(t.itertext()))
    anchor = t.get("text-anchor", "start")
    x0 = x - width / 2 if anchor == "middle" else x - width if anchor == "end" else x
    return (x0, y - 0.8 * size, x0 + width, y + 0.2 * size)


def _shape_box(g) -> tuple:
    xs, ys = [], []
    for e in g.iter(f"{SVG}ellipse"):
        cx, cy, rx, ry = (_num(e.get(k)) for k in ("cx", "cy", "rx", "ry"))
        xs += [cx - rx, cx + rx]
        ys += [cy - ry, cy + ry]
    for tag in ("polygon", "path"):
        for e in g.iter(f"{SVG}{tag}"):
            pts = e.get("points") or e.get("d") or ""
            nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", pts)]
            xs += nums[0::2]
            ys += nums[1::2]
    if not xs:
        return (0.0, 0.0, 0.0, 0.0)
    return (min(xs), min(ys), max(xs), max(ys))


def _style(g) -> str:
    paths = list(g.iter(f"{SVG}path"))
    if not paths:
        return "invisible"
    stroke = paths[0].get("stroke", "")
    dash = paths[0].get("stroke-dasharray")
    if stroke.lower() == "#2166ac":
        return "residual"
    if dash and stroke.lower() == "#8a3b12":
        return "note"
    if dash:
        return "scalar"
    if stroke.lower() == "#555555":
        return "branch"
    return "wire"


def figure_structure(svg: str) -> Structure:
    """Parse a figure rendered by `penrose.render` into its nodes and wires."""
    root = ET.fromstring(svg.encode("utf-8") if isinstance(svg, str) else svg)
    graph = root.find(f"{SVG}g")
    if graph is None:
        raise ValueError("not a figure from penrose.rendering: the SVG has no top-level <g>")
    title = (graph.findtext(f"{SVG}title") or "").strip()
    header = [("".join(t.itertext())).strip() for t in graph.findall(f"{SVG}text")]
    nodes, wires = {}, []
    for g in graph.iter(f"{SVG}g"):
        cls = (g.get("class") or "").split()
        if "node" in cls:
            name = html.unescape(g.findtext(f"{SVG}title") or "")
            kind = next((c[4:] for c in cls if c.startswith("pen-")), "")
            boxes = [_text_box(t) for t in g.iter(f"{SVG}text")]
            nodes[name] = Node(name, kind, " ".join(t for t in _texts(g) if t), _shape_box(g), boxes)
        elif "edge" in cls:
            tail, _, head = html.unescape(g.findtext(f"{SVG}title") or "").partition("->")
            tail, head = tail.partition(":")[0], head.partition(":")[0]  # a port (where:mask:w) is of its node
            texts = [t for t in g.iter(f"{SVG}text")]
            label = " ".join(("".join(t.itertext())).strip() for t in texts).strip()
            m = re.search(r"\s*(\d+\))$", label)
            badge = m.group(1) if m else ""
            if m:
                label = label[: m.start()]
            legs = tuple(l.strip() for l in label.split(",") if l.strip()) if label else ()
            paths = list(g.iter(f"{SVG}path"))
            curve = path_points(paths[0].get("d", "")) if paths else []
            wires.append(Wire(tail, head, legs, label, _style(g), [_text_box(t) for t in texts], badge, curve))
    for name in [n for n in nodes if nodes[n].kind == "caption"]:  # a node's caption is its text
        cap = nodes.pop(name)
        owner = nodes.get(name.removesuffix("~caption"))
        if owner is not None:
            owner.text = f"{owner.text} {cap.text}".strip()
            owner.text_boxes.extend(cap.text_boxes)
    wires = [w for w in wires if not w.tail.endswith("~caption") and not w.head.endswith("~caption")]
    return Structure(title, header, nodes, wires)


def overlaps(structure: Structure) -> list:
    """Pairs of labels (wire labels and node boxes) whose boxes overlap: a figure should have none."""
    items = []
    for n in structure.nodes.values():
        if n.kind not in ("junction",):
            items.append((f"node {n.id}", n.box))
        items.extend((f"node {n.id}", b) for b in n.text_boxes)
    for w in structure.edges:
        for b in w.boxes:
            items.append((f"label {w.label!r} of {w.tail}->{w.head}", b))
    found = []
    for i, (a, ba) in enumerate(items):
        for b, bb in items[i + 1 :]:
            if a == b:  # the texts of one label
                continue
            if ba[0] < bb[2] - 1 and bb[0] < ba[2] - 1 and ba[1] < bb[3] - 1 and bb[1] < ba[3] - 1:
                found.append((a, b))
    return found


def crossings(structure: Structure) -> list:
    """Pairs of wires whose drawn curves cross, as the figure report counts them
    (`penrose.rendering.measure.wire_crossings`)."""
    from penrose.rendering.measure import Line, wire_crossings

    visible = [Line(w.tail, w.head, [w.curve], w.curve) for w in structure.edges if w.style != "invisible" and len(w.curve) > 1]
    return sorted({(a, b) for a, b, _ in wire_crossings(visible)})
