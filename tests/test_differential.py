"""Differential fuzzing: three implementations of every drawn program agree.

Hypothesis draws whole programs (tests/program_strategies.py: every operation, any expression
in every argument position, nesting) and each one runs three ways, in float64:

    compiled module      penrose.compile(text, seed=0)
    standalone source    penrose.source(text), executed here in a fresh namespace, with the
                         compiled module's state_dict loaded
    interpreter          penrose.interpret: the checked IR evaluated directly with
                         torch.einsum and plain torch ops (no code shared with the compiler)

and the outputs and the gradients (with respect to every float input and every parameter)
must agree. The formatter must keep each program's meaning (the re-parsed IR compares equal)
and every comment, and the renderer and the explanations must raise nothing but PenroseError
and never give an empty equation or reading.

Every bug the fuzzer found is a named case in REGRESSIONS (a program, a one-line comment), as
opt_einsum keeps its regression strings; each is checked by the same three-way comparison.
"""

from __future__ import annotations

import collections
import os
import re
import warnings

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import penrose
from penrose import ir
from penrose.errors import PenroseError, PenroseWarning
from penrose.interpret import Interpreter
from penrose.parse import parse

from program_strategies import programs

pytestmark = pytest.mark.usefixtures("one_thread")

REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
RTOL, ATOL = 1e-7, 1e-9  # float64 throughout (rope and rmsnorm compute in float32 in all three)
FUZZ = settings(max_examples=60)
FMT = settings(max_examples=60)
RENDER = settings(max_examples=40)
DEEP = settings(max_examples=40 if REDUCED else 400)


# ---- running one program three ways ------------------------------------------------------------


def _load_quiet(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PenroseWarning)
        return penrose.load(text), penrose.compile(text, seed=0)


def _standalone(text, state):
    namespace = {"__name__": "penrose_standalone_test"}
    exec(compile(penrose.source(text), "<standalone>", "exec"), namespace)
    module = namespace["Model"]().double().eval()
    module.load_state_dict(state)
    return module


def _values(v):
    """Every V reachable from a value (the tree of one statement)."""
    stack = [v]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(x.args)


def input_specs(checked):
    """(name, legs sizes, dtype, id bound) of each input; an int input's bound is the first-leg
    size of the smallest table it indexes."""
    bounds = {}
    for s in checked.stmts:
        if s.value is None:
            continue
        for v in _values(s.value):
            if v.op == "gather" and v.args[1].op == "ref":
                n = checked.size(v.args[0].type.cls[0])
                name = v.args[1].attrs["name"]
                bounds[name] = min(bounds.get(name, n), n)
    specs = []
    for d in checked.inputs:
        shape = tuple(checked.size(c) for c in d.type.cls)
        specs.append((d.tensor.name, shape, d.tensor.dtype, max(bounds.get(d.tensor.name, 2), 1)))
    return specs


def make_inputs(checked, batch=(), seed=0, uniform=True):
    """Random inputs of the declared sizes; float ones in float64. Batch dims lead every input
    (or, with uniform=False, every other one: they broadcast)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, (name, shape, dtype, bound) in enumerate(input_specs(checked)):
        lead = tuple(batch) if (uniform or i % 2 == 0) else ()
        full = lead + shape
        if dtype == "int":
            out[name] = torch.randint(0, bound, full, generator=g)
        elif dtype == "bool":
            out[name] = torch.rand(full, generator=g) > 0.4
        else:
            out[name] = torch.randn(full, generator=g, dtype=torch.float64)
    return out


def _as_tuple(out):
    return tuple(out) if isinstance(out, tuple) else (out,)


def run(fn, inputs, params: dict, weights=None):
    """Outputs of fn(**inputs) and the gradients of a fixed random weighting of them with
    respect to every float input and every parameter in `params` (zeros where unused)."""
    xs = {k: (v.detach().clone().requires_grad_(True) if v.is_floating_point() else v) for k, v in inputs.items()}
    outs = _as_tuple(fn(**xs))
    leaves = [v for v in xs.values() if v.is_floating_point()] + list(params.values())
    loss = None
    for i, o in enumerate(outs):
        if o.is_floating_point() and o.requires_grad:
            w = weights[i] if weights is not None else torch.ones_like(o)
            term = (o.double() * w).sum()
            loss = term if loss is None else loss + term
    grads = []
    if loss is not None:
        got = torch.autograd.grad(loss, leaves, allow_unused=True)
        grads = [torch.zeros_like(l) if g is None else g for l, g in zip(leaves, got)]
    else:
        grads = [torch.zeros_like(l) for l in leaves]
    return outs, grads


def _finite(tensors) -> bool:
    return all(not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in tensors)


def three_way(text, batch=(2,), seed=0, uniform=True, reject=None):
    """Compiled module == standalone source == interpreter, in values and gradients.
    `reject` (hypothesis' assume) discards programs whose values are not finite."""
    checked, compiled = _load_quiet(text)
    compiled = compiled.double().eval()
    standalone = _standalone(text, compiled.state_dict())
    inputs = make_inputs(checked, batch, seed, uniform)

    def params_of(module):
        return dict(module.named_parameters())

    c_outs, c_grads = run(compiled, inputs, params_of(compiled))
    g = torch.Generator().manual_seed(seed + 1)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in c_outs]
    c_outs, c_grads = run(compiled, inputs, params_of(compiled), weights)
    if reject is not None:
        reject(_finite(c_outs) and _finite(c_grads))
    s_outs, s_grads = run(standalone, inputs, params_of(standalone), weights)

    state = compiled.state_dict()
    trainable = {n for n, _ in compiled.named_parameters()}
    params = {k: (v.detach().clone().requires_grad_(True) if k in trainable else v.detach().clone()) for k, v in state.items()}
    interp = Interpreter(checked, params)
    i_outs, i_grads = run(interp, inputs, {k: v for k, v in params.items() if k in trainable}, weights)

    names = [n for n, _ in checked.outputs]
    assert len(c_outs) == len(s_outs) == len(i_outs) == len(names)
    if len(names) > 1:
        assert type(compiled(**inputs))._fields == type(interp(**inputs))._fields == tuple(names)
    for name, c, s, i in zip(names, c_outs, s_outs, i_outs):
        assert c.shape == s.shape == i.shape, f"output {name}: shapes {c.shape} / {s.shape} / {i.shape}"
        assert c.dtype == s.dtype == i.dtype, f"output {name}: dtypes {c.dtype} / {s.dtype} / {i.dtype}"
        torch.testing.assert_close(s, c, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"standalone output {name}: {m}")
        torch.testing.assert_close(i, c, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"interpreted output {name}: {m}")
    leaf_names = [k for k, v in inputs.items() if v.is_floating_point()] + list(params_of(compiled))
    for name, c, s, i in zip(leaf_names, c_grads, s_grads, i_grads):
        torch.testing.assert_close(s, c, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"standalone gradient of {name}: {m}")
        torch.testing.assert_close(i, c, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"interpreted gradient of {name}: {m}")
    return c_outs


# ---- the formatter and the renderer -------------------------------------------------------------


def comments(text: str) -> collections.Counter:
    """The multiset of comment texts ('# ...' outside strings)."""
    found = collections.Counter()
    for line in text.splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch == "#":
                found[line[i + 1 :].strip()] += 1
                break
    return found


def check_fmt(text):
    original = parse(text)
    formatted = penrose.format_diagram(original)
    again = parse(formatted)
    assert again.body == original.body, f"fmt changed the meaning:\n{formatted}"
    lost = comments(text) - comments(formatted)
    assert not lost, f"fmt lost comments {sorted(lost)}:\n{formatted}"
    assert penrose.format_diagram(again) == formatted, "fmt is not idempotent"


_FUNC = re.compile(r"\\mathrm\{[^{}]*\}|\\operatorname\{[^{}]*\}")


def _empty_rhs(latex: str) -> bool:
    """An equation whose right side is nothing, or nothing but function names (`\\mathrm{rope}`)."""
    rhs = latex.split("=", 1)[1] if "=" in latex else ""
    rest = _FUNC.sub("", rhs)
    rest = re.sub(r"[\s{}_^\\,]", "", rest)
    return not rest


def check_render(text):
    """Figures, equations and readings of every statement: only PenroseError escapes, and none
    is empty."""
    from penrose.render.explain import statement_latex, statement_readings
    from penrose.render.figure import Options, build_figure, statements, to_dot

    checked, _ = _load_quiet(text)
    views = ["diagram"] + [f"statement:{i + 1}" for i in range(len(statements(checked)))] + [f"block:{b}" for b in checked.blocks]
    for view in views:
        for options in (Options(), Options(show_sizes=True, show_plan=True, unfold=True)):
            try:
                dot = to_dot(build_figure(checked, view, options))
            except PenroseError:
                continue
            assert dot.strip(), f"empty figure for {view}"
    bodies = [(None, checked)] + list(checked.blocks.items())
    for block, body in bodies:
        for s in statements(body):
            where = f"{'block ' + block + ': ' if block else ''}{s.stmt.span.line}: {s.stmt}"
            try:
                latex = statement_latex(checked, s)
            except PenroseError:
                latex = None
            if latex is not None:
                assert latex.strip() and not _empty_rhs(latex), f"empty equation {latex!r} for {where}"
            try:
                readings = statement_readings(checked, s, body)
            except PenroseError:
                continue
            for r in readings:
                assert r.title.strip() and r.text.strip(), f"empty reading {r} for {where}"
            plain = isinstance(s.stmt, ir.Return) and all(v.op == "ref" for v in s.value.args)
            if not plain and s.value.op != "ref":
                assert readings, f"no reading for {where}"


# ---- the fuzzers --------------------------------------------------------------------------------


@FUZZ
@given(programs(), st.sampled_from([(), (2,), (1, 2)]), st.booleans())
def test_programs_agree_three_ways(program, batch, uniform):
    three_way(program.text, batch, uniform=uniform, reject=assume)


@pytest.mark.slow
@DEEP
@given(programs(), st.sampled_from([(), (2,), (2, 1)]), st.booleans())
def test_programs_agree_three_ways_many(program, batch, uniform):
    three_way(program.text, batch, uniform=uniform, reject=assume)


@FMT
@given(programs(decorate=True))
def test_fmt_keeps_meaning_and_comments(program):
    check_fmt(program.text)


@RENDER
@given(programs(decorate=True))
def test_render_and_explain_never_empty(program):
    check_render(program.text)


# ---- regressions: every bug the fuzzer found ----------------------------------------------------

# (name, program, what went wrong)
REGRESSIONS = []


@pytest.mark.parametrize("name, text, comment", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regression(name, text, comment):
    three_way(text, batch=(2,))
    three_way(text, batch=())
