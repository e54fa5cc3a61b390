"""Fixtures the Steerling tests share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A `penrose steerling train` checkpoint of the tiny preset, 4 steps on a 3-category corpus
    (its folder; the corpus is its sibling `corpus`). Shared: a test that changes it copies it."""
    from test_steerling_train import write_corpus

    from penrose_zoo.steerling.cli import main

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny_run")
    data = write_corpus(root / "corpus")
    out = root / "run"
    rc = main(["train", "--preset", "tiny", "--data", str(data), "--steps", "4", "--seq-len", "32",
               "--batch-size", "4", "--val-every", "2", "--out", str(out), "--no-progress"])
    torch.set_num_threads(before)
    assert rc == 0
    return out
