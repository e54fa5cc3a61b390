"""penrose.trace on Hugging Face models called as their users call them, `penrose.trace(GPTJModel(config),
ids)`, with no wrapper: the ModelOutput they return is the diagram's named outputs, the key/value cache
they return by default is left out (traced with use_cache=False), and a float cast below the model's
dtype (T5's layer norm, `.to(torch.float32)` in a float64 model) is a warning at its line.

Models this suite was not written against (GPT-J's interleaved partial rotary, Falcon's one key/value
head), tiny random configurations, no downloads; values and gradients in float32 and float64, strict
state-dict loading and the readability checks (test_trace_real.round_trip). What stays refused names
the op, the cause and the user's line.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from test_trace import round_trip as exact_round_trip
from test_trace import tensors
from test_trace_real import DTYPES, round_trip
from trace_readability import header
from torch import nn

import penrose

import transformers  # noqa: E402  (after test_trace_real's torchvision stand-in)
from transformers.models.t5 import modeling_t5 as t5  # noqa: E402

W = 16


def _ids():
    return torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))


def _model(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make = {
            # rotary over 4 of each head's 8 dims, interleaved (x[..., ::2], x[..., 1::2]); a sin|cos table as a buffer
            "gptj": lambda: transformers.GPTJModel(transformers.GPTJConfig(
                n_embd=32, n_head=4, n_layer=2, n_positions=8, vocab_size=11, rotary_dim=4, attn_pdrop=0.0,
                resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")),
            # multi-query: one key/value head, `fused_qkv[..., [-2], :]`
            "falcon": lambda: transformers.FalconModel(transformers.FalconConfig(
                hidden_size=W, num_attention_heads=4, num_hidden_layers=2, vocab_size=11, bos_token_id=0,
                eos_token_id=0, attn_implementation="eager")),
            # grouped key/value heads (new_decoder_architecture): `torch.broadcast_to(key, query.shape)`
            "falcon-gqa": lambda: transformers.FalconModel(transformers.FalconConfig(
                hidden_size=W, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True,
                num_hidden_layers=1, vocab_size=11, bos_token_id=0, eos_token_id=0, attn_implementation="eager")),
            "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(
                n_embd=W, n_head=4, n_layer=1, n_positions=8, vocab_size=11, bos_token_id=0, eos_token_id=0,
                attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, attn_implementation="eager")),
            # the pooler too: two outputs, last_hidden_state and pooler_output
            "bert": lambda: transformers.BertModel(transformers.BertConfig(
                hidden_size=W, intermediate_size=24, num_attention_heads=4, num_hidden_layers=1, vocab_size=11,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")),
            # ALiBi: slopes 2 ** (-8 (h + 1) / H) times key positions, added by baddbmm to (batch * heads) scores
            "bloom": lambda: transformers.BloomModel(transformers.BloomConfig(
                hidden_size=W, n_head=4, n_layer=2, vocab_size=11, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")),
            "bloom-8-heads": lambda: transformers.BloomModel(transformers.BloomConfig(
                hidden_size=32, n_head=8, n_layer=1, vocab_size=11, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")),
            # 6 heads: the slopes of 4, then every other one of 8's (not one power of a base)
            "bloom-6-heads": lambda: transformers.BloomModel(transformers.BloomConfig(
                hidden_size=24, n_head=6, n_layer=1, vocab_size=11, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")),
            "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(
                hidden_size=W, intermediate_size=24, num_attention_heads=4, num_hidden_layers=1, vocab_size=11,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")),
            "t5-encoder": lambda: transformers.T5EncoderModel(transformers.T5Config(
                d_model=W, d_ff=24, d_kv=4, num_heads=4, num_layers=1, vocab_size=11, dropout_rate=0.0,
                attn_implementation="eager")),
        }[name]
        torch.manual_seed(0)
        return make()


@DTYPES
@pytest.mark.parametrize("name", ["gptj", "falcon", "falcon-gqa", "bloom", "bloom-8-heads", "gpt2", "bert"])
def test_whole_models_called_without_a_wrapper_round_trip(name, dtype):
    """The model itself, called on token ids: its ModelOutput's tensor fields are the outputs, named
    by their fields; the cache it returns by default is not one (the header says so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", penrose.PenroseWarning)  # float64: their attention casts to float32
        text = round_trip(_model(name), [_ids()], dtype)
    fields = "last_hidden_state, pooler_output" if name == "bert" else "last_hidden_state"
    assert f"\noutput {fields}\n" in text
    assert f"in its order ({fields}): the compiled model returns them as a tuple" in header(text)
    if name != "bert":  # an encoder returns no cache: nothing to leave out
        assert re.search(r"Not an output: \w+ \(a DynamicCache\) .* use_cache=False", header(text))
    else:
        assert "# Not an output" not in text


def test_bloom_alibi_is_slopes_times_key_positions():
    """The ALiBi bias forward builds from constants is written from two `unsaved` `~ arange` buffers
    (head indices, key positions): `0.25 ** (head_index + 1) * key_position`, merged with the batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", penrose.PenroseWarning)
        text = penrose.trace(_model("bloom"), _ids())
    assert "buffer head_index[" in text and "~ arange unsaved" in text
    assert "slopes = 0.25 ** (head_index + 1)" in text and "* key_position" in text


def test_gptj_rotary_table_is_made_not_saved():
    """GPT-J's sin|cos table (persistent=False) is made by the diagram from `unsaved` rotary_sin and
    rotary_cos buffers, so the state dict alone loads strictly; its interleaved halves are views."""
    model = _model("gptj")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", penrose.PenroseWarning)
        text = penrose.trace(model, _ids())
    assert "~ rotary_sin(base=10000) unsaved" in text and "~ rotary_cos(base=10000) unsaved" in text
    assert "embed_positions" not in text.split("# index legend")[1].split("\n\n", 1)[1]  # only the header names it
    penrose.compile(text).load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("name, where, cause", [
    # ALiBi slopes of a head count that is not a power of 2, rebuilt from the mask's positions made for the
    # batch: merged with the heads, the batch would be a leg of its size (batch=False accepts that)
    ("bloom-6-heads", r"modeling_bloom.py:\d+:\d+", r"the module merges its batch with other axes into one"),
])
def test_whole_models_still_refused_name_op_cause_and_line(name, where, cause):
    with pytest.raises(penrose.PenroseError, match=where + r": error: " + cause) as err:
        penrose.trace(_model(name), _ids())
    assert "\n" in str(err.value)  # and the line's code under it


def test_positions_counted_from_the_padding_and_relative_buckets_round_trip_at_two_batches():
    """RoBERTa's positions counted from the padding (`input_ids.ne(padding_idx).int()`, a running sum:
    a causal contraction, read as one-hot rows of the table) and T5's relative-position buckets (log,
    min, where and a truncation of constants, rebuilt from `~ arange` buffers, read as one-hot rows):
    once refused, now traced, at two batch sizes. T5's `shared.weight` is the same tensor as its
    encoder's embedding, never called under that name: handed up unread by a call of `shared`, so the
    state dict loads strictly (the header says so; it loaded only with strict=False)."""
    for name in ("roberta", "t5-encoder"):
        model = _model(name).eval()
        text = penrose.trace(model, _ids())
        twin = penrose.compile(text).eval()
        twin.load_state_dict(model.state_dict(), strict=True)
        for batch in (1, 3):
            ids = torch.randint(0, 11, (batch, 5), generator=torch.Generator().manual_seed(batch))
            with torch.no_grad():
                torch.testing.assert_close(tensors(twin(ids)), tensors(model(ids)), rtol=1e-5, atol=1e-5)
    assert "Tied: shared.weight (the same tensor as encoder.embed_tokens.weight)" in " ".join(header(text).split())
    assert "shared_weight = embedding_shared() as `shared`" in text


class Interleaved(nn.Module):
    """GPT-J's rotate_every_two, and Falcon's one key head picked by a list index."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        pairs = torch.stack((-h[..., 1::2], h[..., ::2]), dim=-1).flatten(-2)
        heads = h.view(*h.shape[:-1], 4, 2)
        return pairs * h + heads[..., [-2], :].sum(-1) + heads[..., [1, 2], :].sum(-1).sum(-1, keepdim=True)


def test_strided_slices_and_list_indices_round_trip():
    text = exact_round_trip(Interleaved(), torch.randn(3, 5, 8))
    assert "select(" in text and "slice(" in text


class WithCache(nn.Module):
    """A wrapper that hands the cache on: no use_cache to turn it off."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids)
        return out.last_hidden_state, out.past_key_values


def test_a_cache_in_the_outputs_is_refused_with_the_way_out():
    with pytest.raises(penrose.PenroseError, match=r"a DynamicCache in the module's outputs .*use_cache=False"):
        penrose.trace(WithCache(_model("gpt2")), _ids())


class Fields(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x):
        h = self.proj(x)
        return {"logits": h, "probs": h.softmax(-1)}


def test_a_dict_of_tensors_is_named_outputs_in_its_order():
    text = exact_round_trip(Fields(), torch.randn(2, 4))
    assert "\noutput logits, probs\n" in text


class Nested(nn.Module):
    def forward(self, x):
        return {"h": x * 2, "all": (x, x + 1)}


def test_a_mapping_with_a_non_tensor_field_is_refused():
    with pytest.raises(penrose.PenroseError, match=r"field 'all' is a tuple, not a tensor"):
        penrose.trace(Nested(), torch.randn(2, 4))


# ---- casts below the model's dtype ------------------------------------------------------------------------


def _t5_ff():
    torch.manual_seed(0)
    return t5.T5LayerFF(transformers.T5Config(d_model=W, d_ff=24, dropout_rate=0.0))


def test_t5_layer_norm_downcast_in_float64_warns_at_its_line():
    """T5LayerNorm computes its variance in float32 (`hidden_states.to(torch.float32)`): in a float64
    model the diagram computes in float64, so it differs (by ~4e-8); not silent: a warning naming the
    line, and the header says so."""
    x = torch.randn(2, 5, W, dtype=torch.float64)
    with pytest.warns(penrose.PenroseWarning, match=r"modeling_t5.py:\d+ \(variance = hidden_states.to\(torch.float32\)"
                                                    r".*casts to float32, below the model's float64; the diagram computes in float64"):
        text = penrose.trace(_t5_ff().double(), x)
    assert re.search(r"Computes in float64 where the module casts to float32 at \S+modeling_t5.py:\d+", header(text))
    model = penrose.compile(text).double()
    module = _t5_ff().double()
    model.load_state_dict(module.state_dict(), strict=True)
    with torch.no_grad():
        err = (model(x) - module(x)).abs().max().item()
    assert 0 < err < 1e-5  # the rounding the warning is about


def test_t5_layer_ff_in_float32_round_trips_exactly_and_silently():
    x = torch.randn(2, 5, W)
    with warnings.catch_warnings():
        warnings.simplefilter("error", penrose.PenroseWarning)
        text = penrose.trace(_t5_ff(), x)
    assert "# Computes in" not in text
    module = _t5_ff()
    model = penrose.compile(text)
    model.load_state_dict(module.state_dict(), strict=True)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = tensors(module(a)), tensors(model(b))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    cot = [torch.randn_like(w) for w in want]
    torch.autograd.backward(want, cot)
    torch.autograd.backward(got, cot)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


class SoftmaxInFloat32(nn.Module):
    """Attention weights as Hugging Face's eager attention computes them (CLIP, LLaMA, ...):
    `softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        q = self.proj(x)
        w = torch.softmax(q @ x.transpose(-1, -2), dim=-1, dtype=torch.float32).to(q.dtype)
        return w @ x


def test_softmax_computed_in_float32_in_a_float64_model_warns_at_its_line():
    """Regression: a softmax's own `dtype=torch.float32` down-cast in a float64 model was silent
    (CLIP's encoder layer round-tripped to ~6e-8 with no warning): only `.to(...)` casts were seen."""
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    with pytest.warns(penrose.PenroseWarning, match=r"dtype=torch.float32\).to\(q.dtype\)\) casts to float32, below the model's float64"):
        text = penrose.trace(SoftmaxInFloat32().double(), x)
    assert "Computes in float64 where the module casts to float32" in header(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", penrose.PenroseWarning)
        text32 = penrose.trace(SoftmaxInFloat32(), x.float())  # float32: nothing to say
    assert "# Computes in" not in text32


class Upcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).float().softmax(-1).to(x.dtype)


def test_an_upcast_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error", penrose.PenroseWarning)
        text = penrose.trace(Upcast(), torch.randn(2, 4))
    assert "# Computes in" not in text


def _tied_round_trip(module, ids_of, batches=(2, 3), tol=1e-6):
    """Traced at the first batch size; at each, strict loading, the same outputs, and each tensor's
    gradient the sum of its names' in the compiled model (tied weights are separate params there).
    float64, to float32 precision: OPT's softmax and T5's norm compute in float32 (the header says so)."""
    module = module.double().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", penrose.PenroseWarning)  # the casts to float32, named in the header
        text = penrose.trace(module, ids_of(batches[0]))
    twin = penrose.compile(text).double().eval()
    twin.load_state_dict(module.state_dict(), strict=True)
    names: dict = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p, []))[1].append(name)
    for batch in batches:
        ids = ids_of(batch)
        module.zero_grad()
        twin.zero_grad()
        want, got = tensors(module(ids)), tensors(twin(ids))
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
        cot = [torch.randn_like(w) for w in want]
        torch.autograd.backward(want, cot)
        torch.autograd.backward(got, cot)
        for p, aliases in names.values():
            grads = [twin.get_parameter(n).grad for n in aliases]
            total = sum(g for g in grads if g is not None)
            torch.testing.assert_close(total, p.grad, rtol=10 * tol, atol=tol, msg=aliases)
    return text


def test_opt_for_causal_lm_round_trips_at_two_batches():
    """OPTForCausalLM called on token ids (learned positions counted from 2, its head tied to the
    token table): values, gradients and strict loading at two batch sizes. (Called with a padding mask,
    its positions are a running sum of the mask, refused at its line: tests/tracing/test_trace_masks.py.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.OPTForCausalLM(transformers.OPTConfig(
            hidden_size=W, ffn_dim=24, num_attention_heads=4, num_hidden_layers=2, vocab_size=11, max_position_embeddings=16,
            word_embed_proj_dim=W, dropout=0.0, attn_implementation="eager"))
    text = _tied_round_trip(model, lambda b: torch.randint(0, 11, (b, 5), generator=torch.Generator().manual_seed(b)))
    assert "output logits" in text and "repeat 2 as layers" in text


def test_t5_encoder_tied_table_round_trips_with_gradients():
    """T5's `shared.weight` handed up unread: its gradient is its encoder's table's (strict loading)."""
    model = _model("t5-encoder")
    text = _tied_round_trip(model, lambda b: torch.randint(0, 11, (b, 5), generator=torch.Generator().manual_seed(b)))
    assert "as `shared`" in text
