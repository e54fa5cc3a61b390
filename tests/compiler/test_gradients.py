"""The generated backward (penrose.gradients) against autograd.

`GradientPlan(module)` runs a compiled diagram without autograd and gives its parameters'
gradients for given output gradients. Checked in float64 against the compiled module (the
outputs) and torch.autograd (the gradients): on every zoo diagram it covers, on programs written
for each rule (broadcasting over batch dims, legs in other orders, plain numbers, contractions of
one to three operands), on drawn programs (tests/program_strategies.py), and the refusals: a
diagram with an operation the plan has no rule for raises NoGeneratedBackward at that line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose
from penrose import ops
from penrose import pyast as P
from penrose.attrs import Unary
from penrose.checked import V
from penrose.errors import PenroseShapeError
from penrose.gradients import KERNELS, GradientPlan, NoGeneratedBackward
from program_strategies import programs
from test_differential import _FAST, ATOL, RTOL, _load_quiet, _values, free_roots, make_inputs, run

pytestmark = pytest.mark.usefixtures("one_thread")

ZOO = Path(__file__).resolve().parents[2] / "zoo"
#: zoo diagrams the plan refuses, and the operation it names
REFUSED = {
    "neural_additive_model.pen": "dropout in training",  # a module in training mode draws its mask when it runs
}


def agree(text: str, batch=(3,), uniform: bool = True, seed: int = 0, reject=None, training: bool = True,
          **sizes) -> GradientPlan:
    """The plan's outputs are the compiled module's and its parameter gradients autograd's, for a
    random weighting of the outputs (float64), the module in training mode or not."""
    checked, compiled = _load_quiet(text, **sizes)
    compiled = compiled.double().train(training)
    plan = GradientPlan(compiled)
    inputs = make_inputs(checked, batch, seed, uniform, {root: 3 for root in free_roots(checked)})
    params = dict(compiled.named_parameters())
    try:
        outs, _ = run(compiled, inputs, params)
    except PenroseShapeError:  # inputs the module refuses (a slice past a leg sized by them): so does the plan
        if reject is None:
            raise
        with pytest.raises(PenroseShapeError):
            plan.forward(**inputs)
        reject(False)
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
    # shape operations, norms, masks, lookups
    'masks': 'dim t = 4\ninput x[t, t]\nparam w[t, t] ~ normal\ny = where(causal(t, t), x * w, 0.0) + where(block_causal(t, t, block=2), w, -1.0)\noutput y',
    'flatten_unflatten': 'dim a = 2, b = 3, n = a * b\ninput x[a, b]\nparam W[n] ~ normal\nparam U[a, b] ~ normal\ny = flatten(x * U, [a, b], n) * W\nz = unflatten(W, n, [a, b]) * x\noutput y, z',
    'select_slice': 'dim a = 4, b = 3, s = 2\ninput x[a, b]\nparam W[a, b] ~ normal\ny = select(x * W, a, 1) + select(W, a, -1)\nz = slice(W * x, a, 1, s) + slice(W, a, -2, s)\noutput y, z',
    'concat': 'dim a = 2, b = 3, n = a + b\ninput x[a]\nparam u[b] ~ normal\nparam v[a] ~ normal\ny = concat([x * v, u], a, n)\nz = concat([u, v], b, n)\noutput y, z',
    'split': 'dim a = 2, b = 3, n = a + b\ninput x[n]\nparam W[n] ~ normal\nh, k = split(x * W, n, [a, b])\ny = sum(h * h, a) + sum(k, b)\nu, v = split(W, n, [b, a])\noutput y, v',
    'minmax': 'dim a = 3, b = 4\ninput x[a, b]\nparam W[a, b] ~ normal\nparam v[b] ~ normal\nh = x * W\ny = max(h, b) + min(h, b) + max(h, v) + min(v, h) + max(h, 0.1) + min(0.2, h)\nt = max(v * 0, b) + max(v * 0, v * 0 + 0.0) + min(v - v, 0.0)\noutput y, t',
    'gather': 'dim v = 5, e = 3\ninput ids[] : int\ninput i2[] : int\nparam E[v, e] ~ normal\nparam T[v] ~ normal\ny = gather(E, ids) * gather(E, i2) + gather(T, ids)\noutput y',
    'layernorm': 'dim a = 3, b = 4\ninput x[a, b]\nparam W[a, b] ~ normal\nparam g[a] ~ normal\nparam c[a] ~ normal\nparam g2[b] ~ normal\nh = x * W\ny = layernorm(h, a, weight=g, bias=c) + layernorm(h, b, weight=g2)\nz = layernorm(h, b, bias=g2, eps=0.1)\noutput y, z',
    'rmsnorm': 'dim a = 3, b = 4\ninput x[a, b]\nparam W[a, b] ~ normal\nparam g[a] ~ normal\nparam g2[b] ~ normal\nh = x * W\ny = rmsnorm(h, a, weight=g) + rmsnorm(h, b, weight=g2)\nz = rmsnorm(h, b, eps=0.1)\noutput y, z',
    'rope': 'dim t = 3, e = 4\ninput x[t, e]\nparam W[t, e] ~ normal\nparam U[e, t] ~ normal\ny = rope(x * W, t, e)\nz = rope(U, t, e, base=100)\noutput y, z',
    'topk': 'dim a = 5\ninput x[a]\nparam w[a] ~ normal\ny = topk(x * w, a, k=2) + where(topk_mask(w, a, k=3), w, 0)\noutput y',
    'einops': "dim a = 2, b = 3, n = a * b\ninput x[a, b]\nparam W[a, b] ~ normal\nparam u[b] ~ normal\ny = rearrange(x * W, 'a b -> (b a)')\nz = reduce(x * W, 'a b -> b', 'max') * reduce(W, 'a b -> b', 'prod')\nr = repeat(u, 'b -> a b') * x\nm = reduce(x * W, '... a b -> a', 'mean') + reduce(W, '(a) b -> a', 'min')\nq = rearrange(unflatten(y, n, [b, a]), 'b a -> a b 1') + reduce(relu(W), 'a b -> b', 'prod') + reduce(W * 0, 'a b -> b', 'max')\noutput y, z, r, m, q",
    'einsum_diagonal': "dim a = 3, b = 2\ninput x[a]\nparam W[a, a] ~ normal\nparam V[a, b, a] ~ normal\ny = einsum('aa->a', W) * x + einsum('aa,a->a', W, x)\nz = einsum('aba,a->b', V, x)\noutput y, z",
    'mish_hardswish': 'dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = mish(x * w) + hardswish(3 * x * w)\noutput y',
    'tensor_exponent': 'dim a = 3\ninput x[a]\nparam w[a] ~ normal\nparam u[a] ~ normal\ny = (1 + x * x) ** w + 2 ** (w * x) + relu(x) ** u\noutput y',
    'block_returns': 'dim a = 3\nblock two(x[a]) {\n  param w[a] ~ normal\n  return x * w, x + w\n}\ninput x[a]\nh, k = two(x) as t\ny = h * k\noutput y',
    # bugs the drawn programs found, each a case
    # a label on a size-1 leg broadcast against a longer one: torch.einsum, not a matrix product
    "einsum_broadcast_label": "dim b = 3, d = 1, r = 2\ninput x[r]\nparam W[b, d] ~ normal\nparam V[d] ~ normal\n"
                              "y = einsum('jr,r->r', W, x) + einsum('r,r->r', V, x)\noutput y",
    # every operand a plain number but one, the result a number: the product's reshape had no sizes
    "einsum_scalar_terms": "dim f = 2\ninput x[f]\nparam s[] ~ normal\ny = einsum('f,->', x, s)\nz = einsum(',f->', s, x)\noutput y, z",
    # rmsnorm's weight gradient on an operand without batch legs (a sum over no dims sums all)
    "rmsnorm_unbatched": "dim a = 3, b = 4\ninput x[b]\nparam W[a, b] ~ normal\nparam v[b] ~ normal\nparam g[b] ~ normal\n"
                         "y = einsum('ab,b->a', rmsnorm(W, b, weight=g), x) + sum(rmsnorm(v, b, weight=g) * x, b)\noutput y",
    # where of two plain numbers is a float tensor in the model's dtype (was int64, or float32)
    "where_of_numbers": "dim m = 4\nbuffer B1[m] ~ normal(std=0.5)\nbuffer B2[] ~ normal(std=0.5)\ninput X4[...]\nparam w[m] ~ normal\n"
                        "h3 = where(B1 <= B2, 0, 0)\nh4 = where(B1 <= X4, 1, 0.5) * w\noutput h3, h4, X4",
    # a param nothing reads is in the gradients (None), as autograd's zeros
    "unread_param": "dim a = 3\ninput x[a]\nparam w[a] ~ normal\nparam unused[a] ~ normal\ny = x * w\noutput y",
    # masks sized by the inputs (their free legs read at run time)
    "masks_free_sizes": "dim t, s\ndim e = 2\ninput x[t, t]\ninput z[..., s, s, e]\nparam w[e] ~ normal\n"
                        "y = where(causal(t, t), x, 0.0) + where(block_causal(t, t, block=2), x, -1.0)\n"
                        "h = where(causal(s, s), einsum('sre,e->sr', z, w), 0.0)\noutput y, h",
    # arange in a diagram with no float input takes the params' dtype, as compiled (the fuzzer's case: was int64)
    "arange_without_float_inputs": "dim e = 2, r = 3\ninput ids[] : int\nparam W[r, e] ~ normal\n"
                                   "h = gather(W, ids) * arange(e)\nk = arange(e)\noutput h, k",
}


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("batch, uniform", [((3,), True), ((2, 3), False), ((), True)])
def test_each_rule(name, batch, uniform):
    agree(RULES[name], batch, uniform)


def test_every_elementwise_row_has_a_derivative():
    """The generated backward reads an element-wise function's derivative from its row: every
    row the compiler lowers has one (a row without is refused where a gradient passes)."""
    assert [n for n in sorted(ops.ELEMENTWISE) if ops.OPS[n].vjp is None] == []


@pytest.mark.parametrize("name", sorted(ops.ELEMENTWISE))
def test_each_derivative_is_autograds(name):
    """Each row's derivative against autograd through the torch callable the compiler emits, on
    points that include the kinks (0, and the row's bound); and the expression the generated
    backward writes out for it computes the same numbers."""
    row = ops.OPS[name]
    assert row.torch is not None and row.vjp is not None
    fn = penrose.gradients._callable(row.torch)
    kw = {k.name: k.default if k.default is not None else 0.25 for k in row.keywords}
    x = torch.tensor([-3.0, -1.0, -0.25, 0.0, 0.25, 0.1, 1.0, 3.0, 25.0], dtype=torch.float64)
    if name in ("log", "sqrt"):
        x = x.abs() + 0.5
    leaf = x.clone().requires_grad_(True)
    y = fn(leaf, *kw.values())
    g = torch.linspace(-1, 1, x.numel(), dtype=torch.float64)
    (want,) = torch.autograd.grad(y, leaf, g)
    got = row.vjp(g, x, y.detach(), KERNELS, **kw)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (vjp,) = penrose.gradients._rule_unary(V("unary", attrs=Unary(name, tuple(kw.items()))))[1]
    written = P.unparse(vjp.inline(P.name("closure"), P.name("g"), P.name("y"), P.name("x")))
    assert "closure" not in written  # the expression itself, not a call of the closure
    torch.testing.assert_close(eval(written, {"torch": torch, "g": g, "x": x, "y": y.detach()}), want, rtol=1e-12, atol=1e-12)


REFUSALS = {
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = dropout(x * w, p=0.5)\noutput y": ("dropout in training", 4),
    "dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = dropout(x, p=0.5) * w\noutput y": ("dropout in training", 4),
    # a mask in a block, of a leg whose size only the inputs give (read from them only at the top level)
    "dim e\nblock b(x[e]) {\n  return where(causal(e, e), 1.0, 0.0)\n}\ninput x[e]\ny = b(x) as i\noutput y": ("inputs' sizes", 3),
}


@pytest.mark.parametrize("batch, uniform", [((3,), True), ((2, 3), False), ((), True)])
def test_dropout_in_eval_mode_is_the_identity(batch, uniform):
    """Planned in the module's mode when planning: in eval mode dropout passes values and gradients."""
    agree("dim a = 3\ninput x[a]\nparam w[a] ~ normal\ny = dropout(x * w, p=0.5) + dropout(w, 0.2) * x\noutput y",
          batch, uniform, training=False)
    agree((ZOO / "neural_additive_model.pen").read_text(), batch, uniform, training=False)


@pytest.mark.parametrize("text", sorted(REFUSALS))
def test_refusals_name_the_operation_and_line(text):
    what, line = REFUSALS[text]
    with pytest.raises(NoGeneratedBackward, match=what) as e:
        GradientPlan(penrose.compile(text=text))
    assert e.value.line == line


def test_inputs_the_module_refuses_the_plan_refuses():
    """A slice of a leg only the inputs size, past its end: the compiled module's ShapeError, from the plan too."""
    m = penrose.compile(text="dim s\ndim k = 2\ninput x[s]\ny = slice(x, s, 1, k)\noutput y")
    plan = GradientPlan(m)
    for module in (m, plan.forward):
        with pytest.raises(PenroseShapeError, match="slice of leg 's': indices 1 to 2"):
            module(torch.randn(2))
    torch.testing.assert_close(plan.forward(torch.arange(4.0)).outputs[0], torch.tensor([1.0, 2.0]))


def test_a_split_nobody_reads_is_not_made():
    """As compiled (and interpreted): an unread split's operand is not evaluated, so its ids are not checked."""
    text = ("dim v = 5, a = 2, b = 3, n = a + b\ninput ids[] : int\nparam E[v, n] ~ normal\ninput x[n]\nparam w[n] ~ normal\n"
            "h, k = split(gather(E, ids), n, [a, b])\ny = x * w\noutput y")
    m = penrose.compile(text=text)
    ids, x = torch.tensor([7]), torch.randn(1, 5)
    torch.testing.assert_close(GradientPlan(m).forward(ids=ids, x=x).outputs[0], m(ids=ids, x=x))


def test_an_operation_without_a_rule_is_fine_where_no_gradient_passes(monkeypatch):
    """A function whose row has no derivative (mish's taken out here) is refused where a gradient
    passes through it, and planned on a buffer-only branch, where none is asked of it."""
    monkeypatch.setitem(ops.OPS, "mish", dataclasses.replace(ops.OPS["mish"], vjp=None))
    text = ("dim a = 3\ninput x[a]\nparam w[a] ~ normal\nbuffer s[a] ~ ones\n"
            "y = x * w + mish(s) + einsum('aa->a', einsum('a,b->ab', s, s))\noutput y")
    agree(text)
    with pytest.raises(NoGeneratedBackward, match="mish"):
        GradientPlan(penrose.compile(text=text.replace("mish(s)", "mish(w)")))


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
@given(programs(), st.sampled_from([(), (2,), (1, 2)]), st.booleans(), st.booleans())
def test_drawn_programs(program, batch, uniform, training):
    """Every drawn program is planned and agrees with autograd, or is refused naming an
    operation the program holds (at a line of it); the module in training mode or not."""
    from hypothesis import assume

    try:
        agree(program.text, batch, uniform, reject=assume, training=training)
    except NoGeneratedBackward as e:
        message = e.message
        checked = penrose.load(text=program.text)
        held = {v.key or v.op for body in (checked, *checked.blocks.values()) for s in body.stmts
                if s.value is not None for v in _values(s.value)} | {"block call", "several tensors", "sizes"}
        assert any(word in message for word in held) or "repeated label" in message or "exponent" in message, message
        assert e.line > 0 or "block" in message, message


def test_the_emitted_functions_read_no_name_of_the_diagram():
    """The plan's straight-line functions are built from slot numbers alone: every name in their
    source is a generated one, whatever the diagram calls its tensors (here names a careless
    generator could collide with: `values`, `self`, `g0`, `backward`)."""
    import ast
    import linecache
    import re

    text = ("dim a = 3, b = 2\ninput values[a]\nparam `self`[a] ~ normal\nparam g0[a] ~ normal\nparam mm[a, b] ~ normal\n"
            "backward = sigmoid(values * `self`) + g0\ngrads = einsum('a,ab->b', backward, mm) + 1\noutput backward, grads")
    plan = agree(text)
    plan.forward(values=torch.randn(2, 3)).backward({"backward": torch.ones(2, 3)})
    step = plan.training_step({"grads": lambda y, t: y - t})
    # the step's own names too: the params' dicts and keys (d, k), seeds (q) and targets (t), the
    # list of gradients and the two torch names it calls (torch.mm written out, foreach_add)
    generated = re.compile(r"[vgscdkqt]\d+|f\d+|b\d+_\d+|values|grads|torch|foreach_add")
    for fn in (plan._run_forward, *plan._run_backward.values(), step.run):
        tree = ast.parse("".join(linecache.getlines(fn.__code__.co_filename)))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
        assert names and all(generated.fullmatch(n) for n in names), sorted(names)


# ---- the training step written out whole, inputs fixed when planning, torch calls written out ----

LINEAR = ("dim f = 4, k = 3, r = 2\ninput x[f]\ninput c_true[k]\ninput do[k] : bool\nparam W[f, k] ~ normal\n"
          "param b[k] ~ normal\nparam V[r, k] ~ normal\nparam u[r] ~ normal\n"
          "h = einsum('f,fk->k', x, W) + b\nc = where(do, c_true, sigmoid(h))\ny = einsum('k,rk->r', c, V) + u\n"
          "output y, h")


@pytest.mark.parametrize("batch", [(5,), (2, 3), ()])
def test_written_out_torch_calls_and_their_fallbacks_agree_with_autograd(batch):
    """x W + b and its vjps are written out as torch.mm calls for a batch of rank one and fall
    back to the general functions for others (two batch dims, none): the same values and
    gradients either way, W written [f, k] and V written [r, k] (transposed)."""
    import linecache

    plan = agree(LINEAR, batch)
    plan.forward(x=torch.randn(*batch, 4, dtype=torch.float64), c_true=torch.zeros(*batch, 3, dtype=torch.float64),
                 do=torch.zeros(3, dtype=torch.bool)).backward({"y": torch.ones(*batch, 2, dtype=torch.float64)})
    source = "".join(linecache.getlines(plan._run_forward.__code__.co_filename))
    assert "torch.mm(" in source and "if" in source, source


BLOCKS_HEAD = "dim f = 4, k = 3, e = 2, r = 5\ninput x[f]\ninput z[k, e]\nparam A[k, e] ~ normal\nu = z * A\n"  # u: a gradient to it


@pytest.mark.parametrize("body, written", [
    # x [f] . W [f, k, e] + b [k, e]: Q of two legs, the bias fused (.add_)
    ("param W[f, k, e] ~ normal\nparam b[k, e] ~ normal\ny = einsum('f,fke->ke', x, W) + b\noutput y", ["torch.mm(", ".add_("]),
    # u [k, e] . S [e]: Px = k, Q empty (a matrix-vector product, its vjps outer and mv)
    ("param S[e] ~ normal\ny = einsum('ke,e->k', u, S)\noutput y", ["torch.mv(", "torch.outer("]),
    # u [k, e] . W [k, e, r]: C of two legs
    ("param W[k, e, r] ~ normal\ny = einsum('ke,ker->r', u, W)\noutput y", ["torch.mm("]),
    # the unbatched operand first, W written [r, k, e] (transposed), Px = f... none: u . W^T
    ("param W[r, k, e] ~ normal\ny = einsum('rke,ke->r', W, u)\noutput y", ["torch.mm("]),
    # Px = k and Q = r, W [e, r]: per concept the same map
    ("param W[e, r] ~ normal\nparam b[k, r] ~ normal\ny = einsum('ke,er->kr', u, W) + b\noutput y", ["torch.mm(", ".add_("]),
])
@pytest.mark.parametrize("batch", [(5,), (2, 3), ()])
def test_written_out_block_contractions_agree_with_autograd(body, written, batch):
    """A contraction that is one matrix product of views (x [N, Px, C] as [N·Px, C], w [C, Q]
    or [Q, C]) is written out with its vjps as torch.mm / mv / outer calls for a batch of one
    dimension and falls back to the general functions for others: the same values and
    gradients either way."""
    import linecache

    plan = agree(BLOCKS_HEAD + body, batch)
    source = "".join(linecache.getlines(plan._run_forward.__code__.co_filename))
    backward = plan._run_backward[next(iter(plan._run_backward))]
    source += "".join(linecache.getlines(backward.__code__.co_filename))
    for text in written:
        assert text in source, source


def test_contractions_written_out_only_where_one_matrix_product_fits():
    """A label both operands keep (a batched matrix product), a repeated label, a summed batch
    and a term whose legs need a permutation are not written out (the general functions run)."""
    from penrose.gradients import _Blocks

    def blocks(body):
        checked, _ = _load_quiet(BLOCKS_HEAD + body)
        v = [s.value for s in checked.stmts if s.value is not None][1]
        return _Blocks.of(v)

    assert blocks("param W[f, k] ~ normal\ny = einsum('f,fk->k', x, W)\noutput y") is not None
    assert blocks("param W[k, e, r] ~ normal\ny = einsum('ke,ker->kr', u, W)\noutput y") is None  # k kept by both
    assert blocks("param W[e, k] ~ normal\ny = einsum('ke,ek->', u, W)\noutput y") is None  # u's legs need permuting
    assert blocks("param W[r, e] ~ normal\ny = einsum('ke,re->kr', u, W)\noutput y") is not None  # transposed W
    assert blocks("param W[e, r, k] ~ normal\ny = einsum('ke,erk->r', u, W)\noutput y") is None  # W's C legs split


WHERE_HEAD = ("dim f = 4, k = 3\ninput x[f]\ninput c_true[k]\ninput do[k] : bool\nparam W[f, k] ~ normal\n"
              "param s[k] ~ normal\n")


@pytest.mark.parametrize("body, written", [
    ("h = einsum('f,fk->k', x, W)\nc = where(do, c_true, sigmoid(h))\noutput c", ["masked_fill(", "sigmoid_backward"]),
    ("h = einsum('f,fk->k', x, W)\nc = where(do, c_true, tanh(h))\noutput c", ["masked_fill(", "tanh_backward"]),
    ("h = einsum('f,fk->k', x, W)\nc = where(do, sigmoid(s), h)\noutput c", ["sigmoid_backward"]),
    ("h = einsum('f,fk->k', x, W)\nc = where(do, c_true, s) * sigmoid(h)\noutput c", ["sigmoid_backward"]),
])
@pytest.mark.parametrize("batch", [(5,), (2, 3)])
def test_written_out_where_and_output_kernel_vjps_agree_with_autograd(body, written, batch):
    """A where's gradient to its second branch is written out as `g.masked_fill(m, 0)` where
    that branch has the result's shape (else the general function: a parameter broadcast along
    the batch sums it), and a sigmoid's or tanh's as torch's backward kernel of (g, y): the
    same gradients as autograd either way."""
    import linecache

    plan = agree(WHERE_HEAD + body, batch)
    source = "".join(linecache.getlines(plan._run_backward[next(iter(plan._run_backward))].__code__.co_filename))
    for text in written:
        assert text in source, source


def _linear_module():
    checked, compiled = _load_quiet(LINEAR)
    return compiled.double()


def _autograd(module, x, c_true, do, weights):
    params = dict(module.named_parameters())
    for p in params.values():
        p.grad = None
    out = module(x=x, c_true=c_true, do=do)
    (out[0] * weights[0]).sum().add((out[1] * weights[1]).sum()).backward()
    return out, {n: p.grad.clone() for n, p in params.items()}


@pytest.mark.parametrize("mask", ["none", "all", "some"])
def test_inputs_fixed_when_planning_fold_a_where_and_agree_with_autograd(mask):
    """constants={'do': ..., 'c_true': ...}: a where whose mask is all False (all True) and whose
    other branch is fixed is its chosen branch, no step; a mixed mask stays a where. The outputs
    and gradients are the module's given the same values."""
    module = _linear_module()
    do = {"none": torch.zeros(3, dtype=torch.bool), "all": torch.ones(3, dtype=torch.bool),
          "some": torch.tensor([True, False, True])}[mask]
    c_true = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    full = GradientPlan(module)
    plan = GradientPlan(module, constants={"do": do, "c_true": c_true})
    assert plan.constant_inputs == ("do", "c_true") and [n for n, _ in plan._inputs] == ["x"]
    assert len(plan._steps) == len(full._steps) - (1 if mask == "none" else 0)  # the folded where
    assert plan.reads_constant("c_true") == (mask != "none")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    weights = [torch.randn(6, 2, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)]
    want_out, want = _autograd(module, x, c_true, do, weights)
    tape = plan.forward(x=x)
    for got, exp in zip(tape.outputs, want_out):
        torch.testing.assert_close(got, exp.detach(), rtol=1e-12, atol=1e-12)
    got = tape.backward({"y": weights[0], "h": weights[1]})
    for name, exp in want.items():
        torch.testing.assert_close(got[name], exp, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


def test_inputs_fixed_when_planning_are_checked():
    module = _linear_module()
    with pytest.raises(TypeError, match="'dont' is not an input of the diagram"):
        GradientPlan(module, constants={"dont": torch.zeros(3, dtype=torch.bool)})
    with pytest.raises(TypeError, match=r"input 'do' must have shape \[3\] \(k\), got \[2, 3\]"):
        GradientPlan(module, constants={"do": torch.zeros(2, 3, dtype=torch.bool)})  # no batch dims: the plan folds with it
    with pytest.raises(TypeError, match="input 'do' is declared bool, got a torch.float64 tensor"):
        GradientPlan(module, constants={"do": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(TypeError, match="must be a tensor"):
        GradientPlan(module, constants={"do": False})
    plan = GradientPlan(module, constants={"do": torch.zeros(3, dtype=torch.bool)})
    with pytest.raises(TypeError, match="input 'do' was fixed when planning"):
        plan.forward(x=torch.randn(2, 4, dtype=torch.float64), c_true=torch.zeros(2, 3, dtype=torch.float64),
                     do=torch.zeros(3, dtype=torch.bool))


def test_a_folded_where_keeps_the_dtype_it_would_promote_to():
    """A fixed branch of another dtype than the module's would promote the where's result:
    not folded (the where runs, as compiled)."""
    module = _linear_module()
    plan = GradientPlan(module, constants={"do": torch.zeros(3, dtype=torch.bool), "c_true": torch.zeros(3)})  # float32
    assert plan.reads_constant("c_true")


@pytest.mark.parametrize("batch", [(7,), (2, 3)])
def test_the_training_step_adds_the_tapes_gradients(batch):
    """training_step(seeds): one generated function that runs the forward, seeds each named
    output with seed(value, target), runs the backward and adds each param's gradient to the
    tensor given for it, returning the seeded outputs: the Tape's gradients, accumulated."""
    module = _linear_module()
    plan = GradientPlan(module, constants={"do": torch.zeros(3, dtype=torch.bool), "c_true": torch.zeros(3, dtype=torch.float64)})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*batch, 4, generator=g, dtype=torch.float64)
    ty, th = torch.randn(*batch, 2, generator=g, dtype=torch.float64), torch.randn(*batch, 3, generator=g, dtype=torch.float64)
    step = plan.training_step({"y": lambda y, t: (y - t) * 2, "h": lambda h, t: torch.sigmoid(h) - t})
    assert step.params == tuple(plan.params) and step.seeded == ("y", "h")
    params = dict(module.named_parameters())
    grads = [torch.zeros_like(params[n]) for n in step.params]
    y, h = step((x,), (ty, th), grads)
    tape = plan.forward(x=x)
    torch.testing.assert_close(y, tape["y"], rtol=0, atol=0)
    want = tape.backward({"y": (tape["y"] - ty) * 2, "h": torch.sigmoid(tape["h"]) - th})
    for n, got in zip(step.params, grads):
        torch.testing.assert_close(got, want[n], rtol=1e-12, atol=1e-12, msg=lambda m: f"{n}: {m}")
    step((x,), (ty, th), grads)  # added, not set
    for n, got in zip(step.params, grads):
        torch.testing.assert_close(got, 2 * want[n], rtol=1e-12, atol=1e-12)
    with pytest.raises(KeyError, match="'z' is not an output of the diagram"):
        plan.training_step({"z": lambda v, t: v})
