"""Mistakes new users made writing architectures from the docs alone (issue 41): each refusal is
placed at its cause and says what to write instead.

Each case is the diagram as a user wrote it, the place the message must point at (line,
column), the message and the text of its hint; the hint is then applied, where it is one edit,
and the fixed diagram must check.
"""

from __future__ import annotations

import re

import pytest

import penrose
from penrose.errors import PenroseCheckError, PenroseWarning

# (name, diagram, line, col, message (a regex, searched), what to write (verbatim in the message))
MISTAKES = [
    ("an einsum output letter renames a square matrix's leg",
     "dim k = 3, d = 4\ninput x[k, d]\nparam W[d, d]\nparam b_r[d]\nh = einsum('kd,de->ke', x, W)\ny = h + b_r\noutput y",
     5, 21, r"einsum output letter 'e' names the result's leg 'e', but it takes operand 2 'W' leg 'd', so '\+' on line 6 "
            r"cannot broadcast 'b_r' with legs \[d\] against \[k, e\]",
     "write einsum('ka,ad->kd', ...)"),
    ("an einsum output letter naming a dim of another size, and a sum over it below",
     "dim k = 3, d = 4, e = 5\ninput x[k, d]\nparam W[d, d]\nparam c[k, e]\nh = einsum('kd,de->ke', x, W)\ny = h + c\noutput y",
     5, 21, r"einsum output letter 'e' names dim 'e' \(size 5\), but it takes operand 2 'W' leg 'd' \(size 4\), so line 6 "
            r"fails: size conflict in '\+'",
     "write einsum('ka,ad->kd', ...)"),
    ("an einsum output letter naming a dim of another size, and an einsum over it below",
     "dim k = 3, d = 4, e = 5\ninput x[k, d]\nparam W[d, d]\nparam U[e, e]\nh = einsum('kd,de->ke', x, W)\n"
     "y = einsum('ke,ef->kf', h, U)\noutput y",
     5, 21, r"so line 6 fails: size of label 'e' for operand 2 'U' leg 'e' \(5\) does not match operand 1 'h' leg 'e' \(4\)",
     "write einsum('ka,ad->kd', ...)"),
    ("an outer sum over legs sized at run time",
     "dim t, s, a = 4\ninput qa[t, a]\ninput ka[s, a]\ny = tanh(qa + ka)\noutput y",
     4, 15, r"'\+' would align leg 's' of 'ka' with leg 't' of 'qa' by position",
     "write repeat(qa, '... -> ... s', s=SIZE)"),
    ("a power across different legs",
     "dim h = 2, t = 3, s = 3\ninput gamma[h]\ninput dist[t, s]\ny = gamma ** dist\noutput y",
     4, 5, r"cannot broadcast 'gamma' with legs \[h\] against \[t, s\] in '\*\*'",
     "write repeat(gamma, 'h -> t s h')"),
    ("an outer product written as '*'",
     "dim t = 3, s = 4, e = 5\ninput a[t]\ninput b[s, e]\ny = a * b\noutput y",
     4, 5, r"cannot broadcast 'a' with legs \[t\] against \[s, e\] in '\*'",
     "for the outer product write einsum('t,se->tse', a, b)"),
    ("a bias whose leg has another name but the same size",
     "dim t = 3, e = 4, d = 4\ninput x[t, e]\nparam b[d]\ny = x + b\noutput y",
     4, 9, r"cannot broadcast 'b' with legs \[d\] against \[t, e\]",
     "if leg 'd' of 'b' is leg 'e' (both size 4), give them one name"),
    ("repeat to a leg sized only at run time",
     "dim t, a = 4, s\ninput qa[t, a]\ny = repeat(qa, 't a -> t s a')\noutput y",
     3, 26, r"repeat: the new leg 's' needs a size",
     "repeat(..., s=SIZE), or declare it with 'dim s = SIZE'"),
    ("a typo in a tensor's name",
     "dim e = 4, d = 2\ninput x[e]\nparam W_q[e, d]\nq = einsum('e,ed->d', x, W_k)\noutput q",
     4, 26, r"unknown tensor 'W_k'", "did you mean 'W_q'?"),
    ("a typo in a function's name",
     "dim e = 4\ninput x[e]\ny = softmx(x)\noutput y",
     3, 5, r"unknown function 'softmx'", "did you mean 'softmax'?"),
    ("a function that does not exist",
     "dim e = 4\ninput x[e]\ny = erf(x)\noutput y",
     3, 5, r"unknown function 'erf'", "or define it as a block: block erf(x[...]) { ... }"),
    ("an einsum output letter in no input",
     "dim e = 4\ninput x[e]\ny = einsum('e->f', x)\noutput y",
     3, 16, r"output leg 'f' appears in no input of the einsum", "write only the inputs' labels ('e') after '->'"),
    ("a matrix applied like a function",
     "dim e = 4\ninput x[e]\nparam W[e, e]\ny = W(x)\noutput y",
     4, 5, r"'W' is a tensor, not a function", "contract it with einsum, as einsum('te,ed->td', x, W)"),
    ("a param updated in place",
     "dim e = 4, d = 2\ninput x[e]\nparam W[e, d]\nW = W * 2\ny = einsum('e,ed->d', x, W)\noutput y",
     4, 1, r"cannot assign to param 'W'", "give the new value another name (W_2 = ...)"),
    ("a leg given as a string",
     "dim t = 3, e = 4\ninput x[t, e]\ny = softmax(x, 'e')\noutput y",
     3, 16, r"softmax: the leg is a leg name, without quotes", "write e, not 'e'"),
    ("an output never computed",
     "dim e = 4\ninput x[e]\noutput y",
     3, 1, r"unknown tensor 'y'", "declare it ('input y[...]', 'param y[...]') or assign it ('y = ...') above this line"),
    ("a leg the tensor does not have",
     "dim t = 3, e = 4, p = 3\ninput x[t, e]\ny = softmax(x, p)\noutput y",
     3, 16, r"softmax: the tensor has no leg 'p'; its legs are \[t, e\]", "write one of them, as softmax(x, e)"),
    ("a repeat count sized only when compiling",
     "dim e = 4, L\nblock f(x[e]) {\n  return x * 2\n}\ninput x[e]\ny = f(x) repeat L\noutput y",
     6, 17, r"repeat count 'L' needs a size of at least 1", "declare it with 'dim L = 4'"),
    ("an einsum term with a letter too many",
     "dim t = 3, e = 4, d = 2\ninput x[t, e]\nparam W[e, d]\ny = einsum('te,edx->td', x, W)\noutput y",
     4, 16, r"einsum term 2 'edx' has 3 leg\(s\) but operand 2 'W' has 2: \[e, d\]", "write one label per leg, as 'ed'"),
    ("statements in the wrong order",
     "dim e = 4\ninput x[e]\ny = z + 1\nz = x * 2\noutput y",
     3, 5, r"unknown tensor 'z'", "it is assigned on line 4, below this use: move that statement above it"),
    ("a mask added with arithmetic",
     "dim t = 3\ninput x[t]\ninput m[t] : bool\ny = x * m\noutput y",
     4, 9, r"arithmetic on the bool mask 'm'", "use where(mask, a, b)"),
]


@pytest.mark.parametrize("name, text, line, col, message, hint", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_the_refusal_names_the_cause_and_what_to_write(name, text, line, col, message, hint):
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    err = info.value
    assert (err.line, err.col) == (line, col), err.render()
    assert re.search(message, err.message), err.message
    assert hint in err.message, err.message


# the hint, applied: (name of the case, the text it replaces, what the hint says to write)
FIXED = {
    "an einsum output letter renames a square matrix's leg": ("'kd,de->ke'", "'ka,ad->kd'"),
    "a power across different legs": ("gamma ** dist", "repeat(gamma, 'h -> t s h') ** dist"),
    "an outer product written as '*'": ("a * b", "einsum('t,se->tse', a, b)"),
    "repeat to a leg sized only at run time": ("'t a -> t s a')", "'t a -> t s a', s=5)"),
    "a matrix applied like a function": ("W(x)", "einsum('e,ed->d', x, W)"),
    "a leg given as a string": ("'e')", "e)"),
    "statements in the wrong order": ("y = z + 1\nz = x * 2", "z = x * 2\ny = z + 1"),
    "a leg the tensor does not have": ("softmax(x, p)", "softmax(x, e)"),
    "an einsum term with a letter too many": ("'te,edx->td'", "'te,ed->td'"),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_the_hint_applied_checks(name):
    text = next(m[1] for m in MISTAKES if m[0] == name)
    old, new = FIXED[name]
    assert old in text
    penrose.load(text.replace(old, new))


def test_an_einsum_letter_that_names_a_dim_of_another_size_is_a_warning_at_the_letter():
    text = "dim k = 3, d = 4, e = 5\ninput x[k, d]\nparam W[d, d]\nh = einsum('kd,de->ke', x, W)\noutput h"
    with pytest.warns(PenroseWarning) as got:
        checked = penrose.load(text)
    (w,) = [w.message for w in got if isinstance(w.message, PenroseWarning)]
    assert (w.line, w.col) == (4, 21)  # the letter 'e' after '->'
    assert w.message == ("einsum output letter 'e' names dim 'e' (size 5), but it takes operand 2 'W' leg 'd' (size 4): "
                         "the result's leg 'e' has size 4; write einsum('ka,ad->kd', ...) to keep the legs' names")
    assert [(m, s.line) for m, s in checked.warnings if "legend" not in m] == [(w.message, 4)]
    assert checked.outputs[0][1].legs == ("k", "e")  # a warning, not a refusal: the diagram still checks


def test_an_einsum_letter_of_the_dim_it_takes_or_of_no_dim_is_no_warning():
    plain = "dim k = 3, d = 4, e = 5\ninput x[k, d]\nparam W[d, e]\nh = einsum('kd,de->ke', x, W)\noutput h"
    renamed = "dim k = 3, d = 4\ninput x[k, d]\nparam W[d, d]\nh = einsum('kd,de->ke', x, W)\noutput h"
    for text in (plain, renamed):
        assert [m for m, _ in penrose.load(text).warnings if "einsum" in m] == []


def test_the_refusal_at_the_letter_keeps_a_note_at_the_statement():
    text = next(m[1] for m in MISTAKES if m[0].endswith("and a sum over it below"))
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    assert [(t, s.line, s.col) for t, s in info.value.notes][0] == ("line 6 refused here", 6, 5)


def test_a_later_refusal_unrelated_to_the_letter_stays_where_it_is():
    text = ("dim k = 3, d = 4, f = 6\ninput x[k, d]\nparam W[d, d]\nparam c[f]\n"
            "h = einsum('kd,de->ke', x, W)\ny = h + c\noutput y")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    assert (info.value.line, info.value.col) == (6, 9)  # naming 'e' back as 'd' would not align [f] either
    assert info.value.message.startswith("cannot broadcast 'c' with legs [f] against [k, e]")


def test_the_letter_hint_in_the_word_form_keeps_the_word_form():
    text = ("dim tok = 3, hid = 4, out = 5\ninput x[tok, hid]\nparam W[hid, hid]\nparam b[hid]\n"
            "h = einsum('tok hid, hid out -> tok out', x, W)\ny = h + b\noutput y")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    assert (info.value.line, info.value.col) == (5, 37)  # 'out' after '->'
    assert "write einsum('tok hid2, hid2 hid -> tok hid', ...)" in info.value.message
    penrose.load(text.replace("'tok hid, hid out -> tok out'", "'tok hid2, hid2 hid -> tok hid'"))
