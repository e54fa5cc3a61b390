"""penrose.trace on sparse mixtures of experts (issue 38): traced in their dense form, every expert
computed for every token and the gates of the experts a token is not routed to zero
(penrose/tracing/moe.py), the header saying what that costs; a routing the dense form does not give
is refused at its `topk` line, with nothing on stderr.

From transformers' own sparse blocks (Mixtral's, under its eager loop and its batched kernel;
Qwen2-MoE's with its shared expert, renormalised or not; a whole `MixtralModel`) and from modules
written as repositories write them (a nanoGPT-style loop over a `ModuleList` of experts, routed by
softmax then top-k, or top-k of the logits then softmax). Each round-trips as
tests/tracing/test_trace.py's `round_trip` does (values and gradients in float64, strict loading
from `module.state_dict()`, readable), then at a second batch size.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_trace_idioms import at_two_batches
from torch import nn
from trace_readability import header

import penrose

import transformers  # noqa: E402, I001
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402


def _x(batch):
    return (torch.randn(batch, 5, 8, generator=torch.Generator().manual_seed(batch)),)


def _init(module):
    """Values in every parameter (transformers' blocks, built alone, leave theirs torch.empty)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def _mixtral(implementation="eager"):
    config = transformers.MixtralConfig(hidden_size=8, intermediate_size=12, num_attention_heads=2, num_key_value_heads=1,
                                        num_hidden_layers=1, vocab_size=11, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = implementation
    return _init(modeling_mixtral.MixtralSparseMoeBlock(config))


def _qwen2_moe(norm_topk_prob):
    config = transformers.Qwen2MoeConfig(hidden_size=8, moe_intermediate_size=6, shared_expert_intermediate_size=10,
                                         num_experts=4, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
                                         num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1, vocab_size=11)
    config._experts_implementation = "eager"
    return _init(modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config))


class LoopedExperts(nn.Module):
    """A mixture of experts looping over its experts, each taking the tokens routed to it (softmax,
    then the top k, not renormalised)."""

    def __init__(self, d=8, n_experts=4, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(n_experts)])

    def forward(self, x):
        B, T, C = x.shape
        x = x.view(-1, C)
        weights, selected = torch.topk(self.gate(x).softmax(-1), self.top_k, dim=-1)
        mask = F.one_hot(selected, num_classes=len(self.experts)).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx, top_x = torch.where(mask[i])
            out.index_add_(0, top_x, expert(x[top_x]) * weights[top_x, idx, None])
        return out.view(B, T, C)


class ExpertMLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.c_fc = nn.Linear(d, hidden)
        self.c_proj = nn.Linear(hidden, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class NanoMoE(nn.Module):
    """nanoGPT-style: the top k of the router's logits, a softmax over those, each expert an MLP
    taking its tokens by a boolean mask."""

    def __init__(self, d=8, n_exp=4, k=2):
        super().__init__()
        self.num_experts_per_tok = k
        self.router = nn.Linear(d, n_exp)
        self.experts = nn.ModuleList([ExpertMLP(d, 2 * d) for _ in range(n_exp)])

    def forward(self, x):
        logits = self.router(x)
        top, idx = logits.topk(self.num_experts_per_tok, dim=-1)
        probs = top.softmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            hit = idx == i
            rows = hit.any(-1)
            if rows.any():
                w = (probs * hit).sum(-1, keepdim=True)
                out[rows] += (w * expert(x))[rows]
        return out


@pytest.mark.parametrize("make, experts, k", [
    (lambda: _mixtral("eager"), 4, 2),
    (lambda: _mixtral("batched_mm"), 4, 2),
    (lambda: _qwen2_moe(False), 4, 2),
    (lambda: _qwen2_moe(True), 4, 2),
    (LoopedExperts, 4, 2),
    (NanoMoE, 4, 2),
], ids=["mixtral-eager", "mixtral-batched", "qwen2-moe", "qwen2-moe-renormalised", "looped-experts", "nano-moe"])
def test_sparse_mixtures_of_experts_round_trip_in_their_dense_form(make, experts, k):
    text = at_two_batches(make(), _x)
    assert ", k=2)" in text and "topk(" in text
    assert f"every token goes through all {experts} experts" in " ".join(header(text).split())
    assert f"{experts / k:g}x the FLOPs" in " ".join(header(text).split())


def test_the_dense_form_keeps_the_routing_the_module_has():
    """Renormalised where the module renormalises (Mixtral, Qwen2-MoE with norm_topk_prob, top k of
    the logits then softmax), not where it does not: the variant is read off the module's outputs."""
    renorm = {name: "/ sum(gates, " in penrose.trace(make().eval(), *_x(2))
              for name, make in (("mixtral", _mixtral), ("qwen2", lambda: _qwen2_moe(False)),
                                 ("qwen2-norm", lambda: _qwen2_moe(True)), ("looped", LoopedExperts), ("nano", NanoMoE))}
    assert renorm == {"mixtral": True, "qwen2": False, "qwen2-norm": True, "looped": False, "nano": True}


@pytest.mark.parametrize("make, router, weights", [
    (_mixtral, "mixtral_top_k_router", "top_k_weights"),
    (lambda: _qwen2_moe(True), "qwen2_moe_top_k_router", "routing_weights"),
], ids=["mixtral", "qwen2-moe"])
def test_the_routers_result_is_named_as_the_source_names_it(make, router, weights):
    """regression (issue 38): the router's call, unpacked by the block as `_, top_k_weights, top_k_index =
    self.gate(x)` (Qwen2-MoE: `_, routing_weights, selected_experts`), was named `gate_out`, after the
    instance: its one tensor is the target at the place the call fills with it (the index is None in
    the dense form). The experts' formal is named as their forward names it (`top_k_weights`)."""
    text = penrose.trace(make().eval(), *_x(2))
    assert f"{weights} = {router}(hidden_states) as gate\n" in text, text
    assert f"(hidden_states, {weights}) as experts\n" in text and "top_k_weights[b, t, x]" in text, text
    assert not re.search(r"\bgate_out\b", text), text


class _AttentionWithWeights(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, x):
        context, _ = self.attn(x, x, x, need_weights=False)
        return context


def test_a_tuple_with_a_discarded_place_names_the_kept_one():
    """`context, _ = self.attn(x, x, x)`: the call's one tensor is `context` (not `attn_out`)."""
    text = at_two_batches(_AttentionWithWeights(), _x)
    assert re.search(r"^context = \w+\(x\) as attn$", text, re.MULTILINE) and "attn_out" not in text, text


def test_result_places_is_declared_on_the_lowerer():
    """regression: `result_places` was an attribute run.py set on the Lowerer from outside and the
    writer read with getattr(..., {}): the Lowerer declares it, empty until trace fills it while
    torch.export runs forward; the writer of a Lowerer with none names the call after its instance."""
    from penrose.tracing.run import _export, _lower, _result_places
    from penrose.tracing.write import Writer

    module, inputs = _AttentionWithWeights().eval(), _x(2)
    with _result_places(module) as places:
        ep = _export(module, inputs)
    assert places == {"attn": (True, False)}  # need_weights=False: the weights' place holds None
    low = _lower(ep, module, inputs, False, {})
    assert low.result_places == {}
    assert re.search(r"^attn_out = \w+\(x\) as attn$", Writer(low, "bare").write([]), re.MULTILINE)
    low.result_places = places
    assert re.search(r"^context = \w+\(x\) as attn$", Writer(low, "filled").write([]), re.MULTILINE)


def test_the_module_is_left_as_it_was():
    """The dense forwards are the trace's only: the module computes sparsely again after it."""
    block = _mixtral().eval()
    (x,) = _x(2)
    with torch.no_grad():
        before = block(x)
    penrose.trace(block, x)
    assert "forward" not in block.gate.__dict__ and "forward" not in block.experts.__dict__
    with torch.no_grad():
        torch.testing.assert_close(block(x), before)


def test_a_whole_mixtral_model_round_trips():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.MixtralConfig(hidden_size=16, intermediate_size=12, num_attention_heads=4, num_key_value_heads=2,
                                            num_hidden_layers=2, vocab_size=11, num_local_experts=4, num_experts_per_tok=2,
                                            max_position_embeddings=16, attn_implementation="eager")
        config._experts_implementation = "eager"  # its default, torch._grouped_mm, refuses float64
        model = transformers.MixtralModel(config)
    ids = lambda b: (torch.randint(0, 11, (b, 5), generator=torch.Generator().manual_seed(b)),)  # noqa: E731
    with pytest.warns(penrose.PenroseWarning, match="casts to float32"):  # its norms and softmax, as the header says
        text = at_two_batches(model, ids, tol=1e-5)
    assert "Dense mixtures of experts (layers.0.mlp, layers.1.mlp)" in " ".join(header(text).split())


class TemperedRouter(nn.Module):
    """A router with a learned temperature, the chosen experts' outputs picked by `gather`: no dense
    form here gives it (the gates are not the gate's own scores), so its indices stay indices."""

    def __init__(self, d=8, n_experts=4, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.temperature = nn.Parameter(torch.tensor(2.0))
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(n_experts)])

    def forward(self, x):
        probs = (self.gate(x) / self.temperature).softmax(-1)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)
        outs = torch.stack([expert(x) for expert in self.experts], dim=-2)
        picked = outs.gather(-2, selected[..., None].expand(*selected.shape, outs.shape[-1]))
        return (picked * weights[..., None]).sum(-2)


def test_a_routing_the_dense_form_does_not_give_is_refused_at_its_topk_and_stderr_stays_clean(capfd):
    capfd.readouterr()
    with pytest.raises(penrose.PenroseError) as err:
        penrose.trace(TemperedRouter().eval(), torch.randn(2, 5, 8))
    lines = str(err.value).split("\n")
    assert "topk" in err.value.message, str(err.value)
    code, caret = lines[1], lines[2]
    assert code[caret.index("^"):].startswith("weights, selected = torch.topk(probs"), str(err.value)  # on the topk line
    assert capfd.readouterr().err.count("\n") <= 1  # at most transformers' own one-line note, not export's graph


class LooksLikeAMixture(nn.Module):
    """A `ModuleList`, a linear layer with as many outputs and a `k`, of other uses: not a mixture."""

    def __init__(self, d=8):
        super().__init__()
        self.k = 2
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(3)])
        self.head = nn.Linear(2 * d, 3)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(torch.cat([x, x], -1)).softmax(-1) * self.k


def test_a_module_that_only_looks_like_a_mixture_is_traced_as_it_is():
    """regression: its dense form (the head as a router over the layers as experts) was run on its
    calls, and its failure was the trace's; now tried, found not to give its outputs, and left."""
    text = at_two_batches(LooksLikeAMixture(), _x)
    assert "Dense mixture" not in text and "topk(" not in text
