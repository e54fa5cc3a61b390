"""One table of operations, seen from the renderer and the formatter: every operation of the
language has an entry in each backend table (figure, equation, reading, format), and for a small
diagram that uses every operation, each one's figure label, equation and reading are non-empty.
Deep and long programs (a 10,000-term sum, 1,000 nested calls) go through fmt, figures,
equations and readings without a RecursionError."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from penrose import ir
from penrose.checker import check
from penrose.errors import PenroseError, PenroseRenderError
from penrose.fmt import format_diagram
from penrose.parser import parse
from penrose.rendering import dot_source
from penrose.rendering.equations import latex_to_svg, to_latex, value_entry
from penrose.rendering.explain import READING, _Reader, statement_latex, statement_readings, statements
from penrose.rendering.figure import FIGURE, MAX_NODES, Options, build_figure
from penrose.ops import OPS
from penrose.stack import deep
from penrose.views import values

NAMES = frozenset(OPS)  # every operation of the language (penrose/ops.py)


# every operation once (and einsum, the masks and the shapes as they are used)
EVERY_OPERATION = """\
# index legend: t token, p key token, e embedding, h head, d head width, c class, f half
dim t = 4, p = 4, e = 6, h = 2, d = 3, c = 5, f = 3, f2 = 6
input x[t, e]
input y[t, e]
input ids[t] : int
param E[c, e]
param g[e] ~ ones
a1 = sigmoid(x)
a2 = sigma(x)
a3 = relu(x)
a4 = gelu(x)
a5 = silu(x)
a6 = tanh(x)
a7 = exp(x)
a8 = log(x)
a9 = sqrt(x)
a10 = abs(x)
a11 = softplus(x)
a12 = leaky_relu(x, slope=0.2)
a13 = mish(x)
a14 = hardswish(x)
a15 = elu(x, alpha=0.5)
a16 = clamp_min(x, 0.1)
b1 = x + y
b2 = x - y
b3 = x * y
b4 = x / y
b5 = x // y
b6 = x ** y
b7 = where(x < y, x, 0.0)
b8 = where(x <= y, x, 0.0)
b9 = where(x > y, x, 0.0)
b10 = where(x >= y, x, 0.0)
b11 = where(x == y, x, 0.0)
b12 = where(x != y, x, 0.0)
b13 = -x
l = einsum('te,pe->tp', x, y)
s1 = softmax(l, p)
s2 = log_softmax(l, p)
s3 = layernorm(x, e, weight=g)
s4 = rmsnorm(x, e, weight=g)
s5 = topk(x, e, k=2)
s6 = where(topk_mask(x, e, k=2), x, 0.0)
r1 = sum(x, e)
r2 = mean(x, e)
r3 = max(x, e)
r4 = min(x, y)
r5 = min(x, e)
r6 = max(0.5, x)
o1 = dropout(x, p=0.1)
o2 = x.detach()
o3 = clamp(x, min=-1, max=1)
m1 = where(causal(t, p), l, -inf)
m2 = where(block_causal(t, p, block=2), l, -inf)
m3[t, p] = arange(t) - arange(p)
i1 = gather(E, ids)
u, v = split(x, e, [f, f])
w = concat([u, v], f, f2)
q = unflatten(x, e, [h, d])
k = flatten(q, [h, d], e)
z = rope(x, t, e)
n1 = rearrange(x, 't (h d) -> h t d')
n2 = reduce(x, 't (h d) -> h', 'max')
n3 = repeat(x, 't e -> t p e')
n4 = select(x, t, 0)
n5 = slice(x, t, 1, h)
output a1
"""


@pytest.fixture(scope="module")
def every():
    c = check(parse(EVERY_OPERATION))
    found = {}  # operation name -> (statement number, statement, the value)
    for n, s in enumerate(statements(c), 1):
        for v in values(s.value):
            key = v.key
            if key is not None and key not in found:
                found[key] = (n, s, v)
    return c, found


def test_the_diagram_uses_every_operation(every):
    _, found = every
    assert set(found) == set(NAMES)


def test_every_checked_value_carries_the_record_its_row_names(every):
    """The typed IR: an operation's attributes are a record its row declares (ops.Op.attrs), an
    atom's the record of its kind, and a plain number the checker can compute is folded once."""
    from penrose import attrs as A
    from penrose.ops import OPS

    c, _ = every
    atoms = {"num": A.Num, "const": A.Const, "dimsize": A.DimSize, "ref": A.Ref, "block": A.BlockCall, "return": A.NoAttrs}
    seen = 0
    for s in statements(c):
        for v in values(s.value):
            want = OPS[v.key].attrs if v.key is not None else (atoms[v.op],)
            assert type(v.attrs) in want, f"{v.key or v.op} carries {type(v.attrs).__name__}, its row names {want}"
            if v.op in ("num", "sbin", "sfunc", "neg") and all(a.const is not None for a in v.args):
                assert v.const is not None, f"{v.key or v.op}: a plain number of known numbers is folded"
            seen += 1
    assert seen > 100


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_operation_has_a_label_an_equation_and_a_reading(every, name):
    c, found = every
    n, s, v = found[name]
    label = FIGURE[name].label(v)
    assert label and all(isinstance(line, str) for line in label) and label[0].strip()
    # the figure of its statement shows it: a box with its label, an operator circle with its glyph
    dot = dot_source(c, view=f"statement:{n}")
    if FIGURE[name].draw != "contraction":
        assert label[0].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in dot or FIGURE[name].glyph in dot, name
    # its equation: not a bare name (what the gallery showed for rope), and mathtext draws it
    expr = value_entry(v, tuple(v.type.legs))
    latex = to_latex(expr)
    assert latex.strip() and not re.fullmatch(r"\\mathrm\{\w+\}", latex), latex
    assert len(expr.free_symbols) >= 1, latex
    whole = statement_latex(c, s)
    assert whole.split("=", 1)[1].strip(), whole
    assert latex_to_svg(whole).startswith("<?xml")
    # its reading
    reader = _Reader({}, {}, {})
    READING[name](reader, v, None)
    assert reader.out and all(r.title and r.text for r in reader.out), name
    assert all(r.title and r.text for r in statement_readings(c, s))


def test_the_operations_the_gallery_showed_empty_have_real_equations(every):
    c, found = every
    latex = {name: to_latex(value_entry(found[name][2], tuple(found[name][2].type.legs))) for name in ("rope", "flatten", "unflatten", "topk_mask")}
    assert latex["rope"] == r"x_{te} \, \cos{\left(t \, \omega_{e} \right)} + \mathrm{rot}_{e}\left(x_{te}\right) \, \sin{\left(t \, \omega_{e} \right)}"
    assert latex["flatten"] == r"q_{t,\left\lfloor{\frac{e}{n_{d}}}\right\rfloor,e \bmod n_{d}}"
    assert latex["unflatten"] == r"x_{t,h \, n_{d} + d}"
    assert latex["topk_mask"] == r"\mathrm{rank}_{e}\left(x_{te}\right) \leq 2"


def test_block_causal_is_read_as_block_causal(every):
    c, found = every
    n, s, v = found["block_causal"]
    texts = " ".join(r.text for r in statement_readings(c, s))
    assert "blocks of 2" in texts and "bidirectional" in texts and "⌊p/2⌋ ≤ ⌊t/2⌋" in texts
    assert statement_latex(c, s) == r"m_{2,tp} = \mathrm{where}\left(\left\lfloor{\frac{p}{2}}\right\rfloor \leq \left\lfloor{\frac{t}{2}}\right\rfloor, l_{tp}, -\infty\right)"
    causal = " ".join(r.text for r in statement_readings(c, found["causal"][1]))
    assert "p ≤ t" in causal and "block" not in causal


# ---- depth: long sums and deep nesting ---------------------------------------------------------

TERMS, LEVELS = 10_000, 1_000


def _long(terms=TERMS, levels=LEVELS) -> str:
    total = " + ".join(f"x * {i}" if i % 3 else "tanh(x)" for i in range(terms))
    nested = "tanh(" * levels + "x" + ")" * levels
    return f"dim e = 3\ninput x[e]\ny = {total}\nz = {nested}\nw = {' + '.join(['x'] * terms)}\noutput y, z, w\n"


@pytest.fixture(scope="module")
def long():
    text = _long()
    d = parse(text)
    return text, d, deep(check)(d)  # deep: whether or not check makes room itself


def test_fmt_prints_a_long_sum_flat_and_deep_nesting(long):
    text, d, _ = long
    out = format_diagram(d)  # its time: bench/guards.py
    assert out == text  # already canonical: the sum on one line, the nesting as written
    assert deep(lambda: parse(out) == d)()


def test_equations_and_readings_of_long_and_deep_statements(long):
    _, _, c = long
    y, z, w = statements(c)
    latex = statement_latex(c, y)  # the time these take: bench/guards.py
    assert latex.count("+") == TERMS - 1
    assert latex.count(r"\left(") == len(range(0, TERMS, 3))  # only the tanh calls: the sum is flat
    assert statement_latex(c, z).count(r"\tanh") == LEVELS
    assert statement_latex(c, w) == r"w_{e} = " + " + ".join(["x_{e}"] * TERMS)
    assert [r.title for r in statement_readings(c, z)] == ["Activation"]
    assert "1,000 times in a row" in statement_readings(c, z)[0].text
    assert statement_readings(c, y)[-1].text.startswith("Add the 10,000 terms")


def test_figures_of_long_and_deep_statements(long):
    _, _, c = long
    fig = build_figure(c, "statement:2")  # 1,000 nested boxes: drawn
    assert sum(n.kind == "op" for n in fig.nodes) == LEVELS
    fig = build_figure(c, "statement:3")  # x + x + ... : one + node, one bundle of 10,000 legs
    assert [n.kind for n in fig.nodes].count("arith") == 1
    assert "e ×10,000" in dot_source(c, view="statement:3")
    with pytest.raises(PenroseRenderError, match=f"more than {MAX_NODES:,} nodes") as err:
        build_figure(c, "statement:1")  # 10,000 terms, each its own box: too many to lay out
    assert (err.value.line, err.value.col) == (3, 1)


def test_a_sum_with_differences_draws_flat():
    c = check(parse("dim e = 3\ninput x[e]\ny = " + " - ".join(f"x * {i}" for i in range(200)) + "\noutput y"))
    fig = build_figure(c, "statement:1", Options())
    assert [n.text for n in fig.nodes if n.kind == "arith"] == ["+"]
    assert sum(n.text == "−" for n in fig.nodes) == 199


def test_too_deep_for_even_the_big_stack_is_a_positioned_error():
    from penrose.stack import RECURSION_LIMIT

    levels = RECURSION_LIMIT  # far past what `deep` makes room for
    d = ir.Diagram((ir.Dim("e", ir.Number(3)), ir.Tensor("input", "x", ("e",)),
                    ir.Assign(("z",), _nest(levels)), ir.Output(("z",))))
    with pytest.raises(PenroseError):
        format_diagram(d)


def _nest(levels):
    e = ir.Name("x")
    for _ in range(levels):
        e = ir.Call("tanh", (e,))
    return e


# ---- only PenroseError escapes, and nothing is empty, for diagrams that check ------------------

STATEMENTS = [
    "y = {a} + {b}", "y = {a} - {b} * 2", "y = -{a} / sqrt(e)", "y = {a} ** 2 + {b} // 3",
    "y = where({a} > {b}, {a}, 0.5)", "y = clamp({a}, min=0)", "y = softmax({a}, e)",
    "y = einsum('e,e->e', {a}, {b})", "y = rope(einsum('te,e->te', q, {a}), t, e)",
    "y = flatten(unflatten({a}, e, [h, d]), [h, d], e)", "y = where(topk_mask({a}, e, k=2), {a}, 0)",
    "y = sum(einsum('te,e->te', q, {a}), t)", "y = leaky_relu({a}) + layernorm({b}, e)",
    "y = {a} * {b} / {a} ** {b}", "y = abs({a}) ** 0.5 - sigmoid({b}) ** 2", "y = dropout({a}, 0.1) * rmsnorm({b}, e)",
    "y = concat([{a}, {b}], e, g)", "y = where(causal(t, p), einsum('te,pe->tp', q * {a}, q), -inf)",
    "y = max({a} - mean({b}, e) * e, e) / 2 ** 0.5", "y = softmax(einsum('te,pe->tp', q * {a}, q), p)",
    "y = {a} - {b} - {a} - {b} + {a}", "y = ({a} < {b}) == ({b} < {a})",
]
OPERANDS = ["x", "tanh(x)", "(x + 1)", "einsum('e,e->e', x, x)", "relu(x - 1)", "x.detach()", "exp(-x)",
            "x / sqrt(e)", "(2 * x) ** 3", "gelu(x) // 2", "-abs(x)", "clamp(x, min=-inf, max=2)"]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(STATEMENTS), st.sampled_from(OPERANDS), st.sampled_from(OPERANDS)), min_size=1, max_size=4))
def test_render_and_explain_raise_only_penrose_errors(program):
    body = [s.format(a=a, b=b).replace("y =", f"y{i} =") for i, (s, a, b) in enumerate(program)]
    text = "dim t = 4, p = 4, e = 6, h = 2, d = 3, f = 3, g = 12\ninput x[e]\ninput q[t, e]\n" + "\n".join(body) + f"\noutput y{len(body) - 1}\n"
    c = check(parse(text))
    assert format_diagram(parse(format_diagram(c.diagram))) == format_diagram(c.diagram)
    try:
        build_figure(c)
    except PenroseError:
        pass
    for s in statements(c):
        assert statement_latex(c, s).split("=", 1)[1].strip()
        assert statement_readings(c, s) and all(r.text for r in statement_readings(c, s))


def test_a_layout_graphviz_cannot_finish_points_at_the_statement_that_drew_the_most(monkeypatch):
    import penrose.rendering.graphviz as gv
    from penrose.rendering import render

    def slow(dot, fmt="svg", timeout=60.0):
        raise PenroseRenderError(f"Graphviz took longer than {timeout:.0f} s to lay out the figure")

    monkeypatch.setattr(gv, "run_dot", slow)
    text = "dim e = 3\ninput x[e]\ny = tanh(x)\nz = " + " - ".join(f"y * {i}" for i in range(50)) + "\noutput z\n"
    with pytest.raises(PenroseRenderError, match="Graphviz took longer") as err:
        render(text)
    assert err.value.line == 4
