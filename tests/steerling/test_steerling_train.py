"""Steerling with the ConceptLM protocol (attribution, IG, steering on the compiled model) and
training (penrose_zoo.steerling.train): exact resume, both forms (ε off / on), both objectives, errors.
Tiny sizes throughout; torch runs on one thread."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from penrose.errors import PenroseError
from penrose_zoo.data import DataError
from penrose_zoo.steerling.attribution import (ConceptLM, ConceptTarget, LogitTarget, concept_attribution, forward_ids,
                                               integrated_gradients)
from penrose_zoo.steerling.lm_data import LMBatch
from penrose_zoo.steerling.losses import LossWeights, diffusion_noise, known_gt_features, steerling_loss
from penrose_zoo.steerling.model import Steerling
from penrose_zoo.steerling.steer import Intervention, steer, steering_effect
from penrose_zoo.steerling.train import TrainConfig, concept_id, load_checkpoint, train

torch.set_num_threads(1)

MODEL = dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=16, block_size=32, diff_block_size=4, intermediate_size=32)
CONCEPTS = dict(n_concepts=6, n_unknown_concepts=12, concept_dim=16, topk_known=3, topk_known_features=3,
                factorize_rank=4, unknown_topk=4)
WORDS = {"cats": "cat meow purr whisker tail", "code": "python code bug loop compile", "sea": "wave ship salt tide fish"}


def write_corpus(root: Path, n: int = 24) -> Path:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for cat, words in WORDS.items():
        ws = words.split()
        entries = [" ".join(rng.choice(ws) for _ in range(rng.randint(3, 8))) + f" {i}" for i in range(n)]
        (root / cat).write_text("\n%\n".join(entries) + "\n")
    return root


def tiny(causal=True, eps=True) -> Steerling:
    m = Steerling(MODEL, dict(CONCEPTS, use_epsilon_correction=eps), 260, causal=causal, seed=0,
                  large_concept_threshold=6)
    return m


@pytest.fixture(scope="module")
def models():
    return {"causal": tiny(True, True), "block": tiny(False, False)}


def test_protocol_matches_forward(models):
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    for m in models.values():
        assert isinstance(m, ConceptLM)
        a, b = m(ids), forward_ids(m, ids)
        torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-6)
        assert m.concept_embeddings("known").shape == (6, 16)
        assert m.concept_embeddings("unknown", torch.tensor([[0, 3]])).shape == (1, 2, 16)
        assert m.lm_head_weight().shape == (260, 16) and m.mask_token_id == 259
        x = m.embed(ids).detach().requires_grad_(True)
        m.forward_from_embeddings(x).logits[0, -1, 5].backward()
        assert x.grad is not None and x.grad.abs().sum() > 0


def test_attribution_sums_to_logit(models):
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    for m in models.values():
        for kw in ({}, {"intervene_known": {1: 0.7}}, {"intervene_unknown": {2: 0.9}, "intervene_known": {0: 0.0}}):
            out = forward_ids(m, ids, **kw)
            attr = concept_attribution(m, out, torch.randint(0, 260, (2, 9, 3)))
            assert attr.error < 1e-4, (kw, attr.error)


def test_per_position_values_and_steering(models):
    m = models["causal"]
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(3))
    a = forward_ids(m, ids, intervene_known={2: 0.5})
    b = forward_ids(m, ids, intervene_known={2: torch.full((2, 6), 0.5)})
    torch.testing.assert_close(a.logits, b.logits)
    assert torch.equal(a.known_weights[..., 2], torch.full((2, 6), 0.5))
    # ε on, no intervention: logits = h·Wᵀ, smooth in x, so IG is complete
    ig = integrated_gradients(m, ids, LogitTarget(5, 7), steps=64, chunk_size=16)
    assert ig.max_completeness_error < 1e-2 * max(1.0, float((ig.f_input - ig.f_baseline).abs().max()))
    ig2 = integrated_gradients(m, ids, ConceptTarget(4, 1), steps=16)
    assert ig2.attributions.shape == (2, 6)
    out = steer(m, ids, Intervention(known_scale={1: 2.0}))
    assert concept_attribution(m, out).error < 1e-4
    eff = steering_effect(m, ids, 1)
    assert eff.mass_null > 0


def test_teacher_forcing_reaches_the_head(models):
    m = models["block"]  # ε off: the head reads k̂ + û
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    idx, labels = torch.tensor([[0, 0, 0, 1, 1]]), torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0]])
    kgt = known_gt_features(idx, labels, m.concept_embeddings("known"))
    out = forward_ids(m, ids, known_gt_features=kgt, teacher_forcing=1.0)
    torch.testing.assert_close(out.composed, kgt + out.unknown_features)


def test_resume_is_exact_and_checks_config(tmp_path):
    data = str(write_corpus(tmp_path / "corpus"))
    cfg = TrainConfig(preset="tiny", data=data, steps=6, seq_len=32, batch_size=4)
    full = train(cfg, tmp_path / "full", val_every=3, save_every=100, progress=False, log=lambda m: None)
    part = train(cfg, tmp_path / "part", val_every=3, save_every=100, stop_after=4, progress=False, log=lambda m: None)
    assert part["step"] == 4
    done = train(cfg, tmp_path / "part", val_every=3, save_every=100, progress=False, log=lambda m: None)
    assert done["step"] == 6 and done["history"] == full["history"]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("full", "part"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(PenroseError, match="different configuration.*lambda_indep"):
        train(TrainConfig(preset="tiny", data=data, steps=6, seq_len=32, batch_size=4, lambda_indep=0.5),
              tmp_path / "part", progress=False, log=lambda m: None)
    model, tok, names, state = load_checkpoint(tmp_path / "full")
    assert names == sorted(WORDS) and tok.vocab_size == model.vocab_size == 260
    assert concept_id(names, "sea") == 2
    with pytest.raises(PenroseError, match="unknown concept 'seas'.*did you mean sea"):
        concept_id(names, "seas")


@pytest.mark.parametrize("variant,eps,tf", [("block_causal", False, 2), ("causal", True, 0)])
def test_both_forms_and_objectives_train(tmp_path, variant, eps, tf):
    data = str(write_corpus(tmp_path / "corpus"))
    cfg = TrainConfig(preset="tiny", data=data, steps=3, seq_len=32, batch_size=4, variant=variant, epsilon=eps,
                      teacher_forcing_steps=tf)
    st = train(cfg, tmp_path / "run", val_every=3, progress=False, log=lambda m: None)
    v = st["history"]["val"][-1]
    assert all(torch.isfinite(torch.tensor(x)) for x in v.values()) and {"token", "concept", "indep", "rec"} <= set(v)


def test_corpus_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError):
        train(TrainConfig(data=str(tmp_path / "empty"), steps=1), tmp_path / "o1", progress=False)
    with pytest.raises(DataError, match="no directory"):
        train(TrainConfig(data=str(tmp_path / "missing"), steps=1), tmp_path / "o2", progress=False)
    data = str(write_corpus(tmp_path / "corpus"))
    with pytest.raises(DataError):
        train(TrainConfig(data=data, categories=["nope"], steps=1), tmp_path / "o3", progress=False)


def _batch(v=256):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, v, (3, 8), generator=g)
    ids[:, 0] = 257  # bos: off chunks
    ids[2, -2:] = 258  # pad
    idx = torch.tensor([[-1, 0, 0, 0, 1, 1, 1, 1], [-1, 2, 2, 2, 2, 2, 3, 3], [-1, 4, 4, 4, 4, 4, -1, -1]])
    labels = (torch.rand(5, 6, generator=g) < 0.4).float()
    return LMBatch(ids, idx, labels, torch.arange(5), 258)


@pytest.mark.parametrize("variant", ["causal", "block_causal"])
def test_batch_loss_is_the_composed_objective(models, variant):
    """batch_loss (the one loss path, here with the null communicator) is steerling_loss of the
    training forward pass: the terms from partial sums equal the composed means."""
    from penrose_zoo.steerling.train import batch_loss

    m = models["causal" if variant == "causal" else "block"]
    batch = _batch()
    cfg = TrainConfig(variant=variant, lambda_concept=0.3, lambda_indep=2.0, lambda_rec=0.5)
    loss, parts = batch_loss(m, batch, cfg, step=0, noise_seed=11)
    kw = {}
    if variant == "causal":
        out = forward_ids(m, batch.input_ids)
    else:
        noise = diffusion_noise(batch.input_ids, mask_id=m.mask_token_id, block_size=m.sizes["blk"],
                                maskable=batch.valid, generator=torch.Generator().manual_seed(11))
        out, kw = forward_ids(m, noise.noisy_ids), dict(objective="diffusion", noise=noise)
    want, wparts = steerling_loss(out, batch, known_embeddings=m.concept_embeddings("known"),
                                  weights=LossWeights(0.3, 2.0, 0.5), **kw)
    torch.testing.assert_close(loss, want)
    assert parts.keys() == wparts.keys() == {"token", "concept", "indep", "rec", "total"}
    assert all(parts[k] == pytest.approx(wparts[k], rel=1e-6) for k in parts)
    assert parts["total"] == pytest.approx(parts["token"] + 0.3 * parts["concept"] + 2.0 * parts["indep"]
                                           + 0.5 * parts["rec"])


def test_validate_is_the_mean_of_batch_losses(models):
    """validate (written once: one process here, round-robin over ranks under torchrun) is the
    mean of batch_loss's parts with the fixed validation noise seeds 10_000 + i."""
    from penrose_zoo.steerling.train import TrainForward, batch_loss, validate

    m = models["block"]
    cfg = TrainConfig(variant="block_causal")
    batches = [_batch(), _batch(200)]
    v = validate(m, batches, cfg)
    parts = [batch_loss(m, b, cfg, step=0, noise_seed=10_000 + i, train=False)[1] for i, b in enumerate(batches)]
    assert v.keys() == parts[0].keys()
    assert all(v[k] == pytest.approx((parts[0][k] + parts[1][k]) / 2, rel=1e-12) for k in v)
    assert validate(TrainForward(m), batches, cfg) == v  # a model or its training forward module
    assert m.training  # left as it was


def test_checkpoint_io_is_reexported():
    from penrose_zoo.steerling import checkpoints, train as train_module

    for name in ("save_checkpoint", "load_checkpoint", "read_train_state", "config_differences", "concept_id",
                 "FORMAT"):
        assert getattr(train_module, name) is getattr(checkpoints, name), name
