"""The self-explaining network (SENN) and the concept activation vectors (CAV / TCAV) beyond the
zoo-wide tests: SENN's robustness penalty and TCAV's sensitivities and scores against the
hand-written references (tests/references/zoo_refs.py, Jacobians written out by the chain rule,
no autograd), explanations, and small training runs on the zoo's offline data."""

from __future__ import annotations

import doctest
import importlib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import penrose
import penrose_zoo
from penrose_zoo.cav_probe import ConceptActivationVectors, probe_aucs, probing_gap
from penrose_zoo.senn import SelfExplainingNetwork
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/
ROOT = HERE.parent


refs = reference('zoo_refs')

pytestmark = pytest.mark.usefixtures("one_thread")

PROFILE = settings(deadline=None, derandomize=True, max_examples=12, suppress_health_check=[HealthCheck.too_slow])
small = st.integers(1, 4)
TOL = dict(atol=1e-10, rtol=1e-10)


def randomised(model, seed, scale=0.7):
    """The model in float64 with every parameter redrawn at a moderate scale; its params dict."""
    model = model.double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.diagram.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)
    return model, dict(model.diagram.named_parameters())


def grads(value, wrt: dict):
    gs = torch.autograd.grad(value, list(wrt.values()), allow_unused=True, retain_graph=True)
    return {k: torch.zeros_like(v) if gr is None else gr for (k, v), gr in zip(wrt.items(), gs)}


# ---- SENN: the robustness penalty -------------------------------------------------------------


@st.composite
def senn_cases(draw):
    sizes = {k: draw(small) for k in ("f", "j", "k", "i", "r")}
    return sizes, draw(st.sampled_from([(), (1,), (3,), (2, 2)])), draw(st.integers(0, 2**16))


@PROFILE
@given(senn_cases())
def test_senn_robustness_penalty_matches_reference(case):
    """‖∇_x f − θᵀ J_x h‖ by autograd (wrapper) equals the chain-rule reference, and so do its
    gradients with respect to every parameter and the input (it trains with the loss)."""
    sizes, batch, seed = case
    model, P = randomised(SelfExplainingNetwork(task="regression", **sizes), seed)
    x = torch.randn(*batch, sizes["f"], generator=torch.Generator().manual_seed(seed + 1),
                    dtype=torch.float64, requires_grad=True)
    J_f, J_h, _ = model.jacobians(x)
    want_f, want_h, _ = refs.senn_jacobians(P, x)
    torch.testing.assert_close(J_f, want_f, **TOL)
    torch.testing.assert_close(J_h, want_h, **TOL)
    got, want = model.robustness_penalty(x), refs.senn_robustness(P, x)
    assert got.shape == batch
    torch.testing.assert_close(got, want, **TOL)
    R = torch.randn(batch, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    wrt = {**P, "x": x}
    gap = want_f - torch.einsum("...kr,...kf->...rf", refs.senn(P, x)["theta"], want_h)
    pairs = [((got**2 * R).sum(), ((gap * gap).sum((-2, -1)) * R).sum())]  # smooth everywhere
    if (want > 1e-6).all():  # the norm itself has no gradient at 0 (a dead ReLU can make θ constant)
        pairs.append(((got * R).sum(), (want * R).sum()))
    for a, b in pairs:
        g_got, g_want = grads(a, wrt), grads(b, wrt)
        for name in wrt:
            torch.testing.assert_close(g_got[name], g_want[name], **TOL, msg=lambda m, n=name: f"grad {n}: {m}")


def test_senn_penalty_vanishes_for_constant_relevances():
    """With θ independent of x (W_t1 = 0), f = θᵀ h is linear in h and ∇_x f = θᵀ J_x h."""
    model, P = randomised(SelfExplainingNetwork(f=5, k=3, r=2, task="multiclass"), 0)
    with torch.no_grad():
        P["W_t1"].zero_()
    x = torch.randn(7, 5, dtype=torch.float64)
    assert model.robustness_penalty(x).abs().max() < 1e-12
    with torch.no_grad():
        P["W_t1"].normal_()
    assert model.robustness_penalty(x).min() > 0


def test_senn_loss_terms_and_penalty_gradients():
    model = SelfExplainingNetwork(f=6, k=3, r=1, robustness=0.5, reconstruction=0.2, sparsity=0.1).double()
    x = torch.randn(10, 6, dtype=torch.float64)
    y = (x[:, 0] > 0).double()
    t = model.loss_terms((x, y))
    total = t["task"] + 0.5 * t["robustness"] + 0.2 * t["reconstruction"] + 0.1 * t["sparsity"]
    torch.testing.assert_close(t["total"], total)
    torch.testing.assert_close(model.loss((x, y)), total)
    torch.testing.assert_close(t["robustness"], model.robustness_penalty(x).mean())
    # the penalty is differentiable: its gradient reaches the relevance and concept networks
    g = torch.autograd.grad(t["robustness"], [model.diagram.W_t1, model.diagram.W_t2, model.diagram.W_h1])
    assert all(torch.isfinite(v).all() and v.abs().sum() > 0 for v in g)
    assert x.grad is None  # the loss does not leave gradients on the caller's data
    with pytest.raises(ValueError, match="robustness weight must be at least 0"):
        SelfExplainingNetwork(robustness=-1.0)


def test_senn_explanation_is_relevances_times_concepts():
    model, P = randomised(SelfExplainingNetwork(f=5, k=4, r=3, task="multiclass",
                                                concept_names=("a", "b", "c", "d")), 3)
    x = torch.randn(6, 5, dtype=torch.float64)
    e = model.explain(x)
    want = refs.senn(P, x)
    torch.testing.assert_close(e.output, want["y"], **TOL)
    torch.testing.assert_close(e.parts, want["h"][..., :, None] * want["theta"], **TOL)
    torch.testing.assert_close(e.total(), e.output, **TOL)
    torch.testing.assert_close(e.concepts, want["h"], **TOL)
    torch.testing.assert_close(e.relevances, want["theta"], **TOL)
    assert e.part_legs == ("k",) and e.names == ("a", "b", "c", "d")


def test_senn_trains_on_breast_cancer_and_the_penalty_drops():
    """The recipe (quick): the loss goes down, accuracy beats the majority class, and the
    robustness penalty, finite throughout, ends far below that of the same network trained
    without it (which drifts away from a locally linear model)."""
    from penrose_zoo.data import load_tabular
    from penrose_zoo.senn import recipe

    model, m, settings_, hist = recipe(quick=True)
    assert hist["train_loss"][-1] < 0.5 * hist["train_loss"][0]
    assert m["val_acc"] > m["majority_baseline"] + 0.1 and m["val_auc"] > 0.95, m
    assert math.isfinite(m["val_robustness"])
    data = load_tabular("breast_cancer")
    fresh = SelfExplainingNetwork(f=data.n_features, k=5, r=1, robustness=0.0, seed=0)
    at_init = fresh.robustness_penalty(data.x_val).mean().item()
    fresh.fit((data.x_train, data.y_train), epochs=settings_["epochs"], batch_size=32, lr=3e-3, progress=False)
    unregularised = fresh.robustness_penalty(data.x_val).mean().item()
    assert m["val_robustness"] < 0.5 * unregularised, (m["val_robustness"], unregularised)
    assert unregularised > at_init  # without the penalty, θ(x) stops being f's local gradient


# ---- CAV / TCAV -------------------------------------------------------------------------------


@st.composite
def cav_cases(draw):
    sizes = {k: draw(small) for k in ("d", "k", "j", "r")}
    return sizes, draw(st.integers(1, 12)), draw(st.integers(0, 2**16))


@PROFILE
@given(cav_cases())
def test_tcav_sensitivities_and_scores_match_reference(case):
    """S_kr = ∂y_r/∂step_k at 0 (autograd, wrapper) = ∇_a y_r · v_k (written out, reference); the
    TCAV scores are the same fractions, and lie in [0, 1]."""
    sizes, n, seed = case
    model, P = randomised(ConceptActivationVectors(**sizes), seed)
    g = torch.Generator().manual_seed(seed + 1)
    a = torch.randn(n, sizes["d"], generator=g, dtype=torch.float64)
    labels = torch.randint(0, sizes["r"], (n,), generator=g)
    S = model.sensitivities(a)
    assert S.shape == (n, sizes["r"], sizes["k"])
    torch.testing.assert_close(S, refs.tcav_sensitivities(P, a), **TOL)
    clear = (S.abs() > 1e-9).all()  # a sign decided by rounding would be no test
    for lab in (None, labels):
        got = model.tcav(a, lab)
        assert got.shape == (sizes["r"], sizes["k"])
        assert ((got >= 0) & (got <= 1) | got.isnan()).all()
        if clear:
            torch.testing.assert_close(got, refs.tcav_scores(P, a, lab), equal_nan=True, atol=0, rtol=0)
    # gradients of the sensitivities (create_graph) agree too
    R = torch.randn(S.shape, generator=g, dtype=torch.float64)
    got_s = (model.sensitivities(a, create_graph=True) * R).sum()
    want_s = (refs.tcav_sensitivities(P, a) * R).sum()
    g_got, g_want = grads(got_s, P), grads(want_s, P)
    for name in P:
        torch.testing.assert_close(g_got[name], g_want[name], **TOL, msg=lambda m, n=name: f"grad {n}: {m}")


def test_sensitivity_is_the_directional_derivative_along_the_cav():
    """Kim et al.'s definition, by finite differences: (y_r(a + ε v_k) − y_r(a)) / ε."""
    model, P = randomised(ConceptActivationVectors(d=6, k=3, j=5, r=2), 1)
    a = torch.randn(20, 6, dtype=torch.float64)
    S = model.sensitivities(a)
    eps = 1e-6
    with torch.no_grad():
        y0 = model(a).y
        for k in range(3):
            y1 = model(a + eps * model.cavs[:, k]).y
            torch.testing.assert_close((y1 - y0) / eps, S[..., k], atol=1e-4, rtol=1e-4)
            # the diagram's `step` input moves along the same unit CAV
            step = torch.zeros(3, dtype=torch.float64)
            step[k] = eps
            torch.testing.assert_close(model(a, step).y, y1, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(model.cavs.norm(dim=0), torch.ones(3, dtype=torch.float64))


def test_binary_tcav_reads_the_positive_examples():
    model, P = randomised(ConceptActivationVectors(d=4, k=2, j=3, r=1, task="binary"), 2)
    a = torch.randn(30, 4, dtype=torch.float64)
    labels = torch.arange(30) % 2
    got = model.tcav(a, labels)
    want = (model.sensitivities(a)[labels == 1, 0] > 0).double().mean(0)
    torch.testing.assert_close(got[0], want)
    torch.testing.assert_close(got, refs.tcav_scores(P, a, labels, binary=True))
    assert model.tcav(a, torch.zeros(30)).isnan().all()  # no positive examples: no score


def test_cav_explanation_and_probe_loss():
    model, P = randomised(ConceptActivationVectors(d=5, k=3, j=4, r=2), 4)
    a = torch.randn(6, 5, dtype=torch.float64)
    e = model.explain(a)
    torch.testing.assert_close(e.output, refs.cav_probe(P, a, torch.zeros(3, dtype=torch.float64))["s"], **TOL)
    torch.testing.assert_close(e.total(), e.output, **TOL)
    assert e.sensitivities.shape == (6, 2, 3) and e.cavs.shape == (5, 3)
    c = (torch.rand(6, 3) < 0.5).double()
    y = torch.randint(0, 2, (6,))
    probe = torch.nn.functional.binary_cross_entropy_with_logits(a @ P["V"] + P["b_v"], c)
    head = torch.nn.functional.cross_entropy(refs.cav_probe(P, a, torch.zeros(3, dtype=torch.float64))["y"], y)
    torch.testing.assert_close(model.loss((a, c), mode="probes"), probe)
    torch.testing.assert_close(model.loss((a, c, y), mode="head"), head)
    torch.testing.assert_close(model.loss((a, c, y)), head + probe)
    # the two losses share no parameter: the probe's loss never moves the head
    gs = torch.autograd.grad(model.loss((a, c), mode="probes"), [P["W_j"], P["W_r"]], allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in gs)


def test_cav_sequential_fit_trains_head_then_frozen_probes():
    model = ConceptActivationVectors(d=6, k=2, j=4, r=2)
    a = torch.randn(64, 6)
    c = (a[:, :2] > 0).float()
    y = (a[:, 2] > 0).long()
    hist = model.fit((a, c, y), mode="sequential", epochs=2, probe_epochs=3, batch_size=16, lr=1e-2, progress=False)
    assert len(hist["head"]["train_loss"]) == 2 and len(hist["probes"]["train_loss"]) == 3
    head = {n: p.detach().clone() for n, p in model.diagram.named_parameters() if n not in ("V", "b_v")}
    V = model.diagram.V.detach().clone()
    model.fit_probes((a, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False)
    for n, p in model.diagram.named_parameters():
        if n in head:
            assert torch.equal(p, head[n]) and p.requires_grad, n
    assert not torch.equal(model.diagram.V, V)
    with pytest.raises(ValueError, match="trains in modes"):
        model.fit((a, c, y), mode="independent", epochs=1, batch_size=16, lr=1e-2)


def test_cav_trains_on_fortunes_and_tcav_finds_each_class_concepts():
    """The recipe (quick): the head beats the majority class, the probes detect their concepts,
    the losses go down, and TCAV — in [0, 1] — is high for the 'science & technology' class along
    its own categories' CAVs (computers, science, linux, medicine) and low along the others'."""
    from penrose_zoo.cav_probe import recipe

    model, m, _, hist = recipe(quick=True)
    for part in ("head", "probes"):
        assert hist[part]["train_loss"][-1] < 0.7 * hist[part]["train_loss"][0], part
    assert m["val_acc"] > m["majority_baseline"] + 0.1, m
    assert m["val_probe_auc"] > 0.7, m
    for key in ("val_tcav_own_concepts", "val_tcav_other_concepts"):
        assert 0 <= m[key] <= 1
    assert m["val_tcav_own_concepts"] > m["val_tcav_other_concepts"] + 0.3, m


def test_probing_gap_separates_signal_from_noise():
    """The probes on the fortunes features find the categories; on noise of the same width they
    do not: a positive probing gap, and none between a representation and itself."""
    from penrose_zoo.data import fortunes_concepts

    data = fortunes_concepts(max_features=300)
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(data.x_train), generator=g)[:1200]
    x_tr, c_tr = data.x_train[idx], data.c_train[idx]
    noise_tr, noise_va = torch.randn(x_tr.shape, generator=g), torch.randn(data.x_val.shape, generator=g)
    res = probing_gap(x_tr, noise_tr, c_tr, data.x_val, noise_va, data.c_val, epochs=8)
    assert res["probe_auc_a"] > 0.75 and abs(res["probe_auc_b"] - 0.5) < 0.1, res
    assert res["probing_gap"] > 0.2 and res["aucs_a"].shape == (8,)
    same = probe_aucs(x_tr, c_tr, data.x_val, data.c_val, epochs=8)
    assert abs(float(same.mean()) - res["probe_auc_a"]) < 1e-12  # deterministic under the seed


# ---- the diagrams, registry and docstrings --------------------------------------------------


@pytest.mark.parametrize("diagram", ["senn.pen", "cav_probe.pen"])
def test_diagram_checks_without_warnings(diagram):
    path = ROOT / "zoo" / diagram
    assert penrose.load(path).warnings == []
    r = subprocess.run([sys.executable, "-m", "penrose.cli", "check", f"zoo/{diagram}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "penrose.cli", "fmt", "--check", f"zoo/{diagram}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_registered_with_every_dim_in_the_legend():
    from penrose.parser import parse
    from penrose.views import legend

    for name, cls in (("senn", SelfExplainingNetwork), ("cav_probe", ConceptActivationVectors)):
        entry = penrose_zoo.MODELS[name]
        assert entry.cls is cls
        text = (ROOT / "zoo" / cls.diagram_file).read_text()
        assert set(cls.dims()) <= set(legend(parse(text))), name
        model = entry.build()
        assert all(n.startswith("diagram.") for n, _ in model.named_parameters())


@pytest.mark.parametrize("module", ["penrose_zoo.senn", "penrose_zoo.cav_probe"])
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
