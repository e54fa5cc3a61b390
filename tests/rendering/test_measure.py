"""The figure report (`penrose.rendering.measure`) on small hand-made SVGs whose answers are known,
so that each measure can fail; then on rendered figures and the command line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from penrose.rendering.measure import measure, path_points, read_svg, text_box

ROOT = Path(__file__).resolve().parents[2]


def svg(body: str, width: float = 200, height: float = 100) -> str:
    """A figure of Graphviz's form: y runs up from the bottom edge, as dot writes it."""
    return (f'<svg width="{width}pt" height="{height}pt" viewBox="0.00 0.00 {width} {height}" '
            'xmlns="http://www.w3.org/2000/svg">'
            f'<g id="graph0" class="graph" transform="scale(1 1) rotate(0) translate(0 {height})">{body}</g></svg>')


def node(name: str, cx: float, cy: float, rx: float = 18, ry: float = 18, text: str = "", kind: str = "param", size: float = 14) -> str:
    label = f'<text text-anchor="middle" x="{cx}" y="{cy + size * 0.3}" font-family="Helvetica,sans-Serif" font-size="{size}">{text}</text>' if text else ""
    return (f'<g class="node pen-{kind}"><title>{name}</title>'
            f'<ellipse fill="#ffffff" stroke="#222222" cx="{cx}" cy="{cy}" rx="{rx}" ry="{ry}"/>{label}</g>')


def wire(tail: str, head: str, *points, label: str = "", at=(0, 0)) -> str:
    d = "M" + " ".join(f"{x},{y}" for x, y in points[:1]) + "C" + " ".join(f"{x},{y}" for x, y in points[1:])
    text = (f'<text text-anchor="middle" x="{at[0]}" y="{at[1]}" font-family="Times,serif" font-style="italic" '
            f'font-size="11">{label}</text>') if label else ""
    return f'<g class="edge"><title>{tail}&#45;&gt;{head}</title><path fill="none" stroke="#222222" d="{d}"/>{text}</g>'


def line(a, b) -> tuple:
    """The points of a straight cubic from a to b."""
    return (a, a, b, b)


# ---- each measure on a figure whose answer is known ----------------------------------------------


def test_two_wires_that_cross_are_one_crossing():
    fig = svg(wire("a", "b", *line((10, -10), (190, -90))) + wire("c", "d", *line((10, -90), (190, -10))))
    r = measure(fig)
    assert [(a, b) for a, b, _ in r.crossings] == [("a->b", "c->d")]
    (x, y), = [p for _, _, p in r.crossings]
    assert abs(x - 100) < 1 and abs(y - 50) < 1  # page coordinates, y down


def test_wires_side_by_side_do_not_cross():
    fig = svg(wire("a", "b", *line((10, -10), (190, -10))) + wire("c", "d", *line((10, -90), (190, -90))))
    assert measure(fig).crossings == []


def test_wires_of_one_node_cross_only_away_from_it():
    parting = wire("a", "b", *line((10, -50), (190, -90))) + wire("a", "c", *line((10, -50), (190, -10)))
    assert measure(svg(parting)).crossings == []  # they meet only where they leave a
    swapped = wire("a", "b", *line((10, -40), (190, -90))) + wire("a", "c", *line((10, -60), (190, -10)))
    assert len(measure(svg(swapped)).crossings) == 1  # they leave a, then cross in the middle


def test_a_label_a_wire_runs_through_is_crossed_and_one_beside_it_is_not():
    through = wire("a", "b", *line((10, -50), (190, -50)), label="hidden", at=(100, -46))
    r = measure(svg(through))
    assert [(t, w) for t, _, w in r.labels_crossed] == [("hidden", "a->b")]
    beside = wire("a", "b", *line((10, -50), (190, -50)), label="clear", at=(100, -56))
    assert measure(svg(beside)).labels_crossed == []
    # another wire through a node's label
    other = node("n", 100, -50, rx=40, text="name") + wire("c", "d", *line((100, -5), (100, -95)))
    assert [(t, o) for t, o, _ in measure(svg(other)).labels_crossed] == [("name", "node n")]


def test_a_label_wider_than_its_oval_overflows():
    assert measure(svg(node("x", 100, -50, rx=18, text="x"))).overflows == []
    assert measure(svg(node("x", 100, -50, rx=18, text="squared_norm"))).overflows == [("squared_norm", "x")]


def test_an_outside_label_is_not_an_overflow_but_may_overlap():
    beside = (node("x", 100, -50) +
              '<g class="node pen-note"><title>t</title><text x="130" y="-20" font-family="Helvetica" font-size="9">note</text></g>')
    r = measure(svg(beside))
    assert r.overflows == [] and r.overlaps == []
    on_it = node("x", 100, -50) + node("y", 160, -50, rx=10, text="a very long label")
    assert any("node x" in a for a, _ in measure(svg(on_it)).overlaps)


def test_a_wire_through_a_node_it_does_not_end_at():
    fig = node("m", 100, -50) + wire("a", "b", *line((10, -50), (190, -50)))
    assert measure(svg(fig)).through == [("a->b", "m")]
    ends = node("a", 30, -50) + wire("a", "b", *line((48, -50), (190, -50)))
    assert measure(svg(ends)).through == []


def test_what_lies_outside_the_page_is_clipped():
    assert measure(svg(node("x", 100, -50))).clipped == []
    r = measure(svg(node("x", 195, -50, text="x") + wire("a", "b", *line((10, -50), (250, -50)))))
    assert r.clipped == ["node x", "wire a->b"]


def test_copies_count_every_drawing_after_the_first():
    fig = node("x", 30, -50, text="x", kind="input") + node("x_2", 90, -50, text="x", kind="input") + \
        node("x_3", 150, -50, text="x", kind="input") + node("W", 30, -20, text="W") + node("v_copy", 90, -20, text="v", kind="copy")
    assert measure(svg(fig)).copies == {"x": 2, "v": 1}


def test_the_page_size_is_the_view_box():
    c = measure(svg("", 321, 123)).counts()
    assert (c["width"], c["height"], c["nodes"]) == (321, 123, 0)


def test_text_is_measured_with_the_fonts_glyphs():
    w = text_box("W", 0, 0, 10)
    i = text_box("i", 0, 0, 10)
    assert 9.0 < w[2] - w[0] < 9.6 and 0.7 < i[2] - i[0] < 1.1  # Helvetica's (Arial's) W and i
    mid = text_box("WW", 100, 0, 10, anchor="middle")
    assert abs((mid[0] + mid[2]) / 2 - 100) < 0.5
    assert text_box("   ", 0, 0, 10) is None
    assert text_box("Σ→₀", 0, 0, 10) is not None  # glyphs Helvetica lacks come from a fallback face


def test_a_subscript_drops():
    sub = '<g class="node pen-param"><title>W_q</title><ellipse fill="#fff" stroke="#222" cx="100" cy="-50" rx="18" ry="18"/>' \
          '<text x="90" y="-47" font-family="Helvetica" font-size="13">W</text>' \
          '<text x="102" y="-47" font-family="Helvetica" baseline-shift="sub" font-size="13">q</text></g>'
    w, q = read_svg(svg(sub)).texts
    assert q.box[3] - w.box[3] > 5  # the q's foot well below the W's


def test_path_points_follow_the_bezier():
    pts = path_points("M0,0C0,10 10,10 10,0", steps=4)
    assert pts[0] == (0.0, 0.0) and pts[-1] == (10.0, 0.0) and max(y for _, y in pts) == 7.5


# ---- rendered figures ----------------------------------------------------------------------------

needs_dot = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")


@needs_dot
def test_the_report_of_a_rendered_figure():
    from penrose.rendering import render

    text = (ROOT / "zoo" / "paper" / "self_attention.pen").read_text()
    r = measure(render(text))
    c = r.counts()
    assert c["nodes"] >= 7 and c["copies"] == 0  # Z drawn once, its legs branching to q, k and v
    assert measure(render(text, copies=True)).counts()["copies"] >= 2  # Z and its copies
    assert c["clipped"] == 0 and c["overflows"] == 0
    assert "crossings" in str(r)


@needs_dot
def test_render_report_on_the_command_line(tmp_path):
    out = tmp_path / "mlp.svg"
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "render", "zoo/paper/mlp.pen", "-o", str(out), "--report"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.read_text().startswith("<?xml")
    assert "crossings 0, labels crossed 0, overflows 0" in run.stdout
    alone = subprocess.run([sys.executable, "-m", "penrose.cli", "render", "zoo/paper/mlp.pen", "--report"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert alone.stdout.startswith("size ") and "<svg" not in alone.stdout


@needs_dot
def test_render_copies_on_the_command_line():
    # self-attention: Z drawn once, its legs branching (the default), or once per contraction (--copies)
    def report(*flags):
        run = subprocess.run([sys.executable, "-m", "penrose.cli", "render", "zoo/paper/self_attention.pen", "--report", *flags],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout

    assert "copies 0" in report() and "copies: Z drawn 4 times" in report("--copies")


# ---- the measure agrees with a real browser ------------------------------------------------------

# every text's ink box as Chromium draws it: where its first glyph starts (anchor and baseline
# shift applied), then the canvas's glyph metrics for the same font; in the SVG's own units
BROWSER_BOXES = r"""
(() => {
  const svg = document.querySelector('svg');
  const k = svg.viewBox.baseVal.width / svg.width.baseVal.value;
  const ctx = new OffscreenCanvas(8, 8).getContext('2d');
  const out = [];
  for (const t of svg.querySelectorAll('text')) {
    const s = t.textContent;
    if (!s.trim()) continue;
    const cs = getComputedStyle(t);
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const m = ctx.measureText(s), p = t.getStartPositionOfChar(0), c = t.getCTM();
    const x = k * (c.a * p.x + c.c * p.y + c.e), y = k * (c.b * p.x + c.d * p.y + c.f);
    out.push([s, x - m.actualBoundingBoxLeft, y - m.actualBoundingBoxAscent,
              x + m.actualBoundingBoxRight, y + m.actualBoundingBoxDescent]);
  }
  return JSON.stringify(out);
})()
"""


@pytest.mark.browser
@needs_dot
def test_text_boxes_are_those_chromium_draws(tmp_path):
    import json

    from penrose.rendering import render
    from penrose.rendering.browser import Chromium, chromium_binary

    if chromium_binary() is None:
        pytest.skip("Chromium is not installed")
    # subscripts, italic legs, bold blocks and badges, a header, Unicode glyphs
    text = (ROOT / "zoo" / "paper" / "self_attention.pen").read_text()
    path = tmp_path / "fig.svg"
    path.write_text(render(text, show_sizes=True))
    with Chromium() as browser:
        browser.visit(path.as_uri())
        drawn = json.loads(browser.evaluate(BROWSER_BOXES))
    mine = read_svg(path.read_text()).texts
    assert [t.text for t in mine] == [s for s, *_ in drawn]
    far = [(t.text, [round(v, 1) for v in t.box], [round(v, 1) for v in b]) for t, (_, *b) in zip(mine, drawn)
           if max(abs(u - v) for u, v in zip(t.box, b)) > 1.5 + 0.005 * (b[2] - b[0])]  # the canvas rounds; kerning
    assert far == []


def test_line_crossings_tested_at_once_are_those_tested_pair_by_pair(monkeypatch):
    # long polylines have every pair of their segments tested at once (numpy): the same points,
    # in the same order, as the loop over pairs, on crossings, touching ends and collinear runs
    import random

    from penrose.rendering import measure as m

    rng = random.Random(1)

    def polyline(n, grid):
        return [(round(rng.uniform(0, 40) / grid) * grid, round(rng.uniform(0, 40) / grid) * grid) for _ in range(n)]

    found = 0
    for _ in range(300):
        grid = rng.choice([0.5, 1.0, 1e-3])
        a, b = polyline(rng.choice([2, 6, 30]), grid), polyline(rng.choice([2, 6, 30]), grid)
        if rng.random() < 0.3:
            b[0], b[-1] = a[rng.randrange(len(a))], a[0]  # shared points
        monkeypatch.setattr(m, "_PAIRS_IN_PYTHON", 10**9)
        one_by_one = m.line_crossings(a, b)
        monkeypatch.setattr(m, "_PAIRS_IN_PYTHON", 0)
        assert m.line_crossings(a, b) == one_by_one, (a, b)
        found += bool(one_by_one)
    assert found > 100
