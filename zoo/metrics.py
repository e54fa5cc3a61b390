"""Metrics for the zoo: accuracy, ROC-AUC, concept detection AUC, HSIC, and the causal scores
CACE and completeness.

CACE (the causal concept effect, Goyal et al., "Explaining Classifiers with Causal Concept
Effect", 2019; PyC's `cace_score`): the mean change of a model's output when a concept is set,

  CACE(c → t) = E_x[ t | do(c = high) ] − E_x[ t | do(c = low) ]   (high = 1, low = 0 by default)

where t is the task's probabilities (softmax over r logits; σ of one logit) or a concept's values;
in a graph model the set concept reaches t through its descendants.

Completeness (Yeh et al., "On Completeness-aware Concept-Based Explanations in Deep Neural
Networks", NeurIPS 2020): how much of a black box's score a concept-based model keeps,

  completeness = (score(concept model) − score(random)) / (score(black box) − score(random))

with `random` the score of a chance predictor (0 by default, which is PyC's `completeness_score`:
the plain ratio of the two scores); the score is accuracy unless another is given.

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
    "cace",
    "cace_score",
    "completeness",
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


def cace_score(y_low, y_high) -> torch.Tensor:
    """E[y | do(c = high)] − E[y | do(c = low)] from the two runs' outputs [n, …] (means over the
    first axis): PyC's `cace_score(y_pred_c0, y_pred_c1)` with the arguments in that order."""
    y_low, y_high = torch.as_tensor(y_low), torch.as_tensor(y_high)
    if y_low.shape != y_high.shape:
        raise ValueError(f"cace_score: the two runs' outputs differ in shape: {tuple(y_low.shape)} and {tuple(y_high.shape)}")
    return y_high.mean(0) - y_low.mean(0)


def _task_probabilities(model, y: torch.Tensor) -> torch.Tensor:
    if getattr(model, "task", "multiclass") == "regression":
        return y
    return torch.sigmoid(y) if y.shape[-1] == 1 else torch.softmax(y, -1)


@torch.no_grad()
def cace(model, x, concept, target=None, *, high=1.0, low=0.0) -> torch.Tensor:
    """The causal concept effect of `concept` (a name or id; a categorical concept's `high` and
    `low` are its one-hot values) on `target`: the task's probabilities (None, the default; the
    values for a regression task) or a concept's values (a name or id), over the inputs x, with
    the model in eval mode. Returns a tensor: one effect per task class (per column of the
    target concept)."""
    def columns(name):
        first = model.concept_index(name)
        return next((list(u) for u in model.concept_units() if first in u), [first])

    cols = columns(concept)
    k = model.sizes["k"]
    was = model.training
    model.eval()
    try:
        outs = []
        for value in (low, high):
            v = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
            if v.numel() not in (1, len(cols)):
                raise ValueError(f"cace: {concept!r} has {len(cols)} column(s); a value of {v.numel()} entries does not fit")
            c_true, do = torch.zeros(k), torch.zeros(k, dtype=torch.bool)
            c_true[cols], do[cols] = v.expand(len(cols)), True
            p = next(model.parameters())
            outs.append(model(x, c_true=c_true.to(p.device, p.dtype), do=do.to(p.device)))
    finally:
        model.train(was)
    if target is None:
        low_t, high_t = (_task_probabilities(model, o.y) for o in outs)
    else:
        low_t, high_t = (o.c[..., columns(target)] for o in outs)
    return cace_score(low_t, high_t)


def completeness(targets, blackbox, concept_model, *, random_score: float = 0.0, score=accuracy) -> float:
    """(score(concept_model) − random_score) / (score(blackbox) − random_score): `blackbox` and
    `concept_model` are the two models' predictions on the same examples (what `score(predictions,
    targets)` reads: logits for `accuracy`, the default); `random_score` a chance predictor's
    score (0: PyC's plain ratio; the majority class's accuracy, or 0.5 for AUC, Yeh et al.'s)."""
    whitebox, black = score(concept_model, targets), score(blackbox, targets)
    if black - random_score <= 0:
        raise ValueError(f"completeness: the black box scores {black:.4g}, not above the random score {random_score:.4g}")
    return (whitebox - random_score) / (black - random_score)
