"""Tests for penrose_zoo.steerling.attribution, .steer and .measure, on a tiny hand-written stand-in model
that satisfies the ConceptLM protocol (the Steerling wrapper implements the same protocol).

Index legend: b batch, t position, v vocabulary, e embedding, n known, m unknown, r rank.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from penrose_zoo.steerling.attribution import (
    ConceptLM,
    ConceptTarget,
    LogitTarget,
    active_concepts,
    concept_attribution,
    forward_ids,
    integrated_gradients,
)
from penrose_zoo.steerling.lm_data import LabelledChunk, iterate_lm_batches, pack_chunks
from penrose_zoo.steerling.losses import LossWeights, steerling_loss
from penrose_zoo.steerling.measure import (
    collect_chunk_stats,
    concept_detection_auc,
    evaluate,
    logit_share,
    pathway_hsic,
    token_control,
)
from penrose_zoo.steerling.steer import (
    Intervention,
    boost,
    concept_top_tokens,
    current_weights,
    intervention_kwargs,
    steer,
    steering_effect,
    suppress,
)
from penrose_zoo.steerling.tokenizer import ByteTokenizer


# ------------------------------------------------------------------------------------------
# The stand-in: same composition as the release (top-k known head, factorised unknown head on
# h.detach(), ε = h − (û + k̂), ε off under known interventions), with a toy causal backbone.
# ------------------------------------------------------------------------------------------

@dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor
    known_features: torch.Tensor
    unknown_features: torch.Tensor
    epsilon: torch.Tensor | None
    known_logits: torch.Tensor
    known_weights: torch.Tensor
    known_topk_indices: torch.Tensor | None
    known_topk_weights: torch.Tensor | None
    unknown_topk_indices: torch.Tensor | None
    unknown_topk_logits: torch.Tensor | None  # σ applied by the consumer (release style)
    unknown_weights: torch.Tensor


class TinyConceptLM(nn.Module):
    def __init__(self, vocab=40, e=16, n=6, m=10, r=4, topk_known=3, topk_unknown=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(vocab, e)
        self.mix = nn.Linear(e, e)
        self.known_predictor = nn.Linear(e, n, bias=False)
        self.K = nn.Parameter(torch.randn(n, e))
        self.down = nn.Linear(e, r, bias=False)
        self.up = nn.Linear(r, m, bias=False)
        self.coef = nn.Parameter(torch.randn(m, r) / math.sqrt(r))
        self.basis = nn.Parameter(torch.randn(e, r))
        self.n, self.m, self.tk, self.tu = n, m, topk_known, topk_unknown
        self.mask_token_id = vocab - 1
        self.calls: list[int] = []  # batch sizes seen by forward_from_embeddings

    # protocol ---------------------------------------------------------------------------
    def embed(self, input_ids):
        return self.tok(input_ids)

    def concept_embeddings(self, kind, ids=None):
        if kind == "known":
            return self.K if ids is None else self.K[ids]
        coef = self.coef if ids is None else self.coef[ids]
        return coef @ self.basis.T  # factorised: (…, r) · (r, e)

    def lm_head_weight(self):
        return self.tok.weight  # tied

    @staticmethod
    def _override(w, spec, positions):
        """Steerling.forward's rule: w[..., c] = value at positions; value float or (b, t)."""
        w = w.clone()
        for c, value in spec.items():
            v = torch.as_tensor(value, dtype=w.dtype).expand(w.shape[:-1])
            w[..., c] = torch.where(positions, v, w[..., c])
        return w

    def forward_from_embeddings(self, x, *, intervene_known=None, intervene_unknown=None,
                                positions=None, known_gt_features=None):
        self.calls.append(x.shape[0])
        T = x.shape[1]
        causal_mean = x.cumsum(1) / torch.arange(1, T + 1, device=x.device).view(1, T, 1)
        h = torch.tanh(self.mix(causal_mean)) + 0.5 * x  # (b, t, e)

        zk = self.known_predictor(h).clamp(-15, 15)  # (b, t, n)
        wk = torch.sigmoid(zk)
        kidx = wk.topk(self.tk, -1).indices
        kw = wk.gather(-1, kidx)
        dense_k = torch.zeros_like(wk).scatter(-1, kidx, kw)
        if positions is None:
            positions = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if intervene_known:
            dense_k = self._override(dense_k, intervene_known, positions)
            k_hat = dense_k @ self.K  # top-k fields stay pre-intervention, as in Steerling's output
        else:
            k_hat = torch.einsum("btj,btje->bte", kw, self.K[kidx])

        zu = self.up(self.down(h.detach())).clamp(-15, 15)  # (b, t, m)
        uidx = zu.topk(self.tu, -1).indices
        ul = zu.gather(-1, uidx)
        dense_u = torch.zeros_like(zu).scatter(-1, uidx, torch.sigmoid(ul))
        if intervene_unknown:
            dense_u = self._override(dense_u, intervene_unknown, positions)
            u_hat = dense_u @ self.concept_embeddings("unknown")
        else:
            u_hat = torch.einsum("btj,btje->bte", torch.sigmoid(ul), self.concept_embeddings("unknown", uidx))

        k_lm = k_hat if known_gt_features is None else known_gt_features
        if not intervene_known:
            eps = h - (u_hat.detach() + k_lm)
            composed = u_hat.detach() + eps + k_lm
        else:
            eps = None
            composed = u_hat + k_lm
        logits = composed @ self.tok.weight.T
        return Out(logits, h, k_hat, u_hat, eps, zk, dense_k, kidx, kw, uidx, ul, dense_u)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model():
    return TinyConceptLM().eval()


@pytest.fixture
def ids():
    return torch.randint(0, 39, (3, 7), generator=torch.Generator().manual_seed(1))


def test_stand_in_satisfies_protocol(model):
    assert isinstance(model, ConceptLM)


# ------------------------------------------------------------------------------------------
# concept attribution
# ------------------------------------------------------------------------------------------

def test_concept_attribution_parts_sum_to_logit(model, ids):
    out = forward_ids(model, ids)
    targets = out.logits.topk(5, -1).indices  # (b, t, 5)
    attr = concept_attribution(model, out, targets)
    total = attr.known.sum(-1) + attr.unknown.sum(-1) + attr.epsilon
    assert torch.allclose(total, out.logits.gather(-1, targets), atol=1e-4)
    assert attr.error < 1e-4
    assert attr.known.shape == (3, 7, 5, model.tk) and attr.unknown.shape == (3, 7, 5, model.tu)
    # each term is exactly w_i (v_iᵀ W_y), checked one entry by hand
    b, t, j, k = 1, 4, 2, 0
    i = int(attr.known_ids[b, t, k])
    w = torch.sigmoid(out.known_logits[b, t, i])
    want = w * (model.K[i] @ model.tok.weight[targets[b, t, j]])
    assert torch.allclose(attr.known[b, t, j, k], want, atol=1e-6)
    ids_top, vals_top = attr.top_known(2)
    assert ids_top.shape == vals_top.shape == (3, 7, 5, 2)


def test_concept_attribution_without_epsilon_and_with_dense_weights(model, ids):
    # under a known intervention ε is off; the dense weights carry the edit (the top-k fields,
    # as in Steerling's output, still describe the unsteered weights and must not be used)
    out = forward_ids(model, ids, **intervention_kwargs(suppress(2), tuple(ids.shape)))
    assert out.epsilon is None and (out.known_topk_indices == 2).any()
    attr = concept_attribution(model, out)  # default targets: argmax
    assert (attr.epsilon == 0).all()
    assert attr.error < 1e-4
    assert not ((attr.known_ids == 2).unsqueeze(2) & (attr.known != 0)).any()  # clamped: no part


def test_concept_attribution_from_topk_fields_only(model, ids):
    out = dataclasses.replace(forward_ids(model, ids), known_weights=None, unknown_weights=None)
    attr = concept_attribution(model, out)
    assert torch.equal(attr.known_ids, out.known_topk_indices)
    assert torch.equal(attr.unknown_ids, out.unknown_topk_indices)  # σ of unknown_topk_logits
    assert attr.error < 1e-4


def test_active_concepts_accepts_mappings(model, ids):
    out = forward_ids(model, ids)
    as_dict = {"unknown_topk_indices": out.unknown_topk_indices, "unknown_topk_logits": out.unknown_topk_logits}
    i, w = active_concepts(as_dict, "unknown")
    assert torch.equal(i, out.unknown_topk_indices)
    assert torch.allclose(w, torch.sigmoid(out.unknown_topk_logits))
    with pytest.raises(AttributeError):
        active_concepts({}, "known")


# ------------------------------------------------------------------------------------------
# Integrated Gradients
# ------------------------------------------------------------------------------------------

def test_ig_completeness_and_chunking(model, ids):
    target = LogitTarget(position=6, token=torch.tensor([3, 5, 7]))
    res = integrated_gradients(model, ids, target, steps=256, chunk_size=64)
    assert res.attributions.shape == (3, 7)
    assert res.max_completeness_error < 2e-2 * res.f_input.abs().max().item() + 1e-3
    # coarse vs fine: the error shrinks with more steps
    coarse = integrated_gradients(model, ids, target, steps=4, chunk_size=4)
    assert coarse.max_completeness_error >= res.max_completeness_error
    # chunking does not change the result, and memory stays bounded: no forward sees more
    # than chunk_size · b sequences
    model.calls.clear()
    a = integrated_gradients(model, ids, target, steps=16, chunk_size=3)
    assert max(model.calls) <= 3 * ids.shape[0]
    b = integrated_gradients(model, ids, target, steps=16, chunk_size=16)
    assert torch.allclose(a.attributions, b.attributions, atol=1e-5)
    # f values are the model's
    out = forward_ids(model, ids)
    assert torch.allclose(res.f_input, out.logits[torch.arange(3), 6, torch.tensor([3, 5, 7])], atol=1e-5)


def test_ig_causal_model_gives_future_tokens_nothing(model, ids):
    res = integrated_gradients(model, ids, LogitTarget(2, 4), steps=8)
    assert torch.all(res.attributions[:, 3:] == 0)


def test_ig_token_to_concept_and_positions(model, ids):
    target = ConceptTarget(position=5, concept=1)
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[:, 2] = True
    res = integrated_gradients(model, ids, target, steps=128, chunk_size=32, token_mask=pos)
    assert torch.all(res.attributions[~pos] == 0)
    # baseline: only position 2 masked
    masked = ids.clone()
    masked[:, 2] = model.mask_token_id
    f0 = torch.sigmoid(forward_ids(model, masked).known_logits[:, 5, 1])
    assert torch.allclose(res.f_baseline, f0, atol=1e-6)
    assert res.max_completeness_error < 1e-3
    assert torch.allclose(res.attributions.sum(-1), res.f_input - res.f_baseline, atol=1e-3)


def test_ig_under_an_intervention(ids):
    """Forward keywords (dicts with per-position values, positions) are tiled over the steps.
    With ε off the logits see the top-k cut, which jumps along the path: the completeness error
    shows it; without a cut (top-k = all) IG is complete again."""
    errors = {}
    for topk in (3, 6):
        model = TinyConceptLM(topk_known=topk, topk_unknown=10).eval()
        clean = forward_ids(model, ids)
        pos = torch.rand(3, 7, generator=torch.Generator().manual_seed(0)) < 0.5
        kw = intervention_kwargs(Intervention(known_scale={1: 3.0}, positions=pos), tuple(ids.shape), clean)
        res = integrated_gradients(model, ids, LogitTarget(6, 0), steps=64, chunk_size=16, **kw)
        steered = forward_ids(model, ids, **kw)
        assert torch.allclose(res.f_input, steered.logits[:, 6, 0], atol=1e-5)
        errors[topk] = res.max_completeness_error / res.f_input.abs().max().item()
    assert errors[6] < 0.02 < errors[3]


def test_ig_matches_captum(model, ids):
    captum_attr = pytest.importorskip("captum.attr")
    steps, pos_t, tok = 20, 6, torch.tensor([1, 2, 3])
    ours = integrated_gradients(model, ids, LogitTarget(pos_t, tok), steps=steps, chunk_size=7)

    x = model.embed(ids).detach()
    x0 = model.embed(torch.full_like(ids, model.mask_token_id)).detach()

    def f(emb):
        logits = model.forward_from_embeddings(emb).logits
        reps = emb.shape[0] // 3
        return logits[torch.arange(emb.shape[0]), pos_t, tok.repeat(reps)]

    ig = captum_attr.IntegratedGradients(f)
    theirs = ig.attribute(x, baselines=x0, n_steps=steps, method="riemann_right", internal_batch_size=3 * 5)
    assert torch.allclose(ours.attributions, theirs.sum(-1), atol=1e-4)


# ------------------------------------------------------------------------------------------
# steering
# ------------------------------------------------------------------------------------------

def test_intervention_spec_to_model_kwargs(model, ids):
    out = forward_ids(model, ids)
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 3] = pos[2, 6] = True
    # a pure set spec is Steerling.forward's own form: float values and positions
    kw = intervention_kwargs(Intervention(known_set={4: 0.0, 1: 0.7}, positions=pos), tuple(ids.shape))
    assert kw == {"intervene_known": {4: 0.0, 1: 0.7}, "positions": pos}
    assert intervention_kwargs(suppress(4), tuple(ids.shape)) == {"intervene_known": {4: 0.0}}
    # a scale becomes per-position values, factor × current post-top-k weight
    c = int(out.known_topk_indices[0, 3, 0])
    c = c if c != 4 else int(out.known_topk_indices[0, 3, 1])
    spec = Intervention(known_set={4: 0.0}, known_scale={c: 2.0}, positions=pos)
    kw = intervention_kwargs(spec, tuple(ids.shape), out)
    assert kw["intervene_known"][c].shape == (3, 7)
    assert torch.allclose(kw["intervene_known"][c], 2.0 * out.known_weights[..., c])
    steered = forward_ids(model, ids, **kw)
    assert steered.known_weights[0, 3, 4] == 0
    assert torch.allclose(steered.known_weights[0, 3, c], 2 * out.known_weights[0, 3, c])
    untouched = ~pos
    assert torch.allclose(steered.known_weights[untouched], out.known_weights[untouched])
    with pytest.raises(ValueError, match="both set and scaled"):
        Intervention(known_set={1: 0.0}, known_scale={1: 2.0})
    with pytest.raises(ValueError, match="unsteered output"):
        intervention_kwargs(Intervention(known_scale={1: 2.0}), tuple(ids.shape))
    with pytest.raises(ValueError, match="positions has shape"):
        intervention_kwargs(Intervention(known_set={1: 0.0}, positions=pos[:1]), tuple(ids.shape))


def test_unknown_only_spec_switches_epsilon_off(model, ids):
    clean = forward_ids(model, ids)
    kw = intervention_kwargs(Intervention(unknown_set={0: 0.0}), tuple(ids.shape), clean)
    # a no-op known edit: concept 0 set to its current weight, which switches ε off
    assert torch.equal(kw["intervene_known"][0], clean.known_weights[..., 0])
    out = steer(model, ids, Intervention(unknown_set={0: 1.0}))
    assert out.epsilon is None and (out.unknown_weights[..., 0] == 1.0).all()
    assert torch.allclose(out.known_weights, clean.known_weights)
    kept = intervention_kwargs(Intervention(unknown_set={0: 0.0}, keep_epsilon=True), tuple(ids.shape))
    assert "intervene_known" not in kept
    # with ε on, an unknown edit cancels out of the logits (the release's rule)
    on = forward_ids(model, ids, **kept)
    assert torch.allclose(on.logits, clean.logits, atol=1e-5)


def test_current_weights_reads_post_topk(model, ids):
    out = forward_ids(model, ids)
    cw = current_weights(out, "known", [0, 5])
    assert torch.allclose(cw, out.known_weights[..., [0, 5]])


@pytest.mark.parametrize("kind", ["known", "unknown"])
def test_steering_effect_on_held_out_prompts(kind):
    model = TinyConceptLM(topk_known=6, topk_unknown=10, seed=3).eval()  # every concept active
    prompts = torch.randint(0, 39, (8, 12), generator=torch.Generator().manual_seed(7))
    concept = 2
    eff = steering_effect(model, prompts, concept, kind=kind, boost_value=1.0)
    assert eff.top_tokens.shape == (10,)
    assert torch.equal(eff.top_tokens, concept_top_tokens(model, concept, 10, kind))
    assert eff.suppress_effect < 0 < eff.boost_effect
    # scaling up also raises the mass; suppression is monotone in the positions it covers
    eff2 = steering_effect(model, prompts, concept, kind=kind, boost_value=None, boost_scale=3.0)
    assert eff2.boost_effect > 0
    last = torch.zeros_like(prompts, dtype=torch.bool)
    last[:, -1] = True
    eff3 = steering_effect(model, prompts, concept, kind=kind, positions=last)
    assert eff3.suppress_effect < 0 < eff3.boost_effect


def test_boost_and_suppress_helpers():
    assert suppress(3).known_set == {3: 0.0}
    assert boost(3, value=0.9, kind="unknown").unknown_set == {3: 0.9}
    assert boost(3, scale=2.0).known_scale == {3: 2.0}
    with pytest.raises(ValueError):
        boost(3)


# ------------------------------------------------------------------------------------------
# metrics, and a short end-to-end training run on labelled text
# ------------------------------------------------------------------------------------------

def test_token_control_formula(model):
    tc = token_control(model, k=10, block=4)
    assert tc.shape == (model.n,)
    p = torch.softmax(model.K @ model.tok.weight.T, -1)
    assert torch.allclose(tc, p.topk(10, -1).values.sum(-1), atol=1e-6)
    assert ((tc > 10 / 40) & (tc <= 1)).all()
    tu = token_control(model, [0, 3], kind="unknown")
    assert tu.shape == (2,)


def test_pathway_hsic_uses_both_kernels():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(300, 4, generator=g)
    indep = pathway_hsic(k, torch.randn(300, 4, generator=g), max_samples=200)
    dep = pathway_hsic(k, k ** 2 + 0.1 * torch.randn(300, 4, generator=g), max_samples=200)
    assert set(indep) == {"hsic_linear", "hsic_rbf"}
    assert dep["hsic_rbf"] > 3 * indep["hsic_rbf"]  # non-linear dependence: RBF sees it


def test_logit_share(model, ids):
    out = forward_ids(model, ids)
    share = logit_share(model, out)
    assert share["share_concept"].shape == (3, 7, 1)
    assert ((share["share_known"] >= 0) & (share["share_known"] <= share["share_concept"] + 1e-7)).all()
    assert share["error"] < 1e-4
    off = logit_share(model, steer(model, ids, Intervention(known_set={0: 0.5})))
    assert off["mean_share_concept"] == pytest.approx(1.0)  # ε off: all from concepts


def _synthetic_corpus(n_per=24):
    words = {0: ["apple", "pear", "plum"], 1: ["ship", "sail", "oar"], 2: ["clock", "tick", "hour"]}
    g = np.random.default_rng(0)
    chunks = []
    for i in range(3 * n_per):
        c = i % 3
        text = " ".join(g.choice(words[c], size=4)) + f" {i}"
        chunks.append(LabelledChunk(text, (c,)))
    return chunks


def test_train_then_measure_end_to_end():
    """A few hundred steps of the full objective on labelled text, then every metric."""
    tok = ByteTokenizer()
    model = TinyConceptLM(vocab=tok.vocab_size, e=24, n=3, m=8, topk_known=3, topk_unknown=4, seed=0)
    chunks = _synthetic_corpus()
    train = pack_chunks(chunks[: 54], tok, 64, n_concepts=3)
    val = pack_chunks(chunks[54:], tok, 64, n_concepts=3)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)
    history = []
    for _epoch in range(10):
        for batch in iterate_lm_batches(train, 4, g):
            out = forward_ids(model, batch.input_ids)
            loss, parts = steerling_loss(out, batch, known_embeddings=model.concept_embeddings("known"),
                                         weights=LossWeights(concept=1.0, indep=0.1, rec=0.1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(parts)
    assert all(math.isfinite(p["total"]) for p in history)
    first = np.mean([p["concept"] for p in history[:5]])
    last = np.mean([p["concept"] for p in history[-5:]])
    assert last < 0.5 * first
    model.eval()
    stats = collect_chunk_stats(model, iterate_lm_batches(val, 4))
    aucs, mean_auc = concept_detection_auc(stats.presence, stats.labels)
    assert aucs.shape == (3,) and mean_auc > 0.8
    metrics = evaluate(model, iterate_lm_batches(train, 4), iterate_lm_batches(val, 4))
    assert set(metrics) == {"concept_auc", "token_control", "hsic_linear", "hsic_rbf", "probe_auc_concept",
                            "probe_auc_residual", "probing_gap", "logit_share_concept",
                            "logit_share_known", "attribution_error"}
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["attribution_error"] < 1e-3
