"""Contraction planning: an n-ary einsum becomes a sequence of pairwise contractions.

One FLOP convention throughout (opt_einsum's ``helpers.flop_count``, so every number here equals
``opt_einsum.contract_path(...)[1].opt_cost`` for the same path): a step contracting k operands
(k = 1 or 2) costs the product of the sizes of all the distinct legs its operands carry, times
``max(1, k - 1)``, plus one more times that product when the step sums a leg away.
A matrix product ``ij,jk->ik`` thus costs 2·i·j·k, an outer product ``i,j->ij`` i·j.

The search, for that convention:

- up to ``EXACT_MAX`` operands, exhaustively: a dynamic programme over every subset of the
  operands and every split of it in two (outer products included), where an operand may first
  sum away the legs no other operand and not the output carry (a one-operand step). This is
  optimal over every path opt_einsum can express;
- beyond, the best under the same convention of opt_einsum's dynamic programming
  (``DynamicProgramming(minimize="flops")``, exact among paths without outer products) and its
  greedy path, whose subtrees are then re-planned exhaustively, ``EXACT_MAX`` operands at a time.

Legs are any strings (user words, synthetic names such as ``"...0"``), as many as wanted; each
step's einsum gets its own single letters, so only one step with more than 52 distinct legs
(what ``torch.einsum`` can name) is refused, with ``TooManyLegs``. Plans are cached.

>>> p = plan_einsum((("i", "j"), ("j", "k"), ("k", "l")), ("i", "l"), {"i": 100, "j": 2, "k": 100, "l": 2})
>>> [(s.operands, s.spec, s.flops) for s in p.steps]
[((2, 1), 'kl,jk->jl', 800), ((1, 0), 'jl,ij->il', 800)]
>>> p.opt_flops, p.naive_flops
(1600, 120000)
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass

import opt_einsum

LETTERS = string.ascii_letters
EXACT_MAX = 10  # operands planned exhaustively (3^n splits: 2 ms at 8 operands, 20 ms at 10)
POLISH_WINDOW = 8  # inputs of the windows re-planned exhaustively in a longer heuristic path


class TooManyLegs(ValueError):
    """One contraction step needs more distinct legs than torch.einsum has letters (52)."""


@dataclass(frozen=True)
class Step:
    operands: tuple[int, ...]  # positions in the working list, descending: pop them in this order
    spec: str  # this step's einsum, in its own single letters; the result is appended to the list
    flops: int
    out_size: int
    legs: tuple[str, ...] = ()  # the result's legs (leg names)
    summed: tuple[str, ...] = ()  # the legs this step sums away (leg names)


@dataclass(frozen=True)
class Plan:
    spec: str  # the whole contraction in single letters, or in spaced words past 52 legs
    steps: tuple[Step, ...]
    naive_flops: int  # one einsum over every operand at once, same convention
    opt_flops: int  # the sum of the steps' flops
    largest_intermediate: int

    @property
    def speedup(self) -> float:
        return self.naive_flops / max(1, self.opt_flops)


def flop_count(legs, summed: bool, n_operands: int, sizes: dict) -> int:
    """The convention: size of all legs involved, times max(1, n - 1), plus one when summing.

    >>> flop_count("ijk", True, 2, {"i": 2, "j": 3, "k": 5})
    60
    """
    return math.prod(max(1, sizes.get(l, 1)) for l in set(legs)) * (max(1, n_operands - 1) + bool(summed))


def _names(terms, out) -> list:
    names = []
    for t in list(terms) + [out]:
        for n in t:
            if n not in names:
                names.append(n)
    return names


def _assign(names, keep: dict | None = None) -> dict[str, str]:
    """Distinct single letters for names: those of `keep`, then names that are letters, then the rest."""
    if len(names) > len(LETTERS):
        raise TooManyLegs(
            f"a contraction step needs {len(names)} distinct legs, more than the {len(LETTERS)} letters "
            "(a-z, A-Z) torch.einsum can name; split the contraction"
        )
    mapping, used = {}, set()
    if keep:
        for n in names:
            if n in keep:
                mapping[n] = keep[n]
                used.add(keep[n])
    for n in names:
        if n not in mapping and len(n) == 1 and n in LETTERS and n not in used:
            mapping[n] = n
            used.add(n)
    free = (c for c in LETTERS if c not in used)
    for n in names:
        if n not in mapping:
            mapping[n] = next(free)
    return mapping


def letters_for(terms, out) -> dict[str, str]:
    """Map leg names (letters or words) to distinct single letters, keeping letters that already are.

    Raises TooManyLegs past 52 names (then plan_einsum gives each step its own letters).

    >>> letters_for((("tok", "e"), ("e", "f")), ("tok", "f"))
    {'e': 'e', 'f': 'f', 'tok': 'a'}
    """
    return _assign(_names(terms, out))


def plan_einsum(terms, out, sizes: dict) -> Plan:
    """Plan a contraction for the given leg sizes (cached on its arguments).

    >>> p = plan_einsum((("a",), ("a", "b"), ("b",)), (), {"a": 3, "b": 4})
    >>> [(s.operands, s.spec, s.flops) for s in p.steps]
    [((2, 1), 'b,ab->a', 24), ((1, 0), 'a,a->', 6)]
    """
    terms = tuple(tuple(t) for t in terms)
    out = tuple(out)
    present = set(out).union(*terms)
    return _plan(terms, out, tuple(sorted((l, max(1, int(sizes.get(l, 1)))) for l in present)))


@functools.lru_cache(maxsize=1024)
def _plan(terms, out, size_items) -> Plan:
    sizes = dict(size_items)
    names = _names(terms, out)
    ids = {n: i for i, n in enumerate(names)}
    inputs = [frozenset(ids[l] for l in t) for t in terms]
    output = frozenset(ids[l] for l in out)
    dims = [sizes[n] for n in names]
    path = _search(inputs, output, dims)
    steps = _steps(terms, out, names, inputs, output, dims, path)
    try:
        glob = letters_for(terms, out)
        spec = ",".join("".join(glob[l] for l in t) for t in terms) + "->" + "".join(glob[l] for l in out)
    except TooManyLegs:
        spec = ", ".join(" ".join(t) for t in terms) + " -> " + " ".join(out)
    naive = flop_count(names, bool(set(names) - set(out)), len(terms), sizes)
    largest = max((s.out_size for s in steps[:-1]), default=0)
    return Plan(spec, steps, naive, sum(s.flops for s in steps), largest)


# ---- building steps from a path ---------------------------------------------------------------


def _steps(terms, out, names, inputs, output, dims, path) -> tuple[Step, ...]:
    """Steps (linear positions, per-step letters, flops) for an SSA path over the operands."""
    try:
        glob = letters_for(terms, out)  # letters shared by every step when the whole einsum fits
    except TooManyLegs:
        glob = None
    ids = {n: i for i, n in enumerate(names)}
    legs = [tuple(t) for t in terms]  # leg names of each SSA value, in spec order
    sets = list(inputs)
    work = list(range(len(terms)))  # SSA ids in the working list
    steps = []
    for k, ssa in enumerate(path):
        last = k == len(path) - 1
        pos = sorted((work.index(i) for i in ssa), reverse=True)
        picked = [work[p] for p in pos]
        for p in pos:
            work.pop(p)
        union = frozenset().union(*(sets[i] for i in picked))
        keep = output.union(*(sets[i] for i in work))
        res = union & keep
        if last:
            assert res == output, (path, res, output)
            res_legs = tuple(out)
        else:
            res_legs = tuple(n for n in names if ids[n] in res)  # in the order the einsum first names them
        step_names = list(dict.fromkeys([l for i in picked for l in legs[i]] + list(res_legs)))
        m = _assign(step_names, glob)
        spec = ",".join("".join(m[l] for l in legs[i]) for i in picked) + "->" + "".join(m[l] for l in res_legs)
        flops = _cost(union, bool(union - res), len(picked), dims)
        summed = tuple(n for n in step_names if ids[n] in union - res)
        steps.append(Step(tuple(pos), spec, flops, math.prod(dims[i] for i in res), res_legs, summed))
        sets.append(res)
        legs.append(res_legs)
        work.append(len(sets) - 1)
    return tuple(steps)


def _cost(union, summed: bool, n_operands: int, dims) -> int:
    return math.prod(dims[i] for i in union) * (max(1, n_operands - 1) + summed)


def path_flops(inputs, output, dims, path) -> int:
    """The cost of an SSA path (tuples of SSA ids; a new id per step) under the convention."""
    sets = list(inputs)
    alive = set(range(len(sets)))
    total = 0
    for ids in path:
        alive -= set(ids)
        union = frozenset().union(*(sets[i] for i in ids))
        res = union & output.union(*(sets[i] for i in alive))
        total += _cost(union, bool(union - res), len(ids), dims)
        sets.append(res)
        alive.add(len(sets) - 1)
    return total


# ---- the search -------------------------------------------------------------------------------


def _search(inputs, output, dims) -> list[tuple[int, ...]]:
    """An SSA path: tuples of SSA ids (operands first, then one new id per step)."""
    n = len(inputs)
    if n == 1:
        return [(0,)]
    if n <= EXACT_MAX:
        return _exact(inputs, output, dims)
    best = None
    for path in _heuristic_paths(inputs, output, dims):
        cost = path_flops(inputs, output, dims, path)
        while True:  # polish until a pass finds nothing cheaper
            polished = _polish(inputs, output, dims, path)
            new = path_flops(inputs, output, dims, polished)
            if new >= cost:
                break
            path, cost = polished, new
        if best is None or cost < best[0]:
            best = (cost, path)
    return best[1]


def _heuristic_paths(inputs, output, dims):
    """opt_einsum's dynamic programming and greedy paths, as SSA paths."""
    letters = [opt_einsum.get_symbol(i) for i in range(len(dims))]
    sym_in = [frozenset(letters[i] for i in t) for t in inputs]
    sym_out = frozenset(letters[i] for i in output)
    size = {letters[i]: d for i, d in enumerate(dims)}
    for fn in (opt_einsum.paths.DynamicProgramming(minimize="flops"), opt_einsum.paths.greedy):
        yield _linear_to_ssa(fn(sym_in, sym_out, size), len(inputs))


def _linear_to_ssa(path, n) -> list[tuple[int, ...]]:
    work = list(range(n))
    nxt = n
    ssa = []
    for ids in path:
        picked = tuple(work[i] for i in ids)
        for i in sorted(ids, reverse=True):
            work.pop(i)
        ssa.append(picked)
        work.append(nxt)
        nxt += 1
    return ssa


def _exact(inputs, output, dims) -> list[tuple[int, ...]]:
    """The cheapest path: every subset, every split in two, each operand reduced first or not."""
    n = len(inputs)
    full = (1 << n) - 1
    bit = {}
    for t in inputs:
        for i in t:
            bit.setdefault(i, 1 << i)
    term = [sum(1 << i for i in t) for t in inputs]
    out = sum(1 << i for i in output)
    labels = [0] * (1 << n)  # legs carried by the operands of each subset
    for s in range(1, 1 << n):
        low = s & -s
        labels[s] = labels[s ^ low] | term[low.bit_length() - 1]
    size_cache: dict[int, int] = {}

    def size(mask: int) -> int:
        v = size_cache.get(mask)
        if v is None:
            v = 1
            m = mask
            while m:
                low = m & -m
                v *= dims[low.bit_length() - 1]
                m ^= low
            size_cache[mask] = v
        return v

    def result(s: int) -> int:  # the legs the contraction of subset s keeps
        return labels[s] & (out | labels[full ^ s])

    # each operand: ((extra cost, legs it enters its first pair with), ...) — raw, or reduced first
    options = {}
    for j in range(n):
        raw, red = term[j], result(1 << j)
        options[1 << j] = ((0, raw),) if raw == red else ((0, raw), (2 * size(raw), red))
    best: dict[int, tuple] = {1 << j: (0, None) for j in range(n)}
    res_of = {}
    for s in range(1, full + 1):
        if s & (s - 1) == 0:
            continue
        keep = result(s)
        res_of[s] = keep
        low = s & -s
        rest = s ^ low
        top = None
        # splits (a, s ^ a) with a holding the lowest operand of s: each split seen once
        sub = rest
        while True:
            a = sub | low
            b = s ^ a
            if b:
                base = best[a][0] + best[b][0]
                if top is None or base < top[0]:
                    oa = options.get(a) or ((0, res_of[a]),)
                    ob = options.get(b) or ((0, res_of[b]),)
                    for ia, (ca, la) in enumerate(oa):
                        for ib, (cb, lb) in enumerate(ob):
                            u = la | lb
                            c = base + ca + cb + size(u) * (2 if u & ~keep else 1)
                            if top is None or c < top[0]:
                                top = (c, (a, b, ia, ib))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        best[s] = top

    path: list[tuple[int, ...]] = []
    next_id = [n]

    def emit(s: int, reduce_first: bool = False) -> int:
        if s & (s - 1) == 0:
            j = s.bit_length() - 1
            if reduce_first:
                path.append((j,))
                next_id[0] += 1
                return next_id[0] - 1
            return j
        a, b, ia, ib = best[s][1]
        x, y = emit(a, ia == 1), emit(b, ib == 1)
        path.append((x, y))
        next_id[0] += 1
        return next_id[0] - 1

    emit(full)
    return path


def _polish(inputs, output, dims, path) -> list[tuple[int, ...]]:
    """Re-plan the path's subtrees exhaustively, POLISH_WINDOW of their inputs at a time.

    A subtree's result legs do not depend on how it is contracted, so replacing the contraction
    inside one window by the cheapest one of the same tensors never costs more.
    """
    n = len(inputs)
    tree = _tree(path, n)
    count: dict[int, int] = {}
    for t in inputs:
        for leg in t:
            count[leg] = count.get(leg, 0) + 1

    memo: dict[frozenset, frozenset] = {}

    def leaves(t) -> frozenset:
        return frozenset((t,)) if isinstance(t, int) else frozenset().union(*map(leaves, t))

    def legs(t) -> frozenset:  # the legs tree t leaves: an operand's own, or its contraction's
        if isinstance(t, int):
            return inputs[t]
        ls = leaves(t)
        if ls not in memo:
            inside: dict[int, int] = {}
            for j in ls:
                for leg in inputs[j]:
                    inside[leg] = inside.get(leg, 0) + 1
            memo[ls] = frozenset(leg for leg, k in inside.items() if leg in output or k < count[leg])
        return memo[ls]

    def cost(t) -> int:  # of the step at the top of t
        union = frozenset().union(*map(legs, t))
        return _cost(union, bool(union - legs(t)), len(t), dims)

    def polish(t):
        if isinstance(t, int):
            return t
        t = tuple(polish(c) for c in t)
        frontier = [t]
        while True:
            inner = [f for f in frontier if not isinstance(f, int)]
            grow = [f for f in inner if len(frontier) + len(f) - 1 <= POLISH_WINDOW]
            if not grow:
                break
            f = max(grow, key=cost)
            i = next(k for k, g in enumerate(frontier) if g is f)
            frontier[i : i + 1] = list(f)
        if len(frontier) < 3:
            return t
        old = sum(cost(f) for f in _internal(t, frontier))
        sub_in = [legs(f) for f in frontier]
        sub_path = _exact(sub_in, legs(t), dims)
        new = path_flops(sub_in, legs(t), dims, sub_path)
        if new >= old:
            return t
        sub = _tree(sub_path, len(frontier))
        return _substitute(sub, frontier)

    return _flatten(polish(tree), n)


def _internal(t, frontier):
    """The steps of tree t above its frontier."""
    if any(t == f if isinstance(t, int) else t is f for f in frontier):
        return []
    return [t] + [x for c in t for x in _internal(c, frontier)]


def _substitute(sub, frontier):
    if isinstance(sub, int):
        return frontier[sub]
    return tuple(_substitute(c, frontier) for c in sub)


def _tree(path, n):
    """Nested tuples (one per step, of its operands' trees) from an SSA path; ints are operands."""
    nodes = list(range(n))
    for ids in path:
        nodes.append(tuple(nodes[i] for i in ids))
    return nodes[-1]


def _flatten(tree, n) -> list[tuple[int, ...]]:
    path: list[tuple[int, ...]] = []

    def emit(t) -> int:
        if isinstance(t, int):
            return t
        ids = tuple(emit(c) for c in t)
        path.append(ids)
        return n + len(path) - 1

    emit(tree)
    return path
