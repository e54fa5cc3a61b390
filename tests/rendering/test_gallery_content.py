"""Nothing in the gallery is blank: every row of every page (the whole zoo, and a diagram of the
new operations rearrange, reduce, repeat, select and slice) has its .pen line, its PyTorch, an
equation and a reading with a title and a sentence; every tensor, box and operation of every
figure has a label, every wire its legs; every image its size; every thumbnail its thick strokes."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from penrose.rendering.gallery import THUMB_STYLE, build_files, svg_size, thumbnail_svg
from penrose.rendering.testing import figure_structure

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

# a split or merge triangle and a junction dot are shapes, by design without text
UNLABELLED = {"junction", "split", "merge"}

NEW_OPS = """\
# index legend: t token, h head, d head width, hd heads and widths, k copy, e embedding, s short
# description: The new operations, one statement each.
dim t = 6, h = 2, d = 4, hd = 8, k = 3, e = 5, s = 4
input x[t, hd]
input z[t, e]
param W[e, hd]
a = rearrange(x, 't (h d) -> h t d')
b = reduce(x, 't (h d) -> h', 'max')
c = repeat(a, 'h t d -> h t k d')
p = rearrange(a, 'h t d -> t h d')
f = rearrange(a, 'h t d -> t (h d)')
g = select(z, t, 0)
u = slice(z, t, 1, k)
w = slice(z, t, 1, 4, into=s)
m = reduce(einsum('te,ef->tf', z, W), 't (h d) -> t h', 'mean')
output a, b, c, p, f, g, u, w, m
"""


@pytest.fixture(scope="module")
def zoo_files():
    """Every diagram of the zoo as the gallery shows it: the committed gallery/, read, not built
    again (test_gallery.py's test_committed_gallery_is_what_the_command_makes proves it is byte
    for byte what `penrose gallery` builds; a second cold build here cost each parallel test
    worker over a minute), with its real equation drawings."""
    folder = ROOT / "gallery"
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def new_ops_files(tmp_path_factory):
    path = tmp_path_factory.mktemp("ops") / "new_ops.pen"
    path.write_text(NEW_OPS)
    return build_files([path])  # with mathtext: each equation must draw


ROW = re.compile(r'<tr id="([^"]+)">(.*?)</tr>', re.S)


def _cell(row: str, pattern: str) -> str:
    m = re.search(pattern, row, re.S)
    return m.group(1) if m else ""


def blanks(files: dict) -> list:
    """Every blank thing of a built gallery, as sentences."""
    problems = []
    for name, data in sorted(files.items()):
        if not name.endswith(".html"):
            continue
        page = data.decode("utf-8")
        if "\x00" in page:
            problems.append(f"{name}: an image size was never filled in")
        for img in re.findall(r"<img\b[^>]*>", page):
            src = re.search(r'src="([^"]+)"', img).group(1)
            if not re.search(r'\balt="[^"]+"', img):
                problems.append(f"{name}: {src} has no alt text")
            if src.startswith("figures/") and not re.search(r'\bwidth="\d+" height="\d+"', img):
                problems.append(f"{name}: {src} has no width and height")
        for rid, row in ROW.findall(page):
            where = f"{name} row {rid}"
            pen = html.unescape(_cell(row, r'<pre class="pen">(.*?)</pre>'))
            if not pen.strip():
                problems.append(f"{where}: no .pen line")
            if not html.unescape(_cell(row, r'<pre class="torch">(.*?)</pre>')).strip():
                problems.append(f"{where}: no PyTorch ({pen})")
            eq = _cell(row, r'<td class="eq">(.*?)</td>')
            alt = html.unescape(_cell(eq, r'alt="([^"]*)"'))
            src = _cell(eq, r'src="([^"]+)"')
            if not alt.strip() or not src:
                problems.append(f"{where}: no equation ({pen})")
            elif src not in files or not files[src].strip():
                problems.append(f"{where}: the equation {alt!r} was not drawn")
            readings = re.findall(r"<p><b>(.*?)</b>(.*?)</p>", _cell(row, r'<td class="reading">(.*?)</td>'), re.S)
            if not readings:
                problems.append(f"{where}: no reading ({pen})")
            for title, text in readings:
                if not html.unescape(title).strip(" .") or not html.unescape(text).strip():
                    problems.append(f"{where}: a blank reading {title!r} {text!r} ({pen})")
    for name, data in sorted(files.items()):
        if not (name.startswith("figures/") and name.endswith(".svg")):
            continue
        s = figure_structure(data.decode("utf-8"))
        for n in s.nodes.values():
            if n.kind not in UNLABELLED and not n.text.strip():
                problems.append(f"{name}: the {n.kind or 'unknown'} node {n.id} has no label")
        for w in s.edges:
            # a folded figure writes its legs on a small 'leg' node in the middle of the wire
            on_wire = any(s.nodes[end].kind == "leg" and s.nodes[end].text.strip() for end in (w.tail, w.head) if end in s.nodes)
            if w.style in ("wire", "residual") and not w.legs and not on_wire:
                problems.append(f"{name}: the wire {w.tail} -> {w.head} has no legs")
    return problems


def test_nothing_in_the_zoo_gallery_is_blank(zoo_files):
    problems = blanks(zoo_files)
    assert problems == [], f"{len(problems)} blanks:\n" + "\n".join(problems[:40])
    # the zoo's Steerling layers use rearrange: their rows are among those checked
    pages = "".join(v.decode() for k, v in zoo_files.items() if k.endswith(".html"))
    assert "<pre class=\"pen\">q = rearrange(q, " in pages


def test_nothing_about_the_new_operations_is_blank(new_ops_files):
    problems = blanks(new_ops_files)
    assert problems == [], "\n".join(problems)
    page = new_ops_files["new_ops.html"].decode()
    rows = ROW.findall(page)
    assert len(rows) == 9
    for op in ("rearrange", "reduce", "repeat", "select", "slice"):
        assert any(f"= {op}(" in html.unescape(r) for _id, r in rows), op


def test_thumbnails_keep_their_strokes_and_every_figure_its_size(zoo_files):
    thumbs = [k for k in zoo_files if k.endswith("/thumb.svg")]
    assert thumbs and all(THUMB_STYLE in zoo_files[k].decode() for k in thumbs)
    assert thumbnail_svg(zoo_files[thumbs[0]]) == zoo_files[thumbs[0]]  # once only
    for k, v in zoo_files.items():
        if k.startswith("figures/"):
            w, h = svg_size(v)
            assert w > 10 and h > 10, k
    index = zoo_files["index.html"].decode()
    assert index.count('<span class="thumb"><img src="figures/') == index.count('<a class="card"')


def test_every_figure_of_a_page_is_a_zoomable_one_with_its_script(zoo_files):
    page = zoo_files["paper-steerling_listing.html"].decode()
    figures = re.findall(r'<figure class="full zoom">.*?</figure>', page, re.S)
    assert len(figures) == page.count("<figure") == 2  # the diagram and its contraction plan
    for f in figures:
        assert '<div class="zoom-view" tabindex="0"' in f
        assert [b for b in re.findall(r'data-zoom="([^"]+)"', f)] == ["out", "in", "fit", "1"]
        assert '<span class="zoom-controls" hidden>' in f  # shown by the script only
    scripts = re.findall(r"<script\b([^>]*)>", page)
    assert scripts == [""]  # one script, inline: nothing fetched
    assert "index.html" in zoo_files and "<script" not in zoo_files["index.html"].decode()


def test_figure_structure_of_an_svg_that_is_no_figure_is_a_value_error():
    """Regression: an SVG without penrose.render's top-level <g> failed with AttributeError on None."""
    with pytest.raises(ValueError, match="no top-level <g>"):
        figure_structure('<svg xmlns="http://www.w3.org/2000/svg"><rect/></svg>')
