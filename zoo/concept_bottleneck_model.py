"""Concept bottleneck model (Koh et al. 2020): `zoo/concept_bottleneck_model.pen` and its wrapper."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concept_types import CONCEPT_TYPES, ConceptSpec, TypedConcepts
from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation

__all__ = ["CONCEPT_TYPES", "ConceptBottleneckModel", "ConceptSpec", "HybridConceptBottleneckModel",
           "LogitConceptBottleneckModel", "TypedConceptBottleneckModel"]


class ConceptBottleneckOutputs(NamedTuple):
    """A concept bottleneck's outputs: task logits, concepts after interventions, concept logits."""

    y: torch.Tensor
    c: torch.Tensor
    c_logit: torch.Tensor


class HybridBottleneckOutputs(NamedTuple):
    """The hybrid bottleneck's outputs: as ConceptBottleneckOutputs, plus the extra units u."""

    y: torch.Tensor
    c: torch.Tensor
    c_logit: torch.Tensor
    u: torch.Tensor


class ConceptBottleneckModel(ConceptModel):
    """Concept predictor c = σ(x W_c + b_c) and linear task predictor y = c W_y + b_y.

    Index legend: f input feature, k concept, r task output.
    Sizes: f = 2000, k = 8, r = 2 (defaults). Inputs x[..., f], optional c_true[..., k] and
    do[..., k] (bool): concepts where `do` is True are set to `c_true` (test-time
    interventions; `intervene(x, concepts, values)` builds them from ids or names).
    Outputs (y[..., r], c[..., k] after interventions, c_logit[..., k] before).
    Training: `fit(train, val, mode='joint' | 'independent' | 'sequential')` on (x, c, y).
    Explanation: concept activations c_k and task weights W_y; the parts c_k W_y[k, r] sum, with
    b_y, to the task logits.

    >>> cbm = ConceptBottleneckModel(f=5, k=3)
    >>> x = torch.randn(2, 5)
    >>> cbm.intervene(x, [1], [1.0]).c[:, 1].tolist()
    [1.0, 1.0]
    """

    diagram_file = "concept_bottleneck_model.pen"
    defaults = {"f": 2000, "k": 8, "r": 2}
    concept_params = ("W_c", "b_c")

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> ConceptBottleneckOutputs:
        """The diagram's outputs (y, c, c_logit); see ConceptModel.forward."""
        return ConceptBottleneckOutputs(*self._run(x, c_true, do))

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        """Concept contributions parts[..., k, r] = c_k W_y[k, r]; Σ_k parts + b_y = y."""
        out = self(x, c_true, do)
        W_y = self.diagram.W_y
        return Explanation(out.y, out.c[..., :, None] * W_y, self.diagram.b_y, ("k",),
                           {"concepts": out.c, "weights": W_y, "concept_logits": out.c_logit},
                           names=self.concept_names)


class LogitConceptBottleneckModel(ConceptBottleneckModel):
    """Concept bottleneck whose task predictor reads concept logits: y = c_logit W_y + b_y.

    The CEM paper's "Logit CBM" (Espinosa Zarlenga et al. 2022, after Koh et al. 2020): the
    bottleneck keeps how sure each concept is, at the price of interventions that must choose a
    logit. `bottleneck_values(labels)` sets a concept to `active_values[k]` (label 1) or
    `inactive_values[k]` (label 0): the 95th and 5th percentiles of that concept's logits over
    the training data, measured at the end of `fit` (`calibrate(x)` measures them again);
    ±log(19) (probabilities 0.95 / 0.05) before any training.

    Index legend: f input feature, k concept, r task output. Sizes as ConceptBottleneckModel.
    Outputs (y, c: logits after interventions, c_logit before). Modes: 'joint', 'sequential'.

    >>> m = LogitConceptBottleneckModel(f=4, k=2)
    >>> m.bottleneck_values(torch.tensor([[1.0, 0.0]])).tolist()
    [[2.944438934326172, -2.944438934326172]]
    """

    diagram_file = "concept_bottleneck_logit.pen"
    modes = ("joint", "sequential")
    quantiles = (0.05, 0.95)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        k = self.sizes["k"]
        edge = torch.log(torch.tensor(19.0))
        self.register_buffer("active_values", edge.expand(k).clone())
        self.register_buffer("inactive_values", -edge.expand(k).clone())

    def bottleneck_values(self, c: torch.Tensor) -> torch.Tensor:
        c = torch.as_tensor(c, dtype=self.active_values.dtype, device=self.active_values.device)
        return torch.where(c > 0.5, self.active_values, self.inactive_values)

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, batch_size: int = 4096) -> None:
        """Set the intervention logits to the 5th / 95th percentiles of the logits on inputs x."""
        was = self.training
        self.eval()
        try:
            logits = torch.cat([self(x[i:i + batch_size]).c_logit for i in range(0, x.shape[0], batch_size)])
        finally:
            self.train(was)
        lo, hi = torch.quantile(logits.double(), torch.tensor(self.quantiles, dtype=torch.float64), dim=0)
        self.inactive_values.copy_(lo.to(self.inactive_values.dtype))
        self.active_values.copy_(hi.to(self.active_values.dtype))

    def after_fit(self, train: Any) -> None:
        self.calibrate(tuple(getattr(train, "tensors", train))[0])


class HybridConceptBottleneckModel(ConceptBottleneckModel):
    """Concept bottleneck with j extra unsupervised units beside the k concept probabilities.

    The CEM paper's "Hybrid CBM" (Espinosa Zarlenga et al. 2022): c = σ(x W_c + b_c),
    u = leaky_relu(x W_u + b_u), y = c W_y + u W_uy + b_y. The extra units carry what the
    concepts miss when they do not determine the task; the concept loss supervises c only, and
    interventions set c only.

    Index legend: f input feature, k concept, j extra unit, r task output.
    Sizes: f = 2000, k = 8, j = 16, r = 2 (defaults). Outputs (y, c, c_logit, u).
    Explanation: parts over the k concepts and then the j extra units (names `extra0`, …),
    c_k W_y[k, r] and u_j W_uy[j, r]; their sum plus b_y is y.
    """

    diagram_file = "concept_bottleneck_hybrid.pen"
    defaults = {"f": 2000, "k": 8, "j": 16, "r": 2}

    def forward(self, x: Any, c_true: torch.Tensor | None = None,  # type: ignore[override]  # one more output
                do: torch.Tensor | None = None) -> HybridBottleneckOutputs:
        """The diagram's outputs (y, c, c_logit, u); see ConceptModel.forward."""
        return HybridBottleneckOutputs(*self._run(x, c_true, do))

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        out = self(x, c_true, do)
        d = self.diagram
        parts = torch.cat([out.c[..., :, None] * d.W_y, out.u[..., :, None] * d.W_uy], dim=-2)
        names = self.concept_names + tuple(f"extra{i}" for i in range(self.sizes["j"]))
        return Explanation(out.y, parts, d.b_y, ("k",),
                           {"concepts": out.c, "extra_units": out.u, "weights": d.W_y,
                            "extra_weights": d.W_uy, "concept_logits": out.c_logit}, names=names)


class TypedConceptBottleneckModel(TypedConcepts, ConceptBottleneckModel):
    """Concept bottleneck over binary, categorical and continuous concepts (`TypedConcepts`).

    `TypedConceptBottleneckModel(f=…, r=…, concepts={"red": "binary", "size": ["s", "m", "l"],
    "weight": "continuous"})`. Activations: sigmoid (binary), softmax over the group
    (categorical), identity (continuous); y = c W_y + b_y over the columns.

    Index legend: f input feature, k concept column, g categorical group, r task output.
    """

    diagram_file = "concept_bottleneck_typed.pen"
    defaults = {"f": 2000, "k": 6, "g": 1, "r": 2}  # k, g: those of `default_concepts`
    modes = ("joint", "independent", "sequential")
