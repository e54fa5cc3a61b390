"""The gallery: a static site of every diagram, with the paper's "Rosetta stone" for each.

    penrose gallery -o gallery/        # every .pen under zoo/
    penrose gallery zoo/paper -o out/  # some folders or files

Layout of the output folder (all links relative, no network; the one script, inline in each
diagram page, only pans and zooms its figures, and the pages work without it):

    index.html                 every diagram: thumbnail, parameter count, one-line description
    <slug>.html                one page per diagram: the figure, then for each statement its
                               diagram, PyTorch line, equation and reading side by side, then
                               blocks, the generated module's source and the contraction plan
    style.css
    figures/<slug>.svg         the whole figure (also the thumbnail)
    figures/<slug>/…           statement, block and plan figures
    equations/<hash>.svg       equations, named by a hash of their LaTeX (shared across pages)

The pieces of a page that `penrose serve` shows too are public: `statement_code` (each
statement's lines of generated PyTorch), `rosetta_table` (a body's Rosetta-stone rows),
`plain_return` (a block's bare `return x`, which gets no row) and `fill_sizes` (figure sizes put
into the page).

The output is byte-deterministic: no dates, no absolute paths, ids derived from content. A
rebuild removes files it no longer produces (only in figures/, equations/ and the pages it
wrote before), so the committed gallery is exactly what the command makes.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from penrose import ir
from penrose.errors import PenroseError, PenroseRenderError, Span
from penrose.views import legend as index_legend
from penrose.views import statements

if TYPE_CHECKING:
    from penrose.checked import Checked

GENERATOR = '<meta name="generator" content="penrose gallery">'


@dataclass
class Entry:
    """One diagram of the gallery."""

    path: Path
    display: str  # the path shown on pages (relative to the zoo's parent)
    slug: str
    group: str
    checked: Checked | None = None  # None: a file of blocks (no figure of its own)
    description: str = ""
    error: str = ""
    dots: dict = field(default_factory=dict)  # relative path -> a figure (penrose.rendering.figure.Figure)


# ---- finding diagrams --------------------------------------------------------------------------


def zoo_root() -> Path:
    """The zoo folder: the repository's zoo/ next to the penrose package, else the installed one."""
    here = Path(__file__).resolve().parents[2] / "zoo"
    if here.is_dir():
        return here
    import importlib.util

    spec = importlib.util.find_spec("penrose_zoo")  # finds the installed folder, imports nothing
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    raise PenroseRenderError("cannot find the zoo/ folder; pass the diagrams to draw", Span())


def find_diagrams(paths=None) -> list[tuple[Path, str]]:
    """(path, display path) for every .pen file under `paths` (default: the zoo), sorted."""
    if not paths:
        root = zoo_root()
        files: list[tuple[Path, Path | None]] = [(f, root.parent) for f in sorted(root.rglob("*.pen"))]
    else:
        files = []
        for p in paths:
            p = Path(p)
            if p.is_dir():  # shown as folder/sub/file.pen
                files.extend((f, p.resolve().parent) for f in sorted(p.rglob("*.pen")))
            elif p.is_file():
                files.append((p, None))
            else:
                raise PenroseRenderError(f"no such diagram or folder: {p}", Span(str(p)))
    out = []
    seen = set()
    for f, base in files:
        rf = f.resolve()
        if rf in seen:
            continue
        seen.add(rf)
        try:
            display = rf.relative_to(base.resolve() if base is not None else Path.cwd().resolve()).as_posix()
        except ValueError:
            display = f.name
        out.append((f, display))
    return sorted(out, key=lambda x: x[1])


def describe(source: str) -> str:
    """A diagram's one-line description: a '# description:' comment, else its first comment line
    that is neither the index legend (nor its continuation) nor a numbered step caption.

    >>> describe("# index legend: t token\\n#   e embedding\\n# Self-attention, one head.\\ndim t = 2\\n")
    'Self-attention, one head.'
    """
    lines = source.splitlines()
    for line in lines:
        m = re.match(r"\s*#\s*description:\s*(.*)", line, re.IGNORECASE)
        if m:
            return m.group(1).strip()
    in_legend = False
    para: list[str] = []
    for line in lines:
        s = line.strip()
        if not s.startswith("#"):
            if s or para:
                break  # only the leading comment block describes the diagram
            continue
        body = s[1:]
        text = body.strip()
        if text.lower().startswith("index legend:"):
            in_legend = True
            continue
        if in_legend and body.startswith("  "):
            continue
        in_legend = False
        if re.match(r"\d+\)", text):
            break
        if not text:
            if para:
                break
            continue
        para.append(text)
        if re.search(r"[.!?]$", text):
            break
    return _first_sentence(" ".join(para))


def _first_sentence(text: str) -> str:
    m = re.match(r"(.+?(?<!e\.g)(?<!i\.e)(?<!\bcf)[.!?])(\s+(?=[A-Z(])|$)", text)
    return (m.group(1) if m else text).strip()


def _slug(display: str) -> str:
    """'zoo/paper/mlp.pen' -> 'paper-mlp' (the top folder dropped)."""
    stem = display[:-4] if display.endswith(".pen") else display
    stem = stem.split("/", 1)[1] if "/" in stem else stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem.replace("/", "-")).strip("-") or "diagram"


# ---- building ----------------------------------------------------------------------------------


def build_gallery(paths=None, out_dir="gallery") -> str:
    """Write the gallery of `paths` (default: every .pen under zoo/) to `out_dir`; returns out_dir.

    >>> build_gallery(["zoo/paper/linear_model.pen"], "/tmp/penrose-gallery")  # doctest: +SKIP
    '/tmp/penrose-gallery'
    """
    from penrose.rendering.equations import latex_to_svg

    files = build_files(paths, equation_svg=latex_to_svg)
    write_tree(files, out_dir)
    return str(out_dir)


def build_files(paths=None, equation_svg=None) -> dict:
    """Every file of the gallery: relative path -> bytes. `equation_svg(latex)` draws equations."""
    if equation_svg is None:
        from penrose.rendering.equations import latex_to_svg as equation_svg
    entries = []
    slugs: dict = {}
    for path, display in find_diagrams(paths):
        slug = _slug(display)
        if slug in slugs:
            slug = f"{slug}-{len(slugs)}"
        slugs[slug] = display
        group = display.split("/")[-2] if "/" in display else "diagrams"
        entries.append(Entry(path, display, slug, group))
    out: dict = {"style.css": STYLE.encode("utf-8")}
    equations: dict = {}
    dots: dict = {}
    pages: dict = {}
    for e in entries:
        _load(e)
        if e.checked is None:  # a file of blocks for others to include: no figure of its own
            continue
        pages[f"{e.slug}.html"] = _page(e, equations)
        dots.update(e.dots)
    names = sorted(dots)
    out.update(zip(names, lay_out([dots[n] for n in names])))
    for name in names:
        if name.endswith("/thumb.svg"):
            out[name] = thumbnail_svg(out[name])
    for latex, svg in zip(equations, _draw_all(list(equations), equation_svg)):
        if svg is not None:
            out[f"equations/{equations[latex]}"] = svg.encode("utf-8") if isinstance(svg, str) else svg
    pages["index.html"] = _index(entries)
    for name, text in pages.items():  # figures are laid out now: give every <img> its size
        out[name] = fill_sizes(text, out).encode("utf-8")
    return out


def lay_out(figs: list) -> list:
    """SVG bytes of many figures, laid out in batches (`run_dot_many`); a figure whose layout
    crosses wires, or runs one through a label, is laid out again in the order that does so
    least (`figure.to_dot`'s untangling: only those pay for the extra layouts)."""
    from penrose.rendering.figure import to_dot
    from penrose.rendering.graphviz import run_dot_many
    from penrose.rendering.measure import svg_tangles

    svgs = run_dot_many([to_dot(f, untangle=False) for f in figs])
    again = [i for i, f in enumerate(figs) if f.untangle and svg_tangles(svgs[i])]
    for i, svg in zip(again, run_dot_many([to_dot(figs[i]) for i in again]) if again else []):
        svgs[i] = svg
    return svgs


# ---- figure sizes and thumbnails ---------------------------------------------------------------

_SIZE_MARK = re.compile(r"\x00size:([^\x00]+)\x00")


def _size_mark(path: str) -> str:
    """A placeholder for an <img>'s width and height, filled in once `path` is laid out."""
    return f"\x00size:{path}\x00"


def svg_size(svg) -> tuple | None:
    """(width, height) in CSS pixels of an SVG that Graphviz wrote (its sizes are in points).

    >>> svg_size(b'<svg width="3173pt" height="640pt" viewBox="0 0 3173 640">')
    (4231, 853)
    """
    text = svg.decode("utf-8", "replace") if isinstance(svg, bytes) else svg
    m = re.search(r"<svg\b[^>]*?\swidth=\"([\d.]+)(pt|px)?\"[^>]*?\sheight=\"([\d.]+)(pt|px)?\"", text[:4000])
    if not m:
        return None
    scale = 4 / 3 if m.group(2) == "pt" else 1  # graphviz writes points; 1 pt = 4/3 px
    return max(1, round(float(m.group(1)) * scale)), max(1, round(float(m.group(3)) * scale))


def fill_sizes(text: str, files: dict) -> str:
    def size(m):
        wh = svg_size(files.get(m.group(1), b""))
        return f' width="{wh[0]}" height="{wh[1]}"' if wh else ""

    return _SIZE_MARK.sub(size, text)


THUMB_STYLE = (
    "<style>/* penrose gallery thumbnail: strokes keep their width on screen when the figure is "
    "scaled down */ path, polygon, polyline, ellipse, line { vector-effect: non-scaling-stroke; }</style>"
)


def thumbnail_svg(svg: bytes) -> bytes:
    """A figure for the index: the whole figure, its strokes drawn at their width in screen pixels
    however far it is scaled down, so a wide figure squeezed into its card keeps its wires."""
    text = svg.decode("utf-8")
    m = re.search(r"<svg\b[^>]*>", text)
    if not m or THUMB_STYLE in text:
        return svg
    return (text[: m.end()] + "\n" + THUMB_STYLE + text[m.end() :]).encode("utf-8")


def _draw_one(args):
    draw, latex = args
    try:
        return draw(latex)
    except ValueError:  # mathtext cannot draw it: the page shows the LaTeX as the image's text
        return None


def _draw_all(latex: list, draw) -> list:
    """Draw equations, on every core when there are many (mathtext parsing is slow)."""
    import multiprocessing
    import pickle

    workers = min(os.cpu_count() or 1, 8)
    try:
        pickle.dumps(draw)
        parallel = workers > 1 and len(latex) > 16 and "fork" in multiprocessing.get_all_start_methods()
    except Exception:  # a lambda (tests): draw here
        parallel = False
    if not parallel:
        return [_draw_one((draw, x)) for x in latex]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_draw_one, [(draw, x) for x in latex], chunksize=8))


def stale_files(folder, paths=None, redraw: int = 3) -> list:
    """What differs between `folder` and a fresh build of `paths`: [] when the gallery is current.

    Pages, figures and the stylesheet are rebuilt and compared byte for byte. Equations are named
    by a hash of their LaTeX, so their files are compared by name, and `redraw` of them are drawn
    again with mathtext and compared byte for byte (drawing every equation takes half a minute).
    """
    import html as _html

    from penrose.rendering.equations import latex_to_svg

    folder = Path(folder)
    if not (folder / "index.html").is_file():
        return [f"{folder}/index.html is missing"]
    drawn: list[str] = []

    def equation_svg(latex: str) -> bytes:  # records what would be drawn, draws nothing
        drawn.append(latex)
        return b""

    fresh = build_files(paths, equation_svg=equation_svg)
    have = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    problems = [f"missing {k}" for k in sorted(set(fresh) - set(have))]
    problems += [f"extra {k}" for k in sorted(set(have) - set(fresh)) if not k.startswith(".")]
    for k in sorted(set(fresh) & set(have)):
        if not k.startswith("equations/") and have[k].read_bytes() != fresh[k]:
            problems.append(f"changed {k}")
    for latex in sorted(set(drawn))[:: max(1, len(set(drawn)) // max(1, redraw))][:redraw]:
        name = f"equations/{equation_file(latex)}"
        if name in have and have[name].read_text(encoding="utf-8") != latex_to_svg(latex):
            problems.append(f"changed {name} ({_html.escape(latex)})")
    return problems


def equation_file(latex: str) -> str:
    return "eq-" + hashlib.sha1(latex.encode("utf-8")).hexdigest()[:16] + ".svg"


def write_tree(files: dict, out_dir) -> None:
    """Write `files` under out_dir (atomically, skipping unchanged files) and remove stale ones."""
    from penrose.io import atomic_write_bytes
    from penrose.rendering import readable

    root = Path(out_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PenroseRenderError(f"cannot create {root}: {e.strerror or e}", Span(str(root))) from None
    for rel, data in sorted(files.items()):
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and target.read_bytes() == data:
            continue
        try:
            atomic_write_bytes(target, data)
        except PenroseError as e:
            raise PenroseRenderError(e.message, e.span) from None
        readable(target)
    wanted = {(root / rel).resolve() for rel in files}
    for sub in ("figures", "equations"):
        folder = root / sub
        if folder.is_dir():
            for f in sorted(folder.rglob("*"), reverse=True):
                if f.is_file() and f.resolve() not in wanted:
                    f.unlink()
                elif f.is_dir() and not any(f.iterdir()):
                    f.rmdir()
    for f in sorted(root.glob("*.html")):
        if f.resolve() not in wanted and GENERATOR in f.read_text(encoding="utf-8", errors="replace")[:2000]:
            f.unlink()


def _load(e: Entry):
    from penrose.loader import load_entries
    from penrose.parser import parse

    try:
        source = e.path.read_text(encoding="utf-8")
    except OSError as err:
        raise PenroseRenderError(f"cannot read {e.path}: {err.strerror or err}", Span(str(e.path))) from None
    e.description = describe(source)
    diagram = parse(source, file=str(e.path))  # includes resolve next to the file
    if not any(isinstance(st, ir.Output) for st in diagram.body):
        return  # only blocks and dims: a library that other diagrams include
    e.checked = load_entries(diagram)[0]  # the one loader, quiet: its includes read, then checked
    # pages and reports show the display path, never an absolute one
    e.checked.diagram = ir.Diagram(e.checked.diagram.body, file=e.display, source=source)


# ---- pages -------------------------------------------------------------------------------------


def _dot(checked, view="diagram", **kw):
    """A figure to draw; the gallery lays them all out at the end, in batches (`lay_out`)."""
    from penrose.rendering.figure import Options, build_figure

    return build_figure(checked, view, Options(**kw))


def _page(e: Entry, equations: dict) -> str:
    from penrose.compiler import generate_source
    from penrose.fmt import format_stmt
    from penrose.rendering.explain import statement_latex, statement_readings
    from penrose.report import plan_report

    c = e.checked
    assert c is not None, "pages are made for the entries that checked"
    slug = e.slug
    e.dots[f"figures/{slug}.svg"] = _dot(c)
    e.dots[f"figures/{slug}/thumb.svg"] = _dot(c, header=False)
    e.dots[f"figures/{slug}/plan.svg"] = _dot(c, show_plan=True, show_sizes=True)
    try:
        source, source_map = generate_source(c, with_map=True)
    except PenroseError as err:
        source, source_map = f"# cannot compile for the default sizes: {err.message}\n", []
    torch_code = statement_code(c, source, source_map)
    plan = plan_report(c).splitlines()
    plan[0] = plan[0].replace(c.diagram.file, e.display)
    legend = index_legend(c.diagram)

    parts = [_head(c.name, depth=0)]
    parts.append('<p class="crumbs"><a href="index.html">← all diagrams</a></p>')
    parts.append(f"<h1>{html.escape(c.name)}</h1>")
    if e.description:
        parts.append(f'<p class="lead">{html.escape(e.description)}</p>')
    parts.append(
        f'<p class="meta"><code>{html.escape(e.display)}</code> · {c.param_count():,} parameters · '
        f"{len(c.inputs)} input(s) · outputs {html.escape(', '.join(n + '[' + ', '.join(t.legs) + ']' for n, t in c.outputs))}</p>"
    )
    parts.append(_zoom_figure(f"figures/{slug}.svg", f"Penrose diagram of {c.name}"))
    if legend:
        rows = "".join(f"<tr><td><i>{html.escape(k)}</i></td><td>{html.escape(v)}</td><td>{_size(c, k)}</td></tr>" for k, v in legend.items())
        parts.append(f'<h2>Legs</h2><table class="legend"><tr><th>leg</th><th>meaning</th><th>size</th></tr>{rows}</table>')

    parts.append("<h2>Rosetta stone</h2>")
    parts.append('<p class="note">For every statement: its diagram, its line of PyTorch, its equation and its geometric reading.</p>')
    parts.append(rosetta_table(e, c, c, statements(c), torch_code, equations, f"figures/{slug}/s", "statement", format_stmt,
                          statement_latex, statement_readings))
    for name, blk in c.blocks.items():
        bslug = re.sub(r"[^A-Za-z0-9_]", "_", name)
        e.dots[f"figures/{slug}/block-{bslug}.svg"] = _dot(c, view=f"block:{name}")
        parts.append(f'<h2 id="block-{html.escape(bslug)}">Block <code>{html.escape(name)}</code></h2>')
        parts.append(_zoom_figure(f"figures/{slug}/block-{bslug}.svg", f"block {name}"))
        stmts = [s for s in statements(blk) if not plain_return(s)]
        parts.append(rosetta_table(e, c, blk, stmts, torch_code, equations, f"figures/{slug}/{bslug}-s", f"block:{name}:statement",
                              format_stmt, statement_latex, statement_readings))
    parts.append("<h2>Generated PyTorch module</h2>")
    parts.append(f'<pre class="source">{html.escape(source)}</pre>')
    parts.append("<h2>Contraction plan</h2>")
    parts.append('<p class="note">Each wire carries its size; each contraction its number and FLOPs (one batch element).</p>')
    parts.append(_zoom_figure(f"figures/{slug}/plan.svg", f"contraction plan of {c.name}"))
    parts.append(f'<pre class="plan">{html.escape(chr(10).join(plan))}</pre>')
    parts.append(f"<script>{ZOOM_SCRIPT}</script>")
    parts.append(_foot())
    return "\n".join(parts)


def _zoom_figure(src: str, alt: str) -> str:
    """A figure that fits its column: scaled down to the column's width (never up), panned and
    zoomed by the page's script; without the script, the fitted image in a scrollable box."""
    a = html.escape(alt)
    return (
        f'<figure class="full zoom"><div class="zoom-view" tabindex="0" aria-label="{a}: drag to pan, '
        f'+ and \u2212 to zoom, 0 to fit, 1 for full size">'
        f'<img src="{src}"{_size_mark(src)} alt="{a}"></div>'
        '<figcaption class="zoom-bar"><span class="zoom-controls" hidden>'
        '<button type="button" data-zoom="out" aria-label="zoom out" title="zoom out (\u2212)">\u2212</button>'
        '<button type="button" data-zoom="in" aria-label="zoom in" title="zoom in (+)">+</button>'
        '<button type="button" data-zoom="fit" title="fit to the page width (0)">fit</button>'
        '<button type="button" data-zoom="1" title="full size (1)">1:1</button>'
        '<output class="zoom-level" aria-live="polite"></output>'
        '<span class="zoom-hint">drag to pan · Ctrl + wheel or pinch to zoom</span></span>'
        f'<a class="zoom-open" href="{src}">open the SVG</a></figcaption></figure>'
    )


def _size(c, leg) -> str:
    cls = c.dims.get(leg)
    n = c.size(cls) if cls is not None else None
    return "" if n is None else str(n)


def plain_return(s) -> bool:
    return isinstance(s.stmt, ir.Return) and all(v.op == "ref" for v in s.value.args)


def rosetta_table(e, c, body, stmts, torch_code, equations, fig_prefix, view_kind, format_stmt, statement_latex, statement_readings) -> str:
    all_stmts = statements(body)
    called = any(torch_code.get(s.stmt.span) for s in stmts)  # an included block nobody calls has none
    rows = []
    step = None
    for s in stmts:
        n = all_stmts.index(s) + 1
        if s.step is not None and s.step != step and s.step in body.captions:
            step = s.step
            rows.append(f'<tr class="step"><td colspan="5">{html.escape(body.captions[step])}</td></tr>')
        fig = f"{fig_prefix}{n:02d}.svg"
        if body is c:
            e.dots[fig] = _dot(c, f"statement:{n}", header=False)
        else:
            e.dots[fig] = _block_statement_figure(c, body, s, n)
        try:
            latex = statement_latex(c, s)
        except PenroseError:  # nested too deep to print: show the code only
            latex = ""
        eq_html = ""
        if latex:
            name = equation_file(latex)
            equations[latex] = name
            eq_html = f'<img class="eq" src="equations/{name}" alt="{html.escape(latex)}" title="{html.escape(latex)}">'
        readings = statement_readings(c, s, body)
        rtext = "".join(f"<p><b>{html.escape(r.title)}.</b> {html.escape(r.text)}</p>" for r in readings)
        code = format_stmt(s.stmt)
        torch = torch_code.get(s.stmt.span, "") or (
            "# no PyTorch of its own (folded into its neighbours)" if called else
            "# not called by this diagram: the compiler generates no code for it")
        rows.append(
            f'<tr id="{html.escape(view_kind.replace(":", "-"))}-{n}"><td class="n">{n}</td>'
            f'<td class="fig"><img src="{fig}"{_size_mark(fig)} alt="diagram of statement {n}"></td>'
            f'<td class="code"><pre class="pen">{html.escape(code)}</pre><pre class="torch">{html.escape(torch)}</pre></td>'
            f'<td class="eq">{eq_html}</td><td class="reading">{rtext}</td></tr>'
        )
    head = "<tr><th>#</th><th>diagram</th><th>.pen / PyTorch</th><th>equation</th><th>reading</th></tr>"
    return f'<table class="rosetta">{head}{"".join(rows)}</table>'


def _block_statement_figure(c, body, s, n):
    from penrose.rendering.figure import Figure, Options, _Builder, _stmt_title

    fig = Figure(_stmt_title(s, n), "LR", index_legend(c.diagram), header="none", untangle=True)
    b = _Builder(c, Options(), fig)
    b.draw_statement(body, s)
    return fig


def statement_code(c, source: str, source_map: list) -> dict:
    """{statement span: its lines of the generated PyTorch}, as the compiler's source map pairs
    them (`generate_source(..., with_map=True)`), every line the statement produced: the
    temporaries of a deep expression, each narrowed piece of a split.

    An assignment's code opens with the statement itself as a comment, which the row shows
    already above it; a statement the compiler fuses into a later attention call has nothing
    else, and says so."""
    import textwrap

    from penrose.fuse import find_attention

    fused = {a.stmt.span for body in (c, *c.blocks.values()) for att in find_attention(body).values() for a in att.absorbed}
    lines = source.splitlines()
    out = {}
    for _cls, span, first, last in source_map:
        code = lines[first - 1 : last]
        if code and code[0].lstrip().startswith("#"):
            code = code[1:]  # the statement, as the diagram writes it (a long one goes on, indented)
            while code and code[0].lstrip().startswith("#   "):
                code = code[1:]
        out[span] = "# fused below" if span in fused and not code else textwrap.dedent("\n".join(code))
    return out


def _index(entries) -> str:
    parts = [_head("Penrose diagram gallery", depth=0)]
    parts.append("<h1>Penrose diagram gallery</h1>")
    parts.append(
        '<p class="lead">Every diagram of the zoo, drawn from its <code>.pen</code> file: the paper’s '
        "transcriptions and the zoo’s models. Each page shows the figure, then each statement as diagram, "
        "PyTorch, equation and geometric reading, then the generated module and its contraction plan.</p>"
    )
    groups: dict = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    titles = {"paper": "Paper transcriptions", "zoo": "Zoo models", "steerling": "Steerling-8B"}
    order = {"paper": 0, "zoo": 1}
    for group in sorted(groups, key=lambda g: (order.get(g, 2), g)):
        parts.append(f"<h2>{html.escape(titles.get(group, group))}</h2>")
        parts.append('<div class="cards">')
        for e in groups[group]:
            if e.checked is None:
                continue
            c = e.checked
            parts.append(
                f'<a class="card" href="{e.slug}.html"><span class="thumb">'
                f'<img src="figures/{e.slug}/thumb.svg"{_size_mark(f"figures/{e.slug}/thumb.svg")} alt="{html.escape(c.name)}"></span>'
                f'<span class="name">{html.escape(c.name)}</span>'
                f'<span class="params">{c.param_count():,} parameters</span>'
                f'<span class="desc">{html.escape(e.description)}</span></a>'
            )
        parts.append("</div>")
    parts.append(_foot())
    return "\n".join(parts)


def _head(title: str, depth: int) -> str:
    up = "../" * depth
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"{GENERATOR}\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<link rel=\"stylesheet\" href=\"{up}style.css\">\n</head>\n<body>"
    )


def _foot() -> str:
    return '<footer>Generated by <code>penrose gallery</code> from the diagrams’ <code>.pen</code> files.</footer>\n</body>\n</html>\n'


STYLE = """\
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 1.5rem 2rem 3rem; color: #222; background: #fff; line-height: 1.45; }
h1 { margin: .2rem 0 .4rem; font-size: 1.8rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; font-size: 1.3rem; }
a { color: #1d4e89; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .85rem; }
.lead { font-size: 1.05rem; color: #333; max-width: 60rem; }
.meta, .note, .crumbs { color: #555; font-size: .9rem; }
figure.full { margin: 1rem 0; border: 1px solid #eee; padding: .5rem; max-width: 100%; box-sizing: border-box; }
.zoom-view { overflow: auto; max-width: 100%; }
.zoom-view img { display: block; max-width: 100%; height: auto; }
.zoom-view:focus-visible { outline: 2px solid #1d4e89; outline-offset: 2px; }
.zoom-bar { display: flex; flex-wrap: wrap; align-items: center; gap: .4rem; margin-top: .35rem; font-size: .8rem; color: #666; }
.zoom-controls { display: inline-flex; flex-wrap: wrap; align-items: center; gap: .3rem; }
.zoom-controls[hidden] { display: none; }
.zoom-controls button { font: inherit; font-size: .85rem; min-width: 2rem; padding: .1rem .45rem; color: #222;
                        border: 1px solid #bbb; border-radius: 4px; background: #fafafa; cursor: pointer; }
.zoom-controls button:hover { border-color: #1d4e89; }
.zoom-controls button:focus-visible { outline: 2px solid #1d4e89; outline-offset: 1px; }
.zoom-level { min-width: 3rem; text-align: right; font-variant-numeric: tabular-nums; }
.zoom-open { margin-left: auto; }
figure.zoom.js .zoom-view { position: relative; overflow: hidden; touch-action: pan-y; cursor: grab; }
figure.zoom.js.zoomed .zoom-view { touch-action: none; }
figure.zoom.js .zoom-view.dragging { cursor: grabbing; }
figure.zoom.js .zoom-view img { position: absolute; left: 0; top: 0; max-width: none; transform-origin: 0 0;
                                user-select: none; -webkit-user-drag: none; }
table { border-collapse: collapse; }
table.legend td, table.legend th { padding: .15rem .8rem .15rem 0; text-align: left; font-size: .9rem; }
table.rosetta { width: 100%; margin-top: .5rem; }
table.rosetta th { text-align: left; font-size: .85rem; color: #555; border-bottom: 2px solid #ccc; padding: .3rem; }
table.rosetta td { vertical-align: top; border-bottom: 1px solid #eee; padding: .5rem .4rem; }
table.rosetta tr.step td { background: #fbf3ea; color: #8a3b12; font-weight: 600; font-size: .9rem; }
td.n { color: #888; width: 1.5rem; }
td.fig img { max-width: 340px; height: auto; }
td.code pre { margin: 0 0 .3rem; white-space: pre-wrap; word-break: break-word; }
pre.pen { color: #222; } pre.torch { color: #1d4e89; }
td.eq img { max-width: 300px; height: auto; }
td.reading { font-size: .88rem; max-width: 22rem; } td.reading p { margin: 0 0 .35rem; }
pre.source, pre.plan { background: #f7f7f7; border: 1px solid #e4e4e4; padding: .8rem; overflow-x: auto; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 1rem; }
.card { display: flex; flex-direction: column; border: 1px solid #ddd; border-radius: 6px; padding: .6rem;
        text-decoration: none; color: inherit; background: #fff; }
.card:hover { border-color: #1d4e89; box-shadow: 0 1px 6px rgba(0,0,0,.08); }
.card .thumb { display: flex; align-items: center; justify-content: center; height: 160px; overflow: hidden;
               background: #f3f4f6; border-radius: 3px; }
.card .thumb img { display: block; width: auto; height: auto; max-width: 100%; max-height: 100%; min-width: 0;
                   min-height: 0; background: #fff; }
.card .name { font-weight: 600; margin-top: .4rem; }
.card .params { color: #666; font-size: .85rem; }
.card .desc { font-size: .88rem; color: #333; margin-top: .2rem; }
footer { margin-top: 3rem; color: #888; font-size: .8rem; }
"""

# The page's one script: pan and zoom for every figure.zoom (no libraries, nothing fetched). It
# lays each figure's image out at its natural size and scales it with a CSS transform: 'fit'
# (the start) is the column's width, never above 1:1; + / − buttons and keys, Ctrl + wheel or
# pinch zoom about the pointer; a drag, or the arrow keys once zoomed in, pans; double-click
# toggles fit and 1:1. Without JavaScript the controls stay hidden and the image is the fitted,
# scrollable one of the stylesheet.
ZOOM_SCRIPT = """
(function () {
  "use strict";
  var MAX = 4, STEP = 1.5;
  function setup(fig) {
    var view = fig.querySelector(".zoom-view"), img = view && view.querySelector("img");
    if (!img) return;
    var nw = +img.getAttribute("width") || img.naturalWidth, nh = +img.getAttribute("height") || img.naturalHeight;
    if (!nw || !nh) {
      if (!img.complete) img.addEventListener("load", function () { setup(fig); }, {once: true});
      return;
    }
    var bar = fig.querySelector(".zoom-controls"), level = fig.querySelector(".zoom-level");
    var k = 1, tx = 0, ty = 0, fit = 1, fitted = true, pts = new Map();
    fig.classList.add("js");
    if (bar) bar.hidden = false;
    img.style.width = nw + "px";
    img.style.height = nh + "px";
    img.draggable = false;
    function apply() {
      var vw = view.clientWidth, vh = view.clientHeight, w = nw * k, h = nh * k;
      tx = w <= vw ? 0 : Math.min(0, Math.max(vw - w, tx));
      ty = h <= vh ? 0 : Math.min(0, Math.max(vh - h, ty));
      img.style.transform = "translate(" + tx + "px, " + ty + "px) scale(" + k + ")";
      if (level) level.textContent = Math.round(k * 100) + "%";
      fig.classList.toggle("zoomed", !fitted);
    }
    function layout() {
      fit = Math.min(1, view.clientWidth / nw);
      view.style.height = nh * fit + "px";
      if (fitted || k < fit) { k = fit; fitted = true; }
      apply();
    }
    function fitAll() { fitted = true; k = fit; tx = ty = 0; apply(); }
    function zoomTo(k2, px, py) {
      k2 = Math.max(fit, Math.min(MAX, k2));
      if (px === undefined) { px = view.clientWidth / 2; py = view.clientHeight / 2; }
      tx = px - (px - tx) * k2 / k;
      ty = py - (py - ty) * k2 / k;
      k = k2;
      fitted = Math.abs(k - fit) < 1e-9;
      apply();
    }
    function at(e) {
      var r = view.getBoundingClientRect();
      return [e.clientX - r.left, e.clientY - r.top];
    }
    if (bar) bar.addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (!b) return;
      var z = b.getAttribute("data-zoom");
      if (z === "in") zoomTo(k * STEP);
      else if (z === "out") zoomTo(k / STEP);
      else if (z === "fit") fitAll();
      else if (z === "1") zoomTo(1);
    });
    view.addEventListener("wheel", function (e) {
      if (!(e.ctrlKey || e.metaKey)) return;  /* a plain wheel scrolls the page */
      e.preventDefault();
      var d = e.deltaY * (e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? 400 : 1), p = at(e);
      zoomTo(k * Math.exp(-d * 0.002), p[0], p[1]);
    }, {passive: false});
    var gesture = 1;
    view.addEventListener("gesturestart", function (e) { e.preventDefault(); gesture = k; });
    view.addEventListener("gesturechange", function (e) {
      e.preventDefault();
      var p = at(e);
      zoomTo(gesture * e.scale, p[0], p[1]);
    });
    view.addEventListener("pointerdown", function (e) {
      if (e.pointerType === "mouse" && e.button !== 0) return;
      e.preventDefault();
      view.focus({preventScroll: true});
      view.setPointerCapture(e.pointerId);
      pts.set(e.pointerId, at(e));
      view.classList.add("dragging");
    });
    view.addEventListener("pointermove", function (e) {
      if (!pts.has(e.pointerId)) return;
      var ids = Array.from(pts.keys()), before = ids.map(function (i) { return pts.get(i); });
      pts.set(e.pointerId, at(e));
      var after = ids.map(function (i) { return pts.get(i); });
      if (ids.length === 1) {
        tx += after[0][0] - before[0][0];
        ty += after[0][1] - before[0][1];
        apply();
      } else {
        var mid = function (q) { return [(q[0][0] + q[1][0]) / 2, (q[0][1] + q[1][1]) / 2]; };
        var dist = function (q) { return Math.hypot(q[0][0] - q[1][0], q[0][1] - q[1][1]) || 1; };
        var m0 = mid(before), m1 = mid(after);
        tx += m1[0] - m0[0];
        ty += m1[1] - m0[1];
        zoomTo(k * dist(after) / dist(before), m1[0], m1[1]);
      }
    });
    function release(e) {
      pts.delete(e.pointerId);
      if (!pts.size) view.classList.remove("dragging");
    }
    view.addEventListener("pointerup", release);
    view.addEventListener("pointercancel", release);
    view.addEventListener("dblclick", function (e) {
      var p = at(e);
      if (fitted) zoomTo(Math.max(1, 2 * fit), p[0], p[1]); else fitAll();
    });
    view.addEventListener("keydown", function (e) {
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      var d = e.shiftKey ? 200 : 40;
      var pan = {ArrowLeft: [d, 0], ArrowRight: [-d, 0], ArrowUp: [0, d], ArrowDown: [0, -d]}[e.key];
      if (e.key === "+" || e.key === "=") zoomTo(k * STEP);
      else if (e.key === "-" || e.key === "_") zoomTo(k / STEP);
      else if (e.key === "0") fitAll();
      else if (e.key === "1") zoomTo(1);
      else if (pan && !fitted) { tx += pan[0]; ty += pan[1]; apply(); }
      else return;
      e.preventDefault();
    });
    window.addEventListener("resize", layout);
    layout();
  }
  Array.prototype.forEach.call(document.querySelectorAll("figure.zoom"), setup);
})();
""".strip()
