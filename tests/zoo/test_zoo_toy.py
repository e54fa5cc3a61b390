"""The concept papers' toy data sets (penrose_zoo.data.toy_concepts): definitions, seeding, split,
and, where PyC is installed, the same rows as PyC's generators."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import torch

from penrose_zoo.data import TOY_SETS, toy_concepts, toy_split


def _all(d):
    return (torch.cat([d.x_train, d.x_val, d.x_test]), torch.cat([d.c_train, d.c_val, d.c_test]),
            torch.cat([d.y_train, d.y_val, d.y_test]))


def test_xor_definition():
    x, c, y = _all(toy_concepts("xor", n=400, seed=1))
    assert torch.equal(c, (x > 0.5).float())
    assert torch.equal(y, (c[:, 0] != c[:, 1]).long())
    assert x.min() >= 0 and x.max() <= 1


def test_trigonometry_definition():
    x, c, y = _all(toy_concepts("trigonometry", n=400, seed=1))
    assert x.shape[1] == 7 and c.shape[1] == 3
    for i in range(3):  # sin(h) + h is increasing in h and has the sign of h
        assert torch.equal(c[:, i], (x[:, 2 * i] > 0).float())
        gap = x[:, 2 * i + 1] - x[:, 2 * i]  # cos h − sin h
        assert gap.abs().max() <= 2 ** 0.5 + 1e-5
    assert (x[:, 6] >= 0).all()
    # the task is not a function of the concepts: two rows with the same concepts, different tasks
    same = (c == torch.tensor([1.0, 1.0, 0.0])).all(1)
    assert set(y[same].tolist()) == {0, 1}


def test_dot_definition_has_independent_vectors():
    x, c, y = _all(toy_concepts("dot", n=400, seed=1))
    v1, v3 = (x[:, :2] + x[:, 2:]) / 2, (x[:, :2] - x[:, 2:]) / 2
    assert torch.equal(c[:, 0], (v1.sum(1) > 0).float())
    assert torch.equal(c[:, 1], (-v3.sum(1) > 0).float())
    assert torch.equal(y, ((v1 * v3).sum(1) > 0).long())
    assert 0.3 < y.float().mean() < 0.7  # not PyC's constant task (v3 = v1 there)
    assert x[:, 2:].abs().max() > 1


def test_checkmark_definition():
    x, c, y = _all(toy_concepts("checkmark", n=400, seed=1))
    a, b, cc = c.T
    assert torch.equal(cc, 1 - b)
    assert torch.equal(y, (a * cc).long())
    clean = torch.cat([c, y[:, None].float()], 1) * 2 - 1
    assert (x - clean).abs().max() < 0.6 and (x - clean).std() == pytest.approx(0.1, abs=0.02)
    d = toy_concepts("checkmark", n=50)
    assert d.parents == {"A": (), "B": (), "C": ("B",)} and d.task_parents == ("A", "C")


@pytest.mark.parametrize("name", TOY_SETS)
def test_seeded_split_sizes_and_dtypes(name):
    d = toy_concepts(name, n=1000, seed=7)
    assert (d.x_train.shape[0], d.x_val.shape[0], d.x_test.shape[0]) == (700, 100, 200)
    assert d.y_train.dtype == torch.int64 and d.c_train.dtype == d.x_train.dtype == torch.float32
    assert d.c_train.shape[1] == len(d.concept_names)
    again = toy_concepts(name, n=1000, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(d.train_tuple() + d.test_tuple(), again.train_tuple() + again.test_tuple()))
    other = toy_concepts(name, n=1000, seed=8)
    assert not torch.equal(d.x_train, other.x_train)
    # a different split of the same rows
    resplit = toy_concepts(name, n=1000, seed=7, split_seed=0)
    assert torch.equal(torch.sort(_all(d)[0], 0).values, torch.sort(_all(resplit)[0], 0).values)
    assert not torch.equal(d.x_test, resplit.x_test)


def test_split_is_a_partition_in_pycs_order():
    tr, va, te = toy_split(103, 5)
    assert sorted(np.concatenate([tr, va, te]).tolist()) == list(range(103))
    assert (len(te), len(va)) == (20, 10)
    order = np.random.default_rng(5).permutation(103)
    assert te.tolist() == order[:20].tolist() and va.tolist() == order[20:30].tolist()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown toy data set 'xr'.*xor"):
        toy_concepts("xr")
    with pytest.raises(ValueError, match="n must be a whole number from 10 to"):
        toy_concepts("xor", n=3)
    with pytest.raises(ValueError, match="val_fraction \+ test_fraction must be below 1"):
        toy_split(10, 0, 0.5, 0.6)


def _pyc_toy():
    """PyC's toy generators, without importing torch_concepts.data (which needs torchvision)."""
    tc = pytest.importorskip("torch_concepts")
    base = tc.__path__[0]
    for name, sub in (("torch_concepts.data", "data"), ("torch_concepts.data.datasets", "data/datasets")):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [f"{base}/{sub}"]
            sys.modules[name] = m
    return importlib.import_module("torch_concepts.data.datasets.toy")


@pytest.mark.parametrize("name", ["xor", "trigonometry", "checkmark"])
def test_same_rows_as_pyc(name):
    T = _pyc_toy()
    x, cy = getattr(T, f"_{name}")(300, 11)[:2]
    d = toy_concepts(name, n=300, seed=11)
    idx = np.concatenate(toy_split(300, 11))
    X, C, Y = _all(d)
    assert torch.equal(X, x[idx].float())
    assert torch.equal(C, cy[idx, :C.shape[1]])
    assert torch.equal(Y.float(), cy[idx, -1])


def test_pyc_dot_differs_from_the_cem_generator():
    T = _pyc_toy()
    x, cy = T._dot(300, 11)[:2]
    assert x[:, 2:].abs().max() == 0 and cy[:, -1].min() == 1  # v3 = v1: the task is constant there
