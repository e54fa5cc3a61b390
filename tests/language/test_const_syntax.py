"""`const` declarations and the einops-style calls, as syntax: both parser paths read them alike,
`penrose fmt` keeps them, and a malformed one is a positioned syntax error (penrose/parser.py,
grammar/penrose.lark, penrose/fmt.py). Their checking and compiling is tested elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from penrose import ir
from penrose.errors import PenroseSyntaxError
from penrose.fmt import FORMAT, CallForm, format_diagram, format_expr
from penrose.parser import _KEYWORDS, _attach_comments, _Lines, _normalise, _parse_fast, _parse_lark, parse
from penrose.tables import PEN_KEYWORDS


def layout(x):
    """Everything in an IR value, the fields equality skips included (spans, grouped, ...)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *((f.name, layout(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, (tuple, list)):
        return tuple(layout(y) for y in x)
    return (type(x).__name__, x)


def both(text: str):
    """The statements as the fast path and as the Lark path read them (spans and layout included);
    asserts that the fast path took the text and that the two agree."""
    text = _normalise(text)
    lines = _Lines(text, "<string>")
    fast = _parse_fast(text, lines)
    assert fast is not None, "the fast path declined"
    got = _attach_comments(*fast, lines)
    want = _attach_comments(*_parse_lark(text, lines), lines)
    assert layout(got) == layout(want)
    return got


# ---- const -----------------------------------------------------------------------------------

CONSTS = [
    "const alpha = 8",
    "const scale = alpha / r",
    "const a = 1, b = 2.5",
    "const eps0 = 1e-6",
    "const neg = -2",
    "const c = sqrt(d) * 2 ** -k // 3 + (a - b)",
    "const a = 1,  b = 2   # several, with a note",
    "const h = e // 4  # one\nconst w = 2 * h   # two",
    "dim e = 8\nconst scale = 1 / sqrt(e)\ninput x[e]\ny = x * scale\noutput y",
    "block f(x[t]) {\n  const k = 3   # inside a block\n  return x * k\n}\ny = f(z)",
    "const a = f(1,\n          2)",  # newlines inside brackets
    "y = const_a + 1",  # a name that starts like the keyword
]


@pytest.mark.parametrize("text", CONSTS)
def test_both_parser_paths_read_const_alike(text):
    both(text)


def test_const_ir():
    body = both("const alpha = 8, scale = alpha / r   # alpha\nconst neg = -2")
    assert body == [
        ir.Const("alpha", ir.Number(8), "alpha"),
        ir.Const("scale", ir.BinOp("/", ir.Name("alpha"), ir.Name("r"))),
        ir.Const("neg", ir.Number(-2)),
    ]
    assert [c.grouped for c in body] == [False, True, False]
    assert (body[0].span.line, body[0].span.col, body[0].span.end_col) == (1, 7, 16)  # from the name, as a Dim's
    assert (body[1].span.col, body[1].span.end_col) == (18, 35)
    assert body[0].note_span.col == 38
    assert isinstance(parse("const eps0 = 1e-6").body[0].value.value, float)


def test_const_has_the_layout_fields_of_dim():
    names = lambda cls: [(f.name, f.compare, f.kw_only) for f in dataclasses.fields(cls)]  # noqa: E731
    assert names(ir.Const)[2:] == names(ir.Dim)[2:]  # name, then the value (required) where a Dim has its size
    assert ir.Const("a", ir.Number(1)) == ir.Const("a", ir.Number(1), grouped=True)  # layout is not meaning


def test_const_is_a_keyword():
    assert "const" in _KEYWORDS and "const" in PEN_KEYWORDS


@pytest.mark.parametrize("text, line, col, message", [
    ("const = 3", 1, 7, "unexpected '='; 'const' is a keyword, not a name"),
    ("const 3 = x", 1, 7, "unexpected '3'"),
    ("const a", 1, 8, "unexpected end of line; expected '='"),
    ("dim e = 2\nconst a\ninput x[e]", 2, 8, "unexpected end of line; expected '='"),
    ("const a = ", 1, 11, "unexpected end of line"),
    ("const a = 1,", 1, 13, "unexpected end of line; expected a name"),
    ("const a = 1, b", 1, 15, "unexpected end of line; expected '='"),
    ("const a = 1 b = 2", 1, 13, "unexpected 'b'"),
    ("const a[e] = 1", 1, 8, "unexpected '['"),
])
def test_malformed_const_is_a_positioned_syntax_error(text, line, col, message):
    text = _normalise(text)
    assert _parse_fast(text, _Lines(text, "<string>")) is None  # the fast path leaves errors to Lark
    with pytest.raises(PenroseSyntaxError) as e:
        parse(text)
    assert (e.value.line, e.value.col) == (line, col)
    assert e.value.message.startswith(message), e.value.message


# ---- fmt -------------------------------------------------------------------------------------

MESSY = """\
# index legend: e embedding
dim e = 8
const   alpha=8,scale = alpha/e  # scale
const eps0 = 1e-6
const neg = - 2   # aligned
const big = 2**10 # here

block f(x[e]) {
  const k=3,j = k*2
  return x * k
}
"""

CANONICAL = """\
# index legend: e embedding
dim e = 8
const alpha = 8, scale = alpha / e   # scale
const eps0 = 1e-6
const neg = -2      # aligned
const big = 2**10   # here

block f(x[e]) {
  const k = 3, j = k * 2
  return x * k
}
"""


def test_fmt_prints_consts_like_dims_and_round_trips():
    once = format_diagram(parse(MESSY))
    assert once == CANONICAL
    assert format_diagram(parse(once)) == once
    assert parse(once) == parse(MESSY)
    assert [c.grouped for c in parse(once).body if isinstance(c, ir.Const)] == [False, True, False, False, False]


@pytest.mark.parametrize("text", CONSTS)
def test_fmt_round_trips_every_const_form(text):
    once = format_diagram(parse(text))
    assert format_diagram(parse(once)) == once
    assert parse(once) == parse(text)
    both(once)


def test_a_const_built_by_hand_formats_one_per_line():
    d = ir.Diagram((ir.Const("a", ir.Number(1)), ir.Const("b", ir.Neg(ir.Name("a")), "minus a")))
    assert format_diagram(d) == "const a = 1\nconst b = -a   # minus a\n"


def test_a_grouped_const_after_a_dim_starts_its_own_line():
    d = ir.Diagram((ir.Dim("e", ir.Number(2)), ir.Const("a", ir.Number(1), grouped=True)))
    assert format_diagram(d) == "dim e = 2\nconst a = 1\n"


# ---- repeat(...) the call, `repeat N` the keyword, and the einops-style calls ------------------

CALLS = {
    "h = repeat(x, 'h -> h c')": ir.Call("repeat", (ir.Name("x"), ir.String("h -> h c"))),
    "y = 2 * repeat(x, 'a -> a b')": ir.BinOp("*", ir.Number(2), ir.Call("repeat", (ir.Name("x"), ir.String("a -> a b")))),
    "y = f(repeat(x, 'a -> a b'), k=repeat(x, 'a -> b a'))": ir.Call(
        "f", (ir.Call("repeat", (ir.Name("x"), ir.String("a -> a b"))),),
        (("k", ir.Call("repeat", (ir.Name("x"), ir.String("a -> b a")))),)),
    "y = -repeat(x, 'a -> a b') ** 2": ir.Neg(ir.BinOp("**", ir.Call("repeat", (ir.Name("x"), ir.String("a -> a b"))), ir.Number(2))),
    "y = [repeat(x, 'a -> a b')]": ir.ListExpr((ir.Call("repeat", (ir.Name("x"), ir.String("a -> a b"))),)),
    "y = slice(x, t, 1, 5)": ir.Call("slice", (ir.Name("x"), ir.Name("t"), ir.Number(1), ir.Number(5))),
    "y = slice(x, t, 1, 5, into=t5)": ir.Call("slice", (ir.Name("x"), ir.Name("t"), ir.Number(1), ir.Number(5)), (("into", ir.Name("t5")),)),
    "y = select(x, k, 0)": ir.Call("select", (ir.Name("x"), ir.Name("k"), ir.Number(0))),
    "y = reduce(x, 't e -> e', 'mean')": ir.Call("reduce", (ir.Name("x"), ir.String("t e -> e"), ir.String("mean"))),
    "y = rearrange(x, 't (h d) -> h t d')": ir.Call("rearrange", (ir.Name("x"), ir.String("t (h d) -> h t d"))),
}


@pytest.mark.parametrize("text", list(CALLS))
def test_einops_style_calls_are_ordinary_calls(text):
    (stmt,) = both(text)
    assert isinstance(stmt, ir.Assign) and stmt.repeat is None and stmt.instance is None
    assert stmt.value == CALLS[text]
    once = format_diagram(parse(text))
    assert once == text + "\n" and parse(once) == parse(text)


@pytest.mark.parametrize("text, value, repeat, instance", [
    ("Z = layer(Z) repeat L as layers", ir.Call("layer", (ir.Name("Z"),)), ir.Name("L"), "layers"),
    ("Z = layer(Z) as layers repeat 4", ir.Call("layer", (ir.Name("Z"),)), ir.Number(4), "layers"),
    ("Z = layer(repeat(Z, 'a -> a b')) repeat (L)", ir.Call("layer", (ir.Call("repeat", (ir.Name("Z"), ir.String("a -> a b"))),)), ir.Name("L"), None),
    ("repeat = layer(Z) repeat L", ir.Call("layer", (ir.Name("Z"),)), ir.Name("L"), None),  # a name where no keyword stands
])
def test_the_repeat_keyword_after_a_call_still_works(text, value, repeat, instance):
    (stmt,) = both(text)
    assert (stmt.value, stmt.repeat, stmt.instance) == (value, repeat, instance)


def test_einops_style_calls_format_as_ordinary_calls():
    for name in ("rearrange", "reduce", "repeat", "select", "slice"):
        assert FORMAT.get(name, CallForm()) == CallForm()  # FORMAT has a row for every function of ops.OPS
        e = ir.Call(name, (ir.Name("x"), ir.String("a -> a")), (("k", ir.Number(1)),))
        assert format_expr(e) == f"{name}(x, 'a -> a', k=1)"
