"""Independent reference for the forward pass of the published `steerling` 0.2.0 release.

Written from the math in docs/steerling-release.md (torch only; safetensors only to load the
fixtures), not from the release's code: every concept head computes the full logit matrix and
selects from it, where the release streams blocks of concepts.  It loads the release's own
state_dict keys and reproduces every field of the release's `InterpretableOutput`, so that the
fixtures written by tools/make_steerling_fixtures.py can be checked on Python 3.11 without the
release installed.

Index legend (the same letters in every comment and einsum below):
    b batch            t query position      s key position
    e embedding (n_embd = concept_dim)       v vocabulary
    h query head       g key/value head      d head dim
    f MLP hidden       k known concept       u unknown concept
    r factorisation rank                     j top-k slot / intervention slot

Public entry points:
    release_forward(state_dict, model_config, concept_config, vocab_size, input_ids, ...)
    release_intervene(..., known={id: value}, unknown={id: value}, positions=mask)
    release_param_count(model_config, concept_config, vocab_size)
    release_state_dict_shapes(model_config, concept_config, vocab_size)
    load_fixture(path)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

# ---------------------------------------------------------------------------------------------
# Configuration defaults (field names as in steerling.configs; values are the released 8B model)
# ---------------------------------------------------------------------------------------------

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
LARGE_CONCEPT_THRESHOLD = 50000  # heads with more concepts never build dense (b, t, c) tensors
LOGIT_CLAMP = 15.0
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm default; the release does not pass norm_eps to it

OUTPUT_FIELDS = (
    "hidden", "known_features", "known_logits", "known_gt_features", "known_predicted",
    "known_weights", "known_topk_indices", "known_topk_logits", "unk", "unk_hat", "unk_for_lm",
    "unknown_logits", "unknown_weights", "unknown_topk_indices", "unknown_topk_logits",
    "composed", "epsilon", "epsilon_true",
)


def _full(model_config: dict, concept_config: dict) -> tuple[dict, dict]:
    unknown_m = set(model_config) - set(MODEL_DEFAULTS)
    unknown_c = set(concept_config) - set(CONCEPT_DEFAULTS)
    if unknown_m or unknown_c:
        raise ValueError(f"unknown config fields: {sorted(unknown_m | unknown_c)}")
    return {**MODEL_DEFAULTS, **model_config}, {**CONCEPT_DEFAULTS, **concept_config}


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---------------------------------------------------------------------------------------------
# Parameter shapes and count
# ---------------------------------------------------------------------------------------------


def release_state_dict_shapes(model_config: dict, concept_config: dict, vocab_size: int) -> dict[str, tuple]:
    """Every key of the release model's state_dict with its shape (the tied LM head included).

    >>> s = release_state_dict_shapes({}, {}, RELEASE_VOCAB_SIZE)
    >>> s["transformer.blocks.0.attn.c_attn.weight"], s["known_head.concept_predictor.weight"]
    ((5120, 4096), (33744, 4096))
    """
    m, c = _full(model_config, concept_config)
    E, H, L, V = m["n_embd"], m["n_head"], m["n_layers"], vocab_size
    G = H if m["n_kv_heads"] is None else m["n_kv_heads"]
    D = E // H
    F = m["intermediate_size"] if m["intermediate_size"] is not None else m["mlp_ratio"] * E
    bias = m["use_bias"]

    def norm(prefix: str, size: int) -> dict:
        out = {f"{prefix}.weight": (size,)}
        if not m["use_rms_norm"]:
            out[f"{prefix}.bias"] = (size,)
        return out

    def linear(prefix: str, n_in: int, n_out: int, with_bias: bool) -> dict:
        out = {f"{prefix}.weight": (n_out, n_in)}
        if with_bias:
            out[f"{prefix}.bias"] = (n_out,)
        return out

    shapes: dict[str, tuple] = {"transformer.tok_emb.weight": (V, E)}
    for i in range(L):
        p = f"transformer.blocks.{i}"
        shapes.update(norm(f"{p}.ln_1", E))
        shapes.update(norm(f"{p}.ln_2", E))
        shapes.update(linear(f"{p}.attn.c_attn", E, E + 2 * G * D, bias))  # rows [q | k | v]
        shapes.update(linear(f"{p}.attn.c_proj", E, E, bias))
        if m["use_qk_norm"]:
            shapes.update(norm(f"{p}.attn.q_norm", D))
            shapes.update(norm(f"{p}.attn.k_norm", D))
        f_out = 2 * F if m["mlp_type"] == "swiglu" else F  # swiglu rows [up | gate]
        shapes.update(linear(f"{p}.mlp.c_fc", E, f_out, bias))
        shapes.update(linear(f"{p}.mlp.c_proj", F, E, bias))
    shapes.update(norm("transformer.ln_f", E))
    shapes["transformer.lm_head.weight"] = (V, E)

    Cd, pm = c["concept_dim"], c["pad_multiple"]
    kp = _padded(c["n_concepts"], pm)
    shapes["known_head.concept_embedding.weight"] = (kp, Cd)
    if c["use_attention_known"]:
        shapes["known_head.concept_query_projection.weight"] = (Cd, E)
    else:
        shapes["known_head.concept_predictor.weight"] = (kp, E)
    if c["use_unknown"]:
        up, r = _padded(c["n_unknown_concepts"], pm), c["factorize_rank"]
        if c["factorize_unknown"]:
            shapes["unknown_head.embedding_coef.weight"] = (up, r)
            shapes["unknown_head.embedding_basis.weight"] = (Cd, r)
            if c["use_attention_unknown"]:
                shapes["unknown_head.concept_query_projection.weight"] = (Cd, E)
            else:
                shapes["unknown_head.predictor_down.weight"] = (r, E)
                shapes["unknown_head.predictor_up.weight"] = (up, r)
        else:
            shapes["unknown_head.concept_embedding.weight"] = (up, Cd)
            if c["use_attention_unknown"]:
                shapes["unknown_head.concept_query_projection.weight"] = (Cd, E)
            else:
                shapes["unknown_head.concept_predictor.weight"] = (up, E)
    return shapes


def release_param_count(model_config: dict, concept_config: dict, vocab_size: int) -> int:
    """Number of distinct parameters of the release model (the tied embedding counted once).

    With E = n_embd, H = n_head, G = n_kv_heads (or H), D = E/H, F = intermediate_size (or
    mlp_ratio·E), V = vocab_size, L = n_layers, N(x) = x for RMSNorm and 2x for LayerNorm,
    pad(n) = n rounded up to a multiple of pad_multiple, Cd = concept_dim, r = factorize_rank:

        embedding        V·E · (1 if weight_sharing else 2)
        per layer        E·(E + 2GD) + E·E                    attention in/out
                         + 2·N(D) if use_qk_norm
                         + E·2F + F·E (swiglu) | E·F + F·E    MLP
                         + 2·N(E)                              ln_1, ln_2
                         + use_bias · [(E + 2GD) + E + (2F | F) + E]
        final norm       N(E)
        known head       pad(n)·Cd + (E·Cd if use_attention_known else pad(n)·E)
        unknown head     factorised: pad(m)·r + r·Cd + (E·Cd if attention else E·r + r·pad(m))
                         dense:      pad(m)·Cd + (E·Cd if attention else pad(m)·E)

    >>> release_param_count({}, {}, RELEASE_VOCAB_SIZE)
    8391778304
    """
    m, c = _full(model_config, concept_config)
    E, H, L, V = m["n_embd"], m["n_head"], m["n_layers"], vocab_size
    G = H if m["n_kv_heads"] is None else m["n_kv_heads"]
    D = E // H
    F = m["intermediate_size"] if m["intermediate_size"] is not None else m["mlp_ratio"] * E
    N = (lambda x: x) if m["use_rms_norm"] else (lambda x: 2 * x)
    F_in = 2 * F if m["mlp_type"] == "swiglu" else F

    per_layer = E * (E + 2 * G * D) + E * E + E * F_in + F * E + 2 * N(E)
    if m["use_qk_norm"]:
        per_layer += 2 * N(D)
    if m["use_bias"]:
        per_layer += (E + 2 * G * D) + E + F_in + E
    total = V * E * (1 if m["weight_sharing"] else 2) + L * per_layer + N(E)

    Cd, pm, r = c["concept_dim"], c["pad_multiple"], c["factorize_rank"]
    kp = _padded(c["n_concepts"], pm)
    total += kp * Cd + (E * Cd if c["use_attention_known"] else kp * E)
    if c["use_unknown"]:
        up = _padded(c["n_unknown_concepts"], pm)
        if c["factorize_unknown"]:
            total += up * r + r * Cd + (E * Cd if c["use_attention_unknown"] else E * r + r * up)
        else:
            total += up * Cd + (E * Cd if c["use_attention_unknown"] else up * E)
    return total


# ---------------------------------------------------------------------------------------------
# Backbone
# ---------------------------------------------------------------------------------------------


def _norm(sd: dict, prefix: str, m: dict, x: Tensor) -> Tensor:
    """RMSNorm (float32, eps = norm_eps, cast back) or LayerNorm (eps 1e-5, with bias)."""
    w = sd[f"{prefix}.weight"]
    if m["use_rms_norm"]:
        xf = x.float()
        ms = (xf * xf).mean(dim=-1, keepdim=True)
        return (w * (xf / torch.sqrt(ms + m["norm_eps"]))).to(x.dtype)
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + LAYER_NORM_EPS) * w + sd[f"{prefix}.bias"]


def _linear(sd: dict, prefix: str, x: Tensor) -> Tensor:
    y = torch.einsum("...i,oi->...o", x, sd[f"{prefix}.weight"])
    b = sd.get(f"{prefix}.bias")
    return y if b is None else y + b


def _rope(x: Tensor, base: float) -> Tensor:
    """Rotate-half RoPE on (b, t, heads, d): dim i pairs with i + d/2, angle p·base^(−2i/d)."""
    T, d = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))  # (d/2,)
    angle = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (t, d/2)
    angle = torch.cat([angle, angle], dim=-1)[None, :, None, :]  # (1, t, 1, d)
    xf = x.float()
    first, second = xf[..., : d // 2], xf[..., d // 2 :]
    rotated = torch.cat([-second, first], dim=-1)
    return (xf * angle.cos() + rotated * angle.sin()).to(x.dtype)


def _attention(sd: dict, p: str, m: dict, x: Tensor) -> Tensor:
    B, T, E = x.shape
    H = m["n_head"]
    G = H if m["n_kv_heads"] is None else m["n_kv_heads"]
    d = E // H
    qkv = _linear(sd, f"{p}.c_attn", x)  # (b, t, E + 2·G·d), ordered [q | k | v]
    if m["clip_qkv"] is not None:
        qkv = qkv.clamp(-m["clip_qkv"], m["clip_qkv"])
    q = qkv[..., :E].reshape(B, T, H, d)
    k = qkv[..., E : E + G * d].reshape(B, T, G, d)
    v = qkv[..., E + G * d :].reshape(B, T, G, d)
    if m["use_qk_norm"]:  # one norm over d, shared by all heads
        q = _norm(sd, f"{p}.q_norm", m, q)
        k = _norm(sd, f"{p}.k_norm", m, k)
    if m["use_rope"]:
        q, k = _rope(q, m["rope_base"]), _rope(k, m["rope_base"])
    group_of_head = torch.arange(H) // (H // G)  # query head h reads kv head ⌊h / (H/G)⌋
    k, v = k[:, :, group_of_head], v[:, :, group_of_head]  # (b, s, h, d)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    blk = m["diff_block_size"]
    pos = torch.arange(T)
    visible = (pos[:, None] // blk) >= (pos[None, :] // blk)  # (t, s) block-causal
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    y = torch.einsum("bhts,bshd->bthd", probs, v).reshape(B, T, E)
    return _linear(sd, f"{p}.c_proj", y)


def _activation(name: str, x: Tensor) -> Tensor:
    if name == "gelu":  # tanh approximation
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if name == "relu":
        return x.clamp_min(0.0)
    if name == "silu":
        return x * torch.sigmoid(x)
    raise ValueError(name)


def _mlp(sd: dict, p: str, m: dict, x: Tensor) -> Tensor:
    a = _linear(sd, f"{p}.c_fc", x)
    if m["mlp_type"] == "swiglu":
        F = a.shape[-1] // 2
        up, gate = a[..., :F], a[..., F:]  # output rows ordered [up | gate]
        hmid = gate * torch.sigmoid(gate) * up
    else:
        hmid = _activation(m["activation"], a)
    return _linear(sd, f"{p}.c_proj", hmid)


def _backbone(sd, m, input_ids, input_embeds, injection, inject_layer, inject_alpha) -> Tensor:
    x = input_embeds if input_embeds is not None else sd["transformer.tok_emb.weight"][input_ids]
    for i in range(m["n_layers"]):
        p = f"transformer.blocks.{i}"
        if m["norm_order"] == "pre":
            x = x + _attention(sd, f"{p}.attn", m, _norm(sd, f"{p}.ln_1", m, x))
            x = x + _mlp(sd, f"{p}.mlp", m, _norm(sd, f"{p}.ln_2", m, x))
        else:  # post: the norm sits on the branch output
            x = x + _norm(sd, f"{p}.ln_1", m, _attention(sd, f"{p}.attn", m, x))
            x = x + _norm(sd, f"{p}.ln_2", m, _mlp(sd, f"{p}.mlp", m, x))
        if injection is not None and inject_layer is not None and i + 1 >= inject_layer:
            x = x + inject_alpha * injection
    return _norm(sd, "transformer.ln_f", m, x)


# ---------------------------------------------------------------------------------------------
# Concept heads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Head:
    prefix: str  # "known_head" or "unknown_head"
    n: int  # valid concepts; rows n..pad(n) of every (pad(n), ·) table are never read
    attention: bool
    factorized: bool
    topk: int | None  # cut for the dense weights / intervention path / reported indices
    topk_features: int | None  # how many concepts make the features
    apply_topk: bool
    topk_on_logits: bool
    large: bool
    concept_dim: int


def _heads(c: dict, threshold: int) -> tuple[_Head, _Head | None]:
    tk, tkf = c["topk_known"], c["topk_known_features"]
    known = _Head("known_head", c["n_concepts"], c["use_attention_known"], False, tk,
                  tkf if tkf is not None else tk, tk is not None, c["topk_on_logits"],
                  c["n_concepts"] > threshold, c["concept_dim"])
    if not c["use_unknown"]:
        return known, None
    tu = c["unknown_topk"]
    unknown = _Head("unknown_head", c["n_unknown_concepts"], c["use_attention_unknown"],
                    c["factorize_unknown"], tu, tu, tu is not None and c["apply_topk_to_unknown"],
                    c["topk_on_logits"], c["n_unknown_concepts"] > threshold, c["concept_dim"])
    return known, unknown


def _embeddings(sd: dict, hd: _Head) -> Tensor:
    """Concept embedding table (c, e); factorised: coef (c, r) times basis (e, r)ᵀ."""
    if hd.factorized:
        coef = sd[f"{hd.prefix}.embedding_coef.weight"][: hd.n]
        return torch.einsum("cr,er->ce", coef, sd[f"{hd.prefix}.embedding_basis.weight"])
    return sd[f"{hd.prefix}.concept_embedding.weight"][: hd.n]


def _all_logits(sd: dict, hd: _Head, hidden: Tensor) -> Tensor:
    """Clamped float32 logits of every valid concept, (b, t, c)."""
    p = hd.prefix
    if hd.attention:  # sigmoid attention: query·embedding / sqrt(concept_dim)
        q = _linear(sd, f"{p}.concept_query_projection", hidden)
        scale = 1.0 / math.sqrt(hd.concept_dim)
        if hd.factorized:  # score through the rank-r space: (q·basis)·coefᵀ
            qr = torch.einsum("bte,er->btr", q, sd[f"{p}.embedding_basis.weight"])
            logits = torch.einsum("btr,cr->btc", qr, sd[f"{p}.embedding_coef.weight"][: hd.n]) * scale
        else:
            logits = torch.einsum("bte,ce->btc", q, _embeddings(sd, hd)) * scale
    elif hd.factorized:  # h·downᵀ·upᵀ
        hr = torch.einsum("bte,re->btr", hidden, sd[f"{p}.predictor_down.weight"])
        logits = torch.einsum("btr,cr->btc", hr, sd[f"{p}.predictor_up.weight"][: hd.n])
    else:
        logits = torch.einsum("bte,ce->btc", hidden, sd[f"{p}.concept_predictor.weight"][: hd.n])
    return logits.float().clamp(-LOGIT_CLAMP, LOGIT_CLAMP)


def _mix(sd: dict, hd: _Head, weights: Tensor, idx: Tensor | None = None) -> Tensor:
    """Σ_c weight_c · embedding_c; with idx (b, t, j), weights are per selected slot."""
    p = hd.prefix
    if hd.factorized:  # stay in rank space, then one basis projection
        coef = sd[f"{p}.embedding_coef.weight"][: hd.n]
        wc = (torch.einsum("btj,btjr->btr", weights, coef[idx]) if idx is not None
              else torch.einsum("btc,cr->btr", weights, coef))
        return torch.einsum("btr,er->bte", wc, sd[f"{p}.embedding_basis.weight"])
    E = _embeddings(sd, hd)
    if idx is not None:
        return torch.einsum("btj,btje->bte", weights, E[idx])
    return torch.einsum("btc,ce->bte", weights, E)


def _top(values: Tensor, k: int) -> Tensor:
    """Indices of the k largest values, descending; ties go to the lower index."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


def _dense_weights(hd: _Head, logits: Tensor) -> Tensor:
    """The head's dense weight matrix: sigmoid, and the top-`topk` cut when top-k applies."""
    if hd.apply_topk and hd.topk_on_logits:
        # cut the logits (zeros off the top-k), then sigmoid: off-top-k weights become 0.5
        keep = _top(logits, min(hd.topk, hd.n))
        cut = torch.zeros_like(logits).scatter(-1, keep, logits.gather(-1, keep))
        return torch.sigmoid(cut)
    w = torch.sigmoid(logits)
    if hd.apply_topk:
        keep = _top(w, min(hd.topk, hd.n))
        w = torch.zeros_like(w).scatter(-1, keep, w.gather(-1, keep))
    return w


def _head_forward(sd, hd: _Head, hidden, ids, vals, return_logits: bool) -> dict:
    logits = _all_logits(sd, hd, hidden)
    out = {"logits": None, "weights": None, "topk_indices": None, "topk_logits": None}
    has_int = ids is not None and vals is not None

    if has_int and not hd.large:
        # dense intervention: override entries of the (post top-k) weight matrix, then mix
        w = _dense_weights(hd, logits)
        valid = ids != -1
        safe = ids.clamp(0, hd.n - 1)
        summed = torch.zeros_like(w).scatter_add(-1, safe, torch.where(valid, vals.to(w.dtype), 0.0))
        chosen = torch.zeros_like(w, dtype=torch.bool).scatter(-1, safe, valid)
        w = torch.where(chosen, summed, w)
        out.update(logits=logits, weights=w, features=_mix(sd, hd, w))
        return out

    if hd.apply_topk:
        # factorised heads rank by logit; dense heads by sigmoid unless topk_on_logits
        rank = logits if (hd.factorized or hd.topk_on_logits) else torch.sigmoid(logits)
        idx = _top(rank, min(hd.topk_features, hd.n))  # (b, t, j)
        sel = logits.gather(-1, idx)
        features = _mix(sd, hd, torch.sigmoid(sel), idx)
        if hd.topk is not None and hd.topk_features > hd.topk:  # re-rank by logit, keep topk
            order = _top(sel, hd.topk)
            idx, sel = idx.gather(-1, order), sel.gather(-1, order)
        out.update(topk_indices=idx, topk_logits=sel)
    else:
        features = _mix(sd, hd, torch.sigmoid(logits))

    if return_logits:
        out.update(logits=logits, weights=_dense_weights(hd, logits))

    if has_int:  # large head, sparse intervention: add (value − current sigmoid) · embedding
        valid = ids != -1
        safe = ids.clamp(0, hd.n - 1)
        current = torch.sigmoid(logits.gather(-1, safe))
        delta = (vals - current) * valid.float()
        features = features + torch.einsum("btj,btje->bte", delta, _embeddings(sd, hd)[safe])
    out["features"] = features
    return out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def release_forward(
    state_dict: dict[str, Tensor],
    model_config: dict,
    concept_config: dict,
    vocab_size: int,
    input_ids: Tensor,
    *,
    input_embeds: Tensor | None = None,
    intervene_known_ids: Tensor | None = None,
    intervene_known_vals: Tensor | None = None,
    intervene_unknown_ids: Tensor | None = None,
    intervene_unknown_vals: Tensor | None = None,
    minimal_output: bool = False,
    position_injection: Tensor | None = None,
    steering_inject_layer: int | None = None,
    steering_inject_alpha: float = 1.0,
    unknown_topk: int = 64,
    large_concept_threshold: int = LARGE_CONCEPT_THRESHOLD,
) -> tuple[Tensor, dict[str, Tensor | None]]:
    """Logits (b, t, v) and a dict with every `InterpretableOutput` field (None where the release
    gives None).  Arguments mirror `InterpretableCausalDiffusionLM.forward`.

    >>> fx = load_fixture(Path(__file__).parents[1] / "fixtures/steerling/release_like")
    >>> logits, out = release_forward(fx.state_dict, fx.model_config, fx.concept_config,
    ...                               fx.vocab_size, fx.tensors["input.input_ids"],
    ...                               large_concept_threshold=fx.large_concept_threshold)
    >>> bool((logits - fx.tensors["base.logits"]).abs().max() < 1e-5)
    True
    """
    m, c = _full(model_config, concept_config)
    sd = state_dict
    if position_injection is None or steering_inject_layer is None:
        position_injection = steering_inject_layer = None
    hidden = _backbone(sd, m, input_ids, input_embeds, position_injection, steering_inject_layer,
                       steering_inject_alpha)
    known_hd, unknown_hd = _heads(c, large_concept_threshold)

    known = _head_forward(sd, known_hd, hidden, intervene_known_ids, intervene_known_vals,
                          return_logits=not minimal_output)
    kf = known["features"]
    unk = hidden - kf
    unk_for_lm, unk_hat, unknown = unk, None, None
    if unknown_hd is not None:
        unknown = _head_forward(sd, unknown_hd, hidden, intervene_unknown_ids,
                                intervene_unknown_vals,
                                return_logits=not minimal_output and not unknown_hd.large)
        unk_hat = unknown["features"]
        unk_for_lm = unk_hat
    epsilon_true = hidden - (kf + unk_hat) if unk_hat is not None else None
    epsilon = None
    if c["use_epsilon_correction"] and intervene_known_ids is None:
        epsilon = hidden - (unk_for_lm + kf)  # ε switched off whenever known ids are given
        unk_for_lm = unk_for_lm + epsilon
    composed = unk_for_lm + kf
    lm_head = sd["transformer.tok_emb.weight"] if m["weight_sharing"] else sd["transformer.lm_head.weight"]
    logits = torch.einsum("bte,ve->btv", composed, lm_head)

    u_idx = unknown["topk_indices"] if unknown else None
    u_log = unknown["topk_logits"] if unknown else None
    if not minimal_output and unknown is not None and u_idx is None and unknown_topk > 0:
        # attribution top-k, computed without interventions; dense heads rank by sigmoid
        ul = _all_logits(sd, unknown_hd, hidden)
        rank = ul if unknown_hd.factorized else torch.sigmoid(ul)
        u_idx = _top(rank, min(unknown_topk, unknown_hd.n))
        u_log = ul.gather(-1, u_idx)

    outputs = {
        "hidden": hidden,
        "known_features": kf,
        "known_logits": known["logits"],
        "known_gt_features": None,
        "known_predicted": kf,
        "known_weights": known["weights"],
        "known_topk_indices": known["topk_indices"],
        "known_topk_logits": known["topk_logits"],
        "unk": unk,
        "unk_hat": unk_hat,
        "unk_for_lm": unk_for_lm,
        "unknown_logits": unknown["logits"] if unknown else None,
        "unknown_weights": unknown["weights"] if unknown else None,
        "unknown_topk_indices": u_idx,
        "unknown_topk_logits": u_log,
        "composed": composed,
        "epsilon": epsilon,
        "epsilon_true": epsilon_true,
    }
    return logits, outputs


def intervention_tensors(interventions: dict[int, float], positions: Tensor) -> tuple[Tensor, Tensor]:
    """(b, t, j) ids and values: slot j is the j-th dict entry at selected positions, −1 / 0 elsewhere."""
    B, T = positions.shape
    ids = torch.full((B, T, len(interventions)), -1, dtype=torch.long)
    vals = torch.zeros((B, T, len(interventions)), dtype=torch.float32)
    ids[positions] = torch.tensor(list(interventions.keys()), dtype=torch.long)
    vals[positions] = torch.tensor(list(interventions.values()), dtype=torch.float32)
    return ids, vals


def release_intervene(state_dict, model_config, concept_config, vocab_size, input_ids, *,
                      known: dict[int, float] | None = None,
                      unknown: dict[int, float] | None = None,
                      positions: Tensor | None = None,
                      large_concept_threshold: int = LARGE_CONCEPT_THRESHOLD):
    """Mirror of `InterpretableCausalDiffusionLM.intervene` (full outputs, no grad)."""
    if positions is None:
        positions = torch.ones(input_ids.shape, dtype=torch.bool)
    kw = {}
    if known:
        kw["intervene_known_ids"], kw["intervene_known_vals"] = intervention_tensors(known, positions)
    if unknown:
        kw["intervene_unknown_ids"], kw["intervene_unknown_vals"] = intervention_tensors(unknown, positions)
    with torch.no_grad():
        return release_forward(state_dict, model_config, concept_config, vocab_size, input_ids,
                               large_concept_threshold=large_concept_threshold, **kw)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

WEIGHT_PREFIXES = ("transformer.", "known_head.", "unknown_head.")


@dataclass
class Fixture:
    meta: dict
    tensors: dict[str, Tensor]

    @property
    def state_dict(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.tensors.items() if k.startswith(WEIGHT_PREFIXES)}

    @property
    def model_config(self) -> dict:
        return self.meta["model_config"]

    @property
    def concept_config(self) -> dict:
        return self.meta["concept_config"]

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    @property
    def large_concept_threshold(self) -> int:
        return self.meta["large_concept_threshold"]


def load_fixture(path: str | Path) -> Fixture:
    """Load `<path>.json` and `<path>.safetensors` written by tools/make_steerling_fixtures.py."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    return Fixture(meta, load_file(str(path.with_suffix(".safetensors"))))
