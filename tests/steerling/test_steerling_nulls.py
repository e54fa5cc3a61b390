"""The nulls and baselines of the known-answer claims (penrose_zoo.steerling.nulls,
`penrose steerling known-answer --null/--baselines`, `penrose steerling nulls`): each null really
changes what it claims to change, the steering baselines are matched in KL, the statistics say
what they compute. Tiny sizes, one torch thread; one slow end-to-end test."""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from penrose_zoo.steerling import nulls as nl
from penrose_zoo.steerling.lm_data import load_concept_corpus
from penrose_zoo.steerling.planted import PlantedConfig, generate_planted, load_planted, write_planted

pytestmark = pytest.mark.usefixtures("one_thread")
REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")


def tiny_model():
    from test_steerling_train import tiny

    return tiny(True, True).eval()


def rows(seed: int = 0, b: int = 3, t: int = 9) -> SimpleNamespace:
    """A batch as edit_kl reads it: token ids and the valid positions."""
    ids = torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))
    return SimpleNamespace(input_ids=ids, valid=torch.ones(b, t, dtype=torch.bool))


def test_shuffled_labels_break_the_label_concept_map(tmp_path):
    corpus = generate_planted(PlantedConfig(n_chunks=300, seed=4))
    src = write_planted(corpus, tmp_path / "p")
    out = nl.shuffle_labels(src, tmp_path / "s", seed=1)
    shuffled = load_planted(out)
    # the text and the truth stay; the label multiset stays; the labels no longer follow the text
    assert [c.text for c in shuffled.chunks] == [c.text for c in corpus.chunks]
    assert [c.concepts for c in shuffled.chunks] == [c.concepts for c in corpus.chunks]
    assert sorted(c.labels for c in shuffled.chunks) == sorted(c.labels for c in corpus.chunks)
    assert all(set(c.labels) <= set(c.concepts) for c in corpus.chunks)
    agree = np.mean([set(c.labels) <= set(c.concepts) for c in shuffled.chunks])
    assert agree < 0.6, agree
    # what training reads (the category files) carries the shuffled labels
    cc = load_concept_corpus(out)
    truth = {c.text: c for c in shuffled.chunks}
    for ch in cc.train + cc.val:
        assert sorted(cc.concept_names[i] for i in ch.concepts) == sorted(truth[ch.text].labels)
    # seeded
    again = load_planted(nl.shuffle_labels(src, tmp_path / "s2", seed=1))
    assert [c.labels for c in again.chunks] == [c.labels for c in shuffled.chunks]


def test_k_shuffle_permutes_every_concept():
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.net.named_parameters()}
    K = model.concept_embeddings("known").detach().clone()
    perm = nl.shuffle_known_embeddings(model, seed=3)
    n = K.shape[0]
    assert sorted(perm) == list(range(n)) and all(perm[i] != i for i in range(n))  # a derangement
    after = model.concept_embeddings("known").detach()
    for i in range(n):
        torch.testing.assert_close(after[i], K[perm[i]], rtol=0, atol=0)
    for name, p in model.net.named_parameters():  # nothing else moved
        if name != "known_head.concept_embedding":
            assert torch.equal(p, before[name]), name
    assert nl.shuffle_known_embeddings(tiny_model(), seed=3) == perm


def test_random_init_is_untrained_and_seeded():
    model = tiny_model()
    with torch.no_grad():
        model.net.known_head.concept_embedding.add_(1.0)  # "trained"
    fresh = nl.reinitialised(model, seed=0)
    assert fresh.config_dict() == model.config_dict()
    assert not torch.equal(fresh.concept_embeddings("known"), model.concept_embeddings("known"))
    torch.testing.assert_close(fresh.concept_embeddings("known"), tiny_model().concept_embeddings("known"))


def test_residual_added_adds_at_the_layer_and_only_inside():
    model = tiny_model()
    ids = rows().input_ids
    v = torch.randn(16, generator=torch.Generator().manual_seed(2))
    plain, edited = [], []
    with nl._captured(model, 1, plain), torch.no_grad():
        model(ids)
    with nl.residual_added(model, 1, v), nl._captured(model, 1, edited), torch.no_grad():
        model(ids)
    torch.testing.assert_close(edited[0], plain[0] + v)
    with torch.no_grad():  # layer 0: before the first block; the hooks are gone after the block
        a = model(ids).logits
        with nl.residual_added(model, 0, v):
            b = model(ids).logits
        c = model(ids).logits
    assert (a - b).abs().max() > 1e-3 and torch.equal(a, c)
    with pytest.raises(ValueError, match="layer must be a whole number from 0 to 1"):
        with nl.residual_added(model, 2, v):
            pass


def test_logit_bias_kl_is_the_closed_form_and_matches_the_model_edit():
    """A bias b on a token set S: KL(p_b ‖ p) = b·P_b(S) − log(1 + P(S)(e^b − 1)), from p alone."""
    model = tiny_model()
    batch = rows()
    tokens = (ord("a"), ord("e"), ord("q"))
    with torch.no_grad():
        p = torch.softmax(model(batch.input_ids).logits.double(), -1)
    b = 1.7
    ps = p[..., list(tokens)].sum(-1)
    z = 1 + ps * (math.exp(b) - 1)
    want = float((b * ps * math.exp(b) / z - torch.log(z)).mean())
    got = nl.edit_kl(model, [batch], nl.Edit("logit_bias", b, tokens=tokens))
    assert got == pytest.approx(want, rel=1e-4)
    assert nl.edit_kl(model, [batch], nl.Edit("logit_bias", 0.0, tokens=tokens)) == pytest.approx(0.0, abs=1e-7)
    # matched to the model's own edit (a known weight set with ε held): the same KL within 2%
    with torch.no_grad():
        w = model.lm_head_weight()[ord("a")]
        model.net.known_head.concept_embedding[1] = w / float(w @ w)  # weight 1 adds 1 to the logit of "a"
    target = nl.edit_kl(model, [batch], nl.Edit("weight", 3.0, concept=1))
    assert target > 1e-3
    s, kl = nl.match_strength(lambda x: nl.edit_kl(model, [batch], nl.Edit("logit_bias", x, tokens=tokens)), target)
    assert abs(kl - target) <= 0.02 * target and s > 0
    assert nl.edit_kl(model, [batch], nl.Edit("logit_bias", s, tokens=tokens)) == pytest.approx(kl, rel=1e-6)


def test_match_strength_bisects_a_known_curve():
    s, k = nl.match_strength(lambda x: x * x, 2.0, rel_tol=1e-4)
    assert s == pytest.approx(math.sqrt(2), rel=1e-4) and k == pytest.approx(2.0, rel=1e-4)
    s, k = nl.match_strength(lambda x: x * x, 900.0, start=0.5)  # the bound doubles past 30
    assert k == pytest.approx(900.0, rel=0.02)
    assert nl.match_strength(lambda x: x, 0.0) == (0.0, 0.0)
    with pytest.raises(ValueError, match="target KL"):
        nl.match_strength(lambda x: x, float("nan"))


def test_mean_difference_is_the_difference_of_means():
    model = tiny_model()
    ids = rows(b=2, t=6).input_ids
    batch = SimpleNamespace(input_ids=ids, chunk_index=torch.tensor([[0, 0, 0, 1, 1, -1], [2, 2, 2, 2, 3, 3]]))
    has = torch.tensor([True, False, True, False])
    store: list = []
    with nl._captured(model, 1, store), torch.no_grad():
        model(ids)
    h = store[0].double()
    on = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    off = [(0, 3), (0, 4), (1, 4), (1, 5)]
    want = torch.stack([h[i, j] for i, j in on]).mean(0) - torch.stack([h[i, j] for i, j in off]).mean(0)
    got = nl.mean_difference(model, [batch], lambda bt: has, 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="no token"):
        nl.mean_difference(model, [batch], lambda bt: torch.ones(4, dtype=torch.bool), 1)


def test_bootstrap_interval_contains_the_mean():
    a = nl.aggregate([0.9, 0.95, 0.7, None, 0.85])
    assert a["n"] == 4 and a["mean"] == pytest.approx(0.85) and a["sd"] == pytest.approx(np.std([0.9, 0.95, 0.7, 0.85], ddof=1))
    assert a["ci95"][0] <= a["mean"] <= a["ci95"][1] and a["min"] >= 0.7 - 1e-12 and a["ci95"][0] >= 0.7 - 1e-12
    assert a["ci95"][1] - a["ci95"][0] > 0
    one = nl.aggregate([0.5])
    assert one["ci95"] == [0.5, 0.5] and one["sd"] == 0.0
    assert nl.aggregate([None])["mean"] is None


def test_specificity_matrix_shape_and_diagonal():
    names = ["alpha", "beta", "gamma"]
    base = [{"alpha": 0.1, "beta": 0.2, "gamma": 0.0}, {"alpha": 0.1, "beta": 0.2, "gamma": 0.0}]
    steered = {"alpha": [{"alpha": 0.3, "beta": 0.2, "gamma": 0.1}] * 2,
               "beta": [{"alpha": 0.1, "beta": 0.5, "gamma": 0.0}] * 2}
    m = nl.specificity(steered, base, names)
    assert list(m) == ["alpha", "beta"] and all(list(row) == names for row in m.values())
    assert m["alpha"]["alpha"] == pytest.approx(3.0) and m["beta"]["beta"] == pytest.approx(2.5)
    assert m["alpha"]["beta"] == pytest.approx(1.0) and m["alpha"]["gamma"] is None  # never there unsteered
    r = {"steering": {"alpha": {"inject": {}}}, "specificity": {"model": m}}
    assert nl._own_over_others(r) == pytest.approx(np.median([3.0 / 1.0, 2.5 / 1.0]))


def test_detector_precision():
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.5, 0.5]])
    labels = np.array([[1, 0], [1, 0], [1, 1], [0, 0]])
    assert nl.detector_precision(scores, labels) == {"precision": pytest.approx(2 / 3), "chunks": 3}
    assert nl.detector_precision(scores, np.zeros((4, 2)))["precision"] is None


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory):
    """A planted corpus, its label-shuffled copy, and a 3-step tiny checkpoint on each (bytes)."""
    from penrose_zoo.steerling.cli import main

    root = tmp_path_factory.mktemp("nulls")
    src = write_planted(generate_planted(PlantedConfig(n_chunks=240, seed=5)), root / "p")
    shuffled = nl.shuffle_labels(src, root / "s", seed=0)
    runs = {}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    for name, data in (("model", src), ("shuffled", shuffled)):
        runs[name] = root / name
        assert main(["train", "--preset", "tiny", "--data", str(data), "--steps", "3", "--seq-len", "64",
                     "--epsilon", "--lambda-bottleneck", "1", "--out", str(runs[name]), "--no-progress"]) == 0
    torch.set_num_threads(before)
    return runs


def test_known_answer_reports_its_null_and_measures_against_the_truth(planted_runs):
    """Regressions: the result named its null None (the name was reused for the unsteered edit), and
    held-out attribution precision was scored against the labels the model trained on, so a
    shuffled-label null was scored against its shuffled labels instead of what is planted."""
    from penrose_zoo.steerling.known_answer import format_report, known_answer

    kw = dict(samples=8, new_tokens=2, max_batches=1, concepts=["alpha"], suppression=False)
    r = known_answer(planted_runs["model"], null="shuffled_k", baselines=["logit_bias", "layer_injection"], **kw)
    assert r["null"] == "shuffled_k" and sorted(r["null_permutation"]) == list(range(len(r["known_concepts"])))
    st = r["steering"]["alpha"]
    assert st["suppress"] is None and set(st["baselines"]) == {"logit_bias", "layer_injection"}
    assert st["kl"] > 0 and st["baselines"]["logit_bias"]["kl_matched"]
    assert 0.0 <= r["summary"]["detector_attribution_precision"] <= 1.0
    assert set(r["specificity"]) == {"model", "logit_bias", "layer_injection"}
    assert "NULL: K shuffled" in format_report(r) and "detector-only attribution" in format_report(r)
    assert known_answer(planted_runs["model"], **kw)["null"] is None
    # the shuffled-label model is scored against what is planted: its chance level is the planted
    # labels' share on the measured chunks (one batch), not the share of the labels it trained on
    from penrose_zoo.steerling.checkpoints import load_checkpoint
    from penrose_zoo.steerling.train import TrainConfig, batch_of, load_corpus, packed

    _, tok, names, state = load_checkpoint(planted_runs["shuffled"])
    cfg = TrainConfig(**state["config"]).resolved()
    _, val = packed(cfg, load_corpus(cfg), tok)
    chunk_ids = batch_of(val, torch.arange(min(cfg.batch_size, val.n_rows))).chunk_ids.tolist()
    truth = load_planted(cfg.data).by_text()
    planted = [len(set(truth[val.texts[c]].concepts) & set(names)) / len(names) for c in chunk_ids]
    trained_on = [len(truth[val.texts[c]].labels) / len(names) for c in chunk_ids]
    assert np.mean(planted) != pytest.approx(np.mean(trained_on))  # the two differ on these chunks
    b = known_answer(planted_runs["shuffled"], **kw)["attribution"]
    assert b["heldout_chunks"] == len(chunk_ids) and b["heldout_chance"] == pytest.approx(np.mean(planted))
    with pytest.raises(Exception, match="null must be one of"):
        known_answer(planted_runs["model"], null="shuffled_labels", **kw)
    with pytest.raises(Exception, match="baselines must be"):
        known_answer(planted_runs["model"], baselines=["logit"], **kw)


def test_known_answer_cli_flags(planted_runs, capsys):
    from penrose_zoo.steerling.cli import main

    assert main(["known-answer", "--checkpoint", str(planted_runs["model"]), "--samples", "8", "--new-tokens", "2",
                 "--max-batches", "3", "--steer", "alpha", "--null", "random_init", "--baselines", "activation_addition",
                 "--layer", "1", "--no-suppression", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["null"] == "random_init" and r["layer"] == 1 and r["steering"]["alpha"]["suppress"] is None
    assert r["val_loss"] is None  # regression: the untrained null reported the trained checkpoint's loss
    assert set(r["steering"]["alpha"]["baselines"]) == {"activation_addition"}
    assert main(["known-answer", "--checkpoint", str(planted_runs["model"]), "--baselines", "logit"]) == 1
    assert "not among logit_bias" in capsys.readouterr().err


@pytest.mark.slow
def test_nulls_command_end_to_end(tmp_path, capsys):
    """`penrose steerling nulls` trains the model and its nulls over 3 seeds and prints every figure
    beside its nulls; the full form (BPE, 300 steps, tiny) learns enough that the trained model
    detects its concepts better than the label-shuffled null and the untrained one."""
    from penrose_zoo.steerling.cli import main

    d = tmp_path / "p"
    assert main(["planted", "--out", str(d), "--chunks", "300" if REDUCED else "1200", "--seed", "3"]) == 0
    form = (["--steps", "3", "--tokenizer", "byte", "--samples", "8", "--new-tokens", "2", "--max-batches", "1"]
            if REDUCED else ["--steps", "300", "--samples", "8", "--new-tokens", "8", "--max-batches", "4"])
    args = ["nulls", "--data", str(d), "--out", str(tmp_path / "n"), "--preset", "tiny", "--seeds", "0,1,2", *form]
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    for col in ("model", "shuffled_labels", "lambda0", "random_init", "shuffled_k"):  # (training logs: stderr)
        assert col in out.splitlines()[0]
    doc = json.loads((tmp_path / "n" / "nulls.json").read_text())
    det = doc["table"]["detection AUC, module"]
    assert det["model"]["n"] == 3 and det["model"]["ci95"][0] <= det["model"]["mean"] <= det["model"]["ci95"][1]
    assert doc["table"]["model beats logit_bias (concepts)"]["model"]["n"] == 3  # (ratios: None where no word appears)
    if not REDUCED:
        assert det["model"]["mean"] > det["shuffled_labels"]["mean"] + 0.1
        assert det["model"]["mean"] > det["random_init"]["mean"] + 0.1
    assert main(args) == 0  # rerun: everything from the cache
    assert capsys.readouterr().out == out
    # regression: the docs' `--nulls none` (the model alone) was a command argparse refused ("")
    assert main([*args, "--nulls", "none"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "model" in head and "shuffled_labels" not in head and "random_init" not in head


# -- over corpora: the prediction interval and `penrose steerling nulls-table` ------------------------

def test_t_quantile_against_closed_forms_and_tables():
    for p in (0.9, 0.975, 0.995):
        assert nl.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-8)  # Cauchy
        assert nl.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-8)
    # printed t tables (two-sided 95%): df 4, 9, 30; and the normal's 1.959964 far out
    assert nl.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert nl.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)
    assert nl.t_quantile(0.975, 30) == pytest.approx(2.042272, abs=1e-6)
    assert nl.t_quantile(0.975, 100000) == pytest.approx(1.959964, abs=1e-4)
    for bad in ((0.5, 3), (1.0, 3), (0.975, 0), (0.975, 2.5)):
        with pytest.raises(ValueError):
            nl.t_quantile(*bad)


def test_prediction_interval_by_hand():
    # values 1, 2, 3, 4: mean 2.5, sd √(5/3); t_{0.975,3} = 3.1824463; √(1 + 1/4): half width
    # 3.1824463 · √(5/3) · √(5/4) = 3.1824463 · 5/√12 = 4.5934656
    a = nl.prediction_interval([1.0, None, 2.0, 3.0, 4.0])
    assert a["n"] == 4 and a["mean"] == 2.5 and a["sd"] == pytest.approx(math.sqrt(5 / 3))
    assert a["pi"] == pytest.approx([2.5 - 4.5934656, 2.5 + 4.5934656], abs=1e-6)
    assert nl.prediction_interval([1.0, 2.0, 3.0, 4.0], bounds=(0.0, 5.0))["pi"] == pytest.approx([0.0, 5.0])
    assert nl._bounds_of("inject: concepts raised (CI > 1)", 7) == (0.0, 7.0)
    assert nl._bounds_of("model beats logit_bias (concepts)", 7) == (0.0, 7.0)
    assert nl._bounds_of("detection AUC, module") == (0.0, 1.0) and nl._bounds_of("  precision − chance") == (-1.0, 1.0)
    assert nl.prediction_interval([0.3])["pi"] is None and nl.prediction_interval([])["mean"] is None
    assert nl.prediction_interval([2.0, 2.0, 2.0])["pi"] == [2.0, 2.0]  # no spread seen: a point
    with pytest.raises(ValueError, match="level"):
        nl.prediction_interval([1.0, 2.0], level=1.0)


def test_prediction_interval_covers_a_new_draw_95_percent():
    """Five draws of a normal, one more: the interval holds the new draw 95% of the time (a confidence
    interval of the mean, or z instead of t, would hold it ~88% or less)."""
    rng = np.random.default_rng(7)
    draws = rng.normal(3.0, 0.5, size=(4000, 6))
    hits = [a[0] <= x[5] <= a[1] for x in draws for a in [nl.prediction_interval(x[:5].tolist())["pi"]]]
    assert 0.935 < np.mean(hits) < 0.965, np.mean(hits)


def test_corpus_interval_floors_the_spread_at_the_seed_noise():
    """Corpus means that agree more closely than their own seeds allow (issue 39's specificity figures)
    get the seeds' pooled variance over k instead of the means' spread; by hand."""
    groups = [[4.0, 6.0, 8.0], [5.0, 7.0, 6.0], [7.0, 5.0, 6.0], [6.0, 8.0, 4.0]]  # every mean 6.0
    a = nl.corpus_interval(groups)
    assert a["mean"] == 6.0 and a["sd"] == 0.0 and a["basis"] == "seeds" and a["seeds"] == 3
    # within variances 4, 1, 1, 4: pooled (2·4 + 2·1 + 2·1 + 2·4) / 8 = 2.5; V = 2.5 / 3;
    # half width t_{0.975,3} · √(V · (1 + 1/4)) = 3.1824463 · 1.0206207 = 3.2480707
    assert a["sd_within"] == pytest.approx(math.sqrt(2.5))
    assert a["pi"] == pytest.approx([6.0 - 3.2480707, 6.0 + 3.2480707], abs=1e-6)
    assert nl.prediction_interval([6.0] * 4)["pi"] == [6.0, 6.0]  # the textbook interval: a point
    # corpora that vary more than their seeds: the textbook interval, unchanged
    wide = [[1.0, 1.1, 0.9], [2.0, 2.1, 1.9], [3.0, 3.1, 2.9], [4.0, 4.1, 3.9]]
    b = nl.corpus_interval(wide)
    assert b["basis"] == "corpora" and b["pi"] == pytest.approx(nl.prediction_interval([1.0, 2.0, 3.0, 4.0])["pi"])
    assert nl.corpus_interval([[1.0, None, 2.0], [3.0]])["pi"] is not None  # None seeds dropped
    assert nl.corpus_interval([[1.0, 2.0]])["pi"] is None
    with pytest.raises(ValueError, match="level"):
        nl.corpus_interval(groups, level=0.0)


def test_corpus_interval_covers_a_new_corpus_and_holds_when_the_means_agree():
    """Simulated corpora (a corpus effect σ_c, a seed effect σ_s = 1, 4 corpora of 3 seeds): the interval
    holds a new corpus's 3-seed mean at least 95% of the time at every σ_c — and also in the draws where
    the corpus means agree more closely than their seeds allow, where the textbook interval (corpus means
    only) holds it far less often (the failure issue 39's re-run met)."""
    rng = np.random.default_rng(11)
    for sc in (0.0, 0.3, 3.0):
        y = rng.normal(0, sc, (1200, 5, 1)) + rng.normal(0, 1, (1200, 5, 3))
        new = y[:, 4].mean(1)
        ours, textbook, agree = [], [], []
        for x, v in zip(y, new):
            pi = nl.corpus_interval(x[:4].tolist())["pi"]
            ours.append(pi[0] <= v <= pi[1])
            means = x[:4].mean(1)
            old = nl.prediction_interval(means.tolist())["pi"]
            textbook.append(old[0] <= v <= old[1])
            agree.append(means.var(ddof=1) < x[:4].var(1, ddof=1).mean() / 3 / 3)
        assert np.mean(ours) > 0.94, (sc, np.mean(ours))
        if sc <= 0.3:  # the means agree by chance often enough to measure
            agree_ = np.asarray(agree)
            assert agree_.sum() > 100
            assert np.mean(np.asarray(ours)[agree_]) > 0.93, (sc, np.mean(np.asarray(ours)[agree_]))
            assert np.mean(np.asarray(textbook)[agree_]) < 0.85, (sc, np.mean(np.asarray(textbook)[agree_]))


def test_beta_binomial_interval_against_sampling():
    """The posterior predictive of successes in m new trials: by hand for a flat case, and against
    sampling p ~ Beta(s + ½, n − s + ½), T ~ Binomial(m, p)."""
    assert nl._beta_binomial_interval(0, 0, 1, 0.95) == (0, 1)  # Beta(½, ½): T = 0 or 1, each ½
    rng = np.random.default_rng(5)
    for s, n, m in ((105, 105, 21), (1, 84, 21), (60, 84, 21), (0, 20, 7)):
        t = rng.binomial(m, rng.beta(s + 0.5, n - s + 0.5, size=400000))
        for level in (0.9, 0.95):
            lo, hi = nl._beta_binomial_interval(s, n, m, level)
            assert lo == min(x for x in range(m + 1) if np.mean(t <= x) > (1 - level) / 2 + 0.004) or \
                lo == min(x for x in range(m + 1) if np.mean(t <= x) > (1 - level) / 2 - 0.004), (s, n, m, lo)
            assert np.mean(t < lo) <= (1 - level) / 2 + 0.004 and np.mean(t > hi) <= (1 - level) / 2 + 0.004
            assert np.mean(t <= hi) >= 1 - (1 - level) / 2 - 0.004


def test_corpus_interval_for_a_count_at_its_ceiling():
    """7 of 7 concepts on every seed of 5 corpora: the normal interval is the point 7, but one concept
    failing in one seed of a new corpus is no surprise (posterior predictive P(all 21) ≈ 0.91): the count's
    interval reaches down to 20 of 21, i.e. 6.667 of 7."""
    a = nl.corpus_interval([[7.0, 7.0, 7.0]] * 5, trials=7, bounds=(0.0, 7.0))
    assert a["basis"] == "corpora+binomial"
    assert a["pi"] == pytest.approx([20 / 3, 7.0])
    assert nl.corpus_interval([[7.0, 7.0, 7.0]] * 5, bounds=(0.0, 7.0))["pi"] == [7.0, 7.0]
    # a count that varies widely keeps its normal interval where that is the wider
    v = nl.corpus_interval([[1.0, 5.0, 3.0], [6.0, 2.0, 4.0], [0.0, 7.0, 3.0]], trials=7, bounds=(0.0, 7.0))
    assert v["pi"][0] == 0.0 and v["pi"][1] == 7.0


def _fake_run(root, name: str, corpus_seed: int, values: list[float], *, chunks: int = 100, steps: int = 600,
              nulls: bool = False):
    """A `nulls` --out folder whose known-answer results carry the few fields the figures read: val loss
    `v`, detection AUC v/4, precision v/5 and chance v/20 per seed (plus nulls with 0.6 the model's)."""
    data = root / f"corpus-{name}"
    data.mkdir()
    (data / ".planted.json").write_text(json.dumps({"config": {"seed": corpus_seed, "n_chunks": chunks}}))

    def result(v):
        return {"val_loss": v, "attribution": {"heldout_chance": v / 20}, "steering": {},
                "summary": {"detection_auc_mean": v / 4, "heldout_attribution_precision": v / 5}}
    runs = {"model": [result(v) for v in values]}
    if nulls:
        runs["shuffled_labels"] = [result(0.6 * v) for v in values]
    out = root / name
    out.mkdir()
    config = {"data": str(data), "seeds": list(range(len(values))), "steps": steps, "preset": "small",
              "nulls": ["shuffled_labels"] if nulls else [], "baselines": []}
    (out / "nulls.json").write_text(json.dumps({"config": config, "runs": runs, "table": {}}))
    return out


def test_nulls_table_combines_corpora(tmp_path, capsys):
    from penrose_zoo.steerling.cli import main

    a = _fake_run(tmp_path, "a", 0, [2.0, 2.2, 2.4], nulls=True)  # corpus means 2.2, 2.0, 2.9
    b = _fake_run(tmp_path, "b", 1, [1.9, 2.0, 2.1])
    c = _fake_run(tmp_path, "c", 2, [2.8, 3.0, 2.9], chunks=150)
    re = _fake_run(tmp_path, "re", 23, [2.5, 2.6, 2.7])  # mean 2.6: inside for val loss
    assert main(["nulls-table", str(a), str(b / "nulls.json"), str(c), "--rerun", str(re), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    loss = doc["rows"]["val loss"]
    assert loss["per_corpus"] == pytest.approx([2.2, 2.0, 2.9]) and loss["reruns"][0]["value"] == pytest.approx(2.6)
    assert loss["seed_values"][0] == pytest.approx([2.0, 2.2, 2.4])
    # by hand: mean 2.3666667; squared deviations 0.0277778 + 0.1344444 + 0.2844444 = 0.4466667, sd √(0.4466667/2)
    # = 0.4725816; t_{0.975,2} = 4.3026527, √(1 + 1/3) = 1.1547005: half width 2.3479154. The seeds' pooled
    # variance within corpora (0.04 + 0.01 + 0.01) / 3 = 0.02, over 3 seeds 0.0067, is below the corpus means'
    # 0.2233: the corpora set the width
    m, half = 2.3666667, 2.3479154
    assert loss["prediction"]["sd"] == pytest.approx(0.4725816, abs=1e-6) and loss["prediction"]["basis"] == "corpora"
    assert loss["prediction"]["sd_within"] == pytest.approx(math.sqrt(0.02), abs=1e-9)
    assert loss["prediction"]["pi"] == pytest.approx([m - half, m + half], abs=1e-6)
    assert loss["reruns"][0]["inside"] is True
    # simultaneous over the 4 judged figures: level 1 − 0.05 / 4, t_{0.99375,2} = 8.8602 (printed tables)
    assert doc["simultaneous_level"] == pytest.approx(0.9875)
    sim_half = nl.t_quantile(0.99375, 2) * 0.4725816 * 1.1547005
    assert nl.t_quantile(0.99375, 2) == pytest.approx(8.860, abs=1e-3)
    assert m - sim_half < 0  # clipped to what a loss can be
    assert loss["simultaneous"]["pi"] == pytest.approx([0.0, m + sim_half], abs=1e-5)
    chance = doc["rows"]["  chance"]
    assert chance["corpus_property"] and chance["prediction"] is None and chance["reruns"][0]["inside"] is None
    assert chance["per_corpus"] == pytest.approx([0.11, 0.1, 0.145])
    lift = doc["rows"]["  precision − chance"]  # v/5 − v/20 = 0.15 v
    assert lift["per_corpus"] == pytest.approx([0.33, 0.3, 0.435]) and lift["reruns"][0]["value"] == pytest.approx(0.39)
    # the first run's nulls stand beside its model, over its own seeds
    assert doc["rows"]["val loss"]["first"]["shuffled_labels"]["mean"] == pytest.approx(0.6 * 2.2)
    judged = [r["reruns"][0] for r in doc["rows"].values() if r["reruns"][0]["inside"] is not None]
    got = doc["reruns"][0]
    assert got["inside"]["of"] == len(judged) == 4 and got["inside"]["n"] == sum(r["inside"] for r in judged)
    assert got["inside_simultaneous"]["n"] == sum(r["inside_simultaneous"] for r in judged)
    assert doc["corpora"][2]["corpus"] == "s2/150" and got["corpus"] == "s23/100"
    assert main(["nulls-table", str(a), str(b), str(c), "--rerun", str(re)]) == 0
    text = capsys.readouterr().out
    assert "3 corpora: 95% PI" in text and "shuffled_labels s0/100" in text and "corpus property" in text
    assert "all figures: 95% simultaneous" in text
    assert f"re-run s23/100: inside the 95% prediction intervals {got['inside']['n']} of 4 figures" in text
    assert main(["nulls-table", str(a), str(b), str(c), "--rerun", str(re), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert "| val loss | 2.200 | 2.000 | 2.900 | 2.600 |" in md
    row = next(x for x in md.splitlines() if x.startswith("| val loss | 2.200 ["))
    assert row.endswith(f"| 2.367 [{m - half:.3f}, {m + half:.3f}] | [0.000, {m + sim_half:.3f}] "
                        "| 2.600 | yes |"), row
    # a re-run far off lands outside, and is named; two re-runs are judged each on its own
    far = _fake_run(tmp_path, "far", 24, [9.0, 9.0, 9.0])
    assert main(["nulls-table", str(a), str(b), str(c), "--rerun", str(re), "--rerun", str(far), "--json"]) == 0
    two = json.loads(capsys.readouterr().out)["reruns"]
    assert [r["corpus"] for r in two] == ["s23/100", "s24/100"]
    assert "val loss" not in two[0]["inside"]["outside"] and "val loss" in two[1]["inside"]["outside"]
    assert "val loss" in two[1]["inside_simultaneous"]["outside"]
    assert main(["nulls-table", str(a), str(b), str(c), "--rerun", str(re), "--rerun", str(far)]) == 0
    text = capsys.readouterr().out
    assert "re-run s24/100: inside the 95% prediction intervals" in text and "(outside: val loss" in text


def test_mean_specificity_and_its_table(tmp_path, capsys):
    """The specificity matrix averaged cell by cell over every seed of every corpus (a cell missing in a
    run averages the runs that have it), printed by nulls-table for the model and each baseline."""
    from penrose_zoo.steerling.cli import main

    def mat(a, b):
        return {"alpha": {"alpha": a, "beta": b}, "beta": {"alpha": b, "beta": None if a > 5 else a}}
    assert nl.mean_specificity([{"specificity": {"model": mat(2.0, 1.0)}}, {"specificity": {"model": mat(6.0, 3.0)}},
                                {"specificity": {}}]) == {"alpha": {"alpha": 4.0, "beta": 2.0},
                                                          "beta": {"alpha": 2.0, "beta": 2.0}}
    assert nl.mean_specificity([{"specificity": {"model": mat(2.0, 1.0)}}], "logit_bias") is None
    runs = []
    for i, (a, b) in enumerate(((2.0, 1.0), (4.0, 0.5))):
        out = _fake_run(tmp_path, f"s{i}", i, [2.0, 2.1, 2.2])
        doc = json.loads((out / "nulls.json").read_text())
        for k, r in enumerate(doc["runs"]["model"]):
            r["specificity"] = {"model": mat(a + k, b), "logit_bias": mat(10.0, 0.1)}
        (out / "nulls.json").write_text(json.dumps(doc))
        runs.append(str(out))
    assert main(["nulls-table", *runs, "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["specificity"]
    # model alpha→alpha: seeds 2, 3, 4 and 4, 5, 6: mean 4; alpha→beta: 1, 1, 1, 0.5, 0.5, 0.5: 0.75
    assert spec["seeds"] == 6 and spec["matrices"]["model"]["alpha"] == pytest.approx({"alpha": 4.0, "beta": 0.75})
    assert spec["matrices"]["logit_bias"]["beta"]["alpha"] == pytest.approx(0.1)
    assert spec["matrices"]["logit_bias"]["beta"]["beta"] is None
    assert main(["nulls-table", *runs, "--markdown"]) == 0
    md = capsys.readouterr().out
    assert "specificity (model), mean over the 2 corpora's 6 seeds" in md
    assert "| alpha | 4.000 | 0.750 |" in md and "| beta | 0.100 | — |" in md


def test_nulls_table_refuses_what_it_cannot_combine(tmp_path, capsys):
    from penrose_zoo.steerling.cli import main

    a = _fake_run(tmp_path, "a", 0, [2.0, 2.2, 2.4])
    b = _fake_run(tmp_path, "b", 1, [1.9, 2.0, 2.1])
    twin = _fake_run(tmp_path, "twin", 0, [1.0, 1.1, 1.2])  # corpus seed 0 again
    cases = [
        ([str(a)], "at least 2 runs"),
        ([str(a), str(tmp_path / "nowhere")], "no nulls.json"),
        ([str(a), str(twin)], "same corpus is used twice"),
        ([str(a), str(b), "--rerun", str(twin)], "re-run's corpus is used twice"),
        ([str(a), str(_fake_run(tmp_path, "two", 2, [1.0, 2.0]))], "2 training seeds"),
        ([str(a), str(_fake_run(tmp_path, "steps", 3, [1.0, 2.0, 3.0], steps=300))], "steps is 300"),
    ]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "nulls.json").write_text('{"config": {},\n "runs": [}')
    cases.append(([str(a), str(bad)], "nulls.json:2:"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "nulls.json").write_text('{"config": {}, "runs": {"model": []}}')
    cases.append(([str(a), str(tmp_path / "empty")], "not a `penrose steerling nulls` result"))
    for args, message in cases:
        capsys.readouterr()
        assert main(["nulls-table", *args]) == 1, args
        assert message in capsys.readouterr().err, (args, message)
    for level in ("1", "0", "nan"):
        with pytest.raises(SystemExit):
            main(["nulls-table", str(a), str(b), "--level", level])
