"""Neural additive model (Agarwal et al. 2021): `zoo/neural_additive_model.pen` and its wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from penrose_zoo.core import Explanation, ZooModel, task_loss


class NeuralAdditiveModelOutputs(NamedTuple):
    """What `NeuralAdditiveModel` returns: the diagram's outputs, by name."""

    y: torch.Tensor  # [..., r]
    contrib: torch.Tensor  # [..., f, r]


class NeuralAdditiveModel(ZooModel):
    """One small network per feature (ExU first layer, a ReLU layer, a linear output), batched as
    einsums over the feature leg; feature dropout (p = 0.1, in the diagram); outputs summed plus
    a bias.

    Index legend: f input feature, i ExU hidden unit, j hidden unit, r output.
    Sizes: f = 30, i = 32, j = 16, r = 1 (defaults). Outputs (y[..., r], contrib[..., f, r]).
    Loss: the task loss + `output_penalty` × mean contrib² (as in the paper).
    Explanation: per-feature contributions (the shape functions at x); they sum, with the bias,
    to the output. `shape_functions(grid)` evaluates every feature's function on a grid.

    >>> nam = NeuralAdditiveModel(f=3).eval()
    >>> e = nam.explain(torch.randn(4, 3))
    >>> bool((e.total() - e.output).abs().max() < 1e-5)
    True
    """

    diagram_file = "neural_additive_model.pen"
    defaults = {"f": 30, "i": 32, "j": 16, "r": 1}
    batch_form = ("x", "y")
    default_task = "binary"

    def __init__(self, *, output_penalty: float = 1e-3, feature_names: Sequence[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.output_penalty = float(output_penalty)
        self.feature_names = tuple(feature_names or ())

    def forward(self, x: torch.Tensor) -> NeuralAdditiveModelOutputs:
        """Outputs (y[..., r], contrib[..., f, r])."""
        return NeuralAdditiveModelOutputs(*self.diagram(x=x))

    if TYPE_CHECKING:  # `model(x)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    def explain(self, x: torch.Tensor) -> Explanation:
        """Feature contributions parts[..., f, r]; Σ_f parts + bias = y."""
        out = self(x)
        return Explanation(out.y, out.contrib, self.diagram.bias, ("f",), {"inputs": x},
                           names=self.feature_names)

    @torch.no_grad()
    def shape_functions(self, grid: torch.Tensor) -> torch.Tensor:
        """contrib[n, f, r] of each feature f at the values grid[n, f] (or grid[n] for all
        features): the networks are independent, so one batched call evaluates them all."""
        was = self.training
        self.eval()
        try:
            if grid.dim() == 1:
                grid = grid[:, None].expand(-1, self.sizes["f"])
            return self(grid).contrib
        finally:
            self.train(was)

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, target = batch
        out = self(x)
        return task_loss(out.y, target, self.task) + self.output_penalty * out.contrib.pow(2).mean()

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, sizes["f"], generator=generator)}
