"""penrose_zoo.steerling.scaling: the tiny mode end to end (results.json schema, plots, the cache),
the power-law fit against an independent least squares on synthetic points, and the
unknown-head-attached forward pass it trains. Tiny sizes; torch on one thread."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from penrose_zoo.steerling import scaling
from penrose_zoo.steerling.attribution import forward_ids
from penrose_zoo.steerling.model import Steerling
from penrose_zoo.steerling.train import TrainConfig, config_differences, forward_unknown_attached

torch.set_num_threads(1)

WORDS = {"cats": "cat meow purr whisker tail", "code": "python code bug loop compile", "sea": "wave ship salt tide fish"}


def write_corpus(root: Path, n: int = 40) -> Path:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for cat, words in WORDS.items():
        ws = words.split()
        entries = [" ".join(rng.choice(ws) for _ in range(rng.randint(3, 8))) + f" {i}" for i in range(n)]
        (root / cat).write_text("\n%\n".join(entries) + "\n")
    return root


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    data = write_corpus(root / "corpus")
    out = root / "out"
    res = scaling.run("tiny", out, data=str(data), log=lambda m: None)
    return res, out, data


def test_tiny_results_schema(tiny_results):
    res, out, _ = tiny_results
    saved = json.loads((out / "results.json").read_text())
    assert saved["format"] == scaling.FORMAT and saved["config"]["mode"] == "tiny"
    assert (out / "loss_vs_compute.png").stat().st_size > 0 and (out / "metrics_vs_size.png").stat().st_size > 0
    n_sizes = len(scaling.MODES["tiny"]["sizes"])
    assert len(saved["per_size"]) == len(scaling.FAMILIES) * len(scaling.DEFAULT_VARIANTS) * n_sizes
    for row in saved["per_size"]:
        for k in ("family", "variant", "size", "seed", "N", "D", "C", "val_loss", "concept_auc", "token_control",
                  "hsic_linear", "hsic_rbf", "probing_gap", "param_overhead", "N_concept"):
            assert k in row, k
        assert row["C"] == pytest.approx(6 * row["N"] * row["D"]) and row["val_loss"] > 0
        assert 0 < row["param_overhead"] < 1
    fits = saved["fits"]
    assert {(f["family"], f["variant"]) for f in fits} == {(f, v) for f in scaling.FAMILIES for v in scaling.DEFAULT_VARIANTS}
    for f in fits:
        assert f["metric"] == "val_loss"
        assert {"a", "b", "b_std", "points"} <= set(f)
        assert len(f["points"]) == n_sizes
        for p in f["points"]:
            assert {"N", "D", "C", "val_loss"} <= set(p)
        # the stored fit is the least squares line through its own points
        x = np.log10([p["C"] for p in f["points"]])
        y = np.log10([p["val_loss"] for p in f["points"]])
        b, a = np.polyfit(x, y, 1)
        assert f["b"] == pytest.approx(b, abs=1e-9) and f["a"] == pytest.approx(a, abs=1e-9)
    comps = saved["comparisons"]
    assert {(c["family"], c["variant"]) for c in comps} == {(f, v) for f in scaling.FAMILIES
                                                            for v in scaling.DEFAULT_VARIANTS if v != "base"}
    assert all(isinstance(c["exponents_differ"], bool) for c in comps)
    assert set(saved["claims"]) == {f"{c['family']}/{c['variant']}" for c in comps}
    # the base model's logits are h's: every concept variant at the same size has the same N
    by_size = {}
    for row in saved["per_size"]:
        by_size.setdefault((row["family"], row["size"]), set()).add(row["N"])
    assert all(len(v) == 1 for v in by_size.values())
    assert "| family | variant |" in scaling.tables(res)


def test_rerun_reuses_cached_runs(tiny_results, monkeypatch):
    _, out, data = tiny_results
    monkeypatch.setattr(scaling, "train_one", lambda *a, **k: pytest.fail("a cached run was retrained"))
    again = scaling.run("tiny", out, data=str(data), log=lambda m: None)
    assert len(again["per_size"]) == len(scaling.FAMILIES) * len(scaling.DEFAULT_VARIANTS) * len(scaling.MODES["tiny"]["sizes"])


def test_fit_recovers_known_exponent():
    rng = np.random.default_rng(0)
    C = np.repeat(np.geomspace(1e9, 1e13, 5), 3)
    seeds = np.tile([0, 1, 2], 5)
    a_true, b_true = 1.2, -0.076
    loss = 10 ** (a_true + b_true * np.log10(C) + rng.normal(0, 0.002, C.size))
    f = scaling.power_law_fit(C, loss, seeds)
    # independent least squares: the normal equations by hand
    x, y = np.log10(C), np.log10(loss)
    xm, ym = x.mean(), y.mean()
    b = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    assert f["b"] == pytest.approx(b, rel=1e-9) and f["a"] == pytest.approx(ym - b * xm, rel=1e-9)
    assert abs(f["b"] - b_true) < 3 * f["b_se"] + 1e-3
    assert f["b_std_source"] == "seeds" and 0 < f["b_std"] < 0.01
    # exact points: exact recovery; one seed: b_std is the regression's standard error (0 here)
    g = scaling.power_law_fit(C[:5], 10 ** (a_true + b_true * np.log10(C[:5])))
    assert g["b"] == pytest.approx(b_true, abs=1e-12) and g["b_std_source"] == "regression"
    assert g["b_std"] == pytest.approx(0, abs=1e-10)


def test_comparison_detects_offset_and_slope():
    def rows(variant, a, b):
        return [{"family": "causal", "variant": variant, "size": f"s{i}", "seed": s, "N": 10 ** (3 + i),
                 "D": 10 ** 5, "C": 6 * 10 ** (8 + i), "val_loss": 10 ** (a + b * math.log10(6 * 10 ** (8 + i)) + e)}
                for i in range(4) for s, e in ((0, 0.001), (1, -0.001))]
    parallel = scaling.analyse(rows("base", 1.0, -0.05) + rows("release", 1.02, -0.05))
    c = parallel["comparisons"][0]
    assert c["offset_log10_loss"] == pytest.approx(0.02, abs=1e-6) and not c["exponents_differ"]
    steeper = scaling.analyse(rows("base", 1.0, -0.05) + rows("release", 1.5, -0.1))
    assert steeper["comparisons"][0]["exponents_differ"]


def test_unknown_attached_forward_same_values_gradient_reaches_h():
    model = dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=16, block_size=32, diff_block_size=4,
                 intermediate_size=32)
    concepts = dict(n_concepts=6, n_unknown_concepts=12, concept_dim=16, topk_known=3, topk_known_features=3,
                    factorize_rank=4, unknown_topk=4, use_epsilon_correction=False)
    for causal in (True, False):
        m = Steerling(model, concepts, 260, causal=causal, seed=0, large_concept_threshold=6)
        ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
        a, b = forward_ids(m, ids), forward_unknown_attached(m, ids)
        for f in ("logits", "hidden", "known_features", "unknown_features", "unknown_logits"):
            torch.testing.assert_close(getattr(b, f), getattr(a, f), rtol=0, atol=1e-6)
        grads = []
        for fn in (forward_ids, forward_unknown_attached):
            m.zero_grad(set_to_none=True)
            fn(m, ids).unknown_features.pow(2).sum().backward()
            grads.append(m.net.layers[0].mlp.c_fc.grad)
        assert grads[0] is None  # the release: h.detach()
        assert grads[1] is not None and grads[1].abs().sum() > 0


def test_new_config_fields_resume_old_checkpoints():
    cfg = TrainConfig()
    old = {k: v for k, v in TrainConfig().__dict__.items()
           if k not in ("unknown_detach", "model_overrides", "concept_overrides")}
    assert config_differences(old, cfg) == []
    assert config_differences(old, TrainConfig(unknown_detach=False))


def test_release_hbar_tf_trains_with_teacher_forcing(tmp_path, monkeypatch):
    """release_hbar_tf: the training forward gets α annealed 1 → 0 over the run's steps (release_hbar:
    α 0 throughout), with the h̄ loss on and ε kept."""
    from penrose_zoo.steerling import train as train_mod

    data = write_corpus(tmp_path / "corpus", n=10)
    mode = dict(scaling.MODES["tiny"], eval_batches=1)
    seen: list[float] = []
    forward = train_mod.TrainForward.forward

    def spy(self, input_ids, chunk_index, chunk_labels, teacher_forcing=0.0):
        seen.append(float(teacher_forcing))
        return forward(self, input_ids, chunk_index, chunk_labels, teacher_forcing)

    monkeypatch.setattr(train_mod.TrainForward, "forward", spy)
    steps = 6
    alphas = {}
    for variant in ("release_hbar", "release_hbar_tf"):
        cfg = scaling.run_config("causal", variant, "e8", 0, steps, mode, str(data))
        assert cfg.epsilon and cfg.lambda_bottleneck == 1.0
        rc = cfg.resolved()
        corpus = train_mod.load_corpus(rc)
        tok = train_mod.make_tokenizer(rc, corpus)
        seen.clear()
        scaling.train_one(cfg, corpus, tok, *train_mod.packed(rc, corpus, tok), eval_batches=1)
        alphas[variant] = seen[:steps]
    assert cfg.teacher_forcing_steps == steps
    assert alphas["release_hbar"] == [0.0] * steps
    tf = alphas["release_hbar_tf"]
    assert tf[0] == pytest.approx(1.0) and all(a > b for a, b in zip(tf, tf[1:])) and 0 < tf[-1] < 1
    # the variant's record in results.json names its teacher forcing; TrainConfig gets steps, not the fraction
    assert scaling.VARIANTS["release_hbar_tf"]["teacher_forcing"] == 1.0
