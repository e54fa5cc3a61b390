"""What every zoo model shares: the compiled diagram, sizes, losses, explanations, the registry.

A zoo model is a `.pen` diagram in `zoo/` plus a thin wrapper (`ZooModel` subclass). The wrapper
compiles the diagram (its parameters live under `model.diagram`, named as in the diagram) and
adds only what a diagram cannot say: default inputs, training-time behaviour (losses, random
interventions), validation of user arguments, and `explain`. No layer is written in a wrapper.

    >>> import penrose_zoo
    >>> entry = penrose_zoo.MODELS["linear"]
    >>> entry.build()(**entry.example_inputs(batch=2)).shape
    torch.Size([2, 1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from penrose.checked import Checked
from penrose.errors import PenroseArgumentError
from penrose.reading import merge_sizes
from penrose.workspace import Workspace

ZOO_DIR = Path(__file__).resolve().parent

__all__ = [
    "ZOO_DIR",
    "Explanation",
    "InterventionError",
    "ModelEntry",
    "ZooModel",
    "list_lines",
    "load_diagram",
    "task_loss",
]


_WORKSPACE = Workspace()  # the zoo's diagrams and what they include, parsed and checked once per change


def load_diagram(path: Path, sizes: Mapping[str, Any] | None = None, **more_sizes: Any) -> Checked:
    """The checked diagram, at `sizes` (a mapping, or keywords); cached until the file, or a
    file it includes, changes (`penrose.workspace`)."""
    return _WORKSPACE.load(Path(path), sizes=merge_sizes(sizes, more_sizes))



class InterventionError(IndexError):
    """An intervention names a concept that does not exist or gives an unusable value."""


# ---- explanations -----------------------------------------------------------------------------


@dataclass
class Explanation:
    """An exact additive explanation: `parts` summed over its part legs, plus `bias`, is `output`.

    parts: [..., *part legs, *output legs]; `part_legs` names the part legs (e.g. ('k',) for
    concepts, ('m', 'k') for memory slots × concepts). bias broadcasts against `output`.
    details: the model's own quantities (concept activations, task weights, the selected slot,
    the most similar prototypes, attention probabilities...), also readable as attributes.

    >>> e = Explanation(torch.ones(3), torch.ones(2, 3), torch.zeros(()), ("k",))
    >>> e.total().tolist()
    [2.0, 2.0, 2.0]
    """

    output: torch.Tensor
    parts: torch.Tensor
    bias: torch.Tensor
    part_legs: tuple[str, ...]
    details: dict = field(default_factory=dict)
    names: tuple[str, ...] = ()  # names along the first part leg (features, concepts), if known
    out_legs: int = 1  # how many trailing legs of `parts` are the output's own legs

    def total(self) -> torch.Tensor:
        """Parts summed over the part legs, plus the bias: equals `output` up to rounding."""
        dims = tuple(range(-len(self.part_legs) - self.out_legs, -self.out_legs))
        return self.parts.sum(dims) + self.bias

    def residual(self) -> torch.Tensor:
        """output − total(): zero up to rounding (the completeness check)."""
        return self.output - self.total()

    def __getattr__(self, name):
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(f"{type(self).__name__} has no field or detail {name!r}; details: {sorted(details)}")


# ---- losses -----------------------------------------------------------------------------------


def task_loss(y: torch.Tensor, target: torch.Tensor, task: str) -> torch.Tensor:
    """'multiclass': cross-entropy on logits y[..., r] with integer targets; 'binary': BCE on
    y[..., 1] logits with 0./1. targets; 'regression': mean squared error on y[..., 1]."""
    if task == "multiclass":
        if y.dim() != 2:  # (a 2-d y goes in as it is: no view node for autograd to walk)
            y, target = y.reshape(-1, y.shape[-1]), target.reshape(-1)
        return F.cross_entropy(y, target if target.dtype == torch.long else target.long())
    if task in ("binary", "regression"):
        y = y.squeeze(-1)
        if target.shape != y.shape and target.numel() == y.numel():  # (one per example as a column [n, 1])
            target = target.reshape(y.shape)
        if task == "binary":
            return F.binary_cross_entropy_with_logits(y, target.to(y.dtype))
        return F.mse_loss(y, target.to(y.dtype))
    raise ValueError(f"task must be 'multiclass', 'binary' or 'regression', got {task!r}")


def task_loss_grad(y: torch.Tensor, target: torch.Tensor, task: str) -> torch.Tensor:
    """The gradient of `task_loss(y, target, task)` with respect to y, in closed form (no
    autograd): cross-entropy (softmax(y) − onehot(target)) / N, BCE (σ(y) − target) / N, squared
    error 2 (y − target) / N, N the number of examples. What a generated training step seeds the
    diagram's backward with."""
    if task == "multiclass":
        y2, t = y.reshape(-1, y.shape[-1]), target.reshape(-1)
        t = t if t.dtype == torch.long else t.long()
        grad = torch.softmax(y2, -1)
        grad.scatter_add_(1, t.unsqueeze(1), torch.full((t.shape[0], 1), -1.0, dtype=grad.dtype, device=grad.device))
        return grad.div_(t.shape[0]).reshape(y.shape)
    t = target if target.shape == y.shape else target.reshape(y.shape)  # (integer labels are promoted by the subtraction itself)
    if task == "binary":
        return torch.sigmoid(y).sub_(t).div_(t.numel())
    if task == "regression":
        return (y - t).mul_(2.0 / t.numel())
    raise ValueError(f"task must be 'multiclass', 'binary' or 'regression', got {task!r}")


def bce_grad(z: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient with respect to the logits z of the mean of weight × binary cross-entropy
    (torch's `binary_cross_entropy_with_logits(z, target, weight=weight)`): weight (σ(z) −
    target) / z.numel(), in closed form."""
    return bce_grad_scaled(z, target, (1.0 if weight is None else weight) / z.numel())


def bce_grad_scaled(z: torch.Tensor, target: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """`bce_grad(z, target, weight)` given scale = weight / z.numel(): (σ(z) − target) · scale."""
    return torch.sigmoid(z).sub_(target).mul_(scale)


# ---- the wrapper base -------------------------------------------------------------------------


class ZooModel(torch.nn.Module):
    """A compiled zoo diagram (`self.diagram`) and the helpers around it.

    Subclasses set `diagram_file` (a file in zoo/), `defaults` (dim sizes), `example_sizes`
    (sizes of legs only inputs carry, for `example_inputs`) and `input_names`, and implement
    `explain` and `loss`.
    """

    diagram_file: ClassVar[str]
    defaults: ClassVar[dict] = {}
    example_sizes: ClassVar[dict] = {}
    tasks: ClassVar[tuple[str, ...]] = ("multiclass", "binary", "regression")
    default_task: ClassVar[str] = "multiclass"
    #: the tensors of a training batch by role ('y' the task's labels, 'c' the concepts'), as
    #: `loss` reads them; None: any (`check_labels` checks the count and the labels)
    batch_form: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, *, seed: int | None = 0, task: str | None = None, **sizes: int) -> None:
        super().__init__()
        unknown = sorted(set(sizes) - set(self.dims()))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: unknown size {unknown[0]!r}; the diagram "
                f"{self.diagram_file} declares {', '.join(self.dims())}"
            )
        self.task = task or self.default_task
        if self.task not in self.tasks:
            raise ValueError(f"{type(self).__name__}: task must be one of {self.tasks}, got {self.task!r}")
        from penrose.compiler import build

        self.diagram = build(load_diagram(self.diagram_path(), {**self.defaults, **sizes}), seed=seed)
        checked: Checked = getattr(self.diagram, "penrose_checked")  # noqa: B009 (typed: Module.__getattr__ is not)
        self.sizes = {k: v for k, v in checked.dim_sizes().items() if v is not None}
        if self.task == "binary" and self.sizes.get("r", 1) != 1:
            raise ValueError(f"{type(self).__name__}: a binary task needs r = 1 output, got r = {self.sizes['r']}")

    # -- the diagram
    @classmethod
    def diagram_path(cls) -> Path:
        return ZOO_DIR / cls.diagram_file

    @classmethod
    def dims(cls) -> tuple[str, ...]:
        return tuple(load_diagram(cls.diagram_path()).dims)

    @classmethod
    def resolved_sizes(cls, **sizes: int) -> dict:
        """Every dim's size for these overrides (without compiling)."""
        checked = load_diagram(cls.diagram_path(), {**cls.defaults, **sizes})
        return {k: v for k, v in checked.dim_sizes().items() if v is not None}

    @classmethod
    def param_count(cls, **sizes: int) -> int:
        return load_diagram(cls.diagram_path(), {**cls.defaults, **sizes}).param_count()

    # -- inputs
    @classmethod
    def make_inputs(cls, sizes: dict, batch: int, generator: torch.Generator | None = None) -> dict:
        """Random inputs for a model of these sizes (override per model)."""
        raise NotImplementedError

    @classmethod
    def example_inputs_for(cls, batch: int = 4, seed: int = 0, **sizes: int) -> dict:
        """Random inputs for `cls(**sizes)`; sizes of legs only inputs carry (attention's t) may
        be given too."""
        runtime = {k: v for k, v in sizes.items() if k in cls.example_sizes}
        compiled = {k: v for k, v in sizes.items() if k not in cls.example_sizes}
        resolved = {**cls.example_sizes, **cls.resolved_sizes(**compiled), **runtime}
        return cls.make_inputs(resolved, batch, torch.Generator().manual_seed(seed))

    def example_inputs(self, batch: int = 4, seed: int = 0) -> dict:
        """Random inputs matching this model's sizes, as keyword arguments of forward."""
        g = torch.Generator().manual_seed(seed)
        inputs = self.make_inputs({**self.example_sizes, **self.sizes}, batch, g)
        p = next(iter(self.parameters()), None)
        if p is not None:
            inputs = {k: (v.to(p.device, p.dtype) if v.is_floating_point() else v.to(p.device)) for k, v in inputs.items()}
        return inputs

    # -- training
    def loss(self, batch: tuple) -> torch.Tensor:
        raise NotImplementedError

    def label_roles(self, n: int) -> dict[int, str]:
        """Which tensors of an n-tensor batch are labels, by position: 'task' (`batch_form`'s
        'y') or 'concepts' ('c')."""
        form = self.batch_form
        if form is None or n != len(form):
            return {}
        return {i: "task" if role == "y" else "concepts" for i, role in enumerate(form) if role in ("y", "c")}

    def concept_kinds(self) -> tuple[str, ...]:
        """The type of each concept column ('binary', 'categorical', 'continuous'): binary here."""
        return ("binary",) * self.sizes.get("k", 0)

    def check_labels(self, data: Any, split: str = "train") -> None:
        """Refuse, before training, labels this model's losses cannot read: task labels against
        `task` (class ids 0..r−1; binary targets in [0, 1]) and concept labels against the
        concepts' types (`concept_kinds`). A PenroseArgumentError names the tensor (as `fit`
        does: "y_train (train_data[2])"), the first bad index and its value. (Labels out of range
        would otherwise index past the logits, or drive a cross-entropy below zero.)"""
        if data is None:
            return
        from penrose_zoo.train import data_tensors
        from penrose_zoo.validate import concept_labels, task_labels

        tensors, _ = data_tensors(data, split)
        form = self.batch_form
        if form is not None and len(tensors) != len(form):  # (the loss would fail to unpack it at the first step)
            raise PenroseArgumentError(f"{split}_data must be ({', '.join(form)}) for {type(self).__name__}, got "
                                       f"{len(tensors)} tensor{'s' if len(tensors) != 1 else ''}")
        for i, role in self.label_roles(len(tensors)).items():
            name = f"{'y' if role == 'task' else 'c'}_{split} ({split}_data[{i}])"  # (fit's names, by role)
            if role == "task":
                task_labels(tensors[i], name, self.task, self.sizes.get("r"))
            else:
                units = getattr(self, "concept_units", None)  # (a concept model's; categorical concepts span columns)
                concept_labels(tensors[i], name, self.concept_kinds(), units() if callable(units) else None,
                               getattr(self, "concept_names", None))

    def loss_fn(self, **options: Any) -> Callable:
        """`loss_fn(model, batch)` for `penrose_zoo.train.fit`."""
        return lambda model, batch: model.loss(batch, **options)

    def fit(self, train: Any, val: Any = None, **fit_kwargs: Any) -> dict:
        """Train with the zoo's one training loop (`penrose_zoo.train.fit`) on this model's loss."""
        from penrose_zoo.train import fit

        self.check_labels(train, "train")
        self.check_labels(val, "val")
        return fit(self, self.loss_fn(), train, val, **fit_kwargs)

    def extra_repr(self) -> str:
        return f"diagram={self.diagram_file!r}, task={self.task!r}, sizes={self.sizes}"


# ---- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    """One model of the zoo: `build(**sizes)` a model, `example_inputs(batch)` to call it with.

    >>> import penrose_zoo
    >>> entry = ModelEntry("linear", penrose_zoo.LinearModel, "logistic / linear regression")
    >>> model = entry.build(f=3)
    >>> model(**entry.example_inputs(batch=2, f=3)).shape
    torch.Size([2, 1])
    """

    name: str
    cls: type[ZooModel]
    summary: str
    trained_on: str = ""

    def build(self, **sizes: Any) -> ZooModel:
        """The model with default sizes, overridden by `sizes` (and `seed=`, `task=`)."""
        return self.cls(**sizes)

    def example_inputs(self, batch: int = 4, seed: int = 0, **sizes: int) -> dict:
        """Random keyword inputs for `build(**sizes)`'s forward."""
        return self.cls.example_inputs_for(batch, seed, **sizes)

    def param_count(self, **sizes: int) -> int:
        return self.cls.param_count(**sizes)

    @property
    def diagram(self) -> str:
        return f"zoo/{self.cls.diagram_file}"


def format_count(n: int) -> str:
    return f"{n:,}" if n < 10**6 else f"{n / 1e6:.2f}M"


def list_lines(models: dict) -> list[str]:
    rows = [(e.name, format_count(e.param_count()), e.diagram, e.summary) for e in models.values()]
    w = [max(len(r[i]) for r in rows + [("model", "params", "diagram", "")]) for i in range(3)]
    head = f"{'model':<{w[0]}}  {'params':>{w[1]}}  {'diagram':<{w[2]}}  summary"
    return [head] + [f"{a:<{w[0]}}  {b:>{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows]
