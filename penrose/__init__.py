"""penrose: Penrose tensor-network diagrams as the single source of truth for neural architectures.

    >>> import penrose, torch
    >>> model = penrose.compile('''
    ... dim t = 4, e = 3, d = 2
    ... input Z[t, e]
    ... param W_q[e, d]
    ... q = einsum('te,ed->td', Z, W_q)
    ... output q
    ... ''', seed=0)
    >>> model(torch.randn(4, 3)).shape
    torch.Size([4, 2])

The pipeline: text --parse--> IR --check--> checked IR --compile--> PyTorch source / nn.Module,
with render (figures, equations, readings) beside compile.
"""

from __future__ import annotations

from collections.abc import Mapping as _Mapping
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

import os as _os
from pathlib import Path as _Path

from penrose import display as _display
from penrose.checker import LIMITS, Checked, check
from penrose.errors import (
    PenroseArgumentError,
    PenroseCheckError,
    PenroseCompileError,
    PenroseError,
    PenroseRenderError,
    PenroseShapeError,
    PenroseSyntaxError,
    PenroseWarning,
)
from penrose.fmt import format_diagram
from penrose.loader import load  # the function is `penrose.load`; the module is penrose.loader
from penrose.reading import replace_includes
from penrose.parser import parse, parse_file

if _TYPE_CHECKING:
    import torch

    from penrose.reading import Paths

__version__ = "0.1.0"


def _notebook_svg(obj):
    """The figure for `_repr_svg_` in notebooks; the renderer is imported on the first call."""
    from penrose.rendering import repr_svg

    return repr_svg(obj)


_display.bind(_notebook_svg)  # the core calls penrose.display.svg and never imports the renderer


def compile(path_or_text: object = None, /, *, seed: int | None = None, fuse_attention: bool = True, text: str | None = None,
            include_paths: Paths = (), entries: dict[str, _Any] | None = None, sizes: _Mapping[str, _Any] | None = None,
            **more_sizes: _Any) -> torch.nn.Module:
    """Compile a `.pen` file or text into an `nn.Module`; sizes override dim defaults.

    Paths, text and sizes follow `load`'s rules: `sizes={"d": 64}` sizes a dim of any name
    (`seed`, `text`...), `d=64` one that is no option of this function. `seed` makes initialisation deterministic;
    `fuse_attention=False` keeps attention as the diagram's separate einsum/softmax steps instead
    of one scaled_dot_product_attention call. `entries={"hidden": "hidden.pen", ...}` makes one
    module with several entry points: each diagram becomes a method (`model.hidden(...)`) that
    runs on the same parameters, shared by name (docs/language.md, "One module, several entries").
    """
    from penrose.compiler import compile_diagram

    return compile_diagram(
        path_or_text, seed=seed, fuse_attention=fuse_attention, text=text, include_paths=include_paths,
        entries=entries, sizes=sizes, **more_sizes
    )


def export_onnx(path_or_text: object = None, out_path: str | _os.PathLike[str] | None = None, /, *, seed: int | None = None,
                text: str | None = None, include_paths: Paths = (), sizes: _Mapping[str, _Any] | None = None, batch: int = 2,
                dynamic_batch: bool = True, opset: int | None = None, verify: bool = True, **more_sizes: _Any) -> _Path:
    """Write a diagram (a `.pen` path or text, or a module `compile` made) as an ONNX file.

    The graph's inputs and outputs carry the diagram's names, with a leading batch leg (dynamic
    unless `dynamic_batch=False`); the file is written atomically, checked with onnx.checker and,
    with `verify`, run in onnxruntime against the module (the `onnx` extra). `penrose export` is
    the command; docs/pytorch.md says what an export carries.

    >>> penrose.export_onnx("attention.pen", "attention.onnx", d=64)   # doctest: +SKIP
    PosixPath('attention.onnx')
    """
    from penrose.export import export_onnx as _export_onnx

    return _export_onnx(path_or_text, out_path, seed=seed, text=text, include_paths=include_paths, sizes=sizes, batch=batch,
                        dynamic_batch=dynamic_batch, opset=opset, verify=verify, **more_sizes)


def interpret(diagram: object, *args: _Any, params: _Any = None, training: bool = False, sizes: _Mapping[str, _Any] | None = None,
              **inputs: _Any) -> _Any:
    """Evaluate a diagram directly (a second implementation, sharing no code with the compiler).

    >>> import torch
    >>> interpret("dim e = 2\\ninput x[e]\\ny = x * 2\\noutput y", torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    from penrose.interpreter import interpret as _interpret

    return _interpret(diagram, *args, params=params, training=training, sizes=sizes, **inputs)


def source(path_or_text: object = None, /, *, text: str | None = None, include_paths: Paths = (),
           entries: dict[str, _Any] | None = None, sizes: _Mapping[str, _Any] | None = None, **more_sizes: _Any) -> str:
    """The standalone PyTorch source for a diagram (what `penrose compile -o` writes)."""
    from penrose.compiler import generate_source
    from penrose.loader import warned_entries

    checked, more = warned_entries(path_or_text, entries=entries, text=text, include_paths=include_paths, sizes=sizes, **more_sizes)
    return generate_source(checked, entries=more)


def trace(module: torch.nn.Module, *example_inputs: _Any, dims: _Mapping[str, int] | None = None,
          **options: _Any) -> str:
    """The `.pen` text of a PyTorch module's computation, traced with torch.export on example inputs.

    Params keep their state-dict names, so `compile(text).load_state_dict(module.state_dict())`
    works; `dims={"b": 0, "t": 1}` names input axes; what .pen cannot say is a
    `penrose.tracing.PenroseTraceError` at the user's source line (docs/trace.md).
    """
    from penrose.tracing import trace as _trace

    return _trace(module, *example_inputs, dims=dims, **options)


def render(diagram: _Any, fmt: str = "svg", **options: _Any) -> str | bytes:
    """Draw a diagram (a path, text or checked diagram): SVG or TikZ text, PNG or PDF bytes.

    The options are `penrose.rendering.render`'s (view, direction, show_sizes, show_plan, unfold,
    sizes, max_width, snippet); graphviz and matplotlib are imported on the first call.
    """
    from penrose.rendering import render as _render

    return _render(diagram, fmt, **options)


def render_file(path: _Any, out_path: str | _os.PathLike[str], **options: _Any) -> str | _os.PathLike[str]:
    """Draw a diagram into a file whose extension picks the format (.svg .png .pdf .tex)."""
    from penrose.rendering import render_file as _render_file

    return _render_file(path, out_path, **options)


def load_ipython_extension(ipython):
    """`%load_ext penrose`: the `%%pen` cell magic (penrose.magic); IPython is imported only then."""
    from penrose.magic import load_ipython_extension as load_extension

    load_extension(ipython)


__all__ = [
    "LIMITS",
    "Checked",
    "PenroseArgumentError",
    "PenroseCheckError",
    "PenroseCompileError",
    "PenroseError",
    "PenroseRenderError",
    "PenroseShapeError",
    "PenroseSyntaxError",
    "PenroseWarning",
    "check",
    "compile",
    "export_onnx",
    "format_diagram",
    "interpret",
    "load",
    "parse",
    "parse_file",
    "render",
    "render_file",
    "replace_includes",
    "source",
    "trace",
]
