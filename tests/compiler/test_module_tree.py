"""The generated module as one `ast.Module` (penrose.pyast), and the one table of initialisers.

The printer writes each statement's line numbers into the tree; they must be the ones Python's
own parser gives the printed source, statement by statement, or the source map (read from the
tree) would point at the wrong lines. The compiler and the interpreter fill parameters through
one row of `penrose.tables.INITIALISERS` each; a seeded module and the interpreter must start
from the same values, bit for bit, for every initialiser.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import penrose
from penrose import ir
from penrose import pyast as P
from penrose.compiler import generate_source, module_tree
from penrose.fmt import format_stmt
from penrose.interpreter import init_params
from penrose.tables import INITIALISERS, INITS, init_call

ROOT = Path(__file__).resolve().parents[2]
ZOO = sorted(p for p in (ROOT / "zoo").rglob("*.pen") if "steerling" not in p.parts)

BLOCKS = """\
dim t = 3, e = 4, f = 2, s
input x[t, e]
# a comment between statements
block twice(h[s, e]) {
  param W[e]
  g = tanh(h) * W
  return g + h  # a note
}
y = twice(x) as first
z = twice(y) repeat 2 as more.layers
u, v = split(z, e, [f, f])
output u, y
"""

# statements longer than a line: wrapped inside their brackets, the shape comment above one
LONG = """\
dim t = 3, e = 4, h = 2
input the_input_with_a_long_name[t, e]
param first_weight_with_a_long_name[e, h]
param second_weight_with_a_long_name[h, e]
param third_weight_with_a_long_name[e]
hidden = einsum('te,eh->th', the_input_with_a_long_name, first_weight_with_a_long_name)
y = einsum('th,he->te', sigmoid(hidden), second_weight_with_a_long_name) * third_weight_with_a_long_name + the_input_with_a_long_name
z = where(causal(t, t), einsum('te,se->ts', y + the_input_with_a_long_name * 2, the_input_with_a_long_name - y), -inf)
output y, z
"""


def _simple_statements(node):
    """(node, is it compound) for every statement of the tree but comments and verbatim text, in order."""
    for child in getattr(node, "body", ()):
        if isinstance(child, (P.Comment, P.Verbatim)):
            continue
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.If, ast.For)):
            yield child, True
            yield from _simple_statements(child)
        else:
            yield child, False


@pytest.mark.parametrize("standalone", [True, False])
@pytest.mark.parametrize("text", [BLOCKS, LONG] + [p.read_text() for p in ZOO[:6]], ids=["blocks", "long"] + [p.stem for p in ZOO[:6]])
def test_printed_line_numbers_are_the_parsers(text, standalone):
    tree = module_tree(penrose.load(text), standalone=standalone)
    source = P.print_module(tree)
    assert source == generate_source(penrose.load(text), standalone=standalone)
    inlined = [range(n.lineno, n.end_lineno + 1) for n in tree.body if isinstance(n, P.Verbatim)]
    parsed = {(n.lineno, n.col_offset): n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.stmt) and not any(n.lineno in r for r in inlined)}
    seen = 0
    for node, compound in _simple_statements(tree):
        other = parsed.get((node.lineno, node.col_offset))
        assert other is not None and type(other) is type(node), ast.unparse(node)
        if not compound:  # a compound statement's end: Python's ends before trailing comments
            assert other.end_lineno == node.end_lineno
            assert ast.unparse(other) == ast.unparse(node)
        seen += 1
    assert seen == len(parsed)  # every statement Python sees is one the tree holds
    assert bool(inlined) == standalone  # the helpers it calls, each as runtime.py writes it


def test_source_map_lines_hold_their_statements():
    c = penrose.load(BLOCKS)
    source, lines = generate_source(c, with_map=True)
    text = source.splitlines()
    statements = {s.stmt.span: s.stmt for body in (c, *c.blocks.values()) for s in body.stmts}
    assert [(cls, span.line) for cls, span, _, _ in lines] == [
        ("TwiceBlock", 6), ("TwiceBlock", 7), ("Diagram", 9), ("Diagram", 10), ("Diagram", 11)]
    for _cls, span, first, last in lines:
        code = [line.strip() for line in text[first - 1 : last]]
        st = statements[span]
        if isinstance(st, ir.Return):  # a return is its code
            assert code == ["return g + h"]
        else:  # an assignment: the diagram's statement as a comment, then its code
            assert code[0] == "# " + format_stmt(replace(st, note="")) and len(code) > 1
            assert all(line.startswith(tuple(st.targets)) or line.startswith("_") for line in code[1:])


def test_comment_and_docstring_text_cannot_escape():
    with pytest.raises(ValueError):
        P.print_module(P.module([P.Comment("x\nimport os")]))
    with pytest.raises(ValueError):
        P.print_module(P.module([P.commented(P.pass_(), "x\rimport os")]))
    with pytest.raises(ValueError):
        P.docstring('ends with a quote"')
    with pytest.raises(ValueError):
        P.assign("not a name", P.const(1))
    assert P.comment_text("a\nb\u2028c\x00") == "a b c\ufffd"


@pytest.mark.parametrize("name", sorted(INITIALISERS))
def test_every_initialiser_gives_the_interpreter_and_the_module_the_same_values(name):
    kw = {"normal": "(mean=0.5, std=2)", "constant": "(value=-3)", "uniform": "(a=-2, b=5)", "xavier": "(gain=3)", "fan_in": "(gain=2)"}.get(name, "")
    text = f"dim a = 3, b = 4\nparam W[a, b] ~ {name}{kw}\nparam v[b]\ninput x[b]\ny = einsum('ab,b->a', W, x * v)\noutput y"
    for seed in (0, 7):
        module = penrose.compile(text, seed=seed)
        params = init_params(penrose.load(text), seed=seed)
        assert set(params) == set(module.state_dict())
        for key, value in module.state_dict().items():
            assert torch.equal(value, params[key]), (name, key)


def test_fan_in_has_the_range_of_torchs_linear_weights():
    """`~ fan_in` over W[in, out] draws from the range torch's own nn.Linear(in, out) draws its
    weight from (kaiming_uniform with a = sqrt(5): +-1/sqrt(in)); `gain` scales it."""
    lin = torch.nn.Linear(64, 512)
    torch_max = lin.weight.detach().abs().max().item()
    for gain in (1.0, 2.0):
        module = penrose.compile(f"dim i = 64, o = 512\nparam W[i, o] ~ fan_in(gain={gain})\ninput x[i]\n"
                                 "y = einsum('i,io->o', x, W)\noutput y", seed=0)
        got = module.W.detach().abs().max().item()
        assert 0.99 * gain / 8 < got <= gain / 8 + 1e-7, (gain, got)
        if gain == 1.0:
            assert abs(got - torch_max) < 0.002, (got, torch_max)  # the same range as torch's module
    with pytest.raises(penrose.PenroseCheckError, match="fan_in: gain must be finite and at least 0, got -1"):
        penrose.load(text="dim i = 2\nparam W[i, i] ~ fan_in(gain=-1)\noutput W")


def test_the_checker_reads_the_table():
    assert INITS == {name: row.keywords for name, row in INITIALISERS.items()}
    row, args, kwargs = init_call(None, [3, 4])  # no `~`: normal's defaults
    assert row.function == "normal_" and args == () and kwargs == {"mean": 0.0, "std": 0.02}
    for name, row in INITIALISERS.items():
        # a made init (causal, arange, rotary...) is no torch.nn.init function: each backend computes it
        assert (row.function == "") if row.made else callable(getattr(torch.nn.init, row.function)), name
        args, kwargs = row.arguments({}, [3, 4])
        assert all(isinstance(v, float) for v in (*args, *kwargs.values()))


def _long(n: int) -> str:
    return "a_name_that_is_rather_long_" + str(n)


WRAPPED = {
    "call, hugged": P.call(P.path("torch.where"), *[P.name(_long(i)) for i in range(4)]),
    "call, one a line": P.call(P.path("torch.einsum"), P.const("ab,bc->ac"), *[P.name(_long(i)) for i in range(6)], dim=P.const(-1)),
    "method of a long receiver": P.method(P.call(P.name("f"), *[P.name(_long(i)) for i in range(5)]), "clamp", min=P.const(0)),
    "sum": P.binop("+", P.binop("-", P.name(_long(0)), P.binop("-", P.name(_long(1)), P.name(_long(2)))),
                   P.binop("*", P.name(_long(3)), P.binop("+", P.name(_long(4)), P.name(_long(5))))),
    "constant tuple of strings": P.literal(tuple(("x " * 40) + str(i) for i in range(3))),
    "one-tuple": P.tuple_([P.call(P.name("g"), *[P.name(_long(i)) for i in range(5)])]),
    "string longer than a line": P.call(P.name("g"), P.const("a word " * 40 + "the end"), P.const(1)),
}


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_a_long_statement_is_wrapped_to_the_same_tree(name):
    """Wrapped to fit the line, printed code is the same Python: its tree is the unwrapped one's."""
    node = P.assign("y", WRAPPED[name])
    printed = P.print_module(P.module([P.function("f", P.arguments([]), [P.commented(node, "[..., t, e=4]")])]))
    lines = printed.splitlines()
    assert len(lines) > 2 and all(len(line) <= P.LINE_LENGTH for line in lines), printed
    assert ast.dump(ast.parse(printed).body[0].body[0].value) == ast.dump(ast.parse(ast.unparse(node)).body[0].value)
    assert node.lineno == 2 and node.end_lineno == len(lines)  # where the printer says it is
