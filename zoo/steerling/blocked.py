"""Blocked top-k: a large concept head without a dense (tokens × concepts) matrix.

The diagrams draw each concept head densely — logits l[t, c] = clamp(x·Pᵀ), weights
w = topk(σ(l)), features w·T — which at the release's sizes and T = 4096 holds several
(4096 × 101196) float32 matrices (1.6 GB each). The release itself streams its *large* heads
(more concepts than `large_concept_threshold`, 50,000) in blocks of `ConceptConfig.block_size`
concepts; `Steerling.forward` streams every head wider than one block (both 8B heads: 33,732
known, 101,196 unknown concepts) through this module, each with its release's rules:

  1. `select_topk` (no gradient): a running top-k per token over blocks of concepts;
  2. `weighted_sum` (differentiable): the logits of the kept concepts only, from their rows of
     the predictor, σ, the intervention rule, times their rows of the table — O(t · k) work and
     memory instead of a second pass over all n concepts, and a backward pass through the k kept
     concepts only (the dense diagram's backward multiplies the full (t × n) matrices).

Peak extra memory is O(t · block + t · k) instead of O(t · n); under autograd `weighted_sum`
checkpoints chunks of tokens, so backward holds one chunk's gathered rows at a time. `large_head`
is one head computed this way; `Steerling.forward` uses it for every head wider than one block
(model.py, `Steerling._concepts`), and the compiled diagrams for everything else.

Large-head rules (docs/steerling-release.md §5.4, §6): the k_features best concepts by rank
(σ(logit) for dense heads, the logit for factorised ones) build the features; the reported list is
re-ranked by logit and cut to k_report when k_features > k_report; an intervention (value v on
concept c at a position) adds (v − σ(l_c))·T_c there — an override for a selected concept, an
addition for an unselected one — and the reported lists stay the pre-intervention ones.

Small-head rules (`small_rule=True`, a head at or below the threshold, computed in blocks only
because it is wider than one block): the same without intervention; while intervened on, the
k_report best concepts are kept (the release's dense path cuts its weights to `topk`) and an
intervened weight is overwritten with its value at the chosen positions, selected or not. The
release reports no top-k lists then (SteerlingOutput.as_release gives None); the dense
diagnostics (tokens × concepts logits and weights) are not made — `dense_heads=True` makes them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CLAMP = 15.0


def _logits(x: Tensor, predictor: Tensor) -> Tensor:
    return (x @ predictor.mT).clamp(-CLAMP, CLAMP)


@torch.no_grad()
def select_topk(x: Tensor, predictor: Tensor, k: int, *, block: int = 4096,
                by_sigmoid: bool = False) -> tuple[Tensor, Tensor]:
    """The k best concepts per token of l = clamp(x·predictorᵀ), ranked by l (or σ(l)), in
    blocks of `block` concepts. x (..., t, a); predictor (n, a). Returns (logits, ids), both
    (..., t, k), in descending rank."""
    n = predictor.shape[0]
    k = min(k, n)
    lead = x.shape[:-1]
    best: tuple[Tensor, Tensor, Tensor] | None = None  # (logits, ranks, ids) kept so far
    for start in range(0, n, block):
        end = min(start + block, n)
        l = _logits(x, predictor[start:end])
        r = torch.sigmoid(l) if by_sigmoid else l
        idx = torch.arange(start, end, device=x.device).expand(*lead, end - start)
        if best is not None:
            l, r, idx = torch.cat([best[0], l], -1), torch.cat([best[1], r], -1), torch.cat([best[2], idx], -1)
        keep = r.topk(min(k, r.shape[-1]), dim=-1).indices
        best = l.gather(-1, keep), r.gather(-1, keep), idx.gather(-1, keep)
    if best is None:
        raise ValueError(f"select_topk: the predictor has no concepts (shape {tuple(predictor.shape)})")
    best_l, best_r, best_i = best
    order = best_r.argsort(dim=-1, descending=True, stable=True)
    return best_l.gather(-1, order), best_i.gather(-1, order)


def _intervened(x: Tensor, predictor: Tensor, ids: Tensor, w: Tensor, pos: Tensor, chosen: Tensor,
                values: Tensor, override: bool) -> tuple[Tensor, Tensor]:
    """The kept concepts ids (..., k) with weights w, and an intervention on `chosen` (j,) ids
    with `values` (j,) at positions `pos` (...): (ids, weights) (..., k + j) whose weighted sum
    of table rows is the head's features — by the small-head rule (`override`) the chosen take
    their value (a kept copy weighs 0), by the large-head rule value − σ(logit) is added (a kept
    copy stays). Elsewhere the chosen weigh 0."""
    at = pos[..., None]
    if override:
        w = torch.where(at & (ids[..., None] == chosen).any(-1), 0.0, w)
        extra = torch.where(at, values, 0.0)
    else:
        extra = torch.where(at, values - torch.sigmoid(_logits(x, predictor[chosen])), 0.0)
    extra = extra.to(w.dtype).expand(*ids.shape[:-1], chosen.numel())
    return torch.cat([ids, chosen.expand_as(extra)], -1), torch.cat([w, extra], -1)


def _chosen(shift: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(positions, chosen ids (j,), their values (j,)) from shift = (positions, chosen (n,) bool,
    values (n,))."""
    pos, mask, values = shift
    chosen = mask.nonzero().squeeze(-1)
    return pos, chosen, values[chosen]


def _kept_sum(x: Tensor, predictor: Tensor, table: Tensor, ids: Tensor, pos: Tensor | None,
              chosen: Tensor | None, values: Tensor | None, override: bool) -> Tensor:
    """Rows (r, a) of x, their kept concepts ids (r, k): Σ_j w_j · table[ids_j] with
    w = σ(clamp(x · predictor[ids]ᵀ)) computed for the kept concepts only, plus the intervention
    on `chosen` (j,) at rows `pos` (r,) (`_intervened`)."""
    w = torch.sigmoid((predictor[ids] @ x[..., None]).squeeze(-1).clamp(-CLAMP, CLAMP))
    if chosen is not None:
        assert pos is not None and values is not None  # weighted_sum passes the three together (_chosen)
        ids, w = _intervened(x, predictor, ids, w, pos, chosen, values, override)
    return (w[..., None] * table[ids]).sum(-2)


def weighted_sum(x: Tensor, predictor: Tensor, table: Tensor, ids: Tensor, *, rows: int | None = None,
                 shift: tuple[Tensor, Tensor, Tensor] | None = None, override: bool = False) -> Tensor:
    """Σ_{c in ids} σ(l_c) · table_c per token, l = clamp(x·predictorᵀ), from the kept concepts'
    rows of predictor and table only (O(t · k · (a + b)), not O(t · n · a)); differentiable in x,
    predictor and table, in chunks of `rows` tokens (each chunk checkpointed under autograd, so
    the gathered rows are never all held at once).

    ids (..., t, k) the kept concepts; shift = (positions (..., t) bool, chosen (n,) bool,
    values (n,)): an intervention at chosen concepts and positions, by the large-head rule
    ((value − σ(l)) added) or, with `override`, the small-head rule (the weight becomes value,
    selected or not)."""
    lead, k = ids.shape[:-1], ids.shape[-1]
    xs, ids2 = x.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1]), ids.reshape(-1, k)
    pos = chosen = values = None
    if shift is not None:
        pos, chosen, values = _chosen(shift)
        pos = pos.expand(lead).reshape(-1)
    if rows is None:  # about 16 M gathered elements per chunk
        rows = max(1, (1 << 24) // max(1, (k + (0 if chosen is None else chosen.numel())) * max(x.shape[-1], table.shape[-1])))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, predictor, table))
    parts = []
    for start in range(0, xs.shape[0], rows):
        sl = slice(start, start + rows)
        args = (xs[sl], predictor, table, ids2[sl], None if pos is None else pos[sl], chosen, values, override)
        parts.append(checkpoint(_kept_sum, *args, use_reentrant=False) if grad else _kept_sum(*args))
    return torch.cat(parts).reshape(*lead, table.shape[-1])


def active_lists(x: Tensor, predictor: Tensor, top_l: Tensor, top_i: Tensor,
                 shift: tuple[Tensor, Tensor, Tensor] | None = None,
                 small_rule: bool = False) -> tuple[Tensor, Tensor]:
    """(ids, weights) (..., t, k [+ j]) that a blocked head's features are the weighted sum of:
    the kept concepts with σ(logit), and with an intervention on j concepts, those j appended
    (`_intervened`)."""
    w = torch.sigmoid(top_l)
    if shift is None:
        return top_i, w
    return _intervened(x, predictor, top_i, w, *_chosen(shift), small_rule)


def large_head(x: Tensor, predictor: Tensor, table: Tensor, k_features: int, k_report: int, *,
               block: int = 4096, by_sigmoid: bool = False,
               shift: tuple[Tensor, Tensor, Tensor] | None = None,
               small_rule: bool = False) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
    """One concept head computed in blocks: (features (..., t, b), reported top-k logits
    (..., t, k), ids (..., t, k), (ids, weights) the features are built from — `active_lists`)
    with k = min(k_report, k_features, n); the reported lists are pre-intervention and carry no
    gradient.

    By default the release's large-head rules. `small_rule`: the release's small-head (dense)
    rules instead, for a head the release computes densely but that is too wide to hold as one
    matrix (the 8B known head): while it is intervened on (`shift`), the k_report best concepts
    (not k_features) are kept and each intervened weight is overwritten with its value."""
    if small_rule and shift is not None:  # the dense intervention path keeps topk, not topk_features
        k_features = min(k_features, k_report)
    top_l, top_i = select_topk(x, predictor, k_features, block=block, by_sigmoid=by_sigmoid)
    features = weighted_sum(x, predictor, table, top_i, shift=shift, override=small_rule)
    with torch.no_grad():
        active = active_lists(x, predictor, top_l, top_i, shift, small_rule)
    if k_report < top_l.shape[-1]:  # re-ranked by logit, cut to k_report
        order = top_l.argsort(dim=-1, descending=True, stable=True)[..., :k_report]
        top_l, top_i = top_l.gather(-1, order), top_i.gather(-1, order)
    return features, top_l, top_i, active
