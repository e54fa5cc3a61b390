"""The attention fusion (scaled_dot_product_attention) computes exactly what the diagram says.

Each case compiles once with fusion (the default) and once without, loads the same weights,
and compares values and gradients in float64; each also asserts whether fusion happened, so a
pattern that silently stops fusing is caught.
"""

import pytest
import torch

import penrose
from penrose.compiler import build

CASES = {
    # plain single-head attention with a bool causal mask and 1/sqrt(e) scaling
    "causal": (True, """
dim t = 6, p = 6, d = 8, e = 4
input Z[t, d]
param W_q[d, e]
param W_k[d, e]
param W_v[d, e]
q = einsum('td,de->te', Z, W_q)
k = einsum('pd,de->pe', Z, W_k)
v = einsum('pd,de->pe', Z, W_v)
l = einsum('te,pe->tp', q, k) / sqrt(e)
l = where(causal(t, p), l, -inf)
probs = softmax(l, dim=-1)
h = einsum('tp,pe->te', probs, v)
output h
"""),
    # grouped-query attention: query heads (g, r), key/value heads g, block-causal mask
    "gqa_block_causal": (True, """
dim t = 7, s = 7, g = 2, r = 3, d = 4
input q[t, g, r, d]
input k[s, g, d]
input v[s, g, d]
l = einsum('tgrd,sgd->grts', q, k) * 0.5
l = where(block_causal(t, s, block=3), l, -inf)
y = einsum('grts,sgd->tgrd', softmax(l, s), v)
output y
"""),
    # an additive float mask input, no scaling
    "additive": (True, """
dim t = 5, p = 5, e = 3
input q[t, e]
input k[p, e]
input v[p, e]
input M[t, p]
l = einsum('te,pe->tp', q, k)
l = l + M
h = einsum('tp,pe->te', softmax(l, p), v)
output h
"""),
    # the scores are also an output: fusing would drop them, so it must not fuse
    "scores_used_twice": (False, """
dim t = 4, p = 4, e = 3
input q[t, e]
input k[p, e]
input v[p, e]
l = einsum('te,pe->tp', q, k)
h = einsum('tp,pe->te', softmax(l, p), v)
output h, l
"""),
    # softmax over the query leg is not attention
    "softmax_over_queries": (False, """
dim t = 4, p = 4, e = 3
input q[t, e]
input k[p, e]
input v[p, e]
l = einsum('te,pe->tp', q, k)
h = einsum('tp,pe->te', softmax(l, t), v)
output h
"""),
}


def _unfused(checked):
    return build(checked, seed=0, fuse_attention=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_equals_unfused(name):
    should_fuse, text = CASES[name]
    checked = penrose.load(text)
    fused = build(checked, seed=0).double().eval()
    plain = _unfused(checked).double().eval()
    plain.load_state_dict(fused.state_dict())
    assert ("_attention(" in fused.penrose_source.split("from penrose.runtime import")[1].split("\n", 1)[1]) == should_fuse
    assert "_attention(" not in plain.penrose_source.split("from penrose.runtime import")[1].split("\n", 1)[1]
    g = torch.Generator().manual_seed(1)
    inputs = {}
    for d in checked.inputs:
        shape = [checked.sizes.size(c) for c in d.type.cls]
        inputs[d.tensor.name] = torch.randn(2, *shape, dtype=torch.float64, generator=g).requires_grad_(True)
    a, b = fused(**inputs), plain(**inputs)
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
    ga = torch.autograd.grad(sum(x.sum() for x in a), list(inputs.values()))
    gb = torch.autograd.grad(sum(y.sum() for y in b), list(inputs.values()))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


GQA_ADDITIVE = """
dim t = 5, s = 5, g = 2, r = 2, d = 4
input q[t, g, r, d]
input k[s, g, d]
input v[s, g, d]
input M[t, s]
l = einsum('tgrd,sgd->grts', q, k) * 0.5 + M
y = einsum('grts,sgd->tgrd', softmax(l, s), v)
output y
"""


@pytest.mark.parametrize("text", [CASES["additive"][1], GQA_ADDITIVE], ids=["plain", "gqa"])
def test_a_mask_hiding_every_key_of_a_row_keeps_the_gradients(text):
    """Regression (a traced LLaMA with left padding): where an additive float mask hides every key
    of a query row (float32's minimum, as Hugging Face writes it), scaled_dot_product_attention
    returns the written-out values but not their gradients (each hidden key got weight 1, not
    1/n, in its backward; v's gradient was off by up to ~5 here, ~97 in the model). The fused
    module writes such a call out, so it matches the unfused one in values and gradients."""
    checked = penrose.load(text)
    fused = build(checked, seed=0).eval()
    plain = _unfused(checked).eval()
    assert "_attention(" in fused.penrose_source.split("from penrose.runtime import")[1].split("\n", 1)[1]
    g = torch.Generator().manual_seed(3)
    inputs = {}
    for d in checked.inputs:
        shape = [checked.sizes.size(c) for c in d.type.cls]
        inputs[d.tensor.name] = torch.randn(2, *shape, generator=g)
    hidden = torch.zeros(2, 5, 5)
    hidden[:, torch.ones(5, 5).triu(1) == 1] = torch.finfo(torch.float32).min  # causal
    hidden[1, :, :2] = torch.finfo(torch.float32).min  # batch 1 padded on the left: rows 0, 1 see nothing
    inputs["M"] = hidden
    for x in inputs.values():
        x.requires_grad_(x is not hidden)
    a, b = fused(**inputs), plain(**inputs)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    cot = torch.randn(a.shape, generator=g)
    wrt = [x for x in inputs.values() if x.requires_grad]
    for x, y in zip(torch.autograd.grad(a, wrt, cot), torch.autograd.grad(b, wrt, cot)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
