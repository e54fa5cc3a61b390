"""Training recipes: every zoo model trained end to end on real offline data with `penrose_zoo.train.fit`.

`run(name, quick=False)` trains one model and returns a `Result` with its validation metrics;
`tools/train_zoo.py` runs them all and prints the table in docs/zoo.md; the tests run them with
`quick=True` (a few epochs on a subset) and check that each model learns.

Data: scikit-learn's shipped tables (breast cancer, digits) and the fortunes concept data
(`penrose_zoo.data.fortunes_concepts`: 8 category concepts, binary task science & technology vs
humanities & life, TF-IDF features).

    >>> from penrose_zoo.recipes import run
    >>> result = run("linear", quick=True)
    >>> result.metrics["val_acc"] > 0.9
    True
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

import penrose_zoo
from penrose_zoo.data import fortunes_concepts, load_tabular
from penrose_zoo.metrics import accuracy, roc_auc

__all__ = ["Result", "RECIPES", "run"]


@dataclass
class Result:
    name: str
    data: str
    metrics: dict
    model: torch.nn.Module = field(repr=False)
    seconds: float = 0.0
    settings: dict = field(default_factory=dict)


@functools.lru_cache(maxsize=None)
def _tabular(name: str):
    return load_tabular(name)


@functools.lru_cache(maxsize=None)
def _fortunes(max_features: int):
    return fortunes_concepts(max_features=max_features)


def _subset(tensors, n, seed=0):
    """A random subset of n rows (the data come ordered by category)."""
    idx = torch.randperm(tensors[0].shape[0], generator=torch.Generator().manual_seed(seed))[:n]
    return tuple(t[idx] for t in tensors)


# ---- tabular -----------------------------------------------------------------------------------


def _classifier(name, data_name, quick, seed, progress, epochs, lr, **build):
    data = _tabular(data_name)
    task = "binary" if data.task == "binary" else "multiclass"
    r = 1 if task == "binary" else data.n_classes
    model = penrose_zoo.MODELS[name].build(seed=seed, f=data.n_features, r=r, task=task,
                                   **({"feature_names": data.feature_names} if name != "mlp" else {}), **build)
    train = (data.x_train, data.y_train)
    if quick:
        epochs = max(2, epochs // 5)
    hist = model.fit(train, (data.x_val, data.y_val), epochs=epochs, batch_size=32, lr=lr, seed=seed,
                     progress=progress, val_every=epochs)
    model.eval()
    with torch.no_grad():
        out = model(data.x_val)
        y = out if isinstance(out, torch.Tensor) else out.y
    metrics = {"val_acc": accuracy(y, data.y_val)}
    if task == "binary":
        metrics["val_auc"] = roc_auc(y, data.y_val)
    majority = torch.bincount(data.y_val.long()).max().item() / len(data.y_val)
    metrics["majority_baseline"] = majority
    return model, metrics, {"epochs": epochs, "lr": lr, "batch_size": 32, "train_rows": len(train[0]), **build}, hist


def _linear(quick, seed, progress):
    return _classifier("linear", "breast_cancer", quick, seed, progress, epochs=40, lr=1e-2)


def _mlp(quick, seed, progress):
    return _classifier("mlp", "digits", quick, seed, progress, epochs=30, lr=3e-3, j=64)


def _nam(quick, seed, progress):
    return _classifier("neural_additive", "breast_cancer", quick, seed, progress, epochs=40, lr=3e-3)


# ---- attention on digit rows -----------------------------------------------------------------


def _attention(name, task):
    def recipe(quick, seed, progress):
        from penrose_zoo.self_attention import digit_rows

        data = _tabular("digits")
        # a blanked row is drawn per copy: three copies of the training images, three draws
        copies = 1 if (quick or task == "next") else 3
        parts = [digit_rows(data.x_train, task, seed=seed * 10 + i) for i in range(copies)]
        train = tuple(torch.cat(p) for p in zip(*parts))
        val = digit_rows(data.x_val, task, seed=seed * 10 + 9)
        epochs = 6 if quick else (20 if task == "masked" else 40)
        model = penrose_zoo.MODELS[name].build(seed=seed, e=16, h=4, d=8)
        model.fit(train, val, epochs=epochs, batch_size=64, lr=1e-2, seed=seed, progress=progress,
                  val_every=epochs, grad_clip=1.0)
        model.eval()
        with torch.no_grad():
            Z, target, weight = val
            mse = (((model(Z).y - target) ** 2) * weight).sum() / weight.sum()
            zero = ((target**2) * weight).sum() / weight.sum()
        metrics = {"val_mse": mse.item(), "val_r2": 1 - (mse / zero).item(), "zero_baseline_mse": zero.item()}
        return model, metrics, {"epochs": epochs, "lr": 1e-2, "batch_size": 64, "grad_clip": 1.0,
                                  "train_rows": len(train[0]), "tokens": 8, "e": 16, "h": 4, "d": 8}, None

    return recipe


# ---- sparse autoencoders on digits -----------------------------------------------------------


def _sae(name, **build):
    def recipe(quick, seed, progress):
        data = _tabular("digits")
        epochs = 5 if quick else 60
        model = penrose_zoo.MODELS[name].build(seed=seed, d=64, k=256, **build)
        model.fit((data.x_train,), (data.x_val,), epochs=epochs, batch_size=64, lr=3e-3, seed=seed,
                  progress=progress, val_every=epochs)
        model.eval()
        with torch.no_grad():
            out = model(data.x_val)
            fvu = ((out.x_hat - data.x_val) ** 2).sum() / ((data.x_val - data.x_val.mean(0)) ** 2).sum()
            l0 = (out.c > 0).float().sum(-1).mean().item()
            alive = (model(data.x_train).c > 0).any(0).float().mean().item()
        metrics = {"val_explained_variance": 1 - fvu.item(), "val_mean_l0": l0, "alive_features": alive}
        return model, metrics, {"epochs": epochs, "lr": 3e-3, "batch_size": 64, "k": 256, **build}, None

    return recipe


# ---- concept models on fortunes --------------------------------------------------------------


def _concepts(name, mode="joint", **build):
    def recipe(quick, seed, progress):
        data = _fortunes(500 if quick else 2000)
        train, val = data.train_tuple(), data.val_tuple()
        if quick:
            train = _subset(train, 1500, seed)
        epochs = 10 if quick else 40
        model = penrose_zoo.MODELS[name].build(seed=seed, f=data.x_train.shape[1], k=len(data.concept_names),
                                       r=len(data.task_names), concept_names=data.concept_names, **build)
        if hasattr(model, "init_prototypes"):
            model.init_prototypes(train[0], train[1], seed=seed)
        lr = 1e-2
        model.fit(train, val, mode=mode, epochs=epochs, batch_size=64, lr=lr, seed=seed, progress=progress,
                  val_every=epochs)
        metrics = model.evaluate(val, intervene_all=True)
        metrics = {f"val_{k}": v for k, v in metrics.items()}
        metrics["majority_baseline"] = torch.bincount(val[2]).max().item() / len(val[2])
        return model, metrics, {"epochs": epochs, "lr": lr, "batch_size": 64, "mode": mode,
                                "train_rows": len(train[0]), "features": data.x_train.shape[1], **build}, None

    return recipe


#: recipe name -> (model name, data description, recipe function(quick, seed, progress)).
RECIPES = {
    "linear": ("linear", "breast_cancer (569 × 30, binary)", _linear),
    "mlp": ("mlp", "digits (1797 × 64, 10 classes)", _mlp),
    "self_attention": ("self_attention", "digits as 8 row tokens: reconstruct a blanked row", _attention("self_attention", "masked")),
    "causal_self_attention": ("causal_self_attention", "digits as 8 row tokens: predict the next row",
                              _attention("causal_self_attention", "next")),
    "sparse_autoencoder": ("sparse_autoencoder", "digits pixels (64)", _sae("sparse_autoencoder", l1=3e-3)),
    "topk_sparse_autoencoder": ("topk_sparse_autoencoder", "digits pixels (64)", _sae("topk_sparse_autoencoder", n_active=8)),
    "concept_bottleneck/joint": ("concept_bottleneck", "fortunes concepts", _concepts("concept_bottleneck", "joint")),
    "concept_bottleneck/independent": ("concept_bottleneck", "fortunes concepts",
                                       _concepts("concept_bottleneck", "independent")),
    "concept_bottleneck/sequential": ("concept_bottleneck", "fortunes concepts",
                                      _concepts("concept_bottleneck", "sequential")),
    "concept_embedding": ("concept_embedding", "fortunes concepts", _concepts("concept_embedding", "joint")),
    "prototype_concepts": ("prototype_concepts", "fortunes concepts", _concepts("prototype_concepts", "joint")),
    "neural_additive": ("neural_additive", "breast_cancer (569 × 30, binary)", _nam),
    "mixture_of_linear_models": ("mixture_of_linear_models", "fortunes concepts",
                                 _concepts("mixture_of_linear_models", "joint")),
    "senn": ("senn", "breast_cancer (569 × 30, binary)", lambda *a, **k: _senn_recipe()(*a, **k)),
    "cav_probe": ("cav_probe", "fortunes concepts (TF-IDF layer probed)", lambda *a, **k: _cav_recipe()(*a, **k)),
}


def _senn_recipe():
    from penrose_zoo.senn import recipe

    return recipe


def _cav_recipe():
    from penrose_zoo.cav_probe import recipe

    return recipe


def run(name: str, quick: bool = False, seed: int = 0, progress: bool = False) -> Result:
    """Train the recipe `name` (see RECIPES) and return its validation metrics."""
    from penrose.errors import seed_value
    from penrose_zoo.validate import choice, flag

    choice(name, "recipe", tuple(RECIPES))
    quick, progress, seed = flag(quick, "quick"), flag(progress, "progress"), seed_value(seed)
    model_name, data, fn = RECIPES[name]
    t0 = time.perf_counter()
    model, metrics, settings, _ = fn(quick, seed, progress)
    return Result(name, data, metrics, model, time.perf_counter() - t0, settings)
