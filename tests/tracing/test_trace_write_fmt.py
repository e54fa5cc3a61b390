"""trace's writer builds `penrose.ir` records and prints them with `penrose.fmt`: one printer, one
spelling of numbers (the trace package has no printer of its own)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import penrose
from penrose.tracing import PenroseTraceError


def test_the_writer_text_is_already_fmt_canonical(monkeypatch):
    """The writer's own text (before run.py's check) is what fmt prints: numbers spelled one way
    (`1e-5`, not Python's `1e-05`), only the parentheses precedence needs, fmt's layout."""
    from penrose.fmt import format_diagram
    from penrose.parser import parse
    from penrose.tracing import run

    written = []
    monkeypatch.setattr(run, "_canonical", lambda text: written.append(text) or text)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = nn.LayerNorm(4)

        def forward(self, x):
            return self.n((x * 2 - 1) / 3 + (-x) ** 2) * 1e-05

    penrose.trace(M(), torch.randn(2, 3, 4), verify=False)
    (text,) = written
    assert "eps=1e-5" in text and "* 1e-5" in text
    assert "(x * 2 - 1) / 3 + (-x) ** 2" in text
    assert text == format_diagram(parse(text))


@pytest.mark.parametrize("value, text", [(True, "1"), (2.0, "2"), (-3, "-3"), (1e-05, "1e-5"), (0.5, "0.5"),
                                         (float("inf"), "inf"), (float("-inf"), "-inf"), (-1e300, "-3.4028234663852886e38")])
def test_trace_constants_as_ir_numbers(value, text):
    from penrose.fmt import format_expr
    from penrose.tracing.write import number

    assert format_expr(number(value)) == text


def test_a_nan_constant_is_refused():
    from penrose.tracing.write import number

    with pytest.raises(PenroseTraceError, match="NaN"):
        number(float("nan"))
