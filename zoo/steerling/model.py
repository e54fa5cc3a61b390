"""Steerling-8B as released (steerling 0.2.0), compiled from the diagrams in this folder.

    from penrose_zoo.steerling import Steerling
    model = Steerling.from_release(state_dict, model_config, concept_config, vocab_size)
    out = model(input_ids)                      # out.logits, out.hidden, out.known_features, ...
    out = model(input_ids, intervene_known={concept_id: value})
    with torch.device("meta"):
        big = Steerling.from_release_config({}, {}, 100281)   # {} = release defaults

The forward pass is the compiled diagram `steerling.pen` (block-causal) or `steerling_causal.pen`
(causal) — or, when nothing is intervened on and ε is on (the release's default),
`steerling[_causal]_plain.pen`, the same model without intervention inputs (`self.net`, which
holds the parameters); its sizes come from the
configs through `penrose.compile(..., **sizes)`. This wrapper
only (1) checks configs, weights and inputs, (2) picks the concept-head diagrams the config
needs (`concept_parts`: concepts_known[_wide].pen, concepts_unknown[_dense].pen), (3) turns
intervention dicts into the diagram's mask inputs and (4) reads the top-k ids off the diagram's
outputs. Interventions themselves, and the rule that switches ε off while known concepts are
intervened on, are in the diagram.

A head with more concepts than `large_concept_threshold` (the release's 50,000: the 8B unknown
head) is run as the release runs it, blocked (blocked.py: a running top-k over blocks of
`concept_config["block_size"]` concepts, never a tokens × concepts matrix, with the release's
large-head intervention rule) — unless it fits one block and its diagram draws the rule it needs,
when the diagram computes the same thing. With a blocked head the model runs as the stage
diagrams steerling[_causal]_hidden.pen (ids → h), the other head's block of the compiled diagram,
and steerling_readout.pen (ε and the LM head), all sharing `self.net`'s parameters.

Parameter names: the diagram's names map to the release's state_dict keys by `release_key`
(one table, `RELEASE_NAMES`); the tied embedding / LM head is stored once, as
`transformer.tok_emb.weight`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor

import penrose
from penrose.errors import PenroseCompileError, PenroseError, PenroseShapeError

HERE = Path(__file__).resolve().parent
DIAGRAMS = {"block_causal": HERE / "steerling.pen", "causal": HERE / "steerling_causal.pen"}
# The same models without intervention inputs (no `where`s that would change nothing): `self.net`,
# run when a forward pass has no intervention; DIAGRAMS run, tied to it, when one has.
PLAIN_DIAGRAMS = {"block_causal": HERE / "steerling_plain.pen", "causal": HERE / "steerling_causal_plain.pen"}
# The same networks from the token embeddings on (per-position intervention values, teacher
# forcing): `Steerling.forward_from_embeddings`. Parameters are shared with `self.net`.
EMBEDDING_DIAGRAMS = {"block_causal": HERE / "steerling_embeddings.pen",
                      "causal": HERE / "steerling_causal_embeddings.pen"}
# The stages around a blocked (large) concept head: ids → h, and (h, k̂, û) → ε, LM head.
HIDDEN_DIAGRAMS = {"block_causal": HERE / "steerling_hidden.pen", "causal": HERE / "steerling_causal_hidden.pen"}
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
RELEASE_VOCAB_SIZE = 100281
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
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == int(value) and value > 0


def diagram_sizes(model_config: dict, concept_config: dict, vocab_size: int) -> dict[str, int]:
    """The dims of dims.pen for a release config (defaults filled in). Raises PenroseCompileError
    for anything the diagrams do not draw, naming every such config field."""
    m, c = full_configs(model_config, concept_config)
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
    concepts_unknown.pen, concepts_compose.pen) replaced by those files. Returns `path` itself
    for the release's own heads, else the parsed diagram (errors still name `path`)."""
    if tuple(parts) == DEFAULT_HEADS:
        return path
    text = Path(path).read_text(encoding="utf-8")
    include = 'include "concepts.pen"'
    if text.count(include) != 1:
        raise PenroseCompileError(f"{path}: expected one line {include} to swap concept heads into")
    swapped = "\n".join(f'include "{name}"' for name in (*parts, "concepts_compose.pen"))
    return penrose.parse(text.replace(include, swapped), file=str(path))


# ---------------------------------------------------------------------------------------------
# Diagram parameter names ↔ release state_dict keys
# ---------------------------------------------------------------------------------------------

# (diagram name, release key); "{i}" is the layer index. Every release weight is a `.weight`.
RELEASE_NAMES: tuple[tuple[str, str], ...] = (
    ("tok_emb", "transformer.tok_emb.weight"),  # = transformer.lm_head.weight (tied)
    ("layers.{i}.ln_1", "transformer.blocks.{i}.ln_1.weight"),
    ("layers.{i}.ln_2", "transformer.blocks.{i}.ln_2.weight"),
    ("layers.{i}.attn.c_attn", "transformer.blocks.{i}.attn.c_attn.weight"),
    ("layers.{i}.attn.c_proj", "transformer.blocks.{i}.attn.c_proj.weight"),
    ("layers.{i}.attn.q_norm", "transformer.blocks.{i}.attn.q_norm.weight"),
    ("layers.{i}.attn.k_norm", "transformer.blocks.{i}.attn.k_norm.weight"),
    ("layers.{i}.mlp.c_fc", "transformer.blocks.{i}.mlp.c_fc.weight"),
    ("layers.{i}.mlp.c_proj", "transformer.blocks.{i}.mlp.c_proj.weight"),
    ("ln_f", "transformer.ln_f.weight"),
    ("known_head.concept_predictor", "known_head.concept_predictor.weight"),
    ("known_head.concept_embedding", "known_head.concept_embedding.weight"),
    ("unknown_head.predictor_down", "unknown_head.predictor_down.weight"),
    ("unknown_head.predictor_up", "unknown_head.predictor_up.weight"),
    ("unknown_head.embedding_coef", "unknown_head.embedding_coef.weight"),
    ("unknown_head.embedding_basis", "unknown_head.embedding_basis.weight"),
    # the dense (not factorised) unknown head, concepts_unknown_dense.pen
    ("unknown_head.concept_predictor", "unknown_head.concept_predictor.weight"),
    ("unknown_head.concept_embedding", "unknown_head.concept_embedding.weight"),
)
TIED_KEY = "transformer.lm_head.weight"


def release_names(n_layers: int) -> dict[str, str]:
    """{diagram parameter name: release key} for a model with n_layers layers."""
    out = {}
    for name, key in RELEASE_NAMES:
        if "{i}" in name:
            for i in range(n_layers):
                out[name.format(i=i)] = key.format(i=i)
        else:
            out[name] = key
    return out


def release_key(name: str) -> str:
    """The release key of one diagram parameter name ('layers.3.attn.c_attn' → ...)."""
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit():
        return release_names(int(parts[1]) + 1)[name]
    table = release_names(0)
    if name not in table:
        raise KeyError(f"no release key for diagram parameter {name!r}")
    return table[name]


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------


@dataclass
class SteerlingOutput:
    """Everything one forward pass yields. Shapes: (b, t, ·) for batched ids, (t, ·) otherwise.

    known_* / unknown_*: clamped logits (·, n) and weights (·, n) after top-k and interventions,
    features k̂, û (·, e). A large head (blocked) has no dense logits or weights (None).
    epsilon is None when ε is off (config, or a known-concept intervention); composed is what the
    LM head reads. The top-k ids, logits and weights (·, k) — known_topk_indices, ...,
    unknown_topk_weights — come from the blocked head, or are read off the logits on first
    access, ranked as the release ranks them (σ(logit) for dense heads, the logit for the
    factorised unknown head), in descending order, before interventions.
    """

    logits: Tensor
    hidden: Tensor
    known_features: Tensor
    unknown_features: Tensor
    epsilon: Tensor | None
    composed: Tensor
    known_logits: Tensor | None = None
    known_weights: Tensor | None = None
    unknown_logits: Tensor | None = None
    unknown_weights: Tensor | None = None
    topk_known: int = 1
    topk_unknown: int = 1
    known_intervened: bool = False
    unknown_intervened: bool = False
    known_large: bool = False
    unknown_large: bool = True
    unknown_by_sigmoid: bool = False  # a dense (not factorised) unknown head ranks by σ(logit)
    known_top: tuple[Tensor, Tensor] | None = None  # (logits, ids) from a blocked head
    unknown_top: tuple[Tensor, Tensor] | None = None
    unknown_select: Callable[[int], tuple[Tensor, Tensor]] | None = None  # k -> top-k of a blocked unknown head
    known_active: tuple[Tensor, Tensor] | None = None  # (ids, weights) a blocked head's features are built from
    unknown_active: tuple[Tensor, Tensor] | None = None

    @functools.cached_property
    def known_topk_indices(self) -> Tensor:
        if self.known_top is not None:
            return self.known_top[1]
        return torch.sigmoid(self.known_logits).topk(self.topk_known, dim=-1).indices

    @functools.cached_property
    def known_topk_logits(self) -> Tensor:
        if self.known_top is not None:
            return self.known_top[0]
        return self.known_logits.gather(-1, self.known_topk_indices)

    @functools.cached_property
    def known_topk_weights(self) -> Tensor:
        return torch.sigmoid(self.known_topk_logits)

    def _unknown_ranked(self, k: int) -> Tensor:
        if self.unknown_logits is None:  # a blocked head: ranked block by block
            return self.unknown_select(k)[1]
        rank = torch.sigmoid(self.unknown_logits) if self.unknown_by_sigmoid else self.unknown_logits
        return rank.topk(min(k, rank.shape[-1]), dim=-1).indices

    @functools.cached_property
    def unknown_topk_indices(self) -> Tensor:
        if self.unknown_top is not None:
            return self.unknown_top[1]
        return self._unknown_ranked(self.topk_unknown)

    @functools.cached_property
    def unknown_topk_logits(self) -> Tensor:
        if self.unknown_top is not None:
            return self.unknown_top[0]
        return self.unknown_logits.gather(-1, self.unknown_topk_indices)

    @functools.cached_property
    def unknown_topk_weights(self) -> Tensor:
        return torch.sigmoid(self.unknown_topk_logits)

    def as_release(self, unknown_topk: int = 64) -> dict[str, Tensor | None]:
        """The release's `InterpretableOutput` fields (None where the release gives None).
        `unknown_topk`: the release's forward argument, the size of the attribution list it
        reports when a small unknown head was intervened on (its dense path gives no top-k)."""
        kf, uf, h = self.known_features, self.unknown_features, self.hidden
        u_idx, u_log = self.unknown_topk_indices, self.unknown_topk_logits
        if self.unknown_intervened and not self.unknown_large:  # the release's attribution top-k
            if self.unknown_logits is None:
                u_log, u_idx = self.unknown_select(unknown_topk)
            else:
                u_idx = self._unknown_ranked(unknown_topk)
                u_log = self.unknown_logits.gather(-1, u_idx)
        return {
            "hidden": h,
            "known_features": kf,
            "known_logits": None if self.known_large else self.known_logits,
            "known_gt_features": None,
            "known_predicted": kf,
            "known_weights": None if self.known_large else self.known_weights,
            "known_topk_indices": None if self.known_intervened and not self.known_large else self.known_topk_indices,
            "known_topk_logits": None if self.known_intervened and not self.known_large else self.known_topk_logits,
            "unk": h - kf,
            "unk_hat": uf,
            "unk_for_lm": uf if self.epsilon is None else uf + self.epsilon,
            "unknown_logits": None if self.unknown_large else self.unknown_logits,
            "unknown_weights": None if self.unknown_large else self.unknown_weights,
            "unknown_topk_indices": u_idx,
            "unknown_topk_logits": u_log,
            "composed": self.composed,
            "epsilon": self.epsilon,
            "epsilon_true": h - (kf + uf),
        }


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _default_device() -> torch.device:
    return torch.empty(0).device  # honours a `with torch.device(...)` context


@contextlib.contextmanager
def _skip_init():
    """Make torch.nn.init's in-place initialisers no-ops (for modules built on the meta device)."""
    names = ("normal_", "zeros_", "ones_", "constant_", "uniform_", "eye_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


class Steerling(torch.nn.Module):
    """Steerling-8B from its diagrams. `self.net` is the compiled diagram steerling[_causal]_plain.pen
    (parameters under their diagram names: net.layers.0.attn.c_attn, net.known_head.concept_predictor,
    ...), run when nothing is intervened on; `intervention_net()` is steerling[_causal].pen with the
    same parameters, run when something is."""

    def __init__(self, model_config: dict | None = None, concept_config: dict | None = None,
                 vocab_size: int = RELEASE_VOCAB_SIZE, *, causal: bool = False,
                 large_concept_threshold: int = LARGE_CONCEPT_THRESHOLD, seed: int | None = None):
        super().__init__()
        model_config, concept_config = dict(model_config or {}), dict(concept_config or {})
        self.sizes = diagram_sizes(model_config, concept_config, vocab_size)
        self.model_config, self.concept_config = full_configs(model_config, concept_config)
        self.vocab_size = int(vocab_size)
        self.variant = "causal" if causal else "block_causal"
        self.large_concept_threshold = int(large_concept_threshold)
        self.concept_parts = concept_parts(model_config, concept_config, vocab_size)
        self.concept_block = int(self.concept_config["block_size"])  # concepts per block of a blocked head
        diagram = with_heads(PLAIN_DIAGRAMS[self.variant], self.concept_parts)
        if _default_device().type == "meta":
            with _skip_init():  # initialising meta tensors means nothing (and imports torch._dynamo)
                self.net = penrose.compile(diagram, **self.sizes)
        else:
            self.net = penrose.compile(diagram, seed=seed, **self.sizes)
        self._names = release_names(self.sizes["L"])
        self._none: dict = {}  # the inputs meaning "no intervention", per device
        self.mask_token_id: int | None = BYTE_MASK_ID if self.vocab_size > BYTE_MASK_ID else None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_release_config(cls, model_config: dict, concept_config: dict, vocab_size: int, **kw) -> "Steerling":
        """A randomly initialised model (seed=N for determinism); honours torch.device('meta')."""
        return cls(model_config, concept_config, vocab_size, **kw)

    @classmethod
    def from_release(cls, state_dict: dict[str, Tensor], model_config: dict, concept_config: dict,
                     vocab_size: int, **kw) -> "Steerling":
        """The model with the release's weights (state_dict under the release's key names).

        Every key, shape and dtype is checked before anything is built; the tensors are used as
        they are (no copy) when already float32."""
        sizes = diagram_sizes(model_config, concept_config, vocab_size)  # config errors first
        with torch.device("meta"):
            model = cls(model_config, concept_config, vocab_size, **kw)
        tensors = model._check_release_state_dict(state_dict, sizes)
        model.net.load_state_dict(tensors, strict=True, assign=True)
        return model

    def expected_release_shapes(self) -> dict[str, tuple[int, ...]]:
        """{release key: shape} of the weights this model stores (the tied LM head once)."""
        return {self._names[n]: tuple(p.shape) for n, p in self.net.named_parameters()}

    def _check_release_state_dict(self, state_dict, sizes) -> dict[str, Tensor]:
        if not isinstance(state_dict, dict):
            raise PenroseShapeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
        want = self.expected_release_shapes()
        given = dict(state_dict)
        tied = given.pop(TIED_KEY, None)
        missing = [k for k in want if k not in given]
        extra = [k for k in given if k not in want]
        problems = []
        if missing:
            problems.append("missing key(s): " + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
        if extra:
            problems.append("unexpected key(s): " + ", ".join(extra[:8]) + (" ..." if len(extra) > 8 else ""))
        for k, shape in want.items():
            t = given.get(k)
            if t is None:
                continue
            if not isinstance(t, Tensor):
                problems.append(f"{k} is a {type(t).__name__}, not a tensor")
            elif not t.is_floating_point():
                problems.append(f"{k} has dtype {t.dtype}; weights are floating point")
            elif tuple(t.shape) != shape:
                problems.append(f"{k} has shape {tuple(t.shape)}, expected {shape}")
        if tied is not None:
            emb = given.get("transformer.tok_emb.weight")
            if not isinstance(tied, Tensor) or (isinstance(emb, Tensor) and tuple(tied.shape) != tuple(emb.shape)):
                problems.append(f"{TIED_KEY} must be the tied token embedding (shape {want['transformer.tok_emb.weight']})")
            elif isinstance(emb, Tensor) and tied is not emb and not tied.is_meta and not torch.equal(tied, emb):
                problems.append(f"{TIED_KEY} differs from transformer.tok_emb.weight, but the model ties them (weight_sharing)")
        if problems:
            raise PenroseShapeError("release state_dict does not fit the config: " + "; ".join(problems))
        inverse = {v: k for k, v in self._names.items()}
        return {inverse[k]: given[k].detach().to(torch.float32) for k in want}

    def release_state_dict(self) -> dict[str, Tensor]:
        """The weights under the release's keys; the tied embedding once (as tok_emb)."""
        return {self._names[n]: p.detach() for n, p in self.net.named_parameters()}

    # -- checkpoints ---------------------------------------------------------------------------
    def config_dict(self) -> dict:
        changed_m = {k: v for k, v in self.model_config.items() if MODEL_DEFAULTS[k] != v}
        changed_c = {k: v for k, v in self.concept_config.items() if CONCEPT_DEFAULTS[k] != v}
        out = {"model_config": changed_m, "concept_config": changed_c, "vocab_size": self.vocab_size,
               "variant": self.variant, "large_concept_threshold": self.large_concept_threshold}
        if self.mask_token_id is not None:
            out["mask_token_id"] = int(self.mask_token_id)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write `path/model.safetensors` (release keys, tied embedding once) and
        `path/config.json` (the configs as differences from the release defaults)."""
        from safetensors.torch import save_file

        from penrose.io import atomic_write_text

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous().cpu() for k, v in self.release_state_dict().items()}
        tmp = path / "model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "penrose_zoo.steerling"})
        os.replace(tmp, path / "model.safetensors")
        atomic_write_text(path / "config.json", json.dumps(self.config_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, **kw) -> "Steerling":
        """Read a checkpoint written by `save` (or any release-layout safetensors + config.json)."""
        from safetensors.torch import load_file

        path = Path(path)
        for name in ("model.safetensors", "config.json"):
            if not (path / name).is_file():
                raise PenroseError(f"{path}: no {name}; a checkpoint is a folder with model.safetensors and config.json")
        cfg = json.loads((path / "config.json").read_text())
        opts = {"causal": cfg.get("variant") == "causal",
                "large_concept_threshold": cfg.get("large_concept_threshold", LARGE_CONCEPT_THRESHOLD), **kw}
        model = cls.from_release(load_file(str(path / "model.safetensors")), cfg.get("model_config", {}),
                                 cfg.get("concept_config", {}), cfg.get("vocab_size", RELEASE_VOCAB_SIZE), **opts)
        if "mask_token_id" in cfg:
            model.mask_token_id = int(cfg["mask_token_id"])
        return model

    # -- forward -------------------------------------------------------------------------------
    @property
    def known_large(self) -> bool:
        return self.sizes["c"] > self.large_concept_threshold

    @property
    def unknown_large(self) -> bool:
        return self.sizes["u"] > self.large_concept_threshold

    def _selection(self, spec, n: int, what: str, device) -> tuple[Tensor, Tensor]:
        if not spec:  # no intervention: constant inputs, made once per device
            key = (what, n, device)
            if key not in self._none:
                self._none[key] = (torch.zeros(n, dtype=torch.bool, device=device), torch.zeros(n, device=device))
            return self._none[key]
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        val = torch.zeros(n, dtype=torch.float32, device=device)
        if not isinstance(spec, dict):
            raise PenroseShapeError(f"intervene_{what} must be a dict {{concept id: weight}}, got {type(spec).__name__}")
        ids, vals = [], []
        for cid, value in spec.items():
            if isinstance(cid, bool) or not isinstance(cid, int) and not (isinstance(cid, Tensor) and cid.numel() == 1):
                raise PenroseShapeError(f"intervene_{what}: concept id {cid!r} is not an integer")
            cid = int(cid)
            if not 0 <= cid < n:
                raise PenroseShapeError(f"intervene_{what}: concept id {cid} is out of range; the {what} head has {n} concepts (0..{n - 1})")
            value = float(value)
            if not math.isfinite(value):
                raise PenroseShapeError(f"intervene_{what}: the weight for concept {cid} is {value}, not a finite number")
            ids.append(cid)
            vals.append(value)
        idx = torch.tensor(ids, dtype=torch.long, device=device)
        sel[idx] = True
        val[idx] = torch.tensor(vals, dtype=torch.float32, device=device)
        return sel, val

    def check_input_ids(self, input_ids) -> None:
        if not isinstance(input_ids, Tensor):
            raise PenroseShapeError(f"input_ids must be a tensor of token ids, got {type(input_ids).__name__}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise PenroseShapeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
        if input_ids.dim() not in (1, 2):
            raise PenroseShapeError(f"input_ids must be (t,) or (b, t), got shape {tuple(input_ids.shape)}")
        T = input_ids.shape[-1]
        if T == 0:
            raise PenroseShapeError("input_ids is empty: the sequence needs at least one token")
        if T > self.model_config["block_size"]:
            raise PenroseShapeError(f"input_ids has {T} tokens, longer than the context (block_size = {self.model_config['block_size']})")
        if not input_ids.is_meta and input_ids.numel():
            lo, hi = (int(x) for x in torch.aminmax(input_ids))
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise PenroseShapeError(f"input_ids: token id {bad} is out of range for vocab_size {self.vocab_size} (0..{self.vocab_size - 1})")

    @property
    def unknown_factorised(self) -> bool:
        return bool(self.concept_config["factorize_unknown"])

    def _draws_large_rule(self, head: str) -> bool:
        """Whether the head's diagram draws the release's large-head (sparse) intervention rule:
        only the factorised unknown head (concepts_unknown.pen) does."""
        return head == "unknown" and self.unknown_factorised

    def _head(self, head: str) -> tuple[bool, int]:
        """(large, number of concepts) of the 'known' or 'unknown' head."""
        return (self.known_large, self.sizes["c"]) if head == "known" else (self.unknown_large, self.sizes["u"])

    def _blocked(self, head: str, intervened: bool, dense_heads: bool) -> bool:
        """Whether `forward` runs this head blocked (blocked.py), with the release's rules for its
        size class: every head wider than one block (concept_block, the release's block_size) —
        both 8B heads, so no tokens × concepts matrix is ever made — and a head that is intervened
        on while its diagram draws the other size class's intervention rule. A head that fits one
        block otherwise runs through its diagram: one block is that whole matrix anyway.
        `dense_heads`: every head through its diagram."""
        if dense_heads:
            return False
        large, n = self._head(head)
        return n > self.concept_block or (intervened and self._draws_large_rule(head) != large)

    def _rule_check(self, known: bool, unknown: bool, known_blocked: bool, unknown_blocked: bool) -> None:
        """Interventions follow the release's rule for the head's size class: small heads the dense
        rule (override), large heads the sparse one (add value − σ(logit)). A blocked head applies
        its class's rule; a head computed by its diagram applies the rule the diagram draws
        (known head: dense; factorised unknown head: sparse; dense unknown head: dense)."""
        lim = self.large_concept_threshold
        for head, on, blocked in (("known", known, known_blocked), ("unknown", unknown, unknown_blocked)):
            large, n = self._head(head)
            if not on or blocked or self._draws_large_rule(head) == large:
                continue
            field = "n_concepts" if head == "known" else "n_unknown_concepts"
            drawn = {"known": "the known head's diagram", "unknown": "concepts_unknown_dense.pen" if large else "concepts_unknown.pen"}[head]
            raise PenroseCompileError(
                f"{head}-concept interventions on a {'large' if large else 'small'} {head} head ({field} = {n} "
                f"{'>' if large else '<='} large_concept_threshold = {lim}) follow the release's {'sparse' if large else 'dense'} "
                f"rule, which {drawn} does not draw; `forward` runs such a head blocked (dense_heads=False)")

    def forward(self, input_ids: Tensor, intervene_known: dict | None = None,
                intervene_unknown: dict | None = None, positions: Tensor | None = None, *,
                dense_heads: bool = False) -> SteerlingOutput:
        """One forward pass. `intervene_known` / `intervene_unknown`: {concept id: weight},
        applied at `positions` (bool, shaped like input_ids; default: every position).

        Large heads (more concepts than large_concept_threshold) run blocked (blocked.py) as the
        release runs them, unless `dense_heads`: then the whole compiled diagram runs, every head
        dense (a tokens × concepts matrix per head)."""
        self.check_input_ids(input_ids)
        args = self._concept_inputs(input_ids.shape, input_ids.device, intervene_known, intervene_unknown, positions, dense_heads)
        if args["known_blocked"] or args["unknown_blocked"]:
            return self._from_hidden(self._stage("hidden")(ids=input_ids), **args)
        if not (args["known_on"] or args["unknown_on"]) and self.concept_config["use_epsilon_correction"]:
            o = self.net(ids=input_ids)
        else:
            pos, ksel, kval, usel, uval = (args[k] for k in ("pos", "ksel", "kval", "usel", "uval"))
            o = self.intervention_net()(ids=input_ids, kpos=pos, ksel=ksel, kval=kval, upos=pos, usel=usel, uval=uval,
                                        use_eps=args["use_eps"])
        return self._output(o.logits, o.h, o.eps, o.z, args["known_on"], args["unknown_on"],
                            known_logits=o.kl, known_weights=o.kw, known_features=o.kf,
                            unknown_logits=o.ul, unknown_weights=o.uw, unknown_features=o.uf)

    def concepts_from_hidden(self, h: Tensor, intervene_known: dict | None = None,
                             intervene_unknown: dict | None = None, positions: Tensor | None = None, *,
                             dense_heads: bool = False) -> SteerlingOutput:
        """Everything `forward` computes after the hidden state h (b, t, e) or (t, e): the two
        concept heads (a large one blocked, as in forward), ε and the LM head. With
        `dense_heads`, both heads run their diagrams (what the compiled steerling.pen does)."""
        if not isinstance(h, Tensor) or not h.is_floating_point() or h.dim() not in (2, 3) or h.shape[-1] != self.sizes["e"]:
            raise PenroseShapeError(f"h must be float (t, {self.sizes['e']}) or (b, t, {self.sizes['e']}), got "
                                    f"{tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__}")
        args = self._concept_inputs(h.shape[:-1], h.device, intervene_known, intervene_unknown, positions, dense_heads)
        return self._from_hidden(h, **args)

    def _concept_inputs(self, shape, device, intervene_known, intervene_unknown, positions, dense_heads) -> dict:
        """The diagram's intervention inputs, ε switch and which heads run blocked."""
        shape = tuple(shape)
        known_on, unknown_on = bool(intervene_known), bool(intervene_unknown)
        kb, ub = self._blocked("known", known_on, dense_heads), self._blocked("unknown", unknown_on, dense_heads)
        self._rule_check(known_on, unknown_on, kb, ub)
        ksel, kval = self._selection(intervene_known, self.sizes["c"], "known", device)
        usel, uval = self._selection(intervene_unknown, self.sizes["u"], "unknown", device)
        if positions is None:
            key = ("everywhere", shape, device)
            if key not in self._none:
                self._none[key] = torch.ones(shape, dtype=torch.bool, device=device)
            pos = self._none[key]
        else:
            if not isinstance(positions, Tensor) or positions.dtype != torch.bool or tuple(positions.shape) != shape:
                raise PenroseShapeError(f"positions must be a bool tensor shaped like input_ids {shape}")
            pos = positions.to(device)
        key = ("use_eps", device)
        if key not in self._none:
            self._none[key] = torch.tensor(bool(self.concept_config["use_epsilon_correction"]), device=device)
        return {"pos": pos, "ksel": ksel, "kval": kval, "usel": usel, "uval": uval, "use_eps": self._none[key],
                "known_on": known_on, "unknown_on": unknown_on, "known_blocked": kb, "unknown_blocked": ub}

    def _from_hidden(self, h, *, pos, ksel, kval, usel, uval, use_eps, known_on, unknown_on, known_blocked,
                     unknown_blocked) -> SteerlingOutput:
        heads = self._concepts(h, pos, ksel, kval, usel, uval, known_on, unknown_on, known_blocked, unknown_blocked)
        logits, z, eps = self._stage("readout")(h=h, kf=heads["known_features"], uf=heads["unknown_features"], ksel=ksel,
                                                use_eps=use_eps)
        return self._output(logits, h, eps, z, known_on, unknown_on, **heads)

    def _output(self, logits, h, eps, z, known_on, unknown_on, **heads) -> SteerlingOutput:
        eps_on = bool(self.concept_config["use_epsilon_correction"]) and not known_on
        return SteerlingOutput(
            logits=logits, hidden=h, epsilon=eps if eps_on else None, composed=z,
            topk_known=self.sizes["kc"], topk_unknown=self.sizes["ku"],
            known_intervened=known_on, unknown_intervened=unknown_on,
            known_large=self.known_large, unknown_large=self.unknown_large,
            unknown_by_sigmoid=not self.unknown_factorised, **heads,
        )

    def _concepts(self, h: Tensor, pos: Tensor, ksel: Tensor, kval: Tensor, usel: Tensor, uval: Tensor,
                  known_on: bool, unknown_on: bool, known_blocked: bool, unknown_blocked: bool) -> dict:
        """Both concept heads on the hidden state h: a blocked head by blocked.large_head (the
        release's rules for its size class), the other by its block of the compiled diagram
        (intervention_net().known_head / unknown_head). Returns SteerlingOutput's head fields:
        dense logits and weights (a diagram's), features, and for a blocked head its reported
        top-k (logits, ids), the (ids, weights) its features are built from, and (unknown head)
        a function k -> its top-k (logits, ids)."""
        from penrose_zoo.steerling.blocked import large_head, select_topk

        sz, blk = self.sizes, self.concept_block
        net = self.intervention_net()
        kh, uh = net.known_head, net.unknown_head
        out = {}
        if known_blocked:  # ranked by σ(logit): a dense head
            kf, k_log, k_idx, active = large_head(
                h, kh.concept_predictor[:sz["c"]], kh.concept_embedding[:sz["c"]], sz["kcf"], sz["kc"], block=blk,
                by_sigmoid=True, shift=(pos, ksel, kval) if known_on else None, small_rule=not self.known_large)
            out.update(known_features=kf, known_top=(k_log, k_idx), known_active=active)
        else:
            out.update(zip(("known_logits", "known_weights", "known_features"), kh(h, pos, ksel, kval)))
        hd = h.detach()  # the unknown head reads h.detach() (steerling.pen, step 5)
        if unknown_blocked:
            shift = (pos, usel, uval) if unknown_on else None
            small = not self.unknown_large
            if self.unknown_factorised:  # through the rank space, ranked by logit (concepts_unknown.pen)
                x, pred, by_sigmoid = hd @ uh.predictor_down.mT, uh.predictor_up[:sz["u"]], False
                r, u_log, u_idx, active = large_head(x, pred, uh.embedding_coef[:sz["u"]], sz["ku"], sz["ku"], block=blk,
                                                     shift=shift, small_rule=small)
                uf = r @ uh.embedding_basis.mT
            else:  # dense, ranked by σ(logit) (concepts_unknown_dense.pen)
                x, pred, by_sigmoid = hd, uh.concept_predictor[:sz["u"]], True
                uf, u_log, u_idx, active = large_head(x, pred, uh.concept_embedding[:sz["u"]], sz["ku"], sz["ku"],
                                                      block=blk, by_sigmoid=True, shift=shift, small_rule=small)
            out.update(unknown_features=uf, unknown_top=(u_log, u_idx), unknown_active=active,
                       unknown_select=functools.partial(select_topk, x, pred, block=blk, by_sigmoid=by_sigmoid))
        else:
            out.update(zip(("unknown_logits", "unknown_weights", "unknown_features"), uh(hd, pos, usel, uval)))
        return out

    def intervention_net(self):
        """The compiled steerling[_causal].pen (with this config's head files), its parameters
        self.net's: the model with intervention inputs."""
        return self._tied("_full_net", with_heads(DIAGRAMS[self.variant], self.concept_parts))

    def _stage(self, kind: str):
        """The compiled stage diagram `kind` ('hidden': steerling[_causal]_hidden.pen, 'readout':
        steerling_readout.pen), its parameters tied to self.net's."""
        path = HIDDEN_DIAGRAMS[self.variant] if kind == "hidden" else READOUT_DIAGRAM
        return self._tied(f"_{kind}_net", path)

    def _tied(self, attr: str, diagram):
        """A compiled diagram whose parameters are self.net's, by name (re-tied on every call, so
        load_state_dict(assign=True) and .to() are followed); not a submodule (no second copy in
        state_dict)."""
        entry = self.__dict__.get(attr)
        if entry is None:
            with torch.device("meta"), _skip_init():
                net = penrose.compile(diagram, **self.sizes)
            entry = self.__dict__[attr] = (net, [name for name, _ in net.named_parameters()])
        net, names = entry
        for name in names:
            owner, _, leaf = name.rpartition(".")
            mod = net.get_submodule(owner) if owner else net
            p = self.net.get_parameter(name)
            if mod._parameters.get(leaf) is not p:
                mod._parameters[leaf] = p
        net.train(self.training)
        return net

    # -- the ConceptLM protocol (penrose_zoo.steerling.attribution) -----------------------------------
    def embed(self, input_ids: Tensor) -> Tensor:
        """Token embeddings (rows of the tied table), the backbone's input: (..., t) -> (..., t, e)."""
        self.check_input_ids(input_ids)
        return self.net.tok_emb[input_ids]

    def lm_head_weight(self) -> Tensor:
        """The LM head (v, e): the token embedding table (tied); logits = composed · Wᵀ."""
        return self.net.tok_emb

    def concept_embeddings(self, kind: str, ids: Tensor | None = None) -> Tensor:
        """Rows of the concept tables: known K (n, e); unknown U = coef · basisᵀ (m, e) (a dense
        unknown head: its own table), built only for `ids` (any shape) when given."""
        if kind == "known":
            K = self.net.known_head.concept_embedding[: self.sizes["c"]]
            return K if ids is None else K[ids]
        if kind == "unknown":
            uh = self.net.unknown_head
            if not self.unknown_factorised:  # concepts_unknown_dense.pen: one embedding per concept
                U = uh.concept_embedding[: self.sizes["u"]]
                return U if ids is None else U[ids]
            C = uh.embedding_coef[: self.sizes["u"]]
            return (C if ids is None else C[ids]) @ uh.embedding_basis.T
        raise ValueError(f"kind must be 'known' or 'unknown', got {kind!r}")

    def _embedding_net(self):
        """The compiled embeddings diagram (with this config's head files: their `*_head_at`
        blocks), its parameters tied to self.net's."""
        return self._tied("_emb_net", with_heads(EMBEDDING_DIAGRAMS[self.variant], self.concept_parts))

    def _positional(self, spec, n: int, what: str, shape, device) -> tuple[Tensor, Tensor]:
        """(chosen (n,) bool, values (*shape, n)) from {id: float | (*shape) tensor}."""
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        val = torch.zeros(*shape, n, dtype=torch.float32, device=device)
        if not spec:
            return sel, val
        if not isinstance(spec, dict):
            raise PenroseShapeError(f"intervene_{what} must be a dict {{concept id: weight}}, got {type(spec).__name__}")
        for cid, value in spec.items():
            if isinstance(cid, bool) or not isinstance(cid, int) and not (isinstance(cid, Tensor) and cid.numel() == 1):
                raise PenroseShapeError(f"intervene_{what}: concept id {cid!r} is not an integer")
            cid = int(cid)
            if not 0 <= cid < n:
                raise PenroseShapeError(f"intervene_{what}: concept id {cid} is out of range; the {what} head has {n} concepts (0..{n - 1})")
            if isinstance(value, Tensor) and value.numel() != 1:
                if tuple(value.shape) != tuple(shape):
                    raise PenroseShapeError(f"intervene_{what}: values for concept {cid} have shape {tuple(value.shape)}, expected {tuple(shape)} (the tokens)")
                v = value.detach().to(device=device, dtype=torch.float32)
                if not torch.isfinite(v).all():
                    raise PenroseShapeError(f"intervene_{what}: the weights for concept {cid} are not all finite")
                val[..., cid] = v
            else:
                v = float(value)
                if not math.isfinite(v):
                    raise PenroseShapeError(f"intervene_{what}: the weight for concept {cid} is {v}, not a finite number")
                val[..., cid] = v
            sel[cid] = True
        return sel, val

    def forward_from_embeddings(self, x: Tensor, intervene_known: dict | None = None,
                                intervene_unknown: dict | None = None, positions: Tensor | None = None,
                                known_gt_features: Tensor | None = None,
                                teacher_forcing: float = 1.0) -> SteerlingOutput:
        """The forward pass from token embeddings x (b, t, e) or (t, e), differentiable in x
        (the diagram steerling[_causal]_embeddings.pen). Interventions as in `forward`, but a
        value may also be a per-position tensor shaped like the tokens. known_gt_features
        (b, t, e): the LM head reads teacher_forcing · k̂_gt + (1 − teacher_forcing) · k̂ (this
        matters only with ε off: with ε on the head reads h whatever k̂ is)."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() not in (2, 3) or x.shape[-1] != self.sizes["e"]:
            raise PenroseShapeError(f"x must be float embeddings (t, {self.sizes['e']}) or (b, t, {self.sizes['e']}), got "
                                    f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        shape, device = tuple(x.shape[:-1]), x.device
        if shape[-1] > self.model_config["block_size"]:
            raise PenroseShapeError(f"x has {shape[-1]} tokens, longer than the context (block_size = {self.model_config['block_size']})")
        self._rule_check(bool(intervene_known), bool(intervene_unknown), False, False)  # every head dense here
        ksel, kval = self._positional(intervene_known, self.sizes["c"], "known", shape, device)
        usel, uval = self._positional(intervene_unknown, self.sizes["u"], "unknown", shape, device)
        if positions is None:
            pos = torch.ones(shape, dtype=torch.bool, device=device)
        else:
            if not isinstance(positions, Tensor) or positions.dtype != torch.bool or tuple(positions.shape) != shape:
                raise PenroseShapeError(f"positions must be a bool tensor shaped like the tokens {shape}")
            pos = positions.to(device)
        if known_gt_features is None:
            kgt, tf = torch.zeros(*shape, self.sizes["e"], device=device, dtype=x.dtype), 0.0
        else:
            if tuple(known_gt_features.shape) != tuple(x.shape):
                raise PenroseShapeError(f"known_gt_features has shape {tuple(known_gt_features.shape)}, expected {tuple(x.shape)}")
            kgt, tf = known_gt_features.to(device=device, dtype=x.dtype), float(teacher_forcing)
        use_eps = torch.tensor(bool(self.concept_config["use_epsilon_correction"]), device=device)
        o = self._embedding_net()(x=x, kpos=pos, ksel=ksel, kval=kval, upos=pos, usel=usel, uval=uval,
                                  use_eps=use_eps, kgt=kgt, tf=torch.tensor(tf, device=device, dtype=x.dtype))
        known_on = bool(intervene_known)
        eps_on = bool(self.concept_config["use_epsilon_correction"]) and not known_on
        return SteerlingOutput(
            logits=o.logits, hidden=o.h,
            known_logits=o.kl, known_weights=o.kw, known_features=o.kf,
            unknown_logits=o.ul, unknown_weights=o.uw, unknown_features=o.uf,
            epsilon=o.eps if eps_on else None, composed=o.z,
            topk_known=self.sizes["kc"], topk_unknown=self.sizes["ku"],
            known_intervened=known_on, unknown_intervened=bool(intervene_unknown),
            known_large=self.known_large, unknown_large=self.unknown_large,
        )

    def num_parameters(self) -> int:
        """Distinct parameters (the tied embedding once)."""
        return sum(p.numel() for p in self.net.parameters())


OUTPUT_FIELDS = tuple(f.name for f in fields(SteerlingOutput)) + tuple(
    f"{head}_topk_{what}" for head in ("known", "unknown") for what in ("indices", "logits", "weights"))
