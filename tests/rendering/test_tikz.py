"""TikZ figures: the same layout as the SVG (positions, sizes and splines from `dot -Tjson`), the
same labels and styling, escaped LaTeX, --snippet, --max-width for every format, the command line,
and — where a TeX engine is installed — a compile to PDF."""

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from penrose.errors import PenroseCheckError, PenroseRenderError
from penrose.rendering import dot_source, render, render_file
from penrose.rendering.graphviz import png_size
from penrose.rendering.tikz import tex
from sources import ATTENTION

ROOT = Path(__file__).resolve().parents[2]
REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")


# a named const, a slice, a basis vector and a reduction: the boxes the paper's operations use
OPERATIONS = """\
# index legend: t token, d embedding, k kept, h head, e per head
dim t = 6, d = 8, k = 4, h = 2, e = 4
const beta = 0.5
input x[t, d]
input z[t, h, e]
y = x * beta
s = slice(y, d, 1, k)
r = select(s, t, 0)
m = reduce(z, 't h e -> h', 'max')
output r, m
"""

RESIDUAL = """\
# index legend: t token, e embedding, f hidden
dim t = 4, e = 8, f = 16
input Z[t, e]
param W_out[e, e]
block layer(x[t, e]) {
  param W1[e, f]
  param W2[f, e]
  h = layernorm(x, e)
  h = relu(einsum('te,ef->tf', h, W1))
  h = einsum('tf,fe->te', h, W2)
  return x + h
}
# 1) Four layers.
Z = layer(Z) repeat 4 as layers
h = dropout(einsum('te,ef->tf', Z, W_out), p=0.1)
Z = Z + h
s = einsum('te->', Z) * 2
y = topk(sigmoid(Z), e, k=2) * s
output y
"""

# labels with every LaTeX special character and some of the figures' Unicode
SPECIAL = """\
# index legend: t token_id, d dim
dim t = 3, d = 2
input x_in[t, d]
label x_in "50% & #1 {x} ~y^2 $5 \\ back_slash α→β ≤ Σ"
y = sigmoid(x_in)
output y
"""

NODE = re.compile(r"^\\node\[(?P<opts>[^\n]*?)\] \((?P<name>[^()]+)\) at \((?P<x>-?[\d.]+),(?P<y>-?[\d.]+)\) \{(?P<label>.*)\};(?: % (?P<id>.*))?$", re.M)
LABEL = re.compile(r"^\\node\[(?P<opts>[^\n]*?)\] at \((?P<x>-?[\d.]+),(?P<y>-?[\d.]+)\) \{(?P<label>.*)\};$", re.M)
DRAW = re.compile(r"^\\draw\[(?P<opts>[^\]]*)\] (?P<path>[^;]*);(?: % (?P<ends>.*))?$", re.M)


def layout(dot_text: str) -> dict:
    """Graphviz's own layout of the DOT text, read here independently of penrose.rendering.tikz."""
    out = subprocess.run(["dot", "-Tjson"], input=dot_text.encode(), capture_output=True, check=True).stdout
    return json.loads(out)


def pos(obj) -> tuple:
    return tuple(round(float(v), 2) for v in obj["pos"].split(",")[:2])


def layout_nodes(lay) -> dict:
    return {o["name"]: o for o in lay.get("objects", []) if "pos" in o}


def visible_edges(lay) -> list:
    return [e for e in lay.get("edges", []) if e.get("style") != "invis" and e.get("_draw_")]


def tikz_nodes(text) -> dict:
    """DOT node id -> (x, y, label, options) of every named \\node."""
    out = {}
    for m in NODE.finditer(text):
        node_id = m.group("id") or m.group("name")
        out[node_id] = (float(m.group("x")), float(m.group("y")), m.group("label"), m.group("opts"))
    return out


def strip_escapes(text: str) -> str:
    """Text without its escaped specials, commands and math: what remains must hold no special."""
    text = re.sub(r"\\[{}%&#$_^~'`\"=.]", "", text)  # escaped specials and accents
    text = re.sub(r"\$[^$]*\$", "", text)
    text = re.sub(r"\\[A-Za-z]+", "", text)
    return text.replace("\\\\", "")


def check_structure(text: str, dot_text: str, snippet: bool = False):
    """The checks every TikZ figure passes: a well-formed document with one tikzpicture, one
    \\node per figure node at dot's position, one \\draw per wire, every wire label, ASCII only,
    balanced braces and environments, no unescaped special character in a label."""
    assert text.isascii()
    assert text.count("\\begin{tikzpicture}") == 1 and text.count("\\end{tikzpicture}") == 1
    assert text.index("\\begin{tikzpicture}") < text.index("\\end{tikzpicture}")
    if snippet:
        assert "\\documentclass" not in text and "\\begin{document}" not in text
        assert text.rstrip().endswith("\\end{tikzpicture}")
    else:
        assert text.count("\\documentclass") == 1 and text.rstrip().endswith("\\end{document}")
        assert text.index("\\begin{document}") < text.index("\\begin{tikzpicture}")
    code = "\n".join(line.split(" % ")[0] if not line.startswith("%") else "" for line in text.splitlines())
    code = re.sub(r"\\[{}]", "", code)
    depth = 0
    for ch in code:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    envs = re.findall(r"\\(begin|end)\{(\w+)\}", code)
    stack = []
    for kind, env in envs:
        if kind == "begin":
            stack.append(env)
        else:
            assert stack and stack.pop() == env
    assert not stack
    lay = layout(dot_text)
    nodes = tikz_nodes(text)
    want = layout_nodes(lay)
    assert set(nodes) == set(want)
    for name, o in want.items():
        x, y, label, opts = nodes[name]
        assert (round(x, 2), round(y, 2)) == pos(o), name
    labels = [m.group("label") for m in NODE.finditer(text)] + [m.group("label") for m in LABEL.finditer(text)]
    for label in labels:
        assert label.replace("\\$", "").count("$") % 2 == 0, label
        left = strip_escapes(label)
        assert not re.search(r"[_%&#$^~]", left), label
    draws = DRAW.findall(text)
    edges = visible_edges(lay)
    assert len(draws) == len(edges)
    wire_labels = {m.group("label") for m in LABEL.finditer(text)}
    for e in edges:
        if e.get("label") and "<" not in e["label"]:
            assert tex(e["label"]) in wire_labels, e["label"]
    return lay, nodes


# ---- the layout is Graphviz's ------------------------------------------------------------------


def test_self_attention_has_dots_layout_and_labels():
    dot = dot_source(ATTENTION)
    text = render(ATTENTION, "tikz")
    lay, nodes = check_structure(text, dot)
    # sizes: the circles are as wide as dot made them
    z = layout_nodes(lay)["Z"]
    assert f"minimum size={float(z['width']) * 72:g}bp" in nodes["Z"][3]
    # node labels: names with subscripts, op boxes, step badges
    assert nodes["W_q"][2] == r"W\textsubscript{q}"
    labels = [label for _, _, label, _ in nodes.values()]
    assert any("softmax" in l and "over p" in l and "3)" in l for l in labels)
    assert any(r"$\div$ $\surd$e" in l for l in labels)
    assert "pen-output" in nodes["h"][3] and "double" in text  # the result's double circle
    # the title block, the leg legend and the step captions
    assert r"{\bfseries self\_attention}" not in text  # a diagram from text has no file name
    assert "legs: t query token $\\cdot$ p key token" in text
    assert "Affinity of each token embedding Z with slices of W matrices." in text
    assert "token embeddings Z" in text  # the display label beside Z
    # wire labels: one leg, a bundle of two, and a step badge beside a leg
    labels = [m.group("label") for m in LABEL.finditer(text)]
    assert "t, p" in labels and "e" in labels
    assert any(l.startswith("d ") and "1)" in l for l in labels)


def test_splines_are_dots_control_points():
    dot = dot_source(ATTENTION)
    lay = layout(dot)
    text = render(ATTENTION, "tikz")
    draws = {m.group("ends"): m.group("path") for m in DRAW.finditer(text)}
    edge = next(e for e in lay["edges"] if re.sub(r"<[^>]*>", "", e.get("label", "")) == "e" and e.get("_draw_"))
    tail = next(o["name"] for o in lay["objects"] if o.get("_gvid") == edge["tail"] and "pos" in o)
    head = next(o["name"] for o in lay["objects"] if o.get("_gvid") == edge["head"] and "pos" in o)
    path = draws[f"{tail.replace('_', '-')} -- {head.replace('_', '-')}"]
    points = [tuple(round(float(v), 2) for v in p.split(",")) for p in edge["pos"].split()]
    drawn = [(round(float(a), 2), round(float(b), 2)) for a, b in re.findall(r"\((-?[\d.]+),(-?[\d.]+)\)", path)]
    assert len(drawn) == len(points)
    assert all(abs(a - c) <= 0.011 and abs(b - d) <= 0.011 for (a, b), (c, d) in zip(drawn, points))  # as written, to 2 places
    assert path.count(".. controls") == (len(points) - 1) // 3


def test_same_positions_as_the_svg():
    svg = render(ATTENTION)
    text = render(ATTENTION, "tikz")
    nodes = tikz_nodes(text)
    for name in ("Z", "h", "W_q"):
        m = re.search(rf"<title>{name}</title>\n(?:<g [^>]*><a [^>]*>\n)?<ellipse [^>]*cx=\"([-\d.]+)\" cy=\"([-\d.]+)\"", svg)
        assert m, name
        assert (float(m.group(1)), -float(m.group(2))) == pytest.approx(nodes[name][:2], abs=0.01)


def test_operation_boxes_and_basis_vectors():
    text = render(OPERATIONS, "tikz")
    check_structure(text, dot_source(OPERATIONS))
    labels = [l for _, _, l, _ in tikz_nodes(text).values()]
    assert r"$\times$ beta" in labels
    assert any(l.startswith("slice") and r"1\ldots{}4" in l for l in labels)
    assert any(l.startswith("max") and "over t, e" in l for l in labels)
    assert r"e\textsubscript{0}" in labels


def test_colours_fills_and_residual_wires():
    from penrose.rendering.figure import RESIDUAL as BLUE

    text = render(RESIDUAL, "tikz")
    lay, nodes = check_structure(text, dot_source(RESIDUAL))
    colours = dict(re.findall(r"\\definecolor\{(\w+)\}\{HTML\}\{(\w+)\}", text))
    blue = "pen" + BLUE.lstrip("#").upper()
    assert colours[blue] == BLUE.lstrip("#").upper()  # the residual stream's blue
    spine = [e for e in visible_edges(lay) if BLUE in e.get("color", "")]
    residual = [d for d in DRAW.finditer(text) if d.group("opts").startswith(blue + ",")]
    assert spine and len(residual) == len(spine)
    assert {f"line width={float(e['penwidth']):g}bp" for e in spine} == {re.search(r"line width=[\d.]+bp", d.group("opts")).group(0) for d in residual}
    dashed = [e for e in visible_edges(lay) if "dashed" in e.get("style", "")]
    assert dashed and len(dashed) == sum("dashed" in d.group("opts") for d in DRAW.finditer(text))  # scalar wires
    styles = dict(re.findall(r"^  (pen-[\w-]+)/\.style=\{(.*)\},?$", text, re.M))
    z = layout_nodes(lay)["Z"]
    assert f"fill=pen{z['fillcolor'].lstrip('#').upper()}" in styles["pen-input"]  # inputs grey
    assert "rounded corners" in styles["pen-block"] and "double" in styles["pen-block"]
    block = next(label for _, _, label, opts in nodes.values() if opts.startswith("pen-block"))
    assert "layers: layer" in block and r"$\times$4" in block
    # a bundle of legs is its parallel lines: one \draw, one subpath per line
    bundle = next(e for e in visible_edges(lay) if "transparent" in e.get("color", ""))
    lines = bundle["color"].count(":") // 2 + 1
    tail = next(o["name"] for o in lay["objects"] if o.get("_gvid") == bundle["tail"] and "pos" in o)
    draw = next(d for d in DRAW.finditer(text) if (d.group("ends") or "").startswith(re.sub(r"[^A-Za-z0-9]+", "-", tail) + " -- "))
    assert draw.group("path").count("(") - draw.group("path").count(".. controls") * 2 >= lines


def test_unfolded_blocks_are_framed():
    text = render(RESIDUAL, "tikz", unfold=True)
    check_structure(text, dot_source(RESIDUAL, unfold=True))
    assert "rectangle" in text and "% cluster" in text
    assert "layers: block layer $\\times$4 (one copy shown)" in text


def test_special_characters_are_escaped():
    text = render(SPECIAL, "tikz")
    check_structure(text, dot_source(SPECIAL))
    assert r"50\% \& \#1 \{x\} \textasciitilde{}y\textasciicircum{}2 $\$$5 \textbackslash{} back\_slash" in text
    assert r"$\alpha \to \beta$ $\leq$ $\Sigma$" in text
    assert r"x\textsubscript{in}" in text and "token\\_id" in text


def test_tex_maps_the_figures_unicode():
    assert tex("a_b % & # $ { } ~ ^ \\") == r"a\_b \% \& \# $\$$ \{ \} \textasciitilde{} \textasciicircum{} \textbackslash{}"
    assert tex("× beta") == r"$\times$ beta"
    assert tex("Σ t") == r"$\Sigma$ t" and tex("Π") == r"$\Pi$"
    assert tex("q · k") == r"q $\cdot$ k"
    assert tex("slice 1…4") == r"slice 1\ldots{}4"
    assert tex("e₀ e₁₂ x²") == r"e\textsubscript{0} e\textsubscript{12} x\textsuperscript{2}"
    assert tex("α β ε λ Ω") == r"$\alpha$ $\beta$ $\varepsilon$ $\lambda$ $\Omega$"
    assert tex("÷ √e") == r"$\div$ $\surd$e"
    assert tex("p ≤ t, x → y, −∞") == r"p $\leq$ t, x $\to$ y, $- \infty$"
    assert tex("⌊p/b⌋") == r"$\lfloor$p/b$\rfloor$"
    assert tex("k̂ û") == r"\^{k} \^{u}"
    assert tex("a<b |x|") == r"a$<$b $|$x$|$"
    assert tex("a--b") == "a-{}-b"
    assert tex("\u4e2d").isascii()  # no LaTeX for it: a visible '?', never a broken document


# ---- options -----------------------------------------------------------------------------------


def test_snippet_is_only_the_picture():
    text = render(ATTENTION, "tikz", snippet=True)
    check_structure(text, dot_source(ATTENTION), snippet=True)
    assert "\\usetikzlibrary{shapes.geometric}" in text.split("\\begin{tikzpicture}")[0]  # named, in a comment
    assert all(line.startswith("%") for line in text.split("\\begin{tikzpicture}")[0].splitlines())
    with pytest.raises(PenroseRenderError, match="snippet is for TikZ"):
        render(ATTENTION, "svg", snippet=True)


def test_document_names_its_packages():
    text = render(ATTENTION, "tikz")
    head = text.split("\\RequirePackage")[0]
    for package in ("tikz", "xcolor", "geometry", "fix-cm", "shapes.geometric"):
        assert package in head
    used = re.findall(r"\\(?:usepackage|RequirePackage)(?:\[[^\]]*\])?\{([\w-]+)\}", text)
    assert set(used) == {"fix-cm", "geometry", "tikz"}


def _tikz_width(text) -> float:
    x0, _, x1, _ = (float(v) for v in re.search(r"use as bounding box\] \((-?[\d.]+),(-?[\d.]+)\) rectangle \((-?[\d.]+),(-?[\d.]+)\)", text).groups())
    m = re.search(r"scale=([\d.e-]+),", text)
    return (x1 - x0) * (float(m.group(1)) if m else 1.0)


def test_max_width_scales_tikz_down_never_up():
    full = render(ATTENTION, "tikz")
    natural = _tikz_width(full)
    small = render(ATTENTION, "tikz", max_width=200)
    assert _tikz_width(small) == pytest.approx(200, abs=0.01)
    assert "transform shape" in small and "paperwidth=200bp" in small
    assert tikz_nodes(small)["Z"][:2] == tikz_nodes(full)["Z"][:2]  # the same layout, scaled
    assert render(ATTENTION, "tikz", max_width=natural + 100) == full


def test_max_width_for_svg_png_and_pdf():
    svg = render(ATTENTION)
    w = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
    small = render(ATTENTION, max_width=300)
    m = re.search(r'<svg width="([\d.]+)px" height="([\d.]+)px"', small)
    assert float(m.group(1)) == 300
    assert re.search(r'viewBox="[^"]*"', small).group(0) == re.search(r'viewBox="[^"]*"', svg).group(0)
    h = float(re.search(r'<svg width="[\d.]+pt" height="([\d.]+)pt"', svg).group(1))
    assert float(m.group(2)) == pytest.approx(300 * h / w, abs=0.01)
    assert render(ATTENTION, max_width=w * 2) == svg  # never scaled up
    big = png_size(render(ATTENTION, "png"))
    for n in (301, 450):
        pw, ph = png_size(render(ATTENTION, "png", max_width=n))
        assert n - 2 <= pw <= n and ph / pw == pytest.approx(big[1] / big[0], rel=0.02)
    assert render(ATTENTION, "png", max_width=big[0] + 50)[:24] == render(ATTENTION, "png")[:24]
    pdf = render(ATTENTION, "pdf", max_width=250)
    box = [float(v) for v in re.search(rb"/MediaBox \[\s*([\d.\s]+)\]", pdf).group(1).split()]
    assert box[2] - box[0] <= 250
    for bad in (0, -3, "wide", True, float("inf")):
        with pytest.raises(PenroseRenderError, match="max_width"):
            render(ATTENTION, max_width=bad)


# ---- files and the command line ----------------------------------------------------------------


def _write(tmp_path, text, name="attention.pen"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_render_file_picks_tikz_by_extension_or_format(tmp_path):
    pen = _write(tmp_path, ATTENTION)
    out = render_file(pen, tmp_path / "fig.tex")
    text = Path(out).read_text()
    assert text.startswith("% Penrose figure attention") and "\\documentclass" in text
    out = render_file(pen, tmp_path / "fig.txt", fmt="tikz", snippet=True, max_width=300)
    assert "\\documentclass" not in Path(out).read_text() and "scale=" in Path(out).read_text()
    with pytest.raises(PenroseRenderError, match=r"\.svg, \.png or \.pdf file name \(\.tex for TikZ\)"):
        render_file(pen, tmp_path / "fig.txt")
    with pytest.raises(PenroseRenderError, match="unknown figure format 'gif'"):
        render_file(pen, tmp_path / "fig.gif", fmt="gif")
    assert not (tmp_path / "fig.gif").exists()


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "penrose.cli", "render", *map(str, args)], cwd=cwd, capture_output=True, text=True)


def test_cli_writes_tikz(tmp_path):
    pen = _write(tmp_path, ATTENTION)
    run = _cli(pen, "-o", tmp_path / "fig.tex")
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout and (tmp_path / "fig.tex").read_text().rstrip().endswith("\\end{document}")
    run = _cli(pen, "--format", "tikz", "--snippet", "--max-width", "250")  # no -o: printed
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("% Penrose figure") and "\\documentclass" not in run.stdout
    assert _tikz_width(run.stdout) == pytest.approx(250, abs=0.01)
    run = _cli(pen, "--format", "tikz", "-o", tmp_path / "figure.out")
    assert run.returncode == 0 and "\\begin{tikzpicture}" in (tmp_path / "figure.out").read_text()
    run = _cli(pen, "-o", tmp_path / "fig.svg", "--max-width", "300")
    assert run.returncode == 0 and 'width="300px"' in (tmp_path / "fig.svg").read_text()


def test_cli_refuses_unknown_formats_and_writes_atomically(tmp_path):
    pen = _write(tmp_path, ATTENTION)
    run = _cli(pen, "--format", "gif", "-o", tmp_path / "fig.gif")
    assert run.returncode == 1 and "unknown figure format 'gif'; use one of svg, png, pdf, tikz" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "fig.gif").exists()
    run = _cli(pen, "--format", "png")
    assert run.returncode == 1 and "binary" in run.stderr
    run = _cli(pen, "-o", tmp_path / "fig.svg", "--snippet")
    assert run.returncode == 1 and "--snippet is for TikZ" in run.stderr
    # a failed render leaves the old file as it was, and no temporary file
    old = tmp_path / "old.tex"
    old.write_text("old")
    bad = _write(tmp_path, "dim e = 2\ninput x[e]\ny = einsum('i,ij->j', x, W)\noutput y", "bad.pen")
    run = _cli(bad, "-o", old)
    assert run.returncode == 1 and "unknown tensor 'W'" in run.stderr
    assert old.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".old")] == []
    with pytest.raises(PenroseCheckError):
        render_file(bad, old)
    assert old.read_text() == "old"


# ---- every figure of the paper and the zoo -----------------------------------------------------

ZOO = sorted(p for p in [*(ROOT / "zoo" / "paper").glob("*.pen"), *(ROOT / "zoo").glob("*.pen"),
                         *(ROOT / "zoo" / "steerling").glob("steerling*.pen")]
             if re.search(r"^output ", p.read_text(), re.M))
SAMPLE = [p for p in ZOO if p.stem in ("self_attention", "operations", "steerling_listing")][:3] or ZOO[:3]


@pytest.mark.skipif(not ZOO, reason="no zoo diagrams")
def test_every_paper_listing_and_zoo_model_renders_to_tikz():
    # the full loop unless PENROSE_REDUCED is set (then a sample of 3)
    for path in SAMPLE if REDUCED else ZOO:
        dot = dot_source(path)
        check_structure(render(path, "tikz"), dot)


@pytest.mark.skipif(not ZOO, reason="no zoo diagrams")
def test_every_paper_listing_and_zoo_model_renders_to_svg_png_and_pdf():
    # the "renders to SVG, PNG, PDF and TikZ": each format's own signature, every figure
    for path in SAMPLE if REDUCED else ZOO:
        assert render(path, "svg").startswith("<?xml"), path
        assert render(path, "png").startswith(b"\x89PNG"), path
        assert render(path, "pdf").startswith(b"%PDF"), path


# ---- a real TeX engine: tools/setup.sh installs one (texlive-latex-base, texlive-pictures) --------

TEX = shutil.which("pdflatex") or shutil.which("lualatex")
PDFTOTEXT = shutil.which("pdftotext")
PAPER = sorted((ROOT / "zoo" / "paper").glob("*.pen"))


def _tex_engine():
    """pdflatex (or lualatex) and pdftotext; CI installs them (tools/setup.sh), so there a
    missing one fails, elsewhere the compile tests are skipped with the reason shown."""
    if TEX and PDFTOTEXT:
        return TEX
    why = "no TeX engine (pdflatex or lualatex) or pdftotext (poppler-utils) on PATH; tools/setup.sh installs them"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _compile(folder: Path, name: str) -> Path:
    run = subprocess.run([_tex_engine(), "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"], cwd=folder,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    pdf = folder / f"{name}.pdf"
    assert pdf.exists() and pdf.read_bytes().startswith(b"%PDF")
    return pdf


def pdf_words(pdf: Path) -> tuple:
    """((width, height) of the first page, [(word, (x, y) centre)]), y from the top, by pdftotext."""
    out = subprocess.run([PDFTOTEXT, "-bbox", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    page = re.search(r'<page width="([\d.]+)" height="([\d.]+)"', out)
    assert page, out[:500]
    words = [(html.unescape(m.group(5)), ((float(m.group(1)) + float(m.group(3))) / 2, (float(m.group(2)) + float(m.group(4))) / 2))
             for m in re.finditer(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">([^<]*)</word>', out)]
    return (float(page.group(1)), float(page.group(2))), words


SVG_NAMED = ("input", "param", "buffer", "formal", "value", "output", "copy", "op", "mask", "block")


def svg_nodes(svg: str) -> list:
    """(word, ink box) of each one-word text inside a named node of the SVG figure (a tensor's
    name, a box's or block's), in points from the page's top left corner: what the compiled
    page's words are compared with."""
    from penrose.rendering.measure import read_svg

    d = read_svg(svg)
    named = {f"node {s.id}" for s in d.shapes.values() if s.kind in SVG_NAMED}
    return [(t.text, t.box) for t in d.texts if t.owner in named and t.inside and re.fullmatch(r"\w+", t.text)]


def on_page(word: str, box: tuple, words: list) -> bool:
    """Whether the page writes `word` where the SVG does: each part of it (LaTeX's \\_ is a rule,
    so pdftotext splits a word at its underscores) a word whose centre lies in the SVG's box."""
    x0, y0, x1, y1 = box
    return all(any(w == part and x0 - 4 < p[0] < x1 + 4 and abs(p[1] - (y0 + y1) / 2) < 6 for w, p in words)
               for part in word.split("_") if part)


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_every_paper_listing_compiles_and_its_page_has_the_svgs_nodes(tmp_path, path):
    # the TikZ of the listing, compiled: the page is the SVG's size and every named node of the
    # SVG (a tensor, a box, a block) is written on the page where the SVG draws it
    _tex_engine()
    svg = render(path)
    render_file(path, tmp_path / "fig.tex")
    (width, height), words = pdf_words(_compile(tmp_path, "fig"))
    m = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', svg)
    assert m and abs(width - float(m.group(1))) < 1.5 and abs(height - float(m.group(2))) < 1.5, (width, height, m)
    nodes = svg_nodes(svg)
    assert len(nodes) >= 3, nodes
    missing = [(name, [round(v) for v in box]) for name, box in nodes if not on_page(name, box, words)]
    assert missing == [], f"{path.name}: not on the compiled page where the SVG has them: {missing}"


def test_tikz_compiles_to_pdf(tmp_path):
    render_file(_write(tmp_path, SPECIAL, "special.pen"), tmp_path / "fig.tex")
    (tmp_path / "snippet.tex").write_text(render(RESIDUAL, "tikz", snippet=True, max_width=300, unfold=True))
    (tmp_path / "paper.tex").write_text(
        "\\documentclass{article}\n\\usepackage{tikz}\n\\usetikzlibrary{shapes.geometric}\n"
        "\\begin{document}\nA figure:\n\n\\input{snippet.tex}\n\\end{document}\n"
    )
    for name in ("fig", "paper"):
        _compile(tmp_path, name)
    log = (tmp_path / "fig.log").read_text(errors="replace")
    assert "Output written on fig.pdf (1 page" in log  # the page is the figure
