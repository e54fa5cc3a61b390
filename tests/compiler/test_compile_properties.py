"""Compiled diagrams against a second, independent implementation written directly in torch.

As in micrograd's tests: every drawn diagram is compared value by value and gradient by gradient
(float64, tight tolerance), batched and unbatched; the standalone source gives the same outputs
as the in-memory module; and the hand-written diagrams below cover blocks, repeat, include,
masks, norms, dropout, gather, topk, split/concat, detach, dtypes, torch.compile and export.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose
from penrose.errors import PenroseShapeError
from sources import imported_modules
from strategies import Case, einsum_cases, elementwise_cases

F64 = dict(rtol=1e-9, atol=1e-11)
BATCHES = st.sampled_from([(), (2,), (2, 3)])


# ---- helpers ---------------------------------------------------------------------------------


def compile_quiet(text, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return penrose.compile(text, **kw)


def as_tuple(out, n):
    return (out,) if n == 1 else tuple(out)


def assert_matches(case: Case, batch=(), sizes=None):
    """Compiled module == reference, in value and in gradient w.r.t. every input and param."""
    m = compile_quiet(case.text, seed=0).double()
    g = torch.Generator().manual_seed(1)
    inputs = case.make_inputs(batch, generator=g, sizes=sizes)
    for x in inputs.values():
        x.requires_grad_(True)
    params = dict(m.named_parameters())
    got = as_tuple(m(**inputs), len(case.outputs))
    env = {**inputs, **params}
    want = case.expected(env, sizes) if sizes else case.expected(env)
    want = [want[o] for o in case.outputs]
    for name, a, b in zip(case.outputs, got, want):
        b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=torch.float64)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        torch.testing.assert_close(a, b, **F64)
    leaves = list(inputs.values()) + list(params.values())
    cot = [torch.randn(a.shape, dtype=torch.float64, generator=g) for a in got]
    loss_got = sum((a * c).sum() for a, c in zip(got, cot))
    loss_want = sum((torch.as_tensor(b) * c).sum() for b, c in zip(want, cot))
    if not loss_want.requires_grad:  # outputs that depend on nothing learnable (sizes only)
        return
    g_got = torch.autograd.grad(loss_got, leaves, allow_unused=True)
    g_want = torch.autograd.grad(loss_want, leaves, allow_unused=True)
    for leaf, a, b in zip(leaves, g_got, g_want):
        a = torch.zeros_like(leaf) if a is None else a
        b = torch.zeros_like(leaf) if b is None else b
        torch.testing.assert_close(a, b, **F64)


def import_source(source: str, folder: Path):
    """Write a standalone source to a .py file and import it under a fresh name."""
    name = f"pen_generated_{uuid.uuid4().hex}"
    path = folder / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_standalone_same(text, inputs: dict):
    """The standalone file, imported, gives exactly the in-memory module's outputs."""
    m = compile_quiet(text, seed=3).double().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = penrose.source(text)
    assert {m for m in imported_modules(source) if m not in sys.stdlib_module_names} == {"torch"}
    with tempfile.TemporaryDirectory() as d:
        mod = import_source(source, Path(d))
        standalone = mod.Model().double().eval()
    standalone.load_state_dict(m.state_dict())
    a, b = m(**inputs), standalone(**inputs)
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    return source


# ---- drawn diagrams --------------------------------------------------------------------------


@settings(max_examples=120)
@given(einsum_cases(), BATCHES)
def test_einsum_matches_torch(case, batch):
    assert_matches(case, batch)


@settings(max_examples=120)
@given(elementwise_cases(), BATCHES)
def test_elementwise_matches_torch(case, batch):
    assert_matches(case, batch)


@settings(max_examples=40)
@given(elementwise_cases(), st.data())
def test_free_legs_take_their_size_from_the_inputs(case, data):
    """Legs only inputs carry are read at run time: feed other sizes than the declared defaults."""
    c = penrose.load(case.text)
    sizes = dict(case.dims)
    for name in sizes:
        if c.sizes.is_free(c.dims[name]):
            sizes[name] = data.draw(st.integers(1, 5), label=f"size of {name}")
    assert_matches(case, (2,), sizes=sizes)


@settings(max_examples=25)
@given(st.one_of(einsum_cases(), elementwise_cases()))
def test_standalone_source_matches_module(case):
    inputs = case.make_inputs((2,), generator=torch.Generator().manual_seed(0))
    assert_standalone_same(case.text, inputs)


# ---- hand-written diagrams -------------------------------------------------------------------

ATTENTION = """\
# index legend: t token, p key position, e embedding, d head dim
dim t = 5, p = 5, e = 8, d = 4
input Z[t, e]
param W_q[e, d] ~ normal(std=0.3)
param W_k[e, d] ~ normal(std=0.3)
param W_v[e, d] ~ normal(std=0.3)
q = einsum('te,ed->td', Z, W_q)
k = einsum('pe,ed->pd', Z, W_k)
v = einsum('pe,ed->pd', Z, W_v)
s = einsum('td,pd->tp', q, k) / sqrt(d)
s = where(causal(t, p), s, -inf)
a = softmax(s, p)
y = einsum('tp,pd->td', a, v)
output y
"""


def attention_reference(m, Z):
    q, k, v = Z @ m.W_q, Z @ m.W_k, Z @ m.W_v
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = Z.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


MLP = """\
dim t = 4, e = 6, f = 12, L = 3
input x[t, e]
block mlp(x[t, e]) {
  param W1[e, f] ~ normal(std=0.3)
  param b1[f] ~ normal(std=0.1)
  param W2[f, e] ~ normal(std=0.3)
  h = relu(einsum('te,ef->tf', x, W1) + b1)
  return x + einsum('tf,fe->te', h, W2)
}
y = mlp(x) repeat L as layers
z = mlp(y) as head
output z
"""


def mlp_reference(block, x):
    h = torch.relu(x @ block.W1 + block.b1)
    return x + h @ block.W2


MULTI = """\
dim t = 3, e = 4
input x[t, e]
param W[e, e] ~ normal(std=0.5)
y = einsum('tf,fe->te', x, W)
c = sum(y * y, e)
output y, c
"""


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_self_attention_with_causal_mask(batch):
    m = compile_quiet(ATTENTION, seed=0).double()
    Z = torch.randn(*batch, 5, 8, dtype=torch.float64, requires_grad=True)
    got, want = m(Z), attention_reference(m, Z)
    torch.testing.assert_close(got, want, **F64)
    (ga,) = torch.autograd.grad(got.sum(), [Z])
    (gb,) = torch.autograd.grad(want.sum(), [Z])
    torch.testing.assert_close(ga, gb, **F64)
    # the token leg is free: a shorter sequence runs, with the mask built for its length
    Z3 = torch.randn(*batch, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(m(Z3), attention_reference(m, Z3), **F64)


def test_repeated_block_and_named_instances():
    m = compile_quiet(MLP, seed=0).double()
    keys = list(m.state_dict())
    want = [f"layers.{i}.{n}" for i in range(3) for n in ("W1", "b1", "W2")] + [f"head.{n}" for n in ("W1", "b1", "W2")]
    assert sorted(keys) == sorted(want)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    y = x
    for i in range(3):
        y = mlp_reference(m.layers[i], y)
    torch.testing.assert_close(m(x), mlp_reference(m.head, y), **F64)
    # separate weights per repeat
    assert not torch.equal(m.layers[0].W1, m.layers[1].W1)


def test_repeat_by_number_and_dim_override():
    text = MLP.replace("repeat L as layers", "repeat 2").replace("as head", "as last")
    m = compile_quiet(text, seed=0)
    assert {k.split(".")[0] for k in m.state_dict()} == {"mlp", "last"}
    assert len(m.mlp) == 2
    m5 = compile_quiet(MLP, seed=0, L=5)
    assert len(m5.layers) == 5
    assert m5.penrose_checked.param_count() == 6 * (6 * 12 * 2 + 12)


def test_block_called_twice_ties_weights():
    text = """\
dim t = 2, e = 3
input x[t, e]
block lin(x[t, e]) {
  param W[e, e] ~ normal(std=0.5)
  return einsum('te,ef->tf', x, W)
}
y = lin(x)
y = lin(y)
z = lin(y) as other
output z
"""
    m = compile_quiet(text, seed=0).double()
    assert sorted(m.state_dict()) == ["lin.W", "other.W"]
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(m(x), x @ m.lin.W @ m.lin.W @ m.other.W, **F64)


def test_state_dict_keys_are_diagram_names():
    text = """\
dim t = 2, e = 3, k = 2
input x[t, e]
param W_in[e, e]
buffer P[k, e] ~ ones
block inner(x[t, e]) {
  param G[e, e]
  return einsum('tf,fe->te', x, G)
}
block outer(x[t, e]) {
  param H[e, e]
  h = inner(x)
  return einsum('tf,fe->te', h, H)
}
y = outer(einsum('tf,fe->te', x, W_in)) repeat 2 as stack
c = einsum('te,ke->tk', y, P)
output c
"""
    m = compile_quiet(text, seed=0)
    assert sorted(m.state_dict()) == sorted(
        ["W_in", "P", "stack.0.H", "stack.0.inner.G", "stack.1.H", "stack.1.inner.G"]
    )
    assert sorted(n for n, _ in m.named_parameters()) == sorted(
        ["W_in", "stack.0.H", "stack.0.inner.G", "stack.1.H", "stack.1.inner.G"]
    )
    assert torch.equal(m.P, torch.ones(2, 3))


def test_include_another_file(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "blocks.pen").write_text(
        "dim e = 3\nblock scale(x[t, e]) {\n  param g[e] ~ constant(value=2)\n  return x * g\n}\n", encoding="utf-8"
    )
    main = tmp_path / "main.pen"
    main.write_text('dim t = 2\ninclude "lib/blocks.pen"\ninput x[t, e]\ny = scale(x)\noutput y\n', encoding="utf-8")
    m = compile_quiet(main, seed=0)
    x = torch.randn(2, 3)
    assert torch.allclose(m(x), 2 * x)
    assert list(m.state_dict()) == ["scale.g"]
    # from text, an include is relative to the working folder
    monkeypatch.chdir(tmp_path)
    m2 = compile_quiet(main.read_text(encoding="utf-8"), seed=0)
    assert torch.allclose(m2(x), 2 * x)


def test_split_and_concat():
    text = """\
dim t = 3, f = 2, f2 = 4
input u[t, f2]
up, gate = split(u, f2, [f, f])
h = up * sigmoid(gate)
c = concat([gate, up], f, f2)
output h, c
"""
    m = compile_quiet(text)
    u = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    h, c = m(u)
    up, gate = u[..., :2], u[..., 2:]
    torch.testing.assert_close(h, up * torch.sigmoid(gate), **F64)
    torch.testing.assert_close(c, torch.cat([gate, up], -1), **F64)
    (g,) = torch.autograd.grad(h.sum() + c.sum(), [u])
    (w,) = torch.autograd.grad((up * torch.sigmoid(gate)).sum() + torch.cat([gate, up], -1).sum(), [u])
    torch.testing.assert_close(g, w, **F64)


def test_split_over_a_middle_leg():
    text = "dim a = 2, n = 5, p = 2, q = 3, b = 3\ninput x[a, n, b]\nx1, x2 = split(x, n, [p, q])\noutput x2\n"
    x = torch.randn(4, 2, 5, 3)
    assert torch.equal(compile_quiet(text)(x), x[:, :, 2:, :])


@pytest.mark.parametrize("batch", [(), (2,)])
def test_gather_int_ids(batch):
    text = "dim v = 7, t = 5, e = 3\ninput ids[t] : int\nparam E[v, e] ~ normal(std=1)\nx = gather(E, ids)\noutput x\n"
    m = compile_quiet(text, seed=0).double()
    ids = torch.randint(0, 7, (*batch, 5))
    got = m(ids)
    torch.testing.assert_close(got, m.E[ids], **F64)
    (g,) = torch.autograd.grad(got.sum(), [m.E])
    want = torch.zeros(7, 3, dtype=torch.float64).index_add_(0, ids.reshape(-1), torch.ones(ids.numel(), 3, dtype=torch.float64))
    torch.testing.assert_close(g, want, **F64)
    with pytest.raises(PenroseShapeError, match="ids.*integer"):
        m(ids.double())


@pytest.mark.parametrize("leg, dim", [("e", -1), ("t", -2)])
def test_topk_filter(leg, dim):
    text = f"dim t = 4, e = 6\ninput x[t, e]\ny = topk(x, {leg}, k=2)\noutput y\n"
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    kth = x.topk(2, dim=dim).values.narrow(dim, 1, 1)
    want = torch.where(x >= kth, x, torch.zeros_like(x))
    torch.testing.assert_close(compile_quiet(text)(x), want, **F64)


def test_layernorm_and_rmsnorm_with_weights():
    text = """\
dim t = 4, e = 6
input x[t, e]
param g[e] ~ normal(std=1, mean=1)
param b[e] ~ normal(std=1)
y = layernorm(x, e, weight=g, bias=b, eps=1e-5)
z = rmsnorm(x, e, weight=g, eps=1e-6)
w = layernorm(x + 1, t)
output y, z, w
"""
    m = compile_quiet(text, seed=0).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    y, z, w = m(x)
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(y, (x - mu) / torch.sqrt(var + 1e-5) * m.g + m.b, **F64)
    x1 = x + 1
    mu_t, var_t = x1.mean(-2, keepdim=True), x1.var(-2, unbiased=False, keepdim=True)
    torch.testing.assert_close(w, (x1 - mu_t) / torch.sqrt(var_t + 1e-5), **F64)
    # rmsnorm is computed in float32 and cast back
    assert z.dtype == torch.float64
    want = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * m.g
    torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-6)


def test_dropout_in_train_and_eval():
    m = compile_quiet("dim t = 64, e = 64\ninput x[t, e]\ny = dropout(x, p=0.5)\noutput y\n")
    x = torch.ones(64, 64)
    m.eval()
    assert torch.equal(m(x), x)
    m.train()
    torch.manual_seed(0)
    y = m(x)
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    assert 0.4 < (y == 0).float().mean().item() < 0.6
    torch.manual_seed(0)
    assert torch.equal(m(x), y)  # the global generator drives it


def test_where_with_causal_and_block_causal_masks():
    text = """\
dim t = 6, p = 6
input s[t, p]
input m[t, p] : bool
a = where(causal(t, p), s, -inf)
b = where(block_causal(t, p, block=2), s, 0.0)
c = where(m, s, 1.5)
d = where(s > 0, s, s * 0.1)
output a, b, c, d
"""
    mod = compile_quiet(text)
    s = torch.randn(2, 6, 6)
    mask = torch.rand(2, 6, 6) > 0.5
    a, b, c, d = mod(s, mask)
    i = torch.arange(6)
    causal = i[None, :] <= i[:, None]
    block = (i[None, :] // 2) <= (i[:, None] // 2)
    assert torch.equal(a, s.masked_fill(~causal, float("-inf")))
    assert torch.equal(b, s.masked_fill(~block, 0.0))
    assert torch.equal(c, torch.where(mask, s, torch.tensor(1.5)))
    assert torch.equal(d, torch.where(s > 0, s, s * 0.1))
    # the masks follow the run-time length of the free token leg
    a4 = mod(s[:, :4, :4], mask[:, :4, :4])[0]
    assert torch.equal(a4, s[:, :4, :4].masked_fill(~causal[:4, :4], float("-inf")))


def test_detach_stops_gradient():
    text = "dim e = 3\ninput x[e]\ny = x.detach() * x + detach(x * 2)\noutput y\n"
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = compile_quiet(text)(x)
    torch.testing.assert_close(y, x * x + 2 * x, **F64)
    (g,) = torch.autograd.grad(y.sum(), [x])
    torch.testing.assert_close(g, x.detach(), **F64)


def test_positional_alignment_takes_left_names():
    # the paper's Z = Z + h with Z[t, e] and h[t, d] (e and d of one size)
    text = "dim t = 3, e = 4, d = 4\ninput Z[t, e]\ninput h[t, d]\nZ = Z + h\nz = sum(Z, e)\noutput z\n"
    Z, h = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(compile_quiet(text)(Z, h), (Z + h).sum(-1))


def test_name_alignment_reorders_legs():
    text = "dim t = 3, e = 4\ninput a[t, e]\ninput b[e, t]\ninput c[e]\ny = a * b + c\nz = b - a\noutput y, z\n"
    a, b, c = torch.randn(3, 4), torch.randn(4, 3), torch.randn(4)
    y, z = compile_quiet(text)(a, b, c)
    torch.testing.assert_close(y, a * b.T + c)
    torch.testing.assert_close(z, b - a.T)  # the operand with most legs, leftmost on ties, sets the order


def test_n_ary_einsum_and_plan():
    text = "dim i = 2, j = 30, k = 30, l = 2\ninput A[i, j]\ninput B[j, k]\ninput C[k, l]\ny = einsum('ij,jk,kl->il', A, B, C)\noutput y\n"
    A, B, C = (torch.randn(*s, dtype=torch.float64) for s in [(2, 30), (30, 30), (30, 2)])
    torch.testing.assert_close(compile_quiet(text)(A, B, C), A @ B @ C, **F64)


# ---- seeds, dtypes, devices ------------------------------------------------------------------


def test_seed_determinism():
    a, b, c = (compile_quiet(MLP, seed=s) for s in (7, 7, 8))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
    # reset_parameters with a generator reproduces the seeded initialisation
    b.reset_parameters(torch.Generator().manual_seed(8))
    for k, v in b.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k


def test_init_specs():
    text = """\
dim a = 3, b = 5
input x[a]
param N[a, b] ~ normal(std=2, mean=10)
param Z[a, b] ~ zeros
param O[a, b] ~ ones
param K[a, b] ~ constant(value=0.5)
param U[a, b] ~ uniform(a=-0.1, b=0.1)
param X[a, b] ~ xavier
param I[a, a] ~ eye
y = einsum('a,ab->b', x, N + Z + O + K + U + X)
z = einsum('a,ab->b', x, I)
output y, z
"""
    m = compile_quiet(text, seed=0)
    assert torch.equal(m.Z, torch.zeros(3, 5)) and torch.equal(m.O, torch.ones(3, 5))
    assert torch.equal(m.K, torch.full((3, 5), 0.5)) and torch.equal(m.I, torch.eye(3))
    assert m.U.abs().max() <= 0.1 and 5 < m.N.mean() < 15
    assert m.X.abs().max() <= math.sqrt(6 / (3 + 5))


def test_dtype_conversions_run():
    m = compile_quiet(ATTENTION, seed=0)
    x = torch.randn(2, 5, 8)
    assert m.double()(x.double()).dtype == torch.float64
    mb = compile_quiet(ATTENTION, seed=0).to(torch.bfloat16)
    assert mb(x.to(torch.bfloat16)).dtype == torch.bfloat16
    norms = "dim t = 3, e = 4\ninput x[t, e]\nparam g[e] ~ ones\ny = rmsnorm(layernorm(x, e, weight=g), e, weight=g)\noutput y\n"
    n16 = compile_quiet(norms).to(torch.bfloat16)
    assert n16(torch.randn(3, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_device_follows_the_inputs():
    # masks are built on the inputs' device: on 'meta' nothing is computed, only shapes
    m = compile_quiet(MASKED, seed=0).to("meta")
    y = m(torch.empty(2, 4, 4, device="meta"))
    assert y.device.type == "meta" and y.shape == (2, 4, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    m = compile_quiet(ATTENTION, seed=0).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(m.cuda()(x.cuda()).cpu(), attention_reference(m.cpu(), x), **F64)


# ---- standalone source, torch.compile, torch.export ------------------------------------------


MASKED = """\
dim t = 4, p = 4, e = 3
input s[t, p]
param W[p, e]
a = where(block_causal(t, p, block=2), s, -inf)
b = where(causal(t, p), exp(a), 0.0)
y = einsum('tp,pe->te', b, W)
output y
"""

COMPILE_CASES = {  # name -> (text, input name, input shape)
    "attention": (ATTENTION, "Z", (2, 5, 8)),  # fused into scaled_dot_product_attention
    "masked": (MASKED, "s", (2, 4, 4)),  # masks built in forward
    "mlp": (MLP, "x", (2, 4, 6)),
    "multi": (MULTI, "x", (2, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_standalone_source_file(name):
    text, arg, shape = COMPILE_CASES[name]
    source = assert_standalone_same(text, {arg: torch.randn(*shape, dtype=torch.float64)})
    assert imported_modules(source) <= {"torch", "collections", "math"}  # collections only for several outputs
    assert "penrose" not in source.replace("Generated by penrose", "")


def test_standalone_shape_error_is_a_value_error(tmp_path):
    mod = import_source(penrose.source(MULTI), tmp_path)
    with pytest.raises(ValueError, match="'x' leg 'e' must have size 4, got 5"):
        mod.Model()(torch.randn(3, 5))


def test_multi_output_is_a_named_tuple():
    m = compile_quiet(MULTI, seed=0)
    out = m(torch.randn(3, 4))
    assert out._fields == ("y", "c")
    assert out.c.shape == (3,) and out.y.shape == (3, 4)


@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_torch_compile_fullgraph(name):
    text, _, shape = COMPILE_CASES[name]
    m = compile_quiet(text, seed=0).eval()
    x = torch.randn(*shape)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    a, b = m(x), compiled(x)
    if isinstance(a, tuple):
        assert type(a) is type(b)  # the named tuple survives compilation
    torch.testing.assert_close(tuple(a) if isinstance(a, tuple) else a, tuple(b) if isinstance(b, tuple) else b)


@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_torch_export(name):
    text, _, shape = COMPILE_CASES[name]
    m = compile_quiet(text, seed=0).eval()
    x = torch.randn(*shape)
    exported = torch.export.export(m, (x,))
    a, b = m(x), exported.module()(x)
    if isinstance(a, tuple):
        assert tuple(a._fields) == ("y", "c")
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v)
    else:
        torch.testing.assert_close(a, b)


def test_export_leaves_the_module_eager():
    # regression: masks cached during export's trace were fake tensors, returned by later eager calls
    m = compile_quiet(MASKED, seed=0).eval()
    x = torch.randn(2, 4, 4)
    want = m(x)
    torch.export.export(m, (x,))
    got = m(x)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, want)


def test_inference_mode_then_training():
    # regression: a mask or RoPE table cached under inference_mode could not be saved for backward
    text = "dim t = 4, p = 4\ninput s[t, p]\ny = rope(where(causal(t, p), s, 0.0), t, p)\noutput y\n"
    m = compile_quiet(text)
    x = torch.randn(2, 4, 4, requires_grad=True)
    with torch.inference_mode():
        m(x.detach())
    m(x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
