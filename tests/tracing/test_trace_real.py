"""penrose.trace on code nobody here wrote: Hugging Face transformers' and timm's own modules.

Tiny random configurations, no downloads (`pretrained=False` where timm has it). Each module is
traced, compiled, loaded with its own state dict (strict: every name kept, `attention.self`
quoted), and compared with the original in values and gradients (inputs' and parameters') in
float32 and float64; every traced text also passes the readability checks: no statement nests
more than three calls, each dim letter is one axis, every dim is in the index legend.

timm imports torchvision, which PyPI builds do not let import beside this torch: the layers used
here never touch it, so tests/torchvision_stub.py stands in for it when it cannot be imported.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision_stub
from torch import nn
from test_trace import tensors
from trace_readability import call_depth, traced

import penrose

torchvision_stub.install()

import timm.layers  # noqa: E402 - after the torchvision stand-in
from timm.models.mlp_mixer import MixerBlock  # noqa: E402
from timm.models.vision_transformer import Attention as TimmAttention  # noqa: E402
from timm.models.vision_transformer import Block as TimmBlock  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel, MistralConfig, MistralModel, ViTConfig  # noqa: E402
from transformers.models.bert import modeling_bert as bert  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2 as gpt2  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.mistral import modeling_mistral as mistral  # noqa: E402
from transformers.models.vit import modeling_vit as vit  # noqa: E402

T, WIDTH = 5, 16


def _eager(config, attention="eager"):
    config._attn_implementation = attention  # eager: written out in torch; sdpa: F.scaled_dot_product_attention
    return config


def _configs(attention="eager"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small = {"hidden_size": WIDTH, "intermediate_size": 24, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 11}
        return {
            "gpt2": _eager(attention=attention, config=GPT2Config(n_embd=WIDTH, n_head=4, n_layer=1, n_positions=8, vocab_size=11, bos_token_id=0,
                                      eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)),
            "llama": _eager(attention=attention, config=LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=16)),
            "mistral": _eager(attention=attention, config=MistralConfig(**small, num_key_value_heads=2, max_position_embeddings=16, sliding_window=None)),
            "bert": _eager(attention=attention, config=BertConfig(**small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
            "vit": _eager(attention=attention, config=ViTConfig(**small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        }


class FirstOutput(nn.Module):
    """A layer whose forward returns a tuple (Hugging Face's): its first element."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


class WithRotary(nn.Module):
    """LLaMA and Mistral layers take the rotary (cos, sin) as one tuple argument: here two inputs."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, cos, sin):
        out = self.layer(x, position_embeddings=(cos, sin), attention_mask=None)
        return out[0] if isinstance(out, tuple) else out


def _rotary(config, rotary_cls):
    """cos and sin from the model's own rotary embedding, for positions 0 .. T-1."""
    with torch.no_grad():
        return rotary_cls(config=config)(torch.randn(2, T, WIDTH), torch.arange(T)[None].expand(2, T))


def _hf(name, attention="eager"):
    c = _configs(attention)
    rot = {"llama": (llama, llama.LlamaRotaryEmbedding), "mistral": (mistral, mistral.MistralRotaryEmbedding)}
    makers = {
        "gpt2-attention": lambda: FirstOutput(gpt2.GPT2Attention(c["gpt2"], layer_idx=0)),
        "gpt2-mlp": lambda: gpt2.GPT2MLP(4 * WIDTH, c["gpt2"]),
        "gpt2-block": lambda: FirstOutput(gpt2.GPT2Block(c["gpt2"], layer_idx=0)),
        "llama-attention": lambda: WithRotary(llama.LlamaAttention(c["llama"], layer_idx=0)),
        "llama-mlp": lambda: llama.LlamaMLP(c["llama"]),
        "llama-decoder-layer": lambda: WithRotary(llama.LlamaDecoderLayer(c["llama"], layer_idx=0)),
        "mistral-attention": lambda: WithRotary(mistral.MistralAttention(c["mistral"], layer_idx=0)),
        "mistral-mlp": lambda: mistral.MistralMLP(c["mistral"]),
        "mistral-decoder-layer": lambda: WithRotary(mistral.MistralDecoderLayer(c["mistral"], layer_idx=0)),
        "bert-attention": lambda: FirstOutput(bert.BertAttention(c["bert"])),
        "bert-intermediate": lambda: bert.BertIntermediate(c["bert"]),
        "bert-layer": lambda: FirstOutput(bert.BertLayer(c["bert"])),
        "vit-attention": lambda: FirstOutput(vit.ViTAttention(c["vit"])),
        "vit-layer": lambda: FirstOutput(vit.ViTLayer(c["vit"])),
    }
    module = makers[name]()
    x = torch.randn(2, T, WIDTH)
    family = name.split("-")[0]
    if family in rot and not name.endswith("-mlp"):
        return module, (x, *_rotary(c[family], rot[family][1]))
    return module, (x,)


def _timm(name):
    makers = {
        "timm-vit-block": lambda: TimmBlock(dim=WIDTH, num_heads=4, mlp_ratio=2.0, qkv_bias=True),
        "timm-vit-attention": lambda: TimmAttention(dim=WIDTH, num_heads=4, qkv_bias=True),
        "timm-mixer-block": lambda: MixerBlock(dim=WIDTH, seq_len=T, mlp_ratio=(0.5, 2.0)),
        "timm-mlp": lambda: timm.layers.Mlp(WIDTH, 32),
        "timm-swiglu": lambda: timm.layers.SwiGLU(WIDTH, 32),
        "timm-layerscale-block": lambda: TimmBlock(dim=WIDTH, num_heads=4, init_values=1e-5, qkv_bias=True),
        "timm-glu-mlp": lambda: timm.layers.GluMlp(WIDTH, 32),
        "timm-attention-pool": lambda: timm.layers.AttentionPoolLatent(WIDTH, num_heads=4),
    }
    return makers[name](), (torch.randn(2, T, WIDTH),)


HF = ["gpt2-attention", "gpt2-mlp", "gpt2-block", "llama-attention", "llama-mlp", "llama-decoder-layer",
      "mistral-attention", "mistral-mlp", "mistral-decoder-layer", "bert-attention", "bert-intermediate", "bert-layer",
      "vit-attention", "vit-layer"]
TIMM = ["timm-vit-block", "timm-vit-attention", "timm-mixer-block", "timm-mlp", "timm-swiglu", "timm-layerscale-block",
        "timm-glu-mlp", "timm-attention-pool"]


# ---- the round trip ---------------------------------------------------------------------------------------

TOL = {torch.float32: 2e-5, torch.float64: 1e-6}  # float64: Hugging Face's softmax runs in float32


def round_trip(module, inputs, dtype):
    torch.manual_seed(0)
    module = module.to(dtype).eval()
    with torch.no_grad():  # away from the initialisation, so that ones and zeros are not special
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]  # token ids stay integers
    text = traced(module, *inputs)  # and readable
    twin = penrose.compile(text).to(dtype).eval()
    twin.load_state_dict(module.state_dict(), strict=True)  # the module's own names, every one
    a = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    want, got = tensors(module(*a)), tensors(twin(*b))  # a ModelOutput's tensor fields, in order
    tol = TOL[dtype]
    assert len(got) == len(want)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    cot = [torch.randn_like(w) for w in want]
    torch.autograd.backward(want, cot)
    torch.autograd.backward(got, cot)
    for x, y in zip(a, b):
        if x.requires_grad:
            torch.testing.assert_close(y.grad, x.grad, rtol=10 * tol, atol=10 * tol)
    theirs = dict(module.named_parameters())
    for name, p in twin.state_dict(keep_vars=True).items():
        if isinstance(p, nn.Parameter):
            torch.testing.assert_close(p.grad, theirs[name].grad, rtol=10 * tol, atol=10 * tol, msg=name)
    return text


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])


@DTYPES
@pytest.mark.parametrize("name", HF)
def test_transformers_modules_round_trip(name, dtype):
    module, inputs = _hf(name)
    round_trip(module, inputs, dtype)


@DTYPES
@pytest.mark.parametrize("name", ["gpt2-attention", "llama-attention", "mistral-decoder-layer", "bert-attention", "vit-attention"])
def test_transformers_sdpa_attention_round_trips(name, dtype):
    """The default attention of transformers: F.scaled_dot_product_attention (enable_gqa=True for
    LLaMA's and Mistral's grouped-query heads)."""
    module, inputs = _hf(name, attention="sdpa")
    round_trip(module, inputs, dtype)


@DTYPES
@pytest.mark.parametrize("name", TIMM)
def test_timm_modules_round_trip(name, dtype):
    module, inputs = _timm(name)
    round_trip(module, inputs, dtype)


# ---- whole models: token ids in, the last hidden state out --------------------------------------------------


class LastHidden(nn.Module):
    """A Hugging Face model called on token ids alone (its masks, positions and rotary tables made
    in its own forward), its last hidden state the output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def _whole(name, attention="eager"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small = {"hidden_size": WIDTH, "intermediate_size": 24, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 11}
        configs = {
            "gpt2": lambda: GPT2Model(_eager(attention=attention, config=GPT2Config(
                n_embd=WIDTH, n_head=4, n_layer=2, n_positions=8, vocab_size=11, bos_token_id=0, eos_token_id=0,
                attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))),
            "llama": lambda: LlamaModel(_eager(attention=attention, config=LlamaConfig(
                **small, num_key_value_heads=2, max_position_embeddings=16))),
            "mistral": lambda: MistralModel(_eager(attention=attention, config=MistralConfig(
                **small, num_key_value_heads=2, max_position_embeddings=16, sliding_window=None))),
            "bert": lambda: BertModel(_eager(attention=attention, config=BertConfig(
                **small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)), add_pooling_layer=False),
        }
        more = {
            "qwen2": lambda: transformers.Qwen2Model(_eager(attention=attention, config=transformers.Qwen2Config(
                **small, num_key_value_heads=2, max_position_embeddings=16))),
            # rotary over half of each head (the rest passes): tables of 2 columns, frequencies all ones
            "gpt-neox": lambda: transformers.GPTNeoXModel(_eager(attention=attention, config=transformers.GPTNeoXConfig(
                **small, rotary_pct=0.5, max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0))),
            # rotary over the whole head: `q[..., rotary_dim:]` is empty, and the cat that rejoins it
            "phi3": lambda: transformers.Phi3Model(_eager(attention=attention, config=transformers.Phi3Config(
                **small, num_key_value_heads=2, max_position_embeddings=16, pad_token_id=0))),
            # a 0-dim non-persistent buffer (the embedding's normalizer, sqrt of the width)
            "gemma": lambda: transformers.GemmaModel(_eager(attention=attention, config=transformers.GemmaConfig(
                **small, num_key_value_heads=2, head_dim=4, max_position_embeddings=16))),
            "opt": lambda: transformers.OPTModel(_eager(attention=attention, config=transformers.OPTConfig(
                hidden_size=WIDTH, ffn_dim=24, num_attention_heads=4, num_hidden_layers=2, vocab_size=11,
                max_position_embeddings=16, word_embed_proj_dim=WIDTH, dropout=0.0))),
            "distilbert": lambda: transformers.DistilBertModel(_eager(attention=attention, config=transformers.DistilBertConfig(
                dim=WIDTH, hidden_dim=24, n_heads=4, n_layers=2, vocab_size=11, max_position_embeddings=16, dropout=0.0,
                attention_dropout=0.0))),
        }
        return LastHidden({**configs, **more}[name]()), (torch.randint(0, 11, (2, T)),)


WHOLE = ["gpt2", "llama", "mistral", "bert"]
MORE = ["qwen2", "gpt-neox", "phi3", "gemma", "opt", "distilbert"]


@DTYPES
@pytest.mark.parametrize("name", WHOLE)
def test_whole_transformers_models_round_trip(name, dtype):
    """GPT2Model, LlamaModel, MistralModel, BertModel from token ids: the causal mask their forward
    builds from torch.arange is `causal(t, s)`, positions are rows of the position table, LLaMA's
    and Mistral's rotary cos and sin are `unsaved` buffers `~ rotary_cos`, `~ rotary_sin`, BERT's
    position and token-type ids rows of their tables; strict loading from the state dict alone."""
    module, inputs = _whole(name)
    text = round_trip(module, inputs, dtype)
    if name in ("gpt2", "llama", "mistral"):
        assert "causal(t, s)" in text
    if name in ("llama", "mistral"):
        assert "~ rotary_cos(base=10000) unsaved" in text and "~ rotary_sin(base=10000) unsaved" in text


@DTYPES
@pytest.mark.parametrize("name", MORE)
def test_more_whole_transformers_models_round_trip(name, dtype):
    """Models this file was not written against: Qwen2, GPT-NeoX (partial rotary), Phi-3 (an empty
    pass-through slice), Gemma (a 0-dim non-persistent buffer), OPT (learned positions with an
    offset), DistilBERT."""
    module, inputs = _whole(name)
    round_trip(module, inputs, dtype)


@DTYPES
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_whole_models_with_their_default_sdpa_attention_round_trip(name, dtype):
    """The default attention of transformers (SDPA): the causal mask folded, BERT's mask that keeps
    every key (True everywhere) no mask at all."""
    module, inputs = _whole(name, attention="sdpa")
    round_trip(module, inputs, dtype)


def test_whole_model_runs_another_batch():
    """The traced LLaMA takes any batch (axis 0 stays the implicit batch: the mask its forward
    expands over the batch is one causal(t, s)); its token count is the example's, which the
    slices of its rotary tables fix (docs/trace.md, "Other limits")."""
    module, inputs = _whole("llama")
    module.eval()
    text = penrose.trace(module, *inputs)
    assert "# Axis 0 of the inputs is their batch" in text
    twin = penrose.compile(text).eval()
    twin.load_state_dict(module.state_dict(), strict=True)
    ids = torch.randint(0, 11, (3, T))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids), module(ids), rtol=2e-5, atol=2e-5)


class LinearPatchEmbed(nn.Module):
    """timm's `embed_layer`: patches cut by a reshape and embedded by a linear layer (the
    convolution with stride = kernel that timm's PatchEmbed is, written as a matmul)."""

    def __init__(self, img_size=8, patch_size=4, in_chans=3, embed_dim=WIDTH, **kwargs):
        super().__init__()
        self.patch_size = patch_size
        self.grid_size = (img_size // patch_size,) * 2
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.dynamic_img_pad = False
        self.proj = nn.Linear(in_chans * patch_size * patch_size, embed_dim)

    def feat_ratio(self, as_scalar=True):
        return self.patch_size

    def forward(self, x):
        B, C, H, W = x.shape
        p = self.patch_size
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return self.proj(x.reshape(B, (H // p) * (W // p), C * p * p))


def _vit(embed_layer=LinearPatchEmbed):
    model = VisionTransformer(img_size=8, patch_size=4, embed_dim=WIDTH, depth=2, num_heads=4, num_classes=3,
                              embed_layer=embed_layer)
    return model, (torch.randn(2, 3, 8, 8),)


@DTYPES
def test_timm_vision_transformer_with_a_linear_patch_embed_round_trips(dtype):
    """The whole VisionTransformer (class token, position embedding, blocks, norm, head on the
    class token) with the patch embedding written as a linear layer."""
    module, inputs = _vit()
    text = round_trip(module, inputs, dtype)
    assert "repeat 2 as blocks" in text and "as head" in text


def test_timm_vision_transformer_patch_convolution_is_refused_at_its_line():
    module, inputs = _vit(timm.layers.PatchEmbed)
    with pytest.raises(penrose.PenroseError, match=r"patch_embed.py:\d+:\d+: error: torch.conv2d cannot be expressed in "
                                                  r"\.pen: a convolution") as err:
        penrose.trace(module.eval(), *inputs)
    assert "x = self.proj(x)" in str(err.value)


def test_bert_keeps_its_reserved_state_dict_names():
    module, inputs = _hf("bert-layer")
    text = penrose.trace(module, *inputs)
    assert "as `self`" in text and "as `output`" in text


def test_llama_legs_are_named_from_its_attributes():
    """num_attention_heads, num_key_value_heads, head_dim → h, g, d; the width one name, e."""
    module, inputs = _hf("llama-attention")
    text = penrose.trace(module, *inputs)
    assert "dim h = g * r" in text and "dim e = h * d" in text
    assert "input x[t, e]" in text


def test_readability_check_can_fail():
    assert call_depth("y = a(b(c(d(x))))") == 4 and call_depth("y = rearrange(x, 't (h d) -> t h d')") == 1
