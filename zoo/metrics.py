"""Metrics for the zoo: accuracy, ROC-AUC, concept detection AUC and HSIC.

HSIC (Hilbert–Schmidt independence criterion) with kernel matrices K (of x) and L (of y) on
n paired samples:

  biased   (Gretton et al. 2005):  tr(K H L H) / (n − 1)²,  H = I − 11ᵀ/n
  unbiased (Song et al. 2007):     [tr(K̃L̃) + (1ᵀK̃1)(1ᵀL̃1)/((n−1)(n−2)) − 2/(n−2) · 1ᵀK̃L̃1]
                                   / (n(n−3)),   K̃, L̃ = K, L with zeroed diagonals (n ≥ 4)

Kernels: 'linear' k(a, b) = a·b (then the biased HSIC is the squared Frobenius norm of the
cross-covariance matrix with the 1/(n−1) normalisation), and 'rbf'
k(a, b) = exp(−‖a − b‖² / (2σ²)) with σ by the median heuristic: the median of the pairwise
distances ‖x_i − x_j‖, i < j (σ = 1 if that median is 0).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = [
    "accuracy",
    "roc_auc",
    "concept_aucs",
    "mean_concept_auc",
    "median_bandwidth",
    "kernel_matrix",
    "hsic",
]


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def accuracy(predictions, targets, *, from_logits: bool = True) -> float:
    """Share of correct predictions.

    predictions: (n, k) scores with k > 1 -> argmax; (n,) or (n, 1) real scores -> binary, positive
    when > 0 (logits, `from_logits=True`) or ≥ 0.5 (probabilities); integer (n,) -> class labels.
    targets: (n,) labels (ints, or 0./1. floats for binary).
    """
    p = torch.as_tensor(predictions).detach()
    t = torch.as_tensor(targets).detach().reshape(-1)
    if p.ndim == 2 and p.shape[1] > 1:
        labels = p.argmax(dim=1)
    else:
        p = p.reshape(-1)
        if p.is_floating_point():
            labels = (p > 0) if from_logits else (p >= 0.5)
        else:
            labels = p
    if labels.shape[0] != t.shape[0]:
        raise ValueError(f"{labels.shape[0]} predictions for {t.shape[0]} targets")
    if t.numel() == 0:
        raise ValueError("accuracy of zero samples")
    return (labels.long() == t.long()).double().mean().item()


def roc_auc(scores, targets) -> float:
    """ROC-AUC via scikit-learn.

    Binary: scores (n,) or (n, 1) (logits or probabilities: AUC depends only on the order), or
    (n, 2) (column 1 is used). Multiclass: scores (n, k) probabilities, one-vs-rest macro AUC.
    """
    from sklearn.metrics import roc_auc_score

    s, t = _np(scores), _np(targets).reshape(-1)
    if s.ndim == 2 and s.shape[1] == 1:
        s = s[:, 0]
    if s.ndim == 2 and s.shape[1] == 2 and len(np.unique(t)) <= 2:
        s = s[:, 1]
    if len(np.unique(t)) < 2:
        raise ValueError("ROC-AUC needs both classes among the targets")
    if s.ndim == 2:
        return float(roc_auc_score(t, s, multi_class="ovr"))
    return float(roc_auc_score(t, s))


def concept_aucs(scores, labels) -> np.ndarray:
    """Per-concept ROC-AUC of scores (n, k) against 0/1 labels (n, k); NaN where a concept's
    labels have only one class."""
    from sklearn.metrics import roc_auc_score

    s, y = _np(scores), _np(labels)
    if s.shape != y.shape or s.ndim != 2:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must both be (n, k)")
    out = np.full(s.shape[1], np.nan)
    for j in range(s.shape[1]):
        col = y[:, j] > 0.5
        if col.any() and not col.all():
            out[j] = roc_auc_score(col, s[:, j])
    return out


def mean_concept_auc(scores, labels) -> float:
    """Concept detection AUC: the mean per-concept ROC-AUC over concepts whose labels have both
    classes. Raises ValueError if no concept does."""
    aucs = concept_aucs(scores, labels)
    if np.isnan(aucs).all():
        raise ValueError("no concept has both positive and negative labels")
    return float(np.nanmean(aucs))


def _as_2d(a) -> torch.Tensor:
    t = torch.as_tensor(a)
    if not t.is_floating_point():
        t = t.to(torch.float64)
    if t.ndim == 1:
        t = t[:, None]
    if t.ndim != 2:
        raise ValueError(f"expected (n,) or (n, d) samples, got shape {tuple(t.shape)}")
    return t


def median_bandwidth(x) -> float:
    """Median heuristic: median of ‖x_i − x_j‖ over pairs i < j (1.0 if that is 0)."""
    x = _as_2d(x).detach().to(torch.float64)
    n = x.shape[0]
    if n < 2:
        return 1.0
    d = torch.cdist(x, x)
    iu = torch.triu_indices(n, n, offset=1)
    med = d[iu[0], iu[1]].median().item()
    return med if med > 0 else 1.0


def kernel_matrix(x, kernel: str = "linear", sigma: float | None = None) -> torch.Tensor:
    """n × n kernel matrix of samples x ((n,) or (n, d)); see the module docstring."""
    x = _as_2d(x)
    if kernel == "linear":
        return x @ x.T
    if kernel == "rbf":
        s = median_bandwidth(x) if sigma is None else float(sigma)
        norms = x.pow(2).sum(1)
        sq = (norms[:, None] + norms[None, :] - 2.0 * (x @ x.T)).clamp_min(0.0)
        return torch.exp(-sq / (2.0 * s * s))
    raise ValueError(f"kernel must be 'linear' or 'rbf', got {kernel!r}")


def hsic(
    x,
    y,
    kernel: str | Sequence[str] = "linear",
    *,
    unbiased: bool = False,
    sigma_x: float | None = None,
    sigma_y: float | None = None,
) -> torch.Tensor:
    """HSIC between paired samples x (n, dx) and y (n, dy) (1-D inputs are one feature).

    kernel: 'linear' | 'rbf', or a pair (kernel for x, kernel for y). RBF bandwidths default to
    the median heuristic (computed without gradient). Returns a 0-dim tensor in the inputs'
    floating dtype; it is differentiable, so it can serve as an independence penalty.
    """
    kx, ky = (kernel, kernel) if isinstance(kernel, str) else tuple(kernel)
    x, y = _as_2d(x), _as_2d(y)
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"x has {n} samples but y has {y.shape[0]}")
    dtype = torch.promote_types(x.dtype, y.dtype)
    K = kernel_matrix(x.to(dtype), kx, sigma_x)
    L = kernel_matrix(y.to(dtype), ky, sigma_y)
    if not unbiased:
        if n < 2:
            raise ValueError("biased HSIC needs at least 2 samples")
        Kc = K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean()  # H K H
        return (Kc * L).sum() / (n - 1) ** 2  # tr(HKH L) = tr(K H L H)
    if n < 4:
        raise ValueError("unbiased HSIC needs at least 4 samples")
    eye = torch.eye(n, dtype=torch.bool, device=K.device)
    Kt = K.masked_fill(eye, 0.0)
    Lt = L.masked_fill(eye, 0.0)
    term1 = (Kt * Lt).sum()  # tr(K̃ L̃), both symmetric
    term2 = Kt.sum() * Lt.sum() / ((n - 1) * (n - 2))
    term3 = 2.0 / (n - 2) * (Kt.sum(0) @ Lt.sum(1))  # 1ᵀ K̃ L̃ 1
    return (term1 + term2 - term3) / (n * (n - 3))
