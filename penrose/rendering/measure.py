"""The figure report: what a person would fix by hand, measured on the drawn SVG.

`measure(svg)` reads the SVG a figure is drawn as (any SVG of Graphviz's form: `<g class="node">`
and `<g class="edge">` groups, their shapes, paths and texts) and measures its drawn geometry:

    crossings       two wires whose drawn lines cross (wires of one node count too, where they
                    cross away from it)
    labels crossed  a text (a node's label, a leg on a wire, a header line) that a wire's line
                    runs through
    overflows       a node's label whose glyphs run over the node's outline
    through         a wire that runs through a node it does not end at
    overlaps        two texts, or a text and another node's shape, on top of each other
    clipped         a text, shape or wire outside the page (the viewBox)
    copies          a tensor drawn more than once: every drawing of it after the first
    size            the page, in points

Texts are measured as the browser draws them: each glyph's ink box from the font the SVG names
(`Helvetica` → the sans-serif face fontconfig gives, Liberation Sans on Debian; `Times` italic
→ Liberation Serif Italic; glyphs the face lacks from DejaVu Sans), placed at the text's anchor
and advanced glyph by glyph; a `baseline-shift="sub"` text drops as Chromium drops it (0.56 em). Wires
are their path data sampled as polylines; node outlines their ellipses, polygons or paths.

    >>> from penrose.rendering import render
    >>> r = measure(render("dim e = 2, f = 3\\ninput x[e]\\nparam W[e, f]\\ny = einsum('e,ef->f', x, W)\\noutput y"))
    >>> r.counts()["crossings"], r.counts()["overflows"], r.counts()["labels crossed"]
    (0, 0, 0)
"""

from __future__ import annotations

import functools
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

SVG = "{http://www.w3.org/2000/svg}"
SUB_SHIFT = 0.56  # a subscript's drop, in ems: what Chromium draws for baseline-shift="sub"
TOLERANCE = 0.5  # points: touching is not crossing, a hairline past an outline is not an overflow
LEAF_KINDS = ("input", "param", "buffer", "formal")


# ---- fonts -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _face(family: str, bold: bool, italic: bool):
    """The font file a browser on this machine draws `family` with (fontconfig's choice)."""
    from matplotlib import font_manager as fm
    from matplotlib import ft2font

    serif = "times" in family.lower() or family.lower().startswith("serif")
    names = ["Liberation Serif", "Times New Roman", "Nimbus Roman", "DejaVu Serif"] if serif else \
        ["Liberation Sans", "Arial", "Helvetica", "Nimbus Sans", "DejaVu Sans"]
    props = fm.FontProperties(family=names, weight="bold" if bold else "normal", style="italic" if italic else "normal")
    path = fm.findfont(props)
    face = ft2font.FT2Font(path)
    face.set_size(1000, 72)  # one unit = a thousandth of an em
    return face


@functools.lru_cache(maxsize=None)
def _fallback():
    from matplotlib import font_manager as fm
    from matplotlib import ft2font

    face = ft2font.FT2Font(fm.findfont(fm.FontProperties(family="DejaVu Sans")))
    face.set_size(1000, 72)
    return face


@functools.lru_cache(maxsize=4096)
def glyph(family: str, bold: bool, italic: bool, ch: str) -> tuple:
    """(advance, (x0, y0, x1, y1) ink box or None) of one character, in thousandths of an em, y up."""
    from matplotlib import ft2font

    face = _face(family, bold, italic)
    if face.get_char_index(ord(ch)) == 0:
        face = _fallback()
    g = face.load_char(ord(ch), flags=ft2font.LoadFlags.NO_HINTING)
    box = tuple(v / 64 for v in g.bbox)
    ink = box if box[2] > box[0] and box[3] > box[1] else None
    return g.linearHoriAdvance / 65536, ink


def text_box(text: str, x: float, y: float, size: float, anchor: str = "start", family: str = "Helvetica",
             bold: bool = False, italic: bool = False) -> tuple | None:
    """The ink box (x0, y0, x1, y1), y down, of `text` drawn at baseline point (x, y); None for
    blank text.

    >>> x0, y0, x1, y1 = text_box("W", 0, 0, 10)
    >>> round(x1 - x0, 1), round(-y0, 1)   # Helvetica's W: 9.4 wide, 6.9 tall
    (9.4, 6.9)
    """
    pen, ink = 0.0, None
    for ch in text:
        adv, box = glyph(family, bold, italic, ch)
        if box is not None:
            b = (pen + box[0], box[1], pen + box[2], box[3])
            ink = b if ink is None else (min(ink[0], b[0]), min(ink[1], b[1]), max(ink[2], b[2]), max(ink[3], b[3]))
        pen += adv
    if ink is None:
        return None
    k = size / 1000
    start = x - pen * k / 2 if anchor == "middle" else x - pen * k if anchor == "end" else x
    return (start + ink[0] * k, y - ink[3] * k, start + ink[2] * k, y - ink[1] * k)


# ---- reading the SVG ---------------------------------------------------------------------------


@dataclass
class Text:
    text: str
    box: tuple  # the ink box (x0, y0, x1, y1), page coordinates, y down
    owner: str  # 'node NAME', 'edge A->B' or 'page'
    inside: bool = False  # a node's own label (inside its outline), not an xlabel beside it


@dataclass
class Shape:
    id: str
    kind: str  # the figure's node kind (class pen-KIND), '' for other SVGs
    outline: list  # the innermost outline as a polygon; [] for a node drawn without one (plaintext)
    box: tuple  # the bounding box of everything drawn for it


@dataclass
class Line:
    tail: str
    head: str
    lines: list  # every drawn line of the wire (a bundle's parallel lines), as polylines
    centre: list  # the middle line

    @property
    def name(self) -> str:
        return f"{self.tail}->{self.head}"


@dataclass
class Drawing:
    width: float
    height: float
    texts: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)  # id -> Shape
    wires: list = field(default_factory=list)


_NUM = re.compile(r"-?\d*\.?\d+(?:e-?\d+)?")


def _transform(text: str):
    """Graphviz's `scale(a b) rotate(0) translate(x y)` as a function of a point."""
    sx = sy = 1.0
    tx = ty = 0.0
    m = re.search(r"scale\(([^)]*)\)", text or "")
    if m:
        v = [float(t) for t in _NUM.findall(m.group(1))]
        sx, sy = (v[0], v[1] if len(v) > 1 else v[0]) if v else (1.0, 1.0)
    m = re.search(r"translate\(([^)]*)\)", text or "")
    if m:
        v = [float(t) for t in _NUM.findall(m.group(1))]
        tx, ty = (v[0], v[1] if len(v) > 1 else 0.0) if v else (0.0, 0.0)
    return lambda p: (sx * (p[0] + tx), sy * (p[1] + ty))


def path_points(d: str, steps: int = 12) -> list:
    """An SVG path of moves, lines and cubic Béziers (what Graphviz writes) as a polyline.

    >>> path_points("M0,0C0,10 10,10 10,0", steps=2)
    [(0.0, 0.0), (5.0, 7.5), (10.0, 0.0)]
    """
    out: list = []
    cmd, pen = "M", (0.0, 0.0)
    nums: list[float] = []
    tokens = re.findall(r"[MmCcLlZz]|-?\d*\.?\d+(?:e-?\d+)?", d)
    tokens.append("M")  # flushes the last command

    def flush():
        nonlocal pen
        pts = list(zip(nums[0::2], nums[1::2]))
        if cmd == "M" and pts:
            pen = pts[0]
            out.append(pen)
            out.extend(pts[1:])
            pen = out[-1]
        elif cmd == "L":
            out.extend(pts)
            pen = pts[-1] if pts else pen
        elif cmd == "C":
            for i in range(0, len(pts) - 2, 3):
                p0, (p1, p2, p3) = pen, pts[i : i + 3]
                for k in range(1, steps + 1):
                    t = k / steps
                    a, b, c, e = (1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t ** 3
                    out.append((a * p0[0] + b * p1[0] + c * p2[0] + e * p3[0], a * p0[1] + b * p1[1] + c * p2[1] + e * p3[1]))
                pen = p3

    for tok in tokens:
        if tok.isalpha():
            flush()
            cmd, nums = tok.upper(), []
        else:
            nums.append(float(tok))
    return out


def _ellipse(cx, cy, rx, ry, n=48) -> list:
    return [(cx + rx * math.cos(2 * math.pi * i / n), cy + ry * math.sin(2 * math.pi * i / n)) for i in range(n)]


def _area(poly: list) -> float:
    return abs(sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(poly, poly[1:] + poly[:1]))) / 2


def _bbox(points) -> tuple:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return (min(xs), min(ys), max(xs), max(ys)) if xs else (0.0, 0.0, 0.0, 0.0)


_UNSEEN = ("", "none", "transparent", "white", "#ffffff")


def _visible(e) -> bool:
    stroke = (e.get("stroke") or "").lower()
    fill = (e.get("fill") or "").lower()
    return stroke not in ("", "none", "transparent") or fill not in ("", "none", "transparent", "white")


def _outlines(g, at) -> list:
    """The closed shapes drawn for a node, each a polygon in page coordinates."""
    found = []
    for e in g.iter(f"{SVG}ellipse"):
        if _visible(e):
            cx, cy, rx, ry = (float(e.get(k, "0")) for k in ("cx", "cy", "rx", "ry"))
            found.append([at(p) for p in _ellipse(cx, cy, rx, ry)])
    for e in g.iter(f"{SVG}polygon"):
        if _visible(e):
            nums = [float(v) for v in _NUM.findall(e.get("points", ""))]
            found.append([at(p) for p in zip(nums[0::2], nums[1::2])])
    for e in g.iter(f"{SVG}path"):
        if _visible(e):
            found.append([at(p) for p in path_points(e.get("d", ""))])
    return [p for p in found if len(p) >= 3]


def _texts(g, at, owner: str) -> list:
    out = []
    for t in g.iter(f"{SVG}text"):
        s = "".join(t.itertext())
        if not s.strip():
            continue
        size = float(t.get("font-size", "14"))
        y = float(t.get("y", "0")) + (SUB_SHIFT * size if t.get("baseline-shift") == "sub" else 0.0)
        box = text_box(s, float(t.get("x", "0")), y, size, t.get("text-anchor", "start"), t.get("font-family", "Helvetica"),
                       t.get("font-weight") == "bold", t.get("font-style") == "italic")
        if box is not None:
            a, b = at(box[:2]), at(box[2:])
            out.append(Text(s, (min(a[0], b[0]), min(a[1], b[1]), max(a[0], b[0]), max(a[1], b[1])), owner))
    return out


def read_svg(svg, texts: bool = True) -> Drawing:
    """The drawn geometry of an SVG figure: its page, texts (unless `texts` is False), node
    outlines and wire lines."""
    root = ET.fromstring(svg.encode("utf-8") if isinstance(svg, str) else svg)
    view = [float(v) for v in _NUM.findall(root.get("viewBox", ""))]
    if len(view) == 4:
        width, height = view[2], view[3]
    else:
        width, height = (float(_NUM.findall(root.get(k, "0"))[0]) for k in ("width", "height"))
    graph = root.find(f"{SVG}g")
    if graph is None:
        return Drawing(width, height)
    at = _transform(graph.get("transform", ""))
    d = Drawing(width, height)
    for t in graph.findall(f"{SVG}text") if texts else ():  # the title block
        d.texts.extend(_texts(_Only(t), at, "page"))
    for g in graph.iter(f"{SVG}g"):
        cls = (g.get("class") or "").split()
        title = g.findtext(f"{SVG}title") or ""
        if "node" in cls:
            kind = next((c[4:] for c in cls if c.startswith("pen-")), "")
            outlines = _outlines(g, at)
            inner = min(outlines, key=_area) if outlines else []
            own = _texts(g, at, f"node {title}") if texts else []
            everything = [p for o in outlines for p in o] + [p for t in own for p in (t.box[:2], t.box[2:])]
            d.shapes[title] = Shape(title, kind, inner, _bbox(everything))
            for t in own:
                t.inside = bool(inner) and inside(((t.box[0] + t.box[2]) / 2, (t.box[1] + t.box[3]) / 2), inner)
            d.texts.extend(own)
        elif "edge" in cls:
            tail, _, head = title.partition("->")
            tail, head = tail.partition(":")[0], head.partition(":")[0]  # a port (where:mask:w) is of its node
            paths = [(p, [at(q) for q in path_points(p.get("d", ""))]) for p in g.iter(f"{SVG}path")]
            paths = [(p, line) for p, line in paths if len(line) > 1]
            if paths:  # the middle line is the wire's centre; a line in the page's colour is not seen
                seen = [line for p, line in paths if (p.get("stroke") or "").lower() not in _UNSEEN]
                d.wires.append(Line(tail, head, seen, paths[len(paths) // 2][1]))
            if texts:
                d.texts.extend(_texts(g, at, f"edge {title}"))
    return d


class _Only:
    """One element, iterated as if it were a group of one (for `_texts`)."""

    def __init__(self, e):
        self.e = e

    def iter(self, tag):
        return [self.e] if self.e.tag == tag else []


# ---- geometry ----------------------------------------------------------------------------------


def inside(p, poly: list) -> bool:
    """Whether point p lies inside the polygon (even-odd rule)."""
    x, y = p
    yes = False
    for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
        if (y0 > y) != (y1 > y) and x < x0 + (y - y0) * (x1 - x0) / (y1 - y0):
            yes = not yes
    return yes


def _orient(a, b, c) -> int:
    v = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    return (v > 1e-9) - (v < -1e-9)


def _cross(p, q, r, s) -> bool:
    return _orient(p, q, r) * _orient(p, q, s) < 0 and _orient(r, s, p) * _orient(r, s, q) < 0


def _meet(p, q, r, s) -> bool:
    """Whether segments pq and rs cross or touch (an end of one on the other), not lying along each other."""
    a, b, c, d = _orient(p, q, r), _orient(p, q, s), _orient(r, s, p), _orient(r, s, q)
    return a * b <= 0 and c * d <= 0 and not (a == b == 0)


def _crossing_point(p, q, r, s):
    d = (q[0] - p[0]) * (s[1] - r[1]) - (q[1] - p[1]) * (s[0] - r[0])
    t = ((r[0] - p[0]) * (s[1] - r[1]) - (r[1] - p[1]) * (s[0] - r[0])) / d
    return (p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]))


def _meets(a: tuple, b: tuple, pad: float = 0.0) -> bool:
    return a[0] < b[2] - pad and b[0] < a[2] - pad and a[1] < b[3] - pad and b[1] < a[3] - pad


def _shrunk(box: tuple, by: float) -> tuple:
    return (box[0] + by, box[1] + by, box[2] - by, box[3] - by)


def segment_hits_box(p, q, box: tuple) -> bool:
    """Whether the segment pq passes through the inside of the box (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    if x0 >= x1 or y0 >= y1:
        return False
    if max(p[0], q[0]) <= x0 or min(p[0], q[0]) >= x1 or max(p[1], q[1]) <= y0 or min(p[1], q[1]) >= y1:
        return False
    if x0 < p[0] < x1 and y0 < p[1] < y1 or x0 < q[0] < x1 and y0 < q[1] < y1:
        return True
    corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    return any(_cross(p, q, a, b) for a, b in zip(corners, corners[1:] + corners[:1]))


def polyline_hits_box(line: list, box: tuple) -> bool:
    return any(segment_hits_box(p, q, box) for p, q in zip(line, line[1:]))


def line_crossings(a: list, b: list) -> list:
    """The points where two polylines cross or touch (where they cross at a point both are
    sampled at, too); one point per place, however many segments meet there."""
    found: list = []
    ba, bb = _bbox(a), _bbox(b)
    if not (ba[0] <= bb[2] and bb[0] <= ba[2] and ba[1] <= bb[3] and bb[1] <= ba[3]):
        return found
    near = [i for i, (p, q) in enumerate(zip(a, a[1:]))  # a's segments that reach b's box
            if not (max(p[0], q[0]) < bb[0] or min(p[0], q[0]) > bb[2] or max(p[1], q[1]) < bb[1] or min(p[1], q[1]) > bb[3])]
    if len(near) * (len(b) - 1) > _PAIRS_IN_PYTHON:
        pairs = _meeting_pairs(a, b, near)
    else:
        pairs = [(i, j) for i in near for j in range(len(b) - 1) if _meet(a[i], a[i + 1], b[j], b[j + 1])]
    for i, j in pairs:
        x = _crossing_point(a[i], a[i + 1], b[j], b[j + 1])
        if not any(abs(x[0] - y[0]) < 1 and abs(x[1] - y[1]) < 1 for y in found):
            found.append(x)
    return found


_PAIRS_IN_PYTHON = 150  # more segment pairs than this are tested at once (numpy)


def _meeting_pairs(a: list, b: list, near: list) -> list:
    """(i, j) for every segment a[i]a[i+1] (i in `near`) and b[j]b[j+1] that `_meet`, in the order
    of the loops over i, then j: `_meet` on every pair at once, the same float operations in
    the same order (so the same answers, to the bit)."""
    import numpy as np

    pts_a, pts_b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rows = np.asarray(near)
    p, q = pts_a[rows][:, None, :], pts_a[rows + 1][:, None, :]
    r, s = pts_b[None, :-1, :], pts_b[None, 1:, :]

    def orient(u, v, w):
        x = (v[..., 0] - u[..., 0]) * (w[..., 1] - u[..., 1]) - (v[..., 1] - u[..., 1]) * (w[..., 0] - u[..., 0])
        return (x > 1e-9).astype(np.int8) - (x < -1e-9).astype(np.int8)

    oa, ob, oc, od = orient(p, q, r), orient(p, q, s), orient(r, s, p), orient(r, s, q)
    meet = (oa * ob <= 0) & (oc * od <= 0) & ~((oa == 0) & (ob == 0))
    return [(int(rows[i]), int(j)) for i, j in zip(*np.nonzero(meet))]


# ---- the report --------------------------------------------------------------------------------

NEAR_END = 6.0  # points: where two wires of one node part, their lines may touch; not a crossing


@dataclass
class Report:
    """What `measure` found; each list names its items, `counts()` sums them."""

    width: float
    height: float
    nodes: int
    crossings: list = field(default_factory=list)  # (wire, wire, point)
    labels_crossed: list = field(default_factory=list)  # (text, owner, wire)
    overflows: list = field(default_factory=list)  # (text, node)
    through: list = field(default_factory=list)  # (wire, node)
    overlaps: list = field(default_factory=list)  # (text or node, text)
    clipped: list = field(default_factory=list)  # what lies outside the page
    copies: dict = field(default_factory=dict)  # tensor -> extra drawings

    def counts(self) -> dict:
        return {"crossings": len(self.crossings), "labels crossed": len(self.labels_crossed),
                "overflows": len(self.overflows), "through": len(self.through), "overlaps": len(self.overlaps),
                "clipped": len(self.clipped), "copies": sum(self.copies.values()),
                "width": round(self.width), "height": round(self.height), "nodes": self.nodes}

    def defects(self) -> int:
        """What a person would fix by hand: crossings, crossed labels, overflows, wires through
        nodes, overlaps, clipping (copies and size are the notation's, not defects)."""
        c = self.counts()
        return sum(c[k] for k in ("crossings", "labels crossed", "overflows", "through", "overlaps", "clipped"))

    def __str__(self) -> str:
        c = self.counts()
        lines = [f"size {c['width']} x {c['height']} pt, {c['nodes']} nodes",
                 f"crossings {c['crossings']}, labels crossed {c['labels crossed']}, overflows {c['overflows']}, "
                 f"wires through nodes {c['through']}, overlaps {c['overlaps']}, clipped {c['clipped']}, copies {c['copies']}"]
        lines += [f"  crossing: {a} x {b} at ({p[0]:.0f}, {p[1]:.0f})" for a, b, p in self.crossings]
        lines += [f"  label crossed: {t!r} ({o}) by {w}" for t, o, w in self.labels_crossed]
        lines += [f"  overflow: {t!r} over the outline of {n}" for t, n in self.overflows]
        lines += [f"  through: {w} through {n}" for w, n in self.through]
        lines += [f"  overlap: {a} and {b}" for a, b in self.overlaps]
        lines += [f"  clipped: {x}" for x in self.clipped]
        lines += [f"  copies: {n} drawn {k + 1} times" for n, k in self.copies.items()]
        return "\n".join(lines)


def measure(svg) -> Report:
    """The figure report of an SVG figure (text or bytes)."""
    d = read_svg(svg)
    r = Report(d.width, d.height, sum(1 for s in d.shapes.values() if s.kind not in ("leg", "caption")))
    r.crossings = _wire_crossings(d)
    r.labels_crossed = _labels_crossed(d)
    r.overflows = _overflows(d)
    r.through = _through(d)
    r.overlaps = _overlaps(d)
    r.clipped = _clipped(d)
    r.copies = _copies(d)
    return r


def wire_crossings(wires: list) -> list:
    """[(wire, wire, point)] for every place two wires (`Line`s) cross; wires of one node count
    where they cross away from it (within NEAR_END of it they may touch as they part). A sweep
    over x compares only wires whose boxes overlap."""
    out = []
    boxes = [_bbox(w.centre) for w in wires]
    order = sorted(range(len(wires)), key=lambda i: boxes[i][0])
    for n, i in enumerate(order):
        a = wires[i]
        for j in order[n + 1 :]:
            if boxes[j][0] > boxes[i][2]:
                break
            b = wires[j]
            if a.tail == b.tail and a.head == b.head:
                continue
            first, second = (a, b) if i < j else (b, a)
            shared = {a.tail, a.head} & {b.tail, b.head}
            for p in line_crossings(first.centre, second.centre):
                if shared:  # wires of one node: only a crossing away from where they part
                    ends = [w.centre[0] if w.tail in shared else w.centre[-1] for w in (a, b)]
                    if any(math.dist(p, e) < NEAR_END for e in ends):
                        continue
                out.append((first.name, second.name, p))
    return out


def svg_tangles(svg) -> list:
    """The wire crossings and the labels wires run through of an SVG figure: what laying it out
    again in another order may remove."""
    d = read_svg(svg)
    return wire_crossings(d.wires) + _labels_crossed(d)


def _wire_crossings(d: Drawing) -> list:
    return wire_crossings(d.wires)


def _labels_crossed(d: Drawing) -> list:
    out = []
    boxes = [_bbox([p for line in w.lines for p in line]) for w in d.wires]
    for t in d.texts:
        box = _shrunk(t.box, TOLERANCE)
        for w, wb in zip(d.wires, boxes):
            if _meets(box, wb, -0.01) and any(polyline_hits_box(line, box) for line in w.lines):
                out.append((t.text, t.owner, w.name))
    return out


def _overflows(d: Drawing) -> list:
    out = []
    for t in d.texts:
        if not t.inside or not t.owner.startswith("node "):
            continue
        shape = d.shapes[t.owner[5:]]
        x0, y0, x1, y1 = _shrunk(t.box, TOLERANCE)
        if not all(inside(c, shape.outline) for c in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))):
            out.append((t.text, shape.id))
    return out


def _through(d: Drawing) -> list:
    out = []
    for w in d.wires:
        box = _bbox([p for line in w.lines for p in line])
        for s in d.shapes.values():
            if s.id in (w.tail, w.head) or not s.outline or not _meets(box, s.box):
                continue
            inner = _shrunk(_bbox(s.outline), TOLERANCE)
            if any(inside(p, s.outline) and _meets((p[0], p[1], p[0], p[1]), inner, -0.01)
                   for p in _dense(w.centre)):
                out.append((w.name, s.id))
    return out


def _dense(line: list, step: float = 2.0) -> list:
    """The polyline's points, with more between points farther apart than `step`."""
    out = line[:1]
    for p, q in zip(line, line[1:]):
        n = max(1, int(math.dist(p, q) / step))
        out.extend((p[0] + (q[0] - p[0]) * k / n, p[1] + (q[1] - p[1]) * k / n) for k in range(1, n + 1))
    return out


def _overlaps(d: Drawing) -> list:
    out = []
    texts = d.texts
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            if a.owner != b.owner and _meets(a.box, b.box, TOLERANCE):
                out.append((f"{a.text!r} ({a.owner})", f"{b.text!r} ({b.owner})"))
    for t in texts:
        for s in d.shapes.values():
            if not s.outline or t.owner == f"node {s.id}" or not _meets(t.box, s.box, TOLERANCE):
                continue
            x0, y0, x1, y1 = _shrunk(t.box, TOLERANCE)
            corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1), ((x0 + x1) / 2, (y0 + y1) / 2)]
            if any(inside(c, s.outline) for c in corners) or any(inside(p, [c for c in corners[:4]]) for p in s.outline):
                out.append((f"node {s.id}", f"{t.text!r} ({t.owner})"))
    return out


def _clipped(d: Drawing) -> list:
    page = (-TOLERANCE, -TOLERANCE, d.width + TOLERANCE, d.height + TOLERANCE)

    def out_of(box):
        return box[0] < page[0] or box[1] < page[1] or box[2] > page[2] or box[3] > page[3]

    found = [f"text {t.text!r} ({t.owner})" for t in d.texts if out_of(t.box)]
    found += [f"node {s.id}" for s in d.shapes.values() if out_of(s.box)]
    found += [f"wire {w.name}" for w in d.wires if out_of(_bbox([p for line in w.lines for p in line]))]
    return found


def _copies(d: Drawing) -> dict:
    """Tensor -> how many more times than once it is drawn: every copy node, and every leaf
    (input, param, buffer, block argument) drawn again under the same label."""
    labels: dict = {}
    for s in d.shapes.values():
        if s.kind in LEAF_KINDS or s.kind == "copy":
            text = "".join(t.text for t in d.texts if t.owner == f"node {s.id}" and t.inside)
            labels.setdefault(text, []).append(s.kind)
    out = {}
    for text, kinds in labels.items():
        leaves = sum(1 for k in kinds if k in LEAF_KINDS)
        extra = max(0, leaves - 1) + sum(1 for k in kinds if k == "copy")
        if extra:
            out[text] = extra
    return out
