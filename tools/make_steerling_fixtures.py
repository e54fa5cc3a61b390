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

The fixtures are read by `tests/steerling/test_steerling_reference.py`, which needs neither the release nor
Python 3.13.

Regenerate (needs the release environment described in docs/steerling-release.md; outside the
repository, e.g. under /tmp; the CPU wheel index is optional, PyPI's torch 2.8.0 runs on CPU too):

    PYENV_VERSION=3.13.0 python3.13 -m venv /tmp/release-venv
    /tmp/release-venv/bin/pip install torch==2.8.0 safetensors 'pydantic~=2.10.0' \
        'transformers<5' 'tiktoken~=0.8.0' huggingface-hub 'pandas~=2.2.3' pyarrow
    /tmp/release-venv/bin/pip install --no-deps steerling==0.2.0
    HF_HUB_OFFLINE=1 /tmp/release-venv/bin/python tools/make_steerling_fixtures.py [--only steering]

The output is deterministic for a given release/torch pair (seeded generators, CPU, float32).

`--only steering` writes just the steering fixtures, `--only parity` just the forward-pass ones
above (default: both). The steering fixtures (`tests/fixtures/steerling_release/`, read by
`tests/steerling/test_steerling_steering.py`) run the release's own generator
(`SteerlingGenerator.generate_full` with `SteeringConfig`, `concept_top_tokens`,
`FaithfulConceptAttributor` and its `AttributionAccumulator` / `DiffusionTrace`) on one tiny
random model:

    tiny/config.json, tiny/model.safetensors   the model in the published layout (what
                         `Steerling.from_pretrained` and the release's `from_pretrained` read)
    steering.safetensors  prompts, per run the final sequence, the commit trace (positions,
                         token ids, denoising step, commit order), the injection alpha of every
                         step, the prepared steering (direction, base alpha, relu suppression
                         vector) and, for attributed runs, every attribution tensor (and top_k)
    steering.json        the special token ids, the runs (generation and steering configs),
                         verify() / coverage / chunk attribution numbers, concept_top_tokens,
                         and the decision margins (so that no greedy choice rests on a near-tie)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

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

    if hidden_base is None:
        raise SystemExit("the fixture spec has no 'base' forward run: the top-k checks start from its hidden state")
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


# ----------------------------------------------------------------------------------------------
# Steering fixtures: the release's generator, steering recipes and concept attribution
# ----------------------------------------------------------------------------------------------

STEERING_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "steerling_release"
STEERING_SEED = 5
STEERING_MODEL = dict(n_layers=4, n_head=4, n_kv_heads=2, n_embd=32, block_size=64, diff_block_size=4,
                      intermediate_size=48, clip_qkv=3.0, interpretable=True)
STEERING_CONCEPT = dict(n_concepts=37, n_unknown_concepts=53, concept_dim=32, topk_known=5,
                        topk_known_features=5, factorize_rank=16, unknown_topk=7, block_size=16)
# A vocabulary laid out like the release's: base ids 0..59 with "<|endoftext|>" (eos) among them,
# then pad, bos, end-of-chunk and mask (the release: 100257; 100277 ... 100280).
STEERING_VOCAB = 64
SPECIAL = {"eos": 50, "pad": 60, "bos": 61, "eoc": 62, "mask": 63}
PROMPT_LENGTHS = {"a": 5, "b": 7}
GREEDY = dict(temperature=0.0, use_entropy_sampling=False)
# Decisions must clear these margins (ours and the release's logits differ by ~1e-6).
DECISION_MARGIN = 1e-4  # confidence ranking (probability) and greedy argmax (logit)
TOPK_CUT_MARGIN = 1e-5  # every concept top-k cut of every forward pass of a generation

# name: prompt, GenerationConfig fields, steering (preset or plain SteeringConfig fields), how
# attribution is recorded ("attributor": FaithfulConceptAttributor.attribute, unsteered only;
# "callback": the attributor's own commit callback threaded through generate_full with steering).
STEERING_RUNS: dict[str, dict] = {
    "plain": dict(prompt="a", gen=dict(max_new_tokens=8, **GREEDY), attribute="attributor"),
    "plain_two_per_step": dict(prompt="b", gen=dict(max_new_tokens=8, steps=4, **GREEDY), attribute="callback"),
    "inject": dict(prompt="a", gen=dict(max_new_tokens=8, **GREEDY), attribute="callback",
                   steering=("injection", dict(concept_ids=3, mai_lm_target=8.0, inject_layer=2, cutoff_tokens=5))),
    "inject_group_every_layer": dict(prompt="b", gen=dict(max_new_tokens=8, steps=4, **GREEDY), attribute="callback",
                                     steering=("injection", dict(concept_ids=[3, 20], mai_lm_target=-6.0, inject_layer=1))),
    "unlearn": dict(prompt="a", gen=dict(max_new_tokens=8, **GREEDY), attribute="callback",
                    steering=("injection_relu", dict(concept_id=11, group_concept_ids=[25, 11], mai_lm_target=-7.0,
                                                     relu_strength=20.0))),
    "unlearn_no_repetition_penalty": dict(prompt="b", gen=dict(max_new_tokens=8, repetition_penalty=1.0, **GREEDY),
                                          steering=("injection_relu", dict(concept_id=30, mai_lm_target=-3.0,
                                                                           inject_layer=3, relu_strength=4.0))),
    "relu_mask_only": dict(prompt="b", gen=dict(max_new_tokens=8, **GREEDY),
                           steering=("config", dict(relu_logit_mask={11: 5.0, 30: 2.5}))),
    "raw_alpha_layer3": dict(prompt="a", gen=dict(max_new_tokens=8, **GREEDY),
                             steering=("config", dict(concept_ids=[7], mai_lm_target=1.5, normalize_mai_lm_target=False,
                                                      inject_layer=3))),
    "inject_layer_past_the_stack": dict(prompt="a", gen=dict(max_new_tokens=8, **GREEDY),
                                        steering=("config", dict(concept_ids=[7], mai_lm_target=4.0, inject_layer=5))),
    "inject_layer_zero_cutoff": dict(prompt="b", gen=dict(max_new_tokens=12, steps=6, **GREEDY), attribute="callback",
                                     steering=("config", dict(concept_ids=[9], mai_lm_target=3.0, inject_layer=0,
                                                              inject_alpha_schedule="hard_cutoff", cutoff_tokens=3))),
    "stop_token": dict(prompt="a", gen=dict(max_new_tokens=12, **GREEDY), stop_from="plain"),
    "cfg_inject": dict(prompt="a", gen=dict(max_new_tokens=8, cfg_scale=1.5, **GREEDY),
                       steering=("injection", dict(concept_ids=3, mai_lm_target=8.0, inject_layer=2))),
    "sampled_entropy_inject": dict(prompt="a", gen=dict(max_new_tokens=8, seed=3), sampled=True,
                                   steering=("injection", dict(concept_ids=3, mai_lm_target=8.0, inject_layer=2))),
    "sampled_temperature": dict(prompt="b", gen=dict(max_new_tokens=8, temperature=0.9, top_p=0.9,
                                                     use_entropy_sampling=False, seed=11), sampled=True),
}
TOP_TOKEN_CONCEPTS = (3, 11, 20, 36)


class TinyTokenizer:
    """The tokenizer interface SteerlingGenerator and FaithfulConceptAttributor read, for the tiny
    vocabulary (the release's tokenizer downloads its ranks). Text is ids separated by spaces."""

    vocab_size = STEERING_VOCAB
    eos_token_id = SPECIAL["eos"]
    pad_token_id = SPECIAL["pad"]
    bos_token_id = SPECIAL["bos"]
    endofchunk_token_id = SPECIAL["eoc"]
    mask_token_id = SPECIAL["mask"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def _steering_config(spec):
    from steerling.configs.steering import SteeringConfig

    if spec is None:
        return None
    kind, kw = spec
    return SteeringConfig(**kw) if kind == "config" else getattr(SteeringConfig, kind)(**kw)


class _Recorder:
    """Hooks on the release's model and generator: the injection alpha of every forward pass, and
    the smallest gap at every concept top-k cut of every position of every pass."""

    def __init__(self, generator, model):
        self.alphas: list[float] = []
        self.min_cut = {"known": math.inf, "unknown": math.inf}
        orig = generator._forward

        def forward(input_ids, injection=None, inject_layer=None, inject_alpha=1.0, return_outputs=False):
            self.alphas.append(float(inject_alpha) if injection is not None and inject_layer is not None else 0.0)
            return orig(input_ids, injection, inject_layer, inject_alpha, return_outputs)

        generator._forward = forward
        kh, uh = model.known_head, model.unknown_head

        def known_hook(_m, args, _out):
            vals = head_rank_values(kh, args[0].detach(), False)  # ranked by sigmoid
            self._cut("known", vals, kh.topk)

        def unknown_hook(_m, args, _out):
            vals = head_rank_values(uh, args[0].detach(), True)  # factorised: ranked by logit
            self._cut("unknown", vals, uh.topk)

        self.hooks = [kh.register_forward_hook(known_hook), uh.register_forward_hook(unknown_hook)]

    def _cut(self, head, vals, k):
        srt = vals.detach().sort(dim=-1, descending=True).values
        self.min_cut[head] = min(self.min_cut[head], float((srt[..., k - 1] - srt[..., k]).min()))

    def reset(self):
        self.alphas = []
        self.min_cut = {"known": math.inf, "unknown": math.inf}

    def close(self):
        for h in self.hooks:
            h.remove()


def _replay_margins(generator, trace, gen_cfg, steering, alphas, prepared) -> dict:
    """Replay every commit of a greedy generation from its trace with the release's own model and
    logit processing: check that it reproduces the commits, and return the decision margins (the
    confidence gap at each unmasking cut, the top-1 − top-2 logit gap of each greedy choice)."""
    blk = generator.diff_block_size
    mask = generator.mask_token_id
    direction = prepared["direction"]
    conf_gap, logit_gap = math.inf, math.inf
    for g in trace.groups:
        x = trace.reconstruct(g.commit_order)[None]
        alpha = alphas[g.denoising_step]
        inj = generator._position_injection(x, direction if alpha != 0.0 else None)
        logits = generator._forward(x, inj, prepared["inject_layer"], alpha)
        start = trace.prompt_len + (int(g.positions[0]) - trace.prompt_len) // blk * blk
        masked = (x[0, start:start + blk] == mask).nonzero().squeeze(1) + start
        rows = logits[0, masked].float()
        if prepared["relu"] is not None:
            rows = rows - prepared["relu"]
        if gen_cfg.repetition_penalty != 1.0:
            rep = x[0].unique()
            rep = rep[(rep >= 0) & (rep < rows.shape[-1])]
            vals = rows[:, rep]
            rows[:, rep] = torch.where(vals > 0, vals / gen_cfg.repetition_penalty, vals * gen_cfg.repetition_penalty)
        rows[:, generator.eos_token_id] = float("-inf")
        rows.index_fill_(-1, generator._banned_ids, float("-inf"))
        conf = torch.softmax(rows, -1).max(-1).values
        k = g.positions.numel()
        order = conf.argsort(descending=True)
        picked = masked[order[:k]]
        if not torch.equal(picked, g.positions) or not torch.equal(rows[order[:k]].argmax(-1), g.token_ids):
            raise SystemExit(f"replay of commit {g.commit_order} does not reproduce the release's generation")
        if k < masked.numel():
            srt = conf.sort(descending=True).values
            conf_gap = min(conf_gap, float(srt[k - 1] - srt[k]))
        top2 = rows[order[:k]].topk(2, dim=-1).values
        logit_gap = min(logit_gap, float((top2[:, 0] - top2[:, 1]).min()))
    return {"confidence": conf_gap, "greedy_logit": logit_gap}


def build_steering() -> None:
    """Write tests/fixtures/steerling_release/ (see the module docstring)."""
    from safetensors.torch import load_file

    from steerling.attribution.concept_attribution import (AttributionAccumulator, FaithfulConceptAttributor,
                                                           _compute_unknown_topk, chunk_attribution, ConceptLabels)
    from steerling.attribution.trace import CommitRecord, DiffusionTrace
    from steerling.attribution.utils import find_chunk_boundaries
    from steerling.configs.generation import GenerationConfig
    from steerling.inference.causal_diffusion import SteerlingGenerator

    torch.manual_seed(STEERING_SEED)
    mcfg = CausalDiffusionConfig(**STEERING_MODEL)
    ccfg = ConceptConfig(**STEERING_CONCEPT)
    model = InterpretableCausalDiffusionLM(mcfg, ccfg, STEERING_VOCAB).eval()
    gen = torch.Generator().manual_seed(STEERING_SEED)
    randomize(model, dict(attn=1.5, pred=1.5), gen)
    base_ids = [i for i in range(SPECIAL["pad"]) if i != SPECIAL["eos"]]
    prompts = {k: [base_ids[int(i)] for i in torch.randint(0, len(base_ids), (n,), generator=gen)]
               for k, n in PROMPT_LENGTHS.items()}

    # the model, in the published layout (the release's loader reads it back: checked below)
    tiny = STEERING_DIR / "tiny"
    tiny.mkdir(parents=True, exist_ok=True)
    save_file(state_dict_for_saving(model, tied=True), str(tiny / "model.safetensors"), metadata={"format": "pt"})
    config = {**mcfg.model_dump(), "concept": ccfg.model_dump(), "vocab_size": STEERING_VOCAB, "instruct": False,
              "architectures": ["SteerlingForCausalLM"]}
    (tiny / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    again = InterpretableCausalDiffusionLM(mcfg, ccfg, STEERING_VOCAB)
    again.load_state_dict(load_file(str(tiny / "model.safetensors")), strict=False)
    again.transformer._restore_weight_tying()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))

    tok = TinyTokenizer()
    generator = SteerlingGenerator(model, tok, mcfg, is_interpretable=True, device="cpu")
    rec = _Recorder(generator, model)
    labels_path = STEERING_DIR / "no_such_labels.parquet"  # the release falls back to "Known: #id" labels
    tensors: dict[str, torch.Tensor] = {f"prompt.{k}": torch.tensor(v) for k, v in prompts.items()}
    runs_meta: dict[str, dict] = {}
    margins_all = {"confidence": math.inf, "greedy_logit": math.inf, "known_cut": math.inf, "unknown_cut": math.inf}

    for name, run in STEERING_RUNS.items():
        rec.reset()
        gen_kw = dict(run["gen"])
        if "stop_from" in run:  # a token of the first generated block of another run: generation stops after it
            src = runs_meta[run["stop_from"]]
            gen_kw["stop_tokens"] = [src["generated"][1]]
        gen_cfg = GenerationConfig(**gen_kw)
        steering = _steering_config(run.get("steering"))
        prompt = prompts[run["prompt"]]
        prepared: dict[str, Any] = {"direction": None, "inject_layer": None, "relu": None}
        if steering is not None and steering.has_injection:
            d, a, layer = generator._prepare_steering(steering)
            prepared.update(direction=d, inject_layer=layer)
            tensors[f"{name}.direction"] = d.clone()
            prepared["base_alpha"] = a
        if steering is not None and steering.has_logit_mask:
            prepared["relu"] = generator._build_relu_mask(steering.relu_logit_mask)
            tensors[f"{name}.relu_suppression"] = prepared["relu"].clone()
        meta: dict = {"prompt": run["prompt"], "generation": gen_cfg.model_dump(),
                      "steering": None if steering is None else steering.model_dump(mode="json"),
                      "steering_recipe": None if run.get("steering") is None else run["steering"][0],
                      "steering_args": None if run.get("steering") is None else run["steering"][1],
                      "base_alpha": prepared.get("base_alpha"), "inject_layer": prepared["inject_layer"]}

        accumulator = None
        records: list = []
        how = run.get("attribute")
        if how == "attributor":
            assert steering is None
            attributor = FaithfulConceptAttributor(generator, concepts_path=labels_path)
            out, chunks = attributor.attribute(" ".join(map(str, prompt)), gen_cfg)
            attr, trace = attributor.last_attribution, attributor.last_trace
            coverage = float(attr.committed.float().mean())
            records = trace.groups
        else:
            prompt_t = torch.tensor([prompt])
            seq_len = len(prompt) + gen_cfg.max_new_tokens
            if how == "callback":  # FaithfulConceptAttributor.attribute's own commit callback, with steering
                accumulator = AttributionAccumulator(seq_len, model.known_head.topk, model.unknown_head.topk,
                                                     torch.device("cpu"), model.transformer.lm_head.weight,
                                                     model.known_head, model.unknown_head)

            def on_commit(info):
                pos, tids = info.committed_positions, info.committed_token_ids
                target = info.logits[0, pos].gather(-1, tids.unsqueeze(-1)).squeeze(-1)
                u_idx, u_lgt = _compute_unknown_topk(model.unknown_head, info.outputs.hidden[:, pos, :],
                                                     k=model.unknown_head.topk)
                r = CommitRecord(commit_order=len(records), denoising_step=info.step, positions=pos, token_ids=tids,
                                 target_logits=target, known_indices=info.outputs.known_topk_indices[0, pos],
                                 known_logits=info.outputs.known_topk_logits[0, pos],
                                 unk_indices=u_idx[0], unk_logits=u_lgt[0])
                if accumulator is not None:
                    accumulator.commit(r)
                records.append(r)

            out = generator.generate_full(prompt_t, gen_cfg, steering=steering, step_callback=on_commit)
            trace = DiffusionTrace(prompt_ids=prompt_t[0], prompt_len=len(prompt), seq_length=seq_len,
                                   mask_id=SPECIAL["mask"], eos_id=SPECIAL["eos"], device=torch.device("cpu"),
                                   groups=records)
            if accumulator is not None:
                attr, coverage = accumulator.result(), accumulator.coverage
                spans = find_chunk_boundaries(out.tokens.tolist(), eoc_id=SPECIAL["eoc"], start_index=out.prompt_tokens,
                                              stop_ids=None, include_final_chunk=True)
                labels = ConceptLabels(labels_path)
                chunks = [chunk_attribution(attr, a, b, concept_labels=labels, num_known_concepts=ccfg.n_concepts)
                          for a, b in spans]

        tensors[f"{name}.tokens"] = out.tokens.clone()
        tensors[f"{name}.alphas"] = torch.tensor(rec.alphas, dtype=torch.float64)
        meta.update(prompt_len=out.prompt_tokens, generated=out.tokens[out.prompt_tokens:].tolist(),
                    final_tokens=[int(t) for t in out.text.split()] if out.text else [],
                    generated_tokens=out.generated_tokens, forward_passes=len(rec.alphas))
        if records:
            tensors[f"{name}.trace.positions"] = torch.cat([g.positions for g in records])
            tensors[f"{name}.trace.token_ids"] = torch.cat([g.token_ids for g in records])
            tensors[f"{name}.trace.group_sizes"] = torch.tensor([g.positions.numel() for g in records])
            tensors[f"{name}.trace.denoising_steps"] = torch.tensor([g.denoising_step for g in records])
            tensors[f"{name}.trace.committed_tokens"] = trace.committed_tokens().clone()
            for o in (0, len(records) // 2, len(records) - 1):
                tensors[f"{name}.trace.reconstruct.{o}"] = trace.reconstruct(o).clone()
            meta["position_types"] = [str(t) for t in trace.position_types()]
        if accumulator is not None or how == "attributor":
            for field in ("target_token_ids", "target_logits", "known_indices", "known_weights", "known_contributions",
                          "unk_indices", "unk_weights", "unk_contributions", "epsilon_contribution", "committed"):
                tensors[f"{name}.attr.{field}"] = getattr(attr, field).clone()
            top = attr.top_k(3)
            for field in ("known_indices", "known_weights", "known_contributions", "unk_indices", "unk_weights",
                          "unk_contributions"):
                tensors[f"{name}.attr.top_k3.{field}"] = getattr(top, field).clone()
            v = attr.verify()
            meta["attribution"] = {
                "verify": {"passed": v.passed, "max_abs_error": v.max_abs_error, "error_percentiles": v.error_percentiles},
                "verify_atol_1e-9": attr.verify(atol=1e-9).passed,
                "coverage": coverage,
                "chunks": [{"entries": [dict(e) for e in entries], "eps_pct": eps} for entries, eps in chunks],
            }
        if not run.get("sampled") and records:
            m = _replay_margins(generator, trace, gen_cfg, steering, rec.alphas, prepared)
            meta["margins"] = {**m, "known_cut": rec.min_cut["known"], "unknown_cut": rec.min_cut["unknown"]}
            for k, val in meta["margins"].items():
                margins_all[k] = min(margins_all[k], val)
        else:
            meta["margins"] = {"known_cut": rec.min_cut["known"], "unknown_cut": rec.min_cut["unknown"]}
            for k in ("known_cut", "unknown_cut"):
                margins_all[k] = min(margins_all[k], meta["margins"][k])
        runs_meta[name] = meta
        print(f"{name}: {meta['generated']} alphas={[round(float(a), 3) for a in tensors[f'{name}.alphas']]} margins={meta['margins']}")
    rec.close()

    bad = [k for k, v in margins_all.items() if v <= (TOPK_CUT_MARGIN if k.endswith("cut") else DECISION_MARGIN)]
    if bad:
        raise SystemExit(f"near-tie in {bad}: {margins_all}; change STEERING_SEED")

    top_tokens: dict[str, Any] = {}
    for cid in TOP_TOKEN_CONCEPTS:
        pairs = generator.concept_top_tokens(cid, k=10)
        top_tokens[str(cid)] = {"ids": [int(t) for t, _ in pairs], "scores": [v for _, v in pairs]}
    top_tokens["default_k"] = len(generator.concept_top_tokens(3))

    meta = {
        "generated_by": "tools/make_steerling_fixtures.py --only steering",
        "release": {"steerling": "0.2.0", "torch": torch.__version__, "python": sys.version.split()[0]},
        "seed": STEERING_SEED,
        "model": "tiny (published layout: config.json, model.safetensors)",
        "special_ids": SPECIAL,
        "prompts": prompts,
        "runs": runs_meta,
        "concept_top_tokens": top_tokens,
        "margins": margins_all,
        "decision_margin": DECISION_MARGIN,
        "topk_cut_margin": TOPK_CUT_MARGIN,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(STEERING_DIR / "steering.safetensors"))
    for f in (STEERING_DIR / "steering.safetensors", tiny / "model.safetensors"):
        f.chmod(0o644)
    (STEERING_DIR / "steering.json").write_text(json.dumps(meta, indent=1) + "\n")
    total = sum(f.stat().st_size for f in STEERING_DIR.rglob("*") if f.is_file())
    print(f"steering fixtures: {total / 1024:.1f} KiB in {STEERING_DIR}; margins {margins_all}")


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["parity", "steering"], default=None,
                   help="write only the forward-pass fixtures (tests/fixtures/steerling) or only the "
                        "steering ones (tests/fixtures/steerling_release); default both")
    args = p.parse_args(argv)
    assert steerling.__file__ and torch.__version__.startswith("2.8"), "run with the release venv"
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    if args.only in (None, "parity"):
        for spec in SPECS:
            build(spec)
        release_defaults()
    if args.only in (None, "steering"):
        build_steering()


if __name__ == "__main__":
    main()
