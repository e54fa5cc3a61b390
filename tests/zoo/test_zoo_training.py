"""Every zoo model learns on real offline data through `penrose_zoo.train.fit` (tiny runs: a few epochs,
a subset), better than chance; the full runs are tools/train_zoo.py's (docs/zoo.md)."""

from __future__ import annotations

import pytest
import torch

from penrose_zoo.recipes import RECIPES, run


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", list(RECIPES))
def test_learns_better_than_chance(name):
    r = run(name, quick=True)
    m = r.metrics
    if "majority_baseline" in m:
        assert m["val_acc"] > m["majority_baseline"] + 0.1, m
    if "val_concept_auc" in m:
        assert m["val_concept_auc"] > 0.7, m
        # setting every concept to its true value helps: the task is a function of the concepts
        assert m["val_acc_all_concepts_set"] > m["val_acc"], m
    if "val_r2" in m:
        assert m["val_r2"] > 0.1, m
    if "val_explained_variance" in m:
        assert m["val_explained_variance"] > 0.5, m
    if name == "topk_sparse_autoencoder":
        assert m["val_mean_l0"] <= 8
    if name == "sparse_autoencoder":
        assert m["val_mean_l0"] < 256 * 0.6, m


def test_sequential_training_freezes_the_concept_predictor_in_stage_two():
    import penrose_zoo

    x = torch.randn(64, 6)
    c = (x[:, :3] > 0).float()
    y = (c.sum(-1) > 1).long()
    model = penrose_zoo.ConceptBottleneckModel(f=6, k=3, r=2)
    seen = {}

    original = model.loss

    def spy(batch, mode="joint"):
        seen.setdefault(mode, model.diagram.W_c.detach().clone())
        seen[mode + "_grad"] = model.diagram.W_c.requires_grad
        return original(batch, mode)

    model.loss = spy
    hist = model.fit((x, c, y), mode="sequential", epochs=2, concept_epochs=3, batch_size=16, lr=1e-2, progress=False)
    assert len(hist["concepts"]["train_loss"]) == 3 and len(hist["task"]["train_loss"]) == 2
    assert seen["concepts_grad"] and not seen["task_grad"]
    assert model.diagram.W_c.requires_grad  # restored
    torch.testing.assert_close(model.diagram.W_c.detach(), seen["task"])  # unchanged in stage two


def test_independent_training_task_predictor_reads_true_concepts():
    import penrose_zoo

    model = penrose_zoo.ConceptBottleneckModel(f=4, k=3, r=2).double()
    x = torch.randn(8, 4, dtype=torch.float64)
    c = torch.randint(0, 2, (8, 3)).double()
    y = torch.randint(0, 2, (8,))
    loss = model.loss((x, c, y), mode="independent")
    task_only = torch.nn.functional.cross_entropy(c @ model.diagram.W_y + model.diagram.b_y, y)
    concept_only = torch.nn.functional.binary_cross_entropy_with_logits(x @ model.diagram.W_c + model.diagram.b_c, c)
    torch.testing.assert_close(loss, task_only + concept_only)


def test_randint_replaces_probabilities_by_labels_in_training_only():
    import penrose_zoo

    model = penrose_zoo.ConceptEmbeddingModel(f=5, k=200, e=2, p_int=0.25).train()
    x = torch.randn(4, 5)
    c = torch.randint(0, 2, (4, 200)).float()
    torch.manual_seed(0)
    p = model(x, c_true=c).p
    hit = p == c  # predicted probabilities are never exactly 0 or 1
    assert 0.15 < hit.float().mean() < 0.35
    model.eval()
    assert not (model(x, c_true=c).p == c).any()
