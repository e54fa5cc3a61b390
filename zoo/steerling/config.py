"""Steerling configs: the release's fields and defaults, and what they make of the diagrams.

`diagram_sizes(model_config, concept_config, vocab_size)` checks a configuration (steerling 0.2.0
field names; `{}` = the released 8B) against what the diagrams draw and gives the dims passed to
`penrose.compile(diagram, **sizes)`; `concept_parts` picks the concept-head files a config needs
and `with_heads` swaps them into a top-level diagram. The diagram files themselves are named here.
"""

from __future__ import annotations

import math
from pathlib import Path

import penrose
from penrose.errors import PenroseCompileError

HERE = Path(__file__).resolve().parent
# One diagram per role, for both variants: the attention mask is block_causal(t, s, block=blk),
# and the causal variant is the same diagram compiled with blk = 1 (`compile_sizes`).
DIAGRAM = HERE / "steerling.pen"  # with intervention inputs
# The same model without intervention inputs (no `where`s that would change nothing): the
# module's forward, run when a forward pass has no intervention and ε is on.
PLAIN_DIAGRAM = HERE / "steerling_plain.pen"
# The same network from the token embeddings on (per-position intervention values, teacher
# forcing): `Steerling.forward_from_embeddings`.
EMBEDDING_DIAGRAM = HERE / "steerling_embeddings.pen"
# The stages around a blocked (large) concept head: ids → h, and (h, k̂, û) → ε, LM head.
HIDDEN_DIAGRAM = HERE / "steerling_hidden.pen"
READOUT_DIAGRAM = HERE / "steerling_readout.pen"
# The concept heads of concepts.pen (the released 8B); other configs swap in another file per head.
DEFAULT_HEADS = ("concepts_known.pen", "concepts_unknown.pen")
BYTE_MASK_ID = 259  # the byte tokenizer's [MASK] (penrose_zoo.steerling.tokenizer / generate)

# Field names as in steerling.configs; values are the released Steerling-8B.
MODEL_DEFAULTS: dict = {
    "model_type": "causal_diffusion", "interpretable": False,
    "n_layers": 32, "n_head": 32, "n_embd": 4096, "block_size": 4096, "n_kv_heads": 4,
    "diff_block_size": 64, "use_rms_norm": True, "norm_eps": 1e-5, "norm_order": "post",
    "use_qk_norm": True, "use_rope": True, "rope_base": 500000.0, "rope_full_precision": True,
    "mlp_type": "swiglu", "activation": "gelu", "mlp_ratio": 4, "intermediate_size": None,
    "use_bias": False, "clip_qkv": 10.0, "weight_sharing": True,
}
CONCEPT_DEFAULTS: dict = {
    "n_concepts": 33732, "n_unknown_concepts": 101196, "max_concepts": 16, "concept_dim": 4096,
    "use_attention_known": False, "use_attention_unknown": False, "topk_known": 32,
    "topk_known_features": 32, "use_unknown": True, "factorize_unknown": True,
    "factorize_rank": 256, "unknown_topk": 128, "use_epsilon_correction": True,
    "block_size": 4096, "pad_multiple": 16, "topk_on_logits": False,
    "store_unknown_weights": False, "apply_topk_to_unknown": True, "inject_layer": 16,
    "inject_alpha": 1.0,
}
RELEASE_VOCAB_SIZE = 100281  # cl100k_base (100,277) + pad, bos, end-of-chunk, mask
RELEASE_INSTRUCT_VOCAB_SIZE = 100284  # + start-header, end-header, eot (config.json "instruct")
RELEASE_MASK_ID = 100280  # the release tokenizer's <|mask|>
LARGE_CONCEPT_THRESHOLD = 50000  # the release's cut between "small" and "large" concept heads
NORM_EPS = 1e-5  # the eps written in the diagrams

# What the diagrams draw, field by field: a config value outside this raises, naming the field.
_REQUIRED = {
    "use_rms_norm": (True, "the diagrams use RMSNorm (LayerNorm is not drawn)"),
    "norm_order": ("post", "the diagrams draw post-norm residuals x + norm(f(x))"),
    "use_qk_norm": (True, "the diagrams draw QK-norm"),
    "use_rope": (True, "the diagrams draw RoPE"),
    "mlp_type": ("swiglu", "the diagrams draw a SwiGLU MLP"),
    "use_bias": (False, "the diagrams have no biases"),
    "weight_sharing": (True, "the diagrams tie the token embedding and the LM head"),
    "use_attention_known": (False, "the diagrams draw a linear known head, not an attention head"),
    "use_attention_unknown": (False, "the diagrams draw a linear unknown head, not an attention head"),
    "use_unknown": (True, "the diagrams draw an unknown head"),
    "topk_on_logits": (False, "the diagrams apply top-k to the sigmoid weights"),
    "apply_topk_to_unknown": (True, "the diagrams apply top-k to the unknown head"),
}


# ---------------------------------------------------------------------------------------------
# Configs → diagram sizes
# ---------------------------------------------------------------------------------------------


def full_configs(model_config: dict, concept_config: dict) -> tuple[dict, dict]:
    """The configs with release defaults filled in; unknown field names raise."""
    for given, defaults, what in ((model_config, MODEL_DEFAULTS, "model_config"), (concept_config, CONCEPT_DEFAULTS, "concept_config")):
        extra = sorted(set(given) - set(defaults))
        if extra:
            raise PenroseCompileError(f"{what}: unknown field(s) {', '.join(map(repr, extra))}")
    return {**MODEL_DEFAULTS, **model_config}, {**CONCEPT_DEFAULTS, **concept_config}


def _whole(value) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            and value == int(value))


def diagram_sizes(model_config: dict, concept_config: dict, vocab_size: int) -> dict[str, int]:
    """The dims of dims.pen for a release config (defaults filled in). Raises PenroseCompileError
    for anything the diagrams do not draw, naming every such config field."""
    m, c = full_configs(model_config, concept_config)
    from penrose_zoo.steerling.schema import CONCEPT_SCHEMA, MODEL_SCHEMA, PENROSE_SCHEMA, check_fields, check_memory

    check_fields("model_config", m, MODEL_SCHEMA, "", error=PenroseCompileError)  # types, ranges, finiteness
    check_fields("concept_config", c, CONCEPT_SCHEMA, "", error=PenroseCompileError)
    check_fields("Steerling", {"vocab_size": vocab_size}, PENROSE_SCHEMA, "", error=PenroseCompileError)
    if m["n_embd"] >= m["n_head"]:  # sizes that would not fit, named by field (else a zoo diagram would be named)
        paths = {k: f"model_config.{k}" for k in m} | {f"concept.{k}": f"concept_config.{k}" for k in c}
        check_memory("Steerling", m, c, vocab_size, paths, error=PenroseCompileError)
    bad: list[tuple[str, object, str]] = []
    for field, (want, why) in _REQUIRED.items():
        have = m[field] if field in m else c[field]
        if have != want:
            bad.append((field, have, why))
    if m["norm_eps"] != NORM_EPS:
        bad.append(("norm_eps", m["norm_eps"], f"the diagrams' RMSNorms use eps={NORM_EPS}"))
    if not _whole(m["clip_qkv"]):
        bad.append(("clip_qkv", m["clip_qkv"], "the diagrams clip q/k/v at ±clip, a dim (a positive whole number)"))
    if not _whole(m["rope_base"]):
        bad.append(("rope_base", m["rope_base"], "the diagrams take the RoPE base as a dim (a positive whole number)"))
    if not _whole(m["diff_block_size"]):
        bad.append(("diff_block_size", m["diff_block_size"], "the diffusion block is a dim (a positive whole number)"))
    E, H = m["n_embd"], m["n_head"]
    G = H if m["n_kv_heads"] is None else m["n_kv_heads"]
    if not (_whole(E) and _whole(H) and _whole(G)) or E % H or H % G:
        bad.append(("n_kv_heads", m["n_kv_heads"], f"n_embd ({E}) must split into n_head ({H}) heads of n_kv_heads groups"))
    elif (E // H) % 2:
        bad.append(("n_head", H, "RoPE needs an even head dim"))
    if c["concept_dim"] != E:
        bad.append(("concept_dim", c["concept_dim"], f"concept features are added to the hidden state, so concept_dim = n_embd ({E})"))
    tk, tkf, tu = c["topk_known"], c["topk_known_features"], c["unknown_topk"]
    if tk is None:
        bad.append(("topk_known", None, "the diagrams keep the top-k known concepts"))
    elif tkf is not None and tkf < tk:
        bad.append(("topk_known_features", tkf, f"the diagrams build features from at least topk_known ({tk}) concepts"))
    if tu is None:
        bad.append(("unknown_topk", None, "the diagrams keep the top-k unknown concepts"))
    if c["n_unknown_concepts"] is None and c["use_unknown"]:
        bad.append(("n_unknown_concepts", None, "the unknown head needs a size"))
    if bad:
        raise PenroseCompileError("config not supported by the steerling diagrams: " + "; ".join(
            f"field {f!r} = {v!r}: {why}" for f, v, why in bad))
    F = m["intermediate_size"] if m["intermediate_size"] is not None else m["mlp_ratio"] * E
    n, mu = c["n_concepts"], c["n_unknown_concepts"]
    sizes = {
        "e": E, "v": vocab_size, "g": G, "r": H // G, "d": E // H, "f": F, "L": m["n_layers"],
        "blk": int(m["diff_block_size"]), "clip": int(m["clip_qkv"]), "theta": int(m["rope_base"]),
        "pm": c["pad_multiple"], "c": n, "kc": min(tk, n), "kcf": min(tk if tkf is None else tkf, n),
        "u": mu, "j": c["factorize_rank"], "ku": min(tu, mu),
    }
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PenroseCompileError(f"size {name}={value!r} derived from the configs (and vocab_size) must be a positive whole number")
    return sizes


def compile_sizes(sizes: dict, causal: bool) -> dict:
    """The sizes a variant's diagrams compile with: the causal variant's attention is
    block-causal with blocks of one token (blk = 1), so it sees keys s <= t."""
    return {**sizes, "blk": 1} if causal else dict(sizes)


def concept_parts(model_config: dict, concept_config: dict, vocab_size: int) -> tuple[str, str]:
    """The files that draw the (known, unknown) heads for a config: concepts_known.pen, or
    concepts_known_wide.pen when topk_known_features > topk_known; concepts_unknown.pen
    (factorised), or concepts_unknown_dense.pen when factorize_unknown is off."""
    sizes = diagram_sizes(model_config, concept_config, vocab_size)
    _, c = full_configs(model_config, concept_config)
    known = "concepts_known_wide.pen" if sizes["kcf"] > sizes["kc"] else "concepts_known.pen"
    unknown = "concepts_unknown.pen" if c["factorize_unknown"] else "concepts_unknown_dense.pen"
    return known, unknown


def with_heads(path: Path, parts: tuple[str, str]):
    """The diagram at `path` with its concept heads drawn by `parts` (file names, see
    `concept_parts`): the same diagram, its `include "concepts.pen"` (= concepts_known.pen,
    concepts_unknown.pen, concepts_compose.pen) replaced on the IR by those files
    (penrose.replace_includes). Returns `path` itself for the release's own heads, else the
    parsed diagram (errors still name `path`)."""
    if tuple(parts) == DEFAULT_HEADS:
        return path
    return penrose.replace_includes(penrose.parse_file(path), {"concepts.pen": [*parts, "concepts_compose.pen"]})
