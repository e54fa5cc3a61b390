"""Explanations are complete: for every model, the parts of `model.explain(inputs)` add up to the
output (float64, 1e-10), and the model-specific details say what the model computed."""

from __future__ import annotations

import pytest
import torch

import penrose_zoo
from penrose_zoo.concepts import ConceptModel

SMALL = {
    "linear": dict(f=5, r=1),
    "mlp": dict(f=5, j=7, r=3, task="multiclass"),
    "self_attention": dict(e=6, h=3, d=2),
    "causal_self_attention": dict(e=6, h=3, d=2),
    "sparse_autoencoder": dict(d=5, k=12),
    "topk_sparse_autoencoder": dict(d=5, k=12, n_active=3),
    "concept_bottleneck": dict(f=9, k=4, r=3),
    "concept_bottleneck_logit": dict(f=9, k=4, r=3),
    "concept_bottleneck_hybrid": dict(f=9, k=4, j=5, r=3),
    "concept_embedding": dict(f=9, k=4, e=3, r=3),
    "prototype_concepts": dict(f=9, p=3, k=4, r=3),
    "neural_additive": dict(f=6, i=5, j=4, r=2, task="multiclass"),
    "mixture_of_linear_models": dict(f=9, k=4, m=3, r=3),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def build(name, seed=0):
    opts = dict(SMALL[name])
    model = penrose_zoo.MODELS[name].build(seed=seed, **opts).double().eval()
    with torch.no_grad():  # away from the tiny initial scale, so the parts are not all ~0
        g = torch.Generator().manual_seed(seed)
        for n, p in model.diagram.named_parameters():
            if n not in ("w_exu",):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return model


CONCEPT_MODELS = [n for n in SMALL if issubclass(penrose_zoo.MODELS[n].cls, ConceptModel)]


@pytest.mark.parametrize(
    "name, intervened", [(n, False) for n in SMALL] + [(n, True) for n in CONCEPT_MODELS]
)
def test_parts_add_up_to_the_output(name, intervened):
    model = build(name)
    inputs = model.example_inputs(batch=5)
    if not intervened:
        inputs.pop("do", None)
        inputs.pop("c_true", None)
    e = model.explain(**inputs)
    out = model(**inputs)
    y = out if isinstance(out, torch.Tensor) else out[0]
    torch.testing.assert_close(e.output, y, atol=0, rtol=0)
    torch.testing.assert_close(e.total(), e.output, atol=1e-10, rtol=1e-10)
    assert e.residual().abs().max() < 1e-10


def test_concept_bottleneck_explanation_is_activations_times_task_weights():
    model = build("concept_bottleneck")
    x = torch.randn(3, 9, dtype=torch.float64)
    e = model.explain(x)
    torch.testing.assert_close(e.concepts, torch.sigmoid(x @ model.diagram.W_c + model.diagram.b_c))
    torch.testing.assert_close(e.weights, model.diagram.W_y)
    torch.testing.assert_close(e.parts, e.concepts[..., None] * e.weights)
    assert e.names == model.concept_names


def test_interventions_show_in_the_explanation():
    model = build("concept_bottleneck")
    x = torch.randn(3, 9, dtype=torch.float64)
    e = model.explain(x, *model.intervention([0, "c2"], [1.0, 0.0]))
    assert e.concepts[:, 0].eq(1).all() and e.concepts[:, 2].eq(0).all()
    torch.testing.assert_close(e.total(), e.output, atol=1e-10, rtol=1e-10)


def test_nam_parts_are_shape_functions():
    model = build("neural_additive")
    x = torch.randn(4, 6, dtype=torch.float64)
    e = model.explain(x)
    # each feature's part depends on that feature alone: changing x_0 changes only part 0
    x2 = x.clone()
    x2[:, 0] += 1.0
    e2 = model.explain(x2)
    torch.testing.assert_close(e2.parts[:, 1:], e.parts[:, 1:], atol=0, rtol=0)
    # and equals the shape function evaluated on a grid holding that value
    torch.testing.assert_close(model.shape_functions(x), e.parts, atol=1e-12, rtol=0)


def test_mixture_explanation_names_the_selected_slot():
    model = build("mixture_of_linear_models")
    x = torch.randn(5, 9, dtype=torch.float64)
    e = model.explain(x)
    torch.testing.assert_close(e.slot_prob, e.slot_probs.max(-1).values)
    for b in range(5):
        m = int(e.slot[b])
        torch.testing.assert_close(e.slot_weights[b], model.diagram.E[:, m, :])
        torch.testing.assert_close(e.slot_bias[b], model.diagram.E_b[m])
        # the slot's own prediction is its linear model over the concepts
        torch.testing.assert_close(e.slot_predictions[b, m], e.concepts[b] @ e.slot_weights[b] + e.slot_bias[b])


def test_prototype_explanation_lists_most_similar_prototypes():
    model = build("prototype_concepts")
    x = torch.randn(2, 9, dtype=torch.float64)
    e = model.explain(x, top=2)
    assert e.top_prototypes.shape == (2, 2, 4)
    # the top prototype of each concept has the highest cosine similarity (scale > 0 keeps order)
    with torch.no_grad():
        model.diagram.scale.fill_(3.0)
    e = model.explain(x, top=2)
    torch.testing.assert_close(e.top_similarity[:, 0], e.similarity.max(-2).values)
    # concept = convex combination of prototype labels
    torch.testing.assert_close(e.concept_parts.sum(-2), e.concepts, atol=1e-12, rtol=0)
    torch.testing.assert_close(e.prototype_probs.sum(-2), torch.ones(2, 4, dtype=torch.float64))


def test_attention_explanation_per_head():
    model = build("causal_self_attention")
    Z = torch.randn(2, 5, 6, dtype=torch.float64)
    e = model.explain(Z)
    assert e.parts.shape == (2, 3, 5, 6)
    assert torch.triu(e.probs, diagonal=1).abs().max() == 0  # causal


def test_sae_explanation_uses_active_features_only():
    model = build("topk_sparse_autoencoder")
    x = torch.randn(4, 5, dtype=torch.float64)
    e = model.explain(x)
    assert int(e.active.sum(-1).max()) <= 3
    assert e.parts[~e.active].abs().max() == 0


def test_plots():
    pytest.importorskip("matplotlib")
    from penrose_zoo.plots import plot_concepts, plot_shape_functions

    import matplotlib.pyplot as plt

    nam = build("neural_additive")
    fig = plot_shape_functions(nam, torch.randn(50, 6, dtype=torch.float64), features=[0, 1])
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2
    plt.close(fig)
    for name in ("concept_bottleneck", "mixture_of_linear_models"):
        m = build(name)
        fig = plot_concepts(m.explain(torch.randn(2, 9, dtype=torch.float64)))
        assert len(fig.axes) == 2 and len(fig.axes[0].patches) == 4  # one bar per concept
        plt.close(fig)
