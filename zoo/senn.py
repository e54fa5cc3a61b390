"""Self-explaining neural network (Alvarez-Melis & Jaakkola 2018): `zoo/senn.pen` and its wrapper.

The diagram computes concepts h(x), relevances θ(x) and the prediction f(x)_r = Σ_k θ(x)_kr h(x)_k
(plus a linear decoder x̂ for the concept autoencoder). What the diagram cannot say is its own
derivative: the robustness penalty of the paper,

    L_θ(x) = ‖∇_x f(x) − θ(x)ᵀ J_x h(x)‖_F        (per example; for r outputs, the r × f matrix)

which asks θ to be locally constant so that θ(x) really is the gradient of f (a linear model
around each x). `SelfExplainingNetwork.robustness_penalty` computes both Jacobians with
`torch.autograd.grad(create_graph=True)`, so the penalty itself is differentiable and trains
with the rest of the loss:

    loss = task loss + robustness · mean L_θ + reconstruction · MSE(x̂, x) + sparsity · mean |h|
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from penrose_zoo.core import Explanation, ZooModel, task_loss

__all__ = ["SelfExplainingNetwork", "SennOutputs", "recipe"]


class SennOutputs(NamedTuple):
    """What `SelfExplainingNetwork` returns: the diagram's outputs, by name."""

    y: torch.Tensor  # [..., r]
    h: torch.Tensor  # [..., k]
    theta: torch.Tensor  # [..., k, r]
    contrib: torch.Tensor  # [..., k, r]
    x_hat: torch.Tensor  # [..., f]


class SelfExplainingNetwork(ZooModel):
    """Concept encoder h(x), relevance parametriser θ(x), aggregation y_r = Σ_k θ_kr h_k.

    Index legend: f input feature, j encoder hidden unit, k concept, i relevance hidden unit,
    r output.
    Sizes: f = 30, j = 32, k = 5, i = 32, r = 1 (defaults). Task: 'binary' (default, r = 1),
    'multiclass' (r logits) or 'regression'.
    Outputs (y[..., r], h[..., k], theta[..., k, r], contrib[..., k, r], x_hat[..., f]).
    Loss: task loss + `robustness` × the gradient-consistency penalty ‖∇_x f − θᵀ J_x h‖ (mean
    over examples) + `reconstruction` × MSE(x̂, x) + `sparsity` × mean |h| (`loss_terms`
    returns each term).
    Explanation: per-concept contributions θ_kr h_k (parts[..., k, r]); they sum to the logits
    (no bias). Details: concepts, relevances, reconstruction.

    >>> senn = SelfExplainingNetwork(f=4, k=3).double()
    >>> x = torch.randn(6, 4, dtype=torch.float64)
    >>> e = senn.explain(x)
    >>> bool((e.total() - e.output).abs().max() < 1e-12)
    True
    >>> senn.robustness_penalty(x).shape
    torch.Size([6])
    """

    diagram_file = "senn.pen"
    defaults = {"f": 30, "j": 32, "k": 5, "i": 32, "r": 1}
    batch_form = ("x", "y")
    default_task = "binary"

    def __init__(self, *, robustness: float = 1e-1, reconstruction: float = 1e-2, sparsity: float = 0.0,
                 concept_names: Sequence[str] | None = None, feature_names: Sequence[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, v in (("robustness", robustness), ("reconstruction", reconstruction), ("sparsity", sparsity)):
            if not (float(v) >= 0):
                raise ValueError(f"{type(self).__name__}: {name} weight must be at least 0, got {v!r}")
        self.robustness, self.reconstruction, self.sparsity = float(robustness), float(reconstruction), float(sparsity)
        k = self.sizes["k"]
        if concept_names is None:
            concept_names = tuple(f"h{n}" for n in range(k))
        if len(concept_names) != k:
            raise ValueError(f"{len(concept_names)} concept names for k = {k} concepts")
        self.concept_names = tuple(concept_names)
        self.feature_names = tuple(feature_names or ())

    def forward(self, x: torch.Tensor) -> SennOutputs:
        """Outputs (y, h, theta, contrib, x_hat)."""
        return SennOutputs(*self.diagram(x=x))

    if TYPE_CHECKING:  # `model(x)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    # -- the robustness penalty
    def jacobians(self, x: torch.Tensor, out: SennOutputs | None = None) -> tuple[torch.Tensor, torch.Tensor, SennOutputs]:
        """(J_f[..., r, f], J_h[..., k, f], out): the Jacobians of the prediction and of the
        concepts with respect to the input, per example (examples are independent in the
        diagram, so the gradient of a batch sum is each example's gradient), built with
        create_graph=True so that anything computed from them is differentiable. `out`, if
        given, must be `self(x)` computed from this `x` with x.requires_grad."""
        with torch.enable_grad():
            if out is None:
                if not x.requires_grad:
                    x = x.detach().requires_grad_(True)
                out = self(x)
            elif not x.requires_grad:
                raise ValueError("jacobians(x, out): x must require grad and `out` be computed from it")

            def rows(t: torch.Tensor, n: int) -> torch.Tensor:
                return torch.stack([torch.autograd.grad(t[..., c].sum(), x, create_graph=True)[0]
                                    for c in range(n)], dim=-2)

            return rows(out.y, self.sizes["r"]), rows(out.h, self.sizes["k"]), out

    def robustness_penalty(self, x: torch.Tensor, out: SennOutputs | None = None) -> torch.Tensor:
        """‖∇_x f(x) − θ(x)ᵀ J_x h(x)‖_F for each example: shape x.shape[:-1]."""
        J_f, J_h, out = self.jacobians(x, out)
        gap = J_f - torch.einsum("...kr,...kf->...rf", out.theta, J_h)
        return gap.flatten(-2).norm(dim=-1)

    # -- training
    def loss_terms(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """{'task', 'robustness', 'reconstruction', 'sparsity', 'total'} for one (x, target) batch."""
        x, target = batch
        xg = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = self(xg)
            terms = {"task": task_loss(out.y, target, self.task)}
            terms["robustness"] = (self.robustness_penalty(xg, out).mean() if self.robustness > 0
                                   else out.y.new_zeros(()))
        terms["reconstruction"] = F.mse_loss(out.x_hat, x)
        terms["sparsity"] = out.h.abs().mean()
        terms["total"] = (terms["task"] + self.robustness * terms["robustness"]
                          + self.reconstruction * terms["reconstruction"] + self.sparsity * terms["sparsity"])
        return terms

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.loss_terms(batch)["total"]

    # -- explanations
    def explain(self, x: torch.Tensor) -> Explanation:
        """Concept contributions parts[..., k, r] = θ_kr h_k; Σ_k parts = y."""
        out = self(x)
        return Explanation(out.y, out.contrib, out.y.new_zeros(self.sizes["r"]), ("k",),
                           {"concepts": out.h, "relevances": out.theta, "reconstruction": out.x_hat},
                           names=self.concept_names)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(batch, sizes["f"], generator=generator)}


def recipe(quick: bool = False, seed: int = 0,
           progress: bool = False) -> tuple[SelfExplainingNetwork, dict[str, float], dict[str, Any], dict[str, Any]]:
    """Train on breast_cancer (as the linear model and the NAM are), in the form of a
    `penrose_zoo.recipes.RECIPES` entry: returns (model, metrics, settings, history)."""
    from penrose_zoo.data import load_tabular
    from penrose_zoo.metrics import accuracy, roc_auc

    data = load_tabular("breast_cancer")
    epochs = 8 if quick else 40
    settings = {"epochs": epochs, "lr": 3e-3, "batch_size": 32, "k": 5, "j": 32, "i": 32,
                "robustness": 1e-1, "reconstruction": 1e-2}
    model = SelfExplainingNetwork(seed=seed, f=data.n_features, k=5, j=32, i=32, r=1, task="binary",
                                  robustness=1e-1, reconstruction=1e-2, feature_names=data.feature_names)
    hist = model.fit((data.x_train, data.y_train), (data.x_val, data.y_val), epochs=epochs, batch_size=32,
                     lr=3e-3, seed=seed, progress=progress, val_every=epochs)
    model.eval()
    with torch.no_grad():
        y = model(data.x_val).y
    metrics = {"val_acc": accuracy(y, data.y_val), "val_auc": roc_auc(y, data.y_val),
               "val_robustness": model.robustness_penalty(data.x_val).mean().item(),
               "majority_baseline": torch.bincount(data.y_val.long()).max().item() / len(data.y_val)}
    return model, metrics, settings, hist
