"""Non-persistent buffers (`register_buffer(..., persistent=False)`): the language's `unsaved`
buffers, and penrose.trace writing them, so that a traced module loads strictly from
`module.state_dict()` alone (issue 25).

The language: `buffer NAME[legs] ~ init unsaved` parses (fast path and Lark alike), formats back,
checks, compiles to `register_buffer(..., persistent=False)` and is made from its init by the
interpreter when the params leave it out; the inits `causal`, `arange`, `rotary(base=)` make
what modules compute for themselves. The tracer: a non-persistent buffer whose values one init
makes exactly is written `unsaved`; any other stays a saved buffer, named in the header.
"""

from __future__ import annotations

import pytest
import torch
from test_trace import round_trip
from torch import nn

import penrose
from penrose.compiler import generate_source
from penrose.errors import PenroseError
from penrose.fmt import format_diagram
from penrose.parser import parse

TEXT = """\
dim t = 4, s = 4, e = 3, u = 2
buffer mask[t, s] ~ causal unsaved
buffer pos[u] ~ arange unsaved
buffer inv[u] ~ rotary(base=100) unsaved
buffer kept[e] ~ ones
input x[t, s]
y = where(mask != 0, x, 0.0) + sum(pos * inv, u) + sum(kept, e)
output y
"""


def test_unsaved_buffers_parse_format_and_compile_as_persistent_false():
    assert format_diagram(parse(TEXT)) == TEXT
    saved = {s.name: s.saved for s in parse(TEXT).body if getattr(s, "kind", None) == "buffer"}
    assert saved == {"mask": False, "pos": False, "inv": False, "kept": True}
    m = penrose.compile(TEXT)
    assert list(m.state_dict()) == ["kept"]  # only the saved buffer
    assert {n for n, _ in m.named_buffers()} == {"mask", "pos", "inv", "kept"}
    source = generate_source(penrose.load(TEXT))  # standalone
    assert "self.register_buffer('mask', torch.empty(T, S), persistent=False)" in source
    assert "self.mask.copy_(torch.ones(self.mask.shape[-2:]).tril().expand(self.mask.shape))" in source
    m.load_state_dict({"kept": torch.ones(3)}, strict=True)
    assert m.mask.tolist() == torch.ones(4, 4).tril().tolist()
    assert m.pos.tolist() == [0.0, 1.0]
    torch.testing.assert_close(m.inv, 1.0 / (100 ** (torch.arange(0, 4, 2).float() / 4)), rtol=0, atol=0)


def test_the_interpreter_makes_unsaved_buffers_the_params_leave_out():
    x = torch.randn(2, 4, 4)
    m = penrose.compile(TEXT)
    want = m(x)
    got = penrose.interpret(TEXT, x, params={"kept": torch.ones(3)})
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_unsaved_is_only_for_buffers_and_causal_needs_two_legs():
    with pytest.raises(PenroseError):
        parse("dim e = 2\nparam W[e] unsaved\ninput x[e]\ny = x * W\noutput y\n")
    with pytest.raises(PenroseError, match="causal initialises a tensor with two legs"):
        penrose.load("dim e = 2\nbuffer M[e] ~ causal unsaved\ninput x[e]\ny = x * M\noutput y\n")


# ---- the tracer ------------------------------------------------------------------------------------------


class CausalRotary(nn.Module):
    """A GPT-2-style bool causal mask and a LLaMA-style inverse-frequency table, both registered
    with persistent=False (Hugging Face's and lit-gpt's habit), and a constant scale."""

    def __init__(self, n=6, width=8):
        super().__init__()
        self.proj = nn.Linear(width, width)
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, n, n)
        self.register_buffer("bias", mask, persistent=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, width, 2, dtype=torch.int64).float() / width))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("halves", torch.full((width,), 0.5), persistent=False)

    def forward(self, x):
        t = x.size(1)
        att = self.proj(x) @ x.transpose(-2, -1)
        att = att.masked_fill(~self.bias[:, :t, :t], float("-inf")).softmax(dim=-1)
        return (att @ x) * self.halves + self.inv_freq.sum()


def test_regression_non_persistent_buffers_load_strictly_from_the_state_dict_alone():
    """The diagram declared them as ordinary buffers, so `load_state_dict(module.state_dict(),
    strict=True)` failed on them (missing keys): now each is `unsaved`, made from its init."""
    m = CausalRotary()
    x = torch.randn(2, 5, 8)
    text = round_trip(m, x)  # float64, strict: module.state_dict() alone
    assert "buffer bias[" in text and "~ causal unsaved" in text
    assert "~ rotary(base=10000) unsaved" in text
    assert "~ constant(value=0.5) unsaved" in text
    assert "persistent=False" not in text  # no header asking for the buffers
    twin = penrose.compile(text)  # float32 too
    twin.load_state_dict(CausalRotary().state_dict(), strict=True)
    assert set(twin.state_dict()) == set(CausalRotary().state_dict())


class OddBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("noise", torch.tensor([0.3, -1.0, 2.0, 0.7]), persistent=False)

    def forward(self, x):
        return self.lin(x) * self.noise


def test_a_non_persistent_buffer_no_init_makes_stays_saved_and_is_named():
    m = OddBuffer()
    x = torch.randn(2, 3, 4)
    text = penrose.trace(m, x)
    assert "buffer noise[f]\n" in text  # saved: no init makes these values
    assert "# Buffers registered with persistent=False: noise;" in text
    twin = penrose.compile(text)
    twin.load_state_dict({**m.state_dict(), **dict(m.named_buffers())}, strict=True)
    torch.testing.assert_close(twin(x), m(x))


class Positions(nn.Module):
    """BERT's embeddings: position ids and token type ids as non-persistent buffers."""

    def __init__(self, n=8, width=6):
        super().__init__()
        self.word = nn.Embedding(11, width)
        self.position = nn.Embedding(n, width)
        self.kind = nn.Embedding(2, width)
        self.register_buffer("position_ids", torch.arange(n).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, n, dtype=torch.long), persistent=False)

    def forward(self, ids):
        b, t = ids.shape
        position_ids = self.position_ids[:, :t]
        kinds = torch.gather(self.token_type_ids.expand(position_ids.shape[0], -1), dim=1, index=position_ids)
        return self.word(ids) + self.position(position_ids) + self.kind(kinds.expand(b, t))


def test_regression_integer_position_and_token_type_buffers_are_rows_of_their_tables():
    """BERT's embeddings read `position_ids` (0 .. n-1) and `token_type_ids` (zeros), integer
    buffers registered with persistent=False: the diagram said `buffer position_ids ~ arange` and
    failed to check (a buffer is float, the embedding wants int ids). Positions are a slice of the
    position table, one id everywhere is that row of its table; neither is a buffer of the diagram."""
    m = Positions()
    ids = torch.randint(0, 11, (2, 5))
    text = round_trip(m, ids)  # strict: module.state_dict() alone
    assert "position_ids" not in text.split("index legend")[1] and "token_type_ids" not in text
    assert "slice(weight" in text and "select(weight" in text


def test_rotary_tables_compiled_and_interpreted_agree_with_hugging_face():
    """`rotary_cos`, `rotary_sin`: cos and sin of position times frequency, the frequencies twice
    over, as Hugging Face's rotary embedding computes them (independently written here)."""
    text = "dim p = 6, d = 4, t = 6\nbuffer c[p, d] ~ rotary_cos(base=500) unsaved\nbuffer s[p, d] ~ rotary_sin(base=500) unsaved\n" \
           "input x[t, d]\ny = x * c + x * s\noutput y\n"
    inv = 1.0 / (500 ** (torch.arange(0, 4, 2, dtype=torch.int64).float() / 4))
    emb = torch.cat([torch.arange(6).float()[:, None] * inv[None], torch.arange(6).float()[:, None] * inv[None]], dim=-1)
    m = penrose.compile(text)
    torch.testing.assert_close(m.c, emb.cos(), rtol=0, atol=0)
    torch.testing.assert_close(m.s, emb.sin(), rtol=0, atol=0)
    x = torch.randn(6, 4)
    torch.testing.assert_close(penrose.interpret(text, x, params={}), m(x), rtol=0, atol=0)
