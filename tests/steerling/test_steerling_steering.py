"""The release's steering recipes, sampler, commit trace and concept attribution, against the release.

tests/fixtures/steerling_release/ was written by the published `steerling` 0.2.0 itself
(`tools/make_steerling_fixtures.py --only steering`, Python 3.13, torch 2.8): a tiny random
model in the published checkpoint layout (tiny/), and the release's `SteerlingGenerator.
generate_full` with its `SteeringConfig` recipes (injection, injection_relu, a relu mask alone,
raw alpha, every injection layer case, both schedules, classifier-free guidance, stop tokens,
greedy and seeded sampling), `concept_top_tokens`, and `FaithfulConceptAttributor` /
`AttributionAccumulator` over the commit trace. Here the same weights go through
`Steerling.from_pretrained` (and `from_release`) and penrose_zoo.steerling.generate.generate_full /
attribution.attribute_generation must reproduce every token, the commit order, the injection
alphas and the attribution numbers. The fixture tool checked that no greedy choice or concept
top-k cut of any pass rests on a near-tie (margins recorded in steering.json).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from penrose.errors import PenroseShapeError
from penrose_zoo.steerling import Steerling
from penrose_zoo.steerling.attribution import attribute_generation, find_chunk_boundaries
from penrose_zoo.steerling.generate import (DiffusionTrace, GenerationConfig, generate, generate_block_diffusion,
                                            generate_full)
from penrose_zoo.steerling.steer import (SteeringConfig, concept_top_token_scores, concept_top_tokens,
                                         injected_hidden, position_injection, prepare_steering, resolve_alpha,
                                         steered_forward)
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/
FIXTURES = HERE / "fixtures" / "steerling_release"
META = json.loads((FIXTURES / "steering.json").read_text())
TENSORS = load_file(str(FIXTURES / "steering.safetensors"))
SPECIAL = META["special_ids"]
IDS = dict(mask_id=SPECIAL["mask"], eos_id=SPECIAL["eos"], pad_id=SPECIAL["pad"])
RUNS = sorted(META["runs"])
ATTRIBUTED = sorted(n for n in RUNS if "attribution" in META["runs"][n])
TOL = 1e-5


ref = reference('steerling_ref')
_models: dict = {}


def _model() -> Steerling:
    if "tiny" not in _models:
        _models["tiny"] = Steerling.from_pretrained(FIXTURES / "tiny", dtype=torch.float32).eval()
    return _models["tiny"]


def _configs():
    cfg = json.loads((FIXTURES / "tiny" / "config.json").read_text())
    from penrose_zoo.steerling.config import MODEL_DEFAULTS

    return ({k: v for k, v in cfg.items() if k in MODEL_DEFAULTS}, cfg["concept"], cfg["vocab_size"])


def _steering(run) -> SteeringConfig | None:
    """The run's SteeringConfig, built as the fixture tool built it (a preset or plain fields)."""
    if run["steering_recipe"] is None:
        return None
    args = dict(run["steering_args"])
    if "relu_logit_mask" in args:
        args["relu_logit_mask"] = {int(k): v for k, v in args["relu_logit_mask"].items()}
    if run["steering_recipe"] == "config":
        return SteeringConfig(**args)
    return getattr(SteeringConfig, run["steering_recipe"])(**args)


def _generation(run) -> GenerationConfig:
    return GenerationConfig(**run["generation"])


def _run(name):
    run = META["runs"][name]
    out = generate_full(_model(), META["prompts"][run["prompt"]], _generation(run), steering=_steering(run), **IDS)
    return run, out


# ---- the model, from the published layout ---------------------------------------------------------


def test_fixture_is_the_release_and_small():
    assert META["release"]["steerling"] == "0.2.0" and META["release"]["torch"].startswith("2.8")
    size = sum(f.stat().st_size for f in FIXTURES.rglob("*") if f.is_file())
    assert size < 2_000_000
    assert {"plain", "inject", "unlearn", "relu_mask_only", "cfg_inject", "sampled_entropy_inject"} <= set(RUNS)
    # no decision of the recorded greedy generations rests on a near-tie
    assert META["margins"]["confidence"] > 1e-4 and META["margins"]["greedy_logit"] > 1e-4
    assert META["margins"]["known_cut"] > 1e-5 and META["margins"]["unknown_cut"] > 1e-5


def test_from_release_is_from_pretrained():
    m, c, vocab = _configs()
    sd = load_file(str(FIXTURES / "tiny" / "model.safetensors"))
    model = Steerling.from_release(sd, m, c, vocab).eval()
    run = META["runs"]["inject"]
    out = generate_full(model, META["prompts"][run["prompt"]], _generation(run), steering=_steering(run), **IDS)
    assert torch.equal(out.tokens, TENSORS["inject.tokens"])


# ---- SteeringConfig: the release's fields, presets and checks --------------------------------------


@pytest.mark.parametrize("name", [n for n in RUNS if META["runs"][n]["steering"] is not None])
def test_steering_config_equals_the_releases(name):
    run = META["runs"][name]
    mine = _steering(run).to_dict()
    theirs = dict(run["steering"])
    theirs["relu_logit_mask"] = (None if theirs["relu_logit_mask"] is None
                                 else {int(k): v for k, v in theirs["relu_logit_mask"].items()})
    assert mine == theirs


def test_presets_defaults():
    a = SteeringConfig.injection(5)
    assert (a.concept_ids, a.mai_lm_target, a.normalize_mai_lm_target, a.inject_layer, a.inject_alpha_schedule,
            a.cutoff_tokens, a.relu_logit_mask) == ((5,), 8.0, True, 8, "hard_cutoff", 32, None)
    u = SteeringConfig.injection_relu(5, group_concept_ids=[7, 5, 9])
    assert (u.concept_ids, u.mai_lm_target, u.normalize_mai_lm_target, u.inject_layer, u.inject_alpha_schedule,
            u.relu_logit_mask) == ((5, 7, 9), -7.0, False, None, "fixed", {5: 20.0})
    assert SteeringConfig().has_injection is False and SteeringConfig().has_logit_mask is False
    assert SteeringConfig(relu_logit_mask={1: 2.0}).has_logit_mask and not SteeringConfig(relu_logit_mask={1: 2.0}).has_injection


@pytest.mark.parametrize("bad, match", [
    (dict(mai_lm_target=float("nan")), "not a finite number"),
    (dict(mai_lm_target=float("inf")), "not a finite number"),
    (dict(mai_lm_target="8"), "must be a number"),
    (dict(relu_logit_mask={3: float("-inf")}), "relu_logit_mask strength for concept 3 is -inf"),
    (dict(concept_ids=[-1]), "out of range"),
    (dict(concept_ids=[1.5]), "not an integer"),
    (dict(concept_ids=[True]), "not an integer"),
    (dict(inject_layer=-1), "inject_layer"),
    (dict(inject_alpha_schedule="linear"), "fixed, hard_cutoff"),
    (dict(cutoff_tokens=0), "cutoff_tokens"),
])
def test_bad_steering_values_are_refused(bad, match):
    with pytest.raises(PenroseShapeError, match=match):
        SteeringConfig(**bad)


def test_unknown_concept_ids_are_refused_by_the_model():
    model = _model()
    with pytest.raises(PenroseShapeError, match=r"steering concept id 37 is out of range; the known head has 37 concepts \(0..36\)"):
        prepare_steering(model, SteeringConfig.injection(37))
    with pytest.raises(PenroseShapeError, match="relu_logit_mask concept id 99 is out of range"):
        prepare_steering(model, SteeringConfig(relu_logit_mask={99: 1.0}))
    with pytest.raises(PenroseShapeError, match="known concept id 40 is out of range"):
        concept_top_tokens(model, 40)
    with pytest.raises(PenroseShapeError, match="SteeringConfig"):
        prepare_steering(model, {"concept_ids": [1]})


def test_resolve_alpha_schedules():
    assert resolve_alpha("fixed", 2.5, 0, 8, 1) == 2.5
    assert resolve_alpha("hard_cutoff", 2.5, 8, 8, 3) == 2.5  # nothing committed yet
    assert resolve_alpha("hard_cutoff", 2.5, 6, 8, 3) == 2.5  # 2 < 3
    assert resolve_alpha("hard_cutoff", 2.5, 5, 8, 3) == 0.0  # 3 committed: off
    with pytest.raises(PenroseShapeError):
        resolve_alpha("cosine", 1.0, 0, 8, 1)


# ---- prepared steering and concept_top_tokens against the release ----------------------------------


@pytest.mark.parametrize("name", [n for n in RUNS if META["runs"][n]["steering"] is not None])
def test_prepared_steering_equals_the_releases(name):
    run = META["runs"][name]
    prep = prepare_steering(_model(), _steering(run))
    if f"{name}.direction" in TENSORS:
        assert float((prep.direction - TENSORS[f"{name}.direction"]).abs().max()) < 1e-6
        assert math.isclose(prep.base_alpha, run["base_alpha"], rel_tol=1e-5)
        assert prep.inject_layer == run["inject_layer"]
    else:
        assert prep.direction is None and prep.alpha(3, 8) == 0.0
    if f"{name}.relu_suppression" in TENSORS:
        assert float((prep.relu_suppression - TENSORS[f"{name}.relu_suppression"]).abs().max()) < TOL
    else:
        assert prep.relu_suppression is None


@pytest.mark.parametrize("cid", [int(c) for c in META["concept_top_tokens"] if c.isdigit()])
def test_concept_top_tokens_equal_the_releases(cid):
    want = META["concept_top_tokens"][str(cid)]
    got = concept_top_token_scores(_model(), cid, 10)
    assert [i for i, _ in got] == want["ids"]
    assert max(abs(a - b) for (_, a), b in zip(got, want["scores"])) < 1e-6
    assert concept_top_tokens(_model(), cid, 10).tolist() == want["ids"]
    assert len(concept_top_token_scores(_model(), cid)) == META["concept_top_tokens"]["default_k"]


# ---- the injection diagram ----------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1, 2, 3, 4, 5])
def test_injected_forward_equals_the_reference(layer):
    """The drawn injection (steerling_injected[_all]_hidden.pen) against the hand-written
    reference of the release's _forward_with_injection, for every kind of inject_layer."""
    m, c, vocab = _configs()
    sd = load_file(str(FIXTURES / "tiny" / "model.safetensors"))
    model = _model()
    gen = torch.Generator().manual_seed(layer)
    ids = torch.randint(0, 60, (2, 11), generator=gen)
    ids[:, 6:] = SPECIAL["mask"]
    d = torch.randn(32, generator=gen)
    inj = position_injection(ids, d / d.norm(), SPECIAL["mask"])
    assert torch.equal(inj[ids != SPECIAL["mask"]], torch.zeros_like(inj[ids != SPECIAL["mask"]]))
    logits, outs = ref.release_forward(sd, m, c, vocab, ids, position_injection=inj, steering_inject_layer=layer,
                                       steering_inject_alpha=-2.5, minimal_output=True)
    with torch.no_grad():
        out = steered_forward(model, ids, inj, layer, -2.5)
    assert float((out.logits - logits).abs().max()) < TOL
    assert float((out.hidden - outs["hidden"]).abs().max()) < TOL
    assert torch.equal(out.known_topk_indices, outs["known_topk_indices"])
    h = injected_hidden(model, ids, inj, layer, -2.5)
    assert (h is None) == (layer > 4)  # past the stack: no layer injects, the plain forward


def test_injection_matches_the_release_forward_fixture():
    """The parity fixture's own injection run (release_like, recorded by the release)."""
    fx = ref.load_fixture(HERE / "fixtures" / "steerling" / "release_like")
    model = Steerling.from_release(fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size,
                                   large_concept_threshold=fx.large_concept_threshold).eval()
    args = fx.meta["runs"]["injection"]["args"]
    with torch.no_grad():
        out = steered_forward(model, fx.tensors["input.input_ids"], fx.tensors["input.position_injection"],
                              args["steering_inject_layer"], args["steering_inject_alpha"])
    rel = out.as_release()
    for field in ("hidden", "known_features", "unk_hat", "composed", "epsilon"):
        assert float((rel[field] - fx.tensors[f"injection.{field}"]).abs().max()) < TOL, field
    assert float((out.logits - fx.tensors["injection.logits"]).abs().max()) < TOL


def test_injection_zero_is_the_plain_forward_and_shares_the_weights():
    model = _model()
    ids = torch.tensor([[3, 4, 5, 63, 63, 63]])
    with torch.no_grad():
        plain = model(ids)
        zero = steered_forward(model, ids, torch.zeros(1, 6, 32), 2, 1.0)
    assert float((plain.logits - zero.logits).abs().max()) < 1e-6
    from penrose_zoo.steerling.steer import _INJECTED

    net = _INJECTED[model][1][0]
    assert all(p.is_meta for p in net.parameters())  # no copy of the weights: it runs on the model's
    # the injected run reads the model's own parameters: its gradient reaches them, and a change to
    # them changes it (layers.1 of the model is the injected copy 0, layers.0 the unsteered one)
    h = injected_hidden(model, ids, torch.randn(1, 6, 32), 2, 1.0)
    h.square().sum().backward()
    assert model.net.layers[1].attn.c_attn.grad.abs().sum() > 0 and model.net.layers[0].mlp.c_fc.grad.abs().sum() > 0
    with torch.no_grad():
        before = injected_hidden(model, ids, torch.zeros(1, 6, 32), 2, 1.0)
        model.net.layers[1].mlp.c_fc.mul_(2.0)
        after = injected_hidden(model, ids, torch.zeros(1, 6, 32), 2, 1.0)
        model.net.layers[1].mlp.c_fc.div_(2.0)  # exactly back: the model is shared with other tests
    model.zero_grad(set_to_none=True)
    assert float((before - after).abs().max()) > 1e-4


def test_bad_injection_inputs():
    model = _model()
    ids = torch.tensor([[3, 4, 63]])
    with pytest.raises(PenroseShapeError, match="the injection must be float"):
        injected_hidden(model, ids, torch.zeros(3, 32), 1)
    with pytest.raises(PenroseShapeError, match="not a finite number"):
        injected_hidden(model, ids, torch.zeros(1, 3, 32), 1, float("nan"))
    with pytest.raises(PenroseShapeError, match="inject_layer"):
        injected_hidden(model, ids, torch.zeros(1, 3, 32), -1)


# ---- the release's sampler: tokens, trace, alphas -----------------------------------------------------


@pytest.mark.parametrize("name", RUNS)
def test_generation_equals_the_releases(name):
    run, out = _run(name)
    assert torch.equal(out.tokens, TENSORS[f"{name}.tokens"])
    assert out.generated == run["final_tokens"] and out.generated_tokens == run["generated_tokens"]
    assert out.prompt_tokens == run["prompt_len"]
    alphas = TENSORS[f"{name}.alphas"]
    assert len(out.alphas) == run["forward_passes"] == alphas.numel()
    assert all(math.isclose(a, float(b), rel_tol=1e-5, abs_tol=1e-7) for a, b in zip(out.alphas, alphas))
    if f"{name}.trace.positions" not in TENSORS:  # classifier-free guidance: the release records no commits
        return
    groups = out.trace.groups
    assert torch.equal(torch.cat([g.positions for g in groups]), TENSORS[f"{name}.trace.positions"])
    assert torch.equal(torch.cat([g.token_ids for g in groups]), TENSORS[f"{name}.trace.token_ids"])
    assert [g.positions.numel() for g in groups] == TENSORS[f"{name}.trace.group_sizes"].tolist()
    assert [g.denoising_step for g in groups] == TENSORS[f"{name}.trace.denoising_steps"].tolist()
    assert torch.equal(out.trace.committed_tokens(), TENSORS[f"{name}.trace.committed_tokens"])
    for o in (0, len(groups) // 2, len(groups) - 1):
        assert torch.equal(out.trace.reconstruct(o), TENSORS[f"{name}.trace.reconstruct.{o}"])
    assert out.trace.position_types() == run["position_types"]
    assert out.trace.commit_order == TENSORS[f"{name}.trace.positions"].tolist()


def test_steering_changes_the_generation():
    plain = TENSORS["plain.tokens"]
    assert not torch.equal(TENSORS["inject.tokens"], plain) and not torch.equal(TENSORS["unlearn.tokens"], plain)
    assert torch.equal(TENSORS["inject_layer_past_the_stack.tokens"], plain)  # no layer to inject after
    # the amplified concept's top tokens become frequent, the unlearned concept's disappear
    top3 = set(META["concept_top_tokens"]["3"]["ids"][:5])
    gen = lambda name: TENSORS[f"{name}.tokens"][META["runs"][name]["prompt_len"]:].tolist()  # noqa: E731
    assert sum(t in top3 for t in gen("inject")) > sum(t in top3 for t in gen("plain"))


def test_the_trace_replays_each_commit():
    """Each recorded commit's target logit is what the model gives on trace.reconstruct(order)
    with that step's injection: the trace is the input diffusion saw."""
    name = "inject"
    run = META["runs"][name]
    model = _model()
    fa = attribute_generation(model, META["prompts"][run["prompt"]], _generation(run), steering=_steering(run),
                              eoc_id=SPECIAL["eoc"], **IDS)
    prep = prepare_steering(model, _steering(run))
    for g in fa.trace.groups:
        x = fa.trace.reconstruct(g.commit_order)[None]
        alpha = fa.output.alphas[g.denoising_step]
        with torch.no_grad():
            out = steered_forward(model, x, position_injection(x, prep.direction, SPECIAL["mask"]), prep.inject_layer, alpha) \
                if alpha else model(x)
        got = out.logits[0, g.positions].gather(-1, g.token_ids[:, None]).squeeze(-1)
        assert float((got - g.target_logits).abs().max()) < 1e-6


def test_generation_config_and_sampler_checks():
    model = _model()
    prompt = META["prompts"]["a"]
    with pytest.raises(PenroseShapeError, match="multiple of the diffusion block"):
        generate_full(model, prompt, GenerationConfig(max_new_tokens=6), **IDS)
    with pytest.raises(PenroseShapeError, match="multiple of the number of blocks"):
        generate_full(model, prompt, GenerationConfig(max_new_tokens=8, steps=3), **IDS)
    with pytest.raises(PenroseShapeError, match="one prompt"):
        generate_full(model, torch.tensor([prompt, prompt]), GenerationConfig(max_new_tokens=4), **IDS)
    with pytest.raises(PenroseShapeError, match="exceed the context"):
        generate_full(model, prompt, GenerationConfig(max_new_tokens=64), **IDS)
    with pytest.raises(PenroseShapeError, match="mask_id 64 is out of range"):
        generate_full(model, prompt, GenerationConfig(max_new_tokens=4), mask_id=64, eos_id=50, pad_id=60)
    for bad in (dict(temperature=-1.0), dict(top_p=1.5), dict(max_new_tokens=0), dict(repetition_penalty=0.5),
                dict(temperature=float("nan")), dict(steps=0)):
        with pytest.raises(PenroseShapeError, match="GenerationConfig"):
            GenerationConfig(**bad)


def test_causal_variant_refuses_the_injection():
    m, c, vocab = _configs()
    causal = Steerling(m, c, vocab, causal=True, seed=0).eval()
    with pytest.raises(PenroseShapeError, match="block-diffusion"):
        generate_full(causal, [1, 2], GenerationConfig(max_new_tokens=4), **IDS)
    with pytest.raises(PenroseShapeError, match="still-masked positions"):
        generate(causal, [1, 2], 3, steering=SteeringConfig.injection(3), temperature=0.0)
    # a relu logit mask alone works left to right: a huge mask bans the concept's tokens
    prep = prepare_steering(causal, SteeringConfig(relu_logit_mask={3: 1e4}))
    ids = generate(causal, [1, 2], 6, steering=SteeringConfig(relu_logit_mask={3: 1e4}), temperature=0.0)
    assert all(float(prep.relu_suppression[t]) == 0.0 for t in ids[2:].tolist())


def test_block_diffusion_generator_takes_steering():
    """penrose's own block-diffusion sampler with the release's injection and logit mask."""
    model = _model()
    prompt = META["prompts"]["b"]
    kw = dict(mask_id=SPECIAL["mask"], steps_per_block=2, temperature=0.0, banned=[SPECIAL["pad"]])
    plain = generate_block_diffusion(model, prompt, 9, **kw)
    zero = generate_block_diffusion(model, prompt, 9, steering=SteeringConfig.injection(3, mai_lm_target=0.0), **kw)
    assert torch.equal(plain, zero)
    amp = generate_block_diffusion(model, prompt, 9, steering=SteeringConfig.injection(3, 30.0, inject_layer=1), **kw)
    top = set(concept_top_tokens(model, 3, 5).tolist())
    assert sum(t in top for t in amp[len(prompt):].tolist()) > sum(t in top for t in plain[len(prompt):].tolist())
    masked = SteeringConfig(relu_logit_mask={3: 1e4})
    prep = prepare_steering(model, masked)
    out = generate_block_diffusion(model, prompt, 9, steering=masked, **kw)
    assert all(float(prep.relu_suppression[t]) == 0.0 for t in out[len(prompt):].tolist())


# ---- concept attribution over the trace -----------------------------------------------------------------


@pytest.mark.parametrize("name", ATTRIBUTED)
def test_attribution_equals_the_releases(name):
    run = META["runs"][name]
    fa = attribute_generation(_model(), META["prompts"][run["prompt"]], _generation(run), steering=_steering(run),
                              eoc_id=SPECIAL["eoc"], **IDS)
    a = fa.attribution
    assert torch.equal(fa.output.tokens, TENSORS[f"{name}.tokens"])
    for field in ("target_token_ids", "known_indices", "unk_indices", "committed"):
        assert torch.equal(getattr(a, field), TENSORS[f"{name}.attr.{field}"]), field
    for field in ("target_logits", "known_weights", "known_contributions", "unk_weights", "unk_contributions",
                  "epsilon_contribution"):
        assert float((getattr(a, field) - TENSORS[f"{name}.attr.{field}"]).abs().max()) < TOL, field
    want = run["attribution"]
    v = a.verify()
    assert v.passed == want["verify"]["passed"] is True and v.max_abs_error < 1e-4
    assert repr(v).startswith("VerificationResult(PASS")
    assert math.isclose(a.coverage, want["coverage"], rel_tol=1e-6)
    top = a.top_k(3)
    for field in ("known_indices", "unk_indices"):
        assert torch.equal(getattr(top, field), TENSORS[f"{name}.attr.top_k3.{field}"]), field
    for field in ("known_weights", "known_contributions", "unk_weights", "unk_contributions"):
        assert float((getattr(top, field) - TENSORS[f"{name}.attr.top_k3.{field}"]).abs().max()) < TOL, field
    assert len(fa.chunks) == len(want["chunks"])
    for (entries, eps), theirs in zip(fa.chunks, want["chunks"]):
        assert math.isclose(eps, theirs["eps_pct"], abs_tol=1e-3)
        mine = {(e["label"], e["type"]): e["contribution"] for e in entries}
        other = {(e["label"], e["type"]): e["contribution"] for e in theirs["entries"]}
        assert mine.keys() == other.keys()
        assert max(abs(mine[k] - other[k]) for k in mine) < TOL
        assert [e["label"] for e in entries[:3]] == [e["label"] for e in theirs["entries"][:3]]
    # the trace's records carry each commit's concept lists
    g = fa.trace.groups[0]
    assert torch.equal(g.known_indices, a.known_indices[0, g.positions])
    assert a.commit_step[g.positions].tolist() == [g.denoising_step] * g.positions.numel()


def test_attribution_rows_and_labels():
    from penrose_zoo.steerling.catalog import ConceptCatalog

    run = META["runs"]["plain"]
    cat = ConceptCatalog.load(HERE / "fixtures" / "steerling_concepts.csv")
    fa = attribute_generation(_model(), META["prompts"]["a"], _generation(run), eoc_id=SPECIAL["eoc"], catalog=cat, **IDS)
    rows = fa.attribution.to_rows()
    committed = int(fa.attribution.committed.sum())
    assert len(rows) == committed * (5 + 7)  # top-k known 5, unknown 7 per committed token
    assert {r["concept_type"] for r in rows} == {"known", "discovered"}
    labels = [e["label"] for e in fa.chunks[0][0]]
    named = {c.concept_id: c.name for c in cat if c.head == "known"}
    for e in fa.chunks[0][0]:
        if e["head"] == "known" and e["concept_id"] in named:
            assert e["label"] == f"Known: {named[e['concept_id']]}"
    assert labels


def test_find_chunk_boundaries_as_the_release():
    toks = [9, 9, 1, 2, 62, 3, 62, 4, 5]
    assert find_chunk_boundaries(toks, 62, start_index=2) == [(2, 4), (5, 6)]
    assert find_chunk_boundaries(toks, 62, start_index=2, include_final_chunk=True) == [(2, 4), (5, 6), (7, 9)]
    assert find_chunk_boundaries(toks, 62, start_index=2, stop_ids=[3]) == [(2, 4)]
    assert find_chunk_boundaries(toks, 62, start_index=2, stop_ids=[5]) == [(2, 4), (5, 6), (7, 8)]


def test_trace_checks():
    with pytest.raises(PenroseShapeError, match="contiguous"):
        from penrose_zoo.steerling.generate import CommitRecord

        DiffusionTrace(torch.tensor([1]), 1, 3, 63, 50, [CommitRecord(1, 0, torch.tensor([1]), torch.tensor([2]))])


# ---- the command line -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from penrose_zoo.steerling.cli import main

    path = tmp_path_factory.mktemp("steer") / "ckpt"
    assert main(["init", "--out", str(path), "--tiny", "--seed", "0"]) == 0
    return path


def test_cli_steer_inject_and_unlearn(ckpt, capsys):
    from penrose_zoo.steerling.cli import main

    capsys.readouterr()
    assert main(["steer", "--checkpoint", str(ckpt), "--prompt", "a", "--inject", "3=8", "--max-new-tokens", "8",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["steering"] == SteeringConfig.injection([3], 8.0, inject_layer=1).to_dict()  # tiny: 2 layers, 2 // 4 -> 1
    assert r["attribution"]["verified"] and isinstance(r["steered"], str) and len(r["commit_order"]) == 8
    assert r["top_token_share_steered"] >= r["top_token_share_unsteered"]
    assert main(["steer", "--checkpoint", str(ckpt), "--prompt", "a", "--unlearn", "legal reasoning=20",
                 "--catalog", str(HERE / "fixtures" / "steerling_concepts.csv"), "--unlearn-group", "--json",
                 "--max-new-tokens", "8", "--schedule", "hard_cutoff", "--cutoff-tokens", "4"]) == 0
    r = json.loads(capsys.readouterr().out)
    s = r["steering"]
    assert s["mai_lm_target"] == -7.0 and not s["normalize_mai_lm_target"] and s["inject_alpha_schedule"] == "hard_cutoff"
    assert s["cutoff_tokens"] == 4 and len(s["relu_logit_mask"]) == 1 and r["inject_layer"] == 1
    assert main(["steer", "--checkpoint", str(ckpt), "--prompt", "a", "--inject", "4=2", "--inject-layer", "2",
                 "--max-new-tokens", "3"]) == 0
    assert "steered:" in capsys.readouterr().out


def test_cli_generate_with_steering(ckpt, capsys):
    from penrose_zoo.steerling.cli import main

    capsys.readouterr()
    base = ["generate", "--checkpoint", str(ckpt), "--prompt", "a", "--max-new-tokens", "8", "--temperature", "0"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--inject", "3=40", "--inject-layer", "1"]) == 0
    assert capsys.readouterr().out != plain
    assert main(base + ["--unlearn", "3=20"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--inject", "3=nan"], "not a finite number"),
    (["--inject", "3=inf"], "not a finite number"),
    (["--inject", "3"], "CONCEPT=STRENGTH"),
    (["--inject", "40=2"], "known concept id 40 is out of range"),
    (["--unlearn", "nonesuch=2"], "unknown concept 'nonesuch'"),
    (["--inject", "3=2", "--unlearn", "4=2"], "not both"),
    (["--inject", "3=2", "--inject", "4=5"], "one strength"),
    (["--unlearn", "3=2", "--unlearn-group"], "--catalog"),
    (["--concept", "3", "--scale", "2", "--schedule", "fixed"], "need --inject or --unlearn"),
    (["--inject", "3=2", "--concept", "3"], "name their concepts themselves"),
])
def test_cli_steering_errors(ckpt, capsys, argv, message):
    from penrose_zoo.steerling.cli import main

    assert main(["steer", "--checkpoint", str(ckpt), "--prompt", "a", *argv]) == 1
    assert message in capsys.readouterr().err


def test_steering_must_be_a_steering_config():
    with pytest.raises(PenroseShapeError, match="SteeringConfig"):
        generate_full(_model(), META["prompts"]["a"], GenerationConfig(max_new_tokens=4), steering={"concept_ids": [3]},
                      **IDS)
