"""Concept bottleneck model (Koh et al. 2020): `zoo/concept_bottleneck_model.pen` and its wrapper."""

from __future__ import annotations

import torch  # noqa: F401  (the docstring example uses it)

from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


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

    def explain(self, x, c_true=None, do=None) -> Explanation:
        """Concept contributions parts[..., k, r] = c_k W_y[k, r]; Σ_k parts + b_y = y."""
        out = self(x, c_true, do)
        W_y = self.diagram.W_y
        return Explanation(out.y, out.c[..., :, None] * W_y, self.diagram.b_y, ("k",),
                           {"concepts": out.c, "weights": W_y, "concept_logits": out.c_logit},
                           names=self.concept_names)
