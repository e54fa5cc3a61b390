"""Tests for penrose_zoo.steerling.losses: each loss against a direct (float64 where it matters) formula."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from penrose_zoo.metrics import hsic
from penrose_zoo.steerling.lm_data import LMBatch, token_concept_labels
from penrose_zoo.steerling.losses import (
    LOG_FLOOR,
    LossWeights,
    chunk_log_absence,
    chunk_log_absence_from_probs,
    chunk_presence,
    concept_presence_loss,
    cross_covariance,
    diffusion_noise,
    independence_loss,
    known_gt_features,
    log1mexp,
    masked_diffusion_loss,
    next_token_loss,
    reconstruction_loss,
    reduced_loss,
    steerling_loss,
    token_sums,
    teacher_forced_features,
    teacher_forcing_alpha,
)


def direct_presence_bce(p64: torch.Tensor, chunk_index: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over chunks of Σ_concepts BCE(1 − ∏(1 − p), y), plain products in float64."""
    c, n = labels.shape
    P = torch.empty(c, n, dtype=torch.float64)
    flat_p = p64.reshape(-1, n)
    flat_i = chunk_index.reshape(-1)
    for ci in range(c):
        P[ci] = 1.0 - torch.prod(1.0 - flat_p[flat_i == ci], dim=0)
    return F.binary_cross_entropy(P, labels.double(), reduction="none").sum(1).mean()


# ------------------------------------------------------------------------------------------
# token losses
# ------------------------------------------------------------------------------------------

def test_next_token_loss_matches_loop():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 10, (2, 6))
    ids[1, 4:] = 10  # pad
    got = next_token_loss(logits, ids, ignore_ids=(10,))
    terms = [-torch.log_softmax(logits[b, i], -1)[ids[b, i + 1]]
             for b in range(2) for i in range(5) if ids[b, i + 1] != 10]
    assert torch.allclose(got, torch.stack(terms).mean(), atol=1e-6)


def test_diffusion_noise_blocks_and_rates():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (64, 128))
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = False  # e.g. bos
    noise = diffusion_noise(ids, mask_id=99, block_size=32, maskable=maskable, generator=g)
    assert noise.noise_level.shape == (64, 4)
    assert ((noise.noise_level >= 0) & (noise.noise_level <= 1)).all()
    # the token level is its block's level
    assert torch.equal(noise.token_level, noise.noise_level.repeat_interleave(32, 1))
    assert not noise.masked[:, 0].any()
    assert torch.equal(noise.noisy_ids[noise.masked], torch.full((int(noise.masked.sum()),), 99))
    assert torch.equal(noise.noisy_ids[~noise.masked], ids[~noise.masked])
    # per block, the masked share tracks t (binomial: 31–32 tokens per block)
    frac = noise.masked[:, 1:].float().reshape(64, -1)  # crude: over all blocks jointly
    level = noise.token_level[:, 1:]
    assert abs(frac.mean().item() - level.mean().item()) < 0.03
    corr = torch.corrcoef(torch.stack([noise.masked.float().reshape(64, 4, 32).mean(-1).flatten(),
                                       noise.noise_level.flatten()]))[0, 1]
    assert corr > 0.9
    # deterministic given the generator
    again = diffusion_noise(ids, mask_id=99, block_size=32, maskable=maskable,
                            generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.masked, noise.masked)


def test_diffusion_noise_ragged_last_block():
    noise = diffusion_noise(torch.zeros(2, 70, dtype=torch.long), mask_id=1, block_size=64,
                            generator=torch.Generator().manual_seed(3))
    assert noise.noise_level.shape == (2, 2) and noise.token_level.shape == (2, 70)


def test_masked_diffusion_loss_matches_formula():
    torch.manual_seed(1)
    logits = torch.randn(3, 8, 7, requires_grad=True)
    ids = torch.randint(0, 7, (3, 8))
    masked = torch.rand(3, 8) < 0.5
    level = torch.rand(3, 8) * 0.9 + 0.1
    ce = torch.stack([-torch.log_softmax(logits[b, i], -1)[ids[b, i]] for b in range(3) for i in range(8)]).reshape(3, 8)
    want_mean = ce[masked].mean()
    want_elbo = (ce[masked] / level[masked]).sum() / 24
    assert torch.allclose(masked_diffusion_loss(logits, ids, masked), want_mean, atol=1e-6)
    assert torch.allclose(masked_diffusion_loss(logits, ids, masked, token_level=level, weighting="elbo"),
                          want_elbo, atol=1e-6)
    # unmasked positions get no gradient
    masked_diffusion_loss(logits, ids, masked).backward()
    assert (logits.grad[~masked] == 0).all() and (logits.grad[masked] != 0).any()


def test_masked_diffusion_loss_with_nothing_masked_is_zero():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    loss = masked_diffusion_loss(logits, torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(logits.grad).all()


# ------------------------------------------------------------------------------------------
# concept presence loss
# ------------------------------------------------------------------------------------------

def test_log1mexp_accuracy():
    a = torch.tensor([-1e-30, -1e-10, -1e-3, -0.5, -math.log(2), -1.0, -20.0, -200.0], dtype=torch.float64)
    want = torch.tensor([math.log(-math.expm1(x)) for x in a.tolist()], dtype=torch.float64)
    assert torch.allclose(log1mexp(a), want, rtol=1e-12)
    z = torch.zeros(1, requires_grad=True)
    v = log1mexp(z)
    v.backward()
    assert torch.isfinite(v).all() and torch.isfinite(z.grad).all()


def test_presence_loss_matches_float64_product_random():
    torch.manual_seed(0)
    b, t, n = 3, 40, 5
    z = torch.randn(b, t, n) - 2.0  # ∏(1 − p) stays far from 0 and 1: the product is representable
    chunk_index = torch.randint(-1, 6, (b, t))
    labels = (torch.rand(6, n) < 0.4).float()
    p64 = torch.sigmoid(z.double())
    want = direct_presence_bce(p64, chunk_index, labels)
    assert want < 0.9 * -LOG_FLOOR  # no log was floored in the reference
    got = concept_presence_loss(z, chunk_index, labels)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5)
    got_p = concept_presence_loss(torch.sigmoid(z), chunk_index, labels, from_probs=True)
    assert torch.allclose(got_p.double(), want, rtol=1e-4)


def test_presence_on_4096_token_chunks_is_accurate_in_float32():
    """Tiny p over 4096 tokens: the naive float32 product loses P; log space keeps it."""
    torch.manual_seed(0)
    t, n = 4096, 4
    z = torch.full((1, t, n), -15.0) + torch.rand(1, t, n) * torch.tensor([0.0, 1.0, 5.0, 14.0])
    idx = torch.zeros(1, t, dtype=torch.long)
    p64 = torch.sigmoid(z.double())
    P64 = 1.0 - torch.prod(1.0 - p64[0], dim=0)
    P32 = chunk_presence(chunk_log_absence(z, idx, 1))[0]
    assert torch.allclose(P32.double(), P64, rtol=1e-4)
    naive = 1.0 - torch.prod(1.0 - torch.sigmoid(z[0]), dim=0)
    assert (naive.double() - P64).abs()[0] / P64[0] > 1e-2  # why log space is needed
    for y in (0.0, 1.0):
        labels = torch.full((1, n), y)
        zz = z.clone().requires_grad_(True)
        got = concept_presence_loss(zz, idx, labels)
        want = direct_presence_bce(p64, idx, labels)
        assert torch.allclose(got.double(), want, rtol=1e-4)
        got.backward()
        assert torch.isfinite(zz.grad).all()


def test_presence_beyond_the_direct_product():
    """When ∏(1 − p) < 1e-16, P = 1 − ∏ rounds to 1 in float64 and BCE sees log(0); the
    log-space loss keeps log(1 − P) = Σ log(1 − p)."""
    z = torch.full((1, 15, 1), 3.0)  # log(1 − P) = 15 · logσ(−3) ≈ −45.7
    idx = torch.zeros(1, 15, dtype=torch.long)
    got = concept_presence_loss(z, idx, torch.zeros(1, 1))
    want = -15 * math.log1p(-1 / (1 + math.exp(-3.0)))
    assert direct_presence_bce(torch.sigmoid(z.double()), idx, torch.zeros(1, 1)) == -LOG_FLOOR
    assert abs(got.item() - want) < 1e-4 * want


def test_presence_with_probabilities_exactly_zero_and_one():
    # chunk 0: all p = 0; chunk 1: one p = 1; chunk 2: mixed ordinary values
    p = torch.zeros(1, 12, 2)
    p[0, 4, :] = 1.0
    p[0, 8:, 0] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    idx = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]])
    log_q = chunk_log_absence_from_probs(p, idx, 3)
    P = chunk_presence(log_q)
    assert torch.equal(P[0], torch.zeros(2)) and torch.equal(P[1], torch.ones(2))
    assert torch.allclose(P[2, 0], torch.tensor(1 - 0.9 * 0.8 * 0.7 * 0.6))
    for labels in (torch.zeros(3, 2), torch.ones(3, 2), torch.tensor([[1., 0], [0, 1], [1, 0]])):
        pp = p.clone().requires_grad_(True)
        got = concept_presence_loss(pp, idx, labels, from_probs=True)
        want = direct_presence_bce(p.double(), idx, labels)  # torch's BCE floors logs at −100 too
        assert torch.isfinite(got)
        assert torch.allclose(got.double(), want, rtol=1e-5), (labels, got, want)
        got.backward()
        assert torch.isfinite(pp.grad).all()
    # the floor is torch's: a confident miss costs exactly −LOG_FLOOR
    miss = concept_presence_loss(p[:, :4, :1], idx[:, :4], torch.ones(1, 1), from_probs=True)
    assert miss.item() == -LOG_FLOOR


def test_presence_loss_ignores_tokens_outside_chunks():
    z = torch.randn(1, 6, 3)
    idx = torch.tensor([[-1, 0, 0, -1, 1, -1]])
    labels = torch.tensor([[1., 0, 1], [0, 1, 0]])
    z2 = z.clone()
    z2[0, [0, 3, 5]] = 100.0  # outside any chunk: must not matter
    assert torch.allclose(concept_presence_loss(z, idx, labels), concept_presence_loss(z2, idx, labels))


def test_presence_loss_negative_weight():
    z = torch.randn(1, 5, 2)
    idx = torch.zeros(1, 5, dtype=torch.long)
    pos_only = concept_presence_loss(z, idx, torch.tensor([[1.0, 0.0]]), negative_weight=0.0)
    want = -torch.log(-torch.expm1(F.logsigmoid(-z[0, :, 0]).sum()))
    assert torch.allclose(pos_only, want, atol=1e-6)


# ------------------------------------------------------------------------------------------
# independence and reconstruction
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,d", [(7, 16), (40, 5)])  # Gram branch and direct branch
def test_independence_loss_matches_definition(B, d):
    torch.manual_seed(B)
    k, u = torch.randn(B, d, dtype=torch.float64), torch.randn(B, d, dtype=torch.float64)
    u = u + 0.5 * k
    kc, uc = k - k.mean(0), u - u.mean(0)
    want = ((kc.T @ uc) / (B - 1)).pow(2).sum()
    assert torch.allclose(independence_loss(k, u), want, rtol=1e-10)
    assert torch.allclose(cross_covariance(k, u), kc.T @ uc / (B - 1), rtol=1e-10)
    # = biased linear-kernel HSIC (REFERENCES "Metrics")
    assert torch.allclose(independence_loss(k, u), hsic(k, u, "linear"), rtol=1e-10)


def test_independence_loss_valid_mask_and_gradient():
    torch.manual_seed(0)
    k = torch.randn(2, 5, 4, requires_grad=True)
    u = torch.randn(2, 5, 4)
    valid = torch.rand(2, 5) < 0.7
    want = independence_loss(k.detach()[valid], u[valid])
    got = independence_loss(k, u, valid)
    assert torch.allclose(got, want)
    got.backward()
    assert (k.grad[~valid] == 0).all()


def test_known_gt_features_and_reconstruction():
    torch.manual_seed(0)
    K = torch.randn(4, 6)
    chunk_index = torch.tensor([[0, 0, 1, -1], [2, 2, 2, -1]])
    labels = torch.tensor([[1., 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0]])
    k_gt = known_gt_features(chunk_index, labels, K)
    want = torch.einsum("btn,ne->bte", token_concept_labels(chunk_index, labels), K)
    assert torch.allclose(k_gt, want)
    h = torch.randn(2, 4, 6)
    u = torch.randn(2, 4, 6, requires_grad=True)
    valid = chunk_index >= 0
    per = ((u - (h - k_gt)) ** 2).sum(-1)
    assert torch.allclose(reconstruction_loss(u, h, k_gt, valid), per[valid].mean())
    assert torch.allclose(reconstruction_loss(u, h, k_gt), per.mean())
    hh = h.clone().requires_grad_(True)
    reconstruction_loss(u, hh, k_gt).backward()
    assert hh.grad is None or (hh.grad == 0).all()  # target detached by default


def test_teacher_forcing_helpers():
    assert teacher_forcing_alpha(0, 100) == 1.0
    assert teacher_forcing_alpha(50, 100) == 0.5
    assert teacher_forcing_alpha(500, 100) == 0.0
    assert teacher_forcing_alpha(10, 0) == 0.0
    kp, kg = torch.zeros(3), torch.ones(3)
    assert torch.allclose(teacher_forced_features(kp, kg, 0.25), torch.full((3,), 0.25))


# ------------------------------------------------------------------------------------------
# the full objective
# ------------------------------------------------------------------------------------------

def _fake(b=2, t=6, v=9, e=5, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = SimpleNamespace(
        logits=torch.randn(b, t, v, generator=g, requires_grad=True),
        hidden=torch.randn(b, t, e, generator=g, requires_grad=True),
        known_features=torch.randn(b, t, e, generator=g, requires_grad=True),
        unknown_features=torch.randn(b, t, e, generator=g, requires_grad=True),
        known_logits=torch.randn(b, t, n, generator=g, requires_grad=True),
    )
    ids = torch.randint(0, v - 1, (b, t), generator=g)
    ids[:, -1] = v - 1  # pad
    chunk_index = torch.tensor([[-1, 0, 0, 1, 1, -1], [-1, 2, 2, 2, 2, -1]])
    batch = LMBatch(ids, chunk_index, torch.tensor([[1., 0, 0], [0, 1, 1], [0, 0, 1]]), torch.arange(3), v - 1)
    return out, batch, torch.randn(n, e, generator=g)


def test_steerling_loss_is_the_weighted_sum():
    out, batch, K = _fake()
    w = LossWeights(concept=0.5, indep=2.0, rec=0.1)
    total, parts = steerling_loss(out, batch, known_embeddings=K, weights=w)
    valid = batch.chunk_index >= 0
    want = (next_token_loss(out.logits, batch.input_ids, ignore_ids=(batch.pad_id,))
            + 0.5 * concept_presence_loss(out.known_logits, batch.chunk_index, batch.chunk_labels)
            + 2.0 * independence_loss(out.known_features, out.unknown_features, valid)
            + 0.1 * reconstruction_loss(out.unknown_features, out.hidden,
                                        known_gt_features(batch.chunk_index, batch.chunk_labels, K), valid))
    assert torch.allclose(total, want)
    assert set(parts) == {"token", "concept", "indep", "rec", "total"}
    total.backward()
    for name in ("logits", "known_logits", "known_features", "unknown_features"):
        g = getattr(out, name).grad
        assert g is not None and torch.isfinite(g).all(), name


def test_steerling_loss_diffusion_and_zero_weights():
    out, batch, K = _fake()
    noise = diffusion_noise(batch.input_ids, mask_id=7, block_size=3, maskable=batch.valid,
                            generator=torch.Generator().manual_seed(0))
    total, parts = steerling_loss(out, batch, known_embeddings=K, objective="diffusion", noise=noise,
                                  weights=LossWeights(0, 0, 0))
    assert set(parts) == {"token", "total"}
    assert torch.allclose(total, masked_diffusion_loss(out.logits, batch.input_ids, noise.masked))
    with pytest.raises(ValueError, match="needs the DiffusionNoise"):
        steerling_loss(out, batch, known_embeddings=K, objective="diffusion")


def test_token_sums_of_row_shards_add_up_to_the_token_loss():
    """The partial sums the ranks all-reduce: (Σ, count) of each row shard add up to the whole
    batch's, and Σ / count is the token loss (next-token, masked mean, masked ELBO)."""
    out, batch, _ = _fake(b=3)
    ids, logits = batch.input_ids, out.logits.detach()
    noise = diffusion_noise(ids, mask_id=7, block_size=3, generator=torch.Generator().manual_seed(1))
    cases = [(dict(pad_id=batch.pad_id), next_token_loss(logits, ids, ignore_ids=(batch.pad_id,))),
             (dict(masked=noise.masked), masked_diffusion_loss(logits, ids, noise.masked)),
             (dict(masked=noise.masked, token_level=noise.token_level, weighting="elbo"),
              masked_diffusion_loss(logits, ids, noise.masked, token_level=noise.token_level, weighting="elbo"))]
    for kw, want in cases:
        num, den = token_sums(logits, ids, **kw)
        torch.testing.assert_close(num / den, want)
        shards = [slice(0, 2), slice(2, 3)]
        parts = [token_sums(logits[r], ids[r], **{k: (v[r] if torch.is_tensor(v) else v) for k, v in kw.items()})
                 for r in shards]
        torch.testing.assert_close(sum(p[0] for p in parts), num)
        assert int(sum(p[1] for p in parts)) == int(den)


def test_reduced_loss_needs_known_gt_only_for_the_reconstruction_term():
    """known_gt is read only when weights.rec is not 0: None is fine without it, and a clear
    ValueError with it (regression: it reached `hidden - None`)."""
    out, batch, _ = _fake()
    args = (out, batch.input_ids, batch.chunk_index, batch.chunk_labels, None)
    total, parts = reduced_loss(*args, weights=LossWeights(concept=0.0, indep=0.0, rec=0.0), pad_id=batch.pad_id)
    assert set(parts) == {"token", "total"}
    assert torch.allclose(total, next_token_loss(out.logits, batch.input_ids, ignore_ids=(batch.pad_id,)))
    with pytest.raises(ValueError, match="known_gt is needed"):
        reduced_loss(*args, weights=LossWeights(concept=0.0, indep=0.0, rec=0.1), pad_id=batch.pad_id)
