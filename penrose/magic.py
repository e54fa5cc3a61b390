"""Diagrams in notebooks: `%load_ext penrose`, then a `%%pen` cell.

    %load_ext penrose

    %%pen model --size t=64
    # index legend: t token, e embedding
    dim t = 16, e = 8
    input x[t, e]
    param W[e, e]
    y = einsum('te,ef->tf', x, W)
    output y

The cell is checked; its figure is drawn inline (SVG); the compiled `nn.Module` is bound to the
name given (`model` above), so the next cell can call `model(torch.randn(64, 8))`. Options:

    NAME                 bind the compiled module to NAME (without it: check and draw only)
    --size NAME=N        a dim's size or a const's value (again for more)
    --seed N             deterministic initialisation
    --include-path DIR   a folder includes may also reach (includes are relative to the working folder)
    --no-figure          skip the figure
    --source             also show the generated PyTorch source

A mistake is shown as `penrose check` shows it, the line under a caret, as the cell's error (no
Python traceback), so "Run all" stops there; warnings are shown above the figure.

This module imports IPython only when the extension is loaded; `penrose.load_ipython_extension`
is the hook `%load_ext penrose` calls.
"""

from __future__ import annotations

import html
import shlex
from typing import Any, TypedDict

from penrose.errors import PenroseError, warning_text
from penrose.workspace import Workspace

CELL_FILE = "<pen cell>"
WORKSPACE = Workspace()  # the cells and the files they include: a cell run again unchanged is not checked again


class PenCellError(Exception):
    """A `%%pen` cell that does not check: IPython shows `_render_traceback_`, the error with its
    caret, instead of a Python traceback."""

    def __init__(self, error: PenroseError):
        self.error = error
        super().__init__(error.render())

    def _render_traceback_(self):
        return [f"\x1b[31m{line}\x1b[0m" if i == 0 else line for i, line in enumerate(self.error.render().splitlines())]


class _Options(TypedDict):
    name: str | None
    sizes: dict[str, int | float]
    seed: int | None
    include_paths: list[str]
    figure: bool
    source: bool


def _options(line: str) -> _Options:
    """The `%%pen` line's options (see the module docstring)."""
    opts: _Options = {"name": None, "sizes": {}, "seed": None, "include_paths": [], "figure": True, "source": False}
    words = shlex.split(line)
    i = 0

    def value():
        nonlocal i
        i += 1
        if i >= len(words):
            raise PenroseError(f"%%pen: {words[i - 1]} needs a value")
        return words[i]

    while i < len(words):
        w = words[i]
        if w.startswith("--size="):
            words[i : i + 1] = ["--size", w.split("=", 1)[1]]
            continue
        if w == "--size":
            item = value()
            name, _, text = item.partition("=")
            try:
                number = int(text) if text.strip().lstrip("+-").isdigit() else float(text)
            except ValueError:
                raise PenroseError(f"%%pen: --size expects NAME=NUMBER, got {item!r}") from None
            opts["sizes"][name.strip()] = number
        elif w == "--seed":
            try:
                opts["seed"] = int(value())
            except ValueError:
                raise PenroseError(f"%%pen: --seed expects an integer, got {words[i]!r}") from None
        elif w == "--include-path":
            opts["include_paths"].append(value())
        elif w == "--no-figure":
            opts["figure"] = False
        elif w == "--source":
            opts["source"] = True
        elif w.startswith("-"):
            raise PenroseError(f"%%pen: unknown option {w!r} (NAME, --size NAME=N, --seed N, --include-path DIR, --no-figure, --source)")
        elif opts["name"] is None:
            if not w.isidentifier():
                raise PenroseError(f"%%pen: {w!r} is not a Python name to bind the module to")
            opts["name"] = w
        else:
            raise PenroseError(f"%%pen: one name to bind, got {opts['name']!r} and {w!r}")
        i += 1
    return opts


def run_cell(line: str, cell: str, namespace: dict | None = None, display=None):
    """What `%%pen` does, without IPython: check `cell`, show its figure with `display`, bind
    the compiled module in `namespace`; returns the module (or the checked diagram when no name
    is given). Raises PenCellError for a cell that does not check."""
    try:
        opts = _options(line)
        checked = WORKSPACE.load(text=cell, file=CELL_FILE, sizes=opts["sizes"], include_paths=opts["include_paths"])
    except PenroseError as e:
        raise PenCellError(e) from None
    show = display or (lambda obj: None)
    if checked.warnings:
        text = "\n".join(warning_text(msg, span) for msg, span in checked.warnings)
        show(_Text(text, "warning"))
    if opts["figure"]:
        from penrose.rendering import render

        try:
            show(_Svg(render(checked)))
        except PenroseError as e:  # no Graphviz, a layout too slow: say so, and still bind
            show(_Text(e.render(), "warning"))
    result: Any = checked  # the Checked, or the module built from it
    if opts["name"] is not None:
        from penrose.compiler import build

        try:
            result = build(checked, seed=opts["seed"])
        except PenroseError as e:
            raise PenCellError(e) from None
        if namespace is not None:
            namespace[opts["name"]] = result
    if opts["source"]:
        from penrose.compiler import generate_source

        show(_Code(generate_source(checked)))
    return result


class _Svg:
    def __init__(self, svg: str):
        self.svg = svg

    def _repr_svg_(self):
        return self.svg

    def __repr__(self):  # a terminal IPython shows this instead
        return f"<penrose figure: {len(self.svg):,} characters of SVG>"


class _Text:
    def __init__(self, text: str, kind: str = "note"):
        self.text, self.kind = text, kind

    def __repr__(self):
        return self.text

    def _repr_html_(self):
        color = "#8a5a00" if self.kind == "warning" else "#333"
        return f'<pre style="color: {color}">{html.escape(self.text)}</pre>'


class _Code(_Text):
    def _repr_html_(self):
        return f"<pre>{html.escape(self.text)}</pre>"


def load_ipython_extension(ipython) -> None:
    """Register `%%pen` (and the `pen` highlighting of its cells, where the front end asks)."""
    from IPython.core.magic import Magics, cell_magic, magics_class
    from IPython.display import display

    @magics_class
    class PenroseMagics(Magics):
        @cell_magic
        def pen(self, line, cell):
            """%%pen [NAME] [--size NAME=N]... [--seed N] [--include-path DIR] [--no-figure] [--source]

            Check the cell's diagram, draw it, bind the compiled module to NAME (penrose.magic)."""
            run_cell(line, cell, self.shell.user_ns, display)

    ipython.register_magics(PenroseMagics)
