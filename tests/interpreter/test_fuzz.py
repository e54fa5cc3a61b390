"""Mutated diagrams never crash: parse + check + compile (and a forward pass) succeed or raise a
PenroseError, never another exception type.

Valid seeds are mutated character by character, token by token and line by line, with random
bytes spliced in (as tinygrad's fuzzers do), and every crash found became a named regression
case below (a list of strings with one-line comments, as opt_einsum keeps them).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import penrose
from penrose.compiler import build, generate_source
from penrose.errors import PenroseError
from penrose.parser import parse

SEEDS = [
    # self-attention with a causal mask, captions, notes and a late dim
    """\
# index legend: t token, e embedding, d head dim
dim t = 4, e = 6, d = 2
input Z[t, e]
param W_q[e, d] ~ normal(std=0.02)
param W_k[e, d] ~ xavier
param W_v[e, d]
# 1) Affinity. Yields: q, k.
q = einsum('te,ed->td', Z, W_q)  # queries
k = einsum('pe,ed->pd', Z, W_k)
v = einsum('pe,ed->pd', Z, W_v)
s = einsum('td,pd->tp', q, k) / sqrt(d)
s = where(causal(t, p), s, -inf)
a = softmax(s, p)
y = einsum('tp,pd->td', a, v)
output y
dim p = 4
""",
    # blocks, repeat, instances, norms, two outputs
    """\
dim t = 3, e = 4, f = 8, L = 2
input x[t, e]
param g[e] ~ ones
block mlp(x[t, e]) {
  param W1[e, f] ~ uniform(a=-0.1, b=0.1)
  param W2[f, e]
  h = relu(einsum('te,ef->tf', x, W1))
  return einsum('tf,fe->te', h, W2)
}
y = layernorm(x, e, weight=g)
y = mlp(y) repeat L as layers
z = mlp(y) as second
z = rmsnorm(z, e, weight=g, eps=1e-6)
output y, z
""",
    # ids, masks, gather, spaced einsum, split / concat, topk, reductions, every unary function
    """\
dim v = 10, t = 5, e = 4, f = 4, f2 = 8, k = 2
input ids[t] : int
input m[t, e] : bool
param E[v, e]
param Wu[e, f2] ~ eye
x = gather(E, ids)
u = einsum('tok emb, emb f2 -> tok f2', x, Wu)
up, gate = split(u, f2, [f, f])
h = up * sigmoid(gate) - gelu(gate) ** 2 + silu(up) / 2
c = concat([up, gate], f, f2)
r = topk(c, f2, k=k)
r = dropout(r, p=0.1)
r = clamp(r, min=-10, max=10) + x.shape[0] * e
s = sum(r, f2) + mean(x, e) - max(x, e)
s = tanh(s.detach()) + exp(s) + log(abs(s) + 1) + softplus(s)
w = where(m, x, 0.0)
label x "token embeddings"
output s, w
""",
    # n-ary and implicit einsums, log_softmax by position, shapes
    """\
dim a = 2, b = 3, c = 4
input A[a, b]
input B[b, c]
input C[c, a]
y = einsum('ab,bc,ca', A, B, C)
z = einsum('ab,bc,ca->', A, B, C)
w = log_softmax(A + 1, dim=-1) * A.shape[1]
output y, w
""",
    # heads as legs: unflatten, rope, flatten, block-causal masks
    """\
dim t = 4, e = 6, h = 3, d = 2, hd = 6, p = 4
input x[t, e]
param Wq[e, hd]
param g[e] ~ ones
q = einsum('te,ef->tf', layernorm(x, e, weight=g), Wq)
qh = unflatten(q, f, [h, d])
r = rope(qh, t, d, base=100)
back = flatten(r, [h, d], hd)
s = log_softmax(back, dim=-1) + back.shape[-1] / sqrt(hd)
a = einsum('te,pe->tp', x, x)
m = softmax(where(block_causal(t, p, block=2), a, -inf), p)
output s, m
""",
    # blocks calling blocks, several results, batch legs written out
    """\
dim t = 3, e = 4, L = 2
input x[..., t, e]
block inner(a[t, e]) {
  param W[e, e] ~ xavier
  return gelu(einsum('tf,fe->te', a, W))
}
block outer(a[t, e], b[t, e]) {
  param s[e] ~ constant(value=0.5)
  c = inner(a) + b * s
  return c, a - b
}
y, z = outer(x, x)
y = inner(y) repeat L as stack
w = inner(z) as other
output y, w
""",
]

# Every crash the fuzzer found, kept as a case that must now compile and run, or fail cleanly.
REGRESSIONS = [
    # a NUL byte in a comment reached the generated source: compile() raised SyntaxError
    "dim e = 2\ninput x[e]  # a\x00b\noutput x\n",
    # a lone surrogate in a caption reached the generated source: UnicodeEncodeError
    "dim e = 2\n# 1) step \ud800\ninput x[e]\ny = x * 2\noutput y\n",
    # gather of an expression was emitted as `self.E - 1[ids]`: TypeError at run time
    "dim v = 4, t = 3, e = 2\ninput ids[t] : int\nparam E[v, e]\nx = gather(E - 1, ids)\noutput x\n",
    # layernorm over a non-last leg of an expression emitted `x + 1.movedim(...)`: SyntaxError
    "dim e = 3, t = 2\ninput x[e, t]\ny = layernorm(x + 1, e)\noutput y\n",
    # a negative dim size was accepted: torch.empty raised at build time
    "dim a = -2, b = 3\nparam W[a, b]\ninput x[b]\ny = einsum('ab,b->a', W, x)\noutput y\n",
    # a dim size beyond 64 bits: torch.empty overflowed at build time
    "dim t = 10000000000, u = t * t * t\nparam W[u]\ninput x[t]\ny = x\noutput y\n",
    # an integer literal beyond int64: OverflowError at run time
    "dim e = 2\ninput x[e]\ny = x * 100000000000000000000\noutput y\n",
    # a float literal beyond float32 as where()'s value: RuntimeError at run time
    "dim e = 2\ninput x[e]\ny = where(x > 0, x, 0.1e90)\noutput y\n",
    # ... and as a clamp bound
    "dim e = 2\ninput x[e]\ny = clamp(x, 1e90)\noutput y\n",
    # an infinite init argument was written as `inf` into the source: NameError at build time
    "dim e = 2\ninput x[e]\nparam W[e] ~ normal(std=1e400)\ny = x * W\noutput y\n",
    # an infinite eps or rope base likewise
    "dim e = 2\ninput x[e]\ny = layernorm(x, e, eps=1e999)\noutput y\n",
    "dim t = 2, e = 2\ninput x[t, e]\ny = rope(x, t, e, base=inf)\noutput y\n",
    # a block_causal block beyond int64: OverflowError at run time
    "dim t = 2\ninput x[t, t]\ny = where(block_causal(t, t, block=100000000000000000000), x, 0)\noutput y\n",
    # CRLF line ends with comments (formatter round trip; must also compile)
    "dim e = 2  # size\r\n# a caption \r\ninput x[e]\r\noutput x\r\n",
    # form feed and U+2028 inside comments shifted the lines the parser reported
    "dim e = 2  # a\x0cb\ninput x[e]  # c\u2028d\ny = x $ 2\noutput y\n",
]

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\.\.|->|\*\*|//|\s+|.", re.S)
SNIPPETS = [
    "dim", "input", "param", "buffer", "output", "return", "block", "include", "label", "as", "repeat", "einsum",
    "(", ")", "[", "]", "{", "}", ",", "=", "~", ":", "...", "'", '"', "->", "+", "-", "*", "/", "//", "**", ".",
    "#", "\n", "0", "1", "-1", "1e9", "inf", "x", "t", "e", "softmax", "where", "causal", "split", "concat",
    "gather", "int", "bool", ".shape[0]", ".detach()", "sum", "mlp", "<", "==", "'ij,jk->ik'", "'...'", "\\\n",
    "\t", "\r", "\x00", "é", "\u2028", "lambda", "self", "training", "_x",
]


@st.composite
def mutated(draw):
    """A seed with 1-3 mutations: characters, tokens, lines, snippets or random bytes."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["del", "dup", "swap", "snippet", "replace", "bytes", "token", "line"]))
        i = draw(st.integers(0, len(text)))
        j = min(len(text), i + draw(st.integers(1, 8)))
        if op == "del":
            text = text[:i] + text[j:]
        elif op == "dup":
            text = text[:i] + text[i:j] * 2 + text[j:]
        elif op == "swap" and len(text) > 1:
            a, b = sorted((i % len(text), draw(st.integers(0, len(text) - 1))))
            chars = list(text)
            chars[a], chars[b] = chars[b], chars[a]
            text = "".join(chars)
        elif op == "snippet":
            text = text[:i] + draw(st.sampled_from(SNIPPETS)) + text[i:]
        elif op == "replace":
            text = text[:i] + draw(st.sampled_from(SNIPPETS)) + text[j:]
        elif op == "bytes":
            text = text[:i] + draw(st.binary(min_size=1, max_size=3)).decode("latin-1") + text[i:]
        elif op == "token":
            toks = _TOKEN.findall(text)
            a, b = draw(st.integers(0, len(toks) - 1)), draw(st.integers(0, len(toks) - 1))
            kind = draw(st.sampled_from(["del", "dup", "swap"]))
            if kind == "del":
                del toks[a]
            elif kind == "dup":
                toks.insert(a, toks[b])
            else:
                toks[a], toks[b] = toks[b], toks[a]
            text = "".join(toks)
        else:
            lines = text.split("\n")
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            kind = draw(st.sampled_from(["del", "dup", "swap"]))
            if kind == "del":
                del lines[a]
            elif kind == "dup":
                lines.insert(a, lines[b])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


def _small(c) -> bool:
    """Keep mutated sizes ('dim e = 66') from allocating too much."""
    sizes = [s for s in c.dim_sizes().values() if s is not None]
    repeats = [i.repeat or 1 for b in [c, *c.blocks.values()] for i in b.instances.values()]
    return max(sizes, default=0) <= 64 and c.param_count() <= 50_000 and max(repeats, default=1) <= 8


def _inputs(c) -> dict:
    out = {}
    for d in c.inputs:
        shape = [min(c.size(cl) or 3, 16) for cl in d.type.cls]
        if d.tensor.dtype == "int":
            out[d.tensor.name] = torch.zeros(shape, dtype=torch.long)
        elif d.tensor.dtype == "bool":
            out[d.tensor.name] = torch.ones(shape, dtype=torch.bool)
        else:
            out[d.tensor.name] = torch.randn(shape)
    return out


def pipeline(text: str) -> str:
    """parse → check → compile → run; returns how far it got. Only PenroseError may escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = penrose.load(text)
        if not _small(c):
            return "checked"
        module = build(c, seed=0)
        generate_source(c)  # the standalone variant too
        module(**_inputs(c))
    return "ran"


def assert_no_crash(text: str):
    try:
        pipeline(text)
    except PenroseError as e:
        e.render()  # rendering the error must not crash either
    except Exception as e:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"{type(e).__name__}: {e}\nfor the text:\n{text!r}") from e


def test_seeds_are_valid():
    for text in SEEDS:
        assert pipeline(text) == "ran", text


@pytest.mark.parametrize("text", REGRESSIONS)
def test_regression(text):
    assert_no_crash(text)


@settings(max_examples=400)
@given(mutated())
def test_mutations_raise_only_penrose_errors(text):
    assert_no_crash(text)


@settings(max_examples=100)
@given(st.text(max_size=80))
def test_random_text(text):
    assert_no_crash(text)


def test_odd_file_names_make_valid_source():
    # a file name went into the generated docstring unescaped: '\N' and '"""' broke compile()
    d = parse("dim e = 2\ninput x[e]\ny = x * 2\noutput y\n", file='we\\N"""ird.pen')
    c = penrose.check(d)
    compile(generate_source(c), "generated.py", "exec")
    assert build(c)(torch.ones(2)).tolist() == [2.0, 2.0]
