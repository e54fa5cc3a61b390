"""Rendering: Penrose figures, index equations and geometric readings of a diagram.

    >>> import penrose.render
    >>> svg = penrose.render.render("dim e = 2\\ninput x[e]\\nparam W[e, e]\\ny = einsum('i,ij->j', x, W)\\noutput y")
    >>> svg.startswith('<?xml')
    True

`render` takes `.pen` text, a path, a parsed `ir.Diagram` or a `Checked` diagram; `render_file`
writes svg, png or pdf (chosen by the extension) atomically. Views: 'diagram' (the whole figure),
'statement:N' (the N-th computing statement, 1-based), 'block:NAME' (a block's body).
"""

from __future__ import annotations

import os
from pathlib import Path

from penrose.errors import PenroseError, PenroseRenderError, Span
from penrose.stack import deep

__all__ = ["dot_source", "render", "render_file"]


def _checked(obj, sizes):
    from penrose import ir
    from penrose.check import Checked, check

    if isinstance(obj, Checked):
        return obj if not sizes else check(obj.diagram, **sizes)
    if isinstance(obj, ir.Diagram):
        return check(obj, **(sizes or {}))
    checked = getattr(obj, "penrose_checked", None)  # a compiled module
    if isinstance(checked, Checked):
        return checked if not sizes else check(checked.diagram, **sizes)
    if isinstance(obj, (str, os.PathLike)):
        from penrose.parse import parse, parse_file

        if isinstance(obj, os.PathLike) or ("\n" not in obj and obj.endswith(".pen")):
            return check(parse_file(obj), **(sizes or {}))
        return check(parse(obj), **(sizes or {}))
    raise PenroseRenderError(f"cannot render a {type(obj).__name__}; pass .pen text, a path, a Diagram or a Checked diagram")


@deep
def dot_source(diagram, view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None) -> str:
    """The Graphviz DOT text of a figure (what `render` lays out)."""
    from penrose.render.figure import to_dot

    return to_dot(_figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes))


def _figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes):
    from penrose.render.figure import Options, build_figure

    c = _checked(diagram, sizes)
    opts = Options(direction=direction, show_sizes=show_sizes, show_plan=show_plan, unfold=unfold)
    return build_figure(c, view, opts)


@deep
def render(diagram, fmt="svg", view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None):
    """Draw a diagram: SVG text for fmt='svg', bytes for 'png' and 'pdf'.

    >>> svg = render("dim e = 2\\ninput x[e]\\ny = sigmoid(x)\\noutput y", view="statement:1")
    >>> 'sigmoid' in svg
    True
    """
    from penrose.render.figure import to_dot
    from penrose.render.graphviz import FORMATS, run_dot

    if fmt not in FORMATS:
        raise PenroseRenderError(f"unknown figure format {fmt!r}; use one of {', '.join(FORMATS)}")
    fig = _figure(diagram, view, direction, show_sizes, show_plan, unfold, sizes)
    try:
        data = run_dot(to_dot(fig), fmt)
    except PenroseRenderError as e:  # a layout too slow: point at the statement that drew the most
        raise e.with_span(fig.span) from None
    return data.decode("utf-8") if fmt == "svg" else data


@deep
def render_file(path, out_path, view="diagram", direction="LR", show_sizes=False, show_plan=False, unfold=False, sizes=None):
    """Render the `.pen` file at `path` to `out_path` (svg, png or pdf by extension); returns out_path.

    Nothing is written when anything fails: an invalid diagram raises the checker's positioned
    error, an unknown format or an unwritable place a `PenroseRenderError`.
    """
    from penrose.io import atomic_write_bytes
    from penrose.render.graphviz import FORMATS

    ext = Path(str(out_path)).suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise PenroseRenderError(
            f"cannot tell the figure format from {str(out_path)!r}; use a .svg, .png or .pdf file name", Span(str(out_path))
        )
    folder = Path(str(out_path)).parent
    if str(folder) and not folder.is_dir():
        raise PenroseRenderError(f"cannot write {out_path}: folder {folder} does not exist", Span(str(out_path)))
    data = render(path, ext, view, direction, show_sizes, show_plan, unfold, sizes)
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
