"""Tests for penrose_zoo.train.fit and penrose_zoo.metrics."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from penrose_zoo.data import load_tabular
from penrose_zoo.metrics import accuracy, concept_aucs, hsic, kernel_matrix, mean_concept_auc, median_bandwidth, roc_auc
from penrose_zoo.train import FlatAdam, NonFiniteInputError, NonFiniteLossError, fit


def bce_loss(model, batch):
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)


# ------------------------------------------------------------------------------------------
# fit
# ------------------------------------------------------------------------------------------

def test_logistic_regression_breast_cancer():
    data = load_tabular("breast_cancer")
    torch.manual_seed(0)
    model = torch.nn.Linear(data.n_features, 1).eval()
    # Building the first torch optimizer in a process imports torch._dynamo (seconds, once);
    # do that before timing so the bound measures training only.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    # One intra-op thread: for a model this small, more threads only contend on a busy machine.
    # The bound is on this process's CPU time, so other load on the machine does not matter.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.process_time()
    try:
        hist = fit(
            model, bce_loss, (data.x_train, data.y_train), (data.x_val, data.y_val),
            epochs=20, batch_size=32, lr=1e-2, progress=False,
            metric_fn=lambda m, b: {"acc": accuracy(m(b[0]), b[1]), "auc": roc_auc(m(b[0]), b[1])},
        )
    finally:
        torch.set_num_threads(threads)
    assert time.process_time() - t0 < 5
    assert hist["val_acc"][-1] > 0.9 and hist["val_auc"][-1] > 0.95
    assert len(hist["train_loss"]) == 20 and hist["train_loss"][-1] < hist["train_loss"][0]
    assert hist["steps"] == 20 * math.ceil(len(data.x_train) / 32)
    assert hist["val_epoch"] == list(range(1, 21)) and len(hist["val_loss"]) == 20
    assert not model.training  # the caller's eval mode is restored


def test_fit_is_deterministic_and_restores_global_rng():
    data = load_tabular("wine")

    def run(seed):
        torch.manual_seed(123)
        model = torch.nn.Sequential(torch.nn.Linear(13, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3))
        before = torch.random.get_rng_state()
        fit(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), (data.x_train, data.y_train),
            epochs=3, batch_size=16, lr=1e-2, seed=seed, progress=False)
        assert torch.equal(before, torch.random.get_rng_state())
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_fit_val_every_and_scalar_metric():
    data = load_tabular("wine")
    model = torch.nn.Linear(13, 3)
    hist = fit(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), (data.x_train, data.y_train),
               (data.x_val, data.y_val), epochs=5, batch_size=64, lr=1e-2, progress=True, val_every=2,
               metric_fn=lambda m, b: accuracy(m(b[0]), b[1]))
    assert hist["val_epoch"] == [2, 4, 5]
    assert len(hist["val_metric"]) == 3


def test_nan_input_names_tensor_and_index():
    x = torch.randn(20, 5)
    x[12, 3] = float("nan")
    y = torch.zeros(20)
    with pytest.raises(NonFiniteInputError, match=r"x_train .*has NaN at index \(12, 3\)") as err:
        fit(torch.nn.Linear(5, 1), bce_loss, (x, y), epochs=1, batch_size=4, lr=0.1, progress=False)
    assert err.value.index == (12, 3) and isinstance(err.value, ValueError)


def test_inf_in_validation_targets():
    x, y = torch.randn(10, 2), torch.zeros(10)
    yv = torch.zeros(6)
    yv[4] = float("-inf")
    with pytest.raises(NonFiniteInputError, match=r"y_val .*has -inf at index \(4,\)"):
        fit(torch.nn.Linear(2, 1), bce_loss, (x, y), (x[:6], yv), epochs=1, batch_size=4, lr=0.1,
            progress=False)


def test_mapping_data_names():
    x = torch.randn(8, 3)
    x[2, 1] = float("inf")
    with pytest.raises(NonFiniteInputError, match=r"^features has inf at index \(2, 1\)$"):
        fit(torch.nn.Linear(3, 1), bce_loss, {"features": x, "y": torch.zeros(8)}, epochs=1,
            batch_size=4, lr=0.1, progress=False)


def test_nonfinite_loss_names_step():
    x, y = torch.randn(40, 3), torch.zeros(40)
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = bce_loss(model, batch)
        return loss * float("nan") if calls["n"] == 4 else loss

    with pytest.raises(NonFiniteLossError, match="at step 3 \\(epoch 1\\)") as err:
        fit(torch.nn.Linear(3, 1), loss_fn, (x, y), epochs=2, batch_size=8, lr=0.1, progress=False)
    assert err.value.step == 3


@pytest.mark.parametrize("name, weight_decay", [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1)])
def test_flat_adam_matches_torch_adam(name, weight_decay):
    """fit's 'adam' / 'adamw' update one flat buffer (FlatAdam); the trajectory is torch.optim's
    (Adam with L2 decay, AdamW with decoupled decay), and afterwards each parameter and gradient
    has its own storage again."""
    data = load_tabular("wine")

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(13, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()

    def ce(m, batch):
        return F.cross_entropy(m(batch[0].double()), batch[1])

    flat, ref = model(), model()
    kwargs = dict(epochs=3, batch_size=16, lr=1e-2, weight_decay=weight_decay, progress=False)
    fit(flat, ce, (data.x_train, data.y_train), optimizer=name, **kwargs)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    fit(ref, ce, (data.x_train, data.y_train), optimizer=lambda params, **kw: cls(params, **kw), **kwargs)
    for p, q in zip(flat.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-10), (p - q).abs().max()
    storages = {p.untyped_storage().data_ptr() for p in flat.parameters()}
    assert len(storages) == 4  # released: no parameter is a view into the flat buffer any more
    assert all(p.grad is not None and p.grad.untyped_storage().data_ptr() not in storages for p in flat.parameters())


def test_flat_adam_reads_a_replaced_gradient():
    """A loss that sets the gradients to None (model.zero_grad()) makes autograd allocate new
    ones outside the flat buffer; FlatAdam reads them back instead of stepping on zeros."""
    x, y = torch.randn(32, 3), torch.rand(32)

    def loss_fn(model, batch):
        model.zero_grad(set_to_none=True)
        return bce_loss(model, batch)

    torch.manual_seed(0)
    a = torch.nn.Linear(3, 1)
    b = torch.nn.Linear(3, 1)
    b.load_state_dict(a.state_dict())
    fit(a, loss_fn, (x, y), epochs=2, batch_size=8, lr=0.1, progress=False)
    fit(b, bce_loss, (x, y), epochs=2, batch_size=8, lr=0.1, progress=False)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_flat_adam_needs_one_dtype():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    assert not FlatAdam.supports(params) and FlatAdam.supports(params[:1])


def test_bad_data_shapes():
    with pytest.raises(ValueError, match="has 9 samples"):
        fit(torch.nn.Linear(3, 1), bce_loss, (torch.randn(10, 3), torch.zeros(9)), epochs=1,
            batch_size=4, lr=0.1, progress=False)
    with pytest.raises(ValueError, match="scalar tensor"):
        fit(torch.nn.Linear(3, 1), lambda m, b: m(b[0]), (torch.randn(10, 3),), epochs=1,
            batch_size=4, lr=0.1, progress=False)


# ------------------------------------------------------------------------------------------
# accuracy / AUC
# ------------------------------------------------------------------------------------------

def test_accuracy_and_auc():
    assert accuracy(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0])) == 0.5
    assert accuracy(torch.tensor([-1.0, 2.0, 0.5]), torch.tensor([0.0, 1.0, 0.0])) == pytest.approx(2 / 3)
    assert accuracy(torch.tensor([0.4, 0.6]), torch.tensor([0, 1]), from_logits=False) == 1.0
    assert roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    scores = torch.tensor([[0.9, 0.2, 0.5], [0.1, 0.8, 0.5], [0.8, 0.3, 0.5], [0.2, 0.1, 0.5]])
    labels = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 0], [0, 0, 0]])
    per = concept_aucs(scores, labels)
    assert per[0] == 1.0 and per[1] == 0.75 and per[2] == 0.5
    assert mean_concept_auc(scores, labels) == pytest.approx((1.0 + 0.75 + 0.5) / 3)
    # a concept with only one class is left out of the mean
    labels2 = labels.clone()
    labels2[:, 2] = 0
    assert math.isnan(concept_aucs(scores, labels2)[2])
    assert mean_concept_auc(scores, labels2) == pytest.approx((1.0 + 0.75) / 2)
    with pytest.raises(ValueError):
        mean_concept_auc(scores, torch.zeros(4, 3))


# ------------------------------------------------------------------------------------------
# HSIC against direct formulas written with numpy loops
# ------------------------------------------------------------------------------------------

def np_kernel(x, kind, sigma=None):
    n = len(x)
    K = np.zeros((n, n))
    if kind == "rbf" and sigma is None:
        dists = [np.sqrt(((x[i] - x[j]) ** 2).sum()) for i in range(n) for j in range(i + 1, n)]
        sigma = float(np.median(dists))
    for i in range(n):
        for j in range(n):
            if kind == "linear":
                K[i, j] = float(np.dot(x[i], x[j]))
            else:
                K[i, j] = math.exp(-((x[i] - x[j]) ** 2).sum() / (2 * sigma ** 2))
    return K


def np_hsic_biased(K, L):
    n = len(K)
    H = np.eye(n) - np.ones((n, n)) / n
    return np.trace(K @ H @ L @ H) / (n - 1) ** 2


def np_hsic_unbiased(K, L):
    n = len(K)
    Kt, Lt = K.copy(), L.copy()
    for i in range(n):
        Kt[i, i] = 0.0
        Lt[i, i] = 0.0
    one = np.ones(n)
    return (np.trace(Kt @ Lt) + (one @ Kt @ one) * (one @ Lt @ one) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * (one @ Kt @ Lt @ one)) / (n * (n - 3))


@pytest.mark.parametrize("kind", ["linear", "rbf"])
@pytest.mark.parametrize("unbiased", [False, True])
def test_hsic_matches_direct_formula(kind, unbiased):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 3))
    y = np.concatenate([x[:, :1] ** 2, rng.normal(size=(23, 1))], axis=1)
    K, L = np_kernel(x, kind), np_kernel(y, kind)
    expect = np_hsic_unbiased(K, L) if unbiased else np_hsic_biased(K, L)
    got = hsic(torch.from_numpy(x), torch.from_numpy(y), kind, unbiased=unbiased)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(expect, rel=1e-10, abs=1e-12)


def test_linear_hsic_is_cross_covariance_norm():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 4)), rng.normal(size=(50, 2))
    xc, yc = x - x.mean(0), y - y.mean(0)
    cross = xc.T @ yc / (len(x) - 1)
    assert hsic(torch.from_numpy(x), torch.from_numpy(y)).item() == pytest.approx((cross ** 2).sum())


def test_median_bandwidth_and_kernel():
    x = torch.tensor([[0.0], [1.0], [3.0]])
    assert median_bandwidth(x) == 2.0  # distances 1, 3, 2
    assert median_bandwidth(torch.zeros(5, 2)) == 1.0
    K = kernel_matrix(x, "rbf")
    assert K[0, 1].item() == pytest.approx(math.exp(-1 / 8))
    assert kernel_matrix(x, "rbf", sigma=1.0)[0, 2].item() == pytest.approx(math.exp(-4.5))


@pytest.mark.parametrize("kind", ["linear", "rbf"])
def test_hsic_independent_small_dependent_large(kind):
    g = torch.Generator().manual_seed(0)
    n = 400
    x = torch.randn(n, 2, generator=g, dtype=torch.float64)
    z = torch.randn(n, 2, generator=g, dtype=torch.float64)
    y_dep = x + 0.1 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    indep = hsic(x, z, kind, unbiased=True).item()
    dep = hsic(x, y_dep, kind, unbiased=True).item()
    assert abs(indep) < 0.02 * dep
    assert dep > (0.02 if kind == "rbf" else 1.0)
    # nonlinear dependence (zero correlation) is seen by RBF only
    if kind == "rbf":
        u = torch.randn(n, 1, generator=g, dtype=torch.float64)
        assert hsic(u, u ** 2, "rbf", unbiased=True).item() > 20 * abs(hsic(u, z[:, :1], "rbf", unbiased=True).item())


def test_hsic_is_differentiable():
    x = torch.randn(16, 3, requires_grad=True)
    y = torch.randn(16, 2)
    hsic(x, y, "rbf").backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
