"""penrose.trace: PyTorch modules, written the way people write them, to `.pen` and back.

Each round trip: trace → compile → load_state_dict(module.state_dict()) (strict) → the same
outputs and the same gradients, inputs' and parameters', in float64. Also: the traced text
checks, renders and is stable; what cannot be drawn is an error at the user's line; the CLI's
`penrose trace` and `penrose render --einsum`.
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
import warnings
from collections.abc import Mapping

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from trace_readability import traced

import penrose
from penrose.cli import main
from penrose.tracing import PenroseTraceError, einsum_text

# ---- the modules ---------------------------------------------------------------------------------------


class LinearProbe(nn.Module):
    def __init__(self, d=16, k=3):
        super().__init__()
        self.probe = nn.Linear(d, k)

    def forward(self, x):
        return torch.sigmoid(self.probe(x))


class MLPBlock(nn.Module):
    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        h = self.fc2(F.relu(self.fc1(self.norm(x))))
        return x + h


class MultiHeadAttention(nn.Module):
    def __init__(self, d=16, n_heads=4):
        super().__init__()
        self.h = n_heads
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.W_o = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.h
        q = self.W_q(x).view(B, T, self.h, D).transpose(1, 2)
        k = self.W_k(x).view(B, T, self.h, D).transpose(1, 2)
        v = self.W_v(x).view(B, T, self.h, D).transpose(1, 2)
        att = q @ k.transpose(-2, -1) / math.sqrt(D)
        att = att.softmax(dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.W_o(y)


class Bilinear(nn.Module):
    def __init__(self, i=5, j=6, k=4):
        super().__init__()
        self.W = nn.Parameter(torch.randn(i, j, k) / 3)

    def forward(self, x, y):
        return torch.einsum("bi,ijk,bj->bk", x, self.W, y)


class CausalSelfAttention(nn.Module):
    """nanoGPT's, with the registered tril mask, or F.scaled_dot_product_attention."""

    def __init__(self, n_embd=16, n_head=4, block_size=12, flash=False):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.1)
        self.resid_dropout = nn.Dropout(0.1)
        self.n_head, self.n_embd, self.flash = n_head, n_embd, flash
        if not flash:
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.1 if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd=16):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        return self.dropout(x)


class Block(nn.Module):
    def __init__(self, n_embd=16, flash=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, flash=flash)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class ConceptBottleneck(nn.Module):
    def __init__(self, d=12, n_concepts=5, n_tasks=3):
        super().__init__()
        self.concept_encoder = nn.Linear(d, n_concepts)
        self.task_head = nn.Linear(n_concepts, n_tasks)

    def forward(self, x):
        c = torch.sigmoid(self.concept_encoder(x))
        y = self.task_head(c)
        return c, y


class Stack(nn.Module):
    def __init__(self, n_layers=3, d=16):
        super().__init__()
        self.blocks = nn.ModuleList([MLPBlock(d) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


# ---- the round trip -----------------------------------------------------------------------------------------


def _perturb(module):
    """Non-default values everywhere (LayerNorm's ones and zeros would hide a swapped weight and bias)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)


def tensors(out) -> list:
    """A module's outputs as a list: a tensor, a tuple, or a mapping's (a ModelOutput's) tensor
    fields in order (a key/value cache is not a tensor: no diagram holds it), a tuple's less its Nones."""
    if isinstance(out, Mapping):
        return [v for v in out.values() if isinstance(v, torch.Tensor)]
    return [v for v in out if v is not None] if isinstance(out, (tuple, list)) else [out]


def round_trip(module, *inputs, tol=1e-10, **options):
    torch.manual_seed(0)
    module = module.double()
    _perturb(module)
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    text = traced(module, *inputs, **options)  # and readable (tests/trace_readability.py)
    model = penrose.compile(text).double()
    model.load_state_dict(module.state_dict())  # strict: every name matches
    module.eval()
    model.eval()
    a = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    want, got = tensors(module(*a)), tensors(model(*b))
    assert len(want) == len(got)
    for w, g_ in zip(want, got):
        assert w.shape == g_.shape
        torch.testing.assert_close(g_, w, rtol=tol, atol=tol)
    cot = [torch.randn_like(w) for w in want]
    torch.autograd.backward(want, cot)
    torch.autograd.backward(got, cot)
    for x, y in zip(a, b):
        if x.requires_grad:
            torch.testing.assert_close(y.grad, x.grad, rtol=10 * tol, atol=tol)
    theirs = dict(module.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=10 * tol, atol=tol, msg=name)
    return text


def test_linear_probe():
    text = round_trip(LinearProbe(), torch.randn(4, 16))
    assert "block linear(" in text and "y = sigmoid(" not in text  # the probe call, then its sigmoid
    assert "sigmoid(" in text and "as probe" in text
    assert re.search(r"'(\w),f\1->f'", text)  # the weight's (out, in) layout, contracted on in


def test_mlp_block_with_layernorm_and_residual():
    text = round_trip(MLPBlock(), torch.randn(3, 7, 16))
    assert "layernorm(x, e, weight=weight, bias=bias" in text
    assert "return x + h" in text or "x + h" in text


def test_multi_head_attention_heads_by_view_and_transpose():
    text = round_trip(MultiHeadAttention(), torch.randn(2, 6, 16))
    assert "rearrange(" in text and "(h d)" in text  # the view splits the heads out, and merges them back
    assert "/ sqrt(d)" in text and "softmax(att, s)" in text


def test_bilinear_einsum():
    text = round_trip(Bilinear(), torch.randn(3, 5), torch.randn(3, 6))
    assert "param W[i, j, k]" in text.replace("  ", " ")
    assert "einsum('i,ijk,j->k', x, W, y)" in text  # the batch letter is the batch every input takes


@pytest.mark.parametrize("flash", [False, True], ids=["tril-buffer", "sdpa-is-causal"])
def test_nanogpt_block(flash):
    text = round_trip(Block(flash=flash), torch.randn(2, 9, 16))
    assert "as attn" in text and "as ln_1" in text and "mlp(" in text and "gelu(" in text
    if flash:
        assert "causal(t, s)" in text
    else:
        assert "buffer bias[" in text and "slice(" in text


def test_concept_bottleneck():
    text = round_trip(ConceptBottleneck(), torch.randn(5, 12))
    assert "c = sigmoid(" in text and "output c, y" in text


def test_stack_of_identical_blocks_is_a_repeat():
    text = round_trip(Stack(), torch.randn(2, 5, 16))
    assert "repeat 3 as blocks" in text
    model = penrose.compile(text)
    assert "blocks.2.fc1.weight" in model.state_dict()


class GPT(nn.Module):
    """nanoGPT's model: a ModuleDict `transformer` that is never called itself, positions by arange."""

    def __init__(self, vocab=11, block_size=8, n_embd=16, n_layer=2, tie=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(0.1),
            h=nn.ModuleList([Block(n_embd) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)


def test_nanogpt_model():
    text = round_trip(GPT(), torch.randint(0, 11, (2, 6)))
    assert "as transformer" in text and "repeat 2 as h" in text and "as lm_head" in text
    assert "input idx[t] : int" in text


def test_tied_weights_keep_both_names():
    torch.manual_seed(0)
    module = GPT(tie=True).eval()
    idx = torch.randint(0, 11, (2, 6))
    model = penrose.compile(penrose.trace(module, idx)).eval()
    model.load_state_dict(module.state_dict())  # both transformer.wte.weight and lm_head.weight
    torch.testing.assert_close(model(idx), module(idx))


# ---- the rest of the table: element-wise, shapes, indexing, reductions ---------------------------------------


class Elementwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x):
        a = (x * self.g - 1) / 2 + (-x) ** 2
        b = torch.exp(x) * torch.log(x.abs() + 1) + torch.sqrt(x.abs()) + torch.tanh(x) + torch.sigmoid(x)
        c = F.relu(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x) + F.softplus(x) + F.leaky_relu(x, 0.2)
        d = torch.rsqrt(x * x + 1) + 1 / (x.abs() + 2) + 3 - x
        return a + b + c + d


class Shapes(nn.Module):
    def forward(self, x):  # [B, 4, 6]
        a, b = x.chunk(2, dim=-1)
        c = torch.cat([b, a], dim=-1)
        d = c.reshape(x.shape[0], 24).view(x.shape[0], 6, 4).transpose(1, 2)  # regrouped: a merge, then a split
        e = x.permute(0, 2, 1).mT
        f = x[:, 1] + x[:, -1] + x.narrow(1, 0, 1).squeeze(1) + x[:, 1:3].sum(1)
        g = x.mean(dim=1, keepdim=True) + x.amax(dim=-1, keepdim=True)
        h = x.sum(dim=(1, 2))[:, None, None]
        st = torch.stack([x, x * 2], dim=1).mean(1)
        first, second = torch.split(x, [1, 3], dim=1)
        return c + d + e + f[:, None, :] + g + h + st, torch.log_softmax(x, dim=1), F.softmax(x, -1), second * first


class TinyGPTEmbedding(nn.Module):
    def __init__(self, vocab=11, block_size=8, d=6):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block_size, d)
        self.drop = nn.Dropout(0.1)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        return self.lm_head(x)


class Products(nn.Module):
    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(6, 5))
        self.w = nn.Parameter(torch.randn(6))

    def forward(self, x, y):  # x [B, 4, 6], y [B, 6, 3]
        a = torch.bmm(x, y).sum(-1) + (x @ self.W).mean(-1)
        b = torch.einsum("btd,de->bte", x, self.W).sum(-1) + torch.einsum("...d,d->...", x, self.W[:, 0])
        c = x.unsqueeze(-1) * self.w + x[..., None].expand(-1, -1, -1, 6)
        return a + b, c


class Tied(nn.Module):
    """One submodule called twice (one set of weights), and a named chain of identical blocks."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.body = nn.Sequential(*[MLPBlock(6, 8) for _ in range(2)])

    def forward(self, x):
        return self.body(self.fc(torch.tanh(self.fc(x))))


class SquareLayer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return F.relu(self.fc(x))


class SquareStack(nn.Module):
    """A chain of Linear(d, d): the weight's two legs differ, though the block's input and output are one leg."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([SquareLayer() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class MaskedAttention(nn.Module):
    def forward(self, x, mask):
        att = x @ x.transpose(-1, -2)
        return att.masked_fill(~mask, float("-inf")).softmax(-1) @ x


class FoldsTheBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        B, T, C = x.shape
        return self.fc(x.view(B * T, C)).view(B, T, 3)


def test_square_chain_is_a_repeat():
    text = round_trip(SquareStack(), torch.randn(2, 8))
    assert "repeat 3 as layers" in text


def test_negated_mask_and_a_folded_batch():
    round_trip(MaskedAttention(), torch.randn(2, 4, 8), torch.rand(4, 4) > 0.3)
    module = FoldsTheBatch()
    text = round_trip(module, torch.randn(2, 4, 8))
    # the batch folded into the tokens (x.view(B * T, C)) is kept apart: no (b t) leg, so any batch runs
    assert "input x[b, t, e]" in text and "(b t)" not in text
    twin = penrose.compile(text).double()
    twin.load_state_dict(module.state_dict())
    x = torch.randn(5, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(twin(x), module(x))


@pytest.mark.parametrize("make, shapes", [
    (Elementwise, [(3, 6)]),
    (Shapes, [(3, 4, 6)]),
    (Products, [(2, 4, 6), (2, 6, 3)]),
    (Tied, [(3, 6)]),
], ids=["elementwise", "shapes", "products", "tied"])
def test_more_ops_round_trip(make, shapes):
    round_trip(make(), *[torch.randn(*s) for s in shapes])


class TableActivations(nn.Module):
    def forward(self, x):
        return F.mish(x) + F.hardswish(x * 4)


def test_an_aten_op_a_row_names_is_lowered_to_its_function():
    """mish and hardswish: trace lowers them through their rows' `aten` names (penrose.ops), no handler."""
    text = round_trip(TableActivations(), torch.randn(3, 6))
    assert "mish(x)" in text and "hardswish(" in text


def test_gpt_embedding_positions_are_a_slice_of_the_table():
    text = round_trip(TinyGPTEmbedding(), torch.randint(0, 11, (2, 5)))
    assert "gather(weight, x)" in text and "slice(weight, " in text


def test_rms_norm():
    text = round_trip(RMSNormed(), torch.randn(3, 6), tol=1e-5)
    assert "rmsnorm(x, " in text  # computed in float32 by penrose, hence the tolerance


class RMSNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(6, eps=1e-6)

    def forward(self, x):
        return self.norm(x) * 2


# ---- the text ------------------------------------------------------------------------------------------------


def test_traced_text_checks_renders_and_is_stable():
    from penrose.rendering import render

    torch.manual_seed(0)
    m, x = Block(), torch.randn(2, 9, 16)
    text = penrose.trace(m, x)
    again = penrose.trace(m, x)
    assert text == again
    assert penrose.format_diagram(penrose.parse(text)) == text  # canonical form
    checked = penrose.load(text=text)
    assert not checked.warnings  # the index legend names every dim
    svg = render(text)
    assert svg.lstrip().startswith("<") and "svg" in svg[:400]


def test_dims_hint_names_input_axes_and_the_batch():
    torch.manual_seed(0)
    text = penrose.trace(MLPBlock(), torch.randn(3, 7, 16), dims={"b": 0, "t": 1})
    assert "input x[b, t, e]" in text
    model = penrose.compile(text)
    assert model(torch.randn(3, 7, 16)).shape == (3, 7, 16)


def test_batch_axis_mixed_with_others_becomes_a_leg():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x).sum(0)  # sums over the batch: not per example

    torch.manual_seed(0)
    text = penrose.trace(Flat(), torch.randn(3, 4))
    assert "input x[b, " in text


# ---- what cannot be drawn --------------------------------------------------------------------------------------


class Sorts(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.sort(y, dim=-1).values


class Branches(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def _line_of(cls, code):
    import inspect

    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, line in enumerate(lines) if code in line)


def test_unsupported_op_names_the_op_and_the_users_line():
    with pytest.raises(PenroseTraceError) as e:
        penrose.trace(Sorts(), torch.randn(2, 5))
    err = e.value
    assert "torch.sort" in err.message
    assert err.span.file == __file__ and err.span.line == _line_of(Sorts, "torch.sort")
    assert "torch.sort(y, dim=-1)" in err.render()
    assert isinstance(err, penrose.PenroseError)


def test_data_dependent_branch_is_refused_at_its_line():
    with pytest.raises(PenroseTraceError) as e:
        penrose.trace(Branches(), torch.randn(2, 5))
    assert "data-dependent" in e.value.message
    assert e.value.span.file == __file__ and e.value.span.line == _line_of(Branches, "if x.sum()")


class _SequentialInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        self.head = nn.Sequential()
        self.head.add_module("fc", nn.Linear(4, 3))
        self.head.add_module("act", nn.Tanh())

    def forward(self, x):
        return self.head(self.encoder(x))


class _ResidualList(nn.Module):
    """`for l in self.layers: x = x + l(x)`: numbered siblings, but no chain of blocks."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(5, 5) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


class _MHABlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        h = self.ln(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return x + a


@pytest.mark.parametrize("make", [
    _MHABlock,
    lambda: nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True),
    lambda: nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"),
], ids=["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoderLayer norm_first gelu"])
def test_torch_attention_modules(make):
    """regression: nn.MultiheadAttention reads out_proj's weight and bias in its own code, never
    calling out_proj, and was refused ("used outside the call of its module"); such a node now
    runs as a call of that submodule (`... as out_proj`), so its state-dict names stay."""
    text = round_trip(make(), torch.randn(2, 5, 16), tol=1e-9)
    assert "as out_proj" in text


class _MaskedFill(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, mask):
        y = self.lin(x)
        return torch.where(mask.unsqueeze(-1), y, torch.zeros_like(y)) + torch.full_like(y, 0.5) * torch.ones_like(y)


class _Bilinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(4, 5, 3)

    def forward(self, a, b):
        return self.bil(a, b)


def test_zeros_like_and_full_like_are_numbers():
    """regression: torch.zeros_like / ones_like / full_like were refused; they are the number,
    which where and the operators broadcast."""
    text = round_trip(_MaskedFill(), torch.randn(2, 4, 8), torch.rand(2, 4) > 0.5)
    assert "where(mask, y, 0)" in text and "+ 0.5" in text


class _TopKSAE(nn.Module):
    """A TopK sparse autoencoder, written as such code is: the k largest pre-activations kept."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 12)
        self.dec = nn.Linear(12, 8)

    def forward(self, x):
        z = torch.relu(self.enc(x))
        values, indices = z.topk(3, dim=-1)
        sparse = torch.zeros_like(z).scatter(-1, indices, values)
        return self.dec(sparse), sparse


def test_topk_scatter_is_the_languages_topk():
    """regression: Tensor.topk was refused; `zeros_like(z).scatter(dim, i, v)` with `v, i =
    z.topk(k, dim)` is `topk(z, leg, k=K)`, and any other use of the values or indices is refused
    with that hint."""
    text = round_trip(_TopKSAE(), torch.randn(4, 8))
    assert "topk(z, " in text and "k=3" in text

    class Values(nn.Module):
        def forward(self, x):
            return x.topk(2, dim=-1).values

    with pytest.raises(PenroseTraceError, match=r"expressible only as zeros_like\(x\).scatter"):
        penrose.trace(Values(), torch.randn(3, 5))


class _Functional(nn.Module):
    """Functions torch spells as one op that the language writes out."""

    def __init__(self, which):
        super().__init__()
        self.which = which
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        y = self.lin(x)
        return {
            "norm": lambda: y.norm(dim=-1),
            "normalize": lambda: F.normalize(y, dim=-1),
            "var": lambda: y.var(dim=-1),
            "std_keepdim": lambda: y - y.std(dim=-1, keepdim=True),
            "var_biased": lambda: torch.var(y, dim=-1, unbiased=False),
            "logsumexp": lambda: torch.logsumexp(y, dim=-1),
            "logsigmoid": lambda: F.logsigmoid(y),
            "hardtanh": lambda: F.hardtanh(y, -0.5, 0.5),
            "max_values": lambda: y.max(dim=-1).values,
        }[self.which]()


@pytest.mark.parametrize("which", ["norm", "normalize", "var", "std_keepdim", "var_biased", "logsumexp", "logsigmoid",
                                   "hardtanh", "max_values"])
def test_functions_written_out(which):
    """regression: each was refused ("cannot be expressed in .pen"); now written with the
    language's functions (`sqrt(sum(y * y, e))`, `m + log(sum(exp(y - m)))`, `-softplus(-y)`,
    `clamp`, `max(y, e)`), equal in values and gradients."""
    round_trip(_Functional(which), torch.randn(3, 4, 6), tol=1e-9)


class _Prototypes(nn.Module):
    """A prototype layer as ProtoPNet-style code writes it: cdist to learned prototypes, a log
    similarity, and a cosine similarity to the same prototypes."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 4)
        self.prototypes = nn.Parameter(torch.randn(5, 4))

    def forward(self, x):
        z = self.enc(x)
        d = torch.cdist(z, self.prototypes)
        sim = torch.log((d ** 2 + 1) / (d ** 2 + 1e-4))
        return sim, F.cosine_similarity(z.unsqueeze(-2), self.prototypes, dim=-1)


def test_cdist_and_cosine_similarity():
    """regression: torch.cdist and F.cosine_similarity were refused; they are written as
    sqrt(sum((a - b)², m)) and the sum of the two unit vectors' product."""
    text = round_trip(_Prototypes(), torch.randn(3, 7, 6), tol=1e-9)
    assert "sqrt(" in text


class _MaskedMeanPool(nn.Module):
    """Mean of token embeddings over the non-padding positions, written with bool arithmetic."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.table = nn.Parameter(torch.randn(10, 6))
        self.out = nn.Linear(6, 2)

    def forward(self, ids):
        keep = ids > 0
        pooled = (self.emb(ids) * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True)
        rows = self.table.index_select(0, ids[:, 0])
        return self.out(F.relu6(pooled + rows))


def test_bool_masks_in_arithmetic_index_select_and_relu6():
    """regression: a bool mask in arithmetic or a sum (torch promotes it to 1 and 0) produced a
    diagram that did not check ("internal: ... arithmetic on the bool mask"); index_select and
    relu6 were refused. Now where(mask, 1, 0), gather and clamp(min=0, max=6)."""
    ids = torch.tensor([[3, 4, 0, 0], [5, 1, 2, 0], [7, 0, 0, 0]])
    text = round_trip(_MaskedMeanPool(), ids)
    assert "where(" in text and "gather(" in text and "clamp(" in text


class _FeatureNet(nn.Module):
    def __init__(self, h=6):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))

    def forward(self, x):
        return self.net(x)


class _NAM(nn.Module):
    """A neural additive model as its authors' code writes it: one small MLP per feature, in a
    ModuleList, each on its own column."""

    def __init__(self, f=3):
        super().__init__()
        self.features = nn.ModuleList([_FeatureNet() for _ in range(f)])
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        outs = [net(x[:, i:i + 1]) for i, net in enumerate(self.features)]
        return torch.cat(outs, dim=-1).sum(-1) + self.bias


class _CEM(nn.Module):
    """A concept embedding model in the style of its reference code: per concept a positive and
    a negative embedding, a shared scorer, the probability-weighted mixture."""

    def __init__(self, d=5, k=3, m=4):
        super().__init__()
        self.pos = nn.ModuleList([nn.Linear(d, m) for _ in range(k)])
        self.neg = nn.ModuleList([nn.Linear(d, m) for _ in range(k)])
        self.score = nn.Linear(2 * m, 1)
        self.task = nn.Linear(k * m, 2)

    def forward(self, x):
        embs, probs = [], []
        for p, n in zip(self.pos, self.neg):
            cp, cn = F.leaky_relu(p(x)), F.leaky_relu(n(x))
            pr = torch.sigmoid(self.score(torch.cat([cp, cn], -1)))
            embs.append(pr * cp + (1 - pr) * cn)
            probs.append(pr)
        return torch.cat(probs, -1), self.task(torch.cat(embs, -1))


@pytest.mark.parametrize("make, shape, path", [(_NAM, (5, 3), " as features.2"), (_CEM, (4, 5), " as neg.1")],
                         ids=["neural additive model", "concept embedding model"])
def test_interpretable_models_written_in_plain_torch(make, shape, path):
    """The zoo's architectures as their authors write them in torch (ModuleLists of per-feature
    nets, per-concept embeddings) trace to diagrams that keep every state-dict name."""
    text = round_trip(make(), torch.randn(*shape))
    assert path in text


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(6))       # read
        self.spare = nn.Parameter(torch.zeros(6))      # never read: the top level declares it
        self.lin = nn.Linear(6, 6)                     # its bias is read, its weight too
        self.head = nn.Linear(6, 2)                    # never called

    def forward(self, x):
        return self.lin(x) * self.scale


def test_parameters_forward_never_reads():
    """regression: a module with a parameter forward never reads was refused ("does not hold the
    module's state"); it is declared where it belongs, so the state dict still loads, and the
    parameters of a submodule never called (which no statement can declare) are named in a
    warning and a comment."""
    module = _Unused()
    with pytest.warns(penrose.PenroseWarning, match=r"head.weight, head.bias belong to submodules that forward never calls"):
        text = penrose.trace(module, torch.randn(3, 6))
    assert "param spare[" in text and "# Not in the diagram: head.weight, head.bias" in text
    model = penrose.compile(text)
    missing, unexpected = model.load_state_dict(module.state_dict(), strict=False)
    assert missing == [] and unexpected == ["head.weight", "head.bias"]


class _Downcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).float().softmax(-1).to(x.dtype)  # float32 in the middle of a float64 model


UNUSED_HEAD = "head.weight, head.bias belong to submodules that forward never calls"
DOWNCAST = "casts to float32, below the model's float64"


@pytest.mark.parametrize(("module", "message"), [(_Unused(), UNUSED_HEAD), (_Downcast().double(), DOWNCAST)],
                         ids=["unused_submodule", "downcast"])
def test_trace_warnings_point_at_the_callers_line(module, message):
    """regression: the unused-submodules and the casts warnings were raised with a hand-counted
    stacklevel=3, which pointed inside penrose/tracing/__init__.py: each points at the user's line
    that called penrose.trace (the first frame outside penrose), as every other PenroseWarning does."""
    x = torch.randn(3, 4 if isinstance(module, _Downcast) else 6, dtype=next(module.parameters()).dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        penrose.trace(module, x)
    mine = [w for w in caught if issubclass(w.category, penrose.PenroseWarning) and message in str(w.message)]
    assert [(w.filename, w.lineno) for w in mine] == [(__file__, line)]


def test_cli_trace_prints_the_unused_submodules_warning(tmp_path, capsys):
    """The CLI's path to the same warning (trace_command): printed once on stderr, the diagram still written."""
    src = tmp_path / "unused_model.py"
    src.write_text(textwrap.dedent("""
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(6, 6)
                self.head = nn.Linear(6, 2)  # never called

            def forward(self, x):
                return self.fc(x)
    """), encoding="utf-8")
    code = main(["trace", f"{src}:Net", "--input", "3,6", "-o", str(tmp_path / "net.pen")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("warning: penrose.trace: head.weight, head.bias belong to submodules that forward never calls") == 1


def test_bilinear_is_an_einsum():
    """regression: nn.Bilinear (torch.bilinear) was refused; it is einsum('...i,oij,...j->...o') + bias."""
    text = round_trip(_Bilinear(), torch.randn(3, 4), torch.randn(3, 5))
    assert "einsum(" in text


@pytest.mark.parametrize("make, shape, path", [
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (3, 4), " as 2"),
    (_SequentialInside, (3, 6), " as head.fc"),
    (_ResidualList, (2, 7, 5), " as layers.2"),
], ids=["top-level Sequential", "Sequential inside", "ModuleList with residuals"])
def test_numbered_and_nested_submodules_keep_their_state_dict_paths(make, shape, path):
    """regression: a submodule of a container (nn.Sequential, a ModuleList not chained block
    into block) was refused ("cannot be named in .pen"); now it is an instance named by its
    path (`as encoder.0`), so the state dict loads as it is."""
    module = make()
    text = round_trip(module, torch.randn(*shape))
    assert path in text


# ---- einsum text and the CLI ---------------------------------------------------------------------------------


def test_einsum_text_is_one_input_per_operand():
    text = einsum_text("bi,ijk,bj->bk", {"b": 4})
    checked = penrose.load(text=text)
    assert [d.tensor.name for d in checked.inputs] == ["A", "B", "C"]
    model = penrose.compile(text, i=2, j=3, k=5)
    A, B, C = torch.randn(4, 2), torch.randn(2, 3, 5), torch.randn(4, 3)
    torch.testing.assert_close(model(A, B, C), torch.einsum("bi,ijk,bj->bk", A, B, C))
    assert "einsum('ii->i'" in einsum_text("ii->i")
    with pytest.raises(PenroseTraceError, match="not a letter"):
        einsum_text("b...,bi->i")


MODULE_FILE = textwrap.dedent(
    """
    import torch.nn as nn


    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 3)

        def forward(self, x):
            return self.fc(x).sigmoid()
    """
)


def test_cli_trace(tmp_path, capsys):
    src = tmp_path / "probe_model.py"
    src.write_text(MODULE_FILE, encoding="utf-8")
    out = tmp_path / "model.pen"
    code = main(["trace", f"{src}:Probe", "--input", "4,16", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text(encoding="utf-8")
    assert "as fc" in text and "sigmoid(" in text and "probe_model.py:Probe" in text
    penrose.load(text=text)
    code = main(["trace", f"{src}:Probe", "--input", "4x16"])
    assert code == 0 and capsys.readouterr().out.strip() == text.strip()
    code = main(["trace", f"{src}:Nope", "--input", "4,16"])
    assert code == 1 and "Nope" in capsys.readouterr().err


def test_cli_render_einsum(tmp_path, capsys):
    fig = tmp_path / "fig.svg"
    code = main(["render", "--einsum", "bi,ijk,bj->bk", "--size", "b=4", "-o", str(fig)])
    assert code == 0, capsys.readouterr().err
    assert fig.read_text(encoding="utf-8").lstrip().startswith("<")
    code = main(["render", "--einsum", "bi,ij->bq"])
    assert code == 1 and "q" in capsys.readouterr().err


def test_the_docs_example_is_what_einsum_text_writes():
    from pathlib import Path

    from test_docs_run import blocks as doc_blocks

    blocks = [b.body for b in doc_blocks(Path(__file__).resolve().parents[2] / "docs" / "trace.md") if b.lang == "pen"]
    assert blocks and blocks[-1] == einsum_text("bi,ijk,bj->bk", {"b": 4})
    for body in blocks:
        penrose.parse(body)
