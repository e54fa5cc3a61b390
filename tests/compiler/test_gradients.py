"""The generated backward (penrose.gradients) against autograd.

`GradientPlan(module)` runs a compiled diagram without autograd and gives its parameters'
gradients for given output gradients. Checked in float64 against the compiled module (the
outputs) and torch.autograd (the gradients): on every zoo diagram it covers, on programs written
for each rule (broadcasting over batch dims, legs in other orders, plain numbers, contractions of
one to three operands), on drawn programs (tests/program_strategies.py), and the refusals: a
diagram with an operation the plan has no rule for raises NoGeneratedBackward at that line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose
from penrose import ops
from penrose.gradients import VJP, GradientPlan, NoGeneratedBackward
from program_strategies import programs
from test_differential import _FAST, ATOL, RTOL, _load_quiet, _values, free_roots, make_inputs, run

pytestmark = pytest.mark.usefixtures("one_thread")

ZOO = Path(__file__).resolve().parents[2] / "zoo"
#: zoo diagrams the plan refuses, and the operation it names
REFUSED = {
    "causal_self_attention.pen": "causal",
    "neural_additive_model.pen": "dropout",
    "topk_sparse_autoencoder.pen": "topk",
}


def agree(text: str, batch=(3,), uniform: bool = True, seed: int = 0, reject=None, **sizes) -> GradientPlan:
    """The plan's outputs are the compiled module's and its parameter gradients autograd's, for a
    random weighting of the outputs (float64)."""
    checked, compiled = _load_quiet(text, **sizes)
    compiled = compiled.double()
    plan = GradientPlan(compiled)
    inputs = make_inputs(checked, batch, seed, uniform, {root: 3 for root in free_roots(checked)})
    params = dict(compiled.named_parameters())
    outs, _ = run(compiled, inputs, params)
    g = torch.Generator().manual_seed(seed + 1)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    outs, grads = run(compiled, inputs, params, weights)
    if reject is not None:
        reject(all(bool(torch.isfinite(t).all()) for t in (*outs, *grads) if t.is_floating_point()))
    n_float_inputs = sum(1 for v in inputs.values() if v.is_floating_point())
    want = dict(zip(params, grads[n_float_inputs:]))
    tape = plan.forward(**inputs)
    assert len(tape.outputs) == len(outs)
    seeds: dict = {}
    for (name, _), o, w in zip(checked.outputs, outs, weights):
        torch.testing.assert_close(tape[name] if len(outs) > 1 else tape.outputs[0], o, rtol=RTOL, atol=ATOL, equal_nan=True)
        if o.is_floating_point():
            seeds[name] = w if name not in seeds else seeds[name] + w
    got = tape.backward(seeds)
    assert set(got) == {n for n, p in params.items() if p.requires_grad}
    for name, g_want in want.items():
        g_got = got[name] if got[name] is not None else torch.zeros_like(g_want)
        assert g_got.shape == g_want.shape, f"gradient of {name}: shape {tuple(g_got.shape)}, autograd's {tuple(g_want.shape)}"
        torch.testing.assert_close(g_got, g_want, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"gradient of {name}: {m}")
    return plan


@pytest.mark.parametrize("path", sorted(p.name for p in ZOO.glob("*.pen")))
@pytest.mark.parametrize("batch, uniform", [((4,), True), ((2, 3), True), ((2, 3), False), ((), True)])
def test_zoo_diagrams(path, batch, uniform):
    text = (ZOO / path).read_text()
    if path in REFUSED:
        with pytest.raises(NoGeneratedBackward, match=REFUSED[path]) as e:
            agree(text, batch, uniform)
        assert e.value.line > 0, "a refusal points at the diagram's line"
        return
    agree(text, batch, uniform)


RULES = {
    # element-wise functions, with kinks at 0 among the inputs (make_inputs draws normals; 0 via relu)
    "unary": "dim a = 3, b = 4\ninput x[a]\nparam W[a, b] ~ normal\nh = einsum('a,ab->b', x, W)\n"
             "y = sigmoid(h) + tanh(h) + exp(h / 4) + log(1 + h * h) + sqrt(1 + h * h) + abs(h) + relu(h)"
             " + leaky_relu(h, slope=0.2) + elu(h, alpha=0.5) + softplus(h) + gelu(h) + silu(h) + clamp_min(h, 0.1)\noutput y",
    "operators": "dim a = 3, b = 4\ninput x[a]\nparam W[a, b] ~ normal\nparam v[b] ~ normal\nparam s[] ~ normal\n"
                 "h = einsum('a,ab->b', x, W)\ny = (h - v) * v / (2 + v * v) - h ** 2 + -h * s + 3 / (4 + h * h)\noutput y",
    # the second operand on other legs, in another order, and batched where the first is not
    "aligned": "dim a = 3, b = 4\ninput x[a, b]\nparam W[b, a] ~ normal\nparam u[a] ~ normal\n"
               "y = x * W + u\nz = W - x\noutput y, z",
    "where": "dim a = 3, b = 4\ninput x[a]\ninput m[b] : bool\nparam W[a, b] ~ normal\nparam v[b] ~ normal\n"
             "h = einsum('a,ab->b', x, W)\ny = where(m, h, v) + where(h > 0, h, 0.5) + where(m, 1.0, v)\noutput y",
    "reductions": "dim a = 3, b = 4\ninput x[a]\nparam W[a, b] ~ normal\nh = einsum('a,ab->ab', x, W)\n"
                  "y = sum(h, b) + sum(softmax(h, b) * W, b)\nw = mean(h, a)\nz = log_softmax(h, a)\noutput y, w, z",
    "clamp_detach": "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = clamp(x * w, min=-0.5, max=0.5) + detach(w) * w + clamp(w, min=0)\noutput y",
    "einsum_shapes": "dim a = 3, b = 4, c = 2, d = 5\ninput x[a, b]\nparam W[b, c, d] ~ normal\nparam U[d, a] ~ normal\n"
                     "param V[c] ~ normal\ny = einsum('ab,bcd->acd', x, W)\nz = einsum('ab,bcd,da->c', x, W, U)\n"
                     "t = einsum('acd,c->ad', y, V)\nu = einsum('ab,bcd->d', x, W)\noutput y, z, t, u",
    # a label only one operand has, summed: its gradient spreads along it
    "summed_label": "dim a = 3, b = 4, c = 2\ninput x[a]\nparam W[a, b, c] ~ normal\ny = einsum('a,abc->a', x, W)\noutput y",
    # the batch summed between two batched operands
    "batch_summed": "dim a = 3, b = 4\ninput x[..., a]\ninput z[..., b]\nparam W[a, b] ~ normal\n"
                    "g = einsum('...a,...b->ab', x, z) * W\noutput g",
    "reassigned": "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = x * w\ny = y * w + y\ny = sigmoid(y)\noutput y",
    "outer_and_weights": "dim a = 3, b = 2\ninput x[a]\nparam W[a, b] ~ normal\nparam u[b] ~ normal\n"
                         "o = einsum('a,b->ab', x, u)\ny = einsum('ab,ab->b', o, W)\noutput y, o",
}


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("batch, uniform", [((3,), True), ((2, 3), False), ((), True)])
def test_each_rule(name, batch, uniform):
    agree(RULES[name], batch, uniform)


def test_vjp_rows_are_rows_of_the_table():
    assert set(VJP) <= ops.ELEMENTWISE


@pytest.mark.parametrize("name", sorted(VJP))
def test_each_derivative_is_autograds(name):
    """Each VJP entry against autograd through the torch callable the compiler emits, on points
    that include the kinks (0, and the row's bound)."""
    row = ops.OPS[name]
    fn = penrose.gradients._callable(row.torch)
    kw = [k.default if k.default is not None else 0.25 for k in row.keywords]
    x = torch.tensor([-3.0, -1.0, -0.25, 0.0, 0.25, 0.1, 1.0, 3.0, 25.0], dtype=torch.float64)
    if name in ("log", "sqrt"):
        x = x.abs() + 0.5
    leaf = x.clone().requires_grad_(True)
    y = fn(leaf, *kw)
    g = torch.linspace(-1, 1, x.numel(), dtype=torch.float64)
    (want,) = torch.autograd.grad(y, leaf, g)
    got = VJP[name](g, x, y.detach(), *kw)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


REFUSALS = {
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = dropout(x * w, p=0.5)\noutput y": ("dropout", 4),
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = layernorm(x * w, a)\noutput y": ("layernorm", 4),
    "dim a = 3\ninput x[a]\nparam W[a, a] ~ normal\ny = einsum('aa->a', W) * x\noutput y": ("repeated label", 4),
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = x ** w\noutput y": ("tensor exponent", 4),
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = mish(x * w)\noutput y": ("mish", 4),
}


@pytest.mark.parametrize("text", sorted(REFUSALS))
def test_refusals_name_the_operation_and_line(text):
    what, line = REFUSALS[text]
    with pytest.raises(NoGeneratedBackward, match=what) as e:
        GradientPlan(penrose.compile(text=text))
    assert e.value.line == line


def test_an_operation_without_a_rule_is_fine_where_no_gradient_passes():
    """mish has no derivative rule, but on a buffer-only branch no gradient is asked of it."""
    text = ("dim a = 3\ninput x[a]\nparam w[a] ~ normal\nbuffer s[a] ~ ones\n"
            "y = x * w + mish(s) + einsum('aa->a', einsum('a,b->ab', s, s))\noutput y")
    agree(text)


def test_frozen_parameters_get_no_gradient_and_plans_follow_requires_grad():
    text = "dim a = 3\ninput x[a]\nparam w[a] ~ normal\nparam v[a] ~ normal\ny = x * w * v\noutput y"
    m = penrose.compile(text=text).double()
    m.v.requires_grad_(False)
    plan = GradientPlan(m)
    assert set(plan.params) == {"w"}
    tape = plan.forward(x=torch.randn(2, 3, dtype=torch.float64))
    assert set(tape.backward({"y": torch.ones(2, 3, dtype=torch.float64)})) == {"w"}


def test_backward_names_a_wrong_output_and_needs_the_inputs():
    m = penrose.compile(text="dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = x * w\noutput y")
    plan = GradientPlan(m)
    with pytest.raises(TypeError, match="missing input 'x'"):
        plan.forward()
    tape = plan.forward(torch.randn(2, 3))
    with pytest.raises(KeyError, match="'z' is not an output"):
        tape.backward({"z": torch.ones(2, 3)})
    assert tape.backward({"y": None}) == {"w": None}


def test_a_module_not_compiled_by_penrose_is_refused():
    with pytest.raises(TypeError, match="compiled by penrose"):
        GradientPlan(torch.nn.Linear(2, 2))


_PLANNED = {"n": 0}


@settings(max_examples=200, **_FAST)
@given(programs(), st.sampled_from([(), (2,), (1, 2)]), st.booleans())
def test_drawn_programs(program, batch, uniform):
    """Every drawn program is planned and agrees with autograd, or is refused naming an
    operation the program holds (at a line of it)."""
    from hypothesis import assume

    try:
        agree(program.text, batch, uniform, reject=assume)
    except NoGeneratedBackward as e:
        message = e.message
        checked = penrose.load(text=program.text)
        held = {v.key or v.op for body in (checked, *checked.blocks.values()) for s in body.stmts
                if s.value is not None for v in _values(s.value)} | {"block call", "several tensors", "sizes"}
        assert any(word in message for word in held) or "repeated label" in message or "exponent" in message, message
        assert e.line > 0 or "block" in message, message
