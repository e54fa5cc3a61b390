"""The parser's fast path reads what the Lark path reads, the same way (penrose/parser.py).

`parse` tries a hand-written reader first and falls back to Lark's LALR parser wherever it
declines; every syntax error comes from Lark. Here the two are held to each other: on the zoo,
on generated programs and on fuzzed mutations of them, wherever the fast path accepts a text
the Lark path accepts it too and builds the same IR, spans, leg spans, note spans and layout
flags included (the IR's own equality leaves those out). Speed itself is measured by
bench/cli_latency.py, not here.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from penrose.errors import PenroseError, PenroseSyntaxError
from penrose.parser import _attach_comments, _Lines, _normalise, _parse_fast, _parse_lark, parse
from penrose.stack import deep
from program_strategies import deep_programs, programs
from test_fuzz import SEEDS, mutated

ROOT = Path(__file__).resolve().parents[2]
PEN_FILES = sorted(p for p in ROOT.glob("**/*.pen") if "gallery" not in p.parts and ".git" not in p.parts)


def layout(x):
    """Everything in an IR value, the fields equality skips included (spans, leg spans, grouped...)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *((f.name, layout(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, (tuple, list)):
        return tuple(layout(y) for y in x)
    if isinstance(x, float) and x != x:
        return "nan"
    return (type(x).__name__, x)


def fast(text: str):
    """The fast path's statements with comments attached, or None where it declines."""
    text = _normalise(text)
    lines = _Lines(text, "<string>")
    read = _parse_fast(text, lines)
    return None if read is None else layout(_attach_comments(*read, lines))


def slow(text: str):
    """The Lark path's statements with comments attached (raises PenroseSyntaxError)."""
    text = _normalise(text)
    lines = _Lines(text, "<string>")
    return layout(_attach_comments(*_parse_lark(text, lines), lines))


@deep  # as parse runs: room for deep programs, on both paths and in `layout`
def agree(text: str) -> bool:
    """Whether the fast path read `text`; asserts that it read it as Lark does, or declined an error."""
    got = fast(text)
    try:
        want = slow(text)
    except PenroseError:
        assert got is None, "the fast path accepted a text the grammar refuses"
        return False
    if got is not None:
        assert got == want
    return got is not None


@pytest.mark.parametrize("path", PEN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_diagram_in_the_repository_takes_the_fast_path(path):
    assert agree(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("text", SEEDS, ids=range(len(SEEDS)))
def test_the_fuzz_seeds_take_the_fast_path(text):
    assert agree(text)


@settings(max_examples=60)
@given(programs(decorate=True))
def test_generated_programs_take_the_fast_path_and_agree(program):
    assert agree(program.text)


@settings(max_examples=10)
@given(deep_programs())
def test_deep_programs_take_the_fast_path_and_agree(text):
    assert agree(text)


@settings(max_examples=400)
@given(mutated())
def test_mutated_programs_agree_or_the_fast_path_declines(text):
    agree(text)


@settings(max_examples=100)
@given(st.lists(st.sampled_from([
    "x", "W", "1", "2.5", "'ab->ab'", "+", "-", "*", "/", "//", "**", "<", "==", "(", ")", "[", "]", ",", ".",
    "shape", "detach", "f", "k=", "as", "repeat", "dim", "\n", " ", "# c", "\\\n",
]), max_size=14))
def test_random_expressions_agree(tokens):
    agree("dim e = 2\ninput x[e]\nparam W[e]\ny = " + "".join(tokens) + "\noutput y\n")


# Each a form where a span, a flag or a keyword is easy to get wrong; both paths must agree.
CASES = [
    "y = (a) + b",  # a parenthesised operand widens its parent's span to the '('
    "y = ((a + b))",  # ... but not its own
    "y = +a * b",  # a unary '+' widens like parentheses and makes no node
    "y = -(3)",  # a negated number is a number spanning the '-'
    "y = - -3",
    "y = -a ** b",  # '**' binds tighter than a sign before it
    "y = a ** -b ** c",  # and is right-associative
    "y = a - b - c * d / e // f",
    "y = a < b + c",
    "y = (W).shape[1] + W.shape[-1]",  # the shape's span starts at the '('
    "y = x.detach() + (x.detach)() + f(x).detach()",  # method=True
    "y = (+x.shape)[0]",
    "y = f(a, b,)",  # a trailing comma in a call
    "y = f(a, k=2, j=-1.5e3)",
    "y = f(x) repeat (L) as inst",
    "y = f(x) as repeat",  # a name after 'as', even a keyword's
    "y = f(x) repeat repeat",
    "as = input + dim + output",  # keywords are names where no keyword can stand
    "x, repeat = split(y, e, [a, b])",
    "dim a = 2, b, c = a * 3",  # grouped dims
    "input x[..., t, e] : int",
    "input s[]",
    "param W[e] ~ normal()",
    "buffer B[e, e] ~ eye",
    "buffer M[t, t] ~ causal unsaved",  # persistent=False
    "buffer P[t] unsaved  # note",
    "buffer unsaved[t] ~ rotary(base=10000) unsaved",
    "param W[e, f] ~ uniform(a=-0.1, b=0.1)  # note",
    "block f(a[t, e], b[t] : bool) { return a }",  # a one-line block
    "block f(a[t]) {\n  block g(b[t]) {\n    return b\n  }}\n",  # '}}'
    "block f(a[t]  # why\n        ) {  # head note\n  return a  # body note\n}  # after\n",
    "y = f(a,\n      b)  # newlines inside brackets do not end the statement",
    "y = f(a,  # a comment inside a call\n  b)",
    "y = a + \\\n    b",  # a continued line
    "y = a\x0c+ b",  # a form feed is a blank
    "y = \u0663 + 1.e5 + .5 + 7.",  # NUMBER's digits are \\d
    "# 1) A caption.\ny = a  # note\n\n\n# trailing",
    "# a comment with a \r inside\ny = a",
    "include 'lib.pen'\nlabel y \"the output\"\noutput y, z",
    "return a, b + c",
    "y = [a, [b, c], []]",
    "y = a",  # no final newline
    "s[t, s, a] = tanh(qa + ka)  # stated legs",
    "s[] = a + b",
    "s[t,\n  s] = a - b",
    "y = f(x) repeat 3 shared",
    "y = f(x) repeat L shared as slots  # tied",
    "y = f(x) as slots repeat L shared",
    "\ufeffy = a\r\nz = b\r\n",  # a byte-order mark and CRLF
    "\n\n\ny = a\n\n",
    "",
]


@pytest.mark.parametrize("text", CASES)
def test_forms_the_fast_path_reads_as_lark_does(text):
    assert agree(text)


# Valid texts the fast path leaves to Lark (rare in practice): Lark decides what they mean.
DECLINED = [
    "y = f(x) repeat L aslayers",  # Lark's contextual lexer reads 'as' + 'layers' where no name can stand
    "y = f(x) aswn",
    "y = f(x) repeat L sharedas g",
]


@pytest.mark.parametrize("text", DECLINED)
def test_texts_the_fast_path_declines_still_parse(text):
    assert deep(fast)(text) is None
    assert layout(parse(text).body) == slow(text)


def test_an_attribute_in_an_operand_is_a_syntax_error_at_the_attribute():
    # it reached the checker as a bare tuple ("unsupported expression tuple", no position)
    for text, col in [("y = a.shape + 1", 5), ("y = -a.detach", 6), ("y = [a.shape]", 6), ("y = 1 < a.foo", 9)]:
        with pytest.raises(PenroseSyntaxError) as e:
            parse("dim e = 2\ninput a[e]\n" + text + "\noutput y\n")
        assert e.value.message.endswith("must be used as T.shape[i] or x.detach()")
        assert (e.value.line, e.value.col) == (3, col)


def test_a_number_with_more_digits_than_python_reads_is_a_syntax_error():
    digits = sys.get_int_max_str_digits() + 1
    with pytest.raises(PenroseSyntaxError, match="more than") as e:
        parse("dim e = 2\ninput x[e]\ny = x * " + "7" * digits + "\noutput y\n")
    assert (e.value.line, e.value.col) == (3, 9)


def test_errors_come_from_the_lark_path():
    text = "dim e = 2\ninput x[e]\ny = x +\noutput y\n"
    assert fast(text) is None
    with pytest.raises(PenroseSyntaxError) as e:
        parse(text)
    assert (e.value.line, e.value.col) == (3, 8)


def test_parsing_a_valid_diagram_imports_no_lark():
    code = (
        "import sys; from penrose.parser import parse; "
        "parse(open('zoo/paper/self_attention.pen', encoding='utf-8').read()); "
        "print('lark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_fast_path_knows_every_keyword_and_operator_of_the_grammar():
    import re

    from penrose.parser import _COMPARE, _KEYWORDS, _MODIFIER, _TOKENS, _WORD, _parser

    terminals = {t.name: t.pattern for t in _parser().terminals}
    literals = {p.value for p in terminals.values() if p.type == "str"}
    words = {w for w in literals if w.isidentifier()}
    # the keywords the fast path read from the grammar's text are Lark's: statement keywords;
    # 'as' and 'repeat' after an assignment, 'shared' after a repeat, 'unsaved' after a buffer
    assert words == set(_WORD.values()) == _KEYWORDS | set(_MODIFIER) | {_WORD["unsaved"], _WORD["shared"]}
    assert len(_WORD) == len(words) == 14
    compare = terminals["COMPARE"].to_regexp()
    assert {op for op in ("<", "<=", ">", ">=", "==", "!=", "=<", "<>", "=") if re.fullmatch(compare, op)} == _COMPARE
    for op in (literals - words) | _COMPARE:
        m = _TOKENS.fullmatch(op)
        assert m and m.lastgroup == "OP" and m.group("OP") == op, op
