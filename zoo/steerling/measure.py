"""Interpretability metrics for a concept language model (concept-module post; REFERENCES "Metrics").

Index legend: b batch, t position, v vocabulary, e embedding, n known concept, c chunk.

Model protocol: `ConceptLM` in penrose_zoo.steerling.attribution (embed, forward_from_embeddings,
concept_embeddings, lm_head_weight; output fields logits, known_logits, known_features,
unknown_features, epsilon and the concept weights). Data: LMBatch from penrose_zoo.steerling.lm_data.

  concept detection AUC   per known concept, ROC-AUC of the chunk-level presence
                          P = 1 − ∏_t(1 − σ(z_t)) (log space, penrose_zoo.steerling.losses) against the
                          chunk labels; the mean over concepts whose labels have both classes
                          (penrose_zoo.metrics.concept_aucs). Chunks cut across batches count per piece.
  token control           per concept, the probability mass softmax(v_c Wᵀ) puts on its 10
                          most likely tokens: the concept embedding read by the LM head alone.
                          1.0 = all on ten tokens; 10/|V| = spread uniformly.
  HSIC                    between the concept pathway k̂ and the residual pathway û over a sample
                          of tokens, biased estimator, linear kernel and RBF with median-heuristic
                          bandwidths (penrose_zoo.metrics.hsic, float64). Lower = more independent.
  probing gap             per concept, a logistic-regression probe (scikit-learn, standardised
                          inputs) on chunk-mean k̂ and on chunk-mean û, fit on training chunks,
                          ROC-AUC on validation chunks; gap = AUC(k̂) − AUC(û), averaged.
  logit share             per position and target token, from the exact attribution
                          (penrose_zoo.steerling.attribution): share_concept = (|K| + |U|)/(|K| + |U| + |ε|)
                          and share_known = |K|/(|K| + |U| + |ε|), K, U, ε the summed known,
                          unknown and ε parts of the logit. 1.0 = fully explained by concepts.

`evaluate(model, train_batches, val_batches)` runs all of them and returns a flat dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from penrose_zoo.metrics import concept_aucs, hsic
from penrose_zoo.steerling.attribution import ConceptLM, concept_attribution, forward_ids
from penrose_zoo.steerling.losses import chunk_log_absence, chunk_presence, get_field

__all__ = [
    "ChunkStats",
    "collect_chunk_stats",
    "concept_detection_auc",
    "token_control",
    "pathway_hsic",
    "probing_gap",
    "logit_share",
    "evaluate",
]


@dataclass(frozen=True)
class ChunkStats:
    """Per chunk (piece): presence (c, n), labels (c, n), mean k̂ and û over its tokens (c, e);
    a token sample k_tokens, u_tokens (s, e) for HSIC."""

    presence: Tensor
    labels: Tensor
    k_mean: Tensor
    u_mean: Tensor
    k_tokens: Tensor
    u_tokens: Tensor


@torch.no_grad()
def collect_chunk_stats(
    model: ConceptLM,
    batches: Iterable,
    *,
    tokens_per_batch: int = 64,
    seed: int = 0,
) -> ChunkStats:
    """Run the model (eval mode) over LMBatch-es and gather the chunk-level statistics."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    g = torch.Generator().manual_seed(seed)
    pres, labs, km, um, kt, ut = [], [], [], [], [], []
    try:
        for batch in batches:
            out = forward_ids(model, batch.input_ids)
            c = batch.chunk_labels.shape[0]
            idx = batch.chunk_index
            pres.append(chunk_presence(chunk_log_absence(get_field(out, "known_logits"), idx, c)).cpu())
            labs.append(batch.chunk_labels.cpu())
            k = get_field(out, "known_features").float()
            u = get_field(out, "unknown_features", "unk_hat").float()
            valid = (idx >= 0).reshape(-1)
            flat_idx = idx.reshape(-1)[valid]
            kf, uf = k.reshape(-1, k.shape[-1])[valid], u.reshape(-1, u.shape[-1])[valid]
            count = torch.zeros(c, device=k.device).index_add(0, flat_idx, torch.ones_like(flat_idx, dtype=torch.float))
            denom = count.clamp_min(1).unsqueeze(-1)
            km.append((k.new_zeros(c, k.shape[-1]).index_add(0, flat_idx, kf) / denom).cpu())
            um.append((u.new_zeros(c, u.shape[-1]).index_add(0, flat_idx, uf) / denom).cpu())
            pick = torch.randperm(kf.shape[0], generator=g)[:tokens_per_batch].to(kf.device)
            kt.append(kf[pick].cpu())
            ut.append(uf[pick].cpu())
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    if not pres:
        raise ValueError("no batches")
    return ChunkStats(torch.cat(pres), torch.cat(labs), torch.cat(km), torch.cat(um), torch.cat(kt), torch.cat(ut))


def concept_detection_auc(presence, labels) -> tuple[np.ndarray, float]:
    """(per-concept AUC with NaN where a concept lacks a class, mean over the others)."""
    aucs = concept_aucs(presence, labels)
    mean = float(np.nanmean(aucs)) if not np.isnan(aucs).all() else float("nan")
    return aucs, mean


@torch.no_grad()
def token_control(
    model: ConceptLM,
    concepts: Sequence[int] | Tensor | None = None,
    *,
    k: int = 10,
    kind: str = "known",
    block: int = 1024,
) -> Tensor:
    """(len(concepts),) probability mass softmax(v_c Wᵀ) on each concept's top-k tokens;
    computed `block` concepts at a time. concepts default to every concept of `kind`."""
    W = model.lm_head_weight()  # (v, e)
    if concepts is None:
        V = model.concept_embeddings(kind)
        ids = torch.arange(V.shape[0], device=W.device)
    else:
        ids = torch.as_tensor(concepts, dtype=torch.long, device=W.device)
    out = []
    for s in range(0, ids.numel(), block):
        rows = model.concept_embeddings(kind, ids[s:s + block])  # (c, e)
        p = torch.softmax((rows @ W.T).float(), -1)  # (c, v)
        out.append(p.topk(min(k, p.shape[-1]), -1).values.sum(-1))
    return torch.cat(out) if out else torch.zeros(0)


def pathway_hsic(k_tokens, u_tokens, *, max_samples: int = 512, seed: int = 0) -> dict[str, float]:
    """{'hsic_linear', 'hsic_rbf'} between k̂ and û token samples (s, e), ≤ max_samples rows."""
    k = torch.as_tensor(k_tokens).double()
    u = torch.as_tensor(u_tokens).double()
    if k.shape[0] > max_samples:
        pick = torch.randperm(k.shape[0], generator=torch.Generator().manual_seed(seed))[:max_samples]
        k, u = k[pick], u[pick]
    return {"hsic_linear": float(hsic(k, u, "linear")), "hsic_rbf": float(hsic(k, u, "rbf"))}


def _probe_auc(x_tr, y_tr, x_va, y_va, C: float) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000))
    probe.fit(x_tr, y_tr)
    return float(roc_auc_score(y_va, probe.decision_function(x_va)))


def probing_gap(
    train: ChunkStats,
    val: ChunkStats,
    concepts: Sequence[int] | None = None,
    *,
    C: float = 1.0,
) -> dict:
    """Linear-probe AUC on the concept pathway minus on the residual pathway (module doc).

    Returns {'auc_concept': (n,), 'auc_residual': (n,), 'gap': (n,)} arrays (NaN where a
    concept lacks a class in either split) and their nan-means 'probe_auc_concept',
    'probe_auc_residual', 'probing_gap'.
    """
    n = train.labels.shape[1]
    concepts = range(n) if concepts is None else concepts
    a_k, a_u = np.full(n, np.nan), np.full(n, np.nan)
    ytr_all, yva_all = train.labels.numpy() > 0.5, val.labels.numpy() > 0.5
    for c in concepts:
        ytr, yva = ytr_all[:, c], yva_all[:, c]
        if ytr.all() or not ytr.any() or yva.all() or not yva.any():
            continue
        a_k[c] = _probe_auc(train.k_mean.numpy(), ytr, val.k_mean.numpy(), yva, C)
        a_u[c] = _probe_auc(train.u_mean.numpy(), ytr, val.u_mean.numpy(), yva, C)
    gap = a_k - a_u

    def nanmean(a):
        return float(np.nanmean(a)) if not np.isnan(a).all() else float("nan")

    return {"auc_concept": a_k, "auc_residual": a_u, "gap": gap,
            "probe_auc_concept": nanmean(a_k), "probe_auc_residual": nanmean(a_u),
            "probing_gap": nanmean(gap)}


@torch.no_grad()
def logit_share(model: ConceptLM, out, targets: Tensor | None = None, valid: Tensor | None = None) -> dict:
    """Share of each logit explained by the concept module (module doc). targets (b, t[, j])
    default to the argmax token; valid (b, t) bool selects positions. Returns per-entry tensors
    'share_concept', 'share_known' (b, t, j), their means, and the attribution's 'error'."""
    attr = concept_attribution(model, out, targets)
    K, U, E = attr.known_total.abs(), attr.unknown_total.abs(), attr.epsilon.abs()
    denom = (K + U + E).clamp_min(torch.finfo(K.dtype).tiny)
    sc, sk = (K + U) / denom, K / denom
    sel = (valid.unsqueeze(-1).expand_as(sc) if valid is not None else torch.ones_like(sc, dtype=torch.bool))
    return {"share_concept": sc, "share_known": sk,
            "mean_share_concept": float(sc[sel].mean()), "mean_share_known": float(sk[sel].mean()),
            "error": attr.error}


@torch.no_grad()
def evaluate(
    model: ConceptLM,
    train_batches: Iterable,
    val_batches: Iterable,
    *,
    concepts: Sequence[int] | None = None,
    hsic_samples: int = 512,
    top_k_tokens: int = 10,
) -> dict[str, float]:
    """All metrics on a trained model: detection AUC (validation chunks), token control,
    HSIC (validation tokens), probing gap (train → validation), logit share (validation)."""
    val_list = list(val_batches)
    tr = collect_chunk_stats(model, train_batches)
    va = collect_chunk_stats(model, val_list)
    aucs, mean_auc = concept_detection_auc(va.presence, va.labels)
    tc = token_control(model, concepts, k=top_k_tokens)
    hs = pathway_hsic(va.k_tokens, va.u_tokens, max_samples=hsic_samples)
    pg = probing_gap(tr, va, concepts)
    shares, errors = [], []
    for batch in val_list:
        ls = logit_share(model, forward_ids(model, batch.input_ids), valid=batch.chunk_index >= 0)
        shares.append((ls["mean_share_concept"], ls["mean_share_known"]))
        errors.append(ls["error"])
    return {
        "concept_auc": mean_auc,
        "token_control": float(tc.mean()),
        **hs,
        "probe_auc_concept": pg["probe_auc_concept"],
        "probe_auc_residual": pg["probe_auc_residual"],
        "probing_gap": pg["probing_gap"],
        "logit_share_concept": float(np.mean([s[0] for s in shares])),
        "logit_share_known": float(np.mean([s[1] for s in shares])),
        "attribution_error": float(max(errors)),
    }
