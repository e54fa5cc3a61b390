"""einops patterns: the text of `rearrange`, `reduce` and `repeat`, read with positions.

A pattern is two sides around `->`; a side is a list of legs separated by spaces. A leg is a
name (a dim of the diagram), `1` or `()` (a leg of size one), `...` (the operand's legs the
other entries do not name), or a parenthesised group of names (`(h d)`: one leg whose index
runs over h, then d fastest). Exactly einops' syntax (einops.parsing), read once here, so every
refusal points at the characters inside the string.

    >>> p = parse("t (h d) -> h t d")
    >>> [[a.name for a in g.axes] for g in p.left.groups], [[a.name for a in g.axes] for g in p.right.groups]
    ([['t'], ['h', 'd']], [['h'], ['t'], ['d']])

What the names mean (dims, sizes, which side may hold what) is the checker's part
(penrose/check_einops.py); this module knows only the text. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from penrose.einsum_spec import spec_span
from penrose.errors import NOWHERE, PenroseCheckError, Span

REDUCTIONS = ("sum", "mean", "max", "min", "prod")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Axis:
    """One elementary axis: a name, the unit `1` (name None) or the ellipsis."""

    name: str | None
    start: int  # offsets into the pattern string
    end: int
    ellipsis: bool = False


@dataclass(frozen=True)
class Group:
    """One leg of a side: a bare axis, or a parenthesised group of axes (`()` is empty)."""

    axes: tuple
    start: int
    end: int
    paren: bool

    @property
    def unit(self) -> bool:
        """A leg of size one: `1`, `()` or a group of ones only."""
        return all(a.name is None and not a.ellipsis for a in self.axes)

    @property
    def names(self) -> tuple:
        return tuple(a.name for a in self.axes if a.name is not None and not a.ellipsis)


@dataclass(frozen=True)
class Side:
    groups: tuple
    start: int
    end: int

    @property
    def ellipsis(self) -> int | None:
        """The index of the group that is `...`, or None."""
        for i, g in enumerate(self.groups):
            if any(a.ellipsis for a in g.axes):
                return i
        return None

    def axes(self):
        for g in self.groups:
            yield from g.axes


@dataclass(frozen=True)
class Pattern:
    text: str
    left: Side
    right: Side


def parse(text: str, span: Span = NOWHERE, what: str = "rearrange") -> Pattern:
    """Read an einops pattern; a mistake raises PenroseCheckError at its characters.

    `span` is the string literal's span (quotes included), `what` the function, for messages.
    """

    def fail(msg: str, start: int, end: int | None = None) -> NoReturn:
        raise PenroseCheckError(f"{what}: {msg}", spec_span(span, start, end))

    arrows = [m.start() for m in re.finditer("->", text)]
    if not arrows:
        fail(f"the pattern needs '->' between its two sides, as '{text.strip() or 'a b'} -> ...'", 0, max(len(text), 1))
    if len(arrows) > 1:
        fail("the pattern has a second '->'", arrows[1], arrows[1] + 2)
    arrow = arrows[0]
    left = _side(text, 0, arrow, fail)
    right = _side(text, arrow + 2, len(text), fail)
    return Pattern(text, left, right)


def _side(text: str, lo: int, hi: int, fail: Callable[..., NoReturn]) -> Side:
    groups: list[Group] = []
    seen: dict[str, int] = {}
    open_at: int | None = None
    current: list[Axis] = []
    i = lo
    ellipsis_at: int | None = None

    def add(axis: Axis) -> None:
        if axis.ellipsis:
            nonlocal ellipsis_at
            if ellipsis_at is not None:
                fail("'...' appears twice on one side", axis.start, axis.end)
            ellipsis_at = axis.start
        elif axis.name is not None:
            if axis.name in seen:
                fail(f"{axis.name!r} appears twice on one side of the pattern", axis.start, axis.end)
            seen[axis.name] = axis.start
        if open_at is None:
            groups.append(Group((axis,), axis.start, axis.end, False))
        else:
            current.append(axis)

    while i < hi:
        ch = text[i]
        if ch == " ":
            i += 1
        elif ch == "(":
            if open_at is not None:
                fail("groups do not nest: one pair of parentheses per leg", i)
            open_at, current = i, []
            i += 1
        elif ch == ")":
            if open_at is None:
                fail("')' closes no group", i)
            groups.append(Group(tuple(current), open_at, i + 1, True))
            open_at = None
            i += 1
        elif text.startswith("...", i):
            add(Axis(None, i, i + 3, ellipsis=True))
            i += 3
        elif ch == ".":
            fail("a '.' is only part of '...'", i)
        elif ch == "-" and text.startswith("->", i):  # pragma: no cover - the caller splits at the arrow
            fail("the pattern has a second '->'", i, i + 2)
        else:
            m = _NAME.match(text, i) if not ch.isdigit() else None
            if m is not None and m.end() <= hi:
                add(Axis(m.group(), i, m.end()))
                i = m.end()
                continue
            n = _NUMBER.match(text, i)
            if n is not None:
                end = n.end()
                if end < hi and (text[end].isalpha() or text[end] == "_"):
                    fail("a name starts with a letter", i, end + 1)
                if int(n.group()) != 1:
                    fail(f"a leg of size {n.group()} needs a name: declare it (dim c = {n.group()}) and write the dim", i, end)
                add(Axis(None, i, end))
                i = end
                continue
            fail(f"{ch!r} is not part of a pattern (names, 1, (), ... and '->')", i)
    if open_at is not None:
        fail("'(' is never closed", open_at)
    return Side(tuple(groups), lo, hi)
