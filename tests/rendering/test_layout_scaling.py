"""Layouts that scale: tied weights drawn once per use, long figures folded into rows, block
views and unfolded blocks that stay inside their frame.

A residual chain that reuses one weight (`h{i} = relu(einsum('td,de->te', h{i-1}, W)) + h{i-1}`)
took 0.3 s to lay out at 20 steps, 9 s at 30 and more than 60 s from 50 steps on (one W node
branching to a copy per step); it now lays out in well under a second at 100 steps and in a
few seconds at 1,000 (`python bench/render.py --chain` prints the times).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from penrose.checker import check
from penrose.parser import parse, parse_file
from penrose.rendering import dot_source, render
from penrose.rendering.crossings import layout
from penrose.rendering.figure import FOLD_NODES, TIE_READS, Options, build_figure
from penrose.rendering.testing import figure_structure

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")


def _bench_render():
    """bench/render.py, whose chain programs the benchmark times: the tests draw the same ones."""
    spec = importlib.util.spec_from_file_location("bench_render", Path(__file__).resolve().parents[2] / "bench" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_BENCH = _bench_render()
tied_chain, plain_chain = _BENCH.tied_chain, _BENCH.plain_chain


def uses_of_one_weight(n: int) -> str:
    """W read by n contractions side by side (not a chain)."""
    lines = ["dim t = 4, d = 8", "input x[t, d]", "param W[d, d]"]
    lines += [f"y{i} = sigmoid(einsum('td,de->te', x, W))" for i in range(n)]
    return "\n".join(lines + ["output " + ", ".join(f"y{i}" for i in range(n))]) + "\n"


# ---- tied weights ------------------------------------------------------------------------------


def test_a_weight_used_a_few_times_still_branches_off_one_node():
    s = figure_structure(render(uses_of_one_weight(TIE_READS), copies=True))
    branches = [w for w in s.edges if w.style == "branch" and w.tail == "W"]
    assert len(branches) == TIE_READS
    assert not any("tied" in line for line in s.header)
    # drawn as the paper branches (the default): one W, one wire per use
    s = figure_structure(render(uses_of_one_weight(TIE_READS)))
    assert [n.id for n in s.nodes.values() if n.text == "W"] == ["W"]
    assert len([1 for t, h, legs in s.wires() if t == "x" and h == "W"]) == 1  # one bundle of TIE_READS d legs
    assert not any("tied" in line for line in s.header)


def test_a_weight_used_by_many_statements_is_drawn_once_per_use_and_said_to_be_one_tensor():
    n = TIE_READS + 3
    text = uses_of_one_weight(n)
    s = figure_structure(render(text))
    ws = [node for node in s.nodes.values() if node.kind == "param" and node.text == "W"]
    assert len(ws) == n
    assert not [w for w in s.edges if w.style == "branch"]  # no wire back to one W
    assert any(f"W ({n}×)" in line and line.startswith("tied: ") and "one tensor" in line for line in s.header)
    dot = dot_source(text)
    assert len(re.findall(r'class="pen-param"', dot)) == n
    assert all('dashed' in line for line in dot.splitlines() if 'class="pen-param"' in line)


def test_small_figures_are_unchanged_by_ties_and_rows():
    f = build_figure(check(parse(tied_chain(3))), options=Options(copies=True))
    assert f.rows == 1 and f.notes == []
    assert len([e for e in f.edges if e.kind == "branch"]) == 3
    f = build_figure(check(parse(tied_chain(3))))  # the paper's branching: one W, three wires from it
    assert f.rows == 1 and f.notes == [] and not [e for e in f.edges if e.kind == "branch"]
    assert [n.id for n in f.nodes if n.text == "W"] == ["W"] and len([e for e in f.edges if e.tail == "W" or e.head == "W"]) >= 3


# ---- long chains -------------------------------------------------------------------------------


# The time these take (100 tied steps under 10 s, 1,000 under 60 s, about linear growth):
# python bench/render.py --chain


def test_a_100_step_tied_residual_chain_renders():
    svg = render(tied_chain(100))
    s = figure_structure(svg)
    assert "h100" in s.nodes and s.nodes["h100"].kind == "output"
    assert [w for w in s.edges if w.style == "residual"]  # f(x) + x: the stream is a spine


def test_a_1000_step_tied_residual_chain_renders():
    svg = render(tied_chain(1000))
    assert "h1000" in figure_structure(svg).nodes


def test_a_long_chain_is_folded_into_rows_read_top_to_bottom():
    text = tied_chain(120)
    f = build_figure(check(parse(text)))
    assert len(f.nodes) > FOLD_NODES and f.rows > 1
    assert any("folded into" in line for line in f.notes)
    s = figure_structure(render(text))
    # each row starts with the value the row above ended with, under the same name
    continued = sorted((n for n in s.nodes.values() if "_row" in n.id and n.kind == "value"), key=lambda n: n.box[1])
    assert len(continued) == f.rows - 1
    firsts = [int(re.match(r"h(\d+)", n.text).group(1)) for n in continued]
    assert firsts == sorted(firsts)  # top to bottom in reading order
    assert s.nodes["h0"].box[1] < continued[0].box[1] < s.nodes["h120"].box[1]
    # every leg keeps its label (Graphviz drops edge labels of packed layouts: they are
    # written on the wire instead)
    assert sum(1 for n in s.nodes.values() if n.kind == "leg" and n.text == "t, e") >= 120


def test_a_plain_chain_folds_too():
    text = plain_chain(600)
    f = build_figure(check(parse(text)))
    assert f.rows > 1
    assert "h600" in figure_structure(render(text)).nodes


def test_folding_can_be_turned_off():
    c = check(parse(tied_chain(80)))
    assert build_figure(c, "diagram", Options(fold=False)).rows == 1
    assert build_figure(c, "diagram").rows > 1


def test_top_down_rows_are_columns_left_to_right():
    text = tied_chain(100)
    s = figure_structure(render(text, direction="TB"))
    continued = sorted((n for n in s.nodes.values() if "_row" in n.id and n.kind == "value"), key=lambda n: n.box[0])
    firsts = [int(re.match(r"h(\d+)", n.text).group(1)) for n in continued]
    assert firsts and firsts == sorted(firsts)


# ---- block views and unfolded blocks -----------------------------------------------------------

STEERLING = "zoo/steerling/steerling.pen"


def test_a_long_block_view_is_folded_to_a_sensible_width():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / STEERLING
    c = check(parse_file(path))
    one_row = layout(_dot(c, "block:attention", fold=False))
    folded = layout(dot_source(c, view="block:attention"))
    assert folded.width < 0.8 * one_row.width, (folded.width, one_row.width)
    assert folded.width < 1200
    # short blocks keep one row
    assert build_figure(c, "block:mlp").rows == 1


def _dot(c, view, fold=True):
    from penrose.rendering.figure import to_dot

    return to_dot(build_figure(c, view, Options(fold=fold)))


def _clusters(text):
    import json
    import subprocess

    data = json.loads(subprocess.run(["dot", "-Tjson"], input=text.encode(), capture_output=True, check=True).stdout)
    objs = data["objects"]
    names = {o["_gvid"]: o["name"] for o in objs if "nodes" not in o}
    frames = {}
    for o in objs:
        if "nodes" in o and o["name"].startswith("cluster"):
            x0, y0, x1, y1 = (float(v) for v in o["bb"].split(","))
            frames[o["name"]] = ((x0, y0, x1, y1), {names[i] for i in o["nodes"] if i in names})
    return frames


def test_unfolded_block_wires_stay_inside_their_frame():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "zoo/steerling/transformer_layer.pen"
    text = dot_source(str(path), unfold=True)
    frames = _clusters(text)
    lay = layout(text)
    assert frames
    for name, ((x0, y0, x1, y1), members) in frames.items():
        for e in lay.edges:
            if e.tail in members and e.head in members:
                outside = [p for p in e.points if not (x0 - 1 <= p[0] <= x1 + 1 and y0 - 1 <= p[1] <= y1 + 1)]
                assert not outside, f"{e.tail}->{e.head} leaves {name}"
    # the layer's argument enters its frame once, and its residual is the blue spine
    s = figure_structure(render(str(path), unfold=True))
    assert [w for w in s.edges if w.style == "residual" and w.tail == "layer.x"]
