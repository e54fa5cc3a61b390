"""A concept graph learned from data: greedy hill climbing on the BIC score over discrete concepts.

`learn_structure(c, names)` returns `{child: (parents, …)}`, the form the graph models take
(`ConceptGraphModel(parents=learn_structure(c, names), …)`). The score of a graph G over the
columns of `c` (n rows, each column a discrete variable with r_i observed states) is the
decomposable BIC of a discrete Bayesian network (Schwarz 1978; Heckerman, Geiger and Chickering
1995):

    BIC(G) = Σ_i [ Σ_j Σ_s N_ijs log(N_ijs / N_ij) − (log n / 2) · q_i (r_i − 1) ]

with j running over the q_i configurations of i's parents (q_i = Π r_parent), N_ijs
the rows where i is in state s and its parents in configuration j, N_ij = Σ_s N_ijs. The search
starts from the empty graph and takes, while one raises the score, the best single move: add,
delete or reverse an edge, keeping the graph acyclic and every node under `max_parents` parents
(the classic hill climbing of Heckerman et al. 1995; `bnlearn`'s `hc`, `pgmpy`'s
`HillClimbSearch` with `BIC`). The data identify a graph up to its Markov equivalence class: edges
inside a class (not part of a v-structure's compelled orientation) may come out either way.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["bic_score", "learn_structure"]


def _codes(data: Any) -> np.ndarray:
    """Each column as integer state codes 0..r−1."""
    a = np.asarray(data.detach().cpu().numpy() if hasattr(data, "detach") else data)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"learn_structure needs a 2-d array of n ≥ 2 rows, one column per variable; got shape {a.shape}")
    if not np.isfinite(a.astype(float)).all():
        raise ValueError("learn_structure: the data hold NaN or infinite values")
    cols = []
    for i in range(a.shape[1]):
        _, inverse = np.unique(a[:, i], return_inverse=True)
        cols.append(inverse.reshape(-1))
    return np.stack(cols, 1)


def _family_score(codes: np.ndarray, states: Sequence[int], child: int, parents: Sequence[int]) -> float:
    """One node's BIC term: the log-likelihood of its column given its parents' columns, less
    (log n / 2) · q (r − 1)."""
    n = codes.shape[0]
    r = states[child]
    config = np.zeros(n, dtype=np.int64)
    q = 1
    for p in parents:
        config = config * states[p] + codes[:, p]
        q *= states[p]
    counts = np.zeros((q, r))
    np.add.at(counts, (config, codes[:, child]), 1.0)
    totals = counts.sum(1, keepdims=True)
    nz = counts > 0
    loglik = float((counts[nz] * np.log(counts[nz] / np.broadcast_to(totals, counts.shape)[nz])).sum())
    return loglik - 0.5 * math.log(n) * q * (r - 1)


def bic_score(data: Any, parents: dict[int, Sequence[int]]) -> float:
    """The BIC of the graph `parents` ({child column: parent columns}) on the data's columns."""
    codes = _codes(data)
    states = [int(codes[:, i].max()) + 1 for i in range(codes.shape[1])]
    return sum(_family_score(codes, states, i, tuple(parents.get(i, ()))) for i in range(codes.shape[1]))


def _reaches(parents: dict[int, set[int]], start: int, goal: int) -> bool:
    """Whether a directed path runs from start to goal (following child → parent links backwards)."""
    children: dict[int, list[int]] = {}
    for c, ps in parents.items():
        for p in ps:
            children.setdefault(p, []).append(c)
    stack, seen = [start], {start}
    while stack:
        v = stack.pop()
        if v == goal:
            return True
        for w in children.get(v, ()):
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return False


def learn_structure(data: Any, names: Sequence[str] | None = None, *, max_parents: int = 3,
                    max_steps: int = 10_000) -> dict[str, tuple[str, ...]]:
    """The BIC hill-climbing graph of the data's columns (discrete: binary concepts, categorical
    codes, a task's labels), as {child: (parents…)} with the names given (default c0, c1, …);
    roots are left out. See the module's docstring for the score and the search."""
    codes = _codes(data)
    d = codes.shape[1]
    names = [f"c{i}" for i in range(d)] if names is None else list(names)
    if len(names) != d or len(set(names)) != d:
        raise ValueError(f"learn_structure: {len(names)} names for {d} columns (they must be distinct)")
    if max_parents < 0:
        raise ValueError(f"max_parents must be ≥ 0, got {max_parents}")
    states = [int(codes[:, i].max()) + 1 for i in range(d)]
    parents: dict[int, set[int]] = {i: set() for i in range(d)}
    cache: dict[tuple[int, frozenset[int]], float] = {}

    def family(i: int, ps: set[int]) -> float:
        key = (i, frozenset(ps))
        if key not in cache:
            cache[key] = _family_score(codes, states, i, sorted(ps))
        return cache[key]

    for _ in range(max_steps):
        best, move = 1e-9, None
        for i in range(d):
            for j in range(d):
                if i == j:
                    continue
                if i in parents[j]:  # the edge i → j exists: delete it, or reverse it
                    delta = family(j, parents[j] - {i}) - family(j, parents[j])
                    if delta > best:
                        best, move = delta, ("delete", i, j)
                    if len(parents[i]) < max_parents:
                        without = {**parents, j: parents[j] - {i}}
                        if not _reaches(without, i, j):  # j → i closes no cycle once i → j is gone
                            delta += family(i, parents[i] | {j}) - family(i, parents[i])
                            if delta > best:
                                best, move = delta, ("reverse", i, j)
                elif j not in parents[i] and len(parents[j]) < max_parents and not _reaches(parents, j, i):
                    delta = family(j, parents[j] | {i}) - family(j, parents[j])
                    if delta > best:
                        best, move = delta, ("add", i, j)
        if move is None:
            break
        kind, i, j = move
        if kind in ("delete", "reverse"):
            parents[j].discard(i)
        if kind == "reverse":
            parents[i].add(j)
        if kind == "add":
            parents[j].add(i)
    return {names[c]: tuple(names[p] for p in sorted(ps)) for c, ps in parents.items() if ps}
