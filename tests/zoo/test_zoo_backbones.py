"""A backbone (any nn.Module) in front of the zoo's concept models: fine-tuned, frozen, or run once
with cached features; with a small CNN over images and a small transformer encoder over tokens,
both written here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import penrose_zoo
from penrose import PenroseShapeError
from penrose_zoo.interventions import RandomPolicy, intervention_curve

pytestmark = pytest.mark.usefixtures("one_thread")


class SmallCNN(nn.Module):
    """[n, 1, 8, 8] images -> [n, 16] features."""

    def __init__(self, out: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 * 2 * 2, out)
        self.drop = nn.Dropout(0.5)
        self.calls = 0

    def forward(self, img):
        self.calls += 1
        h = torch.relu(self.conv1(img))
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv2(h)), 4)  # [n, 8, 2, 2]
        return self.drop(torch.relu(self.head(h.flatten(1))))


class SmallEncoder(nn.Module):
    """[n, t] token ids -> [n, d] (embedding, one transformer encoder layer, mean over tokens)."""

    def __init__(self, vocab: int = 6, d: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(5, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)

    def forward(self, tokens):
        return self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]]).mean(1)


def quadrant_images(n: int, seed: int = 0):
    """8×8 images; concept i: quadrant i is bright; task: quadrants 0 and 1 both bright."""
    g = torch.Generator().manual_seed(seed)
    c = (torch.rand(n, 4, generator=g) < 0.5).float()
    img = torch.randn(n, 1, 8, 8, generator=g) * 0.3
    for i, (r, s) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):
        img[:, 0, r:r + 4, s:s + 4] += 1.5 * c[:, i, None, None]
    return img, c, (c[:, 0] * c[:, 1]).long()


def token_data(n: int, seed: int = 0):
    """Sequences of 5 tokens from 6; concept i: token i occurs; task: token 0 and token 1 occur."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6, (n, 5), generator=g)
    c = torch.stack([(tokens == i).any(1) for i in range(3)], 1).float()
    return tokens, c, (c[:, 0] * c[:, 1]).long()


def _params(module):
    return [p.detach().clone() for p in module.parameters()]


def test_finetuned_cnn_learns_the_concepts():
    torch.manual_seed(0)
    net = SmallCNN()
    before = _params(net)
    model = penrose_zoo.ConceptBottleneckModel(f=16, k=4, r=2, backbone=net, concept_weight=2.0, p_int=0.25)
    assert any(n.startswith("backbone.") for n, _ in model.named_parameters())
    img, c, y = quadrant_images(300)
    model.fit((img, c, y), epochs=8, batch_size=32, lr=3e-2, progress=False)
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
    test = quadrant_images(300, seed=1)
    res = model.evaluate(test)
    assert res["concept_acc"] > 0.95 and res["acc"] > 0.9, res


def test_frozen_backbone_is_unchanged_and_stays_in_eval_mode():
    net = SmallCNN()
    before = _params(net)
    model = penrose_zoo.ConceptEmbeddingModel(f=16, k=4, e=4, r=2, backbone=net, backbone_mode="frozen")
    model.train()
    assert not net.training  # its dropout stays off
    img, c, y = quadrant_images(200)
    w_before = model.diagram.W_y.detach().clone()
    model.fit((img, c, y), epochs=2, batch_size=64, lr=1e-2, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert not torch.equal(w_before, model.diagram.W_y)


def test_cached_backbone_runs_once_per_data_set():
    net = SmallCNN()
    before = _params(net)
    model = penrose_zoo.ConceptBottleneckModel(f=16, k=4, r=2, backbone=net, backbone_mode="cached")
    img, c, y = quadrant_images(300)
    val = quadrant_images(100, seed=2)
    model.fit((img, c, y), val, epochs=4, batch_size=32, lr=1e-2, progress=False)
    assert net.calls == 2  # once over train, once over validation (batches of 1024)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    model.eval()
    with torch.no_grad():
        direct = model(val[0]).y
        with model.given_features():
            cached = model(model.cache_features(val[0])).y
    torch.testing.assert_close(direct, cached)
    # sequential training and curves go through the cache too
    model.fit((img, c, y), mode="sequential", epochs=1, batch_size=64, lr=1e-2, progress=False)
    calls = net.calls
    curve = intervention_curve(model, val, RandomPolicy(0), (0, 0.5, 1))
    assert net.calls == calls + 1 and len(curve.accuracy) == 3


def test_transformer_encoder_backbone():
    torch.manual_seed(0)
    enc = SmallEncoder()
    model = penrose_zoo.HybridConceptBottleneckModel(f=16, k=3, j=4, r=2, backbone=enc, concept_weight=2.0)
    tokens, c, y = token_data(800)
    model.fit((tokens, c, y), epochs=20, batch_size=64, lr=5e-3, progress=False)
    res = model.evaluate(token_data(300, seed=1))
    assert res["concept_acc"] > 0.9 and res["acc"] > 0.85, res


def test_backbone_errors_are_named():
    with pytest.raises(ValueError, match="backbone_mode must be one of"):
        penrose_zoo.ConceptBottleneckModel(f=16, k=4, backbone=SmallCNN(), backbone_mode="warm")
    with pytest.raises(TypeError, match="backbone must be a torch.nn.Module"):
        penrose_zoo.ConceptBottleneckModel(f=16, k=4, backbone=lambda x: x)
    model = penrose_zoo.ConceptBottleneckModel(f=12, k=4, backbone=SmallCNN(out=16))
    with pytest.raises(PenroseShapeError, match="'x' leg 'f' must have size 12, got 16"):
        model(quadrant_images(3)[0])
