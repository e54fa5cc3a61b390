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

The release's steering recipes (steerling 0.2.0: configs/steering.py, inference/causal_diffusion.py)
    `SteeringConfig`: the concepts' embeddings summed into one direction d̂ (unit length), injected
    into the residual stream, α · d̂, after every layer numbered `inject_layer` or later (1-based;
    default n_layers // 2), only at the positions still masked during block diffusion — drawn in
    steerling_injected_hidden.pen / steerling_injected_all_hidden.pen (`injected_hidden`,
    `steered_forward`). α = `mai_lm_target`, divided by the direction's peak LM-head alignment
    max_v W_v·d̂ when `normalize_mai_lm_target` (so it reads in logit units: the top-aligned token's
    logit moves by about mai_lm_target). Schedule `fixed` (always α) or `hard_cutoff` (α while fewer
    than `cutoff_tokens` tokens are committed, then 0). `relu_logit_mask` {concept: strength}
    subtracts Σ strength · relu(W·v_c) from the sampling logits (the tokens the concept promotes).
    Presets: `SteeringConfig.injection(...)` amplifies (hard cutoff, logit units),
    `SteeringConfig.injection_relu(...)` unlearns (negative raw α, fixed, the focal concept's logit
    mask). Generation with them: penrose_zoo.steerling.generate.generate_full (the release's
    sampler) or generate_block_diffusion.

    >>> cfg = SteeringConfig.injection(3, mai_lm_target=8.0, inject_layer=2)      # amplify concept 3
    >>> cfg = SteeringConfig.injection_relu(11, group_concept_ids=[25])          # unlearn concept 11
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from penrose.errors import PenroseShapeError
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
    "SCHEDULES",
    "SteeringConfig",
    "PreparedSteering",
    "prepare_steering",
    "resolve_alpha",
    "position_injection",
    "injected_hidden",
    "steered_forward",
    "concept_top_token_scores",
    "edit_keeping_epsilon",
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
    edit: dict[str, Any] = {f"{kind}_set": {concept: 0.0}}  # known_set or unknown_set
    return Intervention(**edit, positions=positions)


def boost(concept: int, value: float | None = None, scale: float | None = None,
          positions: Tensor | None = None, kind: str = "known") -> Intervention:
    """Set one concept's weight to `value`, or multiply it by `scale` (exactly one of them)."""
    if (value is None) == (scale is None):
        raise ValueError("give exactly one of value= or scale=")
    edit: dict[str, Any] = ({f"{kind}_set": {concept: value}} if value is not None  # {kind}_set or {kind}_scale
                            else {f"{kind}_scale": {concept: scale}})
    return Intervention(**edit, positions=positions)


def current_weights(out, kind: str, concepts: list[int]) -> Tensor:
    """(b, t, j) post-top-k weight of each concept in `concepts` (0 where it is not active)."""
    dense = get_field(out, f"{kind}_weights", required=False)
    if dense is not None:
        return dense[..., list(concepts)]
    ids, w = active_concepts(out, kind)  # (b, t, k)
    want = torch.as_tensor(concepts, device=ids.device)
    hit = ids.unsqueeze(-1) == want  # (b, t, k, j)
    return (w.unsqueeze(-1) * hit.to(w.dtype)).sum(-2)


def intervention_kwargs(spec: Intervention, shape: tuple[int, ...], out=None) -> dict:
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
def edit_keeping_epsilon(model: ConceptLM, out, known_set: Mapping[int, float | Tensor]):
    """`out` with the post-top-k weights of known concepts set, w_c ← v (a float, or a (b, t)
    tensor), ε held at what the unedited pass computed: k̂ += Σ_c (v − w_c) K_c and
    logits += Σ_c (v − w_c) K_c Wᵀ; every other field as in `out`. The concept sum stays linear,
    so concept_attribution of the result is exact (ε's term unchanged). With ε off this is the
    model's own intervention (intervene_known, same values); with ε on it is the edit without
    the release's switch to k̂ + û (which hands the logits to the concept reconstruction alone).
    `out` needs dense known_weights (the compiled model's dense known head)."""
    import dataclasses

    weights = get_field(out, "known_weights")
    ids = torch.tensor([int(c) for c in known_set], dtype=torch.long, device=weights.device)
    K = model.concept_embeddings("known", ids).to(weights.dtype)  # (j, e)
    new_w = weights.clone()
    for c, v in known_set.items():
        new_w[..., int(c)] = torch.as_tensor(v, dtype=weights.dtype, device=weights.device).expand(weights.shape[:-1])
    delta = (new_w - weights)[..., ids]  # (b, t, j)
    dk = delta @ K  # (b, t, e)
    logits = get_field(out, "logits")
    W = model.lm_head_weight()
    changes = {"known_weights": new_w, "known_features": get_field(out, "known_features") + dk,
               "logits": logits + (dk @ W.to(dk.dtype).t()).to(logits.dtype)}
    if dataclasses.is_dataclass(out) and not isinstance(out, type):  # an output record, not its class
        if hasattr(out, "composed") and out.composed is not None:
            changes["composed"] = out.composed + dk
        return dataclasses.replace(out, **changes)
    return {**out, **changes}


def _alignment(model: ConceptLM, concept: int, kind: str = "known") -> Tensor:
    """(v,) W · v̂_c in float32, v̂_c the unit concept embedding (the release's concept_top_tokens)."""
    n = _n_concepts(model, kind)
    cid = _concept_id(concept, n, f"{kind} concept")
    W = model.lm_head_weight()
    v = model.concept_embeddings(kind, torch.tensor([cid], device=W.device))[0].float()
    return W.float() @ (v / (v.norm() + 1e-12))


@torch.no_grad()
def concept_top_tokens(model: ConceptLM, concept: int, k: int = 10, kind: str = "known") -> Tensor:
    """Ids of the k tokens with the largest v_cᵀ W_y (the concept's direct logit effect), v_c taken
    at unit length as the release does (the order is that of the raw embedding)."""
    return _alignment(model, concept, kind).topk(k).indices


@torch.no_grad()
def concept_top_token_scores(model: ConceptLM, concept: int, k: int = 15, tokenizer=None) -> list[tuple]:
    """The release's `SteerlingGenerator.concept_top_tokens(concept_id, k)`: the k tokens the known
    concept most promotes, [(token, alignment W_y · v̂_c)], v̂_c its unit embedding; token is the
    decoded text with a tokenizer, else the id."""
    values, ids = _alignment(model, concept).topk(k)
    return [(tokenizer.decode([int(i)]) if tokenizer is not None else int(i), float(v)) for i, v in zip(ids, values)]


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


# ---------------------------------------------------------------------------------------------
# The release's steering recipes: residual-stream injection and the relu logit mask
# ---------------------------------------------------------------------------------------------

SCHEDULES = ("fixed", "hard_cutoff")


def _concept_id(cid, n: int | None, what: str = "concept") -> int:
    if isinstance(cid, bool) or not isinstance(cid, int) and not (isinstance(cid, Tensor) and cid.numel() == 1
                                                                   and not cid.is_floating_point()):
        raise PenroseShapeError(f"{what} id {cid!r} is not an integer")
    cid = int(cid)
    if cid < 0 or n is not None and cid >= n:
        have = f"; the known head has {n} concepts (0..{n - 1})" if n is not None else ""
        raise PenroseShapeError(f"{what} id {cid} is out of range{have}")
    return cid


def _finite(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not (isinstance(value, Tensor) and value.numel() == 1):
        raise PenroseShapeError(f"{what} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise PenroseShapeError(f"{what} is {v}, not a finite number")
    return v


def _n_concepts(model, kind: str = "known") -> int | None:
    sizes = getattr(model, "sizes", None)
    if isinstance(sizes, dict):
        return sizes["c" if kind == "known" else "u"]
    return None


@dataclass(frozen=True)
class SteeringConfig:
    """The release's `SteeringConfig` (steerling 0.2.0, configs/steering.py), fields and defaults as
    there; see the module docstring. Values are checked here (a non-finite strength, a bad id, an
    unknown schedule raise PenroseShapeError); concept ids against the model in prepare_steering."""

    concept_ids: tuple[int, ...] = ()
    mai_lm_target: float = 0.0
    normalize_mai_lm_target: bool = True
    inject_layer: int | None = None
    inject_alpha_schedule: str = "fixed"
    cutoff_tokens: int = 32
    relu_logit_mask: Mapping[int, float] | None = None

    def __post_init__(self):
        ids = self.concept_ids
        if isinstance(ids, (int, Tensor)) and not isinstance(ids, bool):
            ids = [ids]
        object.__setattr__(self, "concept_ids", tuple(_concept_id(c, None, "steering concept") for c in ids))
        object.__setattr__(self, "mai_lm_target", _finite(self.mai_lm_target, "steering strength mai_lm_target"))
        if not isinstance(self.normalize_mai_lm_target, bool):
            raise PenroseShapeError(f"normalize_mai_lm_target must be True or False, got {self.normalize_mai_lm_target!r}")
        if self.inject_layer is not None:
            if isinstance(self.inject_layer, bool) or not isinstance(self.inject_layer, int) or self.inject_layer < 0:
                raise PenroseShapeError(f"inject_layer must be a whole number >= 0 (or None: n_layers // 2), got {self.inject_layer!r}")
        if self.inject_alpha_schedule not in SCHEDULES:
            raise PenroseShapeError(f"inject_alpha_schedule must be one of {', '.join(SCHEDULES)}, got {self.inject_alpha_schedule!r}")
        if isinstance(self.cutoff_tokens, bool) or not isinstance(self.cutoff_tokens, int) or self.cutoff_tokens < 1:
            raise PenroseShapeError(f"cutoff_tokens must be a whole number >= 1, got {self.cutoff_tokens!r}")
        if self.relu_logit_mask is not None:
            if not isinstance(self.relu_logit_mask, Mapping):
                raise PenroseShapeError(f"relu_logit_mask must be a dict {{concept id: strength}}, got {type(self.relu_logit_mask).__name__}")
            mask = {}
            for c, v in self.relu_logit_mask.items():
                cid = _concept_id(c, None, "relu_logit_mask concept")
                mask[cid] = _finite(v, f"relu_logit_mask strength for concept {cid}")
            object.__setattr__(self, "relu_logit_mask", mask)

    @classmethod
    def injection(cls, concept_ids, mai_lm_target: float = 8.0, inject_layer: int = 8,
                  cutoff_tokens: int = 32) -> "SteeringConfig":
        """Amplify a concept (or several, summed) by positive injection, in logit units, with the
        hard_cutoff schedule (full α for the first cutoff_tokens tokens, then unsteered)."""
        return cls(concept_ids=concept_ids, mai_lm_target=mai_lm_target, normalize_mai_lm_target=True,
                   inject_layer=inject_layer, inject_alpha_schedule="hard_cutoff", cutoff_tokens=cutoff_tokens)

    @classmethod
    def injection_relu(cls, concept_id: int, group_concept_ids=None, mai_lm_target: float = -7.0,
                       inject_layer: int | None = None, relu_strength: float = 20.0) -> "SteeringConfig":
        """Unlearn a concept: negative injection (raw α) of the focal concept plus its group
        (summed into one direction), fixed schedule, and the focal concept's relu logit mask."""
        focal = _concept_id(concept_id, None, "steering concept")
        ids = [focal] + [c for c in (group_concept_ids or []) if _concept_id(c, None, "group concept") != focal]
        return cls(concept_ids=tuple(ids), mai_lm_target=mai_lm_target, normalize_mai_lm_target=False,
                   inject_layer=inject_layer, inject_alpha_schedule="fixed", relu_logit_mask={focal: relu_strength})

    @property
    def has_injection(self) -> bool:
        return bool(self.concept_ids)

    @property
    def has_logit_mask(self) -> bool:
        return bool(self.relu_logit_mask)

    def prepare(self, model) -> "PreparedSteering":
        """prepare_steering(model, self): what the generators call."""
        return prepare_steering(model, self)

    def to_dict(self) -> dict:
        """The fields as the release's model_dump gives them (lists, a plain dict)."""
        return {"concept_ids": list(self.concept_ids), "mai_lm_target": self.mai_lm_target,
                "normalize_mai_lm_target": self.normalize_mai_lm_target, "inject_layer": self.inject_layer,
                "inject_alpha_schedule": self.inject_alpha_schedule, "cutoff_tokens": self.cutoff_tokens,
                "relu_logit_mask": None if self.relu_logit_mask is None else dict(self.relu_logit_mask)}


def resolve_alpha(schedule: str, base_alpha: float, masked_remaining: int, max_new_tokens: int,
                  cutoff_tokens: int) -> float:
    """The injection α now (the release's `_resolve_alpha`): `fixed` always base_alpha;
    `hard_cutoff` base_alpha while committed = max_new_tokens − masked_remaining < cutoff_tokens."""
    if schedule == "fixed":
        return base_alpha
    if schedule == "hard_cutoff":
        committed = max(max_new_tokens, 1) - masked_remaining
        return base_alpha if committed < cutoff_tokens else 0.0
    raise PenroseShapeError(f"unknown inject_alpha_schedule {schedule!r}; one of {', '.join(SCHEDULES)}")


@dataclass(frozen=True)
class PreparedSteering:
    """A SteeringConfig made concrete for a model: the unit direction (e,) in the model's dtype (None
    without concepts), the base α, the injection layer, the schedule, and the (v,) float32 vector
    the relu logit mask subtracts (None without a mask)."""

    config: SteeringConfig
    direction: Tensor | None
    base_alpha: float
    inject_layer: int | None
    peak_alignment: float | None
    relu_suppression: Tensor | None

    def alpha(self, masked_remaining: int, max_new_tokens: int) -> float:
        """α for the next forward pass (0.0 without injection)."""
        if self.direction is None:
            return 0.0
        c = self.config
        return resolve_alpha(c.inject_alpha_schedule, self.base_alpha, masked_remaining, max_new_tokens, c.cutoff_tokens)

    def forward(self, model, input_ids: Tensor, alpha: float, mask_id: int, **intervene):
        """One steered pass (what the generators run): α · direction injected at the positions of
        input_ids holding mask_id; the plain forward when α is 0."""
        if alpha == 0.0 or self.direction is None:
            return model(input_ids, **intervene)
        inj = position_injection(input_ids, self.direction, mask_id)
        return steered_forward(model, input_ids, inj, self.inject_layer, alpha, **intervene)


@torch.no_grad()
def prepare_steering(model, steering: SteeringConfig) -> PreparedSteering:
    """The release's `_prepare_steering` and `_build_relu_mask`: direction d̂ = Σ v_c / ‖Σ v_c‖
    (float32, then the model's dtype), peak = max(max_v W_v·d̂, 1e-6), base α = mai_lm_target / peak
    (normalize_mai_lm_target) or mai_lm_target, inject_layer (default n_layers // 2); relu
    suppression Σ_c strength_c · relu(W·v_c) (float32). Concept ids are checked against the known head."""
    if not isinstance(steering, SteeringConfig):
        raise PenroseShapeError(f"steering must be a SteeringConfig, got {type(steering).__name__}")
    n = _n_concepts(model)
    W = model.lm_head_weight()
    device = W.device
    direction = peak = layer = None
    alpha = 1.0
    if steering.has_injection:
        ids = [_concept_id(c, n, "steering concept") for c in steering.concept_ids]
        emb = model.concept_embeddings("known", torch.tensor(ids, device=device)).float()  # (k, e)
        vec = emb.sum(0)
        d = vec / (vec.norm(p=2) + 1e-12)
        peak = max(float((W.float() @ d).max()), 1e-6)
        alpha = steering.mai_lm_target / peak if steering.normalize_mai_lm_target else steering.mai_lm_target
        layer = steering.inject_layer if steering.inject_layer is not None else model.model_config["n_layers"] // 2
        direction = d.to(getattr(model, "weight_dtype", W.dtype))
    relu = None
    mask = steering.relu_logit_mask
    if mask:  # steering.has_logit_mask
        ids = [_concept_id(c, n, "relu_logit_mask concept") for c in mask]
        strengths = torch.tensor(list(mask.values()), device=device, dtype=torch.float32)
        emb = model.concept_embeddings("known", torch.tensor(ids, device=device)).float()  # (k, e)
        relu = (strengths.unsqueeze(-1) * (emb @ W.float().t()).clamp_min(0.0)).sum(0)  # (v,)
    return PreparedSteering(steering, direction, float(alpha), layer, peak, relu)


def position_injection(input_ids: Tensor, direction: Tensor | None, mask_id: int) -> Tensor | None:
    """(…, t, e): the direction at the masked positions (input_ids == mask_id), 0 elsewhere (the
    release's mask-aligned `_position_injection`); None without a direction."""
    if direction is None:
        return None
    masked = input_ids == mask_id
    inj = torch.zeros(*input_ids.shape, direction.shape[-1], dtype=direction.dtype, device=input_ids.device)
    inj[masked] = direction.to(input_ids.device)
    return inj


# The compiled injection diagrams, per model and number of unsteered layers, run on the model's
# parameters (torch.func.functional_call; by name: layers.i of steerling.pen, and injected.k.layer.*
# is layers.(Lpre + k)). Not entries of model.net: their instances are named apart from `layers`.
_INJECTED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _model_name(name: str, pre: int) -> str:
    if name.startswith("injected."):
        _, k, rest = name.split(".", 2)
        return f"layers.{pre + int(k)}.{rest.removeprefix('layer.')}"
    return name


def _injected_net(model, pre: int):
    import penrose
    from penrose_zoo.steerling.config import HERE
    from penrose_zoo.steerling.model import _skip_init

    if model.variant != "block_causal":
        raise PenroseShapeError("residual-stream injection is the release's block-diffusion recipe: it injects at the "
                                "still-masked positions, which the causal (autoregressive) variant does not have")
    cache = _INJECTED.setdefault(model, {})
    entry = cache.get(pre)
    if entry is None:
        extra: dict[str, Any]
        path, extra = ((HERE / "steerling_injected_all_hidden.pen", {}) if pre == 0
                       else (HERE / "steerling_injected_hidden.pen", {"Lpre": pre}))
        with torch.device("meta"), _skip_init():
            net = penrose.compile(path, **model.sizes, **extra)
        entry = cache[pre] = (net, [(n, _model_name(n, pre)) for n, _ in net.named_parameters()])
    net, names = entry
    # run on the model's own parameters (looked up every call: follows .to() and
    # load_state_dict(assign=True)); the compiled net keeps only meta placeholders
    params = {name: model.net.get_parameter(source) for name, source in names}
    net.train(model.training)
    return lambda **inputs: torch.func.functional_call(net, params, (), inputs, strict=True)


def injected_hidden(model, input_ids: Tensor, injection: Tensor, inject_layer: int, alpha: float = 1.0) -> Tensor | None:
    """The hidden state h with `alpha · injection` ((…, t, e), like the ids plus a leg e) added to the
    residual stream after every layer i (1-based) with i ≥ inject_layer, through the diagram
    steerling_injected_hidden.pen (or steerling_injected_all_hidden.pen when inject_layer ≤ 1).
    None when no layer is injected (inject_layer > n_layers): h is then the model's own."""
    model.check_input_ids(input_ids)
    alpha = _finite(alpha, "injection alpha")
    if isinstance(inject_layer, bool) or not isinstance(inject_layer, int) or inject_layer < 0:
        raise PenroseShapeError(f"inject_layer must be a whole number >= 0, got {inject_layer!r}")
    want = (*input_ids.shape, model.sizes["e"])
    if not isinstance(injection, Tensor) or not injection.is_floating_point() or tuple(injection.shape) != want:
        raise PenroseShapeError(f"the injection must be float {want} (the token ids' shape plus the embedding), got "
                                f"{tuple(injection.shape) if isinstance(injection, Tensor) else type(injection).__name__}")
    pre = max(inject_layer - 1, 0)
    if pre >= model.sizes["L"]:
        return None
    net = _injected_net(model, pre)
    inj = alpha * injection.to(device=input_ids.device, dtype=model.weight_dtype)  # the release adds alpha * injection
    return net(ids=input_ids, inj=inj)


def steered_forward(model, input_ids: Tensor, injection: Tensor | None = None, inject_layer: int | None = None,
                    alpha: float = 1.0, **intervene):
    """`model(input_ids, **intervene)` with the release's residual-stream injection (the
    `position_injection`, `steering_inject_layer`, `steering_inject_alpha` of its forward): the
    injected hidden state, then the concept module and LM head as in `Steerling.forward`
    (`concepts_from_hidden`). Without an injection (or a layer) it is the plain forward."""
    if injection is None or inject_layer is None:
        return model(input_ids, **intervene)
    h = injected_hidden(model, input_ids, injection, inject_layer, alpha)
    if h is None:
        return model(input_ids, **intervene)
    return model.concepts_from_hidden(h, **intervene)
