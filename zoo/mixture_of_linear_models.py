"""Mixture of linear models / concept memory (Debot et al. 2024; De Santis et al. 2026):
`zoo/mixture_of_linear_models.pen` and its wrapper."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concept_types import TypedConcepts
from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


class MixtureOutputs(NamedTuple):
    """Task logits, concepts after interventions, concept logits, slot probabilities, slot predictions."""

    y: torch.Tensor
    c: torch.Tensor
    c_logit: torch.Tensor
    pr: torch.Tensor
    v: torch.Tensor


class MixtureOfLinearModels(ConceptModel):
    """A concept predictor c = σ(x W_c + b_c); a selector pr = softmax(x W_s + b_s) over m memory
    slots; in each slot a linear model over the concepts v_m = c E[:, m] + E_b[m];
    y = Σ_m pr_m v_m.

    Index legend: f input feature, k concept, m memory slot, r task output.
    Sizes: f = 2000, k = 8, m = 4, r = 2 (defaults).
    Outputs (y, c after interventions, c_logit, pr[..., m], v[..., m, r]).
    Training: `fit(train, val, mode='joint' | 'independent' | 'sequential')` on (x, c, y).
    Explanation: the selected slot (`slot`, `slot_prob`), its weights `slot_weights[..., k, r]`
    and bias; the parts pr_m c_k E[k, m, r] (parts[..., m, k, r]) plus the bias Σ_m pr_m E_b[m]
    add up to y.

    >>> moe = MixtureOfLinearModels(f=5, k=3, m=2)
    >>> e = moe.explain(torch.randn(2, 5))
    >>> e.slot.shape, e.slot_weights.shape
    (torch.Size([2]), torch.Size([2, 3, 2]))
    """

    diagram_file = "mixture_of_linear_models.pen"
    defaults = {"f": 2000, "k": 8, "m": 4, "r": 2}
    concept_params = ("W_c", "b_c")

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> MixtureOutputs:
        """The diagram's outputs (y, c, c_logit, pr, v); see ConceptModel.forward."""
        return MixtureOutputs(*self._run(x, c_true, do))

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        """parts[..., m, k, r] = pr_m c_k E[k, m, r]; Σ_mk parts + Σ_m pr_m E_b[m] = y."""
        out = self(x, c_true, do)
        E, E_b = self.diagram.E, self.diagram.E_b
        E_mkr = E.permute(1, 0, 2)  # [m, k, r]
        parts = out.pr[..., :, None, None] * out.c[..., None, :, None] * E_mkr
        bias = (out.pr[..., :, None] * E_b).sum(-2)
        slot_prob, slot = out.pr.max(-1)
        details = {
            "concepts": out.c,
            "slot_probs": out.pr,
            "slot": slot,
            "slot_prob": slot_prob,
            "slot_weights": E_mkr[slot],
            "slot_bias": E_b[slot],
            "slot_predictions": out.v,
        }
        return Explanation(out.y, parts, bias, ("m", "k"), details, names=self.concept_names)


class TypedMixtureOfLinearModels(TypedConcepts, MixtureOfLinearModels):
    """Mixture of linear models over binary, categorical and continuous concepts (`TypedConcepts`).

    `TypedMixtureOfLinearModels(f=…, m=…, r=…, concepts={...})`: the concept predictor's columns
    activated by type (sigmoid; softmax over a categorical concept's columns; identity for a
    continuous one), a selector over m memory slots, in each a linear model over the columns.
    Losses, interventions (a categorical concept is set whole), metrics and explanations by type,
    as the typed bottleneck.

    Index legend: f input feature, k concept column, g categorical group, m memory slot,
    r task output. Outputs (y, c, c_logit, pr[..., m], v[..., m, r]).
    """

    diagram_file = "mixture_typed.pen"
    defaults = {"f": 2000, "k": 6, "g": 1, "m": 4, "r": 2}  # k, g: those of `default_concepts`
