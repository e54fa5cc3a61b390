"""One module applied N times in a row traced as `repeat N shared` (issue 38): a universal
transformer's loop `for _ in range(n): x = self.block(x)` and ALBERT's shared layers
(transformers' AlbertModel, tiny random configurations, no downloads). The state dict holds one copy
of the block's parameters (under the module's own name, no `.0 .1 …` per application), every
application reads it and the gradients add up: each round-trips in values, gradients and strict
loading (tests/tracing/test_trace_idioms.py's `at_two_batches`, batches 2 and 3). Numbered layers
that are separate modules of one class stay `repeat N as layers` (test_trace.py)."""

from __future__ import annotations

import re
import warnings

import torch
from test_trace_idioms import _x, at_two_batches
from torch import nn
from trace_readability import measures

import penrose


class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x)).relu()


class UniversalLoop(nn.Module):
    """A universal transformer's recurrence: one block, its weights tied across the steps."""

    def __init__(self, steps=4, d=8):
        super().__init__()
        self.steps = steps
        self.block = Block(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        for _ in range(self.steps):
            x = self.block(x)
        return self.head(x)


class TwiceApart(nn.Module):
    """One block called twice, the first result read again: two calls of one instance, not a repeat."""

    def __init__(self, d=8):
        super().__init__()
        self.block = Block(d)

    def forward(self, x):
        y = self.block(x)
        return self.block(y) + y


def _calls(text, block):
    return re.findall(rf"^\s*\w+ = {block}\(.*$", text, re.MULTILINE)


def test_a_loop_over_one_block_is_repeat_shared():
    """regression (issue 38): the loop was written as four calls `block_out = block_module(block_out) as
    `block`` (unrolled, made-up names); now one statement, one copy of the weights in the state dict."""
    module = UniversalLoop()
    text = at_two_batches(module, _x(8))
    assert _calls(text, "block_module") == ["x = block_module(x) repeat 4 shared as `block`"], text
    assert sorted(penrose.compile(text).state_dict()) == sorted(module.state_dict())  # block.fc.weight, once
    assert measures(text)["unrolled layers"] == 0 and measures(text)["made-up names"] == 0


def test_one_block_called_twice_with_its_result_read_again_is_two_calls():
    text = at_two_batches(TwiceApart(), _x(8))
    assert "repeat" not in text and len(_calls(text, "block_module")) == 2, text


def _albert(layers, groups):
    from transformers import AlbertConfig, AlbertModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AlbertConfig(vocab_size=11, embedding_size=8, hidden_size=16, num_hidden_layers=layers, num_hidden_groups=groups,
                              num_attention_heads=4, intermediate_size=24, max_position_embeddings=16,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        config._attn_implementation = "eager"
        return AlbertModel(config, add_pooling_layer=False)


def _ids(batch):
    return (torch.randint(0, 11, (batch, 5), generator=torch.Generator().manual_seed(batch)),)


def test_albert_shared_layers_are_repeat_shared():
    """transformers' AlbertModel applies `albert_layer_groups.0` num_hidden_layers times: written
    `repeat 3 shared as albert_layer_groups.0`, its keys `albert_layer_groups.0.albert_layers.0.…` as
    AlbertModel's own (strict loading), one copy."""
    module = _albert(3, 1)
    text = at_two_batches(module, _ids)
    calls = _calls(text, "albert_layer_group")
    assert calls == ["  hidden_states = albert_layer_group(hidden_states) repeat 3 shared as albert_layer_groups.0"], text
    keys = sorted(penrose.compile(text).state_dict())
    assert keys == sorted(module.state_dict()) and not any(".1." in k for k in keys)
    # regression (issue 38): the shared layer's attention was `probs`, `y` (a helper's line named only
    # the last of the calls of one module), and the padding-detached table `cat`: names from the source
    assert "attn_weights = softmax(" in text and "attn_output = einsum(" in text, text
    assert measures(text)["made-up names"] == 0, text


def test_albert_two_groups_are_two_shared_repeats():
    """num_hidden_groups=2 over 4 layers applies group 0 twice, then group 1 twice: two shared
    repeats of one block (the groups compute alike), each with its own weights."""
    text = at_two_batches(_albert(4, 2), _ids)
    calls = _calls(text, "albert_layer_group")
    assert [c.split(" repeat ")[1] for c in calls] == ["2 shared as albert_layer_groups.0", "2 shared as albert_layer_groups.1"], text
