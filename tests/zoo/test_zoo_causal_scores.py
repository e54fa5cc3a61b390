"""The causal side of the zoo against hand computations: CACE and completeness
(penrose_zoo.metrics), the BIC score and the hill-climbing structure search
(penrose_zoo.structure) on a small known graph."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import penrose_zoo
from penrose_zoo.metrics import cace, cace_score, completeness
from penrose_zoo.structure import bic_score, learn_structure

pytestmark = pytest.mark.usefixtures("one_thread")


def _sigmoid(z):
    return 1 / (1 + math.exp(-z))


def _chain():
    """A → B → y with B = σ(2A − 1) and the task's logit 3B − 1 (binary task)."""
    m = penrose_zoo.ConceptGraphModel(f=3, r=1, task="binary", concept_names=["A", "B"], parents={"B": ["A"], "y": ["B"]})
    d = m.diagram
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
        d.W_c[:, 0] = torch.tensor([1.0, -2.0, 0.5])  # A from the input (set by every intervention below)
        d.W_p[0, 1], d.b_c[1] = 2.0, -1.0
        d.W_y[1, 0], d.b_y[0] = 3.0, -1.0
    return m


def test_cace_equals_the_hand_computation_on_a_chain():
    m = _chain()
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0))
    # do(A=1): B = σ(1), y = σ(3σ(1) − 1); do(A=0): B = σ(−1), y = σ(3σ(−1) − 1) — for every x
    want_task = _sigmoid(3 * _sigmoid(1) - 1) - _sigmoid(3 * _sigmoid(-1) - 1)
    assert cace(m, x, "A").item() == pytest.approx(want_task, abs=1e-6)
    assert cace(m, x, "A", target="B").item() == pytest.approx(_sigmoid(1) - _sigmoid(-1), abs=1e-6)
    # B set directly: A no longer matters; B's effect on the task is σ(2) − σ(−1)
    assert cace(m, x, "B").item() == pytest.approx(_sigmoid(2) - _sigmoid(-1), abs=1e-6)
    assert cace(m, x, "A", high=0.5, low=0.5).item() == 0.0


def test_cace_score_is_pycs():
    """PyC's docstring example: cace_score(y_c0, y_c1) = [0.5, −0.5]."""
    got = cace_score(torch.tensor([[0.1, 0.9], [0.2, 0.8]]), torch.tensor([[0.7, 0.3], [0.6, 0.4]]))
    torch.testing.assert_close(got, torch.tensor([0.5, -0.5]))
    with pytest.raises(ValueError, match="differ in shape"):
        cace_score(torch.zeros(2, 2), torch.zeros(2, 3))


def test_cace_of_a_categorical_concept_sets_its_one_hot():
    m = penrose_zoo.ConceptGraphModel(f=2, r=1, task="binary", concepts={"S": ["a", "b", "c"], "T": "binary"},
                                      parents={"T": ["S"], "y": ["T"]})
    d = m.diagram
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
        d.W_p[:3, 3] = torch.tensor([-1.0, 0.0, 2.0])  # T = σ(−1, 0, 2 by S's value)
        d.W_y[3, 0] = 1.0
    x = torch.randn(4, 2)
    got = cace(m, x, "S", target="T", high=[0.0, 0.0, 1.0], low=[1.0, 0.0, 0.0])
    assert got.item() == pytest.approx(_sigmoid(2) - _sigmoid(-1), abs=1e-6)


def test_completeness_equals_the_hand_computation():
    y = torch.tensor([0, 1, 1, 0])
    black = torch.tensor([-1.0, 2.0, 1.0, -3.0])   # all four right: accuracy 1
    white = torch.tensor([-1.0, 2.0, -1.0, -3.0])  # three of four: 0.75
    assert completeness(y, black, white) == pytest.approx(0.75)  # PyC's ratio
    assert completeness(y, black, white, random_score=0.5) == pytest.approx((0.75 - 0.5) / (1 - 0.5))
    with pytest.raises(ValueError, match="not above the random score"):
        completeness(y, white, black, random_score=0.75)


def test_bic_score_equals_the_hand_computation():
    """X = 0 0 1 1, Y = 0 0 1 0 (n = 4): each binary node without parents pays (log 4)/2, with a
    binary parent log 4."""
    data = np.array([[0, 0], [0, 0], [1, 1], [1, 0]])
    ll_x = 4 * math.log(0.5)
    ll_y = 3 * math.log(0.75) + math.log(0.25)
    ll_y_given_x = 2 * math.log(1.0) + 2 * math.log(0.5)
    assert bic_score(data, {}) == pytest.approx(ll_x + ll_y - 2 * 0.5 * math.log(4))
    assert bic_score(data, {1: [0]}) == pytest.approx(ll_x + ll_y_given_x - 0.5 * math.log(4) - math.log(4))


def test_learns_a_small_known_graph():
    """A → C ← B (C = A or B), C → D, each copied with 10 % noise: the v-structure at C compels
    every edge's direction, so the graph is the one the data were drawn from."""
    rng = np.random.default_rng(0)
    n = 4000
    a, b = rng.random(n) < 0.5, rng.random(n) < 0.5
    c = (a | b) ^ (rng.random(n) < 0.1)
    d = c ^ (rng.random(n) < 0.1)
    data = np.stack([a, b, c, d], 1)
    assert learn_structure(data, ["A", "B", "C", "D"]) == {"C": ("A", "B"), "D": ("C",)}
    capped = learn_structure(torch.as_tensor(data).float(), ["A", "B", "C", "D"], max_parents=1)
    assert capped and all(len(ps) == 1 for ps in capped.values()), capped
    independent = np.stack([rng.random(n) < 0.5 for _ in range(3)], 1)
    assert learn_structure(independent) == {}


def test_learned_graph_builds_a_graph_model():
    rng = np.random.default_rng(1)
    a = rng.random(2000) < 0.5
    b = a ^ (rng.random(2000) < 0.05)
    parents = learn_structure(np.stack([a, b], 1), ["A", "B"])
    assert parents in ({"B": ("A",)}, {"A": ("B",)})  # one edge; its direction is not identifiable
    m = penrose_zoo.ConceptGraphModel(f=2, r=2, concept_names=["A", "B"], parents=parents)
    assert m.diagram.A.sum().item() == 1.0


def test_learn_structure_errors_are_named():
    with pytest.raises(ValueError, match="2-d array"):
        learn_structure(np.zeros(5))
    with pytest.raises(ValueError, match="3 names for 2 columns"):
        learn_structure(np.zeros((5, 2)), ["a", "b", "c"])
    with pytest.raises(ValueError, match="NaN"):
        learn_structure(np.array([[0.0, np.nan], [1.0, 0.0]]))
