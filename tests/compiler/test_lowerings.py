"""Code-generation lowerings: linear, embedding, partial split, topk_keep, grouped-query attention,
where without leading None axes, float32 norms (`tests/compiler/test_lowering.py` covers the einsum ones).

Each lowering is checked twice: it is actually emitted (an assertion on the generated source,
and for attention on the arguments scaled_dot_product_attention receives), and the module it
gives computes what an independent reference written directly in torch computes (index gathers,
explicit masks and `torch.where`, `repeat_interleave` attention), in value and in gradient, in
float64 (1e-10) and float32 (1e-5). Patterns next to each one that must not be rewritten are
checked the same way, including two defects found while writing them and since fixed (a batched
mask input in fused attention; a split operand recomputed once per read piece).

    linear      X[..., c] W[n, c] -> [..., n]       F.linear(X, W) (torch.nn.functional as F)
    embedding   gather(E, ids), E[v, e]             F.embedding(ids, E)
    split       some pieces never read              only the read pieces, as x[a:b] / x.narrow(...)
    topk_keep   where(topk_mask(x, u, k=K), f(x), 0)  _topk_keep(x, K, dim, f) / _topk_filter
    GQA         q (..., g·r, t, d), k/v (..., g, s, d)  one SDPA call, enable_gqa, no copies
    where       unbatched operands                  no leading None axes
    norms       _rms_norm / _rope in float32         no casts (same values)
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose

pytestmark = pytest.mark.usefixtures("one_thread")

PRECISIONS = [(torch.float64, 1e-10), (torch.float32, 1e-5)]
BATCHES = [(), (2,), (2, 3)]


# ---- helpers ---------------------------------------------------------------------------------


def compile_quiet(text, **sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return penrose.compile(text, seed=0, **sizes)


def code(m) -> str:
    """The generated forward methods (of the diagram and its blocks), without comments."""
    out, inside = [], False
    for line in m.penrose_source.splitlines():
        if line.startswith("    def "):
            inside = line.startswith("    def forward(")
        elif line and not line.startswith("        "):
            inside = False
        code_part = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
        if inside and code_part.strip():
            out.append(code_part)
    return "\n".join(out)


def make_inputs(m, batch=(), seed=1, int_high=None):
    """float64 inputs (int ids below int_high, bool masks) with leading batch dims."""
    g = torch.Generator().manual_seed(seed)
    checked = m.penrose_checked
    out = {}
    for d in checked.inputs:
        shape = (*batch, *(checked.sizes.size(c) for c in d.type.cls))
        if d.tensor.dtype == "int":
            out[d.tensor.name] = torch.randint(0, int_high, shape, generator=g)
        elif d.tensor.dtype == "bool":
            out[d.tensor.name] = torch.rand(shape, generator=g) < 0.6
        else:
            out[d.tensor.name] = torch.randn(shape, dtype=torch.float64, generator=g)
    return out


def assert_same(m, reference, inputs, precisions=PRECISIONS):
    """m(**inputs) == reference(inputs and params by name), values and gradients (w.r.t. every
    float input and every parameter, under a random cotangent), at each (dtype, tolerance)."""
    for dtype, tol in precisions:
        m = m.to(dtype)
        ins = {k: v.to(dtype).requires_grad_(True) if v.is_floating_point() else v for k, v in inputs.items()}
        params = dict(m.named_parameters())
        got = m(**ins)
        want = reference({**ins, **params})
        got = tuple(got) if isinstance(got, tuple) else (got,)
        want = tuple(want) if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
        leaves = [v for v in ins.values() if v.requires_grad] + list(params.values())
        if not leaves:
            continue
        g = torch.Generator().manual_seed(7)
        cots = [torch.randn(a.shape, generator=g, dtype=torch.float64).to(dtype) for a in got]
        ga = torch.autograd.grad(sum((a * c).sum() for a, c in zip(got, cots)), leaves, allow_unused=True)
        gb = torch.autograd.grad(sum((b * c).sum() for b, c in zip(want, cots)), leaves, allow_unused=True)
        for leaf, x, y in zip(leaves, ga, gb):
            x = torch.zeros_like(leaf) if x is None else x
            y = torch.zeros_like(leaf) if y is None else y
            torch.testing.assert_close(x, y, rtol=tol, atol=tol)


def einsum_reference(spec, *operands):
    """torch.einsum with '...' on the operands that carry batch dims beyond their legs."""
    lhs, rhs = spec.split("->")
    terms = lhs.split(",")
    parts, batched = [], False
    for term, x in zip(terms, operands):
        extra = x.dim() > len(term)
        batched |= extra
        parts.append(("..." if extra else "") + term)
    return torch.einsum(",".join(parts) + "->" + ("..." if batched else "") + rhs, *operands)


# ---- 1. linear: X[..., c] W[n, c] -> [..., n] ------------------------------------------------

# (einsum spec, operand declarations, the code that must (or must not) appear)
LINEAR = {
    "matrix": ("tc,nc->tn", ["input X[t, c]", "param W[n, c]"], "F.linear(X, self.W)"),
    "vector": ("c,nc->n", ["input X[c]", "param W[n, c]"], "F.linear(X, self.W)"),
    "three_legs": ("thc,nc->thn", ["input X[t, h, c]", "param W[n, c]"], "F.linear(X, self.W)"),
    "two_params": ("tc,nc->tn", ["param X[t, c]", "param W[n, c]"], "F.linear(self.X, self.W)"),
    "expression": ("tc,nc->tn", ["input X[t, c]", "param W[n, c]"], "F.linear(X * 2.0, self.W)"),
}
NOT_LINEAR = {  # W stored (c, n), or W batched (an input): a matrix product, not linear
    "w_cn": ("tc,cn->tn", ["input X[t, c]", "param W[c, n]"], "X @ self.W"),
    "w_input": ("tc,nc->tn", ["input X[t, c]", "input W[n, c]"], "X @ W.mT"),
}


def linear_text(spec, decls, scale=False):
    x = "X * 2.0" if scale else "X"
    return "\n".join(["dim t = 3, c = 4, n = 5, h = 2", *decls, f"y = einsum('{spec}', {x}, W)", "output y"])


@pytest.mark.parametrize("name", sorted(LINEAR) + sorted(NOT_LINEAR))
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_linear(name, batch):
    spec, decls, expected = {**LINEAR, **NOT_LINEAR}[name]
    m = compile_quiet(linear_text(spec, decls, scale=name == "expression"))
    assert expected in code(m)
    assert ("F.linear(" in code(m)) == (name in LINEAR)
    if batch and name == "two_params":
        return  # no inputs to batch
    scale = 2.0 if name == "expression" else 1.0
    assert_same(m, lambda env: einsum_reference(spec, env["X"] * scale, env["W"]), make_inputs(m, batch))


@settings(max_examples=15)
@given(t=st.integers(1, 4), c=st.integers(1, 5), n=st.integers(1, 5), batch=st.sampled_from(BATCHES))
def test_linear_sizes(t, c, n, batch):
    m = compile_quiet(linear_text(*LINEAR["matrix"][:2]), t=t, c=c, n=n)
    assert "F.linear(X, self.W)" in code(m)
    assert_same(m, lambda env: env["X"] @ env["W"].T, make_inputs(m, batch))


# x W + b with b a param along the product's last leg: nn.Linear's own call; a bias along another
# leg, or an input (batched: it aligns with an unsqueeze), stays a sum
BIASES = {
    "bias": ("param b[n]", "einsum('tc,nc->tn', X, W) + b", "y = F.linear(X, self.W, self.b)", lambda b: b),
    "bias_first": ("param b[n]", "b + einsum('tc,nc->tn', X, W)", "y = F.linear(X, self.W, self.b)", lambda b: b),
    "other_leg": ("param b[t]", "einsum('tc,nc->tn', X, W) + b", "y = F.linear(X, self.W) + self.b.unsqueeze(-1)",
                  lambda b: b[:, None]),
    "input": ("input b[n]", "einsum('tc,nc->tn', X, W) + b", "y = F.linear(X, self.W) + b.unsqueeze(-2)",
              lambda b: b.unsqueeze(-2)),
}


@pytest.mark.parametrize("name", sorted(BIASES))
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_linear_with_bias(name, batch):
    decl, expr, expected, aligned = BIASES[name]
    m = compile_quiet(f"dim t = 3, c = 4, n = 5\ninput X[t, c]\nparam W[n, c]\n{decl}\ny = {expr}\noutput y")
    assert expected in code(m)
    assert_same(m, lambda env: env["X"] @ env["W"].T + aligned(env["b"]), make_inputs(m, batch))


# a reduction whose leg comes back (aligned, or a pattern's '1'): keepdim=True, as a person writes
# it, also under element-wise functions and arithmetic with numbers; where the leg comes back
# elsewhere, an unsqueeze
KEEPDIM = {
    "centred": ("y = x - mean(x, e)", "y = x - x.mean(-1, keepdim=True)", lambda x: x - x.mean(-1, keepdim=True)),
    "normalised": ("y = x / sqrt(sum(x * x, e) + 1e-12)", "y = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)",
                   lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)),
    "pattern": ("y = reduce(x, 't e -> t 1', 'sum')", "y = x.sum(-1, keepdim=True)", lambda x: x.sum(-1, keepdim=True)),
    "elsewhere": ("y = einsum('te->et', x) - sum(x, e)", "y = torch.einsum('...te->...et', x) - x.sum(-1).unsqueeze(-2)",
                  lambda x: x.transpose(-2, -1) - x.sum(-1).unsqueeze(-2)),
    "times_a_tensor": ("y = x - sum(x, e) * sum(x, e)", "y = x - (x.sum(-1) * x.sum(-1)).unsqueeze(-1)",
                       lambda x: x - (x.sum(-1) ** 2).unsqueeze(-1)),
}


@pytest.mark.parametrize("name", sorted(KEEPDIM))
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_keepdim(name, batch):
    stmt, expected, reference = KEEPDIM[name]
    m = compile_quiet(f"dim t = 3, e = 4\ninput x[t, e]\n{stmt}\noutput y")
    assert expected in code(m)
    assert_same(m, lambda env: reference(env["x"]), make_inputs(m, batch))


# ---- 2. embedding: gather(E, ids) on an unbatched matrix -------------------------------------

GATHER = """\
dim v = 7, t = 5, e = 3, h = 2
input ids[t] : int
param E[v, e] ~ normal(std=1)
param F[v, h, e] ~ normal(std=1)
param G[v] ~ normal(std=1)
x = gather(E, ids)
y = gather(F, ids)
z = gather(G, ids)
output x, y, z
"""


def rows(table, ids):
    """table's rows at ids, by index_select on the flattened ids."""
    return table.index_select(0, ids.reshape(-1)).reshape(*ids.shape, *table.shape[1:])


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_embedding(batch):
    m = compile_quiet(GATHER)
    src = code(m)
    # the ids checked first (_ids: a wrong id is a ShapeError naming the input and leg, issue 23)
    assert "x = F.embedding(_ids(ids, V, " in src  # V: the dim's size, a constant of the module
    assert "y = self.F[_ids(ids, V, " in src and "z = self.G[_ids(ids, V, " in src  # not a matrix: plain indexing
    inputs = make_inputs(m, batch, int_high=7)
    inputs["ids"].view(-1)[0] = 6  # the last row and a repeated row are read
    inputs["ids"].view(-1)[-1] = 6
    assert_same(m, lambda env: tuple(rows(env[n], env["ids"]) for n in "EFG"), inputs)


def test_embedding_int32_ids():
    m = compile_quiet(GATHER)
    ids = torch.tensor([[0, 6, 3, 3, 1]], dtype=torch.int32)
    torch.testing.assert_close(m(ids).x, m.E[ids.long()], rtol=0, atol=0)


# ---- 3. split: only the pieces that are read -------------------------------------------------

SPLIT_CASES = {
    # a param's first axis: the unused padding rows are never made; the piece is a slice (and
    # the einsum with it a linear)
    "param_rows": ("""\
dim us = 7, u = 4, ux = 3, e = 5, t = 3
input h[t, e]
param P_up[us, e] ~ normal(std=1)
P, Ppad = split(P_up, us, [u, ux])
l = einsum('te,ue->tu', h, P)
output l
""", ["P = self.P_up[:U]", "F.linear(h, P)"], ["Ppad =", "torch.split"],
        lambda env: env["h"] @ env["P_up"][:4].T),
    # a middle piece unused, over the last leg of a batched input: narrows
    "middle_unused": ("""\
dim t = 3, f3 = 9, a = 2, b = 3, c = 4
input x[t, f3]
x1, x2, x3 = split(x, f3, [a, b, c])
y = sigmoid(x3) * 2
z = x1 * 3
output y, z
""", ["x1 = x.narrow(-1, 0, A)", "x3 = x.narrow(-1, A + B, C)"], ["x2 =", "torch.split"],
        lambda env: (torch.sigmoid(env["x"][..., 5:]) * 2, env["x"][..., :2] * 3)),
    # the first leg of a batched input is not its first axis: a narrow, not a slice
    "batched_first_leg": ("""\
dim f2 = 5, p = 2, q = 3, e = 4
input x[f2, e]
x1, x2 = split(x, f2, [p, q])
output x2
""", ["x2 = x.narrow(-2, P, Q)"], ["x1 =", "torch.split"],
        lambda env: env["x"][..., 2:, :]),
    # an unbatched expression split along its first axis: sliced in parentheses
    "expression_rows": ("""\
dim n = 5, p = 2, q = 3, e = 4
input x[e]
param W[n, e] ~ normal(std=1)
A, B = split(W * 2, n, [p, q])
y = einsum('pe,e->p', A, x)
output y
""", ["A = (self.W * 2)[:P]"], ["B =", "torch.split"],
        lambda env: einsum_reference("pe,e->p", (env["W"] * 2)[:2], env["x"])),
    # a piece read only as an output is read
    "output_only": ("""\
dim t = 3, f = 2, f2 = 4
input u[t, f2]
up, gate = split(u, f2, [f, f])
output up
""", ["up = u.narrow(-1, 0, F)"], ["gate =", "torch.split"],
        lambda env: env["u"][..., :2]),
    # SSA: the first version of `gate` is never read (a later one is)
    "reassigned": ("""\
dim t = 3, f = 2, f2 = 4
input u[t, f2]
up, gate = split(u, f2, [f, f])
gate = up * 2
h = gate + 1
output h
""", ["up = u.narrow(-1, 0, F)", "gate = up * 2"], ["torch.split"],
        lambda env: env["u"][..., :2] * 2 + 1),
    # the same with the later version an output: correct either way (the compiler counts every
    # version of an output's name as read, so this one stays a torch.split)
    "reassigned_output": ("""\
dim t = 3, f = 2, f2 = 4
input u[t, f2]
up, gate = split(u, f2, [f, f])
gate = up * 2
output gate
""", [], [], lambda env: env["u"][..., :2] * 2),
    # two splits: the first is read whole (torch.split), the second only in part
    "two_splits": ("""\
dim t = 3, f = 4, f2 = 8, p = 1, q = 3
input u[t, f2]
a, b = split(u, f2, [f, f])
c = a * b
a, b = split(c, f, [p, q])
output b
""", ["a, b = torch.split(u, [F, F], dim=-1)", "b = c.narrow(-1, P, Q)"], [],
        lambda env: (env["u"][..., :4] * env["u"][..., 4:])[..., 1:]),
    # every piece is read: still one torch.split (also inside a block, read by its return)
    "all_used": ("""\
dim t = 3, f = 2, f2 = 4, e = 3
input u[t, f2]
block glu(x[t, f2]) {
  a, b = split(x, f2, [f, f])
  return a * sigmoid(b)
}
up, gate = split(u, f2, [f, f])
h = up * sigmoid(gate) + glu(u)
output h
""", ["up, gate = torch.split(u, [F, F], dim=-1)", "a, b = torch.split(x, [F, F], dim=-1)"], ["narrow"],
        lambda env: 2 * env["u"][..., :2] * torch.sigmoid(env["u"][..., 2:])),
    # a block's piece read only by its return, the other unused
    "block_return": ("""\
dim t = 3, f = 2, f2 = 5, g = 3, e = 4
input x[t, e]
block head(x[t, e]) {
  param W[f2, e] ~ normal(std=1)
  a, b = split(einsum('t e, f2 e -> t f2', x, W), f2, [f, g])
  return sigmoid(b)
}
y = head(x)
output y
""", ["b = F.linear(x, self.W).narrow(-1, F_DIM, G)"], ["a =", "torch.split"],
        lambda env: torch.sigmoid(env["x"] @ env["head.W"][2:].T)),
}


@pytest.mark.parametrize("name", sorted(SPLIT_CASES))
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_split(name, batch):
    text, present, absent, reference = SPLIT_CASES[name]
    m = compile_quiet(text)
    src = code(m)
    for s in present:
        assert s in src, (s, src)
    for s in absent:
        assert s not in src, (s, src)
    assert_same(m, reference, make_inputs(m, batch))


SPLIT_OF_EXPRESSION = """\
dim t = 3, e = 4, o = 6, a = 2, b = 2, c = 2
input x[t, e]
param W[o, e] ~ normal(std=1)
p, q, r = split(einsum('t e, o e -> t o', x, W), o, [a, b, c])
y = p * q
output y
"""


def test_split_of_an_expression_two_pieces_read():
    m = compile_quiet(SPLIT_OF_EXPRESSION)
    assert "torch.split" not in code(m) and "r =" not in code(m)
    assert_same(m, lambda env: (env["x"] @ env["W"][:2].T) * (env["x"] @ env["W"][2:4].T), make_inputs(m, (2,)))


def test_split_of_an_expression_computes_it_once():
    assert code(compile_quiet(SPLIT_OF_EXPRESSION)).count("F.linear(") == 1


# ---- 4. where(topk_mask(x, u, k=K), f(x), 0) -> _topk_keep ------------------------------------

UNARIES = {  # the diagram's name -> (the emitted callable, an independent torch function)
    "sigmoid": ("torch.sigmoid", torch.sigmoid),
    "sigma": ("torch.sigmoid", torch.sigmoid),
    "relu": ("torch.relu", torch.relu),
    "gelu": ("F.gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
    "silu": ("F.silu", lambda x: x * torch.sigmoid(x)),
    "tanh": ("torch.tanh", torch.tanh),
    "exp": ("torch.exp", torch.exp),
    "abs": ("torch.abs", torch.abs),
    "softplus": ("F.softplus", lambda x: torch.log1p(torch.exp(x))),
}


def topk_reference_mask(x, k, dim):
    """True at the k largest entries along dim: x >= the k-th largest (continuous data: no ties)."""
    kth = x.sort(dim=dim, descending=True).values.narrow(dim, k - 1, 1)
    return x >= kth


def topk_text(fn, over_t, k, param=False):
    x = "W" if param else "l"
    body = f"{fn}({x})" if fn else x
    leg = "t" if over_t else "u"
    return "\n".join([
        "dim t = 4, u = 5",
        f"{'param' if param else 'input'} {x}[t, u]" + (" ~ normal(std=1)" if param else ""),
        "input m[t, u]",  # only so a diagram over a param still has an input
        f"w = where(topk_mask({x}, {leg}, k={k}), {body}, 0)",
        "output w",
    ])


@settings(max_examples=25)
@given(fn=st.sampled_from([None, *UNARIES]), over_t=st.booleans(), k=st.integers(1, 4),
       param=st.booleans(), batch=st.sampled_from(BATCHES))
def test_topk_keep(fn, over_t, k, param, batch):
    m = compile_quiet(topk_text(fn, over_t, k, param))
    x, dim = ("self.W" if param else "l"), (-2 if over_t else -1)
    if fn is None:
        assert f"w = _topk_filter({x}, {k}, {dim})" in code(m)
    else:
        assert f"w = _topk_keep({x}, {k}, {dim}, {UNARIES[fn][0]})" in code(m)
    assert "torch.where" not in code(m) and "_topk_mask" not in code(m)
    f = (lambda y: y) if fn is None else UNARIES[fn][1]

    def reference(env):
        y = env["W" if param else "l"]
        return torch.where(topk_reference_mask(y, k, dim), f(y), torch.zeros_like(y))

    assert_same(m, reference, make_inputs(m, () if param else batch))


# not of the form where(topk_mask(x, ...), f(x), 0) with f element-wise: stays a torch.where
NOT_TOPK_KEEP = {
    "else_not_zero": ("where(topk_mask(l, u, k=2), sigmoid(l), 1)",
                      lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(l), 1.0)),
    "other_tensor": ("where(topk_mask(l, u, k=2), sigmoid(m), 0)",
                     lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(m), 0.0)),
    "mask_of_other": ("where(topk_mask(m, u, k=2), sigmoid(l), 0)",
                      lambda l, m: torch.where(topk_reference_mask(m, 2, -1), torch.sigmoid(l), 0.0)),
    "leaky_relu": ("where(topk_mask(l, u, k=2), leaky_relu(l, slope=0.1), 0)",
                   lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.where(l > 0, l, 0.1 * l), 0.0)),
    "not_element_wise_of_x": ("where(topk_mask(l, u, k=2), sigmoid(l) * 2, 0)",
                              lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(l) * 2, 0.0)),
    "nested": ("where(topk_mask(l, u, k=2), sigmoid(exp(l)), 0)",
               lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(torch.exp(l)), 0.0)),
    "swapped": ("where(topk_mask(l, u, k=2), 0, sigmoid(l))",
                lambda l, m: torch.where(topk_reference_mask(l, 2, -1), 0.0, torch.sigmoid(l))),
    "mask_of_expression": ("where(topk_mask(l * 2, u, k=2), sigmoid(l * 2), 0)",
                           lambda l, m: torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(l * 2), 0.0)),
}


@pytest.mark.parametrize("name", sorted(NOT_TOPK_KEEP))
def test_topk_keep_not_rewritten(name):
    expr, reference = NOT_TOPK_KEEP[name]
    m = compile_quiet(f"dim t = 4, u = 5\ninput l[t, u]\ninput m[t, u]\nw = {expr}\noutput w\n")
    assert "_topk_keep(" not in code(m) and "_topk_filter(" not in code(m)
    assert "torch.where(_topk_mask(" in code(m)
    assert_same(m, lambda env: reference(env["l"], env["m"]), make_inputs(m, (2,)))


def test_topk_keep_named_mask_not_rewritten():
    # the mask held in a variable: the where does not see topk_mask, and computes the same
    m = compile_quiet("dim t = 4, u = 5\ninput l[t, u]\nk = topk_mask(l, u, k=3)\nw = where(k, exp(l), 0.0)\noutput w\n")
    assert "_topk_keep(" not in code(m)
    assert_same(m, lambda env: torch.where(topk_reference_mask(env["l"], 3, -1), env["l"].exp(), 0.0),
                make_inputs(m, (3,)))


def test_topk_keep_in_steerling_unknown_head():
    # the diagram that motivated the lowering: sigmoid of the kept logits only
    m = compile_quiet("""\
dim t = 3, e = 4, u = 6, ku = 2
input h[t, e]
param P[u, e] ~ normal(std=1)
l = einsum('te,ue->tu', h, P)
w = where(topk_mask(l, u, k=ku), sigmoid(l), 0)
output w
""")
    assert "l = F.linear(h, self.P)" in code(m)
    assert "w = _topk_keep(l, KU, -1, torch.sigmoid)" in code(m)

    def reference(env):
        l = torch.einsum("...e,ue->...u", env["h"], env["P"])
        return torch.where(topk_reference_mask(l, 2, -1), torch.sigmoid(l), 0.0)

    assert_same(m, reference, make_inputs(m, (2,)))


# ---- 5. fused grouped-query attention ---------------------------------------------------------


def block_causal_mask(n_t, n_s, block):
    return torch.arange(n_s)[None, :] // block <= torch.arange(n_t)[:, None] // block


def attention_reference(q, k, v, mask, scale):
    """q (..., t, g, r, d), k (..., s, g, d), v (..., s, g, e): each key/value head repeated for
    its r query heads, scores, -inf where mask is False, softmax, convex combination of values."""
    r = q.shape[-2]
    qh = q.flatten(-3, -2).movedim(-2, -3)  # (..., g·r, t, d)
    kh = k.repeat_interleave(r, dim=-2).movedim(-2, -3)  # (..., g·r, s, d)
    vh = v.repeat_interleave(r, dim=-2).movedim(-2, -3)
    scores = (qh @ kh.mT) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    y = torch.softmax(scores, dim=-1) @ vh  # (..., g·r, t, e)
    return y.movedim(-3, -2).unflatten(-2, (q.shape[-3], r))


def mask_line(mask, block):
    if mask == "causal":
        return "l = where(causal(t, s), l, -inf)"
    if mask == "block_causal":
        return f"l = where(block_causal(t, s, block={block}), l, -inf)"
    return ""


def gqa_text(mask, block, scale):
    return "\n".join([
        "dim t = 4, s = 4, g = 2, r = 3, d = 4, e = 2",
        "input q[t, g, r, d]", "input k[s, g, d]", "input v[s, g, e]",
        f"l = einsum('tgrd,sgd->grts', q, k) {scale}",
        mask_line(mask, block),
        "y = einsum('grts,sge->tgre', softmax(l, s), v)",
        "output y",
    ])


def mha_text(mask, block, scale):
    return "\n".join([
        "dim t = 4, s = 4, h = 2, d = 4, e = 2",
        "input q[t, h, d]", "input k[s, h, d]", "input v[s, h, e]",
        f"l = einsum('thd,shd->hts', q, k) {scale}",
        mask_line(mask, block),
        "y = einsum('hts,she->the', softmax(l, s), v)",
        "output y",
    ])


@contextlib.contextmanager
def sdpa_spy():
    """Record the (q, k, v, kwargs) of every scaled_dot_product_attention call."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q, k, v, kwargs))
        return real(q, k, v, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        yield calls
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


def mask_of(mask, block, n_t, n_s):
    if mask == "causal":
        return block_causal_mask(n_t, n_s, 1)
    if mask == "block_causal":
        return block_causal_mask(n_t, n_s, block)
    return None


SCALES = {"* 0.5": 0.5, "/ sqrt(d)": None, "": 1.0}  # None: 1/sqrt(d)


@settings(max_examples=20)
@given(g=st.integers(1, 3), r=st.integers(2, 3), n_t=st.integers(1, 5), n_s=st.integers(1, 5),
       d=st.integers(1, 4), e=st.integers(1, 3), mask=st.sampled_from([None, "causal", "block_causal"]),
       block=st.integers(1, 3), scale=st.sampled_from(sorted(SCALES)), batch=st.sampled_from(BATCHES))
def test_gqa_attention(g, r, n_t, n_s, d, e, mask, block, scale, batch):
    if mask is not None:
        n_s = n_t  # the diagram's masks are square
    m = compile_quiet(gqa_text(mask, block, scale), t=n_t, s=n_s, g=g, r=r, d=d, e=e)
    src = code(m)
    assert "y = _gqa_attention(" in src and "softmax" not in src
    inputs = make_inputs(m, batch)
    factor = 1 / math.sqrt(d) if SCALES[scale] is None else SCALES[scale]
    bool_mask = mask_of(mask, block, n_t, n_s)

    def reference(env):
        return attention_reference(env["q"], env["k"], env["v"], bool_mask, factor)

    with sdpa_spy() as calls:
        assert_same(m, reference, inputs)
    # one call per forward, grouped: g key/value heads for g·r query heads, k and v not copied
    assert len(calls) == 2
    for (q_, k_, v_, kw), dtype in zip(calls, (torch.float64, torch.float32)):
        assert kw.get("enable_gqa") is True
        assert q_.shape[-3] == g * r and k_.shape[-3] == g and v_.shape[-3] == g
        assert q_.dim() == 4 and q_.shape[0] == math.prod(batch)
        assert k_.dtype == dtype


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_gqa_keys_and_values_are_views(batch):
    m = compile_quiet(gqa_text("block_causal", 2, "* 0.5"))
    inputs = make_inputs(m, batch)
    with sdpa_spy() as calls:
        m(**inputs)
    (_, k_, v_, kw), = calls
    assert kw["enable_gqa"] is True
    assert k_.untyped_storage().data_ptr() == inputs["k"].untyped_storage().data_ptr()
    assert v_.untyped_storage().data_ptr() == inputs["v"].untyped_storage().data_ptr()


@pytest.mark.parametrize("mask", [None, "causal", "block_causal"])
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_multi_head_attention_not_grouped(mask, batch):
    m = compile_quiet(mha_text(mask, 3, "/ sqrt(d)"))
    assert "y = _attention(" in code(m)

    def reference(env):  # r = 1 query head per key/value head
        q = env["q"].unsqueeze(-2)
        return attention_reference(q, env["k"], env["v"], mask_of(mask, 3, 4, 4), 0.5).squeeze(-2)

    with sdpa_spy() as calls:
        assert_same(m, reference, make_inputs(m, batch))
    assert calls and all(not kw.get("enable_gqa", False) for _, _, _, kw in calls)


def test_gqa_broadcast_batch():
    # k and v with a size-1 batch dim broadcast against q's: still the grouped call
    m = compile_quiet(gqa_text("causal", 1, "* 0.5"))
    inputs = make_inputs(m, (3,))
    inputs["k"], inputs["v"] = inputs["k"][:1], inputs["v"][:1]
    with sdpa_spy() as calls:
        assert_same(m, lambda env: attention_reference(env["q"], env["k"], env["v"], mask_of("causal", 1, 4, 4), 0.5),
                    inputs)
    assert calls and all(kw.get("enable_gqa") is True for _, _, _, kw in calls)


def test_heads_in_the_other_order_are_not_grouped():
    # score legs (r, g): key/value heads are not the leading head leg, so no grouped call
    text = gqa_text("causal", 1, "* 0.5").replace("->grts", "->rgts").replace("'grts,", "'rgts,")
    m = compile_quiet(text)
    assert "_attention(" in code(m)
    with sdpa_spy() as calls:
        assert_same(m, lambda env: attention_reference(env["q"], env["k"], env["v"], mask_of("causal", 1, 4, 4), 0.5),
                    make_inputs(m, (2,)))
    assert calls and all(not kw.get("enable_gqa", False) for _, _, _, kw in calls)


# a Steerling-style attention block from x[t, e]: fused q|k|v projection (linear), split (all
# pieces read: torch.split), heads as legs, block-causal grouped-query attention, output linear
STEERLING_ATTENTION = """\
dim t = 6, s = 6, e = 8, g = 2, r = 2, d = 2, gd = 4, o = 16, blk = 2
input x[t, e]
param c_attn[o, e]
param c_proj[e, e]
a = clamp(einsum('te,oe->to', x, c_attn), min=-3, max=3)
q, k, v = split(a, o, [e, gd, gd])
q = unflatten(q, e, [g, r, d])
k = unflatten(k, gd, [g, d])
v = unflatten(v, gd, [g, d])
l = einsum('tgrd,sgd->grts', q, k) / sqrt(d)
l = where(block_causal(t, s, block=blk), l, -inf)
y = einsum('grts,sgd->tgrd', softmax(l, s), v)
y = flatten(y, [g, r, d], e)
h = einsum('ti,ei->te', y, c_proj)
output h
"""


def steerling_reference(env):
    x, w_attn, w_proj = env["x"], env["c_attn"], env["c_proj"]
    a = torch.einsum("...te,oe->...to", x, w_attn).clamp(-3, 3)
    q, k, v = a[..., :8], a[..., 8:12], a[..., 12:]
    q = q.reshape(*q.shape[:-1], 2, 2, 2)
    k = k.reshape(*k.shape[:-1], 2, 2)
    v = v.reshape(*v.shape[:-1], 2, 2)
    n = x.shape[-2]
    y = attention_reference(q, k, v, block_causal_mask(n, n, 2), 1 / math.sqrt(2))
    return torch.einsum("...ti,ei->...te", y.reshape(*y.shape[:-3], 8), w_proj)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)], ids=str)
def test_steerling_attention_block(batch):
    m = compile_quiet(STEERLING_ATTENTION)
    src = code(m)
    assert "F.linear(x, self.c_attn)" in src
    assert "q, k, v = torch.split(a, [E, GD, GD], dim=-1)" in src
    assert "h = F.linear(y, self.c_proj)" in src
    assert "_attention(" in src
    inputs = {"x": torch.randn(*batch, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))}
    with sdpa_spy() as calls:
        assert_same(m, steerling_reference, inputs)
    assert all(kw["enable_gqa"] is True for _, _, _, kw in calls)
    # free token leg: a shorter sequence, same module
    short = {"x": inputs["x"][..., :5, :].clone()}
    assert_same(m, steerling_reference, short, precisions=PRECISIONS[1:])


@pytest.mark.parametrize("batch", [(6,), (2,), (2, 3)])
@pytest.mark.parametrize("grouped", [True, False])
def test_attention_with_a_batched_mask_input(batch, grouped):
    """A mask input with batch legs lines up with the batch, not the head legs (batch 6 = g·r
    heads would silently mix them up), in the grouped and the plain multi-head call."""
    kv = "g" if grouped else "g, r"
    kvl = "sgd" if grouped else "sgrd"
    m = compile_quiet(f"""\
dim t = 4, s = 4, g = 2, r = 3, d = 2
input q[t, g, r, d]
input k[s, {kv}, d]
input v[s, {kv}, d]
input M[t, s] : bool
l = where(M, einsum('tgrd,{kvl}->grts', q, k), -inf)
y = einsum('grts,{kvl}->tgrd', softmax(l, s), v)
output y
""")
    inputs = make_inputs(m, batch)
    inputs["M"][..., 0] = True  # every query sees some key

    def reference(env):
        k, v = env["k"], env["v"]
        if grouped:  # each key/value head serves its r query heads
            k, v = (x[..., None, :].expand(*x.shape[:-1], 3, x.shape[-1]) for x in (k, v))
        qh, kh, vh = (x.movedim(-4, -2) for x in (env["q"], k, v))  # (..., g, r, t|s, d)
        scores = (qh @ kh.mT).masked_fill(~env["M"][..., None, None, :, :], -math.inf)
        return (torch.softmax(scores, dim=-1) @ vh).movedim(-2, -4)

    assert_same(m, reference, inputs, precisions=PRECISIONS[:1])


@pytest.mark.parametrize("how", ["compile", "export"])
def test_gqa_torch_compile_and_export(how):
    m = compile_quiet(STEERLING_ATTENTION).eval()
    x = torch.randn(2, 6, 8)
    want = m(x)
    if how == "compile":
        got = torch.compile(m, backend="eager", fullgraph=True)(x)
    else:
        got = torch.export.export(m, (x,)).module()(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(want, steerling_reference({"x": x, **dict(m.named_parameters())}), rtol=1e-5, atol=1e-5)


# ---- 6. where: unbatched operands need no leading None axes -----------------------------------

WHERE = """\
dim t = 3, p = 3, h = 2
input s[t, p, h]
input bb[h]
param b[h] ~ normal(std=1)
param c[p] ~ normal(std=1)
param w[t] ~ normal(std=1)
y = where(causal(t, p), s, b)
z = where(s > 0, c, w)
u = where(s > 0, bb, c)
v = s * b + c
output y, z, u, v
"""


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_where_unbatched_operands(batch):
    m = compile_quiet(WHERE)
    src = code(m)
    assert "y = torch.where(_causal_mask(T, P, _device).unsqueeze(-1), s, self.b)" in src
    assert "z = torch.where(s > 0, self.c.unsqueeze(-1), self.w[..., :, None, None])" in src
    assert "bb[..., None, None, :]" in src  # a batched operand keeps its leading axes
    assert "v = s * self.b + self.c.unsqueeze(-1)" in src

    def reference(env):
        s, bb, b, c, w = (env[n] for n in ("s", "bb", "b", "c", "w"))
        causal = torch.arange(3)[None, :] <= torch.arange(3)[:, None]
        pos = s > 0
        y = torch.where(causal[:, :, None], s, b.expand(3, 3, 2))
        z = torch.where(pos, c.reshape(3, 1).expand(3, 3, 2), w.reshape(3, 1, 1).expand(3, 3, 2))
        u = torch.where(pos, bb.unsqueeze(-2).unsqueeze(-2), c.reshape(3, 1))
        return y, z, u, s * b + c[:, None]

    assert_same(m, reference, make_inputs(m, batch))


# ---- 7. _rms_norm / _rope: float32 needs no casts --------------------------------------------

NORMS = """\
dim t = 5, h = 2, d = 4
input x[t, h, d]
param gd[d] ~ normal(std=1)
param gh[h] ~ normal(std=1)
y = rope(rmsnorm(x, d, weight=gd, eps=1e-5), t, d, base=100)
z = rmsnorm(x, h, weight=gh, eps=1e-5)
output y, z
"""


def norms_reference(env):
    """In float32, cast back to the input's dtype; RMSNorm over d then rotate-half RoPE over
    (t, d), and RMSNorm over the middle leg h."""
    x = env["x"]
    xf, gd, gh = x.float(), env["gd"].float(), env["gh"].float()
    y = xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-5) * gd
    n = 4
    inv = 100.0 ** (-torch.arange(0, n, 2, dtype=torch.float32) / n)
    angle = torch.arange(5, dtype=torch.float32)[:, None] * inv[None, :]
    angle = torch.cat([angle, angle], -1)[:, None, :]  # (t, 1, d)
    rot = torch.cat([-y[..., n // 2:], y[..., : n // 2]], -1)
    y = y * angle.cos() + rot * angle.sin()
    z = xf / torch.sqrt((xf * xf).mean(-2, keepdim=True) + 1e-5) * gh[:, None]
    return y.to(x.dtype), z.to(x.dtype)


@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_rms_norm_and_rope_float32(batch):
    m = compile_quiet(NORMS)
    assert "_rope(_rms_norm(x, self.gd, 1e-05, -1), -3, -1, 100.0)" in code(m)
    assert "_rms_norm(x, self.gh, 1e-05, -2)" in code(m)
    # float64 inputs are computed in float32 too: the same (float32-level) tolerance
    assert_same(m, norms_reference, make_inputs(m, batch), precisions=[(torch.float32, 1e-5), (torch.float64, 1e-5)])


def test_rms_norm_and_rope_bfloat16_computed_in_float32():
    m = compile_quiet(NORMS).to(torch.bfloat16)
    x = torch.randn(2, 5, 2, 4).to(torch.bfloat16)
    got = m(x)
    want = norms_reference({"x": x, **dict(m.named_parameters())})
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
