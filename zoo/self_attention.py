"""Multi-head self-attention: `zoo/self_attention.pen` (bidirectional) and
`zoo/causal_self_attention.pen` (causal), one wrapper class each.

Training data on real digits (`digit_rows`): each 8×8 image is a sequence of 8 row tokens, a
token being its 8 pixels followed by a one-hot of its row (e = 16). The causal model predicts
each next row; the bidirectional model reconstructs one row whose pixels were blanked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from penrose_zoo.core import Explanation, ZooModel


class SelfAttentionOutputs(NamedTuple):
    """What `SelfAttention` and `CausalSelfAttention` return: the diagram's outputs, by name."""

    y: torch.Tensor  # [..., t, e]
    probs: torch.Tensor  # [..., h, t, p]
    o: torch.Tensor  # [..., t, h, d]


class SelfAttention(ZooModel):
    """Bidirectional multi-head self-attention; heads are the leg h of every weight.

    Index legend: t query token, p key token, e embedding, h head, d head dim.
    Sizes: e = 32, h = 4, d = 8 (defaults); the token count t comes from the input.
    Input Z[..., t, e]; outputs (y[..., t, e], probs[..., h, t, p], o[..., t, h, d]).
    Task: 'regression' on token targets — a batch is (Z, target[..., t, e], weight[..., t, e]),
    the loss the weighted mean squared error.
    Explanation: per-head contributions o_th W_o,h (parts[..., h, t, e]) sum to y; the attention
    probabilities are in `details['probs']`.

    >>> model = SelfAttention(e=8, h=2, d=4)
    >>> model(torch.randn(3, 5, 8)).probs.shape
    torch.Size([3, 2, 5, 5])
    """

    diagram_file = "self_attention.pen"
    defaults = {"e": 32, "h": 4, "d": 8}
    example_sizes = {"t": 8}
    tasks = ("regression",)
    batch_form = ("Z", "target", "weight")
    default_task = "regression"

    def forward(self, Z: torch.Tensor) -> SelfAttentionOutputs:
        """Outputs (y[..., t, e], probs[..., h, t, p], o[..., t, h, d])."""
        return SelfAttentionOutputs(*self.diagram(Z=Z))

    if TYPE_CHECKING:  # `model(Z)` is forward's type (nn.Module.__call__ is typed Any)
        __call__ = forward

    def explain(self, Z: torch.Tensor) -> Explanation:
        """Per-head contributions parts[..., h, t, e]; Σ_h parts = y."""
        out = self(Z)
        W_o = self.diagram.W_o
        parts = torch.einsum("...thd,hde->...hte", out.o, W_o)
        return Explanation(out.y, parts, torch.zeros((), dtype=out.y.dtype, device=out.y.device), ("h",),
                           {"probs": out.probs, "head_outputs": out.o}, out_legs=2)

    def loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        Z, target, weight = batch
        err = (self(Z).y - target) ** 2
        return (err * weight).sum() / weight.sum().clamp_min(1)

    @classmethod
    def make_inputs(cls, sizes: dict[str, int], batch: int,
                    generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        return {"Z": torch.randn(batch, sizes["t"], sizes["e"], generator=generator)}


class CausalSelfAttention(SelfAttention):
    """Causal multi-head self-attention: token t attends to tokens p ≤ t only.

    Same legend, sizes, inputs, outputs, loss and explanation as `SelfAttention`; the diagram
    `zoo/causal_self_attention.pen` adds the mask (a separate diagram, not a flag).

    >>> model = CausalSelfAttention(e=8, h=2, d=4)
    >>> model(torch.randn(1, 3, 8)).probs[0, 0, 0].tolist()
    [1.0, 0.0, 0.0]
    """

    diagram_file = "causal_self_attention.pen"


def digit_rows(x: torch.Tensor, task: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Z, target, weight) sequences from standardised 8×8 digits x[n, 64].

    Z[n, 8, 16]: row pixels and a one-hot row position. task 'next': the target of token t is
    row t + 1 (weight 1 on its 8 pixels for t < 7). task 'masked': one random row per image has
    its pixels zeroed in Z; the target is that row (weight 1 on its pixels only).
    """
    n = x.shape[0]
    rows = x.reshape(n, 8, 8)
    pos = torch.eye(8, dtype=x.dtype).expand(n, 8, 8)
    Z = torch.cat([rows, pos], dim=-1)
    target = torch.zeros_like(Z)
    weight = torch.zeros_like(Z)
    if task == "next":
        target[:, :-1, :8] = rows[:, 1:]
        weight[:, :-1, :8] = 1.0
    elif task == "masked":
        g = torch.Generator().manual_seed(seed)
        which = torch.randint(0, 8, (n,), generator=g)
        idx = torch.arange(n)
        target[idx, which, :8] = rows[idx, which]
        weight[idx, which, :8] = 1.0
        Z = Z.clone()
        Z[idx, which, :8] = 0.0
    else:
        raise ValueError(f"task must be 'next' or 'masked', got {task!r}")
    return Z, target, weight
