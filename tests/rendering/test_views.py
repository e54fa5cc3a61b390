"""Derived views (penrose/views.py), the block call graph (penrose/blocks.py) and the compiler's
source map: each written once, and what the back ends read off them."""

import pytest

from penrose import ir
from penrose.blocks import order
from penrose.checker import check
from penrose.errors import PenroseCheckError
from penrose.parser import parse
from penrose.views import NOT_READ, Reads, legend, producers, read_counts, refs, statements, uses


def legend_of(text: str) -> dict:
    return legend(parse(text + "\ndim t = 1\ninput x[t]\noutput x\n"))


# ---- the index legend ------------------------------------------------------------------------


def test_legend_of_name_meaning_pairs():
    assert legend_of("# index legend: t token, e embedding") == {"t": "token", "e": "embedding"}


def test_legend_names_listed_alone_share_the_next_meaning():
    # regression: 'i, j, k input feature factors' used to keep k only, dropping i and j
    assert legend_of("# index legend: i, j, k input feature factors, d latent") == {
        "i": "input feature factors", "j": "input feature factors", "k": "input feature factors", "d": "latent"}


def test_legend_reads_continuation_lines_and_commas_inside_parentheses():
    text = "# index legend: t token, p key token (the paper's t_p, a key),\n#   e embedding, j second unit (the\n#   listing's e)"
    assert legend_of(text) == {"t": "token", "p": "key token (the paper's t_p, a key)", "e": "embedding",
                               "j": "second unit (the listing's e)"}


def test_legend_remarks_are_not_entries():
    # regression: zoo/paper/sparse_encoder.pen's 'k >> d' replaced k's meaning with '>> d'
    assert legend_of("# index legend: d latent feature, k sparse activation (concept), k >> d") == {
        "d": "latent feature", "k": "sparse activation (concept)"}


def test_legend_stops_at_an_unindented_comment_or_a_gap():
    assert legend_of("# index legend: t token\n# A diagram, e not a leg.") == {"t": "token"}
    assert legend_of("# index legend: t token\n\n#   e embedding") == {"t": "token"}
    assert legend_of("# no legend here") == {}


# ---- statements, values, reads ----------------------------------------------------------------

READS = """\
dim e = 2, f = 2
input x[e]
param W[e, f]
y = einsum('e,ef->f', x, W) + x
y = y * 2
z, w = split(y, f, [e1, e2])
output y, w
dim e1 = 1, e2 = 1
"""


def test_statements_of_a_kind():
    c = check(parse(READS))
    assert [s.targets for s in statements(c)] == [("y",), ("y",), ("z", "w")]
    assert [s.stmt.names for s in statements(c, ir.Output)] == [("y", "w")]


def test_uses_count_reads_by_ssa_version_and_kind():
    c = check(parse(READS))
    u = uses(c)
    assert u[("x", 0)] == Reads(einsum=1, other=1) and u[("W", 0)] == Reads(einsum=1)
    assert u[("y", 0)] == Reads(other=1)  # read by y = y * 2
    assert u[("y", 1)] == Reads(other=1, output=1)  # by the split, and by `output`: the last version
    assert ("z", 0) not in u and u.get(("z", 0), NOT_READ).total == 0
    assert read_counts(c) == {k: r.total for k, r in u.items()}
    assert read_counts(c)[("w", 0)] == 1


def test_refs_and_producers():
    c = check(parse(READS))
    first, second, split = statements(c)
    assert refs(first.value) == {"x", "W"}
    found, deps = producers(c, split)
    assert found["y"] is second.value and deps["y"] == {"x", "W", "y"}
    assert producers(c, first) == ({}, {})


def test_values_walk_deep_trees_without_recursion():
    terms = " + ".join(["x"] * 5000)
    c = check(parse(f"dim e = 2\ninput x[e]\ny = {terms}\noutput y"))
    assert uses(c)[("x", 0)] == Reads(other=5000)


# ---- the block call graph ----------------------------------------------------------------------


def blocks_of(text):
    return {s.name: s for s in parse(text).body if isinstance(s, ir.Block)}


def test_blocks_are_ordered_callees_first_in_definition_order():
    text = ("dim t = 2\nblock top(x[t]) {\n  return mid(x) + leaf(x)\n}\nblock mid(x[t]) {\n  return leaf(x)\n}\n"
            "block leaf(x[t]) {\n  return x\n}\nblock alone(x[t]) {\n  return x\n}\n")
    assert order(blocks_of(text)) == ["leaf", "mid", "top", "alone"]
    assert order({}) == []


def test_recursion_names_the_cycle_and_points_at_the_call_that_closes_it():
    # main calls into the cycle f -> g -> f but is not part of it
    text = ("dim t = 2\nblock main(x[t]) {\n  return f(x)\n}\nblock f(x[t]) {\n  return g(x)\n}\n"
            "block g(x[t]) {\n  return x + f(x)\n}\n")
    with pytest.raises(PenroseCheckError) as e:
        order(blocks_of(text))
    assert e.value.message == "recursion between blocks: f -> g -> f"
    assert (e.value.line, e.value.col) == (9, 14)


# ---- the source map ---------------------------------------------------------------------------

SPLIT = """\
# index legend: t token, f feature, a first part, b second part, c third part
dim t = 2, f = 6, a = 2, b = 2, c = 2
input x[t, f]
block twice(h[t, a]) {
  g = h * 2
  return g + h
}
u, v, w = split(relu(x), f, [a, b, c])
y = twice(u) + w
output y
"""


def test_source_map_pairs_every_statement_with_its_lines():
    pytest.importorskip("torch")
    from penrose.compiler import generate_source

    c = check(parse(SPLIT))
    source, lines = generate_source(c, with_map=True)
    assert source == generate_source(c)  # the map changes nothing
    text = source.splitlines()
    got = {(cls, span.line): text[a - 1 : b] for cls, span, a, b in lines}
    assert list(got) == [("TwiceBlock", 5), ("TwiceBlock", 6), ("Diagram", 8), ("Diagram", 9)]
    assert [t.strip() for t in got["Diagram", 8]] == [  # the split narrowed into the pieces read
        "# u, v, w = split(relu(x), f, [a, b, c])",
        "_split = torch.relu(x)",
        "u = _split.narrow(-1, 0, A)  # [..., t, a=2]",
        "w = _split.narrow(-1, A + B, C)  # [..., t, c=2]",
    ]
    assert [t.strip() for t in got["TwiceBlock", 6]] == ["return g + h"]
    for cls, _span, a, b in lines:  # each range lies in its class's forward()
        k = a - 1
        while not text[k].startswith("class "):
            k -= 1
        assert text[k].startswith(f"class {cls}(") and all(t.startswith("        ") for t in text[a - 1 : b])


def test_the_gallery_shows_a_wrapped_statement_without_its_comment():
    """A statement longer than a line: its comment (the diagram's statement) wraps, its code too;
    the gallery's PyTorch column shows the code, every line of it, and none of the comment."""
    pytest.importorskip("torch")
    from penrose.compiler import generate_source
    from penrose.rendering.gallery import statement_code

    long = "the_input_with_a_long_name"
    text = (f"dim t = 3, e = 4\ninput {long}[t, e]\nparam weight_with_a_long_name[e]\n"
            f"y = {long} * weight_with_a_long_name + {long} * weight_with_a_long_name * 2 + {long} / 3 + {long} * {long} - 1\n"
            "output y")
    c = check(parse(text))
    source, lines = generate_source(c, with_map=True)
    (code,) = statement_code(c, source, lines).values()
    assert code.startswith("y = (\n") and code.endswith(")  # [..., t, e=4]")
    assert "#" not in code.replace("# [..., t, e=4]", "")
    assert all(len(line) <= 130 for line in source.splitlines())
