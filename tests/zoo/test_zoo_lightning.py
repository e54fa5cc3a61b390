"""The optional Lightning adapter (penrose_zoo.lightning): a Trainer trains a zoo concept model with
its own loss, logs to a CSV logger and writes checkpoints."""

from __future__ import annotations

import csv

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import penrose_zoo  # noqa: E402
from penrose.errors import PenroseArgumentError  # noqa: E402
from penrose_zoo.data import toy_concepts  # noqa: E402
from penrose_zoo.lightning import LightningZooModel, tensor_loader  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_trainer_fits_logs_and_checkpoints(tmp_path):
    data = toy_concepts("checkmark", n=500, seed=0)
    model = penrose_zoo.ConceptBottleneckModel(f=4, k=3, r=2, concept_weight=3.0)
    module = LightningZooModel(model, lr=2e-2, mode="joint")
    before = model.loss(data.val_tuple()).item()
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=1)
    trainer = pl.Trainer(max_epochs=4, logger=pl.loggers.CSVLogger(tmp_path, name="run"), callbacks=[ckpt],
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, tensor_loader(data.train_tuple(), 64, shuffle=True), tensor_loader(data.val_tuple(), 256))
    after = model.loss(data.val_tuple()).item()
    assert after < before
    rows = list(csv.DictReader(open(next(tmp_path.glob("run/version_*/metrics.csv")))))
    logged = {k for r in rows for k, v in r.items() if v}
    assert {"train_loss", "val_loss", "val_acc", "val_concept_acc"} <= logged
    assert ckpt.best_model_path and torch.load(ckpt.best_model_path, weights_only=False)["state_dict"]
    res = model.evaluate(data.test_tuple())
    assert res["concept_acc"] > 0.95, res


def test_binary_task_logs_its_accuracy(tmp_path):
    """A concept model with one task logit (task='binary') logs val_acc from its sign."""
    data = toy_concepts("checkmark", n=500, seed=0)
    model = penrose_zoo.ConceptBottleneckModel(f=4, k=3, r=1, task="binary", concept_weight=3.0)
    trainer = pl.Trainer(max_epochs=30, logger=pl.loggers.CSVLogger(tmp_path, name="run"), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(LightningZooModel(model, lr=2e-2), tensor_loader(data.train_tuple(), 64, shuffle=True),
                tensor_loader(data.val_tuple(), 256))
    rows = list(csv.DictReader(open(next(tmp_path.glob("run/version_*/metrics.csv")))))
    accs = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
    assert accs and accs[-1] > 0.9, accs


def test_bad_optimizer_is_named():
    with pytest.raises(ValueError, match="optimizer must be one of 'adam', 'adamw', 'sgd', got 'rmsprop'"):
        LightningZooModel(penrose_zoo.ConceptBottleneckModel(f=4, k=3), optimizer="rmsprop")


# ---- the Lightning adapter --------------------------------------------------------------------

def test_lightning_adapter_follows_fits_rules():
    """Hostile arguments and labels (docs/security.md): fit's rules, every batch's labels checked."""
    data = toy_concepts("xor", n=100, seed=0)
    model = penrose_zoo.ConceptBottleneckModel(f=2, k=2, r=1, task="binary")
    for kw, message in (({"lr": -1.0}, "lr must be a finite number of at least 0"),
                        ({"lr": float("nan")}, "lr must be"), ({"weight_decay": -1}, "weight_decay must be"),
                        ({"mode": "sequential"}, "mode must be one of 'joint', 'independent', 'concepts', 'task'")):
        with pytest.raises(PenroseArgumentError, match=message):
            LightningZooModel(model, **kw)
    with pytest.raises(PenroseArgumentError, match="model must be a penrose_zoo model"):
        LightningZooModel(torch.nn.Linear(2, 1))
    module = LightningZooModel(model)
    x, c, y = data.train_tuple()
    # issue 37: task labels {0, 3} on a binary task trained to a loss of -17
    with pytest.raises(PenroseArgumentError, match=r"y_train \(train_data\[2\]\) holds 3 at index"):
        module.training_step((x[:8], c[:8], y[:8] * 3), 0)
    with pytest.raises(PenroseArgumentError, match=r"c_val \(val_data\[1\]\) holds 5.0"):
        module.validation_step((x[:8], c[:8] * 5, y[:8]), 0)
    with pytest.raises(PenroseArgumentError, match="batch_size must be a whole number of at least 1, got 0"):
        tensor_loader(data.train_tuple(), 0)
