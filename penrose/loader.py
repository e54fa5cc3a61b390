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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from penrose import ir
from penrose.reading import Paths, Reader, include_folders, merge_sizes, read, walk_includes
from penrose.stack import deep

if TYPE_CHECKING:
    from penrose.checked import Checked

Source = object  # a path (str or os.PathLike), .pen text, an ir.Diagram, a Checked or a compiled module

__all__ = ["Source", "load", "load_entries", "loadable"]


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


@deep  # parse and check with room for deep nesting
def load(source: Source = None, /, *, text: str | None = None, sizes: Mapping[str, Any] | None = None,
         include_paths: Paths = (), **more_sizes: Any) -> Checked:
    """A path, `.pen` text, Diagram or Checked → its checked diagram (`penrose.load`).

    `sizes={...}` (or keyword sizes) override dim defaults and const values; `include_paths`
    are folders includes may reach besides the top-level file's. Imports no torch.

    >>> load(text="dim e = 2\\ninput x[e]\\noutput x").outputs[0][0]
    'x'
    """
    checked: Checked = load_entries(source, text=text, sizes=sizes, include_paths=include_paths, **more_sizes)[0]
    return checked


@deep
def load_entries(source: Source = None, /, *, text: str | None = None, sizes: Mapping[str, Any] | None = None,
                 include_paths: Paths = (), entries: dict[str, Any] | None = None, read_include: Reader | None = None,
                 **more_sizes: Any) -> tuple[Checked, dict[str, Checked]]:
    """(the checked diagram, {method: checked entry}): the diagram and its `entries` ({method:
    path, text, Diagram or Checked}), all under one set of sizes (each takes those it declares).
    `read_include(target)` reads an included file (default: from disk)."""
    from penrose.checker import check_together

    sizes = merge_sizes(sizes, more_sizes)
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
    checked = iter(check_together(todo, sizes, includes=[walk_includes(d, folders, read_include) for d in todo]))
    out = [next(checked) if isinstance(d, ir.Diagram) else d for d in diagrams]
    return out[0], dict(zip(entries, out[1:]))
