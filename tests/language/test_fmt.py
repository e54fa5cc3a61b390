"""The formatter keeps the meaning: parse(fmt(x)) == parse(x), and fmt is idempotent.

The IR compares without source spans, so the same diagram laid out differently compares equal;
comments, step captions and statement notes are part of the IR and must survive. The author's
layout choices that fmt keeps (dims grouped on one line, blank lines, notes aligned in a column)
are recorded outside equality, and every diagram under zoo/ is already in canonical form.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from penrose import ir
from penrose.cli import main
from penrose.fmt import NOTE_GAP, format_diagram, format_expr, format_stmt
from penrose.parser import parse, parse_file
from strategies import decorated, einsum_cases, elementwise_cases

ROOT = Path(__file__).resolve().parents[2]


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
    """Spacing and calls broken over lines do not change the formatted text; blank lines stay
    where they are written, one for a run of them, never first or last."""
    plain, messy = texts
    canonical = format_diagram(parse(plain))
    out = format_diagram(parse(messy))
    assert _no_blanks(out) == _no_blanks(canonical)
    assert format_diagram(parse(messy.replace("\n\n", "\n\n\n"))) == out
    assert out.endswith("\n") and "\n\n\n" not in out and not out.startswith("\n") and not out.endswith("\n\n")


def _no_blanks(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line.strip())


ZOO = sorted((ROOT / "zoo").rglob("*.pen"))


def test_fmt_every_zoo_diagram():
    for f in ZOO:
        d = parse_file(f)
        once = format_diagram(d)
        assert parse(once, file=str(f)) == d, f
        assert format_diagram(parse(once)) == once, f


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(ROOT / "zoo")))
def test_zoo_diagram_is_canonical(path):
    """Every committed diagram is already in canonical form: `penrose fmt --write zoo` changes nothing."""
    text = path.read_text(encoding="utf-8")
    assert format_diagram(parse(text, file=str(path))) == text


def test_fmt_check_passes_on_the_zoo(capsys):
    assert main(["fmt", "--check", *map(str, ZOO)]) == 0
    assert capsys.readouterr().out == ""


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
    assert "dim t = 4, e = 8, f = 16   # sizes\ndim f2 = 2 * f, half = e // 2\n" in out  # grouped as written
    for kept in [
        "# index legend: t token, e embedding, f hidden",
        "\n\n# 1) Project. Yields: h.\n",
        "# 2) Mask.",
        ")   # a note on a broken line",
        "   # weights",
        "# inside the block",
        "   # hidden",
        "{   # block note",
        "   # the results",
        "# trailing comment",
        'label Z "token embeddings"',
        "input Z[..., t, e]",
        "input ids[t] : int",
        "y = mlp(Z) repeat 2 as layers",
        "h.detach()",
        "h + -h**2 - (h - 1) * (2 - h) / (1 + h**2)",
        "min=-1e-5, max=10",
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
        # a negative number raised to a power printed as '-2 ** x', which is -(2 ** x)
        "dim e = 3\ninput x[e]\ny = (-2) ** x + (-0.5) ** x\noutput y\n",
        # a grouped dim with its own note (after a backslash continuation) must start its own line
        "dim a = 1, \\\n  b = 2   # note of b\ninput x[a, b]\noutput x\n",
        # an overflowing literal is infinity, which must not print as the name 'inf'
        "dim e = 3\ninput x[e]\ny = x * 1e999\noutput y\n",
    ],
)
def test_fmt_round_trip_cases(text):
    assert_round_trip(text)


# ---- the canonical form's rules -------------------------------------------------------------


def fmt(text: str) -> str:
    out = format_diagram(parse(text))
    assert_round_trip(text)
    return out


def test_grouped_dims_stay_grouped():
    text = "dim t, p, e = 32, h = 4\ndim d = 8\ninput x[t, e]\noutput x\n"
    assert fmt(text) == text
    assert fmt("dim   f=30 ,r = 1\n") == "dim f = 30, r = 1\n"
    # the grouping is layout, not meaning
    one_per_line = parse("dim t\ndim p\ndim e = 32\ndim h = 4\ndim d = 8\ninput x[t, e]\noutput x\n")
    assert parse(text) == one_per_line and hash(parse(text).body) == hash(one_per_line.body)
    assert [d.grouped for d in parse(text).body[:5]] == [False, True, True, True, False]
    # a diagram built by hand (nothing grouped) gets one dim per line
    built = ir.Diagram((ir.Dim("f", ir.Number(30)), ir.Dim("r", ir.Number(1))))
    assert format_diagram(built) == "dim f = 30\ndim r = 1\n"


def test_grouped_dims_keep_their_note_on_the_first_dim():
    assert fmt("dim f = 30, r = 1  # sizes\n") == "dim f = 30, r = 1   # sizes\n"
    # the note of a later dim in the group (possible after a backslash) cannot stay on the line
    assert fmt("dim a = 1, \\\n  b = 2   # b\n") == "dim a = 1\ndim b = 2   # b\n"


def test_label_and_include_strings_take_double_quotes():
    assert fmt("label x 'input x'\n") == 'label x "input x"\n'
    assert fmt('label x "input x"\n') == 'label x "input x"\n'
    assert fmt("""label x 'the "x"'\n""") == """label x 'the "x"'\n"""  # no escapes: the other quote
    assert fmt("include 'dims.pen'\n") == 'include "dims.pen"\n'


def test_expression_strings_take_single_quotes():
    assert fmt('dim e = 2\ninput x[e]\ny = einsum("e->", x)\noutput y\n') == "dim e = 2\ninput x[e]\ny = einsum('e->', x)\noutput y\n"
    assert format_expr(ir.String("it's")) == '"it\'s"'


def test_note_sits_note_gap_spaces_after_its_code():
    for written in ["y = x # n", "y = x  # n", "y = x\t#n", "y = x              # n"]:
        assert fmt(f"dim e = 2\ninput x[e]\n{written}\noutput y\n").splitlines()[2] == "y = x" + " " * NOTE_GAP + "# n"
    assert format_stmt(parse("dim e = 2   # n").body[0]) == "dim e = 2   # n"


def test_aligned_notes_stay_aligned():
    text = (
        "dim j = 4\n"
        "input x[j]\n"
        "h = relu(x)   # hidden\n"
        "# a comment line does not part the paragraph\n"
        "y = h * 2     # output\n"
        "z = y\n"
        "w = z         # last\n"
        "output w\n"
    )
    assert fmt(text) == text  # aligned three spaces after the longest line: already canonical
    moved = text.replace("   # hidden", "        # hidden").replace("     # output", "          # output").replace("         # last", "              # last")
    assert fmt(moved) == text  # aligned further right: pulled in to the same column
    # a note out of the column is on its own: three spaces after its code; the others stay aligned
    ragged = text.replace("     # output", "  # output")
    assert fmt(ragged).splitlines()[2:7] == ["h = relu(x)   # hidden", "# a comment line does not part the paragraph", "y = h * 2   # output", "z = y", "w = z         # last"]
    # no two notes in one column: none is aligned
    assert "w = z   # last" in fmt(ragged.replace("         # last", "    # last"))


def test_a_blank_line_parts_aligned_notes():
    text = "dim e = 2\ninput x[e]\nlonger_name = x   # a\n\ny = x             # b\noutput y\n"
    assert fmt(text) == "dim e = 2\ninput x[e]\nlonger_name = x   # a\n\ny = x   # b\noutput y\n"


def test_notes_align_inside_blocks():
    text = "dim e = 2\n\nblock f(x[e]) {\n  param W[e, e]   # weights\n  y = x * 2       # twice\n  return y\n}\n"
    assert fmt(text) == text


def test_blank_lines_and_comment_lines_stay_as_written():
    text = (
        "# index legend: e embedding\n"
        "#   (a continued legend line)\n"
        "dim e = 2\n"
        "input x[e]\n"
        "\n"
        "# 1) First step. Yields: y.\n"
        "y = x * 2\n"
        "# 2) Second step, no blank line before it.\n"
        "z = y + 1\n"
        "\n"
        "output z\n"
    )
    assert fmt(text) == text
    assert fmt("\n\n" + text.replace("\n\n", "\n\n\n\n") + "\n\n") == text  # runs become one, none at the ends


def test_blocks_are_parted_by_blank_lines():
    squeezed = "dim e = 2\n# leads into f\n# (two lines)\nblock f(x[e]) {\n\n  return x\n\n}\ny = f(x)\n"
    assert fmt(squeezed) == "dim e = 2\n\n# leads into f\n# (two lines)\nblock f(x[e]) {\n  return x\n}\n\ny = f(x)\n"


def test_power_hugs_simple_operands():
    cases = {
        "asqn**0.5": "asqn**0.5",  # as the paper writes it
        "x ** 2": "x**2",
        "x**-2": "x**-2",
        "2**x**3": "2**x**3",
        "(x + 1)**2": "(x + 1) ** 2",
        "x.shape[0]**2": "x.shape[0] ** 2",
        "(-2)**x": "(-2) ** x",
        "(-x)**2": "(-x) ** 2",
        "-x**2": "-x**2",
    }
    for written, canonical in cases.items():
        assert format_expr(parse(f"y = {written}").body[0].value) == canonical, written


def test_detach_keeps_its_spelling():
    """The paper writes `Z.detach()`, the Steerling diagrams `detach(h)`: both are kept."""
    texts = [f"dim e = 2\ninput x[e]\ny = {call} * 2\noutput y\n" for call in ("detach(x)", "x.detach()")]
    assert [fmt(t) for t in texts] == texts
    assert parse(texts[0]) == parse(texts[1])
    assert fmt("dim e = 2\ninput x[e]\ny = (x * 2).detach()\noutput y\n").splitlines()[2] == "y = detach(x * 2)"


def test_numbers_as_a_person_writes_them():
    out = fmt("dim e = 2\ninput x[e]\ny = clamp(x, min=1e-05, max=1.5e+20) * 0.02 + 1e-12\noutput y\n")
    assert "clamp(x, min=1e-5, max=1.5e20) * 0.02 + 1e-12" in out


def _without_layout(s):
    """A statement as if built by hand: no spans, no dim grouping (so fmt falls back to its defaults)."""
    from dataclasses import fields, replace

    from penrose.errors import NOWHERE

    names = {f.name for f in fields(s)}
    changes = {k: NOWHERE for k in ("span", "note_span") if k in names}
    if "grouped" in names:
        changes["grouped"] = False
    if isinstance(s, ir.Block):
        changes["body"] = tuple(_without_layout(b) for b in s.body)
    return replace(s, **changes)


@pytest.mark.parametrize("path", ZOO, ids=lambda p: str(p.relative_to(ROOT / "zoo")))
def test_fmt_is_idempotent_on_the_zoo(path):
    """Formatting a zoo diagram, as written or laid out by the defaults (one dim per line, no blank
    lines but around blocks, no aligned notes), reaches a fixed point in one step and keeps the meaning."""
    d = parse_file(path)
    default = format_diagram(ir.Diagram(tuple(_without_layout(s) for s in d.body)))
    assert not any(line.startswith("dim ") and ", " in line for line in default.splitlines())  # one dim per line
    for variant in (path.read_text(encoding="utf-8"), default):
        once = format_diagram(parse(variant))
        assert parse(once) == d
        assert format_diagram(parse(once)) == once
    assert format_diagram(parse(default)) == default  # the defaults are canonical too


# ---- every comment survives, wherever it is written ---------------------------------------------


def _comments(text: str) -> list[str]:
    """The texts of the comments written in `text` (no '#' inside these tests' strings)."""
    return [line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line]


def keeps_every_comment(text: str) -> str:
    out = fmt(text)
    assert _comments(out) == _comments(text), out  # all of them, in their order
    return out


def test_a_comment_line_between_the_arguments_of_a_call_comes_before_its_statement():
    out = keeps_every_comment("dim e = 2\ninput x[e]\ny = einsum('e,e->e',\n  # the operands\n  x, x)\noutput y\n")
    assert out == "dim e = 2\ninput x[e]\n# the operands\ny = einsum('e,e->e', x, x)\noutput y\n"


def test_a_comment_after_an_argument_of_a_call_broken_over_lines():
    out = keeps_every_comment("dim e = 2\ninput x[e]\n\ny = einsum('e,e->e',  # spec\n  x,  # left\n  x)  # y\noutput y\n")
    assert out == "dim e = 2\ninput x[e]\n\n# spec\n# left\ny = einsum('e,e->e', x, x)   # y\noutput y\n"


def test_a_comment_after_a_blocks_closing_brace_stays_there():
    text = "dim e = 2\nblock f(a[e]) {\n  return tanh(a)\n}  # end of block\ninput x[e]\ny = f(x)\noutput y\n"
    out = keeps_every_comment(text)
    assert "\n}   # end of block\n\ninput x[e]\n" in out


def test_comments_between_block_statements_and_after_the_last_one():
    text = "dim e = 2\nblock f(a[e]) {\n  h = tanh(a)\n  # between\n  g = h * 2\n  return g\n  # after the last\n}\ninput x[e]\ny = f(x)\noutput y\n"
    out = keeps_every_comment(text)
    assert "  h = tanh(a)\n  # between\n  g = h * 2\n  return g\n  # after the last\n}\n" in out


def test_a_comment_at_the_end_of_the_file():
    assert keeps_every_comment("dim e = 2\ninput x[e]\noutput x\n# the end").endswith("output x\n# the end\n")
    assert keeps_every_comment("dim e = 2\ninput x[e]\noutput x  # the end\n").endswith("output x   # the end\n")


def test_comments_inside_the_brackets_of_a_leg_list():
    out = keeps_every_comment("dim t = 2, e = 3\ninput x[t,  # token\n  e]  # embedding\noutput x\n")
    assert out == "dim t = 2, e = 3\n# token\ninput x[t, e]   # embedding\noutput x\n"


def test_comments_inside_a_block_header_broken_over_lines():
    text = "dim e = 2\nblock f(a[e],  # first\n  b[e]) {  # header\n  return a + b\n}\ninput x[e]\ny = f(x, x)\noutput y\n"
    out = keeps_every_comment(text)
    assert "\n# first\nblock f(a[e], b[e]) {   # header\n" in out


def test_comments_inside_a_block_body_statement_broken_over_lines():
    text = "dim e = 2\nblock f(a[e]) {\n  h = einsum('e,e->e',\n    # why\n    a, a)\n  return h\n}\ninput x[e]\ny = f(x)\noutput y\n"
    assert "  # why\n  h = einsum('e,e->e', a, a)\n" in keeps_every_comment(text)


def _with_comments_inside(text: str, where: list[bool]) -> str:
    """`text` with a line break and a comment after some of the commas inside brackets."""
    out, depth, quote, k = [], 0, "", 0
    for ch in text:
        out.append(ch)
        if quote:  # inside a string, or a comment (to the end of its line)
            quote = "" if ch == quote else quote
        elif ch in "'\"#":
            quote = "\n" if ch == "#" else ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth and k < len(where):
            if where[k]:
                out.append(f"  # c{k}\n   ")
            k += 1
    return "".join(out)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([KITCHEN_SINK] + [f.read_text(encoding="utf-8") for f in ZOO[:6]]), st.lists(st.booleans(), min_size=1, max_size=60))
def test_fmt_keeps_every_comment_written_inside_brackets(text, where):
    keeps_every_comment(_with_comments_inside(text, where))


def test_long_sums_print_flat_and_comparisons_keep_their_parentheses():
    from penrose.stack import deep

    text = "dim e = 3\ninput x[e]\ny = " + " + ".join(["x"] * 3000) + " - x\noutput y\n"
    assert deep(fmt)(text) == text  # deep: comparing the IR trees recurses
    assert fmt("dim e = 3\ninput x[e]\ny = where((x < 1) == (x > 2), x, 0)\noutput y\n").count("(x < 1) == (x > 2)") == 1


# ---- numbers keep the author's spelling (issue 23) -----------------------------------------------

ML_SPELLINGS = ["1e-4", "3e-4", "2.5e3", "1e5", "1e-5", "1e-6", "0.02", "0.1", "1.0", "10000", "6e-5", "0.999",
                "5e-2", "1e999", "0.10", "2.50", "1e0", "0.0"]


@pytest.mark.parametrize("number", ML_SPELLINGS)
def test_fmt_keeps_ordinary_ml_spellings(number, tmp_path):
    """`penrose fmt` rewrote 1e-4 as 0.0001 and 1e5 as 100000.0, so `fmt --check` flagged
    ordinary ML code."""
    text = f"dim e = 2\nconst lr = {number}\ninput x[e]\nparam W[e] ~ normal(std={number})\ny = x * {number} + W\noutput y\n"
    assert format_diagram(parse(text)) == text
    path = tmp_path / "ml.pen"
    path.write_text(text)
    assert main(["fmt", "--check", str(path)]) == 0


@pytest.mark.parametrize("written, canonical", [
    ("1E-4", "1e-4"), ("1e+05", "1e5"), ("1e-05", "1e-5"), ("2.5E+3", "2.5e3"), (".5", "0.5"), ("5.", "5.0"),
    ("007", "7"), ("00.5", "0.5"), ("1e00", "1e0"), ("0e0", "0e0"),
])
def test_fmt_makes_numbers_canonical_only_where_spellings_read_alike(written, canonical):
    text = f"dim e = 2\ninput x[e]\ny = x * {written}\noutput y\n"
    out = format_diagram(parse(text))
    assert out == text.replace(written, canonical)
    assert parse(out) == parse(text) and format_diagram(parse(out)) == out


def test_fmt_numbers_without_a_source_are_written_shortest():
    from penrose.fmt import format_expr as fx

    assert fx(ir.Number(1e-5)) == "1e-5" and fx(ir.Number(0.0001)) == "0.0001" and fx(ir.Number(3)) == "3"


def test_a_long_chain_of_powers_formats_in_linear_time():
    """Regression: `x ** 1 ** 1 ...` asked at every level whether the whole rest of the chain
    was simple, so 4,000 powers took 7 s to format (16 s to compile, whose source shows it)."""
    import time

    for n in (10, 5_000):
        d = parse("dim e = 2\ninput x[e]\ny = x" + " ** 1" * n + "\noutput y\n")
        start = time.perf_counter()
        text = format_diagram(d)
        assert time.perf_counter() - start < 2
        assert "y = x" + "**1" * n + "\n" in text and parse(text) == d
