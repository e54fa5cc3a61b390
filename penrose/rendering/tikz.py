"""TikZ: a figure as a LaTeX `tikzpicture`, laid out by Graphviz exactly as the SVG is.

`to_tikz(dot_text)` runs `dot -Tjson` on the same DOT text the SVG is drawn from, and writes what
Graphviz computed: each node at its position with its size, shape, fill and border (one `\\node`
per figure node, named after it), each wire as the Bézier spline Graphviz routed (one `\\draw`
per wire; a bundle of several legs is its parallel lines, as Graphviz offsets them), each label
(legs, x-labels, step badges, the title block, frames of unfolded blocks) at its place. Nothing is
laid out again, so the TikZ figure and the SVG agree point for point.

Coordinates are PostScript points (`bp`, 1/72 in), Graphviz's unit, with y pointing up as in
TikZ. Fonts: Helvetica is drawn in the document's sans-serif family, Times in its roman one, at
Graphviz's point sizes. Text is ASCII LaTeX: the special characters are escaped and the Unicode
the figures use (× Σ Π · … e₀ ≤ → Greek ...) is written as LaTeX (`$\\times$`, `\\textsubscript{0}`).

The full document needs tikz (with its `shapes.geometric` library; tikz loads xcolor), geometry
(the page is the figure's size) and fix-cm (scalable Computer Modern), all in TeX Live's and
MiKTeX's basic LaTeX; `snippet=True` gives only the `tikzpicture`, for `\\input` into a paper.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, replace
from html.parser import HTMLParser

from penrose.errors import PenroseRenderError, Span

# ---- text: LaTeX escapes and the Unicode of the figures ----------------------------------------

_SPECIAL = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "&": r"\&", "#": r"\#", "%": r"\%",
    "_": r"\_", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", '"': "''", "\t": " ",
}
# written in math mode; consecutive ones share one $...$ (OT1 text fonts lack < > | $, and
# \$ there would come from a bitmap TS1 font)
_MATH = {
    "$": r"\$", "<": "<", ">": ">", "|": "|", "§": r"\S", "¶": r"\P", "†": r"\dagger", "‡": r"\ddagger",
    "×": r"\times", "÷": r"\div", "·": r"\cdot", "⋅": r"\cdot", "−": "-", "±": r"\pm", "∓": r"\mp",
    "√": r"\surd", "∞": r"\infty", "≤": r"\leq", "≥": r"\geq", "≠": r"\neq", "≈": r"\approx",
    "≡": r"\equiv", "∼": r"\sim", "∝": r"\propto", "→": r"\to", "←": r"\leftarrow", "↦": r"\mapsto",
    "⇒": r"\Rightarrow", "↔": r"\leftrightarrow", "∑": r"\Sigma", "∏": r"\Pi", "∫": r"\int",
    "∂": r"\partial", "∇": r"\nabla", "∈": r"\in", "∉": r"\notin", "∅": r"\emptyset", "⊙": r"\odot",
    "⊗": r"\otimes", "⊕": r"\oplus", "∘": r"\circ", "∗": r"\ast", "•": r"\bullet", "⌊": r"\lfloor",
    "⌋": r"\rfloor", "⌈": r"\lceil", "⌉": r"\rceil", "⟨": r"\langle", "⟩": r"\rangle", "‖": r"\|",
    "∣": "|", "∀": r"\forall", "∃": r"\exists", "∧": r"\wedge", "∨": r"\vee", "¬": r"\neg",
    "⊤": r"\top", "⊥": r"\bot", "°": r"^{\circ}", "«": r"\ll", "»": r"\gg", "′": r"'", "ℓ": r"\ell", "ℝ": r"\mathbf{R}",
}
_GREEK = ("alpha beta gamma delta varepsilon zeta eta theta iota kappa lambda mu nu xi o pi rho "
          "varsigma sigma tau upsilon phi chi psi omega").split()
for _i, _letter in enumerate(_GREEK):
    _MATH[chr(0x3B1 + _i)] = "o" if _letter == "o" else "\\" + _letter
for _ch, _letter in zip("ΓΔΘΛΞΠΣΥΦΨΩ", "Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega".split()):
    _MATH[_ch] = "\\" + _letter
_MATH.update({"ϵ": r"\epsilon", "ϑ": r"\vartheta", "ϕ": r"\phi", "ϱ": r"\varrho", "ϖ": r"\varpi"})
_GREEK_LATIN = dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΧ", "ABEZHIKMNOPTX"))  # capitals that look like Latin ones
_TEXT = {
    "…": r"\ldots{}", "—": "---", "–": "--", "‘": "`", "’": "'", "“": "``", "”": "''", "\u00a0": "~",
    "ß": r"\ss{}", "æ": r"\ae{}", "Æ": r"\AE{}", "ø": r"\o{}", "Ø": r"\O{}",
    "œ": r"\oe{}", "Œ": r"\OE{}", "å": r"\aa{}", "Å": r"\AA{}", "ł": r"\l{}", "Ł": r"\L{}",
    "©": "(c)", "£": "GBP ",
}
_SUB = dict(zip("₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼᵣᵤᵥ", "0123456789+-=()aeoxhklmnpstijruv"))
_SUP = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁱⁿ", "0123456789+-=()in"))
_ACCENT = {"\u0300": "`", "\u0301": "'", "\u0302": "^", "\u0303": "~", "\u0308": '"', "\u0304": "=",
           "\u0307": ".", "\u0306": "u", "\u030c": "v", "\u0327": "c", "\u030a": "r", "\u030b": "H"}


def tex(text: str) -> str:
    """Plain text as LaTeX text mode, ASCII only: specials escaped, the figures' Unicode as LaTeX.

    >>> tex("W_q × 2 ≤ e₀ … 50%")
    'W\\\\_q $\\\\times$ 2 $\\\\leq$ e\\\\textsubscript{0} \\\\ldots{} 50\\\\%'
    """
    text = unicodedata.normalize("NFD", text)
    out: list[str] = []  # pieces; ('m', x) are math, merged when adjacent
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in _SUB or ch in _SUP:
            table, cmd = (_SUB, "textsubscript") if ch in _SUB else (_SUP, "textsuperscript")
            j = i
            while j < n and text[j] in table:
                j += 1
            out.append(f"\\{cmd}{{{''.join(table[c] for c in text[i:j])}}}")
            i = j
            continue
        accents = []
        j = i + 1
        while j < n and unicodedata.combining(text[j]):
            accents.append(text[j])
            j += 1
        piece = "-{}" if ch == "-" and text[j : j + 1] == "-" else _char(ch)  # no -- ligature
        for a in accents:
            if isinstance(piece, tuple):  # x̂ in math: \hat{x}
                piece = ("m", {"\u0302": r"\hat", "\u0303": r"\tilde", "\u0304": r"\bar", "\u0307": r"\dot",
                               "\u0308": r"\ddot", "\u0301": r"\acute", "\u0300": r"\grave"}.get(a, r"\hat") + "{" + piece[1] + "}")
            elif a in _ACCENT:
                base = {"i": r"\i", "j": r"\j"}.get(piece, piece)
                piece = f"\\{_ACCENT[a]}{{{base}}}"
        out.append(piece)
        i = j
    return _join(out)


def _char(ch: str):
    if ch in _SPECIAL:
        return _SPECIAL[ch]
    if ch in _MATH:
        return ("m", _MATH[ch])
    if " " <= ch <= "~":
        return ch
    if ch in _GREEK_LATIN:
        return _GREEK_LATIN[ch]
    if ch in _TEXT:
        return _TEXT[ch]
    if ch in "\n\r" or unicodedata.category(ch).startswith(("C", "Z")):
        return " "
    ascii_form = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
    if ascii_form and all(" " <= c <= "~" for c in ascii_form):
        return "".join(_char(c) for c in ascii_form)
    return "?"


def _join(pieces: list) -> str:
    out, math = [], []
    for p in pieces + [None]:
        if isinstance(p, tuple):
            math.append(p[1])
            continue
        if math:
            body = " ".join(math)
            out.append(f"${body}$")
            math = []
        if p is not None:
            out.append(p)
    # runs of spaces (a caption's indented continuation) keep their width
    return re.sub(r"  +", lambda m: "~" * len(m.group(0)), "".join(out))


# ---- labels: Graphviz's plain and HTML-like labels as styled lines ------------------------------


@dataclass(frozen=True)
class _Style:
    size: float = 14.0
    color: str = "#000000"
    face: str = "Times-Roman"
    bold: bool = False
    italic: bool = False
    underline: bool = False
    script: str = ""  # sub | sup


_HTML_HINT = re.compile(r"</?(b|i|u|o|s|sub|sup|font|br|table|tr|td|img|hr|vr)\b[^<>]*>|&(#\d+|#x[0-9a-f]+|[a-z]+);", re.I)


class _LabelParser(HTMLParser):
    def __init__(self, base: _Style):
        super().__init__(convert_charrefs=True)
        self.stack = [base]
        self.lines: list = [[]]
        self.aligns: list = []

    def handle_starttag(self, tag, attrs):
        a = {k.lower(): (v or "") for k, v in attrs}
        if tag == "br":
            self.aligns.append(a.get("align", "center").lower())
            self.lines.append([])
            return
        s = self.stack[-1]
        if tag == "b":
            s = replace(s, bold=True)
        elif tag == "i":
            s = replace(s, italic=True)
        elif tag == "u":
            s = replace(s, underline=True)
        elif tag in ("sub", "sup"):
            s = replace(s, script=tag, size=s.size * 0.75)
        elif tag == "font":
            if a.get("point-size"):
                try:
                    s = replace(s, size=float(a["point-size"]))
                except ValueError:
                    pass
            if a.get("color"):
                s = replace(s, color=a["color"])
            if a.get("face"):
                s = replace(s, face=a["face"])
        self.stack.append(s)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag != "br":
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag != "br" and len(self.stack) > 1:
            self.stack.pop()

    def handle_data(self, data):
        data = data.replace("\n", " ")
        if data:
            self.lines[-1].append((data, self.stack[-1]))


def label_lines(label: str, base: _Style, name: str = "") -> tuple[list, str]:
    """A Graphviz label as lines of (text, style) spans, and their alignment (center | left | right)."""
    if label == "\\N":
        label = name
    if _HTML_HINT.search(label):
        p = _LabelParser(base)
        try:
            p.feed(label)
            p.close()
            parsed = True
        except Exception:  # not HTML after all: the text as written
            parsed = False
        if parsed:
            lines = p.lines
            aligns = p.aligns
            if lines and not lines[-1] and len(lines) > 1:  # a trailing <BR/> ends the last line
                lines.pop()
            align = aligns[0] if aligns and all(x == aligns[0] for x in aligns) else "center"
            return lines, align
    # a plain label: \n, \l and \r end lines (centred, left, right), \\ is a backslash
    lines, aligns, cur, i = [], [], "", 0
    while i < len(label):
        c = label[i]
        if c == "\\" and i + 1 < len(label):
            nxt = label[i + 1]
            if nxt in "nlr":
                lines.append(cur)
                aligns.append({"n": "center", "l": "left", "r": "right"}[nxt])
                cur = ""
            elif nxt in "NGETH":
                cur += name if nxt == "N" else ""
            else:
                cur += nxt
            i += 2
            continue
        cur += c
        i += 1
    if cur or not lines:
        lines.append(cur)
    align = aligns[0] if aligns and all(x == aligns[0] for x in aligns) else "center"
    return [[(line, base)] if line else [] for line in lines], align


# ---- colours, fonts and numbers ----------------------------------------------------------------

_NAMED = {"black": "000000", "white": "FFFFFF", "red": "FF0000", "green": "00FF00", "blue": "0000FF",
          "gray": "C0C0C0", "grey": "C0C0C0", "yellow": "FFFF00", "orange": "FFA500", "lightgray": "D3D3D3",
          "lightgrey": "D3D3D3", "darkgray": "A9A9A9", "darkgrey": "A9A9A9", "navy": "000080"}


def _hex(color: str) -> str | None:
    """'#2166ac' → '2166AC'; None for transparent colours."""
    c = (color or "").strip().lower()
    if c in ("", "none", "transparent", "invis"):
        return None
    if c.startswith("#"):
        h = c[1:]
        if len(h) == 3:
            h = "".join(x * 2 for x in h)
        if len(h) == 8:
            if h[6:] == "00":
                return None
            h = h[:6]
        if len(h) == 6 and all(x in "0123456789abcdef" for x in h):
            return h.upper()
        return "000000"
    return _NAMED.get(c, "000000")


def _num(x: float) -> str:
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _family(face: str) -> str:
    f = face.lower()
    if "courier" in f or "mono" in f:
        fam = r"\ttfamily"
    elif "times" in f or "roman" in f or ("serif" in f and "sans" not in f):
        fam = r"\rmfamily"
    else:  # Helvetica, Arial, sans-serif
        fam = r"\sffamily"
    if "bold" in f:
        fam += r"\bfseries"
    if "italic" in f or "oblique" in f:
        fam += r"\itshape"
    return fam


def _size(size: float) -> str:
    return f"\\fontsize{{{_num(size)}}}{{{_num(size * 1.2)}}}\\selectfont"


class _Colors:
    def __init__(self) -> None:
        self.used: dict[str, str] = {}

    def __call__(self, color: str) -> str | None:
        h = _hex(color)
        return None if h is None else self.of_hex(h)

    def of_hex(self, h: str) -> str:
        """The name of a colour given as `_hex` writes it ('2166AC')."""
        name = "pen" + h
        self.used[h] = name
        return name

    def definitions(self) -> list[str]:
        return [f"\\definecolor{{{name}}}{{HTML}}{{{h}}}" for h, name in sorted(self.used.items())]


def _text(lines: list, base: _Style, colors: _Colors) -> str:
    """Spans as node text: each change from `base` (size, colour, face, bold ...) in a group."""
    out = []
    for line in lines:
        parts = []
        line = _strip(line)
        for text, s in line:
            body = tex(text)
            if not body:
                continue
            if s.script:
                body = f"\\text{'subscript' if s.script == 'sub' else 'superscript'}{{{body}}}"
                s = replace(s, size=base.size, script="")  # \textsubscript makes it small, as the figure does
            if s.underline:
                body = f"\\underline{{{body}}}"
            cmds = ""
            if s.face != base.face:
                face = s.face.lower()
                cmds += r"\itshape" if ("italic" in face or "oblique" in face) else r"\upshape"
                cmds += re.sub(r"\\(bfseries|itshape)", "", _family(face))
                if "bold" in face:
                    cmds += r"\bfseries"
            if abs(s.size - base.size) > 0.01:
                cmds += _size(s.size)
            if s.color.lower() != base.color.lower():
                name = colors(s.color)
                cmds += f"\\color{{{name}}}" if name else r"\color{white}"
            if s.bold and not base.bold:
                cmds += r"\bfseries"
            if s.italic and not base.italic:
                cmds += r"\itshape"
            if not cmds:
                parts.append(body)
                continue
            # spaces at a span's ends go outside its group (\color would swallow a leading one)
            lead = " " if body[:1] == " " else ""
            trail = " " if body[-1:] == " " and len(body.strip()) else ""
            body = body.strip(" ")
            sep = "" if cmds.endswith("}") else " "
            parts.append(f"{lead}{{{cmds}{sep}{body}}}{trail}")
        out.append("".join(parts) or r"\strut")
    text = r" \\ ".join(out)
    return "" if text == r"\strut" else text


def _strip(line: list) -> list:
    """A line's spans without the spaces it starts and ends with (TeX would typeset them)."""
    line = [(t, s) for t, s in line if t]
    while line and not line[0][0].strip():
        line = line[1:]
    while line and not line[-1][0].strip():
        line = line[:-1]
    if line:
        line[0] = (line[0][0].lstrip(), line[0][1])
        line[-1] = (line[-1][0].rstrip(), line[-1][1])
    return line


def _font(s: _Style) -> str:
    font = _size(s.size) + _family(s.face)
    if s.bold and r"\bfseries" not in font:
        font += r"\bfseries"
    if s.italic and r"\itshape" not in font:
        font += r"\itshape"
    return font


# ---- Graphviz's drawing operations -------------------------------------------------------------


@dataclass
class _Shape:
    op: str  # E (ellipse) | P (polygon) | B (Bézier outline) | L (polyline); lower case: unfilled
    points: list
    pen: str | None
    fill: str | None
    width: float
    dash: str

    @property
    def filled(self) -> bool:
        return self.op.isupper()

    def bbox(self):
        if self.op.upper() == "E":
            (x, y), (rx, ry) = self.points
            return x - rx, y - ry, x + rx, y + ry
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        return min(xs), min(ys), max(xs), max(ys)


def _shapes(ops: list) -> list[_Shape]:
    """Graphviz xdot operations → the shapes drawn, each with the pen, fill, width and dash in effect."""
    pen, fill, width, dash = "#000000", None, 1.0, ""
    out = []
    for op in ops or []:
        kind = op.get("op")
        if kind == "c":
            pen = op.get("color", pen)
        elif kind == "C":
            fill = op.get("color", fill)
        elif kind == "S":
            style = op.get("style", "")
            m = re.match(r"setlinewidth\(([\d.]+)\)", style)
            if m:
                width = float(m.group(1))
            elif style in ("dashed", "dotted"):
                dash = style
            elif style == "solid":
                dash = ""
            elif style == "bold":
                width = 2.0
        elif kind in ("E", "e"):
            x, y, rx, ry = op["rect"]
            out.append(_Shape(kind, [(x, y), (rx, ry)], pen, fill if kind == "E" else None, width, dash))
        elif kind in ("P", "p", "B", "b", "L"):
            out.append(_Shape(kind, [tuple(p) for p in op["points"]], pen, fill if kind in ("P", "B") else None, width, dash))
    return out


def _pt(p) -> str:
    return f"({_num(p[0])},{_num(p[1])})"


def _curve(points: list) -> str:
    """A B-spline of Graphviz (start, then three points per cubic piece) as a TikZ path."""
    parts = [_pt(points[0])]
    for i in range(1, len(points) - 2, 3):
        a, b, c = points[i : i + 3]
        parts.append(f".. controls {_pt(a)} and {_pt(b)} .. {_pt(c)}")
    return " ".join(parts)


def _polygon(points: list) -> str:
    return " -- ".join(_pt(p) for p in points) + " -- cycle"


# ---- the picture -------------------------------------------------------------------------------


def to_tikz(dot_text: str, snippet: bool = False, max_width: float | None = None, timeout: float = 60.0) -> str:
    """LaTeX for the figure of `dot_text`: a standalone document, or only the tikzpicture
    (`snippet`); scaled down (never up) to at most `max_width` points (bp) wide."""
    from penrose.rendering.graphviz import run_dot

    try:
        raw = run_dot(dot_text, "json", timeout=timeout)
    except PenroseRenderError as e:
        if "not recognized" in e.message:  # Graphviz before 2.40 has no JSON output
            raise PenroseRenderError(f"TikZ figures need Graphviz 2.40 or later (dot -Tjson): {e.message}", e.span) from None
        raise
    try:
        layout = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise PenroseRenderError(f"Graphviz gave a layout that is not JSON: {e}", Span()) from None
    return layout_to_tikz(layout, snippet=snippet, max_width=max_width)


def _pad(graph: dict) -> tuple[float, float]:
    pad = str(graph.get("pad", "0.0555")).split(",")
    try:
        px = float(pad[0]) * 72
        py = float(pad[1]) * 72 if len(pad) > 1 else px
    except ValueError:
        px = py = 4.0
    return px, py


def _bb(text: str):
    return tuple(float(v) for v in str(text).split(","))


def picture_size(layout: dict) -> tuple[float, float]:
    """The figure's width and height in points, its pad included (as the SVG's width and height)."""
    x0, y0, x1, y1 = _bb(layout.get("bb", "0,0,0,0"))
    px, py = _pad(layout)
    return x1 - x0 + 2 * px, y1 - y0 + 2 * py


def _name(raw: str, taken: set) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "-", raw).strip("-") or "node"
    name, k = base, 2
    while name in taken:
        name = f"{base}-{k}"
        k += 1
    taken.add(name)
    return name


def _float(obj: dict, key: str, default: float) -> float:
    try:
        return float(obj.get(key, default))
    except (TypeError, ValueError):
        return default


def _comment(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def layout_to_tikz(layout: dict, snippet: bool = False, max_width: float | None = None) -> str:
    """LaTeX for a Graphviz JSON layout (`dot -Tjson`), see `to_tikz`."""
    colors = _Colors()
    width, height = picture_size(layout)
    scale = 1.0
    if max_width is not None and width > max_width:
        scale = max_width / width
    def lw(w: float) -> str:  # line widths do not scale with the picture
        return f"line width={_num(w * scale)}bp"

    title = str(layout.get("name", "figure"))

    styles: dict = {}  # (kind, option text) -> style name
    style_names: set = set()

    def style(kind: str, options: str) -> str:
        """A TikZ style per node kind (the DOT class: pen-input, pen-op ...), so a paper can
        restyle every tensor of a kind at once; a kind drawn two ways gets two styles."""
        if (kind, options) not in styles:
            name = kind
            k = 2
            while name in style_names:
                name = f"{kind}-{k}"
                k += 1
            style_names.add(name)
            styles[(kind, options)] = name
        return styles[(kind, options)]

    body: list[str] = []
    objects = layout.get("objects", [])
    clusters = [o for o in objects if "pos" not in o and "bb" in o]
    nodes = [o for o in objects if "pos" in o]

    graph_base = _Style(_float(layout, "fontsize", 14.0), layout.get("fontcolor", "#000000"), layout.get("fontname", "Times-Roman"))

    # frames of unfolded blocks (Graphviz clusters), outermost first
    if clusters:
        body.append("% frames: the unfolded blocks")
    for cl in clusters:
        shapes = _shapes(cl.get("_draw_"))
        x0, y0, x1, y1 = _bb(cl["bb"])
        opts = []
        radius = 0.0
        for sh in shapes[:1]:
            if sh.pen and _hex(sh.pen):
                opts.append(f"draw={colors(sh.pen)}")
            if sh.fill and _hex(sh.fill):
                opts.append(f"fill={colors(sh.fill)}")
            opts.append(lw(sh.width))
            if sh.dash:
                opts.append(sh.dash)
            if sh.op.upper() == "B":
                xs = sorted({round(p[0], 2) for p in sh.points})
                radius = xs[2] - xs[0] if len(xs) >= 3 else 0.0
        if not shapes:
            continue
        if radius > 0:
            opts.append(f"rounded corners={_num(radius * scale)}bp")
        body.append(f"\\path[{', '.join(opts)}] ({_num(x0)},{_num(y0)}) rectangle ({_num(x1)},{_num(y1)}); % {_comment(str(cl.get('name', '')))}")
        cbase = _Style(_float(cl, "fontsize", graph_base.size), cl.get("fontcolor", graph_base.color), cl.get("fontname", graph_base.face))
        _label_node(body, cl, "label", "lp", cbase, colors, str(cl.get("name", "")))

    # wires, drawn before the nodes as in the SVG (outputorder=edgesfirst)
    edges = [e for e in layout.get("edges", []) if e.get("_draw_")]
    names_by_id = {}
    taken: set = set()
    for o in nodes:
        names_by_id[o.get("_gvid")] = _name(str(o.get("name", "node")), taken)
    if edges:
        body.append("% wires: the splines Graphviz routed (a bundle of legs is its parallel lines)")
    for e in edges:
        shapes = [s for s in _shapes(e["_draw_"]) if s.op in ("b", "B", "L")]
        visible: list[tuple[str, _Shape]] = []  # (pen colour as hex, line) of each line drawn in ink
        for s in shapes:
            pen_hex = _hex(s.pen) if s.pen else None
            if pen_hex:
                visible.append((pen_hex, s))
        if len(visible) > 1:  # a colour list: white lines between the others are the gaps
            inked = [(pen_hex, s) for pen_hex, s in visible if pen_hex != "FFFFFF"]
            visible = inked or visible
        by_look: dict[tuple[str, float, str], list[_Shape]] = {}
        for pen_hex, s in visible:
            by_look.setdefault((pen_hex, s.width, s.dash), []).append(s)
        tail_name = names_by_id.get(e.get("tail"), "?")
        head_name = names_by_id.get(e.get("head"), "?")
        for k, ((pen, width_, dash), group) in enumerate(by_look.items()):
            opts = [colors.of_hex(pen), lw(width_)] + ([dash] if dash else [])
            path = " ".join(_curve(s.points) if s.op in ("b", "B") else " -- ".join(_pt(p) for p in s.points) for s in group)
            if k == 0:  # one \draw per wire; a second colour of the same wire is a \path
                body.append(f"\\draw[{', '.join(opts)}] {path}; % {tail_name} -- {head_name}")
            else:
                body.append(f"\\path[draw={', '.join(opts)}] {path};")
        for key in ("_hdraw_", "_tdraw_"):  # arrowheads, when a figure has them
            for s in _shapes(e.get(key)):
                if s.op in ("P", "p") and s.pen:
                    fill = f", fill={colors(s.fill)}" if s.filled and s.fill and _hex(s.fill) else ""
                    body.append(f"\\path[draw={colors(s.pen)}{fill}, {lw(s.width)}] {_polygon(s.points)};")
    # wire labels: legs, sizes, plans and step badges
    for e in edges:
        ebase = _Style(_float(e, "fontsize", 14.0), e.get("fontcolor", "#000000"), e.get("fontname", "Times-Roman"))
        for text_key, pos_key in (("label", "lp"), ("xlabel", "xlp"), ("headlabel", "head_lp"), ("taillabel", "tail_lp")):
            _label_node(body, e, text_key, pos_key, ebase, colors, "")

    # the nodes: tensors, boxes, dots, triangles, each named after the figure's node
    if nodes:
        body.append("% nodes: at the positions and with the sizes Graphviz gave them")
    for o in nodes:
        name = names_by_id[o.get("_gvid")]
        x, y = (float(v) for v in str(o["pos"]).split(",")[:2])
        base = _Style(_float(o, "fontsize", 14.0), o.get("fontcolor", "#000000"), o.get("fontname", "Times-Roman"))
        label = str(o.get("label", "\\N"))
        lines, align = label_lines(label, base, str(o.get("name", "")))
        text = _text(lines, base, colors)
        placed = []
        if len(re.findall(r"<TD\b[^>]*>\s*[^<\s]", label, re.I)) + len(re.findall(r"<TD\b[^>]*>\s*<FONT", label, re.I)) > 1:
            # a table of cells side by side (a where box's ports beside its name): each text where
            # Graphviz put it, not the cells run together on one line
            text, lines, placed = "", [], _placed_texts(o.get("_ldraw_"), base, colors)
        shapes = [s for s in _shapes(o.get("_draw_")) if s.op.upper() in ("E", "P", "B")]
        opts, extra, geometry = _node_look(shapes, o, scale, colors)
        opts += [f"font={_font(base)}", "inner sep=0pt", "outer sep=0pt"]
        if _hex(base.color) not in ("000000", None):
            opts.append(f"text={colors(base.color)}")
        if len(lines) > 1:
            opts.append(f"align={align}")
        kind = str(o.get("class", "")).strip() or "pen-node"
        kind = re.sub(r"[^A-Za-z0-9-]+", "-", kind)
        st = style(kind, ", ".join(opts))
        body.extend(extra)
        comment = "" if name == o.get("name") else f" % {_comment(str(o.get('name')))}"
        body.append(f"\\node[{st}{', ' + geometry if geometry else ''}] ({name}) at ({_num(x)},{_num(y)}) {{{text}}};{comment}")
        body.extend(placed)
        _label_node(body, o, "xlabel", "xlp", base, colors, "")

    # the title block: name, leg legend and step captions
    if layout.get("label") and layout.get("lp"):
        body.append("% the title: the diagram's name, its legs and its step captions")
        _label_node(body, layout, "label", "lp", graph_base, colors, title)

    x0, y0, x1, y1 = _bb(layout.get("bb", "0,0,0,0"))
    px, py = _pad(layout)
    options = ["x=1bp", "y=1bp", "every node/.append style={execute at begin node=\\frenchspacing}"]
    if scale != 1.0:
        options += [f"scale={scale:.6g}", "every node/.append style={transform shape}"]
    for (_, opts), name in styles.items():
        options.append(f"{name}/.style={{{opts}}}")
    pic = ["\\begin{tikzpicture}[\n  " + ",\n  ".join(options) + "]"]
    pic += colors.definitions()
    pic.append(f"\\path[use as bounding box] ({_num(x0 - px)},{_num(y0 - py)}) rectangle ({_num(x1 + px)},{_num(y1 + py)});")
    pic += body
    pic.append("\\end{tikzpicture}")

    w, h = width * scale, height * scale
    head = [
        f"% Penrose figure {_comment(title)!s}: drawn by `penrose render` with the layout Graphviz's dot made",
        f"% (the same as the SVG's). {_num(w)} x {_num(h)} bp. Coordinates are PostScript points (bp).",
    ]
    if snippet:
        head.append("% Needs in the preamble: \\usepackage{tikz} \\usetikzlibrary{shapes.geometric} (tikz loads xcolor);")
        head.append("% with Computer Modern, \\RequirePackage{fix-cm} on the document's first line gives exact font sizes.")
        return "\n".join(head + pic) + "\n"
    head.append("% Packages (all in a standard TeX distribution): fix-cm, geometry, tikz with its shapes.geometric")
    head.append("% library, xcolor (loaded by tikz). Compile with pdflatex or lualatex.")
    doc = head + [
        "\\RequirePackage{fix-cm}",
        "\\documentclass{article}",
        f"\\usepackage[paperwidth={_num(w)}bp, paperheight={_num(h)}bp, margin=0pt]{{geometry}}",
        "\\usepackage{tikz}",
        "\\usetikzlibrary{shapes.geometric}",
        "\\pagestyle{empty}",
        "\\setlength{\\parindent}{0pt}",
        "\\setlength{\\topskip}{0pt}",
        "\\begin{document}",
        "\\noindent%",
    ] + pic + ["\\end{document}"]
    return "\n".join(doc) + "\n"


def _node_look(shapes: list, o: dict, scale: float, colors: _Colors):
    """(style options, extra paths drawn before the node, per-node geometry options) of a node."""
    def lw(w: float) -> str:
        return f"line width={_num(w * scale)}bp"

    def outline(s) -> list:  # a shape's pen, fill, line width and dash as TikZ options
        opts = []
        if s.pen and _hex(s.pen):
            opts.append(f"draw={colors(s.pen)}")
        if s.filled and s.fill and _hex(s.fill):
            opts.append(f"fill={colors(s.fill)}")
        opts.append(lw(s.width))
        if s.dash:
            opts.append(s.dash)
        return opts

    shape_name = str(o.get("shape", "ellipse")).lower()
    if not shapes:  # plaintext, none: only the label
        w = _float(o, "width", 0.0) * 72
        h = _float(o, "height", 0.0) * 72
        return ["shape=rectangle"], [], f"minimum width={_num(w)}bp, minimum height={_num(h)}bp"
    first, last = shapes[0], shapes[-1]
    opts = outline(first)
    ix0, iy0, ix1, iy1 = first.bbox()
    ox0, oy0, ox1, oy1 = last.bbox()
    double = len(shapes) > 1
    # the node's outline runs between the two peripheries; TikZ's double lines fall on them
    w = ((ix1 - ix0) + (ox1 - ox0)) / 2 if double else ix1 - ix0
    h = ((iy1 - iy0) + (oy1 - oy0)) / 2 if double else iy1 - iy0
    if double:
        gap = max(((ox1 - ox0) - (ix1 - ix0)) / 2 - first.width, 0.3)
        opts += ["double=white", f"double distance={_num(gap * scale)}bp"]
    op = first.op.upper()
    if op == "E":
        if abs(w - h) < 0.05:
            return ["circle"] + opts, [], f"minimum size={_num(w)}bp"
        return ["ellipse"] + opts, [], f"minimum width={_num(w)}bp, minimum height={_num(h)}bp"
    axis_box = op == "P" and len(first.points) == 4 and len({round(p[0], 1) for p in first.points}) == 2
    if axis_box:
        return ["rectangle"] + opts, [], f"minimum width={_num(w)}bp, minimum height={_num(h)}bp"
    if op == "B" and shape_name in ("box", "rect", "rectangle", "square"):  # a rounded box
        xs = sorted({round(p[0], 2) for p in first.points})
        radius = xs[2] - xs[0] if len(xs) >= 3 else min(w, h) / 3
        return (["rectangle", f"rounded corners={_num(radius)}bp"] + opts, [],
                f"minimum width={_num(w)}bp, minimum height={_num(h)}bp")
    # any other outline (triangles ...): Graphviz's polygon, under an invisible node of its size
    paths = []
    for s in shapes:
        o_opts = outline(s)
        path = _curve(s.points) + " -- cycle" if s.op.upper() == "B" else _polygon(s.points)
        paths.append(f"\\path[{', '.join(o_opts)}] {path};")
    return ["rectangle"], paths, f"minimum width={_num(ox1 - ox0)}bp, minimum height={_num(oy1 - oy0)}bp"


def _placed_texts(ops, base: _Style, colors: _Colors) -> list:
    """A \\node for each text Graphviz drew (xdot's T operations), on its baseline and with its
    alignment, in the font, size and colour in effect there."""
    out = []
    style = base
    for op in ops or []:
        kind = op.get("op")
        if kind == "F":
            style = replace(style, size=float(op.get("size", style.size)), face=str(op.get("face", style.face)))
        elif kind == "c":
            style = replace(style, color=str(op.get("color", style.color)))
        elif kind == "t":
            flags = int(op.get("fontchar", 0))
            style = replace(style, bold=bool(flags & 1), italic=bool(flags & 2))
        elif kind == "T" and str(op.get("text", "")).strip():
            x, y = op["pt"]
            anchor = {"l": "base west", "r": "base east"}.get(op.get("align", "c"), "base")
            text = _text([[(str(op["text"]), style)]], base, colors)
            out.append(f"\\node[font={_font(base)}, inner sep=0pt, anchor={anchor}] at ({_num(x)},{_num(y)}) {{{text}}};")
    return out


def _baselines(ops) -> list:
    """(x, y, align) of each line of text Graphviz drew, top to bottom (sub- and superscripts are
    part of their line)."""
    flags = 0
    lines: dict[float, tuple] = {}
    for op in ops or []:
        if op.get("op") == "t":
            flags = int(op.get("fontchar", 0))
        elif op.get("op") == "T" and not flags & (8 | 16):
            x, y = op["pt"]
            lines.setdefault(round(y, 1), (x, y, op.get("align", "c")))
    return [lines[k] for k in sorted(lines, reverse=True)]


def _label_node(body: list, obj: dict, text_key: str, pos_key: str, base: _Style, colors: _Colors, name: str):
    label = obj.get(text_key)
    pos = obj.get(pos_key)
    if not label or not pos:
        return
    lines, align = label_lines(str(label), base, name)
    text = _text(lines, base, colors)
    if not text:
        return
    x, y = (float(v) for v in str(pos).split(",")[:2])
    opts = [f"font={_font(base)}", "inner sep=0pt"]
    if _hex(base.color) != "000000" and _hex(base.color):
        opts.append(f"text={colors(base.color)}")
    if text_key == "label" and len(lines) > 1:
        # a title block or a frame's label: each line on the baseline Graphviz gave it (LaTeX's
        # line spacing is wider, and would push the block into the figure)
        baselines = _baselines(obj.get("_ldraw_"))
        kept = [line for line in lines if _strip(line)]
        if len(baselines) == len(kept):
            for line, (bx, by, balign) in zip(kept, baselines):
                anchor = {"l": "base west", "r": "base east"}.get(balign, "base")
                body.append(f"\\node[{', '.join(opts + [f'anchor={anchor}'])}] at ({_num(bx)},{_num(by)}) {{{_text([line], base, colors)}}};")
            return
    # a graph's or frame's label: Graphviz gives its box (lwidth x lheight around lp); its text
    # starts at the box's side (labeljust) and top or bottom (labelloc), as there
    lwidth = _float(obj, "lwidth", 0.0) * 72 if text_key == "label" else 0.0
    lheight = _float(obj, "lheight", 0.0) * 72 if text_key == "label" else 0.0
    anchor = ""
    if lheight:
        loc = str(obj.get("labelloc", "t" if "bb" in obj and "objects" not in obj else "b")).lower()
        if loc == "t":
            anchor, y = "north", y + lheight / 2
        elif loc == "b":
            anchor, y = "south", y - lheight / 2
    if lwidth:
        just = str(obj.get("labeljust", "c")).lower()
        if just == "l":
            anchor, x, align = (anchor + " west").strip(), x - lwidth / 2, "left"
        elif just == "r":
            anchor, x, align = (anchor + " east").strip(), x + lwidth / 2, "right"
    if anchor:
        opts.append(f"anchor={anchor}")
    if len(lines) > 1:
        opts.append(f"align={align}")
    body.append(f"\\node[{', '.join(opts)}] at ({_num(x)},{_num(y)}) {{{text}}};")
