"""Multilayer perceptron: the diagram `zoo/mlp.pen` and its thin wrapper."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from penrose_zoo.core import Explanation, ZooModel, task_loss


class MlpOutputs(NamedTuple):
    """What `MLP` returns: the diagram's outputs, by name."""

    y: torch.Tensor  # [..., r]
    h: torch.Tensor  # [..., j]


class MLP(ZooModel):
    """One hidden layer of ReLU units: h = relu(x W1 + b1), y = h W2 + b2.

    Index legend: f input feature, j hidden unit, r output.
    Sizes: f = 30, j = 64, r = 1 (defaults). Task: 'binary' (default, r = 1), 'multiclass',
    'regression'.
    Explanation: the hidden units' contributions h_j W2_jr; they sum, with b2, to the output.

    >>> model = MLP(f=4, j=8, r=3, task="multiclass")
    >>> model(torch.randn(5, 4)).y.shape
    torch.Size([5, 3])
    """

    diagram_file = "mlp.pen"
    defaults = {"f": 30, "j": 64, "r": 1}
    batch_form = ("x", "y")
    default_task = "binary"

    def forward(self, x: torch.Tensor) -> MlpOutputs:
        """Outputs (y[..., r], h[..., j])."""
        return MlpOutputs(*self.diagram(x=x))

    if TYPE_CHECKING:  # `model(x)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    def explain(self, x: torch.Tensor) -> Explanation:
        """Hidden-unit contributions parts[..., j, r]; Σ_j parts + b2 = y."""
        out = self(x)
        W2 = self.diagram.W2
        return Explanation(out.y, out.h[..., :, None] * W2, self.diagram.b2, ("j",),
                           {"hidden": out.h, "weights": W2})

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, target = batch
        return task_loss(self(x).y, target, self.task)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, sizes["f"], generator=generator)}
