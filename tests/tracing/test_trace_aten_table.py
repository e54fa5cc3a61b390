"""trace's ATen handlers are one table (`penrose.tracing.aten.ATEN`): every key is an ATen op torch
knows, every handler the lowerer's parts define is in it, and dispatch reaches each through it."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import penrose
from penrose.tracing import PenroseTraceError, aten, lower
from penrose.tracing.lower import Lowerer

PARTS = (aten.E, aten.C, aten.R, aten.S)


def test_every_table_key_is_an_aten_op_torch_knows():
    unknown = [name for name in aten.ATEN if not hasattr(torch.ops.aten, name)]
    assert unknown == []


def test_every_handler_a_part_defines_is_in_the_table():
    in_table = {id(h) for h in aten.ATEN.values()}
    handlers = [(part.__name__, name, fn) for part in PARTS for name, fn in vars(part).items() if name.startswith("op_")]
    assert len(handlers) > 50
    unreachable = [f"{part}.{name}" for part, name, fn in handlers if id(fn) not in in_table]
    assert unreachable == []


def test_handlers_take_the_lowerer_and_the_node():
    for name, handler in aten.ATEN.items():
        params = list(inspect.signature(handler).parameters)
        assert len(params) == 2, (name, params)


def test_the_lowerer_has_no_handler_outside_the_table():
    """Dispatch by method name is gone: no `op_*` attribute the table does not hold."""
    in_table = {id(h) for h in aten.ATEN.values()}
    stray = [n for n in dir(Lowerer) if n.startswith("op_") and id(getattr(Lowerer, n)) not in in_table]
    assert stray == []


def test_dispatch_reaches_each_key_through_the_table(monkeypatch):
    seen = []
    for name in list(aten.ATEN):
        monkeypatch.setitem(aten.ATEN, name, lambda lowerer, node, name=name: seen.append(name) or name)
    assert lower.ATEN is aten.ATEN
    me = Lowerer.__new__(Lowerer)
    for name in aten.ATEN:
        assert me.dispatch(object(), name) == name
    assert seen == list(aten.ATEN)


def test_an_op_missing_from_the_table_is_refused_with_its_reason(monkeypatch):
    """Taking `gelu` out of the table makes F.gelu a refusal naming it (so the table is what decides)."""
    m = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    x = torch.randn(2, 4)
    assert "gelu(" in penrose.trace(m, x, verify=False)
    monkeypatch.delitem(aten.ATEN, "gelu")
    with pytest.raises(PenroseTraceError, match="gelu cannot be expressed"):
        penrose.trace(m, x, verify=False)


def test_in_place_form_lowers_as_its_table_key():
    class M(nn.Module):
        def forward(self, x):
            y = x * 2
            y.relu_()
            return y

    text = penrose.trace(M(), torch.randn(2, 3))
    assert "relu(" in text

