"""Regression cases for the figure defects of issue 36, each measured on the drawn SVG by the
figure report (`penrose.rendering.measure`): labels over their node, labels on wires, names drawn
as subscripts that were not meant as one, where boxes that did not say which operand is which,
tied block calls that looked unrelated, and the new users' diagrams of bench/figures/."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from penrose.rendering import dot_source, render
from penrose.rendering.crossings import fewest_crossings, graph_of, layout, planar
from penrose.rendering.measure import measure
from penrose.rendering.testing import figure_structure

ROOT = Path(__file__).resolve().parents[2]
NEW_USERS = ROOT / "bench" / "figures"

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")


def sub_texts(svg: str) -> list:
    """The texts the SVG draws as subscripts, with their font size."""
    return re.findall(r'baseline-shift="sub" font-size="([\d.]+)">([^<]*)<', svg)


def test_underscores_are_drawn_as_written_unless_in_the_subscript_form():
    svg = render("dim t = 3, c = 2, v = 5, e = 4\ninput input_ids[t] : int\ninput c_true[t, c]\nparam W_q[v, e]\n"
                 "h = gather(W_q, input_ids)\nh_squared_norm = einsum('te,te->t', h, h)\ny = einsum('t,tc->c', h_squared_norm, c_true)\n"
                 "output y, h_squared_norm")
    assert [text for _, text in sub_texts(svg)] == ["q"]  # W_q only: one letter, _, a short index
    assert ">input_ids<" in svg and ">c_true<" in svg and ">h_squared_norm<" in svg
    size, _ = sub_texts(svg)[0]
    assert float(size) < 13  # smaller than the name (Graphviz's SVG would write it full size)


def test_the_operations_table_draws_no_label_over_its_node():
    # the paper's section 2.2: squared_norm, slice_sum ... ran over their ovals
    r = measure(render(ROOT / "zoo" / "paper" / "operations.pen"))
    assert r.overflows == [] and r.labels_crossed == [] and r.clipped == []


def test_a_bundles_label_keeps_clear_of_its_parallel_lines():
    # 'h, t, p' touched the outermost of the bundle's lines
    r = measure(render(ROOT / "zoo" / "paper" / "self_attention.pen", show_sizes=True))
    assert r.labels_crossed == [] and r.crossings == []


def test_a_caption_is_beside_its_node_and_no_wire_crosses_it():
    # 'slice of W', placed by Graphviz as an xlabel, had the wire into W running through it
    svg = render(ROOT / "zoo" / "linear.pen")
    r = measure(svg)
    assert r.labels_crossed == [] and r.overlaps == []
    s = figure_structure(svg)
    assert "slice of W" in s.nodes["W"].text  # the caption belongs to its node


def test_a_where_box_says_which_operand_is_which():
    text = (NEW_USERS / "gated_where.pen").read_text()
    svg = render(text)
    s = figure_structure(svg)
    where = next(n for n in s.nodes.values() if "where" in n.text.split())
    assert all(word in where.text.split() for word in ("mask", "true", "false"))
    dot = dot_source(text)
    assert re.findall(r'PORT="(\w+)"', dot) == ["mask", "true", "false"]
    wires = re.findall(r'"(\w+)" -> "where":(\w+):w', dot)  # each operand's wire enters at its port
    assert sorted(wires) == [("fallback", "false"), ("keep", "mask"), ("sigmoid", "true")]
    assert measure(svg).labels_crossed == []
    # a plain number is written at its port
    scalar = figure_structure(render("dim e = 2\ninput x[e]\ninput m[e] : bool\ny = where(m, x, -inf)\noutput y"))
    assert "false = −∞" in next(n.text for n in scalar.nodes.values() if "where" in n.text.split())


def test_a_block_called_twice_with_the_same_weights_is_marked_shared():
    svg = render((NEW_USERS / "tied_mlp.pen").read_text())
    s = figure_structure(svg)
    blocks = sorted(n.text for n in s.of_kind("block"))
    assert blocks == ["mlp shared weights, call 1 of 2", "mlp shared weights, call 2 of 2"]
    assert any("shared weights: mlp (2×)" in h for h in s.header)
    # two instances (`as`) are two sets of weights: nothing is shared
    apart = figure_structure(render((NEW_USERS / "tied_mlp.pen").read_text().replace("h = mlp(x)", "h = mlp(x) as first")))
    assert not any("shared" in n.text for n in apart.of_kind("block"))


def test_a_where_boxs_ports_follow_the_wires_into_them():
    # Steerling's compose block: the wires into a where's ports crossed (ports in a fixed order)
    r = measure(render(ROOT / "zoo" / "steerling" / "concept_module.pen", view="block:compose"))
    assert r.crossings == [] and r.labels_crossed == []


def test_a_folded_block_view_keeps_every_node_inside_the_page():
    svg = render(NEW_USERS / "gated_mlp_block.pen", view="block:layer")
    r = measure(svg)
    assert "folded into" in svg  # a long block: rows
    assert r.clipped == [] and r.overflows == [] and r.labels_crossed == [] and r.through == []


# a planar figure is drawn without crossings (the retention block's one crossing, once allowed
# here, is gone: branching legs and the untangling's moves); a non-planar one with its fewest
# (`crossings.fewest_crossings`, free of the page's edge: the switch mixture of experts' 1)


@pytest.mark.parametrize("path", sorted(NEW_USERS.glob("*.pen")), ids=lambda p: p.stem)
def test_new_users_diagrams_have_nothing_to_fix(path):
    views = ["diagram"] + [f"block:{name}" for name in re.findall(r"^block (\w+)", path.read_text(), re.M)]
    for view in views:
        r = measure(render(path, view=view))
        assert (r.labels_crossed, r.overflows, r.clipped, r.through, r.overlaps) == ([], [], [], [], []), (view, str(r))
        if r.crossings:
            lay = layout(dot_source(path, view=view))
            assert not planar(lay), (view, str(r))
            assert len(r.crossings) <= fewest_crossings(graph_of(lay), (), 2), (view, str(r))
