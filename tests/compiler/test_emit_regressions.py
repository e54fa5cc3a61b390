"""Named regression cases of the emitter: generated source printed from trees.

Each case once compiled to code that computed something else (the emitter glued strings whose
meaning depended on their neighbours) or that Python refused. The reference is written here
directly in torch.
"""

from __future__ import annotations

import ast

import pytest
import torch

import penrose

HEAD = """\
dim t = 3, m = 4, c = 5, d = 5, h = 5, g2 = 1
input x[t, m]
input g[t, c]
param W[m, c]
"""

F = torch.nn.functional

# (name, statement, reference(x, g, W), comment)
CASES = [
    ("einsum_call_operand_then_power", "y = einsum('tm,mc->tc', tanh(x), W) ** 2",
     lambda x, g, W: (torch.tanh(x) @ W) ** 2, "emitted torch.tanh(x) @ self.W ** 2"),
    ("product_with_einsum_of_call", "y = g * einsum('tm,mc->tc', gelu(x), W)",
     lambda x, g, W: g * (F.gelu(x) @ W), "the matmul bound looser than the product"),
    ("number_over_einsum_of_call", "y = 2 / einsum('tm,mc->tc', tanh(x), W)",
     lambda x, g, W: 2 / (torch.tanh(x) @ W), "2 / a @ b is (2 / a) @ b"),
    ("reduce_of_einsum_of_call", "y = max(einsum('tm,mc->tc', tanh(x), W), c)",
     lambda x, g, W: (torch.tanh(x) @ W).amax(-1), ".amax bound to W alone"),
    ("mean_of_einsum_of_call", "y = mean(einsum('tm,mc->tc', tanh(x), W), c)",
     lambda x, g, W: (torch.tanh(x) @ W).mean(-1), "failed inside torch"),
    ("unflatten_of_einsum_of_call", "dim a = 5, b = 1\ny = unflatten(einsum('tm,mc->tc', tanh(x), W), c, [a, b])",
     lambda x, g, W: (torch.tanh(x) @ W).unflatten(-1, (5, 1)), "failed inside torch"),
    ("negated_einsum", "y = -einsum('tm,mc->tc', x, W) ** 2",
     lambda x, g, W: -((x @ W) ** 2), "unary minus binds looser than **"),
    ("power_of_negative_number", "y = g * (-2) ** 2",
     lambda x, g, W: g * 4.0, "ast.unparse prints Constant(-2) ** 2 as -2 ** 2"),
    ("subtraction_is_left_associative", "y = g - (g - einsum('tm,mc->tc', x, W))",
     lambda x, g, W: g - (g - x @ W), "a - (b - c) must keep its brackets"),
    ("power_is_right_associative", "y = (g ** 2) ** 0.5 + abs(g) ** 2 ** 0.5",
     lambda x, g, W: (g ** 2) ** 0.5 + g.abs() ** (2 ** 0.5), "(a ** b) ** c is not a ** b ** c"),
    ("matmul_transposed_operand_of_call", "y = einsum('tm,cm->tc', tanh(x), einsum('mc->cm', W) * 2)",
     lambda x, g, W: torch.tanh(x) @ (W.T * 2).T, ".mT on a product must bracket the product"),
    ("comparison_in_where", "y = where(einsum('tm,mc->tc', x, W) > g, g, 0)",
     lambda x, g, W: torch.where(x @ W > g, g, 0.0), "comparison of a matmul"),
]


@pytest.mark.parametrize("name, stmt, ref, comment", CASES, ids=[c[0] for c in CASES])
def test_statement_computes_what_it_says(name, stmt, ref, comment):
    m = penrose.compile(HEAD + stmt + "\noutput y", seed=0).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    g = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    got = m(x=x, g=g)
    want = ref(x, g, m.W.detach())
    torch.testing.assert_close(got, want.expand_as(got) if want.dim() < got.dim() else want, rtol=1e-12, atol=1e-12)


def _chain(n: int) -> str:
    return "dim e = 3\ninput x[e]\ny = " + " + ".join(["x"] * n) + "\noutput y"


@pytest.mark.parametrize("n", [250, 10_000])
def test_long_sums_compile_flat(n):
    """A 250-term sum passed the checker and then Python refused the generated code ('too many
    nested parentheses'); 10,000 terms must work too."""
    m = penrose.compile(_chain(n)).double()
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(m(x), x * n, rtol=1e-12, atol=1e-9)
    ast.parse(m.penrose_source)  # the source Python accepts
    # the sum is flat: no line holds brackets nested deeper than a few levels
    assert max(line.count("(") for line in m.penrose_source.splitlines()) < 60


def test_deep_nesting_compiles():
    """300 nested calls crashed the checker with RecursionError; 1,000 levels must work."""
    text = "dim e = 3\ninput x[e]\ny = " + "tanh(" * 1000 + "x" + ")" * 1000 + "\noutput y"
    m = penrose.compile(text)
    x = torch.randn(3)
    want = x
    for _ in range(1000):
        want = torch.tanh(want)
    torch.testing.assert_close(m(x), want)


def test_deep_brackets_compile():
    text = "dim e = 3\ninput x[e]\ny = " + "(" * 1000 + "x * 2" + ")" * 1000 + " + 1\noutput y"
    m = penrose.compile(text)
    x = torch.randn(3)
    torch.testing.assert_close(m(x), x * 2 + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_input_of_another_dtype_is_a_penrose_error(dtype):
    """A float64 or bfloat16 input to a float32 model raised a torch dtype error."""
    m = penrose.compile(HEAD + "y = einsum('tm,mc->tc', x, W)\noutput y")
    with pytest.raises(penrose.PenroseShapeError, match=r"input 'x' is torch\.\w+ but the model's parameters are torch.float32"):
        m(x=torch.randn(3, 4, dtype=dtype), g=torch.randn(3, 5))
    m.to(dtype)  # converting the model is the documented way
    assert m(x=torch.randn(3, 4, dtype=dtype), g=torch.randn(3, 5, dtype=dtype)).dtype == dtype


def test_inputs_of_two_dtypes_are_a_penrose_error():
    m = penrose.compile("dim e = 3\ninput a[e]\ninput b[e]\ny = a * b\noutput y")
    with pytest.raises(penrose.PenroseShapeError, match=r"input 'b' is torch.float64 but input 'a' is torch.float32"):
        m(torch.randn(3), torch.randn(3, dtype=torch.float64))


def test_input_on_another_device_is_a_penrose_error():
    m = penrose.compile(HEAD + "y = einsum('tm,mc->tc', x, W)\noutput y").to("meta")
    with pytest.raises(penrose.PenroseShapeError, match=r"input 'x' is on cpu but the model's parameters are on meta"):
        m(x=torch.randn(3, 4), g=torch.randn(3, 5))


def test_concat_of_batched_and_unbatched_parts():
    """Found by the differential fuzzer: torch.cat does not broadcast, so concatenating a
    batched input with a param failed inside torch ('Tensors must have same number of dimensions')."""
    m = penrose.compile("dim t = 2, e = 3, f = 6\ninput x[t, e]\nparam W[t, e]\ny = concat([x, W], e, f)\noutput y", seed=0)
    x = torch.randn(4, 5, 2, 3)
    want = torch.cat([x, m.W.detach().expand(4, 5, 2, 3)], dim=-1)
    torch.testing.assert_close(m(x), want)


def test_a_keyword_naming_a_free_dim_keeps_the_checked_number():
    """Found by the differential fuzzer (test_free_legs_of_other_sizes) when keywords began to be
    written by name: `clamp(x, min=-tok, max=tok)` with `tok` a leg only the input carries read
    its size at run time (±3 for a 3-token input), where the checked value, and the interpreter,
    clamp at ±2 (the declared size). A name is written only where its value is fixed."""
    text = ("dim tok = 2, b = 3\nconst k = 3\ninput X1[tok, b]\nh2 = clamp(X1, min=-tok, max=tok)\n"
            "alpha = clamp(X1, min=-k, max=k)\noutput h2, alpha")
    m = penrose.compile(text)
    assert "h2 = X1.clamp(min=-2, max=2)" in m.penrose_source  # the number: tok comes from the inputs
    assert "alpha = X1.clamp(min=-K, max=K)" in m.penrose_source  # the name: a const (K = 3)
    x = torch.linspace(-5, 5, 9).reshape(3, 3)
    h2, alpha = m(x)
    torch.testing.assert_close(h2, x.clamp(-2, 2))
    torch.testing.assert_close(alpha, x.clamp(-3, 3))
