"""`penrose steerling train | explain | steer | evaluate` end to end on a tiny corpus (in-process)."""

from __future__ import annotations

import json

import pytest
import torch

from penrose_zoo.steerling.cli import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tiny_run):
    return tiny_run  # (conftest.py: trained once for the session)


def test_train_writes_checkpoint(ckpt):
    for name in ("model.safetensors", "config.json", "tokenizer.json", "concepts.json", "optimizer.safetensors", "train.json"):
        assert (ckpt / name).is_file(), name
    assert json.loads((ckpt / "train.json").read_text())["step"] == 4


def test_explain_json(ckpt, capsys, tmp_path):
    heat = tmp_path / "h.png"
    assert main(["explain", "--checkpoint", str(ckpt), "--text", "cat meow", "--json", "--heatmap", str(heat),
                 "--ig-steps", "8"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["tokens"]) == len("cat meow") + 1 and heat.stat().st_size > 0
    assert r["prediction"]["attribution_error"] < 1e-4
    assert len(r["integrated_gradients"]["per_token"]) == len(r["tokens"])
    assert r["integrated_gradients"]["completeness_error"] >= 0


def test_steer_and_errors(ckpt, capsys):
    assert main(["steer", "--checkpoint", str(ckpt), "--concept", "cats", "--scale", "3", "--prompt", "a",
                 "--max-new-tokens", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["concept"] == "cats" and isinstance(r["steered"], str)
    assert main(["steer", "--checkpoint", str(ckpt), "--concept", "dogs", "--value", "1", "--prompt", "a"]) == 1
    assert "unknown concept 'dogs'" in capsys.readouterr().err


def test_evaluate_json(ckpt, capsys):
    assert main(["evaluate", "--checkpoint", str(ckpt), "--json", "--max-batches", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    for k in ("val_loss", "concept_auc", "token_control", "hsic_linear", "hsic_rbf", "probing_gap",
              "logit_share_concept", "concept_auc_per_concept"):
        assert k in r
    assert r["attribution_error"] < 1e-4


def test_train_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--steps", "1"]) == 1
    assert "error" in capsys.readouterr().err
    assert main(["explain", "--checkpoint", str(tmp_path / "none"), "--text", "x"]) == 1
