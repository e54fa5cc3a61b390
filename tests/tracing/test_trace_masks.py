"""penrose.trace on Hugging Face models called the usual way, with a padding mask:
`model(input_ids, attention_mask=mask)`.

transformers' mask code (`masking_utils`) reads the padding mask as `mask[batch_idx, kv_idx]`,
each index a `torch.arange` broadcast along an axis of its own: the mask itself with size-1 axes
put in, no gather. It combines it with the causal mask by `&`, which is `where(causal(t, s),
where(attention_mask != 0, 1, 0), 0) != 0` in the diagram. The mask is an input of the diagram
(integer 0/1, bool or float 0/1), with the batch axis 0 of every input.
"""

from __future__ import annotations

import pytest
import torch
from test_trace_real import DTYPES, T, _whole, round_trip
from torch import nn

import penrose


class WithMask(nn.Module):
    """A Hugging Face model called with its padding mask, its last hidden state the output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _padded(kind=torch.long, batch=2, left=False):
    """Right padding by default: under a causal mask, left padding leaves the first queries no key
    at all, rows where the fused attention's gradients are torch's SDPA kernel's, not eager's
    (test_left_padding_round_trips_with_attention_unfused)."""
    mask = torch.ones(batch, T, dtype=kind)
    mask[0, -2:] = 0  # the first sequence padded by two tokens
    if batch > 2 or left:
        mask[-1, :1] = 0  # the last left-padded by one
    return mask


def _masked(name, attention="eager"):
    module, (ids,) = _whole(name, attention)
    return WithMask(module.model), ids


@DTYPES
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "mistral"])
def test_whole_models_called_with_an_attention_mask_round_trip(name, dtype):
    """GPT2Model, LlamaModel, BertModel, MistralModel given an integer 0/1 padding mask: values and
    gradients, float32 and float64, strict loading, readable; the mask is an input of the diagram."""
    module, ids = _masked(name)
    text = round_trip(module, [ids, _padded()], dtype)
    assert "input attention_mask[" in text and "attention_mask != 0" in text
    if name == "bert":  # regression: the tokens were `r`, the letter of the copies the mask's expand makes
        assert "input input_ids[t] : int" in text and "'s -> t s'" in text
    if name != "bert":  # the causal mask and the padding mask, one mask
        assert "causal(t, s)" in text and "where(attention_mask != 0, 1, 0)" in text


@DTYPES
@pytest.mark.parametrize("name", ["qwen2", "gpt-neox", "phi3", "gemma", "distilbert"])
def test_more_whole_models_called_with_an_attention_mask_round_trip(name, dtype):
    """Models this file was not written against, with their padding mask."""
    module, ids = _masked(name)
    text = round_trip(module, [ids, _padded()], dtype)
    assert "attention_mask != 0" in text


def test_opt_positions_counted_from_the_mask_round_trip_at_two_batches():
    """regression (issue 38): OPT numbers its positions by a running sum of the mask, so the mask's
    axis is the queries' (the positions) and, added to the scores, the keys': one leg cannot be
    both, and the trace refused it ("Tensor.add: its operands' axes cannot be named consistently").
    Now the mask is read on a leg of its own where it meets the other (a rename, as `apart` gives
    `pos[:, None] - pos[None, :]` two legs; the running sum of the integer mask is `mask * 1`, a float
    tensor, which the compiled code now casts as the checker says): values and gradients, strict
    loading, and a batch of 3 through the same diagram (the batch free; OPT's softmax computes in
    float32, so 1e-6)."""
    module, ids = _masked("opt")
    text = round_trip(module, [ids, _padded()], torch.float64)
    assert "input attention_mask[b, " in text and "Takes a batch" not in text, text
    # regression (issue 38): the tokens were `s` (the mask's keys are the tokens) and the attention's
    # queries `t`; now as the other models read: tokens `t`, keys `s`, the mask's queries `q`
    assert "input input_ids[b, t] : int" in text and "einsum('bthd,bshd->bhts'" in text, text
    assert "causal_mask = causal(q, t)" in text, text
    # regression (issue 38): the table with its padding row detached was `cat`, a name no source has
    assert "weight2 = concat([slice(weight, f, 0, u), weight2, " in text and "cat = " not in text, text
    twin = penrose.compile(text).double().eval()
    twin.load_state_dict(module.state_dict(), strict=True)
    ids3, mask3 = torch.randint(0, 11, (3, T), generator=torch.Generator().manual_seed(3)), torch.ones(3, T, dtype=torch.long)
    mask3[1, -3:] = 0  # the second of three padded by three tokens
    with torch.no_grad():
        torch.testing.assert_close(twin(ids3, mask3), module(ids3, mask3), rtol=1e-6, atol=1e-6)


def test_integer_arithmetic_compiles_to_the_float_tensor_the_checker_types():
    """regression (issue 38, OPT's positions): `mask * 1` on an int input is a float tensor to the
    checker (einsum takes it), but the compiled code computed int64 and F.linear refused the mix."""
    text = "dim b = 2, s = 3\ninput m[b, s] : int\nparam w[s]\ny = einsum('bs,s->b', m * 1, w)\noutput y\n"
    model = penrose.compile(text).double()
    with torch.no_grad():
        model.w.copy_(torch.tensor([1.0, 2.0, 3.0]))
        got = model(torch.tensor([[1, 0, 2], [0, 1, 1]]))
    assert got.dtype == torch.float64 and got.tolist() == [7.0, 5.0]


@DTYPES
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_whole_models_with_sdpa_attention_and_an_attention_mask_round_trip(name, dtype):
    """Their default attention (F.scaled_dot_product_attention), given the mask as bool."""
    module, ids = _masked(name, "sdpa")
    round_trip(module, [ids, _padded(torch.bool)], dtype)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_a_float_attention_mask_round_trips(name):
    module, ids = _masked(name)
    round_trip(module, [ids, _padded(torch.float32)], torch.float32)


def test_the_padding_mask_changes_the_traced_models_output():
    """The mask is read, not folded into the example's values: another mask, another output, as
    the original's; and the traced LLaMA takes another batch (axis 0 stays the implicit batch)."""
    module, ids = _masked("llama")
    module.eval()
    text = penrose.trace(module, ids, _padded())
    assert "# Axis 0 of the inputs is their batch" in text
    twin = penrose.compile(text).eval()
    twin.load_state_dict(module.state_dict(), strict=True)
    ids3, mask3 = torch.randint(0, 11, (3, T)), _padded(batch=3, left=True)
    with torch.no_grad():
        got, want = twin(ids3, mask3), module(ids3, mask3)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        assert not torch.allclose(got, twin(ids3, torch.ones_like(mask3)), atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gpt2", "opt"])
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_left_padding_round_trips(name, fuse):
    """Left padding: queries that see no key (every score the mask's minimum) attend to all keys
    evenly, in values and gradients, with attention fused (the default) or written out; every
    position compared (in float32 the minimum is finite, and each model defines every value).
    Regression: fused, the gradients were off by up to ~97 (scaled_dot_product_attention's
    backward on a row the mask hides entirely; tests/compiler/test_fuse_attention.py)."""
    module, ids = _masked(name)
    module.eval()
    mask = _padded(left=True)
    twin = penrose.compile(penrose.trace(module, ids, mask), fuse_attention=fuse).eval()
    twin.load_state_dict(module.state_dict(), strict=True)
    want, got = module(ids, mask), twin(ids, mask)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    cot = torch.randn_like(want)
    want.backward(cot)
    got.backward(cot)
    theirs = dict(twin.named_parameters())
    for name, p in module.named_parameters():
        torch.testing.assert_close(theirs[name].grad, p.grad, rtol=2e-4, atol=2e-4, msg=name)


def test_opt_left_padding_in_float64_round_trips_where_the_module_has_values():
    """regression (issue 38): a float64 OPT traced with a left-padded row was refused ("internal:
    output 1 of the traced diagram differs from the module's (max error nan)"). The NaN is the
    module's: its mask fills with float64's minimum and its softmax casts to float32, where that
    fill is -inf, so the padded first query (no key) is 0/0, and the second layer's attention spreads
    it to every token of that row (0 * NaN). The diagram computes in float64 with a finite fill, and
    the trace now says how many values the module lacks and verifies the rest.
    Compared, at batch 2 and 3 (left padding in the last row, right padding in the first): in the
    rows without left padding every position against the float64 module (the only values it
    defines); every position of every row, and the gradients, against the same module in float32,
    where the fill is finite and the values are defined, at float32's tolerance."""
    import copy

    module32, ids = _masked("opt")
    torch.manual_seed(0)
    with torch.no_grad():  # away from the initialisation, as round_trip does
        for p in module32.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    module32.eval()
    module64 = copy.deepcopy(module32).double()
    with pytest.warns(penrose.PenroseWarning, match=r"output 1 of the module is NaN at 80 of its 160 values") as record:
        text = penrose.trace(module64, ids, _padded(left=True))
    assert [w.filename for w in record if "is NaN at" in str(w.message)] == [__file__]  # at the line that called trace
    twin = penrose.compile(text).double().eval()
    twin.load_state_dict(module64.state_dict(), strict=True)
    for batch in (2, 3):
        ids_b = torch.randint(0, 11, (batch, T), generator=torch.Generator().manual_seed(batch))
        mask = _padded(batch=batch, left=True)
        got = twin(ids_b, mask)
        with torch.no_grad():
            want64 = module64(ids_b, mask)
        defined = (mask[:, 0] == 1).tolist()  # rows whose first token is not padding
        assert want64.isnan().all(-1).all(-1).tolist() == [not d for d in defined]
        torch.testing.assert_close(got[defined], want64[defined], rtol=1e-6, atol=1e-6)
        want = module32(ids_b, mask)
        torch.testing.assert_close(got, want.double(), rtol=2e-5, atol=2e-5)
        cot = torch.randn_like(got)
        got.backward(cot)
        want.backward(cot.float())
        theirs = dict(twin.named_parameters())
        for name, p in module32.named_parameters():
            torch.testing.assert_close(theirs[name].grad, p.grad.double(), rtol=2e-4, atol=2e-4, msg=name)
            theirs[name].grad, p.grad = None, None
    both = torch.ones(2, T, dtype=torch.long)
    both[:, :1] = 0  # both rows left-padded: the module has no value to verify the diagram against
    with pytest.raises(penrose.PenroseError, match="output 1 of the module is NaN at every value"):
        penrose.trace(module64, ids, both)

def test_rotary_tuple_argument_is_not_named_by_position():
    """Regression: LlamaAttention.forward(hidden_states, position_embeddings, attention_mask, ...)
    takes cos and sin as one tuple: its four formals (x, cos, sin, mask) were named by position,
    sin becoming `attention_mask`. A signature with a tuple argument names no formals."""
    module, ids = _masked("llama")
    text = penrose.trace(module.eval(), ids, _padded())
    assert "* attention_mask" not in text and "* position_embeddings" not in text


def test_gpt2_heads_are_h_though_its_blocks_are_named_h():
    """Regression: GPT-2's heads (n_head) were `g`, as its ModuleList `h` took the letter; an
    instance name and a dim may share a name."""
    module, ids = _masked("gpt2")
    text = penrose.trace(module.eval(), ids, _padded())
    assert "heads (n_head = 4)" in text and "'b t (h d) -> b t h d'" in text and "repeat 2 as h\n" in text


class Shuffled(nn.Module):
    def forward(self, x):
        order = torch.tensor([2, 0, 1, 4, 3])
        return x[:, order] * 2


class Arange(nn.Module):
    def forward(self, x):
        rows = torch.arange(x.shape[0])[:, None]
        cols = torch.arange(x.shape[1])[None, :]
        return x[rows, cols] * 2


def test_indexing_by_constant_positions_in_order_is_the_tensor_itself():
    x = torch.randn(3, 5)
    text = penrose.trace(Arange(), x)
    twin = penrose.compile(text)
    torch.testing.assert_close(twin(x), Arange()(x))


def test_indexing_by_other_indices_is_refused_with_cause_and_line():
    """A shuffle is a constant whose values no operation of the language makes: refused at its line."""
    with pytest.raises(penrose.PenroseError, match=r"test_trace_masks.py:\d+:\d+: error: torch.tensor cannot be expressed "
                                                  r"in \.pen: a tensor forward makes from constants") as err:
        penrose.trace(Shuffled(), torch.randn(2, 5))
    assert "order = torch.tensor([2, 0, 1, 4, 3])" in str(err.value)


class Heads(nn.Module):
    """A model with its task head, called as people call it: ids, mask (and token types), `.logits`."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, *token_type_ids):
        extra = {"token_type_ids": token_type_ids[0]} if token_type_ids else {}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


@DTYPES
@pytest.mark.parametrize("name", ["llama-causal-lm", "bert-sequence-classification"])
def test_models_with_their_heads_called_with_a_mask_round_trip(name, dtype):
    """LlamaForCausalLM (logits over the vocabulary) and BertForSequenceClassification (pooler on
    the first token, then the classifier), BERT's token types an input too."""
    import warnings

    import transformers

    small = {"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 11}
    ids = torch.randint(0, 11, (2, T))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "llama-causal-lm":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=16))
            inputs = [ids, _padded()]
        else:
            model = transformers.BertForSequenceClassification(transformers.BertConfig(
                **small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))
            inputs = [ids, _padded(), torch.randint(0, 2, (2, T))]
    round_trip(Heads(model), inputs, dtype)
