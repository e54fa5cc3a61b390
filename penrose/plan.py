"""Contraction planning: an n-ary einsum becomes a sequence of one- and two-operand einsums.

One FLOP convention throughout, opt_einsum's (``helpers.flop_count``; every count here equals
``opt_einsum.contract_path(...)[1].opt_cost`` of the same path): a step costs the product of the
sizes of all the distinct legs of its operands, twice that when it sums a leg away. So
``ij,jk->ik`` costs 2·i·j·k (a multiply and an add per term), ``i,j->ij`` i·j, ``ij->i`` 2·i·j.
(For k operands at once, opt_einsum's rule is max(1, k - 1) + 1 times the product when summing:
the naive count, every operand in one step, uses that.)

The search, in that convention:

- up to ``EXACT_MAX`` operands, exhaustive: a dynamic programme over every subset of the
  operands and every split of it in two (outer products included), where an operand may first
  sum away legs that neither another operand nor the output carries (a one-operand step). No
  path opt_einsum can express costs less;
- beyond, the cheaper of opt_einsum's greedy path and its dynamic programming
  (``DynamicProgramming``, optimal among paths without outer products) — up to
  ``DP_MAX_OPERANDS`` operands and ``DP_BUDGET`` merges; random greedy with seeded tries stands
  in past either — then every subtree of the winner is re-planned exhaustively,
  ``POLISH_WINDOW`` tensors at a time, until nothing gets cheaper.

Legs are any strings (user words, synthetic names such as ``"...0"``), as many as wanted: each
step's einsum gets its own single letters (those of ``letters_for`` when the whole einsum has
at most 52 legs), so only a step with more than 52 distinct legs, what ``torch.einsum`` can
name, is refused, with ``TooManyLegs``. Plans are cached on terms, output and sizes.

>>> p = plan_einsum((("i", "j"), ("j", "k"), ("k", "l")), ("i", "l"), {"i": 100, "j": 2, "k": 100, "l": 2})
>>> [(s.operands, s.spec, s.flops) for s in p.steps]
[((2, 1), 'kl,jk->jl', 800), ((1, 0), 'jl,ij->il', 800)]
>>> p.opt_flops, p.naive_flops
(1600, 120000)
"""

from __future__ import annotations

import functools
import math
import random
import string
from dataclasses import dataclass

import opt_einsum

LETTERS = string.ascii_letters
EXACT_MAX = 10  # operands planned exhaustively (3^n splits: 2 ms at 8 operands, 20 ms at 10)
DP_MAX_OPERANDS = 40  # dynamic programming's time grows fast with operands even along a chain (5 s at 100)
DP_BUDGET = 1_000_000  # merges it may weigh (about 2 s) before random greedy stands in
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
    """The convention: the size of all legs involved, times max(1, n - 1) plus one when summing.

    >>> flop_count("ijk", True, 2, {"i": 2, "j": 3, "k": 5})
    60
    """
    return math.prod(max(1, sizes.get(l, 1)) for l in set(legs)) * (max(1, n_operands - 1) + bool(summed))


def _names(terms, out) -> list:
    """Every leg name, in the order the einsum first names it."""
    return list(dict.fromkeys(n for t in list(terms) + [out] for n in t))


def _assign(names, keep: dict | None = None) -> dict[str, str]:
    """Distinct single letters for names: those of `keep`, then names that are letters, then the rest."""
    if len(names) > len(LETTERS):
        raise TooManyLegs(
            f"a contraction step needs {len(names)} distinct legs; torch.einsum names at most {len(LETTERS)} (a-z, A-Z)"
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
    try:
        glob = letters_for(terms, out)  # letters shared by every step when the whole einsum fits
        spec = ",".join("".join(glob[l] for l in t) for t in terms) + "->" + "".join(glob[l] for l in out)
    except TooManyLegs:
        glob = None
        spec = ", ".join(" ".join(t) for t in terms) + " -> " + " ".join(out)
    steps = _steps(terms, out, names, inputs, output, dims, _search(inputs, output, dims), glob)
    naive = flop_count(names, bool(set(names) - set(out)), len(terms), sizes)
    largest = max((s.out_size for s in steps[:-1]), default=0)
    return Plan(spec, steps, naive, sum(s.flops for s in steps), largest)


# ---- building steps from a path ---------------------------------------------------------------


def _steps(terms, out, names, inputs, output, dims, path, glob) -> tuple[Step, ...]:
    """Steps (linear positions, per-step letters, flops) for an SSA path over the operands;
    each step keeps the letters of `glob` (the whole einsum's, when it has them)."""
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
    cost, path = min((path_flops(inputs, output, dims, p), p) for p in _heuristic_paths(inputs, output, dims))
    while True:  # polish until a pass finds nothing cheaper
        polished = _polish(inputs, output, dims, path)
        new = path_flops(inputs, output, dims, polished)
        if new >= cost:
            return path
        path, cost = polished, new


class _OverBudget(Exception):
    pass


def _dp_compare(budget: int):
    """opt_einsum's DynamicProgramming 'flops' comparison, refusing to run past `budget` merges.

    (Its ``minimize`` may be such a callable.) It weighs a merge by the size of all its legs;
    every merge it considers sums a leg unless a third tensor shares it, so that is this
    module's count halved; the greedy candidate and the polish cover the exceptions.
    """
    calls = [0]
    flops = opt_einsum.paths._dp_compare_flops

    def compare(*args):
        calls[0] += 1
        if calls[0] > budget:
            raise _OverBudget
        return flops(*args)

    return compare


def _heuristic_paths(inputs, output, dims):
    """SSA paths from opt_einsum: greedy, and dynamic programming up to DP_MAX_OPERANDS operands
    and DP_BUDGET merges, random greedy (seeded tries) in its stead beyond."""
    # legs as ints, not letters: sets of str iterate in an order PYTHONHASHSEED changes, and
    # opt_einsum breaks ties in set order, so letters would give another plan in each process
    sym_in, sym_out, size = list(inputs), output, dict(enumerate(dims))
    yield _linear_to_ssa(opt_einsum.paths.greedy(sym_in, sym_out, size), len(inputs))
    if len(inputs) <= DP_MAX_OPERANDS:
        try:
            dp = opt_einsum.paths.DynamicProgramming(minimize=_dp_compare(DP_BUDGET))
            yield _linear_to_ssa(dp(sym_in, sym_out, size), len(inputs))
            return
        except _OverBudget:
            pass
    state = random.getstate()  # opt_einsum seeds the global generator for each try
    try:
        tries = 128 if len(inputs) <= DP_MAX_OPERANDS else 16
        path = opt_einsum.RandomGreedy(max_repeats=tries)(sym_in, sym_out, size)
    finally:
        random.setstate(state)
    yield _linear_to_ssa(path, len(inputs))


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
        assert top is not None  # a subset of two or more operands splits at least once (a = low)
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
    """Re-plan the path's subtrees exhaustively, POLISH_WINDOW tensors at a time.

    The legs a subtree leaves do not depend on how it is contracted, so replacing the steps
    inside one window by the cheapest contraction of the window's tensors never costs more.
    (Iterative throughout: a long path is no deep recursion.)
    """
    n = len(inputs)
    kids = {n + k: tuple(ids) for k, ids in enumerate(path)}  # step id -> its operands' ids
    where: dict[int, int] = {}  # leg -> bitmap of the operands carrying it
    for j, t in enumerate(inputs):
        for leg in t:
            where[leg] = where.get(leg, 0) | (1 << j)
    mask = {j: 1 << j for j in range(n)}
    for v, ks in kids.items():
        mask[v] = functools.reduce(lambda a, k: a | mask[k], ks, 0)
    memo: dict[int, frozenset] = {}

    def legs(v: int) -> frozenset:  # what v leaves: an operand's own legs, or its contraction's
        if v < n:
            return inputs[v]
        m = mask[v]
        if m not in memo:
            carried = frozenset().union(*(inputs[j] for j in range(n) if m >> j & 1))
            memo[m] = frozenset(leg for leg in carried if leg in output or where[leg] & ~m)
        return memo[m]

    def cost(v: int) -> int:  # of step v itself
        union = frozenset().union(*map(legs, kids[v]))
        return _cost(union, bool(union - legs(v)), len(kids[v]), dims)

    next_id, replaced = n + len(path), set()
    for v in list(kids):  # children before parents
        if v in replaced:
            continue
        frontier, inner = list(kids[v]), [v]
        while True:
            grow = [f for f in frontier if f >= n and len(frontier) + len(kids[f]) - 1 <= POLISH_WINDOW]
            if not grow:
                break
            f = max(grow, key=cost)
            frontier.remove(f)
            frontier += kids[f]
            inner.append(f)
        if len(frontier) < 3:
            continue
        sub_in, sub_out = [legs(f) for f in frontier], legs(v)
        sub_path = _exact(sub_in, sub_out, dims)
        if path_flops(sub_in, sub_out, dims, sub_path) >= sum(map(cost, inner)):
            continue
        replaced.update(inner[1:])
        ids = list(frontier)
        for k, step in enumerate(sub_path):
            node = v if k == len(sub_path) - 1 else next_id
            if node != v:
                next_id += 1
            kids[node] = tuple(ids[i] for i in step)
            mask[node] = functools.reduce(lambda a, i: a | mask[i], kids[node], 0)
            ids.append(node)

    out: list[tuple[int, ...]] = []  # post-order from the root, renumbered as an SSA path
    new_id: dict[int, int] = {}
    stack = [(n + len(path) - 1, False)]
    while stack:
        v, done = stack.pop()
        if v < n:
            new_id[v] = v
        elif done:
            out.append(tuple(new_id[k] for k in kids[v]))
            new_id[v] = n + len(out) - 1
        else:
            stack.append((v, True))
            stack.extend((k, False) for k in reversed(kids[v]))
    return out
