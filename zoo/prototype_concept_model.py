"""Prototype concept map (Chen et al. 2019; Colamonaco et al. 2026) with a linear task predictor:
`zoo/prototype_concept_model.pen` and its wrapper."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


class PrototypeConceptOutputs(NamedTuple):
    """Task logits, concepts after / before interventions, prototype probabilities, cosines."""

    y: torch.Tensor
    c: torch.Tensor
    c_pred: torch.Tensor
    probs: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the diagram's name)


class PrototypeConceptModel(ConceptModel):
    """Concepts from labelled prototypes: cosine similarity of x to each prototype, a softmax over
    the p prototypes of each concept (scaled by the learnt `scale`), and the convex combination
    of the prototype labels pi; then a linear task predictor over the concepts.

    Index legend: f input feature, p prototype, k concept, r task output.
    Sizes: f = 2000, p = 4, k = 8, r = 2 (defaults). Prototype labels: the first ⌈p/2⌉
    prototypes of each concept are labelled 1, the rest 0; `init_prototypes(x, c)` places each
    at the mean of a few training examples with that label.
    Outputs (y, c after interventions, c_pred before, probs[..., p, k], l[..., p, k] cosines).
    Explanation: the most similar prototypes of each concept (`top_prototypes`, their
    probabilities, similarities and labels), `concept_parts` = probs · pi (Σ_p = c_pred), and
    the task parts c_k W_y[k, r]; Σ_k parts + b_y = y.

    >>> m = PrototypeConceptModel(f=5, p=2, k=3)
    >>> m.diagram.pi[:, 0].tolist()
    [1.0, 0.0]
    """

    diagram_file = "prototype_concept_model.pen"
    defaults = {"f": 2000, "p": 4, "k": 8, "r": 2}
    concept_params = ("P", "scale")

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> PrototypeConceptOutputs:
        """The diagram's outputs (y, c, c_pred, probs, l); see ConceptModel.forward."""
        return PrototypeConceptOutputs(*self._run(x, c_true, do))

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        n_pos = (self.sizes["p"] + 1) // 2
        with torch.no_grad():
            self.diagram.pi.zero_()
            self.diagram.pi[:n_pos] = 1.0

    @torch.no_grad()
    def init_prototypes(self, x: torch.Tensor, c: torch.Tensor, per_prototype: int = 8, seed: int = 0) -> None:
        """Place each prototype at the mean of `per_prototype` random examples whose label for its
        concept equals the prototype's label (a concept lacking such examples keeps its init)."""
        g = torch.Generator().manual_seed(seed)
        P, pi = self.diagram.P, self.diagram.pi
        for k in range(self.sizes["k"]):
            for j in range(self.sizes["p"]):
                rows = ((c[:, k] > 0.5) == (pi[j, k] > 0.5)).nonzero().flatten()
                if len(rows) == 0:
                    continue
                pick = rows[torch.randperm(len(rows), generator=g)[:per_prototype]]
                P[:, j, k] = x[pick].mean(0).to(P.dtype)

    def concept_loss_terms(self, out: Any, c_true: torch.Tensor) -> torch.Tensor:
        c = out.c_pred.clamp(1e-6, 1 - 1e-6)
        return torch.nn.functional.binary_cross_entropy(c, c_true.to(c.dtype), reduction="none")

    def concept_scores(self, out: Any) -> torch.Tensor:
        return out.c_pred

    def concept_probabilities(self, out: Any) -> torch.Tensor:
        return out.c_pred

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None,
                top: int = 1) -> Explanation:
        """Task parts[..., k, r] = c_k W_y[k, r] (Σ_k parts + b_y = y), and per concept the `top`
        most similar prototypes (`top_prototypes[..., top, k]`)."""
        out = self(x, c_true, do)
        W_y, pi = self.diagram.W_y, self.diagram.pi
        top_probs, top_idx = out.probs.topk(min(top, self.sizes["p"]), dim=-2)
        details = {
            "concepts": out.c,
            "weights": W_y,
            "prototype_probs": out.probs,
            "similarity": out.l,
            "concept_parts": out.probs * pi,
            "top_prototypes": top_idx,
            "top_probs": top_probs,
            "top_similarity": out.l.gather(-2, top_idx),
            "top_labels": pi.expand_as(out.probs).gather(-2, top_idx),
        }
        return Explanation(out.y, out.c[..., :, None] * W_y, self.diagram.b_y, ("k",), details,
                           names=self.concept_names)
