"""Every zoo model against its hand-written reference (tests/references/zoo_refs.py).

Property tests over random sizes (hypothesis draws the dims first, then the data): the same
random parameters are loaded into the penrose-compiled model and into the reference; outputs
and gradients (with respect to every parameter and every float input, through a random linear
read-out of every output) must agree — float64 to 1e-10, float32 to 1e-5 (atol and rtol). On
CUDA (marked `gpu`, skipped visibly without one) the same comparison runs in float32 (TF32 off,
1e-5) and in bfloat16 on 4× larger sizes, where both sides round differently at every op and a
ReLU / top-k decision may flip near its threshold: there every output and gradient must agree to
a relative Frobenius error of 5e-2 (BF16_TOL, about 6 bf16 ulps of the whole tensor).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import penrose_zoo
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/


refs = reference('zoo_refs')


pytestmark = pytest.mark.usefixtures("one_thread")

settings.register_profile("zoo", deadline=None, derandomize=True, max_examples=6,
                          suppress_health_check=[HealthCheck.too_slow])

small = st.integers(1, 4)

#: model name -> the dims hypothesis draws (every other dim keeps its default), plus build options.
SIZES = {
    "linear": dict(f=small, r=small),
    "mlp": dict(f=small, j=small, r=small),
    "self_attention": dict(t=st.integers(1, 5), e=small, h=small, d=small),
    "causal_self_attention": dict(t=st.integers(1, 5), e=small, h=small, d=small),
    "sparse_autoencoder": dict(d=small, k=st.integers(1, 8)),
    "topk_sparse_autoencoder": dict(d=small, k=st.integers(1, 8), n_active=st.integers(1, 8)),
    "concept_bottleneck": dict(f=small, k=small, r=small),
    "concept_bottleneck_logit": dict(f=small, k=small, r=small),
    "concept_bottleneck_hybrid": dict(f=small, k=small, j=small, r=small),
    "concept_bottleneck_typed": dict(f=small, r=small),  # k, g from its default concepts (one of each type)
    "concept_embedding": dict(f=small, k=small, e=small, r=small),
    "concept_embedding_typed": dict(f=small, e=small, r=small),  # k, g from its default concepts
    "concept_graph": dict(f=small, r=small),  # k, g from its default concepts and graph (one of each type)
    "concept_graph_input": dict(f=small, k=small, r=small),
    "causally_reliable_cbm": dict(f=small, e=small, h=small, r=small),  # k, n, g from its default concepts
    "concept_whitening": dict(f=st.integers(2, 5), k=st.just(1), r=small),
    "prototype_concepts": dict(f=small, p=small, k=small, r=small),
    "neural_additive": dict(f=small, i=small, j=small, r=small),
    "mixture_of_linear_models": dict(f=small, k=small, m=small, r=small),
    "mixture_typed": dict(f=small, m=small, r=small),  # k, g from its default concepts
    "senn": dict(f=small, j=small, k=small, i=small, r=small),
    "cav_probe": dict(d=small, k=small, j=small, r=small),
}
OPTIONS = {"linear": {"task": "regression"}, "mlp": {"task": "regression"}, "neural_additive": {"task": "regression"}}
OPTIONS |= {"senn": {"task": "regression"}, "cav_probe": {"task": "multiclass"}}
RUNTIME_DIMS = {"t"}  # legs only inputs carry: not compile-time sizes


def test_every_model_has_a_reference_and_sizes():
    assert set(SIZES) == set(penrose_zoo.MODELS) == set(refs.REFERENCES)


@st.composite
def model_cases(draw, name):
    sizes = {k: draw(s) for k, s in SIZES[name].items()}
    if "n_active" in sizes:
        sizes["n_active"] = min(sizes["n_active"], sizes["k"])
    batch = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    seed = draw(st.integers(0, 2**16))
    return sizes, batch, seed


def build_pair(name, sizes, seed, dtype=torch.float64, device="cpu"):
    """(model, params dict) with every parameter and buffer redrawn at a moderate scale."""
    entry = penrose_zoo.MODELS[name]
    compile_sizes = {k: v for k, v in sizes.items() if k not in RUNTIME_DIMS}
    model = entry.build(**compile_sizes, **OPTIONS.get(name, {})).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _pname, p in model.diagram.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.7)
        for _bname, b in model.diagram.named_buffers():
            b.copy_(torch.rand(b.shape, generator=g, dtype=torch.float64))
        structure = getattr(model, "structure_buffers", None) or getattr(getattr(model, "spec", None), "buffers", dict)
        for bname, b in structure().items():
            getattr(model.diagram, bname).copy_(b)  # the typed models' 0/1 type buffers, the graph models' graph
    model = model.to(device)
    params = dict(model.diagram.named_parameters()) | dict(model.diagram.named_buffers())
    return model, params


def make_inputs(name, sizes, batch, seed, dtype, device="cpu"):
    cls = penrose_zoo.MODELS[name].cls
    g = torch.Generator().manual_seed(seed + 1)
    n = 1
    for b in batch:
        n *= b
    flat = cls.make_inputs({**cls.resolved_sizes(**{k: v for k, v in sizes.items() if k not in RUNTIME_DIMS}), **sizes},
                           max(n, 1), g)
    out = {}
    for k, v in flat.items():
        v = v.reshape(*batch, *v.shape[1:]) if batch else v[0]
        v = v.to(device)
        out[k] = v.to(dtype).requires_grad_(True) if v.is_floating_point() else v
    return out


def as_dict(out):
    if isinstance(out, torch.Tensor):
        return {"y": out}
    return out._asdict()


def grads_of(outputs: dict, wrt: dict, seed: int):
    """Gradients of Σ_outputs ⟨R_o, output⟩ (R fixed random read-outs) with respect to `wrt`."""
    g = torch.Generator().manual_seed(seed + 2)
    total = 0
    for key in sorted(outputs):
        o = outputs[key]
        if not o.is_floating_point():
            continue
        R = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype)
        total = total + (torch.nan_to_num(o, neginf=0.0) * R).sum()
    names = [k for k, v in wrt.items() if v.requires_grad]
    gs = torch.autograd.grad(total, [wrt[k] for k in names], allow_unused=True)
    return {k: (torch.zeros_like(wrt[k]) if gr is None else gr) for k, gr in zip(names, gs)}


def compare(name, sizes, batch, seed, dtype, device="cpu", magnitude_atol=False):
    """magnitude_atol: the absolute tolerance scaled by the reference tensor's largest magnitude
    (float32 sums over thousands of features round by their size, not by 1)."""
    model, params = build_pair(name, sizes, seed, dtype, device)
    inputs = make_inputs(name, sizes, batch, seed, dtype, device)
    ref_fn = refs.reference_for(name, sizes)
    got = as_dict(model(**inputs))
    want = ref_fn(params, **inputs)
    assert set(want) <= set(got), f"reference outputs {sorted(want)} not all in model outputs {sorted(got)}"
    got = {k: got[k] for k in want}
    wrt = {**{f"param {k}": v for k, v in params.items()}, **{f"input {k}": v for k, v in inputs.items() if v.is_floating_point()}}
    g_got = grads_of(got, wrt, seed)
    g_want = grads_of(want, wrt, seed)
    for label, a, b in [*((f"output {k}", got[k], want[k]) for k in want),
                        *((f"grad {k}", g_got[k], g_want[k]) for k in g_want)]:
        atol = rtol = 1e-10 if dtype == torch.float64 else 1e-5
        if magnitude_atol:
            atol *= max(1.0, float(b.detach().abs().max())) if b.numel() else 1.0
        torch.testing.assert_close(a.detach(), b.detach(), atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m, label=label: f"{name} {sizes} batch={batch}: {label}: {m}")


@pytest.mark.parametrize("name", list(SIZES))
def test_matches_reference_float64_and_float32(name):
    @settings(settings.get_profile("zoo"))
    @given(model_cases(name))
    def run(case):
        sizes, batch, seed = case
        compare(name, sizes, batch, seed, torch.float64)
        compare(name, sizes, batch, seed, torch.float32)

    run()


def test_default_sizes_match_reference():
    """Every model at its default sizes (the ones users get), one batch: float64 to 1e-10, float32
    to 1e-5 of each tensor's largest magnitude (the typed embedding model's continuous column
    carries its raw score, hundreds at these sizes, through the embeddings)."""
    for name, entry in penrose_zoo.MODELS.items():
        sizes = {**entry.cls.resolved_sizes(), **entry.cls.example_sizes}
        compare(name, sizes, (2,), 0, torch.float64)
        compare(name, sizes, (2,), 0, torch.float32, magnitude_atol=True)


def test_batched_concept_embedding_reference_matches_the_loop():
    """bench/zoo.py times the vectorised CEM reference; it equals the concept-by-concept one."""
    model, params = build_pair("concept_embedding", dict(f=4, k=3, e=2, r=2), 0)
    inputs = make_inputs("concept_embedding", dict(f=4, k=3, e=2, r=2), (5,), 0, torch.float64)
    a, b = refs.concept_embedding(params, **inputs), refs.concept_embedding_batched(params, **inputs)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-12, rtol=1e-12)


def test_feature_dropout_matches_reference_mask():
    """NAM feature dropout: the diagram's keep mask (one draw per feature) is what the reference
    gets when it is given the same mask; whole features drop, across every output."""
    model, params = build_pair("neural_additive", dict(f=5, i=3, j=2, r=3), 0)
    model.train()
    x = torch.randn(64, 5, dtype=torch.float64)
    torch.manual_seed(0)
    out = model(x)
    torch.manual_seed(0)
    keep = torch.nn.functional.dropout(x * 0 + 1, 0.1, True)
    want = refs.neural_additive(params, x, keep=keep)
    torch.testing.assert_close(out.contrib, want["contrib"], atol=1e-10, rtol=1e-10)
    dropped = keep == 0
    assert dropped.any()
    assert (out.contrib[dropped] == 0).all()  # every output r of a dropped feature


# ---- regressions ------------------------------------------------------------------------------


def test_regression_alignment_into_a_leading_leg():
    """A [t, p] mask aligned into [h, t, p] compiled to `mask[..., None]` (the new axis last), so
    causal attention with h heads failed — or, with h == t == p, silently masked the wrong axis."""
    import penrose

    m = penrose.compile("""
dim t, p, h = 3
input l[h, t, p]
y = where(causal(t, p), l, -inf)
output y
""")
    l = torch.zeros(3, 3, 3)
    y = m(l)
    assert torch.isinf(y[1]).sum() == 3 and torch.isinf(y[:, 0, 1]).all() and not torch.isinf(y[:, 1, 0]).any()


# ---- CUDA -------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

BF16_TOL = 5e-2  # relative Frobenius error ‖penrose − reference‖ / ‖reference‖, per output and gradient


def compare_bf16(name, sizes, batch, seed, device="cuda"):
    """bfloat16 on CUDA: both sides round at every op (differently), and a ReLU / clamp / top-k
    decision can flip near its threshold, so entries are compared in aggregate: the relative
    Frobenius error of every output and every gradient must stay under BF16_TOL."""
    from hypothesis import assume

    model, params = build_pair(name, sizes, seed, torch.bfloat16, device)
    inputs = make_inputs(name, sizes, batch, seed, torch.bfloat16, device)
    got = as_dict(model(**inputs))
    want = refs.reference_for(name, sizes)(params, **inputs)
    got = {k: got[k] for k in want}
    if name == "topk_sparse_autoencoder":  # a near-tie may pick a different feature: not a bug
        assume(torch.equal(got["c"] != 0, want["c"] != 0))
    wrt = {**{f"param {k}": v for k, v in params.items()}, **{f"input {k}": v for k, v in inputs.items() if v.is_floating_point()}}
    g_got, g_want = grads_of(got, wrt, seed), grads_of(want, wrt, seed)
    for label, a, b in [*((f"output {k}", got[k], want[k]) for k in want),
                        *((f"grad {k}", g_got[k], g_want[k]) for k in g_want)]:
        a, b = a.detach().double(), b.detach().double()
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)), f"{name} {label}: non-finite entries differ"
        err = (a[finite] - b[finite]).norm() / b[finite].norm().clamp_min(1e-3)
        assert err < BF16_TOL, f"{name} {sizes} batch={batch}: {label}: relative error {err:.3g}"


@st.composite
def gpu_cases(draw, name):
    sizes, _, seed = draw(model_cases(name))
    sizes = {k: v * 4 if k != "n_active" else v for k, v in sizes.items()}  # enough entries to average
    return sizes, (8,), seed


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(SIZES))
def test_matches_reference_on_cuda(name):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    @settings(settings.get_profile("zoo"), max_examples=4)
    @given(model_cases(name))
    def run_float32(case):
        sizes, batch, seed = case
        compare(name, sizes, batch, seed, torch.float32, device="cuda")

    @settings(settings.get_profile("zoo"), max_examples=4)
    @given(gpu_cases(name))
    def run_bfloat16(case):
        compare_bf16(name, *case)

    run_float32()
    run_bfloat16()
