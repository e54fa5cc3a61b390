"""Binary, categorical and continuous concepts (the typed bottleneck, embedding model and mixture):
the column layout, the type-routed losses, metrics and interventions, and names and groups in
explanations. The diagrams themselves are checked against their hand-written references in
tests/zoo/test_zoo_models.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from penrose_zoo import TypedConceptBottleneckModel, TypedConceptEmbeddingModel, TypedMixtureOfLinearModels
from penrose_zoo.concept_bottleneck_model import ConceptSpec
from penrose_zoo.interventions import OrderPolicy, RandomPolicy, intervention_curve, intervention_masks

pytestmark = pytest.mark.usefixtures("one_thread")

CONCEPTS = {"first": "binary", "signs": ["--", "-+", "+-", "++"], "total": "continuous"}

#: the typed concept models, each with its own sizes besides f and r
TYPED = {
    "bottleneck": (TypedConceptBottleneckModel, {}),
    "embedding": (TypedConceptEmbeddingModel, {"e": 8}),
    "mixture": (TypedMixtureOfLinearModels, {"m": 2}),
}
typed = pytest.mark.parametrize("kind", list(TYPED))


def build(kind, **kwargs):
    cls, sizes = TYPED[kind]
    return cls(**{"f": 7, "r": 2, "concepts": CONCEPTS, **sizes, **kwargs})


def set_scores(m, value: float) -> None:
    """Every concept score equal to `value`, whatever the input."""
    d = m.diagram
    with torch.no_grad():
        if hasattr(d, "S_pos"):  # the embedding model: the shared scoring layer
            d.S_pos.zero_(), d.S_neg.zero_(), d.b_s.fill_(value)
        else:
            d.W_c.zero_(), d.b_c.fill_(value)


def typed_data(n: int, seed: int):
    """Trigonometry's inputs (Espinosa Zarlenga et al. 2022) with one concept of each type: the
    sign of h1 (binary), the signs of (h2, h3) (categorical, 4 values), h1 + h2 + h3 (continuous);
    task: h1 + h2 + h3 > 1, which the continuous concept determines."""
    rng = np.random.RandomState(seed)
    h = rng.normal(0, 2, (n, 3))
    x = np.stack([np.sin(h[:, 0]) + h[:, 0], np.cos(h[:, 0]) + h[:, 0], np.sin(h[:, 1]) + h[:, 1],
                  np.cos(h[:, 1]) + h[:, 1], np.sin(h[:, 2]) + h[:, 2], np.cos(h[:, 2]) + h[:, 2],
                  (h ** 2).sum(1)]).T
    signs = 2 * (h[:, 1] > 0) + (h[:, 2] > 0)
    total = h.sum(1)
    c = np.concatenate([(h[:, :1] > 0), np.eye(4)[signs], total[:, None]], 1)
    as_t = lambda a, dt=torch.float32: torch.as_tensor(a, dtype=dt)  # noqa: E731
    return as_t(x), as_t(c), as_t(total > 1, torch.int64)


def test_spec_lays_out_columns_units_and_buffers():
    spec = ConceptSpec(CONCEPTS)
    assert spec.columns == ["first", "signs=--", "signs=-+", "signs=+-", "signs=++", "total"]
    assert spec.column_types == ["binary"] + ["categorical"] * 4 + ["continuous"]
    assert spec.units == [(0,), (1, 2, 3, 4), (5,)] and (spec.k, spec.g) == (6, 1)
    assert spec.groups == {"signs": ("signs=--", "signs=-+", "signs=+-", "signs=++")}
    b = spec.buffers()
    assert b["binary"].tolist() == [1, 0, 0, 0, 0, 0] and b["continuous"].tolist() == [0, 0, 0, 0, 0, 1]
    assert b["member"][:, 0].tolist() == [0, 1, 1, 1, 1, 0]
    two = ConceptSpec({"a": ["x", "y"], "b": ["u", "v", "w"]}).buffers()["member"]
    assert two.tolist() == [[1, 0], [1, 0], [0, 1], [0, 1], [0, 1]]
    with pytest.raises(ValueError, match="type must be 'binary', 'continuous' or a list"):
        ConceptSpec({"a": "ordinal"})
    with pytest.raises(ValueError, match="at least two distinct values"):
        ConceptSpec({"a": ["x", "x"]})
    with pytest.raises(TypeError, match="takes its k from `concepts` \\(k = 6\\)"):
        TypedConceptBottleneckModel(f=3, k=4, concepts=CONCEPTS)
    assert TypedConceptBottleneckModel(f=3, k=6, concepts=CONCEPTS).sizes["k"] == 6


@typed
def test_activations_by_type(kind):
    m = build(kind).double().eval()
    x = torch.randn(5, 7, dtype=torch.float64)
    out = m(x)
    z, c = m.concept_scores(out), m.bottleneck(out)
    torch.testing.assert_close(c[:, 0], torch.sigmoid(z[:, 0]))
    torch.testing.assert_close(c[:, 1:5], torch.softmax(z[:, 1:5], -1))
    torch.testing.assert_close(c[:, 5], z[:, 5])
    torch.testing.assert_close(c[:, 1:5].sum(-1), torch.ones(5, dtype=torch.float64))


@typed
def test_group_softmax_survives_tiny_exponentials(kind):
    """Regression: the diagrams divided by (group_sum + 1 − categorical); when every score of a
    group was below about −16, float32 rounded group_sum + 1 to 1 and the group's columns became
    inf (found by the typed embedding model's default-size reference test). Now (group_sum +
    (1 − categorical)): the group's probabilities stay a softmax."""
    m = build(kind).eval()
    set_scores(m, -40.0)
    c = m.bottleneck(m(torch.randn(3, 7)))
    assert torch.isfinite(c).all(), c
    torch.testing.assert_close(c[:, 1:5], torch.full((3, 4), 0.25))


@typed
def test_randint_sets_whole_concepts(kind):
    m = build(kind, p_int=0.5)
    _, c, _ = typed_data(400, 3)
    do = m.random_do(c)
    assert do.shape == c.shape and (do[:, 1:5] == do[:, 1:2]).all()  # a categorical group: all or none
    assert 0.4 < do[:, 0].float().mean() < 0.6 and 0.4 < do[:, 1].float().mean() < 0.6


@typed
def test_type_routed_loss_by_hand(kind):
    m = build(kind, concept_weight={"signs": 2.0, "total": 0.5})
    assert m.concept_weights.tolist() == [1.0, 2.0, 2.0, 2.0, 2.0, 0.5]
    x, c, _ = typed_data(16, 0)
    out = m(x)
    z = m.concept_scores(out)
    bce = F.binary_cross_entropy_with_logits(z[:, 0], c[:, 0])
    ce = F.cross_entropy(z[:, 1:5], c[:, 1:5].argmax(-1))
    mse = F.mse_loss(z[:, 5], c[:, 5])
    torch.testing.assert_close(m.concept_loss(out, c), (bce + 2.0 * ce + 0.5 * mse) / 3, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="'sign', not a concept"):
        TypedConceptBottleneckModel(f=7, concepts=CONCEPTS, concept_weight={"sign": 1.0})
    with pytest.raises(ValueError, match="one weight per concept \\(3\\)"):
        TypedConceptBottleneckModel(f=7, concepts=CONCEPTS, concept_weight=[1.0] * 6)


@typed
def test_trains_and_reports_by_type(kind):
    train, test = typed_data(1000, 0), typed_data(400, 1)
    m = build(kind, concept_weight=3.0)
    m.fit(train, epochs=30, batch_size=128, lr=2e-2, progress=False)
    report = m.concept_report(test)
    assert set(report) == {"first", "signs", "total"}
    assert report["first"]["type"] == "binary" and report["first"]["accuracy"] > 0.97, report
    assert report["signs"]["type"] == "categorical" and report["signs"]["accuracy"] > 0.9, report
    assert report["total"]["type"] == "continuous" and report["total"]["r2"] > 0.9, report
    res = m.evaluate(test, intervene_all=True)
    assert res["concept_acc"] == pytest.approx((report["first"]["accuracy"] + report["signs"]["accuracy"]) / 2)
    assert res["concept_r2"] == pytest.approx(report["total"]["r2"])
    # the continuous concept determines the task: setting it to the truth gives (nearly) every
    # label to the bottleneck; the embedding model and the mixture also read the input (the
    # embeddings, the slot selector), so setting the concepts helps them less
    floor = 0.98 if kind == "bottleneck" else 0.95
    assert res["acc_all_concepts_set"] > floor and res["acc_all_concepts_set"] >= res["acc"] - 0.02, res
    curve = intervention_curve(m, test, OrderPolicy(["total"]), (0, 1 / 3))
    assert curve.accuracy[1] > floor and curve.accuracy[1] >= curve.accuracy[0] - 0.02, curve


@typed
def test_interventions_set_whole_concepts(kind):
    m = build(kind).eval()
    units = m.concept_units()
    ranking = torch.tensor([[3, 0, 5, 1, 2, 4], [5, 0, 1, 2, 3, 4]])
    do = intervention_masks(ranking, 1 / 3, units)  # one concept of three
    assert do.tolist() == [[False, True, True, True, True, False], [False, False, False, False, False, True]]
    assert intervention_masks(ranking, 2 / 3, units).sum(1).tolist() == [5, 2]
    x, c, y = typed_data(50, 2)
    r = OrderPolicy(["signs"]).ranking(m, x, c, m(x))
    assert r[0, 0].item() == 1  # a categorical concept by name: its first column
    half = intervention_curve(m, (x, c, y), RandomPolicy(0), (0, 1 / 3, 2 / 3, 1))
    with torch.no_grad():
        assert half.accuracy[-1] == ((m(x, c_true=c, do=torch.ones(6, dtype=torch.bool)).y.argmax(-1) == y).double().mean().item())


@typed
def test_explanations_carry_names_types_and_groups(kind):
    m = build(kind).double()
    x = torch.randn(3, 7, dtype=torch.float64)
    e = m.explain(x)
    assert e.names == ("first", "signs=--", "signs=-+", "signs=+-", "signs=++", "total")
    assert e.concept_types == ("binary", "categorical", "categorical", "categorical", "categorical", "continuous")
    assert e.concept_groups == {"signs": ("signs=--", "signs=-+", "signs=+-", "signs=++")}
    torch.testing.assert_close(e.total(), e.output, atol=1e-12, rtol=1e-12)
