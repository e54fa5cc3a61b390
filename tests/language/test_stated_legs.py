"""Stated legs (`h[t, s, a] = tanh(qa + ka)`), positions (`arange(t)`) and the tied repeat
(`repeat N shared`) of issue 41: each mistake is refused at its cause (file, line, column) with
the form to write, and the forms round-trip through `penrose fmt`."""

from __future__ import annotations

import pytest
import torch

import penrose
from penrose.checker import check
from penrose.errors import PenroseCheckError, PenroseSyntaxError
from penrose.fmt import format_diagram
from penrose.parser import parse

HEAD = "dim t, s, a = 4, b = 2\ninput qa[t, a]\ninput ka[s, a]\n"


def _refused(body: str, error=PenroseCheckError):
    with pytest.raises(error) as e:
        check(parse(HEAD + body + "\noutput h\n", file="attn.pen"))
    return e.value


@pytest.mark.parametrize("body, line, col, words", [
    # a leg of the value the statement does not state: at the value, naming both fixes
    ("h[t, s] = tanh(qa + ka)", 4, 11, ["the value has leg 'a', which h[t, s] does not state", "h[t, s, a] = ...", "sum(..., a)"]),
    # a stated leg no operand has: at the leg
    ("h[t, s, a, b] = qa + ka", 4, 12, ["leg 'b' is stated, but the value has legs [t, s, a]"]),
    # an undeclared leg: at the leg
    ("h[t, s, x] = qa + ka", 4, 9, ["stated leg 'x' is not a declared dim", "dim x"]),
    ("h[t, t, a] = qa + ka", 4, 6, ["leg 't' is stated twice"]),
    # another order than the value's (an einsum decides its own): at the value
    ("h[s, t, a] = einsum('ta,sa->tsa', qa, ka)", 4, 14, ["the value's legs are [t, s, a], in that order", "h[t, s, a] = ..."]),
    # a plain number has no legs
    ("h[t] = 2 * a", 4, 1, ["h[t] states legs, but the value is a plain number"]),
    # without stated legs the outer sum stays refused, and the message names the stated form
    ("h = qa + ka", 4, 10, ["by position", "state the result's legs, as h[t, a, s] = ..."]),
])
def test_stated_leg_mistakes_are_refused_at_their_cause(body, line, col, words):
    err = _refused(body)
    assert (err.span.file, err.span.line, err.span.col) == ("attn.pen", line, col), str(err)
    for w in words:
        assert w in str(err)


def test_a_power_across_legs_names_the_stated_form():
    text = "dim h = 2, t, s\ninput gamma[h]\ninput dist[t, s]\ndecay = gamma ** dist\noutput decay\n"
    with pytest.raises(PenroseCheckError) as e:
        check(parse(text, file="ret.pen"))
    assert (e.value.span.line, e.value.span.col) == (4, 9)
    assert "decay[t, s, h] = ..." in str(e.value)
    fixed = penrose.compile(text.replace("decay = ", "decay[h, t, s] = "))
    gamma, dist = torch.tensor([0.5, 0.9]), torch.randn(3, 4)
    torch.testing.assert_close(fixed(gamma, dist), gamma[:, None, None] ** dist)


def test_batch_legs_are_not_stated():
    with pytest.raises(PenroseSyntaxError) as e:
        parse(HEAD + "h[..., t, s, a] = qa + ka\noutput h\n", file="attn.pen")
    assert "batch legs" in str(e.value) and e.value.span.line == 4


def test_stated_legs_keep_the_batch_and_follow_the_inputs():
    text = "dim t, s, a = 3\ninput qa[..., t, a]\ninput ka[..., s, a]\nh[t, s, a] = qa * ka\noutput h\n"
    m = penrose.compile(text)
    for n, k in ((2, 5), (4, 1)):
        qa, ka = torch.randn(2, n, 3), torch.randn(2, k, 3)
        torch.testing.assert_close(m(qa, ka), qa[:, :, None] * ka[:, None])
        torch.testing.assert_close(penrose.interpret(text, qa, ka), qa[:, :, None] * ka[:, None])


@pytest.mark.parametrize("body, col, words", [
    ("h = arange(qa)", 12, ["'qa' is a tensor, not a dim", "arange(t)"]),
    ("h = arange(2)", 12, ["arange takes a dim, as arange(t)"]),
    ("h = arange(u)", 12, ["undeclared dim 'u'"]),
])
def test_arange_mistakes(body, col, words):
    err = _refused(body)
    assert (err.span.line, err.span.col) == (4, col), str(err)
    for w in words:
        assert w in str(err)


def test_shared_needs_a_repeat():
    text = "dim e = 2\ninput x[e]\nblock f(h[e]) {\n  return h * 2\n}\ny = f(x) shared\noutput y\n"
    with pytest.raises(PenroseSyntaxError) as e:
        parse(text, file="f.pen")
    assert (e.value.span.line, e.value.span.col) == (6, 10)


def test_a_shared_instance_is_not_also_a_list_of_copies():
    text = ("dim e = 2\ninput x[e]\nblock f(h[e]) {\n  param W[e]\n  return h * W\n}\n"
            "y = f(x) repeat 3 shared as g\nz = f(y) repeat 3 as g\noutput z\n")
    with pytest.raises(PenroseCheckError) as e:
        check(parse(text, file="f.pen"))
    assert (e.value.span.line, "already a 'f' block") == (8, "already a 'f' block") and "already a 'f' block" in str(e.value)
    # a shared repeat and a plain call of the instance read one set of weights: allowed
    m = penrose.compile(text.replace("repeat 3 as g", "as g"), seed=0)
    assert list(m.state_dict()) == ["g.W"]
    W, x = m.state_dict()["g.W"], torch.randn(2)
    torch.testing.assert_close(m(x), x * W ** 4)


@pytest.mark.parametrize("text, kept", [
    ("dim t, s, a = 3\ninput qa[t, a]\ninput ka[s, a]\nh[t,s,a]=tanh(qa+ka)\noutput h\n", "h[t, s, a] = tanh(qa + ka)"),
    ("dim t, s\ndist[ t , s ] = arange(t)-arange(s)\noutput dist\n", "dist[t, s] = arange(t) - arange(s)"),
    ("dim e = 2\ninput x[e]\nblock f(h[e]) {\n  return h * 2\n}\ny = f(x)  repeat 3  shared as g\noutput y\n",
     "y = f(x) repeat 3 shared as g"),
])
def test_the_forms_round_trip_through_fmt(text, kept):
    formatted = format_diagram(parse(text))
    assert kept in formatted.splitlines()
    assert format_diagram(parse(formatted)) == formatted
    assert parse(formatted) == parse(text)
    assert [getattr(x, "legs", None) for x in parse(formatted).body] == [getattr(x, "legs", None) for x in parse(text).body]
    assert [getattr(x, "shared", None) for x in parse(formatted).body] == [getattr(x, "shared", None) for x in parse(text).body]
