"""The concept graph model (ConceptGraphModel) and C2BM (CausallyReliableCBM) side by side with
PyC's (`torch_concepts` 1.0.0a7): with PyC's weights loaded they compute PyC's outputs, with and
without interventions, over binary, categorical and continuous concepts and the task as a node;
trained on checkmark, setting a parent flips its child in every example, in both libraries."""

from __future__ import annotations

import pytest
import torch

import penrose_zoo
from penrose_zoo.data import toy_concepts

pytestmark = pytest.mark.usefixtures("one_thread")

# A binary root, D a categorical root, B categorical from A and D, C continuous from A and B,
# the task y (binary) from B and C
CONCEPTS = {"A": "binary", "D": ["u", "v"], "B": ["s", "m", "l"], "C": "continuous"}
PARENTS = {"B": ["A", "D"], "C": ["A", "B"], "y": ["B", "C"]}
NAMES = [*CONCEPTS, "y"]


def _pyc(kind, parents, concepts, f, seed=0):
    """PyC's graph model (`graph`: GraphConceptBottleneckModel; `c2bm`:
    CausallyReliableConceptBottleneckModel) over these concepts and a binary task y."""
    tc = pytest.importorskip("torch_concepts")  # noqa: F841
    from torch_concepts.annotations import Annotations
    from torch_concepts.concept_graph import ConceptGraph
    from torch_concepts.nn import GraphConceptBottleneckModel
    from torch_concepts.nn.modules.high.models.c2bm import CausallyReliableConceptBottleneckModel

    names = [*concepts, "y"]
    kinds = {n: ("categorical" if not isinstance(t, str) else t) for n, t in concepts.items()} | {"y": "binary"}
    cards = [len(concepts[n]) if kinds[n] == "categorical" else 1 for n in concepts] + [1]
    ann = Annotations(labels=names, cardinalities=cards, types=[kinds[n] for n in names])
    adj = torch.zeros(len(names), len(names))
    for child, ps in parents.items():
        for p in ps:
            adj[names.index(p), names.index(child)] = 1.0
    graph = ConceptGraph(adj, node_names=names)
    torch.manual_seed(seed)
    cls = GraphConceptBottleneckModel if kind == "graph" else CausallyReliableConceptBottleneckModel
    return cls(input_size=f, annotations=ann, graph=graph), kinds


def _head(pyc, name, kinds):
    return pyc.pgm._factors[name].parametrization["loc" if kinds[name] == "continuous" else "logits"]


def _parent_columns(ours, pyc, name):
    """Our columns of `name`'s parents in PyC's order (its predecessors, concatenated)."""
    return [j for p in pyc.graph.get_predecessors(name) for j in ours._columns(p)]


def load_graph(ours, pyc, kinds):
    """PyC's graph CBM's weights into the zoo's ConceptGraphModel: a root's encoder into W_c,
    b_c; an internal concept's predictor into W_p (rows: its parents' columns), b_c; the task's
    into W_y, b_y."""
    d = ours.diagram
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
        for name in ours.spec.concepts:
            cols = torch.tensor(ours._columns(name))
            head = _head(pyc, name, kinds)
            if not list(pyc.graph.get_predecessors(name)):
                d.W_c[:, cols] = head.encoder.weight.T
                d.b_c[cols] = head.encoder.bias
            else:
                rows = torch.tensor(_parent_columns(ours, pyc, name))
                d.W_p[rows[:, None], cols] = head.predictor.weight.T
                d.b_c[cols] = head.predictor.bias
        task = _head(pyc, "y", kinds).predictor
        d.W_y[torch.tensor(_parent_columns(ours, pyc, "y"))] = task.weight.T
        d.b_y.copy_(task.bias)


def load_c2bm(ours, pyc, kinds):
    """PyC's C2BM's weights into the zoo's CausallyReliableCBM: each concept's embedding encoder
    into W_e, b_e (its states' columns); a root's decoder into W_r, b_r; an internal concept's
    hypernetwork into H_1, b_1, H_2, b_2 (read-out rows: its parents' columns); the task's into
    W_t, b_t, T_1, c_1, T_2, c_2."""
    d = ours.diagram
    e = d.W_e.shape[-1]
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()

        def embedding(name):
            enc = pyc.pgm._factors[f"{name}__embedding"].parametrization["value"].encoder[0]
            return enc.weight.reshape(-1, e, enc.weight.shape[-1]).permute(2, 0, 1), enc.bias.reshape(-1, e)

        for n, name in enumerate(ours.spec.concepts):
            cols = ours._columns(name)
            d.W_e[:, cols], d.b_e[cols] = embedding(name)
            head = _head(pyc, name, kinds)
            if not list(pyc.graph.get_predecessors(name)):
                d.W_r[n], d.b_r[n] = head[0].encoder.weight[0], head[0].encoder.bias[0]
            else:
                rows = torch.tensor(_parent_columns(ours, pyc, name))
                hidden, readout = head.hypernet.mlp[0].affinity, head.hypernet.readout
                d.H_1[n], d.b_1[n] = hidden.weight.T, hidden.bias
                d.H_2[n][:, rows], d.b_2[n][rows] = readout.weight.T, readout.bias
        head = _head(pyc, "y", kinds)
        d.W_t[:, 0], d.b_t[0] = embedding("y")[0][:, 0], embedding("y")[1][0]
        rows = torch.tensor(_parent_columns(ours, pyc, "y"))
        hidden, readout = head.hypernet.mlp[0].affinity, head.hypernet.readout
        d.T_1.copy_(hidden.weight.T)
        d.c_1.copy_(hidden.bias)
        d.T_2[:, rows], d.c_2[rows] = readout.weight.T, readout.bias


def _pyc_columns(ours, out, kinds):
    """PyC's outputs as our columns: (values, logits) — σ / the group's softmax / the value of a
    continuous concept, and the logits (the value for a continuous one); plus the task logit."""
    logits, locs = (getattr(t, "tensor", t) for t in (out.logits, out.loc))
    discrete = [n for n in out.variables if n in kinds and kinds[n] != "continuous"]
    values, raw = {}, {}
    at = 0
    for name in [n for n in NAMES if n in discrete]:
        width = len(ours._columns(name)) if name != "y" else 1
        z = logits[:, at:at + width]
        at += width
        raw[name] = z
        values[name] = torch.sigmoid(z) if kinds[name] == "binary" else torch.softmax(z, -1)
    for i, name in enumerate(n for n in NAMES if n in kinds and kinds[n] == "continuous" and n in out.variables):
        raw[name] = values[name] = locs[:, i:i + 1]
    return values, raw


@pytest.mark.parametrize("kind", ["graph", "c2bm"])
def test_equals_pyc_with_its_weights_loaded(kind):
    pyc, kinds = _pyc(kind, PARENTS, CONCEPTS, f=5)
    pyc.eval()
    cls = penrose_zoo.ConceptGraphModel if kind == "graph" else penrose_zoo.CausallyReliableCBM
    ours = cls(f=5, r=1, task="binary", concepts=CONCEPTS, parents=PARENTS).eval()
    (load_graph if kind == "graph" else load_c2bm)(ours, pyc, kinds)
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = ours(x)
        values, raw = _pyc_columns(ours, pyc(query=NAMES, input=x), kinds)
        for name in CONCEPTS:
            cols = ours._columns(name)
            torch.testing.assert_close(got.c[:, cols], values[name], atol=1e-5, rtol=1e-5, msg=f"{kind} {name}")
            torch.testing.assert_close(got.c_logit[:, cols], raw[name], atol=1e-5, rtol=1e-5, msg=f"{kind} {name}")
        torch.testing.assert_close(got.y, raw["y"], atol=1e-5, rtol=1e-5)
        # interventions: A and D set; B, C and the task follow in both
        a, dv = torch.tensor([[1.0], [0.0]]).repeat(4, 1)[:7], torch.tensor([[0.0, 1.0]]).expand(7, 2)
        c_true = torch.zeros(7, ours.spec.k)
        c_true[:, ours._columns("A")], c_true[:, ours._columns("D")] = a, dv
        do = torch.zeros(ours.spec.k, dtype=torch.bool)
        do[ours._columns("A") + ours._columns("D")] = True
        got = ours(x, c_true=c_true, do=do)
        values, raw = _pyc_columns(ours, pyc(query=["B", "C", "y"], evidence={"A": a, "D": dv}, input=x), kinds)
        for name in ("B", "C"):
            torch.testing.assert_close(got.c[:, ours._columns(name)], values[name], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.y, raw["y"], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(got.y, ours(x).y)  # the set parents reached the task


def _train_pyc(model, x, target, epochs, seed=0):
    """PyC's model in a plain loop (bench/pyc.py's): BCE over the concept and task columns."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 64):
            idx = order[i:i + 64]
            opt.zero_grad()
            out = model(query=model.fully_observed_query(target[idx]), input=x[idx])
            torch.nn.functional.binary_cross_entropy_with_logits(out.logits.tensor if hasattr(out.logits, "tensor")
                                                                 else out.logits, target[idx]).backward()
            opt.step()
    return model.eval()


def flips(child_given):
    """The fraction of examples whose child (thresholded at 0.5) differs between do(parent = 0)
    and do(parent = 1): child_given(v) is the child's probability with the parent set to v."""
    return ((child_given(0.0) > 0.5) != (child_given(1.0) > 0.5)).double().mean().item()


def test_setting_a_parent_flips_its_child_in_every_example_in_both_libraries():
    """Checkmark (C = ¬B, the task A ∧ C): its x carries C directly. The graph model computes C
    from B alone, so do(B) decides C in every example — in the zoo's and in PyC's. C2BM's child
    is Σ_parents c_i w_i(x), its weights made from x and no bias (PyC's default): do(B = 0) leaves
    C at σ(0) = 0.5 exactly in both libraries, and do(B = 1) sets C as x's weights say (x carries
    C here), so it flips C only in some examples (the rates are printed; docs/zoo.md has them)."""
    d = toy_concepts("checkmark", n=600, seed=0)
    parents = {"C": ["B"], "y": ["A", "C"]}
    x, c, y = d.train_tuple()
    xt = d.test_tuple()[0]
    child = {}
    for kind, cls in (("graph", penrose_zoo.ConceptGraphModel), ("c2bm", penrose_zoo.CausallyReliableCBM)):
        m = cls(f=4, r=1, task="binary", concept_names=d.concept_names, parents=parents, concept_weight=3.0)
        m.fit((x, c, y), epochs=15, batch_size=64, lr=1e-2, progress=False)
        m.eval()
        child[kind, "penrose"] = lambda v, m=m: m.intervene(xt, ["B"], [v]).c[:, 2]
        pyc, _ = _pyc(kind, parents, dict.fromkeys(d.concept_names, "binary"), f=4)
        _train_pyc(pyc, x, torch.cat([c, y[:, None].float()], 1), epochs=15)

        def pyc_child(v, pyc=pyc):
            out = pyc(query=["C"], evidence={"B": torch.full((len(xt), 1), v)}, input=xt)
            return torch.sigmoid(getattr(out.logits, "tensor", out.logits)[:, 0])

        child[kind, "pyc"] = pyc_child
    with torch.no_grad():
        rates = {key: flips(fn) for key, fn in child.items()}
        assert rates["graph", "penrose"] == rates["graph", "pyc"] == 1.0, rates
        for lib in ("penrose", "pyc"):  # C2BM: no bias, so a parent at 0 leaves its child at σ(0)
            at0 = child["c2bm", lib](0.0)
            assert torch.equal(at0, torch.full_like(at0, 0.5)), (lib, at0)
        print("flip rates (test split):", {f"{k} {lib}": round(r, 3) for (k, lib), r in rates.items()})
