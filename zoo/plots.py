"""Plots of zoo explanations (matplotlib, imported only here): NAM shape functions, concept
activations with their task contributions, and intervention curves.

    >>> import penrose_zoo, torch
    >>> from penrose_zoo.plots import plot_concepts
    >>> cbm = penrose_zoo.ConceptBottleneckModel(f=5, k=3)
    >>> fig = plot_concepts(cbm.explain(torch.randn(1, 5)))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.figure import Figure

    from penrose_zoo.core import Explanation
    from penrose_zoo.interventions import InterventionCurve
    from penrose_zoo.neural_additive_model import NeuralAdditiveModel


def _plt() -> Any:
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "cairo"):
        try:
            matplotlib.use("Agg", force=False)
        except Exception:  # pragma: no cover - an interactive backend is already active
            pass
    import matplotlib.pyplot as plt

    return plt


def plot_shape_functions(nam: NeuralAdditiveModel, x: torch.Tensor, feature_names: Sequence[str] | None = None,
                         features: Iterable[int] | None = None, output: int = 0, points: int = 100,
                         cols: int = 5) -> Figure:
    """One panel per feature: the NAM's shape function (its contribution to output `output`)
    over the range of that feature in `x` [n, f], with the data density as a rug."""
    plt = _plt()
    f = x.shape[-1]
    features = list(range(f)) if features is None else list(features)
    names = list(feature_names or getattr(nam, "feature_names", ()) or [f"x{i}" for i in range(f)])
    lo, hi = x.min(0).values, x.max(0).values
    t = torch.linspace(0, 1, points, dtype=x.dtype)[:, None]
    grid = lo + t * (hi - lo)  # [points, f]
    contrib = nam.shape_functions(grid.to(next(nam.parameters()).dtype))[..., output].detach().cpu()
    rows = (len(features) + cols - 1) // cols
    fig, axes = plt.subplots(rows, min(cols, len(features)), figsize=(3 * min(cols, len(features)), 2.4 * rows),
                             squeeze=False)
    for ax in axes.flat[len(features):]:
        ax.set_visible(False)
    for ax, i in zip(axes.flat, features):
        ax.plot(grid[:, i].numpy(), contrib[:, i].numpy(), color="C0")
        ax.plot(x[:, i].numpy(), [contrib[:, i].min().item()] * x.shape[0], "|", color="k", alpha=0.15, ms=6)
        ax.set_title(names[i][:28], fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("NAM shape functions (contribution to the output)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_concepts(explanation: Explanation, example: int = 0, output: int | None = None,
                  concept_names: Sequence[str] | None = None) -> Figure:
    """Two bar charts for one example: the concept activations, and each concept's contribution
    to the predicted output (activation × task weight), with the bias and the total in the
    title."""
    plt = _plt()
    e = explanation
    concepts = e.concepts
    parts = e.parts
    if concepts.dim() > 1:
        concepts, parts = concepts[example], parts[example]
        out = e.output[example]
        bias = e.bias if e.bias.dim() <= 1 else e.bias[example]
    else:
        out, bias = e.output, e.bias
    if parts.dim() == 3:  # mixture: [m, k, r] -> per concept
        parts = parts.sum(0)
    if output is None:
        output = int(out.argmax()) if out.numel() > 1 else 0
    names = list(concept_names or e.names or [f"c{i}" for i in range(concepts.shape[-1])])
    contrib = parts[..., output].detach().cpu()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 0.35 * len(names) + 1.2))
    y = range(len(names))
    a1.barh(y, concepts.detach().cpu().numpy(), color="C0")
    a1.set_yticks(list(y), names, fontsize=8)
    a1.set_xlim(0, 1)
    a1.invert_yaxis()
    a1.set_title("concept activations", fontsize=9)
    a2.barh(y, contrib.numpy(), color=["C2" if v >= 0 else "C3" for v in contrib.tolist()])
    a2.set_yticks(list(y), [""] * len(names))
    a2.invert_yaxis()
    a2.axvline(0, color="k", lw=0.5)
    b = bias.reshape(-1)[output].item() if bias.numel() > 1 else bias.item()
    a2.set_title(f"contribution to output {output}: Σ {contrib.sum().item():+.3f} + bias {b:+.3f}"
                 f" = {out.reshape(-1)[output].item():+.3f}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_intervention_curves(curves: Sequence[InterventionCurve], ax: Any = None, title: str | None = None) -> Any:
    """Task accuracy against the fraction of concepts intervened on, one line per
    `penrose_zoo.interventions.InterventionCurve`, labelled with its intervention score (area
    under the curve)."""
    plt = _plt()
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
    else:
        fig = ax.figure
    for curve in curves:
        name = " · ".join(s for s in (curve.label, curve.policy) if s)
        ax.plot(curve.fractions, curve.accuracy, marker="o", markersize=3,
                label=f"{name} (score {curve.score:.3f})")
    ax.set_xlabel("fraction of concepts intervened on")
    ax.set_ylabel("task accuracy")
    ax.set_xlim(0, 1)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
