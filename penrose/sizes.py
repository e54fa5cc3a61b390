"""Size classes: a union-find over the legs that must have one size.

The checker gives every leg it meets a class (`new`) and joins the classes of legs that are
bound together (`unify`: an einsum letter, aligned legs, a block argument). A class may know its
size and where that size came from; joining two classes that know different sizes is a
`PenroseCheckError` naming both sizes and both places. A class is `fixed` when a param or buffer
carries it (its size is built into the module) and `fed` when a top-level input carries it; a
class that is fed and not fixed is `free`: the compiled module reads its size from the inputs.

    >>> from penrose.errors import Span
    >>> S = Sizes()
    >>> a, b = S.new("t", 4, ("dim 't'", Span())), S.new("p", None, ("dim 'p'", Span()))
    >>> S.unify(a, b, ("an einsum", Span()))
    >>> S.size(b)
    4

Imports only `penrose.errors`.
"""

from __future__ import annotations

from penrose.errors import PenroseCheckError, Span


class Sizes:
    """Union-find over size classes; each class may know its size and where it came from."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.value: list[int | None] = []
        self.origin: list[tuple[str, Span]] = []
        self.label: list[str] = []
        self.fixed: list[bool] = []  # carried by a param or buffer: never read at run time
        self.fed: list[bool] = []  # carried by a top-level input

    def new(self, label: str, value: int | None, origin: tuple[str, Span], fixed: bool = False, fed: bool = False) -> int:
        self.parent.append(len(self.parent))
        self.value.append(value)
        self.origin.append(origin)
        self.label.append(label)
        self.fixed.append(fixed)
        self.fed.append(fed)
        return len(self.parent) - 1

    def find(self, c: int) -> int:
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def size(self, c: int) -> int | None:
        return self.value[self.find(c)]

    def is_free(self, c: int) -> bool:
        r = self.find(c)
        return self.fed[r] and not self.fixed[r]

    def mark(self, c: int, fixed: bool = False, fed: bool = False) -> None:
        r = self.find(c)
        self.fixed[r] = self.fixed[r] or fixed
        self.fed[r] = self.fed[r] or fed

    def unify(self, a: int, b: int, here: tuple[str, Span]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        va, vb = self.value[ra], self.value[rb]
        if va is not None and vb is not None and va != vb:
            (wa, sa), (wb, sb) = self.origin[ra], self.origin[rb]
            what, span = here
            raise PenroseCheckError(
                f"size conflict in {what}: {wa} has size {va} but {wb} has size {vb}",
                span,
                notes=tuple((f"{w} gets size {v} here", s) for w, v, s in ((wa, va, sa), (wb, vb, sb)) if s.line and s != span),
            )
        if va is None:
            ra, rb = rb, ra  # keep the root that knows its size
        self.parent[rb] = ra
        self.fixed[ra] = self.fixed[ra] or self.fixed[rb]
        self.fed[ra] = self.fed[ra] or self.fed[rb]
