"""The index legend (penrose/views.py `legend`) in the forms people write it, and the warnings
for dims it leaves out (`legend_warnings`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from penrose import ir
from penrose.parser import parse, parse_file
from penrose.views import legend, legend_warnings

ROOT = Path(__file__).resolve().parents[2]
DIAGRAMS = sorted(p for p in ROOT.glob("**/*.pen") if "gallery" not in p.parts and ".git" not in p.parts)
TAIL = "\ndim t = 1, e = 2, h = 1, i = 1, j = 1, k = 1\ninput x[t]\noutput x\n"


def legend_of(text: str, tail: str = TAIL) -> dict:
    return legend(parse(text + tail))


# ---- the comma form --------------------------------------------------------------------------


def test_comma_list():
    assert legend_of("# index legend: t token, e embedding") == {"t": "token", "e": "embedding"}


@pytest.mark.parametrize("sep", [": ", " = ", " - ", " — ", " – ", ":", "="])
def test_separators_in_the_comma_form(sep):
    assert legend_of(f"# index legend: t{sep}token, e{sep}embedding (model width)") == {
        "t": "token", "e": "embedding (model width)"}


def test_names_listed_alone_share_the_next_meaning():
    assert legend_of("# index legend: i, j, k input feature factors, d latent") == {
        "i": "input feature factors", "j": "input feature factors", "k": "input feature factors", "d": "latent"}
    assert legend_of("# index legend: i, j: input feature factors") == {"i": "input feature factors", "j": "input feature factors"}


def test_remarks_are_not_entries():
    assert legend_of("# index legend: d latent feature, k sparse activation (concept), k >> d") == {
        "d": "latent feature", "k": "sparse activation (concept)"}
    assert legend_of("# index legend: t token, 3 heads, e embedding, = x") == {"t": "token", "e": "embedding"}
    assert legend_of("# index legend: t, >> e, e embedding") == {"e": "embedding"}  # a remark ends a shared list


def test_a_dash_inside_a_meaning_stays():
    assert legend_of("# index legend: e embedding - the model width, t token") == {
        "e": "embedding - the model width", "t": "token"}
    assert legend_of("# index legend:\n#   - e: embedding - the model width") == {"e": "embedding - the model width"}


def test_the_first_meaning_stands_and_spaces_collapse():
    assert legend_of("# index legend: t token,  e   model   width, t other") == {"t": "token", "e": "model width"}


def test_commas_inside_parentheses_do_not_part_items():
    assert legend_of("# index legend: p key token (the paper's t_p, a key), e embedding") == {
        "p": "key token (the paper's t_p, a key)", "e": "embedding"}


@pytest.mark.parametrize("head", ["# index legend:", "# Index legend:", "# INDEX LEGEND:", "# Index legend -",
                                  "# index legend —", "# index  legend :", "#index legend:"])
def test_header_spellings(head):
    assert legend_of(head + " t token, e embedding") == {"t": "token", "e": "embedding"}


def test_not_a_header():
    assert legend_of("# index legends: t token") == {}
    assert legend_of("# the index legend is below\n# t token") == {}
    assert legend_of("# no legend here") == {}


# ---- continuation lines ------------------------------------------------------------------------


def test_a_wrapped_comma_list():
    text = "# index legend: t token, p key token (the paper's t_p, a key),\n#   e embedding, j second unit (the\n#   listing's e)"
    assert legend_of(text) == {"t": "token", "p": "key token (the paper's t_p, a key)", "e": "embedding",
                               "j": "second unit (the listing's e)"}


def test_a_meaning_wrapped_without_parentheses_goes_on():
    text = "# index legend: t token, r vocabulary of the\n#   tokenizer, e embedding"
    assert legend_of(text) == {"t": "token", "r": "vocabulary of the tokenizer", "e": "embedding"}


def test_one_leg_per_line():
    text = "# index legend:\n#   t  token\n#   e  embedding (model width)"
    assert legend_of(text) == {"t": "token", "e": "embedding (model width)"}


def test_one_leg_per_line_without_declared_dims():
    # the legend alone, dims nowhere: each line after an empty header is its own item
    d = ir.Diagram((ir.Comment("index legend:"), ir.Comment("  t token"), ir.Comment("  e embedding")))
    assert legend(d) == {"t": "token", "e": "embedding"}


def test_one_leg_per_line_after_a_first_item_on_the_header():
    assert legend_of("# index legend: t token\n#   e embedding") == {"t": "token", "e": "embedding"}  # e a dim
    assert legend_of("# index legend: t token\n#   q: query") == {"t": "token", "q": "query"}
    assert legend_of("# index legend: t token\n#   q  query") == {"t": "token", "q": "query"}


@pytest.mark.parametrize("line", ["t: token", "t = token", "t - token", "t — token", "t – token", "- t: token",
                                  "- t token", "* t = token", "• t: token", "t:token"])
def test_per_line_separators_and_bullets(line):
    for indent in ("  ", "   ", "\t"):
        text = f"# index legend:\n#{indent}{line}\n#{indent}{line.replace('t', 'e').replace('eoken', 'embedding')}"
        assert legend_of(text) == {"t": "token", "e": "embedding"}, text


def test_names_sharing_a_meaning_on_one_line_and_several_items_per_line():
    text = "# index legend:\n#   i, j, k  input feature factors\n#   t token, e embedding\n#   - h: head"
    assert legend_of(text) == {"i": "input feature factors", "j": "input feature factors",
                               "k": "input feature factors", "t": "token", "e": "embedding", "h": "head"}


def test_remarks_on_continuation_lines():
    assert legend_of("# index legend:\n#   d latent\n#   k concept\n#   k >> d") == {"d": "latent", "k": "concept"}


def test_a_meaning_cut_inside_parentheses_goes_on_in_the_per_line_form():
    text = "# index legend:\n#   e  embedding (the model\n#      width, 4096)\n#   t  token"
    assert legend_of(text) == {"e": "embedding (the model width, 4096)", "t": "token"}


def test_an_unindented_continuation_needs_a_declared_dim_first():
    assert legend_of("# index legend:\n# t token\n# e embedding") == {"t": "token", "e": "embedding"}
    assert legend_of("# index legend: t token\n# e: embedding\n# - h head") == {"t": "token", "e": "embedding", "h": "head"}
    # the first word is no dim of the diagram: the legend has ended
    assert legend_of("# index legend: t token\n# A diagram, e not a leg.") == {"t": "token"}
    assert legend_of("# index legend: t token\n# q query\n#   e embedding") == {"t": "token"}
    assert legend_of("# index legend: t token\n# e.g. more") == {"t": "token"}  # 'e' only as a whole word
    assert legend_of("# index legend: t token\n# embedding of e") == {"t": "token"}


def test_dims_of_blocks_count_for_unindented_lines():
    text = "# index legend: t token\n# f hidden\nblock mlp(x[t]) {\n  dim f = 3\n  return x\n}"
    assert legend_of(text) == {"t": "token", "f": "hidden"}


def test_the_legend_ends_at_a_gap_an_empty_comment_or_a_statement():
    assert legend_of("# index legend: t token\n\n#   e embedding") == {"t": "token"}
    assert legend_of("# index legend: t token\n#\n#   e embedding") == {"t": "token"}
    assert legend_of("# index legend: t token\ndim q = 1\n#   e embedding") == {"t": "token"}


def test_only_the_first_legend_counts():
    assert legend_of("# index legend: t token\n\n# index legend: e embedding") == {"t": "token"}


# ---- legend_warnings -----------------------------------------------------------------------------


def test_a_dim_missing_from_the_legend_is_reported_at_its_declaration():
    d = parse("# index legend: t token, e embedding\ndim t, e = 4, h = 2\ninput x[t, e]\noutput x\n")
    ((message, span),) = legend_warnings(d)
    assert message == "dim 'h' is not in the index legend (# index legend: h <meaning>)"
    assert (span.line, span.col, span.end_col) == (2, 15, 20)


def test_a_complete_legend_gives_no_warnings():
    d = parse("# index legend:\n#   t  token\n#   e  embedding\ndim t, e = 4\ninput x[t, e]\noutput x\n")
    assert legend_warnings(d) == []


def test_without_a_legend_every_dim_is_reported():
    d = parse("dim t, e = 4\nblock f(x[t]) {\n  dim g = 2\n  return x\n}\ninput x[t, e]\noutput x\n")
    assert [(m.split("'")[1], s.line) for m, s in legend_warnings(d)] == [("t", 1), ("e", 1), ("g", 3)]
    assert legend_warnings(parse("input x[]\noutput x\n")) == []


def test_dims_of_included_files_are_not_reported(tmp_path):
    (tmp_path / "dims.pen").write_text("# index legend: e embedding\ndim e = 4, q = 2\n")
    (tmp_path / "main.pen").write_text('# index legend: t token\ninclude "dims.pen"\ndim t\ninput x[t, e]\noutput x\n')
    assert legend_warnings(parse_file(tmp_path / "main.pen")) == []
    assert [m.split("'")[1] for m, _ in legend_warnings(parse_file(tmp_path / "dims.pen"))] == ["q"]


@pytest.mark.parametrize("path", DIAGRAMS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_diagram_in_the_repository_explains_its_dims(path):
    assert legend_warnings(parse_file(path)) == []
