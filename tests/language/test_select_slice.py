"""select, slice and const: values and gradients against plain torch indexing and arithmetic,
through the API (compiled module, standalone source, interpreter) and the CLI (`penrose check`,
`penrose compile -o`), batched and not; refusals at their line and column.

    select(x, t, 0)               one index of a leg (negative as in torch); the leg disappears
    slice(x, t, 1, k)             `size(k)` indices from 1 (torch.narrow), the leg becomes k
    slice(x, t, 1, 3, into=s)     a number of indices, the result's leg a declared dim of that size
    const alpha = 8               a named number, usable wherever a number is, overridable

Every expected value is written here in torch (x[..., 1:3, :]), never taken from penrose.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import penrose
from penrose.errors import PenroseCheckError, PenroseError, PenroseShapeError
from penrose.interpreter import interpret as interpret_diagram

from sources import imported_modules, quiet, standalone

pytestmark = pytest.mark.usefixtures("one_thread")

RTOL, ATOL = 1e-10, 1e-12
ROOT = Path(__file__).resolve().parents[2]


def implementations(text, **sizes):
    """(name, callable) for the compiled module, the standalone source (with the compiled
    module's state) and the interpreter (with the same parameters)."""
    compiled = quiet(penrose.compile, text, seed=0, **sizes).double().eval()
    alone = standalone(text, **sizes).double().eval()
    alone.load_state_dict(compiled.state_dict())
    checked = quiet(penrose.load, text, **sizes)
    state = {k: v.detach().clone() for k, v in compiled.state_dict().items()}
    return compiled, [
        ("compiled", compiled),
        ("standalone", alone),
        ("interpreter", lambda *a: interpret_diagram(checked, *a, params=state)),
    ]


def grad_of(fn, x, weight):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    (g,) = torch.autograd.grad((y * weight).sum(), [x], allow_unused=True)
    return y, torch.zeros_like(x) if g is None else g


def agree(text, x, reference, **sizes):
    """All three implementations give reference(x) in value, and in the gradient of a random
    weighting of the output when x is floating."""
    _, impls = implementations(text, **sizes)
    want = reference(x)
    for what, fn in impls:
        if not x.is_floating_point():
            got = fn(x)
            assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: {got} != {want}"
            continue
        weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        want_v, want_g = grad_of(reference, x, weight)
        got, g = grad_of(fn, x, weight)
        assert got.shape == want_v.shape, f"{what}: shape {tuple(got.shape)}, torch gives {tuple(want_v.shape)}"
        torch.testing.assert_close(got, want_v, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} value: {m}")
        torch.testing.assert_close(g, want_g, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} gradient: {m}")


HEAD = "dim t = 5, e = 3, k = 2, s = 3, z = 0\n"

# (statement, torch reference on x[..., t, e]); x is declared `input x[t, e]`
VALUES = [
    ("y = select(x, t, 0)", lambda x: x[..., 0, :]),
    ("y = select(x, t, 4)", lambda x: x[..., 4, :]),
    ("y = select(x, t, -1)", lambda x: x[..., -1, :]),
    ("y = select(x, t, -5)", lambda x: x[..., 0, :]),
    ("y = select(x, e, 2)", lambda x: x[..., 2]),
    ("y = select(x, e, -2)", lambda x: x[..., 1]),
    ("y = select(x, 1, 0)", lambda x: x[..., 0]),
    ("y = select(x, -2, 3)", lambda x: x[..., 3, :]),
    ("y = select(x, t, k)", lambda x: x[..., 2, :]),  # a dim as the index: its size
    ("y = select(x, t, k + 1)", lambda x: x[..., 3, :]),
    ("y = select(select(x, t, 1), e, 0)", lambda x: x[..., 1, 0]),
    ("y = select(tanh(x), t, 2) * 3", lambda x: torch.tanh(x[..., 2, :]) * 3),
    ("y = slice(x, t, 1, k)", lambda x: x[..., 1:3, :]),
    ("y = slice(x, t, 0, k)", lambda x: x[..., 0:2, :]),
    ("y = slice(x, t, 3, k)", lambda x: x[..., 3:5, :]),
    ("y = slice(x, t, -2, k)", lambda x: x[..., 3:5, :]),
    ("y = slice(x, t, -5, k)", lambda x: x[..., 0:2, :]),
    ("y = slice(x, t, 1, 3, into=s)", lambda x: x[..., 1:4, :]),
    ("y = slice(x, t, 2, 3, s)", lambda x: x[..., 2:5, :]),
    ("y = slice(x, t, 0, 5, into=t)", lambda x: x),
    ("y = slice(x, t, 2, z)", lambda x: x[..., 2:2, :]),
    ("y = slice(x, t, 1, 2)", lambda x: x[..., 1:3, :]),  # the only dim of size 2: k
    ("y = slice(x, e, 1, 2)", lambda x: x[..., 1:3]),
    ("y = slice(x, e, 0, 3)", lambda x: x[..., 0:3]),  # e itself excluded: the only other dim of size 3 is s
    ("y = slice(slice(x, t, 1, 3, into=s), s, 1, k)", lambda x: x[..., 2:4, :]),
    ("y = select(slice(x, t, 1, k), k, -1)", lambda x: x[..., 2, :]),
    ("y = einsum('ke,te->kt', slice(x, t, 3, k), x)", lambda x: torch.einsum("...ke,...te->...kt", x[..., 3:5, :], x)),
    ("y = slice(x, t, 1, k) + slice(x, t, 3, k)", lambda x: x[..., 1:3, :] + x[..., 3:5, :]),
    ("y = softmax(slice(x, t, 1, k), k)", lambda x: torch.softmax(x[..., 1:3, :], dim=-2)),
]


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=["unbatched", "batch2", "batch2x3"])
@pytest.mark.parametrize("stmt, ref", VALUES, ids=[v[0][4:] for v in VALUES])
def test_values_and_gradients(stmt, ref, batch):
    text = HEAD + "input x[t, e]\n" + stmt + "\noutput y\n"
    x = torch.randn(batch + (5, 3), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    agree(text, x, ref)


@pytest.mark.parametrize("kind", ["int", "bool"])
def test_select_and_slice_keep_int_and_bool(kind):
    text = HEAD + f"input x[t, e] : {kind}\ny = select(slice(x, t, 1, 3, into=s), e, -1)\noutput y\n"
    x = torch.arange(30).reshape(2, 5, 3) % 7
    if kind == "bool":
        x = x > 3
    agree(text, x, lambda x: x[..., 1:4, -1])


def test_select_and_slice_of_a_param_and_in_a_block():
    text = HEAD + """\
param W[t, e] ~ normal(std=1)
block f(a[t, e]) {
  return select(a, t, -2) + select(slice(a, t, 1, k), k, 0)
}
input x[t, e]
y = f(x) * select(W, t, 1) + select(slice(W, t, 2, k), k, 1)
output y
"""
    compiled, impls = implementations(text)
    W = compiled.W.detach().clone()
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    want = (x[..., -2, :] + x[..., 1, :]) * W[1] + W[3]
    for what, fn in impls:
        torch.testing.assert_close(fn(x), want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def test_free_leg_select_and_slice_read_the_runtime_size():
    """t has no size: the leg is read from the input; a negative index counts from its end."""
    text = "dim t, e = 3, k = 2\ninput x[t, e]\ny = select(x, t, -1) + select(slice(x, t, 1, k), k, 1)\noutput y\n"
    x = torch.randn(2, 7, 3, dtype=torch.float64)
    agree(text, x, lambda x: x[..., -1, :] + x[..., 2, :])


def _raises_shape_error(impls, x):
    """Compiled module and interpreter raise PenroseShapeError; the standalone source its own
    ShapeError (a ValueError, as PenroseShapeError is): never a torch error."""
    for what, fn in impls:
        want = ValueError if what == "standalone" else PenroseShapeError
        try:
            fn(x)
        except want:
            continue
        except Exception as e:  # noqa: BLE001 - which kind of failure is the point
            raise AssertionError(f"{what} raises {type(e).__name__}: {e}") from None
        raise AssertionError(f"{what} raises nothing")


def test_slice_of_a_free_leg_too_short_at_run_time():
    """t has no size: a slice past the end of the leg the input brings is a shape error."""
    text = "dim t, e = 3, k = 2\ninput x[t, e]\ny = slice(x, t, 3, k)\noutput y\n"
    _, impls = implementations(text)
    x = torch.randn(6, 3, dtype=torch.float64)
    for what, fn in impls:
        torch.testing.assert_close(fn(x), x[3:5], msg=lambda m: f"{what}: {m}")
    _raises_shape_error(impls, torch.randn(4, 3, dtype=torch.float64))


def test_select_of_a_free_leg_out_of_range_at_run_time():
    text = "dim t, e = 3\ninput x[t, e]\ny = select(x, t, 3)\noutput y\n"
    _, impls = implementations(text)
    _raises_shape_error(impls, torch.randn(2, 3, dtype=torch.float64))
    text = "dim t, e = 3\ninput x[t, e]\ny = select(x, t, -3)\noutput y\n"
    _, impls = implementations(text)
    _raises_shape_error(impls, torch.randn(2, 3, dtype=torch.float64))


# ---- refusals ------------------------------------------------------------------------------------

# (statement, the characters the error must point at: exactly, or (within) anywhere inside them,
# words of the message)
REFUSALS = [
    ("y = select(x, t, 5)", "5", "exact", "out of range"),
    ("y = select(x, t, -6)", "-6", "exact", "out of range"),
    ("y = select(x, e, 3)", "3", "exact", "out of range"),
    ("y = select(x, t, 1.5)", "1.5", "exact", "whole"),
    ("y = select(x, q, 0)", "q", "exact", "leg"),
    ("y = select(x, t, bogus)", "bogus", "exact", "bogus"),
    ("y = slice(x, t, 4, k)", "slice(x, t, 4, k)", "within", "outside"),
    ("y = slice(x, t, 3, 3, into=s)", "slice(x, t, 3, 3, into=s)", "within", "outside"),
    ("y = slice(x, t, -1, k)", "slice(x, t, -1, k)", "within", "outside"),
    ("y = slice(x, t, -6, k)", "slice(x, t, -6, k)", "within", "outside"),
    ("y = slice(x, t, 1, 2, into=s)", "s", "exact", "do not fit"),
    ("y = slice(x, t, 0, s, into=k)", "k", "exact", "do not fit"),
    ("y = slice(x, t, 1, 4)", "slice(x, t, 1, 4)", "within", "no dim has size 4"),
    ("y = slice(x, t, 1, 3)", "slice(x, t, 1, 3)", "within", "size 3"),  # e and s: which?
    ("y = slice(x, t, 1, 2, into=x)", "x", "exact", "declared dim"),
    ("y = slice(x, t, 1, -1)", "-1", "exact", "at least 0"),
    ("y = slice(x, t, 0.5, k)", "0.5", "exact", "whole"),
    ("y = slice(x, q, 0, k)", "q", "exact", "leg"),
]


def _col(stmt, sub):
    """The 1-based column of the last occurrence of sub in the statement (the arguments come last)."""
    return stmt.rindex(sub) + 1


@pytest.mark.parametrize("stmt, sub, how, words", REFUSALS, ids=[r[0][4:] for r in REFUSALS])
def test_refusal_is_positioned(stmt, sub, how, words):
    text = HEAD + "input x[t, e]\n" + stmt + "\noutput y\n"
    line = 3
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    assert e.line == line, f"line {e.line}, not {line}: {e}"
    start = _col(stmt, sub) if how == "exact" else stmt.index(sub) + 1
    end = start + len(sub)
    if how == "exact":
        assert (e.col, e.span.end_col) == (start, end), f"the caret covers {stmt[e.col - 1:e.span.end_col - 1]!r}, not {sub!r}: {e}"
    else:
        assert start <= e.col and e.span.end_col <= end, f"the caret covers {stmt[e.col - 1:e.span.end_col - 1]!r}, outside {sub!r}: {e}"
    assert words.lower() in str(e).lower(), str(e)


# ---- the CLI -------------------------------------------------------------------------------------


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "penrose.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env=_env())


def _env():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def import_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"penrose_cli_out_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLI_PROGRAM = """\
# index legend: t token, e embedding, k window, s three
dim t = 5, e = 3, k = 2, s = 3
const alpha = 8
const scale = alpha / k
input x[t, e]
y = select(x, t, -1) * scale + select(slice(x, t, 1, 3, into=s), s, 0)
output y
"""


def test_cli_check_and_compile(tmp_path):
    pen = tmp_path / "sel.pen"
    pen.write_text(CLI_PROGRAM, encoding="utf-8")
    done = cli("check", pen, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
    out = tmp_path / "sel.py"
    done = cli("compile", pen, "-o", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    src = out.read_text(encoding="utf-8")
    assert {m for m in imported_modules(src) if m not in sys.stdlib_module_names} == {"torch"}
    model = import_file(out).Model().double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    y = model(x)
    want = x[..., -1, :] * 4 + x[..., 1, :]
    torch.testing.assert_close(y, want)
    (g,) = torch.autograd.grad(y.sum(), [x])
    expect = torch.zeros(2, 5, 3, dtype=torch.float64)
    expect[..., -1, :] += 4
    expect[..., 1, :] += 1
    torch.testing.assert_close(g, expect)
    # a const overridden on the command line
    out2 = tmp_path / "sel16.py"
    done = cli("compile", pen, "-o", out2, "--size", "alpha=16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(import_file(out2).Model().double()(x), x[..., -1, :] * 8 + x[..., 1, :])


@pytest.mark.parametrize("stmt, sub", [
    ("y = select(x, t, 7)", "7"),
    ("y = slice(x, t, 1, 2, into=s)", "s"),
    ("y = rearrange(x, 't (e q) -> t e')", "q"),
])
def test_cli_refusal_shows_file_line_column(tmp_path, stmt, sub):
    pen = tmp_path / "bad.pen"
    pen.write_text("dim t = 5, e = 3, k = 2, s = 3\ninput x[t, e]\n" + stmt + "\noutput y\n", encoding="utf-8")
    col = stmt.rindex(sub) + 1
    for args in (("check", pen), ("compile", pen, "-o", tmp_path / "bad.py")):
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert f"bad.pen:3:{col}:" in done.stderr, done.stderr
        assert not (tmp_path / "bad.py").exists()


# ---- const ---------------------------------------------------------------------------------------

CONST = """\
dim e = 3, r = 4
const alpha = 8
const scale = alpha / r
input x[e]
y = x * scale + alpha
output y
"""


def test_const_in_an_expression_and_overridden():
    x = torch.randn(2, 3, dtype=torch.float64)
    agree(CONST, x, lambda x: x * (8 / 4) + 8)
    agree(CONST, x, lambda x: x * (16 / 4) + 16, alpha=16)
    agree(CONST, x, lambda x: x * (8 / 2) + 8, r=2)  # a dim in a const's value follows its override
    agree(CONST, x, lambda x: x * (0.5 / 4) + 0.5, alpha=0.5)


def test_const_overrides_change_the_compiled_module():
    x = torch.randn(3, dtype=torch.float64)
    a = quiet(penrose.compile, CONST).double()(x)
    b = quiet(penrose.compile, CONST, alpha=16).double()(x)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b - a, x * 2 + 8)


def test_const_as_a_keyword_value():
    text = """\
dim e = 4
const eps0 = 0.5
const kk = 2
const lo = 1
input x[e]
a = layernorm(x, e, eps=eps0)
b = topk(x, e, k=kk)
c = clamp(x, min=-lo, max=lo)
d = leaky_relu(x, slope=eps0)
output a, b, c, d
"""
    x = torch.tensor([[0.5, -3.0, 2.0, 1.0], [4.0, 1.0, -2.0, 0.0]], dtype=torch.float64)

    def topk(x, k):
        idx = x.topk(k, dim=-1).indices
        return torch.zeros_like(x).scatter(-1, idx, x.gather(-1, idx))

    for sizes, (eps, k, lo) in (({}, (0.5, 2, 1)), ({"eps0": 1e-3, "kk": 3, "lo": 2}, (1e-3, 3, 2))):
        _, impls = implementations(text, **sizes)
        want = (torch.nn.functional.layer_norm(x, (4,), eps=eps), topk(x, k), x.clamp(-lo, lo),
                torch.nn.functional.leaky_relu(x, eps))
        for what, fn in impls:
            got = fn(x)
            for name, g, w in zip("abcd", got, want):
                torch.testing.assert_close(g, w, msg=lambda m: f"{what} {name} with {sizes}: {m}")


def test_const_as_an_init_argument():
    text = "dim e = 4000\nconst s = 3\nconst v = 0.25\nparam W[e] ~ normal(std=s)\nparam C[e] ~ constant(value=v)\ninput x[e]\ny = x * W + C\noutput y\n"
    m = quiet(penrose.compile, text, seed=0)
    assert torch.equal(m.C.detach(), torch.full((4000,), 0.25))
    assert abs(m.W.detach().std().item() - 3) < 0.3
    m = quiet(penrose.compile, text, seed=0, s=0.01, v=-2)
    assert torch.equal(m.C.detach(), torch.full((4000,), -2.0))
    assert abs(m.W.detach().std().item() - 0.01) < 0.001


def test_const_in_a_dim_size_a_select_and_a_slice():
    text = """\
dim t = 6
const w = 2
dim k = w
dim f = 2 * w
const i = -1
input x[t]
a = select(x, t, i)
b = slice(x, t, w, k)
c = slice(x, t, 1, f)
output a, b, c
"""
    x = torch.arange(6.0, dtype=torch.float64)
    for sizes, (i, w) in (({}, (-1, 2)), ({"i": 0, "w": 1}, (0, 1))):
        _, impls = implementations(text, **sizes)
        for what, fn in impls:
            a, b, c = fn(x)
            torch.testing.assert_close(a, x[i], msg=lambda m: f"{what}: {m}")
            torch.testing.assert_close(b, x[w:2 * w], msg=lambda m: f"{what}: {m}")
            torch.testing.assert_close(c, x[1:1 + 2 * w], msg=lambda m: f"{what}: {m}")


def test_const_of_functions_read_in_a_block():
    text = """\
dim e = 4
const root = sqrt(e) * 2 ** -1
block f(x[e]) {
  return x * root
}
input z[e]
y = f(z) + root
output y
"""
    x = torch.randn(4, dtype=torch.float64)
    root = math.sqrt(4) * 2**-1
    agree(text, x, lambda x: x * root + root)


def test_const_declared_in_a_block_body():
    """docs/language.md: "Consts are declared at the top level or in a block body"."""
    text = """\
dim e = 4
block f(x[e]) {
  const k = 3
  return x * k
}
input z[e]
y = f(z)
output y
"""
    x = torch.randn(4, dtype=torch.float64)
    agree(text, x, lambda x: x * 3)


def test_const_in_the_standalone_source_follows_the_override():
    x = torch.randn(3, dtype=torch.float64)
    m16 = standalone(CONST, alpha=16).double()
    torch.testing.assert_close(m16(x), x * 4 + 16)


# (text, the line and the characters the error points at, words)
CONST_REFUSALS = [
    ("dim e = 2\nconst alpha = 8\ninput alpha[e]\noutput alpha\n", 3, None, "const"),
    ("dim e = 2\nconst alpha = 8\ninput x[e]\nalpha = x * 2\noutput alpha\n", 4, None, "const"),
    ("dim e = 2\nconst alpha = 8\nparam alpha[e]\ninput x[e]\noutput x\n", 3, None, "const"),
    ("dim e = 2\nconst alpha = beta * 2\ninput x[e]\noutput x\n", 2, "beta", "beta"),
    ("dim e = 2\nconst alpha = 2 + sqrt(gamma)\ninput x[e]\noutput x\n", 2, "gamma", "gamma"),
    ("dim e = 2\nconst alpha = 8\nconst alpha = 9\ninput x[e]\noutput x\n", 3, None, "alpha"),
    ("dim e = 2\nconst e = 8\ninput x[e]\noutput x\n", 2, None, "dim"),
    ("dim e = 2\ninput x[e]\nconst alpha = x * 2\noutput x\n", 3, "x", "x"),
]


@pytest.mark.parametrize("text, line, sub, words", CONST_REFUSALS, ids=[f"const{i}" for i in range(len(CONST_REFUSALS))])
def test_const_refusals(text, line, sub, words):
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(text)
    e = info.value
    assert e.line == line, f"line {e.line}, not {line}: {e}"
    if sub is not None:
        src = text.splitlines()[line - 1]
        col = src.index(sub) + 1
        assert (e.col, e.span.end_col) == (col, col + len(sub)), f"the caret covers {src[e.col - 1:e.span.end_col - 1]!r}, not {sub!r}: {e}"
    assert words in str(e), str(e)


@pytest.mark.parametrize("value", ["a", float("nan"), float("inf"), True, None])
def test_const_override_must_be_a_finite_number(value):
    with pytest.raises(PenroseError):
        penrose.load(CONST, alpha=value)


def test_const_override_of_an_unknown_name():
    with pytest.raises(PenroseError) as info:
        penrose.load(CONST, beta=3)
    assert "beta" in str(info.value)
