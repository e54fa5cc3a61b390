"""The one table of operations (penrose/ops.py) and the backends keyed by it.

Every operation of the language is one row of `penrose.ops.OPS`; the checker reads arity and
keywords from it, and every backend keeps a table with exactly the same keys. A new operation
without an entry in some backend fails here, not in a user's diagram.
"""

from __future__ import annotations

import importlib
import math

import pytest

import penrose
from penrose import ops
from penrose.errors import PenroseCheckError

BACKENDS = [
    ("penrose.compiler", "LOWER"),
    ("penrose.rendering.figure", "FIGURE"),
    ("penrose.rendering.equations", "EQUATION"),
    ("penrose.rendering.explain", "READING"),
    ("penrose.fmt", "FORMAT"),
    ("penrose.interpreter", "OPERATIONS"),
]


@pytest.mark.parametrize("module, table", BACKENDS, ids=[t for _, t in BACKENDS])
def test_every_backend_has_exactly_the_operations_of_the_table(module, table):
    keys = set(getattr(importlib.import_module(module), table))
    missing, extra = set(ops.OPS) - keys, keys - set(ops.OPS)
    assert not missing, f"{module}.{table} lacks {sorted(missing)}"
    assert not extra, f"{module}.{table} has operations the table does not: {sorted(extra)}"


def test_the_checker_knows_every_function_of_the_table():
    import sys

    from penrose import check as check_module  # noqa: F401  (the module, not the function)

    checker = sys.modules["penrose.checker"]
    assert checker.FUNCTIONS == ops.FUNCTIONS
    # every function's row names a type rule of the checker, and every rule is named by a row
    rules = {op.rule for op in ops.OPS.values() if op.category != "operator"}
    assert None not in rules
    assert rules == set(checker.TYPE_RULES), f"rows without a rule: {rules - set(checker.TYPE_RULES)}"
    assert all(op.rule is None for op in ops.OPS.values() if op.category == "operator")


def test_every_elementwise_row_describes_its_function():
    """An element-wise row is complete: a torch callable that exists, a form in the primitives
    only, a label, LaTeX and a reading that names each keyword it shows."""
    import torch

    from penrose.interpreter import _Torch

    assert {"mish", "hardswish", "elu", "clamp_min", "gelu", "leaky_relu"} <= ops.ELEMENTWISE
    assert set(ops.PRIMITIVES) == {n for n in dir(_Torch) if not n.startswith("_")}
    assert set(ops.PRIMITIVES) == {n for n in vars(ops.SCALAR) if not n.startswith("_")}
    for name in ops.ELEMENTWISE:
        row = ops.OPS[name]
        assert row.rule == "elementwise" and row.form is not None and row.label and row.latex and row.reading, name
        owner, attr = row.torch.rsplit(".", 1)
        fn = getattr(eval(owner, {"torch": torch}), attr)  # a dotted name of the table, not user text
        assert callable(fn), name
        for k in row.keywords:
            assert k.kind in ops.NUMERIC, name
        if row.aten is not None:
            assert hasattr(torch.ops.aten, row.aten), name


@pytest.mark.parametrize("name", sorted(ops.ELEMENTWISE))
def test_the_form_of_a_row_computes_its_torch_callable(name):
    """The form (what the interpreter evaluates) and the torch callable (what the compiler emits)
    agree in float64, values and gradients, on both sides of every kink, and on plain numbers."""
    import torch

    row = ops.OPS[name]
    from penrose.interpreter import _Torch

    owner, attr = row.torch.rsplit(".", 1)
    fn = getattr(eval(owner, {"torch": torch}), attr)
    kw = {k.name: (0.3 if k.name == "min" else 0.7 if k.name == "alpha" else k.default) for k in row.keywords}
    x = torch.cat([torch.linspace(-30, 30, 241, dtype=torch.float64), torch.tensor([-3.0001, -2.9999, 2.9999, 3.0001, 0.2999, 0.3001])])
    if name in ("log", "sqrt"):
        x = x.abs() + 0.5
    x.requires_grad_(True)
    want = fn(x, *kw.values())
    got = row.call(x, _Torch, kw)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (gw,) = torch.autograd.grad(want.sum(), x)
    (gg,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(gg, gw, rtol=1e-9, atol=1e-12)
    for value in (0.5, 1.5, 2.0):
        assert math.isclose(row.call(value, ops.SCALAR, kw), fn(torch.tensor(value, dtype=torch.float64), *kw.values()).item(),
                            rel_tol=1e-12, abs_tol=1e-15), (name, value)


def test_rows_are_complete():
    for name, op in ops.OPS.items():
        assert op.doc and op.legs, f"{name}: every row documents itself and its result legs"
        assert op.min_args >= 0 and (op.max_args is None or op.max_args >= op.min_args)
        assert len({k.name for k in op.keywords}) == len(op.keywords)
        for k in op.keywords:
            assert k.rule in ops.RULES and k.kind in (ops.NUMBER, ops.INT, ops.NUMBER_OR_DIM, ops.LEG, ops.PARAM, ops.DIM)


def test_key_of_every_checked_value_is_a_row():
    c = penrose.load("""\
dim t = 4, e = 4
input x[t, e]
param W[e, e]
a = sigmoid(x) + relu(x) - gelu(x) * silu(x) / (tanh(x) + 2) + leaky_relu(x, slope=0.1)
b = exp(x) + log(abs(x) + 1) + sqrt(abs(x)) + softplus(x) + sigma(x) + -x ** 2 // 3
c = einsum('te,ef->tf', a, W) + softmax(b, e) + log_softmax(b, e) + layernorm(b, e)
d = rmsnorm(c, e) + topk(c, e, k=2) + dropout(c, p=0.1) + c.detach() + clamp(c, min=0)
m = where(c > 0, d, 0) + where(causal(t, e), 1.0, 0.0)
r = rearrange(m, 't e -> e t') + repeat(reduce(m, 't e -> e', 'max'), 'e -> e t')
s = select(r, e, 0) + select(slice(m, t, 0, 4, into=t), e, 1)
output m, r, s
""".replace("'te,ef->tf'", "'te,ee->te'"))
    seen = set()

    def visit(v):
        k = v.key
        if k is not None:
            assert k in ops.OPS
            seen.add(k)
        for a in v.args:
            visit(a)

    for s in c.stmts:
        if s.value is not None:
            visit(s.value)
    assert {"sigmoid", "einsum", "where", "causal", "neg", "**", "//", ">", "clamp", "detach", "topk",
            "rearrange", "reduce", "repeat", "select", "slice"} <= seen


@pytest.mark.parametrize(
    "text, message, col",
    [
        ("y = layernorm(x, e, eps=-1)", r"layernorm: eps must be positive, got -1", 25),
        ("y = rmsnorm(x, e, eps=0)", r"rmsnorm: eps must be positive, got 0", 23),
        ("y = dropout(x, p=1)", r"dropout: p must be in \[0, 1\), got 1", 18),
        ("y = leaky_relu(x, slope=inf)", r"leaky_relu: slope must be finite", 25),
        ("y = clamp(x, min=1, min=2)", r"keyword argument 'min'", None),
        ("y = softmax(x, e, k=2)", r"softmax takes dim, not 'k'", 21),
        ("y = sigmoid(x, x)", r"sigmoid takes 1 positional argument\(s\), got 2", 5),
        ("y = rope(x, t, e, base=0)", r"rope: base must be positive", 24),
        ("y = clamp_min(x)", r"clamp_min needs min", 5),
        ("y = clamp_min(x, 0.1, min=0.2)", r"clamp_min: min is given twice", 27),
        ("y = elu(x, alpha=inf)", r"elu: alpha must be finite", 18),
        ("y = min(x, 0)", r"min\(x, 0\) is ambiguous: write min\(x, dim=0\) .* or min\(x, 0.0\)", 12),
        ("y = max(x, -1)", r"max\(x, -1\) is ambiguous", 12),
        ("y = max(2.0, 3.0)", r"max of two plain numbers", 5),
        ("y = min(x, x > 0)", r"min: the expression must be a float tensor or a number", 12),
    ],
)
def test_keyword_rules_come_from_the_table(text, message, col):
    src = f"dim t = 4, e = 4\ninput x[t, e]\n{text}\noutput y"
    with pytest.raises(PenroseCheckError if "min=2" not in text else penrose.PenroseError, match=message) as e:
        penrose.load(src)
    assert e.value.line == 3
    if col is not None:
        assert e.value.col == col, e.value.render()


NEW_FUNCTIONS = """\
dim t = 3, e = 4
input x[t, e]
param W[e]
y = mish(x) + hardswish(x * 4) + elu(x, alpha=0.5) + clamp_min(x, -0.2) + min(x, W) + max(x, 0.25) + min(0.1, x)
z = min(y, e) + sum(max(W, y), e) + sum(max(y, dim=0), e)
output z
"""


def test_the_new_functions_compile_interpret_and_pass_gradcheck_in_float64():
    """mish, hardswish, elu, clamp_min and min/max in both forms: the compiled module and the
    interpreter agree with a hand-written torch reference, and gradcheck passes through both."""
    import torch
    import torch.nn.functional as F

    from penrose.interpreter import interpret

    model = penrose.compile(NEW_FUNCTIONS, seed=0).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    with torch.no_grad():
        model.W.copy_(W)

    def reference(x, W):
        y = (F.mish(x) + F.hardswish(x * 4) + F.elu(x, 0.5) + torch.clamp_min(x, -0.2) + torch.minimum(x, W)
             + torch.clamp(x, min=0.25) + torch.clamp(x, max=0.1))
        return y.amin(-1) + torch.maximum(W, y).sum(-1) + y.amax(-2).sum(-1)[..., None]

    want = reference(x, W)
    torch.testing.assert_close(model(x), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(interpret(NEW_FUNCTIONS, x, params={"W": W}), want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: model(x), (x,))
    assert torch.autograd.gradcheck(lambda x, W: interpret(NEW_FUNCTIONS, x, params={"W": W}), (x, W))


def test_plain_numbers_are_folded_once_and_read_where_no_size_is_free():
    """The checker folds a plain number once (V.const); `fixed` gives it where every size it
    reads is built in, and None where one comes from the inputs at run time."""
    from penrose.checked import fixed

    text = "dim t = 3, e = 4\nconst k = 2\ninput x[t, e]\nparam w[e]\ny = x * w * (sqrt(e) * k) + x / t\noutput y"
    c = penrose.load(text)
    y = next(s.value for s in c.stmts if s.value is not None)
    scale = y.args[0].args[1]  # sqrt(e) * k: e is built in (the param w carries it)
    assert scale.op == "sbin" and scale.const is not None
    assert (scale.const.value, scale.const.reads) == (4.0, (("e", 4), ("k", 2)))
    assert fixed(scale, c.sizes) == 4.0
    t = y.args[1].args[1]  # t: the inputs carry it, so the generated code reads it
    assert t.op == "dimsize" and t.const is not None and fixed(t, c.sizes) is None
    assert c.constants == {"k": 2}
    # the source says it as the diagram does, by name (the module's constants E = 4, K = 2, which
    # Python computes to the folded 4.0); t read from the inputs
    source = penrose.source(text)
    assert "y = x * self.w * (math.sqrt(E) * K) + x / _t" in source and "\nE = 4\nK = 2\n" in source


def test_no_backend_reads_attributes_by_a_string_key():
    """Attributes are typed records (penrose.attrs): `v.attrs["axis"]` would pass no type check."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    pattern = re.compile(r"\.attrs\[|\.attrs\.get\(")
    hits = [f"{p.relative_to(root)}:{n}" for folder in ("penrose", "zoo") for p in sorted((root / folder).rglob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "string reads of attributes: " + ", ".join(hits)


# Where penrose names an element-wise function outside its row on purpose: how that one function
# is drawn or written (a radical, bars, clamp_min's bound as a max), the checker's refusal of a
# plain number outside its domain, and `abs`, the builtin generated code calls on a size.
NAMED_ELSEWHERE = {
    ("check_exprs.py", "log"), ("check_exprs.py", "sqrt"),
    ("rendering/equations.py", "clamp_min"), ("rendering/equations.py", "sqrt"),
    ("rendering/explain.py", "sqrt"),
    ("rendering/figure.py", "abs"), ("rendering/figure.py", "sqrt"),
    ("tables.py", "abs"),
}


def test_an_elementwise_function_is_named_in_its_row_only():
    """An element-wise function is one row of penrose/ops.py, its derivative included: no other
    module of penrose holds its name as a string (a table keyed by it, a test of it), but
    `penrose trace`'s ATen lowering (penrose/tracing/, whose keys are ATen's own names) and the
    special cases above; `gelu`, which has none, is named in two files."""
    import ast
    import pathlib

    package = pathlib.Path(penrose.__file__).parent
    found = set()
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == "ops.py" or where.startswith("tracing/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ops.ELEMENTWISE:
                found.add((where, node.value))
    assert found == NAMED_ELSEWHERE  # a new entry means a second place to edit for that function
    gelu = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py") if "gelu" in p.read_text(encoding="utf-8"))
    assert gelu == ["ops.py", "tracing/aten.py"]
