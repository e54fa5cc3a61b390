"""Train any zoo model with a PyTorch Lightning Trainer (an optional extra: `pytorch-lightning`).

    import pytorch_lightning as pl
    from penrose_zoo.lightning import LightningZooModel

    module = LightningZooModel(model, lr=1e-2, mode="joint")       # model: any ZooModel
    trainer = pl.Trainer(max_epochs=20, logger=pl.loggers.CSVLogger("logs"))
    trainer.fit(module, train_loader, val_loader)                   # batches: tuples, as for fit

The arguments follow `fit`'s rules (an lr or weight decay that is negative or not finite, an
unknown optimizer or mode is a PenroseArgumentError naming it), and every batch's labels are
checked against the model's task and concept types (`ZooModel.check_labels`) before its loss is
taken. The training step is the model's own loss (`model.loss(batch, **loss_options)`, with `mode` for
concept models), logged as `train_loss`; the validation step logs `val_loss` and, for concept
models, `val_acc` and `val_concept_acc` — the names Lightning's loggers, checkpoints
(`ModelCheckpoint(monitor="val_loss")`) and early stopping read. `penrose_zoo.train.fit` stays the
plain, faster loop; this adapter is for runs that want the Lightning ecosystem.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from penrose.errors import PenroseArgumentError
from penrose_zoo.train import OPTIMIZERS
from penrose_zoo.validate import choice, number

__all__ = ["LightningZooModel", "tensor_loader"]


class LightningZooModel(pl.LightningModule):
    """A LightningModule around a zoo model: its loss, Adam (or `optimizer`), and logged metrics."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-2, weight_decay: float = 0.0, optimizer: str = "adam",
                 **loss_options):
        super().__init__()
        from penrose_zoo.concepts import LOSS_MODES, ConceptModel
        from penrose_zoo.core import ZooModel

        if not isinstance(model, ZooModel):
            raise PenroseArgumentError(f"model must be a penrose_zoo model (a ZooModel), got {type(model).__name__}")
        choice(optimizer, "optimizer", OPTIMIZERS)
        lr = number(lr, "lr", low=0)  # `fit`'s rules: a negative rate climbs the loss
        weight_decay = number(weight_decay, "weight_decay", low=0)
        if "mode" in loss_options and isinstance(model, ConceptModel):
            choice(loss_options["mode"], "mode", LOSS_MODES)
        self.model = model
        self.lr, self.weight_decay, self.optimizer_name = lr, weight_decay, optimizer
        self.loss_options = loss_options
        self.save_hyperparameters(ignore=["model"])

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def _checked(self, batch, split: str) -> tuple:
        """The batch as a tuple, its labels checked against the model's task and concept types
        (`ZooModel.check_labels`, as `fit` checks its data; the batch's tensors are named
        `{split}_data[i]`)."""
        batch = tuple(batch)
        self.model.check_labels(batch, split)
        return batch

    def training_step(self, batch, batch_idx):
        loss = self.model.loss(self._checked(batch, "train"), **self.loss_options)
        self.log("train_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=batch[0].shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        batch = self._checked(batch, "val")
        loss = self.model.loss(batch, **self.loss_options)
        n = batch[0].shape[0]
        self.log("val_loss", loss, prog_bar=True, batch_size=n)
        if len(batch) == 3 and hasattr(self.model, "concept_probabilities"):
            x, c, y = batch
            out = self.model(x)
            probs = self.model.concept_probabilities(out)
            self.log("val_concept_acc", ((probs > 0.5) == (c > 0.5)).float().mean(), batch_size=n)
            if self.model.task == "multiclass":
                self.log("val_acc", (out.y.argmax(-1) == y).float().mean(), batch_size=n)
            elif self.model.task == "binary":
                self.log("val_acc", ((out.y.squeeze(-1) > 0) == (y > 0.5)).float().mean(), batch_size=n)
        return loss

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=self.weight_decay)
        cls = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, weight_decay=self.weight_decay)


def tensor_loader(data, batch_size: int, shuffle: bool = False, seed: int = 0) -> torch.utils.data.DataLoader:
    """A DataLoader of tuples from a tuple of row-aligned tensors (what `fit` takes)."""
    from penrose.errors import seed_value
    from penrose_zoo.train import data_tensors
    from penrose_zoo.validate import flag, whole

    tensors, _ = data_tensors(data, "data")  # (as `fit` reads its data: tensors with the same rows)
    batch_size, shuffle = whole(batch_size, "batch_size", low=1), flag(shuffle, "shuffle")
    g = torch.Generator().manual_seed(seed_value(seed))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*tensors), batch_size=batch_size,
                                       shuffle=shuffle, generator=g)
