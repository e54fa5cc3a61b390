"""Contraction plans: valid, counted as opt_einsum counts, optimal where searched exhaustively,
never beaten by opt_einsum's strategies, any number of legs, and `penrose plan` multiplying by
block runs.

The oracles are independent: numpy's einsum computes what each plan computes, opt_einsum counts
the FLOPs of the same path, and a brute force over every pairwise order finds the optimum.
"""

from __future__ import annotations

import functools
import os
import random
import re
import string
import subprocess
import sys

import numpy as np
import opt_einsum
import opt_einsum.testing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from penrose import plan as planner
from penrose.checker import check
from penrose.cli import main
from penrose.parser import parse
from penrose.plan import TooManyLegs, letters_for, plan_einsum
from penrose.report import block_runs, plan_report

# ---- helpers ----------------------------------------------------------------------------------


def run_plan(p, arrays):
    """Execute a plan as the compiler does: pop each step's operands, append its result."""
    work = list(arrays)
    for s in p.steps:
        assert all(0 <= i < len(work) for i in s.operands), (s, len(work))
        assert list(s.operands) == sorted(s.operands, reverse=True)  # popped in order, no shifts
        picked = [work.pop(i) for i in s.operands]
        work.append(np.einsum(s.spec, *picked))
    assert len(work) == 1
    return work[0]


def check_steps(p, terms, out):
    """Each step's letters stand for the legs of the operands it pops; the last leaves `out`."""
    work = [tuple(t) for t in terms]
    for s in p.steps:
        lhs, rhs = s.spec.split("->")
        picked = [work.pop(i) for i in s.operands]
        parts = lhs.split(",")
        assert len(parts) == len(picked)
        letter_of = {}
        for part, legs in zip(parts, picked):
            assert len(part) == len(legs), (s.spec, legs)
            for ch, leg in zip(part, legs):
                assert letter_of.setdefault(leg, ch) == ch
        assert len(set(letter_of.values())) == len(letter_of)  # one letter per leg within the step
        leg_of = {ch: leg for leg, ch in letter_of.items()}
        result = tuple(leg_of[ch] for ch in rhs)
        assert result == s.legs
        assert set(s.summed) == set(letter_of) - set(result)
        work.append(result)
    assert work == [tuple(out)]


def opt_einsum_cost(p, terms, out, sizes):
    """opt_einsum's count (PathInfo.opt_cost, naive_cost) of the plan's own path.

    (Its naive_cost calls a step 'inner' when a leg is shared, not when one is summed, unlike
    its count of each step; penrose counts the naive step by the step rule.)"""
    legs = list(dict.fromkeys([l for t in terms for l in t] + list(out)))
    sym = {l: opt_einsum.get_symbol(i) for i, l in enumerate(legs)}
    eq = ",".join("".join(sym[l] for l in t) for t in terms) + "->" + "".join(sym[l] for l in out)
    shapes = [tuple(sizes[l] for l in t) for t in terms]
    info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=[s.operands for s in p.steps])[1]
    return int(info.opt_cost), int(info.naive_cost), eq, shapes


def brute_force(terms, out, sizes) -> int:
    """The cheapest cost over every sequence of pairwise contractions, each operand optionally
    summing its own legs first (what opt_einsum paths can express)."""
    out = frozenset(out)

    def cost(legs, summed, n):
        return functools.reduce(lambda a, l: a * sizes[l], legs, 1) * (max(1, n - 1) + bool(summed))

    @functools.lru_cache(maxsize=None)
    def best(state) -> int:  # state: sorted tuple of (legs, original?)
        if len(state) == 1:
            legs, original = state[0]
            return cost(legs, legs - out, 1) if legs - out else 0  # sum what is left
        options = []
        items = list(state)
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
                keep = out.union(*(legs for legs, _ in rest))
                union = items[i][0] | items[j][0]
                res = union & keep
                options.append(cost(union, union - res, 2) + best(tuple(sorted(rest + [(res, False)], key=repr))))
            legs, original = items[i]
            rest = items[:i] + items[i + 1 :]
            keep = out.union(*(l for l, _ in rest))
            if original and legs - keep:
                options.append(cost(legs, True, 1) + best(tuple(sorted(rest + [(legs & keep, False)], key=repr))))
        return min(options)

    return best(tuple(sorted(((frozenset(t), True) for t in terms), key=repr)))


WORDS = ["tok", "e", "...0", "head dim", "k", "f2", "x", "y", "...1", "b"]


@st.composite
def einsums(draw, max_operands=6):
    """Terms over word legs (synthetic '...0' legs included), sizes 1-4, an output of some legs.

    Pools of up to 6 legs make dense networks; the brute force checks every one (up to 6 operands)."""
    pool = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6, unique=True))
    n = draw(st.integers(1, max_operands))
    # a leg twice in one term is a diagonal ('ii'), as torch.einsum reads it
    terms = [tuple(draw(st.lists(st.sampled_from(pool), max_size=3, unique=draw(st.booleans())))) for _ in range(n)]
    present = list(dict.fromkeys(l for t in terms for l in t))
    out = tuple(draw(st.permutations(present))[: draw(st.integers(0, len(present)))]) if present else ()
    sizes = {l: draw(st.integers(1, 4)) for l in pool}
    return terms, out, sizes


def letters_spec(terms, out):
    m = letters_for(terms, out)
    return ",".join("".join(m[l] for l in t) for t in terms) + "->" + "".join(m[l] for l in out)


# ---- validity, counts, optimality -------------------------------------------------------------


@settings(max_examples=150)
@given(einsums())
def test_plans_are_valid_counted_like_opt_einsum_and_optimal(case):
    terms, out, sizes = case
    p = plan_einsum(terms, out, sizes)
    check_steps(p, terms, out)
    arrays = [np.random.default_rng(0).standard_normal([sizes[l] for l in t]) for t in terms]
    np.testing.assert_allclose(run_plan(p, arrays), np.einsum(letters_spec(terms, out), *arrays), rtol=1e-10, atol=1e-10)
    opt_cost, _, _, _ = opt_einsum_cost(p, terms, out, sizes)
    assert p.opt_flops == opt_cost == sum(s.flops for s in p.steps)
    legs = set(out).union(*terms)  # naive: every operand in one step, under the same rule
    assert p.naive_flops == opt_einsum.helpers.flop_count(legs, bool(legs - set(out)), len(terms), sizes)
    if len(terms) > 1:
        assert p.opt_flops == brute_force(terms, out, sizes)


def test_optimal_beats_opt_einsum_optimal_where_it_may_sum_an_operand_first():
    # ring of 6 with a private leg on every tensor: summing those first is cheaper than any
    # order of pairwise contractions alone (opt_einsum 'optimal' 304 flops)
    n = 6
    terms = [(f"r{i}", f"s{i}", f"r{(i + 1) % n}") for i in range(n)]
    rng = random.Random(15)
    sizes = {f"r{i}": rng.choice([2, 4, 8, 16]) for i in range(n)}
    sizes.update({f"s{i}": rng.choice([1, 2, 3]) for i in range(n)})
    p = plan_einsum(terms, (), sizes)
    _, _, eq, shapes = opt_einsum_cost(p, terms, (), sizes)
    best = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="optimal")[1].opt_cost
    assert p.opt_flops == brute_force(terms, (), sizes) < best
    assert any(len(s.operands) == 1 for s in p.steps)


def test_an_outer_product_first_when_it_pays():
    terms = [("i",), ("j",), ("i", "j", "k")]
    sizes = {"i": 3, "j": 4, "k": 256}
    p = plan_einsum(terms, ("k",), sizes)
    assert [s.spec for s in p.steps] == ["j,i->ij", "ij,ijk->k"]  # 12 flops, then one pass over the big one
    assert p.opt_flops == 12 + 2 * 3 * 4 * 256 == brute_force(terms, ("k",), sizes)


def random_network(n, seed, global_dim=False):
    eq, _, size_dict = opt_einsum.testing.rand_equation(n, 3, n_out=2, d_min=2, d_max=6, seed=seed, global_dim=global_dim, return_size_dict=True)
    lhs, rhs = eq.split("->")
    return [tuple(t) for t in lhs.split(",")], tuple(rhs), size_dict, eq


@pytest.mark.parametrize("n, seed, global_dim", [(9, 1, False), (10, 2, True), (12, 3, False), (14, 4, True), (16, 5, False)])
def test_never_costlier_than_opt_einsums_strategies(n, seed, global_dim):
    terms, out, sizes, eq = random_network(n, seed, global_dim)
    p = plan_einsum(terms, out, sizes)
    check_steps(p, terms, out)
    opt_cost, _, _, shapes = opt_einsum_cost(p, terms, out, sizes)
    assert p.opt_flops == opt_cost
    for strategy in ("dp", "greedy", "branch-2", "random-greedy"):
        assert p.opt_flops <= opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=strategy)[1].opt_cost, strategy


def test_dynamic_programming_past_its_budget_falls_back_and_keeps_the_global_random_state(monkeypatch):
    terms, out, sizes, eq = random_network(14, 7)
    monkeypatch.setattr(planner, "DP_BUDGET", 10)
    planner._plan.cache_clear()
    random.seed(1234)
    state = random.getstate()
    try:
        p = plan_einsum(terms, out, sizes)
    finally:
        planner._plan.cache_clear()
    assert random.getstate() == state
    check_steps(p, terms, out)
    _, _, _, shapes = opt_einsum_cost(p, terms, out, sizes)
    assert p.opt_flops <= opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="greedy")[1].opt_cost


PLAN_IN_A_PROCESS = """
import opt_einsum.testing
from penrose import plan
plan.DP_BUDGET = 10  # random greedy stands in, whose ties follow set order
eq, _, sizes = opt_einsum.testing.rand_equation(22, 3, n_out=2, d_min=2, d_max=6, seed=2014, return_size_dict=True)
lhs, rhs = eq.split("->")
p = plan.plan_einsum([tuple(t) for t in lhs.split(",")], tuple(rhs), sizes)
print([(s.operands, s.spec) for s in p.steps], p.opt_flops)
"""


def test_the_same_plan_in_every_process():
    # regression: opt_einsum was handed legs as letters, whose sets iterate in an order each
    # PYTHONHASHSEED changes, and random greedy's ties (so the generated code) followed it
    runs = {
        subprocess.run([sys.executable, "-c", PLAN_IN_A_PROCESS], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(runs) == 1, runs


def test_plans_are_cached():
    terms, out, sizes = [("i", "j"), ("j", "k"), ("k", "l")], ("i", "l"), {"i": 2, "j": 3, "k": 4, "l": 5}
    assert plan_einsum(terms, out, sizes) is plan_einsum(tuple(terms), list(out), dict(sizes, unused=7))


# ---- legs: any strings, any number --------------------------------------------------------------


def test_a_long_chain_with_more_legs_than_letters():
    n = 70  # 71 bond legs
    legs = [f"bond {i}" for i in range(n + 1)]
    terms = [(legs[i], legs[i + 1]) for i in range(n)]
    sizes = {l: 2 + i % 3 for i, l in enumerate(legs)}
    with pytest.raises(TooManyLegs):
        letters_for(terms, (legs[0], legs[-1]))
    p = plan_einsum(terms, (legs[0], legs[-1]), sizes)
    check_steps(p, terms, (legs[0], legs[-1]))
    assert all(set(s.spec) <= set(string.ascii_letters + ",->") for s in p.steps)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((sizes[a], sizes[b])) / 2 for a, b in terms]
    np.testing.assert_allclose(run_plan(p, arrays), functools.reduce(np.matmul, arrays), rtol=1e-9)
    assert p.opt_flops == opt_einsum_cost(p, terms, (legs[0], legs[-1]), sizes)[0]


def test_a_step_with_53_legs_is_refused_with_its_own_error():
    a = tuple(f"a{i}" for i in range(27))
    b = tuple(f"b{i}" for i in range(26))
    with pytest.raises(TooManyLegs, match=r"^a contraction step needs 53 distinct legs; torch.einsum names at most 52 \(a-z, A-Z\)$"):
        plan_einsum([a, b], a + b, {})
    assert issubclass(TooManyLegs, ValueError)
    p = plan_einsum([a[:26], b], a[:26] + b, {})  # 52 fit
    assert len(p.steps[0].spec.split("->")[1]) == 52


def test_penrose_plan_positions_a_step_with_too_many_legs(tmp_path, capsys):
    a, b = [f"a{i}" for i in range(27)], [f"b{i}" for i in range(26)]
    text = (
        "dim " + ", ".join(f"{x} = 1" for x in a + b) + f"\ninput A[{', '.join(a)}]\ninput B[{', '.join(b)}]\n"
        f"y = einsum('{' '.join(a)}, {' '.join(b)} -> {' '.join(a + b)}', A, B)\noutput y\n"
    )
    path = tmp_path / "wide.pen"
    path.write_text(text, encoding="utf-8")
    assert main(["plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:4:5: error: a contraction step needs 53 distinct legs" in err


def test_single_letter_legs_keep_their_letters():
    p = plan_einsum([("i", "j"), ("j", "k"), ("k", "tok")], ("i", "tok"), {"i": 9, "j": 2, "k": 9, "tok": 2})
    assert [s.spec for s in p.steps] == ["ka,jk->ja", "ja,ij->ia"]


# ---- penrose plan -----------------------------------------------------------------------------

REPEATED = """\
dim t = 8, e = 16, f = 32
input x[t, e]
param P[e, f]
param Q[f, e]
block layer(h[t, e]) {
  param W[e, f]
  param U[f, e]
  return einsum('ta,af,fe->te', h, W, U)
}
y = layer(x) repeat 4
z = einsum('te,ef,fd->td', y, P, Q)
output z
"""


def numbers(line):
    return [int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", line)]


def test_plan_multiplies_a_repeated_block_by_its_runs(tmp_path, capsys):
    path = tmp_path / "repeated.pen"
    path.write_text(REPEATED, encoding="utf-8")
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].startswith("FLOPs: a step costs the product of its legs' sizes, twice that when it sums a leg")
    assert "block layer: runs 4 times per call" in lines
    # each einsum: (t e, e f) then (t f, f e): 2·8·16·32 flops per step
    step = 2 * 8 * 16 * 32
    assert sum(numbers(l)[-2] == step for l in lines if l.lstrip().startswith("step ")) == 4
    assert f"  {2 * step:,} flops × 4 runs = {8 * step:,}" in lines
    assert lines[-1] == f"total {2 * step + 8 * step:,} flops per call (one batch element)"


def test_block_runs_multiply_through_nested_blocks_and_shared_instances():
    text = """\
dim e = 2
input x[e]
block inner(h[e]) {
  return h * 2
}
block outer(h[e]) {
  a = inner(h) repeat 3
  b = inner(a) as again
  return b
}
block unused(h[e]) {
  return h
}
y = outer(x) repeat 2
z = outer(y) as other
output z
"""
    assert block_runs(check(parse(text))) == {"inner": 12, "outer": 3, "unused": 0}


def test_plan_report_of_a_block_never_called_counts_nothing():
    text = "dim i = 2, j = 3, k = 4\ninput x[i, j]\nblock b(h[i, j]) {\n  param W[j, k]\n  param V[k, i]\n  return einsum('ij,jk,ki->i', h, W, V)\n}\noutput x\n"
    report = plan_report(check(parse(text)))
    assert "block b: never called" in report
    assert report.splitlines()[-1] == "total 0 flops per call (one batch element)"
