"""Each einsum lowering (matmul, transposed matmul, product-then-sum, grouped matmul) computes
torch.einsum's value and gradient, and is actually chosen for the pattern it targets."""

import pytest
import torch

import penrose

# (spec, operand legs as declared, the code the lowering must produce)
CASES = [
    ("td,de->te", ("t d", "d e"), "Z @ self.B"),  # plain matrix product with a param
    ("te,pe->tp", ("t e", "p e"), "Z @ B.mT"),  # attention scores: the second operand transposed
    ("ed,te->td", ("e d", "t e"), "B @ self.Z"),  # operands swapped so the batched one leads
    ("fpk,fpk->pk", ("f p k", "f p k"), "(Z * B).sum(-3)"),  # element-wise product, then a sum
    ("f,fke->ke", ("f", "f k e"), "(Z @ self.B.flatten(1)).unflatten(-1, (K, E))"),  # grouped: two free legs
    ("ke,ker->r", ("k e", "k e r"), "Z.flatten(-2) @ self.B.flatten(0, 1)"),  # grouped: two contracted legs
    ("ij,jk,kl->il", ("i j", "j k", "k l"), "torch.einsum("),  # n-ary: planned pairwise einsums
]
SIZES = {"t": 5, "d": 6, "e": 4, "p": 5, "f": 7, "k": 3, "r": 2, "i": 2, "j": 3, "l": 4}


def _diagram(spec, legs):
    names = ["Z", "B", "C"][: len(legs)]
    lines = ["dim " + ", ".join(f"{k} = {v}" for k, v in SIZES.items())]
    for i, (n, l) in enumerate(zip(names, legs)):
        # the first operand is an input (batched); the others are params unless both are inputs
        kind = "input" if i == 0 or "mT" in spec or spec in ("fpk,fpk->pk",) else "param"
        lines.append(f"{kind} {n}[{', '.join(l.split())}]")
    lines.append(f"y = einsum('{spec}', {', '.join(names)})")
    lines.append("output y")
    return "\n".join(lines)


@pytest.mark.parametrize("spec,legs,expected", CASES, ids=[c[0] for c in CASES])
def test_lowering_matches_einsum(spec, legs, expected):
    text = _diagram(spec, legs)
    if spec == "te,pe->tp":
        text = text.replace("param B", "input B")
    if spec == "ed,te->td":
        text = text.replace("input Z[e, d]", "param Z[e, d]").replace("param B[t, e]", "input B[t, e]")
        expected = "B @ self.Z"
    model = penrose.compile(text, seed=0).double()
    assert expected in model.penrose_source
    inputs = {d.tensor.name: torch.randn(2, *(SIZES[l] for l in d.tensor.legs), dtype=torch.float64, requires_grad=True)
              for d in model.penrose_checked.inputs}
    params = dict(model.named_parameters())
    operands = [inputs.get(n, params.get(n)) for n in ["Z", "B", "C"][: len(legs)]]
    full = ",".join(("..." if o.dim() > len(l.split()) else "") + l.replace(" ", "") for o, l in zip(operands, legs))
    want = torch.einsum(full + "->..." + spec.split("->")[1], *operands)
    got = model(**inputs)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    leaves = list(inputs.values()) + list(params.values())
    g1 = torch.autograd.grad(got.sum(), leaves)
    g2 = torch.autograd.grad(want.sum(), leaves)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
