"""Notebook display: `_repr_svg_` goes through a hook, so the core never imports the renderer.

The IR, the checked IR and compiled modules call `svg(obj)`; the package (`penrose/__init__.py`)
binds the hook to a function that imports `penrose.render` on its first call. Unbound, or when a
diagram cannot be drawn, `svg` returns None, which a notebook reads as "no SVG, use the repr".

    >>> from penrose import display
    >>> previous = display.bind(lambda obj: f"<svg>{obj}</svg>")
    >>> display.svg("x")
    '<svg>x</svg>'
    >>> _ = display.bind(previous)
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[object], str | None] | None = None


def bind(fn: Callable[[object], str | None] | None):
    """Draw notebook figures with `fn(obj) -> SVG text or None`; returns the hook it replaces."""
    global _hook
    previous, _hook = _hook, fn
    return previous


def svg(obj) -> str | None:
    """The SVG for `obj` from the bound hook; None when no hook is bound."""
    return None if _hook is None else _hook(obj)
