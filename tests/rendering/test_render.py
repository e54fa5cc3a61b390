"""Figures: golden tests on their structure (tensors, wires, labels parsed back from the SVG),
determinism, views, options, equations and readings, and bad input."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import penrose
from penrose.errors import PenroseCheckError, PenroseError, PenroseRenderError
from penrose.rendering import dot_source, render, render_file
from penrose.rendering.explain import statement_latex, statement_readings, statements
from penrose.rendering.figure import index_legend
from penrose.rendering.measure import measure
from penrose.rendering.testing import crossings, figure_structure, overlaps
from sources import ATTENTION

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "zoo" / "paper"

pytestmark = pytest.mark.skipif(not __import__("shutil").which("dot"), reason="Graphviz 'dot' is not installed")


LINEAR = """\
# index legend: j input feature, i output unit
dim j = 8, i = 3
input x[j]
param W[i, j]
y = sigma(einsum('j,ij->i', x, W))
output y
"""

# a residual stack: a repeated block with a residual update inside, as in a transformer
RESIDUAL = """\
# index legend: t token, e embedding, f hidden
dim t = 4, e = 8, f = 16
input Z[t, e]
param W_out[e, e]
block layer(x[t, e]) {
  param W1[e, f]
  param W2[f, e]
  h = layernorm(x, e)
  h = relu(einsum('te,ef->tf', h, W1))
  h = einsum('tf,fe->te', h, W2)
  return x + h
}
# 1) Four layers, each with its own weights.
Z = layer(Z) repeat 4 as layers
# 2) A residual update outside the block, and a mask.
h = dropout(einsum('te,ef->tf', Z, W_out), p=0.1)
Z = Z + h
y = topk(sigmoid(Z), e, k=2)
output y
"""


def structure(text, **kw):
    return figure_structure(render(text, **kw))


# ---- the paper's visual language ---------------------------------------------------------------


def test_linear_model_is_the_papers_figure():
    # x (grey) and W (white) joined by the contracted leg j; i runs through the activation box
    # into the result, which is marked
    s = structure(LINEAR)
    assert s.kinds() == {"x": "input", "W": "param", "y": "output"}
    boxes = s.of_kind("op")
    assert [b.text for b in boxes] == ["sigmoid"]
    sig = boxes[0].id
    assert s.wires() == sorted([("W", sig, ("i",)), ("x", "W", ("j",)), (sig, "y", ("i",))])
    assert s.header[0] == "diagram"  # the title: a diagram from text has no file name


def test_self_attention_draws_z_once_its_legs_branching():
    # the paper: "copying a tensor can be expressed by branching all its legs": one Z, whose d
    # leg branches to W_q, W_k and W_v (no copies, no copy wires)
    s = structure(ATTENTION)
    kinds = s.kinds()
    assert [n for n, k in kinds.items() if k == "input"] == ["Z"]
    assert not [n for n in kinds if "copy" in n] and not [w for w in s.edges if w.style == "branch"]
    wires = s.wires()
    assert sorted(h for t, h, legs in wires if t == "Z" and legs == ("d",)) == ["W_k", "W_q", "W_v"]
    assert ("W_q", "W_k", ("e",)) in wires
    assert measure(render(ATTENTION)).copies == {}


def test_self_attention_with_copies_branches_z_into_three_copies():
    s = structure(ATTENTION, copies=True)
    kinds = s.kinds()
    copies = [n for n in kinds if n.startswith("Z_copy")]
    assert len(copies) == 3 and all(kinds[c] == "input" for c in copies)
    branches = [w for w in s.edges if w.style == "branch"]
    assert sorted((w.tail, w.head) for w in branches) == sorted(("Z", c) for c in copies)
    wires = s.wires()
    # q·k is the wire between the two weight matrices over e (the Penrose picture of the logits)
    assert ("W_q", "W_k", ("e",)) in wires
    # each copy meets its weight over d
    assert sum(1 for t, h, legs in wires if t.startswith("Z_copy") and h.startswith("W_") and legs == ("d",)) == 3
    # scaling and softmax are boxes on the t and p wires; the output keeps t (from softmax) and e
    ops = {n.text: n.id for n in s.of_kind("op")}
    assert set(ops) == {"2) ÷ √e", "3) softmax over p"}
    softmax = ops["3) softmax over p"]
    assert (ops["2) ÷ √e"], softmax, ("t", "p")) in wires
    assert sorted(legs for t, h, legs in wires if h == "h") == [("e",), ("t",)]
    assert (softmax, "h", ("t",)) in wires


def test_self_attention_has_no_crossings_or_overlaps():
    s = structure(ATTENTION)
    assert crossings(s) == []
    assert overlaps(s) == []


def test_step_captions_are_numbered_in_the_title_and_on_the_figure():
    s = structure(ATTENTION)
    header = " ".join(s.header)
    for n in (1, 2, 3, 4):
        assert f"{n})" in header
    assert "Affinity of each token embedding Z" in header
    assert "t query token" in header  # the index legend
    badges = {w.badge for w in s.edges if w.badge} | {n.text.split(")")[0] + ")" for n in s.nodes.values() if n.text[:1].isdigit()}
    assert {"1)", "2)", "3)", "4)"} <= badges


def test_display_label_sits_next_to_the_tensor():
    s = structure(ATTENTION)
    assert "token embeddings Z" in s.nodes["Z"].text


def test_residual_stream_is_drawn_as_a_spine():
    s = structure(RESIDUAL)
    residual = [w for w in s.edges if w.style == "residual"]
    assert residual, "the residual update Z = Z + h must be drawn as the residual spine"
    # the stream runs from the block's output into the + node and on to the named value Z
    plus = [n.id for n in s.of_kind("arith") if n.text == "+"]
    assert any(w.head in plus and w.legs == ("t", "e") for w in residual)


def test_non_residual_sum_is_not_a_spine():
    s = structure("dim e = 2\ninput a[e]\ninput b[e]\nc = a + b\noutput c")
    assert not [w for w in s.edges if w.style == "residual"]


def test_repeated_block_folds_into_one_box_and_unfolds_on_request():
    s = structure(RESIDUAL)
    blocks = s.of_kind("block")
    assert [b.text for b in blocks] == ["1) layers: layer ×4"]
    assert "W1" not in s.nodes
    u = structure(RESIDUAL, unfold=True)
    assert not u.of_kind("block")
    assert {"layers.W1", "layers.W2"} <= set(u.nodes)
    # the unfolded copy sits in a cluster labelled with its block and repeat count (a cluster's
    # label is neither a header line nor a node, so read it from the cluster's own <g>)
    clusters = re.findall(r'<g id="[^"]*clust\d+" class="cluster[^"]*">(.*?)</g>', render(RESIDUAL, unfold=True), re.S)
    labels = [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in clusters]
    assert any("layers: block layer ×4 (one copy shown)" in label for label in labels), labels
    svg = render(RESIDUAL, unfold=True)
    assert "layers: block layer ×4 (one copy shown)" in svg
    # the residual update inside the block is a spine too
    assert [w for w in u.edges if w.style == "residual"]


def test_block_view_draws_the_body_with_its_arguments_as_inputs():
    s = structure(RESIDUAL, view="block:layer")
    kinds = s.kinds()
    assert kinds["x"] == "formal" and kinds["W1"] == "param" and kinds["out"] == "output"
    assert {n.text for n in s.of_kind("op")} == {"layer norm over e", "ReLU"}
    assert [w for w in s.edges if w.style == "residual"]


def test_statement_view_draws_one_statement():
    s = structure(ATTENTION, view="statement:4")  # l = einsum(...) / sqrt(e)
    assert s.kinds() == {"q": "value", "k": "value", "l": "output"}
    assert ("q", "k", ("e",)) in s.wires()
    assert s.title.startswith("(4) l = einsum('te,pe->tp', q, k) / sqrt(e)")


def test_non_linear_operations_are_labelled_boxes():
    s = structure(RESIDUAL)
    texts = {n.text for n in s.of_kind("op")}
    assert {"2) dropout p=0.1", "sigmoid", "top-k k=2 over e"} <= texts  # 2) marks the step


def test_masks_and_shared_batch_legs():
    text = """\
dim t = 3, p = 3, k = 2, r = 2
input l[t, p]
input c[k]
param W[k, r, t]
M = where(causal(t, p), 0, -inf)
m = l + M
h = einsum('k,krt->krt', c, W)
g = einsum('krt,krt->kr', h, W)
output m, g
"""
    s = structure(text)
    assert {n.text for n in s.of_kind("mask")} == {"causal mask p ≤ t"}
    where = next(n.text for n in s.of_kind("op") if "where" in n.text.split())
    assert "mask" in where and "true = 0" in where and "false = −∞" in where  # each operand named at its port
    # k and r are shared by both operands and the result: they meet at black dots
    assert len(s.of_kind("junction")) >= 2


def test_sum_over_a_leg_of_one_tensor_ends_in_sigma():
    s = structure("dim i = 2, k = 3\ninput A[i, k]\nh = einsum('ik->i', A)\noutput h")
    sums = s.of_kind("sum")
    assert len(sums) == 1
    assert ("A", sums[0].id, ("k",)) in s.wires()


def test_scalar_results_keep_a_node():
    s = structure("dim i = 3\ninput a[i]\ninput b[i]\nh = einsum('i,i->', a, b)\noutput h")
    assert s.kinds()["h"] == "output"
    assert len(s.of_kind("junction")) == 1  # the closed contraction's wire runs through a dot


def test_tied_weights_branch_instead_of_a_long_wire():
    text = """\
dim t = 3, v = 5, e = 2
input ids[t] : int
param E[v, e]
x = gather(E, ids)
logits = einsum('te,ve->tv', x, E)
output logits
"""
    s = structure(text, copies=True)
    assert "E_copy" in s.nodes
    assert [(w.tail, w.head) for w in s.edges if w.style == "branch"] == [("E", "E_copy")]
    # drawn as the paper branches: E once; the gathered rows' e leg runs back into it (x·E)
    s = structure(text)
    assert [n.id for n in s.nodes.values() if n.text == "E"] == ["E"] and "E_copy" not in s.nodes
    assert {("gather", "E", ("e",)), ("E", "logits", ("v",))} <= set(s.wires())


def test_a_tensor_one_contraction_reads_twice_keeps_its_copies():
    # x·x: drawn once, its legs would run into itself; the copies are the notation's
    s = structure("dim i = 3\ninput x[i]\ny = einsum('i,i->', x, x)\noutput y")
    assert [n.kind for n in s.nodes.values() if n.text == "x"].count("input") == 3


def test_top_down_direction():
    assert "rankdir=TB" in dot_source(LINEAR, direction="TB")
    assert "rankdir=LR" in dot_source(LINEAR)
    with pytest.raises(PenroseRenderError, match="direction"):
        dot_source(LINEAR, direction="RL")


# ---- sizes and contraction plans ---------------------------------------------------------------


def test_sizes_on_request():
    s = structure(LINEAR, show_sizes=True)
    assert ("x", "W", ("j=8",)) in s.wires()
    s = structure(LINEAR, show_sizes=True, sizes={"j": 5})
    assert ("x", "W", ("j=5",)) in s.wires()


def test_plan_labels_each_contraction_with_its_number_and_flops():
    s = structure(ATTENTION, show_plan=True, show_sizes=True)
    labels = " | ".join(w.label for w in s.edges)
    # q: 6·8·4 multiply-adds over d; the logits contract e: 6·6·4
    assert "#1: 384 FLOPs" in labels  # 2·t·e·d: a step that sums counts twice (opt_einsum)
    assert "#4: 288 FLOPs" in labels
    assert "d=8" in labels and "e=4" in labels
    chain = "dim i = 2, j = 50, k = 50, l = 2\ninput A[i, j]\ninput B[j, k]\ninput C[k, l]\nD = einsum('ij,jk,kl->il', A, B, C)\noutput D"
    labels = " | ".join(w.label for w in structure(chain, show_plan=True).edges)
    assert "#1.1:" in labels and "#1.2:" in labels  # the planner's two pairwise steps


# ---- determinism -------------------------------------------------------------------------------


def test_same_file_same_bytes(tmp_path):
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    render_file(PAPER / "self_attention.pen" if (PAPER / "self_attention.pen").exists() else _write(tmp_path, ATTENTION), a)
    render_file(PAPER / "self_attention.pen" if (PAPER / "self_attention.pen").exists() else _write(tmp_path, ATTENTION), b)
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    assert "Generated by graphviz" not in text
    assert str(tmp_path) not in text and str(ROOT) not in text


def test_same_bytes_in_another_process(tmp_path):
    pen = _write(tmp_path, ATTENTION)
    code = "import sys; from penrose.rendering import render; sys.stdout.write(render(sys.argv[1]))"
    other = subprocess.run([sys.executable, "-c", code, str(pen)], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    assert other == render(str(pen))


def test_svg_ids_are_prefixed_per_figure():
    a, b = render(LINEAR), render(ATTENTION)
    ida = set(re.findall(r' id="([^"]+)"', a))
    idb = set(re.findall(r' id="([^"]+)"', b))
    assert ida and idb and not (ida & idb)  # two figures inline in one page cannot clash


# ---- files, formats and errors -----------------------------------------------------------------


def _write(tmp_path, text, name="attention.pen"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("ext, magic", [("svg", b"<?xml"), ("png", b"\x89PNG"), ("pdf", b"%PDF")])
def test_formats_by_extension(tmp_path, ext, magic):
    out = render_file(_write(tmp_path, LINEAR), tmp_path / f"fig.{ext}")
    assert Path(out).read_bytes().startswith(magic)


def test_render_returns_text_or_bytes():
    assert isinstance(render(LINEAR), str)
    assert render(LINEAR, "png").startswith(b"\x89PNG")
    with pytest.raises(PenroseRenderError, match="unknown figure format 'gif'"):
        render(LINEAR, "gif")


def test_unknown_extension_writes_nothing(tmp_path):
    with pytest.raises(PenroseRenderError, match=r"\.svg, \.png or \.pdf"):
        render_file(_write(tmp_path, LINEAR), tmp_path / "fig.gif")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.pen"]


def test_unwritable_place_is_a_render_error(tmp_path):
    with pytest.raises(PenroseRenderError, match="does not exist"):
        render_file(_write(tmp_path, LINEAR), tmp_path / "missing" / "fig.svg")
    assert isinstance(PenroseRenderError("x"), PenroseError)


def test_failed_render_leaves_the_old_file(tmp_path):
    out = tmp_path / "fig.svg"
    out.write_text("old")
    bad = _write(tmp_path, "dim e = 2\ninput x[e]\ny = einsum('ij->j', x)\noutput y", "bad.pen")
    with pytest.raises(PenroseCheckError):
        render_file(bad, out)
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_invalid_diagram_gives_the_checkers_positioned_error(tmp_path):
    bad = _write(tmp_path, "dim e = 2\ninput x[e]\ny = einsum('i,ij->j', x, W)\noutput y", "bad.pen")
    with pytest.raises(PenroseCheckError) as info:
        render_file(bad, tmp_path / "fig.svg")
    assert info.value.line == 3 and info.value.col == 26
    assert "unknown tensor 'W'" in str(info.value)
    assert not (tmp_path / "fig.svg").exists()


@pytest.mark.parametrize("view, message", [
    ("statement:0", "use statement:1 to statement:"),
    ("statement:x", "use statement:1 to statement:"),
    ("block:nope", "no block 'nope'"),
    ("everything", "unknown view 'everything'"),
])
def test_bad_views(view, message):
    with pytest.raises(PenroseRenderError, match=message):
        render(RESIDUAL, view=view)


def test_cannot_render_other_objects():
    with pytest.raises(PenroseRenderError, match="cannot render a int"):
        render(3)


# ---- notebooks and the command line ------------------------------------------------------------


def test_parsed_checked_and_compiled_diagrams_show_themselves():
    d = penrose.parse(LINEAR)
    assert d._repr_svg_().startswith("<?xml")
    assert penrose.check(d)._repr_svg_() == d._repr_svg_()
    module = penrose.compile(LINEAR)
    assert module._repr_svg_() == d._repr_svg_()
    assert penrose.parse("dim e = 2\noutput y")._repr_svg_() is None  # does not check: no figure


def test_cli_render(tmp_path):
    pen = _write(tmp_path, RESIDUAL)
    out = tmp_path / "fig.svg"
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "render", str(pen), "-o", str(out), "--view", "block:layer",
                          "--direction", "TB", "--sizes", "--plan"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    s = figure_structure(out.read_text())
    assert s.kinds()["W1"] == "param"
    assert any("=" in w.label for w in s.edges)
    bad = subprocess.run([sys.executable, "-m", "penrose.cli", "render", str(pen), "-o", str(tmp_path / "x.bmp")],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 1 and "error:" in bad.stderr and "Traceback" not in bad.stderr


# ---- equations and readings --------------------------------------------------------------------


def test_equations_use_the_einsum_letters():
    c = penrose.check(penrose.parse(ATTENTION))
    latex = [statement_latex(c, s) for s in statements(c)]
    assert latex[0] == r"q_{te} = \sum_{d} Z_{td} \, W_{q,de}"
    assert latex[3] == r"l_{tp} = \frac{\sum_{e} q_{te} \, k_{pe}}{\sqrt{e}}"
    assert latex[4] == r"\mathrm{probs}_{tp} = \mathrm{softmax}_{p}\left(l_{tp}\right)"
    assert latex[5] == r"h_{te} = \sum_{p} \mathrm{probs}_{tp} \, v_{pe}"


def test_every_statement_of_the_examples_has_a_drawable_equation():
    from penrose.rendering.equations import to_mathtext
    from matplotlib.mathtext import MathTextParser

    parser = MathTextParser("path")
    for text in (ATTENTION, LINEAR, RESIDUAL):
        c = penrose.check(penrose.parse(text))
        for body in [c, *c.blocks.values()]:
            for s in statements(body):
                parser.parse(f"${to_mathtext(statement_latex(c, s))}$")


def test_readings_follow_the_paper():
    c = penrose.check(penrose.parse(ATTENTION))
    rows = [[r.kind for r in statement_readings(c, s)] for s in statements(c)]
    assert rows == [["matrix_matrix"]] * 3 + [["matrix_matrix", "rescale"], ["softmax"], ["convex_combination"]]
    text = statement_readings(c, statements(c)[5])[0].text
    assert text.startswith("Convex combination of slices of v (indexed by p) weighted by probabilities")
    r = penrose.check(penrose.parse(RESIDUAL))
    kinds = [[x.kind for x in statement_readings(r, s)] for s in statements(r)]
    assert kinds[2] == ["residual"]
    assert kinds[3] == ["activation", "topk"]


def test_index_legend_reads_continuation_lines():
    d = penrose.parse("# index legend: t token, p key token (the paper's t_p),\n#   e embedding\ndim t = 1\ninput x[t]\noutput x")
    assert index_legend(d) == {"t": "token", "p": "key token (the paper's t_p)", "e": "embedding"}


@pytest.mark.skipif(not (PAPER / "steerling_listing.pen").exists(), reason="the paper's listings are not written yet")
def test_steerling_listing_is_residual_at_a_glance():
    svg = render(PAPER / "steerling_listing.pen")
    s = figure_structure(svg)
    residual = [w for w in s.edges if w.style == "residual"]
    # four updates of the stream Z (attention, MLP, concepts out, concepts back in), each drawn
    # into and out of its + or − node
    assert len([w for w in residual if s.nodes[w.head].kind == "arith"]) == 4
    # crossings as the figure report counts them: Z's legs branch to q, k, v and the mask in one
    # fan, whose centre lines touch as they leave Z (no crossing away from it)
    assert measure(svg).counts()["crossings"] == 0 and overlaps(s) == []


# every operation the language has, in blocks and out: every view draws, every equation parses
EVERYTHING = """\
# index legend: t token, e embedding, f hidden, f2 double hidden, c class
dim t = 4, e = 6, f = 3, f2 = 6, c = 2
input x[t, e]
input m[t] : bool
input ids[t] : int
input s[]
param E[c, e]
param g[e] ~ ones
block two(a[t, e]) {
  param W[e, f2]
  u, v = split(einsum('t e, e f2 -> t f2', a, W), f2, [f, f])
  return u, v
}
block nest(a[t, e]) {
  p, q = two(a)
  return concat([p, q], f, f2)
}
h = rmsnorm(x, e, weight=g)
u, v = two(h)
w = concat([u, v], f, f2)
r = sum(w, f2) + mean(x, e) - max(x, e)
z = clamp(-r * s, min=-1, max=1)
k = where(m, z, 0.5)
emb = gather(E, ids)
n = nest(emb) as nn
y = einsum('t f2, t f2 -> t', n, w) + k
tr = einsum('tt->', einsum('te,pe->tp', x, x))
output y, tr
"""


def test_every_view_of_every_operation_draws():
    from matplotlib.mathtext import MathTextParser

    from penrose.rendering.equations import to_mathtext
    from penrose.rendering.graphviz import run_dot_many

    c = penrose.check(penrose.parse(EVERYTHING))
    views = ["diagram"] + [f"statement:{n}" for n in range(1, len(statements(c)) + 1)] + [f"block:{b}" for b in c.blocks]
    dots = [dot_source(c, view=v) for v in views] + [dot_source(c, unfold=True), dot_source(c, show_plan=True, show_sizes=True)]
    svgs = run_dot_many(dots)
    assert len(svgs) == len(dots) and all(s.startswith(b"<?xml") for s in svgs)
    full = figure_structure(svgs[0].decode())
    assert {"RMS norm over e", "concat → f2", "gather rows of E", "clamp [−1, 1]", "mask where true false = 0.5", "−"} <= set(full.texts())
    assert {b.text for b in full.of_kind("block")} == {"two", "nn: nest"}
    parser = MathTextParser("path")
    for body in [c, *c.blocks.values()]:
        for s in statements(body):
            latex = statement_latex(c, s)
            parser.parse(f"${to_mathtext(latex)}$")
            statement_readings(c, s, body)
    assert statement_latex(c, statements(c)[2]) == r"w_{t,f_{2}} = \mathrm{concat}\left(u_{tf}, v_{tf}\right)"


ZOO = sorted(p for p in (ROOT / "zoo").rglob("*.pen") if re.search(r"^output ", p.read_text(), re.M))
# the paper's own figures have no crossing wires; these transcriptions keep it that way
NO_CROSSINGS = {"linear_model", "mlp", "sparse_encoder", "concept_bottleneck", "concept_embedding_bottleneck",
                "mixture_of_linear_models", "neural_additive_model", "self_attention", "steerling_listing"}


@pytest.mark.skipif(not ZOO, reason="no zoo diagrams yet")
def test_zoo_figures_have_no_overlapping_labels_and_the_papers_no_crossings():
    from penrose.rendering.graphviz import run_dot_many

    svgs = run_dot_many([dot_source(p) for p in ZOO])
    for path, svg in zip(ZOO, svgs):
        s = figure_structure(svg.decode())
        assert overlaps(s) == [], path
        if path.parent.name == "paper" and path.stem in NO_CROSSINGS:  # as the figure report counts them
            assert measure(svg).counts()["crossings"] == 0, path
