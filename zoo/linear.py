"""Linear model: the diagram `zoo/linear.pen` and its thin wrapper."""

from __future__ import annotations

import torch

from penrose_zoo.core import Explanation, ZooModel, task_loss


class LinearModel(ZooModel):
    """Linear (logistic / softmax) regression, y_r = Σ_f x_f W_fr + b_r.

    Index legend: f input feature, r output.
    Sizes: f = 30, r = 1 (defaults). Task: 'binary' (r = 1, BCE on the logit; default),
    'multiclass' (cross-entropy over r logits) or 'regression' (MSE).
    Explanation: the per-feature contributions x_f W_fr; they sum, with b, to the output.

    >>> model = LinearModel(f=3)
    >>> e = model.explain(torch.ones(2, 3))
    >>> torch.allclose(e.total(), e.output)
    True
    """

    diagram_file = "linear.pen"
    defaults = {"f": 30, "r": 1}
    default_task = "binary"

    def __init__(self, *, feature_names=None, **kwargs):
        super().__init__(**kwargs)
        self.feature_names = tuple(feature_names or ())

    def forward(self, x):
        """Outputs y[..., r]."""
        return self.diagram(x=x)

    def explain(self, x) -> Explanation:
        """Per-feature contributions parts[..., f, r]; Σ_f parts + b = y."""
        y = self(x)
        W = self.diagram.W
        return Explanation(y, x[..., :, None] * W, self.diagram.b, ("f",),
                           {"weights": W, "inputs": x}, names=self.feature_names)

    def loss(self, batch):
        x, target = batch
        return task_loss(self(x), target, self.task)

    @classmethod
    def make_inputs(cls, sizes, batch, generator=None):
        return {"x": torch.randn(batch, sizes["f"], generator=generator)}
