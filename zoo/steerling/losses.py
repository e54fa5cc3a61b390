"""Steerling's training losses (concept-module post, "Training Objectives"), as tensor functions.

Index legend: b batch, t position, v vocabulary, e embedding, n known concept, c chunk.

    L = L_token + λ_concept · L_concept + λ_indep · L_indep + λ_rec · L_rec

  L_token    causal: next-token cross-entropy, `next_token_loss(logits, ids)`;
             block-causal diffusion: `diffusion_noise` draws, per block of `block_size`
             positions, a noise level t ~ U(0, 1) and masks each maskable token with
             probability t; `masked_diffusion_loss` is the cross-entropy on masked positions
             only (logits at position i predict the clean token i; no shift).
  L_concept  `concept_presence_loss`: per chunk and known concept, P = 1 − ∏_t (1 − p_t),
             p_t = σ(z_t), computed in log space: log(1 − P) = Σ_t logσ(−z_t) and
             log P = log1mexp(Σ_t logσ(−z_t)); BCE against the chunk's 0/1 labels, summed over
             concepts, averaged over chunks. Log terms are floored at −100 (as torch's
             binary_cross_entropy does), so the loss is finite even at p exactly 0 or 1.
  L_indep    `independence_loss`: ‖ (k̂ − 1μ_k̂ᵀ)ᵀ (û − 1μ_ûᵀ) / (B − 1) ‖²_F over the B tokens.
  L_rec      `reconstruction_loss`: mean over tokens of ‖û − (h − k̂_gt)‖², k̂_gt = Σ_i k_i^gt K_i
             built by `known_gt_features` from the chunk labels (target detached by default:
             the post trains the unknown head to match the residual).

Teacher forcing: `known_gt_features` gives k̂_gt (b, t, e) from chunk labels and the known
embedding table; `teacher_forced_features(k_pred, k_gt, alpha)` mixes them and
`teacher_forcing_alpha(step, ...)` anneals alpha linearly from 1 to 0. A model that accepts
`known_gt_features=` in forward_from_embeddings (protocol in penrose_zoo.steerling.attribution) reads it.

`steerling_loss(out, batch, ...)` assembles the four terms from a model output (fields `logits`,
`hidden`, `known_features`, `unknown_features`, `known_logits`; see the protocol) and an
`LMBatch` (penrose_zoo.steerling.lm_data), with the weights in `LossWeights`. It is
`reduced_loss` in one process: the terms built from partial sums (Σ and count of the token and
reconstruction terms, per-chunk log-absence sums, the rows of k̂ and û) that a communicator
reduces (`LOCAL` here; penrose_zoo.steerling.distributed over ranks), the one loss path of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "LOG_FLOOR",
    "LossWeights",
    "next_token_loss",
    "DiffusionNoise",
    "diffusion_noise",
    "masked_diffusion_loss",
    "log1mexp",
    "chunk_log_absence",
    "chunk_log_absence_from_probs",
    "chunk_presence",
    "presence_bce",
    "concept_presence_loss",
    "cross_covariance",
    "independence_loss",
    "known_gt_features",
    "reconstruction_loss",
    "teacher_forced_features",
    "teacher_forcing_alpha",
    "LocalReduce",
    "LOCAL",
    "token_sums",
    "reduced_loss",
    "steerling_loss",
    "get_field",
]

#: Floor for log-probabilities inside the BCE (torch.nn.functional.binary_cross_entropy uses −100).
LOG_FLOOR = -100.0


def get_field(out, *names, required: bool = True):
    """First present, non-None field of a model output (attribute or mapping key) among names."""
    for name in names:
        v = out.get(name) if isinstance(out, Mapping) else getattr(out, name, None)
        if v is not None:
            return v
    if required:
        raise AttributeError(f"model output has none of the fields {names}")
    return None


@dataclass(frozen=True)
class LossWeights:
    """λ of each auxiliary term (the token loss has weight 1)."""

    concept: float = 1.0
    indep: float = 1.0
    rec: float = 1.0
    bottleneck: float = 0.0  # the token loss of h̄ = k̂ + û (out's `bottleneck_logits`) besides the logits'


# ---------------------------------------------------------------------------------------------
# Token loss
# ---------------------------------------------------------------------------------------------


def next_token_loss(logits: Tensor, input_ids: Tensor, *, ignore_ids: tuple[int, ...] = ()) -> Tensor:
    """Mean cross-entropy of logits[:, i] against input_ids[:, i + 1]; targets in ignore_ids
    (e.g. the pad id) are skipped.

    >>> logits = torch.zeros(1, 3, 5); ids = torch.tensor([[0, 1, 2]])
    >>> round(next_token_loss(logits, ids).item(), 4) == round(math.log(5), 4)
    True
    """
    pred = logits[:, :-1].reshape(-1, logits.shape[-1])  # (b·(t−1), v)
    target = input_ids[:, 1:].reshape(-1)
    keep = torch.ones_like(target, dtype=torch.bool)
    for i in ignore_ids:
        keep &= target != i
    if not keep.any():
        return logits.sum() * 0.0
    return F.cross_entropy(pred[keep].float(), target[keep])


class DiffusionNoise(NamedTuple):
    """noisy_ids (b, t): input with masked tokens replaced by mask_id; masked (b, t) bool;
    noise_level (b, n_blocks): each block's t; token_level (b, t): its block's t."""

    noisy_ids: Tensor
    masked: Tensor
    noise_level: Tensor
    token_level: Tensor


def diffusion_noise(
    input_ids: Tensor,
    *,
    mask_id: int,
    block_size: int,
    maskable: Tensor | None = None,
    generator: torch.Generator | None = None,
    min_level: float = 0.0,
) -> DiffusionNoise:
    """Per block of `block_size` positions draw t ~ U(min_level, 1); mask each maskable token
    with probability t. maskable (b, t) bool defaults to all True (pass `batch.valid` to keep
    <|bos|> and <|pad|> clean)."""
    b, T = input_ids.shape
    n_blocks = -(-T // block_size)
    dev = input_ids.device
    level = torch.rand(b, n_blocks, generator=generator, device=dev if generator is None else generator.device)
    level = (min_level + (1.0 - min_level) * level).to(dev)
    token_level = level.repeat_interleave(block_size, dim=1)[:, :T]  # (b, t)
    u = torch.rand(b, T, generator=generator, device=dev if generator is None else generator.device).to(dev)
    masked = u < token_level
    if maskable is not None:
        masked &= maskable
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return DiffusionNoise(noisy, masked, level, token_level)


def masked_diffusion_loss(
    logits: Tensor,
    input_ids: Tensor,
    masked: Tensor,
    *,
    token_level: Tensor | None = None,
    weighting: str = "mean",
) -> Tensor:
    """Cross-entropy of logits[:, i] against the clean input_ids[:, i] on masked positions only.

    weighting 'mean': the mean over masked tokens (zero, with a gradient path, if none is
    masked); 'elbo': Σ CE / t over masked tokens divided by the number of maskable tokens
    b·t (the MDLM bound; needs token_level).
    """
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), input_ids.reshape(-1),
                         reduction="none").reshape(input_ids.shape)  # (b, t)
    m = masked.to(ce.dtype)
    if weighting == "mean":
        count = m.sum()
        return (ce * m).sum() / count.clamp_min(1.0)
    if weighting == "elbo":
        if token_level is None:
            raise ValueError("weighting='elbo' needs token_level")
        return (ce * m / token_level.clamp_min(1e-6)).sum() / ce.numel()
    raise ValueError(f"weighting must be 'mean' or 'elbo', got {weighting!r}")


# ---------------------------------------------------------------------------------------------
# Concept presence loss, in log space
# ---------------------------------------------------------------------------------------------


def log1mexp(a: Tensor) -> Tensor:
    """log(1 − exp(a)) for a ≤ 0, accurate everywhere (Mächler 2012) and finite with finite
    gradient at a = 0 (where it returns log of the dtype's smallest normal, ≈ −87 in float32)."""
    tiny = torch.finfo(a.dtype).tiny
    a = a.clamp(max=-tiny)
    near = a > -math.log(2.0)
    a_near = torch.where(near, a, torch.full_like(a, -1.0))
    a_far = torch.where(near, torch.full_like(a, -1.0), a)
    return torch.where(near, torch.log(-torch.expm1(a_near)), torch.log1p(-torch.exp(a_far)))


def _pool(per_token: Tensor, chunk_index: Tensor, n_chunks: int | None) -> Tensor:
    """Sum (b, t, n) over the tokens of each chunk -> (c, n); chunk_index −1 is skipped."""
    flat = per_token.reshape(-1, per_token.shape[-1])
    idx = chunk_index.reshape(-1)
    keep = idx >= 0
    if n_chunks is None:
        n_chunks = int(idx.max().item()) + 1 if keep.any() else 0
    out = flat.new_zeros(n_chunks, flat.shape[-1])
    return out.index_add(0, idx[keep], flat[keep])


def chunk_log_absence(known_logits: Tensor, chunk_index: Tensor, n_chunks: int | None = None) -> Tensor:
    """log(1 − P) = Σ_{t in chunk} log(1 − σ(z_t)) = Σ logσ(−z_t), (c, n), from logits (b, t, n)."""
    return _pool(F.logsigmoid(-known_logits.float()), chunk_index, n_chunks)


def chunk_log_absence_from_probs(probs: Tensor, chunk_index: Tensor, n_chunks: int | None = None) -> Tensor:
    """As chunk_log_absence, from probabilities p (b, t, n): Σ log1p(−p); −inf where some p = 1
    (with zero, not NaN, gradient there)."""
    one = probs >= 1.0
    safe = torch.where(one, torch.zeros_like(probs), probs)
    per = torch.where(one, torch.full_like(probs, -math.inf), torch.log1p(-safe))
    return _pool(per, chunk_index, n_chunks)


def chunk_presence(log_absence: Tensor) -> Tensor:
    """P = 1 − exp(log(1 − P)) = −expm1(log_absence), accurate when P is tiny."""
    return -torch.expm1(log_absence)


def presence_bce(log_absence: Tensor, labels: Tensor, *, negative_weight: float = 1.0) -> Tensor:
    """Element-wise BCE(P, y) from log(1 − P): −[y·log P + w·(1 − y)·log(1 − P)], logs floored at
    LOG_FLOOR. w = negative_weight (< 1 trusts unannotated concepts less as negatives)."""
    none = log_absence >= 0  # P exactly 0: log P = −inf, floored like the other logs
    log_p = torch.where(none, torch.full_like(log_absence, LOG_FLOOR), log1mexp(log_absence).clamp_min(LOG_FLOOR))
    log_q = log_absence.clamp_min(LOG_FLOOR)
    y = labels.to(log_p.dtype)
    return -(y * log_p + negative_weight * (1.0 - y) * log_q)


def concept_presence_loss(
    known_logits: Tensor,
    chunk_index: Tensor,
    chunk_labels: Tensor,
    *,
    negative_weight: float = 1.0,
    from_probs: bool = False,
) -> Tensor:
    """Mean over chunks of Σ_concepts BCE(P_chunk, label): known_logits (b, t, n) (or
    probabilities with from_probs=True), chunk_index (b, t) into chunk_labels (c, n), −1 = none.

    >>> z = torch.zeros(1, 2, 1); idx = torch.tensor([[0, 0]]); y = torch.ones(1, 1)
    >>> round(concept_presence_loss(z, idx, y).item(), 6) == round(-math.log(0.75), 6)
    True
    """
    c = chunk_labels.shape[0]
    log_q = (chunk_log_absence_from_probs(known_logits, chunk_index, c) if from_probs
             else chunk_log_absence(known_logits, chunk_index, c))
    if c == 0:
        return known_logits.sum() * 0.0
    return presence_bce(log_q, chunk_labels, negative_weight=negative_weight).sum(-1).mean()


# ---------------------------------------------------------------------------------------------
# Independence and reconstruction
# ---------------------------------------------------------------------------------------------


def _rows(x: Tensor, valid: Tensor | None) -> Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if valid is None else x[valid.reshape(-1)]


def cross_covariance(k_hat: Tensor, u_hat: Tensor, valid: Tensor | None = None) -> Tensor:
    """(e, e) centred cross-covariance (k̂ − μ)ᵀ(û − μ)/(B − 1) over the B (valid) tokens."""
    a, b = _rows(k_hat, valid), _rows(u_hat, valid)
    a = a - a.mean(0, keepdim=True)
    b = b - b.mean(0, keepdim=True)
    return a.T @ b / (a.shape[0] - 1)


def independence_loss(k_hat: Tensor, u_hat: Tensor, valid: Tensor | None = None) -> Tensor:
    """‖cross_covariance(k̂, û)‖²_F; k̂, û (..., e), valid (...) bool selects the tokens.

    Uses ‖AᵀB‖²_F = Σ (AAᵀ) ∘ (BBᵀ) when there are fewer tokens than dimensions (cheaper).
    """
    a, b = _rows(k_hat, valid), _rows(u_hat, valid)
    B = a.shape[0]
    if B < 2:
        return k_hat.sum() * 0.0 + u_hat.sum() * 0.0
    a = a - a.mean(0, keepdim=True)
    b = b - b.mean(0, keepdim=True)
    if B < a.shape[1]:
        return ((a @ a.T) * (b @ b.T)).sum() / (B - 1) ** 2
    return (a.T @ b).pow(2).sum() / (B - 1) ** 2


def known_gt_features(chunk_index: Tensor, chunk_labels: Tensor, known_embeddings: Tensor) -> Tensor:
    """k̂_gt (b, t, e): Σ_i k_i^gt K_i with k^gt the labels of the token's chunk (zero off chunks).

    Built per chunk ((c, n) @ (n, e)) and gathered per token, so no (b, t, n) tensor is made.
    """
    per_chunk = chunk_labels.to(known_embeddings.dtype) @ known_embeddings  # (c, e)
    safe = chunk_index.clamp_min(0)
    out = per_chunk[safe] if per_chunk.shape[0] else known_embeddings.new_zeros(*chunk_index.shape, known_embeddings.shape[1])
    return out * (chunk_index >= 0).unsqueeze(-1).to(out.dtype)


def reconstruction_loss(
    u_hat: Tensor,
    hidden: Tensor,
    k_gt: Tensor,
    valid: Tensor | None = None,
    *,
    detach_target: bool = True,
) -> Tensor:
    """Mean over (valid) tokens of ‖û − (h − k̂_gt)‖²₂ (squared norm over e)."""
    target = hidden - k_gt
    if detach_target:
        target = target.detach()
    per = (u_hat - target).pow(2).sum(-1)
    if valid is None:
        return per.mean()
    v = valid.to(per.dtype)
    return (per * v).sum() / v.sum().clamp_min(1.0)


def teacher_forced_features(k_pred: Tensor, k_gt: Tensor, alpha: float) -> Tensor:
    """alpha · k̂_gt + (1 − alpha) · k̂ (alpha = 1: full teacher forcing)."""
    return alpha * k_gt + (1.0 - alpha) * k_pred


def teacher_forcing_alpha(step: int, anneal_steps: int, start: float = 1.0, end: float = 0.0) -> float:
    """Linear anneal from `start` at step 0 to `end` at `anneal_steps` (constant after)."""
    if anneal_steps <= 0:
        return end
    f = min(max(step / anneal_steps, 0.0), 1.0)
    return start + (end - start) * f


# ---------------------------------------------------------------------------------------------
# The full objective, from partial sums (one process or one rank of several)
# ---------------------------------------------------------------------------------------------


class LocalReduce:
    """The reductions the objective needs, for one process holding the whole batch: identities.
    penrose_zoo.steerling.distributed's communicators implement the same four names over ranks:

      all_reduce(x)     sum of the ranks' partial sums, no gradient (token and row counts, reports)
      reduce(x)         sum over ranks carrying a gradient (per-chunk log-absence sums)
      gather(x, sizes)  the ranks' rows concatenated in rank order, carrying a gradient (k̂, û)
      rank, world       this process's place; the loss is scaled by world (ranks' gradients averaged)
    """

    rank = 0
    world = 1

    @staticmethod
    def all_reduce(x: Tensor) -> Tensor:
        return x.detach()

    @staticmethod
    def reduce(x: Tensor) -> Tensor:
        return x

    @staticmethod
    def gather(x: Tensor, sizes) -> Tensor:
        return x


LOCAL = LocalReduce()


def token_sums(logits: Tensor, input_ids: Tensor, *, masked: Tensor | None = None, pad_id: int | None = None,
               token_level: Tensor | None = None, weighting: str = "mean") -> tuple[Tensor, Tensor]:
    """(Σ cross-entropy, count) of the token loss over these rows: next-token CE with pad targets
    skipped (masked None), or CE on the masked tokens (weighting 'mean'; 'elbo': Σ CE / t over
    masked tokens, count = every token). The loss is Σ / count after both are reduced."""
    if masked is None:
        target = input_ids[:, 1:]
        keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
        return F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="sum"), keep.sum()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), input_ids.reshape(-1),
                         reduction="none").reshape(input_ids.shape)
    m = masked.to(ce.dtype)
    if weighting == "mean":
        return (ce * m).sum(), m.sum()
    if weighting == "elbo":
        if token_level is None:
            raise ValueError("weighting='elbo' needs token_level")
        return (ce * m / token_level.clamp_min(1e-6)).sum(), torch.tensor(ce.numel(), device=ce.device)
    raise ValueError(f"weighting must be 'mean' or 'elbo', got {weighting!r}")


def reduced_loss(
    out,
    input_ids: Tensor,
    chunk_index: Tensor,
    chunk_labels: Tensor,
    known_gt: Tensor | None,
    *,
    weights: LossWeights = LossWeights(),
    negative_weight: float = 1.0,
    masked: Tensor | None = None,
    pad_id: int | None = None,
    token_level: Tensor | None = None,
    diffusion_weighting: str = "mean",
    comm=LOCAL,
    sizes=None,
    all_valid: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """(this process's loss, parts of the whole batch's loss) from this process's rows.

    input_ids, chunk_index, known_gt and `out` (fields as steerling_loss's) cover this process's
    rows (known_gt may be None when weights.rec is 0); chunk_labels (c, n) all chunks of the batch; all_valid (B, t) the whole batch's
    `chunk_index >= 0` (default: this process's, i.e. one process); sizes the rows per rank.
    Each term is reduced from partial sums with `comm` (LOCAL: one process):

      token, rec   (Σ over my tokens, count): L_r = W · Σ_r / all_reduce(count), so the ranks'
                   averaged gradient is the gradient of Σ / count of the whole batch;
      concept      per chunk Σ_t logσ(−z_t) (c, n), reduced with gradient; the BCE of the sums;
      indep        k̂, û gathered over ranks; the cross-covariance of the whole batch.
    """
    W = comm.world
    logits = get_field(out, "logits")
    valid = chunk_index >= 0
    tok_sum, tok_n = token_sums(logits, input_ids, masked=masked, pad_id=pad_id, token_level=token_level,
                                weighting=diffusion_weighting)
    counts = comm.all_reduce(torch.stack([tok_n.double(), valid.sum().double()])).clamp_min(1.0)
    n_tok, n_valid = counts.unbind()
    total = tok_sum * (W / n_tok).to(tok_sum.dtype)
    report = [tok_sum.detach().double()]
    parts: dict[str, float] = {}
    if weights.bottleneck:
        bn_sum, _ = token_sums(get_field(out, "bottleneck_logits"), input_ids, masked=masked, pad_id=pad_id,
                               token_level=token_level, weighting=diffusion_weighting)
        total = total + weights.bottleneck * bn_sum * (W / n_tok).to(bn_sum.dtype)
        report.append(bn_sum.detach().double())
    if weights.concept:
        known_logits = get_field(out, "known_logits")
        c = chunk_labels.shape[0]
        if c:
            log_q = comm.reduce(chunk_log_absence(known_logits, chunk_index, c))
            lc = presence_bce(log_q, chunk_labels, negative_weight=negative_weight).sum(-1).mean()
        else:
            lc = known_logits.sum() * 0.0
        total = total + weights.concept * lc
        parts["concept"] = float(lc.detach())
    u_hat = get_field(out, "unknown_features", "unk_hat")
    if weights.indep:
        k_hat = get_field(out, "known_features")
        li = independence_loss(comm.gather(k_hat, sizes), comm.gather(u_hat, sizes),
                               valid if all_valid is None else all_valid)
        total = total + weights.indep * li
        parts["indep"] = float(li.detach())
    if weights.rec:
        if known_gt is None:
            raise ValueError("reduced_loss: weights.rec is not 0, so known_gt is needed (known_gt_features)")
        target = (get_field(out, "hidden") - known_gt).detach()
        per = (u_hat - target).pow(2).sum(-1)
        rec_sum = (per * valid.to(per.dtype)).sum()
        total = total + weights.rec * rec_sum * (W / n_valid).to(rec_sum.dtype)
        report.append(rec_sum.detach().double())
    sums = comm.all_reduce(torch.stack(report))
    result = {"token": float(sums[0] / n_tok)}
    if weights.bottleneck:
        result["bottleneck"] = float(sums[1] / n_tok)
    result.update(parts)
    if weights.rec:
        result["rec"] = float(sums[-1] / n_valid)
    result["total"] = (result["token"] + weights.concept * result.get("concept", 0.0)
                       + weights.indep * result.get("indep", 0.0) + weights.rec * result.get("rec", 0.0)
                       + weights.bottleneck * result.get("bottleneck", 0.0))
    return total, result


def steerling_loss(
    out,
    batch,
    *,
    known_embeddings: Tensor,
    weights: LossWeights = LossWeights(),
    objective: str = "causal",
    noise: DiffusionNoise | None = None,
    negative_weight: float = 1.0,
    diffusion_weighting: str = "mean",
) -> tuple[Tensor, dict[str, float]]:
    """Total loss and its parts {'token', 'concept', 'indep', 'rec', 'total'} (floats): `reduced_loss`
    in one process (the same path as training, single-process or distributed).

    out: the model's output for batch.input_ids ('causal') or noise.noisy_ids ('diffusion').
    batch: an LMBatch (input_ids, chunk_index, chunk_labels, pad_id).
    known_embeddings: (n, e), the known concept table K (model.concept_embeddings('known')).
    A term whose λ is 0 is not computed.
    """
    if objective == "causal":
        masked = token_level = None
    elif objective == "diffusion":
        if noise is None:
            raise ValueError("objective='diffusion' needs the DiffusionNoise used to make the input")
        masked, token_level = noise.masked, noise.token_level
    else:
        raise ValueError(f"objective must be 'causal' or 'diffusion', got {objective!r}")
    k_gt = known_gt_features(batch.chunk_index, batch.chunk_labels, known_embeddings) if weights.rec else None
    return reduced_loss(out, batch.input_ids, batch.chunk_index, batch.chunk_labels, k_gt, weights=weights,
                        negative_weight=negative_weight, masked=masked, pad_id=batch.pad_id,
                        token_level=token_level, diffusion_weighting=diffusion_weighting)
