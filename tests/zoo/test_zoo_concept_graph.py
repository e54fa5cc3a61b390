"""The input-reading graph bottleneck (InputConceptGraphModel): on a DAG it equals the topological evaluation of
a causal concept graph model (Dominici et al. 2025), interventions reach descendants, and it trains
on checkmark, whose graph the data set gives."""

from __future__ import annotations

import pytest
import torch

from penrose_zoo import InputConceptGraphModel
from penrose_zoo.concept_graph_model import graph_depth
from penrose_zoo.data import toy_concepts
from penrose_zoo.interventions import RandomPolicy, intervention_curve
from sources import reference

refs = reference("zoo_refs")
pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ("a", "b", "c", "d", "e")
PARENTS = {"c": ["a", "b"], "d": ["c"], "e": ["d", "a"]}  # longest path a -> c -> d -> e


def _random(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.diagram.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_the_topological_evaluation(seed):
    m = _random(InputConceptGraphModel(f=4, r=3, concept_names=NAMES, parents=PARENTS, task_parents=["d", "e"]).double(), seed)
    assert m.sizes["depth"] == 3
    g = torch.Generator().manual_seed(seed + 10)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    c_true = torch.rand(6, 5, generator=g, dtype=torch.float64)
    P = dict(m.diagram.named_parameters()) | dict(m.diagram.named_buffers())
    ids = {n: i for i, n in enumerate(NAMES)}
    parents = {ids[c]: [ids[p] for p in ps] for c, ps in PARENTS.items()}
    for do in (torch.zeros(5, dtype=torch.bool), torch.tensor([False, True, False, True, False]),
               torch.rand(6, 5, generator=g) < 0.5):
        got = m(x, c_true=c_true, do=do)
        want = refs.concept_graph_topological(P, x, c_true, do, parents)
        torch.testing.assert_close(got.c, want["c"], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(got.y, want["y"], atol=1e-12, rtol=1e-12)


def test_an_intervention_reaches_the_descendants():
    m = InputConceptGraphModel(f=4, r=2, concept_names=("A", "B", "C"), parents={"C": ["B"]}, task_parents=["A", "C"]).eval()
    with torch.no_grad():
        m.diagram.W_p.fill_(0.0)
        m.diagram.W_p[1, 2] = -20.0  # C = not B
        m.diagram.W_p[0, 2] = 50.0   # not an edge: masked out by the graph
        m.diagram.b_c[2] = 10.0
    x = torch.randn(5, 4)
    assert (m.intervene(x, ["B"], [1.0]).c[:, 2] < 1e-3).all()
    assert (m.intervene(x, ["B"], [0.0]).c[:, 2] > 1 - 1e-3).all()
    assert torch.equal(m.intervene(x, ["A"], [1.0]).c[:, 2], m.intervene(x, ["A"], [0.0]).c[:, 2])
    e = m.explain(x)
    assert e.graph.tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 0]] and e.parts[:, 1].abs().max() == 0  # B: not a task parent


def test_trains_on_checkmark_with_its_graph():
    d = toy_concepts("checkmark", n=500, seed=0)
    m = InputConceptGraphModel(f=4, r=2, concept_names=d.concept_names, parents=d.parents,
                          task_parents=d.task_parents, concept_weight=3.0)
    m.fit(d.train_tuple(), epochs=12, batch_size=64, lr=3e-2, progress=False)
    res = m.evaluate(d.test_tuple(), intervene_all=True)
    assert res["concept_acc"] > 0.99 and res["acc"] > 0.97 and res["acc_all_concepts_set"] > 0.97, res
    curve = intervention_curve(m, d.test_tuple(), RandomPolicy(0), (0, 1 / 3, 2 / 3, 1))
    assert min(curve.accuracy) > 0.95, curve


def test_graph_errors_are_named():
    assert graph_depth(NAMES, PARENTS) == 3 and graph_depth(NAMES, {}) == 0
    with pytest.raises(ValueError, match="cycle: c -> d -> c|cycle: d -> c -> d"):
        graph_depth(NAMES, {"c": ["d"], "d": ["c"]})
    with pytest.raises(ValueError, match="names 'z', not a concept"):
        InputConceptGraphModel(f=4, concept_names=("a", "b"), parents={"b": ["z"]})
