"""penrose.trace on modules written the way public repositories write them (issue 25): lit-gpt's
rotary attention with a non-persistent cos/sin cache, DiT's
adaLN-Zero block, a Perceiver cross-attention written with einops, the Set Transformer's MAB
(heads split into the batch), an FT-Transformer (rtdl) feature tokenizer with a class token,
NAM's feature nets and loralib's Linear. Each is this file's own code in its repository's style
(none is copied), and round-trips as tests/tracing/test_trace.py's round_trip does: strict loading from
`module.state_dict()` alone, values and gradients in float64, readability checked. (minGPT's and
nanoGPT's causal self-attention, one code, is tests/tracing/test_trace.py's CausalSelfAttention.)
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from test_trace import round_trip
from torch import nn

import penrose


def build_rope_cache(seq_len, n_elem, base=10000):
    """lit-gpt's cache: theta over half the head, positions times theta, twice over."""
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2).float() / n_elem))
    idx_theta = torch.outer(torch.arange(seq_len).float(), theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def apply_rope(x, cos, sin):
    head_size = x.size(-1)
    x1 = x[..., : head_size // 2]
    x2 = x[..., head_size // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class LitRotaryAttention(nn.Module):
    """lit-gpt: a fused attn projection, rotary cos/sin registered with persistent=False, SDPA."""

    def __init__(self, n_embd=16, n_head=4, block_size=8):
        super().__init__()
        self.attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.n_head, self.head_size = n_head, n_embd // n_head
        cos, sin = build_rope_cache(block_size, self.head_size)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.attn(x).split(C, dim=-1)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_size).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_size).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """DiT: adaLN-Zero, six modulation vectors from the conditioning, gated residuals."""

    def __init__(self, hidden_size=16, num_heads=4, mlp_ratio=2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, hidden_size))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        h = modulate(self.norm1(x), shift_msa, scale_msa)
        x = x + gate_msa.unsqueeze(1) * self.attn(h, h, h, need_weights=False)[0]
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class PerceiverCrossAttention(nn.Module):
    """Perceiver (lucidrains' style): latents attend to a context, heads by einops, a key mask."""

    def __init__(self, query_dim=16, context_dim=12, heads=4, dim_head=4):
        super().__init__()
        inner = heads * dim_head
        self.scale, self.heads = dim_head ** -0.5, heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_kv = nn.Linear(context_dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, query_dim)

    def forward(self, x, context, mask):
        h = self.heads
        q = self.to_q(x)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=h) for t in (q, k, v))
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        mask = mask[:, None, :].repeat_interleave(h, dim=0)
        sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim=-1)
        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        return self.to_out(rearrange(out, "(b h) n d -> b n (h d)", h=h))


class MAB(nn.Module):
    """Set Transformer's MAB: heads split along the features and stacked into the batch."""

    def __init__(self, dim_Q=8, dim_K=6, dim_V=8, num_heads=2, ln=True):
        super().__init__()
        self.dim_V, self.num_heads = dim_V, num_heads
        self.fc_q = nn.Linear(dim_Q, dim_V)
        self.fc_k = nn.Linear(dim_K, dim_V)
        self.fc_v = nn.Linear(dim_K, dim_V)
        if ln:
            self.ln0 = nn.LayerNorm(dim_V)
            self.ln1 = nn.LayerNorm(dim_V)
        self.fc_o = nn.Linear(dim_V, dim_V)

    def forward(self, Q, K):
        Q = self.fc_q(Q)
        K, V = self.fc_k(K), self.fc_v(K)
        dim_split = self.dim_V // self.num_heads
        Q_ = torch.cat(Q.split(dim_split, 2), 0)
        K_ = torch.cat(K.split(dim_split, 2), 0)
        V_ = torch.cat(V.split(dim_split, 2), 0)
        A = torch.softmax(Q_.bmm(K_.transpose(1, 2)) / math.sqrt(self.dim_V), 2)
        O = torch.cat((Q_ + A.bmm(V_)).split(Q.size(0), 0), 2)  # noqa: E741 - the paper's name
        O = O if getattr(self, "ln0", None) is None else self.ln0(O)  # noqa: E741
        O = O + F.relu(self.fc_o(O))  # noqa: E741
        return O if getattr(self, "ln1", None) is None else self.ln1(O)


class NumericalFeatureTokenizer(nn.Module):
    """rtdl's FT-Transformer tokenizer: one token per numeric feature (x_i * w_i + b_i), then a
    learned [CLS] token appended."""

    def __init__(self, n_features=5, d_token=8):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_features, d_token))
        self.bias = nn.Parameter(torch.empty(n_features, d_token))
        self.cls = nn.Parameter(torch.empty(d_token))
        d_sqrt_inv = 1 / math.sqrt(d_token)
        for p in (self.weight, self.bias, self.cls):
            nn.init.uniform_(p, -d_sqrt_inv, d_sqrt_inv)

    def forward(self, x):
        x = self.weight[None] * x[..., None] + self.bias[None]
        return torch.cat([x, self.cls.view(1, 1, -1).expand(len(x), 1, -1)], dim=1)


class FeatureNN(nn.Module):
    """NAM: one small ReLU net per feature."""

    def __init__(self, hidden=8):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(1, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)])

    def forward(self, x):
        x = x.unsqueeze(1)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


class NAM(nn.Module):
    def __init__(self, num_inputs=3):
        super().__init__()
        self.feature_nns = nn.ModuleList([FeatureNN() for _ in range(num_inputs)])
        self._bias = nn.Parameter(torch.zeros(1))

    def forward(self, inputs):
        outs = [self.feature_nns[i](inputs[:, i]) for i in range(len(self.feature_nns))]
        return torch.cat(outs, dim=-1).sum(dim=-1) + self._bias


class LoraLinear(nn.Linear):
    """loralib's Linear: nn.Linear plus a scaled low-rank update, `lora_A`, `lora_B`."""

    def __init__(self, in_features=8, out_features=6, r=2, lora_alpha=4):
        super().__init__(in_features, out_features)
        self.lora_A = nn.Parameter(torch.randn(r, in_features) / 3)
        self.lora_B = nn.Parameter(torch.randn(out_features, r) / 3)
        self.scaling = lora_alpha / r
        self.lora_dropout = nn.Dropout(0.0)

    def forward(self, x):
        result = F.linear(x, self.weight, bias=self.bias)
        result += (self.lora_dropout(x) @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)) * self.scaling
        return result


def _perceiver_inputs():
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 5:] = False
    return torch.randn(2, 3, 16), torch.randn(2, 7, 12), mask


MODULES = {
    "lit-gpt rotary attention": (LitRotaryAttention, lambda: (torch.randn(2, 5, 16),)),
    "DiT block": (DiTBlock, lambda: (torch.randn(2, 5, 16), torch.randn(2, 16))),
    "Perceiver cross-attention": (PerceiverCrossAttention, _perceiver_inputs),
    "Set Transformer MAB": (MAB, lambda: (torch.randn(2, 4, 8), torch.randn(2, 5, 6))),
    "FT-Transformer tokenizer": (NumericalFeatureTokenizer, lambda: (torch.randn(3, 5),)),
    "NAM": (NAM, lambda: (torch.randn(4, 3),)),
    "loralib Linear": (LoraLinear, lambda: (torch.randn(2, 5, 8),)),
}


BATCH_FIXED = {"Set Transformer MAB"}  # heads stacked into the batch (torch.cat(Q.split(...), 0)): batch=False


@pytest.mark.parametrize("name", list(MODULES))
def test_repository_style_modules_round_trip(name):
    make, inputs = MODULES[name]
    torch.manual_seed(0)
    text = round_trip(make(), *inputs(), **({"batch": False} if name in BATCH_FIXED else {}))
    assert ("# Takes a batch of 2 only" in text) == (name in BATCH_FIXED)


def test_a_batch_stacked_with_the_heads_is_refused_at_its_line_unless_batch_false():
    """The Set Transformer's MAB stacks its heads into the batch: the diagram can hold that only as a
    leg of the batch's size, so by default the trace refuses at that line (not the compiled model at
    run time, for another batch)."""
    with pytest.raises(penrose.PenroseError, match=r"test_trace_repos.py:\d+:\d+: error: the module merges its batch with "
                                                  r"other axes .* a batch of 2 only; trace with batch=False") as err:
        penrose.trace(MAB(), torch.randn(2, 4, 8), torch.randn(2, 5, 6))
    assert "Q_ = torch.cat(Q.split(dim_split, 2), 0)" in str(err.value)


def test_lit_gpt_rope_cache_is_unsaved_rotary_tables():
    """Its non-persistent cos/sin cache is made by the diagram (`~ rotary_cos unsaved`), so the
    state dict holds the two projections only."""
    text = round_trip(LitRotaryAttention(), torch.randn(2, 5, 16))
    assert "~ rotary_cos(base=10000) unsaved" in text and "~ rotary_sin(base=10000) unsaved" in text
    assert "persistent=False" not in text
