"""One small, model-agnostic training loop for every zoo model.

    history = fit(model, loss_fn, (x, y), (x_val, y_val), epochs=20, batch_size=64, lr=1e-2)

`loss_fn(model, batch) -> scalar tensor`, where `batch` is a tuple of tensors sliced from the
data tuple (same order). Inputs are checked once, before training, for NaN/inf; a non-finite
loss stops training with the step at which it happened.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from penrose.errors import PenroseArgumentError, seed_value
from penrose_zoo.validate import flag, number, whole

__all__ = ["FlatAdam", "NonFiniteInputError", "NonFiniteLossError", "fit", "check_finite", "data_tensors",
           "iterate_batches"]


class NonFiniteInputError(ValueError):
    """An input tensor holds NaN or ±inf. `name`, `index` (tuple) and `value` say where."""

    def __init__(self, name: str, index: tuple[int, ...], value: float):
        self.name, self.index, self.value = name, index, value
        kind = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        super().__init__(f"{name} has {kind} at index {index}")


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or ±inf. `step` (0-based optimiser step), `epoch`, `value`."""

    def __init__(self, step: int, epoch: int, value: float, where: str = "training"):
        self.step, self.epoch, self.value = step, epoch, value
        super().__init__(
            f"{where} loss is non-finite ({value}) at step {step} (epoch {epoch}); "
            f"try a lower learning rate or check the loss function"
        )


_ROLES = {1: ("x",), 2: ("x", "y"), 3: ("x", "c", "y")}


def data_tensors(data, split: str) -> tuple[tuple[torch.Tensor, ...], tuple[str, ...]]:
    """Normalise data to (tensors, names). Accepts a tuple/list of tensors, a TensorDataset
    (anything with `.tensors`), a single tensor, or a mapping name -> tensor."""
    if isinstance(data, torch.Tensor):
        data = (data,)
    if isinstance(data, Mapping):
        names = tuple(f"{k}" for k in data)
        tensors = tuple(data.values())
    else:
        tensors = tuple(getattr(data, "tensors", data))
        roles = _ROLES.get(len(tensors))
        names = tuple(
            (f"{roles[i]}_{split} ({split}_data[{i}])" if roles else f"{split}_data[{i}]")
            for i in range(len(tensors))
        )
    if not tensors:
        raise PenroseArgumentError(f"{split}_data holds no tensors")
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise PenroseArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim == 0:
            raise PenroseArgumentError(f"{name} is a scalar; data tensors need a leading sample dimension")
    n = tensors[0].shape[0]
    for name, t in zip(names, tensors):
        if t.shape[0] != n:
            raise PenroseArgumentError(f"{name} has {t.shape[0]} samples but {names[0]} has {n}")
    if n == 0:
        raise PenroseArgumentError(f"{split}_data has zero samples")
    return tensors, names


def check_finite(tensor: torch.Tensor, name: str) -> None:
    """Raise NonFiniteInputError at the first (row-major) NaN/inf entry of a float tensor."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return
    bad = ~torch.isfinite(tensor)
    if bad.any():
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tensor.shape))
        value = tensor.reshape(-1)[flat].item()
        raise NonFiniteInputError(name, index, float(value.real if isinstance(value, complex) else value))


def iterate_batches(tensors: Sequence[torch.Tensor], batch_size: int, generator: torch.Generator | None = None):
    """Yield tuples of row-aligned slices; shuffled with `generator` if given, else in order."""
    n = tensors[0].shape[0]
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        yield tuple(t[idx] for t in tensors)


class FlatAdam:
    """Adam (or AdamW) over one flat buffer that holds every parameter: the update is one call of
    torch's fused Adam kernel (six tensor operations where torch has no such kernel) whatever
    the number of parameters, and `zero_grad` one. While it lives (inside
    `fit`), each parameter and its `.grad` are views into the flat buffers (autograd accumulates
    into them in place); `release()` gives every parameter its own storage back.

    The update is torch.optim.Adam's (Kingma and Ba 2015, with bias correction):
    m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², p ← p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε);
    `decoupled=True` is AdamW's decay p ← p (1 − lr·wd), otherwise L2 (g ← g + wd·p).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, decoupled: bool = False) -> None:
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps, self.decoupled = lr, weight_decay, betas, eps, decoupled
        sizes = [p.numel() for p in self.params]
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.grad = torch.zeros_like(self.flat)
        self.m = torch.zeros_like(self.flat)
        self.v = torch.zeros_like(self.flat)
        self.t = 0
        # the fused kernel where torch has one for this buffer (float32/64 on the CPU or CUDA)
        fused_ok = self.flat.device.type in ("cpu", "cuda") and self.flat.dtype in (torch.float32, torch.float64)
        self._fused = (torch._fused_adamw_ if decoupled else torch._fused_adam_) if fused_ok else None
        self._step = torch.zeros((), dtype=torch.float32, device=self.flat.device)
        offset = 0
        self.grad_views: list[torch.Tensor] = []
        with torch.no_grad():
            for p, n in zip(self.params, sizes):
                p.data = self.flat[offset:offset + n].view_as(p)
                p.grad = self.grad[offset:offset + n].view_as(p)
                self.grad_views.append(p.grad)
                offset += n

    @staticmethod
    def supports(params: Sequence[torch.nn.Parameter]) -> bool:
        """One device, one floating dtype, dense, contiguous: what one flat buffer can hold."""
        return bool(params) and all(
            p.dtype == params[0].dtype and p.device == params[0].device and p.is_floating_point()
            and not p.is_sparse and p.is_contiguous() for p in params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad.zero_()

    def step(self) -> None:
        # (no torch.no_grad() around it: the buffers are plain tensors, no graph is recorded)
        for p, view in zip(self.params, self.grad_views):
            if p.grad is not view:  # replaced (a zero_grad(set_to_none=True) in the loss): read it back
                with torch.no_grad():
                    view.copy_(p.grad if p.grad is not None else torch.zeros_like(view))
                p.grad = view
        self.t += 1
        b1, b2 = self.betas
        if self._fused is not None:  # torch's fused Adam kernel (what Adam(fused=True) runs): one call
            self._step.fill_(self.t)
            self._fused([self.flat], [self.grad], [self.m], [self.v], [], [self._step], lr=self.lr, beta1=b1,
                        beta2=b2, weight_decay=self.weight_decay, eps=self.eps, amsgrad=False, maximize=False)
            return
        g = self.grad
        if self.weight_decay and not self.decoupled:
            g = g.add(self.flat, alpha=self.weight_decay)
        elif self.weight_decay:
            self.flat.mul_(1 - self.lr * self.weight_decay)
        self.m.lerp_(g, 1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self.v.sqrt() / math.sqrt(1 - b2 ** self.t)).add_(self.eps)
        self.flat.addcdiv_(self.m, denom, value=-self.lr / (1 - b1 ** self.t))

    def release(self) -> None:
        """Each parameter (and gradient) back in its own storage."""
        with torch.no_grad():
            for p in self.params:
                p.data = p.data.clone()
                if p.grad is not None:
                    p.grad = p.grad.clone()


#: the optimizers `fit` makes by name
OPTIMIZERS = ("adam", "adamw", "sgd")


def _make_optimizer(optimizer, params, lr: float, weight_decay: float) -> torch.optim.Optimizer | FlatAdam:
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        return optimizer(params, lr=lr, weight_decay=weight_decay)
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise PenroseArgumentError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, an Optimizer or a "
                                   f"factory; got {optimizer!r}")
    if not params:
        raise PenroseArgumentError("the model has no trainable parameters (every one has requires_grad=False)")
    if optimizer in ("adam", "adamw") and FlatAdam.supports(params):
        # a small model's step is overhead: one flat buffer makes the update six operations
        return FlatAdam(params, lr, weight_decay, decoupled=(optimizer == "adamw"))
    # the fused kernels update every parameter in one call: a third of the step time of small models
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64)
                                 and not p.is_sparse for p in params)
    table = {
        "adam": lambda: torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=fused or None),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None),
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay),
    }
    return table[optimizer]()


#: training data up to this size is shuffled with one gather per epoch (a copy of it), larger data
#: batch by batch
GATHER_ONCE_BYTES = 1 << 28


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)


@contextlib.contextmanager
def _denormals_flushed(wanted: bool):
    """Subnormal floats flushed to zero inside (where wanted and the CPU can), off again afterwards."""
    flushing = wanted and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def _check_loss(loss: torch.Tensor, step: int, epoch: int) -> None:
    value = loss.item()
    if not math.isfinite(value):
        raise NonFiniteLossError(step, epoch, value)


def _scalar_loss(loss, where: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor during {where}, got {shape}")
    return loss.reshape(())


@torch.no_grad()
def _evaluate(model, loss_fn, tensors, batch_size, device, metric_fn, step, epoch) -> dict:
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        for batch in iterate_batches(tensors, batch_size):
            batch = tuple(t.to(device) for t in batch)
            loss = _scalar_loss(loss_fn(model, batch), "validation")
            total += loss.item() * batch[0].shape[0]
            count += batch[0].shape[0]
        out = {"val_loss": total / count}
        if not math.isfinite(out["val_loss"]):
            raise NonFiniteLossError(step, epoch, out["val_loss"], where="validation")
        if metric_fn is not None:
            m = metric_fn(model, tuple(t.to(device) for t in tensors))
            if isinstance(m, Mapping):
                out.update({f"val_{k}": float(v) for k, v in m.items()})
            else:
                out["val_metric"] = float(m)
        return out
    finally:
        model.train(was_training)


def fit(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], torch.Tensor],
    train_data,
    val_data=None,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    optimizer="adam",
    weight_decay: float = 0,
    seed: int = 0,
    progress: bool = True,
    metric_fn: Callable | None = None,
    val_every: int = 1,
    grad_clip: float | None = None,
    step_fn: Callable[[tuple[torch.Tensor, ...]], torch.Tensor | None] | None = None,
    flush_denormal: bool = True,
) -> dict:
    """Train `model` by minibatch gradient descent on `loss_fn(model, batch)`.

    train_data / val_data: a tuple of row-aligned tensors (or a TensorDataset, or a mapping
      name -> tensor); batches are tuples in the same order. In error messages, 1-, 2- and
      3-tuples are named (x), (x, y), (x, c, y), e.g. "x_train (train_data[0]) has NaN at index
      (12, 3)".
    optimizer: 'adam' | 'adamw' | 'sgd' (momentum 0.9), an Optimizer instance, or a factory
      called as factory(params, lr=lr, weight_decay=weight_decay). 'adam' and 'adamw' update
      one flat buffer of all trainable parameters (`FlatAdam`, torch.optim.Adam's update) when
      they share a device and dtype; the parameters get their own storage back at the end.
    seed: seeds the shuffling generator and, inside a forked RNG (the caller's global RNG state
      is restored afterwards), torch's global RNG for dropout and the like. The same seed and
      model initialisation give the same run.
    metric_fn: metric_fn(model, val_tuple) -> float or {name: float}, evaluated in eval mode
      under no_grad on the whole validation set at each validation.
    val_every: validate after every `val_every` epochs and after the last one.
    grad_clip: if set, clip the global gradient norm to this value.
    step_fn: step_fn(batch) -> loss, a training step that puts each parameter's gradient in its
      `.grad` itself (a generated backward, `ConceptModel.generated_step`); it replaces
      `loss_fn(model, batch).backward()` in training (validation still reads `loss_fn`). A step
      may return None and give its epoch's losses, one per step, from `step_fn.epoch_losses()`
      (`GeneratedStep` does: it computes them together). A step with `prepare(tensors)` gets the
      training tensors it returns (the same rows: `GeneratedStep` gives integer targets the
      dtype and shape its loss gradient subtracts them at, once per fit rather than per step).
      A step with `uses_autograd = False`
      (GeneratedStep) runs under one `torch.no_grad()` per epoch rather than entering its own.
    flush_denormal: on the CPU, subnormal floats (below 1.2e-38 in float32) are flushed to zero
      while training (`torch.set_flush_denormal`; off again afterwards): a CPU computes with
      them tens of times slower, and a concept the model separates well drives sigmoid outputs
      and their derivatives into them (the dot toy set's bottleneck trains 1.4× slower
      without). The values it changes are below 1e-38.

    Returns a history dict: 'epoch', 'train_loss' (mean over each epoch's batches, per epoch),
    'val_epoch', 'val_loss' and 'val_metric' / 'val_<name>' (per validation), 'steps', 'seconds'.
    Raises PenroseArgumentError (a TypeError and ValueError) naming the argument for an epoch
    count, batch size or val_every that is not a whole number in range, an lr or weight_decay
    that is negative or not finite, a grad_clip that is not above 0 (a negative rate or clip
    would climb the loss), a seed that is not a seed;
    NonFiniteInputError (ValueError) before training if any float input holds NaN/inf,
    and NonFiniteLossError (FloatingPointError) naming the step if the loss becomes non-finite.
    The losses stay on the device until the end of each epoch (no host sync per step; with
    `progress`, every tenth is read for the bar), so a non-finite loss stops training at the end
    of its epoch, naming the step where it first appeared.
    """
    epochs = whole(epochs, "epochs", low=0)
    batch_size = whole(batch_size, "batch_size", low=1)
    val_every = whole(val_every, "val_every", low=1)
    lr = number(lr, "lr", low=0)  # (torch's optimizers take 0; a negative rate climbs the loss)
    weight_decay = number(weight_decay, "weight_decay", low=0)
    if grad_clip is not None:
        grad_clip = number(grad_clip, "grad_clip", low=0, low_open=True)
    seed = seed_value(seed)
    progress, flush_denormal = flag(progress, "progress"), flag(flush_denormal, "flush_denormal")
    for name, fn in (("metric_fn", metric_fn), ("step_fn", step_fn)):
        if fn is not None and not callable(fn):
            raise PenroseArgumentError(f"{name} must be callable or None, got {type(fn).__name__}")
    if not callable(loss_fn):
        raise PenroseArgumentError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    train_tensors, train_names = data_tensors(train_data, "train")
    for t, name in zip(train_tensors, train_names):
        check_finite(t, name)
    prepare = getattr(step_fn, "prepare", None)
    if prepare is not None:  # the step's own form of the rows, made once (its targets' dtype and shape)
        prepared = tuple(prepare(train_tensors))
        if len(prepared) != len(train_tensors) or any(p.shape[0] != t.shape[0] for p, t in zip(prepared, train_tensors)):
            raise ValueError("step_fn.prepare must give one tensor per training tensor, with the same rows")
        train_tensors = prepared
    val_tensors = None
    if val_data is not None:
        val_tensors, val_names = data_tensors(val_data, "val")
        if len(val_tensors) != len(train_tensors):  # (the loss would meet it only after an epoch of training)
            raise PenroseArgumentError(f"val_data holds {len(val_tensors)} tensors, train_data {len(train_tensors)}; "
                                       "batches of both go to loss_fn, so they hold the same roles")
        for t, name in zip(val_tensors, val_names):
            check_finite(t, name)

    params = [p for p in model.parameters() if p.requires_grad]
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    opt = _make_optimizer(optimizer, params, lr, weight_decay)

    history: dict = {"epoch": [], "train_loss": [], "val_epoch": [], "val_loss": []}
    n = train_tensors[0].shape[0]
    steps_per_epoch = math.ceil(n / batch_size)
    step = 0
    start_time = time.perf_counter()
    shuffler = torch.Generator().manual_seed(seed)
    devices = [device.index or 0] if device.type == "cuda" else []
    gather_once = sum(t.numel() * t.element_size() for t in train_tensors) <= GATHER_ONCE_BYTES
    was_training = model.training
    with torch.random.fork_rng(devices=devices), _denormals_flushed(flush_denormal and device.type == "cpu"):
        torch.manual_seed(seed)
        bar = tqdm(total=epochs * steps_per_epoch, disable=not progress, desc="fit", leave=False,
                   dynamic_ncols=True)
        sizes = torch.tensor([min(batch_size, n - s) for s in range(0, n, batch_size)], dtype=torch.float64)
        model.train()  # (validation puts it back in training mode when it is done)
        quiet = torch.no_grad() if getattr(step_fn, "uses_autograd", True) is False else contextlib.nullcontext()
        try:
            for epoch in range(1, epochs + 1):
                order = torch.randperm(n, generator=shuffler)
                if gather_once:  # one gather per tensor and epoch (moved once); the batches are views of it
                    pieces = list(zip(*(_on(t.index_select(0, order), device).split(batch_size) for t in train_tensors)))
                losses = []
                with quiet:  # (the losses' checks below run outside it)
                    for i, start in enumerate(range(0, n, batch_size)):
                        if gather_once:
                            batch = pieces[i]
                        else:
                            idx = order[start:start + batch_size]
                            batch = tuple(_on(t[idx], device) for t in train_tensors)
                        opt.zero_grad(set_to_none=True)
                        loss: torch.Tensor | None
                        if step_fn is None:
                            loss = _scalar_loss(loss_fn(model, batch), "training")
                            loss.backward()
                        else:
                            reported = step_fn(batch)
                            loss = None if reported is None else _scalar_loss(reported, "training")
                        if grad_clip is not None:
                            torch.nn.utils.clip_grad_norm_(params, grad_clip)
                        opt.step()
                        # no host sync per step: the losses are read once per epoch (or for the bar)
                        step += 1
                        if progress:
                            bar.update(1)
                        if loss is None:  # a step that gives its losses per epoch
                            continue
                        losses.append(loss.detach())
                        if progress and (step % 10 == 0 or step == steps_per_epoch * epoch):
                            _check_loss(losses[-1], step - 1, epoch)
                            bar.set_postfix(epoch=epoch, loss=f"{losses[-1].item():.4g}", refresh=False)
                if len(losses) < steps_per_epoch:  # the step's own (`step_fn.epoch_losses()`)
                    later = getattr(step_fn, "epoch_losses", None)
                    if later is None:
                        raise ValueError("step_fn returned no loss and has no epoch_losses() to give them")
                    given = later().reshape(-1)
                    values = torch.cat([torch.stack(losses).reshape(-1).to(given), given]) if losses else given
                    if values.numel() != steps_per_epoch:
                        raise ValueError(f"step_fn gave {values.numel()} losses for the {steps_per_epoch} steps of epoch {epoch}")
                else:
                    values = torch.stack(losses)
                values = values.detach().cpu().double()
                mean = float(values @ sizes) / n  # (one host read per epoch; a non-finite loss makes it non-finite)
                if not math.isfinite(mean):
                    finite = torch.isfinite(values)
                    if not bool(finite.all()):
                        bad = int((~finite).nonzero()[0, 0])
                        raise NonFiniteLossError(step - steps_per_epoch + bad, epoch, float(values[bad]))
                history["epoch"].append(epoch)
                history["train_loss"].append(mean)
                if val_tensors is not None and (epoch % val_every == 0 or epoch == epochs):
                    res = _evaluate(model, loss_fn, val_tensors, max(batch_size, 1024), device,
                                    metric_fn, step, epoch)
                    history["val_epoch"].append(epoch)
                    for k, v in res.items():
                        history.setdefault(k, []).append(v)
                    bar.set_postfix(epoch=epoch, loss=f"{history['train_loss'][-1]:.4g}",
                                    val_loss=f"{res['val_loss']:.4g}")
        finally:
            bar.close()
            model.train(was_training)
            if isinstance(opt, FlatAdam):
                opt.release()
    history["steps"] = step
    history["seconds"] = time.perf_counter() - start_time
    return history
