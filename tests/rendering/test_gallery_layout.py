"""The gallery's layout in a real browser, 1280 px wide: every page of a freshly built gallery (the
whole zoo; with PENROSE_REDUCED=1 a few diagrams that cover the widest, the tallest, the
smallest figure and a page of blocks) is loaded in headless Chromium, and

- no figure runs past its box, its box past the page, or the page past the window: each figure is
  scaled down to its column's width (never up) with its aspect ratio kept;
- each figure has its pan and zoom controls, and they change the image's transform: the buttons
  on every page, and on the Steerling listing real input too (Ctrl + wheel, drag, keys, double
  click), with 'fit' and '1:1' resets;
- a narrower window refits them;
- without JavaScript the figure is the same fitted image in a scrollable box, the controls hidden;
- every thumbnail of the index is the whole figure fitted into its box (letterboxed, not cropped).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from penrose.rendering.browser import Chromium, chromium_binary
from penrose.rendering.gallery import build_files, write_tree

ROOT = Path(__file__).resolve().parents[2]
REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
WIDTH = 1280
TOL = 0.75  # CSS pixels: subpixel layout

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium_binary() is None, reason="Chromium is not installed"),
    pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed"),
]

SUBSET = ["paper/steerling_listing.pen", "paper/linear_model.pen", "paper/operations.pen", "steerling/steerling.pen"]
STEERLING_PAGE = "paper-steerling_listing.html"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("gallery")
    paths = [ROOT / "zoo" / p for p in SUBSET] if REDUCED else None  # None: every diagram of the zoo
    start = time.monotonic()
    write_tree(build_files(paths), out)
    print(f"gallery built in {time.monotonic() - start:.1f} s")
    return out


@pytest.fixture(scope="module")
def browser():
    with Chromium(width=WIDTH, height=900) as b:
        yield b


def pages(site) -> list:
    return sorted(p.name for p in site.glob("*.html") if p.name != "index.html")


# Everything measured in one go: the boxes of each figure, its image, its view; the page's width.
MEASURE = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const doc = document.documentElement;
  const figures = Array.from(document.querySelectorAll('figure.full')).map(f => {
    const view = f.querySelector('.zoom-view'), img = f.querySelector('img');
    const buttons = Array.from(f.querySelectorAll('.zoom-controls button'));
    return {src: img.getAttribute('src'), figure: box(f), view: view ? box(view) : null, img: box(img),
            natural: [img.naturalWidth, img.naturalHeight], size: [+img.getAttribute('width'), +img.getAttribute('height')],
            controls: buttons.map(b => b.getAttribute('data-zoom')),
            controlsShown: buttons.length > 0 && buttons.every(b => b.offsetParent !== null),
            tabindex: view ? view.tabIndex : null, overflow: view ? getComputedStyle(view).overflowX : null,
            transform: getComputedStyle(img).transform};
  });
  const cells = Array.from(document.querySelectorAll('td.fig img, td.eq img')).map(i => ({
    src: i.getAttribute('src'), img: box(i), cell: box(i.closest('td'))}));
  const tables = Array.from(document.querySelectorAll('table, pre')).map(t => ({tag: t.tagName, box: box(t)}));
  return {viewport: doc.clientWidth, scrollWidth: doc.scrollWidth, body: box(document.body),
          content: (() => { const s = getComputedStyle(document.body), r = document.body.getBoundingClientRect();
                            return [r.left + parseFloat(s.paddingLeft), r.right - parseFloat(s.paddingRight)]; })(),
          figures, cells, tables};
})()"""


def inside(inner, outer, tol=TOL) -> bool:
    return (inner[0] >= outer[0] - tol and inner[1] >= outer[1] - tol
            and inner[2] <= outer[2] + tol and inner[3] <= outer[3] + tol)


def check_fits(name: str, m: dict, scripted: bool = True, width: int = WIDTH) -> list:
    """What overflows on a page, as sentences (empty: nothing)."""
    problems = []
    vw = m["viewport"]
    if vw != width:
        problems.append(f"{name}: the window is {vw} px wide, not {width}")
    if m["scrollWidth"] > vw:
        problems.append(f"{name}: the page is {m['scrollWidth']} px wide, wider than the {vw} px window")
    left, right = m["content"]
    for f in m["figures"]:
        src = f["src"]
        if f["view"] is None:
            problems.append(f"{name}: {src} has no zoom view")
            continue
        if not inside(f["figure"], [left, -1e9, right, 1e9]) or f["figure"][2] > vw + TOL:
            problems.append(f"{name}: the figure box of {src} {f['figure']} runs past the column [{left}, {right}]")
        if not inside(f["view"], f["figure"]):
            problems.append(f"{name}: the view of {src} runs past its figure")
        if not inside(f["img"], f["view"]):
            problems.append(f"{name}: {src} {f['img']} overflows its view {f['view']}")
        if f["img"][2] > vw + TOL:
            problems.append(f"{name}: {src} runs past the window's right edge")
        nw, nh = f["size"]
        if not nw or not nh or (f["natural"][0] and abs(f["natural"][0] - nw) > 1):
            problems.append(f"{name}: {src} has no natural size or a wrong one: {f['size']} vs {f['natural']}")
            continue
        w, h = f["img"][2] - f["img"][0], f["img"][3] - f["img"][1]
        fit = min(nw, f["view"][2] - f["view"][0])
        if w > nw + TOL:
            problems.append(f"{name}: {src} is scaled up past its natural size ({w:.0f} > {nw} px)")
        if abs(w - fit) > 1.5:
            problems.append(f"{name}: {src} is {w:.0f} px wide, not fitted to its view ({fit:.0f} px)")
        if abs(h - w * nh / nw) > 1.5:
            problems.append(f"{name}: {src} lost its aspect ratio ({w:.0f}×{h:.0f}, natural {nw}×{nh})")
        if scripted:
            if f["controls"] != ["out", "in", "fit", "1"] or not f["controlsShown"]:
                problems.append(f"{name}: {src} lacks its zoom controls ({f['controls']}, shown: {f['controlsShown']})")
            if f["tabindex"] != 0:
                problems.append(f"{name}: the view of {src} cannot be reached with the keyboard")
        else:
            if f["controlsShown"]:
                problems.append(f"{name}: without JavaScript the zoom controls of {src} still show")
            if f["overflow"] != "auto":
                problems.append(f"{name}: without JavaScript {src} is not in a scrollable box")
    for c in m["cells"]:
        if not inside(c["img"], c["cell"]):
            problems.append(f"{name}: {c['src']} overflows its table cell")
    for t in m["tables"]:
        if t["box"][2] > right + TOL:
            problems.append(f"{name}: a <{t['tag'].lower()}> runs past the column ({t['box'][2]:.0f} > {right:.0f})")
    return problems


TRANSFORM = "getComputedStyle(document.querySelectorAll('figure.zoom img')[{i}]).transform"


def _matrix(css: str) -> tuple:
    """(scale, tx, ty) of a CSS matrix(a, b, c, d, e, f)."""
    if not css or css == "none":
        return (1.0, 0.0, 0.0)
    a, _b, _c, _d, e, f = (float(v) for v in css[css.index("(") + 1 : -1].split(","))
    return (a, e, f)


def test_every_page_fits_the_window_and_its_figures_zoom(site, browser):
    start = time.monotonic()
    problems = []
    names = pages(site)
    assert names, "the gallery has no pages"
    for name in names:
        report = browser.visit((site / name).as_uri())
        problems += [f"{name}: image did not load: {s}" for s in report.broken_images]
        problems += [f"{name}: console: {e}" for e in report.console_errors]
        problems += [f"{name}: reached the network: {u}" for u in report.remote_requests]
        m = browser.evaluate(MEASURE)
        assert m["figures"], f"{name} shows no figure"
        problems += check_fits(name, m)
        # every figure's buttons change its transform, and 'fit' brings it back
        for i, f in enumerate(m["figures"]):
            fitted = _matrix(browser.evaluate(TRANSFORM.format(i=i)))
            button = f"document.querySelectorAll('figure.zoom')[{i}].querySelector('button[data-zoom=\"{{}}\"]').click()"
            browser.evaluate(button.format("in"))
            zoomed = _matrix(browser.evaluate(TRANSFORM.format(i=i)))
            if not zoomed[0] > fitted[0] * 1.2:
                problems.append(f"{name}: '+' did not zoom {f['src']} in ({fitted} -> {zoomed})")
            browser.evaluate(button.format("1"))
            if abs(_matrix(browser.evaluate(TRANSFORM.format(i=i)))[0] - 1) > 1e-6:
                problems.append(f"{name}: '1:1' did not show {f['src']} at its natural size")
            browser.evaluate(button.format("fit"))
            if _matrix(browser.evaluate(TRANSFORM.format(i=i))) != fitted:
                problems.append(f"{name}: 'fit' did not restore {f['src']}")
        problems += check_fits(f"{name} (after zooming and fitting)", browser.evaluate(MEASURE))
    print(f"{len(names)} pages checked in {time.monotonic() - start:.1f} s")
    assert problems == [], "\n".join(problems[:40])


def _until(condition, timeout: float = 3.0) -> bool:
    """Poll `condition` (input reaches the page a frame or two after its command returns)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _view_center(browser, i=0) -> tuple:
    r = browser.evaluate(f"(() => {{ const v = document.querySelectorAll('figure.zoom .zoom-view')[{i}];"
                         " v.scrollIntoView({block: 'center'}); const r = v.getBoundingClientRect();"
                         " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    return r[0], r[1]


def test_real_input_pans_and_zooms_the_steerling_figure(site, browser):
    report = browser.visit((site / STEERLING_PAGE).as_uri())
    assert report.console_errors == []
    t = lambda: _matrix(browser.evaluate(TRANSFORM.format(i=0)))  # noqa: E731
    fit = t()
    assert 0.1 < fit[0] < 0.5 and fit[1:] == (0.0, 0.0)  # the 4,000 px figure, fitted into 1,200 px
    x, y = _view_center(browser)
    scrolled = browser.evaluate("scrollY")
    browser.wheel(x, y, 240)  # a plain wheel leaves the figure alone: it scrolls the page
    assert _until(lambda: browser.evaluate("scrollY") != scrolled), "the wheel did not scroll the page"
    assert t() == fit
    x, y = _view_center(browser)
    left, top = browser.evaluate("(() => { const r = document.querySelector('figure.zoom .zoom-view')"
                                 ".getBoundingClientRect(); return [r.left, r.top]; })()")
    browser.wheel(x + 100, y, -240, ctrl=True)  # Ctrl + wheel (and a pinch) zooms in about the pointer
    assert _until(lambda: t() != fit), "Ctrl + wheel did not zoom"
    zoomed = t()
    assert zoomed[0] > fit[0] * 1.3
    # the point of the figure under the pointer stays under it
    px, py = x + 100 - left, y - top
    assert abs((px - fit[1]) / fit[0] - (px - zoomed[1]) / zoomed[0]) < 1
    assert abs((py - fit[2]) / fit[0] - (py - zoomed[2]) / zoomed[0]) < 1
    browser.drag((x, y), (x - 150, y - 40))  # drag to pan
    panned = t()
    assert panned[0] == zoomed[0] and abs(panned[1] - (zoomed[1] - 150)) < 1 and panned[2] < zoomed[2]
    assert browser.evaluate("document.activeElement.classList.contains('zoom-view')")  # it took the focus
    browser.key("ArrowRight")  # the keyboard: arrows pan once zoomed in
    assert abs(t()[1] - (panned[1] - 40)) < 1
    browser.key("0")
    assert t() == fit
    browser.key("+")
    assert t()[0] > fit[0] * 1.4
    browser.key("-")
    assert abs(t()[0] - fit[0]) < 1e-6
    browser.key("1")
    assert t()[0] == 1.0
    assert browser.evaluate("document.querySelector('figure.zoom .zoom-level').textContent") == "100%"
    browser.click(x, y, clicks=2)  # double-click: back to fit
    assert t() == fit
    # and nothing overflows after all that
    assert check_fits(STEERLING_PAGE, browser.evaluate(MEASURE)) == []


def test_a_narrower_window_refits_the_figures(site, browser):
    browser.visit((site / STEERLING_PAGE).as_uri())
    wide = _matrix(browser.evaluate(TRANSFORM.format(i=0)))
    browser.resize(900, 900)
    try:
        assert _until(lambda: _matrix(browser.evaluate(TRANSFORM.format(i=0)))[0] < wide[0] * 0.9)
        problems = check_fits(f"{STEERLING_PAGE} at 900 px", browser.evaluate(MEASURE), width=900)
    finally:
        browser.resize()
    assert problems == [], "\n".join(problems)
    assert _until(lambda: _matrix(browser.evaluate(TRANSFORM.format(i=0))) == wide)  # and back


def test_without_javascript_the_figure_is_fitted_and_scrollable(site, browser):
    browser.scripts(False)
    try:
        problems = []
        for name in (STEERLING_PAGE, "paper-linear_model.html"):
            browser.visit((site / name).as_uri())
            problems += check_fits(f"{name} (no JavaScript)", browser.evaluate(MEASURE), scripted=False)
    finally:
        browser.scripts(True)
    assert problems == [], "\n".join(problems)


THUMBS = """(() => Array.from(document.querySelectorAll('a.card')).map(card => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const img = card.querySelector('.thumb img');
  return {href: card.getAttribute('href'), card: box(card), box: box(card.querySelector('.thumb')), img: box(img),
          natural: [img.naturalWidth, img.naturalHeight], complete: img.complete};
}))()"""


def test_index_thumbnails_show_the_whole_figure_in_their_boxes(site, browser):
    report = browser.visit((site / "index.html").as_uri())
    assert report.broken_images == [] and report.console_errors == []
    m = browser.evaluate(MEASURE)
    assert m["scrollWidth"] <= m["viewport"] == WIDTH
    cards = browser.evaluate(THUMBS)
    assert {c["href"] for c in cards} == set(pages(site))
    problems = []
    for c in cards:
        (nw, nh), img, box = c["natural"], c["img"], c["box"]
        if not (c["complete"] and nw and nh):
            problems.append(f"{c['href']}: its thumbnail did not load")
            continue
        w, h, bw, bh = img[2] - img[0], img[3] - img[1], box[2] - box[0], box[3] - box[1]
        if not inside(img, box):
            problems.append(f"{c['href']}: the thumbnail {img} runs out of its box {box}")
        if not inside(box, c["card"]) or c["card"][2] > WIDTH:
            problems.append(f"{c['href']}: the thumbnail box runs out of its card or the window")
        if abs(h - w * nh / nw) > 1.5:
            problems.append(f"{c['href']}: the thumbnail is cropped or stretched ({w:.0f}×{h:.0f}, natural {nw}×{nh})")
        # fitted: as large as the box allows (a wide figure fills the width, letterboxed above and below)
        scale = min(bw / nw, bh / nh, 1.0)
        if abs(w - nw * scale) > 1.5:
            problems.append(f"{c['href']}: the thumbnail is {w:.0f} px wide, not fitted to its {bw:.0f}×{bh:.0f} box")
        if min(w, h) < 24:
            problems.append(f"{c['href']}: the thumbnail is a sliver ({w:.0f}×{h:.0f})")
    assert problems == [], "\n".join(problems)
    wide = next(c for c in cards if c["href"] == STEERLING_PAGE)
    w, h = wide["img"][2] - wide["img"][0], wide["img"][3] - wide["img"][1]
    assert abs(w - (wide["box"][2] - wide["box"][0])) < 1.5 and h < (wide["box"][3] - wide["box"][1]) - 20  # letterboxed
