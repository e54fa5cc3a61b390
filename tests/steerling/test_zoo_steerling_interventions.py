"""Steerling's known concepts as an intervention target (penrose_zoo.steerling.interventions): the
target's intervention is the model's own (`intervene_known`, per-example values at the position),
and the zoo's policies, strategies and curves run on it."""

from __future__ import annotations

import pytest
import torch

from penrose_zoo.interventions import (
    FixedValue,
    GradientPolicy,
    OrderPolicy,
    RandomPolicy,
    UncertaintyPolicy,
    intervention_curve,
    sequential_intervention_masks,
)
from penrose_zoo.steerling import Steerling
from penrose_zoo.steerling.attribution import forward_ids
from penrose_zoo.steerling.interventions import KnownConcepts
from penrose_zoo.steerling.steer import current_weights

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=16, block_size=32, diff_block_size=4, intermediate_size=32)
CONCEPTS = dict(n_concepts=6, n_unknown_concepts=12, concept_dim=16, topk_known=3, topk_known_features=3,
                factorize_rank=4, unknown_topk=4)
CHOSEN = [1, 3, 4, 5]


@pytest.fixture(scope="module")
def lm():
    model = Steerling(MODEL, dict(CONCEPTS, use_epsilon_correction=True), 260, causal=True, seed=0,
                      large_concept_threshold=6)
    with torch.no_grad():  # larger concept embeddings, so that setting a concept moves the prediction
        model.net.known_head.concept_embedding.mul_(20)
    return model.eval()


def _data(n=24, t=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (n, t), generator=g), (torch.rand(n, len(CHOSEN), generator=g) < 0.5).float(),
            torch.randint(0, 260, (n,), generator=g))


def _by_the_model(lm, ids, do, values, position=-1):
    """The next-token logits at the position when the model itself sets, in each example, the
    chosen concepts where `do` holds (every other weight as it is): `intervene_known` with
    per-position values, the current weight everywhere else (a no-op), ε off."""
    plain = forward_ids(lm, ids)
    current = current_weights(plain, "known", list(range(CONCEPTS["n_concepts"])))  # (n, t, all known)
    at = torch.zeros(ids.shape, dtype=torch.bool)
    at[:, position] = True
    edits = {}
    for j, cid in enumerate(CHOSEN):
        v = current[..., cid].clone()
        v[at] = torch.where(do[:, j], values[:, j], current[:, position, cid])
        edits[cid] = v
    edits.setdefault(0, current[..., 0].clone())  # ε off even when nothing is chosen
    return forward_ids(lm, ids, intervene_known=edits).logits[:, position]


@torch.no_grad()
def test_the_targets_intervention_is_the_models_own(lm):
    target = KnownConcepts(lm, CHOSEN)
    ids, _, _ = _data()
    g = torch.Generator().manual_seed(2)
    for trial in range(3):
        do = torch.rand(ids.shape[0], len(CHOSEN), generator=g) < (0.0, 0.5, 1.0)[trial]
        values = torch.rand(ids.shape[0], len(CHOSEN), generator=g)
        got = target(ids, c_true=values, do=do)
        torch.testing.assert_close(got.y, _by_the_model(lm, ids, do, values), atol=1e-4, rtol=1e-4)
        assert torch.equal(got.c[do], values[do])
    out = lm(ids)
    torch.testing.assert_close(target(ids).c_logit, out.known_logits[:, -1][:, CHOSEN])


@torch.no_grad()
def test_policies_and_curves_run_on_known_concepts(lm):
    target = KnownConcepts(lm, CHOSEN, names=["a", "b", "c", "d"])
    ids, c, _ = _data()
    y = target(ids).y.argmax(-1)  # the model's own next token: accuracy 1 before any intervention
    fractions = (0, 0.25, 0.5, 0.75, 1)
    for policy in (RandomPolicy(0), UncertaintyPolicy(), GradientPolicy(), OrderPolicy(["d", "a"])):
        for sequential in (False, True):
            curve = intervention_curve(target, (ids, c, y), policy, fractions, sequential=sequential)
            assert curve.accuracy[0] == 1.0
            full = target(ids, c_true=target.bottleneck_values(c), do=torch.ones_like(c, dtype=torch.bool)).y
            assert curve.accuracy[-1] == (full.argmax(-1) == y).double().mean().item()
    assert curve.accuracy[-1] < 1.0  # setting the concepts changes predictions
    masks = sequential_intervention_masks(target, ids, c, GradientPolicy(), target.bottleneck_values(c))
    assert [int(m.sum(1).unique()) for m in masks] == [0, 1, 2, 3, 4]
    off = intervention_curve(target, (ids, c, y), RandomPolicy(0), fractions, strategy=FixedValue(0.0))
    assert off.accuracy[0] == 1.0 and len(off.accuracy) == 5
    assert not lm.training  # the language model keeps its mode


def test_errors(lm):
    with pytest.raises(ValueError, match="distinct known-concept ids in 0..5"):
        KnownConcepts(lm, [1, 9])
    with pytest.raises(ValueError, match="2 names for 3 concepts"):
        KnownConcepts(lm, [0, 1, 2], names=["a", "b"])
    # hostile arguments (docs/security.md): a fractional or string id, a NaN value, a name twice
    with pytest.raises(ValueError, match=r"concepts\[0\] must be a whole number, got 2.7 \(float\)"):
        KnownConcepts(lm, [2.7])
    with pytest.raises(ValueError, match="active_value must be a finite number, got nan"):
        KnownConcepts(lm, [0], active_value=float("nan"))
    with pytest.raises(ValueError, match=r"names must be distinct non-empty strings, got \['a', 'a'\]"):
        KnownConcepts(lm, [0, 1], names=["a", "a"])
    with pytest.raises(TypeError, match="token ids"):
        KnownConcepts(lm)(torch.randn(2, 3))
    assert KnownConcepts(lm).concept_names == tuple(f"known{i}" for i in range(6))
