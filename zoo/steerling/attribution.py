"""Exact concept→logit attribution and Integrated Gradients for concept language models.

Index legend: b batch, t position, v vocabulary, e embedding, n known concept, m unknown
concept, j target token slot, k active-concept slot, s interpolation step.

The protocol (what an adapter around penrose_zoo.steerling.Steerling implements; tests use a stand-in)
--------------------------------------------------------------------------------------------
ConceptLM, a torch.nn.Module with:

  embed(input_ids: int64 (b, t)) -> (b, t, e)
      token embeddings, the backbone's input. The IG baseline is embed of `mask_token_id`.
  forward_from_embeddings(x: (b, t, e), *, intervene_known=None, intervene_unknown=None,
                          positions=None, known_gt_features=None) -> output
      differentiable in x. Keyword arguments are passed only when not None, so a model may
      omit the ones it does not support. Interventions in the form of Steerling.forward:
      intervene_known / intervene_unknown {concept id: value} replace that concept's
      post-top-k weight at `positions` ((b, t) bool, default every position). A value is a
      float, or a (b, t) tensor of per-position values (penrose_zoo.steerling.steer needs this form
      only for scale factors and for switching ε off around an unknown-only edit). Whenever
      intervene_known is non-empty, ε is switched off (epsilon None) and the LM head reads
      k̂ + û, as in the release.
      known_gt_features (b, t, e): teacher-forced k̂_gt (penrose_zoo.steerling.losses), optional.
  concept_embeddings(kind: 'known' | 'unknown', ids: int64 (...) | None = None) -> (..., e)
      rows of the concept embedding table (K: n × e, U: m × e); ids None gives the whole
      table. (Factorised heads return coef[ids] @ basisᵀ, never the full table unless asked.)
  lm_head_weight() -> (v, e)
      the LM head (tied with the token embedding in the release); no bias: logits = composed · Wᵀ.
  mask_token_id: int

output: an object (or mapping) with the fields
  logits            (b, t, v)
  hidden            (b, t, e)   h, the backbone's output
  known_features    (b, t, e)   k̂ = Σ_i w_i K_i
  unknown_features  (b, t, e)   û = Σ_j u_j U_j         (the release's `unk_hat` is accepted)
  epsilon           (b, t, e) or None                    ε = h − (û + k̂) when switched on
  known_logits      (b, t, n)   pre-sigmoid, pre-top-k (clamped) known-head logits
  known_weights     (b, t, n)   dense post-top-k weights, interventions applied (preferred);
  known_topk_indices, known_topk_weights   (b, t, k)    used when known_weights is None: the
                                concepts k̂ is built from (`*_topk_logits` is accepted instead
                                of `*_topk_weights`, σ applied)
  unknown_weights / unknown_topk_indices, unknown_topk_weights     likewise for û
  known_active, unknown_active  (ids, weights) (b, t, k')  optional, used first: what a head
                                computed in blocks (no dense weights) built its features from
and the invariant  logits = (k̂ + û + ε) · lm_head_weight()ᵀ  (ε omitted when None).

Concept attribution (`concept_attribution`)
    Every logit is linear in the concept weights: C(c_i, y) = w_i · (v_iᵀ W_y), for each active
    known and unknown concept, plus the ε term ε·W_y. They sum to the logit exactly (up to
    float rounding); each result carries its `error` = max |Σ parts − logit|.

Integrated Gradients (`integrated_gradients`)
    Baseline: every (selected) position's embedding replaced by embed([MASK]). Right Riemann sum
    as in the post, C(x_t) = (x_t − x'_t)ᵀ · (1/P) Σ_{p=1..P} ∇ f(x' + (p/P)(x − x')), summed over
    e. The P steps run `chunk_size` at a time (stacked along the batch), so memory is that of a
    forward/backward of chunk_size · b sequences, whatever P is. Each result carries the
    completeness error |Σ_t C(x_t) − (f(x) − f(x'))|. Targets: `LogitTarget` (token → logit) and
    `ConceptTarget` (token → known-concept activation σ(known_logits), taken before the top-k
    cut: the cut is piecewise constant and would break completeness). With ε on (no known
    intervention) the logits are h·Wᵀ and smooth in x; with ε off they pass through the top-k
    cut, which can jump along the path, and the completeness error then says by how much.
    Written here rather than with captum: the batched-step loop is a few lines, the model
    returns a structured output rather than a tensor, and it keeps captum out of the runtime
    dependencies; the tests check it against captum's IntegratedGradients (riemann_right) when
    captum is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

from penrose_zoo.steerling.losses import get_field

__all__ = [
    "ConceptLM",
    "active_concepts",
    "ConceptAttribution",
    "concept_attribution",
    "LogitTarget",
    "ConceptTarget",
    "IGResult",
    "integrated_gradients",
    "forward_ids",
]


@runtime_checkable
class ConceptLM(Protocol):
    """The model protocol; see the module docstring for shapes and the output's fields."""

    mask_token_id: int

    def embed(self, input_ids: Tensor) -> Tensor: ...

    def forward_from_embeddings(self, x: Tensor, **kwargs): ...

    def concept_embeddings(self, kind: str, ids: Tensor | None = None) -> Tensor: ...

    def lm_head_weight(self) -> Tensor: ...


def forward_ids(model: ConceptLM, input_ids: Tensor, **kwargs):
    """model.forward_from_embeddings(model.embed(input_ids)), passing only non-None kwargs."""
    kw = {k: v for k, v in kwargs.items() if v is not None}
    return model.forward_from_embeddings(model.embed(input_ids), **kw)


def active_concepts(out, kind: str) -> tuple[Tensor, Tensor]:
    """(ids (b, t, k), weights (b, t, k)) of the concepts the `kind` features are built from.

    From `{kind}_active` when the head ran blocked (the kept concepts and any intervened ones,
    with the weights the features used); else from the dense weights when present (they include
    interventions): the k = most nonzero weights at any position, so zeros are not carried;
    else from the top-k fields.
    """
    if kind not in ("known", "unknown"):
        raise ValueError(f"kind must be 'known' or 'unknown', got {kind!r}")
    active = get_field(out, f"{kind}_active", required=False)  # a blocked head's own lists
    if active is not None:
        return active
    dense = get_field(out, f"{kind}_weights", required=False)
    if dense is not None:
        k = max(int((dense != 0).sum(-1).max()), 1) if dense.numel() else 1
        ids = dense.abs().topk(k, dim=-1).indices
        return ids, dense.gather(-1, ids)
    idx = get_field(out, f"{kind}_topk_indices", required=False)
    if idx is None:
        raise AttributeError(f"model output has neither {kind}_weights nor {kind}_topk_indices")
    w = get_field(out, f"{kind}_topk_weights", required=False)
    if w is None:
        w = torch.sigmoid(get_field(out, f"{kind}_topk_logits"))
    return idx, w


@dataclass(frozen=True)
class ConceptAttribution:
    """Exact split of logits[b, t, targets[b, t, j]] into concept terms.

    known, unknown: (b, t, j, k) contributions w_i (v_iᵀ W_y) of the concepts known_ids /
    unknown_ids (b, t, k); epsilon: (b, t, j) ε·W_y (zeros when ε is off); logit: (b, t, j) the
    model's logits; error: max |known.sum + unknown.sum + epsilon − logit|.
    """

    targets: Tensor
    known_ids: Tensor
    known: Tensor
    unknown_ids: Tensor
    unknown: Tensor
    epsilon: Tensor
    logit: Tensor
    error: float

    @property
    def known_total(self) -> Tensor:
        return self.known.sum(-1)

    @property
    def unknown_total(self) -> Tensor:
        return self.unknown.sum(-1)

    def top_known(self, k: int = 5) -> tuple[Tensor, Tensor]:
        """(concept ids, contributions) of the k largest known contributions, (b, t, j, k)."""
        k = min(k, self.known.shape[-1])
        vals, slot = self.known.topk(k, dim=-1)
        ids = self.known_ids.unsqueeze(2).expand_as(self.known).gather(-1, slot)
        return ids, vals


def concept_attribution(model: ConceptLM, out, targets: Tensor | None = None) -> ConceptAttribution:
    """Concept→logit attribution of `out` (the model's output) for token ids `targets`
    ((b, t) or (b, t, j); default: each position's argmax token).

    >>> # attr = concept_attribution(model, forward_ids(model, ids)); attr.error < 1e-4
    """
    logits = get_field(out, "logits")
    if targets is None:
        targets = logits.argmax(-1)
    if targets.ndim == 2:
        targets = targets.unsqueeze(-1)
    W_y = model.lm_head_weight()[targets]  # (b, t, j, e)
    parts = {}
    for kind in ("known", "unknown"):
        ids, w = active_concepts(out, kind)
        V = model.concept_embeddings(kind, ids)  # (b, t, k, e)
        parts[kind] = (ids, torch.einsum("btk,btke,btje->btjk", w.to(V.dtype), V, W_y.to(V.dtype)))
    eps = get_field(out, "epsilon", required=False)
    eps_part = (torch.einsum("bte,btje->btj", eps, W_y.to(eps.dtype)) if eps is not None
                else torch.zeros(targets.shape, dtype=W_y.dtype, device=W_y.device))
    logit = logits.gather(-1, targets)
    total = parts["known"][1].sum(-1) + parts["unknown"][1].sum(-1) + eps_part
    error = float((total - logit).detach().abs().max()) if logit.numel() else 0.0
    return ConceptAttribution(targets, parts["known"][0], parts["known"][1], parts["unknown"][0],
                              parts["unknown"][1], eps_part, logit, error)


# ---------------------------------------------------------------------------------------------
# Integrated Gradients
# ---------------------------------------------------------------------------------------------


def _per_example(v, b: int, device) -> Tensor:
    t = torch.as_tensor(v, device=device, dtype=torch.long)
    return t.expand(b) if t.ndim == 0 else t


@dataclass(frozen=True)
class LogitTarget:
    """f = logits[b, position, token] (position, token: ints or (b,) tensors)."""

    position: int | Tensor
    token: int | Tensor

    def __call__(self, out, b: int) -> Tensor:
        logits = get_field(out, "logits")
        B = logits.shape[0]
        rows = torch.arange(B, device=logits.device)
        pos = _per_example(self.position, b, logits.device).repeat(B // b)
        tok = _per_example(self.token, b, logits.device).repeat(B // b)
        return logits[rows, pos, tok]


@dataclass(frozen=True)
class ConceptTarget:
    """f = σ(known_logits[b, position, concept]) (or the logit itself with activation='logit')."""

    position: int | Tensor
    concept: int | Tensor
    activation: str = "sigmoid"

    def __call__(self, out, b: int) -> Tensor:
        z = get_field(out, "known_logits")
        B = z.shape[0]
        rows = torch.arange(B, device=z.device)
        pos = _per_example(self.position, b, z.device).repeat(B // b)
        c = _per_example(self.concept, b, z.device).repeat(B // b)
        v = z[rows, pos, c]
        return torch.sigmoid(v) if self.activation == "sigmoid" else v


@dataclass(frozen=True)
class IGResult:
    """attributions (b, t): per-token IG; f_input, f_baseline (b,); completeness_error (b,) =
    |Σ_t attributions − (f_input − f_baseline)|; steps P."""

    attributions: Tensor
    f_input: Tensor
    f_baseline: Tensor
    completeness_error: Tensor
    steps: int

    @property
    def max_completeness_error(self) -> float:
        return float(self.completeness_error.max())


def integrated_gradients(
    model: ConceptLM,
    input_ids: Tensor,
    target: Callable,
    *,
    steps: int = 32,
    chunk_size: int = 8,
    token_mask: Tensor | None = None,
    baseline_id: int | None = None,
    **forward_kwargs,
) -> IGResult:
    """IG of target(out, b) -> (B,) with respect to the token embeddings of input_ids (b, t).

    token_mask (b, t) bool: which tokens move from the [MASK] baseline (default all); the others
    keep their embedding at every step. baseline_id defaults to model.mask_token_id.
    forward_kwargs go to forward_from_embeddings (e.g. intervene_known=..., positions=...),
    tiled over the steps.
    """
    if steps < 1 or chunk_size < 1:
        raise ValueError(f"steps and chunk_size must be ≥ 1, got {steps}, {chunk_size}")
    b, T = input_ids.shape
    with torch.no_grad():
        x = model.embed(input_ids)  # (b, t, e)
        base_id = model.mask_token_id if baseline_id is None else baseline_id
        x0 = model.embed(torch.full_like(input_ids, base_id))
        if token_mask is not None:
            x0 = torch.where(token_mask.unsqueeze(-1), x0, x)
    x, x0 = x.detach(), x0.detach()
    diff = x - x0

    def tile(v, n: int):
        if isinstance(v, Tensor) and v.ndim >= 1 and v.shape[0] == b:
            return v.repeat(n, *([1] * (v.ndim - 1)))
        if isinstance(v, dict):  # intervention dicts may hold per-position (b, t) values
            return {k: tile(u, n) for k, u in v.items()}
        return v

    def tiled(n: int) -> dict:
        return {k: tile(v, n) for k, v in forward_kwargs.items() if v is not None}

    grad_sum = torch.zeros_like(x)
    alphas = torch.arange(1, steps + 1, dtype=x.dtype, device=x.device) / steps
    for start in range(0, steps, chunk_size):
        a = alphas[start:start + chunk_size]  # (s,)
        s = a.shape[0]
        xs = (x0.unsqueeze(0) + a.view(s, 1, 1, 1) * diff.unsqueeze(0)).reshape(s * b, T, -1)
        xs.requires_grad_(True)
        with torch.enable_grad():
            f = target(model.forward_from_embeddings(xs, **tiled(s)), b)  # (s·b,)
            (g,) = torch.autograd.grad(f.sum(), xs)
        grad_sum += g.reshape(s, b, T, -1).sum(0)
    attributions = (diff * grad_sum / steps).sum(-1)  # (b, t)
    with torch.no_grad():
        f_x = target(model.forward_from_embeddings(x, **tiled(1)), b)
        f_0 = target(model.forward_from_embeddings(x0, **tiled(1)), b)
    err = (attributions.sum(-1) - (f_x - f_0)).abs()
    return IGResult(attributions.detach(), f_x.detach(), f_0.detach(), err.detach(), steps)
