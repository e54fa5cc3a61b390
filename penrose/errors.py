"""Source spans and the PenroseError family.

Every mistake a user can make surfaces as a `PenroseError` subclass that knows where it is:

    model.pen:3:14: error: unknown tensor 'W_k'; did you mean 'W_q'?
        q = einsum('te,ed->td', Z, W_k)
                                   ^~~
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A region of a source file (1-based line and column, end exclusive)."""

    file: str = "<string>"
    line: int = 0
    col: int = 0
    end_line: int = 0
    end_col: int = 0
    source_line: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


NOWHERE = Span()


class _Located:
    """`file`, `line` and `col` of a `span` (an error's or a warning's)."""

    span: Span

    @property
    def file(self) -> str:
        return self.span.file

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def col(self) -> int:
        return self.span.col


class PenroseError(_Located, Exception):
    """A user error, with its position and the source line under a caret."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, notes: tuple[tuple[str, Span], ...] = ()):
        self.message = message
        self.span = span or NOWHERE
        self.notes = tuple(notes)
        super().__init__(self.render())

    def render(self) -> str:
        parts = [_located(self.span, self.kind, self.message)]
        for text, span in self.notes:
            parts.append(_located(span, "note", text))
        return "\n".join(parts)

    def with_span(self, span: Span) -> "PenroseError":
        """The same error, placed at `span` if it had no position yet."""
        if self.span.line:
            return self
        return type(self)(self.message, span, self.notes)


def _located(span: Span, kind: str, message: str) -> str:
    if not span.line:
        return f"{span.file}: {kind}: {message}" if span.file != "<string>" else f"{kind}: {message}"
    head = f"{span}: {kind}: {message}"
    if not span.source_line:
        return head
    src = span.source_line.rstrip("\n").expandtabs(1)
    width = 1
    if span.end_line == span.line and span.end_col > span.col:
        width = span.end_col - span.col
    width = max(1, min(width, max(1, len(src) - span.col + 1)))
    caret = " " * (span.col - 1) + "^" + "~" * (width - 1)
    return f"{head}\n    {src}\n    {caret}"


class PenroseSyntaxError(PenroseError):
    """The text is not valid `.pen`."""


class PenroseCheckError(PenroseError):
    """The diagram parses but breaks a rule (names, legs, sizes, blocks)."""


class PenroseCompileError(PenroseError):
    """The diagram cannot be compiled for the requested sizes or target."""


class PenroseShapeError(PenroseError, ValueError):
    """A runtime input has the wrong name, rank or size."""


class PenroseArgumentError(PenroseError, TypeError, ValueError):
    """An argument of a public function has the wrong type or is out of range (a seed, the
    params of `interpret`, what `format_diagram` formats): a TypeError and a ValueError too."""


def seed_value(seed: object) -> int:
    """A seed as an int from 0 to 2**64 - 1 (what torch.Generator.manual_seed holds); a bool,
    a float, a string or a number out of range is a PenroseArgumentError.

    >>> seed_value(3)
    3
    >>> seed_value("abc")
    Traceback (most recent call last):
    ...
    penrose.errors.PenroseArgumentError: error: seed must be a whole number from 0 to 2**64 - 1, got 'abc' (str)
    """
    import operator

    if not isinstance(seed, bool):
        try:
            value = operator.index(seed)  # type: ignore[arg-type]  # int, numpy integers; not float, str, bool
        except TypeError:
            value = None
        if value is not None and 0 <= value < 2**64:
            return value
    raise PenroseArgumentError(f"seed must be a whole number from 0 to 2**64 - 1, got {seed!r} ({type(seed).__name__})")


class PenroseRenderError(PenroseError):
    """A figure cannot be drawn or written."""


class PenroseWarning(_Located, UserWarning):
    """A diagram that is valid but probably not what was meant (an unused input, legs aligned by
    position, an einsum output letter naming a dim of another size), raised with `warnings.warn`
    by `penrose.load`, `compile`, `interpret`, `source` and `export_onnx` at the caller's line.

    `message` is the text and `span` the place in the diagram (`line`, `col`, `file`); `str()` is
    both, so `warnings.filterwarnings("ignore", message=".*never used", category=PenroseWarning)`
    and `filterwarnings("error", category=PenroseWarning)` work as for any warning.

    >>> w = PenroseWarning("param 'W' is never used", Span("m.pen", 3, 7))
    >>> str(w), w.line, w.col
    ("m.pen:3:7: param 'W' is never used", 3, 7)
    """

    def __init__(self, message: str, span: Span | None = None):
        self.message = message
        self.span = span or NOWHERE
        super().__init__(f"{self.span}: {message}" if self.span.line else message)

    def render(self) -> str:
        """The text `penrose check` prints: 'm.pen:3:7: warning: ...'."""
        return warning_text(self.message, self.span)


def warning_text(message: str, span: Span) -> str:
    """A checker warning as the CLI, the notebook magic and the live page show it.

    >>> warning_text("input 'x' is never used", Span("m.pen", 2, 7))
    "m.pen:2:7: warning: input 'x' is never used"
    """
    return f"{span}: warning: {message}" if span.line else f"warning: {message}"


def suggest(name: str, candidates: Iterable[str]) -> str:
    """'; did you mean X?' when a near-miss exists, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
