"""The tracer's error: what cannot be drawn, at the user's own source line."""

from __future__ import annotations

import linecache
import re

from penrose.errors import PenroseError, Span

FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


class PenroseTraceError(PenroseError):
    """A module (or einsum) that cannot be written as a `.pen` diagram, named at its source line."""


def frames(stack_trace: str | None) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame of an export node's stack trace, outermost first."""
    return [(f, int(line), fn) for f, line, fn in FRAME.findall(stack_trace or "")]


def span_at(file: str, line: int) -> Span:
    """A span over the code of one source line (its text read from the file, when it can be)."""
    text = linecache.getline(file, line) if file and line else ""
    code = text.rstrip("\n")
    stripped = code.lstrip()
    col = len(code) - len(stripped) + 1 if stripped else 1
    end = len(code) + 1 if stripped else col + 1
    return Span(file, line, col, line, end, code)
