"""Steerling from diagrams (zoo/steerling) against the published release's outputs.

The fixtures in tests/fixtures/steerling/ hold tiny random configurations of steerling 0.2.0,
their weights under the release's keys and the release's outputs (tools/make_steerling_fixtures.py).
Every fixture whose config the diagrams draw is replayed through `Steerling.from_release` and
must match every recorded output within 1e-5 (float32); the others must be refused with an
error naming the config field. The default (8B) config is checked on the meta device against
the parameter count derived independently in tests/references/steerling_ref.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from penrose.errors import PenroseCompileError, PenroseError, PenroseShapeError
from penrose_zoo.steerling import Steerling, release_key, release_names
from penrose_zoo.steerling.model import DIAGRAM, PLAIN_DIAGRAM, RELEASE_NAMES
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/
FIXTURES = HERE / "fixtures" / "steerling"
STEERLING = HERE.parent / "zoo" / "steerling"
TOL = 1e-5
LARGE_THRESHOLD = 50000  # the release's cut between small and large concept heads


ref = reference('steerling_ref')
NAMES = sorted(p.stem for p in FIXTURES.glob("*.safetensors"))
# What the diagrams do not draw, per fixture: the config field the error must name.
UNSUPPORTED = {
    "attention_heads_no_eps": "use_attention_known",
    "causal_prenorm_layernorm": "use_rms_norm",
    "known_only_saturated": "norm_order",
}
SUPPORTED = [n for n in NAMES if n not in UNSUPPORTED]
# Runs whose arguments the wrapper does not take (residual-stream injection).
SKIPPED_ARGS = {"position_injection", "steering_inject_layer", "steering_inject_alpha", "unknown_topk"}
RUNS = [
    (n, r)
    for n in SUPPORTED
    for r, run in json.loads((FIXTURES / f"{n}.json").read_text())["runs"].items()
    if not set(run["args"]) & SKIPPED_ARGS
]

_cache: dict = {}


def _fixture(name):
    if name not in _cache:
        fx = ref.load_fixture(FIXTURES / name)
        model = Steerling.from_release(fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size,
                                       large_concept_threshold=fx.large_concept_threshold).eval()
        _cache[name] = (fx, model)
    return _cache[name]


def _canonical_topk(idx, logits):
    """Order each top-k row by (logit desc, index asc); the release leaves ties in any order."""
    by_index = torch.argsort(idx, dim=-1, stable=True)
    idx, logits = idx.gather(-1, by_index), logits.gather(-1, by_index)
    by_logit = torch.argsort(logits, dim=-1, descending=True, stable=True)
    return idx.gather(-1, by_logit), logits.gather(-1, by_logit)


def _replay(fx, model, run, dense_heads: bool = False):
    args = run["args"]
    kw = {"dense_heads": dense_heads}
    if run["call"] == "intervene":
        kw["intervene_known"] = {int(k): v for k, v in args["known"].items()}
        kw["intervene_unknown"] = {int(k): v for k, v in args["unknown"].items()}
        kw["positions"] = fx.tensors[args["positions"]] if args["positions"] else None
    with torch.no_grad():
        return model(fx.tensors["input.input_ids"], **kw)


def test_some_fixture_is_supported():
    assert {"release_like", "mha_dense_unknown"} <= set(SUPPORTED) and len(RUNS) >= 9


def test_config_picks_the_concept_head_diagrams():
    _, like = _fixture("release_like")
    assert like.concept_parts == ("concepts_known.pen", "concepts_unknown.pen")  # = concepts.pen
    assert like.unknown_large and not like.known_large  # threshold 40 < 53: blocked
    _, mha = _fixture("mha_dense_unknown")
    assert mha.concept_parts == ("concepts_known_wide.pen", "concepts_unknown_dense.pen")
    assert mha.sizes["kc"] == 4 and mha.sizes["kcf"] == 6 and mha.sizes["g"] == 2 and mha.sizes["r"] == 1
    assert sorted(n for n, _ in mha.net.unknown_head.named_parameters()) == ["concept_embedding", "concept_predictor"]
    fx, _ = _fixture("mha_dense_unknown")
    assert mha.num_parameters() == fx.meta["param_count"]["parameters"]


def test_dense_unknown_variant_round_trips_a_checkpoint(tmp_path):
    fx, model = _fixture("mha_dense_unknown")
    model.save(tmp_path / "ckpt")
    again = Steerling.load(tmp_path / "ckpt")
    assert again.concept_parts == model.concept_parts
    ids = fx.tensors["input.input_ids"]
    with torch.no_grad():
        assert torch.equal(again(ids, intervene_unknown={2: 1.0}).logits, model(ids, intervene_unknown={2: 1.0}).logits)
    with torch.no_grad():  # the embeddings diagram draws these heads too (their *_head_at blocks)
        emb = again.forward_from_embeddings(again.embed(ids))
        dense = again(ids, dense_heads=True)
    assert float((emb.logits - dense.logits).abs().max()) <= 1e-6


@pytest.mark.parametrize("name", ["release_like", "mha_dense_unknown"])
@pytest.mark.parametrize("known,unknown", [({}, {}), ({3: 1.0, 1: 0.0}, {}), ({}, {2: 0.9}), ({0: 0.3}, {4: 0.0})])
def test_forward_from_embeddings_is_forward(name, known, unknown):
    """The embeddings diagram (per-position values, any head variant) computes forward's function:
    the same values with scalar interventions, and with per-position values equal to them."""
    fx, model = _fixture(name)
    ids, pos = fx.tensors["input.input_ids"], fx.tensors["input.positions"]
    with torch.no_grad():
        want = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos, dense_heads=True)
        got = model.forward_from_embeddings(model.embed(ids), intervene_known=known, intervene_unknown=unknown, positions=pos)
        per_position = {c: torch.full(ids.shape, v) for c, v in known.items()}
        again = model.forward_from_embeddings(model.embed(ids), intervene_known=per_position,
                                              intervene_unknown=unknown, positions=pos)
    for key in ("logits", "known_features", "unknown_features", "composed", "known_weights", "unknown_weights"):
        assert float((getattr(got, key) - getattr(want, key)).abs().max()) <= 1e-6, key
        assert torch.equal(getattr(again, key), getattr(got, key)), key


def test_concepts_from_hidden_is_forward_after_the_hidden_state():
    fx, model = _fixture("release_like")
    ids, pos = fx.tensors["input.input_ids"], fx.tensors["input.positions"]
    with torch.no_grad():
        out = model(ids, intervene_known={3: 1.0}, intervene_unknown={0: 0.5}, positions=pos)
        again = model.concepts_from_hidden(out.hidden, intervene_known={3: 1.0}, intervene_unknown={0: 0.5}, positions=pos)
        dense = model.concepts_from_hidden(out.hidden, dense_heads=True)
        full = model(ids, dense_heads=True)
    for key in ("logits", "known_features", "unknown_features", "composed"):
        assert torch.equal(getattr(out, key), getattr(again, key)), key
        assert float((getattr(dense, key) - getattr(full, key)).abs().max()) <= 1e-6, key
    assert torch.equal(out.unknown_topk_indices, again.unknown_topk_indices) and again.unknown_weights is None
    assert dense.unknown_weights is not None


@pytest.mark.parametrize("name,run_name", RUNS, ids=[f"{n}-{r}" for n, r in RUNS])
def test_matches_release(name, run_name):
    fx, model = _fixture(name)
    run = fx.meta["runs"][run_name]
    out = _replay(fx, model, run)
    got = {"logits": out.logits, **out.as_release()}
    want = {k: fx.tensors[f"{run_name}.{k}"] for k in run["outputs"]}
    # heads wider than one block run blocked and make no tokens × concepts diagnostics; the same
    # model with dense heads (the diagrams) gives them
    missing = {k for k in want if got.get(k) is None}
    assert missing <= {"known_logits", "known_weights", "unknown_logits", "unknown_weights"}, missing
    if missing:
        dense = _replay(fx, model, run, dense_heads=True).as_release()
        got.update({k: dense[k] for k in missing})
    for head in ("known", "unknown"):
        i_key, l_key = f"{head}_topk_indices", f"{head}_topk_logits"
        if i_key in want:
            want[i_key], want[l_key] = _canonical_topk(want[i_key], want[l_key])
            got[i_key], got[l_key] = _canonical_topk(got[i_key], got[l_key])
    for key in sorted(want):
        have, ref_value = got[key], want[key]
        assert have is not None, f"{key}: the release gives it, penrose gives None"
        assert have.shape == ref_value.shape, f"{key}: shape {tuple(have.shape)} != {tuple(ref_value.shape)}"
        if ref_value.dtype.is_floating_point:
            assert have.dtype == torch.float32, key
            err = float((have - ref_value).abs().max()) if ref_value.numel() else 0.0
            assert err <= TOL, f"{key}: max abs error {err:.3g}"
        else:
            assert torch.equal(have, ref_value), key
    # ε exists exactly when the release has it
    assert (out.epsilon is not None) == ("epsilon" in run["outputs"])


def test_topk_weights_are_sigmoid_of_topk_logits():
    fx, model = _fixture("release_like")
    out = _replay(fx, model, fx.meta["runs"]["base"])
    assert torch.equal(out.known_topk_weights, torch.sigmoid(out.known_topk_logits))
    # both heads are wider than one block (blocked): no dense weights
    assert out.known_weights is None and out.unknown_weights is None
    dense = _replay(fx, model, fx.meta["runs"]["base"], dense_heads=True)
    # the dense weights hold exactly the top-k entries, those the blocked head reports
    _same_topk(out.known_topk_indices, out.known_topk_logits, dense.known_topk_indices, dense.known_topk_logits)
    kept = dense.known_weights.gather(-1, dense.known_topk_indices)
    assert torch.equal(kept, dense.known_topk_weights)
    assert int((dense.known_weights != 0).sum(-1).max()) == fx.concept_config["topk_known"]
    assert int((dense.unknown_weights != 0).sum(-1).max()) == fx.concept_config["unknown_topk"]


def test_causal_variant_matches_reference():
    """The causal variant (steerling.pen compiled with blk = 1) = the release with diff_block_size 1
    (query t sees keys s <= t)."""
    fx = ref.load_fixture(FIXTURES / "release_like")
    model = Steerling.from_release(fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size,
                                   causal=True, large_concept_threshold=fx.large_concept_threshold)
    ids = fx.tensors["input.input_ids"]
    with torch.no_grad():
        out = model(ids, intervene_known={3: 1.0})
        logits, want = ref.release_intervene(
            fx.state_dict, {**fx.model_config, "diff_block_size": 1}, fx.concept_config, fx.vocab_size, ids,
            known={3: 1.0}, large_concept_threshold=fx.large_concept_threshold)
    assert float((out.logits - logits).abs().max()) <= TOL
    assert float((out.hidden - want["hidden"]).abs().max()) <= TOL
    # and differs from the block-causal model (diff_block_size 4 > 1)
    _, block_model = _fixture("release_like")
    with torch.no_grad():
        assert float((block_model(ids).hidden - model(ids).hidden).abs().max()) > 1e-3


def test_gradients_follow_the_epsilon_composition():
    """With ε on, the LM head reads û.detach() + ε + k̂ = h in value and in gradient: the LM loss
    reaches neither concept head; with ε off (a known intervention) it reaches the known head,
    and never the backbone through the unknown head (which reads h.detach())."""
    fx, _ = _fixture("release_like")
    model = Steerling.from_release({k: v.clone() for k, v in fx.state_dict.items()}, fx.model_config,
                                   fx.concept_config, fx.vocab_size, large_concept_threshold=fx.large_concept_threshold)
    ids = fx.tensors["input.input_ids"]
    net = model.net
    model(ids).logits.logsumexp(-1).sum().backward()
    assert net.known_head.concept_predictor.grad is None or float(net.known_head.concept_predictor.grad.abs().max()) == 0.0
    assert net.unknown_head.predictor_up.grad is None or float(net.unknown_head.predictor_up.grad.abs().max()) == 0.0
    assert float(net.layers[0].attn.c_attn.grad.abs().max()) > 0
    model.zero_grad(set_to_none=True)
    model(ids, intervene_known={0: 1.0}).logits.logsumexp(-1).sum().backward()
    assert float(net.known_head.concept_predictor.grad.abs().max()) > 0
    assert float(net.unknown_head.predictor_up.grad.abs().max()) > 0


# ---- unsupported configurations -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_fixture_is_refused_naming_the_field(name):
    fx = ref.load_fixture(FIXTURES / name)
    with pytest.raises(PenroseCompileError, match=UNSUPPORTED[name]):
        Steerling.from_release(fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size)


@pytest.mark.parametrize("field,value", [
    ("mlp_type", "standard"), ("norm_eps", 1e-6), ("clip_qkv", 2.5), ("weight_sharing", False),
    ("use_qk_norm", False), ("rope_base", 1e4 + 0.5), ("not_a_field", 1),
])
def test_unsupported_model_config_names_the_field(field, value):
    with torch.device("meta"), pytest.raises(PenroseCompileError, match=field):
        Steerling.from_release_config({field: value}, {}, 100)


@pytest.mark.parametrize("field,value", [
    ("use_attention_unknown", True), ("topk_on_logits", True), ("topk_known_features", 8),
    ("concept_dim", 128), ("use_unknown", False), ("apply_topk_to_unknown", False),
])
def test_unsupported_concept_config_names_the_field(field, value):
    with torch.device("meta"), pytest.raises(PenroseCompileError, match=field):
        Steerling.from_release_config({}, {field: value}, 100)


# ---- the released size ----------------------------------------------------------------------


def test_meta_default_config_has_the_release_parameter_count():
    with torch.device("meta"):
        big = Steerling.from_release_config({}, {}, 100281)
    assert big.num_parameters() == ref.release_param_count({}, {}, 100281) == 8_391_778_304
    want = ref.release_state_dict_shapes({}, {}, 100281)
    want.pop("transformer.lm_head.weight")  # tied: stored once
    assert big.expected_release_shapes() == want
    # padded concept tables as stored, valid concepts as drawn
    assert big.sizes["c"] == 33732 and want["known_head.concept_predictor.weight"] == (33744, 4096)
    assert big.sizes["u"] == 101196 and want["unknown_head.predictor_up.weight"] == (101200, 256)
    assert all(p.is_meta for p in big.parameters())


def test_meta_head_variants_have_the_release_parameter_count():
    concepts = {"factorize_unknown": False, "topk_known_features": 64}
    with torch.device("meta"):
        big = Steerling.from_release_config({"n_kv_heads": None}, concepts, 100281)
        out = big(torch.zeros(1, 8, dtype=torch.long))
    assert big.concept_parts == ("concepts_known_wide.pen", "concepts_unknown_dense.pen")
    assert big.num_parameters() == ref.release_param_count({"n_kv_heads": None}, concepts, 100281)
    want = ref.release_state_dict_shapes({"n_kv_heads": None}, concepts, 100281)
    want.pop("transformer.lm_head.weight")
    assert big.expected_release_shapes() == want
    assert out.unknown_weights is None and out.unknown_topk_indices.shape == (1, 8, 128)  # 101196: blocked


def test_diagram_parameter_count_is_the_release_count():
    import penrose

    for path in (DIAGRAM, PLAIN_DIAGRAM):
        assert penrose.load(path).param_count() == 8_391_778_304


def test_meta_forward_shapes():
    with torch.device("meta"):
        big = Steerling.from_release_config({"n_layers": 2}, {}, 100281)
        out = big(torch.zeros(1, 64, dtype=torch.long))
    assert out.logits.shape == (1, 64, 100281)
    # both heads (33,732 and 101,196 concepts) are wider than one block (4,096): blocked, no
    # tokens × concepts matrix
    assert out.known_logits is None and out.known_weights is None
    assert out.unknown_weights is None and out.unknown_logits is None
    assert out.known_topk_indices.shape == (1, 64, 32) and out.unknown_topk_indices.shape == (1, 64, 128)
    assert out.known_features.shape == out.unknown_features.shape == (1, 64, 4096)
    with torch.device("meta"):
        dense = big(torch.zeros(1, 64, dtype=torch.long), dense_heads=True)
    assert dense.known_logits.shape == (1, 64, 33732)  # padding rows never read
    assert dense.unknown_weights.shape == (1, 64, 101196)


def test_name_table_round_trips():
    names = release_names(3)
    assert len(set(names.values())) == len(names) == 3 * 8 + 10
    for name, key in names.items():
        assert release_key(name) == key
    assert release_key("layers.2.attn.c_attn") == "transformer.blocks.2.attn.c_attn.weight"
    assert len(RELEASE_NAMES) == 18


# ---- bad input ------------------------------------------------------------------------------


def test_token_ids_out_of_range():
    fx, model = _fixture("release_like")
    ids = fx.tensors["input.input_ids"].clone()
    ids[0, 3] = fx.vocab_size
    with pytest.raises(PenroseShapeError, match=f"token id {fx.vocab_size} is out of range"):
        model(ids)
    ids[0, 3] = -1
    with pytest.raises(PenroseShapeError, match="token id -1"):
        model(ids)
    with pytest.raises(PenroseShapeError, match="integer token ids"):
        model(ids.float())


def test_sequence_longer_than_the_context():
    fx, model = _fixture("release_like")
    T = fx.model_config["block_size"]
    with pytest.raises(PenroseShapeError, match=f"longer than the context \\(block_size = {T}\\)"):
        model(torch.zeros(1, T + 1, dtype=torch.long))
    model(torch.zeros(1, T, dtype=torch.long))  # exactly the context is fine


def test_intervention_concept_ids_out_of_range():
    fx, model = _fixture("release_like")
    ids = fx.tensors["input.input_ids"]
    n, m = fx.concept_config["n_concepts"], fx.concept_config["n_unknown_concepts"]
    with pytest.raises(PenroseShapeError, match=f"concept id {n} is out of range; the known head has {n} concepts"):
        model(ids, intervene_known={n: 1.0})  # a padding row is not a concept
    with pytest.raises(PenroseShapeError, match="concept id -1"):
        model(ids, intervene_known={-1: 1.0})
    with pytest.raises(PenroseShapeError, match=f"concept id {m} is out of range; the unknown head"):
        model(ids, intervene_unknown={m: 0.5})
    with pytest.raises(PenroseShapeError, match="not a finite number"):
        model(ids, intervene_known={0: float("nan")})
    with pytest.raises(PenroseShapeError, match="positions"):
        model(ids, intervene_known={0: 1.0}, positions=torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize("change,message", [
    ("missing", "missing key\\(s\\): transformer.blocks.1.mlp.c_fc.weight"),
    ("extra", "unexpected key\\(s\\): transformer.blocks.2.ln_1.weight"),
    ("shape", "known_head.concept_predictor.weight has shape \\(37, 32\\), expected \\(48, 32\\)"),
    ("dtype", "transformer.ln_f.weight has dtype torch.int64"),
    ("untied", "transformer.lm_head.weight differs from transformer.tok_emb.weight"),
])
def test_bad_state_dict_names_the_key(change, message):
    fx = ref.load_fixture(FIXTURES / "release_like")
    sd = dict(fx.state_dict)
    if change == "missing":
        del sd["transformer.blocks.1.mlp.c_fc.weight"]
    elif change == "extra":
        sd["transformer.blocks.2.ln_1.weight"] = torch.ones(32)
    elif change == "shape":
        sd["known_head.concept_predictor.weight"] = sd["known_head.concept_predictor.weight"][:37]
    elif change == "dtype":
        sd["transformer.ln_f.weight"] = torch.ones(32, dtype=torch.long)
    else:
        sd["transformer.lm_head.weight"] = sd["transformer.tok_emb.weight"] + 1
    with pytest.raises(PenroseShapeError, match=message):
        Steerling.from_release(sd, fx.model_config, fx.concept_config, fx.vocab_size)


def test_tied_lm_head_key_is_accepted():
    fx = ref.load_fixture(FIXTURES / "release_like")
    sd = dict(fx.state_dict, **{"transformer.lm_head.weight": fx.state_dict["transformer.tok_emb.weight"]})
    model = Steerling.from_release(sd, fx.model_config, fx.concept_config, fx.vocab_size)
    assert model.num_parameters() == fx.meta["param_count"]["parameters"]


# ---- checkpoints ----------------------------------------------------------------------------


def test_save_load_round_trip_in_release_layout(tmp_path):
    from safetensors.torch import load_file

    fx, model = _fixture("release_like")
    model.save(tmp_path / "ckpt")
    stored = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert set(stored) == set(fx.state_dict)  # release keys, tied embedding once
    for k, v in stored.items():
        assert torch.equal(v, fx.state_dict[k]), k
    again = Steerling.load(tmp_path / "ckpt", large_concept_threshold=fx.large_concept_threshold)
    ids = fx.tensors["input.input_ids"]
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert again.model_config == model.model_config and again.concept_config == model.concept_config
    with pytest.raises(PenroseError, match="no model.safetensors"):
        Steerling.load(tmp_path)


# ---- the diagrams ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dims", "layers", "concepts", "concepts_known", "concepts_known_wide", "concepts_unknown",
                                  "concepts_unknown_dense", "concepts_compose", "steerling", "steerling_hidden",
                                  "steerling_readout", "steerling_plain", "steerling_embeddings",
                                  "steerling_injected_hidden", "steerling_injected_all_hidden"])
def test_diagrams_have_legends_and_captions(name):
    text = (STEERLING / f"{name}.pen").read_text()
    assert text.startswith("# index legend:")
    if name not in ("dims", "concepts"):
        assert any(f"# {i}) " in text for i in (1, 6, 9, 11)), name


def test_diagrams_draw_the_release():
    layers = (STEERLING / "layers.pen").read_text()
    assert "block attention(x[t, e], m[t, s] : bool)" in layers and "l = where(m, l, -inf)" in layers
    assert "causal" not in layers.split("block attention")[1]  # the mask is made by the callers, once
    assert "clamp(einsum('te,oe->to', x, c_attn), min=-clip, max=clip)" in layers
    assert "einsum('tgrd,sgd->grts', q, k)" in layers  # GQA: heads as legs
    concepts = (STEERLING / "concepts.pen").read_text()
    for part in ("concepts_known.pen", "concepts_unknown.pen", "concepts_compose.pen"):
        assert f'include "{part}"' in concepts
    assert "detach(uf)" in (STEERLING / "concepts_compose.pen").read_text()
    for part in ("known", "known_wide", "unknown", "unknown_dense"):
        text = (STEERLING / f"concepts_{part}.pen").read_text()
        assert "min=-15, max=15" in text
        assert ("block known_head(h[t, e], kpos[t] : bool, ksel[c] : bool, kval[c])" in text if "unknown" not in part
                else "block unknown_head(h[t, e], upos[t] : bool, usel[u] : bool, uval[u])" in text)
    for name in ("steerling", "steerling_plain"):
        text = (STEERLING / f"{name}.pen").read_text()
        assert 'include "layers.pen"' in text and 'include "concepts.pen"' in text
        assert "m = block_causal(t, s, block=blk)" in text and "layer(x, m) repeat L as layers" in text
        assert "gather(tok_emb, ids)" in text
        assert "einsum('te,ve->tv', z, tok_emb)" in text  # tied LM head


# ---- large heads: the blocked top-k path ---------------------------------------------------

TINY_MODEL = dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=16, block_size=16, diff_block_size=4, intermediate_size=24,
                  clip_qkv=10.0)


def _tiny_large(factorize: bool, wide: bool, threshold: int = 10, seed: int = 3):
    """Both heads 'large' (37, 53 concepts > threshold), streamed in blocks of 8 concepts."""
    c = dict(n_concepts=37, n_unknown_concepts=53, concept_dim=16, topk_known=4, topk_known_features=6 if wide else 4,
             factorize_unknown=factorize, factorize_rank=16, unknown_topk=5, block_size=8, pad_multiple=8)
    model = Steerling.from_release_config(TINY_MODEL, c, 29, seed=seed, large_concept_threshold=threshold)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough for moderate logits (no clamp ties)
        for name, p in model.net.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, (0.6 if "head" in name else 1.0) / p.shape[-1] ** 0.5, generator=g)
    return model, c


def _same_topk(a_idx, a_log, b_idx, b_log):
    """The same concepts per token with the same logits (within TOL); two float32 computations may
    order logits a few ulps apart differently, so the lists are compared as sets."""
    a_idx, a_order = a_idx.sort(-1)
    b_idx, b_order = b_idx.sort(-1)
    assert torch.equal(a_idx, b_idx)
    assert float((a_log.gather(-1, a_order) - b_log.gather(-1, b_order)).abs().max()) <= TOL


def _assert_same_release_fields(got: dict, want: dict) -> None:
    """The release's feature-level outputs: equal within TOL, None exactly where the release's are."""
    for key in ("hidden", "known_features", "unk", "unk_hat", "unk_for_lm", "composed", "epsilon", "epsilon_true"):
        if want[key] is None:
            assert got[key] is None, key
        else:
            assert float((got[key] - want[key]).abs().max()) <= TOL, key


def _assert_active_rebuilds_features(model, out) -> None:
    """A blocked head's active lists (ids, weights) are what its features are the weighted sum
    of, interventions included: concept attribution stays exact without dense weights."""
    for kind in ("known", "unknown"):
        ids, w = getattr(out, f"{kind}_active")
        with torch.no_grad():
            rebuilt = (w[..., None] * model.concept_embeddings(kind, ids)).sum(-2)
        assert float((rebuilt - getattr(out, f"{kind}_features")).abs().max()) <= TOL, kind


INTERVENTIONS = [({}, {}), ({3: 1.0, 20: 0.0, 36: 0.5}, {}), ({}, {0: 1.0, 52: 0.25}), ({7: 0.9}, {5: 0.0, 17: 1.0})]


@pytest.mark.parametrize("factorize,wide", [(True, False), (False, True)])
@pytest.mark.parametrize("known,unknown", INTERVENTIONS)
def test_blocked_forward_equals_dense_forward_and_the_release(factorize, wide, known, unknown):
    """With the threshold lowered, both heads run blocked (blocked.py, 5 and 7 blocks of 8
    concepts): the same values and top-k as the dense diagram where the diagram draws the
    large-head rule, and the release's outputs (the reference) everywhere."""
    model, c = _tiny_large(factorize, wide)
    assert model.known_large and model.unknown_large
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 29, (2, 9), generator=g)
    pos = torch.rand(2, 9, generator=g) > 0.4
    with torch.no_grad():
        out = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos)
    assert out.known_logits is None and out.unknown_weights is None  # never a tokens × concepts matrix
    _assert_active_rebuilds_features(model, out)
    # the release (reference): large heads, sparse rule for both
    _, want = ref.release_intervene(model.release_state_dict(), TINY_MODEL, c, 29, ids, known=known, unknown=unknown,
                                    positions=pos, large_concept_threshold=model.large_concept_threshold)
    got = out.as_release()
    _assert_same_release_fields(got, want)
    for head in ("known", "unknown"):
        _same_topk(got[f"{head}_topk_indices"], got[f"{head}_topk_logits"], want[f"{head}_topk_indices"], want[f"{head}_topk_logits"])
    # the dense diagram, where it draws the same rule (no known interventions: the known head's
    # diagram draws the small-head rule; the dense unknown head's likewise)
    if known or (unknown and not factorize):
        with pytest.raises(PenroseCompileError, match="sparse rule"):
            model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos, dense_heads=True)
        return
    with torch.no_grad():
        dense = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos, dense_heads=True)
    assert dense.unknown_weights is not None
    for key in ("logits", "hidden", "known_features", "unknown_features", "composed", "epsilon"):
        assert float((getattr(out, key) - getattr(dense, key)).abs().max()) <= 1e-6, key
    for head in ("known", "unknown"):
        _same_topk(getattr(out, f"{head}_topk_indices"), getattr(out, f"{head}_topk_logits"),
                   getattr(dense, f"{head}_topk_indices"), getattr(dense, f"{head}_topk_logits"))


@pytest.mark.parametrize("factorize,wide", [(True, False), (False, True)])
@pytest.mark.parametrize("known,unknown", INTERVENTIONS)
def test_wide_small_heads_run_blocked_with_the_small_head_rules(factorize, wide, known, unknown):
    """Heads at or below the threshold (the release computes them densely, like the 8B known head)
    but wider than one block (37 and 53 concepts, blocks of 8) run blocked too, with the release's
    small-head rules: no tokens × concepts matrix, and the release's outputs (the reference)."""
    model, c = _tiny_large(factorize, wide, threshold=LARGE_THRESHOLD)
    assert not (model.known_large or model.unknown_large)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 29, (2, 9), generator=g)
    pos = torch.rand(2, 9, generator=g) > 0.4
    with torch.no_grad():
        out = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos)
    assert out.known_logits is None and out.known_weights is None and out.unknown_logits is None
    _assert_active_rebuilds_features(model, out)
    _, want = ref.release_intervene(model.release_state_dict(), TINY_MODEL, c, 29, ids, known=known, unknown=unknown,
                                    positions=pos)
    got = out.as_release()
    _assert_same_release_fields(got, want)
    for head in ("known", "unknown"):
        if want[f"{head}_topk_indices"] is None:  # the release's dense intervention path reports none
            assert got[f"{head}_topk_indices"] is None, head
        else:
            _same_topk(got[f"{head}_topk_indices"], got[f"{head}_topk_logits"], want[f"{head}_topk_indices"],
                       want[f"{head}_topk_logits"])
    # the same model with its heads dense (the diagrams), where the diagrams draw the small-head rule
    if unknown and factorize:
        with pytest.raises(PenroseCompileError, match="dense rule"):
            model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos, dense_heads=True)
        return
    with torch.no_grad():
        dense = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos, dense_heads=True)
    for key in ("logits", "hidden", "known_features", "unknown_features", "composed"):
        assert float((getattr(out, key) - getattr(dense, key)).abs().max()) <= 1e-6, key


def test_wide_small_heads_train_like_dense_ones():
    """Blocked small-rule heads give the dense diagrams' gradients (checkpointed blocks)."""
    model, _ = _tiny_large(True, True, threshold=LARGE_THRESHOLD)
    ids = torch.randint(0, 29, (2, 9), generator=torch.Generator().manual_seed(2))
    grads = []
    for dense in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(ids, dense_heads=dense)
        (out.logits.logsumexp(-1).mean() + out.known_features.pow(2).mean() + out.unknown_features.pow(2).mean()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-6), n


@pytest.mark.parametrize("name", ["release_like", "mha_dense_unknown"])
@pytest.mark.parametrize("causal", [False, True])
def test_plain_diagram_is_the_model_without_interventions(name, causal):
    """self.net (steerling_plain.pen: heads and composition without intervention inputs)
    computes what steerling.pen (net.intervention) computes when nothing is intervened on."""
    fx = ref.load_fixture(FIXTURES / name)
    model = Steerling.from_release(fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size, causal=causal)
    ids = fx.tensors["input.input_ids"]
    c, u = model.sizes["c"], model.sizes["u"]
    nothing = dict(kpos=torch.ones(ids.shape, dtype=torch.bool), ksel=torch.zeros(c, dtype=torch.bool), kval=torch.zeros(c),
                   upos=torch.ones(ids.shape, dtype=torch.bool), usel=torch.zeros(u, dtype=torch.bool), uval=torch.zeros(u))
    plain = model.net(ids=ids)  # ε on: the release's default
    full = model.net.intervention(ids=ids, use_eps=torch.tensor(True), **nothing)
    for key in plain._fields:  # the plain unknown head takes σ of the kept logits only: ≤ 1 ulp apart
        assert torch.allclose(getattr(plain, key), getattr(full, key), rtol=0, atol=1e-6), key
    plain.logits.logsumexp(-1).sum().backward()
    g_plain = {n: p.grad.clone() for n, p in model.net.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    full.logits.logsumexp(-1).sum().backward()
    g_full = {n: p.grad for n, p in model.net.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    # with ε on the LM head reads û only detached: the unknown head gets no gradient (the full
    # diagram's where() hands it zeros)
    assert g_plain.keys() <= g_full.keys() and all(n.startswith("unknown_head.") for n in g_full.keys() - g_plain.keys())
    assert all(not g_full[n].any() for n in g_full.keys() - g_plain.keys())
    for n in g_plain:
        assert torch.allclose(g_plain[n], g_full[n], rtol=1e-5, atol=1e-6), n


def test_blocked_forward_has_the_dense_gradients():
    model, _ = _tiny_large(True, False)
    ids = torch.randint(0, 29, (2, 9), generator=torch.Generator().manual_seed(1))
    grads = []
    for dense in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(ids, dense_heads=dense)
        (out.logits.logsumexp(-1).mean() + out.known_features.pow(2).mean() + out.unknown_features.pow(2).mean()).backward()
        grads.append({n: p.grad.clone() for n, p in model.net.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "unknown_head.predictor_up" in grads[0]
    for name in grads[0]:
        assert float((grads[0][name] - grads[1][name]).abs().max()) <= 1e-6, name


def test_small_heads_run_the_compiled_diagram_only():
    """Heads that fit one block (here blocks of 64 concepts) run as the compiled diagram alone."""
    fx = ref.load_fixture(FIXTURES / "mha_dense_unknown")
    model = Steerling.from_release(fx.state_dict, fx.model_config, {**fx.concept_config, "block_size": 64}, fx.vocab_size,
                                   large_concept_threshold=fx.large_concept_threshold)
    calls = []
    handle = model.net.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    try:
        with torch.no_grad():
            out = model(fx.tensors["input.input_ids"])
    finally:
        handle.remove()
    assert calls == [1] and out.unknown_weights is not None and out.known_weights is not None
