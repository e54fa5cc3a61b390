"""Linear model: the diagram `zoo/linear.pen` and its thin wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    batch_form = ("x", "y")
    default_task = "binary"

    def __init__(self, *, feature_names: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.feature_names = tuple(feature_names or ())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs y[..., r]."""
        return self.diagram(x=x)

    if TYPE_CHECKING:  # `model(x)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    def explain(self, x: torch.Tensor) -> Explanation:
        """Per-feature contributions parts[..., f, r]; Σ_f parts + b = y."""
        y = self(x)
        W = self.diagram.W
        return Explanation(y, x[..., :, None] * W, self.diagram.b, ("f",),
                           {"weights": W, "inputs": x}, names=self.feature_names)

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, target = batch
        return task_loss(self(x), target, self.task)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, sizes["f"], generator=generator)}
