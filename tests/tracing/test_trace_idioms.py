"""penrose.trace on the idioms issue 38 found refused, each a named regression: constants forward
computes from positions, index tensors, 1x1 convolutions, a parameter read by its parent, buffers
the diagram reads another way, outputs with None, a batch merged with the heads (the sparse mixture
of experts: tests/tracing/test_trace_moe.py).

Each idiom is written twice: the way public repositories write it (this file's own code in their
style, none copied) and in transformers' or timm's own modules (tiny random configurations, no
downloads). Each round-trips as tests/tracing/test_trace.py's `round_trip` does (values and
gradients in float64, strict loading from `module.state_dict()`, readable), then runs a second batch
size through the compiled diagram.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision_stub
from test_trace import round_trip, tensors
from torch import nn
from trace_readability import header

import penrose
from penrose.tracing import PenroseTraceError

torchvision_stub.install()

import timm.layers  # noqa: E402 - after the torchvision stand-in
import transformers  # noqa: E402
from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention  # noqa: E402


TOL = 1e-6  # float64 modules whose constants (tables of positions) torch computes in float32, as the diagram does


def at_two_batches(module, make_inputs, tol=TOL, **options) -> str:
    """`round_trip` at batch 2, then the compiled diagram against the module at batch 3."""
    text = round_trip(module, *make_inputs(2), tol=tol, **options)
    twin = penrose.compile(text).double().eval()
    twin.load_state_dict(module.state_dict())
    module.eval()
    inputs = [x.double() if x.is_floating_point() else x for x in make_inputs(3)]
    with torch.no_grad():
        torch.testing.assert_close(tensors(twin(*inputs)), tensors(module(*inputs)), rtol=tol, atol=tol)
    return text


def _x(width=16, tokens=5):
    return lambda batch: (torch.randn(batch, tokens, width, generator=torch.Generator().manual_seed(batch)),)


# ---- constants computed in forward from positions ----------------------------------------------------------


class AlibiAttention(nn.Module):
    """ALiBi written in forward: slopes `2 ** (-8 h / H)` times the distance of the keys."""

    def __init__(self, d=16, n_head=4):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        slopes = 2.0 ** (-8.0 * torch.arange(1, self.n_head + 1) / self.n_head)
        pos = torch.arange(T)
        bias = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None])
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class SinusoidalPositions(nn.Module):
    """The original transformer's positions, made in forward: sin on even columns, cos on odd ones."""

    def __init__(self, d=16):
        super().__init__()
        self.d = d
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        T = x.shape[1]
        position = torch.arange(T).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.d, 2) * (-math.log(10000.0) / self.d))
        pe = torch.zeros(T, self.d)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return self.lin(x + pe)


class RetentionDecay(nn.Module):
    """RetNet's decay table `gamma ** (t - s)` below the diagonal, made in forward."""

    def __init__(self, d=16, gamma=0.9):
        super().__init__()
        self.gamma = gamma
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        t = torch.arange(x.shape[1])
        decay = self.gamma ** (t[:, None] - t[None, :]).float() * (t[:, None] >= t[None, :])
        return (self.q(x) @ self.k(x).transpose(-1, -2) * decay) @ self.v(x)


class InterleavedRotary(nn.Module):
    """Rotary tables interleaved (GPT-J's layout), from the module's inverse frequencies and positions."""

    def __init__(self, d=16):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)), persistent=False)
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        freqs = torch.repeat_interleave(torch.outer(torch.arange(x.shape[1]).float(), self.inv_freq), 2, dim=-1)
        cos, sin = freqs.cos(), freqs.sin()
        rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return self.lin(x * cos + rotated * sin)


@pytest.mark.parametrize("make, expect", [
    (AlibiAttention, "~ arange unsaved"),
    (SinusoidalPositions, "~ rotary_sin(base=10000) unsaved"),
    (RetentionDecay, "0.9 ** ("),
    (InterleavedRotary, "~ rotary_cos(base=10000) unsaved"),
], ids=["alibi", "sinusoidal", "decay", "interleaved-rotary"])
def test_constants_forward_makes_from_positions_round_trip(make, expect):
    """Once refused as "made from constants": rebuilt from `~ arange` buffers (positions) with the
    language's own arithmetic, or read as rows of rotary tables (sin and cos of positions)."""
    text = at_two_batches(make(), _x())
    assert expect in text
    if make in (AlibiAttention, RetentionDecay):  # positions of the tokens, from a buffer: the header says so
        assert "Takes 5 tokens only: positions made in forward" in header(text)


def test_mpt_alibi_made_in_forward_round_trips():
    """transformers' MPT builds its ALiBi bias in forward from torch.arange."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.MptModel(transformers.MptConfig(d_model=16, n_heads=4, n_layers=1, vocab_size=11, max_seq_len=16))
    text = at_two_batches(model, lambda b: (torch.randint(0, 11, (b, 5), generator=torch.Generator().manual_seed(b)),))
    assert "~ arange unsaved" in text


# ---- index tensors --------------------------------------------------------------------------------------------


class RelativePositionBias(nn.Module):
    """A relative-position bias table gathered by an index buffer (Swin's, BEiT's)."""

    def __init__(self, window=3, heads=2, d=8):
        super().__init__()
        self.heads = heads
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index.view(-1)].view(N, N, -1).permute(2, 0, 1)
        att = (q @ k.transpose(-2, -1) + bias.unsqueeze(0)).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(B, N, C)


class EosPooling(nn.Module):
    """Pooling at the first end-of-text token (CLIP's): `h[torch.arange(B), (ids == eos).int().argmax(-1)]`."""

    def __init__(self, vocab=11, d=8, eos=3):
        super().__init__()
        self.eos = eos
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)

    def forward(self, ids):
        h = self.proj(self.emb(ids))
        return h[torch.arange(h.shape[0]), (ids == self.eos).int().argmax(-1)]


def _ids_with_eos(batch):
    ids = torch.randint(4, 11, (batch, 5), generator=torch.Generator().manual_seed(batch))
    ids[torch.arange(batch), torch.arange(batch) % 5] = 3  # an end token, somewhere else in each row
    ids[0, 4] = 3  # and a second one after the first
    return (ids,)


def test_relative_position_bias_gathered_by_an_index_buffer_round_trips():
    """The index buffer (persistent=False, no init makes it) is affine in the window's coordinates:
    rebuilt from `~ arange` buffers, and the table read by its one-hot rows."""
    text = at_two_batches(RelativePositionBias(), _x(8, 9))
    assert "buffer coords[" in text and "persistent=False" not in text


def test_timm_window_attention_relative_position_index_round_trips():
    text = at_two_batches(WindowAttention(dim=8, num_heads=2, window_size=3), _x(8, 9))
    assert "relative_position_bias_table" in text


def test_timm_swin_block_round_trips():
    """A whole (unshifted) Swin block: windows cut by views, padding by nothing, the bias by its index."""
    at_two_batches(SwinTransformerBlock(dim=8, input_resolution=(6, 6), num_heads=2, window_size=3),
                   lambda b: (torch.randn(b, 6, 6, 8, generator=torch.Generator().manual_seed(b)),))


def test_pooling_at_the_first_end_token_round_trips():
    """argmax of a bool test as the one-hot of its first hit (a causal count of the hits), cast to int."""
    text = at_two_batches(EosPooling(), _ids_with_eos)
    assert "causal(t, s)" in text


def test_clip_text_model_pools_at_its_end_token():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.CLIPTextConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_hidden_layers=1,
                                             vocab_size=11, max_position_embeddings=8, eos_token_id=3, bos_token_id=0,
                                             attn_implementation="eager")
        model = transformers.CLIPTextModel(config)
    text = at_two_batches(model, _ids_with_eos, tol=1e-5)  # its causal mask is made in float32
    assert "causal(t, s)" in text


# ---- 1x1 convolutions ------------------------------------------------------------------------------------------


class TalkingHeads(nn.Module):
    """Talking-heads attention: the heads mixed before and after the softmax by 1x1 convolutions."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.pre = nn.Conv2d(heads, heads, 1, bias=False)
        self.post = nn.Conv2d(heads, heads, 1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = self.post(self.pre(q @ k.transpose(-2, -1)).softmax(-1))
        return (att @ v).transpose(1, 2).reshape(B, T, C)


class TokenMixingConv(nn.Module):
    """Token mixing written as a Conv1d over the tokens, channel mixing as one over the features."""

    def __init__(self, t=5, d=16):
        super().__init__()
        self.mix = nn.Conv1d(t, t, 1)
        self.channels = nn.Conv1d(d, d, kernel_size=1)

    def forward(self, x):
        x = x + self.mix(x)
        return self.channels(x.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize("make, inputs", [
    (TalkingHeads, _x()),
    (TokenMixingConv, _x()),
    (lambda: timm.layers.ConvMlp(8, 16), lambda b: (torch.randn(b, 8, 3, 3, generator=torch.Generator().manual_seed(b)),)),
], ids=["talking-heads", "token-mixing", "timm-conv-mlp"])
def test_one_by_one_convolutions_are_einsums(make, inputs):
    text = at_two_batches(make(), inputs)
    assert "einsum(" in text and "conv" in text


# ---- a parameter read by its parent -----------------------------------------------------------------------


class TableAsMatrix(nn.Module):
    """An embedding table used as a matrix by its parent, normalised by a sibling: never called itself."""

    def __init__(self, vocab=7, d=8):
        super().__init__()
        self.rel = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x @ self.norm(self.rel.weight).T


def test_a_parameter_read_by_its_parent_is_handed_up_by_its_module():
    text = at_two_batches(TableAsMatrix(), _x(8))
    assert "rel_weight = embedding() as rel" in text


# ---- buffers the diagram reads another way, outputs with None ----------------------------------------------


class OldGPT2Attention(nn.Module):
    """Older GPT-2 code: its causal mask and mask value registered as persistent buffers."""

    def __init__(self, d=16, n_head=4, n_ctx=8):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool)).view(1, 1, n_ctx, n_ctx))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        w = q @ k.transpose(-2, -1) / math.sqrt(v.size(-1))
        w = torch.where(self.bias[:, :, :T, :T], w, self.masked_bias.to(w.dtype))
        return self.c_proj((w.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class LogitsAndLoss(nn.Module):
    """nanoGPT's forward: `return logits, loss`, the loss None without targets."""

    def __init__(self, d=8, vocab=11):
        super().__init__()
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, x, targets=None):
        logits = self.lm_head(x)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def test_persistent_mask_buffers_are_kept_so_the_state_dict_loads_strictly():
    text = at_two_batches(OldGPT2Attention(), _x())  # round_trip loads strictly
    assert "buffer bias[" in text and "buffer masked_bias[]" in text


def test_outputs_with_none_are_the_tensors_and_the_header_says_so():
    text = at_two_batches(LogitsAndLoss(), _x(8))
    assert "output logits\n" in text and "Not an output: the None forward returns at place 2" in text


class ReturnsNone(nn.Module):
    def forward(self, x):
        return None


def test_a_module_returning_none_is_refused_at_its_return():
    with pytest.raises(penrose.PenroseError, match=r"test_trace_idioms.py:\d+:\d+: error: the module returns None") as err:
        penrose.trace(ReturnsNone(), torch.randn(2, 3))
    assert "return None" in str(err.value)


class SharedEmbedding(nn.Module):
    """T5's layout: a table `shared` that forward never calls under that name, the same module as
    the encoder's `embed` (its state dict holds both names)."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.encoder = nn.ModuleDict({"embed": self.shared, "proj": nn.Linear(d, d)})

    def forward(self, ids):
        return self.encoder["proj"](self.encoder["embed"](ids))


def test_a_tied_table_never_called_under_its_name_loads_strictly():
    """regression: `shared.weight` was left out of the diagram (load with strict=False); it is handed
    up unread by a call of its module, so `load_state_dict(module.state_dict(), strict=True)` works."""
    module = SharedEmbedding()
    assert {"shared.weight", "encoder.embed.weight"} <= set(module.state_dict())
    text = penrose.trace(module, torch.randint(0, 11, (2, 5)))
    assert "Tied: shared.weight" in " ".join(header(text).split()) and "Not in the diagram" not in text
    twin = penrose.compile(text)
    twin.load_state_dict(module.state_dict(), strict=True)
    for batch in (2, 3):
        ids = torch.randint(0, 11, (batch, 5), generator=torch.Generator().manual_seed(batch))
        module.zero_grad()
        twin.zero_grad()
        want, got = module(ids), twin(ids)
        torch.testing.assert_close(got, want)
        want.square().sum().backward()
        got.square().sum().backward()
        # the tensor's gradient is its reader's: the twin handed up unread takes none
        torch.testing.assert_close(twin.get_parameter("encoder.embed.weight").grad, module.shared.weight.grad)
        assert twin.get_parameter("shared.weight").grad is None


# ---- the batch --------------------------------------------------------------------------------------------------


class PaddedAttention(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x, pad):
        return self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]


def _padded(batch):
    pad = torch.zeros(batch, 5, dtype=torch.bool)
    pad[0, 3:] = True
    return torch.randn(batch, 5, 16, generator=torch.Generator().manual_seed(batch)), pad


def test_multihead_attention_with_a_key_padding_mask_keeps_the_batch_free():
    """torch merges the batch with the heads (`(batch * heads, t, d)`): kept apart, so the diagram
    runs any batch (it ran only the traced one, refusing others at run time)."""
    text = at_two_batches(PaddedAttention(), _padded)
    assert "(b h)" not in text and "(h b)" not in text


class PaddedEncoderLayer(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, 32, dropout=0.0, batch_first=True)

    def forward(self, x, pad):
        return self.layer(x, src_key_padding_mask=pad)


def test_transformer_encoder_layer_with_a_padding_mask_keeps_the_batch_free():
    """The same merge inside `nn.TransformerEncoderLayer(batch_first=True)` given `src_key_padding_mask`."""
    text = at_two_batches(PaddedEncoderLayer(), _padded)
    assert "Takes a batch of" not in text


class PaddedAttentionBatchSecond(nn.Module):
    """`nn.MultiheadAttention` as it is by default (batch_first=False): inputs `(tokens, batch, width)`."""

    def __init__(self, d=16, heads=4, padded=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads)
        self.padded = padded

    def forward(self, x, pad):
        return self.attn(x, x, x, key_padding_mask=pad if self.padded else None, need_weights=False)[0]


def _batch_second(batch):
    pad = torch.zeros(batch, 5, dtype=torch.bool)
    pad[0, 3:] = True
    return torch.randn(5, batch, 16, generator=torch.Generator().manual_seed(batch)), pad


@pytest.mark.parametrize("padded", [True, False], ids=["key_padding_mask", "no mask"])
def test_multihead_attention_batch_second_is_refused_at_trace_time(capfd, padded):
    """regression (issue 38, a wrong batch): with batch_first=False the batch is axis 1 of x (axis 0
    of the padding mask). The trace read axis 0 (the tokens) as the batch and fixed the real one to
    the example's, so the compiled diagram refused any other batch only at run time ("input 'x' leg
    't' must have size 2, got 3"). Now trace refuses, at the user's call, saying what to do."""
    import inspect

    capfd.readouterr()
    module = PaddedAttentionBatchSecond(padded=padded)
    with pytest.raises(PenroseTraceError) as info:
        penrose.trace(module, *_batch_second(2))
    err = info.value
    assert "batch is axis 1 of input 1 (size 2)" in err.message and "batch_first=True" in err.message, err.message
    assert "batch=False" in err.message
    lines, start = inspect.getsourcelines(PaddedAttentionBatchSecond.forward)
    assert err.span.file == __file__ and err.span.line == start + 1, err.render()  # the `self.attn(...)` line
    assert capfd.readouterr().err == ""


def test_multihead_attention_batch_second_with_batch_false_says_its_fixed_batch():
    """batch=False accepts the fixed batch: the header says so, and the diagram matches at that batch
    (values, gradients, strict loading)."""
    module = PaddedAttentionBatchSecond()
    text = round_trip(module, *_batch_second(2), batch=False)
    assert "# Takes a batch of 2 only: the module's batch is axis 1 of input 1" in text, text


class FlatTokensMlp(nn.Module):
    """Learned positions, then GPT-2's `Conv1D` written inline (the tokens of the batch flattened into
    one axis for `addmm`): the diagram fixes the tokens, which the module computes item by item."""

    def __init__(self, d=16, hidden=32, tokens=5):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(tokens, d))
        self.weight = nn.Parameter(torch.randn(d, hidden) / 4)
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        B, T, E = x.shape
        return torch.addmm(self.bias, (x + self.pos).view(-1, E), self.weight).view(B, T, -1).relu()


def test_tokens_computed_apart_are_not_taken_for_the_batch():
    """The check above refuses a fixed axis computed item by item only when axis 0 is not: here both
    the batch (axis 0, a leg the trace keeps free) and the tokens (fixed by `pos`) are, and axis 0
    stays the batch (any batch runs), as before."""
    text = at_two_batches(FlatTokensMlp(), _x())
    assert "input x[b, t, e]" in text and "Takes a batch" not in text, text


# ---- what a person would have written: the measures of tests/trace_readability.py ---------------------------


def test_whole_models_read_like_hand_written_diagrams():
    """LLaMA and GPT-2 from token ids, and timm's ViT attention, by every measure: no line over 100
    characters, a block's formals read by its einsums by the letters it declares, identical layers
    written `repeat N`, no made-up names (`r2`, `h2`, formals `x2`), one letter per meaning in the
    legend, class names split as a person splits them. (Before issue 38, the same three had 8
    long lines, a block read by other letters, an unrolled layer pair, 3 made-up names and
    `si_lu_activation`.)"""
    from test_trace_real import _timm, _whole
    from trace_readability import measures

    for module, inputs in (_whole("llama"), _whole("gpt2"), _timm("timm-vit-attention")):
        text = penrose.trace(module.eval(), *inputs)
        assert measures(text) == {"long lines": 0, "block legs vs einsum": 0, "unrolled layers": 0, "made-up names": 0,
                                  "legend repeats": 0, "block names": 0, "letters per meaning": 0}, text


def test_one_letter_per_meaning_in_whole_models():
    """regression (issue 38): timm's whole VisionTransformer named its residual stream `f` ("axis 0 of
    proj.weight") and its heads times head dim `e` ("model width"), two letters for the width, and
    its patch's rows (4 pixels) `d`, the head dim's letter: `rearrange(x, 'n (g d) (t c) -> ...')`.
    Now the width is the residual stream's letter, `e`, the heads merged are `hd`, and `d` is only
    a head dim. Measured over GPT-2, BERT, ViT and ALBERT (transformers' AlbertModel, shared
    layers): each meaning the module's attributes give has one letter (tests/trace_readability.py,
    `meaning_letters`)."""
    from test_trace_real import _vit, _whole
    from test_trace_shared import _albert, _ids
    from trace_readability import meaning_letters

    module, inputs = _vit()
    text = penrose.trace(module.eval(), *inputs)
    assert meaning_letters(text) == [], text
    assert "#   e  model width (embed_dim = 16)\n" in text and "dim hd = h * d" in text, text
    # the tokens' letter (`j`; `m` while the class token's axis held `j`) is no meaning's
    assert "block block_module(x[j, e])" in text and "'h j d -> j (h d)'" in text, text
    for module, inputs in (_whole("gpt2"), _whole("bert"), (_albert(3, 1), _ids(2))):
        text = penrose.trace(module.eval(), *inputs)
        assert meaning_letters(text) == [], text


def test_vit_heads_keep_their_letter():
    """regression: timm's VisionTransformer's patch grid, split by a view as heads are, took `h` by
    that role alone, and its heads (num_heads = 4) became `t`: the letter the module's attributes
    give the heads is theirs."""
    from test_trace_real import _vit

    module, inputs = _vit()
    text = penrose.trace(module.eval(), *inputs)
    assert "#   h  heads (num_heads = 4)" in text and "(u h d)" in text


def test_vit_size_1_axes_read_as_what_they_are():
    """regression: timm's ViT declared `cls_token[one, j, e]` and `pos_embed[o, m, e]`: three letters for
    size-1 axes, two of them (`one`, `o`) the same thing, the batch's place in tensors the same for every
    item (`cls_token.expand(B, -1, -1)`, `x + pos_embed`), and `j`, "axis 1 of cls_token", the class
    token the concat puts before the patches. Now the batch's place is `one` in both, said so in the
    legend, the class token is `cls` as the source names it, the tokens are "cls and gt joined", and
    attention's keys "j again"; the legend repeats no meaning (tests/trace_readability.py)."""
    from test_trace_real import _vit
    from trace_readability import legend_repeats

    module, inputs = _vit()
    text = penrose.trace(module.eval(), *inputs)
    assert "param cls_token[one, cls, e]\nparam pos_embed[one, j, e]\n" in text, text
    assert "concat([rearrange(cls_token, '1 cls e -> cls e'), patch_embed_out], cls, j)" in text, text
    assert "#   one  size 1 where the batch is: cls_token and pos_embed are the same for every item\n" in text, text
    assert "#   cls  axis 1 of cls_token\n#   j  cls and gt joined (concat)\n" in text, text
    assert "#   s  j again (a second leg of that size)\n" in text, text
    assert legend_repeats(text) == [], text


class _Square(nn.Module):
    """A residual map by a square weight of the model's width (its output added to its input: both
    axes the width), read by a matmul only, or also by an element-wise op."""

    def __init__(self, scaled=False, hidden_size=8):
        super().__init__()
        self.hidden_size = hidden_size
        self.scaled = scaled
        self.weight = nn.Parameter(torch.randn(hidden_size, hidden_size))

    def forward(self, x):
        return x + x @ (self.weight * 2 if self.scaled else self.weight).t()


def test_a_square_weight_of_the_width_takes_its_letter_on_both_axes():
    """regression: LLaMA's q_proj and o_proj (BERT's query, key, value) share one block whose square
    weight took the width `e` on its output axis and `i`, "axis 1 of q_proj.weight", on its input, so
    the block read `x[t, i]` where every call passes the residual stream. A param may carry one leg
    name twice: a square weight whose axes are both the width, read by einsums only, is
    `weight[e, e]`, the einsum telling the two apart by its own letters. Read by anything else (an
    element-wise op aligns legs by name) it keeps two letters, as does a square map whose output is
    not the width it reads (tests/tracing/test_trace_unsaved.py's `Linear(4, 4)`: `weight[f, e]`).
    Values: penrose.trace verifies them."""
    from test_trace_real import _whole
    from trace_readability import block_leg_mismatches

    for name in ("llama", "bert"):
        module, inputs = _whole(name)
        text = penrose.trace(module.eval(), *inputs)
        assert "block linear(x[t, e]) {\n  param weight[e, e]\n" in text and "einsum('ti,ei->te', x, weight)" in text, text
        assert not re.search(r"^#   i  ", text, re.MULTILINE) and block_leg_mismatches(text) == [], text
    text = round_trip(_Square(), torch.randn(3, 8))
    assert "param weight[e, e]\n" in text and re.search(r"einsum\('(\w),e\1->e', x, weight\)", text), text
    text = round_trip(_Square(scaled=True), torch.randn(3, 8))
    assert re.search(r"param weight\[(\w+), (?!\1)\w+\]", text), text


def test_readability_measures_can_fail():
    from trace_readability import block_leg_mismatches, legend_repeats, long_lines, made_up_names, meaning_letters, \
        snake_block_names, unrolled_layers

    text = ("# index legend:\n#   t  token\n#   e  width\n#   m  width\n"
            "dim t = 3, e = 4, m = 4\n\n"
            "block si_lu_linear(x2[t, e]) {\n  param weight[e, m]\n  return einsum('tm,em->te', x2, weight)\n}\n\n"
            "input x[t, e]\nh = si_lu_linear(x) as layers.0\nr2 = si_lu_linear(h) as layers.1\n"
            f"y = x + {' + '.join(['r2'] * 30)}\noutput y\n")
    assert long_lines(text) and block_leg_mismatches(text) and unrolled_layers(text)
    assert made_up_names(text) == ["h", "r2", "x2", "y"] and snake_block_names(text) == ["si_lu_linear"]
    assert legend_repeats(text) == ["e m"]
    square = "dim t = 3, e = 4\n\nblock f(x[t, e]) {\n  param w[e, e]\n  return einsum('ti,ei->te', x, w)\n}\n"
    assert block_leg_mismatches(square) == []  # w's two e's need two letters
    assert block_leg_mismatches(square.replace("'ti,ei->te'", "'ai,ei->ae'")) == ["f: x['t', 'e'] read as 'ai'"]
    vit = ("# index legend:\n#   d  head dim (head_dim = 4)\n#   h  heads (num_heads = 4)\n#   e  model width (dim = 16): h times d\n"
           "dim g = 2, d = 4, h = 4, f = 16\ndim e = h * d\n\nblock layer(x[t, f]) {\n  return x\n}\n\n"
           "input x[n, p]\ny = rearrange(x, 'n (g d) -> n g d')\nz = layer(y) repeat 2 as blocks\n")
    assert meaning_letters(vit) == ["model width: e f", "head dim without heads: (g d)"]
    ones = "dim one = 1, j = 1, o = 1, e = 4\nparam cls_token[one, j, e]\nparam pos_embed[o, e]\n"
    assert legend_repeats(ones) == ["size 1: one j o"]  # two would do: cls_token's two
    assert legend_repeats(ones.replace("o = 1, ", "").replace("[o, e]", "[one, e]")) == []
