"""Rendering: Penrose figures, index equations and geometric readings of a diagram.

    >>> import penrose.rendering
    >>> svg = penrose.rendering.render("dim e = 2\\ninput x[e]\\nparam W[e, e]\\ny = einsum('i,ij->j', x, W)\\noutput y")
    >>> svg.startswith('<?xml')
    True

`render` takes `.pen` text, a path, a parsed `ir.Diagram` or a `Checked` diagram; `render_file`
writes svg, png, pdf or TikZ (chosen by the extension: .svg .png .pdf .tex, or by `fmt`)
atomically. Views: 'diagram' (the whole figure), 'statement:N' (the N-th computing statement,
1-based), 'block:NAME' (a block's body). `fmt="tikz"` gives a LaTeX document (or, with
`snippet=True`, only its tikzpicture) with Graphviz's layout of the same figure
(`penrose.rendering.tikz`); `max_width` scales a figure down, never up.
"""

from __future__ import annotations

import os
from pathlib import Path

from penrose.errors import PenroseError, PenroseRenderError, Span
from penrose.stack import deep

__all__ = ["FORMATS", "dot_source", "figure_format", "render", "render_file"]

FORMATS = ("svg", "png", "pdf", "tikz")
EXTENSIONS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".tex": "tikz", ".tikz": "tikz"}
TEXT_FORMATS = ("svg", "tikz")  # render returns str for these, bytes for the others


def figure_format(fmt=None, out_path=None) -> str:
    """The format a figure is written in: `fmt` when given (it must be one of FORMATS), else the
    extension of `out_path` (.svg .png .pdf, .tex or .tikz for TikZ). Raises PenroseRenderError."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise PenroseRenderError(f"unknown figure format {fmt!r}; use one of {', '.join(FORMATS)}")
        return fmt
    ext = Path(str(out_path)).suffix.lower()
    if ext not in EXTENSIONS:
        raise PenroseRenderError(
            f"cannot tell the figure format from {str(out_path)!r}; use a .svg, .png or .pdf file name "
            "(.tex for TikZ), or give the format", Span(str(out_path))
        )
    return EXTENSIONS[ext]


def _max_width(max_width):
    if max_width is None:
        return None
    ok = isinstance(max_width, (int, float)) and not isinstance(max_width, bool)
    if not ok or not (0 < max_width < float("inf")):
        raise PenroseRenderError(f"max_width (--max-width) must be a positive number (pixels for svg and png, points for pdf and tikz), got {max_width!r}")
    return float(max_width)


def _checked(obj, sizes):
    """The checked diagram to draw (penrose.load: a path, text, Diagram, Checked or compiled module)."""
    from penrose.loader import load_entries, loadable

    if not loadable(obj):
        raise PenroseRenderError(f"cannot render a {type(obj).__name__}; pass .pen text, a path, a Diagram or a Checked diagram")
    return load_entries(obj, sizes=sizes)[0]  # quiet: a figure raises no PenroseWarning (the serve page shows them)


@deep
def dot_source(diagram, view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None,
               copies=False) -> str:
    """The Graphviz DOT text of a figure (what `render` lays out)."""
    from penrose.rendering.figure import to_dot

    return to_dot(_figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes, copies))


def _figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes, copies=False):
    from penrose.rendering.figure import Options, build_figure

    c = _checked(diagram, sizes)
    opts = Options(direction=direction, show_sizes=show_sizes, show_plan=show_plan, unfold=unfold, copies=copies)
    return build_figure(c, view, opts)


@deep
def render(diagram, fmt="svg", view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None,
           max_width=None, snippet=False, copies=False):
    """Draw a diagram: SVG text for fmt='svg', LaTeX text for 'tikz', bytes for 'png' and 'pdf'.

    `max_width` scales the figure down (never up) to at most that wide, keeping its aspect ratio:
    CSS pixels for svg (its width and height change, its viewBox stays), pixels for png, points
    (1/72 in) for pdf and tikz. `snippet` (tikz only) gives just the tikzpicture environment.
    A tensor several contractions read is drawn once, its legs branching, as the paper draws
    Z feeding q, k and v; `copies` draws it once per contraction instead.

    >>> svg = render("dim e = 2\\ninput x[e]\\ny = sigmoid(x)\\noutput y", view="statement:1")
    >>> 'sigmoid' in svg
    True
    """
    from penrose.rendering.figure import to_dot
    from penrose.rendering import graphviz

    fmt = figure_format(fmt)
    if snippet and fmt != "tikz":
        raise PenroseRenderError(f"snippet is for TikZ figures (fmt='tikz'), not {fmt}")
    width = _max_width(max_width)
    fig = _figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes, copies)
    dot = to_dot(fig)
    try:
        if fmt == "tikz":
            from penrose.rendering.tikz import to_tikz

            return to_tikz(dot, snippet=snippet, max_width=width)
        if width is None or fmt == "svg":
            data = graphviz.run_dot(dot, fmt)
            if width is not None:
                data = graphviz.limit_svg_width(data.decode("utf-8"), width).encode("utf-8")
        else:
            data = _scaled(dot, fmt, width)
    except PenroseRenderError as e:  # a layout too slow: point at the statement that drew the most
        raise e.with_span(fig.span) from None
    return data.decode("utf-8") if fmt == "svg" else data


def _scaled(dot: str, fmt: str, width: float) -> bytes:
    """png or pdf bytes at most `width` wide (Graphviz's size attribute; for png, whose width
    Graphviz rounds to whole pixels, tried again a pixel narrower if it came out too wide)."""
    from penrose.rendering import graphviz

    target = width
    for _ in range(3):
        data = graphviz.run_dot(dot, fmt, graph_attrs=graphviz.max_width_attrs(fmt, target))
        if fmt != "png" or graphviz.png_size(data)[0] <= width:
            return data
        target -= 1
    return data


@deep
def render_file(path, out_path, view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None,
                max_width=None, fmt=None, snippet=False, copies=False):
    """Render the `.pen` file at `path` to `out_path` (svg, png, pdf or TikZ by extension, or
    `fmt`); returns out_path. `max_width`, `snippet` and `copies` are as for `render`.

    Nothing is written when anything fails: an invalid diagram raises the checker's positioned
    error, an unknown format or an unwritable place a `PenroseRenderError`.
    """
    from penrose.io import atomic_write_bytes

    fmt = figure_format(fmt, out_path)
    folder = Path(str(out_path)).parent
    if str(folder) and not folder.is_dir():
        raise PenroseRenderError(f"cannot write {out_path}: folder {folder} does not exist", Span(str(out_path)))
    data = render(path, fmt, view, direction, show_sizes, show_plan, unfold, sizes, max_width=max_width, snippet=snippet, copies=copies)
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        atomic_write_bytes(out_path, data)
    except PenroseRenderError:
        raise
    except PenroseError as e:
        raise PenroseRenderError(e.message, e.span) from None
    readable(out_path)
    return out_path


def readable(path) -> None:
    """Give a written file the usual permissions (the temporary file behind an atomic write is
    private to its owner)."""
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.chmod(path, 0o666 & ~mask)
    except OSError:
        pass


def repr_svg(obj) -> str | None:
    """SVG for notebooks (`_repr_svg_`); None when the diagram cannot be drawn."""
    try:
        return render(obj)
    except PenroseError:
        return None
