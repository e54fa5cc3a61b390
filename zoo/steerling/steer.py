"""Concept steering: clamp, rescale or set concept weights at chosen positions, and measure it.

Index legend: b batch, t position, v vocabulary, e embedding.

Model protocol: `ConceptLM` in penrose_zoo.steerling.attribution. This module uses embed,
forward_from_embeddings with intervene_known / intervene_unknown / positions (the form of
Steerling.forward), concept_embeddings and lm_head_weight; output fields logits and the
known/unknown weights.

Interventions (`Intervention`)
    A spec: for known and for unknown concepts, `set` {concept id: value} (0.0 clamps the
    concept off) and `scale` {concept id: factor} on the post-top-k weight, at `positions`
    ((b, t) bool; None = every position). `intervention_kwargs` turns a spec into the model's
    keywords: {concept id: value} dicts and positions. A pure `set` spec gives float values,
    exactly what Steerling.forward takes. A scale is resolved against an unsteered forward pass
    into per-position values, factor × current weight, as a (b, t) tensor (a concept outside the
    top-k has weight 0 and stays 0; use `set` to switch one on).

    ε: as in the release, a non-empty intervene_known switches ε off, so the LM head reads
    k̂ + û. An unknown-only edit leaves ε on in the release, and ε = h − (û + k̂) is computed
    from the edited û, so the edit cancels out of the logits. A spec that edits only unknown
    concepts therefore also passes a no-op known edit (known concept 0 set to its current
    weight), which switches ε off, unless `keep_epsilon=True`.

Effect size (`steering_effect`)
    A concept's top tokens are the `top_tokens` largest entries of v_cᵀ Wᵀ (what it pushes up
    through the LM head). On prompts, at the chosen positions, the probability mass
    softmax(logits) puts on those tokens is averaged for: unsteered, null (no-op known edit, ε
    off), suppressed (set 0) and boosted (set `boost_value`, or scale by `boost_scale`).
    Effects are measured against null, so ε's removal is not counted as the concept's effect.
    Suppression should lower the mass, boosting raise it.

    >>> spec = Intervention(known_set={3: 0.0})           # clamp known concept 3 off
    >>> spec = Intervention(known_scale={3: 2.0}, positions=None)   # double it everywhere
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import Tensor

from penrose_zoo.steerling.attribution import ConceptLM, active_concepts, forward_ids
from penrose_zoo.steerling.losses import get_field

__all__ = [
    "Intervention",
    "suppress",
    "boost",
    "current_weights",
    "intervention_kwargs",
    "null_intervention_kwargs",
    "steer",
    "concept_top_tokens",
    "SteeringEffect",
    "steering_effect",
]


@dataclass(frozen=True)
class Intervention:
    """Concept edits at `positions` ((b, t) bool or None for all). A concept may appear in `set`
    or in `scale` of its kind, not both."""

    known_set: Mapping[int, float] = field(default_factory=dict)
    known_scale: Mapping[int, float] = field(default_factory=dict)
    unknown_set: Mapping[int, float] = field(default_factory=dict)
    unknown_scale: Mapping[int, float] = field(default_factory=dict)
    positions: Tensor | None = None
    keep_epsilon: bool = False

    def __post_init__(self):
        for kind in ("known", "unknown"):
            both = set(getattr(self, f"{kind}_set")) & set(getattr(self, f"{kind}_scale"))
            if both:
                raise ValueError(f"{kind} concepts {sorted(both)} are both set and scaled")

    def touches(self, kind: str) -> bool:
        return bool(getattr(self, f"{kind}_set") or getattr(self, f"{kind}_scale"))

    @property
    def needs_current_weights(self) -> bool:
        """Whether intervention_kwargs needs the unsteered output."""
        unknown_only = self.touches("unknown") and not self.touches("known") and not self.keep_epsilon
        return bool(self.known_scale or self.unknown_scale or unknown_only)


def suppress(concept: int, positions: Tensor | None = None, kind: str = "known") -> Intervention:
    """Clamp one concept's weight to 0."""
    return Intervention(**{f"{kind}_set": {concept: 0.0}}, positions=positions)


def boost(concept: int, value: float | None = None, scale: float | None = None,
          positions: Tensor | None = None, kind: str = "known") -> Intervention:
    """Set one concept's weight to `value`, or multiply it by `scale` (exactly one of them)."""
    if (value is None) == (scale is None):
        raise ValueError("give exactly one of value= or scale=")
    if value is not None:
        return Intervention(**{f"{kind}_set": {concept: value}}, positions=positions)
    return Intervention(**{f"{kind}_scale": {concept: scale}}, positions=positions)


def current_weights(out, kind: str, concepts: list[int]) -> Tensor:
    """(b, t, j) post-top-k weight of each concept in `concepts` (0 where it is not active)."""
    dense = get_field(out, f"{kind}_weights", required=False)
    if dense is not None:
        return dense[..., list(concepts)]
    ids, w = active_concepts(out, kind)  # (b, t, k)
    want = torch.as_tensor(concepts, device=ids.device)
    hit = ids.unsqueeze(-1) == want  # (b, t, k, j)
    return (w.unsqueeze(-1) * hit.to(w.dtype)).sum(-2)


def intervention_kwargs(spec: Intervention, shape: tuple[int, int], out=None) -> dict:
    """forward_from_embeddings keywords (intervene_known, intervene_unknown, positions) for a spec
    on sequences of `shape` (b, t). `out` (the unsteered output) is needed when
    spec.needs_current_weights."""
    b, T = shape
    if spec.positions is not None and tuple(spec.positions.shape) != (b, T):
        raise ValueError(f"positions has shape {tuple(spec.positions.shape)}, expected {(b, T)}")
    if spec.needs_current_weights and out is None:
        raise ValueError("this spec (a scale, or an unknown-only edit that switches ε off) needs "
                         "the unsteered output `out` to read the current weights")
    kw: dict = {}
    for kind in ("known", "unknown"):
        sets, scales = getattr(spec, f"{kind}_set"), getattr(spec, f"{kind}_scale")
        if not sets and not scales:
            continue
        values: dict = {int(c): float(v) for c, v in sets.items()}
        if scales:
            cur = current_weights(out, kind, [int(c) for c in scales])  # (b, t, j)
            for j, (c, f) in enumerate(scales.items()):
                values[int(c)] = cur[..., j].detach().float() * float(f)
        kw[f"intervene_{kind}"] = values
    if "intervene_unknown" in kw and "intervene_known" not in kw and not spec.keep_epsilon:
        kw["intervene_known"] = {0: current_weights(out, "known", [0])[..., 0].detach().float()}
    if kw and spec.positions is not None:
        kw["positions"] = spec.positions
    return kw


def null_intervention_kwargs(out) -> dict:
    """A no-op known edit (concept 0 set to its current weight): weights unchanged, ε off."""
    return {"intervene_known": {0: current_weights(out, "known", [0])[..., 0].detach().float()}}


@torch.no_grad()
def steer(model: ConceptLM, input_ids: Tensor, spec: Intervention):
    """The model's output on input_ids under the intervention `spec`."""
    out = forward_ids(model, input_ids) if spec.needs_current_weights else None
    return forward_ids(model, input_ids, **intervention_kwargs(spec, tuple(input_ids.shape), out))


@torch.no_grad()
def concept_top_tokens(model: ConceptLM, concept: int, k: int = 10, kind: str = "known") -> Tensor:
    """Ids of the k tokens with the largest v_cᵀ W_y (the concept's direct logit effect)."""
    W = model.lm_head_weight()
    v = model.concept_embeddings(kind, torch.tensor([concept], device=W.device))[0]
    return (W @ v.to(W.dtype)).topk(k).indices


@dataclass(frozen=True)
class SteeringEffect:
    """Mean probability mass on the concept's top tokens at the measured positions."""

    concept: int
    top_tokens: Tensor
    mass_unsteered: float
    mass_null: float
    mass_suppressed: float
    mass_boosted: float

    @property
    def suppress_effect(self) -> float:
        """mass_suppressed − mass_null (negative when suppression works)."""
        return self.mass_suppressed - self.mass_null

    @property
    def boost_effect(self) -> float:
        """mass_boosted − mass_null (positive when boosting works)."""
        return self.mass_boosted - self.mass_null


@torch.no_grad()
def steering_effect(
    model: ConceptLM,
    input_ids: Tensor,
    concept: int,
    *,
    kind: str = "known",
    positions: Tensor | None = None,
    top_tokens: int = 10,
    boost_value: float | None = 1.0,
    boost_scale: float | None = None,
) -> SteeringEffect:
    """Suppress / boost `concept` at `positions` (default all) of held-out prompts input_ids
    (b, t) and measure the mass on its top tokens at those positions (see the module doc)."""
    b, T = input_ids.shape
    pos = torch.ones(b, T, dtype=torch.bool, device=input_ids.device) if positions is None else positions
    top = concept_top_tokens(model, concept, top_tokens, kind)

    def mass(out) -> float:
        p = torch.softmax(get_field(out, "logits").float(), -1)[..., top].sum(-1)  # (b, t)
        return float(p[pos].mean())

    clean = forward_ids(model, input_ids)
    null = forward_ids(model, input_ids, **null_intervention_kwargs(clean))
    sup = forward_ids(model, input_ids, **intervention_kwargs(suppress(concept, positions, kind), (b, T), clean))
    if boost_scale is not None:
        spec = boost(concept, scale=boost_scale, positions=positions, kind=kind)
    else:
        spec = boost(concept, value=boost_value, positions=positions, kind=kind)
    bst = forward_ids(model, input_ids, **intervention_kwargs(spec, (b, T), clean))
    return SteeringEffect(concept, top, mass(clean), mass(null), mass(sup), mass(bst))
