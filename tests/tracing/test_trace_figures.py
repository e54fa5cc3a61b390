"""Figures of traced models (issue 38): the names trace takes from the source are drawn as written,
`input_ids` as `input_ids`, not `input` with the subscript `ids`; a subscript only for a name in
the subscript form (one letter, `_`, an index of at most three letters or digits: `W_q`), as for
hand-written diagrams (docs/rendering.md)."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from test_trace_masks import _masked, _padded
from torch import nn

import penrose
from penrose.rendering import render

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

SUBSCRIPT_FORM = re.compile(r"\b([A-Za-z])_([A-Za-z0-9]{1,3})\b")


def _subscripts(svg: str) -> list:
    return re.findall(r'baseline-shift="sub" font-size="[\d.]+">([^<]*)<', svg)


class Projections(nn.Module):
    """Names in the subscript form (`W_q`) beside names with underscores (`token_ids`, `q_proj`)."""

    def __init__(self):
        super().__init__()
        self.W_q = nn.Parameter(torch.randn(8, 8))
        self.q_proj = nn.Linear(8, 8)

    def forward(self, token_ids):
        return self.q_proj(token_ids @ self.W_q)


def test_traced_names_are_drawn_as_written():
    module, ids = _masked("bert")
    text = penrose.trace(module.eval(), ids, _padded())
    svg = render(text)
    assert "input input_ids[" in text and ">input_ids<" in svg and ">attention_mask<" in svg
    assert _subscripts(svg) == []


def test_a_subscript_only_for_a_traced_name_in_the_subscript_form():
    text = penrose.trace(Projections(), torch.randn(2, 5, 8))
    svg = render(text)
    assert ">token_ids<" in svg and ">q_proj: linear<" in svg and ">q_proj_out<" in svg
    assert {m.group(0) for m in SUBSCRIPT_FORM.finditer(text)} == {"W_q"}  # the legend, declared, read
    assert _subscripts(svg) == ["q"] and ">W<" in svg  # W_q's, the one name the user wrote in that form
