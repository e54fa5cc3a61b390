"""The formatter keeps the meaning: parse(fmt(x)) == parse(x), and fmt is idempotent.

The IR compares without source spans, so the same diagram laid out differently compares equal;
comments, step captions and statement notes are part of the IR and must survive.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from penrose import ir
from penrose.fmt import format_diagram
from penrose.parse import parse, parse_file
from strategies import decorated, einsum_cases, elementwise_cases

ROOT = Path(__file__).resolve().parents[1]


def assert_round_trip(text: str):
    d = parse(text)
    once = format_diagram(d)
    assert parse(once) == d, once
    assert format_diagram(parse(once)) == once


@settings(max_examples=80)
@given(st.one_of(einsum_cases(), elementwise_cases()).flatmap(lambda c: decorated(c.text)))
def test_fmt_round_trip_generated(text):
    assert_round_trip(text)


@settings(max_examples=30)
@given(st.one_of(einsum_cases(), elementwise_cases()).flatmap(lambda c: st.tuples(st.just(c.text), decorated(c.text, comments=False))))
def test_fmt_output_is_canonical(texts):
    """Layout (spacing, blank lines, calls broken over lines) does not change the formatted text."""
    plain, messy = texts
    canonical = format_diagram(parse(plain))
    assert format_diagram(parse(messy)) == canonical
    assert canonical.endswith("\n") and "\n\n\n" not in canonical


def test_fmt_every_zoo_diagram():
    files = sorted((ROOT / "zoo").rglob("*.pen"))
    for f in files:
        d = parse_file(f)
        once = format_diagram(d)
        assert parse(once, file=str(f)) == d, f
        assert format_diagram(parse(once)) == once, f


KITCHEN_SINK = """\
# index legend: t token, e embedding, f hidden
dim t = 4,e=8 , f   = 16   # sizes
dim f2 = 2 * f, half = e // 2
input Z[..., t, e]
input ids[t] : int
input m[t, t] : bool
param W[e, f] ~ normal(std=0.02, mean=0)  # weights
buffer P[e, f] ~ zeros
label Z "token embeddings"

# 1) Project. Yields: h.
h = einsum('te,ef->tf', Z,
           W)  # a note on a broken line
h = h + -h ** 2 - (h - 1) * (2 - h) / (1 + h ** 2)
# 2) Mask.
s = where(m, einsum('tok e, pos e -> tok pos', Z, Z) / sqrt(e), -inf)
c = clamp(h.detach(), min=-1e-05, max=10)
block mlp(x[t, e]) {  # block note
  # inside the block
  param W1[e, f] ~ xavier
  param W2[f, e]
  h = relu(einsum('te,ef->tf', x, W1))  # hidden
  return einsum('tf,fe->te', h, W2)
}
y = mlp(Z) repeat 2 as layers
output y, s  # the results
# trailing comment
"""


def test_fmt_kitchen_sink():
    assert_round_trip(KITCHEN_SINK)
    out = format_diagram(parse(KITCHEN_SINK))
    assert "dim t = 4  # sizes\ndim e = 8\ndim f = 16\n" in out  # one dim per line; the note stays on the first
    for kept in [
        "# index legend: t token, e embedding, f hidden",
        "# 1) Project. Yields: h.",
        "# 2) Mask.",
        "  # a note on a broken line",
        "  # weights",
        "# inside the block",
        "  # hidden",
        "  # block note",
        "  # the results",
        "# trailing comment",
        "label Z 'token embeddings'",
        "input Z[..., t, e]",
        "input ids[t] : int",
        "y = mlp(Z) repeat 2 as layers",
        "h.detach()",
    ]:
        assert kept in out, kept


def test_comments_are_part_of_the_ir():
    a = parse("dim e = 2\n# 1) First step.\ninput x[e]  # note\noutput x\n")
    captions = [s for s in a.body if isinstance(s, ir.Comment)]
    assert [(c.text, c.step) for c in captions] == [("1) First step.", 1)]
    assert a.body[2].note == "note"
    assert parse("dim e = 2\n# 1) Another step.\ninput x[e]  # note\noutput x\n") != a
    assert parse("dim e = 2\n# 1) First step.\ninput x[e]\noutput x\n") != a


@pytest.mark.parametrize(
    "text",
    [
        "dim e = 3\ninput x[e]\ny = x * 2  # twice\noutput y",
        "dim e = 3\ninput x[e]\ny = -(x + 1) ** 2\noutput y\n",
        "dim e = 3\ninput x[e]\ny = (-x) ** 2\noutput y\n",  # '(-x) ** 2' is not '-x ** 2'
        "dim e = 3\ninput x[e]\ny = x ** 2 ** 3\noutput y\n",  # right-associative
        "dim e = 3\ninput x[e]\ny = (x ** 2) ** 3\noutput y\n",
        "dim e = 3\ninput x[e]\ny = x - (x - 1)\noutput y\n",
        "dim e = 3\ninput x[e]\ny = x / (x * 2)\noutput y\n",
        "dim e = 3\ninput x[e]\ny = where(x > 0, x, 0.5)\noutput y\n",
        "dim e = 3\ninput x[e]\ny = -2 * x\noutput y\n",
        "dim e = 3\ninput x[e]\ny = x * 1e-05 + 1.5e+20\noutput y\n",
        "dim e = 3\ninput x[e]\ny = einsum(\"e->\", x)\noutput y\n",
        "dim e = 3\ninput x[e]\ny = x\noutput y\r\n",
        "\n\n#\n#\n\ndim e = 3\n\n\ninput x[e]\noutput x",
        # regressions: a CRLF comment kept its '\r' and trailing blanks, which fmt dropped
        "dim e = 3  # size\r\n# caption \r\ninput x[e]\r\noutput x\r\n",
        "# trailing blanks   \ndim e = 3\t# note\t\ninput x[e]\noutput x\n",
        # ... and \x0c or U+2028 in a comment made the parser's line table disagree with the lexer's
        "dim e = 3  # a\x0cb\n# c\u2028d\ninput x[e]  # note\x85\noutput x\n",
    ],
)
def test_fmt_round_trip_cases(text):
    assert_round_trip(text)
