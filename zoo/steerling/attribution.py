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

Faithful concept attribution of a generation (`attribute_generation`, the release's
FaithfulConceptAttributor / AttributionAccumulator, steerling 0.2.0 attribution/concept_attribution.py)
    Each generated token is attributed in the forward pass that committed it (the partly masked
    input diffusion saw then, steering included), not in a pass over the finished text: during
    penrose_zoo.steerling.generate.generate_full a step callback takes, at the committed
    positions, the token's logit, the known top-k (ids, logits) and the unknown top-k computed
    from the hidden state, and records C(c_i, y) = σ(l_i) · (v_iᵀ W_y) for each, the rest of the
    logit (ε and the concepts outside the top-k) as the residual, so the parts sum to the logit.
    `GenerationAttribution`: the (1, T, k) tensors, `verify(atol)`, `coverage` (the fraction of
    the T positions committed: the prompt never is), `top_k(k)`, `chunk(start, end)` (the
    release's chunk_attribution: per position each contribution over the position's total
    absolute mass, summed per concept, over the chunk's length) and `to_rows()` /
    `to_dataframe()`. The commit records (with their concept lists) are the output's trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

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
    "VerificationResult",
    "GenerationAttribution",
    "FaithfulAttribution",
    "attribute_generation",
    "find_chunk_boundaries",
    "unknown_topk",
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



# ---------------------------------------------------------------------------------------------
# Faithful concept attribution of a generation (the release's FaithfulConceptAttributor)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerificationResult:
    """Whether the contributions sum to the target logits (the release's VerificationResult)."""

    passed: bool
    max_abs_error: float
    error_percentiles: dict
    details: str

    def __repr__(self) -> str:
        return f"VerificationResult({'PASS' if self.passed else 'FAIL'}, {self.details})"


@dataclass(frozen=True)
class GenerationAttribution:
    """Token-level attribution of a generation's committed logits to concepts (the release's
    OutputToConceptAttribution), batch first (B = 1): target_token_ids, target_logits (1, T);
    known_indices, known_weights (σ), known_contributions (1, T, k_known); unk_* likewise
    (1, T, k_unk); epsilon_contribution (1, T) the rest of each logit; committed (1, T) bool;
    commit_step (T,) the denoising step of each commit (−2: never). Uncommitted positions are 0."""

    target_token_ids: Tensor
    target_logits: Tensor
    known_indices: Tensor
    known_weights: Tensor
    known_contributions: Tensor
    unk_indices: Tensor
    unk_weights: Tensor
    unk_contributions: Tensor
    epsilon_contribution: Tensor
    committed: Tensor
    commit_step: Tensor | None = None

    def verify(self, atol: float = 1e-4) -> VerificationResult:
        """Known + unknown + residual against the target logits, at every position."""
        errors = (self.known_contributions.sum(-1) + self.unk_contributions.sum(-1) + self.epsilon_contribution
                  - self.target_logits).abs()
        return VerificationResult(
            passed=bool((errors < atol).all()), max_abs_error=float(errors.max()),
            error_percentiles={"p50": float(errors.median()), "p95": float(errors.quantile(0.95)),
                               "p99": float(errors.quantile(0.99))},
            details=f"Max error: {errors.max():.6f}, Mean: {errors.mean():.6f}")

    @property
    def coverage(self) -> float:
        """The fraction of positions (prompt included) that were committed."""
        return float(self.committed.float().mean())

    def top_k(self, k: int) -> "GenerationAttribution":
        """Only the k concepts of each kind with the largest |contribution| per position."""
        parts = {}
        for kind in ("known", "unk"):
            idx, w, c = (getattr(self, f"{kind}_{f}") for f in ("indices", "weights", "contributions"))
            kk = min(k, c.shape[-1])
            if kk > 0:
                sel = c.abs().topk(kk, dim=-1).indices
                idx, w, c = idx.gather(-1, sel), w.gather(-1, sel), c.gather(-1, sel)
            parts.update({f"{kind}_indices": idx, f"{kind}_weights": w, f"{kind}_contributions": c})
        return GenerationAttribution(self.target_token_ids, self.target_logits, epsilon_contribution=self.epsilon_contribution,
                                     committed=self.committed, commit_step=self.commit_step, **parts)

    def to_rows(self) -> list[dict]:
        """One dict per (committed position, concept): the release's to_dataframe rows."""
        rows = []
        B, T = self.target_token_ids.shape
        for b in range(B):
            for t in range(T):
                if not self.committed[b, t]:
                    continue
                common = {"batch": b, "position": t, "target_token_id": int(self.target_token_ids[b, t]),
                          "target_logit": float(self.target_logits[b, t])}
                eps = float(self.epsilon_contribution[b, t])
                for kind, label in (("known", "known"), ("unk", "discovered")):
                    for i in range(getattr(self, f"{kind}_indices").shape[-1]):
                        rows.append({**common, "concept_type": label,
                                     "concept_id": int(getattr(self, f"{kind}_indices")[b, t, i]),
                                     "weight": float(getattr(self, f"{kind}_weights")[b, t, i]),
                                     "contribution": float(getattr(self, f"{kind}_contributions")[b, t, i]),
                                     "epsilon": eps})
        return rows

    def to_dataframe(self):
        """`to_rows()` as a pandas DataFrame (pandas needed)."""
        import pandas as pd

        return pd.DataFrame(self.to_rows())

    def chunk(self, start: int, end: int, *, batch: int = 0, catalog=None, num_known_concepts: int = 0) -> tuple[list[dict], float]:
        """The release's chunk_attribution over positions [start, end): per committed position each
        contribution over that position's total |known| + |unknown| + |residual|, summed per
        concept and divided by the chunk's length; entries {label, type, contribution,
        concept_id, head} sorted by |contribution|, and the residual's mean share in percent.
        Labels from `catalog` (a ConceptCatalog, per-head ids), else the release's fallback
        ("Known: #id", "Discovered: #(id + num_known_concepts)")."""
        mask = self.committed[batch, start:end]
        k_idx, k_c = self.known_indices[batch, start:end][mask], self.known_contributions[batch, start:end][mask]
        u_idx, u_c = self.unk_indices[batch, start:end][mask], self.unk_contributions[batch, start:end][mask]
        eps = self.epsilon_contribution[batch, start:end][mask]
        total = (k_c.abs().sum(-1) + u_c.abs().sum(-1) + eps.abs()).clamp(min=1e-8)

        def aggregate(idx, contrib):
            ids, inverse = idx.reshape(-1).unique(return_inverse=True)
            mass = torch.zeros(len(ids), device=idx.device)
            mass.scatter_add_(0, inverse, contrib.reshape(-1).to(mass.dtype))
            return ids, mass

        T = end - start
        entries: list[dict[str, Any]] = []
        for kind, head, idx, c in (("known", "known", k_idx, k_c), ("discovered", "unknown", u_idx, u_c)):
            for cid, mass in zip(*(v.tolist() for v in aggregate(idx, c / total.unsqueeze(-1)))):
                entries.append({"label": _label(catalog, int(cid), head, num_known_concepts), "type": kind,
                                "contribution": float(mass) / T, "concept_id": int(cid), "head": head})
        entries.sort(key=lambda e: abs(e["contribution"]), reverse=True)
        return entries, float((eps / total).mean()) * 100


def _label(catalog, cid: int, head: str, num_known: int) -> str:
    prefix = "Known" if head == "known" else "Discovered"
    if catalog is not None:
        try:
            return f"{prefix}: {catalog.get(cid, head=head).name}"
        except LookupError:
            pass
    return f"{prefix}: #{cid if head == 'known' else cid + num_known}"


def find_chunk_boundaries(token_ids: list[int], eoc_id: int, *, start_index: int = 0, stop_ids=None,
                          include_final_chunk: bool = False) -> list[tuple[int, int]]:
    """Half-open [start, end) chunks of token_ids split at end-of-chunk ids, from start_index,
    cut at the first stop id (the release's find_chunk_boundaries): a chunk closed by a stop id
    is kept; the trailing unterminated one only with include_final_chunk."""
    stops = frozenset(stop_ids or ())
    end, hit_stop = len(token_ids), False
    for i in range(start_index, end):
        if token_ids[i] in stops:
            end, hit_stop = i, True
            break
    chunks, prev = [], start_index
    for b in (i for i in range(start_index, end) if token_ids[i] == eoc_id):
        chunks.append((prev, b))
        prev = b + 1
    if prev < end and (hit_stop or include_final_chunk):
        chunks.append((prev, end))
    return chunks


def unknown_topk(out, k: int) -> tuple[Tensor, Tensor]:
    """(logits, ids) (…, t, k) of the k best unknown concepts per position, ranked as the head
    ranks them (the release's streaming top-k, `linear_features_topk_factorized`, for attribution)."""
    if k == getattr(out, "topk_unknown", None):
        return out.unknown_topk_logits, out.unknown_topk_indices
    if getattr(out, "unknown_select", None) is not None and out.unknown_logits is None:
        return out.unknown_select(k)
    ids = out._unknown_ranked(k)
    return out.unknown_logits.gather(-1, ids), ids


@dataclass(frozen=True)
class FaithfulAttribution:
    """What attribute_generation returns: the generation (its trace's records carry the concept
    lists), the attribution, and per chunk of the generation (entries, residual percent)."""

    output: object
    attribution: GenerationAttribution
    chunks: list

    @property
    def trace(self):
        return self.output.trace


@torch.no_grad()
def attribute_generation(model, prompt, config=None, *, steering=None, unknown_topk_k: int | None = None,
                         tokenizer=None, catalog=None, mask_id: int | None = None, eos_id: int | None = None,
                         pad_id: int | None = None, eot_id: int | None = None, eoc_id: int | None = None) -> FaithfulAttribution:
    """Generate with penrose_zoo.steerling.generate.generate_full (the release's sampler, steering
    optional) and attribute every committed token to concepts in the pass that committed it (see
    the module docstring). unknown_topk_k: unknown concepts kept per token (default the head's
    top-k, as the release). Chunks split at end-of-chunk (`eoc_id`, default the tokenizer's)."""
    from penrose_zoo.steerling.generate import CommitRecord, DiffusionTrace, GenerationConfig, GenerationOutput, generate_full

    config = GenerationConfig(max_new_tokens=128, steps=128) if config is None else config
    ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
    T = ids.numel() + config.max_new_tokens
    k_known, k_unk = model.sizes["kc"], model.sizes["ku"] if unknown_topk_k is None else min(int(unknown_topk_k), model.sizes["u"])
    if k_unk < 1:
        raise ValueError(f"unknown_topk_k must be >= 1, got {unknown_topk_k}")
    W = model.lm_head_weight()
    device = W.device
    buf = {
        "target_token_ids": torch.zeros(1, T, dtype=torch.long, device=device),
        "target_logits": torch.zeros(1, T, device=device),
        "known_indices": torch.zeros(1, T, k_known, dtype=torch.long, device=device),
        "known_weights": torch.zeros(1, T, k_known, device=device),
        "known_contributions": torch.zeros(1, T, k_known, device=device),
        "unk_indices": torch.zeros(1, T, k_unk, dtype=torch.long, device=device),
        "unk_weights": torch.zeros(1, T, k_unk, device=device),
        "unk_contributions": torch.zeros(1, T, k_unk, device=device),
        "epsilon_contribution": torch.zeros(1, T, device=device),
    }
    committed = torch.zeros(T, dtype=torch.bool, device=device)
    step_of = torch.full((T,), -2, dtype=torch.long, device=device)
    records: list = []

    def on_commit(info) -> None:
        pos, tids, out = info.committed_positions, info.committed_token_ids, info.outputs
        target = info.logits[0, pos].gather(-1, tids.unsqueeze(-1)).squeeze(-1).float()
        k_idx, k_lgt = out.known_topk_indices[0, pos], out.known_topk_logits[0, pos]
        u_lgt, u_idx = unknown_topk(out, k_unk)
        u_lgt, u_idx = u_lgt[0, pos], u_idx[0, pos]
        W_y = W[tids].float()  # (p, e)
        k_w = torch.sigmoid(k_lgt.float())
        k_c = k_w * torch.einsum("pkd,pd->pk", model.concept_embeddings("known", k_idx).float(), W_y)
        u_w = torch.sigmoid(u_lgt.float())
        u_c = u_w * torch.einsum("pkd,pd->pk", model.concept_embeddings("unknown", u_idx).float(), W_y)
        for name, v in (("target_token_ids", tids), ("target_logits", target), ("known_indices", k_idx),
                        ("known_weights", k_w), ("known_contributions", k_c), ("unk_indices", u_idx),
                        ("unk_weights", u_w), ("unk_contributions", u_c),
                        ("epsilon_contribution", target - k_c.sum(-1) - u_c.sum(-1))):  # the rest, exact by linearity
            buf[name][0, pos] = v.to(buf[name].dtype)
        committed[pos] = True
        step_of[pos] = info.step
        records.append(CommitRecord(len(records), info.step, pos, tids, target, k_idx, k_lgt, u_idx, u_lgt))

    if tokenizer is None and None in (mask_id, eos_id, pad_id):
        from penrose_zoo.steerling.tokenizer import tokenizer_for

        tokenizer = tokenizer_for(model, vocab_size=model.vocab_size)
    gen = generate_full(model, ids, config, steering=steering, tokenizer=tokenizer, mask_id=mask_id, eos_id=eos_id,
                        pad_id=pad_id, eot_id=eot_id, step_callback=on_commit)
    if config.cfg_scale == 0.0:  # the trace with each commit's concept lists
        t = gen.trace
        gen = GenerationOutput(gen.tokens, gen.prompt_tokens, gen.generated,
                               DiffusionTrace(t.prompt_ids, t.prompt_len, t.seq_length, t.mask_id, t.eos_id, records),
                               gen.alphas)
    attr = GenerationAttribution(committed=committed.unsqueeze(0), commit_step=step_of, **buf)
    if eoc_id is None:
        eoc_id = getattr(tokenizer, "eoc_id", None) if tokenizer is not None else None
    eot = eot_id if eot_id is not None else getattr(tokenizer, "eot_id", None) if tokenizer is not None else None
    spans = find_chunk_boundaries(gen.tokens.tolist(), eoc_id if eoc_id is not None else -1, start_index=gen.prompt_tokens,
                                  stop_ids=[eot] if eot is not None else None, include_final_chunk=True)
    chunks = [attr.chunk(a, b, catalog=catalog, num_known_concepts=model.sizes["c"]) for a, b in spans]
    return FaithfulAttribution(gen, attr, chunks)
