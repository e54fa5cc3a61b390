"""penrose.trace on ordinary PyTorch the first tracer refused or failed on: named regressions for
each bug (issue 25), in-place ops, constant fills, repeats, casts, bool-buffer masks, extreme
fills, and refusals that name the op, the cause and the user's own line (inside helpers too).

Each round trip is tests/tracing/test_trace.py's: trace → compile → strict load_state_dict → the same
outputs and gradients (inputs' and parameters') in float64.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from test_trace import round_trip
from torch import nn

import penrose
from penrose.tracing import PenroseTraceError


def _line_of(obj, code):
    """The line number of the first line of `obj`'s source that contains `code`."""
    lines, first = inspect.getsourcelines(obj)
    return first + next(i for i, line in enumerate(lines) if code in line)


# ---- bugs -------------------------------------------------------------------------------------------------


class NonPersistentScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.rand(4) + 0.5, persistent=False)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_regression_non_persistent_buffer_read_in_forward_is_traced():
    """It crashed the writer (GuardOnDataDependentSymNode at trace/write.py): its value was
    export's fake tensor, whose `(value == 1).all()` guards on data."""
    m = NonPersistentScale().double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    text = penrose.trace(m, x)
    assert "buffer scale[" in text
    assert "# Buffers registered with persistent=False: scale;" in text  # and how to load them
    twin = penrose.compile(text).double()
    twin.load_state_dict({**m.state_dict(), "scale": m.scale})
    torch.testing.assert_close(twin(x), m(x))


class InplaceReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


def test_regression_relu_inplace_round_trips():
    """`nn.ReLU(inplace=True)` was refused as "F.relu cannot be expressed", a supported op."""
    text = round_trip(InplaceReLU(), torch.randn(4, 6))
    assert "relu(" in text


class UnderscoreBias(nn.Module):
    def __init__(self):
        super().__init__()
        self._bias = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x + self._bias


class PersistentBoolMask(nn.Module):
    """Hugging Face GPT-2's: a bool tril buffer, torch.where with a scalar tensor of the fill."""

    def __init__(self, n=5):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, n, n))

    def forward(self, x):
        att = x @ x.transpose(-1, -2)
        mask_value = torch.full([], torch.finfo(att.dtype).min, dtype=att.dtype)
        att = torch.where(self.bias, att, mask_value)
        fill = torch.tensor(-1e4, dtype=att.dtype)
        att = torch.where(self.bias, att, fill)
        return att.softmax(-1)


def test_regression_persistent_bool_buffer_in_where():
    """It failed inside: `where: the first argument must be a bool mask` (the buffer was declared
    float). A bool buffer loads as 1 and 0 and is read as `bias != 0`."""
    text = round_trip(PersistentBoolMask(), torch.randn(2, 5, 3))
    assert "bias != 0" in text


class FinfoFill(nn.Module):
    def __init__(self, n=5):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(n, n)))

    def forward(self, x):
        att = x @ x.transpose(-1, -2)
        att = att.masked_fill(self.mask == 0, -torch.finfo(att.dtype).max)
        return att.softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_regression_finfo_fill_in_any_dtype(dtype):
    """A float64 module filling with -torch.finfo(dtype).max failed: `beyond float32's range`."""
    m = FinfoFill().to(dtype)
    x = torch.randn(2, 5, 3, dtype=dtype)
    text = penrose.trace(m, x)  # verified against the module
    twin = penrose.compile(text).to(dtype)
    twin.load_state_dict(m.state_dict())
    torch.testing.assert_close(twin(x), m(x))


def _sorted_last(y):
    return torch.sort(y, dim=-1).values


class SortInHelper(nn.Module):
    def forward(self, x):
        return _sorted_last(x) + 1


def test_regression_unsupported_op_in_a_helper_is_reported_at_its_own_line():
    """It was reported at the helper's call site in forward."""
    with pytest.raises(PenroseTraceError) as e:
        penrose.trace(SortInHelper(), torch.randn(2, 4))
    assert "torch.sort" in e.value.message
    assert e.value.span.line == _line_of(_sorted_last, "torch.sort")


# ---- in-place ops, functionalised ------------------------------------------------------------------------


class LoRALinear(nn.Module):
    """loralib's MergedLinear-style forward: `result += ...`."""

    def __init__(self, d=6, f=5, r=2):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(f, d) / 3)
        self.bias = nn.Parameter(torch.randn(f) / 3)
        self.lora_A = nn.Parameter(torch.randn(r, d) / 3)
        self.lora_B = nn.Parameter(torch.randn(f, r) / 3)
        self.scaling = 0.5

    def forward(self, x):
        result = F.linear(x, self.weight, bias=self.bias)
        result += (x @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)) * self.scaling
        return result


class PerceiverMask(nn.Module):
    """Perceiver-style: scores.masked_fill_(~mask, -max), then relu_ and mul_."""

    def __init__(self, d=4):
        super().__init__()
        self.q = nn.Linear(d, d)

    def forward(self, x, mask):
        sim = self.q(x) @ x.transpose(-1, -2)
        max_neg = -torch.finfo(sim.dtype).max
        sim.masked_fill_(~mask[:, None, :], max_neg)
        attn = sim.softmax(dim=-1)
        out = attn @ x
        out.mul_(2.0)
        out.add_(1.0)
        return out.relu_()


def test_in_place_add_is_the_value_it_produces():
    round_trip(LoRALinear(), torch.randn(3, 6))


def test_in_place_masked_fill_relu_and_arithmetic():
    mask = torch.rand(2, 5) > 0.3
    mask[:, 0] = True
    round_trip(PerceiverMask(), torch.randn(2, 5, 4), mask)


class ViewUpdatedInPlace(nn.Module):
    def forward(self, x):
        y = x * 2
        y[:, 0].add_(1.0)
        return y


class BufferUpdatedInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        return x + self.count


@pytest.mark.parametrize("make, code, cause", [
    (ViewUpdatedInPlace, "add_(1.0)", "updates a view in place"),
    (BufferUpdatedInPlace, "add_(1.0)", "in place"),
], ids=["view", "buffer"])
def test_in_place_updates_seen_elsewhere_are_refused_with_the_cause(make, code, cause):
    module = make()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(PenroseTraceError) as e:
        penrose.trace(module, torch.randn(2, 4))
    assert cause in e.value.message and "add_" in e.value.message
    assert e.value.span.line == _line_of(make, code)
    for k, v in module.state_dict().items():  # finding the line ran forward again: the buffer is as it was
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


# ---- constant fills, repeats, casts ----------------------------------------------------------------------


class SetAttentionSeeds(nn.Module):
    """Set Transformer's PMA: learned seeds repeated over the batch (`S.repeat(B, 1, 1)`)."""

    def __init__(self, d=4, k=2):
        super().__init__()
        self.S = nn.Parameter(torch.randn(1, k, d))
        self.fc = nn.Linear(d, d)

    def forward(self, X):
        Q = self.S.repeat(X.size(0), 1, 1)
        A = torch.softmax(Q @ self.fc(X).transpose(1, 2), dim=-1)
        return A @ X


class Tiles(nn.Module):
    def forward(self, x):
        a = x.repeat(1, 2, 1)  # tiles along the tokens
        b = torch.repeat_interleave(x, 3, dim=-1)  # each feature three times
        c = x.unsqueeze(2).expand(-1, -1, 2, -1)
        return a * 2, b + 1, c - 1


class GroupedQueryHeads(nn.Module):
    """Mistral's reference: kv heads repeated with repeat_interleave to the query heads."""

    def __init__(self, d=8, n_heads=4, n_kv=2):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, d // n_heads
        self.wq = nn.Linear(d, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(d, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(d, n_kv * self.hd, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.hd)
        k = self.wk(x).view(B, T, self.n_kv, self.hd)
        v = self.wv(x).view(B, T, self.n_kv, self.hd)
        k = torch.repeat_interleave(k, repeats=self.n_heads // self.n_kv, dim=2)
        v = torch.repeat_interleave(v, repeats=self.n_heads // self.n_kv, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / self.hd ** 0.5).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(B, T, -1)


class FullsAndCasts(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, mask):
        h = self.fc(x).float().to(x.dtype)  # no-op casts (float to float)
        neg = torch.full((1, 1), -1e9, dtype=h.dtype)
        zero = torch.zeros([], dtype=h.dtype)
        h = torch.where(mask, h, neg) + zero + torch.ones(1)
        return h.softmax(-1) * mask.to(h.dtype)


def test_tensor_repeat_over_the_batch():
    round_trip(SetAttentionSeeds(), torch.randn(3, 5, 4))


def test_repeat_repeat_interleave_and_expand():
    text = round_trip(Tiles(), torch.randn(2, 3, 4))
    assert "repeat(" in text


def test_repeat_interleave_grouped_query_heads():
    round_trip(GroupedQueryHeads(), torch.randn(2, 5, 8))


def test_constant_fills_and_same_kind_casts():
    mask = torch.rand(2, 3, 4) > 0.4
    round_trip(FullsAndCasts(), torch.randn(2, 3, 4), mask, tol=1e-6)  # the module's .float() rounds


class IntCast(nn.Module):
    def forward(self, x):
        return x.long() + 1


class WideFill(nn.Module):
    def forward(self, x):
        return x[:, None, :] + torch.ones(3, 4)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.proj(x.unsqueeze(0)).squeeze(0)


class CumProd(nn.Module):
    def forward(self, x):
        return x.cumprod(-1) * 2


class Ramp(nn.Module):
    """A tensor made from constants with a function the language lacks (sin of a ramp, not of positions
    times rotary frequencies: no table holds it)."""

    def forward(self, x):
        return x * torch.sin(torch.linspace(0.0, 1.0, x.shape[-1]))


@pytest.mark.parametrize("make, code, cause", [
    (IntCast, "x.long()", "converts torch.float32 to torch.int64"),
    (Ramp, "torch.sin(torch.linspace(", "a tensor forward makes from constants"),
    (WideFill, "torch.ones(3, 4)", "a filled tensor of shape (3, 4)"),
    (Conv, "self.proj(", "torch.conv1d cannot be expressed in .pen: a convolution"),
    (CumProd, "x.cumprod(-1)", "Tensor.cumprod cannot be expressed in .pen: a cumulative op"),
], ids=["float-to-int", "made-from-constants", "fill-with-new-axes", "conv", "cumprod"])
def test_what_stays_refused_names_op_cause_and_line(make, code, cause):
    with pytest.raises(PenroseTraceError) as e:
        penrose.trace(make(), torch.randn(2, 4) if make is not Conv else torch.randn(4, 6))
    assert cause in e.value.message
    assert e.value.span.line == _line_of(make, code)


# ---- state-dict names: quoted names ------------------------------------------------------------------------


class Reserved(nn.Module):
    def __init__(self):
        super().__init__()
        self.self = nn.Linear(4, 4)
        self.output = nn.Linear(4, 4)
        self.register_buffer("input", torch.rand(4))
        self._bias = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.output(self.self(x) * self.input) + self._bias


def test_regression_reserved_state_dict_names_are_quoted():
    """`_bias` was refused (without position), `self` and `output` as instance names too."""
    text = round_trip(Reserved(), torch.randn(3, 4))
    for quoted in ("as `self`", "as `output`", "buffer `input`[", "param `_bias`["):
        assert quoted in text


def test_quoted_names_in_the_language():
    text = """
dim e = 3
block lin(x[e]) {
  param weight[e, e]
  param `_bias`[e]
  return einsum('e,fe->f', x, weight) + `_bias`
}
input x[e]
buffer `class`[e]
y = lin(x + `class`) as attention.`self`
output y
"""
    model = penrose.compile(text)
    assert sorted(model.state_dict()) == ["attention.self._bias", "attention.self.weight", "class"]
    state = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    x = torch.randn(2, 3)
    want = (x + state["class"]) @ state["attention.self.weight"].T + state["attention.self._bias"]
    torch.testing.assert_close(model(x), want)


@pytest.mark.parametrize("text, message", [
    ("dim e = 3\ninput x[e]\n`y` = x * 2\noutput `y`", "a quoted name is only for a param, buffer or instance"),
    ("dim e = 3\ninput x[e]\nparam `training`[e]\ny = x * `training`\noutput y", "clashes with torch.nn.Module.training"),
])
def test_quoted_names_are_refused_where_they_cannot_stand(text, message):
    with pytest.raises(penrose.PenroseError) as e:
        penrose.compile(text)
    assert message in str(e.value)
    assert e.value.span.line == 3


# ---- more code written the way public repositories write it ------------------------------------------------


class ShiftedPositions(nn.Module):
    """Hugging Face GPT-2's positions: torch.arange(T) + past_seen_tokens, unsqueezed, embedded."""

    def __init__(self, n_positions=8, d=4):
        super().__init__()
        self.wpe = nn.Embedding(n_positions, d)

    def forward(self, x):
        past_seen_tokens = 0
        position_ids = torch.arange(x.shape[1], device=x.device) + past_seen_tokens
        position_ids = position_ids.unsqueeze(0)
        return x + self.wpe(position_ids)


def _modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """DiT's block: adaLN modulation chunked six ways, nn.MultiheadAttention, a tanh-GELU MLP."""

    def __init__(self, hidden_size=8, num_heads=2):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, 2 * hidden_size), nn.GELU(approximate="tanh"),
                                 nn.Linear(2 * hidden_size, hidden_size))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        h = _modulate(self.norm1(x), shift_msa, scale_msa)
        x = x + gate_msa.unsqueeze(1) * self.attn(h, h, h, need_weights=False)[0]
        return x + gate_mlp.unsqueeze(1) * self.mlp(_modulate(self.norm2(x), shift_mlp, scale_mlp))


def test_shifted_positions_are_a_slice_of_the_table():
    text = round_trip(ShiftedPositions(), torch.randn(2, 5, 4))
    assert "slice(" in text


def test_dit_block():
    round_trip(DiTBlock(), torch.randn(2, 5, 8), torch.randn(2, 8))


class GEGLU(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.proj = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        a, gate = self.proj(x).chunk(2, dim=-1)
        return self.out(a * F.gelu(gate))


class IntMaskAttention(nn.Module):
    """An integer padding mask (== 0), softmax in float32 then type_as: the annotated-transformer way."""

    def __init__(self, d=8):
        super().__init__()
        self.q = nn.Linear(d, d)

    def forward(self, x, mask):
        att = self.q(x) @ x.transpose(-2, -1) / x.size(-1) ** 0.5
        att = att.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        return F.softmax(att, dim=-1, dtype=torch.float32).type_as(x) @ x


class TriuBoolBuffer(nn.Module):
    def __init__(self, n=5):
        super().__init__()
        self.register_buffer("mask", torch.triu(torch.ones(n, n), diagonal=1).bool())

    def forward(self, x):
        att = x @ x.transpose(-1, -2)
        return att.masked_fill(self.mask, float("-inf")).softmax(-1)


class BaddbmmScores(nn.Module):
    """Bloom's and GPT-NeoX's scores: torch.baddbmm(zeros, q, kᵀ, beta=0, alpha=1/√d)."""

    def forward(self, q, k):
        return torch.baddbmm(torch.zeros(1, 1, 1, dtype=q.dtype), q, k.transpose(1, 2), beta=0.0, alpha=0.5).softmax(-1)


def test_geglu_int_mask_triu_buffer_and_baddbmm():
    round_trip(GEGLU(), torch.randn(2, 5, 8))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, 3:] = 0
    round_trip(IntMaskAttention(), torch.randn(2, 5, 8), mask, tol=1e-6)  # the module's float32 softmax rounds
    round_trip(TriuBoolBuffer(), torch.randn(2, 5, 4))
    round_trip(BaddbmmScores(), torch.randn(2, 5, 4), torch.randn(2, 6, 4))


class PaddedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4, padding_idx=2)
        self.out = nn.Linear(4, 3)

    def forward(self, ids):
        return self.out(self.emb(ids))


@pytest.mark.parametrize("pad", [0, 2, 6])
def test_regression_embedding_padding_row_takes_no_gradient(pad):
    """nn.Embedding(padding_idx=p) (Hugging Face BERT's word embeddings, p = 0): the trace was a
    plain gather, so row p of the twin's table took a gradient the original's does not (found on
    BertModel when an id 0 occurred). The table is read with row p detached."""
    m = PaddedEmbedding()
    m.emb.padding_idx = pad
    ids = torch.tensor([[pad, 1, 3, pad], [5, pad, 0, 6]])
    text = round_trip(m, ids)  # gradients of the table compared, row p's included
    assert "detach(" in text


class IntegerMask(nn.Module):
    """An attention mask given as integers (1 keep, 0 pad), as tokenizers return it, made bool."""

    def __init__(self, d=4):
        super().__init__()
        self.q = nn.Linear(d, d)

    def forward(self, x, attention_mask):
        scores = self.q(x) @ x.transpose(-1, -2)
        keep = attention_mask.to(torch.bool)[:, None, :]
        return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ x


def test_integer_mask_made_bool_is_a_comparison():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    text = round_trip(IntegerMask(), torch.randn(2, 4, 4), mask)
    assert "!= 0" in text


ACTIVATIONS = {  # torch's activation modules the language writes with its own functions
    "ELU": (nn.ELU(alpha=0.5), "out = elu(h, alpha=0.5)", 1e-10),
    "SELU": (nn.SELU(), "out = 1.0507009873554805 * elu(h, alpha=1.6732632423543772)", 1e-10),
    "CELU": (nn.CELU(alpha=2.0), "out = 2 * elu(h * 0.5)", 1e-10),
    # torch's own hardsigmoid backward multiplies by 1/6 rounded to float32 (relative 3e-8, even
    # in float64): the diagram's gradient is the exact one, so the comparison allows that
    "Hardsigmoid": (nn.Hardsigmoid(), "out = clamp(h / 6 + 0.5, min=0, max=1)", 1e-8),
    "Threshold": (nn.Threshold(0.1, 20.0), "out = where(h > 0.1, h, 20)", 1e-10),
    "Softplus(beta=2)": (nn.Softplus(beta=2.0), "out = softplus(h * 2) / 2", 1e-10),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_regression_activations_round_trip(name):
    """Regression (tried on modules nobody here wrote): nn.ELU, SELU, CELU, Hardsigmoid,
    Threshold and Softplus with a beta were refused as "cannot be expressed in .pen" though the language writes each."""
    module, expected, tol = ACTIVATIONS[name]
    text = round_trip(nn.Sequential(nn.Linear(6, 6), module), torch.randn(4, 6), tol=tol)
    assert expected in text, text  # h: the linear layer's output
