"""Build tiny random fixtures from the published `steerling` 0.2.0 release.

Each fixture is a tiny random configuration of
`steerling.models.interpretable.interpretable_causal_diffusion.InterpretableCausalDiffusionLM`,
run forward on CPU in float32 under several calls (plain, minimal output, interventions on known
and unknown concepts, residual-stream injection).  For every fixture two files are written to
`tests/fixtures/steerling/`:

    <name>.safetensors   the weights under the release's own state_dict key names (the tied
                         embedding / LM head stored once, as `transformer.tok_emb.weight`),
                         the inputs (`input.*`) and every non-None output of every run
                         (`<run>.logits`, `<run>.<InterpretableOutput field>`)
    <name>.json          model_config / concept_config (the release's field names), vocab_size,
                         the large-head threshold in force, the runs with their arguments and
                         which outputs exist or are None, parameter counts, coverage statistics

plus `release_defaults.json` (the default, i.e. Steerling-8B, configs, key shapes and parameter
counts, taken from a meta-device instance of the release).

The fixtures are read by `tests/test_steerling_reference.py`, which needs neither the release nor
Python 3.13.

Regenerate (needs the release environment described in docs/steerling-release.md):

    PYENV_VERSION=3.13.0 python3.13 -m venv /work/release-venv
    /work/release-venv/bin/pip install torch==2.8.0 safetensors 'pydantic~=2.10.0' \
        'transformers<5' 'tiktoken~=0.8.0' huggingface-hub 'pandas~=2.2.3' pyarrow
    /work/release-venv/bin/pip install --no-deps steerling==0.2.0
    /work/release-venv/bin/python tools/make_steerling_fixtures.py

The output is deterministic for a given release/torch pair (seeded generators, CPU, float32).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import fields
from pathlib import Path

import torch
from safetensors.torch import save_file

import steerling
import steerling.models.interpretable.concept_head as concept_head_module
from steerling.configs import CausalDiffusionConfig, ConceptConfig
from steerling.models.interpretable.interpretable_causal_diffusion import InterpretableCausalDiffusionLM
from steerling.models.interpretable.outputs import InterpretableOutput

OUT_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "steerling"
DEFAULT_LARGE_THRESHOLD = concept_head_module.LARGE_CONCEPT_THRESHOLD
OUTPUT_FIELDS = [f.name for f in fields(InterpretableOutput)]

# Rank-value margin demanded at every top-k cut, so that the selected set cannot depend on
# tie-breaking or on last-ulp differences between implementations.
TOPK_MARGIN = 1e-6


# ----------------------------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------------------------
# Each spec: model/concept config overrides, vocabulary, batch and length, the large-head
# threshold to patch in (None = release default 50000), init scales, and the runs to record.
# Runs: ("forward", kwargs) or ("intervene", {known, unknown, positions}); "positions" and
# "position_injection" are built from the seed below.

SPECS: list[dict] = [
    {
        # Same code paths as the released 8B model: GQA, post-norm, QK-norm, RoPE, SwiGLU, qkv
        # clip exercised, tied embedding; dense known head that is "small" (dense intervention
        # path), factorised unknown head that is "large" (no dense logits, sparse intervention).
        "name": "release_like",
        "seed": 11,
        "model": dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=32, block_size=64,
                      diff_block_size=4, intermediate_size=48, clip_qkv=3.0),
        "concept": dict(n_concepts=37, n_unknown_concepts=53, concept_dim=32, topk_known=5,
                        topk_known_features=5, factorize_rank=16, unknown_topk=7, block_size=16),
        "vocab_size": 61, "batch": 2, "length": 10,
        "large_threshold": 40,
        "scales": dict(attn=1.5, pred=1.5),
        "runs": {
            "base": ("forward", {}),
            "minimal": ("forward", {"minimal_output": True}),
            "known_intervention": ("intervene", {"known": {3: 1.0, 20: 0.0, 36: 0.5}, "positions": "partial"}),
            "unknown_intervention": ("intervene", {"unknown": {0: 1.0, 52: 0.25}, "positions": "partial"}),
            "both_intervention": ("intervene", {"known": {7: 0.9}, "unknown": {5: 0.0, 17: 1.0}}),
            "injection": ("forward", {"steering_inject_layer": 2, "steering_inject_alpha": 0.7,
                                      "position_injection": True}),
        },
    },
    {
        # Plain multi-head attention (n_kv_heads=None), dense (non-factorised) unknown head that
        # is small (dense logits returned, dense interventions), topk_known_features > topk_known
        # (features from 6 concepts, reported top-k re-ranked down to 4).
        "name": "mha_dense_unknown",
        "seed": 23,
        "model": dict(n_layers=2, n_head=2, n_kv_heads=None, n_embd=16, block_size=32,
                      diff_block_size=3, intermediate_size=40, rope_base=10000.0),
        "concept": dict(n_concepts=21, n_unknown_concepts=30, concept_dim=16, topk_known=4,
                        topk_known_features=6, factorize_unknown=False, unknown_topk=5,
                        block_size=8, pad_multiple=8),
        "vocab_size": 43, "batch": 2, "length": 8,
        "large_threshold": None,
        "scales": dict(attn=2.0, pred=1.5),
        "runs": {
            "base": ("forward", {}),
            "known_intervention": ("intervene", {"known": {0: 0.0, 13: 1.0}, "positions": "partial"}),
            "unknown_intervention": ("intervene", {"unknown": {2: 1.0, 29: 0.3}}),
            "both_intervention": ("intervene", {"known": {5: 1.0}, "unknown": {11: 0.0},
                                                "positions": "partial"}),
        },
    },
    {
        # Every non-default switch of the backbone: causal attention (diff_block_size=1),
        # pre-norm, LayerNorm everywhere incl. QK-norm (LayerNorm ignores norm_eps),
        # standard GELU(tanh) MLP, biases, no clip, untied LM head, multi-query attention,
        # unknown head without top-k (all-concept sum + attribution top-k fallback), top-k on
        # logits (dense weights keep sigmoid(0)=0.5 off the top-k).
        "name": "causal_prenorm_layernorm",
        "seed": 37,
        "model": dict(n_layers=2, n_head=4, n_kv_heads=1, n_embd=24, block_size=32,
                      diff_block_size=1, norm_order="pre", use_rms_norm=False, norm_eps=1e-3,
                      mlp_type="standard", activation="gelu", mlp_ratio=2, use_bias=True,
                      clip_qkv=None, weight_sharing=False, rope_full_precision=False),
        "concept": dict(n_concepts=19, n_unknown_concepts=26, concept_dim=24, topk_known=3,
                        topk_known_features=3, factorize_rank=16, unknown_topk=6,
                        apply_topk_to_unknown=False, topk_on_logits=True, block_size=8),
        "vocab_size": 37, "batch": 1, "length": 7,
        "large_threshold": None,
        "scales": dict(attn=1.0, pred=1.5),
        "runs": {
            "base": ("forward", {}),
            "attribution_topk": ("forward", {"unknown_topk": 4}),
            "known_intervention": ("intervene", {"known": {1: 1.0, 18: 0.2}}),
            "injection": ("forward", {"steering_inject_layer": 1, "steering_inject_alpha": -1.5,
                                      "position_injection": True}),
        },
    },
    {
        # Attention concept heads: sigmoid attention of a query projection against the concept
        # embeddings (known dense, unknown factorised), no RoPE, no QK-norm, ReLU MLP, epsilon
        # correction off (the LM head reads û + k̂ always).
        "name": "attention_heads_no_eps",
        "seed": 41,
        "model": dict(n_layers=1, n_head=2, n_kv_heads=2, n_embd=16, block_size=16,
                      diff_block_size=5, use_rope=False, use_qk_norm=False, mlp_type="standard",
                      activation="relu", intermediate_size=32),
        "concept": dict(n_concepts=17, n_unknown_concepts=40, concept_dim=16, topk_known=4,
                        topk_known_features=4, use_attention_known=True,
                        use_attention_unknown=True, factorize_rank=16, unknown_topk=6,
                        use_epsilon_correction=False, block_size=8),
        "vocab_size": 29, "batch": 2, "length": 12,
        "large_threshold": None,
        "scales": dict(attn=2.0, pred=1.5),
        "runs": {
            "base": ("forward", {}),
            "known_intervention": ("intervene", {"known": {2: 0.0, 16: 1.0}, "positions": "partial"}),
            "both_intervention": ("intervene", {"known": {4: 1.0}, "unknown": {0: 1.0, 39: 0.0}}),
        },
    },
    {
        # No unknown head; known head without top-k (sum over every concept) and a predictor
        # scale large enough that the ±15 logit clamp bites; SiLU standard MLP; GQA with a
        # sequence shorter than one diffusion block (fully bidirectional).  Pre-norm with weak
        # branch outputs keeps h accurate, since logit errors grow with the predictor scale.
        "name": "known_only_saturated",
        "seed": 53,
        "model": dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=16, block_size=16,
                      diff_block_size=8, mlp_type="standard", activation="silu",
                      intermediate_size=24, norm_eps=1e-6, norm_order="pre"),
        "concept": dict(n_concepts=23, n_unknown_concepts=None, use_unknown=False,
                        concept_dim=16, topk_known=None, topk_known_features=None,
                        block_size=16),
        "vocab_size": 31, "batch": 2, "length": 6,
        "large_threshold": None,
        "scales": dict(attn=2.0, pred=12.0, proj=0.02),
        "runs": {
            "base": ("forward", {}),
            "known_intervention": ("intervene", {"known": {0: 1.0, 22: 0.0}, "positions": "partial"}),
        },
    },
]


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def randomize(model: torch.nn.Module, scales: dict, gen: torch.Generator) -> None:
    """Overwrite every parameter with seeded values scaled so that clip/clamp/top-k matter."""
    s_attn = scales.get("attn", 1.0)
    s_pred = scales.get("pred", 1.0)
    s_proj = scales.get("proj", 1.0)  # output projections of the attention and MLP branches
    s_tok = scales.get("tok", 0.35)  # keeps LM logits around ±8, where float32 error is ~1e-6
    emb_std = 0.3
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weight is visited once
            def normal(std: float) -> torch.Tensor:
                return torch.randn(p.shape, generator=gen) * std

            if name.endswith(".bias"):
                p.copy_(normal(0.1))
            elif any(n in name for n in ("ln_1", "ln_2", "ln_f", "q_norm", "k_norm")):
                p.copy_(1.0 + normal(0.2))
            elif name.endswith("tok_emb.weight") or name.endswith("lm_head.weight"):  # lm_head: untied only
                p.copy_(normal(s_tok))
            elif "attn.c_attn" in name:
                p.copy_(normal(s_attn / math.sqrt(p.shape[1])))
            elif "concept_predictor" in name:
                p.copy_(normal(s_pred / math.sqrt(p.shape[1])))
            elif "predictor_up" in name:
                p.copy_(normal(s_pred / math.sqrt(p.shape[1])))
            elif "concept_query_projection" in name:
                p.copy_(normal(s_pred / emb_std / math.sqrt(p.shape[1])))
            elif "concept_embedding" in name:
                p.copy_(normal(emb_std))
            elif "embedding_coef" in name:
                p.copy_(normal(1.0))
            elif "embedding_basis" in name:
                p.copy_(normal(emb_std / math.sqrt(p.shape[1])))
            elif name.endswith("c_proj.weight"):
                p.copy_(normal(s_proj / math.sqrt(p.shape[1])))
            elif p.dim() == 2:  # remaining linears: mlp c_fc, predictor_down
                p.copy_(normal(1.0 / math.sqrt(p.shape[1])))
            else:
                raise RuntimeError(f"no init rule for {name}")


def head_rank_values(head, hidden: torch.Tensor, by_logits: bool) -> torch.Tensor:
    """Clamped logits (or their sigmoids) of every valid concept, as the release ranks them."""
    B, T, _ = hidden.shape
    ids = torch.arange(head.n_concepts).expand(B, T, -1)
    logits = head.compute_logits_for_indices(hidden, ids)
    return logits if by_logits else torch.sigmoid(logits)


def check_margin(values: torch.Tensor, k: int, what: str) -> float:
    """Smallest gap between the k-th and (k+1)-th ranked values; fail if under TOPK_MARGIN."""
    n = values.shape[-1]
    if k >= n:
        return float("inf")
    srt = values.sort(dim=-1, descending=True).values
    gap = float((srt[..., k - 1] - srt[..., k]).min())
    if gap <= TOPK_MARGIN:
        raise SystemExit(f"top-k boundary tie risk in {what}: k={k}, gap={gap:.3g}; change the seed")
    return gap


def topk_checks(model, hidden: torch.Tensor, spec_runs: dict, concept_cfg: ConceptConfig) -> dict:
    """Check every top-k cut that the recorded runs make is well separated."""
    gaps: dict[str, float] = {}
    kh = model.known_head
    # Known head: streaming paths rank by sigmoid unless topk_on_logits; factorised never here.
    if kh.topk is not None:
        by_logits = kh.topk_on_logits
        vals = head_rank_values(kh, hidden, by_logits)
        k_feat = kh.topk_features if kh.topk_features is not None else kh.topk
        gaps["known.features"] = check_margin(vals, min(k_feat, kh.n_concepts), "known features")
        # the dense weights (and the dense intervention path) cut at `topk`
        gaps["known.dense_cutoff"] = check_margin(vals, min(kh.topk, kh.n_concepts), "known cutoff")
        if k_feat > kh.topk:
            # re-rank inside the selected set by logits
            lg = head_rank_values(kh, hidden, True)
            sel = vals.topk(k_feat, dim=-1).indices
            gaps["known.rerank"] = check_margin(lg.gather(-1, sel), kh.topk, "known rerank")
    uh = model.unknown_head
    if uh is not None:
        apply_topk = uh.topk is not None and uh.apply_topk_to_unknown
        ks = []
        if apply_topk:
            ks.append(("unknown.features", uh.topk, True if uh.factorize else uh.topk_on_logits))
            ks.append(("unknown.dense_cutoff", uh.topk, uh.topk_on_logits))
        else:
            for run in spec_runs.values():
                k = run[1].get("unknown_topk", 64) if run[0] == "forward" else 64
                ks.append((f"unknown.attribution_k{k}", k, True if uh.factorize else False))
        for what, k, by_logits in ks:
            vals = head_rank_values(uh, hidden, by_logits)
            gaps[what] = check_margin(vals, min(k, uh.n_concepts), what)
    return gaps


def output_tensors(prefix: str, logits: torch.Tensor, out: InterpretableOutput) -> tuple[dict, list, list]:
    tensors = {f"{prefix}.logits": logits.clone()}
    present, absent = ["logits"], []
    for name in OUTPUT_FIELDS:
        value = getattr(out, name)
        if value is None:
            absent.append(name)
        else:
            tensors[f"{prefix}.{name}"] = value.detach().clone().contiguous()  # some alias
            present.append(name)
    return tensors, present, absent


def state_dict_for_saving(model, tied: bool) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    if tied:
        assert sd["transformer.lm_head.weight"].data_ptr() == sd["transformer.tok_emb.weight"].data_ptr()
        del sd["transformer.lm_head.weight"]  # the released checkpoint stores the tied tensor once
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def build(spec: dict) -> None:
    name = spec["name"]
    threshold = spec["large_threshold"] or DEFAULT_LARGE_THRESHOLD
    concept_head_module.LARGE_CONCEPT_THRESHOLD = threshold  # read by ConceptHead.__init__
    try:
        torch.manual_seed(spec["seed"])
        mcfg = CausalDiffusionConfig(**spec["model"])
        ccfg = ConceptConfig(**spec["concept"])
        V, B, T = spec["vocab_size"], spec["batch"], spec["length"]
        model = InterpretableCausalDiffusionLM(mcfg, ccfg, V).eval()
    finally:
        concept_head_module.LARGE_CONCEPT_THRESHOLD = DEFAULT_LARGE_THRESHOLD

    gen = torch.Generator().manual_seed(spec["seed"])
    randomize(model, spec["scales"], gen)
    input_ids = torch.randint(0, V, (B, T), generator=gen)
    positions = torch.rand(B, T, generator=gen) < 0.5
    positions[:, 0] = True
    positions[:, -1] = False
    injection = torch.randn(B, T, mcfg.n_embd, generator=gen)

    tensors: dict[str, torch.Tensor] = state_dict_for_saving(model, tied=mcfg.weight_sharing)
    tensors["input.input_ids"] = input_ids
    tensors["input.positions"] = positions
    tensors["input.position_injection"] = injection

    clip_hits = []

    def clip_hook(_mod, _inp, out):
        if mcfg.clip_qkv is not None:
            clip_hits.append(float((out.abs() > mcfg.clip_qkv).float().mean()))

    hooks = [b.attn.c_attn.register_forward_hook(clip_hook) for b in model.transformer.blocks]

    runs_meta: dict[str, dict] = {}
    hidden_base = None
    with torch.no_grad():
        for run_name, (call, args) in spec["runs"].items():
            if call == "forward":
                kwargs = dict(args)
                meta_kwargs = dict(args)
                if kwargs.pop("position_injection", False):
                    kwargs["position_injection"] = injection
                    meta_kwargs["position_injection"] = "input.position_injection"
                logits, out = model(input_ids, **kwargs)
            else:
                pos = positions if args.get("positions") == "partial" else None
                logits, out = model.intervene(
                    input_ids, known=args.get("known"), unknown=args.get("unknown"), positions=pos
                )
                meta_kwargs = {
                    "known": {str(k): v for k, v in (args.get("known") or {}).items()},
                    "unknown": {str(k): v for k, v in (args.get("unknown") or {}).items()},
                    "positions": "input.positions" if pos is not None else None,
                }
            if run_name == "base":
                hidden_base = out.hidden
            t, present, absent = output_tensors(run_name, logits, out)
            tensors.update(t)
            runs_meta[run_name] = {"call": call, "args": meta_kwargs, "outputs": present, "none": absent}
    for h in hooks:
        h.remove()

    with torch.no_grad():
        gaps = topk_checks(model, hidden_base, spec["runs"], ccfg)
    known_logits = tensors.get("base.known_logits")
    coverage = {
        "qkv_clipped_fraction": max(clip_hits) if clip_hits else 0.0,
        "known_logits_clamped_fraction": (
            float((known_logits.abs() >= 15).float().mean()) if known_logits is not None else None
        ),
        "topk_min_gaps": gaps,
    }

    params = list(model.parameters())
    meta = {
        "name": name,
        "generated_by": "tools/make_steerling_fixtures.py",
        "release": {"steerling": "0.2.0", "torch": torch.__version__, "python": sys.version.split()[0]},
        "model_config": mcfg.model_dump(),
        "concept_config": ccfg.model_dump(),
        "vocab_size": V,
        "large_concept_threshold": threshold,
        "batch": B,
        "length": T,
        "tied_embedding_stored_once": mcfg.weight_sharing,
        "param_count": {
            "parameters": sum(p.numel() for p in params),
            "get_num_params_non_embedding": model.get_num_params(),
            "state_dict_numel": sum(v.numel() for v in model.state_dict().values()),
        },
        "state_dict_shapes": {k: list(v.shape) for k, v in model.state_dict().items()},
        "runs": runs_meta,
        "coverage": coverage,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT_DIR / f"{name}.safetensors"))
    (OUT_DIR / f"{name}.safetensors").chmod(0o644)
    (OUT_DIR / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = (OUT_DIR / f"{name}.safetensors").stat().st_size
    print(f"{name}: {size / 1024:.1f} KiB, params={meta['param_count']['parameters']}, coverage={coverage}")


def release_defaults() -> None:
    """Record the default (Steerling-8B) configuration's key shapes and parameter counts."""
    mcfg, ccfg, V = CausalDiffusionConfig(), ConceptConfig(), 100281
    with torch.device("meta"):
        model = InterpretableCausalDiffusionLM(mcfg, ccfg, V)
    sd = model.state_dict()
    meta = {
        "generated_by": "tools/make_steerling_fixtures.py",
        "release": {"steerling": "0.2.0", "torch": torch.__version__},
        "model_config": mcfg.model_dump(),
        "concept_config": ccfg.model_dump(),
        "vocab_size": V,
        "large_concept_threshold": DEFAULT_LARGE_THRESHOLD,
        "param_count": {
            "parameters": sum(p.numel() for p in model.parameters()),
            "get_num_params_non_embedding": model.get_num_params(),
            "state_dict_numel": sum(v.numel() for v in sd.values()),
        },
        "state_dict_shapes": {k: list(v.shape) for k, v in sd.items() if not k.startswith("transformer.blocks.") or k.startswith("transformer.blocks.0.")},
        "n_blocks_in_state_dict": mcfg.n_layers,
    }
    (OUT_DIR / "release_defaults.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("release_defaults:", meta["param_count"])


def main() -> None:
    assert steerling.__file__ and torch.__version__.startswith("2.8"), "run with the release venv"
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    for spec in SPECS:
        build(spec)
    release_defaults()


if __name__ == "__main__":
    main()
