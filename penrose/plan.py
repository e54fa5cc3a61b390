"""Contraction planning: n-ary einsums become pairwise contractions chosen by opt_einsum.

>>> p = plan_einsum((("i", "j"), ("j", "k"), ("k", "l")), ("i", "l"), {"i": 2, "j": 50, "k": 50, "l": 2})
>>> [s.spec for s in p.steps]
['jk,kl->jl', 'jl,ij->il']
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass

import opt_einsum

LETTERS = string.ascii_letters


@dataclass(frozen=True)
class Step:
    operands: tuple[int, ...]  # positions in the working list (popped, as opt_einsum does)
    spec: str  # the pairwise einsum in single letters
    flops: int
    out_size: int


@dataclass(frozen=True)
class Plan:
    spec: str  # the whole contraction in single letters
    steps: tuple[Step, ...]
    naive_flops: int
    opt_flops: int
    largest_intermediate: int

    @property
    def speedup(self) -> float:
        return self.naive_flops / max(1, self.opt_flops)


def letters_for(terms, out) -> dict[str, str]:
    """Map leg names (letters or words) to distinct single letters, keeping letters that already are."""
    names = []
    for t in list(terms) + [out]:
        for n in t:
            if n not in names:
                names.append(n)
    mapping, used = {}, set()
    for n in names:
        if len(n) == 1 and n in LETTERS and n not in used:
            mapping[n] = n
            used.add(n)
    free = (c for c in LETTERS if c not in used and c not in names)
    for n in names:
        if n not in mapping:
            mapping[n] = next(free)
    return mapping


def plan_einsum(terms, out, sizes: dict) -> Plan:
    """Plan a contraction for the given leg sizes (cached on its arguments)."""
    key = (tuple(tuple(t) for t in terms), tuple(out), tuple(sorted(sizes.items())))
    return _plan(*key)


@functools.lru_cache(maxsize=512)
def _plan(terms, out, size_items) -> Plan:
    sizes = dict(size_items)
    m = letters_for(terms, out)
    spec = ",".join("".join(m[l] for l in t) for t in terms) + "->" + "".join(m[l] for l in out)
    shapes = [tuple(max(1, sizes.get(l, 1)) for l in t) for t in terms]
    if len(terms) == 1:
        n = math.prod(shapes[0]) if shapes[0] else 1
        return Plan(spec, (Step((0,), spec, n, math.prod(sizes.get(l, 1) for l in out)),), n, n, 0)
    _, info = opt_einsum.contract_path(spec, *shapes, shapes=True, optimize="optimal" if len(terms) <= 4 else "auto")
    steps = []
    for contraction in info.contraction_list:
        inds, _, eq = contraction[0], contraction[1], contraction[2]
        lhs, rhs = eq.split("->")
        size_of = {m[l]: max(1, sizes.get(l, 1)) for t in terms for l in t}
        all_letters = set(lhs.replace(",", ""))
        flops = math.prod(size_of[c] for c in all_letters) * max(1, len(lhs.split(",")) - 1)
        out_size = math.prod(size_of[c] for c in rhs) if rhs else 1
        steps.append(Step(tuple(inds), eq, int(flops), int(out_size)))
    largest = max((s.out_size for s in steps[:-1]), default=0)
    return Plan(spec, tuple(steps), int(info.naive_cost), int(info.opt_cost), int(largest))
