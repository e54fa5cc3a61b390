"""The figures, equations and readings of einops' rearrange, reduce and repeat, of select and
slice, and of named consts.

What is drawn: a leg that a pattern splits runs into a small split triangle that its axes leave,
legs that it merges run into a merge triangle whose one wire carries the merged dim; a pure
permutation is the legs rewired (nothing drawn); reduce and repeat are labelled boxes; select
ends the picked leg in a basis vector e₀, slice runs it through a selection matrix onto the
smaller dim; a const is written by its name, never its value."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import penrose
from penrose.attrs import BinOp, Const, Ref
from penrose.checked import TType, V
from penrose.rendering import dot_source, render
from penrose.rendering.equations import latex_to_svg, to_latex, value_entry
from penrose.rendering.explain import statement_latex, statement_readings, statements
from penrose.rendering.figure import FIGURE, _scalar_text
from penrose.rendering.testing import figure_structure

ROOT = Path(__file__).resolve().parents[2]

needs_dot = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

NEW_OPS = """\
# index legend: t token, h head, d head width, hd heads and widths, k copy, e embedding, s short
dim t = 6, h = 2, d = 4, hd = 8, k = 3, e = 5, s = 4
input x[t, hd]
input z[t, e]
const alpha = 8
const scale = alpha / d
a = rearrange(x, 't (h d) -> h t d')
b = reduce(x, 't (h d) -> h', 'max')
c = repeat(a, 'h t d -> h t k d')
p = rearrange(a, 'h t d -> t h d')
f = rearrange(a, 'h t d -> t (h d)')
g = select(z, t, 0)
u = slice(z, t, 1, k)
w = slice(z, t, 1, 4, into=s)
y = z * scale
y2 = z * alpha + 1
output a, b, c, p, f, g, u, w, y, y2
"""


@pytest.fixture(scope="module")
def checked():
    return penrose.check(penrose.parse(NEW_OPS))


@pytest.fixture(scope="module")
def by_target(checked):
    return {s.stmt.targets[0]: s for s in statements(checked)}


@pytest.fixture(scope="module")
def figure(checked):
    if not shutil.which("dot"):
        pytest.skip("Graphviz 'dot' is not installed")
    return figure_structure(render(checked))


def _node(fig, kind, text=None):
    found = [n for n in fig.nodes.values() if n.kind == kind and (text is None or n.text == text)]
    assert found, f"no {kind} node {text!r}: {[(n.kind, n.text) for n in fig.nodes.values()]}"
    return found


def _into(fig, node_id):
    return sorted(leg for w in fig.edges if w.head == node_id and w.style == "wire" for leg in w.legs)


def _out_of(fig, node_id):
    return sorted(leg for w in fig.edges if w.tail == node_id and w.style == "wire" for leg in w.legs)


# ---- figures -----------------------------------------------------------------------------------


@needs_dot
def test_a_split_leg_runs_into_a_split_node_its_axes_leave(figure):
    # a = rearrange(x, 't (h d) -> h t d'): x —hd→ split —h, d→ a, and t straight from x to a
    split = next(n for n in _node(figure, "split") if ("split", "a", ("h", "d")) in [(w.tail, w.head, w.legs) for w in figure.edges])
    assert ("x", split.id, ("hd",)) in figure.wires()
    assert ("x", "a", ("t",)) in figure.wires()
    assert _out_of(figure, split.id) == ["d", "h"]


@needs_dot
def test_merged_legs_run_into_a_merge_node_whose_wire_is_the_merged_dim(figure):
    # f = rearrange(a, 'h t d -> t (h d)'): a —h, d→ merge —hd→ f
    (merge,) = _node(figure, "merge")
    assert _into(figure, merge.id) == ["d", "h"]
    assert (merge.id, "f", ("hd",)) in figure.wires()
    assert ("a", "f", ("t",)) in figure.wires()


@needs_dot
def test_a_permutation_is_only_rewired_legs(figure):
    # p = rearrange(a, 'h t d -> t h d'): the legs run straight from a to p, no node between
    assert ("a", "p", ("t", "h", "d")) in figure.wires()
    assert not any(w.head == "p" and w.tail != "a" for w in figure.edges if w.style == "wire")


@needs_dot
def test_reduce_is_a_box_naming_the_reduction_and_the_reduced_legs(figure):
    (box,) = _node(figure, "op", "max over t, d")
    assert _into(figure, box.id) == ["d", "h", "t"]  # hd split first, then every axis into the box
    assert (box.id, "b", ("h",)) in figure.wires()


@needs_dot
def test_repeat_is_a_box_the_new_leg_leaves(figure):
    (box,) = _node(figure, "op", "repeat copy along k")
    assert ("a", box.id, ("h", "t", "d")) in figure.wires()
    assert (box.id, "c", ("h", "t", "k", "d")) in figure.wires()


@needs_dot
def test_select_ends_the_picked_leg_in_a_basis_vector(figure):
    (e0,) = _node(figure, "basis", "e₀")
    assert ("z", e0.id, ("t",)) in figure.wires()  # z —t— e₀: the contraction that picks index 0
    assert ("z", "g", ("e",)) in figure.wires()  # the other leg is the result's


@needs_dot
def test_slice_runs_the_leg_through_a_selection_matrix_onto_the_smaller_dim(figure):
    (sk,) = _node(figure, "projector", "slice 1…3")
    assert ("z", sk.id, ("t",)) in figure.wires() and (sk.id, "u", ("k",)) in figure.wires()
    (ss,) = _node(figure, "projector", "slice 1…4")
    assert (ss.id, "w", ("s",)) in figure.wires()


@needs_dot
def test_a_const_is_drawn_by_its_name_not_its_value(figure):
    texts = [n.text for n in figure.nodes.values()]
    assert "× scale" in texts and "× alpha" in texts
    assert not any(t in ("× 2.0", "× 2", "× 8") for t in texts), texts


@needs_dot
def test_every_new_statement_view_draws(checked):
    for n, s in enumerate(statements(checked), 1):
        fig = figure_structure(render(checked, view=f"statement:{n}"))
        assert s.stmt.targets[0] in fig.kinds()
    one = figure_structure(render(checked, view="statement:6"))  # g = select(z, t, 0)
    assert [n.text for n in one.of_kind("basis")] == ["e₀"]


def test_triangles_face_the_one_wire_in_both_directions(checked):
    lr, tb = dot_source(checked), dot_source(checked, direction="TB")
    merge_lr = next(l for l in lr.splitlines() if l.lstrip().startswith('"merge"'))
    split_lr = next(l for l in lr.splitlines() if l.lstrip().startswith('"split"'))
    assert "orientation=-90" in merge_lr and "orientation=90" in split_lr
    merge_tb = next(l for l in tb.splitlines() if l.lstrip().startswith('"merge"'))
    assert "orientation=180" in merge_tb


def test_labels_of_the_table():
    c = penrose.check(penrose.parse(NEW_OPS))
    values = {s.stmt.targets[0]: s.value for s in statements(c)}
    assert FIGURE["reduce"].label(values["b"]) == ["max", "over t, d"]
    assert FIGURE["repeat"].label(values["c"]) == ["repeat", "copy along k"]
    assert FIGURE["rearrange"].label(values["a"]) == ["rearrange", "t (h d) -> h t d"]
    assert FIGURE["select"].label(values["g"]) == ["e₀"]
    assert FIGURE["slice"].label(values["w"]) == ["slice", "1…4"]


# ---- equations ---------------------------------------------------------------------------------


EQUATIONS = {
    "a": r"a_{htd} = x_{t,(h\,d)}",
    "b": r"b_{h} = \max_{t,d}\left(x_{t,(h\,d)}\right)",
    "c": r"c_{htkd} = a_{htd}",
    "p": r"p_{thd} = a_{htd}",
    "f": r"f_{t,(h\,d)} = a_{htd}",
    "g": r"g_{e} = z_{0,e} = \sum_{t} z_{te} \, \delta_{t,0}",
    "u": r"u_{ke} = z_{(1 + k),e} = \sum_{t} z_{te} \, \delta_{t,(1 + k)}",
    "w": r"w_{se} = z_{(1 + s),e} = \sum_{t} z_{te} \, \delta_{t,(1 + s)}",
    "y": r"y_{te} = z_{te} \, \mathrm{scale}",
    "y2": r"y_{2,te} = z_{te} \, \alpha + 1",
}


@pytest.mark.parametrize("target", sorted(EQUATIONS))
def test_equation(checked, by_target, target):
    latex = statement_latex(checked, by_target[target])
    assert latex == EQUATIONS[target]
    assert latex_to_svg(latex).startswith("<?xml")  # mathtext draws it


def test_reductions_and_merges_inside_expressions():
    c = penrose.check(penrose.parse("""\
dim t = 6, h = 2, d = 4, hd = 8
input x[t, hd]
input a[h, t, d]
s = reduce(x, 't (h d) -> h', 'sum')
m = reduce(x, 't (h d) -> h', 'mean') + reduce(x, 't (h d) -> h', 'prod')
r = relu(rearrange(a, 'h t d -> t (h d)'))
q = rearrange(a, 'h t d -> t (h d)') + x
output s, m, r, q
"""))
    latex = {s.stmt.targets[0]: statement_latex(c, s) for s in statements(c)}
    assert latex["s"] == r"s_{h} = \sum_{t,d} x_{t,(h\,d)}"
    assert latex["m"] == r"m_{h} = \mathrm{mean}_{t,d}\left(x_{t,(h\,d)}\right) + \prod_{t,d}\left(x_{t,(h\,d)}\right)"
    assert latex["r"] == r"r_{t,(h\,d)} = \mathrm{ReLU}\left(a_{htd}\right)"  # the group through the element-wise step
    # a merged index from outside: split back into h = ⌊hd / n_d⌋ and d = hd mod n_d
    assert latex["q"] == (r"q_{t,\mathrm{hd}} = \left(a_{\left\lfloor{\frac{\mathrm{hd}}{n_{d}}}\right\rfloor,t,"
                          r"\mathrm{hd} \bmod n_{d}}\right) + x_{t,\mathrm{hd}}")
    for text in latex.values():
        assert latex_to_svg(text).startswith("<?xml")


def test_a_const_built_by_hand_is_its_name_and_greek_names_are_letters():
    x = V("ref", attrs=Ref("x", "input", 0), type=TType(("e",), (0,)))
    for name, tex in (("alpha", r"\alpha"), ("beta", r"\beta"), ("lamda", r"\lambda"), ("scale", r"\mathrm{scale}")):
        const = V("const", attrs=Const(value=8, name=name))
        prod = V("binop", (x, const), BinOp(op="*", align=((0,), None)), TType(("e",), (0,)))
        assert to_latex(value_entry(prod, ("e",))) == rf"x_{{e}} \, {tex}"
        assert _scalar_text(const) == name  # the figure's label: the name, not 8
        assert "8" not in to_latex(value_entry(prod, ("e",)))


# ---- readings ----------------------------------------------------------------------------------


def _text(c, s):
    return " ".join(f"{r.title}: {r.text}" for r in statement_readings(c, s))


def test_readings(checked, by_target):
    read = {t: _text(checked, s) for t, s in by_target.items()}
    assert "Regroup the legs of x: split leg hd into h and d" in read["a"]
    assert "the maximum over t (token) and d (head width) of x" in read["b"]
    assert "Copy a along the new leg k (copy)" in read["c"]
    assert read["p"].startswith("Permutation: Reorder the legs of a from (h, t, d) to (t, h, d)")
    assert "merge h and d into one leg hd" in read["f"]
    assert "Pick index 0 of leg t of z (a contraction with the basis vector e₀): the leg t disappears" in read["g"]
    assert "Keep indices 1 to 3 of leg t of z as leg k" in read["u"]
    assert "Keep indices 1 to 4 of leg t of z as leg s" in read["w"]
    assert "Multiply every entry of z by scale." in read["y"]
    assert "by alpha" in read["y2"] and "by 8" not in read["y2"]


def test_reading_kinds(checked, by_target):
    kinds = {t: [r.kind for r in statement_readings(checked, s)] for t, s in by_target.items()}
    assert kinds["a"] == ["reshape"] and kinds["b"] == ["reduce"] and kinds["c"] == ["repeat"]
    assert kinds["g"] == ["select"] and kinds["u"] == ["slice"]


# ---- through the command line ------------------------------------------------------------------


@needs_dot
def test_the_cli_draws_them(tmp_path):
    pen = tmp_path / "new_ops.pen"
    pen.write_text(NEW_OPS)
    out = tmp_path / "new_ops.svg"
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "render", str(pen), "-o", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    fig = figure_structure(out.read_text())
    texts = [n.text for n in fig.nodes.values()]
    assert "e₀" in texts and "max over t, d" in texts and "× scale" in texts and "slice 1…3" in texts
    assert {"merge", "split"} <= {n.kind for n in fig.nodes.values()}
    assert any(w.legs == ("hd",) for w in fig.edges)
