"""Concept activation vectors and TCAV (Kim et al. 2018): `zoo/cav_probe.pen` and its wrapper.

The diagram reads a layer's activations a[d] (of any model: the input layer, a hidden layer,
Steerling's concept or residual pathway) and holds two things:

  the probes   s_k = a · V_k + b_k, one logistic-regression probe per concept; its weight
               vector V_k is concept k's CAV (normal to the probe's decision boundary);
  the head     the rest of the model above that layer, y_r = relu(a W_j + b_j) W_r + b_r,
               whose class logits TCAV differentiates.

TCAV's conceptual sensitivity of class r to concept k at an example is the directional
derivative of the class logit along the unit CAV, S_kr(a) = ∇_a y_r(a) · v_k, v_k = V_k/‖V_k‖.
The diagram's input `step[k]` moves the activations along the unit CAVs
(a + Σ_k step_k v_k), so S_kr = ∂y_r/∂step_k at step = 0: `sensitivities` reads it with
autograd. The TCAV score is the fraction of examples of class r with a positive sensitivity,

    TCAV_kr = |{a ∈ X_r : S_kr(a) > 0}| / |X_r|          (`tcav`; in [0, 1])

and the same probes give the probing gap (`probing_gap`): the probe AUC on one representation
minus that on another, for the same concept labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from penrose_zoo.core import Explanation, ZooModel, task_loss

__all__ = ["CavProbeOutputs", "ConceptActivationVectors", "probe_aucs", "probing_gap", "recipe"]

#: What `fit` trains on (as `penrose_zoo.train.fit` takes it): (a, c, y) tensors, a TensorDataset
#: or a mapping name -> tensor.
Data = tuple[torch.Tensor, ...] | TensorDataset | Mapping[str, torch.Tensor]
#: Representations or labels as a tensor or an array.
ArrayLike = torch.Tensor | np.ndarray


class CavProbeOutputs(NamedTuple):
    """What `ConceptActivationVectors` returns: the diagram's outputs, by name."""

    s: torch.Tensor  # [..., k] probe logits
    y: torch.Tensor  # [..., r] class logits


class ConceptActivationVectors(ZooModel):
    """Linear concept probes (CAVs) on a layer's activations and the head above the layer.

    Index legend: d activation unit of the probed layer, k concept (one CAV each), j head hidden
    unit, r class.
    Sizes: d = 64, k = 8, j = 32, r = 2 (defaults). Task: 'multiclass' (default) or 'binary'
    (r = 1: the one logit is the positive class's). Inputs a[..., d] and, optionally,
    step[..., k] (zero: the activations as they are). Outputs (s[..., k] probe logits,
    y[..., r] class logits).
    Training: batches (a, c, y) with concept labels c[..., k] in {0, 1}; `fit(mode=...)`:
    'sequential' (default: the head on the task, then the probes on the concepts — post-hoc
    CAVs of a trained model) or 'joint' (both losses at once; they share no parameter, so the
    probes never change the head). `loss(batch, mode='head' | 'probes' | 'joint')`.
    TCAV: `sensitivities(a)` [..., r, k], `tcav(a, labels)` [r, k] in [0, 1]; `cavs` are the
    unit CAVs [d, k].
    Explanation: the probe logits s_k as per-unit parts a_d V_dk (parts[..., d, k]) plus b_v;
    details: cavs, sensitivities, logits.

    >>> m = ConceptActivationVectors(d=5, k=2, j=4, r=3)
    >>> a = torch.randn(7, 5)
    >>> m.sensitivities(a).shape, m.tcav(a).shape
    (torch.Size([7, 3, 2]), torch.Size([3, 2]))
    """

    diagram_file = "cav_probe.pen"
    defaults = {"d": 64, "k": 8, "j": 32, "r": 2}
    tasks = ("multiclass", "binary")
    default_task = "multiclass"
    modes = ("sequential", "joint")

    def __init__(self, *, concept_names: Sequence[str] | None = None, class_names: Sequence[str] | None = None,
                 probe_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        k, r = self.sizes["k"], self.sizes["r"]
        if concept_names is None:
            concept_names = tuple(f"c{n}" for n in range(k))
        if len(concept_names) != k:
            raise ValueError(f"{len(concept_names)} concept names for k = {k} concepts")
        if class_names is not None and len(class_names) != r:
            raise ValueError(f"{len(class_names)} class names for r = {r} class logits")
        self.concept_names = tuple(concept_names)
        self.class_names = tuple(class_names or ())
        self.probe_weight = float(probe_weight)
        self.register_buffer("_no_step", torch.zeros(k), persistent=False)

    def forward(self, a: torch.Tensor, step: torch.Tensor | None = None) -> CavProbeOutputs:
        """Outputs (s, y); `step` [k] or [..., k] moves a along the unit CAVs."""
        return CavProbeOutputs(*self.diagram(a=a, step=self._no_step if step is None else step))

    if TYPE_CHECKING:  # `model(a)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    @property
    def cavs(self) -> torch.Tensor:
        """The unit CAVs v[d, k] = V_k / ‖V_k‖ (as the diagram computes them)."""
        V = self.diagram.V
        return V / torch.sqrt((V * V).sum(0) + 1e-12)

    # -- TCAV
    def sensitivities(self, a: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
        """Conceptual sensitivities S[..., r, k] = ∂y_r/∂step_k at step = 0 = ∇_a y_r · v_k."""
        k, r = self.sizes["k"], self.sizes["r"]
        with torch.enable_grad():
            step = torch.zeros(*a.shape[:-1], k, dtype=a.dtype, device=a.device, requires_grad=True)
            y = self(a, step).y
            rows = [torch.autograd.grad(y[..., c].sum(), step, create_graph=create_graph,
                                        retain_graph=c < r - 1 or create_graph)[0] for c in range(r)]
        return torch.stack(rows, dim=-2)

    def tcav(self, a: torch.Tensor, labels: ArrayLike | Sequence[int] | None = None) -> torch.Tensor:
        """TCAV scores [r, k]: for each class r, the fraction of its examples (rows of a[n, d]
        whose `labels` are r; for a binary model, label 1; all rows without labels) whose
        sensitivity S_kr is positive. NaN for a class without examples."""
        S = self.sensitivities(a).detach().reshape(-1, self.sizes["r"], self.sizes["k"])
        positive = (S > 0).to(torch.float64)
        if labels is None:
            return positive.mean(0)
        labels = torch.as_tensor(labels, device=S.device).reshape(-1).long()
        if labels.shape[0] != S.shape[0]:
            raise ValueError(f"{labels.shape[0]} labels for {S.shape[0]} examples")
        classes = [1] if self.task == "binary" else range(self.sizes["r"])
        out = torch.full((self.sizes["r"], self.sizes["k"]), math.nan, dtype=torch.float64, device=S.device)
        for row, cls in enumerate(classes):
            pick = labels == cls
            if pick.any():
                out[row] = positive[pick, row].mean(0)
        return out

    # -- losses and training
    def probe_loss(self, out: CavProbeOutputs, c: torch.Tensor) -> torch.Tensor:
        """The probes' logistic loss: BCE of the concept logits s against labels c."""
        return F.binary_cross_entropy_with_logits(out.s, c.to(out.s.dtype))

    def loss(self, batch: tuple[torch.Tensor, ...], mode: str = "joint") -> torch.Tensor:
        """Loss of one (a, c, y) batch ((a, c) for mode 'probes'): 'head' the task loss, 'probes'
        the probes' logistic loss, 'joint' task + probe_weight × probes."""
        a, c = batch[0], batch[1]
        out = self(a)
        if mode == "probes":
            return self.probe_loss(out, c)
        if mode not in ("head", "joint"):
            raise ValueError(f"mode must be 'head', 'probes' or 'joint', got {mode!r}")
        if len(batch) < 3:
            raise ValueError(f"mode {mode!r} needs (a, c, y) batches, got {len(batch)} tensors")
        task = task_loss(out.y, batch[2], self.task)
        return task if mode == "head" else task + self.probe_weight * self.probe_loss(out, c)

    def fit(self, train: Data, val: Data | None = None, *, mode: str = "sequential", probe_epochs: int | None = None,
            **fit_kwargs: Any) -> dict[str, Any]:
        """'joint': one fit on the joint loss; 'sequential': the head, then the probes (for
        `probe_epochs`, default `epochs`), returning {'head': history, 'probes': history}."""
        from penrose_zoo.train import fit

        if mode not in self.modes:
            raise ValueError(f"{type(self).__name__} trains in modes {self.modes}, got {mode!r}")
        self.check_labels(train, "train")
        self.check_labels(val, "val")
        if mode == "joint":
            return fit(self, self.loss_fn(mode="joint"), train, val, **fit_kwargs)
        h1 = fit(self, self.loss_fn(mode="head"), train, val, **fit_kwargs)
        second = dict(fit_kwargs)
        if probe_epochs is not None:
            second["epochs"] = probe_epochs
        second.pop("metric_fn", None)
        h2 = self.fit_probes(train, val, **second)
        return {"head": h1, "probes": h2}

    def label_roles(self, n: int) -> dict[int, str]:
        """(a, c, y): c the probes' concept labels, y the head's task labels; (a, c) for the probes."""
        return {1: "concepts", 2: "task"} if n == 3 else {1: "concepts"} if n == 2 else {}

    def fit_probes(self, train: Data, val: Data | None = None, **fit_kwargs: Any) -> dict[str, Any]:
        """Train the probes alone on (a, c[, y]) data; the head's parameters stay as they are."""
        from penrose_zoo.train import fit

        self.check_labels(train, "train")
        self.check_labels(val, "val")
        head = [p for n, p in self.diagram.named_parameters() if n not in ("V", "b_v") and p.requires_grad]
        for p in head:
            p.requires_grad_(False)
        try:
            return fit(self, self.loss_fn(mode="probes"), train[:2] if isinstance(train, tuple) else train,
                       val[:2] if isinstance(val, tuple) else val, **fit_kwargs)
        finally:
            for p in head:
                p.requires_grad_(True)

    @torch.no_grad()
    def evaluate(self, data: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        """Task accuracy, mean probe (concept) AUC and the TCAV scores on (a, c, y) data."""
        from penrose_zoo.metrics import accuracy, concept_aucs

        was = self.training
        self.eval()
        try:
            a, c, y = data
            out = self(a)
            aucs = concept_aucs(out.s, c)
            return {"acc": accuracy(out.y, y), "concept_auc": float(np.nanmean(aucs)),
                    "concept_aucs": aucs, "tcav": self.tcav(a, y)}
        finally:
            self.train(was)

    # -- explanations
    def explain(self, a: torch.Tensor, step: torch.Tensor | None = None) -> Explanation:
        """Probe logits as per-unit parts parts[..., d, k] = a_d V_dk; Σ_d parts + b_v = s."""
        out = self(a, step)
        return Explanation(out.s, a[..., :, None] * self.diagram.V, self.diagram.b_v, ("d",),
                           {"cavs": self.cavs, "sensitivities": self.sensitivities(a).detach(),
                            "logits": out.y}, names=self.concept_names)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"a": torch.randn(batch, sizes["d"], generator=generator),
                "step": 0.5 * torch.randn(batch, sizes["k"], generator=generator)}


# ---- probing ------------------------------------------------------------------------------------


def probe_aucs(a_train: ArrayLike, c_train: ArrayLike, a_val: ArrayLike, c_val: ArrayLike, *, epochs: int = 30,
               lr: float = 1e-2, batch_size: int = 64, seed: int = 0, standardise: bool = True) -> np.ndarray:
    """Per-concept validation ROC-AUC of the diagram's probes (one CAV per concept, logistic loss)
    trained on representations a_train[n, d] with labels c_train[n, k] in {0, 1}; NaN where a
    concept's validation labels have one class. `standardise` scales each unit with the
    training statistics first (as a probe pipeline does)."""
    from penrose_zoo.metrics import concept_aucs

    a_train, a_val = torch.as_tensor(a_train).detach(), torch.as_tensor(a_val).detach()
    c_train, c_val = torch.as_tensor(c_train).detach(), torch.as_tensor(c_val).detach()
    if standardise:
        mean, std = a_train.mean(0), a_train.std(0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        a_train, a_val = (a_train - mean) / std, (a_val - mean) / std
    model = ConceptActivationVectors(d=a_train.shape[-1], k=c_train.shape[-1], j=1, r=1, task="binary",
                                     seed=seed).to(a_train.dtype)
    model.fit_probes((a_train, c_train.to(a_train.dtype)), epochs=epochs, batch_size=batch_size, lr=lr,
                     seed=seed, progress=False)
    with torch.no_grad():
        return concept_aucs(model.eval()(a_val).s, c_val)


def probing_gap(a_train: ArrayLike, b_train: ArrayLike, c_train: ArrayLike, a_val: ArrayLike, b_val: ArrayLike,
                c_val: ArrayLike, **probe_kwargs: Any) -> dict[str, Any]:
    """The probing gap between representations a and b of the same examples: the probes' mean
    validation AUC on a minus that on b (positive: a carries concept signal b does not).
    Returns {'probe_auc_a', 'probe_auc_b', 'probing_gap'} (means over concepts with both
    classes in the validation labels) and the per-concept 'aucs_a', 'aucs_b'."""
    aucs_a = probe_aucs(a_train, c_train, a_val, c_val, **probe_kwargs)
    aucs_b = probe_aucs(b_train, c_train, b_val, c_val, **probe_kwargs)
    if np.isnan(aucs_a).all():
        raise ValueError("no concept has both classes among the validation labels")
    mean_a, mean_b = float(np.nanmean(aucs_a)), float(np.nanmean(aucs_b))
    return {"probe_auc_a": mean_a, "probe_auc_b": mean_b, "probing_gap": mean_a - mean_b,
            "aucs_a": aucs_a, "aucs_b": aucs_b}


def recipe(quick: bool = False, seed: int = 0, progress: bool = False
           ) -> tuple[ConceptActivationVectors, dict[str, float], dict[str, Any], dict[str, Any]]:
    """Train on the fortunes concept data, in the form of a `penrose_zoo.recipes.RECIPES` entry:
    the probed layer is the TF-IDF input layer, so the head is the whole classifier; returns
    (model, metrics, settings, history). Metrics: task accuracy, probe AUC, and the mean TCAV
    score of the 'science & technology' class for its own group's concepts and for the others'."""
    from penrose_zoo.data import fortunes_concepts

    features = 500 if quick else 2000
    data = fortunes_concepts(max_features=features)
    train, val = data.train_tuple(), data.val_tuple()
    epochs = 6 if quick else 20
    model = ConceptActivationVectors(seed=seed, d=features, k=len(data.concept_names), j=32,
                                     r=len(data.task_names), concept_names=data.concept_names,
                                     class_names=data.task_names)
    hist = model.fit(train, val, mode="sequential", epochs=epochs, batch_size=64, lr=1e-2, seed=seed,
                     progress=progress, val_every=epochs)
    res = model.evaluate(val)
    sci = data.task_names.index("science & technology")
    own = [n for n, c in enumerate(data.concept_names) if data.group_of[c] == "science & technology"]
    other = [n for n in range(len(data.concept_names)) if n not in own]
    metrics = {"val_acc": res["acc"], "val_probe_auc": res["concept_auc"],
               "val_tcav_own_concepts": res["tcav"][sci, own].mean().item(),
               "val_tcav_other_concepts": res["tcav"][sci, other].mean().item(),
               "majority_baseline": torch.bincount(val[2]).max().item() / len(val[2])}
    settings = {"epochs": epochs, "lr": 1e-2, "batch_size": 64, "mode": "sequential", "j": 32, "features": features}
    return model, metrics, settings, hist
