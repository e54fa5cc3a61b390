"""The one way in: a path, text or Diagram, sizes and include paths → a checked program.

Everything that checks a diagram comes through here: `penrose.load`, `penrose.compile`,
`penrose.source`, `penrose.render`, `penrose.interpret`, the CLI, and through the cached
`penrose.workspace.Workspace` the notebook magic, `penrose serve`, the language server and the
zoo's `load_diagram`. Loading is three steps: read the top diagram (`read`), read every file it
includes, transitively (`penrose.reading.walk_includes`, one resolver for all), then check, which reads nothing
(`penrose.checker.check(diagram, sizes, includes=...)`). This module imports neither torch nor the
checker (until `load` is called).

    >>> from penrose.loader import load
    >>> load(text="dim text = 2\\ninput x[text]\\noutput x", sizes={"text": 8}).dim_sizes()
    {'text': 8}

What comes before checking — paths or text, includes, sizes as a mapping — is `penrose.reading`
(the checker reads its includes through it, so it sits below the checker; this module above).

Import names from this module (`from penrose.loader import load_entries`): the package attribute
`penrose.load` is the `load` function.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from penrose import ir
from penrose.reading import Paths, Reader, include_folders, merge_sizes, read, walk_includes
from penrose.stack import deep

if TYPE_CHECKING:
    from penrose.checked import Checked

Source = object  # a path (str or os.PathLike), .pen text, an ir.Diagram, a Checked or a compiled module

__all__ = ["Source", "load", "load_entries", "loadable", "warn_checked", "warned_entries"]


# ---- loading -----------------------------------------------------------------------------------


def loadable(source: object) -> bool:
    """Whether `load` takes `source`: a path, text, Diagram, Checked or compiled module."""
    return isinstance(source, (str, os.PathLike, ir.Diagram)) or _compiled(source) is not None


def _compiled(source: object) -> Checked | None:
    """The Checked of a Checked or of a compiled module (which carries one), else None."""
    from penrose.checked import Checked

    if isinstance(source, Checked):
        return source
    found = getattr(source, "penrose_checked", None)
    return found if isinstance(found, Checked) else None


def load(source: Source = None, /, *, text: str | None = None, sizes: Mapping[str, Any] | None = None,
         include_paths: Paths = (), **more_sizes: Any) -> Checked:
    """A path, `.pen` text, Diagram or Checked → its checked diagram (`penrose.load`).

    `sizes={...}` (or keyword sizes) override dim defaults and const values; `include_paths`
    are folders includes may reach besides the top-level file's. Imports no torch. The
    checker's warnings are raised as `PenroseWarning`s (`warn_checked`).

    >>> load(text="dim e = 2\\ninput x[e]\\noutput x").outputs[0][0]
    'x'
    """
    checked, _, fresh = _load(source, text, merge_sizes(sizes, more_sizes), include_paths, None, None)
    warn_checked(fresh)
    return checked


def warned_entries(source: Source = None, /, *, text: str | None = None, sizes: Mapping[str, Any] | None = None,
                   include_paths: Paths = (), entries: dict[str, Any] | None = None,
                   **more_sizes: Any) -> tuple[Checked, dict[str, Checked]]:
    """`load_entries`, with the warnings of the diagrams it checked raised as `PenroseWarning`s
    (what `penrose.compile` and `penrose.source` load through)."""
    checked, more, fresh = _load(source, text, merge_sizes(sizes, more_sizes), include_paths, entries, None)
    warn_checked(fresh)
    return checked, more


def load_entries(source: Source = None, /, *, text: str | None = None, sizes: Mapping[str, Any] | None = None,
                 include_paths: Paths = (), entries: dict[str, Any] | None = None, read_include: Reader | None = None,
                 **more_sizes: Any) -> tuple[Checked, dict[str, Checked]]:
    """(the checked diagram, {method: checked entry}): the diagram and its `entries` ({method:
    path, text, Diagram or Checked}), all under one set of sizes (each takes those it declares).
    `read_include(target)` reads an included file (default: from disk). Quiet: the warnings stay
    in `Checked.warnings` for the caller to show (the CLI, the workspace, the renderer)."""
    checked, more, _ = _load(source, text, merge_sizes(sizes, more_sizes), include_paths, entries, read_include)
    return checked, more


@deep  # parse and check with room for deep nesting
def _load(source: Source, text: str | None, sizes: dict[str, Any], include_paths: Paths, entries: dict[str, Any] | None,
          read_include: Reader | None) -> tuple[Checked, dict[str, Checked], list[Checked]]:
    """load_entries' work, and the diagrams it checked (not those passed in checked)."""
    from penrose.checker import check_together

    if entries is not None and not isinstance(entries, dict):
        raise TypeError(f"entries maps method names to diagrams, got {type(entries).__name__}")
    entries = dict(entries or {})
    folders = include_folders(include_paths)
    done = _compiled(source) if text is None else None
    if done is not None and sizes:  # checked again at these sizes
        source = done.diagram
        done = None
    diagrams: list[Checked | ir.Diagram] = [done or read(source, text=text)]
    diagrams += [_compiled(e) or read(e) for e in entries.values()]
    todo = [d for d in diagrams if isinstance(d, ir.Diagram)]
    fresh = check_together(todo, sizes, includes=[walk_includes(d, folders, read_include) for d in todo])
    checked = iter(fresh)
    out = [next(checked) if isinstance(d, ir.Diagram) else d for d in diagrams]
    return out[0], dict(zip(entries, out[1:])), list(fresh)


# ---- warnings ----------------------------------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_checked(checked: list[Checked]) -> None:
    """Raise each warning of these checked diagrams once, as a `PenroseWarning` (warnings.warn)
    at the first frame outside penrose: the user's line that called `penrose.compile`, `load`,
    `interpret`, `source` or `export_onnx`. The index-legend reminders (a dim the legend does not
    explain) are for figures and stay in `Checked.warnings`, which `penrose check`, the editor,
    `%%pen` and `penrose serve` show."""
    import warnings

    from penrose.errors import PenroseWarning
    from penrose.views import legend_warnings

    seen: set[tuple[str, Any]] = set()
    for c in checked:
        if not c.warnings:
            continue
        seen.update(legend_warnings(c.diagram))
        for message, span in c.warnings:
            if (message, span) not in seen:
                seen.add((message, span))
                warnings.warn(PenroseWarning(message, span), stacklevel=_caller_level())


def _caller_level() -> int:
    """The `stacklevel` of the first frame outside the penrose package, seen from the caller."""
    frame = sys._getframe(2)  # the caller of warn_checked
    level = 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
