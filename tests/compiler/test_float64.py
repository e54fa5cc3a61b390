"""Every operation keeps float64 in float64 and passes torch.autograd.gradcheck (issue 23).

`rope` and `rmsnorm` computed in float32 even in a float64 model (5e-8 relative error, and
gradcheck failed on them). Each operation of the table (penrose.ops.OPS) has a small program
here; its compiled module, converted to float64, runs gradcheck with respect to every float
input and every parameter, its outputs are float64, and the interpreter gives the same values.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import penrose
from penrose.ops import OPS

HEAD = "dim a = 3, b = 4, p = 3, v = 5, s = 1, r = 3, h = 2, k = 2, q = 2\ndim ab = a * b, hk = h * k\n"
XY = "input x[a, b]\ninput y[a, b]\n"

UNARY = ["sigmoid", "sigma", "relu", "gelu", "silu", "tanh", "exp", "abs", "softplus"]

PROGRAMS = {
    **{f: XY + f"z = {f}(x) + y" for f in UNARY},
    "log": XY + "z = log(x * x + 1) + y",
    "sqrt": XY + "z = sqrt(x * x + 1) + y",
    "leaky_relu": XY + "z = leaky_relu(x, slope=0.1) + y",
    "+": XY + "z = x + y",
    "-": XY + "z = x - y",
    "*": XY + "z = x * y",
    "/": XY + "z = x / (y * y + 1)",
    "//": XY + "z = x // 0.7 + x * y",
    "**": XY + "z = (x * x + 1) ** y",
    **{c: XY + f"z = where(x {c} y, x, y * 2)" for c in ("<", "<=", ">", ">=", "==", "!=")},
    "neg": XY + "z = -x * y",
    "einsum": XY + "z = einsum('ab,ab->a', x, y)",
    "softmax": XY + "z = softmax(x, b) * y",
    "log_softmax": XY + "z = log_softmax(x, b) * y",
    "layernorm": XY + "param g[b]\nparam o[b]\nz = layernorm(x, b, weight=g, bias=o) * y",
    "rmsnorm": XY + "param g[b]\nz = rmsnorm(x, b, weight=g) * y",
    "topk": XY + "z = topk(x, b, k=2) * y",
    "topk_mask": XY + "z = where(topk_mask(x, b, k=2), x, y)",
    "sum": XY + "z = sum(x * y, b)",
    "mean": XY + "z = mean(x * y, b)",
    "max": XY + "z = max(x * y, b)",
    "min": XY + "z = min(x * y, b)",
    "mish": XY + "z = mish(x) + y",
    "hardswish": XY + "z = hardswish(x) + y",
    "elu": XY + "z = elu(x, alpha=0.7) + y",
    "clamp_min": XY + "z = clamp_min(x, -0.5) * y",
    "dropout": XY + "z = dropout(x, p=0.1) * y",
    "detach": XY + "z = detach(x) * y",
    "clamp": XY + "z = clamp(x, min=-0.5, max=0.5) * y",
    "where": XY + "z = where(x > 0, x, y)",
    "causal": "input x[a, p]\nz = where(causal(a, p), x, -x)",
    "block_causal": "input x[a, p]\nz = where(block_causal(a, p, block=2), x, x * 3)",
    "gather": "input ids[a] : int\nparam E[v, b]\nz = gather(E, ids)",
    "split": "input x[a, b]\nu, w = split(x, b, [s, r])\nz = einsum('as,ar->ar', u, w)",
    "concat": "input x[a, s]\ninput y[a, r]\nz = concat([x, tanh(y)], s, b)",
    "flatten": "input x[a, b]\nz = flatten(x, [a, b], ab)",
    "unflatten": "input x[a, hk]\nz = unflatten(x, hk, [h, k])",
    "rearrange": "input x[a, hk]\nz = rearrange(x, 'a (h k) -> k a h')",
    "reduce": "input x[a, b]\nz = reduce(x, 'a b -> b', 'prod')",
    "repeat": "input x[a, b]\nz = repeat(x, 'a b -> a q b') * 2",
    "select": "input x[a, b]\nz = select(x, a, -1) * 3",
    "slice": "input x[a, b]\nz = slice(x, b, 1, r)",
    "rope": "dim t = 3, d = 4\ninput x[t, d]\nz = rope(x, t, d)",
    "arange": XY + "z = x * arange(b) + y",
}


def _program(op: str) -> str:
    return HEAD + PROGRAMS[op] + "\noutput z\n"


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _ops_of(checked) -> set:
    found, stack = set(), [s.value for s in checked.stmts if s.value is not None]
    while stack:
        v = stack.pop()
        k = v.key
        if k is not None:
            found.add(k)
        stack.extend(v.args)
    return found


def test_every_operation_has_a_program():
    covered = set()
    for op in PROGRAMS:
        ops = _ops_of(_quiet(penrose.load, _program(op)))
        assert op in ops, f"the program for {op!r} does not use it: {sorted(ops)}"
        covered |= ops
    missing = sorted(set(OPS) - covered)
    assert not missing, f"operations without a float64 gradcheck program: {missing}"


def _inputs(checked, g):
    out = {}
    for d in checked.inputs:
        shape = tuple(checked.size(c) for c in d.type.cls)
        if d.tensor.dtype == "int":
            out[d.tensor.name] = torch.randint(0, 5, shape, generator=g)
        else:
            out[d.tensor.name] = torch.randn(shape, generator=g, dtype=torch.float64)
    return out


@pytest.mark.parametrize("op", sorted(PROGRAMS))
def test_gradcheck_in_float64(op):
    text = _program(op)
    checked = _quiet(penrose.load, text)
    module = _quiet(penrose.compile, text, seed=0).double().eval()
    g = torch.Generator().manual_seed(1)
    inputs = _inputs(checked, g)
    floats = [k for k, v in inputs.items() if v.is_floating_point() and not (op == "detach" and k == "x")]
    params = dict(module.named_parameters())

    def fn(*leaves):
        xs = dict(inputs)
        xs.update(zip(floats, leaves[: len(floats)]))
        state = dict(zip(params, leaves[len(floats):]))
        return torch.func.functional_call(module, state, (), xs)

    leaves = [inputs[k].clone().requires_grad_(True) for k in floats] + [p.detach().clone().requires_grad_(True) for p in params.values()]
    out = fn(*leaves)
    assert out.dtype == torch.float64, f"{op}: a float64 model gave {out.dtype}"
    assert torch.autograd.gradcheck(fn, tuple(leaves), eps=1e-6, atol=1e-5, rtol=1e-4)  # detach: not through x
    # the interpreter computes the same float64 numbers
    interp = _quiet(penrose.interpret, text, **inputs, params={k: v.detach() for k, v in module.state_dict().items()})
    assert interp.dtype == torch.float64
    torch.testing.assert_close(interp, out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["rope", "rmsnorm"])
def test_float64_is_not_rounded_to_float32(op):
    """The values agree with a float64 reference to float64 precision, far beyond float32's."""
    text = _program(op)
    module = _quiet(penrose.compile, text, seed=0).double()
    g = torch.Generator().manual_seed(2)
    checked = _quiet(penrose.load, text)
    inputs = _inputs(checked, g)
    out = module(**inputs)
    if op == "rmsnorm":
        x, y, w = inputs["x"], inputs["y"], module.g
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w * y
    else:
        x = inputs["x"]
        n = x.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, n, 2, dtype=torch.float64) / n))
        ang = torch.arange(x.shape[0], dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], -1)
        first, second = x.chunk(2, -1)
        want = x * ang.cos() + torch.cat([-second, first], -1) * ang.sin()
    torch.testing.assert_close(out, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_upcasts_inside_and_returns_its_dtype(dtype):
    for op in ("rope", "rmsnorm"):
        text = _program(op)
        module = _quiet(penrose.compile, text, seed=0).to(dtype)
        checked = _quiet(penrose.load, text)
        inputs = {k: v.to(dtype) for k, v in _inputs(checked, torch.Generator().manual_seed(3)).items()}
        out = module(**inputs)
        assert out.dtype == dtype
        ref = _quiet(penrose.compile, text, seed=0).double()
        want = ref(**{k: v.double() for k, v in inputs.items()})
        torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_floor_division_has_a_zero_gradient_everywhere():
    """`x // 0.7` of a tensor that needs gradients: torch has no derivative for floor_divide, so
    backward raised in the compiled module and in the interpreter; its gradient is zero."""
    text = "dim a = 3\ninput x[a]\nz = x // 0.7 + x\noutput z\n"
    x = torch.tensor([0.5, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    for run in (_quiet(penrose.compile, text).double(), lambda x: _quiet(penrose.interpret, text, x)):
        (grad,) = torch.autograd.grad(run(x).sum(), x)
        assert torch.equal(grad, torch.ones(3, dtype=torch.float64))
        assert torch.equal(run(x).detach(), torch.floor(x.detach() / 0.7) + x.detach())
