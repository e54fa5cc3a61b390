"""Index equations: LaTeX for the paper's table rows and figures, and SVG drawn by mathtext.

Every equation these tests produce is also drawn (`test_every_equation_renders`), since mathtext
parses only a subset of LaTeX."""

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import sympy

from penrose.rendering.equations import (
    apply_function,
    assign,
    dim_size,
    einsum_equation,
    elementwise,
    latex_to_svg,
    leg_symbol,
    normalisation_equation,
    tensor_entry,
    to_latex,
    to_mathtext,
)
from penrose.rendering.readings import parse_einsum

ROOT = Path(__file__).resolve().parents[2]


def einsum(spec, result, *names, **hints):
    return einsum_equation(parse_einsum(spec, *names, **hints), result)


def scaled_logits():
    # l = einsum('te,pe->tp', q, k) / sqrt(e)
    return assign("l", "tp", elementwise("/", einsum("te,pe->tp", "l", "q", "k").rhs,
                                         sympy.sqrt(dim_size("e"))))


# (id, equation, expected LaTeX)
CASES = [
    # the paper's operations table, top to bottom
    ("scalar", einsum(",->", "h", "v", "w"), r"h = v \, w"),
    ("elementwise", einsum("i,i->i", "h", "a", "b"), r"h_{i} = a_{i} \, b_{i}"),
    ("dot", einsum("i,i->", "h", "a", "b"), r"h = \sum_{i} a_{i} \, b_{i}"),
    ("squared_norm", einsum("i,i->", "asqn", "a", "a"), r"\mathrm{asqn} = \sum_{i} a_{i} \, a_{i}"),
    ("normalise", normalisation_equation("a", "i", "i", "an"),
     r"\mathrm{an}_{i} = \frac{a_{i}}{\sqrt{\sum_{i'} a_{i'}^{2}}}"),
    ("cosine", einsum("i,i->", "h", "an", "bn"),
     r"h = \sum_{i} \mathrm{an}_{i} \, \mathrm{bn}_{i}"),
    ("convex", einsum("i,i->", "h", "a", "bn"), r"h = \sum_{i} a_{i} \, \mathrm{bn}_{i}"),
    ("sum_slices", einsum("ik->i", "h", "A"), r"h_{i} = \sum_{k} A_{ik}"),
    ("matrix_vector", einsum("ij,i->j", "h", "A", "b"), r"h_{j} = \sum_{i} A_{ij} \, b_{i}"),
    ("scaled_slices", einsum("ij,i->ij", "H", "A", "b"), r"H_{ij} = A_{ij} \, b_{i}"),
    ("matrix_matrix", einsum("ij,ik->jk", "H", "A", "B"), r"H_{jk} = \sum_{i} A_{ij} \, B_{ik}"),
    # self-attention
    ("query", einsum("td,de->te", "q", "Z", "W_q"), r"q_{te} = \sum_{d} Z_{td} \, W_{q,de}"),
    ("logits", scaled_logits(), r"l_{tp} = \frac{\sum_{e} q_{te} \, k_{pe}}{\sqrt{e}}"),
    ("softmax", assign("probs", "tp", apply_function("softmax", tensor_entry("l", "tp"), "p")),
     r"\mathrm{probs}_{tp} = \mathrm{softmax}_{p}\left(l_{tp}\right)"),
    ("attend", einsum("tp,pe->te", "h", "probs", "v"),
     r"h_{te} = \sum_{p} \mathrm{probs}_{tp} \, v_{pe}"),
    # linear model: y = sigma(einsum('j,ij->i', x, W))
    ("linear", assign("y", "i", apply_function("sigma", einsum("j,ij->i", "y", "x", "W").rhs)),
     r"y_{i} = \sigma\left(\sum_{j} x_{j} \, W_{ij}\right)"),
    # Steerling: concepts, residual, normalisation
    ("topk", assign("csf", "tk", apply_function(
        "topk", apply_function("sigmoid", tensor_entry("ls", "tk")), "k")),
     r"\mathrm{csf}_{tk} = "
     r"\mathrm{top}\text{-}k_{k}\left(\sigma\left(\mathrm{ls}_{tk}\right)\right)"),
    ("rmsnorm", assign("h", "te", apply_function("RMSNorm", tensor_entry("Z", "te"), "e")),
     r"h_{te} = \mathrm{RMSNorm}_{e}\left(Z_{te}\right)"),
    ("residual",
     assign("Z", "te", elementwise("+", tensor_entry("Z", "te"), tensor_entry("h", "te"))),
     r"Z_{te} = Z_{te} + h_{te}"),
    ("remove",
     assign("Z", "te", elementwise("-", tensor_entry("Z", "te"), tensor_entry("ce", "te"))),
     r"Z_{te} = Z_{te} - \mathrm{ce}_{te}"),
    ("relu", assign("h", "te", apply_function("relu", tensor_entry("h", "te"))),
     r"h_{te} = \mathrm{ReLU}\left(h_{te}\right)"),
    ("layernorm", assign("h", "te", apply_function("layernorm", tensor_entry("Z", "te"), "e")),
     r"h_{te} = \mathrm{LayerNorm}_{e}\left(Z_{te}\right)"),
    ("batched_norm", normalisation_equation("x", "te", "e", "xn"),
     r"\mathrm{xn}_{te} = \frac{x_{te}}{\sqrt{\sum_{e'} x_{te'}^{2}}}"),
    # interpretable maps: prototype labels (pi), NAM layers (digits), concept states
    ("prototype", einsum("pk,pk->k", "c", "probs", "pi"),
     r"c_{k} = \sum_{p} \mathrm{probs}_{pk} \, \pi_{pk}"),
    ("prototype_labels", einsum("pk,pk->k", "c_pred", "probs", "p_true"),
     r"c_{\mathrm{pred},k} = \sum_{p} \mathrm{probs}_{pk} \, p_{\mathrm{true},pk}"),
    ("nam", einsum("kri,krij->krj", "h2", "h1", "W2"),
     r"h_{2,krj} = \sum_{i} h_{1,kri} \, W_{2,krij}"),
    ("nam_sum", assign("y", "r", apply_function("sum", tensor_entry("hL", "kr"), "k")),
     r"y_{r} = \sum_{k} \mathrm{hL}_{kr}"),
    # other patterns
    ("trace", einsum("ii->", "h", "A"), r"h = \sum_{i} A_{ii}"),
    ("transpose", einsum("ij->ji", "H", "A"), r"H_{ji} = A_{ij}"),
    ("outer", einsum("i,j->ij", "H", "a", "b"), r"H_{ij} = a_{i} \, b_{j}"),
    ("chain", einsum("ij,jk,kl->il", "H", "A", "B", "C"),
     r"H_{il} = \sum_{j,k} A_{ij} \, B_{jk} \, C_{kl}"),
    ("ellipsis", einsum("...ij,...jk->...ik", "H", "A", "B"),
     r"H_{\ldots ik} = \sum_{j} A_{\ldots ij} \, B_{\ldots jk}"),
    ("spaced", einsum("tok emb, emb hd -> tok hd", "k", "Z", "W_k"),
     r"k_{\mathrm{tok},\mathrm{hd}} = \sum_{\mathrm{emb}} Z_{\mathrm{tok},\mathrm{emb}} \, "
     r"W_{k,\mathrm{emb},\mathrm{hd}}"),
    ("greek_legs", einsum("alpha b, b -> alpha", "h", "A", "x"),
     r"h_{\alpha} = \sum_{b} A_{\alpha b} \, x_{b}"),
    ("abs", assign("h", "i", apply_function("abs", tensor_entry("x", "i"))),
     r"h_{i} = \left|x_{i}\right|"),
    ("unknown_function", assign("h", "i", apply_function("my_fn", tensor_entry("x", "i"), "i")),
     r"h_{i} = \mathrm{my\_fn}_{i}\left(x_{i}\right)"),
    ("negate_square",
     assign("h", "i", elementwise("-", elementwise("**", tensor_entry("x", "i"), 2))),
     r"h_{i} = - x_{i}^{2}"),
]


@pytest.mark.parametrize("equation, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_latex(equation, expected):
    assert to_latex(equation) == expected


# sympy's own LaTeX, which uses constructs mathtext lacks
SYMPY_LATEX = [
    sympy.latex(sympy.Function("softmax")(sympy.Symbol("x"))),  # \operatorname{softmax}
    sympy.latex(sympy.sign(sympy.Symbol("x"))),
    sympy.latex(sympy.Max(sympy.Symbol("x"), 0)),
    r"\sum\limits_{i} \displaystyle a_{i}",
    r"\textrm{score} = \mbox{logit}",
]
RENDERED = [to_latex(c[1]) for c in CASES] + SYMPY_LATEX


@pytest.mark.parametrize("latex", RENDERED)
def test_every_equation_renders(latex):
    svg = latex_to_svg(latex)
    root = ET.fromstring(svg.encode())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find(".//{http://www.w3.org/2000/svg}path") is not None  # glyphs drawn as paths


def test_to_mathtext_rewrites():
    assert to_mathtext(r"\operatorname{sm}_{p}") == r"\mathrm{sm}_{p}"
    assert to_mathtext(r"$\sum\limits_{i} x$") == r"\sum_{i}\, x"
    assert to_mathtext(r"\frac{a}{b}") == r"\dfrac{a}{b}"
    assert to_mathtext(r"\mathrel{..}\nobreak x") == ".. x"


def test_svg_is_deterministic_in_process():
    latex = to_latex(CASES[0][1])
    draw = latex_to_svg.__wrapped__  # past the cache
    assert draw(latex) == draw(latex)


def test_svg_is_deterministic_across_processes():
    latex = r"l_{tp} = \frac{\sum_{e} q_{te} \, k_{pe}}{\sqrt{e}}"
    code = ("import sys; from penrose.rendering.equations import latex_to_svg; "
            "sys.stdout.write(latex_to_svg(sys.argv[1]))")
    other = subprocess.run([sys.executable, "-c", code, latex], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout
    assert other == latex_to_svg(latex)
    assert "<dc:date>" not in other


def test_svg_size_follows_fontsize():
    small = ET.fromstring(latex_to_svg("h = a", fontsize=8).encode())
    large = ET.fromstring(latex_to_svg("h = a", fontsize=24).encode())
    width = [float(svg.get("width").removesuffix("pt")) for svg in (small, large)]
    assert width[0] < width[1]


def test_unrenderable_latex_names_itself():
    with pytest.raises(ValueError, match=r"mathtext cannot draw .*begin\{cases\}"):
        latex_to_svg(r"\begin{cases} x \end{cases}")


def test_function_aliases():
    x = tensor_entry("x", "u")
    assert to_latex(apply_function("sigma", x)) == to_latex(apply_function("sigmoid", x))
    assert to_latex(apply_function("top_k", x, "u")) == to_latex(apply_function("top-k", x, "u"))
    assert to_latex(apply_function("sqrt", x)) == r"\sqrt{x_{u}}"
    with pytest.raises(ValueError, match="sum needs the leg"):
        apply_function("sum", x)


def test_functions_stay_unevaluated():
    # exp(log(x)) is what the diagram computes; sympy must not simplify it to x
    x = tensor_entry("x", "i")
    assert to_latex(apply_function("exp", apply_function("log", x))) == \
        r"\exp\left(\log\left(x_{i}\right)\right)"


def test_dim_size_is_not_the_index():
    # sqrt(e) under a sum over e must stay a constant of that sum
    assert dim_size("e") != leg_symbol("e")
    assert to_latex(dim_size("e")) == "e"


def test_scalar_and_tensor_entries():
    assert tensor_entry("s", ()) == sympy.Symbol("s")
    assert to_latex(tensor_entry("W0", "ij")) == "W_{0,ij}"
    assert to_latex(tensor_entry("Sigma", "ij")) == r"\Sigma_{ij}"
