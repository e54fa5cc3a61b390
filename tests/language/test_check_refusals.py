"""The checker refuses before torch: every bad diagram below is a positioned PenroseError.

Each case would otherwise pass the checker and then fail inside torch (or Python), or compute
something else than it says (a complex number, a merged output). Cases assert the message, the
line and the column, as tests/language/test_errors.py does. Then the limits (tensor bytes, repeat
counts) and their knobs, deep programs (10,000-term sums, 1,000 nested calls) and concurrent
parsing.
"""

from __future__ import annotations

import importlib
import re
import threading

import pytest

import penrose
from penrose.checker import LIMITS, check
from penrose.errors import PenroseCheckError, PenroseError, PenroseSyntaxError
from penrose.parser import parse

check_module = importlib.import_module("penrose.checker")  # `penrose.check` is also the function

B = "dim t = 2, e = 3, d = 4\ninput x[t, e]\n"  # lines 1-2 of most cases
BLK = "block f(h[t, e]) {\n  return h * 2\n}\n"  # 3 lines


def refusal(text, **sizes) -> PenroseError:
    with pytest.raises(PenroseError) as info:
        check(parse(text), **sizes)
    return info.value


# (id, text, error class, message regex, line, column)
CASES = [
    # -- init arguments
    ("normal std negative", B + "param W[e] ~ normal(std=-1)\noutput x", PenroseCheckError,
     r"^normal: std must be finite and at least 0, got -1$", 3, 25),
    ("normal mean infinite", B + "param W[e] ~ normal(mean=inf)\noutput x", PenroseCheckError,
     r"^normal: mean must be finite, got inf$", 3, 26),
    ("uniform a above b", B + "param W[e] ~ uniform(a=1, b=-1)\noutput x", PenroseCheckError,
     r"^uniform: a=1 is above b=-1$", 3, 29),
    ("uniform a above the default b", B + "param W[e] ~ uniform(a=2)\noutput x", PenroseCheckError,
     r"^uniform: a=2 is above b=1 \(b defaults to 1\)$", 3, 24),
    ("uniform b below the default a", B + "param W[e] ~ uniform(b=-2)\noutput x", PenroseCheckError,
     r"^uniform: a=0 is above b=-2 \(a defaults to 0\)$", 3, 24),
    ("uniform range beyond float32", B + "param W[e] ~ uniform(a=-3e38, b=3e38)\noutput x", PenroseCheckError,
     r"^uniform: the range from a=-3e\+38 to b=3e\+38 is wider than float32 holds$", 3, 33),
    ("constant inf", B + "param W[e] ~ constant(value=inf)\noutput x", PenroseCheckError,
     r"^constant: value must be finite, got inf$", 3, 29),
    ("constant -inf", B + "param W[e] ~ constant(value=-inf)\noutput x", PenroseCheckError,
     r"^constant: value must be finite, got -inf$", 3, 29),
    ("constant literal overflowing to inf", B + "param W[e] ~ constant(value=1e999)\noutput x", PenroseCheckError,
     r"^constant: value must be finite, got inf$", 3, 29),
    ("constant beyond float32", B + "param W[e] ~ constant(value=1e39)\noutput x", PenroseCheckError,
     r"^the number 1e\+39 is beyond float32's range", 3, 29),
    ("xavier gain negative", B + "param W[e, d] ~ xavier(gain=-1)\noutput x", PenroseCheckError,
     r"^xavier: gain must be finite and at least 0, got -1$", 3, 29),
    ("init argument repeated", B + "param W[e] ~ normal(std=1, std=2)\noutput x", PenroseSyntaxError,
     r"^keyword argument 'std' is repeated$", 3, 28),
    # -- duplicate keywords
    ("keyword repeated", B + "y = clamp(x, min=1, min=2)\noutput y", PenroseSyntaxError,
     r"^keyword argument 'min' is repeated$", 3, 21),
    ("keyword repeated on a continued line", B + "y = layernorm(x, e,\n    eps=1e-5, eps=1e-6)\noutput y", PenroseSyntaxError,
     r"^keyword argument 'eps' is repeated$", 4, 15),
    ("bound by position and keyword", B + "y = clamp(x, 0, min=1)\noutput y", PenroseCheckError,
     r"^clamp: min is given twice, by position and as min=$", 3, 21),
    ("p by position and keyword", B + "y = dropout(x, 0.5, p=0.1)\noutput y", PenroseCheckError,
     r"^dropout: p is given twice, by position and as p=$", 3, 23),
    # -- keyword values
    ("layernorm eps negative", B + "y = layernorm(x, e, eps=-1)\noutput y", PenroseCheckError,
     r"^layernorm: eps must be positive, got -1$", 3, 25),
    ("rmsnorm eps zero", B + "y = rmsnorm(x, e, eps=0)\noutput y", PenroseCheckError, r"^rmsnorm: eps must be positive, got 0$", 3, 23),
    ("rope base zero", "dim t = 2, e = 4\ninput x[t, e]\ny = rope(x, t, e, base=0)\noutput y", PenroseCheckError,
     r"^rope: base must be positive, got 0$", 3, 24),
    ("block_causal block zero", B + "m = block_causal(t, t, block=0)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"^block_causal: block must be positive, got 0$", 3, 30),
    # -- plain numbers, evaluated at the declared sizes
    ("sqrt of a negative number", B + "y = x / sqrt(-4)\noutput y", PenroseCheckError,
     r"^sqrt of a negative number \(-4\); the result would not be real$", 3, 9),
    ("log of a negative number", B + "y = x * log(-1)\noutput y", PenroseCheckError,
     r"^log of a negative number \(-1\); the result would not be real$", 3, 9),
    ("log of zero", B + "y = x * log(0)\noutput y", PenroseCheckError, r"^log of zero; the result would be -inf$", 3, 9),
    ("negative to a fractional power", B + "y = x * (-4) ** 0.5\noutput y", PenroseCheckError,
     r"^a negative number \(-4\) to the fractional power 0.5; the result would not be real$", 3, 9),
    ("fractional power of a negative size", B + "y = x * (d - 5) ** 0.5\noutput y", PenroseCheckError,
     r"^a negative number \(-1\) to the fractional power 0.5 at d = 4; the result would not be real$", 3, 9),
    ("sqrt of a negative size", B + "y = x / sqrt(d - 5)\noutput y", PenroseCheckError,
     r"^sqrt of a negative number \(-1 at d = 4\); the result would not be real$", 3, 9),
    ("sqrt of a negative shape", B + "y = x / sqrt(x.shape[0] - 3)\noutput y", PenroseCheckError,
     r"^sqrt of a negative number \(-1 at t = 2\)", 3, 9),
    ("log of a size that is zero", B + "y = x * log(d - 4)\noutput y", PenroseCheckError, r"^log of zero at d = 4; the result would be -inf$", 3, 9),
    ("division by zero", B + "y = x * (1 / 0)\noutput y", PenroseCheckError, r"^division by zero$", 3, 10),
    ("floor division by a size that is zero", B + "y = x * (e // (d - 4))\noutput y", PenroseCheckError,
     r"^division by zero at e = 3, d = 4$", 3, 10),
    ("zero to a negative power", B + "y = x * 0 ** -1\noutput y", PenroseCheckError,
     r"^zero to the negative power -1 is a division by zero$", 3, 9),
    ("power beyond 64 bits", B + "y = x * 2 ** 100\noutput y", PenroseCheckError, r"^2 \*\* 100 does not fit in 64 bits$", 3, 9),
    ("product beyond 64 bits", B + "y = x * (4611686018427387904 * 4)\noutput y", PenroseCheckError,
     r"^this number is 1.845e\+19, which does not fit in 64 bits$", 3, 10),
    ("exp overflow", B + "y = x * exp(1000)\noutput y", PenroseCheckError, r"^exp\(1000\) is beyond float32's range", 3, 9),
    ("exp beyond float32", B + "y = x * exp(100)\noutput y", PenroseCheckError,
     r"^this number is 2.688e\+43, beyond float32's range \(3.403e\+38\)$", 3, 9),
    ("float power overflow", B + "y = x * 10.0 ** 400\noutput y", PenroseCheckError, r"^this number is beyond float32's range", 3, 9),
    ("nan", B + "y = x * (inf - inf)\noutput y", PenroseCheckError, r"^this expression is nan \(not a number\)$", 3, 10),
    ("inside a where", B + "y = where(x > 0, x, sqrt(-1))\noutput y", PenroseCheckError, r"^sqrt of a negative number \(-1\)", 3, 21),
    ("inside a block", "dim t = 2, e = 3\nblock g(h[t, e]) {\n  return h / sqrt(e - 4)\n}\ninput x[t, e]\ny = g(x)\noutput y",
     PenroseCheckError, r"^sqrt of a negative number \(-1 at e = 3\)", 3, 14),
    # -- a tensor named like a dim
    ("param named like a dim", B + "param d[d]\noutput x", PenroseCheckError,
     r"^tensor name 'd' is already a dim; a tensor and a dim cannot share a name$", 3, 1),
    ("input named like a dim", B + "input e[t]\noutput x", PenroseCheckError, r"^tensor name 'e' is already a dim", 3, 1),
    ("buffer named like a dim", B + "buffer t[e] ~ zeros\noutput x", PenroseCheckError, r"^tensor name 't' is already a dim", 3, 1),
    ("block argument named like a dim", "dim t = 2, e = 3\nblock g(e[t]) {\n  return e\n}\ninput x[t]\ny = g(x)\noutput y",
     PenroseCheckError, r"^tensor name 'e' is already a dim", 2, 9),
    ("computed tensor named like a dim, read as a number", B + "d = x * 2\ny = x * d / sqrt(d)\noutput y", PenroseCheckError,
     r"^'d' here could be the tensor 'd' or the size of dim 'd'; rename the tensor, or write the size as T.shape\[i\]$", 4, 9),
    ("computed tensor named like a dim, under sqrt", B + "d = x * 2\ny = x / sqrt(d)\noutput y", PenroseCheckError,
     r"^'d' here could be the tensor 'd' or the size of dim 'd'", 4, 14),
    ("computed tensor named like a dim, negated", B + "d = x * 2\ny = -d\noutput y", PenroseCheckError, r"^'d' here could be", 4, 6),
    ("computed tensor named like a dim, alone", B + "d = x * 2\ny = d\noutput y", PenroseCheckError, r"^'d' here could be", 4, 5),
    ("computed tensor named like a dim, in where", B + "d = x * 2\ny = where(x > 0, d, 0)\noutput y", PenroseCheckError,
     r"^'d' here could be", 4, 18),
    ("dim named inf", "dim inf = 3\ninput x[inf]\noutput x", PenroseCheckError, r"^dim name 'inf' is reserved: it is infinity$", 1, 5),
    # -- one output statement, one label
    ("second output statement", B + "y = x * 2\noutput y\noutput x", PenroseCheckError,
     r"^a second 'output' statement; name every result in one, as 'output y, z'$", 5, 1),
    ("second label", B + "y = x * 2\nlabel y 'doubled'\nlabel y 'twice'\noutput y", PenroseCheckError,
     r"^'y' is labelled twice$", 5, 1),
    ("second label of an input", B + 'label x "tokens"\nlabel x "tokens"\noutput x', PenroseCheckError, r"^'x' is labelled twice$", 4, 1),
    # -- repeat counts
    ("repeat zero", B + BLK + "y = f(x) repeat 0\noutput y", PenroseCheckError, r"^repeat count 0 must be at least 1$", 6, 17),
    ("repeat negative", B + BLK + "y = f(x) repeat (-1)\noutput y", PenroseCheckError, r"^repeat count -1 must be at least 1$", 6, 18),
    ("repeat beyond the limit", B + BLK + "y = f(x) repeat 10001\noutput y", PenroseCheckError,
     r"^repeat count 10,001 is beyond the limit of 10,000; raise it with PENROSE_MAX_REPEAT=N or penrose.checker.LIMITS.repeat = N$",
     6, 17),
    ("repeat a dim beyond the limit", "dim t = 2, e = 3, L = 20000\ninput x[t, e]\n" + BLK + "y = f(x) repeat L\noutput y",
     PenroseCheckError, r"^repeat count 'L' \(size 20,000\) is beyond the limit of 10,000", 6, 17),
    ("repeat a dim of size zero", "dim t = 2, e = 3, L = 0\ninput x[t, e]\n" + BLK + "y = f(x) repeat L\noutput y",
     PenroseCheckError, r"^repeat count 'L' \(size 0\) must be at least 1$", 6, 17),
    # -- reductions over nothing
    ("max over an empty leg", "dim t = 2, e = 0\ninput x[t, e]\ny = max(x, e)\noutput y", PenroseCheckError,
     r"^max over leg 'e', which has size 0: there are no entries to reduce$", 3, 5),
    ("min over an empty leg", "dim t = 2, e = 0\ninput x[t, e]\ny = min(x, e)\noutput y", PenroseCheckError,
     r"^min over leg 'e', which has size 0: there are no entries to reduce$", 3, 5),
    ("mean over an empty leg", "dim t = 2, e = 0\ninput x[t, e]\ny = mean(x, e)\noutput y", PenroseCheckError,
     r"^mean over leg 'e', which has size 0", 3, 5),
    # -- masks name an undeclared dim
    ("causal, undeclared dim", B + "m = causal(t, s)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"^causal: undeclared dim 's'; declare it with 'dim s = SIZE' \(causal takes two dims, as causal\(t, p\)\)$", 3, 15),
    ("causal, near miss", B + "m = causal(tt, e)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"^causal: undeclared dim 'tt'; did you mean 't'\? \(causal takes two dims", 3, 12),
    ("causal of a tensor", B + "m = causal(t, x)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"^causal: 'x' is a tensor, not a dim \(causal takes two dims", 3, 15),
    ("block_causal, undeclared dim", B + "m = block_causal(t, s, block=2)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"^block_causal: undeclared dim 's'", 3, 21),
]


@pytest.mark.parametrize("text, cls, message, line, col", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused(text, cls, message, line, col):
    e = refusal(text)
    assert type(e) is cls, e.render()
    assert re.search(message, e.message), e.render()
    assert (e.line, e.col) == (line, col), e.render()
    rendered = e.render().split("\n")
    assert rendered[0].startswith(f"<string>:{line}:{col}: error: ")
    assert rendered[2].index("^") == 4 + col - 1  # the caret under the column


# the same diagrams, written validly, still check (the refusals are not too eager)
VALID = [
    ("normal std zero", B + "param W[e] ~ normal(std=0)\ny = x * W\noutput y"),
    ("uniform a equal to b", B + "param W[e] ~ uniform(a=1, b=1)\ny = x * W\noutput y"),
    ("xavier gain zero", B + "param W[e, d] ~ xavier(gain=0)\ny = einsum('te,ed->td', x, W)\noutput y"),
    ("sqrt of a size", B + "y = x / sqrt(d)\noutput y"),
    ("fractional power of a size", B + "y = x * d ** -0.5\noutput y"),
    ("sqrt of zero", B + "y = x * sqrt(d - 4)\noutput y"),
    ("negative to a whole power", B + "y = x * (-2) ** 3 * (-2.0) ** 2.0\noutput y"),
    ("a tensor divided by zero is torch's inf", B + "y = x / (d - 4)\noutput y"),
    ("infinity", B + "y = where(x > 0, x, -inf * 2)\noutput y"),
    ("big but fitting", B + "y = x * 2 ** 62 * 1e38\noutput y"),
    ("computed tensor named like a dim, read as a tensor", B + "d = x * 2\ny = einsum('te,te->t', x, d) + sum(d, e)\noutput y"),
    ("one output statement, two results", B + "y = x * 2\noutput y, x"),
    ("labels of two tensors", B + "y = x * 2\nlabel y 'a'\nlabel x 'b'\noutput y"),
    ("repeat at the limit", B + BLK + "y = f(x) repeat 10000\noutput y"),
    ("causal of declared dims", B + "m = causal(t, t)\ny = where(m, 0, 1)\noutput y"),
    ("sum over an empty leg is 0", "dim t = 2, e = 0\ninput x[t, e]\ny = sum(x, e)\noutput y"),
]


@pytest.mark.parametrize("text", [v[1] for v in VALID], ids=[v[0] for v in VALID])
def test_still_valid(text):
    check(parse(text))


def test_every_zoo_diagram_still_checks():
    """The paper's key `k` beside its concept dim `k`, Steerling's value `v` beside its vocabulary `v`."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "zoo"
    names = {"paper/steerling_listing.pen", "steerling/transformer_layer.pen"}
    for name in sorted(names):
        check(penrose.parse_file(root / name))


def test_notes_point_at_the_first_one():
    e = refusal(B + "y = x * 2\noutput y\noutput x")
    assert [(text, s.line, s.col) for text, s in e.notes] == [("the first 'output' statement is here", 4, 1)]
    e = refusal(B + "y = x * 2\nlabel y 'doubled'\nlabel y 'twice'\noutput y")
    assert [(text, s.line, s.col) for text, s in e.notes] == [("first labelled here", 4, 1)]
    e = refusal(B + "param d[d]\noutput x")
    assert [(text, s.line, s.col) for text, s in e.notes] == [("the dim is declared here", 1, 19)]
    e = refusal(B + "d = x * 2\ny = x * d\noutput y")
    assert [(text, s.line) for text, s in e.notes] == [("the tensor is defined here", 3), ("the dim is declared here", 1)]


# ---- sizes that cannot be allocated -----------------------------------------------------------

BIG = "dim t = 2, d = 4\ninput x[t, d]\nparam W[d, d]\ny = einsum('td,de->te', x, W)\noutput y"


def test_a_param_too_big_to_allocate_names_it_with_entries_and_bytes():
    e = refusal(BIG, d=10**12)
    assert e.message == (
        "param 'W' [d=1,000,000,000,000, d=1,000,000,000,000] would hold 1e+24 entries, 4e+24 bytes as float32, "
        "beyond the limit of 16 GiB per tensor; raise it with PENROSE_MAX_TENSOR_BYTES=N or penrose.checker.LIMITS.tensor_bytes = N"
    )
    assert (e.line, e.col) == (3, 1)
    e = refusal(BIG.replace("d = 4", "d = 100000"))  # a declared size, not only an override
    assert "would hold 10,000,000,000 entries, 37.3 GiB as float32" in e.message
    check(parse(BIG), d=65536)  # 16 GiB exactly fits


def test_buffers_and_block_params_meet_the_limit_too():
    e = refusal("dim t = 2, d = 100000\ninput x[t, d]\nbuffer P[d, d] ~ zeros\ny = x * 2\noutput y")
    assert e.message.startswith("buffer 'P' [d=100,000, d=100,000] would hold") and (e.line, e.col) == (3, 1)
    e = refusal("dim t = 2, d = 100000\nblock g(h[t, d]) {\n  param W[d, d]\n  return einsum('td,de->te', h, W)\n}\n"
                "input x[t, d]\ny = g(x)\noutput y")
    assert e.message.startswith("param 'W' [d=100,000, d=100,000]") and (e.line, e.col) == (3, 3)


def test_compile_with_a_size_override_is_refused_before_allocating():  # its time: bench/guards.py
    with pytest.raises(PenroseCheckError, match=r"param 'W' \[d=1,000,000,000,000, d=1,000,000,000,000\] would hold 1e\+24"):
        penrose.compile(BIG, d=10**12)


def test_the_total_of_all_params_counts_repeats():
    text = ("dim t = 2, e = 20000, L = 100\nblock g(x[t, e]) {\n  param W[e, e]\n  return einsum('te,ef->te', x, W)\n}\n"
            "input z[t, e]\ny = g(z) repeat L\noutput y")
    e = refusal(text)
    assert e.message.startswith("the params and buffers would take 149 GiB as float32 in all once 'g' (block 'g' × 100) is built")
    assert "beyond the limit of 64 GiB; raise it with PENROSE_MAX_TOTAL_BYTES=N or penrose.checker.LIMITS.total_bytes = N" in e.message
    assert (e.line, e.col) == (7, 5)
    check(parse(text), L=10)


@pytest.fixture
def limits(monkeypatch):
    """LIMITS as the test leaves it is restored; the environment too."""
    names = ("tensor_bytes", "total_bytes", "repeat", "block_depth", "expanded")
    saved = {n: getattr(LIMITS, n) for n in names}
    for n in names:
        monkeypatch.delenv(LIMITS._ENV[n], raising=False)
    yield LIMITS
    for n, v in saved.items():
        setattr(LIMITS, n, v)


def test_limits_are_raised_in_python(limits):
    assert penrose.checker.LIMITS is LIMITS is check_module.LIMITS
    big = BIG.replace("d = 4", "d = 100000")
    refusal(big)
    limits.tensor_bytes = 2**36
    check(parse(big))
    limits.repeat = 20_000
    check(parse(B + BLK + "y = f(x) repeat 15000\noutput y"))
    limits.tensor_bytes = limits.repeat = None  # back to the environment, then the default
    refusal(big)


def test_limits_are_raised_by_environment_variables(limits, monkeypatch):
    big = BIG.replace("d = 4", "d = 100000")
    monkeypatch.setenv("PENROSE_MAX_TENSOR_BYTES", "1e11")
    check(parse(big))
    monkeypatch.setenv("PENROSE_MAX_TENSOR_BYTES", "1_000")
    assert "beyond the limit of 1000 bytes per tensor" in refusal(BIG.replace("d = 4", "d = 16")).message
    monkeypatch.setenv("PENROSE_MAX_REPEAT", "3")
    assert refusal(B + BLK + "y = f(x) repeat 4\noutput y").message.startswith("repeat count 4 is beyond the limit of 3;")
    limits.repeat = 5  # Python wins over the environment
    check(parse(B + BLK + "y = f(x) repeat 4\noutput y"))


# ---- block calls nested deep, diagrams that expand past the limit (issue 37) ------------------


def chain(n: int, expr: str = "b{i}(h) + h") -> str:
    """n blocks, b{n-1} calling b{n-2} ... calling b0, and the diagram calling b{n-1}; block b{i}
    takes lines 3i + 3 to 3i + 5, its call on line 3i + 4 at column 10."""
    text = B + "block b0(h[t, e]) {\n  return relu(h)\n}\n"
    for i in range(1, n):
        text += f"block b{i}(h[t, e]) {{\n  return {expr.format(i=i - 1)}\n}}\n"
    return text + f"y = b{n - 1}(x)\noutput y\n"


def test_block_calls_nested_too_deep_are_refused_at_the_call_naming_the_chain():
    """Regression (issue 37): 250 nested block calls checked and compiled, then forward raised
    RecursionError. Refused at the call that nests one level too deep."""
    check(parse(chain(100)))  # at the limit
    for n in (101, 250):
        e = refusal(chain(n))
        assert type(e) is PenroseCheckError
        assert e.message.startswith("block calls nest 101 deep through this call (b100 -> b99 -> b98 -> ... -> b1 -> b0), "
                                    "beyond the limit of 100: each level is a nested Python call when the diagram runs")
        assert e.message.endswith("raise it with PENROSE_MAX_BLOCK_DEPTH=N or penrose.checker.LIMITS.block_depth = N")
        assert (e.line, e.col) == (3 * 100 + 4, 10)  # b100's call of b99


def test_the_depth_limit_is_raised_in_python_and_by_the_environment(limits, monkeypatch):
    limits.block_depth = 120
    check(parse(chain(120)))
    limits.block_depth = None
    monkeypatch.setenv("PENROSE_MAX_BLOCK_DEPTH", "3")
    e = refusal(chain(4))
    assert "block calls nest 4 deep through this call (b3 -> b2 -> b1 -> b0), beyond the limit of 3" in e.message
    assert (e.line, e.col) == (3 * 3 + 4, 10)


def test_blocks_nested_to_the_limit_run_under_the_default_recursion_limit():
    """A diagram at the depth limit runs forward and backward, compiled, as standalone source and
    interpreted, from a caller already 300 frames deep (pytest's own are some 35 more) under
    Python's default limit of 1,000 (each level takes 4 frames compiled, 5 interpreted)."""
    import sys

    import torch

    from sources import quiet, standalone

    text = chain(LIMITS.value("block_depth"))
    runs = {"compiled": quiet(penrose.compile, text, seed=0), "standalone": standalone(text),
            "interpreted": lambda z: penrose.interpret(text, z)}

    def deep(n, f):
        return f() if n == 0 else deep(n - 1, f)

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        for name, run in runs.items():
            x = torch.randn(2, 3, requires_grad=True)
            y = deep(300, lambda: run(x))
            y.sum().backward()
            assert x.grad is not None and torch.isfinite(x.grad).all(), name
    finally:
        sys.setrecursionlimit(old)


NESTED = ("dim t = 2, e = 3\ninput x[t, e]\nblock inner(h[t, e]) {{\n  return relu(h)\n}}\n"
          "block outer(h[t, e]) {{\n  y = inner(h) repeat {inner}\n  return y\n}}\n"
          "y = outer(x) repeat {outer}\noutput y\n")  # str.format: {inner}, {outer} the repeat counts


def test_a_repeat_inside_a_repeat_expanding_past_the_limit_is_refused_at_the_repeat():
    """Regression (issue 37): repeat 10000 inside repeat 10000 passed the checker, then compiled
    for ever (10**8 block copies). Refused at the outer repeat count, before anything is built."""
    e = refusal(NESTED.format(inner=10_000, outer=10_000))
    assert e.message == (
        "10,000 runs of block 'outer' (10,002 statements a run, its block calls expanded) make one run of the diagram "
        "100,020,001 statements, beyond the limit of 500,000 (a repeated block is built once per repeat, and every "
        "statement runs on each call); raise it with PENROSE_MAX_EXPANDED=N or penrose.checker.LIMITS.expanded = N")
    assert (e.line, e.col) == (10, 21)
    check(parse(NESTED.format(inner=1_000, outer=100)))  # 100,201 statements
    e = refusal(NESTED.format(inner=1_000, outer="L").replace("dim t = 2", "dim L = 600, t = 2"))
    assert e.message.startswith("600 runs of block 'outer' (1,002 statements a run") and "601,201 statements" in e.message
    assert (e.line, e.col) == (10, 21)


def test_a_block_that_expands_past_the_limit_by_itself_is_refused_inside_it():
    text = ("dim t = 2, e = 3\ninput x[t, e]\nblock a(h[t, e]) {\n  return relu(h)\n}\n"
            "block b(h[t, e]) {\n  y = a(h) repeat 10000\n  return y\n}\n"
            "block c(h[t, e]) {\n  y = b(h) repeat 10000\n  return y\n}\n"
            "y = x * 2\noutput y\n")  # c is never called: it still cannot be built
    e = refusal(text)
    assert e.message.startswith("10,000 runs of block 'b' (10,002 statements a run, its block calls expanded) make one run "
                                "of block 'c' 100,020,001 statements")
    assert (e.line, e.col) == (11, 19)


def test_shared_calls_count_every_run(limits):
    """A block called three times (one instance, `as g`) runs three times: each run counts."""
    text = B + BLK + "y = f(x) as g\ny = f(y) as g\ny = f(y) as g\noutput y\n"
    limits.expanded = 6
    check(parse(text))  # 3 calls + 3 runs of f's one statement
    limits.expanded = 5
    e = refusal(text)
    assert e.message.startswith("block 'f' (1 statement a run, its block calls expanded) make one run of the diagram 6 statements")
    assert (e.line, e.col) == (8, 5)


def test_the_expansion_limit_is_raised_by_the_environment(limits, monkeypatch):
    monkeypatch.setenv("PENROSE_MAX_EXPANDED", "1_000_000")
    check(parse(NESTED.format(inner=1_000, outer=900)))  # 901,801 statements
    monkeypatch.setenv("PENROSE_MAX_EXPANDED", "0")
    with pytest.raises(PenroseCheckError, match=r"PENROSE_MAX_EXPANDED must be at least 1, got '0'"):
        check(parse(B + "output x"))


@pytest.mark.parametrize("value", ["lots", "1.5", "0", "-3"])
def test_a_bad_limit_in_the_environment_is_an_error(limits, monkeypatch, value):
    monkeypatch.setenv("PENROSE_MAX_TENSOR_BYTES", value)
    with pytest.raises(PenroseCheckError, match=rf"PENROSE_MAX_TENSOR_BYTES must be (a whole number|at least 1), got '{re.escape(value)}'"):
        check(parse(BIG))


# ---- deep programs ----------------------------------------------------------------------------

HEAD = "dim e = 3\ninput x[e]\n"


def deep_sum(n):
    return HEAD + "y = " + " + ".join(["x"] * n) + "\noutput y\n"


def deep_calls(n):
    return HEAD + "y = " + "tanh(" * n + "x" + ")" * n + "\noutput y\n"


def deep_parens(n):
    return HEAD + "y = " + "(" * n + "x" + ")" * n + "\noutput y\n"


def deep_scalar(n):
    return HEAD + "y = x * (" + " + ".join(["1"] * n) + ")\noutput y\n"


@pytest.mark.parametrize(
    "text", [deep_sum(10_000), deep_calls(1_000), deep_parens(1_000), deep_calls(10_000), deep_scalar(10_000)],
    ids=["10,000-term sum", "1,000 nested calls", "1,000 parentheses", "10,000 nested calls", "10,000-term number"],
)
def test_deep_programs_parse_and_check(text):
    c = check(parse(text))  # about 0.5 s on the project's machine: bench/guards.py
    assert c.outputs[0][1].legs == ("e",)


def test_a_10000_term_number_is_evaluated():
    e = refusal(HEAD + "y = x * sqrt(" + " + ".join(["1"] * 10_000) + " - 20000)\noutput y\n")
    assert e.message == "sqrt of a negative number (-10000); the result would not be real"


def test_deeper_than_the_room_is_a_positioned_error(monkeypatch):
    import penrose.stack

    monkeypatch.setattr(penrose.stack, "RECURSION_LIMIT", 6_000)  # less room, so the test is quick
    e = refusal(deep_calls(5_000))
    assert type(e) is PenroseCheckError
    assert re.match(r"this statement nests more than about [\d,]+ levels deep; split it into several statements", e.message)
    assert (e.line, e.col) == (3, 1)


def test_parse_and_check_run_deep_from_a_shallow_caller():
    """The caller's recursion limit is not the limit: the stages run with their own room."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        c = check(parse(deep_sum(2_000)))
    finally:
        sys.setrecursionlimit(old)
    assert c.outputs[0][0] == "y"


# ---- the parser is re-entrant -----------------------------------------------------------------


def test_threads_parse_at_once_and_keep_their_own_comments():
    def text(i):
        lines = [f"# diagram {i}", "dim e = 3", f"input x[e]   # input of {i}"]
        lines += [f"y{j} = x * {j}   # step {j} of {i}" for j in range(40)]
        return "\n".join(lines + [f"output y39   # out {i}"]) + "\n"

    expected = {i: penrose.parse(text(i)) for i in range(8)}
    notes = {i: [getattr(s, "note", None) for s in d.body] for i, d in expected.items()}
    got: dict = {}
    errors: list = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            barrier.wait()
            for _ in range(15):
                d = penrose.parse(text(i))
                got.setdefault(i, []).append([getattr(s, "note", None) for s in d.body])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for i in range(8):
        assert all(n == notes[i] for n in got[i]), i
        assert notes[i][-1] == f"out {i}"


def test_output_then_reassigned_is_refused():
    """Found by the differential fuzzer: 'output y' typed y at its statement while forward
    returned the later y; a name that is output may not be assigned again."""
    text = "dim a = 2, b = 3\ninput x[a]\nparam W[a, b]\ny = x + 1\noutput y\ny = einsum('a,ab->b', y, W)\n"
    with pytest.raises(PenroseCheckError, match=r"'y' is assigned again after 'output y'") as e:
        penrose.load(text)
    assert (e.value.line, e.value.col) == (6, 1)
    assert e.value.notes[0][1].line == 5
