"""The diagram of one einsum string: one input per operand, the einsum, its result. Torch-free.

    >>> print(einsum_text("bi,ijk,bj->bk", {"b": 4}))  # doctest: +NORMALIZE_WHITESPACE
    # The einsum 'bi,ijk,bj->bk' as a diagram (penrose render --einsum).
    # index legend: b index b, i index i, j index j, k index k
    dim b = 4, i, j, k
    input A[b, i]
    input B[i, j, k]
    input C[b, j]
    y = einsum('bi,ijk,bj->bk', A, B, C)
    output y
"""

from __future__ import annotations

import string

from penrose import ir
from penrose.errors import Span
from penrose.fmt import format_diagram
from penrose.tracing.errors import PenroseTraceError


def _refuse(spec: str, at: int, message: str):
    raise PenroseTraceError(f"--einsum {message}", Span("<einsum>", 1, at + 1, 1, at + 2, spec))


def einsum_text(spec: str, sizes: dict | None = None) -> str:
    """`.pen` text for `torch.einsum(spec, ...)` with one input per operand (A, B, C, ...).

    Letters are the legs (`sizes` gives some their sizes; the others are left free); a letter
    repeated in one term (a diagonal) gets a second dim of the same size for that operand's
    leg; the output is torch's (explicit after `->`, else the letters used once, sorted)."""
    sizes = dict(sizes or {})
    if not isinstance(spec, str) or not spec.strip():
        _refuse(str(spec), 0, "needs a spec such as 'bi,ij->bj'")
    for i, ch in enumerate(spec):
        if not (ch in string.ascii_letters or ch in ",-> "):
            what = "'...' (give every leg a letter)" if ch == "." else repr(ch)
            _refuse(spec, i, f"spec {spec!r}: {what} is not a letter, ',' or '->'")
    body = spec.replace(" ", "")
    if body.count("->") > 1:
        _refuse(spec, spec.rfind("->"), f"spec {spec!r} has a second '->'")
    lhs, arrow, rhs = body.partition("->")
    if "-" in lhs.replace("->", "") or ">" in lhs or "-" in rhs or ">" in rhs:
        _refuse(spec, max(spec.find("-"), spec.find(">")), f"spec {spec!r}: '-' and '>' only as '->'")
    terms = lhs.split(",")
    if any(not t for t in terms) and len(terms) > 1:
        _refuse(spec, spec.find(",,") if ",," in spec else spec.find(","), f"spec {spec!r} has an empty term")
    counts: dict = {}
    for t in terms:
        for ch in t:
            counts[ch] = counts.get(ch, 0) + 1
    if arrow:
        out = rhs
        for ch in out:
            if out.count(ch) > 1:
                _refuse(spec, spec.rfind(ch), f"spec {spec!r}: output letter {ch!r} is repeated")
            if ch not in counts:
                _refuse(spec, spec.rfind(ch), f"spec {spec!r}: output letter {ch!r} is in no operand")
    else:
        out = "".join(sorted(ch for ch, n in counts.items() if n == 1))
    for n, v in sizes.items():
        if isinstance(v, bool) or not float(v).is_integer() or v < 0:
            raise PenroseTraceError(f"--size {n}={v}: a leg's size is a whole number")
        sizes[n] = int(v)
    bad = [n for n in sizes if n not in counts]
    if bad:
        raise PenroseTraceError(f"--size {bad[0]}=...: {bad[0]!r} is no letter of {spec!r}")
    letters = list(dict.fromkeys("".join(terms)))
    extra: dict[str, list[str]] = {}  # letter -> dims for its second, third ... occurrence in one term
    legs_of = []
    for t in terms:
        seen: dict = {}
        legs = []
        for ch in t:
            k = seen.get(ch, 0)
            seen[ch] = k + 1
            if k == 0:
                legs.append(ch)
            else:
                name = f"{ch}{k + 1}"
                extra.setdefault(ch, []).append(name) if name not in extra.get(ch, []) else None
                legs.append(name)
        legs_of.append(legs)
    operand_names = _operand_names(len(terms), set(letters) | {n for v in extra.values() for n in v})
    dims: list[ir.Dim] = []
    for ch in letters:
        size = sizes.get(ch)
        for name in [ch] + extra.get(ch, []):
            dims.append(ir.Dim(name, ir.Number(size) if size is not None else None, grouped=bool(dims)))
    legend = ", ".join(f"{ch} index {ch}" for ch in letters)
    legend += "".join(f", {n} index {ch} (a diagonal's second leg)" for ch in letters for n in extra.get(ch, []))
    stmts = [
        ir.Comment(f"The einsum {spec!r} as a diagram (penrose render --einsum)."),
        ir.Comment(f"index legend: {legend}"),
        *dims,
    ]
    for name, legs in zip(operand_names, legs_of):
        stmts.append(ir.Tensor("input", name, tuple(legs)))
    shown = ",".join(terms) + "->" + out
    result = "y" if "y" not in letters else "result"
    stmts.append(ir.Assign((result,), ir.Call("einsum", (ir.String(shown),) + tuple(ir.Name(n) for n in operand_names))))
    stmts.append(ir.Output((result,)))
    return format_diagram(ir.Diagram(tuple(stmts)))


def _operand_names(n, taken):
    pool = [c for c in string.ascii_uppercase if c not in taken]
    if n <= len(pool):
        return pool[:n]
    return [f"T{i + 1}" for i in range(n)]
