"""Concept embedding model (Espinosa Zarlenga et al. 2022): `zoo/concept_embedding_model.pen`."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concept_types import TypedConcepts
from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


class ConceptEmbeddingOutputs(NamedTuple):
    """Task logits, concept probabilities after interventions, their logits, concept embeddings."""

    y: torch.Tensor
    p: torch.Tensor
    p_logit: torch.Tensor
    c_emb: torch.Tensor


class ConceptEmbeddingModel(ConceptModel):
    """Concept embedding bottleneck + concept embedding predictor, with RandInt.

    For each concept k: u_pos = leaky_relu(x W_pos + b_pos), u_neg likewise (e-dim embeddings);
    p = σ(u_pos·S_pos + u_neg·S_neg + b_s) (one scoring function shared by all concepts);
    c_emb = p u_pos + (1 − p) u_neg; y = Σ_ke c_emb W_y + b_y.

    Index legend: f input feature, k concept, e concept embedding, r task output.
    Sizes: f = 2000, k = 8, e = 16, r = 2 (defaults).
    Outputs (y, p after interventions, p_logit before, c_emb[..., k, e]).
    RandInt: in training mode, when true concepts are given and no mask is, each concept's
    probability is replaced by its true label with probability `p_int` (default 0.25).
    Training: `fit(train, val)` (joint: task + concept_weight × concept BCE, with RandInt).
    Explanation: concept probabilities p, concept embeddings, and the parts
    Σ_e c_emb[k, e] W_y[k, e, r]; Σ_k parts + b_y = y.

    >>> cem = ConceptEmbeddingModel(f=5, k=3, e=4)
    >>> cem.intervene(torch.randn(2, 5), ["c0"], [0.0]).p[:, 0].tolist()
    [0.0, 0.0]
    """

    diagram_file = "concept_embedding_model.pen"
    defaults = {"f": 2000, "k": 8, "e": 16, "r": 2}
    concept_params = ("W_pos", "b_pos", "W_neg", "b_neg", "S_pos", "S_neg", "b_s")
    modes = ("joint", "sequential")

    default_p_int = 0.25

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> ConceptEmbeddingOutputs:
        """The diagram's outputs (y, p, p_logit, c_emb); see ConceptModel.forward."""
        return ConceptEmbeddingOutputs(*self._run(x, c_true, do))

    def concept_scores(self, out: Any) -> torch.Tensor:
        return out.p_logit

    def bottleneck(self, out: Any) -> torch.Tensor:
        return out.p

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        """Concept contributions parts[..., k, r] = Σ_e c_emb W_y; Σ_k parts + b_y = y."""
        out = self(x, c_true, do)
        W_y = self.diagram.W_y
        parts = torch.einsum("...ke,ker->...kr", out.c_emb, W_y)
        return Explanation(out.y, parts, self.diagram.b_y, ("k",),
                           {"concepts": out.p, "concept_embeddings": out.c_emb, "weights": W_y},
                           names=self.concept_names)


class TypedConceptEmbeddingModel(TypedConcepts, ConceptEmbeddingModel):
    """Concept embedding model over binary, categorical and continuous concepts (`TypedConcepts`).

    `TypedConceptEmbeddingModel(f=…, e=…, r=…, concepts={"red": "binary", "size": ["s", "m",
    "l"], "weight": "continuous"})`: a positive and a negative embedding per concept column, a
    shared score per column activated by type (sigmoid; softmax over a categorical concept's
    columns; identity for a continuous one), and c_emb = u_neg + p (u_pos − u_neg) mixed by the
    activation (a continuous value places the embedding on the line through u_neg and u_pos).
    Losses, interventions (a categorical concept is set whole, one-hot), metrics and
    explanations by type, as the typed bottleneck; RandInt 0.25 by default.

    Index legend: f input feature, k concept column, g categorical group, e concept embedding,
    r task output. Outputs (y, p after interventions, p_logit before, c_emb[..., k, e]).
    """

    diagram_file = "concept_embedding_typed.pen"
    defaults = {"f": 2000, "k": 6, "g": 1, "e": 16, "r": 2}  # k, g: those of `default_concepts`
