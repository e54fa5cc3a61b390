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

from penrose.check import LIMITS, Checked, check
from penrose.errors import (
    PenroseCheckError,
    PenroseCompileError,
    PenroseError,
    PenroseRenderError,
    PenroseShapeError,
    PenroseSyntaxError,
    PenroseWarning,
)
from penrose.fmt import format_diagram
from penrose.parse import parse, parse_file

__version__ = "0.1.0"


def compile(path_or_text, *, seed=None, fuse_attention=True, **sizes):
    """Compile a `.pen` file (path) or text into an `nn.Module`; `sizes` override dim defaults.

    `seed` makes initialisation deterministic; `fuse_attention=False` keeps attention as the
    diagram's separate einsum/softmax steps instead of one scaled_dot_product_attention call.
    """
    from penrose.compiler import compile_diagram

    return compile_diagram(path_or_text, seed=seed, fuse_attention=fuse_attention, **sizes)


def load(path_or_text, **sizes) -> Checked:
    """Parse and check a `.pen` file or text; returns the checked diagram."""
    from penrose.compiler import load as _load

    return _load(path_or_text, **sizes)


def interpret(diagram, *args, params=None, training=False, **inputs):
    """Evaluate a diagram directly (a second implementation, sharing no code with the compiler).

    >>> import torch
    >>> interpret("dim e = 2\\ninput x[e]\\ny = x * 2\\noutput y", torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    from penrose.interpret import interpret as _interpret

    return _interpret(diagram, *args, params=params, training=training, **inputs)


def source(path_or_text, **sizes) -> str:
    """The standalone PyTorch source for a diagram (what `penrose compile -o` writes)."""
    from penrose.compiler import generate_source

    return generate_source(load(path_or_text, **sizes))


__all__ = [
    "LIMITS",
    "Checked",
    "PenroseCheckError",
    "PenroseCompileError",
    "PenroseError",
    "PenroseRenderError",
    "PenroseShapeError",
    "PenroseSyntaxError",
    "PenroseWarning",
    "check",
    "compile",
    "format_diagram",
    "interpret",
    "load",
    "parse",
    "parse_file",
    "source",
]
