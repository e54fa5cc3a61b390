"""The planted-concept corpus (penrose_zoo.steerling.planted), the known-answer measurements
(penrose_zoo.steerling.known_answer, `penrose steerling planted | known-answer`) and the
release-form regression they revealed (the known embeddings got no gradient). Tiny sizes; one
torch thread."""

from __future__ import annotations

import json
import os

import pytest
import torch

from penrose.errors import PenroseError
from penrose_zoo.steerling.cli import main
from penrose_zoo.steerling.lm_data import LMBatch, load_concept_corpus, pack_chunks
from penrose_zoo.steerling.planted import (MANIFEST, PlantedConfig, generate_planted, load_planted, packed_token_labels,
                                           text_concept_rates, write_planted)
from penrose_zoo.steerling.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")


def test_generator_is_seeded_and_plants_what_it_says():
    cfg = PlantedConfig(n_chunks=400, seed=3)
    a, b = generate_planted(cfg), generate_planted(cfg)
    assert [c.text for c in a.chunks] == [c.text for c in b.chunks]
    assert [c.text for c in generate_planted(PlantedConfig(n_chunks=400, seed=4)).chunks] != [c.text for c in a.chunks]
    assert len({c.text for c in a.chunks}) == 400
    withheld, pattern = set(cfg.withheld_names), cfg.pattern_name
    assert withheld == {"theta"} and pattern == "eta"
    counts = {n: 0 for n in cfg.names}
    for ch in a.chunks:
        assert ch.labels and not set(ch.labels) & withheld and set(ch.labels) <= set(ch.concepts)
        for c in ch.concepts:
            counts[c] += 1
        # every span is a word of its concept's lexicon (numbers for the pattern concept), and every
        # concept the chunk carries has a span
        for s, e, c in ch.spans:
            word = ch.text[s:e]
            assert word.isdigit() if c == pattern else word in a.lexicon[c], (word, c)
        assert {c for _, _, c in ch.spans} == set(ch.concepts)
        # filler words belong to no concept
        lex = {w for ws in a.lexicon.values() for w in ws}
        spanned = {ch.text[s:e] for s, e, _ in ch.spans}
        for w in ch.text.replace(".", "").split():
            assert w in spanned or w not in lex or any(w in a.lexicon[c] for c in ch.concepts), w
    # overlap: neighbouring concepts share a word; the rare concept is rarer; partners co-occur
    assert set(a.lexicon["alpha"]) & set(a.lexicon["beta"])
    assert counts["zeta"] < 0.7 * counts["alpha"]
    both = sum("alpha" in ch.concepts and "beta" in ch.concepts for ch in a.chunks)
    assert both > 0.3 * counts["alpha"]


def test_config_errors():
    with pytest.raises(ValueError, match="withheld"):
        PlantedConfig(n_concepts=3, withheld=2)
    with pytest.raises(ValueError, match="n_concepts"):
        PlantedConfig(n_concepts=1)
    with pytest.raises(ValueError, match="co_occur must be a finite number from 0 to 1, got 1.5"):
        PlantedConfig(co_occur=1.5)


def test_written_corpus_reads_as_training_data(tmp_path):
    corpus = generate_planted(PlantedConfig(n_chunks=300, seed=1))
    d = write_planted(corpus, tmp_path / "p")
    with pytest.raises(PenroseError, match=r"p exists and is not empty; give a new folder, or replace"):
        write_planted(corpus, d)
    cc = load_concept_corpus(d)  # the reader the training code uses: the manifest is skipped
    assert list(cc.concept_names) == sorted(corpus.labelled_names)
    truth = corpus.by_text()
    assert len(cc.train) + len(cc.val) == 300
    for ch in cc.train + cc.val:
        assert tuple(sorted(cc.concept_names[i] for i in ch.concepts)) == tuple(sorted(truth[ch.text].labels))
    back = load_planted(d)
    assert back.chunks == corpus.chunks and back.lexicon == corpus.lexicon and back.config == corpus.config
    # token labels: a labelled token is a character of a word of that concept
    packed = pack_chunks(cc.val, ByteTokenizer(), 48, n_concepts=cc.n_concepts)  # long chunks span rows
    names = list(cc.concept_names) + ["theta"]
    tl = packed_token_labels(packed, corpus, names)
    assert tl.shape == (*packed.input_ids.shape, len(names)) and tl.sum() > 0
    alphabet = {n: set("".join(corpus.lexicon[n])) if n != "eta" else set("0123456789") for n in names}
    r, t, j = tl.nonzero(as_tuple=True)
    for ri, ti, ji in zip(r.tolist(), t.tolist(), j.tolist()):
        assert chr(int(packed.input_ids[ri, ti])) in alphabet[names[ji]]
    # and every character of a lexicon word in a labelled chunk is labelled (spans cover the words)
    assert tl[..., names.index("theta")].sum() > 0


def test_text_rates():
    corpus = generate_planted(PlantedConfig(n_chunks=20, seed=0))
    w = corpus.lexicon["alpha"][0]
    r = text_concept_rates(f"ta {w} rage ro 12 13.", corpus)
    assert r["alpha"] == pytest.approx(1 / 6) and r["eta"] == pytest.approx(2 / 6) and r["gamma"] == 0.0
    assert text_concept_rates("", corpus)["alpha"] == 0.0


def test_release_form_known_embeddings_learn_only_with_the_bottleneck_loss():
    """Regression: with ε on (the release's form) the LM head reads h in value and gradient, and
    the reconstruction target is detached, so no loss but L_indep reached the known embeddings K:
    they only shrank (|K| ≈ 0.003 after training; known logit share 0.000 everywhere). The post's
    token loss on h̄ = k̂ + û (lambda_bottleneck) gives them their gradient."""
    from penrose_zoo.steerling.train import TrainConfig, batch_loss, make_model

    cfg = TrainConfig(preset="tiny", epsilon=True, lambda_indep=0.0, seq_len=16, batch_size=2).resolved()
    model = make_model(cfg, 3, 260, 259)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 16), generator=g)
    cidx = torch.zeros(2, 16, dtype=torch.long)
    cidx[1] = 1
    batch = LMBatch(ids, cidx, torch.tensor([[1.0, 0, 0], [0, 1.0, 1.0]]), torch.arange(2), 256)

    def grad_of_K(c):
        model.zero_grad(set_to_none=True)
        loss, parts = batch_loss(model, batch, c, step=0, noise_seed=0)
        loss.backward()
        K = model.net.get_parameter([n for n, _ in model.net.named_parameters() if "known" in n and "embedding" in n][0])
        return (K.grad if K.grad is not None else torch.zeros(1)).abs().sum().item(), parts

    # force some known weight on every concept so the known features are not ~0
    with torch.no_grad():
        for n, p in model.net.named_parameters():
            if "known" in n and "predictor" in n:
                p.add_(0.5)
    zero, parts = grad_of_K(cfg)
    assert zero == 0.0 and "bottleneck" not in parts
    nonzero, parts = grad_of_K(TrainConfig(**{**cfg.__dict__, "lambda_bottleneck": 1.0}).resolved())
    assert nonzero > 1e-6 and parts["bottleneck"] > 0
    assert parts["total"] == pytest.approx(parts["token"] + parts["bottleneck"] + 0.1 * parts["concept"]
                                           + 0.1 * parts["rec"], rel=1e-6)


def test_release_form_teacher_forcing_reaches_the_bottleneck_loss():
    """Regression: teacher forcing (--teacher-forcing-steps) mixed k̂_gt only into what the LM head
    reads, which with ε on is h whatever k̂ is, so in the release form it did nothing, and the
    h̄ loss trained K_c only where the presence loss happened to fire c (for 3 of 7 planted
    concepts not before their words: K_c promoted determiners, and injecting c lowered the rate
    of its words). The h̄ loss now reads α k̂_gt + (1 − α) k̂: with every known weight at 0.5,
    K_2 (a concept no chunk carries) gets a gradient from the predicted k̂, and none under full
    teacher forcing (α = 1 at step 0), where only the labelled K_0, K_1 learn."""
    from penrose_zoo.steerling.train import TrainConfig, batch_loss, make_model

    cfg = TrainConfig(preset="tiny", epsilon=True, lambda_indep=0.0, lambda_rec=0.0, lambda_bottleneck=1.0,
                      seq_len=16, batch_size=2).resolved()
    model = make_model(cfg, 3, 260, 259)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 16), generator=g)
    cidx = torch.zeros(2, 16, dtype=torch.long)
    cidx[1] = 1
    batch = LMBatch(ids, cidx, torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]), torch.arange(2), 256)
    with torch.no_grad():  # every known logit 0: every weight σ(0) = 0.5 (top-4 of 3 keeps all)
        for n, p in model.net.named_parameters():
            if "known" in n and "predictor" in n:
                p.zero_()
    K = model.net.get_parameter([n for n, _ in model.net.named_parameters() if "known" in n and "embedding" in n][0])

    def grad_rows(teacher_forcing_steps):
        c = TrainConfig(**{**cfg.__dict__, "teacher_forcing_steps": teacher_forcing_steps}).resolved()
        model.zero_grad(set_to_none=True)
        loss, _ = batch_loss(model, batch, c, step=0, noise_seed=0)
        loss.backward()
        return (K.grad if K.grad is not None else torch.zeros_like(K)).abs().sum(-1)

    assert float(grad_rows(0)[2]) > 1e-4  # predicted k̂: the unlabelled concept's embedding moves
    rows = grad_rows(100)
    assert float(rows[0]) > 1e-4 and float(rows[1]) > 1e-4 and float(rows[2]) < 1e-9


@pytest.mark.slow
def test_known_answer_end_to_end(tmp_path, capsys):
    """`planted` → `train` → `known-answer` at a tiny size: every measure is reported; the
    attribution is exact; the reduced form (CI) trains a few steps only, the full one long
    enough (BPE) for detection and attribution to beat chance by far."""
    d = tmp_path / "planted"
    assert main(["planted", "--out", str(d), "--chunks", "300" if REDUCED else "1200", "--seed", "2"]) == 0
    assert (d / MANIFEST).is_file()
    assert main(["planted", "--out", str(d)]) == 1  # not empty: refused
    assert "not empty" in capsys.readouterr().err
    run = tmp_path / "run"
    # reduced: 3 steps, bytes (the token-level labels' path); full: 400 steps, BPE (a word a token)
    form = (["--steps", "3", "--seq-len", "128"] if REDUCED else
            ["--steps", "400", "--seq-len", "64", "--tokenizer", "bpe", "--bpe-vocab", "512"])
    assert main(["train", "--preset", "tiny", "--data", str(d), *form, "--epsilon", "--lambda-bottleneck", "1",
                 "--out", str(run), "--no-progress", "--val-every", "100"]) == 0
    capsys.readouterr()
    steer = ["--steer", "alpha,eta"] if REDUCED else []
    assert main(["known-answer", "--checkpoint", str(run), "--samples", "8", "--new-tokens", "8" if REDUCED else "16",
                 "--max-batches", "2" if REDUCED else "4", "--json", *steer]) == 0
    r = json.loads(capsys.readouterr().out)
    s = r["summary"]
    assert r["withheld"] == ["theta"] and set(r["steering"]) == ({"alpha", "eta"} if REDUCED else set(r["known_concepts"]))
    assert r["attribution"]["max_error"] < 1e-4 and s["attribution_verified"]
    assert r["attribution"]["generated"]["max_error"] < 1e-4
    for key in ("detection_auc_mean", "probe_auc_mean", "known_logit_share", "heldout_attribution_precision",
                "unknown_recovery_auc"):
        assert s[key] is not None and 0.0 <= s[key] <= 1.0, key
    assert r["detection"]["val_chunks"] > 10
    assert 0.0 <= r["logit_share"]["active_fraction"] <= 1.0
    for st in r["steering"].values():  # the release's unlearning beside the clamp, on the same prompts
        assert (st["unlearn"] is None) == (st["suppress"] is None)
        assert st["unlearn"] is None or st["nll"]["unlearned"] > 0
    if not REDUCED:  # learnt: detection well above chance, credit on a planted concept well above chance
        assert s["detection_auc_mean"] > 0.8
        assert r["attribution"]["heldout_precision"] > r["attribution"]["heldout_chance"] + 0.2
    # the text report prints the same numbers
    from penrose_zoo.steerling.known_answer import format_report

    out = format_report(r)
    assert "detection AUC" in out and "verify() exact" in out and "alpha: inject" in out
    assert f"module {s['detection_auc_mean']:.3f}" in out
    # the release's edit (ε switched off), against a null edit that switches it off too
    assert main(["known-answer", "--checkpoint", str(run), "--samples", "8", "--new-tokens", "4", "--max-batches", "1",
                 "--steer", "eta", "--epsilon-off", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["epsilon_off"] and off["attribution"]["generated"]["verified"]
    assert set(off["steering"]) == {"eta"} and off["steering"]["eta"]["nll"]["injected"] > 0
    assert main(["known-answer", "--checkpoint", str(run), "--steer", "theta"]) == 1  # withheld: not steerable
    assert "not among the labelled concepts" in capsys.readouterr().err


def test_known_answer_refuses_a_corpus_without_truth(tmp_path, capsys):
    from test_steerling_train import write_corpus

    data = write_corpus(tmp_path / "c")
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--steps", "1", "--seq-len", "32",
                 "--batch-size", "4", "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["known-answer", "--checkpoint", str(run)]) == 1
    assert "no planted corpus" in capsys.readouterr().err


def test_edit_keeping_epsilon():
    """ε off: the edit is the model's own intervention; ε on: the same edit of k̂ with ε held, the
    logits moved by Δw K_c Wᵀ exactly, and the attribution still sums to them."""
    from penrose_zoo.steerling.attribution import concept_attribution, forward_ids
    from penrose_zoo.steerling.steer import edit_keeping_epsilon
    from test_steerling_train import tiny

    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        off = tiny(True, False)
        want = forward_ids(off, ids, intervene_known={2: 0.8, 4: 0.0})
        got = edit_keeping_epsilon(off, forward_ids(off, ids), {2: 0.8, 4: 0.0})
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.known_weights, want.known_weights)
        on = tiny(True, True)
        plain = forward_ids(on, ids)
        v = torch.full((2, 7), 3.0)
        edit = edit_keeping_epsilon(on, plain, {1: v})
        delta = (3.0 - plain.known_weights[..., 1])[..., None] * on.concept_embeddings("known")[1]
        torch.testing.assert_close(edit.logits, plain.logits + delta @ on.lm_head_weight().T, rtol=1e-5, atol=1e-5)
        assert edit.epsilon is plain.epsilon and (edit.known_weights[..., 1] == 3.0).all()
        assert concept_attribution(on, edit).error < 1e-4


def test_format_report_without_suppression_prompts():
    """A concept no validation chunk carries has no suppression measurement: the report says so."""
    from penrose_zoo.steerling.known_answer import bootstrap_ratio, format_report

    ratio = bootstrap_ratio([0.2, 0.3, 0.1, 0.2], [0.1, 0.1, 0.1, 0.1])
    assert ratio["ratio"] == pytest.approx(2.0) and ratio["difference"] == pytest.approx(0.1)
    assert bootstrap_ratio([0.1, 0.2], [0.0, 0.0])["ratio"] is None
    r = {"checkpoint": "run", "variant": "causal", "epsilon": True, "step": 3, "val_loss": 1.0,
         "summary": {"detection_auc_mean": 0.9, "probe_auc_mean": 0.91, "concept_logit_share": 0.5,
                     "known_logit_share": 0.01},
         "detection": {"token_auc_mean": None, "per_concept": {"alpha": {"module_auc": 0.9, "probe_auc": 0.91,
                                                                          "token_auc": None}}},
         "samples": 8, "new_tokens": 4, "strength": 2.0, "epsilon_off": False,
         "steering": {"alpha": {"inject": ratio, "suppress": None,
                                "nll": {"unsteered": 1.0, "injected": 1.2, "suppress_prompts": None, "suppressed": None}}},
         "attribution": {"heldout_precision": 0.8, "heldout_chance": 0.2, "heldout_chunks": 10, "max_error": 1e-6,
                         "generated": {"unsteered": {"precision": None, "chunks": 0},
                                       "injected": {"precision": 1.0, "chunks": 3}, "verified": True, "max_error": 1e-6}},
         "unknown_recovery": {}}
    out = format_report(r)
    assert "suppress — (no validation chunk carries it)" in out and "x2.00" in out and "ε held" in out


def test_sample_steered_injects_and_masks():
    """What the steering measurement guarantees by construction, on a random tiny model (ε on): a
    known concept whose embedding is a token's unembedding, its weight set with ε held, makes that
    token the one sampled (its logit rises by w K_c·W_y); the same concept's relu logit mask (the
    release's unlearning, strength · relu(W K_c)) keeps it from being sampled at all, while the
    attribution still records the model's own logits exactly; equal seeds draw equal samples."""
    from penrose_zoo.steerling.known_answer import sample_steered
    from penrose_zoo.steerling.steer import SteeringConfig, prepare_steering
    from test_steerling_train import tiny

    model = tiny(True, True).eval()
    tok = ByteTokenizer()
    y = ord("q")
    K = model.net.get_parameter([n for n, _ in model.net.named_parameters() if "known" in n and "embedding" in n][0])
    with torch.no_grad():
        W = model.lm_head_weight()
        K[1] = W[y] * (10.0 / float(W[y] @ W[y]))  # w_1 = 1 adds 10 to the logit of y
    prompts = [tok.prompt_ids("ta ro ne")] * 6

    def rate(res):
        ids = [t for g in res["generated"] for t in g]
        return sum(t == y for t in ids) / max(len(ids), 1)

    plain = sample_steered(model, tok, prompts, 6, seed=3)
    again = sample_steered(model, tok, prompts, 6, seed=3)
    assert plain["generated"] == again["generated"] and rate(plain) < 0.2
    injected = sample_steered(model, tok, prompts, 6, seed=3, intervene={1: 2.0})
    assert rate(injected) > 0.9 and injected["attribution"].verify().passed
    mask = prepare_steering(model, SteeringConfig(relu_logit_mask={1: 20.0})).relu_suppression
    assert float(mask[y]) == pytest.approx(20.0 * 10.0, rel=1e-4)
    masked = sample_steered(model, tok, prompts, 6, seed=3, intervene={1: 2.0}, logit_mask=mask)
    assert rate(masked) == 0.0 and masked["attribution"].verify().passed
