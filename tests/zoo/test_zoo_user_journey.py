"""The concept toolkit the way a user meets it (issue 26's "done when"): their own backbone and a
data set with binary, categorical and continuous concepts; any concept model trained on it, its
intervention curve drawn, its explanations read by concept name.

The data: 8×8 images whose concepts are visible in them — `bright` (binary: the top-left
quadrant lit), `band` (categorical: which of three rows of the bottom half is lit), `level`
(continuous: the brightness of the top-right quadrant) — and a task the concepts determine (the
top-left quadrant lit, or the level above 0.5). The backbone is a small CNN written here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import penrose_zoo
from penrose_zoo.interventions import GroundTruth, RandomPolicy, UncertaintyPolicy, intervention_curve
from penrose_zoo.plots import plot_intervention_curves

pytestmark = pytest.mark.usefixtures("one_thread")

CONCEPTS = {"bright": "binary", "band": ["top", "middle", "bottom"], "level": "continuous"}
# a squared error on values in [0, 1] is small beside the task's cross-entropy: the continuous
# concept weighs more (with one weight of 3 for all, the bottleneck's `level` reaches R² 0.2-0.3)
WEIGHTS = {"bright": 3.0, "band": 3.0, "level": 30.0}
NAMES = ("bright", "band=top", "band=middle", "band=bottom", "level")


class TinyCNN(nn.Module):
    """[n, 1, 8, 8] -> [n, 24]: two convolutions, pooled to 2×2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.head = nn.Linear(6 * 2 * 2, 24)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv2(torch.relu(self.conv1(img))))
        return torch.relu(self.head(nn.functional.avg_pool2d(h, 4).flatten(1)))


def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images, concept columns [bright, band one-hot ×3, level], task labels)."""
    g = torch.Generator().manual_seed(seed)
    bright = (torch.rand(n, generator=g) < 0.5).float()
    band = torch.randint(0, 3, (n,), generator=g)
    level = torch.rand(n, generator=g)
    img = torch.randn(n, 1, 8, 8, generator=g) * 0.2
    img[:, 0, :4, :4] += 1.5 * bright[:, None, None]
    for b in range(3):
        rows = slice(4 + b, 5 + b)
        img[:, 0, rows, :] += 1.5 * (band == b).float()[:, None, None]
    img[:, 0, :4, 4:] += 2.0 * level[:, None, None]
    c = torch.cat([bright[:, None], torch.eye(3)[band], level[:, None]], 1)
    y = ((bright > 0.5) | (level > 0.5)).long()
    return img, c, y


MODELS = {
    "bottleneck": lambda net, mode: penrose_zoo.TypedConceptBottleneckModel(
        f=24, r=2, concepts=CONCEPTS, backbone=net, backbone_mode=mode, concept_weight=WEIGHTS),
    "embedding": lambda net, mode: penrose_zoo.TypedConceptEmbeddingModel(
        f=24, e=4, r=2, concepts=CONCEPTS, backbone=net, backbone_mode=mode, concept_weight=WEIGHTS),
    "mixture": lambda net, mode: penrose_zoo.TypedMixtureOfLinearModels(
        f=24, m=2, r=2, concepts=CONCEPTS, backbone=net, backbone_mode=mode, concept_weight=WEIGHTS),
}


@pytest.mark.parametrize("kind, mode", [("bottleneck", "finetune"), ("embedding", "finetune"), ("mixture", "finetune"),
                                        ("bottleneck", "cached")])
def test_own_backbone_typed_concepts_curve_and_explanations(kind, mode, tmp_path):
    torch.manual_seed(0)
    net = TinyCNN()
    if mode == "cached":  # a backbone trained elsewhere: here, the fine-tuned one of a first model
        first = MODELS[kind](net, "finetune")
        first.fit(images(600, 0), epochs=40, batch_size=32, lr=1e-2, progress=False)
    model = MODELS[kind](net, mode)
    train, test = images(600, 0), images(300, 1)
    model.fit(train, epochs=40, batch_size=32, lr=1e-2, progress=False)

    report = model.concept_report(test)
    assert report["bright"]["type"] == "binary" and report["bright"]["accuracy"] > 0.95, report
    assert report["band"]["type"] == "categorical" and report["band"]["accuracy"] > 0.95, report
    assert report["level"]["type"] == "continuous" and report["level"]["r2"] > 0.8, report

    curves = [intervention_curve(model, test, policy, (0, 1 / 3, 2 / 3, 1), strategy=GroundTruth())
              for policy in (RandomPolicy(0), UncertaintyPolicy())]
    for curve in curves:
        assert len(curve.accuracy) == 4 and curve.accuracy[0] > 0.85, curve
        # the concepts determine the task: all of them set to the truth, (nearly) every label
        assert curve.accuracy[-1] > 0.95 and curve.accuracy[-1] >= curve.accuracy[0] - 0.01, curve
        assert 0.85 < curve.score <= 1.0
    fig = plot_intervention_curves(curves, title=kind)
    path = tmp_path / "curve.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert [label.split(" (score")[0] for label in labels] == [f"{type(model).__name__} · {p}" for p in ("random", "uncertainty")], labels

    e = model.explain(test[0][:2])
    assert e.names == NAMES
    assert e.concept_types == ("binary", "categorical", "categorical", "categorical", "continuous")
    assert e.concept_groups == {"band": NAMES[1:4]}
    torch.testing.assert_close(e.total(), e.output, atol=1e-5, rtol=1e-5)
