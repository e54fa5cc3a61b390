"""Concept whitening (Chen, Bei and Rudin 2020): `zoo/concept_whitening.pen` and its wrapper."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


class ConceptWhiteningOutputs(NamedTuple):
    """Task logits, concept axes after / before interventions, the other rotated axes."""

    y: torch.Tensor
    c: torch.Tensor
    c_axis: torch.Tensor
    u: torch.Tensor


class ConceptWhiteningModel(ConceptModel):
    """Whitened, rotated features whose first k axes are concepts, and a linear task predictor.

    z = (x − μ) W (ZCA whitening: W = Σ^{-1/2} of the training inputs, so z has identity
    covariance), [c, u] = z [Q_c, Q_j] with [Q_c, Q_j] orthogonal, y = c W_y + u W_j + b_y.
    `fit` first measures μ and W on the training inputs (`fit_whitening`), then alternates
    `rounds` times: the task predictor trains on the task loss (`epochs` per round), and the
    rotation takes `align_steps` Cayley steps (Chen et al.'s update on the Stiefel manifold, which
    keeps it orthogonal) that raise, for each concept, the mean of its axis over that concept's
    positive examples (`align`). Concepts are not probabilities here: `concept_scores` are the
    axis values (AUC against the labels), `concept_probabilities` their logistic, and a
    ground-truth intervention sets an axis to the 95th / 5th percentile of its training values.

    Index legend: f input feature, g whitened axis (g = f), k concept axis, j other axis
    (j = f − k), r task output. Give f and k; g and j follow.
    """

    diagram_file = "concept_whitening.pen"
    defaults = {"f": 64, "k": 8, "r": 2}
    concept_params = ()
    modes = ("joint",)

    def __init__(self, *, f: int | None = None, k: int | None = None, **kwargs: Any) -> None:
        f = self.defaults["f"] if f is None else f
        k = self.defaults["k"] if k is None else k
        if not 0 < k <= f:
            raise ValueError(f"concept whitening needs 0 < k ≤ f concept axes, got k = {k}, f = {f}")
        for key, value in (("g", f), ("j", f - k)):
            if key in kwargs and kwargs.pop(key) != value:
                raise TypeError(f"ConceptWhiteningModel sets {key} = {value} from f and k")
        if f == k:
            raise ValueError("concept whitening needs at least one axis that is not a concept (k < f)")
        super().__init__(f=f, k=k, g=f, j=f - k, **kwargs)
        with torch.no_grad():
            eye = torch.eye(f)
            self.diagram.whiten.copy_(eye)
            self.diagram.Q_c.copy_(eye[:, :k])
            self.diagram.Q_j.copy_(eye[:, k:])
        self.register_buffer("active_values", torch.ones(k))
        self.register_buffer("inactive_values", -torch.ones(k))

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> ConceptWhiteningOutputs:
        """The diagram's outputs (y, c, c_axis, u); see ConceptModel.forward."""
        return ConceptWhiteningOutputs(*self._run(x, c_true, do))

    # -- whitening and rotation
    @torch.no_grad()
    def fit_whitening(self, x: torch.Tensor, eps: float = 1e-5) -> None:
        """μ and W = Σ^{-1/2} (ZCA, eigenvalues floored at eps) of the inputs x [n, f]."""
        x = x.double()
        mu = x.mean(0)
        cov = (x - mu).T @ (x - mu) / max(x.shape[0] - 1, 1)
        vals, vecs = torch.linalg.eigh(cov)
        w = vecs @ torch.diag(vals.clamp_min(eps).rsqrt()) @ vecs.T
        self.diagram.mu.copy_(mu.to(self.diagram.mu.dtype))
        self.diagram.whiten.copy_(w.to(self.diagram.whiten.dtype))

    def rotation(self) -> torch.Tensor:
        """[Q_c, Q_j], orthogonal [f, f]."""
        return torch.cat([self.diagram.Q_c, self.diagram.Q_j], dim=1)

    @torch.no_grad()
    def align(self, x: torch.Tensor, c: torch.Tensor, steps: int = 20, lr: float = 0.5) -> None:
        """Cayley steps raising Σ_k mean over concept-k positives of z·q_k (Chen et al. 2020):
        G = ∂objective/∂Q, A = G Qᵀ − Q Gᵀ, Q ← (I + lr/2 A)⁻¹ (I − lr/2 A) Q with the descent
        direction of −objective, so Q stays orthogonal."""
        z = ((x - self.diagram.mu) @ self.diagram.whiten).double()
        k, f = self.sizes["k"], self.sizes["f"]
        pos = (c > 0.5).double()
        counts = pos.sum(0).clamp_min(1.0)
        target = (pos.T @ z) / counts[:, None]  # [k, g]: each concept's mean whitened positive example
        Q = self.rotation().double()
        eye = torch.eye(f, dtype=torch.float64)
        for _ in range(steps):
            G = torch.zeros_like(Q)
            G[:, :k] = -target.T  # ∂(−Σ_k target_k · q_k)/∂q_k
            A = G @ Q.T - Q @ G.T
            Q = torch.linalg.solve(eye + lr / 2 * A, (eye - lr / 2 * A) @ Q)
        self.diagram.Q_c.copy_(Q[:, :k].to(self.diagram.Q_c.dtype))
        self.diagram.Q_j.copy_(Q[:, k:].to(self.diagram.Q_j.dtype))

    def fit(self, train: Any, val: Any = None, *, mode: str = "joint", rounds: int = 3, align_steps: int = 20,
            **fit_kwargs: Any) -> dict:
        """Whitening on the training inputs, then `rounds` × (task epochs, alignment); returns the
        last round's history. `backward` (in fit_kwargs): as `ConceptModel.fit_stage`."""
        if mode not in self.modes:
            raise ValueError(f"{type(self).__name__} trains in modes {self.modes}, got {mode!r}")
        self.check_labels(train, "train")  # (before the whitening and the alignment read c)
        tensors = tuple(getattr(train, "tensors", train))
        if self.backbone is not None:
            tensors = self._with_features(tensors)
        x, c = tensors[0], tensors[1]
        with self.given_features():
            self.fit_whitening(x)
            history: dict = {}
            for _ in range(max(1, rounds)):
                self.align(x, c, steps=align_steps)
                val_t = val if val is None or self.backbone is None else self._with_features(val)
                history = self.fit_stage("task", tensors, val_t, **fit_kwargs)
            self.after_fit(tensors)
        return history

    @torch.no_grad()
    def after_fit(self, train: Any) -> None:
        """Intervention values: the 95th / 5th percentiles of each concept axis on the training inputs."""
        x = tuple(getattr(train, "tensors", train))[0]
        was = self.training
        self.eval()
        try:
            axes = self(x).c_axis.double()
        finally:
            self.train(was)
        lo, hi = torch.quantile(axes, torch.tensor([0.05, 0.95], dtype=torch.float64), dim=0)
        self.inactive_values.copy_(lo.to(self.inactive_values.dtype))
        self.active_values.copy_(hi.to(self.active_values.dtype))

    # -- the concept-model interface
    def bottleneck_values(self, c: torch.Tensor) -> torch.Tensor:
        c = torch.as_tensor(c, dtype=self.active_values.dtype, device=self.active_values.device)
        return torch.where(c > 0.5, self.active_values, self.inactive_values)

    def concept_scores(self, out: Any) -> torch.Tensor:
        return out.c_axis

    def concept_probabilities(self, out: Any) -> torch.Tensor:
        """A logistic of each axis centred between its intervention values (a score, not a calibrated probability)."""
        mid = (self.active_values + self.inactive_values) / 2
        scale = ((self.active_values - self.inactive_values) / 8).clamp_min(1e-6)
        return torch.sigmoid((out.c_axis - mid) / scale)

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        """Parts over the concept axes, then the other axes: c_k W_y[k, r] and u_j W_j[j, r]."""
        out = self(x, c_true, do)
        d = self.diagram
        parts = torch.cat([out.c[..., :, None] * d.W_y, out.u[..., :, None] * d.W_j], dim=-2)
        names = self.concept_names + tuple(f"axis{i}" for i in range(self.sizes["j"]))
        return Explanation(out.y, parts, d.b_y, ("k",), {"concepts": out.c, "other_axes": out.u,
                                                         "rotation": self.rotation(), "weights": d.W_y}, names=names)
