"""Blocked top-k contraction: the concept module without a dense (tokens × concepts) matrix.

The diagrams draw each concept head densely — logits l[t, c] = clamp(h·Pᵀ), weights
w = topk(σ(l)), features w·K — which at the release's sizes and T = 4096 holds several
(4096 × 101196) float32 matrices (1.6 GB each). `blocked_topk_contract` computes the same
features and top-k in blocks of concepts: a first pass keeps a running top-k per token, a second
pass multiplies the surviving weights block by block into the table. Peak extra memory is
O(t · block + t · k) instead of O(t · n). It is general: any "contract, clamp, rank, keep k,
weight, contract again" along one large leg.

`concept_module_blocked` runs the diagram's concept module (concept_module.pen) this way, with
the same parameters (the compiled module's `known_head` / `unknown_head`), the same
interventions and the same ε composition; it returns no dense logits or weights.
bench/steerling_memory.py compares the peak memory of the two.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def blocked_topk_contract(x: Tensor, predictor: Tensor, table: Tensor, k: int, *, block: int = 4096,
                          clamp: float | None = 15.0, rank: Callable[[Tensor], Tensor] | None = None,
                          weight: Callable[[Tensor], Tensor] = torch.sigmoid,
                          override: tuple[Tensor, Tensor, Tensor] | None = None,
                          shift: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Σ_{c in top-k} weight(l_c) · table_c with l = clamp(x · predictorᵀ), never holding l densely.

    x (..., t, a); predictor (n, a); table (n, b). `rank` orders the logits (default: the logits
    themselves; torch.sigmoid ranks as the release's dense heads do). Returns
    (out (..., t, b), top-k logits (..., t, k), top-k ids (..., t, k), ids in descending rank).

    Interventions, as (positions (..., t) bool, chosen (n,) bool, values (n,)):
      override — chosen concepts at chosen positions take weight `value` (dense-head rule);
      shift    — chosen entries get value − weight(l) added (the release's large-head rule).
    """
    n = predictor.shape[0]
    lead = x.shape[:-1]
    best_v = best_r = best_i = None
    for start in range(0, n, block):  # pass 1: a running top-k per token
        end = min(start + block, n)
        l = x @ predictor[start:end].T
        if clamp is not None:
            l = l.clamp(-clamp, clamp)
        r = rank(l) if rank is not None else l
        idx = torch.arange(start, end, device=x.device).expand(*lead, end - start)
        if best_v is not None:
            l, r, idx = torch.cat([best_v, l], -1), torch.cat([best_r, r], -1), torch.cat([best_i, idx], -1)
        keep = r.topk(min(k, r.shape[-1]), dim=-1).indices
        best_v, best_r, best_i = l.gather(-1, keep), r.gather(-1, keep), idx.gather(-1, keep)
    order = best_r.argsort(dim=-1, descending=True, stable=True)
    best_v, best_i = best_v.gather(-1, order), best_i.gather(-1, order)
    top_w = weight(best_v)
    out = x.new_zeros(*lead, table.shape[-1])
    for start in range(0, n, block):  # pass 2: the kept weights, block by block, into the table
        end = min(start + block, n)
        inside = (best_i >= start) & (best_i < end)
        w = x.new_zeros(*lead, end - start)
        w.scatter_add_(-1, (best_i - start).clamp(0, end - start - 1), torch.where(inside, top_w, 0.0))
        if override is not None or shift is not None:
            pos, chosen, values = override if override is not None else shift
            sel = chosen[start:end]
            if bool(sel.any()):
                hit = pos[..., None] & sel
                if override is not None:
                    w = torch.where(hit, values[start:end], w)
                else:
                    l = x @ predictor[start:end].T
                    if clamp is not None:
                        l = l.clamp(-clamp, clamp)
                    w = w + torch.where(hit, values[start:end] - weight(l), 0.0)
        out = out + w @ table[start:end]
    return out, best_v, best_i


@torch.no_grad()
def concept_module_blocked(net, h: Tensor, *, kpos: Tensor, ksel: Tensor, kval: Tensor, upos: Tensor,
                           usel: Tensor, uval: Tensor, use_eps: bool, sizes: dict, block: int = 4096) -> dict:
    """The concept module of `net` (a compiled steerling.pen / concept_module.pen) in blocks.

    Returns z (what the LM head reads), kf, uf, eps (None when off) and the top-k logits/ids of
    both heads; inference only."""
    c, u = sizes["c"], sizes["u"]
    kh, uh = net.known_head, net.unknown_head
    known_any = bool(ksel.any())
    kf, k_log, k_idx = blocked_topk_contract(
        h, kh.concept_predictor[:c], kh.concept_embedding[:c], sizes["kc"], block=block, rank=torch.sigmoid,
        override=(kpos, ksel, kval) if known_any else None)
    hr = h @ uh.predictor_down.T
    ur, u_log, u_idx = blocked_topk_contract(
        hr, uh.predictor_up[:u], uh.embedding_coef[:u], sizes["ku"], block=block,
        shift=(upos, usel, uval) if bool(usel.any()) else None)
    uf = ur @ uh.embedding_basis.T
    eps = h - (uf + kf)
    on = use_eps and not known_any
    z = (uf + eps if on else uf) + kf
    return {"z": z, "kf": kf, "uf": uf, "eps": eps if on else None,
            "known_topk_logits": k_log, "known_topk_indices": k_idx,
            "unknown_topk_logits": u_log, "unknown_topk_indices": u_idx}
