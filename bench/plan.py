"""Contraction plans: penrose's plan cost over the best of opt_einsum's strategies.

    python bench/plan.py            # every network, 5-30 operands
    python bench/plan.py --small    # the networks up to 12 operands (PENROSE_REDUCED=1 does the same)

For a fixed set of networks (chains, MPS overlaps, stars, trees, rings, grids, random regular
graphs with fixed seeds, hyperedges, and shapes from Steerling-8B), prints penrose's plan cost,
the cost of each opt_einsum strategy that is feasible at that size (optimal, branch-all,
branch-2, dp, dp with outer products, greedy, random-greedy with 128 fixed-seed repeats,
auto-hq), each as a ratio penrose / strategy, and penrose / best. Every cost is opt_einsum's
``PathInfo.opt_cost`` — the convention of penrose.plan, checked here: penrose's own count must
equal opt_einsum's count of the same path. Target: 1.00 on every network; exits 1 when any
ratio to the best exceeds 1 + 1e-9 or a count disagrees.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from pathlib import Path

import opt_einsum
import opt_einsum.path_random
import opt_einsum.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from penrose import plan as planner  # noqa: E402

# strategy -> the largest operand count it runs at (beyond, its search takes too long)
STRATEGIES = {
    "optimal": 8,
    "branch-all": 8,
    "branch-2": 14,
    "dp": 30,
    "dp-outer": 10,
    "greedy": 30,
    "random-greedy-128": 30,
    "auto-hq": 30,
}


# ---- the networks: (name, terms, output legs, sizes), legs are words --------------------------


def chain(n, seed):
    rng = random.Random(seed)
    bonds = [f"b{i}" for i in range(n + 1)]
    terms = [(bonds[i], bonds[i + 1]) for i in range(n)]
    return terms, (bonds[0], bonds[-1]), {b: rng.choice([2, 4, 8, 16, 32, 64, 128]) for b in bonds}


def mps_overlap(length, seed):
    """<bra|ket> of two open-boundary MPS: a ladder of 2·length tensors."""
    rng = random.Random(seed)
    terms, sizes = [], {}
    for i in range(length):
        for side in "ak":
            legs = [f"p{i}"]
            if i > 0:
                legs.insert(0, f"{side}{i - 1}")
            if i < length - 1:
                legs.append(f"{side}{i}")
            terms.append(tuple(legs))
        sizes[f"p{i}"] = 2
        sizes[f"a{i}"] = rng.choice([4, 8, 16])
        sizes[f"k{i}"] = rng.choice([4, 8, 16])
    return terms, (), sizes


def star(arms, arm_length, seed):
    """A hub with one leg per arm; each arm a chain of matrices ending in an open leg."""
    rng = random.Random(seed)
    hub = tuple(f"h{a}" for a in range(arms))
    terms, sizes, out = [hub], {h: rng.choice([4, 8, 16]) for h in hub}, []
    for a in range(arms):
        prev = f"h{a}"
        for j in range(arm_length):
            nxt = f"x{a}_{j}"
            terms.append((prev, nxt))
            sizes[nxt] = rng.choice([2, 8, 32, 128])
            prev = nxt
        out.append(prev)
    return terms, tuple(out), sizes


def tree(depth, seed):
    """A binary tree tensor network: every node a 3-leg tensor, the leaves' legs open."""
    rng = random.Random(seed)
    terms, sizes, out = [], {}, []

    def node(name, level):
        up = f"u{name}"
        sizes[up] = rng.choice([2, 4, 8, 16])
        if level == depth:
            terms.append((up, f"o{name}"))
            sizes[f"o{name}"] = 2
            out.append(f"o{name}")
            return up
        left, right = node(name + "0", level + 1), node(name + "1", level + 1)
        terms.append((up, left, right))
        return up

    root = node("r", 0)
    terms.append((root,))
    return terms, tuple(out[:2]), sizes


def ring(n, seed):
    rng = random.Random(seed)
    bonds = [f"r{i}" for i in range(n)]
    terms = [(bonds[i], f"s{i}", bonds[(i + 1) % n]) for i in range(n)]
    sizes = {b: rng.choice([2, 4, 8, 16]) for b in bonds}
    sizes.update({f"s{i}": rng.choice([1, 2, 3]) for i in range(n)})
    return terms, (), sizes


def grid(rows, cols, seed):
    """A PEPS-like square lattice: a tensor per site, a bond per neighbour pair, summed."""
    rng = random.Random(seed)
    terms, sizes = [], {}
    for r in range(rows):
        for c in range(cols):
            legs = []
            if r > 0:
                legs.append(f"v{r - 1}_{c}")
            if c > 0:
                legs.append(f"w{r}_{c - 1}")
            if r < rows - 1:
                legs.append(f"v{r}_{c}")
            if c < cols - 1:
                legs.append(f"w{r}_{c}")
            terms.append(tuple(legs))
            for leg in legs:
                sizes.setdefault(leg, rng.choice([2, 3, 4]))
    return terms, (), sizes


def random_graph(n, seed):
    eq, _, size_dict = opt_einsum.testing.rand_equation(n, 3, n_out=2, d_min=2, d_max=8, seed=seed, return_size_dict=True)
    lhs, rhs = eq.split("->")
    word = {ch: f"l{i}" for i, ch in enumerate(sorted(size_dict))}
    terms = [tuple(word[ch] for ch in t) for t in lhs.split(",")]
    return terms, tuple(word[ch] for ch in rhs), {word[ch]: s for ch, s in size_dict.items()}


def batched_chain(n, seed):
    """A chain whose every tensor also carries a shared batch leg (a hyperedge kept to the end)."""
    terms, out, sizes = chain(n, seed)
    sizes["batch"] = 16
    return [("batch",) + t for t in terms], ("batch",) + out, sizes


def outer_first():
    """Small vectors worth combining by an outer product before meeting the big tensor."""
    terms = [("i",), ("j",), ("i", "j", "k"), ("k", "l"), ("l",)]
    return terms, (), {"i": 3, "j": 4, "k": 256, "l": 64}


# Steerling-8B sizes (zoo/steerling/dims.pen): t tokens (512 here), e 4096, c 33,732 known and
# u 101,196 unknown concepts, j 256 the unknown head's factorisation rank, v 100,281 words,
# g 4 key/value heads, r 8 query heads per key/value head, d 128.
STEERLING = {"t": 512, "s": 512, "e": 4096, "e2": 4096, "c": 33732, "u": 101196, "j": 256, "v": 100281,
             "g": 4, "r": 8, "d": 128, "dv": 128, "f": 16384}


def steerling_heads():
    """Hidden states through the factorised unknown head, its concept table, and the unembedding."""
    terms = [("t", "e"), ("e", "j"), ("j", "u"), ("u", "e2"), ("e2", "f"), ("v", "f")]
    return terms, ("t", "v"), STEERLING


def steerling_linear_attention():
    """Grouped-query attention without its softmax: queries, keys, values and the projection."""
    terms = [("t", "e"), ("e", "g", "r", "d"), ("s", "e"), ("e", "g", "d"), ("s", "e2"), ("e2", "g", "dv"), ("g", "r", "dv", "f")]
    return terms, ("t", "f"), STEERLING


def steerling_attribution():
    """Gradient × input through the known head: one-hot tokens to concepts to words, a per-token score."""
    terms = [("t", "v"), ("v", "e"), ("c", "e"), ("c", "e2"), ("f", "e2"), ("t", "f")]
    sizes = dict(STEERLING, f=100281)
    return terms, ("t",), sizes


def networks(small: bool):
    nets = [
        ("chain-5", *chain(5, 1)),
        ("chain-8", *chain(8, 2)),
        ("chain-12", *chain(12, 3)),
        ("chain-20", *chain(20, 4)),
        ("chain-30", *chain(30, 5)),
        ("mps-overlap-8", *mps_overlap(4, 6)),
        ("mps-overlap-16", *mps_overlap(8, 7)),
        ("mps-overlap-30", *mps_overlap(15, 8)),
        ("star-6", *star(5, 1, 9)),
        ("star-11", *star(5, 2, 10)),
        ("star-19", *star(6, 3, 11)),
        ("tree-8", *tree(2, 12)),
        ("tree-16", *tree(3, 13)),
        ("ring-6", *ring(6, 15)),
        ("ring-12", *ring(12, 16)),
        ("ring-20", *ring(20, 17)),
        ("grid-2x3", *grid(2, 3, 18)),
        ("grid-3x3", *grid(3, 3, 19)),
        ("grid-3x4", *grid(3, 4, 20)),
        ("grid-4x4", *grid(4, 4, 21)),
        ("grid-4x5", *grid(4, 5, 22)),
        ("grid-5x6", *grid(5, 6, 23)),
        ("random-8", *random_graph(8, 24)),
        ("random-12", *random_graph(12, 25)),
        ("random-16", *random_graph(16, 26)),
        ("random-20", *random_graph(20, 27)),
        ("random-25", *random_graph(25, 28)),
        ("random-30", *random_graph(30, 29)),
        ("batched-chain-8", *batched_chain(8, 30)),
        ("batched-chain-16", *batched_chain(16, 31)),
        ("outer-first-5", *outer_first()),
        ("steerling-heads-6", *steerling_heads()),
        ("steerling-linear-attention-7", *steerling_linear_attention()),
        ("steerling-attribution-6", *steerling_attribution()),
    ]
    return [n for n in nets if not small or len(n[1]) <= 12]


# ---- costs ------------------------------------------------------------------------------------


def equation(terms, out, sizes):
    """The network as an opt_einsum equation over its own symbols, and the operand shapes."""
    legs = list(dict.fromkeys([l for t in terms for l in t] + list(out)))
    sym = {l: opt_einsum.get_symbol(i) for i, l in enumerate(legs)}
    eq = ",".join("".join(sym[l] for l in t) for t in terms) + "->" + "".join(sym[l] for l in out)
    return eq, [tuple(sizes[l] for l in t) for t in terms]


STRATEGY_FNS = {
    "optimal": opt_einsum.paths.optimal,
    "branch-all": opt_einsum.paths.branch_all,
    "branch-2": opt_einsum.paths.branch_2,
    "dp": opt_einsum.paths.dynamic_programming,
    "dp-outer": functools.partial(opt_einsum.paths.dynamic_programming, search_outer=True),
    "greedy": opt_einsum.paths.greedy,
    "random-greedy-128": opt_einsum.path_random.random_greedy_128,
    "auto-hq": opt_einsum.paths.auto_hq,
}


def strategy_cost(name, terms, out, sizes, eq, shapes) -> int:
    """opt_einsum's count of the path a strategy finds. The strategy sees legs as ints: on sets
    of letters its ties, so random greedy's result, would change with PYTHONHASHSEED."""
    legs = list(dict.fromkeys([l for t in terms for l in t] + list(out)))
    num = {l: i for i, l in enumerate(legs)}
    path = STRATEGY_FNS[name]([frozenset(num[l] for l in t) for t in terms], frozenset(num[l] for l in out), {num[l]: sizes[l] for l in legs})
    return int(opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=path)[1].opt_cost)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="only the networks up to 12 operands")
    args = ap.parse_args(argv)
    small = args.small or os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
    cols = list(STRATEGIES)
    print(f"opt_einsum {opt_einsum.__version__}; cost = opt_einsum's PathInfo.opt_cost (penrose.plan's FLOP convention)")
    print("each column: penrose cost / that strategy's cost ('-' where it is not run at that size)")
    head = f"{'network':<30} {'n':>3} {'penrose flops':>14} {'plan ms':>8}  " + " ".join(f"{c:>8.8}" for c in cols) + "   vs best"
    print(head)
    worst, bad, total_ms = 0.0, [], 0.0
    for name, terms, out, sizes in networks(small):
        eq, shapes = equation(terms, out, sizes)
        planner._plan.cache_clear()
        t0 = time.perf_counter()
        p = planner.plan_einsum(terms, out, sizes)
        ms = (time.perf_counter() - t0) * 1e3
        total_ms += ms
        ours = p.opt_flops
        check = int(opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=[s.operands for s in p.steps])[1].opt_cost)
        if check != ours:
            bad.append(f"{name}: penrose counts {ours:,} flops, opt_einsum counts {check:,} for the same path")
        costs = {c: strategy_cost(c, terms, out, sizes, eq, shapes) for c in cols if len(terms) <= STRATEGIES[c]}
        best = min(costs.values())
        ratio = ours / best
        worst = max(worst, ratio)
        cells = " ".join(f"{ours / costs[c]:>8.2f}" if c in costs else f"{'-':>8}" for c in cols)
        print(f"{name:<30} {len(terms):>3} {ours:>14.3e} {ms:>8.1f}  {cells}   {ratio:>7.2f}", flush=True)
        if ratio > 1.0 + 1e-9:
            bad.append(f"{name}: penrose {ours:,} flops > best {best:,}")
    print(f"worst ratio to the best {worst:.2f}; planning took {total_ms:.0f} ms in all")
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
