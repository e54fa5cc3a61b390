"""Sparse autoencoders: `zoo/sparse_autoencoder.pen` (ReLU, L1 penalty in the loss) and
`zoo/topk_sparse_autoencoder.pen` (top-k activation, exact sparsity)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from penrose_zoo.core import Explanation, ZooModel


class SparseAutoencoderOutputs(NamedTuple):
    """What `SparseAutoencoder` and `TopKSparseAutoencoder` return: the diagram's outputs, by name."""

    x_hat: torch.Tensor  # [..., d]
    c: torch.Tensor  # [..., k]


class SparseAutoencoder(ZooModel):
    """Sparse autoencoder with an L1 penalty: c = relu((x − b_dec) W_enc + b_enc),
    x̂ = c W_dec + b_dec; loss = MSE(x̂, x) + l1 · mean Σ_k c_k ‖W_dec[k]‖.

    Index legend: d input (model) feature, k dictionary feature (concept).
    Sizes: d = 64, k = 256 (defaults). Outputs (x_hat[..., d], c[..., k]).
    Explanation: each active feature's contribution c_k W_dec[k] (parts[..., k, d]); they sum,
    with b_dec, to the reconstruction. `details['active']` is the bool mask of active features.

    >>> sae = SparseAutoencoder(d=4, k=16)
    >>> sae(torch.randn(2, 4)).c.shape
    torch.Size([2, 16])
    """

    diagram_file = "sparse_autoencoder.pen"
    defaults = {"d": 64, "k": 256}
    tasks = ("reconstruction",)
    default_task = "reconstruction"

    def __init__(self, *, l1: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.l1 = float(l1)

    def forward(self, x: torch.Tensor) -> SparseAutoencoderOutputs:
        """Outputs (x_hat[..., d], c[..., k])."""
        return SparseAutoencoderOutputs(*self.diagram(x=x))

    if TYPE_CHECKING:  # `model(x)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    def explain(self, x: torch.Tensor) -> Explanation:
        """Dictionary contributions parts[..., k, d]; Σ_k parts + b_dec = x_hat."""
        out = self(x)
        W_dec = self.diagram.W_dec
        return Explanation(out.x_hat, out.c[..., :, None] * W_dec, self.diagram.b_dec, ("k",),
                           {"activations": out.c, "active": out.c > 0, "atoms": W_dec})

    def sparsity_penalty(self, c: torch.Tensor) -> torch.Tensor:
        return self.l1 * (c * self.diagram.W_dec.norm(dim=-1)).sum(-1).mean()

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        (x,) = batch[:1]
        out = self(x)
        return F.mse_loss(out.x_hat, x) + self.sparsity_penalty(out.c)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, sizes["d"], generator=generator)}


class TopKSparseAutoencoder(SparseAutoencoder):
    """Top-k sparse autoencoder: only the n_active largest activations survive, so the loss is
    the reconstruction MSE alone (l1 = 0 by default).

    Index legend: d input feature, k dictionary feature. Sizes: d = 64, k = 256, n_active = 16.

    >>> sae = TopKSparseAutoencoder(d=4, k=16, n_active=2)
    >>> int((sae(torch.randn(3, 4)).c != 0).sum(-1).max()) <= 2
    True
    """

    diagram_file = "topk_sparse_autoencoder.pen"
    defaults = {"d": 64, "k": 256, "n_active": 16}

    def __init__(self, *, l1: float = 0.0, **kwargs: Any) -> None:
        super().__init__(l1=l1, **kwargs)
