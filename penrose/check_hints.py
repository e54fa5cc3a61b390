"""What to write instead: the hints the checker's refusals end with (issue 41).

Pure text from the legs and expressions at hand; the checker's parts call these where they
refuse. Torch-free.

>>> einsum_text([['t'], ['s', 'e']], ['t', 's', 'e'])
't,se->tse'
>>> einsum_text([['tok'], ['s']], ['tok', 's'])
'tok, s -> tok s'
"""

from __future__ import annotations

from collections.abc import Sequence

from penrose import ir
from penrose.errors import Span
from penrose.fmt import format_expr


def einsum_text(terms: Sequence[Sequence[str]], out: Sequence[str]) -> str:
    """An einsum spec over these legs: letters when every leg is one letter, else the spaced word form."""
    if all(len(leg) == 1 for t in [*terms, out] for leg in t):
        return ",".join("".join(t) for t in terms) + "->" + "".join(out)
    return ", ".join(" ".join(t) for t in terms) + " -> " + " ".join(out)


def broadcast_hint(what: str, ex, legs_of: Sequence[str], sizes_of: Sequence[int | None], exprs: Sequence,
                   all_legs: Sequence[Sequence[str]], legs: Sequence[str], sizes: Sequence[int | None]) -> str:
    """The fix for `ex` (legs `legs_of`) that broadcasts against neither by name nor by position
    with `legs`: name one leg as the other where they are one leg; give `ex` the other legs by
    name with repeat (every combination); for '*', the outer product as an einsum.

    >>> x = ir.Name("gamma")
    >>> broadcast_hint("'**'", x, ["h"], [2], [x, ir.Name("dist")], [["h"], ["t", "s"]], ["t", "s"], [3, None])
    "to combine every pair, give 'gamma' the other legs by name: write repeat(gamma, 'h -> t s h', s=SIZE)"
    """
    name = format_expr(ex)
    shown = repr(name) if isinstance(ex, ir.Name) else "it"
    hints = []
    for leg, n in zip(legs_of, sizes_of):
        same = [m for m, k in zip(legs, sizes) if m not in legs_of and leg not in legs and n is not None and k == n]
        if same:
            hints.append(f"if leg {leg!r} of {shown} is leg {same[0]!r} (both size {n}), give them one name")
            break
    target = [*legs, *(leg for leg in legs_of if leg not in legs)]
    unsized = "".join(f", {m}=SIZE" for m, k in zip(legs, sizes) if m not in legs_of and k is None)
    hints.append(f"to combine every pair, give {shown} the other legs by name: write "
                 f"repeat({name}, '{' '.join(legs_of)} -> {' '.join(target)}'{unsized})")
    if what == "'*'" and all(len(set(t)) == len(t) for t in all_legs):
        out = list(dict.fromkeys(leg for t in all_legs for leg in t))
        args = ", ".join(format_expr(e) for e in exprs)
        hints.append(f"for the outer product write einsum('{einsum_text(all_legs, out)}', {args})")
    return "; or ".join(hints)


def later_assignment(name: str, at: Span, bodies: Sequence[Sequence]) -> int | None:
    """The line of the first statement below `at` that assigns `name`, in the same file."""
    for body in bodies:
        for s in body:
            span = getattr(s, "span", None)
            if isinstance(s, ir.Assign) and name in s.targets and span is not None and span.file == at.file and span.line > at.line:
                return span.line
    return None

