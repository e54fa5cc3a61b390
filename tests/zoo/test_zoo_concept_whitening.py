"""Concept whitening (ConceptWhiteningModel, Chen et al. 2020): the whitening is ZCA, the Cayley
steps keep the rotation orthogonal and align concept axes with their concepts, and it trains."""

from __future__ import annotations

import pytest
import torch

from penrose_zoo import ConceptWhiteningModel
from penrose_zoo.data import toy_concepts
from penrose_zoo.metrics import concept_aucs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_whitening_is_zca():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 5, generator=g) @ torch.randn(5, 5, generator=g) + 3.0
    m = ConceptWhiteningModel(f=5, k=2, r=2).double()
    m.fit_whitening(x)
    z = (x.double() - m.diagram.mu) @ m.diagram.whiten
    torch.testing.assert_close(z.mean(0), torch.zeros(5, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(z.T @ z / 499, torch.eye(5, dtype=torch.float64), atol=1e-8, rtol=0)
    torch.testing.assert_close(m.diagram.whiten, m.diagram.whiten.T)  # ZCA: symmetric


def test_alignment_keeps_the_rotation_orthogonal_and_aligns_concepts():
    d = toy_concepts("trigonometry", n=1500, seed=0)
    m = ConceptWhiteningModel(f=7, k=3, r=2).double()
    x, c = d.x_train.double(), d.c_train.double()
    m.fit_whitening(x)
    before = concept_aucs(m(d.x_test.double()).c_axis.detach(), d.c_test)
    m.align(x, c, steps=30)
    Q = m.rotation()
    torch.testing.assert_close(Q.T @ Q, torch.eye(7, dtype=torch.float64), atol=1e-10, rtol=0)
    after = concept_aucs(m(d.x_test.double()).c_axis.detach(), d.c_test)
    assert (after > 0.97).all() and after.mean() > before.mean(), (before, after)


def test_trains_and_intervenes():
    d = toy_concepts("trigonometry", n=1500, seed=0)
    m = ConceptWhiteningModel(f=7, k=3, r=2)
    m.fit(d.train_tuple(), rounds=2, epochs=10, batch_size=128, lr=2e-2, progress=False)
    res = m.evaluate(d.test_tuple(), intervene_all=True)
    assert res["acc"] > 0.9 and res["concept_auc"] > 0.97, res
    assert (m.active_values > m.inactive_values).all()
    e = m.explain(d.x_test[:3])
    torch.testing.assert_close(e.total(), e.output, atol=1e-5, rtol=1e-5)
    assert e.names[:3] == ("c0", "c1", "c2") and e.parts.shape == (3, 7, 2)


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="k < f"):
        ConceptWhiteningModel(f=3, k=3)
    with pytest.raises(TypeError, match="sets j = 4 from f and k"):
        ConceptWhiteningModel(f=6, k=2, j=3)
